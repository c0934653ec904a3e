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

The module's ``VARIANT`` record (`common.launch.Variant`) registers it; ``run`` launches it.
Adapted from NVIDIA/cutlass:examples/python/CuTeDSL/ampere/flash_attention_v2.py::FlashAttentionForwardAmpere
(single K/V stage, no LSE, top-left causal; this kernel double-buffers, writes the LSE, and aligns causal
bottom-right) and Dao-AILab/flash-attention:flash_attn/cute/flash_fwd.py::FlashAttentionForwardSm80.
"""
from __future__ import annotations

from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, const_expr

from fa_variants.common import interop, sm80
from fa_variants.common.cache import StaticConfig
from fa_variants.common.config import Sm80Config, smem_capacity
from fa_variants.common.launch import Variant
from fa_variants.common.layout import acc_as_operand_a, rows_cols, transpose_view
from fa_variants.common.mask import AttentionMask, BlockInfo
from fa_variants.common.scale import LOG2_E
from fa_variants.common.softmax import OnlineSoftmax

HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 256)
DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
MAX_GRID_YZ = 65535  # heads and batch ride on gridDim.y / gridDim.z


class FlashAttention2Sm80:
    """One compiled FA2 forward kernel for a static configuration (dtype, head_dim, causal, tiles).

    `__call__(mQ, mK, mV, mO, mLSE, softmax_scale, stream)` is the host side (layouts, grid, launch);
    `kernel` is the device side, which reads top-down like Algorithm 1.
    """

    def __init__(self, dtype, head_dim: int, causal: bool, tiles: Sm80Config):
        self.dtype = dtype
        self.head_dim = head_dim
        self.causal = causal
        self.Br, self.Bc, self.stages = tiles.tile_m, tiles.tile_n, tiles.stages
        self.blocks = BlockInfo(tiles.tile_m, tiles.tile_n, causal)
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

        # K/V tiles this Q tile needs: n in [0, n_end), visited n_end-1 down to 0 (causal skipping)
        n_end = self.blocks.kv_tile_end(m_block, seqlen_q, seqlen_k)
        n_causal = n_end  # tiles n >= n_causal cross the diagonal and need the causal mask;
        # only the last tile, ceil(seqlen_k / Bc) - 1, can pass seqlen_k, and if needed it comes first
        if const_expr(self.causal):
            n_causal = self.blocks.kv_tile_causal_start(m_block, seqlen_q, seqlen_k)

        kv = SimpleNamespace(copy=copy_g2s, tKgK=tKgK, tKsK=tKsK, tVgV=tVgV, tVsV=tVsV, tKVc=tKVc,
                             seqlen_k=seqlen_k)
        mm = SimpleNamespace(mma=mma, tSrQ=tSrQ, tSrK=tSrK, tOrVt=tOrVt, s2r_Q=s2r_Q, s2r_K=s2r_K,
                             s2r_V=s2r_V, tSsQ=tSsQ, tSsK=tSsK, tOsVt=tOsVt, acc_O=acc_O, O=O,
                             tScS=tScS, t0ScS=t0ScS, softmax=softmax, m_block=m_block,
                             mask=AttentionMask(seqlen_q, seqlen_k, select=False))

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
        S = rows_cols(acc_S)
        if const_expr(mask_seqlen or mask_causal):
            mm.mask.apply(S, mm.tScS, mm.t0ScS, mm.m_block * Br, n * Bc, mask_seqlen, mask_causal)
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
        sm80.gemm_rs(mm.mma, mm.acc_O, acc_as_operand_a(rP), mm.tOrVt,
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


# ----------------------------------------------------------------------------------------------
# the variant record
# ----------------------------------------------------------------------------------------------
# Tile table. Following FlashAttention-2's own sm80 table (flash-attention csrc flash_fwd_launch_template.h)
# as a start: 4 warps, tile_m = 128 (two 16-row MMA blocks per warp, so each K/V fragment read from shared
# memory feeds two MMAs), and tile_m = 64 for D = 256 (a 128-row O accumulator would not fit in registers).
# tile_n is then the widest that compiles without local-memory spills (`fa-variants compile`, sm_80, ptxas of
# nvidia-cutlass-dsl 4.8.1): FA2's 128 x 128 at D = 64 and 128 x 64 at D = 96 / 128 spill 8-32 bytes once
# K/V are double-buffered, so D = 64 uses tile_n = 64 and D = 96 / 128 use 32 (FA2's own choice for sm86 /
# sm89 at D = 128). K and V are double-buffered (stages = 2). Parts with 99 KiB of shared memory per CTA
# (sm86 / sm89 / sm120) get a narrower tile_n at D = 256.
CONFIGS = {64: Sm80Config(128, 64), 96: Sm80Config(128, 32), 128: Sm80Config(128, 32), 256: Sm80Config(64, 64)}
SMALL_SMEM_CONFIGS = {256: Sm80Config(64, 32)}


def default_config(arch: str, head_dim: int, causal: bool) -> Sm80Config:
    """The FA2 tile configuration for an arch and head_dim (ValueError if head_dim is unsupported)."""
    if head_dim not in CONFIGS:
        raise ValueError(f"fa2: head_dim {head_dim} has no tile configuration; supported: {sorted(CONFIGS)}")
    config = CONFIGS[head_dim]
    if smem_capacity(arch) < config.smem_bytes(head_dim):
        config = SMALL_SMEM_CONFIGS.get(head_dim, config)
    return config.check(arch, head_dim)


def _check_config(config: Sm80Config, arch: str, head_dim: int) -> Sm80Config:
    if config.stages != 2 or config.q_stages != 1:
        raise ValueError(f"fa2: {config}: the K/V pipeline is written for stages=2, q_stages=1")
    return config.check(arch, head_dim)


def _build(cfg: StaticConfig):
    kernel = FlashAttention2Sm80(interop.cute_dtype(cfg.dtype), cfg.head_dim, cfg.causal, cfg.config)
    return kernel, interop.fake_attention_args(cfg.dtype, cfg.head_dim, cfg.align)


def _check_problem(config: Sm80Config, q: torch.Tensor, k: torch.Tensor) -> None:
    b, _, h, _ = q.shape
    if h > MAX_GRID_YZ or b > MAX_GRID_YZ:
        raise ValueError(f"fa2: num_heads ({h}) and batch ({b}) must each be <= {MAX_GRID_YZ} "
                         "(they index gridDim.y / gridDim.z)")


VARIANT = Variant(
    "fa2", archs=("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a"), dtypes=DTYPES, head_dims=HEAD_DIMS,
    default_config=default_config, check_config=_check_config, build=_build, check_problem=_check_problem)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float,
        config: Sm80Config | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FA2 forward on CUDA tensors (`common.launch.launch`).

    Args: q (B, Nq, H, D), k and v (B, Nk, Hkv, D), fp16 or bf16, H % Hkv == 0, D in HEAD_DIMS,
    last-dimension stride 1 (other strides anything; inputs not 16-byte aligned are copied);
    softmax_scale any finite real; `config` overrides the tile table (tile sweeps).
    Returns (out (B, Nq, H, D) like q, lse float32 (B, H, Nq), natural log).
    Raises ValueError for a shape it cannot serve (head_dim, dtype, H or B above 65535).
    """
    return VARIANT.run(q, k, v, causal=causal, softmax_scale=softmax_scale, config=config)
