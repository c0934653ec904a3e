"""Scratch memory of split-KV calls without a per-call allocation: the fp32 partials (O and LSE of every split)
and, for the fused merge (``Sm90Config.fused_merge``), the per-query-tile arrival counters.

The rule (who may share a buffer):

* Eager calls on a CUDA device share one buffer per (device, stream, Python thread), grown on demand (a larger
  call replaces it; the old one goes back to torch's caching allocator, which only reuses it in that stream's
  order). Work on one stream runs in order, so consecutive calls reuse the memory safely; two streams never share
  a buffer (a buffer shared by concurrent streams would race), nor do two threads on one stream: a split call
  launches its split kernel and its merge as two launches, and another thread's split kernel queued between
  them would overwrite the partials the merge reads. A thread's buffers live in its thread-local storage and go
  with the thread.
* Calls captured into a CUDA graph (``torch.cuda.is_current_stream_capturing()``) never use those buffers: the
  partials come from ``torch.empty`` (the graph's private memory pool, alive as long as the graph, one piece
  per captured call), and the counters from a per-device arena zeroed once outside capture: one slice per
  (capture sequence, stream) that no other capture or eager call ever gets (the calls of one capture on one
  stream run in order, and the counters are self-cleaning), so graphs may replay on any stream, concurrently
  with each other and with eager calls. Where the capture sequence cannot be read (cudaStreamGetCaptureInfo
  through cuda.bindings), every captured call gets its own slice. Before the arena exists (the first call of a
  process is captured) or when it is used up, a captured call's counters are ``torch.zeros`` (a memset in the
  graph, replayed each time: correct, slower).
* Counters are left at 0 by the kernel (the last CTA of each query tile resets its own), so they are zeroed
  only when allocated.
* The same rule gives a kernel's LSE output that the caller does not read (``lse_function``: ``fa_variants.attention``
  without ``return_lse``) a per-stream buffer of its own, so that such a call allocates only O.
* Calls inside ``uncached()`` (the ``torch.compile`` custom op, ``integrations.custom_op``) get fresh scratch as
  captured calls do, and fresh zeroed counters, and leave nothing behind: torch.compile's CUDA graphs
  (mode="reduce-overhead") run their warm-up calls uncaptured but allocating from the graph's private pool, so a
  buffer first cached there would belong to the pool while this module kept it ("tensor(s) in the cudagraph pool
  not tracked as outputs"); the capture flag cannot see that phase. Tensors a caller keeps for the process
  (constants) are made through ``persistent``, on a helper thread, outside that pool (the warm-up routes the
  warming thread's allocations on every stream).
* CPU tensors (tests): a fresh allocation per call; with ``CACHE_CPU`` (scripts/api_overhead.py's stubbed CPU
  run, to time the host path as a CUDA device runs it) one cached buffer, as for one CUDA stream.

``views(...)`` also caches the tensors a plan derives from the buffers (strided views of the partials), per
(device, stream, thread, geometry), so a call does no tensor op for them (the ``VIEWS_MAX`` most recent per
slot); a regrown buffer drops them.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import threading
from typing import Callable

import torch

from fa_variants.common import split

#: counters (int32) in each device's arena for captured calls: 64 Ki = 256 KiB, enough for many graphs
ARENA_COUNTERS = 1 << 16
#: CPU scratch cached like one CUDA stream's (module docstring; host-time measurements only)
CACHE_CPU = False


class _Slot:
    __slots__ = ("buffers", "counters", "views")

    def __init__(self):
        self.buffers: dict[str, torch.Tensor] = {}  # kind ("partials", "lse") -> its float32 buffer
        self.counters: torch.Tensor | None = None
        self.views: dict = {}


_LOCAL = threading.local()  # .slots: this thread's {(device index (CPU: -1), stream (CPU: 0)): _Slot}; .generation
_GENERATION = 0  # clear() moves it on: every thread's slots are then dropped at its next call
_ARENAS: dict[int, list] = {}  # device index -> [int32 zeros, next free offset]
_LOCK = threading.Lock()


# the current stream's handle as an int, without building a Stream object (this runs on every split call)
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_IS_CAPTURING = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def _slots() -> dict:
    """The calling thread's slots, (device index (CPU: -1), stream (CPU: 0)) -> its buffers (the module docstring's
    rule), emptied when ``clear()`` ran since this thread's last call."""
    slots = getattr(_LOCAL, "slots", None)
    if slots is None or _LOCAL.generation != _GENERATION:
        slots = _LOCAL.slots = {}
        _LOCAL.generation = _GENERATION
    return slots


def slot_key(device: torch.device) -> tuple[int, int]:
    """The key of the device's current stream in the calling thread's slots (``_slots``)."""
    if device.type != "cuda":
        return (-1, 0)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return (index, _raw_stream(index))


def _raw_stream(index: int) -> int:
    return _RAW_STREAM(index) if _RAW_STREAM is not None else torch.cuda.current_stream(index).cuda_stream


def _capturing_now() -> bool:
    """Whether the current CUDA device's current stream is capturing a CUDA graph."""
    return _IS_CAPTURING() if _IS_CAPTURING is not None else torch.cuda.is_current_stream_capturing()


def capturing(device: torch.device) -> bool:
    """Whether the current stream of a CUDA device is capturing a CUDA graph (False for CPU tensors)."""
    if device.type != "cuda":
        return False
    return _capturing_now()


_SCOPE = threading.local()  # .uncached: depth of uncached() scopes on this thread


@contextlib.contextmanager
def uncached():
    """Within it, this thread's calls neither read nor fill the cached buffers, views or counter arena (module
    docstring): scratch and counters are allocated per call and freed with it."""
    _SCOPE.uncached = getattr(_SCOPE, "uncached", 0) + 1
    try:
        yield
    finally:
        _SCOPE.uncached -= 1


def _uncached_now() -> bool:
    return getattr(_SCOPE, "uncached", 0) > 0


def persistent(device: torch.device, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()``, for a tensor its caller keeps for the process (constants made once per device, e.g. the fp8
    quantisation pass's Hadamard signs): inside ``uncached()`` on a CUDA device, outside capture, it runs on a
    helper thread, on a side stream that first waits for the caller's current stream, and the helper waits for
    that stream before returning. torch.compile's CUDA-graph warm-up routes the allocations of the warming thread
    (every stream of it, torch ``_cuda_beginAllocateCurrentThreadToPool``) to the graph's private pool, so a
    constant made on the caller's thread would belong to the pool ("tensor(s) in the cudagraph pool not tracked as
    outputs"; a side stream alone is not enough: measured on the H200, session 9). Elsewhere ``make()`` here. Either
    way outside inference mode (a tensor kept for the process is never an inference tensor: `views`).
    A device without an index is the caller's current device (the helper thread's own starts at device 0). Errors
    raised by ``make`` are raised here."""
    if device.type != "cuda" or not _uncached_now() or capturing(device):
        with torch.inference_mode(False):  # kept for the process: never an inference tensor (`views`)
            return make()
    if device.index is None:  # the caller's current device: a new thread's own current device is device 0
        device = torch.device("cuda", torch.cuda.current_device())
    caller = torch.cuda.current_stream(device)
    box: dict = {}

    def work():
        try:
            with torch.cuda.device(device):
                side = torch.cuda.Stream(device)
                side.wait_stream(caller)
                with torch.cuda.stream(side):
                    box["made"] = make()
                side.synchronize()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = exc

    helper = threading.Thread(target=work, name="fa_variants-persistent")
    helper.start()
    helper.join()
    if "error" in box:
        raise box["error"]
    return box["made"]


def views(device: torch.device, partials: int, counters: int, geometry, make: Callable[..., tuple],
          kind: str = "partials", view_key: int | None = None):
    """``make(buffer, counters_buffer)`` for scratch of at least ``partials`` float32 and ``counters`` int32
    (zeros; 0: no counters, the buffer passed is None), under the module docstring's rule; eager CUDA calls get
    the result cached per (device, stream, thread, kind, geometry), the ``VIEWS_MAX`` most recent per slot.
    ``geometry``: hashable, fixes what ``make`` returns given buffers at least that large. ``kind``: which of the
    stream's buffers: "partials" (split partials) or "lse" (an LSE the caller does not read, ``lse_function``);
    the two never overlap. ``view_key``: ``_view_key(kind, geometry)`` when the caller holds it (``function``)."""
    if _uncached_now():
        return make(torch.empty(partials, dtype=torch.float32, device=device),
                    torch.zeros(counters, dtype=torch.int32, device=device) if counters else None)
    if device.type != "cuda" and not CACHE_CPU or capturing(device):
        return make(torch.empty(partials, dtype=torch.float32, device=device),
                    _captured_counters(device, counters) if counters else None)
    key, slots = slot_key(device), _slots()
    if view_key is None:
        view_key = _view_key(kind, geometry)
    slot = slots.get(key)
    if slot is not None:
        hit = slot.views.get(view_key)
        if hit is not None:
            return hit
    # kept past this call: made outside inference mode, else an inference tensor (made under
    # torch.inference_mode()) that a later call outside it writes in place ("Inplace update to inference tensor")
    with _LOCK, torch.inference_mode(False):
        slot = slots.get(key) or slots.setdefault(key, _Slot())
        buffer = slot.buffers.get(kind)
        if buffer is None or buffer.numel() < partials:
            buffer = slot.buffers[kind] = torch.empty(max(partials, 2 * (buffer.numel() if buffer is not None else 0)),
                                                      dtype=torch.float32, device=device)
            slot.views = {}
        if counters and (slot.counters is None or slot.counters.numel() < counters):
            slot.counters = torch.zeros(max(counters, 256), dtype=torch.int32, device=device)
            slot.views = {}
        if counters and device.type == "cuda":
            reserve_arena(device)  # for later captured calls (zeroed now, outside any capture)
        if len(slot.views) >= VIEWS_MAX:  # bounded: the oldest goes (remade if its plan calls again)
            del slot.views[next(iter(slot.views))]
        hit = slot.views[view_key] = make(buffer, slot.counters if counters else None)
        return hit


#: views cached per stream, and (kind, geometry) pairs interned, at most (oldest dropped first): each kind of
#: call that drops its LSE has a geometry of its own (one per (batch, heads, seqlen_q)), so a long-running
#: process that sees many prompt lengths would otherwise grow both without bound (the plans are bounded too,
#: ``dispatch.MAX_PLANS``)
VIEWS_MAX = 4096

_VIEW_KEYS: dict[tuple, int] = {}  # (kind, geometry) -> a small int (the views' dict key: a cheap hash per call)
_NEXT_VIEW_KEY = itertools.count()  # never reused: a plan keeps its int after its pair was dropped here


def _view_key(kind: str, geometry) -> int:
    key = _VIEW_KEYS.get((kind, geometry))
    if key is None:
        with _LOCK:
            key = _VIEW_KEYS.get((kind, geometry))
            if key is None:
                if len(_VIEW_KEYS) >= VIEWS_MAX:
                    del _VIEW_KEYS[next(iter(_VIEW_KEYS))]
                key = _VIEW_KEYS[(kind, geometry)] = next(_NEXT_VIEW_KEY)
    return key


def function(device: torch.device, partials: int, counters: int, geometry, make: Callable[..., tuple],
             kind: str = "partials") -> Callable[[], tuple]:
    """``views(device, partials, counters, geometry, make, kind)`` as a function of no argument, for a plan that
    calls it on every launch: the same result, with what the device fixes worked out once, so that an eager
    CUDA call's cache hit costs the capture flag, the stream handle and two dict lookups."""
    key = _view_key(kind, geometry)
    if device.type != "cuda":
        def get_host():  # (capturing: False for the CPU, unless a test says otherwise)
            if CACHE_CPU and not capturing(device) and not _uncached_now():
                slot = _slots().get((-1, 0))
                hit = slot.views.get(key) if slot is not None else None
                if hit is not None:
                    return hit
            return views(device, partials, counters, geometry, make, kind, key)
        return get_host
    index = device.index if device.index is not None else torch.cuda.current_device()

    def get():
        if not _capturing_now() and not _uncached_now():
            slot = _slots().get((index, _raw_stream(index)))
            if slot is not None:
                hit = slot.views.get(key)
                if hit is not None:
                    return hit
        return views(device, partials, counters, geometry, make, kind, key)
    return get


#: LSEs of at most this many elements (4 MiB) that the caller does not read go to ``lse_function``'s scratch
LSE_SCRATCH_MAX = 1 << 20


def lse_function(device: torch.device, shape: tuple) -> Callable[[], torch.Tensor]:
    """``get() -> lse``: a contiguous float32 tensor of ``shape`` for a kernel's LSE output that nobody reads
    (``fa_variants.attention`` without ``return_lse``), from the stream's "lse" buffer under the module
    docstring's rule: no allocation per eager CUDA call (the next call on the stream overwrites it, in stream
    order); a fresh one under CUDA-graph capture and on the CPU."""
    strides = split.contiguous_strides(shape)
    return function(device, math.prod(shape), 0, ("lse", tuple(shape)),
                    lambda buf, _: buf.as_strided(shape, strides, 0), "lse")


def reserve_arena(device: torch.device) -> None:
    """Allocate (zeroed) the device's counter arena for captured calls, unless it exists or a capture runs."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _ARENAS and not capturing(device):
        with torch.inference_mode(False):  # kept for the process (`views`)
            _ARENAS[index] = [torch.zeros(ARENA_COUNTERS, dtype=torch.int32, device=device), 0]


_CAPTURED: dict[tuple, torch.Tensor] = {}  # (device, capture sequence id, stream) -> its counters


def _capture_id(stream: int) -> int | None:
    """The id of the capture sequence the stream is in (unique in the process), or None if unknown."""
    try:
        from cuda.bindings import runtime

        info = runtime.cudaStreamGetCaptureInfo(runtime.cudaStream_t(stream))
        return int(info[2]) if info[0] == runtime.cudaError_t.cudaSuccess and info[2] is not None else None
    except Exception:  # noqa: BLE001 - no cuda.bindings, another signature: one slice per call instead
        return None


def _captured_counters(device: torch.device, n: int) -> torch.Tensor:
    """n zeroed int32 counters for a captured call (module docstring; CPU: a fresh tensor)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        stream = _raw_stream(index)
        capture = _capture_id(stream)
        key = (index, capture, stream)
        with _LOCK:
            hit = _CAPTURED.get(key) if capture is not None else None
            if hit is not None and hit.numel() >= n:
                return hit[:n]
            arena = _ARENAS.get(index)
            if arena is not None and arena[1] + n <= arena[0].numel():
                start = arena[1]
                arena[1] += -(-n // 64) * 64  # 256-byte steps: each slice in its own lines
                if capture is not None:
                    _CAPTURED[key] = arena[0][start:start + n]
                return arena[0][start:start + n]
    return torch.zeros(n, dtype=torch.int32, device=device)


def clear() -> None:
    """Drop every cached buffer (tests). Captured graphs keep what they reference alive."""
    global _GENERATION
    with _LOCK:
        _GENERATION += 1
        _LOCAL.slots = None
        _ARENAS.clear()
        _CAPTURED.clear()
