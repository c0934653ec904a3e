"""The CuTe DSL kernel of the fa3 backend, ``FlashAttention3Sm90`` (the algorithm: ``fa_variants.hopper.fa3``'s
docstring). Imported only to compile (``hopper.fa3._build``): a process that loads its kernels from the disk
cache (``common.diskcache``) never imports the DSL. Adapted from Dao-AILab/flash-attention:
flash_attn/cute/flash_fwd_sm90.py::FlashAttentionForwardSm90 and NVIDIA/cutlass:
examples/python/CuTeDSL/cute/hopper/kernel/attention/fmha.py.
"""
import math
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from fa_variants.common import pack_gqa, tile_scheduler
from fa_variants.common.config import Sm90Config
from fa_variants.common.layout import acc_as_operand_a, convert_in_pairs, transpose_view
from fa_variants.common.layout import rows_cols as acc_rows_cols
from fa_variants.common.mask import AttentionMask, BlockInfo
from fa_variants.common.sm90 import (WARPGROUP_THREADS, NamedBarrier, hoisted_descriptors, make_row_major_smem_layout,
                                    make_tiled_mma, wgmma)
from fa_variants.common.softmax import OnlineSoftmax

# Register split per consumer-warpgroup count: (producer warpgroup, each consumer warpgroup);
# 128 * (producer + n * consumer) <= 64K registers per SM.
REGISTERS = {1: (24, 240), 2: (24, 240), 3: (32, 160)}
# Two CTAs per SM (Sm90Config.ctas_per_sm = 2, one consumer warpgroup): 2 x 256 threads x 128 registers at launch;
# the producer gives 104 back, the consumer takes them: 24 + 232 = 2 x 128.
REGISTERS_TWO_CTAS = (24, 232)
# Fused split merge: fp32 columns of a row each thread merges at a time (one 16-byte load per split)
MERGE_VEC = 4
LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


class FlashAttention3Sm90:
    """FA3 forward for one (dtype, head_dim, causal, Sm90Config); see the module docstring.

    ``__call__`` (host, traced once per config) takes q (B, Nq, H, D), k and v (B, Nk, Hkv, D),
    out (B, Nq, H, D) of the same 16-bit dtype, lse float32 (B, H, Nq), the scalar
    softmax_scale * log2(e) > 0, and the stream. Every non-unit stride must be a multiple of 16
    bytes (TMA); ``run`` below prepares inputs that are not.
    """

    def __init__(self, dtype, head_dim: int, causal: bool, config: Sm90Config):
        config.check(head_dim)
        self.dtype = dtype  # Q, K, V (the MMA operands)
        self.out_dtype = dtype  # O
        self.head_dim = head_dim
        # Packed GQA from host views (pack_group 0) runs at seqlen_q = 1 only, where causal hides no key; its
        # rows are query heads, not positions, so they must not be masked as positions. With pack_group = G the
        # kernel packs (common.pack_gqa) and masks each row by its own query position, row // G.
        self.pack_group = config.pack_group
        self.causal = causal and (self.pack_group > 0 or not config.pack_gqa)
        self.cfg = config
        self.tile_m, self.tile_n, self.stages = config.tile_m, config.tile_n, config.stages
        self.num_wg = config.consumer_warpgroups
        self.producer_regs, self.consumer_regs = REGISTERS_TWO_CTAS if config.ctas_per_sm == 2 else REGISTERS[self.num_wg]
        self.num_threads = WARPGROUP_THREADS * (1 + self.num_wg)
        self.pingpong = config.pingpong
        self.overlap = config.intra_wg_overlap
        self.blocks = BlockInfo(config.tile_m, config.tile_n, self.causal, max(self.pack_group, 1))
        # Split-KV (common.split): O and LSE are fp32 partials of (num_splits * batch) "batches", the count
        # read from their shape at run time; the default path (num_splits == 1) is untouched.
        self.split = getattr(config, "num_splits", 1) != 1
        # Split-KV with the merge in the same kernel (``Sm90Config.fused_merge``, ``_merge_if_last``): the last CTA
        # of a query tile to finish merges the partials into the caller's O and LSE (no second launch).
        self.fused_merge = self.split and getattr(config, "fused_merge", False)
        # Persistent grid (``Sm90Config.persistent``, ``_roles_persistent``): O in its own buffer where it fits.
        self.persistent = getattr(config, "persistent", False)
        self.separate_o = self.persistent and config.separate_o(head_dim)

    # ---------------------------------------------------------------------------------------
    # Host side
    # ---------------------------------------------------------------------------------------

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        softmax_scale_log2: Float32,
        l2_heads: Int32,
        stream: cuda.CUstream,
    ):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale_log2, l2_heads, (), stream)

    # Hooks a subclass with other operand types overrides (fa3_fp8.FlashAttention3Fp8Sm90): the
    # bf16/fp16 kernel's V is (seqlen_k, head_dim) tiles read MN-major by the P V GEMM.

    def _make_mma_pv(self) -> cute.TiledMma:
        return make_tiled_mma(self.dtype, self.num_wg, self.head_dim, b_mn_major=True, a_in_registers=True)

    def _qk_mma_n(self) -> int:
        """N of one S = Q K^T warpgroup MMA: the whole K/V tile (fa3-fp8's ``s_halves``: half of it, two N tiles)."""
        return self.tile_n

    def _v_view(self, mV: cute.Tensor) -> cute.Tensor:
        """V as (tokens, head_dim, heads_kv, batch) or (head_dim, tokens, heads_kv, batch) (the TMA box order)."""
        return cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[1, 3, 2, 0]))

    def _v_tile(self) -> tuple:
        return (self.tile_n, self.head_dim)

    def _v_tiles(self, mV: cute.Tensor) -> cute.Tensor:
        """(V tile, n) for the producer's TMA."""
        return cute.local_tile(mV, self._v_tile(), (None, 0))

    def _v_operand(self, sV: cute.Tensor) -> cute.Tensor:
        """The shared V tile as the B operand (N = head_dim, K = tokens, stage) of O = P V."""
        return transpose_view(sV)

    def _make_softmax(self, num_rows: int, scale_log2: Float32):
        return OnlineSoftmax(num_rows, scale_log2, self.cfg.exp2_ffma, self.cfg.reduce_chains, self.cfg.skip_unit_rescale,
                             basis_alpha=self.cfg.basis_alpha,
                             active_rows=1 if self.cfg.first_row_only else None,  # padding rows: Sm90Config
                             alpha_first=self.cfg.alpha_first)

    def _step_context(self, args: tuple, extras: tuple, m_block: Int32, head: Int32, batch: Int32):
        return _StepContext(*args)

    def _defers(self) -> bool:
        """Whether O's rescale waits for the next step (``rescale_o_before_pv``)."""
        return self.overlap and self.cfg.rescale_o_before_pv

    @cute.jit
    def launch(self, mQ, mK, mV, mO, mLSE, softmax_scale_log2: Float32, l2_heads: Int32, extras: tuple,
               stream: cuda.CUstream, merge: tuple = (), ctas=None):
        """Host side shared by the kernel family; ``extras`` (tensors) go unchanged to the device side.
        ``merge``: (out, lse, counters) of the fused split merge (``FlashAttention3Sm90FusedMerge``), else ().
        ``ctas``: the persistent grid's CTA count (``FlashAttention3Sm90Persistent``), else None."""
        # (batch, seqlen, heads, head_dim) -> (seqlen, head_dim, heads, batch): TMA boxes and
        # MMA tiles cover the first two modes; LSE (batch, heads, seqlen) -> (seqlen, heads, batch).
        mQ, mK, mO = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0])) for t in (mQ, mK, mO)]
        mV = self._v_view(mV)
        mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[2, 1, 0]))
        if const_expr(self.pack_group):  # rows ((G, seqlen_q)) of num_heads_kv heads (common.pack_gqa)
            mQ, mO = [pack_gqa.pack_rows(t, self.pack_group, 2) for t in (mQ, mO)]
            mLSE = pack_gqa.pack_rows(mLSE, self.pack_group, 1)
        if const_expr(self.fused_merge):  # the caller's O and LSE in the same views as the partials
            mOut, mLSEout, mCount = merge
            mOut = cute.make_tensor(mOut.iterator, cute.select(mOut.layout, mode=[1, 3, 2, 0]))
            mLSEout = cute.make_tensor(mLSEout.iterator, cute.select(mLSEout.layout, mode=[2, 1, 0]))
            if const_expr(self.pack_group):
                mOut = pack_gqa.pack_rows(mOut, self.pack_group, 2)
                mLSEout = pack_gqa.pack_rows(mLSEout, self.pack_group, 1)
            merge = (mOut, mLSEout, mCount)
        D = self.head_dim

        tiled_mma_qk = make_tiled_mma(self.dtype, self.num_wg, self._qk_mma_n(), b_mn_major=False, a_in_registers=False)
        tiled_mma_pv = self._make_mma_pv()

        sQ_layout = make_row_major_smem_layout(self.dtype, self.tile_m, D)
        sO_layout = make_row_major_smem_layout(self.out_dtype, self.tile_m, D)
        sKV_layout = make_row_major_smem_layout(self.dtype, self.tile_n, D, self.stages)
        sV_layout = make_row_major_smem_layout(self.dtype, *self._v_tile(), self.stages)
        self.shared_storage = self._shared_storage(sQ_layout, sO_layout, sKV_layout, sV_layout)
        self.smem_bytes = self.shared_storage.size_in_bytes()  # reported by `fa-variants compile`

        load, store = cpasync.CopyBulkTensorTileG2SOp(), cpasync.CopyBulkTensorTileS2GOp()
        kv_tile = cute.select(sKV_layout, mode=[0, 1])
        tma_q, tQ = cpasync.make_tiled_tma_atom(load, mQ, sQ_layout, (self.tile_m, D))
        tma_k, tK = cpasync.make_tiled_tma_atom(load, mK, kv_tile, (self.tile_n, D))
        tma_v, tV = cpasync.make_tiled_tma_atom(load, mV, cute.select(sV_layout, mode=[0, 1]), self._v_tile())
        if const_expr(not self.split):
            tma_o, tO = cpasync.make_tiled_tma_atom(store, mO, sO_layout, (self.tile_m, D))
        self.bytes_q = cute.size_in_bytes(self.dtype, sQ_layout)
        self.bytes_kv = cute.size_in_bytes(self.dtype, kv_tile)  # a K tile, and a V tile

        num_m_blocks = cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m)
        qhead_per_kvhead = mQ.shape[2] // mK.shape[2]
        # One CTA per (query tile, head, batch), flattened into grid.x (no 65535 limit on heads/batch).
        grid = (num_m_blocks * mQ.shape[2] * mQ.shape[3], 1, 1)
        if const_expr(self.split):  # x num_splits; O partials are stored from registers, not by TMA
            grid = (num_m_blocks * mQ.shape[2] * mO.shape[3], 1, 1)
            tO, tma_o = mO, tma_q
        if const_expr(self.persistent):  # one CTA per SM (fewer for fewer tiles), each walking several tiles
            grid = (tile_scheduler.persistent_ctas(num_m_blocks * mQ.shape[2] * mQ.shape[3], ctas), 1, 1)
        self.kernel(
            tQ, tK, tV, tO, mLSE, tma_q, tma_k, tma_v, tma_o,
            tiled_mma_qk, tiled_mma_pv, sQ_layout, sO_layout, sKV_layout, sV_layout,
            softmax_scale_log2, num_m_blocks, qhead_per_kvhead, l2_heads, extras, merge,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream, min_blocks_per_mp=self.cfg.ctas_per_sm,
                                          use_pdl=self.cfg.pdl, **self._carveout())

    def _convert(self, src: cute.Tensor, dst: cute.Tensor):
        """dst (16-bit registers) = src (fp32 registers): in pairs with ``convert_pairs``, else in one conversion."""
        if const_expr(self.cfg.convert_pairs):
            convert_in_pairs(src, dst)
        else:
            dst.store(src.load().to(dst.element_type))

    def _carveout(self) -> dict:
        """Two CTAs per SM: ask for the whole shared-memory carveout (percent), which also spares the DSL a driver
        query for the SM's shared memory at compile time (no GPU needed to compile)."""
        return dict(preferred_smem_carveout=100) if self.cfg.ctas_per_sm == 2 else {}

    def _shared_storage(self, sQ_layout, sO_layout, sKV_layout, sV_layout):
        # Q's buffer holds O after the last S GEMM: sized in O's elements for the larger of the two.
        out_bytes = self.out_dtype.width // 8
        q_bytes = cute.cosize(sQ_layout) * self.dtype.width // 8
        q_words = max(q_bytes, cute.cosize(sO_layout) * out_bytes) // out_bytes
        kv_words, v_words = cute.cosize(sKV_layout), cute.cosize(sV_layout)

        merge_rows = self.tile_m if const_expr(self.fused_merge) else 1

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            # fused split merge (_merge_if_last): the merged LSE of each row of the tile, and the arrival count
            # this CTA's atomic returned (both inside the first 1 KiB, before sQ's alignment)
            merge_lse: cute.struct.MemRange[Float32, merge_rows]
            merge_ticket: cute.struct.MemRange[Int32, 1]
            sQ: cute.struct.Align[cute.struct.MemRange[self.out_dtype, q_words], 1024]  # also O
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, kv_words], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, v_words], 1024]
            if const_expr(self.separate_o):  # persistent: O's own buffer (Q's is loaded with the next tile's Q)
                sO: cute.struct.Align[cute.struct.MemRange[self.out_dtype, cute.cosize(sO_layout)], 1024]

        return SharedStorage

    # ---------------------------------------------------------------------------------------
    # Device side
    # ---------------------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        tma_q: cute.CopyAtom,
        tma_k: cute.CopyAtom,
        tma_v: cute.CopyAtom,
        tma_o: cute.CopyAtom,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        scale_log2: Float32,
        num_m_blocks: Int32,
        qhead_per_kvhead: Int32,
        l2_heads: Int32,
        extras: tuple,
        merge: tuple,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for atom in (tma_q, tma_k, tma_v) + ((tma_o,) if const_expr(not self.split) else ()):
                cpasync.prefetch_descriptor(atom)

        # Shared memory and the mbarrier pipelines, created by every thread before the roles split.
        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        pipe_q, pipe_k, pipe_v = self._make_pipelines(storage)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if const_expr(self.cfg.pdl):  # launched early (programmatic dependent launch): the grid before this one on
            cute.arch.griddepcontrol_launch_dependents()  # the stream must be done (its writes visible) before
            cute.arch.griddepcontrol_wait()  # any thread here reads Q/K/V or writes O; the next grid may launch
        sO = storage.sQ.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)  # Q's buffer, after the last S GEMM
        if const_expr(self.separate_o):
            sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        if const_expr(self.dtype == self.out_dtype):
            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        else:
            sQ = cute.make_tensor(cute.recast_ptr(storage.sQ.data_ptr(), sQ_layout.inner, dtype=self.dtype), sQ_layout.outer)
        sK = storage.sK.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)

        seqlen_q, seqlen_k = self._seqlen_q(mQ), mK.shape[0]
        if const_expr(self.split):
            if const_expr(not self.cfg.pdl and not self.fused_merge):
                # The merge kernel that follows may start now (it waits for this grid before reading the
                # partials; common.split_combine, programmatic dependent launch): its launch hides under this grid.
                cute.arch.griddepcontrol_launch_dependents()
            num_splits = mO.shape[3] // mQ.shape[3]
            m_block, head, batch, split_idx = self._split_coords(num_m_blocks, mQ.shape[2], num_splits)
            n_start, n_blocks = self._split_range(m_block, split_idx, num_splits, seqlen_q, seqlen_k)
            out_batch = split_idx * mQ.shape[3] + batch  # partials are (num_splits * batch) batches
            # fused merge: what the consumer threads need to merge the query tile when this CTA arrives last
            # (_merge_if_last; its counter index is block_idx // num_splits)
            last = ()
            if const_expr(self.fused_merge):
                last = (storage, merge, (batch * mQ.shape[2] + head) * num_m_blocks + m_block, num_splits,
                        cute.size(mQ.shape[0]))
            if n_blocks > 0:
                self._roles(mQ, mK, mV, mO, mLSE, sQ, sK, sV, sO, tma_q, tma_k, tma_v, tma_o, tiled_mma_qk,
                            tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2, qhead_per_kvhead, extras, warp_idx,
                            m_block, head, batch, out_batch, n_start, n_blocks, seqlen_q, seqlen_k, last)
            else:  # no K/V tile for this split: LSE -inf tells the merge to ignore its (unwritten) O
                row = cute.arch.thread_idx()[0] - WARPGROUP_THREADS  # consumer thread i: query row i of the tile
                if row >= 0:
                    if row < self.tile_m and m_block * self.tile_m + row < cute.size(mQ.shape[0]):
                        mLSE[m_block * self.tile_m + row, head, out_batch] = -Float32.inf
                    if const_expr(self.fused_merge):
                        self._merge_if_last(mO, mLSE, m_block, head, batch, *last)
        elif const_expr(self.persistent):
            self._roles_persistent(mQ, mK, mV, mO, mLSE, sQ, sK, sV, sO, tma_q, tma_k, tma_v, tma_o, tiled_mma_qk,
                                   tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2, qhead_per_kvhead, extras,
                                   warp_idx, num_m_blocks, l2_heads, seqlen_q, seqlen_k)
        else:
            m_block, head, batch = self._tile_coords(num_m_blocks, mQ.shape[2], mQ.shape[3], l2_heads)
            n_blocks = self._num_kv_blocks(m_block, seqlen_q, seqlen_k)
            self._roles(mQ, mK, mV, mO, mLSE, sQ, sK, sV, sO, tma_q, tma_k, tma_v, tma_o, tiled_mma_qk,
                        tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2, qhead_per_kvhead, extras, warp_idx,
                        m_block, head, batch, batch, 0, n_blocks, seqlen_q, seqlen_k)

    @cute.jit
    def _roles(self, mQ, mK, mV, mO, mLSE, sQ, sK, sV, sO, tma_q, tma_k, tma_v, tma_o, tiled_mma_qk, tiled_mma_pv,
               pipe_q, pipe_k, pipe_v, scale_log2: Float32, qhead_per_kvhead: Int32, extras: tuple, warp_idx: Int32,
               m_block: Int32, head: Int32, batch: Int32, out_batch: Int32, n_start, n_blocks: Int32,
               seqlen_q: Int32, seqlen_k: Int32, last: tuple = ()):
        """Producer warp and consumer warpgroups of one CTA over K/V tiles [n_start, n_start + n_blocks);
        ``last`` (fused split merge): the consumers then run ``_merge_if_last`` with it (inside their branch:
        code after the producer's register decrease joins it would be held to the producer's registers)."""
        if warp_idx < WARPGROUP_THREADS // 32:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.producer(
                    mQ[None, None, head, batch],
                    mK[None, None, head // qhead_per_kvhead, batch],
                    mV[None, None, head // qhead_per_kvhead, batch],
                    sQ, sK, sV, tma_q, tma_k, tma_v, pipe_q, pipe_k, pipe_v, m_block, n_blocks, n_start,
                )
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consumer(
                mO[None, None, head, out_batch], mLSE[None, head, out_batch], sQ, sK, sV, sO, tma_o,
                tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2,
                m_block, n_blocks, seqlen_q, seqlen_k, extras, head, batch, n_start,
            )
            if const_expr(self.fused_merge):
                self._merge_if_last(mO, mLSE, m_block, head, batch, *last)

    @cute.jit
    def _roles_persistent(self, mQ, mK, mV, mO, mLSE, sQ, sK, sV, sO, tma_q, tma_k, tma_v, tma_o, tiled_mma_qk,
                          tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2: Float32, qhead_per_kvhead: Int32,
                          extras: tuple, warp_idx: Int32, num_m_blocks: Int32, l2_heads: Int32, seqlen_q: Int32,
                          seqlen_k: Int32):
        """``_roles`` of a persistent CTA (``Sm90Config.persistent``): the producer warp and the consumer
        warpgroups each walk this CTA's tiles of the static schedule (``common.tile_scheduler``) with their
        pipeline states carried from tile to tile (the Q, K and V mbarrier phases run on), so the producer's loads
        of the next tile wait only for free buffers, not for the previous tile's epilogue (but Q's, when O reuses
        Q's buffer). The ping-pong turn is handed to warpgroup 0 once: each tile ends with the last warpgroup's
        arrive on warpgroup 0's barrier, which is the next tile's first turn."""
        heads, batches = mQ.shape[2], mQ.shape[3]
        first, stride = tile_scheduler.persistent_tiles()
        total = num_m_blocks * heads * batches
        if warp_idx < WARPGROUP_THREADS // 32:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
                k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                for tile in cutlass.range(first, total, stride, unroll=1):
                    m_block, head, batch = tile_scheduler.tile_coords(tile, num_m_blocks, heads, batches, l2_heads,
                                                                      self.causal)
                    n_blocks = self._num_kv_blocks(m_block, seqlen_q, seqlen_k)
                    q_state, k_state, v_state = self.producer(
                        mQ[None, None, head, batch], mK[None, None, head // qhead_per_kvhead, batch],
                        mV[None, None, head // qhead_per_kvhead, batch], sQ, sK, sV, tma_q, tma_k, tma_v,
                        pipe_q, pipe_k, pipe_v, m_block, n_blocks, 0, states=(q_state, k_state, v_state))
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            if const_expr(self.pingpong):
                if warp_idx < 2 * WARPGROUP_THREADS // 32:  # warpgroup 0 takes the first turn
                    cute.arch.barrier_arrive(barrier_id=int(NamedBarrier.SCHEDULE_WG0),
                                             number_of_threads=2 * WARPGROUP_THREADS)
            for tile in cutlass.range(first, total, stride, unroll=1):
                m_block, head, batch = tile_scheduler.tile_coords(tile, num_m_blocks, heads, batches, l2_heads,
                                                                  self.causal)
                n_blocks = self._num_kv_blocks(m_block, seqlen_q, seqlen_k)
                q_state, k_state, v_state = self.consumer(
                    mO[None, None, head, batch], mLSE[None, head, batch], sQ, sK, sV, sO, tma_o,
                    tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2,
                    m_block, n_blocks, seqlen_q, seqlen_k, extras, head, batch, 0,
                    states=(q_state, k_state, v_state))

    @cute.jit
    def _merge_if_last(self, mO, mLSE, m_block: Int32, head: Int32, batch: Int32, storage, merge: tuple, tile: Int32,
                       num_splits: Int32, rows: Int32):
        """Fused split merge, run by the consumer threads of every split CTA after its partials are stored:
        count this split's arrival at the query tile's counter; the CTA that arrives last merges the tile.

        Memory ordering (PTX memory model, release / acquire through fences and one atomic): each thread's
        partial stores, then a gpu-scope acq_rel fence (release), then a barrier of the consumer threads, then one
        thread's gpu-scope acq_rel atomic add on the counter; the thread that reads num_splits - 1 (the last
        split) shares it through shared memory and a barrier, and every thread fences (acquire) before reading
        the other CTAs' partials. The last CTA sets the counter back to 0 (self-cleaning: the buffer is zeroed
        once and reused by every later call on the stream)."""
        mOut, mLSEout, mCount = merge
        tidx = cute.arch.thread_idx()[0] - WARPGROUP_THREADS
        consumers = self.num_wg * WARPGROUP_THREADS
        ticket = storage.merge_ticket.get_tensor(cute.make_layout(1))
        cute.arch.fence_acq_rel_gpu()  # release: this thread's partial O / LSE stores before the count
        cute.arch.barrier(barrier_id=int(NamedBarrier.EPILOGUE), number_of_threads=consumers)
        if tidx == 0:
            ticket[0] = cute.arch.atomic_add((mCount.iterator + tile).llvm_ptr, Int32(1), sem="acq_rel", scope="gpu")
        cute.arch.barrier(barrier_id=int(NamedBarrier.EPILOGUE), number_of_threads=consumers)
        if ticket[0] == num_splits - 1:
            cute.arch.fence_acq_rel_gpu()  # acquire: the other splits' partials, before reading them
            sLSE = storage.merge_lse.get_tensor(cute.make_layout(self.tile_m))
            self._merge_tile(mO, mLSE, mOut, mLSEout, sLSE, tidx, consumers, m_block, head, batch, num_splits, rows)
            if tidx == 0:
                mCount[tile] = Int32(0)

    @cute.jit
    def _merge_tile(self, mO, mLSE, mOut, mLSEout, sLSE, tidx: Int32, consumers: int, m_block: Int32, head: Int32,
                    batch: Int32, num_splits: Int32, rows: Int32):
        """O and LSE of the query tile's rows from the num_splits partials (``common.split_combine``'s maths, sums
        in split order): one thread per row computes LSE = m' + log sum_s exp(LSE_s - m') (m' the max, 0 if every
        split is empty; -inf when the sum is 0) into shared memory and the caller's LSE; then each thread merges
        4 columns of a row at a time, O = sum over splits with LSE_s != -inf of exp(LSE_s - LSE) O_s, rounded
        once to O's dtype. Partials: (rows, head_dim, heads, num_splits * batch), split s of batch b at s B + b."""
        batches = mOut.shape[3]
        row0 = m_block * self.tile_m
        n_rows = cutlass.min(rows - row0, self.tile_m)
        if tidx < n_rows:
            r = row0 + tidx
            m = -Float32.inf
            for s in cutlass.range(num_splits, unroll=8):
                m = cutlass.max(m, mLSE[r, head, s * batches + batch])
            m_safe = m
            if m == -Float32.inf:
                m_safe = Float32(0.0)
            l = Float32(0.0)
            for s in cutlass.range(num_splits, unroll=8):
                l += cute.math.exp2((mLSE[r, head, s * batches + batch] - m_safe) * LOG2_E, fastmath=True)
            lse = -Float32.inf
            if l != Float32(0.0):
                lse = m_safe + cute.math.log2(l, fastmath=True) * LN_2
            sLSE[tidx] = lse
            mLSEout[r, head, batch] = lse
        cute.arch.barrier(barrier_id=int(NamedBarrier.EPILOGUE), number_of_threads=consumers)
        chunks = self.head_dim // MERGE_VEC
        for u in cutlass.range(tidx, n_rows * chunks, consumers, unroll=1):
            i = u // chunks
            r = row0 + i
            lse = sLSE[i]
            acc = cute.make_rmem_tensor(cute.make_layout(MERGE_VEC), Float32)
            acc.fill(0.0)
            o = cute.make_rmem_tensor(cute.make_layout(MERGE_VEC), Float32)
            if lse != -Float32.inf:
                for s in cutlass.range(num_splits, unroll=8):
                    x = mLSE[r, head, s * batches + batch]
                    # loaded whether or not the split saw a key and used through a select (an empty split's O is
                    # unwritten scratch: skipped, never multiplied by 0), so that the loads of the unrolled splits
                    # do not wait for their LSE: all in flight together
                    o.store(cute.local_tile(mO[r, None, head, s * batches + batch], (MERGE_VEC,), (u - i * chunks,)).load())
                    w = cute.math.exp2((x - lse) * LOG2_E, fastmath=True)
                    keep = x != -Float32.inf
                    for j in cutlass.range_constexpr(MERGE_VEC):
                        acc[j] = cutlass.select_(keep, acc[j] + w * o[j], acc[j])
            dst = cute.local_tile(mOut[r, None, head, batch], (MERGE_VEC,), (u - i * chunks,))
            dst.store(acc.load().to(self.out_dtype))

    @cute.jit
    def _tile_coords(self, num_m_blocks: Int32, num_heads: Int32, batches: Int32, l2_heads: Int32):
        """(query tile, head, batch) of this CTA. Non-causal tiles cost the same: query tiles of one head
        run side by side (they share K/V in L2). Causal tiles differ in cost, so the order is longest
        first (LPT) within sections of ``l2_heads`` (batch, head) pairs whose K and V fit in L2
        together; the short tiles then fill the tail of the grid."""
        bid, _, _ = cute.arch.block_idx()
        return tile_scheduler.tile_coords(bid, num_m_blocks, num_heads, batches, l2_heads, self.causal)

    @cute.jit
    def _num_kv_blocks(self, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32) -> Int32:
        """K/V tiles [0, n_blocks) that the Q tile m_block sees (``common.mask.kv_tile_end``: causal
        skips the tiles past the diagonal of its last row). A tile whose rows see no key still runs
        tile 0, all masked, which gives O = 0 and LSE = -inf without a special path."""
        if const_expr(self._tail_first()):
            return cutlass.max(self.blocks.kv_tile_end(m_block, seqlen_q, seqlen_k, self._q_start(m_block, seqlen_q)), 1)
        return cutlass.max(self.blocks.kv_tile_end(m_block, seqlen_q, seqlen_k), 1)

    def _tail_first(self) -> bool:
        """``Sm90Config.q_tail_first`` in effect (causal kernels only; a non-causal kernel compiles without it)."""
        return self.causal and self.cfg.q_tail_first

    def _q_start(self, m_block, seqlen_q):
        """First query row of tile m_block (``common.mask.BlockInfo.q_row_start``): m_block tile_m, or under
        q_tail_first max(m_block tile_m - shift, 0), never negative, so the partial tile's waste sits in tile 0 (the
        shortest under causal masking) as the shift rows it shares with tile 1."""
        return self.blocks.q_row_start(m_block, seqlen_q, self._tail_first())

    def _q_tile(self, m_tensor, m_block, seqlen_q):
        """The (tile_m, head_dim) TMA coordinate tile of Q or O for query tile m_block (its first row ``_q_start``,
        0 or more: TMA clips rows past seqlen_q on load and store)."""
        if const_expr(self._tail_first()):
            m_tensor = cute.domain_offset((self._q_start(m_block, seqlen_q), 0), m_tensor)
            return cute.local_tile(m_tensor, (self.tile_m, self.head_dim), (0, 0))
        return cute.local_tile(m_tensor, (self.tile_m, self.head_dim), (m_block, 0))

    @cute.jit
    def _split_coords(self, num_m_blocks: Int32, num_heads: Int32, num_splits: Int32):
        """(query tile, head, batch, split) of this CTA: the splits of one query tile side by side."""
        bid, _, _ = cute.arch.block_idx()
        split = bid % num_splits
        rest = bid // num_splits
        hb = rest // num_m_blocks
        return rest % num_m_blocks, hb % num_heads, hb // num_heads, split

    @cute.jit
    def _split_range(self, m_block: Int32, split: Int32, num_splits: Int32, seqlen_q: Int32, seqlen_k: Int32):
        """(first tile, tile count) of this split: tiles [s n // S, (s + 1) n // S) of the n the query tile
        needs (``common.split.split_ranges``); the count is <= 0 for an empty split."""
        n_total = self._num_kv_blocks(m_block, seqlen_q, seqlen_k)
        n_start = split * n_total // num_splits
        return n_start, (split + 1) * n_total // num_splits - n_start

    def _seqlen_q(self, mQ: cute.Tensor):
        """Query positions of the problem: mode 0 of Q, or its second part when packed ((G, seqlen_q))."""
        return mQ.shape[0][1] if const_expr(self.pack_group) else mQ.shape[0]

    def _tile(self, n_start, n):
        """Absolute K/V tile index of the n-th tile of this CTA's range (the range starts at 0 unless split)."""
        return n_start + n if const_expr(self.split) else n

    def _make_pipelines(self, storage):
        cta = cute.make_layout((1, 1, 1, 1))
        tma_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_wg * 4)  # one arrive per warp

        def make(mbar, stages, tx):
            return pipeline.PipelineTmaAsync.create(
                barrier_storage=mbar.data_ptr(), num_stages=stages, producer_group=tma_thread,
                consumer_group=consumer_warps, tx_count=tx, cta_layout_vmnk=cta, defer_sync=True,
            )

        return make(storage.mbar_q, 1, self.bytes_q), make(storage.mbar_k, self.stages, self.bytes_kv), make(storage.mbar_v, self.stages, self.bytes_kv)

    def _pipeline_states(self, user_type, states: tuple) -> tuple:
        """(Q, K, V) pipeline states of a producer or consumer (``user_type``): ``states`` when carried from the
        previous tile (persistent), else fresh ones (Q one stage, K and V ``stages``; V None under
        ``shared_kv_state``, where K's state serves both rings)."""
        if const_expr(len(states) > 0):
            return states
        v_state = None
        if const_expr(not self.cfg.shared_kv_state):
            v_state = pipeline.make_pipeline_state(user_type, self.stages)
        return (pipeline.make_pipeline_state(user_type, 1), pipeline.make_pipeline_state(user_type, self.stages),
                v_state)

    # ----- producer warp: TMA only ----------------------------------------------------------

    @cute.jit
    def producer(self, mQ, mK, mV, sQ, sK, sV, tma_q, tma_k, tma_v, pipe_q, pipe_k, pipe_v, m_block: Int32, n_blocks: Int32,
                 n_start, states: tuple = ()):
        """Load Q once, then K_j and V_j for j = n_blocks-1 .. 0 in the order the consumers use them.
        ``states``: (Q, K, V) producer states carried from the previous tile (persistent), returned advanced;
        the first K tile then goes out before Q (Q's buffer may still hold the previous tile's O)."""
        D = self.head_dim
        gQ = self._q_tile(mQ, m_block, cute.size(mQ.shape[0]))
        gK = cute.local_tile(mK, (self.tile_n, D), (None, 0))  # (tile_n, D, n_kv_tiles)
        gV = self._v_tiles(mV)  # (V tile, n_kv_tiles)
        one = cute.make_layout(1)
        tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, one, cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, one, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, one, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))

        carried = const_expr(len(states) > 0)
        q_state, k_state, v_state = self._pipeline_states(pipeline.PipelineUserType.Producer, states)
        first_k = (self.cfg.k_before_q or carried) and not self.cfg.shared_kv_state
        if const_expr(first_k):  # the first K tile's load goes out before Q's (flash-attn-4's order)
            k_state = self._load(tma_k, tKgK, tKsK, pipe_k, k_state, self._tile(n_start, n_blocks - 1))
        pipe_q.producer_acquire(q_state)
        cute.copy(tma_q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
        if const_expr(carried):
            q_state.advance()

        if const_expr(self.cfg.shared_kv_state):
            self._produce_shared(tKgK, tKsK, tVgV, tVsV, tma_k, tma_v, pipe_k, pipe_v, k_state, n_blocks, n_start)
            return
        if const_expr(not first_k):
            k_state = self._load(tma_k, tKgK, tKsK, pipe_k, k_state, self._tile(n_start, n_blocks - 1))
        for i in cutlass.range(n_blocks - 1, unroll=1):
            n = self._tile(n_start, n_blocks - 2 - i)
            if const_expr(self.overlap):  # consumers want K_n before V_{n+1}
                k_state = self._load(tma_k, tKgK, tKsK, pipe_k, k_state, n)
                v_state = self._load(tma_v, tVgV, tVsV, pipe_v, v_state, n + 1)
            else:
                v_state = self._load(tma_v, tVgV, tVsV, pipe_v, v_state, n + 1)
                k_state = self._load(tma_k, tKgK, tKsK, pipe_k, k_state, n)
        v_state = self._load(tma_v, tVgV, tVsV, pipe_v, v_state, self._tile(n_start, 0))
        return q_state, k_state, v_state

    @cute.jit
    def _produce_shared(self, tKgK, tKsK, tVgV, tVsV, tma_k, tma_v, pipe_k, pipe_v, state, n_blocks: Int32, n_start):
        """``producer`` with one state for both rings (``shared_kv_state``): the i-th K/V tile of the range
        goes to slot i of each ring, so K_n uses the state one past V_{n+1}'s."""
        self._issue(tma_k, tKgK, tKsK, pipe_k, state, self._tile(n_start, n_blocks - 1))
        for i in cutlass.range(n_blocks - 1, unroll=1):
            n = self._tile(n_start, n_blocks - 2 - i)
            v_state = state.clone()
            state.advance()
            if const_expr(self.overlap):  # consumers want K_n before V_{n+1}
                self._issue(tma_k, tKgK, tKsK, pipe_k, state, n)
                self._issue(tma_v, tVgV, tVsV, pipe_v, v_state, n + 1)
            else:
                self._issue(tma_v, tVgV, tVsV, pipe_v, v_state, n + 1)
                self._issue(tma_k, tKgK, tKsK, pipe_k, state, n)
        self._issue(tma_v, tVgV, tVsV, pipe_v, state, self._tile(n_start, 0))

    @staticmethod
    def _issue(tma_atom, g_tiles, s_buffers, pipe, state, block):
        """Wait for a free buffer, arm its mbarrier with the byte count, issue the TMA load."""
        pipe.producer_acquire(state)
        cute.copy(tma_atom, g_tiles[None, block], s_buffers[None, state.index], tma_bar_ptr=pipe.producer_get_barrier(state))

    @staticmethod
    def _load(tma_atom, g_tiles, s_buffers, pipe, state, block):
        """``_issue``, then advance the state."""
        FlashAttention3Sm90._issue(tma_atom, g_tiles, s_buffers, pipe, state, block)
        state.advance()
        return state

    # ----- consumer warpgroups: GEMMs, softmax, epilogue ---------------------------------------

    @cute.jit
    def consumer(
        self, mO, mLSE, sQ, sK, sV, sO, tma_o, tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v,
        scale_log2: Float32, m_block: Int32, n_blocks: Int32, seqlen_q: Int32, seqlen_k: Int32,
        extras: tuple, head: Int32, batch: Int32, n_start, states: tuple = (),
    ):
        """FA3 Algorithm 1 (consumer side) for this warpgroup's 64 rows of the Q tile. ``states``: (Q, K, V)
        consumer states carried from the previous tile (persistent; the ping-pong turn was handed out once by
        ``_roles_persistent``), returned advanced past this tile; Q's buffer is released for the next tile's Q
        after the last S GEMM (O in its own buffer) or after the TMA store has read O from it."""
        tidx = cute.arch.thread_idx()[0] - WARPGROUP_THREADS  # 0 .. 128 * num_wg - 1
        wg = cute.arch.make_warp_uniform(tidx // WARPGROUP_THREADS)

        # WGMMA operands: shared-memory descriptors per warpgroup, P and accumulators in registers.
        wg_qk = tiled_mma_qk.get_slice(wg * WARPGROUP_THREADS)
        wg_pv = tiled_mma_pv.get_slice(wg * WARPGROUP_THREADS)
        tSrQ = wg_qk.make_fragment_A(wg_qk.partition_A(sQ))
        tSrK = wg_qk.make_fragment_B(wg_qk.partition_B(sK))  # (MMA, N, K, stage)
        tOrV = wg_pv.make_fragment_B(wg_pv.partition_B(self._v_operand(sV)))  # V^T: (MMA, D, tile_n, stage)
        if const_expr(self.cfg.hoisted_descriptors):  # stage descriptors: base once, + stage offset per GEMM
            tSrK, tOrV = hoisted_descriptors(tSrK), hoisted_descriptors(tOrV)
        tOrP = wg_pv.make_fragment_A(wg_pv.partition_shape_A((self.tile_m, self.tile_n)))
        acc_O = cute.make_rmem_tensor(wg_pv.partition_shape_C((self.tile_m, self.head_dim)), Float32)

        # (row, col) of each score this thread holds, for masking.
        cS = cute.make_identity_tensor((self.tile_m, self.tile_n))
        tScS = tiled_mma_qk.get_slice(tidx).partition_C(cS)
        t0ScS = tiled_mma_qk.get_slice(0).partition_C(cS)
        num_rows = cute.size(acc_rows_cols(acc_O), mode=[0])
        softmax = self._make_softmax(num_rows, scale_log2)
        softmax.reset()
        # rescale_o_before_pv: the alpha O waits for
        alpha_prev = cute.make_rmem_tensor(num_rows, Float32) if const_expr(self._defers()) else None

        ctx = self._step_context((
            self, wg, tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrV, tOrP, acc_O, tScS, t0ScS,
            softmax, pipe_k, pipe_v, self._q_start(m_block, seqlen_q),
            AttentionMask(seqlen_q, seqlen_k, qhead_per_kvhead=max(self.pack_group, 1)), alpha_prev,
        ), extras, m_block, head, batch)
        if const_expr(not ctx.overwrites_o()):
            acc_O.fill(0.0)
        carried = const_expr(len(states) > 0)
        q_state, k_state, v_state = self._pipeline_states(pipeline.PipelineUserType.Consumer, states)
        pipe_q.consumer_wait(q_state)
        if const_expr(self.pingpong and not carried):
            if wg == 0:  # warpgroup 0 takes the first turn
                cute.arch.barrier_arrive(barrier_id=int(NamedBarrier.SCHEDULE_WG0), number_of_threads=2 * WARPGROUP_THREADS)

        # K/V tiles from the last (masked at seqlen_k and the diagonal) to the first. Tiles that
        # cross the causal diagonal are masked; the ones left of it are not.
        n_masked = 0
        if const_expr(self.causal):
            if const_expr(self._tail_first()):
                first_masked = self.blocks.kv_tile_causal_start(m_block, seqlen_q, seqlen_k, self._q_start(m_block, seqlen_q))
            else:
                first_masked = self.blocks.kv_tile_causal_start(m_block, seqlen_q, seqlen_k)
            if const_expr(self.split):  # tiles of this range at or past first_masked, but the first one
                first_masked = cutlass.max(first_masked, n_start)
            n_masked = cutlass.max(self._tile(n_start, n_blocks) - 1 - first_masked, 0)
        n_free = n_blocks - 1 - n_masked
        last = self._tile(n_start, n_blocks - 1)

        if const_expr(getattr(self.cfg, "s_lookahead", False)):  # fa3-fp8's own loop (hopper/fa3_fp8.py)
            ctx.lookahead_loop(k_state, v_state, n_blocks, n_masked, n_free)
        elif const_expr(self.overlap and ctx.defer_mode() > 0):
            k_state = ctx.first_scores(k_state, last)
            for i in cutlass.range(n_masked, unroll=1):
                k_state, v_state = ctx.deferred_step(k_state, v_state, last - 1 - i, causal=True, accumulate=i > 0)
            for i in cutlass.range(n_free, unroll=1):
                k_state, v_state = ctx.deferred_step(k_state, v_state, self._tile(n_start, n_free - 1 - i), causal=False,
                                                     accumulate=i + n_masked > 0)
            ctx.deferred_last_pv(v_state, self._tile(n_start, 0), accumulate=n_blocks > 1)
        elif const_expr(self.overlap):
            k_state = ctx.first_scores(k_state, last)
            for i in cutlass.range(n_masked, unroll=1):
                k_state, v_state = ctx.overlapped_step(k_state, v_state, last - 1 - i, causal=True, accumulate=i > 0)
            for i in cutlass.range(n_free, unroll=1):
                k_state, v_state = ctx.overlapped_step(k_state, v_state, self._tile(n_start, n_free - 1 - i), causal=False,
                                                       accumulate=i + n_masked > 0)
            ctx.last_pv(k_state if const_expr(v_state is None) else v_state, self._tile(n_start, 0), accumulate=n_blocks > 1)
        else:
            ctx.schedule_sync()
            k_state, v_state = ctx.serial_step(k_state, v_state, last, causal=self.causal, seqlen_end=True, is_first=True)
            for i in cutlass.range(n_masked, unroll=1):
                k_state, v_state = ctx.serial_step(k_state, v_state, last - 1 - i, causal=True)
            for i in cutlass.range(n_free, unroll=1):
                k_state, v_state = ctx.serial_step(k_state, v_state, self._tile(n_start, n_free - 1 - i), causal=False)
            if const_expr(not self.cfg.early_pv_arrive):  # else the last P V GEMM's issue ended the turn
                ctx.schedule_arrive()

        if const_expr(carried and self.separate_o):  # every S GEMM has completed: the next Q may load
            pipe_q.consumer_release(q_state)
        lse = ctx.finalize()
        rows = seqlen_q * self.pack_group if const_expr(self.pack_group) else seqlen_q  # packed: G rows per position
        if const_expr(self.split):
            self.store_partial(acc_O, lse, mO, mLSE, tiled_mma_pv, tidx, m_block, rows)
        else:
            self.epilogue(acc_O, lse, mO, mLSE, sO, tma_o, tiled_mma_pv, tidx, m_block, rows)
        if const_expr(carried):
            if const_expr(not self.separate_o):  # O, in Q's buffer, has been read by the TMA store (warp 0 waited)
                pipe_q.consumer_release(q_state)
            q_state.advance()
            return q_state, k_state, v_state

    @cute.jit
    def store_partial(self, acc_O, lse, mO, mLSE, tiled_mma_pv, tidx: Int32, m_block: Int32, seqlen_q: Int32):
        """Split-KV epilogue: this split's O (fp32, normalised by its own row sum) and LSE straight from
        registers to the partial buffers (a few rows in decode: no shared-memory staging)."""
        thr_mma = tiled_mma_pv.get_slice(tidx)
        tOcO = acc_rows_cols(thr_mma.partition_C(cute.make_identity_tensor((self.tile_m, self.head_dim))))
        o = acc_rows_cols(acc_O)
        for r in cutlass.range_constexpr(cute.size(o, mode=[0])):
            row = m_block * self.tile_m + tOcO[r, 0][0]
            if row < seqlen_q:
                for c in cutlass.range_constexpr(cute.size(o, mode=[1])):
                    mO[row, tOcO[r, c][1]] = o[r, c]
                if tOcO[0, 0][1] == 0:
                    mLSE[row] = lse[r]

    @cute.jit
    def epilogue(self, acc_O, lse, mO, mLSE, sO, tma_o, tiled_mma_pv, tidx: Int32, m_block: Int32, seqlen_q: Int32):
        """O: registers -> shared memory (stmatrix) -> global memory (one TMA store, clipped at
        seqlen_q). LSE: straight from registers, by the thread holding column 0 of each row."""
        rO = cute.make_rmem_tensor_like(acc_O, self.out_dtype)
        self._convert(acc_O, rO)
        consumers = self.num_wg * WARPGROUP_THREADS
        cute.arch.barrier(barrier_id=int(NamedBarrier.EPILOGUE), number_of_threads=consumers)  # Q reads done
        stmatrix = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.out_dtype)
        thr_copy = cute.make_tiled_copy_C(stmatrix, tiled_mma_pv).get_slice(tidx)
        cute.copy(stmatrix, thr_copy.retile(rO), thr_copy.partition_D(sO))

        thr_mma = tiled_mma_pv.get_slice(tidx)
        tOcO = acc_rows_cols(thr_mma.partition_C(cute.make_identity_tensor((self.tile_m, self.head_dim))))
        if tOcO[0, 0][1] == 0:
            for r in cutlass.range_constexpr(cute.size(lse)):
                if const_expr(self._tail_first()):  # tile 0's rows shared with tile 1 are tile 1's
                    row = self._q_start(m_block, seqlen_q) + tOcO[r, 0][0]
                    if row < self.blocks.q_row_end(m_block, seqlen_q, True):
                        mLSE[row] = lse[r]
                else:
                    row = m_block * self.tile_m + tOcO[r, 0][0]
                    if row < seqlen_q:
                        mLSE[row] = lse[r]

        cute.arch.fence_view_async_shared()  # make the stmatrix writes visible to the TMA unit
        if const_expr(self.cfg.epilogue_arrive):  # only the storing warp waits for the others' writes
            if tidx >= 32:
                cute.arch.barrier_arrive(barrier_id=int(NamedBarrier.EPILOGUE), number_of_threads=consumers)
            else:
                cute.arch.barrier(barrier_id=int(NamedBarrier.EPILOGUE), number_of_threads=consumers)
        else:
            cute.arch.barrier(barrier_id=int(NamedBarrier.EPILOGUE), number_of_threads=consumers)
        if tidx < 32:
            gO = self._q_tile(mO, m_block, seqlen_q)
            tOsO, tOgO = cpasync.tma_partition(tma_o, 0, cute.make_layout(1), cute.group_modes(sO, 0, 2), cute.group_modes(gO, 0, 2))
            cute.copy(tma_o, tOsO, tOgO)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)  # smem must outlive the store


class FlashAttention3Sm90Persistent(FlashAttention3Sm90):
    """``FlashAttention3Sm90`` with a persistent grid (``Sm90Config.persistent``): ``__call__`` takes, after
    l2_heads, ``ctas`` (Int32 > 0): the grid's CTA count (the SM count; fewer when there are fewer work tiles)."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, l2_heads: Int32, ctas: Int32, stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale_log2, l2_heads, (), stream, ctas=ctas)


class FlashAttention3Sm90FusedMerge(FlashAttention3Sm90):
    """``FlashAttention3Sm90`` with split-KV and the merge in the same kernel (``Sm90Config.fused_merge``):
    ``__call__`` takes the fp32 partials (mO (S*B, Nq, H, D), mLSE (S*B, H, Nq)) where the split kernel does, then
    the caller's out (B, Nq, H, D) and lse (B, H, Nq), and counters: int32, one per query tile (batch x heads x
    query tiles of the kernel's view), all 0 before the launch and left at 0 after it."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, l2_heads: Int32, mOut: cute.Tensor, mLSEout: cute.Tensor,
                 mCount: cute.Tensor, stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale_log2, l2_heads, (), stream, merge=(mOut, mLSEout, mCount))


@dataclass(frozen=True)
class _StepContext:
    """One consumer warpgroup's mainloop steps (trace-time helper holding its fragments; frozen so
    that the DSL passes it into run-time loops as read-only)."""

    k: "FlashAttention3Sm90"
    wg: Int32
    mma_qk: cute.TiledMma
    mma_pv: cute.TiledMma
    tSrQ: cute.Tensor
    tSrK: cute.Tensor
    tOrV: cute.Tensor
    tOrP: cute.Tensor
    acc_O: cute.Tensor
    tScS: cute.Tensor
    t0ScS: cute.Tensor
    softmax: OnlineSoftmax
    pipe_k: pipeline.PipelineTmaAsync
    pipe_v: pipeline.PipelineTmaAsync
    row0: Int32
    mask_s: AttentionMask
    alpha_prev: cute.Tensor  # (rows,) alpha of the tile whose P V GEMM is issued next (defer_mode > 0), else None

    # ping-pong: warpgroup w waits on its own barrier, then hands the turn to w + 1
    def schedule_sync(self):
        if const_expr(self.k.pingpong):
            cute.arch.barrier(barrier_id=int(NamedBarrier.SCHEDULE_WG0) + self.wg, number_of_threads=2 * WARPGROUP_THREADS)

    def schedule_arrive(self):
        if const_expr(self.k.pingpong):
            nxt = self.wg + 1
            if const_expr(self.k.num_wg == 2):
                nxt = 1 - self.wg
            else:
                nxt = nxt % self.k.num_wg
            cute.arch.barrier_arrive(barrier_id=int(NamedBarrier.SCHEDULE_WG0) + nxt, number_of_threads=2 * WARPGROUP_THREADS)

    def new_scores(self):
        return cute.make_rmem_tensor(self.mma_qk.get_slice(0).partition_shape_C((self.k.tile_m, self.k.tile_n)), Float32)

    def mask(self, acc_S, n_block, causal: bool, seqlen_end: bool):
        if const_expr(causal or seqlen_end):
            self.mask_s.apply(acc_rows_cols(acc_S), acc_rows_cols(self.tScS), acc_rows_cols(self.t0ScS), self.row0,
                              n_block * self.k.tile_n, seqlen_end, causal)

    # Hooks of the kernel family (fa3_fp8 overrides them): how S becomes P, how a tile's P V reaches O.

    def softmax_step(self, acc_S, n_block, is_first: bool = False):
        """S (tile n_block) -> P in place; returns the per-row factor O must be rescaled by."""
        return self.softmax.update(acc_rows_cols(acc_S), is_first)

    def rescale_o(self, alpha, n_block):
        """O *= alpha, before the P V GEMM of tile n_block is issued."""
        self.softmax.rescale(acc_rows_cols(self.acc_O), alpha, skip_ones=True)

    def to_p(self, acc_S):
        """P (fp32 accumulator) -> 16-bit A operand of the PV GEMM, in registers."""
        self.k._convert(acc_as_operand_a(acc_S), self.tOrP)

    def pv(self, v_state, n_block, wait: int, accumulate=None):
        """Issue O += P V_n (one WGMMA group; ``wait`` as in ``common.sm90.wgmma``); O = P V_n where the
        run-time ``accumulate`` is False (only passed when ``overwrites_o``)."""
        early = const_expr(self.k.cfg.early_pv_arrive)
        wgmma(self.mma_pv, self.acc_O, self.tOrP, self.tOrV[None, None, None, v_state.index],
              wait=-1 if early else wait, accumulate=accumulate)
        if const_expr(early):
            self.pv_issued(wait)

    def pv_issued(self, wait: int):
        """``early_pv_arrive``: called by ``pv`` once the last WGMMA group of the P V GEMM is committed: hand the
        ping-pong turn on, then wait until at most ``wait`` groups are in flight (-1: no wait)."""
        self.schedule_arrive()
        if const_expr(wait >= 0):
            warpgroup.wait_group(wait)

    def overwrites_o(self) -> bool:
        """Whether the first P V GEMM overwrites O (``first_pv_overwrites``), so O needs no zero fill: only
        with this class's ``pv`` (a subclass's own P V hook, fa3-fp8's, keeps the fill)."""
        return self.k.cfg.first_pv_overwrites and type(self).pv is _StepContext.pv

    def _pv(self, v_state, n_block, wait: int, accumulate):
        """``pv``, passing ``accumulate`` (first tile: False) only when ``overwrites_o``."""
        if const_expr(self.overwrites_o()):
            self.pv(v_state, n_block, wait=wait, accumulate=accumulate)
        else:
            self.pv(v_state, n_block, wait=wait)

    def fold_pv(self, n_block):
        """After the P V GEMM of tile n_block completed: nothing here (it accumulated into O)."""

    def finalize(self):
        """Deferred normalisation: O /= l once; returns LSE = m * scale + ln(l) per row."""
        inv_l, lse = self.softmax.finalize()
        self.softmax.rescale(acc_rows_cols(self.acc_O), inv_l)
        return lse

    # Pipeline states: separate K and V states (v_state given), or one (``shared_kv_state``, v_state None):
    # the state of the K tile last consumed, whose V is consumed next under overlap (fa4 keeps one state too,
    # adapted from Dao-AILab/flash-attention:flash_attn/cute/flash_fwd_sm90.py::mma_one_n_block_intrawg_overlap).

    def first_scores(self, k_state, n_block):
        """Overlap prologue: S for the last K/V tile, masked, softmax (no PV yet)."""
        acc_S = self.new_scores()
        self.pipe_k.consumer_wait(k_state)
        wgmma(self.mma_qk, acc_S, self.tSrQ, self.tSrK[None, None, None, k_state.index], zero_init=True, wait=0)
        self.pipe_k.consumer_release(k_state)
        if const_expr(not self.k.cfg.shared_kv_state):
            k_state.advance()
        self.mask(acc_S, n_block, causal=self.k.causal, seqlen_end=True)
        alpha = self.softmax_step(acc_S, n_block, is_first=True)
        if const_expr(self.defer_mode() > 0):
            self.alpha_prev.store(alpha.load())  # ones: the first P V GEMM finds O at zero (or overwrites it)
        self.to_p(acc_S)
        return k_state

    def defer_mode(self) -> int:
        """0: O rescaled and P written at the end of each overlapped step, after waiting for its P V GEMM;
        1: ``rescale_o_before_pv``. Only with this class's P V hooks (fa3-fp8's own hooks keep 0; its config
        rejects the switch)."""
        own = all(getattr(type(self), h) is getattr(_StepContext, h) for h in ("pv", "to_p", "rescale_o", "fold_pv"))
        return 1 if own and self.k._defers() else 0

    @cute.jit
    def deferred_step(self, k_state, v_state, n_block, causal: cutlass.Constexpr[bool], accumulate=True):
        """``overlapped_step`` for defer_mode > 0 (``rescale_o_before_pv``), with O *= alpha of tile n_block + 1
        applied in this step instead of at the end of the previous one: right after the S GEMM of tile n_block
        is issued (the previous P V GEMM was waited for at the end of the previous step; the S GEMM runs
        meanwhile). ``accumulate``: False on the first step (no P V GEMM before it; O's first-P V overwrite,
        ``_pv``). Returns (k_state, v_state)."""
        acc_S = self.new_scores()
        self.pipe_k.consumer_wait(k_state)
        self.schedule_sync()
        wgmma(self.mma_qk, acc_S, self.tSrQ, self.tSrK[None, None, None, k_state.index], zero_init=True, wait=-1)
        self.rescale_o(self.alpha_prev, n_block + 1)
        self.pipe_v.consumer_wait(v_state)
        self._pv(v_state, n_block + 1, wait=-1, accumulate=accumulate)
        self.schedule_arrive()
        warpgroup.wait_group(1)  # S is ready; P V may still run
        self.pipe_k.consumer_release(k_state)
        k_state.advance()
        self.mask(acc_S, n_block, causal=causal, seqlen_end=False)
        alpha = self.softmax_step(acc_S, n_block)
        self.alpha_prev.store(alpha.load())
        warpgroup.wait_group(0)  # P V done: P and the V buffer are free
        self.pipe_v.consumer_release(v_state)
        v_state.advance()
        self.to_p(acc_S)
        return k_state, v_state

    @cute.jit
    def deferred_last_pv(self, v_state, n_block, accumulate=True):
        """``last_pv`` for defer_mode > 0: O *= alpha of tile n_block, then O += P V_{n_block}."""
        self.rescale_o(self.alpha_prev, n_block)
        self.pipe_v.consumer_wait(v_state)
        self._pv(v_state, n_block, wait=0, accumulate=accumulate)
        self.pipe_v.consumer_release(v_state)
        v_state.advance()

    def overlapped_step(self, k_state, v_state, n_block, causal: bool, accumulate=True):
        """Algorithm 2 body: issue S_next = Q K_n^T and O += P V_prev together; softmax(S_next)
        runs while the PV GEMM is still in flight. ``accumulate``: False for the first PV (``_pv``)."""
        shared = const_expr(v_state is None)
        if const_expr(shared):  # V of the previous K tile, K one slot on
            v_state = k_state.clone()
            k_state.advance()
        acc_S = self.new_scores()
        self.pipe_k.consumer_wait(k_state)
        self.schedule_sync()
        wgmma(self.mma_qk, acc_S, self.tSrQ, self.tSrK[None, None, None, k_state.index], zero_init=True, wait=-1)
        self.pipe_v.consumer_wait(v_state)
        self._pv(v_state, n_block + 1, wait=-1, accumulate=accumulate)
        self.schedule_arrive()
        warpgroup.wait_group(1)  # S_next is ready; PV may still run
        self.pipe_k.consumer_release(k_state)
        if const_expr(not shared):
            k_state.advance()
        self.mask(acc_S, n_block, causal=causal, seqlen_end=False)
        alpha = self.softmax_step(acc_S, n_block)
        warpgroup.wait_group(0)  # PV done: O and P registers are free
        self.pipe_v.consumer_release(v_state)
        if const_expr(not shared):
            v_state.advance()
        self.fold_pv(n_block + 1)
        self.rescale_o(alpha, n_block)
        self.to_p(acc_S)
        return k_state, (None if const_expr(shared) else v_state)

    def last_pv(self, v_state, n_block=0, accumulate=True):
        """Overlap epilogue: O += P V for the first K/V tile of the range (n_block)."""
        self.pipe_v.consumer_wait(v_state)
        self._pv(v_state, n_block, wait=0, accumulate=accumulate)
        self.pipe_v.consumer_release(v_state)
        v_state.advance()
        self.fold_pv(n_block)
        return v_state

    def serial_step(self, k_state, v_state, n_block, causal: bool, seqlen_end: bool = False, is_first: bool = False):
        """Algorithm 1 body without intra-warpgroup overlap; the turn (ping-pong) covers
        [O += P V_n, S_{n-1} = Q K_{n-1}^T], the softmax runs outside it. With ``early_pv_arrive`` the turn
        covers the issue of O += P V_n only (``pv_issued``; the first step's turn: its S GEMM)."""
        shared = const_expr(v_state is None)  # one state: K and V of this tile share it
        acc_S = self.new_scores()
        self.pipe_k.consumer_wait(k_state)
        wgmma(self.mma_qk, acc_S, self.tSrQ, self.tSrK[None, None, None, k_state.index], zero_init=True, wait=-1)
        if const_expr(is_first or not self.k.cfg.early_pv_arrive):  # else the turn ended with the P V GEMM's issue
            self.schedule_arrive()
        warpgroup.wait_group(0)
        self.pipe_k.consumer_release(k_state)
        if const_expr(shared):
            v_state = k_state
        else:
            k_state.advance()
        self.mask(acc_S, n_block, causal=causal, seqlen_end=seqlen_end)
        alpha = self.softmax_step(acc_S, n_block, is_first=is_first)
        if const_expr(not is_first):
            self.rescale_o(alpha, n_block)
        self.to_p(acc_S)
        self.pipe_v.consumer_wait(v_state)
        self.schedule_sync()
        self._pv(v_state, n_block, wait=0, accumulate=not is_first)
        self.pipe_v.consumer_release(v_state)
        v_state.advance()
        self.fold_pv(n_block)
        return (v_state, None) if const_expr(shared) else (k_state, v_state)
