"""A/B timing of two checkouts of fa_variants in one process: before/after a change, same GPU, same inputs.

    scripts/ab_checkout.sh REV            # writes .before/fa_variants_before (REV's package, renamed) and
                                          # .before.tar.xz (carry [".gpu", ".before.tar.xz"] to the GPU host)
    python3 scripts/ab_bench.py --before .before --backends fa3,fa2 --head-dims 64,128,256 \
        --seqlens 4096,16384 --causal both --rounds 6 --out $OUT/ab

The FlashAttention papers' setup: batch * seqlen = 16384 tokens, num_heads * head_dim = 2048, forward only,
TFLOP/s = 4 * B * H * N^2 * D / time (halved for causal). Every round times each (version, backend) once, the
order rotated round to round; ratios after/before are taken per round and their median reported, with the
spread of each side between rounds. Times: triton.testing.do_bench medians. GPU clocks, power and temperature
are logged beside (nvidia-smi, every 500 ms) to clocks.csv.
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

from fa_variants.bench import core

sys.path.insert(0, str(Path(__file__).resolve().parent))
import before_pkg  # noqa: E402  (scripts/before_pkg.py)

TOKENS, HIDDEN = 16384, 2048
#: the --backends name that times the fa3-fp8 kernel alone (``timed_call``)
KERNEL_ONLY = "fa3-fp8-kernel"
#: the --backends name that times the FP8 quantisation pass alone (its TFLOP/s column: the attention's flops over
#: the pass's time, a speed on the same scale for both versions; the ratio is what it is for)
QUANT_ONLY = "fp8-quant"


def tflops(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool, ms: float) -> float:
    return core.tflops(core.attention_flops(batch, heads, seqlen, seqlen, head_dim, causal), ms)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="folder holding the package fa_variants_before, unpacked from "
                    "FOLDER.tar.xz when missing (scripts/before_pkg.py)")
    ap.add_argument("--backends", default="fa3", help=f"comma-separated; {KERNEL_ONLY}: the fa3-fp8 kernel alone; "
                    f"{QUANT_ONLY}: the quantisation pass alone")
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--causal", default="both", choices=["both", "yes", "no"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--warmup-ms", type=int, default=100)
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(before_pkg.before_dir(a.before, "ab_bench").resolve()))
    versions = {"before": importlib.import_module("fa_variants_before"), "after": importlib.import_module("fa_variants")}
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[a.causal]
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu",
                            "--format=csv", "-lms", "500"], stdout=open(a.out / "clocks.csv", "w"))
    rows = []
    try:
        for backend in a.backends.split(","):
            for head_dim in map(int, a.head_dims.split(",")):
                for seqlen in map(int, a.seqlens.split(",")):
                    for causal in causals:
                        rows.append(one_shape(versions, backend, head_dim, seqlen, causal, dtype, a))
                        print(_line(rows[-1]), flush=True)
    finally:
        smi.terminate()
    (a.out / "ab.json").write_text(json.dumps(rows, indent=1))
    md = ["| backend | D | N | causal | before TFLOP/s | after TFLOP/s | after/before (median of rounds) | "
          "spread before | spread after | max err after vs before |", "|" + "---|" * 10]
    md += [_line(r) for r in rows]
    (a.out / "ab.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def one_shape(versions, backend, head_dim, seqlen, causal, dtype, a) -> dict:
    batch, heads = max(1, TOKENS // seqlen), HIDDEN // head_dim
    g = torch.Generator(device="cuda").manual_seed(seqlen * 1000 + head_dim)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    calls = {name: timed_call(mod, backend, q, k, v, causal) for name, mod in versions.items()}
    outs = {}
    for name, call in calls.items():  # compile + warm up outside the timed rounds
        with torch.no_grad():
            outs[name] = call()
    torch.cuda.synchronize()
    err = (outs["after"].float() - outs["before"].float()).abs().max().item()
    names = list(versions)
    times = {n: [] for n in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            times[name].append(do_bench(calls[name], warmup=a.warmup_ms, rep=a.rep_ms, return_mode="median"))
    ratios = [b / t for b, t in zip(times["before"], times["after"])]  # > 1: after is faster
    spread = {n: (max(ts) - min(ts)) / statistics.median(ts) for n, ts in times.items()}
    return dict(backend=backend, head_dim=head_dim, seqlen=seqlen, causal=causal, batch=batch, heads=heads,
                dtype=str(dtype).removeprefix("torch."), times_ms=times,
                tflops={n: tflops(batch, heads, seqlen, head_dim, causal, statistics.median(ts))
                        for n, ts in times.items()},
                speed_ratio_after_over_before=statistics.median(ratios), spread=spread, max_abs_diff=err)


def timed_call(mod, backend: str, q, k, v, causal: bool):
    """The call one version is timed with: ``attention(q, k, v, backend=backend)``; for backend "fa3-fp8-kernel" the
    fa3-fp8 kernel alone, ``fp8.attention_from_fp8`` on inputs that version's ``fp8.quantize_fp8`` made once (the
    default recipe; the quantisation pass is outside the time); for backend "fp8-quant" that pass alone,
    ``fp8.quantize_fp8(q, k, v, impl="kernel")`` (its Q bytes compared between versions)."""
    if backend == QUANT_ONLY:
        fp8 = importlib.import_module(f"{mod.__name__}.fp8")
        return lambda: fp8.quantize_fp8(q, k, v, impl="kernel").q
    if backend == KERNEL_ONLY:
        fp8 = importlib.import_module(f"{mod.__name__}.fp8")
        inputs = fp8.quantize_fp8(q, k, v)
        return lambda: fp8.attention_from_fp8(inputs, causal=causal)
    return lambda: mod.attention(q, k, v, causal=causal, backend=backend)


def _line(r: dict) -> str:
    return (f"| {r['backend']} | {r['head_dim']} | {r['seqlen']} | {'yes' if r['causal'] else 'no'} | "
            f"{r['tflops']['before']:.0f} | {r['tflops']['after']:.0f} | {r['speed_ratio_after_over_before']:.3f} | "
            f"{r['spread']['before']:.1%} | {r['spread']['after']:.1%} | {r['max_abs_diff']:.2e} |")


if __name__ == "__main__":
    raise SystemExit(main())
