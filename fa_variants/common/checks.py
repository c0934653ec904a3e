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

``allocating(what, hint, nbytes=None, device="cpu")``: a block that allocates inputs from the caller's sizes; an
allocation failure inside (out of memory, or a size torch's arithmetic overflows) becomes a one-line ValueError
naming ``what``. Given ``nbytes`` (the block's need, estimated from the sizes), a need beyond what ``device`` has
free (``free_bytes``) is refused before the block runs: a host that overcommits memory (Linux
vm.overcommit_memory = 1, common on GPU hosts) grants any allocation below the address space's size, and the
process is killed when it writes the pages (session 49: a 26 TB request took down a test worker on a GPU host).
"""
from __future__ import annotations

import contextlib
import numbers
import os

__all__ = ["INT64_MAX", "is_int", "is_real", "allocating", "free_bytes"]

INT64_MAX = 2**63 - 1


def is_int(value) -> bool:
    """True for a Python int or a numpy integer, False for a bool and anything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    """True for a Python or numpy real number (ints included), False for a bool and anything else."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def free_bytes(device="cpu") -> int | None:
    """Bytes ``device`` can still hand out, or None where unknown (then nothing is refused early). "cpu": the
    kernel's MemAvailable plus free swap (/proc/meminfo), else the free physical pages (os.sysconf); "cuda[:i]":
    ``torch.cuda.mem_get_info``'s free bytes (torch imported only then); any other device: None."""
    kind = str(device).split(":")[0]
    if kind == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    if kind != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
        return fields["MemAvailable"] + fields.get("SwapFree", 0)
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3g} GiB"


@contextlib.contextmanager
def allocating(what: str, hint: str, nbytes: int | None = None, device="cpu"):
    """Run the block; a RuntimeError or MemoryError from it (torch.OutOfMemoryError is a RuntimeError; so is a size
    overflow) is raised as ValueError "cannot allocate WHAT (its first line); HINT", without the traceback. With
    ``nbytes``, a need beyond ``free_bytes(device)`` raises "cannot allocate WHAT (needs N GiB, DEVICE has F GiB
    free); HINT" before the block runs."""
    if nbytes is not None:
        free = free_bytes(device)
        if free is not None and nbytes > free:
            raise ValueError(f"cannot allocate {what} (needs {_gib(nbytes)}, {device} has {_gib(free)} free); {hint}")
    try:
        yield
    except (RuntimeError, MemoryError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"cannot allocate {what} ({first}); {hint}") from None
