"""FA_VARIANTS_BACKWARD=cudnn on the CPU: the plumbing around cuDNN's fused attention backward.

The kernel (``aten._scaled_dot_product_cudnn_attention_backward``) runs on CUDA only. Here a stand-in written from
its contract takes its place (`cudnn_stand_in`: (batch, heads, seqlen, head_dim) views, our forward's O, the
natural-log LSE as cuDNN's statistics tensor (batch, heads, seqlen_q, 1) on PyTorch >= 2.9, GQA with fewer KV heads,
top-left causal for square scores only, no dropout, no bias), so that what ``backward.cudnn_backward`` hands the
kernel, where the mode applies, where it hands over to the flash path and where to the PyTorch backward, and the
traced path, are tested without a GPU; tests/test_backward_gpu.py runs the kernel itself.
"""
from __future__ import annotations

import pytest
import torch

import fa_variants
from fa_variants import reference
from fa_variants.integrations import backward
from helpers import (assert_backward_mode_keeps_pytorch, assert_grads_within_rule, exact_grads,
                     flash_backward_stand_in, make_qkv)

BF16, F16 = torch.bfloat16, torch.float16
pytestmark = pytest.mark.filterwarnings("ignore::fa_variants.dispatch.BackendFallbackWarning")


def _stand_in(grad_out, q, k, v, out, stats, philox_seed, philox_offset, attn_bias, cum_seq_q, cum_seq_k, max_q,
              max_k, dropout_p, causal, *, scale):
    """cuDNN's attention backward from its contract: the checks its caller must satisfy, then the same maths as
    FlashAttention-2's (helpers.flash_backward_stand_in; causal is top-left there too when the scores are square)."""
    assert attn_bias is None and cum_seq_q is None and cum_seq_k is None and dropout_p == 0.0
    assert philox_seed.dtype == philox_offset.dtype == torch.int64 and philox_seed.dim() == 0
    assert (max_q, max_k) == (q.shape[2], k.shape[2]) and not (causal and max_q != max_k)
    assert stats.shape == q.shape[:3] + (1,) and stats.dtype == torch.float32
    assert q.shape[-1] <= backward.CUDNN_MAX_HEAD_DIM and k.shape[2] > 1
    return flash_backward_stand_in(grad_out, q, k, v, out, stats.squeeze(-1).contiguous(), None, None, max_q, max_k,
                                   0.0, causal, None, None, scale=scale)


@pytest.fixture
def cudnn_stand_in(monkeypatch, fused_on_cpu):
    """FA_VARIANTS_BACKWARD=cudnn on the fake sm_90 (conftest's `fused_on_cpu`, whose flash stand-in records into
    its own list), `_stand_in` in cuDNN's place. Returns the list of its calls (the arguments it got)."""
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        return _stand_in(*args, **kwargs)

    monkeypatch.setenv("FA_VARIANTS_BACKWARD", "cudnn")
    monkeypatch.setattr(backward, "CUDNN_BACKWARD_OP", record)
    monkeypatch.setattr(backward, "_cudnn_lse_trailing_dim", lambda: True)  # PyTorch >= 2.9's layout
    return calls


@pytest.mark.parametrize("nq, nk, heads_kv, causal, scale, head_dim", [
    (13, 29, 2, False, None, 64), (17, 17, 6, True, None, 128), (9, 40, 1, False, 0.5, 64), (1, 7, 3, False, None, 16)])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
def test_cudnn_backward_within_the_rule(cudnn_stand_in, fused_on_cpu, nq, nk, heads_kv, causal, scale, head_dim,
                                        dtype):
    """A loss of out only: one cuDNN call, handed the forward's own O and LSE (the kernel's layout: transposed views
    of ours, the LSE with its trailing dimension), the gradients within the rule; GQA, square causal."""
    q, k, v = make_qkv(2, nq, nk, 6, heads_kv, head_dim, dtype=dtype)
    grad_out = torch.randn(q.shape, dtype=dtype)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = fa_variants.attention(*leaves, causal=causal, softmax_scale=scale, return_lse=True)
    got = torch.autograd.grad(out, leaves, grad_out)
    assert len(cudnn_stand_in) == 1 and fused_on_cpu == []
    args, kwargs = cudnn_stand_in[0]
    assert torch.equal(args[4], out.detach().transpose(1, 2)) and torch.equal(args[5], lse.detach().unsqueeze(-1))
    assert args[14] is causal and kwargs["scale"] == (reference.default_softmax_scale(head_dim) if scale is None
                                                      else scale)
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    same = torch.autograd.grad(reference.attention_reference(*ref_leaves, causal=causal, softmax_scale=scale,
                                                             dtype=dtype)[0], ref_leaves, grad_out)
    assert_grads_within_rule(got, same, exact_grads(q, k, v, grad_out, causal=causal, softmax_scale=scale))


def _order(t: torch.Tensor) -> list[int]:
    """t's dimensions, outermost first by stride (stable)."""
    return sorted(range(t.dim()), key=lambda d: -t.stride(d))


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_cudnn_gets_o_and_do_in_q_layout(cudnn_stand_in, layout):
    """PyTorch caches cuDNN's backward graph under Q's, K's and V's shapes and strides only (before it keyed O's, dO's
    and the statistics' too), so O and dO reach the kernel dense in Q's order of dimensions, as SDPA's own cuDNN path
    makes them: the call's tensors themselves in the usual (batch, seqlen, heads, head_dim) layout (no copy), copies
    for inputs in SDPA's (batch, heads, seqlen, head_dim) memory layout and for a dO of another layout; the values
    and gradients unchanged."""
    q, k, v = make_qkv(2, 12, 12, 4, 2, 64, dtype=BF16)
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    grad_out = torch.randn(q.shape[0], q.shape[2], q.shape[1], q.shape[3], dtype=BF16).transpose(1, 2)
    got = []
    for g in (grad_out, grad_out.contiguous()):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fa_variants.attention(*leaves, causal=True)
        got.append(torch.autograd.grad(out, leaves, g))
        args = cudnn_stand_in[-1][0]
        q_view = args[1]
        assert _order(q_view) == ([0, 1, 2, 3] if layout == "bhsd" else [0, 2, 1, 3])
        for t in (args[0], args[4]):  # dO, O
            assert _order(t) == _order(q_view) and t.is_contiguous() == q_view.is_contiguous()
        assert torch.equal(args[4], out.detach().transpose(1, 2)) and torch.equal(args[0], g.transpose(1, 2))
        if layout == "bshd":
            assert args[4].data_ptr() == out.data_ptr()  # the usual layout: O itself
    for a, b in zip(*got):
        torch.testing.assert_close(a, b)


def test_cudnn_leaves_one_query_row_on_capability_10_to_flash(cudnn_stand_in, fused_on_cpu, monkeypatch):
    """seqlen_q = 1 on compute capability 10 or above (PyTorch refuses cuDNN's attention there for cuDNN 9.19-9.25):
    the flash path; two rows there, or one row on sm_90: cuDNN."""
    q1, k, v = make_qkv(1, 1, 9, 4, 2, 64, dtype=BF16)
    q2 = make_qkv(1, 2, 9, 4, 2, 64, dtype=BF16)[0]
    for capability, q, expected in (((10, 0), q1, (0, 1)), ((10, 0), q2, (1, 1)), ((9, 0), q1, (2, 1))):
        monkeypatch.setattr(backward, "_capability", lambda device, c=capability: c)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        torch.autograd.grad(fa_variants.attention(*leaves).float().sum(), leaves)
        assert (len(cudnn_stand_in), len(fused_on_cpu)) == expected, capability


def test_cudnn_hands_over_to_flash_then_pytorch(cudnn_stand_in, fused_on_cpu, monkeypatch):
    """Where cuDNN does not apply but the flash kernel does (causal with seqlen_q < seqlen_k: cuDNN's mask is
    top-left; head_dim above `CUDNN_MAX_HEAD_DIM`, here lowered to 32 for the fake kernel's head dims; one key) the
    flash path serves; where neither does (an LSE in the loss, causal rows without keys, a scale above 1) the PyTorch
    backward, bit for bit."""
    cases = [(dict(causal=True), make_qkv(1, 9, 12, 4, 2, 64, dtype=BF16)),
             (dict(), make_qkv(1, 5, 7, 2, 2, 64, dtype=BF16)),
             (dict(), make_qkv(1, 5, 1, 2, 1, 16, dtype=BF16))]
    limits = (None, 32, None)
    for (kwargs, inputs), limit in zip(cases, limits):
        with monkeypatch.context() as patch:
            if limit is not None:
                patch.setattr(backward, "CUDNN_MAX_HEAD_DIM", limit)
            leaves = [t.clone().requires_grad_(True) for t in inputs]
            torch.autograd.grad(fa_variants.attention(*leaves, **kwargs).float().sum(), leaves)
    assert cudnn_stand_in == [] and len(fused_on_cpu) == 3
    q, k, v = make_qkv(2, 9, 12, 4, 2, 64, dtype=F16)
    assert_backward_mode_keeps_pytorch(monkeypatch, "cudnn", [
        (dict(causal=True, return_lse=True), (q, k, v)), (dict(causal=True), make_qkv(2, 15, 12, 4, 2, 64, dtype=F16)),
        (dict(softmax_scale=2.0), (q, k, v))])
    assert cudnn_stand_in == [] and len(fused_on_cpu) == 3


def test_cudnn_backward_under_torch_compile(cudnn_stand_in):
    """Traced (fullgraph, aot_eager) the backward is the opaque op, whose body takes the cuDNN path too (it needs no
    autograd: it starts from the saved O and LSE), with the eager gradients."""
    q, k, v = make_qkv(2, 12, 12, 4, 2, 64, dtype=BF16)
    fn = lambda q, k, v: fa_variants.attention(q, k, v, causal=True).float().square().sum()  # noqa: E731
    torch._dynamo.reset()
    grads = []
    for run in (torch.compile(fn, fullgraph=True, backend="aot_eager"), fn):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        grads.append(torch.autograd.grad(run(*leaves), leaves))
    assert len(cudnn_stand_in) == 2
    for g, e in zip(*grads):
        torch.testing.assert_close(g, e)


def test_cudnn_lse_layout_follows_the_forward():
    """The statistics tensor's layout is read from cuDNN's own forward (its meta kernel): this PyTorch's."""
    q = torch.empty(1, 1, 2, 8, device="meta", dtype=BF16)
    rank = torch.ops.aten._scaled_dot_product_cudnn_attention(q, q, q, None, True)[1].dim()
    assert backward._cudnn_lse_trailing_dim() is (rank == 4)
