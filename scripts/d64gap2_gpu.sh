#!/usr/bin/env bash
# d64gap2_gpu.sh: issue 12, session 12, fa3 head_dim 64 vs flash-attn-4 on one H200: P converted before O's rescale
# branch (Sm90Config.p_before_rescale, off by default; variant `pconv`). Session 12's reading of call A's ncu run
# (bench/NOTES.md, "Session 12 (2026-12-02): d64gap, fa3 head_dim 64 vs flash-attn-4 under ncu") put the D 64 gap in
# the consumer loop's softmax: P's 32 F2FP run as one burst after the skip_unit_rescale branch (LLVM sinks them past
# it), after the last exponential, stalling on their pipe; flash-attn-4 interleaves them with the exponentials. The
# switch converts P before the branch, each pair pinned there by inline PTX (common.layout.convert_pairs_pinned), so
# ptxas interleaves them too. Same values as the default. <= 100 s on a cold machine (limits 40 + 25 + 35: session
# 11's d64_gpu.sh took 30 s to precompile 6 kernels + flash-attn-4; this one has 9 + 3 of flash-attn-4 + 2).
#
#   source .gpu/env.sh; scripts/d64gap2_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/fa3_speed_ab.py --precompile, all at once into the disk caches: old / new / pconv at D 64 causal and not
#    and D 128 non-causal (9 bf16 kernels: the seqlen does not change one), flash-attn-4's kernels of the timed shapes
#    (its own disk cache), and the tests' own: pconv at D 128 causal, pconv fp16 at D 64.
# 1. GPU tests vs float64 (tests/test_fa3_gpu.py -k "pconv or p_before_rescale"): pconv at D 64 and 128, causal and
#    not, one K/V tile and 33 (both ring slots; rows whose max moves and rows whose max stays: both sides of the skip
#    branch), odd lengths, Nq != Nk both ways (causal rows that see no key), GQA and MQA, NaN-poisoned outputs, LSE
#    checked, fp16 once (the f16x2 conversion), EC-04's huge logit shifts; and pconv's O and LSE equal to the
#    default's bit for bit at D 64 (causal and not).
# 2. scripts/fa3_speed_ab.py (unless a test failed): old, new, pconv beside flash-attn-4, bf16, B*N = 16k, H*D = 2048,
#    shapes in this order: D 64 N 4k, D 64 N 16k, D 64 N 4k causal, D 64 N 16k causal, D 128 N 4k; the paired protocol
#    (6 rounds of 4 cycles of 10 ms bursts, rotated and reversed orders, A/A control); the limit may cut the last shape
#    (the SUMMARY of the shapes done is still printed).
# Pass: (0) "precompiled" lines, no Traceback. (1) 0 failed / 0 errors, every test ran (rc 124 with no FAILED: cut by
# its limit, not a pass). (2) no "errors:", pconv's max diff vs old like new's.
# Prediction (bench/NOTES.md, "Session 12 (2026-12-02): fa3 head_dim 64, the P conversion beside the exponentials"):
# pconv/new 1.005-1.03 at D 64 N 4k and 16k, 1.00-1.03 causal (most likely ~1.01-1.02), pconv/flash-attn-4 0.94-0.96
# at D 64 (new/fa4 0.926 / 0.938 / 0.932 / 0.952 in session 11); D 128 N 4k pconv/new 0.99-1.01.
# Flip rule: p_before_rescale on in fa3's D 64 default if the tests pass and pconv/new is "faster" (paired verdict) at
# >= 3 of the 4 D 64 shapes and "slower" at none; D 128 only after a run with its causal shapes (if "faster" here);
# else it stays off (a removal candidate).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/d64gap2}"; gpu_session "$out/logs" "$@"
AB="--variants old,new,pconv --shapes 64:4096:full,64:16384:full,64:4096:causal,64:16384:causal,128:4096:full"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
# 9 bf16 + flash-attn-4 + 1 causal D 128 + 1 fp16 kernels, all pools at once (14 processes on 16 cores)
step precompile 40 bash -c "python3 scripts/fa3_speed_ab.py --precompile 12 --precompile-fa4 $AB & a=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 1 --variants pconv --shapes 128:4096:causal & b=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 1 --dtype fp16 --variants pconv --shapes 64:4096:full & c=\$!; \
  trap 'kill -INT \$a \$b \$c' INT; wait"
NPROC=$(xdist_flag 6)
step pytest 25 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_fa3_gpu.py \
  -k "pconv or p_before_rescale"
# the A/B runs unless a test failed (a pytest cut by its limit with none failed still leads to it: the A/B checks
# each variant against old itself, and its own limit bounds a hang)
if grep -qE "^(FAILED|ERROR)|[0-9]+ (failed|errors?)\b" "$LOGS/pytest.log"; then
  echo "== fa3ab: skipped (a GPU test failed)"; step_failed fa3ab skipped
else
  step fa3ab 35 python3 scripts/fa3_speed_ab.py $AB --burst-ms 10 --peers flash-attn-4 --out "$out/fa3ab"
fi
echo "== precompile"; grep -E "^precompiled|Error|Traceback" "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 15
if [[ -f "$out/logs/fa3ab.log" ]]; then
  echo "== fa3ab"; grep -E "errors:|Traceback|Error|INTERRUPTED" "$out/logs/fa3ab.log" | head -n 5
  grep "^SUMMARY" "$out/logs/fa3ab.log"
fi
steps_exit
