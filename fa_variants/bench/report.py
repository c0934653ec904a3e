"""Reports of `fa-variants bench`: tables, ratios, markdown, JSON and bar charts.

Everything here works on the plain report dictionary that `fa_variants.bench` fills and saves as JSON, so
a report can be rebuilt from a saved `bench.json` on any machine (`fa-variants bench --report-from FILE`):

    report = {
      "meta":    {"gpu": {...}, "versions": {...}, "command": str, "settings": {...}},
      "results": [{"impl", "kind" ("ours"|"peer"), "dtype", "head_dim", "seqlen", "batch", "heads",
                   "causal", "ms", "tflops", "first_call_s", "max_diff", "error"}, ...],
      "memory":  [{"impl", "kind", "dtype", "head_dim", "seqlen", "batch", "heads", "inputs_mib",
                   "peak_mib", "error"}, ...],
      "notes":   [str, ...],
    }

Units: ms is the median forward time in milliseconds, tflops is 10^12 FLOP/s by the FlashAttention-paper
convention (4 * B * H * Nq * Nk * D, halved for causal), memory in MiB (2^20 bytes). Nothing here needs a GPU.
"""
from __future__ import annotations

import json
from pathlib import Path

from fa_variants.common.checks import is_real

STANDARD = "sdpa-math"  # "standard attention" of the memory table: S and P materialised in HBM
_OURS_COLORS = ("#d62728", "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22")
_PEER_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#7f7f7f", "#17becf", "#aec7e8")


# ----------------------------------------------------------------------------------------------- tables
def impl_names(records: list[dict], measured: str | None = None) -> tuple[list[str], list[str]]:
    """(ours, peers): implementation names in order of first appearance; with ``measured`` (a field such as
    "tflops"), only those with at least one record where that field is set."""
    ours: list[str] = []
    peers: list[str] = []
    for r in records:
        if measured and not r.get(measured):
            continue
        names = ours if r["kind"] == "ours" else peers
        if r["impl"] not in names:
            names.append(r["impl"])
    return ours, peers


def case_rows(results: list[dict]) -> list[dict]:
    """Group results by case (dtype, head_dim, seqlen, causal) and add each of ours over the best peer.

    Each row: the case fields, ``tflops`` {impl: TFLOP/s or None}, ``errors`` {impl: message},
    ``best_peer`` (name or None), ``best_peer_tflops``, ``ratio`` {ours impl: ours / best peer} and
    ``ratio_vs``: None when the best peer ran the same case, else "NAME (DTYPE)" when no peer ran this
    dtype (e.g. fp8) and the best peer of the same shape in another dtype is used instead.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["dtype"], r["head_dim"], r["seqlen"], r["causal"]), []).append(r)
    rows = []
    for (dtype, head_dim, seqlen, causal), recs in groups.items():
        tflops = {r["impl"]: r["tflops"] for r in recs}
        peers = {r["impl"]: r["tflops"] for r in recs if r["kind"] == "peer" and r["tflops"]}
        best = max(peers, key=peers.get) if peers else None
        rows.append(dict(
            dtype=dtype, head_dim=head_dim, seqlen=seqlen, causal=causal,
            batch=recs[0]["batch"], heads=recs[0]["heads"], tflops=tflops,
            errors={r["impl"]: r["error"] for r in recs if r.get("error")},
            ours=[r["impl"] for r in recs if r["kind"] == "ours"],
            best_peer=best, best_peer_tflops=peers.get(best), ratio={}, ratio_vs=None,
        ))
    for row in rows:
        best, best_tflops, vs = row["best_peer"], row["best_peer_tflops"], None
        if best is None:  # no peer ran this dtype: compare with the best peer of the same shape
            others = [o for o in rows if o["best_peer"] and o["dtype"] != row["dtype"]
                      and (o["head_dim"], o["seqlen"], o["causal"]) == (row["head_dim"], row["seqlen"], row["causal"])]
            if others:
                o = max(others, key=lambda o: o["best_peer_tflops"])
                best_tflops, vs = o["best_peer_tflops"], f"{o['best_peer']} ({o['dtype']})"
        if best_tflops:
            row["ratio"] = {n: row["tflops"][n] / best_tflops for n in row["ours"] if row["tflops"].get(n)}
            row["ratio_vs"] = vs
    return rows


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Case rows by (dtype, head_dim, causal), seqlens ascending: one table and one chart each."""
    out: dict[tuple, list[dict]] = {}
    for row in rows:
        out.setdefault((row["dtype"], row["head_dim"], row["causal"]), []).append(row)
    return {k: sorted(v, key=lambda r: r["seqlen"]) for k, v in out.items()}


def cell_text(value: float | None, error: str | None) -> str:
    if value:
        return f"{value:.0f}" if value >= 10 else f"{value:.1f}"
    if error and "out of memory" in error.lower():
        return "OOM"
    if error and error.startswith("cannot serve"):
        return "n/a"
    return "fail" if error else "—"


def ratio_summary(results: list[dict]) -> dict[str, dict]:
    """Per backend of ours: {"cases", "min", "median", "max"} of ours / best peer over all its cases."""
    per: dict[str, list[float]] = {}
    for row in case_rows(results):
        for name, ratio in row["ratio"].items():
            per.setdefault(name, []).append(ratio)
    out = {}
    for name, values in per.items():
        values = sorted(values)
        out[name] = dict(cases=len(values), min=values[0], median=values[len(values) // 2], max=values[-1])
    return out


# --------------------------------------------------------------------------------------------- markdown
def speed_markdown(results: list[dict]) -> str:
    """One table per (dtype, head_dim, causal): TFLOP/s per implementation and ours / best peer.
    Implementations that measured nothing are left out (the 'Not measured' section says why)."""
    ours, peers = impl_names(results, measured="tflops")
    lines = []
    for (dtype, head_dim, causal), rows in _groups(case_rows(results)).items():
        lines += [f"### {dtype}, head_dim {head_dim}, {'causal' if causal else 'non-causal'}", ""]
        head = ["seqlen", "batch x heads", *ours, *peers, "best peer", *(f"{n} / best" for n in ours)]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            best = r["best_peer"] or (r["ratio_vs"] and f"{r['ratio_vs']}*") or "—"
            cells = [str(r["seqlen"]), f"{r['batch']} x {r['heads']}",
                     *(cell_text(r["tflops"].get(n), r["errors"].get(n)) for n in ours + peers), best,
                     *(f"{r['ratio'][n]:.2f}" if n in r["ratio"] else "—" for n in ours)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def compile_markdown(results: list[dict]) -> str:
    """First-call seconds per static configuration (compile + launch for JIT kernels), and the largest
    first call at a later seqlen of the same configuration (a big one there means a recompile)."""
    ours, peers = impl_names(results, measured="tflops")
    first: dict[tuple, dict[str, float]] = {}
    later: dict[str, float] = {}
    for r in results:
        if r.get("first_call_s") is None:
            continue
        key = (r["dtype"], r["head_dim"], r["causal"])
        cell = first.setdefault(key, {})
        if r["impl"] in cell:
            later[r["impl"]] = max(later.get(r["impl"], 0.0), r["first_call_s"])
        else:
            cell[r["impl"]] = r["first_call_s"]
    if not first:
        return ""
    names = [n for n in ours + peers if any(n in c for c in first.values())]
    head = ["dtype", "head_dim", "causal", *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (dtype, head_dim, causal), cell in first.items():
        vals = [f"{cell[n]:.2f}" if n in cell else "—" for n in names]
        lines.append("| " + " | ".join([dtype, str(head_dim), str(causal).lower(), *vals]) + " |")
    tail = ", ".join(f"{n} {later[n] * 1e3:.1f} ms" for n in names if n in later)
    if tail:
        lines += ["", f"Largest first call at a later seqlen of the same configuration: {tail}."]
    return "\n".join(lines) + "\n"


def memory_markdown(memory: list[dict], standard: str = STANDARD) -> str:
    """The FlashAttention papers' memory table, measured: peak allocated MiB (inputs and output included)
    per implementation as seqlen grows, and standard attention over each of ours."""
    if not memory:
        return ""
    ours, peers = impl_names(memory, measured="peak_mib")
    by_n: dict[int, dict[str, dict]] = {}
    for m in memory:
        by_n.setdefault(m["seqlen"], {})[m["impl"]] = m
    names = ours + peers
    head = ["seqlen", "q,k,v MiB", *names]
    if standard in peers:
        head += [f"{standard} / {n}" for n in ours]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n, cell in sorted(by_n.items()):
        inputs = next((m["inputs_mib"] for m in cell.values() if m.get("inputs_mib")), None)
        row = [str(n), f"{inputs:.0f}" if inputs else "—"]
        row += [cell_text(cell[x]["peak_mib"], cell[x]["error"]) if x in cell else "—" for x in names]
        if standard in peers:
            std = cell.get(standard, {}).get("peak_mib")
            for x in ours:
                mine = cell.get(x, {}).get("peak_mib")
                row.append(f"{std / mine:.1f}x" if std and mine else ("std OOM" if not std and mine else "—"))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def problems_markdown(report: dict) -> str:
    """What did not run: unavailable implementations and each distinct error once per implementation."""
    lines = [f"- {note}" for note in report.get("notes", [])]
    seen = set()
    for r in report["results"] + report.get("memory", []):
        if r.get("error") and (r["impl"], r["error"]) not in seen:
            seen.add((r["impl"], r["error"]))
            lines.append(f"- {r['impl']}: {r['error']}")
    return "\n".join(lines) + ("\n" if lines else "")


def _sets_text(sets) -> str:
    if isinstance(sets, int):
        return f"{sets} sets"
    return "enough sets to exceed twice the L2 cache (at least 2)"


def to_markdown(report: dict) -> str:
    """The whole report as markdown: setup, speed tables, ratios, compile times, memory, problems."""
    meta = report["meta"]
    gpu, s = meta.get("gpu", {}), meta.get("settings", {})
    out = [f"# Attention forward speed on {gpu.get('name', '?')}", ""]
    out += [f"- Command: `{meta.get('command', '?')}`", f"- Date: {meta.get('date', '?')}",
            f"- GPU: {gpu.get('name', '?')} (sm{gpu.get('capability', '?')}, {gpu.get('sms', '?')} SMs, "
            f"{gpu.get('memory_gib', '?')} GiB, L2 {gpu.get('l2_mib', '?')} MiB)",
            "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items()),
            f"- Setup (FlashAttention papers): batch x seqlen = {s.get('tokens', '?')} tokens, "
            f"heads x head_dim = {s.get('hidden', '?')}, forward only. TFLOP/s = 4 * B * H * N^2 * D / time, "
            f"halved for causal. Time = median of {s.get('timer', '?')} (warm-up {s.get('warmup_ms', '?')} ms, "
            f"{s.get('rep_ms', '?')} ms of repeats), inputs rotated among {_sets_text(s.get('input_sets'))}.",
            "- n/a: the backend cannot serve that shape on this GPU (it raised ValueError); "
            "OOM: out of memory; *: no peer ran this dtype, ratio against the best peer of the same shape.", ""]
    out += ["## Forward TFLOP/s", "", speed_markdown(report["results"])]
    summary = ratio_summary(report["results"])
    if summary:
        out += ["## Ours over the best peer (same run)", "", "| backend | cases | min | median | max |",
                "|---|---|---|---|---|"]
        out += [f"| {n} | {v['cases']} | {v['min']:.2f} | {v['median']:.2f} | {v['max']:.2f} |"
                for n, v in summary.items()]
        out.append("")
    diffs = {}
    for r in report["results"]:
        if r["kind"] == "ours" and r.get("max_diff") is not None:
            diffs[r["impl"]] = max(diffs.get(r["impl"], 0.0), r["max_diff"])
    if diffs:
        out += ["Largest |ours - torch SDPA| over all cases (same inputs, same dtype): "
                + ", ".join(f"{n} {d:.2e}" for n, d in diffs.items()), ""]
    compile_md = compile_markdown(report["results"])
    if compile_md:
        out += ["## First call (compile) seconds", "", compile_md]
    mem = report.get("memory", [])
    if mem:
        m0 = mem[0]
        out += ["## Memory: peak allocated MiB", "",
                f"{m0['dtype']}, head_dim {m0['head_dim']}, batch {m0['batch']}, heads {m0['heads']}, non-causal; "
                f"peak of torch.cuda.max_memory_allocated over one forward call, inputs and output included. "
                f"Standard attention = {STANDARD} (materialises S and P).", "", memory_markdown(mem)]
    problems = problems_markdown(report)
    if problems:
        out += ["## Not measured", "", problems]
    charts = report.get("charts", [])
    if charts:
        out += ["## Charts", ""] + [f"![{Path(c).stem}]({Path(c).name})" for c in charts] + [""]
    return "\n".join(out)


#: what every result / memory row must hold, and the type of each (bool is not taken for an int)
_ROW_TYPES = {"impl": str, "kind": str, "dtype": str, "head_dim": int, "seqlen": int}
_RESULT_TYPES = {**_ROW_TYPES, "causal": bool, "batch": int, "heads": int}
#: meta's parts the markdown reads as objects, and the report's top-level lists
_META_OBJECTS = ("gpu", "settings", "versions")
_LISTS = ("memory", "notes", "charts")
#: measured fields: a number or null (failed, skipped)
_NUMBERS = ("ms", "tflops", "first_call_s", "max_diff", "inputs_mib", "peak_mib")


def _row_problem(row, types: dict) -> str | None:
    """What is wrong with one result or memory row (None if nothing): a missing key, a value of another type, a
    kind other than "ours" / "peer", a measured field that is neither a number nor null."""
    if not isinstance(row, dict):
        return f"a row that is a JSON {type(row).__name__}, not an object"
    missing = [k for k in types if k not in row]
    if missing:
        return f"a row without {', '.join(missing)}: {str(row)[:80]}"
    for key, kind in types.items():
        value = row[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"a row whose {key!r} is {value!r}, not a JSON {'true/false' if kind is bool else kind.__name__}"
    if row["kind"] not in ("ours", "peer"):
        return f"a row whose 'kind' is {row['kind']!r}, not 'ours' or 'peer'"
    for key in _NUMBERS:
        value = row.get(key)
        if value is not None and not is_real(value):
            return f"a row whose {key!r} is {value!r}, not a number or null"
    return None


def not_a_report(report) -> str | None:
    """Why a loaded JSON document is not a report of ``fa-variants bench`` (None if it is one): the keys
    and types the markdown, charts and ``--compare`` read (`_RESULT_TYPES`, `_ROW_TYPES`, `_NUMBERS`)."""
    if not isinstance(report, dict):
        return f"a JSON {type(report).__name__}, not an object"
    missing = [k for k in ("meta", "results") if k not in report]
    if missing:
        keys = ", ".join(map(repr, list(report)[:4])) + (", ..." if len(report) > 4 else "")
        return f"no {' or '.join(repr(k) for k in missing)} key; it has {keys or 'none'}"
    if not isinstance(report["meta"], dict) or not isinstance(report["results"], list) or not all(
            isinstance(report.get(key, []), list) for key in _LISTS):
        return "'meta' must be an object, 'results', 'memory', 'notes' and 'charts' lists"
    wrong = [key for key in _META_OBJECTS if not isinstance(report["meta"].get(key, {}), dict)]
    if wrong:
        return f"meta's {', '.join(map(repr, wrong))}: not a JSON object"
    if not all(isinstance(chart, str) for chart in report.get("charts", [])):
        return "'charts' must list file names"
    for rows, types in ((report["results"], _RESULT_TYPES), (report.get("memory", []), _ROW_TYPES)):
        for row in rows:
            problem = _row_problem(row, types)
            if problem:
                return problem
    return None


def merge(reports: list[dict]) -> dict:
    """One report from several runs (e.g. a long sweep split into short GPU commands): results, memory
    rows and notes concatenated (a later record of the same implementation and case wins in the tables),
    the first run's meta, with every run's command and date kept in meta["runs"]."""
    if len(reports) == 1:
        return reports[0]
    meta = dict(reports[0]["meta"])
    meta["runs"] = [dict(command=r["meta"].get("command"), date=r["meta"].get("date")) for r in reports]
    meta["command"] = " ; ".join(str(r["meta"].get("command")) for r in reports)
    notes = list(dict.fromkeys(n for r in reports for n in r.get("notes", [])))
    return dict(meta=meta, results=[x for r in reports for x in r["results"]],
                memory=[x for r in reports for x in r.get("memory", [])], notes=notes)


# ---------------------------------------------------------------------------------------- files, charts
def make_outdir(path: Path) -> Path:
    """Create the output folder ``path`` (a command's --out) before anything is measured, so that an unusable one
    stops the command at once rather than after minutes of timing; OSError naming --out and why, one line."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"--out {path}: {exc.strerror or exc}") from None
    return path


def write_json(report: dict, path: Path) -> Path:
    """Write the report as JSON (atomically: a partial run never leaves a truncated file)."""
    path = Path(path)
    tmp = path.with_suffix(".json.part")
    tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def _seqlen_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _colors(ours: list[str], peers: list[str]) -> dict[str, str]:
    colors = {n: _OURS_COLORS[i % len(_OURS_COLORS)] for i, n in enumerate(ours)}
    colors.update({n: _PEER_COLORS[i % len(_PEER_COLORS)] for i, n in enumerate(peers)})
    return colors


#: the names ``write_charts`` gives its PNGs (globs): what ``write_reports`` removes when a run did not rewrite them
CHART_FILES = ("tflops-*-d*-causal.png", "tflops-*-d*-noncausal.png", "memory.png")


def write_charts(report: dict, outdir: Path) -> list[Path]:
    """Bar charts in the FlashAttention papers' style: TFLOP/s against seqlen, one bar per implementation,
    one chart per (dtype, head_dim, causal); and the memory chart. Returns the PNG paths.
    Raises ImportError when matplotlib is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    ours, peers = impl_names(report["results"] + report.get("memory", []))
    colors = _colors(ours, peers)
    gpu = report["meta"].get("gpu", {}).get("name", "")
    paths = []
    for (dtype, head_dim, causal), rows in _groups(case_rows(report["results"])).items():
        names = [n for n in ours + peers if any(r["tflops"].get(n) for r in rows)]
        if not names:
            continue
        fig, ax = plt.subplots(figsize=(max(6.0, 0.28 * len(names) * len(rows) + 2), 4.2))
        width = 0.84 / len(names)
        for i, name in enumerate(names):
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(rows))]
            vals = [r["tflops"].get(name) or 0.0 for r in rows]
            bars = ax.bar(xs, vals, width, label=name, color=colors[name])
            ax.bar_label(bars, labels=[f"{v:.0f}" if v else "" for v in vals], fontsize=6, rotation=90, padding=2)
        ax.set_xticks(range(len(rows)), [_seqlen_label(r["seqlen"]) for r in rows])
        ax.set_xlabel("Sequence length")
        ax.set_ylabel("Speed (TFLOP/s)")
        ax.set_title(f"Attention forward, head dim {head_dim}, {'causal' if causal else 'non-causal'}, "
                     f"{dtype}  ({gpu})", fontsize=10)
        ax.margins(y=0.15)
        ax.legend(fontsize=7, ncol=min(len(names), 5), loc="upper left")
        fig.tight_layout()
        path = outdir / f"tflops-{dtype}-d{head_dim}-{'causal' if causal else 'noncausal'}.png"
        fig.savefig(path, dpi=130)
        plt.close(fig)
        paths.append(path)
    memory = report.get("memory", [])
    if any(m.get("peak_mib") for m in memory):
        paths.append(_memory_chart(memory, colors, gpu, outdir / "memory.png", plt))
    return paths


def _memory_chart(memory: list[dict], colors: dict, gpu: str, path: Path, plt) -> Path:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ours, peers = impl_names(memory, measured="peak_mib")
    names = ours + peers
    seqlens = sorted({m["seqlen"] for m in memory})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(names) * len(seqlens) + 2), 4.2))
    width = 0.84 / len(names)
    for i, name in enumerate(names):
        by_n = {m["seqlen"]: m for m in memory if m["impl"] == name}
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(seqlens))]
        vals = [(by_n.get(n) or {}).get("peak_mib") or 0.0 for n in seqlens]
        ax.bar(xs, [v or float("nan") for v in vals], width, label=name, color=colors.get(name, "#7f7f7f"))
        for x, n, v in zip(xs, seqlens, vals):  # mark out-of-memory where the bar would be
            if n in by_n and not v and "out of memory" in (by_n[n].get("error") or ""):
                ax.text(x, 0.03, "OOM", transform=ax.get_xaxis_transform(), rotation=90, ha="center",
                        va="bottom", fontsize=7, color=colors.get(name, "#7f7f7f"), fontweight="bold")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 4)  # room for the legend
    ax.set_xticks(range(len(seqlens)), [_seqlen_label(n) for n in seqlens])
    ax.set_xlabel("Sequence length")
    ax.set_ylabel("Peak allocated memory (MiB)")
    m0 = memory[0]
    ax.set_title(f"Attention forward memory, head dim {m0['head_dim']}, batch {m0['batch']}, {m0['dtype']}  "
                 f"({gpu})", fontsize=10)
    ax.legend(fontsize=7, ncol=min(len(names), 5), loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def write_reports(report: dict, outdir: Path, charts: bool = True) -> dict[str, object]:
    """Write bench.json, the PNG charts (when matplotlib is importable and charts is true) and bench.md.
    The charts of an earlier run in outdir that this one did not rewrite (``CHART_FILES``) are removed.
    Returns {"json": path, "markdown": path, "charts": [paths], "charts_error": str or None}."""
    from fa_variants.cli import remove_stale

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    chart_paths, chart_error = [], None
    if charts:
        try:
            chart_paths = write_charts(report, outdir)
        except ImportError as exc:
            chart_error = (f"charts skipped ({exc}); rebuild them where matplotlib is installed: "
                           f"fa-variants bench --report-from {outdir / 'bench.json'}")
    remove_stale(outdir, CHART_FILES, chart_paths)  # an earlier run's charts, not this report's
    report["charts"] = [p.name for p in chart_paths]
    json_path = write_json(report, outdir / "bench.json")
    md_path = outdir / "bench.md"
    md_path.write_text(to_markdown(report), encoding="utf-8")
    return {"json": json_path, "markdown": md_path, "charts": chart_paths, "charts_error": chart_error}
