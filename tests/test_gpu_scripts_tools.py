"""The GPU diagnostics' CPU-side logic: scripts/sanitize.py (summary lines, plan, per-head_dim runs with a fake
sanitizer), scripts/ncu_stalls.py and scripts/ncu_attribution.py."""
import sys

import pytest
from helpers import ROOT, load_script


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
    fake.write_text("#!/usr/bin/env bash\necho \"ARGS $*\"; echo 'CALLS 1 FAILED 0'; echo 'ERROR SUMMARY: 0 errors'\n", encoding="utf-8")
    fake.chmod(0o755)
    monkeypatch.setattr(mod, "_runnable_backends", lambda names: (list(names), []))
    monkeypatch.setattr(mod.sys, "executable", str(fake))
    rc = mod.main(["--tools", "memcheck", "--backends", "fa3-fp8", "--head-dims", "64", "256", "--per-head-dim",
                   "--precompile", "--sanitizer", str(fake), "--out", str(tmp_path / "out"), "--timeout", "30"])
    printed = capsys.readouterr().out
    assert rc == 0 and "precompile: 4 processes, 0 failed" in printed
    for d in (64, 256):
        assert f"memcheck  fa3-fp8-d{d} clean (1 calls" in printed
        log = (tmp_path / "out" / f"memcheck-fa3-fp8-d{d}.log").read_text(encoding="utf-8")
        assert "--tool memcheck" in log and log.rstrip().count("--head-dims") == 1 and f"--head-dims {d}" in log
        for causal in (0, 1):
            pre = (tmp_path / "out" / f"precompile-fa3-fp8-d{d}-c{causal}.log").read_text(encoding="utf-8")
            assert f"--backend fa3-fp8 --head-dims {d} --causal-only {causal}" in pre and "--tool" not in pre
    assert "--per-head-dim" in (ROOT / "scripts" / "oob_gpu.sh").read_text(encoding="utf-8")


def test_sanitize_reads_racecheck_summaries():
    """racecheck ends with 'RACECHECK SUMMARY: ... (n errors, ...)', not 'ERROR SUMMARY' (every clean racecheck
    pair read as FAILED on the H200)."""
    log = "CALLS 20 FAILED 0\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    assert _sanitize()._summary("racecheck", "fa2", 0, log, 1.0) == ("racecheck fa2      clean (20 calls, 1 s)", True)
    bad = log.replace("(0 errors", "(3 errors")
    assert _sanitize()._summary("racecheck", "fa2", 0, bad, 1.0)[0].startswith("racecheck fa2      3 ERRORS")


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
    raw.write_text(text, encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["ncu_stalls.py", str(raw), "--top", "1"])
    assert mod.main() == 0 and capsys.readouterr().out.rstrip().endswith("stalls per issue: mio_throttle 2500.00")
    monkeypatch.setattr(sys, "argv", ["ncu_stalls.py", str(tmp_path / "missing.csv")])
    assert mod.main() == 0 and "no stall summary: FileNotFoundError" in capsys.readouterr().out


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
    assert '"--fp8-set", default="fp8turn"' in (ROOT / "scripts" / "ncu_attribution.py").read_text(encoding="utf-8")
    spec = "fa3-fp8:new,fa3-fp8:single_overlap_noskip"
    assert att.impl_list(spec, variants) == ["fa3-fp8:new", "fa3-fp8:single_overlap_noskip"]
    for bad in ("fa3-fp8:nope", "fa3-fp8:new,fa3-fp8:new", "fa3-fp8:new"):
        with pytest.raises(ValueError, match="^--impl: "):
            att.impl_list(bad, variants if bad != "fa3-fp8:new" else None)
    assert att.impl_list("fa3,flash-attn-4") == ["fa3", "flash-attn-4"]


def test_grad_host_finds_each_sync_with_its_python_frame(monkeypatch):
    """scripts/grad_host.py's `find_syncs`: each "synchronizing" warning of one step (what sync debug mode "warn" gives
    at a host-device sync) is kept with the innermost Python frame that made it; other warnings are not counted;
    the debug mode is set for the step and put back after it."""
    import warnings

    import torch
    grad_host = load_script("grad_host")
    modes = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    def read_back():
        warnings.warn("called a synchronizing CUDA operation")

    def step():
        warnings.warn("something else")
        # the mode's once-per-process notice when first set (session 45 counted it as a sync)
        warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
                      "operations")
        read_back()
        read_back()
    stacks = grad_host.find_syncs(step)
    assert [s.split(": ", 1)[0].rsplit(" ", 1)[-1] for s in stacks] == ["(read_back)", "(read_back)"]
    assert all("in step" in s for s in stacks) and modes == ["warn", "default"]


def test_grad_host_runs_end_to_end_with_cuda_stubbed(tmp_path, monkeypatch, capsys):
    """scripts/grad_host.py's main on the CPU (CUDA's events, syncs, debug mode and allocator counters stubbed, the
    inputs shrunk): a row per entry with the host times, the syncs of the forward and the backward apart and the
    allocator counters, a profile file per entry that ran, and an entry that cannot run (SDPA on cuDNN alone here)
    reported as such, not a crash."""
    import torch
    grad_host = load_script("grad_host")

    class Event:
        def __init__(self, **kwargs):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):
            return 0.001

    real_randn = torch.randn
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda: {"num_device_alloc": 3})
    monkeypatch.setattr(torch, "randn", lambda *shape, device=None, **kw: real_randn(1, 16, 2, shape[3], **kw))
    monkeypatch.setattr(grad_host, "SHAPES", [(64, 4096, False)])
    assert grad_host.main(["--steps", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for entry in ("ours", "sdpa"):
        assert f"D64_N4096 {entry} " in out and (tmp_path / f"profile_D64_N4096_{entry}.txt").exists()
    assert "0 in the forward, 0 in the backward" in out and "'num_alloc_retries': 0" in out
    assert "D64_N4096 sdpa-cudnn not run:" in out
