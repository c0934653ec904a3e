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
from fa_variants.common import interop
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
    wide = backward.CUDNN_WIDE and q.shape[-1] <= backward.CUDNN_SM90_MAX_HEAD_DIM
    assert (q.shape[-1] <= backward.CUDNN_MAX_HEAD_DIM or wide) and k.shape[2] > 1 and q.shape[2] > 1
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
    (13, 128, 2, False, None, 64), (17, 17, 6, True, None, 128), (9, 256, 1, False, 0.5, 64),
    (2, 128, 3, False, None, 16)])
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


def _sum_backward(q, k, v, **kwargs) -> None:
    """One backward of ``fa_variants.attention(q, k, v, **kwargs)``'s sum, from fresh leaves (what routes it is
    recorded by the stand-ins)."""
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    torch.autograd.grad(fa_variants.attention(*leaves, **kwargs).float().sum(), leaves)


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


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (9, 0), (10, 0), (12, 0)])
def test_cudnn_on_hopper_only(cudnn_stand_in, fused_on_cpu, monkeypatch, capability):
    """cuDNN's backward serves on compute capability 9.x only (`CUDNN_CAPABILITY_MAJOR`: measured there; PyTorch
    refuses cuDNN's attention at seqlen_q = 1 on 10.x / 11.x for cuDNN 9.19-9.25, and sm_89 lacks engines for some
    shapes); elsewhere the flash path (one query row goes there everywhere: `cudnn_trusted`)."""
    monkeypatch.setattr(backward, "_capability", lambda device: capability)
    for seqlen_q in (2, 5):
        q, k, v = make_qkv(1, seqlen_q, 128, 4, 2, 64, dtype=BF16)
        _sum_backward(q, k, v)
    assert (len(cudnn_stand_in), len(fused_on_cpu)) == ((2, 0) if capability[0] == 9 else (0, 2))


def test_broadcast_inputs_go_to_flash(cudnn_stand_in, fused_on_cpu):
    """Queries expanded over the batch (learned latents, stride 0): cuDNN's descriptors are not asked to take a
    broadcast dimension; the flash path serves, the latents' gradient (summed over the batch by autograd) within the
    rule. `_in_layout_of` puts such a dimension outermost, as PyTorch's own layout matching does, keeping head_dim's
    unit stride."""
    latents = torch.randn(1, 8, 4, 64, dtype=BF16)
    _, k, v = make_qkv(3, 8, 128, 4, 2, 64, dtype=BF16)
    grad_out = torch.randn(3, 8, 4, 64, dtype=BF16)
    leaf = latents.clone().requires_grad_(True)
    (got,) = torch.autograd.grad(fa_variants.attention(leaf.expand(3, -1, -1, -1), k, v), [leaf], grad_out)
    assert cudnn_stand_in == [] and len(fused_on_cpu) == 1
    ref = latents.clone().requires_grad_(True)
    (same,) = torch.autograd.grad(reference.attention_reference(ref.expand(3, -1, -1, -1), k, v, dtype=BF16)[0], [ref],
                                  grad_out)
    exact = latents.double().requires_grad_(True)
    (want,) = torch.autograd.grad(reference.attention_reference(exact.expand(3, -1, -1, -1), k.double(), v.double())[0],
                                  [exact], grad_out.double())
    assert got.isfinite().all() and (got.double() - want).abs().max() <= 2 * (same.double() - want).abs().max() + 1e-3
    view = backward._in_layout_of(leaf.expand(3, -1, -1, -1).transpose(1, 2), torch.randn(3, 4, 8, 64))
    assert view.stride(-1) == 1 and view.permute(0, 2, 1, 3).is_contiguous()  # batch outermost, then Q's order


def test_o_and_do_layout_for_every_order_of_dimensions():
    """`_in_layout_of` hands t back (no copy) exactly when it is dense in ref's order of dimensions and 16-byte
    aligned (its ~1 us check from `_dense_layout`'s cached strides, session 45), else a dense aligned copy in that
    order: over every order of ref's and t's dimensions, sizes of 1 among them, a t with gaps and a misaligned t."""
    import itertools

    from fa_variants.common import interop

    shape = (2, 1, 3, 8)
    storage = torch.randn(2 * 3 * 8 * 2 + 8, dtype=BF16)
    for ref_order, t_order in itertools.product(itertools.permutations(range(4)), repeat=2):
        ref = torch.empty([shape[d] for d in ref_order], dtype=BF16).permute([ref_order.index(d) for d in range(4)])
        dense_t = torch.randn([shape[d] for d in t_order], dtype=BF16).permute([t_order.index(d) for d in range(4)])
        gapped = torch.randn(2, 1, 3, 16, dtype=BF16)[..., 8:]  # rows 32 bytes apart, 16 used
        for t in (dense_t, gapped, storage[1:1 + dense_t.numel()].view(shape)):
            got = backward._in_layout_of(ref, t)
            in_order = got.permute(backward._dense_layout(tuple(ref.shape), tuple(ref.stride()))[0])
            assert torch.equal(got, t) and in_order.is_contiguous() and got.data_ptr() % 16 == 0
            already = t.permute(backward._dense_layout(tuple(ref.shape), tuple(ref.stride()))[0]).is_contiguous() \
                and interop.is_aligned(t)  # every stride too: a size-1 dimension's free stride may not be
            assert (got.data_ptr() == t.data_ptr()) == already


@pytest.mark.parametrize("switch", ["cudnn_sdp_off", "deterministic", "deterministic_warn_only", "avoid_recompile"])
def test_pytorchs_switches_keep_cudnn_off(cudnn_stand_in, fused_on_cpu, monkeypatch, switch):
    """PyTorch's process-wide switches that keep SDPA off cuDNN keep ours off it too, the flash path serving:
    ``enable_cudnn_sdp(False)``; ``use_deterministic_algorithms(True)`` (cuDNN's backward is not deterministic; in
    warn-only mode cuDNN still serves, as SDPA's warning allows); ``TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1`` (cuDNN's
    forward then lays its statistics out otherwise, and its backward reads them so: ours would be misread)."""
    q, k, v = make_qkv(1, 12, 12, 4, 2, 64, dtype=BF16)
    sdp, det, warn_only = (torch.backends.cuda.cudnn_sdp_enabled(), torch.are_deterministic_algorithms_enabled(),
                           torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        if switch == "cudnn_sdp_off":
            torch.backends.cuda.enable_cudnn_sdp(False)
        elif switch.startswith("deterministic"):
            torch.use_deterministic_algorithms(True, warn_only=switch.endswith("warn_only"))
        else:
            monkeypatch.setenv("TORCH_CUDNN_SDPA_AVOID_RECOMPILE", "1")
        _sum_backward(q, k, v, causal=True)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(sdp)
        torch.use_deterministic_algorithms(det, warn_only=warn_only)
    cudnn_serves = switch == "deterministic_warn_only"
    assert (len(cudnn_stand_in), len(fused_on_cpu)) == ((1, 0) if cudnn_serves else (0, 1))


@pytest.mark.parametrize("dim", [0, 2], ids=["batch", "heads"])
def test_fused_backwards_within_the_cuda_grid(cudnn_stand_in, fused_on_cpu, monkeypatch, dim):
    """Batch and num_heads above `FUSED_MAX_GRID` (65535: a CUDA grid's y / z extent; lowered here to 3) keep the
    PyTorch backward (windowed attention folds windows into the batch); at the limit cuDNN serves."""
    monkeypatch.setattr(backward, "FUSED_MAX_GRID", 3)
    for size, expected in ((4, (0, 0)), (3, (1, 0))):
        shape = [2, 9, 2, 2, 64]
        shape[dim if dim == 0 else 2] = size
        shape[3] = shape[2] if dim == 2 else 2
        q, k, v = make_qkv(shape[0], 9, 9, shape[2], shape[3], 64, dtype=BF16)
        _sum_backward(q, k, v, causal=True)
        assert (len(cudnn_stand_in), len(fused_on_cpu)) == expected, size
        cudnn_stand_in.clear()


@pytest.mark.parametrize("causal, nk", [(False, 128), (True, 20)], ids=["cudnn", "flash"])
def test_unaligned_inputs_reach_the_kernels_aligned(cudnn_stand_in, fused_on_cpu, monkeypatch, causal, nk):
    """Q, K, V viewed at an odd offset (a [..., 1:65] slice: the base 2 bytes past 16, rows of 130 bytes): the forward
    copies such a tensor for its kernel (``common.interop.aligned``), and the backward does the same for cuDNN's and
    the flash kernel's 16-byte loads; the gradients as for aligned inputs."""
    seen = []

    def record(real):
        def kernel(*args, **kwargs):
            seen.append([interop.is_aligned(t) for t in args[:5]])
            return real(*args, **kwargs)
        return kernel

    monkeypatch.setattr(backward, "CUDNN_BACKWARD_OP", record(backward.CUDNN_BACKWARD_OP))
    monkeypatch.setattr(backward, "FLASH_BACKWARD_OP", record(backward.FLASH_BACKWARD_OP))
    wide = [torch.randn(1, n, 4 if i == 0 else 2, 65, dtype=BF16) for i, n in enumerate((12, nk, nk))]
    grad_out = torch.randn(1, 12, 4, 64, dtype=BF16)
    grads = []
    for inputs in ([t[..., 1:] for t in wide], [t[..., 1:].contiguous() for t in wide]):
        leaves = [t.detach().requires_grad_(True) for t in inputs]  # the slices keep their offset and strides
        grads.append(torch.autograd.grad(fa_variants.attention(*leaves, causal=causal), leaves, grad_out))
    assert len(seen) == 2 and all(all(flags) for flags in seen), seen
    assert (len(cudnn_stand_in), len(fused_on_cpu)) == ((2, 0) if not causal else (0, 2))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("seqlen_q, seqlen_k, causal, cudnn_serves", [
    (2, 64, False, False), (3, 100, False, False), (5, 129, False, False), (9, 1216, False, False),
    (1, 128, False, False), (1, 256, False, False), (2, 128, False, True), (5, 256, False, True),
    (65, 65, True, True), (192, 192, True, True)])
def test_cudnn_trusted_geometries_only(cudnn_stand_in, fused_on_cpu, seqlen_q, seqlen_k, causal, cudnn_serves):
    """cuDNN's sm_90 backward gave NaN dQ on rows whose LSE is below -88.7 where its last 128-key tile was padded and
    no causal mask covered the padding (session 44's H100 run, cuDNN 9.19: seqlen_k = 64 mod 128, non-causal), and is
    reported to give NaN dK / dV for one query row at seqlen_k 128 on cuDNN 9.25-9.26; so it serves only with more
    than one query row and seqlen_k a multiple of `CUDNN_KEY_TILE` or square causal scores; the flash path
    elsewhere. Judged from the shapes alone."""
    q, k, v = make_qkv(1, seqlen_q, seqlen_k, 2, 1, 64, dtype=BF16)
    _sum_backward(q, k, v, causal=causal)
    assert (len(cudnn_stand_in), len(fused_on_cpu)) == ((1, 0) if cudnn_serves else (0, 1))
    assert backward.cudnn_trusted(seqlen_q, seqlen_k, causal) is cudnn_serves


@pytest.mark.parametrize("wide, capability, pytorch_takes_it, cudnn_serves", [
    (False, (9, 0), True, False), (True, (9, 0), True, True), (True, (9, 0), False, False),
    (True, (9, 4), True, False), (True, (10, 0), True, False)])
def test_cudnn_wide_head_dims_follow_pytorchs_gate(cudnn_stand_in, fused_on_cpu, monkeypatch, wide, capability,
                                                   pytorch_takes_it, cudnn_serves):
    """`CUDNN_WIDE` (on since session 45) lets cuDNN's backward take head dims above `CUDNN_MAX_HEAD_DIM` up to
    `CUDNN_SM90_MAX_HEAD_DIM` where PyTorch itself would run SDPA's cuDNN path on the call
    (``torch.backends.cuda.can_use_cudnn_attention``, a gate that moves between releases), on compute capability 9.0
    (the limits lowered to 32 / 64 here for the fake kernel's head dims); elsewhere the flash path serves them."""
    asked = []
    monkeypatch.setattr(backward, "CUDNN_WIDE", wide)
    monkeypatch.setattr(backward, "CUDNN_MAX_HEAD_DIM", 32)
    monkeypatch.setattr(backward, "CUDNN_SM90_MAX_HEAD_DIM", 64)
    monkeypatch.setattr(backward, "_capability", lambda device: capability)
    monkeypatch.setattr(backward, "_pytorch_takes_cudnn", lambda *args: asked.append(args) or pytorch_takes_it)
    q, k, v = make_qkv(1, 5, 128, 2, 1, 64, dtype=BF16)
    _sum_backward(q, k, v)
    assert (len(cudnn_stand_in), len(fused_on_cpu)) == ((1, 0) if cudnn_serves else (0, 1))
    assert len(asked) == (1 if wide and capability == (9, 0) else 0)


def test_pytorchs_cudnn_check_is_asked_on_sdpas_layout(monkeypatch):
    """`_pytorch_takes_cudnn` hands ``can_use_cudnn_attention`` SDPA's (batch, heads, seqlen, head_dim) views of the
    call, with enable_gqa where the heads differ, requiring grad under grad mode (the backward runs without it)."""
    from torch.backends import cuda

    seen = []
    monkeypatch.setattr(cuda, "can_use_cudnn_attention",
                        lambda params, debug: seen.append(params) or torch.is_grad_enabled())
    q, k, v = make_qkv(2, 5, 128, 4, 2, 64, dtype=BF16)
    with torch.no_grad():  # as in a backward: PyTorch's training gate reads requires_grad under grad mode
        assert backward._pytorch_takes_cudnn(q, k, v, False) is True
    (params,) = seen
    assert params.query.shape == (2, 4, 5, 64) and params.key.shape == (2, 2, 128, 64)
    assert params.is_causal is False and params.enable_gqa is True and params.query.requires_grad
    assert not q.requires_grad


def test_pytorchs_cudnn_check_failing_means_no(monkeypatch):
    """A PyTorch gate that raises (seen on the CPU, where it asks CUDA about CPU tensors) counts as "not cuDNN's":
    the wide head dims then take the flash path rather than failing the backward."""
    from torch.backends import cuda

    def broken(params, debug):
        raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")

    monkeypatch.setattr(cuda, "can_use_cudnn_attention", broken)
    q, k, v = make_qkv(1, 5, 128, 2, 1, 64, dtype=BF16)
    assert backward._pytorch_takes_cudnn(q, k, v, False) is False


@pytest.mark.parametrize("seqlen_q, seqlen_k, causal, flash_op", [
    (2, 64, False, True), (1, 128, False, True), (9, 40, True, True), (2, 128, False, False), (17, 17, True, False)])
def test_sdpa_mode_takes_the_flash_op_outside_trusted_geometries(fake_gpu, fused_on_cpu, monkeypatch, seqlen_q,
                                                                 seqlen_k, causal, flash_op):
    """The sdpa mode's eager backward is SDPA's own, which picks cuDNN's on Hopper: outside `cudnn_trusted` it runs
    PyTorch's FlashAttention-2 op under autograd instead (GQA natively, bottom-right causal; here its stand-in), chosen
    per call with SDPA's process-wide switches untouched; the gradients within the rule either way. With flash SDPA
    disabled there, the mode declines (the PyTorch backward serves)."""
    from helpers import flash_forward_stand_in

    ops, sdp_flags = [], [torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()]
    monkeypatch.setenv("FA_VARIANTS_BACKWARD", "sdpa")
    monkeypatch.setattr(backward, "FLASH_FORWARD_OP", lambda *a, **kw: ops.append(a) or flash_forward_stand_in(*a, **kw))
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, 4, 2, 64, dtype=BF16)
    grad_out = torch.randn(q.shape, dtype=BF16)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    got = torch.autograd.grad(fa_variants.attention(*leaves, causal=causal), leaves, grad_out)
    assert len(ops) == (1 if flash_op else 0) and fused_on_cpu == []
    assert sdp_flags == [torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()]
    ref = [t.clone().requires_grad_(True) for t in (q, k, v)]
    same = torch.autograd.grad(reference.attention_reference(*ref, causal=causal, dtype=BF16)[0], ref, grad_out)
    assert_grads_within_rule(got, same, exact_grads(q, k, v, grad_out, causal=causal))
    assert backward.sdpa_applies(q, k, causal, None) is False  # grad mode is on here: no fused backward
    with torch.no_grad():
        assert backward.sdpa_applies(q, k, causal, None) is True
        monkeypatch.setattr(torch.backends.cuda, "flash_sdp_enabled", lambda: False)
        assert backward.sdpa_applies(q, k, causal, None) is (not flash_op)


def test_cudnn_hands_over_to_flash_then_pytorch(cudnn_stand_in, fused_on_cpu, monkeypatch):
    """Where cuDNN does not apply but the flash kernel does (causal with seqlen_q < seqlen_k: cuDNN's mask is
    top-left; head_dim above `CUDNN_MAX_HEAD_DIM` and `CUDNN_SM90_MAX_HEAD_DIM`, here lowered to 32 for the fake
    kernel's head dims; one key) the
    flash path serves; where neither does (an LSE in the loss, causal rows without keys, a scale above 1) the PyTorch
    backward, bit for bit."""
    cases = [(dict(causal=True), make_qkv(1, 9, 12, 4, 2, 64, dtype=BF16)),
             (dict(), make_qkv(1, 5, 128, 2, 2, 64, dtype=BF16)),
             (dict(), make_qkv(1, 5, 1, 2, 1, 16, dtype=BF16))]
    limits = (None, 32, None)
    for (kwargs, inputs), limit in zip(cases, limits):
        with monkeypatch.context() as patch:
            if limit is not None:
                patch.setattr(backward, "CUDNN_MAX_HEAD_DIM", limit)
                patch.setattr(backward, "CUDNN_SM90_MAX_HEAD_DIM", limit)
            _sum_backward(*inputs, **kwargs)
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
