"""The public API: validate, choose a backend, run it.

``attention`` takes the flash-attn layout (batch, seqlen, heads, head_dim); ``scaled_dot_product_attention``
takes PyTorch's (batch, heads, seqlen, head_dim) and reaches the same kernels through transposed views (no
copy: the kernels take any strides with a unit last dimension). Every bad input raises before any kernel
launches, with a ValueError or TypeError naming the argument and the values (docs/edge_cases.md, EC-16/17/20).
"""
from __future__ import annotations

import contextlib
import functools
import numbers
import os

import torch

from fa_variants import dispatch, registry
from fa_variants.common import batch_groups, host_values, launch, mask_lengths, mask_windows, split
from fa_variants.common.checks import one_line
from fa_variants.dispatch import Selection
from fa_variants.common.scale import LOG2_E, MAX_SOFTMAX_SCALE, check_softmax_scale  # noqa: F401 (re-exported)
from fa_variants.reference import (check_leftpad_k, check_seqlens_k, check_window_values, default_softmax_scale,
                                   over_row_parts, sequence_windows)
from fa_variants.reference import run as reference_run
from fa_variants.common import switches

# every FA_VARIANTS_* switch, also those only a kernel module's import reads (which the CPU never loads):
# a bad value is a one-line env.SwitchError naming the variable here, at the first use of the API
switches.check_all()

_FLOAT32 = torch.finfo(torch.float32)
_FORWARD_AD = torch.autograd.forward_ad

_LAYOUT = "(batch, seqlen, num_heads, head_dim)"
_SDPA_LAYOUT = "(batch, num_heads, seqlen, head_dim)"


def _check_rank(tensors, names, layout) -> None:
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided or t.is_nested:
            raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}"
                            + (" (nested)" if t.is_nested else ""))
    for name, t in zip(names, tensors):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {layout}, got {t.dim()}-D shape {tuple(t.shape)}: give the "
                             "missing batch or heads dimension as size 1 (unsqueeze), or fold extra leading ones into "
                             "batch (reshape)")


#: where the shapes would fit with seqlen and heads swapped (``_layout_hint``): conditional, since shapes that are
#: wrong in the right layout (heads 4 : 3 with seqlen_q == seqlen_k) can fit swapped too
_ATTENTION_HINT = (f"; attention takes {_LAYOUT}: if these are {_SDPA_LAYOUT}, use "
                   "fa_variants.scaled_dot_product_attention")
_SDPA_HINT = (f"; scaled_dot_product_attention takes {_SDPA_LAYOUT}: if these are {_LAYOUT}, use "
              "fa_variants.attention")


def _shapes_fit(shapes) -> bool:
    """True when 4-D (B, N, H, D) shapes of q, k, v pass the seqlen / head / head_dim rules of _check_inputs."""
    (_, _, heads, d), (_, seqlen_k, heads_kv, dk), (_, seqlen_v, heads_v, dv) = shapes
    return seqlen_k == seqlen_v and heads_kv == heads_v and heads_kv > 0 and heads % heads_kv == 0 and d == dk == dv


def _layout_hint(q, k, v, hint: str) -> str:
    """``hint`` where the inputs would pass the shape rules with seqlen and heads swapped (the other layout's
    tensors), else ''."""
    return hint if _shapes_fit([(t.shape[0], t.shape[2], t.shape[1], t.shape[3]) for t in (q, k, v)]) else ""


# torch.jit.trace records torch's ops only: the kernels' launches would be missing from its recording (a traced
# module replaying an empty output), and it hands out shapes as tensors. torch.compile and torch.export trace our
# calls as custom ops.
_JIT_TRACE_REFUSAL = ("torch.jit.trace cannot record fa_variants attention (its kernels run outside the trace, and "
                      "PyTorch deprecates torch.jit.trace): use torch.compile or torch.export")


def _check_inputs(q, k, v, names=("q", "k", "v"), hint: str = _ATTENTION_HINT) -> None:
    """Shape, dtype and device rules shared by every entry point, on the (B, N, H, D) layout. The seqlen and
    head errors end with ``hint`` (the other layout's entry point) where swapping seqlen and heads would fit.
    RuntimeError while torch.jit.trace records (``_JIT_TRACE_REFUSAL``)."""
    if torch.jit.is_tracing():
        raise RuntimeError(_JIT_TRACE_REFUSAL)
    _check_rank((q, k, v), names, _LAYOUT)
    nq, nk, nv = names
    for name, t in zip(names, (q, k, v)):
        if not t.is_floating_point():
            raise TypeError(f"{name} has dtype {t.dtype}; attention needs a floating-point dtype")
    for name, t in ((nk, k), (nv, v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{nq} has dtype {q.dtype} but {name} has dtype {t.dtype}; they must match")
        if t.device != q.device:
            raise ValueError(f"{nq} is on {q.device} but {name} is on {t.device}; they must be on one device")
    (batch, _, heads, head_dim), (bk, seqlen_k, heads_kv, dk), (bv, seqlen_v, heads_v, dv) = (
        q.shape, k.shape, v.shape)
    for name, b in ((nk, bk), (nv, bv)):
        if b != batch:
            raise ValueError(f"{nq} has batch {batch} but {name} has batch {b}; they must match (a batch of 1 "
                             f"shared by all: {name}.expand)")
    if seqlen_v != seqlen_k:
        raise ValueError(f"{nk} has seqlen {seqlen_k} but {nv} has seqlen {seqlen_v}" + _layout_hint(q, k, v, hint))
    if heads_v != heads_kv:
        raise ValueError(f"{nk} has num_heads_kv {heads_kv} but {nv} has num_heads_kv {heads_v}"
                         + _layout_hint(q, k, v, hint))
    if dk != head_dim:
        raise ValueError(f"{nq} has head_dim {head_dim} but {nk} has head_dim {dk}")
    if dv != head_dim:
        raise ValueError(f"{nv} has head_dim {dv} but {nq} has head_dim {head_dim} "
                         "(a different V head_dim is not supported: torch.nn.functional.scaled_dot_product_attention "
                         "takes one)")
    if head_dim == 0:
        raise ValueError(f"head_dim is 0 ({nq} has shape {tuple(q.shape)}); it must be at least 1")
    if heads_kv == 0 and heads > 0:
        raise ValueError(f"num_heads_kv is 0 ({nk} has shape {tuple(k.shape)}) but num_heads is {heads}; "
                         "need at least one KV head")
    if heads_kv and heads % heads_kv != 0:
        raise ValueError(f"num_heads {heads} not divisible by num_heads_kv {heads_kv}" + _layout_hint(q, k, v, hint))


def _check_options(causal, softmax_scale, backend, return_lse) -> float | None:
    """Checks the keyword arguments; returns the softmax scale as a float (None: the default, 1/sqrt(D))."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {one_line(causal)}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {one_line(return_lse)}")
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {one_line(backend)}")
    if softmax_scale is None:
        return None
    return check_softmax_scale(softmax_scale)


def _kernel_scale(scale: float) -> float:
    """The scale handed to a kernel: one that float32 flushes (|scale * log2 e| below the smallest normal
    float32) becomes 0.0, which every kernel maps to the uniform average. Both give exp(scale * s) == 1 in
    float32 for every finite score; a flushed scale passed as is becomes 0 inside the kernel, where a
    masked score gives -inf * 0 = NaN."""
    return 0.0 if abs(scale) * LOG2_E < _FLOAT32.tiny else scale


def output_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype ``attention`` returns O in for inputs of ``dtype``: theirs, but bfloat16 for 8-bit floats
    (fa3-fp8 takes e4m3 inputs as they are and writes bfloat16)."""
    return torch.bfloat16 if dtype.itemsize == 1 else dtype


def _mqa(k: torch.Tensor, v: torch.Tensor) -> bool:
    """K and V broadcast across their heads (``expand``, stride 0): run as MQA on their first head, no copy."""
    return k.shape[2] > 1 and k.stride(2) == 0 and v.stride(2) == 0


def _needs_copy(t: torch.Tensor) -> bool:
    """Whether a kernel can read t only from a copy (`_unit_last_dim`): a non-unit stride on head_dim, or torch's
    negative bit (``torch._neg_view``: its memory holds -t, which a kernel would read as t)."""
    return t.is_neg() or not (t.stride(-1) == 1 or t.shape[-1] == 1)


def _unit_last_dim(t: torch.Tensor) -> torch.Tensor:
    """t as a kernel can read it (documented in ``attention``): t itself, else a copy (`_needs_copy`)."""
    if t.is_neg():
        t = t.resolve_neg()
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def dispatch_and_run(q, k, v, causal: bool, softmax_scale: float | None, backend: str, want_lse: bool = True):
    """The eager implementation behind ``attention`` (and the custom op ``torch.ops.fa_variants.attention``):
    choose the backend, then run it. Returns (out, lse); with ``want_lse`` False the lse returned may be scratch
    that a later call overwrites (``common.launch.launcher``): the caller must drop it.

    A call's plan (the backend chosen and everything decided by the inputs' kind, `_plan`) is cached under
    `_call_key`; a call of a kind seen before runs its plan directly. A new kind is validated first (with
    ``attention``'s rules) and its plan is stored after its first run has returned outputs of the right
    shapes."""
    key = _call_key(q, k, v, causal, softmax_scale, backend)
    plan = dispatch.PLANS.get(key)  # None for key None
    if plan is not None and not getattr(plan, "autograd", False):  # `_autograd_plan`s are `attention`'s alone
        return plan(q, k, v, want_lse)
    _check_inputs(q, k, v)
    _check_options(causal, softmax_scale, backend, False)
    selection = dispatch.select_backend(q, k, v, causal=causal, backend=backend)
    scale = default_softmax_scale(q.shape[-1]) if softmax_scale is None else softmax_scale
    plan = _plan(selection, q, k, v, causal, scale)
    out, lse = plan(q, k, v, want_lse)
    if out.shape != q.shape or lse.shape != (q.shape[0], q.shape[2], q.shape[1]):
        raise RuntimeError(f"backend {selection.backend} returned out {tuple(out.shape)} and lse "
                           f"{tuple(lse.shape)}; expected {tuple(q.shape)} and {(q.shape[0], q.shape[2], q.shape[1])}")
    dispatch.remember_plan(key, plan)
    return out, lse


def _call_key(q, k, v, causal, softmax_scale, backend) -> tuple | None:
    """What a call's plan depends on: for each of q, k, v its class, shape, strides, dtype, device, base
    pointer modulo 16 bytes (the kernels' alignment), requires_grad and negative bit (``_unit_last_dim``); causal,
    softmax_scale (value and type: 1, 1.0 and True must not share a plan), backend, grad mode and
    ``FA_VARIANTS_BACKEND`` (read for backend "auto" only: a named backend ignores it).
    None (never planned: the call is validated, then planned under its checked values) for arguments that are
    not tensors of a strided layout, and for causal, softmax_scale or backend of any class but bool, float / int /
    None and str (a list or a numpy array is unhashable; a numpy scalar is planned as the float it checks to),
    so that a key always hashes."""
    if causal.__class__ is not bool or backend.__class__ is not str or softmax_scale.__class__ not in _PLAIN_SCALE:
        return None
    try:
        return (q.__class__, q.shape, q.stride(), q.dtype, q.device, q.data_ptr() % 16, q.requires_grad,
                k.__class__, k.shape, k.stride(), k.dtype, k.device, k.data_ptr() % 16, k.requires_grad,
                v.__class__, v.shape, v.stride(), v.dtype, v.device, v.data_ptr() % 16, v.requires_grad,
                causal, softmax_scale.__class__, softmax_scale, backend,  # causal a bool, backend a str (above)
                _grad_mode(), os.environ.get(dispatch.ENV_VAR) if backend == "auto" else None,
                q.is_neg(), k.is_neg(), v.is_neg())
    except (AttributeError, TypeError, RuntimeError, NotImplementedError):  # not a tensor, sparse, nested
        return None


_PLAIN_SCALE = frozenset((float, int, type(None)))  # the softmax_scale classes a plan key holds as they are
_PLAIN_DROPOUT = frozenset((float, int))  # dropout_p classes `scaled_dot_product_attention`'s fast path takes


def _run(selection: Selection, q, k, v, causal: bool, scale: float, config=None):
    """Run the selected backend on validated inputs once (no plan kept); ``config``: the kernel's config."""
    return _plan(selection, q, k, v, causal, scale, config)(q, k, v)


def _plan(selection: Selection, q, k, v, causal: bool, scale: float, config=None):
    """``run(q, k, v, want_lse=True, *extra) -> (out, lse)`` for validated inputs of this kind (`_call_key`; extra:
    (seqlens_k,) for a kernel config that reads them, ``hopper.fa3.lengths_config``; want_lse False:
    the lse may be scratch, ``common.launch.launcher``): empty shortcuts,
    stride normalisation (a non-unit last stride or a negative bit is copied; K/V broadcast across heads run as
    MQA), the backend's launcher (`common.launch.launcher`: checks, compiled kernel and operand decisions made
    here, once). Raises what the backend raises for such inputs, and NotImplementedError for a kernel backend
    with inputs that require grad."""
    batch, seqlen_q, heads, head_dim = q.shape
    variant = dispatch.get_backend(selection.backend)
    if selection.backend == "reference":  # plain PyTorch: handles empty inputs itself, keeps autograd
        return lambda q, k, v, want_lse=True: variant.run(q, k, v, causal=causal, softmax_scale=scale)
    if _wants_grad(q, k, v):  # empty inputs too: no graph
        raise NotImplementedError(_no_backward(selection.backend))
    if q.numel() == 0 or k.shape[1] == 0:  # B, Nq or H is 0, or no key at all: launch nothing
        return functools.partial(launch.empty_outputs, (batch, seqlen_q, heads, head_dim), output_dtype(q.dtype),
                                 q.device)
    copies = tuple(_needs_copy(t) for t in (q, k, v))
    mqa = _mqa(k, v)
    kernel_scale = _kernel_scale(scale)

    def normalise(q, k, v):
        if mqa:  # first: a copy below is then of the one head, not of the broadcast
            k, v = k[:, :, :1], v[:, :, :1]
        if copies[0]:
            q = _unit_last_dim(q)
        if copies[1]:
            k = _unit_last_dim(k)
        if copies[2]:
            v = _unit_last_dim(v)
        return q, k, v

    if variant.runner is None:  # a kernel through common.launch
        kernel = launch.launcher(variant, *normalise(q, k, v), causal=causal, softmax_scale=kernel_scale, config=config)
        if not mqa and not any(copies):  # the common case: the launcher's run is the plan
            return kernel
        return lambda q, k, v, want_lse=True, *extra: kernel(*normalise(q, k, v), want_lse, *extra)
    index = q.device.index if q.is_cuda else None

    def run(q, k, v, want_lse=True):
        with torch.cuda.device(index) if index is not None else contextlib.nullcontext():
            return variant.run(*normalise(q, k, v), causal=causal, softmax_scale=kernel_scale)
    return run


def _wants_grad(q, k, v) -> bool:
    """Whether the call must give a gradient: grad mode on outside inference mode (``torch.enable_grad()`` inside
    ``torch.inference_mode()`` records nothing: SDPA's output has no grad_fn there) and an input that requires grad."""
    return _grad_mode() and (q.requires_grad or k.requires_grad or v.requires_grad)


def _grad_mode() -> bool:
    """Grad mode as autograd records it: on and not in inference mode."""
    return torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def _no_backward(backend: str) -> str:
    """The one-line reason a call that needs a gradient cannot run on ``backend`` (``registry.FORWARD_ONLY``)."""
    why = f" ({registry.FORWARD_ONLY[backend]})" if backend in registry.FORWARD_ONLY else ""
    return (f"backend {backend} is forward-only and an input requires grad{why}: call it under torch.no_grad() / "
            "torch.inference_mode(), or use backend='reference' for autograd")


def _kernel_autograd(q, k, v, causal: bool, backend: str) -> bool:
    """True for a call that needs a gradient (grad mode on, an input requiring grad) on a kernel backend that has
    one: the call then goes through the custom op's autograd (eagerly `custom_op.EagerAttention`, the op's body and
    backward without its dispatcher), whose forward runs the kernel and whose backward is
    ``integrations.backward.kernel_backward`` (warned once, here at the caller's line). False for the
    reference backend (plain autograd) and for ``registry.FORWARD_ONLY`` backends (``_plan`` refuses them in one
    line)."""
    if not _wants_grad(q, k, v):
        return False
    chosen = dispatch.select_backend(q, k, v, causal=causal, backend=backend).backend
    if chosen == "reference" or chosen in registry.FORWARD_ONLY:
        return False
    _backward.warn_pytorch_backward(chosen)
    return True


def _autograd_plan(causal: bool, scale: float | None, backend: str):
    """The plan of an eager kernel call that needs a gradient (`_kernel_autograd`): `_eager_autograd`, which always
    computes the LSE (the backward reads it), so ``want_lse`` is ignored. Kept under the call's key (which holds grad
    mode and requires_grad), the next such call skips validation and the backend choice as a no-grad call does (~10
    us of host time on the CPU); marked ``autograd`` so that `dispatch_and_run` never runs it as a kernel plan.
    ``backend``: the one chosen for the call (not "auto"), so that each step's backward keeps it without choosing
    again (``custom_op._forward_backend``)."""
    def run(q, k, v, want_lse=True):
        return _eager_autograd(q, k, v, causal, scale, backend)
    run.autograd = True
    return run


def _eager_autograd(q, k, v, causal: bool, scale: float | None, backend: str):
    """An eager call through the custom op's autograd: ``custom_op.EagerAttention`` (the op's body and backward
    without its dispatcher round trip), or the op itself while a TorchDispatchMode is active (selective activation
    checkpointing's policies and ``make_fx`` see the call as one ``fa_variants.attention`` node, as traced calls)."""
    if torch._C._len_torch_dispatch_stack():
        return torch.ops.fa_variants.attention(q, k, v, causal, scale, backend)
    return _custom_op.EagerAttention.apply(q, k, v, causal, scale, backend)


def _transform(q, k, v) -> str | None:
    """What a kernel launch would silently drop: an active torch.func transform (its wrapped tensors' batch
    dimensions and tangents are not the kernel's memory, and the custom op's autograd is not a torch.func one), or
    an input carrying a forward-mode tangent (``torch.autograd.forward_ad``); None for neither."""
    if torch._C._are_functorch_transforms_active():
        return "torch.func transforms (grad, vmap, jvp, jacrev, jacfwd, ...)"
    if _FORWARD_AD._current_level >= 0 and any(_FORWARD_AD.unpack_dual(t).tangent is not None for t in (q, k, v)):
        return "forward-mode AD (torch.autograd.forward_ad)"
    return None


def _traced_under_transforms(q, k, v, causal: bool, scale: float | None, backend: str, seqlens_k, num_splits,
                             pack_gqa, leftpad_k=None, seqlens_q=None):
    """A call that torch.compile traces inside torch.func transforms (``torch.compile(torch.func.grad(f))``: grad,
    vjp, jacrev, vmap, ...). The custom ops cannot serve there (PyTorch runs a custom op's autograd as an
    autograd.Function without torch.func support, and refuses it under a transform), so the reference backend's
    plain PyTorch is traced in their place, as an eager call under transforms runs it. The backend is resolved without
    the dispatcher (which tracing cannot enter): the name given, else FA_VARIANTS_BACKEND, else the reference for
    inputs not on a CUDA device. Raises NotImplementedError, as eagerly (`_check_transforms`), for a kernel backend,
    for backend "auto" on a CUDA device (name backend="reference"), and for seqlens_k / num_splits / pack_gqa."""
    name = backend if backend != "auto" else dispatch.env_override() or (None if q.is_cuda else "reference")
    if name != "reference":
        raise NotImplementedError(f"backend {name or 'auto'} on {q.device.type} inside torch.func transforms under "
                                  "torch.compile: only backend='reference' runs there (plain PyTorch); name it")
    if any(x is not None for x in (seqlens_k, leftpad_k, seqlens_q, num_splits, pack_gqa)):
        raise NotImplementedError("seqlens_k, leftpad_k, seqlens_q, num_splits and pack_gqa are not supported inside "
                                  "torch.func transforms under torch.compile; run the call eagerly")
    return reference_run(q, k, v, causal=causal,
                         softmax_scale=default_softmax_scale(q.shape[-1]) if scale is None else scale)


def _check_transforms(q, k, v, causal: bool, backend: str) -> None:
    """A kernel backend under `_transform` raises NotImplementedError in one line (it used to run, returning a zero
    tangent or a wrong batch without a word); the reference backend is plain PyTorch and serves them all."""
    transform = _transform(q, k, v)
    if transform is None:
        return
    chosen = dispatch.select_backend(q, k, v, causal=causal, backend=backend).backend
    if chosen != "reference":
        raise NotImplementedError(f"backend {chosen} does not support {transform}: use torch.autograd's backward, "
                                  "or backend='reference' under them")


def _with_seqlens_k(q, k, v, causal: bool, scale: float | None, backend: str, seqlens_k: torch.Tensor | None,
                    tracing: bool, leftpad_k: torch.Tensor | None = None, seqlens_q: torch.Tensor | None = None):
    """attention with per-sequence KV lengths (and first keys, ``leftpad_k``, and query counts, ``seqlens_q``:
    seqlens_k None is every sequence's seqlen_k then): fa3 and fa2 read them in their kernels (one launch for the
    batch, no host read-back: CUDA-graph capturable; the plan kept per call kind as `dispatch_and_run` keeps one);
    the reference reads them itself; fa1 and fa3-fp8 run once per distinct window on the sequences of that window and
    k, v cut to it (the tensors read back: not under CUDA-graph capture)."""
    if seqlens_q is not None:  # checked first: a call given seqlens_q alone has its errors name it
        check_seqlens_k(seqlens_q, q.shape[0], q.shape[1], q.device, values=False, host_ok=True, name="seqlens_q")
    if seqlens_k is None:
        seqlens_k = _full_ends(q, k, leftpad_k, seqlens_q)
    # traced (torch.compile, or export's fake / functional tensors), or a kernel backend's call that needs a gradient
    # (`_kernel_autograd`): one opaque node (integrations.custom_op; its backward integrations.backward's, length by
    # length) whose body is `run_seqlens_k`, the values checked when it runs; an eager reference call keeps plain
    # autograd
    if tracing or _kernel_autograd(q, k, v, causal, backend):
        check_seqlens_k(seqlens_k, q.shape[0], k.shape[1], q.device, values=False, host_ok=True)
        if leftpad_k is not None:
            check_leftpad_k(leftpad_k, seqlens_k, q.shape[0], k.shape[1], q.device, values=False, host_ok=True)
        if seqlens_q is None:  # (the op's schema before seqlens_q: graphs traced then still match)
            return torch.ops.fa_variants.attention_seqlens_k(q, k, v, seqlens_k, causal, scale, backend, leftpad_k)
        return torch.ops.fa_variants.attention_seqlens_k(q, k, v, seqlens_k, causal, scale, backend, leftpad_k,
                                                         seqlens_q)
    return run_seqlens_k(q, k, v, causal, scale, backend, seqlens_k, checked=True, leftpad_k=leftpad_k,
                         seqlens_q=seqlens_q)


def _full_ends(q, k, leftpad_k, seqlens_q=None) -> torch.Tensor:
    """seqlens_k for a call with leftpad_k or seqlens_q alone: each sequence's keys run to seqlen_k (int32 (batch,),
    on the device of the tensor given, which is checked first: its errors name it)."""
    if leftpad_k is not None:
        check_seqlens_k(leftpad_k, q.shape[0], k.shape[1], q.device, values=False, host_ok=True, name="leftpad_k")
    given = leftpad_k if leftpad_k is not None else seqlens_q
    return torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device=given.device)


def _check_lengths(q, k, seqlens_k, name: str = "seqlens_k", values: bool = True) -> tuple[torch.Tensor, bool]:
    """``check_seqlens_k`` of an eager call: the values too, except inside CUDA-graph capture (where the kernels that
    read the lengths clamp them). Lengths on the CPU for a CUDA q are checked on the host (no device sync) and copied
    to q's device without waiting for the GPU (from a pageable copy made here: the caller may change its tensor
    right after the call); refused inside capture. Returns (the lengths on q's device, whether capturing). Lengths
    with torch's negative bit are resolved first (a kernel reads memory, which holds their negation). ``name``: the
    argument checked (``leftpad_k``'s first keys are checked the same way, `_check_windows`); ``values`` False: the
    values of a tensor on q's device are left to the caller (`_check_windows` reads two tensors' at once)."""
    if isinstance(seqlens_k, torch.Tensor) and seqlens_k.is_neg():
        seqlens_k = seqlens_k.resolve_neg()
    capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
    limit = q.shape[1] if name == "seqlens_q" else k.shape[1]  # (the query counts are bounded by seqlen_q)
    if q.is_cuda and isinstance(seqlens_k, torch.Tensor) and seqlens_k.device.type == "cpu":
        if capturing:
            raise ValueError(f"{name} is on the CPU inside CUDA-graph capture: pass it on q's device (each replay "
                             "reads its current values there)")
        check_seqlens_k(seqlens_k, q.shape[0], limit, seqlens_k.device, name=name)
        staged = torch.empty(seqlens_k.shape, dtype=seqlens_k.dtype).copy_(seqlens_k)  # pageable, contiguous
        return staged.to(q.device, non_blocking=True), False
    check_seqlens_k(seqlens_k, q.shape[0], limit, q.device, values=values and not capturing, name=name)
    return seqlens_k, capturing


def _check_windows(q, k, seqlens_k, leftpad_k, seqlens_q=None) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                         torch.Tensor | None, bool]:
    """`_check_lengths` of seqlens_k and of leftpad_k and seqlens_q (when given), and that no first key is past its
    sequence's end (the values of all read back at once, one device sync, as the lengths alone are: not inside
    CUDA-graph capture, where the kernels clamp each value). Returns (seqlens_k, leftpad_k, seqlens_q, capturing),
    all on q's device."""
    given = [t for t in (seqlens_k, leftpad_k, seqlens_q) if t is not None]
    on_host = q.is_cuda and all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in given)
    if on_host:  # all on the CPU (``windowed``'s): their values checked there, before the copies (no device sync)
        check_seqlens_k(seqlens_k, q.shape[0], k.shape[1], q.device, values=False, host_ok=True)
        if leftpad_k is not None:
            check_seqlens_k(leftpad_k, q.shape[0], k.shape[1], q.device, values=False, host_ok=True, name="leftpad_k")
        if seqlens_q is not None:
            check_seqlens_k(seqlens_q, q.shape[0], q.shape[1], q.device, values=False, host_ok=True, name="seqlens_q")
        check_window_values(seqlens_k, leftpad_k, seqlens_q, q.shape[0], k.shape[1], q.shape[1])
    alone = leftpad_k is None and seqlens_q is None
    if seqlens_q is not None:  # first: a call given one of these alone has its errors name it (its ends made here)
        seqlens_q, _ = _check_lengths(q, k, seqlens_q, "seqlens_q", values=False)
    if leftpad_k is not None:
        leftpad_k, _ = _check_lengths(q, k, leftpad_k, "leftpad_k", values=False)
    seqlens_k, capturing = _check_lengths(q, k, seqlens_k, values=alone)
    if not alone and not capturing and not on_host:
        check_window_values(seqlens_k, leftpad_k, seqlens_q, q.shape[0], k.shape[1], q.shape[1])
    return seqlens_k, leftpad_k, seqlens_q, capturing


def _window_tensors(seqlens_k, leftpad_k, seqlens_q) -> tuple[torch.Tensor, ...]:
    """The tensors a lengths plan's kernel takes after want_lse (`_lengths_plan`): seqlens_k, then leftpad_k where
    given or seqlens_q is (zeros then: each window from key 0), then seqlens_q where given; contiguous."""
    if seqlens_q is not None and leftpad_k is None:
        leftpad_k = torch.zeros_like(seqlens_k)
    return tuple(t.contiguous() for t in (seqlens_k, leftpad_k, seqlens_q) if t is not None)


def _kernel_module(backend: str):
    """The module of a kernel backend that takes ``num_splits`` / ``pack_gqa`` and reads ``seqlens_k`` in its kernel
    (``decode_config``, ``lengths_config``): fa3 or fa2; None for the others."""
    if backend == "fa3":
        from fa_variants.hopper import fa3 as module
    elif backend == "fa2":
        from fa_variants.ampere import fa2 as module
    else:
        return None
    return module


def _lengths_plan(selection: Selection, module, q, k, v, causal: bool, scale: float, windows: tuple, config=None):
    """`_plan` on the config maker of ``module`` that reads ``windows`` (`_window_tensors`: seqlens_k alone, its
    ``lengths_config``; with leftpad_k, ``leftpad_config``; with seqlens_q too, ``windows_config``), of ``config``,
    else of `auto`'s choice: its run takes those tensors after want_lse. The config is made only when there is
    something to launch (`_plan`'s empty shortcuts and forward-only check come first)."""
    launches = q.numel() and k.shape[1] and not _wants_grad(q, k, v)
    if not launches:
        return _plan(selection, q, k, v, causal, scale)
    kv = _config_k(k, v)  # a split whose partial LSE could overflow is no split (``scale_config``)
    window = getattr(module, ("lengths_config", "leftpad_config", "windows_config")[len(windows) - 1])
    config = window(q, kv, causal, module.scale_config(config, q, kv, causal, scale))
    return _plan(selection, q, k, v, causal, scale, config)


def _config_k(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """k as the kernel will see it, for choosing its config: one KV head when K/V are broadcast (``_mqa``:
    ``_plan`` launches on that head, so a packed config must be made for the whole group)."""
    return k[:, :, :1] if _mqa(k, v) else k


def run_seqlens_k(q, k, v, causal: bool, scale: float | None, backend: str, seqlens_k: torch.Tensor, *,
                  checked: bool = False, leftpad_k: torch.Tensor | None = None,
                  seqlens_q: torch.Tensor | None = None):
    """`_with_seqlens_k` on plain tensors, eagerly (the body of ``torch.ops.fa_variants.attention_seqlens_k``). A
    call of a kind not planned yet is validated first with ``attention``'s rules, as `dispatch_and_run` validates:
    a direct call of the op has not been (it ran mixed dtypes, a V of another head_dim, and out-of-range scales);
    ``checked``: ``attention`` validated them already. ``leftpad_k``: each sequence's first key too; ``seqlens_q``:
    each sequence's query count (its causal diagonal aligned to it; fa1 and fa3-fp8 run each window's rows in two
    calls, ``reference.row_parts``)."""
    key = _call_key(q, k, v, causal, scale, backend)
    kind = "seqlens_q" if seqlens_q is not None else "seqlens_k" if leftpad_k is None else "leftpad_k"
    key = None if key is None else (kind, key)
    entry = dispatch.PLANS.get(key)  # (plan, the kernel module's switch state it was made under)
    if entry is None and not checked:
        _check_inputs(q, k, v)
        _check_options(causal, scale, backend, False)
    seqlens_k, leftpad_k, seqlens_q, capturing = _check_windows(q, k, seqlens_k, leftpad_k, seqlens_q)
    if not causal and seqlens_q is not None:  # checked, then dropped: it moves only the causal diagonal
        seqlens_q = None
        key = None if key is None else ("seqlens_k" if leftpad_k is None else "leftpad_k", key[1])
        entry = dispatch.PLANS.get(key)
    windows = _window_tensors(seqlens_k, leftpad_k, seqlens_q)
    if entry is not None and entry[1] == entry[2]():  # a switch flipped since: chosen again, as `launcher` does
        return entry[0](q, k, v, True, *windows)
    selection = dispatch.select_backend(q, k, v, causal=causal, backend=backend)
    scale = default_softmax_scale(q.shape[-1]) if scale is None else scale
    module = _kernel_module(selection.backend)
    if module is not None:  # the kernel reads the lengths
        switches = module.VARIANT.switches
        state = switches()
        plan = _lengths_plan(selection, module, q, k, v, causal, scale, windows)
        out, lse = plan(q, k, v, True, *windows)
        dispatch.remember_plan(key, (plan, state, switches))
        return out, lse
    if capturing:
        raise NotImplementedError(f"seqlens_k / leftpad_k / seqlens_q under CUDA-graph capture needs the fa3 or fa2 "
                                  f"backend (their kernels read them); this call runs on {selection.backend}, which "
                                  "reads them back")
    if selection.backend == "reference":
        return reference_run(q, k, v, causal=causal, softmax_scale=scale, seqlens_k=seqlens_k, leftpad_k=leftpad_k,
                             seqlens_q=seqlens_q)
    return _run_per_window(selection, q, k, v, causal, scale, seqlens_k, leftpad_k, seqlens_q)


def _run_per_window(selection: Selection, q, k, v, causal: bool, scale: float, seqlens_k, leftpad_k, seqlens_q):
    """A windowed call on a backend that does not read the windows (fa1, fa3-fp8): the sequences of each distinct
    window together, K and V cut to its keys, its rows in one call or two (``reference.row_parts``: with seqlens_q,
    the causal rows then the padding rows that see the whole window); the windows read on the host."""
    batch, seqlen_q, heads, head_dim = q.shape
    out = torch.empty(batch, seqlen_q, heads, head_dim, dtype=output_dtype(q.dtype), device=q.device)
    lse = torch.empty(batch, heads, seqlen_q, dtype=torch.float32, device=q.device)
    windows = sequence_windows(seqlens_k, leftpad_k, seqlens_q if causal else None, batch, k.shape[1], seqlen_q)
    for (start, end, count), index in batch_groups.by_value(windows, q.device, ascending=True):
        keys = slice(start, end)
        qg, kg, vg = (t if index is None else batch_groups.take(t, index) for t in (q, k[:, keys], v[:, keys]))
        o, l = over_row_parts(count, seqlen_q, causal,
                              lambda rows, part_causal: _run(selection, qg[:, rows], kg, vg, part_causal, scale))
        if index is None:  # one window for all: views, no copy
            return o, l
        out.index_copy_(0, index, o)
        lse.index_copy_(0, index, l)
    return out, lse


def _with_split_options(q, k, v, causal: bool, scale: float | None, backend: str, num_splits, pack_gqa, seqlens_k,
                        tracing: bool, leftpad_k=None, seqlens_q=None):
    """attention with the split count / GQA packing (fa3, fa2) fixed by the caller (no plan kept); with seqlens_k
    the kernel reads the lengths (``lengths_config`` of that config; with leftpad_k too, ``leftpad_config``; with
    seqlens_q, ``windows_config``)."""
    num_splits = split.check_options(num_splits, pack_gqa)
    if tracing:
        raise NotImplementedError("num_splits / pack_gqa are not supported under tracing (torch.compile, torch.export) "
                                  "or for tensor subclasses yet: pass plain tensors eagerly")
    if seqlens_q is not None:
        check_seqlens_k(seqlens_q, q.shape[0], q.shape[1], q.device, values=False, host_ok=True, name="seqlens_q")
    if (leftpad_k is not None or seqlens_q is not None) and seqlens_k is None:
        seqlens_k = _full_ends(q, k, leftpad_k, seqlens_q)
    if seqlens_k is not None:
        seqlens_k, leftpad_k, seqlens_q, _ = _check_windows(q, k, seqlens_k, leftpad_k, seqlens_q)
        seqlens_q = seqlens_q if causal else None  # (it moves only the causal diagonal)
    selection = dispatch.select_backend(q, k, v, causal=causal, backend=backend)
    module = _kernel_module(selection.backend)
    if module is None:
        raise ValueError(f"num_splits / pack_gqa apply to the fa3 and fa2 backends only; this call runs on "
                         f"{selection.backend}")
    if _wants_grad(q, k, v):
        raise NotImplementedError("num_splits / pack_gqa are inference options and an input requires grad: call "
                                  "under torch.no_grad() / torch.inference_mode(), or leave them None for autograd")
    scale = default_softmax_scale(q.shape[-1]) if scale is None else scale
    split.check_split_scale(num_splits, scale)
    if num_splits is None and not split.splits_allowed(scale):
        num_splits = 1
    config = module.decode_config(q, _config_k(k, v), causal, num_splits=num_splits, pack_gqa=pack_gqa)
    if seqlens_k is None:
        return _run(selection, q, k, v, causal, scale, config)
    windows = _window_tensors(seqlens_k, leftpad_k, seqlens_q)
    return _lengths_plan(selection, module, q, k, v, causal, scale, windows, config)(q, k, v, True, *windows)


def _parameter_call(q, k, v) -> bool:
    """An eager nn.Parameter q (not under tracing, which `_tracing` covers): with grad mode on its call goes
    through the custom op's autograd (`_eager_autograd`). Not under torch.func transforms (grad, vmap, ...) nor for
    inputs carrying a forward-mode tangent (`_transform`), whose autograd is not the op's (it has no jvp: "You must
    implement the jvp function" from torch, for a tangent on k or v): the plain path serves them (the reference
    backend's autograd; a kernel backend there has refused in one line, `_check_transforms`)."""
    return isinstance(q, torch.nn.Parameter) and _transform(q, k, v) is None


def _tracing(q, compiling: bool) -> bool:
    """True while torch.compile / torch.export trace the call (``compiling``: torch.compiler.is_compiling() read in
    the caller's frame, the one that acts on the answer) or for their fake / functional tensors (any q of a class
    other than torch.Tensor); an eager Parameter is not traced (``_parameter_call`` sends it through the custom op's
    autograd)."""
    return compiling or (type(q) is not torch.Tensor and not isinstance(q, torch.nn.Parameter)) or _proxy_tracing()


def _proxy_tracing() -> bool:
    """True under make_fx (a proxy dispatch mode records the call), also in its "real" mode, whose tensors are real
    ones: there the plain path's reads of values on the host stop it, and a kernel's launch would be missing from
    the recording; the custom op is one node."""
    return torch._C._get_dispatch_mode(_PROXY_MODE) is not None


_PROXY_MODE = torch._C._TorchDispatchModeKey.PROXY


def _autocast_available(device_type: str) -> bool:
    """``torch.amp.is_autocast_available``, read by torch.compile as a constant of the trace: dynamo before torch
    2.13 cannot trace the C function under it, so every compiled call on a CPU tensor failed there (fullgraph) or
    broke its graph (session 47, torch 2.11)."""
    return torch.amp.is_autocast_available(device_type)


# torch.compiler.assume_constant_result's mark, set by hand: the decorator imports torch._dynamo (1.5-3 s, with
# sympy), which made every process's first attention call that much slower (session 49: 3.3 s against issue 13's
# 1 s budget). tests/test_api.py checks that the mark is the decorator's.
_autocast_available._dynamo_marked_constant = True


def autocast_device(q) -> str | None:
    """The device type whose ``torch.autocast`` is on for q's device, or None (also for a non-tensor q: the
    validation names it)."""
    if isinstance(q, torch.Tensor):
        device_type = "cuda" if q.is_cuda else q.device.type  # is_cuda: the per-call path's cheap test (~0.2 us)
        if (device_type == "cuda" or _autocast_available(device_type)) \
                and torch.is_autocast_enabled(device_type):
            return device_type
    return None


def autocast_cast(device_type: str, *tensors):
    """The tensors as ``torch.autocast`` casts SDPA's inputs: each floating tensor other than float64 (and 8-bit
    floats, already quantised) to the autocast dtype of ``device_type``; anything else unchanged."""
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                 and t.dtype.itemsize > 1 else t for t in tensors)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              softmax_scale: float | None = None, backend: str = "auto", return_lse: bool = False,
              seqlens_k: torch.Tensor | None = None, num_splits: int | None = None, pack_gqa: bool | None = None,
              leftpad_k: torch.Tensor | None = None, seqlens_q: torch.Tensor | None = None):
    """Attention forward, O = softmax(softmax_scale * Q K^T) V, on the backend that suits the GPU.

    Args:
        q: (batch, seqlen_q, num_heads, head_dim), float16 or bfloat16 for the kernels (float32/float64 on
            the ``reference`` backend; 8-bit floats on ``fa3-fp8``); CUDA for the kernels, any device for
            ``reference``. Any strides; a tensor whose last dimension is not unit-stride is copied first.
        k, v: (batch, seqlen_k, num_heads_kv, head_dim), same dtype and device as q. num_heads must be a
            multiple of num_heads_kv (GQA/MQA: query head h reads KV head h // (num_heads // num_heads_kv)).
            K/V broadcast across heads with stride 0 (``expand``) run as MQA, without a copy.
        causal: bottom-right aligned causal mask: query i sees key j iff j <= i + seqlen_k - seqlen_q
            (flash-attn >= 2.1). A query row that sees no key gives 0 and LSE -inf.
        softmax_scale: any finite real (0, negative and ints are fine) with |softmax_scale| <=
            ``MAX_SOFTMAX_SCALE`` (about 2.36e38: float32 max / log2 e); None means 1 / sqrt(head_dim).
            On the kernels, a scale too small for float32 (|scale| log2 e < 1.2e-38) runs as 0. A numpy scalar
            is taken eagerly (as by SDPA); traced by torch.compile it is refused with a TypeError (pass a Python
            float), which ``fullgraph=True`` reports as ``torch._dynamo.exc.Unsupported`` and a plain
            ``torch.compile`` answers by running the call eagerly.
        backend: "auto" (see ``fa_variants.dispatch``; env FA_VARIANTS_BACKEND overrides auto), or one of
            "fa3", "fa3-fp8", "fa2", "fa1", "reference".
        return_lse: also return the log-sum-exp of each query row.
        seqlens_k: optional int32 (batch,) tensor on q's device (for CUDA inputs also on the CPU), per-sequence KV
            lengths for a KV cache padded to seqlen_k: sequence b attends to its first seqlens_k[b] keys only (causal
            bottom-right against that length); keys past it are never used. 0 <= seqlens_k[b] <= seqlen_k (checked:
            on q's device by reading the tensor back, one device sync per call, skipped during CUDA-graph capture; on
            the CPU on the host, then copied over without a sync: not inside capture).
            Semantics: ``reference.attention_reference``. fa3 and fa2 read it in their kernels (one launch, the
            cache past a length may hold NaN; capturable in a CUDA graph, the kernel clamping each value to [0,
            seqlen_k]); fa1 runs one call per distinct length on k[:, :length] (not inside capture). Under
            torch.compile: the op ``torch.ops.fa_variants.attention_seqlens_k`` (its backward as below, Gradients).
        leftpad_k: optional int32 tensor like seqlens_k, each sequence's first key, for a KV cache padded on the left
            (a left-padded prompt batch and its generation; flash-attn's ``leftpad_k``): sequence b attends to keys
            [leftpad_k[b], seqlens_k[b]) (seqlens_k None: [leftpad_k[b], seqlen_k)), causal bottom-right against
            their count, as if k, v were k[b, leftpad_k[b]:seqlens_k[b]]; keys outside are never used. 0 <=
            leftpad_k[b] <= its end (checked as seqlens_k is). fa3 and fa2 read it in their kernels (one launch;
            capturable, each value clamped to [0, its end]); fa1 and fa3-fp8 run one call per distinct window.
        seqlens_q: optional int32 tensor like seqlens_k, each sequence's query count, for a causal batch padded on
            the right, queries and keys alike (a padded training batch: seqlens_q = seqlens_k = the lengths;
            flash-attn's ``seqused_q``): sequence b's causal diagonal is bottom-right against seqlens_q[b] and its
            key count n, query i seeing key j of its window iff j <= i + n - seqlens_q[b]. Its padding rows (from
            seqlens_q[b] on) see the whole window, as under a causal mask with padding (transformers', SDPA's), and
            are computed (a caller's loss ignores them). No effect without causal. 0 <= seqlens_q[b] <= seqlen_q
            (checked with the others, in the same read). fa3 and fa2 read it in their kernels (one launch;
            capturable, each value clamped to [0, seqlen_q]); fa1 and fa3-fp8 run each distinct window's rows in
            two calls (``reference.row_parts``).
        num_splits, pack_gqa: the split-KV count (an int >= 1; 1: no split) and packed GQA (fa3: any group at
            seqlen_q = 1; at seqlen_q > 1 a group G = num_heads / num_heads_kv dividing 64 or a multiple of it;
            fa2: seqlen_q = 1 only; else ValueError) for this call, instead of the choice `auto` makes (None).
            Only on the fa3 and fa2 backends (ValueError on others), eagerly (seqlens_k too: read by the kernel)
            (``hopper.fa3.decode_config``, ``ampere.fa2.decode_config``; ``common.split``; ``common.pack_gqa``).
            Above |softmax_scale| = 2^64 (``common.split.MAX_SPLIT_SCALE``) no call splits: `auto` runs unsplit and
            num_splits > 1 raises ValueError (a split's partial LSE could overflow float32).

    Returns:
        out (batch, seqlen_q, num_heads, head_dim) in q's dtype (bfloat16 for e4m3 inputs: ``output_dtype``),
        a new tensor; with ``return_lse`` the pair
        (out, lse), lse float32 (batch, num_heads, seqlen_q), natural log. batch, seqlen_q or num_heads of 0
        give empty outputs and seqlen_k = 0 gives zeros (LSE -inf), without launching a kernel (on the
        reference backend they stay connected to the inputs for autograd, with zero gradients).

    Gradients: with grad mode on and an input that requires grad, a kernel backend's call runs its forward kernel
    through the custom op's autograd (eagerly without the op's dispatcher), whose backward is PyTorch's
    (``integrations.backward.kernel_backward``: by default cuDNN's fused attention backward on the forward's O and
    LSE, eager and traced, else PyTorch's FlashAttention-2 backward kernel on them, where the loss uses O alone
    (``FA_VARIANTS_BACKWARD``); else
    ``reference.run_backward``, the gradient of exact attention in float32 PyTorch, query rows in memory-bounded
    chunks; no backward kernel of its own: it warns once per backend, a ``dispatch.BackendFallbackWarning``); the
    reference backend keeps plain autograd. fa3-fp8 and the num_splits /
    pack_gqa options are forward only (NotImplementedError at the call; for fa3-fp8 under torch.compile or with an
    nn.Parameter q, which take the op's autograd, when the backward runs). Under ``torch.inference_mode()`` nothing
    is recorded, ``torch.enable_grad()`` inside it too (as SDPA). Under torch.func transforms (grad, vmap, jvp,
    ...) and forward-mode AD (``torch.autograd.forward_ad``) only the reference backend runs; a kernel backend raises
    NotImplementedError at the call. Source: Dao et al., FlashAttention (2022),
    Appendix B.2; Dao, FlashAttention-2 (2023), Algorithm 2.

    Non-finite values: an inf or NaN in Q, K or V at a position a row sees makes that row non-finite, as the
    maths does. At a key a causal row cannot see, V = inf/NaN contributes exactly 0 on the ``reference``
    backend, but on the kernels (fa1, fa2, fa3) it makes the rows of the same query tile that do not see
    it NaN too: inside a tile a masked score gives P = 0 and 0 * inf = NaN in P V. Keep V finite (or mask
    by zeroing V) when using the kernels. A K = inf at a hidden key is harmless everywhere.

    torch.autocast: as SDPA under autocast, floating q, k, v other than float64 (and 8-bit floats) are cast to the
    autocast dtype of their device first, and the call runs with autocast off inside, so out comes in that dtype
    (e.g. a Hugging Face model under bf16 autocast, whose rotary embedding leaves Q and K float32 and V bf16).

    torch.compile / torch.export: traceable with ``fullgraph=True`` and dynamic shapes (CUDA graphs with
    ``mode="reduce-overhead"`` too): validation is plain Python that Dynamo traces, and the backend choice
    and launch happen inside the custom op ``torch.ops.fa_variants.attention`` (``integrations.custom_op``),
    one opaque node of the graph. Autograd, eagerly and under torch.compile: see Gradients below.

    Raises:
        TypeError: a non-tensor input, a non-floating or mismatched dtype, a non-bool flag, a non-real scale.
        ValueError: wrong rank; batch, seqlen_k, num_heads_kv or head_dim mismatch; a seqlens_k or leftpad_k value
            outside [0, seqlen_k], a seqlens_q value outside [0, seqlen_q] or a leftpad_k past its sequence's end,
            or any of them of the wrong shape or device
            (TypeError: not an int32 tensor); num_heads not a multiple
            of num_heads_kv; head_dim 0; num_heads_kv 0; inputs on different devices; non-finite
            or out-of-range softmax_scale; num_splits > 1 with |softmax_scale| above 2^64; an unknown backend; a
            backend that cannot serve the call
            (``dispatch.BackendUnavailableError``, naming the backends that can).
        NotImplementedError: inputs that require grad on fa3-fp8 (``registry.FORWARD_ONLY``) or with num_splits /
            pack_gqa; seqlens_k / leftpad_k / seqlens_q inside CUDA-graph capture on a backend other than fa3 and fa2;
            any of them
            batched by torch.func.vmap.

    Sources: Dao et al., FlashAttention (2022), Algorithm 1; Dao, FlashAttention-2 (2023), Algorithm 1;
    Shah et al., FlashAttention-3 (2024).
    """
    device_type = autocast_device(q)
    if device_type is not None:  # the inputs as autocast casts SDPA's, then the call without autocast
        q, k, v = autocast_cast(device_type, q, k, v)
        with torch.autocast(device_type, enabled=False):
            return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
                             return_lse=return_lse, seqlens_k=seqlens_k, num_splits=num_splits, pack_gqa=pack_gqa,
                             leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    if seqlens_k is None and num_splits is None and pack_gqa is None and leftpad_k is None and seqlens_q is None:
        result = _planned(q, k, v, causal, softmax_scale, backend, return_lse)
        if result is not None:
            return result
    _check_inputs(q, k, v)
    scale = _check_options(causal, softmax_scale, backend, return_lse)
    # read in this frame, which acts on it: a helper's own frame can be compiled alone while this one runs eagerly
    # (torch.compile over a call it will not trace, a forward-mode dual input), where is_compiling() is baked True
    compiling = torch.compiler.is_compiling()
    tracing = _tracing(q, compiling)
    if not compiling:
        _check_transforms(q, k, v, causal, backend)
        # a tensor subclass carrying a tangent, or under torch.func transforms: the op has no forward-mode rule and
        # no torch.func support, so the plain path serves it (the reference backend's own autograd)
        tracing = tracing and _transform(q, k, v) is None
    if tracing and torch._C._are_functorch_transforms_active():
        out, lse = _traced_under_transforms(q, k, v, causal, scale, backend, seqlens_k, num_splits, pack_gqa,
                                            leftpad_k, seqlens_q)
    elif num_splits is not None or pack_gqa is not None:
        out, lse = _with_split_options(q, k, v, causal, scale, backend, num_splits, pack_gqa, seqlens_k, tracing,
                                       leftpad_k, seqlens_q)
    elif seqlens_k is not None or leftpad_k is not None or seqlens_q is not None:
        out, lse = _with_seqlens_k(q, k, v, causal, scale, backend, seqlens_k, tracing, leftpad_k, seqlens_q)
    elif tracing:
        out, lse = torch.ops.fa_variants.attention(q, k, v, causal, scale, backend)
    elif _kernel_autograd(q, k, v, causal, backend):  # planned: its next call takes the fast path above
        chosen = dispatch.select_backend(q, k, v, causal=causal, backend=backend).backend
        plan = _autograd_plan(causal, scale, chosen)
        out, lse = plan(q, k, v)
        if q.__class__ is torch.Tensor:  # what the fast path serves (not a Parameter)
            dispatch.remember_plan(_call_key(q, k, v, causal, softmax_scale, backend), plan)
    elif _grad_mode() and _parameter_call(q, k, v):  # else nothing to record: the plain path below
        out, lse = _eager_autograd(q, k, v, causal, scale, backend)
    else:  # eagerly: the op's implementation itself, without the dispatcher's per-call cost
        out, lse = dispatch_and_run(q, k, v, causal, scale, backend, return_lse)
    return (out, lse) if return_lse else out


def _planned(q, k, v, causal, softmax_scale, backend: str, return_lse):
    """The fast path of `attention` and `scaled_dot_product_attention`: a call of a kind seen before (`_call_key`)
    run by its plan (`dispatch_and_run`'s, or `_autograd_plan`), without validation; None where there is none, and
    while traced (make_fx and torch.jit.trace too, which `_check_inputs` refuses), under forward-mode AD or
    torch.func transforms (`_check_transforms` decides there), for a q of another class than torch.Tensor and a
    return_lse of any class but bool."""
    if torch.compiler.is_compiling() or q.__class__ is not torch.Tensor or return_lse.__class__ is not bool \
            or _FORWARD_AD._current_level >= 0 or torch._C._are_functorch_transforms_active() \
            or torch.jit.is_tracing() or _proxy_tracing():
        return None
    plan = dispatch.PLANS.get(_call_key(q, k, v, causal, softmax_scale, backend))  # key None: not planned
    if plan is None:
        return None
    if return_lse:
        return plan(q, k, v)
    return plan(q, k, v, False)[0]  # its LSE in the stream's scratch, not allocated


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False, *, backend: str = "auto",
                                 return_lse: bool = False):
    """``torch.nn.functional.scaled_dot_product_attention`` for 4-D inputs, on our kernels.

    Args:
        query: (batch, num_heads, seqlen_q, head_dim); key, value: (batch, num_heads_kv, seqlen_k,
            head_dim). They are passed to ``attention`` as transposed views (no copy).
        attn_mask: None, or a mask that broadcasts to (batch, num_heads, seqlen_q, seqlen_k), bool (True = attend) or
            additive float (0 / -inf, any float dtype of 16 bits or more), not requiring grad, that ``attention``'s
            causal flag and per-sequence key lengths express (``common.mask_lengths``): every key visible,
            bottom-right causal, or either over each sequence's first L_b keys (keys padded on the right; a static KV
            cache with L_b slots filled; torch's top-left causal as a mask), run as ``attention(..., causal,
            seqlens_k=L)``. Read on the host (one device sync). Under torch.compile and torch.export the mask and the
            attention are one op, ``torch.ops.fa_variants.sdpa_masked_sequence_windows``, which reads it when the
            graph runs (no graph break; its backward is the plain call's, window by window with padding); under
            torch.func transforms it is read at the call (a graph break under torch.compile, a ValueError under
            torch.export); refused inside CUDA-graph capture. A mask of one key window per sequence (padding on the
            left, a causal batch padded on the right, ``common.mask_windows``) runs as one call with seqlens_k,
            leftpad_k and seqlens_q (``windowed.one_call``: fa3 / fa2 one launch), eagerly and traced (that op, and
            for a decoding step, one query row without grad, ``torch.ops.fa_variants.mask_window``). Other masks
            (sliding windows that bite, packed sequences, biases) raise ValueError, integer and 8-bit float masks
            TypeError. A row that sees no key gives 0 (and LSE -inf).
        dropout_p: accepted for signature compatibility; only 0.0 is supported.
        is_causal: causal mask. PyTorch aligns it top-left and we align bottom-right; the two agree when
            seqlen_q == seqlen_k (and where either is 0), so is_causal with other seqlen_q != seqlen_k raises
            (use ``attention``).
        scale: softmax scale; None means 1 / sqrt(head_dim).
        enable_gqa: as in PyTorch, num_heads != num_heads_kv needs enable_gqa=True.
        backend, return_lse: as in ``attention``.

    Returns:
        out (batch, num_heads, seqlen_q, head_dim), a transposed view of a new (B, Nq, H, D) tensor; with
        ``return_lse`` also lse float32 (batch, num_heads, seqlen_q).

    Raises:
        ValueError / TypeError: as ``attention``; also an attn_mask those flags cannot express, attn_mask with
            is_causal, dropout_p != 0, is_causal with seqlen_q != seqlen_k, num_heads != num_heads_kv without
            enable_gqa.
    """
    device_type = autocast_device(query)
    if device_type is not None:  # as ``attention``: the inputs cast as autocast casts SDPA's, then without it
        query, key, value = autocast_cast(device_type, query, key, value)
        with torch.autocast(device_type, enabled=False):
            return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                enable_gqa, backend=backend, return_lse=return_lse)
    if not torch.compiler.is_compiling() and attn_mask is None \
            and dropout_p.__class__ in _PLAIN_DROPOUT and dropout_p == 0 \
            and is_causal.__class__ is bool and enable_gqa.__class__ is bool \
            and query.__class__ is key.__class__ is value.__class__ is torch.Tensor \
            and query.dim() == key.dim() == value.dim() == 4 \
            and not (query.is_nested or key.is_nested or value.is_nested):  # this wrapper's own rules hold: the fast path
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        if (enable_gqa or q.shape[2] == k.shape[2]) and (not is_causal or q.shape[1] == k.shape[1]):
            result = _planned(q, k, v, is_causal, scale, backend, return_lse)
            if result is not None:
                return (result[0].transpose(1, 2), result[1]) if return_lse else result.transpose(1, 2)
    names = ("query", "key", "value")
    _check_rank((query, key, value), names, _SDPA_LAYOUT)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    _check_inputs(q, k, v, names, _SDPA_HINT)
    if attn_mask is not None and is_causal is True:
        raise ValueError("attn_mask and is_causal=True given together: pass one (torch's SDPA refuses both too)")
    if not isinstance(dropout_p, numbers.Real) or dropout_p != 0:  # numpy's zeros and False pass, as in torch's
        raise ValueError(f"dropout_p must be 0.0 (the kernels have no dropout), got {one_line(dropout_p)}: pass 0.0 "
                         "(e.g. dropout_p if self.training else 0.0), or use torch's SDPA for dropout")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {one_line(enable_gqa)}")
    if not isinstance(is_causal, bool):  # attention() would name them causal and softmax_scale
        raise TypeError(f"is_causal must be a bool, got {one_line(is_causal)}")
    if scale is not None:
        check_softmax_scale(scale, "scale")
    if is_causal and q.shape[1] != k.shape[1] and q.shape[1] and k.shape[1]:  # no rows or no keys: alike
        raise ValueError(f"is_causal with seqlen_q {q.shape[1]} != seqlen_k {k.shape[1]}: PyTorch aligns "
                         "the causal mask top-left, fa_variants bottom-right; call fa_variants.attention "
                         "(bottom-right) to choose explicitly")
    if not enable_gqa and q.shape[2] != k.shape[2]:
        raise ValueError(f"query has {q.shape[2]} heads but key has {k.shape[2]}: pass enable_gqa=True "
                         "for grouped-query attention" + _layout_hint(q, k, v, _SDPA_HINT))
    seqlens_k = None
    if attn_mask is not None:
        is_causal, read = _sdpa_mask(attn_mask, q, k, v)
        if is_causal is None:  # traced: the mask (read: 4-D) and the attention as one op
            _check_inputs(q, k, v)
            softmax_scale = _check_options(False, scale, backend, return_lse)
            out, lse = torch.ops.fa_variants.sdpa_masked_sequence_windows(q, k, v, read, softmax_scale, backend)[:2]
            return (out.transpose(1, 2), lse) if return_lse else out.transpose(1, 2)
        seqlens_k = read
    leftpad_k = None
    if isinstance(seqlens_k, torch.Tensor) and seqlens_k.dim() == 2:  # traced decoding: ends and first keys
        seqlens_k, leftpad_k = seqlens_k.unbind(0)
    if isinstance(seqlens_k, list):  # one key window per sequence
        from fa_variants import windowed
        result = windowed.attention(q, k, v, seqlens_k, softmax_scale=scale, backend=backend, return_lse=return_lse)
    else:
        result = attention(q, k, v, causal=is_causal, softmax_scale=scale, backend=backend, return_lse=return_lse,
                           seqlens_k=seqlens_k, leftpad_k=leftpad_k)
    if return_lse:
        return result[0].transpose(1, 2), result[1]
    return result.transpose(1, 2)


def _sdpa_mask(attn_mask, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor) -> tuple[bool | None, torch.Tensor | None]:
    """SDPA's ``attn_mask`` (bool, True = attend, or additive float with 0 / -inf; 2 to 4 dimensions that broadcast
    to (batch, num_heads, seqlen_q, seqlen_k)) as ``attention``'s causal flag and seqlens_k (``common.mask_lengths``:
    full or bottom-right causal, over all keys or each sequence's first L_b); one-line errors naming attn_mask for
    other masks. While traced (outside torch.func transforms): (None, the mask as 4-D), for
    ``torch.ops.fa_variants.sdpa_masked_sequence_windows`` to read when the graph runs."""
    mask_lengths.check_dense(attn_mask, "attn_mask")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():  # torch's SDPA refuses them too
        raise TypeError(f"attn_mask must be bool (True = attend) or floating (added to the scores), got "
                        f"{attn_mask.dtype}")
    if attn_mask.is_floating_point() and attn_mask.element_size() == 1:  # e4m3 saturates -inf to -448
        raise TypeError(f"attn_mask is {attn_mask.dtype}: 8-bit float masks are refused (torch's SDPA refuses them "
                        "too; e4m3 has no -inf): pass a bool mask (True = attend) or a 0 / -inf mask in a wider float")
    if attn_mask.requires_grad and torch.is_grad_enabled():
        raise ValueError("attn_mask requires grad: a mask gets no gradient here (it is read as causal + seqlens_k); "
                         "detach it, or use torch's SDPA for a learned bias")
    if attn_mask.device != q.device:
        raise ValueError(f"attn_mask is on {attn_mask.device} but query is on {q.device}")
    # traced: read when the graph runs, by the op that then runs attention (no graph break; its backward takes the
    # plain call's for a plain mask); under torch.func transforms read here (a graph break under torch.compile),
    # which torch.export cannot do. One query row without grad (decoding), where causal and full coincide: the
    # windows alone come from an op (mask_window: seqlens_k and leftpad_k), so that the attention op stays inside
    # reduce-overhead's CUDA graphs (sdpa_masked_sequence_windows, which reads the host, is kept out of them)
    transformed = torch._C._are_functorch_transforms_active()
    compiling = torch.compiler.is_compiling()
    in_graph = (compiling or _proxy_tracing()) and not transformed
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))  # (inference mode: untraceable)
    decoding = in_graph and q.shape[1] == 1 and not wants_grad
    # (torch 2.11's is_exporting() holds in any fullgraph trace too: the message names both)
    if transformed and (getattr(torch.compiler, "is_exporting", lambda: False)() or (
            compiling and not host_values.trace_may_break())):
        raise ValueError("attn_mask inside a torch.func transform (vmap, grad, jvp) under torch.export or "
                         "torch.compile(fullgraph=True): its values decide the call and are read at the call there, "
                         "which such a trace cannot do; compile without fullgraph, or call fa_variants.attention "
                         "with causal and seqlens_k")
    target = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
    shape = tuple(attn_mask.shape)
    if not 2 <= len(shape) <= 4 or any(n not in (1, t) for n, t in zip(shape[::-1], target[::-1])):
        # (sizes as ints, one f-string: Dynamo cannot join strings built from symbolic sizes, dynamic=True)
        shape, target = tuple(int(n) for n in shape), tuple(int(n) for n in target)
        rank = "" if 2 <= len(shape) <= 4 else " (it must have 2 to 4 dimensions)"
        raise ValueError(f"attn_mask has shape {shape}, which does not broadcast to (batch, num_heads, seqlen_q, "
                         f"seqlen_k) = {target}{rank}")
    mask = attn_mask.reshape((1,) * (4 - len(shape)) + shape)
    if decoding:  # (2, batch): the windows' ends and first keys (a left-padded batch's generation too)
        return True, torch.ops.fa_variants.mask_window(mask, True, *target[2:], *target[:2], "attn_mask")
    if in_graph:
        return None, mask
    try:
        return mask_lengths.as_lengths(mask, *target[2:], *target[:2], name="attn_mask", float_min_blocks=False)
    except mask_lengths.InexpressibleMask as refused:
        if torch.compiler.is_compiling():  # (compiled torch.func transforms: key windows run eagerly only)
            raise sdpa_mask_refusal(refused.what) from None
    try:  # a padded batch: one key window per sequence (``windowed``: plain calls on slices)
        return False, mask_windows.as_windows(mask, *target[2:], *target[:2], name="attn_mask",
                                              float_min_blocks=False)
    except mask_lengths.InexpressibleMask as refused:
        raise sdpa_mask_refusal(refused.what) from None


def sdpa_mask_refusal(what: str) -> ValueError:
    """The SDPA drop-in's one-line error for an attn_mask that causal + seqlens_k cannot express (``what`` names
    it); also raised by ``torch.ops.fa_variants.sdpa_masked_sequence_windows`` and ``mask_window`` when a compiled graph
    runs."""
    return ValueError(f"attn_mask: fa_variants cannot express {what}; use torch's SDPA for this mask, or "
                      "fa_variants.attention's causal, seqlens_k and leftpad_k")


def select_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   backend: str = "auto") -> Selection:
    """The backend ``attention(q, k, v, causal=causal, backend=backend)`` would use, and why.

    Args: as ``attention`` (layout (batch, seqlen, heads, head_dim)).

    Returns:
        Selection(backend, reason, candidates): the chosen name, a sentence saying why (including any
        fallback to a slower backend), and every backend that can serve the call, fastest first.

    Raises:
        As ``attention`` for bad inputs, unknown or unavailable backends.
    """
    device_type = autocast_device(q)
    if device_type is not None:  # what attention runs under autocast: the cast inputs
        q, k, v = autocast_cast(device_type, q, k, v)
    _check_inputs(q, k, v)
    _check_options(causal, None, backend, False)
    return dispatch.select_backend(q, k, v, causal=causal, backend=backend)


# registers torch.ops.fa_variants.attention, whose implementation is dispatch_and_run (imported last: it
# uses this module's functions)
from fa_variants.integrations import backward as _backward  # noqa: E402
from fa_variants.integrations import custom_op as _custom_op  # noqa: E402
