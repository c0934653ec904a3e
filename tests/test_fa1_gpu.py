"""FA1-specific GPU checks (beyond the shared matrix of tests/test_kernels_gpu.py and the edge cases).

What is particular to FlashAttention1Sm80 (fa_variants/ampere/fa1.py) is the HBM round trip of O, l, m
between (i, j) steps, so the shapes here stress it:

* one Q tile against many K/V tiles (step (i, j+1) reads what step (i, j) has just written), many Q
  tiles against one K/V tile (every step is both the first and the last of its Q tile), ragged tails
  on both sides, causal with seqlen_q > seqlen_k (whole Q tiles that see no key, written by the
  initialisation pass) and seqlen_q < seqlen_k; GQA;
* other tile configurations through `run(..., config=...)`: single-buffered K/V, two MMA row blocks
  per warp (Br = 128), 8 warps, Bc = Br;
* a long sequence (thousands of steps per CTA), determinism, and softmax scales FA1 maps itself
  (negative, zero, large).

Every run goes through `fa1.run` with each fresh allocation (outputs *and* the fp32 workspace) filled
with NaN, so an output row or workspace entry the kernel forgets to write fails the test. The rule is
docs/design.md's: err(kernel) <= 2 * err(torch same dtype) + 1e-5 against the float64 reference, output and
LSE. Run on the GPU host: ``python3 -m pytest -q tests/test_fa1_gpu.py``.
"""
from __future__ import annotations

import functools
import math

import pytest
import torch

from fa_variants.common.config import Sm80Config
from helpers import assert_attention_ok, make_qkv

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@functools.lru_cache(maxsize=1)
def fa1():
    """The FA1 module, or a skip saying why it cannot run on this GPU."""
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        pytest.skip(f"fa1 needs sm80 or newer; this GPU is sm{major}{minor}")
    from fa_variants.ampere import fa1 as module

    return module


def run_poisoned(poisoned, q, k, v, *, causal, softmax_scale=None, config=None):
    """fa1.run with every fresh allocation (out, lse, workspace O, l, m) NaN-filled (conftest's nan_allocations)."""
    scale = 1 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    with poisoned():
        out, lse = fa1().run(q, k, v, causal=causal, softmax_scale=scale, config=config)
        torch.cuda.synchronize()
    return out, lse


def inputs(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype=torch.bfloat16):
    return make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype=dtype, device="cuda")


def assert_passes(out, lse, q, k, v, causal, softmax_scale=None):
    assert_attention_ok(out, lse, q, k, v, causal, softmax_scale)


# (seqlen_q, seqlen_k): one Q tile x many K/V tiles, many x one, ragged, causal rows without keys
STATE_SHAPES = [(1, 4097), (64, 1000), (1000, 64), (333, 517), (300, 40), (129, 1), (100, 700), (2048, 2048)]


@pytest.mark.parametrize("seqlens", STATE_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_hbm_state_round_trips(nan_allocations, dtype, head_dim, causal, seqlens):
    q, k, v = inputs(2, *seqlens, 4, 2, head_dim, DTYPES[dtype])  # GQA 4:2
    out, lse = run_poisoned(nan_allocations, q, k, v, causal=causal)
    assert_passes(out, lse, q, k, v, causal)


TILES = [Sm80Config(64, 128, 4, 1, 2), Sm80Config(128, 64, 4, 2, 2), Sm80Config(128, 128, 8, 1, 2),
         Sm80Config(64, 64, 4, 2, 2)]


@pytest.mark.parametrize("seqlens", [(333, 517), (1, 300), (700, 200)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"{t.tile_m}x{t.tile_n}w{t.warps}s{t.stages}")
def test_other_tile_configurations(nan_allocations, tiles, seqlens):
    q, k, v = inputs(2, *seqlens, 3, 1, 128)  # MQA
    out, lse = run_poisoned(nan_allocations, q, k, v, causal=True, config=tiles)
    assert_passes(out, lse, q, k, v, True)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_long_sequence(nan_allocations, causal):
    q, k, v = inputs(1, 8192, 8192, 2, 2, 128)  # 128 x 64 = 8192 (i, j) steps per CTA
    out, lse = run_poisoned(nan_allocations, q, k, v, causal=causal)
    assert_passes(out, lse, q, k, v, causal)


def test_deterministic():
    q, k, v = inputs(2, 777, 1500, 4, 4, 64)
    first = fa1().run(q, k, v, causal=True, softmax_scale=0.125)
    for _ in range(3):
        again = fa1().run(q, k, v, causal=True, softmax_scale=0.125)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.parametrize("scale", [-0.125, 0.0, 10.0])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_softmax_scales(nan_allocations, scale, causal):
    q, k, v = inputs(1, 200, 300, 2, 2, 64)
    out, lse = run_poisoned(nan_allocations, q, k, v, causal=causal, softmax_scale=scale)
    assert_passes(out, lse, q, k, v, causal, scale)


def test_strided_inputs(nan_allocations):
    """q, k, v from one packed projection (B, N, 3, H, D): non-contiguous heads and sequence strides."""
    qkv = torch.randn(2, 390, 3, 4, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(dim=2)
    out, lse = run_poisoned(nan_allocations, q, k, v, causal=True)
    assert_passes(out, lse, q, k, v, True)


def test_gqa_prefill_every_head_many_draws(nan_allocations):
    """test_edge_cases.py::test_ec08b's shape (1 x 200 x 200, 8:2 GQA, D 64, causal, bf16) over 100 fresh draws, each
    head against the rule on its own (800 heads), and beside fa2 on the same inputs. fa1 once rounded P / l_new to
    bf16 (a rounding on each row's largest weight that fa2, whose P has row max 1, does not make): ~1.4x fa2's error
    at the median and ~1 head in 3000 over the rule (scripts/fa1tol_model.py); in Algorithm 1 line 12's order its
    error is fa2's (model: ratio 1.00, no head over the rule in 6000)."""
    from fa_variants import attention
    from fa_variants.reference import references

    fails, ratios = [], []
    for draw in range(100):
        q, k, v = inputs(1, 200, 200, 8, 2, 64)
        out, _ = run_poisoned(nan_allocations, q, k, v, causal=True)
        out2 = attention(q, k, v, causal=True, backend="fa2")
        refs = references(q, k, v, causal=True)
        for h in range(8):
            exact = refs.out[:, :, h].double()
            err, err2, err_torch = ((x[:, :, h].double() - exact).abs().max().item()
                                    for x in (out, out2, refs.out_torch))
            if not err <= 2 * err_torch + 1e-5:
                fails.append(f"draw {draw} head {h}: err {err:.3e} vs torch {err_torch:.3e}")
            ratios.append(err / max(err2, 1e-30))
    median = sorted(ratios)[len(ratios) // 2]
    assert not fails, f"{len(fails)} of 800 heads over the rule: {fails[:5]}"
    assert median <= 1.15, f"fa1's error is {median:.2f}x fa2's at the median (expected ~1.0; 1.4 = P / l rounded)"
