"""Checks shared by the public entry points' argument contracts. Pure Python (no torch import).

``is_int(value)``: the one rule for "an integer argument" across fa_variants: a Python int or a numpy integer
(both are ``numbers.Integral``; torch takes numpy integers wherever it takes an int), never a bool (``True``
is an ``int`` subclass; ``numpy.bool_`` is not ``Integral``). ``numbers.Integral`` rather than
``operator.index``: the latter would also take a 0-d integer torch.Tensor (a device sync, a graph break while
torch.compile traces), which no entry accepts. Callers store ``int(value)`` so a numpy integer never reaches a
compile key or a repr.

``is_real(value)``: "a real-number argument" (softmax_scale, atol): ``numbers.Real`` (Python and numpy ints and
floats), never a bool.
"""
from __future__ import annotations

import numbers

__all__ = ["is_int", "is_real"]


def is_int(value) -> bool:
    """True for a Python int or a numpy integer, False for a bool and anything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    """True for a Python or numpy real number (ints included), False for a bool and anything else."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
