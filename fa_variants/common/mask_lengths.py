"""A caller's attention mask read as what ``fa_variants.attention`` expresses: its ``causal`` flag and per-sequence key
lengths ``seqlens_k``. Serves the Hugging Face integration (``integrations.hf``: transformers' 4-D masks) and the SDPA
drop-in (``api.scaled_dot_product_attention``'s ``attn_mask``); host side, plain torch.

The masks expressed, with L_b the number of keys sequence b sees in its last query row:

- every key visible: (False, None); bottom-right causal (query i sees key j iff j <= i + seqlen_k - seqlen_q):
  (True, None); for seqlen_q == 1 the two coincide (True is returned);
- bottom-right causal against L_b (query i sees key j iff j <= i + L_b - seqlen_q; the keys from L_b on hidden from
  every query): (True, seqlens_k = L), e.g. a static KV cache of seqlen_k slots with L_b of them filled;
- the first L_b keys visible to every query: (False, seqlens_k = L), e.g. keys padded on the right.

Anything else (left padding, right padding of a causal batch, a sliding window that bites, packed sequences, an
additive bias other than 0 / -inf) raises ``InexpressibleMask``, whose ``what`` names the mask for the caller's own
message.

Read once (``memo=True``, transformers' eager path): the answers (refusals too) for the last few masks read are
kept (`_MEMO`, by identity and version counter; ``common.mask_windows`` keeps its key windows there too), so the
layers of a model that share one mask read it once per step. Inference tensors
have no version counter and are never kept; a change that bypasses the counter (a CUDA-graph replay,
``mask.data.copy_``, writes through ``mask.numpy()`` or DLPack) is not seen, which is why the other callers (the
SDPA drop-in, the mask op of compiled graphs) read every call.
"""
from __future__ import annotations

import threading
import weakref

import torch

from fa_variants.common import host_values


class InexpressibleMask(ValueError):
    """A mask that ``causal`` + ``seqlens_k`` cannot express; ``what`` is a phrase naming it ("a mask of shape ...",
    "this attention mask (left padding, ...)")."""

    @property
    def what(self) -> str:  # (no __init__ of its own: torch 2.11's Dynamo cannot raise a class that has one)
        return self.args[0]


#: (id(mask), reader) -> (weakref, version, call key, answer) for the MEMO_SIZE answers given or hit last (several:
#: hybrid models alternate a full and a sliding-window mask; a refused mask's refusal and its key windows,
#: ``common.mask_windows``), under _MEMO_LOCK: `read_once`
_MEMO: dict[tuple[int, str], tuple] = {}
_MEMO_LOCK = threading.Lock()
MEMO_SIZE = 8
#: elements of the mask compared per step of `_read` (query rows in chunks): its temporaries stay ~16 MiB each where a
#: long prefill's mask is GiBs (transformers builds (batch, 1, seqlen_q, seqlen_k) for a static cache)
CHUNK_ELEMENTS = 1 << 24


def as_lengths(mask: torch.Tensor, seqlen_q: int, seqlen_k: int, batch: int | None = None,
               num_heads: int | None = None, *, name: str = "attention_mask", float_min_blocks: bool = True,
               memo: bool = False) -> tuple[bool, torch.Tensor | None]:
    """``(causal, seqlens_k)`` for ``fa_variants.attention`` that express a 4-D mask (batch or 1, heads or 1,
    seqlen_q or 1, seqlen_k or 1): bool (True = attend), integer 0 / 1 (1 = attend, as transformers' 2-D
    attention_mask) or additive float: 0 attends, -inf hides, and with ``float_min_blocks`` any value at or below half
    the dtype's lowest hides too (transformers' masked value is the dtype's lowest).

    ``memo``: keep the answer for this mask tensor (`_MEMO`) and give it again while its version counter stands;
    only for masks the caller knows are written through torch ops alone (transformers builds a new one each forward).
    A CUDA-graph replay, ``.data`` or a DLPack / numpy writer changes a tensor without the counter (on the GPU, a
    reduce-overhead graph's mask held another step's answer: session 51), so the default reads every call.

    ``seqlens_k`` is a new int32 (batch,) tensor (batch: the call's, else the mask's): on the CPU when the mask is
    read eagerly (``fa_variants.attention`` checks it there and copies it over without a device sync), on the mask's
    device while torch.compile traces (its values stay tensors). The heads of the mask must agree.

    Raises:
        InexpressibleMask: a mask of another rank or of other last two sizes; one whose values cannot be read (meta,
            batched by torch.func.vmap, fake or traced by torch.export / make_fx, read inside CUDA-graph capture);
            a complex mask, an integer one with values other than 0 / 1, a float one with others than 0 / -inf
            (an attention bias); every mask the module docstring does not list.
        TypeError: a sparse or nested mask (naming ``name``).
        ValueError: a mask whose batch or heads (checked when ``batch`` / ``num_heads`` are given) neither match the
            call's nor are 1, as torch's SDPA refuses it (the message names the argument: ``name``).
    Data-dependent: one read of a few flags (eagerly with the lengths; a graph break under torch.compile).
    """
    check_shape(mask, seqlen_q, seqlen_k, batch, num_heads, name=name)
    traced = torch.compiler.is_compiling()
    if not traced:
        _check_readable(mask)
    elif torch._C._are_functorch_transforms_active():
        host_values.eagerly(_refuse_vmapped, mask)  # outside Dynamo, which cannot trace functorch's C calls
    if seqlen_q == 0 or seqlen_k == 0 or mask.shape[0] == 0 or mask.shape[1] == 0:
        return True, None  # nothing to hide: no row, or no key (every row then gives 0, LSE -inf)
    if traced:  # a graph break: the read runs eagerly (host_values.eagerly)
        return host_values.eagerly(_read, mask, seqlen_q, seqlen_k, batch, True, float_min_blocks)
    key = (batch, num_heads, seqlen_q, seqlen_k, float_min_blocks)
    causal, lengths = read_once(mask, "lengths", key, memo,
                                lambda: _read(mask, seqlen_q, seqlen_k, batch, False, float_min_blocks))
    return causal, None if lengths is None else torch.tensor(lengths, dtype=torch.int32)


def read_once(mask: torch.Tensor, reader: str, key: tuple, memo: bool, read):
    """``read()``'s answer for ``mask`` (``reader``: which answer, ``key``: the call's sizes), or its InexpressibleMask
    raised; with ``memo`` (not for inference tensors: no version counter) the answer or refusal kept in `_MEMO` and
    given again while the tensor's version counter and storage stand (a refused mask's layers then go to its key
    windows, read once too), entered last: the least recently used goes first. The version is read first: a change
    meanwhile misses. A write PyTorch does not count is not seen (through ``.data``, ``.numpy()`` or DLPack: the
    same blind spot as autograd's saved-tensor check); rebinding ``mask.data`` to another tensor is (its address)."""
    version = None if not memo or mask.is_inference() else (mask._version, mask.data_ptr())
    kept = _MEMO.get((id(mask), reader))
    if version is not None and kept is not None and kept[0]() is mask and kept[1:3] == (version, key):
        answer = kept[3]
    else:
        try:
            answer = host_values.eagerly(read)  # never a frame Dynamo compiles: its reads steer Python
        except InexpressibleMask as refused:
            answer = refused
    if version is not None:
        with _MEMO_LOCK:
            _MEMO.pop((id(mask), reader), None)
            _MEMO[(id(mask), reader)] = (weakref.ref(mask), version, key, answer)
            while len(_MEMO) > MEMO_SIZE:
                del _MEMO[next(iter(_MEMO))]
    if isinstance(answer, InexpressibleMask):
        raise InexpressibleMask(answer.what)
    return answer


def _refuse_vmapped(mask: torch.Tensor) -> None:
    """InexpressibleMask for a mask batched by torch.func.vmap, seen while traced (compiled vmap's fallback runs the
    call with is_compiling() true). Called outside Dynamo: Dynamo cannot trace functorch's C calls (a silent graph
    break)."""
    if host_values.vmapped(mask):
        raise InexpressibleMask("a mask batched by torch.func.vmap (its values cannot be read)")


def check_shape(mask: torch.Tensor, seqlen_q: int, seqlen_k: int, batch: int | None = None,
                num_heads: int | None = None, *, name: str = "attention_mask") -> None:
    """``as_lengths``'s checks of the mask's shape alone (no values read): InexpressibleMask for another rank or
    other last two sizes, ValueError naming ``name`` for a batch or heads that do not broadcast to the call's."""
    check_dense(mask, name)
    if mask.dim() != 4 or any(n not in (1, want) for n, want in zip(mask.shape[2:], (seqlen_q, seqlen_k))):
        raise InexpressibleMask(f"a mask of shape {tuple(mask.shape)} for seqlen_q {seqlen_q}, seqlen_k {seqlen_k}")
    for dim, (what, size) in enumerate((("batch", batch), ("num_heads", num_heads))):
        if size is not None and mask.shape[dim] not in (1, size):
            raise ValueError(f"{name} has shape {tuple(mask.shape)}, which does not broadcast to (batch, num_heads, "
                             f"seqlen_q, seqlen_k) = {(batch, num_heads, seqlen_q, seqlen_k)}: its {what} is "
                             f"{mask.shape[dim]}")
    if mask.is_complex():
        dtype = str(mask.dtype).removeprefix("torch.")
        raise InexpressibleMask(f"a {dtype} mask (a mask is bool, integer 0 / 1 or additive float)")


def check_dense(mask, name: str = "attention_mask") -> None:
    """TypeError (one line, naming ``name``) for a mask that is not a dense (strided) tensor: sparse or nested masks
    fail deep inside torch's reshape / sizes otherwise."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.layout != torch.strided or mask.is_nested:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {mask.layout}"
                        + (" (nested)" if mask.is_nested else ""))


def _check_readable(mask: torch.Tensor) -> None:
    """InexpressibleMask for a mask whose values cannot be read on the host here (eagerly)."""
    if mask.device.type == "meta":
        raise InexpressibleMask("a mask on the meta device (its values cannot be read)")
    why = host_values.unreadable(mask)
    if why is None and type(mask) is not torch.Tensor:
        why = "a traced or subclassed tensor (torch.export, make_fx)"
    if why is not None:
        raise InexpressibleMask(f"a mask that is {why} (its values cannot be read)" if why.startswith("a ")
                                else f"a mask {why} (its values cannot be read)")
    if mask.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise InexpressibleMask("a mask inside CUDA-graph capture (its values cannot be read there: pass causal and "
                                "seqlens_k on the GPU to fa_variants.attention)")


def invalid_values(mask: torch.Tensor, float_min_blocks: bool) -> str:
    """What a mask whose values are not a mask's (`_visible`'s flag) is called in the refusal."""
    dtype = str(mask.dtype).removeprefix("torch.")
    if not mask.is_floating_point():
        return f"a {dtype} mask with values other than 0 and 1"
    return ("an additive attention bias (a float mask with values other than 0 and -inf"
            + ("" if float_min_blocks else ": hide keys with -inf or a bool mask") + ")")


def _visible(part: torch.Tensor, float_min_blocks: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the boolean 'may attend' tensor of a slice of the mask, a 0-d flag: its values are all valid, or None)."""
    if part.dtype == torch.bool:
        return part, None
    if not part.is_floating_point():
        return part != 0, ((part == 0) | (part == 1)).all()
    blocked = part <= torch.finfo(part.dtype).min / 2 if float_min_blocks else part == float("-inf")
    return ~blocked, ((part == 0) | blocked).all()


def _read(mask: torch.Tensor, seqlen_q: int, seqlen_k: int, batch: int | None, traced: bool,
          float_min_blocks: bool) -> tuple[bool, list[int] | torch.Tensor | None]:
    """`as_lengths` on the mask: both patterns built from the counts of visible keys in the last row (causal) and
    in the first row (full), compared with the mask in chunks of query rows (whole while traced: a chunk size
    computed from symbolic sizes would recompile for every new size), the values checked on the way, all read back
    in one transfer. Returns the lengths as a list eagerly (``as_lengths`` makes the tensor), a tensor traced."""
    mask = mask.expand(*mask.shape[:2], seqlen_q, seqlen_k)
    rows = torch.arange(seqlen_q, device=mask.device)[:, None]
    keys = torch.arange(seqlen_k, device=mask.device)
    counts = {True: _visible(mask[:, :, -1], float_min_blocks)[0].sum(-1),  # (batch or 1, heads or 1)
              False: _visible(mask[:, :, 0], float_min_blocks)[0].sum(-1)}
    limits = {True: counts[True][:, :, None, None] - seqlen_q, False: counts[False][:, :, None, None] - 1}
    fits = {causal: (c == c[:, :1]).all(1) for causal, c in counts.items()}  # the heads agree
    valid = []
    step = seqlen_q if traced else max(1, CHUNK_ELEMENTS // max(1, mask.shape[0] * mask.shape[1] * seqlen_k))
    for start in range(0, seqlen_q, step):
        part, ok = _visible(mask[:, :, start:start + step], float_min_blocks)
        shift = rows[start:start + step]
        fits[True] = fits[True] & (part == (keys <= limits[True] + shift)).flatten(1).all(1)
        fits[False] = fits[False] & (part == (keys <= limits[False])).flatten(1).all(1)
        valid += [] if ok is None else [ok]
    flags = [torch.stack(valid).all() if valid else fits[True].new_ones(()), fits[True].all(),
             (counts[True] == seqlen_k).all(), fits[False].all(), (counts[False] == seqlen_k).all()]
    lengths = {causal: c[:, 0] for causal, c in counts.items()}
    if traced:
        valid, causal_fits, causal_plain, full_fits, full_plain = torch.stack(flags).tolist()
    else:
        read = torch.cat([torch.stack(flags).long(), lengths[True], lengths[False]]).tolist()
        (valid, causal_fits, causal_plain, full_fits, full_plain), rest = read[:5], read[5:]
        lengths = {True: rest[:len(rest) // 2], False: rest[len(rest) // 2:]}
    if not valid:
        raise InexpressibleMask(invalid_values(mask, float_min_blocks))
    for causal, fitting, plain in ((True, causal_fits, causal_plain), (False, full_fits, full_plain)):
        if fitting:
            if plain:
                return causal, None
            found = lengths[causal]
            if traced:
                found = found.to(torch.int32)
                return causal, found if batch is None or found.shape[0] == batch else found.expand(batch).contiguous()
            return causal, found * batch if batch is not None and len(found) != batch else found
    raise InexpressibleMask("this attention mask (padding on the left, or on the right of a causal batch: eagerly "
                            "only, as key windows; a sliding window that bites; packed sequences): only bottom-right "
                            "causal or full attention, over each sequence's first keys")
