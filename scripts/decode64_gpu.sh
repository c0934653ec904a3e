#!/usr/bin/env bash
# decode64_gpu.sh: issue 13, session 12, on one H200 (<= 100 s cold): decode at head_dim 64, batch 1, Nk 32k reads K/V at
# 62-64% of HBM (70% asked). The lever: the split-KV merge inside the split kernel (FA_VARIANTS_FUSED_MERGE=decode, off)
# with first_row_only kept and the last CTA's merge in one memory latency (_merge_tile_one_pass), instead of the merge
# kernel after it.
#
#   source .gpu/env.sh; scripts/decode64_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Model (bench/NOTES.md, "Session 12 (2026-12-02): decode at head_dim 64 ..."): a B 1 Nk 32k call is 16 splits x 16
# K/V tiles on 128 SMs, streaming at ~4.47 TB/s plus a fixed ~6.7 us; 70% (20.0 us for 67 MB) needs ~5.0. The s6
# profile's pieces at 16 splits: split kernel ~4 us not streaming, gap 0.56 us, warp merge kernel 2.11 us. The fused
# tail (gpu fence + atomic ~1.1 us, one load latency ~0.5, compute + store ~0.2) replaces the gap and the merge kernel.
# 0. scripts/decode64_precompile.py: 27 kernels (the A/B's, `auto`'s at its shapes, the tests', 8 merges), 16 processes.
# 1. GPU tests (-n 8, 45), tests/test_decode_fused_gpu.py vs float64 (O and LSE, outputs and split scratch NaN-poisoned):
#    D 64 through `auto` with FUSED_MERGE decode (32:8, 64:8, MQA; Nk 129 - 32768, odd; split counts 1 / 5 (PDL) /
#    16 (one pass) / 17 (two pass) / the heuristic's; empty splits; seqlens_k with lengths 0 and 1, causal and not;
#    counters back at 0), the packed fused kernels at D 64 / 128 with 2 / 16 / 150 splits, fused = two kernels within
#    rounding, CUDA-graph replay (plain and PDL).
# 2. scripts/decode_ab.py --s12: auto vs fused1 beside SDPA, 20 shapes (D 64 B 1 / 8, Nk 32k / 128k, seqlen_q 1 / 16,
#    32:8 / 64:8; D 128 B 1 Nk 32k; B 1 Nk 4k / 1k and B 8 Nk 1k split guards); fused1 is not timed where it runs what
#    auto runs (seqlen_q 16: "-"). CUDA graphs, 5 rotated rounds, median; HBM % at Nk >= 32k.
# 3. scripts/decode64_verdict.py: fused1 / auto per shape, HBM %, FLIP or KEEP.
# 4. if >= 8 s of the 100 are left: scripts/decode_profile.py --s12 (D 64 32:8 B 1 Nk 32k / 4k; auto, fused1, sdpa: the
#    kernels of one call, their sum and the span per call, torch.profiler on a graph replay): the model's pieces;
#    information only (an rc other than 0 there shows in "not passed" but is not a pass line).
# Pass: (1) 0 failed / 0 errors; (2) no BAD/ERR cell, "compiles" 0; (3) prints a verdict line.
# Flip rule (for the lead): FUSED_MERGE default "decode" if (1) passes, fused1 / auto geomean <= 0.97 at D 64 B 1 Nk 32k
# seqlen_q 1 (both group sizes) and <= 1.02 at every shape fused1 ran; else KEEP (and the switch goes).
# Prediction: fused1 / auto 0.94-0.985 at D 64 B 1 Nk 32k Nq 1 (21.8 / 22.4 -> 20.5-21.5 us; HBM 62-64 -> 65-68%: 70% NOT
# reached), 0.985-0.995 at B 1 Nk 128k, 0.99-1.00 at B 8 (2 splits, its merge already a PDL dependent), 0.97-0.99 at
# D 128 B 1 Nk 32k, 0.85-0.95 at B 1 Nk 4k, 0.90-1.00 at Nk 1k, 0.95-1.02 at B 8 Nk 1k. Verdict FLIP likely (~60%).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/decode64}"; gpu_session "$out/logs" "$@"
VARIANTS=(fused1)
step precompile 40 python3 scripts/decode64_precompile.py --jobs 16 --variants "${VARIANTS[@]}"
NPROC=$(xdist_flag 8)
step pytest 27 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_decode_fused_gpu.py \
  -k "decode64 or (packed_decode and not x96 and not x256 and (splits2 or splits16 or splits150)) or fused_equals or cuda_graph_replay"
step decode_ab 30 python3 scripts/decode_ab.py --s12 --no-precompile --rounds 5 --variants "${VARIANTS[@]}" \
  --out "$out/decode_ab"
step verdict 3 python3 scripts/decode64_verdict.py "$out/decode_ab/decode_ab.json"
left=$((97 - SECONDS))  # the profile only inside the 100 s: information for the model, not a pass line
if (( left >= 8 )); then step profile $(( left < 15 ? left : 15 )) python3 scripts/decode_profile.py --s12 --out "$out/profile"
else echo "== profile: skipped (${left}s left of the budget)"; fi
echo "== precompile"; tail -n 2 "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
echo "== decode_ab"; grep -E "^\| D|geomean|compiles|counters|vs auto" "$out/logs/decode_ab.log" | cut -c1-170 | tail -n 30
grep -qE "BAD|ERR" "$out/decode_ab/decode_ab.md" 2>/dev/null && step_failed decode_ab "BAD/ERR cell"
echo "== verdict"; cat "$out/logs/verdict.log"
[[ -f $out/logs/profile.log ]] && { echo "== profile"; grep -E "^PROFILE" "$out/logs/profile.log" | cut -c1-220; }
steps_exit
