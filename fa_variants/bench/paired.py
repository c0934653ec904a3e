"""Paired A/B timing: resolve 1-2% speed differences between kernels on a power-capped GPU.

Why: timing each entry once per round (a do_bench median, entries one after the other) compares entries measured
at different SM clocks. On an H200 at its 700 W cap the clock moves between ~1500 and ~1800 MHz with each kernel's
power draw, and two timings of the same kernel config differed by up to 6% (bench/NOTES.md, "Session 5
(2026-12-01): outcomes on two H200s").

Protocol (``paired_ab``):

* Every entry is prepared once by the timer (``GraphBurstTimer``: a CUDA graph of as many calls as fill
  ``burst_ms``, so every burst lasts about as long and has no host gaps), then all entries run in turn for
  ``warmup_ms`` (power and clocks reach the capped steady state; these bursts are not used).
* ``rounds`` rounds of ``cycles`` cycles; a cycle times one burst of every entry, back to back with no gap between
  bursts (the timer queues them all, with an event between two bursts); even cycles run the entries in an order
  rotated by (round + cycle // 2), odd cycles the same order reversed (ABC CBA), so that a drift of the clock that
  is linear over the two cycles falls equally on every entry.
* One sample of the speed ratio x over y = (y's time in the two cycles) / (x's time in the same two cycles): > 1
  means x is faster. Its median over all samples of all rounds is the ratio reported; the interval is a two-level
  percentile bootstrap (rounds with replacement, then the samples within each drawn round), ``level`` = 0.95.
* A/A control: the baseline's callable is timed a second time as the entry ``AA`` (its own burst), so every run
  measures how far two identical entries can seem apart. Entries with the same ``key`` (e.g. two names for one
  kernel config) are timed once; their ratio is the A/A control's and is labelled as such.
* Verdict of x against y: "faster" if the interval lies above 1 and the median exceeds 1 by more than the A/A
  band, "slower" symmetrically, else "same" (no difference resolved). A/A band = the largest distance from 1 of
  the A/A interval's ends.

Per burst the timer may also report the SM clock (MHz) and power (W), read by NVML while the burst runs; they are
kept beside the times (``Burst``) and summarised per entry. The module itself is pure (no torch): tests drive it
with a fake timer.
"""
from __future__ import annotations

import dataclasses
import math
import random
import statistics
from typing import Callable, Hashable, Protocol

AA = "AA"  #: name of the A/A control entry (the baseline's callable, timed as a separate entry)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One thing to time: ``fn()`` runs one call (its result ignored). Entries with an equal, non-None ``key``
    (e.g. a frozen kernel config) are the same thing under two names: timed once, reported as an A/A pair."""

    name: str
    fn: Callable[[], object]
    key: Hashable | None = None


@dataclasses.dataclass(frozen=True)
class Burst:
    """One burst of one entry: milliseconds per call, the number of calls, and the mean SM clock (MHz) and power
    (W) seen while it ran (nan if not read)."""

    name: str
    round: int
    cycle: int
    ms: float
    calls: int = 1
    sm_mhz: float = math.nan
    power_w: float = math.nan


class BurstTimer(Protocol):
    """What ``paired_ab`` needs from a timer (``runtime.GraphBurstTimer`` on a GPU, fakes in the tests)."""

    def prepare(self, name: str, fn: Callable[[], object], burst_ms: float) -> str:
        """Get ready to time ``fn`` in bursts of about ``burst_ms`` ms; returns how (e.g. "graph x 7")."""

    def cycle(self, names: list[str]) -> list[tuple[float, int, float, float]]:
        """One burst of each prepared entry in this order, back to back (no gap between them); per burst (ms per
        call, calls, mean SM MHz, mean power W)."""


@dataclasses.dataclass(frozen=True)
class RatioStats:
    """Speed ratio x over y (y's time / x's time, > 1: x faster): median over samples, bootstrap interval
    [lo, hi], the verdict ("faster", "slower", "same"), and ``aa`` True when x and y are the same entry (an A/A
    pair: the numbers are the A/A control's)."""

    x: str
    y: str
    median: float
    lo: float
    hi: float
    verdict: str
    samples: int
    aa: bool = False

    def text(self) -> str:
        tag = " A/A" if self.aa else ""
        return f"{self.median:.3f} [{self.lo:.3f}, {self.hi:.3f}] {self.verdict}{tag}"


def schedule(names: list[str], round_: int, cycle: int) -> list[str]:
    """Order of the entries in one cycle: rotated by round + cycle // 2, reversed on odd cycles (ABC CBA)."""
    if not names:
        raise ValueError("names: empty")
    shift = (round_ + cycle // 2) % len(names)
    order = names[shift:] + names[:shift]
    return order[::-1] if cycle % 2 else order


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) of sorted values, linear between neighbours."""
    if not sorted_values:
        return math.nan
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_median(groups: list[list[float]], level: float = 0.95, resamples: int = 2000,
                     seed: int = 0) -> tuple[float, float, float]:
    """(median, lo, hi): the median of all values and a two-level percentile bootstrap interval of it (groups
    drawn with replacement, then values within each drawn group). Deterministic for a given seed."""
    groups = [g for g in groups if g]
    values = [v for g in groups for v in g]
    if not values:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    meds = []
    for _ in range(resamples):
        draw = []
        for _g in range(len(groups)):
            g = groups[rng.randrange(len(groups))]
            draw.extend(g[rng.randrange(len(g))] for _ in range(len(g)))
        meds.append(statistics.median(draw))
    meds.sort()
    return statistics.median(values), percentile(meds, (1 - level) / 2), percentile(meds, (1 + level) / 2)


def aa_band(aa: RatioStats | None) -> float:
    """How far from 1 two identical entries seemed: max(1 - lo, hi - 1, 0) of the A/A interval (0 without one)."""
    if aa is None or math.isnan(aa.lo):
        return 0.0
    return max(1 - aa.lo, aa.hi - 1, 0.0)


def verdict(median: float, lo: float, hi: float, band: float) -> str:
    """"faster" if [lo, hi] lies above 1 and median - 1 > band, "slower" if below 1 and 1 - median > band,
    else "same" (no difference resolved at this noise)."""
    if lo > 1 and median - 1 > band:
        return "faster"
    if hi < 1 and 1 - median > band:
        return "slower"
    return "same"


@dataclasses.dataclass
class PairedResult:
    """What ``paired_ab`` measured: every burst, the names timed (``timed``: the entries' canonical names and the
    A/A control), ``alias`` (name -> the timed name it shares a key with, itself for the timed ones), ``how``
    (name -> the timer's preparation note)."""

    baseline: str
    timed: list[str]
    alias: dict[str, str]
    bursts: list[Burst]
    how: dict[str, str]
    rounds: int
    cycles: int
    level: float = 0.95
    seed: int = 0
    _cache: dict = dataclasses.field(default_factory=dict, repr=False)

    def samples(self, x: str, y: str) -> list[list[float]]:
        """Per round, the paired samples of y's time / x's time over cycles (2c, 2c + 1)."""
        x, y = self.alias[x], self.alias[y]
        per: dict[tuple[int, int], dict[str, float]] = {}
        for b in self.bursts:
            if b.round >= 0:
                cell = per.setdefault((b.round, b.cycle // 2), {})
                cell[b.name] = cell.get(b.name, 0.0) + b.ms
        out: list[list[float]] = [[] for _ in range(self.rounds)]
        for (r, _pair), cell in sorted(per.items()):
            if x in cell and y in cell and cell[x] > 0:
                out[r].append(cell[y] / cell[x])
        return out

    def _stats(self, x: str, y: str, band: float, aa: bool) -> RatioStats:
        if (x, y) not in self._cache:  # the bootstrap is the slow part: once per pair
            groups = self.samples(x, y)
            self._cache[x, y] = (*bootstrap_median(groups, self.level, seed=self.seed), sum(map(len, groups)))
        med, lo, hi, n = self._cache[x, y]
        return RatioStats(x, y, med, lo, hi, verdict(med, lo, hi, band), n, aa)

    def aa(self) -> RatioStats | None:
        """The A/A control: AA over the baseline, its verdict judged against 1 alone (band 0)."""
        return self._stats(AA, self.baseline, 0.0, True) if AA in self.alias else None

    def median_ratio(self, x: str, y: str) -> float:
        """The median of ``ratio(x, y)`` without its interval (no bootstrap: cheap)."""
        if x == y:
            return 1.0
        if self.alias[x] == self.alias[y]:
            x, y = AA, self.baseline
            if x not in self.alias:
                return 1.0
        values = [v for g in self.samples(x, y) for v in g]
        return statistics.median(values) if values else math.nan

    def ratio(self, x: str, y: str) -> RatioStats:
        """Speed ratio x over y with interval and verdict; for two names of one timed entry, the A/A control's
        numbers (marked aa) under these names (exactly 1 for x == y). KeyError naming an unknown entry."""
        if x not in self.alias or y not in self.alias:
            raise KeyError(f"ratio: unknown entry {x if x not in self.alias else y!r} (known: {sorted(self.alias)})")
        if self.alias[x] == self.alias[y]:
            ctl = self.aa()
            if ctl is None or x == y:
                return RatioStats(x, y, 1.0, 1.0, 1.0, "same", 0, True)
            return dataclasses.replace(ctl, x=x, y=y, verdict="same")
        return self._stats(x, y, aa_band(self.aa()), False)

    def times(self, name: str) -> list[float]:
        """Per round, the median ms per call of the entry's bursts (for TFLOP/s and the round-to-round spread)."""
        name = self.alias[name]
        out = []
        for r in range(self.rounds):
            ms = [b.ms for b in self.bursts if b.round == r and b.name == name]
            out.append(statistics.median(ms) if ms else math.nan)
        return out

    def clocks(self, name: str) -> tuple[float, float]:
        """Mean SM clock (MHz) and power (W) over the entry's measured bursts (nan if not read)."""
        name = self.alias[name]
        got = [b for b in self.bursts if b.round >= 0 and b.name == name]

        def mean(xs):
            xs = [v for v in xs if not math.isnan(v)]
            return sum(xs) / len(xs) if xs else math.nan

        return mean(b.sm_mhz for b in got), mean(b.power_w for b in got)

    def to_dict(self) -> dict:
        return dict(baseline=self.baseline, timed=self.timed, alias=self.alias, how=self.how, rounds=self.rounds,
                    cycles=self.cycles, level=self.level, bursts=[dataclasses.asdict(b) for b in self.bursts])


def canonical_names(entries: list[Entry]) -> dict[str, str]:
    """name -> the first entry's name with the same non-None key (itself otherwise); ValueError on a repeated
    name or the reserved name AA."""
    alias, by_key = {}, {}
    for e in entries:
        if e.name in alias or e.name == AA:
            raise ValueError(f"entries: name {e.name!r} {'repeated' if e.name in alias else 'is reserved'}")
        alias[e.name] = by_key.setdefault(e.key, e.name) if e.key is not None else e.name
    return alias


def paired_ab(entries: list[Entry], baseline: str, timer: BurstTimer, *, rounds: int = 6, cycles: int = 8,
              burst_ms: float = 25.0, warmup_ms: float = 1000.0, control: bool = True, level: float = 0.95,
              seed: int = 0, log: Callable[[str], None] | None = None) -> PairedResult:
    """Time ``entries`` by the paired protocol (module docstring) against ``baseline`` (one of their names).

    rounds >= 1, cycles >= 2 and even (a sample needs a forward and a reversed cycle), burst_ms > 0 (the target
    length of one burst), warmup_ms >= 0 (of bursts before the first measured one, by the timer's own times);
    ``control`` adds the A/A entry (the baseline's fn timed again). Returns a ``PairedResult``; ValueError naming
    the argument on bad input."""
    names = [e.name for e in entries]
    if baseline not in names:
        raise ValueError(f"baseline: {baseline!r} is not an entry ({names})")
    if rounds < 1:
        raise ValueError(f"rounds: must be >= 1, got {rounds}")
    if cycles < 2 or cycles % 2:
        raise ValueError(f"cycles: must be even and >= 2, got {cycles}")
    if not burst_ms > 0 or warmup_ms < 0:
        raise ValueError(f"burst_ms / warmup_ms: must be > 0 / >= 0, got {burst_ms} / {warmup_ms}")
    alias = canonical_names(entries)
    fns = {e.name: e.fn for e in entries if alias[e.name] == e.name}
    base_fn = fns[alias[baseline]]
    if control:
        fns[AA] = base_fn
        alias[AA] = AA
    timed = list(fns)
    how = {name: timer.prepare(name, fn, burst_ms) for name, fn in fns.items()}
    result = PairedResult(alias[baseline], timed, alias, [], how, rounds, cycles, level, seed)
    spent, w = 0.0, 0
    while spent < warmup_ms:  # warm-up bursts, kept with round -1
        before, order = spent, schedule(timed, 0, w)
        for name, (ms, calls, mhz, watts) in zip(order, timer.cycle(order)):
            result.bursts.append(Burst(name, -1, w, ms, calls, mhz, watts))
            spent += ms * calls
        w += 1
        if not spent > before:
            raise ValueError(f"timer: bursts of no time ({spent} ms after {w} warm-up cycles)")
    for r in range(rounds):
        for c in range(cycles):
            order = schedule(timed, r, c)
            for name, (ms, calls, mhz, watts) in zip(order, timer.cycle(order)):
                result.bursts.append(Burst(name, r, c, ms, calls, mhz, watts))
        if log:
            log(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {result.times(n)[r]:.3f} ms" for n in timed))
    return result


def report_lines(result: PairedResult, pairs: list[tuple[str, str]]) -> list[str]:
    """Human-readable lines: the A/A control, then each (x, y) pair's ratio, interval and verdict, then every
    entry's median ms, round-to-round spread and mean clock / power."""
    ctl = result.aa()
    band = aa_band(ctl)
    out = []
    if ctl is not None:
        flag = "" if ctl.lo <= 1 <= ctl.hi else "  (A/A interval excludes 1: by chance 1 run in 20, or an order effect)"
        out.append(f"A/A {AA}/{result.baseline}: {ctl.median:.4f} [{ctl.lo:.4f}, {ctl.hi:.4f}] band {band:.2%} "
                   f"({ctl.samples} samples){flag}")
    for x, y in pairs:
        out.append(f"{x}/{y}: {result.ratio(x, y).text()} (A/A band {band:.2%})")
    for name in result.alias:
        ts = [t for t in result.times(name) if not math.isnan(t)]
        if not ts:
            continue
        med = statistics.median(ts)
        mhz, watts = result.clocks(name)
        same = f" (= {result.alias[name]}: same key, not timed apart)" if result.alias[name] != name else ""
        out.append(f"  {name}: {med:.4f} ms, spread {(max(ts) - min(ts)) / med:.1%}, {mhz:.0f} MHz, {watts:.0f} W, "
                   f"{result.how.get(result.alias[name], '')}{same}")
    return out
