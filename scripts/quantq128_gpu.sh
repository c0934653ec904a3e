#!/usr/bin/env bash
# quantq128_gpu.sh: issue 10's quantisation pass, session 21, on one H200 (~90-130 s cold; limits 60 + 60 + 60 s):
# Q's pass wide at head_dim 128 too (quant_host.V3_WIDE128 = True instead of "k"), never timed since the non-finite
# rule became the default: Q's wide pass then compiles to 174 registers without spill (session 14's timing had 255
# registers and 40 bytes of spill, with the rule off), beside the default and with the sampled mean counted late.
#
#   source .gpu/env.sh && scripts/quantq128_gpu.sh          (repository root; writes under $OUT/quantq128; --help)
#
# 0. precompile: scripts/quant_precompile.py --set quantsamp --unique (its head_dim 128 tasks with V3_WIDE128 = True).
# 1. GPU tests: tests/test_fp8_quant_kernel.py -k "test_v3_wide128_bitwise and both" (5: every output bit for bit
#    the default's, the LSE shift included).
# 2. scripts/fp8_quant_bandwidth.py --shapes D=128,D=128 GQA --pipelines def,defw128,defl,defw128l --recipes
#    default,sampled16 (defl / defw128l on sampled16 only), 5 rotated rounds, CUDA-graph timings, each call's kernels.
# Pass: precompile "0 failed"; "5 passed"; every bandwidth row "ok" (the script's SUMMARY FAIL is the 70 % target).
# Prediction and flip rule: bench/NOTES.md, "Session 21 (2026-12-03): Q's pass wide at head_dim 128, again".
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/quantq128"; gpu_session "$out/logs" "$@"
step precompile 60 python3 scripts/quant_precompile.py --set quantsamp --unique --jobs 14
step pytest 60 python3 -m pytest -q $(xdist_flag 5) -m gpu -p no:cacheprovider --tb=short -rfE \
  tests/test_fp8_quant_kernel.py -k "test_v3_wide128_bitwise and both"
step bandwidth 60 python3 scripts/fp8_quant_bandwidth.py --shapes "D=128,D=128 GQA" \
  --pipelines def,defw128,defl,defw128l --recipes default,sampled16 \
  --skip defl:default,defw128l:default --rounds 5 --graph --breakdown --ab def:defw128,defl:defw128l \
  --json "$out/quantq128.json"
echo; stop_clocks; cat "$LOGS/commit.txt"
grep -E "precompile:|FAILED" "$LOGS/precompile.log" | head -6
expect_passed 5
echo "== bandwidth"; tail -n 40 "$LOGS/bandwidth.log"
steps_exit
