#!/usr/bin/env bash
# fp8two2_gpu.sh: issue 10, session 9 round 2, fa3-fp8 two-level cost at head_dim 256, the ping-pong turn, on one H200
# (<= 120 s on a cold machine: step limits 45 + 75 + 38 s; session 10: the tests ran past 37 s): scripts/fa3_fp8_speed_ab.py --set fp8turn --head-dims 256.
# SASS (CPU) per consumer warp and K/V tile: the default's turn (BAR.SYNC .. BAR.ARV) holds the four P V slices with
# three waits (DEPBAR 1) and 3 x 32 promotion FFMAs, S half 0, the last slice's wait and promotion, S half 1; single_overlap's
# turn only issues its 12 QGMMAs (S, then P V of the tile before) and hands the turn on. Both 618 / 574 instructions.
#   new               the default (two-level, four P V slices, s_lookahead + s_halves, fused_promote, reduce_chains 2)
#   early             new + Fp8Config.s_early_arrive (new, off): the turn handed on right after S half 0's issue; the last
#                     slice's wait, its promotion and S half 1's issue run outside the turn (same instructions and roundings)
#   nopp              new with pingpong=False (the lookahead now accepts it): no turn, both warpgroups issue when ready
#   single_overlap    one running accumulator with intra-warpgroup overlap, reduce_chains 1 (session 8's reference)
#   single_overlap_c2 the same with reduce_chains 2 (the default's chains: the fair reference)
# Steps:
#   1. precompile (14 workers, into the disk cache): 14 jobs (5 variants and bf16 fa3 in both causal modes, the
#      quantisation pass)
#   2. variant_tests: tests/test_fa3_fp8_speed_gpu.py -k fp8turn (-n 7): 12 tests, early and nopp vs the emulation
#      (rel-L2 <= 6e-3, LSE <= 1.5e-3) and float64: seqlen 113 / 1023 tails, Nq != Nk, GQA/MQA, batch 2, causal and not,
#      NaN-poisoned outputs
#   3. speed_ab: D 256 x N 4k/16k x causal and not (B*N = 16k, H*D = 2048), 6 rotated rounds, beside our bf16 fa3
#      (flash-attn-4 left out: it compiles at its first call); accuracy of every variant (N(0,1), N 1024); summary with
#      the two-level cost of new / early / nopp against single_overlap_c2 and single_overlap. A variant with a
#      FAILED/ERROR line in steps 1-2 is left out (--drop-failed), early and nopp also when the tests were cut by their
#      limit (no pytest summary line)
#
#   source .gpu/env.sh && scripts/fp8two2_gpu.sh      (repository root; writes $OUT/fp8two2.tar.gz + summary)
# Pass: "precompile: 14 jobs ... 0 failed"; variant_tests "12 passed" with no FAILED/ERROR line; no "left out" line; the
# summary's accuracy lines PASS for every variant.
# Predicted (bench/NOTES.md, "Session 9 (2026-12-01): fa3-fp8 two-level cost at head_dim 256, round 2"): early / new
# 0.99-1.04 (N 4k / 16k, causal and not); nopp / new 0.88-1.02; single_overlap_c2 / single_overlap 0.99-1.04; new as
# this session's fused_c2 within its spread (~1118 / 947 / 1094 / 1013 TFLOP/s); two-level cost against the best single
# (either chain count) 4-12 %: issue 10's <= 5 % NOT met at N 16k unless early or nopp gains >= 5 % there.
# Flip rule: of early / nopp listed under "candidates for a default flip" (>= 1.03x new in every non-causal problem,
# >= 0.97x in every problem) with their tests passing, the one with the higher geometric mean over the four problems:
# DEFAULT_SWITCHES[256] gets s_early_arrive=True (early), or _default's head_dim 256 Fp8Config pingpong=False (nopp).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}"; work="$out/fp8two2"; gpu_session "$work" "$@"
AB=(python3 scripts/fa3_fp8_speed_ab.py --set fp8turn --head-dims 256 --no-flash-attn --out "$work/ab")
step precompile 45 "${AB[@]}" --phase precompile --jobs 14
NPROC=$(xdist_flag 7)
step variant_tests 75 python3 -m pytest -q $NPROC -m gpu tests/test_fa3_fp8_speed_gpu.py -k fp8turn \
  -p no:cacheprovider --tb=line -rfE
CUT=()  # no pytest summary line: the tests were cut by the limit (a hang?); early / nopp are the new schedules
grep -qE "[0-9]+ (passed|failed)" "$work/variant_tests.log" 2>/dev/null || CUT=(--drop early nopp)
step speed_ab 38 "${AB[@]}" --phase measure --rounds 6 --err-seqlen 1024 ${CUT[@]+"${CUT[@]}"} \
  --drop-failed "$work/precompile.log" "$work/variant_tests.log"
pack_logs "$out/fp8two2.tar.gz" && rm -rf "$work"
echo; tar -xzOf "$out/fp8two2.tar.gz" fp8two2/precompile.log | grep -E "precompile:|FAILED" | head -8
echo "-- variant_tests"
tar -xzOf "$out/fp8two2.tar.gz" fp8two2/variant_tests.log | grep -E "^(FAILED|ERROR)|passed|failed|error" | tail -10
tar -xzOf "$out/fp8two2.tar.gz" fp8two2/speed_ab.log | grep -E "^left out" || echo "(no variant left out)"
[[ ${#CUT[@]} -gt 0 ]] && echo "left out (variant_tests cut by its limit): ${CUT[*]:1}"
tar -xzOf "$out/fp8two2.tar.gz" fp8two2/ab/summary.md 2>/dev/null || {
  echo "(no summary.md)"; tar -xzOf "$out/fp8two2.tar.gz" fp8two2/speed_ab.log | tail -20; }
