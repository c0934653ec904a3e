#!/usr/bin/env bash
# backward_gpu.sh: session 40, the kernel backends' gradients (the kernel forward, reference.run_backward's PyTorch
# backward in query-row chunks) on one H100 or H200: the GPU tests, then one training step's attention timed beside
# SDPA (~200-400 s cold: 48 kernel compiles; limit 450 s).
#
#   source .gpu/env.sh && scripts/backward_gpu.sh  (repository root; writes under $OUT/backward; --help)
#
# Why: until session 40 a call whose inputs required grad raised on every kernel backend, so a training step (a
# Hugging Face model in train(), a plain nn.Module) could not use them. Session 40 (no device) routed such calls
# through the custom op whose backward is reference.run_backward, chunked over query rows for bounded memory.
# 1. tests/test_backward_gpu.py: fa3 / fa2 / fa1 gradients vs float64 (2x PyTorch in bf16 / fp16, plus a floor;
#    odd sizes, GQA, causal with seqlen_q != seqlen_k, head dims 64 / 96 / 128 / 256), the memory bound at seqlen 8k
#    (peak < 3 GiB above the inputs where one float32 score matrix is 4 GiB), torch.compile's gradients = eager's.
# 2. scripts/backward_time.py: forward + backward, ours (auto) vs SDPA (flash / cuDNN), bf16, B x N = 16k,
#    H x D = 2048, 6 rotated rounds.
# Pass: every test passed (none skipped on sm90: fa2 and fa1 run there too).
# Prediction: tests pass, the backward's peak 1.5-2.5 GiB; ours / sdpa per step 5-20x at N 4k (the backward's float32
#   matmuls without tensor cores and ~15 passes over each score-sized tensor), ours-fwd a small part of ours.
# Rule: ours / sdpa above 3 at N >= 4k makes the next backward work a faster path (bf16 tensor-core matmuls with
#   float32 softmax, as FlashAttention-2's backward; or SDPA's fused backward recomputing the forward where the LSE's
#   gradient is 0 and the mask is one SDPA expresses); the PyTorch backward stays as the exact, general path.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/backward"; gpu_session "$out/logs" "$@"
step tests 290 python3 -m pytest -q $(xdist_flag 8) -m gpu -p no:cacheprovider --tb=short -rfEs \
  tests/test_backward_gpu.py
step time 150 python3 scripts/backward_time.py --out "$out"
echo; stop_clocks; cat "$LOGS/commit.txt"
echo "== tests"; grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$LOGS/tests.log" | tail -n 20
echo "== time"; grep -E "^D " "$LOGS/time.log"
steps_exit
