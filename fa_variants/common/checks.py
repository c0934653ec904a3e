"""Checks shared by the public entry points' argument contracts. Pure Python (no torch import).

``is_int(value)``: the one rule for "an integer argument" across fa_variants: a Python int or a numpy integer
(both are ``numbers.Integral``; torch takes numpy integers wherever it takes an int), never a bool (``True``
is an ``int`` subclass; ``numpy.bool_`` is not ``Integral``). ``numbers.Integral`` rather than
``operator.index``: the latter would also take a 0-d integer torch.Tensor (a device sync, a graph break while
torch.compile traces), which no entry accepts. Callers store ``int(value)`` so a numpy integer never reaches a
compile key or a repr.

``is_real(value)``: "a real-number argument" (softmax_scale, atol): ``numbers.Real`` (Python and numpy ints and
floats), never a bool.

``one_line(value)``: a rejected argument as an error message shows it (``got {one_line(value)}``): its repr on one
line, cut past 80 characters; a torch or numpy array by its class, shape and dtype (a tensor's repr spans lines, and
one batched by torch.func.vmap printed its per-sample values as ``BatchedTensor(lvl=1, ...`` over three lines).

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
import sys

__all__ = ["INT64_MAX", "is_int", "is_real", "one_line", "allocating", "check_fits", "free_bytes"]

INT64_MAX = 2**63 - 1


def is_int(value) -> bool:
    """True for a Python int or a numpy integer, False for a bool and anything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    """True for a Python or numpy real number (ints included), False for a bool and anything else."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def one_line(value, limit: int = 80) -> str:
    """How an error message shows a rejected argument: one line of at most about ``limit`` characters."""
    # (isinstance against the loaded modules, not type(value).__module__: Dynamo cannot trace a method of that
    # string, which lost the message under fullgraph=True)
    torch, numpy = sys.modules.get("torch"), sys.modules.get("numpy")
    tensor = torch is not None and isinstance(value, torch.Tensor)
    if tensor or (numpy is not None and isinstance(value, numpy.ndarray)):
        from fa_variants.common.host_values import vmapped  # value is a tensor: torch is loaded

        batched = tensor and vmapped(value)
        if batched or len(value.shape):  # a 0-d one's repr is one short line, e.g. tensor(0.5000)
            batched = " batched by torch.func.vmap" if batched else ""
            kind = "tensor" if tensor else "numpy array"
            return f"a {kind}{batched} of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = " ".join(_repr(value).split())
    return text if len(text) <= limit else f"{text[:limit]}... ({type(value).__name__})"


def _repr(value) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a broken __repr__ must not replace the message being built
        return f"<{type(value).__name__}: repr failed ({type(exc).__name__})>"


def free_bytes(device="cpu") -> int | None:
    """Bytes ``device`` can still hand out, or None where unknown (then nothing is refused early). "cpu": the
    kernel's MemAvailable plus free swap (/proc/meminfo), capped by the room left under this process's cgroup memory
    limit (a container's /proc/meminfo shows the host's memory; past the limit the cgroup's OOM killer ends the
    process); None without MemAvailable (not Linux, or a kernel before 3.14). "cuda[:i]":
    ``torch.cuda.mem_get_info``'s free bytes (torch imported only then; None where it fails). Any other device:
    None."""
    kind = str(device).split(":")[0]
    if kind == "cuda":
        import torch

        try:
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        except RuntimeError:  # a busy or exclusive-mode device, a bad index: the allocation itself will say
            return None
    if kind != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
        available = fields["MemAvailable"] + fields.get("SwapFree", 0)
    except (OSError, KeyError, ValueError, IndexError):
        return None
    room = _cgroup_room()
    return available if room is None else min(available, room)


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup memory limit (v2: memory.max - memory.current; v1:
    memory.limit_in_bytes - memory.usage_in_bytes), page cache the kernel can drop (inactive_file) counted as room;
    None where there is no limit or it cannot be read."""
    def read(path: str) -> str | None:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except OSError:
            return None

    groups = read("/proc/self/cgroup") or ""
    for line in groups.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2 (unified)
            base = f"/sys/fs/cgroup{path}"
            limit, used, stat = read(f"{base}/memory.max"), read(f"{base}/memory.current"), read(f"{base}/memory.stat")
        elif "memory" in controllers.split(","):  # v1
            base = f"/sys/fs/cgroup/memory{path}"
            limit, used = read(f"{base}/memory.limit_in_bytes"), read(f"{base}/memory.usage_in_bytes")
            stat = read(f"{base}/memory.stat")
        else:
            continue
        try:
            limit_n, used_n = int(limit), int(used)  # "max" (v2: no limit) is not an int
        except (TypeError, ValueError):
            continue
        if limit_n >= 2**60:  # v1 writes "no limit" as a huge number
            continue
        inactive = dict(line.split() for line in (stat or "").splitlines() if len(line.split()) == 2)
        reclaimable = int(inactive.get("inactive_file", inactive.get("total_inactive_file", 0)))
        return max(0, limit_n - used_n + reclaimable)
    return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3g} GiB"


def check_fits(what: str, hint: str, nbytes: int, device="cpu") -> None:
    """ValueError "cannot allocate WHAT (needs N GiB, DEVICE has F GiB free); HINT" where ``nbytes`` is more than
    ``free_bytes(device)``; nothing where it fits or the free memory is unknown."""
    free = free_bytes(device)
    if free is not None and nbytes > free:
        raise ValueError(f"cannot allocate {what} (needs {_gib(nbytes)}, {device} has {_gib(free)} free); {hint}")


@contextlib.contextmanager
def allocating(what: str, hint: str, nbytes: int | None = None, device="cpu"):
    """Run the block; a RuntimeError or MemoryError from it (torch.OutOfMemoryError is a RuntimeError; so is a size
    overflow) is raised as ValueError "cannot allocate WHAT (its first line); HINT", without the traceback. With
    ``nbytes``, a need beyond ``free_bytes(device)`` raises "cannot allocate WHAT (needs N GiB, DEVICE has F GiB
    free); HINT" before the block runs."""
    if nbytes is not None:
        check_fits(what, hint, nbytes, device)
    try:
        yield
    except (RuntimeError, MemoryError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"cannot allocate {what} ({first}); {hint}") from None
