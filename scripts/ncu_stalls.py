"""Warp stall reasons per kernel from an Nsight Compute report's raw page.

    ncu --import REPORT.ncu-rep --page raw --csv > RAW.csv; python3 scripts/ncu_stalls.py RAW.csv [--top 8]

e.g. the quantisation passes at head_dim 256 (one default-recipe call; V + K sums, K, Q):

    ncu --kernel-name regex:QuantPass --launch-skip 3 --launch-count 3 --section SpeedOfLight \
        --section WarpStateStats -f -o REPORT python3 scripts/quant_ncu.py --pipelines def --head-dim 256

For each profiled kernel (in report order): its duration, warp cycles per issued instruction, and the ``--top``
largest stall reasons of WarpStateStats (``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio``:
cycles a warp spends stalled for that reason per issued instruction). Prints what it finds; never fails (a
diagnostic): a missing column is left out.
"""
from __future__ import annotations

import argparse
import csv
import re

STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")


def summarise(rows: list[dict], top: int) -> list[str]:
    """One line per kernel row of ncu's raw CSV (the header row, then a units row, then the kernels)."""
    out = []
    for n, row in enumerate(r for r in rows if r.get("Kernel Name") and r.get("ID", "").strip().isdigit()):
        stalls = []
        for col, val in row.items():
            m = STALL.fullmatch(col or "")
            if not m:
                continue
            try:
                stalls.append((float(str(val).replace(",", "")), m.group(1)))
            except ValueError:
                pass
        stalls.sort(reverse=True)
        dur = row.get("gpu__time_duration.sum", "?")
        cpi = row.get("smsp__average_warp_latency_per_inst_issued.ratio", "?")
        name = row.get("Kernel Name", "?")[:24]
        text = ", ".join(f"{r} {v:.2f}" for v, r in stalls[:top]) or "no stall columns"
        out.append(f"  kernel {n} {name}: {dur} (duration), {cpi} cycles/issue; stalls per issue: {text}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    try:
        with open(args.csv, newline="") as f:
            rows = list(csv.DictReader(f))
        print("\n".join(summarise(rows, args.top)) or "  (no kernels in the report)")
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not fail its caller
        print(f"  (no stall summary: {type(exc).__name__}: {exc})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
