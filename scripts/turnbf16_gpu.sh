#!/usr/bin/env bash
# turnbf16_gpu.sh: issue 12, session 12, fa3 bf16 head_dim 64 vs flash-attn-4 on one H200: the K/V ring's WGMMA
# descriptors built once per tile instead of in every ping-pong turn (Sm90Config.hoisted_descriptors, off by default;
# variants `turn`, and `pconv-turn` = turn + p_before_rescale). Session 12's reading of call A's ncu run
# (bench/NOTES.md, "Session 12 (2026-12-02): d64gap, fa3 head_dim 64 vs flash-attn-4 under ncu") found our turn
# (BAR.SYNC .. BAR.ARV, where a warpgroup issues its GEMMs while the other waits) +1.49 / +1.87 points of
# flash-attn-4's warp time longer at N 16k / 4k (51 vs 46 instructions). The SASS (bench/NOTES.md, the section
# named below) shows why: the DSL rebuilds each K / V stage's descriptor from the shared-memory address in the turn
# (add, shift, masks, LBO bit); with the switch one ULEA per operand is left: D 64 55 -> 45 instructions (pconv
# 51 -> 44), D 128 71 -> 61.
# Same descriptors, same values. <= 100 s on a cold machine (limits 40 + 25 + 35; 11 bf16 + 1 fp16 kernels and 2 of
# flash-attn-4 to precompile, 15 processes).
#
#   source .gpu/env.sh; scripts/turnbf16_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/fa3_speed_ab.py --precompile, all at once into the disk caches: old / new / turn / pconv-turn at D 64
#    causal and not (8 kernels: the seqlen does not change one), flash-attn-4's kernels of the timed shapes (its own
#    disk cache), and the tests' own: turn at D 128 causal and not, turn fp16 at D 64.
# 1. GPU tests vs float64 (tests/test_fa3_gpu.py -k "turn_variants or hoisted_descriptors"): turn at D 64 and 128 and
#    pconv-turn at D 64, causal and not, one K/V tile and 33 (both ring slots, each reused: a wrong stage offset reads
#    the other slot's tile), odd lengths, Nq != Nk both ways (causal rows that see no key), GQA and MQA, NaN-poisoned
#    outputs, LSE checked, fp16 once, EC-04's huge logit shifts; and turn's O and LSE equal to the default's bit for
#    bit at D 64 (causal and not).
# 2. scripts/fa3_speed_ab.py (unless a test failed): old, new, turn, pconv-turn beside flash-attn-4, bf16, B*N = 16k,
#    H*D = 2048, shapes in this order: D 64 N 4k, D 64 N 16k, D 64 N 4k causal, D 64 N 16k causal; the paired protocol
#    (6 rounds of 4 cycles of 10 ms bursts, rotated and reversed orders, A/A control); the limit may cut the last shape
#    (the SUMMARY of the shapes done is still printed).
# Pass: (0) "precompiled" lines, no Traceback. (1) 0 failed / 0 errors, every test ran (rc 124 with no FAILED: cut by
# its limit, not a pass). (2) no "errors:", turn's and pconv-turn's max diff vs old like new's.
# Prediction (bench/NOTES.md, "Session 12 (2026-12-02): fa3's ping-pong turn, descriptors built once per tile;
# predictions before the run"): turn/new 1.005-1.02 at D 64 N 4k and 16k (most likely ~1.01: 10 of the turn's 55
# instructions and 8 of the step's 412 go), 0.995-1.01 causal, "same" expected (the unmasked loop, which dominates,
# is unchanged: 408 -> 408 per step); turn/flash-attn-4 0.94-0.96 non-causal; pconv-turn/new = pconv's gain
# (d64gap2_gpu.sh) + turn's, 1.01-1.04 non-causal.
# Flip rule: hoisted_descriptors on in fa3's D 64 default if the tests pass and turn/new is "faster" (paired verdict)
# at >= 2 of the 4 D 64 shapes and "slower" at none (on top of p_before_rescale if that one flipped: then read
# pconv-turn/new against pconv's own run); D 128 only after a run of its shapes; "same" everywhere: it stays off
# (a removal candidate), and the turn's remaining gap is not its instruction count.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/turnbf16}"; gpu_session "$out/logs" "$@"
AB="--variants old,new,turn,pconv-turn --shapes 64:4096:full,64:16384:full,64:4096:causal,64:16384:causal"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
# 8 bf16 + flash-attn-4 + 2 D 128 + 1 fp16 kernels, all pools at once (15 processes on 16 cores)
step precompile 40 bash -c "python3 scripts/fa3_speed_ab.py --precompile 12 --precompile-fa4 $AB & a=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 2 --variants turn --shapes 128:4096:full,128:4096:causal & b=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 1 --dtype fp16 --variants turn --shapes 64:4096:full & c=\$!; \
  trap 'kill -INT \$a \$b \$c' INT; wait"
NPROC=$(xdist_flag 6)
step pytest 25 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_fa3_gpu.py \
  -k "turn_variants or hoisted_descriptors"
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
