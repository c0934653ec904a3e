#!/usr/bin/env bash
# turn128_gpu.sh: issue 12, session 15, fa3 bf16 head_dim 128 with the K/V ring's WGMMA descriptors built once per
# tile (Sm90Config.hoisted_descriptors, variant `turn`; on in D 64's default since session 12) vs the default, beside
# flash-attn-4, on one H200, with its GPU tests. <= 100 s on a cold machine (limits 30 + 40 + 26).
#
#   source .gpu/env.sh; scripts/turn128_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Why (bench/NOTES.md, "Session 15 (2026-12-02): fa3 head_dim 128, the turn's descriptors, a third run; predictions
# before the run"): turn / new at D 128 was 1.008 / 1.008 / 1.002 / 1.001 and 1.013 / 1.014 / 1.007 / 1.007 in session
# 13's two runs and 1.007 / 1.013 / 1.003 in session 15's basis run (N 16k causal cut by its limit): never slower, yet
# "faster" (paired verdict) at >= 2 of the 4 shapes only in the last, which did not reach the fourth.
# 0. scripts/fa3_speed_ab.py --precompile: old / new / turn at D 128, causal and not (6 kernels) and flash-attn-4's.
# 1. GPU tests, serial (no xdist start-up): tests/test_fa3_gpu.py -k "(turn_variants and d128) or
#    hoisted_descriptors_same_values" (6 tests): turn vs float64 (one K/V tile and 33, odd lengths, Nq != Nk both ways,
#    GQA and MQA, NaN-poisoned outputs, LSE, EC-04's logit shifts), and O / LSE with the switch equal to those without
#    it bit for bit at D 64 and D 128, causal and not.
# 2. scripts/fa3_speed_ab.py: old, new, turn beside flash-attn-4, bf16, B*N = 16k, H*D = 2048, D 128 N 16k causal first
#    (the shape the last run did not reach), then N 4k, N 16k, N 4k causal; paired protocol (6 rounds of 4 cycles of
#    10 ms bursts, rotated and reversed orders, A/A control).
# Pass: (0) "precompiled" lines, no Traceback. (1) "6 passed". (2) no "errors:".
# Prediction: turn / new 1.000-1.015 at each shape ("faster" at 1-3 of 4, "slower" at none).
# Flip rule (session 13's): the tests pass, "faster" at >= 2 of the 4 shapes and "slower" at none -> hoisted_descriptors
# on in fa3's DEFAULT_CONFIGS[128] (prefill; decode keeps the kernels its A/Bs measured).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/turn128"; gpu_session "$out/logs" "$@"
AB="--variants old,new,turn --shapes 128:16384:causal,128:4096:full,128:16384:full,128:4096:causal"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
step precompile 30 python3 scripts/fa3_speed_ab.py --precompile 6 --precompile-fa4 $AB
step pytest 40 python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_fa3_gpu.py \
  -k "(turn_variants and d128) or hoisted_descriptors_same_values"
step fa3ab 26 python3 scripts/fa3_speed_ab.py $AB --burst-ms 10 --peers flash-attn-4 --out "$out/fa3ab"
echo "== precompile"; grep -E "^precompiled|Error|Traceback" "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 15
grep -qE "^6 passed|[^0-9]6 passed" "$out/logs/pytest.log" || step_failed pytest "not 6 passed"
echo "== fa3ab"; grep -E "errors:|Traceback|Error|INTERRUPTED" "$out/logs/fa3ab.log" | head -n 5
grep "^SUMMARY" "$out/logs/fa3ab.log"
steps_exit
