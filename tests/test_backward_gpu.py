"""Gradients through the kernel backends on the GPU: the kernel's forward, ``reference.run_backward``'s backward.

The forward kernels (fa3, fa2, fa1) have no backward kernel: a call whose inputs require grad goes through the
custom op (``integrations.custom_op``), whose backward (``integrations.backward``) recomputes attention in float32
PyTorch, query rows in chunks (``reference.BACKWARD_CHUNK_ELEMENTS``), or with FA_VARIANTS_BACKWARD=flash / sdpa takes
PyTorch's fused backward kernels where they apply. Checked here against float64 autograd with the tolerance rule (each
gradient's error at most 2x that of autograd through the same maths in PyTorch in the input dtype, plus a floor),
for odd sizes, GQA, causal with seqlen_q != seqlen_k, head dims 64 / 96 / 128 / 256; the chunks' memory bound at
a sequence whose whole score matrix would not fit it; and the same gradients under torch.compile.
Run on the GPU host: ``python -m pytest -q tests/test_backward_gpu.py``.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import fa_variants
from fa_variants import dispatch, reference
from fa_variants.integrations import backward
from helpers import assert_grads_within_rule, lengths_loss_grads, make_qkv, padded_kv_cache

pytestmark = pytest.mark.gpu

SHAPES = [  # (batch, seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim)
    (1, 1, 1, 1, 1, 64),
    (2, 113, 127, 6, 2, 64),
    (1, 127, 1023, 4, 1, 128),
    (2, 300, 113, 4, 4, 96),   # seqlen_q > seqlen_k: causal rows that see no key
    (1, 255, 257, 2, 2, 256),
    (2, 256, 256, 4, 2, 128),  # seqlen_k a multiple of 128: cuDNN's backward serves the cudnn mode, full and causal
]


def _grads(q, k, v, grad_out, dtype=None, **kwargs):
    """Gradients of attention: ``dtype`` None the call's own path (q's dtype, the backend asked for), else autograd
    through ``attention_reference`` in that dtype."""
    leaves = [t.clone().requires_grad_(True) if dtype is None else t.to(dtype).requires_grad_(True) for t in (q, k, v)]
    if dtype is None:
        out = fa_variants.attention(*leaves, **kwargs)
    else:
        kwargs.pop("backend")
        out = reference.attention_reference(*leaves, dtype=dtype, **kwargs)[0]
    return torch.autograd.grad(out, leaves, grad_out.to(out.dtype))


def _counted(monkeypatch, *names) -> dict:
    """Count the calls of ``backward``'s functions ``names`` (which still run): {name: calls} of those called."""
    calls = {}
    for name in names:
        def counted(*args, _real=getattr(backward, name), _name=name):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*args)
        monkeypatch.setattr(backward, name, counted)
    return calls


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("backend", ["fa3", "fa2", "fa1"])
@pytest.mark.parametrize("mode", ["pytorch", "flash", "sdpa", "cudnn"])
def test_kernel_gradients_within_the_rule(gpu_variant, monkeypatch, mode, backend, shape, dtype, causal):
    """FA_VARIANTS_BACKWARD=pytorch (reference.run_backward), flash (PyTorch's FlashAttention-2 backward kernel on our
    O and LSE), sdpa (SDPA's forward again and its fused backward) and cudnn (cuDNN's backward on our O and LSE, the
    flash kernel beyond its limits); the fused ones serve wherever they apply (not at seqlen_q > seqlen_k causal,
    which keeps the PyTorch backward), and only there."""
    monkeypatch.setenv("FA_VARIANTS_BACKWARD", mode)
    variant = gpu_variant(backend)
    if shape[-1] not in variant.head_dims:
        pytest.skip(f"{backend} has no head_dim {shape[-1]}")
    calls = _counted(monkeypatch, "flash_backward", "sdpa_backward", "cudnn_backward")
    q, k, v = make_qkv(*shape, dtype=dtype, device="cuda")
    grad_out = torch.randn(q.shape, dtype=dtype, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
        got = _grads(q, k, v, grad_out, backend=backend, causal=causal)
    fused = mode != "pytorch" and not (causal and shape[1] > shape[2])
    hopper = dispatch.device_capability(torch.device("cuda"))[0] == backward.CUDNN_CAPABILITY_MAJOR
    square_causal = causal and shape[1] == shape[2]
    if mode == "cudnn" and not (hopper and shape[-1] <= 128 and shape[2] > 1 and (not causal or square_causal)
                                and shape[1] > 1 and (shape[2] % 128 == 0 or square_causal)):
        mode = "flash"  # cuDNN's limits (sm_90, head_dim, one key, its top-left causal mask, one query row or a padded
        # last key tile with no causal mask over it: cudnn_trusted): the flash kernel serves
    assert calls == ({f"{mode}_backward": 1} if fused else {}), calls
    same = _grads(q, k, v, grad_out, dtype, backend=backend, causal=causal)
    exact = _grads(q, k, v, grad_out, torch.float64, backend=backend, causal=causal)
    for name, g in zip("qkv", got):
        assert g.dtype == dtype and g.isfinite().all(), name
    assert_grads_within_rule(got, same, exact)


@pytest.mark.parametrize("backend", ["fa3", "fa2", "fa1"])
def test_kernel_gradients_with_seqlens_k(gpu_variant, backend):
    """A padded KV cache (NaN past each length, lengths 0 and 1 among them), causal, GQA 8:2, a gradient through the
    LSE too: the kernel forward, then each sequence's gradients from its own keys (finite; 0 past its length), within
    the rule against float64 (the reference backend's autograd on the same bf16 inputs the baseline: the same float32
    maths, but the loss's upstream gradient 2 out differs by out's rounding, kernel or PyTorch, so not bit for bit)."""
    gpu_variant(backend)
    q, k, v, lengths = padded_kv_cache([0, 1, 113, 300], 37, 300, 8, 2, 128, dtype=torch.bfloat16, device="cuda")
    grads = [lengths_loss_grads(q, k, v, lengths, name) for name in (backend, "reference")]
    exact = lengths_loss_grads(*(t.double() for t in (q, k, v)), lengths, "reference")
    for g in grads[0]:
        assert g.isfinite().all()
    assert_grads_within_rule(*grads, exact)
    dk, dv = grads[0][1], grads[0][2]
    for b, n in enumerate(lengths.tolist()):
        assert not dk[b, n:].any() and not dv[b, n:].any()


@pytest.mark.parametrize("lengths", [[300, 0, 113, 1, 256, 300], [128, 128]], ids=["mixed", "uniform"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("backend", ["fa3", "fa2"])
@pytest.mark.parametrize("mode", ["cudnn", "flash", "sdpa"])
def test_fused_gradients_with_seqlens_k(gpu_variant, monkeypatch, mode, backend, causal, lengths):
    """A padded KV cache of 300 keys (NaN past each length; lengths 0, 1, 113, 256, 300, two sequences at 300; or
    every sequence at 128: K and V reach the kernel as views cut to 128 keys, their batch stride not packed), a loss
    of out alone: the fused backward once per length with keys (``backward._backward_by_length``; causal: not for
    lengths below seqlen_q, whose rows see no key, the reference's there), gradients finite, within the rule against
    float64, 0 past each length."""
    monkeypatch.setenv("FA_VARIANTS_BACKWARD", mode)
    gpu_variant(backend)
    calls = _counted(monkeypatch, "flash_backward", "sdpa_backward", "cudnn_backward")
    q, k, v, seqlens_k = padded_kv_cache(lengths, 37, 300, 8, 2, 128, dtype=torch.bfloat16, device="cuda")
    grad_out = torch.randn(q.shape, dtype=torch.bfloat16, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
        got = _grads(q, k, v, grad_out, backend=backend, causal=causal, seqlens_k=seqlens_k)
    assert sum(calls.values()) == len({n for n in lengths if n >= (37 if causal else 1)}), calls
    same = _grads(q, k, v, grad_out, torch.bfloat16, backend=backend, causal=causal, seqlens_k=seqlens_k)
    exact = _grads(q, k, v, grad_out, torch.float64, backend=backend, causal=causal, seqlens_k=seqlens_k)
    for name, g in zip("qkv", got):
        assert g.dtype == torch.bfloat16 and g.isfinite().all(), name
    assert_grads_within_rule(got, same, exact)
    for b, n in enumerate(lengths):
        assert not got[1][b, n:].any() and not got[2][b, n:].any()


def test_backward_memory_is_bounded_by_the_chunks(gpu_variant, monkeypatch):
    """seqlen 8k, 16 heads: one float32 score matrix is 4 GiB; the PyTorch backward's peak above the inputs stays
    within the chunks' few score-sized tensors (2^26 elements, 256 MiB each), and a finer chunking gives the same
    gradients. FA_VARIANTS_BACKWARD=pytorch: the fused modes (cudnn the default) would not run the chunks (session 42
    on an H200: SDPA's cuDNN gradients against the chunks' failed bf16's default tolerance, as two algorithms may)."""
    backend = "fa3" if dispatch.device_capability(torch.device("cuda")) >= (9, 0) else "fa2"
    gpu_variant(backend)
    monkeypatch.setenv("FA_VARIANTS_BACKWARD", "pytorch")
    q, k, v = make_qkv(1, 8192, 8192, 16, 4, 128, dtype=torch.bfloat16, device="cuda")
    grad_out = torch.randn(q.shape, dtype=q.dtype, device="cuda")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = fa_variants.attention(*leaves, causal=True, backend=backend)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
        got = torch.autograd.grad(out, leaves, grad_out)
    peak = torch.cuda.max_memory_allocated() - base
    assert peak < 3 * 2**30, f"backward peak {peak / 2**30:.2f} GiB above the inputs"
    fine = reference.run_backward(grad_out, torch.zeros(1, 16, 8192, device="cuda"), q, k, v, causal=True,
                                  softmax_scale=128 ** -0.5, chunk_elements=1 << 22)
    for g, f in zip(got, fine):
        torch.testing.assert_close(g, f)


@pytest.mark.parametrize("mode", ["pytorch", "flash", "sdpa", "cudnn"])
def test_kernel_gradients_under_torch_compile(gpu_variant, monkeypatch, mode):
    """torch.compile(fullgraph=True) over a call whose inputs require grad: the kernel op and the backward op in the
    graph, the same gradients as eagerly (bf16's tolerance); with FA_VARIANTS_BACKWARD=flash a loss of out alone (the
    LSE's gradient None) takes the flash kernel inside the traced backward op too; with cudnn (the default) cuDNN's
    kernel, traced and eager (not causal here: seqlen_q != seqlen_k, where its top-left mask is not ours); with sdpa
    the flash kernel traced, compared with the eager flash mode's (the same kernel: SDPA's eager backward is another
    algorithm, off by more than bf16's tolerance in places, session 42 on an H200; its gradients are judged by the
    rule in test_kernel_gradients_within_the_rule)."""
    backend = "fa3" if dispatch.device_capability(torch.device("cuda")) >= (9, 0) else "fa2"
    gpu_variant(backend)
    monkeypatch.setenv("FA_VARIANTS_BACKWARD", mode)
    calls = _counted(monkeypatch, "flash_backward", "sdpa_backward", "cudnn_backward")
    q, k, v = make_qkv(2, 257, 384, 8, 2, 128, dtype=torch.bfloat16, device="cuda")
    causal = mode != "cudnn"

    def loss(q, k, v):
        out, lse = fa_variants.attention(q, k, v, causal=causal, backend=backend, return_lse=True)
        return out.float().square().sum() + (lse.sum() if mode == "pytorch" else 0)

    torch._dynamo.reset()
    grads = []
    for run, eager_mode in ((torch.compile(loss, fullgraph=True), mode), (loss, "flash" if mode == "sdpa" else mode)):
        monkeypatch.setenv("FA_VARIANTS_BACKWARD", eager_mode)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
            grads.append(torch.autograd.grad(run(*leaves), leaves))
    hopper = dispatch.device_capability(torch.device("cuda"))[0] == backward.CUDNN_CAPABILITY_MAJOR
    fused = "cudnn_backward" if mode == "cudnn" and hopper else "flash_backward"
    assert calls == ({} if mode == "pytorch" else {fused: 2})  # compiled, then eager
    for g, e in zip(*grads):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seqlen_q, seqlen_k, causal", [
    (1, 64, False), (1, 128, False), (1, 192, False), (100, 1216, False), (192, 192, True), (1216, 1216, True),
    (3, 100, False), (1, 65, False), (100, 256, False), (1, 1000, False), (100, 1216, True), (2, 128, False)])
@pytest.mark.parametrize("mode", ["pytorch", "flash", "sdpa", "cudnn"])
def test_gradients_of_rows_with_a_very_negative_lse(gpu_variant, monkeypatch, mode, seqlen_q, seqlen_k, causal,
                                                    head_dim):
    """Queries anti-aligned with every key: each scaled score near -14 sqrt(head_dim), so every row's LSE is below
    -ln(float32 max) = -88.7. A backward kernel that lets a padded key tile (seqlen_k not a multiple of its tile) into
    exp(score - LSE) unmasked overflows there, 0 * inf giving NaN gradients; random inputs (LSE ~ log seqlen_k) never
    show it (a failure class reported for cuDNN's sm_90 attention backward at seqlen_k = 64 mod 128, and seen in
    session 44 on an H100 with cuDNN 9.19: NaN dQ at seqlen_k 64 / 192 / 1216 non-causal in the cudnn and sdpa modes).
    cuDNN's backward serves the cudnn mode only where seqlen_k is a multiple of 128 or the scores are square causal
    and there is more than one query row (backward.cudnn_trusted); the sdpa mode takes PyTorch's FlashAttention-2 op
    elsewhere. Each mode's gradients finite and within the rule."""
    _check_extreme_rows(gpu_variant, monkeypatch, mode, seqlen_q, seqlen_k, causal, head_dim, anti_aligned=True)


@pytest.mark.parametrize("mode", ["cudnn", "sdpa"])
@pytest.mark.parametrize("anti_aligned", [True, False], ids=["lse_below_-88.7", "random"])
@pytest.mark.parametrize("seqlen_q, seqlen_k, causal", [
    (1, 128, False), (2, 128, False), (3, 100, False), (100, 256, False), (100, 1216, False), (192, 192, True)])
def test_cudnn_wide_candidate_at_head_dim_256(gpu_variant, monkeypatch, seqlen_q, seqlen_k, causal, anti_aligned,
                                              mode):
    """Session 44's candidate, backward.CUDNN_WIDE: cuDNN's backward up to head_dim 256 on compute capability 9.0 where
    PyTorch would run SDPA's cuDNN path on the call (cuDNN 9.10+ for torch 2.11), the trusted geometries as at 64 /
    128: gradients finite and within the rule, on random inputs and on rows whose LSE is below -88.7. Beside it the
    sdpa mode at head_dim 256 (SDPA's own choice, cuDNN's backward on Hopper, at the trusted geometries; PyTorch's
    FlashAttention-2 op elsewhere)."""
    monkeypatch.setattr(backward, "CUDNN_WIDE", True)
    _check_extreme_rows(gpu_variant, monkeypatch, mode, seqlen_q, seqlen_k, causal, 256, anti_aligned)


def _check_extreme_rows(gpu_variant, monkeypatch, mode, seqlen_q, seqlen_k, causal, head_dim, anti_aligned):
    """One case of the two tests above: FA_VARIANTS_BACKWARD=mode, bf16, batch 2, heads 4:2; queries anti-aligned with
    every key (scores near -14 sqrt(head_dim), every LSE below -88.7) or random; the fused path each mode should take
    (cuDNN's on sm_9x where head_dim <= 128, or up to 256 with CUDNN_WIDE where PyTorch would take cuDNN, and
    backward.cudnn_trusted: more than one query row, seqlen_k a multiple of 128 or square causal), gradients finite
    and within the rule."""
    monkeypatch.setenv("FA_VARIANTS_BACKWARD", mode)
    backend = "fa3" if dispatch.device_capability(torch.device("cuda")) >= (9, 0) else "fa2"
    gpu_variant(backend)
    calls = _counted(monkeypatch, "flash_backward", "sdpa_backward", "cudnn_backward")
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, 4, 2, head_dim, dtype=torch.float32, device="cuda")
    if anti_aligned:
        direction = torch.randn(head_dim, device="cuda").sign()
        q, k = 0.1 * q + 3.75 * direction, 0.1 * k - 3.75 * direction
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    grad_out = torch.randn(q.shape, dtype=torch.bfloat16, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
        _, lse = fa_variants.attention(q, k, v, causal=causal, backend=backend, return_lse=True)
        assert not anti_aligned or lse.max() < -88.7, lse.max()
        got = _grads(q, k, v, grad_out, backend=backend, causal=causal)
    capability = dispatch.device_capability(torch.device("cuda"))
    wide = backward.CUDNN_WIDE and capability == (9, 0) and backward._pytorch_takes_cudnn(q, k, v, causal)
    square_causal = causal and seqlen_q == seqlen_k
    cudnn = (capability[0] == backward.CUDNN_CAPABILITY_MAJOR and head_dim <= (256 if wide else 128)
             and (not causal or square_causal) and seqlen_q > 1 and (seqlen_k % 128 == 0 or square_causal))
    expected = {"pytorch": {}, "flash": {"flash_backward": 1}, "sdpa": {"sdpa_backward": 1},
                "cudnn": {"cudnn_backward" if cudnn else "flash_backward": 1}}[mode]
    assert calls == expected, calls
    for name, g in zip("qkv", got):
        assert g.isfinite().all(), f"d{name} not finite ({mode})"
    same = _grads(q, k, v, grad_out, torch.bfloat16, backend=backend, causal=causal)
    exact = _grads(q, k, v, grad_out, torch.float64, backend=backend, causal=causal)
    assert_grads_within_rule(got, same, exact)


def test_cudnn_backward_beside_sdpas_own(gpu_variant, monkeypatch):
    """PyTorch caches cuDNN's backward graph per Q / K / V shape and strides (releases before its newest key O's and
    dO's strides too), so ours (FA_VARIANTS_BACKWARD=cudnn, O and dO in Q's layout) and SDPA's own cuDNN backward
    share graphs: alternating at one shape, Q / K / V in the (batch, seqlen, heads, head_dim) and in SDPA's (batch,
    heads, seqlen, head_dim) memory layout, ours given dO in either layout, SDPA's in its O's (a varying dO layout at
    fixed Q strides trips PyTorch's own cache with or without us), every gradient within the rule against float64."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    capability = dispatch.device_capability(torch.device("cuda"))
    if capability[0] != backward.CUDNN_CAPABILITY_MAJOR:
        pytest.skip(f"the cudnn mode takes cuDNN's backward on sm_90 only (this GPU: {capability})")
    backend = "fa3"
    gpu_variant(backend)
    monkeypatch.setenv("FA_VARIANTS_BACKWARD", "cudnn")
    calls = _counted(monkeypatch, "cudnn_backward")
    q0, k0, v0 = make_qkv(2, 200, 200, 4, 4, 64, dtype=torch.bfloat16, device="cuda")
    grad0 = torch.randn(q0.shape, dtype=torch.bfloat16, device="cuda")

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(
                1, 2)

    def ours(q, k, v):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
            return fa_variants.attention(q, k, v, causal=True, backend=backend)

    same = _grads(q0, k0, v0, grad0, torch.bfloat16, backend=backend, causal=True)
    exact = _grads(q0, k0, v0, grad0, torch.float64, backend=backend, causal=True)
    runs = 0
    for layout in ("bshd", "bhsd", "bshd"):
        inputs = [t if layout == "bshd" else t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q0, k0, v0)]
        sdpa_grad = grad0 if layout == "bshd" else grad0.transpose(1, 2).contiguous().transpose(1, 2)  # O's layout
        for grad in (grad0, grad0.transpose(1, 2).contiguous().transpose(1, 2)):
            for fn in (sdpa, ours, sdpa):
                leaves = [t.clone().requires_grad_(True) for t in inputs]
                try:
                    got = torch.autograd.grad(fn(*leaves), leaves, sdpa_grad if fn is sdpa else grad)
                except RuntimeError as error:
                    if fn is sdpa and runs == 0:
                        pytest.skip(f"no cuDNN attention in this PyTorch / GPU: {error}")
                    raise
                runs += 1
                for g in got:
                    assert g.isfinite().all(), (layout, fn.__name__)
                assert_grads_within_rule(got, same, exact)
    assert calls == {"cudnn_backward": 6}


def test_deterministic_algorithms_keep_cudnn_off_and_repeat(gpu_variant, monkeypatch):
    """torch.use_deterministic_algorithms(True): the default mode leaves cuDNN's backward (not deterministic) to the
    flash kernel, whose op honours the flag; two backwards of one call give the same gradients bit for bit (the same
    kernel on the same GPU and inputs: what the flag promises), within the rule."""
    backend = "fa3" if dispatch.device_capability(torch.device("cuda")) >= (9, 0) else "fa2"
    gpu_variant(backend)
    monkeypatch.delenv("FA_VARIANTS_BACKWARD", raising=False)
    calls = _counted(monkeypatch, "flash_backward", "cudnn_backward")
    q, k, v = make_qkv(2, 300, 300, 8, 2, 128, dtype=torch.bfloat16, device="cuda")
    grad_out = torch.randn(q.shape, dtype=torch.bfloat16, device="cuda")
    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
            runs = [_grads(q, k, v, grad_out, backend=backend, causal=True) for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)
    assert calls == {"flash_backward": 2}
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    same = _grads(q, k, v, grad_out, torch.bfloat16, backend=backend, causal=True)
    exact = _grads(q, k, v, grad_out, torch.float64, backend=backend, causal=True)
    assert_grads_within_rule(runs[0], same, exact)
