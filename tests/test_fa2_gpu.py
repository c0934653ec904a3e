"""FA2-specific GPU tests, beyond the shared matrix of tests/test_kernels_gpu.py.

The compile cache across runtime shapes, strides (SDPA layout, packed QKV, stride-0 broadcast, K/V
with different layouts), unaligned inputs, negative / zero scales, the current stream, determinism,
empty causal rows, the grid limit. Every check uses the float64 tolerance rule or bitwise equality.
Run on the GPU host: ``python -m pytest -q tests/test_fa2_gpu.py``.
"""
from __future__ import annotations

import math

import pytest
import torch

from fa_variants.common import cache
from helpers import assert_attention_ok, make_qkv

pytestmark = pytest.mark.gpu

fa2 = pytest.importorskip("fa_variants.ampere.fa2")


@pytest.fixture(autouse=True)
def _poisoned(poisoned_workspace):
    """Every test's outputs and scratch NaN-filled (conftest's poisoned_workspace): an element fa2 never writes
    fails the comparison, the rows without keys included."""


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def run(q, k, v, causal=False, scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out, lse = fa2.run(q, k, v, causal=causal, softmax_scale=scale)
    torch.cuda.synchronize()
    return out, lse


def assert_matches_reference(q, k, v, causal=False, scale=None):
    out, lse = run(q, k, v, causal, scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    assert_attention_ok(out, lse, q, k, v, causal, scale)
    return out, lse


@pytest.mark.parametrize("kind", ["default", "split"])
def test_runtime_shapes_do_not_recompile(kind):
    # One config, pinned: without config= the split heuristic may send the two shapes to different kernels
    # (a small grid splits, a full one does not), which is a choice of kernel, not a recompile of one.
    from fa_variants.common import interop

    arch = interop.device_arch(torch.device("cuda"))
    config = fa2.default_config(arch, 128, True) if kind == "default" else fa2.split_config(arch, 128)

    def check(q, k, v):
        scale = 1.0 / math.sqrt(q.shape[-1])
        out, lse = fa2.run(q, k, v, causal=True, softmax_scale=scale, config=config)
        torch.cuda.synchronize()
        assert_attention_ok(out, lse, q, k, v, True, scale)

    check(rand(1, 100, 4, 128), rand(1, 77, 4, 128), rand(1, 77, 4, 128))
    n = cache.cache_info()["compiles"]
    check(rand(3, 333, 8, 128), rand(3, 1000, 2, 128), rand(3, 1000, 2, 128))  # batch, seqlens, GQA
    assert cache.cache_info()["compiles"] == n, "a different batch / seqlen / head count recompiled"


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_strided_layouts_equal_contiguous(causal):
    b, n, h, d = 2, 190, 8, 128
    ref = [rand(b, n, h, d) for _ in range(3)]
    base, _ = run(*ref, causal)
    # SDPA layout (B, H, N, D) viewed as (B, N, H, D); packed QKV; K as the first D channels of 2D
    sdpa = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in ref]
    packed = torch.stack(ref, dim=2).unbind(2)
    wide = torch.cat([ref[1], rand(b, n, h, d)], dim=-1)[..., :d]
    for q, k, v in (sdpa, packed, (ref[0], wide, ref[2])):
        out, _ = run(q, k, v, causal)
        assert torch.equal(out, base)


def test_broadcast_kv_heads_stride_zero():
    """EC-09: K/V expanded across heads (head stride 0) equal the contiguous copies, Nk = 1 mod 32."""
    q, k1, v1 = rand(1, 16, 8, 128), rand(1, 129, 1, 128), rand(1, 129, 1, 128)
    k, v = k1.expand(1, 129, 8, 128), v1.expand(1, 129, 8, 128)
    out, _ = run(q, k, v, causal=True)
    ref, _ = run(q, k.contiguous(), v.contiguous(), causal=True)
    assert torch.equal(out, ref)


def test_unaligned_inputs_are_served():
    """A view whose pointer is not 16-byte aligned is copied (interop.aligned), not misread."""
    buf = rand(1 * 64 * 4 * 64 + 1)
    q = buf[1:].view(1, 64, 4, 64)
    k, v = rand(1, 64, 4, 64), rand(1, 64, 4, 64)
    assert_matches_reference(q, k, v)


@pytest.mark.parametrize("scale", [-0.125, 0.0, 1e-8, 10.0])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_extreme_scales(scale, causal):
    """EC-20: a negative scale is the true softmax(-c QK^T), 0 averages the visible V rows."""
    q, k, v = rand(1, 64, 2, 64, dtype=torch.float16) * 4, rand(1, 64, 2, 64, dtype=torch.float16) * 4, \
        rand(1, 64, 2, 64, dtype=torch.float16)
    out, _ = assert_matches_reference(q, k, v, causal, scale)
    if scale == 0.0 and causal:
        mean = v.double().cumsum(1) / torch.arange(1, 65, device="cuda").view(1, 64, 1, 1)
        torch.testing.assert_close(out.double(), mean, atol=2e-3, rtol=0)


def test_rows_without_keys_are_zero_with_lse_minus_inf():
    q, k, v = rand(2, 300, 4, 64), rand(2, 128, 4, 64), rand(2, 128, 4, 64)
    out, lse = assert_matches_reference(q, k, v, causal=True)
    assert torch.all(out[:, :172] == 0) and torch.all(lse[:, :, :172] == -math.inf)
    assert torch.isfinite(lse[:, :, 172:]).all()


def test_uses_the_current_stream():
    """EC-18b: the kernel runs on torch's current stream, after work queued there."""
    q, k, v = rand(4, 256, 8, 64), rand(4, 256, 8, 64), rand(4, 256, 8, 64)
    run(q, k, v)  # compile outside the timed region
    fresh = rand(4, 256, 8, 64)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)
        q.copy_(fresh)
        out, _ = fa2.run(q, k, v, causal=False, softmax_scale=0.125)
    s.synchronize()
    assert_attention_ok(out, None, fresh, k, v, False, 0.125)


def test_deterministic():
    q, k, v = rand(2, 1000, 8, 128), rand(2, 1000, 2, 128), rand(2, 1000, 2, 128)
    a, la = run(q, k, v, causal=True)
    b, lb = run(q, k, v, causal=True)
    assert torch.equal(a, b) and torch.equal(la, lb)


def test_grid_limit_raises_before_launch():
    q = rand(1, 1, 65536, 64)
    k = v = rand(1, 1, 1, 64)
    with pytest.raises(ValueError, match="65535"):
        fa2.run(q, k, v, causal=False, softmax_scale=0.125)


# ----- head_dim 256 tile variants (fa2.D256_CONFIGS; scripts/fa2d256_ab.py) ---------------------------------------
D256_SHAPES = [(2, 113, 113, 4, 4), (1, 300, 77, 4, 2), (2, 65, 1000, 4, 1), (1, 1023, 1023, 2, 2)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", [n for n in fa2.D256_CONFIGS if n != "default"])
def test_d256_variants_match_float64(name, causal, dtype, nan_allocations):
    """Each D 256 variant (one K/V stage, 32-key tiles, 8 warps of 128 rows) vs float64, O and LSE, NaN-poisoned
    outputs: odd lengths, seqlen_q > seqlen_k (causal rows that see no key: O = 0, LSE = -inf), seqlen_q < seqlen_k
    over 16 K/V tiles, GQA 2:1 and MQA."""
    from fa_variants.common import interop

    config = fa2.d256_config(interop.device_arch(torch.device("cuda")), name)
    for batch, seqlen_q, seqlen_k, heads, heads_kv in D256_SHAPES:
        q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, 256, dtype=dtype, device="cuda")
        with nan_allocations():
            out, lse = fa2.run(q, k, v, causal=causal, softmax_scale=256 ** -0.5, config=config)
        torch.cuda.synchronize()
        assert_attention_ok(out, lse, q, k, v, causal, 256 ** -0.5,
                            what=f"{name} {tuple(q.shape)} Nk={seqlen_k} Hkv={heads_kv}")


def test_d256_switch_selects_the_variant(monkeypatch, nan_allocations):
    """FA_VARIANTS_FA2_D256 (fa2.D256_VARIANT): a call without config= runs the named D 256 tiles, also through a
    plan made before the switch changed."""
    from fa_variants.common import interop

    arch = interop.device_arch(torch.device("cuda"))
    q, k, v = make_qkv(2, 200, 200, 4, 4, 256, device="cuda")
    monkeypatch.setattr(fa2, "SPLIT_KV_ENABLED", False)  # 2 x 4 heads x 4 query tiles would split otherwise
    run(q, k, v, causal=True)  # planned under "default" (s1)
    monkeypatch.setattr(fa2, "D256_VARIANT", "s2")  # the two-stage tiles, the default before s1
    assert fa2._problem_config(None, q, k, True) == fa2.d256_config(arch, "s2")
    with nan_allocations():
        out, lse = fa2.run(q, k, v, causal=True, softmax_scale=256 ** -0.5)
    torch.cuda.synchronize()
    assert_attention_ok(out, lse, q, k, v, True, 256 ** -0.5, what="auto with D256_VARIANT=s2")
