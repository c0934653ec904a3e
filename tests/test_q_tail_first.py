"""CPU checks of ``Sm90Config.q_tail_first`` (causal: the query tiles laid from the last row back, so a partial tile
is the first one): the tile ranges of ``common.mask.BlockInfo`` with a row shift against a brute-force walk of the
causal mask, the shift's rounding to whole warpgroups, the tile count, and the config's refusals."""
import dataclasses
import math

import pytest

from fa_variants.common.config import Sm90Config
from fa_variants.common.mask import BlockInfo


def q_shift(seqlen_q: int, tile_m: int) -> int:
    """The kernel's shift (``FlashAttention3Sm90._q_shift``), in plain Python."""
    return (tile_m - seqlen_q % tile_m) % tile_m // 64 * 64


@pytest.mark.parametrize("tile_m, tile_n", [(192, 128), (192, 192), (128, 256)])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(4096, 4096), (113, 113), (1023, 113), (113, 1023), (200, 777), (65, 1)])
def test_tile_ranges_with_the_shift_match_the_mask(tile_m, tile_n, seqlen_q, seqlen_k):
    blocks = BlockInfo(tile_m, tile_n, True)
    shift = q_shift(seqlen_q, tile_m)
    assert shift % 64 == 0 and 0 <= shift < tile_m
    tiles = math.ceil((seqlen_q + shift) / tile_m)
    assert tiles == math.ceil(seqlen_q / tile_m)  # the grid the host launches is unchanged
    for m in range(tiles):
        rows = [r for r in range(m * tile_m - shift, (m + 1) * tile_m - shift) if 0 <= r < seqlen_q]
        assert rows, (m, shift)  # every tile holds a stored row
        seen = [c for r in rows for c in range(seqlen_k) if c <= r + seqlen_k - seqlen_q]
        end = blocks.kv_tile_end(m, seqlen_q, seqlen_k, shift)
        assert end == (max(seen) // tile_n + 1 if seen else 0)
        # tiles >= causal_start cross the diagonal of some row (row -shift .. included: masked, never stored)
        start = blocks.kv_tile_causal_start(m, seqlen_q, seqlen_k, shift)
        first = m * tile_m - shift
        assert all(c <= first + seqlen_k - seqlen_q for c in range(start * tile_n))
    # without the switch's shift the 4096-row problem's last 192-row tile is the partial, longest one
    if (seqlen_q, seqlen_k, tile_m) == (4096, 4096, 192):
        assert shift == 128 and blocks.kv_tile_end(0, 4096, 4096, shift) == 1
        assert blocks.kv_tile_end(tiles - 1, 4096, 4096) == -(-4096 // tile_n)


@pytest.mark.parametrize("change", [dict(num_splits=2), dict(pack_gqa=True), dict(persistent=True),
                                    dict(kv_multicast=True), dict(q_tail_first=1)])
def test_q_tail_first_refusals(change):
    cfg = dataclasses.replace(Sm90Config(tile_m=192, tile_n=128), **{"q_tail_first": True, **change})
    with pytest.raises(ValueError, match="q_tail_first"):
        cfg.check(128)


def test_q_tail_first_valid():
    assert dataclasses.replace(Sm90Config(tile_m=192, tile_n=128, intra_wg_overlap=False), q_tail_first=True).check(128)
