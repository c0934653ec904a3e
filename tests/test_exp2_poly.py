"""The FMA-pipe exp2 (``fa_variants.common.exp2_poly``), on the CPU: the model of the kernels' arithmetic, its
accuracy, its special values, the column choice against the WGMMA accumulator's thread layout, and the fp8
emulation that models it. The kernels themselves: tests/test_fa3_fp8_compile.py (SASS), test_fa3_fp8_speed_gpu.py."""
import math

import pytest
import torch

from fa_variants.common import exp2_poly
from fa_variants.common.config import Sm90Config


def test_max_relative_error_is_the_documented_one():
    """Dense grid over the whole range the kernels feed it ([-126, 127]; fa3-fp8's scores sit in [-127, 8]) and
    every fraction of one binade: within MAX_REL_ERROR (1.02e-4), and the bound is tight (not a loose claim)."""
    x = torch.cat([torch.linspace(-126, 127, 1_000_001, dtype=torch.float64).float(),
                   torch.linspace(-0.5, 0.5, 200_001).float(), torch.rand(200_000, generator=torch.Generator().manual_seed(0)) * 9 - 8])
    rel = (exp2_poly.exp2_poly(x).double() / torch.exp2(x.double()) - 1).abs()
    assert rel.max().item() <= exp2_poly.MAX_REL_ERROR
    assert rel.max().item() >= 0.9 * exp2_poly.MAX_REL_ERROR


def test_coefficients_are_the_minimax_fit():
    """C1..C3 are what ``minimax_coefficients`` derives (numpy, Lawson's iteration; the constants rounded to float32
    differ from its float64 result by < 1e-7), their error before rounding is the documented 1.013e-4, and the float32
    constants through the model's steps keep the same maximum (no constant taken from elsewhere unchecked)."""
    coef, err = exp2_poly.minimax_coefficients(3)
    assert max(abs(a - b) for a, b in zip(coef, (exp2_poly.C1, exp2_poly.C2, exp2_poly.C3))) < 1e-7, coef
    assert 1.010e-4 < err < 1.016e-4
    _, err2 = exp2_poly.minimax_coefficients(2, iterations=1000)
    assert err2 > 1.9e-3  # degree 2: ~bf16's half ulp (2^-9 = 1.95e-3), too coarse for bf16 P


def test_special_values():
    """exp2(0) = 1 and integer powers exactly (c0 = 1, f = 0); -inf and everything <= -127 give +0 exactly (a
    masked score gets P = 0, so a row that sees no key keeps l = 0); NaN gives 0 (fmax drops NaN)."""
    ints = torch.arange(-126, 128, dtype=torch.float32)
    assert torch.equal(exp2_poly.exp2_poly(ints), torch.exp2(ints.double()).float())
    zero = exp2_poly.exp2_poly(torch.tensor([-math.inf, -127.0, -127.0 - 2**-16, -300.0, -1e30, math.nan]))
    assert torch.equal(zero, torch.zeros(6)) and not torch.signbit(zero).any()
    tiny = exp2_poly.exp2_poly(torch.tensor([-126.9, -126.5, -126.1]))
    assert (tiny >= 0).all() and (tiny < 2.0**-125).all()


def test_monotone_between_neighbours():
    """A softmax needs P to keep the order of the scores: the model is non-decreasing over consecutive floats
    around the split points (f = +-0.5) and at 0."""
    for centre in (-0.5, 0.5, 0.0, 3.5, -7.5):
        x = torch.tensor(centre, dtype=torch.float32) + torch.arange(-2000, 2001, dtype=torch.float32) * 2.0**-20
        y = exp2_poly.exp2_poly(x)
        assert (y[1:] >= y[:-1]).all(), centre


@pytest.mark.parametrize("per8", range(9))
def test_columns_follow_the_accumulator_layout(per8):
    """emulated_tile_columns (the emulation's view: tile columns) is emulated_column (the kernel's view: column j of
    a thread's rows view, the thread with lane % 4 = t holding tile columns 8 (j // 2) + 2 t + j % 2) for every
    thread, and the fraction is per8 / 8."""
    tile_n = 128
    cols = exp2_poly.emulated_tile_columns(tile_n, per8)
    for t in range(4):
        for j in range(tile_n // 4):
            assert bool(cols[8 * (j // 2) + 2 * t + j % 2]) == exp2_poly.emulated_column(j, per8)
    assert int(cols.sum()) == tile_n * per8 // 8


@pytest.mark.parametrize("bad", [-1, 9, 2.0, True])
def test_bad_fraction(bad):
    with pytest.raises(ValueError, match="exp2_emu"):
        exp2_poly.check_per8(bad)
    with pytest.raises(ValueError, match="exp2_emu"):
        Sm90Config(exp2_emu=bad).check(128)


def test_early_pv_arrive_needs_serial_steps():
    with pytest.raises(ValueError, match="early_pv_arrive"):
        Sm90Config(early_pv_arrive=True).check(128)
    Sm90Config(early_pv_arrive=True, intra_wg_overlap=False).check(128)


def test_fp8_emulation_models_the_polynomial():
    """emulate_fp8_attention(exp2_emu=k): the selected columns' P from the polynomial. Its output moves by far less
    than the FP8 error (the polynomial does not change the error budget: rel-L2 vs float64 within 1% of exp2's),
    but it does move (the model is wired), and exp2_emu = 0 is the default bit for bit."""
    from fa_variants.fp8 import emulate_fp8_attention
    from fa_variants.fp8.quantize import quantize_fp8_torch
    from fa_variants.reference import attention_reference, rel_l2

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, n, 2, 64, generator=g) for n in (150, 300, 300))
    inp = quantize_fp8_torch(q, k, v)
    exact, _ = attention_reference(q, k, v, causal=True, dtype=torch.float64)
    base, base_lse = emulate_fp8_attention(inp, causal=True, accumulator="truncate")
    assert torch.equal(base, emulate_fp8_attention(inp, causal=True, accumulator="truncate", exp2_emu=0)[0])
    for per8 in (2, 8):
        out, lse = emulate_fp8_attention(inp, causal=True, accumulator="truncate", exp2_emu=per8)
        assert 0 < float(rel_l2(out, base)) < 2e-3
        seen = torch.isfinite(base_lse)
        assert torch.equal(torch.isfinite(lse), seen) and (lse[seen] - base_lse[seen]).abs().max() < 1e-3
        assert float(rel_l2(out, exact)) <= 1.01 * float(rel_l2(base, exact))
