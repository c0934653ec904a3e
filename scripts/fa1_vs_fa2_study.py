#!/usr/bin/env python3
"""FA1 vs FA2 on one GPU, in one run: speed across sequence length and head_dim, and the DRAM bytes each
kernel moved (Nsight Compute) beside the bytes the tile-loop emulator predicts for the same shape and tiles.

* Speed: the FlashAttention papers' setup (Dao et al. 2022 section 4, Dao 2023 section 4.1): bf16,
  batch * seqlen = 16k tokens, num_heads * head_dim = 2048, seqlen 512 .. 16k, head_dim 64 and 128,
  non-causal and causal; median of triton.testing.do_bench over the backend's `run` (host work
  included: output and FA1 workspace allocation, the TVM-FFI call); FLOPs by the papers' convention
  (4 N^2 D per head, halved when causal; fa_variants.bench.core.attention_flops). Beside each pair:
  the CTAs each kernel launches (FA1: batch x heads, one per (batch, head); FA2: Q tiles x heads x
  batch) against the GPU's SM count, and max |fa1 - fa2| as a sanity check of what was timed.
* DRAM bytes: for a couple of shapes (default head_dim 128, N = 1k and 8k, non-causal) this script
  re-runs itself as a child under
  ``ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum --target-processes all``
  (CSV, base units, kernels filtered by name), the child warming each kernel up once and then launching
  it once per shape; the measured bytes sit beside ``fa_variants.emulate.hbm_bytes`` for the same shape
  and each kernel's own tiles (FA1's O scratch counted as fp32). The model counts every load from DRAM;
  where the L2 (50 MB on H100/H200) holds a re-read (FA1's O, l, m and Q at small N; FA2's K/V shared
  by the CTAs of one head) the measurement can be lower.

Writes ``study.json`` (every number, the commands, the environment) and ``study.md`` (the tables) under
--out (default ``$OUT/fa1_vs_fa2`` when $OUT is set, else ``./fa1_vs_fa2_study``) and prints the tables.
About 3-4 minutes on an H200, most of it compiling (8 kernels here, 2 more in the ncu child).

GPU host: ``source .gpu/env.sh && python3 scripts/fa1_vs_fa2_study.py --out $OUT/fa1_vs_fa2``
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

VARIANTS = ("fa1", "fa2")
KERNEL_NAMES = {"fa1": "FlashAttention1Sm80", "fa2": "FlashAttention2Sm80"}
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    default_out = os.path.join(os.environ["OUT"], "fa1_vs_fa2") if os.environ.get("OUT") else "fa1_vs_fa2_study"
    p.add_argument("--out", default=default_out, help="output folder (study.json, study.md, ncu log)")
    p.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--causal", choices=("both", "no", "yes"), default="both")
    p.add_argument("--tokens", type=int, default=16384, help="batch * seqlen")
    p.add_argument("--hidden", type=int, default=2048, help="num_heads * head_dim")
    p.add_argument("--ncu-shapes", nargs="*", default=["128:1024", "128:8192"], metavar="D:N",
                   help="head_dim:seqlen shapes (non-causal) whose DRAM bytes ncu reads; none: skip ncu")
    p.add_argument("--ncu", default="ncu", help="the Nsight Compute CLI")
    p.add_argument("--ncu-timeout", type=float, default=150.0, help="seconds for the whole ncu child")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # the process ncu profiles
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# shapes, inputs, backends
# ----------------------------------------------------------------------------------------------
def shape(n: int, d: int, tokens: int, hidden: int) -> dict:
    return {"seqlen": n, "head_dim": d, "batch": max(1, tokens // n), "heads": hidden // d}


def make_inputs(s: dict, seed: int = 0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(s["batch"], s["seqlen"], s["heads"], s["head_dim"], device="cuda",
                             dtype=torch.bfloat16, generator=g) for _ in range(3))


def backend(name: str):
    from fa_variants import dispatch

    return dispatch.get_backend(name)


def tiles_of(name: str, arch: str, d: int, causal: bool) -> dict:
    import dataclasses

    from fa_variants import registry

    return dataclasses.asdict(registry.static_config(name, arch, "bf16", d, causal).config)


def ctas(name: str, s: dict, tiles: dict) -> int:
    """Thread blocks a launch has: FA1 one per (batch, head); FA2 one per (Q tile, head, batch)."""
    per_head = 1 if name == "fa1" else -(-s["seqlen"] // tiles["tile_m"])
    return per_head * s["batch"] * s["heads"]


# ----------------------------------------------------------------------------------------------
# speed
# ----------------------------------------------------------------------------------------------
def time_sweep(args, arch: str, sms: int) -> list[dict]:
    import torch
    from triton.testing import do_bench

    from fa_variants.bench.core import attention_flops, tflops

    causals = {"both": (False, True), "no": (False,), "yes": (True,)}[args.causal]
    records = []
    for d in args.head_dims:
        for causal in causals:
            for n in args.seqlens:
                s = shape(n, d, args.tokens, args.hidden)
                q, k, v = make_inputs(s)
                scale = 1 / math.sqrt(d)
                outs = {}
                for name in VARIANTS:
                    rec = dict(variant=name, causal=causal, **s, ms=None, tflops=None, error=None)
                    try:
                        tiles = tiles_of(name, arch, d, causal)
                        rec.update(tiles=tiles, ctas=ctas(name, s, tiles))
                        run = backend(name).run
                        t0 = time.perf_counter()
                        outs[name] = run(q, k, v, causal=causal, softmax_scale=scale)[0]  # compiles once
                        torch.cuda.synchronize()
                        rec["first_call_s"] = round(time.perf_counter() - t0, 3)
                        ms = do_bench(lambda: run(q, k, v, causal=causal, softmax_scale=scale),
                                      warmup=10, rep=50, return_mode="median")
                        rec.update(ms=ms, tflops=tflops(attention_flops(s["batch"], s["heads"], n, n, d, causal),
                                                        ms))
                    except Exception as exc:  # noqa: BLE001 - a cell that fails is reported, not fatal
                        rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    records.append(rec)
                diff = None
                if len(outs) == 2:
                    diff = (outs["fa1"].float() - outs["fa2"].float()).abs().max().item()
                for rec in records[-2:]:
                    rec["max_abs_fa1_minus_fa2"] = diff
                line = "  ".join(f"{r['variant']} {r['tflops']:.1f}" if r["tflops"] else f"{r['variant']} ERR"
                                 for r in records[-2:])
                print(f"D={d} N={n} {'causal' if causal else 'non-causal'}: {line} TFLOP/s "
                      f"(fa1 CTAs {records[-2].get('ctas')} on {sms} SMs)", flush=True)
                del q, k, v, outs
    return records


# ----------------------------------------------------------------------------------------------
# DRAM bytes: the ncu child and its parent
# ----------------------------------------------------------------------------------------------
def ncu_shapes(args) -> list[dict]:
    out = []
    for item in args.ncu_shapes:
        d, n = (int(x) for x in item.split(":"))
        out.append(shape(n, d, args.tokens, args.hidden))
    return out


def child(args) -> int:
    """Under ncu: warm each variant up once on the first shape (compile, module load), then launch it
    once per shape. Launch order, which the parent relies on: warm-ups (fa1, fa2), then fa1 on every
    shape, then fa2 on every shape."""
    import torch

    shapes = ncu_shapes(args)
    inputs = [make_inputs(s) for s in shapes]

    def launch(name, i):
        q, k, v = inputs[i]
        backend(name).run(q, k, v, causal=False, softmax_scale=1 / math.sqrt(shapes[i]["head_dim"]))
        torch.cuda.synchronize()

    for name in VARIANTS:
        launch(name, 0)
    for name in VARIANTS:
        for i in range(len(shapes)):
            launch(name, i)
    return 0


def parse_ncu_csv(text: str) -> list[dict]:
    """Kernels of an `ncu --csv --print-units base` report, in launch order: [{id, kernel, grid,
    metrics: {name: float}}]. Lines that are not CSV rows (==PROF== messages, program output) are
    skipped; numbers may carry thousands separators."""
    rows = [line for line in text.splitlines() if line.startswith('"')]
    header_at = next((i for i, line in enumerate(rows) if line.startswith('"ID"')), None)
    if header_at is None:
        return []
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(rows[header_at:]):
        if row.get("ID") == "ID":  # a repeated header (several processes)
            continue
        k = kernels.setdefault(row["ID"], {"id": int(row["ID"]), "kernel": row.get("Kernel Name", ""),
                                           "grid": row.get("Grid Size", ""), "metrics": {}})
        value = row.get("Metric Value", "").replace(",", "")
        try:
            k["metrics"][row["Metric Name"]] = float(value)
        except ValueError:
            k["metrics"][row["Metric Name"]] = math.nan
    return sorted(kernels.values(), key=lambda k: k["id"])


def ncu_command(args, log: Path, n_launches: int) -> list[str]:
    regex = "|".join(KERNEL_NAMES[v] for v in VARIANTS)
    child_argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--tokens", str(args.tokens),
                  "--hidden", str(args.hidden), "--ncu-shapes", *args.ncu_shapes]
    return [args.ncu, "--clock-control", "none", "--metrics", ",".join(METRICS), "--target-processes", "all",
            "--csv", "--print-units", "base", "-k", f"regex:{regex}", "--launch-skip", str(len(VARIANTS)),
            "--launch-count", str(n_launches), "--log-file", str(log), *child_argv]


def dram_study(args, arch: str, timing: list[dict], out: Path) -> dict:
    from fa_variants.emulate import hbm_bytes

    shapes = ncu_shapes(args)
    result = {"shapes": shapes, "rows": [], "command": None, "returncode": None, "error": None}
    if not shapes:
        result["error"] = "no --ncu-shapes"
        return result
    if shutil.which(args.ncu) is None:
        result["error"] = f"{args.ncu} not found on PATH"
        print(f"DRAM bytes: skipped ({result['error']})", flush=True)
        return result
    log = out / "ncu.csv"
    cmd = ncu_command(args, log, len(VARIANTS) * len(shapes))
    result["command"] = " ".join(cmd)
    print("DRAM bytes:", result["command"], flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.ncu_timeout)
        result["returncode"] = proc.returncode
        (out / "ncu_stdout.txt").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    except subprocess.TimeoutExpired:
        result["error"] = f"ncu child timed out after {args.ncu_timeout:.0f} s"
    result["seconds"] = round(time.perf_counter() - t0, 1)
    kernels = parse_ncu_csv(log.read_text()) if log.exists() else []
    if len(kernels) != len(VARIANTS) * len(shapes) and not result["error"]:
        result["error"] = (f"ncu reported {len(kernels)} kernels, expected {len(VARIANTS) * len(shapes)} "
                           f"(rc {result['returncode']}; see ncu_stdout.txt and ncu.csv)")
    order = [(name, s) for name in VARIANTS for s in shapes]  # the child's measured launches
    for (name, s), k in zip(order, kernels):
        tiles = tiles_of(name, arch, s["head_dim"], False)
        pred = hbm_bytes(name, s["batch"], s["heads"], s["seqlen"], s["seqlen"], s["head_dim"], tiles["tile_m"],
                         tiles["tile_n"], 2, False, o_bytes=4 if name == "fa1" else None)
        read, write = (k["metrics"].get(m, math.nan) for m in METRICS)
        ms = next((r["ms"] for r in timing if r["variant"] == name and not r["causal"]
                   and r["seqlen"] == s["seqlen"] and r["head_dim"] == s["head_dim"]), None)
        result["rows"].append(dict(
            variant=name, **s, tiles=tiles, kernel=k["kernel"][:80], grid=k["grid"],
            kernel_matches=KERNEL_NAMES[name] in k["kernel"], dram_read=read, dram_write=write,
            predicted_read=pred.read, predicted_write=pred.write,
            measured_over_predicted=(read + write) / pred.total if pred.total else None, ms=ms,
            achieved_GBps=(read + write) / (ms * 1e-3) / 1e9 if ms else None))
    return result


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------
def _f(x, fmt="{:.1f}"):
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def markdown(meta: dict, timing: list[dict], dram: dict) -> str:
    lines = [f"# FA1 vs FA2 on {meta['device']} ({meta['sms']} SMs)", "",
             f"bf16, batch x seqlen = {meta['tokens']}, heads x head_dim = {meta['hidden']}; TFLOP/s = papers' "
             "FLOPs / do_bench median (`run` incl. host work). CTAs: FA1 one per (batch, head), FA2 one per "
             "(Q tile, head, batch).", ""]
    pairs: dict[tuple, dict] = {}
    for r in timing:
        pairs.setdefault((r["head_dim"], r["causal"], r["seqlen"]), {})[r["variant"]] = r
    lines += ["| D | causal | N | B | H | FA1 TFLOP/s | FA2 TFLOP/s | FA2 / FA1 | FA1 CTAs | FA2 CTAs | FA1 ms "
              "| FA2 ms | max abs(fa1 - fa2) |", "|" + "---|" * 13]
    for (d, causal, n), p in pairs.items():
        a, b = p.get("fa1", {}), p.get("fa2", {})
        ratio = b["tflops"] / a["tflops"] if a.get("tflops") and b.get("tflops") else None
        lines.append(f"| {d} | {'yes' if causal else 'no'} | {n} | {a.get('batch', b.get('batch'))} | "
                     f"{a.get('heads', b.get('heads'))} | {_f(a.get('tflops')) if not a.get('error') else 'error'} | "
                     f"{_f(b.get('tflops')) if not b.get('error') else 'error'} | {_f(ratio, '{:.2f}')} | "
                     f"{_f(a.get('ctas'), '{}')} | {_f(b.get('ctas'), '{}')} | {_f(a.get('ms'), '{:.3f}')} | "
                     f"{_f(b.get('ms'), '{:.3f}')} | {_f(a.get('max_abs_fa1_minus_fa2'), '{:.2e}')} |")
    errors = [f"- {r['variant']} D={r['head_dim']} N={r['seqlen']} causal={r['causal']}: {r['error']}"
              for r in timing if r.get("error")]
    if errors:
        lines += ["", "Errors:", *errors]
    lines += ["", "## DRAM bytes (Nsight Compute) vs the emulator's prediction", ""]
    if dram.get("command"):
        lines += [f"`{dram['command']}`", ""]
    if dram["rows"]:
        lines += ["| variant | D | N | B | H | tiles Br x Bc | read GB (ncu) | read GB (model) | write GB (ncu) | "
                  "write GB (model) | ncu / model | ms | GB/s |", "|" + "---|" * 13]
        for r in dram["rows"]:
            lines.append(
                f"| {r['variant']} | {r['head_dim']} | {r['seqlen']} | {r['batch']} | {r['heads']} | "
                f"{r['tiles']['tile_m']} x {r['tiles']['tile_n']} | {_f(r['dram_read'] / 1e9, '{:.3f}')} | "
                f"{_f(r['predicted_read'] / 1e9, '{:.3f}')} | {_f(r['dram_write'] / 1e9, '{:.3f}')} | "
                f"{_f(r['predicted_write'] / 1e9, '{:.3f}')} | {_f(r['measured_over_predicted'], '{:.2f}')} | "
                f"{_f(r['ms'], '{:.3f}')} | {_f(r['achieved_GBps'], '{:.0f}')} |")
        lines += ["", "Model: `fa_variants.emulate.hbm_bytes` (every tile load from DRAM, no L2 reuse; FA1's O "
                  "scratch in fp32, l and m fp32). FA1 writes its last O step and LSE straight to the bf16 "
                  "output instead of O, l, m (a difference of O(N D) bytes per head)."]
    if dram.get("error"):
        lines += ["", f"DRAM study: {dram['error']}"]
    lines += ["", f"Run: `{meta['command']}` ({meta['elapsed_s']:.0f} s)"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    import torch

    if not torch.cuda.is_available():
        print("fa1_vs_fa2_study: needs a CUDA GPU", file=sys.stderr)
        return 2
    from fa_variants.common import interop

    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    arch = interop.device_arch(torch.device("cuda"))
    meta = dict(device=props.name, arch=arch, sms=props.multi_processor_count, tokens=args.tokens,
                hidden=args.hidden, torch=torch.__version__,
                command="python3 scripts/fa1_vs_fa2_study.py " + " ".join(sys.argv[1:]))
    timing = time_sweep(args, arch, meta["sms"])
    dram = dram_study(args, arch, timing, out)
    meta["elapsed_s"] = time.perf_counter() - t0
    (out / "study.json").write_text(json.dumps(dict(meta=meta, timing=timing, dram=dram), indent=1, default=str))
    md = markdown(meta, timing, dram)
    (out / "study.md").write_text(md)
    print(md)
    print(f"written: {out / 'study.json'}, {out / 'study.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
