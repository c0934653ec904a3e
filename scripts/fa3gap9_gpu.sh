#!/usr/bin/env bash
# fa3gap9_gpu.sh: issue 12, session 8, on one H200: fa3 vs flash-attn-4 at head_dim 64 and 256 (bench/NOTES.md,
# "Session 8 (2026-12-01): fa3 vs flash-attn-4 at head_dim 64 and 256"). D 64: Sm90Config.rescale_first (off by
# default; variant `early` = alpha_first + rescale_first): the P V wait and O's rescale, in its unit-alpha skip branch,
# run between the alphas and the exponentials, so P's 32 F2FP follow the exponentials under the MUFU instead of
# trailing the last one behind the skip branch (SASS: 88 instructions after the last MUFU.EX2 -> 13; flash-attn-4 7);
# same values as the default. D 256: flash-attn-4's choices, never timed with the paired protocol: `pairs-256` (P
# converted in pairs: 60 -> 20 conversion instructions, the P V GEMM one WGMMA group instead of 5), `fa4-256` (+ the
# one-FFMA exponent, 4 chains, O rescaled before the P V GEMM) and `alpha-256` (pairs + FFMA exponent + 4 chains, O
# rescaled under the exponentials: alpha_first, D 128's structure); basis-256 is left out (16 kernels fit one round of
# compiles on 16 cores). <= 150 s on a cold machine (limits 55 + 40 + 55: fa3gap8 cold took 27 + 25 + 32 s for 4 shapes; this A/B has 5).
#
#   source .gpu/env.sh; scripts/fa3gap9_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/fa3_speed_ab.py --precompile, 17 processes at once into the disk caches: old / new / early at D 64 (N 4k
#    full and causal) and new / pairs-256 / fa4-256 / alpha-256 at D 256 (11 kernels, old = new at D 256), flash-attn-4's
#    kernels of the timed shapes (3, its own disk cache), and the tests' causal D 256 kernels (3).
# 1. GPU tests vs float64 (tests/test_fa3_gpu.py -k "gap9_variants or rescale_first_same_values"): the five variants
#    causal and not, one K/V tile and many, odd lengths, Nq != Nk both ways, GQA and MQA, NaN-poisoned outputs, LSE,
#    EC-04's huge logit shifts; and `early`'s O and LSE equal to the default's bit for bit at D 64 (10 tests).
# 2. scripts/fa3_speed_ab.py (unless a test failed): old, new, early (D 64) / pairs-256, fa4-256, alpha-256 (D 256)
#    beside flash-attn-4, bf16, B*N = 16k, H*D = 2048, shapes in this order: D 64 N 4k, D 256 N 4k, D 64 N 16k,
#    D 256 N 16k, D 64 N 4k causal; the paired protocol, 6 rounds of 4 cycles of 10 ms bursts; the time limit may cut
#    the last shapes (the SUMMARY of the shapes done is still printed).
# Pass: (0) "precompiled" lines, no Traceback. (1) 0 failed / 0 errors, and every test ran (rc 124 with no FAILED:
# cut by its limit, not a pass). (2) no "errors:"; early's max diff vs old like new's (same values as new).
# Prediction (NOTES): early/new 1.00-1.02 at D 64 N 4k / 16k and N 4k causal (session 8's alpha-noskip, tail removed but
# 27 instructions more per tile, measured 1.004: the tail alone is worth little there; D 64 is bound by the MUFU, 66
# EX2 per 64 x 128 tile, ~ the tensor time); early/flash-attn-4 0.93-0.95 (new 0.927). D 256: pairs-256/new 1.01-1.04,
# alpha-256/new and fa4-256/new 1.02-1.05; the best D 256 / flash-attn-4 0.97-1.00 (new
# ~0.94-0.95). Flip rule: at D 256 the variant with the highest x/new becomes the D 256 default if it is "faster" at both
# N 4k and 16k; rescale_first at D 64 if early/new is "faster" at N 4k and N 16k and not "slower" causal. Else nothing.
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
out="${OUT:-results/fa3gap9}"; session_setup "$out/logs"
AB="--variants old,new,early,pairs-256,fa4-256,alpha-256 \
--shapes 64:4096:full,256:4096:full,64:16384:full,256:16384:full,64:4096:causal"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
# 11 bf16 + 3 flash-attn-4 + 3 causal D 256 kernels, both pools at once (17 processes on 16 cores: one round)
step precompile 55 bash -c "python3 scripts/fa3_speed_ab.py --precompile 14 --precompile-fa4 $AB & a=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 3 --variants pairs-256,fa4-256,alpha-256 \
  --shapes 256:4096:causal & b=\$!; trap 'kill -INT \$a \$b' INT; wait"
NPROC=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
step pytest 40 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_fa3_gpu.py \
  -k "gap9_variants or rescale_first_same_values"
# the A/B runs unless a test failed (a pytest cut by its limit with none failed still leads to it: the A/B checks
# each variant against old itself, and its own limit bounds a hang)
if grep -qE "^(FAILED|ERROR)|[0-9]+ (failed|errors?)\b" "$LOGS/pytest.log"; then
  echo "== fa3ab: skipped (a GPU test failed)"
else
  step fa3ab 55 python3 scripts/fa3_speed_ab.py $AB --burst-ms 10 --peers flash-attn-4 --out "$out/fa3ab"
fi
echo "== precompile"; grep -E "^precompiled|Error|Traceback" "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 15
if [[ -f "$out/logs/fa3ab.log" ]]; then
  echo "== fa3ab"; grep -E "errors:|Traceback|Error|INTERRUPTED" "$out/logs/fa3ab.log" | head -n 5
  grep "^SUMMARY" "$out/logs/fa3ab.log"
fi
