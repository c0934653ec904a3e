"""FlashAttention-2 forward for Ampere (sm80; runs on sm86/89/90 too): `FlashAttention2Sm80`.

The algorithm is Dao 2023, "FlashAttention-2", Algorithm 1 (forward) with the work partitioning of
section 3.2, written with the CuTe DSL:

* Grid over (Q tiles, heads, batch): each CTA owns one Br x D tile of Q (the Q *outer* loop runs
  across CTAs, in parallel over the sequence) and streams the K/V tiles it needs (the inner loop).
* 4 warps split the Br rows of Q; K/V tiles are shared by all warps in shared memory, and each warp
  owns whole rows of S, P and O, so no cross-warp reduction is ever needed.
* Global -> shared with cp.async; K and V double-buffered so tile j+1 loads while tile j computes.
  Shared -> registers with ldmatrix; S = Q K^T and O += P V with mma.sync m16n8k16 (fp32 accumulate);
  P converted to fp16/bf16 in registers and fed straight back as the A operand.
* Online softmax with exp2 and the scale folded into log2(e); O rescaled by exp2(m_old - m_new);
  the division by l once at the end (deferred normalisation); LSE written (natural log).
* Causal is bottom-right aligned: K/V tiles wholly above the diagonal are never loaded; only the
  tiles crossing it are masked; a row that sees no key gets O = 0 and LSE = -inf. K/V tiles are
  visited from the last to the first, so the tiles that need masks (the diagonal ones, and the
  sequence-end tail) come first and the long unmasked run follows.
* Any seqlen_q, seqlen_k >= 1: tail rows are predicated (never read out of bounds), zero-filled in
  shared memory, masked in S, and never written. GQA / MQA: query head h reads KV head
  h // (num_heads // num_heads_kv). Any strides with a unit last dimension (16-byte aligned).

Kernel module contract (HELPERS.md): HEAD_DIMS, DTYPES, run(q, k, v, *, causal, softmax_scale).
Learnt from (never copied): NVIDIA CUTLASS ``examples/python/CuTeDSL/ampere/flash_attention_v2.py``
(single K/V stage, no LSE, top-left causal; this kernel double-buffers, writes the LSE, and aligns
causal bottom-right) and flash-attention ``flash_attn/cute/flash_fwd.py`` (Tri Dao et al.).
"""
from __future__ import annotations

from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, const_expr

from fa_variants.common import compile as cc
from fa_variants.common import interop, mask, sm80
from fa_variants.common.softmax import LOG2_E, OnlineSoftmax, positive_scale
from fa_variants.common.tiles import AttentionTiles, fa2_tiles

HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 256)
DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
MAX_GRID_YZ = 65535  # heads and batch ride on gridDim.y / gridDim.z


class FlashAttention2Sm80:
    """One compiled FA2 forward kernel for a static configuration (dtype, head_dim, causal, tiles).

    `__call__(mQ, mK, mV, mO, mLSE, softmax_scale, stream)` is the host side (layouts, grid, launch);
    `kernel` is the device side, which reads top-down like Algorithm 1.
    """

    def __init__(self, dtype, head_dim: int, causal: bool, tiles: AttentionTiles):
        self.dtype = dtype
        self.head_dim = head_dim
        self.causal = causal
        self.Br, self.Bc, self.stages = tiles.Br, tiles.Bc, tiles.stages
        self.num_warps = tiles.warps
        self.num_threads = 32 * tiles.warps
        assert self.stages == 2, "the K/V pipeline below is written for two stages"
        self.smem_bytes = 0  # set when traced

    # ------------------------------------------------------------------------------------------
    # host side
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, softmax_scale: Float32, stream: cuda.CUstream):
        D, Br, Bc = self.head_dim, self.Br, self.Bc
        sQ_layout = sm80.smem_layout(self.dtype, Br, D)
        sKV_layout = sm80.smem_layout(self.dtype, Bc, D, self.stages)

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]

        self.smem_bytes = SharedStorage.size_in_bytes()
        copy_g2s = sm80.gmem_tiled_copy(self.dtype, D, self.num_threads)
        copy_s2g = sm80.gmem_tiled_copy(self.dtype, D, self.num_threads, async_copy=False)
        mma = sm80.tiled_mma(self.dtype, self.num_warps)
        grid = (cute.ceil_div(mQ.shape[1], Br), mQ.shape[2], mQ.shape[0])
        self.kernel(mQ, mK, mV, mO, mLSE, softmax_scale * LOG2_E, sQ_layout, sKV_layout,
                    copy_g2s, copy_s2g, mma, SharedStorage).launch(
            grid=grid, block=[self.num_threads, 1, 1], smem=self.smem_bytes, stream=stream)

    # ------------------------------------------------------------------------------------------
    # device side
    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor, scale_log2: Float32, sQ_layout: cute.ComposedLayout,
               sKV_layout: cute.ComposedLayout, copy_g2s: cute.TiledCopy, copy_s2g: cute.TiledCopy,
               mma: cute.TiledMma, SharedStorage: cutlass.Constexpr):
        D, Br, Bc = self.head_dim, self.Br, self.Bc
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        if const_expr(self.causal):  # the longest rows first: better tail balance across SMs
            m_block = cute.arch.grid_dim()[0] - 1 - m_block
        seqlen_q, seqlen_k = mQ.shape[1], mK.shape[1]
        head_kv = head // (mQ.shape[2] // mK.shape[2])  # GQA / MQA

        # This CTA's Q tile (Br x D) and the K/V tiles (Bc x D x n) of its KV head.
        gQ = cute.local_tile(mQ[batch, None, head, None], (Br, D), (m_block, 0))
        gK = cute.local_tile(mK[batch, None, head_kv, None], (Bc, D), (None, 0))
        gV = cute.local_tile(mV[batch, None, head_kv, None], (Bc, D), (None, 0))

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sKV_layout)   # (Bc, D, stage)
        sV = storage.sV.get_tensor(sKV_layout)
        sVt = sm80.transpose_view(sV)            # (D, Bc, stage): V^T for O += P V

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
        O = sm80.rows_view(acc_O)
        softmax = OnlineSoftmax(cute.size(O, mode=[0]), scale_log2)
        softmax.reset()
        cS = cute.make_identity_tensor((Br, Bc))
        tScS = sm80.rows_view(thr_mma.partition_C(cS))
        t0ScS = sm80.rows_view(mma.get_slice(0).partition_C(cS))

        # K/V tiles this Q tile needs: n in [0, n_end), visited n_end-1 down to 0 (causal skipping)
        n_end = mask.kv_tile_end(m_block, Br, Bc, seqlen_q, seqlen_k, self.causal)
        n_causal = n_end  # tiles n >= n_causal cross the diagonal and need the causal mask;
        # only the last tile, ceil(seqlen_k / Bc) - 1, can pass seqlen_k, and if needed it comes first
        if const_expr(self.causal):
            n_causal = mask.kv_tile_causal_start(m_block, Br, Bc, seqlen_q, seqlen_k)

        kv = SimpleNamespace(copy=copy_g2s, tKgK=tKgK, tKsK=tKsK, tVgV=tVgV, tVsV=tVsV, tKVc=tKVc,
                             seqlen_k=seqlen_k)
        mm = SimpleNamespace(mma=mma, tSrQ=tSrQ, tSrK=tSrK, tOrVt=tOrVt, s2r_Q=s2r_Q, s2r_K=s2r_K,
                             s2r_V=s2r_V, tSsQ=tSsQ, tSsK=tSsK, tOsVt=tOsVt, acc_O=acc_O, O=O,
                             tScS=tScS, t0ScS=t0ScS, softmax=softmax, m_block=m_block,
                             seqlen_q=seqlen_q, seqlen_k=seqlen_k)

        # Prologue (line 6: load Q_i): cp.async groups [Q, K(n_end-1)], [V(n_end-1)], [K(n_end-2)]
        sm80.copy_rows(copy_g2s, tQgQ, tQsQ, tQcQ, seqlen_q - m_block * Br, check_rows=True,
                       zero_fill=True)
        if n_end > 0:
            self.load_kv(kv, kv.tKgK, kv.tKsK, n_end - 1, 0, tail=True)
        cute.arch.cp_async_commit_group()
        if n_end > 0:
            self.load_kv(kv, kv.tVgV, kv.tVsV, n_end - 1, 0, tail=True)
        cute.arch.cp_async_commit_group()
        if n_end > 1:
            self.load_kv(kv, kv.tKgK, kv.tKsK, n_end - 2, 1, tail=False)
        cute.arch.cp_async_commit_group()

        # Lines 7-11: the first tile (the sequence-end tail and/or the diagonal), then the tiles
        # crossing the diagonal, then the fully visible ones, without masks.
        if n_end > 0:
            self.step(mm, kv, n_end - 1, n_end, is_first=True, mask_seqlen=True, mask_causal=self.causal)
        if const_expr(self.causal):
            for i in cutlass.range(cutlass.max(n_end - 1 - n_causal, 0), unroll=1):
                self.step(mm, kv, n_end - 2 - i, n_end, is_first=False, mask_seqlen=False,
                          mask_causal=True)
        n_plain = cutlass.max(cutlass.min(n_causal, n_end - 1), 0)
        for i in cutlass.range(n_plain, unroll=1):
            self.step(mm, kv, n_plain - 1 - i, n_end, is_first=False, mask_seqlen=False,
                      mask_causal=False)

        # Lines 12-14: O /= l (deferred normalisation), LSE = m + log l; write O_i and L_i
        inv_l, lse = softmax.finalize()
        softmax.rescale(O, inv_l)
        self.epilogue(acc_O, lse, sQ, mO, mLSE, mma, copy_s2g, tidx, m_block, head, batch, seqlen_q)

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
        """Algorithm 1 lines 7-12 for K/V tile n, read from stage (n_end - 1 - n) % 2.

        Pipeline: on entry K_n (and V_n) are in flight; V_{n-1} is issued before S = Q K_n^T and
        K_{n-2} before O += P V_n, each into the buffer the barrier just freed. Every step commits
        two cp.async groups (possibly empty), so `wait_group(2)` always means "all but the last two"."""
        Br, Bc = self.Br, self.Bc
        stage = (n_end - 1 - n) % 2
        # K_n has landed for every thread; everyone is done with V_{n+1} (PV of the last step)
        cute.arch.cp_async_wait_group(2)
        cute.arch.barrier()
        if n > 0:  # V_{n-1} into the other stage, overlapping this step
            self.load_kv(kv, kv.tVgV, kv.tVsV, n - 1, 1 - stage, tail=False)
        cute.arch.cp_async_commit_group()
        # line 8: S = Q K_n^T
        acc_S = cute.make_rmem_tensor(mm.mma.get_slice(0).partition_shape_C((Br, Bc)), Float32)
        acc_S.fill(0.0)
        sm80.gemm_ss(mm.mma, acc_S, mm.tSrQ, mm.tSrK, mm.tSsQ, mm.tSsK[None, None, None, stage],
                     mm.s2r_Q, mm.s2r_K)
        # line 9: m, P = exp2(S - m), l;  line 10 (first half): O *= exp2(m_old - m_new)
        S = sm80.rows_view(acc_S)
        if const_expr(mask_seqlen or mask_causal):
            mask.apply_mask(S, mm.tScS, mm.t0ScS, mm.m_block * Br, n * Bc, mm.seqlen_q, mm.seqlen_k,
                            mask_seqlen=mask_seqlen, mask_causal=mask_causal)
        alpha = mm.softmax.update(S, is_first=is_first)
        if const_expr(not is_first):
            mm.softmax.rescale(mm.O, alpha)
        rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        # V_n has landed; everyone is done with K_n, so K_{n-2} may overwrite its stage
        cute.arch.cp_async_wait_group(2)
        cute.arch.barrier()
        if n > 1:
            self.load_kv(kv, kv.tKgK, kv.tKsK, n - 2, stage, tail=False)
        cute.arch.cp_async_commit_group()
        # line 10, second half: O += P V_n, P straight from registers
        sm80.gemm_rs(mm.mma, mm.acc_O, sm80.acc_as_A(rP), mm.tOrVt,
                     mm.tOsVt[None, None, None, stage], mm.s2r_V)

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
        tOcO = sm80.rows_view(thr_mma.partition_C(cO))
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


# ----------------------------------------------------------------------------------------------
# registration and the backend contract
# ----------------------------------------------------------------------------------------------
def _tiles(arch: str, head_dim: int, dtype: str, causal: bool) -> tuple:
    return fa2_tiles(arch, head_dim, dtype, causal).key()


def _build(cfg: cc.StaticConfig):
    kernel = FlashAttention2Sm80(interop.cute_dtype(cfg.dtype), cfg.head_dim, cfg.causal,
                                 AttentionTiles.from_key(cfg.tiles))
    return kernel, interop.fake_attention_args(cfg.dtype, cfg.head_dim, cfg.align)


cc.register_variant(
    "fa2", build=_build, tiles=_tiles, archs=("sm_80", "sm_86", "sm_89", "sm_90a"),
    dtypes=("fp16", "bf16"), head_dims=HEAD_DIMS, module=__name__,
    description="FlashAttention-2 (Q outer loop, 4 warps split Q, cp.async + ldmatrix + mma.sync)")


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
        softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """FA2 forward on CUDA tensors, the kernel module contract of HELPERS.md.

    Args: q (B, Nq, H, D), k and v (B, Nk, Hkv, D), fp16 or bf16, H % Hkv == 0, D in HEAD_DIMS,
    last-dimension stride 1 (other strides anything; inputs not 16-byte aligned are copied).
    Returns (out (B, Nq, H, D) like q, lse float32 (B, H, Nq), natural log).
    Raises ValueError for a shape it cannot serve (head_dim, dtype, H or B above 65535).
    """
    b, nq, h, d = q.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"fa2: head_dim {d} not supported; supported: {HEAD_DIMS}")
    if q.dtype not in DTYPES:
        raise ValueError(f"fa2: dtype {q.dtype} not supported; supported: {DTYPES}")
    if h > MAX_GRID_YZ or b > MAX_GRID_YZ:
        raise ValueError(f"fa2: num_heads ({h}) and batch ({b}) must each be <= {MAX_GRID_YZ} "
                         "(they index gridDim.y / gridDim.z)")
    cfg = cc.config_for("fa2", interop.device_arch(q.device), interop.dtype_name(q.dtype), d, causal)
    fn = cc.get_compiled(cfg).fn
    q, k, v = (interop.aligned(t) for t in (q, k, v))
    k, scale = positive_scale(k, softmax_scale)
    out, lse = interop.new_outputs(q)
    with torch.cuda.device(q.device):
        fn(q, k, v, out, lse, scale)
    return out, lse

