#!/usr/bin/env bash
# quant9_gpu.sh: issue 10's quantisation pass at head_dim 256, session 8, on one H200 (~80 s expected from a cold disk
# cache; step limits 40 + 35 + 25 s): the Q / K passes with the Hadamard's cross-lane stages done in registers after a
# lane exchange (quant_kernel.V3_FWHT_EXCHANGE, PassConfig.fwht_exchange: 53 instead of 133 shuffles per thread at
# D 256, 37 instead of 69 at D 128) and with one barrier per block instead of two (V3_ONE_BARRIER,
# PassConfig.one_barrier: the block max's barrier also publishes the next block's stage), each off, against the
# current default (v3, staged mean, staged store at head_dim 64, K's mean as torch's sum of V's partial sums).
#
#   source .gpu/env.sh && scripts/quant9_gpu.sh          (repository root; logs under $OUT/quant9, else results/quant9)
#
# 1. precompile (16 processes, --unique, into the disk cache): default / exchange / one barrier / both x the default
#    recipe at D 64 / 128 / 256 (scripts/quant_precompile.py --set quant9; ~21 distinct passes)
# 2. GPU tests (-n 5): test_v3_fwht_exchange_bitwise (D 128 / 256, default recipe: K smoothed, Q with the shift;
#    e4m3 bytes, descales, K mean, V equal bit for bit to the default's, == the torch recipe given the pass's mean; the
#    LSE shift (another float32 summation order) within a few ulps of its sum of |terms|; GQA, batch 3, odd lengths,
#    a negative scale, NaN-poisoned memory) and test_v3_one_barrier_bitwise (the same, every output bit for bit;
#    D 128 / 256, and D 256 with the exchange on both sides). Beside them compute-sanitizer racecheck
#    (scripts/quant_sanitize.py --set quant9: both switches on, the launch cut to 2 CTAs so each walks many blocks
#    through its 3 stages, D 128 / 256; 35 s cap).
# 3. scripts/fp8_quant_bandwidth.py: def (the current default) vs defx (+ exchange), defb (+ one barrier), defxb (both);
#    the default recipe; B*N = 16k, H*D = 2048, D 64 / 128 / 256 + GQA D 128; 5 rotated rounds (median), each row
#    checked against the torch recipe given its mean; per-kernel us and % of copy per pass (V (+ K's sums), K, Q, for
#    each launch's own bytes). D 64 is the null row (neither switch changes a D 64 kernel: no cross-lane stage; the
#    staged store keeps two barriers): its ratios show the noise.
# Pass (correctness): "== gpu_tests: rc=0" (5 passed); racecheck rc=0 with "CALLS 2 FAILED 0" and 0 hazards; every
# bandwidth row "ok", each A/B line "all matched: True".
# Flip rule (the lead sets the switch to True): correctness passed, and its K and Q pass times at D 256 both <= 0.97x
# def's with the whole-call ratio <= 0.99 at D 128 and D 256 (and GQA) - for defxb: both switches; else the better of
# defx / defb that meets it alone.
# Prediction (bench/NOTES.md, "Session 8 (2026-12-01): quantisation pass at head_dim 256: the Hadamard's lane exchange
# and one barrier per block; predictions before the run"): D 256 K / Q pass 47.1 / 48.8 us (50 / 49% of copy) ->
# defx 44-47 / 46-49, defb 44-46 / 45-47, defxb 42-45 / 43-47 us; whole call D 256 47.4% -> 49-51% (defxb); D 128
# K / Q 32.7 / 35.9 us -> within 0.97-1.00x; D 64 1.00 +- 0.02 (unchanged kernels). The 70% target stays missed.
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
out="${OUT:-results}/quant9"; session_setup "$out"
# under $out: commit.txt, gpu.txt, clocks.csv, the step logs, sanitize.log, quant_bw.json
step precompile 40 python3 scripts/quant_precompile.py --jobs 16 --set quant9 --unique
racecheck_bg quant9 35
step gpu_tests 35 python3 -m pytest -q -n 5 -m gpu -p no:cacheprovider --tb=short tests/test_fp8_quant_kernel.py \
  -k "test_v3_fwht_exchange_bitwise or test_v3_one_barrier_bitwise"
wait
step bandwidth 25 python3 scripts/fp8_quant_bandwidth.py --pipelines def,defx,defb,defxb --recipes default \
  --rounds 5 --breakdown --ab def:defx,def:defb,def:defxb --json "$out/quant_bw.json"
echo
stop_clocks; cat "$out/commit.txt" "$out/gpu.txt"
grep -E "precompile:|FAILED" "$out/precompile.log" | head -6
echo "-- gpu_tests"; grep -E "^FAILED|passed|failed|error" "$out/gpu_tests.log" | tail -8
grep -E "RACECHECK SUMMARY|CALLS|DIFF|^rc=" "$out/sanitize.log"
grep -E "^device copy|MISMATCH|DIFF" "$out/bandwidth.log" | head -10
sed -n '/^A\/B /,$p' "$out/bandwidth.log" | grep . || tail -20 "$out/bandwidth.log"
