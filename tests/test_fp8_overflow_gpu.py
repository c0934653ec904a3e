"""fa3-fp8 on adversarial V (session 10; scripts/bounded_gpu.sh): per-K/V-tile scales from 2^-120 (descale at the
quantiser's floor 2^-110) to 2^20, zero blocks, tiny blocks first / last / many, V entirely ~1e-35, seqlen_k 4500,
GQA, causal and not, at head_dims 64 / 96 / 128 / 256 (``OVERFLOW_VARIANTS``: the defaults; the head_dim 256 one, the
only fused_promote config, has ``bounded_units`` since session 11). Every output finite, against the emulation (O in
absolute units, the bounded kernel's values) and float64 with the bounds of tests/test_fa3_fp8_gpu.py.
``test_fused_units_fault`` pins the fault the switch removes: the head_dim 256 default with bounded_units=False
(fused_promote alone, the default of sessions 9-10) gives inf on "late_large", as the float32 model of its units
(emulation ``units="tile"``) does."""
import dataclasses

import pytest
import torch

from helpers import assert_fp8_matches_emulation, seeded_generator

pytestmark = pytest.mark.gpu

# name: (head_dim, switches on DEFAULT_CONFIGS[head_dim]); the head_dim 256 default has fused_promote (with
# s_lookahead: the only schedule that takes it since session 10) and bounded_units (since session 11): the defaults
# must all be finite
OVERFLOW_VARIANTS = {"d64-default": (64, {}), "d96-default": (96, {}), "d128-default": (128, {}), "d256-default": (256, {})}
SHAPE = (1, 300, 4500, 4, 2)  # (B, Nq, Nk, H, Hkv): GQA, a partial last tile; causal rows see 4201..4500 keys


def v_exponents(case: str, tiles: int) -> list[float | None]:
    """Per K/V tile: the exponent V is scaled by (2^e), -120 for a tiny block (descale 2^-110), None for zeros.
    Tiles are visited last to first: a large tile visited before a tiny one is the overflow."""
    if case == "late_large":
        return [-120] + [0] * (tiles - 2) + [20]
    if case == "tiny_first_last":
        return [-120] + [12 if t % 2 else -4 for t in range(1, tiles - 1)] + [-120]
    if case == "many_tiny":
        return [-120 if t % 3 == 1 else 16 for t in range(tiles)]
    if case == "zeros":
        return [None if t % 4 == 2 else (-120 if t % 4 == 0 else 20) for t in range(tiles)]
    return [0] * tiles  # "all_tiny": the caller scales the whole V by 1e-35


CASES = ["late_large", "tiny_first_last", "many_tiny", "zeros", "all_tiny"]


def _config(fp8_kernel, name):
    D, change = OVERFLOW_VARIANTS[name]
    return D, dataclasses.replace(fp8_kernel.DEFAULT_CONFIGS[D], **change)


def _inputs(D, tile_n, case, seed):
    B, Nq, Nk, H, Hkv = SHAPE
    g = seeded_generator("cuda", seed)
    q, k, v = (torch.randn(B, n, h, D, device="cuda", generator=g) for n, h in ((Nq, H), (Nk, Hkv), (Nk, Hkv)))
    tiles = -(-Nk // tile_n)
    ex = v_exponents(case, tiles)
    scale = torch.tensor([0.0 if e is None else 2.0**e for e in ex], device="cuda").repeat_interleave(tile_n)[:Nk]
    v = v * scale.view(1, -1, 1, 1) * (1e-35 if case == "all_tiny" else 1.0)
    return q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16)


def _run(fp8_kernel, nan_allocations, cfg, q, k, v, causal, units="absolute"):
    from fa_variants import fp8
    from fa_variants.fp8.quantize import quantize_fp8_torch

    recipe = fp8.FP8Config(two_level=cfg.two_level, promote_every=cfg.promote_every)
    inp = quantize_fp8_torch(q, k, v, config=recipe, block_n=cfg.tile_n)
    with nan_allocations():
        out, lse = fp8_kernel.run_fp8(inp, causal=causal, out_dtype=torch.bfloat16, config=cfg)
    emu32, emu_lse = fp8.emulate_fp8_attention(inp, causal=causal, tile_m=cfg.tile_m, units=units)
    return inp, out, lse, emu32, emu_lse


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", list(OVERFLOW_VARIANTS))
def test_adversarial_v(fp8_kernel, nan_allocations, name, case, causal):
    from fa_variants.reference import attention_reference

    D, cfg = _config(fp8_kernel, name)
    q, k, v = _inputs(D, cfg.tile_n, case, seed=17 + CASES.index(case) + 5 * causal)
    inp, out, lse, emu32, emu_lse = _run(fp8_kernel, nan_allocations, cfg, q, k, v, causal)
    if case != "all_tiny":
        assert (inp.v_descale == 2.0**-110).any()  # a tiny block at the floor
    exact, _ = attention_reference(q, k, v, causal=causal, dtype=torch.float64)
    facts = assert_fp8_matches_emulation(out, lse, emu32, emu_lse, exact, variant=name, case=case)
    if case == "all_tiny":  # not flushed: O ~1e-35, as close to float64 (relative) as at scale 1
        assert out.float().abs().max() > 1e-37, facts
        rel = float((out.double() - exact).norm() / exact.norm())
        assert rel <= 2 * float((emu32.double() - exact).norm() / exact.norm()) + 1e-2, (rel, facts)


def test_fused_units_fault(fp8_kernel, nan_allocations):
    """Without bounded_units, fused_promote's O / v_descale overflows on "late_large" (a 2^20 tile visited first, a tiny
    one last): the head_dim 256 default with bounded_units=False gives non-finite O where the float32 model of its
    units (emulation units="tile") does (the default itself: test_adversarial_v[d256-default-late_large-*])."""
    D = 256
    assert fp8_kernel.DEFAULT_CONFIGS[D].bounded_units  # the default since session 11; the fault needs it off
    cfg = dataclasses.replace(fp8_kernel.DEFAULT_CONFIGS[D], bounded_units=False)
    q, k, v = _inputs(D, cfg.tile_n, "late_large", seed=17)
    _, out, _, emu_tile, _ = _run(fp8_kernel, nan_allocations, cfg, q, k, v, False, units="tile")
    assert not torch.isfinite(emu_tile).all() and not torch.isfinite(out).all()
