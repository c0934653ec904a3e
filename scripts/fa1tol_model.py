"""A CPU model of the rounding sequence of FA1's (i, j) step (fa_variants/ampere/fa1.py) against fa2's and PyTorch's
same-dtype maths, measured against float64 on tests/test_edge_cases.py::test_ec08b's shape (seqlen 200, head_dim 64,
causal, bf16; one head per draw, the test checks each head alone).

Every value the kernels keep in fp32 is rounded to fp32 here, every 16-bit operand to bf16; matrix products are
float64 sums of those operands, rounded once (mma.sync's fp32 accumulation is more exact than the roundings modelled).
Per K/V tile j (tile_n keys), with S the fp32 scores, m/l the running row max/sum, c = softmax_scale log2 e:

    P = exp2((S - m_new) c), alpha = exp2((m - m_new) c), l_new = alpha l + rowsum P
    fa1 "old":  O = O (l alpha / l_new) + bf16(P / l_new) V      (P rounded after the division)
    fa1 "new":  O = (O (l alpha) + bf16(P) V) / l_new            (Algorithm 1 line 12's order; the row max of P is 1)
    fa2:        O = alpha O + bf16(P) V, O / l once at the end
    torch:      bf16(bf16(scale Q) K^T), softmax in fp32, bf16(P), bf16(P V)

and the output is bf16(O). Prints, per maths, how many draws break the testing rule (err > 2 err_torch + 1e-5) and
the quantiles of err / err_torch.

    python3 scripts/fa1tol_model.py --draws 3000
"""
from __future__ import annotations

import argparse
import math

import torch

MATHS = ("fa1_old", "fa1_new", "fa2")


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).double()


def fp32(x: torch.Tensor) -> torch.Tensor:
    return x.float().double()


def kernel_out(maths: str, s: torch.Tensor, v: torch.Tensor, scale: float, tile_n: int) -> torch.Tensor:
    """bf16 output of one head's kernel maths from its raw scores s (rows, keys; -inf where masked) and V (keys, D)."""
    rows, c = s.shape[0], scale * math.log2(math.e)
    o = torch.zeros(rows, v.shape[1], dtype=torch.float64)
    l = torch.zeros(rows, 1, dtype=torch.float64)
    m = torch.full((rows, 1), -math.inf, dtype=torch.float64)
    for j in range(0, s.shape[1], tile_n):
        sj, vj = fp32(s[:, j:j + tile_n]), v[j:j + tile_n]
        m_new = torch.maximum(m, sj.amax(-1, keepdim=True))
        p = fp32(torch.exp2(fp32((sj - m_new) * c)))
        alpha = torch.where(m == -math.inf, torch.zeros_like(m), fp32(torch.exp2(fp32((m - m_new) * c))))
        l_new = fp32(alpha * l + p.sum(-1, keepdim=True))
        inv_l = fp32(1 / l_new)
        if maths == "fa1_old":
            o = fp32(fp32(o * fp32(fp32(l * alpha) * inv_l)) + fp32(bf16(fp32(p * inv_l)) @ vj))
        elif maths == "fa1_new":
            o = fp32(fp32(fp32(o * fp32(l * alpha)) + fp32(bf16(p) @ vj)) * inv_l)
        else:
            o = fp32(fp32(o * alpha) + fp32(bf16(p) @ vj))
        l, m = l_new, m_new
    if maths == "fa2":
        o = fp32(o * fp32(1 / l))
    return bf16(o)


def draw(seed: int, seqlen: int = 200, head_dim: int = 64, tile_n: int = 128) -> dict:
    """err(maths) and err(torch same dtype) against float64 for one causal head of random bf16 Q, K, V."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (bf16(torch.randn(seqlen, head_dim, generator=g)) for _ in range(3))
    scale = 1 / math.sqrt(head_dim)
    hidden = ~torch.ones(seqlen, seqlen, dtype=torch.bool).tril()
    s = (q @ k.T).masked_fill(hidden, -math.inf)
    exact = torch.softmax(s * scale, -1) @ v
    s_torch = bf16(bf16(q * scale) @ k.T).masked_fill(hidden, -math.inf)
    out_torch = bf16(fp32(bf16(fp32(torch.softmax(s_torch, -1))) @ v))
    errs = {name: (kernel_out(name, s, v, scale, tile_n) - exact).abs().max().item() for name in MATHS}
    errs["torch"] = (out_torch - exact).abs().max().item()
    return errs


def summary(draws: int, first_seed: int = 0) -> dict:
    """Per maths: failures of the rule and sorted err / err_torch ratios over `draws` heads."""
    ratios = {name: [] for name in MATHS}
    fails = dict.fromkeys(MATHS, 0)
    for seed in range(first_seed, first_seed + draws):
        errs = draw(seed)
        for name in MATHS:
            fails[name] += errs[name] > 2 * errs["torch"] + 1e-5
            ratios[name].append(errs[name] / errs["torch"])
    return {name: (fails[name], sorted(ratios[name])) for name in MATHS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--first-seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    n = a.draws
    print(f"{n} heads of test_ec08b's shape (1 x 200 x 200, D 64, causal, bf16); err / err_torch:")
    for name, (fails, r) in summary(n, a.first_seed).items():
        print(f"{name:8s} fails {fails:4d} / {n} ({fails / n:.2%})  median {r[n // 2]:.2f}  p99 {r[int(0.99 * n)]:.2f}"
              f"  max {r[-1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
