"""Compile the kernels of issue 10's status table (`fa-variants bench --dtypes e4m3 --fp8-status only`,
fa_variants/bench/fp8status.py) in spawned processes into the disk caches, so that the timed process loads them
(on the GPU host; scripts/fp8status_gpu.sh runs it first).

    source .gpu/env.sh && python3 scripts/fp8status_precompile.py [--jobs 16] [--head-dims 64 128 256] [--list]

Per head_dim and causal mode (``jobs``; scripts/fa3_fp8_speed_ab.py ``_compile_one``'s tuples for ours): "recipe" =
``attention_fp8`` with the default recipe on bf16 inputs (the quantisation pass and the default fa3-fp8 kernel with
bf16 output: the status table's ``quant``, ``fp8`` and ``fp8_call`` entries); "fp8" = the kernel with one running
accumulator (``fp8status.SINGLE_ACCUMULATOR``: its ``fp8_single``); "bf16" = our bf16 fa3's default; "fa4" =
flash-attn-4 called as the table calls it (``flash_attn_func(q, k, v, causal=...)`` on bf16 CUDA tensors), which fills
its own disk cache when FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 and FLASH_ATTENTION_CUTE_DSL_CACHE_DIR are set here
and in the timed run (its compile key has no seqlen: one job per head_dim and causal mode). Head_dim 256 and
flash-attn-4 first (the longest compiles). One line per job, then a summary; exit status 1 if a job of ours failed
(flash-attn-4 missing is reported, not a failure: the table then says it was not timed).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

DEFAULT_RECIPE = ("block", True, True, True)  # FP8Config(granularity, rotate, smooth_k, two_level): the default


def jobs(head_dims=(64, 128, 256)) -> list[tuple]:
    """(kind, head_dim, causal, change) of every kernel the status table runs, the longest compiles first."""
    from fa_variants.bench.fp8status import SINGLE_ACCUMULATOR

    dims = sorted(head_dims, reverse=True)
    out = [("fa4", d, c, ()) for d in dims for c in (False, True)]
    out += [("recipe", d, c, ("bfloat16", DEFAULT_RECIPE)) for d in dims for c in (False, True)]
    out += [("fp8", d, c, dict(SINGLE_ACCUMULATOR[d])) for d in dims for c in (False, True)]
    out += [("bf16", d, c, {}) for d in dims for c in (False, True)]
    return sorted(out, key=lambda j: j[1] != 256 and j[0] != "fa4")  # stable: 256 and flash-attn-4 first


def compile_one(job: tuple) -> str:
    """Worker: one job (ours through fa3_fp8_speed_ab._compile_one; flash-attn-4 by a call on tiny inputs)."""
    kind, d, causal, _ = job
    if kind != "fa4":
        import fa3_fp8_speed_ab as ab

        return ab._compile_one(job)
    t0 = time.time()
    try:
        import torch
        from flash_attn.cute.interface import flash_attn_func
    except Exception as exc:  # noqa: BLE001 - not installed: the table reports it
        return f"skipped fa4 d{d} causal={causal}: flash-attn-4 not importable ({type(exc).__name__})"
    try:
        q = torch.randn(1, 256, 2048 // d, d, device="cuda", dtype=torch.bfloat16)
        flash_attn_func(q, q, q, causal=causal)
        torch.cuda.synchronize()
        return f"ok fa4 d{d} causal={causal} {time.time() - t0:.1f}s"
    except Exception as exc:  # noqa: BLE001 - reported; the table then says flash-attn-4 failed there
        return f"skipped fa4 d{d} causal={causal}: {type(exc).__name__}: {str(exc)[:160]}"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256], choices=[64, 96, 128, 256])
    p.add_argument("--list", action="store_true", help="print the jobs and exit (no GPU needed)")
    a = p.parse_args()
    work = jobs(a.head_dims)
    if a.list:
        for job in work:
            print(*job)
        print(f"{len(work)} jobs")
        return 0
    if os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED") != "1":
        print("note: FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED is not 1: flash-attn-4 compiles again in the timed run")
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    t0, workers = time.time(), max(1, min(a.jobs, len(work)))
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        msgs = list(pool.map(compile_one, work))
    for m in msgs:
        print("  " + m, flush=True)
    bad = [m for m in msgs if not m.startswith(("ok", "skipped"))]
    print(f"precompile: {len(msgs)} jobs in {time.time() - t0:.0f}s with {workers} workers; {len(bad)} failed",
          flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
