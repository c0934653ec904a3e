"""fa_variants as an attention implementation of Hugging Face transformers (its attention-function registry).

    from fa_variants.integrations import hf
    name = hf.register()                                   # "fa_variants", backend "auto"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)
    # or, on a model already built:  model.set_attn_implementation(name)

How transformers calls it (read from transformers 5.17: ``modeling_utils.AttentionInterface``,
``models/llama/modeling_llama.py`` ``LlamaAttention.forward``, ``integrations/sdpa_attention.py``): every
attention layer looks up ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` and calls it as
``fn(module, query, key, value, attention_mask, dropout=..., scaling=..., **kwargs)`` with query
(batch, num_heads, seqlen_q, head_dim) and key/value (batch, num_heads_kv, seqlen_k, head_dim), after rotary
and after the KV-cache update, and expects ``(out (batch, seqlen_q, num_heads, head_dim), weights or None)``.
We hand ``fa_variants.attention`` transposed views (no copy, no ``repeat_kv``: GQA is native).

Masks. transformers builds the mask with ``ALL_MASK_ATTENTION_FUNCTIONS[config._attn_implementation]``; a
name missing from that registry gets *no mask at all* (even with padding), so we register a mask function
too. It returns None when the mask is the plain causal (or full) one that our ``causal`` flag expresses:
no padding, no extra mask function, keys starting at position 0 and queries being the last ``seqlen_q``
positions, which is exactly our bottom-right causal alignment (prefill, chunked prefill and decoding with a
dynamic cache). Otherwise it materialises the boolean mask, and the attention function accepts it when our
``causal`` flag and per-sequence windows express it: all-visible or bottom-right causal over each sequence's first
L_b keys (``mask_as_lengths``: a static KV cache with L_b of its slots filled), or one key window per sequence
(``common.mask_windows``: padding on the left, and a causal batch padded on the right, whose padding rows see the
whole sequence), run as one call with ``seqlens_k``, ``leftpad_k`` and ``seqlens_q`` (``fa_variants.windowed``).
Anything else (sliding windows that bite, packed sequences, additive biases) raises
:class:`UnsupportedAttentionError`, whose message says to use ``attn_implementation="sdpa"`` or ``"eager"`` for that
call. Under torch.compile, the padding of transformers' 2-D attention_mask is read (a graph break) only where it
decides whether a mask is needed at all (keys from position 0 and queries at the end: no cache, as in a training
step, or a dynamic cache), and only where the trace may break its graph: under ``fullgraph=True`` or torch.export
the mask is built unread, as transformers' sdpa does while tracing. A mask that is built anyway (a static cache's
slots, a fullgraph trace) or given as 4-D costs no graph break: the layer's ``is_causal`` gives the kind and
``torch.ops.fa_variants.mask_sequence_windows`` (``mask_window`` for one query row) reads it into those windows when
the compiled graph runs (a device sync or two per layer; refusing then what one call cannot express). With
``fallback="sdpa"`` a trace that may break reads the mask to choose; one that may not gives every masked call to
sdpa, which takes the mask unread.

Training: the kernels have no backward kernel of their own; their gradients come from PyTorch's backward
(``fa_variants.integrations.backward``: by default cuDNN's fused backward on our forward's O and LSE, else PyTorch's
FlashAttention-2 backward, else ``reference.run_backward``), and a training step runs without dropout. Dropout > 0,
logit soft-capping, attention sinks and position biases are refused the same way as the masks above.
``register(fallback="sdpa")`` runs transformers' own sdpa attention for such calls instead (with a warning), so a
padded batch or a training step with dropout still runs, and every other call keeps fa_variants; soft-capping and
sinks stay refused (sdpa has neither).
"""
from __future__ import annotations

import functools
import warnings

import torch

import fa_variants
from fa_variants import dispatch, windowed
from fa_variants.common import host_values, mask_lengths, mask_windows
from fa_variants.common.checks import one_line
from fa_variants.reference import causal_visible

DEFAULT_NAME = "fa_variants"
_FALLBACK = ("use attn_implementation='sdpa' (or 'eager') for this model or batch, e.g. "
             "model.set_attn_implementation('sdpa'), or unpad the batch")


class UnsupportedAttentionError(NotImplementedError):
    """transformers asked for an attention that fa_variants cannot express (a mask that is neither
    causal nor full, dropout, soft-capping, ...). The message names it and the fallback to use; ``what`` names it
    alone."""

    what: str = ""


def _refuse(what: str, fallback: str = _FALLBACK) -> UnsupportedAttentionError:
    refused = UnsupportedAttentionError(f"fa_variants attention cannot express {what}; {fallback}")
    refused.what = what
    return refused


def mask_is_causal(mask: torch.Tensor, seqlen_q: int, seqlen_k: int, batch: int | None = None,
                   num_heads: int | None = None) -> bool:
    """Whether a 4-D mask (batch or 1, heads or 1, seqlen_q, seqlen_k) is one our ``causal`` flag expresses alone.

    Returns True for the bottom-right causal mask, False for the all-visible one (the two coincide for
    seqlen_q == 1; True is returned then). Raises UnsupportedAttentionError for any other mask (a mask that needs
    per-sequence key lengths too: ``mask_as_lengths``), and for a mask on the meta device (its values cannot be
    read); ValueError for a mask whose batch or heads (checked when ``batch`` / ``num_heads`` are given) neither
    match the call's nor are 1, as torch's SDPA refuses it.
    Data-dependent (it reads the mask): fine eagerly, a graph break under torch.compile.
    """
    causal, seqlens_k = mask_as_lengths(mask, seqlen_q, seqlen_k, batch, num_heads)
    if seqlens_k is not None:
        raise _refuse("this attention mask (keys hidden past a per-sequence length): only bottom-right causal or "
                      "full attention; mask_as_lengths gives it as seqlens_k")
    return causal


def mask_as_lengths(mask: torch.Tensor, seqlen_q: int, seqlen_k: int, batch: int | None = None,
                    num_heads: int | None = None, *, memo: bool = False) -> tuple[bool, torch.Tensor | None]:
    """``(causal, seqlens_k)`` for ``fa_variants.attention`` that express a 4-D mask (batch or 1, heads or 1,
    seqlen_q, seqlen_k) as transformers builds them: bool, integer 0 / 1 or additive float (0 / the dtype's lowest
    or -inf). ``fa_variants.common.mask_lengths.as_lengths`` lists the masks expressed: plain causal or full,
    and either over each sequence's first L_b keys (transformers' static KV cache with L_b slots filled; keys
    padded on the right). ``memo`` (``attention_forward``'s eager calls: transformers builds a new mask each forward and
    hands the same tensor to every layer): the answer is kept while the tensor's version counter stands, so a step reads
    the mask once, not once per layer (``common.mask_lengths``).

    Raises:
        UnsupportedAttentionError: any other mask (left padding, a sliding window that bites, packed sequences,
            an additive bias, a complex mask), a mask of the wrong rank or last two sizes, or one on the meta device.
        ValueError: a mask whose batch or heads (checked when ``batch`` / ``num_heads`` are given) neither match
            the call's nor are 1, as torch's SDPA refuses it.
    Data-dependent: one read of a few flags (eagerly with the lengths; a graph break under torch.compile).
    """
    _check_mask_shape(mask, seqlen_q, seqlen_k)
    try:
        return mask_lengths.as_lengths(mask, seqlen_q, seqlen_k, batch, num_heads, memo=memo)
    except mask_lengths.InexpressibleMask as refused:
        raise _refuse(refused.what) from None


def _check_mask_shape(mask, seqlen_q: int, seqlen_k: int) -> None:
    """A dense 4-D mask whose last two sizes are the call's exactly, as transformers builds them (TypeError from
    ``mask_lengths.check_dense``, else UnsupportedAttentionError); its batch and heads are checked by the reader."""
    mask_lengths.check_dense(mask)
    if mask.dim() != 4 or tuple(mask.shape[-2:]) != (seqlen_q, seqlen_k):
        raise _refuse(f"a mask of shape {tuple(mask.shape)} for seqlen_q {seqlen_q}, seqlen_k {seqlen_k}")


#: keywords of transformers' attention call that change the attention and that neither fa_variants nor transformers'
#: sdpa function (the fallback) apply: refused whatever the fallback. (Under attn_implementation "sdpa" or "eager",
#: models with sparse attention fold their indices into the mask; under other names they pass them here.)
_REFUSED_KWARGS = {"softcap": "logit soft-capping", "s_aux": "attention sinks", "sinks": "attention sinks",
                   "indices": "sparse attention over selected keys", "block_indices": "block-sparse attention"}


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, *, backend: str = "auto", fallback: str | None = None,
                      **kwargs):
    """The attention function transformers calls (the signature of its ``sdpa_attention_forward``).

    Args:
        module: the attention layer (its ``is_causal`` attribute says causal or not, default True).
        query: (batch, num_heads, seqlen_q, head_dim); key, value: (batch, num_heads_kv, seqlen_k,
            head_dim), any dtype ``fa_variants.attention`` serves on that device (float16/bfloat16 for the
            kernels on a GPU; float32 too on the reference backend).
        attention_mask: None (plain causal/full, as our mask function returns) or a 4-D boolean/additive
            mask, accepted when it is causal or full, over all keys or each sequence's first L_b
            (``mask_as_lengths``: the call then passes seqlens_k), or eagerly one key window per sequence (a
            padded batch: ``common.mask_windows``, run by ``fa_variants.windowed``).
        dropout: must be 0 (no dropout in the kernels). scaling: softmax scale (None: 1/sqrt(head_dim)).
        is_causal: overrides ``module.is_causal`` (as in transformers' sdpa integration).
        backend: the fa_variants backend ("auto", "fa3", "fa2", "fa1", "reference").
        fallback: None (refuse what we cannot express) or "sdpa": such a call runs transformers' own
            ``sdpa_attention_forward`` instead (a padded batch under torch.compile, dropout in training, a sliding
            window, a position bias), with a warning naming why; the other calls of the same model keep
            fa_variants. Soft-capping, attention sinks and sparse attention's indices are refused either way (sdpa's
            function drops them).
        kwargs: other transformers keywords; those of `_REFUSED_KWARGS` (``softcap``, ``s_aux``, ``sinks``,
            ``indices``, ``block_indices``), ``position_bias`` and, without a mask, a
            ``sliding_window`` shorter than seqlen_k are refused (with a mask, the mask says where the window bites:
            sdpa reads only the mask), ``output_attentions`` warns (no weights), the rest ignored. A value head_dim
            other than the query's (multi-head latent attention) and key / value batches broadcast against the
            query's are refused too (sdpa serves them: ``fallback``).

    Returns:
        (out (batch, seqlen_q, num_heads, head_dim) in query's dtype, None): no attention weights.

    Raises:
        UnsupportedAttentionError: what we cannot express, with the fallback to use (fallback None).
        ValueError: an attention_mask whose batch or heads do not broadcast to the call's (``mask_as_lengths``).
            While torch.compile traced the call, the mask's values are read when the graph runs, and a mask we
            cannot express raises UnsupportedAttentionError then.
        ValueError / TypeError: from ``fa_variants.attention`` (e.g. a backend that cannot serve the call).
    """
    for name, what in _REFUSED_KWARGS.items():  # no fallback: sdpa_attention_forward drops them too
        if kwargs.get(name) is not None:
            raise _refuse(f"{name} ({what})", "use attn_implementation='eager' for this model (transformers' sdpa "
                          "attention function ignores it too), e.g. model.set_attn_implementation('eager')")
    if kwargs.get("output_attentions") and not torch.compiler.is_compiling():
        warnings.warn("fa_variants attention returns no attention weights: output_attentions=True gives none "
                      "(as with sdpa); use attn_implementation='eager' for them", stacklevel=2)
    try:
        if torch.jit.is_tracing():  # (the mask is built unread for it: build_mask)
            raise _refuse("torch.jit.trace, which cannot record the kernels (PyTorch deprecates it for torch.compile "
                          "and torch.export, which both run fa_variants)")
        _check_expressible(query, key, value)
        causal, seqlens_k = _causal_flag(module, query, key, attention_mask, dropout, is_causal, kwargs,
                                         traced_mask=fallback is None and torch.compiler.is_compiling())
    except UnsupportedAttentionError as refused:
        if fallback is None:
            raise
        return _sdpa_fallback(refused, module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if causal is None:  # a padded batch's windows (eager)
        return windowed.attention(q, k, v, seqlens_k, softmax_scale=scaling, backend=backend), None
    leftpad_k = seqlens_q = None
    if isinstance(seqlens_k, torch.Tensor) and seqlens_k.dim() == 2:  # traced: the windows' ends, first keys (and
        seqlens_k, leftpad_k, seqlens_q = (*seqlens_k.unbind(0), None)[:3]  # query counts where causal rows move)
    # fa_variants.attention is itself one opaque node under torch.compile (the custom op)
    out = fa_variants.attention(q, k, v, causal=causal, softmax_scale=scaling, backend=backend, seqlens_k=seqlens_k,
                                leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    return out, None


def _sdpa_fallback(refused, module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    """``fallback="sdpa"``: transformers' ``sdpa_attention_forward`` on the same call, with a warning (not while
    torch.compile traces: a warning breaks a fullgraph trace). Our mask function returns None for a causal call
    whose queries are the last of a longer key range (a chunk after a KV cache), which our bottom-right ``causal``
    expresses; sdpa would read None as its top-left ``is_causal``, so that mask is passed explicitly."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not torch.compiler.is_compiling():
        warnings.warn(f"fa_variants attention cannot express {refused.what}: this call runs transformers' sdpa "
                      "attention (hf.register(fallback='sdpa'))", stacklevel=3)
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    if attention_mask is None and _module_causal(module, is_causal) and 1 < seqlen_q != seqlen_k:
        attention_mask = causal_visible(seqlen_q, seqlen_k, device=query.device)[None, None]
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def _check_expressible(query, key, value) -> None:
    """UnsupportedAttentionError for shapes transformers' sdpa takes but ``fa_variants.attention`` does not: a
    value head_dim other than the query's (multi-head latent attention, e.g. DeepSeek-V2 / V3) and key / value
    batches that broadcast against the query's. Other bad shapes are left to ``fa_variants.attention``'s errors."""
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (query, key, value)):
        return
    if value.shape[-1] != query.shape[-1]:
        raise _refuse(f"a value head_dim of {value.shape[-1]} beside a query head_dim of {query.shape[-1]} "
                      "(multi-head latent attention)")
    if not key.shape[0] == value.shape[0] == query.shape[0]:
        raise _refuse(f"key / value batch {key.shape[0]} / {value.shape[0]} broadcast against query batch "
                      f"{query.shape[0]}")


def _causal_flag(module, query, key, attention_mask, dropout, is_causal, kwargs,
                 traced_mask: bool = False) -> tuple[bool, torch.Tensor | None]:
    """``attention_forward``'s causal flag and seqlens_k for ``fa_variants.attention`` (``mask_as_lengths``);
    UnsupportedAttentionError for a call they cannot express but sdpa can (dropout, a position bias, a sliding
    window that bites, a mask other than causal or full over each sequence's first keys). ``traced_mask``
    (torch.compile tracing, no fallback): the mask's windows come from ``torch.ops.fa_variants.mask_window`` (int32
    (2, batch): seqlens_k, then leftpad_k) or, for a causal layer's query rows beyond one,
    ``torch.ops.fa_variants.mask_sequence_windows`` ((3, batch): seqlens_q too, each sequence's query count, so a
    causal batch padded on the right runs), read when the graph runs, so the mask costs no graph break; the layer's
    ``is_causal`` says which kind it must be. (A plain mask does not come here: ``build_mask`` returns None for it.)"""
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    if dropout:
        raise _refuse(f"dropout {dropout} (the kernels have none): call model.eval() or set the attention dropout to 0")
    if kwargs.get("position_bias") is not None:
        raise _refuse("position_bias (an additive position bias)")
    window = kwargs.get("sliding_window")  # a mask carries the window (sdpa reads only the mask): checked there
    if window is not None and attention_mask is None and seqlen_k > window:
        raise _refuse(f"a sliding window of {window} keys over {seqlen_k} keys")
    if attention_mask is None:
        return _module_causal(module, is_causal), None
    if not traced_mask:
        if not _may_read_padding():  # fallback="sdpa" in a trace that may not break: sdpa takes the mask unread
            raise _refuse("an attention_mask in a trace that may not break (fullgraph=True, torch.export), where it "
                          "cannot be read")
        try:
            return mask_as_lengths(attention_mask, seqlen_q, seqlen_k, query.shape[0], query.shape[1], memo=True)
        except UnsupportedAttentionError:
            if torch.compiler.is_compiling():  # (a fallback's graph break reads it: padded batches go to sdpa there)
                raise
        try:  # a padded batch: one key window per sequence (fa_variants.windowed: one call)
            return None, mask_windows.as_windows(attention_mask, seqlen_q, seqlen_k, query.shape[0], query.shape[1],
                                                 memo=True)
        except mask_lengths.InexpressibleMask as refused:
            raise _refuse(refused.what) from None
    _check_mask_shape(attention_mask, seqlen_q, seqlen_k)
    causal = _module_causal(module, is_causal)
    # one query row (a decoding step) or a full layer: no query count moves a diagonal (the two-row op's windows)
    read = torch.ops.fa_variants.mask_sequence_windows if causal and seqlen_q > 1 else torch.ops.fa_variants.mask_window
    return causal, read(attention_mask, causal, seqlen_q, seqlen_k, query.shape[0], query.shape[1], "attention_mask")


def _module_causal(module, is_causal: bool | None) -> bool:
    """The call's causal flag without a mask: ``is_causal`` when given, else the layer's ``is_causal`` (default True),
    as transformers' sdpa integration reads it."""
    return bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)


def build_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
               mask_function=None, attention_mask: torch.Tensor | None = None, **kwargs):
    """transformers' mask-interface function for our name (the signature of its ``sdpa_mask``).

    Returns None when ``attention_forward``'s causal/full flag expresses the mask exactly (plain causal or
    bidirectional mask function, no padding, kv_offset 0, queries at the end of the keys) and the caller allows the
    skip (``allow_is_causal_skip`` / ``allow_is_bidirectional_skip`` not False: models that add a bias to the mask or
    index it ask for it built); otherwise the materialised boolean mask (batch, 1, q_length, kv_length) from
    transformers' ``sdpa_mask``, which ``attention_forward`` then accepts or refuses.
    """
    # names from the submodule itself: "from transformers import masking_utils" goes through transformers' lazy
    # top-level module, which dynamo before torch 2.13 cannot import under torch.compile ("Bad import result")
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function, sdpa_mask

    bidirectional = mask_function is bidirectional_mask_function
    plain = mask_function in (None, causal_mask_function, bidirectional_mask_function)
    causal_aligned = bidirectional or (not isinstance(q_offset, torch.Tensor) and q_offset + q_length == kv_length)
    # a model that uses the mask itself (adds a bias or a learned mask to it, indexes it) asks for it built
    skip_allowed = kwargs.get("allow_is_bidirectional_skip" if bidirectional else "allow_is_causal_skip", True)
    # the padding is read (a graph break under torch.compile) only where it decides: a mask that must be built anyway
    # (a static cache's slots) is built without it and read when the graph runs (torch.ops.fa_variants.mask_window)
    # (a trace that may not break, fullgraph=True or torch.export, builds it unread: the graph reads it when it runs)
    if skip_allowed and plain and causal_aligned and not isinstance(kv_offset, torch.Tensor) and kv_offset == 0 and (
            attention_mask is None or (_may_read_padding() and bool(attention_mask.all()))):
        return None
    kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function or causal_mask_function,
                     attention_mask=attention_mask, **kwargs)


def _may_read_padding() -> bool:
    """Whether ``build_mask`` may read the 2-D attention_mask's padding on the host: eagerly yes; while
    torch.compile traces, only where the trace may break its graph there (not under ``fullgraph=True``, where Dynamo
    would stop on the read, nor under torch.export): the mask is then built unread and read when the graph runs
    (``torch.ops.fa_variants.mask_sequence_windows``: a device sync or two per layer, the same result). Never under
    torch.jit.trace, which would keep the answer for every later input (the mask goes to sdpa there, or is refused:
    ``attention_forward``)."""
    if torch.jit.is_tracing():
        return False
    return not torch.compiler.is_compiling() or host_values.trace_may_break()


def register(name: str = DEFAULT_NAME, *, backend: str = "auto", fallback: str | None = None) -> str:
    """Register fa_variants (with this backend) in transformers' attention and mask registries.

    Args:
        name: the ``attn_implementation`` string to register (default "fa_variants").
        backend: the fa_variants backend every call uses ("auto" lets the dispatcher choose).
        fallback: None (default): a call fa_variants cannot express raises UnsupportedAttentionError naming it;
            "sdpa": such a call (a padded batch under torch.compile, dropout in training, a sliding window that
            bites, ...) runs transformers' sdpa attention instead, with a warning, and every other call fa_variants.

    Returns:
        name, for ``attn_implementation=`` / ``model.set_attn_implementation``.

    Raises:
        TypeError / ValueError: name not a non-empty str; backend not a str, or not "auto" or a backend name
            (``fa_variants.dispatch.BACKENDS``); fallback neither None nor "sdpa"; checked here, not at the model's
            first forward.
        ImportError: transformers is not installed (``pip install -e '.[real]'``), in one line.
        ValueError: name is one of transformers' own implementations ("eager", "sdpa", "flash_attention_2", ...):
            registering over it would replace it for the whole process (and the refusals' advice to use "sdpa"
            would lead back here).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a non-empty str, got {one_line(name)}")
    if not name:
        raise ValueError("name must be a non-empty str, got ''")
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {one_line(backend)}")
    if backend != "auto" and backend not in dispatch.BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from auto, {', '.join(dispatch.BACKENDS)}")
    if fallback is not None and fallback != "sdpa":
        raise ValueError(f"fallback must be None or 'sdpa', got {one_line(fallback)}")
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as exc:
        raise ImportError(f"{exc}: hf.register needs transformers: pip install -e '.[real]' (transformers, gguf, "
                          "accelerate)") from None

    taken = getattr(AttentionInterface, "_global_mapping", {}).get(name)
    ours = isinstance(taken, functools.partial) and taken.func is attention_forward
    if name == "eager" or (taken is not None and not ours):
        raise ValueError(f"name {name!r} is transformers' own attention implementation; register fa_variants under "
                         f"another name (the default {DEFAULT_NAME!r})")
    AttentionInterface.register(name, functools.partial(attention_forward, backend=backend, fallback=fallback))
    AttentionMaskInterface.register(name, build_mask)
    return name
