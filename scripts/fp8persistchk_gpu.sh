#!/usr/bin/env bash
# fp8persistchk_gpu.sh: issue 10, the checks of session 22's flip (fa3-fp8's short calls on fa3's persistent grid:
# fa3_fp8.BALANCED_MAX_SEQLEN_K / PERSISTENT_MAX_SEQLEN_K) on one H200. ~330-420 s cold (limits 90 + 200 + 170 s).
#
#   source .gpu/env.sh && scripts/fp8persistchk_gpu.sh       (repository root; writes under $OUT/fp8persistchk; --help)
#
# 0. precompile: scripts/fa3_fp8_speed_ab.py --set fp8persist --phase precompile at head_dim 64 / 128 / 256 (the grids, both
#    causal modes, the tests' recipes).
# 1. GPU tests: tests/test_fa3_fp8_persistent_gpu.py (62: the persistent grids bit for bit the default grid's O and
#    LSE, and the defaults taking them) and tests/test_fa3_fp8_gpu.py (80: the backend's matrix, now on the new
#    defaults where its shapes are short calls with more tiles than SMs).
# 2. compute-sanitizer memcheck and racecheck on fa3-fp8 at head_dim 64 and 128 with FA_VARIANTS_FP8_PERSISTENT=all
#    (scripts/sanitize.py: its 2 x 300 x 48-head shapes have 288 query tiles, so CTAs walk several: balanced when
#    causal, the static order otherwise).
# Pass: precompile "0 failed"; "190 passed"; "clean" for both tools and head dims.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/fp8persistchk"; gpu_session "$out/logs" "$@"
step precompile 90 python3 scripts/fa3_fp8_speed_ab.py --set fp8persist --phase precompile --jobs 14
step pytest 200 python3 -m pytest -q $(xdist_flag 12) -m gpu -p no:cacheprovider --tb=short -rfE \
  tests/test_fa3_fp8_persistent_gpu.py tests/test_fa3_fp8_gpu.py
step sanitize 170 env FA_VARIANTS_FP8_PERSISTENT=all python3 scripts/sanitize.py --tools memcheck racecheck \
  --backends fa3-fp8 --head-dims 64 128 --per-head-dim --precompile --timeout 150 --out "$out/sanitize"
echo; stop_clocks; cat "$LOGS/commit.txt"
grep -E "precompile:|FAILED" "$LOGS/precompile.log" | head -8
expect_passed 190
echo "== sanitize"; grep -E "clean|error|WRONG|FAILED|CALLS" "$LOGS/sanitize.log" | head -n 16
steps_exit
