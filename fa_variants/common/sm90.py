"""Hopper (sm90) building blocks shared by the FA3-style kernels.

Small, kernel-agnostic pieces on top of the CuTe DSL (nvidia-cutlass-dsl 4.8.1):

* views of a WGMMA accumulator fragment as a (rows, cols) matrix and as the A operand of a
  following register-sourced WGMMA (the "P in registers" trick of FlashAttention-3, Shah et al.
  2024, section 3.1);
* one call that issues a warpgroup GEMM (fence, the k-blocks, commit, optional wait);
* the named-barrier ids the kernels use (id 0 is ``__syncthreads`` and is never used here);
* shared-memory layouts made of the Hopper swizzle atoms.

Learned from (not copied): CUTLASS ``cute/atom/mma_traits_sm90_gmma.hpp`` fragment layouts,
``cutlass/utils/hopper_helpers.py`` and ``examples/python/CuTeDSL/cute/hopper`` in NVIDIA/cutlass,
``flash_attn/cute/{hopper_helpers,named_barrier}.py`` in Dao-AILab/flash-attention.
"""

import enum

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup
from cutlass.utils import LayoutEnum

WARPGROUP_THREADS = 128
WGMMA_M = 64  # rows of one warpgroup MMA instruction


class NamedBarrier(enum.IntEnum):
    """Hardware named-barrier ids (``bar.sync id, count``). Id 0 is ``__syncthreads``."""

    EPILOGUE = 1  # all consumer warpgroups, around the shared-memory output tile
    SCHEDULE_WG0 = 2  # ping-pong turn of consumer warpgroup 0; warpgroup w uses SCHEDULE_WG0 + w


# --------------------------------------------------------------------------------------------
# Accumulator views
# --------------------------------------------------------------------------------------------
# A WGMMA accumulator fragment for an (64*M) x (8*V) tile has the per-thread layout
#   ((2, 2, V), M, N) : value (c, r, v) holds column 8*v + 2*(lane % 4) + c and
#                       row 16*warp + lane // 4 + 8*r of the m-th 64-row block.
# Each row is spread over the 4 threads of a quad (lanes 4i .. 4i+3).


def _compact(layout: cute.Layout) -> cute.Layout:
    """Column-major layout with the same (nested) shape, so that regrouping needs no arithmetic
    on the original strides (works for identity/coordinate tensors too)."""
    return cute.make_layout(layout.shape)


def acc_rows_cols_layout(acc_layout: cute.Layout) -> cute.Layout:
    """((2, 2, V), M, N) -> ((2, M), (2, V, N)): mode 0 indexes a thread's rows, mode 1 its columns."""
    c = _compact(acc_layout)
    rows = ((c.shape[0][1], c.shape[1]), (c.stride[0][1], c.stride[1]))
    cols = ((c.shape[0][0], c.shape[0][2], c.shape[2]), (c.stride[0][0], c.stride[0][2], c.stride[2]))
    mn = cute.make_layout((rows[0], cols[0]), stride=(rows[1], cols[1]))
    return cute.composition(acc_layout, mn)


def acc_rows_cols(acc: cute.Tensor) -> cute.Tensor:
    """View a WGMMA accumulator (or its coordinate tensor) as [thread row, thread column]."""
    return cute.make_tensor(acc.iterator, acc_rows_cols_layout(acc.layout))


def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """View a 16-bit-bound fp32 accumulator ((2, 2, V), M, 1) as the register A operand
    ((2, 2, 2), M, V / 2) of a WGMMA whose K is the accumulator's N.

    The C fragment of m64nNk16 and the A fragment of m64n*k16 agree value by value once two
    consecutive 8-column groups form one 16-wide k-block (PTX ISA, "Register fragments for
    wgmma"), so the conversion is a pure re-indexing: no data moves between threads.
    """
    c = _compact(acc.layout)
    v = c.shape[0][2]
    if const_expr(v % 2 != 0 or c.shape[2] != 1):
        raise ValueError(f"accumulator {acc.layout} cannot feed a k16 WGMMA (needs N % 16 == 0, one N tile)")
    frg = cute.make_layout(
        ((c.shape[0][0], c.shape[0][1], 2), c.shape[1], v // 2),
        stride=((c.stride[0][0], c.stride[0][1], c.stride[0][2]), c.stride[1], 2 * c.stride[0][2]),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, frg))


@cute.jit
def apply_mask_select(s: cute.Tensor, coord: cute.Tensor, coord0: cute.Tensor, row_start: Int32,
                      col_start: Int32, seqlen_q: Int32, seqlen_k: Int32,
                      mask_seqlen: cutlass.Constexpr[bool], mask_causal: cutlass.Constexpr[bool]):
    """``common.mask.apply_mask`` (same arguments, same bottom-right rule: query i sees key j iff
    j < seqlen_k and, when causal, j <= i + seqlen_k - seqlen_q), written as one select per score.

    The branch-per-score form of common.mask spills registers in the 3-consumer-warpgroup Hopper
    kernel (160 registers per thread, D=64 causal); a select keeps the score in its register.
    """
    thr_row, thr_col = coord[0][0], coord[0][1]
    end_limit = seqlen_k - col_start - thr_col  # local columns >= this are past seqlen_k
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        limit = end_limit
        if const_expr(mask_causal):
            causal_limit = seqlen_k - seqlen_q + row_start + thr_row + coord0[r, 0][0] + 1 - col_start - thr_col
            limit = cutlass.min(causal_limit, end_limit) if const_expr(mask_seqlen) else causal_limit
        for c in cutlass.range_constexpr(cute.size(s, mode=[1])):
            s[r, c] = -Float32.inf if coord0[0, c][1] >= limit else s[r, c]


# --------------------------------------------------------------------------------------------
# Warpgroup GEMM
# --------------------------------------------------------------------------------------------


@cute.jit
def wgmma(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    frag_a: cute.Tensor,
    frag_b: cute.Tensor,
    zero_init: cutlass.Constexpr[bool] = False,
    wait: cutlass.Constexpr[int] = 0,
):
    """acc (+)= A @ B over all k-blocks as one warpgroup MMA group.

    ``frag_a``/``frag_b`` are (MMA, MMA_M|N, MMA_K) fragments (shared-memory descriptors, or
    registers for A). ``wait`` >= 0 waits until at most that many MMA groups are in flight;
    ``wait`` = -1 returns right after the commit (the caller waits later).
    """
    warpgroup.fence()  # order earlier register writes (acc rescale, P) before the async MMA
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in cutlass.range_constexpr(cute.size(frag_a.shape[2])):
        cute.gemm(atom, acc, frag_a[None, None, k], frag_b[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    if const_expr(wait >= 0):
        warpgroup.wait_group(wait)


def make_tiled_mma(dtype, num_warpgroups: int, n: int, b_mn_major: bool, a_in_registers: bool) -> cute.TiledMma:
    """A (64 * num_warpgroups) x n x 16 warpgroup MMA, fp32 accumulation, A K-major.

    ``b_mn_major``: B is stored N-contiguous (V for O = P V); otherwise K-contiguous (K for S = Q K^T).
    """
    return sm90_utils.make_trivial_tiled_mma(
        dtype,
        dtype,
        cute.nvgpu.OperandMajorMode.K,
        cute.nvgpu.OperandMajorMode.MN if b_mn_major else cute.nvgpu.OperandMajorMode.K,
        cutlass.Float32,
        atom_layout_mnk=(num_warpgroups, 1, 1),
        tiler_mn=(WGMMA_M, n),
        a_source=warpgroup.OperandSource.RMEM if a_in_registers else warpgroup.OperandSource.SMEM,
    )


# --------------------------------------------------------------------------------------------
# Shared memory
# --------------------------------------------------------------------------------------------


def make_row_major_smem_layout(dtype, rows: int, cols: int, stages: int | None = None):
    """Swizzled (rows, cols[, stages]) shared-memory layout with ``cols`` contiguous, built from
    the widest Hopper swizzle atom that divides a row (128B for cols*bits % 1024 == 0). Usable by
    TMA and by WGMMA as a K-major operand, or transposed as an MN-major one."""
    atom = warpgroup.make_smem_layout_atom(sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, cols), dtype)
    if stages is None:
        return cute.tile_to_shape(atom, (rows, cols), (0, 1))
    return cute.tile_to_shape(atom, (rows, cols, stages), (0, 1, 2))


def transpose_view(t: cute.Tensor) -> cute.Tensor:
    """Swap the first two modes of a (shared-memory) tensor without moving data."""
    shape = (t.shape[1], t.shape[0], *t.shape[2:])
    order = (1, 0, *range(2, cute.rank(t)))
    return cute.composition(t, cute.make_ordered_layout(shape, order=order))
