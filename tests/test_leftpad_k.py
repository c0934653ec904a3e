"""Each sequence's first key (`leftpad_k`, a KV cache padded on the left) on the CPU: the reference's semantics
against an explicit float64 mask, the public API (reference backend; the kernels' grouped path on a fake sm_90), its
validation (one-line errors naming leftpad_k), autograd and torch.compile."""
import math

import pytest
import torch

import fa_variants
from fa_variants.reference import attention_reference, check_against_reference, check_lse
from helpers import windowed_kv_cache

#: (start, end) windows of a 127-key cache: left padding, both sides, empty (start = end, and 0 keys), one key,
#: the whole cache
WINDOWS = [(14, 127), (3, 113), (127, 127), (40, 40), (126, 127), (0, 127), (5, 6)]


def _masked_float64(q, k, v, windows, causal):
    """softmax over an explicit mask: query i of sequence b sees key j iff start_b <= j < end_b and (causal)
    j <= i + end_b - Nq (bottom-right against the window's count)."""
    batch, nq, h, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    kk, vv = (t.double().repeat_interleave(h // hkv, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), kk.nan_to_num()) / math.sqrt(d)
    i, j = torch.arange(nq).view(nq, 1), torch.arange(nk).view(1, nk)
    visible = torch.stack([(j >= a) & (j < e) & ((j <= i + e - nq) if causal else True) for a, e in windows])
    s = s.masked_fill(~visible[:, None], -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(visible[:, None], torch.exp(s - lse.unsqueeze(-1)), 0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, vv.nan_to_num()), lse


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q", [1, 4, 113])
def test_reference_matches_explicit_mask(rng_seed, causal, seqlen_q):
    """Keys outside each window hold NaN: never read. Empty windows give O = 0 and LSE -inf; so do causal rows
    that see no key of their window (seqlen_q above its count)."""
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache(WINDOWS, seqlen_q, 127, 8, 2, 64, dtype=torch.float32,
                                                      generator=torch.Generator().manual_seed(rng_seed))
    out, lse = attention_reference(q, k, v, causal=causal, seqlens_k=seqlens_k, leftpad_k=leftpad_k)
    want_out, want_lse = _masked_float64(q, k, v, WINDOWS, causal)
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(lse == -math.inf, want_lse == -math.inf)
    assert (lse[2:4] == -math.inf).all() and not out[2:4].any()
    finite = want_lse > -math.inf
    assert torch.allclose(lse[finite], want_lse[finite], atol=1e-10)
    assert torch.allclose(out, want_out, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_public_api_reference_backend(causal):
    """attention(leftpad_k=...) is the call on k[b, start:end] for each sequence; leftpad_k alone runs each window to
    seqlen_k; all zeros is seqlens_k alone."""
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache(WINDOWS, 3, 127, 4, 2, 32, dtype=torch.float32)
    out, lse = fa_variants.attention(q, k, v, causal=causal, return_lse=True, seqlens_k=seqlens_k,
                                     leftpad_k=leftpad_k, backend="reference")
    for b, (start, end) in enumerate(WINDOWS):
        o1, l1 = fa_variants.attention(q[b:b + 1], k[b:b + 1, start:end], v[b:b + 1, start:end], causal=causal,
                                       return_lse=True, backend="reference")
        assert torch.allclose(out[b:b + 1], o1, atol=1e-6) and torch.equal(lse[b:b + 1] == -math.inf, l1 == -math.inf)
    k, v = k.nan_to_num(), v.nan_to_num()
    alone = fa_variants.attention(q, k, v, causal=causal, leftpad_k=leftpad_k, backend="reference")
    ends = torch.full_like(seqlens_k, 127)
    assert torch.equal(alone, fa_variants.attention(q, k, v, causal=causal, seqlens_k=ends, leftpad_k=leftpad_k,
                                                    backend="reference"))
    zeros = torch.zeros_like(leftpad_k)
    assert torch.equal(fa_variants.attention(q, k, v, causal=causal, seqlens_k=seqlens_k, leftpad_k=zeros),
                       fa_variants.attention(q, k, v, causal=causal, seqlens_k=seqlens_k))


@pytest.mark.parametrize("bad,error,match", [
    (torch.tensor([1, -1], dtype=torch.int32), ValueError, r"leftpad_k holds -1, outside \[0, seqlen_k = 8\]"),
    (torch.tensor([9, 1], dtype=torch.int32), ValueError, r"leftpad_k holds 9"),
    (torch.tensor([6, 1], dtype=torch.int32), ValueError, r"leftpad_k\[0\] = 6 is past seqlens_k\[0\] = 5"),
    (torch.tensor([1, 2]), TypeError, "leftpad_k must have dtype torch.int32"),
    (torch.tensor([1, 2, 3], dtype=torch.int32), ValueError, r"leftpad_k must have shape \(batch,\) = \(2,\)"),
    ([1, 2], TypeError, "leftpad_k must be a torch.Tensor"),
    (torch.tensor([1, 2], dtype=torch.int32, device="meta"), ValueError, "leftpad_k is on meta"),
])
def test_validation(bad, error, match):
    """One line naming leftpad_k, from the API and the reference, with seqlens_k and (but for the end check) alone;
    nothing of the caller's modified."""
    q, k, v = torch.randn(2, 1, 2, 16), torch.randn(2, 8, 2, 16), torch.randn(2, 8, 2, 16)
    ends = torch.tensor([5, 8], dtype=torch.int32)
    saved = [t.clone() for t in (k, ends)]
    for call in (fa_variants.attention, attention_reference):
        with pytest.raises(error, match=match):
            call(q, k, v, seqlens_k=ends, leftpad_k=bad)
        if "past seqlens_k" not in match:
            with pytest.raises(error, match=match):
                call(q, k, v, leftpad_k=bad)
    assert all(torch.equal(a, b) for a, b in zip((k, ends), saved))


def test_check_against_reference_takes_leftpad_k():
    """The checks with leftpad_k compare with the reference of those windows (the padding NaN)."""
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache([(2, 9), (0, 0), (4, 5)], 3, 9, 4, 2, 64, dtype=torch.bfloat16)
    out, lse = fa_variants.attention(q, k, v, causal=True, return_lse=True, seqlens_k=seqlens_k, leftpad_k=leftpad_k)
    assert check_against_reference(out, q, k, v, True, seqlens_k=seqlens_k, leftpad_k=leftpad_k).ok
    assert check_lse(lse, q, k, v, True, seqlens_k=seqlens_k, leftpad_k=leftpad_k).ok
    k, v = k.nan_to_num(), v.nan_to_num()
    assert not check_against_reference(out, q, k, v, True, seqlens_k=seqlens_k).ok


def test_grouped_calls_on_a_kernel_that_reads_no_windows(fake_gpu, monkeypatch):
    """A kernel backend whose kernel does not read the windows (fa1, fa3-fp8; here the fake sm_90's fa3) runs one
    call per distinct non-empty window, on that window's sequences and K / V cut to it; the output within the rule
    against float64 (the padding NaN on both sides)."""
    from fa_variants import api

    monkeypatch.setattr(api, "_kernel_module", lambda backend: None)
    windows = [(14, 127), (3, 113), (14, 127), (40, 40), (0, 127)]
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache(windows, 5, 127, 4, 2, 64, dtype=torch.bfloat16)
    out = fa_variants.attention(q, k, v, causal=True, seqlens_k=seqlens_k, leftpad_k=leftpad_k)
    got = sorted((call["q"].shape[0], call["k"].shape[1]) for call in fake_gpu)
    assert got == sorted([(2, 113), (1, 110), (1, 127)]), got
    assert check_against_reference(out, q, k, v, True, seqlens_k=seqlens_k, leftpad_k=leftpad_k).ok
    assert not out[3].any()


def test_gradients_and_compile():
    """Autograd (reference backend): gradients within the rule against float64, dK and dV 0 outside each window;
    torch.compile(fullgraph=True) gives the eager result (the seqlens_k op, leftpad_k its last argument)."""
    from helpers import assert_grads_within_rule, exact_grads

    windows = [(14, 127), (3, 113), (127, 127), (0, 127)]
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache(windows, 4, 127, 4, 2, 32, dtype=torch.bfloat16)
    k, v = k.nan_to_num(), v.nan_to_num()  # a gradient flows to every key of K and V (0 outside the windows)
    grad_out = torch.randn(q.shape, dtype=q.dtype)
    kwargs = dict(causal=True, seqlens_k=seqlens_k, leftpad_k=leftpad_k)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    got = torch.autograd.grad(fa_variants.attention(*leaves, **kwargs), leaves, grad_out)
    same_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    same = torch.autograd.grad(attention_reference(*same_leaves, dtype=torch.bfloat16, **kwargs)[0], same_leaves,
                               grad_out)
    assert_grads_within_rule(got, same, exact_grads(q, k, v, grad_out, **kwargs))
    for b, (start, end) in enumerate(windows):
        for g in got[1:]:
            assert not g[b, :start].any() and not g[b, end:].any()
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lambda q, k, v, e, s: fa_variants.attention(q, k, v, causal=True, seqlens_k=e,
                                                                              leftpad_k=s), fullgraph=True)
        assert torch.equal(compiled(q, k, v, seqlens_k, leftpad_k), fa_variants.attention(q, k, v, **kwargs))
    finally:
        torch._dynamo.reset()


def test_the_op_passes_opcheck():
    """torch.library.opcheck of the seqlens_k op with leftpad_k (schema, fake, autograd registration) and without
    it (an op call that predates leftpad_k)."""
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache([(2, 9), (0, 5)], 3, 9, 4, 2, 16, dtype=torch.float32)
    k, v = k.nan_to_num(), v.nan_to_num()
    op = torch.ops.fa_variants.attention_seqlens_k
    torch.library.opcheck(op, (q, k, v, seqlens_k, True, None, "reference", leftpad_k))
    torch.library.opcheck(op, (q, k, v, seqlens_k, True, None, "reference"))


def test_kernel_launch_checks_leftpad_k_and_the_config():
    """``common.launch.launch`` with leftpad_k: checked before anything compiles, and a config must read the first
    keys exactly when the tensor is given (``Sm80Config.leftpad_k``, which needs seqlens_k)."""
    import dataclasses

    from fa_variants.ampere import fa2
    from fa_variants.common import launch

    q, k, v = torch.randn(2, 1, 2, 64, dtype=torch.bfloat16), *(torch.randn(2, 8, 2, 64, dtype=torch.bfloat16),) * 2
    ends = torch.tensor([5, 8], dtype=torch.int32)
    lengths = dataclasses.replace(fa2.default_config("sm_80", 64, False), seqlens_k=True)
    config = dataclasses.replace(lengths, leftpad_k=True)
    with pytest.raises(ValueError, match="leftpad_k given for a config with leftpad_k=False"):
        launch.launch(fa2.VARIANT, q, k, v, causal=False, softmax_scale=0.1, config=lengths, seqlens_k=ends,
                      leftpad_k=torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="leftpad_k missing for a config with leftpad_k=True"):
        launch.launch(fa2.VARIANT, q, k, v, causal=False, softmax_scale=0.1, config=config, seqlens_k=ends)
    with pytest.raises(TypeError, match="leftpad_k must have dtype"):
        launch.launch(fa2.VARIANT, q, k, v, causal=False, softmax_scale=0.1, config=config, seqlens_k=ends,
                      leftpad_k=torch.tensor([1, 2]))


def test_seqlens_k_values_are_checked_beside_leftpad_k():
    """With leftpad_k the two tensors' values are read back together (one device sync): seqlens_k's own range errors
    still name seqlens_k."""
    q, k = torch.randn(2, 1, 2, 16), torch.randn(2, 8, 2, 16)
    starts = torch.tensor([0, 1], dtype=torch.int32)
    for bad, match in (([9, 8], "seqlens_k holds 9"), ([-1, 8], "seqlens_k holds -1")):
        with pytest.raises(ValueError, match=match):
            fa_variants.attention(q, k, k, seqlens_k=torch.tensor(bad, dtype=torch.int32), leftpad_k=starts)


def test_module_runs_take_leftpad_k_alone(monkeypatch):
    """fa3.run / fa2.run with leftpad_k and no seqlens_k run each window to seqlen_k, as the API does (they raised a
    config error): the config reads both, and ``common.launch`` hands the kernel the ends (seqlen_k) then the first
    keys. (The kernel itself is stubbed: no GPU here.)"""
    from fa_variants.ampere import fa2
    from fa_variants.common import launch
    from fa_variants.hopper import fa3

    q, k = torch.randn(2, 3, 4, 64, dtype=torch.bfloat16), torch.randn(2, 9, 2, 64, dtype=torch.bfloat16)
    starts = torch.tensor([1, 0], dtype=torch.int32)
    for module in (fa3, fa2):
        seen = {}
        monkeypatch.setattr(launch, "launcher", lambda *a, **kw: lambda *args: seen.update(config=kw["config"],
                                                                                          extra=args[4:]))
        monkeypatch.setattr(module, "scale_config", lambda config, *a: config)
        monkeypatch.setattr(module, "_problem_config", lambda config, *a: config)
        module.run(q, k, k, causal=True, softmax_scale=0.1, leftpad_k=starts,
                   config=module.default_config("sm_90a" if module is fa3 else "sm_80", 64, True))
        assert seen["config"].leftpad_k and seen["config"].seqlens_k, module.__name__
        ends, first = seen["extra"]
        assert ends.tolist() == [9, 9] and torch.equal(first, starts)


def test_a_host_leftpad_k_alone_inside_capture_is_named(monkeypatch):
    """Inside CUDA-graph capture a CPU leftpad_k given alone is refused naming leftpad_k (the ends the call makes
    for it were named first, as seqlens_k, which the caller never passed). Capture and a CUDA q are simulated."""
    from fa_variants import api

    class CudaLooking(torch.Tensor):
        @property
        def is_cuda(self):
            return True

    q, k = torch.randn(2, 1, 2, 16).as_subclass(CudaLooking), torch.randn(2, 8, 2, 16)
    starts = torch.tensor([1, 2], dtype=torch.int32)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(ValueError, match="^leftpad_k is on the CPU inside CUDA-graph capture"):
        api._check_windows(q, k, api._full_ends(q, k, starts), starts)
