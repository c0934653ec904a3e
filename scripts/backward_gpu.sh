#!/usr/bin/env bash
# backward_gpu.sh: sessions 40-41, the kernel backends' gradients (the kernel forward; reference.run_backward's
# PyTorch backward in query-row chunks, or a fused backward of PyTorch's) on one H100 or H200: the GPU tests, then
# one training step's attention timed beside SDPA (~280-530 s cold: 48 kernel compiles; limit 530 s).
#
#   source .gpu/env.sh && scripts/backward_gpu.sh  (repository root; writes under $OUT/backward; --help)
#
# Why: until session 40 a call whose inputs required grad raised on every kernel backend, so a training step (a
# Hugging Face model in train(), a plain nn.Module) could not use them. Session 40 (no device) routed such calls
# through the custom op whose backward is reference.run_backward, chunked over query rows for bounded memory.
# 1. tests/test_backward_gpu.py: fa3 / fa2 / fa1 gradients vs float64 (2x PyTorch in bf16 / fp16, plus a floor;
#    odd sizes, GQA, causal with seqlen_q != seqlen_k, head dims 64 / 96 / 128 / 256), the memory bound at seqlen 8k
#    (peak < 3 GiB above the inputs where one float32 score matrix is 4 GiB), torch.compile's gradients = eager's.
#    Three backward modes (integrations.backward): FA_VARIANTS_BACKWARD=pytorch (the default), flash (session 41:
#    PyTorch's FlashAttention-2 backward kernel, aten._scaled_dot_product_flash_attention_backward, fed our forward's
#    O and LSE; eager and traced) and sdpa (session 40: the forward recomputed by SDPA, its fused backward; eager
#    only), the fused ones where they apply (the LSE gets no gradient, no causal row without a key), and only there.
# 2. scripts/backward_time.py: forward + backward, ours (auto) with each backward mode vs SDPA (flash / cuDNN), bf16,
#    B x N = 16k, H x D = 2048, 6 rotated rounds.
# Pass: every test passed (none skipped on sm90: fa2 and fa1 run there too).
# Prediction: tests pass in every mode, the PyTorch backward's peak 1.5-2.5 GiB; ours / sdpa per step 5-20x at N 4k
#   (the PyTorch backward's float32 matmuls without tensor cores and ~15 passes over each score-sized tensor);
#   ours-sdpabwd / sdpa 1.2-1.6x (our forward, then SDPA's forward again and its backward); ours-flashbwd / sdpa
#   0.85-1.25x (our forward for SDPA's, then the same FlashAttention-2 backward SDPA's flash path runs; above 1
#   where SDPA picks cuDNN, whose backward is faster); ours-fwd a small part.
# Rule: of flash and sdpa, the faster mode (median over shapes) that passes every test and is faster than ours at
#   every shape becomes FA_VARIANTS_BACKWARD's default, flash on a tie (it serves torch.compile too); the PyTorch
#   backward stays for what the fused ones do not take (the LSE's gradient, causal rows without keys, seqlens_k,
#   create_graph). A mode that fails or loses somewhere stays off, the reason in docs/tried.md.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/backward"; gpu_session "$out/logs" "$@"
step tests 380 python3 -m pytest -q $(xdist_flag 8) -m gpu -p no:cacheprovider --tb=short -rfEs \
  tests/test_backward_gpu.py
step time 150 python3 scripts/backward_time.py --out "$out"
echo; stop_clocks; cat "$LOGS/commit.txt"
echo "== tests"; grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$LOGS/tests.log" | tail -n 20
echo "== time"; grep -E "^D " "$LOGS/time.log"
steps_exit
