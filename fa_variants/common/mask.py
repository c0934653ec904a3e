"""Which K/V tiles a query tile needs (`BlockInfo`) and the element mask inside a tile (`AttentionMask`).

Convention (flash-attn >= 2.1; docs/design.md, "Causal alignment"): query i sees key j iff j < seqlen_k
and, when causal, j <= i + (seqlen_k - seqlen_q) (bottom-right aligned). With query tiles of tile_m rows
and key tiles of tile_n columns:

* `kv_tile_end(m_block)`: K/V tiles n >= this are wholly invisible to query tile m_block (above the
  diagonal, or past seqlen_k) and are skipped, never loaded (FA2 section 3.1). 0: no row of the tile
  sees any key (its output is 0, its LSE -inf).
* `kv_tile_causal_start(m_block)`: tiles n >= this cross the diagonal for some row of the tile and need
  the causal mask; the tiles before it run unmasked. Only the last K/V tile can need the seqlen_k mask.
* `q_tile_start(n_block)` and `q_tile_unmasked_start(n_block)`: the same facts seen from a K/V tile (the
  K/V-outer loop of FA1): i >= q_tile_start(n) <=> n < kv_tile_end(i), and i >= q_tile_unmasked_start(n)
  <=> n < kv_tile_causal_start(i).

Packed GQA (``qhead_per_kvhead`` = G > 1, fa3's decode path): the tile rows are (query head, query position)
pairs of one KV head, row r holding query position r // G (the G heads of a position are adjacent rows).
seqlen_q stays the number of query positions; a tile's rows are compared by their own position, so the
bottom-right diagonal is the same as unpacked (``kv_tile_end`` / ``kv_tile_causal_start`` and
``AttentionMask.apply``). The K/V-outer helpers (``q_tile_*``) are for unpacked tiles only.

The tile arithmetic works on Python ints (the CPU tests) and on DSL Int32 values alike.
Adapted in shape (small frozen objects) from Dao-AILab/flash-attention:flash_attn/cute/block_info.py::BlockInfo
and flash_attn/cute/mask.py::AttentionMask.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr


def _ceil_div(a, b: int):
    return (a + b - 1) // b


def _min(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else cutlass.min(a, b)


def _max(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else cutlass.max(a, b)


@cute.jit
def kv_length(lengths: tuple, batch: Int32, seqlen_k: Int32) -> Int32:
    """Keys sequence ``batch`` attends to: seqlen_k (K's padded length), or with ``lengths`` = (seqlens_k,) (the
    kernels' ``seqlens_k`` switch) seqlens_k[batch] clamped to [0, seqlen_k] (a value outside is refused on the host;
    inside CUDA-graph capture it is not read there, so a kernel never walks past K's rows)."""
    if const_expr(len(lengths) > 0):
        return cutlass.min(cutlass.max(lengths[0][batch], Int32(0)), seqlen_k)
    return seqlen_k


@cute.jit
def kv_start(lengths: tuple, batch: Int32, end: Int32) -> Int32:
    """The first key of sequence ``batch``'s window: 0, or with ``lengths`` = (seqlens_k, leftpad_k) (the kernels'
    ``leftpad_k`` switch: a KV cache padded on the left, flash-attn's ``leftpad_k``) leftpad_k[batch] clamped to
    [0, end], ``end`` its `kv_length`. The kernel then reads K and V from that key on, as views whose key 0 it is,
    of end - start keys: every tile range and mask stays the plain one's, bottom-right causal against that count."""
    if const_expr(len(lengths) > 1):
        return cutlass.min(cutlass.max(lengths[1][batch], Int32(0)), end)
    return Int32(0)


@cute.jit
def q_length(lengths: tuple, batch: Int32, seqlen_q: Int32) -> Int32:
    """The query count sequence ``batch``'s causal diagonal is aligned to: seqlen_q (Q's padded length), or with
    ``lengths`` = (seqlens_k, leftpad_k, seqlens_q) (the kernels' ``seqlens_q`` switch: a batch padded on the right,
    queries too) seqlens_q[batch] clamped to [0, seqlen_q]. Query i then sees key j iff j <= i + n - seqlens_q[b] (n
    the window's keys): the rows from seqlens_q[b] on see the whole window. Only the diagonal moves: every row is
    computed and stored (Q's padded rows), so the kernels pass this wherever they pass seqlen_q to `BlockInfo` and
    `AttentionMask` (whose row bounds past it never drop a key that a row there sees: such rows see every key)."""
    if const_expr(len(lengths) > 2):
        return cutlass.min(cutlass.max(lengths[2][batch], Int32(0)), seqlen_q)
    return seqlen_q


@dataclass(frozen=True)
class BlockInfo:
    """Tile ranges of a (tile_m x tile_n)-tiled attention with bottom-right causal alignment."""

    tile_m: int
    tile_n: int
    causal: bool
    qhead_per_kvhead: int = 1  # packed GQA: G tile rows per query position (module docstring)

    def q_shift(self, seqlen_q):
        """``Sm90Config.q_tail_first``: rows by which query tiles 1, 2, .. move back, (-seqlen_q) mod tile_m rounded
        down to whole 64-row warpgroups (a warpgroup's rows then stay in one 128-row FP8 Q scale block)."""
        return (self.tile_m - seqlen_q % self.tile_m) % self.tile_m // 64 * 64

    def q_row_start(self, m_block, seqlen_q, tail_first: bool = False):
        """First query row of tile `m_block`: m_block tile_m, or with ``tail_first`` (``Sm90Config.q_tail_first``)
        max(m_block tile_m - ``q_shift``, 0): tiles 1, 2, .. move back so that the last one ends less than 64 rows
        past seqlen_q, and tile 0 starts at row 0 and overlaps tile 1 by the shift (the surplus rows of a partial
        tile, now in the shortest tile). Never negative: the Q load and O store are TMA boxes at this row (session 7's
        box at row -shift went with "an illegal instruction" on the H200)."""
        if not tail_first:
            return m_block * self.tile_m
        return _max(m_block * self.tile_m - self.q_shift(seqlen_q), 0)

    def q_row_end(self, m_block, seqlen_q, tail_first: bool = False):
        """One past the last query row that tile `m_block` owns (stores its LSE): the next tile's start, so each
        row has one owner (tile 0 with ``tail_first`` computes the shift rows it shares with tile 1, owns
        rows below them); clipped at seqlen_q."""
        return _min(self.q_row_start(m_block + 1, seqlen_q, tail_first), seqlen_q)

    def kv_tile_end(self, m_block, seqlen_q, seqlen_k, row_start=None):
        """One past the last K/V tile that query tile `m_block` needs (0: none). ``row_start``: the tile's first
        row (``q_row_start``); None: m_block tile_m."""
        n_end = _ceil_div(seqlen_k, self.tile_n)
        if self.causal:
            g = self.qhead_per_kvhead
            if row_start is None:
                last_row = _min(m_block * self.tile_m + self.tile_m, seqlen_q * g)  # rows < last_row exist
            else:
                last_row = _min(row_start + self.tile_m, seqlen_q * g)
            positions = last_row if g == 1 else _ceil_div(last_row, g)  # its last row's query position + 1
            keys = positions + seqlen_k - seqlen_q  # keys 0 .. keys-1 are visible to its last row
            n_end = _min(n_end, _ceil_div(_max(keys, 0), self.tile_n))
        return n_end

    def kv_tile_causal_start(self, m_block, seqlen_q, seqlen_k, row_start=None):
        """First K/V tile crossing the causal diagonal for some row of query tile `m_block`: tile n is
        fully visible to the tile's first row iff (n + 1) tile_n - 1 <= m_block tile_m + shift. ``row_start``
        as in ``kv_tile_end`` (non-negative: // is exact)."""
        position = m_block * self.tile_m if row_start is None else row_start  # of the tile's first row
        if self.qhead_per_kvhead != 1:
            position = position // self.qhead_per_kvhead
        first = position + seqlen_k - seqlen_q + 1  # keys 0 .. first-1 visible to the first row
        return _max(first, 0) // self.tile_n

    def q_tile_start(self, n_block, seqlen_q, seqlen_k):
        """First query tile that sees a key of K/V tile n_block (0 when not causal): tile i does iff its
        last row sees key n_block tile_n, i.e. (i + 1) tile_m > n_block tile_n - (seqlen_k - seqlen_q)."""
        if not self.causal:
            return 0
        return _max(n_block * self.tile_n - (seqlen_k - seqlen_q), 0) // self.tile_m

    def q_tile_unmasked_start(self, n_block, seqlen_q, seqlen_k):
        """First query tile whose every row sees all of K/V tile n_block (no causal mask from there on),
        clamped to [q_tile_start(n_block), number of query tiles]."""
        start = self.q_tile_start(n_block, seqlen_q, seqlen_k)
        if not self.causal:
            return start
        first_row = (n_block + 1) * self.tile_n - 1 - (seqlen_k - seqlen_q)  # first row seeing all of it
        return _min(_max(_ceil_div(_max(first_row, 0), self.tile_m), start), _ceil_div(seqlen_q, self.tile_m))


@dataclass(frozen=True)
class AttentionMask:
    """The element mask of one (seqlen_q, seqlen_k) problem, applied to (rows, cols) views of S.

    `select` picks how a masked score is written, a choice of register allocation only (the masked set is
    the same): True, one select per score, keeps every score in its register (the Hopper kernel: a branch
    per score spilled with 3 consumer warpgroups at 160 registers, D = 64 causal); False, a branch per
    column (sequence end) or per score (causal), which the sm80 kernels need (per-score selects spill 32-40
    bytes in FA2 at D = 128 causal, sm_80, nvidia-cutlass-dsl 4.8.1)."""

    seqlen_q: Int32
    seqlen_k: Int32
    select: bool = True
    qhead_per_kvhead: int = 1  # packed GQA: tile row r is query position r // G (module docstring)

    @cute.jit
    def apply(self, s: cute.Tensor, coord: cute.Tensor, coord0: cute.Tensor, row_start: Int32, col_start: Int32,
              mask_seqlen: cutlass.Constexpr[bool], mask_causal: cutlass.Constexpr[bool]):
        """S[r, c] = -inf where key col_start + col is past seqlen_k (mask_seqlen) or above the
        bottom-right diagonal for query row_start + row (mask_causal).

        `coord` is this thread's (row, col) coordinates of the tile in the same (rows, cols) view as `s`;
        `coord0` thread 0's, which are compile-time constants: comparing them against a limit shifted by
        this thread's offset turns each test into a compare with an immediate."""
        thr_row, thr_col = coord[0][0], coord[0][1]
        end_limit = self.seqlen_k - col_start - thr_col  # local columns >= this are past seqlen_k
        n_rows, n_cols = cute.size(s, mode=[0]), cute.size(s, mode=[1])
        if const_expr(not mask_causal and not self.select):
            if const_expr(mask_seqlen):
                for c in cutlass.range_constexpr(n_cols):
                    if coord0[0, c][1] >= end_limit:
                        for r in cutlass.range_constexpr(n_rows):
                            s[r, c] = -Float32.inf
        else:
            # key j visible to query i iff j <= i + seqlen_k - seqlen_q
            g = self.qhead_per_kvhead
            if const_expr(g == 1):
                shift = self.seqlen_k - self.seqlen_q + row_start + thr_row + 1 - col_start - thr_col
            else:
                shift = self.seqlen_k - self.seqlen_q + 1 - col_start - thr_col
            for r in cutlass.range_constexpr(n_rows):
                limit = end_limit
                if const_expr(mask_causal):
                    if const_expr(g == 1):
                        limit = shift + coord0[r, 0][0]
                    else:  # packed rows: this row's own query position (one division by G per row)
                        limit = shift + (row_start + thr_row + coord0[r, 0][0]) // g
                    if const_expr(mask_seqlen):
                        limit = cutlass.min(limit, end_limit)
                for c in cutlass.range_constexpr(n_cols):
                    if const_expr(self.select):
                        s[r, c] = -Float32.inf if coord0[0, c][1] >= limit else s[r, c]
                    elif coord0[0, c][1] >= limit:
                        s[r, c] = -Float32.inf
