"""``torch.ops.fa_variants.attention``: how ``fa_variants.attention`` appears to torch.compile and torch.export.

    out = fa_variants.attention(q, k, v, causal=True)    # eager, or inside torch.compile(fullgraph=True)
    torch.export.export(model, (x,))                      # the op is one node of the exported graph

The kernels are launched from Python (CuTe DSL objects) after a backend choice that imports modules and
reads the environment, none of which Dynamo can trace. ``fa_variants.attention`` therefore validates its
arguments in plain Python (traceable) and, while being traced, calls this ``torch.library`` custom op, which
tracing sees as one opaque node: its fake implementation gives the output shapes and dtypes without running
anything, and its real implementation is ``api.dispatch_and_run``, the very function ``fa_variants.attention``
calls eagerly (eagerly the op is skipped only to save the dispatcher's per-call cost; the result is the same).
Source: PyTorch docs, "Python Custom Operators" (``torch.library.custom_op``, ``register_fake``,
``register_autograd``).

Schema: ``fa_variants::attention(Tensor q, Tensor k, Tensor v, bool causal, float? softmax_scale,
str backend) -> (Tensor out, Tensor lse)``, out contiguous (batch, seqlen_q, num_heads, head_dim) in q's
dtype (bfloat16 for e4m3: ``api.output_dtype``), lse float32 contiguous (batch, num_heads, seqlen_q); with per-sequence KV lengths
``fa_variants::attention_seqlens_k(Tensor q, Tensor k, Tensor v, Tensor seqlens_k, bool causal, float?
softmax_scale, str backend) -> (Tensor out, Tensor lse)``.

Autograd (both ops): the backward is the reference backend's (``reference.run_backward``, plain PyTorch, float32
maths, query rows in memory-bounded chunks): traced, in a second opaque op,
``fa_variants::attention_reference_backward``; eagerly (a call whose inputs require grad comes through the op) as
plain ops, so that a second derivative exists. It is the gradient of exact attention, which every backend's forward
computes but the FP8 one (``registry.FORWARD_ONLY``: a backward through it raises NotImplementedError when it runs).
The kernels have no backward kernel of their own: each warns once (``dispatch.BackendFallbackWarning``) at the
first eager call that needs its gradient, at the caller's line, or else (traced) at its first backward.
"""
from __future__ import annotations

import torch

import fa_variants

# api, dispatch, reference and workspace are imported inside the functions: `import fa_variants` registers the op
# when torch is loaded (torch.export.load needs it) without importing the API, whose modules read the FA_VARIANTS_*
# switches at import; those are read, as without torch, when the API is first used.


@torch.library.custom_op("fa_variants::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float | None,
                 backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``api.dispatch_and_run`` (choose the backend, run it); outputs made contiguous to match the fake. Scratch
    is per call (``workspace.uncached``): a compiled graph's CUDA-graph warm-up allocates from its private pool,
    where no buffer may outlive the call."""
    from fa_variants import api
    from fa_variants.common import workspace

    with workspace.uncached():
        out, lse = api.dispatch_and_run(q, k, v, causal, softmax_scale, backend)
    return out.contiguous(), lse.contiguous()


@attention_op.register_fake
def _attention_fake(q, k, v, causal, softmax_scale, backend):
    """Shapes and dtypes only: out like q (contiguous; bfloat16 for e4m3 q: ``api.output_dtype``), lse float32
    (batch, num_heads, seqlen_q).

    Validates first, with ``fa_variants.attention``'s rules and messages (a direct ``torch.ops`` call has
    not been validated), so that a bad call fails while tracing with that message."""
    from fa_variants import api

    api._check_inputs(q, k, v)
    api._check_options(causal, softmax_scale, backend, False)
    batch, seqlen_q, heads, head_dim = q.shape
    out = q.new_empty((batch, seqlen_q, heads, head_dim), dtype=api.output_dtype(q.dtype))
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("fa_variants::attention_seqlens_k", mutates_args=())
def attention_seqlens_k_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqlens_k: torch.Tensor, causal: bool,
                           softmax_scale: float | None, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``fa_variants.attention(..., seqlens_k=...)`` while traced: ``api.run_seqlens_k`` (fa3 and fa2 read the
    lengths in their kernels, so the op runs inside a CUDA graph of ``mode="reduce-overhead"`` too; outside capture
    the lengths are checked, one read-back). Its backward is the reference backend's (`_seqlens_k_backward`)."""
    from fa_variants import api
    from fa_variants.common import workspace
    with workspace.uncached():
        out, lse = api.run_seqlens_k(q, k, v, causal, softmax_scale, backend, seqlens_k)
    return out.contiguous(), lse.contiguous()


@attention_seqlens_k_op.register_fake
def _attention_seqlens_k_fake(q, k, v, seqlens_k, causal, softmax_scale, backend):
    """``_attention_fake`` (``fa_variants.attention``'s checks, then the shapes), then seqlens_k's dtype, shape and
    device checked (its values are checked when the op runs)."""
    from fa_variants.reference import check_seqlens_k
    outputs = _attention_fake(q, k, v, causal, softmax_scale, backend)
    check_seqlens_k(seqlens_k, q.shape[0], k.shape[1], q.device, values=False, host_ok=True)
    return outputs


def _seqlens_k_setup_context(ctx, inputs, output):
    q, k, v, seqlens_k, causal, softmax_scale, backend = inputs
    ctx.save_for_backward(q, k, v, seqlens_k)
    ctx.causal, ctx.softmax_scale, ctx.backend = causal, softmax_scale, backend
    ctx.set_materialize_grads(False)


def _seqlens_k_backward(ctx, grad_out, grad_lse):
    q, k, v, seqlens_k = ctx.saved_tensors
    dq, dk, dv = _backward_of(ctx, grad_out, grad_lse, q, k, v, seqlens_k)
    return dq, dk, dv, None, None, None, None


# a backward exists for every backend but the FP8 one, whose backward raises when it runs (not while AOTAutograd traces
# the graph, so a compiled forward with inputs that require grad still runs)
attention_seqlens_k_op.register_autograd(_seqlens_k_backward, setup_context=_seqlens_k_setup_context)


@torch.library.custom_op("fa_variants::attention_reference_backward", mutates_args=())
def reference_backward_op(grad_out: torch.Tensor, grad_lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, seqlens_k: torch.Tensor | None, causal: bool, softmax_scale: float | None,
                          backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_reference_backward`` as one opaque node (for tracing), its outputs contiguous to match the fake."""
    return tuple(g.contiguous() for g in _reference_backward(grad_out, grad_lse, q, k, v, seqlens_k, causal,
                                                            softmax_scale, backend))


def warn_pytorch_backward(backend: str) -> None:
    """Warn once per process (``dispatch.warn_once``) that kernel backend ``backend``'s gradients run in PyTorch:
    at the forward call that needs them when eager (``api._kernel_autograd``), else at the first backward."""
    from fa_variants import dispatch

    dispatch.warn_once(("backward", backend), f"backend {backend} has no backward kernel: its gradients run in "
                       "PyTorch (float32 maths, query rows in chunks; reference.run_backward), slower than a fused "
                       "backward kernel")


def _reference_backward(grad_out, grad_lse, q, k, v, seqlens_k, causal: bool, softmax_scale: float | None,
                        backend: str):
    """(dq, dk, dv) of the op's (out, lse): ``reference.run_backward`` (plain PyTorch ops; per-sequence KV lengths
    ``seqlens_k`` or None), for every backend but ``registry.FORWARD_ONLY``'s (NotImplementedError); for a kernel
    backend ``warn_pytorch_backward``'s warning (no backward kernel: PyTorch's speed)."""
    from fa_variants import dispatch, reference, registry

    chosen = dispatch.select_backend(q, k, v, causal=causal, backend=backend).backend
    if chosen in registry.FORWARD_ONLY:
        raise NotImplementedError(f"backend {chosen} is forward-only: no gradient through it "
                                  f"({registry.FORWARD_ONLY[chosen]}); use backend='reference' or 'auto' on 16-bit "
                                  "inputs")
    if chosen != "reference":
        warn_pytorch_backward(chosen)  # the eager forward warned already, at the caller's line
    scale = reference.default_softmax_scale(q.shape[-1]) if softmax_scale is None else softmax_scale
    return reference.run_backward(grad_out, grad_lse, q, k, v, causal=causal, softmax_scale=scale,
                                  seqlens_k=seqlens_k)


@reference_backward_op.register_fake
def _reference_backward_fake(grad_out, grad_lse, q, k, v, seqlens_k, causal, softmax_scale, backend):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, causal, softmax_scale, backend = inputs
    ctx.save_for_backward(q, k, v)
    ctx.causal, ctx.softmax_scale, ctx.backend = causal, softmax_scale, backend
    ctx.set_materialize_grads(False)  # an output the loss does not use gets None (``sdpa_backward`` needs to know)


def _backward(ctx, grad_out, grad_lse):
    q, k, v = ctx.saved_tensors
    dq, dk, dv = _backward_of(ctx, grad_out, grad_lse, q, k, v, None)
    return dq, dk, dv, None, None, None


def _backward_of(ctx, grad_out, grad_lse, q, k, v, seqlens_k):
    """(dq, dk, dv) for either op's backward: zeros for an output that got no gradient; eagerly (a Parameter's call,
    and a kernel backend's call that needs a gradient, come here) plain PyTorch ops, which autograd records under
    create_graph, so a second derivative exists; traced, one opaque node (which has no backward of its own). Eagerly
    a loss of out alone (the LSE's gradient None) may take `sdpa_backward` (``FA_VARIANTS_BACKWARD=sdpa``; not
    traced: inside an opaque op autograd records nothing, so SDPA's backward cannot run there)."""
    eager = (type(q) is torch.Tensor or type(q) is torch.nn.Parameter) and not torch.compiler.is_compiling()
    if eager and grad_out is not None and grad_lse is None and seqlens_k is None \
            and sdpa_backward_applies(q, k, ctx.causal, ctx.softmax_scale, ctx.backend):
        return sdpa_backward(grad_out, q, k, v, ctx.causal, ctx.softmax_scale)
    if grad_out is None:
        grad_out = torch.zeros_like(q)
    if grad_lse is None:
        grad_lse = q.new_zeros((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    backward = _reference_backward if eager else reference_backward_op
    return backward(grad_out, grad_lse, q, k, v, seqlens_k, ctx.causal, ctx.softmax_scale, ctx.backend)


attention_op.register_autograd(_backward, setup_context=_setup_context)

#: ``FA_VARIANTS_BACKWARD`` (read at each backward): "pytorch" (default), ``reference.run_backward`` for every
#: gradient; "sdpa", `sdpa_backward` where `sdpa_backward_applies` (an A/B candidate, not yet timed on a GPU)
BACKWARDS = ("pytorch", "sdpa")


def sdpa_backward_applies(q: torch.Tensor, k: torch.Tensor, causal: bool, softmax_scale: float | None,
                          backend: str) -> bool:
    """Whether `sdpa_backward` serves an eager backward whose LSE got no gradient: ``FA_VARIANTS_BACKWARD=sdpa``, no
    create_graph (grad mode off in the backward), a kernel backend with a backward (not the reference, not
    ``registry.FORWARD_ONLY``), 16-bit inputs, keys to attend to, no causal row without a key (seqlen_q <=
    seqlen_k), and 0 < softmax_scale <= 1 (the fused kernels scale after their row max: a negative or large scale
    is left to ``reference.run_backward``, which handles it)."""
    from fa_variants import dispatch, registry
    from fa_variants.common import env

    if env.choice("FA_VARIANTS_BACKWARD", "pytorch", BACKWARDS) != "sdpa":
        return False
    if torch.is_grad_enabled():  # a backward with create_graph: the PyTorch backward's plain ops carry the 2nd one
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or q.numel() == 0 or k.shape[1] == 0:
        return False
    if causal and q.shape[1] > k.shape[1]:
        return False
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    if not 0 < scale <= 1:
        return False
    chosen = dispatch.select_backend(q, k, k, causal=causal, backend=backend).backend
    return chosen != "reference" and chosen not in registry.FORWARD_ONLY


def sdpa_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  softmax_scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of out = attention(q, k, v) for grad_out, by recomputing the forward with PyTorch's
    ``scaled_dot_product_attention`` under autograd (its fused backward: flash, memory-efficient or cuDNN, as PyTorch
    chooses). Layout (batch, seqlen, heads, head_dim) as ``fa_variants.attention``; GQA by repeating each KV head
    over its query heads (autograd sums their gradients back); causal bottom-right through
    ``torch.nn.attention.bias.causal_lower_right`` when seqlen_q != seqlen_k. Only where `sdpa_backward_applies`."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    group = q.shape[2] // k.shape[2]
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        qt, kt, vt = (t.transpose(1, 2) for t in leaves)
        if group > 1:
            kt, vt = kt.repeat_interleave(group, dim=1), vt.repeat_interleave(group, dim=1)
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        mask = causal_lower_right(seqlen_q, seqlen_k) if causal and seqlen_q != seqlen_k else None
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal and mask is None,
                                             scale=softmax_scale)
        return torch.autograd.grad(out.transpose(1, 2), leaves, grad_out)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              softmax_scale: float | None = None, backend: str = "auto", return_lse: bool = False):
    """Kept for older callers: ``fa_variants.attention`` itself (which uses the op while being traced)."""
    return fa_variants.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
                                 return_lse=return_lse)
