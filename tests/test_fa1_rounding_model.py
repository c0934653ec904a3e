"""scripts/fa1tol_model.py, the CPU model of fa1's rounding sequence: in Algorithm 1 line 12's order (P rounded to bf16
unnormalised, diag(l_new)^-1 after the product) fa1's error is fa2's; rounding P / l_new, the old order, costs ~1.4x
at the median. 40 heads of test_ec08b's shape, about a second."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import fa1tol_model  # noqa: E402


def test_fa1_order_matches_fa2_and_the_old_order_does_not():
    draws = [fa1tol_model.draw(seed) for seed in range(40)]
    for e in draws:
        assert e["fa1_new"] <= 2 * e["torch"] + 1e-5
        assert e["fa1_new"] <= 1.05 * e["fa2"] + 1e-6  # same roundings but fp32 rescales: as accurate as fa2
    old_over_fa2 = statistics.median(e["fa1_old"] / e["fa2"] for e in draws)
    assert 1.2 < old_over_fa2 < 1.8, old_over_fa2
