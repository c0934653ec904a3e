"""The producer warp of the fa3 kernel family (FA3 paper, section 3.1, warp specialisation; Algorithm 1's
producer side): the mixin ``Fa3Producer`` of ``hopper.fa3_kernel.FlashAttention3Sm90``. The Q, K and V mbarrier
pipelines (``PipelineTmaAsync``: the producer arms each buffer's mbarrier with its byte count, the consumer
warps release it), and the TMA loads: Q once, then K_j and V_j from the last K/V tile to the first, in the
order the consumers use them. Adapted from Dao-AILab/flash-attention:
flash_attn/cute/flash_fwd_sm90.py::FlashAttentionForwardSm90 (load).
"""
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32, const_expr
from cutlass.cute.nvgpu import cpasync


class Fa3Producer:
    """Pipelines and TMA loads of ``FlashAttention3Sm90`` (a mixin: reads the kernel's tile_m, tile_n, head_dim,
    stages, num_wg, cfg, overlap, bytes_q, bytes_kv and calls its ``_q_tile``, ``_v_tiles``, ``_tile``)."""

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
        Fa3Producer._issue(tma_atom, g_tiles, s_buffers, pipe, state, block)
        state.advance()
        return state
