#!/usr/bin/env bash
# fp8speed_gpu.sh: issue 10's speed switches of fa3-fp8 on one H200 (~3-4 min), every switch off by default:
#   early_pv_arrive (D 128/256: the ping-pong turn handed on right after the P V GEMM's issue), skip_unit_rescale
#   (fa3-fp8: O *= alpha skipped when no row max of the thread moved), promote_every 4 (D 64). (exp2_emu, timed here
#   in session 4, was removed in session 10.)
#   1. precompile (parallel workers, into the disk cache): the A/B's kernels and those of the tests below
#   2. tests/test_fa3_fp8_speed_gpu.py (every variant vs the emulation; bf16 fa3 with the shared
#      switches vs float64) and tests/test_fa3_fp8_gpu.py -k default_recipe (the defaults, unchanged)
#   3. scripts/fa3_fp8_speed_ab.py --set fp8speed --phase measure: the variants beside the default, the single
#      accumulator, our bf16 fa3 and flash-attn-4; D 64/128/256, N 4k/16k, causal and
#      not, 6 rotated rounds; every variant's accuracy vs the emulation; summary (best variant per problem, the
#      issue's targets with it, candidates for a default flip)
#
#   source .gpu/env.sh; scripts/fp8speed_gpu.sh        (repository root; writes $OUT/fp8speed.tar.gz + summary)
# Pass: "== precompile: rc=0", "== gpu_tests: rc=0" and the "PASS" lines of the summary; the speed tables and
# "targets" lines are the A/B (reported, not pass criteria).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}"; gpu_session "$out/fp8speed" "$@"
step precompile 95 python3 scripts/fa3_fp8_speed_ab.py --set fp8speed --phase precompile --jobs 14 --out "$LOGS/ab"
step gpu_tests 80 python3 -m pytest -q -m gpu tests/test_fa3_fp8_speed_gpu.py "tests/test_fa3_fp8_gpu.py::test_default_recipe" -p no:cacheprovider
step speed_ab 65 python3 scripts/fa3_fp8_speed_ab.py --set fp8speed --phase measure --out "$LOGS/ab"
pack_logs "$out/fp8speed.tar.gz" && rm -rf "$LOGS"
echo; tar -xzOf "$out/fp8speed.tar.gz" fp8speed/precompile.log | grep -E "precompile:|FAILED" | head -8
tar -xzOf "$out/fp8speed.tar.gz" fp8speed/gpu_tests.log | grep -E "^FAILED|passed|failed" | tail -8
tar -xzOf "$out/fp8speed.tar.gz" fp8speed/ab/summary.md 2>/dev/null || { echo "(no summary.md)"; tar -xzOf "$out/fp8speed.tar.gz" fp8speed/speed_ab.log | tail -20; }
steps_exit
