"""`fa-variants fp8-study`: how accurate is e4m3 attention, and what do block scales and the Hadamard buy?

After FlashAttention-3 (Shah et al. 2024), section 4.3 and Table 3 (RMSE against a high-precision reference,
inputs with outliers). For each input distribution and sequence length it measures, against float64 on the
same (fp16-rounded) inputs, the output error of:

  (i)   fp16         PyTorch attention in fp16 (softmax in fp32), fa_variants.reference
  (ii)  tensor       e4m3, one scale per tensor, no rotation
  (iii) block        e4m3, one scale per (batch, head, Br / Bc-row tile)
  (iv)  block+H      (iii) + random-sign Hadamard on Q and K
  (v)   shipped      (iv) + smooth K (FP8Config() defaults)

FP8 columns come from the emulation of the fa3-fp8 kernel (fa_variants.fp8.emulation.fp8_attention_reference,
CPU by default) or, on a GPU where the kernel runs (fa_variants.fp8.attention.why_not), from the kernel through
``fa_variants.fp8.attention_fp8`` (a config the kernel refuses with ValueError falls back to the emulation,
and the table says so).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from fa_variants.fp8 import attention as fp8_attention
from fa_variants.fp8.emulation import fp8_attention_reference
from fa_variants.fp8.quantize import FP8Config

DISTRIBUTIONS = {
    "normal": "q, k, v ~ N(0, 1)",
    "channel": "EC-23a channel outliers: k[..., {5, 77}] += 40, q[..., 9] x20 on 1% of tokens, v[..., 3] x30",
    "sparse": "FA3 Table 3: N(0,1) + N(0,100) * Bernoulli(0.001) entries in q, k, v",
    "large": "q, k, v ~ N(0, 10^2): large magnitudes, a sharp softmax",
}

METHODS = {  # name -> (label, FP8Config or None for fp16)
    "fp16": ("(i) fp16 torch", None),
    "tensor": ("(ii) fp8 per-tensor", FP8Config(granularity="tensor", rotate=False, smooth_k=False)),
    "block": ("(iii) fp8 block", FP8Config(rotate=False, smooth_k=False)),
    "block+H": ("(iv) block+Hadamard", FP8Config(rotate=True, smooth_k=False)),
    "shipped": ("(v) +smooth K (default)", FP8Config()),
}


def make_inputs(dist: str, B: int, N: int, H: int, D: int, seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v (B, N, H, D) float16 drawn from DISTRIBUTIONS[dist] (CPU, seeded). Raises ValueError."""
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {sorted(DISTRIBUTIONS)}, got {dist!r}")
    g = torch.Generator().manual_seed(seed)
    randn = lambda: torch.randn(B, N, H, D, generator=g)  # noqa: E731
    q, k, v = randn(), randn(), randn()
    if dist == "channel":
        k[..., [5 % D, 77 % D]] += 40
        hot = torch.rand(B, N, generator=g) < 0.01
        q[..., 9 % D] = torch.where(hot[..., None], 20 * q[..., 9 % D], q[..., 9 % D])
        v[..., 3 % D] *= 30
    elif dist == "sparse":
        q, k, v = (x + 10 * randn() * (torch.rand(B, N, H, D, generator=g) < 1e-3) for x in (q, k, v))
    elif dist == "large":
        q, k, v = 10 * q, 10 * k, 10 * v
    return q.half(), k.half(), v.half()


def _kernel_module():
    """fa_variants.fp8.attention if the fa3-fp8 kernel runs on the current GPU; else None."""
    if not torch.cuda.is_available() or fp8_attention.why_not(torch.device("cuda")) is not None:
        return None
    return fp8_attention


def _errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    o, r = out.double().cpu(), ref.double().cpu()
    d = o - r
    rn = r.norm().item()
    return {"rmse": d.pow(2).mean().sqrt().item(), "rel_l2": d.norm().item() / rn if rn else d.norm().item(),
            "max_abs": d.abs().max().item(),
            "cos": torch.nn.functional.cosine_similarity(o.flatten(), r.flatten(), dim=0).item()}


def run_study(dists, seqlens, *, batch=1, heads=4, head_dim=128, causal=False, seed=0, backend="auto",
              progress=None) -> list[dict]:
    """Measure every method of METHODS on every (distribution, seqlen). Returns one dict per cell:
    dist, N, method, backend ("torch", "emulation", "kernel" or "emulation (kernel refused)"), seconds and
    the errors against float64: rmse, rel_l2, max_abs, cos. backend: "auto" | "emulation" | "kernel"
    (ValueError if "kernel" is asked for and not available)."""
    kernel = _kernel_module() if backend in ("auto", "kernel") else None
    if backend == "kernel" and kernel is None:
        why = fp8_attention.why_not(torch.device("cuda")) if torch.cuda.is_available() else "there is no GPU"
        raise ValueError(f"backend 'kernel' needs the fa3-fp8 kernel on an sm_90 GPU: {why}")
    device = "cuda" if kernel is not None else "cpu"
    from fa_variants.reference import attention_reference

    rows = []
    for dist in dists:
        for N in seqlens:
            q, k, v = (t.to(device) for t in make_inputs(dist, batch, N, heads, head_dim, seed))
            ref, _ = attention_reference(q, k, v, causal=causal, dtype=torch.float64)
            for name, (_, cfg) in METHODS.items():
                t0 = time.perf_counter()
                used = "torch"
                if cfg is None:
                    out, _ = attention_reference(q, k, v, causal=causal, dtype=torch.float16)
                elif kernel is not None:
                    try:
                        out = kernel.attention_fp8(q, k, v, causal=causal, softmax_scale=None, config=cfg)
                        used = "kernel"
                    except ValueError:
                        out, _ = fp8_attention_reference(q, k, v, causal=causal, config=cfg)
                        used = "emulation (kernel refused)"
                else:
                    out, _ = fp8_attention_reference(q, k, v, causal=causal, config=cfg)
                    used = "emulation"
                rows.append({"dist": dist, "N": N, "method": name, "backend": used,
                             "seconds": round(time.perf_counter() - t0, 3), **_errors(out, ref)})
                if progress:
                    progress()
    return rows


def _cell(row: dict) -> str:
    return f"{row['rmse']:.1e} ({100 * row['rel_l2']:.2g}%)"


def _markdown(rows: list[dict], header: str) -> str:
    lines = [header, "", "| dist | N | " + " | ".join(lbl for lbl, _ in METHODS.values()) + " |",
             "|---|---:|" + "---:|" * len(METHODS)]
    for (dist, N), cells in _grouped(rows).items():
        lines.append(f"| {dist} | {N} | " + " | ".join(_cell(cells[m]) for m in METHODS) + " |")
    return "\n".join(lines) + "\n"


def _grouped(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault((r["dist"], r["N"]), {})[r["method"]] = r
    return out


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Arguments of `fa-variants fp8-study`."""
    from fa_variants.cli import positive_int

    parser.add_argument("--quick", action="store_true", help="small sizes (about a minute on 2 CPU cores): N 256 1024, 2 heads; the default without a GPU")
    parser.add_argument("--seqlens", type=positive_int, nargs="+", default=None, help="default 512 2048 4096 (quick: 256 1024)")
    parser.add_argument("--dists", nargs="+", choices=sorted(DISTRIBUTIONS), default=list(DISTRIBUTIONS))
    parser.add_argument("--batch", type=positive_int, default=1)
    parser.add_argument("--heads", type=positive_int, default=None, help="default 8 (quick: 2)")
    parser.add_argument("--head-dim", type=positive_int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=("auto", "emulation", "kernel"), default="auto",
                        help="FP8 columns: emulation (CPU), the fa3_fp8 kernel (GPU), or auto")
    parser.add_argument("--out", type=Path, default=None, help="folder for fp8_study.json and fp8_study.md")


def run_cli(args: argparse.Namespace) -> int:
    """Run the study, print the table (rich), optionally write JSON and markdown under --out."""
    from rich.console import Console
    from rich.table import Table
    from tqdm import tqdm

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)  # an unusable folder fails now, not after the study
    quick = args.quick
    if not quick and not torch.cuda.is_available() and args.seqlens is None and args.heads is None:
        quick = True  # the full default takes minutes on a CPU (7m40s seen on 2 cores)
        print("fp8-study: no CUDA GPU, so the CPU-sized default (--quick: N 256 1024, 2 heads, about a minute "
              "seconds); pass --seqlens / --heads for the full sizes (512 2048 4096, 8 heads: minutes)",
              file=sys.stderr, flush=True)
    seqlens = args.seqlens or ([256, 1024] if quick else [512, 2048, 4096])
    heads = args.heads or (2 if quick else 8)
    setup = dict(batch=args.batch, heads=heads, head_dim=args.head_dim, causal=args.causal, seed=args.seed)
    # the bar goes to stderr and shows also when the output is piped (disable=False, not None)
    with tqdm(total=len(args.dists) * len(seqlens) * len(METHODS), desc="fp8-study", leave=False,
              disable=False, file=sys.stderr, mininterval=1.0) as bar:
        rows = run_study(args.dists, seqlens, backend=args.backend, progress=bar.update, **setup)
    backends = sorted({r["backend"] for r in rows if r["method"] != "fp16"})
    header = (f"Attention output error vs float64: RMSE (rel-L2); B={args.batch} H={heads} D={args.head_dim}"
              f"{' causal' if args.causal else ''}, fp16 inputs, FP8 = e4m3 via {', '.join(backends)}")
    table = Table(title=header, caption="; ".join(f"{d}: {t}" for d, t in DISTRIBUTIONS.items()))
    table.add_column("dist")
    table.add_column("N", justify="right")
    for label, _ in METHODS.values():
        table.add_column(label, justify="right")
    for (dist, N), cells in _grouped(rows).items():
        table.add_row(dist, str(N), *(_cell(cells[m]) for m in METHODS))
    Console().print(table)  # the terminal's width (80 when piped): rich wraps the cells
    if args.out is not None:
        meta = {**setup, "seqlens": seqlens, "dists": DISTRIBUTIONS,
                "methods": {m: lbl for m, (lbl, _) in METHODS.items()}, "torch": torch.__version__}
        (args.out / "fp8_study.json").write_text(json.dumps({"setup": meta, "rows": rows}, indent=1))
        (args.out / "fp8_study.md").write_text(_markdown(rows, header))
        print(f"wrote {args.out / 'fp8_study.json'} and {args.out / 'fp8_study.md'}")
    bad = [r for r in rows if not math.isfinite(r["rmse"])]
    return 1 if bad else 0
