"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/fa1tol_gpu.sh's
tests need, so that its GPU steps only load them: fa1's default config for fp16/bf16 x head_dim 64/96/128/256 x
causal and not, the four tile configs of tests/test_fa1_gpu.py::test_other_tile_configurations (bf16 D 128 causal),
and fa2 bf16 D 64 causal (test_gqa_prefill_every_head_many_draws runs it beside fa1).

    python3 scripts/fa1tol_precompile.py [--jobs 14] [--arch sm_90a] [--list]
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def jobs() -> list[tuple]:
    """(variant, dtype, head_dim, causal, config or None) of every kernel to compile."""
    from fa_variants.common.config import Sm80Config

    out = [("fa1", dtype, d, causal, None) for dtype in ("bf16", "fp16") for d in (64, 96, 128, 256)
           for causal in (False, True)]
    tiles = [Sm80Config(64, 128, 4, 1, 2), Sm80Config(128, 64, 4, 2, 2), Sm80Config(128, 128, 8, 1, 2),
             Sm80Config(64, 64, 4, 2, 2)]  # tests/test_fa1_gpu.py::TILES
    out += [("fa1", "bf16", 128, True, t) for t in tiles]
    return out + [("fa2", "bf16", 64, True, None)]


def compile_one(args: tuple) -> str:
    from fa_variants import registry

    arch, name, dtype, head_dim, causal, config = args
    t0 = time.perf_counter()
    registry.compiled(registry.static_config(name, arch, dtype, head_dim, causal, config))
    return f"{name} {dtype} d{head_dim}{' causal' if causal else ''} {config or 'default'}: {time.perf_counter() - t0:.1f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--arch", help="compile target (default: this GPU's)")
    ap.add_argument("--list", action="store_true", help="print the jobs and exit")
    a = ap.parse_args()
    if a.arch is None:
        from fa_variants.common import interop

        a.arch = interop.device_arch(0)
    todo = [(a.arch, *job) for job in jobs()]
    if a.list:
        print("\n".join(map(str, todo)))
        return 0
    t0 = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(a.jobs) as pool:
        for line in pool.imap_unordered(compile_one, todo):
            print(line, flush=True)
    print(f"precompile: {len(todo)} kernels in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
