#!/usr/bin/env bash
# quant256_gpu.sh: issue 10's quantisation pass at head_dim 256, session 11, on one H200 (~80 s expected from a cold
# disk cache; step limits 30 + 40 + 25 s, < 100 s in all): Q's / K's Hadamard with its cross-lane stages in registers,
# quant_host.V3_FWHT_TRANSPOSE (PassConfig.fwht_transpose, off; head_dim 128 / 256). After the in-chunk stages
# (h = 1..8) the L = head_dim / 64 lanes of a token swap their float32 values through the warp's own part of the
# shared-memory stage it has just read (16 STS.128 + 16 LDS.128 per thread, conflict-free by quant_maps.xpose_perm;
# __syncwarp only), so h = 16 .. head_dim / 8 are register FADDs instead of 64 log2(L) shfl.bfly + FMA per thread; the
# e4m3 bytes go through the same part of the stage in token-row order (512 contiguous bytes per warp store). Same pairs,
# stage order and roundings: every output bit for bit the default's. Why: per head_dim the K / Q pass time grows with
# the FWHT's shuffles (0 / 64 / 128 per thread at D 64 / 128 / 256: K 27.8 / 34.0 / 45.7 us for the same bytes; at
# D 128 and 256 K has the same CTA, 512 threads alone on its SM), and every shuffle stage runs with all 16 warps of the
# CTA in it at once (SASS: SHFL / FFMA alternating, no other work to overlap).
#
#   source .gpu/env.sh && scripts/quant256_gpu.sh          (repository root; logs under $OUT/quant256, else results/quant256)
#
# 1. precompile (16 processes, --unique): default / transpose passes, default recipe at D 64 / 128 / 256, no-smooth and
#    head-smooth at 256 (scripts/quant_precompile.py --set quant256).
# 2. GPU tests (-n 5): test_v3_fwht_transpose_bitwise (5 cases: D 256 default, default with 5 CTAs, no-smooth,
#    head-smooth with 7 CTAs (its "amax" and "given" launches); D 128 default with 5 CTAs): every output of the switch on equal to the switch
#    off bit for bit (q, k, v_t, descales, K mean, LSE shift) and to the torch recipe given the pass's K mean; GQA, odd
#    lengths, batch 3, negative scale, NaN-poisoned memory. Beside it (limit 35 s) compute-sanitizer racecheck
#    (scripts/quant_sanitize.py --set quant256: the transpose with 3 CTAs, D 128 / 256, checked against the recipe).
# 3. scripts/fp8_quant_bandwidth.py: def (the current default) vs deft (+ V3_FWHT_TRANSPOSE), default recipe, B*N = 16k,
#    H*D = 2048, D 64 / 128 / 256 + GQA D 128 (D 64 is an A/A row: no change there); 5 rotated rounds (median), per-pass
#    us and % of copy; every row checked against the torch recipe. If step 2 did not pass, deft is left out.
# Beside step 2 (background, limit 35 s): Nsight Compute on one default-recipe call of def and one of deft at D 256
#    (scripts/quant_ncu.py: V + K sums, K, Q each): SpeedOfLight and WarpStateStats; scripts/ncu_stalls.py prints per
#    kernel the cycles per issued instruction and the largest stall reasons (mio_throttle / short_scoreboard: the
#    shuffle and shared-memory pipe; barrier: the CTA's lockstep; long_scoreboard: the loads; math_pipe_throttle /
#    not_selected: issue-bound). Diagnostic only (its durations are not timings: the tests share the GPU): why the K / Q
#    passes run at ~50% of copy at D 256, whatever the A/B says.
# Pass (correctness): "== gpu_tests: rc=0" (5 passed), racecheck "RACECHECK SUMMARY: 0 hazards" and "CALLS 2 FAILED 0",
# every bandwidth row "ok", "all matched: True".
# Flip rule (the lead sets V3_FWHT_TRANSPOSE = True and V3_FWHT_TRANSPOSE_DIMS to the head_dims that gained; each row's
# passes are that head_dim's only, so the rows decide apart): correctness passed and the D 64 A/A row within 0.98-1.02
# (else the run is too noisy to decide); D 256 in if its row <= 0.97 with its K and Q passes both faster; D 128 in if
# both D 128 rows (plain and GQA) are <= 0.99. Neither: not flipped (then the ncu step says what limits the passes).
# Prediction (bench/NOTES.md, "Session 11 (2026-12-02): fp8 quant pass at head_dim 256; predictions before the run"):
# D 256 K pass 45.7 -> 38-42 us, Q 49.1 -> 42-46 us, whole call 0.90-0.95x (47.0 -> 50-52% of copy); D 128 / GQA
# 0.97-1.01 (one shuffle stage only); D 64 1.00 +- 0.02. The 70% target stays missed (K read twice; V's launch unchanged).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/quant256"; gpu_session "$out" "$@"
# under $out: commit.txt, gpu.txt, clocks.csv, the step logs, sanitize.log, quant_bw.json
step precompile 30 python3 scripts/quant_precompile.py --jobs 16 --set quant256 --unique
racecheck_bg quant256 35
# the ncu diagnostic beside the tests (its own limit; the report read after the wait)
timeout -k 5 -s INT 35 ncu --kernel-name regex:QuantPass --launch-skip 6 --launch-count 6 --section SpeedOfLight \
  --section WarpStateStats -f -o /tmp/quant256_ncu python3 scripts/quant_ncu.py --pipelines def,deft --head-dim 256 \
  > "$out/ncu.log" 2>&1 &
step gpu_tests 40 python3 -m pytest -q $(xdist_flag 5) -m gpu -p no:cacheprovider --tb=short \
  tests/test_fp8_quant_kernel.py -k "test_v3_fwht_transpose_bitwise"
wait
[[ -f /tmp/quant256_ncu.ncu-rep ]] && ncu --import /tmp/quant256_ncu.ncu-rep --page raw --csv > "$out/ncu_raw.csv" 2>/dev/null
pipes=def,deft ab=(--ab def:deft)
if ! grep -qE "^5 passed" "$out/gpu_tests.log" || grep -qE "failed|error" "$out/gpu_tests.log"; then
  pipes=def ab=(); echo "fwht_transpose's GPU tests did not pass: deft left out of the timing"
  step_failed gpu_tests "not 5 passed; deft left out"
fi
step bandwidth 25 python3 scripts/fp8_quant_bandwidth.py --pipelines "$pipes" --recipes default \
  --rounds 5 --breakdown "${ab[@]}" --json "$out/quant_bw.json"
echo
stop_clocks; cat "$out/commit.txt" "$out/gpu.txt"
grep -E "precompile:|FAILED" "$out/precompile.log" | head -6
echo "-- gpu_tests"; grep -E "^FAILED|passed|failed|error" "$out/gpu_tests.log" | tail -8
grep -E "RACECHECK SUMMARY|CALLS|DIFF|^rc=" "$out/sanitize.log"
bandwidth_summary "$out/bandwidth.log"
if [[ -f $out/ncu_raw.csv ]]; then
  echo "== ncu (D 256, def then deft: V + K sums, K, Q each)"; python3 scripts/ncu_stalls.py "$out/ncu_raw.csv"
fi
steps_exit
