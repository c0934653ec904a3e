"""How much a training step's attention costs with the kernels' PyTorch backward: forward + backward, ours against SDPA.

    python3 scripts/backward_time.py --out $OUT/backward      # ~1-2 min on an H100 / H200
    python3 scripts/backward_time.py --plan                   # the shapes and entries (no GPU needed)
    python3 scripts/backward_time.py --padded --pytorch --out $OUT/padded   # keys padded on the right (below)

The kernel backends have forward kernels only; a call whose inputs require grad gets PyTorch's backward
(``integrations.backward``: a fused one where it applies, else ``reference.run_backward``, float32 PyTorch, query
rows in chunks). This times, per shape (bf16, B x N = 16k, H x D = 2048, GQA
none), one training step's attention: the forward with inputs that require grad and ``autograd.grad`` of it,
synchronised, for

* ``ours``      ``fa_variants.attention`` (auto: fa3 on sm90, fa2 on sm80) + its PyTorch backward (with
                ``--pytorch`` only: 12-35x SDPA's step in sessions 42-44, it took most of the run);
* ``ours-flashbwd``  the same with ``FA_VARIANTS_BACKWARD=flash``: PyTorch's FlashAttention-2 backward kernel on our
                forward's O and LSE (``integrations.backward.flash_backward``);
* ``ours-sdpabwd``  the same with ``FA_VARIANTS_BACKWARD=sdpa``: the backward recomputes the forward with SDPA and
                takes SDPA's fused backward (``integrations.backward.sdpa_backward``);
* ``ours-cudnnbwd``  the same with ``FA_VARIANTS_BACKWARD=cudnn``: cuDNN's fused backward on our forward's O and
                LSE (``integrations.backward.cudnn_backward``; the flash kernel where cuDNN does not apply);
* ``ours-cudnn128``  the same with ``integrations.backward.CUDNN_WIDE`` off (the default until session 45, timed
                as ``ours-cudnnwide`` against it there): cuDNN's backward up to head_dim 128 only, the flash kernel's
                above; every other entry runs the module's own CUDNN_WIDE (on since session 45);
* ``sdpa``      ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's choice: flash / cuDNN) + its
                fused backward;
* ``ours-fwd``  our forward alone under ``torch.no_grad()`` (what the backward adds is ours - ours-fwd).

``--padded``: an encoder's batch with keys padded on the right (non-causal, `PADDED_SHAPES`; sequence b of B keeps
its first N/2 + (N/2) b / (B-1) keys, so every length differs): ours with ``seqlens_k`` (each fused mode runs
length by length, ``integrations.backward._backward_by_length``, since session 53; ``ours``, the PyTorch backward,
was the only one before), sdpa with the boolean key-padding mask as attn_mask (PyTorch's choice for a masked call).

Protocol: one warm-up step of each entry (compiles, allocator), then ``--rounds`` rounds in an order rotated by
the round; an entry's round time is the median of ``--steps`` steps (CUDA events around each, the host waiting for
each: a step's host work before its first kernel counts), and its queued time the mean of ``--steps`` steps run back
to back between two events (the host's work overlapping the GPU's, as in a training loop that does not wait); the
ratios of ours, ours-flashbwd, ours-sdpabwd and ours-cudnnbwd to sdpa are taken per round, each timing, and their
medians reported with the ranges; SM clock and power (NVML) are read after each entry's steps. No pass or fail: a
measurement (bench/NOTES.md carries the prediction and the outcome).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ENTRIES = ("ours", "ours-flashbwd", "ours-sdpabwd", "ours-cudnnbwd", "ours-cudnn128", "sdpa", "ours-fwd")
MODES = {"ours": "pytorch", "ours-flashbwd": "flash", "ours-sdpabwd": "sdpa",  # FA_VARIANTS_BACKWARD
         "ours-cudnnbwd": "cudnn", "ours-cudnn128": "cudnn"}
#: (head_dim, seqlen, causal); at head_dim 256 cuDNN's backward applies only with CUDNN_WIDE (ours-cudnnbwd;
#: ours-cudnn128 = ours-flashbwd there), below 256 ours-cudnn128 = ours-cudnnbwd
SHAPES = [(64, 1024, False), (64, 4096, False), (128, 1024, False), (128, 4096, False), (128, 4096, True),
          (128, 16384, True), (256, 4096, False), (256, 4096, True)]
#: ``--padded``'s shapes (head_dim, seqlen, causal): keys padded on the right, non-causal (an encoder's batch)
PADDED_SHAPES = [(64, 1024, False), (128, 1024, False), (128, 4096, False)]


def padded_lengths(batch: int, seqlen: int) -> list[int]:
    """``--padded``'s key lengths: seqlen / 2 up to seqlen, spread evenly over the batch (all seqlen for one)."""
    return [seqlen - (seqlen // 2) * (batch - 1 - b) // max(1, batch - 1) for b in range(batch)]


def shape_dims(head_dim: int, seqlen: int) -> tuple[int, int]:
    """(batch, heads) with B x N = 16k tokens and H x D = 2048."""
    return max(1, 16384 // seqlen), 2048 // head_dim


def step_fn(entry: str, q, k, v, causal: bool, wide: bool, lengths=None):
    """One timed step of ``entry`` on (B, N, H, D) inputs; ``lengths`` (int32 on q's device, or None): each
    sequence's keys (ours: seqlens_k; sdpa: the boolean key-padding mask)."""
    import torch
    import torch.nn.functional as F

    import fa_variants

    grad = torch.randn_like(q)
    if entry == "ours-fwd":
        def step():
            with torch.no_grad():
                fa_variants.attention(q, k, v, causal=causal, seqlens_k=lengths)
        return step
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    mask = None if lengths is None else \
        (torch.arange(k.shape[1], device=k.device) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, N)
    if entry.startswith("ours"):
        forward = lambda: fa_variants.attention(*leaves, causal=causal, seqlens_k=lengths)  # noqa: E731
    else:
        forward = lambda: F.scaled_dot_product_attention(  # noqa: E731
            *(t.transpose(1, 2) for t in leaves), attn_mask=mask, is_causal=causal).transpose(1, 2)
    mode = MODES.get(entry, "pytorch")
    from fa_variants.integrations import backward

    def step():
        os.environ["FA_VARIANTS_BACKWARD"] = mode  # read at the forward (what it keeps) and the backward
        backward.CUDNN_WIDE = wide and entry != "ours-cudnn128"  # the module's default but in that entry
        return torch.autograd.grad(forward(), leaves, grad)
    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="folder for backward.json")
    parser.add_argument("--plan", action="store_true", help="print the shapes and entries, run nothing")
    parser.add_argument("--pytorch", action="store_true", help="time the PyTorch backward (entry ours) too")
    parser.add_argument("--padded", action="store_true", help="keys padded on the right: seqlens_k / a key mask")
    args = parser.parse_args(argv)
    entries = tuple(e for e in ENTRIES if (args.pytorch or e != "ours") and not (args.padded and e == "ours-cudnn128"))
    modes = [e for e in MODES if e in entries]
    shapes = PADDED_SHAPES if args.padded else SHAPES
    if args.plan:
        for head_dim, seqlen, causal in shapes:
            batch, heads = shape_dims(head_dim, seqlen)
            print(f"D {head_dim} N {seqlen} B {batch} H {heads} {'causal' if causal else 'full'}: {', '.join(entries)}")
        return 0
    import warnings

    import torch

    from fa_variants import dispatch
    from fa_variants.bench.runtime import NvmlClock, event_ms

    from fa_variants.integrations import backward

    warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
    wide = backward.CUDNN_WIDE  # the default, read before any step sets it
    clock = NvmlClock()
    rows = []
    for head_dim, seqlen, causal in shapes:
        batch, heads = shape_dims(head_dim, seqlen)
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        lengths = torch.tensor(padded_lengths(batch, seqlen), dtype=torch.int32, device="cuda") if args.padded else None
        steps = {e: step_fn(e, q, k, v, causal, wide, lengths) for e in entries}
        for step in steps.values():
            step()
        times, queued = {e: [] for e in entries}, {e: [] for e in entries}
        clocks = []
        for r in range(args.rounds):
            order = entries[r % len(entries):] + entries[:r % len(entries)]
            for e in order:
                step = steps[e]
                times[e].append(statistics.median(event_ms(step) for _ in range(args.steps)))
                queued[e].append(event_ms(lambda: [step() for _ in range(args.steps)]) / args.steps)
                clocks.append(clock.read())
        over = {e: [o / s for o, s in zip(times[e], times["sdpa"])] for e in modes}
        over_q = {e: [o / s for o, s in zip(queued[e], queued["sdpa"])] for e in modes}
        row = dict(head_dim=head_dim, seqlen=seqlen, batch=batch, heads=heads, causal=causal,
                   seqlens_k=None if lengths is None else lengths.tolist(),
                   ms={e: statistics.median(t) for e, t in times.items()},
                   over_sdpa={e: statistics.median(r) for e, r in over.items()},
                   over_sdpa_range={e: [min(r), max(r)] for e, r in over.items()},
                   queued_ms={e: statistics.median(t) for e, t in queued.items()},
                   queued_over_sdpa={e: statistics.median(r) for e, r in over_q.items()},
                   queued_over_sdpa_range={e: [min(r), max(r)] for e, r in over_q.items()},
                   sm_mhz=[min(c[0] for c in clocks), max(c[0] for c in clocks)],
                   watts=[min(c[1] for c in clocks), max(c[1] for c in clocks)])
        rows.append(row)
        ms = row["ms"]
        ratios = "; ".join(f"{e} {ms[e]:.2f} ms, / sdpa {row['over_sdpa'][e]:.2f} ({min(over[e]):.2f}-"
                           f"{max(over[e]):.2f}), queued {row['queued_over_sdpa'][e]:.2f} ({min(over_q[e]):.2f}-"
                           f"{max(over_q[e]):.2f})" for e in modes)
        print(f"D {head_dim} N {seqlen} {'causal' if causal else 'full'}: sdpa {ms['sdpa']:.2f} ms, ours-fwd "
              f"{ms['ours-fwd']:.2f} ms; {ratios}; SM {row['sm_mhz'][0]:.0f}-{row['sm_mhz'][1]:.0f} MHz", flush=True)
        del q, k, v, steps
        torch.cuda.empty_cache()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "backward.json").write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
