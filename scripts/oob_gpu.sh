#!/usr/bin/env bash
# oob_gpu.sh: session 10, compute-sanitizer memcheck on fa3-fp8 after the q_descale out-of-bounds fix (on one H200,
# ~90-110 s cold).
#
#   source .gpu/env.sh; scripts/oob_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# The bug: memcheck found fa3-fp8's first sanitize call (d64, B 2, seqlen_q 113, seqlen_k 203, H 6/2, causal) reading
# q_descale one past its end: the 192-row tile's last warpgroup (rows 128-191, none < seqlen_q) read Q scale block 1
# of 1 (fa_variants.fp8.layout.q_scale_block now clamps it; tests/test_fp8_descale_bounds.py models every descale
# index on the CPU).
# 1. scripts/sanitize.py --tools memcheck --backends fa3-fp8 --head-dims 64 96 128 256 --per-head-dim --precompile:
#    the same calls first without the sanitizer (8 processes, one per head_dim x causal: the kernels and quantisation
#    passes into the disk cache), then one memcheck process per head_dim side by side, each over the sanitize
#    shapes (tile tails, seqlen_q != seqlen_k both ways, decode, GQA and MQA, causal and not) with bf16 inputs
#    quantised on the GPU (so the quantisation kernels are checked too), each output vs float64 (rel-L2 < 0.1).
#    Every head_dim, every shape of the sanitize set: no shape was left out for time.
# Pass: "memcheck  fa3-fp8-dD clean (N calls, ...)" for D = 64, 96, 128, 256 and "precompile: 8 processes, 0 failed".
# Prediction: all four clean (before the fix d64 reported 128 errors on its first call, the 128 threads of warpgroup
# 2 of the last CTA); precompile ~45-60 s, memcheck ~25-40 s per head_dim (side by side).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/oob}"; gpu_session "$out/logs" "$@"
step memcheck 115 python3 scripts/sanitize.py --tools memcheck --backends fa3-fp8 --head-dims 64 96 128 256 \
  --per-head-dim --precompile --timeout 55 --out "$out/sanitize"
echo "== memcheck"; grep -E "^(precompile|memcheck|fa3-fp8|logs)" "$out/logs/memcheck.log"
grep -h -m 3 -E "Invalid|WRONG|Error" "$out"/sanitize/memcheck-*.log 2>/dev/null | head -n 9
steps_exit
