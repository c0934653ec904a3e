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
softmax_scale, str backend, Tensor? leftpad_k=None, Tensor? seqlens_q=None) -> (Tensor out, Tensor lse)``. Masks
read when a compiled graph runs: ``fa_variants::mask_sequence_windows`` (a mask's per-sequence windows as seqlens_k,
leftpad_k and seqlens_q, for transformers' masks of a causal layer's query rows beyond one, since session 55) and
``fa_variants::mask_window`` (seqlens_k and leftpad_k alone: a decoding step's row, a non-causal layer;
``fa_variants::mask_lengths``, its lengths alone, before session 54, is kept for graphs exported with it), and
``fa_variants::sdpa_masked_sequence_windows`` (the SDPA drop-in's attn_mask and the attention as one node, since
session 55; ``sdpa_masked_windows`` (session 54) and ``sdpa_masked`` before it are kept for graphs traced with them;
their backward ``fa_variants::sdpa_masked_backward``, the same ``kernel_backward`` as one opaque node: no second
derivative).

Autograd (the attention and seqlens_k ops): the backward is ``integrations.backward.kernel_backward``
(``FA_VARIANTS_BACKWARD``: by default cuDNN's fused attention backward, else PyTorch's FlashAttention-2 backward
kernel, each on the forward's O and LSE, eager and traced, where they apply; else
the reference backend's ``reference.run_backward``, plain PyTorch, float32 maths, query rows in memory-bounded
chunks): traced, in a second opaque op,
``fa_variants::attention_reference_backward``; eagerly called directly, so that a second derivative exists. An
eager call that needs a gradient (or whose q is a Parameter) does not enter the op: `EagerAttention`, a plain
``torch.autograd.Function``, runs the op's body with the op's context and backward (the op's dispatcher round trip
was about a third of a training step's host time on the CPU; session 45), except while a TorchDispatchMode is
active (``api._eager_autograd``). It is the gradient of exact attention, which every backend's forward computes
but the FP8 one (``registry.FORWARD_ONLY``: a backward through it raises NotImplementedError when it runs). The
kernels have no backward kernel of their own: each warns once (``dispatch.BackendFallbackWarning``) at the first
eager call that needs its gradient, at the caller's line, or else (traced) at its first backward.
"""
from __future__ import annotations

import torch

import fa_variants
from fa_variants import windowed
from fa_variants.integrations import backward

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

    _refuse_tangents(api, q, k, v)
    with workspace.uncached():
        out, lse = api.dispatch_and_run(q, k, v, causal, softmax_scale, backend)
    return out.contiguous(), lse.contiguous()


def _refuse_tangents(api, q, k, v) -> None:
    """NotImplementedError for inputs carrying a forward-mode tangent (``torch.autograd.forward_ad``): the ops have
    no forward-mode rule, and PyTorch runs a custom op whose inputs do not require grad below autograd, dropping the
    tangent (the output had none, without a word). ``fa_variants.attention`` sends such calls to the plain path
    instead. (A tangent from ``torch.func.jvp`` is not visible here: see the README's "torch.func".)"""
    if api._transform(q, k, v) is not None:
        raise NotImplementedError("torch.ops.fa_variants.attention has no forward-mode AD rule and an input carries a "
                                  "tangent: call fa_variants.attention(..., backend='reference') for forward-mode AD")


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
                           softmax_scale: float | None, backend: str, leftpad_k: torch.Tensor | None = None,
                           seqlens_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``fa_variants.attention(..., seqlens_k=...)`` while traced: ``api.run_seqlens_k`` (fa3 and fa2 read the
    lengths in their kernels, so the op runs inside a CUDA graph of ``mode="reduce-overhead"`` too; outside capture
    the lengths are checked, one read-back; a call of a kind not planned yet is validated with
    ``fa_variants.attention``'s rules first, as the other op's body validates: a direct ``torch.ops`` call has not
    been). ``leftpad_k`` and ``seqlens_q`` (last, optional: graphs exported before them still load): each sequence's
    first key and query count. Its
    backward (`_seqlens_k_backward`) is ``backward.kernel_backward``'s: the fused one window by window where it
    applies, from the O and LSE kept here (``backward.keeps_outputs``)."""
    from fa_variants import api
    from fa_variants.common import workspace
    _refuse_tangents(api, q, k, v)
    with workspace.uncached():
        out, lse = api.run_seqlens_k(q, k, v, causal, softmax_scale, backend, seqlens_k, leftpad_k=leftpad_k,
                                     seqlens_q=seqlens_q)
    return out.contiguous(), lse.contiguous()


@attention_seqlens_k_op.register_fake
def _attention_seqlens_k_fake(q, k, v, seqlens_k, causal, softmax_scale, backend, leftpad_k=None, seqlens_q=None):
    """``_attention_fake`` (``fa_variants.attention``'s checks, then the shapes), then seqlens_k's (and leftpad_k's,
    seqlens_q's) dtype, shape and device checked (their values are checked when the op runs)."""
    from fa_variants.reference import check_leftpad_k, check_seqlens_k
    outputs = _attention_fake(q, k, v, causal, softmax_scale, backend)
    check_seqlens_k(seqlens_k, q.shape[0], k.shape[1], q.device, values=False, host_ok=True)
    if leftpad_k is not None:
        check_leftpad_k(leftpad_k, seqlens_k, q.shape[0], k.shape[1], q.device, values=False, host_ok=True)
    if seqlens_q is not None:
        check_seqlens_k(seqlens_q, q.shape[0], q.shape[1], q.device, values=False, host_ok=True, name="seqlens_q")
    return outputs


#: where torch has it, the tag that keeps an op out of the CUDA graphs of mode="reduce-overhead" (inductor runs the
#: graph around it): the mask op reads its mask back on the host, which graph capture forbids
_HOST_READ_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


@torch.library.custom_op("fa_variants::mask_lengths", mutates_args=(), tags=_HOST_READ_TAGS)
def mask_lengths_op(mask: torch.Tensor, causal: bool, seqlen_q: int, seqlen_k: int, batch: int, num_heads: int,
                    name: str) -> torch.Tensor:
    """seqlens_k (int32 (batch,) on the mask's device) of a 4-D mask that ``causal`` with per-sequence key lengths
    expresses (``common.mask_lengths.as_lengths``, read when the op runs: one device sync, and the attention op checks
    the lengths it gets, another; plain masks give seqlen_k for every sequence), so that a traced call with a mask
    costs no graph break and ``fullgraph=True`` works. Its callers while torch.compile traces: ``integrations.hf``
    (``name`` "attention_mask": transformers' masks, any value at or below half the dtype's lowest hiding a key, the
    layer's is_causal giving the kind) and the SDPA drop-in at seqlen_q 1 without grad (``name`` "attn_mask", 0 /
    -inf floats only; the two kinds coincide there; the attention op after it stays in reduce-overhead's CUDA
    graphs, which ``sdpa_masked_windows`` would leave). A mask of the other kind (full for a causal layer, with
    seqlen_q > 1, or causal for a non-causal one) or one the lengths cannot express raises when the compiled graph
    runs (``_mask_refusal``). The eager paths refuse the same masks but one: transformers' attention function reads
    the kind from the mask itself there, so a causal mask in a non-causal layer runs eagerly (traced, the kind is
    fixed before any value is read: ``integrations.hf``)."""
    from fa_variants.common import mask_lengths

    try:
        got, seqlens_k = mask_lengths.as_lengths(mask, seqlen_q, seqlen_k, batch, num_heads, name=name,
                                                 float_min_blocks=name != "attn_mask")
    except mask_lengths.InexpressibleMask as refused:
        raise _mask_refusal(name, refused.what) from None
    if got != causal and seqlen_q > 1 and seqlen_k > 0 and (seqlens_k is None or bool(seqlens_k.any())):
        # (every length 0: nothing visible, which both kinds express)
        raise _mask_refusal(name, f"a {'causal' if got else 'full'} mask for a {'causal' if causal else 'non-causal'} "
                                  "layer (while torch.compile traced it, the layer's is_causal chose the kind)")
    if seqlens_k is None:
        return torch.full((batch,), seqlen_k, dtype=torch.int32, device=mask.device)
    return seqlens_k.to(mask.device)


@torch.library.custom_op("fa_variants::mask_window", mutates_args=(), tags=_HOST_READ_TAGS)
def mask_window_op(mask: torch.Tensor, causal: bool, seqlen_q: int, seqlen_k: int, batch: int, num_heads: int,
                   name: str) -> torch.Tensor:
    """Each sequence's key window of a 4-D mask, as ``fa_variants.attention``'s seqlens_k (row 0: the window's end)
    and leftpad_k (row 1: its first key), int32 (2, batch) on the mask's device, read when the op runs
    (``common.mask_windows.as_windows``: one device sync): `mask_lengths_op`'s masks (start 0) and those padded on
    the left (a prompt batch and its generation under torch.compile), each window one call expresses with the
    layer's ``causal`` (``windowed.one_call``: bottom-right against the window, or full). Its callers while traced:
    ``integrations.hf`` and the SDPA drop-in at seqlen_q 1 without grad, as `mask_lengths_op`'s were (that op stays
    registered for graphs exported before session 54). Since session 55 its callers take it where no query count
    moves a diagonal (one query row, a non-causal layer), and `mask_sequence_windows_op` for a causal layer's longer
    queries. Other masks (a causal batch padded on the right, whose padding rows see the whole sequence; a sliding
    window that bites) raise the caller's refusal when the graph runs."""
    windows = _layer_windows(mask, causal, seqlen_q, seqlen_k, batch, num_heads, name, counts=False)
    if windowed.needs_counts(windows[2], seqlen_q):
        raise _mask_refusal(name, _NEEDS_COUNTS)
    return windows[:2].to(mask.device)


@torch.library.custom_op("fa_variants::mask_sequence_windows", mutates_args=(), tags=_HOST_READ_TAGS)
def mask_sequence_windows_op(mask: torch.Tensor, causal: bool, seqlen_q: int, seqlen_k: int, batch: int,
                             num_heads: int, name: str) -> torch.Tensor:
    """`mask_window_op` with each sequence's query count too: int32 (3, batch) on the mask's device, rows seqlens_k,
    leftpad_k and seqlens_q (``windowed.one_call_windows``: the count each causal diagonal is bottom-right against,
    seqlen_q where it ends at the window's last key), so a causal batch padded on the right runs as one call under
    torch.compile too (its padding rows seeing the whole sequence, as the mask has them). Its callers while traced:
    ``integrations.hf``'s causal layers at seqlen_q > 1 (since session 55). A mask whose windows are all full (no
    causal limit bites: e.g. a right-padded batch of one-token sequences) runs too, each live window's count 0.
    Masks one call cannot express (a sliding window that bites, packed sequences) raise the caller's refusal when
    the graph runs."""
    return _layer_windows(mask, causal, seqlen_q, seqlen_k, batch, num_heads, name, counts=True).to(mask.device)


def _layer_windows(mask, causal: bool, seqlen_q: int, seqlen_k: int, batch: int, num_heads: int, name: str,
                   counts: bool) -> torch.Tensor:
    """`_one_call_windows`' windows (3, batch) of a mask read for a layer whose ``causal`` the trace fixed, where the
    mask is of the other kind and that matters (more than one query row, a key seen): with ``counts`` a full mask in
    a causal layer gets each live window's query count 0 (every row sees its whole window); else refused
    (`_mask_refusal`)."""
    runs = causal if counts and causal else None  # a causal call with counts expresses full windows too
    got, windows = _one_call_windows(mask, seqlen_q, seqlen_k, batch, num_heads, name, runs)
    if got != causal and runs is None and seqlen_q > 1 and bool((windows[0] > windows[1]).any()):
        raise _mask_refusal(name, f"a {'causal' if got else 'full'} mask for a {'causal' if causal else 'non-causal'} "
                                  "layer (while torch.compile traced it, the layer's is_causal chose the kind)")
    return windows


#: the refusal of the mask ops kept for older graphs (``mask_window``, ``sdpa_masked_windows``), whose outputs have no
#: row for the query counts, for a mask that needs them
_NEEDS_COUNTS = ("a padded batch whose rows past a sequence's end see its whole window (a causal batch padded on the "
                 "right) in a graph traced before session 55 (trace it again: the mask ops of now run it)")


def _one_call_windows(mask, seqlen_q: int, seqlen_k: int, batch: int, num_heads: int, name: str,
                      causal: bool | None = None) -> tuple[bool, torch.Tensor]:
    """(causal, windows) of a mask whose key windows one call expresses (``common.mask_windows.as_windows``, one
    device sync; ``windowed.one_call_windows``, ``causal`` its flag of the call to run): windows int32 (3, batch) on
    the CPU, each sequence's end (seqlens_k), first key (leftpad_k) and query count (seqlens_q). Other masks raise the
    caller's refusal (`_mask_refusal`)."""
    from fa_variants.common import mask_lengths, mask_windows

    try:
        windows = mask_windows.as_windows(mask, seqlen_q, seqlen_k, batch, num_heads, name=name,
                                          float_min_blocks=name != "attn_mask")
    except mask_lengths.InexpressibleMask as refused:
        raise _mask_refusal(name, refused.what) from None
    return windowed.one_call_windows(windows, seqlen_q, causal)


@mask_window_op.register_fake
def _mask_window_fake(mask, causal, seqlen_q, seqlen_k, batch, num_heads, name):
    """The mask's shape checked (`_check_mask_shape`: its values are read when the op runs)."""
    _check_mask_shape(mask, seqlen_q, seqlen_k, batch, num_heads, name)
    return mask.new_empty((2, batch), dtype=torch.int32)


@mask_sequence_windows_op.register_fake
def _mask_sequence_windows_fake(mask, causal, seqlen_q, seqlen_k, batch, num_heads, name):
    """`_mask_window_fake`'s, with the third row."""
    _check_mask_shape(mask, seqlen_q, seqlen_k, batch, num_heads, name)
    return mask.new_empty((3, batch), dtype=torch.int32)


def _check_mask_shape(mask, seqlen_q: int, seqlen_k: int, batch: int, num_heads: int, name: str) -> None:
    """The mask ops' fakes: the mask's shape checked as ``as_lengths`` / ``as_windows`` check it, refused as the
    caller refuses it eagerly (`_mask_refusal`)."""
    from fa_variants.common import mask_lengths

    try:
        mask_lengths.check_shape(mask, seqlen_q, seqlen_k, batch, num_heads, name=name)
    except mask_lengths.InexpressibleMask as refused:
        raise _mask_refusal(name, refused.what) from None


def _mask_refusal(name: str, what: str) -> Exception:
    """The error the mask op's caller gives eagerly for a mask it cannot express: ``hf.UnsupportedAttentionError``
    (with transformers' fallback) for "attention_mask", the SDPA drop-in's ValueError for "attn_mask"."""
    if name == "attn_mask":
        from fa_variants import api

        return api.sdpa_mask_refusal(what)
    from fa_variants.integrations import hf

    return hf._refuse(what)


@mask_lengths_op.register_fake
def _mask_lengths_fake(mask, causal, seqlen_q, seqlen_k, batch, num_heads, name):
    """The mask's shape checked (`_check_mask_shape`: its values are read when the op runs)."""
    _check_mask_shape(mask, seqlen_q, seqlen_k, batch, num_heads, name)
    return mask.new_empty((batch,), dtype=torch.int32)


@torch.library.custom_op("fa_variants::sdpa_masked_windows", mutates_args=(), tags=_HOST_READ_TAGS)
def sdpa_masked_windows_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                           softmax_scale: float | None, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                               torch.Tensor]:
    """The SDPA drop-in's ``attn_mask`` while torch.compile or torch.export traces the call: the 4-D mask read when the
    op runs (one device sync) as the causal flag and each sequence's key window (``common.mask_lengths.as_lengths``:
    over all keys or the first L_b; else ``_one_call_windows``: one window per sequence that one call expresses,
    left padding), then attention run with them (seqlens_k, leftpad_k). The flag is decided by the mask's values,
    which a trace cannot read, so the mask and the attention are one node (no graph break; ``fullgraph=True``
    works). A mask they cannot express (a causal batch padded on the right, a sliding window that bites) raises the
    drop-in's one-line ValueError when the compiled graph runs.

    Returns (out, lse, windows, kind): out and lse as ``attention_op``'s; windows int32 (2, batch), each sequence's
    end then its first key, and kind int32 [causal, how], on the CPU: what the mask was read as, for the backward
    (`_sdpa_masked_backward`; the mask itself is not kept, so it may be changed after the call, as torch's SDPA
    allows): how 0, a plain mask, whose backward is the plain call's (FA_VARIANTS_BACKWARD's fused backward where it
    applies); 1, lengths, and 2, windows, the seqlens_k op's (the same, window by window:
    ``backward.kernel_backward``). O and LSE are kept for the backward where a fused one may use them
    (``backward.keeps_outputs``), with lengths too (which mask comes is known only when the op runs). Tagged
    cudagraph_unsafe: it reads the mask on the host. Since session 54, in place of `sdpa_masked_op`; since session 55
    kept for the graphs that call it (`sdpa_masked_sequence_windows_op` in its place), refusing the masks whose
    query counts move a diagonal."""
    return _sdpa_masked(q, k, v, mask, softmax_scale, backend, rows=2)


@torch.library.custom_op("fa_variants::sdpa_masked_sequence_windows", mutates_args=(), tags=_HOST_READ_TAGS)
def sdpa_masked_sequence_windows_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                                    softmax_scale: float | None, backend: str) -> tuple[torch.Tensor, torch.Tensor,
                                                                                        torch.Tensor, torch.Tensor]:
    """`sdpa_masked_windows_op` with each sequence's query count too (its windows int32 (3, batch): ends, first keys,
    query counts; kind's how 3 where the counts move a diagonal): a causal batch padded on the right runs as one
    call (its padding rows seeing the whole sequence, as the mask has them), forward and backward. The SDPA
    drop-in's op while traced since session 55."""
    return _sdpa_masked(q, k, v, mask, softmax_scale, backend, rows=3)


@torch.library.custom_op("fa_variants::sdpa_masked", mutates_args=(), tags=_HOST_READ_TAGS)
def sdpa_masked_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, softmax_scale: float | None,
                   backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sdpa_masked_windows_op` as traced before session 54, kept for the graphs that call it (exported, or in
    torch.compile's caches, whose compiled code checks the shapes of its outputs): masks of lengths only, and the
    ends alone, int32 (batch,), in place of the windows."""
    return _sdpa_masked(q, k, v, mask, softmax_scale, backend, rows=1)


def _sdpa_masked(q, k, v, mask, softmax_scale: float | None, backend: str, rows: int):
    """The three ops' body, by the rows of windows they return: 1 (the ends alone) refuses what lengths do not
    express, 2 (ends, first keys) what needs query counts, 3 (ends, first keys, query counts) neither."""
    from fa_variants import api
    from fa_variants.common import mask_lengths, workspace

    _refuse_tangents(api, q, k, v)
    batch, seqlen_q, heads, _ = q.shape
    read = what = None
    try:
        read = mask_lengths.as_lengths(mask, seqlen_q, k.shape[1], batch, heads, name="attn_mask",
                                       float_min_blocks=False)
    except mask_lengths.InexpressibleMask as refused:  # (refusals raised outside the handler: no chained context)
        what = refused.what
    starts = counts = None
    if read is not None:
        causal, seqlens_k = read
    elif rows > 1:
        causal, (seqlens_k, starts, counts) = _one_call_windows(mask, seqlen_q, k.shape[1], batch, heads, "attn_mask")
        if not windowed.needs_counts(counts, seqlen_q):
            counts = None
        elif rows == 2:
            raise api.sdpa_mask_refusal(_NEEDS_COUNTS)
    else:
        raise api.sdpa_mask_refusal(what)
    with workspace.uncached():
        if seqlens_k is None:
            out, lse = api.dispatch_and_run(q, k, v, causal, softmax_scale, backend)
        else:  # the windows on the CPU: checked on the host, copied over without a second sync
            out, lse = api.run_seqlens_k(q, k, v, causal, softmax_scale, backend, seqlens_k, leftpad_k=starts,
                                         seqlens_q=counts)
    ends = torch.full((batch,), k.shape[1], dtype=torch.int32) if seqlens_k is None else seqlens_k
    how = 0 if seqlens_k is None else 1 if starts is None else 2 if counts is None else 3
    kind = torch.tensor([causal, how], dtype=torch.int32)
    if rows == 1:
        return out.contiguous(), lse.contiguous(), ends, kind
    starts = torch.zeros_like(ends) if starts is None else starts
    counts = torch.full_like(ends, seqlen_q) if counts is None else counts
    return out.contiguous(), lse.contiguous(), torch.stack([ends, starts, counts][:rows]), kind


@sdpa_masked_windows_op.register_fake
def _sdpa_masked_windows_fake(q, k, v, mask, softmax_scale, backend, rows: int = 2):
    """``_attention_fake`` (``fa_variants.attention``'s checks, then the shapes), then the mask's shape checked
    (`_check_mask_shape`: its values are read when the op runs)."""
    out, lse = _attention_fake(q, k, v, False, softmax_scale, backend)
    _check_mask_shape(mask, q.shape[1], k.shape[1], q.shape[0], q.shape[2], "attn_mask")
    return out, lse, torch.empty((rows, q.shape[0]), dtype=torch.int32), torch.empty((2,), dtype=torch.int32)


@sdpa_masked_sequence_windows_op.register_fake
def _sdpa_masked_sequence_windows_fake(q, k, v, mask, softmax_scale, backend):
    """`_sdpa_masked_windows_fake`'s, with the third row."""
    return _sdpa_masked_windows_fake(q, k, v, mask, softmax_scale, backend, rows=3)


@sdpa_masked_op.register_fake
def _sdpa_masked_fake(q, k, v, mask, softmax_scale, backend):
    """`_sdpa_masked_windows_fake`'s, with the ends alone."""
    out, lse, _, kind = _sdpa_masked_windows_fake(q, k, v, mask, softmax_scale, backend)
    return out, lse, torch.empty((q.shape[0],), dtype=torch.int32), kind


def _sdpa_masked_setup_context(ctx, inputs, output):
    q, k, v, mask, softmax_scale, backend = inputs
    out, lse, lengths, kind = output
    kept = (out, lse) if backward.keeps_outputs(False) else (None, None)  # the traced route (_backward_of)
    ctx.save_for_backward(q, k, v, *kept, lengths, kind)
    ctx.softmax_scale, ctx.backend = softmax_scale, backend
    ctx.mark_non_differentiable(lengths, kind)
    ctx.set_materialize_grads(False)


def _sdpa_masked_backward(ctx, grad_out, grad_lse, _lengths, _kind):
    q, k, v, out, lse, lengths, kind = ctx.saved_tensors
    dq, dk, dv = sdpa_masked_backward_op(grad_out, grad_lse, q, k, v, out, lse, lengths, kind, ctx.softmax_scale,
                                         ctx.backend)
    return dq, dk, dv, None, None, None


@torch.library.custom_op("fa_variants::sdpa_masked_backward", mutates_args=(), tags=_HOST_READ_TAGS)
def sdpa_masked_backward_op(grad_out: torch.Tensor | None, grad_lse: torch.Tensor | None, q: torch.Tensor,
                            k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None, lse: torch.Tensor | None,
                            lengths: torch.Tensor, kind: torch.Tensor, softmax_scale: float | None,
                            backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``backward.kernel_backward`` for the mask ``sdpa_masked_windows`` / ``sdpa_masked`` read (``kind`` and
    ``lengths``: the windows (3, batch) or (2, batch), or the ends alone (batch,) from ``sdpa_masked``; read on the
    host: they are on the CPU), as one opaque node."""
    causal, how = kind.tolist()
    ends, starts, counts = (*lengths.unbind(0), None, None)[:3] if lengths.dim() == 2 else (lengths, None, None)
    seqlens_k = ends if how else None  # on the CPU: read there, no device round trip
    starts = starts if how >= 2 else None
    counts = counts if how == 3 else None
    grads = backward.kernel_backward(grad_out, grad_lse, q, k, v, out, lse, seqlens_k, bool(causal), softmax_scale,
                                     backend, eager=False, leftpad_k=starts, seqlens_q=counts)
    return tuple(g.contiguous() for g in grads)


@sdpa_masked_backward_op.register_fake
def _sdpa_masked_backward_fake(grad_out, grad_lse, q, k, v, out, lse, lengths, kind, softmax_scale, backend):
    return _empty_grads(q, k, v)


for _op in (sdpa_masked_sequence_windows_op, sdpa_masked_windows_op, sdpa_masked_op):
    _op.register_autograd(_sdpa_masked_backward, setup_context=_sdpa_masked_setup_context)


def _forward_backend(eager: bool, q, k, v, causal: bool, backend: str) -> str:
    """The backend the forward ran on, for its backward: eagerly "auto" resolved now (the backward would otherwise
    choose again, from a FA_VARIANTS_BACKEND the caller may have changed since, and refuse or switch paths); traced,
    the name given (the choice is made when the compiled graph runs)."""
    if not eager or backend != "auto":
        return backend
    from fa_variants import dispatch

    return dispatch.select_backend(q, k, v, causal=causal, backend=backend).backend


def _seqlens_k_setup_context(ctx, inputs, output):
    q, k, v, seqlens_k, causal, softmax_scale, backend, *windows = inputs  # leftpad_k, seqlens_q: given or defaulted
    windows = (*windows, None, None)[:2]
    ctx.eager = _eager(q, torch.compiler.is_compiling())  # read once, here: the backward takes the same route
    kept = output if backward.keeps_outputs(ctx.eager) else (None, None)  # for the fused backwards, window by window
    ctx.save_for_backward(q, k, v, *kept, seqlens_k, *windows)
    ctx.causal, ctx.softmax_scale = causal, softmax_scale
    ctx.backend = _forward_backend(ctx.eager, q, k, v, causal, backend)
    ctx.set_materialize_grads(False)


def _seqlens_k_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, seqlens_k, leftpad_k, seqlens_q = ctx.saved_tensors
    dq, dk, dv = _backward_of(ctx, grad_out, grad_lse, q, k, v, out, lse, seqlens_k, leftpad_k, seqlens_q)
    return dq, dk, dv, None, None, None, None, None, None


# a backward exists for every backend but the FP8 one, whose backward raises when it runs (not while AOTAutograd traces
# the graph, so a compiled forward with inputs that require grad still runs)
attention_seqlens_k_op.register_autograd(_seqlens_k_backward, setup_context=_seqlens_k_setup_context)


def _traced_backward(grad_out: torch.Tensor | None, grad_lse: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, out: torch.Tensor | None, lse: torch.Tensor | None,
                     seqlens_k: torch.Tensor | None, causal: bool, softmax_scale: float | None,
                     backend: str, leftpad_k: torch.Tensor | None = None,
                     seqlens_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``backward.kernel_backward`` (not eager: no SDPA recomputation) as one opaque node (for tracing), its outputs
    contiguous to match the fake."""
    grads = backward.kernel_backward(grad_out, grad_lse, q, k, v, out, lse, seqlens_k, causal, softmax_scale, backend,
                                     eager=False, leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    return tuple(g.contiguous() for g in grads)


#: `_traced_backward` of the attention op (no lengths: the fused kernels read nothing on the host, so the op may be
#: captured in reduce-overhead's CUDA graphs)
reference_backward_op = torch.library.custom_op("fa_variants::attention_reference_backward",
                                                mutates_args=())(_traced_backward)
#: `_traced_backward` of the seqlens_k op: it reads the lengths on the host (``backward._backward_by_length``,
#: ``reference.run_backward``), which graph capture forbids, so tagged to run outside reduce-overhead's graphs
lengths_backward_op = torch.library.custom_op("fa_variants::attention_lengths_backward", mutates_args=(),
                                              tags=_HOST_READ_TAGS)(_traced_backward)


@reference_backward_op.register_fake
@lengths_backward_op.register_fake
def _reference_backward_fake(grad_out, grad_lse, q, k, v, out, lse, seqlens_k, causal, softmax_scale, backend,
                             leftpad_k=None, seqlens_q=None):
    return _empty_grads(q, k, v)


def _empty_grads(q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward ops' fake outputs: (dq, dk, dv) shaped as q, k, v, contiguous as their real ones are made."""
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _eager(q, compiling: bool) -> bool:
    """Whether the op's autograd runs eagerly, not inside torch.compile's or torch.export's tracing: the API's own
    test (``api._tracing``; ``compiling``: torch.compiler.is_compiling() read in the caller's frame, as there), so
    the op's backward agrees with the routing that sent the call here."""
    from fa_variants import api

    return not api._tracing(q, compiling)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, softmax_scale, backend = inputs
    eager = _eager(q, torch.compiler.is_compiling())
    kept = output if backward.keeps_outputs(eager) else (None, None)  # for the fused backwards that start from them
    ctx.save_for_backward(q, k, v, *kept)
    ctx.causal, ctx.softmax_scale, ctx.backend = causal, softmax_scale, _forward_backend(eager, q, k, v, causal,
                                                                                         backend)
    ctx.eager = eager  # the backward takes the same route (its own frame may be compiled apart from this one)
    ctx.set_materialize_grads(False)  # an output the loss does not use gets None (the fused backwards need to know)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _backward_of(ctx, grad_out, grad_lse, q, k, v, out, lse, None)
    return dq, dk, dv, None, None, None


def _backward_of(ctx, grad_out, grad_lse, q, k, v, out, lse, seqlens_k, leftpad_k=None, seqlens_q=None):
    """(dq, dk, dv) for either op's backward (``backward.kernel_backward``): eagerly (a Parameter's call, and a kernel
    backend's call that needs a gradient, come here) called directly, so that its plain ops are recorded under
    create_graph and a second derivative exists; traced, one opaque node (which has no backward of its own)."""
    if ctx.eager:
        return backward.kernel_backward(grad_out, grad_lse, q, k, v, out, lse, seqlens_k, ctx.causal,
                                        ctx.softmax_scale, ctx.backend, eager=True, leftpad_k=leftpad_k,
                                        seqlens_q=seqlens_q)
    if seqlens_k is None:
        return reference_backward_op(grad_out, grad_lse, q, k, v, out, lse, None, ctx.causal, ctx.softmax_scale,
                                     ctx.backend)
    if seqlens_q is None:  # (the op's schema before seqlens_q: graphs traced then still match)
        return lengths_backward_op(grad_out, grad_lse, q, k, v, out, lse, seqlens_k, ctx.causal, ctx.softmax_scale,
                                   ctx.backend, leftpad_k)
    return lengths_backward_op(grad_out, grad_lse, q, k, v, out, lse, seqlens_k, ctx.causal, ctx.softmax_scale,
                               ctx.backend, leftpad_k, seqlens_q)


attention_op.register_autograd(_backward, setup_context=_setup_context)


class EagerAttention(torch.autograd.Function):
    """The op's autograd without the op, for an eager call: forward ``api.dispatch_and_run`` (the op's body),
    context and backward the op's own (`_setup_context`, `_backward`: ``backward.kernel_backward`` called directly).
    Eagerly the op's dispatcher round trip (schema defaults, redispatch, the Dynamo-disabled body) is pure host
    cost; traced, the op serves."""

    @staticmethod
    def forward(ctx, q, k, v, causal, softmax_scale, backend):
        from fa_variants import api

        output = api.dispatch_and_run(q, k, v, causal, softmax_scale, backend)
        _setup_context(ctx, (q, k, v, causal, softmax_scale, backend), output)
        return output

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return _backward(ctx, grad_out, grad_lse)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              softmax_scale: float | None = None, backend: str = "auto", return_lse: bool = False):
    """Kept for older callers: ``fa_variants.attention`` itself (which uses the op while being traced)."""
    return fa_variants.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
                                 return_lse=return_lse)
