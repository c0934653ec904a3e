#!/usr/bin/env bash
# quantdefer_gpu.sh: the FP8 quantisation pass with its non-finite slow path after each CTA's loop
# (``quant_host.NONFINITE_DEFERRED``, ``PassConfig.deferred``, ``redo_left``; session 36, CPU only) on one H100 or H200:
# its tests, then its speed beside the slow path in the loop (the default) and the switch off (~350-500 s cold;
# limits 300 + 150 s).
#
#   source .gpu/env.sh && scripts/quantdefer_gpu.sh  (repository root; writes under $OUT/quantdefer; --help)
#
# Why (bench/NOTES.md, "Session 36"): with the slow path inside the loop the switch cost the pass 1.112 / 1.015 /
# 1.057x of the switch off at D 64 / 128 / 256 (H200), the slow code moving the loop's registers (D 64 Q: 16 bytes
# of spill). Deferred, a block for the slow path is left unstored and the CTA redoes the blocks it left from global
# memory after its loop (a bit per item; every item from the 31st on once one of those is left): the same outputs. On
# the CPU (sm_90a, the default recipe) the loop is then within -12 / +47 static instructions of the switch-off one's
# (~1000-2300), no spill (the slow path in the loop: 16 bytes at D 64's Q pass); no pass of the no-smooth, per-head
# and no-rotate recipes, nor of pipelines v1 / v2, spills with it (sm_90a; sm_89 v3 D 64 Q: 32 bytes in the loop,
# 24 deferred).
# 1. GPU tests: tests/test_fp8_quant_nonfinite.py (every case in the loop and deferred, also at GRID_CAP 1 and 5: the
#    pass = the torch recipe on inf / -inf / NaN / huge / aligned / near inputs; finite inputs bit for bit), and with
#    FA_VARIANTS_FP8_QUANT_DEFERRED=1 tests/test_fp8_quant_kernel.py's pass vs the recipe bit for bit (default recipe, v3) and fa3-fp8 end to end on a
#    non-finite input (test_fa3_fp8_rows_that_read_it).
# 2. scripts/fp8_quant_bandwidth.py: "def" (slow path in the loop), "defd" (deferred) and "defoff" (the switch off),
#    default recipe, D 64 / 128 / 256, 6 rotated rounds, each kernel's time (--breakdown).
# Pass: pytest no failure; every bandwidth row matched the torch recipe.
# Prediction: defd / defoff <= 1.01 at every head_dim (the loop's code within ~2 % of the switch off's);
#   def / defoff as session 36's (1.11 / 1.02 / 1.06).
# Flip rule: NONFINITE_DEFERRED on by default if the tests pass and defd / def <= 0.99 at D 64 and <= 1.00 elsewhere.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/quantdefer"; gpu_session "$out/logs" "$@"
step pytest 300 bash -c "python3 -m pytest -q $(xdist_flag 12) -m gpu -p no:cacheprovider --tb=short -rfE \
  tests/test_fp8_quant_nonfinite.py && FA_VARIANTS_FP8_QUANT_DEFERRED=1 python3 -m pytest -q $(xdist_flag 12) -m gpu \
  -p no:cacheprovider --tb=short -rfE tests/test_fp8_quant_kernel.py tests/test_fp8_quant_nonfinite.py -k \
  '(test_pass_matches_torch_bitwise and v3 and default) or test_fa3_fp8_rows_that_read_it'"
grep -qE "[0-9]+ failed" "$LOGS/pytest.log" \
  && step diag 120 env FA_VARIANTS_FP8_QUANT_DEFERRED=1 python3 scripts/diag_nonfinite.py
step bw 150 python3 scripts/fp8_quant_bandwidth.py --pipelines def,defd,defoff --ab defoff:def,defoff:defd,def:defd \
  --recipes default --shapes D=64,D=128,D=256 --rounds 6 --breakdown --json "$out/bw.json"
echo; stop_clocks; cat "$LOGS/commit.txt"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$LOGS/pytest.log" | tail -n 12
[ -f "$LOGS/diag.log" ] && { echo "== diag"; grep -v "^ok" "$LOGS/diag.log" | cut -c1-240 | head -n 20; }
echo "== bw"; grep -A 12 "^A/B" "$LOGS/bw.log"; grep "^SUMMARY\|^AB" "$LOGS/bw.log"
steps_exit
