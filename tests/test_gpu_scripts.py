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
from pathlib import Path

import pytest
from helpers import ROOT, collected_ids, load_script


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







def test_fp8d128_script_tests_what_it_times():
    """scripts/fp8d128_gpu.sh (session 13): its six test processes (one per candidate and causal mode, -k "...-$v- and $c")
    select, together and without overlap, exactly the 22 GPU tests of the three timed head_dim 128 lookahead candidates
    (18 vs the emulation and float64, 4 on spread V scales; the script's pass count 22), each process one kernel; the
    A/B's variants are those configs (same names, same changes), valid, new the default; the candidates' tile_n (192 /
    128) are not the default's (K/V scale blocks of their own height, the PyTorch recipe)."""
    text = (ROOT / "scripts" / "fp8d128_gpu.sh").read_text()
    assert "--set fp8look128 --head-dims 128" in text and "((passed == 22))" in text
    assert "for v in look192 look192_fused look128h_fb; do" in text and "for c in full causal; do" in text
    expr = re.search(r'-k "([^"]+)"', text).group(1)
    ids = []
    for v in ("look192", "look192_fused", "look128h_fb"):
        for c in ("full", "causal"):
            collect = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                      "tests/test_fa3_fp8_speed_gpu.py", "-k", expr.replace("$v", v).replace("$c", c)],
                                     capture_output=True, text=True, timeout=120, cwd=ROOT)
            mine = [line for line in collect.stdout.splitlines() if "::" in line]
            assert mine and all(f"fp8look128-d128-{v}-" in i and i.endswith(f"-{c}]") for i in mine), (v, c, mine)
            ids += mine
    assert len(ids) == len(set(ids)) == 22, ids
    ab = load_script("fa3_fp8_speed_ab")
    variants = ab.FP8LOOK128_VARIANTS[128]
    assert list(variants) == ["new", "look192", "look192_fused", "look128h_fb"] and variants["new"] == {}
    import test_fa3_fp8_speed_gpu as gpu_tests
    for name in ("look192", "look192_fused", "look128h_fb"):
        cfg = ab.kernel_config(128, variants[name])
        assert cfg == ab.kernel_config(128, gpu_tests.FP8LOOK128_VARIANTS[f"fp8look128-d128-{name}"][1]), name
        assert cfg.s_lookahead and cfg.two_level and cfg.tile_n != ab.kernel_config(128, {}).tile_n, name
        cfg.check(128)
        assert any(f"fp8look128-d128-{name}-" in i for i in ids), name
    assert not ab.kernel_config(128, variants["new"]).s_lookahead
    assert ab.failed_variants("FAILED tests/test_fa3_fp8_speed_gpu.py::test_fp8look128_v_scales_spread"
                              "[fp8look128-d128-look192-1x300x1000x4x2-causal] - AssertionError", "fp8look128") == ["look192"]


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





def test_fa3gap_script_tests_and_times_the_late_set():
    """scripts/fa3gap_gpu.sh (session 13): its pytest -k selects exactly the 10 GPU tests its pass line counts (late
    and late-obpv vs float64, late's same values and extreme logits, turn at D 128), and its A/B times fa3_speed_ab.py's
    LATE set at D 128: late = the default + late_huge_fix, late-obpv = + rescale_o_before_pv, valid configs."""
    from fa_variants.hopper import fa3

    text = (ROOT / "scripts" / "fa3gap_gpu.sh").read_text()
    expr = re.search(r'-k "([^"]+)"', text).group(1)
    collect = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "tests/test_fa3_gpu.py", "-k", expr], capture_output=True, text=True, timeout=120,
                             cwd=ROOT)
    ids = [line for line in collect.stdout.splitlines() if "::" in line]
    assert len(ids) == 10 and "10 passed" in text, ids
    ab = load_script("fa3_speed_ab")
    assert f"--variants {','.join(ab.LATE)} " in text
    assert ab.LATE == ("old", "new", "late", "late-obpv", "turn")
    default = fa3.DEFAULT_CONFIGS[128]
    assert ab.variant_config("late", 128) == dataclasses.replace(default, late_huge_fix=True)
    assert ab.variant_config("late-obpv", 128) == dataclasses.replace(default, late_huge_fix=True,
                                                                       rescale_o_before_pv=True)
    for name in ab.LATE:
        ab.variant_config(name, 128).check(128)
    assert not any(c.late_huge_fix for c in fa3.DEFAULT_CONFIGS.values())


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


def test_quantq_set_and_pipes():
    """Session 13's quantq run: fp8_quant_bandwidth.py's defq is def with ``V3_CURSOR`` only; quant_precompile.py --set
    quantq records the 15 passes its tests, A/B and ncu launch (V, K, Q at D 64 / 128 / 256, and K, Q with the cursor),
    without a GPU; the script's test selection is the 16 GPU cases its pass rule counts (12 "v3+cursor" default-recipe
    cases of test_pass_matches_torch_bitwise, 4 of test_v3_cursor_bitwise)."""
    bw = load_script("fp8_quant_bandwidth")
    assert bw.PIPES["defq"] == ("v3", {**bw.PIPES["def"][1], "V3_CURSOR": True})
    from fa_variants.fp8 import quant_host

    assert all(hasattr(quant_host, name) for name in bw.PIPES["defq"][1])
    pre = load_script("quant_precompile")
    keys = pre.record(pre.tasks("quantq"), arch="sm_90a")
    assert len(keys) == 15 and sum(key.config.cursor for key in keys) == 6
    assert all(key.config.role == "qk" for key in keys if key.config.cursor)
    text = (ROOT / "scripts" / "quantq_gpu.sh").read_text()
    assert "--set quantq --unique" in text and '-k "cursor and not head"' in text and '"^16 passed"' in text
    assert "--pipelines def,defq" in text and "pipes=def,defq" in text
    import importlib.util

    spec = importlib.util.spec_from_file_location("tfqk", ROOT / "tests" / "test_fp8_quant_kernel.py")
    tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tests)
    matches = sum(p == "v3+cursor" and c == "default" for p, _, c in tests.CASES) * len(tests.SHAPES) * 3
    assert matches + sum(c == "default" for _, c, _ in tests.CURSOR_CASES) == 16
