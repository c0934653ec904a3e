"""`fa-variants info` and `fa-variants demo`, in-process and as a user would run them."""
import json
import subprocess
import sys

import pytest
import torch

from fa_variants import cli, demo, info


def test_info_tables(capsys):
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    for word in ("torch", "nvidia-cutlass-dsl", "fa2", "fa3", "reference", "backend='auto' on", "sm_90"):
        assert word in text


def test_info_json_as_a_user_runs_it():
    done = subprocess.run([sys.executable, "-m", "fa_variants.cli", "info", "--json"], capture_output=True,
                          text=True, timeout=300, check=True)
    facts = json.loads(done.stdout)
    assert facts["versions"]["torch"] == torch.__version__
    assert {b["name"] for b in facts["backends"]} == {"fa3", "fa3-fp8", "fa2", "fa1", "reference"}
    picks = facts["auto_picks"]
    target = next(iter(picks))
    assert len(picks[target]) == 9  # fp16, bf16, fp8 x head dims 64, 128, 256
    assert all(p["reason"] for p in picks[target])
    if not torch.cuda.is_available():
        assert target == "cpu" and {p["backend"] for p in picks["cpu"] if p["dtype"] != "fp8"} == {"reference"}
        assert "sm_90 (not present here)" in picks


def test_auto_picks_explain_failures():
    picks = info.auto_picks(None)
    fp8 = [p for p in picks if p["dtype"] == "fp8"]
    assert all(p["backend"] is None and "float8_e4m3fn" in p["reason"] for p in fp8)


@pytest.mark.parametrize("causal", [True, False])
def test_demo_small_on_the_cpu(capsys, causal):
    argv = ["demo", "--seqlen", "96", "--heads", "4", "--head-dim", "64", "--seed", "1"]
    assert cli.main(argv + ([] if causal else ["--no-causal"])) == 0
    text = capsys.readouterr().out
    assert "PASS" in text and "backend" in text
    if not torch.cuda.is_available():
        assert "reference path" in text and "CPU" in text


def test_demo_fails_when_the_output_is_wrong(capsys, monkeypatch):
    from fa_variants import reference
    right = reference.run
    monkeypatch.setattr(reference, "run", lambda q, k, v, **kw: (right(q, k, v, **kw)[0] * 1.01,
                                                                   right(q, k, v, **kw)[1]))
    assert cli.main(["demo", "--seqlen", "64", "--heads", "2", "--backend", "reference"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_demo_uses_a_real_input_when_one_is_available(capsys, monkeypatch):
    q = torch.randn(1, 40, 9, 64, dtype=torch.bfloat16)
    k, v = torch.randn(1, 40, 3, 64, dtype=torch.bfloat16), torch.randn(1, 40, 3, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(demo, "load_real_input",
                        lambda device, dtype: demo.DemoInput(q, k, v, True, "captured: a test layer"))
    assert cli.main(["demo"]) == 0
    assert "captured: a test layer" in capsys.readouterr().out
    assert cli.main(["demo", "--random", "--seqlen", "32", "--heads", "2"]) == 0
    assert "random" in capsys.readouterr().out


def test_load_real_input_hook_exists():
    assert demo.load_real_input(torch.device("cpu")) is None or isinstance(
        demo.load_real_input(torch.device("cpu")), demo.DemoInput)


def test_attention_flops():
    q = torch.zeros(2, 4, 3, 8)
    k = torch.zeros(2, 6, 3, 8)
    full = demo.DemoInput(q, k, k, False, "")
    causal = demo.DemoInput(q, k, k, True, "")
    assert demo.attention_flops(full) == 4 * 2 * 3 * 8 * 4 * 6
    assert demo.attention_flops(causal) == 4 * 2 * 3 * 8 * (3 + 4 + 5 + 6)


# ------------------------------------------------------------------------------- bad arguments: one line

@pytest.mark.parametrize("argv, message", [
    (["demo", "--backend", "bogus", "--seqlen", "16"], "fa-variants demo: error: unknown backend 'bogus'"),
    (["demo", "--backend", "fa2", "--seqlen", "16"] if not torch.cuda.is_available() else
     ["demo", "--backend", "fa9", "--seqlen", "16"], "fa-variants demo: error: "),
    (["io", "--N", "64", "--sram-kb", "0.001"], "fa-variants io: error: M and d must be >= 1"),
    (["fp8-study", "--quick", "--dists", "normal", "--seqlens", "16", "--out", "/proc/no/such/dir"],
     "fa-variants fp8-study: error: .*No such file or directory"),
])
def test_a_sub_command_value_error_is_one_line(capsys, argv, message):
    """A ValueError / OSError inside a sub-command: one stderr line, exit status 2, no traceback."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert __import__("re").match(message, err)


@pytest.mark.parametrize("argv, flag", [
    (["demo", "--seqlen", "0"], "--seqlen"), (["demo", "--heads", "-1"], "--heads"),
    (["io", "--N", "0"], "--N"), (["io", "--d", "-64"], "--d"), (["io", "--elem-bytes", "0"], "--elem-bytes"),
    (["io", "--sram-kb", "0"], "--sram-kb"), (["io", "--fa2-tiles", "0", "64"], "--fa2-tiles"),
    (["fp8-study", "--quick", "--head-dim", "0"], "--head-dim"), (["fp8-study", "--heads", "0"], "--heads"),
    (["fp8-study", "--seqlens", "0"], "--seqlens"), (["fp8-study", "--batch", "0"], "--batch"),
])
def test_sizes_must_be_positive(capsys, argv, flag):
    """Sizes of 0 or below are argparse errors (were ZeroDivisionError / RuntimeError tracebacks, or, for
    fp8-study --heads 0, silently the default)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert f"argument {flag}: " in capsys.readouterr().err
