#!/usr/bin/env bash
# decode8_gpu.sh: issue 13, session 7 (second decode round), on one H200 (<= 90 s): the Nk 32k decode shapes under 70% of HBM after the session
# 7 flips, with PDL at 16 splits (seqlen_q 1, an existing switch), PDL for packed seqlen_q > 1 split calls
# (FA_VARIANTS_PACK_ROWS_PDL) and two CTAs per SM for packed seqlen_q > 1 calls of >= 8 splits in 64-row tiles
# (FA_VARIANTS_PACK_ROWS_DUAL), all off by default.
#
#   source .gpu/env.sh; scripts/decode8_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Why (bench/NOTES.md, "Session 7 (2026-12-01): decode at B 1, Nk 32k"): 7 of the 9 shapes under 70% are batch 1, 16
# splits of 16 K/V tiles, with ~6 us of fixed cost (launch, prologue, first tile, merge, gaps) on a 20 us budget;
# PDL hides part of it (decode7: warp+pdl16 68% at D 64 32:8 Nq 1). At D 64 32:8 Nq 16 and D 128 64:8 Nq 16 the
# 64-row tile's one consumer warpgroup per SM sets the time per tile (1.1 / 1.4 us where the bytes need ~1.0 / 2.0);
# two CTAs per SM run one's softmax under the other's GEMMs.
# 0. scripts/decode8_precompile.py: 34 kernels (26 fa3, 8 merges) in 16 processes into the disk cache (decode7's 34: 19 s).
# Step limits 24 + 30 + 28 s.
# 1. GPU tests (12, one process), tests/test_decode_gpu.py -k pack_rows: the dual pack_group configs with and without PDL (groups
#    4 / 8, D 64 / 128, Nq 4-16, odd Nk, 8-33 splits: past the 32 the warp merge loads at once) and `auto` with both
#    switches (config fields, three fresh Qs, a CUDA-graph replay after a new Q); O and LSE vs float64, NaN-poisoned.
# 2. scripts/decode_ab.py --s8 (13 shapes: the 8 split shapes under 70%, controls D 128 32:8 B 1 Nq 16 (70%), B 1 Nk 4k
#    Nq 1 / 16, B 8 Nk 1k Nq 16): auto vs pdl16, rowspdl (+ PDL up to 16 splits), rowsdual, rowsdual+pdl (PDL up to 32),
#    beside SDPA; an entry equal to auto (or a variant before it) at a shape is not timed ("-"). CUDA graphs, 5
#    rotated rounds. Last lines: ratios to SDPA, HBM % at Nk 32k, each variant / auto.
# Pass: (1) 0 failed / 0 errors. (2) no BAD/ERR cell; "compiles" 0.
# Predictions (GPU time / auto):
#  - pdl16 (seqlen_q 1, 16 splits): 0.93-1.01 at B 1 Nk 32k (D 64 21.7 -> 20.3-21.7 us, 64 -> 64-68% of HBM), 0.85-1.05 at
#    Nk 4k (decode7, before first_row_only: 0.88-1.06 vs warp).
#  - rowspdl: B 1 Nk 32k 0.95-0.99 (D 64 32:8 Nq 4 22.4 -> 21.3-22.1 us, Nq 16 24.0 -> 22.9-23.6, 64:8 Nq 16 29.2 ->
#    28.1-28.9, D 128 64:8 Nq 16 51.4 -> 50.3-51.0); B 8 Nk 32k (2 splits) 0.99-1.0; B 1 Nk 4k Nq 16 0.85-0.95.
#  - rowsdual: D 64 32:8 Nq 16 B 1 Nk 32k 0.90-0.96 (58 -> 61-65%), D 128 64:8 Nq 16 0.82-0.93 (54 -> 58-66%), Nq 4
#    (bytes and fixed cost) 0.97-1.03, D 128 32:8 Nq 16 0.95-1.03, B 1 Nk 4k Nq 16 0.95-1.10 (a 32-split merge).
#  - rowsdual+pdl about the product. 70% of HBM: not reached at B 1 D 64 by any (fixed cost); maybe 64-68% at best.
# Flip rules for the lead: DECODE_PDL_MAX_SPLITS 16 if pdl16 / auto geomean < 0.98 and worst <= 1.02; PACK_ROWS_PDL on
# (with DECODE_PDL_MAX_SPLITS 16) if that holds and rowspdl / auto geomean < 0.98 and worst <= 1.02; PACK_ROWS_DUAL on
# if rowsdual / auto geomean < 0.97 and worst <= 1.02 (with PDL, and MAX_SPLITS 32, if rowsdual+pdl beats rowsdual by
# the same rule). Otherwise nothing flips (noise: decode7's two seqlen_q 1 group sizes, one kernel, differed by 5%).
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
out="${OUT:-results/decode8}"; session_setup "$out/logs"
VARIANTS=(pdl16 rowspdl rowsdual rowsdual+pdl)
step precompile 24 python3 scripts/decode8_precompile.py --jobs 16 --variants "${VARIANTS[@]}"
step pytest 30 python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_decode_gpu.py \
  -k "pack_rows"
step decode_ab 28 python3 scripts/decode_ab.py --s8 --no-precompile --rounds 5 --variants "${VARIANTS[@]}" \
  --out "$out/decode_ab"
echo "== precompile"; tail -n 2 "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
echo "== decode_ab"; grep -E "^\| D|geomean|compiles|^HBM|^  D|^GPU time|vs auto" "$out/logs/decode_ab.log" | cut -c1-170 | tail -n 40
