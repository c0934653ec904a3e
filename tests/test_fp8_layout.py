"""fa_variants.fp8.layout: the contract between the FP8 quantisation and the fa3-fp8 kernel (CPU)."""
import pytest
import torch

from fa_variants.fp8 import layout


def test_constants():
    assert layout.TILE_M == 128
    assert layout.K_ALIGN_TOKENS % 16 == 0  # 16 e4m3 = 16 bytes (TMA stride rule)
    for d in (64, 96, 128, 256):
        assert layout.tile_n(d) % 32 == 0  # k of the FP8 P V WGMMA
        assert layout.tile_n(d) % layout.V_TOKEN_GROUP == 0  # groups never straddle a tile
    with pytest.raises(ValueError, match="head_dim"):
        layout.tile_n(80)
    with pytest.raises(ValueError, match="head_dim"):
        layout.tile_m(80)


def test_kernel_tiles_are_the_block_heights():
    """One table (KERNEL_TILES) gives the kernel's (tile_m, tile_n) and the quantiser's block heights: each
    64-row warpgroup of a CTA tile lies in one Q scale block (TILE_M % 64 == 0, tile_m in 128 / 192), the K/V
    scale block is the kernel's tile_n; the measured best tiles (64: 192 x 192, 128: 128 x 256, 256: 128 x 128)."""
    from fa_variants.fp8.quantize import tiles_for

    assert layout.KERNEL_TILES[64] == (192, 192) and layout.KERNEL_TILES[128] == (128, 256)
    assert layout.KERNEL_TILES[256] == (128, 128)
    for d, (tm, tn) in layout.KERNEL_TILES.items():
        assert layout.kernel_tiles(d) == (layout.tile_m(d), layout.tile_n(d)) == (tm, tn)
        assert tm in (128, 192) and layout.TILE_M % 64 == 0
        assert tiles_for(d) == (layout.TILE_M, tn)
    assert tiles_for(40) == (layout.TILE_M, 128)  # emulation-only head dims


@pytest.mark.parametrize("n", [0, 16, 48, 4224])
def test_v_token_order_is_a_groupwise_permutation(n):
    order = layout.v_token_order(n)
    assert order.dtype == torch.long and order.shape == (n,)
    assert torch.equal(order.sort().values, torch.arange(n))
    g = layout.V_TOKEN_GROUP
    assert torch.equal(order // g, torch.arange(n) // g)  # stays inside its group


def test_v_token_order_rejects_unpadded():
    with pytest.raises(ValueError, match="multiple"):
        layout.v_token_order(17)
    assert layout.padded_seqlen_k(17) == 32 and layout.padded_seqlen_k(0) == 0 and layout.padded_seqlen_k(32) == 32


def test_order_matches_wgmma_fragments():
    """Model the registers: the m64nNk16 fp32 accumulator gives the thread with lane % 4 = t the columns
    8v + 2t + c (c in {0, 1}) of its rows; the m64nNk32 e4m3 A fragment takes, at register byte
    i = 4h + j (h: 16-wide half, j in 0..3), the k position 16h + 4t + j. Converting the thread's
    accumulator values in order (v, c) into those bytes must give P V when V's tokens are permuted."""
    n_keys, d = 64, 8
    p = torch.rand(n_keys, dtype=torch.float64)  # one row of P
    v = torch.randn(n_keys, d, dtype=torch.float64)
    v_perm = v[layout.v_token_order(n_keys)]
    out = torch.zeros(d, dtype=torch.float64)
    for t in range(4):
        held = [8 * vv + 2 * t + c for vv in range(n_keys // 8) for c in range(2)]  # accumulator order
        for kb in range(n_keys // 32):  # one k32 block per 32 keys
            mine = held[8 * kb: 8 * kb + 8]  # the thread's 8 values of this block, in register order
            for i, col in enumerate(mine):
                h, j = divmod(i, 4)
                pos = 32 * kb + 16 * h + 4 * t + j
                out += p[col] * v_perm[pos]
    torch.testing.assert_close(out, p @ v, rtol=1e-12, atol=1e-12)
    # and the identity order would not:
    out_id = sum(p[8 * vv + 2 * t + c] * v[32 * (vv // 4) + 16 * ((vv % 4) // 2) + 4 * t + 2 * (vv % 2) + c]
                 for t in range(4) for vv in range(n_keys // 8) for c in range(2))
    assert not torch.allclose(out_id, p @ v)
