#!/usr/bin/env bash
# pending8_gpu.sh: what session 8 changed after its last GPU run (its device time ran out), on one H200. <= 8.5 min (cold machine).
#
#   source .gpu/env.sh && scripts/pending8_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 1. tests/test_torch_compile.py -m gpu: session 8's GPU suite failed both reduce-overhead cases ("tensor(s) in the
#    cudagraph pool not tracked as outputs": torch.compile's CUDA-graph warm-up allocates from the graph's pool
#    uncaptured, and common.workspace cached split scratch allocated there); fixed by workspace.uncached() around the
#    custom op, CPU-tested only; and test_fp8_compile_reduce_overhead_first_call (backend fa3-fp8 as the process's
#    first fp8 call: the quantisation pass's cached signs / zeros are made through workspace.persistent, on a side
#    stream outside the graph's pool; its 4 kernels compile in one worker: 130 s).
# 2. tests/test_fa3_gpu.py -k "alpha_first_same_values or alpha_variants": alpha_first is D 128's default since
#    session 8 (its A/B passed 8 GPU tests before the flip); the same-values test now compares against the default
#    without it (it compared the default with itself after the flip).
# 3. scripts/fa3gap9_gpu.sh (issue 12: Sm90Config.rescale_first at D 64, the alpha-256 / pairs-256 / fa4-256 variants
#    at D 256, beside flash-attn-4) and scripts/quant9_gpu.sh (issue 10: the quantisation pass's Hadamard lane exchange
#    and one barrier per block); each script's header has its pass rule, prediction and flip rule.
# Then, in a call of their own (the step limits of all together pass 10 minutes): scripts/fp8two_gpu.sh (issue 10:
# fa3-fp8 fused_promote at head_dim 256) and scripts/quant10_gpu.sh (issue 10: the quantisation pass reading K once
# from DRAM, FA_VARIANTS_FP8_QUANT_K_ONCE; it spins on other CTAs: a hang shows as its step's time limit).
# Pass: 0 failed, 0 errors in steps 1-2 (an rc 124 after the "[100%]" line is xdist's teardown, not a failure).
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
out="${OUT:-results}/pending8"; session_setup "$out"
NPROC=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
step compile_graphs 130 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_torch_compile.py
step alpha 80 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_fa3_gpu.py \
  -k "alpha_first_same_values or alpha_variants"
stop_clocks
for s in fa3gap9 quant9; do
  mkdir -p "$out/$s"; OUT="$out/$s" bash "$(dirname "$0")/${s}_gpu.sh" > "$out/$s.out" 2>&1
  echo "== $s: rc=$?"
done
for s in compile_graphs alpha; do
  echo "-- $s"; grep -E "^(FAILED|ERROR)|passed|failed|\[100%\]" "$LOGS/$s.log" | tail -n 8
done
for s in fa3gap9 quant9; do echo "-- $s"; tail -n 40 "$out/$s.out"; done
