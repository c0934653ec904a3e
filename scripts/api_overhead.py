"""Host overhead per call of ``fa_variants.attention`` (validation, backend choice, stride handling), with the
backend's ``run`` replaced by a stub that returns preallocated outputs: what the API adds to a kernel.

    python scripts/api_overhead.py                          # the CPU, reference backend
    python scripts/api_overhead.py --device cuda --backend fa3

Prints the minimum and median over rounds of the mean time per call (microseconds), for the eager call and,
for comparison, for the same call through the custom op ``torch.ops.fa_variants.attention`` (what
torch.compile graphs call). Issue 13's budget: <= 25 us per call for a cached configuration on the GPU.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def per_call_us(fn, calls: int, rounds: int) -> tuple[float, float]:
    for _ in range(calls // 5):
        fn()
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        means.append((time.perf_counter() - start) / calls * 1e6)
    return min(means), statistics.median(means)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="reference")
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    import fa_variants
    from fa_variants import dispatch

    dtype = torch.float32 if args.backend == "reference" else torch.bfloat16
    q, k, v = (torch.randn(1, 1, 1, 64, device=args.device, dtype=dtype) for _ in range(3))
    out, lse = torch.zeros_like(q), torch.zeros(1, 1, 1, device=args.device)
    module = dispatch.get_module(args.backend)
    module.run = lambda q, k, v, causal, softmax_scale: (out, lse)  # the stub: no kernel, no maths
    backend = args.backend
    for name, fn in (("fa_variants.attention (eager)",
                      lambda: fa_variants.attention(q, k, v, causal=True, backend=backend)),
                     ("torch.ops.fa_variants.attention",
                      lambda: torch.ops.fa_variants.attention(q, k, v, True, None, backend))):
        best, median = per_call_us(fn, args.calls, args.rounds)
        print(f"{name:34s} {best:7.2f} us/call (min of {args.rounds} x {args.calls}; median {median:.2f})")


if __name__ == "__main__":
    main()
