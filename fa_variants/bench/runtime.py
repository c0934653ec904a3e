"""The implementations timed (ours through the dispatcher, PyTorch SDPA backends, flash-attn-4) and
`GpuRuntime`, the only part of the benchmark that touches the GPU."""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import itertools
import math
import os
import time
import warnings
from typing import Callable

from fa_variants.bench.core import HIDDEN, Case, Impl, Plan, Timing, is_oom, short_error


# --------------------------------------------------------------------------------------- implementations
def _sdpa(backend_name: str) -> Callable:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def run(q, k, v, causal):  # (B, N, H, D) -> SDPA's (B, H, N, D) through strides, no copy
        if q.element_size() == 1:
            raise ValueError(f"PyTorch SDPA has no fp8 path ({str(q.dtype).removeprefix('torch.')})")
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=causal)
        return out.transpose(1, 2)

    return run


_SDPA = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION",
         "sdpa-efficient": "EFFICIENT_ATTENTION", "sdpa-math": "MATH"}


def our_backends(requested: list[str], capability: tuple[int, int] | None) -> tuple[list[str], list[str]]:
    """Those of the requested backends of ours that this GPU can run (asking fa_variants.dispatch), and a
    one-line note for each one it cannot (wrong arch, not built yet, failed import)."""
    try:
        from fa_variants import dispatch
    except ImportError as exc:
        return [], [f"our backends not run: fa_variants.dispatch unavailable ({exc})"]
    runnable, notes = [], []
    for name in requested:
        if name not in dispatch.backends_for(capability):
            archs = dispatch.supported_archs(name) or ("any",)
            notes.append(f"{name} not run: it targets {', '.join(archs)}; this GPU is "
                         f"{dispatch.arch_name(capability)}")
            continue
        loaded = dispatch.load(name)
        if isinstance(loaded, str):
            notes.append(f"{name} not run: {loaded}")
            continue
        runnable.append(name)
    return runnable, notes


def build_impls(ours: list[str], peers: list[str],
                capability: tuple[int, int] | None = None) -> tuple[list[Impl], list[str]]:
    """The implementations that can run here (ours filtered by the dispatcher for this GPU's capability,
    peers by whether they import), and a one-line note for each one that cannot."""
    impls, notes = [], []
    if ours:
        ours, notes = our_backends(ours, capability)
    if ours:
        from fa_variants import attention

        for name in ours:
            impls.append(Impl(name, "ours", lambda q, k, v, causal, _n=name: attention(
                q, k, v, causal=causal, backend=_n)))
    for name in peers:
        if name in _SDPA:
            impls.append(Impl(name, "peer", _sdpa(_SDPA[name])))
            continue
        if name != "flash-attn-4":  # an unknown name must not time flash-attn-4 under another label
            notes.append(f"{name} not run: unknown peer (known: {', '.join((*_SDPA, 'flash-attn-4'))})")
            continue
        try:  # flash-attn-4: the CuTe DSL FlashAttention (Dao-AILab/flash-attention, flash_attn/cute)
            from flash_attn.cute.interface import flash_attn_func
        except Exception as exc:  # noqa: BLE001 - any import failure means "not installed here"
            notes.append(f"{name} not run: not importable ({type(exc).__name__}: {short_error(exc)[:100]})")
        else:
            impls.append(Impl(name, "peer", lambda q, k, v, causal: flash_attn_func(q, k, v, causal=causal)))
    return impls, notes


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


# ----------------------------------------------------------------------------------------------- the GPU
class GpuRuntime:
    """Times implementations on the current CUDA device (the only part of the benchmark that touches one).

    device="cpu" runs the same code path with wall-clock timing and no memory statistics: for tests only.
    """

    def __init__(self, plan: Plan, device: str = "cuda"):
        import torch

        self.torch, self.plan = torch, plan
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._case: Case | None = None
        self._sets: list = []
        self._ref = None
        self._flush = None
        self.timer_name = "wall clock (CPU)"
        if self.cuda:
            self.timer_name = "triton.testing.do_bench" if importlib.util.find_spec("triton") else "CUDA events"

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _dtype(self, name: str):
        t = self.torch
        return {"bf16": t.bfloat16, "fp16": t.float16, "e4m3": getattr(t, "float8_e4m3fn", None)}[name]

    def make_inputs(self, dtype: str, batch: int, seqlen: int, heads: int, head_dim: int):
        """q, k, v ~ N(0, 1) of shape (batch, seqlen, heads, head_dim); fp8 is drawn in bf16 then cast."""
        t, target = self.torch, self._dtype(dtype)
        draw = t.bfloat16 if dtype == "e4m3" else target
        return tuple(t.randn(batch, seqlen, heads, head_dim, device=self.device, dtype=draw).to(target)
                     for _ in range(3))

    def input_sets(self, case: Case) -> int:
        """Enough input sets that the others' bytes exceed twice the L2 cache (2 to 16)."""
        if self.plan.input_sets:
            return self.plan.input_sets
        if not self.cuda:
            return 2
        l2 = getattr(self.torch.cuda.get_device_properties(self.device), "L2_cache_size", 64 << 20)
        set_bytes = 3 * case.batch * case.seqlen * case.heads * case.head_dim * (1 if case.dtype == "e4m3" else 2)
        return min(16, max(2, 1 + math.ceil(2 * l2 / set_bytes)))

    def _inputs(self, case: Case) -> list:
        if case != self._case:
            self._sets, self._ref, self._case = [], None, None
            if self.cuda:
                self.torch.cuda.empty_cache()
            self._sets = [self.make_inputs(case.dtype, case.batch, case.seqlen, case.heads, case.head_dim)
                          for _ in range(self.input_sets(case))]
            self._case = case
        return self._sets

    def _reference(self, case: Case):
        """Torch SDPA (its own backend choice) on input set 0, in the case dtype (bf16 for fp8 inputs)."""
        if self._ref is None:
            q, k, v = (x.bfloat16() if case.dtype == "e4m3" else x for x in self._sets[0])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._ref = self.torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=case.causal).transpose(1, 2)
        return self._ref

    def median_ms(self, fn: Callable[[], object]) -> float:
        """Median time of fn in ms: triton.testing.do_bench, else CUDA events with an L2 flush per call."""
        if not self.cuda:
            return self._wall_median_ms(fn)
        try:
            from triton.testing import do_bench
        except ImportError:
            return self._events_median_ms(fn)
        return float(do_bench(fn, warmup=self.plan.warmup_ms, rep=self.plan.rep_ms, return_mode="median"))

    def _wall_median_ms(self, fn, calls: int = 5) -> float:
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[calls // 2]

    def _events_median_ms(self, fn) -> float:
        t = self.torch
        if self._flush is None:
            self._flush = t.empty(256 << 20, dtype=t.int8, device=self.device)
        fn()
        t.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        t.cuda.synchronize()
        estimate_ms = max(1e-3, (time.perf_counter() - t0) * 1e3 / 3)
        for _ in range(max(1, int(self.plan.warmup_ms / estimate_ms))):
            fn()
        times = []
        for _ in range(max(5, int(self.plan.rep_ms / estimate_ms))):
            self._flush.zero_()
            start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append((start, end))
        t.cuda.synchronize()
        return float(sorted(s.elapsed_time(e) for s, e in times)[len(times) // 2])

    def time(self, impl: Impl, case: Case) -> Timing:
        """First call (timed apart, its warnings kept for the error message), then the median of many."""
        sets = self._inputs(case)
        q, k, v = sets[0]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                self._sync()
                t0 = time.perf_counter()
                out = _first(impl.fn(q, k, v, case.causal))
                self._sync()
                first_s = time.perf_counter() - t0
            except Exception as exc:
                if isinstance(exc, ValueError) or is_oom(exc) or not caught:
                    raise
                what = short_error(exc) if type(exc) is RuntimeError else f"{type(exc).__name__}: {short_error(exc)}"
                raise RuntimeError(f"{what} (warning: {short_error(caught[-1].message)})") from exc
        max_diff = None
        if impl.kind == "ours":
            max_diff = (out.float() - self._reference(case).float()).abs().max().item()
        del out
        rotation = itertools.cycle(sets)

        def call():
            a, b, c = next(rotation)
            impl.fn(a, b, c, case.causal)

        return Timing(ms=self.median_ms(call), first_call_s=first_s, max_diff=max_diff)

    def memory(self, impl: Impl, seqlen: int) -> tuple[float, float]:
        """(inputs MiB, peak allocated MiB over one forward call, inputs and output included), counted from
        what was allocated before the inputs were made."""
        t = self.torch
        if not self.cuda:
            raise RuntimeError("memory statistics need a CUDA device")
        self._sets, self._ref, self._case = [], None, None
        t.cuda.empty_cache()
        base = t.cuda.memory_allocated()
        d = self.plan.memory_head_dim
        q, k, v = self.make_inputs(self.plan.memory_dtype, 1, seqlen, HIDDEN // d, d)
        t.cuda.synchronize()
        t.cuda.reset_peak_memory_stats()
        inputs = t.cuda.memory_allocated() - base
        try:
            out = impl.fn(q, k, v, False)
            t.cuda.synchronize()
            peak = t.cuda.max_memory_allocated() - base
            del out
        finally:
            del q, k, v
            t.cuda.empty_cache()
        return inputs / 2**20, peak / 2**20

    def meta(self) -> dict:
        t = self.torch
        if not self.cuda:
            return dict(name="cpu", capability="-", cc=None, sms="-", memory_gib="-", l2_mib="-")
        p = t.cuda.get_device_properties(self.device)
        return dict(name=p.name, capability=f"{p.major}{p.minor}", cc=(p.major, p.minor), sms=p.multi_processor_count,
                    memory_gib=round(p.total_memory / 2**30, 1),
                    l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1))


def event_ms(fn: Callable[[], object]) -> float:
    """GPU time of one call of fn in ms: CUDA events recorded around it on the current stream, then waited
    for (the host blocks until fn's work is done). The scripts' shared timer of single calls."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


class NvmlClock:
    """SM clock (MHz) and power draw (W) of one CUDA device, read through NVML (libnvidia-ml, loaded by ctypes:
    no Python package needed). The device is found by its PCI bus id (NVML ignores CUDA_VISIBLE_DEVICES).
    ``read()`` returns (nan, nan) when NVML is unavailable (``self.error`` says why)."""

    SM = 1  # NVML_CLOCK_SM

    def __init__(self, device_index: int = 0):
        import ctypes

        self.error, self._lib, self._handle = "", None, None
        try:
            import torch

            p = torch.cuda.get_device_properties(device_index)
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            handle = ctypes.c_void_p()
            if hasattr(p, "pci_bus_id"):
                bus_id = f"{getattr(p, 'pci_domain_id', 0):08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
                find = ("nvmlDeviceGetHandleByPciBusId_v2", (bus_id.encode(), ctypes.byref(handle)))
            else:  # NVML's index: the device's entry in CUDA_VISIBLE_DEVICES when that lists numbers
                listed = [x for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
                index = int(listed[device_index]) if device_index < len(listed) and listed[device_index].isdigit() \
                    else device_index
                find = ("nvmlDeviceGetHandleByIndex_v2", (ctypes.c_uint(index), ctypes.byref(handle)))
            for call, args in (("nvmlInit_v2", ()), find):
                rc = getattr(lib, call)(*args)
                if rc:
                    raise OSError(f"{call} returned {rc}")
            self._lib, self._handle = lib, handle
        except Exception as exc:  # noqa: BLE001 - no NVML: clocks are simply not reported
            self.error = f"{type(exc).__name__}: {short_error(exc)[:100]}"

    def read(self) -> tuple[float, float]:
        if self._lib is None:
            return math.nan, math.nan
        import ctypes

        mhz, mw = ctypes.c_uint(), ctypes.c_uint()
        rc_clock = self._lib.nvmlDeviceGetClockInfo(self._handle, self.SM, ctypes.byref(mhz))
        rc_power = self._lib.nvmlDeviceGetPowerUsage(self._handle, ctypes.byref(mw))
        return (math.nan if rc_clock else float(mhz.value)), (math.nan if rc_power else mw.value / 1e3)


class GraphBurstTimer:
    """The GPU timer of ``bench.paired.paired_ab``: each entry's burst is a CUDA graph of ``calls`` back-to-back
    calls (as many as fill the requested burst length); a cycle queues one burst per entry with a CUDA event
    between two, so that there is no host gap inside a cycle; while it runs, the host reads the SM clock and power
    by NVML every ~0.5 ms and files each read under the burst running then.

    An entry whose calls cannot be captured (an exception during capture, or with ``escape_check`` a graph that runs
    in under half the time of the same calls launched eagerly, i.e. work that escaped the capture; off for calls
    whose eager form syncs, e.g. a length read back per call) is timed with the same calls launched eagerly between
    the events instead (``prepare`` says which). No L2 flush between calls: a burst is
    the same call repeated, as in a model's layers; for compute-bound shapes both sides of a ratio see the same."""

    #: GPU cycles of busy-wait (``torch.cuda._sleep``, ~1 ms) queued before an eager measurement, so that the calls'
    #: host time passes under it and the events time the GPU's work: a decode call takes 5-10 us of GPU time and
    #: 20-50 us of host time, and an estimate of host time sized the bursts and flagged its graph as escaped work
    COVER_CYCLES = 2_000_000

    def __init__(self, graphs: bool = True, clock: NvmlClock | None = None, escape_check: bool = True):
        import torch

        self.torch, self.graphs, self.escape_check = torch, graphs, escape_check
        self.clock = clock if clock is not None else NvmlClock(torch.cuda.current_device())
        self._runs: dict[str, tuple[Callable[[], None], int]] = {}

    def _eager_ms(self, fn, calls: int) -> float:
        t = self.torch
        start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        sleep = getattr(t.cuda, "_sleep", None)
        if sleep is not None:
            sleep(self.COVER_CYCLES)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls

    def prepare(self, name: str, fn: Callable[[], object], burst_ms: float) -> str:
        fn()
        est = self._eager_ms(fn, 3)
        calls = max(1, round(burst_ms / max(est, 1e-3)))
        how = f"eager x {calls}"
        run = lambda: [fn() for _ in range(calls)]  # noqa: E731
        if self.graphs:
            try:
                from fa_variants.bench.decode import capture_graph  # (fn already ran 4 times: warmed up)

                graph = capture_graph(fn, calls)[0]
                graph.replay()
                graph_ms = self._eager_ms(graph.replay, 1) / calls
                if self.escape_check and graph_ms < 0.5 * est:
                    how = f"eager x {calls} (graph {graph_ms:.3f} ms/call vs eager {est:.3f}: work escaped the capture)"
                else:
                    run, how = graph.replay, f"graph x {calls}"
            except Exception as exc:  # noqa: BLE001 - not capturable: eager bursts
                self.torch.cuda.synchronize()
                how = f"eager x {calls} (capture failed: {type(exc).__name__}: {short_error(exc)[:80]})"
        self._runs[name] = (run, calls)
        return how

    def cycle(self, names: list[str]) -> list[tuple[float, int, float, float]]:
        """The prepared entries' bursts queued back to back, an event between two; while they run the host reads
        the clock about every 0.5 ms and files each read under the burst then running (the first whose end event
        has not completed)."""
        t = self.torch
        events = [t.cuda.Event(enable_timing=True) for _ in range(len(names) + 1)]
        events[0].record()
        for name, end in zip(names, events[1:]):
            self._runs[name][0]()
            end.record()
        reads: list[list[tuple[float, float]]] = [[] for _ in names]
        running = 0
        while running < len(names):
            while running < len(names) and events[running + 1].query():
                running += 1
            if running < len(names):
                reads[running].append(self.clock.read())
                time.sleep(0.0005)
        events[-1].synchronize()
        out = []
        for i, name in enumerate(names):
            calls = self._runs[name][1]
            got = [r for r in reads[i] if not math.isnan(r[0])]
            mhz = sum(r[0] for r in got) / len(got) if got else math.nan
            watts = sum(r[1] for r in got) / len(got) if got else math.nan
            out.append((events[i].elapsed_time(events[i + 1]) / calls, calls, mhz, watts))
        return out


def versions() -> dict[str, str]:
    import torch

    out = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
    for label, dist in (("triton", "triton"), ("cutlass-dsl", "nvidia-cutlass-dsl"), ("flash-attn-4", "flash-attn-4"),
                        ("flash-attn", "flash-attn"), ("fa-variants", "fa-variants")):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[label] = importlib.metadata.version(dist)
    if "triton" not in out:
        with contextlib.suppress(ImportError):
            import triton

            out["triton"] = triton.__version__
    if "cutlass-dsl" not in out:
        with contextlib.suppress(ImportError):
            import cutlass

            out["cutlass-dsl"] = getattr(cutlass, "__version__", "?")
    return out


