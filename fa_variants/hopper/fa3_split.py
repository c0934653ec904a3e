"""Split-KV (Flash-Decoding) pieces of the fa3 kernel family: the mixin ``Fa3SplitKV`` of
``hopper.fa3_kernel.FlashAttention3Sm90``. A split CTA's (query tile, head, batch, split) and its K/V tile range
(``common.split.split_ranges``); its epilogue, the fp32 partial O and LSE stored from registers
(``store_partial``); and the fused merge (``Sm90Config.fused_merge``): the last split CTA of a query tile to
arrive merges the partials into the caller's O and LSE (``_merge_if_last``, ``_merge_tile``: the maths of
``common.split_combine``). The kernel without fused merge is followed by ``common.split_combine_kernel``.
"""
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from fa_variants.common.layout import rows_cols as acc_rows_cols
from fa_variants.common.sm90 import WARPGROUP_THREADS, NamedBarrier

# Fused split merge: fp32 columns of a row each thread merges at a time (one 16-byte load per split)
MERGE_VEC = 4
LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


class Fa3SplitKV:
    """Split-KV coordinates, partial epilogue and fused merge of ``FlashAttention3Sm90`` (a mixin: reads the
    kernel's tile_m, head_dim, num_wg, out_dtype and calls its ``_num_kv_blocks``)."""

    @cute.jit
    def _split_coords(self, num_m_blocks: Int32, num_heads: Int32, num_splits: Int32):
        """(query tile, head, batch, split) of this CTA: the splits of one query tile side by side."""
        bid, _, _ = cute.arch.block_idx()
        split = bid % num_splits
        rest = bid // num_splits
        hb = rest // num_m_blocks
        return rest % num_m_blocks, hb % num_heads, hb // num_heads, split

    @cute.jit
    def _split_range(self, m_block: Int32, split: Int32, num_splits: Int32, seqlen_q: Int32, seqlen_k: Int32,
                     diag_q: Int32):
        """(first tile, tile count) of this split: tiles [s n // S, (s + 1) n // S) of the n the query tile
        needs (``common.split.split_ranges``; ``diag_q`` as ``_num_kv_blocks``'); the count is <= 0 for an empty
        split."""
        n_total = self._num_kv_blocks(m_block, seqlen_q, seqlen_k, diag_q)
        n_start = split * n_total // num_splits
        return n_start, (split + 1) * n_total // num_splits - n_start

    @cute.jit
    def store_partial(self, acc_O, lse, mO, mLSE, tiled_mma_pv, tidx: Int32, m_block: Int32, seqlen_q: Int32):
        """Split-KV epilogue: this split's O (fp32, normalised by its own row sum) and LSE straight from
        registers to the partial buffers (a few rows in decode: no shared-memory staging)."""
        thr_mma = tiled_mma_pv.get_slice(tidx)
        tOcO = acc_rows_cols(thr_mma.partition_C(cute.make_identity_tensor((self.tile_m, self.head_dim))))
        o = acc_rows_cols(acc_O)
        for r in cutlass.range_constexpr(cute.size(o, mode=[0])):
            row = m_block * self.tile_m + tOcO[r, 0][0]
            if row < seqlen_q:
                for c in cutlass.range_constexpr(cute.size(o, mode=[1])):
                    mO[row, tOcO[r, c][1]] = o[r, c]
                if tOcO[0, 0][1] == 0:
                    mLSE[row] = lse[r]

    @cute.jit
    def _merge_if_last(self, mO, mLSE, m_block: Int32, head: Int32, batch: Int32, storage, merge: tuple, tile: Int32,
                       num_splits: Int32, rows: Int32):
        """Fused split merge, run by the consumer threads of every split CTA after its partials are stored:
        count this split's arrival at the query tile's counter; the CTA that arrives last merges the tile.

        Memory ordering (PTX memory model, release / acquire through fences and one atomic): each thread's
        partial stores, then a gpu-scope acq_rel fence (release), then a barrier of the consumer threads, then one
        thread's gpu-scope acq_rel atomic add on the counter; the thread that reads num_splits - 1 (the last
        split) shares it through shared memory and a barrier, and every thread fences (acquire) before reading
        the other CTAs' partials. The last CTA sets the counter back to 0 (self-cleaning: the buffer is zeroed
        once and reused by every later call on the stream)."""
        mOut, mLSEout, mCount = merge
        tidx = cute.arch.thread_idx()[0] - WARPGROUP_THREADS
        consumers = self.num_wg * WARPGROUP_THREADS
        ticket = storage.merge_ticket.get_tensor(cute.make_layout(1))
        cute.arch.fence_acq_rel_gpu()  # release: this thread's partial O / LSE stores before the count
        cute.arch.barrier(barrier_id=int(NamedBarrier.EPILOGUE), number_of_threads=consumers)
        if tidx == 0:
            ticket[0] = cute.arch.atomic_add((mCount.iterator + tile).llvm_ptr, Int32(1), sem="acq_rel", scope="gpu")
        cute.arch.barrier(barrier_id=int(NamedBarrier.EPILOGUE), number_of_threads=consumers)
        if ticket[0] == num_splits - 1:
            cute.arch.fence_acq_rel_gpu()  # acquire: the other splits' partials, before reading them
            sLSE = storage.merge_lse.get_tensor(cute.make_layout(self.tile_m))
            self._merge_tile(mO, mLSE, mOut, mLSEout, sLSE, tidx, consumers, m_block, head, batch, num_splits, rows)
            if tidx == 0:
                mCount[tile] = Int32(0)

    @cute.jit
    def _merge_tile(self, mO, mLSE, mOut, mLSEout, sLSE, tidx: Int32, consumers: int, m_block: Int32, head: Int32,
                    batch: Int32, num_splits: Int32, rows: Int32):
        """O and LSE of the query tile's rows from the num_splits partials (``common.split_combine``'s maths, sums
        in split order): one thread per row computes LSE = m' + log sum_s exp(LSE_s - m') (m' the max, 0 if every
        split is empty; -inf when the sum is 0) into shared memory and the caller's LSE; then each thread merges
        4 columns of a row at a time, O = sum over splits with LSE_s != -inf of exp(LSE_s - LSE) O_s, rounded
        once to O's dtype. Partials: (rows, head_dim, heads, num_splits * batch), split s of batch b at s B + b."""
        batches = mOut.shape[3]
        row0 = m_block * self.tile_m
        n_rows = cutlass.min(rows - row0, self.tile_m)
        if tidx < n_rows:
            r = row0 + tidx
            m = -Float32.inf
            for s in cutlass.range(num_splits, unroll=8):
                m = cutlass.max(m, mLSE[r, head, s * batches + batch])
            m_safe = m
            if m == -Float32.inf:
                m_safe = Float32(0.0)
            l = Float32(0.0)
            for s in cutlass.range(num_splits, unroll=8):
                l += cute.math.exp2((mLSE[r, head, s * batches + batch] - m_safe) * LOG2_E, fastmath=True)
            lse = -Float32.inf
            if l != Float32(0.0):
                lse = m_safe + cute.math.log2(l, fastmath=True) * LN_2
            sLSE[tidx] = lse
            mLSEout[r, head, batch] = lse
        cute.arch.barrier(barrier_id=int(NamedBarrier.EPILOGUE), number_of_threads=consumers)
        chunks = self.head_dim // MERGE_VEC
        for u in cutlass.range(tidx, n_rows * chunks, consumers, unroll=1):
            i = u // chunks
            r = row0 + i
            lse = sLSE[i]
            acc = cute.make_rmem_tensor(cute.make_layout(MERGE_VEC), Float32)
            acc.fill(0.0)
            o = cute.make_rmem_tensor(cute.make_layout(MERGE_VEC), Float32)
            if lse != -Float32.inf:
                for s in cutlass.range(num_splits, unroll=8):
                    x = mLSE[r, head, s * batches + batch]
                    # loaded whether or not the split saw a key and used through a select (an empty split's O is
                    # unwritten scratch: skipped, never multiplied by 0), so that the loads of the unrolled splits
                    # do not wait for their LSE: all in flight together
                    o.store(cute.local_tile(mO[r, None, head, s * batches + batch], (MERGE_VEC,), (u - i * chunks,)).load())
                    w = cute.math.exp2((x - lse) * LOG2_E, fastmath=True)
                    keep = x != -Float32.inf
                    for j in cutlass.range_constexpr(MERGE_VEC):
                        acc[j] = cutlass.select_(keep, acc[j] + w * o[j], acc[j])
            dst = cute.local_tile(mOut[r, None, head, batch], (MERGE_VEC,), (u - i * chunks,))
            dst.store(acc.load().to(self.out_dtype))
