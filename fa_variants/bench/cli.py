"""Arguments, plan and progress bar of `fa-variants bench`, and `run_cli` tying the parts together."""
from __future__ import annotations

import argparse
import datetime as _dt
import re
import shlex
import sys
from pathlib import Path
from typing import Callable

from fa_variants.bench import compare as bench_compare
from fa_variants.bench import report as bench_report
from fa_variants.bench.core import HIDDEN, TOKENS, Case, Plan, memory_sweep, sweep
from fa_variants.bench.runtime import GpuRuntime, build_impls, versions
from fa_variants.cli import (nonnegative_float, nonnegative_int, not_applicable, positive_float, positive_int,
                             replaced_input)

OURS = ("fa1", "fa2", "fa3", "fa3-fp8")
PEERS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math", "flash-attn-4")
DTYPES = ("bf16", "fp16", "e4m3")
HEAD_DIMS = (64, 128, 256)
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
MEMORY_SEQLENS = tuple(1024 * 2**i for i in range(8))  # 1k .. 128k, batch 1
QUICK = dict(head_dims=(64, 128), seqlens=(1024, 4096, 16384), dtypes=("bf16",), warmup_ms=10, rep_ms=40,
             memory_seqlens=(1024, 2048, 4096, 8192, 16384))
FULL = dict(head_dims=HEAD_DIMS, seqlens=SEQLENS, dtypes=("bf16", "fp16"), warmup_ms=25, rep_ms=100,
            memory_seqlens=MEMORY_SEQLENS)


def make_runtime(plan: Plan) -> GpuRuntime:
    """The GPU runtime for a plan (a seam: tests put a synthetic one here)."""
    return GpuRuntime(plan)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------- progress
class Progress:
    """A progress bar (rich, else tqdm, else none) whose log lines print above it."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.enabled, self._bar, self._task, self._kind = total, enabled, None, None, None

    def __enter__(self):
        if not self.enabled:
            return self
        try:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, \
                TimeElapsedColumn

            from fa_variants.cli import console

            self._bar = RichProgress(TextColumn("{task.description:40s}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=console())  # stdout, in cli.console's width
            self._bar.__enter__()
            self._task, self._kind = self._bar.add_task("bench", total=self.total), "rich"
        except ImportError:
            try:
                from tqdm import tqdm

                self._bar, self._kind = tqdm(total=self.total), "tqdm"
            except ImportError:
                self._bar = None
        return self

    def __exit__(self, *exc):
        if self._kind == "rich":
            self._bar.__exit__(*exc)
        elif self._kind == "tqdm":
            self._bar.close()

    def step(self, desc: str) -> None:
        if self._kind == "rich":
            self._bar.update(self._task, advance=1, description=desc[:40])
        elif self._kind == "tqdm":
            self._bar.set_description(desc[:40], refresh=False)
            self._bar.update(1)

    def log(self, msg: str) -> None:
        if self._kind == "rich":
            self._bar.console.print(msg, markup=False, highlight=False, soft_wrap=True)
        elif self._kind == "tqdm":
            self._bar.write(msg)
        else:
            print(msg, flush=True)


# --------------------------------------------------------------------------------------------------- CLI
def _list_type(kind: type, allowed: tuple | None = None, check: Callable | None = None) -> Callable:
    """argparse type for a comma-separated list; every element converted, checked, duplicates dropped."""

    def parse(text: str) -> tuple:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        out = []
        for item in items:
            try:
                value = kind(item)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{item!r} is not a{'n' if kind is int else ''} {kind.__name__}")
            if allowed is not None and value not in allowed:
                raise argparse.ArgumentTypeError(f"invalid choice {item!r} (choose from {', '.join(map(str, allowed))})")
            problem = check(value) if check else None
            if problem:
                raise argparse.ArgumentTypeError(f"{item!r}: {problem}")
            out.append(value)
        return tuple(dict.fromkeys(out))

    return parse


def _check_head_dim(d: int) -> str | None:
    if d <= 0 or d > 256 or d % 8 or HIDDEN % d:
        return f"head_dim must be a multiple of 8 in 8..256 that divides {HIDDEN} (num_heads * head_dim)"
    return None


def _check_seqlen(n: int) -> str | None:
    return None if 1 <= n <= 1 << 20 else "seqlen must be in 1..1048576"


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = ("examples:\n  fa-variants bench --quick\n  fa-variants bench --backends fa2 --peers sdpa-flash "
                "--head-dims 128 --causal false\n  fa-variants bench --report-from results/X/bench.json")
    p.add_argument("--quick", action="store_true",
                   help="short run: head dims 64,128; seqlens 1k,4k,16k; bf16; shorter timing; memory to 16k")
    g = p.add_argument_group("what to run")
    g.add_argument("--backends", type=_list_type(str, OURS), metavar="LIST",
                   help=f"our backends, comma-separated (default: all that this GPU can run; {', '.join(OURS)})")
    g.add_argument("--peers", type=_list_type(str, PEERS), metavar="LIST",
                   help=f"peers, comma-separated (default: all importable; {', '.join(PEERS)})")
    only = g.add_mutually_exclusive_group()
    only.add_argument("--ours-only", action="store_true", help="no peers (no ratio columns)")
    only.add_argument("--peers-only", action="store_true", help="no backends of ours")
    g.add_argument("--head-dims", type=_list_type(int, check=_check_head_dim), metavar="LIST",
                   help="head dims (default 64,128,256)")
    g.add_argument("--seqlens", type=_list_type(int, check=_check_seqlen), metavar="LIST",
                   help="sequence lengths; batch = max(1, 16384 // seqlen) (default 512,...,16384)")
    g.add_argument("--causal", choices=("true", "false", "both"), default="both", help="default both")
    g.add_argument("--dtypes", type=_list_type(str, DTYPES), metavar="LIST",
                   help="input dtypes: bf16, fp16, e4m3 (fp8, for fa3-fp8) (default bf16,fp16)")
    m = p.add_argument_group("memory table")
    m.add_argument("--memory-seqlens", type=_list_type(int, check=_check_seqlen), metavar="LIST",
                   help="seqlens of the memory table, batch 1 (default 1k..128k doubling)")
    mem = m.add_mutually_exclusive_group()
    mem.add_argument("--no-memory", action="store_true", help="skip the memory table")
    mem.add_argument("--memory-only", action="store_true", help="only the memory table (no timing)")
    t = p.add_argument_group("timing and output")
    t.add_argument("--warmup", type=positive_float, metavar="MS", help="do_bench warm-up in ms (default 25, quick 10)")
    t.add_argument("--rep", type=positive_float, metavar="MS", help="do_bench repeat time in ms (default 100, quick 40)")
    t.add_argument("--input-sets", type=nonnegative_int, default=0, metavar="N",
                   help="input sets rotated between calls (default: enough to exceed 2x the L2 cache)")
    t.add_argument("--out", metavar="DIR", help="results folder (default results/bench-<gpu>-<date>)")
    t.add_argument("--no-charts", action="store_true", help="markdown and JSON only")
    t.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    t.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU needed)")
    t.add_argument("--report-from", metavar="JSON", nargs="+",
                   help="rebuild markdown and charts from saved bench.json files, merged into one report "
                        "(no GPU needed; --out defaults to the first file's folder, and a merge of several must not "
                        "go to the folder of one of them)")
    c = p.add_argument_group("regression check")
    c.add_argument("--compare", metavar="JSON",
                   help="a saved bench.json: flag every case of ours more than --threshold slower than there "
                        "(writes compare.md; exit status 1 on a regression). With --report-from: no GPU needed")
    c.add_argument("--threshold", type=float, default=None, metavar="PCT",
                   help=f"slowdown in percent that --compare flags (default {100 * bench_compare.DEFAULT_THRESHOLD:g}; "
                        "only with --compare)")
    f = p.add_argument_group("fp8 status (issue 10; fa_variants.bench.fp8status)")
    f.add_argument("--fp8-status", choices=("auto", "off", "only"), default="auto",
                   help="issue 10's table (fa3-fp8 kernel alone, quantisation pass, pass + kernel, single accumulator, "
                        "bf16 fa3, flash-attn-4; paired rounds; PASS/MISS per target): auto = after the sweep when "
                        "--dtypes has e4m3; only = that table alone (no sweep, no memory table). Seqlens default "
                        "4096,16384 there")
    f.add_argument("--fp8-rounds", type=positive_int, default=6, metavar="N",
                   help="rounds of the paired run (default 6)")
    f.add_argument("--fp8-budget", type=nonnegative_float, default=0.0, metavar="S",
                   help="seconds of measuring after which no new problem starts (core problems first; 0: none)")
    from fa_variants.bench import decode  # stdlib-only at import

    decode.configure_parser(p)


def make_plan(args: argparse.Namespace) -> Plan:
    """Cases in table order (dtype, head_dim, causal, seqlen) and settings from the arguments; explicit
    filters win over --quick's defaults."""
    base = QUICK if args.quick else FULL
    head_dims = list(args.head_dims or base["head_dims"])
    seqlens = sorted(args.seqlens or base["seqlens"])
    dtypes = list(args.dtypes or base["dtypes"])
    causals = {"true": (True,), "false": (False,), "both": (False, True)}[args.causal]
    cases = [] if args.memory_only else [Case(dt, d, n, c) for dt in dtypes for d in head_dims
                                         for c in causals for n in seqlens]
    ours = [] if args.peers_only else list(args.backends or OURS)
    peers = [] if args.ours_only else list(args.peers or PEERS)
    memory = [] if args.no_memory else sorted(args.memory_seqlens or base["memory_seqlens"])
    mem_dtype = next((d for d in dtypes if d != "e4m3"), dtypes[0])
    plan = Plan(cases=cases, ours=ours, peers=peers, memory_seqlens=memory, memory_dtype=mem_dtype,
                memory_head_dim=128 if 128 in head_dims else head_dims[0],
                warmup_ms=args.warmup if args.warmup is not None else base["warmup_ms"],
                rep_ms=args.rep if args.rep is not None else base["rep_ms"], input_sets=args.input_sets)
    plan.settings = dict(tokens=TOKENS, hidden=HIDDEN, warmup_ms=plan.warmup_ms, rep_ms=plan.rep_ms,
                         quick=bool(args.quick), dtypes=dtypes, head_dims=head_dims, seqlens=seqlens,
                         causal=args.causal, ours=ours, peers=peers, memory_seqlens=memory)
    return plan


def fp8_status_problems(args: argparse.Namespace) -> list:
    """Issue 10's problems when the fp8 status table runs (``--fp8-status only``, or auto with e4m3 in --dtypes and
    fa3-fp8 among our backends), else []: --head-dims (default: the plan's), --seqlens (default 4096,16384),
    --causal, core first (``fp8status.order``)."""
    from fa_variants.bench import fp8status

    dtypes = args.dtypes or ()
    wanted = args.fp8_status == "only" or (args.fp8_status == "auto" and "e4m3" in dtypes and not args.peers_only
                                           and "fa3-fp8" in (args.backends or OURS) and not args.memory_only)
    if not wanted:
        return []
    causals = {"true": (True,), "false": (False,), "both": (False, True)}[args.causal]
    head_dims = args.head_dims or (QUICK if args.quick else FULL)["head_dims"]
    return fp8status.problems(head_dims, sorted(args.seqlens or fp8status.SEQLENS), causals)


def fp8_status_settings(args: argparse.Namespace) -> dict:
    """The paired protocol's settings of the fp8 status run (rounds from --fp8-rounds)."""
    return dict(rounds=args.fp8_rounds, cycles=4, burst_ms=10.0, warmup_ms=500.0)


def run_fp8_status(args: argparse.Namespace, outdir: Path, measure_one: Callable | None = None) -> int:
    """The fp8 status table: measured (``fp8status.measure``, or ``measure_one``: tests), printed, written to
    fp8_status.md / fp8_status.json in ``outdir``. 0 when every measured problem's sanity is ok, else 1."""
    import json

    from fa_variants.bench import fp8status

    items, settings = fp8_status_problems(args), fp8_status_settings(args)
    bench_report.make_outdir(outdir)  # before the measurements (minutes), not after them
    measure_one = measure_one or (lambda p: fp8status.measure(p, **settings))
    print(f"fp8 status: {len(items)} problems, core first: " + ", ".join(p.label for p in items), flush=True)
    rows, skipped = fp8status.run(items, measure_one, budget_s=args.fp8_budget,
                                  log=lambda m: print(m, flush=True))
    import torch

    gpu = torch.cuda.get_device_name() if _cuda_available() else "no GPU"
    text = fp8status.report(rows, skipped, settings, gpu)
    (outdir / "fp8_status.md").write_text(text, encoding="utf-8")
    (outdir / "fp8_status.json").write_text(json.dumps(dict(settings=settings, gpu=gpu, rows=rows,
                                                            skipped=[p.label for p in skipped]), indent=1),
                                            encoding="utf-8")
    print(text, flush=True)
    return 0 if rows and all(fp8status.sanity_ok(r) for r in rows) else 1


def _fp8_status_only(args: argparse.Namespace) -> int:
    """``--fp8-status only`` on this machine's GPU: the table alone, into --out (default: the GPU's dated folder);
    exit status 2 with one line on stderr when the GPU is not sm90 (fa3-fp8's arch)."""
    import torch

    if torch.cuda.get_device_capability()[0] != 9:
        raise ValueError("--fp8-status needs an sm90 GPU (fa3-fp8)")
    return run_fp8_status(args, Path(args.out) if args.out else default_outdir(torch.cuda.get_device_name()))


def runnable_here(plan: Plan) -> tuple[list[str], list[str], list[str]]:
    """(ours, peers, notes): the plan's implementations that can run on this machine, and one line for each
    that cannot, saying why (once: no GPU at all is one line)."""
    if not _cuda_available():
        return [], [], ["no CUDA GPU here: none of " + ", ".join(plan.ours + plan.peers) + " can run (the "
                        "benchmark needs a GPU; there `--dry-run` lists those it can run)"]
    import torch

    impls, notes = build_impls(plan.ours, plan.peers, torch.cuda.get_device_capability())
    return ([i.name for i in impls if i.kind == "ours"], [i.name for i in impls if i.kind == "peer"], notes)


def describe_plan(plan: Plan, ours: list[str] | None = None, peers: list[str] | None = None,
                  notes: list[str] = ()) -> str:
    """The plan as text: the implementations (those given, by default the plan's), the reasons others do
    not run, then one line per case."""
    ours = plan.ours if ours is None else ours
    peers = plan.peers if peers is None else peers
    lines = [f"{len(plan.cases)} cases x {len(ours) + len(peers)} implementations "
             f"(ours: {', '.join(ours) or 'none'}; peers: {', '.join(peers) or 'none'})",
             *(f"  not run: {n.replace(' not run: ', ': ', 1)}" for n in notes),
             f"timing: warm-up {plan.warmup_ms} ms, repeats {plan.rep_ms} ms; "
             f"memory table: {plan.memory_dtype} D={plan.memory_head_dim} seqlens "
             f"{', '.join(map(str, plan.memory_seqlens)) or 'none'}"]
    lines += [f"  {c.label:28s} batch {c.batch:3d} x heads {c.heads:3d}  {c.flops / 1e12:8.3f} TFLOP"
              for c in plan.cases]
    return "\n".join(lines)


def _command_line() -> str:
    argv = sys.argv[1:]
    return "fa-variants " + shlex.join(argv[argv.index("bench"):] if "bench" in argv else ["bench", *argv])


def default_outdir(gpu_name: str) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "gpu"
    return Path("results") / f"bench-{slug}-{_dt.date.today().isoformat()}"


def _load_report(src: Path) -> dict:
    """A saved report of `fa-variants bench`; ValueError (one line: the command's "error:") saying why it is not."""
    import json

    try:
        report = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {src}: {exc}") from None
    problem = bench_report.not_a_report(report)
    if problem:
        raise ValueError(f"{src} is not a report of `fa-variants bench` ({problem})")
    return report


def _saved_for_compare(args) -> tuple | None:
    """(path, report, threshold) for --compare (None without it); raises ValueError on a bad file or threshold,
    before anything runs or is written."""
    if not getattr(args, "compare", None):
        if getattr(args, "threshold", None) is not None:  # given alone it was dropped without a word
            raise ValueError("--threshold applies to --compare only (the slowdown a comparison flags)")
        return None
    pct = 100 * bench_compare.DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    if not 0 <= pct < 100:
        raise ValueError(f"--threshold {pct} must be a percentage in [0, 100)")
    saved = _load_report(Path(args.compare))
    return Path(args.compare), saved, pct / 100


def _rebuild(args, saved: tuple | None = None) -> int:
    reports = []
    for src in map(Path, args.report_from):
        reports.append(_load_report(src))  # checked before anything is written (no empty output folder is left)
    outdir = Path(args.out) if args.out else Path(args.report_from[0]).parent
    if len(reports) > 1:  # the merge's bench.json must not replace a run it merges (a second merge held it twice)
        hit = replaced_input(args.report_from, outdir / "bench.json")
        if hit is not None:
            given = "" if args.out else " (by default the first file's folder)"
            raise ValueError(f"--out {outdir}{given}: the merged bench.json would replace {hit}, one of the runs "
                             "merged; give --out another folder")
    return _write_and_summarise(bench_report.merge(reports), outdir, charts=not args.no_charts, saved=saved)


def _compare(report: dict, outdir: Path, saved: tuple) -> int:
    """--compare: compare.md beside the report, the regressions printed; 1 when any case of ours regressed."""
    path, old, threshold = saved
    rows = bench_compare.compare(report, old, threshold)
    note = bench_compare.other_gpu(report, old)
    (outdir / "compare.md").write_text(bench_compare.markdown(rows, threshold, str(path), note), encoding="utf-8")
    for line in bench_compare.summary_lines(rows, threshold, note):
        print(line)
    return 1 if any(r["regressed"] for r in rows) else 0


def _write_and_summarise(report: dict, outdir: Path, charts: bool, saved: tuple | None = None) -> int:
    written = bench_report.write_reports(report, outdir, charts=charts)
    if written["charts_error"]:
        print(written["charts_error"])
    print(f"wrote {written['markdown']}, {written['json'].name} and {len(written['charts'])} charts in {outdir}")
    for name, s in bench_report.ratio_summary(report["results"]).items():
        print(f"{name}: ours / best peer min {s['min']:.2f}, median {s['median']:.2f}, max {s['max']:.2f} "
              f"over {s['cases']} cases")
    failed = [r for r in report["results"] + report.get("memory", []) if r["kind"] == "ours" and r.get("error")
              and not r["error"].startswith("cannot serve") and "out of memory" not in r["error"]]
    if failed:
        print(f"{len(failed)} measurements of ours FAILED (see 'Not measured' in {written['markdown']})")
    regressed = _compare(report, outdir, saved) if saved else 0
    return 1 if failed or regressed else 0


#: the argparse dests of the TFLOP/s sweep's flags that the decode table does not read, and of the flags only the
#: decode table reads (flag = "--" + dest with "-" for "_"); "given" = not None, False or a value of _UNSET
_SWEEP_ONLY = ("backends", "peers", "ours_only", "peers_only", "head_dims", "seqlens", "dtypes", "memory_seqlens",
               "no_memory", "memory_only", "report_from", "compare", "threshold", "causal", "fp8_status", "warmup",
               "rep", "input_sets", "fp8_rounds", "fp8_budget")
_DECODE_ONLY = ("decode_nq", "decode_nk", "decode_batch", "decode_head_dims", "decode_no_fa4", "decode_lengths",
                "peak_tbps")
#: a flag that leaves a part of the sweep out -> the dests of the flags only that part reads, dropped without a word
#: when given with it ("fp8_status": --fp8-status only, the fp8 status table alone, with its own timing settings)
_LEFT_OUT = {"fp8_status": ("backends", "peers", "ours_only", "peers_only", "memory_seqlens", "memory_only", "warmup",
                            "rep", "input_sets", "compare", "threshold"),  # first: it leaves out the most
             "peers_only": ("backends",), "ours_only": ("peers",), "no_memory": ("memory_seqlens",),
             "memory_only": ("seqlens", "causal", "warmup", "rep", "input_sets", "compare", "threshold")}
#: the dests of the flags that shape or time a run, which --report-from (saved runs rebuilt as they are) does not read
_RUN_ONLY = ("quick", "backends", "peers", "ours_only", "peers_only", "head_dims", "seqlens", "causal", "dtypes",
             "memory_seqlens", "no_memory", "memory_only", "warmup", "rep", "input_sets", "dry_run", "fp8_status",
             "fp8_rounds", "fp8_budget")
_UNSET = {"causal": ("both",), "fp8_status": ("auto", "off"),  # defaults, and "off": nothing to run with --decode
          "fp8_rounds": (6,)}


def _given(args: argparse.Namespace, dests: tuple[str, ...]) -> list[str]:
    """The flags among ``dests`` set on the command line (their value is not the default)."""
    return ["--" + dest.replace("_", "-") for dest in dests
            if getattr(args, dest, None) not in (None, False, *_UNSET.get(dest, ()))]


def run_cli(args: argparse.Namespace) -> int:
    stray = _given(args, _SWEEP_ONLY) if args.decode else _given(args, _DECODE_ONLY)
    if stray:  # a flag the chosen table does not read: say so instead of dropping it
        raise not_applicable(stray, "to --decode (the decode table's own flags are --decode-*)" if args.decode
                             else "without --decode")
    if args.decode:
        from fa_variants.bench import decode

        return decode.run_cli(args)
    stray = _given(args, _RUN_ONLY) if args.report_from else []
    if stray:  # --dry-run wrote the report all the same, --head-dims and the like were dropped
        raise not_applicable(stray, "to --report-from (it rebuilds the saved runs as they are)")
    saved = _saved_for_compare(args)
    if args.report_from:
        return _rebuild(args, saved)
    for mode, dests in _LEFT_OUT.items():
        given = _given(args, (mode,))
        stray = _given(args, dests) if given else []
        if stray:
            raise not_applicable(stray, f"to {given[0]}{' only' if mode == 'fp8_status' else ''}")
    plan = make_plan(args)
    status = fp8_status_problems(args)
    stray = [] if status else _given(args, ("fp8_rounds", "fp8_budget"))
    if stray:  # the paired rounds and budget of a table that does not run
        raise not_applicable(stray, "without the fp8 status table (it runs with --fp8-status only, or with e4m3 in "
                                    "--dtypes and fa3-fp8 among --backends, without --memory-only / --peers-only / "
                                    "--fp8-status off)")
    if args.fp8_status == "only":
        plan.cases, plan.memory_seqlens = [], []
    if args.dry_run:
        print(describe_plan(plan, *runnable_here(plan)))
        if status:
            print(f"fp8 status (issue 10), {args.fp8_rounds} paired rounds, core first: "
                  + ", ".join(p.label for p in status))
        return 0
    if not _cuda_available():
        raise ValueError("no CUDA GPU found here; the benchmark needs one (`--dry-run` shows the plan; "
                         "`--report-from FILE` rebuilds a saved report)")
    if args.fp8_status == "only":
        return _fp8_status_only(args)
    runtime = make_runtime(plan)
    gpu = runtime.meta()
    impls, notes = build_impls(plan.ours, plan.peers, gpu["cc"])
    for note in notes:
        print(note)
    if not impls:
        raise ValueError("nothing to run: none of the implementations asked for runs on this GPU (the lines above "
                         "say why)")
    outdir = bench_report.make_outdir(Path(args.out) if args.out else default_outdir(gpu["name"]))
    settings = dict(plan.settings, timer=runtime.timer_name, input_sets=plan.input_sets or "auto")
    report = dict(meta=dict(command=_command_line(), date=_dt.datetime.now().isoformat(timespec="seconds"),
                            gpu=gpu, versions=versions(), settings=settings),
                  results=[], memory=[], notes=notes)
    print(f"{gpu['name']} (sm{gpu['capability']}): {len(plan.cases)} cases x {len(impls)} implementations "
          f"({', '.join(i.name for i in impls)})")
    total = len(plan.cases) * len(impls) + len(plan.memory_seqlens) * len(impls)
    with Progress(total, enabled=not args.no_progress) as bar:
        def save(results=None, memory=None):
            report["results"] = report["results"] if results is None else results
            report["memory"] = report["memory"] if memory is None else memory
            bench_report.write_json(report, outdir / "bench.json")

        report["results"] = sweep(plan.cases, impls, runtime.time, log=bar.log, step=bar.step, on_case=save)
        if plan.memory_seqlens:
            report["memory"] = memory_sweep(plan.memory_seqlens, impls, runtime.memory, dtype=plan.memory_dtype,
                                            head_dim=plan.memory_head_dim, log=bar.log, step=bar.step,
                                            on_row=lambda rows: save(memory=rows))
    code = _write_and_summarise(report, outdir, charts=not args.no_charts, saved=saved)
    if status and any(i.name == "fa3-fp8" for i in impls):
        code = max(code, run_fp8_status(args, outdir))
    return code
