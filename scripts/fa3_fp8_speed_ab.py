"""fa3-fp8 A/B on one sm90 GPU: every accumulation mode and tile shape of the FP8 kernel beside our bf16 fa3 and
flash-attn-4, in one process, plus kernel-vs-emulation errors of the accumulation modes (issue 10).

Speed: B*N = 16k, H*D = 2048 (the project's benchmark shape), head_dim 64/128/256, N 4k/16k, causal and not.
The FP8 kernel runs alone on inputs already quantised (random e4m3, block descales of its own tile_n). Each
problem is timed in ``--rounds`` rounds (default 6); each round runs every implementation once, in an order
rotated by one per round (no implementation always first after another's L2 state), ``--iters`` calls between
two CUDA events after one warm-up call. Reported: the median over rounds, TFLOP/s = 4 B H N^2 D / time (halved
when causal), the spread (max - min) / median, and per problem fp8/bf16 ratios and the two-level cost
(single accumulator / two-level default - 1).

Compiles: the variants are compiled first by ``--jobs`` worker processes (each runs every kernel once on tiny
inputs, which stores it in the on-disk compile cache, ``fa_variants.common.diskcache``); the timing process
then loads them. ``--jobs 0`` compiles in-process.

Accuracy (``--errors``, on by default): default recipe (``quantize_fp8``: block scales, Hadamard, smoothed K)
on N(0, 1) inputs, B=1, H=4, N=2048 (causal and not); per accumulation mode: rel-L2 of the kernel vs
``emulate_fp8_attention`` with the same FP8Config (two_level, promote_every), and of both vs float64; for the
default mode also vs the emulation with the block-floating-point accumulator model (``accumulator="blockfp"``).

    source .gpu/env.sh && python3 scripts/fa3_fp8_speed_ab.py --out "$OUT/fp8_ab"          (~3-4 min, H200)
    python3 scripts/fa3_fp8_speed_ab.py --quick        (D=128, N=4k, non-causal, 3 rounds: a smoke run)

Writes <out>/speed.jsonl (one line per problem and implementation), <out>/errors.jsonl, <out>/summary.md;
prints the summary at the end.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch

E4M3 = torch.float8_e4m3fn

# Variants of the FP8 kernel per head_dim: name -> changes to fa3_fp8.DEFAULT_CONFIGS[head_dim]. "fp8" is the
# default; "single" the ablation baseline (one running accumulator); the rest are candidates, each compiled for
# sm_90a without spills, causal and not (tile_m 192 with tile_n 192 at head_dim 64 spills: 248 bytes).
VARIANTS: dict[int, dict[str, dict]] = {
    64: {"fp8": {}, "single": dict(two_level=False), "promote2": dict(promote_every=2),
         "promote4": dict(promote_every=4), "tm192": dict(tile_m=192), "tn256": dict(tile_n=256)},
    128: {"fp8": {}, "single": dict(two_level=False), "promote2": dict(promote_every=2),
          "promote4": dict(promote_every=4), "stages3": dict(stages=3),
          "tn192_serial": dict(tile_n=192, intra_wg_overlap=False),
          "tn256_serial": dict(tile_n=256, intra_wg_overlap=False)},
    256: {"fp8": {}, "single": dict(two_level=False, pv_split=1), "pv4": dict(pv_split=4),
          "pv4_2buf": dict(pv_split=4, pv_buffers=2)},
}
# Accumulation modes for the error table: name -> (kernel config change, FP8Config two_level, promote_every)
ACC_MODES = {"two_level": ({}, True, 1), "single": (dict(two_level=False, pv_split=1), False, 1),
             "promote2": (dict(promote_every=2), True, 2), "promote4": (dict(promote_every=4), True, 4),
             "pv4_2buf": (dict(pv_split=4, pv_buffers=2), True, 1)}


def kernel_config(head_dim: int, change: dict):
    from fa_variants.hopper import fa3_fp8

    return dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[head_dim], **change)


def fp8_inputs(B: int, N: int, H: int, D: int, tile_n: int):
    """scripts/fa3_fp8_gpu.py's inputs (imported here, not at the top: it loads the DSL, which --plan needs not)."""
    from fa3_fp8_gpu import fp8_inputs as make

    return make(B, N, H, D, tile_n)


def _compile_one(job: tuple) -> str:
    """Worker: run one kernel once on tiny inputs (compiles it and stores it in the disk cache)."""
    kind, D, causal, change = job
    t0 = time.time()
    try:
        if kind == "quant":  # the GPU quantisation pass (errors table)
            from fa_variants.fp8 import quantize_fp8

            x = torch.randn(1, 256, 1, D, device="cuda", dtype=torch.bfloat16)
            quantize_fp8(x, x, x)
        elif kind == "fp8":
            from fa_variants.hopper import fa3_fp8

            cfg = kernel_config(D, change)
            args = fp8_inputs(1, 256, 1, D, cfg.tile_n)
            fa3_fp8.run_quantized(*args, softmax_scale=D ** -0.5, causal=causal, config=cfg)
        else:
            from fa_variants.hopper import fa3

            q = torch.randn(1, 256, 1, D, device="cuda", dtype=torch.bfloat16)
            fa3.run(q, q, q, causal=causal, softmax_scale=D ** -0.5)
        torch.cuda.synchronize()
        return f"ok {kind} d{D} causal={causal} {change} {time.time() - t0:.1f}s"
    except Exception as exc:  # noqa: BLE001 - reported, the timing process retries in-process
        return f"FAILED {kind} d{D} causal={causal} {change}: {type(exc).__name__}: {str(exc)[:200]}"


def precompile(head_dims, causals, jobs: int) -> None:
    work = [("bf16", D, c, {}) for D in head_dims for c in causals]
    work += [("fp8", D, c, ch) for D in head_dims for c in causals for ch in VARIANTS[D].values()]
    work += [("quant", D, False, {}) for D in head_dims]
    t0 = time.time()
    if jobs <= 0:
        msgs = [_compile_one(w) for w in work]
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            msgs = list(pool.map(_compile_one, work))
    bad = [m for m in msgs if not m.startswith("ok")]
    print(f"precompile: {len(work)} kernels in {time.time() - t0:.0f}s with {jobs} workers; {len(bad)} failed", flush=True)
    for m in bad:
        print("  " + m, flush=True)


def time_problem(impls: dict, rounds: int, iters: int) -> dict[str, list[float]]:
    """name -> per-round milliseconds per call; the order of impls rotated by one each round."""
    names = list(impls)
    times = {n: [] for n in names}
    for fn in impls.values():
        fn()
    torch.cuda.synchronize()
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            impls[n]()  # warm-up of this implementation after the previous one's
            start.record()
            for _ in range(iters):
                impls[n]()
            end.record()
            end.synchronize()
            times[n].append(start.elapsed_time(end) / iters)
    return times


def speed(args, out_dir: str) -> list[dict]:
    from fa_variants.hopper import fa3, fa3_fp8

    try:
        from flash_attn.cute.interface import flash_attn_func
    except Exception as exc:  # noqa: BLE001
        flash_attn_func = None
        print(f"flash-attn-4 not run: {type(exc).__name__}: {exc}", flush=True)
    rows = []
    with open(os.path.join(out_dir, "speed.jsonl"), "w") as f:
        for D in args.head_dims:
            for N in args.seqlens:
                B, H = max(1, 16384 // N), 2048 // D
                for causal in args.causal:
                    flops = 4 * B * H * N * N * D / (2 if causal else 1)
                    scale = D ** -0.5
                    impls = {}
                    inputs = {}
                    for name, change in VARIANTS[D].items():
                        cfg = kernel_config(D, change)
                        if cfg.tile_n not in inputs:
                            inputs[cfg.tile_n] = fp8_inputs(B, N, H, D, cfg.tile_n)
                        a = inputs[cfg.tile_n]
                        impls[name] = (lambda a=a, cfg=cfg: fa3_fp8.run_quantized(
                            *a, softmax_scale=scale, causal=causal, config=cfg))
                    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    impls["bf16_fa3"] = lambda: fa3.run(q, k, v, causal=causal, softmax_scale=scale)
                    if flash_attn_func is not None and D in (64, 128, 256):
                        impls["flash_attn_4"] = lambda: flash_attn_func(q, k, v, causal=causal)
                    for name in list(impls):  # a variant that fails to run is reported, not fatal
                        try:
                            impls[name]()
                        except Exception as exc:  # noqa: BLE001
                            print(f"d{D} N{N} causal={causal} {name}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                            del impls[name]
                    times = time_problem(impls, args.rounds, args.iters)
                    for name, ts in times.items():
                        med = statistics.median(ts)
                        row = dict(head_dim=D, seqlen=N, batch=B, heads=H, causal=causal, impl=name,
                                   ms=round(med, 4), tflops=round(flops / med / 1e9, 1),
                                   spread=round((max(ts) - min(ts)) / med, 3), rounds=len(ts),
                                   config=(dataclasses.asdict(kernel_config(D, VARIANTS[D][name]))
                                           if name in VARIANTS[D] else None))
                        rows.append(row)
                        f.write(json.dumps(row) + "\n")
                    f.flush()
                    tf = {r["impl"]: r["tflops"] for r in rows if (r["head_dim"], r["seqlen"], r["causal"]) == (D, N, causal)}
                    print(f"d{D} N{N} causal={int(causal)}: " + " ".join(f"{n}={t:.0f}" for n, t in tf.items()), flush=True)
                    del impls, inputs, q, k, v
                    torch.cuda.empty_cache()
    return rows


def errors(args, out_dir: str) -> list[dict]:
    from fa_variants.fp8 import FP8Config, emulate_fp8_attention, quantize_fp8
    from fa_variants.hopper import fa3_fp8
    from fa_variants.reference import attention_reference, rel_l2

    rows = []
    g = torch.Generator(device="cuda").manual_seed(11)
    with open(os.path.join(out_dir, "errors.jsonl"), "w") as f:
        for D in args.head_dims:
            q, k, v = (torch.randn(1, args.err_seqlen, 4, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
            for causal in args.causal:
                exact, _ = attention_reference(q, k, v, causal=causal, softmax_scale=D ** -0.5)
                for mode, (change, two_level, every) in ACC_MODES.items():
                    try:
                        cfg = kernel_config(D, change)
                        cfg.check(D)
                    except ValueError:
                        continue  # not built at this head_dim (promote_every > 1 at 256, pv_split 4 with overlap)
                    inputs = quantize_fp8(q, k, v, config=FP8Config(two_level=two_level, promote_every=every))
                    out, lse = fa3_fp8.run_fp8(inputs, causal=causal, out_dtype=torch.bfloat16, config=cfg)
                    emu, emu_lse = emulate_fp8_attention(inputs, causal=causal, out_dtype=torch.bfloat16)
                    f_ = torch.isfinite(emu_lse)
                    blockfp = None  # the block-floating-point accumulator model, default mode only (time)
                    if mode == "two_level":
                        emu_b, _ = emulate_fp8_attention(inputs, causal=causal, out_dtype=torch.bfloat16, accumulator="blockfp")
                        blockfp = float(rel_l2(out, emu_b))
                    row = dict(head_dim=D, seqlen=args.err_seqlen, causal=causal, mode=mode,
                               kernel_vs_emulation=float(rel_l2(out, emu)), kernel_vs_emulation_blockfp=blockfp,
                               lse_max_diff=float((lse - emu_lse)[f_].abs().max()) if f_.any() else 0.0,
                               kernel_vs_float64=float(rel_l2(out, exact)), emulation_vs_float64=float(rel_l2(emu, exact)))
                    rows.append(row)
                    f.write(json.dumps(row) + "\n")
                    print(f"errors d{D} causal={int(causal)} {mode}: kernel-emu {row['kernel_vs_emulation']:.2e} "
                          f"(LSE {row['lse_max_diff']:.1e}; block-FP model {blockfp}), kernel-f64 {row['kernel_vs_float64']:.2e}, "
                          f"emu-f64 {row['emulation_vs_float64']:.2e}", flush=True)
    return rows


def summary(speed_rows: list[dict], error_rows: list[dict]) -> str:
    lines = ["# fa3-fp8 A/B", "", "TFLOP/s, median of rounds (spread = (max - min) / median over rounds).", ""]
    problems = sorted({(r["head_dim"], r["seqlen"], r["causal"]) for r in speed_rows})
    for D in sorted({p[0] for p in problems}):
        names = list(dict.fromkeys(r["impl"] for r in speed_rows if r["head_dim"] == D))
        lines += [f"## head_dim {D}", "", "| N | causal | " + " | ".join(names) + " | best fp8 / bf16 | fp8 / bf16 | two-level cost |",
                  "|" + "---|" * (len(names) + 5)]
        for (d, N, c) in problems:
            if d != D:
                continue
            by = {r["impl"]: r for r in speed_rows if (r["head_dim"], r["seqlen"], r["causal"]) == (d, N, c)}
            cells = [f"{by[n]['tflops']:.0f} ({by[n]['spread']:.0%})" if n in by else "-" for n in names]
            bf = by.get("bf16_fa3", {}).get("tflops")
            fp8s = {n: r["tflops"] for n, r in by.items() if n in VARIANTS[D] and n != "single"}
            best = max(fp8s, key=fp8s.get) if fp8s else None
            ratio = lambda x: f"{x / bf:.2f}x" if bf and x else "-"  # noqa: E731
            cost = (f"{by['single']['tflops'] / by['fp8']['tflops'] - 1:+.1%}" if "single" in by and "fp8" in by else "-")
            lines.append(f"| {N} | {int(c)} | " + " | ".join(cells) +
                         f" | {ratio(fp8s[best]) if best else '-'} ({best}) | {ratio(by['fp8']['tflops']) if 'fp8' in by else '-'} | {cost} |")
        lines.append("")
    if error_rows:
        lines += ["## kernel vs emulation (rel-L2), default recipe, N(0,1), B=1 H=4", "",
                  "| D | causal | mode | kernel vs emulation | vs block-FP emulation | LSE max diff | kernel vs f64 | emulation vs f64 |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in error_rows:
            b = r.get("kernel_vs_emulation_blockfp")
            lines.append(f"| {r['head_dim']} | {int(r['causal'])} | {r['mode']} | {r['kernel_vs_emulation']:.2e} | "
                         f"{'-' if b is None else f'{b:.2e}'} | "
                         f"{r['lse_max_diff']:.1e} | {r['kernel_vs_float64']:.2e} | {r['emulation_vs_float64']:.2e} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256], choices=[64, 128, 256])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=10, help="calls between the two events of one measurement")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="compile workers (0: in-process)")
    ap.add_argument("--no-errors", dest="errors", action="store_false")
    ap.add_argument("--err-seqlen", type=int, default=2048)
    ap.add_argument("--quick", action="store_true", help="D=128, N=4k, non-causal, 3 rounds")
    ap.add_argument("--out", default=os.environ.get("OUT", "results") + "/fa3_fp8_ab")
    args = ap.parse_args()
    if args.quick:
        args.head_dims, args.seqlens, args.causal, args.rounds = [128], [4096], "no", 3
    args.causal = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("fa3_fp8_speed_ab: needs an sm90 GPU", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__}", flush=True)
    precompile(args.head_dims, args.causal, args.jobs)
    speed_rows = speed(args, args.out)
    print(f"speed done at {time.time() - t0:.0f}s", flush=True)
    error_rows = errors(args, args.out) if args.errors else []
    text = summary(speed_rows, error_rows)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    print(text, flush=True)
    print(f"total {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
