"""fa_variants.bench.fp8status (issue 10's status table of `fa-variants bench --dtypes e4m3`) on the CPU: the problems'
order, the row of a paired run on fake timings (tests/test_paired.py's FakeGpu: a wandering clock, per-burst noise),
the targets' PASS / MISS lines, the time budget, and the CLI (--fp8-status only / auto / --dry-run) with a fake
measurement. No GPU."""
import json
import math

import pytest
from helpers import load_script
from test_paired import FakeGpu

from fa_variants import cli as top_cli
from fa_variants.bench import cli as bench_cli
from fa_variants.bench import fp8status, paired
from fa_variants.bench.fp8status import BF16, CALL, FA4, FP8, QUANT, SINGLE, Problem


def fake_run(problem, true_ms, seed=0, rounds=6):
    """fp8status.summarise of a paired run of fake entries whose fn() returns their true ms per call."""
    entries = [paired.Entry(n, lambda t=t: t) for n, t in true_ms.items()]
    res = paired.paired_ab(entries, BF16, FakeGpu(seed=seed), rounds=rounds, cycles=4, burst_ms=10, warmup_ms=100,
                           seed=seed)
    return fp8status.summarise(problem, res, sanity={FP8: 0.05, SINGLE: 0.05, CALL: 0.05})


def ms_at(problem, rate_tflops):
    """The ms per call that gives ``rate_tflops`` on this problem."""
    return problem.flops / (rate_tflops * 1e9)


def test_order_puts_the_core_first():
    """Largest N non-causal at every head_dim, then its causal D 128, then the rest (larger N, non-causal first);
    head dims fa3-fp8 does not have are dropped."""
    got = fp8status.problems((64, 128, 256, 32), (4096, 16384), (False, True))
    assert [(p.head_dim, p.seqlen, p.causal) for p in got[:4]] == [
        (64, 16384, False), (128, 16384, False), (256, 16384, False), (128, 16384, True)]
    assert len(got) == 12 and {p.head_dim for p in got} == {64, 128, 256}
    assert [p.seqlen for p in got[4:]] == [16384, 16384] + [4096] * 6
    assert fp8status.order([Problem(64, 4096, True)]) == [Problem(64, 4096, True)]  # causal core without 128


def test_problem_shape_is_the_benchmarks():
    p = Problem(128, 4096, True)
    assert (p.batch, p.heads) == (4, 16) and p.flops == pytest.approx(4 * 4 * 16 * 4096 ** 2 * 128 / 2)


@pytest.mark.parametrize("seed", [0, 1])
def test_row_from_a_paired_run(seed):
    """Kernel at 1.45x bf16 fa3, single accumulator 8% faster than it, pass + kernel 1.2x bf16: the row's TFLOP/s,
    quantisation us, ratios (paired medians) and two-level cost come out near the true values under 6% clock wander."""
    p = Problem(128, 16384, False)
    bf16 = ms_at(p, 700)
    true = {BF16: bf16, FP8: bf16 / 1.45, SINGLE: bf16 / 1.45 / 1.08, QUANT: 0.15, CALL: bf16 / 1.2,
            FA4: bf16 / 1.05}
    row = fake_run(p, true, seed)
    assert row["fp8_over_bf16"] == pytest.approx(1.45, rel=0.02)
    assert row["call_over_bf16"] == pytest.approx(1.2, rel=0.02)
    assert row["fp8_over_fa4"] == pytest.approx(1.45 / 1.05, rel=0.02)
    assert row["two_level_cost"] == pytest.approx(0.08, abs=0.015)
    assert row["quant_us"] == pytest.approx(150, rel=0.08)
    assert row["tflops"][FP8] == pytest.approx(700 * 1.45, rel=0.08) and QUANT not in row["tflops"]
    assert len(row["ratios"]["fp8_over_bf16"]["rounds"]) == 6 and row["aa_band"] < 0.02
    assert row["clocks"][FP8][0] > 0 and fp8status.sanity_ok(row)
    json.dumps(row)  # the JSON file's content


def rows_for(rates: dict, fp8_over_bf16: float, cost: float, call_over_bf16: float):
    """Synthetic rows (no paired run) per (head_dim, seqlen, causal): bf16 at ``rates[head_dim]`` TFLOP/s."""
    out = []
    for (d, n, c), bf16 in rates.items():
        p = Problem(d, n, c)
        tf = {BF16: bf16, FP8: bf16 * fp8_over_bf16, CALL: bf16 * call_over_bf16}
        out.append(dict(head_dim=d, seqlen=n, causal=c, batch=p.batch, heads=p.heads, flops=p.flops,
                        ms={k: p.flops / (v * 1e9) for k, v in tf.items()}, clocks={FP8: (1650.0, 680.0)},
                        failed={}, sanity={FP8: 0.05}, tflops=tf, fp8_tflops=tf[FP8], quant_us=120.0,
                        ratios={"fp8_over_bf16": None, "single_over_fp8": None}, fp8_over_bf16=fp8_over_bf16,
                        call_over_bf16=call_over_bf16, fp8_over_fa4=None, two_level_cost=cost, aa_band=0.01))
    return out


def test_targets_pass_and_miss():
    """1100 at D 256 N 16k (non-causal only), 1.4x at 128, 1.3x at 64, cost <= 5%, pass + kernel > bf16 at N >= 4k."""
    rates = {(256, 16384, False): 760, (256, 16384, True): 700, (128, 16384, False): 700, (64, 4096, False): 500,
             (64, 1024, False): 400}
    lines = fp8status.targets(rows_for(rates, 1.45, 0.06, 1.1))
    by = {t.text: line for t, line in zip(fp8status.TARGETS, lines)}
    assert by["kernel alone >= 1100 TFLOP/s at D 256, N 16k (non-causal; an H200 figure)"].startswith("PASS")  # 760 x 1.45 = 1102
    assert "D256 N16k 1102" in by["kernel alone >= 1100 TFLOP/s at D 256, N 16k (non-causal; an H200 figure)"]
    assert by["kernel alone >= 1.4x bf16 fa3 at D 128"].startswith("PASS")
    assert by["kernel alone >= 1.3x bf16 fa3 at D 64"].startswith("PASS")
    assert by["two-level cost <= 5%"].startswith("MISS (5 of 5)") and "+6.0%" in by["two-level cost <= 5%"]
    call = by["pass + kernel faster than bf16 fa3 for N >= 4k"]
    assert call.startswith("PASS") and "N1k" not in call  # the N 1k problem is not the target's
    lines = fp8status.targets(rows_for({(128, 4096, True): 600}, 1.39, 0.05, 0.99))
    assert lines[0].startswith("NOT MEASURED") and lines[1].startswith("MISS (1 of 1)")
    assert lines[2].startswith("NOT MEASURED") and lines[3].startswith("PASS") and lines[4].startswith("MISS")


def test_report_table_targets_and_sanity():
    rows = rows_for({(128, 16384, False): 700, (64, 16384, False): 520}, 1.3, 0.04, 1.1)
    rows[1]["sanity"] = {FP8: math.inf}
    rows[0]["failed"] = {FA4: "not importable (ModuleNotFoundError)"}  # the peer: reported, not BAD
    text = fp8status.report(rows, [Problem(256, 4096, True)], dict(rounds=6, cycles=4, burst_ms=10, warmup_ms=500))
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 3 and table[1].startswith("| 64 | 16384 | 0 | 676 | 120.0 | 572 | 520 | - | 1.30x")
    assert "| BAD inf |" in table[1] and "| ok 5.0e-02 |" in table[2] and "1650/-" in table[2]
    assert "sanity (outputs finite" in text and "BAD at D64 N16384 c0" in text
    assert "not run (time budget): D=256 N=4096 causal" in text
    assert "not timed: flash_attn_4: not importable" in text
    assert not fp8status.sanity_ok(rows[1]) and fp8status.sanity_ok(rows[0])
    rows[0]["failed"] = {SINGLE: "RuntimeError: boom"}
    assert not fp8status.sanity_ok(rows[0])


def test_run_keeps_to_the_budget():
    """A problem starts only while time spent + the longest so far fits; the rest are skipped, in order."""
    now = [0.0]

    def measure(p):
        now[0] += 10.0
        return rows_for({(p.head_dim, p.seqlen, p.causal): 600}, 1.3, 0.05, 1.1)[0]

    items = fp8status.problems((64, 128, 256), (4096, 16384), (False, True))
    rows, skipped = fp8status.run(items, measure, budget_s=35, log=lambda _: None, clock=lambda: now[0])
    assert len(rows) == 3 and skipped == items[3:]
    rows, skipped = fp8status.run(items, measure, budget_s=0, log=lambda _: None, clock=lambda: now[0])
    assert len(rows) == 12 and not skipped


def test_a_problem_that_raises_is_a_failed_row_and_the_rest_run(capsys):
    def measure(p):
        if p.head_dim == 128:
            raise RuntimeError("bf16 fa3 did not run")
        return rows_for({(p.head_dim, p.seqlen, p.causal): 600}, 1.3, 0.05, 1.1)[0]

    items = fp8status.problems((64, 128), (16384,), (False,))
    rows, _ = fp8status.run(items, measure, log=print)
    assert [r["failed"] for r in rows] == [{}, {"problem": "RuntimeError: bf16 fa3 did not run"}]
    text = fp8status.report(rows, [], {})
    assert "| 128 | 16384 | 0 | - |" in text and "BAD at D128 N16384 c0" in text
    assert "not timed: problem: RuntimeError: bf16 fa3 did not run" in text


def test_single_accumulator_configs_are_the_scripts():
    """The two-level cost's references are the configs scripts/fa3_fp8_speed_ab.py times under these names (64 / 128:
    "single"; 256: "single_overlap" of its FP8TURN set, session 11's twolevel run)."""
    ab = load_script("fa3_fp8_speed_ab")
    assert fp8status.SINGLE_ACCUMULATOR[64] == ab.FLIP_VARIANTS[64]["single"]
    assert fp8status.SINGLE_ACCUMULATOR[128] == ab.FLIP_VARIANTS[128]["single"]
    assert fp8status.SINGLE_ACCUMULATOR[256] == ab.FP8TURN_VARIANTS[256]["single_overlap"]


@pytest.fixture
def fake_status(monkeypatch):
    """A CUDA sm90 'GPU' and fp8status.measure replaced by synthetic rows (bf16 600, fp8 1.35x, cost 4%)."""
    import torch

    monkeypatch.setattr(bench_cli, "_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake H200")
    seen = []

    def measure(p, **settings):
        seen.append((p, settings))
        return rows_for({(p.head_dim, p.seqlen, p.causal): 600}, 1.35, 0.04, 1.1)[0]

    monkeypatch.setattr(fp8status, "measure", measure)
    return seen


def test_cli_fp8_status_only(fake_status, tmp_path, capsys):
    code = top_cli.main(["bench", "--fp8-status", "only", "--head-dims", "128,256", "--causal", "false",
                         "--out", str(tmp_path), "--fp8-rounds", "7"])
    printed = capsys.readouterr().out
    assert code == 0 and "## issue 10 targets" in printed
    assert [p.label for p, _ in fake_status] == ["D=128 N=16384 non-causal", "D=256 N=16384 non-causal",
                                                 "D=128 N=4096 non-causal", "D=256 N=4096 non-causal"]
    assert fake_status[0][1] == dict(rounds=7, cycles=4, burst_ms=10.0, warmup_ms=500.0)
    saved = json.loads((tmp_path / "fp8_status.json").read_text(encoding="utf-8"))
    assert len(saved["rows"]) == 4 and (tmp_path / "fp8_status.md").read_text(encoding="utf-8") in printed
    assert not (tmp_path / "bench.json").exists()  # no sweep, no memory table
    # the card is named (its targets were set on an H200: session 35 ran on an H100)
    assert saved["gpu"] == "Fake H200" and "\nGPU: Fake H200\n" in printed and "(non-causal; an H200 figure)" in printed


def test_cli_fp8_status_out_that_cannot_be_made_stops_before_measuring(fake_status, tmp_path, capsys):
    """--out where no folder can be made (a file there): one line naming --out before any problem is measured; the
    folder was made after the whole table (minutes on a GPU), whose results were then lost (a review finding)."""
    blocker = tmp_path / "a file"
    blocker.write_text("", encoding="utf-8")
    code = top_cli.main(["bench", "--fp8-status", "only", "--head-dims", "64", "--seqlens", "4096", "--causal",
                         "true", "--out", str(blocker / "status")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and fake_status == [] and "\n" not in err, err
    assert err.startswith(f"fa-variants bench: error: --out {blocker / 'status'}: "), err


def test_cli_fp8_status_bad_sanity_exits_1(fake_status, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fp8status, "measure", lambda p, **_: dict(
        rows_for({(p.head_dim, p.seqlen, p.causal): 600}, 1.35, 0.04, 1.1)[0], sanity={FP8: math.nan}))
    code = top_cli.main(["bench", "--fp8-status", "only", "--head-dims", "64", "--seqlens", "4096", "--causal",
                         "true", "--out", str(tmp_path)])
    assert code == 1 and "BAD at D64 N4096 c1" in capsys.readouterr().out


def test_cli_status_problems_and_dry_run(capsys, monkeypatch):
    """auto: with e4m3 in --dtypes and fa3-fp8 among our backends; off / bf16 only / --peers-only: none."""
    def parse(*argv):
        return top_cli.build_parser().parse_args(["bench", *argv])

    assert len(bench_cli.fp8_status_problems(parse("--dtypes", "bf16,e4m3"))) == 12
    assert len(bench_cli.fp8_status_problems(parse("--dtypes", "e4m3", "--quick"))) == 8  # D 64, 128
    for argv in (("--dtypes", "bf16"), ("--dtypes", "e4m3", "--fp8-status", "off"),
                 ("--dtypes", "e4m3", "--peers-only"), ("--dtypes", "e4m3", "--backends", "fa3")):
        assert bench_cli.fp8_status_problems(parse(*argv)) == [], argv
    monkeypatch.setattr(bench_cli, "_cuda_available", lambda: False)
    assert top_cli.main(["bench", "--dtypes", "e4m3", "--fp8-status", "only", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("0 cases") and "fp8 status (issue 10), 6 paired rounds, core first: D=64 N=16384" in out


@pytest.mark.parametrize("bad", ["0", "x"])
def test_fp8_rounds_must_be_positive(bad, capsys):
    with pytest.raises(SystemExit):
        top_cli.build_parser().parse_args(["bench", "--fp8-rounds", bad])
    assert "--fp8-rounds" in capsys.readouterr().err
