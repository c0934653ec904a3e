"""FA_VARIANTS_BACKWARD=flash on the CPU: the plumbing around PyTorch's FlashAttention-2 backward kernel.

The kernel (``aten._scaled_dot_product_flash_attention_backward``) runs on CUDA only. Here a stand-in written from
its contract takes its place (helpers.flash_backward_stand_in: (batch, heads, seqlen, head_dim) views, our forward's
O and natural-log LSE, GQA with fewer KV heads, bottom-right causal, no dropout), so that what
``backward.flash_backward`` hands the kernel, where the mode applies and where it does not, and the traced path, are
tested without a GPU; tests/test_backward_gpu.py runs the kernel itself.
"""
from __future__ import annotations

import pytest
import torch

import fa_variants
from fa_variants import reference
from fa_variants.integrations import backward
from helpers import assert_backward_mode_keeps_pytorch, assert_grads_within_rule, exact_grads, make_qkv

BF16 = torch.bfloat16
pytestmark = pytest.mark.filterwarnings("ignore::fa_variants.dispatch.BackendFallbackWarning")


@pytest.fixture
def flash_stand_in(monkeypatch, fused_on_cpu):
    """FA_VARIANTS_BACKWARD=flash on the fake sm_90 (conftest's `fused_on_cpu`): the list of the stand-in's calls."""
    monkeypatch.setenv("FA_VARIANTS_BACKWARD", "flash")
    return fused_on_cpu


@pytest.mark.parametrize("nq, nk, heads_kv, causal, scale", [
    (13, 29, 2, True, None), (17, 17, 6, True, None), (9, 40, 1, False, None), (1, 7, 3, True, None),
    (11, 23, 2, True, 1.0), (12, 12, 6, False, 0.5)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_flash_backward_within_the_rule(flash_stand_in, nq, nk, heads_kv, causal, scale, dtype):
    """A loss of out only: one kernel call, handed the forward's own O and LSE (the kernel's layout: transposed views
    of ours), its gradients within 2x the error of autograd through the same maths in PyTorch in the input dtype,
    plus a floor; GQA, causal with seqlen_q <= seqlen_k, scales up to 1 (the LSE holds the scale)."""
    q, k, v = make_qkv(2, nq, nk, 6, heads_kv, 64, dtype=dtype)
    grad_out = torch.randn(q.shape, dtype=dtype)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = fa_variants.attention(*leaves, causal=causal, softmax_scale=scale, return_lse=True)
    got = torch.autograd.grad(out, leaves, grad_out)
    assert len(flash_stand_in) == 1
    args, kwargs = flash_stand_in[0]
    assert torch.equal(args[4], out.detach().transpose(1, 2)) and torch.equal(args[5], lse.detach())
    assert args[11] is causal and kwargs["scale"] == (64 ** -0.5 if scale is None else scale)
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    same = torch.autograd.grad(reference.attention_reference(*ref_leaves, causal=causal, softmax_scale=scale,
                                                             dtype=dtype)[0], ref_leaves, grad_out)
    assert_grads_within_rule(got, same, exact_grads(q, k, v, grad_out, causal=causal, softmax_scale=scale))


def test_flash_backward_takes_any_strides(flash_stand_in):
    """Inputs whose head_dim is not the innermost stride (and grad_out likewise) reach the kernel with a dense last
    dimension, the gradients in the inputs' shapes."""
    q, k, v = (t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in make_qkv(1, 9, 14, 4, 2, 64, dtype=BF16))
    assert q.stride(-1) != 1
    grad_out = torch.randn(q.shape[:-1] + (64,), dtype=BF16).transpose(-1, -2).contiguous().transpose(-1, -2)
    grads = []
    for inputs, g_out in (((q, k, v), grad_out), ([t.contiguous() for t in (q, k, v)], grad_out.contiguous())):
        leaves = [t.detach().requires_grad_(True) for t in inputs]
        grads.append(torch.autograd.grad(fa_variants.attention(*leaves, causal=True), leaves, g_out))
    assert len(flash_stand_in) == 2
    for g, e, t in zip(*grads, (q, k, v)):
        assert g.shape == t.shape
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_flash_backward_only_where_it_applies(flash_stand_in, monkeypatch):
    """reference.run_backward still serves, with the same gradients as without the switch: an LSE in the loss (with
    per-sequence lengths too), causal rows that see no key (seqlen_q > seqlen_k: LSE -inf), a negative, zero or float32-flushed
    softmax_scale (the kernel scales its -inf masked scores: +inf, NaN), one above 1 (near one-hot rows: the 16-bit
    O's rounding in rowsum(dO O) times the scale; at 300 the stand-in's dQ error was 1e5x the PyTorch backward's), a
    backward with create_graph (the kernel has no derivative); and flash_applies refuses head dims the kernel lacks
    and float32."""
    from fa_variants import api
    monkeypatch.setattr(api, "_kernel_module", lambda backend: None)  # the fake kernel does not read lengths
    q, k, v = make_qkv(2, 9, 12, 4, 2, 16, dtype=torch.float16)
    cases = [(dict(causal=True, return_lse=True), (q, k, v)),
             (dict(causal=True), make_qkv(2, 15, 12, 4, 2, 16, dtype=torch.float16)),
             (dict(causal=True, seqlens_k=torch.tensor([12, 5], dtype=torch.int32), return_lse=True), (q, k, v)),
             (dict(causal=True, softmax_scale=-0.3), (q, k, v)), (dict(softmax_scale=0.0), (q, k, v)),
             (dict(softmax_scale=1e-39), (q, k, v)), (dict(causal=True, softmax_scale=1.5), (q, k, v)),
             (dict(softmax_scale=300.0), (q, k, v))]
    assert_backward_mode_keeps_pytorch(monkeypatch, "flash", cases)
    assert flash_stand_in == []
    monkeypatch.setenv("FA_VARIANTS_BACKWARD", "flash")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    (dq,) = torch.autograd.grad(fa_variants.attention(*leaves).float().square().sum(), leaves[:1], create_graph=True)
    assert dq.grad_fn is not None and flash_stand_in == []
    with torch.no_grad():  # a backward without create_graph
        for head_dim in (12, 264):
            q12 = torch.randn(1, 4, 2, head_dim, dtype=torch.float16)
            assert not backward.flash_applies(q12, q12, False, None)
        q64 = torch.randn(1, 4, 2, 64)
        assert not backward.flash_applies(q64, q64, False, None)  # float32
        assert backward.flash_applies(q64.half(), q64.half(), False, None)
    assert not backward.flash_applies(q64.half(), q64.half(), False, None)  # grad mode on: create_graph


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_backward_length_by_length(flash_stand_in, monkeypatch, causal):
    """Per-sequence KV lengths (a padded KV cache, NaN past each length; lengths 0 and 1 among them, two sequences
    sharing one): a loss of out alone takes the kernel once per length, on the sequences of that length with K and V
    cut to it (causal: not where rows see no key, length 1 < 4 rows, which the reference serves), within the rule
    against float64; dK, dV 0 past each length and dQ 0 for length 0. With create_graph the PyTorch backward serves."""
    from fa_variants import api
    from helpers import padded_kv_cache
    monkeypatch.setattr(api, "_kernel_module", lambda backend: None)  # the fake kernel does not read lengths
    lengths = [12, 5, 0, 12, 1]
    q, k, v, seqlens_k = padded_kv_cache(lengths, 4, 12, 4, 2, 16, dtype=torch.float16)
    grad_out = torch.randn(q.shape, dtype=torch.float16)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    got = torch.autograd.grad(fa_variants.attention(*leaves, causal=causal, seqlens_k=seqlens_k), leaves, grad_out)
    fused = [n for n in (1, 5, 12) if not (causal and n < 4)]
    assert [(args[2].shape[0], args[2].shape[2]) for args, _ in flash_stand_in] == \
        [(lengths.count(n), n) for n in fused]
    same_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    same = torch.autograd.grad(reference.attention_reference(*same_leaves, causal=causal, seqlens_k=seqlens_k,
                                                             dtype=torch.float16)[0], same_leaves, grad_out)
    exact = exact_grads(q, k, v, grad_out, causal=causal, seqlens_k=seqlens_k)
    assert all(g.isfinite().all() for g in got)
    assert_grads_within_rule(got, same, exact)
    for b, n in enumerate(lengths):
        assert not got[1][b, n:].any() and not got[2][b, n:].any()
    assert not got[0][2].any()
    flash_stand_in.clear()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    (dq,) = torch.autograd.grad(fa_variants.attention(*leaves, causal=causal, seqlens_k=seqlens_k).float().sum(),
                                leaves[:1], create_graph=True)
    assert dq.grad_fn is not None and flash_stand_in == []


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_backward_window_by_window(flash_stand_in, monkeypatch, causal):
    """Each sequence's first key too (``leftpad_k``; NaN outside each window): a loss of out alone takes the kernel
    once per distinct window [start, end), on its sequences with K and V cut to it (causal: not where rows see no
    key, a window of 2 keys < 4 rows), within the rule against float64; dK, dV 0 outside each window."""
    from fa_variants import api
    from helpers import windowed_kv_cache
    monkeypatch.setattr(api, "_kernel_module", lambda backend: None)  # the fake kernel does not read windows
    windows = [(3, 12), (0, 12), (3, 12), (7, 9), (5, 5), (2, 9)]
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache(windows, 4, 12, 4, 2, 16, dtype=torch.float16)
    grad_out = torch.randn(q.shape, dtype=torch.float16)
    kwargs = dict(causal=causal, seqlens_k=seqlens_k, leftpad_k=leftpad_k)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    got = torch.autograd.grad(fa_variants.attention(*leaves, **kwargs), leaves, grad_out)
    fused = [(n, e - s) for (s, e), n in {w: windows.count(w) for w in sorted(set(windows))}.items()
             if e > s and not (causal and e - s < 4)]
    assert sorted((args[2].shape[0], args[2].shape[2]) for args, _ in flash_stand_in) == sorted(fused)
    same_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    same = torch.autograd.grad(reference.attention_reference(*same_leaves, dtype=torch.float16, **kwargs)[0],
                               same_leaves, grad_out)
    exact = exact_grads(q, k, v, grad_out, **kwargs)
    assert all(g.isfinite().all() for g in got)
    assert_grads_within_rule(got, same, exact)
    for b, (start, end) in enumerate(windows):
        for g in got[1:]:
            assert not g[b, :start].any() and not g[b, end:].any()
    assert not got[0][4].any()  # the empty window: O = 0 whatever Q


def test_lengths_without_padding_take_the_plain_backward(flash_stand_in, monkeypatch):
    """seqlens_k with every sequence at seqlen_k: one kernel call, whose dQ is the gradient itself (not copied into a
    zero-filled one, as with padding), the gradients those of the call without lengths bit for bit."""
    from fa_variants import api
    from fa_variants.integrations import backward
    monkeypatch.setattr(api, "_kernel_module", lambda backend: None)  # the fake kernel does not read lengths
    made = []
    monkeypatch.setattr(backward, "FLASH_BACKWARD_OP",
                        lambda *a, _op=backward.FLASH_BACKWARD_OP, **kw: made.append(_op(*a, **kw)) or made[-1])
    q, k, v = make_qkv(3, 5, 12, 4, 2, 16, dtype=torch.float16)
    grad_out = torch.randn(q.shape, dtype=torch.float16)
    grads = []
    for seqlens_k in (torch.full((3,), 12, dtype=torch.int32), None):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fa_variants.attention(*leaves, causal=True, seqlens_k=seqlens_k)
        grads.append(torch.autograd.grad(out, leaves, grad_out))
    assert len(flash_stand_in) == 2 and flash_stand_in[0][0][2].shape == flash_stand_in[1][0][2].shape
    assert grads[0][0].untyped_storage().data_ptr() == made[0][0].untyped_storage().data_ptr()
    for g, e in zip(*grads):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


@pytest.mark.parametrize("lengths", [None, [12, 10]], ids=["plain", "seqlens_k"])
def test_flash_backward_under_torch_compile(flash_stand_in, monkeypatch, lengths):
    """Traced (fullgraph, aot_eager) the backward is the opaque op, whose body takes the flash path too (it needs no
    autograd: it starts from the saved O and LSE; with per-sequence lengths once per length), with the eager
    gradients."""
    from fa_variants import api
    monkeypatch.setattr(api, "_kernel_module", lambda backend: None)  # the fake kernel does not read lengths
    q, k, v = make_qkv(2, 9, 12, 4, 2, 64, dtype=torch.bfloat16)
    seqlens_k = None if lengths is None else torch.tensor(lengths, dtype=torch.int32)
    grad_out = torch.randn(q.shape, dtype=torch.bfloat16)
    fn = lambda q, k, v: fa_variants.attention(q, k, v, causal=True, seqlens_k=seqlens_k)  # noqa: E731
    torch._dynamo.reset()
    grads = []
    for run in (torch.compile(fn, fullgraph=True, backend="aot_eager"), fn):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        grads.append(torch.autograd.grad(run(*leaves), leaves, grad_out))
    assert len(flash_stand_in) == 2 * (1 if lengths is None else len(lengths))
    for g, e in zip(*grads):
        torch.testing.assert_close(g, e)


def test_default_mode_is_cudnn_and_the_cpu_keeps_pytorch(fake_gpu, monkeypatch):
    """FA_VARIANTS_BACKWARD unset: ``cudnn`` (session 43's H100 measurement, a training step's attention against
    SDPA's: cudnn 0.99-1.22x, sdpa 1.17-1.46x, flash 1.41-1.79x, the PyTorch backward 21-34x), so the forward keeps O
    and LSE, eager or traced. The fused backwards serve the kernel backends' devices (CUDA) only: a fake kernel on the
    CPU gets the PyTorch backward, bit for bit."""
    monkeypatch.delenv("FA_VARIANTS_BACKWARD", raising=False)
    assert backward.mode() == "cudnn" and backward.BACKWARDS[0] == "cudnn"
    assert backward.keeps_outputs(eager=True) and backward.keeps_outputs(eager=False)
    q, k, v = make_qkv(2, 9, 12, 4, 2, 64, dtype=BF16)
    monkeypatch.setattr(backward, "sdpa_backward", lambda *a: pytest.fail("SDPA's backward on the CPU"))
    monkeypatch.setattr(backward, "CUDNN_BACKWARD_OP", lambda *a, **kw: pytest.fail("cuDNN's kernel on the CPU"))
    monkeypatch.setattr(backward, "FLASH_BACKWARD_OP", lambda *a, **kw: pytest.fail("the flash kernel on the CPU"))
    assert_backward_mode_keeps_pytorch(monkeypatch, "cudnn", [(dict(causal=True), (q, k, v))])


@pytest.mark.parametrize("leaf", ["tensor", "parameter"])
def test_eager_grad_call_skips_the_ops_dispatcher(flash_stand_in, leaf):
    """Eagerly, a kernel call that needs a gradient (and a Parameter's call) runs as `custom_op.EagerAttention`, a
    plain autograd.Function with the op's body and backward, not through the op's dispatcher (its schema defaults,
    redispatch and Dynamo-disabled body were ~30 % of a step's host time): the same outputs and gradients as the op
    called directly, the flash path serving both backwards."""
    from fa_variants.integrations import custom_op

    q, k, v = make_qkv(2, 9, 12, 4, 2, 64, dtype=torch.bfloat16)
    grad_out = torch.randn(q.shape, dtype=torch.bfloat16)
    make = torch.nn.Parameter if leaf == "parameter" else (lambda t: t.clone().requires_grad_(True))
    results = []
    for run in (lambda q, k, v: fa_variants.attention(q, k, v, causal=True),
                lambda q, k, v: torch.ops.fa_variants.attention(q, k, v, True, None, "auto")[0]):
        leaves = [make(t.clone()) for t in (q, k, v)]
        out = run(*leaves)
        results.append((type(out.grad_fn).__name__, out.detach(), torch.autograd.grad(out, leaves, grad_out)))
    (eager_node, eager_out, eager_grads), (op_node, op_out, op_grads) = results
    assert eager_node == custom_op.EagerAttention.__name__ + "Backward" and op_node != eager_node
    assert len(flash_stand_in) == 2
    torch.testing.assert_close(eager_out, op_out)
    for g, e in zip(eager_grads, op_grads):
        torch.testing.assert_close(g, e)


def test_eager_grad_call_is_planned(flash_stand_in, monkeypatch):
    """A kernel call that needs a gradient is planned under its key (grad mode and requires_grad in it): its second
    call skips validation and the backend choice (the no-grad fast path's ~20 us), with the same outputs and
    gradients; a no-grad call of the same tensors is not served by that plan (it returns no graph), and a call
    whose inputs changed kind (another seqlen) is validated again."""
    from fa_variants import api

    checked = []
    real_check = api._check_inputs
    monkeypatch.setattr(api, "_check_inputs", lambda *a, **kw: checked.append(1) or real_check(*a, **kw))
    q, k, v = make_qkv(2, 9, 12, 4, 2, 64, dtype=torch.bfloat16)
    grad_out = torch.randn(q.shape, dtype=torch.bfloat16)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    results, checks = [], []
    for _ in range(2):
        checked.clear()
        out = fa_variants.attention(*leaves, causal=True)
        checks.append(len(checked))
        results.append((out.detach(), torch.autograd.grad(out, leaves, grad_out)))
    assert checks[0] >= 1 and checks[1] == 0
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(results[0][0], results[1][0])
    with torch.no_grad():
        assert fa_variants.attention(*leaves, causal=True).grad_fn is None
    other = [t[:, :8].detach().requires_grad_(True) if i == 0 else t for i, t in enumerate(leaves)]
    checked.clear()
    assert fa_variants.attention(*other, causal=True).grad_fn is not None and len(checked) >= 1


def test_planned_grad_call_keeps_the_transform_refusal(fake_gpu):
    """A grad call planned outside torch.func is refused inside it as before it was planned: the fast path stands
    aside while transforms are active, so `_check_transforms` gives its one-line NotImplementedError (not torch's
    complaint about an autograd.Function under functorch)."""
    leaves = [t.clone().requires_grad_(True) for t in make_qkv(1, 16, 16, 2, 2, 16, dtype=torch.bfloat16)]
    loss = lambda w: (fa_variants.attention(*leaves) * w).float().sum()  # noqa: E731
    for _ in range(2):
        with pytest.raises(NotImplementedError, match="does not support torch.func"):
            torch.func.grad(loss)(torch.ones(()))
        fa_variants.attention(*leaves)  # plans the grad call


def test_grad_call_is_one_op_under_dispatch_modes(fake_gpu):
    """While a TorchDispatchMode is active, a grad call (planned or not) goes through the op, so modes see one
    ``fa_variants.attention`` node: selective activation checkpointing saves it (MUST_SAVE: the kernel runs once per
    step, not again in the recomputation) and real-mode make_fx records it; gradients as without the policy."""
    import functools

    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        return (CheckpointPolicy.MUST_SAVE if op == torch.ops.fa_variants.attention.default
                else CheckpointPolicy.PREFER_RECOMPUTE)

    qkv = make_qkv(1, 8, 8, 2, 2, 16, dtype=torch.bfloat16)
    fn = lambda a, b, c: fa_variants.attention(a * 1, b * 1, c * 1)  # noqa: E731
    grads = []
    for context_fn in (functools.partial(create_selective_checkpoint_contexts, policy), None, None):
        leaves = [t.clone().requires_grad_(True) for t in qkv]
        before = len(fake_gpu)
        if context_fn is None:
            out = fn(*leaves)
        else:
            out = checkpoint(fn, *leaves, use_reentrant=False, context_fn=context_fn)
        out.float().square().sum().backward()
        assert len(fake_gpu) - before == 1
        grads.append([t.grad for t in leaves])
    for with_policy, plain in zip(grads[0], grads[2]):
        torch.testing.assert_close(with_policy, plain)
    leaves = [t.clone().requires_grad_(True) for t in qkv]
    assert "fa_variants.attention" in make_fx(lambda a, b, c: fa_variants.attention(a, b, c))(*leaves).code


@pytest.mark.parametrize("mode", ["pytorch", "cudnn"])
@pytest.mark.parametrize("leaf", ["tensor", "parameter"])
def test_enable_grad_inside_inference_mode_records_nothing(fused_on_cpu, monkeypatch, mode, leaf):
    """``torch.enable_grad()`` inside ``torch.inference_mode()`` records no graph (as SDPA's output there has no
    grad_fn): the kernel runs as a no-grad call, before and after a grad call of that kind was planned, and a direct
    call of the op or of ``api.dispatch_and_run`` never runs a grad call's plan."""
    from fa_variants import api

    monkeypatch.setenv("FA_VARIANTS_BACKWARD", mode)
    leaves = [t.clone().requires_grad_(True) for t in make_qkv(2, 128, 128, 4, 2, 64, dtype=torch.bfloat16)]
    if leaf == "parameter":
        leaves[0] = torch.nn.Parameter(leaves[0].detach())
    calls = (lambda: fa_variants.attention(*leaves, causal=True),
             lambda: torch.ops.fa_variants.attention(*leaves, True, None, "auto")[0],
             lambda: api.dispatch_and_run(*leaves, True, None, "auto")[0])
    for planned in (False, True):
        if planned:
            fa_variants.attention(*leaves, causal=True)
        for call in calls:
            with torch.inference_mode(), torch.enable_grad():
                out = call()
            assert out.grad_fn is None and not out.requires_grad and out.is_inference()
    with torch.enable_grad():
        out, lse = api.dispatch_and_run(*[t.detach() for t in leaves], True, None, "auto")
    assert out.grad_fn is None
