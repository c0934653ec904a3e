"""scripts/twolevel_model.py, the CPU model of the fa3-fp8 two-level cost at head_dim 256 (bench/NOTES.md, session 11):
the warp-level rescale fraction of the single accumulator and the closed-form fit of the per-CTA time model."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import twolevel_model as tm  # noqa: E402


def test_moves_follow_the_iid_law_and_skip_the_first_tile():
    steps, moved = tm.warp_moves(1024, False, warps=64, heads=2)
    assert bool((steps == 1024 // tm.TILE).all())
    assert bool((moved <= steps - 1).all())  # the first visited tile has no rescale
    assert float(moved.sum() / steps.sum()) == pytest.approx(tm.iid_fraction(8), abs=0.06)


def test_causal_rows_see_fewer_tiles_and_move_more():
    steps, _ = tm.warp_moves(2048, True, warps=32, heads=1)
    assert int(steps.min()) >= 1 and int(steps.max()) <= 2048 // tm.TILE
    assert tm.fraction(2048, True, 32, 2) > tm.fraction(2048, False, 32, 2)


def test_fit_recovers_a_known_model():
    frac = {(4096, False): 0.66, (4096, True): 0.73, (16384, False): 0.31, (16384, True): 0.43}
    f, delta, tau_d, c0 = 1.5, 0.2, 1.1, 3e-3
    measured = {}
    for n, c in frac:
        measured[(n, c)] = tuple(tm.flops(n, c) / (c0 * tm.units(n, c, impl, f, delta, tau_d, frac))
                                 for impl in ("default", "single"))
    r = tm.fit(frac, measured)
    assert (r["f"], r["delta"], r["tau_d"]) == pytest.approx((f, delta, tau_d), rel=1e-9)
    for key, (default, single) in measured.items():  # causal ones predicted by the same model: exact here too
        assert r[key][:2] == pytest.approx((default, single), rel=1e-9)
