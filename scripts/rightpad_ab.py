"""A causal batch padded on the right (a padded training batch: queries and keys alike), forward: our one launch
with seqlens_q beside SDPA with the mask, beside the calls on slices it replaces, and beside the padded batch's
plain causal call (every token computed: what skipping the padding saves).

    python3 scripts/rightpad_ab.py --out $OUT/rightpad      # ~1-2 min on an H100 / H200
    python3 scripts/rightpad_ab.py --plan                   # the shapes (no GPU needed)

Shapes (`SHAPES`): bf16, 32 query heads on 8 KV heads, head_dim 128; B x N = 16k tokens padded (B 16 x N 1k, B 4 x
N 4k); sequence b's length drawn uniform in [N / 4, N] (a fixed seed), so nearly every window differs. Entries, each
checked against float64 attention first (the project's rule; the padding rows see the whole sequence, as SDPA's):

* ``one-call``   ``fa_variants.attention(q, k, v, causal=True, seqlens_k=L, seqlens_q=L)``: fa3 on sm90, fa2 on sm80,
                 the kernel reading each sequence's query count (``Sm90Config.seqlens_q``, session 55);
* ``slices``     before session 55: each sequence's causal rows [0, L) and padding rows [L, N) as two calls on its
                 keys k[b, :L] (``windowed.attention`` took two calls per distinct window);
* ``padded``     ``fa_variants.attention(q, k, v, causal=True)``: the padded batch as if nothing were padded (a floor on
                 what the per-sequence windows cost over no masking, a ceiling on the work);
* ``sdpa-mask``  ``torch.nn.functional.scaled_dot_product_attention`` with the boolean mask (PyTorch's choice).

Timing: ``fa_variants.bench.paired`` (CUDA-graph bursts: no host time; --rounds rounds of --cycles cycles, order
rotated and reversed, an A/A control of ``sdpa-mask``). Printed per shape: one-call / sdpa-mask, one-call / slices and
one-call / padded (> 1: one-call faster) with intervals and verdicts, and the SM clock per entry; --out
DIR/rightpad.json keeps everything. No pass or fail: a measurement (bench/NOTES.md carries the prediction).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fa_variants, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))
import leftpad_ab  # noqa: E402  (scripts/leftpad_ab.py: the command line and the timing loop)

#: (batch, seqlen): B x N = 16k padded tokens
SHAPES = [(16, 1024), (4, 4096)]
HEADS, HEADS_KV, HEAD_DIM = 32, 8, 128
PAIRS = [("one-call", "sdpa-mask"), ("one-call", "slices"), ("one-call", "padded")]


def plan(shapes=SHAPES) -> list[dict]:
    """One dict per shape: batch, seqlen, heads, heads_kv, head_dim."""
    return [dict(batch=b, seqlen=n, heads=HEADS, heads_kv=HEADS_KV, head_dim=HEAD_DIM) for b, n in shapes]


def entries(shape: dict, seed: int = 0) -> dict:
    """The shape's inputs and entry callables (on the GPU), the two of ours checked against float64."""
    import torch
    import torch.nn.functional as F

    import fa_variants
    from fa_variants.reference import check_against_reference

    g = torch.Generator().manual_seed(seed)
    b, n = shape["batch"], shape["seqlen"]
    lengths = torch.randint(n // 4, n + 1, (b,), generator=g)
    q = torch.randn(b, n, HEADS, HEAD_DIM, generator=g).to("cuda", torch.bfloat16)
    k, v = (torch.randn(b, n, HEADS_KV, HEAD_DIM, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    counts = lengths.to(torch.int32).cuda()
    rows, keys = torch.arange(n, device="cuda")[:, None], torch.arange(n, device="cuda")
    mask = torch.stack([(keys < m) & (keys <= rows) for m in lengths.tolist()])[:, None]
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))

    def slices():
        outs = []
        for i, m in enumerate(lengths.tolist()):
            kk, vv = k[i:i + 1, :m], v[i:i + 1, :m]
            parts = [fa_variants.attention(q[i:i + 1, :m], kk, vv, causal=True)]
            if m < n:
                parts.append(fa_variants.attention(q[i:i + 1, m:], kk, vv))
            outs.append(torch.cat(parts, 1))
        return torch.cat(outs)

    fns = {
        "one-call": lambda: fa_variants.attention(q, k, v, causal=True, seqlens_k=counts, seqlens_q=counts),
        "slices": slices,
        "padded": lambda: fa_variants.attention(q, k, v, causal=True),
        "sdpa-mask": lambda: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True),
    }
    checks = {name: check_against_reference(fns[name](), q, k, v, True, seqlens_k=counts, seqlens_q=counts)
              for name in ("one-call", "slices")}
    return dict(fns=fns, checks={name: str(c) for name, c in checks.items()}, ok=all(c.ok for c in checks.values()),
                lengths=lengths.tolist())


def main(argv=None) -> int:
    return leftpad_ab.paired_main(argv, __doc__, plan(), entries, PAIRS, "rightpad.json",
                                  lambda s: f"B {s['batch']} N {s['seqlen']}")


if __name__ == "__main__":
    sys.exit(main())
