#!/usr/bin/env bash
# decode7_gpu.sh: issue 13, session 7, on one H200 (<= 100 s): the warp merge timed for real, PDL at 16 splits and the
# softmax of decode's padding row skipped (FA_VARIANTS_DECODE_FIRST_ROW), all off by default then. (Its 3 / 4 K/V
# stages for the 128-row packed tiles, wide3 / wide4 / cand7, were measured slower and removed in session 8.)
#
#   source .gpu/env.sh; scripts/decode7_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Why: decode5's "warp" A/B entry (public path) reused `auto`'s launch step, whose merge was bound at planning
# (common.launch keyed steps by config; MERGE_WARP is not in the config), so it timed the shared-memory merge: warp
# "= auto" there, while its profile (fa3.run, a fresh plan) had the warp merge 1.1-1.2 us faster at 16 splits (D 64 B 1
# Nk 4k span 7.50 vs 8.76 us, SDPA 7.68). Fixed (steps keyed by config and switch state). At seqlen_q 1 the 64-row
# tile holds G <= 8 real rows, all in the first of each thread's two rows: first_row_only halves MUFU.EX2 / FMNMX /
# SHFL / FMUL in the kernel (SASS, D 64 split: 130 -> 65 EX2), for split CTAs bound by their consumer per K/V tile.
# 0. scripts/decode7_precompile.py: 25 kernels (17 fa3, 8 merges) compiled in 16 processes into the disk cache.
# 1. GPU tests (-n 4), tests/test_decode_gpu.py: `auto`'s decode defaults with both merges (split count, PDL, five
#    fresh Qs, a CUDA-graph replay); a MERGE_WARP flip re-plans the public path (binds the warp merge, and back);
#    first_row_only explicit (groups 4 / 8, MQA, Nk 5-4097, unsplit and split) and through `auto` (base and dual
#    tiles, PDL, graph replay). All vs float64, O and LSE, outputs NaN-poisoned.
# 2. scripts/decode_ab.py --s7 (19 shapes: D 64 Nq 1 still > SDPA - B 1 Nk 4k / 32k, B 8 Nk 1k, B 64 Nk 1k; split
#    controls at D 128 and B 1 Nk 1k; the Nk 32k Nq 16 shapes under 70% of HBM): auto vs warp, warp+pdl16 (PDL up to
#    16 splits), row1 (first_row_only), beside SDPA; an entry that runs
#    what auto (or a variant before it) runs at a shape is not timed ("-"). CUDA graphs, 5 rotated rounds. Last
#    lines: ratios to SDPA, HBM % at Nk 32k, and each variant / auto (faster n / m, geomean, best, worst).
# Pass: (1) 0 failed / 0 errors. (2) no BAD/ERR cell; "compiles" 0. Predictions (bench/NOTES.md, "Session 7
# (2026-12-01): decode"):
#  - warp / auto: 16 splits (B 1 Nk 4k / 32k) 0.86-0.92 at Nk 4k (-1.0..-1.2 us: D 64 8.9 -> ~7.8 us, SDPA 7.9; D 128
#    10.0 -> ~8.9, SDPA 9.5), 0.94-0.97 at Nk 32k (D 64 23.1 -> ~22.0, 61 -> ~64% of HBM; D 128 32:8 Nq 16 41.4 ->
#    ~40.3, 68 -> ~70%); 8 splits with PDL (B 1 Nk 1k) 0.93-1.0; 2 splits (B 8 Nk 1k) 0.95-1.0.
#  - row1 / auto: B 8 Nk 1k (4 tiles per CTA) 0.90-0.95 (D 64 9.1 -> ~8.4 us, SDPA 8.4), B 1 Nk 4k (2 tiles) 0.94-0.98,
#    B 1 Nk 1k 0.95-1.0, B 64 Nk 1k (dual, 8 tiles) 0.93-1.0, B 1 Nk 32k 0.97-1.0 (bytes-bound).
#  - warp+pdl16 / warp at 16 splits: unknown sign (s4: pdl2 at 16 splits lost 7-25% with the smem merge).
#  Flip rules for the lead: MERGE_WARP on (common/split_combine.py) if warp / auto geomean < 0.98 and worst <= 1.02;
#  DECODE_FIRST_ROW on (hopper/fa3.py) if row1 / auto geomean < 0.98 and worst <= 1.02; DECODE_PDL_MAX_SPLITS 16 if
#  warp+pdl16 <= warp at every 16-split shape.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/decode7}"; gpu_session "$out/logs" "$@"
VARIANTS=(warp warp+pdl16 row1)
step precompile 35 python3 scripts/decode7_precompile.py --jobs 16 --variants "${VARIANTS[@]}"
NPROC=$(xdist_flag 4)
step pytest 32 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_decode_gpu.py \
  -k "auto_decode_defaults or merge_warp_flip or first_row"
step decode_ab 28 python3 scripts/decode_ab.py --s7 --no-precompile --rounds 5 --variants "${VARIANTS[@]}" \
  --out "$out/decode_ab"
echo "== precompile"; tail -n 2 "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
echo "== decode_ab"; grep -E "^\| D|geomean|compiles|^HBM|^  D|^GPU time|vs auto" "$out/logs/decode_ab.log" | cut -c1-170 | tail -n 50
steps_exit
