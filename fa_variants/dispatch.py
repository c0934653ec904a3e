"""Which backend runs a call: a table from compute capability to backends, overrides, and the reason.

The table (``ARCH_BACKENDS``) lists, fastest first, the backends preferred on each compute capability; a
newer GPU (compute capability >= 8.0, not in the table: sm_100, sm_120, ...) gets ``NEWER_GPU_BACKENDS``
(the sm80 kernels: mma.sync, cp.async and ldmatrix run on every GPU since sm_80), and the CPU only
``reference``. What each backend serves (dtypes, head dims) comes from its ``Variant`` record in the one
registry (``fa_variants.registry``), imported on first use; a module that does not exist yet is reported
as "not built yet".

Choosing (``select``):

* ``backend="auto"`` (the default) takes the first backend of the device's list that can serve the call
  (arch, built, dtype, head_dim). It never falls back silently to something slower on a GPU: when a faster
  backend was skipped for a reason other than its dtype family (head_dim, not built, failed import), or the
  slow reference path is used on a GPU, it warns once (``BackendFallbackWarning``) and the reason says so.
* An explicit name (``backend="fa2"``) or the environment variable ``FA_VARIANTS_BACKEND`` (used when the
  argument is ``"auto"``) forces a backend; if it cannot serve the call, ``BackendUnavailableError`` (a
  ValueError) names why and the backends that can.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from dataclasses import dataclass

import torch

from fa_variants import registry
from fa_variants.common import interop
from fa_variants.common.launch import SM80_CODE_ARCHS, Variant

ENV_VAR = "FA_VARIANTS_BACKEND"


BACKENDS = registry.BACKENDS  # the names a caller may ask for, fastest first

#: compute capability (major * 10 + minor) -> backends targeting it, fastest first
ARCH_BACKENDS: dict[int, tuple[str, ...]] = {
    90: ("fa3", "fa3-fp8", "fa2", "fa1", "reference"),
    89: ("fa2", "fa1", "reference"),
    86: ("fa2", "fa1", "reference"),
    80: ("fa2", "fa1", "reference"),
}
#: the list for a GPU of compute capability >= 8.0 that is not in the table (sm_100, sm_120, ...)
NEWER_GPU_BACKENDS: tuple[str, ...] = ("fa2", "fa1", "reference")
#: the list for the CPU and for a GPU older than sm_80
FALLBACK_BACKENDS: tuple[str, ...] = ("reference",)


class BackendUnavailableError(ValueError):
    """A backend cannot serve a call (arch, dtype, head_dim, not built); the message names those that can."""


class BackendFallbackWarning(UserWarning):
    """`auto` chose a slower backend than the device's best one; the message says why."""


@dataclass(frozen=True)
class Selection:
    """The chosen backend, why, and every backend that could have served the call (preference order)."""

    backend: str
    reason: str
    candidates: tuple[str, ...]


def arch_name(capability: tuple[int, int] | None) -> str:
    """(9, 0) -> 'sm_90'; None (no CUDA device) -> 'cpu'."""
    return "cpu" if capability is None else f"sm_{capability[0]}{capability[1]}"


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of a CUDA device as (major, minor); None for any other device."""
    if device.type != "cuda":
        return None
    return _cuda_capability(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def backends_for(capability: tuple[int, int] | None) -> tuple[str, ...]:
    """The backends for a compute capability, fastest first (``reference`` alone for the CPU)."""
    if capability is None:
        return FALLBACK_BACKENDS
    if capability[0] * 10 + capability[1] in ARCH_BACKENDS:
        return ARCH_BACKENDS[capability[0] * 10 + capability[1]]
    return NEWER_GPU_BACKENDS if tuple(capability) >= (8, 0) else FALLBACK_BACKENDS


def is_newer_gpu(capability: tuple[int, int] | None) -> bool:
    """A GPU of compute capability >= 8.0 that the table does not list (served by the sm80 kernels)."""
    return capability is not None and tuple(capability) >= (8, 0) and \
        capability[0] * 10 + capability[1] not in ARCH_BACKENDS


def supported_archs(name: str) -> tuple[str, ...] | None:
    """The archs a backend is preferred on ('sm_80', ..., and 'newer GPUs' for the sm80 kernels), or None
    for any device (the reference)."""
    if name in FALLBACK_BACKENDS:
        return None
    archs = tuple(f"sm_{cc}" for cc, names in sorted(ARCH_BACKENDS.items()) if name in names)
    return archs + ("newer GPUs",) if name in NEWER_GPU_BACKENDS else archs


# ------------------------------------------------------------------------------------------- loading

def clear_cache() -> None:
    """Forget loaded variants, past selections and the warnings already given (for tests)."""
    registry.clear_cache()
    _SELECTED.clear()
    _WARNED.clear()
    with _PLANS_LOCK:
        PLANS.clear()


def load(name: str) -> Variant | str:
    """A backend's Variant record (imported once), or a string saying why it is unusable."""
    return registry.load(name)


def get_backend(name: str) -> Variant:
    """The loaded Variant of a backend (``.run(q, k, v, causal=, softmax_scale=)``). Raises
    BackendUnavailableError if it cannot be imported."""
    loaded = load(name)
    if isinstance(loaded, str):
        raise BackendUnavailableError(loaded)
    return loaded


def head_dims(name: str) -> tuple[int, ...] | None:
    """Head dims of a built backend (None: any head_dim, or not built)."""
    loaded = load(name)
    return None if isinstance(loaded, str) else loaded.head_dims


def dtypes(name: str) -> tuple[torch.dtype, ...] | None:
    """Dtypes of a built backend (None if not built)."""
    loaded = load(name)
    return None if isinstance(loaded, str) else tuple(loaded.dtypes)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _serves_other_dtypes(name: str, dtype: torch.dtype) -> bool:
    """True when a built backend is for other dtypes (e.g. fa3-fp8 for a bf16 call): not a fallback.
    A variant's ``auto_dtypes`` (default: its dtypes) lists the dtypes ``auto`` may pick it for; the
    others it serves only on request (fa3-fp8 quantises 16-bit inputs: it changes the numerics)."""
    entry = _declared(name)
    if entry is not None:  # what the registry says the Variant declares: no import
        return _dtype_name(dtype) not in (entry.auto_dtypes or entry.dtypes)
    loaded = load(name)
    return not isinstance(loaded, str) and dtype not in (loaded.auto_dtypes or loaded.dtypes)


def _declared(name: str):
    """The registry entry of a backend not imported yet that declares its dtypes (``registry.Entry``), else
    None: the dispatcher answers from it instead of importing the module (fa1 and fa3-fp8 import the CuTe
    DSL, ~2 s). Once imported, the Variant itself answers."""
    entry = registry.ENTRIES.get(name)
    return entry if entry is not None and entry.dtypes and name not in registry._LOADED else None


def why_not(name: str, capability: tuple[int, int] | None, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why backend ``name`` cannot serve (capability, dtype, head_dim); None if it can. ValueError for a name
    that is no backend (``auto`` included: it is a choice among them, `select`)."""
    if name not in BACKENDS:  # (else "xyz runs on  only": no arch lists it)
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if name not in backends_for(capability):
        archs = supported_archs(name)
        where = "the inputs are not on a CUDA GPU" if capability is None else f"this GPU is {arch_name(capability)}"
        return f"{name} runs on {', '.join(archs)} only; {where}{_refused_anywhere(name, dtype, head_dim)}"
    if is_newer_gpu(capability) and name not in FALLBACK_BACKENDS:
        arch = interop.arch_of_capability(*capability)
        if arch not in SM80_CODE_ARCHS:  # the sm80 kernels are built for the newer archs the DSL compiles for
            return f"{name} is not built for {arch} (its compile targets: {', '.join(SM80_CODE_ARCHS)})"
    entry = _declared(name)
    if entry is not None and not entry.refuses(_dtype_name(dtype), head_dim):
        return None  # serves it by its declaration; imported (and its import checked) when chosen
    loaded = load(name)
    if isinstance(loaded, str):
        return loaded
    return loaded.can_implement(dtype, head_dim)


def _refused_anywhere(name: str, dtype: torch.dtype, head_dim: int) -> str:
    """What of the call backend ``name`` refuses on any GPU (its declared dtypes and head dims, `registry.Entry`),
    as a clause for the wrong-device reason (else a float32 call asked of fa3-fp8 on the CPU heard only of the
    device); "" when nothing."""
    entry = registry.ENTRIES.get(name)
    problems = entry.refuses(_dtype_name(dtype), head_dim) if entry is not None else []
    return f"; and it takes {' and '.join(problems)}" if problems else ""


# ------------------------------------------------------------------------------------------- choosing

_WARNED: set[tuple] = set()
_SELECTED: dict[tuple, Selection] = {}
#: a call's kind (``api._call_key``) -> its plan, ``run(q, k, v) -> (out, lse)`` (``api._plan``)
PLANS: dict[tuple, object] = {}
MAX_PLANS = 1024  # kinds of call remembered (first in, first out)
_PLANS_LOCK = threading.Lock()  # for changes of PLANS' size (a plan is read without it: one dict lookup)


def remember_plan(key: tuple | None, plan) -> None:
    """Keep ``plan`` under ``key`` in `PLANS` (nothing for key None), the oldest going past `MAX_PLANS` (bounded: a
    growing KV cache is a new kind per step)."""
    if key is None:
        return
    with _PLANS_LOCK:  # another thread's insert while this one looks for the oldest key: "dictionary changed size"
        while PLANS and key not in PLANS and len(PLANS) >= MAX_PLANS:
            del PLANS[next(iter(PLANS))]
        PLANS[key] = plan


def select(capability: tuple[int, int] | None, dtype: torch.dtype, head_dim: int, *,
           backend: str = "auto") -> Selection:
    """Choose the backend for a call on a device of this capability (None = CPU) with this dtype/head_dim.

    Args:
        backend: "auto", or a name in BACKENDS. With "auto", ``FA_VARIANTS_BACKEND`` (if set and not
            "auto") is used as the requested name.

    Returns:
        Selection(backend, reason, candidates), candidates being every backend that can serve the call.

    Raises:
        ValueError: unknown backend name (argument or environment variable).
        BackendUnavailableError (a ValueError): the requested backend cannot serve the call, or, for
            auto, none can; the message names why and the backends that can.
    """
    key = (capability, dtype, head_dim, backend, os.environ.get(ENV_VAR))
    hit = _SELECTED.get(key)  # a choice is a pure function of its key: cached (per-call overhead)
    if hit is None:  # (one read: another thread's clear_cache between a test and a read raised KeyError)
        hit = _SELECTED[key] = _select(capability, dtype, head_dim, backend)
    return hit


def env_override() -> str | None:
    """The backend FA_VARIANTS_BACKEND asks ``auto`` to take, spaces stripped as every switch is
    (``common.switches``); None when unset, empty or "auto"."""
    value = os.environ.get(ENV_VAR, "").strip()
    return None if value in ("", "auto") else value


def _select(capability: tuple[int, int] | None, dtype: torch.dtype, head_dim: int,
            backend: str) -> Selection:
    names = backends_for(capability)
    problems = {name: why_not(name, capability, dtype, head_dim) for name in names}
    able = tuple(name for name in names if problems[name] is None)
    requested, source = backend, f"backend={backend!r}"
    env_value = env_override()
    if backend == "auto" and env_value is not None:
        requested, source = env_value, f"{ENV_VAR}={env_value}"
    if requested != "auto":
        if requested not in BACKENDS:
            raise ValueError(f"unknown backend {requested!r} (from {source}); "
                             f"choose from auto, {', '.join(BACKENDS)}")
        problem = problems.get(requested) or why_not(requested, capability, dtype, head_dim)
        if not problem and isinstance(load(requested), str):  # declared able, but it does not import
            problem = load(requested)
        if problem:
            raise BackendUnavailableError(f"{problem}; backends that can: "
                                          f"{', '.join(n for n in able if n != requested) or 'none'}")
        note_of = getattr(load(requested), "request_note", None)  # e.g. fa3-fp8 quantises 16-bit inputs
        note = note_of(dtype) if note_of else None
        return Selection(requested, f"requested by {source}" + (f"; {note}" if note else ""), able)

    where = arch_name(capability)
    call = f"{_dtype_name(dtype)} head_dim {head_dim}"
    on = " (inputs not on a CUDA GPU)" if capability is None else f" on {where}"  # (meta inputs are not "on cpu")
    if not able:
        raise BackendUnavailableError(f"no backend can serve {call}{on}: "
                                      + "; ".join(p for p in problems.values() if p))
    auto_able = [name for name in able if not _serves_other_dtypes(name, dtype)]
    while auto_able and isinstance(load(auto_able[0]), str):  # declared able but does not import
        problems[auto_able[0]] = load(auto_able[0])
        able = tuple(n for n in able if n != auto_able[0])
        auto_able.pop(0)
    if not able:
        raise BackendUnavailableError(f"no backend can serve {call}{on}: "
                                      + "; ".join(p for p in problems.values() if p))
    if not auto_able:
        raise BackendUnavailableError(f"no backend can serve {call}{on} unless asked for: "
                                      + ", ".join(f"backend={n!r}" for n in able))
    chosen = auto_able[0]
    if capability is None:
        return Selection(chosen, "auto: the inputs are not on a CUDA GPU (CPU, meta, ...); the reference path "
                                 "(plain PyTorch) is the only backend", able)
    # faster backends skipped for a reason other than serving another dtype family
    skipped = [problems[n] for n in names[:names.index(chosen)] if not _serves_other_dtypes(n, dtype)]
    if not skipped and chosen != "reference":
        if is_newer_gpu(capability):
            return Selection(chosen, f"auto: {where} is newer than the GPUs the dispatch table lists; {chosen} "
                                     "(sm80 code: mma.sync, cp.async, ldmatrix) runs there, not tuned for it", able)
        return Selection(chosen, f"auto: {chosen} is the fastest backend on {where} for {call}", able)
    if chosen == "reference" and not skipped:
        skipped = [f"no kernel backend on {where} serves {call}"]
    reason = f"auto: {'; '.join(skipped)}; fell back to {chosen} (slower)"
    warn_once((capability, dtype, head_dim, chosen), reason)
    return Selection(chosen, reason, able)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# torch's own files and the code torch.fx generates (a compiled graph's frames)
_TORCH_FILES = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, "<eval_with_key>")


def warn_once(key: tuple, message: str, category: type[Warning] = BackendFallbackWarning) -> None:
    """Warn ``message`` the first time ``key`` is seen in this process (``clear_cache`` forgets them), at the caller's
    line (`_caller_stacklevel`). The key is kept once the warning has passed: under a filter that turns it into an
    error, every call raises."""
    if key in _WARNED:
        return
    warnings.warn(message, category, stacklevel=_caller_stacklevel())
    _WARNED.add(key)


def _caller_stacklevel() -> int:
    """``warnings.warn``'s stacklevel, seen from `warn_once`, of the first frame outside this package and outside
    torch and its generated code (a backward run by the autograd engine names the caller's ``.backward()`` line, not
    torch's custom-op glue); the first frame outside this package where the stack has no such frame (a backward on
    the engine's worker thread)."""
    outside_package, level, frame = None, 2, sys._getframe(2)  # 2: warn_once's caller
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PACKAGE_DIR):
            if not filename.startswith(_TORCH_FILES):
                return level
            outside_package = level if outside_package is None else outside_package
        frame, level = frame.f_back, level + 1
    return outside_package if outside_package is not None else 1


def select_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   backend: str = "auto") -> Selection:
    """Choose the backend for ``attention(q, k, v, causal=causal, backend=backend)``.

    Uses q's device capability, dtype and head_dim (k, v and causal do not change the choice today).
    The inputs are not validated here: ``fa_variants.select_backend`` validates them first.
    Raises as ``select``.
    """
    return select(device_capability(q.device), q.dtype, q.shape[-1], backend=backend)
