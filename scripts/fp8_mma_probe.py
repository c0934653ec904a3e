"""Probe of the FP8 tensor-core dot product on an sm90 GPU with crafted e4m3 operands (issue 10, calibration of
``fa_variants.fp8.emulation``'s accumulator model).

The GEMM is cuBLAS's FP8 GEMM through ``torch._scaled_mm`` (unit scales, float32 out), not the fa3-fp8 kernel:
with ``use_fast_accum=True`` the whole reduction stays in the tensor core's accumulator (the fa3-fp8 S = Q K^T
GEMM does the same over head_dim); with False cuBLAS adds partial sums into float32 on the CUDA cores every
few k-blocks. Both run on the same FP8 MMA instruction (QGMMA on Hopper), so what differs from the exact sum
(computed in float64: every e4m3 product and these sums are exact there) is the instruction's arithmetic.

Scenario "align": one large product 2^16 and 31 small ones 2^(16-j) in one k = 32 block; the small ones that
survive show the alignment width F (products below 2^(16-F) dropped or truncated) and, from the partial
survivals, the rounding. Scenario "carry": the large product alone in k-block 0 and the 31 small ones in
k-block 1 (K = 64): whether the accumulator from the previous instruction takes part in the alignment.
Scenario "sign": as "align" with the small products negative (truncation toward zero vs toward -inf).
Scenario "tie": 2^16 plus one product 2^(16-j) * 1.5 (a value between alignment steps).

    source .gpu/env.sh && python3 scripts/fp8_mma_probe.py [--json out.json]

Prints, per scenario and j, exact - 2^16 (the small part), what each GEMM kept of it, and a one-line
estimate of F per scenario (the largest j whose small part survives whole).
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import torch

E4M3 = torch.float8_e4m3fn
BIG = 16  # the large product 2^16 = 2^8 * 2^8


def _pair(e: int) -> tuple[float, float]:
    """Two e4m3 powers of two whose product is 2^e (each exponent in [-9, 8])."""
    a = math.ceil(e / 2)
    return 2.0 ** a, 2.0 ** (e - a)


def build(scenario: str, js: list[int]):
    """(A (M, K), B (K, N)) float32, exactly e4m3-representable, with row i of A against column i of B
    being scenario case js[i]; and the exact small parts (float64) per case."""
    K = 64 if scenario == "carry" else 32
    M = max(16, -(-len(js) // 16) * 16)
    A = torch.zeros(M, K, dtype=torch.float64)
    B = torch.zeros(K, M, dtype=torch.float64)
    small = []
    for i, j in enumerate(js):
        A[i, 0], B[0, i] = 2.0 ** 8, 2.0 ** 8
        cols = range(33, 64) if scenario == "carry" else range(1, 32)
        if scenario == "tie":
            cols = range(1, 2)
        for c in cols:
            a, b = _pair(BIG - j)
            if scenario == "tie":
                a *= 1.5  # 1.5 * 2^k is e4m3-exact
            if scenario == "sign":
                a = -a
            A[i, c], B[c, i] = a, b
        small.append(float((A[i] * B[:, i]).sum() - 2.0 ** BIG))
    assert torch.equal(A.to(E4M3).double(), A) and torch.equal(B.to(E4M3).double(), B)
    return A, B, small


def run(A: torch.Tensor, B: torch.Tensor, fast: bool) -> torch.Tensor:
    a = A.float().to(E4M3).cuda()
    b = B.float().to(E4M3).cuda().t().contiguous().t()  # column-major B
    one = torch.ones((), device="cuda")
    return torch._scaled_mm(a, b, one, one, out_dtype=torch.float32, use_fast_accum=fast).double().cpu()


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        print("fp8_mma_probe: needs an FP8 GPU (sm_89+)", file=sys.stderr)
        return 2
    js = list(range(4, 35))  # small products 2^12 .. 2^-18
    rows = []
    for scenario in ("align", "carry", "sign", "tie"):
        cases = [j for j in js if j <= 32] if scenario == "tie" else js  # 1.5 * 2^-9 is not an e4m3 value
        A, B, small = build(scenario, cases)
        got = {fast: run(A, B, fast) for fast in (True, False)}
        print(f"\n== {scenario} (K = {A.shape[1]}): small part = exact - 2^16; kept = (result - 2^16) / small part")
        print(f"{'j':>3} {'small part':>14} {'kept fast':>10} {'kept slow':>10}")
        whole = {True: None, False: None}
        for i, j in enumerate(cases):
            kept = {f: (got[f][i, i].item() - 2.0 ** BIG) / small[i] for f in (True, False)}
            for f in (True, False):
                if whole[f] is None and abs(kept[f] - 1.0) > 1e-12:
                    whole[f] = j - 1
            rows.append(dict(scenario=scenario, j=j, small=small[i], kept_fast=kept[True], kept_slow=kept[False]))
            print(f"{j:>3} {small[i]:>14.6g} {kept[True]:>10.4f} {kept[False]:>10.4f}")
        print(f"{scenario}: small parts kept whole down to j = {whole[True]} (fast accumulate), {whole[False]} (cuBLAS "
              f"promotion); j = F means products 2^-F of the largest survive")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
