"""K's mean in the FP8 quantisation pass (mixed into ``fp8.quant_kernel.QuantPass``; K smoothing needs the mean of
K over its tokens before any K block is quantised): the per-block mean read of the smoothed passes (``block_mean``,
``load_mean`` for ``staged_mean``), K's partial sums in V's launch (``k_partial_sums``, ``kmean``; ``k_sample``), and
the fused mean finished on the GPU by the CTA that counts a head's last block (``mean_if_last``, ``mean_of``;
``count_late`` for ``late_count``), with the memory ordering of ``hopper.fa3_kernel``'s fused split merge.
Pipelines and switches: ``fp8.quant_kernel``'s module docstring (v2, v3).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from fa_variants.fp8.quant_config import MEAN_LOADS
from fa_variants.fp8.quant_maps import VEC, k_parts_per_block, k_sample_slot, k_sum_group, late_first, late_item


class KMeanMixin:
    """``QuantPass``'s K mean pieces (needs ``cfg``, ``head_dim``, ``num_threads``, ``quads``, ``decode``,
    ``chunk_of``)."""

    @cute.jit
    def block_mean(self, sMean: cute.Tensor, mMean: cute.Tensor, batch: Int32, head: Int32, heads: Int32,
                   parity: Int32, tidx: Int32):
        """Without ``staged_mean``: K's mean for this block into mean buffer ``parity`` (a global load and a barrier
        per block)."""
        for c in cutlass.range(tidx, self.head_dim, self.num_threads, unroll=1):
            sMean[c, parity] = mMean[batch, self.mean_head(head, heads, mMean), c]
        cute.arch.barrier()

    def parts_per_block(self) -> int:
        """K's partial sums per block in V's launch (``k_partial_sums``): ``k_parts_per_block(rows)``."""
        return k_parts_per_block(self.cfg.rows)

    def mean_head(self, head: Int32, heads: Int32, mMean: cute.Tensor) -> Int32:
        """The (kv-)head of K's mean a block reads: Q's head // (H / H_kv) for the shift, K's own head."""
        if const_expr(self.cfg.shift):
            return head // (heads // mMean.shape[1])
        return head

    @cute.jit
    def load_mean(self, sMean: cute.Tensor, mMean: cute.Tensor, batch: Int32, kv_head: Int32, tidx: Int32):
        """``staged_mean``: cp.async (16 bytes, threads < D / 4) of K's mean of (batch, kv_head) into one stage's
        mean buffer; the caller commits it with that stage's loads."""
        atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.cpasync.LoadCacheMode.GLOBAL),
                                   Float32, num_bits_per_copy=128)
        if tidx < self.head_dim // 4:
            src = cute.local_tile(mMean[batch, kv_head, None], (4,), (tidx,))
            cute.copy(atom, src, cute.local_tile(sMean, (4,), (tidx,)))

    @cute.jit
    def k_partial_sums(self, x: cute.Tensor, mPart: cute.Tensor, inv_n: Float32, batch: Int32, head: Int32,
                       tile: Int32, tidx: Int32, n_tiles: Int32, n_sample: Int32):
        """K's float32 sums over the tokens of a block, per channel, in a fixed order (the thread's 4 tokens
        in slot order, then a butterfly over the ``group`` token quads of its warp, group = ``k_sum_group(rows)``),
        times inv_n = float32(1 / seqlen_k): mPart[batch, head, tile * (quads / group) + quad / group,
        channel]. The host adds the partials (``k_mean_from_parts``). ``k_sample``: the partials of sample s
        (tile = floor(s T / m), so s = ceil(tile m / T)) in place of tile's; inv_n = 1 / the sampled tokens."""
        group = k_sum_group(self.cfg.rows)
        acc = cute.make_rmem_tensor(VEC, Float32)
        for i in cutlass.range_constexpr(VEC):
            acc[i] = x[i, 0] + x[i, 1]
            acc[i] = acc[i] + x[i, 2]
            acc[i] = acc[i] + x[i, 3]
        for b in cutlass.range_constexpr(group.bit_length() - 1):
            for i in cutlass.range_constexpr(VEC):
                acc[i] = acc[i] + cute.arch.shuffle_sync_bfly(acc[i], offset=group >> (b + 1))
        quad = tidx % self.quads
        if quad % group == 0:
            slot = tile
            if const_expr(self.cfg.k_sample):
                slot = k_sample_slot(tile, n_tiles, n_sample)
            part = slot * (self.quads // group) + quad // group
            c0 = self.chunk_of(tidx, 0) * VEC
            for i in cutlass.range_constexpr(VEC):
                mPart[batch, head, part, c0 + i] = acc[i] * inv_n

    @cute.jit
    def mean_if_last(self, mPart: cute.Tensor, mMean: cute.Tensor, mCount: cute.Tensor, storage, batch: Int32,
                     head: Int32, heads: Int32, n_tiles: Int32, tidx: Int32):
        """fused_mean, after a K block's partial sums are stored: count the block at its (batch, kv-head)'s
        counter; the CTA that counts the last of the n_tiles blocks (``k_sample``: the n_sample sample tiles, the
        argument's value then) writes K's mean of that (batch, kv-head):
        thread (g, c) (g < G = threads / D) adds the partials g, g + G, ... of channel c in order, then thread
        c adds the G group sums in order (deterministic; summation depth P / G + G - 1 <= P, the partials
        already divided by seqlen_k) into mMean[batch, head, c], and resets the counter to 0 (self-cleaning).

        Memory ordering as the fused split merge of ``hopper.fa3_kernel`` (PTX memory model): every thread's
        partial stores, a gpu-scope acq_rel fence (release), a CTA barrier, one thread's gpu-scope acq_rel
        atomic add; its ticket through shared memory and a barrier; in the last CTA every thread fences
        (acquire) before reading the other CTAs' partials (``mean_of``)."""
        ticket = storage.ticket.get_tensor(cute.make_layout(4))
        slot = batch * heads + head
        cute.arch.fence_acq_rel_gpu()  # release: this thread's partials before the count
        cute.arch.barrier()
        if tidx == 0:
            ticket[0] = cute.arch.atomic_add((mCount.iterator + slot).llvm_ptr, Int32(1), sem="acq_rel", scope="gpu")
        cute.arch.barrier()
        if ticket[0] == n_tiles - 1:
            self.mean_of(mPart, mMean, mCount, storage, batch, head, heads, tidx)

    @cute.jit
    def mean_of(self, mPart: cute.Tensor, mMean: cute.Tensor, mCount: cute.Tensor, storage, batch: Int32,
                head: Int32, heads: Int32, tidx: Int32):
        """The fused mean of (batch, kv-head) from its partials, by the CTA that counted its last block (every thread
        of it): thread (g, c) (g < G = threads / D) adds the partials g, g + G, ... of channel c in order, then
        thread c adds the G group sums in order into mMean[batch, head, c]; the counter is reset to 0. Each thread
        fences (acquire) before reading the other CTAs' partials. ``late_count``: the partials loaded MEAN_LOADS at a
        time into registers before their adds (same order, same sum). The group sums' buffer is read by threads < D
        after the barrier: a caller that calls this again must put a barrier between (``count_late``)."""
        D, T = self.head_dim, self.num_threads
        G = T // D
        sums = storage.sums.get_tensor(cute.make_layout(T))
        cute.arch.fence_acq_rel_gpu()  # acquire: the other CTAs' partials, before reading them
        g = tidx // D
        c = tidx % D
        acc = Float32(0.0)
        P = mPart.shape[2]
        if const_expr(self.cfg.late_count):
            # MEAN_LOADS independent loads in flight, then their adds in p order (the same sum as the loop below,
            # whose loads ptxas issues one at a time, each waiting for the previous add: P / G L2 round trips)
            U = MEAN_LOADS
            vals = cute.make_rmem_tensor(U, Float32)
            for p0 in cutlass.range(g, P, G * U, unroll=1):
                for u in cutlass.range_constexpr(U):
                    if p0 + u * G < P:
                        vals[u] = mPart[batch, head, p0 + u * G, c]
                for u in cutlass.range_constexpr(U):
                    if p0 + u * G < P:
                        acc = acc + vals[u]
        else:
            for p in cutlass.range(g, P, G, unroll=4):
                acc = acc + mPart[batch, head, p, c]
        sums[tidx] = acc
        cute.arch.barrier()
        if tidx < D:
            total = sums[tidx]
            for i in cutlass.range_constexpr(1, G):
                total = total + sums[tidx + i * D]
            mMean[batch, head, tidx] = total
        if tidx == 0:
            mCount[batch * heads + head] = Int32(0)

    @cute.jit
    def count_late(self, mPart: cute.Tensor, mMean: cute.Tensor, mCount: cute.Tensor, storage, heads: Int32,
                   n_tiles: Int32, n_blocks: Int32, n_sample: Int32, total: Int32, n_count: Int32, tidx: Int32):
        """``late_count``, after the CTA's loop: every thread fences (release: its partial sums of all the CTA's K
        blocks), a barrier; then the CTA's K items (``late_first``, ``late_item``) are dealt to its threads, each
        counting its item at the (batch, kv-head) counter (gpu-scope acq_rel atomic, all threads at once); a thread
        whose ticket is the head's last (n_count - 1: n_tiles, or n_sample with k_sample) writes the head's slot
        into shared memory (``done``; -1 otherwise), a barrier, and the CTA finishes the mean of each such head in
        thread order (``mean_of``, a barrier after each). The same partials and the same order as ``mean_if_last``:
        the mean is bit for bit the per-block count's; one fence per CTA instead of one per K block."""
        T = self.num_threads
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        done = storage.done.get_tensor(cute.make_layout(T))
        cute.arch.fence_acq_rel_gpu()  # release: this thread's partial sums before any count
        cute.arch.barrier()
        first = late_first(cta, grid, n_blocks)
        n_items = (total - first + grid - 1) // grid  # the CTA's K items (first <= total + grid - 1)
        for rnd in cutlass.range((n_items + T - 1) // T, unroll=1):
            blk = late_item(first, grid, T, rnd, tidx)
            mine = Int32(-1)
            if blk < total:
                batch, head, _, _ = self.decode(blk, heads, n_tiles, n_blocks, n_sample)
                slot = batch * heads + head
                ticket = cute.arch.atomic_add((mCount.iterator + slot).llvm_ptr, Int32(1), sem="acq_rel", scope="gpu")
                if ticket == n_count - 1:
                    mine = slot
            done[tidx] = mine
            cute.arch.barrier()
            for j in cutlass.range(cutlass.min(T, n_items - rnd * T), unroll=1):
                slot = done[j]
                if slot >= 0:
                    self.mean_of(mPart, mMean, mCount, storage, slot // heads, slot % heads, heads, tidx)
                    cute.arch.barrier()  # the group sums' buffer is free again
            cute.arch.barrier()  # done[] is rewritten by the next round
