"""Issue 12: where our fa3's warps stall that flash-attn-4's do not, from one Nsight Compute report of both (no GPU).

    python3 scripts/ncu_compare.py --details R.txt --raw R.csv --source R_source.csv [more source CSVs]
        [--top 15] [--title T] [--out TABLES.md] [--sections summary,stalls,top,classes,opcodes,reasons,loop,turn]
        [--ref-details R2.txt --ref-raw R2.csv --ref-source R2_source.csv --labels new,noskip]

Inputs (scripts/d64ncu_gpu.sh writes them): ``ncu --import R.ncu-rep --page details`` (text), ``--page raw --csv``
and ``--page source --csv --print-source sass`` (one file with both kernels, or one file per kernel). Ours is the
kernel whose name holds ``fa_variants``, flash-attn-4's the one holding ``flash_attn`` (scripts/ncu_table.py's
parsers and pick: of each, the kernel with the most executed instructions; on the source page the group with the
most stall samples). Prints markdown tables, in this order (--sections picks some):

- summary: duration and elapsed cycles, executed instructions, occupancy (achieved, theoretical, warps), registers,
  issue slot utilisation and the scheduler's eligible / issued warps, tensor and other pipes, SM / memory / DRAM
  throughput, L1 / L2 hit rates; ours, flash-attn-4, ours / fa4.
- stalls: WarpStateStats' warp cycles per issued instruction by reason (every reason either kernel has).
- top: per kernel the --top SASS lines by stall samples (offset from the kernel's first address, samples, share,
  warp instructions executed, the two largest reasons, the instruction).
- classes: stall samples by opcode class (GMMA: HGMMA / WARPGROUP.ARRIVE / DEPBAR; BAR named barriers; SYNCS
  mbarrier waits; MUFU; FFMA / FMUL / FADD; FMNMX; conversions; SHFL; branches; memory and TMA; uniform datapath;
  other), with the reasons that make up each class's difference.
- opcodes: the full mnemonics (e.g. SYNCS.PHASECHK.TRANS64.TRYWAIT) with the largest differences.
- reasons: stall samples by reason, from the source page.
- loop: by how often each line ran, over the kernel's most executed line: hot (>= 1/4: the consumer K/V loop),
  warm (1/16 .. 1/4: a one-warp producer loop, consumer branches), cold (< 1/16: prologue, epilogue, once per CTA).

The "diff" columns are ours minus flash-attn-4 in % of flash-attn-4's warp time: a class's share of ours' samples
times ours' elapsed cycles / fa4's, minus its share of fa4's samples (when the summary lacks elapsed cycles: ours'
samples / fa4's, right when both were sampled at the same interval). Over all classes they add up to ours / fa4
elapsed cycles - 1: the gap, spread over the places where our warps wait longer. The stalls table's diff is the same
from WarpStateStats (reason's cycles per issue x issued instructions, over fa4's cycles per issue x its issued
instructions). Both kernels have the same warps per CTA and one CTA per SM (bench/NOTES.md, session 11), so warp time
compares as kernel time.

- turn: per kernel its ping-pong turn in the hot lines (the first BAR.SYNC whose next BAR is a BAR.ARV): the
  BAR.SYNC (waiting for the turn), each WARPGROUP.DEPBAR (a GMMA wait) and BAR.ARV on a row of their own, the runs
  between them as one row each (instruction count, the commonest opcodes); samples in % of fa4's warp time; then the
  turn, its waits, the BAR.SYNC and the rest of the kernel side by side with their diffs (session 12's ncu256 run: the
  fa3-fp8 two-level turn's DEPBAR.LE 1 links).

Two configs of one kernel (names ncu cannot tell apart) come from two reports: --ref-details / --ref-raw /
--ref-source give the second report, whose kernel (ours or fa4 by name) takes the fa4 side; --labels A,B names the
two sides in the output (A for "fa3 (ours)" / "ours", B for "flash-attn-4" / "fa4").

Exit 0 when both kernels are in the summary and both have stall samples on the source page, else 1 (saying what is
missing). A missing input file is an argparse error naming its flag.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ncu_table  # noqa: E402  (scripts/ncu_table.py: the details / raw / source parsers, pick, the shared rows)

SECTIONS = ("summary", "stalls", "top", "classes", "opcodes", "reasons", "loop", "turn")
SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"

_MEMORY = {"LDS", "STS", "LDG", "STG", "LDSM", "STSM", "LDL", "STL", "LD", "ST", "ATOM", "ATOMS", "ATOMG", "RED",
           "MEMBAR", "FENCE", "CCTL", "ERRBAR", "LDGSTS", "LDGDEPBAR", "UBLKCP", "UBLKRED", "UBLKPF"}
#: (label, test on the mnemonic's first part): the first that matches names an instruction's class
CLASSES = [
    ("GMMA (HGMMA, WARPGROUP.ARRIVE / DEPBAR)", lambda op: op in ("HGMMA", "WARPGROUP", "WGMMA")),
    ("BAR (named barriers: ping-pong turn, epilogue)", lambda op: op == "BAR"),
    ("SYNCS (mbarrier: K/V full / empty waits, arrives)", lambda op: op == "SYNCS"),
    ("MUFU (EX2, RCP)", lambda op: op == "MUFU"),
    ("FFMA / FMUL / FADD", lambda op: op in ("FFMA", "FMUL", "FADD", "FFMA2", "FMUL2", "FADD2")),
    ("FMNMX (row max)", lambda op: op.startswith("FMNMX")),
    ("conversions (F2FP, F2F, I2F)", lambda op: op in ("F2FP", "F2F", "I2F", "F2I", "F2IP", "I2FP")),
    ("SHFL (shuffles)", lambda op: op == "SHFL"),
    ("branch / control (BRA, BSSY, BSYNC, WARPSYNC, EXIT)",
     lambda op: op in ("BRA", "BRX", "JMP", "JMX", "BSSY", "BSYNC", "WARPSYNC", "EXIT", "CALL", "RET", "YIELD",
                       "NANOSLEEP", "BREAK", "BPT", "KILL", "ELECT", "VOTE", "VOTEU")),
    ("memory / TMA (LDS, STS, LDSM, UTMALDG, ...)", lambda op: op in _MEMORY or op.startswith("UTMA")),
    ("uniform datapath (U*, R2UR, S2UR)", lambda op: op.startswith("U") or op in ("R2UR", "S2UR")),
    ("other (IMAD, IADD3, LOP3, ISETP, FSETP, SEL, MOV, S2R, ...)", lambda op: True),
]


class Instr:
    """One SASS line of the source page: offset from the kernel's first address, text, stall samples (all), the
    per-reason samples (columns "stall_<reason>"), warp instructions executed (None when not exported)."""

    def __init__(self, offset: int, text: str, samples: float, reasons: dict | None = None,
                 executed: float | None = None):
        self.offset, self.text, self.samples = offset, text, samples
        self.reasons, self.executed = reasons or {}, executed

    @property
    def mnemonic(self) -> str:
        words = self.text.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        return words[0].rstrip(";") if words else "?"

    @property
    def opclass(self) -> str:
        return op_class(self.mnemonic)


def op_class(mnemonic: str) -> str:
    op = mnemonic.split(".")[0]
    return next(label for label, test in CLASSES if test(op))


def _float(cell: str) -> float:
    value = ncu_table._number(cell) if cell.strip() else 0.0
    return value if isinstance(value, float) else 0.0


def parse_source(texts: list[tuple[str, str]]) -> dict[str, list[Instr]]:
    """{"ours": [...], "fa4": [...]}: the SASS lines of each kernel's source-page group (ncu_table.source_groups) with
    the most stall samples. ``texts``: [(file name, text)]; a group is ours / fa4's by its kernel name, else (no
    kernel-name row) by its file's name. Rows shorter than the header are skipped."""
    best: dict[str, tuple[float, list[Instr]]] = {}
    for hint, text in texts:
        for g in ncu_table.source_groups(text):
            impl = ncu_table.impl_of(g["kernel"]) or ncu_table.impl_of(hint)
            head = g["header"]
            if impl is None or SAMPLES not in head or "Source" not in head:
                continue
            at, src, samp = 0, head.index("Source"), head.index(SAMPLES)
            ex = head.index(EXECUTED) if EXECUTED in head else None
            stall_cols = {i: c[len("stall_"):] for i, c in enumerate(head)
                          if c.startswith("stall_") and not c.endswith("(Not Issued)")}
            rows = [r for r in g["rows"] if len(r) >= len(head)]
            if not rows:
                continue
            base = min(ncu_table._address(r[at]) for r in rows)
            instrs = [Instr(ncu_table._address(r[at]) - base, r[src].strip(), _float(r[samp]),
                            {name: _float(r[i]) for i, name in stall_cols.items() if _float(r[i])},
                            _float(r[ex]) if ex is not None else None) for r in rows]
            total = sum(i.samples for i in instrs)
            if impl not in best or total > best[impl][0]:
                best[impl] = (total, instrs)
    return {impl: instrs for impl, (_, instrs) in best.items()}


def _signed(v: float) -> str:
    """A diff with its sign, 2 decimals; -0.00 printed as +0.00."""
    return f"{(v if abs(v) >= 0.005 else 0.0):+.2f}"


# ------------------------------------------------------------------------------------------------ the summary
def _getter(*keys):
    return lambda k: k.value(*keys)


#: (label, getter, digits) added to ncu_table's general rows
EXTRA_ROWS = [
    ("SM frequency (GHz, ncu's locked clock)", ncu_table.sm_ghz, 2),
    ("achieved occupancy (%)", _getter("Occupancy/Achieved Occupancy",
                                       "sm__warps_active.avg.pct_of_peak_sustained_active"), 1),
    ("theoretical occupancy (%)", _getter("Occupancy/Theoretical Occupancy",
                                          "sm__maximum_warps_per_active_cycle_pct"), 1),
    ("achieved active warps per SM", _getter("Occupancy/Achieved Active Warps Per SM",
                                             "sm__warps_active.avg.per_cycle_active"), 2),
    ("registers per thread", _getter("Launch Statistics/Registers Per Thread", "launch__registers_per_thread"), 0),
    ("issue slot utilisation: one or more eligible (%)", _getter(
        "Scheduler Statistics/One or More Eligible", "smsp__issue_active.avg.pct_of_peak_sustained_active"), 1),
    ("no eligible (%)", _getter("Scheduler Statistics/No Eligible"), 1),
    ("active warps per scheduler", _getter("Scheduler Statistics/Active Warps Per Scheduler",
                                           "smsp__warps_active.avg.per_cycle_active"), 2),
    ("eligible warps per scheduler", _getter("Scheduler Statistics/Eligible Warps Per Scheduler",
                                             "smsp__warps_eligible.avg.per_cycle_active"), 2),
    ("issued warp per scheduler", _getter("Scheduler Statistics/Issued Warp Per Scheduler",
                                          "smsp__inst_issued.avg.per_cycle_active"), 3),
    ("compute (SM) throughput (%)", _getter("GPU Speed Of Light Throughput/Compute (SM) Throughput",
                                            "sm__throughput.avg.pct_of_peak_sustained_elapsed"), 1),
    ("memory throughput (% of peak)", _getter("GPU Speed Of Light Throughput/Memory Throughput",
                                              "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"), 1),
    ("DRAM throughput (%)", _getter("GPU Speed Of Light Throughput/DRAM Throughput",
                                    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"), 1),
    ("L1/TEX hit rate (%)", _getter("Memory Workload Analysis/L1/TEX Hit Rate", "l1tex__t_sector_hit_rate.pct"), 1),
    ("mem pipes busy (%)", _getter("Memory Workload Analysis/Mem Pipes Busy"), 1),
    ("tensor pipe busy (cycles per SM)", lambda k: tensor_busy(k), 0),
]


def tensor_busy(k) -> float | None:
    """Tensor (GMMA) pipe busy cycles per SM: the metric where collected, else its % of elapsed x elapsed cycles."""
    got = k.value("sm__pipe_tensor_op_gmma_cycles_active.avg")
    if got is not None:
        return got
    pct, c = ncu_table.tensor_pct(k), cycles(k)
    return pct * c / 100 if pct is not None and c else None


def cycles(k) -> float | None:
    return k.value("GPU Speed Of Light Throughput/Elapsed Cycles", "gpc__cycles_elapsed.max", "sm__cycles_elapsed.max")


def summary_table(pair: dict) -> list[str]:
    ours, fa4 = pair.get("ours"), pair.get("fa4")
    present = [k for k in (ours, fa4) if k is not None]
    rows = [r for r in ncu_table.rows_for(present) if not r[0].startswith(("stall samples", "cycles per issue"))]
    lines = ["| metric | fa3 (ours) | flash-attn-4 | ours / fa4 |", "|---|---|---|---|"]
    for label, get, digits in rows[:1] + EXTRA_ROWS[:1] + rows[1:] + EXTRA_ROWS[1:]:
        a, b = (get(k) if k else None for k in (ours, fa4))
        if a is None and b is None:
            continue  # a metric neither page has
        lines.append(f"| {label} | {ncu_table._fmt(a, digits)} | {ncu_table._fmt(b, digits)} | "
                     f"{ncu_table._ratio(a, b)} |")
    return lines


def _issued(k):
    return k.value("smsp__inst_issued.sum", "Instruction Statistics/Issued Instructions") or ncu_table.instructions(k)


def stalls_table(pair: dict) -> list[str]:
    """WarpStateStats by reason; diff = (ours' cycles x issued - fa4's) / fa4's warp cycles, in %."""
    ours, fa4 = pair.get("ours"), pair.get("fa4")
    if ours is None or fa4 is None:
        return ["(stalls: a kernel is missing)"]
    ro, rf = ncu_table.warp_stall_ratios(ours), ncu_table.warp_stall_ratios(fa4)
    if not ro and not rf:
        return ["(stalls: no WarpStateStats per-reason metrics on the raw page)"]
    io, if_ = _issued(ours), _issued(fa4)
    cpi_f = fa4.value("smsp__average_warp_latency_per_inst_issued.ratio",
                      "Warp State Statistics/Warp Cycles Per Issued Instruction") or sum(rf.values())
    lines = ["| stall reason (WarpStateStats) | ours cycles / issue | fa4 cycles / issue | ours / fa4 | "
             "diff (% of fa4 warp time) |", "|---|---|---|---|---|"]
    for r in sorted(set(ro) | set(rf), key=lambda r: -(ro.get(r, 0) + rf.get(r, 0))):
        a, b = ro.get(r), rf.get(r)
        diff = "-"
        if io and if_ and cpi_f:
            diff = _signed(100 * ((a or 0) * io - (b or 0) * if_) / (cpi_f * if_))
        lines.append(f"| {r} | {ncu_table._fmt(a, 2)} | {ncu_table._fmt(b, 2)} | {ncu_table._ratio(a, b)} | {diff} |")
    return lines


# ------------------------------------------------------------------------------------------- the source page
def top_table(name: str, instrs: list[Instr], n: int) -> list[str]:
    total = sum(i.samples for i in instrs) or 1.0
    lines = [f"top {n} SASS lines by stall samples, {name} ({total:,.0f} samples):", "",
             "| offset | samples | share % | executed | reasons | instruction |", "|---|---|---|---|---|---|"]
    for i in sorted(instrs, key=lambda i: -i.samples)[:n]:
        lines.append(f"| +0x{i.offset:05x} | {i.samples:,.0f} | {100 * i.samples / total:.1f} | "
                     f"{ncu_table._fmt(i.executed, 0)} | {_top_reasons(i.reasons, i.samples)} | "
                     f"{i.text[:70].replace('|', '/')} |")
    return lines


def _top_reasons(reasons: dict, total: float, n: int = 2) -> str:
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{r} {100 * v / (total or 1):.0f}%" for r, v in top) or "-"


def _totals(instrs: list[Instr], key) -> tuple[dict, dict]:
    """({group: samples}, {group: {reason: samples}}) of the instructions grouped by ``key``."""
    samples: dict = {}
    reasons: dict = {}
    for i in instrs:
        g = key(i)
        samples[g] = samples.get(g, 0.0) + i.samples
        by_reason = reasons.setdefault(g, {})
        for r, v in i.reasons.items():
            by_reason[r] = by_reason.get(r, 0.0) + v
    return samples, reasons


def diff_scale(pair: dict, src: dict) -> tuple[float, str]:
    """ours' warp time / fa4's: elapsed cycles where the summary has both, else the sample totals."""
    co, cf = (cycles(pair[k]) if pair.get(k) else None for k in ("ours", "fa4"))
    if co and cf:
        return co / cf, f"ours / fa4 elapsed cycles {co / cf:.4f}"
    so, sf = (sum(i.samples for i in src[k]) for k in ("ours", "fa4"))
    return so / sf, f"ours / fa4 stall samples {so / sf:.4f} (no elapsed cycles: same sampling interval assumed)"


def grouped_table(title: str, src: dict, scale: float, key, order=None, limit=None) -> list[str]:
    """Samples by group (``key`` of an instruction, or {"ours": key, "fa4": key}) of both kernels: samples, shares,
    diff in % of fa4's warp time, and the reasons that make up the diff (the two largest by size); rows in
    ``order``, else by |diff| (the first ``limit``)."""
    keys = key if isinstance(key, dict) else {"ours": key, "fa4": key}
    so, ro = _totals(src["ours"], keys["ours"])
    sf, rf = _totals(src["fa4"], keys["fa4"])
    to, tf = sum(so.values()) or 1.0, sum(sf.values()) or 1.0
    diff = {g: 100 * (so.get(g, 0) / to * scale - sf.get(g, 0) / tf) for g in set(so) | set(sf)}
    groups = [g for g in (order or []) if g in diff] or sorted(diff, key=lambda g: -abs(diff[g]))
    lines = [f"| {title} | ours samples | ours % | fa4 samples | fa4 % | diff (% of fa4 warp time) | "
             "diff by reason |", "|---|---|---|---|---|---|---|"]
    for g in groups[:limit]:
        by_reason = {r: 100 * (ro.get(g, {}).get(r, 0) / to * scale - rf.get(g, {}).get(r, 0) / tf)
                     for r in set(ro.get(g, {})) | set(rf.get(g, {}))}
        top = sorted(by_reason.items(), key=lambda kv: -abs(kv[1]))[:2]
        lines.append(f"| {g} | {so.get(g, 0):,.0f} | {100 * so.get(g, 0) / to:.1f} | {sf.get(g, 0):,.0f} | "
                     f"{100 * sf.get(g, 0) / tf:.1f} | {_signed(diff[g])} | "
                     f"{', '.join(f'{r} {_signed(v)}' for r, v in top) or '-'} |")
    if limit is None or limit >= len(groups):
        lines.append(f"| all | {to:,.0f} | 100 | {tf:,.0f} | 100 | {_signed(sum(diff.values()))} | |")
    return lines


def reasons_table(src: dict, scale: float) -> list[str]:
    """Stall samples by reason (source page's stall_* columns), both kernels, diff in % of fa4's warp time."""
    ro = _totals(src["ours"], lambda i: "")[1].get("", {})
    rf = _totals(src["fa4"], lambda i: "")[1].get("", {})
    if not ro and not rf:
        return ["(reasons: the source page has no stall_* columns)"]
    to = sum(i.samples for i in src["ours"]) or 1.0
    tf = sum(i.samples for i in src["fa4"]) or 1.0
    lines = ["| stall reason (source page) | ours samples | ours % | fa4 samples | fa4 % | diff (% of fa4 warp time) |",
             "|---|---|---|---|---|---|"]
    for r in sorted(set(ro) | set(rf), key=lambda r: -abs(ro.get(r, 0) / to * scale - rf.get(r, 0) / tf)):
        a, b = ro.get(r, 0.0), rf.get(r, 0.0)
        lines.append(f"| {r} | {a:,.0f} | {100 * a / to:.1f} | {b:,.0f} | {100 * b / tf:.1f} | "
                     f"{_signed(100 * (a / to * scale - b / tf))} |")
    return lines


#: (label, lowest executed count as a fraction of the kernel's hottest instruction's), hottest first
HEAT = [("hot: executed >= 1/4 of the hottest (consumer K/V loop)", 1 / 4),
        ("warm: 1/16 .. 1/4 (producer loop, consumer branches)", 1 / 16),
        ("cold: < 1/16 (prologue, epilogue, rare branches)", 0.0)]


def heat_key(instrs: list[Instr]):
    """An instruction's HEAT label, by its executed count over the kernel's hottest instruction's. With 12
    consumer warps and one producer warp per CTA and >= 16 K/V tiles per CTA, the consumer loop is hot, a
    one-warp producer loop warm (1/12), what runs once per CTA cold."""
    hottest = max((i.executed or 0.0) for i in instrs) or 1.0
    return lambda i: next(label for label, low in HEAT if (i.executed or 0.0) >= hottest * low)


# ---------------------------------------------------------------------------------------------------- the turn
_ANCHORS = ("BAR.SYNC", "WARPGROUP.DEPBAR", "BAR.ARV")


def turn_lines(instrs: list[Instr]) -> list[Instr] | None:
    """The hot SASS lines (heat_key's hot rows; all lines without executed counts) from the first BAR.SYNC whose next
    BAR is a BAR.ARV to that BAR.ARV, in address order; None when there is no such pair."""
    hot_label = HEAT[0][0]
    key = heat_key(instrs) if all(i.executed is not None for i in instrs) else (lambda i: hot_label)
    hot = sorted((i for i in instrs if key(i) == hot_label), key=lambda i: i.offset)
    bars = [n for n, i in enumerate(hot) if i.mnemonic.startswith("BAR.")]
    for a, b in zip(bars, bars[1:]):
        if hot[a].mnemonic.startswith("BAR.SYNC") and hot[b].mnemonic.startswith("BAR.ARV"):
            return hot[a:b + 1]
    return None


def turn_segments(turn: list[Instr]) -> list[tuple[str, list[Instr]]]:
    """[(label, lines)]: each anchor (BAR.SYNC, WARPGROUP.DEPBAR, BAR.ARV) alone, the runs between them as one."""
    segs: list[tuple[str, list[Instr]]] = []
    for i in turn:
        if i.mnemonic.startswith(_ANCHORS):
            segs.append((i.text.rstrip(" ;")[:48], [i]))
        elif segs and segs[-1][0] == "run":
            segs[-1][1].append(i)
        else:
            segs.append(("run", [i]))
    return segs


def _opcounts(lines: list[Instr], n: int = 4) -> str:
    counts: dict = {}
    for i in lines:
        op = i.mnemonic.split(".")[0]
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(f"{op} {c}" for op, c in sorted(counts.items(), key=lambda kv: -kv[1])[:n])


def turn_table(src: dict, scale: float) -> list[str]:
    """Each kernel's turn segment by segment, then turn / waits / BAR.SYNC / rest side by side (% of fa4's warp time)."""
    lines, parts = [], {}
    for tag, name in (("ours", "fa3 (ours)"), ("fa4", "flash-attn-4")):
        instrs, k = src[tag], (scale if tag == "ours" else 1.0)
        total = sum(i.samples for i in instrs) or 1.0
        pct = lambda ls: 100 * k * sum(i.samples for i in ls) / total  # noqa: E731
        turn = turn_lines(instrs)
        if turn is None:
            lines += [f"(turn: no hot BAR.SYNC .. BAR.ARV in {name})", ""]
            continue
        lines += [f"turn of {name} (+0x{turn[0].offset:05x} .. +0x{turn[-1].offset:05x}), samples in % of fa4's warp "
                  "time:", "", "| segment | offset | instructions | samples | % of fa4 warp time | reasons |",
                  "|---|---|---|---|---|---|"]
        for label, seg in turn_segments(turn):
            what = f"run: {_opcounts(seg)}" if label == "run" else label
            reasons: dict = {}
            for i in seg:
                for r, v in i.reasons.items():
                    reasons[r] = reasons.get(r, 0.0) + v
            samples = sum(i.samples for i in seg)
            lines.append(f"| {what} | +0x{seg[0].offset:05x} | {len(seg)} | {samples:,.0f} | {pct(seg):.2f} | "
                         f"{_top_reasons(reasons, samples)} |")
        inside = set(map(id, turn[1:]))
        parts[tag] = {"turn wait (its BAR.SYNC)": pct(turn[:1]),
                      "turn after BAR.SYNC .. BAR.ARV": pct(turn[1:]),
                      "  of it: WARPGROUP.DEPBAR lines": pct([i for i in turn[1:] if i.mnemonic.startswith(_ANCHORS[1])]),
                      "  of it: the rest (issue, promotion, ARRIVE)": pct(
                          [i for i in turn[1:] if not i.mnemonic.startswith(_ANCHORS[1])]),
                      "outside the turn (the rest of the kernel)": pct(
                          [i for i in instrs if id(i) not in inside and i is not turn[0]])}
        lines.append("")
    if len(parts) == 2:
        lines += ["| region (% of fa4 warp time) | ours | fa4 | diff |", "|---|---|---|---|"]
        for region in parts["ours"]:
            a, b = parts["ours"][region], parts["fa4"][region]
            lines.append(f"| {region} | {a:.2f} | {b:.2f} | {_signed(a - b)} |")
        a = sum(v for r, v in parts["ours"].items() if not r.startswith("  "))
        b = sum(v for r, v in parts["fa4"].items() if not r.startswith("  "))
        lines += [f"| all | {a:.2f} | {b:.2f} | {_signed(a - b)} |", ""]
    return lines


def relabel(text: str, labels: tuple[str, str]) -> str:
    """The output with ``labels`` (ours', fa4's) for "fa3 (ours)" / "ours" and "flash-attn-4" / "fa4"."""
    import re

    ours, ref = labels
    text = text.replace("fa3 (ours)", ours).replace("flash-attn-4", ref)
    return re.sub(r"\bfa4\b", ref, re.sub(r"\bours\b", ours, text))


# ---------------------------------------------------------------------------------------------------- main
def report(pair: dict, src: dict, sections: list[str], top: int) -> list[str]:
    lines: list[str] = []
    if "summary" in sections:
        lines += summary_table(pair) + [""]
        for tag, k in (("ours", pair.get("ours")), ("flash-attn-4", pair.get("fa4"))):
            lines.append(f"{tag}: " + (f"{k.name[:90]} grid {k.grid} x block {k.block}" if k else "not in the report"))
        lines.append("")
    if "stalls" in sections:
        lines += stalls_table(pair) + [""]
    if not ("ours" in src and "fa4" in src):
        missing = [t for t in ("ours", "fa4") if t not in src]
        return lines + [f"(source page: no stall samples of {', '.join(missing)}: the per-line tables need both)"]
    scale, how = diff_scale(pair, src)
    if "top" in sections:
        for tag, name in (("ours", "fa3 (ours)"), ("fa4", "flash-attn-4")):
            lines += top_table(name, src[tag], top) + [""]
    lines.append(f"diff columns: ours minus fa4 in % of fa4's warp time; scale {how}")
    lines.append("")
    if "classes" in sections:
        lines += grouped_table("opcode class", src, scale, lambda i: i.opclass, [c for c, _ in CLASSES]) + [""]
    if "opcodes" in sections:
        lines += grouped_table("mnemonic (largest diffs)", src, scale, lambda i: i.mnemonic, limit=top) + [""]
    if "reasons" in sections:
        lines += reasons_table(src, scale) + [""]
    if "loop" in sections:
        if all(i.executed is not None for k in ("ours", "fa4") for i in src[k]):
            keys = {k: heat_key(src[k]) for k in ("ours", "fa4")}  # per kernel: its own hottest instruction
            lines += grouped_table("where (by executed count)", src, scale, keys, [h for h, _ in HEAT]) + [""]
        else:
            lines += ["(loop: the source page has no Instructions Executed column)", ""]
    if "turn" in sections:
        lines += turn_table(src, scale)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    ap.add_argument("--details", required=True, help="ncu --page details text")
    ap.add_argument("--raw", help="ncu --page raw --csv text of the same report")
    ap.add_argument("--source", nargs="+", metavar="CSV", default=[],
                    help="ncu --page source --csv --print-source sass texts (both kernels in one, or one each)")
    ap.add_argument("--top", type=int, default=15, help="SASS lines per kernel in the top table (default 15)")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", help="markdown file the tables are appended to")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    ap.add_argument("--ref-details", help="a second report's details page: its kernel is the reference (fa4 side)")
    ap.add_argument("--ref-raw", help="the second report's raw page")
    ap.add_argument("--ref-source", nargs="+", metavar="CSV", default=[], help="the second report's source pages")
    ap.add_argument("--labels", help="OURS,REF: the two sides' names in the output (default fa3 (ours),flash-attn-4)")
    a = ap.parse_args(argv)
    labels = tuple(x.strip() for x in a.labels.split(",")) if a.labels else None
    if labels is not None and (len(labels) != 2 or not all(labels)):
        ap.error(f"--labels: expected two comma-separated names; got {a.labels!r}")
    if (a.ref_raw or a.ref_source) and not a.ref_details:
        ap.error("--ref-raw / --ref-source: need --ref-details")
    for flag, path in (("--details", a.details), ("--raw", a.raw), *(("--source", p) for p in a.source),
                       ("--ref-details", a.ref_details), ("--ref-raw", a.ref_raw),
                       *(("--ref-source", p) for p in a.ref_source)):
        if path is not None and not Path(path).is_file():
            ap.error(f"{flag}: no such file {path}")
    sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    if not sections or set(sections) - set(SECTIONS):
        ap.error(f"--sections: expected a comma list of {', '.join(SECTIONS)}; got {a.sections!r}")
    if a.top < 1:
        ap.error(f"--top: expected >= 1, got {a.top}")
    kernels = ncu_table.parse_details(Path(a.details).read_text(errors="replace"))
    if a.raw:
        kernels = ncu_table.merge(kernels, ncu_table.parse_raw_csv(Path(a.raw).read_text(errors="replace")))
    pair = ncu_table.pick(kernels)
    src = parse_source([(Path(p).name, Path(p).read_text(errors="replace")) for p in a.source])
    if a.ref_details:  # two reports: the second one's kernel is the reference, whatever its name
        pair, src = _with_reference(pair, src, a)
    lines = ([f"### {a.title}", ""] if a.title else []) + report(pair, src, sections, a.top)
    text = "\n".join(lines) + "\n"
    if labels:
        text = relabel(text, labels)
    print(text, end="")
    if a.out:
        with open(a.out, "a") as f:
            f.write(text + "\n")
    missing = [f"summary: {t}" for t in ("ours", "fa4") if t not in pair]
    missing += [f"source samples: {t}" for t in ("ours", "fa4") if not sum(i.samples for i in src.get(t, []))]
    if missing:
        print("incomplete: " + "; ".join(missing))
    return 1 if missing else 0


def _with_reference(pair: dict, src: dict, a) -> tuple[dict, dict]:
    """(pair, src) with the fa4 side taken from --ref-details / --ref-raw / --ref-source (its ours, else its fa4)."""
    ref = ncu_table.parse_details(Path(a.ref_details).read_text(errors="replace"))
    if a.ref_raw:
        ref = ncu_table.merge(ref, ncu_table.parse_raw_csv(Path(a.ref_raw).read_text(errors="replace")))
    ref_pair = ncu_table.pick(ref)
    ref_src = parse_source([(Path(p).name, Path(p).read_text(errors="replace")) for p in a.ref_source])
    pair = {k: v for k, v in {"ours": pair.get("ours"), "fa4": ref_pair.get("ours", ref_pair.get("fa4"))}.items() if v}
    src = {k: v for k, v in {"ours": src.get("ours"), "fa4": ref_src.get("ours", ref_src.get("fa4"))}.items() if v}
    return pair, src


if __name__ == "__main__":
    raise SystemExit(main())
