"""`fa-variants bench`: forward TFLOP/s and memory of our kernels beside PyTorch SDPA and flash-attn-4.

Setup and convention of the FlashAttention papers (Dao et al. 2022, sec. 4 and app. E; FlashAttention-2,
sec. 4.1; FlashAttention-3, sec. 4.1): batch x seqlen = 16384 tokens, num_heads x head_dim = 2048,
seqlen 512..16k, head_dim 64/128/256, causal and not, forward only, and

    TFLOP/s = 4 * batch * num_heads * seqlen_q * seqlen_k * head_dim / time, halved for causal.

Each time is the median of `triton.testing.do_bench` (CUDA events when triton is missing) after warm-up,
with the inputs rotated among several sets so that the L2 cache does not flatter small cases. The first call
of each static configuration (compile + launch for JIT kernels) is timed apart. Ratio columns are each of ours
over the best peer measured in the same run. The memory table (FlashAttention paper, fig. 3 right) is the peak
allocated memory of one forward call as seqlen grows, until standard attention (SDPA math) runs out of memory.

Modules: `core` (cases, FLOP count, `sweep` / `memory_sweep`: pure loops over a timing function, so tests
inject synthetic timings), `runtime` (the implementations and `GpuRuntime`, the only code that touches the
GPU), `report` (markdown, JSON and charts from the saved report dictionary), `cli` (arguments, plan,
progress bar, `run_cli`), `paired` (the paired A/B protocol of the A/B scripts: CUDA-graph bursts of the entries
alternated back to back, ratios of paired cycles with a bootstrap interval and an A/A control; its GPU timer is
`runtime.GraphBurstTimer`), `fp8status` (issue 10's fa3-fp8 status table, `--fp8-status`: kernel alone, quantisation
pass, pass + kernel, single accumulator, bf16 fa3, flash-attn-4, in paired runs, with a PASS / MISS line per target).
"""
from fa_variants.bench.cli import configure_parser, run_cli

__all__ = ["configure_parser", "run_cli"]
