#!/usr/bin/env bash
# balanced_gpu.sh: issue 12, fa3's persistent grid with its tiles dealt by load (Sm90Config.balanced,
# common.tile_order.balanced_order) on one H200: its GPU tests, the sanitizers on it and a paired A/B at causal
# shapes. ~350-450 s cold (limits 75 + 60 + 160 + 150).
#
#   source .gpu/env.sh; scripts/balanced_gpu.sh       (repository root; writes under $OUT; --help: this text)
#
# Session 18 ran it (bench/h200-2026-12-03-s18/raw.tar.xz:callA/balanced.out: 13 passed, sanitizers clean, balanced / new 1.04-1.18 at
# N 1k-4k causal) and flipped the balanced grid on (FA_VARIANTS_SHORT_BALANCED, on by default since); it now reproves
# that grid after a change to fa3's persistent path.
#
# Why (bench/NOTES.md, "Session 17 (2026-12-02): the persistent grid dealt by load; predictions before the run"):
# the persistent grid's static schedule (CTA b takes tiles b, b + G, ...) loses under causal masking (session 6:
# 0.76-0.97 at N 4k causal; session 17: 0.975 at D 128 N 2k causal) while it gains 1-3 % without masking. Its model
# puts the most loaded CTA 10-15 % above the mean at D 128 causal (13-38 % at D 256); dealing each round's tiles by
# load puts it 1-2 % above, with the same tiles per round (the L2 order kept).
# 0. precompile: scripts/fa3_speed_ab.py --precompile for old / new / persistent / balanced at the A/B's shapes, with
#    flash-attn-4's kernels (its disk cache on).
# 1. GPU tests: tests/test_fa3_gpu.py -k balanced (13: the persistent variants' matrix with balanced at D 64 / 128 /
#    256, bf16 and fp16, causal and not, NaN-poisoned outputs; L2 sections of 2 with O and LSE equal bit for bit to
#    the static schedule's).
# 2. compute-sanitizer memcheck and racecheck on fa3 at head_dim 64 and 128 with FA_VARIANTS_SHORT_BALANCED=1
#    (scripts/sanitize.py: its last two shapes are short causal calls, so they run the balanced grid).
# 3. scripts/fa3_speed_ab.py, paired, 6 rounds: old / new / persistent / balanced beside flash-attn-4 and cuDNN at
#    causal D 128 N 1k / 2k / 4k / 16k, D 64 N 2k / 4k, D 256 N 4k, and D 128 N 4k non-causal (the control: equal
#    costs give the static table, so balanced = persistent plus one load per tile).
# Pass: (1) "13 passed"; (2) "clean" for both tools and head dims; (3) no ERR.
# Prediction (the model halves: session 17's D 128 N 2k causal persistent / new was 0.975 where it predicts ~0.92):
# balanced / persistent 1.02-1.06 at D 128 causal N 2k-16k, 1.01-1.04 at D 64 causal, 1.05-1.15 at D 256 N 4k causal,
# 0.99-1.01 non-causal; balanced / new 1.00-1.04 at D 128 N 2k / 4k causal, 0.99-1.02 at N 16k causal.
# Flip rules: the short grid's causal calls (seqlen_k <= FA_VARIANTS_SHORT_PERSISTENT_CAUSAL) take balanced
# (FA_VARIANTS_SHORT_BALANCED on by default) if
# balanced / persistent > 1.01 at N 1k causal (D 128) and at D 64 N 2k causal, and < 0.99 nowhere; the causal limit
# rises to the largest N at which balanced / new is "faster" at both D 64 and D 128 (a switch of its own if that is
# past the non-causal limit).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/balanced"; gpu_session "$out/logs" "$@"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
SHAPES=128:1024:causal,128:2048:causal,128:4096:causal,128:16384:causal,64:2048:causal,64:4096:causal
SHAPES=$SHAPES,256:4096:causal,128:4096:full
VARIANTS=old,new,persistent,balanced
step precompile 75 python3 scripts/fa3_speed_ab.py --precompile 8 --precompile-fa4 --variants $VARIANTS \
  --shapes "$SHAPES"
step pytest 60 python3 -m pytest -q $(xdist_flag 8) -m gpu -p no:cacheprovider --tb=short -rfE tests/test_fa3_gpu.py \
  -k "balanced"
step sanitize 160 env FA_VARIANTS_SHORT_BALANCED=1 python3 scripts/sanitize.py --tools memcheck racecheck \
  --backends fa3 --head-dims 64 128 --per-head-dim --precompile --timeout 150 --out "$out/sanitize"
step speed_ab 150 python3 scripts/fa3_speed_ab.py --variants $VARIANTS --shapes "$SHAPES" \
  --peers flash-attn-4,sdpa-cudnn --burst-ms 10 --out "$out/ab"
expect_passed 13
echo "== sanitize"; grep -E "clean|error|WRONG|FAILED" "$out/logs/sanitize.log" | head -n 12
echo "== speed_ab"; grep -E "^SUMMARY D|(persistent|balanced)/new" "$out/logs/speed_ab.log" | head -n 36
steps_exit
