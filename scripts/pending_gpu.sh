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
#    Plan for session 32: session 31's device came only at its end: the whole GPU suite on the audited tests passed
#    but for one single-accumulator ablation bound (now 1e-2; not re-run): run
#    `python3 -m pytest -q -m gpu tests/test_fa3_fp8_lookahead_gpu.py tests/test_fa3_fp8_speed_gpu.py -k single` first.
#    Built on the CPU in session 31: the test suite's audit (a helper):
#    a fresh seed per test and run (conftest's rng_seed; ~800 FP8 GPU tests had fixed seeds), NaN poisoning in
#    tests/test_edge_cases.py (2390 GPU cases), tests/test_fa2_gpu.py and the quantisation tests, a refusal at EC-14 /
#    EC-15 now fails unless by design, a new far-rows test in tests/test_nonfinite_gpu.py, tighter tolerances in
#    tests/test_torch_compile.py and tests/test_decode_fused_gpu.py; fa3_kernel._free_tiles' loops merged (SASS
#    unchanged by hash). No kernel changed since session 29's green suite.
#    A. First: `scripts/suite_gpu.sh 2` and `1` (each its own call; session 30's host-side changes are also still
#    unproved on the GPU: the custom ops' autograd and schema in part 2, fa3-fp8's LSE through
#    FP8Inputs.unsmoothed_lse in part 1). A failure there is a test's or a kernel's: a failing test prints
#    FA_VARIANTS_TEST_SEED=N, which replays it (`FA_VARIANTS_TEST_SEED=N python -m pytest NODEID`). The skip lines
#    are listed now (-rfEs): on one H200 only ec18a's three ("needs two GPUs") are expected; any other fails the call.
#    B. The decode table on today's tree (issue 13: "GPU time <= SDPA at every shape, >= 70 % of HBM at Nk >= 32k";
#    the last full table is session 7's): `timeout 560 fa-variants bench --decode --decode-no-fa4 --no-progress --out
#    $OUT/decode` (~5-8 min cold; the kernels changed since: seqlens_k in fa3's kernel, sessions 24-25).
#    C. `scripts/suite_gpu.sh slow` (ec15a / ec15b: more than 2^31 elements, ~20-40 GB; last run session 16), if time.
#    Open: issue 10 (1100 TFLOP/s at D 256 N 16k: 1012 in session 30's call, 1084-1120 in session 27's; 1.4x bf16 at
#    128: 1.17-1.20; 1.3x at 64: 1.06-1.08; two-level <= 5 % at 256; the pass at 70 % of copy; pass + kernel at N 4k
#    causal), 12 (fa3 / flash-attn-4 >= 1.00 everywhere: 0.93-0.99 in session 30's call; >= cuDNN at D 64 N 512 / 1k),
#    13 (70 % of HBM at D 64 B 1 Nk 32k: 61-65 %), 16 (two GPUs).
#    D 256 huge_hoisted: a flip candidate once its spills are gone (session 30, CPU: the vote taken right before the
#    free tiles instead of before the walk leaves 1 / 1 (non-causal) and 4 / 5 (causal) STL / LDL, from 2 / 3 and
#    7 / 8; not kept).
#    D. As before: D 256 split / packed configs without convert_pairs at causal shapes; the persistent consumer's K/V
#    loop (bench/NOTES.md "Session 20 ..."); D 256's two-level cost; fa3-fp8's magnitude limit, max|V| seqlen_k <=
#    2^119 (README, "FP8's range": the unnormalised O overflows float32; lifting it is a kernel change).
#    E. The whole GPU suite on the session's final tree if a default kernel changed (scripts/suite_gpu.sh 1 and 2).
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
