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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ncu_table  # noqa: E402  (scripts/ncu_table.py: the raw page's parser and WarpStateStats' reasons)


def summarise(kernels: list, top: int) -> list[str]:
    """One line per kernel of ncu's raw CSV (``ncu_table.parse_raw_csv``: the header row, a units row, the kernels)."""
    out = []
    for n, k in enumerate(kernels):
        stalls = sorted(((v, r) for r, v in ncu_table.warp_stall_ratios(k).items()), reverse=True)
        unit, dur = k.metrics.get("gpu__time_duration.sum", ("", "?"))
        cpi = k.metrics.get("smsp__average_warp_latency_per_inst_issued.ratio", ("", "?"))[1]
        text = ", ".join(f"{r} {v:.2f}" for v, r in stalls[:top]) or "no stall columns"
        out.append(f"  kernel {n} {k.name[:24]}: {dur} {unit} (duration), {cpi} cycles/issue; stalls per issue: {text}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    try:
        kernels = ncu_table.parse_raw_csv(Path(args.csv).read_text(errors="replace"))
        print("\n".join(summarise(kernels, args.top)) or "  (no kernels in the report)")
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not fail its caller
        print(f"  (no stall summary: {type(exc).__name__}: {exc})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
