"""Attention over one key window per sequence (``common.mask_windows.Window``: a padded batch's mask) as plain
``fa_variants.attention`` calls on slices, so every backend and its backward serve it unchanged.

Sequence b's window (start, end, offset) says query i sees key j iff start <= j < end and, causal, j <= i + offset.
On the slice K[start:end] the kernels' bottom-right causal mask with ``split`` = end - offset query rows is exactly
that (row i sees j - start <= i + (end - start) - split, i.e. j <= i + offset); the rows from ``split`` on see the
whole window (full attention). So each group of sequences with one window takes at most two calls: rows [0, split)
causal and rows [split, seqlen_q) full, against K and V cut to the window. Rows that see no key give 0, LSE -inf.

Most padded batches take one call: where every window's causal diagonal ends at its last key (offset = end -
seqlen_q: left padding, a prompt batch or generation with a KV cache; or full windows), the windows are the call's
``seqlens_k`` (ends) and ``leftpad_k`` (starts), which fa3 and fa2 read in their kernels (one launch) and the other
backends run per distinct window. The rest (a causal batch padded on the right: its padding rows see the whole
window) take at most two calls per distinct window, each sequence's keys gathered when the group is not the whole
batch. Eager only (the windows are read on the host).
"""
from __future__ import annotations

import torch

from fa_variants.common import batch_groups
from fa_variants.common.mask_windows import Window

__all__ = ["attention", "one_call", "one_call_windows"]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windows: list[Window], *,
              softmax_scale: float | None = None, backend: str = "auto", return_lse: bool = False):
    """``fa_variants.attention(q, k, v)`` with sequence b restricted to ``windows[b]`` (q: (batch, seqlen_q,
    num_heads, head_dim); k, v: (batch, seqlen_k, num_heads_kv, head_dim)). Returns out (batch, seqlen_q, num_heads,
    head_dim) in ``fa_variants.attention``'s output dtype, and with ``return_lse`` the float32 natural-log LSE
    (batch, num_heads, seqlen_q). Errors as ``fa_variants.attention``'s (each call validates its slice); autograd
    flows through the calls (their own backwards)."""
    from fa_variants import api

    batch, seqlen_q, heads, _ = q.shape
    single = one_call_windows(windows, seqlen_q)
    if single is not None:  # seqlens_k and leftpad_k express every window (on the CPU: checked there, no sync)
        causal, (ends, starts) = single
        return api.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
                             return_lse=return_lse, seqlens_k=ends, leftpad_k=starts)
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


def one_call_windows(windows: list[Window], seqlen_q: int) -> tuple[bool, torch.Tensor] | None:
    """(`one_call`'s causal flag, int32 (2, batch) on the CPU: each window's end (seqlens_k), then its first key
    (leftpad_k)), or None where no one call expresses the windows."""
    causal = one_call(windows, seqlen_q)
    if causal is None:
        return None
    return causal, torch.tensor([[w.end for w in windows], [w.start for w in windows]], dtype=torch.int32)


def one_call(windows: list[Window], seqlen_q: int) -> bool | None:
    """The causal flag of one ``attention(seqlens_k=ends, leftpad_k=starts)`` call that expresses every window, or
    None. False where no row's causal limit bites inside its window (offset None, or at least end - 1); True where
    every non-empty window's diagonal ends at its last key (offset = end - seqlen_q: bottom-right against its
    count; with one query row the two coincide)."""
    live = [w for w in windows if w.end > w.start]
    if all(w.offset is None or w.offset >= w.end - 1 for w in live):
        return False
    if all(w.offset is not None and w.offset == w.end - seqlen_q for w in live):
        return True
    return None
