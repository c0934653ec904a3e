#!/usr/bin/env bash
# quantchains_gpu.sh: issue 10's quantisation pass, Q's LSE shift summed in several chains (quant_host.SHIFT_CHAINS,
# session 21), on one H200 (~90-130 s cold; limits 60 + 90 + 60 s).
#
#   source .gpu/env.sh && scripts/quantchains_gpu.sh          (repository root; writes under $OUT/quantchains; --help)
#
# Why (bench/NOTES.md, "Session 21 (2026-12-03): Q's LSE shift in chains; predictions before the run"): session 21's
# ncu found the shift costing Q's pass 8 us at head_dim 128 and Q's wide pass stalling on fixed-latency dependencies
# ("wait" 0.73 per issue against K's 0.41): the shift's sum is a serial chain of 64 dependent FMAs per thread.
# 0. precompile: scripts/quant_precompile.py --set quantchains --unique (the default recipe with 1 / 2 / 8 chains at
#    head_dim 64 / 128 / 256, 8 chains with Q's pass wide at 128).
# 1. GPU tests: tests/test_fp8_quant_shift.py (12: every output bit for bit the default's except the shift, which stays
#    within float32 rounding of the default's and of torch's; Q's wide pass = the narrow one at the same chain count).
# 2. scripts/fp8_quant_bandwidth.py --pipelines def,defc2,defc8,defw128c8 --recipes default, every shape, 5 rotated
#    rounds, CUDA-graph timings, each call's kernels (defw128c8 only at head_dim 128).
# Pass: precompile "0 failed"; "12 passed"; every bandwidth row "ok" (the script's SUMMARY FAIL is the 70 % target).
# Prediction and flip rule: bench/NOTES.md (the section above).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/quantchains"; gpu_session "$out/logs" "$@"
step precompile 60 python3 scripts/quant_precompile.py --set quantchains --unique --jobs 14
step pytest 90 python3 -m pytest -q $(xdist_flag 8) -m gpu -p no:cacheprovider --tb=short -rfE \
  tests/test_fp8_quant_shift.py
step bandwidth 60 python3 scripts/fp8_quant_bandwidth.py --pipelines def,defc2,defc8,defw128c8 --recipes default \
  --skip "defw128c8:default:D=64,defw128c8:default:D=256" --rounds 5 --graph --breakdown \
  --ab def:defc2,def:defc8,def:defw128c8 --json "$out/quantchains.json"
echo; stop_clocks; cat "$LOGS/commit.txt"
grep -E "precompile:|FAILED" "$LOGS/precompile.log" | head -6
expect_passed 12
echo "== bandwidth"; grep -E "^A/B|^  D=|^AB |^SUMMARY|^% of copy|per pass" "$LOGS/bandwidth.log" | head -90
steps_exit
