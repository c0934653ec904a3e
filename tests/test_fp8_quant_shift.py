"""Q's LSE shift summed in several chains (``quant_host.SHIFT_CHAINS``, ``PassConfig.shift_chains``; session 21).

The shift softmax_scale * q . mean is summed by each thread of Q's pass over its 64 (wide: 128) products; with one
chain that is a serial run of dependent FMAs, which session 21's ncu of Q's pass at head_dim 128 found stalling
(bench/NOTES.md, "Session 21 (2026-12-03): Q's pass at head_dim 128 under Nsight Compute"). C chains take product i
of each 16-channel chunk into chain i % C and add the chains pairwise: another float32 order, the kernel's own either
way. CPU: the switch's reach and refusals, the emulated order (wide = narrow bit for bit, within float32's bound of
float64), the compiled passes (the pairwise adds present, nothing else changed). GPU: every output of a chained call
equals the default's bit for bit except the shift, which stays within float32 rounding of torch's.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from fa_variants.common import cubin
from fa_variants.fp8 import FP8Config, quant_call
from fa_variants.fp8 import quant_host as qh
from fa_variants.fp8 import quant_kernel as qk
from fa_variants.fp8.quant_config import SHIFT_CHAIN_COUNTS
from fa_variants.fp8.quantize import quantize_fp8_torch
from test_fp8_quant_kernel import _emulated_shift, assert_shift_close, switch_inputs
from helpers import nan_filled_allocations


@pytest.fixture
def arch(request, monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", request.param)  # read when the DSL first loads
    return request.param


# ------------------------------------------------------------------------------------------------ CPU
def test_switch_reaches_q_pass_only(monkeypatch):
    """``SHIFT_CHAINS`` goes into Q's shift pass of the default recipe at every head_dim (narrow and wide) and into
    no other pass; 1 (the default) plans the configs of before; the launch plans' and call plans' keys hold it."""
    assert qh.SHIFT_CHAINS == 1 and qk.PassConfig().shift_chains == 1
    for chains in SHIFT_CHAIN_COUNTS:
        monkeypatch.setattr(qh, "SHIFT_CHAINS", chains)
        for d in (64, 128, 256):
            for wide128 in ("k", True):
                monkeypatch.setattr(qh, "V3_WIDE128", wide128)
                keys = qh.planned_passes("sm_90a", torch.bfloat16, d, FP8Config())
                assert {k.config.shift_chains for k in keys if k.config.shift} == {chains}, (d, wide128)
                assert {k.config.shift_chains for k in keys if not k.config.shift} == {1}, (d, wide128)
        keys = qh.planned_passes("sm_90a", torch.bfloat16, 128, FP8Config(smooth_k=False))
        assert all(k.config.shift_chains == 1 for k in keys)  # no smoothing, no shift
    switches = set()
    for chains in (1, 4):
        monkeypatch.setattr(qh, "SHIFT_CHAINS", chains)
        switches.add(quant_call._switches())
    assert len(switches) == 2


def test_launch_plan_key_holds_the_switch(monkeypatch):
    """A cached launch plan (``QUANT_PLANS``) is not reused across the switch."""
    built = []
    monkeypatch.setattr(qh, "_PLANS", {})
    monkeypatch.setattr(qh, "_launch_plan", lambda *args: built.append(qh.SHIFT_CHAINS) or (("fn", 1),))
    monkeypatch.setattr(qh, "QUANT_PLANS", True)
    for chains in (1, 4, 1, 4):
        monkeypatch.setattr(qh, "SHIFT_CHAINS", chains)
        qh.launch_plan(torch.device("cpu"), torch.bfloat16, 128, False, 4, 0, role="qk", block=128, shift=True)
    assert built == [1, 4]


@pytest.mark.parametrize("bad", [0, 3, 32, -2])
def test_bad_chain_count_refused(bad):
    """A chain count outside ``SHIFT_CHAIN_COUNTS``, or chains on a pass without the shift, is refused in one line."""
    with pytest.raises(ValueError, match="shift_chains"):
        qk.PassConfig(shift=True, shift_chains=bad).check(128)
    with pytest.raises(ValueError, match="shift_chains"):
        qk.PassConfig(shift_chains=4).check(128)


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("chains", [2, 4, 8])
def test_emulated_order(rng_seed, D, chains):
    """The chained order emulated in float32: wide (8 chunks per thread) equals narrow (4) bit for bit, as with one
    chain; it differs from the one-chain order on values whose sums round (the order is real), and both stay within
    float32 summation's bound of the float64 dot product."""
    g = torch.Generator().manual_seed(rng_seed)
    x = torch.randn(57, D, generator=g) * torch.logspace(-2, 2, D)
    mean = torch.randn(D, generator=g) * torch.logspace(1, -1, D)
    narrow = _emulated_shift(x, mean, 4, chains)
    if D >= 128:
        assert torch.equal(narrow, _emulated_shift(x, mean, 8, chains))
    one = _emulated_shift(x, mean, 4)
    assert not torch.equal(narrow, one)
    exact = x.double() @ mean.double()
    bound = D * 2.0 ** -24 * 1.01 * (x.double().abs() @ mean.double().abs())
    for got in (narrow, one):
        assert ((got.double() - exact).abs() <= bound).all()


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a"], indirect=True)
@pytest.mark.parametrize("D,wide", [(64, False), (128, False), (128, True), (256, True)])
def test_compiled_chains(arch, D, wide):
    """Q's shift pass compiled with 4 chains against 1: the same products (FFMA count) and per group of chains
    3 more FADDs (the pairwise adds; ptxas does not reassociate float adds, so the chains are in the code), the
    same shuffles and barriers; registers within the pass's cap. Spills are reported, not bounded: 4 chains spill at
    the narrow passes' 128 registers (D 64 / 128, what the GPU A/B weighs)."""
    cfg = qk.PassConfig(rows=128, stages=3, coalesced=True, head_major=True, staged_mean=True, pdl=True, shift=True,
                        wide=wide, staged_store=D == 64 or (D == 128 and wide), nonfinite=True)
    chained = dataclasses.replace(cfg, shift_chains=4)
    c1, c4 = (qk.VARIANT.compiled(qk.static_config(arch, torch.bfloat16, D, x)) for x in (cfg, chained))
    names = ("FFMA", "FADD", "SHFL.BFLY", "BAR.SYNC")
    n1, n4 = (cubin.count_sass(cubin.sass_of(c.cubin), names) for c in (c1, c4))
    groups = 2 if wide else 1
    assert n4["FFMA"] == n1["FFMA"] and n4["FADD"] == n1["FADD"] + 3 * groups, (n1, n4)
    assert n4["SHFL.BFLY"] == n1["SHFL.BFLY"] and n4["BAR.SYNC"] == n1["BAR.SYNC"], (n1, n4)
    cap = 255 if wide else 128
    assert cubin.cubin_resources(c4.cubin)["registers"] <= cap


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("chains", [2, 8])
@pytest.mark.parametrize("head_dim,wide128", [(64, "k"), (128, "k"), (128, True), (256, "k")])
def test_chained_shift_matches(monkeypatch, head_dim, wide128, chains):
    """The default recipe with ``SHIFT_CHAINS`` = chains against 1: e4m3 Q, K, V and every descale and the mean bit
    for bit; the shift within float32 rounding of torch's (``assert_shift_close``); GQA, odd lengths, batch 3, a
    negative scale, NaN-poisoned memory; at head_dim 128 with Q's pass narrow ("k") and wide (True)."""
    monkeypatch.setattr(qh, "V3_WIDE128", wide128)
    q, k, v = switch_inputs(head_dim, 31 * head_dim + chains)
    for scale in (None, -0.7):
        got = []
        for value in (1, chains):
            monkeypatch.setattr(qh, "SHIFT_CHAINS", value)
            with nan_filled_allocations():  # outputs and scratch NaN-filled: an unwritten element fails
                got.append(qh.quantize(q, k, v, softmax_scale=scale, pipeline="v3"))
        a, b = got
        for name in ("q", "k", "v_t"):
            assert torch.equal(getattr(a, name).view(torch.uint8), getattr(b, name).view(torch.uint8)), name
        for name in ("q_descale", "k_descale", "v_descale", "k_mean"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert not torch.equal(a.lse_shift, b.lse_shift)  # another order: some of the 12k rows round apart
        assert_shift_close(b.lse_shift, a.lse_shift, q, b.k_mean, b.softmax_scale)
        if scale is None:  # and torch's shift given the pass's mean
            ref = quantize_fp8_torch(q, k, v, k_mean=b.k_mean)
            assert_shift_close(b.lse_shift, ref.lse_shift, q, b.k_mean, b.softmax_scale)


@pytest.mark.gpu
@pytest.mark.parametrize("chains", [2, 8])
@pytest.mark.parametrize("switch,head_dim,narrow", [("V3_WIDE128", 128, "k"), ("V3_WIDE", 256, False)])
def test_chained_shift_wide_equals_narrow(monkeypatch, switch, head_dim, narrow, chains):
    """With the same chain count, Q's wide pass (head_dim 128: ``V3_WIDE128`` True; 256: ``V3_WIDE``) writes the
    shift of the narrow pass bit for bit (the emulated claim of test_emulated_order, on the GPU), and every other
    output too."""
    monkeypatch.setattr(qh, "SHIFT_CHAINS", chains)
    q, k, v = switch_inputs(head_dim, 37 * head_dim + chains)
    got = []
    for value in (narrow, True):
        monkeypatch.setattr(qh, switch, value)
        with nan_filled_allocations():  # outputs and scratch NaN-filled: an unwritten element fails
            got.append(qh.quantize(q, k, v, softmax_scale=-0.7, pipeline="v3"))
    a, b = got
    for name in ("q", "k", "v_t"):
        assert torch.equal(getattr(a, name).view(torch.uint8), getattr(b, name).view(torch.uint8)), name
    for name in ("q_descale", "k_descale", "v_descale", "k_mean", "lse_shift"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
