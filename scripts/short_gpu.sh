#!/usr/bin/env bash
# short_gpu.sh: issue 12, session 16's short-prefill flip on one H200 (fa3's persistent grid for seqlen_k <= 1024 at
# head_dim 64 / 128, `hopper.fa3.short_config`, FA_VARIANTS_SHORT_PERSISTENT): its GPU proof and its boundary.
# ~220-280 s cold (limits 60 + 60 + 90 + 120).
#
#   source .gpu/env.sh; scripts/short_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Why (bench/NOTES.md, "Session 16 (2026-12-02): outcome of the short-sequence run"): persistent / new measured
# 1.06-1.26 at N 512 / 1k (D 64 / 128, causal and not), so `auto` runs it there; its causal half was decided on the
# data of the same session (the written rule named non-causal only), and its routed calls' bit-for-bit test ran only
# on an H100 where the test itself was wrong (fixed since).
# 0. precompile: scripts/fa3_speed_ab.py --precompile for old / new / persistent / persistent-m128 at the A/B's shapes,
#    with flash-attn-4's kernels.
# 1. GPU tests (-n 8): tests/test_fa3_gpu.py -k "short_calls_run_persistent or (persistent_variants and (d64 or d128))"
#    (4 + 12 tests: auto's short calls equal the one-CTA-per-tile grid bit for bit and pass the float64 bound; the
#    persistent grid at D 64 / 128 and persistent-m128, D 64's 128-row tiles in it, vs float64).
# 2. compute-sanitizer memcheck, racecheck and synccheck on fa3 at head_dim 64 and 128 (scripts/sanitize.py: its
#    last two shapes fill the SMs with short rows, so they run the persistent grid).
# 3. scripts/fa3_speed_ab.py, paired, 6 rounds: old / new / persistent / persistent-m128 (D 64 only) beside
#    flash-attn-4 and cuDNN at D 64 / 128 N 1k causal (the causal half again), N 1536 causal and not, N 2k non-causal
#    (the boundary), D 64 N 512 / 1k non-causal (the 128-row tile: at N 512 / 1k the 192-row tile's last query tile is
#    a third empty, 576 / 1152 rows for 512 / 1024).
# Pass: (1) "16 passed"; (2) "clean" for every tool and head_dim; (3) no ERR.
# Prediction: persistent / new 1.05-1.12 at N 1k causal (session 16: 1.105 / 1.077), 1.02-1.06 at N 1536 non-causal,
# 0.97-1.03 at N 1536 causal, 1.02-1.04 at N 2k non-causal (session 16: 1.034 / 1.037); persistent-m128 / persistent
# 1.03-1.10 at D 64 N 512, 1.02-1.08 at N 1k (the empty rows gone; short calls are not bound by K/V bytes), 0.95-1.00
# at N 1536 (both tiles fit exactly), 0.97-1.02 at N 2k.
# Flip rules: the causal half stays if N 1k causal is "faster" at both head dims, else causal calls leave the short
# grid (a causal limit of 0); the non-causal limit rises to 2048 if N 1536 and 2k non-causal are "faster" at both head
# dims and "slower" nowhere; the causal limit to 1536 likewise with N 1536 causal; D 64's short config takes tile_m
# 128 if persistent-m128 / persistent (the two x / new medians) is > 1.01 at N 512 and 1k, causal and not, and < 0.99
# nowhere within the short limit.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/short"; gpu_session "$out/logs" "$@"
SHAPES=64:1024:causal,128:1024:causal,64:1536:causal,128:1536:causal,64:1536:full,128:1536:full,64:2048:full
SHAPES=$SHAPES,128:2048:full,64:512:full,64:1024:full
VARIANTS=old,new,persistent,persistent-m128
step precompile 60 python3 scripts/fa3_speed_ab.py --precompile 8 --precompile-fa4 --variants $VARIANTS \
  --shapes "$SHAPES"
NPROC=$(xdist_flag 8)
step pytest 60 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfE tests/test_fa3_gpu.py \
  -k "short_calls_run_persistent or (persistent_variants and (d64 or d128))"
step sanitize 90 python3 scripts/sanitize.py --tools memcheck racecheck synccheck --backends fa3 --head-dims 64 128 \
  --per-head-dim --precompile --timeout 80 --out "$out/sanitize"
step speed_ab 120 python3 scripts/fa3_speed_ab.py --variants $VARIANTS --shapes "$SHAPES" \
  --peers flash-attn-4,sdpa-cudnn --burst-ms 10 --out "$out/ab"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
grep -qE "(^|[^0-9])16 passed" "$out/logs/pytest.log" || step_failed pytest "not 12 passed"
echo "== sanitize"; grep -E "clean|error|WRONG|FAILED" "$out/logs/sanitize.log" | head -n 12
echo "== speed_ab"; grep -E "^SUMMARY D|persistent(-m128)?/new" "$out/logs/speed_ab.log" | head -n 36
steps_exit
