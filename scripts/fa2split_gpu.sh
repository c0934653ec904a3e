#!/usr/bin/env bash
# fa2split_gpu.sh: fa2 split-KV (issue 13, sm80 path) on one H200: its GPU tests, then decode timing. ~3-4 min.
#
#   source .gpu/env.sh; scripts/fa2split_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 1. tests/test_fa2_split_gpu.py (-n 8): split counts 1..N+3 (empty and fully masked splits) at odd lengths
#    (1, 3, 113, 1023, 4224; Nq 1, 3, 4, 113), causal bottom-right, GQA, head dims 64/96/128/256, bf16 and fp16,
#    `auto`'s count, attention(num_splits=), packed GQA at Nq 1 (32:8, 64:8, MQA, MHA; split and not), seqlens_k
#    with lengths 0 and 1, CUDA-graph replay, batch invariance at a fixed count, vs float64 (output and LSE); and
#    tests/test_fa2_gpu.py (fa2 now splits small grids by itself).
# 2. scripts/fa2split_bench.py: fa2 decode B 1/8/64 x Nq 1/4/16 x Nk 1k/4k/32k, GQA 32:8, D128, bf16, causal:
#    split (auto) vs nosplit vs SDPA, and at Nq 1 split+packed GQA; GPU us per call, CUDA graphs, 3 rotated rounds.
# Pass: (1) 0 failed / 0 errors. (2) no BAD/ERR cell; the summary gives split/sdpa, nosplit/split and pack/sdpa
# per shape and their geomeans (nosplit/split > 1 where split-KV helps: B1 decode was 120 us at Nk 4k unsplit).
# If (1) fails in the split kernel: fa2.SPLIT_KV_ENABLED's default to "0" turns fa2's split off (one line).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/fa2split}"; gpu_session "$out/logs" "$@"
step pytest_fa2split 140 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider --tb=short -rfEX \
  tests/test_fa2_split_gpu.py tests/test_fa2_gpu.py
step bench 100 python3 scripts/fa2split_bench.py --out "$out/bench"
echo "== pytest_fa2split"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest_fa2split.log" | tail -n 15
echo "== bench"; tail -n 40 "$out/logs/bench.log"
steps_exit
