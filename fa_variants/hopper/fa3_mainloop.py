"""The consumer warpgroup's mainloop steps of the fa3 kernel family, ``_StepContext``: one K/V tile's
S = Q K^T GEMM, masking, online softmax, O rescale and P V GEMM, in the three schedules of
``hopper.fa3_kernel.FlashAttention3Sm90.consumer``: serial steps with inter-warpgroup ping-pong (FA3 paper,
section 3.1: warpgroup w waits on its own named barrier, then hands the turn to w + 1), the intra-warpgroup
overlap of the softmax of tile j with the P V GEMM of tile j + 1 (section 3.2, Algorithm 2), and its deferred
form (``Sm90Config.rescale_o_before_pv``). ``hopper.fa3_fp8_kernel._Fp8StepContext`` overrides the hooks (how S becomes
P, how a tile's P V reaches O). Adapted from Dao-AILab/flash-attention:
flash_attn/cute/flash_fwd_sm90.py::FlashAttentionForwardSm90 (mma_one_n_block_intrawg_overlap).
"""
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from fa_variants.common.layout import acc_as_operand_a
from fa_variants.common.layout import rows_cols as acc_rows_cols
from fa_variants.common.mask import AttentionMask
from fa_variants.common.sm90 import WARPGROUP_THREADS, NamedBarrier, wgmma
from fa_variants.common.softmax import OnlineSoftmax


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
    sV: cute.Tensor = None  # V's ring in shared memory, (tile_n, head_dim, stage): seqlens_k's clear_v_past_length

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
        if const_expr(self.k.cfg.seqlens_k):
            self.clear_v_past_length(v_state, n_block)
        early = const_expr(self.k.cfg.early_pv_arrive)
        wgmma(self.mma_pv, self.acc_O, self.tOrP, self.tOrV[None, None, None, v_state.index],
              wait=-1 if early else wait, accumulate=accumulate)
        if const_expr(early):
            self.pv_issued(wait)

    @cute.jit
    def clear_v_past_length(self, v_state, n_block):
        """``Sm90Config.seqlens_k``: before the P V GEMM of the tile holding the sequence's last key, zero its V rows
        at or past the length in shared memory. Their P is 0, but a KV cache past a sequence's length holds whatever
        was there (0 x NaN or inf = NaN in P V); K's are harmless (masked S is -inf). Only the one tile crossing the
        length (or tile 0 of an empty sequence) takes the branch. Each warpgroup clears every such row itself (the
        same zeros: another warpgroup's GEMM of the tile reads V or 0, never what was there), fences its writes to
        the tensor cores' proxy and syncs its own 128 threads before its GEMM is issued."""
        tile_n, d = self.k.tile_n, self.k.head_dim
        valid = cutlass.max(self.mask_s.seqlen_k - n_block * tile_n, 0)
        if valid < tile_n:
            sv = self.sV[None, None, v_state.index]
            t = cute.arch.thread_idx()[0] % WARPGROUP_THREADS
            for i in cutlass.range(t, (tile_n - valid) * d, WARPGROUP_THREADS, unroll=1):
                sv[valid + i // d, i % d] = sv.element_type(0)
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=int(NamedBarrier.CLEAR_V_WG0) + self.wg, number_of_threads=WARPGROUP_THREADS)

    def pv_issued(self, wait: int):
        """``early_pv_arrive``: called by ``pv`` once the last WGMMA group of the P V GEMM is committed: hand the
        ping-pong turn on, then wait until at most ``wait`` groups are in flight (-1: no wait)."""
        self.schedule_arrive()
        if const_expr(wait >= 0):
            warpgroup.wait_group(wait)

    def hoists_huge_check(self) -> bool:
        """Whether the consumer picks its K/V loop by ``huge_possible`` (fa3-fp8's ``huge_hoisted``); not here."""
        return False

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
