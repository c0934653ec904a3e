#!/usr/bin/env bash
# fp8two_gpu.sh: issue 10, session 8, fa3-fp8 two-level cost at head_dim 256 on one H200 (<= 140 s on a cold machine;
# step limits 45 + 40 + 55 s): scripts/fa3_fp8_speed_ab.py --set fp8two --head-dims 256.
# New switch Fp8Config.fused_promote (off): O kept in units of the last visited tile's v_descale, so O *= alpha folds
# into the promotion, O = fma(alpha v_descale[n+1] / v_descale[n], O, tmp): one FFMA per element and tile, no FMUL
# block. SASS (CPU): the default runs that 128-FMUL block on every tile where a row max of any of a warp's 16 rows
# moved (~67% of the tiles at N 4k, ~32% at 16k for iid scores); main loop 737 instructions a warp and tile with the
# block, 609 without, fused 618, single_overlap 574 (same FP32 work; 20 more QGMMA issues + descriptor adds remain).
#   new             the default (two-level, 128 x 128, four P V slices, s_lookahead + s_halves, skip_unit_rescale)
#   fused           new + fused_promote
#   fused_c2        fused + reduce_chains 2 (row max / row sum chains 33 / 31 -> 18 / 16 deep, same instructions)
#   single_overlap  one running accumulator with intra-warpgroup overlap (the two-level cost's reference)
# Steps:
#   1. precompile (14 workers, into the disk cache): 12 kernels (4 variants and bf16 fa3 in both causal modes, the
#      quantisation pass)
#   2. variant_tests: tests/test_fa3_fp8_speed_gpu.py -k fp8two (-n 7): 14 tests, fused and fused_c2 vs the emulation
#      (rel-L2 <= 6e-3, LSE <= 1.5e-3) and float64: seqlen 113 / 1023 tails, Nq != Nk, GQA/MQA, batch 2, causal and not,
#      NaN-poisoned outputs; fused on V blocks spanning 2^-8..2^8 with an all-zero block (descale 2^-110 when this ran;
#      1 since session 9, and a block of tiny values ~2^-120 now has the floor 2^-110: O / v_descale ~ 2^110 |O|)
#   3. speed_ab: D 256 x N 4k/16k x causal and not (B*N = 16k, H*D = 2048), 6 rotated rounds, beside our bf16 fa3
#      (flash-attn-4 left out: it compiles at its first call); accuracy of every variant (N(0,1), N 1024); summary.
#      A variant with a FAILED/ERROR line in steps 1-2 is left out (--drop-failed), and fused / fused_c2 also when
#      the tests were cut by their limit (no pytest summary line)
#
#   source .gpu/env.sh && scripts/fp8two_gpu.sh      (repository root; writes $OUT/fp8two.tar.gz + summary)
# Pass: "precompile: 12 jobs ... 0 failed"; variant_tests "14 passed" with no FAILED/ERROR line; no "left out" line; the
# summary's accuracy lines PASS for every variant.
# Predicted (bench/NOTES.md, "Session 8 (2026-12-01): fa3-fp8 two-level cost at head_dim 256"): fused / new 1.02-1.07 at
# N 4k (causal and not), 1.00-1.04 at 16k; TFLOP/s new ~958 / 912 / 1100 / 1050, fused ~1000 / 950 / 1120 / 1070,
# single_overlap ~1084 / 1014 / 1282 / 1223 (N 4k / 4k causal / 16k / 16k causal); fused_c2 / fused 0.99-1.03; two-level
# cost (single_overlap / best two-level - 1) 6-11%: issue 10's <= 5% NOT met; 1100 TFLOP/s at N 16k met by new and fused.
# Flip rule: of fused / fused_c2 listed under "candidates for a default flip" (>= 1.03x new in every non-causal problem,
# >= 0.97x in every problem) with their tests passing, the one with the higher geometric mean over the four problems:
# DEFAULT_SWITCHES[256] gets fused_promote=True (+ reduce_chains=2 for fused_c2; skip_unit_rescale then unused).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}"; work="$out/fp8two"; gpu_session "$work" "$@"
AB=(python3 scripts/fa3_fp8_speed_ab.py --set fp8two --head-dims 256 --no-flash-attn --out "$work/ab")
step precompile 45 "${AB[@]}" --phase precompile --jobs 14
NPROC=$(xdist_flag 7)
step variant_tests 40 python3 -m pytest -q $NPROC -m gpu tests/test_fa3_fp8_speed_gpu.py -k fp8two \
  -p no:cacheprovider --tb=line -rfE
CUT=()  # no pytest summary line: the tests were cut by the limit (a hang?); fused* is the new kernel code
grep -qE "[0-9]+ (passed|failed)" "$work/variant_tests.log" 2>/dev/null || CUT=(--drop fused fused_c2)
step speed_ab 55 "${AB[@]}" --phase measure --rounds 6 --err-seqlen 1024 ${CUT[@]+"${CUT[@]}"} \
  --drop-failed "$work/precompile.log" "$work/variant_tests.log"
pack_logs "$out/fp8two.tar.gz" && rm -rf "$work"
echo; tar -xzOf "$out/fp8two.tar.gz" fp8two/precompile.log | grep -E "precompile:|FAILED" | head -8
echo "-- variant_tests"
tar -xzOf "$out/fp8two.tar.gz" fp8two/variant_tests.log | grep -E "^(FAILED|ERROR)|passed|failed|error" | tail -10
tar -xzOf "$out/fp8two.tar.gz" fp8two/speed_ab.log | grep -E "^left out" || echo "(no variant left out)"
[[ ${#CUT[@]} -gt 0 ]] && echo "left out (variant_tests cut by its limit): ${CUT[*]:1}"
tar -xzOf "$out/fp8two.tar.gz" fp8two/ab/summary.md 2>/dev/null || {
  echo "(no summary.md)"; tar -xzOf "$out/fp8two.tar.gz" fp8two/speed_ab.log | tail -20; }
steps_exit
