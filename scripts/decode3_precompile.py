"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/decode3_gpu.sh
needs: the fused split-merge kernels of tests/test_decode_fused_gpu.py (its ``kernels()``), the ones of the few
tests of tests/test_decode_gpu.py it runs, and the decode A/B plan's (scripts/decode_ab.py ``plan_items``, for the
shapes and variants given), so that the GPU run only loads them (one pool: ~1 min on 16 cores).

    python3 scripts/decode3_precompile.py --variants two fused ... [--wins] [--jobs 12] [--list]
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "scripts")]


def _compile(item) -> str:
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from fa_variants import registry
    from fa_variants.common import split_combine

    kind, d, causal, cfg = item
    t = time.time()
    if kind == "fa2":  # scripts/api_overhead.py --backend fa2's kernel (its default config)
        registry.compiled(registry.variant("fa2").static_config("sm_90a", "bf16", d, causal))  # as the launcher keys it
    elif kind == "merge":
        registry.compiled(registry.static_config("split-merge", "sm_90a", "bf16", d, False,
                                                 split_combine.MergeConfig(pdl=cfg)))
    else:
        registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", d, causal, cfg))
    return f"{kind} D{d} {time.time() - t:.0f}s"


def items(variants, wins: bool) -> list:
    import decode_ab
    import test_decode_fused_gpu

    from fa_variants.hopper import fa3

    out = [("fa3", d, causal, cfg) for d, causal, cfg in test_decode_fused_gpu.kernels()]
    # tests/test_decode_gpu.py -k "cuda_graph_replay_of or either_merge" (decode3_gpu.sh)
    out += [("fa3", 128, True, dataclasses.replace(c, num_splits=n)) for c, n in (
        (fa3.DEFAULT_CONFIGS[128], 0), (fa3._PACKED_CONFIGS[128], 0), (fa3._PACKED_CONFIGS[128], 16))]
    out.append(("fa2", 128, True, None))
    num_sms = decode_ab.NUM_SMS_DEFAULT
    try:
        import torch

        if torch.cuda.is_available():
            num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    except ImportError:
        pass
    if variants:
        rows = decode_ab.plan(decode_ab.MISSES + (decode_ab.WINS if wins else []), variants, num_sms)
        out += [(kind, d, True, cfg) for kind, d, cfg in decode_ab.plan_items(rows)]
    return list(dict.fromkeys(out))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="*", default=[], help="scripts/decode_ab.py variants of the A/B")
    p.add_argument("--wins", action="store_true", help="the A/B runs decode_ab.py --wins")
    p.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1))
    p.add_argument("--list", action="store_true", help="print what would be compiled and exit")
    a = p.parse_args()
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    todo = items(a.variants, a.wins)
    if a.list:
        for kind, d, causal, cfg in todo:
            print(f"{kind} D{d} causal={causal} {cfg}")
        print(f"{len(todo)} kernels")
        return 0
    from fa_variants.common import diskcache

    if not diskcache.enabled():
        print("decode3_precompile: the disk cache is off (FA_VARIANTS_DISK_CACHE); kernels compile on first use")
        return 0
    t = time.time()
    with ProcessPoolExecutor(max_workers=a.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(_compile, sorted(todo, key=repr)))
    print(f"decode3_precompile: {len(done)} kernels in {time.time() - t:.0f}s ({a.jobs} processes)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
