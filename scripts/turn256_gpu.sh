#!/usr/bin/env bash
# turn256_gpu.sh: session 12, fa3-fp8 head_dim 256 with the last P V slice promoted outside the ping-pong turn
# (Fp8Config.o_slice_smem, off by default; one H200, <= 100 s cold; bench/NOTES.md "Session 12 (2026-12-02): fa3-fp8
# head_dim 256, the last slice's promotion out of the turn; predictions before the run").
# Why: ncu (session 12 call A, D 256 N 16k, default "new" vs single_overlap_noskip) put new's 7 % in the turn (BAR.SYNC ..
# BAR.ARV +25.6 % of noskip's warp time, outside it -18.8 %), its waits only +2.2: the promotion FFMAs (dispatch stalls)
# and the slowest warp at the S half's WARPGROUP.ARRIVE. o_slice_smem keeps O's last 64-column slice in shared memory
# (32 KB, each thread's own words), so its 32 registers hold a third temporary: the last slice is issued into it, the one
# before it promoted, both S halves issued back to back and the turn handed on; the last slice is then waited for and
# promoted into shared memory (8 LDS.128, 32 FFMA, 8 STS.128) while S runs. SASS (CPU, D 256 non-causal, plain copy of
# the loop): turn FFMAs 128 -> 96, in-turn slice waits 4 -> 3; 56 bytes spilled (causal 88: loop-carried scalars and
# the turn's barrier ids, ~6 local accesses a tile on the common path; the default has none).
# scripts/fa3_fp8_speed_ab.py --set turn256 --head-dims 256 --no-flash-attn (new, osm, single_overlap_noskip, bf16_fa3),
# --protocol paired (CUDA-graph bursts ABC CBA rotated per round, A/A control of new, per-entry SM clock and power).
# Steps:
#   1. osm_tests (background; compiles its own kernel while the precompile runs): tests/test_fa3_fp8_speed_gpu.py -k
#      "turn256" (8 tests): osm vs the emulation (rel-L2 <= 6e-3, LSE <= 1.5e-3) and float64, causal and not, seqlen
#      113 / 1023 tails, Nq > Nk (rows that see no key), GQA / MQA, batch 2, NaN-poisoned outputs; and V blocks spanning
#      2^-8 .. 2^8 with an all-zero and a tiny block (the turn's rare copy), causal and not
#   2. precompile (10 workers, disk cache): the 3 variants and bf16 fa3 in both causal modes, the quantisation pass
#   3. speed_ab: D 256 non-causal, N 4k / 16k / 8k (B*N 16k, H*D 2048), 6 paired rounds; then every variant vs the
#      emulation and float64 (N 1024, non-causal): the summary's accuracy lines
#   4. speed_causal, if >= 20 s of the 95 are left: D 256 causal N 16k, the same protocol
#
#   source .gpu/env.sh && scripts/turn256_gpu.sh      (repository root; writes $OUT/turn256.tar.gz + summary)
# Pass: "precompile: ... 0 failed"; osm_tests "8 passed"; the summary's accuracy lines PASS (osm among the variants);
# every "osm/new" ratio line printed.
# Flip rule: pass, and osm/new (paired ratio, new time / osm time) >= 1.03 at N 16k non-causal and >= 1.00 at every
# other N and the causal problem -> DEFAULT_SWITCHES[256] gains o_slice_smem=True (fa_variants/hopper/fa3_fp8.py).
# Prediction: osm/new 1.02-1.05 at N 4k / 8k / 16k non-causal (the turn's last link, ~100-115 cycles of a turn of
# ~400, leaves it; the spills and the 64 KB of shared-memory traffic a CTA tile pay some back), 1.01-1.04 causal
# 16k; single_overlap_noskip/osm 1.01-1.04 (issue 10's <= 5 % met at N 16k if <= 1.05); TFLOP/s osm ~1040 / 1090 /
# 1110 (N 4k / 8k / 16k, under the power cap seen in session 11), new ~1010 / 1050 / 1075, bf16 fa3 ~720 / 750 / 750.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}"; work="$out/turn256"; gpu_session "$work" "$@"
AB=(python3 scripts/fa3_fp8_speed_ab.py --set turn256 --head-dims 256 --no-flash-attn)
MEASURE=(--phase measure --protocol paired --rounds 6 --drop-failed "$work/precompile.log" "$work/osm_tests.log")
step osm_tests 60 python3 -m pytest -q -m gpu tests/test_fa3_fp8_speed_gpu.py -p no:cacheprovider --tb=line -rfE \
  -k "turn256" &
step precompile 50 "${AB[@]}" --causal both --phase precompile --jobs 10 --out "$work/ab"
wait
left=$((94 - SECONDS)); lim=$((left > 45 ? 45 : left)); ((lim < 10)) && lim=10
step speed_ab "$lim" "${AB[@]}" "${MEASURE[@]}" --causal no --seqlens 16384 4096 8192 --err-seqlen 1024 --out "$work/ab"
left=$((94 - SECONDS))
if ((left >= 20)); then
  step speed_causal "$((left - 2))" "${AB[@]}" "${MEASURE[@]}" --causal yes --seqlens 16384 --no-errors \
    --out "$work/ab_causal"
else echo "== speed_causal: skipped ($left s left)"; fi
pack_logs "$out/turn256.tar.gz" && rm -rf "$work"
log() { tar -xzOf "$out/turn256.tar.gz" "turn256/$1" 2>/dev/null; }
echo; log precompile.log | grep -E "precompile:|FAILED" | head -6
echo "-- osm_tests"; log osm_tests.log | grep -E "^(FAILED|ERROR)|passed|failed|error" | tail -8
log osm_tests.log | grep -qE "^8 passed" || step_failed osm_tests "not 8 passed"
for s in speed_ab speed_causal; do
  echo "-- $s"; log "$s.log" | grep -E "^left out|^d256 N|A/A|/new:|^ +(new|osm|single|bf16|AA)[a-z_]*: .* MHz|FAILED"
done
echo "-- summary"; log ab/summary.md | grep -E "^\| [0-9]|PASS|FAIL|two-level cost|^- d256" || echo "(no summary.md)"
steps_exit
