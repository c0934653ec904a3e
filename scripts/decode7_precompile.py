"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/decode7_gpu.sh
needs, so that its GPU steps only load them: the A/B plan of ``decode_ab.py --s7`` (its ``plan_items``; public
variants worked out on meta tensors by ``decode_ab.public_entry``, entries equal to `auto` left out) and what `auto`
itself runs at its shapes (the shipped switches: dual and 128-row tiles included), the configs
`auto` runs in the tests of tests/test_decode_gpu.py the script selects, the first-row-only configs of its first-row
tests, and the merges (bf16, D 64 / 128,
plain / PDL, shared-memory / warp). The compile jobs are scripts/decode_ab.py's (``compile_item``).

    python3 scripts/decode7_precompile.py --variants warp warp+pdl16 row1 [--jobs 16] [--list]
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

# (public variant, (head_dim, heads, heads_kv, batch, seqlen_k[, seqlen_q])) that tests/test_decode_gpu.py runs
# through `auto` (-k "auto_decode_defaults or merge_warp_flip or auto_runs_first_row")
TEST_AUTO = ([("shipped", (d, h, hkv, b, nk)) for b, nk, h, hkv, d in (
    (1, 1024, 32, 8, 128), (1, 1000, 64, 8, 64), (8, 1023, 32, 8, 64), (1, 4096, 64, 8, 128), (1, 4097, 32, 8, 64),
    (1, 4095, 32, 8, 64))]
    + [("row1", (d, h, hkv, b, nk)) for b, nk, h, hkv, d in (
        (1, 1024, 32, 8, 128), (8, 1023, 32, 8, 64), (1, 4097, 32, 8, 64), (64, 1000, 32, 8, 64))])


def items(variants, num_sms: int) -> list:
    import decode_ab

    from fa_variants.hopper import fa3

    out = list(decode_ab.plan_items(decode_ab.plan(decode_ab.S7, variants, num_sms, skip_same=True)))
    for name, shape in [("shipped", s) for s in decode_ab.S7] + TEST_AUTO:  # `auto` of the A/B, then the tests
        config, _ = decode_ab.public_entry(name, shape, num_sms)
        out.append(("fa3", shape[0], True, config or fa3.DEFAULT_CONFIGS[shape[0]]))
    for d in (64, 128):  # test_first_row_only_matches_reference: unsplit and split (any count: one kernel)
        for base, n in ((fa3._PACKED_CONFIGS[d], 1), (fa3._PACKED_SPLIT_CONFIGS[d], 0)):
            out.append(("fa3", d, True, dataclasses.replace(fa3.first_row(base, 8, True), num_splits=n)))
    out += decode_ab.merge_items((64, 128))  # the GPU tests' merges, with or without A/B variants
    return list(dict.fromkeys(out))


def main() -> int:
    import decode_ab

    return decode_ab.precompile_main(__doc__.splitlines()[0], "--s7", items, "decode7_precompile")


if __name__ == "__main__":
    sys.exit(main())
