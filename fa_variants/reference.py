"""Reference attention in plain PyTorch, and the tolerance rule every kernel test uses.

Two references (docs/design.md, "Testing rule", after the flash-attn test suite):

* the **exact** one: the maths in float64 (``attention_reference(..., dtype=torch.float64)``);
* the **same-dtype** one: what PyTorch gets doing the same maths in the input dtype
  (``dtype=q.dtype``): Q is scaled and multiplied by K in that dtype, the softmax is taken in float32 and
  P is rounded back to the input dtype before P V, as ``attention_ref(upcast=False)`` does in
  Dao-AILab/flash-attention (``flash_attn/cute/testing.py``).

A kernel passes when ``err(kernel) <= 2 * err(torch same dtype) + 1e-5``, where ``err(x) = max |x - exact|``
(``check_against_reference``); a NaN anywhere fails.

This module is also the ``reference`` backend of the dispatcher: it follows the kernel module contract
(``HEAD_DIMS``, ``DTYPES``, ``run``), computing in float32 (float64 for float64 inputs) on any device.

Conventions (docs/design.md, "Conventions"): q (batch, seqlen_q, num_heads, head_dim), k and v (batch, seqlen_k,
num_heads_kv, head_dim); out like q; LSE (batch, num_heads, seqlen_q), natural log. Causal masking is
bottom-right aligned: query i sees key j iff ``j <= i + seqlen_k - seqlen_q``. A query row that sees no key
gives O = 0 and LSE = -inf (so does seqlen_k = 0). GQA: query head h reads KV head
``h // (num_heads // num_heads_kv)``. Default softmax_scale = 1 / sqrt(head_dim).
Source: Vaswani et al. 2017, eq. (1); Dao et al., FlashAttention (2022) sec. 2.2 for the LSE.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from fa_variants.common.checks import one_line
from fa_variants.common import host_values
from fa_variants.common.scale import check_softmax_scale

#: the reference backend serves any head_dim (``None`` = no restriction; kernels list a tuple)
HEAD_DIMS: tuple[int, ...] | None = None
#: dtypes the reference backend accepts
DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: absolute slack of the tolerance rule
ATOL = 1e-5
#: the score matrix is built in query-row chunks of at most this many elements (bounds memory)
_MAX_SCORE_ELEMENTS = 1 << 26

_FULL_PRECISION = (torch.float32, torch.float64)
_MATH_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)  # attention_reference's dtype


def default_softmax_scale(head_dim: int) -> float:
    """1 / sqrt(head_dim), the scale of Vaswani et al. (2017), eq. (1). TypeError for a head_dim that is not an
    int, ValueError for head_dim < 1."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, torch.SymInt)):
        raise TypeError(f"head_dim must be an int, got {one_line(head_dim)}")
    if head_dim < 1:
        raise ValueError(f"head_dim is {head_dim}: the default softmax_scale 1 / sqrt(head_dim) needs head_dim >= 1; "
                         "pass softmax_scale")
    return 1.0 / math.sqrt(head_dim)


def causal_visible(seqlen_q: int, seqlen_k: int, *, row_start: int = 0, rows: int | None = None,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (rows, seqlen_k) mask, True where query i may see key j (bottom-right causal).

    Query row i (counted from 0 over all seqlen_q rows; this returns rows ``row_start .. row_start+rows``)
    sees key j iff ``j <= i + seqlen_k - seqlen_q``, as in flash-attn >= 2.1. ValueError (naming it) for a
    negative count or a row range outside [0, seqlen_q].
    """
    rows = seqlen_q - row_start if rows is None else rows
    for name, n in (("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k), ("row_start", row_start), ("rows", rows)):
        if isinstance(n, int) and n < 0:  # (a traced SymInt is not checked here: the caller's sizes)
            raise ValueError(f"causal_visible: {name} must be >= 0, got {n}")
    if isinstance(row_start, int) and isinstance(rows, int) and isinstance(seqlen_q, int) and row_start + rows > seqlen_q:
        raise ValueError(f"causal_visible: rows {row_start}..{row_start + rows} run past seqlen_q {seqlen_q}")
    i = torch.arange(row_start, row_start + rows, device=device).unsqueeze(1)
    j = torch.arange(seqlen_k, device=device).unsqueeze(0)
    return j <= i + (seqlen_k - seqlen_q)


def check_seqlens_k(seqlens_k, batch: int, seqlen_k: int, device: torch.device, *, values: bool = True,
                    host_ok: bool = False, name: str = "seqlens_k") -> None:
    """Validate per-sequence KV lengths: an int32 tensor of shape (batch,) on q's device with every value in
    [0, seqlen_k]. Raises TypeError / ValueError (one line naming ``seqlens_k``; TypeError also for a sparse or nested
    tensor; NotImplementedError for one batched by torch.func.vmap, whose values cannot be read). ``values=False``
    skips the value check, which reads the tensor back to the host (a device sync; impossible during CUDA-graph
    capture).
    ``host_ok``: a CPU tensor is accepted too (``fa_variants.attention`` copies it to q's device). ``name``: the
    argument the errors name (``leftpad_k``, the first keys, is checked the same way, and ``seqlens_q``, the query
    counts, against ``seqlen_k`` = seqlen_q)."""
    if not isinstance(seqlens_k, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32, got {type(seqlens_k).__name__}")
    if seqlens_k.layout != torch.strided or seqlens_k.is_nested:  # (else a deep error from aminmax or .shape)
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {seqlens_k.layout}"
                        + (" (nested)" if seqlens_k.is_nested else ""))
    if seqlens_k.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {seqlens_k.dtype}")
    if tuple(seqlens_k.shape) != (batch,):
        raise ValueError(f"{name} must have shape (batch,) = ({batch},), got {tuple(seqlens_k.shape)}")
    if seqlens_k.device != device and not (host_ok and seqlens_k.device.type == "cpu"):
        raise ValueError(f"{name} is on {seqlens_k.device} but q is on {device}")
    if values:
        _refuse_unreadable(seqlens_k, name)
    if values and batch and seqlens_k.device.type != "meta":  # a meta tensor has no values to check
        lo, hi = torch.aminmax(seqlens_k)
        lo, hi = int(lo), int(hi)
        if lo < 0 or hi > seqlen_k:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} holds {bad}, outside [0, {_limit_name(name)} = {seqlen_k}]")


def _limit_name(name: str) -> str:
    """What bounds the values of the per-sequence tensor ``name``: seqlen_q for seqlens_q, else seqlen_k."""
    return "seqlen_q" if name == "seqlens_q" else "seqlen_k"


def _refuse_unreadable(t: torch.Tensor, name: str) -> None:
    """NotImplementedError (one line naming ``name``) for lengths batched by torch.func.vmap or functionalized by
    torch.func.functionalize: their values cannot be read on the host to check them (a meta tensor's are not
    checked: shapes only)."""
    if host_values.vmapped(t):
        raise NotImplementedError(f"{name} batched by torch.func.vmap: its values are read on the host to check "
                                  "them, which vmap cannot do; fold the vmapped dimension into the batch, or give "
                                  f"{name} unbatched (in_dims None)")
    if torch._is_functional_tensor(t):  # torch.func.functionalize: its storage is not allocated
        raise NotImplementedError(f"{name} is functionalized by torch.func.functionalize: its values, read on the "
                                  "host to check them, cannot be read; call outside that transform, or trace with "
                                  "torch.compile / torch.export (they read them when the graph runs)")


def check_leftpad_k(leftpad_k, seqlens_k, batch: int, seqlen_k: int, device: torch.device, *,
                    values: bool = True, host_ok: bool = False) -> None:
    """Validate each sequence's first key (``leftpad_k``, a KV cache padded on the left; flash-attn's name): as
    ``check_seqlens_k`` (int32 (batch,), values in [0, seqlen_k]), and with ``values`` each at most its sequence's
    end, seqlens_k[b] (seqlen_k when ``seqlens_k`` is None): one line naming leftpad_k, or seqlens_k for its own
    values (checked here too, with leftpad_k's in one read back: one device sync for both)."""
    check_seqlens_k(leftpad_k, batch, seqlen_k, device, values=False, host_ok=host_ok, name="leftpad_k")
    if values:
        check_window_values(seqlens_k, leftpad_k, None, batch, seqlen_k, 0)


def check_window_values(seqlens_k, leftpad_k, seqlens_q, batch: int, seqlen_k: int, seqlen_q: int) -> None:
    """The values of a call's per-sequence tensors (each None or checked by ``check_seqlens_k`` for dtype, shape and
    device), read back at once (one device sync): seqlens_k and leftpad_k in [0, seqlen_k], each leftpad_k[b] at most
    its end (seqlens_k[b], seqlen_k without), seqlens_q in [0, seqlen_q]. One line naming the argument."""
    given = [t for t in (seqlens_k, leftpad_k, seqlens_q) if t is not None]
    if not given or not batch or any(t.device.type == "meta" for t in given):
        return
    device = given[0].device
    named = [(name, t.to(device), limit) for name, t, limit in (("seqlens_k", seqlens_k, seqlen_k),
                                                                 ("leftpad_k", leftpad_k, seqlen_k),
                                                                 ("seqlens_q", seqlens_q, seqlen_q)) if t is not None]
    for name, t, _ in named:
        _refuse_unreadable(t, name)
    stats = [x for _, t, _ in named for x in (t.amin(), t.amax())]
    if leftpad_k is not None:
        ends = leftpad_k.new_full((batch,), seqlen_k) if seqlens_k is None else seqlens_k.to(device)
        stats.append(torch.where(leftpad_k.to(device) > ends, torch.arange(batch, device=device), batch).amin())
    read = [int(x) for x in torch.stack(stats).tolist()]
    for i, (name, _, limit) in enumerate(named):
        low, high = read[2 * i], read[2 * i + 1]
        if low < 0 or high > limit:
            raise ValueError(f"{name} holds {low if low < 0 else high}, outside [0, {_limit_name(name)} = {limit}]")
    if leftpad_k is not None and read[-1] < batch:
        past = read[-1]
        raise ValueError(f"leftpad_k[{past}] = {int(leftpad_k[past])} is past seqlens_k[{past}] = {int(ends[past])} "
                         "(each sequence attends to keys [leftpad_k[b], seqlens_k[b]))")


def sequence_windows(seqlens_k: torch.Tensor | None, leftpad_k: torch.Tensor | None, seqlens_q: torch.Tensor | None,
                     batch: int, seqlen_k: int, seqlen_q: int) -> list[tuple[int, int, int]]:
    """Each sequence's (start, end, rows) on the host, the tensors given read back at once (one device sync): keys
    [leftpad_k[b], seqlens_k[b]) (0 and seqlen_k without them), rows = seqlens_q[b] (seqlen_q without): the query
    count its causal diagonal is aligned to (``attention_reference``)."""
    given = [t for t in (leftpad_k, seqlens_k, seqlens_q) if t is not None]
    read = iter(torch.stack([t.to(given[0].device) for t in given]).tolist() if given else [])
    starts = next(read) if leftpad_k is not None else [0] * batch
    ends = next(read) if seqlens_k is not None else [seqlen_k] * batch
    rows = next(read) if seqlens_q is not None else [seqlen_q] * batch
    return list(zip(starts, ends, rows))


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                        softmax_scale: float | None = None,
                        dtype: torch.dtype = torch.float64,
                        seqlens_k: torch.Tensor | None = None,
                        lse_dtype: torch.dtype | None = None,
                        leftpad_k: torch.Tensor | None = None,
                        seqlens_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward, softmax(scale * Q K^T) V, with its log-sum-exp, in plain PyTorch.

    Args:
        q: (batch, seqlen_q, num_heads, head_dim), any floating dtype, any device and strides.
        k, v: (batch, seqlen_k, num_heads_kv, head_dim); num_heads % num_heads_kv == 0. v may have its
            own head_dim (the output then has it).
        causal: bottom-right aligned causal mask (query i sees key j iff j <= i + seqlen_k - seqlen_q).
        softmax_scale: any finite real (0 and negative allowed); None means 1 / sqrt(head_dim) (head_dim >= 1).
        seqlens_k: optional int32 (batch,) per-sequence KV lengths (a KV cache padded to seqlen_k): sequence
            b attends to its first seqlens_k[b] keys only, as if k, v were k[b, :seqlens_k[b]] (causal is
            bottom-right against that length: query i sees key j iff j <= i + seqlens_k[b] - seqlen_q);
            keys past it are never read (their values may be anything, NaN included). Checked by
            ``check_seqlens_k`` (0 <= seqlens_k[b] <= seqlen_k).
        leftpad_k: optional int32 (batch,) first keys (a KV cache padded on the left; flash-attn's ``leftpad_k``):
            sequence b attends to keys [leftpad_k[b], seqlens_k[b]) (seqlen_k for the end without seqlens_k), as if
            k, v were k[b, leftpad_k[b]:seqlens_k[b]], causal bottom-right against their count; the keys before
            are never read. Checked by ``check_leftpad_k`` (0 <= leftpad_k[b] <= the end).
        seqlens_q: optional int32 (batch,) query counts (a batch padded on the right, its queries too; flash-attn's
            ``seqused_q``): sequence b's causal diagonal is bottom-right against seqlens_q[b] and its key count n,
            query i seeing key j of its window iff j <= i + n - seqlens_q[b]; the rows from seqlens_q[b] on (its
            padding) see the whole window, as they do under a causal mask with padding (transformers' and
            SDPA's), and are computed like the others. No effect without causal. Checked as seqlens_k is, against
            seqlen_q (0 <= seqlens_q[b] <= seqlen_q).
        dtype: the precision of the maths.
            ``torch.float64`` / ``torch.float32``: everything in that dtype (the exact reference).
            ``torch.float16`` / ``torch.bfloat16``: the same maths as PyTorch does it in that dtype:
            (scale * Q) K^T in ``dtype``, softmax in float32, P rounded to ``dtype``, P V in ``dtype``.
        lse_dtype: the LSE's dtype (float32 or float64) with a float32 / float64 ``dtype``: the row max times
            |scale| plus the log of the row sum taken in it, so float64 keeps an LSE that float32 cannot hold
            (|scale x score| beyond ~3.4e38); None: ``dtype``. What context parallelism merges partials with.

    Returns:
        (out, lse): out (batch, seqlen_q, num_heads, head_dim_v) in ``dtype``; lse (batch, num_heads,
        seqlen_q), natural log, in ``dtype`` when that is float32/float64, else float32. Rows that see no
        key (causal with seqlen_q > seqlen_k, or seqlen_k = 0) give out = 0 and lse = -inf; with
        seqlen_k = 0 the output is still connected to q, k, v for autograd (zero gradients). A key a row
        cannot see contributes exactly 0 to it, even when V is inf or NaN there (the kernels differ: see
        ``fa_variants.attention``), under torch.compile and torch.func.vmap too (`_nonfinite_keys`). Under
        ``torch.autocast`` the maths is still ``dtype``'s (autocast is turned off inside: it made a float32
        reference bfloat16).

    Raises:
        TypeError: causal not a bool; q, k or v not a floating-point tensor; dtype not a floating-point
            torch.dtype; softmax_scale not a real number.
        ValueError: softmax_scale not finite, or None with head_dim 0; not 4-D; batch, seqlen_k, num_heads_kv
            (k against v) or head_dim (q against k) that differ; num_heads not a multiple of num_heads_kv; tensors
            on different devices (``_check_reference_inputs``).
    """
    _check_reference_inputs(q, k, v, dtype, softmax_scale, causal)
    device_type = q.device.type
    if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):  # its dtype, not autocast's
        with torch.autocast(device_type, enabled=False):
            return attention_reference(q, k, v, causal=causal, softmax_scale=softmax_scale, dtype=dtype,
                                       seqlens_k=seqlens_k, lse_dtype=lse_dtype, leftpad_k=leftpad_k,
                                       seqlens_q=seqlens_q)
    batch, seqlen_q, num_heads, head_dim = q.shape
    seqlen_k, num_heads_kv, head_dim_v = k.shape[1], k.shape[2], v.shape[3]
    for t, name, limit in ((seqlens_k, "seqlens_k", seqlen_k), (leftpad_k, "leftpad_k", seqlen_k),
                           (seqlens_q, "seqlens_q", seqlen_q)):
        if t is not None:
            check_seqlens_k(t, batch, limit, q.device, values=False, name=name)
    check_window_values(seqlens_k, leftpad_k, seqlens_q, batch, seqlen_k, seqlen_q)  # (all values in one read)
    seqlens_q = seqlens_q if causal else None  # (the diagonal is all it moves)
    windows = [t for t in (seqlens_k, leftpad_k, seqlens_q) if t is not None]
    if windows and batch > 0 and all(t.device.type != "meta" for t in windows):  # meta: shapes only, below
        return _per_sequence(q, k, v, sequence_windows(seqlens_k, leftpad_k, seqlens_q, batch, seqlen_k, seqlen_q),
                             causal=causal, softmax_scale=softmax_scale, dtype=dtype, lse_dtype=lse_dtype)
    scale = default_softmax_scale(head_dim) if softmax_scale is None else float(softmax_scale)
    low = dtype not in _FULL_PRECISION
    if lse_dtype not in (None, torch.float32, torch.float64):
        raise TypeError(f"lse_dtype must be torch.float32 or torch.float64, got {lse_dtype}")
    if low or lse_dtype is None:  # 16-bit maths: the LSE float32, as PyTorch's softmax gives it
        lse_dtype = torch.float32 if low else dtype
    if num_heads_kv == 0 and num_heads == 0:
        group = 1
    elif num_heads_kv == 0 or num_heads % num_heads_kv != 0:
        raise ValueError(f"num_heads {num_heads} not divisible by num_heads_kv {num_heads_kv}")
    else:
        group = num_heads // num_heads_kv
    # GQA without copying K/V: query head h = kv_head * group + g reads KV head kv_head.
    qg = q.to(dtype).reshape(batch, seqlen_q, num_heads_kv, group, head_dim)
    if low:
        qg = qg * scale  # rounded to `dtype`, as PyTorch would
    else:
        qg, raw_scale = _scaled_operand(qg, scale)
    kd, vd = k.to(dtype), v.to(dtype)
    if seqlen_k == 0 or qg.numel() == 0 or vd.shape[-1] == 0:
        # nothing to normalise: out = 0 and lse = -inf, computed through the empty products so that the
        # result stays connected to q, k and v for autograd (their gradients are then exactly 0)
        s = torch.einsum("bqhgd,bkhd->bhgqk", qg, kd)
        out = torch.einsum("bhgqk,bkhd->bqhgd", s, vd).reshape(batch, seqlen_q, num_heads, head_dim_v)
        if seqlen_k == 0:  # the log of an empty sum, -inf, through the same products (the LSE's gradient too)
            lse = torch.logsumexp(s, dim=-1).reshape(batch, num_heads, seqlen_q).to(lse_dtype)
        else:
            lse = torch.full((batch, num_heads, seqlen_q), -math.inf, dtype=lse_dtype, device=q.device)
        return out, lse
    outs, lses = [], []  # per chunk of query rows, joined at the end (no in-place writes: torch.func.vmap runs this)
    vd_finite, bad_keys, v_unread = _nonfinite_keys(vd, causal)
    if v_unread:  # V's non-finite entries zeroed; `_nonfinite_terms` adds their share to the rows that see them
        vd_finite = torch.where(torch.isfinite(vd), vd, torch.zeros((), dtype=vd.dtype, device=vd.device))
    kd_finite, bad_k, _ = _nonfinite_keys(kd, causal)  # K's values unread: its scores as they are (only dQ differs)
    rows = max(1, _MAX_SCORE_ELEMENTS // max(1, batch * num_heads * seqlen_k))
    for r0 in range(0, seqlen_q, rows):
        r1 = min(seqlen_q, r0 + rows)
        visible = (causal_visible(seqlen_q, seqlen_k, row_start=r0, rows=r1 - r0, device=q.device)
                   if causal else None)
        s = _scores(qg[:, r0:r1], kd, kd_finite, bad_k, visible)  # (B, Hkv, G, rows, Nk)
        if low:
            m, p = _softmax_scaled(s.float(), visible)
        else:
            m, p = _softmax_raw(s, raw_scale, visible, lse_dtype)
        p = p.to(dtype)
        o = torch.einsum("bhgqk,bkhd->bqhgd", p, vd_finite)
        if bad_keys is not None:
            o = o + _masked_product(p, vd, bad_keys, visible)
        elif v_unread:
            o = o + _nonfinite_terms(p, vd, visible)
        outs.append(o.reshape(batch, r1 - r0, num_heads, head_dim_v))
        lses.append(m.reshape(batch, num_heads, r1 - r0).to(lse_dtype))
    if len(outs) == 1:  # contiguous, as the kernels' (einsum may hand back a permuted layout)
        return outs[0].contiguous(), lses[0].contiguous()
    return torch.cat(outs, dim=1), torch.cat(lses, dim=2)


def _check_reference_inputs(q, k, v, dtype, softmax_scale, causal) -> None:
    """attention_reference's argument rules (its docstring), one line naming the argument: before, a k of batch 1
    was broadcast over q's batch by einsum without a word, other mismatches failed inside einsum / reshape, and a
    str or NaN softmax_scale was taken. Not ``api._check_inputs`` (api imports this module), whose rules differ
    on purpose: here q, k, v may have different dtypes, v its own head_dim, head_dim may be 0, and the scale any
    finite float (``check_softmax_scale(kernel_range=False)``)."""
    if not isinstance(causal, bool):  # a truthy "no" or None must not pick a mask
        raise TypeError(f"causal must be a bool, got {one_line(causal)}")
    if softmax_scale is not None:
        check_softmax_scale(softmax_scale, kernel_range=False)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            what = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{name} must be a floating-point tensor, got {what}")
    if dtype not in _MATH_DTYPES:  # (e4m3 and the like: no matmul on the CPU, and not what a reference is)
        raise TypeError(f"dtype must be one of torch.float64, float32, float16, bfloat16, got {one_line(dtype)}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (batch, seqlen, heads, head_dim); got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise ValueError(f"q, k, v must have one batch; got shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if k.shape[1:3] != v.shape[1:3]:
        raise ValueError(f"k has shape {tuple(k.shape)} but v has {tuple(v.shape)}: seqlen_k and num_heads_kv "
                         "must match")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"q has head_dim {q.shape[3]} but k has {k.shape[3]}; they must match (v's may differ)")


def _per_sequence(q, k, v, windows: list[tuple[int, int, int]], causal: bool,
                  **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """attention_reference per group of sequences sharing one window (start, end, rows) (`sequence_windows`), on
    k[:, start:end]: causal, its first ``rows`` query rows bottom-right against the window and the rest of them
    seeing all of it (`row_parts`)."""
    groups: dict[tuple[int, int, int], list[int]] = {}
    for b, window in enumerate(windows):
        groups.setdefault(window, []).append(b)
    outs, lses = [None] * len(windows), [None] * len(windows)
    for (start, end, count), members in groups.items():
        index = torch.tensor(members, device=q.device)
        qg = q.index_select(0, index)
        kg, vg = (t.index_select(0, index)[:, start:end] for t in (k, v))
        o, l = over_row_parts(count, q.shape[1], causal,
                              lambda rows, part_causal: attention_reference(qg[:, rows], kg, vg, causal=part_causal,
                                                                            **kwargs))
        for i, b in enumerate(members):
            outs[b], lses[b] = o[i], l[i]
    return torch.stack(outs), torch.stack(lses)


def row_parts(count: int, seqlen_q: int, causal: bool) -> list[tuple[slice, bool]]:
    """The query rows of a sequence whose causal diagonal is aligned to its first ``count`` rows (``seqlens_q``), as
    plain calls on its key window: [(rows [0, count), causal), (rows [count, seqlen_q), full)], the empty one left
    out; without causal (or count = seqlen_q) one part, every row."""
    if not causal or count >= seqlen_q:
        return [(slice(0, seqlen_q), causal)]
    return [part for part in ((slice(0, count), True), (slice(count, seqlen_q), False)) if part[0].stop > part[0].start]


def over_row_parts(count: int, seqlen_q: int, causal: bool, run) -> tuple[torch.Tensor, torch.Tensor]:
    """``run(rows, causal)`` -> (out, lse) of each of `row_parts`, joined along the query rows (out's dim 1, lse's
    dim 2); one part's result as it is."""
    parts = [run(rows, part_causal) for rows, part_causal in row_parts(count, seqlen_q, causal)]
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 2)


def _nonfinite_keys(v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """(V with the rows of keys holding an inf/NaN zeroed, the indices of those keys, False); (v, None, False) if none,
    and without a causal mask (every row sees every key: nothing to keep apart).

    A key the mask hides from a row must contribute exactly 0 to it, even when V is inf or NaN there
    (P = 0 times V = inf would be NaN in P V); such keys are added back by ``_masked_product``.
    Where V's values cannot steer Python (torch.compile tracing this code, ``torch.func.vmap`` over K or V, fake and
    meta tensors: ``host_values.unreadable``), (v, None, True): for V the caller zeroes its non-finite entries and
    adds what they give the rows that see them with `_nonfinite_terms`, which reads no value on the host (for K,
    whose scores are masked anyway, nothing is done). That path is
    right wherever it runs, so the compile check here may be taken in a frame that torch.compile compiles on its
    own while the caller runs eagerly (it then costs four more products, nothing else)."""
    if not causal:
        return v, None, False
    if torch.compiler.is_compiling() or host_values.unreadable(v) is not None:
        return v, None, True
    bad = (~torch.isfinite(v)).flatten(2).any(dim=2).any(dim=0)  # (Nk,): a key with a non-finite V anywhere
    if not bool(bad.any()):
        return v, None, False
    keys = bad.nonzero().squeeze(1)
    return v.index_fill(1, keys, 0), keys, False


def _nonfinite_terms(p: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """What V's inf / NaN entries add to the rows that see their keys, without a value read on the host (for
    `_nonfinite_keys`' third answer): the sum of P V over a row's visible keys is NaN where one of its terms is
    NaN (V NaN, or P = 0 times V = +-inf) or where +inf and -inf meet, else +-inf where one is; a hidden key adds
    nothing. p (B, Hkv, G, rows, Nk), exactly 0 at hidden keys; v (B, Nk, Hkv, D); visible (rows, Nk). Returns
    (B, rows, Hkv, G, D): 0, +-inf or NaN, to add to P V over V's finite entries."""
    seen = visible[None, None, None].expand_as(p)
    live, dead = (seen & (p > 0)).to(v.dtype), (seen & (p == 0)).to(v.dtype)  # p NaN: the row is NaN already

    def count(weights: torch.Tensor, hit: torch.Tensor) -> torch.Tensor:  # visible keys with a hit, per row and dim
        return torch.einsum("bhgqk,bkhd->bqhgd", weights, hit.to(v.dtype))

    nan = count(seen.to(v.dtype), v.isnan()) + count(dead, v.isinf())
    zero = torch.zeros((), dtype=v.dtype, device=v.device)
    return (torch.where(nan > 0, math.nan, zero) + torch.where(count(live, v == math.inf) > 0, math.inf, zero)
            + torch.where(count(live, v == -math.inf) > 0, -math.inf, zero))


def _scores(qg: torch.Tensor, k: torch.Tensor, k_finite: torch.Tensor, bad: torch.Tensor | None,
            visible: torch.Tensor | None) -> torch.Tensor:
    """Q K^T: qg (B, rows, Hkv, G, D), k (B, Nk, Hkv, D) -> (B, Hkv, G, rows, Nk); (k_finite, bad) is
    ``_nonfinite_keys(k)``, made once for every row chunk. A key with an inf / NaN in K gives its product only to the
    rows that see it (``visible``; None: every row): a hidden key's score is masked anyway, but its 0 * inf in the
    gradient dQ = dS K would make every row's dQ NaN."""
    if bad is None or visible is None:
        return torch.einsum("bqhgd,bkhd->bhgqk", qg, k)
    seen = visible.index_select(1, bad)[None, :, :, None, None]  # (1, rows, K, 1, 1)
    kb = torch.where(seen, k.index_select(1, bad)[:, None], torch.zeros((), dtype=k.dtype, device=k.device))
    scores = torch.einsum("bqhgd,bkhd->bhgqk", qg, k_finite)
    return scores.index_copy(-1, bad, torch.einsum("bqhgd,bqkhd->bhgqk", qg, kb))


def _masked_product(p: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                    visible: torch.Tensor | None) -> torch.Tensor:
    """sum over the given keys of P[.., key] * V[key], where only keys a row sees contribute (a masked key
    adds exactly 0, not 0 * inf = NaN). p (B, Hkv, G, rows, Nk), v (B, Nk, Hkv, D); returns (B, rows, Hkv,
    G, D)."""
    pk = p.index_select(-1, keys)                                    # (B, Hkv, G, rows, K)
    vk = v.index_select(1, keys).permute(0, 2, 1, 3)[:, :, None, None]  # (B, Hkv, 1, 1, K, D)
    if visible is not None:  # V zeroed where the row cannot see the key, before the product: the product's
        # gradients (dP = V dO, dV = P dO) then hold no 0 * inf / 0 * NaN either
        vk = torch.where(visible.index_select(1, keys)[..., None], vk, torch.zeros((), dtype=vk.dtype,
                                                                                   device=vk.device))
    return (pk.unsqueeze(-1) * vk).sum(-2).permute(0, 3, 1, 2, 4)   # (B, Hkv, G, rows, K, D) summed over K


def _softmax_scaled(s: torch.Tensor, visible: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(lse, P) of already-scaled scores, as PyTorch does it; a row that sees no key gets lse -inf, P 0."""
    if visible is not None:
        s = s.masked_fill(~visible, -math.inf)
    # a row without keys: logsumexp's and exp(s - m)'s backward there are NaN (-inf + inf) in branches torch.where
    # drops, which anomaly detection (torch.autograd.set_detect_anomaly) reports: such rows are worked on as zeros
    empty = s.amax(dim=-1, keepdim=True).detach() == -math.inf
    m = torch.logsumexp(s.masked_fill(empty, 0), dim=-1, keepdim=True)
    p = torch.exp(s.masked_fill(empty, 0) - m)
    return m.masked_fill(empty, -math.inf), torch.where(empty, torch.zeros_like(s), p)


def _scaled_operand(qg: torch.Tensor, scale: float) -> tuple[torch.Tensor, float]:
    """(the Q operand of the score product, the scale ``_softmax_raw`` applies after it): |scale| < 1 is folded into
    Q first, so the products overflow only where the scaled scores do (huge finite Q and K with a small scale gave
    inf - inf = NaN; PyTorch's math SDPA scales before the product too); a larger scale is applied after the row
    max (``_softmax_raw``), so that products that fit are not pushed past the dtype's range by it."""
    if abs(scale) < 1:
        return qg * scale, 1.0
    return qg, scale


def _softmax_raw(s: torch.Tensor, scale: float, visible: torch.Tensor | None,
                 lse_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(lse, P) of softmax(scale * s) from raw scores, subtracting the row max before scaling, so that a
    scale whose products overflow (|scale s| beyond the dtype's range) still gives finite P, not inf - inf.
    softmax(c s) = softmax(|c| (sign(c) s)); the row max of sign(c) s is the max of the scaled scores."""
    s = -s if scale < 0 else s
    if visible is not None:
        s = s.masked_fill(~visible, -math.inf)
    # the row max is only a shift (softmax and the LSE do not depend on it), so no gradient flows through it: with
    # one, autograd would add |scale| x (a sum that is 0 only in exact arithmetic) to the max's score, an error that
    # grows with the scale (1e3: 4x torch's softmax gradient; 1e4: 0.2 where the exact gradient is 0)
    m = s.amax(dim=-1, keepdim=True).detach()
    empty = m == -math.inf  # a row that sees no key: P = 0, lse = -inf
    z = (s - torch.where(empty, torch.zeros_like(m), m)) * abs(scale)
    if visible is not None:  # masked keys get weight 0 even when scale is 0 (-inf * 0 would be NaN)
        z = z.masked_fill(~visible, -math.inf)
    p = torch.exp(z)
    total = p.sum(dim=-1, keepdim=True)
    # a row without keys has total 0: p / total and log(total) in the branches torch.where drops would be 0 / 0 and
    # -inf, with NaN gradients that anomaly detection reports (the kept branches never read them); 1 there instead
    total = torch.where(empty, torch.ones_like(total), total)
    wide = s.dtype if lse_dtype is None else lse_dtype  # the LSE's own dtype (float64: no overflow of m |scale|)
    # a visible score of +inf: the LSE is +inf (s - m = inf - inf made it NaN; O is not finite either way)
    lse = torch.where(empty, torch.full((), -math.inf, dtype=wide, device=m.device),
                      torch.where(m == math.inf, torch.full((), math.inf, dtype=wide, device=m.device),
                                  m.to(wide) * abs(scale) + torch.log(total).to(wide)))
    return lse, torch.where(empty, torch.zeros_like(p), p / total)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
        softmax_scale: float, seqlens_k: torch.Tensor | None = None,
        partial: bool = False, leftpad_k: torch.Tensor | None = None,
        seqlens_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``reference`` backend (kernel module contract): float32 maths (float64 for float64 inputs).

    Returns (out, lse): out (batch, seqlen_q, num_heads, head_dim) in q.dtype, lse float32 (batch, num_heads,
    seqlen_q). With ``partial`` (a partial result that context parallelism merges with others) nothing is
    rounded: out stays in the maths' dtype (float32, float64 for float64 inputs) and the lse comes in float64,
    computed in it (``attention_reference``'s lse_dtype), so a merged row is rounded to q.dtype once, at the end.
    Works on any device and supports autograd (it is plain PyTorch).
    """
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    out, lse = attention_reference(q, k, v, causal=causal, softmax_scale=softmax_scale, dtype=dtype,
                                   seqlens_k=seqlens_k, lse_dtype=torch.float64 if partial else None,
                                   leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    if partial:
        return out, lse
    return out.to(q.dtype), lse.float()


#: elements of one (batch, num_heads, rows, keys) score-sized tensor in ``run_backward``'s query-row chunks: 2^26,
#: 256 MiB in float32 (a chunk has one row at least, so batch x num_heads x seqlen_k above it makes a chunk that
#: size); six or seven such tensors are alive at once at the peak
BACKWARD_CHUNK_ELEMENTS = 1 << 26


def run_backward(grad_out: torch.Tensor, grad_lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, *, causal: bool, softmax_scale: float,
                 seqlens_k: torch.Tensor | None = None,
                 chunk_elements: int | None = None,
                 leftpad_k: torch.Tensor | None = None,
                 seqlens_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of ``run``'s (out, lse) for upstream gradients (grad_out, grad_lse), written out
    (no autograd: the custom op's backward calls it where autograd is off), in ``run``'s precision.

    With S = scale Q K^T (masked), P = softmax(S), O = P V: dV = P^T dO; dP = dO V^T (0 where masked);
    dS = P * (dP - rowsum(P * dP) + dLSE); dQ = scale dS K; dK = scale dS^T Q (GQA: dK, dV summed over the query
    heads of a KV head). Source: Dao et al., FlashAttention (2022), Appendix B.2, eq. (backward), plus the LSE
    term (d LSE / d S = P). rowsum(P * dP) is the paper's rowsum(dO * O) summed the way PyTorch's softmax
    backward sums it: where P is one-hot (a large scale) it cancels dP exactly, where dO . O would leave a
    rounding error that scale multiplies. A key a row cannot see gets dP = 0 and dS = 0, so an inf / NaN in V or K
    there gives no NaN (it contributes exactly 0 to the output too). ``seqlens_k`` (``run``'s): each sequence's gradients
    from its own first seqlens_k[b] keys; dK, dV are 0 past them (``leftpad_k``: from keys [leftpad_k[b], seqlens_k[b]),
    dK, dV 0 outside; ``seqlens_q``: the causal diagonal of each sequence aligned to its query count, `row_parts`).
    Shapes as ``run``'s inputs; q.dtype out.

    Memory: the query rows go in chunks (FlashAttention-2's backward, Algorithm 2, with the roles of its loops
    swapped: here the outer loop runs over query rows and each chunk sees all its keys, so its softmax is exact
    without the forward's LSE), each chunk's score-sized tensors at most ``chunk_elements`` elements (default
    ``BACKWARD_CHUNK_ELEMENTS``; one row at least, whatever its size), dK and dV summed over the chunks in place.
    Causal chunks stop at the last key their last row sees. The rows do not interact, so the result is the unchunked
    one up to the order of dK's and dV's sums.
    """
    seqlens_q = seqlens_q if causal else None  # (the diagonal is all it moves)
    if any(t is not None for t in (seqlens_k, leftpad_k, seqlens_q)) and q.shape[0] > 0:
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        windows = sequence_windows(seqlens_k, leftpad_k, seqlens_q, q.shape[0], k.shape[1], q.shape[1])
        for b, (start, end, count) in enumerate(windows):
            keys = slice(start, max(start, end))
            for rows, part_causal in row_parts(count, q.shape[1], causal):
                g = run_backward(grad_out[b:b + 1, rows], grad_lse[b:b + 1, :, rows], q[b:b + 1, rows],
                                 k[b:b + 1, keys], v[b:b + 1, keys], causal=part_causal, softmax_scale=softmax_scale,
                                 chunk_elements=chunk_elements)
                dq[b, rows] = g[0][0]
                dk[b, keys] += g[1][0]
                dv[b, keys] += g[2][0]
        return dq, dk, dv
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    batch, seqlen_q, num_heads, head_dim = q.shape
    seqlen_k, num_heads_kv = k.shape[1], k.shape[2]
    if seqlen_k == 0 or q.numel() == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    budget = BACKWARD_CHUNK_ELEMENTS if chunk_elements is None else chunk_elements
    rows = max(1, min(seqlen_q, budget // (batch * num_heads * seqlen_k)))
    qg = q.to(dtype).reshape(batch, seqlen_q, num_heads_kv, num_heads // num_heads_kv, head_dim)
    dog = grad_out.to(dtype).reshape(qg.shape[:-1] + (-1,))
    dlse = grad_lse.to(dtype).reshape(batch, num_heads_kv, num_heads // num_heads_kv, seqlen_q, 1)
    kd, vd = k.to(dtype), v.to(dtype)
    dq, dk, dv = torch.zeros_like(qg), torch.zeros_like(kd), torch.zeros_like(vd)
    for start in range(0, seqlen_q, rows):
        stop = min(seqlen_q, start + rows)
        keys = min(seqlen_k, max(0, stop + seqlen_k - seqlen_q)) if causal else seqlen_k  # the last row's last key
        if keys == 0:  # no row of the chunk sees a key: its dQ stays 0
            continue
        visible = causal_visible(seqlen_q, seqlen_k, row_start=start, rows=stop - start,
                                 device=q.device)[:, :keys] if causal else None
        g = _backward_rows(dog[:, start:stop], dlse[..., start:stop, :], qg[:, start:stop], kd[:, :keys],
                           vd[:, :keys], softmax_scale, visible)
        dq[:, start:stop] = g[0]
        dk[:, :keys] += g[1]  # the keys past the chunk's last get nothing from it
        dv[:, :keys] += g[2]
    return dq.reshape(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _backward_rows(dog, dlse, qg, kd, vd, softmax_scale: float, visible: torch.Tensor | None):
    """``run_backward`` of one chunk of query rows (grouped as (batch, rows, num_heads_kv, group, ...)) against keys
    kd, vd (the chunk's visible range): (dq of the rows, dk, dv of those keys), in the inputs' dtype."""
    q_operand, raw_scale = _scaled_operand(qg, softmax_scale)  # as the forward (attention_reference)
    _, p = _softmax_raw(torch.einsum("bqhgd,bkhd->bhgqk", q_operand, kd), raw_scale, visible)  # S freed inside
    dv = torch.einsum("bhgqk,bqhgd->bkhd", p, dog)
    dp = torch.einsum("bqhgd,bkhd->bhgqk", dog, vd)
    if visible is not None:
        dp = dp.masked_fill(~visible, 0)
        kd = torch.where(kd.isfinite(), kd, 0)  # dS = 0 at a hidden key; a row that sees a non-finite K has dS NaN
    ds = p * (dp - (p * dp).sum(-1, keepdim=True) + dlse)
    dq = softmax_scale * torch.einsum("bhgqk,bkhd->bqhgd", ds, kd)
    dk = softmax_scale * torch.einsum("bhgqk,bqhgd->bkhd", ds, qg)
    return dq, dk, dv


# ----------------------------------------------------------------------------------------- tolerance rule

@dataclass(frozen=True)
class References:
    """The two references of one input: exact (float64) and PyTorch in the input dtype."""

    out: torch.Tensor        # float64 (B, Nq, H, D)
    lse: torch.Tensor        # float64 (B, H, Nq)
    out_torch: torch.Tensor  # input dtype (B, Nq, H, D)
    lse_torch: torch.Tensor  # float32 (B, H, Nq)


def references(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
               softmax_scale: float | None = None, seqlens_k: torch.Tensor | None = None,
               leftpad_k: torch.Tensor | None = None, seqlens_q: torch.Tensor | None = None) -> References:
    """Both references for one input, computed on q's device (compute once, check many backends).

    Raises:
        ValueError: q is an 8-bit float (FP8 has its own emulation reference, fa_variants.fp8).
    """
    if q.dtype.itemsize == 1:
        raise ValueError(f"no same-dtype PyTorch reference for {q.dtype}; FP8 uses its own emulation "
                         "reference with a stated bound")
    out, lse = attention_reference(q, k, v, causal=causal, softmax_scale=softmax_scale, dtype=torch.float64,
                                   seqlens_k=seqlens_k, leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    out_t, lse_t = attention_reference(q, k, v, causal=causal, softmax_scale=softmax_scale, dtype=q.dtype,
                                       seqlens_k=seqlens_k, leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    return References(out, lse, out_t, lse_t)


def max_abs_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| in float64; 0 where both hold the same value (equal infinities included);
    NaN if x has a NaN; 0.0 for empty tensors. TypeError for a non-tensor, ValueError for shapes that differ."""
    for name, t in (("x", x), ("ref", ref)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"max_abs_error: {name} must be a torch.Tensor, got {type(t).__name__}")
    if x.shape != ref.shape:
        raise ValueError(f"shape {tuple(x.shape)} differs from the reference's {tuple(ref.shape)}")
    if x.numel() == 0:
        return 0.0
    x64, r64 = x.double(), ref.double()
    diff = torch.where(x64 == r64, torch.zeros_like(x64), (x64 - r64).abs())
    if torch.isnan(diff).any():
        return math.nan
    return diff.max().item()


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref||_2 / ||ref||_2 in float64 (0 when both are zero). Raises ValueError for shapes that differ (as
    ``max_abs_error``; it broadcast them before)."""
    if x.shape != ref.shape:
        raise ValueError(f"shape {tuple(x.shape)} differs from the reference's {tuple(ref.shape)}")
    x64, r64 = x.double(), ref.double()
    denom = r64.norm().item()
    num = (x64 - r64).norm().item()
    return num / denom if denom > 0 else num


class Check(NamedTuple):
    """Outcome of the tolerance rule: ok iff err_kernel <= bound = 2 * err_torch + ATOL (NaN fails)."""

    ok: bool
    err_kernel: float
    err_torch: float
    bound: float

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "FAIL"
        return (f"{verdict}: err {self.err_kernel:.3e} vs bound {self.bound:.3e} "
                f"(= 2 * torch same-dtype err {self.err_torch:.3e} + {ATOL:g})")


def _rule(err_kernel: float, err_torch: float) -> Check:
    bound = 2.0 * err_torch + ATOL
    ok = math.isfinite(err_kernel) and math.isfinite(bound) and err_kernel <= bound
    return Check(bool(ok), err_kernel, err_torch, bound)


def check_against_reference(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            causal: bool = False, softmax_scale: float | None = None, *,
                            refs: References | None = None, seqlens_k: torch.Tensor | None = None,
                            leftpad_k: torch.Tensor | None = None, seqlens_q: torch.Tensor | None = None) -> Check:
    """The testing rule for a kernel's output: err(out) <= 2 * err(torch same dtype) + 1e-5.

    err(x) = max |x - exact float64 reference|. NaN in ``out`` always fails, and so does a non-finite
    same-dtype reference (the rule does not apply there; use a dedicated criterion such as ``rel_l2``).

    Args:
        out: (batch, seqlen_q, num_heads, head_dim), the kernel's output for (q, k, v).
        refs: precomputed ``references(q, k, v, ...)`` (saves recomputing for several backends).
        seqlens_k, leftpad_k, seqlens_q: the per-sequence windows ``out`` was computed with
            (``attention_reference``), when ``refs`` is not given.

    Returns:
        Check(ok, err_kernel, err_torch, bound), a NamedTuple (unpacks as a 4-tuple).

    Raises:
        TypeError: out not a tensor, refs not a ``References``; what ``attention_reference`` raises for the
            inputs. ValueError: out's shape not the reference's.
    """
    refs = _refs(out, "out", q, k, v, causal, softmax_scale, refs, seqlens_k, leftpad_k, seqlens_q)
    return _rule(max_abs_error(out, refs.out), max_abs_error(refs.out_torch, refs.out))


def _refs(x, name: str, q, k, v, causal, softmax_scale, refs, seqlens_k, leftpad_k=None,
          seqlens_q=None) -> "References":
    """``refs``, or the references of these inputs; x (the checked output, ``name``) a tensor, refs a References."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if refs is not None and not isinstance(refs, References):
        raise TypeError(f"refs must be a References (fa_variants.reference.references(...)), got {type(refs).__name__}")
    return refs or references(q, k, v, causal=causal, softmax_scale=softmax_scale, seqlens_k=seqlens_k,
                              leftpad_k=leftpad_k, seqlens_q=seqlens_q)


def check_lse(lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              causal: bool = False, softmax_scale: float | None = None, *,
              refs: References | None = None, seqlens_k: torch.Tensor | None = None,
              leftpad_k: torch.Tensor | None = None, seqlens_q: torch.Tensor | None = None) -> Check:
    """The same rule for the LSE (batch, num_heads, seqlen_q): err(lse) <= 2 * err(torch lse) + 1e-5.

    Rows that see no key must hold exactly -inf (a finite value there is an infinite error). ``refs`` and
    ``seqlens_k``, ``leftpad_k`` and ``seqlens_q`` as for ``check_against_reference``, and the same errors (naming
    lse).
    """
    refs = _refs(lse, "lse", q, k, v, causal, softmax_scale, refs, seqlens_k, leftpad_k, seqlens_q)
    return _rule(max_abs_error(lse, refs.lse), max_abs_error(refs.lse_torch, refs.lse))
