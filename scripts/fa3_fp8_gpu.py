"""Quick fa3-fp8 speed check on an sm90 GPU: the FP8 kernel alone (inputs already quantised) beside our bf16 fa3.

B*N = 16k, H*D = 2048 (the project's benchmark shape), triton.testing.do_bench medians, TFLOP/s counted as
4 B H N^2 D (halved when causal). Also the cost of two-level accumulation (two_level off vs on).

    source .gpu/env.sh && python3 scripts/fa3_fp8_gpu.py --head-dims 128 256 --seqlens 4096 16384
"""
import argparse
import dataclasses
import json
import sys

import torch
import triton.testing

from fa_variants.hopper import fa3, fa3_fp8
from fa_variants.fp8 import layout

E4M3 = torch.float8_e4m3fn


def fp8_inputs(B, N, H, D, tile_n=None):
    """Random e4m3 q, k, v_t with block descales (Q blocks of layout.TILE_M rows, K/V blocks of tile_n keys,
    default the layout's tile_n for D). scripts/fa3_fp8_speed_ab.py uses it too."""
    bn = tile_n or layout.tile_n(D)
    q8 = (torch.randn(B, N, H, D, device="cuda") * 20).to(E4M3)
    k8 = (torch.randn(B, N, H, D, device="cuda") * 20).to(E4M3)
    vt = (torch.randn(B, H, D, layout.padded_seqlen_k(N), device="cuda") * 20).to(E4M3)
    qd = torch.full((B, H, -(-N // layout.TILE_M)), 0.05, device="cuda")
    kd = torch.full((B, H, -(-N // bn)), 0.05, device="cuda")
    vd = torch.full((B, H, -(-N // bn)), 0.05, device="cuda")
    return q8, k8, vt, qd, kd, vd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="no")
    ap.add_argument("--rep", type=int, default=50)
    args = ap.parse_args()
    rows = []
    for D in args.head_dims:
        for N in args.seqlens:
            B, H = max(1, 16384 // N), 2048 // D
            for causal in {"no": [False], "yes": [True], "both": [False, True]}[args.causal]:
                flops = 4 * B * H * N * N * D / (2 if causal else 1)
                q8, k8, vt, qd, kd, vd = fp8_inputs(B, N, H, D)
                scale = D ** -0.5
                row = dict(head_dim=D, seqlen=N, batch=B, heads=H, causal=causal)
                for name, cfg in (("fp8", None), ("fp8_single_acc", dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[D], two_level=False, pv_split=1, **fa3_fp8.NO_LOOKAHEAD))):
                    fn = lambda: fa3_fp8.run_quantized(q8, k8, vt, qd, kd, vd, softmax_scale=scale, causal=causal, config=cfg)
                    fn()
                    ms = triton.testing.do_bench(fn, warmup=10, rep=args.rep, return_mode="median")
                    row[name + "_tflops"] = round(flops / ms / 1e9, 1)
                q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                fn = lambda: fa3.run(q, k, v, causal=causal, softmax_scale=scale)
                fn()
                ms = triton.testing.do_bench(fn, warmup=10, rep=args.rep, return_mode="median")
                row["bf16_fa3_tflops"] = round(flops / ms / 1e9, 1)
                row["fp8_over_bf16"] = round(row["fp8_tflops"] / row["bf16_fa3_tflops"], 3)
                row["two_level_cost"] = round(row["fp8_single_acc_tflops"] / row["fp8_tflops"] - 1, 3)
                print(json.dumps(row), flush=True)
                rows.append(row)
                del q, k, v, q8, k8, vt
    return 0


if __name__ == "__main__":
    sys.exit(main())
