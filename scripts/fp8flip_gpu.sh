#!/usr/bin/env bash
# fp8flip_gpu.sh: issue 10, the session-5 fa3-fp8 defaults on one H200 (<= 4 min): skip_unit_rescale on at every
# head_dim, promote_every 4 at head_dim 64 (kernel and default recipe, so the emulation follows), and the new switch
# descale_prefetch (off).
#   1. precompile (14 workers, into the disk cache): the A/B's kernels and those of the tests below
#   2. gpu_tests: tests/test_fa3_fp8_gpu.py, the default recipe (new defaults; D 64/128/256, causal and not, tails,
#      Nq != Nk, GQA and MQA) and every recipe at D 64 (its promotion interval), kernel vs emulation and vs float64;
#      per-case figures in test_stats.jsonl
#   3. variant_tests: tests/test_fa3_fp8_speed_gpu.py for descale_prefetch (D 64/128/256) and D 64's old default
#      (promote_every 1), each vs the emulation told its interval (tails, Nq > Nk, GQA/MQA, causal and not);
#      tests/test_fa3_fp8_kernel.py's kernel vs its float64 model with the new D 64 default (descales not powers of
#      two there) and its empty-row cases
#   4. speed_ab: scripts/fa3_fp8_speed_ab.py --set fp8flip: new vs old defaults vs prefetch vs single accumulator(s)
#      beside our bf16 fa3 and flash-attn-4, D 64/128/256, N 4k/16k, causal and not, 8 rotated rounds; every
#      variant's accuracy; summary at the end
#
#   source .gpu/env.sh && scripts/fp8flip_gpu.sh        (repository root; writes $OUT/fp8flip.tar.gz + summary)
# Pass: "== precompile: rc=0", "== gpu_tests: rc=0", "== variant_tests: rc=0" (no FAILED lines) and every "PASS"
# line of the summary, in particular "new defaults >= 0.97x old in every problem"; the speed tables, the prefetch
# "candidates" and the "targets" lines are reported, not pass criteria.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}"; work="$out/fp8flip"; gpu_session "$work" "$@"
step precompile 55 python3 scripts/fa3_fp8_speed_ab.py --set fp8flip --phase precompile --jobs 14 --out "$work/ab"
rm -f "$work/test_stats.jsonl"
step gpu_tests 60 env FA_VARIANTS_FP8_STATS="$work/test_stats.jsonl" python3 -m pytest -q -m gpu tests/test_fa3_fp8_gpu.py \
  -k "default_recipe or (every_recipe and 64)" -p no:cacheprovider
step variant_tests 55 python3 -m pytest -q -m gpu tests/test_fa3_fp8_speed_gpu.py tests/test_fa3_fp8_kernel.py \
  -k "d64-old or prefetch or (kernel_vs_model and 64) or empty_rows" -p no:cacheprovider
step speed_ab 60 python3 scripts/fa3_fp8_speed_ab.py --set fp8flip --phase measure --rounds 8 --out "$work/ab"
pack_logs "$out/fp8flip.tar.gz" && rm -rf "$work"
echo; tar -xzOf "$out/fp8flip.tar.gz" fp8flip/precompile.log | grep -E "precompile:|FAILED" | head -8
for t in gpu_tests variant_tests; do
  echo "-- $t"; tar -xzOf "$out/fp8flip.tar.gz" "fp8flip/$t.log" | grep -E "^FAILED|passed|failed|error" | tail -6
done
tar -xzOf "$out/fp8flip.tar.gz" fp8flip/ab/summary.md 2>/dev/null || { echo "(no summary.md)"; tar -xzOf "$out/fp8flip.tar.gz" fp8flip/speed_ab.log | tail -20; }
steps_exit
