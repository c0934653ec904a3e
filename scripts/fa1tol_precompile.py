"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/fa1tol_gpu.sh's
tests need, so that its GPU steps only load them: fa1's default config for fp16/bf16 x head_dim 64/96/128/256 x
causal and not, the four tile configs of tests/test_fa1_gpu.py::test_other_tile_configurations (bf16 D 128 causal),
and fa2 bf16 D 64 causal (test_gqa_prefill_every_head_many_draws runs it beside fa1); with ``--before DIR`` also the
A/B step's kernels of the package ``fa_variants_before`` in DIR (scripts/ab_checkout.sh): fa1 bf16 D 128 / 256, not
causal, which scripts/ab_bench.py would otherwise trace and compile one after the other inside its time limit.
The head_dim 256 kernels (the slowest) are started first.

    python3 scripts/fa1tol_precompile.py [--jobs 14] [--arch sm_90a] [--before .before] [--list]
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
import before_pkg  # noqa: E402  (scripts/before_pkg.py)


def jobs(before: str | None = None) -> list[tuple]:
    """(package folder or None, variant, dtype, head_dim, causal, config or None) of every kernel to compile, the
    head_dim 256 ones first; ``before``: the folder holding ``fa_variants_before`` (its A/B kernels added)."""
    from fa_variants.common.config import Sm80Config

    out = [(None, "fa1", dtype, d, causal, None) for dtype in ("bf16", "fp16") for d in (64, 96, 128, 256)
           for causal in (False, True)]
    tiles = [Sm80Config(64, 128, 4, 1, 2), Sm80Config(128, 64, 4, 2, 2), Sm80Config(128, 128, 8, 1, 2),
             Sm80Config(64, 64, 4, 2, 2)]  # tests/test_fa1_gpu.py::TILES
    out += [(None, "fa1", "bf16", 128, True, t) for t in tiles]
    out += [(None, "fa2", "bf16", 64, True, None)]
    if before is not None:  # scripts/fa1tol_gpu.sh's ab step: --backends fa1 --head-dims 128,256 --causal no, bf16
        out += [(before, "fa1", "bf16", d, False, None) for d in (128, 256)]
    return sorted(out, key=lambda job: -job[3])  # stable: the listed order within a head_dim


def compile_one(args: tuple) -> str:
    import importlib

    arch, before, name, dtype, head_dim, causal, config = args
    if before is not None:  # the checked-out package (scripts/ab_checkout.sh), its own disk-cache fingerprint
        sys.path.insert(0, str(Path(before).resolve()))
    registry = importlib.import_module("fa_variants_before.registry" if before else "fa_variants.registry")
    t0 = time.perf_counter()
    registry.compiled(registry.static_config(name, arch, dtype, head_dim, causal, config))
    return (f"{'before ' if before else ''}{name} {dtype} d{head_dim}{' causal' if causal else ''} "
            f"{config or 'default'}: {time.perf_counter() - t0:.1f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--arch", help="compile target (default: this GPU's)")
    ap.add_argument("--before", help="folder holding fa_variants_before (scripts/ab_checkout.sh; FOLDER.tar.xz "
                    "unpacked into it when missing): its A/B kernels too")
    ap.add_argument("--list", action="store_true", help="print the jobs and exit")
    a = ap.parse_args()
    if a.arch is None:
        from fa_variants.common import interop

        a.arch = interop.device_arch(0)
    if a.before is not None:  # .before.tar.xz unpacked into .before when only the archive was carried
        a.before = str(before_pkg.before_dir(a.before, "fa1tol_precompile"))
    todo = [(a.arch, *job) for job in jobs(a.before)]
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
