"""Host side of the persistent grid's balanced schedule (``Sm90Config.balanced``): the work tiles' order and costs
as ``common.tile_scheduler.tile_coords`` walks them, and ``balanced_order``, the table the kernel reads its tiles from.
Torch only (no DSL): the launcher plans it once per kind of call (``hopper.fa3._plan_call``).

Model (``balanced_order``): a causal query tile costs its K/V tiles up to the diagonal plus ``TILE_FIXED_COST``;
dealing each round of G tiles to the CTAs by their load so far puts the most loaded CTA 1-2 % above the mean at
D 128 N 1k-16k (B x N = 16k, 132 CTAs), where the static b, b + G, ... puts it 10-15 % above (a sawtooth of costs at
the L2 section boundaries, and CTA 0 taking each round's longest tile).
"""
import torch

#: a work tile's cost in K/V tiles beyond its own (launch share, Q load, epilogue), in ``causal_tile_costs``
TILE_FIXED_COST = 1.5


def tile_m_blocks(num_m_blocks: int, num_heads: int, batches: int, l2_heads: int, causal: bool) -> torch.Tensor:
    """The query tile (m_block) of every work tile t in ``common.tile_scheduler.tile_coords``'s order (int64)."""
    tile = torch.arange(num_m_blocks * num_heads * batches, dtype=torch.int64)
    if not causal:
        return tile % num_m_blocks
    per_section = l2_heads * num_m_blocks
    section = tile // per_section
    here = torch.clamp(num_heads * batches - section * l2_heads, max=l2_heads)  # the last section may be short
    return num_m_blocks - 1 - (tile - section * per_section) // here


def causal_tile_costs(m_blocks: torch.Tensor, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """A causal query tile's K/V tiles (``common.mask.BlockInfo.kv_tile_end``, unpacked, without q_tail_first; at
    least 1: a tile whose rows see no key still runs one) plus ``TILE_FIXED_COST``, per entry of ``m_blocks``."""
    last_row = torch.clamp((m_blocks + 1) * tile_m, max=seqlen_q)
    keys = torch.clamp(last_row + seqlen_k - seqlen_q, min=0)
    n_end = torch.clamp(-(-keys // tile_n), max=-(-seqlen_k // tile_n))
    return torch.clamp(n_end, min=1).to(torch.float64) + TILE_FIXED_COST


def balanced_order(costs: torch.Tensor, ctas: int) -> torch.Tensor:
    """The persistent grid's tile table (int32, one entry per work tile): CTA b's r-th tile is table[r G + b] with
    G = min(ctas, tiles) (the grid ``tile_scheduler.persistent_ctas`` launches), so every CTA walks rounds r = 0, 1,
    ... as in the static schedule and round r holds the static schedule's round-r tiles (the same L2 order). Within a
    round the tiles go to CTAs by their load so far (the sum of ``costs`` of their earlier tiles): the costliest to
    the least loaded (ties: the lower CTA, the earlier tile), i.e. LPT list scheduling round by round. The CTAs that
    take the last, partial round are renamed 0, 1, ... so that the table has no holes (CTAs are interchangeable)."""
    costs = torch.as_tensor(costs, dtype=torch.float64)
    total = len(costs)
    grid = min(ctas, total)
    assign = torch.empty(total, dtype=torch.int64)  # tile t -> its CTA
    load = torch.zeros(grid, dtype=torch.float64)
    for start in range(0, total, grid):
        chunk = costs[start:start + grid]
        by_load = torch.argsort(load, stable=True)[:len(chunk)]
        by_cost = torch.argsort(-chunk, stable=True)
        assign[start + by_cost] = by_load
        load[by_load] += chunk[by_cost]
    last = assign[(total - 1) // grid * grid:]  # the CTAs of the last round, in its tiles' order
    rename = torch.empty(grid, dtype=torch.int64)
    rest = torch.ones(grid, dtype=torch.bool)
    rest[last] = False
    rename[last] = torch.arange(len(last))
    rename[rest] = torch.arange(len(last), grid)
    table = torch.empty(total, dtype=torch.int32)
    table[torch.arange(total) // grid * grid + rename[assign]] = torch.arange(total, dtype=torch.int32)
    return table
