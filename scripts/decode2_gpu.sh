#!/usr/bin/env bash
# decode2_gpu.sh: issue 13's seqlen_q = 1 misses on one H200: the new switches' GPU tests, then their A/B. ~3-4 min.
#
#   source .gpu/env.sh; scripts/decode2_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 1. tests/test_decode_gpu.py -k "pdl or decode_tiles or merge_kernel" (-n 8): PDL merge and PDL attention kernel
#    on sequences of calls with fresh Q (bitwise equal to the same calls without PDL) and in CUDA-graph replay;
#    the decode tile sets deep / wide / dual vs float64 (splits 1 and 3, odd lengths); the merge kernel (now with
#    O prefetch and LSEs staged once) vs split.merge, plain and PDL, 1-150 splits.
# 2. scripts/decode_ab.py: the 32 shapes where ours lost to SDPA on 2026-12-01, auto vs pdl, pdl2, deep, deep+pdl2,
#    wide+pdl2, dual+pdl2, half splits, no split, beside SDPA (CUDA graphs, 5 rotated rounds, medians).
# Pass: (1) 0 failed / 0 errors. (2) no BAD/ERR cell (every variant's output matches SDPA's on a fresh Q); the
# summary's last lines give per variant the shapes <= SDPA (auto was 0/32 on 2026-12-01) and the geomean ratio:
# pick the variant (or per-shape rule) to make default. If PDL fails in (1): FA_VARIANTS_MERGE_PDL and
# FA_VARIANTS_DECODE_PDL stay off (default) and nothing else changes.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/decode2}"; gpu_session "$out/logs" "$@"
step pytest_new 150 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider --tb=short -rfEX \
  tests/test_decode_gpu.py -k "pdl or decode_tiles or merge_kernel"
step decode_ab 200 python3 scripts/decode_ab.py --out "$out/decode_ab"
echo "== pytest_new"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest_new.log" | tail -n 15
echo "== decode_ab"; tail -n 50 "$out/logs/decode_ab.log"
steps_exit
