#!/usr/bin/env bash
# decode5_gpu.sh: issue 13, session 6, on one H200 (<= 150 s): fa3 decode defaults flipped from the s6 morning A/B
# (one-tile splits, PDL at 2-8 splits) and three switches, off by default: the merge with LSEs in registers
# (FA_VARIANTS_MERGE_WARP=1), 128-row packed tiles for 64:8 at Nq 16 (FA_VARIANTS_PACK_WIDE=1), two CTAs per SM for
# B x Hkv >= 64 at Nk <= 4k (FA_VARIANTS_DECODE_TILES=auto).
#
#   source .gpu/env.sh; scripts/decode5_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/decode5_precompile.py: the 60 kernels below (24 fa3, 36 merges) compiled in 16 processes into the disk
#    cache.
# 1. GPU tests of what changed (-n 4), tests/test_decode_gpu.py: both merge kernels vs the torch merge (1-150 splits,
#    bf16/fp16, D 64-256, plain/PDL, NaN and empty splits) and batch invariance; `auto` with the new defaults (split
#    count, PDL flag, five fresh Qs and a CUDA-graph replay, both merges); one-tile splits; 128-row packed tiles
#    (64:8, Nq 9-16, odd Nk, Nq > Nk causal, split and not) explicit and through `auto`; dual tiles through `auto`.
#    All vs float64 (O and LSE), outputs NaN-poisoned.
# 2. scripts/decode_ab.py --s6 (29 shapes: the 22 seqlen_q = 1 shapes ours lost this morning at B 1 / 8, Nk 1k-32k,
#    2 unsplit B 64 controls, the 9 Nk 32k shapes under 70% of HBM at Nq 4 / 16, 2 wide-tile guards): `auto` (new
#    defaults) vs old (the defaults before), warp, dualauto, wide, cand (all three), beside SDPA; CUDA graphs, 4
#    rotated rounds; last lines: per variant shapes <= SDPA and geomean, then HBM % at Nk 32k.
# 3. scripts/decode_profile.py with the min1-warp entry: per-kernel times of B 1 Nk 1k / 4k, the merge kernel's
#    own time smem vs warp (min1 vs min1-warp, same split kernel, no PDL).
# Pass: (1) 0 failed / 0 errors. (2) no BAD/ERR cell. Predictions (scripts/decode_model.py + the s6 morning data):
#  - auto vs old: B 1 Nk 1k 0.80-0.90x old (min1+pdl2 this morning: 0.94-1.04x SDPA; old 1.22-1.27x); B 8 Nk 1k/4k
#    0.95-0.98x old (pdl at 2 splits); B 1 Nk 4k/32k and B 64 the same as old within 3% (same config).
#  - warp vs auto: merge kernel 0.3-0.6 us less (profile: min1-warp merge ~1.9-2.3 us vs min1's 2.6-2.7 at Nk 1k,
#    ~2.6 vs 3.2 at Nk 4k); call time 2-8% less at B 1 / 8 split shapes, none at B 64 (no merge).
#  - dualauto vs auto at B 8 / 64 Nk <= 4k: 0.85-1.0x (s4: dual 0.94-1.11x SDPA where base was 1.00-1.20x, and
#    now 4 splits at B 8, the heuristic counting 2 CTA slots per SM); D 64 B 64 Nk 1k ~1.02x SDPA (from 1.14x);
#    elsewhere identical to auto.
#  - wide vs auto at 64:8 Nq 16: D 64 B 64 Nk 32k 1900 -> 1000-1250 us (47% -> 70-90% of HBM), B 8 218 -> 130-160,
#    B 1 35.7 -> 24-28 us; D 128 64:8 B 64 2810 -> 1900-2200 us, B 1 45 -> 38-41; 32:8 shapes unchanged.
#  Flip rules for the lead: each switch whose variant is <= auto on every shape it changes (within 2%) and fixes
#  >= 1 loss (<= SDPA) or an HBM miss (>= 70%) may become the default: MERGE_WARP (split_combine.MERGE_WARP),
#  PACK_WIDE (fa3.PACK_WIDE), DECODE_TILES auto (fa3.DECODE_TILES_CHOICE); if auto > old anywhere by > 3%,
#  revert that shape class (FA_VARIANTS_DECODE_PDL_MAX_SPLITS / FA_VARIANTS_SPLIT_MIN_TILES give the old values).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/decode5}"; gpu_session "$out/logs" "$@"
VARIANTS=(old warp dualauto wide cand)
step precompile 40 python3 scripts/decode5_precompile.py --jobs 16 --variants "${VARIANTS[@]}"
NPROC=$(xdist_flag 4)
TESTS="merge_kernel_equals or merge_kernel_is_batch or auto_decode_defaults or wide_packed or auto_runs_wide"
step pytest 45 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_decode_gpu.py \
  -k "$TESTS or one_tile or dual_auto"
step decode_ab 50 python3 scripts/decode_ab.py --s6 --no-precompile --rounds 4 --variants "${VARIANTS[@]}" \
  --out "$out/decode_ab"
step profile 15 python3 scripts/decode_profile.py --out "$out/decode_profile"
echo "== precompile"; tail -n 2 "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
echo "== decode_ab"; grep -E "^\| D|geomean|compiles|^HBM|^  D" "$out/logs/decode_ab.log" | cut -c1-150 | tail -n 56
echo "== profile"; grep -E "^PROFILE|Error" "$out/logs/profile.log" | cut -c1-230
steps_exit
