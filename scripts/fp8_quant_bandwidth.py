"""Bandwidth of the FP8 quantisation pass (fa_variants.fp8.quant_kernel) beside a device copy, on the GPU.

    source .gpu/env.sh && python3 scripts/fp8_quant_bandwidth.py [--json OUT]

Bytes counted: what the pass must move at least, per call of quantize_fp8 (default recipe): q, k, v read once
in 16 bits, e4m3 q, k, v_t written (1 byte per element); the torch reduction for K's mean reads K once more
and the LSE shift reads q once more (both counted as extra, shown apart). Effective bandwidth = counted bytes /
median time (CUDA events, 20 runs after 3 warm-ups); the copy reference is torch's copy of a 2 GiB tensor
(read + write). Issue 10's target: the pass at >= 70% of the device copy (~4.3 TB/s on an H200).
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from fa_variants.bench.runtime import event_ms
from fa_variants.fp8 import FP8Config
from fa_variants.fp8.quantize import quantize_fp8


def median_ms(fn, runs: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    return statistics.median([event_ms(fn) for _ in range(runs)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args()
    big = torch.empty(2**30, dtype=torch.bfloat16, device="cuda")
    copy_ms = median_ms(lambda: big.clone())
    copy_tbs = 2 * big.numel() * 2 / copy_ms / 1e9
    print(f"device copy: {copy_tbs:.2f} TB/s")
    rows = [{"what": "copy", "tb_s": copy_tbs}]
    for head_dim in (64, 128, 256):
        n, heads = 16384, 2048 // head_dim
        q, k, v = (torch.randn(1, n, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for name, cfg in (("default", FP8Config()), ("no-smooth", FP8Config(smooth_k=False))):
            ms = median_ms(lambda: quantize_fp8(q, k, v, config=cfg, impl="kernel"))
            must = 3 * q.numel() * 2 + 3 * q.numel()
            extra = 2 * q.numel() * 2 if cfg.smooth_k else 0
            tbs = must / ms / 1e9
            row = {"what": f"quantize_fp8 D={head_dim} {name}", "ms": ms, "tb_s": tbs, "of_copy": tbs / copy_tbs,
                   "extra_bytes_read": extra}
            rows.append(row)
            print(f"{row['what']}: {ms:.3f} ms, {tbs:.2f} TB/s = {100 * tbs / copy_tbs:.0f}% of copy "
                  f"(+{extra / 2**20:.0f} MiB read by torch for K's mean and the LSE shift)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
