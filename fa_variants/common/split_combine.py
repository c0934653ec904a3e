"""The split-KV merge (``common.split``) as one CuTe DSL kernel (variant "split-merge"): one launch instead of
the ~20 torch ops of ``split.merge`` (host time per decode call, issue 13).

One CTA per (query row, head, batch), flattened into grid.x; head_dim threads, thread c owns column c of the
row. With S = the split count and LSE_s, O_s the partials of the row (``hopper.fa3``'s split path):

1. m = max_s LSE_s (every thread reads the same S values: broadcast loads);
2. l = sum_s exp(LSE_s - m') with m' = m, or 0 when every split is empty (m = -inf): l = 0 then;
   LSE = m' + log l, or -inf when l = 0;
3. O[c] = sum_s exp(LSE_s - LSE) O_s[c] over the splits with LSE_s != -inf (an empty split's O_s is never
   read: it is unwritten), rounded once to the output dtype; 0 when every split is empty.

The sums run over s = 0 .. S-1 in that order for every row, so a row's result depends on its split count
only, never on the batch or the other rows (docs/edge_cases.md, EC-19). A NaN LSE_s makes l, LSE and O NaN
(as the unsplit kernel's row would be). exp and log are ex2 / lg2 (MUFU) with log2(e) folded in. The O loop
is unrolled by 8 so that the loads of 8 splits are in flight together (the adds stay in split order); the O_s of
the first ``PREFETCH`` splits are loaded before the LSE passes, together with the LSE loads. The LSE_s are
staged in shared memory, head_dim splits at a time, by one load per thread (``_stage``), once when there are
at most head_dim splits (three passes over them otherwise, one memory latency each instead of one per split).
``common.split_model.combine_model`` is this maths in torch (CPU tests).
Plain loads and stores: built for every arch the fa2 kernel runs on (fa2's and fa3's split-KV merge). Our own design (no source followed). The kernel class
lives in ``common.split_combine_kernel`` (the CuTe DSL), imported only to compile.

Programmatic dependent launch (``MergeConfig.pdl``, sm_90a; ``MERGE_PDL`` / FA_VARIANTS_MERGE_PDL=1, or a
``Sm90Config.pdl`` split kernel): the merge is launched with programmatic stream serialisation, so its CTAs may
start while the split kernel before it on the stream still runs (fa3's split kernel signals
``griddepcontrol.launch_dependents`` as its CTAs start); each merge CTA computes its indices and then waits
(``griddepcontrol.wait``: the split grid finished, its writes visible) before its first load. That hides the
launch gap between the two kernels (decode at batch 1: a few us in all).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from fa_variants.common import env, interop, pack_gqa, split, workspace
from fa_variants.common.cache import StaticConfig
from fa_variants.common.launch import SM80_CODE_ARCHS, Variant

HEAD_DIMS = (64, 96, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)
LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
PREFETCH = 16  # O partials per thread loaded before the LSE passes (registers; <= the smallest head_dim)

#: Whether ``merge`` / ``merge_function`` launch the merge kernel as a programmatic dependent of the kernel
#: before it (module docstring; sm_90a only) when not told. Read at each call (``scripts/decode_ab.py`` flips it).
MERGE_PDL = env.flag("FA_VARIANTS_MERGE_PDL", False)
#: Whether the merge runs as ``SplitMergeWarp`` (LSEs in registers, warp shuffles, no barrier: ``MergeConfig.warp``)
#: instead of ``SplitMerge`` (LSEs staged in shared memory): None (FA_VARIANTS_MERGE_WARP=auto, the default) at
#: MERGE_WARP_MIN_SPLITS splits or more (``warp_merge_for``), True / False (=1 / =0) always / never. H200, session 7
#: (scripts/decode_ab.py --s7, fa3 decode, warp / shared-memory merge GPU time): 0.94-0.99 at 16 splits (8 shapes),
#: 0.93 at 8, 1.07-1.10 at 2 (the warp kernel's extra loads cost more than the barrier it saves with few splits).
#: Read at each call.
MERGE_WARP: bool | None = env.auto_flag("FA_VARIANTS_MERGE_WARP")
MERGE_WARP_MIN_SPLITS = 8


def warp_merge_for(splits: int) -> bool:
    """Whether a merge of ``splits`` partial results runs the warp kernel (``MERGE_WARP``; None: at
    MERGE_WARP_MIN_SPLITS or more)."""
    return splits >= MERGE_WARP_MIN_SPLITS if MERGE_WARP is None else bool(MERGE_WARP)


@dataclasses.dataclass(frozen=True)
class MergeConfig:
    """One thread per column of a row (no tunable shape); pdl: launched as a programmatic dependent of the
    kernel before it, waiting for that grid before its first load (sm_90a only; module docstring); warp: the
    register / shuffle kernel (``split_combine_kernel.SplitMergeWarp``) instead of the shared-memory one."""

    pdl: bool = False
    warp: bool = False

    def check(self, head_dim: int, arch: str = "sm_90a") -> "MergeConfig":
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"the split merge kernel is built for head_dim {HEAD_DIMS}, not {head_dim}")
        if self.pdl and not arch.startswith("sm_9"):
            raise ValueError(f"MergeConfig(pdl=True) needs sm_90a (griddepcontrol), not {arch}")
        return self


def fake_args(dtype: str, head_dim: int, align: int = interop.DEFAULT_ALIGN):
    """Fake (o_parts, lse_parts, out, lse, stream): dynamic extents and strides, unit last stride."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream

    sb, b, nq, h = (cute.sym_int() for _ in range(4))
    o_parts = interop.fake_tensor("fp32", (sb, nq, h, head_dim), align)
    lse_parts = interop.fake_tensor("fp32", (sb, h, nq), 4)
    out = interop.fake_tensor(dtype, (b, nq, h, head_dim), align)
    lse = interop.fake_tensor("fp32", (b, h, nq), 4)
    return o_parts, lse_parts, out, lse, make_fake_stream(use_tvm_ffi_env_stream=True)


def fake_partials(q, head_dim: int):
    """Fake fp32 partials (o_parts (S*B, Nq, H, D), lse_parts (S*B, H, Nq)) for a split-KV kernel whose fake q
    is (B, Nq, H, D): S*B a fresh dynamic extent (the split count is read from it at run time)."""
    import cutlass.cute as cute

    splits_x_batch = cute.sym_int()
    o = interop.fake_tensor("fp32", (splits_x_batch, q.shape[1], q.shape[2], head_dim))
    lse = interop.fake_tensor("fp32", (splits_x_batch, q.shape[2], q.shape[1]), 4)
    return o, lse


def partials_scratch(batch: int, seqlen_q: int, heads: int, head_dim: int, splits: int, device: torch.device, *,
                     heads_kv: int | None = None, counters: int = 0):
    """The fp32 partials of a split-KV call of this shape, for fa3 and fa2 alike: ``scratch() -> (o_kernel,
    lse_kernel, o_parts, lse_parts)`` (+ ``counters`` zeroed int32 when counters > 0) from ``common.workspace``
    (on a CUDA device a buffer per stream, these views cached: no allocation and no tensor op per call; under
    CUDA-graph capture and on the CPU fresh memory, as the workspace's rule says).

    o_parts (splits * batch, seqlen_q, heads, head_dim) and lse_parts (splits * batch, heads, seqlen_q), float32,
    each contiguous, LSE's after O's in one buffer, split s of batch b at s * batch + b: what the merge kernel
    reads (``merge_function``). o_kernel, lse_kernel: the same memory as the split kernel writes it: the same
    views, or with ``heads_kv`` (packed GQA at seqlen_q = 1) ``common.pack_gqa.views`` of them."""
    o_shape, lse_shape = (splits * batch, seqlen_q, heads, head_dim), (splits * batch, heads, seqlen_q)
    o_view, lse_view = (o_shape, split.contiguous_strides(o_shape)), (lse_shape, split.contiguous_strides(lse_shape))
    o_size = math.prod(o_shape)
    size = o_size + math.prod(lse_shape)
    o_kernel, lse_kernel = o_view, lse_view
    if heads_kv is not None:
        o_kernel, lse_kernel = pack_gqa.rows_geometry(*o_view, heads_kv), pack_gqa.lse_geometry(*lse_view, heads_kv)
    geometry = ("split partials", o_view, lse_view, o_kernel, lse_kernel, counters)

    def make(buf, counter_buf):
        views = (buf.as_strided(*o_kernel, 0), buf.as_strided(*lse_kernel, o_size),
                 buf.as_strided(*o_view, 0), buf.as_strided(*lse_view, o_size))
        return views + (counter_buf,) if counters else views

    return workspace.function(device, size, counters, geometry, make)


class SplitArgs(tuple):
    """A split kernel's runtime arguments (a tuple), carrying the scratch views (``partials_scratch``) that the
    merge after it reads."""

    def __new__(cls, args: tuple, scratch: tuple):
        self = super().__new__(cls, args)
        self.scratch = scratch
        return self


def split_steps(scratch, q_view: tuple | None, tail: tuple, merge):
    """(prepare, finish) of a two-kernel split-KV call (``common.launch.Variant.plan_call``): ``prepare(q, k, v,
    out, lse)`` gives the split kernel's arguments ``(q, k, v, o_kernel, lse_kernel, *tail)`` (q re-strided to
    ``q_view`` = (shape, stride) when given: packed GQA) with the partials from ``scratch`` (``partials_scratch``);
    ``finish(args, out, lse)`` runs ``merge(o_parts, lse_parts, out, lse)`` on the same partials. ``prepare
    .launch_with(fn)`` gives both around the kernel ``fn`` as one ``launch(q, k, v, out, lse)`` (what
    ``common.launch`` runs; prepare and finish stay for diagnostics and tests)."""
    if q_view is None:
        def prepare(q, k, v, out, lse):
            views = scratch()
            return SplitArgs((q, k, v, views[0], views[1], *tail), views)
    else:
        def prepare(q, k, v, out, lse):
            views = scratch()
            return SplitArgs((q.as_strided(*q_view), k, v, views[0], views[1], *tail), views)

    def finish(args, out, lse):
        views = args.scratch
        merge(views[2], views[3], out, lse)

    def launch_with(fn):  # the whole launch in one function: no argument tuple carrying the views to finish
        if q_view is None:  # extra: the kernel's arguments after tail (seqlens_k), as common.launch passes them
            def launch(q, k, v, out, lse, *extra):
                views = scratch()
                fn(q, k, v, views[0], views[1], *tail, *extra)
                merge(views[2], views[3], out, lse)
        else:
            def launch(q, k, v, out, lse, *extra):
                views = scratch()
                fn(q.as_strided(*q_view), k, v, views[0], views[1], *tail, *extra)
                merge(views[2], views[3], out, lse)
        return launch
    prepare.launch_with = launch_with
    return prepare, finish


def _build(cfg: StaticConfig):
    from fa_variants.common.split_combine_kernel import SplitMerge, SplitMergeWarp  # the DSL: only to compile

    kernel = SplitMergeWarp if cfg.config.warp else SplitMerge
    return (kernel(interop.cute_dtype(cfg.dtype), cfg.head_dim, cfg.config.pdl),
            fake_args(cfg.dtype, cfg.head_dim, cfg.align))


# Compiled through the registry ("split-merge", `fa-variants compile --variant split-merge`); never dispatched
# to (it is not attention): ``merge`` below launches it.
VARIANT = Variant(
    "split-merge", archs=SM80_CODE_ARCHS, dtypes=DTYPES, head_dims=HEAD_DIMS,
    default_config=lambda arch, head_dim, causal: MergeConfig(),
    check_config=lambda config, arch, head_dim: config.check(head_dim, arch), build=_build)

_FNS: dict[tuple, object] = {}


def merge_function(device: torch.device, dtype: torch.dtype, head_dim: int, pdl: bool | None = None,
                   warp: bool | None = None):
    """The compiled merge kernel for outputs of this device, dtype and head_dim (compiled or loaded on first
    use): ``fn(o_parts, lse_parts, out, lse)`` as `merge` takes them. ``pdl`` (None: ``MERGE_PDL``) on an sm90
    GPU: launched as a programmatic dependent of the kernel before it on the stream; ``warp`` (None: ``MERGE_WARP``,
    its auto setting meaning the shared-memory kernel, the split count being unknown here): the register / shuffle
    kernel."""
    pdl = MERGE_PDL if pdl is None else pdl
    warp = bool(MERGE_WARP) if warp is None else warp
    key = (device, dtype, head_dim, pdl, warp)
    fn = _FNS.get(key)
    if fn is None:
        cfg = _merge_static_config(interop.device_arch(device), interop.dtype_name(dtype), head_dim, pdl, warp)
        fn = _FNS[key] = VARIANT.compiled(cfg).fn
    return fn


def _merge_static_config(arch: str, dtype: str, head_dim: int, pdl: bool, warp: bool) -> StaticConfig:
    from fa_variants import registry

    return registry.static_config("split-merge", arch, dtype, head_dim, False,
                                  MergeConfig(pdl=pdl and arch.startswith("sm_9"), warp=warp))


def merge_configs(arch: str, dtype: str, head_dim: int, pdl: bool | None = None,
                  by_splits: bool = True) -> tuple[StaticConfig, ...]:
    """The merge kernels a split call may compile through ``merge_function`` (for `fa-variants warmup`): ``pdl``
    as there (None: MERGE_PDL); ``by_splits``: the caller picks the kernel by its split count (``warp_merge_for``:
    both kernels while MERGE_WARP is auto), else ``merge_function``'s own choice (bool(MERGE_WARP))."""
    pdl = MERGE_PDL if pdl is None else pdl
    warps = (False, True) if by_splits and MERGE_WARP is None else (bool(MERGE_WARP),)
    return tuple(_merge_static_config(arch, dtype, head_dim, pdl, warp) for warp in warps)


def merge(o_parts: torch.Tensor, lse_parts: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
          pdl: bool | None = None, warp: bool | None = None) -> None:
    """``split.merge`` on the GPU in one launch: o_parts (S*B, Nq, H, D) and lse_parts (S*B, H, Nq) float32
    contiguous (split s of batch b at s * B + b), into out (B, Nq, H, D) (float16 / bfloat16, unit last
    stride, 16-byte aligned strides) and lse (B, H, Nq) float32 (unit last stride); ``pdl`` and
    ``warp`` as in ``merge_function``."""
    merge_function(out.device, out.dtype, out.shape[-1], pdl, warp)(o_parts, lse_parts, out, lse)
