"""Staging of the FP8 quantisation pass's 16-bit input (mixed into ``fp8.quant_kernel.QuantPass``): the cp.async
loads of a block into a shared-memory stage (per thread, ``load_block``; or coalesced in (token, channel) order with
swizzled 16-byte pieces, ``load_block_coalesced`` / ``copy_pieces``), the prologue's first ``ahead`` blocks with PDL,
the per-item wait / read-back into registers / refill of the stage (``load_item``, ``refill_coalesced``,
``read_block``). The thread maps are ``fp8.quant_maps``'s (``stage_load``, ``stage_piece``); the design (why the
stages, how many in flight) is ``fp8.quant_kernel``'s module docstring.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from fa_variants.fp8.quant_maps import SLOTS, VEC, stage_load, stage_piece


class StagingMixin:
    """``QuantPass``'s loads of 16-bit blocks through shared-memory stages (needs ``cfg``, ``head_dim``, ``slots``,
    ``lanes``, ``quads``, ``num_threads``, ``decode``, ``token_of``, ``chunk_of``, ``mean_head``, ``load_mean``)."""

    @cute.jit
    def prologue(self, sStage: cute.Tensor, sRaw: cute.Tensor, sMean: cute.Tensor, mX: cute.Tensor, mK: cute.Tensor,
                 mMean: cute.Tensor, cta: Int32, grid: Int32, ahead: int, heads: Int32, n_tiles: Int32,
                 n_blocks: Int32, n_sample: Int32, total: Int32, tidx: Int32, g2s: cute.CopyAtom):
        """Before the loop: (pdl) let the next grid launch; the loads of the CTA's first ``ahead`` work items, one
        commit group each (empty past the end); (pdl) wait for the previous grid; then the reads of its output:
        (``staged_mean``) K's mean of those items into their stages' mean buffers."""
        D = self.head_dim
        if const_expr(self.cfg.pdl):  # the next grid on the stream may launch now (its CTAs land as ours exit)
            cute.arch.griddepcontrol_launch_dependents()
        for s in cutlass.range_constexpr(ahead):
            if cta + s * grid < total:
                pb, ph, pt, pk = self.decode(cta + s * grid, heads, n_tiles, n_blocks, n_sample)
                if const_expr(self.cfg.coalesced):
                    self.load_block_coalesced(sStage[None, s], mX, mK, pb, ph, pt, pk, tidx, g2s)
                else:
                    self.load_block(sRaw[None, None, None, s], mX, mK, pb, ph, pt, pk, tidx, g2s)
            cute.arch.cp_async_commit_group()
        if const_expr(self.cfg.pdl):
            # the grid before ours finished and its writes are visible (K's mean, a given descale) before any
            # other global read or any global write; the prologue above read only the 16-bit input, which the
            # host made ready before the first, non-PDL launch of the pass (``quantize``)
            cute.arch.griddepcontrol_wait()
        if const_expr(self.cfg.staged_mean):
            # K's mean of the prologue's items into their stages' mean buffers: plain loads after the wait (the
            # mean is the previous grid's output); item 0's stage barrier publishes them
            for s in cutlass.range_constexpr(ahead):
                if cta + s * grid < total:
                    pb, ph, _, _ = self.decode(cta + s * grid, heads, n_tiles, n_blocks, n_sample)
                    for c in cutlass.range(tidx, D, self.num_threads, unroll=1):
                        sMean[c, s] = mMean[pb, self.mean_head(ph, heads, mMean), c]

    @cute.jit
    def load_item(self, x: cute.Tensor, raw: cute.Tensor, sStage: cute.Tensor, sRaw: cute.Tensor, sMean: cute.Tensor,
                  mX: cute.Tensor, mK: cute.Tensor, mMean: cute.Tensor, blk: Int32, step: Int32, stage: Int32,
                  tile: Int32, ahead: int, grid: Int32, heads: Int32, n_tiles: Int32, n_blocks: Int32,
                  n_sample: Int32, total: Int32, tidx: Int32, g2s: cute.CopyAtom, s2r: cute.CopyAtom):
        """Work item blk's 16-bit values into x (float32): wait for its commit group, read its stage back (coalesced:
        after the barrier and the refill of the stage read in the previous iteration, ``refill_coalesced``; else the
        thread's own pieces, then the refill of this stage with the item S ahead); V's tokens past seqlen_k zeros."""
        S = self.cfg.stages
        cute.arch.cp_async_wait_group(ahead - 1)  # this item's group (the later ones may be in flight)
        if const_expr(self.cfg.coalesced):
            self.refill_coalesced(sStage, sMean, mX, mK, mMean, blk, step, ahead, grid, heads, n_tiles, n_blocks,
                                  n_sample, total, tidx, g2s)
            self.read_block(sStage[None, stage], raw, tidx, s2r)
        else:
            for j in cutlass.range_constexpr(SLOTS):
                cute.copy(s2r, sRaw[None, None, j, stage], cute.zipped_divide(raw[None, j], (8,)))
        x.store(raw.load().to(Float32))
        if const_expr(self.cfg.role == "v"):  # tokens past seqlen_k: zeros (v_t's padding)
            for j in cutlass.range_constexpr(SLOTS):
                if tile * self.cfg.rows + self.token_of(tidx, j) >= mX.shape[1]:
                    for i in cutlass.range_constexpr(VEC):
                        x[i, j] = Float32(0.0)
        if const_expr(not self.cfg.coalesced):
            if blk + S * grid < total:  # the loads of the item S ahead, into the stage just read
                nb, nh, nt, nk = self.decode(blk + S * grid, heads, n_tiles, n_blocks, n_sample)
                self.load_block(sRaw[None, None, None, stage], mX, mK, nb, nh, nt, nk, tidx, g2s)
            cute.arch.cp_async_commit_group()

    @cute.jit
    def refill_coalesced(self, sStage: cute.Tensor, sMean: cute.Tensor, mX: cute.Tensor, mK: cute.Tensor,
                         mMean: cute.Tensor, blk: Int32, step: Int32, ahead: int, grid: Int32, heads: Int32,
                         n_tiles: Int32, n_blocks: Int32, n_sample: Int32, total: Int32, tidx: Int32,
                         g2s: cute.CopyAtom):
        """coalesced, before item blk is read: a barrier (every thread's pieces of this item have landed, and every
        read of the stage refilled here, read in the previous iteration, is done), then the loads of the item
        ``ahead`` items later into that stage (with its K mean: ``staged_mean``), one commit group. The
        refill is issued before this item's values are read into registers (fewer live registers while its
        addresses are computed)."""
        S = self.cfg.stages
        cute.arch.barrier()
        if blk + ahead * grid < total:
            nb, nh, nt, nk = self.decode(blk + ahead * grid, heads, n_tiles, n_blocks, n_sample)
            self.load_block_coalesced(sStage[None, (step + ahead) % S], mX, mK, nb, nh, nt, nk, tidx, g2s)
            if const_expr(self.cfg.staged_mean):  # its K mean rides in the same group
                self.load_mean(sMean[None, (step + ahead) % S], mMean, nb, self.mean_head(nh, heads, mMean),
                               tidx)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def load_block(self, sRaw: cute.Tensor, mX: cute.Tensor, mK: cute.Tensor, batch: Int32, head: Int32,
                   tile: Int32, is_k, tidx: Int32, g2s: cute.CopyAtom):
        """Issue the cp.async (16 bytes each) of the thread's 16-bit values of a block (of K when is_k, with
        ``kmean``) into its stage of shared memory; tokens past seqlen are not read. The caller commits."""
        for j in cutlass.range_constexpr(SLOTS):
            tok = tile * self.cfg.rows + self.token_of(tidx, j)
            if tok < mX.shape[1]:
                chunk = self.chunk_of(tidx, j)
                if const_expr(self.cfg.kmean):
                    if is_k:
                        src = cute.local_tile(mK[batch, tok, head, None], (VEC,), (chunk,))
                        cute.copy(g2s, cute.zipped_divide(src, (8,)), sRaw[None, None, j])
                    else:
                        src = cute.local_tile(mX[batch, tok, head, None], (VEC,), (chunk,))
                        cute.copy(g2s, cute.zipped_divide(src, (8,)), sRaw[None, None, j])
                else:
                    src = cute.local_tile(mX[batch, tok, head, None], (VEC,), (chunk,))
                    cute.copy(g2s, cute.zipped_divide(src, (8,)), sRaw[None, None, j])

    @cute.jit
    def load_block_coalesced(self, sStage: cute.Tensor, mX: cute.Tensor, mK: cute.Tensor, batch: Int32,
                             head: Int32, tile: Int32, is_k, tidx: Int32, g2s: cute.CopyAtom):
        """coalesced: the cp.async (16 bytes each) of a block's 16-bit values into a stage in (token, channel)
        order, piece q of token r at r * D / 8 + (q ^ swizzle(r)): thread t loads piece t % (D / 8) of tokens
        t / (D / 8) + m * rows / 8 (m = 0..7), so a warp reads 512 contiguous bytes of a token row (all
        of them: 32 B sectors and 128 B lines whole). Tokens past seqlen are not read. The caller commits."""
        if const_expr(self.cfg.kmean):
            if is_k:
                self.copy_pieces(sStage, mK, batch, head, tile, tidx, g2s)
            else:
                self.copy_pieces(sStage, mX, batch, head, tile, tidx, g2s)
        else:
            self.copy_pieces(sStage, mX, batch, head, tile, tidx, g2s)

    @cute.jit
    def copy_pieces(self, sStage: cute.Tensor, mSrc: cute.Tensor, batch: Int32, head: Int32, tile: Int32,
                    tidx: Int32, g2s: cute.CopyAtom):
        """``load_block_coalesced``'s cp.async from one source tensor."""
        n = 2 * self.slots  # the thread's pieces (8; 16 with ``wide``)
        P, rows8 = self.head_dim // 8, self.cfg.rows // n  # 16-byte pieces per token; token step between loads
        q = tidx % P
        r0 = tidx // P
        tok0 = tile * self.cfg.rows + r0
        # the thread's n pieces: (8 channels, m) at token tok0 + m * rows8 (one address, then constant steps)
        first = cute.local_tile(mSrc[batch, tok0, head, None], (8,), (q,))
        mine = cute.make_tensor(first.iterator, cute.make_layout((8, n), stride=(1, rows8 * mSrc.stride[1])))
        for m in cutlass.range_constexpr(n):
            if tok0 + m * rows8 < mSrc.shape[1]:
                _, _, piece = stage_load(self.head_dim, self.cfg.rows, self.cfg.role, self.lanes, tidx, m, n)
                cute.copy(g2s, mine[None, m], cute.local_tile(sStage, (8,), (piece,)))

    @cute.jit
    def read_block(self, sStage: cute.Tensor, raw: cute.Tensor, tidx: Int32, s2r: cute.CopyAtom):
        """coalesced: the thread's two pieces per slot (its 16 channels of a token) from the swizzled stage,
        16 bytes each (8 threads of a quarter warp hit 8 distinct 16-byte bank groups: ``piece_swizzle``)."""
        for j in cutlass.range_constexpr(self.slots):
            for p in cutlass.range_constexpr(2):
                piece = stage_piece(self.cfg.role, self.lanes, self.quads, self.head_dim, tidx, j, p)
                src = cute.local_tile(sStage, (8,), (piece,))
                cute.copy(s2r, src, cute.zipped_divide(raw[None, j], (8,))[None, p])
