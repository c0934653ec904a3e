"""Issue 13: does the K/V cache's memory layout set decode's HBM share at head_dim 64? (a measurement, no switch)

    python3 scripts/kvlayout_probe.py --out $OUT/kvlayout      # ~1 min on an H200

Question. At head_dim 64, B 1, Nk 32k, GQA 32:8, seqlen_q 1, the split kernel streams K/V at ~3.5 TB/s (63-65 % of
HBM for the call) where head_dim 128 reaches ~75 %; more stages, two CTAs per SM and L2 prefetches did not move it.
In the (batch, seqlen, heads_kv, head_dim) layout one KV head's key row is 128 bytes (D 64) at a stride of
heads_kv x 128 bytes, so a CTA (one KV head, one key range) reads 128-byte pieces spread over DRAM pages that the
other heads' CTAs read at other times; at D 128 the pieces are 256 bytes. Hypothesis: the piece size, not the
kernel, caps the stream. Test: the same calls on a (batch, heads_kv, seqlen, head_dim) cache (Hugging Face's
layout, passed as a transposed view: each head's keys contiguous), SDPA beside, and a plain read of the same bytes
(``k.sum() + v.sum()``) as the ceiling. If the transposed cache runs the split kernel >= 10 % faster at D 64 (and
<= 3 % at D 128), the layout is the cap and a kernel change that reads wider pieces (several KV heads per CTA) is
the lever; if not, the hypothesis is refuted.

Timing: ``sets`` K/V copies rotated inside one CUDA graph (the K/V of one call is not in L2 for the next: 67 MB of
a 60 MiB L2 otherwise stays partly resident), 6 rounds with the order rotated, median GPU us per call.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

SHAPES = [  # (head_dim, heads, heads_kv, batch, seqlen_k)
    (64, 32, 8, 1, 32768), (64, 32, 8, 1, 131072), (64, 32, 8, 8, 32768),
    (128, 32, 8, 1, 32768), (128, 32, 8, 1, 131072),
]
LAYOUTS = ("bnhd", "bhnd")


def make_kv(layout, b, nk, hkv, d, torch, g):
    """K and V in the kernel's (batch, seqlen, heads_kv, head_dim) view, stored in ``layout``."""
    if layout == "bnhd":
        k = torch.randn(b, nk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        return k, torch.randn_like(k)
    k = torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.bfloat16, generator=g)
    return k.transpose(1, 2), torch.randn_like(k).transpose(1, 2)


def gpu_us(calls_fn, calls, reps, torch):
    """GPU us per call: ``calls`` calls in one CUDA graph, replayed ``reps`` times, median."""
    from fa_variants.bench.decode import cuda_graph_of, median_ms

    calls_fn()
    torch.cuda.synchronize()
    graph = cuda_graph_of(calls_fn, 1)
    graph.replay()
    torch.cuda.synchronize()
    return median_ms(graph.replay, calls, reps) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--sets", type=int, default=4, help="K/V copies rotated within a graph")
    a = p.parse_args()
    import torch
    import torch.nn.functional as F

    import fa_variants
    from fa_variants.bench.decode import gpu_identity, peak_tbps

    try:
        peak = peak_tbps(*gpu_identity())[0]
    except ValueError:
        peak = float("nan")  # a GPU of unknown peak: the HBM column reads nan, the times stand
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (d, h, hkv, b, nk) in enumerate(SHAPES):
        g = torch.Generator(device="cuda").manual_seed(i)
        q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
        fns, errs = {}, {}
        for layout in LAYOUTS:
            sets = [make_kv(layout, b, nk, hkv, d, torch, g) for _ in range(a.sets)]
            ref = F.scaled_dot_product_attention(q.transpose(1, 2).double(), sets[0][0].transpose(1, 2).double(),
                                                 sets[0][1].transpose(1, 2).double(), enable_gqa=True).transpose(1, 2)
            o = fa_variants.attention(q, sets[0][0], sets[0][1], causal=True)
            errs[f"auto/{layout}"] = (o.double() - ref).abs().max().item()

            def ours(sets=sets):
                for k, v in sets:
                    fa_variants.attention(q, k, v, causal=True)

            def sdpa(sets=sets):
                for k, v in sets:
                    F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   enable_gqa=True)

            def read(sets=sets):
                for k, v in sets:
                    k.sum()
                    v.sum()
            fns[f"auto/{layout}"], fns[f"sdpa/{layout}"], fns[f"read/{layout}"] = ours, sdpa, read
        names = list(fns)
        per = {n: [] for n in names}
        for rnd in range(a.rounds):
            for n in names[rnd % len(names):] + names[:rnd % len(names)]:
                per[n].append(gpu_us(fns[n], a.sets, a.reps, torch))
        us = {n: statistics.median(t) for n, t in per.items()}
        kv_bytes = 2 * b * nk * hkv * d * 2
        row = dict(head_dim=d, heads=h, heads_kv=hkv, batch=b, seqlen_k=nk, us=us, err=errs,
                   hbm={n: kv_bytes / (t * 1e-6) / 1e12 / peak for n, t in us.items()})
        rows.append(row)
        print(f"D {d} {h}:{hkv} B {b} Nk {nk}: " + ", ".join(f"{n} {us[n]:.1f} us ({row['hbm'][n]:.0%})"
                                                          for n in names) + f"; max err {errs}", flush=True)
        (out / "kvlayout.json").write_text(json.dumps(rows, indent=1))
        del q, fns, sets
        torch.cuda.empty_cache()
    lines = ["| D | B | Nk | " + " | ".join(names) + " | auto bhnd / bnhd |", "|---" * (len(names) + 4) + "|"]
    for r in rows:
        lines.append(f"| {r['head_dim']} | {r['batch']} | {r['seqlen_k']} | "
                     + " | ".join(f"{r['us'][n]:.1f} ({r['hbm'][n]:.0%})" for n in names)
                     + f" | {r['us']['auto/bhnd'] / r['us']['auto/bnhd']:.3f} |")
    (out / "kvlayout.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
