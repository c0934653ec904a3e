"""scripts/ncu_compare.py (issue 12: where ours' warps stall that flash-attn-4's do not) and scripts/d64ncu_gpu.sh on
the CPU: small hand-written pages in the layouts ncu prints (details text, raw CSV, source CSV with a "Kernel Name"
row before each kernel's header), built so that every figure of the tables is known."""
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
OURS = "kernel_cutlass_kernel_fa_variantshopperfa3_kernelFlashAttention3Sm90_object_at__t0"
FA4 = "kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm90_object_at__t1"


def _details(name: str, grid: str, cycles: str, occupancy: str, eligible: str) -> str:
    return f"""  {name} {grid}x(512, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    SM Frequency                    Ghz         1.59
    Elapsed Cycles                cycle    {cycles}
    Duration                         ms         3.10
    ----------------------- ----------- ------------

    Section: Occupancy
    ------------------------------- ----------- ------------
    Metric Name                     Metric Unit Metric Value
    ------------------------------- ----------- ------------
    Theoretical Occupancy                     %        25
    Achieved Occupancy                        %        {occupancy}
    ------------------------------- ----------- ------------

    Section: Scheduler Statistics
    ---------------------------- ----------- ------------
    Metric Name                  Metric Unit Metric Value
    ---------------------------- ----------- ------------
    One or More Eligible                   %        {eligible}
    Eligible Warps Per Scheduler        warp         0.61
    ---------------------------- ----------- ------------

    Section: Launch Statistics
    ---------------------------- ----------- ------------
    Metric Name                  Metric Unit Metric Value
    ---------------------------- ----------- ------------
    Registers Per Thread         register/thread         168
    ---------------------------- ----------- ------------

"""


# ours: 1,140,000 cycles, fa4 1,020,000: ours / fa4 = 5,700 / 5,100, the two kernels' stall-sample totals below
DETAILS = ("==PROF== Disconnected from process 9\n" + _details(OURS, "(2752, 1, 1)", "1,140,000", "24.10", "35.20")
           + _details(FA4, "(86, 32, 1)", "1,020,000", "24.30", "37.90"))

_COLS = ["ID", "Kernel Name", "smsp__inst_issued.sum", "smsp__average_warp_latency_per_inst_issued.ratio",
         "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
         "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
         "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed", "lts__t_sector_hit_rate.pct"]
RAW = "\n".join(",".join(f'"{c}"' for c in row) for row in [
    _COLS, ["", "", "inst", "", "", "", "%", "%"],
    ["0", OURS, "1,000,000", "5.60", "1.00", "1.50", "70.0", "88.5"],
    ["1", FA4, "1,000,000", "5.00", "0.70", "1.50", "75.0", ""]]) + "\n"

SOURCE_HEAD = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
               "Instructions Executed", "stall_barrier", "stall_barrier (Not Issued)", "stall_wait",
               "stall_long_sb", "stall_math", "stall_selected"]


def _rows(base: int, bar: int) -> list[list[str]]:
    """(text, all samples, executed, barrier, wait, long_sb, math, selected) of one kernel's SASS lines: the same
    for both kernels but the BAR.SYNC's barrier samples."""
    lines = [("MOV R1, c[0x0][0x28] ;", 10, 100, 0, 10, 0, 0, 0),
             ("@!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR8+0x10], R3 ;", 300, 700, 0, 0, 300, 0, 0),
             ("BAR.SYNC.DEFER_BLOCKING R11, 0x180 ;", bar, 8500, bar, 0, 0, 0, 0),
             ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;", 500, 8500, 0, 300, 0, 0, 200),
             ("WARPGROUP.DEPBAR.LE gsb0, 0x0 ;", 1500, 8500, 0, 1500, 0, 0, 0),
             ("MUFU.EX2 R40, R40 ;", 800, 8500, 0, 0, 0, 500, 300),
             ("FFMA R40, R40, R2, -R3 ;", 400, 8500, 0, 200, 0, 0, 200),
             ("SHFL.BFLY PT, R5, R4, 0x1, 0x1f ;", 100, 8500, 0, 100, 0, 0, 0),
             ("@P0 BRA 0x7f0000001010 ;", 90, 8500, 0, 90, 0, 0, 0),
             ("EXIT ;", 0, 100, 0, 0, 0, 0, 0)]
    return [[hex(base + 16 * n), t, str(s), str(s // 2), f"{e:,}", str(b), str(b // 2), str(w), str(lsb), str(m),
             str(sel)] for n, (t, s, e, b, w, lsb, m, sel) in enumerate(lines)]


def _csv(rows) -> str:
    return "\n".join(",".join(f'"{c}"' for c in r) for r in rows) + "\n"


# ours' BAR.SYNC holds 2,000 samples, fa4's 1,400: totals 5,700 and 5,100
SOURCE = _csv([["Kernel Name", OURS], SOURCE_HEAD, *_rows(0x7F0000001000, 2000),
               ["Kernel Name", FA4], SOURCE_HEAD, *_rows(0x7F0000100000, 1400)])


@pytest.fixture(scope="module")
def nc():
    return load_script("ncu_compare")


def _table(text: str, first: str) -> dict[str, list[str]]:
    """{first cell: other cells} of the markdown table whose header starts with ``first``."""
    out, inside = {}, False
    for line in text.splitlines():
        if line.startswith(f"| {first} |"):
            inside = True
            continue
        if inside and not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if inside and not set(cells[0]) <= {"-"}:
            out[cells[0]] = cells[1:]
    return out


def _run(nc, tmp_path, capsys, source=SOURCE, details=DETAILS, extra=()):
    for name, text in (("d.txt", details), ("r.csv", RAW), ("s.csv", source)):
        (tmp_path / name).write_text(text, encoding="utf-8")
    rc = nc.main(["--details", str(tmp_path / "d.txt"), "--raw", str(tmp_path / "r.csv"), "--source",
                  str(tmp_path / "s.csv"), *extra])
    return rc, capsys.readouterr().out


def test_summary_side_by_side(nc, tmp_path, capsys):
    rc, out = _run(nc, tmp_path, capsys)
    rows = _table(out, "metric")
    assert rc == 0
    assert rows["elapsed cycles"] == ["1,140,000", "1,020,000", "1.12"]
    assert rows["achieved occupancy (%)"] == ["24.1", "24.3", "0.99"]
    assert rows["issue slot utilisation: one or more eligible (%)"] == ["35.2", "37.9", "0.93"]
    assert rows["registers per thread"] == ["168", "168", "1.00"]
    assert rows["tensor pipe active (% of elapsed)"] == ["70.0", "75.0", "0.93"]
    assert rows["SM frequency (GHz, ncu's locked clock)"][:2] == ["1.59", "1.59"]
    assert "DRAM throughput (%)" not in rows and rows["L2 hit rate (%)"] == ["88.5", "-", "-"]  # in neither / one
    assert "grid (2752, 1, 1) x block (512, 1, 1)" in out and "grid (86, 32, 1)" in out


def test_warp_state_stalls_diff(nc, tmp_path, capsys):
    """diff = (ours' cycles per issue x issued - fa4's) / (fa4's cycles per issue x issued): barrier
    (1.0 - 0.7) / 5.0 = +6 %, wait 0."""
    rows = _table(_run(nc, tmp_path, capsys)[1], "stall reason (WarpStateStats)")
    assert rows["barrier"] == ["1.00", "0.70", "1.43", "+6.00"]
    assert rows["wait"] == ["1.50", "1.50", "1.00", "+0.00"]
    assert list(rows) == ["wait", "barrier"]  # by size


def test_top_lines_and_classes(nc, tmp_path, capsys):
    """The BAR.SYNC is both kernels' top line; only its class differs: +600 / 5,100 = +11.76 % of fa4's warp time,
    all of it barrier; every other class 0; the classes add up to the cycle ratio - 1."""
    out = _run(nc, tmp_path, capsys)[1]
    top = out.split("top 15 SASS lines by stall samples, fa3 (ours) (5,700 samples):")[1]
    first = top.split("\n| +0x")[1]
    assert first.startswith("00020 | 2,000 | 35.1 | 8,500 | barrier 100% | BAR.SYNC.DEFER_BLOCKING R11, 0x180 ;")
    assert "| +0x00040 | 1,500 | 26.3 | 8,500 | wait 100% | WARPGROUP.DEPBAR.LE gsb0, 0x0 ; |" in top
    assert "flash-attn-4 (5,100 samples)" in out and "ours / fa4 elapsed cycles 1.1176" in out
    classes = _table(out, "opcode class")
    assert classes["BAR (named barriers: ping-pong turn, epilogue)"] == ["2,000", "35.1", "1,400", "27.5", "+11.76",
                                                                         "barrier +11.76"]
    assert classes["GMMA (HGMMA, WARPGROUP.ARRIVE / DEPBAR)"][:5] == ["2,000", "35.1", "2,000", "39.2", "+0.00"]
    assert classes["SYNCS (mbarrier: K/V full / empty waits, arrives)"][4] == "+0.00"
    assert classes["MUFU (EX2, RCP)"][:2] == ["800", "14.0"] and classes["SHFL (shuffles)"][0] == "100"
    assert classes["branch / control (BRA, BSSY, BSYNC, WARPSYNC, EXIT)"][0] == "90"
    assert classes["other (IMAD, IADD3, LOP3, ISETP, FSETP, SEL, MOV, S2R, ...)"][0] == "10"
    assert classes["all"][:5] == ["5,700", "100", "5,100", "100", "+11.76"]
    assert list(classes)[0].startswith("GMMA")  # in CLASSES' order
    mnemonics = _table(out, "mnemonic (largest diffs)")
    assert list(mnemonics)[0] == "BAR.SYNC.DEFER_BLOCKING" and mnemonics["BAR.SYNC.DEFER_BLOCKING"][4] == "+11.76"
    reasons = _table(out, "stall reason (source page)")
    assert reasons["barrier"] == ["2,000", "35.1", "1,400", "27.5", "+11.76"]
    assert reasons["wait"][4] == "+0.00" and "barrier (Not Issued)" not in reasons
    where = _table(out, "where (by executed count)")
    assert where["hot: executed >= 1/4 of the hottest (consumer K/V loop)"][:5] == ["5,390", "94.6", "4,790", "93.9",
                                                                                  "+11.76"]
    assert where["warm: 1/16 .. 1/4 (producer loop, consumer branches)"][:5] == ["300", "5.3", "300", "5.9", "+0.00"]
    assert where["cold: < 1/16 (prologue, epilogue, rare branches)"][:5] == ["10", "0.2", "10", "0.2", "+0.00"]


def test_scale_from_samples_without_cycles(nc, tmp_path, capsys):
    """Without elapsed cycles the diff is scaled by the sample totals (the same sampling interval)."""
    details = DETAILS.replace("Elapsed Cycles", "Elapsed Thing")
    out = _run(nc, tmp_path, capsys, details=details)[1]
    assert "ours / fa4 stall samples 1.1176 (no elapsed cycles" in out
    assert _table(out, "opcode class")["all"][4] == "+11.76"


def test_op_classes(nc):
    cases = {"HGMMA.64x128x16.F32.BF16": "GMMA", "WARPGROUP.ARRIVE": "GMMA", "BAR.ARV": "BAR",
             "SYNCS.ARRIVE.TRANS64.A1T0": "SYNCS", "MUFU.EX2": "MUFU", "FMUL": "FFMA", "FMNMX3": "FMNMX",
             "F2FP.BF16.F32.PACK_AB": "conversions", "SHFL.BFLY": "SHFL", "BSYNC.RECONVERGENT": "branch",
             "UTMALDG.2D": "memory", "LDSM.16.M88.4": "memory", "UIADD3": "uniform", "R2UR": "uniform",
             "IMAD.MOV.U32": "other", "S2R": "other"}
    for mnemonic, label in cases.items():
        assert nc.op_class(mnemonic).startswith(label), mnemonic
    assert nc.Instr(0, "@!UP0 BRA `(.L_x_3) ;", 1.0).mnemonic == "BRA"


def test_per_kernel_files_and_missing_samples(nc, tmp_path, capsys):
    """Per-kernel exports without a "Kernel Name" row are told apart by their file names; a kernel without source
    samples: exit 1, saying so; --sections picks tables."""
    ours = _csv([SOURCE_HEAD, *_rows(0x1000, 2000)])
    fa4 = _csv([SOURCE_HEAD, *_rows(0x9000, 1400)])
    for name, text in (("d.txt", DETAILS), ("r.csv", RAW), ("x_fa_variants.csv", ours), ("x_flash_attn.csv", fa4)):
        (tmp_path / name).write_text(text, encoding="utf-8")
    args = ["--details", str(tmp_path / "d.txt"), "--raw", str(tmp_path / "r.csv"), "--sections", "classes"]
    assert nc.main([*args, "--source", str(tmp_path / "x_fa_variants.csv"), str(tmp_path / "x_flash_attn.csv")]) == 0
    out = capsys.readouterr().out
    assert "| metric |" not in out and _table(out, "opcode class")["all"][4] == "+11.76"
    assert nc.main([*args, "--source", str(tmp_path / "x_fa_variants.csv")]) == 1
    out = capsys.readouterr().out
    assert "no stall samples of fa4" in out and "incomplete: source samples: fa4" in out
    (tmp_path / "empty.csv").write_text("==ERROR== the source page is not available\n", encoding="utf-8")
    assert nc.main([*args[:4], "--source", str(tmp_path / "empty.csv")]) == 1


def test_bad_arguments(nc, tmp_path, capsys):
    (tmp_path / "d.txt").write_text(DETAILS, encoding="utf-8")
    for bad, message in ((["--source", str(tmp_path / "no.csv")], "--source: no such file"),
                         (["--sections", "summary,bogus"], "--sections: expected"), (["--top", "0"], "--top:")):
        with pytest.raises(SystemExit):
            nc.main(["--details", str(tmp_path / "d.txt"), *bad])
        assert message in capsys.readouterr().err


def test_ncu_table_source_top_reads_the_kernel_name_row():
    """scripts/ncu_table.py's source_top (session 7 printed "no Address ... columns" for every kernel: it took the
    "Kernel Name" row for the header): the kernel with the most samples, its top lines."""
    nt = load_script("ncu_table")
    lines = nt.source_top(SOURCE, 2)
    assert lines[0].split() == ["0x7f0000001020", "2,000", "35.1%", "BAR.SYNC.DEFER_BLOCKING", "R11,", "0x180", ";"]
    assert "WARPGROUP.DEPBAR" in lines[1]
    assert [g["kernel"] for g in nt.source_groups(SOURCE)] == [OURS, FA4]
    assert nt.source_top("==PROF== nothing\n")[0].startswith("(source page: no Address")


def _fake(folder: Path, name: str, body: str) -> None:
    (folder / name).write_text("#!/usr/bin/env bash\n" + body + "\n", encoding="utf-8")
    (folder / name).chmod(0o755)


def _run_with_fakes(tmp_path: Path, script: str, ncu_case: str, precompiled: str):
    """Runs scripts/SCRIPT with fake nvidia-smi, ncu (its arguments logged, then the bash NCU_CASE)
    and python3 (logged; scripts/ncu_compare.py runs for real, anything else prints PRECOMPILED). Returns the
    completed process and the logged calls, one a line."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "calls.txt"
    _fake(bin_, "nvidia-smi", 'if [[ " $* " == *" -lms "* ]]; then sleep 30; fi; echo "0, FAKE H200"')
    _fake(bin_, "ncu", f'echo "ncu $*" >> {calls}\n' + ncu_case)
    _fake(bin_, "python3", f'echo "python3 $*" >> {calls}\n'
                           f'if [[ $1 == scripts/ncu_compare.py ]]; then exec {sys.executable} "$@"; fi\n'
                           f'echo "{precompiled}"')
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", OUT=str(tmp_path / "out"))
    run = subprocess.run(["bash", f"scripts/{script}"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    return run, calls.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("diff, print_source", [("3.9e-03", True), ("nan", True), ("3.9e-03", False)])
def test_d64ncu_script_with_a_fake_ncu(tmp_path, diff, print_source):
    """scripts/d64ncu_gpu.sh with fake ncu / nvidia-smi / python3 (ncu_compare runs for real): both precompiles, one
    ncu run per shape over both implementations with the sections, the sampling interval and the metrics the query
    lists, the pages exported, ncu_compare's tables printed and appended to d64ncu_compare.md; exit 0, or 1 when the
    two kernels' outputs differ (a NaN). An ncu whose --print-source pages have no Address header: the source pages
    exported per kernel without it, and read."""
    for name, text in (("d.txt", DETAILS), ("r.csv", RAW), ("s.csv", SOURCE)):
        (tmp_path / name).write_text(text, encoding="utf-8")
    run, log = _run_with_fakes(tmp_path, "d64ncu_gpu.sh", f"""case " $* " in
  *" --version "*) echo "Version 2099.1";;
  *" --query-metrics "*) printf 'Metric Name   Metric Description\\nsm__inst_executed_pipe_xu   xu\\n'
                         printf 'smsp__inst_issued   issued\\n';;
  *" --page details "*) cat {tmp_path / 'd.txt'};;
  *" --page raw "*) cat {tmp_path / 'r.csv'};;
  *" --print-source "*) {'cat ' + str(tmp_path / 's.csv') if print_source else 'echo "==ERROR== no such view"'};;
  *" --page source "*) cat {tmp_path / 's.csv'};;
  *) while [[ $# -gt 0 && $1 != -o ]]; do shift; done; touch "$2.ncu-rep"
     echo "profiled fa3 D=64 N=16384"; echo "profiled flash-attn-4 D=64 N=16384"
     echo "max |O difference| between fa3, flash-attn-4 causal=False: {diff}";;
esac""",
                               "precompiled 1 kernels + flash-attn-4 in 1 s")
    assert run.returncode == (0 if diff != "nan" else 1), run.stdout + run.stderr
    pre = [ln for ln in log if "--precompile" in ln]
    assert len(pre) == 2 and all("--precompile-fa4 --variants new" in ln for ln in pre)
    assert {ln.split("--shapes ")[1] for ln in pre} == {"64:16384:full", "64:4096:full"}
    profiled = [ln for ln in log if ln.startswith("ncu ") and "ncu_attribution.py" in ln]
    assert len(profiled) == 2 and "--seqlen 16384" in profiled[0] and "--seqlen 4096" in profiled[1]
    for ln in profiled:
        assert "--impl fa3,flash-attn-4 --head-dim 64" in ln and "--causal no" in ln
        assert "--kernel-name regex:fa_variants|flash_attn --launch-count 4 --import-source no" in ln
        assert "--section SourceCounters" in ln and "--section SchedulerStats" in ln and "--section Occupancy" in ln
        assert "--warp-sampling-interval 7" in ln
        assert "--metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_issued.sum " in ln
    sources = [ln for ln in log if "--page source --csv --print-source sass" in ln]
    assert len(sources) == 6  # per report: both kernels, then each alone
    assert sum("--kernel-name regex:flash_attn --page source" in ln for ln in sources) == 2
    plain = [ln for ln in log if "--page source --csv" in ln and "--print-source" not in ln]
    assert len(plain) == (0 if print_source else 4)  # per report and kernel, when no Address header came
    tables = (tmp_path / "out" / "d64ncu_compare.md").read_text(encoding="utf-8")
    assert tables.count("### D 64, N ") == 2 and "### D 64, N 4096, bf16, non-causal" in tables
    assert "| BAR (named barriers: ping-pong turn, epilogue) | 2,000 | 35.1 | 1,400 | 27.5 | +11.76 |" in run.stdout
    assert "max |O difference|" in run.stdout and "Version 2099.1" in run.stdout
    if diff == "nan":
        assert "== not passed: ncu16k_O_difference (nan) ncu4k_O_difference (nan)" in run.stdout
    with tarfile.open(tmp_path / "out" / "d64ncu_logs.tar.gz") as tar:  # packed: no loose logs left under $OUT
        names = tar.getnames()
    assert {"logs/ncu16k.log", "logs/ncu4k.ncu-rep", "logs/ncu16k_compare.log", "logs/commit.txt"} <= set(names), names
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["d64ncu_compare.md", "d64ncu_logs.tar.gz"]


def _turn_source(lines) -> str:
    """One kernel's source page (the "Kernel Name" row, then SOURCE_HEAD's columns) from (text, samples, executed):
    every sample a "wait" one but BAR's, which are "barrier"."""
    rows = []
    for n, (text, s, e) in enumerate(lines):
        bar = s if text.startswith("BAR") else 0
        rows.append([hex(0x7F0000001000 + 16 * n), text, str(s), "0", f"{e:,}", str(bar), "0", str(s - bar), "0", "0",
                     "0"])
    return _csv([["Kernel Name", OURS], SOURCE_HEAD, *rows])


# new-like: the turn holds a GMMA wait and a promotion (3,000 samples); noskip-like: its waits after the turn (2,500)
TURN_NEW = [("MOV R1, c[0x0][0x28] ;", 10, 100), ("BAR.SYNC.DEFER_BLOCKING R8, 0x100 ;", 300, 8500),
            ("WARPGROUP.ARRIVE ;", 20, 8500), ("QGMMA.64x64x32.F32.E4M3.E4M3 R56, R216, gdesc[UR8], RZ, !UPT ;", 50, 8500),
            ("WARPGROUP.DEPBAR.LE gsb0, 0x1 ;", 600, 8500), ("FFMA R88, R2, R88, R56 ;", 200, 8500),
            ("FFMA R89, R2, R89, R57 ;", 100, 8500), ("WARPGROUP.ARRIVE ;", 100, 8500),
            ("QGMMA.64x64x32.F32.E4M3.E4M3 R24, R216, gdesc[UR8], RZ, !UPT ;", 50, 8500), ("BAR.ARV R0, 0x100 ;", 30, 8500),
            ("WARPGROUP.DEPBAR.LE gsb0, 0x0 ;", 500, 8500), ("MUFU.EX2 R40, R40 ;", 1040, 8500), ("EXIT ;", 0, 100)]
TURN_NOSKIP = [("MOV R1, c[0x0][0x28] ;", 10, 100), ("BAR.SYNC.DEFER_BLOCKING R7, 0x100 ;", 300, 8500),
               ("WARPGROUP.ARRIVE ;", 20, 8500), ("QGMMA.64x256x32.F32.E4M3.E4M3 R24, R216, gdesc[UR8], R24 ;", 50, 8500),
               ("BAR.ARV R10, 0x100 ;", 30, 8500), ("WARPGROUP.DEPBAR.LE gsb0, 0x1 ;", 400, 8500),
               ("WARPGROUP.DEPBAR.LE gsb0, 0x0 ;", 300, 8500), ("FMUL R24, R24, R3 ;", 200, 8500),
               ("MUFU.EX2 R40, R40 ;", 1190, 8500), ("EXIT ;", 0, 100)]


def test_two_reports_turn_and_labels(nc, tmp_path, capsys):
    """Two configs of one kernel (the same name) from two reports (--ref-*): the second is the reference; --labels
    names both sides everywhere; the turn tables (BAR.SYNC .. BAR.ARV of the hot lines, each DEPBAR on its own row)
    and the regions: new 1,100,000 cycles / noskip 1,000,000 (scale 1.1), samples 3,000 / 2,500."""
    files = {"new.txt": _details(OURS, "(1024, 1, 1)", "1,100,000", "18.7", "30.0"),
             "noskip.txt": _details(OURS, "(1024, 1, 1)", "1,000,000", "18.7", "31.0"),
             "new_source_fa_variants.csv": _turn_source(TURN_NEW),
             "noskip_source_fa_variants.csv": _turn_source(TURN_NOSKIP)}
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    rc = nc.main(["--details", str(tmp_path / "new.txt"), "--source", str(tmp_path / "new_source_fa_variants.csv"),
                  "--ref-details", str(tmp_path / "noskip.txt"), "--ref-source",
                  str(tmp_path / "noskip_source_fa_variants.csv"), "--labels", "new,noskip"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "| metric | new | noskip | new / noskip |" in out and "fa4" not in out and "ours" not in out
    assert _table(out, "metric")["elapsed cycles"] == ["1,100,000", "1,000,000", "1.10"]
    assert "new / noskip elapsed cycles 1.1000" in out
    assert "turn of new (+0x00010 .. +0x00090)" in out and "turn of noskip (+0x00010 .. +0x00040)" in out
    new_turn = out.split("turn of new")[1].split("turn of noskip")[0]
    assert "| WARPGROUP.DEPBAR.LE gsb0, 0x1 | +0x00040 | 1 | 600 | 22.00 | wait 100% |" in new_turn
    assert "| run: FFMA 2, WARPGROUP 1, QGMMA 1 | +0x00050 | 4 | 450 | 16.50 |" in new_turn
    assert "| BAR.SYNC.DEFER_BLOCKING R8, 0x100 | +0x00010 | 1 | 300 | 11.00 | barrier 100% |" in new_turn
    regions = _table(out, "region (% of noskip warp time)")
    assert regions["turn wait (its BAR.SYNC)"] == ["11.00", "12.00", "-1.00"]
    assert regions["turn after BAR.SYNC .. BAR.ARV"] == ["42.17", "4.00", "+38.17"]
    assert regions["of it: WARPGROUP.DEPBAR lines"] == ["22.00", "0.00", "+22.00"]
    assert regions["of it: the rest (issue, promotion, ARRIVE)"] == ["20.17", "4.00", "+16.17"]
    assert regions["outside the turn (the rest of the kernel)"] == ["56.83", "84.00", "-27.17"]
    assert regions["all"] == ["110.00", "100.00", "+10.00"]
    assert _table(out, "opcode class")["all"][4] == "+10.00"  # the classes' diff: the same total


def test_turn_missing_and_reference_flags(nc, tmp_path, capsys):
    """No BAR.SYNC .. BAR.ARV in the hot lines: a line saying so (d64ncu's fixture); --ref-source without
    --ref-details and a bad --labels are argparse errors naming the flag."""
    out = _run(nc, tmp_path, capsys, extra=["--sections", "turn"])[1]
    assert "(turn: no hot BAR.SYNC .. BAR.ARV in fa3 (ours))" in out
    (tmp_path / "d.txt").write_text(DETAILS, encoding="utf-8")
    for bad, message in ((["--ref-source", str(tmp_path / "d.txt")], "--ref-raw / --ref-source: need --ref-details"),
                         (["--labels", "a"], "--labels: expected two")):
        with pytest.raises(SystemExit):
            nc.main(["--details", str(tmp_path / "d.txt"), *bad])
        assert message in capsys.readouterr().err
