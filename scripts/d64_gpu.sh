#!/usr/bin/env bash
# d64_gpu.sh: issue 12, session 11, fa3 head_dim 64 vs flash-attn-4 on one H200: the K/V buffer releases from an
# elect.sync lane (Sm90Config.elect_release, off by default; variant `elect`). By default ptxas rematerialises the
# thread index (S2R) of the releases' lane-0 test inside the ping-pong turn at D 64, between the P V GEMM's WGMMAs, and
# a WGMMA waits for it; flash-attn-4 reads it at the loop top, outside its turn (bench/NOTES.md, "Session 11
# (2026-12-02): fa3 head_dim 64 vs flash-attn-4"). Same arrivals, same results. <= 100 s on a cold machine (limits
# 32 + 30 + 38).
#
#   source .gpu/env.sh; scripts/d64_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/fa3_speed_ab.py --precompile, all at once into the disk caches: old / new / elect at D 64 causal and not
#    (6 bf16 kernels: the seqlen does not change one), flash-attn-4's D 64 kernels of the timed shapes (its own disk
#    cache), and the fp16 elect kernel of the GPU tests.
# 1. GPU tests vs float64 (tests/test_fa3_gpu.py -k elect): elect at D 64, causal and not, one K/V tile and 33 (both
#    ring slots, many barrier phases: a lost or doubled arrive hangs or reads a stale K/V tile), odd lengths, Nq != Nk
#    both ways (causal rows that see no key), GQA and MQA, NaN-poisoned outputs, LSE checked, fp16 once; and elect's O
#    and LSE equal to the default's bit for bit (causal and not).
# 2. scripts/fa3_speed_ab.py (unless a test failed): old, new, elect beside flash-attn-4, bf16, B*N = 16k, H*D = 2048,
#    D 64, shapes in this order: N 4k, N 16k, N 4k causal, N 16k causal; the paired protocol (6 rounds of 4 cycles of
#    10 ms bursts, rotated and reversed orders, A/A control); the limit may cut the last shape (the SUMMARY of the
#    shapes done is still printed).
# Pass: (0) a "precompiled" line, no Traceback. (1) 0 failed / 0 errors, every test ran (rc 124 with no FAILED: cut by
# its limit, not a pass). (2) no "errors:", elect's max diff vs old like new's.
# Prediction: elect/new 1.000-1.015 at each D 64 shape (the S2R wait is ~5-20 cycles of a ~2700-cycle K/V tile per
# warpgroup turn, x3 turns); elect/flash-attn-4 0.93-0.95 (new/fa4 0.929 / 0.943 / 0.934 in session 9): not the whole
# gap. Flip rule: elect_release on in fa3's D 64 default if the tests pass and elect/new is "faster" at every timed
# shape (paired verdict); else it stays off.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/d64}"; gpu_session "$out/logs" "$@"
AB="--variants old,new,elect --shapes 64:4096:full,64:16384:full,64:4096:causal,64:16384:causal"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
# 6 bf16 + flash-attn-4 + 1 fp16 kernels, both pools at once
step precompile 32 bash -c "python3 scripts/fa3_speed_ab.py --precompile 12 --precompile-fa4 $AB & a=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 1 --dtype fp16 --variants elect --shapes 64:4096:full & b=\$!; \
  trap 'kill -INT \$a \$b' INT; wait"
NPROC=$(xdist_flag 4)
step pytest 30 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_fa3_gpu.py -k elect
# the A/B runs unless a test failed (a pytest cut by its limit with none failed still leads to it: the A/B checks
# each variant against old itself, and its own limit bounds a hang)
if grep -qE "^(FAILED|ERROR)|[0-9]+ (failed|errors?)\b" "$LOGS/pytest.log"; then
  echo "== fa3ab: skipped (a GPU test failed)"; step_failed fa3ab skipped
else
  step fa3ab 38 python3 scripts/fa3_speed_ab.py $AB --burst-ms 10 --peers flash-attn-4 --out "$out/fa3ab"
fi
echo "== precompile"; grep -E "^precompiled|Error|Traceback" "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 15
if [[ -f "$out/logs/fa3ab.log" ]]; then
  echo "== fa3ab"; grep -E "errors:|Traceback|Error|INTERRUPTED" "$out/logs/fa3ab.log" | head -n 5
  grep "^SUMMARY" "$out/logs/fa3ab.log"
fi
steps_exit
