"""Why the fa3-fp8 two-level cost at head_dim 256 grows with seqlen (issue 10): a CPU model (no GPU).

The reference of the cost, ``single_overlap`` (one running accumulator, ``skip_unit_rescale`` on as in every default
config), rescales O (128 FMULs a thread, O *= alpha v_descale[n + 1] / v_descale[n]) under a branch that a warp skips
when no row max of its 16 rows moved and the V descale ratio is exactly 1 (``OnlineSoftmax.rescale(skip_ones=True)``;
the A/B's inputs, scripts/fa3_fp8_gpu.py::fp8_inputs, have every descale 0.05, so the ratio is always 1). The
two-level default (``fused_promote``) adds each tile's temporary into O with one FFMA per element on every tile: no
skip can exist there. So the single accumulator's CUDA-core work per tile falls with the number of tiles a row has
seen, and the default's does not.

``moved``: the fraction of (warp, K/V tile) steps on which a warp runs the rescale, measured on the A/B's own inputs
(e4m3 of N(0, 1) x 20, descales 0.05, softmax_scale D^-1/2; tiles walked last to first as the kernel; the first visited
tile has no rescale; causal rows see keys <= their own, bottom-right). ``fit``: a per-CTA time model, fixed part f plus
per tile 1 (single, no rescale) + delta (the rescale when a warp runs it) or tau_d (default), solved from the four
non-causal medians of one A/B run (``RUNS``: sessions 9, 10, 11), then used to predict that run's causal two-level
costs, which the fit did not see. tau_d / (1 + delta) is the default against a single accumulator that rescales on
every tile: ~1 means the two-level schedule itself costs nothing and the whole two-level cost is the skip.

    python3 scripts/twolevel_model.py             (~10 s on one core)
"""
from __future__ import annotations

import argparse
import math

import torch

TILE = 128  # tile_m = tile_n at head_dim 256
WARP_ROWS = 16  # rows of one warp in the m64 WGMMA accumulator; the rescale branch is uniform over them only when
# no thread of the warp needs it (the skip is per thread, the branch diverges: any row moving runs the block)
# TFLOP/s medians of 6 rotated rounds at head_dim 256 (B*N = 16k, H = 8), (seqlen, causal) -> (the default of
# today: two-level, fused_promote, reduce_chains 2; single_overlap, reduce_chains 1), bench/NOTES.md outcome lines:
# s11 = session 11 callB (fp8two2 "new"), s10 = session 10 callB (fp8two2 "new",
# bench/h200-2026-12-01-s10/raw.tar.xz:callB_fp8two2.out), s9 = session 9 call 2 (fp8two "fused_c2", the default since)
RUNS = {"s11": {(4096, False): (1074, 1133), (4096, True): (957, 1022),
                (16384, False): (1088, 1249), (16384, True): (1085, 1189)},
        "s10": {(4096, False): (1027, 1090), (4096, True): (998, 1025),
                (16384, False): (1064, 1190), (16384, True): (1050, 1088)},
        "s9": {(4096, False): (1118, 1181), (4096, True): (947, 998),
               (16384, False): (1094, 1207), (16384, True): (1013, 1111)}}
MEASURED = RUNS["s11"]
# sm_90a SASS main loop per consumer warp and tile (scripts/sass_dump.py fp8 --head-dim 256, bench/NOTES.md session 9):
# single_overlap 574 instructions, 128 of them the skippable FMUL block (FSETP alpha != 1 ... @!P0 BRA P1 over it)
SINGLE_LOOP, RESCALE = 574, 128


def e4m3(shape, gen) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * 20).to(torch.float8_e4m3fn).float()


def warp_moves(n: int, causal: bool, warps: int, heads: int, seed: int = 0, d: int = 256):
    """(steps, moved): per sampled warp the number of K/V tiles it visits and on how many of them (the first visited
    excluded) a row max of its 16 rows rose. Warps drawn uniformly over the m-blocks and the 8 warps of a CTA."""
    gen = torch.Generator().manual_seed(seed)
    n_tiles = n // TILE
    steps, moved = [], []
    for _ in range(heads):
        k = e4m3((n, d), gen)
        blocks = torch.randint(0, n_tiles, (warps,), generator=gen)
        warp_in_cta = torch.randint(0, TILE // WARP_ROWS, (warps,), generator=gen)
        rows = (blocks * TILE + warp_in_cta * WARP_ROWS)[:, None] + torch.arange(WARP_ROWS)  # (warps, 16)
        q = e4m3((warps * WARP_ROWS, d), gen)
        s = (q @ k.T).view(warps, WARP_ROWS, n)  # one positive scale (descales, softmax_scale) moves no max
        if causal:
            s = s.masked_fill(torch.arange(n) > rows[..., None], -math.inf)
        tile_max = s.view(warps, WARP_ROWS, n_tiles, TILE).amax(-1).flip(-1)  # visiting order: last tile first
        seen = tile_max.cummax(-1).values
        prior = torch.cat([torch.full_like(seen[..., :1], -math.inf), seen[..., :-1]], -1)
        visited = tile_max[:, 0] > -math.inf  # (warps, tiles): a tile a warp's rows see at least one key of
        up = ((tile_max > prior) & (prior > -math.inf)).any(1)  # (warps, tiles)
        steps.append(visited.sum(-1))
        moved.append((up & visited).sum(-1))
    return torch.cat(steps).double(), torch.cat(moved).double()


def fraction(n: int, causal: bool, warps: int, heads: int) -> float:
    steps, moved = warp_moves(n, causal, warps, heads)
    return float(moved.sum() / steps.sum())


def iid_fraction(tiles: int, rows: int = WARP_ROWS) -> float:
    """The same for independent row maxima: at the t-th visited tile a row's max rises with probability 1 / t."""
    return sum(1 - (1 - 1 / t) ** rows for t in range(2, tiles + 1)) / tiles


def cta_units(n: int, causal: bool, f: float, per_tile: float, delta: float, moved: float) -> float:
    """Sum over the m-blocks of one head of the model's CTA time: f + tiles x (per_tile + delta x moved fraction)."""
    nb = n // TILE
    tiles = [b + 1 for b in range(nb)] if causal else [nb] * nb
    return sum(f + t * (per_tile + delta * moved) for t in tiles)


def flops(n: int, causal: bool) -> float:
    """TFLOP/s numerator of one head of the A/B (B = 16384 / n): 4 B N^2 D, halved when causal."""
    return 4 * (16384 // n) * n * n * 256 / (2 if causal else 1)


def units(n: int, causal: bool, impl: str, f: float, delta: float, tau_d: float, frac: dict) -> float:
    """The model's time of one head of the A/B in single's tile units (B heads' CTAs of 1024 in all)."""
    if impl == "single":
        return (16384 // n) * cta_units(n, causal, f, 1.0, delta, frac[(n, causal)])
    return (16384 // n) * cta_units(n, causal, f, tau_d, 0.0, 0.0)


def fit(frac: dict, measured: dict = MEASURED) -> dict:
    """f, delta, tau_d (single's per-tile time without the rescale = 1) solved from the four non-causal medians
    (closed form: 1 / R = (f / nb + tau) / K with nb tiles per CTA, K a rate constant), then the model's rates of
    all four problems (the causal ones predicted). Returns f, delta, tau_d, and per (seqlen, causal): (model
    default, model single, model cost, measured cost)."""
    inv = {(n, impl): 1 / measured[(n, False)][i]
           for n in (4096, 16384) for i, impl in enumerate(("default", "single"))}
    nb4, nb16 = 4096 // TILE, 16384 // TILE
    p4, p16 = frac[(4096, False)], frac[(16384, False)]
    a = (inv[(4096, "default")] - inv[(16384, "default")]) / (1 / nb4 - 1 / nb16)  # f / K
    b_d = inv[(16384, "default")] - a / nb16  # tau_d / K
    g4, g16 = inv[(4096, "single")] - a / nb4, inv[(16384, "single")] - a / nb16  # (1 + delta p) / K
    delta = (g4 - g16) / (g16 * p4 - g4 * p16)
    k = (1 + delta * p4) / g4
    f, tau_d = a * k, b_d * k
    c0 = flops(4096, False) * inv[(4096, "default")] / units(4096, False, "default", f, delta, tau_d, frac)
    out = dict(f=f, delta=delta, tau_d=tau_d)
    for n, c in measured:
        rd, rs = (flops(n, c) / (c0 * units(n, c, impl, f, delta, tau_d, frac)) for impl in ("default", "single"))
        out[(n, c)] = (rd, rs, rs / rd - 1, measured[(n, c)][1] / measured[(n, c)][0] - 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--warps", type=int, default=48, help="warps sampled per head")
    ap.add_argument("--heads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    frac = {}
    print("moved: fraction of (warp, tile) steps on which single_overlap rescales O (A/B inputs; iid model beside)")
    for n in (4096, 8192, 16384):
        for causal in (False, True):
            frac[(n, causal)] = fraction(n, causal, args.warps, args.heads)
            iid = f"  iid {iid_fraction(n // TILE):.3f}" if not causal else ""
            print(f"  N {n:5d} {'causal' if causal else 'full  '}  {frac[(n, causal)]:.3f}{iid}")
    print(f"issue-bound estimate of delta from the SASS: {RESCALE} / ({SINGLE_LOOP} - {RESCALE}) = "
          f"{RESCALE / (SINGLE_LOOP - RESCALE):.3f}")
    for run, measured in RUNS.items():
        r = fit(frac, measured)
        print(f"{run}: f = {r['f']:.2f} tiles, delta = {r['delta']:.3f} (rescale / single's tile), "
              f"tau_d = {r['tau_d']:.3f}; default / single rescaling every tile: "
              f"{r['tau_d'] / (1 + r['delta']):.3f} per tile")
        print("  problem          model default / single / cost    measured cost")
        for n, c in measured:
            rd, rs, cost, mcost = r[(n, c)]
            print(f"  N {n:5d} {'causal' if c else 'full  '}  {rd:6.0f} / {rs:6.0f} / {cost * 100:5.1f} %   "
                  f"{mcost * 100:5.1f} %  ({'predicted' if c else 'fitted'})")
        p8 = frac[(8192, False)]
        cost8 = (r["f"] + 64 * r["tau_d"]) / (r["f"] + 64 * (1 + r["delta"] * p8)) - 1
        print(f"  predicted N 8192 full: two-level cost {cost8 * 100:.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
