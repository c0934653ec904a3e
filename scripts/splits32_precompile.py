"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/splits32_gpu.sh
needs, so that its GPU steps only load them: the A/B plan of ``decode_ab.py --s12l`` (its ``plan_items``; the public
variants worked out on meta tensors by ``decode_ab.public_entry``, entries equal to `auto` left out), what `auto`
itself runs at those shapes, the configs the calls of tests/test_long_dual_gpu.py run with FA_VARIANTS_DECODE_LONG_DUAL
"all" (``test_items``: each shape causal and not, each seqlens_k length as its own call) and every bf16 merge kernel
at head_dim 64 / 128. The compile jobs are scripts/decode_ab.py's (``compile_item``).

    python3 scripts/splits32_precompile.py --variants ldual [--jobs 16] [--list]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "tests")]


def auto_config(shape, causal: bool, num_sms: int, long_dual: str):
    """The fa3 config `auto` compiles for a seqlen_q = 1 call of ``shape`` (head_dim, heads, heads_kv, batch, seqlen_k)
    with LONG_DUAL = ``long_dual`` on a GPU of ``num_sms`` SMs (meta tensors; the default config when unsplit and
    unpacked)."""
    import torch

    from fa_variants.common import split
    from fa_variants.hopper import fa3

    d, h, hkv, b, nk = shape
    q = torch.empty(b, 1, h, d, dtype=torch.bfloat16, device="meta")
    k = torch.empty(b, nk, hkv, d, dtype=torch.bfloat16, device="meta")
    saved = fa3.LONG_DUAL, fa3._auto_splits
    try:
        fa3.LONG_DUAL = long_dual
        fa3._auto_splits = lambda ctas, n_blocks, index, min_tiles=None, per_sm=1: split.num_splits_heuristic(
            ctas, n_blocks, num_sms * per_sm, min_tiles=min_tiles)
        return fa3._problem_config(None, q, k, causal) or fa3.DEFAULT_CONFIGS[d]
    finally:
        fa3.LONG_DUAL, fa3._auto_splits = saved


def test_items(num_sms: int) -> list:
    """The kernels of tests/test_long_dual_gpu.py's calls (LONG_DUAL "all")."""
    import test_long_dual_gpu as t

    shapes = [s[:5] for s in t.LONG] + [(64, 32, 8, 1, 32768)]  # the graph test's
    shapes += [(d, h, hkv, 1, n) for d, h, hkv, lengths in t.SEQLENS for n in lengths if n > 0]
    return [("fa3", s[0], causal, auto_config(s, causal, num_sms, "all")) for s in shapes for causal in (False, True)]


def items(variants, num_sms: int) -> list:
    import decode_ab

    out = list(decode_ab.plan_items(decode_ab.plan(decode_ab.S12L, variants, num_sms, skip_same=True)))
    out += [("fa3", s[0], True, auto_config(s, True, num_sms, "off")) for s in decode_ab.S12L]  # `auto` of the A/B
    out += test_items(num_sms) + decode_ab.merge_items((64, 128))
    return list(dict.fromkeys(out))


def main() -> int:
    import decode_ab

    return decode_ab.precompile_main(__doc__.splitlines()[0], "--s12l", items, "splits32_precompile")


if __name__ == "__main__":
    sys.exit(main())
