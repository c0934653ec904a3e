#!/usr/bin/env bash
# turn_gpu.sh: issue 12, session 7, on one H200: the ping-pong turn shortened (Sm90Config.v_wait_before_turn: V waited
# for before the turn's BAR.SYNC; Sm90Config.opaque_smem_base: Q/K/V descriptor bits built before the mainloop; both off
# by default). D 128 SASS: turn 71 -> 43 instructions, mainloop 487 -> 465; D 64: turn 55 -> 37. <= 80 s.
#
#   source .gpu/env.sh; scripts/turn_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/fa3_speed_ab.py --precompile: old / new / turn (D 64, 128) / opaque (D 128), bf16, non-causal, and
#    flash-attn-4's D 64/128 kernels (its disk cache); the test-only kernels (turn / opaque / vwait causal, vwait D 256
#    non-causal, turn fp16 D 128): 16 processes, into the disk cache.
# 1. GPU tests vs float64: tests/test_fa3_gpu.py -k turn_variants: turn at D 64/128, opaque at D 128, vwait at D 256,
#    causal and not, one K/V tile and many, odd lengths (1/3/77/113/255/257/300/511/1023/4224), Nq != Nk both ways
#    (causal rows that see no key), GQA and MQA, fp16 once, NaN-poisoned outputs, LSE checked.
# 2. scripts/fa3_speed_ab.py (unless a test failed): old, new, turn, opaque beside flash-attn-4, non-causal, D 128
#    then 64, N 4k and 16k (B*N = 16k, H*D = 2048), 6 rounds of the paired protocol, nvidia-smi clocks; the time
#    limit may cut the D 64 rows (the SUMMARY of the shapes done is still printed).
# Pass: (0) "precompiled" lines, no Traceback. (1) 0 failed / 0 errors, and every test ran (rc 124 with no FAILED: cut
# by its limit, not a pass). (2) no "errors:", every row's max diff vs old <= ~4e-3 (same maths per tile as new). Prediction (bench/NOTES.md, "Session 7 (2026-12-01): the ping-pong turn"):
# turn/new 1.00-1.03 at D 128 and 64 (N 4k and 16k), opaque/new 1.00-1.02 at D 128; turn/fa4 0.94-0.98 (from new/fa4
# 0.93-0.96). Worth a default (both switches at D 64/128) where turn/new is "faster" at both N of a head dim.
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
out="${OUT:-results/turn}"; session_setup "$out/logs"
AB="--variants old,new,turn,opaque --causal no --head-dims 128,64 --seqlens 4096,16384"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
# 7 bf16 + 2 flash-attn-4 + 4 causal + 1 D 256 + 2 fp16 kernels, all pools at once (16 processes on 16 cores)
step precompile 36 bash -c "python3 scripts/fa3_speed_ab.py --precompile 9 --precompile-fa4 $AB & a=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 4 --variants turn,opaque,vwait --causal yes --head-dims 64,128,256 \
    --seqlens 4096 & b=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 1 --variants vwait --causal no --head-dims 256 --seqlens 4096 & c=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 2 --dtype fp16 --variants turn --causal both --head-dims 128 \
    --seqlens 4096 & d=\$!; \
  trap 'kill -INT \$a \$b \$c \$d' INT; wait"
NPROC=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
step pytest 16 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_fa3_gpu.py \
  -k turn_variants
# the A/B runs unless a test failed (a pytest cut by its limit with none failed still leads to it: the A/B checks
# each variant against old itself, and its own limit bounds a hang)
if grep -qE "^(FAILED|ERROR)|[0-9]+ (failed|errors?)\b" "$LOGS/pytest.log"; then
  echo "== fa3ab: skipped (a GPU test failed)"
else
  step fa3ab 28 python3 scripts/fa3_speed_ab.py $AB --peers flash-attn-4 --out "$out/fa3ab"
fi
echo "== precompile"; grep -E "^precompiled|Error|Traceback" "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 15
if [[ -f "$out/logs/fa3ab.log" ]]; then
  echo "== fa3ab"; grep -E "errors:|Traceback|Error|INTERRUPTED" "$out/logs/fa3ab.log" | head -n 5
  grep "^SUMMARY" "$out/logs/fa3ab.log"
fi
