"""Layout facts of the fa3-fp8 kernel that the quantisation pass must honour (plain Python + torch).

The FP8 quantisation (``fa_variants.fp8.quantize``) and the fa3-fp8 kernel (``fa_variants.hopper.fa3_fp8``)
agree here on the scale-block sizes and on how V is stored. Nothing here imports the CuTe DSL.

* ``KERNEL_TILES``: the one source of the kernel's tile shape per head_dim, (tile_m, tile_n) = (Br, Bc): the
  kernel's default config (``fa_variants.hopper.fa3_fp8.DEFAULT_CONFIGS``) takes its tiles from here and the
  quantisation takes its block heights from here, so the two cannot drift apart.
* ``KERNEL_PROMOTE_EVERY``: the promotion interval of the kernel's default config per head_dim (two-level
  accumulation: K/V tiles per temporary accumulator), which the default recipe (``FP8Config.promote_every`` None)
  and so the emulation read too: kernel and emulation cannot disagree on it.
* ``TILE_M``: query rows per Q block scale (128). The kernel's tile_m is 128 or 192: each of its 64-row
  warpgroups lies inside one Q scale block and reads that block's descale.
* ``tile_n(head_dim)``: keys per K/V tile (Bc) of the kernel at that head_dim, and so per K and V block scale
  (the kernel indexes the K/V descales by its tile, so the two must be equal: ``FP8Inputs.block_n`` records the
  height the inputs were quantised with and the kernel refuses other heights).
* V is stored transposed, ``v_t`` (batch, num_heads_kv, head_dim, seqlen_k_padded), tokens contiguous:
  the FP8 WGMMA (PTX ``wgmma.mma_async ... .e4m3``) has no transpose bit, so the B operand of O = P V must
  be K-major, K being the token dimension. ``seqlen_k_padded`` is a multiple of ``K_ALIGN_TOKENS`` (16
  e4m3 = 16 bytes, TMA's stride rule); the padding tokens are zero.
* Tokens are permuted inside each group of ``V_TOKEN_GROUP`` = 16 by ``v_token_order`` so that P, converted
  in place from the fp32 S accumulator of Q K^T, is directly the register A operand of the k32 FP8 WGMMA.
  Why (PTX ISA, "Register fragments and shared memory matrix layouts" of wgmma, m64nNk16 accumulator and
  m64nNk32 8-bit A): the thread with lane % 4 = t holds, of each 16 columns of a row of S, the columns
  2t, 2t+1, 2t+8, 2t+9; the k32 A fragment wants, at its positions 4t .. 4t+3 of each 16-wide half, four
  values of that thread. Feeding the thread's own four S values at those positions multiplies position
  p = 4t + j by V's row of token 2t + (j % 2) + 8 (j // 2), which ``v_token_order`` puts there. The
  alternative (quad shuffles of P before every P V GEMM, FA3's C++ ``permute_Cregs_fp8`` style) costs
  shuffles per tile; this costs nothing in the kernel (SageAttention's trick).
"""
from __future__ import annotations

import torch

__all__ = ["TILE_M", "q_scale_block", "KERNEL_TILES", "KERNEL_PROMOTE_EVERY", "promote_every", "tile_m", "tile_n", "V_TOKEN_GROUP", "V_GROUP_ORDER", "v_token_order", "K_ALIGN_TOKENS",
           "padded_seqlen_k", "kernel_tiles"]

TILE_M = 128

# (tile_m, tile_n) of the kernel's default config by head_dim; tile_n a multiple of 32 (the k of the FP8 P V
# WGMMA). Chosen on the H200 (bench/NOTES.md, FA3-FP8 A/B: fa3-fp8 / bf16 fa3 at N 4k / 16k, non-causal):
# 64: tile_m 192 (three consumer warpgroups; 1.05-1.06x, the old 128 x 128 0.85-0.96x), tile_n 192 with serial
#     steps since session 6 (fa3_fp8.DEFAULT_SWITCHES: 570 / 499 / 658 / 627 TFLOP/s against 515 / 460 / 535 / 526
#     for 192 x 128, N 4k / 4k causal / 16k / 16k causal);
# 128: tile_n 256 without intra-warpgroup overlap (1.25-1.35x; the old 128 x 128 with overlap 0.97-1.08x);
# 256: 128 x 128 (the P V GEMM split in four slices of d instead, fa3_fp8._default).
KERNEL_TILES = {64: (192, 192), 96: (128, 128), 128: (128, 256), 256: (128, 128)}

# Tiles per promotion of the two-level accumulator in the kernel's default config by head_dim (the default
# recipe's interval, ``FP8Config.promote_every=None``). 1 everywhere. At 64, every 4 tiles measured 1.04 / 0.99 /
# 1.15 / 1.10x of every tile (H200, scripts/fa3_fp8_speed_ab.py --set fp8speed, N 4k / 4k causal / 16k / 16k
# causal) and then 1.03 / 0.98 / 1.00 / 0.95x in the next session's A/B (--set fp8flip): not shown, so not the
# default. 128 (256-key tiles) and 256: an interval's temporary for the whole of head_dim does not fit in
# registers beside O and S there. The table is the one place to change it (kernel, recipe and emulation follow).
KERNEL_PROMOTE_EVERY = {64: 1, 96: 1, 128: 1, 256: 1}

V_TOKEN_GROUP = 16
# Position p of a group holds token V_GROUP_ORDER[p]: p = 4t + j -> 2t + (j % 2) + 8 (j // 2).
V_GROUP_ORDER = tuple(2 * (p // 4) + (p % 2) + 8 * ((p % 4) // 2) for p in range(V_TOKEN_GROUP))

K_ALIGN_TOKENS = 16


def kernel_tiles(head_dim: int) -> tuple[int, int]:
    """(tile_m, tile_n) of the fa3-fp8 kernel's default config at ``head_dim`` (``KERNEL_TILES``).

    Raises ValueError for a head_dim the kernel does not serve (64, 96, 128, 256)."""
    if head_dim not in KERNEL_TILES:
        raise ValueError(f"fa3-fp8: head_dim {head_dim} is not supported; supported: {tuple(KERNEL_TILES)}")
    return KERNEL_TILES[head_dim]


def promote_every(head_dim: int) -> int:
    """K/V tiles per promotion of the two-level accumulator in the fa3-fp8 kernel's default config at ``head_dim``
    (``KERNEL_PROMOTE_EVERY``); 1 for a head_dim the kernel does not serve (the emulation's extras)."""
    return KERNEL_PROMOTE_EVERY.get(head_dim, 1)


def tile_m(head_dim: int) -> int:
    """Query rows per CTA tile of the fa3-fp8 kernel at ``head_dim`` (128 or 192; Q scale blocks stay TILE_M).
    Raises ValueError as ``kernel_tiles``."""
    return kernel_tiles(head_dim)[0]


def tile_n(head_dim: int) -> int:
    """Keys per K/V tile (and per K/V block scale) of the fa3-fp8 kernel at ``head_dim``.

    Raises ValueError for a head_dim the kernel does not serve (64, 96, 128, 256)."""
    return kernel_tiles(head_dim)[1]


def v_token_order(n: int) -> torch.LongTensor:
    """Permutation of range(n) for V's token dimension: ``v_t[..., p] = v[token order[p]]`` (gather).

    n must be a multiple of V_TOKEN_GROUP (pad first: ``padded_seqlen_k``); ValueError otherwise.
    The permutation stays inside each group of V_TOKEN_GROUP tokens and is its own kind of shuffle,
    not an involution: invert it with ``torch.argsort``."""
    if n < 0 or n % V_TOKEN_GROUP:
        raise ValueError(f"v_token_order: n={n} must be a non-negative multiple of {V_TOKEN_GROUP}")
    base = torch.arange(0, n, V_TOKEN_GROUP, dtype=torch.long, device="cpu").unsqueeze(1)  # not the default device
    return (base + torch.tensor(V_GROUP_ORDER, dtype=torch.long, device="cpu")).reshape(-1)


def q_scale_block(first_row, num_q_blocks, _min=min):
    """The Q scale block (index into q_descale's last dimension, ``cdiv(seqlen_q, TILE_M)`` blocks) whose descale a
    64-row warpgroup of the fa3-fp8 kernel reads: its first row // TILE_M, clamped to the last block.

    The clamp matters where the kernel's tile_m (192) is no multiple of TILE_M: the last query tile's last warpgroup
    may start at or past cdiv(seqlen_q, TILE_M) TILE_M (seqlen_q 113: rows 128-191 of the one 192-row tile, block 1 of
    1), one past q_descale's end, read out of bounds before (compute-sanitizer memcheck, session 10). Such a
    warpgroup holds no row < seqlen_q (first_row >= cdiv(seqlen_q, TILE_M) TILE_M >= seqlen_q): its O and LSE are
    never stored, so any finite descale will do; every warpgroup with a real row gets first_row // TILE_M unchanged.
    first_row: int >= 0 (or a DSL Int32 with ``_min=cutlass.min``); num_q_blocks >= 1."""
    return _min(first_row // TILE_M, num_q_blocks - 1)


def padded_seqlen_k(seqlen_k: int) -> int:
    """round_up(seqlen_k, K_ALIGN_TOKENS): the token count of ``v_t``."""
    return -(-seqlen_k // K_ALIGN_TOKENS) * K_ALIGN_TOKENS
