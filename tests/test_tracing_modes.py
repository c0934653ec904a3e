"""The public API under tracers other than plain torch.compile: messages that survive fullgraph=True and dynamic
shapes, make_fx's real mode, functionalize, windowed.attention traced (a break-it run of session 59 found each; every
test fails on the code before it). CPU, reference backend."""
import pytest
import torch
import torch.nn.functional as F

import fa_variants
from fa_variants import windowed
from fa_variants.common.mask_windows import Window
from helpers import seeded_generator


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("call, message", [
    (lambda q: fa_variants.attention(q, q, q, causal=1, backend="reference"),
     r"raised exception TypeError\(.*causal must be a bool, got 1'"),
    (lambda q: fa_variants.attention(q, q, q, return_lse=1, backend="reference"),
     r"raised exception TypeError\(.*return_lse must be a bool, got 1'"),
    (lambda q: fa_variants.scaled_dot_product_attention(q, q, q, is_causal="y", backend="reference"),
     r"""raised exception TypeError\(.*is_causal must be a bool, got 'y'"""),
])
def test_argument_errors_keep_their_message_under_fullgraph(call, message):
    """The one-line message of a bad argument reaches the user inside Dynamo's error under fullgraph=True, as the
    exception raised (torch 2.11 shows it as Dynamo's variables). The message's formatter read
    type(value).__module__, whose methods Dynamo cannot trace: only the f-string's source line was left."""
    q = torch.randn(2, 5, 6, 16, generator=seeded_generator())
    with pytest.raises(Exception, match=message):
        torch.compile(call, fullgraph=True, backend="eager")(q)


def test_a_bad_mask_shape_keeps_its_message_under_dynamic_shapes():
    """attn_mask's shape error under fullgraph=True and dynamic=True names attn_mask (its message was joined from
    strings holding symbolic sizes, which Dynamo could not concatenate: "missing sq_concat")."""
    g = seeded_generator()
    q, k = torch.randn(2, 6, 4, 16, generator=g), torch.randn(2, 2, 7, 16, generator=g)
    mask = torch.ones(2, 1, 3, 7, dtype=torch.bool)
    call = torch.compile(lambda q, k, m: fa_variants.scaled_dot_product_attention(
        q, k, k, attn_mask=m, enable_gqa=True, backend="reference"), fullgraph=True, dynamic=True, backend="eager")
    with pytest.raises(Exception, match=r"raised exception ValueError\(.*attn_mask has shape "):
        call(q, k, mask)


def _windows_reference(q, k, windows):
    """Float64 attention of each sequence over its window (bottom-right causal against the window's offset)."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    keys = torch.arange(k.shape[1])
    for b, w in enumerate(windows):
        rows = torch.arange(q.shape[1])[:, None]
        visible = ((keys >= w.start) & (keys < w.end)).expand(q.shape[1], -1)  # (seqlen_q, seqlen_k)
        if w.offset is not None:  # query i sees keys up to i + offset
            visible = visible & (keys <= rows + w.offset)
        kk = k[b].double().repeat_interleave(q.shape[2] // k.shape[2], dim=1).transpose(0, 1)
        qq = q[b].double().transpose(0, 1)
        o = F.scaled_dot_product_attention(qq, kk, kk, attn_mask=visible)
        out[b] = o.nan_to_num(0.0).transpose(0, 1)
    return out


@pytest.mark.parametrize("how", ["fullgraph", "export strict", "export non-strict"])
def test_windowed_attention_traces(how):
    """windowed.attention traces with fullgraph=True and exports (it read the query counts back to decide whether
    the diagonal moves: a data-dependent branch), and answers as float64 attention within each window."""
    g = seeded_generator()
    q, k = torch.randn(2, 4, 6, 16, generator=g), torch.randn(2, 11, 2, 16, generator=g)
    windows = [Window(0, 11, None), Window(2, 9, 6)]  # full; a causal window whose diagonal moves
    call = lambda q, k: windowed.attention(q, k, k, windows, backend="reference")  # noqa: E731
    if how == "fullgraph":
        got = torch.compile(call, fullgraph=True, backend="eager")(q, k)
    else:
        class Call(torch.nn.Module):
            def forward(self, q, k):
                return call(q, k)
        got = torch.export.export(Call(), (q, k), strict=how == "export strict").module()(q, k)
    want, torch_err = _windows_reference(q, k, windows), (call(q, k).double() - _windows_reference(q, k, windows))
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2 * torch_err.abs().max().item() + 1e-6)


def test_make_fx_real_mode_records_one_node_and_reads_masks_when_it_runs():
    """make_fx in its default "real" mode (real tensors under a proxy mode): the call is one custom-op node, so a
    graph traced with one mask answers another as torch's SDPA does (the plain path had read values on the host,
    which make_fx refuses, and a mask read while tracing would have been kept for every later input)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    g = seeded_generator()
    q, k = torch.randn(2, 6, 3, 16, generator=g), torch.randn(2, 2, 7, 16, generator=g)
    masks = [torch.ones(2, 1, 1, 7, dtype=torch.bool) for _ in range(2)]
    masks[0][0, ..., 5:] = False
    masks[1][1, ..., 2:] = False
    call = lambda q, k, m: fa_variants.scaled_dot_product_attention(  # noqa: E731
        q, k, k, attn_mask=m, enable_gqa=True, backend="reference")
    graph = make_fx(call)(q, k, masks[0])
    assert any("fa_variants" in str(node.target) for node in graph.graph.nodes)
    for mask in masks:
        want = F.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)
        torch.testing.assert_close(graph(q, k, mask), want, rtol=1e-5, atol=1e-5)
    plain = make_fx(lambda q, k: fa_variants.attention(q, k, k, causal=True, backend="reference"))(
        q.transpose(1, 2), k.transpose(1, 2))
    recorded = [str(n.target) for n in plain.graph.nodes if "fa_variants" in str(n.target)]
    assert recorded == ["fa_variants.attention.default"]


def test_functionalized_lengths_are_refused_in_one_line():
    """seqlens_k under torch.func.functionalize has no storage to read its values from: a one-line refusal naming
    it (torch's "tolist() shouldn't be called on a tensor with unallocated storage" before)."""
    g = seeded_generator()
    q, k = torch.randn(2, 3, 2, 8, generator=g), torch.randn(2, 7, 2, 8, generator=g)
    lengths = torch.tensor([7, 5], dtype=torch.int32)
    call = torch.func.functionalize(lambda q, k, s: fa_variants.attention(q, k, k, causal=True, seqlens_k=s,
                                                                          backend="reference"))
    refusal = r"^seqlens_k is functionalized by torch.func.functionalize: "
    with pytest.raises(NotImplementedError, match=refusal) as caught:
        call(q, k, lengths)
    assert "\n" not in str(caught.value)
