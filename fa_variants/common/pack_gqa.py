"""Packed GQA for any seqlen_q: the query heads of one KV head and the query positions as the rows of a tile.

With G = num_heads / num_heads_kv query heads per KV head, a kernel that packs sees, per KV head, a "query
sequence" of G * seqlen_q rows: row r is query head (kv_head * G + r % G) at query position r // G. The G heads
of a position are adjacent rows, so one tile of tile_m rows covers tile_m / G positions (G <= tile_m) or
tile_m of the G heads at one position (G a multiple of tile_m). Each K/V tile is then read once per KV head
and tile instead of once per query head (decode: seqlen_q of 1 to a few dozen rows, FlashAttention-3's
"pack GQA").

At seqlen_q = 1 no kernel change is needed: `views` re-strides the host's q, O and LSE (torch, no copy) into a
problem of num_heads_kv heads whose G "query positions" are the query heads (fa3 and fa2 decode; the kernel runs
unmasked: at seqlen_q = 1 bottom-right causal hides no key). For seqlen_q > 1,
`pack_rows` makes that view of a (seqlen, ..., heads, ...) CuTe tensor (no copy): mode 0 becomes the
hierarchical ((G, seqlen)) with strides (head stride, seqlen stride) and the head mode num_heads_kv heads of
stride G * head stride. TMA boxes over the view are (G, tile_m / G) or (tile_m, 1) rows: bounds clip at
seqlen, so a tile whose rows run past G * seqlen reads zeros there and never writes them back. G is a
compile-time constant (a kernel per group size; the decode config carries it, ``Sm90Config.pack_group``),
which keeps the TMA box static and the row -> position division a shift or a multiply.

Row r's position r // G is what causal masking compares (``common.mask``, ``qhead_per_kvhead``).
Our own formulation of the idea in Dao-AILab/flash-attention (hopper/ and flash_attn/cute/pack_gqa.py, whose
layouts put the head index fastest in the packed mode too).
"""
from __future__ import annotations

import torch


def packable(group: int, tile_m: int) -> bool:
    """Whether a group of G query heads per KV head packs into tile_m-row tiles with static TMA boxes:
    G divides tile_m or tile_m divides G."""
    return group >= 1 and (tile_m % group == 0 or group % tile_m == 0)


def packed_row_tiles(seqlen_q: int, group: int, tile_m: int) -> int:
    """Tiles of tile_m rows per KV head (and batch) when packed: ceil(G seqlen_q / tile_m)."""
    return -(-seqlen_q * group // tile_m)


def pack_rows(t, group: int, head_mode: int):
    """A view of CuTe tensor `t` (mode 0 the query positions, mode `head_mode` the query heads) with mode 0
    ((group, seqlen)) and mode `head_mode` the num_heads // group KV heads (module docstring). Host or device
    side; `group` a Python int."""
    import cutlass.cute as cute

    shape, stride = list(t.shape), list(t.stride)
    head_stride = stride[head_mode]
    shape[0], stride[0] = (group, shape[0]), (head_stride, stride[0])
    shape[head_mode], stride[head_mode] = shape[head_mode] // group, head_stride * group
    return cute.make_tensor(t.iterator, cute.make_layout(tuple(shape), stride=tuple(stride)))


def rows_geometry(shape: tuple, stride: tuple, heads_kv: int) -> tuple[tuple, tuple]:
    """(shape, stride) of the packed view of a (B, 1, H, D) tensor of these strides (``views``' q and out):
    (B, group, Hkv, D) with row g of KV head j = query head j group + g. Pure arithmetic (a plan works it out
    once, then re-strides each call's tensor with ``as_strided``)."""
    heads, head_dim = shape[2], shape[3]
    group = heads // heads_kv
    return (shape[0], group, heads_kv, head_dim), (stride[0], stride[2], group * stride[2], stride[3])


def lse_geometry(shape: tuple, stride: tuple, heads_kv: int) -> tuple[tuple, tuple]:
    """(shape, stride) of the packed view of a (B, H, 1) LSE of these strides: (B, Hkv, group)."""
    group = shape[1] // heads_kv
    return (shape[0], heads_kv, group), (stride[0], group * stride[1], stride[1])


def call_geometry(q: torch.Tensor, heads_kv: int) -> tuple:
    """(q_view, out_view, lse_view), each (shape, stride), of a packed call at seqlen_q = 1 with q's strides and the
    contiguous O (B, 1, H, D) and LSE (B, H, 1) a launcher allocates: what ``views`` gives, worked out once per
    plan (fa3 and fa2), so that a call re-strides with one ``as_strided`` per tensor."""
    batch, seqlen_q, heads, _ = q.shape
    out_strides = (seqlen_q * heads * q.shape[3], heads * q.shape[3], q.shape[3], 1)
    return (rows_geometry(q.shape, q.stride(), heads_kv), rows_geometry(q.shape, out_strides, heads_kv),
            lse_geometry((batch, heads, seqlen_q), (heads * seqlen_q, seqlen_q, 1), heads_kv))


def views(q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, heads_kv: int) -> tuple:
    """Packed GQA at seqlen_q = 1: q, out (B, 1, H, D) and lse (B, H, 1) as views (no copy) of a problem of
    num_heads_kv heads whose rows are the group = H / num_heads_kv query heads of each KV head:
    q, out (B, group, Hkv, D) with row g of KV head j = query head j group + g; lse (B, Hkv, group). out and
    lse may have more batches than q (the split partials: num_splits * B)."""
    return (q.as_strided(*rows_geometry(q.shape, q.stride(), heads_kv)),
            out.as_strided(*rows_geometry(out.shape, out.stride(), heads_kv)),
            lse.as_strided(*lse_geometry(lse.shape, lse.stride(), heads_kv)))
