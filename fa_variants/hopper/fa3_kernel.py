"""The CuTe DSL kernel of the fa3 backend, ``FlashAttention3Sm90`` (the algorithm: ``fa_variants.hopper.fa3``'s
docstring). Imported only to compile (``hopper.fa3._build``): a process that loads its kernels from the disk
cache (``common.diskcache``) never imports the DSL. Adapted from Dao-AILab/flash-attention:
flash_attn/cute/flash_fwd_sm90.py::FlashAttentionForwardSm90 and NVIDIA/cutlass:
examples/python/CuTeDSL/cute/hopper/kernel/attention/fmha.py.

This module reads top-down like FA3's forward (FA3 paper, Algorithm 1): the host side (TMA descriptors, shared
memory, grid), the kernel (pipelines, then the producer warp and the consumer warpgroups with their register
split, section 3.1), the consumer (Q K^T, softmax, P V over the K/V tiles from the last to the first, then the
epilogue). Its pieces live beside it:

    hopper/fa3_producer.py   Fa3Producer: mbarrier pipelines and the producer warp's TMA loads
    hopper/fa3_mainloop.py   _StepContext: one consumer warpgroup's K/V tile steps (ping-pong, intra-warpgroup
                             overlap: sections 3.1-3.2)
    hopper/fa3_schedule.py   Fa3Schedule: tile coordinates, K/V tile ranges, the persistent grid's roles
    hopper/fa3_split.py      Fa3SplitKV: split-KV coordinates, partial epilogue, fused merge

``FlashAttention3Sm90Persistent`` and ``FlashAttention3Sm90FusedMerge`` (their ``__call__``) are here too; the
kernel classes stay in this module (the DSL names a kernel after its object's module and class).
"""
import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync

from fa_variants.common import pack_gqa, tile_scheduler
from fa_variants.common.config import Sm90Config
from fa_variants.common.layout import convert_in_pairs, transpose_view
from fa_variants.common.layout import rows_cols as acc_rows_cols
from fa_variants.common.mask import AttentionMask, BlockInfo, kv_length, kv_start, q_length
from fa_variants.common.sm90 import (WARPGROUP_THREADS, NamedBarrier, hoisted_descriptors, make_row_major_smem_layout,
                                    make_tiled_mma)
from fa_variants.common.softmax import OnlineSoftmax
from fa_variants.hopper.fa3_mainloop import _StepContext
from fa_variants.hopper.fa3_producer import Fa3Producer
from fa_variants.hopper.fa3_schedule import Fa3Schedule
from fa_variants.hopper.fa3_split import LN_2, LOG2_E, MERGE_VEC, Fa3SplitKV

__all__ = ["FlashAttention3Sm90", "FlashAttention3Sm90Persistent", "FlashAttention3Sm90FusedMerge",
           "FlashAttention3Sm90Lengths", "FlashAttention3Sm90FusedMergeLengths", "REGISTERS",
           "REGISTERS_TWO_CTAS", "MERGE_VEC", "LOG2_E", "LN_2", "_StepContext"]

# Register split per consumer-warpgroup count: (producer warpgroup, each consumer warpgroup);
# 128 * (producer + n * consumer) <= 64K registers per SM.
REGISTERS = {1: (24, 240), 2: (24, 240), 3: (32, 160)}
# Two CTAs per SM (Sm90Config.ctas_per_sm = 2, one consumer warpgroup): 2 x 256 threads x 128 registers at launch;
# the producer gives 104 back, the consumer takes them: 24 + 232 = 2 x 128.
REGISTERS_TWO_CTAS = (24, 232)


class FlashAttention3Sm90(Fa3Schedule, Fa3SplitKV, Fa3Producer):
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

    # Hooks a subclass with other operand types overrides (fa3_fp8_kernel.FlashAttention3Fp8Sm90): the
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
                             active_rows=1 if self.cfg.first_row_only else None,  # padding rows: Sm90Config
                             alpha_first=self.cfg.alpha_first)

    def _step_context(self, args: tuple, extras: tuple, m_block: Int32, head: Int32, batch: Int32):
        return _StepContext(*args)

    def _defers(self) -> bool:
        """Whether O's rescale waits for the next step (``rescale_o_before_pv``)."""
        return self.overlap and self.cfg.rescale_o_before_pv

    @cute.jit
    def launch(self, mQ, mK, mV, mO, mLSE, softmax_scale_log2: Float32, l2_heads: Int32, extras: tuple,
               stream: cuda.CUstream, merge: tuple = (), ctas=None, order: tuple = (), lengths: tuple = ()):
        """Host side shared by the kernel family; ``extras`` (tensors) go unchanged to the device side.
        ``merge``: (out, lse, counters) of the fused split merge (``FlashAttention3Sm90FusedMerge``), else ().
        ``ctas``: the persistent grid's CTA count (``FlashAttention3Sm90Persistent``), else None; ``order``: (its
        tile table,) with ``Sm90Config.balanced``, else (); ``lengths``: (seqlens_k,) with ``Sm90Config.seqlens_k``
        (int32 (batch,): ``common.mask.kv_length``), (seqlens_k, leftpad_k) with ``Sm90Config.leftpad_k`` too
        (``common.mask.kv_start``), (seqlens_k, leftpad_k, seqlens_q) with ``Sm90Config.seqlens_q`` too
        (``common.mask.q_length``), else ()."""
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
            softmax_scale_log2, num_m_blocks, qhead_per_kvhead, l2_heads, extras, merge, order, lengths,
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
        order: tuple,
        lengths: tuple,
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
            seqlen_k = kv_length(lengths, batch, seqlen_k)
            first_key = kv_start(lengths, batch, seqlen_k)  # leftpad_k: K/V viewed from it (_roles)
            seqlen_k = seqlen_k - first_key
            diag_q = q_length(lengths, batch, seqlen_q)  # seqlens_q: the diagonal's query count (else seqlen_q)
            n_start, n_blocks = self._split_range(m_block, split_idx, num_splits, seqlen_q, seqlen_k, diag_q)
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
                            m_block, head, batch, out_batch, n_start, n_blocks, seqlen_q, seqlen_k, first_key, diag_q,
                            last)
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
                                   warp_idx, num_m_blocks, l2_heads, seqlen_q, seqlen_k, order)
        else:
            m_block, head, batch = self._tile_coords(num_m_blocks, mQ.shape[2], mQ.shape[3], l2_heads)
            seqlen_k = kv_length(lengths, batch, seqlen_k)
            first_key = kv_start(lengths, batch, seqlen_k)
            seqlen_k = seqlen_k - first_key
            diag_q = q_length(lengths, batch, seqlen_q)
            n_blocks = self._num_kv_blocks(m_block, seqlen_q, seqlen_k, diag_q)
            self._roles(mQ, mK, mV, mO, mLSE, sQ, sK, sV, sO, tma_q, tma_k, tma_v, tma_o, tiled_mma_qk,
                        tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2, qhead_per_kvhead, extras, warp_idx,
                        m_block, head, batch, batch, 0, n_blocks, seqlen_q, seqlen_k, first_key, diag_q)

    @cute.jit
    def _roles(self, mQ, mK, mV, mO, mLSE, sQ, sK, sV, sO, tma_q, tma_k, tma_v, tma_o, tiled_mma_qk, tiled_mma_pv,
               pipe_q, pipe_k, pipe_v, scale_log2: Float32, qhead_per_kvhead: Int32, extras: tuple, warp_idx: Int32,
               m_block: Int32, head: Int32, batch: Int32, out_batch: Int32, n_start, n_blocks: Int32,
               seqlen_q: Int32, seqlen_k: Int32, first_key: Int32, diag_q: Int32, last: tuple = ()):
        """Producer warp and consumer warpgroups of one CTA over K/V tiles [n_start, n_start + n_blocks) of K and V
        from key ``first_key`` on (``Sm90Config.leftpad_k``; 0 otherwise, unused), the causal diagonal aligned to
        ``diag_q`` query rows (``common.mask.q_length``); ``last`` (fused split merge): the
        consumers then run ``_merge_if_last`` with it (inside their branch: code after the producer's register
        decrease joins it would be held to the producer's registers)."""
        if warp_idx < WARPGROUP_THREADS // 32:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                mK_seq = mK[None, None, head // qhead_per_kvhead, batch]  # (seqlen_k, head_dim): key mode first
                mV_seq = mV[None, None, head // qhead_per_kvhead, batch]
                if const_expr(self.cfg.leftpad_k):  # TMA boxes from key first_key + n tile_n
                    mK_seq = cute.domain_offset((first_key, 0), mK_seq)
                    mV_seq = cute.domain_offset((first_key, 0), mV_seq)
                self.producer(
                    mQ[None, None, head, batch],
                    mK_seq,
                    mV_seq,
                    sQ, sK, sV, tma_q, tma_k, tma_v, pipe_q, pipe_k, pipe_v, m_block, n_blocks, n_start,
                )
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consumer(
                mO[None, None, head, out_batch], mLSE[None, head, out_batch], sQ, sK, sV, sO, tma_o,
                tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2,
                m_block, n_blocks, seqlen_q, seqlen_k, extras, head, batch, n_start, diag_q=diag_q,
            )
            if const_expr(self.fused_merge):
                self._merge_if_last(mO, mLSE, m_block, head, batch, *last)

    # ----- consumer warpgroups: GEMMs, softmax, epilogue ---------------------------------------

    @cute.jit
    def consumer(
        self, mO, mLSE, sQ, sK, sV, sO, tma_o, tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v,
        scale_log2: Float32, m_block: Int32, n_blocks: Int32, seqlen_q: Int32, seqlen_k: Int32,
        extras: tuple, head: Int32, batch: Int32, n_start, states: tuple = (), diag_q=None,
    ):
        """FA3 Algorithm 1 (consumer side) for this warpgroup's 64 rows of the Q tile. ``states``: (Q, K, V)
        consumer states carried from the previous tile (persistent; the ping-pong turn was handed out once by
        ``_roles_persistent``), returned advanced past this tile; Q's buffer is released for the next tile's Q
        after the last S GEMM (O in its own buffer) or after the TMA store has read O from it. ``diag_q``: the
        query count the causal diagonal is aligned to (``common.mask.q_length``; None: seqlen_q)."""
        diag_q = seqlen_q if const_expr(diag_q is None) else diag_q
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
            AttentionMask(diag_q, seqlen_k, qhead_per_kvhead=max(self.pack_group, 1)), alpha_prev, sV,
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
                first_masked = self.blocks.kv_tile_causal_start(m_block, diag_q, seqlen_k, self._q_start(m_block, seqlen_q))
            else:
                first_masked = self.blocks.kv_tile_causal_start(m_block, diag_q, seqlen_k)
            if const_expr(self.split):  # tiles of this range at or past first_masked, but the first one
                first_masked = cutlass.max(first_masked, n_start)
            n_masked = cutlass.max(self._tile(n_start, n_blocks) - 1 - first_masked, 0)
        n_free = n_blocks - 1 - n_masked
        last = self._tile(n_start, n_blocks - 1)

        # fa3-fp8's huge_hoisted: whether its free tiles may skip the huge-logit check (``_free_tiles``)
        safe = (not ctx.huge_possible(n_start, n_blocks)) if const_expr(ctx.hoists_huge_check()) else None
        k_state, v_state = self._kv_loop(ctx, k_state, v_state, n_start, n_blocks, n_masked, n_free, last, safe)

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
    def _kv_loop(self, ctx, k_state, v_state, n_start, n_blocks: Int32, n_masked: Int32, n_free: Int32, last: Int32,
                 safe=None):
        """The consumer's walk over its K/V tiles, last (masked at seqlen_k and the diagonal) to first, in the
        config's schedule: fa3-fp8's lookahead loop, intra-warpgroup overlap (deferred or not), or serial steps
        with ping-pong; the free tiles by ``_free_tiles`` (``safe``). Returns (k_state, v_state) advanced past the
        tiles."""
        if const_expr(getattr(self.cfg, "s_lookahead", False)):  # fa3-fp8's own loop (hopper/fa3_fp8_kernel.py)
            k_state, v_state = ctx.lookahead_loop(k_state, v_state, n_blocks, n_masked, n_free, safe)
        elif const_expr(self.overlap and ctx.defer_mode() > 0):
            k_state = ctx.first_scores(k_state, last)
            for i in cutlass.range(n_masked, unroll=1):
                k_state, v_state = ctx.deferred_step(k_state, v_state, last - 1 - i, causal=True, accumulate=i > 0)
            k_state, v_state = self._free_tiles(ctx, safe, k_state, v_state, n_free, lambda c, ks, vs, i: c.deferred_step(
                ks, vs, self._tile(n_start, n_free - 1 - i), causal=False, accumulate=i + n_masked > 0))
            ctx.deferred_last_pv(v_state, self._tile(n_start, 0), accumulate=n_blocks > 1)
        elif const_expr(self.overlap):
            k_state = ctx.first_scores(k_state, last)
            for i in cutlass.range(n_masked, unroll=1):
                k_state, v_state = ctx.overlapped_step(k_state, v_state, last - 1 - i, causal=True, accumulate=i > 0)
            k_state, v_state = self._free_tiles(ctx, safe, k_state, v_state, n_free, lambda c, ks, vs, i: c.overlapped_step(
                ks, vs, self._tile(n_start, n_free - 1 - i), causal=False, accumulate=i + n_masked > 0))
            ctx.last_pv(k_state if const_expr(v_state is None) else v_state, self._tile(n_start, 0), accumulate=n_blocks > 1)
        else:
            ctx.schedule_sync()
            k_state, v_state = ctx.serial_step(k_state, v_state, last, causal=self.causal, seqlen_end=True, is_first=True)
            for i in cutlass.range(n_masked, unroll=1):
                k_state, v_state = ctx.serial_step(k_state, v_state, last - 1 - i, causal=True)
            k_state, v_state = self._free_tiles(ctx, safe, k_state, v_state, n_free, lambda c, ks, vs, i: c.serial_step(
                ks, vs, self._tile(n_start, n_free - 1 - i), causal=False))
            if const_expr(not self.cfg.early_pv_arrive):  # else the last P V GEMM's issue ended the turn
                ctx.schedule_arrive()
        return k_state, v_state

    @cute.jit
    def _free_tiles(self, ctx, safe, k_state, v_state, count: Int32, step):
        """``count`` steps over free K/V tiles (left of the causal diagonal, before seqlen_k), i = 0 .. count - 1:
        (k_state, v_state) = step(ctx, k_state, v_state, i). ``safe`` None: one loop. Else (fa3-fp8's
        ``huge_hoisted``) the loop is compiled twice and ``safe`` (a run-time Boolean: no tile of the range can give
        a huge row max) picks the copy whose softmax skips the huge-logit check (``ctx.without_huge_check``). Only
        this loop is doubled: the first, masked and last tiles keep the checked code (with the whole walk doubled,
        ptxas spilled at the causal head_dim 64 / 256 defaults). Returns (k_state, v_state)."""
        if const_expr(safe is None):
            k_state, v_state = self._steps(ctx, k_state, v_state, count, step)
        else:
            if safe:
                k_state, v_state = self._steps(ctx.without_huge_check(), k_state, v_state, count, step)
            else:
                k_state, v_state = self._steps(ctx, k_state, v_state, count, step)
        return k_state, v_state

    @cute.jit
    def _steps(self, ctx, k_state, v_state, count: Int32, step):
        """One loop of ``_free_tiles``: (k_state, v_state) = step(ctx, k_state, v_state, i) for i < ``count``."""
        for i in cutlass.range(count, unroll=1):
            k_state, v_state = step(ctx, k_state, v_state, i)
        return k_state, v_state

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


class FlashAttention3Sm90Balanced(FlashAttention3Sm90Persistent):
    """``FlashAttention3Sm90Persistent`` with ``Sm90Config.balanced``: ``__call__`` takes, after ``ctas``, the tile
    table ``mOrder`` (int32, one entry per work tile: ``common.tile_order.balanced_order``)."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, l2_heads: Int32, ctas: Int32, mOrder: cute.Tensor,
                 stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale_log2, l2_heads, (), stream, ctas=ctas, order=(mOrder,))


class FlashAttention3Sm90Lengths(FlashAttention3Sm90):
    """``FlashAttention3Sm90`` with ``Sm90Config.seqlens_k``: ``__call__`` takes, after l2_heads, the per-sequence KV
    lengths ``mSeqlensK`` (int32, (batch,)); split-KV configs too (their fp32 partials in place of out and LSE)."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, l2_heads: Int32, mSeqlensK: cute.Tensor, stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale_log2, l2_heads, (), stream, lengths=(mSeqlensK,))


class FlashAttention3Sm90LeftpadK(FlashAttention3Sm90):
    """``FlashAttention3Sm90`` with ``Sm90Config.leftpad_k``: ``__call__`` takes, after l2_heads, the per-sequence
    window of a KV cache padded on both sides: ``mSeqlensK`` (its end) and ``mLeftpadK`` (its first key), int32
    (batch,) each; sequence b attends to keys [leftpad_k[b], seqlens_k[b]), causal bottom-right against their count."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, l2_heads: Int32, mSeqlensK: cute.Tensor, mLeftpadK: cute.Tensor,
                 stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale_log2, l2_heads, (), stream, lengths=(mSeqlensK, mLeftpadK))


class FlashAttention3Sm90Windows(FlashAttention3Sm90):
    """``FlashAttention3Sm90`` with ``Sm90Config.seqlens_q``: ``__call__`` takes, after l2_heads, ``mSeqlensK``,
    ``mLeftpadK`` (as ``FlashAttention3Sm90LeftpadK``) and ``mSeqlensQ`` (int32, (batch,) each): sequence b's causal
    diagonal bottom-right against seqlens_q[b] and its key count (``common.mask.q_length``)."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, l2_heads: Int32, mSeqlensK: cute.Tensor, mLeftpadK: cute.Tensor,
                 mSeqlensQ: cute.Tensor, stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale_log2, l2_heads, (), stream,
                    lengths=(mSeqlensK, mLeftpadK, mSeqlensQ))


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


class FlashAttention3Sm90FusedMergeLengths(FlashAttention3Sm90FusedMerge):
    """``FlashAttention3Sm90FusedMerge`` with ``Sm90Config.seqlens_k``: ``__call__`` takes, after the counters, the
    per-sequence KV lengths ``mSeqlensK`` (int32, (batch,))."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, l2_heads: Int32, mOut: cute.Tensor, mLSEout: cute.Tensor,
                 mCount: cute.Tensor, mSeqlensK: cute.Tensor, stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale_log2, l2_heads, (), stream, merge=(mOut, mLSEout, mCount),
                    lengths=(mSeqlensK,))


class FlashAttention3Sm90FusedMergeLeftpadK(FlashAttention3Sm90FusedMerge):
    """``FlashAttention3Sm90FusedMerge`` with ``Sm90Config.leftpad_k``: ``__call__`` takes, after the counters,
    ``mSeqlensK`` and ``mLeftpadK`` (int32, (batch,) each), as ``FlashAttention3Sm90LeftpadK``."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, l2_heads: Int32, mOut: cute.Tensor, mLSEout: cute.Tensor,
                 mCount: cute.Tensor, mSeqlensK: cute.Tensor, mLeftpadK: cute.Tensor, stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale_log2, l2_heads, (), stream, merge=(mOut, mLSEout, mCount),
                    lengths=(mSeqlensK, mLeftpadK))


class FlashAttention3Sm90FusedMergeWindows(FlashAttention3Sm90FusedMerge):
    """``FlashAttention3Sm90FusedMerge`` with ``Sm90Config.seqlens_q``: ``__call__`` takes, after the counters,
    ``mSeqlensK``, ``mLeftpadK`` and ``mSeqlensQ`` (int32, (batch,) each), as ``FlashAttention3Sm90Windows``."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, l2_heads: Int32, mOut: cute.Tensor, mLSEout: cute.Tensor,
                 mCount: cute.Tensor, mSeqlensK: cute.Tensor, mLeftpadK: cute.Tensor, mSeqlensQ: cute.Tensor,
                 stream: cuda.CUstream):
        self.launch(mQ, mK, mV, mO, mLSE, softmax_scale_log2, l2_heads, (), stream, merge=(mOut, mLSEout, mCount),
                    lengths=(mSeqlensK, mLeftpadK, mSeqlensQ))
