"""scripts/cp_bench.py end to end on the CPU (2 gloo ranks, reference backend, uneven length): the GPU run of
the context-parallel benchmark must not be the first time its code runs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_cp_bench_cpu_smoke(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "scripts" / "cp_bench.py"), "--device", "cpu", "--backend", "reference", "--dtype", "fp32",
           "--seqlens", "37", "--heads", "2", "--heads-kv", "1", "--head-dim", "16", "--rounds", "1", "--reps", "1",
           "--check-rows", "8", "--profile", "--profile-calls", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "correctness: ok" in proc.stdout
    report = json.loads((tmp_path / "cp_bench.json").read_text(encoding="utf-8"))
    assert [(r["seqlen"], r["causal"]) for r in report["rows"]] == [(37, False), (37, True)]
    for row in report["rows"]:
        assert set(row["ms"]) >= {"one GPU", "ring", "ring, check first", "kernels", "kernels + merges", "comm",
                                  "shape check", "ring, high-priority NCCL"}
        assert all(c["out"]["ok"] and c["lse"]["ok"] for c in row["correctness"])
        # --profile on the CPU: no GPU events, but the ring's host regions of every rank
        for prof in row["profile_per_rank"]:
            assert prof["ring"]["calls"] == 1 and "shape check: wait" in prof["ring"]["regions_ms"]
            assert "own step: first piece" in prof["ring"]["regions_ms"]
            assert "own step: first piece" not in prof["ring, check first"]["regions_ms"]
    table = (tmp_path / "cp_bench.md").read_text(encoding="utf-8")
    assert table.count("\n| 37 |") == 2 + 2 * 2 * 2 and "N=    37 causal=True" in proc.stdout  # + profile rows
    assert "(rank " in table and "profile N=    37 causal=True  ring" in proc.stdout


def _event(name, ts, dur, cat, stream=None):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat,
            "args": {} if stream is None else {"stream": stream}}


def test_profile_summary_of_a_gpu_trace():
    """--profile's reading of a torch.profiler trace (the GPU part cannot run here): times from the call's host
    start, kinds of kernels, idle time of the compute stream, host regions; GPU-side copies of the annotations
    and events of the next call are not counted."""
    bench = load_script("cp_bench")
    call = {**_event("profiled call 1", 1000, 300, "user_annotation"), "next_ts": 9000}
    events = [call, _event("profiled call 1", 1100, 3000, "gpu_user_annotation"),
              _event("cp: shape check: wait", 1050, 80, "user_annotation"),
              _event("cp: shape check: wait", 1200, 80, "gpu_user_annotation"),
              _event("ncclDevKernel_AllGather_RING_LL", 1040, 10, "kernel", 21),
              _event("kernel_cutlass_kernel_fa_variantshopperfa3FlashAttention3Sm90", 1200, 400, "kernel", 7),
              _event("ncclDevKernel_SendRecv", 1300, 500, "kernel", 17),
              _event("kernel_cutlass_kernel_fa_variantshopperfa3FlashAttention3Sm90", 1700, 1000, "kernel", 7),
              _event("triton_poi_fused_logaddexp_0", 2700, 100, "kernel", 7),
              _event("Memcpy DtoD (Device -> Device)", 2800, 20, "gpu_memcpy", 7),
              _event("kernel_cutlass_kernel_next_call", 9100, 50, "kernel", 7)]
    got = bench.summarise_call(call, events)
    assert got["first_gpu_ms"] == pytest.approx(0.040) and got["first_attention_ms"] == pytest.approx(0.200)
    assert got["end_ms"] == pytest.approx(1.820)
    assert got["compute_idle_ms"] == pytest.approx(0.100)  # 1600 .. 1700 on stream 7
    assert got["kinds"] == {"nccl": [2, pytest.approx(0.51)], "attention": [2, pytest.approx(1.4)],
                            "merge (triton)": [1, pytest.approx(0.1)], "copy/set": [1, pytest.approx(0.02)]}
    assert got["regions_ms"] == {"shape check: wait": pytest.approx(0.08)}
    assert len(got["timeline"]) == 6


def test_rule_cell_compares_each_rank_with_its_own_bound():
    bench = load_script("cp_bench")
    ranks = [{"out": {"err_ring": 4e-3, "bound": 8e-3, "ok": True}},  # the largest error, far from its bound
             {"out": {"err_ring": 1e-3, "bound": 1.2e-3, "ok": True}}]  # smaller, but the closest to its own
    assert bench.rule_cell(ranks, "out") == "ok 1.00e-03 / 1.20e-03 (rank 1)"
    ranks[1]["out"].update(err_ring=1.3e-3, ok=False)
    assert bench.rule_cell(ranks, "out") == "FAIL 1.30e-03 / 1.20e-03 (rank 1)"
