#!/usr/bin/env bash
# host13_gpu.sh: issue 13, host time per decode call, on one H200: the touched GPU tests, then the host timing. ~3 min.
#
#   source .gpu/env.sh; scripts/host13_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 1. pytest -n 8: tests/test_fa2_split_gpu.py (fa2 split-KV vs float64; its partials now from common.workspace, the
#    per-stream scratch fa3 uses: graph replay between eager calls, two streams at once, fa2/fa3 alternating on one
#    stream), tests/test_decode_gpu.py (attention() without return_lse on fa3 and fa2, its LSE in the stream's scratch:
#    queued calls, CUDA-graph replay between eager calls, two streams; split decode graph replay; either merge) and
#    tests/test_decode_fused_gpu.py (fused merge: graph replay, two streams; its partials through the same piece).
# 2. scripts/api_overhead.py --device cuda --backend fa3,fa2 --phases --rounds 9 (default path: fa3 two kernels, fa2
#    split + packed), B1 Nq1 Nk4k 32:8 D128 bf16, twice, with the parent commit's package between the two runs
#    (git archive c386621 into $out/before; skipped where git cannot) for a same-machine before / after.
# Pass: (1) 0 failed / 0 errors. (2) the SUMMARY of both "after" runs: fa3 and fa2 host (enqueue) <= 25 us/call
# (27.4 and 33.0 us on 2026-12-01); "before" for reference only.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/host13}"; gpu_session "$out/logs" "$@"
NPROC=$(xdist_flag 8)
before="$out/before"
rm -rf "$before"; mkdir -p "$before"
git archive c386621 fa_variants scripts 2>/dev/null | tar -x -C "$before" 2>/dev/null || rm -rf "$before"
# the overhead runs' kernels (fa3 split + merge, fa2 split, both packages) compiled into the disk cache while pytest runs
WARM='import torch, fa_variants
q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
for b in ("fa3", "fa2"): fa_variants.attention(q, k, k, causal=True, backend=b)
torch.cuda.synchronize(); print("warm", fa_variants.__file__)'
python3 -c "$WARM" > "$LOGS/warm_after.log" 2>&1 & warm_after=$!
if [[ -d "$before/fa_variants" ]]; then
  (cd "$before" && PYTHONPATH="$PWD:${PYTHONPATH:-}" python3 -c "$WARM") > "$LOGS/warm_before.log" 2>&1 & warm_before=$!
fi
step pytest_host13 170 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX \
  tests/test_fa2_split_gpu.py \
  tests/test_decode_gpu.py::test_decode_without_lse_through_the_public_api \
  tests/test_decode_gpu.py::test_cuda_graph_replay_of_a_split_decode_step \
  tests/test_decode_gpu.py::test_split_decode_with_either_merge \
  tests/test_decode_gpu.py::test_auto_splits_decode_through_the_public_api \
  tests/test_decode_fused_gpu.py::test_cuda_graph_replay tests/test_decode_fused_gpu.py::test_two_streams_at_once
wait $warm_after ${warm_before:-} 2>/dev/null
OVERHEAD=(--device cuda --backend fa3,fa2 --phases --rounds 9)
step overhead_after 45 python3 scripts/api_overhead.py "${OVERHEAD[@]}"
if [[ -d "$before/fa_variants" ]]; then
  step overhead_before 45 env PYTHONPATH="$before:${PYTHONPATH:-}" python3 "$before/scripts/api_overhead.py" "${OVERHEAD[@]}"
else
  echo "== overhead_before: skipped (no git archive of c386621 here)"
fi
step overhead_after2 40 python3 scripts/api_overhead.py "${OVERHEAD[@]}"
echo "== warm"; tail -n 2 "$LOGS"/warm_*.log
echo "== pytest_host13"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest_host13.log" | tail -n 15
for run in overhead_before overhead_after overhead_after2; do
  [[ -f "$out/logs/$run.log" ]] || continue
  echo "== $run"; grep -E "host \(enqueue\)|^  (key|plan lookup|alloc|launch)|^    [a-z]|^gpu|SUMMARY|Error" "$out/logs/$run.log"
done
steps_exit
