"""A batch's sequences in groups of one value (a KV length, a key window), for the paths that run each group as one
plain call on its sequences: ``api.run_seqlens_k`` (kernels that do not read lengths), the backward length by length
(``integrations.backward``) and padded batches' key windows (``fa_variants.windowed``). Host side, plain torch."""
from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

import torch

__all__ = ["by_value", "take"]


def by_value(values: Sequence[Hashable], device: torch.device, *,
             ascending: bool = False) -> Iterator[tuple[Hashable, torch.Tensor | None]]:
    """(value, index) for each distinct value of ``values`` (one per sequence), in the order each first comes (or of
    the values, ``ascending``: lengths, shortest first): index the positions of its sequences, int64 on ``device``,
    or None when the group is the whole batch (views serve, no gather). The indices are slices of one tensor copied
    once: a copy per group would wait for the GPU each time."""
    groups: dict[Hashable, list[int]] = {}
    for b, value in enumerate(values):
        groups.setdefault(value, []).append(b)
    if ascending:
        groups = dict(sorted(groups.items()))
    if len(groups) == 1:
        yield values[0], None
        return
    order = torch.tensor([b for rows in groups.values() for b in rows], device=device)
    start = 0
    for value, rows in groups.items():
        yield value, order[start:start + len(rows)]
        start += len(rows)


def take(t: torch.Tensor | None, index: torch.Tensor | None) -> torch.Tensor | None:
    """The group's sequences of ``t`` (batch first): t itself for index None (the whole batch), None for t None."""
    return t if t is None or index is None else t.index_select(0, index)
