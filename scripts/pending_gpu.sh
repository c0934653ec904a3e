#!/usr/bin/env bash
# pending_gpu.sh: the GPU work a session left for the next one's calls, on one H200 (one cold machine per call).
#
#   source .gpu/env.sh && scripts/pending_gpu.sh [--checks] [NAME ...]    (repository root; writes under $OUT; --help)
#
# Before each call, here: `git log --oneline -1 > .gpu/commit.txt` (carried; steps.sh writes it into commit.txt
# labelled "(from .gpu/commit.txt)": the copied tree's git metadata on the GPU host can be older than the tree).
#
# 1. --checks: the GPU tests of defaults changed without a script of their own (~70-90 s cold), CHECKS below, after
#    scripts/checks_precompile.py has compiled their kernels into the disk cache (11 jobs, ~30-40 s cold):
#    session 11 flipped bounded_units into the head_dim 256 fa3-fp8 default (DEFAULT_SWITCHES[256];
#    scripts/bounded_gpu.sh timed and tested it as a switch). The checks run the default itself:
#    tests/test_fp8_overflow_gpu.py at head_dim 256 (adversarial V finite, vs the emulation and float64;
#    test_fused_units_fault: inf with bounded_units=False) and tests/test_fa3_fp8_gpu.py's head_dim 256 cases of the
#    default kernel (default recipe x 6 shapes x causal, every granularity / rotation with two-level, zero V
#    blocks): 31 tests. (Session 10's decode PDL checks passed in session 11, 83 tests, and run in the GPU suite.)
# 2. then scripts/NAME_gpu.sh for each NAME, in order, each with the time left of CALL_BUDGET seconds (default 560),
#    skipped when fewer than 100 s are left; logs under $OUT/pending/NAME/, output in $OUT/pending/NAME.out. Each
#    script's header has its pass and flip rules and its prediction (bench/NOTES.md has them too).
#    Plan for session 12's calls (30 min of device time; each call starts a cold machine, ~40-60 s more; carry
#    [".gpu"], or [".gpu", ".before.tar.xz"] after `scripts/ab_checkout.sh 446f785 .before` for a script that A/Bs
#    against an older tree: the archive, not the folder: the call's 64 MiB holds .gpu/ (~60 MB), the working tree
#    and ~0.25 MB more; tests/test_ci.py keeps the tracked tree within its budget):
#      A. scripts/pending_gpu.sh --checks   (~90 s; 31 passed in session 11's call F after the flip), then in the same call if time allows, else the next: the whole GPU
#         suite: `python3 -m pytest -q -n 14 -m "gpu and not slow" -p no:cacheprovider --durations=40` (~500 s)
#      B. scripts/pending_gpu.sh quantlanes d64ncu   (~75 + ~95 s: the quant pass with 2 lanes per token at head_dim
#         256 (FA_VARIANTS_FP8_QUANT_WIDE, off; flip rule in its header); Nsight Compute stall sampling of fa3 vs
#         flash-attn-4 at head_dim 64 (issue 12: where the ~6 % gap's cycles go), then scripts/ncu_compare.py)
#      C. scripts/pending_gpu.sh ncu256   (~70-90 s: an ncu source view of fa3-fp8's head_dim 256 ping-pong turn, new
#         vs single_overlap_noskip, the two-level schedule's flat ~5.5 %; bench/NOTES.md "Session 11 ... head_dim 256
#         turn under ncu; plan for the next run")
# Pass (step 1): "precompile: 11 jobs ... 0 failed"; checks 31 passed, 0 failed, 0 errors (an rc 124 after the
# "[100%]" line is xdist's teardown, not a failure). Prediction: 31 passed (the flip's own run: 11 passed).
# Exit code: 1 when a checks step or a named script did not exit 0 (rc 124 included) or a script was skipped for
# time (the last line names them: steps.sh steps_exit), else 0.
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
CHECKS_K="(test_fp8_overflow_gpu and (d256 or units_fault))"
CHECKS_K+=" or (test_fa3_fp8_gpu and 256 and (2lvl1 or default_recipe))"
CHECKS=(tests/test_fp8_overflow_gpu.py tests/test_fa3_fp8_gpu.py -k "$CHECKS_K")
checks=0; [[ "${1:-}" == "--checks" ]] && { checks=1; shift; }
names=("$@")
for n in ${names[@]+"${names[@]}"}; do
  [[ -f "$(dirname "$0")/${n}_gpu.sh" ]] || { echo "pending: no scripts/${n}_gpu.sh" >&2; exit 2; }
done
out="${OUT:-results}/pending"; session_setup "$out"
budget=${CALL_BUDGET:-560}
if (( checks )); then
  step checks_precompile 60 python3 scripts/checks_precompile.py --jobs 14
  step checks 90 python3 -m pytest -q $(xdist_flag 14) -m gpu -p no:cacheprovider --tb=short -rfEX "${CHECKS[@]}"
fi
stop_clocks
for n in ${names[@]+"${names[@]}"}; do
  left=$((budget - SECONDS))
  if (( left < 100 )); then echo "== $n: skipped (${left}s left)"; step_failed "$n" skipped; continue; fi
  mkdir -p "$out/$n"
  OUT="$out/$n" timeout -k 5 -s INT $((left - 5)) bash "$(dirname "$0")/${n}_gpu.sh" > "$out/$n.out" 2>&1
  rc=$?; echo "== $n: rc=$rc at ${SECONDS}s"; (( rc == 0 )) || step_failed "$n" "rc=$rc"
done
if (( checks )); then
  echo "-- checks"; grep -E "precompile:|FAILED" "$LOGS/checks_precompile.log" | tail -n 4
  grep -E "^(FAILED|ERROR)|passed|failed|\[100%\]" "$LOGS/checks.log" | tail -n 12
fi
for n in ${names[@]+"${names[@]}"}; do [[ -f "$out/$n.out" ]] && { echo "-- $n"; tail -n 30 "$out/$n.out"; }; done
steps_exit
