#!/usr/bin/env bash
# hadacore_gpu.sh: issue 10's quantisation pass, session 9, on one H200 (~95 s expected from a cold disk cache; step
# limits 45 + 80 + 25 s; session 10: the tests ran past 38 s): Q's / K's Hadamard at head_dim 256 on the tensor cores, quant_host.V3_MMA_FWHT
# (PassConfig.mma_fwht, off): H_256 = H_16 (x) H_16; the transform over a token's low 4 channel bits as 16 mma.sync
# m16n8k16 per warp and block (H_16 as the B operand, fp32 accumulate), the high 4 bits in registers (each lane holds
# all 16 rows of its 4 columns: no shuffle); e4m3 stored 4 bytes at a time. The exact path (built): the mma's A operand
# is the 16-bit input XOR its sign-bit masks (x * sign, exact; no float32 round trip), a smoothed K's mean enters as the
# accumulator start -(mean * sign) H_16 per row (quant_maps.mma_mean_offset: one float32 matmul per call between V's
# launch and K's pass, staged where the mean was). So the torch recipe up to the float32 addition order (the mma's sum
# of 16 exact products + the offset against x - mean and 4 rounded stages), as Q; CPU model on the test's K: 2.0e-5 of
# the bytes differ (fp16 1.8e-5), by one step. Against the current default (v3: the shuffle FWHT, the recipe bit for bit).
#
#   source .gpu/env.sh && scripts/hadacore_gpu.sh          (repository root; logs under $OUT/hadacore, else results/hadacore)
#
# 1. precompile (16 processes, --unique, into the disk cache): default / mma at D 256 (bf16: default, no-smooth,
#    head-smooth recipes; fp16: default), the default at D 64 / 128 (scripts/quant_precompile.py --set hadacore)
# 2. GPU tests (-n 3): test_v3_mma_fwht (bf16 default / no-smooth / head-smooth, fp16 default = 4): V and K's mean
#    equal to the default's bit for bit, the LSE shift within float32 summation's bound, Q / K e4m3 each within one e4m3
#    step of float64 R (x - mean) / descale, mean squared error within 2% of the default's, bytes differing from the
#    default's <= 1e-4 for Q and K, smoothed or not (no floor), descales equal in >= 90% of the blocks; GQA, odd
#    lengths, batch 3, a negative scale (K's signs negated: the offset too), NaN-poisoned memory (the switch-off call in
#    each test is the unchanged default path). No racecheck: the switch changes no synchronisation (same barriers, same
#    stage life cycle; the sign masks are written before the first barrier where the signs were).
# 3. scripts/fp8_quant_bandwidth.py: def (the current default) vs defm (+ V3_MMA_FWHT), the default recipe, B*N = 16k,
#    H*D = 2048, D 64 / 128 / 256 + GQA D 128 (defm differs from def at D 256 only: the other rows are an A/A check of
#    the protocol); 5 rotated rounds (median), per-kernel us and % of copy per pass (defm's D 256 breakdown also lists the
#    offset's matmul); defm's Q / K checked near the recipe (``near_e4m3``: <= 1e-3 of the bytes differ, each within
#    one step), the rest bit for bit. If step 2 did not pass (4 passed, no failure or error), defm is left out of the
#    timing (def alone is timed).
# Pass (correctness): "== gpu_tests: rc=0" (4 passed); every bandwidth row "ok", the A/B line "all matched: True".
# Flip rule (the lead sets V3_MMA_FWHT = True): correctness passed, at D 256 defm's K and Q pass times both <= 0.95x
# def's and the whole call (the offset's matmul included) <= 0.97x, and the A/A rows (D 64 / 128 / GQA) within
# 0.97-1.03 (else the run is too noisy to decide: no flip). The exact smoothed-K path the earlier rule asked for is
# built (this script's tests hold K to Q's 1e-4).
# Prediction (bench/NOTES.md, "Session 9 (2026-12-01): the Hadamard on the tensor cores; predictions before the run",
# "exact smoothed K"): SASS main loop per block K 1181 -> 691 (-41%), Q with the LSE shift 1375 -> 1074 (-22%), no
# spills (the default Q spills 8 bytes); if the passes are issue-bound at ~50% issue efficiency and time falls with
# about half the cut: D 256 K pass 46.5 -> 32-41 us, Q pass 48.7 -> 41-46 us, + one small matmul (2-4 us with its
# gap), whole call 0.85-0.95x; D 64 / 128 / GQA 1.00 +- 0.03. The 70% target stays missed at D 256 (K read twice).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/hadacore"; gpu_session "$out" "$@"
# under $out: commit.txt, gpu.txt, clocks.csv, the step logs, quant_bw.json
step precompile 45 python3 scripts/quant_precompile.py --jobs 16 --set hadacore --unique
step gpu_tests 80 python3 -m pytest -q -n 3 -m gpu -p no:cacheprovider --tb=short tests/test_fp8_quant_kernel.py \
  -k "test_v3_mma_fwht"
pipes=def,defm ab=(--ab def:defm)
if ! grep -qE "^4 passed" "$out/gpu_tests.log" || grep -qE "failed|error" "$out/gpu_tests.log"; then
  pipes=def ab=(); echo "mma_fwht's GPU tests did not pass: defm left out of the timing"
fi
step bandwidth 25 python3 scripts/fp8_quant_bandwidth.py --pipelines "$pipes" --recipes default \
  --rounds 5 --breakdown "${ab[@]}" --json "$out/quant_bw.json"
echo
stop_clocks; cat "$out/commit.txt" "$out/gpu.txt"
grep -E "precompile:|FAILED" "$out/precompile.log" | head -6
echo "-- gpu_tests"; grep -E "^FAILED|passed|failed|error" "$out/gpu_tests.log" | tail -8
bandwidth_summary "$out/bandwidth.log"
