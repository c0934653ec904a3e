#!/usr/bin/env python3
"""Event model of fa3-fp8's serial steps with ping-pong (two consumer warpgroups, one in-order tensor pipe): the
period per K/V tile of the default and of ``pv_pieces`` (bench/NOTES.md, session 14, "the P V GEMM in pieces").

Per warpgroup and tile: [turn: P V GEMM (in pieces, piece 0 after the first part of the exponentials), drain,
promotion, loop top, S GEMM issue] -> S GEMM -> row max -> exponentials of the pieces -> next turn. The tensor pipe
runs GEMMs in issue order (the other warpgroup's too); a GEMM's result is ready ``latency`` cycles after its last
cycle. The softmax part after the max (``exps``) is split evenly over the pieces; the pieces' GEMMs split the P V
GEMM evenly. Cycles, not measured: calibrate ``exps`` so that the default's period is a measured one (``--period``).

    python3 scripts/fp8_chain_model.py [--period 4290] [--pv 512] [--s 512] [--max 250] [--promo 290]
"""
from __future__ import annotations

import argparse


def period(pieces: int, exps: float, max_cycles: float, pv: float = 512, s: float = 512, latency: float = 100,
           promo: float = 290, tiles: int = 40) -> float:
    """Steady-state cycles per K/V tile of one warpgroup (two warpgroups alternating turns)."""
    tensor_free = 0.0
    ready = [0.0, 400.0]  # when each warpgroup wants its next turn (staggered start)
    turn_free = 0.0
    starts = []
    wg = 0
    for _ in range(2 * tiles):
        t = max(ready[wg], turn_free)  # BAR.SYNC: this warpgroup's softmax part 0 done and the turn handed to it
        starts.append((wg, t))
        done = t
        for piece in range(pieces):
            issue = t + piece * exps / pieces  # after its and the earlier pieces' exponentials (piece 0's: pre-turn)
            begin = max(issue, tensor_free)
            tensor_free = begin + pv / pieces
            done = tensor_free + latency
        s_issue = max(done, t + (pieces - 1) * exps / pieces) + promo  # drain, promotion, loop top
        begin = max(s_issue, tensor_free)
        tensor_free = begin + s
        turn_free = s_issue  # BAR.ARV right after the S issue
        part0 = max_cycles + exps / pieces  # row max and the first piece's exponentials before the next turn
        ready[wg] = tensor_free + latency + part0
        wg = 1 - wg
    mine = [t for w, t in starts if w == 0]
    return (mine[-1] - mine[tiles // 2]) / (len(mine) - 1 - tiles // 2)


def calibrate(target: float, max_cycles: float, **kw) -> float:
    """``exps`` (cycles) that gives the default (one piece) the period ``target`` (bisection)."""
    lo, hi = 0.0, 20000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if period(1, mid, max_cycles, **kw) < target else (lo, mid)
    return (lo + hi) / 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--period", type=float, default=4290.0, help="measured default cycles per CTA tile")
    ap.add_argument("--pv", type=float, default=512.0, help="tensor-pipe cycles of one tile's P V GEMM")
    ap.add_argument("--s", type=float, default=512.0, help="tensor-pipe cycles of one tile's S = Q K^T GEMM")
    ap.add_argument("--max", type=float, default=250.0, help="S wait to the first exponential")
    ap.add_argument("--max-chains4", type=float, default=130.0, help="the same with the row max in four chains")
    ap.add_argument("--promo", type=float, default=290.0, help="drain to S issue: LDG, promotion, loop top")
    a = ap.parse_args(argv)
    kw = dict(pv=a.pv, s=a.s, promo=a.promo)
    exps = calibrate(a.period, a.max, **kw)
    base = period(1, exps, a.max, **kw)
    print(f"default: exps {exps:.0f} cycles -> period {base:.0f}")
    for name, pieces, mx, promo in (("pq2", 2, a.max, a.promo - 35), ("pq2m4", 2, a.max_chains4, a.promo - 35)):
        p = period(pieces, exps, mx, pv=a.pv, s=a.s, promo=promo)
        print(f"{name}: period {p:.0f}, x/new {base / p:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
