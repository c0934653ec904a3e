"""common.tile_order: the host side of fa3's balanced persistent schedule (Sm90Config.balanced). The kernel reads
CTA b's r-th tile from table[r G + b]; every tile must appear once, in its own round (the L2 order), and the table
must even out the causal tiles' costs where the static schedule (table = identity) does not."""
import dataclasses

import pytest
import torch

from fa_variants.common import tile_order
from fa_variants.common.mask import BlockInfo
from fa_variants.hopper import fa3

# (head_dim, seqlen, tile_m, tile_n): fa3's defaults at B x N = 16k, H x D = 2048, and odd cases
SHAPES = [(128, 1024, 128, 128), (128, 2048, 128, 128), (128, 4096, 128, 128), (128, 16384, 128, 128),
          (64, 1024, 128, 128), (64, 4096, 192, 128), (256, 4096, 128, 80), (128, 300, 128, 128), (64, 113, 192, 128)]


def _costs(head_dim, seqlen, tile_m, tile_n, causal=True):
    batch, heads = max(1, 16384 // seqlen), 2048 // head_dim
    m_blocks = tile_order.tile_m_blocks(-(-seqlen // tile_m), heads, batch, fa3.l2_section_heads(seqlen, head_dim),
                                        causal)
    return tile_order.causal_tile_costs(m_blocks, tile_m, tile_n, seqlen, seqlen)


def _loads(costs, table, ctas):
    grid = min(ctas, len(costs))
    return torch.zeros(grid, dtype=torch.float64).index_add_(0, torch.arange(len(costs)) % grid, costs[table.long()])


@pytest.mark.parametrize("ctas", [132, 7, 1, 100000])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"d{d}-n{n}-m{m}" for d, n, m, _ in SHAPES])
def test_table_is_a_permutation_within_rounds(shape, ctas):
    costs = _costs(*shape)
    table = tile_order.balanced_order(costs, ctas)
    total, grid = len(costs), min(ctas, len(costs))
    assert table.dtype == torch.int32 and sorted(table.tolist()) == list(range(total))
    slots = torch.arange(total)
    assert torch.equal(slots // grid, table.long() // grid)  # round r holds the static schedule's round r


@pytest.mark.parametrize("shape", SHAPES[:7], ids=[f"d{d}-n{n}" for d, n, _, _ in SHAPES[:7]])
def test_table_evens_out_causal_costs(shape):
    """Most loaded CTA over the mean (132 CTAs): <= 1.03 dealt by load, where the static schedule is 1.03-1.4."""
    costs = _costs(*shape)
    static = _loads(costs, torch.arange(len(costs), dtype=torch.int32), 132)
    dealt = _loads(costs, tile_order.balanced_order(costs, 132), 132)
    assert float(dealt.max() / dealt.mean()) <= 1.03
    assert float(dealt.max()) < float(static.max())


def test_equal_costs_keep_the_static_order():
    """Non-causal tiles cost the same: the table is the static schedule itself."""
    for total, ctas in ((2048, 132), (5, 132), (133, 132)):
        table = tile_order.balanced_order(torch.ones(total, dtype=torch.float64), ctas)
        assert torch.equal(table, torch.arange(total, dtype=torch.int32)), (total, ctas)


def test_costs_follow_the_kernels_tile_ranges():
    """causal_tile_costs = BlockInfo.kv_tile_end (at least 1) + TILE_FIXED_COST, Nq != Nk both ways."""
    for seqlen_q, seqlen_k, tile_m, tile_n in ((1000, 1000, 128, 128), (113, 1023, 192, 128), (1023, 113, 128, 80),
                                               (4224, 4224, 128, 176)):
        info = BlockInfo(tile_m, tile_n, True)
        m_blocks = torch.arange(-(-seqlen_q // tile_m))
        got = tile_order.causal_tile_costs(m_blocks, tile_m, tile_n, seqlen_q, seqlen_k)
        want = [max(info.kv_tile_end(int(m), seqlen_q, seqlen_k), 1) + tile_order.TILE_FIXED_COST for m in m_blocks]
        assert got.tolist() == want, (seqlen_q, seqlen_k)


def test_tile_order_is_the_schedulers():
    """tile_m_blocks: non-causal m fastest; causal longest first within L2 sections (a short last section too); and
    the kernel's own tile_coords (its Python body, run on ints) gives the same query tile for every work tile."""
    import random

    from fa_variants.common import tile_scheduler

    assert tile_order.tile_m_blocks(3, 2, 1, 1, False).tolist() == [0, 1, 2, 0, 1, 2]
    # 3 query tiles x 5 (batch, head) pairs, sections of 2: [2 2 1 1 0 0] [2 2 1 1 0 0] [2 1 0]
    assert tile_order.tile_m_blocks(3, 5, 1, 2, True).tolist() == [2, 2, 1, 1, 0, 0] * 2 + [2, 1, 0]
    coords = tile_scheduler.tile_coords.__wrapped__  # the traced function's body: plain ints in, plain ints out
    rng = random.Random()
    for _ in range(20):
        m, heads, batches, l2 = rng.randint(1, 9), rng.randint(1, 7), rng.randint(1, 3), 2 ** rng.randint(0, 3)
        for causal in (False, True):
            want = [coords(t, m, heads, batches, l2, causal)[0] for t in range(m * heads * batches)]
            assert tile_order.tile_m_blocks(m, heads, batches, l2, causal).tolist() == want, (m, heads, batches, l2)


def test_plan_call_appends_the_table(monkeypatch):
    """fa3's plan of a balanced config passes the table after the CTA count: the same for every call of the plan."""
    monkeypatch.setattr(fa3, "_sm_count", lambda q: 7)
    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[128], persistent=True, balanced=True)
    q = torch.randn(2, 300, 4, 128, dtype=torch.float16)
    k = v = torch.randn(2, 300, 2, 128, dtype=torch.float16)
    prepare, finish = fa3._plan_call(config, q, k, v, 0.1, True)
    args = prepare(q, k, v, None, None)
    assert finish is None and args[7] == 7 and len(args) == 9
    assert fa3.balanced_table(config, q, k, True) is args[8] and prepare(q, k, v, None, None)[8] is args[8]
    assert sorted(args[8].tolist()) == list(range(3 * 4 * 2))


def test_the_table_is_made_outside_graph_capture(monkeypatch):
    """A table is made once per device and geometry and kept for the process (a captured graph keeps its address);
    its first use inside CUDA graph capture raises a one-line ValueError (its host copy cannot be captured), a made
    one serves captured calls; auto's short causal calls first seen in capture keep the static schedule."""
    from fa_variants.common import workspace

    monkeypatch.setattr(fa3, "_sm_count", lambda q: 5)
    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[128], persistent=True, balanced=True)
    q = torch.randn(1, 517, 3, 128, dtype=torch.float16)
    k = torch.randn(1, 517, 3, 128, dtype=torch.float16)
    monkeypatch.setattr(workspace, "capturing", lambda device: True)
    with pytest.raises(ValueError, match=r"^config\.balanced=True: .*run the call once before capturing$"):
        fa3.balanced_table(config, q, k, True)
    monkeypatch.setattr(workspace, "capturing", lambda device: False)
    made = fa3.balanced_table(config, q, k, True)
    assert fa3.balanced_table(config, q, k, False) is not made  # causal is part of the key (its costs)
    monkeypatch.setattr(workspace, "capturing", lambda device: True)
    assert fa3.balanced_table(config, q, k, True) is made


def test_short_balanced_in_capture_only_with_its_table(monkeypatch):
    """A short causal call first seen inside CUDA graph capture keeps the static schedule (its table cannot be made
    there); once the shape's table exists (an eager call before the capture) the capture runs the balanced grid."""
    from fa_variants.common import workspace

    monkeypatch.setattr(fa3, "SHORT_BALANCED", True)
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K", 3072)
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K_CAUSAL", 1536)
    monkeypatch.setattr(fa3, "_TABLES", {})
    q = k = torch.randn(32, 1024, 16, 128, dtype=torch.float16)
    config = fa3.short_config(q, k, True)
    assert config.balanced and not fa3.short_config(q, k, False).balanced
    monkeypatch.setattr(workspace, "capturing", lambda device: True)
    assert fa3.short_config(q, k, True) == fa3._SHORT_CONFIGS[128, True]
    monkeypatch.setattr(workspace, "capturing", lambda device: False)
    fa3.balanced_table(config, q, k, True)
    monkeypatch.setattr(workspace, "capturing", lambda device: True)
    assert fa3.short_config(q, k, True) is config


def test_short_balanced_tables_are_bounded(monkeypatch):
    """The tables kept for the process are bounded (TABLES_MAX_BYTES): past the bound a new shape takes the static
    rules (here within the static causal limit: the static persistent grid), a shape whose table exists still gets
    its balanced grid, and the bytes counted are those of the tables kept."""
    monkeypatch.setattr(fa3, "SHORT_BALANCED", True)
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K", 3072)
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K_CAUSAL", 1536)
    monkeypatch.setattr(fa3, "_TABLES", {})
    q = k = torch.randn(32, 1024, 16, 128, dtype=torch.float16)  # 8 x 16 x 32 = 4096 tiles: 16 KiB
    config = fa3.short_config(q, k, True)
    assert config.balanced and fa3.balanced_table(config, q, k, True).numel() == 4096
    assert [t.numel() for t in fa3._TABLES.values()] == [4096]
    monkeypatch.setattr(fa3, "TABLES_MAX_BYTES", 4 * 4096 + 4 * 4095)
    assert fa3.short_config(q, k, True) is config  # made already
    q2 = k2 = torch.randn(32, 1000, 16, 128, dtype=torch.float16)  # a new shape of 4096 tiles: past the bound
    assert fa3.short_config(q2, k2, True) == fa3._SHORT_CONFIGS[128, True]
    monkeypatch.setattr(fa3, "TABLES_MAX_BYTES", 64 << 20)
    assert fa3.short_config(q2, k2, True).balanced


def test_balanced_needs_the_persistent_grid():
    base = fa3.DEFAULT_CONFIGS[128]
    for bad in (dict(balanced=True), dict(balanced=True, persistent=True, pack_gqa=True), dict(balanced=1)):
        with pytest.raises(ValueError, match="^balanced="):
            dataclasses.replace(base, **bad).check(128)
    dataclasses.replace(base, balanced=True, persistent=True).check(128)
