"""A caller's attention mask read as what ``fa_variants.attention`` expresses: its ``causal`` flag and per-sequence key
lengths ``seqlens_k``. Serves the Hugging Face integration (``integrations.hf``: transformers' 4-D masks) and the SDPA
drop-in (``api.scaled_dot_product_attention``'s ``attn_mask``); host side, plain torch.

The masks expressed, with L_b the number of keys sequence b sees in its last query row:

- every key visible: (False, None); bottom-right causal (query i sees key j iff j <= i + seqlen_k - seqlen_q):
  (True, None); for seqlen_q == 1 the two coincide (True is returned);
- bottom-right causal against L_b (query i sees key j iff j <= i + L_b - seqlen_q; the keys from L_b on hidden from
  every query): (True, seqlens_k = L), e.g. a static KV cache of seqlen_k slots with L_b of them filled;
- the first L_b keys visible to every query: (False, seqlens_k = L), e.g. keys padded on the right.

Anything else (left padding, a sliding window that bites, packed sequences, an additive bias other than 0 / -inf)
raises ``InexpressibleMask``, whose ``what`` names the mask for the caller's own message.
"""
from __future__ import annotations

import weakref

import torch


class InexpressibleMask(ValueError):
    """A mask that ``causal`` + ``seqlens_k`` cannot express; ``what`` is a phrase naming it ("a mask of shape ...",
    "this attention mask (left padding, ...)")."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


#: the last mask read eagerly -> its answer: transformers hands every layer the same mask tensor, so a decoding step
#: reads it once, not once per layer ((weakref, version, call sizes and rules, answer); inference tensors are not
#: kept: they have no version counter to tell an in-place change)
_LAST: tuple | None = None


def visible(mask: torch.Tensor, *, float_min_blocks: bool = True) -> torch.Tensor:
    """The boolean 'may attend' tensor of a boolean mask, an integer 0 / 1 mask (1 = attend, as transformers' 2-D
    attention_mask) or an additive float mask: 0 attends, -inf blocks, and with ``float_min_blocks`` any value at or
    below half the dtype's lowest too (transformers' masked value is the dtype's lowest). InexpressibleMask for
    complex masks and other values."""
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        dtype = str(mask.dtype).removeprefix('torch.')
        if mask.is_complex():
            raise InexpressibleMask(f"a {dtype} mask (a mask is bool, integer 0 / 1 or additive float)")
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise InexpressibleMask(f"a {dtype} mask with values other than 0 and 1")
        return mask != 0
    blocked = mask <= torch.finfo(mask.dtype).min / 2 if float_min_blocks else mask == float("-inf")
    if not bool(((mask == 0) | blocked).all()):
        raise InexpressibleMask("an additive attention bias (a float mask with values other than 0 and -inf)")
    return ~blocked


def as_lengths(mask: torch.Tensor, seqlen_q: int, seqlen_k: int, batch: int | None = None,
               num_heads: int | None = None, *, name: str = "attention_mask",
               float_min_blocks: bool = True) -> tuple[bool, torch.Tensor | None]:
    """``(causal, seqlens_k)`` for ``fa_variants.attention`` that express a 4-D mask (batch or 1, heads or 1,
    seqlen_q or 1, seqlen_k or 1): bool, integer 0 / 1 or additive float (``visible``).

    ``seqlens_k`` is int32 (batch,) (batch: the call's, else the mask's): on the CPU when the mask is read eagerly
    (``fa_variants.attention`` checks it there and copies it over without a device sync), on the mask's device
    while torch.compile traces (its values stay tensors, so a decoding step's growing length does not recompile).
    The heads of the mask must agree.

    Raises:
        InexpressibleMask: a mask of another rank or of other last two sizes, one on the meta device or read
            inside CUDA-graph capture (its values cannot be read), and every mask the module docstring does not list.
        ValueError: a mask whose batch or heads (checked when ``batch`` / ``num_heads`` are given) neither match the
            call's nor are 1, as torch's SDPA refuses it (the message names the argument: ``name``).
    Data-dependent: one read of a few flags (eagerly with the lengths; a graph break under torch.compile).
    """
    global _LAST
    if mask.dim() != 4 or any(n not in (1, want) for n, want in zip(mask.shape[2:], (seqlen_q, seqlen_k))):
        raise InexpressibleMask(f"a mask of shape {tuple(mask.shape)} for seqlen_q {seqlen_q}, seqlen_k {seqlen_k}")
    for dim, (what, size) in enumerate((("batch", batch), ("num_heads", num_heads))):
        if size is not None and mask.shape[dim] not in (1, size):
            raise ValueError(f"{name} has shape {tuple(mask.shape)}, which does not broadcast to (batch, num_heads, "
                             f"seqlen_q, seqlen_k) = {(batch, num_heads, seqlen_q, seqlen_k)}: its {what} is "
                             f"{mask.shape[dim]}")
    if mask.device.type == "meta":
        raise InexpressibleMask("a mask on the meta device (its values cannot be read)")
    if mask.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise InexpressibleMask("a mask inside CUDA-graph capture (its values cannot be read there: pass causal and "
                                "seqlens_k on the GPU to fa_variants.attention)")
    if seqlen_q == 0 or seqlen_k == 0 or mask.shape[0] == 0 or mask.shape[1] == 0:
        return True, None  # nothing to hide: no row, or no key (every row then gives 0, LSE -inf)
    traced = torch.compiler.is_compiling()
    key = (batch, num_heads, seqlen_q, seqlen_k, float_min_blocks)
    memo = _LAST
    if not traced and memo is not None and memo[0]() is mask and not mask.is_inference() and \
            memo[1:3] == (mask._version, key):
        return memo[3]
    seen = visible(mask, float_min_blocks=float_min_blocks)
    answer = _read(seen.expand(*seen.shape[:2], seqlen_q, seqlen_k), seqlen_q, seqlen_k, batch, traced)
    if not traced and not mask.is_inference():
        _LAST = (weakref.ref(mask), mask._version, key, answer)
    return answer


#: elements of the mask compared per step of `_read` (query rows in chunks): the temporaries stay ~2 x 16 MiB of
#: bool where a long prefill's mask is GiBs (transformers builds (batch, 1, seqlen_q, seqlen_k) for a static cache)
CHUNK_ELEMENTS = 1 << 24


def _read(seen: torch.Tensor, seqlen_q: int, seqlen_k: int, batch: int | None, traced: bool):
    """`as_lengths` on the boolean mask: both patterns built from the counts of visible keys in the last row
    (causal) and in the first row (full), compared with the mask in chunks of query rows, and read back in one
    transfer."""
    rows = torch.arange(seqlen_q, device=seen.device)[:, None]
    keys = torch.arange(seqlen_k, device=seen.device)
    counts = {True: seen[:, :, -1, :].sum(-1), False: seen[:, :, 0, :].sum(-1)}  # (batch or 1, heads or 1)
    limits = {True: counts[True][:, :, None, None] - seqlen_q, False: counts[False][:, :, None, None] - 1}
    fits = {causal: (c == c[:, :1]).all(1) for causal, c in counts.items()}  # the heads agree
    step = max(1, CHUNK_ELEMENTS // max(1, seen.shape[0] * seen.shape[1] * seqlen_k))
    for start in range(0, seqlen_q, step):
        part, shift = seen[:, :, start:start + step], rows[start:start + step]
        fits[True] = fits[True] & (part == (keys <= limits[True] + shift)).flatten(1).all(1)
        fits[False] = fits[False] & (part == (keys <= limits[False])).flatten(1).all(1)
    lengths = {causal: c[:, 0] for causal, c in counts.items()}
    flags = [fits[True].all(), (counts[True] == seqlen_k).all(), fits[False].all(), (counts[False] == seqlen_k).all()]
    if traced:
        causal_fits, causal_plain, full_fits, full_plain = torch.stack(flags).tolist()
    else:
        read = torch.cat([torch.stack(flags).long(), lengths[True], lengths[False]]).tolist()
        (causal_fits, causal_plain, full_fits, full_plain), rest = read[:4], read[4:]
        half = len(rest) // 2
        lengths = {True: rest[:half], False: rest[half:]}
    for causal, fitting, plain in ((True, causal_fits, causal_plain), (False, full_fits, full_plain)):
        if fitting:
            if plain:
                return causal, None
            found = lengths[causal]
            seqlens_k = found.to(torch.int32) if traced else torch.tensor(found, dtype=torch.int32)
            if batch is not None and seqlens_k.shape[0] != batch:  # a mask broadcast over the batch
                seqlens_k = seqlens_k.expand(batch).contiguous()
            return causal, seqlens_k
    raise InexpressibleMask("this attention mask (left padding, a sliding window, packed sequences or an attention "
                            "bias): only bottom-right causal or full attention, over each sequence's first keys")
