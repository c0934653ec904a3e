#!/usr/bin/env bash
# x2_session.sh: one call on a two-GPU H200 host (nvidia-h200-x2), everything the session still had to run.
#
#   source .gpu/env.sh && scripts/x2_session.sh          (from the repository root; writes under $OUT)
#
# GPU 0: every `gpu and not slow` test, then the FP8 dump (kernel outputs + inputs, for the CPU), then the
#        fp16 rows of the benchmark (head_dim 64/128/256, N 512..16k, causal and not).
# GPU 1 (at the same time): compute-sanitizer memcheck/racecheck/synccheck over every kernel backend, then the
#        peak-memory table (fp16, head_dim 128, N 1k..128k).
# Both GPUs, after: the two-GPU edge case (EC-18a) and the context-parallel benchmark (scripts/cp_bench.py).
# Each step has its own time limit; logs are packed into one tar file (the host returns at most 8 files).
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
out="${OUT:-results/x2-session}"; session_setup "$out/logs"
peers=sdpa-flash,sdpa-cudnn,flash-attn-4
(
  export CUDA_VISIBLE_DEVICES=1
  step sanitize 170 python3 scripts/sanitize.py --timeout 150 --out "$out/logs/sanitize"
  step memory 110 python3 -m fa_variants.cli bench --memory-only --dtypes fp16 --head-dims 128 --backends fa2,fa3 \
    --peers "sdpa-math,$peers" --no-progress --no-charts \
    --memory-seqlens 1024,2048,4096,8192,16384,32768,65536,131072 --out "$out/logs/memory"
) > "$out/logs/gpu1.txt" 2>&1 &
gpu1=$!
(
  export CUDA_VISIBLE_DEVICES=0
  step pytest 230 python3 -m pytest -q -n 8 -m "gpu and not slow" -p no:cacheprovider --tb=line -rf tests
  step fp8_dump 40 python3 scripts/fp8_dump.py --out "$out/fp8_dump.pt"
  step fp16 130 python3 -m fa_variants.cli bench --dtypes fp16 --backends fa2,fa3 --peers "$peers" --no-memory \
    --no-progress --no-charts --rep 40 --warmup 10 --out "$out/logs/fp16"
) > "$out/logs/gpu0.txt" 2>&1
wait $gpu1
cat "$out/logs/gpu0.txt" "$out/logs/gpu1.txt"
step ec18a 60 python3 -m pytest -q -p no:cacheprovider -rs tests/test_edge_cases.py -k ec18a
echo "== ec18a"; tail -n 3 "$out/logs/ec18a.log"
step cp_bench 130 python3 -m torch.distributed.run --standalone --nproc_per_node 2 scripts/cp_bench.py --rounds 5 --reps 8 --out "$out/logs/cp"
pack_logs "$out/logs.tgz"
echo "== pytest"; tail -n 30 "$out/logs/pytest.log"
echo "== sanitize"; tail -n 25 "$out/logs/sanitize.log"
echo "== fp8_dump"; tail -n 8 "$out/logs/fp8_dump.log"
echo "== memory"; grep -A 14 -i "memory" "$out/logs/memory/bench.md" 2>/dev/null | head -20
echo "== cp_bench"; tail -n 25 "$out/logs/cp_bench.log"
