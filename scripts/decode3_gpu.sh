#!/usr/bin/env bash
# decode3_gpu.sh: issue 13 round 4 on one H200, the split merge fused into the split kernel. ~4 min.
#
#   source .gpu/env.sh; scripts/decode3_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/decode3_precompile.py: every kernel below compiled in 12 processes into the disk cache (~1 min).
# 1. tests/test_decode_fused_gpu.py (fused merge vs float64: splits 1-150, odd lengths, Nk 1, rows seeing no key,
#    causal, LSE, packed GQA host views and in-kernel rows, seqlens_k with 0 and 1, CUDA-graph replay with eager
#    calls between, repeated calls (counters back at 0), two streams at once, fused vs two kernels) and
#    tests/test_decode_gpu.py -k "cuda_graph_replay_of or either_merge" (the two-kernel path on the cached workspace).
# 2. scripts/decode_ab.py --wins: the 32 seqlen_q = 1 shapes lost on 2026-12-01 + 6 shapes won (seqlen_q 4 / 16,
#    batch 64): auto (as shipped) vs two (two kernels), fused, dual+two+pdl2 (this morning's best, dual+pdl2),
#    dual+fused+pdl2, beside SDPA (CUDA graphs, 4 rotated rounds).
# 3. scripts/api_overhead.py --device cuda --backend fa3,fa2 --phases, with two kernels (default) and fused
#    (FA_VARIANTS_FUSED_MERGE=1): host us per call, B1 Nq1 Nk4k 32:8 D128.
# Pass: (1) 0 failed / 0 errors. (2) no BAD/ERR cell; fused's geomean vs SDPA below two's, and its WINS rows still
# <= 1.00. Then make it the default in hopper/fa3.py (FUSED_MERGE: "all"; or "decode" if fused loses only on the
# Nq 4/16 rows). (3) fused fa3 host (enqueue) <= 25 us/call (38.4 us at 15c4a22); two-kernel host lower than
# 38.4 too (no per-call workspace).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/decode3}"; gpu_session "$out/logs" "$@"
VARIANTS=(two fused dual+two+pdl2 dual+fused+pdl2)
step precompile 120 python3 scripts/decode3_precompile.py --jobs 16 --wins --variants "${VARIANTS[@]}"
NPROC=$(xdist_flag 4)
step pytest_fused 120 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX \
  tests/test_decode_fused_gpu.py tests/test_decode_gpu.py -k "fused or cuda_graph_replay_of or either_merge"
step decode_ab 130 python3 scripts/decode_ab.py --wins --rounds 4 --variants "${VARIANTS[@]}" --out "$out/decode_ab"
step overhead 40 python3 scripts/api_overhead.py --device cuda --backend fa3,fa2 --phases --rounds 9
step overhead_fused 25 env FA_VARIANTS_FUSED_MERGE=1 python3 scripts/api_overhead.py --device cuda --backend fa3 --phases --rounds 9
echo "== pytest_fused"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest_fused.log" | tail -n 12
echo "== decode_ab"; grep -E "^\| D|geomean|counters of captured" "$out/logs/decode_ab.log" | cut -c1-150 | tail -n 46
echo "== overhead (two kernels)"; grep -E "host \(enqueue\)|^  (key|alloc|launch)|^    [a-z]|^gpu|SUMMARY" "$out/logs/overhead.log"
echo "== overhead (fused)"; grep -E "host \(enqueue\)|^  (key|alloc|launch)|^    [a-z]|^gpu|SUMMARY" "$out/logs/overhead_fused.log"
steps_exit
