"""CPU checks of ``Sm90Config.q_tail_first`` (causal: the partial query tile's waste moved to tile 0, the shortest one):
the row ranges of ``common.mask.BlockInfo.q_row_start`` / ``q_row_end`` for every remainder of seqlen_q (no negative
first row: a TMA box starting before row 0 faulted on the H200; each warpgroup in one Q scale block; every row owned by
one tile; the grid unchanged), the K/V tile ranges from the tile's first row against a brute-force walk of the causal
mask, and the config's refusals."""
import dataclasses
import math

import pytest

from fa_variants.common.config import Sm90Config
from fa_variants.common.mask import BlockInfo
from fa_variants.reference import causal_visible

WARPGROUP_ROWS = 64
Q_SCALE_ROWS = 128  # fa_variants.fp8.layout.TILE_M (not imported: the fp8 package loads torch)


def _tiles(blocks: BlockInfo, seqlen_q: int, tail_first: bool):
    """(first row, one past the last owned row) of every query tile the host launches (cdiv(seqlen_q, tile_m))."""
    return [(blocks.q_row_start(m, seqlen_q, tail_first), blocks.q_row_end(m, seqlen_q, tail_first))
            for m in range(math.ceil(seqlen_q / blocks.tile_m))]


@pytest.mark.parametrize("tile_m", [64, 128, 192, 256])
def test_row_ranges_for_every_remainder(tile_m):
    blocks = BlockInfo(tile_m, 128, True)
    for seqlen_q in [*range(1, 3 * tile_m + 2), 1023, 4095, 4096, 4097, 16384 + 65]:
        shift = blocks.q_shift(seqlen_q)
        assert shift % WARPGROUP_ROWS == 0 and 0 <= shift < tile_m
        assert shift == ((-seqlen_q) % tile_m) // WARPGROUP_ROWS * WARPGROUP_ROWS
        tiles = _tiles(blocks, seqlen_q, True)
        owned = []
        for m, (start, end) in enumerate(tiles):
            assert start >= 0 and start % WARPGROUP_ROWS == 0, (seqlen_q, m, start)  # TMA row coordinate, warpgroups
            assert all((start + w) // Q_SCALE_ROWS == (start + w + WARPGROUP_ROWS - 1) // Q_SCALE_ROWS
                       for w in range(0, tile_m, WARPGROUP_ROWS))  # each warpgroup in one Q scale block
            assert start < end <= min(start + tile_m, seqlen_q)  # owns rows it computes, at least one
            owned += range(start, end)
        assert owned == list(range(seqlen_q))  # every row owned (its LSE stored) by exactly one tile, in order
        # tiles 1.. end at seqlen_q or fewer than 64 rows past it; tile 0 computes the shift rows tile 1 owns
        if len(tiles) > 1:
            assert tiles[-1][0] + tile_m - seqlen_q < WARPGROUP_ROWS
            assert tiles[0] == (0, tile_m - shift) and tiles[1][0] == tile_m - shift
        # without the switch: m tile_m, the last tile partial
        assert _tiles(blocks, seqlen_q, False) == [(m * tile_m, min((m + 1) * tile_m, seqlen_q))
                                                   for m in range(len(tiles))]


@pytest.mark.parametrize("tile_m, tile_n", [(192, 128), (192, 192), (128, 256), (128, 128)])
@pytest.mark.parametrize("seqlen_k", [1, 113, 777, 1023])
def test_kv_ranges_from_the_first_row_match_the_mask(tile_m, tile_n, seqlen_k):
    blocks = BlockInfo(tile_m, tile_n, True)
    for seqlen_q in [*range(1, 2 * tile_m + 2, 7), 1023, 4096]:
        for m, (start, _) in enumerate(_tiles(blocks, seqlen_q, True)):
            rows = range(start, min(start + tile_m, seqlen_q))  # the rows the tile computes (and TMA stores O of)
            last_key = max(min(r + seqlen_k - seqlen_q, seqlen_k - 1) for r in rows)  # < 0: the tile sees no key
            end = blocks.kv_tile_end(m, seqlen_q, seqlen_k, start)
            assert end == (last_key // tile_n + 1 if last_key >= 0 else 0), (seqlen_q, m)
            # K/V tiles before causal_start are wholly visible to the tile's first row (so to every row): unmasked
            first_visible = start + seqlen_k - seqlen_q  # the first row's last key
            assert blocks.kv_tile_causal_start(m, seqlen_q, seqlen_k, start) * tile_n <= max(first_visible + 1, 0)
            assert (blocks.kv_tile_causal_start(m, seqlen_q, seqlen_k, start) + 1) * tile_n > first_visible + 1
        # the default tiles (row_start None) are unchanged
        assert [blocks.kv_tile_end(m, seqlen_q, seqlen_k) for m in range(math.ceil(seqlen_q / tile_m))] == \
               [blocks.kv_tile_end(m, seqlen_q, seqlen_k, m * tile_m) for m in range(math.ceil(seqlen_q / tile_m))]


def test_partial_tile_work_moves_to_the_shortest_tile():
    """192-row tiles at seqlen 4096 (21 x 192 + 64): the switch makes tile 0 the one holding the 128 surplus rows (it
    walks one 128-key tile) and the last tile a full one ending at row 4096 (all 32 K/V tiles)."""
    blocks = BlockInfo(192, 128, True)
    assert blocks.q_shift(4096) == 128
    assert blocks.kv_tile_end(0, 4096, 4096, 0) == 2 and blocks.kv_tile_end(0, 4096, 4096) == 2
    last = blocks.q_row_start(21, 4096, True)
    assert last == 4096 - 192 and blocks.kv_tile_end(21, 4096, 4096, last) == 32
    # useful score work (causal) over the computed (rows x keys walked): 0.938 with the switch, 0.889 without (tile 0
    # walks 2 K/V tiles for its 192 rows; session 7's design, 128 rows before row 0 walking 1, counted 0.941)
    def useful_share(tail_first):
        work = sum(192 * 128 * blocks.kv_tile_end(m, 4096, 4096, blocks.q_row_start(m, 4096, tail_first))
                   for m in range(22))
        return 4096 * 4097 / 2 / work
    assert useful_share(False) == pytest.approx(0.889, abs=1e-3) and useful_share(True) == pytest.approx(0.938, abs=1e-3)


@pytest.mark.parametrize("change", [dict(num_splits=2), dict(pack_gqa=True), dict(persistent=True),
                                    dict(q_tail_first=1)])
def test_q_tail_first_refusals(change):
    cfg = dataclasses.replace(Sm90Config(tile_m=192, tile_n=128), **{"q_tail_first": True, **change})
    with pytest.raises(ValueError, match="q_tail_first"):
        cfg.check(128)


def test_q_tail_first_valid():
    assert dataclasses.replace(Sm90Config(tile_m=192, tile_n=128, intra_wg_overlap=False), q_tail_first=True).check(128)


@pytest.mark.parametrize("tile_m, tile_n, group", [(2, 2, 1), (3, 2, 1), (4, 3, 1), (4, 2, 2), (6, 4, 3), (2, 3, 4),
                                                   (2, 2, 6), (3, 3, 3)])
def test_block_info_tile_ranges_against_a_brute_force_walk(tile_m, tile_n, group):
    """Every BlockInfo tile range, small tiles and every small size (packed GQA too: G query heads per position,
    G dividing tile_m or a multiple of it), against the visible keys of each row: kv_tile_end is one past the last
    tile a row of the tile sees (0: none); kv_tile_causal_start the number of tiles wholly visible to the tile's first
    row (so to every row: unmasked); and, unpacked, the K/V-outer helpers' stated equivalences,
    i >= q_tile_start(n) <=> n < kv_tile_end(i) and i >= q_tile_unmasked_start(n) <=> n < kv_tile_causal_start(i)
    (both 0 without causal). A range one tile short drops keys a row sees; an unmasked tile a row must not see all of
    leaks keys past its diagonal."""
    for causal in (False, True):
        blocks = BlockInfo(tile_m, tile_n, causal, group)
        for seqlen_q in range(0, 9):
            for seqlen_k in range(0, 11):
                q_tiles, kv_tiles = math.ceil(seqlen_q * group / tile_m), math.ceil(seqlen_k / tile_n)
                # the keys each query position sees (a prefix: bottom-right causal, or all of them)
                visible = causal_visible(seqlen_q, seqlen_k).sum(-1).tolist() if causal else [seqlen_k] * seqlen_q
                for m in range(q_tiles):
                    rows = range(m * tile_m, min((m + 1) * tile_m, seqlen_q * group))
                    seen = max(visible[r // group] for r in rows)
                    assert blocks.kv_tile_end(m, seqlen_q, seqlen_k) == math.ceil(seen / tile_n), \
                        (causal, seqlen_q, seqlen_k, m)
                    if causal:  # tiles before it run without the causal mask: those the first row sees whole
                        first = visible[rows[0] // group]
                        assert blocks.kv_tile_causal_start(m, seqlen_q, seqlen_k) == first // tile_n, \
                            (seqlen_q, seqlen_k, m)
                if group != 1:
                    continue
                for n in range(kv_tiles):
                    start = blocks.q_tile_start(n, seqlen_q, seqlen_k)
                    unmasked = blocks.q_tile_unmasked_start(n, seqlen_q, seqlen_k)
                    if not causal:
                        assert start == unmasked == 0
                        continue
                    assert 0 <= start <= unmasked <= q_tiles, (seqlen_q, seqlen_k, n)
                    for i in range(q_tiles):
                        assert (i >= start) == (n < blocks.kv_tile_end(i, seqlen_q, seqlen_k)), \
                            (seqlen_q, seqlen_k, n, i)
                        assert (i >= unmasked) == (n < blocks.kv_tile_causal_start(i, seqlen_q, seqlen_k)), \
                            (seqlen_q, seqlen_k, n, i)
