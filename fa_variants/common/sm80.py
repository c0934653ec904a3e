"""Ampere (sm80) building blocks shared by the FA1 and FA2 kernels (and usable on sm90 too).

* shared-memory layouts: row-major (rows, head_dim) tiles with an XOR swizzle so that both the
  16-byte cp.async writes and the ldmatrix reads are free of bank conflicts, and the CTA's shared
  storage of Q, K and V tiles (`shared_storage`);
* global -> shared tiled copies with cp.async (16-byte vectors), with row predicates and zero-fill;
* the warp-level MMA: mma.sync m16n8k16, fp16/bf16 in, fp32 accumulate, warps stacked along M
  (so each warp owns whole rows of S and O: no cross-warp reduction, FA2 paper section 3.2);
* shared -> register copies with ldmatrix (x4; .trans for V, read as V^T);
* `gemm_ss` (both operands from shared memory, the k-loop double-buffered in registers) and
  `gemm_rs` (A already in registers: P for O += P V).

Views of the accumulators (rows/cols, P as the A operand) are in `common.layout`, shared with sm90.
Adapted from NVIDIA/cutlass:examples/python/CuTeDSL/ampere/flash_attention_v2.py (smem layouts, tiled
copies and MMA set-up) and Dao-AILab/flash-attention:flash_attn/cute/ampere_helpers.py::gemm / ::gemm_rs;
the swizzle rule is CUTLASS's ``Swizzle<B, 3, 3>`` for 16-bit types.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warp

COPY_BITS = 128  # one cp.async / vector store moves 16 bytes


# ----------------------------------------------------------------------------------------------
# shared-memory layouts and copies
# ----------------------------------------------------------------------------------------------
def smem_layout(dtype, rows: int, head_dim: int, stages: int | None = None):
    """Swizzled row-major smem layout for a (rows, head_dim[, stages]) tile of a 16-bit type.

    The swizzle atom is 8 rows x k_block columns, k_block = 64 elements (128 bytes) when head_dim
    allows it, else 32 (64 bytes: head_dim 96); Swizzle<bits, 3, 3> XORs the 16-byte chunk index
    with the row so eight consecutive rows hit eight different bank groups."""
    k_block = 64 if head_dim % 64 == 0 else 32
    bits = 3 if k_block == 64 else 2
    atom = cute.make_composed_layout(
        cute.make_swizzle(bits, 3, 3), 0,
        cute.make_layout((8, k_block), stride=(k_block, 1)))
    shape = (rows, head_dim) if stages is None else (rows, head_dim, stages)
    return cute.tile_to_shape(atom, shape, (0, 1) if stages is None else (0, 1, 2))


def shared_storage(dtype, sQ_layout, sKV_layout):
    """The shared-memory struct of an sm80 attention CTA: sQ (`sQ_layout`'s cosize), then sK and sV (each
    `sKV_layout`'s cosize), each 1024-byte aligned (the swizzle repeats every 8 rows x 128 bytes). FA1 keeps
    two Q stages in sQ, FA2 one (and reuses it for O in its epilogue)."""
    @cute.struct
    class SharedStorage:
        sQ: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sQ_layout)], 1024]
        sK: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sKV_layout)], 1024]
        sV: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sKV_layout)], 1024]

    return SharedStorage


def gmem_tiled_copy(dtype, head_dim: int, num_threads: int, async_copy: bool = True):
    """Tiled copy of a (rows, head_dim) tile: each thread moves 16-byte vectors along head_dim;
    threads cover head_dim / 8 columns x (num_threads / that) rows per step. cp.async (global ->
    shared, cached at L2 only) when async_copy, else a plain vectorised copy (shared -> global)."""
    elems = COPY_BITS // dtype.width
    k_block = 64 if head_dim % 64 == 0 else 32
    cols = k_block // elems
    op = (cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL) if async_copy
          else cute.nvgpu.CopyUniversalOp())
    atom = cute.make_copy_atom(op, dtype, num_bits_per_copy=COPY_BITS)
    thr = cute.make_layout((num_threads // cols, cols), stride=(cols, 1))
    return cute.make_tiled_copy_tv(atom, thr, cute.make_layout((1, elems)))


@cute.jit
def copy_rows(tiled_copy: cute.TiledCopy, src: cute.Tensor, dst: cute.Tensor, coord: cute.Tensor,
              valid_rows: Int32, check_rows: cutlass.Constexpr[bool], zero_fill: cutlass.Constexpr[bool]):
    """Copy a partitioned (CPY, CPY_ROWS, CPY_K) tile; rows with coord row >= valid_rows are not
    read (no out-of-bounds access) and, with zero_fill, are written as zeros instead.

    `coord` is the same partition of an identity tensor over the tile (row index in mode 0)."""
    if const_expr(not check_rows):
        cute.copy(tiled_copy, src, dst)
    else:
        for m in cutlass.range_constexpr(cute.size(dst.shape[1])):
            if coord[0, m, 0][0] < valid_rows:
                cute.copy(tiled_copy, src[None, m, None], dst[None, m, None])
            elif const_expr(zero_fill):
                dst[None, m, None].fill(0)


# ----------------------------------------------------------------------------------------------
# MMA and shared -> register copies
# ----------------------------------------------------------------------------------------------
def tiled_mma(dtype, num_warps: int):
    """mma.sync m16n8k16 (fp32 accumulate), `num_warps` warps stacked along M: one MMA step covers
    num_warps * 16 rows, so warp w owns rows 16w..16w+15 of every 16*num_warps-row slab."""
    return cute.make_tiled_mma(
        warp.MmaF16BF16Op(dtype, Float32, (16, 8, 16)),
        (num_warps, 1, 1),
        permutation_mnk=(num_warps * 16, 16, 16))


def ldmatrix_copy_A(dtype, mma):
    """ldmatrix.x4 tiled to the A operand of `mma` (Q for S = Q K^T)."""
    atom = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dtype)
    return cute.make_tiled_copy_A(atom, mma)


def ldmatrix_copy_B(dtype, mma, transpose: bool = False):
    """ldmatrix.x4 tiled to the B operand of `mma`: K for S = Q K^T; with transpose=True, V read
    as V^T (ldmatrix.trans) for O += P V."""
    atom = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=transpose, num_matrices=4), dtype)
    return cute.make_tiled_copy_B(atom, mma)


@cute.jit
def gemm_ss(mma: cute.TiledMma, acc: cute.Tensor, rA: cute.Tensor, rB: cute.Tensor,
            sA: cute.Tensor, sB: cute.Tensor, copy_A: cute.TiledCopy, copy_B: cute.TiledCopy):
    """acc += A B^T with A and B in shared memory (already partitioned by copy_A / copy_B, k in
    mode 2); register fragments rA / rB. The ldmatrix of k-step k+1 is issued before the MMAs of
    step k, so shared-memory latency hides behind tensor-core work."""
    rA_v, rB_v = copy_A.retile(rA), copy_B.retile(rB)
    n_k = cute.size(sA.shape[2])
    cute.copy(copy_A, sA[None, None, 0], rA_v[None, None, 0])
    cute.copy(copy_B, sB[None, None, 0], rB_v[None, None, 0])
    for k in cutlass.range_constexpr(n_k):
        if const_expr(k + 1 < n_k):
            cute.copy(copy_A, sA[None, None, k + 1], rA_v[None, None, k + 1])
            cute.copy(copy_B, sB[None, None, k + 1], rB_v[None, None, k + 1])
        cute.gemm(mma, acc, rA[None, None, k], rB[None, None, k], acc)


@cute.jit
def gemm_rs(mma: cute.TiledMma, acc: cute.Tensor, rA: cute.Tensor, rB: cute.Tensor,
            sB: cute.Tensor, copy_B: cute.TiledCopy):
    """acc += A B^T with A in registers (P) and B in shared memory (V^T), B's k-loop double-buffered."""
    rB_v = copy_B.retile(rB)
    n_k = cute.size(rA.shape[2])
    cute.copy(copy_B, sB[None, None, 0], rB_v[None, None, 0])
    for k in cutlass.range_constexpr(n_k):
        if const_expr(k + 1 < n_k):
            cute.copy(copy_B, sB[None, None, k + 1], rB_v[None, None, k + 1])
        cute.gemm(mma, acc, rA[None, None, k], rB[None, None, k], acc)
