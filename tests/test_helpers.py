"""The shared test helpers (tests/helpers.py) can fail: the check rejects NaN, a wrong output, a wrong LSE,
a wrong shape or dtype; make_qkv draws fresh inputs of the asked shapes."""
import math
import random

import pytest
import torch

import fa_variants
from helpers import assert_attention_ok, make_qkv


def _case(dtype=torch.float32, causal=True):
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    q, k, v = make_qkv(2, 9, 13, 4, 2, 16, dtype=dtype, generator=gen)
    out, lse = fa_variants.attention(q, k, v, causal=causal, backend="reference", return_lse=True)
    return q, k, v, out, lse


def test_make_qkv_shapes_fresh_and_scaled():
    q, k, v = make_qkv(2, 3, 5, 6, 2, 8, dtype=torch.float16, std=4.0)
    assert q.shape == (2, 3, 6, 8) and k.shape == v.shape == (2, 5, 2, 8) and q.dtype == torch.float16
    assert not torch.equal(k, v) and not torch.equal(q, make_qkv(2, 3, 5, 6, 2, 8, dtype=torch.float16)[0])
    big = make_qkv(1, 4096, 1, 1, 1, 8, dtype=torch.float32, std=4.0)[0]
    assert 3.5 < big.std().item() < 4.5
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert all(torch.equal(a, b) for a, b in zip(make_qkv(1, 3, 3, 2, 2, 8, generator=g1),
                                                 make_qkv(1, 3, 3, 2, 2, 8, generator=g2)))


@pytest.mark.parametrize("causal", [False, True])
def test_check_passes_the_reference_backend(causal):
    q, k, v, out, lse = _case(causal=causal)
    assert_attention_ok(out, lse, q, k, v, causal)


@pytest.mark.parametrize("spoil, message", [
    (lambda out, lse: out.view(-1).__setitem__(5, math.nan), "NaN in the output"),
    (lambda out, lse: lse.view(-1).__setitem__(3, math.nan), "NaN in the LSE"),
    (lambda out, lse: out.view(-1).__setitem__(7, out.view(-1)[7] + 1e-3), "output: FAIL"),
    (lambda out, lse: lse.view(-1).__setitem__(2, lse.view(-1)[2] + 1e-3), "LSE: FAIL"),
])
def test_check_fails_a_wrong_result(spoil, message):
    q, k, v, out, lse = _case()
    spoil(out, lse)
    with pytest.raises(AssertionError, match=message):
        assert_attention_ok(out, lse, q, k, v, True, what="spoilt")


def test_check_fails_a_wrong_shape_or_dtype():
    q, k, v, out, lse = _case()
    with pytest.raises(AssertionError, match="out"):
        assert_attention_ok(out.double(), lse, q, k, v, True)
    with pytest.raises(AssertionError, match="lse"):
        assert_attention_ok(out, lse.transpose(1, 2), q, k, v, True)
