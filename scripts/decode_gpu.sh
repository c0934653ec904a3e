#!/usr/bin/env bash
# decode_gpu.sh: split-KV and packed GQA (issue 13) on one H200: their GPU tests, then the decode table.
#
#   source .gpu/env.sh; scripts/decode_gpu.sh          (repository root; writes under $OUT; ~2-3 min)
#
# 1. tests/test_decode_gpu.py (fa3 split-KV vs float64 over the decode matrix and forced counts 2/3/16/32/auto,
#    rows that see no key, split count = rounding only, batch invariance at a fixed count, the switch off,
#    auto through the API, CUDA-graph replay, seqlens_k at Nq 1 and 4; packed GQA at Nq = 1 vs float64 for
#    GQA 32:8 / 64:8 / 8:2, MQA, MHA, group 128, splits 1/3/auto, causal, in auto's 64-row tile (one consumer
#    warpgroup: test_packed_* and test_packed_tile_heights_agree), packed = unpacked maths, auto packing
#    B=64 and B=1 through the API; num_splits= / pack_gqa= through the API; the merge kernel
#    common.split_combine vs split.merge with empty / NaN splits, bitwise batch-invariant, fa3 with either merge)
#    and EC-08 / EC-19 of tests/test_edge_cases.py
#    (EC-19: bitwise at equal split counts, the rule's bound where auto splits one call and not the other).
# 2. `fa-variants bench --decode --quick`: ours (auto, now split) beside SDPA and flash-attn-4.
# Must show: 0 failed, 0 xfailed in (1); in (2) ours' GPU time at Nq = 1, B = 1 well below the split-off
# figures of bench/h200-2026-11-30/session2/decode_before.md (50.5 us at Nk = 4k, 1476 us at Nk = 128k), and
# at Nq = 1, B = 64, Nk = 4k, 32:8 (packed: K/V read once per KV head) well below its 796 us there.
# If only the 64-row tile fails (test_packed_tile_heights_agree[64] and the packed tests, [128] passing): revert
# the commit "packed GQA in 64-row tiles" alone. If packing fails: FA_VARIANTS_PACK_GQA=0 turns it off (auto); split-KV alone: FA_VARIANTS_SPLIT_KV=0; the merge
# kernel: FA_VARIANTS_MERGE_KERNEL=0 (torch merge). Host us of ours at B = 1 should drop from ~315 us
# (session2/decode_split.md, torch merge) toward the unsplit ~70 us.
set -uo pipefail
out="${OUT:-results/decode-gpu}"; mkdir -p "$out"/logs
LOGS="$out/logs"; source "$(dirname "$0")/steps.sh"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv > "$out/logs/gpu.txt" 2>&1
git log --oneline -1 > "$out/logs/commit.txt" 2>&1
step pytest 240 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider --tb=short -rfEX \
  tests/test_decode_gpu.py tests/test_edge_cases.py -k "decode_gpu or ec19 or ec08"
step decode 120 python3 -m fa_variants.cli bench --decode --quick --no-progress --out "$out/logs/decode"
tar -C "$out" -czf "$out/logs.tgz" logs
echo "== pytest"; grep -E "^(FAILED|ERROR|XPASS|XFAIL)|passed|failed" "$out/logs/pytest.log" | tail -n 30
echo "== decode"; cat "$out"/logs/decode/*.md 2>/dev/null || tail -n 40 "$out/logs/decode.log"
