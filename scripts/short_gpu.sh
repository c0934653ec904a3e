#!/usr/bin/env bash
# short_gpu.sh: issue 12, fa3's short-prefill persistent grid on one H200 (`hopper.fa3.short_config`,
# FA_VARIANTS_SHORT_PERSISTENT / _CAUSAL): session 17's limits (seqlen_k <= 2048, causal <= 1536) and D 64's 128-row
# tile for short causal calls. ~200-260 s cold (limits 60 + 60 + 200 + 100).
#
#   source .gpu/env.sh; scripts/short_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Why (bench/NOTES.md, "Session 17 (2026-12-02): short prefill, the boundary"): session 17's first call ran session
# 16's script: 16 GPU tests passed, memcheck / synccheck clean at D 64 / 128, racecheck past its 90 s limit (not run to
# the end), and the boundary A/B raised the limits (persistent / new 1.03-1.08 at N 1536 / 2k non-causal, N 1536
# causal); persistent-m128 / persistent was 1.232 / 1.102 = 1.12 at D 64 N 1k causal but 0.92-0.97 non-causal and at
# N 1536 causal.
# 0. precompile: scripts/fa3_speed_ab.py --precompile for old / new / persistent / persistent-m128 at the A/B's shapes,
#    with flash-attn-4's kernels (its disk cache on: FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED, below).
# 1. GPU tests: tests/test_fa3_gpu.py -k short_calls_run_persistent (4 tests: auto's calls at the new limits, odd
#    lengths, Nq != Nk, GQA, equal the one-CTA-per-tile grid bit for bit, pass the float64 bound; causal calls past
#    1536 run the default grid).
# 2. compute-sanitizer racecheck on fa3 at head_dim 64 and 128 (scripts/sanitize.py: its last two shapes run the
#    persistent grid), the tool session 17's first call did not finish.
# 3. scripts/fa3_speed_ab.py, paired, 6 rounds: old / new / persistent / persistent-m128 (D 64 only) beside
#    flash-attn-4 and cuDNN at D 64 N 512 / 1k causal (the 128-row tile), N 2k causal at both head dims (the causal
#    limit: session 16 had D 128 0.977, D 64 1.027) and N 3072 non-causal at both, N 4k at D 64 (past the limit).
# Pass: (1) "4 passed"; (2) "clean" for both head dims; (3) no ERR.
# Prediction: persistent-m128 / persistent (the two x / new medians) 1.05-1.12 at D 64 N 512 / 1k causal; persistent /
# new 0.97-1.02 at N 2k causal (D 128 below 1), 1.00-1.03 at N 3072 and N 4k non-causal.
# Flip rules: D 64's causal short calls with seqlen_k <= 1024 take tile_m 128 if persistent-m128 / persistent > 1.01
# at N 512 and 1k causal; the causal limit rises to 2048 if N 2k causal is "faster" at both head dims; the non-causal
# limit rises to 3072 if N 3072 is "faster" at both head dims (4096 if D 64's N 4k is too and session 16's D 128 N 4k,
# 1.003, is rerun "faster").
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/short"; gpu_session "$out/logs" "$@"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
SHAPES=64:512:causal,64:1024:causal,64:2048:causal,128:2048:causal,64:3072:full,128:3072:full,64:4096:full
VARIANTS=old,new,persistent,persistent-m128
step precompile 60 python3 scripts/fa3_speed_ab.py --precompile 8 --precompile-fa4 --variants $VARIANTS \
  --shapes "$SHAPES"
step pytest 60 python3 -m pytest -q $(xdist_flag 4) -m gpu -p no:cacheprovider --tb=short -rfE tests/test_fa3_gpu.py \
  -k "short_calls_run_persistent"
step sanitize 200 python3 scripts/sanitize.py --tools racecheck --backends fa3 --head-dims 64 128 \
  --per-head-dim --precompile --timeout 190 --out "$out/sanitize"
step speed_ab 100 python3 scripts/fa3_speed_ab.py --variants $VARIANTS --shapes "$SHAPES" \
  --peers flash-attn-4,sdpa-cudnn --burst-ms 10 --out "$out/ab"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
grep -qE "(^|[^0-9])4 passed" "$out/logs/pytest.log" || step_failed pytest "not 4 passed"
echo "== sanitize"; grep -E "clean|error|WRONG|FAILED" "$out/logs/sanitize.log" | head -n 12
echo "== speed_ab"; grep -E "^SUMMARY D|persistent(-m128)?/new" "$out/logs/speed_ab.log" | head -n 36
steps_exit
