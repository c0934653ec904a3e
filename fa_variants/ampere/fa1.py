"""FlashAttention (the first one) forward for Ampere (sm80; runs on sm86/89/90 too): `FlashAttention1Sm80`.

The algorithm is Dao, Fu, Ermon, Rudra, Re 2022, "FlashAttention: Fast and Memory-Efficient Exact
Attention with IO-Awareness", Algorithm 1, written with the CuTe DSL on the *same* tensor-core building
blocks as our FA2 kernel (fa_variants/common/sm80.py: swizzled shared memory, cp.async, ldmatrix,
mma.sync m16n8k16 with fp32 accumulation, P kept in registers; common/softmax.py: the online max and
exp2 with the scale folded into log2 e, resumed from the saved m and l at every step; common/mask.py:
the tile ranges and the bottom-right causal and sequence-end masks), so that an FA1 vs FA2 comparison isolates the algorithm:

* One CTA per (batch, head) (a 1-D grid of batch x num_heads CTAs). The **outer** loop runs over the
  K/V tiles j (Algorithm 1 line 5), the **inner** loop over the Q tiles i (line 7).
* O, l and m live in HBM between steps: fp32 workspace tensors allocated by `run` (O: (B, H, Tr*Br, D);
  l, m: (B, H, Tr*Br), padded to whole Q tiles so workspace accesses need no predicates), initialised
  by the kernel itself to 0, 0, -inf (line 2). At every (i, j) step the Q tile, the O tile and its l
  and m are read from global memory (line 8) and written back (lines 12-13), and O is kept normalised
  at every step: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j).
  m is kept as the max of the raw (unscaled) scores; P is computed directly relative to m_new
  (exp(S - m_new) = e^(m~ - m_new) P~, the same product as lines 10-11), exactly as common/softmax.py does.
  P enters the MMA in fp16/bf16 unnormalised (its row max exactly 1) and diag(l_new)^-1 is applied to the
  fp32 sum after the product: rounding P / l_new instead adds a rounding to the largest weight of each row
  (scripts/fa1tol_model.py models both orders).
* The last step of a Q tile (j = the last K/V tile it sees) writes its O straight into the output
  (converted to fp16/bf16) and LSE = m + log l instead of O, l, m: the same values Algorithm 1 would
  leave in HBM, without a separate conversion pass over the workspace.
* Causal is bottom-right aligned (query i sees key j iff j <= i + seqlen_k - seqlen_q): the pairs
  (i, j) wholly above the diagonal are skipped (for K/V tile j the inner loop starts at the first Q
  tile that sees it), only the pairs crossing the diagonal are masked; a row that sees no key gets
  O = 0 and LSE = -inf (a Q tile that sees no key at all is written so in the initialisation pass).
* Any seqlen_q, seqlen_k >= 1: Q and K/V tail rows are predicated on load (never read out of bounds)
  and zero-filled in shared memory; keys past seqlen_k are masked; rows past seqlen_q are computed on
  zeros in the padded workspace and never written to the output. GQA / MQA: query head h reads KV
  head h // (num_heads // num_heads_kv). Any strides with a unit last dimension (16-byte aligned).

Memory ordering. The O/l/m tile written at step (i, j) is read again at step (i, j') for the next
K/V tile j' that tile i sees (the very next step when there is one Q tile). Every thread reads back
only what it wrote itself: O in the MMA accumulator partition (each thread loads and stores the same
fp32 pairs), l and m by the first lane of each quad (the lane that writes them), which then broadcasts
them to the quad with a shuffle. Program order of one thread makes its own writes visible to its later
reads; the __syncthreads ending every step is not needed for this, only for the shared-memory buffers.

Pipelining (the same building blocks, not an FA2 trick): Q is double-buffered in shared memory (the
next step's Q tile is loaded with cp.async while the current step computes); K/V double-buffered where
shared memory allows (K_{j+1}, V_{j+1} load during the first step of tile j); the next step's O, l, m
loads (its line 8) are issued at the end of the current step, before the __syncthreads, so the
compiler cannot sink them past the next step's S = Q K^T: they are in flight while it runs.

The module's ``VARIANT`` record (`common.launch.Variant`) registers it; ``run`` launches it.
Written from the FlashAttention paper (Algorithm 1, section 3.1; the FlashAttention-2 paper, section 3.2,
recalls that FA1 ran one thread block per (batch, head)) on the building blocks of our FA2 kernel (see
fa2.py for what those are adapted from).
"""
from __future__ import annotations

import dataclasses
from collections import namedtuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, const_expr

from fa_variants.common import interop, sm80
from fa_variants.common.cache import StaticConfig
from fa_variants.common.config import Sm80Config, smem_capacity
from fa_variants.common.launch import SM80_CODE_ARCHS, Variant
from fa_variants.common.layout import acc_as_operand_a, rows_cols, transpose_view
from fa_variants.common.mask import AttentionMask, BlockInfo
from fa_variants.common.scale import LOG2_E
from fa_variants.common.softmax import OnlineSoftmax, log_sum_exp

HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 256)
DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
MAX_CTAS = 2**31 - 1  # one CTA per (batch, head), all on gridDim.x


def _bundle(**fields):
    """An immutable record of kernel values (a namedtuple). The DSL tracer threads the values of a
    mutable object (SimpleNamespace) across staged if/for regions by rebinding its attributes, which
    leaks region-local values out of their region; a tuple is rebound as a local name instead."""
    return namedtuple("Bundle", fields)(**fields)


class FlashAttention1Sm80:
    """One compiled FA1 forward kernel for a static configuration (dtype, head_dim, causal, tiles).

    `__call__(mQ, mK, mV, mO, mLSE, mOacc, mL, mM, softmax_scale, stream)` is the host side (layouts,
    grid, launch); `kernel` is the device side, which reads top-down like Algorithm 1.
    mQ, mO (B, Nq, H, D) and mK, mV (B, Nk, Hkv, D) in dtype; mLSE (B, H, Nq) fp32; the HBM state of
    Algorithm 1: mOacc (B, H, Nq_pad, D), mL and mM (B, H, Nq_pad), fp32, Nq_pad = ceil(Nq / Br) Br.
    """

    def __init__(self, dtype, head_dim: int, causal: bool, tiles: Sm80Config):
        self.dtype = dtype
        self.head_dim = head_dim
        self.causal = causal
        self.Br, self.Bc, self.kv_stages, self.q_stages = tiles.tile_m, tiles.tile_n, tiles.stages, tiles.q_stages
        self.blocks = BlockInfo(tiles.tile_m, tiles.tile_n, causal)
        self.num_warps = tiles.warps
        self.num_threads = 32 * tiles.warps
        self.smem_bytes = 0  # set when traced

    # ------------------------------------------------------------------------------------------
    # host side
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, mOacc: cute.Tensor, mL: cute.Tensor, mM: cute.Tensor,
                 softmax_scale: Float32, stream: cuda.CUstream):
        D, Br, Bc = self.head_dim, self.Br, self.Bc
        sQ_layout = sm80.smem_layout(self.dtype, Br, D, self.q_stages)
        sKV_layout = sm80.smem_layout(self.dtype, Bc, D, self.kv_stages)

        SharedStorage = sm80.shared_storage(self.dtype, sQ_layout, sKV_layout)
        self.smem_bytes = SharedStorage.size_in_bytes()
        copy_g2s = sm80.gmem_tiled_copy(self.dtype, D, self.num_threads)
        mma = sm80.tiled_mma(self.dtype, self.num_warps)
        thr0 = mma.get_slice(0)  # per-thread register shapes (static, the same for every thread)
        self.shape_O, self.shape_S = thr0.partition_shape_C((Br, D)), thr0.partition_shape_C((Br, Bc))
        grid = (mQ.shape[2] * mQ.shape[0], 1, 1)  # one CTA per (batch, head), heads fastest
        self.kernel(mQ, mK, mV, mO, mLSE, mOacc, mL, mM, softmax_scale * LOG2_E, sQ_layout,
                    sKV_layout, copy_g2s, mma, SharedStorage).launch(
            grid=grid, block=[self.num_threads, 1, 1], smem=self.smem_bytes, stream=stream)

    # ------------------------------------------------------------------------------------------
    # device side
    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor, mOacc: cute.Tensor, mL: cute.Tensor, mM: cute.Tensor,
               scale_log2: Float32, sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout,
               copy_g2s: cute.TiledCopy, mma: cute.TiledMma, SharedStorage: cutlass.Constexpr):
        D, Br, Bc = self.head_dim, self.Br, self.Bc
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        head, batch = bid % mQ.shape[2], bid // mQ.shape[2]
        seqlen_q, seqlen_k = mQ.shape[1], mK.shape[1]
        head_kv = head // (mQ.shape[2] // mK.shape[2])  # GQA / MQA
        Tr, Tc = cute.ceil_div(seqlen_q, Br), cute.ceil_div(seqlen_k, Bc)

        # This CTA's (batch, head): all its Q tiles (Br, D, Tr), K/V tiles (Bc, D, Tc), output tiles,
        # and its slice of the HBM state O (Br, D, Tr) and l, m (Nq_pad,), fp32.
        gQ = cute.local_tile(mQ[batch, None, head, None], (Br, D), (None, 0))
        gK = cute.local_tile(mK[batch, None, head_kv, None], (Bc, D), (None, 0))
        gV = cute.local_tile(mV[batch, None, head_kv, None], (Bc, D), (None, 0))
        gO = cute.local_tile(mO[batch, None, head, None], (Br, D), (None, 0))
        gOacc = cute.local_tile(mOacc[batch, head, None, None], (Br, D), (None, 0))

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)    # (Br, D, 2): this step's Q tile and the next one's
        sK = storage.sK.get_tensor(sKV_layout)   # (Bc, D, kv_stages)
        sV = storage.sV.get_tensor(sKV_layout)
        sVt = transpose_view(sV)            # (D, Bc, kv_stages): V^T for O += P V

        # this thread's partitions: its cp.async loads and its MMA fragments and views of the HBM state
        ld = self.load_partitions(copy_g2s, tidx, gQ, gK, gV, sQ, sK, sV, seqlen_q, seqlen_k)
        mm = self.mma_partitions(mma, tidx, sQ, sK, sVt, gO, gOacc, mL, mM, mLSE, batch, head, scale_log2,
                                 seqlen_q, seqlen_k)

        # Line 2: O = 0, l = 0, m = -inf in HBM. A Q tile that sees no key at all (causal with
        # seqlen_q > seqlen_k) is never visited: its output is written now (O = 0, LSE = -inf).
        for i in cutlass.range(Tr, unroll=1):
            if self.blocks.kv_tile_end(i, seqlen_q, seqlen_k) > 0:
                self.init_state(mm, i)
            else:
                self.write_empty_output(mm, i)

        # Registers of the step's HBM state (O_i, l_i, m_i: line 8), loaded one step ahead
        acc_O = cute.make_rmem_tensor(self.shape_O, Float32)
        num_rows = cute.size(mm.tScS, mode=[0])
        l_old = cute.make_rmem_tensor(num_rows, Float32)
        m_old = cute.make_rmem_tensor(num_rows, Float32)

        # Prologue: K_0, V_0 (line 6 of the first outer iteration); Q, O, l, m of the first step
        n_j = self.blocks.kv_tile_end(Tr - 1, seqlen_q, seqlen_k)
        i_first = self.blocks.q_tile_start(0, seqlen_q, seqlen_k)
        self.load_kv(ld, 0, 0)
        self.load_q(ld, i_first, 0)
        cute.arch.cp_async_commit_group()
        self.load_state(mm, acc_O, l_old, m_old, i_first)
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()

        # Lines 5-13: every (i, j) step, K/V tiles outer, Q tiles inner
        self.sweep(ld, mm, acc_O, l_old, m_old, n_j, Tr, Tc)

    # ------------------------------------------------------------------------------------------
    # Algorithm 1 lines 5-13: the outer loop over K/V tiles, the inner one over the Q tiles that see them
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def sweep(self, ld: tuple, mm: tuple, acc_O: cute.Tensor, l_old: cute.Tensor, m_old: cute.Tensor, n_j: Int32,
              Tr: Int32, Tc: Int32):
        """Every (i, j) step in order, K/V tile j outer (line 5), Q tile i inner (line 7); on entry K_0, V_0 and the
        first step's Q tile have landed and its O, l, m are in flight into acc_O, l_old, m_old. Each step loads
        the next step's Q tile (and, with two K/V stages, the next K/V tile) while it computes."""
        step_count = Int32(0)  # (i, j) steps done: the Q buffer of the current step is its parity
        for j in cutlass.range(n_j, unroll=1):  # line 5: the outer loop over K/V tiles
            kv_stage = j % self.kv_stages
            if const_expr(self.kv_stages == 2):  # K_{j+1}, V_{j+1} into the other buffer
                if j + 1 < n_j:
                    self.load_kv(ld, j + 1, 1 - kv_stage)
            i_start = self.blocks.q_tile_start(j, mm.seqlen_q, mm.seqlen_k)
            i_unmasked = self.blocks.q_tile_unmasked_start(j, mm.seqlen_q, mm.seqlen_k)
            is_tail = j == Tc - 1  # the only K/V tile that can pass seqlen_k
            for i in cutlass.range(i_start, Tr, unroll=1):  # line 7: the inner loop over Q tiles
                q_stage = step_count % 2
                # the next (i, j) step: the next Q tile, or the first one of the next K/V tile
                i_next = i + 1
                has_next = i_next < Tr
                if not has_next:
                    i_next = self.blocks.q_tile_start(j + 1, mm.seqlen_q, mm.seqlen_k)
                    has_next = j + 1 < n_j
                if has_next:  # its Q tile into the other buffer, while this step computes
                    self.load_q(ld, i_next, 1 - q_stage)
                cute.arch.cp_async_commit_group()

                is_last = j == self.blocks.kv_tile_end(i, mm.seqlen_q, mm.seqlen_k) - 1
                masked = i < i_unmasked  # always False when not causal
                self.masked_step(mm, acc_O, l_old, m_old, i, j, q_stage, kv_stage, is_last, is_tail, masked)

                # line 8 of the next step: read its O, l, m (this thread's own earlier writes)
                if has_next:
                    self.load_state(mm, acc_O, l_old, m_old, i_next)
                # the next Q tile (and K/V tile) have landed; everyone is done with this Q buffer
                cute.arch.cp_async_wait_group(0)
                cute.arch.barrier()
                step_count += 1
            if const_expr(self.kv_stages == 1):  # line 6 of the next outer iteration
                if j + 1 < n_j:
                    self.load_kv(ld, j + 1, 0)
                    cute.arch.cp_async_commit_group()
                    cute.arch.cp_async_wait_group(0)
                    cute.arch.barrier()

    @cute.jit
    def masked_step(self, mm: tuple, acc_O: cute.Tensor, l_old: cute.Tensor, m_old: cute.Tensor, i: Int32,
                    j: Int32, q_stage: Int32, kv_stage: Int32, is_last: cutlass.Boolean, is_tail: cutlass.Boolean,
                    masked: cutlass.Boolean):
        """`step` with its masks picked at run time: the sequence-end mask on the last K/V tile (is_tail), the
        causal one on a tile crossing the diagonal (masked); one compiled `step` per combination."""
        if is_tail:
            if masked:
                self.step(mm, acc_O, l_old, m_old, i, j, q_stage, kv_stage, is_last, True, self.causal)
            else:
                self.step(mm, acc_O, l_old, m_old, i, j, q_stage, kv_stage, is_last, True, False)
        else:
            if masked:
                self.step(mm, acc_O, l_old, m_old, i, j, q_stage, kv_stage, is_last, False, self.causal)
            else:
                self.step(mm, acc_O, l_old, m_old, i, j, q_stage, kv_stage, is_last, False, False)

    # ------------------------------------------------------------------------------------------
    # one (i, j) step: Algorithm 1 lines 9-13 (line 8's reads are already in flight)
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def step(self, mm: tuple, acc_O: cute.Tensor, l_old: cute.Tensor, m_old: cute.Tensor, i: Int32,
             j: Int32, q_stage: Int32, kv_stage: Int32, is_last: cutlass.Boolean,
             mask_seqlen: cutlass.Constexpr[bool], mask_causal: cutlass.Constexpr[bool]):
        """Q tile i (in shared memory, buffer q_stage) against K/V tile j (buffer kv_stage); acc_O,
        l_old, m_old hold (or are receiving) O_i, l_i, m_i as read from HBM by `load_state`."""
        Br, Bc = self.Br, self.Bc
        # line 9: S_ij = Q_i K_j^T (fp32), masked (-inf) where causal or past seqlen_k
        acc_S = cute.make_rmem_tensor(self.shape_S, Float32)
        acc_S.fill(0.0)
        sm80.gemm_ss(mm.mma, acc_S, mm.tSrQ, mm.tSrK, mm.tSsQ[None, None, None, q_stage],
                     mm.tSsK[None, None, None, kv_stage], mm.s2r_Q, mm.s2r_K)
        S = rows_cols(acc_S)
        if const_expr(mask_seqlen or mask_causal):
            mm.mask.apply(S, mm.tScS, mm.t0ScS, i * Br, j * Bc, mask_seqlen, mask_causal)

        # the row state m_i, l_i, broadcast from the quad's leader lane (which read it)
        O = rows_cols(acc_O)
        num_rows = cute.size(O, mode=[0])
        m_i = cute.make_rmem_tensor(num_rows, Float32)
        l_i = cute.make_rmem_tensor(num_rows, Float32)
        for r in cutlass.range_constexpr(num_rows):
            l_i[r] = cute.arch.shuffle_sync(l_old[r], mm.leader_lane)
            m_i[r] = cute.arch.shuffle_sync(m_old[r], mm.leader_lane)
        softmax = OnlineSoftmax(num_rows, mm.scale_log2)
        softmax.resume(m_i, l_i)

        # lines 10-11: m_new = max(m_i, rowmax S); P = exp(S - m_new) (= e^(m~ - m_new) P~);
        # l_new = e^(m_i - m_new) l_i + rowsum P
        alpha = softmax.update(S, is_first=False)
        l_new = softmax.resumed_sum(alpha)
        m_new = softmax.row_max
        # line 13 for l and m: final now, so written back before the P V product (LSE = m + log l instead on the
        # last K/V tile this Q tile sees); writing them here also finishes rowsum P before the product, so the
        # fp32 P (Br x Bc) is dead once rounded, not kept live across it (at head_dim 256 that spilled)
        self.write_row_state(mm, l_new, m_new, i, is_last)

        # line 12: O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + P V_j), in that order: P = exp(S - m_new)
        # is rounded to fp16/bf16 unnormalised (its row max exactly 1, as in fa2) and the division comes after
        # the product, in fp32 (P / l_new rounded to 16 bits carried ~1.4x fa2's error: scripts/fa1tol_model.py)
        for r in cutlass.range_constexpr(num_rows):
            o_scale = l_i[r] * alpha[r]
            for c in cutlass.range_constexpr(cute.size(O, mode=[1])):
                O[r, c] = O[r, c] * o_scale
        rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        sm80.gemm_rs(mm.mma, acc_O, acc_as_operand_a(rP), mm.tOrVt,
                     mm.tOsVt[None, None, None, kv_stage], mm.s2r_V)
        for r in cutlass.range_constexpr(num_rows):
            inv_l = 0.0 if l_new[r] == 0.0 else cute.arch.rcp_approx(l_new[r])
            for c in cutlass.range_constexpr(cute.size(O, mode=[1])):
                O[r, c] = O[r, c] * inv_l

        # line 12's O_i back to HBM; after the last K/V tile this Q tile sees, the output instead (what
        # Algorithm 1 leaves in HBM, finished)
        if is_last:
            self.write_output(mm, acc_O, i)
        else:
            cute.autovec_copy(acc_O, mm.tOgOacc[None, None, None, i])

    # ------------------------------------------------------------------------------------------
    # partitions (plain Python, run while the kernel is traced: no staged control flow)
    # ------------------------------------------------------------------------------------------
    def load_partitions(self, copy_g2s: cute.TiledCopy, tidx: Int32, gQ: cute.Tensor, gK: cute.Tensor,
                        gV: cute.Tensor, sQ: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor, seqlen_q: Int32,
                        seqlen_k: Int32) -> tuple:
        """This thread's global -> shared (cp.async) partitions of the Q, K, V tiles, with coordinates for the
        row predicates (`load_q`, `load_kv`)."""
        Br, Bc, D = self.Br, self.Bc, self.head_dim
        g2s = copy_g2s.get_slice(tidx)
        return _bundle(
            copy=copy_g2s, tQgQ=g2s.partition_S(gQ), tQsQ=g2s.partition_D(sQ),
            tKgK=g2s.partition_S(gK), tKsK=g2s.partition_D(sK), tVgV=g2s.partition_S(gV),
            tVsV=g2s.partition_D(sV), tQc=g2s.partition_S(cute.make_identity_tensor((Br, D))),
            tKVc=g2s.partition_S(cute.make_identity_tensor((Bc, D))), seqlen_q=seqlen_q,
            seqlen_k=seqlen_k)

    def mma_partitions(self, mma: cute.TiledMma, tidx: Int32, sQ: cute.Tensor, sK: cute.Tensor, sVt: cute.Tensor,
                       gO: cute.Tensor, gOacc: cute.Tensor, mL: cute.Tensor, mM: cute.Tensor, mLSE: cute.Tensor,
                       batch: Int32, head: Int32, scale_log2: Float32, seqlen_q: Int32, seqlen_k: Int32) -> tuple:
        """This thread's MMA partitions: register fragments, ldmatrix views of shared memory, and its view of the
        HBM state (the accumulator layout: each thread reads back exactly what it wrote), for `step` and the
        loads and stores below."""
        Br, Bc, D = self.Br, self.Bc, self.head_dim
        thr_mma, thr0 = mma.get_slice(tidx), mma.get_slice(0)  # thread 0's: static shapes and coords
        s2r_Q = sm80.ldmatrix_copy_A(self.dtype, mma).get_slice(tidx)
        s2r_K = sm80.ldmatrix_copy_B(self.dtype, mma).get_slice(tidx)
        s2r_V = sm80.ldmatrix_copy_B(self.dtype, mma, transpose=True).get_slice(tidx)
        cS = cute.make_identity_tensor((Br, Bc))
        tScS = rows_cols(thr_mma.partition_C(cS))
        return _bundle(
            mma=mma, tSrQ=thr_mma.make_fragment_A(thr_mma.partition_A(sQ[None, None, 0])),
            tSrK=thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0])),
            tOrVt=thr_mma.make_fragment_B(thr_mma.partition_B(sVt[None, None, 0])),
            s2r_Q=s2r_Q, s2r_K=s2r_K, s2r_V=s2r_V, tSsQ=s2r_Q.partition_S(sQ),
            tSsK=s2r_K.partition_S(sK), tOsVt=s2r_V.partition_S(sVt),
            tOgOacc=thr_mma.partition_C(gOacc), tOgO=thr_mma.partition_C(gO),
            tOcO=rows_cols(thr_mma.partition_C(cute.make_identity_tensor((Br, D)))),
            tScS=tScS, t0ScS=rows_cols(thr0.partition_C(cS)),
            quad_leader=tScS[0][1] == 0, leader_lane=cute.arch.lane_idx() // 4 * 4,
            scale_log2=scale_log2, mL=mL[batch, head, None], mM=mM[batch, head, None],
            mLSE=mLSE[batch, head, None], seqlen_q=seqlen_q, seqlen_k=seqlen_k,
            mask=AttentionMask(seqlen_q, seqlen_k, select=False))

    # ------------------------------------------------------------------------------------------
    # loads and stores
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def load_q(self, ld: tuple, i: Int32, stage: Int32):
        """cp.async Q tile i into a buffer; rows past seqlen_q are not read, zero-filled."""
        sm80.copy_rows(ld.copy, ld.tQgQ[None, None, None, i], ld.tQsQ[None, None, None, stage], ld.tQc,
                       ld.seqlen_q - i * self.Br, check_rows=True, zero_fill=True)

    @cute.jit
    def load_kv(self, ld: tuple, j: Int32, stage: Int32):
        """cp.async K and V tile j into a buffer; rows past seqlen_k are not read, zero-filled."""
        valid = ld.seqlen_k - j * self.Bc
        sm80.copy_rows(ld.copy, ld.tKgK[None, None, None, j], ld.tKsK[None, None, None, stage], ld.tKVc,
                       valid, check_rows=True, zero_fill=True)
        sm80.copy_rows(ld.copy, ld.tVgV[None, None, None, j], ld.tVsV[None, None, None, stage], ld.tKVc,
                       valid, check_rows=True, zero_fill=True)

    @cute.jit
    def load_state(self, mm: tuple, acc_O: cute.Tensor, l_old: cute.Tensor, m_old: cute.Tensor,
                   i: Int32):
        """Algorithm 1 line 8 (but Q) for Q tile i: O_i (fp32 pairs, the accumulator partition) into
        acc_O; l_i, m_i of this thread's rows into l_old, m_old by the quad's leader lane only (the lane
        that writes them; `step` broadcasts them to the quad). Loads only: nothing waits here."""
        cute.autovec_copy(mm.tOgOacc[None, None, None, i], acc_O)
        if mm.quad_leader:
            for r in cutlass.range_constexpr(cute.size(l_old)):
                row = i * self.Br + mm.tScS[r, 0][0]
                l_old[r] = mm.mL[row]
                m_old[r] = mm.mM[row]

    @cute.jit
    def write_row_state(self, mm: tuple, l_new: cute.Tensor, m_new: cute.Tensor, i: Int32, is_last: cutlass.Boolean):
        """Algorithm 1 line 13 for l and m of Q tile i (by the quad's leader lane, which reads them back): l_new,
        m_new into HBM, or on the last K/V tile the tile sees LSE = m + log l (-inf for a row with no key) for
        rows < seqlen_q."""
        if mm.quad_leader:
            for r in cutlass.range_constexpr(cute.size(l_new)):
                row = i * self.Br + mm.tScS[r, 0][0]
                if is_last:
                    if row < mm.seqlen_q:
                        mm.mLSE[row] = log_sum_exp(m_new[r], mm.scale_log2, l_new[r], l_new[r] == 0.0)
                else:
                    mm.mL[row] = l_new[r]
                    mm.mM[row] = m_new[r]

    @cute.jit
    def init_state(self, mm: tuple, i: Int32):
        """Algorithm 1 line 2 for Q tile i: O_i = 0, l_i = 0, m_i = -inf in HBM (the same threads and
        partition that will read them back)."""
        zeros = cute.make_rmem_tensor(self.shape_O, Float32)
        zeros.fill(0.0)
        cute.autovec_copy(zeros, mm.tOgOacc[None, None, None, i])
        if mm.quad_leader:
            for r in cutlass.range_constexpr(cute.size(mm.tOcO, mode=[0])):
                row = i * self.Br + mm.tOcO[r, 0][0]
                mm.mL[row] = 0.0
                mm.mM[row] = -Float32.inf

    @cute.jit
    def write_output(self, mm: tuple, acc_O: cute.Tensor, i: Int32):
        """O tile i (fp32 registers) -> dtype -> the output, rows < seqlen_q only."""
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        rO_rows = rows_cols(rO)
        gO_rows = rows_cols(mm.tOgO[None, None, None, i])
        for r in cutlass.range_constexpr(cute.size(rO_rows, mode=[0])):
            if i * self.Br + mm.tOcO[r, 0][0] < mm.seqlen_q:
                cute.autovec_copy(rO_rows[r, None], gO_rows[r, None])

    @cute.jit
    def write_empty_output(self, mm: tuple, i: Int32):
        """A Q tile no row of which sees a key: O = 0, LSE = -inf."""
        zeros = cute.make_rmem_tensor(self.shape_O, Float32)
        zeros.fill(0.0)
        self.write_output(mm, zeros, i)
        if mm.quad_leader:
            for r in cutlass.range_constexpr(cute.size(mm.tOcO, mode=[0])):
                row = i * self.Br + mm.tOcO[r, 0][0]
                if row < mm.seqlen_q:
                    mm.mLSE[row] = -Float32.inf


# ----------------------------------------------------------------------------------------------
# registration and the backend contract
# ----------------------------------------------------------------------------------------------
def fake_args(dtype: str, head_dim: int, align: int = interop.DEFAULT_ALIGN):
    """Fake arguments of the FA1 signature (compile time): the standard (q, k, v, out, lse) of
    `interop.fake_attention_args` plus the fp32 HBM state o_acc (B, H, Nq_pad, D), l, m (B, H, Nq_pad),
    then softmax_scale and the TVM-FFI environment stream. Batch, sequence lengths, heads and strides
    are symbolic (shared where tensors must agree)."""
    from cutlass.cute.runtime import make_fake_stream

    b, nq, nk, h, hkv, nq_pad = (cute.sym_int() for _ in range(6))
    q = interop.fake_tensor(dtype, (b, nq, h, head_dim), align)
    k = interop.fake_tensor(dtype, (b, nk, hkv, head_dim), align)
    v = interop.fake_tensor(dtype, (b, nk, hkv, head_dim), align)
    o = interop.fake_tensor(dtype, (b, nq, h, head_dim), align)
    lse = interop.fake_tensor("fp32", (b, h, nq), 4)
    o_acc = interop.fake_tensor("fp32", (b, h, nq_pad, head_dim), align)
    l = interop.fake_tensor("fp32", (b, h, nq_pad), 4)
    m = interop.fake_tensor("fp32", (b, h, nq_pad), 4)
    return (q, k, v, o, lse, o_acc, l, m, cutlass.Float32(1.0),
            make_fake_stream(use_tvm_ffi_env_stream=True))


# Tile table. Per (i, j) step FA1 moves tile_m x D of Q (dtype) and 2 x tile_m x D of O (fp32) through HBM
# for 4 tile_m tile_n D flops, an arithmetic intensity of ~0.4 tile_n flop/byte whatever tile_m is, so FA1
# wants tile_n large and tile_m may be small (the paper takes Bc = M / 4d >= Br = min(Bc, d), Algorithm 1
# line 1). With 4 warps and mma.sync the registers hold tile_m x tile_n (S) + tile_m x D (O) fp32 values over
# 128 threads, so 64 x 128 at D = 64 / 96 / 128 (128 x 128 at D = 64 spills a few bytes), and 64 x 64 (FA2's
# tile) at D = 256, where K/V are single-buffered to fit shared memory (as compiled for sm80 / sm90a, 8 bytes a
# thread spill there when causal, none otherwise). Q is double-buffered (q_stages = 2: the next step's Q tile is prefetched).
CONFIGS = {64: Sm80Config(64, 128, 4, 2, 2), 96: Sm80Config(64, 128, 4, 2, 2),
           128: Sm80Config(64, 128, 4, 2, 2), 256: Sm80Config(64, 64, 4, 1, 2)}


def default_config(arch: str, head_dim: int, causal: bool = False) -> Sm80Config:
    """The FA1 tile configuration for an arch and head_dim (ValueError if head_dim is unsupported). On parts
    with less shared memory (sm86/89/120: 99 KiB) K/V drop to one buffer, then tile_n halves, until it fits."""
    if head_dim not in CONFIGS:
        raise ValueError(f"fa1: head_dim {head_dim} has no tile configuration; supported: {HEAD_DIMS}")
    config = CONFIGS[head_dim]
    while config.smem_bytes(head_dim) > smem_capacity(arch) and (config.stages > 1 or config.tile_n > 32):
        config = dataclasses.replace(config, stages=1) if config.stages > 1 else dataclasses.replace(
            config, tile_n=config.tile_n // 2)
    return config.check(arch, head_dim)


def _check_config(config: Sm80Config, arch: str, head_dim: int) -> Sm80Config:
    if config.q_stages != 2:
        raise ValueError(f"fa1: {config}: the Q prefetch is written for q_stages=2")
    if config.num_splits != 1 or config.pack_gqa or config.seqlens_k:
        raise ValueError(f"fa1: {config}: split-KV (num_splits != 1), pack_gqa and seqlens_k are fa2 / fa3 features")
    return config.check(arch, head_dim)


def _build(cfg: StaticConfig):
    kernel = FlashAttention1Sm80(interop.cute_dtype(cfg.dtype), cfg.head_dim, cfg.causal, cfg.config)
    return kernel, fake_args(cfg.dtype, cfg.head_dim, cfg.align)


def _check_problem(config: Sm80Config, q: torch.Tensor, k: torch.Tensor) -> None:
    if q.shape[0] * q.shape[2] > MAX_CTAS:
        raise ValueError(f"fa1: batch x num_heads ({q.shape[0]} x {q.shape[2]}) must be <= 2^31 - 1 (one CTA each)")


def _prepare(config: Sm80Config, q, k, v, out, lse, scale: float) -> tuple:
    """Runtime arguments: the standard ones plus the fp32 HBM state of Algorithm 1, O (B, H, Nq_pad, D),
    l and m (B, H, Nq_pad), Nq_pad = ceil(Nq / tile_m) tile_m (allocated per call)."""
    b, nq, h, d = q.shape
    nq_pad = -(-nq // config.tile_m) * config.tile_m
    o_acc = torch.empty((b, h, nq_pad, d), dtype=torch.float32, device=q.device)
    l = torch.empty((b, h, nq_pad), dtype=torch.float32, device=q.device)
    m = torch.empty((b, h, nq_pad), dtype=torch.float32, device=q.device)
    return q, k, v, out, lse, o_acc, l, m, scale


VARIANT = Variant(
    "fa1", archs=SM80_CODE_ARCHS, dtypes=DTYPES, head_dims=HEAD_DIMS,
    default_config=default_config, check_config=_check_config, build=_build, prepare=_prepare,
    check_problem=_check_problem)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float,
        config: Sm80Config | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FA1 forward on CUDA tensors (`common.launch.launch`).

    Args: q (B, Nq, H, D), k and v (B, Nk, Hkv, D), fp16 or bf16, H % Hkv == 0, D in HEAD_DIMS,
    last-dimension stride 1 (other strides anything; inputs not 16-byte aligned are copied);
    softmax_scale any finite real; `config` overrides the tile table (ablations; checked against the arch).
    Allocates the fp32 HBM state of Algorithm 1 (O: B*H*ceil(Nq/tile_m)*tile_m*D*4 bytes, l and m) per call.
    Returns (out (B, Nq, H, D) like q, lse float32 (B, H, Nq), natural log).
    Raises ValueError for a shape it cannot serve (head_dim, dtype, batch x heads >= 2^31, scale).
    """
    return VARIANT.run(q, k, v, causal=causal, softmax_scale=softmax_scale, config=config)
