"""FA2 (ours) beside PyTorch SDPA's flash backend (FA2 C++), FlashAttention-paper setup, on the GPU host.

B * N = 16k tokens, H * D = 2048, N = 1k .. 16k, D = 64 / 128, bf16, causal and not; time is the
median of triton.testing.do_bench; TFLOP/s = 4 B H N^2 D / t (halved for causal). Both run on the same
tensors: ours in (B, N, H, D), SDPA on the (B, H, N, D) transposed view (no copy). Each cell also
reports max |ours - SDPA| as a sanity check. Writes a JSON list to --json when given.

    source .gpu/env.sh && python scripts/fa2_bench.py [--seqlens 1024 2048 ...] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from fa_variants.ampere import fa2
from fa_variants.bench.core import attention_flops
from fa_variants.commands.compile import compile_only
from fa_variants.common import interop
from fa_variants.common.config import Sm80Config


def bench_cell(n, d, causal, dtype=torch.bfloat16, tokens=16384, hd=2048, rep=200, config=None):
    b, h = max(1, tokens // n), hd // d
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(3))
    scale = 1.0 / math.sqrt(d)
    ours = lambda: fa2.run(q, k, v, causal=causal, softmax_scale=scale, config=config)  # noqa: E731
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)

    out = ours()[0]
    diff = (out.float() - sdpa().transpose(1, 2).float()).abs().max().item()
    t_ours = do_bench(ours, warmup=25, rep=rep, return_mode="median")
    t_sdpa = do_bench(sdpa, warmup=25, rep=rep, return_mode="median")
    f = attention_flops(b, h, n, n, d, causal)
    return {"N": n, "D": d, "causal": causal, "B": b, "H": h, "ms_fa2": t_ours, "ms_sdpa_flash": t_sdpa,
            "tflops_fa2": f / t_ours / 1e9, "tflops_sdpa_flash": f / t_sdpa / 1e9,
            "ratio": t_sdpa / t_ours, "max_abs_diff_vs_sdpa": diff}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--compile-report", action="store_true", help="print compile JSON for every head dim")
    p.add_argument("--tiles", nargs="+", default=[None],
                   help="tile configs tile_m x tile_n (e.g. 128x64) to sweep; default: the table's")
    p.add_argument("--causal", choices=["both", "no", "yes"], default="both")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    arch = interop.device_arch()
    print(f"device {torch.cuda.get_device_name()} ({arch}), torch {torch.__version__}", flush=True)
    if args.compile_report:
        for d in (64, 96, 128, 256):
            print(json.dumps(compile_only("fa2", arch, d, "bf16", False, sass=False)), flush=True)
    rows = []
    causals = {"both": (False, True), "no": (False,), "yes": (True,)}[args.causal]
    print(f"{'tiles':>8} {'D':>4} {'causal':>6} {'N':>6} {'B':>3} {'H':>3} {'fa2 TF/s':>9} {'sdpa TF/s':>9} "
          f"{'ratio':>6} {'maxdiff':>8}", flush=True)
    for tiles in args.tiles:
        config = Sm80Config(*(int(x) for x in tiles.lower().split("x"))) if tiles else None
        for d in args.head_dims:
            for causal in causals:
                try:
                    info = compile_only("fa2", arch, d, "bf16", causal, config=config)
                except ValueError as exc:
                    print(f"{tiles} D={d}: {exc}", flush=True)
                    continue
                name = f"{info['tiles']['tile_m']}x{info['tiles']['tile_n']}"
                print(f"  {name} D={d} causal={causal}: {info['registers']} registers, "
                      f"{info['spill_bytes']} spill bytes, {info['smem_bytes']} smem bytes", flush=True)
                for n in args.seqlens:
                    t0 = time.perf_counter()
                    r = dict(bench_cell(n, d, causal, config=config), tiles=name)
                    rows.append(r)
                    print(f"{name:>8} {d:>4} {str(causal):>6} {n:>6} {r['B']:>3} {r['H']:>3} "
                          f"{r['tflops_fa2']:>9.1f} {r['tflops_sdpa_flash']:>9.1f} {r['ratio']:>6.3f} "
                          f"{r['max_abs_diff_vs_sdpa']:>8.1e}  ({time.perf_counter() - t0:.1f}s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "arch": arch, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
