"""The GPU-host scripts' CPU-side logic: scripts/sanitize.py's summary lines, and the shell scripts parse."""
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


@pytest.mark.parametrize("script", ["gpu_memory_fp16.sh", "h200_session.sh", "gpu_check.sh", "cache_gpu.sh",
                                    "decode_gpu.sh", "study_gpu.sh"])
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=True)


@pytest.mark.parametrize("backend", ["fa1", "fa2", "fa3", "fa3-fp8"])
def test_sanitize_plan_reads_the_registry(backend):
    """The worker's (dtype, head_dims) come from the one registry (a renamed dispatch helper broke every pair
    on the H200 before a single launch: 'no calls finished')."""
    import torch

    dtype, head_dims = _sanitize().plan(backend)
    assert dtype in (torch.bfloat16, torch.float16) and head_dims and set(head_dims) <= {64, 96, 128, 256}


def test_sanitize_reads_racecheck_summaries():
    """racecheck ends with 'RACECHECK SUMMARY: ... (n errors, ...)', not 'ERROR SUMMARY' (every clean racecheck
    pair read as FAILED on the H200)."""
    log = "CALLS 20 FAILED 0\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    assert _sanitize()._summary("racecheck", "fa2", 0, log, 1.0) == ("racecheck fa2      clean (20 calls, 1 s)", True)
    bad = log.replace("(0 errors", "(3 errors")
    assert _sanitize()._summary("racecheck", "fa2", 0, bad, 1.0)[0].startswith("racecheck fa2      3 ERRORS")
