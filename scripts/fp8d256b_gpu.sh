#!/usr/bin/env bash
# fp8d256b_gpu.sh: issue 10, session 7, fa3-fp8 at head_dim 256 on one H200 (<= 100 s with precompile): what the S GEMM
# as two 64-key MMAs (the default's s_halves) costs. Read in the SASS (CPU): per K/V tile a consumer warp of the default
# runs 737 instructions (32 QGMMA n=64, 194 FFMA: 128 of them the promotion, 11 WARPGROUP, no spills) against 574 for
# the single accumulator with overlap (12 QGMMA n=128/256); no serialised WGMMAs in either. Hypothesis: the 64-key S
# halves are bound by shared-memory operand reads (Q and a K half, 4 KB per 32-cycle k32 step = 128 B/clk, the SM's
# shared-memory width, beside the TMA's K/V writes; one 128-key MMA needs 96 B/clk), so S runs slower than the tensor
# rate and that, more than the 128 FFMAs, is the default's 13-16% two-level cost. New: s_halves without the lookahead
# (off by default; any schedule), so the same schedule runs with S in one MMA and in two halves.
#   1. precompile (16 workers, into the disk cache): every timed kernel, both causal modes
#   2. gpu_tests: tests/test_fa3_fp8_lookahead_gpu.py -k halves: old_halves and single_overlap_halves vs the emulation
#      (tests/helpers.assert_fp8_matches_emulation: rel-L2 <= 6e-3, LSE <= 1.5e-3) and vs float64; one tile, two
#      tiles, tails, Nq != Nk, GQA/MQA, causal and not, NaN-poisoned outputs
#   3. speed_ab: fa3_fp8_speed_ab.py --set fp8d256b (6 rotated rounds): D 256, N 4k/16k, causal and not: new (default),
#      old (serial two-level, S whole), old_halves, single (serial, one accumulator), single_overlap,
#      single_overlap_halves, beside our bf16 fa3 and flash-attn-4; every variant's accuracy (N 1024); summary with the
#      halves cost per problem, the promotions' cost in the serial steps (single / old) and the verdict
#
#   source .gpu/env.sh && scripts/fp8d256b_gpu.sh        (repository root; writes $OUT/fp8d256b.tar.gz + summary)
# Pass: "== precompile: rc=0", "== gpu_tests: rc=0" (16 passed, 0 failed) and the summary's three accuracy "PASS" lines.
# Prediction (bench/NOTES.md, session 7): halves cost (one MMA / two halves - 1) +8..+14% for single_overlap and
# +5..+12% for old, mean >= 6%: "hypothesis SUPPORTED" in the summary; REJECTED (mean < 6%) means the cost is the
# promotion's issue slots and in-turn waits instead. single / old (slicing + promotions, serial steps): +5..+21% as in
# session 5. Nothing here is a flip candidate (diagnostic variants).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}"; work="$out/fp8d256b"; gpu_session "$work" "$@"
ab=(python3 scripts/fa3_fp8_speed_ab.py --set fp8d256b --head-dims 256 --out "$work/ab")
step precompile 30 "${ab[@]}" --phase precompile --jobs 16
step gpu_tests 38 python3 -m pytest -q -m gpu tests/test_fa3_fp8_lookahead_gpu.py -k halves -p no:cacheprovider
step speed_ab 26 "${ab[@]}" --phase measure --rounds 6 --err-seqlen 1024
pack_logs "$out/fp8d256b.tar.gz" && rm -rf "$work"
echo; tar -xzOf "$out/fp8d256b.tar.gz" fp8d256b/precompile.log | grep -E "precompile:|FAILED" | head -8
echo "-- gpu_tests"; tar -xzOf "$out/fp8d256b.tar.gz" fp8d256b/gpu_tests.log | grep -E "^FAILED|passed|failed|error" | tail -8
tar -xzOf "$out/fp8d256b.tar.gz" fp8d256b/ab/summary.md 2>/dev/null || { echo "(no summary.md)"; tar -xzOf "$out/fp8d256b.tar.gz" fp8d256b/speed_ab.log | tail -20; }
steps_exit
