#!/usr/bin/env bash
# quantsamp_gpu.sh: issue 10's quantisation pass at >= 70 % of copy, session 21, on one H200 (~100-150 s cold;
# limits 60 + 70 + 90 s): what K's mean over 16 evenly spaced K tiles (FP8Config(smooth_k_blocks=16), "sampled16")
# buys with today's passes, beside the default recipe (the exact mean) and the unsmoothed recipe (the ceiling).
#
#   source .gpu/env.sh && scripts/quantsamp_gpu.sh          (repository root; writes under $OUT/quantsamp; --help)
#
# Why (bench/NOTES.md, "Session 21 (2026-12-03): the sampled K mean with today's passes; predictions before the run"):
# the exact mean reads K twice (V's launch sums all of K, ~20 us of its ~49 us at D 128, then a torch sum of the
# partials, ~6 us); session 7's accuracy study found the mean over 16 tiles within noise of the exact mean on every
# input kind (bench/NOTES.md, "Session 7 (2026-12-01): sampled K mean, accuracy on the emulation") and its rule let
# m = 16 become the default if it pays; the last sampled timing (session 8, sampled8, 52-66 % of copy) predates the
# wide K pass, the cursor-free default and the call plans.
# 0. precompile: scripts/quant_precompile.py --set quantsamp --unique (default / no-smooth / sampled16 at D 64 / 128 /
#    256, sampled16 with V3_FUSED_SAMPLED_MEAN and with V3_FUSED_MEAN_LATE).
# 1. GPU tests: tests/test_fp8_quant_kernel.py -k "sampled" (the sampled mean's launches vs the torch recipe).
# 2. scripts/fp8_quant_bandwidth.py --pipelines def,defs,defl --recipes default,sampled16,no-smooth (defs / defl only
#    on sampled16: on the other recipes they are def / the late count of the exact mean), 5 rotated rounds, CUDA-graph
#    timings and each call's kernels.
# Pass: precompile "0 failed"; pytest no failure; every bandwidth row "ok".
# Prediction and flip rule: bench/NOTES.md (the section above).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/quantsamp"; gpu_session "$out/logs" "$@"
step precompile 60 python3 scripts/quant_precompile.py --set quantsamp --unique --jobs 14
step pytest 70 python3 -m pytest -q $(xdist_flag 6) -m gpu -p no:cacheprovider --tb=short -rfE \
  tests/test_fp8_quant_kernel.py -k "sampled"
step bandwidth 90 python3 scripts/fp8_quant_bandwidth.py --pipelines def,defs,defl \
  --recipes default,sampled16,no-smooth --skip defs:default,defs:no-smooth,defl:default,defl:no-smooth \
  --rounds 5 --graph --breakdown --ab def:defs,def:defl --json "$out/quantsamp.json"
echo; stop_clocks; cat "$LOGS/commit.txt"
grep -E "precompile:|FAILED" "$LOGS/precompile.log" | head -6
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$LOGS/pytest.log" | tail -n 8
grep -qE "failed|error" "$LOGS/pytest.log" && step_failed pytest "a test failed"
echo "== bandwidth"; tail -n 60 "$LOGS/bandwidth.log"
steps_exit
