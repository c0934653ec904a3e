"""The CuTe DSL kernel of the split-KV merge, ``SplitMerge`` (the maths: ``common.split_combine``'s docstring).
Imported only to compile (``split_combine._build``): a process that loads its kernels from the disk cache never
imports the DSL. Our own design (no source followed).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from fa_variants.common.split_combine import LN_2, LOG2_E, PREFETCH


class _Merge:
    """The host side both merge kernels share: ``__call__`` (traced once per (out dtype, head_dim)) launches
    ``kernel`` on ``grid(mO)`` with one thread per column of a row (head_dim threads), as a programmatic
    dependent when ``pdl``. o_parts (S*B, Nq, H, D) float32, lse_parts (S*B, H, Nq) float32 (split s of batch b
    at index s * B + b), out (B, Nq, H, D) 16-bit, lse (B, H, Nq) float32; S = o_parts' first extent // out's."""

    def __init__(self, out_dtype, head_dim: int, pdl: bool = False):
        self.out_dtype, self.head_dim, self.pdl = out_dtype, head_dim, pdl

    @cute.jit
    def __call__(self, mOparts: cute.Tensor, mLSEparts: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 stream: cuda.CUstream):
        self.kernel(mOparts, mLSEparts, mO, mLSE).launch(grid=self.grid(mO), block=[self.head_dim, 1, 1],
                                                         stream=stream, use_pdl=self.pdl)


class SplitMerge(_Merge):
    """The shared-memory merge (``_Merge``'s arguments): one CTA per (row, head, batch) on a 1-D grid, rows fastest."""

    def grid(self, mO: cute.Tensor):
        return (mO.shape[0] * mO.shape[1] * mO.shape[2], 1, 1)

    @cute.kernel
    def kernel(self, mOparts: cute.Tensor, mLSEparts: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor):
        col, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        batch, seqlen_q, heads = mO.shape[0], mO.shape[1], mO.shape[2]
        row = bid % seqlen_q
        head = (bid // seqlen_q) % heads
        b = bid // (seqlen_q * heads)
        splits = mOparts.shape[0] // batch
        if const_expr(self.pdl):  # the split kernel's partials: wait for its grid (and its writes) first;
            cute.arch.griddepcontrol_launch_dependents()  # a next kernel launched as a dependent may start
            cute.arch.griddepcontrol_wait()

        # O_s[col] of the first PREFETCH splits, loaded now: in flight together with the LSE loads below, so
        # that a merge of up to PREFETCH splits costs one memory latency, not two.
        o_pre = cute.make_rmem_tensor(cute.make_layout(PREFETCH), Float32)
        for i in cutlass.range_constexpr(PREFETCH):
            o_pre[i] = Float32(0.0)
            if i < splits:
                o_pre[i] = mOparts[i * batch + b, row, head, col]
        # LSE_s of the row, head_dim splits at a time: one load per thread into shared memory (all in flight
        # together), then every thread reads them in split order (a loop of dependent global loads was one
        # memory latency per split: ~S x 0.3-0.5 us at B = 1). With at most head_dim splits (every count `auto`
        # picks) the one chunk is staged once and read by all three passes.
        sLSE = cutlass.memory.SmemAllocator().allocate_tensor(Float32, cute.make_layout(self.head_dim), 16)
        restage = splits > self.head_dim  # the same for every thread: the barriers in _stage are uniform
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
            if restage:
                self._stage(sLSE, mLSEparts, c0, col, splits, batch, b, head, row)
            for i in cutlass.range(cutlass.min(self.head_dim, splits - c0), unroll=4):
                l += cute.math.exp2((sLSE[i] - m_safe) * LOG2_E, fastmath=True)
        lse = -Float32.inf
        acc = Float32(0.0)
        if l != Float32(0.0):  # the same for every thread of the CTA: the barriers in _stage are uniform
            lse = m_safe + cute.math.log2(l, fastmath=True) * LN_2
            if restage:
                self._stage(sLSE, mLSEparts, 0, col, splits, batch, b, head, row)
            n0 = cutlass.min(self.head_dim, splits)  # splits of the first chunk, in order: prefetched ones first
            for i in cutlass.range_constexpr(PREFETCH):
                if i < n0:
                    x = sLSE[i]
                    if x != -Float32.inf:
                        acc += cute.math.exp2((x - lse) * LOG2_E, fastmath=True) * o_pre[i]
            for i in cutlass.range(PREFETCH, n0, unroll=8):
                x = sLSE[i]
                if x != -Float32.inf:
                    acc += cute.math.exp2((x - lse) * LOG2_E, fastmath=True) * mOparts[i * batch + b, row, head, col]
            for c0 in cutlass.range(self.head_dim, splits, self.head_dim, unroll=1):
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


class SplitMergeWarp(_Merge):
    """The same merge as ``SplitMerge`` (same arguments and maths) with the LSEs in registers instead of shared
    memory (``MergeConfig.warp``): grid (seqlen_q, heads, batch), no index division; every warp of the CTA holds
    the row's LSE_s, lane i split i (then i + 32, ...: a loop for more than 32 splits), and reduces the max and
    the sum by butterfly shuffles (a fixed order: a row's result still depends on its split count only); lane i
    computes its split's weight exp(LSE_s - LSE) once and each thread takes the weights by shuffles while it adds
    the O_s[col] in split order. The O_s[col] of the first 32 splits are loaded with the LSE, so a merge of up to
    32 splits waits for memory once. No barrier and no shared memory: the chain after the loads is 10 shuffles,
    one exp per lane and 32 shuffle + FMA pairs instead of two barriers and three serial passes over S
    shared-memory values. An empty split (weight 0) is skipped (its O_s may be unwritten). Our own design (no
    source followed)."""

    def grid(self, mO: cute.Tensor):
        return (mO.shape[1], mO.shape[2], mO.shape[0])

    @cute.kernel
    def kernel(self, mOparts: cute.Tensor, mLSEparts: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor):
        col, _, _ = cute.arch.thread_idx()
        row, head, b = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        batch = mO.shape[0]
        splits = mOparts.shape[0] // batch
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
            cute.arch.griddepcontrol_wait()
        # O_s[col] of the first 32 splits and LSE_lane: every load of a merge of up to 32 splits in flight together.
        # Split min(i, S - 1) (straight-line loads, no branch): a slot past the last split holds another split's O,
        # never used (its weight, from a lane past S, is 0).
        o_pre = cute.make_rmem_tensor(cute.make_layout(32), Float32)
        rows_b = mOparts[None, row, head, col]  # (S * B,): split s of batch b at s * B + b
        for i in cutlass.range_constexpr(32):
            o_pre[i] = rows_b[cutlass.min(i, splits - 1) * batch + b]
        x0 = -Float32.inf
        if lane < splits:
            x0 = mLSEparts[lane * batch + b, head, row]
        m = x0
        for c0 in cutlass.range(32, splits, 32, unroll=1):
            if c0 + lane < splits:
                m = cutlass.max(m, mLSEparts[(c0 + lane) * batch + b, head, row])
        for k in cutlass.range_constexpr(5):
            m = cutlass.max(m, cute.arch.shuffle_sync_bfly(m, offset=16 >> k))
        m_safe = m
        if m == -Float32.inf:
            m_safe = Float32(0.0)
        l = cute.math.exp2((x0 - m_safe) * LOG2_E, fastmath=True)
        for c0 in cutlass.range(32, splits, 32, unroll=1):
            if c0 + lane < splits:
                l += cute.math.exp2((mLSEparts[(c0 + lane) * batch + b, head, row] - m_safe) * LOG2_E, fastmath=True)
        for k in cutlass.range_constexpr(5):
            l = l + cute.arch.shuffle_sync_bfly(l, offset=16 >> k)
        lse = -Float32.inf
        lse_safe = Float32(0.0)  # every split empty (l = 0): the weights below are exp2(-inf) = 0, O stays 0
        if l != Float32(0.0):  # a NaN l too: lse NaN, so every weight and O NaN
            lse = m_safe + cute.math.log2(l, fastmath=True) * LN_2
            lse_safe = lse
        w = cute.math.exp2((x0 - lse_safe) * LOG2_E, fastmath=True)  # split `lane`'s weight; 0 if empty or absent
        acc = Float32(0.0)
        for i in cutlass.range_constexpr(32):  # constant lanes, outside any branch: plain shuffles
            wi = cute.arch.shuffle_sync(w, i)
            if wi != Float32(0.0):
                acc += wi * o_pre[i]
        for c0 in cutlass.range(32, splits, 32, unroll=1):
            x = -Float32.inf
            if c0 + lane < splits:
                x = mLSEparts[(c0 + lane) * batch + b, head, row]
            wc = cute.math.exp2((x - lse_safe) * LOG2_E, fastmath=True)
            for i in cutlass.range_constexpr(32):
                wi = cute.arch.shuffle_sync(wc, i)
                if c0 + i < splits:
                    o = mOparts[(c0 + i) * batch + b, row, head, col]
                    if wi != Float32(0.0):
                        acc += wi * o
        mO[b, row, head, col] = acc.to(self.out_dtype)
        if col == 0:
            mLSE[b, head, row] = lse
