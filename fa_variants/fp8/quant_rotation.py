"""The Q / K transform of the FP8 quantisation pass, in registers (mixed into ``fp8.quant_kernel.QuantPass``):
K smoothing and the rotation's random signs (``signs_and_smoothing``), the Walsh-Hadamard transform of a token held by
``lanes`` threads (``fwht``: stages inside a 16-channel chunk, across lanes with ``shfl.bfly``, then across the
thread's chunks, in ``quantize.fwht``'s stage order), and Q's LSE shift of K smoothing (``lse_shift``). The recipe is
the incoherent processing of FlashAttention-3 (Shah et al. 2024, section 3.3: a random-sign Hadamard before block
quantisation) with SageAttention's K smoothing; the shuffle FWHT idea from QuaRot and FlashAttention-3's Hadamard
kernels (``fp8.quant_kernel``'s module docstring, docs/design.md FP8 notes).
"""
from __future__ import annotations

import math
import operator

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass._mlir.dialects import math as mlir_math
from cutlass.cutlass_dsl import T, dsl_user_op

from fa_variants.common.softmax import bits_f32, f32_bits, tree_reduce
from fa_variants.fp8.quant_maps import VEC


@dsl_user_op
def _fma(a: Float32, b: Float32, c: Float32, *, loc=None, ip=None) -> Float32:
    """a * b + c with one rounding (fma.rn.f32)."""
    return Float32(mlir_math.fma(a.ir_value(loc=loc, ip=ip), b.ir_value(loc=loc, ip=ip), c.ir_value(loc=loc, ip=ip),
                                 loc=loc, ip=ip))


@dsl_user_op
def _mul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """a * b rounded on its own (``mul.rn.f32``): ptxas may fuse a plain ``mul.f32`` into the add after it (one
    rounding instead of two), which changes a product that is not exact (a subnormal) and so the recipe's bits. The
    DSL has no multiply that forbids the fusion, hence the one PTX instruction."""
    return Float32(llvm.inline_asm(T.f32(), [a.ir_value(loc=loc, ip=ip), b.ir_value(loc=loc, ip=ip)],
                                   "mul.rn.f32 $0, $1, $2;", "=f,f,f", has_side_effects=False, loc=loc, ip=ip))


class RotationMixin:
    """``QuantPass``'s smoothing, signs, FWHT and LSE shift (needs ``cfg``, ``slots``, ``lanes``, ``chunk_of``,
    ``token_of`` from the pass)."""

    @cute.jit
    def signs_and_smoothing(self, x: cute.Tensor, sSigns: cute.Tensor, sMean: cute.Tensor, tidx: Int32):
        """x = (x - mean) * sign per channel (smoothing, then the rotation's random signs / K's -1)."""
        for j in cutlass.range_constexpr(self.slots):
            c0 = self.chunk_of(tidx, j) * VEC
            sign = cute.make_rmem_tensor(VEC, Float32)
            cute.autovec_copy(cute.local_tile(sSigns, (VEC,), (c0 // VEC,)), sign)
            if const_expr(self.cfg.smooth):
                mean = cute.make_rmem_tensor(VEC, Float32)
                cute.autovec_copy(cute.local_tile(sMean, (VEC,), (c0 // VEC,)), mean)
                for i in cutlass.range_constexpr(VEC):
                    x[i, j] = (x[i, j] - mean[i]) * sign[i]
            else:
                for i in cutlass.range_constexpr(VEC):
                    x[i, j] = x[i, j] * sign[i]

    @cute.jit
    def lse_shift(self, x: cute.Tensor, sMean: cute.Tensor, mShift: cute.Tensor, scale: Float32, batch: Int32,
                  head: Int32, tile: Int32, tidx: Int32):
        """shift[batch, head, token] = scale * (q . mean of kv-head head // (H / H_kv)), float32: the thread's 64
        products in ``shift_chains`` = C interleaved chains (product i of each 16-channel chunk into chain i % C, in
        order; C = 1: one serial chain), the chains added pairwise (``common.softmax.tree_reduce``), then a
        butterfly sum over the token's L lanes. ``wide``: the same sums in the same order (bit for bit): the thread
        holds the default's lanes l (even slots) and l + L (odd slots), C chains each, the butterfly over the L lanes
        on both, then the default's last butterfly step (lanes l and l + L) as one add."""
        C = self.cfg.shift_chains
        chains = [[Float32(0.0) for _ in range(C)] for _ in range(2 if self.cfg.wide else 1)]
        for j in cutlass.range_constexpr(self.slots):
            mean = cute.make_rmem_tensor(VEC, Float32)
            cute.autovec_copy(cute.local_tile(sMean, (VEC,), (self.chunk_of(tidx, j),)), mean)
            group = chains[j % 2] if const_expr(self.cfg.wide) else chains[0]
            for i in cutlass.range_constexpr(VEC):
                group[i % C] = _fma(x[i, j], mean[i], group[i % C])
        sums = [tree_reduce(group, operator.add) for group in chains]
        for b in cutlass.range_constexpr(self.lanes.bit_length() - 1):
            sums = [s + cute.arch.shuffle_sync_bfly(s, offset=1 << b) for s in sums]
        acc = sums[0] + sums[1] if const_expr(self.cfg.wide) else sums[0]
        tok = tile * self.cfg.rows + self.token_of(tidx, 0)
        if tidx % self.lanes == 0 and tok < mShift.shape[2]:
            mShift[batch, head, tok] = acc * scale

    @cute.jit
    def fwht(self, x: cute.Tensor, lane: Int32):
        """Unnormalised Walsh-Hadamard transform of the thread's token (with its L lanes) in the stage order
        of ``quantize.fwht``; the normalisation is folded into the quantisation (``finish_block``)."""
        self.chunk_stages(x)  # h = 1, 2, 4, 8: inside a chunk
        for b in cutlass.range_constexpr(self.lanes.bit_length() - 1):  # h = 16 .. 8 L: across lanes
            m = 1 << b
            sign = Float32(1.0) - Float32(2.0) * Float32(lane >> b & 1)  # +1: a + other, -1: other - b
            for j in cutlass.range_constexpr(self.slots):
                for i in cutlass.range_constexpr(VEC):
                    other = cute.arch.shuffle_sync_bfly(x[i, j], offset=m)
                    x[i, j] = _fma(x[i, j], sign, other)
        for b in cutlass.range_constexpr(self.slots.bit_length() - 1):  # h = 16 L .. D / 2: the thread's chunks
            h = 1 << b
            for j in cutlass.range_constexpr(self.slots):
                if const_expr((j & h) == 0):
                    for i in cutlass.range_constexpr(VEC):
                        a, c = x[i, j], x[i, j + h]
                        x[i, j] = a + c
                        x[i, j + h] = a - c

    @cute.jit
    def rotate_again(self, x: cute.Tensor, mX: cute.Tensor, sSigns: cute.Tensor, sMean: cute.Tensor, batch: Int32,
                     head: Int32, tile: Int32, tidx: Int32):
        """``nonfinite``'s slow path for Q / K (``finish_block``: a block whose max after the FWHT is inf or NaN, from
        a non-finite input or from a finite token whose FWHT sums overflow float32, or at least 2^125 / D, where a
        token may be one the recipe shifts): the thread's token again from global memory (``read_again``), its signs
        and smoothing, then the torch recipe's overflow shift (``quantize.HadamardRotation``): k = max(0, e - 126), e
        the binary exponent of m D (m the token's largest finite |x|: 2^(e-1) <= m D < 2^e), and x = fl(fl(FWHT(x
        2^-k) n) 2^k), n = float32(1 / sqrt(D)): the recipe's normalised values bit for bit, inf where they overflow
        float32 (k = 0 for every ordinary token: fl(x n), the values the fast path folds into its multiply)."""
        self.read_again(x, mX, batch, head, tile, tidx)
        self.signs_and_smoothing(x, sSigns, sMean, tidx)
        D = self.head_dim
        m = Float32(0.0)  # the token's largest finite |x| (the recipe's nan_to_num(nan=0, posinf=0))
        for j in cutlass.range_constexpr(self.slots):
            for i in cutlass.range_constexpr(VEC):
                a = cute.arch.fmax(x[i, j], -x[i, j])  # NaN for a NaN: fails the test below
                if a < Float32(math.inf):
                    m = cute.arch.fmax(m, a)
        for b in cutlass.range_constexpr(self.lanes.bit_length() - 1):
            m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=1 << b))
        # e = (biased exponent of m) - 127 + 1 + log2 D for a normal m; 0 <= k <= 10
        k = cutlass.max(((f32_bits(m) >> 23) & 0xFF) - 252 + (D.bit_length() - 1), 0)
        down, up = bits_f32((127 - k) << 23), bits_f32((127 + k) << 23)
        for j in cutlass.range_constexpr(self.slots):
            for i in cutlass.range_constexpr(VEC):
                x[i, j] = _mul_rn(x[i, j], down)  # rounded before the FWHT's first add, as torch's ldexp
        self.fwht(x, tidx % self.lanes)
        norm = Float32(1.0 / math.sqrt(D))
        for j in cutlass.range_constexpr(self.slots):
            for i in cutlass.range_constexpr(VEC):
                x[i, j] = (x[i, j] * norm) * up

    @cute.jit
    def read_again(self, x: cute.Tensor, mX: cute.Tensor, batch: Int32, head: Int32, tile: Int32, tidx: Int32):
        """The thread's 16-bit values of a block straight from global memory into x (float32), in the fast path's
        places (slot j: token ``token_of``, chunk ``chunk_of``); tokens past seqlen as zeros (V's padding; Q / K's
        are never counted or stored)."""
        raw = cute.make_rmem_tensor(VEC, mX.element_type)
        for j in cutlass.range_constexpr(self.slots):
            tok = tile * self.cfg.rows + self.token_of(tidx, j)
            for i in cutlass.range_constexpr(VEC):
                raw[i] = mX.element_type(0.0)
            if tok < mX.shape[1]:
                for i in cutlass.range_constexpr(VEC):
                    raw[i] = mX[batch, tok, head, self.chunk_of(tidx, j) * VEC + i]
            x[None, j].store(raw.load().to(Float32))

    @cute.jit
    def chunk_stages(self, x: cute.Tensor):
        """The FWHT stages h = 1, 2, 4, 8 inside each of the thread's 16-channel chunks (``fwht``'s first four)."""
        for j in cutlass.range_constexpr(self.slots):
            for b in cutlass.range_constexpr(4):
                h = 1 << b
                for i in cutlass.range_constexpr(VEC):
                    if const_expr((i & h) == 0):
                        a, c = x[i, j], x[i + h, j]
                        x[i, j] = a + c
                        x[i + h, j] = a - c
