#!/usr/bin/env bash
# pending_gpu.sh: the GPU work a session left for the next one's calls, on one H200 (one cold machine per call).
#
#   source .gpu/env.sh && scripts/pending_gpu.sh [--checks] [NAME ...]    (repository root; writes under $OUT; --help)
#
# Before each call, here: `git log --oneline -1 > .gpu/commit.txt` (carried; steps.sh writes it into commit.txt
# labelled "(from .gpu/commit.txt)": the copied tree's git metadata on the GPU host can be older than the tree).
#
# 1. --checks: the GPU tests of defaults changed without a script of their own (~150-220 s cold), CHECKS below,
#    after one precompile step (three compilers in parallel, ~60 s cold): scripts/checks_precompile.py (11 jobs: the
#    head_dim 256 fa3-fp8 default's kernels), scripts/quant_precompile.py --set quantdef (the quantisation passes of
#    the default recipe) and scripts/fa3_speed_ab.py --precompile (fa3's head_dim 64 default, hoisted_descriptors on,
#    and "noturn", the same with it off). Session 12 flipped: hoisted_descriptors into fa3's head_dim 64 default
#    (turnbf16, 1.000-1.012x), quant_host.V3_WIDE (2 lanes per token at head_dim 256) and quant_host.QUANT_PLANS
#    (quantbw). The checks run: the head_dim 256 fa3-fp8 default (session 11's bounded_units flip; its default recipe
#    now runs the wide pass): tests/test_fp8_overflow_gpu.py at D 256 + tests/test_fa3_fp8_gpu.py's D 256 default
#    recipe / two-level / zero-V cases (31 tests); the quantisation pass's defaults = the torch recipe bit for bit and
#    wide = narrow (tests/test_fp8_quant_kernel.py, 14 tests); fa3 and its split / decode kernels at head_dim 64
#    (tests/test_fa3_gpu.py and tests/test_decode_gpu.py, "64" in the test id: ~235 tests).
# 2. then scripts/NAME_gpu.sh for each NAME, in order, each with the time left of CALL_BUDGET seconds (default 560),
#    skipped when fewer than 100 s are left; logs under $OUT/pending/NAME/, output in $OUT/pending/NAME.out. Each
#    script's header has its pass and flip rules and its prediction (bench/NOTES.md has them too).
#    Plan for session 21: session 20 had no GPU time (its device budget was the rest of session 19's, a retry of the
#    same work after CI failed on a test that required this plan to name older scripts); it fixed that test and read
#    the persistent consumer's K/V loop at the PTX level (bench/NOTES.md "Session 20 ...": NVVM rematerialises
#    descriptors there because every S fragment stays live around the tile loop; the fixes tried made ptxas's SASS
#    worse). Session 19 found D 256 causal 7-9 % faster with P converted per value and made it causal D 256's default
#    (hopper.fa3.CAUSAL_CONFIGS; whole GPU suite green at ea58ef8; tests/test_fa3_gpu.py's A/B variant tests changed
#    after that, not yet run on a GPU).
#    Open: issue 10's speed targets, 12's fa3 / flash-attn-4 >= 1.00 (D 64 0.96-0.97, D 128 non-causal long ~0.96,
#    D 256 non-causal 0.98, causal 8k-16k ~0.96-0.98) and >= cuDNN at N 512-1k (D 64 causal 0.85-0.90), 13's 70 % of
#    HBM at D 64 decode (61-65 %; the fixed ~8 us of a split call), 16 (two GPUs).
#    A. the whole GPU suite on the session's final tree (~520 s on an H200, a call of its own): `python3 -m pytest -q
#    -n 14 -m "gpu and not slow" -p no:cacheprovider --durations=40` (on an H100 use -n 8: its 80 GB ran out of
#    memory in the float64 reference with 15 workers).
#    B. README's results table rerun (the `fa-variants bench ...` command at the top of its linked bench.md, ~175 s):
#    its D 256 causal rows predate session 19's change.
#    C. A/Bs (scripts/fa3_speed_ab.py): D 256 split / packed (decode) configs without convert_pairs at causal shapes
#    (not timed; `_SPLIT_CONFIGS[256]` keeps pairs); any kernel change that makes the persistent consumer's K/V loop
#    compile like the one-CTA-per-tile kernel's (session 19's SASS: +20 instructions; opaque Q descriptors, per tile or
#    hoisted out of the tile loop, made it worse: +28 / +29), then `persistent-1tile` / new >= 0.995 and the balanced
#    limits past 4096 at D 64 / 128; cuDNN's lead at D 64 N 512 / 1k causal.
#    New lines "X. scripts/pending_gpu.sh [--checks] NAME ..." as scripts land. Each call starts a
#    cold machine (~60-85 s more); carry [".gpu"], or
#    [".gpu", ".before.tar.xz"] after `scripts/ab_checkout.sh COMMIT .before` for a script that A/Bs against an older
#    tree: the archive, not the folder: the call's 64 MiB holds .gpu/ (~60 MB), the working tree and ~0.25 MB more;
#    tests/test_ci.py keeps the tracked tree within its budget.
# Pass (step 1): every precompile line "0 failed" (checks_precompile's 11 jobs, quant_precompile's tasks, fa3's
# kernels); checks: 0 failed, 0 errors (an rc 124 after the "[100%]" line is xdist's teardown, not a failure).
# Exit code: 1 when a checks step or a named script did not exit 0 (rc 124 included) or a script was skipped for
# time (the last line names them: steps.sh steps_exit), else 0.
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
CHECKS_K="(test_fp8_overflow_gpu and (d256 or units_fault))"
CHECKS_K+=" or (test_fa3_fp8_gpu and 256 and (2lvl1 or default_recipe))"
CHECKS_K+=" or (test_fp8_quant_kernel and ((test_pass_matches_torch_bitwise and v3-bfloat16-default)"
CHECKS_K+=" or (test_v3_wide_bitwise and default-g)))"
CHECKS_K+=" or (test_fa3_gpu and (64 or hoisted_descriptors)) or (test_decode_gpu and 64)"
CHECKS=(tests/test_fp8_overflow_gpu.py tests/test_fa3_fp8_gpu.py tests/test_fp8_quant_kernel.py tests/test_fa3_gpu.py
        tests/test_decode_gpu.py -k "$CHECKS_K")
PRECOMPILE='python3 scripts/checks_precompile.py --jobs 6 & python3 scripts/quant_precompile.py --jobs 5 --set quantdef
 --unique & python3 scripts/fa3_speed_ab.py --precompile 4 --variants new,noturn --shapes 64:4096:full,64:4096:causal
 & wait'
checks=0; [[ "${1:-}" == "--checks" ]] && { checks=1; shift; }
names=("$@")
for n in ${names[@]+"${names[@]}"}; do
  [[ -f "$(dirname "$0")/${n}_gpu.sh" ]] || { echo "pending: no scripts/${n}_gpu.sh" >&2; exit 2; }
done
out="${OUT:-results}/pending"; session_setup "$out"
budget=${CALL_BUDGET:-560}
if (( checks )); then
  step checks_precompile 75 bash -c "${PRECOMPILE//$'\n'/}"
  step checks 160 python3 -m pytest -q $(xdist_flag 14) -m gpu -p no:cacheprovider --tb=short -rfEX "${CHECKS[@]}"
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
  echo "-- checks"; grep -E "precompile|FAILED|Traceback" "$LOGS/checks_precompile.log" | tail -n 8
  grep -E "^(FAILED|ERROR)|passed|failed|\[100%\]" "$LOGS/checks.log" | tail -n 12
fi
for n in ${names[@]+"${names[@]}"}; do [[ -f "$out/$n.out" ]] && { echo "-- $n"; tail -n 30 "$out/$n.out"; }; done
steps_exit
