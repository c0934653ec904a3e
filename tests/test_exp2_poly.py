"""``common.softmax.exp2_poly``: 2^x on the FMA pipe (session 37; ``Sm90Config.exp2_poly``).

* CPU: the algorithm, step for step in float32 numpy (``_model``: the clamp, the rounding FADD of 1.5 * 2^23, the
  polynomial, the product with 2^n made from the bits): relative error <= 1.1e-4 over [-126, 127], exact at
  integers, exactly +0 from -126.5 down (-inf too), inf at 128, the GPU's NaN kept, nothing negative at the edge.
* compile (no GPU, sm_90a): an elementwise kernel of it is exactly the documented instruction sequence (no MUFU.EX2;
  the model's constants and steps are the kernel's); fa3-fp8 / fa3 with ``exp2_poly`` issue fewer MUFU.EX2 than
  without, no spill.
* GPU: the same elementwise kernel against float64 2^x on random and special inputs.
"""
import dataclasses
import math
import tempfile

import numpy as np
import pytest
import torch

pytest.importorskip("cutlass")

import cutlass.cute as cute  # noqa: E402  (module level: the DSL reads the kernels' annotations here)
from cutlass import Float32  # noqa: E402

from fa_variants.common import interop, softmax  # noqa: E402

C1, C2, C3 = softmax.EXP2_POLY


def _model(x: np.ndarray) -> np.ndarray:
    """exp2_poly's steps in float32 (an FFMA as a float64 product and sum rounded once to float32; NaN as the GPU's
    0x7FFFFFFF, whose bits an integer add would turn into a number)."""
    x = np.asarray(x, dtype=np.float32).copy()
    x[np.isnan(x)] = np.uint32(0x7FFFFFFF).view(np.float32)
    x = np.where(np.isnan(x), x, np.maximum(x, np.float32(-127.0)))
    rounder = np.float32(softmax._ROUNDER)
    t = (x + rounder).astype(np.float32)
    t[np.isnan(t)] = np.uint32(0x7FFFFFFF).view(np.float32)
    f = (x - (t - rounder).astype(np.float32)).astype(np.float32)

    def fma(a, b, c):
        return (np.float64(a) * np.float64(b) + np.float64(c)).astype(np.float32)

    p = fma(fma(fma(np.float32(C3), f, np.float32(C2)), f, np.float32(C1)), f, np.float32(1.0))
    scale = (((t.view(np.uint32).astype(np.uint64) << 23) + (127 << 23)) & 0xFFFFFFFF).astype(np.uint32)
    return (p * scale.view(np.float32)).astype(np.float32)


def test_coefficients_are_the_constrained_minimax():
    """p(0) = 1 exactly and p(f) / 2^f - 1 within 1.02e-4 over [-1/2, 1/2] (float64), with the error's extremes of
    both signs near the bound (equioscillation: no other cubic with p(0) = 1 does better by much)."""
    f = np.linspace(-0.5, 0.5, 100001)
    err = (1 + f * (C1 + f * (C2 + f * C3))) / 2.0 ** f - 1
    assert np.abs(err).max() <= 1.02e-4
    assert err.max() >= 0.95e-4 and err.min() <= -0.95e-4


def test_model_accuracy_and_edges(rng_seed):
    rng = np.random.default_rng(rng_seed)
    x = np.concatenate([np.linspace(-126.0, 127.0, 400001), rng.uniform(-126, 10, 100000)])
    got = _model(x).astype(np.float64)
    rel = np.abs(got / np.exp2(x.astype(np.float32).astype(np.float64)) - 1)
    assert rel.max() <= 1.1e-4, x[rel.argmax()]
    ints = np.arange(-126, 128, dtype=np.float32)
    assert (_model(ints) == np.exp2(ints.astype(np.float64)).astype(np.float32)).all()  # exact at integers
    low = np.array([-np.inf, -1e30, -200.0, -127.0, -126.75, -126.5001], dtype=np.float32)
    assert (_model(low).view(np.uint32) == 0).all()  # +0.0 exactly: a masked score adds nothing to l
    edge = _model(np.linspace(-127.0, -126.0, 1001, dtype=np.float32))
    assert (edge >= 0).all() and (edge <= 2.0 ** -126).all() and not np.signbit(edge).any()
    assert np.isinf(_model(np.array([128.0], dtype=np.float32))).all()  # 2^128 overflows to inf, as MUFU.EX2's
    assert np.isnan(_model(np.array([np.nan], dtype=np.float32))).all()  # the GPU's NaN stays NaN


@cute.kernel
def _elementwise_kernel(x: cute.Tensor, y: cute.Tensor):
    """y[i] = exp2_poly(x[i]) over a 1-D float32 tensor, 128 threads a block."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if i < x.shape[0]:
        y[i] = softmax.exp2_poly(Float32(x[i]))


@cute.jit
def _elementwise(x: cute.Tensor, y: cute.Tensor):
    _elementwise_kernel(x, y).launch(grid=[(x.shape[0] + 127) // 128, 1, 1], block=[128, 1, 1])


def _compile(arch: str):
    """The elementwise kernel compiled for arch against fake 1-D float32 tensors (called with torch tensors)."""
    from fa_variants.common.cache import compile_options

    n = cute.sym_int()
    fakes = (interop.fake_tensor("fp32", (n,), 4), interop.fake_tensor("fp32", (n,), 4))
    with tempfile.TemporaryDirectory() as dump:
        return cute.compile(_elementwise, *fakes, options=compile_options(arch, dump))


@pytest.mark.compile
def test_elementwise_sass_is_the_documented_sequence():
    """exp2_poly's SASS (sm_90a): no MUFU.EX2; the NaN-keeping clamp at -127, the rounding FADD of 1.5 * 2^23 and its
    inverse, f's FADD, the three FFMA with EXP2_POLY's constants, the exponent field (n + 127) << 23 by one LEA and the
    FMUL by it, in that order (no fast-math folding of (x + M) - M to x)."""
    import re

    from fa_variants.common import cubin

    sass = cubin.sass_of(_compile("sm_90a").artifacts.CUBIN)
    assert "MUFU" not in sass
    ops = [line.split(";")[0].split("*/")[-1].strip() for line in sass.splitlines()
           if re.search(r"\b(FMNMX|FADD|FFMA|FMUL)\b|LEA .*0x17", line)]
    want = [r"FMNMX\.NAN R\d+, R\d+, -127, !PT", r"FADD (R\d+), R\d+, 12582912", r"FADD R\d+, R\d+(\.reuse)?, -12582912",
            r"LEA R\d+, R\d+, 0x3f800000, 0x17", r"FADD R\d+, R\d+, -R\d+", r"FFMA .*0\.2422103\d*", r"FFMA .*0\.6932829\d*",
            r"FFMA R\d+, R\d+, R\d+, 1$", r"FMUL R\d+, R\d+, R\d+"]
    assert len(ops) == len(want) and all(re.fullmatch(w, op) for w, op in zip(want, ops)), ops


@pytest.mark.compile
@pytest.mark.parametrize("variant, dtype, head_dim, every", [("fa3-fp8", "e4m3", 64, 3), ("fa3", "bf16", 64, 3)])
def test_kernels_issue_fewer_exponentials(variant, dtype, head_dim, every):
    """``Sm90Config.exp2_poly``: the default config with every third exponential on the FMA pipe issues about a
    third fewer MUFU.EX2 and spills nothing (sm_90a, non-causal)."""
    from fa_variants import registry
    from fa_variants.common import cubin

    if variant == "fa3-fp8":
        from fa_variants.hopper import fa3_fp8 as module
    else:
        from fa_variants.hopper import fa3 as module
    base = module.DEFAULT_CONFIGS[head_dim]
    counts = {}
    for k in (0, every):
        c = registry.compiled(registry.static_config(variant, "sm_90a", dtype, head_dim, False,
                                                     dataclasses.replace(base, exp2_poly=k)))
        counts[k] = cubin.count_sass(cubin.sass_of(c.cubin), ("MUFU.EX2",))["MUFU.EX2"]
        assert cubin.cubin_resources(c.cubin)["spill_bytes"] == 0, (variant, k)
    assert counts[every] <= counts[0] * 0.8, counts


def test_config_checks_exp2_poly():
    """0, 2, 3, 4, 8, 12, 16 accepted; other values and (bf16 fa3) exp2_poly without exp2_ffma refused in one line
    naming it; fa3-fp8 (block-scaled softmax) takes it without exp2_ffma."""
    from fa_variants.common.config import Sm90Config

    for k in (0, 2, 3, 4, 8, 12, 16):
        Sm90Config(exp2_ffma=True, exp2_poly=k).check(128)
    for bad in (1, 5, 6, 32, -2, 2.5, "3"):
        with pytest.raises(ValueError, match="exp2_poly"):
            Sm90Config(exp2_ffma=True, exp2_poly=bad).check(128)
    with pytest.raises(ValueError, match="exp2_poly=3 needs exp2_ffma=True"):
        Sm90Config(exp2_ffma=False, exp2_poly=3).check(128)
    fa3_fp8 = pytest.importorskip("fa_variants.hopper.fa3_fp8")
    dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], exp2_ffma=False, exp2_poly=4).check(128)


@pytest.mark.gpu
def test_elementwise_matches_float64():
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("needs sm80 or newer")
    major, minor = torch.cuda.get_device_capability()
    compiled = _compile(interop.arch_of_capability(major, minor))
    special = torch.tensor([-math.inf, -1e30, -200.0, -127.0, -126.75, -126.5, 0.0, 1.0, 8.0, -0.5, 0.5, 127.0,
                            math.nan])
    x = torch.cat([special, torch.empty(1 << 20).uniform_(-126.0, 127.0), torch.randn(4096) * 4]).cuda()
    y = torch.full_like(x, math.nan)  # poisoned: an element the kernel skips fails
    compiled(x, y)
    torch.cuda.synchronize()
    ref = torch.exp2(x.double())
    finite = torch.isfinite(x) & (x > -126.0)
    rel = ((y.double() / ref - 1).abs())[finite]
    assert rel.max().item() <= 1.1e-4, x[finite][rel.argmax()].item()
    assert (y[:5] == 0).all() and not torch.signbit(y[:5]).any()  # -inf .. -126.75: +0.0
    assert (y[6:9] == torch.tensor([1.0, 2.0, 256.0], device="cuda")).all()  # exact at integers (P = 1, 2^p_shift)
    assert torch.isnan(y[12]) and y[5] >= 0 and y[5] <= 2.0**-126  # -126.5: 2^-126 / sqrt 2, or 0 flushed
    model = torch.from_numpy(_model(x.cpu().numpy())).cuda()  # the CPU model: within an ulp or two of the kernel
    close = (y - model).abs() <= 4 * torch.finfo(torch.float32).eps * model.abs()
    assert close[finite].all(), x[finite][~close[finite]][:4].tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("every", [2, 3, 4])
def test_fa3_one_key_rows_return_v_exactly(every, rng_seed, nan_allocations):
    """bf16 fa3 with exp2_poly: row i's logit on key i is 2000 x softmax_scale above every other (the others' P are
    exactly 0), for keys 0..63, so each of a thread's columns, those on the polynomial among them, holds a row's only
    key: O must be that key's V bit for bit and the LSE its logit (EC-04's rule: P at the row max rounds to 1)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm90 GPU")
    from fa_variants.hopper import fa3

    n, heads, head_dim = 64, 2, 64
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    q = (torch.eye(n, head_dim, device="cuda") * 2000).expand(1, heads, n, head_dim).transpose(1, 2)
    q = q.to(torch.bfloat16).contiguous()
    k = (torch.eye(n, head_dim, device="cuda")).expand(1, heads, n, head_dim).transpose(1, 2).to(torch.bfloat16)
    k = k.contiguous()
    v = torch.randn(1, n, heads, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    scale = 1.0 / math.sqrt(head_dim)
    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[head_dim], exp2_poly=every)
    with nan_allocations():
        out, lse = fa3.run(q, k, v, causal=False, softmax_scale=scale, config=config)
    assert torch.equal(out, v), (out - v).abs().max().item()
    assert torch.allclose(lse, torch.full_like(lse, 2000 * scale), rtol=1e-6)
