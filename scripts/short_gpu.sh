#!/usr/bin/env bash
# short_gpu.sh: issue 12, fa3's short-prefill persistent grid on one H200 (`hopper.fa3.short_config`,
# FA_VARIANTS_SHORT_PERSISTENT / _CAUSAL / _NARROW_CAUSAL): the GPU proof of session 17's limits (seqlen_k <= 3072,
# causal <= 1536) and of D 64's 128-row tiles for causal calls up to 1024 keys, and the next step of the limit.
# ~150-200 s cold (limits 60 + 60 + 120 + 60).
#
#   source .gpu/env.sh; scripts/short_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Why (bench/NOTES.md, "Session 17 (2026-12-02): short prefill, the boundary"): session 17's second call measured
# persistent-m128 / persistent 1.123 / 1.125 at D 64 N 512 / 1k causal, persistent / new 1.023 / 1.015 at N 3072
# non-causal (D 64 / 128), 0.975 at D 128 N 2k causal; `auto` follows (cc9a758 and the next commit).
# 0. precompile: scripts/fa3_speed_ab.py --precompile for old / new / persistent at the A/B's shapes, with
#    flash-attn-4's kernels (its disk cache on: FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED, below).
# 1. GPU tests: tests/test_fa3_gpu.py -k short_calls_run_persistent (6, D 64 / 128 / 256: auto's calls up to the
#    limits, odd lengths, Nq != Nk, GQA, equal the one-CTA-per-tile grid on the same tiles bit for bit and pass the float64 bound;
#    calls past the limits run the default grid).
# 2. compute-sanitizer memcheck and racecheck on fa3 at head_dim 64 (scripts/sanitize.py: its last two shapes run
#    the persistent grid, causal on 128-row tiles).
# 3. scripts/fa3_speed_ab.py, paired, 6 rounds: old / new / persistent beside flash-attn-4 and cuDNN at N 4k
#    non-causal, D 64 and 128 (the limit's next step; session 16 had D 128 1.003, session 17 D 64 1.007).
# Pass: (1) "6 passed"; (2) "clean" for both tools; (3) no ERR.
# Prediction: persistent / new 0.99-1.02 at N 4k.
# Flip rule: the non-causal limit rises to 4096 if N 4k is "faster" at both head dims.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/short"; gpu_session "$out/logs" "$@"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
SHAPES=64:4096:full,128:4096:full
VARIANTS=old,new,persistent
step precompile 60 python3 scripts/fa3_speed_ab.py --precompile 8 --precompile-fa4 --variants $VARIANTS \
  --shapes "$SHAPES"
step pytest 60 python3 -m pytest -q $(xdist_flag 4) -m gpu -p no:cacheprovider --tb=short -rfE tests/test_fa3_gpu.py \
  -k "short_calls_run_persistent"
step sanitize 120 python3 scripts/sanitize.py --tools memcheck racecheck --backends fa3 --head-dims 64 \
  --per-head-dim --precompile --timeout 110 --out "$out/sanitize"
step speed_ab 60 python3 scripts/fa3_speed_ab.py --variants $VARIANTS --shapes "$SHAPES" \
  --peers flash-attn-4,sdpa-cudnn --burst-ms 10 --out "$out/ab"
expect_passed 6
echo "== sanitize"; grep -E "clean|error|WRONG|FAILED" "$out/logs/sanitize.log" | head -n 12
echo "== speed_ab"; grep -E "^SUMMARY D|persistent/new" "$out/logs/speed_ab.log" | head -n 36
steps_exit
