"""The speed switches of issue 10 on an sm90 GPU, off by default but skip_unit_rescale (on in fa3-fp8 since session 5):
``early_pv_arrive`` (the ping-pong turn handed on right after the P V GEMM's issue), ``skip_unit_rescale`` in fa3-fp8
(O *= alpha skipped when no row max of the thread moved), ``descale_prefetch`` (K/V descales read ahead), ``reduce_chains`` (row max and row sum in independent chains; session 6,
head_dim 64/128: ``FP8SMALL_VARIANTS``), the lookahead schedule at 128 (session 7:
``FP8MID_VARIANTS``), ``q_tail_first`` (the partial query tile first under causal masking; session 7: ``FP8D128_VARIANTS``),
``fused_promote`` at head_dim 256 (O *= alpha folded into the two-level promotion; session 8: ``FP8TWO_VARIANTS``),
the defaults before session 5 ("old"), and the
combinations scripts/fa3_fp8_speed_ab.py times (``--set fp8speed`` / ``fp8flip``, whose precompile builds these).

fa3-fp8: the kernel against its emulation on the same quantised inputs (default recipe; its two_level and
promote_every set to the variant's, which the emulation reads); bounds of
tests/test_fa3_fp8_gpu.py (rel-L2 <= 6e-3, LSE <= 1.5e-3 on rows that see a key, -inf and O = 0 on the others)
and vs float64 within ``fp8_error_bound``. bf16 fa3 with the same switches: the
project's rule against float64 (``helpers.assert_attention_ok``). Shapes: one K/V tile; several (masked and
unmasked steps) with a partial last tile; Nq > Nk (causal rows that see no key); GQA and MQA.

    source .gpu/env.sh && python3 -m pytest -m gpu tests/test_fa3_fp8_speed_gpu.py -q
"""
import dataclasses
import math

import pytest
import torch

from helpers import assert_attention_ok, assert_fp8_matches_emulation, make_qkv

pytestmark = pytest.mark.gpu

SHAPES = [(1, 113, 113, 4, 2), (2, 113, 1023, 4, 1), (1, 1023, 113, 3, 3)]
SHAPE_IDS = ["x".join(map(str, s)) for s in SHAPES]

# (head_dim, config change) of the fa3-fp8 variants (scripts/fa3_fp8_speed_ab.py SPEED_VARIANTS, the same names)
# fa3_fp8.NO_LOOKAHEAD: the head_dim 256 default's serial steps, for switches its lookahead refuses
NO_LOOKAHEAD = dict(s_lookahead=False, s_halves=False, fused_promote=False, bounded_units=False)
# scripts/fa3_fp8_speed_ab.py PRE64: the head_dim 64 default before session 6 (192 x 128, overlap, one chain), the
# base of the 64 variants named before the tn192s_c4 flip
PRE64 = dict(tile_n=128, intra_wg_overlap=True, reduce_chains=1)
FP8_VARIANTS = {
    "d256-early": (256, dict(early_pv_arrive=True, **NO_LOOKAHEAD)),
    "d256-skip": (256, dict(skip_unit_rescale=True)),
    "d256-early_skip": (256, dict(early_pv_arrive=True, skip_unit_rescale=True, **NO_LOOKAHEAD)),
    "d256-single_early": (256, dict(two_level=False, pv_split=1, pv_buffers=1, early_pv_arrive=True, **NO_LOOKAHEAD)),
    "d128-early": (128, dict(early_pv_arrive=True)),
    "d128-skip": (128, dict(skip_unit_rescale=True)),
    "d128-early_skip": (128, dict(early_pv_arrive=True, skip_unit_rescale=True)),
    "d64-skip": (64, dict(skip_unit_rescale=True)),
    "d64-promote4": (64, dict(promote_every=4)),
    # scripts/fa3_fp8_speed_ab.py FLIP_VARIANTS: the defaults before skip_unit_rescale and (64) promote_every 4, and
    # descale_prefetch; the single accumulator with intra-warpgroup overlap at 256
    "d64-old": (64, dict(promote_every=1, skip_unit_rescale=False)),
    "d128-old": (128, dict(skip_unit_rescale=False)),
    "d256-old": (256, dict(skip_unit_rescale=False, **NO_LOOKAHEAD)),
    "d64-prefetch": (64, dict(descale_prefetch=True)),
    "d128-prefetch": (128, dict(descale_prefetch=True)),
    "d256-prefetch": (256, dict(descale_prefetch=True, **NO_LOOKAHEAD)),
    "d256-single_overlap": (256, dict(two_level=False, pv_split=1, pv_buffers=1, intra_wg_overlap=True, **NO_LOOKAHEAD)),
}

# session 6, head_dim 64 / 128 (scripts/fa3_fp8_speed_ab.py FP8SMALL_VARIANTS, "fp8small-d<D>-<name>"): the softmax's row
# max and row sum in four chains, with descale_prefetch, skip_unit_rescale, 192 x 192 serial tiles (64),
# 192 x 128 serial tiles with three consumer warpgroups (128), and the single accumulator
FP8SMALL_VARIANTS = {
    "fp8small-d64-pre": (64, dict(PRE64)),
    "fp8small-d64-c4": (64, dict(PRE64, reduce_chains=4)),
    "fp8small-d64-c4_pf": (64, dict(PRE64, reduce_chains=4, descale_prefetch=True)),
    "fp8small-d64-tn192s_c4": (64, dict(tile_n=192, intra_wg_overlap=False, reduce_chains=4)),
    "fp8small-d64-single_c4_pf": (64, dict(PRE64, two_level=False, reduce_chains=4, descale_prefetch=True)),
    "fp8small-d128-c4": (128, dict(reduce_chains=4)),
    "fp8small-d128-m192_c4": (128, dict(tile_m=192, tile_n=128, reduce_chains=4)),
    "fp8small-d128-m192_c4_skip": (128, dict(tile_m=192, tile_n=128, reduce_chains=4, skip_unit_rescale=True)),
    "fp8small-d128-m192_c4_early": (128, dict(tile_m=192, tile_n=128, reduce_chains=4, early_pv_arrive=True)),
    "fp8small-d128-c4_s2": (128, dict(reduce_chains=4, pv_split=2, pv_buffers=2)),
    "fp8small-d128-single_c4": (128, dict(two_level=False, reduce_chains=4)),
    "fp8small-d128-single_m192_c4": (128, dict(two_level=False, tile_m=192, tile_n=128, reduce_chains=4)),
}

# session 7, head_dim 128 (scripts/fa3_fp8_speed_ab.py FP8MID_VARIANTS, "fp8mid-d<D>-<name>"): the head_dim 256 lookahead
# schedule (s_lookahead, S in the two P V temporaries) at 128
_LOOK = dict(s_lookahead=True, pv_buffers=2, pv_split=2, s_halves=True, reduce_chains=4)
FP8MID_VARIANTS = {
    "fp8mid-d128-look128h_c4": (128, dict(_LOOK, tile_n=128)),
    "fp8mid-d128-m192_look128h_c4": (128, dict(_LOOK, tile_m=192, tile_n=128)),
}

# session 7, head_dim 128 / 64 (scripts/fa3_fp8_speed_ab.py FP8D128_VARIANTS, "fp8d128-d<D>-<name>"): q_tail_first (causal:
# tiles 1.. moved back by the shift, tile 0 from row 0 computing the shift rows tile 1 owns, session 8; SHAPES' seqlen_q
# 1023 gives a 128-row shift at tile_m 192, TAIL_SHAPES two and three tiles whose shared rows see keys),
# skip_unit_rescale, 128 x 256 and 192 x 128 (with q_tail_first) tiles at 64
_M192_LOOK = dict(_LOOK, tile_m=192, tile_n=128)
FP8D128_VARIANTS = {
    "fp8d128-d128-m192_look128h_c4_tail": (128, dict(_M192_LOOK, q_tail_first=True)),
    "fp8d128-d128-m192_look128h_c4_tail_skip": (128, dict(_M192_LOOK, q_tail_first=True, skip_unit_rescale=True)),
    "fp8d128-d64-m128_tn256": (64, dict(tile_m=128, tile_n=256)),
    "fp8d128-d64-tn128_tail": (64, dict(tile_n=128, q_tail_first=True)),
}

# session 8, head_dim 256 (scripts/fa3_fp8_speed_ab.py FP8TWO_VARIANTS, "fp8two-d256-<name>"): fused_promote (O in units
# of the tile's v_descale, O *= alpha folded into the promotion) with one chain (the default since session 9 has it with
# the row max / row sum in two chains), and the default before session 9 (no fused_promote)
FP8TWO_VARIANTS = {
    "fp8two-d256-fused": (256, dict(reduce_chains=1)),
    "fp8two-d256-old": (256, dict(fused_promote=False, bounded_units=False, reduce_chains=1)),
}

# session 11, head_dim 256 (scripts/fa3_fp8_speed_ab.py FP8TURN_VARIANTS, "fp8turn-d256-<name>", --set fp8turn):
# the single accumulator with intra-warpgroup overlap and one chain, skip_unit_rescale off (O *= alpha on every tile)
FP8TURN_VARIANTS = {
    "fp8turn-d256-single_overlap_noskip": (256, dict(two_level=False, pv_split=1, pv_buffers=1, intra_wg_overlap=True,
                                                     reduce_chains=1, skip_unit_rescale=False, **NO_LOOKAHEAD)),
}

# session 12, head_dim 256 ("twolvl3-d256-<name>"): the K / V descriptors built once before the loop, not in the
# ping-pong turn (hoisted_descriptors: the same speed in session 13, off; fa3-fp8 still accepts it)
TWOLVL3_VARIANTS = {
    "twolvl3-d256-hd": (256, dict(hoisted_descriptors=True)),
}

# session 27, head_dim 64 / 128 (scripts/fa3_fp8_speed_ab.py FP8GUARD_VARIANTS, "fp8guard-d<D>-guard", --set
# fp8guard): the huge-logit check only where |m| can reach 2^11 (Fp8Config.huge_guard; its huge-logit case:
# test_fa3_fp8_gpu.test_huge_logits)
HUGE_GUARD_VARIANTS = {
    "fp8guard-d64-guard": (64, dict(huge_guard=True)),
    "fp8guard-d128-guard": (128, dict(huge_guard=True, huge_hoisted=False)),  # (128's default hoists since session 29)
}

# session 29, head_dim 64 / 128 / 256 (scripts/fa3_fp8_speed_ab.py FP8HOIST_VARIANTS, "fp8hoist-d<D>-hoist", --set
# fp8hoist): the huge-logit check decided once per warpgroup before its free K/V tiles (Fp8Config.huge_hoisted; its
# huge-logit case: test_fa3_fp8_gpu.test_huge_logits "hoisted", both loops in one call: test_hoisted_mixed_paths)
HUGE_HOISTED_VARIANTS = {f"fp8hoist-d{d}-hoist": (d, dict(huge_hoisted=True, huge_guard=False)) for d in (64, 128, 256)}

_ALL_TABLES = (FP8_VARIANTS, FP8SMALL_VARIANTS, FP8MID_VARIANTS, FP8D128_VARIANTS, FP8TWO_VARIANTS, FP8TURN_VARIANTS,
               TWOLVL3_VARIANTS, HUGE_GUARD_VARIANTS, HUGE_HOISTED_VARIANTS)


def _inputs(shape, head_dim, seed):
    B, Nq, Nk, H, Hkv = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(B, n, h, head_dim, device="cuda", generator=g).to(torch.bfloat16)
            for n, h in ((Nq, H), (Nk, Hkv), (Nk, Hkv)))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("variant", [name for table in _ALL_TABLES for name in table])
def test_fp8_variant_vs_emulation(fp8_kernel, variant, shape, causal, rng_seed, nan_allocations):
    _check_variant(fp8_kernel, variant, shape, causal, rng_seed, nan_allocations)


# q_tail_first (session 8): seqlen_q 300 / 449 at tile_m 192 give 2 / 3 query tiles and a 64-row shift, so tile 0
# computes rows 128-191 that tile 1 owns (its LSE), and both store their O; seqlen_k >= seqlen_q, so those rows see keys
# (SHAPES' 1023 x 113 shares rows that see none); GQA 4:1 and batch 2 (a stray O row would land in the other batch)
TAIL_SHAPES = [(1, 300, 500, 2, 2), (2, 449, 449, 4, 1)]


@pytest.mark.parametrize("shape", TAIL_SHAPES, ids=["x".join(map(str, s)) for s in TAIL_SHAPES])
@pytest.mark.parametrize("variant", [n for n, (_, c) in FP8D128_VARIANTS.items() if c.get("q_tail_first")])
def test_fp8_tail_first_shared_rows(fp8_kernel, variant, shape, rng_seed, nan_allocations):
    _check_variant(fp8_kernel, variant, shape, True, rng_seed, nan_allocations)


def _check_variant(fp8_kernel, variant, shape, causal, seed, nan_allocations):
    """The variant's kernel against the emulation on the same quantised inputs and both against float64."""
    from fa_variants import fp8
    from fa_variants.fp8.quantize import quantize_fp8_torch
    from fa_variants.reference import attention_reference

    D, change = {name: entry for table in _ALL_TABLES for name, entry in table.items()}[variant]
    cfg = dataclasses.replace(fp8_kernel.DEFAULT_CONFIGS[D], **change)
    q, k, v = _inputs(shape, D, seed)
    # the emulation's accumulation (two_level, interval) comes from the recipe; a variant with another tile_n gets
    # K/V scale blocks of its tile_n (the PyTorch recipe), which the emulation walks as its K/V tiles
    recipe = fp8.FP8Config(two_level=cfg.two_level, promote_every=cfg.promote_every)
    if cfg.tile_n == fp8.layout.tile_n(D):
        inp = fp8.quantize_fp8(q, k, v, config=recipe)
    else:
        inp = quantize_fp8_torch(q, k, v, config=recipe, block_n=cfg.tile_n)
    with nan_allocations():  # an output element the kernel does not write stays NaN
        out, lse = fp8_kernel.run_fp8(inp, causal=causal, out_dtype=torch.bfloat16, config=cfg)
    emu32, emu_lse = fp8.emulate_fp8_attention(inp, causal=causal, tile_m=cfg.tile_m)
    exact, _ = attention_reference(q, k, v, causal=causal, dtype=torch.float64)
    assert_fp8_matches_emulation(out, lse, emu32, emu_lse, exact, config=cfg, variant=variant, seed=seed)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 300, 1000, 4, 2)], ids=["1x300x1000x4x2"])  # (the id scripts' --drop-failed reads)
@pytest.mark.parametrize("variant", ["fp8two-d256-fused"])  # (reduce_chains does not touch the units)
def test_fp8two_v_scales_spread(fp8_kernel, variant, shape, causal, rng_seed, nan_allocations):
    """fused_promote keeps O in units of the tile's v_descale (O / v_descale[n], the unit changed by v_descale[n + 1] /
    v_descale[n] every tile): V blocks whose magnitudes span 2^-8 .. 2^8, one all-zero block (descale 1 since session
    9) and one of tiny values ~2^-120 (descale 2^-110, the quantiser's floor: O / v_descale ~ 2^110 |O|, finite here as
    |O| l < 2^18) against the emulation and float64. Nk 1000: eight 128-key tiles, the last partial, every row visits
    the zero and the tiny tile (causal: rows see 701..1000 keys)."""
    D, change = FP8TWO_VARIANTS[variant]
    cfg = dataclasses.replace(fp8_kernel.DEFAULT_CONFIGS[D], **change)
    # per 128-key tile; tile 2: tiny values, tile 5: all zeros
    _check_v_scales_spread(fp8_kernel, nan_allocations, variant, D, cfg, shape, causal, rng_seed,
                           [-8, 8, -120, -3, 5, 0, 2, -6], zero=5, tiny=2)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 300, 1000, 4, 2)], ids=["1x300x1000x4x2"])
@pytest.mark.parametrize("variant", list(TWOLVL3_VARIANTS))
def test_twolvl3_v_scales_spread(fp8_kernel, variant, shape, causal, rng_seed, nan_allocations):
    """hoisted_descriptors on the head_dim 256 default (bounded_units on): V blocks spanning 2^-8 .. 2^8, an all-zero
    block and a tiny one (descale 2^-110, over 2^64 below the largest: the turn's rare copy, whose GEMMs read the
    hoisted descriptors too) against the emulation and float64."""
    D, change = TWOLVL3_VARIANTS[variant]
    cfg = dataclasses.replace(fp8_kernel.DEFAULT_CONFIGS[D], **change)
    _check_v_scales_spread(fp8_kernel, nan_allocations, variant, D, cfg, shape, causal, rng_seed,
                           [-8, 8, -120, -3, 5, 0, 2, -6], zero=5, tiny=2)


def _check_v_scales_spread(fp8_kernel, nan_allocations, variant, D, cfg, shape, causal, seed, exponents, zero, tiny):
    """V scaled by 2^exponents[t] per K/V tile t of cfg.tile_n keys, tile ``zero`` all zeros and tile ``tiny`` of
    values ~2^-120, quantised by ``fp8.quantize_fp8``: the zero block's descale is 1 (session 9; 2^-110 before), the
    tiny block's the floor 2^-110, and the kernel (NaN-poisoned outputs) matches the emulation and float64."""
    from fa_variants import fp8
    from fa_variants.reference import attention_reference

    bn, nk = cfg.tile_n, shape[2]
    q, k, v = _inputs(shape, D, seed)
    scale = torch.tensor(exponents[:-(-nk // bn)], device="cuda").repeat_interleave(bn)[:nk].float()
    v = (v.float() * torch.exp2(scale).view(1, -1, 1, 1)).to(torch.bfloat16)
    v[:, zero * bn:(zero + 1) * bn] = 0
    inp = fp8.quantize_fp8(q, k, v)
    assert (inp.v_descale[..., zero] == 1).all()
    assert (inp.v_descale[..., tiny] == 2.0**-110).all()
    with nan_allocations():
        out, lse = fp8_kernel.run_fp8(inp, causal=causal, out_dtype=torch.bfloat16, config=cfg)
    emu32, emu_lse = fp8.emulate_fp8_attention(inp, causal=causal, tile_m=cfg.tile_m)
    exact, _ = attention_reference(q, k, v, causal=causal, dtype=torch.float64)
    assert_fp8_matches_emulation(out, lse, emu32, emu_lse, exact, config=cfg, variant=variant, seed=seed)


@pytest.mark.parametrize("head_dim, change", [(128, dict(intra_wg_overlap=False, early_pv_arrive=True))],
                         ids=["d128-serial-early"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bf16_fa3_switches(head_dim, change, causal, nan_allocations):
    """The shared piece in the bf16 fa3 kernel: early_pv_arrive (fa3_kernel)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm90 GPU")
    from fa_variants.hopper import fa3

    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[head_dim], **change)
    for shape in SHAPES:
        q, k, v = make_qkv(*shape, head_dim, dtype=torch.bfloat16, device="cuda")
        scale = 1.0 / math.sqrt(head_dim)
        with nan_allocations():
            out, lse = fa3.run(q, k, v, causal=causal, softmax_scale=scale, config=config)
        assert_attention_ok(out, lse, q, k, v, causal, scale, what=f"{change} causal={causal} {shape}")
