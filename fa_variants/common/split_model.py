"""fa3's split-KV path (Flash-Decoding) step by step in torch, to check its maths on the CPU.

`split_kv_model` does per (query tile, split) what ``hopper.fa3.FlashAttention3Sm90`` does per CTA, with
the same tile arithmetic (``common.mask.BlockInfo``) and the same choices:

* the query tile's K/V tiles [0, n) with n = max(kv_tile_end, 1) are cut as ``common.split.split_ranges``;
  a split with no tile writes LSE -inf for the tile's rows and leaves its O unwritten (NaN here);
* tiles are walked from the range's last to its first; the first one walked gets the seqlen_k mask and,
  when causal, the causal mask; the others the causal mask only from ``kv_tile_causal_start`` on (absolute
  tile and key indices, the full seqlen_q and seqlen_k); unmasked keys past seqlen_k read as zeros (TMA);
* online softmax in fp32 as ``common.softmax.OnlineSoftmax`` (exp2, row sum from fp32 P), P rounded to the
  input dtype for O += P V (fp32 accumulation), O / l and LSE = (m c + log2 l) ln 2 at the end;
* one split: O rounded to the input dtype (the TMA epilogue); more: fp32 partials merged by
  ``common.split.merge`` (or ``combine_model``: the merge kernel ``common.split_combine``) and rounded once;
* packed GQA (``Sm90Config.pack_gqa``), seqlen_q = 1: the CTAs see Q, O, LSE and the partials through
  ``hopper.fa3.pack_gqa_views`` (the very function the host uses), unmasked, as the kernel runs them;
  seqlen_q > 1 (``pack_group``): tile row r is query head r % G at position r // G (``common.pack_gqa``; the
  model packs copies, the kernel views), masked causally by its own position (``BlockInfo`` with
  ``qhead_per_kvhead``).

It differs from the GPU only where the hardware rounds differently (MMA summation order, ex2/rcp
approximations): a model of the algorithm and its precision, not a bitwise emulator.
"""
from __future__ import annotations

import math

import torch

from fa_variants.common import split

LOG2_E = math.log2(math.e)


def split_kv_model(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float,
                   tile_m: int, tile_n: int, num_splits: int, pack_gqa: bool = False,
                   merge: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """fa3's result for (q, k, v) with `num_splits` splits (module docstring).

    Args:
        q: (batch, seqlen_q, num_heads, head_dim); k, v: (batch, seqlen_k, num_heads_kv, head_dim); one
            16-bit float dtype (the MMA operand type), CPU. softmax_scale > 0.
        tile_m, tile_n: the kernel config's tiles; num_splits >= 1; pack_gqa: packed GQA (seqlen_q = 1: the
            host's views; more: the kernel's packing, which needs ``common.pack_gqa.packable(G, tile_m)``);
        merge: "torch" (``split.merge``) or "kernel" (``combine_model``, the merge kernel's maths).
    Returns:
        (out like q, lse float32 (batch, num_heads, seqlen_q)), natural log.
    """
    batch, seqlen_q, heads, head_dim = q.shape
    # the buffers fa3._plan_call allocates: (num_splits * batch) "batches"; the CTAs write through views of them
    o_parts = torch.full((num_splits * batch, seqlen_q, heads, head_dim), math.nan, dtype=torch.float32)
    lse_parts = torch.full((num_splits * batch, heads, seqlen_q), math.nan, dtype=torch.float32)
    q_cta, o_cta, lse_cta = q, o_parts, lse_parts
    group = 1
    if pack_gqa and seqlen_q <= 1:
        from fa_variants.hopper.fa3 import pack_gqa_views

        q_cta, o_cta, lse_cta = pack_gqa_views(q, o_parts, lse_parts, k.shape[2])
        causal = False  # as FlashAttention3Sm90.__init__: nothing to hide at seqlen_q = 1
    elif pack_gqa:
        from fa_variants.common.pack_gqa import packable

        group = heads // k.shape[2]
        assert packable(group, tile_m), (group, tile_m)
        q_cta = _pack(q, group)
        o_cta = torch.full((num_splits * batch, seqlen_q * group, k.shape[2], head_dim), math.nan, dtype=torch.float32)
        lse_cta = torch.full((num_splits * batch, k.shape[2], seqlen_q * group), math.nan, dtype=torch.float32)
    _ctas(q_cta, k, v, o_cta.unflatten(0, (num_splits, batch)), lse_cta.unflatten(0, (num_splits, batch)),
          causal=causal, softmax_scale=softmax_scale, tile_m=tile_m, tile_n=tile_n, num_splits=num_splits,
          group=group)
    if group > 1:  # the kernel's packed views write these places of the unpacked buffers
        o_parts = _unpack(o_cta, group)
        lse_parts = lse_cta.unflatten(2, (seqlen_q, group)).permute(0, 1, 3, 2).reshape(lse_parts.shape)
    o_parts, lse_parts = o_parts.unflatten(0, (num_splits, batch)), lse_parts.unflatten(0, (num_splits, batch))
    if num_splits == 1:
        return o_parts[0].to(q.dtype), lse_parts[0]
    if merge == "kernel":
        return combine_model(o_parts, lse_parts, q.dtype)
    lse = torch.empty(batch, heads, seqlen_q, dtype=torch.float32)
    return split.merge(o_parts, lse_parts, torch.empty_like(q), lse)


def _pack(q: torch.Tensor, group: int) -> torch.Tensor:
    """(B, Nq, H, D) -> (B, Nq G, Hkv, D), row i G + g of KV head j = query head j G + g at position i."""
    batch, seqlen_q, heads, head_dim = q.shape
    return q.unflatten(2, (heads // group, group)).permute(0, 1, 3, 2, 4).reshape(batch, seqlen_q * group, -1, head_dim)


def _unpack(o: torch.Tensor, group: int) -> torch.Tensor:
    """``_pack``'s inverse: (B, Nq G, Hkv, D) -> (B, Nq, H, D)."""
    batch, rows, heads_kv, head_dim = o.shape
    return o.unflatten(1, (rows // group, group)).permute(0, 1, 3, 2, 4).reshape(batch, rows // group, -1, head_dim)


def _ctas(q, k, v, o_parts, lse_parts, *, causal: bool, softmax_scale: float, tile_m: int, tile_n: int,
          num_splits: int, group: int = 1) -> None:
    """Every CTA of the split kernel: writes o_parts (num_splits, B, Nq, H, D) and lse_parts (num_splits, B,
    H, Nq) for the problem (q, k, v) the kernel sees (views of the buffers; packed or not). group > 1: q's rows
    are packed (``_pack``): row r is at query position r // group."""
    from fa_variants.common.mask import BlockInfo  # tile arithmetic on ints; imports the DSL

    batch, rows_q, heads, head_dim = q.shape
    seqlen_q = rows_q // group  # query positions
    seqlen_k, kv_group = k.shape[1], heads // k.shape[2]
    c = torch.tensor(softmax_scale * LOG2_E, dtype=torch.float32)
    blocks = BlockInfo(tile_m, tile_n, causal, group)
    pad = max(-(-seqlen_k // tile_n), 1) * tile_n - seqlen_k  # TMA reads zeros past seqlen_k
    kf, vf = (torch.nn.functional.pad(t.float(), (0, 0, 0, 0, 0, pad)).repeat_interleave(kv_group, 2).transpose(1, 2)
              for t in (k, v))  # (B, H, keys, D)
    for m_block in range(-(-rows_q // tile_m)):
        r0, r1 = m_block * tile_m, min((m_block + 1) * tile_m, rows_q)
        qt = q[:, r0:r1].float().transpose(1, 2)  # (B, H, rows, D)
        rows = torch.arange(r0, r1).view(-1, 1) // group  # query positions
        n_total = max(blocks.kv_tile_end(m_block, seqlen_q, seqlen_k), 1)
        for s, (n_start, n_end) in enumerate(split.split_ranges(n_total, num_splits)):
            if n_end <= n_start:
                lse_parts[s, :, :, r0:r1] = -math.inf
                continue
            first_masked = max(blocks.kv_tile_causal_start(m_block, seqlen_q, seqlen_k), n_start) if causal else n_end
            m = torch.full((batch, heads, r1 - r0), -math.inf, dtype=torch.float32)
            l = torch.zeros(batch, heads, r1 - r0, dtype=torch.float32)
            o = torch.zeros(batch, heads, r1 - r0, head_dim, dtype=torch.float32)
            for n in range(n_end - 1, n_start - 1, -1):
                cols = torch.arange(n * tile_n, (n + 1) * tile_n).view(1, -1)
                hide = torch.zeros(r1 - r0, tile_n, dtype=torch.bool)
                if n == n_end - 1:
                    hide |= cols >= seqlen_k
                if causal and (n == n_end - 1 or n >= first_masked):
                    hide |= cols > rows + seqlen_k - seqlen_q
                scores = (qt @ kf[:, :, n * tile_n:(n + 1) * tile_n].transpose(-1, -2)).masked_fill(hide, -math.inf)
                m_new = torch.maximum(m, scores.amax(-1))
                m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
                p = torch.exp2((scores - m_safe.unsqueeze(-1)) * c)
                alpha = torch.exp2((m - m_safe) * c)
                l = l * alpha + p.sum(-1)
                o = o * alpha.unsqueeze(-1) + p.to(q.dtype).float() @ vf[:, :, n * tile_n:(n + 1) * tile_n]
                m = m_new
            empty = l == 0
            o = o * torch.where(empty, 0.0, 1.0 / l).unsqueeze(-1)
            o_parts[s, :, r0:r1] = o.transpose(1, 2)
            lse_parts[s, :, :, r0:r1] = torch.where(empty, -math.inf, (m * c + torch.log2(l)) * math.log(2))


def combine_model(o_parts: torch.Tensor, lse_parts: torch.Tensor, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``common.split_combine``'s kernel in torch (float32, the same operations in the same split order; exp
    and log exact here, ex2 / lg2 approximations on the GPU): o_parts (S, B, Nq, H, D), lse_parts (S, B, H, Nq)
    -> (out (B, Nq, H, D) in out_dtype, lse (B, H, Nq))."""
    lse_parts = lse_parts.float().permute(0, 1, 3, 2)  # (S, B, Nq, H): the kernel's (row, head) per CTA
    m = torch.full(lse_parts.shape[1:], -math.inf, dtype=torch.float32)
    for x in lse_parts:
        m = torch.maximum(m, x)  # NaN-propagating, like the kernel's max
    m_safe = torch.where(m == -math.inf, 0.0, m)
    log2_e = torch.tensor(LOG2_E, dtype=torch.float32)
    l = torch.zeros_like(m)
    for x in lse_parts:
        l = l + torch.exp2((x - m_safe) * log2_e)
    lse = torch.where(l == 0, -math.inf, m_safe + torch.log2(l) * torch.tensor(math.log(2), dtype=torch.float32))
    acc = torch.zeros(o_parts.shape[1:], dtype=torch.float32)
    for x, o in zip(lse_parts, o_parts.float()):
        w = torch.exp2((x - lse) * log2_e).unsqueeze(-1)
        acc = torch.where(((x != -math.inf) & (l != 0)).unsqueeze(-1), acc + w * o, acc)
    return acc.to(out_dtype), lse.permute(0, 2, 1)
