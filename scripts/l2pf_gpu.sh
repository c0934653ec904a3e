#!/usr/bin/env bash
# l2pf_gpu.sh: issue 13, session 15, on one H200: fa3's split calls (decode) with the producer prefetching K and V
# tiles into L2 ahead of its loads (Sm90Config.l2_prefetch, FA_VARIANTS_SPLIT_L2_PREFETCH, off), 2 / 4 / 8 tiles
# ahead, beside `auto` as shipped and SDPA. ~200-260 s on a cold machine (limits 45 + 150 + 90: the tests compile ~30
# kernels of their own, the A/B auto's first_row_only / PDL kernels, which decode_ab's precompile does not cover).
#
#   source .gpu/env.sh; scripts/l2pf_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Why (bench/NOTES.md, "Session 15 (2026-12-02): decode, K/V prefetched into L2; predictions before the run"): at
# D 64 B 1 Nk 32k (32:8) the split kernel streams 67 MB in ~19 us (3.5 TB/s, 128 CTAs of 16 K/V tiles) with 2 stages
# of K + V in shared memory (64 KiB in flight per SM): 27 GB/s per SM over 64 KiB is ~2.4 us per round trip, the
# loaded HBM latency; D 128 (128 KiB in flight) reaches 75 %. A TMA prefetch into L2 puts more bytes in flight with no
# shared memory, so a stage that frees reads its next tile from L2.
# 0. scripts/decode_ab.py --s15 --compile-only: the split kernels of pf2 / pf4 / pf8 at the S15 shapes (16 processes).
# 1. GPU tests (tests/test_decode_gpu.py -k l2_prefetch, 4 tests, -n 4): with the switch at 2 and 4, `auto`'s calls
#    (split and not: walks of 1 to 16 tiles per CTA, odd lengths, seqlen_q 1 / 4 / 113, GQA, D 64 / 96 / 128 / 256, causal
#    and not) give O and LSE equal to the calls without it bit for bit, and pass the reference check.
# 2. scripts/decode_ab.py --s15 --rounds 5 --variants pf2 pf4 pf8: GPU time per call of SDPA (auto), ours as shipped
#    (auto) and the three distances at D 64 B 1 Nk 32k (32:8, 64:8) / 128k, D 128 B 1 Nk 32k / 128k, D 64 B 1 Nk 32k
#    seqlen_q 4, D 64 B 8 Nk 32k, and guards at Nk 4k / 1k; HBM share at Nk >= 32k; x / auto per variant.
# Pass: (0) no Traceback; (1) "4 passed"; (2) no BAD / ERR cell (every entry checked against SDPA).
# Prediction: pf4 / auto 0.88-0.97 at D 64 B 1 Nk 32k (19 -> 16.5-18 us of kernel: 66-72 % of HBM for the call),
# 0.93-1.00 at D 128 B 1 Nk 32k and at Nk 128k (already 75-84 %), 0.98-1.03 at Nk 4k / 1k and B 8; pf2 between auto
# and pf4; pf8 like pf4 or slower (L2 thrash: 8 tiles x 32 KiB x 128 CTAs = 32 MiB of L2's 50 at D 64, 64 MiB at
# D 128).
# Flip rule: FA_VARIANTS_SPLIT_L2_PREFETCH's default becomes the best N if the tests pass, its geomean x / auto over
# the five B 1 Nk >= 32k seqlen_q 1 shapes is <= 0.97 and no shape is above 1.02; else it stays 0.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/l2pf"; gpu_session "$out/logs" "$@"
VARIANTS=(pf2 pf4 pf8)
step precompile 45 python3 scripts/decode_ab.py --s15 --compile-only --jobs 16 --variants "${VARIANTS[@]}"
NPROC=$(xdist_flag 4)
step pytest 150 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_decode_gpu.py \
  -k l2_prefetch
step decode_ab 90 python3 scripts/decode_ab.py --s15 --no-precompile --rounds 5 --variants "${VARIANTS[@]}" \
  --out "$out/decode_ab"
echo "== precompile"; grep -E "Traceback|Error" "$out/logs/precompile.log" | head -n 5; tail -n 2 "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
grep -qE "^4 passed|[^0-9]4 passed" "$out/logs/pytest.log" || step_failed pytest "not 4 passed"
echo "== decode_ab"; grep -E "^\| D|geomean|HBM|^  D|vs auto" "$out/logs/decode_ab.log" | cut -c1-170 | tail -n 40
grep -qE "BAD|ERR" "$out/decode_ab/decode_ab.md" 2>/dev/null && step_failed decode_ab "BAD/ERR cell"
steps_exit
