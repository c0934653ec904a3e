"""Attention over one key window per sequence (``common.mask_windows.Window``: a padded batch's mask) as plain
``fa_variants.attention`` calls on slices, so every backend and its backward serve it unchanged.

Sequence b's window (start, end, offset) says query i sees key j iff start <= j < end and, causal, j <= i + offset.
On the slice K[start:end] the kernels' bottom-right causal mask with ``split`` = end - offset query rows is exactly
that (row i sees j - start <= i + (end - start) - split, i.e. j <= i + offset); the rows from ``split`` on see the
whole window (full attention). So each group of sequences with one window takes at most two calls: rows [0, split)
causal and rows [split, seqlen_q) full, against K and V cut to the window. Rows that see no key give 0, LSE -inf.

Cost: two calls per distinct window (a left-padded batch of distinct paddings: one per sequence), each sequence's
keys gathered when the group is not the whole batch; eager only (the windows are read on the host).
"""
from __future__ import annotations

import torch

from fa_variants.common import batch_groups
from fa_variants.common.mask_windows import Window

__all__ = ["attention"]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windows: list[Window], *,
              softmax_scale: float | None = None, backend: str = "auto", return_lse: bool = False):
    """``fa_variants.attention(q, k, v)`` with sequence b restricted to ``windows[b]`` (q: (batch, seqlen_q,
    num_heads, head_dim); k, v: (batch, seqlen_k, num_heads_kv, head_dim)). Returns out (batch, seqlen_q, num_heads,
    head_dim) in ``fa_variants.attention``'s output dtype, and with ``return_lse`` the float32 natural-log LSE
    (batch, num_heads, seqlen_q). Errors as ``fa_variants.attention``'s (each call validates its slice); autograd
    flows through the calls (their own backwards)."""
    from fa_variants import api

    batch, seqlen_q, heads, _ = q.shape
    out = lse = None  # made at the first group's results: their dtype (under autocast, autocast's)
    for (start, end, offset), index in batch_groups.by_value(windows, q.device):
        if end <= start:
            continue  # no key: 0, LSE -inf
        qg, kg, vg = (batch_groups.take(t, index) for t in (q, k[:, start:end], v[:, start:end]))
        split = 0 if offset is None else min(seqlen_q, max(0, end - offset))
        parts = [api.attention(qg[:, rows_], kg, vg, causal=causal, softmax_scale=softmax_scale, backend=backend,
                               return_lse=True)
                 for rows_, causal in ((slice(0, split), True), (slice(split, seqlen_q), False))
                 if rows_.stop > rows_.start]
        o, l = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 2)
        if index is None:
            out, lse = o, l
            continue
        if out is None:
            out = o.new_zeros(batch, seqlen_q, heads, o.shape[-1])
            lse = l.new_full((batch, heads, seqlen_q), float("-inf"))
        out, lse = out.index_copy(0, index, o), lse.index_copy(0, index, l)
    if out is None:  # every window empty
        out = torch.zeros(batch, seqlen_q, heads, v.shape[-1], dtype=api.output_dtype(q.dtype), device=q.device)
        lse = torch.full((batch, heads, seqlen_q), float("-inf"), dtype=torch.float32, device=q.device)
    return (out, lse) if return_lse else out
