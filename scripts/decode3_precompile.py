"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/decode3_gpu.sh
needs: the fused split-merge kernels of tests/test_decode_fused_gpu.py (its ``kernels()``), the ones of the few
tests of tests/test_decode_gpu.py it runs, and the decode A/B plan's (scripts/decode_ab.py ``plan_items``, for the
shapes and variants given), so that the GPU run only loads them (one pool: ~1 min on 16 cores). The compile jobs
are scripts/decode_ab.py's (``compile_item``, ``compile_all``): one piece for both scripts.

    python3 scripts/decode3_precompile.py --variants two fused ... [--wins] [--jobs 12] [--list]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "scripts")]


def items(variants, wins: bool) -> list:
    import decode_ab
    import test_decode_fused_gpu

    from fa_variants.hopper import fa3

    out = [("fa3", d, causal, cfg) for d, causal, cfg in test_decode_fused_gpu.kernels()]
    # tests/test_decode_gpu.py -k "cuda_graph_replay_of or either_merge" (decode3_gpu.sh)
    out += [("fa3", 128, True, dataclasses.replace(c, num_splits=n)) for c, n in (
        (fa3.DEFAULT_CONFIGS[128], 0), (fa3._PACKED_CONFIGS[128], 0), (fa3._PACKED_CONFIGS[128], 16))]
    out.append(("fa2", 128, True, None))
    num_sms = decode_ab.gpu_num_sms()
    if variants:
        rows = decode_ab.plan(decode_ab.MISSES + (decode_ab.WINS if wins else []), variants, num_sms)
        out += list(decode_ab.plan_items(rows))
    return list(dict.fromkeys(out))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="*", default=[], help="scripts/decode_ab.py variants of the A/B")
    p.add_argument("--wins", action="store_true", help="the A/B runs decode_ab.py --wins")
    p.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1))
    p.add_argument("--list", action="store_true", help="print what would be compiled and exit")
    a = p.parse_args()
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import decode_ab

    return decode_ab.precompile_or_list(items(a.variants, a.wins), a.jobs, "decode3_precompile", a.list)


if __name__ == "__main__":
    sys.exit(main())
