"""fa2 at head_dim 256: the tile variants of ``fa2.D256_CONFIGS`` timed beside SDPA's flash backend (FA2 C++).

    python3 scripts/fa2d256_ab.py --out $OUT/fa2d256ab          # bf16, N 512..16k, causal and not
    python3 scripts/fa2d256_ab.py --plan                         # the shapes and configs (no GPU needed)
    python3 scripts/fa2d256_ab.py --precompile 16                # the kernels into the disk cache (no GPU needed)

Shapes: the FlashAttention papers' setup, batch * seqlen = 16384 tokens, heads * head_dim = 2048 (8 heads of 256),
forward, TFLOP/s = 4 B H N^2 D / time (halved for causal). Every entry runs on the same inputs and is compiled and
run once outside the timing (max |O - default's O| and max |O - SDPA flash's O| are reported). Timing: the paired
protocol of ``fa_variants.bench.paired`` (CUDA-graph bursts of --burst-ms, --warmup-ms of bursts of every entry,
--rounds rounds of --cycles cycles with the order rotated per round and reversed every second cycle, an A/A control
of `default`), one shape after another. Ratios are speed ratios (> 1: the first is faster): per round, the median of
that round's samples, and over rounds the median with a bootstrap 95% interval and a verdict against the A/A band.

Printed per shape: a ROW line (TFLOP/s medians, x/sdpa-flash and x/default per variant, per-round ratios of x/default
and x/sdpa-flash); at the end SUMMARY lines (one per shape) and, per variant, a WINS line: on how many shapes its
verdict against `default` is "faster" / "slower", its median ratio to `default` is > 1.00 and to SDPA flash >= 1.00;
FLIP when it is faster on at least one shape and slower on none (a default change worth making), "(every shape)" when
its median beats `default` and reaches SDPA flash on every shape (issue 12's "FA2 >= SDPA flash" at head_dim 256).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fa_variants, run from anywhere

TOKENS, HIDDEN, HEAD_DIM = 16384, 2048, 256
PEER = "sdpa-flash"
DTYPES = ("bf16", "fp16")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def plan(seqlens, causals, dtypes) -> list[dict]:
    """One dict per shape: dtype, seqlen, causal, batch, heads."""
    return [dict(dtype=dt, seqlen=n, causal=c, batch=max(1, TOKENS // n), heads=HIDDEN // HEAD_DIM)
            for dt in dtypes for n in seqlens for c in causals]


def config(name: str, arch: str = "sm_90a"):
    from fa_variants.ampere import fa2

    return fa2.d256_config(arch, name)


def default_variants() -> list[str]:
    """Every fa2.D256_CONFIGS name but "s1", the same tiles as "default" since session 6 (the baseline first)."""
    from fa_variants.ampere import fa2

    return [n for n in fa2.D256_CONFIGS if n != "s1" or fa2.D256_CONFIGS["s1"] != fa2.D256_CONFIGS["default"]]


def compile_items(variants, causals, dtypes) -> list[tuple]:
    """(variant, causal, dtype) of every kernel to precompile."""
    return [(v, c, dt) for dt in dtypes for v in variants for c in causals]


def _compile_one(item) -> str:
    import os

    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from fa_variants import registry

    name, causal, dtype = item
    t = time.time()
    arch = os.environ["CUTE_DSL_ARCH"]
    registry.compiled(registry.static_config("fa2", arch, dtype, HEAD_DIM, causal, config(name, arch)))
    return f"{name} D=256 {'causal' if causal else 'full'} {dtype}: {time.time() - t:.0f} s"


def precompile(items, jobs: int) -> int:
    """Compile `items` in `jobs` spawned processes (the DSL is not fork-safe) into the disk cache."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.time()
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_compile_one, items):
            print(line, flush=True)
    print(f"precompiled {len(items)} kernels in {time.time() - t0:.0f} s", flush=True)
    return 0


def shape_entries(shape, variants, arch, torch):
    """(name -> fn, name -> key (the config; None for SDPA), name -> max |O - default's O|, name -> max |O - SDPA's|,
    name -> error of an entry that failed)."""
    from fa_variants.ampere import fa2
    from fa_variants.bench.runtime import build_impls

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[shape["dtype"]]
    n, causal, b, h = shape["seqlen"], shape["causal"], shape["batch"], shape["heads"]
    g = torch.Generator(device="cuda").manual_seed(n * 10 + causal)
    q, k, v = (torch.randn(b, n, h, HEAD_DIM, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    scale = HEAD_DIM ** -0.5
    fns, keys = {}, {}
    for name in variants:
        cfg = keys[name] = config(name, arch)
        fns[name] = lambda cfg=cfg: fa2.run(q, k, v, causal=causal, softmax_scale=scale, config=cfg)
    peers, _ = build_impls([], [PEER])
    for p in peers:
        fns[p.name], keys[p.name] = (lambda p=p: p.fn(q, k, v, causal)), None
    outs, errors = {}, {}
    for name, fn in fns.items():
        try:
            out = fn()
            outs[name] = (out[0] if isinstance(out, (tuple, list)) else out).float()
        except Exception as exc:  # noqa: BLE001 - reported per entry, the other entries still run
            errors[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
    torch.cuda.synchronize()
    fns = {x: f for x, f in fns.items() if x not in errors}
    base, peer = outs.get(variants[0]), outs.get(PEER)
    diff = {x: (o - base).abs().max().item() for x, o in outs.items()} if base is not None else {}
    diff_peer = {x: (o - peer).abs().max().item() for x, o in outs.items()} if peer is not None else {}
    return fns, keys, diff, diff_peer, errors


def per_round(res, x: str, y: str) -> list[float]:
    """x/y per round: the median of that round's paired samples (nan for a round without one)."""
    return [statistics.median(s) if s else float("nan") for s in res.samples(x, y)]


def time_shape(shape, variants, arch, a, torch, timer) -> dict:
    from fa_variants.bench import core, paired

    fns, keys, diff, diff_peer, errors = shape_entries(shape, variants, arch, torch)
    row = dict(shape, errors=errors, max_diff_vs_default=diff, max_diff_vs_sdpa=diff_peer)
    if variants[0] not in fns:
        return row
    entries = [paired.Entry(x, f, keys[x]) for x, f in fns.items()]
    res = paired.paired_ab(entries, variants[0], timer, rounds=a.rounds, cycles=a.cycles, burst_ms=a.burst_ms,
                           warmup_ms=a.warmup_ms)
    flops = core.attention_flops(shape["batch"], shape["heads"], shape["seqlen"], shape["seqlen"], HEAD_DIM,
                                 shape["causal"])
    names = list(fns)
    row["tflops"] = {x: core.tflops(flops, statistics.median(res.times(x))) for x in names}
    row["spread"] = {x: (max(res.times(x)) - min(res.times(x))) / statistics.median(res.times(x)) for x in names}
    ratios = {}
    for x in names[:-1] if PEER in fns else names:  # ours over the baseline and over SDPA flash
        for y in (variants[0], PEER):
            if x != y and y in fns:
                r = res.ratio(x, y)
                ratios[f"{x}/{y}"] = dict(median=r.median, lo=r.lo, hi=r.hi, verdict=r.verdict, aa=r.aa,
                                          rounds=per_round(res, x, y) if not r.aa else [])
    aa = res.aa()
    row.update(ratios=ratios, aa=dict(median=aa.median, lo=aa.lo, hi=aa.hi, band=paired.aa_band(aa)),
               clocks={x: res.clocks(x) for x in names})
    return row


def label(r: dict) -> str:
    return f"{r['dtype']} N={r['seqlen']} {'causal' if r['causal'] else 'full'}"


def row_lines(r: dict) -> list[str]:
    out = [f"ROW {label(r)} B={r['batch']} H={r['heads']}: " + ", ".join(
        f"{x} {t:.0f} TF/s ({r['spread'][x]:.0%})" for x, t in r.get("tflops", {}).items())
        + (f" errors: {r['errors']}" if r["errors"] else "")]
    if "aa" in r:
        aa = r["aa"]
        out.append(f"    A/A [{aa['lo']:.3f}, {aa['hi']:.3f}] band {aa['band']:.3f}; max diff vs default "
                   + ", ".join(f"{x} {d:.1e}" for x, d in r["max_diff_vs_default"].items()))
    for key, v in r.get("ratios", {}).items():
        rounds = " ".join(f"{x:.3f}" for x in v["rounds"])
        out.append(f"    {key}: {v['median']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}] {v['verdict']}"
                   + (" A/A" if v["aa"] else f"; per round {rounds}"))
    return out


def summary_lines(rows: list[dict], variants: list[str]) -> list[str]:
    """SUMMARY per shape (x/sdpa-flash and x/default, medians over rounds), then WINS per variant."""
    nan = float("nan")
    base = variants[0]
    out = [f"SUMMARY shape: x/{PEER} (x/{base}) per variant, medians over rounds; max |O - {base}'s O| of ours"]
    for r in rows:
        rt = r.get("ratios", {})
        diff = max((d for x, d in r["max_diff_vs_default"].items() if x != PEER), default=nan)
        out.append(f"SUMMARY {label(r)}: " + ", ".join(
            f"{x} {rt.get(f'{x}/{PEER}', {}).get('median', nan):.3f}"
            + ("" if x == base else f" ({rt.get(f'{x}/{base}', {}).get('median', nan):.3f})") for x in variants)
            + f"; max diff vs {base} {diff:.1e}" + (f" errors: {r['errors']}" if r["errors"] else ""))
    for x in variants[1:]:
        verdicts = [r["ratios"][f"{x}/{base}"]["verdict"] for r in rows if f"{x}/{base}" in r.get("ratios", {})]
        above = [r for r in rows if r.get("ratios", {}).get(f"{x}/{base}", {}).get("median", nan) > 1.0]
        peer = [r for r in rows if r.get("ratios", {}).get(f"{x}/{PEER}", {}).get("median", nan) >= 1.0]
        n, faster, slower = len(rows), verdicts.count("faster"), verdicts.count("slower")
        flip = len(verdicts) == n > 0 and slower == 0 and faster > 0
        out.append(f"WINS {x}: vs {base} faster on {faster}/{n} shapes, slower on {slower}/{n} (verdicts), median > 1 "
                   f"on {len(above)}/{n}; >= {PEER} on {len(peer)}/{n}" + (" FLIP" if flip else "")
                   + (" (every shape)" if len(above) == len(peer) == n > 0 else ""))
    return out


def main(argv=None) -> int:
    from fa_variants.ampere import fa2

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=",".join(default_variants()),
                    help=f"fa2.D256_CONFIGS names, the first is the baseline (default: {','.join(default_variants())})")
    ap.add_argument("--seqlens", type=_ints, default=[512, 1024, 2048, 4096, 16384])
    ap.add_argument("--causal", default="both", choices=["both", "yes", "no"])
    ap.add_argument("--dtypes", default="bf16", help="comma list of bf16, fp16")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--cycles", type=int, default=2, help="per round (even): one sample per pair of cycles")
    ap.add_argument("--burst-ms", type=float, default=10.0)
    ap.add_argument("--warmup-ms", type=float, default=300.0, help="per shape, bursts of every entry")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plan", action="store_true", help="print the shapes and configs; no GPU")
    ap.add_argument("--precompile", type=int, default=0, metavar="JOBS",
                    help="compile every (variant, causal, dtype) into the disk cache in JOBS processes and exit")
    a = ap.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    dtypes = [d for d in a.dtypes.split(",") if d]
    if not variants or set(variants) - set(fa2.D256_CONFIGS):
        ap.error(f"--variants: {a.variants!r}: known {', '.join(fa2.D256_CONFIGS)}")
    if not dtypes or set(dtypes) - set(DTYPES):
        ap.error(f"--dtypes: {a.dtypes!r}: known {', '.join(DTYPES)}")
    if a.rounds < 1 or a.cycles < 2 or a.cycles % 2:
        ap.error(f"--rounds >= 1 and --cycles even >= 2, got {a.rounds} / {a.cycles}")
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[a.causal]
    shapes = plan(a.seqlens, causals, dtypes)
    if a.plan:
        for x in variants:
            print(f"{x}: {config(x)}")
        print(f"{len(shapes)} shapes x {len(variants) + 1} entries (+ A/A) x {a.rounds} rounds")
        return 0
    if a.precompile:
        return precompile(compile_items(variants, causals, dtypes), a.precompile)
    if a.out is None:
        ap.error("--out is required (unless --plan or --precompile)")
    return run(a, shapes, variants)


def run(a, shapes, variants) -> int:
    import torch

    from fa_variants.bench.runtime import GraphBurstTimer
    from fa_variants.common import interop

    a.out.mkdir(parents=True, exist_ok=True)
    arch, rows, t0 = interop.device_arch(), [], time.time()
    print(f"device {torch.cuda.get_device_name()} ({arch}), torch {torch.__version__}", flush=True)
    try:
        for shape in shapes:
            rows.append(time_shape(shape, variants, arch, a, torch, GraphBurstTimer()))
            print("\n".join(row_lines(rows[-1])), f"[{time.time() - t0:.0f} s]", flush=True)
            (a.out / "ab.json").write_text(json.dumps(rows, indent=1))
            torch.cuda.empty_cache()
    except KeyboardInterrupt:  # a time limit (SIGINT): the summary of the shapes done so far
        print(f"INTERRUPTED after {len(rows)} of {len(shapes)} shapes [{time.time() - t0:.0f} s]", flush=True)
    print("\n".join(summary_lines(rows, variants)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
