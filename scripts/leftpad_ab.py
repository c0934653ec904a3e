"""A left-padded batch's attention (each sequence's keys [leftpad_k[b], seqlen_k)): our one launch beside SDPA with
the mask, and beside the same keys padded on the right (seqlens_k alone: what reading the first keys costs).

    python3 scripts/leftpad_ab.py --out $OUT/leftpad       # ~1-2 min on an H100 / H200
    python3 scripts/leftpad_ab.py --plan                    # the shapes (no GPU needed)

Shapes (`SHAPES`): bf16, 32 query heads on 8 KV heads, head_dim 128, causal; decoding steps (one query row, a
16- or 64-sequence batch over 4k or 32k keys) and prompt batches (8 x 512, 8 x 2048). Sequence b's padding is drawn
below half the keys (a fixed seed), so nearly every window differs. Entries, each checked against float64 attention
over the windows first (the project's rule):

* ``leftpad``   ``fa_variants.attention(q, k, v, causal=True, seqlens_k=ends, leftpad_k=starts)`` (auto: fa3 on sm90,
                fa2 on sm80): the kernel reads each sequence's first key;
* ``lengths``   the same calls on the keys moved to the front (``seqlens_k`` = each window's count): the kernel that
                reads no first key, the same work;
* ``sdpa-mask`` ``torch.nn.functional.scaled_dot_product_attention`` with the boolean mask (PyTorch's choice for a
                masked call), on the same inputs in its layout.

Timing: the paired protocol of ``fa_variants.bench.paired`` (CUDA-graph bursts of --burst-ms, so a call's host work,
the lengths' read-back included, is not timed: under CUDA graphs a serving loop skips it too; --rounds rounds of
--cycles cycles, order rotated and reversed, an A/A control of ``sdpa-mask``). Printed per shape: the ratios
leftpad / sdpa-mask and leftpad / lengths (> 1: leftpad faster) with their intervals and verdicts, and the SM clock
per entry; --out DIR/leftpad.json keeps everything. No pass or fail: a measurement (bench/NOTES.md carries the
prediction and the outcome).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fa_variants, run from anywhere

#: (batch, seqlen_q, seqlen_k): decoding steps, then prompt batches (seqlen_q = seqlen_k)
SHAPES = [(16, 1, 4096), (16, 1, 32768), (64, 1, 4096), (8, 512, 512), (8, 2048, 2048)]
HEADS, HEADS_KV, HEAD_DIM = 32, 8, 128
PAIRS = [("leftpad", "sdpa-mask"), ("leftpad", "lengths")]


def plan(shapes=SHAPES) -> list[dict]:
    """One dict per shape: batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim."""
    return [dict(batch=b, seqlen_q=nq, seqlen_k=nk, heads=HEADS, heads_kv=HEADS_KV, head_dim=HEAD_DIM)
            for b, nq, nk in shapes]


def entries(shape: dict, seed: int = 0) -> dict:
    """The shape's inputs and entry callables (on the GPU), each checked against float64 over the windows."""
    import torch
    import torch.nn.functional as F

    import fa_variants
    from fa_variants.reference import check_against_reference

    g = torch.Generator().manual_seed(seed)
    b, nq, nk = shape["batch"], shape["seqlen_q"], shape["seqlen_k"]
    pads = torch.randint(0, nk // 2, (b,), generator=g)
    q = torch.randn(b, nq, HEADS, HEAD_DIM, generator=g).to("cuda", torch.bfloat16)
    k, v = (torch.randn(b, nk, HEADS_KV, HEAD_DIM, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    starts = pads.to(torch.int32).cuda()
    ends = torch.full_like(starts, nk)
    moved = [torch.stack([t[i].roll(-int(pads[i]), 0) for i in range(b)]) for t in (k, v)]  # windows at the front
    counts = ends - starts
    rows, keys = torch.arange(nq, device="cuda")[:, None] + nk - nq, torch.arange(nk, device="cuda")
    mask = torch.stack([(keys >= p) & (keys <= rows) for p in pads.tolist()])[:, None]
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
    fns = {
        "leftpad": lambda: fa_variants.attention(q, k, v, causal=True, seqlens_k=ends, leftpad_k=starts),
        "lengths": lambda: fa_variants.attention(q, *moved, causal=True, seqlens_k=counts),
        "sdpa-mask": lambda: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True),
    }
    checks = {"leftpad": check_against_reference(fns["leftpad"](), q, k, v, True, seqlens_k=ends, leftpad_k=starts),
              "lengths": check_against_reference(fns["lengths"](), q, *moved, True, seqlens_k=counts)}
    return dict(fns=fns, checks={n: str(c) for n, c in checks.items()}, ok=all(c.ok for c in checks.values()))


def main(argv=None) -> int:
    return paired_main(argv, __doc__, plan(), entries, PAIRS, "leftpad.json",
                       lambda s: f"B {s['batch']} Nq {s['seqlen_q']} Nk {s['seqlen_k']}")


def paired_main(argv, doc: str, shapes: list[dict], make_entries, pairs: list[tuple[str, str]], json_name: str,
                label) -> int:
    """The command line of this script and of scripts/rightpad_ab.py: --plan prints ``shapes``; else each shape's
    ``make_entries(shape)`` (dict with fns, checks, ok and what else to keep) timed by the paired protocol against
    "sdpa-mask", one line per shape (``label(shape)``, the checks, ``pairs``' ratios), --out DIR/``json_name``.
    Exit status 1 where a check failed."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--plan", action="store_true", help="print the shapes and exit (no GPU needed)")
    parser.add_argument("--out", type=Path, help=f"folder for {json_name}")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--burst-ms", type=float, default=25.0)
    parser.add_argument("--warmup-ms", type=float, default=1000.0)
    a = parser.parse_args(argv)
    if a.plan:
        for s in shapes:
            print(json.dumps(s))
        return 0
    import torch

    from fa_variants.bench import paired
    from fa_variants.bench.runtime import GraphBurstTimer

    rows = []
    for shape in shapes:
        made = make_entries(shape)
        timer = GraphBurstTimer(escape_check=False)
        res = paired.paired_ab([paired.Entry(n, f) for n, f in made["fns"].items()], "sdpa-mask", timer,
                               rounds=a.rounds, cycles=a.cycles, burst_ms=a.burst_ms, warmup_ms=a.warmup_ms)
        row = dict(shape=shape, gpu=torch.cuda.get_device_name(), **{k: v for k, v in made.items() if k != "fns"},
                   ms={n: sorted(res.times(n))[len(res.times(n)) // 2] for n in made["fns"]},
                   ratios={f"{x}/{y}": dataclasses.asdict(res.ratio(x, y)) for x, y in pairs},
                   clocks={n: res.clocks(n) for n in made["fns"]}, how=res.how)
        rows.append(row)
        print(f"{label(shape)}: checks {'ok' if made['ok'] else made['checks']}; "
              + "; ".join(paired.report_lines(res, pairs)), flush=True)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / json_name).write_text(json.dumps(rows, indent=1, default=str))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
