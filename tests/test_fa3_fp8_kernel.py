"""fa3-fp8 kernel (issue 10 item 2): argument checks on the CPU; on an sm90 GPU, the kernel against a
float64 model of its own numerics (same quantised inputs, same tile order, same P shift and e4m3 rounding
of P, same two-level accumulation) and against the float64 attention of the unquantised inputs.

The quantisation here is a plain per-block absmax / 448 in torch (the FP8 contract's layout: v_t
transposed, token-permuted, padded), so the kernel is tested independently of fa_variants.fp8.quantize.

Bounds, kernel vs model (same inputs): rel-L2 <= 2e-2 and max |diff| <= 6e-2 * max|V|. They are set by
P's e4m3 rounding: MUFU.EX2 (about 2 ulp) and the FP8 WGMMA accumulation (block floating point, 13 fraction
bits below each k = 32 chunk's largest term: up to ~1e-3 on a logit at head_dim 256) move fp32 P, enough to
send an element across an e4m3 rounding midpoint now and then, which changes that P by one e4m3 step (2^-4
relative) in the kernel and not in the model. The LSE within ``lse_tolerance``: the accumulator's worst case
on the row's scores, weighted by the row's softmax, + 1e-3. Kernel vs float64 of the unquantised inputs:
rel-L2 <= 8e-2 (the e4m3 floor on N(0, 1) inputs is ~5%, mostly P's rounding); LSE within the largest
logit change quantisation made on its row, + the same tolerance.

    source .gpu/env.sh && python3 -m pytest -m gpu tests/test_fa3_fp8_kernel.py
"""
import dataclasses
import math

import pytest
import torch

from fa_variants.fp8 import layout
from fa_variants.reference import attention_reference, causal_visible, rel_l2
from helpers import gqa_scores, largest_score_change, qk_accumulator_errors, seeded_generator

E4M3 = torch.float8_e4m3fn
LOG2_E = math.log2(math.e)


# --------------------------------------------------------------------------------------------- helpers


def quantize(x, block):
    """x (B, N, H, D) float -> (x8 (B, N, H, D) e4m3, descale (B, H, cdiv(N, block)) float32): one
    absmax / 448 scale per block of `block` tokens per (batch, head); an all-zero block gets scale 1."""
    B, N, H, D = x.shape
    nb = -(-N // block)
    if N == 0:
        return x.to(E4M3), torch.ones(B, H, 0, dtype=torch.float32, device=x.device)
    pad = torch.zeros(B, nb * block, H, D, dtype=torch.float32, device=x.device)
    pad[:, :N] = x.float()
    amax = pad.view(B, nb, block, H, D).abs().amax(dim=(2, 4))  # (B, nb, H)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    x8 = (pad.view(B, nb, block, H, D) / scale[:, :, None, :, None]).to(E4M3).view(B, nb * block, H, D)[:, :N]
    return x8.contiguous(), scale.permute(0, 2, 1).contiguous()


def token_descales(descale, block, n):
    """descale (B, H, cdiv(n, block)), one per block of `block` tokens -> (B, H, n) float64, one per token."""
    return descale.double().repeat_interleave(block, dim=2)[:, :, :n]


def dequantize(x8, descale, block):
    """x8 (B, N, H, D) e4m3 with its per-block descale (``quantize``) -> (B, N, H, D) float64 (exact products)."""
    return x8.double() * token_descales(descale, block, x8.shape[1]).permute(0, 2, 1)[..., None]


def to_v_t(v8):
    """(B, N, Hkv, D) e4m3 -> v_t (B, Hkv, D, padded N), tokens permuted by layout.v_token_order."""
    B, N, H, D = v8.shape
    n_pad = layout.padded_seqlen_k(N)
    vt = torch.zeros(B, H, D, n_pad, dtype=torch.uint8, device=v8.device)
    vt[..., :N] = v8.view(torch.uint8).permute(0, 2, 3, 1)
    return vt[..., layout.v_token_order(n_pad).to(v8.device)].view(E4M3).contiguous()


def quantized_inputs(B, Nq, Nk, H, Hkv, D, device, gen, tile_n=None):
    q = torch.randn(B, Nq, H, D, device=device, generator=gen)
    k = torch.randn(B, Nk, Hkv, D, device=device, generator=gen)
    v = torch.randn(B, Nk, Hkv, D, device=device, generator=gen)
    bn = tile_n or layout.tile_n(D)
    q8, qd = quantize(q, layout.TILE_M)
    k8, kd = quantize(k, bn)
    v8, vd = quantize(v, bn)
    return (q, k, v), (q8, k8, to_v_t(v8), qd, kd, vd), v8


def model(q8, k8, v8, qd, kd, vd, scale, causal, tile_n, two_level=True):
    """The kernel's numerics in float64 (P rounded to e4m3 as the kernel does). Returns (out, lse)."""
    B, Nq, H, D = q8.shape
    Nk, Hkv = k8.shape[1], k8.shape[2]
    g = H // Hkv
    out = torch.zeros(B, Nq, H, D, dtype=torch.float64, device=q8.device)
    lse = torch.full((B, H, Nq), -math.inf, dtype=torch.float64, device=q8.device)
    nb = -(-Nk // tile_n)
    rows = torch.arange(Nq, device=q8.device)[:, None]
    for b in range(B):
        for h in range(H):
            kh = h // g
            qdv = qd[b, h].double().repeat_interleave(layout.TILE_M)[:Nq, None]  # per row
            m = torch.full((Nq, 1), -math.inf, dtype=torch.float64, device=q8.device)
            l = torch.zeros(Nq, 1, dtype=torch.float64, device=q8.device)
            o = torch.zeros(Nq, D, dtype=torch.float64, device=q8.device)
            for n in reversed(range(nb)):  # the kernel walks K/V tiles last to first
                cols = torch.arange(n * tile_n, min(Nk, (n + 1) * tile_n), device=q8.device)
                s = q8[b, :, h].double() @ k8[b, cols, kh].double().T  # raw e4m3 products
                visible = cols[None, :] <= rows + Nk - Nq if causal else torch.ones_like(s, dtype=torch.bool)
                s = torch.where(visible, s, -math.inf)
                c = qdv * kd[b, kh, n].double() * max(scale, 1.1754943508222875e-38) * LOG2_E
                m_new = torch.maximum(m, (s.amax(dim=1, keepdim=True) * c))
                m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
                p = torch.exp2(s * c - m_safe + 8.0)
                alpha = torch.exp2(m - m_safe)
                l = alpha * l + p.sum(dim=1, keepdim=True)
                tmp = p.float().to(E4M3).double() @ v8[b, cols, kh].double()
                o = alpha * o + vd[b, kh, n].double() * tmp
                m = m_new
            ok = l[:, 0] > 0
            out[b, :, h] = torch.where(ok[:, None], o / l, 0.0)
            lse[b, h] = torch.where(ok, (m[:, 0] + torch.log2(l[:, 0]) - 8.0) * math.log(2), -math.inf)
    return out, lse


# ------------------------------------------------------------------------------------------- CPU checks

fa3_fp8 = pytest.importorskip("fa_variants.hopper.fa3_fp8")


def _cpu_args(**change):
    g = seeded_generator()
    _, (q8, k8, vt, qd, kd, vd), _ = quantized_inputs(1, 5, 7, 2, 1, 64, "cpu", g)
    args = dict(q8=q8, k8=k8, v_t8=vt, q_descale=qd, k_descale=kd, v_descale=vd)
    args.update(change)
    return args


@pytest.mark.parametrize("change, match", [
    (dict(q8=torch.zeros(1, 5, 2, 64)), "q8 must be torch.float8_e4m3fn"),
    (dict(v_t8=torch.zeros(1, 1, 64, 7, dtype=E4M3)), "v_t8 must be"),
    (dict(q8=torch.zeros(1, 5, 2, 80, dtype=E4M3)), "head_dim 80"),
    (dict(k_descale=torch.ones(1, 1, 2)), "k_descale must be float32 of shape"),
    (dict(q_descale=torch.ones(1, 2, 1, dtype=torch.float64)), "q_descale must be float32"),
    (dict(k8=torch.zeros(1, 7, 3, 64, dtype=E4M3)), "num_heads 2 is not divisible"),
])
def test_bad_arguments(change, match):
    with pytest.raises(ValueError, match=match):
        fa3_fp8.run_quantized(**_cpu_args(**change), softmax_scale=0.1, causal=False)


def test_defaults_follow_the_layout():
    """One source of truth: the default config's tiles are layout.KERNEL_TILES (the quantiser's block heights),
    and the measured best switches per head_dim (bench/NOTES.md, FA3-FP8 A/B)."""
    for d, cfg in fa3_fp8.DEFAULT_CONFIGS.items():
        assert (cfg.tile_m, cfg.tile_n) == layout.kernel_tiles(d)
        cfg.check(d)
    c64 = fa3_fp8.DEFAULT_CONFIGS[64]  # tn192s_c4 since session 6
    assert (c64.tile_m, c64.tile_n, c64.intra_wg_overlap, c64.reduce_chains) == (192, 192, False, 4)
    assert not fa3_fp8.DEFAULT_CONFIGS[128].intra_wg_overlap and fa3_fp8.DEFAULT_CONFIGS[128].tile_n == 256
    c256 = fa3_fp8.DEFAULT_CONFIGS[256]
    assert (c256.pv_split, c256.pv_buffers, c256.intra_wg_overlap) == (4, 2, False)


def test_block_height_mismatch_is_refused(rng_seed):
    """run_fp8 checks the inputs' block heights against the kernel's tile before anything runs: inputs
    quantised with K/V blocks of 128 keys at head_dim 128 (the kernel's tile_n is 256) raise a clear
    ValueError, as does a config whose tile_n is not the inputs' block_n; a matching config passes the check."""
    from fa_variants.fp8 import FP8Config
    from fa_variants.fp8.quantize import quantize_fp8_torch

    g = torch.Generator().manual_seed(rng_seed)
    q, k, v = (torch.randn(1, n, 2, 128, generator=g) for n in (40, 300, 300))
    inp = quantize_fp8_torch(q, k, v, config=FP8Config(rotate=False, smooth_k=False))
    assert inp.block_n == 256
    with pytest.raises(ValueError, match="blocks of 128 query rows and 256 keys, but the kernel .* needs 128 and 128"):
        fa3_fp8.run_fp8(inp, causal=False, config=dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], tile_n=128))
    kd = torch.ones(1, 2, 3)
    old = dataclasses.replace(inp, k_descale=kd, v_descale=kd, block_n=128)
    with pytest.raises(ValueError, match="blocks of 128 query rows and 128 keys, but the kernel .* tile_n=256"):
        fa3_fp8.run_fp8(old, causal=False)
    with pytest.raises(ValueError, match="k_descale must be float32 of shape .*one descale per tile_n=256 keys"):
        fa3_fp8.run_quantized(old.q, old.k, old.v_t, old.q_descale, kd, kd, softmax_scale=0.1, causal=False)


def test_bad_scale_and_out_dtype():
    with pytest.raises(ValueError, match="softmax_scale must be finite"):
        fa3_fp8.run_quantized(**_cpu_args(), softmax_scale=math.inf, causal=False)
    with pytest.raises(ValueError, match="out_dtype"):
        fa3_fp8.run_quantized(**_cpu_args(), softmax_scale=0.1, causal=False, out_dtype=torch.float32)


def test_model_matches_float64_attention_before_rounding(rng_seed):
    """The test's own model: with P not rounded (exactly representable inputs), it is plain attention."""
    g = torch.Generator().manual_seed(rng_seed)
    _, (q8, k8, vt, qd, kd, vd), v8 = quantized_inputs(1, 70, 150, 2, 1, 64, "cpu", g, tile_n=128)
    out, lse = model(q8, k8, v8, qd, kd, vd, 0.125, True, 128)
    Q, K, V = dequantize(q8, qd, layout.TILE_M), dequantize(k8, kd, 128), dequantize(v8, vd, 128)
    ref, ref_lse = attention_reference(Q, K, V, causal=True, softmax_scale=0.125)
    assert rel_l2(out, ref) < 4e-2  # only P's e4m3 rounding differs
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-9)


def test_empty_keys_quantize(rng_seed):
    g = torch.Generator().manual_seed(rng_seed)
    _, (q8, k8, vt, qd, kd, vd), _ = quantized_inputs(1, 5, 0, 2, 2, 64, "cpu", g)
    assert vt.shape == (1, 2, 64, 0) and kd.shape == (1, 2, 0)


@pytest.mark.parametrize("head_dim", [64, 256])
def test_lse_tolerance_covers_the_accumulator(rng_seed, head_dim):
    """lse_tolerance against the FP8 MMA's accumulator model (fa_variants.fp8.emulation, block floating point):
    rows that each see one key (the LSE is that score), so the LSE moves by exactly the score's error. The bound
    holds on every row; it is the worst case (MMA_K + 1 cuts of up to one step per k chunk, where random signs
    give ~1.5 steps), measured ~110-130x the median error, and stays far below a key's weight doubled (log 2)."""
    from fa_variants.fp8.emulation import _mma

    g = torch.Generator().manual_seed(rng_seed)
    n = 2000
    _, (q8, k8, _, qd, kd, _), _ = quantized_inputs(n, 1, 1, 1, 1, head_dim, "cpu", g)
    scale = head_dim ** -0.5
    hw = _mma(q8.float().view(n, 1, head_dim), k8.float().view(n, head_dim, 1), None, None, model="blockfp")
    exact = (q8.double() * k8.double()).sum(-1).view(n)
    err = (hw.view(n).double() - exact).abs() * (qd.view(n).double() * kd.view(n).double() * scale)
    room = lse_tolerance(q8, k8, qd, kd, scale, True, layout.tile_n(head_dim)).view(n) - 1e-3
    assert torch.all(err <= room), f"accumulator error {(err / room).max().item():.3g}x the bound"
    assert err.max() > 0 and room.median() <= 200 * err.median(), (room.median().item(), err.median().item())
    assert room.median() <= 0.02, room.median().item()


def test_v_t_layout(rng_seed):
    g = torch.Generator().manual_seed(rng_seed)
    v8 = torch.randn(1, 37, 2, 16, generator=g).to(E4M3)
    vt = to_v_t(v8)
    assert vt.shape == (1, 2, 16, 48)
    back = vt.view(torch.uint8)[..., torch.argsort(layout.v_token_order(48))]
    assert torch.equal(back[..., :37], v8.view(torch.uint8).permute(0, 2, 3, 1))
    assert torch.all(back[..., 37:] == 0)


# ------------------------------------------------------------------------------------------- GPU checks

def _not_sm90() -> bool:
    return not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9


needs_sm90 = pytest.mark.skipif(_not_sm90(), reason="fa3-fp8 needs an sm90 (Hopper) GPU")

# (batch, seqlen_q, seqlen_k, heads, heads_kv)
# (128, 1, 1, 4, 4): 512 rows that each see one key, whose LSE is that score's (the accumulator's error undiluted)
SHAPES = [(1, 1, 1, 2, 2), (2, 3, 3, 2, 2), (1, 113, 333, 4, 2), (1, 300, 127, 2, 2), (1, 1023, 1023, 2, 1),
          (1, 128, 256, 2, 2), (2, 1, 4224, 4, 2), (128, 1, 1, 4, 4)]


def lse_tolerance(q8, k8, qd, kd, scale, causal, tile_n):
    """Per row (B, H, Nq), float64 on the CPU: how far the kernel's LSE may sit from the model's, whose scores are
    exact. The FP8 MMA's accumulator errs on score j by at most d_j = |softmax_scale| times
    helpers.qk_accumulator_errors of the e4m3 values times the row's and the key's descales (these are not powers of
    two, so the bound is taken in the MMA's own units). The LSE then moves by at most exp(2 max d) sum_j p_j d_j
    (mean value theorem: along the path the softmax weights stay within exp(2 max d) of the exact p_j), plus 1e-3
    for float32's and MUFU.EX2's roundings. A fixed 1e-3 failed on an H100 (session 39, head_dim 256 causal, shape
    1x1x1x2x2: a row that sees one key, whose LSE is that score); on the CPU the accumulator model errs by more
    than 1e-3 on one N(0, 1) score at head_dim 256 about 0.4 % of the time."""
    B, Nq, H, _ = q8.shape
    Nk, group = k8.shape[1], H // k8.shape[2]
    if Nk == 0:
        return torch.full((B, H, Nq), 1e-3, dtype=torch.float64)
    q8, k8, qd, kd = (t.cpu() for t in (q8, k8, qd, kd))
    rows, keys = token_descales(qd, layout.TILE_M, Nq), token_descales(kd, tile_n, Nk)  # (B, H, Nq), (B, Hkv, Nk)
    d = abs(scale) * qk_accumulator_errors(q8.double(), k8.double(), causal)  # (B, H, Nq, Nk)
    d = d * rows[..., None] * keys.repeat_interleave(group, dim=1)[:, :, None, :]
    s = gqa_scores(dequantize(q8, qd, layout.TILE_M), dequantize(k8, kd, tile_n), scale)
    if causal:
        s = s.masked_fill(~causal_visible(Nq, Nk), -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows that see no key: 0
    return torch.exp(2 * d.amax(-1)) * (p * d).sum(-1) + 1e-3


def _check(out, lse, ref_out, ref_lse, v8, vd, label, lse_tol):
    """Kernel vs model: no NaN; O by rel-L2 and max|diff| (module docstring); the same rows with a finite LSE, each
    within lse_tol (``lse_tolerance``)."""
    assert not torch.isnan(out).any() and not torch.isnan(lse).any(), f"{label}: NaN (unwritten output?)"
    vmax = (v8.double().abs().amax() * vd.double().max()).item()
    err = (out.double() - ref_out).abs().max().item()
    assert rel_l2(out, ref_out) <= 2e-2 and err <= 6e-2 * vmax, f"{label}: rel-L2 {rel_l2(out, ref_out):.3g}, max {err:.3g}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), f"{label}: LSE -inf pattern"
    if finite.any():
        diff = (lse.double() - ref_lse).abs().cpu()[finite.cpu()]
        excess = (diff / lse_tol[finite.cpu()]).max().item()
        assert excess <= 1.0, f"{label}: LSE off by {diff.max().item():.3g}, {excess:.3g}x its bound"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.gpu
@needs_sm90
def test_kernel_vs_model(rng_seed, shape, head_dim, causal, nan_allocations):
    B, Nq, Nk, H, Hkv = shape
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    (q, k, v), (q8, k8, vt, qd, kd, vd), v8 = quantized_inputs(B, Nq, Nk, H, Hkv, head_dim, "cuda", g)
    scale = head_dim ** -0.5
    with nan_allocations():
        out, lse = fa3_fp8.run_quantized(q8, k8, vt, qd, kd, vd, softmax_scale=scale, causal=causal)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ref_out, ref_lse = model(q8, k8, v8, qd, kd, vd, scale, causal, layout.tile_n(head_dim))
    lse_tol = lse_tolerance(q8, k8, qd, kd, scale, causal, layout.tile_n(head_dim))
    _check(out, lse, ref_out, ref_lse, v8, vd, f"{shape} d{head_dim} causal={causal}", lse_tol)
    exact, exact_lse = attention_reference(q, k, v, causal=causal, softmax_scale=scale)
    assert rel_l2(out, exact) <= 8e-2, rel_l2(out, exact)
    # The LSE is 1-Lipschitz in its row's scores: against the exact LSE it may move by at most the largest score change
    # quantisation made on the row (helpers.largest_score_change), plus the accumulator's and float32's (lse_tol); the
    # model check pins the kernel
    largest, _ = largest_score_change(dequantize(q8, qd, layout.TILE_M), dequantize(k8, kd, layout.tile_n(head_dim)),
                                      scale, q, k, scale, causal)
    exact_lse = exact_lse.double().cpu()
    f = torch.isfinite(exact_lse)
    off = (lse.double().cpu() - exact_lse).abs()[f]
    assert torch.all(off <= largest[f] + lse_tol[f]), f"LSE off by {off.max().item():.3g} from the exact one"


# variant -> (head_dim, config change); the accumulation modes and tile shapes the speed A/B times, and the
# defaults before layout.KERNEL_TILES moved (old-default-*); inputs quantised with the variant's tile_n. PRE64: the
# head_dim 64 default before session 6 (192 x 128, intra-warpgroup overlap, one softmax chain), the base of the 64 ones
PRE64 = dict(tile_n=128, intra_wg_overlap=True, reduce_chains=1)
# fa3_fp8.NO_LOOKAHEAD (not imported at collection): the head_dim 256 default's serial steps, O in absolute units
NO_LOOKAHEAD_256 = dict(s_lookahead=False, s_halves=False, fused_promote=False, bounded_units=False)
CONFIG_VARIANTS = {
    "single-acc": (128, dict(two_level=False)),
    "old-default-128": (128, dict(tile_n=128, intra_wg_overlap=True)),
    "promote-2": (128, dict(promote_every=2, tile_n=128, intra_wg_overlap=True)),  # 256-key tiles: no registers
    "promote-4-serial": (128, dict(promote_every=4, tile_n=128)),
    "promote-3-d64": (64, dict(PRE64, promote_every=3)),
    "old-default-256": (256, dict(NO_LOOKAHEAD_256, pv_split=2, pv_buffers=1)),
    "pv4-d256": (256, dict(NO_LOOKAHEAD_256, pv_split=4, pv_buffers=1)),
    "single-acc-d256": (256, dict(NO_LOOKAHEAD_256, two_level=False, pv_split=1, pv_buffers=1)),
    "old-default-64": (64, dict(PRE64, tile_m=128)),
    "pre-default-64": (64, dict(PRE64)),
    "tile-n-256-d64": (64, dict(PRE64, tile_m=128, tile_n=256)),  # K/V scale blocks of 256 keys (quantised to match)
    "tile-n-192-serial": (128, dict(tile_n=192)),
}


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("variant", [*CONFIG_VARIANTS, "fp16-out", "neg-scale", "zero-scale"])
def test_variants(rng_seed, variant, nan_allocations):
    D, change = CONFIG_VARIANTS.get(variant, (128, None))
    B, Nq, Nk, H, Hkv = 2, 200, 700, 4, 2
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    bn = (change or {}).get("tile_n", layout.tile_n(D))
    _, (q8, k8, vt, qd, kd, vd), v8 = quantized_inputs(B, Nq, Nk, H, Hkv, D, "cuda", g, tile_n=bn)
    cfg, out_dtype, scale = None, torch.bfloat16, D ** -0.5
    if change is not None:
        cfg = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[D], **change)
    elif variant == "fp16-out":
        out_dtype = torch.float16
    elif variant == "neg-scale":
        scale = -scale
    else:
        scale = 0.0
    with nan_allocations():
        out, lse = fa3_fp8.run_quantized(q8, k8, vt, qd, kd, vd, softmax_scale=scale, causal=True, out_dtype=out_dtype, config=cfg)
    assert out.dtype == out_dtype
    k_model = k8 if scale >= 0 else (k8.view(torch.uint8) ^ 0x80).view(E4M3)
    ref_out, ref_lse = model(q8, k_model, v8, qd, kd, vd, abs(scale), True, bn)
    _check(out, lse, ref_out, ref_lse, v8, vd, variant, lse_tolerance(q8, k_model, qd, kd, abs(scale), True, bn))


@pytest.mark.gpu
@needs_sm90
def test_empty_rows_and_seqlen_k_zero(rng_seed, nan_allocations):
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    # causal with seqlen_q > seqlen_k: the first rows see no key
    _, (q8, k8, vt, qd, kd, vd), v8 = quantized_inputs(1, 300, 100, 2, 2, 64, "cuda", g)
    with nan_allocations():
        out, lse = fa3_fp8.run_quantized(q8, k8, vt, qd, kd, vd, softmax_scale=0.125, causal=True)
    assert torch.all(out[:, :200] == 0) and torch.all(lse[:, :, :200] == -math.inf)
    assert torch.isfinite(lse[:, :, 200:]).all()
    _, (q8, k8, vt, qd, kd, vd), _ = quantized_inputs(1, 5, 0, 2, 2, 64, "cuda", g)
    with nan_allocations():
        out, lse = fa3_fp8.run_quantized(q8, k8, vt, qd, kd, vd, softmax_scale=0.125, causal=False)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)
