"""The CuTe DSL kernel of the fa3-fp8 backend, ``FlashAttention3Fp8Sm90`` (the algorithm and its switches:
``fa_variants.hopper.fa3_fp8``'s docstring; FP8 after the FA3 paper, Shah et al. 2024, section 3.3). Imported only
to compile (``hopper.fa3_fp8._build``). It holds:

    acc_as_fp8_operand_a   the fp32 S accumulator viewed as the k32 e4m3 A operand of the P V WGMMA
    _Fp8StepContext        fa3's mainloop steps (``hopper.fa3_mainloop._StepContext``) with the FP8 hooks: per-tile
                           descales, e4m3 P, two-level accumulation, the head_dim 256 lookahead loop
    FlashAttention3Fp8Sm90 fa3's kernel (``hopper.fa3_kernel.FlashAttention3Sm90``) with FP8 operands: K-major V,
                           the P V MMA, the step context
    FlashAttention3Fp8Sm90Persistent, FlashAttention3Fp8Sm90Balanced
                           the same on fa3's persistent grid (static order, or the host's balanced tile table)

The kernel class stays in this module (the DSL names a kernel after its object's module and class). Follows
(ideas, not code) Dao-AILab/flash-attention hopper/ (the FP8 P shift and descale placement of the released
kernel), NVIDIA/cutlass examples/python/CuTeDSL hopper FMHA (pre-transposed FP8 V).
"""

import math
import dataclasses
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from fa_variants.common.config import WGMMA_M
from fa_variants.common.layout import rows_cols as acc_rows_cols
from fa_variants.common.scale import FFMA_LIMIT, FLOAT32_TINY
from fa_variants.common.sm90 import make_tiled_mma, wgmma
from fa_variants.common.softmax import OnlineSoftmax, not_below
from fa_variants.fp8 import layout
from fa_variants.fp8.emulation import UNIT_SPAN
from fa_variants.hopper.fa3_fp8 import P_SHIFT, Fp8Config, max_score
from fa_variants.hopper.fa3_kernel import FlashAttention3Sm90
from fa_variants.hopper.fa3_mainloop import _StepContext


def acc_as_fp8_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """View an fp32 accumulator ((2, 2, V), M, 1) (columns 8v + 2t + c) as the k32 8-bit A operand
    ((4, 2, 2), M, V / 4) of a WGMMA whose K is the accumulator's N, value by value: A position
    (j, r, h) of k-block kb is the thread's accumulator value c = j % 2, v = 4 kb + 2 h + j // 2.
    The thread's values are not at the k positions the A fragment names (module docstring): this is
    exact only for a B operand whose K order is ``fa_variants.fp8.layout.v_token_order``."""
    c = cute.make_layout(acc.layout.shape)  # column-major, same shape
    v = c.shape[0][2]
    if const_expr(v % 4 != 0 or c.shape[2] != 1):
        raise ValueError(f"accumulator {acc.layout} cannot feed a k32 WGMMA (needs N % 32 == 0, one N tile)")
    sc, sr, sv = c.stride[0]
    frg = cute.make_layout((((2, 2), 2, 2), c.shape[1], v // 4),
                           stride=(((sc, sv), sr, 2 * sv), c.stride[1], 4 * sv))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, frg))


@dataclass(frozen=True)
class _Fp8StepContext(_StepContext):
    """The fa3 mainloop steps with FP8 hooks: per-tile scales, e4m3 P, two-level accumulation."""

    acc_tmp: cute.Tensor = None  # one tile's P V (one slice of d when pv_split > 1), or one interval's
    acc_tmp2: cute.Tensor = None  # the second slice buffer (pv_buffers = 2)
    qk_scale: Float32 = None  # q_descale[Q block of this warpgroup] * softmax_scale * log2 e
    k_descale: cute.Tensor = None  # (n_kv_blocks,) of this (batch, kv head)
    v_descale: cute.Tensor = None
    tiles_in_tmp: cute.Tensor = None  # (1,) Int32: tiles accumulated in acc_tmp since the last promotion
    o_alpha: cute.Tensor = None  # per row: product of the alphas O has not been multiplied by yet
    descales: cute.Tensor = None  # descale_prefetch: (2,) Float32, k_descale of the next tile, v_descale of this one
    vmax: cute.Tensor = None  # bounded_units: (1,) Float32, M the largest v_descale visited (0 before the first)

    def softmax_step(self, acc_S, n_block, is_first: bool = False):
        # descale_prefetch: after the first tile the previous P V issue loaded this tile's k_descale (``pv``)
        kd = self.descales[0] if const_expr(self.k.cfg.descale_prefetch and not is_first) else self.k_descale[n_block]
        return self.softmax.update(acc_rows_cols(acc_S), is_first, tile_scale_log2=self._tile_scale(kd))

    def hoists_huge_check(self) -> bool:
        return self.k.cfg.huge_hoisted

    @cute.jit
    def huge_possible(self, n_start: Int32, n_blocks: Int32) -> cutlass.Boolean:
        """``Fp8Config.huge_hoisted``: whether a row max of this warpgroup may reach FFMA_LIMIT in log2 units on any of
        its K/V tiles n_start .. n_start + n_blocks - 1, i.e. c_n ``max_score`` >= FFMA_LIMIT for some tile (c_n =
        ``_tile_scale``, the value both loops use: never NaN, its fmax turns a NaN product into FLOAT32_TINY; inf
        counts as possible). Each warp reads the tiles' k_descale, a lane every 32nd tile, and
        votes; the descales are the same for every warp of the warpgroup, so all four reach the same answer and take
        the same K/V loop (the WGMMAs are warpgroup-wide). |m| <= max_n c_n |S_n| <= max_n c_n ``max_score``, so
        where this is False no tile needs the check and the loop without it gives the same values."""
        bound = self.k._max_score()
        lane = cute.arch.lane_idx()
        possible = False
        for i in cutlass.range(lane, n_blocks, 32, unroll=1):
            possible = possible or not_below(self._tile_scale(self.k_descale[self.k._tile(n_start, i)]) * bound,
                                             FFMA_LIMIT)
        return cute.arch.vote_any_sync(possible)

    def without_huge_check(self) -> "_Fp8StepContext":
        """This context with the softmax twin that skips the huge-logit check (``huge_possible`` was False)."""
        return dataclasses.replace(self, softmax=self.softmax.without_huge_check())

    def _tile_scale(self, k_descale):
        """c_n = q_descale k_descale[n] softmax_scale log2 e of this tile, floored at the smallest normal float32: a
        zero softmax_scale must give the mean of V, not -inf * 0 = NaN."""
        return cute.arch.fmax(self.qk_scale * k_descale, Float32(FLOAT32_TINY))

    def _prefetch_descales(self, n_block):
        """descale_prefetch, before tile n_block's P V GEMM: v_descale[n_block] (its promotion) and k_descale of the
        tile walked next, n_block - 1 (the next softmax; tile 0 reloads its own, unused)."""
        if const_expr(self.k.cfg.descale_prefetch):
            self.descales[1] = self.v_descale[n_block]
            self.descales[0] = self.k_descale[cutlass.max(n_block - 1, 0)]

    def _v_descale(self, n_block):
        """v_descale[n_block]: from the register ``_prefetch_descales`` filled, or read here."""
        return self.descales[1] if const_expr(self.k.cfg.descale_prefetch) else self.v_descale[n_block]

    def to_p(self, acc_S):
        """fp32 P -> e4m3 A operand in registers (RNE, satfinite; pairs packed in-thread)."""
        self.tOrP.store(acc_as_fp8_operand_a(self._one_n_tile(acc_S)).load().to(cutlass.Float8E4M3FN))

    def _one_n_tile(self, acc_S):
        """acc_S as one N tile: with ``s_halves`` ((2, 2, V), 1, 2) -> ((2, 2, 2V), 1, 1) (contiguous N tiles)."""
        if const_expr(self.k.cfg.s_halves):
            v = acc_S.layout.shape[0][2] * acc_S.layout.shape[2]
            acc_S = cute.make_tensor(acc_S.iterator, cute.make_layout(((2, 2, v), 1, 1)))
        return acc_S

    def _interval(self) -> bool:
        return self.k.cfg.two_level and self.k.cfg.promote_every > 1

    def rescale_o(self, alpha, n_block):
        if const_expr(self._interval()):
            self._rescale_interval(alpha, n_block)
        else:
            if const_expr(not self.k.cfg.two_level):  # O is kept in units of the current tile's v_descale
                ratio = self.v_descale[n_block + 1] / self.v_descale[n_block]
                for r in range(cute.size(alpha)):
                    alpha[r] = alpha[r] * ratio
            # skip_unit_rescale: no multiply when every factor of the thread is exactly 1 (the promotion is then
            # one FFMA per element, O + v_descale tmp, instead of alpha O + v_descale tmp)
            self.softmax.rescale(acc_rows_cols(self.acc_O), alpha, skip_ones=True)

    @cute.jit
    def _rescale_interval(self, alpha: cute.Tensor, n_block: Int32):
        """promote_every > 1: O's alphas are multiplied up and applied at the promotion; the temporary,
        while it holds tiles, is rescaled like a single accumulator (units of the current v_descale)."""
        o_alpha, t = self.o_alpha, acc_rows_cols(self.acc_tmp)
        for r in cutlass.range_constexpr(cute.size(alpha)):
            o_alpha[r] = o_alpha[r] * alpha[r]
        ratio = self.v_descale[n_block + 1] / self.v_descale[n_block]
        if self.tiles_in_tmp[0] != 0:
            for r in cutlass.range_constexpr(cute.size(t, mode=[0])):
                f = alpha[r] * ratio
                for c in cutlass.range_constexpr(cute.size(t, mode=[1])):
                    t[r, c] = t[r, c] * f

    def _v_slice(self, stage, h: int):
        """The B operand (MMA, 1, K) of slice h of head_dim."""
        b = self.tOrV[None, h, None, stage]
        return cute.make_tensor(b.iterator, cute.make_layout((b.shape[0], 1, b.shape[1]), stride=(b.stride[0], 0, b.stride[1])))

    def _promote(self, h: int, n_block, tmp=None):
        """O[:, slice h] += v_descale[n_block] * tmp."""
        self._promote_slice(h, self._v_descale(n_block), self.acc_tmp if tmp is None else tmp)

    def _promote_slice(self, h: int, vd: Float32, tmp: cute.Tensor):
        """O[:, slice h] += vd * tmp (vd: the tile's v_descale, already in a register)."""
        o = self.acc_O[None, None, h]
        for i in range(cute.size(tmp)):
            o[i] = o[i] + vd * tmp[i]

    @cute.jit
    def _fold_interval(self, n_block: Int32):
        """promote_every > 1: count the tile; every promote_every tiles and after the last (tile 0):
        O = o_alpha O + v_descale[n_block] tmp (rows view), then o_alpha = 1 and the temporary restarts."""
        count, o_alpha, every = self.tiles_in_tmp, self.o_alpha, self.k.cfg.promote_every
        o, t = acc_rows_cols(self.acc_O), acc_rows_cols(self.acc_tmp)
        vd = self._v_descale(n_block)
        count[0] = count[0] + 1
        if count[0] == every or n_block == 0:
            for r in cutlass.range_constexpr(cute.size(o, mode=[0])):
                for c in cutlass.range_constexpr(cute.size(o, mode=[1])):
                    o[r, c] = o[r, c] * o_alpha[r] + vd * t[r, c]
                o_alpha[r] = 1.0
            count[0] = 0

    def pv(self, v_state, n_block, wait: int):
        cfg = self.k.cfg
        early = const_expr(cfg.early_pv_arrive)  # hand the ping-pong turn on right after the last issue
        last = cfg.pv_split - 1
        self._prefetch_descales(n_block)
        if const_expr(not cfg.two_level):
            wgmma(self.mma_pv, self.acc_O, self.tOrP, self._v_slice(v_state.index, 0), wait=-1 if early else wait)
        elif const_expr(self._interval()):  # the first tile of an interval overwrites the temporary
            wgmma(self.mma_pv, self.acc_tmp, self.tOrP, self._v_slice(v_state.index, 0),
                  accumulate=self.tiles_in_tmp[0] != 0, wait=-1 if early else wait)
        elif const_expr(cfg.pv_split == 1):
            wgmma(self.mma_pv, self.acc_tmp, self.tOrP, self._v_slice(v_state.index, 0), zero_init=True,
                  wait=-1 if early else wait)
        elif const_expr(cfg.pv_buffers == 1):
            for h in range(cfg.pv_split):
                wgmma(self.mma_pv, self.acc_tmp, self.tOrP, self._v_slice(v_state.index, h), zero_init=True,
                      wait=-1 if early and h == last else 0)
                if const_expr(early and h == last):
                    self.pv_issued(0)
                self._promote(h, n_block)
            return
        else:  # two buffers: slice h on the tensor cores while slice h - 1 is promoted
            bufs = (self.acc_tmp, self.acc_tmp2)
            for h in range(cfg.pv_split):
                wgmma(self.mma_pv, bufs[h % 2], self.tOrP, self._v_slice(v_state.index, h), zero_init=True,
                      wait=-1 if h == 0 or (early and h == last) else 1)
                if const_expr(early and h == last):
                    self.pv_issued(1)
                if h > 0:
                    self._promote(h - 1, n_block, bufs[(h - 1) % 2])
            warpgroup.wait_group(0)
            self._promote(last, n_block, bufs[last % 2])
            return
        if const_expr(early):
            self.pv_issued(wait)

    # ----- bounded_units: O in units u = max(v_descale[n], M 2^-UNIT_SPAN) (fp8.emulation.bounded_unit) -------------

    def _unit(self, vd: Float32, vmax: Float32) -> Float32:
        """O's unit after a tile of v_descale vd, vmax the largest v_descale visited up to it (that tile
        included): u = max(vd, vmax 2^-UNIT_SPAN) (``fp8.emulation.bounded_unit``). Only M is carried from tile to
        tile (one register): the previous tile's unit is recomputed from its v_descale, as fused_promote reads it."""
        return cute.arch.fmax(vd, vmax * Float32(2.0 ** -UNIT_SPAN))

    def fold_pv(self, n_block):
        if const_expr(self._interval()):
            self._fold_interval(n_block)
        elif const_expr(self.k.cfg.two_level and self.k.cfg.pv_split == 1):
            self._promote(0, n_block)

    # ----- s_lookahead (head_dim 256): the next S GEMM issued before the last P V slice is promoted ---------------

    @cute.jit
    def lookahead_loop(self, k_state, v_state, n_blocks: Int32, n_masked: Int32, n_free: Int32, safe=None):
        """The consumer's main loop with ``s_lookahead``: tiles n_blocks - 1 .. 0 as the serial steps walk them
        (the first masked at seqlen_k, the next n_masked on the causal diagonal, the rest free). The S GEMM of
        the first tile is issued in a turn of its own; every later S GEMM is issued by the step of the tile
        before it (``_lookahead_step``). Tile 0 takes the causal mask whenever the problem is causal (a no-op on
        a free tile), so that the steps with and without a next S GEMM are each compiled once per mask kind. The
        first tile takes the softmax's general update too, against the reset state (m = -inf, l = 0, O = 0): alpha =
        exp2(-inf) = 0, so P, l and O get the same bits as with the first-tile update, whose code (with s_halves)
        spills 29 registers' worth; a row that sees no key keeps m = -inf as before. Returns (k_state, v_state)
        advanced past this tile's K/V tiles (the persistent grid carries them to its next tile). ``safe``: fa3's
        ``_free_tiles`` (huge_hoisted)."""
        last = n_blocks - 1
        acc_S = self._lookahead_scores()
        self.schedule_sync()
        self.pipe_k.consumer_wait(k_state)
        wgmma(self.mma_qk, acc_S, self.tSrQ, self.tSrK[None, None, None, k_state.index], zero_init=True, wait=-1)
        self.schedule_arrive()
        causal = self.k.causal
        if n_blocks == 1:
            k_state, v_state = self._lookahead_step(acc_S, k_state, v_state, last, causal, True, False)
        else:
            k_state, v_state = self._lookahead_step(acc_S, k_state, v_state, last, causal, True, True)
            for i in cutlass.range(last - cutlass.max(n_free, 1), unroll=1):  # masked tiles but tile 0
                k_state, v_state = self._lookahead_step(acc_S, k_state, v_state, last - 1 - i, True, False, True)
            k_state, v_state = self.k._free_tiles(  # free tiles but tile 0 (huge_hoisted: ``safe``)
                self, safe, k_state, v_state, cutlass.max(n_free, 1) - 1,
                lambda c, ks, vs, i: c._lookahead_step(acc_S, ks, vs, n_free - 1 - i, False, False, True))
            k_state, v_state = self._lookahead_step(acc_S, k_state, v_state, 0, causal, False, False)
        return k_state, v_state

    def _lookahead_scores(self) -> cute.Tensor:
        """S's accumulator for ``lookahead_loop``: the first temporary's registers when S has its size (tile_n 64
        with pv_split 4: both 64 x 64 fp32, 32 registers a thread): S is issued right after the slice held there
        was promoted and is turned into P before the next tile's first slice overwrites it, so the two never live
        together (ptxas gives separate loop-carried accumulators separate registers: 32 more, and spills)."""
        acc_S = self.new_scores()
        if const_expr(self.k.cfg.s_halves):  # the two temporaries, one allocation (_step_context)
            acc_S = cute.make_tensor(self.acc_tmp.iterator, acc_S.layout)
        elif const_expr(cute.size(acc_S) == cute.size(self.acc_tmp) and acc_S.layout == self.acc_tmp.layout):
            acc_S = cute.make_tensor(self.acc_tmp.iterator, acc_S.layout)
        return acc_S

    def _k_half(self, stage, j: int):
        """The B operand (MMA, 1, K) of half j of the K tile (``s_halves``)."""
        b = self.tSrK[None, j, None, stage]
        return cute.make_tensor(b.iterator, cute.make_layout((b.shape[0], 1, b.shape[1]), stride=(b.stride[0], 0, b.stride[1])))

    @cute.jit
    def _lookahead_step(self, acc_S: cute.Tensor, k_state, v_state, n_block: Int32, causal: cutlass.Constexpr[bool],
                        seqlen_end: cutlass.Constexpr[bool], has_next: cutlass.Constexpr[bool]):
        """Tile n_block, its S GEMM in flight in acc_S: wait for it, softmax, O *= alpha, P to e4m3; then in the
        ping-pong turn the P V slices (two temporaries: slice h + 1 runs while slice h is promoted, as ``pv``),
        and after the last slice's issue the S GEMM of tile n_block - 1 (``has_next``) into acc_S, whose fp32 P
        is dead by then; the turn is handed on and the last slice is promoted while the S GEMM runs. Registers
        at the peak: O (head_dim / 2), P (tile_n / 8), one temporary (head_dim / 2 / pv_split), S (tile_n / 2).
        Same roundings as the serial steps (the emulation's order). Returns (k_state, v_state)."""
        warpgroup.wait_group(0)  # S of this tile (the last P V slice before it was waited for already)
        self.pipe_k.consumer_release(k_state)
        k_state.advance()
        self.mask(acc_S, n_block, causal=causal, seqlen_end=seqlen_end)
        alpha = self.softmax_step(acc_S, n_block)  # the first tile too (lookahead_loop)
        fused = const_expr(self.k.cfg.fused_promote)
        plain = True  # bounded_units: False where O's unit is not this tile's v_descale (_units_alpha)
        if const_expr(fused):  # O *= alpha folded into the promotions, O in units of v_descale (units_alpha)
            alpha, plain = self._units_alpha(alpha, n_block, seqlen_end)
        else:
            self.rescale_o(alpha, n_block)
        self.to_p(acc_S)
        # v_descale read once a tile, before the turn (loaded by the first promotion; read per promotion, ptxas reloads
        # it after every WGMMA fence and barrier)
        vd = self.v_descale[n_block]
        self.pipe_v.consumer_wait(v_state)
        if const_expr(has_next):
            self.pipe_k.consumer_wait(k_state)
        self.schedule_sync()
        if const_expr(self.k.cfg.bounded_units and not seqlen_end):  # (the first visited tile: u = v_descale)
            # one branch per tile, before the turn's first WGMMA: O's unit u is v_descale (s = 1: the fused turn)
            # except behind a descale over 2^UNIT_SPAN larger (u = M 2^-UNIT_SPAN, s = v_descale / u <= 1); the
            # turn is compiled for both
            if plain:
                self._pv_turn(acc_S, k_state, v_state, vd, alpha, seqlen_end, has_next, None)
            else:  # (v_descale read again here: not kept live across the softmax for the rare path)
                vmax = self.vmax[0]  # u = vmax 2^-UNIT_SPAN here
                self._pv_turn(acc_S, k_state, v_state, vd, alpha, seqlen_end, has_next,
                              self.v_descale[n_block] / (vmax * Float32(2.0 ** -UNIT_SPAN)))
        else:
            self._pv_turn(acc_S, k_state, v_state, vd, alpha, seqlen_end, has_next, None)
        self.pipe_v.consumer_release(v_state)
        v_state.advance()
        return k_state, v_state

    def _pv_turn(self, acc_S: cute.Tensor, k_state, v_state, vd: Float32, alpha: cute.Tensor,
                 seqlen_end: bool, has_next: bool, s):
        """The ping-pong turn of ``_lookahead_step`` (after its schedule_sync): the P V slices, slice h promoted
        while slice h + 1 runs, S of the next tile (``has_next``) issued after the last slice, the turn handed on,
        the last slice promoted. s: None, or (``bounded_units``, the rare path) the Float32 v_descale / u that
        scales each temporary in its promotion (``_promote_step``)."""
        bufs = (self.acc_tmp, self.acc_tmp2)
        last = self.k.cfg.pv_split - 1
        for h in range(self.k.cfg.pv_split):  # (not cute.jit: Python loops unroll)
            wgmma(self.mma_pv, bufs[h % 2], self.tOrP, self._v_slice(v_state.index, h), zero_init=True,
                  wait=-1 if h == 0 else 1)
            if const_expr(h > 0):
                self._promote_step(h - 1, vd, alpha, bufs[(h - 1) % 2], seqlen_end, s)
        if const_expr(self.k.cfg.s_halves):  # S half 0 in the free temporary, the last slice promoted under it, half 1
            if const_expr(has_next):
                wgmma(self.mma_qk, bufs[0], self.tSrQ, self._k_half(k_state.index, 0), zero_init=True, wait=-1)
            warpgroup.wait_group(1 if has_next else 0)
            self._promote_step(last, vd, alpha, bufs[last % 2], seqlen_end, s)
            if const_expr(has_next):
                wgmma(self.mma_qk, bufs[1], self.tSrQ, self._k_half(k_state.index, 1), zero_init=True, wait=-1)
            self.schedule_arrive()
        else:
            if const_expr(has_next):
                wgmma(self.mma_qk, acc_S, self.tSrQ, self.tSrK[None, None, None, k_state.index], zero_init=True, wait=-1)
            self.schedule_arrive()
            warpgroup.wait_group(1 if has_next else 0)  # the last slice (S of the next tile may still run)
            self._promote_step(last, vd, alpha, bufs[last % 2], seqlen_end, s)

    def _units_alpha(self, alpha: cute.Tensor, n_block: Int32, first: cutlass.Constexpr[bool]):
        """``fused_promote``: alpha v_descale[n_block + 1] / v_descale[n_block] per row (O's units move from the tile
        visited before, n_block + 1, to this one); the first visited tile keeps alpha (O = 0 there). With
        ``bounded_units`` alpha u_prev / u (both from ``_unit``), M kept for the next tile. Returns (alpha,
        plain): plain False where u = M 2^-UNIT_SPAN (the rare path: the turn's copy that scales the temporaries by
        s = v_descale / u, which may still be 1 there), else True (a Python bool without bounded_units and on the
        first visited tile)."""
        plain = True
        if const_expr(self.k.cfg.bounded_units):  # alpha u_prev / u; M kept for the next tile
            vd = self.v_descale[n_block]
            vmax = cute.arch.fmax(self.vmax[0], vd)
            if const_expr(not first):
                u = self._unit(vd, vmax)
                ratio = self._unit(self.v_descale[n_block + 1], self.vmax[0]) / u
                for r in range(cute.size(alpha)):
                    alpha[r] = alpha[r] * ratio
                plain = u != vmax * Float32(2.0 ** -UNIT_SPAN)  # u = vd; else (rare) vd / u may still be 1
            self.vmax[0] = vmax
        elif const_expr(not first):
            ratio = self.v_descale[n_block + 1] / self.v_descale[n_block]
            for r in range(cute.size(alpha)):
                alpha[r] = alpha[r] * ratio
        return alpha, plain

    def _promote_step(self, h: int, vd: Float32, alpha: cute.Tensor, tmp: cute.Tensor, first: bool, s=None):
        """Slice h's promotion in the lookahead steps: O += vd tmp, or with ``fused_promote`` O = alpha' O + tmp (rows
        view: slice h is columns [h w, (h + 1) w) of O's rows, w the temporary's columns), or with ``bounded_units``
        on its rare path (s, a Float32: v_descale / u) O = alpha' O + s tmp. On the first visited tile (``first``)
        O is 0 and alpha finite: O = tmp, the same bits, without keeping alpha live across the turn (which spilled
        80 bytes in that step)."""
        if const_expr(not self.k.cfg.fused_promote):
            self._promote_slice(h, vd, tmp)
        elif const_expr(first):
            o = self.acc_O[None, None, h]
            for i in range(cute.size(tmp)):
                o[i] = tmp[i]
        else:
            o, t = acc_rows_cols(self.acc_O), acc_rows_cols(tmp)
            w = cute.size(t, mode=[1])
            for r in range(cute.size(t, mode=[0])):
                for c in range(w):
                    x = t[r, c] if const_expr(s is None) else s * t[r, c]
                    o[r, h * w + c] = cute.math.fma(alpha[r], o[r, h * w + c], x)

    def finalize(self):
        inv_l, lse = self.softmax.finalize()
        if const_expr(not self.k.cfg.two_level or self.k.cfg.fused_promote):
            vd = self.v_descale[0]  # the last tile's units
            if const_expr(self.k.cfg.bounded_units):
                vd = self._unit(vd, self.vmax[0])
            for r in range(cute.size(inv_l)):
                inv_l[r] = inv_l[r] * vd
        self.softmax.rescale(acc_rows_cols(self.acc_O), inv_l)
        return lse


class FlashAttention3Fp8Sm90(FlashAttention3Sm90):
    """FA3 forward with e4m3 Q, K, V and block descales; see the module docstring.

    ``__call__`` (host, traced once per config) takes q8 (B, Nq, H, D) and k8 (B, Nk, Hkv, D) e4m3,
    v_t8 e4m3 (B, Hkv, D, Nk_padded) (tokens permuted by ``layout.v_token_order``, padding zero),
    out (B, Nq, H, D) 16-bit, lse float32 (B, H, Nq), q_descale float32 (B, H, cdiv(Nq, TILE_M)),
    k_descale and v_descale float32 (B, Hkv, cdiv(Nk, tile_n)), the scalar softmax_scale * log2(e) >= 0,
    l2_heads, and the stream. TMA needs 16-byte strides (head_dim % 16 == 0 for e4m3).
    """

    def __init__(self, out_dtype, head_dim: int, causal: bool, config: Fp8Config):
        super().__init__(cutlass.Float8E4M3FN, head_dim, causal, config)
        self.out_dtype = out_dtype

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mVt: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 mQd: cute.Tensor, mKd: cute.Tensor, mVd: cute.Tensor, softmax_scale_log2: Float32,
                 l2_heads: Int32, stream: cuda.CUstream):
        self.launch(mQ, mK, mVt, mO, mLSE, softmax_scale_log2, l2_heads, (mQd, mKd, mVd), stream)

    # ----- hooks ----------------------------------------------------------------------------------

    def _make_mma_pv(self) -> cute.TiledMma:
        mma = make_tiled_mma(self.dtype, self.num_wg, self.head_dim // self.cfg.pv_split, b_mn_major=False, a_in_registers=True)
        op = mma.op
        for name in ("a_major_mode", "b_major_mode"):  # FP8 WGMMA has no transpose: both K-major
            mode = getattr(op, name, None)
            if mode is not None and str(mode).split(".")[-1].upper() != "K":
                raise ValueError(f"fa3-fp8: the FP8 P V WGMMA needs K-major operands, got {name}={mode}")
        return mma

    def _qk_mma_n(self) -> int:
        return self.tile_n // 2 if const_expr(self.cfg.s_halves) else self.tile_n

    def _v_view(self, mVt: cute.Tensor) -> cute.Tensor:
        # (batch, heads_kv, head_dim, tokens) -> (head_dim, tokens, heads_kv, batch)
        return cute.make_tensor(mVt.iterator, cute.select(mVt.layout, mode=[2, 3, 1, 0]))

    def _v_tile(self) -> tuple:
        return (self.head_dim, self.tile_n)

    def _v_tiles(self, mV: cute.Tensor) -> cute.Tensor:
        return cute.local_tile(mV, self._v_tile(), (0, None))

    def _v_operand(self, sV: cute.Tensor) -> cute.Tensor:
        return sV  # (head_dim, tokens, stage) = (N, K, stage), K-major

    def _make_softmax(self, num_rows: int, scale_log2: Float32):
        return OnlineSoftmax(num_rows, scale_log2, chains=self.cfg.reduce_chains, skip_unit_rescale=self.cfg.skip_unit_rescale,
                             tile_scales=True, p_shift=P_SHIFT,
                             huge_per_row=self._huge_per_row(), score_bound=self._score_bound())

    def _huge_per_row(self) -> bool:
        """The softmax's huge-logit branch per row (``Fp8Config.huge_per_row``; descale_prefetch needs it too)."""
        return self.cfg.huge_per_row or self.cfg.descale_prefetch

    def _score_bound(self) -> float:
        """The guard of the softmax's huge-logit check (``OnlineSoftmax.score_bound``; ``Fp8Config.huge_guard``): the
        largest |S| of e4m3 operands with a margin (``_max_score``); inf (every tile checked) without huge_guard
        or with the check per row (both paths live at once spill at head_dim 256: CPU compile, session 27)."""
        guarded = self.cfg.huge_guard and not self._huge_per_row()  # (Fp8Config.check refuses it with huge_hoisted)
        return self._max_score() if guarded else math.inf

    def _max_score(self) -> float:
        """``hopper.fa3_fp8.max_score``: the largest |S| of e4m3 operands, with a margin for the MMA's rounding."""
        return max_score(self.head_dim)

    def _step_context(self, args: tuple, extras: tuple, m_block: Int32, head: Int32, batch: Int32):
        mQd, mKd, mVd = extras
        kv_head = head // (mQd.shape[1] // mKd.shape[1])
        mma_pv = args[3]
        wg_pv = mma_pv.get_slice(0)
        tmp_shape = wg_pv.partition_shape_C((self.tile_m, self.head_dim // self.cfg.pv_split))
        if const_expr(self.cfg.s_halves and self.cfg.s_lookahead):  # both temporaries in S's registers
            pair = cute.make_rmem_tensor(args[2].get_slice(0).partition_shape_C((self.tile_m, self.tile_n)), Float32)
            tmp, tmp2 = (cute.make_tensor(pair.iterator + j * cute.size(tmp_shape), cute.make_layout(tmp_shape)) for j in (0, 1))
        else:
            tmp = cute.make_rmem_tensor(tmp_shape, Float32)
            tmp2 = cute.make_rmem_tensor(tmp_shape, Float32) if const_expr(self.cfg.pv_buffers == 2) else None
        softmax, wg = args[11], args[1]
        tiles_in_tmp, o_alpha = None, None
        if const_expr(self.cfg.two_level and self.cfg.promote_every > 1):
            tiles_in_tmp = cute.make_rmem_tensor(1, Int32)
            tiles_in_tmp.fill(0)
            o_alpha = cute.make_rmem_tensor(softmax.num_rows, Float32)
            o_alpha.fill(1.0)
        descales = cute.make_rmem_tensor(2, Float32) if const_expr(self.cfg.descale_prefetch) else None
        vmax = None
        if const_expr(self.cfg.bounded_units):  # M = 0 before the first visited tile (_units_alpha)
            vmax = cute.make_rmem_tensor(1, Float32)
            vmax.fill(0.0)
        first_row = m_block * self.tile_m + wg * WGMMA_M  # this warpgroup's first query row
        if const_expr(self._tail_first()):  # args[14]: the tile's first row (a multiple of 64, >= 0)
            first_row = args[14] + wg * WGMMA_M
        # its Q scale block, clamped to q_descale's last one (a 192-row tile's last warpgroup may lie wholly past
        # seqlen_q and past the last block: layout.q_scale_block)
        q_block = layout.q_scale_block(first_row, mQd.shape[2], _min=cutlass.min)
        qk_scale = mQd[batch, head, q_block] * softmax.scale_log2
        return _Fp8StepContext(*args, acc_tmp=tmp, acc_tmp2=tmp2, qk_scale=qk_scale,
                               k_descale=mKd[batch, kv_head, None], v_descale=mVd[batch, kv_head, None],
                               tiles_in_tmp=tiles_in_tmp, o_alpha=o_alpha, descales=descales, vmax=vmax)


class FlashAttention3Fp8Sm90Persistent(FlashAttention3Fp8Sm90):
    """``FlashAttention3Fp8Sm90`` on the persistent grid (``Sm90Config.persistent``, fa3's ``_roles_persistent``: one
    CTA per SM walks several (query tile, head, batch) tiles, its pipeline states carried from tile to tile):
    ``__call__`` takes, after l2_heads, ``ctas`` (Int32 > 0, the grid's CTA count)."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mVt: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 mQd: cute.Tensor, mKd: cute.Tensor, mVd: cute.Tensor, softmax_scale_log2: Float32,
                 l2_heads: Int32, ctas: Int32, stream: cuda.CUstream):
        self.launch(mQ, mK, mVt, mO, mLSE, softmax_scale_log2, l2_heads, (mQd, mKd, mVd), stream, ctas=ctas)


class FlashAttention3Fp8Sm90Balanced(FlashAttention3Fp8Sm90Persistent):
    """``FlashAttention3Fp8Sm90Persistent`` with ``Sm90Config.balanced``: ``__call__`` takes, after ``ctas``, the tile
    table ``mOrder`` (int32, one entry per work tile: ``common.tile_order.balanced_order``)."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mVt: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 mQd: cute.Tensor, mKd: cute.Tensor, mVd: cute.Tensor, softmax_scale_log2: Float32,
                 l2_heads: Int32, ctas: Int32, mOrder: cute.Tensor, stream: cuda.CUstream):
        self.launch(mQ, mK, mVt, mO, mLSE, softmax_scale_log2, l2_heads, (mQd, mKd, mVd), stream, ctas=ctas,
                    order=(mOrder,))
