"""The FP8 quantisation pass in the CuTe DSL (fa_variants.fp8.quant_kernel): compile-only checks (no GPU) and,
on a GPU, the pass against the torch recipe on the same inputs, bit for bit (same operations in the same
order: e4m3 bytes, descales, V layout).

    source .gpu/env.sh && python3 -m pytest -m gpu tests/test_fp8_quant_kernel.py -q
"""
import pytest
import torch

from fa_variants import registry
from fa_variants.common import cubin
from fa_variants.fp8 import FP8Config
from fa_variants.fp8 import quant_kernel as qk
from fa_variants.fp8.quantize import quantize_fp8, quantize_fp8_torch

PASSES = [qk.PassConfig(shift=True), qk.PassConfig(smooth=True), qk.PassConfig(rotate=False),
          qk.PassConfig(mode="amax", shift=True), qk.PassConfig(mode="given"), qk.PassConfig(role="v", rotate=False),
          qk.PassConfig(role="v", rotate=False, mode="given")]


@pytest.fixture
def arch(request, monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", request.param)  # read when the DSL first loads
    return request.param


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_89"], indirect=True)
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
@pytest.mark.parametrize("cfg", PASSES, ids=lambda c: f"{c.role}-rot{int(c.rotate)}-sm{int(c.smooth)}-"
                                                     f"sh{int(c.shift)}-{c.mode}")
def test_compiles_without_spills(arch, head_dim, cfg):
    """Every pass compiles for Hopper and Ada (no Hopper-only instructions); the SASS has the 16-byte
    cp.async loads (8 per thread, twice: the first block before the loop, the next one inside it) and no
    other global loads of the data, the FWHT's shuffles (log2(head_dim / 64) stages across lanes, 64
    values each; + 5 for the block max, + log2(head_dim / 64) for the LSE shift's sum), the e4m3
    conversions (2 values each), the 16-byte e4m3 stores of Q / K (4 per thread) or V's 32-bit words (16
    per thread), and no local memory (no spills)."""
    c = qk.VARIANT.compiled(qk.static_config(arch, torch.bfloat16, head_dim, cfg))
    res = cubin.cubin_resources(c.cubin)
    ops = cubin.count_sass(cubin.sass_of(c.cubin), ("LDGSTS", "LDG.E.128", "LDG.E.64", "STG.E", "STG.E.64",
                                                    "STG.E.128", "SHFL.BFLY", "F2FP", "LDL", "STL"))
    assert res["spill_bytes"] == 0 and ops["LDL"] == ops["STL"] == 0 and res["registers"] <= 128, (res, ops)
    assert ops["LDGSTS"] == 16 and ops["LDG.E.128"] == ops["LDG.E.64"] == 0, ops
    stages = (head_dim // 64).bit_length() - 1
    assert ops["SHFL.BFLY"] == (64 * stages if cfg.rotate else 0) + 5 + (stages if cfg.shift else 0), ops
    scalar_stores = ops["STG.E"] - ops["STG.E.64"] - ops["STG.E.128"]  # descale, shift, V's words
    if cfg.mode == "amax":
        assert ops["F2FP"] == 0 and ops["STG.E.64"] == ops["STG.E.128"] == 0
    else:
        assert ops["F2FP"] == 32 and ops["STG.E.64"] == 0, ops
        assert ops["STG.E.128"] == (4 if cfg.role == "qk" else 0), ops
        words = 16 if cfg.role == "v" else 0
        assert scalar_stores == words + (cfg.mode == "block") + cfg.shift, ops


def test_compile_cli_and_refusals(compile_cli):
    report = compile_cli("--arch", "sm_90a", "--variant", "fp8-quant", "--head-dim", "128", "--dtype", "bf16")
    assert report["spill_bytes"] == 0 and report["tiles"]["role"] == "qk"
    assert qk.PassConfig().rows == 128 and registry.variant("fp8-quant") is qk.VARIANT
    qk.PassConfig(rows=256).check(128)  # a K / V block height of 256 (tile_n) is a parameter
    with pytest.raises(ValueError, match="exceeds"):
        qk.PassConfig(rows=256).check(256)
    with pytest.raises(ValueError, match="LSE shift"):
        qk.PassConfig(smooth=True, shift=True).check(128)
    with pytest.raises(registry.UnsupportedConfigError, match="arch sm_80"):
        qk.static_config("sm_80", torch.bfloat16, 64, qk.PassConfig())
    with pytest.raises(ValueError, match="head_dim 96 is not built"):
        qk.PassConfig().check(96)
    with pytest.raises(ValueError, match="neither rotated"):
        qk.PassConfig(role="v").check(64)
    x = torch.zeros(1, 4, 2, 64)
    assert "CUDA tensors" in qk.why_not(x, FP8Config())


# ------------------------------------------------------------------------------------------------ GPU


SHAPES = [(1, 1, 1, 2, 2), (2, 113, 300, 4, 2), (1, 1023, 4224, 6, 1), (1, 4224, 129, 2, 2)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("config", [FP8Config(), FP8Config(granularity="head", smooth_k=False),
                                    FP8Config(granularity="tensor", rotate=False, smooth_k=False)],
                         ids=["default", "head", "tensor-plain"])
def test_pass_matches_torch_bitwise(shape, head_dim, dtype, config):
    """The same FP8Inputs from the GPU pass and from the torch recipe on the same CUDA inputs: e4m3 bytes,
    descales and V layout equal bit for bit (the same float32 operations in the same order; inputs are
    normal numbers, so subnormal flushing cannot differ); k_mean comes from the same torch code; lse_shift
    (the kernel's own float32 dot product in the Q pass) equals torch's to float32 rounding."""
    B, Nq, Nk, H, Hkv = shape
    g = torch.Generator(device="cuda").manual_seed(head_dim + Nq)
    q = (torch.randn(B, Nq, H, head_dim, device="cuda", generator=g) * 3).to(dtype)
    k = (torch.randn(B, Nk, Hkv, head_dim, device="cuda", generator=g) + 2).to(dtype)
    v = torch.randn(B, Nk, Hkv, head_dim, device="cuda", generator=g).to(dtype)
    for scale in (None, -0.3):
        gpu = quantize_fp8(q, k, v, config=config, softmax_scale=scale, impl="kernel")
        ref = quantize_fp8_torch(q, k, v, config=config, softmax_scale=scale)
        for name in ("q", "k", "v_t"):
            a, b = getattr(gpu, name), getattr(ref, name)
            assert a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
        for name in ("q_descale", "k_descale", "v_descale"):
            assert torch.equal(getattr(gpu, name), getattr(ref, name)), name
        assert gpu.softmax_scale == ref.softmax_scale and gpu.seqlen_k == ref.seqlen_k
        if config.smooth_k:
            assert torch.equal(gpu.k_mean, ref.k_mean)
            assert_shift_close(gpu.lse_shift, ref.lse_shift, q, ref.k_mean, ref.softmax_scale)


def assert_shift_close(got, want, q, mean, scale):
    """|got - want| <= 1e-6 * scale * sum_d |q_d mean_d| per row (float32 sums of 64..256 products in two
    orders differ by a few ulps of that sum), and NaN-free."""
    B, Nq, H, D = q.shape
    Hkv = mean.shape[1]
    bound = torch.einsum("bqkgd,bkd->bkgq", q.double().abs().reshape(B, Nq, Hkv, H // Hkv, D),
                         mean.double().abs()).reshape(B, H, Nq) * scale
    assert got.shape == want.shape and torch.isfinite(got).all()
    assert ((got.double() - want.double()).abs() <= 1e-6 * bound + 1e-30).all()


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_pass_block_height_256(monkeypatch, head_dim):
    """K / V blocks of 256 tokens (a tile_n of 256 in fp8.layout): the pass takes the block height from the
    layout, and still equals the torch recipe."""
    from fa_variants.fp8 import layout

    monkeypatch.setitem(layout.KERNEL_TILES, head_dim, (layout.KERNEL_TILES[head_dim][0], 256))
    g = torch.Generator(device="cuda").manual_seed(head_dim)
    q = torch.randn(1, 300, 4, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    k = (torch.randn(1, 777, 2, head_dim, device="cuda", generator=g) + 1).to(torch.bfloat16)
    v = torch.randn(1, 777, 2, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    gpu = quantize_fp8(q, k, v, impl="kernel")
    ref = quantize_fp8_torch(q, k, v)
    assert gpu.k_descale.shape[-1] == 4
    for name in ("q", "k", "v_t"):
        assert torch.equal(getattr(gpu, name).view(torch.uint8), getattr(ref, name).view(torch.uint8)), name
    for name in ("q_descale", "k_descale", "v_descale"):
        assert torch.equal(getattr(gpu, name), getattr(ref, name)), name


@pytest.mark.gpu
def test_pass_zero_and_subnormal_blocks():
    """All-zero and subnormal blocks on the GPU: finite descales (2^-110), e4m3 zeros, like the torch path."""
    x = torch.randn(1, 300, 2, 128, device="cuda", dtype=torch.bfloat16)
    x[:, :128, 0] = 0
    x[:, 128:256, 1] = torch.finfo(torch.bfloat16).tiny / 4
    gpu = quantize_fp8(x, x, x, impl="kernel")
    ref = quantize_fp8_torch(x, x, x)
    for name in ("q_descale", "k_descale", "v_descale"):
        d = getattr(gpu, name)
        assert torch.isfinite(d).all() and (d > 0).all() and torch.equal(d, getattr(ref, name))
    assert torch.equal(gpu.q.view(torch.uint8), ref.q.view(torch.uint8))
