"""Attention over one key window per sequence (``common.mask_windows.Window``: a padded batch's mask) as one
``fa_variants.attention`` call, so every backend and its backward serve it unchanged.

Sequence b's window (start, end, offset) says query i sees key j iff start <= j < end and, causal, j <= i + offset.
Rows that see no key give 0, LSE -inf.

A padded batch takes one call: the windows are the call's ``seqlens_k`` (ends) and ``leftpad_k`` (starts), and,
causal, each diagonal is placed by ``seqlens_q`` = end - offset (the query count it is bottom-right against: the
rows from there on see the whole window): seqlen_q where it ends at the window's last key (left padding, a prompt
batch or generation with a KV cache), the length for a causal batch padded on the right (offset 0, its padding rows
seeing the whole sequence), 0 for a full window in a causal batch. A window is first cut at the last key its last
row sees (end <= offset + seqlen_q: ``common.mask_windows.as_windows`` reads masks so), which keeps every count
within [0, seqlen_q]. fa3 and fa2 read all three in their kernels (one launch); the other backends run per distinct
window (``api.run_seqlens_k``).
"""
from __future__ import annotations

import torch

from fa_variants.common.mask_windows import Window

__all__ = ["attention", "cut", "needs_counts", "one_call", "one_call_windows", "query_count"]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windows: list[Window], *,
              softmax_scale: float | None = None, backend: str = "auto", return_lse: bool = False):
    """``fa_variants.attention(q, k, v)`` with sequence b restricted to ``windows[b]`` (q: (batch, seqlen_q,
    num_heads, head_dim); k, v: (batch, seqlen_k, num_heads_kv, head_dim)). Returns out (batch, seqlen_q, num_heads,
    head_dim) in ``fa_variants.attention``'s output dtype, and with ``return_lse`` the float32 natural-log LSE
    (batch, num_heads, seqlen_q). Errors as ``fa_variants.attention``'s; autograd flows through the call."""
    from fa_variants import api

    seqlen_q = q.shape[1]
    causal, (ends, starts, counts) = one_call_windows(windows, seqlen_q)  # on the CPU: checked there, no sync
    # whether a diagonal moves, from the windows themselves: reading `counts` back would stop torch.compile's
    # fullgraph and torch.export on a data-dependent branch
    moves = causal and any(query_count(cut(w, seqlen_q), seqlen_q) != seqlen_q for w in windows)
    return api.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend, return_lse=return_lse,
                         seqlens_k=ends, leftpad_k=starts, seqlens_q=counts if moves else None)


def one_call_windows(windows: list[Window], seqlen_q: int,
                     causal: bool | None = None) -> tuple[bool, torch.Tensor]:
    """(`one_call`'s causal flag, int32 (3, batch) on the CPU: each window's end (seqlens_k), its first key
    (leftpad_k), and its query count (seqlens_q: `query_count`; seqlen_q where the diagonal needs none)), the windows
    first cut at their last row's last key (`cut`). ``causal``: the flag of the call that will run them when the
    caller fixed it (a traced layer's), else `one_call`'s: True gives every window its `query_count` (a full one
    0: every row sees all of it), False seqlen_q."""
    windows = [cut(w, seqlen_q) for w in windows]
    needed = one_call(windows, seqlen_q)
    causal = needed if causal is None else causal
    counts = [query_count(w, seqlen_q) if causal else seqlen_q for w in windows]
    return needed, torch.tensor([[w.end for w in windows], [w.start for w in windows], counts], dtype=torch.int32)


def cut(window: Window, seqlen_q: int) -> Window:
    """The window without the keys no row sees: causal, its last row (seqlen_q - 1) sees keys up to seqlen_q - 1 +
    offset, so end <= offset + seqlen_q (never below start: an empty window stays one)."""
    if window.offset is None or window.end <= window.offset + seqlen_q:
        return window
    return window._replace(end=max(window.start, window.offset + seqlen_q))


def query_count(window: Window, seqlen_q: int) -> int:
    """The query count a (`cut`) window's causal diagonal is bottom-right against (``fa_variants.attention``'s
    seqlens_q): query i sees key j <= i + offset iff j - start <= i + (end - start) - (end - offset), so end -
    offset, at most seqlen_q; 0 for a full window (offset None: every row sees all of it) or one whose limit never
    bites; seqlen_q for an empty one."""
    if window.end <= window.start:
        return seqlen_q
    return 0 if window.offset is None else max(0, window.end - window.offset)


def needs_counts(counts: torch.Tensor, seqlen_q: int) -> bool:
    """Whether a one-call batch's query counts (`one_call_windows`' third row, on the CPU) move any diagonal: some
    differ from seqlen_q (where they all equal it, seqlens_k and leftpad_k say everything)."""
    return bool((counts != seqlen_q).any())


def one_call(windows: list[Window], seqlen_q: int) -> bool:
    """The causal flag of the ``attention(seqlens_k=ends, leftpad_k=starts, seqlens_q=counts)`` call that expresses
    the (`cut`) windows: False where no row's causal limit bites inside its window (offset None, or at least end -
    1), else True (each diagonal placed by its `query_count`)."""
    live = [w for w in windows if w.end > w.start]
    return not all(w.offset is None or w.offset >= w.end - 1 for w in live)
