"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/decode8_gpu.sh
needs, so that its GPU steps only load them: the A/B plan of ``decode_ab.py --s8`` (its ``plan_items``; public
variants worked out on meta tensors by ``decode_ab.public_entry``, entries equal to `auto` left out), what `auto`
itself runs at its shapes, the configs of the tests of tests/test_decode_gpu.py the script selects (the explicit
dual pack_group configs with and without PDL, and what `auto` runs with FA_VARIANTS_PACK_ROWS_DUAL / _PDL on), and
the merges (bf16, D 64 / 128, plain / PDL, shared-memory / warp). The compile jobs are scripts/decode_ab.py's.

    python3 scripts/decode8_precompile.py --variants pdl16 rowspdl rowsdual rowsdual+pdl [--jobs 16] [--list]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

# tests/test_decode_gpu.py::test_pack_rows_dual_matches_reference: (head_dim, group) of ROWS_DUAL_SHAPES
ROWS_DUAL_TESTS = ((64, 4), (64, 8), (128, 8), (128, 4))
# tests/test_decode_gpu.py::test_auto_runs_pack_rows_switches (ROWS_AUTO): (head_dim, heads, heads_kv, batch, seqlen_k,
# seqlen_q), run with decode_ab's "rowsdual+pdl" switches (PACK_ROWS_DUAL, PACK_ROWS_PDL, PDL up to 32 splits)
ROWS_AUTO = ((64, 32, 8, 1, 4096, 16), (128, 64, 8, 1, 2048, 16), (64, 64, 8, 1, 4096, 16), (64, 32, 8, 8, 4095, 16))


def items(variants, num_sms: int) -> list:
    import decode_ab

    from fa_variants.hopper import fa3

    out = list(decode_ab.plan_items(decode_ab.plan(decode_ab.S8, variants, num_sms, skip_same=True)))
    for name, shape in [("shipped", s) for s in decode_ab.S8] + [("rowsdual+pdl", s) for s in ROWS_AUTO]:
        config, _ = decode_ab.public_entry(name, shape, num_sms)
        out.append(("fa3", shape[0], True, config or fa3.DEFAULT_CONFIGS[shape[0]]))
    for d, group in ROWS_DUAL_TESTS:
        for pdl in (False, True):
            out.append(("fa3", d, True, dataclasses.replace(fa3._PACKED_SPLIT_CONFIGS[d], pack_group=group, pdl=pdl,
                                                            **fa3.DECODE_TILES["dual"][d])))
    out += decode_ab.merge_items((64, 128))  # the GPU tests' merges, with or without A/B variants
    return list(dict.fromkeys(out))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="*", default=[], help="scripts/decode_ab.py variants of the --s8 A/B")
    p.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1))
    p.add_argument("--list", action="store_true", help="print what would be compiled and exit")
    a = p.parse_args()
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import decode_ab

    todo = items(a.variants, decode_ab.gpu_num_sms())
    return decode_ab.precompile_or_list(todo, a.jobs, "decode8_precompile", a.list)


if __name__ == "__main__":
    sys.exit(main())
