"""scripts/cp_bench.py end to end on the CPU (2 gloo ranks, reference backend, uneven length): the GPU run of
the context-parallel benchmark must not be the first time its code runs."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cp_bench_cpu_smoke(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "scripts" / "cp_bench.py"), "--device", "cpu", "--backend", "reference", "--dtype", "fp32",
           "--seqlens", "37", "--heads", "2", "--heads-kv", "1", "--head-dim", "16", "--rounds", "1", "--reps", "1",
           "--check-rows", "8", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "correctness: ok" in proc.stdout
    report = json.loads((tmp_path / "cp_bench.json").read_text())
    assert [(r["seqlen"], r["causal"]) for r in report["rows"]] == [(37, False), (37, True)]
    for row in report["rows"]:
        assert set(row["ms"]) >= {"one GPU", "ring", "kernels", "kernels + merges", "comm", "shape check",
                                  "ring, high-priority NCCL", "ring hp, local step first"}
        assert all(c["out"]["ok"] and c["lse"]["ok"] for c in row["correctness"])
    table = (tmp_path / "cp_bench.md").read_text()
    assert table.count("\n| 37 |") == 2 and "N=    37 causal=True" in proc.stdout
