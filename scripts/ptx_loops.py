#!/usr/bin/env python3
"""The loops of one PTX kernel and the registers live at each loop's head (issue 12: what NVVM hands ptxas, before
ptxas's own scheduling; bench/NOTES.md, "Session 20 ... read at the PTX level").

    python3 scripts/sass_dump.py ours --head-dim 128 --causal --set persistent=True --out pers.sass --ptx pers.ptx
    python3 scripts/ptx_loops.py pers.ptx [--min-size 200] [--live]

A loop is a branch to a label earlier in the listing (its head); its body is the listing from the head to that
branch, counted in instructions (directives, labels, including those inside inline assembly, and the assembly's
braces left out), with its ``ex2`` and ``wgmma.mma_async`` counts. ``--live``: the registers live at each loop's
head, in 32-bit units (a 64-bit ``%rd`` / ``%fd`` counts 2, predicates 0), from a plain backward dataflow over the
listing's blocks (a block ends at a label and after a branch to one): an instruction's first operand is its
definition (both registers of ``%r|%p``, every register of a ``{...}`` destination), unless it is a memory
operand ``[...]`` or the sink ``_``, and the rest are uses; barriers, fences, branches and the like define
nothing; a WGMMA's accumulators are used and defined (it reads them even when it zero-initialises them); a
predicated definition does not end a live range. Branches inside inline assembly (labels without ``$L__``) stay
inside their block. The PTX of one kernel (``sass_dump.py --ptx``; a second ``.entry`` ends the listing read). A
count to compare two builds of one kernel, not ptxas's register allocation.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

LABEL = re.compile(r"^(\$L__\w+):")
BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__\w+)\s*;")
REG = re.compile(r"%(?:rd|fd|rs|r|f|p)\d+\b")
# instructions whose first operand is not a destination (stores, whose first operand is [...], need no entry)
NO_DEF = ("bar.", "barrier.", "wgmma.fence", "wgmma.commit", "wgmma.wait", "fence.", "bra", "ret", "exit",
          "setmaxnreg", "griddepcontrol", "prefetch", "trap")


@dataclass
class Loop:
    head: str
    first: int  # listing line (from 1) of the head's label
    last: int  # listing line (from 1) of the branch back
    instructions: int
    ex2: int
    wgmma: int
    live_in: int | None = None


def _instructions(lines: list[str]) -> list[tuple[int, str]]:
    """(line index, text) of the instructions and labels of the listing, up to a second ``.entry``."""
    out, entries = [], 0
    for i, raw in enumerate(lines):
        s = raw.split("//", 1)[0].strip()
        entries += ".entry" in s.split()
        if entries > 1:
            break
        if not s or s in ("{", "}") or s.startswith((".", ")", "(")):
            continue
        out.append((i, s))
    return out


def _opcode(s: str) -> str:
    parts = s.split()
    if not parts:
        return ""
    return (parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]).rstrip(";")


def defs_uses(s: str) -> tuple[set[str], set[str], bool]:
    """(registers defined, registers used, whether the definition is predicated) of one PTX instruction."""
    op = _opcode(s)
    predicated = s.startswith("@")
    regs = REG.findall(s)
    pred = REG.findall(s.split()[0]) if predicated else []
    body = s.split(None, 2)[2] if predicated and len(s.split(None, 2)) > 2 else s.split(None, 1)[-1]
    if op.startswith(NO_DEF) or not regs:
        return set(), set(regs), predicated
    if body.startswith("{"):  # a vector destination
        first, rest = body[:body.index("}") + 1], body[body.index("}") + 1:]
    else:
        first, _, rest = body.partition(",")
    if first.lstrip().startswith(("[", "_")):  # a store's address, or the sink: no destination
        return set(), set(regs), predicated
    dst, src = set(REG.findall(first)), set(REG.findall(rest)) | set(pred)
    if op.startswith("wgmma.mma_async"):
        src |= dst
    return dst, src, predicated


def analyse(text: str, live: bool = False) -> list[Loop]:
    """The loops of the PTX ``text`` (module docstring), with the live-in count at each head when ``live``."""
    lines = text.splitlines()
    items = _instructions(lines)
    blocks: dict[str, list[tuple[int, str]]] = {"ENTRY": []}
    order = ["ENTRY"]
    label_line = {}
    for i, s in items:
        m = LABEL.match(s)
        if m:
            order.append(m.group(1))
            blocks[m.group(1)] = []
            label_line[m.group(1)] = i
        else:
            if blocks[order[-1]] and BRANCH.search(blocks[order[-1]][-1][1]):  # a block ends after a branch
                order.append(f"{order[-1]}+{i}")
                blocks[order[-1]] = []
            blocks[order[-1]].append((i, s))
    loops = []
    for b in order:
        for i, s in blocks[b]:
            m = BRANCH.search(s)
            if m and m.group(1) in label_line and label_line[m.group(1)] < i:
                head = m.group(1)
                body = [t for j, t in items if label_line[head] <= j <= i and not t.endswith(":")]
                ops = [_opcode(t) for t in body]
                loops.append(Loop(head, label_line[head] + 1, i + 1, len(body), sum(o.startswith("ex2") for o in ops),
                                  sum(o.startswith("wgmma.mma_async") for o in ops)))
    if live:
        live_in = _liveness(blocks, order)
        width = {"%rd": 2, "%fd": 2, "%p": 0}
        for lp in loops:
            lp.live_in = sum(width.get(re.match(r"%[a-z]+", r).group(0), 1) for r in live_in[lp.head])
    return loops


def _liveness(blocks: dict, order: list[str]) -> dict[str, set[str]]:
    succ = {}
    for n, b in enumerate(order):
        out = [m.group(1) for _, s in blocks[b] for m in [BRANCH.search(s)] if m and m.group(1) in blocks]
        last = blocks[b][-1][1] if blocks[b] else ""
        op = _opcode(last)
        unconditional = not last.startswith("@") and (op.startswith("bra") or op in ("ret", "exit"))
        if not unconditional and n + 1 < len(order):
            out.append(order[n + 1])
        succ[b] = out
    use, kill = {}, {}
    for b in order:
        u, k = set(), set()
        for _, s in blocks[b]:
            d, us, predicated = defs_uses(s)
            u |= us - k
            if not predicated:
                k |= d
        use[b], kill[b] = u, k
    live_in = {b: set() for b in order}
    changed = True
    while changed:
        changed = False
        for b in reversed(order):
            out = set().union(*(live_in[s] for s in succ[b]))
            new = use[b] | (out - kill[b])
            if new != live_in[b]:
                live_in[b], changed = new, True
    return live_in


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("ptx", type=Path)
    ap.add_argument("--min-size", type=int, default=0, help="smallest loop body listed, instructions")
    ap.add_argument("--live", action="store_true", help="registers live at each loop's head (32-bit units)")
    a = ap.parse_args(argv)
    loops = [lp for lp in analyse(a.ptx.read_text(), a.live) if lp.instructions >= a.min_size]
    print("| head | lines | instructions | ex2 | wgmma |" + (" live at head |" if a.live else ""))
    print("|---|---|---|---|---|" + ("---|" if a.live else ""))
    for lp in loops:
        print(f"| {lp.head} | {lp.first}-{lp.last} | {lp.instructions} | {lp.ex2} | {lp.wgmma} |"
              + (f" {lp.live_in} |" if a.live else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
