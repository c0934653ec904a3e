#!/usr/bin/env bash
# d64gap_gpu.sh: issue 12, session 9, on one H200: bf16 fa3 at head_dim 64, the P V wait after the exponentials
# (bench/NOTES.md, "Session 9 (2026-12-01): fa3 at head_dim 64; predictions before the run"). Sm90Config.pv_wait_late
# (off by default): the overlapped step branches on its row sums (never negative: a compare and a branch not taken)
# before it waits for its P V GEMM, so every exponential of the tile is issued before that wait. Without it ptxas hoists
# the wait (WARPGROUP.DEPBAR.LE gsb0, 0x0) above 59 of the 66 MUFU.EX2 per consumer warp and K/V tile (causal masked
# loop: all 66), so the exponentials of a warpgroup wait for its own P V GEMM. Same operations, same values; SASS per
# tile 412 -> 418 instructions, 66 of 66 MUFU.EX2 before the wait, 2 DEPBAR as before, no spills. Variants at D 64:
# `pvlate` (the default + the switch) and `pvlate-noskip` (+ O rescaled every tile, no unit-alpha skip branch).
# <= 120 s on a cold machine (limits 45 + 38 + 37).
#
#   source .gpu/env.sh; scripts/d64gap_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/fa3_speed_ab.py --precompile, 10 processes at once into the disk caches: old / new / pvlate /
#    pvlate-noskip at D 64, full and causal (8 kernels), and flash-attn-4's 2 in its own cache.
# 1. GPU tests (tests/test_fa3_gpu.py -k "d64gap_variants or pv_wait_late_same_values"): both variants vs float64,
#    causal and not, one K/V tile and many, odd lengths, Nq != Nk both ways, GQA and MQA, NaN-poisoned outputs, LSE,
#    EC-04's huge logit shifts; pvlate's O and LSE equal to the default's bit for bit (6 tests).
# 2. scripts/fa3_speed_ab.py: old, new and each variant whose two GPU tests PASSED (and, for pvlate, the bit-for-bit
#    test did not fail) beside flash-attn-4, bf16, B*N = 16k, H*D = 2048, paired protocol (6 rounds of 4 cycles of
#    10 ms bursts, A/A band), shapes in this order: D 64 N 4k, D 64 N 16k, D 64 N 4k causal (the limit may cut the last
#    shape; the SUMMARY of those done is printed). No variant left: the A/B is skipped.
# Pass: (0) "precompiled" lines, no Traceback. (1) 6 passed, 0 failed / errors (rc 124 with no summary: cut by its
#    limit, not a pass). (2) no "errors:"; each variant's max diff vs old equal to new's (same values).
# Prediction (NOTES): pvlate/new 1.00-1.03 at N 4k, N 16k and N 4k causal (session 9's rescale_first moved the wait
#    above all 66 exponentials, with O's rescale, and measured 0.975-0.981, where session 8's alpha-noskip, the same tail
#    change without the wait's move, measured 1.004: the wait's place is worth ~2% one way); the gain is bounded by
#    the tail it adds (P's 32 F2FP and the skip-branch FMULs stay after the wait: 56 -> 69 instructions after the last
#    MUFU.EX2, 88 -> 101 when O is rescaled); pvlate-noskip/new 0.99-1.02; pvlate/flash-attn-4 0.93-0.96 (new 0.925 /
#    0.941 / 0.933 this session). If pvlate/new is "same" everywhere, the exponentials do not wait on the P V GEMM in
#    practice (its tensor time is covered by the row-max phase) and the wait placement is not the D 64 gap.
# Flip rule: pv_wait_late on in fa3 DEFAULT_CONFIGS[64] if pvlate/new is "faster" at N 4k and N 16k and not "slower" at
#    N 4k causal (and its tests are green); skip_unit_rescale off with it only if pvlate-noskip/pvlate > 1 at all three
#    shapes. Else nothing (the switch stays off; a candidate for removal).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/d64gap}"; gpu_session "$out/logs" "$@"
SHAPES="--shapes 64:4096:full,64:16384:full,64:4096:causal"
CANDIDATES=(pvlate pvlate-noskip)
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
# 8 bf16 + 2 flash-attn-4 kernels: one round of compiles on 16 cores
step precompile 45 python3 scripts/fa3_speed_ab.py --precompile 10 --precompile-fa4 \
  --variants "old,new,$(IFS=,; echo "${CANDIDATES[*]}")" $SHAPES
NPROC=$(xdist_flag 8)
step pytest 38 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEp tests/test_fa3_gpu.py \
  -k "d64gap_variants or pv_wait_late_same_values"
# a variant is timed only when both its tests passed and none of its tests failed (a kernel that fails on the GPU, e.g.
# "illegal instruction", would end the A/B's process and every figure with it)
VARIANTS="old,new"
for v in "${CANDIDATES[@]}"; do
  ok=1
  for c in full causal; do
    grep -qF "PASSED tests/test_fa3_gpu.py::test_d64gap_variants[$v-d64-$c]" "$LOGS/pytest.log" || ok=0
  done
  grep -qE "^(FAILED|ERROR) .*\[$v-d64-" "$LOGS/pytest.log" && ok=0
  [[ $v == pvlate ]] && grep -qE "^(FAILED|ERROR) .*test_pv_wait_late_same_values" "$LOGS/pytest.log" && ok=0
  if (( ok )); then VARIANTS+=",$v"; else echo "== $v left out of the A/B (its GPU tests did not all pass)"; fi
done
fa3ab_and_summary 37 "$out/fa3ab"
