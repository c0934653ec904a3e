#!/usr/bin/env bash
# suite_gpu.sh: the whole GPU suite (`-m "gpu and not slow"`) in four parts, one GPU call each, on one H100 or H200.
#
#   source .gpu/env.sh && scripts/suite_gpu.sh 1|2|3|4|slow|cpu1|cpu2   (repository root; writes under $OUT/suite<PART>; --help)
#
# Why: on a cold machine (nothing compiled) the whole suite took 546 s in session 27 and no longer fit one 600 s call
# in session 28 (82 % at 560 s). Part 2 was the last eight files in collection order (session 28, call 3: 1609 tests
# in 357 s, cold); part 3 the fa3-fp8 kernel files (split from part 1 in session 32, when part 1's ~3950 tests took
# 529 s of the step's 560, cold); part 4 the quantisation pass's three files, split from part 2 in session 38 (an
# H100 stopped part 2 at 96 % of the step's 560 s; an H200 took 419 s in session 36); part 1 every other GPU test
# file. tests/test_gpu_scripts.py checks that the lists together name every test file that has GPU tests, once.
# "slow": the GPU tests marked slow, which parts 1-4 leave out (offsets past 2^31 elements: tests/test_edge_cases.py
# ec15a / ec15b, tens of GB; session 32: 6 passed, 39 s).
# "cpu1", "cpu2": every test NOT marked gpu, on the GPU host's torch (2.11 there; CI and the fresh clones run the
# newest): the CPU paths under another torch release, the test files taken alternately (sorted by name) into two
# halves (byte order: LC_ALL=C, as the tests that check the halves sort). Session 47's first run of them there found
# torch.compile over CPU tensors failing on torch 2.11 (dynamo could not trace two calls that newer releases trace).
# Session 48's one-part run reached 79 % in 560 s with 8 workers
# of 16 torch threads each on an H100 host, hence the halves, 14 workers (no GPU memory to share) and 1 torch
# thread per worker (OMP_NUM_THREADS). Their skips are not checked. The carried packages have no nvdisasm >= 13.4 (the
# [sass] extra's 5 MB wheel would pass the 64 MiB carry limit; the host's CUDA 13.0 one is too old): the tests that read
# SASS skip there (FA_VARIANTS_TESTS_WITHOUT_SASS, tests/conftest.py; 213 of them failed in session 48): CI runs them.
# The 25 slowest tests are listed (--durations=25: what to move when a part nears its limit). Every skipped test is
# listed with its reason (-rs) and the count printed last: on one H200 the expected skips are
# the tests that need a second GPU (ec18a, "needs two GPUs"); any other skip fails the call (step "skips"), a hole
# to look at.
# SUITE_SKIP=" FILE ..." leaves those files out of the part (a file another call ran on the same tree: say so where
# the result is reported), e.g. SUITE_SKIP=tests/test_backward_gpu.py after scripts/pending_gpu.sh backward.
# SUITE_LIMIT=S: the pytest step's limit in seconds (default 560, for a call that runs something else first).
# SUITE_TEST_TIMEOUT=S: the cpu halves' limit per test (default 150), where pytest-timeout is installed (the GPU
# host has it): a stuck test fails with its stack and the half still prints its summary.
# Pass: pytest's "0 failed", no errors (an rc 124 after the "[100%]" line is xdist's teardown, not a failure).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
help_from_header "$@"
PART2="tests/test_torch_compile.py tests/test_seqlens_k_gpu.py tests/test_leftpad_k_gpu.py tests/test_seqlens_q_gpu.py tests/test_nonfinite_gpu.py tests/test_kernels_gpu.py
  tests/test_fp8_study_model.py tests/test_backward_gpu.py"
PART4="tests/test_fp8_quant_shift.py tests/test_fp8_quant_nonfinite.py tests/test_fp8_quant_kernel.py"
PART1="tests/test_bench.py tests/test_cache_gpu.py tests/test_compile.py tests/test_decode_fused_gpu.py
  tests/test_decode_gpu.py tests/test_distributed.py tests/test_edge_cases.py tests/test_fa1_gpu.py tests/test_fa2_gpu.py
  tests/test_fa2_split_gpu.py tests/test_fa3_gpu.py"
PART3="tests/test_fa3_fp8_gpu.py tests/test_fa3_fp8_kernel.py tests/test_fa3_fp8_lookahead_gpu.py
  tests/test_fa3_fp8_persistent_gpu.py tests/test_fa3_fp8_speed_gpu.py tests/test_fp8_overflow_gpu.py"
MARK="gpu and not slow"; NPROC=$(xdist_flag 14)
case "${1:-}" in
  1) FILES=$PART1 ;;
  2) FILES=$PART2 ;;
  3) FILES=$PART3 ;;
  4) FILES=$PART4 ;;
  slow) FILES="$PART1 $PART2 $PART3 $PART4"; MARK="gpu and slow"; NPROC="" ;;  # serial: six 17-35 GB tests at once exceed 141 GB
  cpu1|cpu2) FILES=$(ls tests/test_*.py | LC_ALL=C sort | awk -v half="${1#cpu}" 'NR % 2 == half % 2'); MARK="not gpu"
    NPROC=$(SUITE_WORKERS=${SUITE_WORKERS:-14} xdist_flag 14); export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    export FA_VARIANTS_TESTS_WITHOUT_SASS=1
    # a test past SUITE_TEST_TIMEOUT s fails with its stack (pytest-timeout, where installed) instead of stalling the
    # half until the step's limit kills it with no summary (sessions 48 and 49: a worker killed by the host)
    python3 -c "import pytest_timeout" >/dev/null 2>&1 && NPROC="$NPROC --timeout=${SUITE_TEST_TIMEOUT:-150}" ;;
  *) echo "suite_gpu.sh: PART must be 1, 2, 3, 4, slow, cpu1 or cpu2, got '${1:-}'" >&2; exit 2 ;;
esac
FILES=$(echo $FILES)  # one space between names (the lists above break lines): SUITE_SKIP matches " NAME "
for skip in ${SUITE_SKIP:-}; do
  case " $FILES " in *" $skip "*) ;; *) echo "suite_gpu.sh: SUITE_SKIP names $skip, not in part $1" >&2; exit 2 ;; esac
  FILES=$(echo " $FILES " | sed "s| $skip | |")
done
out="${OUT:-results}/suite$1"; session_setup "$out/logs"
[ -n "${SUITE_SKIP:-}" ] && echo "== left out (SUITE_SKIP): $SUITE_SKIP" | tee -a "$LOGS/commit.txt"
step pytest "${SUITE_LIMIT:-560}" python3 -m pytest -q $NPROC -m "$MARK" -p no:cacheprovider --tb=short -rfEs --durations=25 $FILES
echo; stop_clocks; cat "$LOGS/commit.txt"
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$LOGS/pytest.log" | tail -n 30
echo "skipped: $(grep -cE '^SKIPPED' "$LOGS/pytest.log") reason lines"
if [ "${1#cpu}" = "$1" ] && grep -E '^SKIPPED' "$LOGS/pytest.log" | grep -qv "needs two GPUs"; then
  echo "unexpected skips (not the two-GPU tests):"; grep -E '^SKIPPED' "$LOGS/pytest.log" | grep -v "needs two GPUs"
  step_failed skips "unexpected"
fi
steps_exit
