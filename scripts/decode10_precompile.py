"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/decode10_gpu.sh
needs, so that its GPU steps only load them: the A/B plan of ``decode_ab.py --s10`` (its ``plan_items``; public
variants worked out on meta tensors by ``decode_ab.public_entry``, entries equal to `auto` left out), what `auto`
itself runs at its shapes, the configs of the tests of tests/test_decode_gpu.py the script selects (the D 64 wide
packed tile with 192-key K/V tiles, split and not, causal and not; what `auto` runs with
FA_VARIANTS_DECODE_PDL_MIN_SPLITS=1), and the D 64 merge kernels without PDL (the split wide calls at B 1 / 8).
The compile jobs are scripts/decode_ab.py's.

    python3 scripts/decode10_precompile.py --variants pdl1 w192 [--jobs 14] [--list]
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

# tests/test_decode_gpu.py: PDL_UNSPLIT_AUTO and test_auto_wide192 as (decode_ab shape, its variant's switches)
AUTO_TESTS = [((64, 32, 8, 64, 1024), "pdl1"), ((64, 64, 8, 64, 4097), "pdl1"), ((128, 64, 8, 64, 1023), "pdl1"),
              ((64, 64, 8, 1, 2047, 16), "w192"), ((64, 64, 8, 64, 2047, 16), "w192")]


def items(variants, num_sms: int) -> list:
    import decode_ab

    from fa_variants.hopper import fa3

    # plan_items adds auto's generic packed configs (at these shapes auto runs the ones added below instead) and every
    # merge kernel: the split calls here are D 64 seqlen_q 16 ones, which bind a merge without PDL
    generic = {("fa3", d, True, c) for d in (64, 128) for c in (fa3._PACKED_CONFIGS[d], fa3._PACKED_SPLIT_CONFIGS[d])}
    rows = decode_ab.plan(decode_ab.S10, variants, num_sms, skip_same=True)
    out = [i for i in decode_ab.plan_items(rows) - generic
           if i[0] == "fa3" or (i[1] == 64 and not i[3].pdl)]
    for name, shape in [("shipped", s) for s in decode_ab.S10] + [(v, s) for s, v in AUTO_TESTS]:
        config, _ = decode_ab.public_entry(name, shape, num_sms)
        out.append(("fa3", shape[0], True, config or fa3.DEFAULT_CONFIGS[shape[0]]))
    wide = dataclasses.replace(fa3._PACKED_CONFIGS[64], tile_m=fa3.WIDE_TILE_M, pingpong=True, tile_n=192, pack_group=8)
    for causal in (False, True):  # tests/test_decode_gpu.py::test_wide192_packed_rows_match_reference
        for splits in (0, 1):
            out.append(("fa3", 64, causal, dataclasses.replace(wide, num_splits=splits)))
    return sorted(dict.fromkeys(out), key=repr)


def main() -> int:
    import decode_ab

    return decode_ab.precompile_main(__doc__.splitlines()[0], "--s10", items, "decode10_precompile")


if __name__ == "__main__":
    sys.exit(main())
