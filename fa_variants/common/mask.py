"""Causal (bottom-right) and sequence-end masks, and the K/V tile ranges they imply.

Convention (flash-attn >= 2.1, DESIGN.md): query i sees key j iff j <= i + (seqlen_k - seqlen_q)
when causal, and always j < seqlen_k. With query tiles of Br rows and key tiles of Bc columns:

* `kv_tile_end(m_block)`: K/V tiles n >= this are wholly invisible to query tile m_block (above the
  diagonal, or past seqlen_k) and are skipped, never loaded (FA2 section 3.1, causal tile skipping).
  0 means no row of the tile sees any key: its output is 0 and its LSE -inf.
* `kv_tile_causal_start(m_block)`: tiles n >= this cross the diagonal for some row of the tile and
  need the causal mask; tiles below it are fully visible and run unmasked. Only the last K/V tile
  (n = ceil(seqlen_k / Bc) - 1) can need the sequence-end mask.
* `apply_mask`: sets S to -inf where masked, on a (rows, cols) register view of the S accumulator.

The same arithmetic works on Python ints (used by the CPU tests) and on DSL Int32 values.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr


def _ceil_div(a, b: int):
    return (a + b - 1) // b


def _min(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else cutlass.min(a, b)


def _max(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else cutlass.max(a, b)


def kv_tile_end(m_block, Br: int, Bc: int, seqlen_q, seqlen_k, causal: bool):
    """One past the last K/V tile that query tile `m_block` needs (0: none)."""
    n_end = _ceil_div(seqlen_k, Bc)
    if causal:
        last_row = _min(m_block * Br + Br, seqlen_q)  # rows < last_row exist in this tile
        keys = last_row + seqlen_k - seqlen_q  # keys 0 .. keys-1 are visible to its last row
        n_end = _min(n_end, _ceil_div(_max(keys, 0), Bc))
    return n_end


def kv_tile_causal_start(m_block, Br: int, Bc: int, seqlen_q, seqlen_k):
    """First K/V tile that crosses the causal diagonal for some row of query tile `m_block`:
    tile n is fully visible to the tile's first row iff (n + 1) * Bc - 1 <= m_block * Br + shift."""
    first = m_block * Br + seqlen_k - seqlen_q + 1  # keys 0 .. first-1 visible to the first row
    return _max(first, 0) // Bc


@cute.jit
def apply_mask(s: cute.Tensor, coord: cute.Tensor, coord0: cute.Tensor, row_start: Int32,
               col_start: Int32, seqlen_q: Int32, seqlen_k: Int32,
               mask_seqlen: cutlass.Constexpr[bool], mask_causal: cutlass.Constexpr[bool]):
    """S[r, c] = -inf where key col_start + col is past seqlen_k (mask_seqlen) or above the
    bottom-right diagonal for query row_start + row (mask_causal).

    `coord` is this thread's (row, col) coordinates of the S tile in the same (rows, cols) view as
    `s`; `coord0` those of thread 0, which are compile-time constants: comparing them against a
    limit shifted by this thread's offset turns each test into a compare with an immediate."""
    thr_row, thr_col = coord[0][0], coord[0][1]
    col_limit = seqlen_k - col_start - thr_col  # local columns >= this are past seqlen_k
    n_cols = cute.size(s, mode=[1])
    if const_expr(not mask_causal):
        if const_expr(mask_seqlen):
            for c in cutlass.range_constexpr(n_cols):
                if coord0[0, c][1] >= col_limit:
                    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
                        s[r, c] = -Float32.inf
    else:
        shift = seqlen_k - seqlen_q + row_start + thr_row - col_start - thr_col + 1
        for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
            # key j visible to query i iff j <= i + seqlen_k - seqlen_q
            limit = shift + coord0[r, 0][0]
            if const_expr(mask_seqlen):
                limit = cutlass.min(limit, col_limit)
            for c in cutlass.range_constexpr(n_cols):
                if coord0[0, c][1] >= limit:
                    s[r, c] = -Float32.inf
