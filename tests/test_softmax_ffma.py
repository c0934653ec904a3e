"""CPU model of the one-FFMA softmax exponent (common.softmax, "One-FFMA exponent"; Sm90Config.exp2_ffma):
float32 arithmetic tile by tile as the kernel does it (FFMA modelled exactly: the float32 product is exact in
float64), against float64 softmax. The consistent basis keeps huge logits (rows shifted by -1e6, a row whose
max crosses FFMA_LIMIT mid-row) at rounding level, where the FFMA form with an exactly scaled alpha (the
previous switch) is off by far more: the check can fail."""
import math
import statistics

import pytest
import torch

from fa_variants.common.softmax import FFMA_LIMIT


def _f32(x):
    return x.to(torch.float32)


def _fma(a, b, c):
    """float32 fma(a, b, c): a * b is exact in float64 for float32 inputs; one rounding to float32 at the end
    (a second, float64 rounding of the sum first: far below float32's)."""
    return _f32(a.double() * b.double() + c.double())


def online_softmax_pv(s, v, c, tile_n, consistent=True, limit=FFMA_LIMIT, p_dtype=torch.bfloat16):
    """O = softmax(s c) v row by row over key tiles (last to first, as fa3), float32 state; returns O float64."""
    c = torch.tensor(c, dtype=torch.float32)
    rows, n = s.shape
    m = torch.full((rows,), -math.inf)
    l = torch.zeros(rows)
    err = torch.zeros(rows)
    o = torch.zeros(rows, v.shape[1])
    for start in reversed(range(0, n, tile_n)):
        st, vt = s[:, start:start + tile_n], v[start:start + tile_n]
        m_new = torch.maximum(m, st.max(dim=1).values)
        m_safe = torch.where(m_new == -math.inf, torch.zeros(()), m_new)
        basis = _f32(m_safe * c)
        huge = ~(basis.abs() < limit)  # |B| >= limit or NaN
        e_new = torch.where(huge, torch.zeros(()), _fma(m_safe, c, -basis))
        shift = torch.where(huge, m_safe, torch.zeros(()))
        basis = torch.where(huge, torch.zeros(()), basis)
        p = torch.exp2(_fma(_f32(st - shift[:, None]), c.expand_as(st), -basis[:, None].expand_as(st)))
        if consistent:
            log2_alpha = _fma(_f32(m - m_safe), c.expand(rows), _f32(e_new - err))
        else:  # the previous exp2_ffma: alpha from exact (m_old - m_new) c, P against the rounded m c
            log2_alpha = _f32(_f32(m - m_safe) * c)
        alpha = torch.exp2(log2_alpha)
        alpha = torch.where(m == -math.inf, torch.zeros(()), alpha)
        l = alpha * l + p.sum(dim=1)
        o = alpha[:, None] * o + p.to(p_dtype).float() @ vt
        m, err = m_new, e_new
    return (o / l[:, None]).double()


def _reference(s, v, c):
    return torch.softmax(s.double() * (c * math.log(2.0)), dim=1) @ v.double()  # exp2(s c)


@pytest.mark.parametrize("shift", [0.0, -1e6, 3e6])
def test_consistent_basis_matches_float64(rng_seed, shift):
    g = torch.Generator().manual_seed(rng_seed)
    rows, n, d = 64, 1024, 64
    c = 128 ** -0.5 * math.log2(math.e)
    s = _f32(torch.randn(rows, n, generator=g, dtype=torch.float64) * 3 + shift)
    s[:, 5] += torch.linspace(0, 40, rows)  # some rows' max moves late (tiles run last to first)
    v = torch.randn(n, d, generator=g).to(torch.bfloat16).float()
    ref = _reference(s, v, c)
    assert (online_softmax_pv(s, v, c, tile_n=128) - ref).abs().max().item() < 2e-2  # bf16 P, as in the kernel


def test_huge_logits_consistent_vs_previous_form(rng_seed):
    """Logits near -5e5 at softmax_scale 1 with the FFMA form forced up to |m c| < 2^20 (basis rounded by up to
    2^-5; the kernel's limit is lower, this tests the consistent basis itself): it must not leak into O. The previous
    switch's alpha leaks it. The error of a draw is its RMS over O (the largest element's is too noisy to tell the
    forms apart: over 800 draws the previous form's was as little as 0.8x the consistent one's), averaged over five
    draws. Session 52, 800 draws (|O| ~ 0.9): RMS error 1.9e-4 to 6.0e-4 (consistent) and 8.5e-4 to 2.1e-3
    (previous), their ratio per draw at least 1.8; over 20,000 sets of five draws the mean was at most 4.4e-4 and the
    ratio of means at least 2.99 (the old bounds on the largest element's error failed 3 seeds in 5,300)."""
    good_rms, bad_rms, good_max = [], [], []
    for draw in range(5):
        g = torch.Generator().manual_seed(rng_seed + draw)
        rows, n, d = 32, 2048, 64
        c = math.log2(math.e)
        s = torch.randn(rows, n, generator=g, dtype=torch.float64) * 2
        s = _f32(s + torch.linspace(4, 0, n, dtype=torch.float64) - 5e5)  # the max moves on many tiles
        v = torch.randn(n, d, generator=g).to(torch.bfloat16).float()
        ref = _reference(s, v, c)
        good = online_softmax_pv(s, v, c, 128, limit=2.0**20) - ref
        bad = online_softmax_pv(s, v, c, 128, consistent=False, limit=2.0**20) - ref
        good_rms.append(good.pow(2).mean().sqrt().item())
        bad_rms.append(bad.pow(2).mean().sqrt().item())
        good_max.append(good.abs().max().item())
    assert statistics.mean(good_rms) < 8e-4 and max(good_max) < 2e-2, (good_rms, good_max)  # bf16 P, as in the kernel
    assert statistics.mean(bad_rms) > 2 * statistics.mean(good_rms), (bad_rms, good_rms)


def test_huge_rows_whose_max_moves(rng_seed):
    """Logits near -1e6 (|m c| ~ 1.4e6, past FFMA_LIMIT: the exact form) with the max moving on many tiles, old
    tiles still weighing: O within 5e-3 of float64's."""
    g = torch.Generator().manual_seed(rng_seed)
    rows, n, d = 32, 2048, 64
    c = math.log2(math.e)
    s = torch.randn(rows, n, generator=g, dtype=torch.float64) * 2
    s = _f32(s + torch.linspace(4, 0, n, dtype=torch.float64) - 1e6)
    v = torch.randn(n, d, generator=g).to(torch.bfloat16).float()
    err = (online_softmax_pv(s, v, c, 128) - _reference(s, v, c)).abs().max().item()
    assert err < 5e-3, err


def test_basis_crossing_the_limit_mid_row(rng_seed):
    """A row whose |m c| crosses FFMA_LIMIT between tiles switches from the FFMA form to the exact form."""
    g = torch.Generator().manual_seed(rng_seed)
    rows, n, d = 16, 512, 32
    c = 1.0
    s = _f32(torch.randn(rows, n, generator=g, dtype=torch.float64) + FFMA_LIMIT - 8)
    s[:, :64] += 16.0  # first tile (processed last) lifts m c past the limit
    v = torch.randn(n, d, generator=g).to(torch.bfloat16).float()
    err = (online_softmax_pv(s, v, c, 64) - _reference(s, v, c)).abs().max().item()
    assert err < 2e-2, err


def test_basis_leaving_the_limit_mid_row(rng_seed):
    """The other way: m c from below -2^11 (exact form) up to small values (the FFMA form), with rows whose first
    tile (processed first: the last keys) is fully masked (-inf) before logits near -3000: alpha must give 0 there,
    not exp2(+3000) = inf (0 * inf = NaN)."""
    g = torch.Generator().manual_seed(rng_seed)
    rows, n, d = 16, 512, 32
    c = 1.0
    s = _f32(torch.randn(rows, n, generator=g, dtype=torch.float64) - FFMA_LIMIT - 900)
    s[:, :128] += torch.linspace(0, FFMA_LIMIT + 900, rows, dtype=torch.float64)[:, None]  # late tiles: small m c
    s[: rows // 2, 448:] = -math.inf  # the first tile processed: nothing to see for half the rows
    v = torch.randn(n, d, generator=g).to(torch.bfloat16).float()
    out = online_softmax_pv(s, v, c, 64)
    err = (out - _reference(s, v, c)).abs().max().item()
    assert torch.isfinite(out).all() and err < 2e-2, err


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("logit", [-1e4, -1300.0, -700.0, -3.0, 900.0])
def test_one_key_row_returns_v_exactly(rng_seed, dtype, logit):
    """EC-04: a row that sees one key has weight exactly 1, so O rounded to the input dtype is that key's V,
    on both sides of FFMA_LIMIT (|m c| here from 4 to 1.4e4 at softmax_scale 1)."""
    g = torch.Generator().manual_seed(rng_seed)
    v = (torch.randn(1, 128, generator=g) * 3).to(dtype).float()
    c = math.log2(math.e)
    for jitter in torch.linspace(0, 1, 97).tolist():  # many roundings of the basis m c
        s = _f32(torch.tensor([[logit + jitter]], dtype=torch.float64))
        out = online_softmax_pv(s, v, c, tile_n=128, p_dtype=dtype).to(dtype)
        assert torch.equal(out.float(), v), (logit + jitter, (out.float() - v).abs().max().item())


def test_one_key_row_check_can_fail(rng_seed):
    """The same check with the FFMA form forced at |m c| ~ 1.4e4 (limit 2^20, the H200's EC-04 failure in fp16)
    does catch the error."""
    v = torch.randn(1, 128, generator=torch.Generator().manual_seed(rng_seed)).to(torch.float16).float()
    c = math.log2(math.e)
    bad = 0
    for jitter in torch.linspace(0, 1, 97).tolist():
        s = _f32(torch.tensor([[-1e4 + jitter]], dtype=torch.float64))
        out = online_softmax_pv(s, v, c, tile_n=128, limit=2.0**20, p_dtype=torch.float16).to(torch.float16)
        bad += not torch.equal(out.float(), v)
    assert bad > 0
