"""The GPU quantisation pass on non-finite inputs (``quant_host.NONFINITE``, ``PassConfig.nonfinite``; session 14).

The torch recipe (``quantize._amax_blocks`` / ``_to_e4m3``) takes each block's descale from its finite values and
stores an inf / NaN as e4m3 NaN, after the K mean, the signs and the Hadamard (it masks the float32 values it
quantises). The pass with ``nonfinite`` does the same: one uniform test per block (its max is inf: only an inf makes
it so, fmax skips a NaN), then the slow path: Q / K rotated again from the input with the recipe's overflow shift
(``RotationMixin.rotate_again``, session 35), then ``ScaleStoreMixin.finite_block``. CPU: the switch reaches every pass
kind's ``PassConfig`` and the plans' keys; compile-only: the slow path compiles for every kind, the switch off
leaves the default passes' configs as they were. GPU: the pass against the torch recipe given the pass's K mean (e4m3
bytes equal, a NaN byte 0x7F or 0xFF either way; descales equal; the LSE shift to float32 rounding with its inf / NaN
where torch has them) on inf / -inf / NaN in Q, K and V (one value, a whole token, a whole block of a head; and a
finite bf16 token whose Hadamard sums overflow float32, with rotated values past float32's range or all within it),
head_dim 64 / 128 / 256; finite inputs bit for bit as without
the switch; fa3-fp8 end to end: the rows that read the value non-finite, the others finite and within
``fp8_error_bound``.

    source .gpu/env.sh && python3 -m pytest -m gpu tests/test_fp8_quant_nonfinite.py -q
"""
import math

import pytest
import torch

from fa_variants.fp8 import FP8Config
from fa_variants.fp8 import quant_call
from fa_variants.fp8 import quant_host as qh
from fa_variants.fp8 import quant_kernel as qk
from fa_variants.fp8.quantize import HadamardRotation, quantize_fp8_torch, tiles_for
from helpers import seeded_generator

RECIPES = {"default": FP8Config(), "no-smooth": FP8Config(smooth_k=False), "head-smooth": FP8Config(granularity="head"),
           "no-rotate": FP8Config(rotate=False)}
# (recipe, head_dim): the default at every head_dim (V, smoothed K, Q with the shift; staged store at 64, wide at
# 256); K unsmoothed (its inf stays in its block), the per-head baseline ("amax" + "given") and no rotation at 128
CASES = [("default", 64), ("default", 128), ("default", 256), ("no-smooth", 128), ("head-smooth", 128),
         ("no-rotate", 128)]
# where the slow path runs: in the loop, or after it (``NONFINITE_DEFERRED``, the default since session 37) with the
# grid the host picks (one item per CTA at these sizes), with one CTA for every item (``GRID_CAP`` 1: more than 31 items, the
# "every item from 31 on" bit) and with 5 CTAs (several items each: only the items left are redone)
PLACES = {"inloop": (False, None), "deferred": (True, None), "deferred-grid1": (True, 1), "deferred-grid5": (True, 5)}
BAD = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


# ------------------------------------------------------------------------------------------------ CPU
def test_switch_reaches_every_pass(monkeypatch):
    """``NONFINITE`` is in every pass's ``PassConfig`` the host plans (default recipe at every head_dim, the per-head
    baseline's "amax" / "given" launches, V3_WIDE128's wide + staged store at 128), in the launch plans' key and in the
    call plans' switches; off, the configs are those of before (``nonfinite`` False, its default)."""
    for on in (False, True):
        monkeypatch.setattr(qh, "NONFINITE", on)
        for recipe, d in CASES + [("default", 128)]:
            keys = qh.planned_passes("sm_90a", torch.bfloat16, d, RECIPES[recipe])
            assert keys and all(key.config.nonfinite is on for key in keys), (recipe, d)
            assert {k.config.role for k in keys} == {"qk", "v"}
        monkeypatch.setattr(qh, "V3_WIDE128", True)
        keys = qh.planned_passes("sm_90a", torch.bfloat16, 128, FP8Config())
        assert any(k.config.wide and k.config.staged_store for k in keys)
        assert all(key.config.nonfinite is on for key in keys)
        monkeypatch.setattr(qh, "V3_WIDE128", False)
        assert quant_call._switches()[-2:] == (on, qh.NONFINITE_DEFERRED)
    modes = {k.config.mode for k in qh.planned_passes("sm_90a", torch.bfloat16, 128, RECIPES["head-smooth"])}
    assert modes == {"amax", "given"}
    assert qk.PassConfig().nonfinite is False


@pytest.mark.parametrize("switch", ["NONFINITE", "NONFINITE_DEFERRED"])
def test_launch_plan_key_holds_the_switch(monkeypatch, switch):
    """A cached launch plan (``QUANT_PLANS``) is not reused across the switch: its key holds ``NONFINITE`` and
    ``NONFINITE_DEFERRED``."""
    built = []
    monkeypatch.setattr(qh, "_PLANS", {})
    monkeypatch.setattr(qh, "_launch_plan", lambda *args: built.append(getattr(qh, switch)) or (("fn", 1),))
    monkeypatch.setattr(qh, "QUANT_PLANS", True)
    kind = dict(role="v", block=128)
    for on in (False, True, False, True):
        monkeypatch.setattr(qh, switch, on)
        qh.launch_plan(torch.device("cpu"), torch.bfloat16, 128, False, 4, 0, **kind)
    assert built == [False, True]


def test_deferred_reaches_every_pass(monkeypatch):
    """``NONFINITE_DEFERRED`` with ``NONFINITE``: every planned pass has ``deferred`` (and none without NONFINITE);
    it is in the call plans' switches (the launch plans' key: ``test_launch_plan_key_holds_the_switch``); a config
    with it but without nonfinite is refused."""
    for nonfinite in (False, True):
        for deferred in (False, True):
            monkeypatch.setattr(qh, "NONFINITE", nonfinite)
            monkeypatch.setattr(qh, "NONFINITE_DEFERRED", deferred)
            for recipe, d in CASES:
                keys = qh.planned_passes("sm_90a", torch.bfloat16, d, RECIPES[recipe])
                assert keys and all(key.config.deferred is (nonfinite and deferred) for key in keys), (recipe, d)
            assert quant_call._switches()[-1] is deferred
    with pytest.raises(ValueError, match="deferred"):
        qk.PassConfig(deferred=True).check(128)


@pytest.fixture
def arch(request, monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", request.param)  # read when the DSL first loads
    return request.param


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a"], indirect=True)
@pytest.mark.parametrize("head_dim", [64, 256])
def test_slow_path_compiles(arch, head_dim):
    """Every pass kind with ``nonfinite`` compiles (the slow path: Q / K read again and rotated with the overflow
    shift, one inf test per value, a barrier and a second block max) without local memory beyond the default Q pass's
    known <= 16 bytes: V with K's sums, K smoothed (staged store at 64, wide at 256), Q with the shift, the "amax" and
    "given" launches."""
    from fa_variants.common import cubin

    rows = 192 if head_dim == 64 else 128
    base = dict(stages=3, coalesced=True, head_major=True, nonfinite=True)
    cfgs = [qk.PassConfig(role="v", rotate=False, rows=rows, kmean=True, **base),
            qk.PassConfig(smooth=True, rows=rows, reverse=True, pdl=True, staged_mean=True,
                          staged_store=head_dim == 64, wide=head_dim == 256, **base),
            qk.PassConfig(shift=True, pdl=True, staged_mean=True, wide=head_dim == 256, **base),
            qk.PassConfig(mode="amax", smooth=True, rows=rows, staged_mean=True, **base),
            qk.PassConfig(mode="given", smooth=True, rows=rows, staged_mean=True, **base)]
    cfgs += [key.config for key in qh.planned_passes(arch, torch.bfloat16, head_dim, FP8Config())]  # the defaults
    for cfg in cfgs:
        c = qk.VARIANT.compiled(qk.static_config(arch, torch.bfloat16, head_dim, cfg))
        assert cubin.cubin_resources(c.cubin)["spill_bytes"] <= 16, cfg


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a"], indirect=True)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_deferred_compiles(arch, head_dim, monkeypatch):
    """``NONFINITE_DEFERRED``: the default recipe's passes with the slow path after the loop compile without local
    memory (session 36: the slow path inside the loop left the head_dim 64 Q pass 16 bytes of spill); at 128 the
    other recipes' passes compile too (no rotation: ``redo_left``'s read + signs branch; the per-head baseline's
    "amax" / "given"), without spill either (bench/NOTES.md "Session 36": a review measured up to 56 bytes on
    611af4d, before the mask of items left; none since at any recipe / head_dim on sm_90a)."""
    from fa_variants.common import cubin

    monkeypatch.setattr(qh, "NONFINITE", True)
    monkeypatch.setattr(qh, "NONFINITE_DEFERRED", True)
    recipes = ["default"] + (["no-smooth", "head-smooth", "no-rotate"] if head_dim == 128 else [])
    for name in recipes:
        keys = qh.planned_passes(arch, torch.bfloat16, head_dim, RECIPES[name])
        assert keys and all(key.config.deferred for key in keys)
        for key in keys:
            spill = cubin.cubin_resources(qk.VARIANT.compiled(key).cubin)["spill_bytes"]
            assert spill == 0, (name, key.config, spill)


# ------------------------------------------------------------------------------------------------ GPU
def _inputs(head_dim: int, seed: int):
    g = seeded_generator("cuda", seed)
    q = (torch.randn(2, 300, 4, head_dim, device="cuda", generator=g) * 2).to(torch.bfloat16)
    k = (torch.randn(2, 517, 2, head_dim, device="cuda", generator=g) - 1).to(torch.bfloat16)
    v = torch.randn(2, 517, 2, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    return q, k, v


def _poison(t: torch.Tensor, where: str, value: float, rows: int, signs: torch.Tensor) -> None:
    """One value, a whole token (every head), or a whole block of rows of head 1 (the second block, cut by the
    length if short), or the last token of the last (partial) block; "huge": a finite token of bf16's largest value,
    whose Hadamard sums overflow float32 (and some of its rotated values too); "aligned": a finite token
    1.5 x 2^128 / D times the rotation's signs, whose first Hadamard sum (D x 1.5 x 2^128 / D) overflows float32
    while every rotated value (at most 1.5 x 2^128 / sqrt(D)) is finite: only the recipe's power-of-two shift gets it
    right; "near": the last token 2^126 / D times the signs, whose sums stay finite but which the recipe shifts
    (k = 1; the pass's slow path from a block max of 2^125 / D)."""
    if where == "value":
        t[0, 5, 1, 3] = value
    elif where == "token":
        t[1, rows + 3] = value
    elif where == "block":
        t[0, rows:2 * rows, 1] = value
    elif where == "last":  # the last token of the last block, cut by the length
        t[0, -1, 1] = value
    elif where == "huge":
        t[1, 7, 0] = torch.finfo(torch.bfloat16).max
    elif where == "aligned":
        t[1, 7, 0] = (signs * (1.5 * 2.0 ** 128 / t.shape[-1])).to(t.device, t.dtype)
    else:  # "near": sums up to 2^126, no overflow, but a token the recipe shifts (k = 1)
        t[0, -1, 0] = (signs * (2.0 ** 126 / t.shape[-1])).to(t.device, t.dtype)


def _assert_bytes(ref: torch.Tensor, got: torch.Tensor, what: str) -> int:
    """e4m3 bytes equal, any NaN byte (0x7F / 0xFF) equal to any other; returns the NaN count."""
    r, g = ref.view(torch.uint8), got.view(torch.uint8)
    rn, gn = (r & 0x7F) == 0x7F, (g & 0x7F) == 0x7F
    assert torch.equal(rn, gn), (what, rn.sum().item(), gn.sum().item())
    assert torch.equal(r[~rn], g[~gn]), what
    return int(rn.sum())


def _assert_matches_torch(q, k, v, cfg: FP8Config, what: str, softmax_scale: float | None = None) -> int:
    """The pass (switch on, v3) = the torch recipe given the pass's mean; returns the NaN bytes seen.
    ``FP8Inputs.k_mean`` is the mean of the K the kernel sees (negated for a negative scale); the recipe's ``k_mean``
    argument is K's own."""
    got = qh.quantize(q, k, v, config=cfg, pipeline="v3", softmax_scale=softmax_scale)
    mean = None
    if cfg.smooth_k:
        mean = -got.k_mean if softmax_scale is not None and softmax_scale < 0 else got.k_mean
    ref = quantize_fp8_torch(q, k, v, config=cfg, k_mean=mean, softmax_scale=softmax_scale)
    nans = sum(_assert_bytes(getattr(ref, n), getattr(got, n), f"{what} {n}") for n in ("q", "k", "v_t"))
    for name in ("q_descale", "k_descale", "v_descale"):
        assert torch.equal(getattr(ref, name), getattr(got, name)), f"{what} {name}"
    if cfg.smooth_k:
        _assert_shift(got.lse_shift, ref.lse_shift, q, ref.k_mean, ref.softmax_scale, what)
    return nans


def _assert_shift(got, want, q, mean, scale, what):
    """The LSE shift: NaN, inf and -inf where torch has them; finite values within tests/test_fp8_quant_kernel.py's
    ``assert_shift_close`` bound (1e-6 * scale * sum_d |q_d mean_d|: two float32 summation orders)."""
    g, w = got.double(), want.double()
    for f in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(f(g), f(w)), (what, f.__name__)
    B, Nq, H, D = q.shape
    Hkv = mean.shape[1]
    bound = torch.einsum("bqkgd,bkd->bkgq", q.double().abs().reshape(B, Nq, Hkv, H // Hkv, D),
                         mean.double().abs()).reshape(B, H, Nq) * scale
    fin = torch.isfinite(w)
    assert ((g - w).abs()[fin] <= 1e-6 * bound[fin] + 1e-30).all(), what


@pytest.mark.gpu
@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("recipe,head_dim", CASES, ids=[f"{r}-d{d}" for r, d in CASES])
def test_pass_matches_torch_on_non_finite(monkeypatch, recipe, head_dim, place):
    """inf / -inf / NaN in Q, K or V (one value, a whole token, a whole block of a head) and a finite token whose
    Hadamard overflows: the pass with ``NONFINITE`` equals the torch recipe (module docstring); the rows that hold one
    have NaN bytes, the other values of their blocks are not zeroed (descale from the finite values). Both places of
    the slow path: in the loop, and after it (``NONFINITE_DEFERRED``: the blocks left redone; ``PLACES``)."""
    monkeypatch.setattr(qh, "NONFINITE", True)
    monkeypatch.setattr(qh, "NONFINITE_DEFERRED", PLACES[place][0])
    monkeypatch.setattr(qh, "GRID_CAP", PLACES[place][1])
    cfg = RECIPES[recipe]
    tile_m, tile_n = tiles_for(head_dim)
    clean = _inputs(head_dim, 3 * head_dim)
    signs = HadamardRotation(head_dim, cfg.seed).signs
    finite = ("huge", "aligned", "near")
    for name, rows in (("q", tile_m), ("k", tile_n), ("v", tile_n)):
        for where in ("value", "token", "block", "last") + finite:
            for label, value in BAD.items() if where not in finite else [("max", 0.0)]:
                q, k, v = (t.clone() for t in clean)
                _poison({"q": q, "k": k, "v": v}[name], where, value, rows, signs)
                what = f"{name} {where} {label}"
                nans = _assert_matches_torch(q, k, v, cfg, what)
                # huge: NaN where a rotated value overflows float32 (not in V); aligned, near: none (the shift)
                assert nans > 0 or where in finite, what
                assert nans == 0 or where not in ("aligned", "near"), (what, nans)
                if where == "value" and name == "q":  # the block's other rows keep their values (not zeroed)
                    got = qh.quantize(q, k, v, config=cfg, pipeline="v3")
                    block = got.q[0, :tile_m, 1].float()
                    assert got.q_descale[0, 1, 0] < 2.0 ** 10 and block[block.isfinite()].abs().max() > 0, what
    q, k, v = (t.clone() for t in clean)  # a negative scale: K's signs negated (-s), the same shift
    _poison(k, "aligned", 0.0, tile_n, -signs)
    assert _assert_matches_torch(q, k, v, cfg, "k aligned, softmax_scale -0.5", softmax_scale=-0.5) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("deferred", [False, True], ids=["inloop", "deferred"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_finite_inputs_unchanged(monkeypatch, head_dim, deferred):
    """Finite inputs (with an all-zero block and a subnormal one): the switch changes no output bit (the slow path
    is never taken, nor with ``NONFINITE_DEFERRED`` any redo), the default recipe (and the per-head one at 128);
    and off, an inf in V saturates to 448 (the behaviour this fixes)."""
    monkeypatch.setattr(qh, "NONFINITE_DEFERRED", deferred)
    q, k, v = _inputs(head_dim, 7 * head_dim)
    v[0, :64, 0] = 0
    k[1, 200:300, 1] = 1e-40
    for cfg in [RECIPES["default"]] + ([RECIPES["head-smooth"]] if head_dim == 128 else []):
        outs = []
        for on in (False, True):
            monkeypatch.setattr(qh, "NONFINITE", on)
            outs.append(qh.quantize(q, k, v, config=cfg, pipeline="v3"))
        a, b = outs
        for name in ("q", "k", "v_t"):
            assert torch.equal(getattr(a, name).view(torch.uint8), getattr(b, name).view(torch.uint8)), name
        for name in ("q_descale", "k_descale", "v_descale", "k_mean", "lse_shift"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    monkeypatch.setattr(qh, "NONFINITE", False)
    v[0, 3, 1, 5] = math.inf
    old = qh.quantize(q, k, v, config=RECIPES["default"], pipeline="v3")
    assert not torch.isnan(old.v_t.float()).any() and old.v_t.float().abs().max() == 448


def _exact(q, k, v, causal: bool) -> torch.Tensor:
    """float64 attention (B, N, H, D), GQA by repeating K / V."""
    group = q.shape[2] // k.shape[2]
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)))
    return torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=causal).transpose(1, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_fa3_fp8_rows_that_read_it(rng_seed, monkeypatch, fp8_kernel, name):
    """fa3-fp8 on bf16 inputs (default recipe, head_dim 128, causal) with an inf or NaN in Q (row 5 of head 1), K or V
    (key 7 of kv-head 0): the rows that read it are non-finite (Q: that row; V: the causal rows 7.. of the heads of
    kv-head 0; K: with smoothing K's mean spreads it, every row of those heads); every finite row is within
    ``fp8_error_bound`` of float64 attention on the inputs (the emulation run on the same FP8Inputs), and a row is
    never finite and wrong. Without the switch an inf in Q zeroed the other rows of its block (a finite wrong O)."""
    from fa_variants import fp8

    monkeypatch.setattr(qh, "NONFINITE", True)
    for value in (math.inf, math.nan):
        g = torch.Generator(device="cuda").manual_seed(rng_seed)
        q, k, v = (torch.randn(1, 300, n, 128, device="cuda", generator=g).to(torch.bfloat16) for n in (4, 2, 2))
        if name == "q":
            q[0, 5, 1, 3] = value
        else:
            {"k": k, "v": v}[name][0, 7, 0, 3] = value
        inp = fp8.quantize_fp8(q, k, v)
        out = fp8.attention_from_fp8(inp, causal=True)
        emu, _ = fp8.emulate_fp8_attention(inp, causal=True)
        clean = [t.clone() for t in (q, k, v)]
        clean[{"q": 0, "k": 1, "v": 2}[name]].nan_to_num_(nan=0.0, posinf=0.0)
        exact = _exact(*clean, causal=True)  # the finite rows did not read the value: their answer without it
        finite = torch.isfinite(out.float()).all(-1)  # (1, 300, 4)
        if name == "q":
            assert not finite[0, 5, 1] and finite.sum() == finite.numel() - 1, value
        else:
            assert not finite[0, 7:, :2].any(), value  # query heads 0, 1 read kv-head 0 from key 7 on
            assert finite[0, :, 2:].all(), value  # kv-head 1 untouched
        emu_ok = torch.isfinite(emu).all(-1) & finite
        bound = fp8.fp8_error_bound(emu[emu_ok], exact[emu_ok])
        err = (out.double() - exact)[finite].abs().max().item()
        assert err <= bound, (name, value, err, bound)
