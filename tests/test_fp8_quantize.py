"""The FP8 recipe in torch (fa_variants.fp8.quantize): rotation, scales, e4m3, the kernel's V layout, the API's
validation. docs/edge_cases.md EC-23 (c): the rotation is orthonormal and keeps Q K^T for every head_dim we serve.
"""
import dataclasses
import math

import pytest
import torch

from fa_variants.fp8 import layout
from fa_variants.fp8.quantize import (E4M3_MAX, MIN_DESCALE, ZERO_BLOCK_DESCALE, FP8Config, FP8Inputs,
                                      HadamardRotation, descale_from_amax, fwht, hadamard_blocks, k_mean, k_sample_count,
                                      k_sample_tiles, paley_hadamard_12,
                                      quantize_fp8, quantize_fp8_torch, tiles_for, transpose_v)

HEAD_DIMS = (32, 40, 64, 80, 96, 128, 192, 256)  # all the project serves, plus EC-23b's


def sylvester(n):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), h)
    return h / math.sqrt(n)


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape) * scale).to(dtype)


# ------------------------------------------------------------------------------------------- rotation


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_fwht_is_the_normalised_hadamard(n):
    x = torch.randn(3, 5, n, dtype=torch.float64)
    torch.testing.assert_close(fwht(x), x @ sylvester(n), atol=1e-12, rtol=0)
    torch.testing.assert_close(fwht(fwht(x)), x, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="power-of-two"):
        fwht(torch.zeros(2, 12))


def test_paley_h12():
    h = paley_hadamard_12()
    assert set(h.unique().tolist()) == {-1.0, 1.0}
    assert torch.equal(h @ h.T, 12 * torch.eye(12))


def test_hadamard_blocks():
    assert hadamard_blocks(128) == (128,) and hadamard_blocks(96) == (96,)  # 96: H12 x H8, one block
    assert hadamard_blocks(40) == (32, 8) and hadamard_blocks(192) == (128, 64) and hadamard_blocks(80) == (64, 16)
    with pytest.raises(ValueError, match="head_dim"):
        hadamard_blocks(0)


@pytest.mark.parametrize("D", HEAD_DIMS)
def test_rotation_orthonormal_and_keeps_scores(D):
    """EC-23c: ||R R^T - I||_inf < 1e-5 in fp32; (QR)(KR)^T = QK^T within 1e-4 relative; every channel mixed."""
    rot = HadamardRotation(D, seed=3)
    R = rot.matrix(torch.float32)
    assert (R @ R.T - torch.eye(D)).abs().max().item() < 1e-5
    assert (R.abs() < 0.9).all()
    if D in (64, 96, 128, 256):  # one Hadamard of order D: every entry is +-1/sqrt(D)
        torch.testing.assert_close(R.abs(), torch.full((D, D), 1 / math.sqrt(D)), rtol=1e-6, atol=0)
    q, k = torch.randn(2, 33, 4, D), torch.randn(2, 47, 4, D)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k)
    s_rot = torch.einsum("bqhd,bkhd->bhqk", rot(q), rot(k))
    assert ((s_rot - s).norm() / s.norm()).item() < 1e-4
    assert ((s_rot - s).abs().max() / s.abs().max()).item() < 1e-4
    torch.testing.assert_close(rot(q), q @ R, atol=1e-5, rtol=1e-5)
    assert not torch.equal(HadamardRotation(D, seed=4).signs, rot.signs)


@pytest.mark.parametrize("D", (64, 80, 96, 128, 256))
def test_rotation_of_huge_rows_is_finite_and_ordinary_rows_unchanged(D):
    """A float32 row whose max is near float32's top: the unnormalised Hadamard sums (up to block x max|x|)
    overflowed to inf, which became e4m3 NaN, although x @ R (at most sqrt(block) max|x|) is finite (a break-it
    pass, session 34). Such rows are now scaled by a power of two around the transform; the other rows keep the
    plain transform's bits (the GPU pass's)."""
    rot = HadamardRotation(D, seed=5)
    x = (torch.rand(4, 3, D, dtype=torch.float64) * 2 - 1) * 6e37
    x[0] = torch.randn(3, D, dtype=torch.float64)  # ordinary rows beside them
    y = rot(x.float())
    exact = x @ rot.matrix(torch.float64)
    assert y.dtype == torch.float32 and y.isfinite().all()
    assert ((y.double() - exact).abs().amax(dim=-1) <= 1e-6 * exact.abs().amax(dim=-1)).all()
    assert torch.equal(y[0], rot(x[0].float()))  # no huge row in the call: the plain transform
    assert torch.equal(y[0], rot._rotate(x[0].float() * rot.signs))


@pytest.mark.parametrize("D", (64, 96, 128, 256))
def test_overflow_shift_is_one_rule_on_every_device(D):
    """The shift k of a row is max(0, e - 126), e the binary exponent of max|x| x block (what the GPU pass computes
    from the float32 exponent bits), whatever else is in the call: on the CPU the free skip of the shift applied only
    below 2^127 / block, so a row in [2^126, 2^127) / block got k = 0 alone and k = 1 beside a larger row (session
    35's kernel review)."""
    rot = HadamardRotation(D, seed=2)
    block = max(rot.blocks)
    amax = torch.tensor([1.0, 2.0 ** 126 / block, 1.5 * 2.0 ** 126 / block, 2.0 ** 127 / block, 3e38]).double()
    want = (torch.frexp(amax * block)[1] - 126).clamp(min=0)
    assert want[:4].tolist() == [0, 1, 1, 2]  # from 2^126 / block on
    for i, m in enumerate(amax.tolist()):
        row = torch.full((1, D), m, dtype=torch.float32)
        alone = rot._overflow_shift(row)
        beside = rot._overflow_shift(torch.cat([row, torch.full((1, D), 3e38)]))
        got = 0 if alone is None else int(alone[0, 0])
        assert got == int(want[i]) == int(beside[0, 0]), (D, m, got, int(want[i]))


def test_huge_rows_quantise_and_attend_finite():
    """The same rows through the recipe and the emulation: finite O near the float64 attention (it was all NaN)."""
    import fa_variants
    from fa_variants.fp8.emulation import fp8_attention_reference

    q = (torch.rand(1, 2, 1, 64, dtype=torch.float64) * 2 - 1) * 6e37
    k = torch.randn(1, 4, 1, 64, dtype=torch.float64) * 1e-36
    v = torch.randn(1, 4, 1, 64, dtype=torch.float64)
    scale = 1e-4  # scores well below 1 (|q . k| ~ 1e2-1e3): a smooth softmax, which e4m3's error cannot flip
    inp = quantize_fp8_torch(q, k, v, softmax_scale=scale)
    assert inp.q_descale.isfinite().all() and not inp.q.float().isnan().any()
    out, lse = fp8_attention_reference(q, k, v, softmax_scale=scale, accumulator="truncate", accumulator_bits=None)
    ref = fa_variants.attention(q, k, v, softmax_scale=scale, backend="reference")
    assert out.isfinite().all() and lse.isfinite().all()  # NaN before
    assert (out.double() - ref).abs().max() < 0.2 * v.abs().max()  # worst of 1500 draws: 0.038


def test_lse_shift_in_range_where_a_float32_dot_product_overflowed():
    """softmax_scale x q . mean(K) with q . mean ~6e41 (beyond float32) and scale 1e-5: the shift is ~6e36, it was
    inf (and the LSE +inf for a finite LSE; a break-it pass, session 34)."""
    q = torch.full((1, 2, 1, 64), 1e20, dtype=torch.float64)
    k = 1e20 + torch.randn(1, 4, 1, 64, dtype=torch.float64) * 1e19
    v = torch.randn(1, 4, 1, 64, dtype=torch.float64)
    inp = quantize_fp8_torch(q, k, v, softmax_scale=1e-5)
    expect = 1e-5 * torch.einsum("bqhd,bhd->bhq", q, k.mean(dim=1))
    assert inp.lse_shift.isfinite().all()
    torch.testing.assert_close(inp.lse_shift.double(), expect, rtol=1e-6, atol=0)


# --------------------------------------------------------------------------------------------- scales


def test_descale_from_amax_is_the_smallest_power_of_two():
    amax = torch.tensor([448.0, 449.0, 1.0, 3.0, 0.1, 1e30, 896.0, 500.0, 2.0**-100, 2.0**-103])
    descale, inv = descale_from_amax(amax)
    e = torch.log2(descale)
    assert torch.equal(e, e.round()) and torch.equal(descale * inv, torch.ones_like(amax))
    assert (amax / descale <= E4M3_MAX).all()
    above = amax > 2.0**-102  # below that the floor 2^-110 takes over (amax 0: descale 1)
    assert (amax[above] / (descale[above] / 2) > E4M3_MAX).all()  # half of it would saturate
    assert descale[-1].item() == MIN_DESCALE and descale[0].item() == 1.0


@pytest.mark.parametrize("amax", [1e-44, 1e-40, float(torch.finfo(torch.float32).tiny), 1e-35,
                                  E4M3_MAX * MIN_DESCALE])
def test_descale_floor_for_subnormal_tiny(amax):
    """Was NaN for 1e-44 (amax / 448 underflowed): now a finite normal power of two >= 2^-110 (the floor for every
    nonzero amax <= 448 x 2^-110)."""
    descale, inv = descale_from_amax(torch.tensor([amax]))
    assert descale.item() == MIN_DESCALE and inv.item() == 1 / MIN_DESCALE
    assert math.isfinite(inv.item())


@pytest.mark.parametrize("amax", [0.0, -0.0])
def test_descale_of_zero_block_is_one(amax):
    """An all-zero block gets descale 1 and inverse 1 (session 9; the floor 2^-110 before, which made the kernel's O /
    v_descale overflow on zero padding); the next power of two above the floor's range stays the floor's."""
    descale, inv = descale_from_amax(torch.tensor([amax, 2.0**-149, E4M3_MAX * MIN_DESCALE * 1.5]))
    assert descale[0].item() == ZERO_BLOCK_DESCALE == 1.0 and inv[0].item() == 1.0
    assert descale[1].item() == MIN_DESCALE and descale[2].item() == 2 * MIN_DESCALE


def test_zero_blocks_get_descale_one_per_granularity(rng_seed):
    """Q, K and V blocks of zeros get descale 1 in the torch recipe, block by block, and a head (or the tensor) of
    zeros under the "head" / "tensor" baselines; their e4m3 values are +-0; a tiny nonzero block keeps the floor."""
    g = torch.Generator().manual_seed(rng_seed)
    tn = tiles_for(64)[1]
    x = torch.randn(1, 3 * tn, 2, 64, generator=g).to(torch.bfloat16)
    x[:, :tn] = 0  # block 0 of every head
    x[:, tn:2 * tn, 1] = 0
    x[:, tn + 5, 1, 3] = 2.0**-120  # block 1 of head 1: one tiny value
    for rotate in (False, True):
        inp = quantize_fp8_torch(x, x, x, config=FP8Config(rotate=rotate, smooth_k=False))
        for name in ("q_descale", "k_descale", "v_descale"):
            d = getattr(inp, name)
            assert (d[0, :, 0] == 1.0).all(), name
        assert (inp.v_descale[0, 1, 1] == MIN_DESCALE).item()
        assert (inp.v_t.float()[0, 0, :, :tn] == 0).all() and (inp.q.float()[0, :tn] == 0).all()  # +-0
    z = x.clone()
    z[:, :, 0] = 0
    for gran in ("head", "tensor"):
        inp = quantize_fp8_torch(z, z, z, config=FP8Config(granularity=gran, rotate=False, smooth_k=False))
        if gran == "head":
            assert (inp.v_descale[0, 0] == 1.0).all() and (inp.v_descale[0, 1] < 1).all()
        else:
            assert (inp.v_descale[0, 1] < 1).all()
    zero = torch.zeros_like(x)
    inp = quantize_fp8_torch(zero, zero, zero, config=FP8Config(granularity="tensor"))
    for name in ("q_descale", "k_descale", "v_descale"):
        assert (getattr(inp, name) == 1.0).all(), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fill", [0.0, "subnormal", 1e-30])
def test_zero_subnormal_tiny_blocks_quantise_finite(dtype, fill):
    """Blocks of zeros, of the dtype's subnormals, of tiny values, next to normal blocks, every granularity:
    no NaN or inf anywhere, every descale finite and > 0, the normal blocks intact."""
    q, k, v = (randn(1, 160, 2, 64, dtype=dtype) for _ in range(3))
    value = torch.finfo(dtype).tiny / 4 if fill == "subnormal" else fill
    for t in (q, k, v):
        t[:, :128, 1] = value  # one whole block (head 1, first tile) of Q, K and V
    for gran in ("block", "head", "tensor"):
        inp = quantize_fp8_torch(q, k, v, config=FP8Config(granularity=gran))
        for name in ("q_descale", "k_descale", "v_descale"):
            d = getattr(inp, name)
            assert torch.isfinite(d).all() and (d > 0).all(), (name, gran)
        for t in (inp.q, inp.k, inp.v_t):
            assert torch.isfinite(t.float()).all()
        qd, _, vd = inp.dequantize()
        assert torch.isfinite(qd).all() and torch.isfinite(vd).all()
        rel = (vd[:, 128:] - v[:, 128:].float()).norm() / v[:, 128:].float().norm()
        assert rel < 0.05  # the normal part quantised as usual


def _block_amax(x, block):
    B, N, H, D = x.shape
    T = -(-N // block)
    return torch.stack([x[:, t * block:(t + 1) * block].abs().amax(dim=(1, 3)) for t in range(T)], dim=-1)


@pytest.mark.parametrize("gran", ["block", "head", "tensor"])
def test_scales_per_granularity(gran):
    """Shapes (B, heads, tiles) for every granularity; values: the power-of-two descale of the block's /
    head's / tensor's amax of what was quantised; no element saturates beyond its own scale."""
    B, Nq, Nk, H, Hkv, D = 2, 300, 260, 4, 2, 64
    q = torch.randn(B, Nq, H, D) * torch.logspace(-2, 2, Nq).view(1, Nq, 1, 1) * torch.logspace(0, 3, H).view(1, 1, H, 1)
    k, v = torch.randn(B, Nk, Hkv, D) * 3, torch.randn(B, Nk, Hkv, D)
    inp = quantize_fp8_torch(q, k, v, config=FP8Config(granularity=gran, rotate=False, smooth_k=False))
    tm, tn = layout.TILE_M, layout.tile_n(D)
    assert inp.q_descale.shape == (B, H, 3) and inp.k_descale.shape == inp.v_descale.shape == (B, Hkv, -(-Nk // tn))
    for x, d, blk in ((q, inp.q_descale, tm), (k, inp.k_descale, tn), (v, inp.v_descale, tn)):
        amax = _block_amax(x, blk)
        if gran == "head":
            amax = amax.amax(dim=-1, keepdim=True).expand_as(amax)
        elif gran == "tensor":
            amax = amax.amax().expand_as(amax)
        torch.testing.assert_close(d, descale_from_amax(amax)[0], rtol=0, atol=0)
    d = inp.q_descale
    same_along_tiles, all_same = bool((d == d[..., :1]).all()), bool((d == d.flatten()[0]).all())
    assert (same_along_tiles, all_same) == {"block": (False, False), "head": (True, False), "tensor": (True, True)}[gran]
    qd, kd, vd = inp.dequantize()
    per_row = inp.q_descale.repeat_interleave(tm, dim=2)[:, :, :Nq].transpose(1, 2).unsqueeze(-1)
    # e4m3: half-ulp 2^-4 relative in the normal range; absolute steps of 2^-9 * descale below 2^-6 * descale
    assert ((qd - q).abs() <= torch.maximum(q.abs() * 2**-4, per_row * 2**-10) * (1 + 1e-6)).all()
    if gran == "block":
        assert inp.q.float().abs().amax().item() > E4M3_MAX / 2  # the largest element lands in (224, 448]


def test_block_heights_recorded():
    """FP8Inputs records the block heights it was quantised with (the kernel's tiles: 256 keys per K/V descale
    at head_dim 128, 192 at 64), dequantize uses them, and descales that do not match them are refused."""
    for D, tn in ((64, 192), (128, 256)):
        q, k, v = torch.randn(1, 200, 2, D), torch.randn(1, 300, 2, D), torch.randn(1, 300, 2, D)
        inp = quantize_fp8_torch(q, k, v, config=FP8Config(rotate=False, smooth_k=False))
        assert (inp.block_m, inp.block_n) == (layout.TILE_M, tn) == tiles_for(D)
        assert inp.k_descale.shape == inp.v_descale.shape == (1, 2, -(-300 // tn)) and inp.q_descale.shape == (1, 2, 2)
        _, kd, vd = inp.dequantize()
        for back, d, x in ((kd, inp.k_descale, k), (vd, inp.v_descale, v)):
            step = d.repeat_interleave(tn, dim=2)[:, :, :300].transpose(1, 2).unsqueeze(-1)  # each key's descale
            assert ((back - x).abs() <= torch.maximum(x.abs() * 2**-4, step * 2**-10) * (1 + 1e-6)).all()
    with pytest.raises(ValueError, match="FP8Inputs.k_descale has 3 blocks, but block_n=256 gives 2"):
        dataclasses.replace(inp, k_descale=torch.ones(1, 2, 3), v_descale=torch.ones(1, 2, 3))
    with pytest.raises(ValueError, match="FP8Inputs.block_n must be a positive int"):
        dataclasses.replace(inp, block_n=0)
    assert dataclasses.replace(inp, k_descale=torch.ones(1, 2, 3), v_descale=torch.ones(1, 2, 3), block_n=128).block_n == 128


def test_saturation_not_nan():
    """An e4m3 cast of a value beyond 448 is NaN in torch: the quantiser clamps (satfinite)."""
    from fa_variants.fp8.quantize import _to_e4m3

    x = torch.tensor([1000.0, -1e9, 300.0]).view(1, 3, 1, 1)
    out = _to_e4m3(x, torch.ones(1, 1, 1), 128).float().flatten()
    assert out.tolist() == [448.0, -448.0, 288.0]


# ----------------------------------------------------------------------------------------- V layout


@pytest.mark.parametrize("Nk", [1, 16, 113, 129])
def test_v_layout(Nk):
    """v_t (B, Hkv, D, round_up(Nk, 16)): tokens contiguous, zero padding, permuted by v_token_order."""
    B, Hkv, D = 2, 3, 64
    v = torch.randn(B, Nk, Hkv, D)
    inp = quantize_fp8_torch(torch.randn(B, 5, Hkv, D), torch.randn(B, Nk, Hkv, D), v,
                             config=FP8Config(granularity="tensor"))
    n_pad = layout.padded_seqlen_k(Nk)
    assert inp.v_t.shape == (B, Hkv, D, n_pad) and inp.v_t.dtype == torch.float8_e4m3fn and inp.v_t.is_contiguous()
    order = layout.v_token_order(n_pad)
    v8 = (v / inp.v_descale[0, 0, 0]).clamp(-448, 448).to(torch.float8_e4m3fn).float()  # tensor scale
    natural = torch.zeros(B, Hkv, D, n_pad)
    natural[..., :Nk] = v8.permute(0, 2, 3, 1)
    assert torch.equal(inp.v_t.float(), natural[..., order])
    assert (inp.v_t.float()[..., torch.argsort(order)][..., Nk:] == 0).all()
    _, _, vd = inp.dequantize()
    assert torch.equal(vd, v8 * inp.v_descale[0, 0, 0])
    assert torch.equal(transpose_v(v8.to(torch.float8_e4m3fn)).float(), natural[..., order])


# ------------------------------------------------------------------------------------ smoothing, scale


def test_smoothing_mean_and_lse_shift():
    q, k, v = torch.randn(2, 100, 6, 64), torch.randn(2, 300, 2, 64) + 5, torch.randn(2, 300, 2, 64)
    inp = quantize_fp8_torch(q, k, v)
    torch.testing.assert_close(inp.k_mean, k.mean(dim=1))
    _, kd, _ = inp.dequantize()
    assert kd.mean(dim=1).abs().max() < 0.05  # smoothed (and rotated) K has ~zero mean
    # the shift: softmax_scale * q . mean(K) of the query's kv-head (GQA 3:1), from q before quantisation
    expect = torch.einsum("bqhd,bhd->bhq", q, k.mean(dim=1).repeat_interleave(3, dim=1)) / 8
    torch.testing.assert_close(inp.lse_shift, expect, atol=1e-4, rtol=1e-5)
    assert quantize_fp8_torch(q, k, v, config=FP8Config(smooth_k=False)).lse_shift is None


def test_sampled_k_mean():
    """smooth_k_blocks = m: K's mean over the tokens of m evenly spaced K tiles (floor(j T / m)); the exact mean
    when m >= T; the recipe subtracts that mean and shifts the LSE by it (O's invariance: tests/test_fp8_emulation)."""
    assert k_sample_tiles(1000, 128, 3) == [0, 2, 5] and k_sample_tiles(1000, 128, 8) == list(range(8))
    assert k_sample_tiles(1000, 128, None) == list(range(8)) and k_sample_tiles(0, 128, 4) == []
    assert k_sample_tiles(16384, 256, 8) == [0, 8, 16, 24, 32, 40, 48, 56]
    assert k_sample_count(1000, 128, 3) == 384 and k_sample_count(1000, 128, 99) == 1000
    q, k, v = torch.randn(2, 40, 4, 64), torch.randn(2, 1000, 2, 64) + 3, torch.randn(2, 1000, 2, 64)
    tokens = torch.cat([torch.arange(t * 128, t * 128 + 128) for t in (0, 2, 5)])
    want = k[:, tokens].double().mean(dim=1)
    for blocks, expect in ((3, want), (8, k.double().mean(dim=1)), (500, k.double().mean(dim=1))):
        got = k_mean(k, blocks, 128)
        assert got.dtype == torch.float32 and (got.double() - expect).abs().max() < 1e-5, blocks
        inp = quantize_fp8_torch(q, k, v, config=FP8Config(smooth_k_blocks=blocks), block_n=128)
        assert torch.equal(inp.k_mean, got)
        ref = quantize_fp8_torch(q, k, v, block_n=128, k_mean=got)  # the same recipe given that mean
        assert torch.equal(inp.k.view(torch.uint8), ref.k.view(torch.uint8)) and torch.equal(inp.lse_shift, ref.lse_shift)
    assert not torch.equal(k_mean(k, 3, 128), k_mean(k))


def test_given_k_mean():
    """k_mean= replaces the recipe's own mean (the GPU pass's v2 sums K in another order): the same mean gives
    the same inputs bit for bit, another mean changes K and the LSE shift (and is what FP8Inputs records,
    negated with a negative scale), a wrong shape or dtype is refused."""
    q, k, v = torch.randn(1, 50, 4, 64), torch.randn(1, 70, 2, 64) + 3, torch.randn(1, 70, 2, 64)
    ref = quantize_fp8_torch(q, k, v)
    same = quantize_fp8_torch(q, k, v, k_mean=k_mean(k))
    assert torch.equal(same.k.view(torch.uint8), ref.k.view(torch.uint8)) and torch.equal(same.lse_shift, ref.lse_shift)
    other = k_mean(k) + 0.25
    moved = quantize_fp8_torch(q, k, v, k_mean=other, softmax_scale=-0.125)
    assert torch.equal(moved.k_mean, -other)
    assert not torch.equal(moved.k.view(torch.uint8), ref.k.view(torch.uint8))
    torch.testing.assert_close(moved.lse_shift, torch.einsum("bqhd,bhd->bhq", q, -other.repeat_interleave(2, 1)) / 8)
    for bad in (other[:, :1], other.double(), other[..., :32]):
        with pytest.raises(ValueError, match="k_mean must be a float32 tensor of shape"):
            quantize_fp8_torch(q, k, v, k_mean=bad)


def test_negative_scale_folds_into_k():
    q, k, v = torch.randn(1, 20, 2, 64), torch.randn(1, 30, 2, 64), torch.randn(1, 30, 2, 64)
    pos = quantize_fp8_torch(q, -k, v, softmax_scale=0.3)
    neg = quantize_fp8_torch(q, k, v, softmax_scale=-0.3)
    assert neg.softmax_scale == 0.3
    assert torch.equal(pos.k.view(torch.uint8), neg.k.view(torch.uint8)) and torch.equal(pos.k_mean, neg.k_mean)


def test_quantize_does_not_modify_inputs_and_takes_strides():
    base = torch.randn(1, 40, 2, 2 * 64, dtype=torch.bfloat16)
    q, k, v = base[..., :64], base[..., 64:], torch.randn(1, 2, 40, 64, dtype=torch.bfloat16).transpose(1, 2)
    before = [t.clone() for t in (q, k, v)]
    a = quantize_fp8(q, k, v)
    b = quantize_fp8_torch(q.contiguous(), k.contiguous(), v.contiguous())
    assert all(torch.equal(x, y) for x, y in zip(before, (q, k, v)))
    for name in ("q", "k", "v_t"):
        assert torch.equal(getattr(a, name).view(torch.uint8), getattr(b, name).view(torch.uint8))


def test_empty_inputs():
    inp = quantize_fp8_torch(torch.randn(2, 0, 4, 64), torch.randn(2, 0, 2, 64), torch.randn(2, 0, 2, 64))
    assert inp.q.shape == (2, 0, 4, 64) and inp.v_t.shape == (2, 2, 64, 0) and inp.seqlen_k == 0
    assert inp.q_descale.shape == (2, 4, 0) and inp.k_descale.shape == (2, 2, 0)


# -------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(granularity="row"), ValueError, "FP8Config.granularity"),
    (dict(rotate=1), TypeError, "FP8Config.rotate"),
    (dict(smooth_k="yes"), TypeError, "FP8Config.smooth_k"),
    (dict(two_level=None), TypeError, "FP8Config.two_level"),
    (dict(promote_every=0), ValueError, "FP8Config.promote_every"),
    (dict(promote_every=2.0), TypeError, "FP8Config.promote_every must be an int or None"),
    (dict(seed=-1), ValueError, "FP8Config.seed"),
    (dict(seed=True), TypeError, "FP8Config.seed"),
    (dict(smooth_k_blocks=0), ValueError, "FP8Config.smooth_k_blocks"),
    (dict(smooth_k_blocks=True), TypeError, "FP8Config.smooth_k_blocks must be an int or None"),
])
def test_config_validation(kwargs, exc, match):
    with pytest.raises(exc, match=match) as err:
        FP8Config(**kwargs)
    assert "\n" not in str(err.value)


def test_config_defaults():
    c = FP8Config()
    assert (c.granularity, c.rotate, c.smooth_k, c.two_level, c.promote_every) == ("block", True, True, True, None)
    assert c.smooth_k_blocks is None  # K's exact mean over every token
    assert c.replace(seed=5).seed == 5
    # None: the kernel's default interval per head_dim (fa_variants.fp8.layout.KERNEL_PROMOTE_EVERY)
    assert [c.promote_interval(d) for d in (64, 96, 128, 256, 40)] == [1, 1, 1, 1, 1]
    assert FP8Config(promote_every=2).promote_interval(64) == 2 and FP8Config(promote_every=1).promote_interval(64) == 1


@pytest.mark.parametrize("args, exc, match", [
    ((torch.randn(1, 4, 2, 64), torch.randn(1, 4, 3, 64), torch.randn(1, 4, 3, 64)), ValueError, "num_heads_kv"),
    ((torch.randn(1, 4, 2, 64), torch.randn(1, 4, 2, 64), torch.randn(1, 5, 2, 64)), ValueError, "v has shape"),
    ((torch.randn(4, 2, 64), torch.randn(1, 4, 2, 64), torch.randn(1, 4, 2, 64)), ValueError, "q must be 4-D"),
    ((torch.randn(1, 4, 2, 64), torch.ones(1, 4, 2, 64, dtype=torch.int32), torch.randn(1, 4, 2, 64)),
     TypeError, "k has dtype"),
    ((torch.randn(1, 4, 2, 64), torch.randn(2, 4, 2, 64), torch.randn(2, 4, 2, 64)), ValueError, "batch"),
])
def test_quantize_validation(args, exc, match):
    with pytest.raises(exc, match=match):
        quantize_fp8(*args)


def test_quantize_validation_scale_impl_config():
    x = torch.randn(1, 4, 2, 64)
    with pytest.raises(ValueError, match="softmax_scale"):
        quantize_fp8(x, x, x, softmax_scale=math.nan)
    with pytest.raises(ValueError, match="impl"):
        quantize_fp8(x, x, x, impl="cuda")
    with pytest.raises(ValueError, match="impl='kernel'"):
        quantize_fp8(x, x, x, impl="kernel")  # CPU tensors: the GPU pass cannot run
    with pytest.raises(TypeError, match="config"):
        quantize_fp8(x, x, x, config={"granularity": "block"})
    assert isinstance(quantize_fp8(x, x, x), FP8Inputs)


def test_k_mean_empty():
    assert torch.equal(k_mean(torch.randn(2, 0, 3, 8)), torch.zeros(2, 3, 8))


def test_quantize_and_emulate_ignore_the_default_device(rng_seed):
    """Model code often builds under ``with torch.device("cuda")`` (or "meta"). The rotation's signs, the
    Paley matrix, the V token order and the sampled-mean indices were made on the default device: CPU inputs
    failed with "Cannot copy out of meta tensor" (and a CPU generator on a CUDA default device would fail too).
    They are made on the CPU and moved to the inputs' device."""
    from fa_variants.fp8 import emulate_fp8_attention

    g = torch.Generator().manual_seed(rng_seed)
    q, k, v = (torch.randn(1, 9, 2, d, generator=g) for d in (96, 96, 96))
    k = k[:, :, :1].repeat(1, 1, 1, 1)
    v = v[:, :, :1].contiguous()
    config = FP8Config(smooth_k_blocks=1)
    want = emulate_fp8_attention(quantize_fp8(q, k, v, config=config, impl="torch"))
    with torch.device("meta"):
        inputs = quantize_fp8(q, k, v, config=config, impl="torch")
        got = emulate_fp8_attention(inputs)
        no_rotation = quantize_fp8(q, k, v, config=config.replace(rotate=False), impl="torch")
    assert got[0].device.type == "cpu" and no_rotation.q.device.type == "cpu"
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_float64_past_float32_range_is_refused(name):
    """float64 inputs are rounded to float32 first: a finite 1e39 became inf, was stored as e4m3 NaN and turned O
    NaN without a word. Now one line naming the tensor; float64 inf / NaN keep the documented non-finite rule, and
    nothing of the caller's is modified."""
    t = {n: torch.randn(1, 9, 2, 64, dtype=torch.float64) for n in ("q", "k", "v")}
    t[name][0, 3, 1, 5] = -1e39
    before = {n: x.clone() for n, x in t.items()}
    with pytest.raises(ValueError, match=rf"^{name} has finite values beyond float32's range"):
        quantize_fp8(t["q"], t["k"], t["v"])
    assert all(torch.equal(t[n], before[n]) for n in t)
    t[name][0, 3, 1, 5] = math.inf  # not finite: accepted (the non-finite rule, README)
    quantize_fp8(t["q"], t["k"], t["v"])


def test_a_block_taller_than_the_sequence_allocates_nothing_extra():
    """quantize_fp8_torch(block_n=2**40) padded K to 2^40 rows (the allocator's RuntimeError, session 27): a block
    at least as tall as the sequence is one block, the same descales as any other such height; the emulation's tile_m
    likewise."""
    from fa_variants.fp8 import emulate_fp8_attention

    q, k, v = torch.randn(1, 5, 2, 64), torch.randn(1, 7, 1, 64), torch.randn(1, 7, 1, 64)
    huge, exact = (quantize_fp8_torch(q, k, v, block_n=n) for n in (2**40, 16))  # 16 >= 7 keys: one block too
    assert huge.k_descale.shape == (1, 1, 1) and torch.equal(huge.k_descale, exact.k_descale)
    assert torch.equal(huge.v_descale, exact.v_descale) and torch.equal(huge.k, exact.k)
    out, _ = emulate_fp8_attention(huge, tile_m=2**40)
    assert torch.equal(out, emulate_fp8_attention(exact, tile_m=2**40)[0])


def test_promote_interval_checks_head_dim():
    cfg = FP8Config()
    for bad, exc in ((0, ValueError), (-5, ValueError), ("x", TypeError), (True, TypeError), (64.0, TypeError)):
        with pytest.raises(exc, match="^head_dim must be"):
            cfg.promote_interval(bad)
    assert cfg.promote_interval(64) >= 1 and FP8Config(promote_every=3).promote_interval(128) == 3


def test_heights_past_int64_are_one_line_value_errors():
    """A block or tile taller than int64 holds (FP8Inputs.block_m / block_n, quantize_fp8_torch's block_n, the
    emulation's tile_m) was an OverflowError ("int too big to convert") from inside torch's arange in dequantize or
    the emulation (a break-it pass, session 49): now a ValueError naming the argument. 2^63 - 1 itself still works,
    the same as any height of one block."""
    from fa_variants.fp8 import emulate_fp8_attention

    q, k, v = torch.randn(1, 5, 2, 64), torch.randn(1, 7, 1, 64), torch.randn(1, 7, 1, 64)
    inp = quantize_fp8_torch(q, k, v, block_n=16)  # one block of 7 keys, one of 5 query rows
    for name in ("block_m", "block_n"):
        with pytest.raises(ValueError, match=rf"^FP8Inputs\.{name} must be <= 2\^63 - 1"):
            dataclasses.replace(inp, **{name: 2**70})
    with pytest.raises(ValueError, match=r"^block_n must be a positive multiple of 16 up to 2\^63 - 1"):
        quantize_fp8_torch(q, k, v, block_n=2**70)
    with pytest.raises(ValueError, match=r"^tile_m must be <= 2\^63 - 1 "):
        emulate_fp8_attention(inp, tile_m=2**63)
    tallest = dataclasses.replace(inp, block_m=2**63 - 1, block_n=2**63 - 1)
    out, lse = emulate_fp8_attention(tallest, tile_m=2**63 - 1)
    ref_out, ref_lse = emulate_fp8_attention(inp)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)  # the same computation: one block either way
    assert all(torch.equal(a, b) for a, b in zip(tallest.dequantize(), inp.dequantize()))
    assert quantize_fp8_torch(q, k, v, block_n=2**63 - 16).k_descale.shape == (1, 1, 1)


def test_a_given_k_mean_on_another_device_is_named():
    """quantize_fp8_torch(k_mean=...) on another device than k (meta here, a GPU's elsewhere) was torch's
    RuntimeError from inside the subtraction ("Tensor on device meta is not on the expected device cpu!"): now the
    one-line ValueError naming k_mean, as for a wrong shape or dtype."""
    q, k, v = torch.randn(1, 5, 2, 64), torch.randn(1, 7, 1, 64), torch.randn(1, 7, 1, 64)
    with pytest.raises(ValueError, match=r"^k_mean must be a float32 tensor of shape \(1, 1, 64\) on k's device "
                                         r"\(cpu\), got torch.float32 \(1, 1, 64\) on meta$"):
        quantize_fp8_torch(q, k, v, k_mean=torch.zeros(1, 1, 64, device="meta"))
