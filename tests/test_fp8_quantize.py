"""FP8 pieces (fa_variants.fp8.quantize): Hadamard rotation, e4m3 block quantisation, the emulation reference.

EDGE_CASES.md EC-23: (c) the rotation is orthonormal and keeps Q K^T for every head_dim we serve; (b) head_dims
that are not powers of two go through the FP8 path with a block-diagonal rotation; (a) channel outliers, on a
smaller N in CPU emulation, with targets set from that emulation (see test_ec23a_outliers for why they are
cos >= 0.998 and rel-L2 <= 6e-2 rather than EC-23's example 0.999 / 3e-2).
"""
import math

import pytest
import torch
import torch.nn.functional as F

from fa_variants.fp8.quantize import (E4M3_MAX, FP8Config, HadamardRotation, fp8_attention_reference,
                                      fp8_error_bound, fwht, hadamard_blocks, prepare_fp8_inputs,
                                      quantize_blocks, quantize_per_tensor)
from fa_variants.reference import attention_reference, rel_l2

HEAD_DIMS = (32, 40, 64, 80, 96, 128, 192, 256)  # all the project serves, plus EC-23b's


def cos(x, ref):
    return F.cosine_similarity(x.double().flatten(), ref.double().flatten(), dim=0).item()


# ----------------------------------------------------------------------------------------------- (c)


def sylvester(n):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), h)
    return h / math.sqrt(n)


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_fwht_is_the_normalised_hadamard(n):
    x = torch.randn(3, 5, n, dtype=torch.float64)
    torch.testing.assert_close(fwht(x), x @ sylvester(n), atol=1e-12, rtol=0)
    torch.testing.assert_close(fwht(fwht(x)), x, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="power-of-two"):
        fwht(torch.zeros(2, 12))


def test_hadamard_blocks():
    assert hadamard_blocks(128) == (128,)
    assert hadamard_blocks(96) == (64, 32) and hadamard_blocks(40) == (32, 8)
    assert hadamard_blocks(192) == (128, 64) and hadamard_blocks(80) == (64, 16)


@pytest.mark.parametrize("D", HEAD_DIMS)
def test_rotation_orthonormal_and_keeps_scores(D):
    """EC-23c: ||R R^T - I||_inf < 1e-5 in fp32; (QR)(KR)^T = QK^T within 1e-4 relative; not a permutation."""
    rot = HadamardRotation(D, seed=3)
    R = rot.matrix(torch.float32)
    assert (R @ R.T - torch.eye(D)).abs().max().item() < 1e-5
    assert (R.abs() < 0.9).all()  # every row mixes several channels (blocks >= 8 here): not ~identity
    q, k = torch.randn(2, 33, 4, D), torch.randn(2, 47, 4, D)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k)
    s_rot = torch.einsum("bqhd,bkhd->bhqk", rot(q), rot(k))
    assert ((s_rot - s).norm() / s.norm()).item() < 1e-4
    assert ((s_rot - s).abs().max() / s.abs().max()).item() < 1e-4
    torch.testing.assert_close(rot(q), q @ R, atol=1e-5, rtol=1e-5)
    assert not torch.equal(HadamardRotation(D, seed=4).signs, rot.signs) or D < 8


# ----------------------------------------------------------------------------------------- quantisation


def test_quantize_blocks():
    torch.manual_seed(0)
    B, N, H, D, blk = 2, 70, 3, 16, 32  # 70 = 32 + 32 + 6: a tail tile
    x = torch.randn(B, N, H, D) * torch.logspace(-2, 2, N).view(1, N, 1, 1)
    x[0, 40:64, 1] = 0  # an all-zero tile
    qx = quantize_blocks(x, blk)
    assert qx.data.dtype == torch.float8_e4m3fn and qx.data.shape == x.shape
    assert qx.descale.shape == (B, H, 3) and qx.descale.dtype == torch.float32
    tiles = [slice(0, 32), slice(32, 64), slice(64, 70)]
    for t, r in enumerate(tiles):
        amax = x[:, r].abs().amax(dim=(1, 3))  # (B, H)
        expect = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        torch.testing.assert_close(qx.descale[:, :, t], expect)
    y = qx.dequantize()
    scale = qx.descale.repeat_interleave(blk, dim=2)[:, :, :N].transpose(1, 2).unsqueeze(-1)
    # e4m3: 3 mantissa bits (half-ulp 2^-4 relative) above 2^-6, absolute steps of 2^-9 below (times scale)
    assert ((y - x).abs() <= torch.maximum(x.abs() * 2**-4, scale * 2**-10) * (1 + 1e-6)).all()
    assert (y[0, 40:64, 1] == 0).all()
    # the largest element of each tile maps to 448 exactly
    assert qx.data.float().abs().amax().item() == E4M3_MAX


def test_quantize_per_tensor():
    x = torch.randn(1, 20, 2, 8) * 3
    qx = quantize_per_tensor(x)
    assert qx.descale.dim() == 0 and qx.descale.item() == pytest.approx(x.abs().max().item() / E4M3_MAX)
    assert ((qx.dequantize() - x).abs() <= x.abs() * 2**-4 + qx.descale * 2**-10).all()


def test_prepare_fp8_inputs_shapes_and_shift():
    q, k, v = torch.randn(2, 100, 6, 64), torch.randn(2, 300, 2, 64) + 5, torch.randn(2, 300, 2, 64)
    fp8 = prepare_fp8_inputs(q, k, v, config=FP8Config(Br=64, Bc=128))
    assert fp8.q.descale.shape == (2, 6, 2) and fp8.k.descale.shape == (2, 2, 3) and fp8.v.descale.shape == (2, 2, 3)
    # smooth K: the shift is softmax_scale * q . mean_k(K) of the query's K/V head (GQA 3:1)
    expect = torch.einsum("bqhd,bhd->bhq", q, k.mean(dim=1).repeat_interleave(3, dim=1)) / 8
    torch.testing.assert_close(fp8.lse_shift, expect, atol=1e-4, rtol=1e-5)
    assert prepare_fp8_inputs(q, k, v, config=FP8Config(smooth_k=False)).lse_shift is None
    with pytest.raises(ValueError, match="multiple of num_heads_kv"):
        prepare_fp8_inputs(q, k[:, :, :1].expand(2, 300, 4, 64), v)
    with pytest.raises(ValueError, match="granularity"):
        FP8Config(granularity="row")


# --------------------------------------------------------------------------------- emulation reference


def test_emulation_causal_gqa_empty_rows():
    """Bottom-right causal with Nq > Nk (rows seeing no key: 0 and -inf), GQA, tails; close to float64."""
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 150, 4, 64), torch.randn(1, 100, 2, 64), torch.randn(1, 100, 2, 64)
    cfg = FP8Config(Br=64, Bc=32)
    out, lse = fp8_attention_reference(q, k, v, causal=True, config=cfg)
    ref, ref_lse = attention_reference(q, k, v, causal=True)
    assert out.dtype == lse.dtype == torch.float32 and out.shape == q.shape and lse.shape == (1, 4, 150)
    assert (out[:, :50] == 0).all() and torch.isneginf(lse[:, :, :50]).all()
    assert torch.isfinite(lse[:, :, 50:]).all()
    assert rel_l2(out, ref) < 0.08 and (lse - ref_lse)[..., 50:].abs().max().item() < 0.1


def test_emulation_p_rounding_single_tile():
    """Inputs exactly representable in e4m3 with per-tensor scale 1 (quantisation is then the identity) and one
    key tile: O must be round_e4m3(448 P) / 448 @ V / rowsum(P), P = exp(S - rowmax), and LSE exact."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randint(-8, 9, (1, n, 2, 16), generator=g).float() / 4 for n in (40, 70, 70))
    for t in (q, k, v):  # amax 448 in every tensor -> scale 1
        t[0, -1, 0, 0] = 448.0
    cfg = FP8Config(granularity="tensor", rotate=False, smooth_k=False, Bc=70)
    fp8 = prepare_fp8_inputs(q, k, v, config=cfg)
    assert torch.equal(fp8.q.dequantize(), q) and torch.equal(fp8.k.dequantize(), k)
    out, lse = fp8_attention_reference(q, k, v, causal=True, softmax_scale=0.05, config=cfg)
    s = 0.05 * torch.einsum("bqhd,bkhd->bhqk", q, k).masked_fill(torch.arange(70) > torch.arange(40)[:, None] + 30,
                                                                 -math.inf)
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    p8 = (p * 448).to(torch.float8_e4m3fn).float() / 448
    assert not torch.equal(p8, p)  # the rounding is really there
    expect = torch.einsum("bhqk,bkhd->bqhd", p8 / p.sum(dim=-1, keepdim=True), v)
    torch.testing.assert_close(out, expect, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1), atol=1e-4, rtol=1e-6)
    ref_out, _ = attention_reference(q, k, v, causal=True, softmax_scale=0.05)
    assert (out.double() - ref_out).abs().max().item() > 1e-3  # and it matters


# ------------------------------------------------------------------------------------------------- (b)


@pytest.mark.parametrize("D", [40, 80, 96, 192])
def test_non_power_of_two_head_dim(D):
    """EC-23b: the FP8 path with rotation on a non-power-of-two D: no crash, as accurate as a power of two."""
    torch.manual_seed(D)
    q, k, v = (torch.randn(1, 256, 2, D) for _ in range(3))
    out, lse = fp8_attention_reference(q, k, v, config=FP8Config(rotate=True))
    ref, ref_lse = attention_reference(q, k, v)
    assert torch.isfinite(out).all() and rel_l2(out, ref) < 0.07 and cos(out, ref) > 0.997
    assert (lse - ref_lse).abs().max().item() < 0.1


# ------------------------------------------------------------------------------------------------- (a)


def ec23a_inputs(N, H=4, D=128, seed=0):
    """EC-23a at a smaller N: q, k, v ~ N(0,1); k[..., {5, 77}] += 40; q[..., 9] *= 20 on 1% of tokens;
    v[..., 3] *= 30; bf16."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, N, H, D, generator=g) for _ in range(3))
    k[..., [5, 77]] += 40
    hot = torch.rand(1, N, generator=g) < 0.01
    q[..., 9] = torch.where(hot[..., None], q[..., 9] * 20, q[..., 9])
    v[..., 3] *= 30
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def fa3_outlier_inputs(N, H=4, D=128, p=0.01, seed=0):
    """FA3 paper section 4.3 (Table 3): Q, K ~ N(0,1) + N(0, 100) * Bernoulli(p); V ~ N(0,1); bf16."""
    g = torch.Generator().manual_seed(seed)

    def x():
        return torch.randn(1, N, H, D, generator=g) + 10 * torch.randn(1, N, H, D, generator=g) * (
            torch.rand(1, N, H, D, generator=g) < p)
    return x().bfloat16(), x().bfloat16(), torch.randn(1, N, H, D, generator=g).bfloat16()


def test_ec23a_outliers():
    """The shipped path (block + rotation + smooth K) on EC-23a data, N = 512 on the CPU.

    Targets from this emulation: measured cos ~0.9986, rel-L2 ~0.053 (also at EC-23a's N = 4096, H = 8).
    e4m3 keeps 3 mantissa bits: each rounded element carries ~2.6% rms relative error, and Q, K, V and P
    are all rounded, which puts N(0,1) attention at rel-L2 ~5% (cos ~0.9986) even without outliers, so
    EC-23's example 0.999 / 3e-2 is out of reach of any e4m3 path on this data; we assert 0.998 / 6e-2.
    Teeth: without smooth K the K channel bias (+40) costs 3x (rel-L2 ~0.15); a rotation cannot remove a
    bias (it spreads it over all channels: measured slightly worse than no rotation there).
    """
    q, k, v = ec23a_inputs(512)
    ref, ref_lse = attention_reference(q, k, v)
    out, lse = fp8_attention_reference(q, k, v)
    assert cos(out, ref) >= 0.998 and rel_l2(out, ref) <= 6e-2
    assert (lse - ref_lse).abs().max().item() < 0.1
    unsmoothed, lse_u = fp8_attention_reference(q, k, v, config=FP8Config(smooth_k=False))
    assert rel_l2(unsmoothed, ref) > 2 * rel_l2(out, ref) and cos(unsmoothed, ref) < 0.995
    assert (lse_u - ref_lse).abs().max().item() > 0.3


def test_rotation_has_teeth_on_sparse_outliers():
    """Q, K with sparse large entries (FA3 Table 3's distribution, 1% outliers): the Hadamard rotation
    spreads each outlier over all channels. Measured: rel-L2 ~0.043 (cos ~0.9991) with rotation, ~0.09
    without (per block or per tensor)."""
    q, k, v = fa3_outlier_inputs(512)
    ref, _ = attention_reference(q, k, v)
    rotated, _ = fp8_attention_reference(q, k, v)
    plain, _ = fp8_attention_reference(q, k, v, config=FP8Config(rotate=False))
    per_tensor, _ = fp8_attention_reference(q, k, v, config=FP8Config("tensor", rotate=False, smooth_k=False))
    assert cos(rotated, ref) >= 0.998 and rel_l2(rotated, ref) <= 5e-2
    assert rel_l2(plain, ref) > 1.5 * rel_l2(rotated, ref) and rel_l2(per_tensor, ref) > 1.5 * rel_l2(rotated, ref)


def test_fp8_error_bound():
    ref = torch.zeros(2, 3)
    emu = torch.tensor([[0.0, 0.01, -0.02], [0.0, 0.0, 0.0]])
    assert fp8_error_bound(emu, ref) == pytest.approx(2 * 0.02 + 1e-4)


@pytest.mark.slow
def test_ec23a_full_size():
    """EC-23a at its own N (B=1, N=4096, D=128) with H=2 instead of 8 to stay fast (~3 s on 2 idle cores).

    Measured here (H=2): shipped path cos 0.9978, rel-L2 0.066; rotation off 0.9950, 0.100.
    At EC-23a's H=8: shipped cos 0.9983, rel-L2 0.059; rotation off 0.9967, 0.082; smooth K off 0.980, 0.21.
    At this N the 1% of query rows with q[..., 9] * 20 attend sharply, their outputs carry V's x30 channel
    and dominate ||O||, and their logits' e4m3 error is what rel-L2 measures (hence above N = 512's 0.053).
    """
    q, k, v = ec23a_inputs(4096, H=2)
    ref, _ = attention_reference(q, k, v)
    out, _ = fp8_attention_reference(q, k, v)
    assert cos(out, ref) >= 0.997 and rel_l2(out, ref) <= 7.5e-2
    plain, _ = fp8_attention_reference(q, k, v, config=FP8Config(rotate=False))
    assert rel_l2(plain, ref) > 1.2 * rel_l2(out, ref)


def test_fp8_study_cli(tmp_path):
    """`fa-variants fp8-study` on tiny sizes: table, JSON and markdown; fp16 beats e4m3; smooth K helps."""
    import json

    from fa_variants.cli import main

    assert main(["fp8-study", "--seqlens", "128", "--heads", "2", "--head-dim", "64", "--dists", "normal",
                 "channel", "--backend", "emulation", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "fp8_study.json").read_text())["rows"]
    assert len(rows) == 2 * 5 and {r["backend"] for r in rows} == {"torch", "emulation"}
    err = {(r["dist"], r["method"]): r["rel_l2"] for r in rows}
    for dist in ("normal", "channel"):
        assert err[(dist, "fp16")] * 10 < min(err[(dist, m)] for m in ("tensor", "block", "block+H", "shipped"))
    assert err[("channel", "shipped")] * 1.5 < err[("channel", "block+H")]
    assert "| channel | 128 |" in (tmp_path / "fp8_study.md").read_text()
