"""The tile-loop emulators of fa_variants.emulate: exact maths (float64) and exact HBM counts.

The closed forms below are written from the papers' algorithms (FlashAttention Algorithm 0 and 1,
FlashAttention-2 Algorithm 1), independently of the emulator and of emulate.hbm_counts, so a wrong loop, a
missing load or an extra store fails here.
"""
import math

import pytest
import torch

from fa_variants.cli import main
from fa_variants.emulate import (HBM, _tile_counts, causal_kv_tiles, emulate, fa1_tile_sizes, hbm_bytes, hbm_counts,
                                  tile_sums)
from helpers import seeded_generator

ALGOS = ("standard", "fa1", "fa2")
cdiv = lambda a, b: -(-a // b)  # noqa: E731


def naive_attention(q, k, v, causal, scale):
    """float64 attention: (B, N, H, D) layout, bottom-right causal, GQA, rows seeing no key -> 0 / -inf."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    Nq, Nk = q.shape[1], k.shape[1]
    if causal:
        s = s.masked_fill(torch.arange(Nk)[None] > torch.arange(Nq)[:, None] + Nk - Nq, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(nan=0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def inputs(B, Nq, Nk, H, Hkv, D, seed=0):
    g = seeded_generator(offset=seed)
    r = lambda n, h: torch.randn(B, n, h, D, generator=g, dtype=torch.float64)  # noqa: E731
    return r(Nq, H), r(Nk, Hkv), r(Nk, Hkv)


# (B, Nq, Nk, H, Hkv, D, Br, Bc)
SHAPES = [
    (2, 113, 203, 4, 2, 40, 16, 32),   # odd sizes, GQA 2:1, tail tiles on both axes
    (1, 203, 113, 3, 1, 24, 32, 16),   # Nq > Nk: causal rows that see no key; MQA
    (1, 1, 1, 2, 2, 8, 16, 16),
    (1, 3, 1, 1, 1, 8, 2, 1),
    (1, 64, 128, 2, 2, 16, 16, 32),    # tiles divide exactly
]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-Nq{}-Nk{}-H{}-Hkv{}-D{}-Br{}-Bc{}".format(*s))
def test_matches_float64_reference(algo, causal, shape):
    B, Nq, Nk, H, Hkv, D, Br, Bc = shape
    q, k, v = inputs(B, Nq, Nk, H, Hkv, D)
    scale = 0.7 / math.sqrt(D)
    out, lse, _ = emulate(algo, q, k, v, causal=causal, softmax_scale=scale, Br=Br, Bc=Bc)
    ref_out, ref_lse = naive_attention(q, k, v, causal, scale)
    assert out.shape == q.shape and lse.shape == (B, H, Nq)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=1e-12, rtol=0)  # equal -infs compare equal
    if causal and Nq > Nk:
        assert torch.isneginf(lse[:, :, : Nq - Nk]).all() and (out[:, : Nq - Nk] == 0).all()


def test_bad_shapes_raise():
    q, k, v = inputs(1, 8, 8, 3, 2, 8)
    with pytest.raises(ValueError, match="^num_heads 3 not divisible by num_heads_kv 2$"):  # attention's message
        emulate("fa2", q, k, v)
    q, k, v = inputs(1, 8, 8, 2, 2, 8)
    with pytest.raises(ValueError, match="Br=0"):
        emulate("fa1", q, k, v, Br=0)
    with pytest.raises(ValueError, match="algorithm"):
        emulate("fa9", q, k, v)


def test_hbm_counts_elements():
    hbm = HBM()
    dst = torch.zeros(4, 5)
    t = hbm.read("Q", dst[1:3])
    hbm.write("O", dst[:, :2], torch.ones(4, 2))
    assert t.shape == (2, 5) and hbm.reads["Q"] == 10 and hbm.writes["O"] == 8 and hbm.total == 18
    assert dst[:, :2].eq(1).all() and hbm.counts() == {"O": (0, 8), "Q": (10, 0)}


# ------------------------------------------------------------------------------- closed forms (test-side)

NONCAUSAL = [(2, 113, 203, 4, 2, 40, 16, 32), (1, 256, 256, 2, 2, 32, 64, 32), (1, 100, 37, 1, 1, 8, 7, 5)]


@pytest.mark.parametrize("shape", NONCAUSAL)
def test_standard_counts(shape):
    """Algorithm 0: Q, K read for S; S written, read, P written; P, V read for O. Theta(N d + N^2)."""
    B, Nq, Nk, H, Hkv, D, _, _ = shape
    hbm = emulate("standard", *inputs(B, Nq, Nk, H, Hkv, D)).hbm
    bh = B * H
    assert hbm.total_reads == bh * ((Nq + 2 * Nk) * D + 2 * Nq * Nk)
    assert hbm.total_writes == bh * (2 * Nq * Nk + Nq * D + Nq)
    assert hbm.reads["S"] == hbm.writes["S"] == hbm.reads["P"] == hbm.writes["P"] == bh * Nq * Nk


@pytest.mark.parametrize("shape", NONCAUSAL)
def test_fa1_counts(shape):
    """Algorithm 1: K, V once; Q, O, l, m read and O, l, m written Tc times; plus init and the LSE pass."""
    B, Nq, Nk, H, Hkv, D, Br, Bc = shape
    hbm = emulate("fa1", *inputs(B, Nq, Nk, H, Hkv, D), Br=Br, Bc=Bc).hbm
    bh, Tc = B * H, cdiv(Nk, Bc)
    assert hbm.reads["K"] == hbm.reads["V"] == bh * Nk * D
    assert hbm.reads["Q"] == hbm.reads["O"] == bh * Tc * Nq * D
    assert hbm.writes["O"] == bh * (Tc + 1) * Nq * D  # + the zero initialisation (line 2)
    for stat in "lm":
        assert hbm.reads[stat] == hbm.writes[stat] == bh * (Tc + 1) * Nq
    assert hbm.writes["LSE"] == bh * Nq
    assert hbm.total == bh * (Nk * D * 2 + Tc * Nq * D * 3 + Nq * D + 4 * (Tc + 1) * Nq + Nq)


@pytest.mark.parametrize("shape", NONCAUSAL)
def test_fa2_counts(shape):
    """FA2 Algorithm 1: Q read once, K and V Tr times, O and LSE written once."""
    B, Nq, Nk, H, Hkv, D, Br, Bc = shape
    hbm = emulate("fa2", *inputs(B, Nq, Nk, H, Hkv, D), Br=Br, Bc=Bc).hbm
    bh, Tr = B * H, cdiv(Nq, Br)
    assert hbm.counts() == {"Q": (bh * Nq * D, 0), "K": (bh * Tr * Nk * D, 0), "V": (bh * Tr * Nk * D, 0),
                            "O": (0, bh * Nq * D), "LSE": (0, bh * Nq)}


@pytest.mark.parametrize("T,Bt", [(4, 16), (7, 8)])
def test_causal_square_closed_form(T, Bt):
    """N = T Bt, Br = Bc = Bt, causal: T (T + 1) / 2 tile pairs are visited instead of T^2."""
    N, D, pairs = T * Bt, 8, T * (T + 1) // 2
    q, k, v = inputs(1, N, N, 1, 1, D)
    fa1 = emulate("fa1", q, k, v, causal=True, Br=Bt, Bc=Bt).hbm
    fa2 = emulate("fa2", q, k, v, causal=True, Br=Bt, Bc=Bt).hbm
    assert fa1.reads["Q"] == fa1.reads["O"] == pairs * Bt * D and fa1.reads["K"] == N * D
    assert fa1.writes["O"] == pairs * Bt * D + N * D
    assert fa2.reads["K"] == fa2.reads["V"] == pairs * Bt * D and fa2.reads["Q"] == N * D


def visible_tiles(Nq, Nk, Br, Bc):
    """Brute force from the element mask: (Tr, Tc) bool, tile (i, j) has some query that sees some key."""
    seen = torch.arange(Nk)[None] <= torch.arange(Nq)[:, None] + Nk - Nq
    Tr, Tc = cdiv(Nq, Br), cdiv(Nk, Bc)
    padded = torch.zeros(Tr * Br, Tc * Bc, dtype=torch.bool)
    padded[:Nq, :Nk] = seen
    return padded.view(Tr, Br, Tc, Bc).any(dim=3).any(dim=1)


@pytest.mark.parametrize("shape", SHAPES[:2] + [(1, 100, 37, 1, 1, 8, 7, 5), (1, 37, 100, 2, 1, 8, 5, 7)])
def test_causal_counts_general(shape):
    """Causal tile skipping, any sizes: counts equal sums over the visible tiles of the element mask."""
    B, Nq, Nk, H, Hkv, D, Br, Bc = shape
    vis = visible_tiles(Nq, Nk, Br, Bc)
    rows = torch.tensor([min(Br, Nq - i * Br) for i in range(vis.shape[0])])
    cols = torch.tensor([min(Bc, Nk - j * Bc) for j in range(vis.shape[1])])
    bh = B * H
    q, k, v = inputs(B, Nq, Nk, H, Hkv, D)
    fa1 = emulate("fa1", q, k, v, causal=True, Br=Br, Bc=Bc).hbm
    steps = int((vis * rows[:, None]).sum())
    assert fa1.reads["Q"] == fa1.reads["O"] == bh * steps * D
    assert fa1.writes["O"] == bh * (steps + Nq) * D and fa1.writes["l"] == bh * (steps + Nq)
    assert fa1.reads["K"] == bh * int(cols[vis.any(dim=0)].sum()) * D
    fa2 = emulate("fa2", q, k, v, causal=True, Br=Br, Bc=Bc).hbm
    assert fa2.reads["K"] == fa2.reads["V"] == bh * int((vis * cols[None]).sum()) * D
    assert fa2.reads["Q"] == bh * int(rows[vis.any(dim=1)].sum()) * D
    assert fa2.writes["O"] == bh * Nq * D and fa2.writes["LSE"] == bh * Nq


# ------------------------------------------------------------------- the library's closed form and bytes

SWEEP = [(B, Nq, Nk, H, Hkv, D, Br, Bc, c) for (B, Nq, Nk, H, Hkv, D, Br, Bc) in SHAPES + NONCAUSAL
         for c in (False, True)]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("case", SWEEP)
def test_hbm_counts_equals_emulator(algo, case):
    """emulate.hbm_counts (used by `fa-variants io` for large N, and hbm_bytes) equals the counted traffic."""
    B, Nq, Nk, H, Hkv, D, Br, Bc, causal = case
    hbm = emulate(algo, *inputs(B, Nq, Nk, H, Hkv, D), causal=causal, Br=Br, Bc=Bc).hbm
    assert hbm_counts(algo, B, H, Nq, Nk, D, Br, Bc, causal) == hbm.counts()


def test_hbm_bytes():
    B, H, N, D, Br, Bc = 2, 16, 4096, 128, 128, 64
    Tr, bh = N // Br, B * H
    b = hbm_bytes("fa2", B, H, N, N, D, Br, Bc, 2, False)
    assert (b.read, b.write) == (bh * 2 * (N * D + 2 * Tr * N * D), bh * (2 * N * D + 4 * N))
    assert b.total == b.read + b.write
    b1 = hbm_bytes("fa1", B, H, N, N, D, Br, Bc, 2, False, o_bytes=4)
    Tc = N // Bc
    assert b1.write == bh * (4 * (Tc + 1) * N * D + 4 * 2 * (Tc + 1) * N + 4 * N)
    assert b1.read == bh * (2 * (2 * N * D + Tc * N * D) + 4 * Tc * N * D + 4 * 2 * (Tc + 1) * N)


def test_theorem2_scaling():
    """FA paper Theorem 2: FA1 accesses / (N^2 d^2 / M) stays bounded for d <= M <= N d; standard / (Nd + N^2) too."""
    for N in (1024, 4096, 16384):
        for d in (64, 128):
            std = sum(r + w for r, w in hbm_counts("standard", 1, 1, N, N, d).values())
            assert 3 < std / (N * d + N * N) < 5
            for M in (4 * d * d, 16 * 1024, 64 * 1024, N * d):
                Br, Bc = fa1_tile_sizes(M, d)
                fa1 = sum(r + w for r, w in hbm_counts("fa1", 1, 1, N, N, d, Br, Bc).values())
                assert 6 < fa1 / (N * N * d * d / M) < 30, (N, d, M)


def test_fa1_tile_sizes():
    assert fa1_tile_sizes(51200, 64) == (64, 200)
    assert fa1_tile_sizes(51200, 128) == (100, 100)


def test_io_cli(capsys):
    assert main(["io", "--N", "128", "256", "--d", "32", "--sram-kb", "8", "--emulate-max", "128"]) == 0
    out = capsys.readouterr().out
    assert "emulated" in out and "closed form" in out and "N^2d^2/M" in out
    assert main(["io", "--N", "64", "--d", "16", "--sram-kb", "4", "--causal", "--fa2-tiles", "32", "16"]) == 0
    assert "FA2 with Br, Bc = 32, 16" in capsys.readouterr().out


def test_tile_sums_closed_form_is_the_loop_over_tiles():
    """emulate.tile_sums (the floor-sum closed form, session 28) equals the plain loop over Q tiles on every small
    case: Nq, Nk 0..23 (Nq != Nk both ways, empty sides), tile sizes 1..6, causal and not; and a call at N = 1e11,
    where the loop ran for minutes (`fa-variants io --N 100000000000` never finished), returns at once with the
    values of a square causal call (Br = Bc: tile i visits i + 1 K/V tiles)."""
    import itertools
    import time

    def loop(Nq, Nk, Br, Bc, causal):
        Tr, Tc = _tile_counts(Nq, Nk, Br, Bc)
        tiles = [(min(Br, Nq - i * Br), causal_kv_tiles(min((i + 1) * Br, Nq), Nq, Nk, Bc) if causal else Tc)
                 for i in range(Tr)]
        return (sum(r * n for r, n in tiles), sum(min(n * Bc, Nk) for _, n in tiles), sum(r for r, n in tiles if n))

    for Nq, Nk, Br, Bc, causal in itertools.product(range(24), range(24), range(1, 7), range(1, 7), (False, True)):
        assert tile_sums(Nq, Nk, Br, Bc, causal) == loop(Nq, Nk, Br, Bc, causal), (Nq, Nk, Br, Bc, causal)
    start, N, B = time.perf_counter(), 10**11, 64
    T = N // B
    assert tile_sums(N, N, B, B, True) == (B * T * (T + 1) // 2, B * T * (T + 1) // 2, N)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("args, message", [
    (["--sram-kb", "1e308"], "--sram-kb 1e+308 is too large"),
    (["--sram-kb", "0.001"], "--sram-kb 0.001 holds no element of --elem-bytes 2"),
    (["--sram-kb", "1", "--elem-bytes", "2048"], "--elem-bytes 2048 (M = 0)")])
def test_io_cli_sram_out_of_range_is_one_line(capsys, args, message):
    """`fa-variants io` with an SRAM size that overflows in bytes, or holds no element: one line naming the flags,
    exit 2 (were an OverflowError traceback and "M and d must be >= 1", naming neither flag; session 28)."""
    assert main(["io", "--N", "64", "--d", "64", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err, err
