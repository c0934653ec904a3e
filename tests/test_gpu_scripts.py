"""The GPU-host scripts' CPU-side logic: scripts/sanitize.py's summary lines, the shell scripts (they parse, their
--help, scripts/steps.sh's shared pieces with a fake nvidia-smi), the Python scripts' plans and summaries."""
import collections
import sys
import dataclasses
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


def _sanitize():
    return load_script("sanitize")


@pytest.mark.parametrize("rc, log, verdict, ok", [
    (0, "x: ok\nCALLS 20 FAILED 0\n========= ERROR SUMMARY: 0 errors\n", "clean (20 calls", True),
    (9, "CALLS 20 FAILED 0\n========= ERROR SUMMARY: 3 errors\n", "3 ERRORS (20 calls", False),
    (1, "CALLS 20 FAILED 2\n========= ERROR SUMMARY: 0 errors\n", "2 WRONG OUTPUTS", False),
    (None, "a: ok\n", "TIMED OUT (no calls finished", False),
    (1, "Traceback ...\n========= ERROR SUMMARY: 0 errors\n", "FAILED (exit 1", False),
])
def test_sanitize_summary_line(rc, log, verdict, ok):
    line, got_ok = _sanitize()._summary("racecheck", "fa3", rc, log, 12.3)
    assert line.startswith("racecheck fa3") and verdict in line and got_ok is ok and "\n" not in line


SHELL_SCRIPTS = sorted(p.name for p in (ROOT / "scripts").glob("*.sh"))


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=True)


@pytest.mark.parametrize("script", [s for s in SHELL_SCRIPTS if s != "steps.sh"])
def test_shell_script_help(script, tmp_path):
    """`scripts/X.sh --help` prints X's header comment (steps.sh's help_from_header / print_header) and exits 0
    before anything else: no folder made, no nvidia-smi, no git."""
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["PATH"] = f"{_fake_bin(tmp_path / 'bin', nvidia_smi='exit 99')}:{env['PATH']}"
    work = tmp_path / "work"
    work.mkdir()
    run = subprocess.run(["bash", str(ROOT / "scripts" / script), "--help"], cwd=work, env=env, capture_output=True,
                         text=True, timeout=30)
    first = (ROOT / "scripts" / script).read_text().splitlines()[1].removeprefix("# ")
    assert run.returncode == 0 and run.stderr == "" and run.stdout.splitlines()[0] == first
    assert "set -" not in run.stdout and list(work.iterdir()) == []


#: GPU scripts that read their own arguments before session_setup (help_from_header first, session_setup later)
_OWN_PREAMBLE = {"pending_gpu.sh", "study_gpu.sh"}


@pytest.mark.parametrize("script", [s for s in SHELL_SCRIPTS if s.endswith("_gpu.sh")])
def test_gpu_script_preamble(script):
    """Every GPU script runs under `set -uo pipefail`, sources steps.sh and, before its first step, answers --help
    and sets up its session through steps.sh (gpu_session, or help_from_header first then session_setup); none
    copies the xdist probe (steps.sh's xdist_flag); its last command is steps_exit, so its exit code is its steps'
    and not its closing summary's (session 11: oob_gpu.sh exited 1 with memcheck clean, its last grep found nothing)."""
    lines = [line for line in (ROOT / "scripts" / script).read_text().splitlines() if not line.startswith("#")]
    text = "\n".join(lines)
    start = lines.index("set -uo pipefail")
    assert lines[start + 1].startswith("source ") and "steps.sh" in lines[start + 1], script
    first_step = next((i for i, line in enumerate(lines) if re.match(r"\s*step ", line)), len(lines))
    if script in _OWN_PREAMBLE:
        assert lines[start + 1].endswith('; help_from_header "$@"') or "help_from_header" in lines[start + 2]
        assert any("session_setup" in line for line in lines[:first_step]), script
    else:
        assert re.fullmatch(r'out=.*; gpu_session "?\$(out|work)[^ ]*"? "\$@"(; .*)?', lines[start + 2]), lines[start + 2]
        assert "help_from_header" not in text and "session_setup" not in text, script
    assert "import xdist" not in text, script
    last = [line.strip() for line in lines if line.strip()][-1]
    assert last == "steps_exit", (script, last)


def test_steps_sh_exit_code_is_the_steps(tmp_path):
    """steps.sh steps_exit: exit 1 naming every step whose rc was not 0 (a background step's and step_failed's
    too), whatever the summary commands after them returned; exit 0 when every step passed, even after a grep that
    found nothing."""
    env = dict(os.environ, PATH=f"{_fake_bin(tmp_path / 'bin', _FAKE_SMI)}:{os.environ['PATH']}")
    driver = tmp_path / "driver.sh"
    driver.write_text(f"""set -uo pipefail
source {ROOT}/scripts/steps.sh
session_setup "$1/logs"
step first 5 true
if [[ $2 == fail ]]; then
  step bad 5 bash -c 'exit 3'
  ( step behind 5 false ) &
  wait
  step_failed later skipped
fi
echo "== summary"; grep -q "no such line" "$LOGS/first.log"
steps_exit
""")
    runs = {mode: subprocess.run(["bash", str(driver), str(tmp_path / mode), mode], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=30) for mode in ("pass", "fail")}
    assert runs["pass"].returncode == 0, runs["pass"].stdout + runs["pass"].stderr
    assert "not passed" not in runs["pass"].stdout
    fail = runs["fail"]
    assert fail.returncode == 1 and fail.stdout.splitlines()[-1] == \
        "== not passed: bad (rc=3) behind (rc=1) later (skipped)", fail.stdout + fail.stderr


def _fake_bin(folder, nvidia_smi):
    """A folder holding an executable `nvidia-smi` that runs the bash text NVIDIA_SMI."""
    folder.mkdir(exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text("#!/usr/bin/env bash\n" + nvidia_smi + "\n")
    smi.chmod(0o755)
    return folder


_FAKE_SMI = """if [[ " $* " == *" -lms "* ]]; then
  echo timestamp, index, clocks.sm; while true; do echo "now, 0, 1980 MHz"; sleep 0.05; done
fi
printf 'index, name\\n0, FAKE H200\\n'"""


def _gone_within(pid, seconds: float) -> bool:
    """The process is gone (``_alive`` false) within `seconds` (polled: a loaded machine may need more than a
    fixed short sleep for the logger's watchdog to act)."""
    import time

    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _alive(pid):
    """The process runs (a zombie left to a parent that does not reap counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_steps_sh_session(tmp_path):
    """scripts/steps.sh without a GPU (a fake nvidia-smi): session_setup writes commit.txt, gpu.txt and starts
    clocks.csv; step logs each command, says its exit status (124 when its limit cut it) and, with STEP_TAIL,
    the log's tail; pack_logs stops the clock logger and packs the folder; a bare `wait` does not wait for
    the logger; the logger stops when a script exits without pack_logs."""
    import tarfile
    import time

    env = dict(os.environ, PATH=f"{_fake_bin(tmp_path / 'bin', _FAKE_SMI)}:{os.environ['PATH']}")
    driver = tmp_path / "driver.sh"
    driver.write_text(f"""set -uo pipefail
source {ROOT}/scripts/steps.sh
session_setup "$1/logs"
echo "clocks $CLOCKS_PID"
step ok 5 bash -c 'echo hello; exit 3'
step slow 1 sleep 5
STEP_TAIL=1 step tailed 5 printf 'a\\nb\\n'
wait
sleep 0.3
[[ $2 == pack ]] && pack_logs "$1/logs.tgz"
echo "after $CLOCKS_PID"
""")
    run = subprocess.run(["bash", str(driver), str(tmp_path / "out"), "pack"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=30)
    lines = run.stdout.splitlines()
    pid = int(lines[0].split()[1])
    # the seconds a step took depend on the machine's load (CI: 2 busy cores): the pattern, not the value
    expected = [r"== ok: rc=3 in \d+s", r"== slow: rc=124 in \d+s", r"== tailed \(limit 5s\)", r"== tailed: rc=0 in \d+s",
                "b", "after "]
    assert len(lines) == 1 + len(expected) and all(re.fullmatch(e, line) for e, line in zip(expected, lines[1:])), \
        run.stdout + run.stderr
    logs = tmp_path / "out" / "logs"
    assert (logs / "ok.log").read_text() == "hello\n" and (logs / "tailed.log").read_text() == "a\nb\n"
    assert (logs / "commit.txt").read_text() == _expected_commit(ROOT) and "FAKE H200" in (logs / "gpu.txt").read_text()
    assert _gone_within(pid, 5.0) and "now, 0, 1980 MHz" in (logs / "clocks.csv").read_text()
    with tarfile.open(tmp_path / "out" / "logs.tgz") as tar:
        assert {"logs/ok.log", "logs/slow.log", "logs/commit.txt", "logs/gpu.txt", "logs/clocks.csv"} <= set(tar.getnames())

    run = subprocess.run(["bash", str(driver), str(tmp_path / "out2"), "no"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=30)
    pid = int(run.stdout.split()[1])
    assert _gone_within(pid, 5.0) and not (tmp_path / "out2" / "logs.tgz").exists()


def _expected_commit(root) -> str:
    """What steps.sh write_commit writes for the tree at root (test_steps_sh_commit_label)."""
    given = root / ".gpu" / "commit.txt"
    first = given.read_text().splitlines()[0] if given.is_file() and given.read_text().strip() else ""
    if first:
        return f"{first} (from .gpu/commit.txt)\n"
    head = subprocess.run(["git", "log", "--oneline", "-1"], cwd=root, capture_output=True, text=True).stdout.strip()
    return f"{head} (git on this host)\n"


def test_steps_sh_commit_label(tmp_path):
    """steps.sh write_commit (session_setup's commit.txt): the first line of .gpu/commit.txt labelled "(from
    .gpu/commit.txt)" when the caller wrote one (a GPU host's copied git metadata can be older than the tree: session
    11 said 813a508 for c8a3a0a), else the tree's `git log --oneline -1` labelled "(git on this host)"; an empty file
    counts as none. pending_gpu.sh's help says to write it before a call."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "steps.sh").write_text((ROOT / "scripts" / "steps.sh").read_text())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "stale metadata"], cwd=tmp_path, check=True)
    stale = subprocess.run(["git", "log", "--oneline", "-1"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()

    def label():
        out = tmp_path / "commit.txt"
        subprocess.run(["bash", "-c", f'source "{scripts}/steps.sh"; write_commit "{out}"'], cwd=tmp_path, check=True,
                       timeout=30)
        return out.read_text()

    assert label() == f"{stale} (git on this host)\n" == _expected_commit(tmp_path)
    (tmp_path / ".gpu").mkdir()
    (tmp_path / ".gpu" / "commit.txt").write_text("")
    assert label() == f"{stale} (git on this host)\n"
    (tmp_path / ".gpu" / "commit.txt").write_text("c8a3a0a fa3-fp8 head_dim 256: variant\n")
    assert label() == "c8a3a0a fa3-fp8 head_dim 256: variant (from .gpu/commit.txt)\n" == _expected_commit(tmp_path)
    assert "git log --oneline -1 > .gpu/commit.txt" in (ROOT / "scripts" / "pending_gpu.sh").read_text()


def test_fp8flip_plan_and_verdict():
    """scripts/fa3_fp8_speed_ab.py --set fp8flip on the CPU: its precompile covers every timed variant in both causal
    modes (the tests run both) and test_every_recipe's head_dim 64 recipes; the flip's pass line fails when the new
    defaults fall below 0.97x the old ones in any problem, and passes otherwise."""
    ab = load_script("fa3_fp8_speed_ab")
    jobs = ab.compile_jobs([64, 128, 256], [False], tests=True, variant_set="fp8flip")
    for D, variants in ab.FLIP_VARIANTS.items():
        for change in variants.values():
            for causal in (False, True):
                assert ("fp8", D, causal, ab._freeze(change)) in jobs, (D, change, causal)
    assert {d for kind, d, _causal, change in jobs if kind == "recipe" and change[0] == "float16"} == {64}
    good = {(64, 4096, False): {"new": 103.0, "old": 100.0}, (256, 16384, True): {"new": 98.0, "old": 100.0}}
    assert ab.flip_lines(good)[-1].endswith("PASS") and "geometric mean over 2 problems" in ab.flip_lines(good)[-2]
    bad = {**good, (128, 4096, True): {"new": 96.0, "old": 100.0}}
    assert "FAIL" in ab.flip_lines(bad)[-1] and "(128, 4096, True)" in ab.flip_lines(bad)[-1]


def test_fa3_fp8_speed_ab_fp8small_set(capsys, monkeypatch):
    """--set fp8small: head_dim 64/128 only; every variant tests/test_fa3_fp8_speed_gpu.py
    runs as "fp8small-d<D>-<name>" is the timed one of that name, compiled in both causal modes, a valid config."""
    import test_fa3_fp8_speed_gpu as gpu_tests

    ab = load_script("fa3_fp8_speed_ab")
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", "fp8small"])
    assert ab.main() == 0
    out = capsys.readouterr().out
    assert "set: fp8small" in out and "head dims [64, 128]" in out
    jobs = set(ab.compile_jobs([64, 128], [False], variant_set="fp8small"))
    names = {f"fp8small-d{D}-{n}" for D, variants in ab.FP8SMALL_VARIANTS.items() for n in variants if n != "new"}
    assert names == set(gpu_tests.FP8SMALL_VARIANTS)
    for name, (D, change) in gpu_tests.FP8SMALL_VARIANTS.items():
        assert ab.FP8SMALL_VARIANTS[D][name.split("-", 2)[2]] == change, name
        ab.kernel_config(D, change).check(D)
        for causal in (False, True):
            assert ("fp8", D, causal, ab._freeze(change)) in jobs, (name, causal)
    tf = dict(new=800.0, c4=850.0, m192_c4=930.0, single_m192_c4=960.0, bf16_fa3=650.0)
    speed = [dict(head_dim=128, seqlen=4096, causal=False, impl=n, tflops=t) for n, t in tf.items()]
    text = ab.two_level_target_lines(speed)
    assert "- d128 N4096 causal=0: m192_c4 930 TFLOP/s = 1.43x bf16 fa3 (target >= 1.4): met, two-level cost +3.2%" in text
    speed[2]["tflops"] = 900.0
    assert "m192_c4 900 TFLOP/s = 1.38x bf16 fa3 (target >= 1.4): NOT met, two-level cost +6.7%" in ab.two_level_target_lines(speed)


def test_fa3_fp8_speed_ab_fp8d256b_halves_cost(capsys, monkeypatch):
    """--set fp8d256b: the plan, and the halves-cost lines: one MMA / two halves - 1 per
    schedule and problem, the default's two-level cost, the mean and the verdict on the session-7 hypothesis."""
    ab = load_script("fa3_fp8_speed_ab")
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", "fp8d256b", "--head-dims", "256"])
    assert ab.main() == 0
    assert "'old_halves', 'single', 'single_overlap', 'single_overlap_halves'" in capsys.readouterr().out
    tf = dict(new=1000.0, old=950.0, old_halves=880.0, single=1045.0, single_overlap=1150.0, single_overlap_halves=1030.0)
    speed = [dict(head_dim=256, seqlen=4096, causal=False, impl=n, tflops=t) for n, t in tf.items()]
    text = ab.halves_cost_lines(speed)
    assert ("- d256 N4096 causal=0: old_halves +8.0%, single_overlap_halves +11.7%; promotions in the serial steps "
            "(single / old - 1) +10.0%; default's two-level cost +15.0%") in text
    assert "- mean halves cost +9.8% over 2 pairs: hypothesis (>= 6%) SUPPORTED" in text
    speed[2]["tflops"], speed[5]["tflops"] = 940.0, 1140.0
    assert "hypothesis (>= 6%) REJECTED" in ab.halves_cost_lines(speed)


def _check_fp8_small_set_plan(capsys, monkeypatch, variant_set: str, table: str, tested: dict, untested=()):
    """scripts/fa3_fp8_speed_ab.py --plan --set `variant_set` (head_dim 64/128 only): every timed variant of its
    `table` is a valid config compiled in both causal modes and, but "new" and names starting with `untested`, run
    by tests/test_fa3_fp8_speed_gpu.py with the same change (`tested`: its tables); every GPU test of that table
    names a timed variant. Returns the loaded script."""
    import test_fa3_fp8_speed_gpu as gpu_tests

    ab = load_script("fa3_fp8_speed_ab")
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", variant_set])
    assert ab.main() == 0
    out = capsys.readouterr().out
    assert f"set: {variant_set}" in out and "head dims [64, 128]" in out
    jobs = set(ab.compile_jobs([64, 128], [False], variant_set=variant_set))
    timed = getattr(ab, table)
    for D, variants in timed.items():
        for name, change in variants.items():
            ab.kernel_config(D, change).check(D)
            if name != "new" and not name.startswith(untested):
                assert (D, change) in tested.values(), name
            for causal in (False, True):
                assert ("fp8", D, causal, ab._freeze(change)) in jobs, (name, causal)
    assert all(name.split("-", 2)[2] in timed[D] for name, (D, _) in getattr(gpu_tests, table).items())
    return ab


def test_fa3_fp8_speed_ab_fp8mid_set(capsys, monkeypatch):
    """--set fp8mid: head_dim 64/128 only; every timed two-level variant but the default and
    the overlap controls (ov*: configs timed before, no new code) is run by tests/test_fa3_fp8_speed_gpu.py with the same
    change (its fp8mid table, or session 6's fp8small one); all compiled in both causal modes, valid configs; the
    summary reports the two-level targets."""
    import test_fa3_fp8_speed_gpu as gpu_tests

    ab = _check_fp8_small_set_plan(capsys, monkeypatch, "fp8mid", "FP8MID_VARIANTS",
                                   {**gpu_tests.FP8SMALL_VARIANTS, **gpu_tests.FP8MID_VARIANTS}, ("single", "ov"))
    speed = [dict(head_dim=128, seqlen=4096, causal=False, impl=n, tflops=t)
             for n, t in dict(new=800.0, m192_look128h_c4=950.0, single_m192_c4=960.0, bf16_fa3=650.0).items()]
    assert "m192_look128h_c4 950 TFLOP/s = 1.46x bf16 fa3 (target >= 1.4): met, two-level cost +1.1%" in \
        ab.two_level_target_lines(speed, "fp8mid")
    # a variant with NaN in its output (a broken kernel) is the worst one, FAIL, and listed on its own line
    speed = [dict(r, spread=0.01) for r in speed]
    errors = [dict(head_dim=128, variant=n, causal=c, kernel_vs_emulation=float("nan") if n == "m192_look128h_c4" and c else 3e-3,
                   lse_max_diff=1e-4, kernel_vs_float64=1.0, emulation_vs_float64=1.0)
              for n in ("new", "m192_look128h_c4") for c in (False, True)]
    text = ab.speed_summary(speed, errors, "fp8mid")
    assert "worst nan (d128 m192_look128h_c4 causal=1): FAIL" in text and "- d128 m192_look128h_c4: 3.00e-03 / nan" in text


def test_fa3_fp8_speed_ab_fp8d128_set(capsys, monkeypatch):
    """--set fp8d128: head_dim 64/128 only; every timed variant but the default and the fp8mid
    control is run by tests/test_fa3_fp8_speed_gpu.py with the same change (FP8D128_VARIANTS); all compiled in both
    causal modes, valid configs; the per-variant accuracy lines and the two-level targets are in the summary."""
    import test_fa3_fp8_speed_gpu as gpu_tests

    ab = _check_fp8_small_set_plan(capsys, monkeypatch, "fp8d128", "FP8D128_VARIANTS",
                                   {**gpu_tests.FP8MID_VARIANTS, **gpu_tests.FP8D128_VARIANTS})
    speed = [dict(head_dim=128, seqlen=4096, causal=True, impl=n, tflops=t, spread=0.01)
             for n, t in dict(new=727.0, m192_look128h_c4=694.0, m192_look128h_c4_tail=735.0, bf16_fa3=602.0).items()]
    assert "m192_look128h_c4_tail 735 TFLOP/s = 1.22x bf16 fa3 (target >= 1.4): NOT met" in \
        ab.two_level_target_lines(speed, "fp8d128")
    errors = [dict(head_dim=128, variant=n, causal=c, kernel_vs_emulation=3e-3, lse_max_diff=1e-4, kernel_vs_float64=1.0,
                   emulation_vs_float64=1.0) for n in ("new", "m192_look128h_c4_tail") for c in (False, True)]
    assert "- d128 m192_look128h_c4_tail: 3.00e-03 / 3.00e-03" in ab.speed_summary(speed, errors, "fp8d128")
    # --drop (the script's guard after CUDA errors in its tests): those variants leave the timed set, "new" cannot
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", "fp8d128", "--drop", "tn128_tail",
                                     "m192_look128h_c4_tail"])
    monkeypatch.setitem(ab.SETS, "fp8d128", ab.SETS["fp8d128"])
    assert ab.main() == 0
    impls = capsys.readouterr().out
    assert "'m192_look128h_c4_tail'" not in impls and "'tn128_tail'" not in impls and "'m192_look128h_c4_tail_skip'" in impls
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", "fp8d128", "--drop", "new"])
    with pytest.raises(SystemExit):
        ab.main()


# session 8's fp8d128 logs (bench/h200-2026-12-01-s8): pytest --tb=line -rfE puts the error on a line of its own, so a
# FAILED line names the test only; the precompile's failures name the config
_S8_TEST_LOG = """\
/x/fa_variants/hopper/fa3_fp8.py:700: torch.AcceleratorError: CUDA error: an illegal instruction was encountered
FAILED tests/test_fa3_fp8_speed_gpu.py::test_fp8_variant_vs_emulation[fp8d128-d128-m192_look128h_c4_tail-1x1023x113x3x3-causal]
FAILED tests/test_fa3_fp8_speed_gpu.py::test_fp8_variant_vs_emulation[fp8d128-d64-tn128_tail-1x113x113x4x2-full]
FAILED tests/test_fa3_fp8_speed_gpu.py::test_fp8_tail_first_shared_rows[fp8d128-d128-m192_look128h_c4_tail_skip-1x300x500x2x2]
ERROR tests/test_fa3_fp8_speed_gpu.py::test_fp8_variant_vs_emulation[fp8mid-d128-m192_look128h_c4-1x113x113x4x2-full]
11 failed, 19 passed, 30 warnings in 23.45s
"""
_S8_PRECOMPILE_LOG = """\
precompile: 24 jobs in 19s with 14 workers; 3 failed
  FAILED fp8 d128 causal=True {'pv_buffers': 2, 'pv_split': 2, 'q_tail_first': True, 'reduce_chains': 4, 's_halves': True, \
's_lookahead': True, 'skip_unit_rescale': True, 'tile_m': 192, 'tile_n': 128}: AcceleratorError: CUDA error: an illegal \
instruction was encountered
"""


def test_fa3_fp8_speed_ab_drops_every_variant_that_failed_before(capsys, monkeypatch, tmp_path):
    """--drop-failed: a variant with any FAILED/ERROR line in the test log (by its test id, the
    error being on another line), or whose precompile job failed (by its config), leaves the A/B, which dies on the first
    CUDA error otherwise (session 8: the grep for "CUDA|illegal" on the FAILED line dropped nothing); another set's
    tests, "new" and names outside the set are not dropped; a missing log is skipped."""
    ab = load_script("fa3_fp8_speed_ab")
    assert ab.failed_variants(_S8_TEST_LOG, "fp8d128") == ["m192_look128h_c4_tail", "m192_look128h_c4_tail_skip",
                                                           "tn128_tail"]
    assert ab.failed_variants(_S8_PRECOMPILE_LOG, "fp8d128") == ["m192_look128h_c4_tail_skip"]
    assert ab.failed_variants(_S8_TEST_LOG, "fp8mid") == ["m192_look128h_c4"]
    assert ab.failed_variants("FAILED t.py::t[fp8d128-d128-new-1x113x113x4x2-full]\n"
                              "FAILED t.py::t[fp8d128-d128-gone-1x113x113x4x2-full]\n1 passed", "fp8d128") == []
    assert ab.failed_variants("11 failed, 19 passed\n", "fp8d128") == []
    (tmp_path / "tests.log").write_text(_S8_TEST_LOG)
    (tmp_path / "precompile.log").write_text(_S8_PRECOMPILE_LOG)
    monkeypatch.setitem(ab.SETS, "fp8d128", ab.SETS["fp8d128"])
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", "fp8d128", "--head-dims", "128",
                                     "--drop-failed", str(tmp_path / "precompile.log"), str(tmp_path / "tests.log"),
                                     str(tmp_path / "missing.log")])
    assert ab.main() == 0
    out = capsys.readouterr().out
    assert "left out (a FAILED/ERROR line in" in out
    assert "m192_look128h_c4_tail m192_look128h_c4_tail_skip tn128_tail" in out
    impls = out.split("impls per head_dim:")[1].splitlines()[0]
    assert "'new'" in impls and "'m192_look128h_c4'" in impls and "tail" not in impls


def test_fp8two_set():
    """--set fp8two (session 8, fused_promote at head_dim 256): new, fused, old and single_overlap at head_dim 256;
    its precompile covers every kernel of tests/test_fa3_fp8_speed_gpu.py's fp8two tests (the fused variants in both
    causal modes), 12 jobs; a failed fused test leaves fused out."""
    import test_fa3_fp8_speed_gpu as gpu_tests

    ab = load_script("fa3_fp8_speed_ab")
    assert list(ab.FP8TWO_VARIANTS[256]) == ["new", "fused", "old", "single_overlap"]
    jobs = ab.compile_jobs([256], [False, True], variant_set="fp8two")
    assert len(jobs) == 12
    for name, (D, change) in gpu_tests.FP8TWO_VARIANTS.items():
        assert ab.FP8TWO_VARIANTS[D][name.split("-", 2)[2]] == change, name
        ab.kernel_config(D, change).check(D)
        for causal in (False, True):
            assert ("fp8", D, causal, ab._freeze(change)) in jobs, (name, causal)
    log = "FAILED tests/test_fa3_fp8_speed_gpu.py::test_fp8two_v_scales_spread[fp8two-d256-fused-1x300x1000x4x2-causal]\n1 failed\n"
    assert ab.failed_variants(log, "fp8two") == ["fused"]


def test_fp8turn_set():
    """--set fp8turn (its ping-pong-turn variants removed in session 11): the head_dim 256 default against one running
    accumulator with one and two chains (the two-level cost's references), every variant a valid config; the cost
    lines name new against both references."""
    ab = load_script("fa3_fp8_speed_ab")
    assert list(ab.FP8TURN_VARIANTS[256]) == ["new", "single_overlap", "single_overlap_c2", "single_overlap_noskip"]
    assert ab.FP8TURN_VARIANTS[256]["single_overlap"] == ab.FP8TWO_VARIANTS[256]["single_overlap"]
    assert ab.kernel_config(256, ab.FP8TURN_VARIANTS[256]["single_overlap"]).skip_unit_rescale  # what _noskip turns off
    assert ab.FP8TURN_VARIANTS[256]["single_overlap_noskip"] == dict(ab.FP8TURN_VARIANTS[256]["single_overlap"],
                                                                     skip_unit_rescale=False)
    import test_fa3_fp8_speed_gpu as gpu_tests  # the GPU test of _noskip runs the timed config
    for name, (D, change) in gpu_tests.FP8TURN_VARIANTS.items():
        assert ab.kernel_config(D, ab.FP8TURN_VARIANTS[D][name.split("-", 2)[2]]) == ab.kernel_config(D, change), name
    for change in ab.FP8TURN_VARIANTS[256].values():
        ab.kernel_config(256, change).check(256)
    rows = [dict(head_dim=256, seqlen=16384, causal=False, impl=n, tflops=t, spread=0.05)
            for n, t in (("new", 1000.0), ("single_overlap", 1100.0), ("single_overlap_c2", 1150.0))]
    assert "- d256 N16384 causal=0: new +15.0% / +10.0%" in ab.turn_cost_lines(rows)


def test_fa3_fp8_speed_ab_every_set_has_a_legend(monkeypatch, capsys):
    """Every --set the argparser accepts is one entry of SETS with a legend, and its summary runs on rows of its
    variants (session 11's fp8turn run ended in KeyError 'fp8turn': the set had lost its legend in a side table); its
    --plan runs; an entry without a legend is refused."""
    ab = load_script("fa3_fp8_speed_ab")
    choices = next(a.choices for a in ab.parser()._actions if a.dest == "set")
    assert list(choices) == list(ab.SETS)
    for name in choices:
        vs = ab.SETS[name]
        assert vs.legend.strip() and vs.help.strip(), name
        rows = [dict(head_dim=D, seqlen=4096, causal=c, impl=impl, tflops=100.0 + i, spread=0.01)
                for D, variants in vs.variants.items() for c in (False, True)
                for i, impl in enumerate([*variants, "bf16_fa3"])]
        text = ab.speed_summary(rows, [], name) if vs.speed else ab.summary(rows, [])
        assert vs.legend in text, name
        monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", name])
        assert ab.main() == 0, name
        assert f"set: {name};" in capsys.readouterr().out
    with pytest.raises(ValueError, match="'fp8new'.*legend"):
        ab.check_sets({**ab.SETS, "fp8new": ab.VariantSet(ab.FP8TURN_VARIANTS, " ", "what it times")})


@pytest.mark.parametrize("backend", ["fa1", "fa2", "fa3", "fa3-fp8"])
def test_sanitize_plan_reads_the_registry(backend):
    """The worker's (dtype, head_dims) come from the one registry (a renamed dispatch helper broke every pair
    on the H200 before a single launch: 'no calls finished')."""
    import torch

    dtype, head_dims = _sanitize().plan(backend)
    assert dtype in (torch.bfloat16, torch.float16) and head_dims and set(head_dims) <= {64, 96, 128, 256}


def test_sanitize_per_head_dim_and_precompile(tmp_path, monkeypatch, capsys):
    """scripts/oob_gpu.sh's sanitize call on the CPU (fake sanitizer and python, echoing their arguments): --head-dims
    with --per-head-dim gives one sanitized process per head_dim (its own log, its --head-dims), --precompile first
    one unsanitized worker per (head_dim, causal)."""
    mod = _sanitize()
    fake = tmp_path / "fake"
    fake.write_text("#!/usr/bin/env bash\necho \"ARGS $*\"; echo 'CALLS 1 FAILED 0'; echo 'ERROR SUMMARY: 0 errors'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(mod, "_runnable_backends", lambda names: (list(names), []))
    monkeypatch.setattr(mod.sys, "executable", str(fake))
    rc = mod.main(["--tools", "memcheck", "--backends", "fa3-fp8", "--head-dims", "64", "256", "--per-head-dim",
                   "--precompile", "--sanitizer", str(fake), "--out", str(tmp_path / "out"), "--timeout", "30"])
    printed = capsys.readouterr().out
    assert rc == 0 and "precompile: 4 processes, 0 failed" in printed
    for d in (64, 256):
        assert f"memcheck  fa3-fp8-d{d} clean (1 calls" in printed
        log = (tmp_path / "out" / f"memcheck-fa3-fp8-d{d}.log").read_text()
        assert "--tool memcheck" in log and log.rstrip().count("--head-dims") == 1 and f"--head-dims {d}" in log
        for causal in (0, 1):
            pre = (tmp_path / "out" / f"precompile-fa3-fp8-d{d}-c{causal}.log").read_text()
            assert f"--backend fa3-fp8 --head-dims {d} --causal-only {causal}" in pre and "--tool" not in pre
    assert "--per-head-dim" in (ROOT / "scripts" / "oob_gpu.sh").read_text()


def test_sanitize_reads_racecheck_summaries():
    """racecheck ends with 'RACECHECK SUMMARY: ... (n errors, ...)', not 'ERROR SUMMARY' (every clean racecheck
    pair read as FAILED on the H200)."""
    log = "CALLS 20 FAILED 0\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    assert _sanitize()._summary("racecheck", "fa2", 0, log, 1.0) == ("racecheck fa2      clean (20 calls, 1 s)", True)
    bad = log.replace("(0 errors", "(3 errors")
    assert _sanitize()._summary("racecheck", "fa2", 0, bad, 1.0)[0].startswith("racecheck fa2      3 ERRORS")


def test_fp8_quant_bandwidth_plan_and_summary(capsys, monkeypatch):
    """scripts/fp8_quant_bandwidth.py on the CPU: --plan prints the byte model and the shapes; the tail gives
    % of copy per shape, v1 -> v2, and a SUMMARY per pipeline (FAIL below 70% or on a mismatch); the
    precompile script's plan covers both pipelines, both dtypes and the three head_dims."""
    bw = load_script("fp8_quant_bandwidth")
    monkeypatch.setattr("sys.argv", ["fp8_quant_bandwidth.py", "--plan"])
    assert bw.main() == 0
    out = capsys.readouterr().out
    assert out.startswith("byte model: q, k, v read once in 16 bits") and "(1, 16384, 16384, 16, 16, 128)" in out
    rows = [dict(shape=s, pipeline=p, recipe=r, of_copy=f, match="ok", queued=True)
            for s in ("D=64", "D=128") for r in ("default", "no-smooth") for p, f in (("v1", 0.35), ("v2", 0.75))]
    assert bw.summarise(rows, 4.28, ["v1", "v2"]) == 0
    out = capsys.readouterr().out
    assert "  D=128       no-smooth  35.0% ->  75.0%" in out
    assert "SUMMARY fp8_quant_bandwidth v1: FAIL" in out and "SUMMARY fp8_quant_bandwidth v2: PASS" in out
    rows[-1]["match"] = "DIFF k"
    assert bw.summarise(rows, 4.28, ["v1", "v2"]) == 1
    assert "75.0% MISMATCH" in capsys.readouterr().out
    tasks = load_script("quant_precompile").tasks()
    assert {(p, dt, d) for p, dt, d, _ in tasks} == {(p, dt, d) for p in ("v1", "v2", "v3")
                                                     for dt in ("bf16", "fp16") for d in (64, 128, 256)
                                                     if (p, dt) != ("v2", "fp16")}
    assert len(tasks) == len(set(tasks)) and ("v3", "bf16", 128, "default+tilemajor") in tasks


def test_fp8_quant_bandwidth_ab_and_quant5_sets():
    """scripts/fp8_quant_bandwidth.py's --ab lines from fake rows (NEW / OLD gpu ms per row, worst and best, the
    match flag), the v3ss label's switches, and quant5's precompile set: v3 with and without the staged store."""
    bw = load_script("fp8_quant_bandwidth")
    rows = [dict(shape=s, pipeline=p, recipe="default", gpu_ms=ms, of_copy=0.5, match="ok", queued=True)
            for s, base, f in (("D=64", 0.130, 0.9), ("D=128", 0.120, 1.01)) for p, ms in (("v3s", base),
                                                                                        ("v3ss", base * f))]
    text = bw.ab_lines(rows, "v3s", "v3ss")
    assert "  D=64        default   0.900" in text and "AB v3ss/v3s: worst 1.010 (D=128 default), best 0.900" in text
    assert text.endswith("all matched: True")
    off = {"V3_STAGED_MEAN": True, "V3_STAGED_STORE": False, "V3_FUSED_SAMPLED_MEAN": False}
    assert bw.PIPES["v3ss"] == ("v3", {**off, "V3_STAGED_STORE": True})
    assert bw.PIPES["v3sfs"] == ("v3", {**off, "V3_FUSED_SAMPLED_MEAN": True})
    pre = load_script("quant_precompile")
    tasks = pre.tasks("quant5")
    assert len(tasks) == len(set(tasks)) == 24 and ("v3", "bf16", 64, "sampled8+stagedstore") in tasks


def test_quant8_sets_and_pass_shares():
    """The quant8 set's pieces on the CPU: the bandwidth labels def / defl / deff (the current default with the
    staged store's auto rule, + V3_FUSED_MEAN_LATE, + V3_FUSED_MEAN), the precompile set (default / fused / late x
    default, sampled8 x three head_dims, head-smooth at 128; every knob a known switch set), the sanitizer's set, and
    the per-pass % of copy read from a breakdown (each launch's bytes / its us; the torch sum's us alone)."""
    bw = load_script("fp8_quant_bandwidth")
    base = {"V3_STAGED_MEAN": True, "V3_STAGED_STORE": None, "V3_FUSED_SAMPLED_MEAN": False,
            "V3_FUSED_MEAN": False, "V3_FUSED_MEAN_LATE": False}
    assert bw.PIPES["def"] == ("v3", base)
    assert bw.PIPES["defl"] == ("v3", {**base, "V3_FUSED_MEAN_LATE": True})
    assert bw.PIPES["deff"] == ("v3", {**base, "V3_FUSED_MEAN": True})
    from fa_variants.fp8 import quant_host

    assert all(hasattr(quant_host, name) for name in base)
    pre = load_script("quant_precompile")
    tasks = pre.tasks("quant8")
    assert len(tasks) == len(set(tasks)) == 21 and ("v3", "bf16", 128, "head-smooth+late8") in tasks
    assert all(t[3].partition("+")[2] in pre.QUANT8_KNOBS for t in tasks)
    assert pre.QUANT8_KNOBS["late8"]["V3_FUSED_MEAN_LATE"] and not pre.QUANT8_KNOBS["fused8"]["V3_FUSED_MEAN_LATE"]
    row = {"kernels": "4 kernels, 125.6 us: pass 49.2, void at::native::reduce_ 6.2, pass 33.8, pass 36.4",
           "pass_bytes": [168e6, 100e6, 101e6], "extra_bytes_read": 67e6}
    text = bw.pass_shares(row, 4.0)
    assert text == "V+Ksum 49.2 us 85%, K 33.8 us 74%, Q 36.4 us 69%, void at::native::reduce_ 6.2 us", text
    assert bw.pass_shares({"kernels": "2 kernels: pass 1.0, pass 2.0", "pass_bytes": [1, 1, 1]}, 4.0) == ""
    rows = [dict(shape="D=128", pipeline=p, recipe="default", gpu_ms=ms, of_copy=0.5, match="ok", queued=True, **row)
            for p, ms in (("def", 0.126), ("defl", 0.120))]
    text = bw.ab_lines(rows, "def", "defl", copy_tbs=4.0)
    assert "  D=128       default   0.952" in text and "per pass (% of copy for its bytes): [V+Ksum" in text

    class T:  # a tensor's size only
        def __init__(self, n):
            self.n = n

        def numel(self):
            return self.n

        def element_size(self):
            return 1

    out = type("O", (), {n: T(1) for n in ("v_t", "v_descale", "k", "k_descale", "q", "q_descale", "lse_shift")})
    assert bw.pass_bytes(T(10), T(10), T(10), out, 7) == [19, 12, 13]  # K's second read counted in V's launch


def test_fa3_fp8_speed_ab_summary_and_plan(capsys, monkeypatch):
    """scripts/fa3_fp8_speed_ab.py on the CPU: --plan; the summary's ratios, targets and pass criteria from
    fake rows (new 10% above old, a two-level cost of 4%, errors under the bound, tests' worst cases)."""
    ab = load_script("fa3_fp8_speed_ab")
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan"])
    assert ab.main() == 0
    assert "precompile:" in capsys.readouterr().out
    jobs = ab.compile_jobs([64, 128, 256], [False, True])
    assert len(jobs) == len(set(jobs)) and ("recipe", 256, True, ("float16", ("tensor", False, False, False))) in jobs
    speed = [dict(head_dim=128, seqlen=4096, causal=False, impl=n, tflops=t, spread=0.01)
             for n, t in (("new", 1000.0), ("old", 900.0), ("single", 1040.0), ("bf16_fa3", 700.0), ("flash_attn_4", 720.0))]
    err = [dict(head_dim=128, seqlen=2048, causal=False, block_n=256, kernel_vs_emulation=2e-3,
                kernel_vs_emulation_truncate=5e-3, lse_max_diff=1e-4, kernel_vs_float64=0.052,
                emulation_vs_float64=0.0519, emulation_block128_vs_float64=0.0518)]
    stats = [dict(case="a", rel_l2=3e-3, lse_diff=2e-4, max_diff=0.01, max_diff_bound=0.1)]
    text = ab.summary(speed, err, stats)
    assert "| 128 | 4096 | 0 | 1000 (1%) | 900 (1%) | 1040 (1%) | 700 (1%) | 720 (1%) | 1.43x | 1.29x | 1.11x | 1.39x | +4.0% |" in text
    assert "d128 N4096: over_bf16 1.43x (target >= 1.4): met" in text
    assert "two_level_cost +4.0% (target <= 0.05): met" in text
    assert "new defaults >= 0.97x old in every problem: PASS" in text
    assert "worst 2.00e-03: PASS" in text and "closer than the truncate model in every case: PASS" in text
    assert "worst rel-L2 3.00e-03 (a;" in text
    slow = [dict(r, tflops=800.0) if r["impl"] == "new" else r for r in speed]
    assert "every problem: FAIL" in ab.summary(slow, [], [])


def test_fa3_fp8_speed_ab_fp8speed_set(capsys, monkeypatch):
    """--set fp8speed: the plan; its precompile covers every kernel tests/test_fa3_fp8_speed_gpu.py runs; the
    summary's best variant, two-level cost (best single / best two-level), targets, flip candidates and pass lines
    from fake rows."""
    import test_fa3_fp8_speed_gpu as gpu_tests

    ab = load_script("fa3_fp8_speed_ab")
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", "fp8speed"])
    assert ab.main() == 0
    assert "set: fp8speed" in capsys.readouterr().out
    jobs = set(ab.compile_jobs([64, 128, 256], [False], variant_set="fp8speed"))
    flip_jobs = set(ab.compile_jobs([64, 128, 256], [False], variant_set="fp8flip"))
    for name, (D, change) in gpu_tests.FP8_VARIANTS.items():
        suffix = name.split("-", 1)[1]  # same names, same configs, in --set fp8speed or (else) --set fp8flip
        table, its_jobs = (ab.SPEED_VARIANTS, jobs) if suffix in ab.SPEED_VARIANTS[D] else (ab.FLIP_VARIANTS, flip_jobs)
        assert table[D][suffix] == change, name
        for causal in (False, True):
            assert ("fp8", D, causal, ab._freeze(change)) in its_jobs, (name, causal)
    assert ("bf16", 128, True, ab._freeze(dict(intra_wg_overlap=False, early_pv_arrive=True))) in jobs
    for D, variants in ab.SPEED_VARIANTS.items():  # every variant is a valid config (raises otherwise)
        for change in variants.values():
            ab.kernel_config(D, change).check(D)
    tf = dict(new=932.0, single=1108.0, single_early=1120.0, early=1000.0, skip=950.0, early_skip=1090.0,
              bf16_fa3=748.0, flash_attn_4=731.0)
    speed = [dict(head_dim=256, seqlen=16384, causal=c, impl=n, tflops=t, spread=0.05) for c in (False, True) for n, t in tf.items()]
    err = [dict(head_dim=256, seqlen=2048, causal=False, variant=n, kernel_vs_emulation=2e-3, lse_max_diff=1e-4,
                kernel_vs_float64=0.052, emulation_vs_float64=0.0519) for n in ab.SPEED_VARIANTS[256]]
    text = ab.speed_summary(speed, err)
    assert "| 16384 | 0 | 932 (5%) | 1108 (5%) | 1120 (5%) | 1000 (5%) | 950 (5%) | 1090 (5%) | 748 (5%) | 731 (5%) | " \
           "single_early | 1.20x | 1.50x | +2.8% |" in text
    assert "d256 N16384: 1120 TFLOP/s (single_early; default 932) (target >= 1100): met" in text
    assert "d256 N16384: two-level cost +2.8% (best single / best two-level) (target <= 5%): met" in text
    assert "- d256 early: 1.07x, 1.07x" in text and "- d256 early_skip: 1.17x, 1.17x" in text and "d256 skip:" not in text
    assert "worst 2.00e-03 (d256 new causal=0): PASS" in text and "1.002x (d256 new): PASS" in text


def test_decode_ab_plan_and_summary():
    """scripts/decode_ab.py: the plan's split counts follow each variant's tiles and policy; variants that would
    repeat another (nosplit where nothing splits, wide at D 128) are left out; the summary counts wins."""
    ab = load_script("decode_ab")
    rows = ab.plan(ab.MISSES, list(ab.VARIANTS), 132)
    by = {(r["shape"], r["variant"]): r for r in rows}
    b1 = (64, 32, 8, 1, 4096)  # 8 packed CTAs, 32 tiles of 128 keys (22 of 192)
    assert by[(b1, "deep")]["splits"] == 16 and by[(b1, "deep+pdl2 nosplit")]["splits"] == 1
    assert by[(b1, "deep+pdl2/2")]["splits"] == 8 and by[(b1, "wide+pdl2")]["config"].tile_n == 192
    assert by[(b1, "deep+pdl2")]["pdl"] and not by[(b1, "deep")]["pdl"] and by[(b1, "pdl")]["pdl"]
    assert by[(b1, "pdl2")]["config"].pdl and not by[(b1, "pdl")]["config"].pdl
    b64 = (64, 32, 8, 64, 1024)  # 512 CTAs: never split, so no nosplit / half rows, and no PDL merge
    assert (b64, "deep+pdl2 nosplit") not in by and by[(b64, "pdl")]["config"].num_splits == 1
    assert by[(b64, "pdl2")]["config"].pdl and by[(b64, "pdl2")]["config"].num_splits == 1
    assert not any(s[0] == 128 and v == "wide+pdl2" for s, v in by)
    results = [dict(shape=b1, us=dict(sdpa=10.0, auto=12.0, deep=9.0), err=dict(sdpa=0.0, auto=0.001, deep=0.5),
                    splits=dict(auto=16, deep=16))]
    text = ab.summary(results, ["auto", "deep"])
    assert "| D64 32:8 B1 Nk4096 | 10.0 | 1.20 (16) | BAD |" in text
    assert "auto             0 /   1" in text
    assert subprocess.run(["python3", str(ROOT / "scripts" / "decode_ab.py"), "--help"], capture_output=True).returncode == 0


def test_fa3_speed_ab_peers_and_summary():
    """scripts/fa3_speed_ab.py: `--peers flash-attn-4,cudnn` means SDPA's cuDNN backend (the alias), and the SUMMARY's
    new/cuDNN column reads it (2026-12-01: the name `cudnn` ran flash-attn-4 under that label and the column was nan);
    an unknown peer is an error, not flash-attn-4 renamed."""
    ab = load_script("fa3_speed_ab")
    assert ab.peer_names("flash-attn-4,cudnn") == ["flash-attn-4", "sdpa-cudnn"]
    assert ab.peer_names("fa4, sdpa-cudnn,cudnn") == ["flash-attn-4", "sdpa-cudnn"]
    with pytest.raises(ValueError, match="cuddn"):
        ab.peer_names("flash-attn-4,cuddn")
    row = dict(head_dim=128, seqlen=4096, causal=False, ratio_to_old={"new": 1.03},
               ratio_new_to={"old": 1.03, "flash-attn-4": 0.95, "sdpa-cudnn": 1.12, "n176": 0.98},
               ratio_to_new={"old": 0.97, "n176": 1.02, "flash-attn-4": 1.05, "sdpa-cudnn": 0.89},
               ratio_to_fa4={"new": 0.95, "n176": 0.97})
    head, line = ab.summary_lines([row])
    assert head.startswith("SUMMARY (median") and "nan" not in line
    assert line == "SUMMARY D=128 N=4096 full: 1.030 0.950 1.120 | n176 1.020 0.970"
    no_cudnn = dict(row, ratio_new_to={"flash-attn-4": 0.95})
    assert ab.summary_lines([no_cudnn])[1].startswith("SUMMARY D=128 N=4096 full: 1.030 0.950 nan |")


def test_bench_build_impls_rejects_unknown_peers():
    """bench.runtime.build_impls runs a peer only under its own name: an unknown name gets a note (it used to time
    flash-attn-4 under that name)."""
    from fa_variants.bench.runtime import build_impls

    impls, notes = build_impls([], ["cudnn", "sdpa-cudnn"])
    assert [i.name for i in impls] == ["sdpa-cudnn"]
    assert len(notes) == 1 and notes[0].startswith("cudnn not run: unknown peer")


def test_decode_ab_public_variants():
    """scripts/decode_ab.py's public-path variants (fa3's module switches per call): `fused` runs the fused split
    merge where `auto` splits (seqlen_q 1 and 16), never where it does not (batch 64), with `auto`'s split count;
    the switches are restored after planning; WINS shapes carry seqlen_q in their label."""
    from fa_variants.hopper import fa3

    ab = load_script("decode_ab")
    before = ab.get_flags(fa3)
    shapes = [(128, 32, 8, 1, 4096), (128, 32, 8, 1, 4096, 16), (128, 32, 8, 64, 4096, 16)]
    by = {(r["shape"], r["variant"]): r for r in ab.plan(shapes, ["two", "fused", "dual+fused+pdl2"], 132)}
    assert ab.get_flags(fa3) == before
    assert by[(shapes[0], "fused")]["config"].fused_merge and not by[(shapes[0], "two")]["config"].fused_merge
    assert by[(shapes[0], "fused")]["splits"] == by[(shapes[0], "two")]["splits"] == 16
    assert by[(shapes[1], "fused")]["config"].pack_group == 4 and by[(shapes[1], "fused")]["config"].fused_merge
    assert by[(shapes[2], "fused")]["splits"] == 1 and not by[(shapes[2], "fused")]["config"].fused_merge
    dual = by[(shapes[0], "dual+fused+pdl2")]["config"]
    assert dual.ctas_per_sm == 2 and dual.pdl and dual.fused_merge
    assert ab.label(shapes[1]) == "D128 32:8 B1 Nk4096 Nq16" and ab.label(shapes[0]) == "D128 32:8 B1 Nk4096"
    assert all(r.get("public") for r in by.values())


def test_fa2split_bench_plan_and_summary():
    """scripts/fa2split_bench.py: fa2's split counts on an H200 (B1 decode split, B64 not); the summary's ratios,
    BAD cells (an output off SDPA's) left out of the geomeans, and the win count."""
    bench = load_script("fa2split_bench")
    assert len(bench.shapes()) == 27 and bench.shapes()[-1] == (64, 16, 32768)
    assert bench.planned_splits((1, 1, 4096), "sm_90a", 132) == 8
    assert bench.planned_splits((64, 1, 4096), "sm_90a", 132) == 1
    assert bench.planned_splits((1, 1, 4096), "sm_90a", 132, pack=True) == 32
    ok = dict(sdpa=0.0, nosplit=0.001, split=0.002)
    results = [dict(shape=(1, 1, 4096), splits=8, pack_splits=32, us=dict(sdpa=10.0, nosplit=120.0, split=8.0, pack=5.0),
                    err=dict(ok, pack=0.001)),
               dict(shape=(64, 4, 4096), splits=1, us=dict(sdpa=50.0, nosplit=60.0, split=60.0),
                    err=dict(ok, split=0.5))]
    text = bench.summary(results)
    assert "| B1 Nq1 Nk4096 | 10.0 | 120.0 | 8.0 (8) | 5.0 (32) | 0.80 | 15.00 | 0.50 |" in text
    assert "| B64 Nq4 Nk4096 | 50.0 | 60.0 | BAD (1) | - | - | - | - |" in text
    assert "1/2 shapes timed and correct" in text and "split <= sdpa at 1/1 shapes; pack <= sdpa at 1/1" in text
    assert "geomean split/sdpa     0.800" in text
    assert subprocess.run(["python3", str(ROOT / "scripts" / "fa2split_bench.py"), "--help"],
                          capture_output=True).returncode == 0


def test_decode_compile_jobs_are_one_piece(monkeypatch, capsys):
    """scripts/decode_ab.py's compile_item / compile_all (one piece): each kind compiled under the key its run looks
    up (fa2: the launcher's default static config; merge: split-merge with the pdl flag; fa3: its config, causal);
    the A/B plan's items are well formed; compile_all skips with the disk cache off."""
    from fa_variants import registry
    from fa_variants.common import diskcache
    from fa_variants.hopper import fa3

    ab = load_script("decode_ab")
    seen = []
    monkeypatch.setattr(registry, "compiled", seen.append)
    config = fa3._PACKED_SPLIT_CONFIGS[128]
    for item in (("fa2", 128, True, None), ("merge", 64, False, True), ("fa3", 128, True, config)):
        assert ab.compile_item(item).startswith(f"{item[0]} D{item[1]} ")
    assert seen[0] == registry.variant("fa2").static_config("sm_90a", "bf16", 128, True)
    assert seen[1].variant == "split-merge" and seen[1].config.pdl and seen[1].head_dim == 64
    assert seen[2] == registry.static_config("fa3", "sm_90a", "bf16", 128, True, config)
    listed = sorted(ab.plan_items(ab.plan(ab.MISSES, ["two"], ab.NUM_SMS_DEFAULT)), key=repr)
    assert listed and all(len(item) == 4 and item[0] in ("fa3", "fa2", "merge") for item in listed)
    monkeypatch.setattr(diskcache, "enabled", lambda: False)
    assert ab.compile_all(listed, 2, "decode_precompile") == 0
    assert "decode_precompile: skipped" in capsys.readouterr().out


def test_fa3_speed_ab_fa3gap_plan(capsys, monkeypatch):
    """scripts/fa3_speed_ab.py on the CPU: the fa3gap plan (pairs-256 left out since session 9) compiles 22 kernels,
    each once, basis_alpha only where exp2_ffma is on; --precompile and --plan need no 'old'; unknown variants are refused."""
    ab = load_script("fa3_speed_ab")
    shapes = ab.plan((64, 128, 256), (4096, 16384), (False, True), list(ab.FA3GAP))
    items = ab.compile_items(shapes, "bf16")
    assert len(items) == 22 == len(set(items))
    for name, d, _causal, _dtype in items:
        cfg = ab.variant_config(name, d)
        assert not cfg.basis_alpha or cfg.exp2_ffma, (name, d)
        cfg.check(d)
    monkeypatch.setattr("sys.argv", ["fa3_speed_ab.py", "--plan", "--variants", "basis,basis-256"])
    assert ab.main() == 0
    assert "basis_alpha=True" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["fa3_speed_ab.py", "--out", "x", "--variants", "new,nope"])
    with pytest.raises(SystemExit):
        ab.main()
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", raising=False)  # flash-attn-4's cache must be on
    monkeypatch.setattr("sys.argv", ["fa3_speed_ab.py", "--precompile", "1", "--precompile-fa4", "--variants", "new"])
    assert ab.main() == 2


def test_fa3_speed_ab_persist_plan():
    """scripts/fa3_speed_ab.py's PERSIST plan: old, new and persistent at D 64/128/256, 18 kernels each compiled once;
    persistent is the default config with the switch on (and passes the config check)."""
    from fa_variants.hopper import fa3

    ab = load_script("fa3_speed_ab")
    shapes = ab.plan((64, 128, 256), (4096, 16384), (False, True), list(ab.PERSIST))
    items = ab.compile_items(shapes, "bf16")
    assert len(items) == 18 == len(set(items))
    for d in (64, 128, 256):
        cfg = ab.variant_config("persistent", d)
        assert cfg.persistent and cfg == dataclasses.replace(fa3.DEFAULT_CONFIGS[d], persistent=True)
        cfg.check(d)


def test_fa3_speed_ab_turn_set():
    """scripts/fa3_speed_ab.py's TURN set (session 12): old, new and turn (Sm90Config.hoisted_descriptors) at D 128
    only, the default config with the switch on (passing the check); at D 64 the switch is in the default (flipped
    after session 12's turnbf16 run; `noturn` is the default before), at the other head dims it is off."""
    from fa_variants.hopper import fa3

    ab = load_script("fa3_speed_ab")
    assert ab.TURN == ("old", "new", "turn") and ab.VARIANTS["turn"][0] == (128,)
    cfg = ab.variant_config("turn", 128)
    assert cfg == dataclasses.replace(fa3.DEFAULT_CONFIGS[128], hoisted_descriptors=True)
    cfg.check(128)
    assert {d: c.hoisted_descriptors for d, c in fa3.DEFAULT_CONFIGS.items()} == {64: True, 96: False, 128: False,
                                                                                  256: False}
    shapes = ab.shapes_plan("128:4096:full,128:4096:causal", list(ab.TURN))
    assert [len(s["variants"]) for s in shapes] == [3] * 2 and len(ab.compile_items(shapes, "bf16")) == 6
    # noturn: D 64's default with the switch off (tests/test_fa3_gpu.py's same-values reference; precompiled by name)
    assert ab.VARIANTS["noturn"][0] == (64,) and "noturn" not in ab.TURN
    assert ab.variant_config("noturn", 64) == dataclasses.replace(fa3.DEFAULT_CONFIGS[64], hoisted_descriptors=False)


def test_fa3_speed_ab_alpha_plan():
    """scripts/fa3_speed_ab.py's ALPHA plan by --shapes: D 128 N 4k, D 128 N 4k causal, D 128 N 16k, D 64 N 4k in
    that order; alpha at D 64/128 and alpha-noskip at D 64 only, 10 kernels each compiled once; alpha is the default
    with alpha_first on (alpha-noskip also without the unit-alpha skip), both pass the config check; a malformed
    --shapes item is a ValueError naming --shapes."""
    from fa_variants.hopper import fa3

    ab = load_script("fa3_speed_ab")
    spec = "128:4096:full,128:4096:causal,128:16384:full,64:4096:full"
    shapes = ab.shapes_plan(spec, ["old", "new", "alpha", "alpha-noskip"])
    assert [(s["head_dim"], s["seqlen"], s["causal"]) for s in shapes] == [
        (128, 4096, False), (128, 4096, True), (128, 16384, False), (64, 4096, False)]
    assert [len(s["variants"]) for s in shapes] == [3, 3, 3, 4]
    items = ab.compile_items(shapes, "bf16")
    assert len(items) == 10 == len(set(items))
    for d in (64, 128):
        cfg = ab.variant_config("alpha", d)
        assert cfg == dataclasses.replace(fa3.DEFAULT_CONFIGS[d], alpha_first=True)
        cfg.check(d)
    noskip = ab.variant_config("alpha-noskip", 64)
    assert noskip == dataclasses.replace(fa3.DEFAULT_CONFIGS[64], alpha_first=True, skip_unit_rescale=False)
    noskip.check(64)
    for bad in ("128:4096", "128:4096:both", "x:4096:full", ""):
        with pytest.raises(ValueError, match="--shapes"):
            ab.parse_shapes(bad)


def test_fa3_speed_ab_gap9_set():
    """scripts/fa3_speed_ab.py's GAP9 set after session 9 (early removed with Sm90Config.rescale_first; pairs-256 the
    D 256 default): old, new and two D 256 variants, 6 kernels non-causal (the seqlen does not change one), each
    compiled once (old and new now differ at D 256), every variant passing the config check."""
    ab = load_script("fa3_speed_ab")
    assert ab.GAP9 == ("old", "new", "fa4-256", "alpha-256")
    shapes = ab.plan((64, 256), (4096, 16384), (False,), list(ab.GAP9))
    assert [len(s["variants"]) for s in shapes] == [2, 2, 4, 4]
    items = ab.compile_items(shapes, "bf16")
    assert len(items) == 6 == len(set(items)), items
    for name, d, _causal, _dtype in items:
        ab.variant_config(name, d).check(d)
    alpha = ab.variant_config("alpha-256", 256)
    assert alpha.alpha_first and alpha.convert_pairs and alpha.exp2_ffma and not alpha.rescale_o_before_pv


def _killed_session(tmp_path, killer: list[str]) -> tuple[int, int, subprocess.CompletedProcess]:
    """A script on steps.sh (fake nvidia-smi) in the middle of a 20 s step, ended by ``killer + [bash, script]``
    after 1 s: (the clock logger's pid, the step command's pid, the run)."""
    env = dict(os.environ, PATH=f"{_fake_bin(tmp_path / 'bin', _FAKE_SMI)}:{os.environ['PATH']}")
    out = tmp_path / "out"
    out.mkdir()
    driver = tmp_path / "driver.sh"
    driver.write_text(f"""set -uo pipefail
source {ROOT}/scripts/steps.sh
session_setup "$1/logs"
echo "$CLOCKS_PID" > "$1/logger"
step long 60 bash -c 'echo $$ > "$1/step"; exec sleep 20' _ "$1"
echo "not reached"
""")
    run = subprocess.run([*killer, "bash", str(driver), str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=30)
    return int((out / "logger").read_text()), int((out / "step").read_text()), run


def _gone_soon(pids, seconds: float = 5.0) -> list[int]:
    """The pids still alive after up to ``seconds`` (those are then ended here: the test leaves nothing behind)."""
    import time

    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in pids if _alive(p)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    return alive


@pytest.mark.parametrize("killer", [["timeout", "1"], ["timeout", "-s", "INT", "1"],
                                    ["timeout", "--foreground", "-s", "KILL", "1"]],
                         ids=["timeout", "interrupt", "sigkill"])
def test_steps_sh_script_killed_mid_step_leaves_nothing_running(tmp_path, killer):
    """A GPU script ended mid-step (`timeout` with SIGTERM to its process group, SIGINT as from Ctrl-C, or
    SIGKILL to the script alone, when no EXIT trap runs) leaves neither the clock logger nor the running step's
    command behind (the step runs in a process group of its own, timeout's, that the script's end does not
    reach by itself): a step left running would load the GPU under the next script's measurements."""
    logger, step, run = _killed_session(tmp_path, killer)
    assert "not reached" not in run.stdout, run.stdout + run.stderr
    assert _gone_soon([logger, step]) == [], "left running after its script was killed"


def test_steps_sh_step_that_ignores_the_interrupt_is_killed_after_the_grace(tmp_path):
    """A step still running STEP_GRACE s after its limit's SIGINT (a process pool whose shutdown waits on workers
    that took the interrupt: session 8's fp8d128 precompile held its script for 5 minutes) is killed, and the
    script goes on to its next step with the step's rc (137: KILL) reported."""
    env = dict(os.environ, PATH=f"{_fake_bin(tmp_path / 'bin', _FAKE_SMI)}:{os.environ['PATH']}", STEP_GRACE="1")
    driver = tmp_path / "driver.sh"
    driver.write_text(f"""set -uo pipefail
source {ROOT}/scripts/steps.sh
session_setup "$1/logs"
step deaf 1 bash -c 'trap "" INT; exec sleep 20'
echo "next step reached"
end_session
""")
    import time

    t0 = time.monotonic()
    run = subprocess.run(["bash", str(driver), str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=30)
    assert "next step reached" in run.stdout and "== deaf: rc=137" in run.stdout, run.stdout + run.stderr
    assert time.monotonic() - t0 < 10


def test_decode_model_fits_the_s4_run_and_predicts_min_tiles_one():
    """scripts/decode_model.py: the latency / bandwidth model is within 12% of every `auto` entry of the 2026-12-01 s4
    A/B (bench/h200-2026-12-01-s4/decode_ab.json), and with one-tile splits (FA_VARIANTS_SPLIT_MIN_TILES=1) it
    predicts B 1 Nk 1k faster (8 splits, max(1 tile, bytes) instead of 2 tiles) and nothing else of that run changed."""
    import json

    model = load_script("decode_model")
    run = ROOT / "bench" / "h200-2026-12-01-s4" / "decode_ab.json"
    rows = model.check_against(run)
    auto = [r for r in rows if r[0].endswith(" auto")]
    assert len(auto) == 32 and all(0.88 <= m / g <= 1.12 for _, _, g, m, _ in auto), auto
    for d in (64, 128):
        assert model.heuristic(d, 32, 8, 1, 1024, 2) == 4 and model.heuristic(d, 32, 8, 1, 1024, 1) == 8
        old, new = model.predict_us(d, 32, 8, 1, 1024, 4), model.predict_us(d, 32, 8, 1, 1024, 8)
        assert new["us"] < old["us"] and new["tiles_per_cta"] == 1 and new["ctas"] == 64
    for shape in {tuple(r["shape"][:5]) for r in json.loads(run.read_text())["results"]}:
        if shape[4] > 1024 or shape[3] > 1:  # (batch 1 and 8 / 64 in that run)
            assert model.heuristic(*shape, 2) == model.heuristic(*shape, 1), shape


def test_decode_ab_min1_variants():
    """scripts/decode_ab.py --short-nk: min1 runs the count of one-tile splits (B 1 Nk 1k: 8, forced; `auto` 4),
    the same count as `auto` elsewhere, unsplit where nothing splits; +pdl / +pdl2 set the PDL flags."""
    ab = load_script("decode_ab")
    shapes = ab.SHORT_NK + ab.CONTROLS
    assert len(shapes) == 20 and len(set(shapes)) == 20
    by = {(r["shape"], r["variant"]): r for r in ab.plan(shapes, ["min1", "min1+pdl2"], 132)}
    short = (128, 32, 8, 1, 1024)
    assert ab.entry("min1", short, 132)[1] == 8 and by[(short, "min1")]["splits"] == 8
    assert not by[(short, "min1")]["pdl"] and by[(short, "min1+pdl2")]["config"].pdl
    assert by[((128, 32, 8, 1, 4096), "min1")]["splits"] == 16 and by[((64, 32, 8, 8, 1024), "min1")]["splits"] == 2
    full = by[((128, 64, 8, 64, 4096), "min1")]
    assert full["splits"] == 1 and full["config"].num_splits == 1


def _decode_ab_before_s7_flips(ab, monkeypatch):
    """decode_ab planned with the switches shipped when its --s6 and --s7 plans ran (before session 7 turned
    first_row_only on and the warp merge on at >= 8 splits): what those plans were written for."""
    monkeypatch.setitem(ab.SHIPPED, "MERGE_WARP", False)
    monkeypatch.setitem(ab.SHIPPED, "DECODE_FIRST_ROW", False)
    from fa_variants.common import split_combine
    from fa_variants.hopper import fa3

    monkeypatch.setattr(split_combine, "MERGE_WARP", False)
    monkeypatch.setattr(fa3, "DECODE_FIRST_ROW", False)


def test_decode_ab_s6_variants(monkeypatch):
    """scripts/decode_ab.py --s6: `old` is auto before session 6 (B 1 Nk 1k: 4 splits, no
    PDL) where the shipped `two` runs 8 with PDL; wide (and the shipped default at D 64) packs 64:8 Nq 16 in one
    128-row tile, old two 64-row ones; dualauto (and the shipped default) runs two CTAs per SM at B 64 Nk 1k, old not; the switches (fa3's and split_combine.MERGE_WARP) are restored after planning; the HBM lines
    cover the Nk 32k shapes."""
    from fa_variants.hopper import fa3

    ab = load_script("decode_ab")
    _decode_ab_before_s7_flips(ab, monkeypatch)
    assert len(ab.S6) == 29 == len(set(ab.S6))
    before = ab.get_flags(fa3)
    variants = ["two", "old", "warp", "dualauto", "wide", "cand"]
    by = {(r["shape"], r["variant"]): r for r in ab.plan(ab.S6, variants, 132)}
    assert ab.get_flags(fa3) == before
    b1 = (128, 32, 8, 1, 1024)
    assert (by[(b1, "old")]["splits"], by[(b1, "old")]["config"].pdl) == (4, False)
    assert (by[(b1, "two")]["splits"], by[(b1, "two")]["config"].pdl) == (8, True)
    nq16 = (64, 64, 8, 64, 32768, 16)
    assert by[(nq16, "wide")]["config"].tile_m == by[(nq16, "two")]["config"].tile_m == 128
    assert by[(nq16, "old")]["config"].tile_m == 64
    assert by[(nq16, "cand")]["config"].tile_m == 128
    b64 = (64, 32, 8, 64, 1024)
    assert by[(b64, "dualauto")]["config"].ctas_per_sm == by[(b64, "two")]["config"].ctas_per_sm == 2
    assert by[(b64, "old")]["config"].ctas_per_sm == 1 and by[((64, 32, 8, 8, 1024), "two")]["config"].ctas_per_sm == 1
    results = [dict(shape=nq16, us=dict(sdpa=8796.5, auto=1900.1, wide=1000.0), err={}, splits={})]
    lines = ab.hbm_lines(results, ["auto", "wide"])
    assert lines[-1] == "  D64 64:8 B64 Nk32768 Nq16: 10 47 89", lines


def test_decode_ab_s7_plan_skips_entries_equal_to_auto(monkeypatch):
    """scripts/decode_ab.py --s7: warp runs where there is a merge (not at the unsplit B 64
    shapes), warp+pdl16 only where it adds PDL (16 splits at seqlen_q 1: B 1 Nk 4k / 32k), row1 at seqlen_q 1 only
    (the unsplit dual B 64 shape too); first_row_only reaches the configs; the vs-auto lines."""
    from fa_variants.hopper import fa3

    ab = load_script("decode_ab")
    _decode_ab_before_s7_flips(ab, monkeypatch)
    assert len(ab.S7) == 19 == len(set(ab.S7))
    before = ab.get_flags(fa3)
    variants = ["warp", "warp+pdl16", "row1"]
    rows = ab.plan(ab.S7, variants, 132, skip_same=True)
    assert ab.get_flags(fa3) == before
    by = {(r["shape"], r["variant"]): r for r in rows}
    b1 = (64, 32, 8, 1, 4096)
    assert by[(b1, "warp")]["splits"] == 16 and by[(b1, "warp+pdl16")]["config"].pdl and not by[(b1, "warp")]["config"].pdl
    assert ((64, 32, 8, 8, 1024), "warp+pdl16") not in by  # 2 splits: PDL already
    b64 = [v for s, v in by if s == (64, 32, 8, 64, 1024)]  # unsplit dual tiles: only first_row_only differs
    assert b64 == ["row1"] and by[((64, 32, 8, 64, 1024), "row1")]["config"].ctas_per_sm == 2
    assert by[(b1, "row1")]["config"].first_row_only and not by[(b1, "warp")]["config"].first_row_only
    assert ((64, 64, 8, 1, 32768, 16), "row1") not in by
    nq16 = (64, 64, 8, 64, 32768, 16)
    assert (nq16, "warp") not in by
    results = [dict(shape=nq16, us=dict(sdpa=8800.0, auto=1500.0, row1=1200.0), err=dict(sdpa=0.0, auto=0.0, row1=0.001),
                    splits={}),
               dict(shape=b1, us=dict(sdpa=8.0, auto=9.0, row1=9.9), err=dict(sdpa=0.0, auto=0.0, row1=0.001), splits={})]
    lines = ab.auto_lines(results, ["auto", "row1"])
    assert lines[-1] == ("  row1           vs auto: faster  1 /  2, geomean 0.938, best 0.800 (D64 64:8 B64 Nk32768 Nq16), "
                         "worst 1.100 (D64 32:8 B1 Nk4096)"), lines


def test_fa2d256_ab_plan_protocol_and_summary():
    """scripts/fa2d256_ab.py on the CPU with a fake burst timer: 20 precompile items (5 configs x causal x dtype),
    per-round ratios, the SUMMARY and WINS lines (a variant faster than default and SDPA flash on every shape says
    so; one slower does not)."""
    import types

    from fa_variants.ampere import fa2

    ab = load_script("fa2d256_ab")
    # since session 6 "default" is s1's tiles: s1 left out of the default list, the old default as s2
    assert ab.default_variants() == ["default", "s2", "n32", "m128w8s1", "m128w8"]
    assert fa2.D256_CONFIGS["default"] == fa2.D256_CONFIGS["s1"]
    assert len(set(ab.compile_items(ab.default_variants(), (False, True), ("bf16", "fp16")))) == 20
    variants = ab.default_variants()
    speed = {"default": 1.0, "s2": 0.9, "n32": 1.05, "m128w8s1": 1.0, "m128w8": 0.99, "sdpa-flash": 0.95, "AA": 1.0}

    class Timer:
        def prepare(self, name, fn, burst_ms):
            return "fake"

        def cycle(self, names):
            return [(speed[n], 1, 1500.0, 600.0) for n in names]

    def entries(shape, variants, arch, torch):
        fns = {x: (lambda: None) for x in [*variants, ab.PEER]}
        keys = dict({x: ab.config(x) for x in variants}, **{ab.PEER: None})
        return fns, keys, {x: 1e-3 for x in fns}, {x: 2e-3 for x in fns}, {}

    a = types.SimpleNamespace(rounds=6, cycles=2, burst_ms=10.0, warmup_ms=1.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ab, "shape_entries", entries)
        rows = [ab.time_shape(s, variants, "sm_90a", a, None, Timer())
                for s in ab.plan([512, 16384], (False, True), ["bf16"])]
    assert rows[0]["ratios"]["s2/default"]["rounds"] == pytest.approx([1 / 0.9] * 6)
    assert "sdpa-flash/default" not in rows[0]["ratios"]
    lines = ab.summary_lines(rows, variants)
    assert lines[1].startswith("SUMMARY bf16 N=512 full: default 0.950, s2 1.056 (1.111)")
    assert ("WINS s2: vs default faster on 4/4 shapes, slower on 0/4 (verdicts), median > 1 on 4/4; >= sdpa-flash on "
            "4/4 FLIP (every shape)") in lines
    assert ("WINS n32: vs default faster on 0/4 shapes, slower on 4/4 (verdicts), median > 1 on 0/4; >= sdpa-flash "
            "on 0/4") in lines
    # equal speed to default: verdict "same" everywhere, no FLIP
    assert ("WINS m128w8s1: vs default faster on 0/4 shapes, slower on 0/4 (verdicts), median > 1 on 0/4; "
            ">= sdpa-flash on 0/4") in lines


def test_decode_ab_s8_plan():
    """scripts/decode_ab.py --s8: pdl16 only at seqlen_q 1 shapes of 16 splits; the module switches untouched by
    planning."""
    from fa_variants.hopper import fa3

    ab = load_script("decode_ab")
    assert len(ab.S8) == 13 == len(set(ab.S8))
    before = ab.get_flags(fa3)
    rows = ab.plan(ab.S8, ["pdl16"], 132, skip_same=True)
    assert ab.get_flags(fa3) == before
    by = {(r["shape"], r["variant"]): r for r in rows}
    nq1 = (64, 32, 8, 1, 32768)
    assert by[(nq1, "pdl16")]["config"].pdl and by[(nq1, "pdl16")]["splits"] == 16
    assert not any(len(s) == 6 for s, v in by if v == "pdl16")  # seqlen_q > 1: not PDL calls


def test_decode_model_full_grid_fits_the_s7_batch_64_rows():
    """scripts/decode_model.py --full-grid: the dual-wave model is within 3% of each batch-64 seqlen_q 1 row at Nk <= 4k
    of the s7 decode table (8 rows, D 64 / 128), and predicts the persistent grid faster by at most the waves' cost."""
    model = load_script("decode_model")
    rows = model.full_grid_rows()
    assert len(rows) == 8
    for d, h, hkv, b, nk, ours, sdpa in rows:
        dual = model.full_grid_us(d, hkv, b, nk, "dual")[0]
        lo, hi = model.full_grid_us(d, hkv, b, nk, "persistent")
        assert 0.97 <= dual / ours <= 1.03, (d, h, nk, dual, ours)
        assert dual - model.WAVE_STEP_US - 1e-9 <= lo <= hi < dual, (d, h, nk, lo, hi, dual)


def test_pending_runs_named_scripts_and_the_checks(tmp_path):
    """scripts/pending_gpu.sh (a session's GPU work left for the next one's calls): refuses a name without a script
    (exit 2, before any GPU work); every script its header plans exists (the plan may be empty); --checks
    selects the 31 GPU tests of the head_dim 256 fa3-fp8 default (bounded_units flipped in session 11) its header
    counts, after scripts/checks_precompile.py's 11 jobs (the kernels of those tests: the default recipe's bf16 kernel
    causal and not, the two-level recipes' fp16 causal one, the fault test's bounded_units=False); a stub script named
    on the command line runs with OUT under pending/NAME and its output is summarised."""
    script = ROOT / "scripts" / "pending_gpu.sh"
    text = script.read_text()
    bad = subprocess.run(["bash", str(script), "no_such_script"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "no scripts/no_such_script_gpu.sh" in bad.stderr
    plan = text.split("#    Plan", 1)[1].split("Pass (step 1)", 1)[0]
    planned = set(re.findall(r"pending_gpu\.sh(?: --checks)?((?: [a-z0-9]+)+)", plan))
    names = {n for group in planned for n in group.split()}
    for name in names:
        assert (ROOT / "scripts" / f"{name}_gpu.sh").exists(), name
    files = ["tests/test_fp8_overflow_gpu.py", "tests/test_fa3_fp8_gpu.py", "tests/test_fp8_quant_kernel.py",
             "tests/test_fa3_gpu.py", "tests/test_decode_gpu.py"]
    assert f'CHECKS=({" ".join(files[:4])}\n        {files[4]} -k "$CHECKS_K")' in text
    expr = "".join(re.findall(r'^CHECKS_K\+?="([^"]+)"', text, re.M))
    collect = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "-m", "gpu", *files, "-k", expr], capture_output=True, text=True, timeout=120, cwd=ROOT)
    ids = [line for line in collect.stdout.splitlines() if "::" in line]
    by_file = collections.defaultdict(list)
    for i in ids:
        by_file[i.split("::")[0]].append(i)
    fp8 = by_file["tests/test_fp8_overflow_gpu.py"] + by_file["tests/test_fa3_fp8_gpu.py"]
    kinds = collections.Counter(re.sub(r"\[.*", "", i.split("::")[1]) for i in fp8)
    assert kinds == {"test_adversarial_v": 10, "test_fused_units_fault": 1, "test_default_recipe": 12,
                     "test_every_recipe": 6, "test_zero_v_blocks_long_rows_d256": 2}, fp8
    assert all("256" in i or i.endswith("test_fused_units_fault") for i in fp8), fp8
    assert all("2lvl0" not in i and "d64" not in i for i in fp8), fp8
    quant = collections.Counter(re.sub(r"\[.*", "", i.split("::")[1])
                                for i in by_file["tests/test_fp8_quant_kernel.py"])
    assert quant == {"test_pass_matches_torch_bitwise": 12, "test_v3_wide_bitwise": 2}, quant
    fa3_64 = by_file["tests/test_fa3_gpu.py"] + by_file["tests/test_decode_gpu.py"]
    assert len(fa3_64) >= 100 and all("64" in i or "hoisted" in i for i in fa3_64), len(fa3_64)
    assert any("hoisted_descriptors_same_values" in i for i in fa3_64)
    assert "31 tests" in text and "11 jobs" in text and "step checks_precompile" in text
    assert "--set quantdef" in text and "--variants new,noturn" in text
    jobs = load_script("checks_precompile").JOBS
    assert len(jobs) == 11 and {(k, c) for k, _, c, _ in jobs} == {("recipe", False), ("recipe", True), ("fp8", False),
                                                                    ("fp8", True)}
    assert ("fp8", 256, False, (("bounded_units", False),)) in jobs
    assert {ch[0] for k, _, c, ch in jobs if k == "recipe"} == {"bfloat16", "float16"}
    # a stub script run through the queue: its OUT, its output file, the summary
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for f in ("pending_gpu.sh", "steps.sh"):
        (scripts / f).write_text((ROOT / "scripts" / f).read_text())
    (scripts / "stub_gpu.sh").write_text('#!/usr/bin/env bash\necho "stub ran with OUT=$OUT"\n')
    run = subprocess.run(["bash", str(scripts / "pending_gpu.sh"), "stub"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env={**os.environ, "OUT": str(tmp_path / "out")})
    assert run.returncode == 0, run.stderr
    assert "== stub: rc=0" in run.stdout and f"stub ran with OUT={tmp_path / 'out' / 'pending' / 'stub'}" in run.stdout
    # a named script that fails: the queue goes on, then exits 1 naming it (steps.sh steps_exit)
    (scripts / "bad_gpu.sh").write_text('#!/usr/bin/env bash\nexit 3\n')
    run = subprocess.run(["bash", str(scripts / "pending_gpu.sh"), "bad", "stub"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env={**os.environ, "OUT": str(tmp_path / "out2")})
    assert run.returncode == 1 and "== bad: rc=3" in run.stdout and "== stub: rc=0" in run.stdout, run.stdout
    assert run.stdout.splitlines()[-1] == "== not passed: bad (rc=3)", run.stdout

def test_before_archive_packs_and_unpacks_where_only_it_was_carried(tmp_path):
    """scripts/before_pkg.py (scripts/ab_checkout.sh's archive of .before, what a GPU call carries): --pack writes
    DIR.tar.xz without __pycache__, the same bytes twice; steps.sh's unpack_before and before_dir (ab_bench.py)
    restore DIR from it when DIR is gone, given DIR or DIR.tar.xz; neither there: rc 1 /
    SystemExit naming the argument."""
    bp = load_script("before_pkg")
    pkg = tmp_path / ".before" / "fa_variants_before"
    (pkg / "hopper").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    (pkg / "__init__.py").write_text("from fa_variants_before import hopper\n")
    (pkg / "hopper" / "fa3.py").write_text("TILE_M = 128\n")
    (pkg / "__pycache__" / "x.pyc").write_bytes(b"\0")
    archive = bp.pack(tmp_path / ".before")
    assert archive == tmp_path / ".before.tar.xz"
    first = archive.read_bytes()
    assert bp.pack(str(tmp_path / ".before") + "/").read_bytes() == first
    subprocess.run(["rm", "-r", str(tmp_path / ".before")], check=True)
    steps = ROOT / "scripts" / "steps.sh"
    run = subprocess.run(["bash", "-c", f'source "{steps}"; unpack_before "{tmp_path}/.before"; echo "rc=$?"'],
                         capture_output=True, text=True, timeout=30)
    assert run.stdout == "rc=0\n", run.stdout + run.stderr
    got = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*") if p.is_file())
    assert got == ["__init__.py", "hopper/fa3.py"] and (pkg / "hopper" / "fa3.py").read_text() == "TILE_M = 128\n"
    subprocess.run(["rm", "-r", str(tmp_path / ".before")], check=True)
    assert bp.before_dir(archive, "ab_bench") == tmp_path / ".before" and (pkg / "__init__.py").is_file()
    archive.unlink()
    assert bp.before_dir(tmp_path / ".before") == tmp_path / ".before"  # the folder alone
    with pytest.raises(SystemExit, match=r"^ab_bench: --before .*missing: no fa_variants_before in"):
        bp.before_dir(tmp_path / "missing", "ab_bench")
    run = subprocess.run(["bash", "-c", f'source "{steps}"; unpack_before "{tmp_path}/missing"; echo "rc=$?"'],
                         capture_output=True, text=True, timeout=30)
    assert run.stdout == "rc=1\n", run.stdout + run.stderr


def test_the_before_archive_is_what_gpu_calls_carry():
    """.before.tar.xz is git-ignored (it travels by carry); pending_gpu.sh's and ab_checkout.sh's help name the carry
    [".gpu", ".before.tar.xz"], not the folder."""
    ignored = subprocess.run(["git", "check-ignore", ".before.tar.xz", ".before/x.py"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert ignored == [".before.tar.xz", ".before/x.py"], ignored
    for name in ("pending_gpu.sh", "ab_checkout.sh"):
        help_text = subprocess.run(["bash", str(ROOT / "scripts" / name), "--help"], cwd=ROOT, capture_output=True,
                                   text=True, timeout=30).stdout
        assert '[".gpu", ".before.tar.xz"]' in help_text and '".before"]' not in help_text, name


def test_bounded_script_precompiles_what_its_steps_run():
    """scripts/bounded_gpu.sh: its precompile (overflow_check.py --head-dim 256) holds every kernel its test selection
    and its speed step run (the D 256 default, bounded_units since session 11, and it with bounded_units=False, causal
    and not; bf16 fa3 at 256) and no other head_dim's; its -k selects the 10 D 256 default cases and the fault test,
    not the other head_dims' ("default" contains "fault": the plain word would select all 41)."""
    text = (ROOT / "scripts" / "bounded_gpu.sh").read_text()
    assert "overflow_check.py precompile --jobs 6 --head-dim 256" in text and "speed --rounds 8" in text
    jobs = load_script("overflow_check").jobs(256)
    want = {("fp8", 256, c, ch) for c in (False, True) for ch in ((), (("bounded_units", False),))}
    want |= {("bf16", 256, c, ()) for c in (False, True)}
    assert {(k, d, c, tuple(sorted(ch.items()))) for k, d, c, ch in jobs} == want, jobs
    expr = re.search(r'-k "([^"]+)"', text).group(1)
    collect = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "tests/test_fp8_overflow_gpu.py", "-k", expr], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
    ids = [line for line in collect.stdout.splitlines() if "::" in line]
    assert len(ids) == 11 and all("[d256-default-" in i or i.endswith("test_fused_units_fault") for i in ids), ids


def test_ncu_stalls_summary(tmp_path, capsys, monkeypatch):
    """scripts/ncu_stalls.py (stall reasons from an ncu report's raw page, parsed by ncu_table.parse_raw_csv): per
    kernel row of ncu's raw CSV (the units row and ncu's ==PROF== lines skipped) the largest stall reasons first, at
    most --top of them, non-numeric cells ignored; an unreadable file prints a line and exits 0 (a diagnostic)."""
    mod = load_script("ncu_stalls")
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    cols = ["ID", "Kernel Name", "gpu__time_duration.sum", "smsp__average_warp_latency_per_inst_issued.ratio",
            *(stall.format(r) for r in ("barrier", "mio_throttle", "short_scoreboard", "wait"))]
    rows = [cols, ["", "", "usecond", "", "ratio", "ratio", "ratio", "ratio"],
            ["0", "kernel_QuantPass_0", "45.7", "7.08", "1.5", "2,500.0", "0.4", "n/a"]]
    text = "==PROF== Disconnected\n" + "\n".join(",".join(f'"{c}"' for c in r) for r in rows) + "\n"
    lines = mod.summarise(mod.ncu_table.parse_raw_csv(text), 2)
    assert len(lines) == 1 and "45.7 usecond" in lines[0] and "7.08 cycles/issue" in lines[0], lines
    assert lines[0].endswith("mio_throttle 2500.00, barrier 1.50"), lines
    raw = tmp_path / "raw.csv"
    raw.write_text(text)
    monkeypatch.setattr(sys, "argv", ["ncu_stalls.py", str(raw), "--top", "1"])
    assert mod.main() == 0 and capsys.readouterr().out.rstrip().endswith("stalls per issue: mio_throttle 2500.00")
    monkeypatch.setattr(sys, "argv", ["ncu_stalls.py", str(tmp_path / "missing.csv")])
    assert mod.main() == 0 and "no stall summary: FileNotFoundError" in capsys.readouterr().out


def test_quantlanes_set():
    """quant_precompile.py --set quantlanes (session 12's V3_WIDE A/B; bench/NOTES.md, Session 12 outcomes): the
    bandwidth label defw (the module's default, V3_WIDE on), the precompile set (the default at D 64 / 128, default and
    wide at 256 for the default, no-smooth and head-smooth recipes) with real quant_host switches, and
    quant_sanitize.py's set of the same name."""
    from fa_variants.fp8 import quant_host

    bw = load_script("fp8_quant_bandwidth")
    assert bw.PIPES["defw"] == ("v3", {**bw.PIPES["def"][1], "V3_WIDE": True}) and hasattr(quant_host, "V3_WIDE")
    pre = load_script("quant_precompile")
    tasks = pre.tasks("quantlanes")
    assert len(tasks) == len(set(tasks)) == 8 and ("v3", "bf16", 256, "head-smooth+wide") in tasks
    assert all(t[3].partition("+")[2] in pre.QUANTLANES_KNOBS for t in tasks)
    assert pre.QUANTLANES_KNOBS["wide"] == {**pre.QUANTLANES_KNOBS["defaultql"], "V3_WIDE": True}
    assert all(hasattr(quant_host, n) for n in pre.QUANTLANES_KNOBS["wide"])
    assert '"quantlanes": [("wide"' in (ROOT / "scripts" / "quant_sanitize.py").read_text()


def test_quantdef_set_and_check_selection():
    """The GPU check of session 12's quant defaults (V3_WIDE, QUANT_PLANS on): quant_precompile.py --set quantdef holds
    the default recipe at head_dim 64 / 128 / 256 with the module's defaults (no knob) and the narrow pass at 256
    (V3_WIDE off, a real switch); the check's -k selects the 12 default-recipe v3 bf16 cases against the torch recipe
    (GQA, odd lengths) and the 2 default-recipe wide / narrow cases; fp8_quant_bandwidth.py's def11 is def with both
    off (session 11's default)."""
    from fa_variants.fp8 import quant_host

    pre = load_script("quant_precompile")
    tasks = pre.tasks("quantdef")
    assert tasks == [("v3", "bf16", d, "default") for d in (64, 128, 256)] + [("v3", "bf16", 256, "default+narrow")]
    assert pre.QUANTDEF_KNOBS == {"narrow": {"V3_WIDE": False}} and quant_host.V3_WIDE and quant_host.QUANT_PLANS
    # --unique's recording (quant_host.planned_passes per task, on the CPU here): Q's / K's passes at 256 wide with the
    # defaults and narrow with the knob, no key twice, the knob undone afterwards
    keys = pre.record(tasks, arch="sm_90a")
    assert len(keys) == len(set(keys)) and {k.arch for k in keys} == {"sm_90a"} and quant_host.V3_WIDE
    qk256 = [k.config.wide for k in keys if k.head_dim == 256 and k.config.role == "qk"]
    assert True in qk256 and False in qk256 and not any(k.config.wide for k in keys if k.head_dim != 256)
    expr = re.search(r'-k "([^"]+)"', pre.tasks.__doc__.replace("\n    ", " ")).group(1)
    collect = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "tests/test_fp8_quant_kernel.py", "-k", expr], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
    ids = [line for line in collect.stdout.splitlines() if "::" in line]
    assert len(ids) == 14 and sum("v3-bfloat16-default-" in i for i in ids) == 12, ids
    assert sum("test_v3_wide_bitwise[default-g" in i for i in ids) == 2, ids
    bw = load_script("fp8_quant_bandwidth")
    assert bw.PIPES["def11"] == ("v3", {**bw.PIPES["def"][1], "V3_WIDE": False, "QUANT_PLANS": False})


def test_quantbw_set_and_measures():
    """fp8_quant_bandwidth.py's measures of session 12's quantbw run (bench/NOTES.md, Session 12 outcomes) on the
    CPU: the back-to-back reading (per-position median durations, start-to-start period, the gap before each kernel; no pattern when the kernels do not divide into
    calls), the per-pass shares read from it, the A/B line with the graph ratio and host ms, the graph / end-to-end
    tables, the defn / defwn labels (V2_PDL off), defp (QUANT_PLANS), --skip PIPE:RECIPE:SHAPE and --shapes in --plan,
    and quant_precompile.py --set quantbw (quantlanes' passes + both at D 256 without PDL)."""
    bw = load_script("fp8_quant_bandwidth")
    events, t = [], 0.0
    for call in range(6):  # V+Ksum, torch's sum, K, Q; K and Q start 1 us before their predecessor's end (PDL)
        for name, dur, gap in (("kernel_QuantPass_0", 48.0, 2.0), ("void at::native::reduce_kernel<512>", 6.0, 1.0),
                               ("kernel_QuantPass_1", 36.0 + call, -1.0), ("kernel_QuantPass_2", 39.0, -1.0)):
            t += gap
            events.append((name, t, t + dur))
            t += dur
    kernels, gaps = bw.b2b_pattern(events, 6)
    assert kernels == "4 kernels, 131.5 us: pass 48.0, void at::native::reduce_ 6.0, pass 38.5, pass 39.0", kernels
    assert gaps == "period 132.5 us, gaps +1.0 us (before each: +2.0, +1.0, -1.0, -1.0)", gaps
    assert bw.b2b_pattern(events[:-1], 6)[0] == "" and "23 kernels for 6 calls" in bw.b2b_pattern(events[:-1], 6)[1]
    row = {"kernels_b2b": kernels, "pass_bytes": [168e6, 100e6, 101e6], "extra_bytes_read": 67e6, "kernels": ""}
    assert bw.pass_shares(row, 4.0, "kernels_b2b").startswith("V+Ksum 48.0 us 88%, K 38.5 us 65%, Q 39.0 us 65%")
    assert bw.pass_shares(row, 4.0) == ""
    rows = [dict(shape="D=256", pipeline=p, recipe="default", gpu_ms=ms, of_copy=0.5, match="ok", queued=True,
                 host_ms=h, graph_ms=g, graph_of_copy=0.6, eager_of_copy=0.3)
            for p, ms, h, g in (("def", 0.150, 0.210, 0.150), ("defw", 0.147, 0.220, 0.135))]
    text = bw.ab_lines(rows, "def", "defw")
    assert "  D=256       default   0.980   50.0% ->  50.0%  graph 0.900  host ms 0.210 -> 0.220" in text, text
    assert bw.PIPES["defn"] == ("v3", {**bw.PIPES["def"][1], "V2_PDL": False})
    assert bw.PIPES["defwn"] == ("v3", {**bw.PIPES["defw"][1], "V2_PDL": False})
    assert bw.PIPES["defp"] == ("v3", {**bw.PIPES["def"][1], "QUANT_PLANS": True})
    from fa_variants.fp8 import quant_host

    assert all(hasattr(quant_host, n) for p in ("defwn", "defp") for n in bw.PIPES[p][1])
    pre = load_script("quant_precompile")
    tasks = pre.tasks("quantbw")
    assert tasks[:8] == pre.tasks("quantlanes") and len(tasks) == len(set(tasks)) == 10
    assert pre.QUANTBW_KNOBS["widenopdl"] == {**pre.QUANTLANES_KNOBS["wide"], "V2_PDL": False}
    proc = subprocess.run([sys.executable, "scripts/fp8_quant_bandwidth.py", "--plan", "--shapes", "D=256,D=128 GQA",
                           "--pipelines", "def,defwn", "--skip", "defwn:default:D=128 GQA"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and "D=256 (batch" in proc.stdout and "D=64 (batch" not in proc.stdout, proc.stderr
    bad = subprocess.run([sys.executable, "scripts/fp8_quant_bandwidth.py", "--plan", "--shapes", "D=96"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "--shapes" in bad.stderr

def test_ncu_attribution_names_fp8turn_variants():
    """scripts/ncu_attribution.py profiles fa3-fp8 configs by name (session 12's ncu256 run: new vs
    single_overlap_noskip at head_dim 256): its default set is scripts/fa3_fp8_speed_ab.py's SETS["fp8turn"] (new: the
    default; single_overlap_noskip: one accumulator, no skip), and --impl accepts exactly those names (an unknown or
    repeated one, or a name without a set: ValueError naming --impl)."""
    names = {"new", "single_overlap_noskip"}
    variants = load_script("fa3_fp8_speed_ab").SETS["fp8turn"].variants[256]
    assert names <= set(variants) and variants["new"] == {}
    assert variants["single_overlap_noskip"]["skip_unit_rescale"] is False
    assert variants["single_overlap_noskip"]["two_level"] is False
    att = load_script("ncu_attribution")
    assert att.fp8_variants("fp8turn", 256) == variants
    assert '"--fp8-set", default="fp8turn"' in (ROOT / "scripts" / "ncu_attribution.py").read_text()
    spec = "fa3-fp8:new,fa3-fp8:single_overlap_noskip"
    assert att.impl_list(spec, variants) == ["fa3-fp8:new", "fa3-fp8:single_overlap_noskip"]
    for bad in ("fa3-fp8:nope", "fa3-fp8:new,fa3-fp8:new", "fa3-fp8:new"):
        with pytest.raises(ValueError, match="^--impl: "):
            att.impl_list(bad, variants if bad != "fa3-fp8:new" else None)
    assert att.impl_list("fa3,flash-attn-4") == ["fa3", "flash-attn-4"]


def test_fp8status_script_precompiles_what_its_status_runs():
    """scripts/fp8status_gpu.sh: its precompile (fp8status_precompile.py) holds, per head_dim 64 / 128 / 256 and causal
    mode, the default kernel with the quantisation pass (a default-recipe call), the single-accumulator kernel of the
    table (fp8status.SINGLE_ACCUMULATOR), bf16 fa3 and flash-attn-4; the status step asks for those head dims; its -k
    selects the 12 default-recipe GPU tests it counts."""
    from fa_variants.bench import fp8status

    text = (ROOT / "scripts" / "fp8status_gpu.sh").read_text()
    assert "--fp8-status only --head-dims 64,128,256" in text and "--fp8-rounds 6" in text
    jobs = load_script("fp8status_precompile").jobs()
    want = {(kind, d, c) for kind in ("fa4", "recipe", "fp8", "bf16") for d in (64, 128, 256) for c in (False, True)}
    assert {(k, d, c) for k, d, c, _ in jobs} == want and len(jobs) == 24
    assert all(ch == fp8status.SINGLE_ACCUMULATOR[d] for k, d, _, ch in jobs if k == "fp8")
    assert all(ch == ("bfloat16", ("block", True, True, True)) for k, _, _, ch in jobs if k == "recipe")
    assert jobs[0][:2] == ("fa4", 256)
    expr = re.search(r'-k "([^"]+)"', text).group(1)
    collect = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "tests/test_fa3_fp8_gpu.py", "-k", expr], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
    ids = [line for line in collect.stdout.splitlines() if "::test_default_recipe[" in line]
    assert len(ids) == 12 and "^12 passed" in text, collect.stdout[-500:]


def test_quantbw2_set_and_pipes():
    """Session 13's quantbw2 run: fp8_quant_bandwidth.py's defc (whole-call plans) and defcl (+ the fused mean counted
    late) are def with those switches only, and quant_precompile.py --set quantbw2 records the 12 passes they and the
    GPU tests launch (V, K, Q at D 64 / 128 / 256 + V's late-count pass), without a GPU."""
    bw = load_script("fp8_quant_bandwidth")
    assert bw.PIPES["defc"] == ("v3", {**bw.PIPES["def"][1], "QUANT_CALL_PLANS": True})
    assert bw.PIPES["defcl"] == ("v3", {**bw.PIPES["defc"][1], "V3_FUSED_MEAN_LATE": True})
    from fa_variants.fp8 import quant_host

    assert all(hasattr(quant_host, name) for name in bw.PIPES["defcl"][1])
    pre = load_script("quant_precompile")
    keys = pre.record(pre.tasks("quantbw2"), arch="sm_90a")
    assert len(keys) == 12 and sum(key.config.late_count for key in keys) == 3
    assert "--set quantbw2 --unique" in (ROOT / "scripts" / "quantbw2_gpu.sh").read_text()
