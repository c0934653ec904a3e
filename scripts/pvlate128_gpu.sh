#!/usr/bin/env bash
# pvlate128_gpu.sh: issue 12, session 9, on one H200: bf16 fa3 at head_dim 128, the P V wait after the exponentials
# (bench/NOTES.md, "Session 9 (2026-12-01): pv_wait_late at head_dim 128; predictions before the run").
# Sm90Config.pv_wait_late (off by default; built at D 64 this session): the overlapped step branches on its row sums
# (never negative: a compare and a branch not taken) before it waits for its P V GEMM. In the D 128 default ptxas
# hoists that wait (WARPGROUP.DEPBAR.LE gsb0, 0x0) above 64 of the 66 MUFU.EX2 per consumer warp and K/V tile (causal
# masked and unmasked loops too) and runs O's 64 rescale FMULs among the exponentials (alpha_first); with the switch
# all 66 come before the wait, and O's rescale (which needs the P V GEMM done) trails the last one: 11 -> 129
# instructions after it, 487 -> 493 per tile, no spills (alpha_first on or off: the same SASS). Variants at D 128:
# `pvlate-128` (the default + the switch), `pvlate-128-obpv` (+ rescale_o_before_pv: O rescaled in the next step
# under its S GEMM; 65 instructions after the last MUFU.EX2, P's conversion) and its control `o-before-pv` (the
# default + rescale_o_before_pv, the wait hoisted as in the default). <= 120 s on a cold machine (limits 45 + 38 + 37).
#
#   source .gpu/env.sh; scripts/pvlate128_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/fa3_speed_ab.py --precompile, 12 processes at once into the disk caches: old / new / o-before-pv /
#    pvlate-128 / pvlate-128-obpv at D 128, full and causal (10 kernels), and flash-attn-4's 2 in its own cache.
# 1. GPU tests (tests/test_fa3_gpu.py -k "pvlate128 or (ablation_configs and o-before-pv)"): both variants vs
#    float64, causal and not, one K/V tile and many, odd lengths, Nq != Nk both ways, GQA and MQA, NaN-poisoned
#    outputs, LSE, EC-04's huge logit shifts; pvlate-128's O and LSE equal to the default's bit for bit; o-before-pv
#    at D 128 vs float64 (3 shapes, causal and not) (12 tests).
# 2. scripts/fa3_speed_ab.py: old, new and each variant whose GPU tests PASSED (and none failed; for pvlate-128 the
#    bit-for-bit test did not fail) beside flash-attn-4, bf16, B*N = 16k, H*D = 2048, paired protocol (6 rounds of 4
#    cycles of 10 ms bursts, A/A band), shapes in this order: D 128 N 4k, D 128 N 16k, D 128 N 4k causal (the limit
#    may cut the last shape; the SUMMARY of those done is printed). No variant left: the A/B is skipped.
# Pass: (0) "precompiled" lines, no Traceback. (1) 12 passed, 0 failed / errors (rc 124 with no summary: cut by its
#    limit, not a pass). (2) no "errors:"; each variant's max diff vs old equal to new's (same values; o-before-pv
#    and pvlate-128-obpv may differ in the last bit: O rescaled before the P V GEMM is added, not after).
# Prediction (NOTES): the path from the P V GEMM's end to the next turn shortens (default: ~64 exponentials after the
#    wait, MUFU-bound; pvlate-128: 129 FMUL / F2FP after exponentials that started ~500 cycles earlier), and at D 128
#    that path mattered (session 8's alpha_first, 32 FMULs off the tail: +2%). pvlate-128/new 1.00-1.03 at N 4k, N 16k
#    and N 4k causal; pvlate-128-obpv/new 1.00-1.04, >= pvlate-128; o-before-pv/new 0.98-1.01 (pvlate-128-obpv over
#    o-before-pv: the wait's move alone, > 1 if the exponentials wait on the P V GEMM in practice); best
#    variant/flash-attn-4 0.96-0.99 (new 0.959 / 0.967 / 0.959 in session 8). "same" everywhere: the tensor pipe, not
#    the softmax after the P V GEMM, sets D 128's pace; the wait's place is not the D 128 gap.
# Flip rule (tests green): pv_wait_late and rescale_o_before_pv on in fa3 DEFAULT_CONFIGS[128] if pvlate-128-obpv/new
#    is "faster" at N 4k and N 16k and not "slower" at N 4k causal and its median beats pvlate-128's at all three
#    shapes; else pv_wait_late alone if pvlate-128/new meets that rule. Else nothing (the switch stays off at D 128).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/pvlate128}"; gpu_session "$out/logs" "$@"
SHAPES="--shapes 128:4096:full,128:16384:full,128:4096:causal"
CANDIDATES=(o-before-pv pvlate-128 pvlate-128-obpv)
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
# 10 bf16 + 2 flash-attn-4 kernels: one round of compiles on 16 cores
step precompile 45 python3 scripts/fa3_speed_ab.py --precompile 12 --precompile-fa4 \
  --variants "old,new,$(IFS=,; echo "${CANDIDATES[*]}")" $SHAPES
NPROC=$(xdist_flag 8)
step pytest 38 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEp tests/test_fa3_gpu.py \
  -k "pvlate128 or (ablation_configs and o-before-pv)"
# a variant is timed only when its tests passed and none failed (a kernel that fails on the GPU, e.g. "illegal
# instruction", would end the A/B's process and every figure with it)
passed() { grep -qF "PASSED tests/test_fa3_gpu.py::$1" "$LOGS/pytest.log"; }
VARIANTS="old,new"
for v in "${CANDIDATES[@]}"; do
  ok=1
  for c in full causal; do
    if [[ $v == o-before-pv ]]; then
      passed "test_ablation_configs[o-before-pv-$c-1023]" || ok=0
    else
      passed "test_pvlate128_variants[$v-d128-$c]" || ok=0
    fi
  done
  grep -qE "^(FAILED|ERROR) .*\[$v-(d128-|full|causal)" "$LOGS/pytest.log" && ok=0
  [[ $v == pvlate-128 ]] && grep -qE "^(FAILED|ERROR) .*test_pvlate128_same_values" "$LOGS/pytest.log" && ok=0
  if (( ok )); then VARIANTS+=",$v"; else echo "== $v left out of the A/B (its GPU tests did not all pass)"; fi
done
fa3ab_and_summary 37 "$out/fa3ab"
