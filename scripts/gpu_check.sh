#!/usr/bin/env bash
# gpu_check.sh: on the GPU host, the GPU tests and a short benchmark in one go, logs and JSON under $OUT.
#
#   source .gpu/env.sh && scripts/gpu_check.sh [options]          (from the repository root)
#
# Writes under $OUT (else results/gpu-check-<date>-<time>/): nvidia-smi.txt, versions.txt, info.txt
# (`fa-variants info`), commit.txt, gpu.txt and clocks.csv (scripts/steps.sh), pytest-gpu.log + pytest-gpu.xml
# (junit), bench.log and bench/ (bench.md, bench.json, charts), and summary.txt; prints that summary last.
# Exit status: pytest's when the tests fail (5 = no test selected), else 1 when a measurement of our kernels
# failed in the benchmark, else 0.
#
# Options:
#   --tests "PATHS"     test files or node ids for pytest (default: the whole suite; only `gpu` tests run)
#   -k EXPR             pytest -k expression
#   --pytest "ARGS"     more pytest arguments (e.g. "-x --lf" or "-m 'gpu and not slow'")
#   --bench "ARGS"      more `fa-variants bench` arguments (e.g. "--backends fa2 --head-dims 128")
#   --full-bench        the full benchmark instead of --quick
#   --no-tests | --no-bench
#   --test-timeout S    seconds for pytest (default 360)
#   --bench-timeout S   seconds for the bench (default 180; 540 with --full-bench, which then needs --no-tests)
# The defaults keep tests + quick bench inside the GPU host's 10 minutes per command.
#
# Example: scripts/gpu_check.sh --tests tests/test_kernels_gpu.py -k fa2 --bench "--backends fa2 --head-dims 128"
set -uo pipefail
source "$(dirname "$0")/steps.sh"

tests="" kexpr="" pytest_extra="" bench_extra="" bench_mode="--quick" run_tests=1 run_bench=1
test_timeout=360 bench_timeout=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) tests="$2"; shift 2 ;;
    -k) kexpr="$2"; shift 2 ;;
    --pytest) pytest_extra="$2"; shift 2 ;;
    --bench) bench_extra="$2"; shift 2 ;;
    --full-bench) bench_mode=""; shift ;;
    --no-tests) run_tests=0; shift ;;
    --no-bench) run_bench=0; shift ;;
    --test-timeout) test_timeout="$2"; shift 2 ;;
    --bench-timeout) bench_timeout="$2"; shift 2 ;;
    -h|--help) print_header; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

[ -n "$bench_timeout" ] || bench_timeout=$([ -z "$bench_mode" ] && echo 540 || echo 180)
cd "$(dirname "$0")/.." || exit 2
if [ -f .gpu/env.sh ] && ! python3 -c "import cutlass" >/dev/null 2>&1; then
  source .gpu/env.sh   # unpacks the CuTe DSL once and puts it and the checkout on PYTHONPATH
fi
out="${OUT:-results/gpu-check-$(date +%Y%m%d-%H%M%S)}"
session_setup "$out"
say() { echo "== gpu_check: $*"; }

# ---------------------------------------------------------------------------------------- environment
say "environment -> $out/nvidia-smi.txt, gpu.txt, versions.txt, info.txt"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi not available" >> "$out/nvidia-smi.txt"
python3 - > "$out/versions.txt" 2>&1 <<'PY'
import importlib, importlib.metadata as md, platform, subprocess
print("python", platform.python_version(), platform.machine())
for dist in ("torch", "triton", "nvidia-cutlass-dsl", "apache-tvm-ffi", "flash-attn-4", "flash-attn", "numpy",
             "matplotlib", "rich", "tqdm", "pytest"):
    try:
        print(dist, md.version(dist))
    except md.PackageNotFoundError:
        try:
            mod = importlib.import_module({"nvidia-cutlass-dsl": "cutlass"}.get(dist, dist.replace("-", "_")))
            print(dist, getattr(mod, "__version__", "importable"))
        except Exception:
            print(dist, "-")
import torch
print("torch.version.cuda", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"sm{p.major}{p.minor}", p.multi_processor_count, "SMs", round(p.total_memory / 2**30, 1), "GiB")
else:
    print("gpu none: torch.cuda.is_available() is False")
try:
    print("commit", subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                   check=True).stdout.strip())
except Exception:
    print("commit - (no git here)")
PY
python3 -m fa_variants.cli info > "$out/info.txt" 2>&1 || echo "(fa-variants info failed, rc $?)" >> "$out/info.txt"
cat "$out/versions.txt"

# ------------------------------------------------------------------------------------------ GPU tests
test_rc=skipped test_line="not run (--no-tests)"
if [ "$run_tests" = 1 ]; then
  # shellcheck disable=SC2086  # word splitting of the user's lists is intended
  set -- -m gpu -q -p no:cacheprovider --junitxml="$out/pytest-gpu.xml" ${kexpr:+-k "$kexpr"} $tests
  eval "set -- \"\$@\" $pytest_extra"
  say "python3 -m pytest $* (log: $out/pytest-gpu.log)"
  timeout -k 15 "$test_timeout" python3 -m pytest "$@" 2>&1 | tee "$out/pytest-gpu.log"
  test_rc=${PIPESTATUS[0]}
  test_line=$(grep -E "^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected)|no tests ran" "$out/pytest-gpu.log" \
              | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
  [ "$test_rc" = 124 ] && test_line="TIMED OUT after ${test_timeout}s; ${test_line}"
fi

# ------------------------------------------------------------------------------------------ benchmark
bench_rc=skipped bench_lines="not run (--no-bench)"
if [ "$run_bench" = 1 ]; then
  eval "set -- bench $bench_mode --out \"$out/bench\" --no-progress $bench_extra"
  say "python3 -m fa_variants.cli $* (log: $out/bench.log)"
  timeout -k 15 "$bench_timeout" python3 -m fa_variants.cli "$@" 2>&1 | tee "$out/bench.log"
  bench_rc=${PIPESTATUS[0]}
  bench_lines=$(grep -E "ours / best peer|^wrote |FAILED|not run:|no CUDA GPU" "$out/bench.log" | tail -12)
  [ "$bench_rc" = 124 ] && bench_lines="TIMED OUT after ${bench_timeout}s (partial JSON in $out/bench/bench.json)
$bench_lines"
fi

# ---------------------------------------------------------------------------------------------- summary
status=0
if [ "$test_rc" != skipped ] && [ "$test_rc" != 0 ]; then status=$test_rc
elif [ "$bench_rc" != skipped ] && [ "$bench_rc" != 0 ]; then status=1
fi
{
  echo "== gpu_check summary ($(date '+%Y-%m-%d %H:%M:%S'))"
  grep -E "^gpu |^torch |^commit " "$out/versions.txt" | tr '\n' ';' | sed 's/;$/\n/; s/;/; /g'
  echo "tests (rc $test_rc): $test_line"
  [ -f "$out/pytest-gpu.xml" ] && echo "  junit: $out/pytest-gpu.xml; log: $out/pytest-gpu.log"
  echo "bench (rc $bench_rc):"
  echo "$bench_lines" | sed 's/^/  /'
  echo "result: $([ $status = 0 ] && echo PASS || echo "FAIL (exit $status)")"
} | tee "$out/summary.txt"
exit $status
