"""Issue 10's speed status, the FP8 part of `fa-variants bench --dtypes e4m3` (``--fp8-status``): per problem
(head_dim, seqlen N, causal; batch * N = 16k tokens, heads * head_dim = 2048) one paired run
(``bench.paired.paired_ab`` with ``runtime.GraphBurstTimer``: warm-up, ``rounds`` rounds with the order rotated,
CUDA-graph bursts back to back, per-round ratios, an A/A control, SM clock and power per entry) of

* ``fp8``: the fa3-fp8 kernel alone (``hopper.fa3_fp8.run_fp8``) on inputs quantised by the default recipe;
* ``fp8_single``: the same kernel with one running accumulator (``SINGLE_ACCUMULATOR``: the two-level cost's
  reference; at head_dim 256 the fastest one measured, with intra-warpgroup overlap, not the serial one that the
  recipe ``FP8Config(two_level=False)`` runs);
* ``quant``: the quantisation pass alone (``fp8.quantize_fp8``, default recipe);
* ``fp8_call``: pass + kernel, as ``fa_variants.attention(q, k, v, backend="fa3-fp8")`` runs them on bf16 inputs;
* ``bf16_fa3``: our bf16 fa3 (``hopper.fa3.run``), the baseline of every ratio;
* ``flash_attn_4``: flash-attn-4 (bf16), the peer.

Printed: one table row per problem (TFLOP/s = 4 B H N^2 D / time, halved when causal; the pass in us; pass + kernel
as TFLOP/s of the same FLOPs; ratios fp8 / bf16 fa3 for the kernel alone and pass + kernel; the two-level cost =
single's speed / the default's - 1), then one PASS / MISS line per target of issue 10 (``TARGETS``) and a sanity line
(every output finite and within ``SANITY_REL_L2`` of bf16 fa3's: a wrong kernel or config, not an accuracy claim;
tests/test_fa3_fp8_gpu.py is the accuracy test). Problems run core first (``order``: the largest N non-causal at every
head_dim, then causal at 128) and, under a time budget, the rest while time is left.

The pure part (``order``, ``summarise``, ``targets``, ``table``) takes numbers, so CPU tests drive it with fake
timings; ``measure`` is the only code that touches the GPU.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable

from fa_variants.bench import paired
from fa_variants.bench.core import HIDDEN, TOKENS, BenchShape, short_error, tflops

HEAD_DIMS = (64, 96, 128, 256)  # fa3-fp8's (hopper.fa3_fp8.HEAD_DIMS; not imported: it loads the DSL)
SEQLENS = (4096, 16384)  # the default when --seqlens is not given: issue 10's "N >= 4k" and its N 16k
FP8, SINGLE, QUANT, CALL, BF16, FA4 = "fp8", "fp8_single", "quant", "fp8_call", "bf16_fa3", "flash_attn_4"
ENTRIES = (FP8, SINGLE, QUANT, CALL, BF16, FA4)
#: one running accumulator per head_dim, as changes to hopper.fa3_fp8.DEFAULT_CONFIGS[head_dim]: the configs
#: scripts/fa3_fp8_speed_ab.py names "single" (64, 128) and "single_overlap" (256, its FP8TURN_VARIANTS: serial
#: lookahead off, intra-warpgroup overlap, one chain), the two-level cost's reference in bench/NOTES.md
SINGLE_ACCUMULATOR: dict[int, dict] = {
    64: dict(two_level=False), 96: dict(two_level=False), 128: dict(two_level=False),
    256: dict(two_level=False, pv_split=1, pv_buffers=1, intra_wg_overlap=True, s_lookahead=False, s_halves=False,
              fused_promote=False, bounded_units=False, reduce_chains=1),
}
SANITY_REL_L2 = 0.1  # fa3-fp8 vs float64 on N(0, 1): 4.7e-2 .. 5.4e-2 (session 10, N 2k); bf16 fa3 ~1e-3


@dataclasses.dataclass(frozen=True)
class Problem(BenchShape):
    """One shape of the project's benchmark (BenchShape's rule: batch * seqlen = 16k tokens, heads * head_dim =
    2048)."""

    head_dim: int
    seqlen: int
    causal: bool

    @property
    def label(self) -> str:
        return f"D={self.head_dim} N={self.seqlen} {'causal' if self.causal else 'non-causal'}"


@dataclasses.dataclass(frozen=True)
class Target:
    """One of issue 10's speed targets: ``what`` (a row's key) compared with ``threshold`` (">=" or "<=") on every
    measured problem that ``applies`` to (head_dim / N / causal; None: any; min_seqlen: N >= it)."""

    text: str
    what: str
    op: str
    threshold: float
    head_dim: int | None = None
    seqlen: int | None = None
    causal: bool | None = None
    min_seqlen: int = 0

    def applies(self, row: dict) -> bool:
        return ((self.head_dim is None or row["head_dim"] == self.head_dim)
                and (self.seqlen is None or row["seqlen"] == self.seqlen)
                and (self.causal is None or row["causal"] == self.causal) and row["seqlen"] >= self.min_seqlen)

    def met(self, value: float) -> bool:
        return value >= self.threshold if self.op == ">=" else value <= self.threshold


TARGETS = (
    Target("kernel alone >= 1100 TFLOP/s at D 256, N 16k (non-causal; an H200 figure)", "fp8_tflops", ">=", 1100.0,
           256, 16384, False),
    Target("kernel alone >= 1.4x bf16 fa3 at D 128", "fp8_over_bf16", ">=", 1.4, 128),
    Target("kernel alone >= 1.3x bf16 fa3 at D 64", "fp8_over_bf16", ">=", 1.3, 64),
    Target("two-level cost <= 5%", "two_level_cost", "<=", 0.05),
    Target("pass + kernel faster than bf16 fa3 for N >= 4k", "call_over_bf16", ">=", 1.0, min_seqlen=4096),
)


# ------------------------------------------------------------------------------------------ the pure part
def problems(head_dims, seqlens, causals) -> list[Problem]:
    """The problems of fa3-fp8's head dims among ``head_dims`` (others dropped), in ``order``."""
    return order([Problem(d, n, c) for d in head_dims if d in HEAD_DIMS for n in seqlens for c in causals])


def order(items: list[Problem]) -> list[Problem]:
    """Core first: the largest N, non-causal, at every head_dim; then the largest N causal at head_dim 128 (or the
    smallest head_dim there is); then the rest, larger N first, non-causal first."""
    if not items:
        return []
    top = max(p.seqlen for p in items)
    dims = sorted({p.head_dim for p in items})
    causal_dim = 128 if 128 in dims else dims[0]

    def key(p: Problem):
        core = p.seqlen == top and (not p.causal or p.head_dim == causal_dim)
        return (not core, -p.seqlen, p.causal, p.head_dim)

    return sorted(dict.fromkeys(items), key=key)


def _ratio(res: paired.PairedResult, x: str, y: str) -> dict | None:
    """x over y (> 1: x faster): median, interval, verdict and the per-round medians; None if either is missing."""
    if x not in res.alias or y not in res.alias:
        return None
    r = res.ratio(x, y)
    per_round = [statistics.median(g) if g else math.nan for g in res.samples(x, y)]
    return dict(median=r.median, lo=r.lo, hi=r.hi, verdict=r.verdict, rounds=per_round)


def summarise(problem: Problem, res: paired.PairedResult, sanity: dict[str, float] | None = None,
              failed: dict[str, str] | None = None) -> dict:
    """The table row of one problem from its paired run: per entry ms (median of per-round medians), TFLOP/s (the
    quantisation pass in us instead), clock and power; the ratios (paired medians of per-cycle ratios) fp8 / bf16
    fa3, pass+kernel / bf16 fa3, fp8 / flash-attn-4, and the two-level cost single / fp8 - 1; ``sanity``: rel-L2
    per output vs bf16 fa3; ``failed``: entry -> why it was not timed. JSON-able."""
    row = dict(head_dim=problem.head_dim, seqlen=problem.seqlen, causal=problem.causal, batch=problem.batch,
               heads=problem.heads, flops=problem.flops, ms={}, clocks={}, failed=dict(failed or {}),
               sanity=dict(sanity or {}))
    for name in ENTRIES:
        if name in res.alias:
            ts = [t for t in res.times(name) if not math.isnan(t)]
            if ts:
                row["ms"][name] = statistics.median(ts)
                row["clocks"][name] = res.clocks(name)
    tf = {n: tflops(problem.flops, ms) for n, ms in row["ms"].items() if n != QUANT}
    row["tflops"] = tf
    row["fp8_tflops"] = tf.get(FP8)
    row["quant_us"] = 1e3 * row["ms"][QUANT] if QUANT in row["ms"] else None
    row["ratios"] = {k: _ratio(res, x, y) for k, (x, y) in
                     dict(fp8_over_bf16=(FP8, BF16), call_over_bf16=(CALL, BF16), fp8_over_fa4=(FP8, FA4),
                          single_over_fp8=(SINGLE, FP8)).items()}
    for key in ("fp8_over_bf16", "call_over_bf16", "fp8_over_fa4"):
        row[key] = row["ratios"][key]["median"] if row["ratios"][key] else None
    single = row["ratios"]["single_over_fp8"]
    row["two_level_cost"] = single["median"] - 1 if single else None
    aa = res.aa()
    row["aa_band"] = paired.aa_band(aa) if aa else None
    return row


def sanity_ok(row: dict) -> bool:
    """Every fa3-fp8 output compared was finite and within SANITY_REL_L2 of bf16 fa3's, and no entry of ours failed
    (flash-attn-4 missing or failing is reported, not counted here)."""
    ours_failed = [n for n in row["failed"] if n != FA4]
    return (not ours_failed and bool(row["sanity"])
            and all(math.isfinite(v) and v <= SANITY_REL_L2 for v in row["sanity"].values()))


def targets(rows: list[dict]) -> list[str]:
    """One line per target: its value on every measured problem it applies to, PASS when all meet it, MISS (how
    many of how many) otherwise, "not measured" when none was."""
    lines = []
    for t in TARGETS:
        got = [(r, r.get(t.what)) for r in rows if t.applies(r) and r.get(t.what) is not None]
        if not got:
            lines.append(f"NOT MEASURED  {t.text}")
            continue
        missed = [r for r, v in got if not t.met(v)]
        shown = ", ".join(f"D{r['head_dim']} N{r['seqlen'] // 1024}k{' c' if r['causal'] else ''} {_fmt(t.what, v)}"
                          for r, v in got)
        verdict = "PASS" if not missed else f"MISS ({len(missed)} of {len(got)})"
        lines.append(f"{verdict:13s} {t.text}: {shown}")
    return lines


def _fmt(what: str, v: float | None) -> str:
    if v is None:
        return "-"
    if what.endswith("tflops"):
        return f"{v:.0f}"
    if what == "two_level_cost":
        return f"{v:+.1%}"
    return f"{v:.2f}x"


_COLUMNS = ("D", "N", "causal", "fp8 kernel", "quant us", "pass+kernel", "bf16 fa3", "flash-attn-4",
            "fp8/bf16", "pass+kernel/bf16", "fp8/fa4", "two-level cost", "A/A band", "MHz fp8/bf16", "sanity")


def table(rows: list[dict]) -> list[str]:
    """Markdown table, one row per problem in (head_dim, N, causal) order; TFLOP/s unless named otherwise."""
    out = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for r in sorted(rows, key=lambda r: (r["head_dim"], r["seqlen"], r["causal"])):
        tf = r["tflops"]
        mhz = "/".join(f"{r['clocks'][n][0]:.0f}" if n in r["clocks"] and not math.isnan(r["clocks"][n][0]) else "-"
                       for n in (FP8, BF16))
        worst = max(r["sanity"].values(), default=math.nan)
        sanity = ("ok" if sanity_ok(r) else "BAD") + (f" {worst:.1e}" if not math.isnan(worst) else "")
        cells = [str(r["head_dim"]), str(r["seqlen"]), str(int(r["causal"])), _fmt("tflops", tf.get(FP8)),
                 "-" if r["quant_us"] is None else f"{r['quant_us']:.1f}", _fmt("tflops", tf.get(CALL)),
                 _fmt("tflops", tf.get(BF16)), _fmt("tflops", tf.get(FA4)), _fmt("x", r["fp8_over_bf16"]),
                 _fmt("x", r["call_over_bf16"]), _fmt("x", r["fp8_over_fa4"]),
                 _fmt("two_level_cost", r["two_level_cost"]),
                 "-" if r["aa_band"] is None else f"{r['aa_band']:.1%}", mhz, sanity]
        out.append("| " + " | ".join(cells) + " |")
    return out


def round_lines(rows: list[dict]) -> list[str]:
    """Per problem, the per-round medians of fp8 / bf16 fa3 and of single / fp8 (the protocol's per-round ratios)."""
    out = []
    for r in sorted(rows, key=lambda r: (r["head_dim"], r["seqlen"], r["causal"])):
        parts = []
        for key in ("fp8_over_bf16", "single_over_fp8"):
            got = r["ratios"].get(key)
            if got:
                parts.append(f"{key} {got['median']:.3f} [{got['lo']:.3f}, {got['hi']:.3f}] rounds "
                             + " ".join(f"{v:.3f}" for v in got["rounds"]))
        if r["failed"]:
            parts.append("not timed: " + "; ".join(f"{k}: {v}" for k, v in r["failed"].items()))
        out.append(f"D{r['head_dim']} N{r['seqlen']} causal={int(r['causal'])}: " + " | ".join(parts))
    return out


def report(rows: list[dict], skipped: list[Problem], settings: dict, gpu: str | None = None) -> str:
    """The whole text: heading with the GPU (``gpu``: its name) and the protocol, the table, the targets (issue
    10's, set on an H200: the absolute TFLOP/s one is that card's), the sanity verdict, per-round ratios."""
    lines = ["# fa3-fp8 status (issue 10): kernel alone, quantisation pass, pass + kernel, beside bf16 fa3 and "
             "flash-attn-4", ""] + ([f"GPU: {gpu}", ""] if gpu else []) + [
             f"B*N = {TOKENS}, H*D = {HIDDEN}; paired protocol: {settings.get('rounds')} rounds x "
             f"{settings.get('cycles')} cycles, bursts of {settings.get('burst_ms')} ms, warm-up "
             f"{settings.get('warmup_ms')} ms, order rotated per round; values are medians; ratios > 1: fp8 faster. "
             "TFLOP/s unless named (pass+kernel: the same FLOPs over the pass + kernel time).", ""]
    lines += table(rows) + ["", "## issue 10 targets", ""] + [f"- {line}" for line in targets(rows)]
    bad = [r for r in rows if not sanity_ok(r)]
    lines += ["", f"sanity (outputs finite, rel-L2 vs bf16 fa3 <= {SANITY_REL_L2:g}, nothing failed): "
              + ("ok" if not bad else "BAD at " + ", ".join(f"D{r['head_dim']} N{r['seqlen']} c{int(r['causal'])}"
                                                            for r in bad))]
    if skipped:
        lines.append("not run (time budget): " + ", ".join(p.label for p in skipped))
    lines += ["", "## per-round ratios (median [95% interval] rounds ...)", ""] + [f"- {x}" for x in round_lines(rows)]
    return "\n".join(lines) + "\n"


def failed_row(problem: Problem, error: str) -> dict:
    """The row of a problem whose measurement raised: nothing measured, ``failed`` = {"problem": error} (so its
    sanity is not ok)."""
    return dict(head_dim=problem.head_dim, seqlen=problem.seqlen, causal=problem.causal, batch=problem.batch,
                heads=problem.heads, flops=problem.flops, ms={}, clocks={}, failed={"problem": error}, sanity={},
                tflops={}, fp8_tflops=None, quant_us=None, ratios={}, fp8_over_bf16=None, call_over_bf16=None,
                fp8_over_fa4=None, two_level_cost=None, aa_band=None)


def run(items: list[Problem], measure_one: Callable[[Problem], dict], budget_s: float = 0.0,
        log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic
        ) -> tuple[list[dict], list[Problem]]:
    """(rows, skipped): ``measure_one`` on each problem in order (one that raises gets ``failed_row``); with
    ``budget_s`` > 0 a problem is started only while the time spent plus the longest problem so far stays within
    it (the rest are skipped, reported)."""
    rows, skipped, t0, longest = [], [], clock(), 0.0
    for p in items:
        spent = clock() - t0
        if budget_s > 0 and rows and spent + longest > budget_s:
            skipped.append(p)
            continue
        start = clock()
        try:
            rows.append(measure_one(p))
        except Exception as exc:  # noqa: BLE001 - reported as the problem's row; the others still run
            rows.append(failed_row(p, f"{type(exc).__name__}: {short_error(exc)[:200]}"))
        longest = max(longest, clock() - start)
        log(f"fp8 status {p.label}: " + " ".join(f"{n} {v:.0f}" for n, v in rows[-1]["tflops"].items())
            + (f" quant {rows[-1]['quant_us']:.1f} us" if rows[-1]["quant_us"] is not None else "")
            + f" ({clock() - start:.1f} s)")
    return rows, skipped


# ------------------------------------------------------------------------------------------------ the GPU
def entry_fns(problem: Problem, seed: int = 0) -> tuple[dict[str, Callable], dict[str, str]]:
    """name -> a call of that entry on this problem's inputs (bf16 q, k, v ~ N(0, 1), seeded; the kernel entries on
    their default-recipe quantisation), returning its output; and name -> why an entry cannot run here."""
    import torch

    import fa_variants
    from fa_variants.fp8 import quantize_fp8
    from fa_variants.hopper import fa3, fa3_fp8

    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(problem.batch, problem.seqlen, problem.heads, problem.head_dim, device="cuda",
                           generator=g, dtype=torch.bfloat16) for _ in range(3))
    inputs = quantize_fp8(q, k, v)
    single = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[problem.head_dim], **SINGLE_ACCUMULATOR[problem.head_dim])
    scale, causal = problem.head_dim ** -0.5, problem.causal
    fns = {FP8: lambda: fa3_fp8.run_fp8(inputs, causal=causal)[0],
           SINGLE: lambda: fa3_fp8.run_fp8(inputs, causal=causal, config=single)[0],
           QUANT: lambda: quantize_fp8(q, k, v),
           CALL: lambda: fa_variants.attention(q, k, v, causal=causal, backend="fa3-fp8"),
           BF16: lambda: fa3.run(q, k, v, causal=causal, softmax_scale=scale)[0]}
    failed = {}
    try:  # flash-attn-4: the CuTe DSL FlashAttention (Dao-AILab/flash-attention, flash_attn/cute)
        from flash_attn.cute.interface import flash_attn_func

        fns[FA4] = lambda: _first(flash_attn_func(q, k, v, causal=causal))
    except Exception as exc:  # noqa: BLE001 - not installed here
        failed[FA4] = f"not importable ({type(exc).__name__})"
    return fns, failed


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def first_outputs(fns: dict[str, Callable]) -> tuple[dict, dict[str, str]]:
    """Each entry called once (its compile or load included): name -> output tensor, and name -> the error of
    those that failed (removed from ``fns``)."""
    outs, failed = {}, {}
    for name in list(fns):
        try:
            outs[name] = fns[name]()
        except Exception as exc:  # noqa: BLE001 - reported in the table, the other entries still run
            failed[name] = f"{type(exc).__name__}: {short_error(exc)[:120]}"
            del fns[name]
    return outs, failed


def sanity(outs: dict) -> dict[str, float]:
    """rel-L2 of each fa3-fp8 output (kernel, single accumulator, pass + kernel) vs bf16 fa3's; inf when not finite."""
    from fa_variants.reference import rel_l2

    ref = outs.get(BF16)
    if ref is None:
        return {}
    got = {}
    for name in (FP8, SINGLE, CALL):
        if name in outs:
            o = outs[name]
            got[name] = float(rel_l2(o, ref)) if bool(o.isfinite().all()) else math.inf
    return got


def measure(problem: Problem, rounds: int = 6, cycles: int = 4, burst_ms: float = 10.0,
            warmup_ms: float = 500.0, timer: paired.BurstTimer | None = None) -> dict:
    """One problem on the GPU: entries built and called once (outputs checked), then ``paired.paired_ab`` against
    bf16 fa3 with the A/A control; the row of ``summarise``. Entry functions return nothing while timed (the CUDA
    graph of a burst then keeps no outputs alive)."""
    import torch

    from fa_variants.bench.runtime import GraphBurstTimer

    fns, failed = entry_fns(problem)
    outs, more = first_outputs(fns)
    failed.update(more)
    checks = sanity(outs)
    del outs
    if BF16 not in fns:
        raise RuntimeError(f"{problem.label}: bf16 fa3 did not run ({failed.get(BF16)})")
    entries = [paired.Entry(name, lambda f=fn: (f(), None)[1]) for name, fn in fns.items()]
    res = paired.paired_ab(entries, BF16, timer or GraphBurstTimer(), rounds=rounds, cycles=cycles,
                           burst_ms=burst_ms, warmup_ms=warmup_ms)
    row = summarise(problem, res, checks, failed)
    del fns, entries, res
    torch.cuda.empty_cache()
    return row
