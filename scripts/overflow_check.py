"""scripts/bounded_gpu.sh's Python steps: ``precompile`` compiles, in spawned processes into the disk cache,
every fa3-fp8 kernel tests/test_fp8_overflow_gpu.py runs (``OVERFLOW_VARIANTS``, causal and not, and the config of
its fault test, the head_dim 256 default with bounded_units=False, causal and not for the speed step) plus bf16 fa3 at
head_dim 256; ``speed`` times "fused" (the head_dim 256 default with bounded_units=False: fused_promote alone, the
default of sessions 9-10) against "bounded" (the default since session 11: with ``bounded_units``, the fix of
fused_promote's overflow) beside bf16 fa3: N 4k / 16k, causal and not, B N = 16k, H 8, rotated rounds
(scripts/fa3_fp8_speed_ab.py's ``time_problem``), median TFLOP/s per problem and the per-round ratio bounded / fused
(fused time / bounded time, median [min, max]). Compile and timing helpers are scripts/fa3_fp8_speed_ab.py's.
``--head-dim 256`` (precompile): only the head_dim 256 kernels (scripts/bounded_gpu.sh, whose GPU tests are the head_dim
256 ones); ``--aa`` (speed): a second instance of "fused" (its own inputs, the same kernel) timed in the same rounds,
its ratio fused / fused-aa the A/A control of the bounded / fused ratio.

    python3 scripts/overflow_check.py precompile [--jobs 14] [--head-dim 256]
    python3 scripts/overflow_check.py speed [--rounds 6 --iters 20] [--aa]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "tests")]

PROBLEMS = [(4096, False), (4096, True), (16384, False), (16384, True)]  # (N, causal); B = 16384 / N, H 8, D 256


def jobs(head_dim: int | None = None) -> list[tuple]:
    """(kind, head_dim, causal, change) for fa3_fp8_speed_ab._compile_one: the GPU tests' kernels (those at head_dim
    only, where given) and bf16 fa3 at 256."""
    from test_fp8_overflow_gpu import OVERFLOW_VARIANTS

    out = [("fp8", D, c, change) for D, change in OVERFLOW_VARIANTS.values() for c in (False, True)
           if head_dim is None or D == head_dim]
    # the head_dim 256 default without bounded_units: the fault test's (not causal) and the speed step's (both)
    out += [("fp8", 256, c, {"bounded_units": False}) for c in (False, True)]
    out += [("bf16", 256, False, {}), ("bf16", 256, True, {})]
    return out


def precompile(n_jobs: int, head_dim: int | None = None) -> int:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    import fa3_fp8_speed_ab as ab

    t0 = time.time()
    with ProcessPoolExecutor(n_jobs, mp_context=mp.get_context("spawn")) as pool:
        msgs = list(pool.map(ab._compile_one, jobs(head_dim)))
    bad = [m for m in msgs if not m.startswith("ok")]
    print(f"precompile: {len(msgs)} jobs in {time.time() - t0:.0f}s with {n_jobs} workers; {len(bad)} failed", flush=True)
    for m in bad:
        print("  " + m, flush=True)
    return 1 if bad else 0


def speed(rounds: int, iters: int, aa: bool = False) -> int:
    import torch

    import fa3_fp8_speed_ab as ab
    from fa_variants.hopper import fa3, fa3_fp8

    D, H = 256, 8
    print("problem                fused  bounded  bf16-fa3  bounded/fused per round: median [min, max]"
          + ("     A/A fused/fused-aa" if aa else ""))
    for N, causal in PROBLEMS:
        B = 16384 // N
        impls = {}
        fused = dict(bounded_units=False)
        variants = [("fused", fused), ("bounded", {})] + ([("fused-aa", fused)] if aa else [])
        for name, change in variants:
            cfg = ab.kernel_config(D, change)
            args = ab.fp8_inputs(B, N, H, D, cfg.tile_n)
            impls[name] = (lambda a=args, c=cfg: fa3_fp8.run_quantized(*a, softmax_scale=D ** -0.5, causal=causal,
                                                                        config=c))
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        impls["bf16-fa3"] = lambda: fa3.run(q, k, v, causal=causal, softmax_scale=D ** -0.5)
        times = ab.time_problem(impls, rounds, iters)
        flops = 4 * B * H * N * N * D / (2 if causal else 1)
        tf = {n: flops / (statistics.median(t) * 1e-3) / 1e12 for n, t in times.items()}
        ratios = _ratios(times, "bounded")
        control = ""
        if aa:
            r = _ratios(times, "fused-aa")
            control = f"   {statistics.median(r):.3f} [{r[0]:.3f}, {r[-1]:.3f}]"
        print(f"N {N:5d} {'causal' if causal else 'full  '}     {tf['fused']:7.0f}  {tf['bounded']:7.0f}  "
              f"{tf['bf16-fa3']:8.0f}  {statistics.median(ratios):.3f} [{ratios[0]:.3f}, {ratios[-1]:.3f}]{control}",
              flush=True)
    return 0


def _ratios(times: dict[str, list[float]], name: str) -> list[float]:
    """Per round, "fused"'s time over ``name``'s (speed of name relative to fused), sorted."""
    return sorted(d / b for d, b in zip(times["fused"], times[name]))


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("phase", choices=["precompile", "speed", "list"])
    p.add_argument("--jobs", type=int, default=min(14, os.cpu_count() or 1))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--head-dim", type=int, choices=[64, 96, 128, 256], default=None,
                   help="precompile / list: only the GPU tests' kernels at this head_dim (and the 256 speed kernels)")
    p.add_argument("--aa", action="store_true", help="speed: time a second fused instance (A/A control)")
    a = p.parse_args()
    if a.phase == "list":
        for j in jobs(a.head_dim):
            print(*j)
        print(f"{len(jobs(a.head_dim))} jobs")
        return 0
    return precompile(a.jobs, a.head_dim) if a.phase == "precompile" else speed(a.rounds, a.iters, a.aa)


if __name__ == "__main__":
    sys.exit(main())
