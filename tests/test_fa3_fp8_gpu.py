"""fa3-fp8 end to end on an sm90 GPU: the kernel against its emulation on the same quantised inputs, and
against float64 attention on the unquantised inputs (issue 10, "H200 correctness"). Owned by fp8quant (the
recipe, the API and the emulation); the kernel's own tests are tests/test_fa3_fp8_kernel.py.

The matrix: head_dim 64, 128, 256 x causal x shapes (seqlen 1, 113, 1023, 4224; Nq != Nk; GQA and MQA) with
the default recipe, and every recipe (granularity block / head / tensor x rotate x two-level) at one shape
per head_dim. Inputs fresh each run (seeded by the test id, printed on failure), outputs NaN-poisoned.

Bounds, and their history. First stated before any GPU run (rel-L2 5e-3, LSE 1e-3, on the theory that only
MUFU.EX2's ulps separate kernel and emulation); the H200 (2026-11-30, two runs, 76 cases each) then measured
rel-L2 2.6e-3 to 7.6e-3 and LSE up to 1.07e-3 against the emulation's older accumulator model ("truncate"),
and the bounds became 1e-2 / 1.5e-3. The cause of the gap (bench/NOTES.md, FA3-FP8): the FP8 tensor core's dot
product is a block-floating-point sum (each k = 32 group of products and the incoming accumulator aligned to
the largest exponent, cut toward zero 13 fraction bits below it), read directly by scripts/fp8_mma_probe.py;
against that model, now the emulation's default (``accumulator="blockfp"``), the H200 measured rel-L2
1.7e-3 to 2.8e-3 (D 64/128/256, N 2048, default recipe) where the old model gave 4.2e-3 to 7.2e-3. The rest is
P values within ~1e-5 of an e4m3 rounding tie that the kernel (MUFU.EX2) and torch round to different sides.
The bounds now (the emulation walks the kernel's tiles: FP8Inputs.block_n keys per K/V tile, layout.tile_m rows):
* kernel vs emulation (``fa_variants.fp8.emulate_fp8_attention``, default model, same FP8Inputs, O rounded to
  the output dtype): rel-L2 <= ``helpers.FP8_REL_L2_BOUND`` = 6e-3 (tightened from 1e-2: ~2x the block-FP model's measured
  worst, and below the old model's measured worst, 7.6e-3, so a regression to that level fails);
  max |diff| <= 3e-2 * max|V| + 2^-7 * max|O| (never exceeded on the H200); LSE max |diff| <= 1.5e-3 (kept:
  no full-matrix LSE figures under the new model yet) on rows that see a key, -inf on the same rows.
* kernel vs float64 of the unquantised inputs: max |diff| <= ``fp8_error_bound`` (2 x the emulation's own
  max error + 1e-4), the project's rule with the emulation in the place of "torch in the same dtype".
With ``FA_VARIANTS_FP8_STATS=<file>`` each case appends its figures (JSON lines) to that file:
scripts/fa3_fp8_speed_ab.py reports the worst of them, the data for the next tightening.

    source .gpu/env.sh && python3 -m pytest -m gpu tests/test_fa3_fp8_gpu.py -q
"""
import dataclasses
import json
import os
import zlib

import pytest
import torch

from fa_variants import fp8
from fa_variants.common.scale import LOG2_E
from fa_variants.fp8 import FP8Config
from fa_variants.reference import attention_reference, rel_l2
from helpers import assert_fp8_matches_emulation, assert_huge_logits_ok, seeded_generator

pytestmark = pytest.mark.gpu

SHAPES = [  # (batch, seqlen_q, seqlen_k, num_heads, num_heads_kv)
    (2, 1, 1, 4, 4),
    (1, 113, 113, 4, 2),
    (1, 1023, 1023, 6, 2),
    (1, 4224, 4224, 2, 1),
    (2, 113, 1023, 4, 1),
    (1, 1023, 113, 3, 3),  # Nq > Nk: causal rows that see no key
]
RECIPES = [FP8Config(granularity=g, rotate=r, smooth_k=r, two_level=t)
           for g in ("block", "head", "tensor") for r in (True, False) for t in (True, False)]


def inputs(shape, head_dim, seed, dtype=torch.bfloat16, outliers=0.0):
    B, Nq, Nk, H, Hkv = shape
    g = seeded_generator("cuda", seed)

    def draw(n, heads):
        x = torch.randn(B, n, heads, head_dim, device="cuda", generator=g)
        if outliers:
            x = x + 10 * torch.randn(x.shape, device="cuda", generator=g) * (
                torch.rand(x.shape, device="cuda", generator=g) < outliers)
        return x.to(dtype)
    return draw(Nq, H), draw(Nk, Hkv), draw(Nk, Hkv)


def seed_of(request) -> int:
    return zlib.crc32(request.node.nodeid.encode()) ^ torch.randint(0, 2**30, ()).item()


def _record(facts: dict) -> None:
    path = os.environ.get("FA_VARIANTS_FP8_STATS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(facts) + "\n")


def check(q, k, v, causal, config, seed, nan_allocations, case=""):
    """The two comparisons of the module docstring; returns the numbers for the failure message."""
    with nan_allocations():
        inp = fp8.quantize_fp8(q, k, v, config=config)
        out, lse = fp8.attention_from_fp8(inp, causal=causal, return_lse=True, out_dtype=q.dtype)
    emu32, emu_lse = fp8.emulate_fp8_attention(inp, causal=causal)
    emu = emu32.to(q.dtype)  # = emulate_fp8_attention(..., out_dtype=q.dtype)
    if inp.lse_shift is not None:
        emu_lse = emu_lse + inp.lse_shift
    exact, _ = attention_reference(q, k, v, causal=causal, dtype=torch.float64)
    vmax = v.double().abs().max().item()
    facts = assert_fp8_matches_emulation(
        out, lse, emu32, emu_lse, exact, record=_record, case=case, seed=seed,
        max_diff=(out.double() - emu.double()).abs().max().item(), vmax=vmax,
        max_diff_bound=3e-2 * vmax + 2**-7 * emu.double().abs().max().item())
    assert facts["max_diff"] <= facts["max_diff_bound"], facts


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_default_recipe(fp8_kernel, shape, head_dim, causal, request, nan_allocations):
    seed = seed_of(request)
    check(*inputs(shape, head_dim, seed), causal, FP8Config(), seed, nan_allocations, request.node.name)


@pytest.mark.parametrize("config", RECIPES, ids=lambda c: f"{c.granularity}-rot{int(c.rotate)}-2lvl{int(c.two_level)}")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_every_recipe(fp8_kernel, config, head_dim, request, nan_allocations):
    seed = seed_of(request)
    check(*inputs((1, 1023, 1500, 4, 2), head_dim, seed, dtype=torch.float16), True, config, seed, nan_allocations,
          request.node.name)


HUGE_MODES = {"checked": dict(huge_guard=False, huge_hoisted=False), "guarded": dict(huge_guard=True, huge_hoisted=False),
              "hoisted": dict(huge_hoisted=True, huge_guard=False)}


@pytest.mark.parametrize("mode", list(HUGE_MODES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("softmax_scale", [1e4, 1e9])
def test_huge_logits(fp8_kernel, softmax_scale, head_dim, causal, mode, request, nan_allocations):
    """EC-04 with block scales on the kernel (``OnlineSoftmax._huge_tile_row``; the emulation's
    test_huge_logits_keep_the_row_max): scaled logits of ~2^18 and ~2^35 in log2 units, several K/V tiles, GQA,
    against float64 attention over the dequantised inputs (helpers.assert_huge_logits_ok): no row 0 or -inf, the
    clear rows one-hot. Not against the emulation: a near tie that the QGMMA and the emulation's accumulator break
    differently moves a whole row there. "guarded": ``Fp8Config.huge_guard`` (the check where it can matter);
    "hoisted": ``Fp8Config.huge_hoisted`` (decided once per warpgroup before its free tiles)."""
    seed = seed_of(request)
    q, k, v = inputs((1, 300, 700, 4, 2), head_dim, seed)
    config = dataclasses.replace(fp8_kernel.DEFAULT_CONFIGS[head_dim], **HUGE_MODES[mode])
    with nan_allocations():
        inp = fp8.quantize_fp8(q, k, v, softmax_scale=softmax_scale)
        out, lse = fp8_kernel.run_fp8(inp, causal=causal, out_dtype=q.dtype, config=config)  # LSE: the kernel's logits
    assert_huge_logits_ok(out, lse, inp, causal, what=f"seed {seed}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_hoisted_mixed_paths(fp8_kernel, head_dim, causal, request, nan_allocations):
    """``Fp8Config.huge_hoisted`` with both K/V loops in one call: query row 130 scaled by 32 lifts the descale of
    its Q scale block (rows 128-255), so c_n ``max_score`` passes 2^11 there and the warpgroups of those rows run
    the checked loop, while the other warpgroups run the plain one. At head_dim 64 (192-row tiles) one CTA holds
    both (rows 0-191: warpgroups 0-1 plain, 2 checked), handing the ping-pong turn to each other; at 128 and 256 the
    query tile is the scale block, so the two loops run in different CTAs. Every logit stays far below 2^11 in log2 units, so both loops must give
    the emulation's values (helpers.assert_fp8_matches_emulation, and float64), row 130 aside (its logits are 32
    times larger, and so are their accumulator errors): that row only finite."""
    seed = seed_of(request)
    q, k, v = inputs((1, 700, 900, 4, 2), head_dim, seed)
    q[:, 130] *= 32
    config = dataclasses.replace(fp8_kernel.DEFAULT_CONFIGS[head_dim], huge_hoisted=True, huge_guard=False)
    inp = fp8.quantize_fp8(q, k, v, config=FP8Config(two_level=config.two_level, promote_every=config.promote_every))
    c = inp.q_descale[0, 0].float() * inp.k_descale.max().float() * inp.softmax_scale * LOG2_E
    reach = c * fp8_kernel.max_score(head_dim)  # the largest |m| each Q scale block's descales allow, in log2 units
    assert reach[1] >= 2**11 and (reach[0] < 2**11) and (reach[2:] < 2**11).all(), reach  # both loops run
    with nan_allocations():
        out, lse = fp8_kernel.run_fp8(inp, causal=causal, out_dtype=q.dtype, config=config)
    emu32, emu_lse = fp8.emulate_fp8_attention(inp, causal=causal, tile_m=config.tile_m)
    exact, _ = attention_reference(q, k, v, causal=causal, dtype=torch.float64)
    keep = torch.arange(q.shape[1], device=q.device) != 130
    assert torch.isfinite(out[:, 130]).all() and torch.isfinite(lse[:, :, 130]).all()
    assert_fp8_matches_emulation(out[:, keep], lse[:, :, keep], emu32[:, keep], emu_lse[:, :, keep], exact[:, keep],
                                 variant="hoisted-mixed", seed=seed)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_hoisted_vote_finds_one_huge_tile(fp8_kernel, head_dim, causal, request, nan_allocations):
    """``Fp8Config.huge_hoisted``'s vote must see every tile: 40 K/V tiles (a lane reads tiles i, i + 32), one free
    tile, number 33 (lane 1's second read), with keys scaled by 2^33 (logits ~2^34 in log2 units, where the plain
    loop's one-FFMA exponent turns rows into 0 or -inf, session 27), the others ordinary. K not smoothed (the mean
    of that tile would spread it into every tile). A vote that missed tile 33 runs the plain loop there:
    helpers.assert_huge_logits_ok fails (rows 0 / -inf, LSE off)."""
    seed = seed_of(request)
    tile_n = fp8.layout.tile_n(head_dim)
    q, k, v = inputs((1, 300, 40 * tile_n + 100, 2, 1), head_dim, seed)
    k[:, 33 * tile_n:34 * tile_n] *= 2.0**33
    config = dataclasses.replace(fp8_kernel.DEFAULT_CONFIGS[head_dim], huge_hoisted=True, huge_guard=False)
    with nan_allocations():
        inp = fp8.quantize_fp8(q, k, v, config=FP8Config(smooth_k=False))
        out, lse = fp8_kernel.run_fp8(inp, causal=causal, out_dtype=q.dtype, config=config)
    c = inp.q_descale.float().amax() * inp.k_descale[0, 0].float() * inp.softmax_scale * LOG2_E
    reach = c * fp8_kernel.max_score(head_dim)
    assert reach[33] >= 2**31 and (reach[:33] < 2**11).all() and (reach[34:] < 2**11).all(), reach  # one huge tile
    assert_huge_logits_ok(out, lse, inp, causal, what=f"seed {seed}")


def test_empty_rows_and_no_keys(fp8_kernel, nan_allocations):
    q, k, v = inputs((1, 300, 100, 4, 2), 128, 7)
    with nan_allocations():
        out, lse = fp8.attention_fp8(q, k, v, causal=True, return_lse=True)
    assert (out[:, :200] == 0).all() and torch.isneginf(lse[:, :, :200]).all() and torch.isfinite(lse[:, :, 200:]).all()
    with nan_allocations():
        out, lse = fp8.attention_fp8(q, k[:, :0], v[:, :0], return_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_through_the_dispatcher(fp8_kernel):
    import fa_variants

    q, k, v = inputs((1, 257, 257, 4, 2), 128, 11)
    sel = fa_variants.select_backend(q, k, v, backend="fa3-fp8")
    assert "quantised to e4m3" in sel.reason
    assert fa_variants.select_backend(q, k, v).backend != "fa3-fp8"  # auto never picks FP8 for bf16
    out = fa_variants.attention(q, k, v, causal=True, backend="fa3-fp8")
    ref, _ = attention_reference(q, k, v, causal=True, dtype=torch.float64)
    assert out.dtype == q.dtype and rel_l2(out, ref) < 0.08


def test_outliers_block_hadamard_vs_per_tensor(fp8_kernel):
    """FA3 Table 3's inputs (N(0,1) + N(0,100) on 0.1% of entries), N = 4096, D = 128: the issue asks for
    block + Hadamard RMSE at most half of per-tensor's. The CPU emulation at N = 512 measured 8.6e-3 vs
    1.42e-2 (0.6x) on test_fp8_emulation.py's inputs (fa3_outlier_inputs, its seed; `fp8-study --quick`'s seeds give
    1.20e-2 vs 1.66e-2): this test prints the kernel's figures and asserts the issue's target."""
    q, k, v = inputs((1, 4096, 4096, 8, 8), 128, 3, outliers=1e-3)
    exact, _ = attention_reference(q, k, v, dtype=torch.float64)
    rmse = {}
    for name, cfg in (("tensor", FP8Config("tensor", rotate=False, smooth_k=False)),
                      ("block+H", FP8Config(smooth_k=False)), ("shipped", FP8Config())):
        out = fp8.attention_fp8(q, k, v, config=cfg)
        rmse[name] = (out.double() - exact).pow(2).mean().sqrt().item()
    print("fa3-fp8 RMSE on FA3 Table 3 inputs:", rmse)
    assert rmse["block+H"] <= 0.5 * rmse["tensor"], rmse


@pytest.mark.parametrize("two_level", [True, False], ids=["2lvl1", "2lvl0"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_zero_v_blocks_long_rows_d256(fp8_kernel, causal, two_level, request, nan_allocations):
    """The head_dim 256 default (fused_promote: O kept in units of the V tiles' descales, bounded_units since session
    11) and the one accumulator (O / v_descale of the current V tile), on 4096 keys whose first and last 128-key V
    blocks are all zeros (zero padding; the first is visited last) after rows whose unnormalised O reached ~2^20
    (V ~ (N(0,1) + 1) 2^8, Q / 4: a near-uniform softmax, |O| ~ 2^8, l ~ 4000). Those blocks get descale 1 (session 9; the floor 2^-110 before: O / v_descale overflowed to inf /
    NaN, as tests/test_fp8_emulation.py shows for the one accumulator): finite output, the module's bounds vs the
    emulation and float64."""
    seed = seed_of(request)
    q, k, v = inputs((1, 512, 4096, 2, 1), 256, seed)
    q = (q.float() / 4).to(torch.bfloat16)
    v = ((v.float() + 1) * 2.0**8).to(torch.bfloat16)
    v[:, :128] = 0
    v[:, -128:] = 0
    config = FP8Config(two_level=two_level)
    inp = fp8.quantize_fp8(q, k, v, config=config)
    assert inp.block_n == 128 and (inp.v_descale[..., [0, -1]] == 1).all() and (inp.v_descale[..., 1:-1] > 1).all()
    check(q, k, v, causal, config, seed, nan_allocations, case=f"zero-v-blocks-d256-causal{int(causal)}")


def test_no_drift_with_length(fp8_kernel):
    """rel-L2 at seqlen_k 128k at most 1.5x that at 1k with two-level accumulation on (issue 10); the single
    accumulator's figures are printed beside it (the drift the two-level scheme removes)."""
    errs = {}
    for nk in (1024, 131072):
        q, k, v = inputs((1, 128, nk, 2, 2), 128, 5)
        v = v + 1  # a non-zero mean, so O does not average to ~0 at long length
        exact, _ = attention_reference(q, k, v, dtype=torch.float64)
        for two_level in (True, False):
            out = fp8.attention_fp8(q, k, v, config=FP8Config(two_level=two_level))
            errs[two_level, nk] = rel_l2(out, exact)
    print("fa3-fp8 rel-L2 by (two_level, seqlen_k):", errs)
    assert errs[True, 131072] <= 1.5 * errs[True, 1024], errs
