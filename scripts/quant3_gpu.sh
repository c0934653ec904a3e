#!/usr/bin/env bash
# quant3_gpu.sh: issue 10's quantisation pass, pipeline v3 (coalesced loads through a swizzled shared-memory
# stage + blocks walked head fastest, on top of v2) on one H200. About 4 min (step limits 100 + 90 + 100 + 60 s).
#
#   source .gpu/env.sh && scripts/quant3_gpu.sh          (repository root; logs under $OUT/quant3, else results/quant3)
#
# 1. precompile (14 processes, into the disk cache): every pass of steps 2-4
# 2. tests/test_fp8_quant_kernel.py GPU tests but v2's per-recipe cases (v1 and v3 vs the torch recipe bit for
#    bit; v3 == v2 bit for bit; the optional fused K mean; block height 256, zero / subnormal blocks, the switch);
#    beside them compute-sanitizer racecheck and synccheck of small v3 calls, with and without the fused mean
#    (scripts/quant_sanitize.py)
# 3. scripts/fp8_quant_bandwidth.py v1 vs v3, default recipe and no-smooth, B*N = 16k, H*D = 2048, D 64 / 128 / 256
#    (+ GQA with a tail), % of copy, each call's kernels (torch.profiler), and the ablation at D 128 (v3 without
#    coalescing, tile-major, 2 stages, no PDL, + fused mean; v2; each checked against the torch recipe)
# 4. ncu (SpeedOfLight, MemoryWorkloadAnalysis, Occupancy, LaunchStats) of one default-recipe call of v1 and of
#    v3 at D 128 (3 QuantPass launches each), summarised per kernel
# Pass: "== gpu_tests: rc=0" (0 failed), sanitize "rc=0" for both tools with "CALLS 6 FAILED 0" and 0 errors,
# every bandwidth row "ok", "SUMMARY fp8_quant_bandwidth v3: PASS" (>= 70%
# of copy; otherwise FAIL with the worst row), no "DIFF" in the ablation line. The ncu lines attribute what is
# left (DRAM vs L2 vs issue).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/quant3"; gpu_session "$out" "$@"
# under $out: commit.txt, gpu.txt, clocks.csv, the 4 step logs, sanitize.log, quant_bw.json, ncu_details.txt
step precompile 100 python3 scripts/quant_precompile.py --jobs 14
# racecheck + synccheck of small v3 calls (shared stages, the fused mean's counter) beside the tests
san=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
for tool in racecheck synccheck; do
  { r=$(timeout -s INT 85 "$san" --tool "$tool" --error-exitcode 9 python3 scripts/quant_sanitize.py 2>&1)
    echo "rc=$? $tool"; echo "$r" | tail -n 10; } > "/tmp/quant_$tool.log" 2>&1 &
done
step gpu_tests 90 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider --tb=short -k "not v2-" \
  tests/test_fp8_quant_kernel.py
wait
cat /tmp/quant_racecheck.log /tmp/quant_synccheck.log > "$out/sanitize.log"
step bandwidth 100 python3 scripts/fp8_quant_bandwidth.py --pipelines v1,v3 --breakdown --ablation \
  --json "$out/quant_bw.json"
step ncu 60 ncu --kernel-name regex:QuantPass --launch-skip 6 --launch-count 6 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats -f -o /tmp/quant_ncu \
  python3 scripts/quant_ncu.py --pipelines v1,v3
ncu --import /tmp/quant_ncu.ncu-rep --page details > "$out/ncu_details.txt" 2>&1
echo
stop_clocks; cat "$out/commit.txt" "$out/gpu.txt"
grep -E "precompile:|FAILED" "$out/precompile.log" | head -6
grep -E "^FAILED|passed|failed|error" "$out/gpu_tests.log" | tail -8
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|CALLS|DIFF|^rc=" "$out/sanitize.log"
grep -E "^device copy|kernels \(us" "$out/bandwidth.log" | head -20
sed -n '/^% of copy/,$p' "$out/bandwidth.log" | grep . || tail -20 "$out/bandwidth.log"
grep -E "^ablation" "$out/bandwidth.log"
echo "== ncu (per QuantPass launch: v1 V, K, Q then v3 V+K sums, K, Q)"
grep -E "^  [A-Za-z_]+.*QuantPass|Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit Rate|Mem Busy|Max Bandwidth|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Grid Size|Block Size|Dynamic Shared Memory Per Block" \
  "$out/ncu_details.txt" | sed -E 's/kernel_cutlass_kernel_fa_variantsfp8quant_kernelQuantPass_object_at_[^ ]*/QuantPass/' \
  | head -120 || tail -20 "$out/ncu.log"
steps_exit
