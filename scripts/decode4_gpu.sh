#!/usr/bin/env bash
# decode4_gpu.sh: issue 13, session 5, on one H200: one-tile splits for short-Nk decode (FA_VARIANTS_SPLIT_MIN_TILES=1)
# and fa2's 64-row tiles for few-row queries (FA_VARIANTS_FA2_NARROW_DECODE=1), both off by default. ~4 min.
#
#   source .gpu/env.sh; scripts/decode4_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/decode4_precompile.py: the 24 kernels below compiled in 16 processes into the disk cache.
# 1. GPU tests of what changed (-n 4): tests/test_decode_gpu.py -k one_tile (fa3 `auto` with one-tile splits: B 1-2
#    Nk 130/1000/1024/4096, 32:8 and 64:8, D 64/128, two kernels and merge PDL, vs float64, O and LSE) and
#    tests/test_fa2_split_gpu.py -k narrow (fa2 narrow config, explicit and `auto`, seqlen_q 4/5/16/64, odd lengths,
#    causal rows seeing no key, NaN-poisoned outputs, vs float64).
# 2. scripts/decode_ab.py --short-nk: D 64/128 x 32:8/64:8 x B 1/8 x Nk 1k/4k at seqlen_q 1, and 4 long-Nk / full-grid
#    controls: auto (old) vs min1 (one-tile splits), min1+pdl, min1+pdl2, and pdl2 (old count with PDL), beside SDPA
#    (CUDA graphs, 4 rotated rounds).
# 3. scripts/fa2split_bench.py on B 8/64 x Nq 4/16 x Nk 1k/4k (32:8, D128): fa2 auto (unsplit, 128-row tiles) vs narrow.
# 4. FA_VARIANTS_SPLIT_MIN_TILES=1 `fa-variants bench --decode` at Nk 1k/4k/32k (all batches, Nq, GQA, head dims:
#    108 cases; ours and SDPA; flash-attn-4 left out: it compiles per shape), with its summary.
# 5. scripts/decode_profile.py: per-kernel times (torch.profiler on a CUDA-graph replay) of B 1 Nk 1k/4k D 64/128,
#    auto / min1 / SDPA: split kernel, merge kernel, and the gaps between them (the model's FIXED / MERGE split).
# Pass: (1) 0 failed / 0 errors. (2) no BAD/ERR cell; predicted (scripts/decode_model.py): min1 below auto at the four
# B1 Nk1024 rows (8 splits instead of 4: ~0.65 us less, D128 ~7.6 us, D64 ~7.4) and within +-3% of auto on the other
# 16 rows (same split count: an A/A check); min1+pdl2 at B1 Nk1024 ~6.3-6.5 us (SDPA 5.7-6.8). If min1 < auto on all
# four rows and no row > 1.03x auto: FA_VARIANTS_SPLIT_MIN_TILES's default may become 1 (common/split.py).
# (3) no BAD; predicted narrow/split 0.5-0.65 (half the MMA rows; more if 64-row tiles are shared-memory bound) and
# narrow/sdpa 0.85-1.3; if narrow/split < 0.9 everywhere, fa2.NARROW_DECODE may default on.
# (4) the table and its summary print (108 cases, no ERR rows). (5) informative; the model's guess at B1 Nk1k D128
# auto (8.4 us): split kernel ~4 us (prologue 1.5-2 + 2 tiles 1.7 + epilogue), merge ~1 us, gaps ~3 us. Small gaps
# would put the fixed cost inside the kernels (prologue), out of PDL's reach.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/decode4}"; gpu_session "$out/logs" "$@"
VARIANTS=(pdl2 min1 min1+pdl min1+pdl2)
NK=1024,4096,32768
step precompile 75 python3 scripts/decode4_precompile.py --jobs 16 --variants "${VARIANTS[@]}" --nk "$NK"
NPROC=$(xdist_flag 4)
step pytest 40 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX \
  tests/test_decode_gpu.py tests/test_fa2_split_gpu.py -k "one_tile or narrow"
step decode_ab 50 python3 scripts/decode_ab.py --short-nk --no-precompile --rounds 4 --variants "${VARIANTS[@]}" \
  --out "$out/decode_ab"
step fa2narrow 20 python3 scripts/fa2split_bench.py --batch 8 64 --nq 4 16 --nk 1024 4096 --rounds 3 --out "$out/fa2narrow"
step bench_decode 40 env FA_VARIANTS_SPLIT_MIN_TILES=1 python3 -m fa_variants.cli bench --decode --decode-nk "$NK" \
  --decode-no-fa4 --no-progress --out "$out/bench_decode"
step profile 15 python3 scripts/decode_profile.py --out "$out/decode_profile"
echo "== precompile"; tail -n 2 "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
echo "== decode_ab"; grep -E "^\| D|geomean|compiles" "$out/logs/decode_ab.log" | cut -c1-150 | tail -n 27
echo "== fa2narrow"; grep -A14 "^fa2 narrow" "$out/logs/fa2narrow.log"
echo "== bench_decode"; grep -E "^interrupted|^summary|^  " "$out/logs/bench_decode.log" | tail -n 6
echo "== profile"; grep -E "^PROFILE|Error" "$out/logs/profile.log" | cut -c1-230
steps_exit
