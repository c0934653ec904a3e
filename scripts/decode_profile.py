"""Issue 13: per-kernel GPU times of a short-Nk decode call (ours vs SDPA), to check scripts/decode_model.py's split
of the time into the split kernel, the merge kernel and the gaps between launches.

    python3 scripts/decode_profile.py [--out DIR]        # H200, ~15 s with the kernels in the disk cache

Shapes: B 1, seqlen_q 1, 32:8, head_dim 64 / 128, Nk 1k / 4k (bf16). Entries: ``auto`` (the shipped split count),
``min1`` (one-tile splits: ``common.split.num_splits_heuristic(min_tiles=1)``, forced, no PDL), ``min1-warp`` (and the
merge kernel with LSEs in registers, ``common.split_combine.MERGE_WARP``), ``sdpa``. Each entry's
``CALLS`` back-to-back calls are captured in one CUDA graph and the replay is profiled (``torch.profiler``, CUDA
activity). Per entry: the kernels of one call (name, mean us), their sum, and the span per call (first kernel start
to last kernel end of the replay, / CALLS): span - sum = the time between kernels (launch gaps, ramps).
Last lines: one "PROFILE" line per (shape, entry).

``--s12`` (scripts/decode64_gpu.sh): D 64 32:8 B 1 at Nk 32k and 4k (16 splits), entries ``auto``, ``fused1``
(FA_VARIANTS_FUSED_MERGE=decode: the merge inside the split kernel) and ``sdpa``: the fused tail against the merge
kernel and its gap.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [(d, 32, 8, 1, nk) for d in (128, 64) for nk in (1024, 4096)]
S12_SHAPES = [(64, 32, 8, 1, 32768), (64, 32, 8, 1, 4096)]
CALLS = 20


def short(name: str) -> str:
    return name.split("(")[0].split("<")[0][-48:]


def profile_entry(fn, torch) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from fa_variants.bench.decode import cuda_graph_of

    fn()
    torch.cuda.synchronize()
    graph = cuda_graph_of(fn, CALLS)
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()
                      and "memset" not in e.name.lower()), key=lambda e: e.time_range.start)
    graph_empty = not kernels
    if not kernels:  # the profiler saw nothing inside the graph: eager calls (gaps then include host launches)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                fn()
            torch.cuda.synchronize()
        kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()
                          and "memset" not in e.name.lower()), key=lambda e: e.time_range.start)
        if not kernels:
            return dict(error="no CUDA kernel events")
    per_name: dict[str, list] = {}
    for e in kernels:
        per_name.setdefault(short(e.name), []).append(e.time_range.end - e.time_range.start)
    span = (kernels[-1].time_range.end - kernels[0].time_range.start) / CALLS
    mean = {n: statistics.mean(t) for n, t in per_name.items()}
    per_call = {n: len(t) / CALLS for n, t in per_name.items()}
    busy = sum(mean[n] * per_call[n] for n in mean)
    return dict(kernels={n: round(mean[n], 2) for n in mean}, per_call=per_call, busy_us=busy, span_us=span,
                gap_us=span - busy, eager=graph_empty)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(os.environ["OUT"], "decode_profile") if os.environ.get("OUT")
                   else "results/decode_profile")
    p.add_argument("--s12", action="store_true", help="S12_SHAPES with auto, fused1 and sdpa")
    a = p.parse_args()
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("decode_profile: no CUDA GPU here")
        return 2
    import fa_variants
    from fa_variants.common import split, split_combine
    from fa_variants.hopper import fa3

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results, lines = [], []
    for d, h, hkv, b, nk in (S12_SHAPES if a.s12 else SHAPES):
        q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, nk, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        cfg = fa3._PACKED_SPLIT_CONFIGS[d]  # auto's kernel (count per call), its count forced to min1's
        n_min1 = split.num_splits_heuristic(hkv * b, -(-nk // cfg.tile_n), sms, min_tiles=1)

        def min1(cfg=cfg, n=n_min1, q=q, k=k, v=v, d=d, warp=False):
            saved, fa3._auto_splits = fa3._auto_splits, lambda *args: n
            saved_warp, split_combine.MERGE_WARP = split_combine.MERGE_WARP, warp
            try:
                return fa3.run(q, k, v, causal=True, softmax_scale=d ** -0.5, config=cfg)[0]
            finally:
                fa3._auto_splits, split_combine.MERGE_WARP = saved, saved_warp

        def fused1(q=q, k=k, v=v):
            saved, fa3.FUSED_MERGE = fa3.FUSED_MERGE, "decode"
            try:
                return fa_variants.attention(q, k, v, causal=True)
            finally:
                fa3.FUSED_MERGE = saved

        entries = {
            "auto": lambda: fa_variants.attention(q, k, v, causal=True),
            "min1": min1,
            "min1-warp": lambda: min1(warp=True),
            "fused1": fused1,
            "sdpa": lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           enable_gqa=True),
        }
        for name in (("min1", "min1-warp") if a.s12 else ("fused1",)):
            del entries[name]
        splits = {"auto": fa3.auto_num_splits(q, k, True), "min1": n_min1, "min1-warp": n_min1,
                  "fused1": fa3.auto_num_splits(q, k, True), "sdpa": "-"}
        for name, fn in entries.items():
            try:
                r = profile_entry(fn, torch)
            except Exception as exc:  # noqa: BLE001 - recorded, the plan goes on
                r = dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}")
            r.update(shape=(d, h, hkv, b, nk), entry=name, splits=splits[name])
            results.append(r)
            label = f"D{d} {h}:{hkv} B{b} Nk{nk} {name} ({splits[name]} splits)"
            if "error" in r:
                lines.append(f"PROFILE {label}: {r['error']}")
                continue
            ks = ", ".join(f"{n} {t:.2f}" for n, t in r["kernels"].items())
            lines.append(f"PROFILE {label}{' EAGER' if r['eager'] else ''}: span {r['span_us']:.2f} us/call = kernels "
                         f"{r['busy_us']:.2f} + gaps {r['gap_us']:.2f} | {ks}")
        del q, k, v
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_profile.json").write_text(json.dumps(results, indent=1, default=str))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
