#!/usr/bin/env bash
# fp8d128_gpu.sh: session 14, fa3-fp8 head_dim 128 (and 64) with the P V GEMM issued in pieces under the exponentials
# (issue 10: >= 1.4x our bf16 fa3 at head_dim 128, >= 1.3x at 64; session 13: 1.17-1.27x and 1.09-1.13x). One H200,
# <= 100 s cold; bench/NOTES.md "Session 14 (2026-12-02): fa3-fp8 head_dim 128, the P V GEMM in pieces under the
# exponentials; predictions before the run".
# Why: each warpgroup's serial step is a chain S GEMM -> softmax -> [turn: P V GEMM -> drain -> promotion -> next S
# GEMM]; with two warpgroups the period per K/V tile is that chain (the other warpgroup's GEMMs fit in this one's
# softmax), and the whole P V GEMM (512 tensor cycles a warpgroup at 128 x 256) sits in it with the tensor cores idle
# for this warpgroup. pv_pieces 2 issues the GEMM for the tile's first 128 keys as soon as their P is converted: it
# runs under the exponentials of the other 128 keys; only the second piece's 256 cycles stay in the chain.
# Variants (scripts/fa3_fp8_speed_ab.py --set fp8pieces, all off by default; the default's bits, by construction and by
# test):
#   new     the default (128: 128 x 256 serial, 834 instructions per warp and tile; 64: 192 x 192 serial, 3 WGs)
#   pq2     pv_pieces 2 (818; v_descale read before the turn; 8 P V QGMMAs, no spills causal and not, the turn holds
#           the second piece's 64 MUFU.EX2 after the first piece's QGMMAs)
#   pq2m4   (128) + pv_max_chains 4: the row max in four FMNMX chains (a max is exact in any order; the sums keep one)
# Steps:
#   1. tests (background, six pytest processes: one per variant and causal mode, each compiling its kernel and the
#      default into the tests' own disk cache): tests/test_fa3_fp8_speed_gpu.py -k fp8pieces (24 tests): each variant
#      vs the emulation (rel-L2 <= 6e-3, LSE <= 1.5e-3) and float64 on 3 shapes (tails, Nq > Nk, GQA / MQA), causal and
#      not, NaN-poisoned outputs; and O and LSE equal to the default's bit for bit (batch 2, GQA, 6-8 K/V tiles)
#   2. precompile (10 workers, beside the tests; the A/B's disk cache): the variants and bf16 fa3 at 128 and 64, causal
#      and not, the quantisation passes
#   3. speed_ab: D 128 then 64, N 16k / 4k (B*N 16k, H*D 2048), causal and not, paired (CUDA-graph bursts, order
#      rotated per round, A/A control of new), 6 rounds, beside bf16 fa3; then every variant vs the emulation and
#      float64 (N 1024)
#
#   source .gpu/env.sh && scripts/fp8d128_gpu.sh      (repository root; writes $OUT/fp8d128.tar.gz + summary)
# Pass: "precompile: ... 0 failed"; "tests: 24 passed"; the summary's accuracy lines PASS; a "pq2/new" line per problem.
# Flip rule: pq2m4 (else pq2) with its tests passing (the bits tests included) whose paired verdict X/new is "faster" at
# N 4k and N 16k non-causal at head_dim 128, "slower" nowhere, and geometric mean over the four >= 1.02: then
# fa3_fp8.DEFAULT_SWITCHES[128] = dict(pv_pieces=2[, pv_max_chains=4]) (no recipe or emulation change: same bits);
# at 64 the same rule on its own four problems: DEFAULT_SWITCHES[64] gains pv_pieces=2. Else nothing flips; if pq2 is
# "same" everywhere, the P V GEMM's place in the chain is not what sets the D 128 period (NOTES: what then).
# Prediction (X/new, N 4k / 16k / 4k causal / 16k causal): 128: pq2 1.03-1.08, pq2m4 1.04-1.10 (>= pq2); 64: pq2
# 1.00-1.04; new ~830 / 890 / 705 / 875 TFLOP/s at 128, bf16 fa3 ~675 / 710 / 600 / 690: best / bf16 fa3 1.30-1.38x
# at 128 (issue 10's 1.4x most likely still NOT met: ~20 % chance at N 16k); all 24 tests pass.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}"; work="$out/fp8d128"; gpu_session "$work" "$@"
AB=(python3 scripts/fa3_fp8_speed_ab.py --set fp8pieces --head-dims 128 64 --no-flash-attn)
# the GPU tests compile into a disk cache of their own (tests/conftest.py): one pytest per variant and causal mode, so
# each process compiles its variant and the default (the bits test), beside the A/B's precompile
for v in d128-pq2 d128-pq2m4 d64-pq2; do
  for c in full causal; do
    step "tests_${v}_$c" 60 python3 -m pytest -q -m gpu tests/test_fa3_fp8_speed_gpu.py -p no:cacheprovider --tb=line \
      -rfE -k "fp8pieces-$v- and $c" &
  done
done
step precompile 50 "${AB[@]}" --causal both --phase precompile --jobs 10 --out "$work/ab"
wait
left=$((98 - SECONDS)); lim=$((left > 60 ? 60 : left)); ((lim < 20)) && lim=20
step speed_ab "$lim" "${AB[@]}" --phase measure --protocol paired --rounds 6 --drop-failed "$work/precompile.log" \
  "$work"/tests_*.log --causal both --seqlens 16384 4096 --err-seqlen 1024 --out "$work/ab"
pack_logs "$out/fp8d128.tar.gz" && rm -rf "$work"
log() { tar -xzOf "$out/fp8d128.tar.gz" "fp8d128/$1" 2>/dev/null; }
echo; log precompile.log | grep -E "precompile:|FAILED" | head -6
echo "-- tests"; tests=$(tar -xzOf "$out/fp8d128.tar.gz" --wildcards "fp8d128/tests_*.log" 2>/dev/null)
grep -E "^(FAILED|ERROR)" <<< "$tests" | head -12
passed=$(grep -oE "^[0-9]+ passed" <<< "$tests" | awk '{n += $1} END {print n + 0}'); echo "tests: $passed passed"
((passed == 24)) || step_failed tests "$passed of 24 passed"
echo "-- speed_ab"
log speed_ab.log | grep -E "^left out|^d(128|64) N|A/A|/new:|^ +(new|pq2|bf16)[a-z0-9_]*: .* MHz|FAILED"
log speed_ab.log | grep -qE "pq2/new:" || step_failed speed_ab "no pq2/new line"
echo "-- summary"; log ab/summary.md | grep -E "^\| [0-9]|PASS|FAIL|NOT met|met|^- d(128|64)" || echo "(no summary.md)"
log ab/summary.md | grep -qE "rel-L2 .*: PASS" || step_failed speed_ab "accuracy lines not PASS"
steps_exit
