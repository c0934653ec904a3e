"""Per-sequence KV lengths (`seqlens_k`) on the CPU: the reference's semantics against an explicit float64
mask, the public API (reference backend) and the validation (one-line errors naming seqlens_k)."""
import math

import pytest
import torch

import fa_variants
from fa_variants.reference import attention_reference
from helpers import padded_kv_cache


def _masked_float64(q, k, v, lengths, causal):
    """softmax over an explicit mask: query i of sequence b sees key j iff j < L_b and (causal) j <= i + L_b - Nq."""
    batch, nq, h, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    kk = k.double().repeat_interleave(h // hkv, dim=2)
    vv = v.double().repeat_interleave(h // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), kk) / math.sqrt(d)
    i = torch.arange(nq).view(nq, 1)
    j = torch.arange(nk).view(1, nk)
    visible = torch.stack([(j < n) & ((j <= i + n - nq) if causal else True) for n in lengths])  # (B, Nq, Nk)
    s = s.masked_fill(~visible[:, None], -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(visible[:, None], torch.exp(s - lse.unsqueeze(-1)), 0.0)
    vv = torch.where(torch.isfinite(vv), vv, 0.0)  # padding keys hold NaN: never visible here
    return torch.einsum("bhqk,bkhd->bqhd", p, vv), lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q", [1, 4, 17])
def test_reference_matches_explicit_mask(rng_seed, causal, seqlen_q):
    lengths = [0, 1, 113, 127, 5, 127]
    q, k, v, seqlens_k = padded_kv_cache(lengths, seqlen_q, 127, 8, 2, 64, dtype=torch.float32,
                                         generator=torch.Generator().manual_seed(rng_seed))  # padding: NaN
    out, lse = attention_reference(q, k, v, causal=causal, seqlens_k=seqlens_k)
    want_out, want_lse = _masked_float64(q, k, v, lengths, causal)
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(lse == -math.inf, want_lse == -math.inf)
    assert (lse[0] == -math.inf).all() and (out[0] == 0).all()  # length 0: O = 0, LSE -inf
    finite = want_lse > -math.inf
    assert torch.allclose(lse[finite], want_lse[finite], atol=1e-10)
    assert torch.allclose(out, want_out, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_public_api_reference_backend(causal):
    lengths = torch.tensor([3, 0, 64, 1], dtype=torch.int32)
    q, k, v = torch.randn(4, 2, 4, 32), torch.randn(4, 64, 2, 32), torch.randn(4, 64, 2, 32)
    out, lse = fa_variants.attention(q, k, v, causal=causal, backend="reference", return_lse=True, seqlens_k=lengths)
    for b, n in enumerate(lengths.tolist()):
        o1, l1 = fa_variants.attention(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], causal=causal,
                                       backend="reference", return_lse=True)
        assert torch.allclose(out[b:b + 1], o1, atol=1e-6) and torch.equal(lse[b:b + 1] == -math.inf, l1 == -math.inf)
    # all lengths full: the same as no seqlens_k
    full = torch.full((4,), 64, dtype=torch.int32)
    assert torch.allclose(fa_variants.attention(q, k, v, causal=causal, backend="reference", seqlens_k=full),
                          fa_variants.attention(q, k, v, causal=causal, backend="reference"), atol=1e-6)


@pytest.mark.parametrize("bad,error,match", [
    (torch.tensor([1, -1], dtype=torch.int32), ValueError, r"seqlens_k holds -1, outside \[0, seqlen_k = 8\]"),
    (torch.tensor([9, 1], dtype=torch.int32), ValueError, r"seqlens_k holds 9"),
    (torch.tensor([1, 2]), TypeError, "seqlens_k must have dtype torch.int32"),
    (torch.tensor([1, 2, 3], dtype=torch.int32), ValueError, r"seqlens_k must have shape \(batch,\) = \(2,\)"),
    (torch.tensor([[1, 2]], dtype=torch.int32), ValueError, "seqlens_k must have shape"),
    ([1, 2], TypeError, "seqlens_k must be a torch.Tensor"),
    (torch.tensor([1, 2], dtype=torch.int32, device="meta"), ValueError, "seqlens_k is on meta"),
])
def test_validation(bad, error, match):
    q, k, v = torch.randn(2, 1, 2, 16), torch.randn(2, 8, 2, 16), torch.randn(2, 8, 2, 16)
    k0 = k.clone()
    with pytest.raises(error, match=match):
        fa_variants.attention(q, k, v, backend="reference", seqlens_k=bad)
    with pytest.raises(error, match=match):
        attention_reference(q, k, v, seqlens_k=bad)
    assert torch.equal(k, k0)  # nothing of the caller's modified


@pytest.mark.parametrize("name,limit", [("seqlens_k", "seqlen_k"), ("seqlens_q", "seqlen_q"), ("leftpad_k", "seqlen_k")])
def test_the_lengths_check_alone_holds_its_bounds(name, limit):
    """``reference.check_seqlens_k`` with values (what the kernels' launch and the custom op run without the API's
    window check behind it): 0 and the limit itself pass, one past either end is a one-line ValueError naming the
    argument and its limit."""
    from fa_variants.reference import check_seqlens_k

    n = int(torch.randint(1, 50, ()))
    check_seqlens_k(torch.tensor([n, 0], dtype=torch.int32), 2, n, torch.device("cpu"), name=name)
    for bad in (n + 1, -1):
        with pytest.raises(ValueError, match=rf"^{name} holds {bad}, outside \[0, {limit} = {n}\]$"):
            check_seqlens_k(torch.tensor([0, bad], dtype=torch.int32), 2, n, torch.device("cpu"), name=name)


def test_kernel_launch_checks_the_lengths_and_the_config():
    """``common.launch.launch`` (what ``fa3.run`` / ``fa2.run`` call) with seqlens_k: the tensor's dtype, shape and
    device are checked before anything is compiled (the kernel reads seqlens_k[b] for every batch b: a shorter
    tensor would be read past its end), and a config must read the lengths exactly when a tensor is given."""
    import dataclasses

    from fa_variants.ampere import fa2
    from fa_variants.common import launch

    q, k, v = torch.randn(2, 1, 2, 64, dtype=torch.bfloat16), *(torch.randn(2, 8, 2, 64, dtype=torch.bfloat16),) * 2
    config = dataclasses.replace(fa2.default_config("sm_80", 64, False), seqlens_k=True)
    with pytest.raises(ValueError, match="seqlens_k given for a config with seqlens_k=False"):
        launch.launch(fa2.VARIANT, q, k, v, causal=False, softmax_scale=0.1,
                      seqlens_k=torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="seqlens_k missing for a config with seqlens_k=True"):
        launch.launch(fa2.VARIANT, q, k, v, causal=False, softmax_scale=0.1, config=config)
    for bad, error in ((torch.tensor([1], dtype=torch.int32), ValueError), (torch.tensor([1, 2]), TypeError)):
        with pytest.raises(error, match="seqlens_k"):
            launch.launch(fa2.VARIANT, q, k, v, causal=False, softmax_scale=0.1, config=config, seqlens_k=bad)


def test_meta_tensors_get_the_shapes():
    """seqlens_k on the meta device (shape propagation): no values to check or split by; the outputs' shapes."""
    q, k = torch.empty(2, 3, 4, 64, device="meta"), torch.empty(2, 5, 2, 64, device="meta")
    lengths = torch.empty(2, dtype=torch.int32, device="meta")
    out, lse = fa_variants.attention(q, k, k, seqlens_k=lengths, return_lse=True)
    assert out.shape == q.shape and out.device.type == "meta" and lse.shape == (2, 4, 3)


def test_eager_parameter_with_split_options_is_not_called_traced():
    """An nn.Parameter q is an eager tensor: num_splits on a CPU call names the backends that take it (it was
    refused as 'under tracing')."""
    q = torch.nn.Parameter(torch.randn(2, 3, 4, 64))
    k = torch.randn(2, 5, 2, 64)
    with pytest.raises(ValueError, match="fa3 and fa2 backends only"):
        fa_variants.attention(q, k, k, num_splits=2, seqlens_k=torch.tensor([1, 5], dtype=torch.int32))


def test_check_against_reference_takes_seqlens_k():
    """check_against_reference / check_lse with seqlens_k compare with the reference of those lengths (the padding
    NaN): the lengths' own output passes, and without them the same output fails."""
    from fa_variants.reference import check_against_reference, check_lse

    q, k, v, lengths = padded_kv_cache([5, 0, 9], 3, 9, 4, 2, 64, dtype=torch.bfloat16)
    out, lse = fa_variants.attention(q, k, v, causal=True, return_lse=True, seqlens_k=lengths)
    assert check_against_reference(out, q, k, v, True, seqlens_k=lengths).ok
    assert check_lse(lse, q, k, v, True, seqlens_k=lengths).ok
    k, v = k.nan_to_num(), v.nan_to_num()
    assert not check_against_reference(out, q, k, v, True).ok


def test_host_lengths_are_accepted_only_where_asked():
    """``check_seqlens_k(host_ok=True)`` (the API's traced path and the op's fake: the eager call copies CPU lengths
    to q's device) takes a CPU tensor for another device; without it the devices must match."""
    from fa_variants.reference import check_seqlens_k

    lengths = torch.tensor([1, 2], dtype=torch.int32)
    check_seqlens_k(lengths, 2, 4, torch.device("meta"), values=False, host_ok=True)
    with pytest.raises(ValueError, match="seqlens_k is on cpu but q is on meta"):
        check_seqlens_k(lengths, 2, 4, torch.device("meta"), values=False)
    with pytest.raises(ValueError, match="seqlens_k is on meta"):
        check_seqlens_k(lengths.to("meta"), 2, 4, torch.device("cpu"), values=False, host_ok=True)


def test_seqlens_k_batched_by_vmap_is_one_line():
    """torch.func.vmap over seqlens_k failed with torch's generic ".item()" message, which did not say which input
    or why; now a NotImplementedError naming seqlens_k (also under grad of vmap). Unbatched seqlens_k (in_dims None)
    still runs under vmap, and matches the per-slice calls."""
    q, k, v = torch.randn(3, 2, 5, 4, 16), torch.randn(3, 2, 7, 2, 16), torch.randn(3, 2, 7, 2, 16)
    lens = torch.tensor([[7, 3], [2, 5], [1, 1]], dtype=torch.int32)

    def per_slice(q, k, v, lengths):
        return fa_variants.attention(q, k, v, causal=True, seqlens_k=lengths)

    for run in (lambda: torch.func.vmap(per_slice)(q, k, v, lens),
                lambda: torch.func.grad(lambda q: torch.func.vmap(per_slice)(q, k, v, lens).sum())(q)):
        with pytest.raises(NotImplementedError, match=r"^seqlens_k batched by torch.func.vmap: .*in_dims None\)$"):
            run()
    out = torch.func.vmap(per_slice, in_dims=(0, 0, 0, None))(q, k, v, lens[1])
    for i in range(3):
        torch.testing.assert_close(out[i], per_slice(q[i], k[i], v[i], lens[1]))
