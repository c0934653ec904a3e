"""Register and shared-memory views shared by the sm80 (mma.sync) and sm90 (WGMMA) kernels.

An MMA accumulator fragment has the per-thread layout ((2, 2[, V]), MMA_M, MMA_N): value (c, r[, v])
holds column 8 v + 2 (lane % 4) + c and row lane // 4 + 8 r of one MMA block (m16n8 for mma.sync, whose
fragment has no V mode; m64nN for WGMMA, whose V = N / 8 column groups live in mode 0). Each row is spread
over the 4 threads of a quad. Two views of it serve every kernel:

* `rows_cols(acc)`: (rows, cols) = ((2, MMA_M), (2[, V], MMA_N)), for the softmax and the masks;
* `acc_as_operand_a(acc)`: P (the accumulator of S = Q K^T, converted to 16 bits) as the register A
  operand of O += P V: two 8-column groups form one k16 block, value for value (PTX ISA, "Matrix fragments
  for mma.m16n8k16" and "Register fragments for wgmma"), so P never moves between threads (FA2 section
  3.1, FA3 section 3.1).

and `transpose_view` reads a shared-memory (rows, cols, ...) tile as (cols, rows, ...) (V as V^T).

Adapted from Dao-AILab/quack:quack/layout_utils.py::convert_layout_acc_mn, ::convert_layout_acc_frgA and
::transpose_view.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr


def rows_cols(acc: cute.Tensor) -> cute.Tensor:
    """An accumulator (or its coordinate tensor) ((2, 2[, V]), MMA_M, MMA_N) viewed as
    [thread row, thread column] = ((2, MMA_M), (2[, V], MMA_N))."""
    c = cute.make_layout(acc.layout.shape)  # column-major, same shape: regroup without stride arithmetic
    m0, s0 = c.shape[0], c.stride[0]
    shape = ((m0[1], c.shape[1]), (m0[0], *m0[2:], c.shape[2]))
    stride = ((s0[1], c.stride[1]), (s0[0], *s0[2:], c.stride[2]))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, cute.make_layout(shape, stride=stride)))


def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """A 16-bit copy of an accumulator viewed as the register A operand of an MMA whose K is the
    accumulator's N: mma.sync ((2, 2), M, N) -> ((2, 2, 2), M, N / 2); WGMMA ((2, 2, V), M, 1) ->
    ((2, 2, 2), M, V / 2). Pure re-indexing."""
    if const_expr(cute.rank(acc.layout.shape[0]) == 3):  # WGMMA: the k16 pairs are in mode 0
        c = cute.make_layout(acc.layout.shape)
        v = c.shape[0][2]
        if const_expr(v % 2 != 0 or c.shape[2] != 1):
            raise ValueError(f"accumulator {acc.layout} cannot feed a k16 WGMMA (needs N % 16 == 0, one N tile)")
        frg = cute.make_layout(
            ((c.shape[0][0], c.shape[0][1], 2), c.shape[1], v // 2),
            stride=((c.stride[0][0], c.stride[0][1], c.stride[0][2]), c.stride[1], 2 * c.stride[0][2]))
        return cute.make_tensor(acc.iterator, cute.composition(acc.layout, frg))
    l = cute.logical_divide(acc.layout, (None, None, 2))  # mma.sync: pairs of n8 blocks along N
    view = cute.make_layout(
        ((l.shape[0], l.shape[2][0]), l.shape[1], l.shape[2][1]),
        stride=((l.stride[0], l.stride[2][0]), l.stride[1], l.stride[2][1]))
    return cute.make_tensor(acc.iterator, view)


def transpose_view(t: cute.Tensor) -> cute.Tensor:
    """(rows, cols, ...) shared-memory tensor viewed as (cols, rows, ...), without moving data."""
    shape = (t.shape[1], t.shape[0], *t.shape[2:])
    order = (1, 0, *range(2, cute.rank(t)))
    return cute.composition(t, cute.make_ordered_layout(shape, order=order))


@cute.jit
def quad_allreduce(x: Float32, op: cutlass.Constexpr) -> Float32:
    """Reduce over the 4 threads of a quad (the threads sharing an accumulator row)."""
    x = op(x, cute.arch.shuffle_sync_bfly(x, offset=2))
    x = op(x, cute.arch.shuffle_sync_bfly(x, offset=1))
    return x


def convert_in_pairs(src: cute.Tensor, dst: cute.Tensor) -> None:
    """dst = src converted to dst's element type, two values per conversion: values 2i and 2i + 1 of both
    tensors' logical (column-major) order, which for an MMA fragment are adjacent in one 32-bit register of
    a 16-bit dst (mode 0 starts with a 2 of stride 1). Same rounding as ``dst.store(src.load().to(...))``
    (round to nearest); on nvidia-cutlass-dsl 4.8.1 the whole-tensor conversion of a fragment whose size is
    not a power of two (64 x 80 or 64 x 176 per warpgroup) lowers to one F2FP per value plus a PRMT per pair,
    each pair here to one packed F2FP."""
    n = cute.size(dst)
    if n % 2 != 0 or cute.size(src) != n:
        raise ValueError(f"convert_in_pairs: {n} and {cute.size(src)} values; needs the same even count")
    pairs = cute.make_layout((2, n // 2), stride=(1, 2))
    src2 = cute.make_tensor(src.iterator, cute.composition(src.layout, pairs))
    dst2 = cute.make_tensor(dst.iterator, cute.composition(dst.layout, pairs))
    for i in range(n // 2):  # unrolled at trace time (a static fragment)
        dst2[None, i].store(src2[None, i].load().to(dst.element_type))
