"""Host overhead per call of ``fa_variants.attention``: validation, backend choice, stride handling, the
launcher (compiled-kernel lookup, operands, outputs, runtime arguments) and the launch itself.

    python scripts/api_overhead.py                          # CPU: fa3's path to the launch, kernel stubbed
    python scripts/api_overhead.py --backend fa2 --profile  # ... and cProfile of the eager call
    python scripts/api_overhead.py --device cuda --backend fa3            # the real kernel on the GPU
    python scripts/api_overhead.py --device cuda --backend fa3 --stub     # GPU tensors, no kernel

Stubbed (the default on the CPU): the dispatcher sees an sm_90 device and the compiled kernel is a Python
no-op, so every line of the eager path runs except the GPU launch (on the GPU the TVM-FFI launch adds a
few microseconds). Real (``--device cuda`` without ``--stub``): a loop of calls at a decode shape,
synchronised once at the end, as issue 13's table measures host time.

Prints the minimum and median over rounds of the mean time per call (microseconds), for the eager call and
for the same call through the custom op ``torch.ops.fa_variants.attention`` (what torch.compile graphs
call). Issue 13's budget: <= 25 us per call for a cached configuration on the GPU.
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


def per_call_us(fn, calls: int, rounds: int, sync=lambda: None) -> tuple[float, float]:
    """(min, median) over rounds of the mean wall time per call of a loop of `calls` calls, synchronised
    once at the end of each loop."""
    for _ in range(max(1, calls // 5)):
        fn()
    sync()
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        means.append((time.perf_counter() - start) / calls * 1e6)
    return min(means), statistics.median(means)


@contextlib.contextmanager
def stubbed_kernel(backend: str, device: str):
    """The compiled kernel replaced by a no-op (and, on the CPU, the device seen as the backend's GPU)."""
    from fa_variants import dispatch
    from fa_variants.common import cache, interop, launch, split

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
        launch._KERNELS.clear()
        dispatch.clear_cache()
        try:
            yield
        finally:
            launch._KERNELS.clear()
            dispatch.clear_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="fa3")
    parser.add_argument("--stub", action="store_true", help="no kernel (always so on the CPU)")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--profile", action="store_true", help="cProfile the eager call (top 25 by own time)")
    args = parser.parse_args()

    import fa_variants

    stub = args.stub or args.device == "cpu"
    dtype = torch.float32 if args.backend == "reference" else torch.bfloat16
    b, nq, nk, h, hkv = (DECODE[n] for n in ("batch", "seqlen_q", "seqlen_k", "heads", "heads_kv"))
    q = torch.randn(b, nq, h, args.head_dim, device=args.device, dtype=dtype)
    k, v = (torch.randn(b, nk, hkv, args.head_dim, device=args.device, dtype=dtype) for _ in range(2))
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    backend = args.backend
    calls = {"fa_variants.attention (eager)": lambda: fa_variants.attention(q, k, v, causal=True, backend=backend),
             "torch.ops.fa_variants.attention": lambda: torch.ops.fa_variants.attention(q, k, v, True, None, backend)}
    where = f"{args.device}, {'kernel stubbed' if stub else 'real kernel'}"
    print(f"# host time per call, {backend}, bf16, B={b} Nq={nq} Nk={nk} H={h}:{hkv} D={args.head_dim} ({where})")
    with stubbed_kernel(backend, args.device) if stub else contextlib.nullcontext():
        for name, fn in calls.items():
            best, median = per_call_us(fn, args.calls, args.rounds, sync)
            print(f"{name:34s} {best:7.2f} us/call (min of {args.rounds} x {args.calls}; median {median:.2f})")
        if args.profile:
            eager = calls["fa_variants.attention (eager)"]
            profile = cProfile.Profile()
            profile.runcall(lambda: [eager() for _ in range(args.calls)])
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
