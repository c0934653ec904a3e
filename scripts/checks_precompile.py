"""Compile the kernels of scripts/pending_gpu.sh's --checks selection (``CHECKS`` there) in spawned processes into the
disk compile cache, so that the tests' workers load them instead of each compiling them (on the GPU host).

    source .gpu/env.sh && python3 scripts/checks_precompile.py [--jobs 14] [--list]

Since session 11 the checks are the head_dim 256 fa3-fp8 default (bounded_units flipped in):
tests/test_fp8_overflow_gpu.py -k d256 / units_fault and tests/test_fa3_fp8_gpu.py's head_dim 256 default recipe,
zero-V-block and two-level recipe cases. ``JOBS`` (scripts/fa3_fp8_speed_ab.py ``_compile_one``'s tuples): "recipe"
runs ``attention_fp8`` (the GPU quantisation pass of that recipe and the kernel with that output dtype), "fp8" the
kernel on quantised inputs. Jobs that share a kernel may each compile it; the disk cache keeps one copy. Prints one
line per job and a summary; exit status 1 if a job failed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

D = 256
DEFAULT_RECIPE = ("block", True, True, True)  # FP8Config(granularity, rotate, smooth_k, two_level): the default
JOBS: list[tuple] = (
    # test_default_recipe[*-256-*] and test_zero_v_blocks_long_rows_d256[*-2lvl1] (bf16, the default recipe)
    [("recipe", D, c, ("bfloat16", DEFAULT_RECIPE)) for c in (False, True)]
    # test_every_recipe[256-*-2lvl1] (float16 out, causal): every granularity and rotation with the two-level default
    + [("recipe", D, True, ("float16", (g, r, r, True))) for g in ("block", "head", "tensor") for r in (True, False)]
    # test_fp8_overflow_gpu.py: test_adversarial_v[d256-default-*] (the default kernel on torch-quantised inputs) and
    # test_fused_units_fault (the default with bounded_units=False, not causal)
    + [("fp8", D, c, ()) for c in (False, True)] + [("fp8", D, False, (("bounded_units", False),))]
)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--jobs", type=int, default=min(14, os.cpu_count() or 1))
    p.add_argument("--list", action="store_true", help="print the jobs and exit (no GPU needed)")
    a = p.parse_args()
    if a.list:
        for job in JOBS:
            print(*job)
        print(f"{len(JOBS)} jobs")
        return 0
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    import fa3_fp8_speed_ab as ab

    t0 = time.time()
    jobs = [(kind, d, c, dict(change) if kind == "fp8" else change) for kind, d, c, change in JOBS]
    with ProcessPoolExecutor(min(a.jobs, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
        msgs = list(pool.map(ab._compile_one, jobs))
    bad = [m for m in msgs if not m.startswith("ok")]
    for m in msgs:
        print("  " + m, flush=True)
    print(f"precompile: {len(msgs)} jobs in {time.time() - t0:.0f}s with {min(a.jobs, len(jobs))} workers; "
          f"{len(bad)} failed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
