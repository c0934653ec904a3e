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
is unrolled by 8 so that the loads of 8 splits are in flight together (the adds stay in split order). The
LSE_s are staged in shared memory, head_dim splits at a time, by one load per thread (``_stage``): three
passes over them cost one memory latency each instead of one per split.
``common.split_model.combine_model`` is this maths in torch (CPU tests).
Plain loads and stores: built for sm_80 and sm_90a. Our own design (no source followed).
"""
from __future__ import annotations

import dataclasses
import math

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from fa_variants.common import interop
from fa_variants.common.cache import StaticConfig
from fa_variants.common.launch import Variant

HEAD_DIMS = (64, 96, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)
LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


@dataclasses.dataclass(frozen=True)
class MergeConfig:
    """The merge kernel has no tunable shape: one thread per column of a row (part of the compile key)."""

    def check(self, head_dim: int) -> "MergeConfig":
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"the split merge kernel is built for head_dim {HEAD_DIMS}, not {head_dim}")
        return self


class SplitMerge:
    """``__call__`` (host, traced once per (out dtype, head_dim)): o_parts (S*B, Nq, H, D) float32,
    lse_parts (S*B, H, Nq) float32 (split s of batch b at index s * B + b), out (B, Nq, H, D) 16-bit,
    lse (B, H, Nq) float32; S = o_parts' first extent // out's."""

    def __init__(self, out_dtype, head_dim: int):
        self.out_dtype, self.head_dim = out_dtype, head_dim

    @cute.jit
    def __call__(self, mOparts: cute.Tensor, mLSEparts: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 stream: cuda.CUstream):
        grid = (mO.shape[0] * mO.shape[1] * mO.shape[2], 1, 1)
        self.kernel(mOparts, mLSEparts, mO, mLSE).launch(grid=grid, block=[self.head_dim, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mOparts: cute.Tensor, mLSEparts: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor):
        col, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        batch, seqlen_q, heads = mO.shape[0], mO.shape[1], mO.shape[2]
        row = bid % seqlen_q
        head = (bid // seqlen_q) % heads
        b = bid // (seqlen_q * heads)
        splits = mOparts.shape[0] // batch

        # LSE_s of the row, head_dim splits at a time: one load per thread into shared memory (all in flight
        # together), then every thread reads them in split order (a loop of dependent global loads was one
        # memory latency per split: ~S x 0.3-0.5 us at B = 1).
        sLSE = cutlass.memory.SmemAllocator().allocate_tensor(Float32, cute.make_layout(self.head_dim), 16)
        m = -Float32.inf
        for c0 in cutlass.range(0, splits, self.head_dim, unroll=1):
            self._stage(sLSE, mLSEparts, c0, col, splits, batch, b, head, row)
            for i in cutlass.range(cutlass.min(self.head_dim, splits - c0), unroll=4):
                m = cutlass.max(m, sLSE[i])
        m_safe = m
        if m == -Float32.inf:
            m_safe = Float32(0.0)
        l = Float32(0.0)
        for c0 in cutlass.range(0, splits, self.head_dim, unroll=1):
            self._stage(sLSE, mLSEparts, c0, col, splits, batch, b, head, row)
            for i in cutlass.range(cutlass.min(self.head_dim, splits - c0), unroll=4):
                l += cute.math.exp2((sLSE[i] - m_safe) * LOG2_E, fastmath=True)
        lse = -Float32.inf
        acc = Float32(0.0)
        if l != Float32(0.0):  # the same for every thread of the CTA: the barriers in _stage are uniform
            lse = m_safe + cute.math.log2(l, fastmath=True) * LN_2
            for c0 in cutlass.range(0, splits, self.head_dim, unroll=1):
                self._stage(sLSE, mLSEparts, c0, col, splits, batch, b, head, row)
                for i in cutlass.range(cutlass.min(self.head_dim, splits - c0), unroll=8):
                    x = sLSE[i]
                    if x != -Float32.inf:
                        acc += cute.math.exp2((x - lse) * LOG2_E, fastmath=True) * mOparts[(c0 + i) * batch + b, row, head, col]
        mO[b, row, head, col] = acc.to(self.out_dtype)
        if col == 0:
            mLSE[b, head, row] = lse

    @cute.jit
    def _stage(self, sLSE: cute.Tensor, mLSEparts: cute.Tensor, c0: Int32, col: Int32, splits: Int32, batch: Int32,
               b: Int32, head: Int32, row: Int32):
        """sLSE[i] = LSE of split c0 + i for i < min(head_dim, splits - c0) (thread i loads one), between two
        barriers: the previous chunk's reads are done before, the writes visible after."""
        cute.arch.sync_threads()
        x = -Float32.inf
        if c0 + col < splits:
            x = mLSEparts[(c0 + col) * batch + b, head, row]
        sLSE[col] = x
        cute.arch.sync_threads()


def fake_args(dtype: str, head_dim: int, align: int = interop.DEFAULT_ALIGN):
    """Fake (o_parts, lse_parts, out, lse, stream): dynamic extents and strides, unit last stride."""
    from cutlass.cute.runtime import make_fake_stream

    sb, b, nq, h = (cute.sym_int() for _ in range(4))
    o_parts = interop.fake_tensor("fp32", (sb, nq, h, head_dim), align)
    lse_parts = interop.fake_tensor("fp32", (sb, h, nq), 4)
    out = interop.fake_tensor(dtype, (b, nq, h, head_dim), align)
    lse = interop.fake_tensor("fp32", (b, h, nq), 4)
    return o_parts, lse_parts, out, lse, make_fake_stream(use_tvm_ffi_env_stream=True)


def _build(cfg: StaticConfig):
    return SplitMerge(interop.cute_dtype(cfg.dtype), cfg.head_dim), fake_args(cfg.dtype, cfg.head_dim, cfg.align)


# Compiled through the registry ("split-merge", `fa-variants compile --variant split-merge`); never dispatched
# to (it is not attention): ``merge`` below launches it.
VARIANT = Variant(
    "split-merge", archs=("sm_80", "sm_90a"), dtypes=DTYPES, head_dims=HEAD_DIMS,
    default_config=lambda arch, head_dim, causal: MergeConfig(),
    check_config=lambda config, arch, head_dim: config.check(head_dim), build=_build)

_FNS: dict[tuple, object] = {}


def merge(o_parts: torch.Tensor, lse_parts: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """``split.merge`` on the GPU in one launch: o_parts (S*B, Nq, H, D) and lse_parts (S*B, H, Nq) float32
    contiguous (split s of batch b at s * B + b), into out (B, Nq, H, D) (float16 / bfloat16, unit last
    stride, 16-byte aligned strides) and lse (B, H, Nq) float32 (unit last stride)."""
    key = (out.device, out.dtype, out.shape[-1])
    fn = _FNS.get(key)
    if fn is None:
        from fa_variants import registry

        cfg = registry.static_config("split-merge", interop.device_arch(out.device), interop.dtype_name(out.dtype),
                                     out.shape[-1], False, MergeConfig())
        fn = _FNS[key] = VARIANT.compiled(cfg).fn
    fn(o_parts, lse_parts, out, lse)
