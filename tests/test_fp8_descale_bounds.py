"""The fa3-fp8 kernel's reads of its float32 side tensors stay in bounds (CPU; a model of its index arithmetic).

The kernel reads q_descale (batch, num_heads, cdiv(seqlen_q, TILE_M)) once per 64-row warpgroup at
``layout.q_scale_block`` of the warpgroup's first row, and k_descale / v_descale (batch, num_heads_kv,
cdiv(seqlen_k, tile_n)) at the K/V tiles it walks: n_block in [0, n_blocks), n_block + 1 for every tile but the
first visited (O's units, the interval / fused promotion), max(n_block - 1, 0) (descale_prefetch) and 0 (finalize),
with n_blocks = max(``BlockInfo.kv_tile_end``, 1) (``FlashAttention3Sm90._num_kv_blocks``). Session 10's memcheck
found the Q read one past the end (d64's 192-row tile at seqlen_q 113: rows 128-191 read block 1 of 1); this sweeps
every tile shape of the fa3-fp8 configs (DEFAULT_CONFIGS and the A/B variants: tile_m 128 / 192, tile_n 64-256,
q_tail_first, causal and not) over odd sizes with the same pure-Python arithmetic the kernel traces.
"""
import itertools

import pytest

from fa_variants.fp8 import layout

mask = pytest.importorskip("fa_variants.common.mask")

SEQLENS_Q = (1, 2, 63, 64, 65, 113, 127, 128, 129, 191, 192, 193, 255, 256, 257, 300, 383, 384, 385, 577)
SEQLENS_K = (1, 17, 65, 129, 203, 300, 517, 1000)
TILES_M = (128, 192)
TILES_N = (64, 96, 128, 160, 192, 256)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _warpgroup_rows(tile_m: int, seqlen_q: int, tail_first: bool, causal: bool):
    """(m_block, first row of each 64-row warpgroup) of every query tile, as the kernel computes them."""
    info = mask.BlockInfo(tile_m, 64, causal)
    for m_block in range(_cdiv(seqlen_q, tile_m)):
        start = info.q_row_start(m_block, seqlen_q, tail_first and causal)
        yield m_block, [start + wg * 64 for wg in range(tile_m // 64)]


@pytest.mark.parametrize("tile_m, tail_first, causal", list(itertools.product(TILES_M, (False, True), (False, True))))
def test_q_descale_index_in_bounds(tile_m, tail_first, causal):
    """Every warpgroup reads a block of q_descale; one with a row < seqlen_q reads its own block (first_row // 128)."""
    for seqlen_q in SEQLENS_Q:
        blocks = _cdiv(seqlen_q, layout.TILE_M)
        for _, rows in _warpgroup_rows(tile_m, seqlen_q, tail_first, causal):
            for first in rows:
                assert first >= 0
                b = layout.q_scale_block(first, blocks)
                assert 0 <= b < blocks, (tile_m, seqlen_q, first)
                if first < seqlen_q:  # a warpgroup with real rows: its own block, all of its rows inside it
                    assert b == first // layout.TILE_M == (min(first + 63, seqlen_q - 1)) // layout.TILE_M
                else:  # clamped only where no row is real: its O and LSE are never stored
                    assert first >= blocks * layout.TILE_M or b == first // layout.TILE_M


def test_unclamped_index_was_out_of_bounds():
    """The read memcheck reported (B 2, seqlen_q 113, H 6, d64's 192 x 192 tile): warpgroup 2 of the one query tile
    starts at row 128, block 1 of a 1-block q_descale; the last CTA (batch 1, head 5) read flat index 12 of 12."""
    tile_m = layout.tile_m(64)
    assert tile_m == 192
    (_, rows), = list(_warpgroup_rows(tile_m, 113, False, True))
    assert rows[2] // layout.TILE_M == 1 == _cdiv(113, layout.TILE_M)  # the old index: one past the end
    assert layout.q_scale_block(rows[2], 1) == 0
    batch, heads = 2, 6
    assert ((batch - 1) * heads + heads - 1) * 1 + rows[2] // layout.TILE_M == batch * heads * 1


@pytest.mark.parametrize("tile_m, tile_n", list(itertools.product(TILES_M, TILES_N)))
def test_kv_descale_indices_in_bounds(tile_m, tile_n):
    """The K/V tiles each query tile walks, and the descale indices read from them, lie in
    [0, cdiv(seqlen_k, tile_n)) for causal and not, with and without q_tail_first, both ways of seqlen_q vs seqlen_k."""
    for causal, tail_first in itertools.product((False, True), (False, True)):
        info = mask.BlockInfo(tile_m, tile_n, causal)
        for seqlen_q, seqlen_k in itertools.product(SEQLENS_Q, SEQLENS_K):
            blocks = _cdiv(seqlen_k, tile_n)
            for m_block in range(_cdiv(seqlen_q, tile_m)):
                start = info.q_row_start(m_block, seqlen_q, tail_first and causal) if tail_first and causal else None
                n_blocks = max(info.kv_tile_end(m_block, seqlen_q, seqlen_k, start), 1)
                first_visited = n_blocks - 1  # tiles are walked from the last to the first
                reads = {0}
                for n in range(n_blocks):
                    reads |= {n, max(n - 1, 0)} | ({n + 1} if n != first_visited else set())
                assert min(reads) >= 0 and max(reads) < blocks, (causal, tail_first, seqlen_q, seqlen_k, m_block)


def test_kernel_configs_are_swept():
    """The tiles of every fa3-fp8 default config lie in the sweep above (a new tile shape must be added there)."""
    fa3_fp8 = pytest.importorskip("fa_variants.hopper.fa3_fp8")
    for d, cfg in fa3_fp8.DEFAULT_CONFIGS.items():
        assert cfg.tile_m in TILES_M and cfg.tile_n in TILES_N, (d, cfg.tile_m, cfg.tile_n)
        assert not cfg.pack_gqa  # packed rows would index q_descale by KV head: refused (Fp8Config.check)


def test_pack_gqa_refused():
    fa3_fp8 = pytest.importorskip("fa_variants.hopper.fa3_fp8")
    import dataclasses

    cfg = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], pack_gqa=True)
    with pytest.raises(ValueError, match="pack_gqa=True is not supported"):
        cfg.check(128)


def test_pack_gqa_refused_through_the_public_entries(monkeypatch):
    """pack_gqa with fa3-fp8 is a one-line error naming the argument at every public entry: ``attention(...,
    backend="fa3-fp8", pack_gqa=...)`` (the dispatcher's choice forced to fa3-fp8, as on an H200), ``attention_fp8`` and
    ``attention_from_fp8`` (no such keyword), and the custom op (its schema has no such argument)."""
    import torch

    from fa_variants import api, dispatch
    from fa_variants.fp8 import attention as fp8_attention

    monkeypatch.setattr(dispatch, "select_backend", lambda *a, **kw: dispatch.Selection("fa3-fp8", "test", ("fa3-fp8",)))
    q = torch.randn(1, 4, 2, 64, dtype=torch.bfloat16)
    k = torch.randn(1, 4, 1, 64, dtype=torch.bfloat16)
    for value in (True, False):
        with pytest.raises(ValueError, match="pack_gqa") as err:
            api.attention(q, k, k, backend="fa3-fp8", pack_gqa=value)
        assert "\n" not in str(err.value) and "fa3-fp8" in str(err.value)
    for fn, args in ((fp8_attention.attention_fp8, (q, k, k)), (fp8_attention.attention_from_fp8, (None,))):
        with pytest.raises(TypeError, match="pack_gqa"):
            fn(*args, pack_gqa=True)
    op = pytest.importorskip("fa_variants.integrations.custom_op")
    schema = str(op.attention_op._opoverload._schema)
    assert "str backend" in schema and "pack_gqa" not in schema, schema
