#!/usr/bin/env bash
# fa3gap8_gpu.sh: issue 12, session 8, on one H200: O's rescale under the exponentials (Sm90Config.alpha_first, off by
# default: every row's alpha computed right after the row maxima, so ptxas interleaves O *= alpha with the MUFU work as
# flash-attn-4's SASS does, instead of leaving 32 (D 128) / 64 (D 128 causal) FMULs after the last exponential, on the
# way to the next ping-pong turn). Same values as the default. <= 130 s on a cold machine (limits 50 + 35 + 45: session 8 saw 25 s limits cut a cold pytest step).
#
#   source .gpu/env.sh; scripts/fa3gap8_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/fa3_speed_ab.py --precompile, 16 processes at once into the disk caches: old / new / alpha (D 64, 128) /
#    alpha-noskip (D 64: alpha_first without the unit-alpha skip) at the four timed shapes, flash-attn-4's kernels of
#    those shapes (its own disk cache), and the test-only kernels (alpha / alpha-noskip causal at D 64, alpha fp16).
# 1. GPU tests vs float64 (tests/test_fa3_gpu.py -k "alpha_variants or alpha_first"): alpha at D 64/128 and
#    alpha-noskip at D 64, causal and not, one K/V tile and many, odd lengths, Nq != Nk both ways (rows that see no
#    key), GQA and MQA, fp16 once, NaN-poisoned outputs, LSE checked, EC-04's huge logit shifts (the exact form's
#    branch, which alpha now precedes); and alpha_first's O and LSE equal to the default's bit for bit at D 128.
# 2. scripts/fa3_speed_ab.py (unless a test failed): old, new, alpha (+ alpha-noskip at D 64) beside flash-attn-4,
#    bf16, B*N = 16k, H*D = 2048, shapes in this order: D 128 N 4k, D 128 N 4k causal, D 128 N 16k, D 64 N 4k; the
#    paired protocol, 6 rounds of 4 cycles of 10 ms bursts; the time limit may cut the last shape (the SUMMARY of the
#    shapes done is still printed). Limits 40 + 14 + 21 s: a cold precompile took ~36 s in session 7.
# Pass: (0) "precompiled" lines, no Traceback. (1) 0 failed / 0 errors, and every test ran (rc 124 with no FAILED:
# cut by its limit, not a pass). (2) no "errors:", each alpha row's max diff vs old like new's (same values as new).
# Prediction (bench/NOTES.md, "Session 8 (2026-12-01): fa3 vs flash-attn-4 consumer loop"): alpha/new 1.01-1.03 at
# D 128 N 4k and 16k, 1.01-1.04 at D 128 N 4k causal; D 64 alpha/new 0.99-1.01, alpha-noskip/new 0.98-1.02;
# alpha/flash-attn-4 0.95-0.97 at D 128 (from new/fa4 0.93-0.94). Flip rule: alpha_first on at D 128 (causal and not)
# if alpha/new is "faster" at both non-causal D 128 shapes and not "slower" at D 128 causal; at D 64 only if alpha or
# alpha-noskip is "faster" there (alpha-noskip also turns the skip off).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/fa3gap8}"; gpu_session "$out/logs" "$@"
AB="--variants old,new,alpha,alpha-noskip --shapes 128:4096:full,128:4096:causal,128:16384:full,64:4096:full"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
# 10 bf16 + 3 flash-attn-4 + 2 causal D 64 + 1 fp16 kernels, all pools at once (16 processes on 16 cores)
step precompile 50 bash -c "python3 scripts/fa3_speed_ab.py --precompile 13 --precompile-fa4 $AB & a=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 2 --variants alpha,alpha-noskip --shapes 64:4096:causal & b=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 1 --dtype fp16 --variants alpha --shapes 128:4096:full & c=\$!; \
  trap 'kill -INT \$a \$b \$c' INT; wait"
NPROC=$(xdist_flag 8)
step pytest 35 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_fa3_gpu.py \
  -k "alpha_variants or alpha_first"
# the A/B runs unless a test failed (a pytest cut by its limit with none failed still leads to it: the A/B checks
# each variant against old itself, and its own limit bounds a hang)
if grep -qE "^(FAILED|ERROR)|[0-9]+ (failed|errors?)\b" "$LOGS/pytest.log"; then
  echo "== fa3ab: skipped (a GPU test failed)"
else
  step fa3ab 45 python3 scripts/fa3_speed_ab.py $AB --burst-ms 10 --peers flash-attn-4 --out "$out/fa3ab"
fi
echo "== precompile"; grep -E "^precompiled|Error|Traceback" "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 15
if [[ -f "$out/logs/fa3ab.log" ]]; then
  echo "== fa3ab"; grep -E "errors:|Traceback|Error|INTERRUPTED" "$out/logs/fa3ab.log" | head -n 5
  grep "^SUMMARY" "$out/logs/fa3ab.log"
fi
steps_exit
