"""Which backend runs a call: a table from compute capability to backends, overrides, and the reason.

The table (``ARCH_BACKENDS``) lists, fastest first, the backends that target each compute capability;
every other device (the CPU, an unknown GPU) has only ``reference``. A backend is a module that follows the
kernel module contract of HELPERS.md (``HEAD_DIMS``, ``DTYPES``, ``run``); it is imported lazily, on first
use, and a module that does not exist yet is reported as "not built yet".

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
import importlib
import os
import types
import warnings
from dataclasses import dataclass

import torch

ENV_VAR = "FA_VARIANTS_BACKEND"


@dataclass(frozen=True)
class Backend:
    """A backend: its name, the module implementing the kernel module contract, and a one-line summary."""

    name: str
    module: str
    summary: str


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("fa3", "fa_variants.hopper.fa3", "FlashAttention-3 style: TMA, WGMMA, warp specialisation"),
    Backend("fa3-fp8", "fa_variants.fp8.fa3_fp8", "FlashAttention-3 with e4m3 (FP8) inputs"),
    Backend("fa2", "fa_variants.ampere.fa2", "FlashAttention-2: Q outer loop, mma.sync, cp.async"),
    Backend("fa1", "fa_variants.ampere.fa1", "FlashAttention-1: K/V outer loop"),
    Backend("reference", "fa_variants.reference", "plain PyTorch, float32 maths, any device (slow)"),
)}

#: compute capability (major * 10 + minor) -> backends targeting it, fastest first
ARCH_BACKENDS: dict[int, tuple[str, ...]] = {
    90: ("fa3", "fa3-fp8", "fa2", "fa1", "reference"),
    89: ("fa2", "fa1", "reference"),
    86: ("fa2", "fa1", "reference"),
    80: ("fa2", "fa1", "reference"),
}
#: the list for the CPU and for any GPU not in the table
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
    """The backends targeting a compute capability, fastest first (``reference`` alone for the CPU)."""
    if capability is None:
        return FALLBACK_BACKENDS
    return ARCH_BACKENDS.get(capability[0] * 10 + capability[1], FALLBACK_BACKENDS)


def supported_archs(name: str) -> tuple[str, ...] | None:
    """The archs a backend targets ('sm_80', ...), or None for any device (the reference)."""
    if name in FALLBACK_BACKENDS:
        return None
    return tuple(f"sm_{cc}" for cc, names in sorted(ARCH_BACKENDS.items()) if name in names)


# ------------------------------------------------------------------------------------------- loading

_LOADED: dict[str, types.ModuleType | str] = {}


def clear_cache() -> None:
    """Forget imported backend modules, past selections and the warnings already given (for tests)."""
    _LOADED.clear()
    _SELECTED.clear()
    _WARNED.clear()


def load(name: str) -> types.ModuleType | str:
    """Import a backend's module (once). Returns the module, or a string saying why it is unusable."""
    if name not in _LOADED:
        _LOADED[name] = _import(BACKENDS[name])
    return _LOADED[name]


def _import(backend: Backend) -> types.ModuleType | str:
    try:
        module = importlib.import_module(backend.module)
    except ModuleNotFoundError as exc:
        if exc.name and backend.module.startswith(exc.name):
            return f"{backend.name} is not built yet"
        return f"{backend.name} cannot be imported ({exc})"
    except Exception as exc:  # a broken kernel module must be reported, not crash the dispatcher
        return f"{backend.name} failed to import ({type(exc).__name__}: {exc})"
    missing = [attr for attr in ("HEAD_DIMS", "DTYPES", "run") if not hasattr(module, attr)]
    if missing:
        return (f"{backend.name} ({backend.module}) does not follow the kernel module contract: "
                f"missing {', '.join(missing)}")
    return module


def get_module(name: str) -> types.ModuleType:
    """The loaded module of a backend. Raises BackendUnavailableError if it cannot be imported."""
    loaded = load(name)
    if isinstance(loaded, str):
        raise BackendUnavailableError(loaded)
    return loaded


def head_dims(name: str) -> tuple[int, ...] | None:
    """HEAD_DIMS of a built backend (None: any head_dim, or not built)."""
    loaded = load(name)
    return None if isinstance(loaded, str) else loaded.HEAD_DIMS


def dtypes(name: str) -> tuple[torch.dtype, ...] | None:
    """DTYPES of a built backend (None if not built)."""
    loaded = load(name)
    return None if isinstance(loaded, str) else tuple(loaded.DTYPES)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _serves_other_dtypes(name: str, dtype: torch.dtype) -> bool:
    """True when a built backend is for other dtypes (e.g. fa3-fp8 for a bf16 call): not a fallback.
    A module's optional ``AUTO_DTYPES`` (default DTYPES) lists the dtypes ``auto`` may pick it for; the
    others it serves only on request (fa3-fp8 quantises 16-bit inputs: it changes the numerics)."""
    loaded = load(name)
    return not isinstance(loaded, str) and dtype not in getattr(loaded, "AUTO_DTYPES", loaded.DTYPES)


def why_not(name: str, capability: tuple[int, int] | None, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why backend ``name`` cannot serve (capability, dtype, head_dim); None if it can."""
    if name not in backends_for(capability):
        archs = supported_archs(name)
        where = "the inputs are on the CPU" if capability is None else f"this GPU is {arch_name(capability)}"
        return f"{name} runs on {', '.join(archs)} only; {where}"
    loaded = load(name)
    if isinstance(loaded, str):
        return loaded
    if dtype not in loaded.DTYPES:
        return (f"{name} does not support dtype {_dtype_name(dtype)} "
                f"(supports {', '.join(_dtype_name(d) for d in loaded.DTYPES)})")
    if loaded.HEAD_DIMS is not None and head_dim not in loaded.HEAD_DIMS:
        return (f"{name} does not support head_dim {head_dim} "
                f"(supports {', '.join(str(d) for d in loaded.HEAD_DIMS)})")
    return None


# ------------------------------------------------------------------------------------------- choosing

_WARNED: set[tuple] = set()
_SELECTED: dict[tuple, Selection] = {}


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
    if key not in _SELECTED:  # a choice is a pure function of its key: cache it (per-call overhead)
        _SELECTED[key] = _select(capability, dtype, head_dim, backend)
    return _SELECTED[key]


def _select(capability: tuple[int, int] | None, dtype: torch.dtype, head_dim: int,
            backend: str) -> Selection:
    names = backends_for(capability)
    problems = {name: why_not(name, capability, dtype, head_dim) for name in names}
    able = tuple(name for name in names if problems[name] is None)
    requested, source = backend, f"backend={backend!r}"
    if backend == "auto" and os.environ.get(ENV_VAR, "auto") not in ("", "auto"):
        requested, source = os.environ[ENV_VAR], f"{ENV_VAR}={os.environ[ENV_VAR]}"
    if requested != "auto":
        if requested not in BACKENDS:
            raise ValueError(f"unknown backend {requested!r} (from {source}); "
                             f"choose from auto, {', '.join(BACKENDS)}")
        problem = problems.get(requested) or why_not(requested, capability, dtype, head_dim)
        if problem:
            raise BackendUnavailableError(f"{problem}; backends that can: {', '.join(able) or 'none'}")
        note = getattr(load(requested), "request_note", lambda _dtype: None)(dtype)  # e.g. fa3-fp8 quantises
        return Selection(requested, f"requested by {source}" + (f"; {note}" if note else ""), able)

    where = arch_name(capability)
    call = f"{_dtype_name(dtype)} head_dim {head_dim}"
    if not able:
        raise BackendUnavailableError(f"no backend can serve {call} on {where}: "
                                      + "; ".join(p for p in problems.values() if p))
    auto_able = [name for name in able if not _serves_other_dtypes(name, dtype)]
    if not auto_able:
        raise BackendUnavailableError(f"no backend can serve {call} on {where} unless asked for: "
                                      + ", ".join(f"backend={n!r}" for n in able))
    chosen = auto_able[0]
    if capability is None:
        return Selection(chosen, "auto: no CUDA device (inputs on the CPU); the reference path "
                                 "(plain PyTorch) is the only backend", able)
    # faster backends skipped for a reason other than serving another dtype family
    skipped = [problems[n] for n in names[:names.index(chosen)] if not _serves_other_dtypes(n, dtype)]
    if not skipped and chosen != "reference":
        return Selection(chosen, f"auto: {chosen} is the fastest backend on {where} for {call}", able)
    if chosen == "reference" and not skipped:
        skipped = [f"no kernel backend on {where} serves {call}"]
    reason = f"auto: {'; '.join(skipped)}; fell back to {chosen} (slower)"
    key = (capability, dtype, head_dim, chosen)
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(reason, BackendFallbackWarning, stacklevel=3)
    return Selection(chosen, reason, able)


def select_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   backend: str = "auto") -> Selection:
    """Choose the backend for ``attention(q, k, v, causal=causal, backend=backend)``.

    Uses q's device capability, dtype and head_dim (k, v and causal do not change the choice today).
    The inputs are not validated here: ``fa_variants.select_backend`` validates them first.
    Raises as ``select``.
    """
    return select(device_capability(q.device), q.dtype, q.shape[-1], backend=backend)
