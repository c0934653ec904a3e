#!/usr/bin/env bash
# quant_gpu.sh: issue 10's quantisation pass on one H200 (about 3 min; step limits 110 + 80 + 90 s): pipeline v1
# (before) vs v2 (three blocks of loads in flight per CTA, K's mean summed in V's launch instead of torch, K read
# last block first, programmatic dependent launch of K's and Q's passes).
#   1. precompile (parallel processes, into the disk cache): every pass of steps 2 and 3
#   2. tests/test_fp8_quant_kernel.py, GPU tests (both pipelines vs the torch recipe, bit for bit; v2's K mean
#      vs float64 within its float32 rounding bound)
#   3. scripts/fp8_quant_bandwidth.py: v1 vs v2, default recipe and no-smooth, B*N = 16k, H*D = 2048,
#      D 64 / 128 / 256 (+ a GQA shape with a tail), % of the device copy bandwidth
#
#   source .gpu/env.sh; scripts/quant_gpu.sh        (repository root; logs under $OUT/quant, else results/quant)
# Pass: "== gpu_tests: rc=0", every row "ok" and "SUMMARY fp8_quant_bandwidth v2: PASS" (>= 70% of copy).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/quant"; gpu_session "$out" "$@"
step precompile 110 python3 scripts/quant_precompile.py --jobs 14
step gpu_tests 80 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider --tb=short tests/test_fp8_quant_kernel.py
step bandwidth 90 python3 scripts/fp8_quant_bandwidth.py --pipelines v1,v2 --breakdown --ablation --json "$out/quant_bw.json"
echo
grep -E "precompile:|FAILED" "$out/precompile.log" | head -6
grep -E "^FAILED|passed|failed|error" "$out/gpu_tests.log" | tail -6
sed -n '/^% of copy/,$p' "$out/bandwidth.log" | grep . || tail -20 "$out/bandwidth.log"
grep -E "^ablation" "$out/bandwidth.log"
steps_exit
