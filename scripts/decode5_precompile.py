"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/decode5_gpu.sh
needs, so that its GPU steps only load them: the A/B plan of ``decode_ab.py --s6`` (its ``plan_items``, the public
variants' configs worked out on meta tensors by ``decode_ab.public_entry``), the configs `auto` runs in the GPU tests
of tests/test_decode_gpu.py the script selects, the 128-row packed configs of its wide tests, and the merges
(bf16 / fp16, plain / PDL, shared-memory / warp). The compile jobs are scripts/decode_ab.py's (``compile_item``).

    python3 scripts/decode5_precompile.py --variants old warp dualauto wide cand [--jobs 16] [--list]
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

# (public variant, (head_dim, heads, heads_kv, batch, seqlen_k[, seqlen_q])) that tests/test_decode_gpu.py runs
# through `auto` (-k "auto_decode_defaults or one_tile or auto_runs_wide or dual_auto")
TEST_AUTO = ([("two", (d, h, hkv, b, nk)) for b, nk, h, hkv, d in (
    (1, 1024, 32, 8, 128), (1, 1000, 64, 8, 64), (8, 1023, 32, 8, 64), (1, 4096, 64, 8, 128), (1, 4097, 32, 8, 64),
    (2, 1024, 32, 8, 128), (1, 130, 32, 8, 128), (1, 4096, 32, 8, 128))]
    + [("wide", (64, h, 8, b, 2048, 16)) for b, h in ((1, 64), (64, 64), (1, 32))]
    + [("dualauto", s) for s in ((64, 32, 8, 8, 1023), (128, 64, 8, 8, 1024), (128, 32, 8, 64, 1000))])


def items(variants, num_sms: int) -> list:
    import decode_ab

    from fa_variants.common import split_combine
    from fa_variants.hopper import fa3

    out = list(decode_ab.plan_items(decode_ab.plan(decode_ab.S6, variants, num_sms)))
    for name, shape in TEST_AUTO:
        config, _ = decode_ab.public_entry(name, shape, num_sms)
        out.append(("fa3", shape[0], True, config or fa3.DEFAULT_CONFIGS[shape[0]]))
    for d in (64, 128):  # tests/test_decode_gpu.py::test_wide_packed_rows_match_reference (wide_config)
        for n in (1, 0):
            cfg = dataclasses.replace(fa3._PACKED_CONFIGS[d], tile_m=fa3.WIDE_TILE_M, pingpong=True, pack_group=8,
                                      num_splits=n)
            out += [("fa3", d, causal, cfg) for causal in (True, False)]
    for d in (64, 96, 128, 256):  # the merges: A/B (bf16), merge tests (bf16, fp16 at every head dim)
        for pdl in (False, True):
            for warp in (False, True):
                merge = split_combine.MergeConfig(pdl=pdl, warp=warp)
                out += [(kind, d, False, merge) for kind in ("merge", "merge-fp16")]
    return list(dict.fromkeys(out))


def main() -> int:
    import decode_ab

    return decode_ab.precompile_main(__doc__.splitlines()[0], "--s6", items, "decode5_precompile")


if __name__ == "__main__":
    sys.exit(main())
