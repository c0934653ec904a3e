"""Checks shared by the public entry points' argument contracts. Pure Python (no torch import).

``is_int(value)``: the one rule for "an integer argument" across fa_variants: a Python int or a numpy integer
(both are ``numbers.Integral``; torch takes numpy integers wherever it takes an int), never a bool (``True``
is an ``int`` subclass; ``numpy.bool_`` is not ``Integral``). ``numbers.Integral`` rather than
``operator.index``: the latter would also take a 0-d integer torch.Tensor (a device sync, a graph break while
torch.compile traces), which no entry accepts. Callers store ``int(value)`` so a numpy integer never reaches a
compile key or a repr.

``is_real(value)``: "a real-number argument" (softmax_scale, atol): ``numbers.Real`` (Python and numpy ints and
floats), never a bool.

``INT64_MAX``: the largest size or count torch takes (int64's largest value); past it torch fails deep inside
(OverflowError, "Overflow when unpacking long"), so entry points bound their integers by it.

``allocating(what, hint)``: a block that allocates inputs from the caller's sizes; an allocation failure inside
(out of memory, or a size torch's arithmetic overflows) becomes a one-line ValueError naming ``what``.
"""
from __future__ import annotations

import contextlib
import numbers

__all__ = ["INT64_MAX", "is_int", "is_real", "allocating"]

INT64_MAX = 2**63 - 1


def is_int(value) -> bool:
    """True for a Python int or a numpy integer, False for a bool and anything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    """True for a Python or numpy real number (ints included), False for a bool and anything else."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@contextlib.contextmanager
def allocating(what: str, hint: str):
    """Run the block; a RuntimeError or MemoryError from it (torch.OutOfMemoryError is a RuntimeError; so is a size
    overflow) is raised as ValueError "cannot allocate WHAT (its first line); HINT", without the traceback."""
    try:
        yield
    except (RuntimeError, MemoryError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"cannot allocate {what} ({first}); {hint}") from None
