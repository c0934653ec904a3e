#!/usr/bin/env bash
# decode9_gpu.sh: issue 13, session 8, on one H200 (<= 75 s on a cold machine): seqlen_q 1 decode at batch 64 (unsplit), where
# D 64 64:8 / 32:8 B 64 Nk 1k were the last shapes slower than SDPA (s7: 1.011 / 1.008x). Two switches, off by default:
# FA_VARIANTS_DECODE_FULL_GRID=persistent|persistent3 (a persistent grid, 2 / 3 K/V stages, where `auto` runs the dual
# tiles: B x Hkv >= 512, Nk <= 4k) and FA_VARIANTS_DECODE_PDL_MIN_SPLITS=1 (unsplit packed seqlen_q 1 calls as
# programmatic dependents).
#
#   source .gpu/env.sh; scripts/decode9_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Why (bench/NOTES.md, "Session 8 (2026-12-01): decode at batch 64 ..."): the dual grid at B 64 x 8 KV heads is 512 CTAs of
# 8 K/V tiles on 264 slots: two waves in step, each paying launch / prologue / first-tile latency / drain (~2.7 us) with
# nothing else in flight on the SM (scripts/decode_model.py --full-grid: 35.6 us = 1.0 + 2 x 2.7 + 134 MB at 4.6 TB/s).
# A persistent CTA (one per SM) loads the next (batch, KV head) tile's Q and K/V while it finishes the current one.
# 0. scripts/decode9_precompile.py: 14 kernels in 14 processes into the disk cache (one round). Step limits 50 + 40 + 45 s.
# 1. GPU tests (17, one process), tests/test_decode_gpu.py -k "pdl_unsplit or persistent": the persistent packed configs
#    (2 / 3 stages, groups 2 / 4 / 8 / 16, D 64 / 128, odd Nk, 24-520 work tiles) vs float64 (O, LSE, NaN-poisoned, fresh
#    Q), `auto` with each switch (config fields, five fresh Qs, a CUDA-graph replay after a new Q). PDL tests run first.
#    A variant whose tests did not all pass is left out of step 2 (pdl1 needs 3 PASSED pdl_unsplit, pers* 14 persistent).
# 2. scripts/decode_ab.py --s9 (9 shapes: B 64 Nq 1 Nk 1k / 4k at D 64 / 128, 32:8 / 64:8, and D 64 32:8 Nk 32k (base
#    tiles, pdl1 only)): auto vs pdl1, pers, pers3, pers+pdl1 beside SDPA, CUDA graphs, 6 rotated rounds. Last lines:
#    ratios to SDPA, each variant / auto.
# Pass: (1) 0 failed / 0 errors. (2) no BAD/ERR cell; "compiles" 0.
# Predictions (GPU time / auto; auto s7: D64 Nk1k 35.4-35.8 us, SDPA 35.0-35.5):
#  - pers: Nk 1k 0.92-0.97 at D 64 (-> 33-34.5 us, 0.94-0.98x SDPA), 0.93-0.99 at D 128; Nk 4k 0.97-1.00.
#  - pers3 / pers 0.98-1.04 (better only if one CTA's 64 KiB in flight does not hold HBM; s4: 4-stage base tiles 1.06x 2-stage).
#  - pdl1: 0.97-1.00 at Nk 1k (s4 pdl2 at unsplit base B 64 Nk 1k: 0.99), 0.99-1.00 at Nk 4k / 32k; pers+pdl1 ~ the product.
# Flip rules for the lead: DECODE_FULL_GRID=X (pers or pers3, the better geomean) if its tests pass, X / auto geomean over the
# 8 Nk <= 4k shapes < 0.98, worst <= 1.02, and X / SDPA <= 0.99 at both D 64 Nk 1k shapes. DECODE_PDL_MIN_SPLITS=1 if pdl1 /
# auto geomean < 0.98 and worst <= 1.02 over the 9 shapes, or (with the grid flip) pers+pdl1 / X geomean < 0.98, worst <= 1.02.
# Otherwise nothing flips (decode7: two group sizes running one kernel differed by up to 5%: a 2% effect needs the rule above).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/decode9}"; gpu_session "$out/logs" "$@"
VARIANTS=(pdl1 pers pers3 pers+pdl1)
step precompile 50 python3 scripts/decode9_precompile.py --jobs 14 --variants "${VARIANTS[@]}"
step pytest 40 python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short -rfEp tests/test_decode_gpu.py \
  -k "pdl_unsplit or persistent"
pdl_ok=$(grep -cE "^PASSED .*pdl_unsplit" "$LOGS/pytest.log"); pers_ok=$(grep -cE "^PASSED .*persistent" "$LOGS/pytest.log")
TIMED=()
[[ $pdl_ok -eq 3 ]] && TIMED+=(pdl1)
[[ $pers_ok -eq 14 ]] && TIMED+=(pers pers3)
[[ $pdl_ok -eq 3 && $pers_ok -eq 14 ]] && TIMED+=(pers+pdl1)
echo "== GPU tests passed: pdl_unsplit $pdl_ok / 3, persistent $pers_ok / 14; timed: ${TIMED[*]:-none}"
if [[ ${#TIMED[@]} -gt 0 ]]; then
  step decode_ab 45 python3 scripts/decode_ab.py --s9 --no-precompile --rounds 6 --variants "${TIMED[@]}" \
    --out "$out/decode_ab"
fi
echo "== precompile"; tail -n 2 "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
[[ -f "$out/logs/decode_ab.log" ]] && { echo "== decode_ab"
  grep -E "^\| D|geomean|compiles|^GPU time|vs auto" "$out/logs/decode_ab.log" | cut -c1-170 | tail -n 30; }
exit 0
