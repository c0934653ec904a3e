"""fa_variants.bench.paired (the paired A/B protocol) on the CPU, with fake timers: a GPU whose clock wanders by
+-6% over time (as at an H200's power cap), per-burst noise, and entries whose true times are known."""
import math
import random
import sys
import types

import pytest
from helpers import load_script

from fa_variants.bench import paired


class FakeGpu:
    """A BurstTimer: an entry's fn() returns its true ms per call; a burst takes that times a clock factor that
    wanders slowly with the simulated time (amplitude `wander`, period `period_ms`), times (1 + noise) per burst."""

    def __init__(self, wander=0.06, period_ms=900.0, noise=0.01, seed=0):
        self.wander, self.period_ms, self.noise = wander, period_ms, noise
        self.rng, self.now, self.true_ms, self.calls, self.prepared = random.Random(seed), 0.0, {}, {}, []

    def prepare(self, name, fn, burst_ms):
        self.prepared.append(name)
        self.true_ms[name] = fn()
        self.calls[name] = max(1, round(burst_ms / self.true_ms[name]))
        return f"fake x {self.calls[name]}"

    def factor(self):
        return 1 + self.wander * math.sin(2 * math.pi * self.now / self.period_ms)

    def burst(self, name):
        calls = self.calls[name]
        ms = self.true_ms[name] * self.factor() * (1 + self.rng.gauss(0, self.noise))
        self.now += ms * calls
        return ms, calls, 1800 / self.factor(), 700.0

    def cycle(self, names):
        return [self.burst(n) for n in names]


def entries(true_ms, keys=None):
    """Entries name -> fn returning true_ms[name] (the fake's time per call), keys from `keys`."""
    keys = keys or {}
    return [paired.Entry(n, lambda t=t: t, keys.get(n)) for n, t in true_ms.items()]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_percent_slower_is_resolved_and_aa_is_equal(seed):
    """B 2% slower than A (and C = A under another key) under +-6% clock wander and 1% noise per burst: B/A is
    called "slower" (A/B "faster") with an interval around 0.98 that excludes 1, C/A "same", and the automatic A/A
    control's interval holds 1 and is narrower than the 2% effect."""
    gpu = FakeGpu(seed=seed)
    res = paired.paired_ab(entries({"A": 1.0, "B": 1.02, "C": 1.0}), "A", gpu, rounds=6, cycles=8, warmup_ms=200,
                           seed=seed)
    b = res.ratio("B", "A")
    assert b.verdict == "slower" and b.lo < 1 / 1.02 < b.hi and b.hi < 1, b
    assert res.ratio("A", "B").verdict == "faster"
    assert res.ratio("C", "A").verdict == "same" and not res.ratio("C", "A").aa
    aa = res.aa()
    assert aa.lo <= 1 <= aa.hi and paired.aa_band(aa) < 0.01, aa
    assert gpu.prepared == ["A", "B", "C", paired.AA]
    lines = paired.report_lines(res, [("B", "A"), ("C", "A")])
    assert lines[0].startswith("A/A AA/A:") and "excludes 1" not in lines[0]
    assert lines[1].startswith("B/A: 0.9") and "slower" in lines[1] and abs(b.median - 1 / 1.02) < 0.005


def test_unpaired_timing_of_the_same_fake_gpu_is_not_resolved():
    """The reason for pairing: the same wander timed one entry per stretch of time (rounds protocol) moves a ratio
    by more than the 2% effect, while paired bursts cancel it (the interval above stays within +-1%)."""
    gpu = FakeGpu(noise=0.0, wander=0.06, period_ms=900.0)
    gpu.true_ms, gpu.calls = {"A": 1.0, "B": 1.0}, {"A": 200, "B": 200}  # 200 ms per entry and round, in turn
    ratios = []
    for _ in range(6):
        a, b = gpu.burst("A")[0], gpu.burst("B")[0]
        ratios.append(a / b)
    assert max(ratios) - min(ratios) > 0.04


def test_identical_keys_are_timed_once_and_reported_as_aa():
    """Two names of one config (old and new at head_dim 256): `new` is not timed; new/old is the A/A control's
    numbers, marked aa, verdict "same"; the other entry's ratios to either name are equal."""
    gpu = FakeGpu(seed=3)
    res = paired.paired_ab(entries({"old": 1.0, "new": 1.0, "fa4": 0.97}, keys={"old": "cfg", "new": "cfg"}), "old",
                           gpu,
                           rounds=4, cycles=4, warmup_ms=50)
    assert gpu.prepared == ["old", "fa4", paired.AA] and res.alias["new"] == "old"
    r = res.ratio("new", "old")
    assert r.aa and r.verdict == "same" and (r.median, r.lo, r.hi) == (res.aa().median, res.aa().lo, res.aa().hi)
    assert res.median_ratio("new", "old") == res.aa().median and res.median_ratio("old", "old") == 1.0
    assert res.ratio("fa4", "new").median == res.ratio("fa4", "old").median > 1.02
    assert res.ratio("fa4", "old").verdict == "faster" and res.times("new") == res.times("old")
    assert any("same key, not timed apart" in line for line in paired.report_lines(res, [("new", "old")]))


def test_schedule_balances_positions():
    """Over a round's cycle pairs every entry sits at every position equally often, and each odd cycle is the
    previous one reversed (ABC CBA: a linear drift over the pair falls equally on all entries)."""
    names = ["a", "b", "c"]
    seen = {n: [0, 0, 0] for n in names}
    for c in range(6):
        order = paired.schedule(names, 1, c)
        assert sorted(order) == names
        if c % 2:
            assert order == paired.schedule(names, 1, c - 1)[::-1]
        for pos, n in enumerate(order):
            seen[n][pos] += 1
    assert all(v == [2, 2, 2] for v in seen.values())


@pytest.mark.parametrize("median, lo, hi, band, want", [
    (1.02, 1.01, 1.03, 0.005, "faster"), (0.98, 0.97, 0.99, 0.005, "slower"),
    (1.02, 0.99, 1.05, 0.0, "same"),  # the interval holds 1
    (1.008, 1.004, 1.012, 0.01, "same"),  # excludes 1, but within the A/A band
])
def test_verdict(median, lo, hi, band, want):
    assert paired.verdict(median, lo, hi, band) == want


def test_bootstrap_is_deterministic_and_covers_the_median():
    rng = random.Random(5)
    groups = [[1 + rng.gauss(0, 0.01) for _ in range(4)] for _ in range(6)]
    got = paired.bootstrap_median(groups, seed=1)
    assert got == paired.bootstrap_median(groups, seed=1) and got[1] < got[0] < got[2] and got[2] - got[1] < 0.03
    assert all(math.isnan(x) for x in paired.bootstrap_median([[], []]))


@pytest.mark.parametrize("kwargs, match", [
    (dict(baseline="Z"), "baseline"), (dict(rounds=0), "rounds"), (dict(cycles=3), "cycles"),
    (dict(burst_ms=0), "burst_ms"), (dict(names=("A", "A")), "repeated"), (dict(names=("A", "AA")), "reserved"),
])
def test_bad_arguments(kwargs, match):
    names = kwargs.pop("names", ("A", "B"))
    baseline = kwargs.pop("baseline", "A")
    with pytest.raises(ValueError, match=match):
        paired.paired_ab([paired.Entry(n, lambda: 1.0) for n in names], baseline, FakeGpu(), **kwargs)


def test_fa3_speed_ab_paired_row_and_summary():
    """scripts/fa3_speed_ab.py's paired protocol on a fake timer (no GPU): where old and new share a config (as
    head_dim 256's did until session 9's convert_pairs flip: the keys are given equal here), `new` is reported as
    the A/A pair; the SUMMARY line keeps its leading columns and adds the A/A interval and each ratio's interval and
    verdict."""
    ab = load_script("fa3_speed_ab")

    class Args:
        rounds, cycles, burst_ms, warmup_ms = 4, 4, 20.0, 50

    fns = {"old": lambda: 1.0, "new": lambda: 1.0, "fa4-256": lambda: 0.97, "flash-attn-4": lambda: 0.95}
    keys = {"old": ab.variant_config("new", 256), "new": ab.variant_config("new", 256),  # old = new (see above)
            "fa4-256": ab.variant_config("fa4-256", 256), "flash-attn-4": None}
    gpu = FakeGpu(seed=4)
    shape = ab.plan((256,), (16384,), (False,), ["old", "new", "fa4-256"])[0]
    row = ab.time_shape(shape, "paired", fns, keys, Args, "bf16", {}, {}, timer=gpu)
    assert row["same_config"] == {"new": "old"} and row["intervals"]["new/old"]["aa"]
    assert row["intervals"]["fa4-256/new"]["verdict"] == "faster"
    assert row["intervals"]["new/flash-attn-4"]["verdict"] == "slower"
    head, line = ab.summary_lines([row])
    assert line.startswith(f"SUMMARY D=256 N=16384 full: {row['ratio_to_old']['new']:.3f} ")
    assert " | A/A [" in line and "new/old " in line and "same A/A" in line and "fa4-256/new 1.0" in line
    assert "[new = old: same config]" in ab._line(row)


def test_graph_burst_timer_cycle_files_clock_reads_under_the_running_burst(monkeypatch):
    """runtime.GraphBurstTimer.cycle on a simulated stream (fake CUDA events and clock, no GPU): the bursts are
    queued back to back, each one's ms per call is its span between two events, and every clock read lands on the
    burst that was running when it was taken."""
    from types import SimpleNamespace

    from fa_variants.bench import runtime

    sim = SimpleNamespace(host=0.0, queue=0.0)  # ms: the host's time, the end of the work queued so far

    class Event:
        def __init__(self, enable_timing=True):
            self.t = None

        def record(self):
            self.t = max(sim.queue, sim.host)

        def query(self):
            return sim.host >= self.t

        def synchronize(self):
            sim.host = max(sim.host, self.t)

        def elapsed_time(self, other):
            return other.t - self.t

    def work(ms):
        def run():
            sim.queue = max(sim.queue, sim.host) + ms
        return run

    spans = {"a": 10.0, "b": 30.0}  # ms of one burst, queued at host time 0: a runs over [0, 10), b over [10, 40)
    windows = {"a": (0.0, 10.0), "b": (10.0, 40.0)}

    def read():  # the running burst's "clock": 1000 + its span
        return 1000 + next(spans[n] for n, (s, e) in windows.items() if s <= sim.host < e), 700.0

    clock = SimpleNamespace(read=read)
    monkeypatch.setattr(runtime.time, "sleep", lambda s: setattr(sim, "host", sim.host + s * 1e3))
    timer = runtime.GraphBurstTimer.__new__(runtime.GraphBurstTimer)
    timer.torch, timer.clock = SimpleNamespace(cuda=SimpleNamespace(Event=Event)), clock
    timer._runs = {"a": (work(spans["a"]), 5), "b": (work(spans["b"]), 3)}
    (ms_a, calls_a, mhz_a, w_a), (ms_b, calls_b, mhz_b, _) = timer.cycle(["a", "b"])
    assert (ms_a, calls_a, ms_b, calls_b) == (2.0, 5, 10.0, 3)
    assert (mhz_a, mhz_b, w_a) == (1010.0, 1030.0, 700.0)


def test_fa3_speed_ab_protocol_lines():
    """scripts/fa3_speed_ab.py --protocol rounds,paired,...: one PROTOCOL line per shape and protocol with new/old
    and new/fa4 of every repeat, their range, and for paired the A/A bands and new/old verdicts."""
    ab = load_script("fa3_speed_ab")

    class Args:
        rounds, cycles, burst_ms, warmup_ms = 3, 2, 20.0, 0

    fns = {"old": lambda: 1.0, "new": lambda: 0.98, "flash-attn-4": lambda: 0.95}
    keys = {"old": ab.variant_config("old", 128), "new": ab.variant_config("new", 128), "flash-attn-4": None}
    shape = ab.plan((128,), (16384,), (False,), ["old", "new"])[0]
    rows = [ab.time_shape(shape, "paired", fns, keys, Args, "bf16", {}, {}, timer=FakeGpu(seed=s)) for s in (1, 2)]
    rows.insert(1, dict(shape, protocol="rounds", ratio_to_old={"new": 1.05}, ratio_new_to={"flash-attn-4": 0.9}))
    head, rounds_line, paired_line = ab.protocol_lines([rows[1], rows[0], rows[2]])
    assert rounds_line == "PROTOCOL D=128 N=16384 full rounds: 1.050 (0.000) | 0.900 (0.000)"
    new_old = [r["ratio_to_old"]["new"] for r in (rows[0], rows[2])]
    assert paired_line.startswith(f"PROTOCOL D=128 N=16384 full paired: {new_old[0]:.3f} {new_old[1]:.3f} (")
    assert paired_line.endswith("faster faster") and all(1.005 < x < 1.04 for x in new_old)


def test_fa3_speed_ab_rounds_row(monkeypatch):
    """scripts/fa3_speed_ab.py --protocol rounds (the protocol before) still makes its row (do_bench faked: each
    entry's fn returns its ms): per-round ratios, the equal configs named (old's key given equal to new's), no
    paired columns."""
    # a stand-in triton.testing (the CPU build of torch comes without triton): the script imports do_bench at call time
    testing = types.ModuleType("triton.testing")
    testing.do_bench = lambda fn, warmup, rep, return_mode="mean": fn()
    triton = types.ModuleType("triton")
    triton.testing = testing
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.testing", testing)

    ab = load_script("fa3_speed_ab")

    class Args:
        rounds, warmup_ms, rep_ms = 3, None, 40

    fns = {"old": lambda: 1.0, "new": lambda: 1.0, "flash-attn-4": lambda: 0.9}
    keys = {"old": ab.variant_config("new", 256), "new": ab.variant_config("new", 256), "flash-attn-4": None}
    shape = ab.plan((256,), (16384,), (False,), ["old", "new"])[0]
    row = ab.time_shape(shape, "rounds", fns, keys, Args, "bf16", {}, {"old": 0.0, "new": 0.0})
    assert row["ratio_to_old"]["new"] == 1.0 and row["ratio_new_to"]["flash-attn-4"] == 0.9
    assert row["same_config"] == {"new": "old"} and "aa" not in row and row["times_ms"]["old"] == [1.0] * 3
    assert ab.summary_lines([row])[1] == "SUMMARY D=256 N=16384 full: 1.000 0.900 nan |  | protocol rounds"


def test_graph_burst_timer_eager_estimate_is_gpu_time(monkeypatch):
    """GraphBurstTimer._eager_ms queues a GPU busy-wait (torch.cuda._sleep) before its first event, so that a call
    whose host path (40 us) is longer than its GPU work (5 us) is timed by its GPU work: simulated stream."""
    from types import SimpleNamespace

    from fa_variants.bench import runtime

    sim = SimpleNamespace(host=0.0, queue=0.0)  # ms

    class Event:
        def __init__(self, enable_timing=True):
            self.t = None

        def record(self):
            self.t = max(sim.queue, sim.host)

        def synchronize(self):
            sim.host = max(sim.host, self.t)

        def elapsed_time(self, other):
            return other.t - self.t

    def call():  # 40 us on the host, then 5 us of GPU work queued
        sim.host += 0.040
        sim.queue = max(sim.queue, sim.host) + 0.005

    def sleep(cycles):  # ~1 ms of GPU busy-wait
        sim.queue = max(sim.queue, sim.host) + cycles / 2e6

    timer = runtime.GraphBurstTimer.__new__(runtime.GraphBurstTimer)
    timer.torch = SimpleNamespace(cuda=SimpleNamespace(Event=Event, _sleep=sleep))
    assert timer._eager_ms(call, 3) == pytest.approx(0.005)
    timer.torch = SimpleNamespace(cuda=SimpleNamespace(Event=Event))  # no _sleep: the host-bound time as before
    assert timer._eager_ms(call, 3) == pytest.approx(0.040, rel=0.2)
