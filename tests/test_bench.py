"""`fa-variants bench` without a GPU: arguments, the FLOP formula, ratios, the sweep's error handling and the
report writers, all on synthetic timings; plus one short real run marked `gpu` for the GPU host."""
import json
from pathlib import Path

import pytest
import torch

from fa_variants import cli as top_cli
from fa_variants.bench import cli as bench_cli
from fa_variants.bench import core, report
from fa_variants.bench.core import Case, Impl, Timing, attention_flops, memory_sweep, sweep, tflops
from fa_variants.bench.runtime import GpuRuntime

OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
# synthetic speeds, TFLOP/s: a timing of flops / rate makes the report show exactly these
RATES = {"fa2": 300.0, "fa3": 600.0, "sdpa-flash": 340.0, "sdpa-cudnn": 650.0, "sdpa-math": 40.0}


def parse(*argv):
    return top_cli.build_parser().parse_args(["bench", *argv])


def synthetic_timer(impl, case):
    if impl.name == "fa2" and case.head_dim == 256:
        raise ValueError("fa2 does not support head_dim 256 (supports 64, 128)")
    return Timing(ms=case.flops / (RATES[impl.name] * 1e12) * 1e3, first_call_s=2.5 if impl.kind == "ours" else 0.01,
                  max_diff=1e-3 if impl.kind == "ours" else None)


def synthetic_memory(impl, seqlen):
    if impl.name == "sdpa-math" and seqlen >= 4096:
        raise OOM("CUDA out of memory. Tried to allocate 32.00 GiB")
    inputs = 3 * seqlen * 2048 * 2 / 2**20
    extra = 16 * seqlen * seqlen * 6 / 2**20 if impl.name == "sdpa-math" else 0.5
    return inputs, inputs * 4 / 3 + extra


def impls(*names):
    return [Impl(n, "ours" if n.startswith("fa") else "peer", None) for n in names]


def synthetic_report():
    cases = [Case("bf16", d, n, c) for d in (128, 256) for c in (False, True) for n in (512, 2048)]
    logs = []
    results = sweep(cases, impls("fa2", "fa3", "sdpa-flash", "sdpa-cudnn"), synthetic_timer, log=logs.append)
    memory = memory_sweep([1024, 2048, 4096, 8192], impls("fa2", "fa3", "sdpa-math"), synthetic_memory,
                          dtype="bf16", head_dim=128, log=logs.append)
    meta = dict(command="fa-variants bench --synthetic", date="2026-12-01", versions={"torch": "x"},
                gpu=dict(name="Fake H200", capability="90", sms=132, memory_gib=139.8, l2_mib=60),
                settings=dict(tokens=16384, hidden=2048, timer="synthetic", warmup_ms=1, rep_ms=1, input_sets=2))
    return dict(meta=meta, results=results, memory=memory, notes=["flash-attn-4 not run: not importable"]), logs


# ------------------------------------------------------------------------------------------------ maths
def test_flops_follow_the_flashattention_convention():
    assert attention_flops(2, 16, 1024, 1024, 128, causal=False) == 4 * 2 * 16 * 1024 * 1024 * 128
    assert attention_flops(2, 16, 1024, 1024, 128, causal=True) == 2 * 2 * 16 * 1024 * 1024 * 128
    assert attention_flops(1, 1, 3, 7, 64, causal=False) == 4 * 3 * 7 * 64
    assert tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert tflops(4 * 4 * 16 * 4096**2 * 128, 1.0) == pytest.approx(549.755813888)


@pytest.mark.parametrize("seqlen, batch", [(512, 32), (4096, 4), (16384, 1), (32768, 1)])
def test_cases_keep_16k_tokens_and_hidden_2048(seqlen, batch):
    case = Case("bf16", 128, seqlen, causal=False)
    assert (case.batch, case.heads) == (batch, 16)
    assert case.flops == 4 * batch * 16 * seqlen * seqlen * 128
    assert Case("bf16", 64, seqlen, causal=True).heads == 32


# -------------------------------------------------------------------------------------------- arguments
def test_default_plan_is_the_papers_sweep():
    plan = bench_cli.make_plan(parse())
    assert len(plan.cases) == 2 * 3 * 2 * 6  # dtypes x head dims x causal x seqlens
    assert {c.seqlen for c in plan.cases} == {512, 1024, 2048, 4096, 8192, 16384}
    assert plan.ours == list(bench_cli.OURS) and plan.peers == list(bench_cli.PEERS)
    assert (plan.warmup_ms, plan.rep_ms, plan.memory_head_dim) == (25, 100, 128)
    assert plan.memory_seqlens[0] == 1024 and plan.memory_seqlens[-1] == 131072


def test_filters_and_quick():
    plan = bench_cli.make_plan(parse("--head-dims", "128", "--seqlens", "2048,512,512", "--causal", "true",
                                     "--dtypes", "fp16", "--backends", "fa2,fa2", "--peers", "sdpa-flash"))
    assert plan.cases == [Case("fp16", 128, 512, True), Case("fp16", 128, 2048, True)]
    assert (plan.ours, plan.peers) == (["fa2"], ["sdpa-flash"])
    quick = bench_cli.make_plan(parse("--quick"))
    assert {c.head_dim for c in quick.cases} == {64, 128} and {c.dtype for c in quick.cases} == {"bf16"}
    assert quick.rep_ms < plan.rep_ms and len(quick.cases) == 12
    mixed = bench_cli.make_plan(parse("--quick", "--head-dims", "256", "--causal", "false", "--rep", "7"))
    assert {c.head_dim for c in mixed.cases} == {256} and not any(c.causal for c in mixed.cases)
    assert (mixed.rep_ms, mixed.memory_head_dim) == (7, 256)
    assert bench_cli.make_plan(parse("--ours-only")).peers == []
    assert bench_cli.make_plan(parse("--peers-only")).ours == []
    assert bench_cli.make_plan(parse("--no-memory")).memory_seqlens == []


@pytest.mark.parametrize("argv", [
    ["--head-dims", "100"], ["--head-dims", "abc"], ["--head-dims", "0"], ["--head-dims", ""],
    ["--seqlens", "0"], ["--seqlens", "1k"], ["--causal", "maybe"], ["--dtypes", "fp32"],
    ["--backends", "fa9"], ["--peers", "xformers"], ["--ours-only", "--peers-only"], ["--memory-seqlens", "-4"],
    # session 27: these were taken (`--dry-run` printed "repeats nan ms"; an empty input list or a bad int on a GPU)
    ["--rep", "nan"], ["--rep", "0"], ["--warmup", "-1"], ["--warmup", "inf"], ["--input-sets", "-3"],
    ["--input-sets", "x"], ["--fp8-budget", "-1"], ["--fp8-budget", "nan"], ["--decode-head-dims", "7"],
    ["--decode-head-dims", "512"],
])
def test_bad_arguments_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_our_backend_names_are_the_dispatchers():
    dispatch = pytest.importorskip("fa_variants.dispatch")
    assert set(bench_cli.OURS) <= set(dispatch.BACKENDS)


def test_backends_this_gpu_cannot_run_get_a_note():
    from fa_variants.bench.runtime import our_backends

    runnable, notes = our_backends(["fa3", "fa2"], capability=(8, 0))
    assert "fa3" not in runnable
    assert any(n.startswith("fa3 not run") and "sm_80" in n for n in notes)
    assert set(runnable) | {n.split()[0] for n in notes} == {"fa3", "fa2"}  # fa2 runs, or says why not


# ------------------------------------------------------------------------------------- sweep and ratios
def test_sweep_records_a_backend_that_cannot_serve_and_goes_on():
    rep, logs = synthetic_report()
    fa2_256 = [r for r in rep["results"] if r["impl"] == "fa2" and r["head_dim"] == 256]
    assert len(fa2_256) == 4 and all(r["tflops"] is None for r in fa2_256)
    assert all(r["error"].startswith("cannot serve: fa2 does not support head_dim 256") for r in fa2_256)
    said = [line for line in logs if "fa2 does not support" in line]
    assert len(said) == 1 and "\n" not in said[0] and "Traceback" not in said[0]
    fa3 = [r for r in rep["results"] if r["impl"] == "fa3"]
    assert all(r["tflops"] == pytest.approx(600.0) for r in fa3)  # timings -> TFLOP/s round trip


def test_sweep_reports_other_failures_and_oom():
    def timer(impl, case):
        if impl.name == "fa3":
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore text")
        raise OOM("CUDA out of memory. Tried to allocate 8 GiB")

    out = sweep([Case("bf16", 128, 512, False)], impls("fa3", "sdpa-math"), timer, log=lambda m: None)
    assert out[0]["error"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert out[1]["error"].startswith("out of memory") and report.cell_text(None, out[1]["error"]) == "OOM"


def test_ratio_is_ours_over_the_best_peer_of_the_same_run():
    def rec(impl, kind, value, dtype="bf16", err=None):
        return dict(impl=impl, kind=kind, dtype=dtype, head_dim=128, seqlen=4096, causal=False, batch=4, heads=16,
                    tflops=value, error=err)

    rows = report.case_rows([
        rec("fa2", "ours", 200.0), rec("fa3", "ours", 300.0), rec("sdpa-flash", "peer", 150.0),
        rec("sdpa-cudnn", "peer", 250.0), rec("flash-attn-4", "peer", None, err="RuntimeError: x"),
        rec("fa3-fp8", "ours", 500.0, "e4m3"), rec("sdpa-flash", "peer", None, "e4m3", "RuntimeError: no fp8"),
    ])
    bf16, fp8 = rows
    assert bf16["best_peer"] == "sdpa-cudnn" and bf16["ratio_vs"] is None
    assert bf16["ratio"] == pytest.approx({"fa2": 0.8, "fa3": 1.2})
    assert fp8["best_peer"] is None and fp8["ratio"] == pytest.approx({"fa3-fp8": 2.0})
    assert fp8["ratio_vs"] == "sdpa-cudnn (bf16)"
    summary = report.ratio_summary([r for r in [rec("fa2", "ours", 100.0), rec("sdpa-flash", "peer", 50.0)]])
    assert summary == {"fa2": dict(cases=1, min=2.0, median=2.0, max=2.0)}


def test_no_peer_means_no_ratio():
    rows = report.case_rows([dict(impl="fa2", kind="ours", dtype="bf16", head_dim=64, seqlen=512, causal=True,
                                  batch=32, heads=32, tflops=100.0, error=None)])
    assert rows[0]["ratio"] == {} and rows[0]["best_peer"] is None


# --------------------------------------------------------------------------------------------- writers
def test_markdown_has_a_table_per_config_with_ratios_and_problems():
    rep, _ = synthetic_report()
    md = report.to_markdown(rep)
    assert "### bf16, head_dim 128, non-causal" in md and "### bf16, head_dim 256, causal" in md
    head = "| seqlen | batch x heads | fa2 | fa3 | sdpa-flash | sdpa-cudnn | best peer | fa2 / best | fa3 / best |"
    assert head in md
    assert "| 512 | 32 x 16 | 300 | 600 | 340 | 650 | sdpa-cudnn | 0.46 | 0.92 |" in md
    assert "| 512 | 32 x 8 | n/a | 600 |" in md  # fa2 cannot serve head_dim 256
    assert "- fa2: cannot serve: fa2 does not support head_dim 256" in md
    assert "- flash-attn-4 not run: not importable" in md
    assert "## First call (compile) seconds" in md and "| bf16 | 128 | false | 2.50 | 2.50 |" in md
    assert "Fake H200" in md and "fa-variants bench --synthetic" in md


def test_memory_table_shows_oom_and_savings():
    rep, logs = synthetic_report()
    md = report.memory_markdown(rep["memory"])
    lines = md.splitlines()
    assert lines[0] == "| seqlen | q,k,v MiB | fa2 | fa3 | sdpa-math | sdpa-math / fa2 | sdpa-math / fa3 |"
    row_2k = next(line for line in lines if line.startswith("| 2048 |"))
    std = 16 * 2048 * 2048 * 6 / 2**20 + 32
    assert f"| {std:.0f} |" in row_2k and row_2k.endswith(f"| {std / 32.5:.1f}x | {std / 32.5:.1f}x |")
    row_8k = next(line for line in lines if line.startswith("| 8192 |"))
    assert "| OOM | std OOM | std OOM |" in row_8k
    assert sum("memory: sdpa-math" in line for line in logs) == 1  # not retried after running out


def test_write_reports_json_markdown_and_charts(tmp_path):
    pytest.importorskip("matplotlib")
    rep, _ = synthetic_report()
    out = report.write_reports(rep, tmp_path / "res")
    saved = json.loads((tmp_path / "res" / "bench.json").read_text(encoding="utf-8"))
    assert saved["results"] == rep["results"] and saved["memory"] == rep["memory"]
    assert out["charts_error"] is None and len(out["charts"]) == 4 + 1  # (head_dim, causal) x2 x2 + memory
    names = sorted(p.name for p in out["charts"])
    assert "tflops-bf16-d128-causal.png" in names and "memory.png" in names
    for path in out["charts"]:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    md = (tmp_path / "res" / "bench.md").read_text(encoding="utf-8")
    assert "![tflops-bf16-d256-noncausal](tflops-bf16-d256-noncausal.png)" in md


def test_report_from_json_rebuilds_without_gpu(tmp_path, capsys):
    rep, _ = synthetic_report()
    report.write_reports(rep, tmp_path, charts=False)
    (tmp_path / "bench.md").unlink()
    code = top_cli.main(["bench", "--report-from", str(tmp_path / "bench.json"), "--no-charts"])
    assert code == 0 and "fa3: ours / best peer" in capsys.readouterr().out
    assert "| 2048 |" in (tmp_path / "bench.md").read_text(encoding="utf-8")
    assert top_cli.main(["bench", "--report-from", str(tmp_path / "missing.json")]) == 2


def test_report_from_several_runs_merges_them(tmp_path, capsys):
    rep, _ = synthetic_report()
    fp16 = json.loads(json.dumps(rep))
    fp16["meta"]["command"] = "fa-variants bench --dtypes fp16 --no-memory"
    fp16["memory"] = []
    for r in fp16["results"]:
        r["dtype"] = "fp16"
    report.write_reports(rep, tmp_path / "a", charts=False)
    report.write_reports(fp16, tmp_path / "b", charts=False)
    code = top_cli.main(["bench", "--report-from", str(tmp_path / "a" / "bench.json"),
                         str(tmp_path / "b" / "bench.json"), "--out", str(tmp_path / "all"), "--no-charts"])
    assert code == 0
    merged = json.loads((tmp_path / "all" / "bench.json").read_text(encoding="utf-8"))
    assert len(merged["results"]) == 2 * len(rep["results"]) and merged["memory"] == rep["memory"]
    assert [r["command"] for r in merged["meta"]["runs"]] == ["fa-variants bench --synthetic", fp16["meta"]["command"]]
    md = (tmp_path / "all" / "bench.md").read_text(encoding="utf-8")
    assert "### bf16, head_dim 128, causal" in md and "### fp16, head_dim 128, causal" in md


def test_report_from_several_runs_never_overwrites_one_of_them(tmp_path, capsys):
    """A merge written where one of its inputs lies would replace that run by the merge: --out defaults to the first
    file's folder, so `--report-from a/bench.json b/bench.json` rewrote a/bench.json with a's and b's results (and
    a second such call held them twice). An error naming --out now, nothing written; one file rebuilds in place."""
    rep, _ = synthetic_report()
    report.write_reports(rep, tmp_path / "a", charts=False)
    report.write_reports(rep, tmp_path / "b", charts=False)
    a, b = str(tmp_path / "a" / "bench.json"), str(tmp_path / "b" / "bench.json")
    before = {p: Path(p).read_bytes() for p in (a, b)}
    for out in ([], ["--out", str(tmp_path / "b")]):
        assert top_cli.main(["bench", "--report-from", a, b, "--no-charts", *out]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("fa-variants bench: error: --out ") and "would replace" in err, err
        assert {p: Path(p).read_bytes() for p in (a, b)} == before
    assert top_cli.main(["bench", "--report-from", a, "--no-charts"]) == 0  # one run: rebuilt in its own folder
    assert json.loads(Path(a).read_text(encoding="utf-8"))["results"] == rep["results"]


@pytest.mark.parametrize("flags", [["--dry-run"], ["--head-dims", "64"], ["--quick"], ["--causal", "true"],
                                   ["--backends", "fa2"], ["--memory-only"], ["--fp8-status", "only"]])
def test_report_from_refuses_the_flags_of_a_run(tmp_path, capsys, flags):
    """--report-from rebuilds the saved runs as they are: --dry-run wrote the report all the same, and --head-dims,
    --quick, ... were dropped without a word (the report showed every head dim). One line naming them, nothing
    written."""
    rep, _ = synthetic_report()
    report.write_reports(rep, tmp_path / "a", charts=False)
    out = tmp_path / "out"
    assert top_cli.main(["bench", "--report-from", str(tmp_path / "a" / "bench.json"), "--out", str(out),
                         "--no-charts", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"fa-variants bench: error: {flags[0]} ") and "--report-from" in err, err
    assert not out.exists()


# ------------------------------------------------------------------------------------- run_cli, no GPU
class FakeRuntime:
    timer_name = "synthetic"

    def __init__(self, plan):
        self.plan = plan

    def meta(self):
        return dict(name="Fake GPU", capability="90", cc=(9, 0), sms=132, memory_gib=139.8, l2_mib=60.0)

    time = staticmethod(synthetic_timer)
    memory = staticmethod(synthetic_memory)


def fake_build(failing=None):
    def build(ours, peers, capability):
        made = impls(*ours, *[p for p in peers if p in RATES])
        if failing:
            made.append(Impl(failing, "ours", None))
        return made, ["flash-attn-4 not run: not importable (ModuleNotFoundError: No module named 'flash_attn')"]
    return build


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(bench_cli, "_cuda_available", lambda: True)
    monkeypatch.setattr(bench_cli, "make_runtime", FakeRuntime)
    monkeypatch.setattr(bench_cli, "build_impls", fake_build())
    return monkeypatch


def test_run_cli_end_to_end_on_synthetic_timings(fake_gpu, tmp_path, capsys):
    out = tmp_path / "r"
    code = top_cli.main(["bench", "--backends", "fa2,fa3", "--peers", "sdpa-flash,sdpa-cudnn,sdpa-math",
                         "--head-dims", "128,256", "--seqlens", "512,1024", "--memory-seqlens", "1024,4096",
                         "--out", str(out), "--no-charts", "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0
    assert printed.count("fa2 on bf16 D=256") == 1 and "cannot serve" in printed and "Traceback" not in printed
    saved = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    assert len(saved["results"]) == 2 * 2 * 2 * 2 * 5  # dtypes x head dims x causal x seqlens x impls
    assert saved["meta"]["settings"]["seqlens"] == [512, 1024] and saved["meta"]["gpu"]["name"] == "Fake GPU"
    assert {m["seqlen"] for m in saved["memory"]} == {1024, 4096}
    md = (out / "bench.md").read_text(encoding="utf-8")
    assert "sdpa-cudnn" in md and "OOM" in md and "fa3: ours / best peer" in printed


def test_run_cli_fails_when_one_of_ours_crashes(fake_gpu, tmp_path, capsys):
    def timer(impl, case):
        if impl.name == "fa1":
            raise RuntimeError("kernel launch failed")
        return synthetic_timer(impl, case)

    fake_gpu.setattr(FakeRuntime, "time", staticmethod(timer))
    fake_gpu.setattr(bench_cli, "build_impls", fake_build(failing="fa1"))
    code = top_cli.main(["bench", "--quick", "--backends", "fa2", "--no-memory", "--out", str(tmp_path),
                         "--no-charts", "--no-progress"])
    assert code == 1 and "measurements of ours FAILED" in capsys.readouterr().out


def test_without_gpu_a_clear_message(monkeypatch, capsys):
    monkeypatch.setattr(bench_cli, "_cuda_available", lambda: False)
    assert top_cli.main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "Traceback" not in err


def test_dry_run_prints_the_plan(capsys, monkeypatch):
    """Without a GPU nothing can run: no implementation is listed, and one line says why."""
    monkeypatch.setattr(bench_cli, "_cuda_available", lambda: False)
    assert top_cli.main(["bench", "--quick", "--dry-run", "--head-dims", "128"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("6 cases x 0 implementations (ours: none; peers: none)")
    assert out.count("not run:") == 1 and "no CUDA GPU here" in out and "bf16 D=128 N=16384 causal" in out


def test_dry_run_lists_only_what_runs_here(capsys, monkeypatch):
    """On a GPU (here an sm_80 one, pretended): our backends for other archs, and peers that do not import,
    are not listed as planned but each named once with the reason."""
    import torch

    monkeypatch.setattr(bench_cli, "_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert top_cli.main(["bench", "--quick", "--dry-run", "--backends", "fa2,fa3", "--peers",
                         "sdpa-flash,flash-attn-4"]) == 0
    first, *rest = capsys.readouterr().out.splitlines()
    fa2_built = not isinstance(__import__("fa_variants.dispatch").dispatch.load("fa2"), str)
    assert "fa3" not in first and ("ours: fa2;" in first) == fa2_built and "sdpa-flash" in first
    notes = [line for line in rest if "not run:" in line]
    assert sum("fa3" in n and "sm_90" in n for n in notes) == 1
    assert len(notes) == len(set(notes))


@pytest.mark.parametrize("name", ["fa2_bench.json", "ablation.json", "real_input.json", "empty.json"])
def test_report_from_another_json_is_one_line(tmp_path, capsys, name):
    """bench/ holds other JSON files (scripts' outputs): a clear one-line error, exit 2, and no output
    folder created (was a KeyError / TypeError traceback and an empty folder)."""
    src = tmp_path / name
    src.write_text({"fa2_bench.json": '{"device": "H200", "arch": "sm_90", "rows": []}',
                    "ablation.json": '[{"variant": "fa3"}]',
                    "real_input.json": '{"fixture": "x", "per_layer": []}',
                    "empty.json": '{"meta": {}, "results": [{"impl": "fa2"}]}'}[name], encoding="utf-8")
    out = tmp_path / "out"
    assert top_cli.main(["bench", "--report-from", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is not a report of `fa-variants bench`" in err
    assert not out.exists()


def test_progress_bar_logs_and_steps(capsys):
    with bench_cli.Progress(total=2) as bar:
        bar.step("one")
        bar.log("a log line")
        bar.step("two")
    assert "a log line" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the runtime, on the CPU
@pytest.fixture
def tiny_cases(monkeypatch):
    monkeypatch.setattr(core, "TOKENS", 64)
    monkeypatch.setattr(core, "HIDDEN", 128)
    return [Case("bf16", 64, 32, False), Case("bf16", 64, 32, True)]


def test_runtime_times_rotates_inputs_and_checks_ours(tiny_cases):
    plan = bench_cli.make_plan(parse("--input-sets", "3"))
    rt = GpuRuntime(plan, device="cpu")
    seen = []  # data pointers of q, per case

    def ours(q, k, v, causal):
        seen[-1].add(q.data_ptr())
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2), None

    for case in tiny_cases:
        seen.append(set())
        t = rt.time(Impl("fa2", "ours", ours), case)
        assert t.ms > 0 and t.first_call_s > 0 and t.max_diff == 0.0
        assert len(seen[-1]) == 3  # every input set used
    assert rt.meta()["name"] == "cpu"


def test_runtime_keeps_the_warning_of_a_failing_peer(tiny_cases):
    import warnings

    def peer(q, k, v, causal):
        warnings.warn("Flash attention requires head_dim <= 256")
        raise RuntimeError("No available kernel. Aborting execution.")

    rt = GpuRuntime(bench_cli.make_plan(parse()), device="cpu")
    with pytest.raises(RuntimeError, match=r"^No available kernel.*\(warning: .*head_dim <= 256\)"):
        rt.time(Impl("sdpa-flash", "peer", peer), tiny_cases[0])
    with pytest.raises(ValueError):  # the "cannot serve" contract passes through untouched
        rt.time(Impl("fa2", "ours", lambda *a: (_ for _ in ()).throw(ValueError("no"))), tiny_cases[0])


def test_sdpa_peers_on_the_cpu_and_fp8_is_cannot_serve(tiny_cases):
    impls, notes = bench_cli.build_impls([], ["sdpa-math", "flash-attn-4"])
    assert [i.name for i in impls][0] == "sdpa-math"
    assert any(n.startswith("flash-attn-4 not run: not importable") for n in notes) or len(impls) == 2
    rt = GpuRuntime(bench_cli.make_plan(parse()), device="cpu")
    assert rt.time(impls[0], tiny_cases[1]).ms > 0
    logs = []
    out = sweep([Case("e4m3", 64, 32, False)], impls[:1], rt.time, log=logs.append)
    assert out[0]["error"] == "cannot serve: PyTorch SDPA has no fp8 path (float8_e4m3fn)"


# ------------------------------------------------------------------------------------------ on the GPU
@pytest.mark.gpu
def test_short_real_benchmark(tmp_path, capsys):
    """A few seconds on the GPU host: the real runtime, SDPA peers, ours through the dispatcher."""
    code = top_cli.main(["bench", "--head-dims", "128", "--seqlens", "1024", "--causal", "true",
                         "--dtypes", "bf16", "--peers", "sdpa-flash,sdpa-math", "--memory-seqlens", "1024,2048",
                         "--warmup", "5", "--rep", "10", "--out", str(tmp_path), "--no-progress"])
    printed = capsys.readouterr().out
    saved = json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))
    flash = [r for r in saved["results"] if r["impl"] == "sdpa-flash"]
    assert flash and flash[0]["tflops"] > 1, printed
    assert all(m["peak_mib"] for m in saved["memory"] if m["impl"] == "sdpa-flash")
    ours = [r for r in saved["results"] if r["kind"] == "ours"]
    # every one of ours measured or a clear "cannot serve" (exit code 1 = a measurement of ours failed), one at least
    assert code == 0 and ours and any(r["tflops"] for r in ours), printed
    assert all(r["tflops"] or (r.get("error") or "").startswith("cannot serve") for r in ours), ours
    for r in ours:  # fa3-fp8 quantises the bf16 inputs to e4m3 (3 mantissa bits): |V| ~ 4 rounds by 0.25
        if r["tflops"]:
            assert r["max_diff"] < (0.5 if r["impl"] == "fa3-fp8" else 0.05), r
    assert (tmp_path / "bench.md").exists()


def test_memory_sweep_hands_each_record_over_as_it_is_measured():
    """A run cut off by the GPU host's time limit must keep the memory rows it measured (seen on the H200)."""
    seen = []
    rows = memory_sweep([1024, 2048], impls("fa2", "sdpa-math"), synthetic_memory, dtype="bf16", head_dim=128,
                        log=lambda _: None, on_row=lambda so_far: seen.append(len(so_far)))
    assert seen == [1, 2, 3, 4] and len(rows) == 4


def test_memory_only_measures_no_timing(fake_gpu, tmp_path, capsys):
    """--memory-only: the memory table alone (the GPU-host script runs it first, in its own time limit)."""
    out = tmp_path / "m"
    code = top_cli.main(["bench", "--memory-only", "--dtypes", "fp16", "--backends", "fa2,fa3", "--peers",
                         "sdpa-math", "--memory-seqlens", "1024,4096", "--out", str(out), "--no-charts",
                         "--no-progress"])
    assert code == 0, capsys.readouterr()
    saved = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    assert saved["results"] == [] and {m["seqlen"] for m in saved["memory"]} == {1024, 4096}
    assert {m["dtype"] for m in saved["memory"]} == {"fp16"}
    assert "## Memory: peak allocated MiB" in (out / "bench.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------ --compare (issue 12)
def _slowed(rep, factor: dict):
    """A copy of a report with each named implementation's TFLOP/s multiplied by factor[impl]."""
    new = json.loads(json.dumps(rep))
    for r in new["results"]:
        if r.get("tflops") and r["impl"] in factor:
            r["tflops"] *= factor[r["impl"]]
    return new


def test_compare_flags_only_cases_of_ours_slower_than_the_threshold():
    from fa_variants.bench import compare

    old, _ = synthetic_report()
    new = _slowed(old, {"fa3": 0.98, "sdpa-cudnn": 0.90})
    key = lambda r: (r["impl"], r["head_dim"], r["seqlen"], r["causal"])  # noqa: E731
    one = next(r for r in new["results"] if key(r) == ("fa3", 128, 2048, True))
    one["tflops"] *= 0.96 / 0.98  # this case alone 4% slower
    rows = compare.compare(new, old, threshold=0.03)
    assert [key(r) for r in rows if r["regressed"]] == [("fa3", 128, 2048, True)]
    assert all(not r["regressed"] for r in rows if r["kind"] == "peer")  # a slower peer is context, not a failure
    assert compare.peer_drift(rows) == pytest.approx(0.95)  # median of cudnn 0.90 and sdpa-flash 1.0 cases
    assert not any(r["regressed"] for r in compare.compare(new, old, threshold=0.05))
    with pytest.raises(ValueError, match="threshold"):
        compare.compare(new, old, threshold=3)


def test_compare_flags_a_case_that_is_no_longer_measured():
    from fa_variants.bench import compare

    old, _ = synthetic_report()
    new = json.loads(json.dumps(old))
    victim = next(r for r in new["results"] if r["impl"] == "fa3")
    victim["tflops"], victim["error"] = None, "RuntimeError: boom"
    new["results"] = [r for r in new["results"] if not (r["impl"] == "fa2" and r["head_dim"] == 128 and r["seqlen"] == 512)]
    bad = [r for r in compare.compare(new, old) if r["regressed"]]
    assert {(r["impl"], r["error"]) for r in bad} == {("fa3", "RuntimeError: boom"), ("fa2", "not in the new report")}
    assert all(r["ratio"] is None for r in bad)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -5.0])
def test_compare_takes_a_non_finite_figure_for_no_measurement(bad):
    """A TFLOP/s that is NaN, infinite or negative is no measurement (session 28's break-it pass: a NaN ratio passed
    every threshold, so a report of NaN figures compared as "0 slower"): in the new report a regression of ours, with
    the value named; in the saved one, a case with nothing to compare against."""
    from fa_variants.bench import compare

    old, _ = synthetic_report()
    new = json.loads(json.dumps(old))
    ours = [r for r in new["results"] if r["kind"] == "ours" and r["tflops"]]
    for r in ours:
        r["tflops"] = bad
    bad_rows = [r for r in compare.compare(new, old) if r["regressed"]]
    assert len(bad_rows) == len(ours) and all(r["new"] is None and repr(bad) in r["error"] for r in bad_rows)
    assert not any(r["regressed"] for r in compare.compare(old, new))  # saved NaN / inf: nothing to compare
    assert len(compare.compare(old, new)) == len([r for r in old["results"] if r["tflops"]]) - len(ours)


@pytest.mark.parametrize("change", [
    ("drop", "causal"), ("set", "tflops", "300"), ("set", "head_dim", [128]), ("set", "kind", "OURS"),
    ("set", "causal", "yes"), ("set", "seqlen", True), ("set", "impl", 3), ("drop", "batch"), ("set", "heads", "16"),
    ("meta", "gpu", "H200"), ("meta", "versions", "torch 2.11"), ("meta", "settings", [1]), ("top", "notes", 3),
    ("top", "charts", [7])])
def test_a_report_row_of_the_wrong_shape_is_one_line(tmp_path, capsys, change):
    """--report-from and --compare files whose rows lack causal or hold values of another type (a string TFLOP/s, a
    list head_dim, an unknown kind), rows without batch / heads, meta's gpu / versions / settings or the notes /
    charts of another type: the one-line "not a report" error, exit 2 (were KeyError / TypeError / AttributeError
    tracebacks with exit 1, or a case silently dropped for "OURS"; session 28's and session 42's break-it passes)."""
    good, _ = synthetic_report()
    bad = json.loads(json.dumps(good))
    row = next(r for r in bad["results"] if r["kind"] == "ours" and r["tflops"])
    if change[0] == "drop":
        del row[change[1]]
    elif change[0] == "meta":
        bad["meta"][change[1]] = change[2]
    elif change[0] == "top":
        bad[change[1]] = change[2]
    else:
        row[change[1]] = change[2]
    src, saved = tmp_path / "bad.json", tmp_path / "good.json"
    src.write_text(json.dumps(bad), encoding="utf-8")
    saved.write_text(json.dumps(good), encoding="utf-8")
    assert top_cli.main(["bench", "--report-from", str(src), "--out", str(tmp_path / "o1"), "--no-charts"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is not a report of `fa-variants bench`" in err and change[1] in err, err
    assert top_cli.main(["bench", "--report-from", str(saved), "--out", str(tmp_path / "o2"), "--no-charts",
                         "--compare", str(src)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("fa-variants bench: error: "), err
    assert not (tmp_path / "o2").exists()


def test_compare_across_gpus_gives_ratios_not_regressions(tmp_path, capsys):
    """A saved run from another GPU (an H200's report, today's run on an H100: every case ~0.65x): the ratios are
    the cards', so no case is flagged, the exit status is 0 and both the terminal and compare.md say why (session 35's
    break-it pass: every case of ours was a REGRESSION, exit 1)."""
    from fa_variants.bench import compare

    old, _ = synthetic_report()
    new = _slowed(old, {name: 0.65 for name in {r["impl"] for r in old["results"]}})
    new["meta"]["gpu"]["name"] = "Fake H100"
    rows = compare.compare(new, old)
    assert rows and not any(r["regressed"] for r in rows) and all(r["ratio"] == pytest.approx(0.65) for r in rows)
    assert compare.other_gpu(new, old).startswith("the saved run is from another GPU (Fake H200; this one: Fake H100)")
    assert compare.other_gpu(old, old) is None and any(r["regressed"] for r in compare.compare(_slowed(old, {"fa3": 0.5}), old))
    report.write_reports(old, tmp_path / "old", charts=False)
    report.write_reports(new, tmp_path / "new", charts=False)
    assert top_cli.main(["bench", "--report-from", str(tmp_path / "new" / "bench.json"), "--no-charts",
                         "--compare", str(tmp_path / "old" / "bench.json")]) == 0
    out = capsys.readouterr().out
    assert "REGRESSION" not in out and "compare: the saved run is from another GPU" in out
    assert "compare: 0 of " in out and "not measured in this run (speeds across GPUs not judged)" in out
    md = (tmp_path / "new" / "compare.md").read_text(encoding="utf-8")
    assert "Note: the saved run is from another GPU" in md and "0 of " in md and "slower" not in md.split("|")[0]
    # a case of ours that no longer runs is still flagged across GPUs; a report naming its GPU as a bare string
    gone = json.loads(json.dumps(new))
    victim = next(r for r in gone["results"] if r["kind"] == "ours" and r["tflops"])
    victim["tflops"], victim["error"] = None, "RuntimeError: boom"
    assert [r["error"] for r in compare.compare(gone, old) if r["regressed"]] == ["RuntimeError: boom"]
    bare = json.loads(json.dumps(old))
    bare["meta"]["gpu"] = "Fake H200"
    assert compare.other_gpu(new, bare).startswith("the saved run is from another GPU (Fake H200;")
    assert compare.other_gpu(bare, dict(results=[])) is None  # no GPU named: judged as before


def test_cli_compare_with_report_from_needs_no_gpu(tmp_path, capsys):
    old, _ = synthetic_report()
    report.write_reports(old, tmp_path / "old", charts=False)
    report.write_reports(_slowed(old, {"fa2": 1.01}), tmp_path / "same", charts=False)
    report.write_reports(_slowed(old, {"fa2": 0.9}), tmp_path / "slow", charts=False)
    saved = str(tmp_path / "old" / "bench.json")
    same = top_cli.main(["bench", "--report-from", str(tmp_path / "same" / "bench.json"), "--no-charts", "--compare", saved])
    assert same == 0 and "compare: 0 of" in capsys.readouterr().out
    slow = top_cli.main(["bench", "--report-from", str(tmp_path / "slow" / "bench.json"), "--no-charts", "--compare", saved])
    out = capsys.readouterr().out
    n_fa2 = sum(r["impl"] == "fa2" and bool(r["tflops"]) for r in old["results"])
    assert slow == 1 and out.count("REGRESSION fa2 ") == n_fa2 and "0.900x" in out
    md = (tmp_path / "slow" / "compare.md").read_text(encoding="utf-8")
    assert md.count("SLOWER") == n_fa2 and f"{n_fa2} of " in md
    assert top_cli.main(["bench", "--report-from", str(tmp_path / "slow" / "bench.json"), "--no-charts",
                         "--compare", saved, "--threshold", "15"]) == 0
    # a bad saved file or threshold: exit 2 before anything is written
    capsys.readouterr()
    for bad in (["--compare", str(tmp_path / "missing.json")], ["--compare", saved, "--threshold", "-1"]):
        assert top_cli.main(["bench", "--report-from", saved, *bad]) == 2, bad
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("fa-variants bench: error: "), (bad, err)
    # --threshold without --compare was dropped without a word (session 33's CLI break-it pass): one line, exit 2
    capsys.readouterr()
    assert top_cli.main(["bench", "--report-from", saved, "--no-charts", "--threshold", "3"]) == 2
    assert "--threshold applies to --compare only" in capsys.readouterr().err
    assert top_cli.main(["bench", "--decode", "--dry-run", "--threshold", "3"]) == 2


def test_a_rerun_removes_the_charts_it_did_not_rewrite(tmp_path):
    """Charts of an earlier run into the same folder that this run did not write (another dtype, --no-charts) are
    removed: bench.md links only this run's, and a chart left beside it described another run."""
    rep, _ = synthetic_report()
    out = tmp_path / "res"
    out.mkdir()
    for name in ("tflops-fp16-d64-causal.png", "memory.png", "mine.png"):
        (out / name).write_bytes(b"old")
    report.write_reports(rep, out, charts=False)
    assert sorted(p.name for p in out.glob("*.png")) == ["mine.png"]


@pytest.mark.parametrize("argv, message", [
    (["--decode", "--warmup", "5", "--rep", "7"], "--warmup, --rep do not apply to --decode"),
    (["--decode", "--input-sets", "3", "--fp8-rounds", "3", "--fp8-budget", "2"],
     "--input-sets, --fp8-rounds, --fp8-budget do not apply to --decode"),
    (["--peak-tbps", "3"], "--peak-tbps does not apply without --decode"),
    (["--peers-only", "--backends", "fa2"], "--backends does not apply to --peers-only"),
    (["--ours-only", "--peers", "sdpa-flash"], "--peers does not apply to --ours-only"),
    (["--no-memory", "--memory-seqlens", "1024"], "--memory-seqlens does not apply to --no-memory"),
    (["--memory-only", "--seqlens", "1024", "--causal", "true"], "--seqlens, --causal do not apply to --memory-only"),
    (["--fp8-status", "only", "--memory-only", "--warmup", "3"],
     "--memory-only, --warmup do not apply to --fp8-status only"),
    (["--fp8-rounds", "3"], "--fp8-rounds does not apply without the fp8 status table"),
    (["--dtypes", "e4m3", "--backends", "fa2", "--fp8-budget", "4"], "--fp8-budget does not apply without the fp8"),
])
def test_flags_the_chosen_run_does_not_read_are_refused(capsys, monkeypatch, argv, message):
    """A flag that the run asked for does not read was dropped without a word (a CLI break-it pass): --decode's own
    timing ignored --warmup / --rep / --input-sets and the fp8 status table's --fp8-rounds / --fp8-budget, the sweep
    --peak-tbps, --peers-only the --backends given, --no-memory --memory-seqlens, --memory-only the sweep's --seqlens
    and --causal, --fp8-status only the sweep's and the memory table's flags, and the fp8 status rounds and budget were
    taken where that table does not run. Now one line naming them, exit 2, as session 28 did for the two tables."""
    monkeypatch.setattr(bench_cli, "_cuda_available", lambda: False)
    assert top_cli.main(["bench", "--dry-run", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("fa-variants bench: error: ") and message in err, err


@pytest.mark.parametrize("argv", [
    ["--dtypes", "e4m3", "--fp8-rounds", "3", "--fp8-budget", "5"], ["--fp8-status", "only", "--fp8-rounds", "3"],
    ["--memory-only", "--dtypes", "fp16", "--head-dims", "128", "--backends", "fa2", "--peers", "sdpa-math",
     "--memory-seqlens", "1024", "--no-charts"],
    ["--dtypes", "e4m3", "--fp8-status", "only", "--head-dims", "64", "--seqlens", "4096", "--causal", "both",
     "--no-memory", "--no-charts"],
    ["--decode", "--peak-tbps", "3.35", "--quick", "--no-progress"],
    ["--ours-only", "--backends", "fa2", "--no-memory", "--warmup", "5", "--rep", "7", "--input-sets", "2"],
])
def test_flags_the_chosen_run_reads_are_taken(capsys, monkeypatch, argv):
    """The combinations of the GPU-host scripts and the README (and their like) are not refused."""
    monkeypatch.setattr(bench_cli, "_cuda_available", lambda: False)
    assert top_cli.main(["bench", "--dry-run", *argv]) == 0, capsys.readouterr().err


def test_decode_out_that_cannot_be_made_stops_before_measuring(tmp_path, capsys, monkeypatch):
    """`bench --decode --out PATH` where PATH cannot be a folder (a file there): one line before any case is measured;
    the folder was made after the whole table (minutes on a GPU), whose JSON was then lost."""
    from fa_variants.bench import decode

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    measured = []
    monkeypatch.setattr(decode, "implementations", lambda ragged: {})
    monkeypatch.setattr(decode, "measure", lambda case, impls, peak, ragged: measured.append(case) or [])
    blocker = tmp_path / "a file"
    blocker.write_text("", encoding="utf-8")
    argv = ["bench", "--decode", "--decode-nk", "1024", "--decode-nq", "1", "--decode-batch", "1",
            "--decode-head-dims", "64", "--peak-tbps", "3"]
    assert top_cli.main([*argv, "--out", str(blocker / "decode")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"fa-variants bench: error: --out {blocker / 'decode'}: ") and \
        measured == [], err
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    assert top_cli.main([*argv, "--out", str(tmp_path / "d")]) == 0 and len(measured) == 2  # two GQA cases
    assert (tmp_path / "d" / "decode.json").is_file() and (tmp_path / "d" / "decode.md").is_file()
