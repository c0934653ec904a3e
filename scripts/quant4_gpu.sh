#!/usr/bin/env bash
# quant4_gpu.sh: issue 10's quantisation pass, session 6, on one H200 (~2.5 min; step limits 30 + 60 + 40 + 15 s):
# pipeline v3 (the new default, was v1), v3 + K's mean staged with each block's loads (V3_STAGED_MEAN, off), + the
# mean finished in V's launch (V3_FUSED_MEAN, off) and the sampled K mean (FP8Config(smooth_k_blocks=8): K read
# once), beside v1.
#
#   source .gpu/env.sh && scripts/quant4_gpu.sh          (repository root; logs under $OUT/quant4, else results/quant4)
#
# 1. precompile (14 processes, into the disk cache): every pass of steps 2-4 (scripts/quant_precompile.py --set quant4)
# 2. GPU tests (tests/test_fp8_quant_kernel.py), two pytest runs side by side (-n 6 each): v3 (the new default) vs
#    the torch recipe bit for bit (bf16 default recipe, 4 shapes x 3 head dims), staged mean == plain v3 bit for bit
#    (default and head-smooth, GQA, batch 3, odd lengths, negative scale), the sampled mean (v1, v3, v3 + staged,
#    + fused: the mean vs float64 over exactly the sampled tokens, the rest bit for bit the torch recipe given it,
#    two calls equal), zero / subnormal blocks; and (gpu_tests_staged) v3's default and head-smooth matrix with
#    FA_VARIANTS_FP8_QUANT_STAGED_MEAN=1. Beside them compute-sanitizer racecheck + synccheck (60 s) of small v3 calls
#    with the staged mean, the sampled mean, and the fused mean over the sample (scripts/quant_sanitize.py --set quant4).
# 3. scripts/fp8_quant_bandwidth.py: v1 (old default), v3 (new default), v3s (v3 + staged mean), v3sf (v3s + fused
#    mean) x recipes default, no-smooth, sampled8; B*N = 16k, H*D = 2048, D 64 / 128 / 256 + GQA with a tail;
#    3 rotated rounds (median), each row checked against the torch recipe; per-kernel times (torch.profiler).
# 4. ncu of v3s + sampled8 at D 64 (where no-smooth itself is slow: K / Q ~45 us vs V 26): SpeedOfLight, memory
#    tables, warp stall reasons.
# Pass: "== gpu_tests: rc=0" and "== gpu_tests_staged: rc=0"; sanitize rc=0 for both tools with "CALLS 9 FAILED 0",
# 0 errors / hazards; every bandwidth row "ok" (no MISMATCH). Predictions (bench/NOTES.md, session 6): v3s / v3 on the
# default recipe: K and Q passes within ~10% of no-smooth's (D 128: K 41.9 -> ~35 us, Q 43.7 -> ~34; D 256: K 54.5
# -> ~44, Q 63.0 -> ~41; D 64 unchanged: 4 CTAs per SM hide the per-block load), default recipe D 128 51 -> ~57%,
# D 256 43 -> ~50%, D 64 ~52%. v3s sampled8: V's launch ~28 us instead of ~48; D 128 ~70% (70-75), D 256 ~60%,
# D 64 ~58%, GQA ~62%: "SUMMARY fp8_quant_bandwidth v3s sampled8: PASS" only if D 64 / 256's K and Q passes are
# faster than predicted. v3sf: ~5 us less than v3s per call with the sampled mean (no torch sum; +3-4% of copy),
# -1 to +4% with the exact mean. Flip V3_STAGED_MEAN on if tests pass and v3s >= v3 - 2% in every default row;
# V3_FUSED_MEAN likewise against v3s.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/quant4"; gpu_session "$out" "$@"
# under $out: commit.txt, gpu.txt, clocks.csv, the step logs, sanitize.log, quant_bw.json, ncu_details.txt
step precompile 30 python3 scripts/quant_precompile.py --jobs 14 --set quant4
san=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
for tool in racecheck synccheck; do
  { r=$(timeout -s INT 60 "$san" --tool "$tool" --error-exitcode 9 python3 scripts/quant_sanitize.py --set quant4 2>&1)
    echo "rc=$? $tool"; echo "$r" | tail -n 10; } > "/tmp/quant4_$tool.log" 2>&1 &
done
step gpu_tests_staged 55 env FA_VARIANTS_FP8_QUANT_STAGED_MEAN=1 python3 -m pytest -q -n 6 -m gpu -p no:cacheprovider \
  --tb=short tests/test_fp8_quant_kernel.py -k "v3-bfloat16-default or v3-bfloat16-head-smooth" &
step gpu_tests 55 python3 -m pytest -q -n 6 -m gpu -p no:cacheprovider --tb=short tests/test_fp8_quant_kernel.py \
  -k "v3-bfloat16-default or staged or sampled or (zero_and_subnormal and v3)"
wait
cat /tmp/quant4_racecheck.log /tmp/quant4_synccheck.log > "$out/sanitize.log"
step bandwidth 40 python3 scripts/fp8_quant_bandwidth.py --pipelines v1,v3,v3s,v3sf --recipes default,no-smooth,sampled8 \
  --skip v1:sampled8,v3s:no-smooth,v3sf:no-smooth --rounds 3 --breakdown --json "$out/quant_bw.json"
step ncu 15 ncu --kernel-name regex:QuantPass --launch-skip 3 --launch-count 3 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy -f -o /tmp/quant4_ncu \
  python3 scripts/quant_ncu.py --pipelines v3s --recipes sampled8 --head-dim 64
ncu --import /tmp/quant4_ncu.ncu-rep --page details > "$out/ncu_details.txt" 2>&1
echo
stop_clocks; cat "$out/commit.txt" "$out/gpu.txt"
grep -E "precompile:|FAILED" "$out/precompile.log" | head -6
for t in gpu_tests gpu_tests_staged; do echo "-- $t"; grep -E "^FAILED|passed|failed|error" "$out/$t.log" | tail -6; done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|CALLS|DIFF|^rc=" "$out/sanitize.log"
grep -E "^device copy|kernels \(us|MISMATCH|DIFF" "$out/bandwidth.log" | head -40
sed -n '/^% of copy/,$p' "$out/bandwidth.log" | grep . || tail -20 "$out/bandwidth.log"
echo "== ncu (v3s sampled8, D 64: V + K sample sums, K, Q)"
grep -E "^  [A-Za-z_]+.*QuantPass|Duration|DRAM Throughput|L2 Hit Rate|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued|stalled|Sectors|Store" \
  "$out/ncu_details.txt" | sed -E 's/kernel_cutlass_kernel_fa_variantsfp8quant_kernelQuantPass_object_at_[^ ]*/QuantPass/' \
  | head -60 || tail -20 "$out/ncu.log"
steps_exit
