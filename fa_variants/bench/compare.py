"""Regression check of `fa-variants bench` against a saved report (issue 12): ``--compare SAVED.json``.

Every (implementation, dtype, head_dim, seqlen, causal) measured in both reports is compared by TFLOP/s; a
case of ours that got more than ``threshold`` (default 3%) slower, or that the saved run measured and this one
did not (failed, skipped), is a regression. Peers are compared too and shown beside: when the peers moved by
as much as ours, the machine (clocks, power, another tenant) moved, not the kernel. Pure Python (stdlib):
it runs on saved JSON files anywhere (``fa-variants bench --report-from NEW.json --compare OLD.json``).
"""
from __future__ import annotations

import math
import statistics

DEFAULT_THRESHOLD = 0.03


def _measured(tflops) -> float | None:
    """A TFLOP/s figure, or None where there is none to compare: null, 0, negative, NaN or infinite (a broken
    measurement is not a result: a NaN compared as a ratio passed every threshold before session 28)."""
    if tflops is None or not math.isfinite(tflops) or tflops <= 0:
        return None
    return float(tflops)


def _key(r: dict) -> tuple:
    return r["impl"], r["dtype"], r["head_dim"], r["seqlen"], bool(r["causal"])


def _by_case(report: dict) -> dict[tuple, dict]:
    """Result records by case key; a later record of the same case wins (as in the report's tables)."""
    return {_key(r): r for r in report["results"]}


def other_gpu(new: dict, old: dict) -> str | None:
    """A sentence when the two reports name different GPUs (``meta.gpu.name``), else None: their ratios then
    measure the cards, not a change of ours, and ``compare`` flags no regression."""
    def name(report: dict) -> str:
        gpu = (report.get("meta") or {}).get("gpu") if isinstance(report.get("meta"), dict) else None
        return str(gpu.get("name") or "") if isinstance(gpu, dict) else str(gpu or "")

    names = [name(new), name(old)]
    if all(names) and names[0] != names[1]:
        return (f"the saved run is from another GPU ({names[1]}; this one: {names[0]}): ratios only, "
                "no regression verdict")
    return None


def compare(new: dict, old: dict, threshold: float = DEFAULT_THRESHOLD) -> list[dict]:
    """One row per case in the saved report ``old``: impl, kind, dtype, head_dim, seqlen, causal, old and new
    TFLOP/s (None when not measured), ratio new / old (None unless both measured) and ``regressed``: True for
    a case of ours slower than (1 - threshold) x old, or measured in old but not in new; across GPUs
    (``other_gpu``) only the latter: the speeds are the cards', a case that no longer runs is still ours."""
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold={threshold!r} must be in [0, 1) (a fraction: 0.03 is 3%)")
    judged = other_gpu(new, old) is None
    now = _by_case(new)
    rows = []
    for key, was in _by_case(old).items():
        t_old = _measured(was.get("tflops"))
        if t_old is None:
            continue  # nothing to compare against
        rec = now.get(key)
        t_new = _measured(rec.get("tflops")) if rec else None
        ratio = t_new / t_old if t_new else None
        ours = was["kind"] == "ours"
        error = (rec or {}).get("error") or ("not in the new report" if rec is None else None)
        if rec is not None and t_new is None and error is None and rec.get("tflops") is not None:
            error = f"TFLOP/s {rec['tflops']!r} is not a measurement"
        rows.append(dict(impl=key[0], kind=was["kind"], dtype=key[1], head_dim=key[2], seqlen=key[3], causal=key[4],
                         old=t_old, new=t_new, ratio=ratio, error=error,
                         regressed=ours and (ratio is None or (judged and ratio < 1 - threshold))))
    return rows


def peer_drift(rows: list[dict]) -> float | None:
    """Median new / old TFLOP/s over the peers' cases (None without peers): the machine's own drift."""
    ratios = [r["ratio"] for r in rows if r["kind"] == "peer" and r["ratio"]]
    return statistics.median(ratios) if ratios else None


def markdown(rows: list[dict], threshold: float, old_name: str = "saved", note: str | None = None) -> str:
    """The comparison as markdown: regressions first, then every case (``note``: ``other_gpu``'s sentence)."""
    drift = peer_drift(rows)
    bad = [r for r in rows if r["regressed"]]
    verdict = ("not measured in this run (speeds across GPUs not judged)" if note else
               f"more than {threshold:.0%} slower (or not measured)")
    lines = [f"# Bench comparison against {old_name}", ""] + ([f"Note: {note}.", ""] if note else []) + [
             f"{len(bad)} of {sum(r['kind'] == 'ours' for r in rows)} cases of ours {verdict}. Peers' median "
             "new/old: " + (f"{drift:.3f}" if drift is not None else "no peers") + ".", "",
             "| impl | dtype | D | N | causal | old TFLOP/s | new TFLOP/s | new/old | |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (not r["regressed"], r["kind"] != "ours", r["impl"], r["dtype"],
                                         r["head_dim"], r["causal"], r["seqlen"])):
        new = f"{r['new']:.0f}" if r["new"] else (r["error"] or "—")
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "—"
        lines.append(f"| {r['impl']} | {r['dtype']} | {r['head_dim']} | {r['seqlen']} | "
                     f"{'yes' if r['causal'] else 'no'} | {r['old']:.0f} | {new} | {ratio} | "
                     f"{'SLOWER' if r['regressed'] else ''} |")
    return "\n".join(lines) + "\n"


def summary_lines(rows: list[dict], threshold: float, note: str | None = None) -> list[str]:
    """Short lines for the terminal: one per regression, then a count (``note``: ``other_gpu``'s sentence, first)."""
    out = []
    for r in rows:
        if r["regressed"]:
            case = f"{r['impl']} {r['dtype']} D={r['head_dim']} N={r['seqlen']} {'causal' if r['causal'] else 'full'}"
            now = f"{r['new']:.0f} TFLOP/s, {r['ratio']:.3f}x" if r["new"] else f"not measured ({r['error']})"
            out.append(f"REGRESSION {case}: {r['old']:.0f} TFLOP/s before, now {now}")
    drift = peer_drift(rows)
    n_ours = sum(r["kind"] == "ours" for r in rows)
    n_bad = len(out)
    if note:
        out.append(f"compare: {note}")
        out.append(f"compare: {n_bad} of {n_ours} cases of ours not measured in this run (speeds across GPUs "
                   "not judged)" + (f"; peers' median new/old {drift:.3f}" if drift is not None else ""))
        return out
    out.append(f"compare: {len(out)} of {n_ours} cases of ours more than {threshold:.0%} slower than the saved run"
               + (f" (peers' median new/old {drift:.3f})" if drift is not None else ""))
    return out
