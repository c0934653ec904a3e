"""Which work tile a CTA of the fa3 kernel family runs, and which K/V tiles and query rows it covers: the mixin
``Fa3Schedule`` of ``hopper.fa3_kernel.FlashAttention3Sm90``. One CTA per (query tile, head, batch), causal tiles
longest first within L2 sections (``common.tile_scheduler``); the K/V tile range of a query tile (causal: up to
the diagonal, FA3 paper Algorithm 1's loop bounds); ``q_tail_first`` row offsets; and the persistent grid
(``Sm90Config.persistent``: ``_roles_persistent``, the producer and consumers walking a static schedule with their
pipeline states carried from tile to tile). Adapted from Dao-AILab/flash-attention:
flash_attn/cute/flash_fwd_sm90.py::FlashAttentionForwardSm90 and flash_attn/cute/tile_scheduler.py.
"""
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, const_expr

from fa_variants.common import tile_scheduler
from fa_variants.common.sm90 import WARPGROUP_THREADS, NamedBarrier


class Fa3Schedule:
    """Tile coordinates, K/V tile ranges and the persistent roles of ``FlashAttention3Sm90`` (a mixin: reads the
    kernel's tile_m, tile_n, head_dim, causal, cfg, blocks, split, pack_group, stages, pingpong, producer_regs,
    consumer_regs and calls its producer / consumer)."""

    @cute.jit
    def _tile_coords(self, num_m_blocks: Int32, num_heads: Int32, batches: Int32, l2_heads: Int32):
        """(query tile, head, batch) of this CTA. Non-causal tiles cost the same: query tiles of one head
        run side by side (they share K/V in L2). Causal tiles differ in cost, so the order is longest
        first (LPT) within sections of ``l2_heads`` (batch, head) pairs whose K and V fit in L2
        together; the short tiles then fill the tail of the grid."""
        bid, _, _ = cute.arch.block_idx()
        return tile_scheduler.tile_coords(bid, num_m_blocks, num_heads, batches, l2_heads, self.causal)

    @cute.jit
    def _num_kv_blocks(self, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32, diag_q=None) -> Int32:
        """K/V tiles [0, n_blocks) that the Q tile m_block sees (``common.mask.kv_tile_end``: causal
        skips the tiles past the diagonal of its last row). A tile whose rows see no key still runs
        tile 0, all masked, which gives O = 0 and LSE = -inf without a special path. ``diag_q``: the query count
        the diagonal is aligned to (``common.mask.q_length``; None: seqlen_q)."""
        diag_q = seqlen_q if const_expr(diag_q is None) else diag_q
        if const_expr(self._tail_first()):
            return cutlass.max(self.blocks.kv_tile_end(m_block, diag_q, seqlen_k, self._q_start(m_block, seqlen_q)), 1)
        return cutlass.max(self.blocks.kv_tile_end(m_block, diag_q, seqlen_k), 1)

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

    def _seqlen_q(self, mQ: cute.Tensor):
        """Query positions of the problem: mode 0 of Q, or its second part when packed ((G, seqlen_q))."""
        return mQ.shape[0][1] if const_expr(self.pack_group) else mQ.shape[0]

    def _scheduled_tile(self, slot: Int32, stride: Int32, total: Int32, order: tuple, upcoming: Int32):
        """(work tile of slot ``slot`` of the persistent schedule, ``upcoming`` for the next slot). Static: the slot
        itself. ``Sm90Config.balanced`` (``order`` = (table,)): ``upcoming``, the tile read from table[slot] one slot
        earlier (so that the read's latency hides under the previous tile), and table[slot + stride] read now
        (clamped to the last entry past the end; start the loop with ``upcoming`` = table[first])."""
        if const_expr(len(order) > 0):
            return upcoming, order[0][cutlass.min(slot + stride, total - 1)]
        return slot, upcoming

    def _work_tile(self, slot: Int32, stride: Int32, total: Int32, order: tuple, upcoming: Int32,
                   num_m_blocks: Int32, heads: Int32, batches: Int32, l2_heads: Int32, seqlen_q: Int32,
                   seqlen_k: Int32):
        """(m_block, head, batch, n_blocks, upcoming) of slot ``slot`` of the persistent schedule: the work tile
        (``_scheduled_tile``), its coordinates (``common.tile_scheduler.tile_coords``) and its K/V tile count. The
        producer and the consumers walk the same slots and so the same tiles."""
        tile, upcoming = self._scheduled_tile(slot, stride, total, order, upcoming)
        m_block, head, batch = tile_scheduler.tile_coords(tile, num_m_blocks, heads, batches, l2_heads, self.causal)
        return m_block, head, batch, self._num_kv_blocks(m_block, seqlen_q, seqlen_k), upcoming

    def _first_scheduled(self, first: Int32, order: tuple) -> Int32:
        """The ``upcoming`` that ``_scheduled_tile`` starts from: table[first] (balanced), else first (unused)."""
        return order[0][first] if const_expr(len(order) > 0) else first

    def _tile(self, n_start, n):
        """Absolute K/V tile index of the n-th tile of this CTA's range (the range starts at 0 unless split)."""
        return n_start + n if const_expr(self.split) else n

    @cute.jit
    def _roles_persistent(self, mQ, mK, mV, mO, mLSE, sQ, sK, sV, sO, tma_q, tma_k, tma_v, tma_o, tiled_mma_qk,
                          tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2: Float32, qhead_per_kvhead: Int32,
                          extras: tuple, warp_idx: Int32, num_m_blocks: Int32, l2_heads: Int32, seqlen_q: Int32,
                          seqlen_k: Int32, order: tuple = ()):
        """``_roles`` of a persistent CTA (``Sm90Config.persistent``): the producer warp and the consumer
        warpgroups each walk this CTA's tiles of the static schedule (``common.tile_scheduler``) with their
        pipeline states carried from tile to tile (the Q, K and V mbarrier phases run on), so the producer's loads
        of the next tile wait only for free buffers, not for the previous tile's epilogue (but Q's, when O reuses
        Q's buffer). The ping-pong turn is handed to warpgroup 0 once: each tile ends with the last warpgroup's
        arrive on warpgroup 0's barrier, which is the next tile's first turn. ``order``: (the tile table,) of
        ``Sm90Config.balanced``: the i-th slot of the static schedule runs tile table[i] (``_scheduled_tile``, which
        reads each entry one tile ahead)."""
        heads, batches = mQ.shape[2], mQ.shape[3]
        first, stride = tile_scheduler.persistent_tiles()
        total = num_m_blocks * heads * batches
        if warp_idx < WARPGROUP_THREADS // 32:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
                k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                upcoming = self._first_scheduled(first, order)
                for slot in cutlass.range(first, total, stride, unroll=1):
                    m_block, head, batch, n_blocks, upcoming = self._work_tile(slot, stride, total, order, upcoming,
                                                                               num_m_blocks, heads, batches, l2_heads,
                                                                               seqlen_q, seqlen_k)
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
            upcoming = self._first_scheduled(first, order)
            for slot in cutlass.range(first, total, stride, unroll=1):
                m_block, head, batch, n_blocks, upcoming = self._work_tile(
                    slot, stride, total, order, upcoming, num_m_blocks, heads, batches, l2_heads, seqlen_q, seqlen_k)
                q_state, k_state, v_state = self.consumer(
                    mO[None, None, head, batch], mLSE[None, head, batch], sQ, sK, sV, sO, tma_o,
                    tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2,
                    m_block, n_blocks, seqlen_q, seqlen_k, extras, head, batch, 0,
                    states=(q_state, k_state, v_state))
