"""A padded batch's attention mask read as one key window per sequence: what `common.mask_lengths` refuses but plain
calls on slices of each sequence express (``fa_variants.windowed``). Host side, plain torch, eager only.

Sequence b's window is (start, end, offset): query i sees key j iff start <= j < end and, when offset is not None
(causal), j <= i + offset; offset None: every query sees the whole window (full). It covers

- keys padded on the left (a left-padded prompt, generation with a KV cache): start = the padding;
- a causal batch padded on the right (training): end = the sequence's length, offset 0 (top-left causal), so the
  padding rows see the sequence's keys, as the mask says;
- both, and `mask_lengths`' bottom-right causal / full over each sequence's first keys (start 0).

The window is read from four numbers per query row (keys seen, first, last; whether they are consecutive), then the
whole mask is checked against the window it implies: a mask that is not one window per sequence, or whose heads
differ, raises ``mask_lengths.InexpressibleMask``. Rows that see no key give 0 (LSE -inf), as elsewhere.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from fa_variants.common import mask_lengths

__all__ = ["Window", "as_windows"]


class Window(NamedTuple):
    """Sequence b's keys [start, end); causal with query i seeing j <= i + offset, or full when offset is None."""
    start: int
    end: int
    offset: int | None


def as_windows(mask: torch.Tensor, seqlen_q: int, seqlen_k: int, batch: int, num_heads: int, *,
               name: str = "attention_mask", float_min_blocks: bool = True, memo: bool = False) -> list[Window]:
    """The key window of each of the ``batch`` sequences that a 4-D mask (batch or 1, heads or 1, seqlen_q or 1,
    seqlen_k or 1; bool, integer 0 / 1 or additive float, as ``mask_lengths.as_lengths`` reads them) expresses.

    Raises ``mask_lengths.InexpressibleMask`` (a mask that is not one window per sequence, heads that differ, values
    other than a mask's, a mask whose values cannot be read here) and ``as_lengths``' TypeError / ValueError for its
    shape. One device sync (the rows' counts read back together); eager only: not while torch.compile traces.
    ``memo``: the answer (or refusal) kept for this tensor while its version counter stands, as ``as_lengths``'
    (``mask_lengths.read_once``: the layers of a model read the mask they share once per step).
    """
    mask_lengths.check_shape(mask, seqlen_q, seqlen_k, batch, num_heads, name=name)
    mask_lengths._check_readable(mask)
    if seqlen_q == 0 or seqlen_k == 0 or 0 in mask.shape[:2]:
        return [Window(0, 0, None)] * batch  # no row or no key: nothing to see
    key = (batch, num_heads, seqlen_q, seqlen_k, float_min_blocks)
    return list(mask_lengths.read_once(mask, "windows", key, memo,
                                       lambda: _read(mask, seqlen_q, seqlen_k, batch, float_min_blocks)))


def _read(mask: torch.Tensor, seqlen_q: int, seqlen_k: int, batch: int, float_min_blocks: bool) -> list[Window]:
    """`as_windows` on a mask of rows and keys, read."""
    mask = mask.expand(*mask.shape[:2], seqlen_q, seqlen_k)
    stats, valid = _row_stats(mask, seqlen_k, float_min_blocks)
    seen, first, last = stats.unbind(-1)  # (batch or 1, heads or 1, seqlen_q) each
    rows = torch.arange(seqlen_q, device=mask.device)
    some = seen > 0
    start = torch.where(some, first, seqlen_k).amin(-1)  # (B, H); seqlen_k where no row sees a key
    end = torch.where(some, last + 1, 0).amax(-1)
    # causal offset: from a row whose last key is before the window's end; else (the causal limit never bites) from
    # the first row that sees a key (the rows before it see none)
    bites = some & (last < end[..., None] - 1)
    first_row = torch.where(some, rows, seqlen_q).amin(-1)
    offset = torch.where(bites.any(-1), torch.where(bites, last - rows, -seqlen_k - seqlen_q).amax(-1),
                         end - 1 - first_row)
    full = ((first == start[..., None]) & (last == end[..., None] - 1) & some).all(-1) | ~some.any(-1)
    expect_last = torch.minimum(end[..., None] - 1, rows + offset[..., None])
    expect_some = expect_last >= start[..., None]
    causal = ((some == expect_some) & (~some | ((first == start[..., None]) & (last == expect_last)))).all(-1)
    consecutive = (~some | (seen == last - first + 1)).all(-1)
    per_head = torch.stack([start, end, offset, full.long(), causal.long(), consecutive.long()], -1)
    agree = (per_head == per_head[:, :1]).all(-1).all(-1)  # (B,): the heads give one window
    read = torch.cat([valid.long().reshape(1), agree.long(), per_head[:, 0].flatten()]).tolist()
    ok, agree, windows = read[0], read[1:1 + len(agree)], read[1 + len(agree):]
    if not ok:
        raise mask_lengths.InexpressibleMask(mask_lengths.invalid_values(mask, float_min_blocks))
    found = []
    for b in range(len(agree)):
        s, e, d, is_full, is_causal, is_consecutive = windows[6 * b:6 * b + 6]
        if not (agree[b] and is_consecutive and (is_full or is_causal)):
            raise mask_lengths.InexpressibleMask(
                "this attention mask (a sliding window that bites, packed sequences, heads that differ): only one "
                "window of keys per sequence, bottom-right causal or full within it")
        found.append(Window(0, 0, None) if e <= s else Window(s, e, None if is_full else d))
    return found * batch if len(found) == 1 and batch != 1 else found


def _row_stats(mask: torch.Tensor, seqlen_k: int, float_min_blocks: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """((batch or 1, heads or 1, seqlen_q, 3) int64: each query row's count of visible keys, first and last visible
    key (seqlen_k and -1 where none), a 0-d flag: the mask's values are all valid), in chunks of rows
    (``mask_lengths.CHUNK_ELEMENTS``)."""
    keys = torch.arange(seqlen_k, device=mask.device)
    step = max(1, mask_lengths.CHUNK_ELEMENTS // max(1, mask.shape[0] * mask.shape[1] * seqlen_k))
    parts, valid = [], []
    for begin in range(0, mask.shape[2], step):
        visible, ok = mask_lengths._visible(mask[:, :, begin:begin + step], float_min_blocks)
        first = torch.where(visible, keys, seqlen_k).amin(-1)
        last = torch.where(visible, keys, -1).amax(-1)
        parts.append(torch.stack([visible.sum(-1), first, last], -1))
        valid += [] if ok is None else [ok]
    all_valid = torch.stack(valid).all() if valid else torch.ones((), dtype=torch.bool, device=mask.device)
    return torch.cat(parts, 2), all_valid

