"""The kernel backends' backward: which function computes (dQ, dK, dV) of a call that went through the custom op.

The forward kernels (fa3, fa2, fa1) have no backward kernel of their own. ``FA_VARIANTS_BACKWARD`` (read at the
forward, which keeps O and LSE for the modes that use them, and at each backward) picks what serves their gradients:

* ``cudnn`` (default since session 43): cuDNN's fused attention backward
  (``aten._scaled_dot_product_cudnn_attention_backward``) fed our forward's O and LSE (`cudnn_backward`; eager and
  traced; where `cudnn_applies`, else the ``flash`` path);
* ``sdpa`` (the default of session 42): eagerly, the forward recomputed by ``scaled_dot_product_attention`` under
  autograd and its fused backward taken (`sdpa_backward`, where `sdpa_applies`; outside `cudnn_trusted` PyTorch's
  FlashAttention-2 op in SDPA's place); inside a traced backward
  (torch.compile), where autograd records nothing, the ``flash`` path below;
* ``flash``: PyTorch's FlashAttention-2 backward kernel (``aten._scaled_dot_product_flash_attention_backward``)
  fed our forward's O and LSE (`flash_backward`; eager and traced; where `flash_applies`);
* ``pytorch``: ``reference.run_backward`` (plain PyTorch, float32 maths, query rows in memory-bounded chunks) for
  every gradient; the only one with the LSE's gradient and second derivatives, so it serves whatever the fused modes
  do not take, in every mode.

With per-sequence KV lengths (``seqlens_k``) the fused modes serve length by length (`_backward_by_length`: the
sequences of one length together, K and V cut to it; one device sync to read the lengths).

Measured on an H100 (session 44, bf16, B x N = 16k, H x D = 2048, head_dim 64 / 128, a forward + backward step
against SDPA's, each waited for, the median of 6 rotated rounds): ``cudnn`` 0.98-1.32x SDPA's time (0.98-1.09x with
steps queued back to back), ``sdpa`` 1.16-1.54x, ``flash`` 1.41-1.86x; ``pytorch`` 21-34x (session 43)
(bench/NOTES.md "Session 44"; sessions 42-43 the same order). At head_dim 256 (session 45, `CUDNN_WIDE` on:
cuDNN's backward there too) ``cudnn`` 1.02 / 1.17x (0.96 / 0.99x queued), non-causal / causal N 4k, against
``sdpa`` 1.13 / 1.26x and the ``flash`` path 1.40-1.63x.
"""
from __future__ import annotations

import functools
import os

import torch

from fa_variants.common.batch_groups import by_value, take

#: FA_VARIANTS_BACKWARD's choices (the first is the default)
BACKWARDS = ("cudnn", "sdpa", "flash", "pytorch")

#: the devices the fused backwards serve: those of the kernel backends (CUDA; PyTorch's FlashAttention-2 backward
#: kernel exists on its CUDA builds, sm80 and newer). Elsewhere (a test's fake kernel on the CPU) ``pytorch`` serves.
FUSED_DEVICES = ("cuda",)
#: that kernel's op: (grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
#: philox_seed, philox_offset, *, scale) -> (dq, dk, dv), tensors (batch, heads, seqlen, head_dim)
FLASH_BACKWARD_OP = torch.ops.aten._scaled_dot_product_flash_attention_backward
#: cuDNN's fused attention backward: (grad_out, q, k, v, out, logsumexp, philox_seed, philox_offset, attn_bias,
#: cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale) -> (dq, dk, dv), tensors (batch, heads,
#: seqlen, head_dim)
CUDNN_BACKWARD_OP = torch.ops.aten._scaled_dot_product_cudnn_attention_backward
#: the largest head_dim cuDNN's attention backward takes on every supported cuDNN (PyTorch's sdp_utils gate)
CUDNN_MAX_HEAD_DIM = 128
#: the largest head_dim with `CUDNN_WIDE`, on compute capability 9.0 where PyTorch itself would run SDPA on cuDNN
#: for the call (``torch.backends.cuda.can_use_cudnn_attention``: its gate, which moves between releases: head_dim up
#: to 256 with cuDNN 9.10+ in torch 2.9-2.11, later releases asking newer cuDNN and frontend): session 44's H100 run
#: timed the sdpa mode (SDPA's forward again, then cuDNN's backward) at 1.17-1.23x SDPA's step at head_dim 256
#: against 1.37-1.54x for the flash kernel's backward that the cudnn mode takes there
CUDNN_SM90_MAX_HEAD_DIM = 256
#: whether the cudnn mode takes head dims above `CUDNN_MAX_HEAD_DIM` (on since session 45: on an H100 its tests
#: passed and it beat the sdpa and cudnn-at-128 modes at both head_dim 256 shapes timed, scripts/backward_gpu.sh's
#: rule; bench/NOTES.md "Session 45")
CUDNN_WIDE = True
#: PyTorch's FlashAttention-2 forward op, differentiable (its derivative is `FLASH_BACKWARD_OP`): (q, k, v,
#: dropout_p, is_causal, return_debug_mask, *, scale) -> (out, logsumexp, ...), tensors (batch, heads, seqlen,
#: head_dim), GQA natively, causal bottom-right
FLASH_FORWARD_OP = torch.ops.aten._scaled_dot_product_flash_attention
#: the compute capability (major) where the cudnn mode takes cuDNN's backward: Hopper, where it was measured faster
#: than FlashAttention-2's (session 43) and where PyTorch's SDPA prefers it. Elsewhere the flash path serves: on sm_8x
#: FlashAttention-2's backward is PyTorch's own choice and cuDNN's engines are missing for some shapes on consumer
#: parts (reported "no valid engine configs" on sm_89); on compute capability 10 and above PyTorch refuses cuDNN's
#: attention at seqlen_q = 1 for cuDNN 9.19-9.25, and nothing here was measured
CUDNN_CAPABILITY_MAJOR = 9
#: the key tile of cuDNN's sm_90 attention backward: where seqlen_k is not a multiple of it and no causal mask covers
#: the padded keys of the last tile, rows whose LSE is below -ln(float32 max) = -88.7 got NaN dQ from it (session 44,
#: H100, cuDNN 9.19: seqlen_k = 64 mod 128 non-causal, the only residue of 22 probed; seqlen_k 128 and square causal
#: passed). `cudnn_trusted` keeps cuDNN off every padded tile without a causal mask (other releases not probed)
CUDNN_KEY_TILE = 128


def keeps_outputs(eager: bool) -> bool:
    """Whether the forward keeps O and LSE for the backward: where `kernel_backward` may take `cudnn_backward` or
    `flash_backward` (``cudnn``, ``flash``; ``sdpa`` when traced). Not otherwise: they would hold memory until the
    backward, and the caller's in-place edit of them would fail it (the reference backend allows that edit)."""
    wanted = mode()
    return wanted in ("cudnn", "flash") or (wanted == "sdpa" and not eager)


def mode() -> str:
    """``FA_VARIANTS_BACKWARD`` (one of `BACKWARDS`; a clear error naming the variable otherwise)."""
    from fa_variants.common import env

    return env.choice("FA_VARIANTS_BACKWARD", BACKWARDS[0], BACKWARDS)


def warn_pytorch_backward(backend: str) -> None:
    """Warn once per process (``dispatch.warn_once``) that kernel backend ``backend`` has no backward kernel: at the
    forward call that needs its gradient when eager (``api._kernel_autograd``), else at the first backward."""
    from fa_variants import dispatch

    dispatch.warn_once(("backward", backend), f"backend {backend} has no backward kernel: its gradients come from "
                       f"PyTorch's backward (FA_VARIANTS_BACKWARD={mode()}: see fa_variants.integrations.backward), "
                       "slower than a fused backward kernel of its own")


def kernel_backward(grad_out, grad_lse, q, k, v, out, lse, seqlens_k, causal: bool, softmax_scale: float | None,
                    backend: str, eager: bool, leftpad_k=None, seqlens_q=None):
    """(dq, dk, dv) of a call's (out, lse) for the upstream gradients (either may be None: that output got none;
    out / lse None: not kept), with no autograd recorded but ``reference.run_backward``'s plain ops (a backward with
    create_graph differentiates those). On a kernel backend, a loss of out alone (grad_lse None; with ``seqlens_k``,
    `_backward_by_length`'s groups one by one) takes FA_VARIANTS_BACKWARD's fused mode where it applies: ``sdpa``
    eagerly where `sdpa_applies`; ``cudnn`` where `cudnn_applies` and the forward kept out and lse; ``flash``, and
    ``sdpa`` when not ``eager`` (inside a traced opaque op autograd records nothing) and ``cudnn`` where it does not
    apply, where `flash_applies` and the forward kept out and lse; everything else ``reference.run_backward``. A
    ``registry.FORWARD_ONLY`` backend raises NotImplementedError; a kernel backend warns once
    (`warn_pytorch_backward`). ``leftpad_k`` (with seqlens_k): each sequence's first key, the windows taken alike;
    ``seqlens_q`` (with seqlens_k): each sequence's query count, its causal rows and padding rows apart."""
    from fa_variants import dispatch, reference, registry

    chosen = dispatch.select_backend(q, k, v, causal=causal, backend=backend).backend
    if chosen in registry.FORWARD_ONLY:
        raise NotImplementedError(f"backend {chosen} is forward-only: no gradient through it "
                                  f"({registry.FORWARD_ONLY[chosen]}); use backend='reference' or 'auto' on 16-bit "
                                  "inputs")
    if chosen != "reference":
        warn_pytorch_backward(chosen)  # an eager forward warned already, at the caller's line
        fused, wanted = grad_out is not None and grad_lse is None, mode()
        if fused and seqlens_k is not None:
            if _by_length_applies(q, wanted):
                return _backward_by_length(grad_out, q, k, v, out, lse, seqlens_k, causal, softmax_scale, chosen,
                                           eager, leftpad_k, seqlens_q)
            fused = False
        if fused and wanted == "sdpa" and eager and sdpa_applies(q, k, causal, softmax_scale):
            return sdpa_backward(grad_out, q, k, v, causal, softmax_scale)
        kept = fused and out is not None and lse is not None
        if kept and wanted == "cudnn" and cudnn_applies(q, k, v, causal, softmax_scale):
            return cudnn_backward(grad_out, q, k, v, out, lse, causal, softmax_scale)
        if kept and wanted != "pytorch" and flash_applies(q, k, causal, softmax_scale):
            return flash_backward(grad_out, q, k, v, out, lse, causal, softmax_scale)
    if grad_out is None:
        grad_out = torch.zeros_like(q)
    if grad_lse is None:
        grad_lse = q.new_zeros((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return reference.run_backward(grad_out, grad_lse, q, k, v, causal=causal,
                                  softmax_scale=_scale(q, softmax_scale), seqlens_k=seqlens_k, leftpad_k=leftpad_k,
                                  seqlens_q=seqlens_q)


def _by_length_applies(q: torch.Tensor, wanted: str) -> bool:
    """Whether a call with per-sequence KV lengths may take the fused backwards (`_backward_by_length`): a fused mode,
    no create_graph, q 16-bit on a device of `FUSED_DEVICES`, and not inside CUDA-graph capture (the lengths are read
    on the host there). Elsewhere ``reference.run_backward`` takes the lengths itself, as before session 53."""
    if wanted == "pytorch" or torch.is_grad_enabled() or q.device.type not in FUSED_DEVICES or q.numel() == 0:
        return False
    if q.dtype not in (torch.float16, torch.bfloat16):
        return False
    return not (q.is_cuda and torch.cuda.is_current_stream_capturing())


def _backward_by_length(grad_out, q, k, v, out, lse, seqlens_k, causal: bool, softmax_scale: float | None,
                        backend: str, eager: bool, leftpad_k=None, seqlens_q=None):
    """(dq, dk, dv) of a call with per-sequence KV lengths (``seqlens_k``: sequence b attends to its first
    seqlens_k[b] keys), from the plain calls' backwards: the sequences of each length n together (views when every
    sequence has it, else gathered), K and V cut to their first n keys, so each group is a call without lengths whose
    backward `kernel_backward` chooses (a fused one where it applies; the reference for causal rows that see no key);
    the forward's O and LSE of those sequences are theirs (the keys past n added nothing to them). dK and dV are 0 past
    each length, dQ is 0 for a sequence of length 0 (its output is 0 whatever Q). The lengths are read on the host
    (one device sync; the groups' rows gathered by ``common.batch_groups``). Written in session 53: before,
    every call with lengths took ``reference.run_backward`` (float32 PyTorch; 21-34x SDPA's step on an H100, session
    43). ``leftpad_k``: the groups are of one key window [leftpad_k[b], seqlens_k[b]), K and V cut to it;
    ``seqlens_q`` (causal): of one window and query count, whose causal rows and padding rows (which see the whole
    window) take a call each (``reference.row_parts``), their dK and dV summed."""
    from fa_variants.reference import row_parts, sequence_windows

    seqlen_q = q.shape[1]
    windows = sequence_windows(seqlens_k, leftpad_k, seqlens_q if causal else None, q.shape[0], k.shape[1], seqlen_q)
    if all(w == (0, k.shape[1], seqlen_q) for w in windows):  # no key padded: the plain call's backward, no copies
        return kernel_backward(grad_out, None, q, k, v, out, lse, None, causal, softmax_scale, backend, eager)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for (start, end, count), index in by_value(windows, q.device, ascending=True):
        if end <= start:
            continue
        keys = slice(start, end)
        g_out, qg, kg, vg, og, lg = (take(t, index) for t in (grad_out, q, k[:, keys], v[:, keys], out, lse))
        parts = [kernel_backward(g_out[:, rows], None, qg[:, rows], kg, vg, _rows(og, rows, 1), _rows(lg, rows, 2),
                                 None, part_causal, softmax_scale, backend, eager)
                 for rows, part_causal in row_parts(count, seqlen_q, causal)]
        group = (torch.cat([p[0] for p in parts], 1), sum(p[1] for p in parts), sum(p[2] for p in parts))
        for grad, into in zip(group, (dq, dk[:, keys], dv[:, keys])):
            if index is None:
                into.copy_(grad)
            else:
                into.index_copy_(0, index, grad)
    return dq, dk, dv


def _rows(t: torch.Tensor | None, rows: slice, dim: int) -> torch.Tensor | None:
    """The query rows ``rows`` of a kept O (dim 1) or LSE (dim 2), None where the forward kept none."""
    return None if t is None else t.narrow(dim, rows.start, rows.stop - rows.start)


def _scale(q: torch.Tensor, softmax_scale: float | None) -> float:
    """The call's softmax_scale, None meaning the forward's default (``reference.default_softmax_scale``: the same
    float, so a backward fed the forward's LSE scales its scores as the forward did)."""
    from fa_variants import reference

    return reference.default_softmax_scale(q.shape[-1]) if softmax_scale is None else softmax_scale


#: the largest batch and num_heads the fused kernels launch (a CUDA grid's y and z extents, over which they spread
#: batch and heads; PyTorch's own gate for cuDNN's attention)
FUSED_MAX_GRID = 65535


def _fused_applies(q: torch.Tensor, k: torch.Tensor, causal: bool) -> bool:
    """What every fused backward here needs: no create_graph (grad mode off in the backward: their kernels have no
    derivative of their own), q on a device of `FUSED_DEVICES`, 16-bit inputs, rows and keys, batch and num_heads
    up to `FUSED_MAX_GRID`, and no causal row without a key (seqlen_q <= seqlen_k: such a row's LSE is -inf, which
    the fused kernels do not take)."""
    if torch.is_grad_enabled() or q.device.type not in FUSED_DEVICES:
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or q.numel() == 0 or k.shape[1] == 0:
        return False
    if q.shape[0] > FUSED_MAX_GRID or q.shape[2] > FUSED_MAX_GRID:
        return False
    return not (causal and q.shape[1] > k.shape[1])


def _fused_scale(scale: float) -> bool:
    """The softmax scales the fused backwards take: float32's smallest normal <= scale <= 1. The kernels mask a score
    to -inf before scaling it (causal keys, the tails of uneven lengths), so a zero scale makes that NaN, a negative
    one +inf, and one that float32 flushes to zero (the forward runs it as 0, ``api._kernel_scale``) the same. Above
    1, a row whose softmax is nearly one-hot has dS = P (dP - rowsum(dO O)) close to 0 while the fused kernels form
    rowsum(dO O) from the 16-bit O, whose rounding dQ = scale dS K and dK = scale dS^T Q then carry, scaled:
    measured with tests/test_backward_flash.py's stand-in, float16, head_dim 64, dQ's error against float64 was
    0.0033 at scale 300 where the PyTorch backward's was 3e-8 (within the gradient rule up to scale 100)."""
    return torch.finfo(torch.float32).tiny <= scale <= 1


def flash_applies(q: torch.Tensor, k: torch.Tensor, causal: bool, softmax_scale: float | None) -> bool:
    """Whether `flash_backward` serves: `_fused_applies` (q on a device of `FUSED_DEVICES`), head_dim a multiple of 8
    up to 256 (the kernel's checks), and softmax_scale within `_fused_scale`."""
    return (_fused_applies(q, k, causal) and q.shape[-1] % 8 == 0
            and q.shape[-1] <= 256 and _fused_scale(_scale(q, softmax_scale)))


def _kernel_ready(t: torch.Tensor) -> torch.Tensor:
    """t with a unit last stride and 16-byte aligned (``interop.aligned``: t itself when it is so, else a view or a
    copy), as the forward hands its kernel: both fused kernels load 16 bytes at a time."""
    from fa_variants.common import interop

    return interop.aligned(t if t.stride(-1) == 1 else t.contiguous())


def flash_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, causal: bool, softmax_scale: float | None):
    """(dq, dk, dv) from PyTorch's FlashAttention-2 backward kernel, given our forward's O and natural-log LSE: the
    kernel recomputes P = exp(softmax_scale Q K^T - LSE) tile by tile and forms dV = P^T dO, dS = P (dO V^T -
    rowsum(dO O)), dQ = scale dS K, dK = scale dS^T Q (Dao, FlashAttention-2 (2023), Algorithm 2), without the
    forward's recomputation that `sdpa_backward` pays. Layout (batch, seqlen, heads, head_dim) as
    ``fa_variants.attention`` (the kernel's (batch, heads, seqlen, head_dim) views are transposes of it); GQA
    natively (dK, dV summed over each KV head's query heads by the kernel); causal bottom-right as the kernel masks
    (seqlen_q <= seqlen_k here); lse (batch, num_heads, seqlen_q) float32, natural log of the scaled scores' sums (the
    kernel checks none of its shape: the op's own LSE is passed). No dropout. Only where `flash_applies`. Contract read
    from PyTorch's attention_backward.cu (``_flash_attention_backward``) and flash_api.cpp (``mha_bwd``)."""
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    scale = _scale(q, softmax_scale)
    rng_state = torch.empty(2, dtype=torch.uint64, device=q.device)  # the forward's dropout RNG state: no dropout,
    unused = torch.empty((), dtype=torch.uint64, device=q.device)     # so never read (shapes and dtype as its own)
    views = [_kernel_ready(t).transpose(1, 2) for t in (grad_out, q, k, v, out)]
    dq, dk, dv = FLASH_BACKWARD_OP(
        *views, lse.float().contiguous(), None, None, seqlen_q, seqlen_k, 0.0, causal, rng_state, unused, scale=scale)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


def cudnn_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  softmax_scale: float | None) -> bool:
    """Whether `cudnn_backward` serves: where the flash path would (`flash_applies`: its fallback), narrowed to
    head_dim up to `CUDNN_MAX_HEAD_DIM` (or beyond, `_cudnn_wide`), for causal seqlen_q == seqlen_k (cuDNN's dense
    causal mask is top-left aligned, ours bottom-right, the same only for square scores), the geometries of
    `cudnn_trusted` (which leave out one key too, PyTorch's gate for cuDNN attention), a GPU of compute capability 9.x
    (`CUDNN_CAPABILITY_MAJOR`), no broadcast (stride 0) dimension in Q, K or V, and `_cudnn_allowed`."""
    return (flash_applies(q, k, causal, softmax_scale) and (not causal or q.shape[1] == k.shape[1])
            and cudnn_trusted(q.shape[1], k.shape[1], causal)
            and _capability(q.device)[0] == CUDNN_CAPABILITY_MAJOR and not any(_broadcast(t) for t in (q, k, v))
            and _cudnn_allowed() and (q.shape[-1] <= CUDNN_MAX_HEAD_DIM or _cudnn_wide(q, k, v, causal)))


def _cudnn_wide(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> bool:
    """Whether cuDNN's backward takes this call's head_dim above `CUDNN_MAX_HEAD_DIM`: `CUDNN_WIDE` on, head_dim up to
    `CUDNN_SM90_MAX_HEAD_DIM`, compute capability 9.0, and PyTorch's own check says SDPA would run cuDNN's attention
    on these tensors (`_pytorch_takes_cudnn`)."""
    return (CUDNN_WIDE and q.shape[-1] <= CUDNN_SM90_MAX_HEAD_DIM and _capability(q.device) == (9, 0)
            and _pytorch_takes_cudnn(q, k, v, causal))


def _pytorch_takes_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> bool:
    """``torch.backends.cuda.can_use_cudnn_attention`` on SDPA's (batch, heads, seqlen, head_dim) views of the call,
    marked as requiring grad under grad mode (some releases gate cuDNN's backward at head_dim above 128 apart from its
    forward): its head_dim, cuDNN version, GQA and last-stride gates."""
    from torch.backends import cuda

    views = [t.detach().requires_grad_(True).transpose(1, 2) for t in (q, k, v)]
    with torch.enable_grad():  # PyTorch's "input requires grad" is requires_grad under grad mode (off in a backward)
        try:
            params = cuda.SDPAParams(*views, None, 0.0, causal, q.shape[2] != k.shape[2])
        except TypeError:  # releases before enable_gqa
            params = cuda.SDPAParams(*views, None, 0.0, causal)
        try:
            return bool(cuda.can_use_cudnn_attention(params, False))
        except RuntimeError:  # the gate itself failed (a release or device it does not know): not cuDNN's then
            return False


def cudnn_trusted(seqlen_q: int, seqlen_k: int, causal: bool) -> bool:
    """The geometries where cuDNN's attention backward is trusted with any input: more than one query row, and seqlen_k
    a multiple of `CUDNN_KEY_TILE` (no padded keys) or causal with seqlen_q == seqlen_k (the causal mask covers the
    padded keys of the last tile). Elsewhere a row whose LSE is below -88.7 (every score far below zero) got NaN dQ
    from it: the padded keys enter exp(score - LSE) unmasked and overflow (session 44, cuDNN 9.19); one query row is
    reported to give NaN dK / dV at seqlen_k 128 on cuDNN 9.25-9.26 (cudnn-frontend's issue tracker; not seen on 9.19).
    Checked from the shapes alone, with no host sync to read the LSE."""
    return seqlen_q > 1 and (seqlen_k % CUDNN_KEY_TILE == 0 or (causal and seqlen_q == seqlen_k))


def _broadcast(t: torch.Tensor) -> bool:
    """Whether t has a stride-0 dimension of length above 1 (an ``expand``)."""
    return any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape))


def _cudnn_allowed() -> bool:
    """PyTorch's process-wide switches that keep cuDNN's attention off, honoured here as SDPA honours them: cuDNN's
    SDPA disabled (``torch.backends.cuda.enable_cudnn_sdp(False)``); deterministic algorithms required
    (``torch.use_deterministic_algorithms(True)``, not warn-only: cuDNN's attention backward is not deterministic,
    PyTorch's FlashAttention-2 backward honours the flag); ``TORCH_CUDNN_SDPA_AVOID_RECOMPILE`` on (cuDNN's forward
    then keeps its statistics in another layout, which its backward addresses: ours are (batch, heads, seqlen_q))."""
    if not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        return False
    return os.environ.get("TORCH_CUDNN_SDPA_AVOID_RECOMPILE", "").strip().upper() not in ("1", "ON", "YES", "TRUE",
                                                                                        "Y")


def _capability(device: torch.device) -> tuple[int, int]:
    """The device's compute capability ((0, 0) off CUDA)."""
    from fa_variants import dispatch

    return dispatch.device_capability(device) or (0, 0)


@functools.cache
def _cudnn_lse_trailing_dim() -> bool:
    """Whether cuDNN's attention keeps its LSE as (batch, heads, seqlen_q, 1) (PyTorch 2.9 and later) rather than
    (batch, heads, seqlen_q): read from the shape its forward's meta kernel gives, so the backward gets the layout
    its own forward would have handed it."""
    q = torch.empty(1, 1, 2, 8, device="meta", dtype=torch.bfloat16)
    return torch.ops.aten._scaled_dot_product_cudnn_attention(q, q, q, None, True)[1].dim() == 4


def _in_layout_of(ref: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``t`` (ref's shape) dense with ``ref``'s order of dimensions, outermost first by ref's strides (a stable sort:
    ties keep their order; broadcast dimensions outermost, as PyTorch's own ``alloc_with_matching_layout``), and
    16-byte aligned: ``t`` itself when it is already so, else a copy. The layout cuDNN's own SDPA path gives O
    (allocated to match Q); dO it takes as autograd hands it, which in the usual call is O's layout too."""
    from fa_variants.common import interop

    order, inverse, strides = _dense_layout(tuple(ref.shape), tuple(ref.stride()))
    if t.stride() == strides and interop.is_aligned(t):  # the usual call: already so (checked in ~1 us)
        return t
    dense = t.permute(order).contiguous().permute(inverse)
    if not interop.is_aligned(dense):  # t was already dense in that order but not aligned: a fresh copy is
        dense = t.permute(order).clone(memory_format=torch.contiguous_format).permute(inverse)
    return dense


@functools.lru_cache(maxsize=256)
def _dense_layout(shape: tuple, strides: tuple) -> tuple[list, list, tuple]:
    """(order, inverse, dense strides) of `_in_layout_of` for a reference of this shape and these strides: the
    dimensions outermost first, the permutation back, and the strides of a tensor of that shape dense in that
    order (sizes of 1 count as 1, as ``contiguous`` lays them out)."""
    order = sorted(range(len(shape)), key=lambda d: (strides[d] != 0 or shape[d] == 1, -strides[d]))
    inverse = [order.index(d) for d in range(len(shape))]
    dense = [0] * len(shape)
    step = 1
    for d in reversed(order):
        dense[d] = step
        step *= max(shape[d], 1)
    return order, inverse, tuple(dense)


def cudnn_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, causal: bool, softmax_scale: float | None):
    """(dq, dk, dv) from cuDNN's fused attention backward (the one SDPA's cuDNN path runs, faster than
    FlashAttention-2's on Hopper), given our forward's O and natural-log LSE (cuDNN's softmax statistics are the same
    quantity: logsumexp of the scaled scores). Layout (batch, seqlen, heads, head_dim) as ``fa_variants.attention``
    (the op's (batch, heads, seqlen, head_dim) views are transposes of it; Q, K, V with any strides, a unit last
    stride and 16-byte alignment, `_kernel_ready`); GQA natively; causal only with seqlen_q == seqlen_k
    (`cudnn_applies`). O and dO go dense in Q's order of dimensions (`_in_layout_of`; no copy for the (batch, seqlen,
    heads, head_dim) tensors of the usual call): PyTorch releases before its newest cache cuDNN's backward graph under
    Q's, K's and V's shapes and strides alone, so for given Q / K / V strides every call of ours hands the same O / dO
    layout, the one SDPA's own cuDNN path gives O (and, in the usual call, dO), and a graph built by either caller
    reads the other's tensors right while SDPA's dO keeps its O's layout. (An SDPA caller whose dO is laid out
    otherwise at the same shapes and Q strides shares a graph with ours on those releases: FA_VARIANTS_BACKWARD=flash
    avoids it.) No dropout: its seed and offset tensors are never read but must be tensors. Contract
    read from PyTorch's attention_backward.cu (``_scaled_dot_product_cudnn_attention_backward_cuda``), cudnn/MHA.cpp
    (``run_cudnn_SDP_bprop``, the graph cache ``MHACacheKeyWrapper``) and _meta_registrations.py."""
    unused = torch.empty((), dtype=torch.int64, device=q.device)
    qv, kv, vv = (_kernel_ready(t).transpose(1, 2) for t in (q, k, v))
    out_v, grad_out_v = (_in_layout_of(qv, t.transpose(1, 2)) for t in (out, grad_out))
    stats = lse.float().contiguous()
    if _cudnn_lse_trailing_dim():
        stats = stats.unsqueeze(-1)
    dq, dk, dv = CUDNN_BACKWARD_OP(grad_out_v, qv, kv, vv, out_v, stats, unused, unused, None, None, None, q.shape[1],
                                   k.shape[1], 0.0, causal, scale=_scale(q, softmax_scale))
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


def sdpa_applies(q: torch.Tensor, k: torch.Tensor, causal: bool, softmax_scale: float | None) -> bool:
    """Whether `sdpa_backward` serves an eager backward: `_fused_applies` and softmax_scale within `_fused_scale` (a
    negative, large or flushed scale is left to ``reference.run_backward``, which handles it); outside
    `cudnn_trusted`, where it takes PyTorch's FlashAttention-2 op, `flash_applies` (its head dims) and PyTorch's flash
    SDPA enabled (``torch.backends.cuda.flash_sdp_enabled``)."""
    if cudnn_trusted(q.shape[1], k.shape[1], causal):
        return _fused_applies(q, k, causal) and _fused_scale(_scale(q, softmax_scale))
    return flash_applies(q, k, causal, softmax_scale) and torch.backends.cuda.flash_sdp_enabled()


def sdpa_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  softmax_scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of out = attention(q, k, v) for grad_out, by recomputing the forward with PyTorch's
    ``scaled_dot_product_attention`` under autograd (its fused backward: flash, memory-efficient or cuDNN, as PyTorch
    chooses). Layout (batch, seqlen, heads, head_dim) as ``fa_variants.attention``; GQA by repeating each KV head
    over its query heads (autograd sums their gradients back); causal bottom-right through
    ``torch.nn.attention.bias.causal_lower_right`` when seqlen_q != seqlen_k. Outside `cudnn_trusted`, where SDPA
    could pick cuDNN's backward (Hopper), the forward is PyTorch's FlashAttention-2 op instead (`FLASH_FORWARD_OP`:
    GQA natively, causal bottom-right), its backward the flash kernel's: chosen per call, not by SDPA's process-wide
    backend switches, which other threads share (autograd runs each device's backward on its own thread). Only where
    `sdpa_applies`, eagerly (inside a traced opaque op autograd records nothing)."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    group = q.shape[2] // k.shape[2]
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        if not cudnn_trusted(seqlen_q, seqlen_k, causal):
            views = [_kernel_ready(t).transpose(1, 2) for t in leaves]
            out = FLASH_FORWARD_OP(*views, 0.0, causal, False, scale=softmax_scale)[0]
            return torch.autograd.grad(out.transpose(1, 2), leaves, _kernel_ready(grad_out))
        qt, kt, vt = (t.transpose(1, 2) for t in leaves)
        if group > 1:
            kt, vt = kt.repeat_interleave(group, dim=1), vt.repeat_interleave(group, dim=1)
        mask = causal_lower_right(seqlen_q, seqlen_k) if causal and seqlen_q != seqlen_k else None
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal and mask is None,
                                             scale=softmax_scale)
        return torch.autograd.grad(out.transpose(1, 2), leaves, grad_out)
