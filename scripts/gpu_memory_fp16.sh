#!/usr/bin/env bash
# gpu_memory_fp16.sh: on a GPU host, in one call of about 6 minutes, the two measurements bench/ still lacks:
#   1. the peak-memory table (FlashAttention paper, fig. 3 right): one forward, batch 1, 16 heads, head_dim
#      128, fp16, N = 1k .. 128k doubling, ours (fa2, fa3) beside SDPA math (standard attention: S and P in
#      HBM), SDPA flash, SDPA cuDNN and flash-attn-4; an implementation that runs out of memory is not tried
#      at larger N; every row is saved as it is measured (a run cut off keeps what it measured);
#   2. the fp16 rows of the speed benchmark (same setup as the bf16 rows in bench/h200-*/: B*N = 16k tokens,
#      H*D = 2048, N = 512..16k, head_dim 64/128/256, causal and not), ours beside the same peers.
# fa1 is left out of the memory table (at N = 128k its 16 CTAs take minutes; its memory is fa2's: linear).
#
#   scripts/gpu_memory_fp16.sh                (from the repository root; the DSL importable, see CONTRIBUTING.md)
#
# Writes under $OUT (else results/memory-fp16-<date>-<time>/): memory/ and fp16/ (bench.md, bench.json),
# one log per step, and prints each step's status line and the tail of its log. Rebuild the merged report
# later with: fa-variants bench --report-from OUT/memory/bench.json OUT/fp16/bench.json --out DIR
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
out="${OUT:-results/memory-fp16-$(date +%Y%m%d-%H%M%S)}"; session_setup "$out"; STEP_TAIL=30
peers=sdpa-math,sdpa-flash,sdpa-cudnn,flash-attn-4
step memory 110 python3 -m fa_variants.cli bench --memory-only --dtypes fp16 --head-dims 128 \
  --backends fa2,fa3 --peers "$peers" --no-progress --no-charts \
  --memory-seqlens 1024,2048,4096,8192,16384,32768,65536,131072 --out "$out/memory"
step fp16 220 python3 -m fa_variants.cli bench --dtypes fp16 --backends fa1,fa2,fa3 \
  --peers sdpa-flash,sdpa-cudnn,flash-attn-4 --no-memory --no-progress --rep 60 --warmup 15 --out "$out/fp16"
