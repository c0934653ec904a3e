"""scripts/ncu_table.py (issue 12's Nsight Compute attribution table) on the CPU: the before run's real details
pages, and small hand-written pages in the layout ncu prints (details text and raw CSV) for what those lack."""
from pathlib import Path

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
BEFORE = ROOT / "bench" / "h200-2026-11-30" / "session2"

# ncu --page details, two kernels of ours' report layout: a memset (ignored), then flash-attn-4's kernel twice (the
# larger is taken); Duration in us; a "Command line profiler metrics" section (what --metrics adds)
DETAILS = """==PROF== Disconnected from process 77
[77] python3.12@127.0.0.1
  void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>> (64, 1, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    Duration                         us         2.05
    ----------------------- ----------- ------------

  kernel_cutlass_kernel_fa_variantshopperfa3FlashAttention3Sm90_object_at__x_0 (2048, 1, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    SM Frequency                    Ghz         1.34
    Elapsed Cycles                cycle    1,350,000
    Duration                         us       998.50
    ----------------------- ----------- ------------

    Section: Compute Workload Analysis
    -------------------- ----------- ------------
    Metric Name          Metric Unit Metric Value
    -------------------- ----------- ------------
    Issue Slots Busy               %        37.10
    -------------------- ----------- ------------

    OPT   Tensor is the highest-utilized pipeline (75.5%) based on elapsed cycles in the workload, taking into account
          the rates of its different instructions.

    Section: Instruction Statistics
    ---------------------------------------- ----------- ------------
    Metric Name                              Metric Unit Metric Value
    ---------------------------------------- ----------- ------------
    Executed Instructions                           inst  260,000,000
    ---------------------------------------- ----------- ------------

    OPT   Est. Speedup: 4.1%
          This kernel executes 36700160 fused and 70254592 non-fused FP32 instructions. By converting pairs of
          non-fused instructions to their fused

    Section: Command line profiler metrics
    ------------------------------------------------------------------ ----------- ------------
    Metric Name                                                        Metric Unit Metric Value
    ------------------------------------------------------------------ ----------- ------------
    sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active                  %        17.25
    ------------------------------------------------------------------ ----------- ------------

  kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm90_object_at__y_0 (2, 1, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: Instruction Statistics
    ---------------------------------------- ----------- ------------
    Metric Name                              Metric Unit Metric Value
    ---------------------------------------- ----------- ------------
    Executed Instructions                           inst      100,000
    ---------------------------------------- ----------- ------------

  kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm90_object_at__y_0 (32, 16, 4)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    Elapsed Cycles                cycle    1,300,000
    Duration                         ms         0.97
    ----------------------- ----------- ------------

    Section: Instruction Statistics
    ---------------------------------------- ----------- ------------
    Metric Name                              Metric Unit Metric Value
    ---------------------------------------- ----------- ------------
    Executed Instructions                           inst  245,000,000
    ---------------------------------------- ----------- ------------
"""

# ncu --page raw --csv of the same report (a few of its columns): names, units, one row per kernel
_COLS = ["ID", "Kernel Name", "lts__t_sector_hit_rate.pct",
         "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
         "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
         "smsp__pcsamp_warps_issue_stalled_barrier", "smsp__pcsamp_warps_issue_stalled_wait",
         "smsp__pcsamp_warps_issue_stalled_math_pipe_throttle", "smsp__pcsamp_warps_issue_stalled_sleeping",
         "smsp__pcsamp_warps_issue_stalled_barrier_not_issued"]
_UNITS = ["", "", "%", "", "%", "", "", "", "", ""]
_OURS = "kernel_cutlass_kernel_fa_variantshopperfa3FlashAttention3Sm90_object_at__x_0"
_FA4 = "kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm90_object_at__y_0"
_ROWS = [["0", "void at::native::vectorized_elementwise_kernel", "1", "0.1", "0", "1", "1", "0", "0", "0"],
         ["1", _OURS, "88.50", "1.25", "74.9", "12,000", "19,000", "3,000", "10", "5"],
         ["2", _FA4, "1", "0.1", "1", "1", "1", "0", "0", "0"],
         ["3", _FA4, "76.00", "0.80", "78.1", "8,400", "21,000", "100", "20", "4"]]
RAW = "==PROF== Connected to process 77\nprofiled fa3 D=128\n" + "\n".join(
    ",".join(f'"{c}"' for c in row) for row in [_COLS, _UNITS, *_ROWS]) + "\n"


@pytest.fixture(scope="module")
def nt():
    return load_script("ncu_table")


def _rows(lines):
    """{label: [cells after the label]} of a markdown table's rows."""
    out = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) > 2:
            out[cells[0]] = cells[1:]
    return out


def test_before_pages_give_the_before_table(nt):
    """The session-2 details pages (real ncu output) give the figures of its hand-made table."""
    kernels = nt.parse_details((BEFORE / "ncu_fa3_d128_n4k.txt").read_text(encoding="utf-8") +
                               (BEFORE / "ncu_flash-attn-4_d128_n4k.txt").read_text(encoding="utf-8"))
    pair = nt.pick(kernels)
    assert pair["ours"].grid == (2048, 1, 1) and pair["fa4"].grid == (32, 16, 4) and pair["fa4"].block == (384, 1, 1)
    rows = _rows(nt.table(pair))
    assert rows["duration (ncu base clocks, 1.34 GHz)"][:3] == ["1.05 ms", "0.971 ms", "1.08"]
    assert rows["instructions executed"][:3] == ["291,697,804", "245,148,100", "1.19"]
    assert rows["elapsed cycles"][:2] == ["1,414,415", "1,299,406"]
    assert rows["tensor pipe active (% of elapsed)"][:2] == ["72.2", "78.8"]
    assert rows["L2 hit rate (%)"][:2] == ["89.3", "76.3"]
    assert rows["FP32 non-fused inst"][:2] == ["136,347,648", "69,238,784"]
    assert rows["FP32 fused inst"][:2] == ["1,048,576", "34,570,240"]
    assert rows["warp cycles per issued instruction"][0] == "5.46"
    assert rows["stall samples: barrier"][:3] == ["-", "-", "-"]  # only in the raw page


def test_parse_before_markdown(nt):
    before = nt.parse_before((BEFORE / "ncu_attribution_before.md").read_text(encoding="utf-8"))
    assert before["duration"] == (1.05, 0.971) and before["stall samples: barrier"] == (12324.0, 8421.0)
    assert before["instructions executed"] == (291697804.0, 245148100.0) and before["l2 hit rate"] == (89.3, 76.3)
    assert nt.parse_before("| duration (x) | 998 us | 0.5 ms | 2 |")["duration"] == (0.998, 0.5)


def test_details_and_raw_merged(nt):
    """Hand-written pages: the memset is ignored, flash-attn-4's larger kernel taken, us -> ms, the pipes and stall
    samples from the raw CSV and the command-line metrics section, "_not_issued" counts left out, a reason with >= 3%
    of a kernel's samples added after the before table's eight, a metric ncu did not give printed as "-"."""
    kernels = nt.merge(nt.parse_details(DETAILS), nt.parse_raw_csv(RAW))
    assert len(kernels) == 4
    pair = nt.pick(kernels)
    assert pair["fa4"].grid == (32, 16, 4)
    before = nt.parse_before((BEFORE / "ncu_attribution_before.md").read_text(encoding="utf-8"))
    lines = nt.table(pair, before)
    rows = _rows(lines)
    assert lines[0].startswith("| metric | fa3 (ours) | flash-attn-4 | ours / fa4 | ours before")
    assert rows["duration (ncu base clocks, 1.34 GHz)"] == ["0.999 ms", "0.97 ms", "1.03", "1.05 ms", "0.971 ms",
                                                           "1.08", "0.95"]
    assert rows["instructions executed"][:3] == ["260,000,000", "245,000,000", "1.06"]
    assert rows["instructions executed"][-1] == "0.89"  # now / before, ours
    assert rows["tensor pipe active (% of elapsed)"][:2] == ["74.9", "78.1"]  # the raw metric beats the note
    assert rows["FMA pipe inst (% of peak, active)"][:2] == ["17.2", "-"]
    assert rows["L2 hit rate (%)"][:3] == ["88.5", "76.0", "1.16"]
    assert rows["stall samples: barrier"][:3] == ["12,000", "8,400", "1.43"]
    assert rows["stall samples: barrier"][3:6] == ["12,324", "8,421", "1.46"]
    assert rows["stall samples: math pipe throttle"][:2] == ["3,000", "100"]
    assert "stall samples: sleeping" not in rows and "stall samples: barrier not issued" not in rows
    assert rows["stall samples: dispatch"][:3] == ["-", "-", "-"]
    assert rows["issue slots busy (%)"][:2] == ["37.1", "-"]
    assert rows["cycles per issue stalled: barrier"][:3] == ["1.25", "0.80", "1.56"]
    assert "cycles per issue stalled: wait" not in rows  # not given by ncu: left out


def test_tensor_pipe_from_the_note_without_the_raw_page(nt):
    pair = nt.pick(nt.parse_details(DETAILS))
    assert _rows(nt.table(pair))["tensor pipe active (% of elapsed)"][:2] == ["75.5", "-"]


def test_cli_writes_the_table(nt, tmp_path, capsys):
    (tmp_path / "d.txt").write_text(DETAILS, encoding="utf-8")
    (tmp_path / "r.csv").write_text(RAW, encoding="utf-8")
    out = tmp_path / "after.md"
    rc = nt.main(["--details", str(tmp_path / "d.txt"), "--raw", str(tmp_path / "r.csv"), "--title", "T",
                  "--before", str(BEFORE / "ncu_attribution_before.md"), "--before-details",
                  str(BEFORE / "ncu_fa3_d128_n4k.txt"), str(BEFORE / "ncu_flash-attn-4_d128_n4k.txt"),
                  "--out", str(out)])
    text = out.read_text(encoding="utf-8")
    assert rc == 0 and text.startswith("### T\n") and text.strip() in capsys.readouterr().out
    # a row the before table lacks, filled from the before details pages
    assert _rows(text.splitlines())["warp cycles per issued instruction"][3:5] == ["5.46", "5.94"]
    (tmp_path / "ours_only.txt").write_text(DETAILS.split("  kernel_cutlass_kernel_flash_attn")[0], encoding="utf-8")
    assert nt.main(["--details", str(tmp_path / "ours_only.txt")]) == 1  # flash-attn-4 missing: exit 1
    with pytest.raises(SystemExit):
        nt.main(["--details", str(tmp_path / "missing.txt")])
    assert "--details: no such file" in capsys.readouterr().err


def test_ncu_attribution_impl_list():
    na = load_script("ncu_attribution")
    assert na.impl_list("fa3, flash-attn-4") == ["fa3", "flash-attn-4"]
    for bad in ("", "fa3,fa3", "fa3,cudnn"):
        with pytest.raises(ValueError, match="--impl"):
            na.impl_list(bad)


def test_ncu12_script_profiles_what_it_precompiles():
    """scripts/ncu12_gpu.sh: the precompile covers the profiled shape (D 128, N 4k, both causal modes) and both
    implementations are profiled in one report, beside the before run's table."""
    text = (ROOT / "scripts" / "ncu12_gpu.sh").read_text(encoding="utf-8")
    assert "--precompile-fa4 --variants new --head-dims 128" in text and "--seqlens 4096 --causal both" in text
    assert "--impl fa3,flash-attn-4" in text and "ncu_attribution_before.md" in text
    assert all((BEFORE / f).is_file() for f in ("ncu_attribution_before.md", "ncu_fa3_d128_n4k.txt",
                                                "ncu_flash-attn-4_d128_n4k.txt"))


def _fake(folder: Path, name: str, body: str) -> None:
    (folder / name).write_text("#!/usr/bin/env bash\n" + body + "\n", encoding="utf-8")
    (folder / name).chmod(0o755)


def test_ncu12_script_end_to_end_with_a_fake_ncu(tmp_path):
    """scripts/ncu12_gpu.sh with fake ncu / nvidia-smi / python3 (the table script runs for real): the metrics
    asked are those the query lists, both ncu runs write their report and table (non-causal with the before
    columns), the source pages are exported per kernel, and the summary prints the tables."""
    import os
    import subprocess
    import sys

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (tmp_path / "d.txt").write_text(DETAILS, encoding="utf-8")
    (tmp_path / "r.csv").write_text(RAW, encoding="utf-8")
    (tmp_path / "s.csv").write_text('"Address","Source","Warp Stall Sampling (All Samples)"\n'
                                    '"0x10","BAR.SYNC.DEFER_BLOCKING R11, 0x100","1,200"\n'
                                    '"0x20","MUFU.EX2 R4, R4","300"\n', encoding="utf-8")
    calls = tmp_path / "ncu_calls.txt"
    _fake(bin_, "nvidia-smi", 'if [[ " $* " == *" -lms "* ]]; then sleep 30; fi; echo "0, FAKE H200"')
    _fake(bin_, "ncu", f"""echo "$*" >> {calls}
case " $* " in
  *" --version "*) echo "Version 2099.1";;
  *" --query-metrics "*) printf 'Metric Name   Metric Description\\nsm__inst_executed_pipe_fma   fma\\n'
                         printf 'sm__inst_executed_pipe_xu   xu\\n';;
  *" --page details "*) cat {tmp_path / 'd.txt'};;
  *" --page raw "*) cat {tmp_path / 'r.csv'};;
  *" --page source "*) cat {tmp_path / 's.csv'};;
  *) while [[ $# -gt 0 && $1 != -o ]]; do shift; done; touch "$2.ncu-rep"; echo "profiled fa3 D=128";
     echo "max |O difference| between fa3, flash-attn-4 causal=False: 3.9e-03";;
esac""")
    _fake(bin_, "python3", f'if [[ $1 == scripts/ncu_table.py ]]; then exec {sys.executable} "$@"; fi\n'
                           'echo "precompiled 2 kernels + flash-attn-4 in 1 s"')
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", OUT=str(tmp_path / "out"))
    run = subprocess.run(["bash", "scripts/ncu12_gpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    profiled = [ln for ln in calls.read_text(encoding="utf-8").splitlines() if "ncu_attribution.py" in ln]
    assert len(profiled) == 2 and all("--impl fa3,flash-attn-4" in ln for ln in profiled)
    assert "--metrics sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active," \
           "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active " in profiled[0]
    assert "--causal no" in profiled[0] and "--causal yes" in profiled[1] and "--section SourceCounters" in profiled[0]
    assert sum("--page source" in ln and "regex:flash_attn" in ln for ln in calls.read_text(encoding="utf-8").splitlines()) == 2
    after = (tmp_path / "out" / "ncu_attribution_after.md").read_text(encoding="utf-8")
    assert after.count("| metric | fa3 (ours)") == 2 and after.count("ours before") == 1
    assert "### D 128, N 4k, bf16, causal" in after and "BAR.SYNC.DEFER_BLOCKING" in after
    assert "== ncu_full table" in run.stdout and "| instructions executed | 260,000,000" in run.stdout
    assert "max |O difference|" in run.stdout
