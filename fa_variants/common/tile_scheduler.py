"""The order in which the FA3-style kernels walk their (query tile, head, batch) work tiles, shared by the
one-CTA-per-tile grid and the persistent grid (``Sm90Config.persistent``).

Tile t of num_m_blocks x num_heads x batches (t = 0 first):

* non-causal: the query tiles of one (batch, head) pair side by side (equal cost; they share K/V in L2);
* causal: longest first (LPT) within sections of ``l2_heads`` (batch, head) pairs whose K and V fit in L2
  together (``hopper.fa3.l2_section_heads``): the last query tile of every pair of a section, then the one before
  it, ...; the short tiles then fill the tail of the grid.

A one-CTA-per-tile grid maps CTA b to tile b. A persistent grid of G CTAs (the SM count) gives CTA b the tiles
b, b + G, b + 2G, ... (a static schedule): in causal order each CTA's first tile is among the longest, and the
stride keeps the CTAs of a wave in the same L2 section. The section order is adapted from
Dao-AILab/flash-attention:flash_attn/cute/tile_scheduler.py (its L2-swizzled LPT order).

Under causal masking that static schedule is unbalanced: CTA 0 takes the longest tile of every round of G, and the
section boundaries make the costs a sawtooth, so some CTAs end 10-15 % after the mean (the cost model of
``common.tile_order``, D 128 N 1k-16k). ``common.tile_order.balanced_order`` (``Sm90Config.balanced``, made on the
host) keeps the rounds (the same G tiles run side by side, so the L2 order is unchanged) but deals each round's tiles
to the CTAs by their load so far, the longest tile to the least-loaded CTA (LPT list scheduling by rounds): 1-2 % over
the mean in the same model. The kernel reads CTA b's r-th tile from the table instead of computing r G + b.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr


@cute.jit
def tile_coords(tile: Int32, num_m_blocks: Int32, num_heads: Int32, batches: Int32, l2_heads: Int32,
                causal: cutlass.Constexpr[bool]):
    """(query tile, head, batch) of work tile ``tile`` in [0, num_m_blocks * num_heads * batches)."""
    hb = tile // num_m_blocks
    m_block = tile % num_m_blocks
    if const_expr(causal):
        per_section = l2_heads * num_m_blocks
        section = tile // per_section
        rest = tile - section * per_section
        here = cutlass.min(l2_heads, num_heads * batches - section * l2_heads)  # last section may be short
        hb = section * l2_heads + rest % here
        m_block = num_m_blocks - 1 - rest // here
    return m_block, hb % num_heads, hb // num_heads


def persistent_ctas(num_tiles, ctas):
    """Grid size of a persistent launch (host side, traced): ``ctas`` (SMs x CTAs per SM), or fewer when there
    are fewer work tiles."""
    return cutlass.min(num_tiles, ctas)


def persistent_tiles():
    """(first tile, stride) of this CTA in the static persistent schedule: tiles first, first + stride, ..."""
    return cute.arch.block_idx()[0], cute.arch.grid_dim()[0]
