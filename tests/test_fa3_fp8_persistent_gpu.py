"""fa3-fp8 on fa3's persistent grid (session 22, sm90 GPU): ``persistent=True`` (one CTA per SM walks query tiles
b, b + G, ... with its pipeline states carried from tile to tile) and ``balanced=True`` (the tiles dealt by load from
the host's table, ``hopper.fa3.balanced_table`` with fa3-fp8's L2 section of e4m3 K/V).

Each tile runs the same code as on the default grid (one CTA per tile), so O and LSE must equal the default kernel's
bit for bit on the same quantised inputs; they are also checked against the emulation and float64 (the bounds of
tests/test_fa3_fp8_gpu.py), with NaN-poisoned outputs. Shapes: more work tiles than SMs (so CTAs walk several tiles:
the carried K/V/Q phases, O's own buffer at head_dim 64 / 128, Q's buffer reused for O at 256), GQA, Nq != Nk with
rows that see no key under causal masking, odd lengths; and fewer tiles than SMs (the grid clamped to the tiles).
Plus ``call_config``'s default: the persistent grid for short calls at 64 / 128 (balanced when causal), same results.

    source .gpu/env.sh && python3 -m pytest -m gpu tests/test_fa3_fp8_persistent_gpu.py -q
"""
import dataclasses

import pytest
import torch

from helpers import assert_fp8_matches_emulation

pytestmark = pytest.mark.gpu

# (batch, seqlen_q, seqlen_k, num_heads, num_heads_kv): 2 x 8 x 24 = 384 tiles of 128 rows (D 128 / 256; 288 of 192
# at D 64); 6 x 40 = 240 tiles, Nq < Nk (causal: bottom-right); Nq > Nk: causal rows 0..886 see no key; 1 x 4 tiles
SHAPES = [(2, 1000, 1000, 24, 8), (1, 701, 1900, 40, 8), (3, 1023, 137, 16, 16), (1, 113, 300, 4, 2)]
SHAPE_IDS = ["x".join(map(str, s)) for s in SHAPES]
VARIANTS = {"persist": dict(persistent=True), "balanced": dict(persistent=True, balanced=True)}


def _inputs(fp8, shape, head_dim, seed):
    B, Nq, Nk, H, Hkv = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, n, h, head_dim, device="cuda", generator=g).to(torch.bfloat16)
               for n, h in ((Nq, H), (Nk, Hkv), (Nk, Hkv)))
    return q, k, v, fp8.quantize_fp8(q, k, v)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_persistent_grid_equals_default(fp8_kernel, variant, head_dim, shape, causal, rng_seed, nan_allocations):
    from fa_variants import fp8
    from fa_variants.reference import attention_reference

    q, k, v, inp = _inputs(fp8, shape, head_dim, rng_seed)
    base = fp8_kernel.DEFAULT_CONFIGS[head_dim]
    cfg = dataclasses.replace(base, **VARIANTS[variant])
    with nan_allocations():  # an output element the kernel does not write stays NaN
        ref_out, ref_lse = fp8_kernel.run_fp8(inp, causal=causal, config=base)
        out, lse = fp8_kernel.run_fp8(inp, causal=causal, config=cfg)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse), (
        f"{variant} differs from the default grid: max |dO| {(out.float() - ref_out.float()).abs().max().item():.3g}")
    emu32, emu_lse = fp8.emulate_fp8_attention(inp, causal=causal, tile_m=cfg.tile_m)
    exact, _ = attention_reference(q, k, v, causal=causal, dtype=torch.float64)
    assert_fp8_matches_emulation(out, lse, emu32, emu_lse, exact, config=cfg, variant=variant, seed=rng_seed)


# head_dim 256's serial steps (fa3_fp8.NO_LOOKAHEAD): its lookahead loop spills on the persistent grid, these do not
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES[:2], ids=SHAPE_IDS[:2])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_serial_steps_on_the_persistent_grid_at_256(fp8_kernel, variant, shape, causal, rng_seed, nan_allocations):
    from fa_variants import fp8

    _, _, _, inp = _inputs(fp8, shape, 256, rng_seed)
    base = dataclasses.replace(fp8_kernel.DEFAULT_CONFIGS[256], **fp8_kernel.NO_LOOKAHEAD)
    with nan_allocations():
        ref_out, ref_lse = fp8_kernel.run_fp8(inp, causal=causal, config=base)
        out, lse = fp8_kernel.run_fp8(inp, causal=causal, config=dataclasses.replace(base, **VARIANTS[variant]))
    assert torch.isfinite(out).all() and torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fp16_output_and_negative_scale_on_the_persistent_grid(fp8_kernel, variant, rng_seed, nan_allocations):
    """fp16 O (another compiled kernel: out_dtype) and a negative softmax_scale (K's e4m3 sign flipped on the host)
    on the persistent grids at head_dim 128, causal, CTAs walking several tiles: the default grid's bits."""
    from fa_variants import fp8

    B, Nq, Nk, H, Hkv = SHAPES[1]
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    q, k, v = (torch.randn(B, n, h, 128, device="cuda", generator=g).to(torch.float16)
               for n, h in ((Nq, H), (Nk, Hkv), (Nk, Hkv)))
    inp = fp8.quantize_fp8(q, k, v, softmax_scale=-0.05)
    base = fp8_kernel.DEFAULT_CONFIGS[128]
    cfg = dataclasses.replace(base, **VARIANTS[variant])
    with nan_allocations():
        ref_out, ref_lse = fp8_kernel.run_fp8(inp, causal=True, out_dtype=torch.float16, config=base)
        out, lse = fp8_kernel.run_fp8(inp, causal=True, out_dtype=torch.float16, config=cfg)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_default_takes_the_persistent_grid(fp8_kernel, head_dim, causal, rng_seed, nan_allocations):
    """A short call without config= (2 x 1000 tokens, 24 heads: more tiles than SMs, seqlen_k within both tables) runs
    the persistent grid (``call_config``: balanced when causal) and gives the default grid's bits."""
    from fa_variants import fp8

    _, _, _, inp = _inputs(fp8, SHAPES[0], head_dim, rng_seed)
    picked = fp8_kernel.call_config(inp.q, inp.k, causal)
    assert picked.persistent and picked.balanced == causal, picked
    with nan_allocations():
        out, lse = fp8_kernel.run_fp8(inp, causal=causal)
        ref_out, ref_lse = fp8_kernel.run_fp8(inp, causal=causal, config=fp8_kernel.DEFAULT_CONFIGS[head_dim])
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
