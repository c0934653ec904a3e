"""Issue 12's Nsight Compute attribution table, ours (fa3) vs flash-attn-4, from ncu's text output (no GPU needed).

    python3 scripts/ncu_table.py --details OUT/ncu.txt [--raw OUT/ncu.csv] [--title T] [--out TABLE.md]
        [--before bench/h200-2026-11-30/session2/ncu_attribution_before.md
         --before-details bench/h200-2026-11-30/session2/ncu_fa3_d128_n4k.txt \
                          bench/h200-2026-11-30/session2/ncu_flash-attn-4_d128_n4k.txt]

Inputs: ``ncu --import R.ncu-rep --page details`` (the section tables, the rules' messages) and optionally
``ncu --import R.ncu-rep --page raw --csv`` (every metric the sections collected, by its ncu name: the pipes'
utilisation and the PC-sampled stall reasons are only there). The report may hold several kernels: ours are those
whose name holds ``fa_variants``, flash-attn-4's those holding ``flash_attn``; of each, the one with the most
executed instructions is taken (other names, e.g. a memset, are ignored). --before: the markdown table of the
session-2 run (rows matched by the label before its first " ("); --before-details: that run's details pages (ours,
flash-attn-4) for the rows its table lacks. Prints the table (markdown) and appends it to --out when given.

Rows: duration (ncu locks clocks to base unless told otherwise), elapsed cycles, executed instructions, issue slots
busy, warp cycles per issued instruction, tensor-pipe activity (% of elapsed cycles), FMA / ALU / XU / uniform pipe
instructions (% of peak, active cycles), FP32 fused / non-fused instructions (the InstructionStats rule's note), L2
hit rate, stall samples per reason (the before table's eight, then any other reason with >= 3% of a kernel's
samples) and, where WarpStateStats gave them, warp cycles per issued instruction per reason. A value ncu did not
give prints as "-". --source: ncu's source pages (one kernel each), whose top stall-sample SASS lines are printed.
"""
from __future__ import annotations

import argparse
import csv
import io
import re
from pathlib import Path

_HEADER = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context \d+, Stream \d+")
_SECTION = re.compile(r"^    Section: (.+?)\s*$")
_NUMBER = re.compile(r"^-?[\d,]*\.?\d+(e[-+]?\d+)?$", re.IGNORECASE)
_TIME_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3,
            "second": 1e3}
#: (label, sampled reason): the before table's stall rows, in its order
STALLS = [("wait", "wait"), ("selected", "selected"), ("barrier", "barrier"), ("long scoreboard", "long_scoreboard"),
          ("dispatch", "dispatch_stall"), ("warpgroup arrive", "warpgroup_arrive"), ("not selected", "not_selected"),
          ("short scoreboard", "short_scoreboard")]
PCSAMP = "smsp__pcsamp_warps_issue_stalled_"
#: WarpStateStats' per-reason metric of the raw page (all cycles, not sampled): warp cycles per issued instruction
#: spent stalled for the reason (group 1)
WARP_STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")


class Kernel:
    """One profiled kernel: its name, grid and block, metrics {key: (unit, value)} and the rules' messages.
    Keys: "Section/Metric Name" from the details page, the metric's own name for command-line metrics and for the
    raw page's columns."""

    def __init__(self, name: str, grid: tuple = (), block: tuple = ()):
        self.name, self.grid, self.block = name, grid, block
        self.metrics: dict = {}
        self.notes = ""

    def get(self, *keys):
        """The first of ``keys`` present with a number: (unit, value), else None."""
        for key in keys:
            got = self.metrics.get(key)
            if got is not None and isinstance(got[1], float):
                return got
        return None

    def value(self, *keys):
        got = self.get(*keys)
        return None if got is None else got[1]


def _number(text: str):
    text = text.strip().strip('"')
    return float(text.replace(",", "")) if _NUMBER.match(text) else text


def parse_details(text: str) -> list[Kernel]:
    """Kernels of an ``ncu --page details`` text, in report order."""
    kernels, section, notes = [], "", []
    for line in text.splitlines():
        head = _HEADER.match(line)
        if head:
            if kernels:
                kernels[-1].notes = " ".join(notes)
            g = [int(x) for x in head.groups()[1:]]
            kernels.append(Kernel(head.group(1), tuple(g[:3]), tuple(g[3:])))
            section, notes = "", []
            continue
        if not kernels:
            continue
        sec = _SECTION.match(line)
        if sec:
            section = sec.group(1)
            continue
        stripped = line.strip()
        if not stripped or set(stripped) <= {"-", " "} or stripped.startswith("Metric Name"):
            continue
        if line.startswith("    ") and not line.startswith("     ") and re.match(r"(OPT|INF|WRN|ERR)\s", stripped):
            notes.append(stripped.split(None, 1)[1] if " " in stripped else "")
            continue
        if line.startswith("          "):  # a message's continuation
            notes.append(stripped)
            continue
        parts = re.split(r"\s{2,}", stripped)
        if len(parts) in (2, 3) and section:
            name, unit, value = parts[0], (parts[1] if len(parts) == 3 else ""), _number(parts[-1])
            kernels[-1].metrics[f"{section}/{name}"] = (unit, value)
            if section == "Command line profiler metrics":
                kernels[-1].metrics[name] = (unit, value)
    if kernels:
        kernels[-1].notes = " ".join(notes)
    return kernels


def parse_raw_csv(text: str) -> list[Kernel]:
    """Kernels of an ``ncu --page raw --csv`` text (a header row of metric names, a row of units, one row per
    kernel; ncu's "==PROF==" lines and program output are skipped), in report order."""
    rows = [r for r in csv.reader(io.StringIO("\n".join(
        ln for ln in text.splitlines() if ln.startswith('"'))))]
    if len(rows) < 2 or "Kernel Name" not in rows[0]:
        return []
    header, units = rows[0], rows[1]
    name_at = header.index("Kernel Name")
    kernels = []
    for row in rows[2:]:
        if len(row) != len(header):
            continue
        k = Kernel(row[name_at])
        for col, unit, cell in zip(header, units, row):
            k.metrics[col] = (unit, _number(cell) if cell.strip() else cell)
        kernels.append(k)
    return kernels


def merge(details: list[Kernel], raw: list[Kernel]) -> list[Kernel]:
    """The raw page's metrics added to the details page's kernels (same report: same order); the details' values
    win where a key is in both."""
    if not details:
        return raw
    for k, r in zip(details, raw):
        k.metrics = {**r.metrics, **k.metrics}
    return details


def impl_of(name: str) -> str | None:
    """"ours" for a kernel (or file) name holding ``fa_variants``, "fa4" for one holding ``flash_attn``, else None."""
    return "ours" if "fa_variants" in name else "fa4" if "flash_attn" in name else None


def pick(kernels: list[Kernel]) -> dict[str, Kernel]:
    """{"ours": kernel, "fa4": kernel}: per implementation (``impl_of``) the kernel with the most executed
    instructions."""
    chosen: dict[str, Kernel] = {}
    for k in kernels:
        impl = impl_of(k.name)
        if impl is None:
            continue
        if impl not in chosen or (instructions(k) or 0) > (instructions(chosen[impl]) or 0):
            chosen[impl] = k
    return chosen


# ---------------------------------------------------------------------------------------------------- the rows
def duration_ms(k: Kernel):
    got = k.get("GPU Speed Of Light Throughput/Duration", "gpu__time_duration.sum")
    if got is None or got[0].lower() not in _TIME_MS:
        return None
    return got[1] * _TIME_MS[got[0].lower()]


def sm_ghz(k: Kernel):
    got = k.get("GPU Speed Of Light Throughput/SM Frequency")
    if got is not None:
        return got[1] * {"ghz": 1.0, "mhz": 1e-3}.get(got[0].lower(), float("nan"))
    got = k.get("smsp__cycles_elapsed.avg.per_second")
    if got is not None:  # cycle/second, cycle/nsecond (= GHz) or cycle/usecond
        return got[1] * {"cycle/second": 1e-9, "cycle/nsecond": 1.0, "cycle/usecond": 1e-3}.get(got[0], float("nan"))
    return None


def instructions(k: Kernel):
    return k.value("Instruction Statistics/Executed Instructions", "smsp__inst_executed.sum")


def tensor_pct(k: Kernel):
    """Tensor-pipe activity, % of elapsed cycles: the raw metric where collected, else the rule's note (which names
    the tensor pipe only when it is the busiest)."""
    got = k.value("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
                  "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed")
    if got is not None:
        return got
    m = re.search(r"Tensor is the highest-utilized pipeline \(([\d.]+)%\) based on elapsed cycles", k.notes)
    return float(m.group(1)) if m else None


def pipe_inst(pipe: str):
    return lambda k: k.value(f"sm__inst_executed_pipe_{pipe}.avg.pct_of_peak_sustained_active")


def fp32(which: int):
    def get(k: Kernel):
        m = re.search(r"executes (\d+) fused and (\d+) non-fused FP32 instructions", k.notes)
        return float(m.group(1 + which)) if m else None
    return get


def stall(reason: str):
    return lambda k: k.value(PCSAMP + reason)


def stall_ratio(reason: str):
    """Warp cycles per issued instruction spent in one stall reason (WarpStateStats, all cycles, not sampled)."""
    return lambda k: k.value(f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio",
                             f"smsp__average_warp_latency_issue_stalled_{reason}.ratio")


def warp_stall_ratios(k: Kernel) -> dict[str, float]:
    """{reason: warp cycles per issued instruction} of WarpStateStats (the raw page's ``WARP_STALL`` metrics)."""
    out = {}
    for key, (_, v) in k.metrics.items():
        m = WARP_STALL.fullmatch(key)
        if m and isinstance(v, float):
            out[m.group(1)] = v
    return out


def stall_reasons(kernels: list[Kernel]) -> list[tuple[str, str]]:
    """The before table's stall rows, then any other sampled reason with >= 3% of some kernel's samples."""
    rows, known = list(STALLS), {r for _, r in STALLS}
    extra: dict[str, float] = {}
    for k in kernels:
        samples = {key[len(PCSAMP):]: v for key, (_, v) in k.metrics.items()
                   if key.startswith(PCSAMP) and isinstance(v, float) and "_not_issued" not in key}
        total = sum(samples.values())
        for reason, v in samples.items():
            if reason not in known and total and v / total >= 0.03:
                extra[reason] = max(extra.get(reason, 0.0), v)
    rows += [(r.replace("_", " "), r) for r in sorted(extra, key=lambda r: -extra[r])]
    return rows


def rows_for(kernels: list[Kernel]):
    """(label, getter, digits) of every row."""
    ghz = next((g for g in map(sm_ghz, kernels) if g), None)
    rows = [
        (f"duration (ncu base clocks, {ghz:.2f} GHz)" if ghz else "duration (ncu clocks)", duration_ms, "ms"),
        ("elapsed cycles", lambda k: k.value("GPU Speed Of Light Throughput/Elapsed Cycles",
                                              "gpc__cycles_elapsed.max", "sm__cycles_elapsed.max"), 0),
        ("instructions executed", instructions, 0),
        ("issue slots busy (%)", lambda k: k.value("Compute Workload Analysis/Issue Slots Busy",
                                                   "sm__inst_issued.avg.pct_of_peak_sustained_active"), 1),
        ("warp cycles per issued instruction", lambda k: k.value(
            "Warp State Statistics/Warp Cycles Per Issued Instruction",
            "smsp__average_warp_latency_per_inst_issued.ratio"), 2),
        ("tensor pipe active (% of elapsed)", tensor_pct, 1),
        ("FMA pipe inst (% of peak, active)", pipe_inst("fma"), 1),
        ("ALU pipe inst (% of peak, active)", pipe_inst("alu"), 1),
        ("XU (MUFU) pipe inst (% of peak, active)", pipe_inst("xu"), 1),
        ("uniform pipe inst (% of peak, active)", pipe_inst("uniform"), 1),
        ("FP32 fused inst", fp32(0), 0),
        ("FP32 non-fused inst", fp32(1), 0),
        ("L2 hit rate (%)", lambda k: k.value("Memory Workload Analysis/L2 Hit Rate", "lts__t_sector_hit_rate.pct"), 1),
    ]
    reasons = stall_reasons(kernels)
    rows += [(f"stall samples: {label}", stall(reason), 0) for label, reason in reasons]
    rows += [(f"cycles per issue stalled: {label}", stall_ratio(reason), 2) for label, reason in reasons]
    return rows


def row_key(label: str) -> str:
    return label.split(" (")[0].strip().lower()


def parse_before(text: str) -> dict[str, tuple]:
    """{row key: (ours, fa4)} of a before table (| metric | fa3 (ours) | flash-attn-4 | ours / fa4 |); durations in
    ms (a "us" value converted)."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("metric", "") or set(cells[0]) <= {"-"}:
            continue
        vals = []
        for cell in cells[1:3]:
            m = re.match(r"^(-?[\d,]*\.?\d+)\s*(ms|us|ns)?$", cell)
            vals.append(None if not m else float(m.group(1).replace(",", "")) * _TIME_MS.get(m.group(2) or "ms", 1.0))
        out[row_key(cells[0])] = tuple(vals)
    return out


def _fmt(v, digits) -> str:
    if v is None:
        return "-"
    if digits == "ms":
        return f"{v:.3g} ms"
    return f"{v:,.0f}" if digits == 0 else f"{v:.{digits}f}"


def _ratio(a, b) -> str:
    return "-" if a is None or b in (None, 0) else f"{a / b:.2f}"


def table(pair: dict[str, Kernel], before: dict[str, tuple] | None = None) -> list[str]:
    """Markdown lines: one row per metric, ours / fa4, and the before run's columns when ``before`` is given."""
    ours, fa4 = pair.get("ours"), pair.get("fa4")
    present = [k for k in (ours, fa4) if k is not None]
    head = "| metric | fa3 (ours) | flash-attn-4 | ours / fa4 |"
    sep = "|---|---|---|---|"
    if before is not None:
        head += " ours before | fa4 before | ours / fa4 before | ours now / before |"
        sep += "---|---|---|---|"
    lines = [head, sep]
    for label, get, digits in rows_for(present):
        a = get(ours) if ours else None
        b = get(fa4) if fa4 else None
        if label.startswith("cycles per issue stalled") and a is None and b is None:
            continue  # WarpStateStats' breakdown: printed only where ncu gave it
        line = f"| {label} | {_fmt(a, digits)} | {_fmt(b, digits)} | {_ratio(a, b)} |"
        if before is not None:
            ba, bb = before.get(row_key(label), (None, None))
            line += f" {_fmt(ba, digits)} | {_fmt(bb, digits)} | {_ratio(ba, bb)} | {_ratio(a, ba)} |"
        lines.append(line)
    for tag, k in (("ours", ours), ("flash-attn-4", fa4)):
        lines.append(f"\n{tag}: " + (f"{k.name[:90]}... grid {k.grid} x block {k.block}" if k else "not in the report"))
    return lines


def before_values(before_md: str | None, before_details: list[str] | None) -> dict[str, tuple] | None:
    """The before table's values; rows it lacks filled from the before run's details pages (ours, fa4)."""
    if before_md is None and not before_details:
        return None
    values = parse_before(Path(before_md).read_text()) if before_md else {}
    if before_details:
        ks = [pick(parse_details(Path(p).read_text())) for p in before_details]
        pair = {**ks[0], **(ks[1] if len(ks) > 1 else {})}
        present = [k for k in (pair.get("ours"), pair.get("fa4")) if k]
        for label, get, _ in rows_for(present):
            key = row_key(label)
            if key not in values or values[key] == (None, None):
                values[key] = tuple(get(pair[i]) if i in pair else None for i in ("ours", "fa4"))
    return values


def _address(cell: str):
    """A source-page address cell ("0x7f3a..." or decimal) as an int, else None."""
    cell = cell.strip().strip("`")
    try:
        return int(cell, 16) if cell.lower().startswith("0x") else int(cell) if cell.isdigit() else None
    except ValueError:
        return None


def source_groups(text: str) -> list[dict]:
    """The kernels of an ``ncu --import R --page source --csv --print-source sass`` text, in order, as
    {"kernel": name, "header": [column names], "rows": [[cells], ...]}. ncu prints per kernel a row
    "Kernel Name",NAME ("Function Name" read alike), then the header row (first cell "Address"; then "Source",
    "Warp Stall Sampling (All Samples)", "Instructions Executed", per-reason "stall_*" columns, ...), then one row
    per SASS instruction (first cell its address). A header without a kernel-name row before it opens a group named
    "". Other lines (ncu's ==PROF== / ==WARNING== lines, program output) are skipped. Session 7's ncu12 run lost
    every source table by reading the kernel-name row as the header."""
    groups: list[dict] = []
    for row in csv.reader(io.StringIO(text)):
        first = row[0].strip().lstrip("#").strip() if row else ""
        if first in ("Kernel Name", "Function Name") and len(row) >= 2:
            groups.append({"kernel": row[1].strip(), "header": None, "rows": []})
        elif first == "Address" and len(row) >= 2:
            if not groups or groups[-1]["header"] is not None:
                groups.append({"kernel": "", "header": None, "rows": []})
            groups[-1]["header"] = [c.strip() for c in row]
        elif groups and groups[-1]["header"] and _address(first) is not None:
            groups[-1]["rows"].append(row)
    return [g for g in groups if g["header"]]


def source_top(text: str, n: int = 12) -> list[str]:
    """The ``n`` SASS instructions with the most stall samples in an ``ncu --page source --csv --print-source sass``
    text (``source_groups``; columns used: Address, Source, "Warp Stall Sampling (All Samples)"; with several
    kernels, the one with the most samples), as "address  samples  share%  instruction" lines; one line saying so
    when those columns are not there."""
    best, best_total = None, -1.0
    for g in source_groups(text):
        head = g["header"]
        find = lambda word: next((i for i, c in enumerate(head) if word in c), None)  # noqa: E731
        at, src, samp = find("Address"), find("Source"), find("Warp Stall Sampling (All")
        if None in (at, src, samp):
            continue
        got = []
        for r in g["rows"]:
            value = _number(r[samp]) if len(r) > max(at, src, samp) else ""
            if isinstance(value, float):
                got.append((value, r[at], r[src].strip()))
        total = sum(v for v, _, _ in got)
        if total > best_total:
            best, best_total = got, total
    if best is None:
        return ["(source page: no Address / Source / Warp Stall Sampling (All Samples) columns)"]
    total = best_total or 1.0
    return [f"{a:>8} {v:>9,.0f} {100 * v / total:5.1f}%  {s[:80]}" for v, a, s in sorted(best, reverse=True)[:n]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    ap.add_argument("--details", required=True, help="ncu --page details text")
    ap.add_argument("--raw", help="ncu --page raw --csv text of the same report")
    ap.add_argument("--before", help="the before run's markdown table")
    ap.add_argument("--before-details", nargs="+", metavar="TXT", help="the before run's details pages: ours, fa4")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", help="markdown file the table is appended to")
    ap.add_argument("--source", nargs="+", metavar="CSV", help="ncu --page source --csv --print-source sass texts "
                    "(one kernel each): their top stall-sample instructions are printed after the table")
    a = ap.parse_args(argv)
    for flag, path in (("--details", a.details), ("--raw", a.raw), ("--before", a.before),
                       *(("--before-details", p) for p in a.before_details or []),
                       *(("--source", p) for p in a.source or [])):
        if path is not None and not Path(path).is_file():
            ap.error(f"{flag}: no such file {path}")
    kernels = parse_details(Path(a.details).read_text(errors="replace"))
    if a.raw:
        kernels = merge(kernels, parse_raw_csv(Path(a.raw).read_text(errors="replace")))
    pair = pick(kernels)
    lines = ([f"### {a.title}", ""] if a.title else []) + table(pair, before_values(a.before, a.before_details))
    for path in a.source or []:
        lines += ["", f"top stall-sample SASS instructions, {Path(path).name}:", "```",
                  *source_top(Path(path).read_text(errors="replace")), "```"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.out:
        with open(a.out, "a") as f:
            f.write(text + "\n")
    return 0 if len(pair) == 2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
