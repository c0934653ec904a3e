"""Context parallelism (ring attention) over ``torch.distributed``: one sequence split over several processes.

    import torch.distributed as dist
    from fa_variants.distributed import context_parallel_attention, zigzag_shard, zigzag_unshard
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = (zigzag_shard(t, 1, rank, world) for t in (q_full, k_full, v_full))  # (B, ~N/world, H, D)
    out = context_parallel_attention(q, k, v, causal=True, layout="zigzag")        # this rank's rows of O

**Ring** (Liu, Zaharia and Abbeel, "Ring Attention with Blockwise Transformers", 2023). Every rank keeps its
query shard and passes its K/V shard around the ring: at step s (0 <= s < world) rank r holds the K/V shard of
rank ``(r - s) mod world``, sends it to rank r + 1 and receives the next one from rank r - 1 with
``torch.distributed.batch_isend_irecv`` while the attention of step s runs on the shard it already holds. On
CUDA the transfers are issued on a side stream; the compute stream waits on an event recorded after them, and
received buffers are ``record_stream``-ed onto the compute stream, so nothing is freed or reused early. On the
CPU (gloo) the transfers are posted before the step's attention and waited after it. Only K/V travel: with
GQA that is num_heads_kv heads, not num_heads.

**Merge**. Each step calls ``fa_variants.attention(..., return_lse=True)`` on any backend of the dispatcher and
gives a partial output O_s normalised over its keys, with its log-sum-exp L_s. Partials combine exactly:
L = log(e^L_a + e^L_b), O = e^(L_a - L) O_a + e^(L_b - L) O_b (the rescaling of FlashAttention's online
softmax, Dao et al. 2022, Algorithm 1, applied to whole blocks). The merge runs in float32 (float64 for
float64 inputs, and for the reference backend's partials, whose LSE is float64: ``_partial``). A partial with L = -inf weighs 0 (the neutral element), and a row whose partials are all -inf
comes out as O = 0, L = -inf, as ``fa_variants.attention`` defines a row that sees no key. The first partial of
each row range is kept as the kernel returned it; each later one is folded in by one pass over the rows it
covers, and the last pass writes the output dtype (into the output itself when the rows come in pieces). On
CUDA that pass is the pointwise function ``_merged`` compiled by ``torch.compile`` (one kernel: O_a and O_b
read once, O written once, instead of about ten eager passes through float32 temporaries; sizes specialised,
the row count made symbolic after a second size); on the CPU, with FA_VARIANTS_CP_COMPILE=0, or after a
compile failure (warned once) it runs eagerly, with the same formula.

**Causal, zig-zag sharding** (the load balance of Llama 3, Dubey et al. 2024, sec. 3.3.2, also called zig-zag
ring attention). The sequence is cut into 2·world chunks c_0 .. c_{2w-1}; rank r holds ``[c_r, c_{2w-1-r}]``
(``zigzag_shard``). With contiguous shards, rank r would need r + 1 of the world K/V blocks, so the last rank
would do world times the first one's work. With zig-zag shards, when rank r holds rank j's K/V:

==========  ==========================================  ===========================================
step        what is computed                            why
==========  ==========================================  ===========================================
j == r      causal attention of the local shard         the two chunks in order are a causal block:
            (local query i sees local key <= i)         c_r sees c_r's diagonal; c_{2w-1-r} sees all
                                                        of c_r (earlier) and its own diagonal
j < r       all local queries vs the first chunk c_j    c_j precedes both c_r and c_{2w-1-r};
            only, no mask                               c_{2w-1-j} follows both (2w-1-j > 2w-1-r)
j > r       the second chunk c_{2w-1-r} of the queries  c_j and c_{2w-1-j} both follow c_r and both
            vs all keys, no mask                        precede c_{2w-1-r} (j < w <= 2w-1-r)
==========  ==========================================  ===========================================

Every step is then half of a (2C x 2C) block (C = chunk length): the same work on every rank and every step,
and the unneeded half is never computed (no masked-out launch). ``layout="contiguous"`` with causal is also
supported, for shards cut in order (``contiguous_shard``): step j == r is causal, j < r is full and j > r is
skipped (its K/V still pass through, for the next rank); it is correct but unbalanced.

The causal mask is that of the whole sequence: with q and k shards of the same tokens (self-attention),
bottom-right and top-left alignment coincide, and the unsharded result equals ``fa_variants.attention`` on the
full sequence (tested with 2 and 4 gloo processes).

**Supported.** Non-causal: any shards (the result does not depend on how keys are spread), seqlen_q and
seqlen_k may differ and may differ between ranks (cross-attention). Causal: self-attention only (each rank's
q and k shards hold the same tokens, seqlen_q == seqlen_k per rank), in zig-zag or contiguous layout, named
by ``layout`` on every causal call: the shards carry no positions, so a layout other than the one they were cut
in could not be detected and would give a wrong answer; without it a causal call raises ValueError. Uneven
lengths follow ``torch.tensor_split``: a sequence of N tokens cut into c chunks gives the first N mod c chunks
one token more; ``zigzag_shard``/``contiguous_shard`` cut that way, ``zigzag_unshard`` undoes it,
and causal zig-zag shards of any other lengths raise ValueError. GQA/MQA as in ``fa_variants.attention``.
A group of one (world of 1) is plain ``fa_variants.attention``. Forward only.

**Checks.** Each call first validates its local inputs as ``fa_variants.attention`` does, then all-gathers one
small int64 row per rank (whether the rank's inputs were valid, shapes, dtype, device type, causal, layout,
softmax_scale) and every rank checks every row, so all ranks raise the same one-line error (naming the rank
and the field) instead of some hanging in a transfer. That all-gather waits for the other ranks; with NCCL it
and its copy to (pinned) host memory run on the module's side stream, so the host does not wait for the
caller's work already queued on the current stream (with a group that also has a CPU backend, e.g.
"cpu:gloo,cuda:nccl", it runs on the CPU and does not touch the GPU at all).

**Launch order** (``OVERLAP_START``, on). The step on the rank's own K/V needs nothing from the other ranks, so
it is cut into a head (query rows [0, h) against keys [0, h), causal; all keys when not causal) and a tail
(rows [h, n) against all keys, bottom-right causal: row h + i sees keys <= h + i), and one piece is launched
before anything else: the tail when causal (the larger), the head otherwise (the halves are equal but for the
cut's rounding down to whole 128-row tiles: the head at most 127 rows shorter); then the call starts the
all-gather, waits for the check, posts the first transfer and launches the other piece.
With zig-zag shards h is the first chunk's length, so the tail's rows are exactly those the steps j > r cover.
The check's round trip and the posting of the transfer (together ~0.5 ms of host time on the H200) run while
the GPU computes the first piece; when causal the transfer's NCCL kernel gets SMs as the tail's last CTAs
finish and moves while the head runs (a kernel queued after many CTAs of another waits for SMs until they are
dispatched). Head and tail cover disjoint rows; the later steps'
merges write straight into the output, piece by piece, so the cut costs no copy.

**Overlap on the GPU.** A transfer only moves while its NCCL kernel holds SMs. The transfers are posted before
the step's attention kernel, but the GPU's block scheduler may still hand the SMs to the attention kernel's
many queued CTAs first; with NCCL streams of high priority (``TORCH_NCCL_HIGH_PRIORITY=1`` before the first
transfer, or a group made with ``ProcessGroupNCCL.Options(is_high_priority_stream=True)``), the transfer's CTAs
are scheduled as soon as SMs free up. ``scripts/cp_bench.py`` measures both.

**PyTorch's own API** (torch 2.14): ``torch.distributed.tensor.experimental.context_parallel`` is a context
manager that shards whole buffers as DTensors (with a head-tail load balancer that lays tokens out exactly as
``zigzag_shard`` does) and patches ``torch.nn.functional.scaled_dot_product_attention`` so that PyTorch's own
flash / memory-efficient / cuDNN SDPA kernels run as ring attention. Its engine,
``_templated_ring_attention(group, seq_dim, op, q, k, v, is_causal)``, is private (underscored, its signature
has changed between releases), rotates K/V with functional collectives (all-gather of every shard by default,
world times the K/V memory, or all-to-all), needs shards of equal length (``tensor.chunk``), and its merge
(sigmoid form) gives NaN when both LSEs are -inf. Our function cannot be reached from it: its DTensor handler
maps exactly three aten ops (``_scaled_dot_product_flash_attention``, ``_efficient_attention`` and
``_cudnn_attention``, forward and backward) to their ring versions through a fixed table, with no public way to
add another op; reaching ours would mean patching private state (``DTensor._op_dispatcher._custom_op_handlers``)
that changes between releases. We therefore did not route our kernels through it: this module uses the public
point-to-point API directly, with our backends per step, explicit overlap and uneven shards. Its layout is the same, so buffers sharded by ``context_parallel`` (round-robin load balancing on)
can be passed here as they are; the test suite checks that the token order is identical.
"""
from __future__ import annotations

import contextlib
import math
import struct
import threading
import warnings
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from fa_variants import api, dispatch, reference
from fa_variants.common import env
from fa_variants.common.checks import is_int, one_line
from fa_variants.reference import default_softmax_scale

#: how the sequence was cut over the ranks; it matters only when causal
LAYOUTS = ("zigzag", "contiguous")

#: Launch order of a call (scripts/cp_bench.py measures both). True: the step on this rank's own K/V is cut at a
#: row boundary h into a head (query rows [0, h) against keys [0, h), or all keys when not causal) and a tail
#: (rows [h, n) against all keys, bottom-right causal); the larger piece (``_own_pieces``) is launched first, so
#: the host's work of starting the shape check, waiting for it and posting the first transfer (~0.5 ms on the
#: H200) runs under it; then the other piece. False: check, post, then the whole own step (the GPU idles for
#: the check's round trip and the posting).
OVERLAP_START = True

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64,
           getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None))
_DEVICE_TYPES = ("cpu", "cuda")
_FIELDS = ("valid", "batch", "seqlen_q", "num_heads", "head_dim", "seqlen_k", "num_heads_kv", "dtype",
           "device type", "causal", "layout", "softmax_scale")
#: fields that every rank must share (the seqlens may differ)
_SHARED = ("batch", "num_heads", "head_dim", "num_heads_kv", "dtype", "device type", "causal", "layout",
           "softmax_scale")


# ------------------------------------------------------------------------------------------- sharding

def _chunk_sizes(seqlen: int, chunks: int) -> list[int]:
    """Chunk lengths of ``torch.tensor_split(x, chunks)`` on a dimension of ``seqlen``: the first
    ``seqlen % chunks`` are one longer."""
    base, extra = divmod(seqlen, chunks)
    return [base + (i < extra) for i in range(chunks)]


def _chunk(x: torch.Tensor, dim: int, chunks: int, index: int) -> torch.Tensor:
    """Chunk ``index`` of ``torch.tensor_split(x, chunks, dim)`` (a view), found by arithmetic: tensor_split
    builds every chunk, a list as long as ``chunks`` (a world of 10^7 ran out of memory)."""
    base, extra = divmod(x.shape[dim], chunks)
    return x.narrow(dim, index * base + min(index, extra), base + (index < extra))


def _check_shard_args(x: torch.Tensor, dim: int, rank: int, world: int) -> tuple[int, int, int]:
    """(dim in [0, x.dim()), rank, world) as Python ints; TypeError / ValueError naming the argument."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    for name, value in (("dim", dim), ("rank", rank), ("world", world)):
        if not is_int(value):
            raise TypeError(f"{name} must be an int, got {one_line(value)}")
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    return _check_dim(x, dim), int(rank), int(world)


def _check_dim(x: torch.Tensor, dim) -> int:
    """``dim`` of ``x`` in [0, x.dim()) (a negative one counted from the end); TypeError / ValueError naming it."""
    if not is_int(dim):
        raise TypeError(f"dim must be an int, got {one_line(dim)}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim {dim} is out of range for a {x.dim()}-D tensor")
    return int(dim) % x.dim()


def contiguous_shard(x: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous piece of ``x`` cut into ``world`` pieces along ``dim`` (a view).

    Lengths follow ``torch.tensor_split``: with N = x.shape[dim], the first N mod world pieces are one longer.
    Raises TypeError / ValueError for a non-tensor, non-int arguments, rank outside [0, world), a bad dim.
    """
    dim, rank, world = _check_shard_args(x, dim, rank, world)
    return _chunk(x, dim, world, rank)


def _check_shards(shards, dim) -> tuple[list[torch.Tensor], int]:
    """(the shards as a list, dim in [0, ndim)) for the unshard helpers: a sequence (not one tensor, which
    ``list`` would cut along its first dim) of one or more tensors of one ndim, dtype and device, whose sizes
    agree except along ``dim``. Raises TypeError / ValueError naming the shard and what differs."""
    if isinstance(shards, torch.Tensor):
        raise TypeError(f"shards must be a sequence of tensors (ranks 0 .. world-1), got one tensor of shape "
                        f"{tuple(shards.shape)}; pass a list, e.g. [shard_0, shard_1]")
    try:
        shards = list(shards)
    except TypeError:
        raise TypeError(f"shards must be a sequence of tensors (ranks 0 .. world-1), got {type(shards).__name__}") from None
    if not shards:
        raise ValueError("shards is empty; pass the shards of ranks 0 .. world-1")
    for rank, shard in enumerate(shards):
        if not isinstance(shard, torch.Tensor):
            raise TypeError(f"shards[{rank}] must be a torch.Tensor, got {type(shard).__name__}")
    first = shards[0]
    dim = _check_dim(first, dim)
    for rank, shard in enumerate(shards[1:], 1):
        other = [size for d, size in enumerate(shard.shape) if d != dim] if shard.dim() == first.dim() else None
        if other != [size for d, size in enumerate(first.shape) if d != dim]:
            raise ValueError(f"shards[{rank}] has shape {tuple(shard.shape)} but shards[0] has {tuple(first.shape)}; "
                             f"they must agree except along dim {dim}")
        if shard.dtype != first.dtype or shard.device != first.device:
            raise ValueError(f"shards[{rank}] is {shard.dtype} on {shard.device} but shards[0] is {first.dtype} on "
                             f"{first.device}; every shard must have one dtype and device")
    return shards, dim


def contiguous_unshard(shards: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """The inverse of ``contiguous_shard``: the shards of ranks 0 .. world-1 joined along ``dim`` (a copy).

    Raises TypeError / ValueError (naming the shard) for one tensor instead of a sequence, an empty sequence, a
    shard that is not a tensor, a dim that is not an int or out of range, or shards whose ndim, sizes other
    than along dim, dtype or device differ."""
    shards, dim = _check_shards(shards, dim)
    return torch.cat(shards, dim)


def zigzag_shard(x: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s zig-zag shard of ``x`` along ``dim``: chunks ``rank`` and ``2*world-1-rank`` of the
    2*world chunks, joined (a copy). This balances causal attention: every rank gets one early and one late
    chunk. Lengths follow ``torch.tensor_split`` into 2*world chunks (first N mod 2*world one longer).

    Raises TypeError / ValueError as ``contiguous_shard``.
    """
    dim, rank, world = _check_shard_args(x, dim, rank, world)
    return torch.cat((_chunk(x, dim, 2 * world, rank), _chunk(x, dim, 2 * world, 2 * world - 1 - rank)), dim)


def zigzag_unshard(shards: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """The inverse of ``zigzag_shard``: the shards of ranks 0 .. world-1 back in sequence order (a copy).

    Raises ValueError when a shard's length is not what ``zigzag_shard`` gives for the total length, and as
    ``contiguous_unshard`` (one tensor instead of a sequence, empty, not tensors, dim, shards that differ).
    """
    shards, dim = _check_shards(shards, dim)
    world = len(shards)
    sizes = _chunk_sizes(sum(s.shape[dim] for s in shards), 2 * world)
    chunks: list[torch.Tensor | None] = [None] * (2 * world)
    for rank, shard in enumerate(shards):
        first, second = sizes[rank], sizes[2 * world - 1 - rank]
        if shard.shape[dim] != first + second:
            raise ValueError(f"shard {rank} has length {shard.shape[dim]} along dim {dim}, but zig-zag "
                             f"sharding of {sum(sizes)} tokens over {world} ranks gives it {first + second}")
        chunks[rank] = shard.narrow(dim, 0, first)
        chunks[2 * world - 1 - rank] = shard.narrow(dim, first, second)
    return torch.cat(chunks, dim)


# ----------------------------------------------------------------------------------------------- merge

def _merged(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
            out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over keys A and B from the partials over A and over B, as new tensors: the LSE in the
    accumulation dtype (float64 if an operand is float64, else float32) and O rounded once to ``out_dtype``.
    Every operation is pointwise, so that ``torch.compile`` makes it one kernel (read O_a and O_b once, write
    O once) on the GPU. See ``merge_partial_`` for the formula and the -inf rules."""
    acc = torch.float64 if torch.float64 in (lse_a.dtype, lse_b.dtype, out_a.dtype, out_dtype) else torch.float32
    la, lb = lse_a.to(acc), lse_b.to(acc)
    lse = torch.logaddexp(la, lb)
    base = torch.where(lse.isinf(), 0.0, lse)  # both -inf: both weights exp(-inf) = 0, the row is 0; +inf: below
    w_a, w_b = torch.exp(la - base), torch.exp(lb - base)
    # one LSE of +inf (its true value beyond the dtype's range) outweighs any finite one: that partial is the row;
    # two cannot be ordered, and their weights inf make the row non-finite
    inf_a, inf_b = la == math.inf, lb == math.inf
    one = inf_a ^ inf_b
    w_a = torch.where(one, inf_a.to(acc), w_a).transpose(1, 2).unsqueeze(-1)  # (B, N, H, 1)
    w_b = torch.where(one, inf_b.to(acc), w_b).transpose(1, 2).unsqueeze(-1)
    # a partial of weight 0 (LSE -inf: no key) adds nothing whatever its O holds (an accumulator started with
    # torch.empty, a NaN): 0 x NaN would be NaN
    part_a = torch.where(w_a == 0, 0.0, out_a.to(acc) * w_a)
    part_b = torch.where(w_b == 0, 0.0, out_b.to(acc) * w_b)
    return (part_a + part_b).to(out_dtype), lse


def _merged_into(dst_out: torch.Tensor, dst_lse: torch.Tensor, out_a: torch.Tensor, lse_a: torch.Tensor,
                 out_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """``_merged`` written into the given views (rows of the call's output and LSE) instead of new tensors:
    on CUDA, compiled, the one fused pass stores straight into the output, so row pieces merged apart need no
    concatenation afterwards."""
    new_out, new_lse = _merged(out_a, lse_a, out_b, lse_b, dst_out.dtype)
    dst_out.copy_(new_out)
    dst_lse.copy_(new_lse)


#: how ``_merged`` / ``_merged_into`` are compiled on CUDA. dynamic=None (automatic): a first call compiles for
#: its exact shapes, a call with other sizes recompiles once with just the sizes that changed (the rows) symbolic;
#: head_dim and num_heads stay constants, so the kernel's index arithmetic is shifts, not divisions by run-time
#: values (dynamic=True made every size symbolic: session 2 measured the merge at about a third of HBM bandwidth).
_COMPILE_OPTIONS = dict(fullgraph=True, dynamic=None)
_COMPILED_MERGE = {"fn": None, "into": None, "failed": False}


def _compiled(name: str, fn, eager_args: tuple, device_type: str):
    """Runs ``fn`` compiled (torch.compile, once per function) on CUDA; eagerly on the CPU, with the
    environment variable FA_VARIANTS_CP_COMPILE=0, or after a compile failure (warned once)."""
    if (device_type != "cuda" or _COMPILED_MERGE["failed"]
            or not env.flag("FA_VARIANTS_CP_COMPILE", True)):
        return fn(*eager_args)
    if _COMPILED_MERGE[name] is None:
        _COMPILED_MERGE[name] = torch.compile(fn, **_COMPILE_OPTIONS)
    try:
        return _COMPILED_MERGE[name](*eager_args)
    except Exception as error:  # noqa: BLE001 - any compiler failure: the eager merge gives the same result
        _COMPILED_MERGE["failed"] = True
        warnings.warn(f"context_parallel_attention: torch.compile of the LSE merge failed ({type(error).__name__}:"
                      f" {str(error).splitlines()[0] if str(error) else ''}); merging eagerly", stacklevel=3)
        return fn(*eager_args)


def _merge(out_a, lse_a, out_b, lse_b, out_dtype):
    """``_merged``, compiled on CUDA (one fused kernel instead of ~10 passes over O); see ``_compiled``."""
    return _compiled("fn", _merged, (out_a, lse_a, out_b, lse_b, out_dtype), out_a.device.type)


def _merge_into(dst_out, dst_lse, out_a, lse_a, out_b, lse_b) -> None:
    """``_merged_into``, compiled on CUDA; see ``_compiled``."""
    _compiled("into", _merged_into, (dst_out, dst_lse, out_a, lse_a, out_b, lse_b), out_a.device.type)


def _check_merge_operands(out, lse, out_part, lse_part) -> None:
    """merge_partial_'s argument rules (its docstring): before anything is written."""
    names = ("out", "lse", "out_part", "lse_part")
    for name, t in zip(names, (out, lse, out_part, lse_part)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if out.dim() != 4:
        raise ValueError(f"out must be 4-D (batch, seqlen_q, num_heads, head_dim), got shape {tuple(out.shape)}")
    if out.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"out has dtype {out.dtype}; the accumulator must be float32 or float64")
    if lse.dtype != out.dtype:
        raise TypeError(f"lse has dtype {lse.dtype} but out has {out.dtype}; they must match")
    batch, seqlen_q, heads, _ = out.shape
    for name, t, want in (("lse", lse, (batch, heads, seqlen_q)), ("lse_part", lse_part, (batch, heads, seqlen_q))):
        if tuple(t.shape) != want:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {want} (batch, num_heads, seqlen_q of out)")
    if out_part.shape != out.shape:
        raise ValueError(f"out_part has shape {tuple(out_part.shape)} but out has {tuple(out.shape)}; they must match")
    for name, t in (("out_part", out_part), ("lse_part", lse_part)):
        if not t.is_floating_point():
            raise TypeError(f"{name} has dtype {t.dtype}; a partial result must be floating-point")
        if t.device != out.device:
            raise ValueError(f"{name} is on {t.device} but out is on {out.device}")
    if lse.device != out.device:
        raise ValueError(f"lse is on {lse.device} but out is on {out.device}")
    for name, t in (("out", out), ("lse", lse)):
        if t.requires_grad and t.is_leaf and torch.is_grad_enabled():  # torch's own error names no argument
            raise ValueError(f"{name} is a leaf tensor that requires grad, which merge_partial_ cannot update in "
                             f"place; pass one that does not ({name}.detach().clone()) or call under torch.no_grad()")
        # 1: some elements surely share memory (a stride-0, i.e. expanded, view), so an in-place update cannot hold
        # them; 2 ("cannot tell", e.g. a slice or an as_strided view) passes: the caller vouches for those
        if torch._debug_has_internal_overlap(t) == 1:
            raise ValueError(f"{name} has elements that share memory (an expanded view?); the accumulator must "
                             f"not overlap itself (pass {name}.clone())")


def merge_partial_(out: torch.Tensor, lse: torch.Tensor, out_part: torch.Tensor,
                   lse_part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Adds one partial attention result to an accumulator, in place: attention over keys A and B from
    attention over A (out, lse) and over B (out_part, lse_part).

    Args:
        out: (batch, seqlen_q, num_heads, head_dim) accumulator, float32 or float64 (may be a view).
        lse: (batch, num_heads, seqlen_q) accumulator, natural log, same dtype as out.
        out_part, lse_part: the same shapes, any floating dtype.

    L = logaddexp(lse, lse_part); out = e^(lse - L) out + e^(lse_part - L) out_part; lse = L. A partial with
    LSE -inf has weight 0 and adds nothing, whatever its O holds (so an accumulator may start as
    ``torch.empty`` with lse -inf); where both are -inf the row becomes 0 with LSE -inf. An LSE of +inf (beyond the
    dtype's range) against a finite one: that partial is the result (LSE +inf); both +inf: the row is not finite. Returns (out, lse).
    Source: FlashAttention (Dao et al. 2022), Algorithm 1, lines 10-12, for whole blocks of keys. This is the
    incremental two-operand form of ``fa_variants.common.split.merge`` (split-KV, all splits stacked at once):
    ring partials arrive one step at a time and may cover only some rows, so they are folded in as they come.

    Raises:
        TypeError: a non-tensor, an accumulator that is not float32 / float64 (lse's dtype must be out's), a
            partial that is not floating-point.
        ValueError: shapes other than those above (no broadcasting), operands on different devices, an
            accumulator whose elements share memory (an expanded view) or that is a leaf requiring grad (with grad
            mode on).
    """
    _check_merge_operands(out, lse, out_part, lse_part)
    new_out, new_lse = _merge(out, lse, out_part, lse_part, out.dtype)
    out.copy_(new_out)
    lse.copy_(new_lse)
    return out, lse


class _Merger:
    """Accumulates the partials of one rank's query rows (see ``merge_partial_``) with little memory traffic.

    ``cover`` lists, in the order they will be added, the local row ranges [start, stop) of the partials. The
    rows are cut into segments at every start and stop, so each partial covers whole segments. Per segment:
    the first partial is kept as the kernel returned it; each later one is merged by one fused pass
    (``_merge``) in float32 (float64 for float64 inputs); the segment's last merge is rounded once to the
    output dtype, and with several segments it is written straight into the call's output (``_merge_into``).
    A segment no partial merged into is copied there as it is; one that no partial covers is 0 with LSE -inf."""

    def __init__(self, q: torch.Tensor, cover: Sequence[tuple[int, int]]):
        self.shape, self.dtype, self.device = q.shape, api.output_dtype(q.dtype), q.device  # e4m3 in: bfloat16 out
        self.acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        self.cover = list(cover)
        bounds = sorted({0, q.shape[1], *(a for a, _ in self.cover), *(b for _, b in self.cover)})
        self.segments = [(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        self.last = [max((i for i, (a, b) in enumerate(self.cover) if a <= s and e <= b), default=-1)
                     for s, e in self.segments]
        self.state: list = [None] * len(self.segments)  # (out, lse), or "written" once in the output
        self.added = 0
        self.final: tuple[torch.Tensor, torch.Tensor] | None = None

    def _output(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.final is None:
            batch, seqlen, heads, _ = self.shape
            self.final = (torch.empty(self.shape, dtype=self.dtype, device=self.device),
                          torch.empty((batch, heads, seqlen), dtype=self.acc_dtype, device=self.device))
        return self.final

    def add(self, out: torch.Tensor, lse: torch.Tensor) -> None:
        """The next partial of ``cover``: out (batch, stop - start, heads, head_dim), lse (batch, heads,
        stop - start)."""
        i, (start, stop) = self.added, self.cover[self.added]
        self.added += 1
        for j, (s, e) in enumerate(self.segments):
            if not start <= s < e <= stop:
                continue
            part = (out[:, s - start:e - start], lse[:, :, s - start:e - start])
            if self.state[j] is None:
                self.state[j] = part
            elif self.last[j] == i and len(self.segments) > 1:
                final_out, final_lse = self._output()
                _merge_into(final_out[:, s:e], final_lse[:, :, s:e], *self.state[j], *part)
                self.state[j] = "written"
            else:
                self.state[j] = _merge(*self.state[j], *part, self.dtype if self.last[j] == i else self.acc_dtype)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(out in the output dtype, ``api.output_dtype`` of q's, lse float32) of all rows."""
        if len(self.segments) == 1 and self.state[0] is not None:
            out, lse = self.state[0]
            return out.to(self.dtype), lse.float()
        final_out, final_lse = self._output()
        for (s, e), state in zip(self.segments, self.state):
            if state is None:  # no key for these rows anywhere
                final_out[:, s:e].zero_()
                final_lse[:, :, s:e].fill_(-math.inf)
            elif not isinstance(state, str):
                final_out[:, s:e].copy_(state[0])
                final_lse[:, :, s:e].copy_(state[1])
        return final_out, final_lse.float()


# ------------------------------------------------------------------------------------------- transport

_COMM_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _comm_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream of this module's transfers and shape check on ``device`` (one per device)."""
    if device not in _COMM_STREAMS:
        _COMM_STREAMS[device] = torch.cuda.Stream(device)
    return _COMM_STREAMS[device]


def _region(name: str):
    """A named range for torch.profiler (scripts/cp_bench.py --profile reads them); nothing when no profiler runs."""
    if torch.autograd.profiler._is_profiler_enabled:
        return torch.profiler.record_function(f"cp: {name}")
    return contextlib.nullcontext()


class _Ring:
    """K/V transfers to the next rank and from the previous one, overlapped with the caller's compute.

    ``ready``: on CUDA, an event recorded on the compute stream when the caller's K/V were ready (before this
    call launched anything), which the transfers wait for; not the stream itself, so the first transfer does
    not wait for a kernel this call launched already."""

    def __init__(self, group, rank: int, world: int, device: torch.device, ready: torch.cuda.Event | None = None):
        self.group = group
        self.send_to = dist.get_global_rank(group, (rank + 1) % world)
        self.recv_from = dist.get_global_rank(group, (rank - 1) % world)
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.compute = torch.cuda.current_stream(device)
            self.comm = _comm_stream(device)
            if ready is None:
                self.comm.wait_stream(self.compute)
            else:
                self.comm.wait_event(ready)

    def post(self, k: torch.Tensor, v: torch.Tensor, seqlen_in: int):
        """Starts sending (k, v) and receiving the previous rank's shard of seqlen_in tokens."""
        shape = (k.shape[0], seqlen_in, *k.shape[2:])
        with torch.cuda.stream(self.comm) if self.cuda else contextlib.nullcontext():
            k_in = torch.empty(shape, dtype=k.dtype, device=k.device)  # on CUDA: allocated on the comm stream
            v_in = torch.empty(shape, dtype=v.dtype, device=v.device)
            ops = [dist.P2POp(dist.isend, t, self.send_to, self.group) for t in (k, v) if t.numel()]
            ops += [dist.P2POp(dist.irecv, t, self.recv_from, self.group) for t in (k_in, v_in) if t.numel()]
            works = dist.batch_isend_irecv(ops) if ops else []  # empty shards: both sides know, none sent
            arrived = None
            if self.cuda:
                for work in works:  # NCCL: the comm stream waits for the transfers; the host does not
                    work.wait()
                arrived = torch.cuda.Event()
                arrived.record(self.comm)
        return works, arrived, k_in, v_in

    def wait(self, pending) -> tuple[torch.Tensor, torch.Tensor]:
        """The received (k, v), usable on the current (compute) stream."""
        works, arrived, k_in, v_in = pending
        if self.cuda:
            self.compute.wait_event(arrived)
            for t in (k_in, v_in):  # used on the compute stream: not reused before that work is done
                t.record_stream(self.compute)
        else:
            for work in works:
                work.wait()
        return k_in, v_in


class _RowExchange:
    """The shape check's all-gather of one small int64 row per rank: started by the constructor, read by
    ``rows()``. With NCCL it and the copy of its result to (pinned) host memory run on the module's side stream,
    so the host may launch work between the two and waits, in ``rows()``, for this small exchange only, not
    for the caller's work queued on the current stream."""

    def __init__(self, group, row: list[int], world: int):
        self.nccl = dist.get_backend(group) == "nccl"
        self.shape = (world, len(row))
        device = torch.device("cuda", torch.cuda.current_device()) if self.nccl else torch.device("cpu")
        with torch.cuda.stream(_comm_stream(device)) if self.nccl else contextlib.nullcontext():
            if self.nccl:  # pinned host buffers and the device buffer, kept per shape: a call reads its answer
                # (rows) before it returns, so the next call may reuse them
                mine_host, mine, self.every, self.host, self.done = _exchange_buffers(device, world, len(row))
                mine_host.copy_(torch.tensor(row, dtype=torch.int64))
                mine.copy_(mine_host, non_blocking=True)
            else:
                mine = torch.tensor(row, dtype=torch.int64)
                self.every = torch.empty(world * len(row), dtype=torch.int64, device=device)
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.14
            self.work = gather(self.every, mine, group=group, async_op=True)
            if self.nccl:
                self.work.wait()  # the side stream waits for the all-gather; the host does not
                self.host.copy_(self.every, non_blocking=True)
                self.done.record()

    def rows(self) -> list[list[int]]:
        """Every rank's row (waits for the exchange)."""
        if self.nccl:
            self.done.synchronize()
            flat = self.host
        else:
            self.work.wait()
            flat = self.every
        return flat.view(self.shape).tolist()


_EXCHANGE_BUFFERS: dict = {}


def _exchange_buffers(device: torch.device, world: int, width: int):
    """(row on pinned host, row on device, all rows on device, all rows on pinned host, done event) of the shape
    check on ``device`` for ``world`` rows of ``width`` int64, made once per thread (pinning host memory per call cost
    host time that the first attention launch waited for)."""
    key = (device, world, width, threading.get_ident())  # per thread: concurrent calls never share them
    if key not in _EXCHANGE_BUFFERS:
        _EXCHANGE_BUFFERS[key] = (torch.empty(width, dtype=torch.int64, pin_memory=True),
                                  torch.empty(width, dtype=torch.int64, device=device),
                                  torch.empty(world * width, dtype=torch.int64, device=device),
                                  torch.empty(world * width, dtype=torch.int64, pin_memory=True),
                                  torch.cuda.Event())
    return _EXCHANGE_BUFFERS[key]


def _gather_rows(group, row: list[int], world: int) -> list[list[int]]:
    """Every rank's row (``_RowExchange`` started and read at once)."""
    return _RowExchange(group, row, world).rows()


# ------------------------------------------------------------------------------------------ the steps

@dataclass(frozen=True)
class _Step:
    rows: slice     # local query rows
    keys: slice     # keys of the shard held at this step
    causal: bool


def _plan(rank: int, src: int, causal: bool, layout: str, first_q: int, first_k: int) -> _Step | None:
    """What rank ``rank`` computes with the K/V shard of rank ``src`` (module docstring, table); None: skip.
    first_q / first_k: length of the first zig-zag chunk of this rank's and of src's shard."""
    everything = slice(None)
    if not causal:
        return _Step(everything, everything, False)
    if src == rank:
        return _Step(everything, everything, True)
    if layout == "contiguous":
        return _Step(everything, everything, False) if src < rank else None
    if src < rank:
        return _Step(everything, slice(0, first_k), False)
    return _Step(slice(first_q, None), everything, False)


def _head_rows(seqlen_q: int, seqlen_k: int, causal: bool, layout: str) -> int | None:
    """Where ``OVERLAP_START`` cuts the own step's query rows (head [0, h), tail [h, seqlen_q)); None: no cut.
    Zig-zag causal: at the first chunk's end, ceil(seqlen_q / 2) for every shard ``zigzag_shard`` gives (the
    first chunk is the longer by at most one), so the tail is exactly the rows the later steps j > r cover. Else
    at half the rows, rounded down to a multiple of 128 (whole query tiles of the kernels) from 256 rows on."""
    if seqlen_q < 2 or seqlen_k == 0:
        return None
    if causal and layout == "zigzag":
        return (seqlen_q + 1) // 2
    head = seqlen_q // 2
    return head - head % 128 if head >= 128 else head


@dataclass(frozen=True)
class _Piece:
    rows: tuple[int, int]   # local query rows [start, stop)
    keys: slice             # keys of the own shard


def _own_pieces(seqlen_q: int, seqlen_k: int, causal: bool, layout: str) -> list[_Piece] | None:
    """The own step cut at ``_head_rows`` into a head (rows [0, h) against keys [0, h) when causal: the shard's
    local mask, top-left = bottom-right on this square block; all keys when not) and a tail (rows [h, n) against
    all keys, bottom-right causal), in launch order: the larger first (``OVERLAP_START``). Causal: the tail
    (three quarters of the step's work with zig-zag shards), so that the host's check and first post run under
    the most GPU work; the transfer's NCCL kernel, posted after it, gets SMs as the tail's last CTAs finish and
    moves while the head runs. Not causal: the head first, the halves equal but for the cut's rounding down to
    whole 128-row tiles (at most 127 rows fewer in the head). None: no cut."""
    cut = _head_rows(seqlen_q, seqlen_k, causal, layout)
    if cut is None:
        return None
    head = _Piece((0, cut), slice(0, cut) if causal else slice(None))
    tail = _Piece((cut, seqlen_q), slice(None))
    return [tail, head] if causal else [head, tail]


def _partial(q, k, v, causal: bool, scale: float, backend: str):
    """(out, lse) of one step's attention, as ``fa_variants.attention(..., return_lse=True)`` on ``backend`` (the
    one ``context_parallel_attention`` resolved), except on the reference backend, which returns its partial
    unrounded (``reference.run``'s partial): O in float32 (float64 for float64 inputs) and the LSE in float64.
    Then a merged row is rounded to the output dtype once, not once per step and again after the merge (in
    bfloat16 that double rounding put some rows past twice the error of single-process attention), float64
    inputs keep their precision through the merge (a float32 LSE would limit them to ~1e-7), and an LSE beyond
    float32's range (|softmax_scale x score| above ~3.4e38, +inf as float32) still weighs its partial correctly.
    The kernel backends return O in the input dtype, as FlashAttention's kernels do; their steps are rounded."""
    if backend != "reference":
        return api.attention(q, k, v, causal=causal, softmax_scale=scale, backend=backend, return_lse=True)
    return reference.run(q, k, v, causal=causal, softmax_scale=scale, partial=True)


def _own_piece(q, k, v, piece: _Piece, causal: bool, scale: float, backend: str):
    """(out, lse) of one piece of the own step (``_own_pieces``)."""
    start, stop = piece.rows
    return _partial(q[:, start:stop], k[:, piece.keys], v[:, piece.keys], causal, scale, backend)


def _scale_bits(scale: float) -> int:
    return struct.unpack("<q", struct.pack("<d", scale))[0]


def _check_current_device(device: torch.device) -> None:
    """ValueError unless a CUDA ``device`` is the process's current one: NCCL's exchanges (the shape check's
    buffers too) run on the current device, so tensors elsewhere gave an error from NCCL ("duplicate GPU") or a
    hang instead of this line."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        raise ValueError(f"q is on {device} but this process's current CUDA device is "
                         f"cuda:{torch.cuda.current_device()}: call torch.cuda.set_device({device.index}) first "
                         "(one GPU per rank)")


def _local_error(q, k, v, causal, softmax_scale, backend, return_lse, layout):
    """(error or None, softmax scale, the backend every step runs): this rank's inputs checked as
    ``fa_variants.attention`` does, and ``backend`` resolved ("auto" to the dispatcher's choice: the steps differ
    only in seqlen, which the choice does not depend on)."""
    try:
        api._check_inputs(q, k, v)
        scale = api._check_options(causal, softmax_scale, backend, return_lse)
        scale = default_softmax_scale(q.shape[-1]) if scale is None else scale
        if layout is not None and (not isinstance(layout, str) or layout not in LAYOUTS):
            raise ValueError(f"layout must be one of {LAYOUTS} or None, got {one_line(layout)}")
        if causal and layout is None:
            raise ValueError("layout is required when causal: 'zigzag' for shards cut by zigzag_shard or "
                             "'contiguous' for shards in sequence order (contiguous_shard); the shards carry no "
                             "positions, so a wrong layout could not be detected")
        if causal and q.shape[1] != k.shape[1]:
            raise ValueError(f"causal context parallelism needs self-attention shards (the same tokens in q "
                             f"and k), but q has seqlen {q.shape[1]} and k has {k.shape[1]} on this rank")
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise NotImplementedError("context_parallel_attention is forward-only and an input requires grad: "
                                      "call it under torch.no_grad() / torch.inference_mode()")
        if q.device.type not in _DEVICE_TYPES:
            raise ValueError(f"q is on {q.device}; context parallelism supports {_DEVICE_TYPES}")
        _check_current_device(q.device)
        # the backend every step uses, chosen here: an unknown or unavailable one (on this rank only, say) is this
        # rank's error before the exchange, not an exception out of a step that leaves the other ranks waiting
        return None, scale, dispatch.select_backend(q, k, v, causal=causal, backend=backend).backend
    except (TypeError, ValueError, NotImplementedError) as error:
        return error, 0.0, backend


def _check_rows(rows: list[list[int]], causal: bool, layout: str) -> None:
    """Raises the same ValueError on every rank when the ranks' shards do not fit together."""
    where = "context_parallel_attention"
    for j, row in enumerate(rows):
        if not row[0]:
            raise ValueError(f"{where}: rank {j} rejected its inputs (its own error says why); no rank computed")
    first = dict(zip(_FIELDS, rows[0]))
    for j, row in enumerate(rows[1:], 1):
        mine = dict(zip(_FIELDS, row))
        for field in _SHARED:
            if mine[field] != first[field]:
                raise ValueError(f"{where}: rank {j} has {field} {_show(field, mine[field])} but rank 0 has "
                                 f"{_show(field, first[field])}; every rank's shards must share {', '.join(_SHARED)}")
    if causal and layout == "zigzag":
        world = len(rows)
        sizes = _chunk_sizes(sum(row[_FIELDS.index("seqlen_k")] for row in rows), 2 * world)
        for j, row in enumerate(rows):
            want = sizes[j] + sizes[2 * world - 1 - j]
            if row[_FIELDS.index("seqlen_k")] != want:
                raise ValueError(f"{where}: rank {j} holds {row[_FIELDS.index('seqlen_k')]} tokens, but zig-zag "
                                 f"sharding of {sum(sizes)} tokens over {world} ranks gives it {want}; cut the "
                                 "sequence with zigzag_shard, or pass layout='contiguous' for shards in order")


def _show(field: str, value: int):
    if field == "dtype":
        return _DTYPES[value] if 0 <= value < len(_DTYPES) else "another dtype"
    if field == "device type":
        return _DEVICE_TYPES[value] if 0 <= value < len(_DEVICE_TYPES) else "another device"
    if field == "layout":
        return LAYOUTS[value] if 0 <= value < len(LAYOUTS) else "none (not causal)"
    if field == "causal":
        return bool(value)
    if field == "softmax_scale":
        return struct.unpack("<d", struct.pack("<q", value))[0]
    return value


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                               softmax_scale: float | None = None, group=None, return_lse: bool = False,
                               backend: str = "auto", layout: str | None = None):
    """Attention over a sequence sharded along seqlen across the ranks of ``group`` (ring attention).

    Every rank of the group calls it with its own shards; the result is this rank's rows of the attention of
    the whole sequence, as ``fa_variants.attention`` on the unsharded tensors would give them.

    Args:
        q: (batch, seqlen_q_shard, num_heads, head_dim), this rank's query rows; dtypes and devices as
            ``fa_variants.attention`` (CPU with gloo, CUDA with NCCL).
        k, v: (batch, seqlen_k_shard, num_heads_kv, head_dim), this rank's keys/values. num_heads,
            num_heads_kv, head_dim, batch, dtype and the options must be the same on every rank; the shard
            lengths may differ (see the module docstring for the rules).
        causal: causal mask of the whole sequence (query i sees key j <= i). Needs seqlen_q == seqlen_k on
            each rank (q and k shards of the same tokens) and shards cut as ``layout`` says.
        softmax_scale: as ``fa_variants.attention``; None means 1 / sqrt(head_dim).
        group: the process group (default: the world group). A group of one runs plain attention.
        return_lse: also return the LSE, float32 (batch, num_heads, seqlen_q_shard), natural log.
        backend: the dispatcher's backend for every step ("auto", "fa3", "fa2", "reference", ...).
        layout: how the shards were cut, required when causal (the shards carry no positions, so a wrong
            layout would be a silent wrong answer): "zigzag" (``zigzag_shard``, load-balanced) or "contiguous"
            (``contiguous_shard``, in order). Not causal: ignored (None, or either name).

    Returns:
        out (batch, seqlen_q_shard, num_heads, head_dim) in q's dtype (bfloat16 for e4m3: ``api.output_dtype``),
        or (out, lse) with ``return_lse``.

    Raises:
        RuntimeError: torch.distributed is not initialized.
        ValueError: this process is not in ``group``; any error of ``fa_variants.attention`` on this rank's
            inputs; causal with seqlen_q != seqlen_k; an unknown layout, or none when causal; shards that do
            not fit together across ranks (raised on every rank, naming the rank and the field); an unknown
            backend or one that cannot serve this rank's inputs (``BackendUnavailableError``), found before the
            exchange: that rank raises it, the others "rank r rejected its inputs". An exception from the own
            step's first piece (``OVERLAP_START``) is raised the same way, after the exchange.
        TypeError: as ``fa_variants.attention``; a ``group`` that is not a ProcessGroup (or None). This one is
            raised before the shape check, so only on the rank that passed it: the other ranks wait in the
            check's all-gather until the group's timeout (the rank cannot tell a group it cannot name).
        NotImplementedError: an input requires grad (forward only).

    Source: Liu et al., Ring Attention with Blockwise Transformers (2023), sec. 3; load-balanced causal
    sharding as in Dubey et al., The Llama 3 Herd of Models (2024), sec. 3.3.2.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call torch.distributed.init_process_group "
                           "first (fa_variants.attention runs one process)")
    device_type = api.autocast_device(q)
    if device_type is not None:  # as fa_variants.attention: the inputs cast as autocast casts SDPA's, then without it
        q, k, v = api.autocast_cast(device_type, q, k, v)
        with torch.autocast(device_type, enabled=False):
            return context_parallel_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group,
                                              return_lse=return_lse, backend=backend, layout=layout)
    if group is dist.GroupMember.NON_GROUP_MEMBER:  # what dist.new_group hands a process outside the group
        raise ValueError("this process is not a member of group (dist.new_group returned it the non-member "
                         "sentinel): call context_parallel_attention only on the group's ranks")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")
    group = dist.group.WORLD if group is None else group
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("this process is not a member of group")
    error, scale, step_backend = _local_error(q, k, v, causal, softmax_scale, backend, return_lse, layout)
    if world == 1:
        if error is not None:
            raise error
        return api.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
                             return_lse=return_lse)
    ready, early = None, None
    if error is not None:
        row = [0] * len(_FIELDS)
    else:
        row = _shape_row(q, k, causal, layout, scale)
        k, v = k.contiguous(), v.contiguous()  # transfers need contiguous buffers (copies queued before `ready`)
        if q.device.type == "cuda":  # the caller's K/V are ready once the work queued so far is done
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(q.device))
    pieces = _own_pieces(q.shape[1], k.shape[1], causal, layout) if error is None and OVERLAP_START else None
    if pieces is not None:  # needs nothing from the other ranks: the GPU computes it while the host checks and posts
        try:
            with _region("own step: first piece"):
                early = (pieces, *_own_piece(q, k, v, pieces[0], causal, scale, step_backend))
        except Exception as exc:  # raised after the exchange: every rank raises, none waits for this one's row
            error, row, early = exc, [0] * len(_FIELDS), None
    with _region("shape check: start"):
        exchange = _RowExchange(group, row, world)
    with _region("shape check: wait"):
        rows = exchange.rows()
    if error is not None:
        raise error
    _check_rows(rows, causal, layout)
    out, lse = _ring_attention(q, k, v, rows, group, rank, world, causal, layout, scale, step_backend, early=early,
                               ready=ready)
    return (out, lse) if return_lse else out


def _shape_row(q, k, causal: bool, layout: str, scale: float) -> list[int]:
    """This rank's row of the shape check (the fields of ``_FIELDS``) for valid inputs."""
    return [1, *q.shape, k.shape[1], k.shape[2], _DTYPES.index(q.dtype) if q.dtype in _DTYPES else len(_DTYPES),
            _DEVICE_TYPES.index(q.device.type), int(causal), LAYOUTS.index(layout) if causal else -1,
            _scale_bits(scale + 0.0)]  # layout: only causal uses it; + 0.0: -0.0 and 0.0 scale alike


def _step_calls(plans, pieces: list[_Piece] | None,
                seqlen_q: int) -> list[tuple[int, tuple[int, int], slice | None, bool]]:
    """The attention calls of the ring in launch order: (step, local query rows [start, stop), keys of the held
    shard, causal); the own step (step 0), when cut, as its two ``pieces``: the first with keys None (launched
    already), the second with its keys."""
    calls = []
    for step, plan in enumerate(plans):
        if plan is None:
            continue
        start, stop, _ = plan.rows.indices(seqlen_q)
        if step == 0 and pieces is not None:  # the own step covers every row: head [0, cut) and tail [cut, n)
            calls += [(0, pieces[0].rows, None, plan.causal), (0, pieces[1].rows, pieces[1].keys, plan.causal)]
        else:
            calls.append((step, (start, stop), plan.keys, plan.causal))
    return calls


def _ring_attention(q, k, v, rows, group, rank, world, causal, layout, scale, backend, early=None, ready=None,
                    ring=None):
    """This rank's (out, lse) over all steps, k and v contiguous, each step on ``backend`` (a resolved name, as
    ``_local_error`` gives it: "reference" is what makes ``_partial`` keep a float64 LSE). ``early``: (pieces, out, lse), the own step cut
    by ``_own_pieces`` and its first piece launched already (``OVERLAP_START``); ``ready``: see ``_Ring``; ``ring``: the transport (default a
    ``_Ring`` over ``group``; scripts/cp_bench.py passes one that moves nothing)."""
    seqlens_k = [row[_FIELDS.index("seqlen_k")] for row in rows]
    sizes = _chunk_sizes(sum(seqlens_k), 2 * world)  # zig-zag chunk lengths (used when causal and zigzag)
    ring = _Ring(group, rank, world, q.device, ready) if ring is None else ring
    plans = [_plan(rank, (rank - step) % world, causal, layout, sizes[rank], sizes[(rank - step) % world])
             for step in range(world)]
    # an empty side contributes nothing (the merge's neutral element): such a step is skipped too
    plans = [p if p is not None and q[:, p.rows].shape[1] and len(range(seqlens_k[(rank - step) % world])[p.keys])
             else None for step, p in enumerate(plans)]
    calls = _step_calls(plans, None if early is None else early[0], q.shape[1])
    merger = _Merger(q, [rows_ for _, rows_, _, _ in calls])
    if early is not None:
        merger.add(*early[1:])
    k_cur, v_cur = k, v
    for step in range(world):
        src = (rank - step) % world  # the rank whose K/V shard this rank holds now
        with _region(f"post {step}"):
            pending = ring.post(k_cur, v_cur, seqlens_k[(src - 1) % world]) if step + 1 < world else None
        for _, (start, stop), keys, step_causal in (c for c in calls if c[0] == step and c[2] is not None):
            with _region(f"step {step}"):
                out, lse = _partial(q[:, start:stop], k_cur[:, keys], v_cur[:, keys], step_causal, scale, backend)
            with _region("merge"):
                merger.add(out, lse)
        if pending is not None:
            k_cur, v_cur = ring.wait(pending)
    with _region("result"):
        return merger.result()
