"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/decode9_gpu.sh
needs, so that its GPU steps only load them: the A/B plan of ``decode_ab.py --s9`` (its ``plan_items``; public
variants worked out on meta tensors by ``decode_ab.public_entry``, entries equal to `auto` left out), what `auto`
itself runs at its shapes, and the configs of the tests of tests/test_decode_gpu.py the script selects (the persistent
packed configs at 2 / 3 stages with and without first_row_only, and what `auto` runs with FA_VARIANTS_DECODE_FULL_GRID
/ _PDL_MIN_SPLITS set). No merge kernel: every call here is unsplit. The compile jobs are scripts/decode_ab.py's.

    python3 scripts/decode9_precompile.py --variants pdl1 pers pers3 pers+pdl1 [--jobs 14] [--list]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

# tests/test_decode_gpu.py: PERSISTENT_SHAPES as (head_dim, group), both stage counts
PERSISTENT_TESTS = ((64, 8), (64, 4), (64, 2), (64, 16), (128, 8))
# tests/test_decode_gpu.py: PDL_UNSPLIT_AUTO and PERSISTENT_AUTO as (decode_ab shape, its variant's switches)
AUTO_TESTS = ([((64, 32, 8, 64, 1024), "pdl1"), ((64, 64, 8, 64, 4097), "pdl1"), ((128, 64, 8, 64, 1023), "pdl1")]
              + [((64, 32, 8, 64, 1024), "pers"), ((128, 64, 8, 64, 4095), "pers3"), ((64, 64, 8, 64, 1024), "pers+pdl1"),
                 ((128, 32, 8, 64, 2048), "pers+pdl1")])


def items(variants, num_sms: int) -> list:
    import decode_ab

    from fa_variants.hopper import fa3

    # plan_items adds auto's generic packed configs (and merges): at these shapes auto runs the ones added below
    generic = {("fa3", d, True, c) for d in (64, 128) for c in (fa3._PACKED_CONFIGS[d], fa3._PACKED_SPLIT_CONFIGS[d])}
    out = list(decode_ab.plan_items(decode_ab.plan(decode_ab.S9, variants, num_sms, skip_same=True)) - generic)
    for name, shape in [("shipped", s) for s in decode_ab.S9] + [(v, s) for s, v in AUTO_TESTS]:
        config, _ = decode_ab.public_entry(name, shape, num_sms)
        out.append(("fa3", shape[0], True, config or fa3.DEFAULT_CONFIGS[shape[0]]))
    for d, group in PERSISTENT_TESTS:
        for tiles in ("persistent", "persistent3"):
            out.append(("fa3", d, True, fa3.first_row(fa3.decode_tiles(fa3._PACKED_CONFIGS[d], d, tiles), group)))
    return sorted(dict.fromkeys(i for i in out if i[0] == "fa3"), key=repr)  # no merge: every call is unsplit


def main() -> int:
    import decode_ab

    return decode_ab.precompile_main(__doc__.splitlines()[0], "--s9", items, "decode9_precompile")


if __name__ == "__main__":
    sys.exit(main())
