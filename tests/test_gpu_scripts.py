"""The GPU-host scripts' shared checks: every shell script parses and answers --help, every scripts/*_gpu.sh uses
steps.sh's preamble and ends with steps_exit; scripts/steps.sh's pieces with a fake nvidia-smi (session, steps, exit
code, commit label, a script killed mid-step); scripts/pending_gpu.sh; the .before archive a GPU call carries. The
scripts' own plans and summaries are tested by theme in tests/test_gpu_scripts_*.py (fp8, quant, decode, speed_ab,
tools)."""
import collections
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, collected_ids, git_checkout_or_skip, load_script


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
    first = (ROOT / "scripts" / script).read_text(encoding="utf-8").splitlines()[1].removeprefix("# ")
    assert run.returncode == 0 and run.stderr == "" and run.stdout.splitlines()[0] == first
    assert "set -" not in run.stdout and list(work.iterdir()) == []


#: GPU scripts that read their own arguments before session_setup (help_from_header first, session_setup later)
_OWN_PREAMBLE = {"pending_gpu.sh", "study_gpu.sh", "suite_gpu.sh"}


@pytest.mark.parametrize("script", [s for s in SHELL_SCRIPTS if s.endswith("_gpu.sh")])
def test_gpu_script_preamble(script):
    """Every GPU script runs under `set -uo pipefail`, sources steps.sh and, before its first step, answers --help
    and sets up its session through steps.sh (gpu_session, or help_from_header first then session_setup); none
    copies the xdist probe (steps.sh's xdist_flag); its last command is steps_exit, so its exit code is its steps'
    and not its closing summary's (session 11: oob_gpu.sh exited 1 with memcheck clean, its last grep found nothing)."""
    lines = [line for line in (ROOT / "scripts" / script).read_text(encoding="utf-8").splitlines() if not line.startswith("#")]
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
""", encoding="utf-8")
    runs = {mode: subprocess.run(["bash", str(driver), str(tmp_path / mode), mode], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=30) for mode in ("pass", "fail")}
    assert runs["pass"].returncode == 0, runs["pass"].stdout + runs["pass"].stderr
    assert "not passed" not in runs["pass"].stdout
    fail = runs["fail"]
    assert fail.returncode == 1 and fail.stdout.splitlines()[-1] == \
        "== not passed: bad (rc=3) behind (rc=1) later (skipped)", fail.stdout + fail.stderr


@pytest.mark.parametrize("log, passed", [("12 passed, 3 warnings in 9.1s", True), ("112 passed in 9.1s", False),
                                         ("1 failed, 11 passed in 9.1s", False), ("", False)])
def test_expect_passed_wants_the_exact_count(tmp_path, log, passed):
    """steps.sh expect_passed 12 (the scripts' summary of their pytest step): prints "== pytest" and the log's
    result lines, and notes the step pytest as not passed unless the log says exactly "12 passed" ("112 passed" is
    not 12)."""
    env = dict(os.environ, PATH=f"{_fake_bin(tmp_path / 'bin', _FAKE_SMI)}:{os.environ['PATH']}")
    driver = tmp_path / "driver.sh"
    driver.write_text(f"""set -uo pipefail
source {ROOT}/scripts/steps.sh
session_setup "$1/logs"
printf '%s\n' "$2" > "$LOGS/pytest.log"
expect_passed 12
steps_exit
""", encoding="utf-8")
    run = subprocess.run(["bash", str(driver), str(tmp_path / "s"), log], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=30)
    assert "== pytest" in run.stdout and (log in run.stdout if log else True)
    assert run.returncode == (0 if passed else 1), run.stdout + run.stderr
    if not passed:
        assert run.stdout.splitlines()[-1] == "== not passed: pytest (not 12 passed)"


def _fake_bin(folder, nvidia_smi):
    """A folder holding an executable `nvidia-smi` that runs the bash text NVIDIA_SMI."""
    folder.mkdir(exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text("#!/usr/bin/env bash\n" + nvidia_smi + "\n", encoding="utf-8")
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
        return Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_steps_sh_session(tmp_path):
    """scripts/steps.sh without a GPU (a fake nvidia-smi): session_setup writes commit.txt, gpu.txt and starts
    clocks.csv; step logs each command, says its exit status (124 when its limit cut it) and, with STEP_TAIL,
    the log's tail; pack_logs stops the clock logger and packs the folder; a bare `wait` does not wait for
    the logger; the logger stops when a script exits without pack_logs."""
    import tarfile

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
""", encoding="utf-8")
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
    assert (logs / "ok.log").read_text(encoding="utf-8") == "hello\n" and (logs / "tailed.log").read_text(encoding="utf-8") == "a\nb\n"
    assert (logs / "commit.txt").read_text(encoding="utf-8") == _expected_commit(ROOT) and "FAKE H200" in (logs / "gpu.txt").read_text(encoding="utf-8")
    assert _gone_within(pid, 5.0) and "now, 0, 1980 MHz" in (logs / "clocks.csv").read_text(encoding="utf-8")
    with tarfile.open(tmp_path / "out" / "logs.tgz") as tar:
        assert {"logs/ok.log", "logs/slow.log", "logs/commit.txt", "logs/gpu.txt", "logs/clocks.csv"} <= set(tar.getnames())

    run = subprocess.run(["bash", str(driver), str(tmp_path / "out2"), "no"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=30)
    pid = int(run.stdout.split()[1])
    assert _gone_within(pid, 5.0) and not (tmp_path / "out2" / "logs.tgz").exists()


def _expected_commit(root) -> str:
    """What steps.sh write_commit writes for the tree at root (test_steps_sh_commit_label)."""
    given = root / ".gpu" / "commit.txt"
    first = given.read_text(encoding="utf-8").splitlines()[0] if given.is_file() and given.read_text(encoding="utf-8").strip() else ""
    if first:
        return f"{first} (from .gpu/commit.txt)\n"
    head = subprocess.run(["git", "log", "--oneline", "-1"], cwd=root, capture_output=True, text=True).stdout
    return f"{head.splitlines()[0] if head.strip() else 'unknown (git log gave no commit)'} (git on this host)\n"


def test_steps_sh_commit_label(tmp_path):
    """steps.sh write_commit (session_setup's commit.txt): the first line of .gpu/commit.txt labelled "(from
    .gpu/commit.txt)" when the caller wrote one (a GPU host's copied git metadata can be older than the tree: session
    11 said 813a508 for c8a3a0a), else the tree's `git log --oneline -1` labelled "(git on this host)"; an empty file
    counts as none. pending_gpu.sh's help says to write it before a call."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "steps.sh").write_text((ROOT / "scripts" / "steps.sh").read_text(), encoding="utf-8")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "stale metadata"], cwd=tmp_path, check=True)
    stale = subprocess.run(["git", "log", "--oneline", "-1"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()

    def label():
        out = tmp_path / "commit.txt"
        subprocess.run(["bash", "-c", f'source "{scripts}/steps.sh"; write_commit "{out}"'], cwd=tmp_path, check=True,
                       timeout=30)
        return out.read_text(encoding="utf-8")

    assert label() == f"{stale} (git on this host)\n" == _expected_commit(tmp_path)
    (tmp_path / ".gpu").mkdir()
    (tmp_path / ".gpu" / "commit.txt").write_text("", encoding="utf-8")
    assert label() == f"{stale} (git on this host)\n"
    (tmp_path / ".gpu" / "commit.txt").write_text("c8a3a0a fa3-fp8 head_dim 256: variant\n", encoding="utf-8")
    assert label() == "c8a3a0a fa3-fp8 head_dim 256: variant (from .gpu/commit.txt)\n" == _expected_commit(tmp_path)
    assert "git log --oneline -1 > .gpu/commit.txt" in (ROOT / "scripts" / "pending_gpu.sh").read_text(encoding="utf-8")
    # a tree that is no git checkout (a source archive): one line saying so, not git's error
    plain = tmp_path / "plain"
    (plain / "scripts").mkdir(parents=True)
    (plain / "scripts" / "steps.sh").write_text((ROOT / "scripts" / "steps.sh").read_text(), encoding="utf-8")
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tmp_path))  # no repository above it either
    subprocess.run(["bash", "-c", f'source "{plain}/scripts/steps.sh"; write_commit "{plain}/commit.txt"'], cwd=plain,
                   check=True, timeout=30, env=env)
    assert (plain / "commit.txt").read_text(encoding="utf-8") == "unknown (git log gave no commit) (git on this host)\n"


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
""", encoding="utf-8")
    run = subprocess.run([*killer, "bash", str(driver), str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=30)
    return int((out / "logger").read_text(encoding="utf-8")), int((out / "step").read_text(encoding="utf-8")), run


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
""", encoding="utf-8")
    import time

    t0 = time.monotonic()
    run = subprocess.run(["bash", str(driver), str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=30)
    assert "next step reached" in run.stdout and "== deaf: rc=137" in run.stdout, run.stdout + run.stderr
    assert time.monotonic() - t0 < 10


def test_pending_runs_named_scripts_and_the_checks(tmp_path):
    """scripts/pending_gpu.sh (a session's GPU work left for the next one's calls): refuses a name without a script
    (exit 2, before any GPU work); every script its header plans exists (the plan may be empty); --checks
    selects the 31 GPU tests of the head_dim 256 fa3-fp8 default (bounded_units flipped in session 11) its header
    counts, after scripts/checks_precompile.py's 11 jobs (the kernels of those tests: the default recipe's bf16 kernel
    causal and not, the two-level recipes' fp16 causal one, the fault test's bounded_units=False); a stub script named
    on the command line runs with OUT under pending/NAME and its output is summarised."""
    script = ROOT / "scripts" / "pending_gpu.sh"
    text = script.read_text(encoding="utf-8")
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
    ids = collected_ids("-m", "gpu", *files, "-k", expr)
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
        (scripts / f).write_text((ROOT / "scripts" / f).read_text(), encoding="utf-8")
    (scripts / "stub_gpu.sh").write_text('#!/usr/bin/env bash\necho "stub ran with OUT=$OUT"\n', encoding="utf-8")
    run = subprocess.run(["bash", str(scripts / "pending_gpu.sh"), "stub"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env={**os.environ, "OUT": str(tmp_path / "out")})
    assert run.returncode == 0, run.stderr
    assert "== stub: rc=0" in run.stdout and f"stub ran with OUT={tmp_path / 'out' / 'pending' / 'stub'}" in run.stdout
    # a named script that fails: the queue goes on, then exits 1 naming it (steps.sh steps_exit)
    (scripts / "bad_gpu.sh").write_text('#!/usr/bin/env bash\nexit 3\n', encoding="utf-8")
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
    (pkg / "__init__.py").write_text("from fa_variants_before import hopper\n", encoding="utf-8")
    (pkg / "hopper" / "fa3.py").write_text("TILE_M = 128\n", encoding="utf-8")
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
    assert got == ["__init__.py", "hopper/fa3.py"] and (pkg / "hopper" / "fa3.py").read_text(encoding="utf-8") == "TILE_M = 128\n"
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
    git_checkout_or_skip()  # git's ignore rules
    ignored = subprocess.run(["git", "check-ignore", ".before.tar.xz", ".before/x.py"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert ignored == [".before.tar.xz", ".before/x.py"], ignored
    for name in ("pending_gpu.sh", "ab_checkout.sh"):
        help_text = subprocess.run(["bash", str(ROOT / "scripts" / name), "--help"], cwd=ROOT, capture_output=True,
                                   text=True, timeout=30).stdout
        assert '[".gpu", ".before.tar.xz"]' in help_text and '".before"]' not in help_text, name


def test_short_script_selects_its_tests_and_shapes():
    """scripts/short_gpu.sh (session 17's short-prefill limits): its pytest -k selects the 6 tests its pass line names
    (auto's short calls at D 64 / 128 / 256), its A/B shapes are fa3_speed_ab.py shapes at the short head dims and the
    non-causal limit's next step at both."""
    text = (ROOT / "scripts" / "short_gpu.sh").read_text(encoding="utf-8")
    expr = re.search(r'-k "([^"]+)"', text).group(1)
    ids = collected_ids("-m", "gpu", "tests/test_fa3_gpu.py", "-k", expr)
    assert len(ids) == 6 and all("short_calls_run_persistent" in i for i in ids), ids
    assert "\nexpect_passed 6\n" in text and "VARIANTS=old,new,persistent\n" in text
    shapes = re.search(r"SHAPES=(\S+)", text).group(1).split(",")
    from fa_variants.hopper import fa3

    assert sorted(shapes) == sorted(f"{d}:{fa3.SHORT_MAX_SEQLEN_K + 1024}:full" for d in fa3.SHORT_HEAD_DIMS)


def test_balanced_script_selects_its_tests_and_shapes():
    """scripts/balanced_gpu.sh (session 17, Sm90Config.balanced): its pytest -k selects the 13 tests its pass line
    names (the persistent variants' matrix with balanced at D 64 / 128 / 256, and the L2-section test's balanced
    case), the sanitizers run with FA_VARIANTS_SHORT_BALANCED=1 (sanitize.py's short causal shapes then take the
    balanced grid), its A/B times the balanced variant beside persistent at causal shapes of each head dim it runs at,
    plus a non-causal control."""
    text = (ROOT / "scripts" / "balanced_gpu.sh").read_text(encoding="utf-8")
    expr = re.search(r'-k "([^"]+)"', text).group(1)
    ids = collected_ids("-m", "gpu", "tests/test_fa3_gpu.py", "-k", expr)
    assert len(ids) == 13 and sum("persistent_variants[balanced" in i for i in ids) == 12, ids
    assert "\nexpect_passed 13\n" in text and "VARIANTS=old,new,persistent,balanced\n" in text
    shapes = ",".join(re.findall(r"SHAPES=(?:\$SHAPES,)?(\S+)", text)).split(",")
    ab = load_script("fa3_speed_ab")
    assert {int(s.split(":")[0]) for s in shapes if s.endswith(":causal")} == set(ab.VARIANTS["balanced"][0])
    assert any(s.endswith(":full") for s in shapes) and ab.BALANCED == ("old", "new", "persistent", "balanced")
    assert "env FA_VARIANTS_SHORT_BALANCED=1 python3 scripts/sanitize.py --tools memcheck racecheck" in text


def test_fa4_precompile_scripts_turn_its_disk_cache_on():
    """A script that precompiles flash-attn-4 (fa3_speed_ab.py --precompile-fa4, which refuses to run without it)
    exports FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 before that step, so the timed process loads those kernels (session
    17's first call lost its precompile step to this)."""
    users = [p for p in sorted((ROOT / "scripts").glob("*.sh")) if "--precompile-fa4" in p.read_text(encoding="utf-8")]
    assert users
    for path in users:
        text = path.read_text(encoding="utf-8")
        export = text.find("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1")
        assert 0 <= export < text.index("--precompile-fa4"), path.name


def test_suite_parts_name_every_gpu_test_file_once():
    """scripts/suite_gpu.sh (session 28: the whole GPU suite no longer fits one call on a cold machine): its file
    lists (parts 1-4) together are exactly the test files with GPU tests (``-m "gpu and not slow"``), none in two, so
    a new GPU test file fails here until it is given a part; the slow GPU tests (part "slow") live in those files too;
    a part other than 1, 2, 3, 4, slow, cpu1 or cpu2 is refused with a one-line error; skips are listed with their
    reasons (-rs). Parts "cpu1" and "cpu2" run every test not marked gpu (the CPU paths on the GPU host's torch),
    alternate test files each, their skips unchecked."""
    text = (ROOT / "scripts" / "suite_gpu.sh").read_text(encoding="utf-8")
    parts = [set(re.search(rf'{name}="([^"]+)"', text).group(1).split())
             for name in ("PART1", "PART2", "PART3", "PART4")]
    files = {i.split("::")[0] for i in collected_ids("-m", "gpu and not slow")}
    every = set().union(*parts)
    assert sum(map(len, parts)) == len(every) and every == files, (files - every, parts)
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "suite_gpu.sh"), "5"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "PART must be 1, 2, 3, 4, slow, cpu1 or cpu2" in bad.stderr
    assert 'MARK="not gpu"' in text and '[ "${1#cpu}" = "$1" ] && grep' in text
    assert {i.split("::")[0] for i in collected_ids("-m", "gpu and slow")} <= every
    assert "-rfEs" in text  # skips listed; any but the two-GPU tests' (their reason, matched here) fails the call
    assert 'grep -v "needs two GPUs"' in text and 'pytest.skip("needs two GPUs' in (ROOT / "tests" / "test_edge_cases.py").read_text(encoding="utf-8")


@pytest.mark.parametrize("part, skip", [("cpu1", None), ("2", "tests/test_backward_gpu.py"),
                                        ("1", "tests/test_fa3_gpu.py"), ("1", "tests/test_fa2_gpu.py")])
def test_suite_gpu_sh_skip_takes_any_file_of_the_part(tmp_path, part, skip):
    """SUITE_SKIP names a file of the part, whichever: a name at a line's end in the lists, or any file of the cpu
    halves (one per line from ls), was refused as "not in part" (session 48's review). Run with a fake python3 that
    prints the pytest command line; the skipped file is not on it, the part's other files are."""
    bin_dir = _fake_bin(tmp_path / "bin", _FAKE_SMI)
    (bin_dir / "python3").write_text('#!/usr/bin/env bash\n[[ "$*" == *"import xdist"* ]] && exit 1\necho "ARGS: $*"\n', encoding="utf-8")
    (bin_dir / "python3").chmod(0o755)
    half = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py"))[0::2]
    skip = skip or half[len(half) // 2]
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(tmp_path / "out"), SUITE_SKIP=skip)
    run = subprocess.run(["bash", str(ROOT / "scripts" / "suite_gpu.sh"), part], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=120)
    args = (tmp_path / "out" / f"suite{part}" / "logs" / "pytest.log").read_text(encoding="utf-8")
    assert "not in part" not in run.stderr and "ARGS: -m pytest" in args, (run.stderr, args)
    named = {word for word in args.split() if word.startswith("tests/")}
    assert skip not in named and len(named) > 1, args
    assert part != "cpu1" or named == set(half) - {skip}, args


@pytest.mark.parametrize("mib, workers, want", [
    ("81559", "", "-n 8"), ("143771", "", "-n 14"), ("4000", "", "-n 1"), (None, "", "-n 14"), ("81559", "3", "-n 3"),
    ("81559 \r", "", "-n 8"), ("[N/A]", "", "-n 14")])
def test_xdist_workers_follow_the_gpu_memory(tmp_path, mib, workers, want):
    """steps.sh's xdist_flag 14 caps its workers at one per 10 GB of GPU memory (session 35: 14 workers ran tests of
    suite part 1 out of memory on a 78 GiB H100; they passed at 3), no cap where nvidia-smi fails, and
    SUITE_WORKERS as given."""
    (tmp_path / "xdist").mkdir()
    (tmp_path / "xdist" / "__init__.py").write_text("", encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # mib None: an nvidia-smi that fails (no driver), ahead of any real one on PATH
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho {mib}\n" if mib else "#!/bin/sh\nexit 9\n", encoding="utf-8")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PATH=f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    env.pop("SUITE_WORKERS", None)
    if workers:
        env["SUITE_WORKERS"] = workers
    out = subprocess.run(["bash", "-c", "source scripts/steps.sh && xdist_flag 14"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == want


@pytest.mark.parametrize("timeout_plugin", [True, False])
def test_suite_gpu_sh_cpu_halves_limit_each_test_where_pytest_timeout_is(tmp_path, timeout_plugin):
    """Sessions 48 and 49: a cpu half stalled after a worker was killed and its step's limit ended it with no
    summary. Where pytest-timeout imports, the halves pass --timeout (SUITE_TEST_TIMEOUT, default 150); the GPU parts
    never do (a cold compile may be long); without the plugin nothing is added (pytest would refuse the flag)."""
    bin_dir = _fake_bin(tmp_path / "bin", _FAKE_SMI)
    missing = ' || "$*" == *"import pytest_timeout"*' if not timeout_plugin else ""
    (bin_dir / "python3").write_text(f'#!/usr/bin/env bash\n[[ "$*" == *"import xdist"*{missing} ]] && exit 1\n'
                                     'echo "ARGS: $*"\n', encoding="utf-8")
    (bin_dir / "python3").chmod(0o755)
    for part, timeout in (("cpu2", "77"), ("1", "77")):
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(tmp_path / "out"),
                   SUITE_TEST_TIMEOUT=timeout)
        subprocess.run(["bash", str(ROOT / "scripts" / "suite_gpu.sh"), part], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=120)
        args = (tmp_path / "out" / f"suite{part}" / "logs" / "pytest.log").read_text(encoding="utf-8")
        assert "ARGS: -m pytest" in args, args
        assert ("--timeout=77" in args) == (timeout_plugin and part == "cpu2"), args
