"""One-shot FA3 check for the GPU host: the FA3 GPU tests, then TFLOP/s beside the peers, then the ablation.

    source .gpu/env.sh && python3 -m fa_variants.commands.bench_fa3 [--tests] [--ablation]
        [--head-dims 128] [--seqlens 4096,16384] [--dtypes bf16] [--causal both] [--json OUT]

Setup of the FlashAttention papers: batch * seqlen = 16384 tokens, num_heads * head_dim = 2048, forward
only; TFLOP/s = `bench.core.attention_flops` / time; time = median of
``triton.testing.do_bench``. Peers: PyTorch SDPA's cuDNN backend and flash-attn-4
(``flash_attn.cute.interface.flash_attn_func``) when importable. ``--ablation`` adds FA3 without
ping-pong, without intra-warpgroup overlap and without either (the FA3 paper's Table 2). The tests run
in this process first (``--tests``) so that compiled kernels are shared with the timing.
"""
import argparse
import dataclasses
import json
import statistics
import sys

import torch

from fa_variants.bench.core import attention_flops
from fa_variants.hopper import fa3

ABLATIONS = {
    "fa3": {},
    "fa3 no-pingpong": dict(pingpong=False),
    "fa3 no-overlap": dict(intra_wg_overlap=False),
    "fa3 neither": dict(pingpong=False, intra_wg_overlap=False),
    # not in FA3's Table 2: the cost of the exact softmax exponent (alpha_first, D 128's default, needs exp2_ffma)
    "fa3 exact-exp2": dict(exp2_ffma=False, alpha_first=False),
}


# Tile candidates per head dim for --sweep (each compiles without spills; see tests/test_fa3_compile.py).
SWEEP = {
    64: {"m128 n128 s2": dict(tile_m=128), "m192 n128 s3": dict(stages=3)},
    128: {"n128 s3": dict(stages=3), "n112 s3": dict(tile_n=112, stages=3), "n96 s4": dict(tile_n=96, stages=4),
          "n144 s2": dict(tile_n=144), "n160 s2 (non-causal)": dict(tile_n=160)},
    256: {"n80 pingpong": dict(pingpong=True), "n64": dict(tile_n=64), "n64 pingpong": dict(tile_n=64, pingpong=True)},
}


def _ours(change: dict | None):
    """fa3 with the call's default config (``fa3.default_config``: it depends on causal at D 256) changed by
    ``change``; None: no config, what `auto` runs (short seqlen_k: the persistent grid)."""
    def run(q, k, v, causal):
        config = None if change is None else dataclasses.replace(
            fa3.default_config(fa3.ARCH, q.shape[-1], causal), **change)
        return fa3.run(q, k, v, causal=causal, softmax_scale=q.shape[-1] ** -0.5, config=config)[0]
    return run


def _impls(head_dim: int, ablation: bool, sweep: bool = False) -> dict:
    impls = {"fa3": _ours(None)}
    if ablation:
        impls.update({name: _ours(change) for name, change in ABLATIONS.items() if change})
    if sweep:
        impls.update({f"fa3 {name}": _ours(change) for name, change in SWEEP.get(head_dim, {}).items()})

    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn(q, k, v, causal):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)

    impls["sdpa-cudnn"] = cudnn
    try:
        from flash_attn.cute.interface import flash_attn_func

        impls["flash-attn-4"] = lambda q, k, v, causal: flash_attn_func(q, k, v, causal=causal)[0]
    except Exception as exc:  # noqa: BLE001 - not installed on this host
        print(f"(flash-attn-4 not importable: {type(exc).__name__}: {str(exc)[:100]})")
    if sweep:
        impls["fa3 again"] = impls["fa3"]  # the default once more, last: run-to-run spread
    return impls


def bench(head_dims, seqlens, dtypes, causals, ablation_dims=frozenset(), sweep: bool = False, rep: int = 150,
          rounds: int = 1) -> list[dict]:
    from triton.testing import do_bench

    rows = []
    print(f"{torch.cuda.get_device_name()}: TFLOP/s, forward, B*N = 16k, H*D = 2048 "
          f"(median of {rounds} round-robin do_bench medians of {rep} ms)")
    for dtype_name in dtypes:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        for d in head_dims:
            impls = _impls(d, d in ablation_dims, sweep)
            for n in seqlens:
                b, h = max(1, 16384 // n), 2048 // d
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(3))
                for causal in causals:
                    flops = attention_flops(b, h, n, n, d, causal)
                    row = dict(dtype=dtype_name, head_dim=d, seqlen=n, batch=b, heads=h, causal=causal)
                    ref, times, active = None, {}, {}
                    for name, fn in impls.items():  # first calls: compile, check, warm up
                        if causal and "non-causal" in name:
                            continue
                        try:
                            out = fn(q, k, v, causal)
                            if ref is None and name == "sdpa-cudnn":
                                ref = out
                            if name.startswith("fa3"):
                                row[name + " out"] = out
                            active[name], times[name] = fn, []
                        except Exception as exc:  # noqa: BLE001 - report and keep going
                            row[name] = None
                            row[name + " error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    for _ in range(rounds):  # round robin, so that clock drift hits every implementation alike
                        for name, fn in active.items():
                            times[name].append(do_bench(lambda: fn(q, k, v, causal), warmup=10, rep=rep, return_mode="median"))
                    for name, ts in times.items():
                        row[name] = round(flops / statistics.median(ts) / 1e9, 1)
                        if rounds > 1:
                            row[name + " spread%"] = round(100 * (max(ts) - min(ts)) / statistics.median(ts), 1)
                    for name in list(row):
                        if name.endswith(" out"):
                            out = row.pop(name)
                            if ref is not None:
                                row[name.replace(" out", " maxdiff_vs_cudnn")] = float((out.float() - ref.float()).abs().max())
                    ours = row.get("fa3")
                    for peer in ("flash-attn-4", "sdpa-cudnn"):
                        if ours and row.get(peer):
                            row[f"fa3/{peer}"] = round(ours / row[peer], 3)
                    diffs = [v for k, v in row.items() if k.endswith("maxdiff_vs_cudnn")]
                    cells = "  ".join(f"{k}={v}" for k, v in row.items()
                                      if k not in ("dtype", "batch", "heads") and not k.endswith(("maxdiff_vs_cudnn", "spread%")))
                    spread = max((v for k, v in row.items() if k.endswith("spread%")), default=0.0)
                    print(f"{dtype_name} {cells}  max|fa3*-cudnn|={max(diffs, default=float('nan')):.2g}  max spread={spread}%", flush=True)
                    rows.append(row)
    return rows


def smoke() -> int:
    """One small call per head dim against the float64 reference: is the kernel alive and right?"""
    from fa_variants.reference import check_against_reference, check_lse, references

    rc = 0
    for d in (128, 64, 256):
        for causal in (False, True):
            q, k, v = (torch.randn(2, 300, 4, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            out, lse = fa3.run(q, k, v, causal=causal, softmax_scale=d ** -0.5)
            torch.cuda.synchronize()
            refs = references(q, k, v, causal=causal, softmax_scale=d ** -0.5)
            ok, ok_lse = check_against_reference(out, q, k, v, refs=refs), check_lse(lse, q, k, v, refs=refs)
            print(f"smoke D={d} causal={causal}: out {ok}; lse {ok_lse}", flush=True)
            rc |= not (ok.ok and ok_lse.ok)
    return rc


def main(argv=None) -> int:
    from fa_variants.cli import positive_int

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="only a few small calls against the reference")
    ap.add_argument("--tests", action="store_true", help="run tests/test_fa3_gpu.py first (same process)")
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments, e.g. '-x -k matrix'")
    ap.add_argument("--ablation", action="store_true", help="FA3 Table 2 variants, at the --ablation-dims")
    ap.add_argument("--ablation-dims", default="128")
    ap.add_argument("--sweep", action="store_true", help="time the tile candidates of SWEEP too")
    ap.add_argument("--rep", type=positive_int, default=150, help="do_bench milliseconds per measurement")
    ap.add_argument("--rounds", type=positive_int, default=1, help="round-robin repetitions; TFLOP/s from their median")
    ap.add_argument("--head-dims", default="128")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--causal", default="both", choices=["both", "yes", "no"])
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.smoke:
        return smoke()
    rc = 0
    if a.tests:
        import pytest

        rc = int(pytest.main(["-m", "gpu", "-q", "-p", "no:cacheprovider", "--tb=short", "-rf",
                              "tests/test_fa3_gpu.py", *a.pytest_args.split()]))
        print(f"== tests rc {rc}", flush=True)
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[a.causal]
    ablation_dims = {int(x) for x in a.ablation_dims.split(",")} if a.ablation else set()
    rows = bench([int(x) for x in a.head_dims.split(",")], [int(x) for x in a.seqlens.split(",")],
                 a.dtypes.split(","), causals, ablation_dims, a.sweep, a.rep, a.rounds)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
