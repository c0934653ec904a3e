"""The shared test helpers (tests/helpers.py) can fail: the check rejects NaN, a wrong output, a wrong LSE,
a wrong shape or dtype, a wrong answer for per-sequence KV lengths; make_qkv draws fresh inputs of the asked
shapes, padded_kv_cache a KV cache whose padding is NaN."""
import math
import random
from types import SimpleNamespace

import pytest
import torch

import fa_variants
from helpers import assert_attention_ok, make_qkv, padded_kv_cache


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


@pytest.mark.parametrize("causal", [False, True])
def test_padded_kv_cache_and_the_seqlens_k_check(causal):
    """padded_kv_cache: NaN exactly past each length, seqlens_k int32; the check with seqlens_k passes the
    reference backend, and fails a length-0 row that is not 0 / LSE -inf, or a sequence answered at another length."""
    lengths = [0, 1, 7, 13]
    q, k, v, seqlens_k = padded_kv_cache(lengths, 3, 13, 4, 2, 16, dtype=torch.float32)
    assert seqlens_k.dtype == torch.int32 and seqlens_k.tolist() == lengths and q.shape == (4, 3, 4, 16)
    for t in (k, v):
        assert all(t[b, n:].isnan().all() and not t[b, :n].isnan().any() for b, n in enumerate(lengths))
    out, lse = fa_variants.attention(q, k, v, causal=causal, backend="reference", return_lse=True, seqlens_k=seqlens_k)
    assert_attention_ok(out, lse, q, k, v, causal, seqlens_k=seqlens_k)
    bad_out, bad_lse = out.clone(), lse.clone()
    bad_out[0, 2, 1, 3], bad_lse[0, 1, 2] = 1.0, 0.0
    with pytest.raises(AssertionError, match="length-0 sequence's output"):
        assert_attention_ok(bad_out, lse, q, k, v, causal, seqlens_k=seqlens_k)
    with pytest.raises(AssertionError, match="length-0 sequence's LSE"):
        assert_attention_ok(out, bad_lse, q, k, v, causal, seqlens_k=seqlens_k)
    with pytest.raises(AssertionError, match="output: FAIL"):
        assert_attention_ok(out, lse, q, k, v, causal, seqlens_k=torch.tensor([0, 1, 7, 12], dtype=torch.int32))


@pytest.mark.parametrize("worker,initialised,workers,reserved_gib,released", [
    ("gw3", True, "8", 6, True), ("gw3", True, "8", 4, False), ("gw3", True, None, 41, True),
    ("gw3", True, "1", 39, False), ("gw3", False, "8", 6, False), (None, True, "8", 6, False),
    ("", True, "8", 6, False)])
def test_release_cached_gpu_memory_only_past_a_workers_share(monkeypatch, worker, initialised, workers, reserved_gib,
                                                              released):
    """conftest's ``release_gpu_cache``: torch's cached CUDA blocks are emptied after a test only in an xdist worker
    that has initialised CUDA and holds more than total / (2 x workers) (here an 80 GiB card: 5 GiB at 8 workers,
    40 GiB for one or an unknown count); a serial run, a worker without CUDA or one under its share keeps its cache."""
    import helpers
    calls = []
    for name, value in (("PYTEST_XDIST_WORKER", worker), ("PYTEST_XDIST_WORKER_COUNT", workers)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialised)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: reserved_gib * 2**30)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    assert helpers.release_cached_gpu_memory() is released
    assert len(calls) == int(released)
