#!/usr/bin/env bash
# pending_gpu.sh: the GPU work a session left for the next one's calls, on one H200 (one cold machine per call).
#
#   source .gpu/env.sh && scripts/pending_gpu.sh [--checks] [NAME ...]    (repository root; writes under $OUT; --help)
#
# Before each call, here: `git log --oneline -1 > .gpu/commit.txt` (carried; steps.sh writes it into commit.txt
# labelled "(from .gpu/commit.txt)": the copied tree's git metadata on the GPU host can be older than the tree).
#
# 1. --checks: the GPU tests of defaults changed without a script of their own (~60-90 s cold), CHECKS below:
#    session 10 made programmatic dependent launch the rule for unsplit packed seqlen_q-1 decode calls
#    (FA_VARIANTS_DECODE_PDL_MIN_SPLITS 1, measured faster at 8 / 9 shapes in its A/B) and changed the decode tests
#    that assumed the old rule (tests/test_decode_gpu.py: the defaults fixture, dual auto tiles, first row).
# 2. then scripts/NAME_gpu.sh for each NAME, in order, each with the time left of CALL_BUDGET seconds (default 560),
#    skipped when fewer than 100 s are left; logs under $OUT/pending/NAME/, output in $OUT/pending/NAME.out. Each
#    script's header has its pass and flip rules and its prediction (bench/NOTES.md has them too).
#    Plan for session 11's calls (30 min of device time; each call starts a cold machine, ~40-60 s more; carry
#    [".gpu", ".before.tar.xz"] after `scripts/ab_checkout.sh 446f785 .before`, which fa1tol's A/B needs: the
#    archive, not the folder: the call's 64 MiB holds .gpu/ (~60 MB), the working tree and ~0.25 MB more;
#    tests/test_ci.py keeps the tracked tree within its budget):
#      A. scripts/pending_gpu.sh --checks oob fa1tol overflow   (~420 s: fa3-fp8 memcheck at every head_dim after the
#         q_descale clamp; fa1's P rounding (GPU tests over 800 heads, A/B vs 446f785); bounded_units at head_dim 256
#         on adversarial V and its A/B: flip it into DEFAULT_SWITCHES[256] if it passes)
#      B. (ran: the head_dim 256 ping-pong-turn A/B, the tensor-core Hadamard and the split-KV merge inside a thread
#         block cluster; each measured slower than its default and was removed with its script in session 11)
#      C. the whole GPU suite: `python3 -m pytest -q -n 14 -m "gpu and not slow" -p no:cacheprovider --durations=40`
#         (~500 s; the durations show where the suite's time goes, to shorten it)
#      D. what is left: `python3 scripts/sanitize.py --backends fa1 fa3-fp8` (fa1's step changed; ~3-4 min)
# Pass (step 1): 0 failed, 0 errors (an rc 124 after the "[100%]" line is xdist's teardown, not a failure).
# Exit code: 1 when the checks step or a named script did not exit 0 (rc 124 included) or a script was skipped for
# time (the last line names them: steps.sh steps_exit), else 0.
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
CHECKS=(tests/test_decode_gpu.py -k "pdl or defaults or first_row or dual_auto or persistent")
checks=0; [[ "${1:-}" == "--checks" ]] && { checks=1; shift; }
names=("$@")
for n in ${names[@]+"${names[@]}"}; do
  [[ -f "$(dirname "$0")/${n}_gpu.sh" ]] || { echo "pending: no scripts/${n}_gpu.sh" >&2; exit 2; }
done
out="${OUT:-results}/pending"; session_setup "$out"
budget=${CALL_BUDGET:-560}
if (( checks )); then
  step checks 120 python3 -m pytest -q $(xdist_flag 14) -m gpu -p no:cacheprovider --tb=short -rfEX "${CHECKS[@]}"
fi
stop_clocks
for n in ${names[@]+"${names[@]}"}; do
  left=$((budget - SECONDS))
  if (( left < 100 )); then echo "== $n: skipped (${left}s left)"; step_failed "$n" skipped; continue; fi
  mkdir -p "$out/$n"
  OUT="$out/$n" timeout -k 5 -s INT $((left - 5)) bash "$(dirname "$0")/${n}_gpu.sh" > "$out/$n.out" 2>&1
  rc=$?; echo "== $n: rc=$rc at ${SECONDS}s"; (( rc == 0 )) || step_failed "$n" "rc=$rc"
done
if (( checks )); then echo "-- checks"; grep -E "^(FAILED|ERROR)|passed|failed|\[100%\]" "$LOGS/checks.log" | tail -n 12; fi
for n in ${names[@]+"${names[@]}"}; do [[ -f "$out/$n.out" ]] && { echo "-- $n"; tail -n 30 "$out/$n.out"; }; done
steps_exit
