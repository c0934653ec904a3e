#!/usr/bin/env python3
"""Opcode classes of the loop bodies of two SASS listings, side by side (issue 12: ours vs flash-attn-4).

A loop is a backward branch whose span (target label .. the branch) holds no EXIT: the consumers' K/V mainloops
(hundreds of instructions), the producer's TMA loop (tens), the mbarrier try-wait spins (a few). The blocks after
the kernel's exit that retry an mbarrier wait and branch back into the code above span an EXIT and are not loops.
For each side the loops with at least ``--min-size`` instructions are listed by address; loop i of A is compared
with loop i of B (``--pair`` picks other pairs), one row per opcode class with the count in each and B - A.

An opcode's class is its mnemonic without modifiers (FFMA.FTZ -> FFMA, HGMMA.64x128x16.F32.BF16 -> HGMMA), except
the families whose first modifier is the operation (MUFU.EX2, MUFU.RCP; SYNCS.ARRIVE..., SYNCS.PHASECHK...;
WARPGROUP.ARRIVE, WARPGROUP.DEPBAR; BAR.SYNC, BAR.ARV): ``--modifiers N`` keeps the first N modifiers for every
opcode instead. Predicated instructions (@P0, @!UP1) count like the others: static counts, not executed ones; a
rarely taken branch inside a loop (e.g. the huge-logit path of ours) is counted in full unless ``--skip-cold-a
LABEL`` (``-b``) names the label that a forward branch over it targets: the instructions the branch jumps over
are left out (the path executed when the branch is taken); ``--skip-jumps N`` does it for every forward branch
over N or more instructions, in both. ``--list`` prints the compared loops' instructions.

``--stalls`` (listings with encodings: nvdisasm -hex, ``scripts/sass_dump.py --hex``) adds, per compared loop, the
sum of the compiler's stall counts over the instructions compared: the cycles one warp spends issuing that path when
nothing else holds it (no scoreboard wait, no other warp taking the issue slot), a static latency, not a measurement;
and the part of it after the last MUFU.EX2 (the step's tail). The stall count is the low 4 of the 21 control bits
that the second 64-bit word of each instruction carries from bit 41 (then: yield, write and read scoreboard, wait
mask, reuse), the layout described for Volta onwards (Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via
Microbenchmarking", 2018) and what sm_90a listings show: 7 = no scoreboard, a wait-mask bit set on the instruction
that reads a variable-latency result (MUFU, S2R) whose producer set that scoreboard.

SASS from nvdisasm -c: scripts/sass_dump.py writes ours and flash-attn-4's (or ``fa_variants.common.cubin.sass_of``,
or CUTE_DSL_KEEP=sass). Pure Python, no GPU.

    python3 scripts/sass_diff.py ours.sass fa4.sass [--min-size 200] [--pair 0:0] [--labels ours fa4] [--skip-jumps 32]
                                 [--stalls]
"""
from __future__ import annotations

import argparse
import collections
import re
import sys

_LABEL = re.compile(r"\s*\.(L_x_\d+):")
_INSTR = re.compile(r"\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
_TARGET = re.compile(r"\bBRA\b(?:\.\w+)*\s+(?:\w+\s*,\s*)?`\(\.(L_x_\d+)\)")
_PRED = re.compile(r"^@!?U?P[T\d]+\s+")
_WORD = re.compile(r"/\*\s*(0x[0-9a-f]{16})\s*\*/")
# opcode families whose first modifier names the operation (kept in the class by default)
_KEEP_FIRST = ("MUFU", "SYNCS", "WARPGROUP", "BAR", "DEPBAR", "UTMALDG", "UTMASTG", "SHFL", "VOTE", "F2FP")


def parse(text: str) -> tuple[list[tuple[int, str]], dict[str, int]]:
    """(instructions as (address, text without the trailing ';'), label -> address) of a SASS listing."""
    instrs, labels, pending = [], {}, []
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        addr = int(m.group(1), 16)
        for name in pending:
            labels[name] = addr
        pending = []
        instrs.append((addr, m.group(2)))
    return instrs, labels


def control_words(text: str) -> dict[int, int]:
    """address -> the second 64-bit word of each instruction of a listing with encodings (nvdisasm -hex: the first
    word after the instruction on its line, the second alone on the next line); empty without encodings."""
    out, lines = {}, text.splitlines()
    for i, line in enumerate(lines[:-1]):
        m = _INSTR.match(line)
        if m and _WORD.search(line[m.end():]):
            second = _WORD.search(lines[i + 1])
            if second and not _INSTR.match(lines[i + 1]):
                out[int(m.group(1), 16)] = int(second.group(1), 16)
    return out


def stall(word: int) -> int:
    """The stall count (cycles before the warp may issue its next instruction) of a control word (module docstring)."""
    return (word >> 41) & 0xF


def stall_cycles(body: list[tuple[int, str]], words: dict[int, int]) -> tuple[int, int]:
    """(sum of the stall counts over body, the part after its last MUFU.EX2; 0 without one)."""
    counts = [stall(words[a]) for a, _ in body]
    last = max((i for i, (_, t) in enumerate(body) if opcode(t).startswith("MUFU.EX2")), default=len(body) - 1)
    return sum(counts), sum(counts[last + 1:])


def opcode(instr: str) -> str:
    """The mnemonic with modifiers of one instruction text (predicate dropped)."""
    return _PRED.sub("", instr.strip()).split()[0] if instr.strip() else ""


def op_class(instr: str, modifiers: int | None = None) -> str:
    """Opcode class (module docstring)."""
    parts = opcode(instr).split(".")
    keep = modifiers if modifiers is not None else (1 if parts[0] in _KEEP_FIRST else 0)
    return ".".join(parts[:1 + keep])


def loops(instrs: list[tuple[int, str]], labels: dict[str, int], min_size: int = 1) -> list[list[tuple[int, str]]]:
    """Loop bodies (module docstring) of at least min_size instructions, by address of their first instruction."""
    index = {a: i for i, (a, _) in enumerate(instrs)}
    found = {}
    for i, (addr, text) in enumerate(instrs):
        m = _TARGET.search(text)
        if not m or m.group(1) not in labels or labels[m.group(1)] > addr:
            continue
        start = index[labels[m.group(1)]]
        body = instrs[start:i + 1]
        if len(body) >= min_size and not any(opcode(t) == "EXIT" for _, t in body):
            found[start] = body  # the outermost latch of a start wins (the last one seen)
    return [found[k] for k in sorted(found)]


def drop_cold(body: list[tuple[int, str]], labels: dict[str, int], cold: list[str]) -> list[tuple[int, str]]:
    """body without the instructions that a forward branch to each cold label jumps over (after the branch, before
    the label): the rarely taken path, when the branch skips it."""
    out, skip_until = [], None
    for addr, text in body:
        if skip_until is not None and addr >= skip_until:
            skip_until = None
        if skip_until is None:
            out.append((addr, text))
            m = _TARGET.search(text)
            if m and m.group(1) in cold and labels.get(m.group(1), -1) > addr:
                skip_until = labels[m.group(1)]
    return out


def long_jumps(body: list[tuple[int, str]], labels: dict[str, int], min_len: int) -> list[str]:
    """Labels of the forward branches in body to a label inside it that jump over at least min_len instructions
    (ours: the huge-logit branch of the softmax, ~66 instructions at head_dim 128)."""
    addrs = [a for a, _ in body]
    out = []
    for i, (addr, text) in enumerate(body):
        m = _TARGET.search(text)
        if m and addr < labels.get(m.group(1), -1) <= addrs[-1]:  # a target inside the loop
            skipped = sum(1 for a in addrs[i + 1:] if a < labels[m.group(1)])
            if skipped >= min_len:
                out.append(m.group(1))
    return out


def classes(body: list[tuple[int, str]], modifiers: int | None = None) -> collections.Counter:
    return collections.Counter(op_class(t, modifiers) for _, t in body)


def table(a: collections.Counter, b: collections.Counter, names: tuple[str, str]) -> list[str]:
    """Rows 'class  A  B  B-A', classes by |B - A| then count, then a total row."""
    keys = sorted(set(a) | set(b), key=lambda k: (-abs(b[k] - a[k]), -(a[k] + b[k]), k))
    w = max([len(k) for k in keys] + [5])
    rows = [f"{'class':<{w}} {names[0]:>8} {names[1]:>8} {'B-A':>6}"]
    rows += [f"{k:<{w}} {a[k]:>8} {b[k]:>8} {b[k] - a[k]:>+6}" for k in keys]
    ta, tb = sum(a.values()), sum(b.values())
    rows.append(f"{'TOTAL':<{w}} {ta:>8} {tb:>8} {tb - ta:>+6}")
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("a", help="SASS listing A (e.g. ours)")
    p.add_argument("b", help="SASS listing B (e.g. flash-attn-4)")
    p.add_argument("--min-size", type=int, default=200, help="smallest loop body listed, instructions (200)")
    p.add_argument("--pair", action="append", default=None, metavar="I:J",
                   help="compare loop I of A with loop J of B (repeatable; default: 0:0, 1:1, ...)")
    p.add_argument("--labels", nargs=2, default=("A", "B"), metavar=("NAME_A", "NAME_B"))
    p.add_argument("--modifiers", type=int, default=None, help="keep this many modifiers in every class")
    p.add_argument("--skip-cold-a", action="append", default=[], metavar="LABEL",
                   help="leave out what a forward branch to LABEL jumps over in A (repeatable)")
    p.add_argument("--skip-cold-b", action="append", default=[], metavar="LABEL")
    p.add_argument("--skip-jumps", type=int, default=0, metavar="N",
                   help="in both, leave out every block of >= N instructions that a forward branch jumps over "
                        "(0: none; e.g. 32 drops ours' huge-logit path)")
    p.add_argument("--list", action="store_true", help="print each compared loop's instructions too")
    p.add_argument("--stalls", action="store_true",
                   help="static stall cycles of each compared loop (listings with encodings: sass_dump.py --hex)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.min_size < 1:
        print("sass_diff.py: --min-size must be >= 1", file=sys.stderr)
        return 2
    sides, words = [], []
    for path, cold in ((args.a, args.skip_cold_a), (args.b, args.skip_cold_b)):
        with open(path) as f:
            text = f.read()
        instrs, labels = parse(text)
        words.append(control_words(text))
        if args.stalls and len(words[-1]) < len(instrs):
            print(f"sass_diff.py: --stalls needs a listing with encodings (nvdisasm -hex, sass_dump.py --hex): {path}",
                  file=sys.stderr)
            return 2
        found = [drop_cold(body, labels, cold + (long_jumps(body, labels, args.skip_jumps) if args.skip_jumps else []))
                 for body in loops(instrs, labels, args.min_size)]
        sides.append(found)
    for name, found in zip(args.labels, sides):
        spans = ", ".join(f"{body[0][0]:#x}..{body[-1][0]:#x} ({len(body)})" for body in found) or "none"
        print(f"{name}: loops >= {args.min_size}: {spans}")
    if args.pair:
        try:
            pairs = [tuple(int(x) for x in p.split(":")) for p in args.pair]
        except ValueError:
            print(f"sass_diff.py: --pair must be I:J, got {args.pair}", file=sys.stderr)
            return 2
    else:
        pairs = [(i, i) for i in range(min(len(sides[0]), len(sides[1])))]
    for i, j in pairs:
        if i >= len(sides[0]) or j >= len(sides[1]):
            print(f"sass_diff.py: no loop pair {i}:{j}", file=sys.stderr)
            return 2
        print(f"\nloop {i} of {args.labels[0]} vs loop {j} of {args.labels[1]}")
        if args.list:
            for name, body in ((args.labels[0], sides[0][i]), (args.labels[1], sides[1][j])):
                print("\n".join(f"{name} {a:#06x} {t}" for a, t in body))
        print("\n".join(table(classes(sides[0][i], args.modifiers), classes(sides[1][j], args.modifiers),
                              tuple(args.labels))))
        if args.stalls:
            (ta, ea), (tb, eb) = stall_cycles(sides[0][i], words[0]), stall_cycles(sides[1][j], words[1])
            print(f"stall cycles (static): {args.labels[0]} {ta} (after the last MUFU.EX2 {ea}), "
                  f"{args.labels[1]} {tb} (after the last MUFU.EX2 {eb})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # output piped into head
        sys.exit(0)
