"""The flip rules of scripts/decode10_gpu.sh (issue 13, session 9), applied to its ``decode_ab.py --s10`` results.

    python3 scripts/decode10_verdict.py $OUT/decode_ab/decode_ab.json [--tests $OUT/logs/pytest.log]

Rules, written before the run (bench/NOTES.md, "Session 9 (2026-12-01): decode ..."); ratios are GPU time / `auto`'s
at the same shape (median over the rotated rounds), shapes with a BAD / ERR cell count as failed:

* pdl1 (FA_VARIANTS_DECODE_PDL_MIN_SPLITS=1) over the 9 seqlen_q 1 batch-64 shapes: its 3 GPU tests passed; faster than
  `auto` at >= 8 of 9 (with session 8's 9 / 9, a sign test no A/A noise passes twice: ~2% for one run at 8 / 9);
  geomean <= 0.997; worst <= 1.005; and at SDPA's time or below at no fewer shapes than `auto`.
* w192 (FA_VARIANTS_PACK_WIDE_TILE_N=192) over the 6 D 64 64:8 seqlen_q 16 shapes: its 21 GPU tests passed; geomean over
  the three Nk 32k shapes <= 0.97; worst over all six <= 1.02.

Prints one line per rule: FLIP or KEEP and why. Exit status 0 whatever the verdict (2: no results file).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

GOOD_ERR = 0.02  # decode_ab's max |difference| to the reference
RULES = {
    "pdl1": dict(tests=3, test_key="pdl_unsplit", min_faster=8, max_geomean=0.997, max_worst=1.005, sdpa_count=True,
                 shapes=lambda s: len(s) == 5),
    "w192": dict(tests=21, test_key="wide192", max_geomean=0.97, max_worst=1.02, sdpa_count=False,
                 shapes=lambda s: len(s) == 6 and s[0] == 64 and s[1] == 64,
                 geomean_shapes=lambda s: s[4] >= 32768),
}


def passed_tests(log_text: str, key: str) -> int:
    """PASSED lines of pytest -rp whose test id contains ``key``."""
    return sum(1 for line in log_text.splitlines() if re.match(rf"^PASSED .*{re.escape(key)}", line))


def verdict(name: str, results: list, tests_passed: int | None) -> tuple[bool, str]:
    """(flip, reason) of rule ``name`` on decode_ab results (their "shape", "us", "err")."""
    rule = RULES[name]
    rows = [r for r in results if rule["shapes"](tuple(r["shape"]))]
    if tests_passed is not None and tests_passed != rule["tests"]:
        return False, f"GPU tests passed {tests_passed} / {rule['tests']}"
    bad = [r for r in rows if not (isinstance(r["err"].get(name), float) and r["err"][name] <= GOOD_ERR
                                   and name in r["us"] and "auto" in r["us"])]
    if not rows:
        return False, "no shape of its rule in the results"
    if bad:
        return False, f"{len(bad)} of {len(rows)} shapes without a good timing"
    ratio = {tuple(r["shape"]): r["us"][name] / r["us"]["auto"] for r in rows}
    keep = rule.get("geomean_shapes", lambda s: True)
    logs = [math.log(x) for s, x in ratio.items() if keep(s)]
    gm, worst = math.exp(sum(logs) / len(logs)), max(ratio.values())
    faster = sum(x < 1 for x in ratio.values())
    why = [f"faster {faster} / {len(ratio)}", f"geomean {gm:.3f} (<= {rule['max_geomean']})",
           f"worst {worst:.3f} (<= {rule['max_worst']})"]
    ok = gm <= rule["max_geomean"] and worst <= rule["max_worst"] and faster >= rule.get("min_faster", 0)
    if rule.get("min_faster"):
        why[0] += f" (>= {rule['min_faster']})"
    if rule["sdpa_count"]:
        at_or_below = {v: sum(r["us"][v] <= r["us"]["sdpa"] for r in rows if "sdpa" in r["us"]) for v in (name, "auto")}
        ok = ok and at_or_below[name] >= at_or_below["auto"]
        why.append(f"<= SDPA {at_or_below[name]} vs auto {at_or_below['auto']}")
    return ok, ", ".join(why)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="decode_ab.json of decode_ab.py --s10")
    p.add_argument("--tests", help="the pytest log (-rp) of the script's GPU tests")
    a = p.parse_args()
    path = Path(a.results)
    if not path.is_file():
        print(f"decode10_verdict: no {path}")
        return 2
    results = json.loads(path.read_text())["results"]
    log = Path(a.tests).read_text() if a.tests and Path(a.tests).is_file() else None
    for name, rule in RULES.items():
        tests = passed_tests(log, rule["test_key"]) if log is not None else None
        flip, why = verdict(name, results, tests)
        print(f"{name}: {'FLIP' if flip else 'KEEP'} ({why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
