"""The CuTe DSL kernel of the fa2 backend, ``FlashAttention2Sm80`` (the algorithm: ``fa_variants.ampere.fa2``'s
docstring). Imported only to compile (``ampere.fa2._build``): a process that loads its kernels from the disk
cache (``common.diskcache``) never imports the DSL. Adapted from NVIDIA/cutlass:
examples/python/CuTeDSL/ampere/flash_attention_v2.py::FlashAttentionForwardAmpere and
Dao-AILab/flash-attention:flash_attn/cute/flash_fwd.py::FlashAttentionForwardSm80.
"""
from __future__ import annotations

from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from fa_variants.common import sm80
from fa_variants.common.config import Sm80Config
from fa_variants.common.layout import acc_as_operand_a, rows_cols, transpose_view
from fa_variants.common.mask import AttentionMask, BlockInfo, kv_length, kv_start, q_length
from fa_variants.common.scale import LOG2_E
from fa_variants.common.softmax import OnlineSoftmax


class FlashAttention2Sm80:
    """One compiled FA2 forward kernel for a static configuration (dtype, head_dim, causal, tiles).

    `__call__(mQ, mK, mV, mO, mLSE, softmax_scale, stream)` is the host side (layouts, grid, launch);
    `kernel` is the device side, which reads top-down like Algorithm 1.

    Split-KV (``tiles.num_splits != 1``, ``common.split``): mO and mLSE are fp32 partials of
    (num_splits * batch) batches, split s of batch b at s * batch + b, the count read from their shape at run
    time; grid.x is query tiles x num_splits, and the CTA of split s walks K/V tiles [s n // S, (s + 1) n // S)
    of the n its query tile needs, writing O normalised by its own row sum and its LSE (-inf for a row that
    saw no key in the range, or an empty range: the merge then ignores it). The unsplit kernel is unchanged.
    """

    def __init__(self, dtype, head_dim: int, causal: bool, tiles: Sm80Config):
        self.dtype = dtype
        self.head_dim = head_dim
        # Packed GQA (seqlen_q = 1 host views): the rows are query heads, not positions; at seqlen_q = 1
        # bottom-right causal hides no key, so the packed kernel runs unmasked.
        self.causal = causal and not tiles.pack_gqa
        self.Br, self.Bc, self.stages = tiles.tile_m, tiles.tile_n, tiles.stages
        self.blocks = BlockInfo(tiles.tile_m, tiles.tile_n, self.causal)
        self.num_warps = tiles.warps
        self.num_threads = 32 * tiles.warps
        assert self.stages in (1, 2), "the K/V pipeline below is written for one or two stages"
        self.split = tiles.num_splits != 1
        self.leftpad_k = tiles.leftpad_k  # K/V read from each sequence's leftpad_k on
        self.smem_bytes = 0  # set when traced

    # ------------------------------------------------------------------------------------------
    # host side
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, softmax_scale: Float32, stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale, stream, ())

    @cute.jit
    def launch(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               softmax_scale: Float32, stream: cuda.CUstream, lengths: tuple):
        """The host side of ``__call__``; ``lengths``: (seqlens_k,) with ``Sm80Config.seqlens_k``, (seqlens_k,
        leftpad_k) with ``Sm80Config.leftpad_k`` too, (seqlens_k, leftpad_k, seqlens_q) with ``Sm80Config.seqlens_q``
        too, else ()."""
        D, Br, Bc = self.head_dim, self.Br, self.Bc
        sQ_layout = sm80.smem_layout(self.dtype, Br, D)
        sKV_layout = sm80.smem_layout(self.dtype, Bc, D, self.stages)

        SharedStorage = sm80.shared_storage(self.dtype, sQ_layout, sKV_layout)
        self.smem_bytes = SharedStorage.size_in_bytes()
        copy_g2s = sm80.gmem_tiled_copy(self.dtype, D, self.num_threads)
        copy_s2g = sm80.gmem_tiled_copy(self.dtype, D, self.num_threads, async_copy=False)
        mma = sm80.tiled_mma(self.dtype, self.num_warps)
        grid = (cute.ceil_div(mQ.shape[1], Br), mQ.shape[2], mQ.shape[0])
        if const_expr(self.split):  # the splits of a query tile side by side along grid.x
            grid = (cute.ceil_div(mQ.shape[1], Br) * (mO.shape[0] // mQ.shape[0]), mQ.shape[2], mQ.shape[0])
        self.kernel(mQ, mK, mV, mO, mLSE, softmax_scale * LOG2_E, sQ_layout, sKV_layout,
                    copy_g2s, copy_s2g, mma, SharedStorage, lengths).launch(
            grid=grid, block=[self.num_threads, 1, 1], smem=self.smem_bytes, stream=stream)

    # ------------------------------------------------------------------------------------------
    # device side
    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor, scale_log2: Float32, sQ_layout: cute.ComposedLayout,
               sKV_layout: cute.ComposedLayout, copy_g2s: cute.TiledCopy, copy_s2g: cute.TiledCopy,
               mma: cute.TiledMma, SharedStorage: cutlass.Constexpr, lengths: tuple):
        D, Br, Bc = self.head_dim, self.Br, self.Bc
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch, split_idx, num_splits = self.tile_coords(mQ, mO)
        seqlen_q, seqlen_k = mQ.shape[1], mK.shape[1]
        seqlen_k = kv_length(lengths, batch, seqlen_k)  # Sm80Config.seqlens_k: this sequence's keys
        first_key = kv_start(lengths, batch, seqlen_k)  # Sm80Config.leftpad_k: the window's first key (else 0)
        seqlen_k = seqlen_k - first_key
        diag_q = q_length(lengths, batch, seqlen_q)  # Sm80Config.seqlens_q: the diagonal's query count (else seqlen_q)
        head_kv = head // (mQ.shape[2] // mK.shape[2])  # GQA / MQA

        # This CTA's Q tile (Br x D) and the K/V tiles (Bc x D x n) of its KV head (leftpad_k: from first_key on).
        mK_bh, mV_bh = mK[batch, None, head_kv, None], mV[batch, None, head_kv, None]
        if const_expr(self.leftpad_k):
            mK_bh, mV_bh = [cute.domain_offset((first_key, 0), t) for t in (mK_bh, mV_bh)]
        kv_lo = kv_hi = 0  # split-KV: this CTA's K/V tiles [kv_lo, kv_hi); unused unsplit
        if const_expr(self.split):  # split s: tiles [s n // S, (s + 1) n // S) of the n its Q tile needs
            n_total = self.blocks.kv_tile_end(m_block, diag_q, seqlen_k)
            kv_lo = split_idx * n_total // num_splits
            kv_hi = (split_idx + 1) * n_total // num_splits
            mK_bh, mV_bh = [cute.domain_offset((kv_lo * Bc, 0), t) for t in (mK_bh, mV_bh)]
        gQ = cute.local_tile(mQ[batch, None, head, None], (Br, D), (m_block, 0))
        gK = cute.local_tile(mK_bh, (Bc, D), (None, 0))
        gV = cute.local_tile(mV_bh, (Bc, D), (None, 0))

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sKV_layout)   # (Bc, D, stage)
        sV = storage.sV.get_tensor(sKV_layout)
        sVt = transpose_view(sV)            # (D, Bc, stage): V^T for O += P V

        # global -> shared (cp.async) partitions, with coordinates for the row predicates
        g2s = copy_g2s.get_slice(tidx)
        tQgQ, tQsQ = g2s.partition_S(gQ), g2s.partition_D(sQ)
        tKgK, tKsK = g2s.partition_S(gK), g2s.partition_D(sK)
        tVgV, tVsV = g2s.partition_S(gV), g2s.partition_D(sV)
        tQcQ = g2s.partition_S(cute.make_identity_tensor((Br, D)))
        tKVc = g2s.partition_S(cute.make_identity_tensor((Bc, D)))

        # MMA partitions: register fragments and ldmatrix views of shared memory
        thr_mma = mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt[None, None, 0]))
        s2r_Q = sm80.ldmatrix_copy_A(self.dtype, mma).get_slice(tidx)
        s2r_K = sm80.ldmatrix_copy_B(self.dtype, mma).get_slice(tidx)
        s2r_V = sm80.ldmatrix_copy_B(self.dtype, mma, transpose=True).get_slice(tidx)
        tSsQ, tSsK, tOsVt = s2r_Q.partition_S(sQ), s2r_K.partition_S(sK), s2r_V.partition_S(sVt)

        # Algorithm 1 line 4: O = 0, l = 0, m = -inf (O and S in registers, fp32)
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((Br, D)), Float32)
        acc_O.fill(0.0)
        O = rows_cols(acc_O)
        softmax = OnlineSoftmax(cute.size(O, mode=[0]), scale_log2)
        softmax.reset()
        cS = cute.make_identity_tensor((Br, Bc))
        tScS = rows_cols(thr_mma.partition_C(cS))
        t0ScS = rows_cols(mma.get_slice(0).partition_C(cS))

        # the K/V tiles this Q tile visits (causal skipping; split-KV: its range, the keys renumbered)
        n_end, n_causal, seqlen_k = self.kv_tile_range(m_block, kv_lo, kv_hi, diag_q, seqlen_k)
        kv = SimpleNamespace(copy=copy_g2s, tKgK=tKgK, tKsK=tKsK, tVgV=tVgV, tVsV=tVsV, tKVc=tKVc,
                             seqlen_k=seqlen_k)
        mm = SimpleNamespace(mma=mma, tSrQ=tSrQ, tSrK=tSrK, tOrVt=tOrVt, s2r_Q=s2r_Q, s2r_K=s2r_K,
                             s2r_V=s2r_V, tSsQ=tSsQ, tSsK=tSsK, tOsVt=tOsVt, acc_O=acc_O, O=O,
                             tScS=tScS, t0ScS=t0ScS, softmax=softmax, m_block=m_block,
                             mask=AttentionMask(diag_q, seqlen_k, select=False))

        # Line 6: load Q_i (and the first K/V tiles); lines 7-11: the loop over K/V tiles
        self.prologue(kv, tQgQ, tQsQ, tQcQ, seqlen_q - m_block * Br, n_end)
        self.mainloop(mm, kv, n_end, n_causal)

        # Lines 12-14: O /= l (deferred normalisation), LSE = m + log l; write O_i and L_i
        inv_l, lse = softmax.finalize()
        softmax.rescale(O, inv_l)
        if const_expr(self.split):
            self.store_partial(acc_O, lse, mO, mLSE, mma, tidx, m_block, head,
                               split_idx * mQ.shape[0] + batch, seqlen_q)
        else:
            self.epilogue(acc_O, lse, sQ, mO, mLSE, mma, copy_s2g, tidx, m_block, head, batch, seqlen_q)

    # ------------------------------------------------------------------------------------------
    # the steps of `kernel`
    # ------------------------------------------------------------------------------------------
    def tile_coords(self, mQ: cute.Tensor, mO: cute.Tensor):
        """(m_block, head, batch, split_idx, num_splits) of this CTA: its query tile (the longest rows first when
        causal: better tail balance across SMs), head and batch; with split-KV (grid.x = query tiles x splits,
        the splits of a tile adjacent) also its split of the num_splits read from mO's shape. Plain Python, run
        while the kernel is traced."""
        m_block, head, batch = cute.arch.block_idx()
        num_m_blocks, split_idx, num_splits = cute.arch.grid_dim()[0], 0, 1
        if const_expr(self.split):
            num_splits = mO.shape[0] // mQ.shape[0]
            num_m_blocks = num_m_blocks // num_splits
            split_idx = m_block % num_splits
            m_block = m_block // num_splits
        if const_expr(self.causal):
            m_block = num_m_blocks - 1 - m_block
        return m_block, head, batch, split_idx, num_splits

    def kv_tile_range(self, m_block: Int32, kv_lo: Int32, kv_hi: Int32, seqlen_q: Int32, seqlen_k: Int32):
        """(n_end, n_causal, seqlen_k) of query tile m_block: the K/V tiles it needs are n in [0, n_end), visited
        n_end - 1 down to 0 (causal skipping); tiles n >= n_causal cross the diagonal and need the causal mask;
        only the last tile, ceil(seqlen_k / Bc) - 1, can pass seqlen_k, and if needed it comes first.
        Split-KV: this CTA's tiles [kv_lo, kv_hi), numbered from 0 in the K/V views that start at tile kv_lo
        (`kernel`): key c of the view is key c + kv_lo Bc, so masking it against seqlen_k - kv_lo Bc keys (the
        sequence end and the bottom-right diagonal alike) masks the same keys, and `mainloop` is the unsplit
        one. An empty range (kv_hi == kv_lo) runs no step: O = 0, LSE = -inf. Plain Python, run while traced."""
        n_end = self.blocks.kv_tile_end(m_block, seqlen_q, seqlen_k)
        n_causal = n_end
        if const_expr(self.causal):
            n_causal = self.blocks.kv_tile_causal_start(m_block, seqlen_q, seqlen_k)
        if const_expr(self.split):
            n_end = kv_hi - kv_lo
            if const_expr(self.causal):
                n_causal = cutlass.max(n_causal - kv_lo, 0)
            else:
                n_causal = n_end
            seqlen_k = seqlen_k - kv_lo * self.Bc
        return n_end, n_causal, seqlen_k

    @cute.jit
    def prologue(self, kv: SimpleNamespace, tQgQ: cute.Tensor, tQsQ: cute.Tensor, tQcQ: cute.Tensor,
                 q_rows: Int32, n_end: Int32):
        """Algorithm 1 line 6 (load Q_i; q_rows of its rows are real, the rest zero-filled) and the first K/V
        loads: cp.async groups [Q, K(n_end-1)], [V(n_end-1)], [K(n_end-2)] with two stages; [Q, K(n_end-1)]
        alone with one (its V tile is loaded by the step, under S = Q K^T)."""
        sm80.copy_rows(kv.copy, tQgQ, tQsQ, tQcQ, q_rows, check_rows=True, zero_fill=True)
        if n_end > 0:
            self.load_kv(kv, kv.tKgK, kv.tKsK, n_end - 1, 0, tail=True)
        cute.arch.cp_async_commit_group()
        if const_expr(self.stages == 2):
            if n_end > 0:
                self.load_kv(kv, kv.tVgV, kv.tVsV, n_end - 1, 0, tail=True)
            cute.arch.cp_async_commit_group()
            if n_end > 1:
                self.load_kv(kv, kv.tKgK, kv.tKsK, n_end - 2, 1, tail=False)
            cute.arch.cp_async_commit_group()

    @cute.jit
    def mainloop(self, mm: SimpleNamespace, kv: SimpleNamespace, n_end: Int32, n_causal: Int32):
        """Algorithm 1 lines 7-11 over K/V tiles n_end - 1 down to 0: the first tile (the sequence-end tail and/or
        the diagonal), then the tiles crossing the diagonal, then the fully visible ones, without masks."""
        if n_end > 0:
            self.step(mm, kv, n_end - 1, n_end, is_first=True, mask_seqlen=True, mask_causal=self.causal)
        if const_expr(self.causal):
            for i in cutlass.range(cutlass.max(n_end - 1 - n_causal, 0), unroll=1):
                self.step(mm, kv, n_end - 2 - i, n_end, is_first=False, mask_seqlen=False, mask_causal=True)
        n_plain = cutlass.max(cutlass.min(n_causal, n_end - 1), 0)
        for i in cutlass.range(n_plain, unroll=1):
            self.step(mm, kv, n_plain - 1 - i, n_end, is_first=False, mask_seqlen=False, mask_causal=False)

    @cute.jit
    def load_kv(self, kv: SimpleNamespace, tXgX: cute.Tensor, tXsX: cute.Tensor, n: Int32,
                stage: Int32, tail: cutlass.Constexpr[bool]):
        """cp.async K or V tile n into a stage; `tail`: rows past seqlen_k are not read, zero-filled."""
        sm80.copy_rows(kv.copy, tXgX[None, None, None, n], tXsX[None, None, None, stage], kv.tKVc,
                       kv.seqlen_k - n * self.Bc, check_rows=tail, zero_fill=True)

    @cute.jit
    def step(self, mm: SimpleNamespace, kv: SimpleNamespace, n: Int32, n_end: Int32,
             is_first: cutlass.Constexpr[bool], mask_seqlen: cutlass.Constexpr[bool],
             mask_causal: cutlass.Constexpr[bool]):
        """Algorithm 1 lines 7-12 for K/V tile n, read from stage (n_end - 1 - n) % stages.

        Two stages: on entry K_n (and V_n) are in flight; V_{n-1} is issued before S = Q K_n^T and K_{n-2}
        before O += P V_n, each into the buffer the barrier just freed. Every step commits two cp.async groups
        (possibly empty), so `wait_group(2)` always means "all but the last two".
        One stage (FlashAttention-2 C++'s forward pipeline: one K and one V buffer): on entry only K_n is in
        flight; V_n is issued before S = Q K_n^T (it lands under the S GEMM and the softmax) and K_{n-1} before
        O += P V_n (it lands under the P V GEMM); each wait is `wait_group(0)`."""
        Br, Bc, stages = self.Br, self.Bc, self.stages
        stage = (n_end - 1 - n) % stages
        pending = 2 * (stages - 1)  # cp.async groups that may stay in flight at each wait
        # K_n has landed for every thread; everyone is done with V_{n+1} (PV of the last step)
        cute.arch.cp_async_wait_group(pending)
        cute.arch.barrier()
        if const_expr(stages == 2):
            if n > 0:  # V_{n-1} into the other stage, overlapping this step
                self.load_kv(kv, kv.tVgV, kv.tVsV, n - 1, 1 - stage, tail=False)
        else:  # V_n into the one V buffer; the first tile may be the sequence-end tail
            self.load_kv(kv, kv.tVgV, kv.tVsV, n, 0, tail=is_first)
        cute.arch.cp_async_commit_group()
        # line 8: S = Q K_n^T
        acc_S = cute.make_rmem_tensor(mm.mma.get_slice(0).partition_shape_C((Br, Bc)), Float32)
        acc_S.fill(0.0)
        sm80.gemm_ss(mm.mma, acc_S, mm.tSrQ, mm.tSrK, mm.tSsQ, mm.tSsK[None, None, None, stage],
                     mm.s2r_Q, mm.s2r_K)
        # line 9: m, P = exp2(S - m), l;  line 10 (first half): O *= exp2(m_old - m_new)
        S = rows_cols(acc_S)
        if const_expr(mask_seqlen or mask_causal):
            mm.mask.apply(S, mm.tScS, mm.t0ScS, mm.m_block * Br, n * Bc, mask_seqlen, mask_causal)
        alpha = mm.softmax.update(S, is_first=is_first)
        if const_expr(not is_first):
            mm.softmax.rescale(mm.O, alpha)
        rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        # V_n has landed; everyone is done with K_n, so K_{n-2} may overwrite its stage
        cute.arch.cp_async_wait_group(pending)
        cute.arch.barrier()
        if n > stages - 1:  # K_{n - stages} into the stage K_n leaves
            self.load_kv(kv, kv.tKgK, kv.tKsK, n - stages, stage, tail=False)
        cute.arch.cp_async_commit_group()
        # line 10, second half: O += P V_n, P straight from registers
        sm80.gemm_rs(mm.mma, mm.acc_O, acc_as_operand_a(rP), mm.tOrVt,
                     mm.tOsVt[None, None, None, stage], mm.s2r_V)

    @cute.jit
    def store_partial(self, acc_O: cute.Tensor, lse: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                      mma: cute.TiledMma, tidx: Int32, m_block: Int32, head: Int32, out_batch: Int32,
                      seqlen_q: Int32):
        """Split-KV epilogue: this split's O (fp32, normalised by its own row sum) and LSE from registers
        straight to the partials of batch `out_batch` (decode writes a few rows: no shared-memory staging),
        rows < seqlen_q only; LSE by the thread holding column 0 of each row."""
        cute.arch.cp_async_wait_group(0)  # no cp.async left in flight at exit (an empty range never waited)
        tOcO = rows_cols(mma.get_slice(tidx).partition_C(cute.make_identity_tensor((self.Br, self.head_dim))))
        O = rows_cols(acc_O)
        for r in cutlass.range_constexpr(cute.size(O, mode=[0])):
            row = m_block * self.Br + tOcO[r, 0][0]
            if row < seqlen_q:
                for c in cutlass.range_constexpr(cute.size(O, mode=[1])):
                    mO[out_batch, row, head, tOcO[r, c][1]] = O[r, c]
                if tOcO[0, 0][1] == 0:
                    mLSE[out_batch, head, row] = lse[r]

    @cute.jit
    def epilogue(self, acc_O: cute.Tensor, lse: cute.Tensor, sQ: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, mma: cute.TiledMma, copy_s2g: cute.TiledCopy, tidx: Int32,
                 m_block: Int32, head: Int32, batch: Int32, seqlen_q: Int32):
        """O (fp32 registers) -> dtype -> shared memory (reusing Q's buffer) -> 16-byte global stores
        of the rows < seqlen_q; LSE by the thread holding column 0 of each row."""
        D, Br = self.head_dim, self.Br
        cute.arch.cp_async_wait_group(0)  # nothing may land in sQ any more (n_end == 0: Q never waited)
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        sO = cute.make_tensor(sQ.iterator, sQ.layout)
        cute.arch.barrier()  # every warp is done reading sQ
        r2s = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=32),
            mma).get_slice(tidx)
        cute.copy(r2s, r2s.retile(rO), r2s.partition_D(sO))

        thr_mma = mma.get_slice(tidx)
        cO = cute.make_identity_tensor((Br, D))
        tOcO = rows_cols(thr_mma.partition_C(cO))
        if tOcO[0][1] == 0:
            for r in cutlass.range_constexpr(cute.size(lse)):
                row = m_block * Br + tOcO[r, 0][0]
                if row < seqlen_q:
                    mLSE[batch, head, row] = lse[r]

        cute.arch.barrier()
        s2g = copy_s2g.get_slice(tidx)
        tOsO = s2g.partition_S(sO)
        tOrO = cute.make_rmem_tensor_like(tOsO, self.dtype)
        cute.autovec_copy(tOsO, tOrO)
        gO = cute.local_tile(mO[batch, None, head, None], (Br, D), (m_block, 0))
        tOgO, tOc = s2g.partition_D(gO), s2g.partition_S(cO)
        for m in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
            if tOc[0, m, 0][0] < seqlen_q - m_block * Br:
                cute.copy(copy_s2g, tOrO[None, m, None], tOgO[None, m, None])


class FlashAttention2Sm80Lengths(FlashAttention2Sm80):
    """``FlashAttention2Sm80`` with ``Sm80Config.seqlens_k``: ``__call__`` takes, after softmax_scale, the
    per-sequence KV lengths ``mSeqlensK`` (int32, (batch,)); split-KV configs too."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale: Float32, mSeqlensK: cute.Tensor, stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale, stream, (mSeqlensK,))


class FlashAttention2Sm80LeftpadK(FlashAttention2Sm80):
    """``FlashAttention2Sm80`` with ``Sm80Config.leftpad_k``: ``__call__`` takes, after softmax_scale, ``mSeqlensK``
    and ``mLeftpadK`` (int32, (batch,) each): sequence b attends to keys [leftpad_k[b], seqlens_k[b])."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale: Float32, mSeqlensK: cute.Tensor, mLeftpadK: cute.Tensor, stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale, stream, (mSeqlensK, mLeftpadK))


class FlashAttention2Sm80Windows(FlashAttention2Sm80):
    """``FlashAttention2Sm80`` with ``Sm80Config.seqlens_q``: ``__call__`` takes, after softmax_scale, ``mSeqlensK``,
    ``mLeftpadK`` and ``mSeqlensQ`` (int32, (batch,) each): keys [leftpad_k[b], seqlens_k[b]), the causal diagonal
    bottom-right against seqlens_q[b] and their count (``common.mask.q_length``)."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale: Float32, mSeqlensK: cute.Tensor, mLeftpadK: cute.Tensor, mSeqlensQ: cute.Tensor,
                 stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale, stream, (mSeqlensK, mLeftpadK, mSeqlensQ))
