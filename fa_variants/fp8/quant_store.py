"""The block scale and the e4m3 stores of the FP8 quantisation pass (mixed into ``fp8.quant_kernel.QuantPass``):
the block amax over the CTA (``block_max``), the power-of-two descale of ``quantize.descale_from_amax`` on the float32
bits with the Hadamard's 1 / sqrt(D) folded in (``finish_block``), the saturating e4m3 conversion (``e4m3_slots``),
and the stores: Q / K per thread (``store_qk``) or through the stage (``store_qk_staged``, ``fp8.quant_maps``'
``store_unit`` / ``store_map``), V transposed into ``v_t`` in ``layout.v_token_order`` (``store_v_t``). Block
quantisation as in FlashAttention-3 (Shah et al. 2024, section 3.3).
"""
from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from fa_variants.common.softmax import bits_f32, f32_bits, not_below
from fa_variants.fp8.quant_maps import SLOTS, VEC, store_map, store_pitch, store_unit
from fa_variants.fp8.quantize import MIN_DESCALE_EXPONENT


class ScaleStoreMixin:
    """``QuantPass``'s block amax, descale and e4m3 stores (needs ``cfg``, ``head_dim``, ``slots``, ``quads``,
    ``num_threads``, ``token_of``, ``chunk_of``)."""

    @cute.jit
    def e4m3_slots(self, x: cute.Tensor, tidx: Int32) -> cute.Tensor:
        """The thread's values as e4m3 (saturating), (VEC, slots), slot j = chunk ``chunk_of(tidx, j)``."""
        y8 = cute.make_rmem_tensor(cute.make_layout((VEC, self.slots)), cutlass.Float8E4M3FN)
        y8.store(x.load().to(cutlass.Float8E4M3FN))
        return y8

    @cute.jit
    def block_max(self, v: Float32, red: cute.Tensor, parity: Int32, tidx: Int32, nan: bool = False) -> Float32:
        """max of v over the CTA: warp butterfly, then the warps' maxima through shared memory (buffer
        ``parity``: consecutive blocks alternate, so one barrier per block suffices). ``nan``: a NaN wins
        (FMNMX.NaN, as cheap as the plain one), else it is skipped."""
        for b in cutlass.range_constexpr(5):
            v = cute.arch.fmax(v, cute.arch.shuffle_sync_bfly(v, offset=16 >> b), nan=nan)
        if tidx % 32 == 0:
            red[tidx // 32, parity] = v
        cute.arch.barrier()
        out = red[0, parity]
        for w in cutlass.range_constexpr(1, self.num_threads // 32):
            out = cute.arch.fmax(out, red[w, parity], nan=nan)
        return out

    @cute.jit
    def finish_block(self, x: cute.Tensor, mX: cute.Tensor, mY: cute.Tensor, mDescale: cute.Tensor,
                     red: cute.Tensor, parity: Int32, batch: Int32, head: Int32, tile: Int32, tidx: Int32,
                     sStage: cute.Tensor, sSigns: cute.Tensor, sMean: cute.Tensor) -> Int32:
        """amax over the block's existing tokens -> descale (or amax / the given descale) -> e4m3, stored
        (``scale_store``). ``nonfinite``: a block whose max is inf or NaN (Q / K: or at least 2^125 / D) takes the
        slow path, Q / K's values first normalised again from the input with the recipe's overflow shift
        (``rotate_again``; sSigns, sMean: the item's signs and K mean), then ``finite_block``; with ``deferred``
        it is left unstored instead, for ``redo_left`` after the CTA's loop. Returns 1 for a block left, else 0 (the
        same in every thread)."""
        seqlen = mX.shape[1]
        # nonfinite: a NaN wins the max, so that a block holding one (from the input, or from a finite token whose
        # FWHT overflowed to inf - inf in every value, leaving no inf to find) takes the slow path below
        nan = const_expr(self.cfg.nonfinite)
        amax = self.block_max(self.thread_max(x, tile, seqlen, tidx, nan=nan), red, parity, tidx, nan=nan)
        # torch normalises first (x * n, n = float32(1 / sqrt(D))) and takes the amax of that; rounding is
        # monotonic, so max |fl(x n)| = fl(max |x| n); and fl(x n) * inv = fl(x (n inv)) as inv is a power of
        # two and n * inv stays normal (inv >= 2^-120 for any finite amax): one multiply per value, same bits
        norm = Float32(1.0 / math.sqrt(self.head_dim)) if const_expr(self.cfg.rotate) else None
        left = Int32(0)
        if const_expr(self.cfg.nonfinite):
            # the block max is inf or NaN (the same value in every thread: a uniform branch). Q / K: also from
            # 2^125 / D, as the recipe shifts a token whose finite max m has m D >= 2^126 and the FWHT's max is at
            # least m (|H x|_inf >= |x|_inf): such blocks take the recipe's shift too
            slow = not_below(amax, 2.0 ** 125 / self.head_dim if const_expr(self.cfg.rotate) else math.inf)
            if const_expr(self.cfg.deferred):
                if slow:
                    left = Int32(1)
            elif slow:
                if const_expr(self.cfg.rotate):  # x = the recipe's normalised values: n is not applied again
                    self.rotate_again(x, mX, sSigns, sMean, batch, head, tile, tidx)
                    norm = Float32(1.0)
                amax = self.finite_block(x, red, parity, tile, seqlen, tidx, amax)
        if left == 0:  # always, but for a block ``deferred`` left
            self.scale_store(x, amax, norm, mY, mDescale, batch, head, tile, tidx, sStage)
        return left

    @cute.jit
    def scale_store(self, x: cute.Tensor, amax: Float32, norm, mY: cute.Tensor, mDescale: cute.Tensor, batch: Int32,
                    head: Int32, tile: Int32, tidx: Int32, sStage: cute.Tensor):
        """The block's descale from its amax (mode "block"; "amax": the amax written instead; "given": read), then x
        times its inverse (and n for Q / K: ``norm``, 1 where x is normalised already) as e4m3, stored (through
        sStage, the stage this block was read from, with ``staged_store``)."""
        if const_expr(self.cfg.rotate):
            amax = amax * norm
        if const_expr(self.cfg.mode == "amax"):
            if tidx == 0:
                mDescale[batch, head, tile] = amax
        else:
            if const_expr(self.cfg.mode == "given"):
                field = f32_bits(mDescale[batch, head, tile]) >> 23
            else:
                bits = f32_bits(amax)
                field = ((bits >> 23) & 0xFF) - 8
                if (bits & 0x7FFFFF) > 0x600000:
                    field = field + 1
                field = cutlass.min(cutlass.max(field, 127 + MIN_DESCALE_EXPONENT), 253)
                if (bits & 0x7FFFFFFF) == 0:  # an all-zero block: descale 1, as descale_from_amax
                    field = Int32(127)
                if tidx == 0:
                    mDescale[batch, head, tile] = bits_f32(field << 23)
            inv = bits_f32((254 - field) << 23)
            if const_expr(self.cfg.rotate):
                inv = inv * norm
            for j in cutlass.range_constexpr(self.slots):
                for i in cutlass.range_constexpr(VEC):
                    x[i, j] = x[i, j] * inv
            if const_expr(self.cfg.staged_store):
                self.store_qk_staged(x, mY, sStage, batch, head, tile, tidx)
            elif const_expr(self.cfg.role == "qk"):
                self.store_qk(x, mY, batch, head, tile, tidx)
            else:
                self.store_v_t(x, mY, batch, head, tile, tidx)

    @cute.jit
    def redo_left(self, x: cute.Tensor, mX: cute.Tensor, mY: cute.Tensor, mDescale: cute.Tensor, mMean: cute.Tensor,
                  red: cute.Tensor, sSigns: cute.Tensor, sMean: cute.Tensor, sStage: cute.Tensor, left: Int32,
                  cta: Int32, grid: Int32, total: Int32, heads: Int32, n_tiles: Int32, n_blocks: Int32,
                  n_sample: Int32, tidx: Int32):
        """``deferred``, after the CTA's loop, once it left a block (``finish_block``): the blocks it left again,
        from global memory through the slow path (Q / K: ``rotate_again``, K's mean from mMean; V: ``read_again``;
        then ``finite_block`` and ``scale_store``). ``left``: bit s for the CTA's item s < 31; bit 31 for any item
        from 31 on, whereupon every item from 31 on is redone, overwriting what the loop stored: the slow path gives
        an ordinary block the fast path's outputs (k = 0: x = fl(x n), whose product with the power-of-two inverse
        is the fast path's fl(x (n inv)) but for subnormal products, which e4m3 rounds to 0 either way). The slow
        code lives after the loop, so the loop keeps the registers it has without the slow path. One buffer of each
        kind (the stages are drained): a barrier before each block orders its writes after the last one's reads."""
        seqlen = mX.shape[1]
        cute.arch.cp_async_wait_group(0)
        step = Int32(0)
        for blk in cutlass.range(cta, total, grid, unroll=1):
            batch, head, tile, _ = self.decode(blk, heads, n_tiles, n_blocks, n_sample)
            marked = (left >> cutlass.min(step, 31)) & 1
            step = step + 1
            if marked != 0:  # a block left (with ``kmean``, K's partial-sum items follow the tensor's blocks)
                if blk < n_blocks:
                    cute.arch.barrier()
                    if const_expr(self.cfg.smooth):
                        self.block_mean(sMean, mMean, batch, head, heads, 0, tidx)  # buffer 0, then a barrier
                    norm = None
                    if const_expr(self.cfg.role == "qk" and self.cfg.rotate):
                        self.rotate_again(x, mX, sSigns, sMean[None, 0], batch, head, tile, tidx)
                        norm = Float32(1.0)  # x is normalised
                    else:
                        self.read_again(x, mX, batch, head, tile, tidx)
                        if const_expr(self.cfg.role == "qk"):
                            self.signs_and_smoothing(x, sSigns, sMean[None, 0], tidx)
                    amax = self.finite_block(x, red, 0, tile, seqlen, tidx, Float32(math.inf))
                    self.scale_store(x, amax, norm, mY, mDescale, batch, head, tile, tidx, sStage[None, 0])

    @cute.jit
    def finite_block(self, x: cute.Tensor, red: cute.Tensor, parity: Int32, tile: Int32, seqlen: Int32, tidx: Int32,
                     amax: Float32) -> Float32:
        """``nonfinite``'s slow path, for a block whose max is inf or NaN (the torch recipe's ``_amax_blocks`` /
        ``_to_e4m3``): each inf becomes NaN (e4m3 NaN after the conversion, not a saturated 448; a NaN is skipped by
        fmax), and (modes "block" / "amax") the block max is taken again by the fast path's own code (``thread_max``,
        then ``block_max``): over the finite values of the block's existing tokens. A barrier first (every thread has read
        the maxima of ``parity``); ``block_max``'s barrier after; the next write of that buffer is two items on, after
        the next item's barrier. Mode "given" keeps its descale: only the infs change. Tail tokens (not stored; V's
        are zeros) may become NaN: nothing reads them. Reusing ``thread_max`` keeps the fast path's loop as it was
        (sm_90a: +1 to +5 instructions per block and thread; a separate finite-max loop cost +19 to +43)."""
        for j in cutlass.range_constexpr(self.slots):
            for i in cutlass.range_constexpr(VEC):
                if cute.arch.fmax(x[i, j], -x[i, j]) == Float32(math.inf):
                    x[i, j] = Float32(math.nan)
        out = amax
        if const_expr(self.cfg.mode != "given"):
            cute.arch.barrier()
            out = self.block_max(self.thread_max(x, tile, seqlen, tidx), red, parity, tidx)
        return out

    @cute.jit
    def thread_max(self, x: cute.Tensor, tile: Int32, seqlen: Int32, tidx: Int32, nan: bool = False) -> Float32:
        """max |x| over the thread's values of the block's existing tokens (fmax: a NaN is skipped; ``nan``: a NaN
        wins)."""
        amax = Float32(0.0)
        for j in cutlass.range_constexpr(self.slots):
            if tile * self.cfg.rows + self.token_of(tidx, j) < seqlen:
                for i in cutlass.range_constexpr(VEC):
                    amax = cute.arch.fmax(amax, cute.arch.fmax(x[i, j], -x[i, j]), nan=nan)
        return amax

    @cute.jit
    def store_qk(self, x: cute.Tensor, mY: cute.Tensor, batch: Int32, head: Int32, tile: Int32, tidx: Int32):
        """e4m3 (saturating) of the thread's token, one 16-byte store per chunk."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float8E4M3FN, num_bits_per_copy=128)
        y8 = self.e4m3_slots(x, tidx)
        tok = tile * self.cfg.rows + self.token_of(tidx, 0)
        if tok < mY.shape[1]:
            for j in cutlass.range_constexpr(self.slots):
                dst = cute.local_tile(mY[batch, tok, head, None], (VEC,), (self.chunk_of(tidx, j),))
                cute.copy(atom, cute.zipped_divide(y8[None, j], (VEC,)), cute.zipped_divide(dst, (VEC,)))

    @cute.jit
    def store_qk_staged(self, x: cute.Tensor, mY: cute.Tensor, sStage: cute.Tensor, batch: Int32, head: Int32,
                        tile: Int32, tidx: Int32):
        """``staged_store``: e4m3 (saturating) of the thread's token into the stage it was read from (every
        thread read its values before ``block_max``'s barrier, and the stage is refilled only after the next
        item's barrier), 16 bytes per chunk at ``store_unit``; a barrier; then thread t stores units t + r *
        threads (``store_map``, r = 0..3) of the block to global memory: a warp 512 contiguous bytes of whole
        token rows. Tokens past seqlen are not stored."""
        D, T = self.head_dim, self.num_threads
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float8E4M3FN, num_bits_per_copy=128)
        y8 = self.e4m3_slots(x, tidx)
        sY = cute.make_tensor(cute.recast_ptr(sStage.iterator, dtype=cutlass.Float8E4M3FN),
                              cute.make_layout(self.cfg.rows * store_pitch(D, self.slots) * VEC))
        for j in cutlass.range_constexpr(self.slots):
            sDst = cute.local_tile(sY, (VEC,), (store_unit(D, tidx, j, self.slots),))
            cute.copy(atom, cute.zipped_divide(y8[None, j], (VEC,)), cute.zipped_divide(sDst, (VEC,)))
        cute.arch.barrier()
        # thread t's 4 units (8 with ``wide``): token t / (D / 16) + r rows / slots, chunk t % (D / 16)
        # (``store_map``): one shared and one global address, then constant steps
        pitch, step = store_pitch(D, self.slots), self.cfg.rows // self.slots
        row0, chunk, unit0 = store_map(D, T, tidx, 0, self.slots)
        tok0 = tile * self.cfg.rows + row0
        first = cute.local_tile(mY[batch, tok0, head, None], (VEC,), (chunk,))
        gDst = cute.make_tensor(first.iterator, cute.make_layout((VEC, self.slots), stride=(1, step * mY.stride[1])))
        sSrc = cute.make_tensor(cute.local_tile(sY, (VEC,), (unit0,)).iterator,
                                cute.make_layout((VEC, self.slots), stride=(1, step * pitch * VEC)))
        out = cute.make_rmem_tensor(VEC, cutlass.Float8E4M3FN)  # one unit at a time: 4 registers live, not 16
        for r in cutlass.range_constexpr(self.slots):
            if tok0 + r * step < mY.shape[1]:
                cute.copy(atom, cute.zipped_divide(sSrc[None, r], (VEC,)), cute.zipped_divide(out, (VEC,)))
                cute.copy(atom, cute.zipped_divide(out, (VEC,)), cute.zipped_divide(gDst[None, r], (VEC,)))

    @cute.jit
    def store_v_t(self, x: cute.Tensor, mVt: cute.Tensor, batch: Int32, head: Int32, tile: Int32, tidx: Int32):
        """V: per channel, the e4m3 bytes of the thread's 4 tokens are positions 4t .. 4t + 3 of their group
        in v_t (layout.v_token_order): one 32-bit store each, a warp's 32 quads 128 contiguous bytes."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float8E4M3FN, num_bits_per_copy=32)
        y8 = cute.make_rmem_tensor(cute.make_layout((VEC, SLOTS), stride=(SLOTS, 1)), cutlass.Float8E4M3FN)
        y8.store(x.load().to(cutlass.Float8E4M3FN))
        quad = tidx % self.quads
        if tile * self.cfg.rows + 16 * (quad // 4) < mVt.shape[3]:  # the group exists in v_t (padded to 16)
            c0 = self.chunk_of(tidx, 0) * VEC
            for i in cutlass.range_constexpr(VEC):
                dst = cute.local_tile(mVt[batch, head, c0 + i, None], (SLOTS,), (tile * self.quads + quad,))
                cute.copy(atom, cute.zipped_divide(y8[i, None], (SLOTS,)), cute.zipped_divide(dst, (SLOTS,)))
