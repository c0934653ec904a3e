#!/usr/bin/env bash
# h200_session.sh: the GPU-host runs behind the closing notes and bench/ (one warm machine, two calls).
#
#   source .gpu/env.sh && scripts/h200_session.sh fa1           (carry .gpu: FA1's first GPU check)
#   source .gpu/env.sh && scripts/h200_session.sh real-input    (carry .fixtures, on the still-warm machine)
#   source .gpu/env.sh && scripts/h200_session.sh tests-bench   (carry .gpu)
#
# fa1: the FA1 tests and the shared correctness matrix for fa1 (never run on a GPU before).
# tests-bench: every `gpu and not slow` test (kernel matrix for fa1/fa2/fa3, edge cases, FA-specific tests,
#   dispatcher on the real capability, compile cache) in parallel pytest workers; then `fa-variants bench`
#   (bf16, B*N = 16k, H*D = 2048, N = 512..16k, D = 64/128/256, causal and not, ours beside SDPA flash,
#   cuDNN and flash-attn-4) with the memory table; then the FA1 vs FA2 DRAM-bytes study (ncu).
# real-input: SmolLM2's captured Q/K/V through every backend + first layers end to end; the FA3 ablation.
# Each step has its own time limit so that a slow step cannot eat the others; logs under $OUT.
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
[[ ${1:-} =~ ^(fa1|real-input|tests-bench)$ ]] || { echo "usage: $0 fa1|real-input|tests-bench" >&2; exit 2; }
out="${OUT:-results/h200-session}"; session_setup "$out"; STEP_TAIL=25

case "${1:-}" in
  fa1)
    step pytest_fa1 100 python3 -m pytest -q -n 8 -m "gpu and not slow" -p no:cacheprovider --tb=line -rf \
      tests/test_fa1_gpu.py tests/test_kernels_gpu.py -k fa1
    ;;
  tests-bench)
    step pytest 230 python3 -m pytest -q -n 8 -m "gpu and not slow" -p no:cacheprovider --tb=line -rf \
      --junitxml="$out/pytest.xml" tests
    step bench 170 python3 -m fa_variants.cli bench --dtypes bf16 --backends fa1,fa2,fa3 \
      --peers sdpa-flash,sdpa-cudnn,flash-attn-4,sdpa-math --no-progress --rep 60 --warmup 15 \
      --memory-seqlens 1024,2048,4096,8192,16384,32768,65536,131072 --out "$out/bench"
    step study 75 python3 scripts/fa1_vs_fa2_study.py --out "$out/study" --seqlens 1024 8192 \
      --head-dims 128 --causal no --ncu-shapes 128:1024 128:8192 --ncu-timeout 60
    ;;
  real-input)
    [ -f .gpu/env.sh ] || { echo "no .gpu on this machine"; exit 3; }
    step real_input 120 python3 scripts/real_input_gpu.py --fixture .fixtures/smollm2_135m_instruct.pt.xz \
      --out "$out/real_input"
    step ablation 85 python3 -m fa_variants.commands.bench_fa3 --ablation --head-dims 128 --seqlens 4096,16384 \
      --dtypes bf16 --rounds 2 --rep 60 --json "$out/ablation.json"
    ;;
esac
