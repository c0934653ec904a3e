"""FlashAttention-2 forward for Ampere (sm80; runs on sm86/89/90 too): `FlashAttention2Sm80`.

The algorithm is Dao 2023, "FlashAttention-2", Algorithm 1 (forward) with the work partitioning of
section 3.2, written with the CuTe DSL:

* Grid over (Q tiles, heads, batch): each CTA owns one Br x D tile of Q (the Q *outer* loop runs
  across CTAs, in parallel over the sequence) and streams the K/V tiles it needs (the inner loop).
* 4 warps split the Br rows of Q; K/V tiles are shared by all warps in shared memory, and each warp
  owns whole rows of S, P and O, so no cross-warp reduction is ever needed.
* Global -> shared with cp.async; K and V double-buffered so tile j+1 loads while tile j computes.
  Shared -> registers with ldmatrix; S = Q K^T and O += P V with mma.sync m16n8k16 (fp32 accumulate);
  P converted to fp16/bf16 in registers and fed straight back as the A operand.
* Online softmax with exp2 and the scale folded into log2(e); O rescaled by exp2(m_old - m_new);
  the division by l once at the end (deferred normalisation); LSE written (natural log).
* Causal is bottom-right aligned: K/V tiles wholly above the diagonal are never loaded; only the
  tiles crossing it are masked; a row that sees no key gets O = 0 and LSE = -inf. K/V tiles are
  visited from the last to the first, so the tiles that need masks (the diagonal ones, and the
  sequence-end tail) come first and the long unmasked run follows.
* Any seqlen_q, seqlen_k >= 1: tail rows are predicated (never read out of bounds), zero-filled in
  shared memory, masked in S, and never written. GQA / MQA: query head h reads KV head
  h // (num_heads // num_heads_kv). Any strides with a unit last dimension (16-byte aligned).

The module's ``VARIANT`` record (`common.launch.Variant`) registers it; ``run`` launches it. The kernel class
lives in ``ampere.fa2_kernel`` (the CuTe DSL), imported only to compile; this module is plain Python + torch.
Adapted from NVIDIA/cutlass:examples/python/CuTeDSL/ampere/flash_attention_v2.py::FlashAttentionForwardAmpere
(single K/V stage, no LSE, top-left causal; this kernel double-buffers, writes the LSE, and aligns causal
bottom-right) and Dao-AILab/flash-attention:flash_attn/cute/flash_fwd.py::FlashAttentionForwardSm80.
"""
from __future__ import annotations

import torch

from fa_variants.common import interop
from fa_variants.common.cache import StaticConfig
from fa_variants.common.config import Sm80Config, smem_capacity
from fa_variants.common.launch import Variant

HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 256)
DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
MAX_GRID_YZ = 65535  # heads and batch ride on gridDim.y / gridDim.z


def __getattr__(name: str):
    """``FlashAttention2Sm80`` from the DSL kernel module on first use (this module imports without the DSL)."""
    if name == "FlashAttention2Sm80":
        from fa_variants.ampere import fa2_kernel

        return fa2_kernel.FlashAttention2Sm80
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------------------------
# the variant record
# ----------------------------------------------------------------------------------------------
# Tile table. Following FlashAttention-2's own sm80 table (flash-attention csrc flash_fwd_launch_template.h)
# as a start: 4 warps, tile_m = 128 (two 16-row MMA blocks per warp, so each K/V fragment read from shared
# memory feeds two MMAs), and tile_m = 64 for D = 256 (a 128-row O accumulator would not fit in registers).
# tile_n is then the widest that compiles without local-memory spills (`fa-variants compile`, sm_80, ptxas of
# nvidia-cutlass-dsl 4.8.1): FA2's 128 x 128 at D = 64 and 128 x 64 at D = 96 / 128 spill 8-32 bytes once
# K/V are double-buffered, so D = 64 uses tile_n = 64 and D = 96 / 128 use 32 (FA2's own choice for sm86 /
# sm89 at D = 128). K and V are double-buffered (stages = 2). Parts with 99 KiB of shared memory per CTA
# (sm86 / sm89 / sm120) get a narrower tile_n at D = 256.
CONFIGS = {64: Sm80Config(128, 64), 96: Sm80Config(128, 32), 128: Sm80Config(128, 32), 256: Sm80Config(64, 64)}
SMALL_SMEM_CONFIGS = {256: Sm80Config(64, 32)}


def default_config(arch: str, head_dim: int, causal: bool) -> Sm80Config:
    """The FA2 tile configuration for an arch and head_dim (ValueError if head_dim is unsupported)."""
    if head_dim not in CONFIGS:
        raise ValueError(f"fa2: head_dim {head_dim} has no tile configuration; supported: {sorted(CONFIGS)}")
    config = CONFIGS[head_dim]
    if smem_capacity(arch) < config.smem_bytes(head_dim):
        config = SMALL_SMEM_CONFIGS.get(head_dim, config)
    return config.check(arch, head_dim)


def _check_config(config: Sm80Config, arch: str, head_dim: int) -> Sm80Config:
    if config.stages != 2 or config.q_stages != 1:
        raise ValueError(f"fa2: {config}: the K/V pipeline is written for stages=2, q_stages=1")
    return config.check(arch, head_dim)


def _build(cfg: StaticConfig):
    from fa_variants.ampere.fa2_kernel import FlashAttention2Sm80  # the DSL: only to compile

    kernel = FlashAttention2Sm80(interop.cute_dtype(cfg.dtype), cfg.head_dim, cfg.causal, cfg.config)
    return kernel, interop.fake_attention_args(cfg.dtype, cfg.head_dim, cfg.align)


def _check_problem(config: Sm80Config, q: torch.Tensor, k: torch.Tensor) -> None:
    b, _, h, _ = q.shape
    if h > MAX_GRID_YZ or b > MAX_GRID_YZ:
        raise ValueError(f"fa2: num_heads ({h}) and batch ({b}) must each be <= {MAX_GRID_YZ} "
                         "(they index gridDim.y / gridDim.z)")


VARIANT = Variant(
    "fa2", archs=("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a"), dtypes=DTYPES, head_dims=HEAD_DIMS,
    default_config=default_config, check_config=_check_config, build=_build, check_problem=_check_problem)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float,
        config: Sm80Config | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FA2 forward on CUDA tensors (`common.launch.launch`).

    Args: q (B, Nq, H, D), k and v (B, Nk, Hkv, D), fp16 or bf16, H % Hkv == 0, D in HEAD_DIMS,
    last-dimension stride 1 (other strides anything; inputs not 16-byte aligned are copied);
    softmax_scale any finite real; `config` overrides the tile table (tile sweeps).
    Returns (out (B, Nq, H, D) like q, lse float32 (B, H, Nq), natural log).
    Raises ValueError for a shape it cannot serve (head_dim, dtype, H or B above 65535).
    """
    return VARIANT.run(q, k, v, causal=causal, softmax_scale=softmax_scale, config=config)
