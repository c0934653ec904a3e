"""Hopper (sm90) building blocks shared by the FA3-style kernels.

Small, kernel-agnostic pieces on top of the CuTe DSL (nvidia-cutlass-dsl 4.8.1) (the accumulator
views, shared with sm80, are in `common.layout`):

* one call that issues a warpgroup GEMM (fence, the k-blocks, commit, optional wait);
* operand fragments whose shared-memory descriptors are built once, outside the K/V loop;
* the named-barrier ids the kernels use (id 0 is ``__syncthreads`` and is never used here);
* shared-memory layouts made of the Hopper swizzle atoms.

Adapted from Dao-AILab/flash-attention:flash_attn/cute/hopper_helpers.py::gemm (`wgmma`) and
flash_attn/cute/named_barrier.py (`NamedBarrier`); the layouts follow NVIDIA/cutlass
``cutlass/utils/hopper_helpers.py`` and ``examples/python/CuTeDSL/cute/hopper``.
"""

import enum

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Int64, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warpgroup
from cutlass.cute.nvgpu.tcgen05 import int_to_smem_descriptor, smem_descriptor_to_int
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.tensor_utils import LayoutEnum  # cutlass.utils.LayoutEnum is deprecated (DSL 4.8)

from fa_variants.common.config import WGMMA_M

WARPGROUP_THREADS = 128


class NamedBarrier(enum.IntEnum):
    """Hardware named-barrier ids (``bar.sync id, count``). Id 0 is ``__syncthreads``."""

    EPILOGUE = 1  # all consumer warpgroups, around the shared-memory output tile
    SCHEDULE_WG0 = 2  # ping-pong turn of consumer warpgroup 0; warpgroup w uses SCHEDULE_WG0 + w
    CLEAR_V_WG0 = 5  # seqlens_k: warpgroup w's V rows past the length cleared (CLEAR_V_WG0 + w, up to 3 warpgroups)


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
    accumulate=None,
):
    """acc (+)= A @ B over all k-blocks as one warpgroup MMA group.

    ``frag_a``/``frag_b`` are (MMA, MMA_M|N, MMA_K) fragments (shared-memory descriptors, or
    registers for A). ``wait`` >= 0 waits until at most that many MMA groups are in flight;
    ``wait`` = -1 returns right after the commit (the caller waits later). ``accumulate``, a run-time
    Boolean, replaces ``zero_init`` when given (acc is overwritten by the first k-block where it is False).
    """
    warpgroup.fence()  # order earlier register writes (acc rescale, P) before the async MMA
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init if const_expr(accumulate is None) else accumulate)
    for k in cutlass.range_constexpr(cute.size(frag_a.shape[2])):
        cute.gemm(atom, acc, frag_a[None, None, k], frag_b[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    if const_expr(wait >= 0):
        warpgroup.wait_group(wait)


@dsl_user_op
def _opaque_i64(x, *, loc=None, ip=None) -> Int64:
    """x through one ``mov.b64`` of inline PTX (no side effects): LLVM cannot trace the value back to how it was
    computed, so it cannot rebuild it where it is used."""
    return Int64(llvm.inline_asm(T.i64(), [Int64(x).ir_value(loc=loc, ip=ip)], "mov.b64 $0, $1;", "=l,l",
                                 has_side_effects=False, loc=loc, ip=ip))


def hoisted_descriptors(frag: cute.Tensor) -> cute.Tensor:
    """``frag`` (a WGMMA operand fragment in shared memory: 64-bit descriptors, e.g. (MMA, N, K, stage) from
    ``make_fragment_B``) with its first descriptor built here, once, and kept as an opaque 64-bit value; indexing
    the result (a stage, a k-block) adds the layout's offset (16-byte units, the descriptor's start-address field) to
    it. Indexing ``frag`` itself makes the DSL rebuild the descriptor from the shared-memory address (add, shift,
    mask, the leading-byte-offset bit) at every GEMM, inside the K/V loop, where neither LLVM nor ptxas hoists it.
    Same descriptors: the layout's offsets are what ``frag`` adds too. Call it outside the loop. (The descriptor <->
    Int64 casts are the DSL's own, ``cute.nvgpu.tcgen05``'s; sm90's descriptor views take the same type.)"""
    desc = _opaque_i64(smem_descriptor_to_int(frag.iterator))
    return cute.make_tensor(int_to_smem_descriptor(desc), frag.layout)


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
