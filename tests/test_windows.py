"""Padded batches as one key window per sequence (common.mask_windows, fa_variants.windowed): the SDPA drop-in's
attn_mask for masks that causal + seqlens_k cannot express but plain calls on slices can (left padding, a causal
batch padded on the right, both, a KV cache after left padding), against float64 attention with the mask itself;
the masks that are not one window per sequence refused in one line."""
from __future__ import annotations

import pytest
import torch

import fa_variants
from fa_variants.common import mask_windows
from helpers import make_qkv, seeded_generator


def _masked_attention(q, k, v, mask):
    """float64 attention with a boolean mask (batch or 1, 1, seqlen_q, seqlen_k) in SDPA's layout, GQA by repeated
    KV heads; a row that sees no key gives 0 (the project's rule) and LSE -inf."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, 1) for t in (k, v))
    s = (q.double() @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.where(mask, torch.exp(s - lse[..., None].clamp(min=-1e300)), 0.0)
    return p @ v, lse


def _window_mask(windows, seqlen_q, seqlen_k):
    rows, keys = torch.arange(seqlen_q)[:, None], torch.arange(seqlen_k)
    return torch.stack([(keys >= s) & (keys < e) & (rows >= 0 if d is None else keys <= rows + d)
                        for s, e, d in windows])[:, None]


CASES = {  # (windows per sequence, seqlen_q, seqlen_k)
    "left-padded prompt": ([(0, 9, 0), (3, 9, 0), (8, 9, 0)], 9, 9),
    "right-padded training batch": ([(0, 9, 0), (0, 5, 0), (0, 1, 0)], 9, 9),
    "left-padded decode step": ([(0, 12, None), (4, 12, None), (11, 12, None)], 1, 12),
    "left-padded encoder": ([(0, 7, None), (2, 7, None), (6, 7, None)], 7, 7),
    "static cache after left padding": ([(0, 10, 8), (2, 6, 4), (4, 5, 3)], 2, 10),
    "mixed, a sequence without keys": ([(1, 6, 2), (0, 0, None), (2, 11, None), (1, 6, 2)], 5, 11),
    "queries before the cache's end": ([(0, 10, 3), (2, 9, 4), (0, 10, 3)], 2, 10),
}



@pytest.mark.parametrize("window", [(2, 9, 0), (3, 7, None)], ids=["causal", "full"])
def test_one_window_for_the_whole_batch_is_every_sequence_s(window):
    """A mask of batch 1 (broadcast over the call's batch, as SDPA allows) gives its window to every sequence: one
    window per sequence of the call, and SDPA's answer for each (not the first sequence's alone)."""
    seqlen_q, seqlen_k = 4, 9
    batch = int(torch.randint(2, 5, ()))
    mask = _window_mask([window], seqlen_q, seqlen_k)  # (1, 1, seqlen_q, seqlen_k)
    found = mask_windows.as_windows(mask, seqlen_q, seqlen_k, batch, 4)
    assert len(found) == batch and len(set(found)) == 1, found
    q, k, v = (t.transpose(1, 2) for t in make_qkv(batch, seqlen_q, seqlen_k, 4, 2, 16, dtype=torch.float64,
                                                   generator=seeded_generator()))
    out = fa_variants.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, backend="reference")
    expected, _ = _masked_attention(q, k, v, mask.expand(batch, 1, seqlen_q, seqlen_k))
    torch.testing.assert_close(out.double(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_windows_match_masked_attention(case, dtype, kind):
    windows, seqlen_q, seqlen_k = CASES[case]
    mask = _window_mask(windows, seqlen_q, seqlen_k)
    q, k, v = (t.transpose(1, 2) for t in make_qkv(len(windows), seqlen_q, seqlen_k, 4, 2, 16, dtype=dtype,
                                                   generator=seeded_generator()))
    given = mask if kind == "bool" else torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))
    found = mask_windows.as_windows(given, seqlen_q, seqlen_k, len(windows), 4)
    # the same mask (a window whose causal limit never bites is read as full; an empty one as (0, 0))
    assert torch.equal(_window_mask(found, seqlen_q, seqlen_k), mask)
    out, lse = fa_variants.scaled_dot_product_attention(q, k, v, attn_mask=given, enable_gqa=True,
                                                        backend="reference", return_lse=True)
    expected, expected_lse = _masked_attention(q, k, v, mask)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=2e-6, atol=2e-6)  # the LSE is float32


def test_window_gradients_match_masked_attention():
    """Autograd through the slices' calls: float64 gradients of a loss of out equal those of masked attention."""
    windows, seqlen_q, seqlen_k = CASES["mixed, a sequence without keys"]
    mask = _window_mask(windows, seqlen_q, seqlen_k)
    inputs = [t.transpose(1, 2) for t in make_qkv(len(windows), seqlen_q, seqlen_k, 4, 2, 16, dtype=torch.float64,
                                                  generator=seeded_generator())]
    grad = torch.randn(inputs[0].shape, dtype=torch.float64, generator=seeded_generator())
    grads = []
    for run in (lambda q, k, v: fa_variants.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True,
                                                                         backend="reference"),
                lambda q, k, v: _masked_attention(q, k, v, mask)[0]):
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        grads.append(torch.autograd.grad(run(*leaves), leaves, grad))
    for g, e in zip(*grads):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


#: windowed.one_call's answer for each case: the causal flag of the one call with seqlens_k / leftpad_k / seqlens_q,
#: and the query counts it passes (None: seqlens_q not needed)
ONE_CALL = {"left-padded prompt": (True, None), "right-padded training batch": (True, [9, 5, 0]),
            "left-padded decode step": (False, None), "left-padded encoder": (False, None),
            "static cache after left padding": (True, None), "mixed, a sequence without keys": (True, [4, 5, 0, 4]),
            "queries before the cache's end": (True, None)}


@pytest.mark.parametrize("case", CASES)
def test_padded_batches_take_one_call(case, monkeypatch):
    """Every mask of one window per sequence runs as one call with the windows' ends as seqlens_k, starts as
    leftpad_k and, where a diagonal is not bottom-right against seqlen_q rows, query counts as seqlens_q (a causal
    batch padded on the right: its lengths; a full window in a causal batch: 0) (fa3 and fa2: one launch); queries
    before a window's end read as the window cut at its last row's last key. Gradients within 1e-12 of masked
    attention's (float64)."""
    from fa_variants import api, windowed

    windows, seqlen_q, seqlen_k = CASES[case]
    found = mask_windows.as_windows(_window_mask(windows, seqlen_q, seqlen_k), seqlen_q, seqlen_k, len(windows), 4)
    causal, counts = ONE_CALL[case]
    assert windowed.one_call(found, seqlen_q) is causal
    calls = []
    monkeypatch.setattr(api, "run_seqlens_k", lambda *a, _f=api.run_seqlens_k, **kw: calls.append(kw) or _f(*a, **kw))
    mask = _window_mask(windows, seqlen_q, seqlen_k)
    inputs = [t.transpose(1, 2) for t in make_qkv(len(windows), seqlen_q, seqlen_k, 4, 2, 16, dtype=torch.float64,
                                                  generator=seeded_generator())]
    grad = torch.randn(inputs[0].shape, dtype=torch.float64, generator=seeded_generator())
    grads = []
    for run in (lambda q, k, v: fa_variants.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
                lambda q, k, v: _masked_attention(q, k, v, mask)[0]):
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        out = run(*leaves)
        grads.append((out, *torch.autograd.grad(out, leaves, grad)))
    assert len(calls) == 1 and calls[0]["leftpad_k"].tolist() == [w.start for w in found]
    assert (calls[0]["seqlens_q"] is None) if counts is None else calls[0]["seqlens_q"].tolist() == counts
    for g, e in zip(*grads):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_windows_past_their_last_rows_keys_are_cut_first():
    """Windows given as they are (not read from a mask), running past the last key their last row sees (queries
    before the window's end): cut there first (``windowed.cut``: ``as_windows`` reads masks so), so one call with
    query counts within [0, seqlen_q] expresses them; the result is masked attention's."""
    from fa_variants import windowed

    windows, seqlen_q, seqlen_k = [(0, 10, 3), (2, 9, 4), (0, 10, None), (5, 9, 1)], 2, 10
    given = [mask_windows.Window(*w) for w in windows]
    causal, (ends, starts, counts) = windowed.one_call_windows(given, seqlen_q)
    assert causal and ends.tolist() == [5, 6, 10, 5] and starts.tolist() == [0, 2, 0, 5]
    assert counts.tolist() == [2, 2, 0, seqlen_q]  # the last: cut to nothing (its rows see keys before 5 only)
    q, k, v = make_qkv(len(windows), seqlen_q, seqlen_k, 4, 2, 16, dtype=torch.float64, generator=seeded_generator())
    out, lse = windowed.attention(q, k, v, given, backend="reference", return_lse=True)
    mask = _window_mask(windows, seqlen_q, seqlen_k)
    expected, expected_lse = _masked_attention(*(t.transpose(1, 2) for t in (q, k, v)), mask)
    torch.testing.assert_close(out.transpose(1, 2), expected.nan_to_num(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, expected_lse.float(), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("what, mask", [
    ("sliding window", torch.ones(6, 6, dtype=torch.bool).tril().triu(-2)[None, None].expand(2, 1, 6, 6)),
    ("packed documents", torch.block_diag(torch.ones(3, 3), torch.ones(3, 3)).bool().tril()[None, None]),
    ("a row with two runs", torch.ones(2, 1, 6, 6, dtype=torch.bool).index_fill(3, torch.tensor([2]), False)),
    ("heads that differ", torch.stack([torch.ones(6, 6, dtype=torch.bool),
                                       torch.ones(6, 6, dtype=torch.bool).tril()])[None].expand(2, 2, 6, 6)),
])
def test_what_is_not_one_window_per_sequence_is_refused(what, mask):
    q = torch.randn(2, 2, 6, 16)
    with pytest.raises(ValueError, match=r"^attn_mask: fa_variants cannot express this attention mask \(a sliding "
                                         r"window that bites, packed sequences, heads that differ\)") as caught:
        fa_variants.scaled_dot_product_attention(q, q, q, attn_mask=mask, backend="reference")
    assert "\n" not in str(caught.value)


def test_windows_of_empty_sizes_and_under_autocast():
    """No row, no key or no head: every window empty (nothing to see). Under autocast (bfloat16 on the CPU) a batch
    of different windows gives autocast's dtype, as one window and the plain call do, through the SDPA drop-in and
    the Hugging Face attention function (which gave float32 for different windows)."""
    from fa_variants.integrations import hf
    for shape, sizes in (((1, 1, 0, 3), (0, 3, 1, 1)), ((1, 1, 3, 0), (3, 0, 1, 1)), ((1, 0, 3, 3), (3, 3, 1, 0))):
        assert mask_windows.as_windows(torch.zeros(shape, dtype=torch.bool), *sizes) == [(0, 0, None)]
    windows, seqlen_q, seqlen_k = CASES["left-padded prompt"]
    q = torch.randn(3, 4, seqlen_q, 16)
    for mask in (_window_mask(windows, seqlen_q, seqlen_k), _window_mask(windows[:1] * 3, seqlen_q, seqlen_k)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fa_variants.scaled_dot_product_attention(q, q, q, attn_mask=mask, backend="reference")
            hf_out = hf.attention_forward(torch.nn.Module(), q, q, q, mask, backend="reference")[0]
        assert out.dtype == hf_out.dtype == torch.bfloat16


def test_a_padded_batch_mask_is_read_once_per_step(monkeypatch):
    """The Hugging Face path reads the mask every layer shares once per step: its refusal as lengths and its key
    windows are kept while the tensor's version counter stands (an in-place change reads it again)."""
    from fa_variants.common import mask_lengths
    from fa_variants.integrations import hf
    reads = []
    for module, name in ((mask_lengths, "_read"), (mask_windows, "_read")):
        monkeypatch.setattr(module, name, lambda *a, _f=getattr(module, name): reads.append(1) or _f(*a))
    windows, seqlen_q, seqlen_k = CASES["left-padded prompt"]
    mask = _window_mask(windows, seqlen_q, seqlen_k)
    q = torch.randn(3, 4, seqlen_q, 16)
    outs = [hf.attention_forward(torch.nn.Module(), q, q, q, mask, backend="reference")[0] for _ in range(3)]
    assert len(reads) == 2 and all(torch.equal(o, outs[0]) for o in outs)
    mask[1, 0, :, 3] = False  # the second sequence's first key hidden too: another window
    mask[1, 0, :3, :] = False
    hf.attention_forward(torch.nn.Module(), q, q, q, mask, backend="reference")
    assert len(reads) == 4


def test_a_full_window_in_a_call_fixed_causal_gets_query_count_zero():
    """windowed.one_call_windows(causal=True) (a traced causal layer, whose call's flag is fixed): a full window's
    query count is 0, so the causal call sees all of it; the window's own flag (False) would give seqlen_q, a
    bottom-right diagonal that hides keys the mask shows."""
    from fa_variants import windowed
    from fa_variants.reference import attention_reference

    full = [mask_windows.Window(0, 5, None)]
    assert windowed.one_call_windows(full, 4)[1][2].tolist() == [4]
    needed, (ends, starts, counts) = windowed.one_call_windows(full, 4, causal=True)
    assert needed is False and (ends.tolist(), starts.tolist(), counts.tolist()) == ([5], [0], [0])
    q, k, v = make_qkv(1, 4, 7, 2, 2, 16, dtype=torch.float64, generator=seeded_generator())
    out = fa_variants.attention(q, k, v, causal=True, seqlens_k=ends, leftpad_k=starts, seqlens_q=counts,
                                backend="reference")
    want, _ = attention_reference(q, k[:, :5], v[:, :5])
    torch.testing.assert_close(out, want)
