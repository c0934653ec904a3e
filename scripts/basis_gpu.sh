#!/usr/bin/env bash
# basis_gpu.sh: issue 12, session 15, fa3 bf16 vs flash-attn-4 on one H200: alpha from the kept bases
# (Sm90Config.basis_alpha, off; variant `basis`), built in session 4 to close the per-tile instruction gap and never
# timed (bench/NOTES.md, "Issue 12, SASS gap": at D 128 `basis` matches flash-attn-4 in every floating-point class,
# 476 instructions per K/V tile vs the default's 487 and flash-attn-4's 457), alone and with the turn's descriptors
# built once per tile (`turn`, Sm90Config.hoisted_descriptors: turn / new 1.001-1.014 in two runs of session 13, never
# slower; `basis-turn` = both) at D 128, and alone at D 64 (whose default has hoisted_descriptors on).
# <= 110 s on a cold machine (limits 45 + 45 + 28 + 20; xdist start-up took 21 s).
#
#   source .gpu/env.sh; scripts/basis_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/fa3_speed_ab.py --precompile, all at once into the disk caches: old / new / basis / turn / basis-turn at
#    D 128 and old / new / basis at D 64, causal and not (16 kernels), flash-attn-4's kernels of the timed shapes (its
#    own disk cache), and the tests' fp16 basis / basis-turn (non-causal, 3 kernels).
# 1. GPU tests (tests/test_fa3_gpu.py -k "fa3gap_variants and (basis-d64 or basis-d128 or basis-turn)", 6 tests): vs
#    float64 with odd lengths, one K/V tile and several, Nq != Nk both ways (causal rows that see no key), GQA, fp16
#    once, and EC-04's logit shifts (|m c| ~500 to ~1.3e5: the exact form's rare branch; causal row 0 = V exactly).
# 2. scripts/fa3_speed_ab.py (unless a test failed): old, new, basis, turn, basis-turn beside flash-attn-4, bf16,
#    B*N = 16k, H*D = 2048, D 128 N 4k, N 16k, N 4k causal, N 16k causal; then old, new, basis at D 64 on the same
#    four shapes; the paired protocol (6 rounds of 4 cycles of 10 ms bursts, rotated and reversed orders, A/A control).
# Pass: (0) "precompiled" lines, no Traceback. (1) "6 passed", 0 failed / 0 errors. (2) no "errors:", each variant's
# max diff vs old like new's.
# Prediction (bench/NOTES.md, "Session 15 (2026-12-02): fa3 basis_alpha timed; predictions before the run"): basis /
# new 0.99-1.02 at D 128 (-11 instructions per tile, ~2 %, mostly off the critical path: issue slots ~39 % busy),
# turn / new 1.000-1.015 (as in session 13), basis-turn / new 1.00-1.03; D 64 basis / new 0.99-1.02;
# best / flash-attn-4 at D 128 0.96-1.00.
# Flip rule: basis_alpha (with hoisted_descriptors for basis-turn) on in fa3's DEFAULT_CONFIGS[D] if the tests pass and
# the variant is "faster" (paired verdict) at >= 2 of the 4 shapes and "slower" at none, geomean x / new >= 1.005
# (at D 128 the variant with the higher geomean of those that qualify).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/basis"; gpu_session "$out/logs" "$@"
AB128="--variants old,new,basis,turn,basis-turn --shapes 128:4096:full,128:16384:full,128:4096:causal,128:16384:causal"
AB64="--variants old,new,basis --shapes 64:4096:full,64:16384:full,64:4096:causal,64:16384:causal"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
# 16 bf16 + flash-attn-4's 4 + 3 fp16 kernels on 16 cores
step precompile 45 bash -c "python3 scripts/fa3_speed_ab.py --precompile 10 --precompile-fa4 $AB128 & a=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 6 --precompile-fa4 $AB64 & b=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 3 --dtype fp16 --variants basis,basis-turn \
    --shapes 128:4096:full,64:4096:full & c=\$!; trap 'kill -INT \$a \$b \$c' INT; wait"
NPROC=$(xdist_flag 6)
step pytest 45 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_fa3_gpu.py \
  -k "fa3gap_variants and (basis-d64 or basis-d128 or basis-turn)"
if grep -qE "^(FAILED|ERROR)|[0-9]+ (failed|errors?)\b" "$LOGS/pytest.log"; then
  echo "== fa3ab: skipped (a GPU test failed)"; step_failed fa3ab skipped
else
  step fa3ab128 28 python3 scripts/fa3_speed_ab.py $AB128 --burst-ms 10 --peers flash-attn-4 --out "$out/fa3ab128"
  step fa3ab64 20 python3 scripts/fa3_speed_ab.py $AB64 --burst-ms 10 --peers flash-attn-4 --out "$out/fa3ab64"
fi
echo "== precompile"; grep -E "^precompiled|Error|Traceback" "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 15
grep -qE "^6 passed|[^0-9]6 passed" "$out/logs/pytest.log" || step_failed pytest "not 6 passed"
for ab in fa3ab128 fa3ab64; do
  [[ -f "$out/logs/$ab.log" ]] || continue
  echo "== $ab"; grep -E "errors:|Traceback|Error|INTERRUPTED" "$out/logs/$ab.log" | head -n 5
  grep "^SUMMARY" "$out/logs/$ab.log"
done
steps_exit
