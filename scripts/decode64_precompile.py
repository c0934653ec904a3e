"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/decode64_gpu.sh
needs, so that its GPU steps only load them: the A/B plan of ``decode_ab.py --s12`` (its ``plan_items``; public
variants worked out on meta tensors by ``decode_ab.public_entry``, entries equal to `auto` left out), what `auto`
itself runs at those shapes (the shipped switches: wide and packed-row tiles included), and the fused kernels of the
tests of tests/test_decode_fused_gpu.py the script selects (``decode64_kernels``, the packed D 64 / 128 fused
configs, the D 128 PDL one of its graph test and the two-kernel config it compares with). The compile jobs are
scripts/decode_ab.py's (``compile_item``).

    python3 scripts/decode64_precompile.py --variants fused1 [--jobs 16] [--list]
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "tests")]


def test_items() -> list:
    """The kernels of decode64_gpu.sh's test step (-k: decode64, packed_decode at D 64 / 128, fused_equals,
    cuda_graph_replay)."""
    import test_decode_fused_gpu as t

    from fa_variants.hopper import fa3

    out = [("fa3", d, causal, cfg) for d, causal, cfg in t.decode64_kernels()]
    for d in (64, 128):
        out.append(("fa3", d, True, t._config(d, 0, True)))
    out.append(("fa3", 128, True, t._config(128, 0, True, pdl=True)))
    out.append(("fa3", 128, True, dataclasses.replace(t._config(128, 0, True), fused_merge=False)))
    return out


def items(variants, num_sms: int) -> list:
    import decode_ab

    from fa_variants.hopper import fa3

    out = list(decode_ab.plan_items(decode_ab.plan(decode_ab.S12, variants, num_sms, skip_same=True)))
    for shape in decode_ab.S12:  # `auto` of the A/B
        config, _ = decode_ab.public_entry("shipped", shape, num_sms)
        out.append(("fa3", shape[0], True, config or fa3.DEFAULT_CONFIGS[shape[0]]))
    out += test_items() + decode_ab.merge_items((64, 128))
    return list(dict.fromkeys(out))


def main() -> int:
    import decode_ab

    return decode_ab.precompile_main(__doc__.splitlines()[0], "--s12", items, "decode64_precompile")


if __name__ == "__main__":
    sys.exit(main())
