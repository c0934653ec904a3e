#!/usr/bin/env bash
# dualshort_gpu.sh: issue 12, short prefill against cuDNN on one H200: prefill on decode's two-CTAs-per-SM tiles
# (scripts/fa3_speed_ab.py's `dual` at head_dim 64, `dual-128` at 128: one consumer warpgroup of 64 query rows per CTA,
# no ping-pong, 128 registers at launch, two CTAs per SM) beside what `auto` runs there (the persistent grid, causal
# dealt by load, D 64 causal <= 1k on 128-row tiles) and cuDNN / flash-attn-4. ~200-260 s cold (limits 60 + 90 + 150).
#
#   source .gpu/env.sh; scripts/dualshort_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Why (bench/NOTES.md, "Session 24 (2026-12-04): short prefill on two CTAs per SM; predictions before the run"): at
# D 64 N 512 fa3 runs at 0.63 of its 16k rate, cuDNN at 0.85 of its own; one CTA per SM pays each tile's prologue and
# epilogue with its tensor cores idle, which a second CTA on the SM could cover.
# 0. precompile: the plan's kernels (scripts/fa3_speed_ab.py --precompile) with flash-attn-4's.
# 1. GPU tests: tests/test_fa3_gpu.py -k dual_prefill (8: dual / dual-128, causal or not, bf16 / fp16, odd lengths,
#    Nq != Nk both ways, GQA / MQA, vs float64).
# 2. scripts/fa3_speed_ab.py, paired, 6 rounds, variants DUAL (old, new, persistent, balanced, balanced-m128, dual,
#    dual-128) beside cuDNN and flash-attn-4 at D 64 N 512 / 1k / 2k and D 128 N 512 / 1k, causal and not, and D 128
#    N 2k causal.
# Pass: (1) "8 passed"; (2) no ERR.
# Prediction and flip rule: bench/NOTES.md, same section.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/dualshort"; gpu_session "$out/logs" "$@"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
SHAPES=64:512:full,64:512:causal,64:1024:full,64:1024:causal,64:2048:full,64:2048:causal
SHAPES=$SHAPES,128:512:full,128:512:causal,128:1024:full,128:1024:causal,128:2048:causal
VARIANTS=old,new,persistent,balanced,balanced-m128,dual,dual-128
step precompile 60 python3 scripts/fa3_speed_ab.py --precompile 8 --precompile-fa4 --variants $VARIANTS \
  --shapes "$SHAPES"
step pytest 90 python3 -m pytest -q $(xdist_flag 4) -m gpu -p no:cacheprovider --tb=short -rfE tests/test_fa3_gpu.py \
  -k "dual_prefill"
step speed_ab 150 python3 scripts/fa3_speed_ab.py --variants $VARIANTS --shapes "$SHAPES" \
  --peers flash-attn-4,sdpa-cudnn --burst-ms 10 --out "$out/ab"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
grep -qE "(^|[^0-9])8 passed" "$out/logs/pytest.log" || step_failed pytest "not 8 passed"
echo "== speed_ab"; grep -E "^SUMMARY D|/new|^\| [0-9]" "$out/logs/speed_ab.log" | head -n 160
steps_exit
