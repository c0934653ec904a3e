"""fa3-fp8 head_dim 256 schedules of session 6 on an sm90 GPU (issue 10): ``s_lookahead`` (the next K/V tile's S GEMM
issued in the P V turn, before the last slice's promotion) with tile_n 64 (four P V slices; two or four stages) and
96 (eight slices; two or three stages); 128 with S in two halves (``s_halves``) is the default since the session-6
A/B (tests/test_fa3_fp8_gpu.py runs it), so here "old" is the serial default before it; and the tile_n 64 controls
the A/B times beside them (the old schedule, the single accumulator with intra-warpgroup overlap). The names are those of scripts/fa3_fp8_speed_ab.py ``D256_VARIANTS``.

Session 7 (``HALVES_VARIANTS``): S as two 64-key MMAs without the lookahead, in the serial two-level schedule and in
the single accumulator with intra-warpgroup overlap (what the halves cost; fa3_fp8_speed_ab.py --set fp8d256b).

The kernel against its emulation on the same quantised inputs (default recipe, K/V scale blocks of the variant's
tile_n, its accumulation told to the emulation), bounds of tests/test_fa3_fp8_gpu.py (rel-L2 <= 6e-3, LSE <= 1.5e-3
on rows that see a key, -inf and O = 0 on the others), and against float64 within ``fp8_error_bound``. Shapes: one
K/V tile (the loop's single-tile branch), two tiles (causal: every tile after the first on the diagonal), a partial
last tile with many free ones, Nq > Nk (causal rows that see no key), GQA and MQA; NaN-poisoned outputs.

    source .gpu/env.sh && python3 -m pytest -m gpu tests/test_fa3_fp8_lookahead_gpu.py -q
"""
import dataclasses

import pytest
import torch

from helpers import assert_fp8_matches_emulation

pytestmark = pytest.mark.gpu

SHAPES = [(1, 40, 40, 2, 1), (1, 113, 113, 4, 2), (2, 113, 1023, 4, 1), (1, 1023, 113, 3, 3)]
SHAPE_IDS = ["x".join(map(str, s)) for s in SHAPES]
# fa3_fp8.NO_LOOKAHEAD: the serial default before
NO_LOOKAHEAD = dict(s_lookahead=False, s_halves=False, fused_promote=False, bounded_units=False)
VARIANTS = {
    "old": dict(NO_LOOKAHEAD),
    "look64": dict(tile_n=64, s_lookahead=True, s_halves=False),
    "look64_st4": dict(tile_n=64, s_lookahead=True, s_halves=False, stages=4),
    "look96_p8": dict(tile_n=96, s_lookahead=True, s_halves=False, pv_split=8),
    "look96_p8_st3": dict(tile_n=96, s_lookahead=True, s_halves=False, pv_split=8, stages=3),
    "serial64": dict(tile_n=64, **NO_LOOKAHEAD),
    "single64_overlap": dict(tile_n=64, two_level=False, pv_split=1, pv_buffers=1, intra_wg_overlap=True, **NO_LOOKAHEAD),
}
# session 7 (scripts/fa3_fp8_speed_ab.py --set fp8d256b): S as two 64-key MMAs without the lookahead (s_halves alone), in
# the serial two-level schedule and in the single accumulator with intra-warpgroup overlap
HALVES_VARIANTS = {
    "old_halves": dict(s_lookahead=False, s_halves=True, fused_promote=False, bounded_units=False),
    "single_overlap_halves": dict(two_level=False, pv_split=1, pv_buffers=1, intra_wg_overlap=True, s_lookahead=False,
                                  s_halves=True, fused_promote=False, bounded_units=False),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_d256_variant_vs_emulation(fp8_kernel, variant, shape, causal, rng_seed, nan_allocations):
    _check(fp8_kernel, variant, VARIANTS[variant], shape, causal, rng_seed, nan_allocations)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("variant", list(HALVES_VARIANTS))
def test_d256_halves_vs_emulation(fp8_kernel, variant, shape, causal, rng_seed, nan_allocations):
    _check(fp8_kernel, variant, HALVES_VARIANTS[variant], shape, causal, rng_seed, nan_allocations)


def _check(fp8_kernel, variant, change, shape, causal, seed, nan_allocations):
    """The variant (``change`` on the head_dim 256 default) vs the emulation and float64 on fresh inputs."""
    from fa_variants import fp8
    from fa_variants.fp8.quantize import quantize_fp8_torch
    from fa_variants.reference import attention_reference

    cfg = dataclasses.replace(fp8_kernel.DEFAULT_CONFIGS[256], **change)
    B, Nq, Nk, H, Hkv = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, n, h, 256, device="cuda", generator=g).to(torch.bfloat16)
               for n, h in ((Nq, H), (Nk, Hkv), (Nk, Hkv)))
    recipe = fp8.FP8Config(two_level=cfg.two_level, promote_every=cfg.promote_every)
    inp = quantize_fp8_torch(q, k, v, config=recipe, block_n=cfg.tile_n)
    with nan_allocations():  # an output element the kernel does not write stays NaN
        out, lse = fp8_kernel.run_fp8(inp, causal=causal, out_dtype=torch.bfloat16, config=cfg)
    emu32, emu_lse = fp8.emulate_fp8_attention(inp, causal=causal)
    exact, _ = attention_reference(q, k, v, causal=causal, dtype=torch.float64)
    assert_fp8_matches_emulation(out, lse, emu32, emu_lse, exact, config=cfg, variant=variant, seed=seed)
