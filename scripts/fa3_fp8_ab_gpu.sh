#!/usr/bin/env bash
# fa3_fp8_ab_gpu.sh: issue 10 on one H200 (~3-4 min): the fa3-fp8 defaults taken from layout.KERNEL_TILES.
#   1. precompile (parallel workers, into the disk cache): every kernel of steps 2 and 3
#   2. tests/test_fa3_fp8_gpu.py (kernel vs emulation with its block-FP model, vs float64; per-case figures in
#      test_stats.jsonl through FA_VARIANTS_FP8_STATS)
#   3. scripts/fa3_fp8_speed_ab.py --phase measure: new vs old defaults vs single accumulator vs our bf16 fa3 vs
#      flash-attn-4, D 64/128/256, N 4k/16k, causal and not, 6 rotated rounds; accuracy of the new defaults;
#      summary with the issue's targets and the pass criteria (it reads test_stats.jsonl)
#
#   source .gpu/env.sh; scripts/fa3_fp8_ab_gpu.sh        (repository root; writes $OUT/fp8_ab.tar.gz + summary)
# Pass: "== gpu_tests: rc=0" and every "PASS" line of the summary (the "targets" lines are reported, not pass).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}"; gpu_session "$out/fp8_ab" "$@"
step precompile 100 python3 scripts/fa3_fp8_speed_ab.py --phase precompile --jobs 14 --out "$LOGS/ab"
rm -f "$LOGS/test_stats.jsonl"
step gpu_tests 80 env FA_VARIANTS_FP8_STATS="$LOGS/test_stats.jsonl" python3 -m pytest -q -m gpu tests/test_fa3_fp8_gpu.py -p no:cacheprovider
step speed_ab 90 python3 scripts/fa3_fp8_speed_ab.py --phase measure --out "$LOGS/ab" --test-stats "$LOGS/test_stats.jsonl"
pack_logs "$out/fp8_ab.tar.gz" && rm -rf "$LOGS"
echo; tar -xzOf "$out/fp8_ab.tar.gz" fp8_ab/precompile.log | grep -E "precompile:|FAILED" | head -8
tar -xzOf "$out/fp8_ab.tar.gz" fp8_ab/gpu_tests.log | grep -E "^FAILED|passed|failed" | tail -6
tar -xzOf "$out/fp8_ab.tar.gz" fp8_ab/ab/summary.md 2>/dev/null || { echo "(no summary.md)"; tar -xzOf "$out/fp8_ab.tar.gz" fp8_ab/speed_ab.log | tail -20; }
steps_exit
