"""Host overhead per call of ``fa_variants.attention``: validation, backend choice, stride handling, the
launcher (compiled-kernel lookup, operands, outputs, runtime arguments) and the launch itself.

    python scripts/api_overhead.py                          # CPU: fa3's path to the launch, kernel stubbed
    python scripts/api_overhead.py --backend fa2 --profile  # ... and cProfile of the eager call
    python scripts/api_overhead.py --device cuda --backend fa3            # the real kernel on the GPU
    python scripts/api_overhead.py --device cuda --backend fa3 --stub     # GPU tensors, no kernel
    python scripts/api_overhead.py --device cuda --backend fa3,fa2 --phases   # issue 13's GPU check

Stubbed (the default on the CPU): the dispatcher sees an sm_90 device and the compiled kernel is a Python
no-op (on the CPU also the torch split-KV merge; the split scratch cached as on a CUDA stream), so every line of
the eager path runs except the GPU launch. FA_VARIANTS_FUSED_MERGE=1: fa3's fused split merge (one launch).
Real (``--device cuda`` without ``--stub``): a decode shape (B=1, Nq=1, Nk=4096, GQA 32:8, D=128, bf16).

Per backend it prints the minimum and median over rounds of the mean time per call (microseconds):

* ``sync loop``: a loop of calls synchronised once at the end (what session 2 measured): max(host, GPU) time;
* ``host (enqueue)``: the same loop timed before the synchronisation, over few enough calls that the launch
  queue never fills: the host time per call. Issue 13's budget: <= 25 us for a cached configuration;
* ``gpu``: the GPU time per call (a CUDA graph of the loop replayed, timed by CUDA events; absent if the
  call cannot be captured);

and with ``--phases`` the host time of each phase of a cached call, timed one phase at a time: ``key``
(`api._call_key`: validation is cached under it), ``plan lookup`` (the dict), ``alloc`` (O, and the LSE as the
call gets it: the stream's LSE scratch, ``common.launch.LSE_SCRATCH``, since the call does not return it),
``launch`` (the plan's launch with given outputs: views, workspace, the compiled kernel's TVM-FFI call(s),
fa3's merge; then its parts: ``prepare`` (the arguments), ``kernel call`` (one TVM-FFI call, the kernel's host
launcher: TMA descriptors, launch), ``finish`` (the merge kernel's call, two-kernel split only)), and the custom op ``torch.ops.fa_variants.attention`` (what torch.compile graphs call).
A last line ``SUMMARY`` gives each backend's host us/call and whether it meets 25 us.
"""
from __future__ import annotations

import argparse
import cProfile
import contextlib
import pstats
import statistics
import time
from unittest import mock

import torch

#: decode shape of issue 13's table: B=1, Nq=1, Nk=4096, GQA 32:8
DECODE = dict(batch=1, seqlen_q=1, seqlen_k=4096, heads=32, heads_kv=8)
CAPABILITY = {"fa3": (9, 0), "fa3-fp8": (9, 0), "fa2": (8, 0), "fa1": (8, 0)}
ARCH = {(9, 0): "sm_90a", (8, 0): "sm_80"}


def per_call_us(fn, calls: int, rounds: int, sync=lambda: None, *, count_sync: bool = True) -> tuple[float, float]:
    """(min, median) over rounds of the mean wall time per call of a loop of `calls` calls, synchronised
    once at the end of each loop; the clock stops after that sync (count_sync) or before it."""
    for _ in range(max(1, calls // 5)):
        fn()
    sync()
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if count_sync:
            sync()
        means.append((time.perf_counter() - start) / calls * 1e6)
        if not count_sync:
            sync()
    return min(means), statistics.median(means)


@contextlib.contextmanager
def stubbed_kernel(backend: str, device: str):
    """The compiled kernel replaced by a no-op (and, on the CPU, the device seen as the backend's GPU)."""
    from fa_variants import dispatch
    from fa_variants.common import cache, interop, launch, split, workspace

    def fake_compiled(cfg, build):
        return cache.Compiled(cfg, lambda *args: None, 0.0, None, 0)

    capability = CAPABILITY.get(backend)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(launch.cache, "get_compiled", fake_compiled))
        if device == "cpu" and capability:
            stack.enter_context(mock.patch.object(dispatch, "device_capability", lambda d: capability))
            stack.enter_context(mock.patch.object(interop, "device_arch", lambda d=None: ARCH[capability]))
            stack.enter_context(mock.patch.object(torch.cuda, "device", lambda d: contextlib.nullcontext()))
            stack.enter_context(mock.patch.object(split, "sm_count", lambda index=0: 132))  # an H100/H200
            # split-KV scratch cached as on a CUDA stream (common.workspace), not allocated per call
            stack.enter_context(mock.patch.object(workspace, "CACHE_CPU", True))
        launch._KERNELS.clear()
        dispatch.clear_cache()
        try:
            yield
        finally:
            launch._KERNELS.clear()
            dispatch.clear_cache()


def enqueue_us(fn, calls: int, rounds: int, sync) -> tuple[float, float]:
    """(min, median) over rounds of the host time per call of `calls` calls (timed before the sync)."""
    return per_call_us(fn, calls, rounds, sync, count_sync=False)


def gpu_us(fn, calls: int) -> float | None:
    """GPU time per call: `calls` calls captured in one CUDA graph, replayed and timed by CUDA events."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / (5 * calls)
    except Exception as exc:  # noqa: BLE001 (a diagnostic: say why and go on)
        print(f"#   (gpu time not measured: {type(exc).__name__}: {str(exc)[:120]})")
        return None


def phases(q, k, v, backend: str, calls: int, rounds: int, sync) -> dict[str, float]:
    """Host us per call of each phase of a cached eager call (see the module docstring)."""
    from fa_variants import api, dispatch

    key = api._call_key(q, k, v, True, None, backend)
    plan = dispatch.PLANS[key]
    batch, seqlen_q, heads, head_dim = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
    launch_step = getattr(plan, "launch_step", None)
    steps = {
        "key": lambda: api._call_key(q, k, v, True, None, backend),
        "plan lookup": lambda: dispatch.PLANS.get(key),
    }
    lse_scratch = getattr(plan, "lse_scratch", None)  # the eager call drops the LSE: the stream's scratch
    if lse_scratch is not None:
        steps["alloc"] = lambda: (torch.empty_like(q, memory_format=torch.contiguous_format), lse_scratch())
    else:
        steps["alloc"] = lambda: (torch.empty(q.shape, dtype=q.dtype, device=q.device),
                                  torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device))
    if launch_step is not None:
        steps["launch"] = lambda: launch_step(q, k, v, out, lse)
    parts = getattr(plan, "steps", None)
    if parts is not None:  # the launch's parts: the argument views (fa3: packed views, split scratch), the
        args = parts.prepare(q, k, v, out, lse)  # compiled kernel's TVM-FFI call, the merge (two-kernel split)
        steps["  prepare"] = lambda: parts.prepare(q, k, v, out, lse)
        steps["  kernel call"] = lambda: parts.fn(*args)
        if parts.finish is not None:
            steps["  finish"] = lambda: parts.finish(args, out, lse)
    steps["custom op"] = lambda: torch.ops.fa_variants.attention(q, k, v, True, None, backend)
    return {name: enqueue_us(fn, calls, rounds, sync)[0] for name, fn in steps.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="fa3", help="one backend or a comma-separated list")
    parser.add_argument("--stub", action="store_true", help="no kernel (always so on the CPU)")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed loop (host: the queue must not fill)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--phases", action="store_true", help="also time each phase of a cached call")
    parser.add_argument("--profile", action="store_true", help="cProfile the eager call (top 25 by own time)")
    args = parser.parse_args()

    import fa_variants

    stub = args.stub or args.device == "cpu"
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    b, nq, nk, h, hkv = (DECODE[n] for n in ("batch", "seqlen_q", "seqlen_k", "heads", "heads_kv"))
    where = f"{args.device}, {'kernel stubbed' if stub else 'real kernel'}"
    if cuda:
        print(f"# torch {torch.__version__}; torch.Tensor.__dlpack_c_exchange_api__ (TVM-FFI's fast tensor "
              f"path): {hasattr(torch.Tensor, '__dlpack_c_exchange_api__')}")
    summary = []
    for backend in args.backend.split(","):
        dtype = torch.float32 if backend == "reference" else torch.bfloat16
        q = torch.randn(b, nq, h, args.head_dim, device=args.device, dtype=dtype)
        k, v = (torch.randn(b, nk, hkv, args.head_dim, device=args.device, dtype=dtype) for _ in range(2))
        eager = lambda: fa_variants.attention(q, k, v, causal=True, backend=backend)  # noqa: E731
        print(f"# host time per call, {backend}, {dtype}, B={b} Nq={nq} Nk={nk} H={h}:{hkv} D={args.head_dim} ({where})")
        with stubbed_kernel(backend, args.device) if stub else contextlib.nullcontext():
            if not cuda:
                stack = contextlib.ExitStack()
                from fa_variants.common import split
                stack.enter_context(mock.patch.object(split, "merge", lambda *a: None))  # the CPU's torch merge
            else:
                stack = contextlib.nullcontext()
            with stack:
                eager()
                best, median = per_call_us(eager, args.calls * 10, args.rounds, sync)
                print(f"{'sync loop':18s} {best:8.2f} us/call (min of {args.rounds} x {args.calls * 10}; median {median:.2f})")
                host, median = enqueue_us(eager, args.calls, args.rounds, sync)
                print(f"{'host (enqueue)':18s} {host:8.2f} us/call (min of {args.rounds} x {args.calls}; median {median:.2f})")
                if cuda and not stub:
                    gpu = gpu_us(eager, args.calls)
                    if gpu is not None:
                        print(f"{'gpu':18s} {gpu:8.2f} us/call (CUDA graph of {args.calls} calls)")
                if args.phases:
                    for name, us in phases(q, k, v, backend, args.calls, args.rounds, sync).items():
                        print(f"{'  ' + name:18s} {us:8.2f} us")
                if args.profile:
                    profile = cProfile.Profile()
                    profile.runcall(lambda: [eager() for _ in range(args.calls * 10)])
                    pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        summary.append(f"{backend} host {host:.1f} us/call ({'meets' if host <= 25 else 'misses'} 25 us)")
    print("SUMMARY " + "; ".join(summary) + f" [{where}]")


if __name__ == "__main__":
    main()
