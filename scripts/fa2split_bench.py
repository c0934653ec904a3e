"""Issue 13 for fa2 (sm80 GPUs): decode GPU time of fa2 with split-KV (`auto`'s count) vs fa2 unsplit vs SDPA.

    python3 scripts/fa2split_bench.py --out $OUT/fa2split     # the default plan, ~1 min on an H200
    python3 scripts/fa2split_bench.py --plan                  # the shapes and split counts (no GPU needed)

Shapes: batch 1 / 8 / 64 x seqlen_q 1 / 4 / 16 x seqlen_k 1k / 4k / 32k, GQA 32:8, head_dim 128, bf16, causal
(bottom-right; SDPA runs is_causal=False as in ``fa_variants.bench.decode``: its causal is top-left, and at
seqlen_q = 1 the two masks agree; at 4 / 16 the causal rows skip at most 15 of seqlen_k keys). Entries:

* ``split``   ``fa_variants.attention(backend="fa2")``: split-KV where ``ampere.fa2``'s heuristic splits;
* ``nosplit`` ``ampere.fa2.run`` with the default tiles, num_splits = 1 (one CTA per (query tile, head, batch));
* ``pack``    (seqlen_q = 1) ``attention(backend="fa2", pack_gqa=True)``: the 4 query heads of a KV head in one
              tile, split by the heuristic (off in `auto` until measured: FA_VARIANTS_FA2_PACK_GQA=1);
* ``sdpa``    ``torch.nn.functional.scaled_dot_product_attention`` (its own backend choice, enable_gqa);
* ``narrow``  (seqlen_q > 1 where `auto` does not split) ``ampere.fa2.run`` with ``fa2.narrow_config``: the split
              kernel's 64 x 64 tiles, unsplit (what FA_VARIANTS_FA2_NARROW_DECODE=1 makes `auto` run there);
              its own table after the summary (narrow / SDPA, narrow / split).

``--batch / --nq / --nk`` take a subset of the shapes.

Each output is compared with SDPA's once (max |difference| < 0.02, else the row is marked BAD). Timing is
``scripts/decode_ab.py``'s (``gpu_us``: calls captured in one CUDA graph by ``bench.decode.cuda_graph_of``,
replayed ``--reps`` times, median), over ``--rounds`` rounds with the entry order rotated. The last lines
printed are the summary: per shape GPU us of each entry, the split count, split / SDPA and nosplit / split;
then the geometric means. Logs: fa2split_bench.json / .md under --out.
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's fa_variants, run from anywhere

BATCH = (1, 8, 64)
NQ = (1, 4, 16)
NK = (1024, 4096, 32768)
HEADS, HEADS_KV, HEAD_DIM = 32, 8, 128
ENTRIES = ("sdpa", "nosplit", "split")  # every shape; "pack" at seqlen_q = 1 only
PLAN_GPU = ("sm_90a", 132)  # --plan without a GPU: an H200


def shapes(batch=BATCH, nq=NQ, nk=NK) -> list[tuple[int, int, int]]:
    """(batch, seqlen_q, seqlen_k), the largest K/V last."""
    return [(b, q, k) for k, b, q in itertools.product(nk, batch, nq)]


def planned_splits(shape, arch: str, num_sms: int, pack: bool = False) -> int:
    """The split count fa2's `auto` gives a shape on a GPU (``ampere.fa2.splits_for_shape``), without tensors;
    ``pack``: with packed GQA (seqlen_q = 1: group rows of num_heads_kv heads)."""
    from fa_variants.ampere import fa2

    b, nq, nk = shape
    config = fa2.split_config(arch, HEAD_DIM, 0, pack)
    rows, heads = (nq * HEADS // HEADS_KV, HEADS_KV) if pack else (nq, HEADS)
    return fa2.splits_for_shape(config, b, rows, heads, nk, HEAD_DIM, arch, num_sms)


def _decode_ab():
    spec = importlib.util.spec_from_file_location("decode_ab", ROOT / "scripts" / "decode_ab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(a) -> int:
    import torch

    from fa_variants.common import cache, interop

    arch = interop.device_arch(0)
    results, todo = [], shapes(a.batch, a.nq, a.nk)
    try:
        for i, shape in enumerate(todo):
            results.append(measure(a, i, shape, arch, len(todo)))
    except KeyboardInterrupt:  # the GPU script's time limit (timeout -s INT): summarise what was measured
        print(f"interrupted after {len(results)}/{len(todo)} shapes", flush=True)
    text = summary(results) + narrow_summary(results)
    print(f"kernels this process: {cache.cache_info()}")
    print(text)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(gpu=torch.cuda.get_device_name(), arch=arch, torch=torch.__version__, rounds=a.rounds, reps=a.reps)
    (out / "fa2split_bench.json").write_text(json.dumps(dict(meta=meta, results=results), indent=1, default=str))
    (out / "fa2split_bench.md").write_text(text + "\n")
    return 0


def measure(a, i: int, shape, arch: str, total: int) -> dict:
    """One shape: each entry checked once on a fresh Q, then timed (``decode_ab.gpu_us``) in rotated rounds."""
    import torch
    import torch.nn.functional as F

    import fa_variants
    from fa_variants.ampere import fa2

    gpu_us = _decode_ab().gpu_us
    b, nq, nk = shape
    g = torch.Generator(device="cuda").manual_seed(i)
    q = torch.randn(b, nq, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, nk, HEADS_KV, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    scale = HEAD_DIM ** -0.5
    nosplit = fa2.default_config(arch, HEAD_DIM, True)  # num_splits = 1: one CTA per (query tile, head, batch)
    fns = {
        "sdpa": lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                       enable_gqa=True).transpose(1, 2),
        "nosplit": lambda: fa2.run(q, k, v, causal=True, softmax_scale=scale, config=nosplit)[0],
        "split": lambda: fa_variants.attention(q, k, v, causal=True, backend="fa2"),
    }
    res = dict(shape=shape, splits=fa2.auto_num_splits(q, k, True), us={}, err={})
    if nq == 1:
        fns["pack"] = lambda: fa_variants.attention(q, k, v, causal=True, backend="fa2", pack_gqa=True)
        res["pack_splits"] = fa2.num_splits_for(fa2.decode_config(q, k, True, pack_gqa=True), q, k)
    elif res["splits"] == 1:
        narrow = fa2.narrow_config(arch, HEAD_DIM)
        fns["narrow"] = lambda: fa2.run(q, k, v, causal=True, softmax_scale=scale, config=narrow)[0]
    for name, fn in fns.items():
        try:
            fn()
            q.normal_(generator=g)  # a fresh Q: a stale result would show
            if nq == 1 or name == "sdpa":  # SDPA's mask is ours at seqlen_q = 1
                res["err"][name] = (fn().float() - fns["sdpa"]().float()).abs().max().item()
            else:
                res["err"][name] = _causal_err(fn(), q, k, v, scale)
        except Exception as exc:  # noqa: BLE001 - recorded, the plan goes on
            res["err"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
    ok = [n for n in fns if isinstance(res["err"][n], float)]
    per_round = {n: [] for n in ok}
    for rnd in range(a.rounds):
        for name in ok[rnd % len(ok):] + ok[:rnd % len(ok)]:
            per_round[name].append(gpu_us(fns[name], a.reps, torch))
    res["us"] = us = {n: statistics.median(t) for n, t in per_round.items() if t}
    print(f"[{i + 1}/{total}] B{b} Nq{nq} Nk{nk}: sdpa {us.get('sdpa', math.nan):.1f} nosplit "
          f"{us.get('nosplit', math.nan):.1f} split {us.get('split', math.nan):.1f} us ({res['splits']} splits) "
          f"pack {us.get('pack', math.nan):.1f} narrow {us.get('narrow', math.nan):.1f}", flush=True)
    del q, k, v, fns
    torch.cuda.empty_cache()
    return res


def _causal_err(out, q, k, v, scale) -> float:
    """max |out - bottom-right causal attention| (float32 torch; seqlen_q > 1, where SDPA's mask differs)."""
    import torch

    g = q.shape[2] // k.shape[2]
    kk, vv = (t.float().repeat_interleave(g, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk) * scale
    nq, nk = q.shape[1], k.shape[1]
    hidden = torch.arange(nk, device=q.device)[None, :] > torch.arange(nq, device=q.device)[:, None] + nk - nq
    p = torch.softmax(s.masked_fill(hidden, -math.inf), dim=-1)
    return (out.float() - torch.einsum("bhqk,bkhd->bqhd", p, vv)).abs().max().item()


def summary(results) -> str:
    """Markdown: per shape GPU us per entry, split count, split / SDPA, nosplit / split, pack / SDPA; geomeans at
    the end (each over the shapes where its entries ran and matched)."""
    lines = ["| shape | sdpa us | nosplit us | split us (splits) | pack us (splits) | split/sdpa | nosplit/split | "
             "pack/sdpa |", "|---|---|---|---|---|---|---|---|"]
    logs = {"split/sdpa": [], "nosplit/split": [], "nosplit/sdpa": [], "pack/sdpa": []}
    wins = pack_wins = 0
    for r in results:
        b, nq, nk = r["shape"]
        us, err = r["us"], r["err"]
        bad = [n for n in ENTRIES if not isinstance(err.get(n), float) or err[n] > 0.02]
        cell = {n: ("BAD" if n in bad else f"{us[n]:.1f}") if n in us else "ERR" for n in ENTRIES}
        ratio = {}
        if not bad and all(n in us for n in ENTRIES):
            ratio = {"split/sdpa": us["split"] / us["sdpa"], "nosplit/split": us["nosplit"] / us["split"],
                     "nosplit/sdpa": us["nosplit"] / us["sdpa"]}
            for key, x in ratio.items():
                logs[key].append(math.log(x))
            wins += ratio["split/sdpa"] <= 1.0
        pack = "-"
        if "pack" in err:
            pack_ok = isinstance(err["pack"], float) and err["pack"] <= 0.02 and "pack" in us
            pack = f"{us['pack']:.1f} ({r.get('pack_splits', '?')})" if pack_ok else "BAD" if "pack" in us else "ERR"
            if pack_ok and "sdpa" in us and "sdpa" not in bad:
                ratio["pack/sdpa"] = us["pack"] / us["sdpa"]
                logs["pack/sdpa"].append(math.log(ratio["pack/sdpa"]))
                pack_wins += ratio["pack/sdpa"] <= 1.0
        fmt = {key: f"{x:.2f}" for key, x in ratio.items()}
        lines.append(f"| B{b} Nq{nq} Nk{nk} | {cell['sdpa']} | {cell['nosplit']} | {cell['split']} ({r['splits']}) | "
                     f"{pack} | {fmt.get('split/sdpa', '-')} | {fmt.get('nosplit/split', '-')} | "
                     f"{fmt.get('pack/sdpa', '-')} |")
    lines.append("")
    n = len(logs["split/sdpa"])
    lines.append(f"fa2 decode, GQA {HEADS}:{HEADS_KV}, D{HEAD_DIM}, bf16, causal; GPU us per call (CUDA graphs); "
                 f"{n}/{len(results)} shapes timed and correct")
    for key, xs in logs.items():
        gm = math.exp(sum(xs) / len(xs)) if xs else math.nan
        lines.append(f"  geomean {key:14s} {gm:.3f}")
    lines.append(f"  split <= sdpa at {wins}/{n} shapes; pack <= sdpa at {pack_wins}/{len(logs['pack/sdpa'])}")
    return "\n".join(lines)


def narrow_summary(results) -> str:
    """Markdown for the ``narrow`` entries (none: ""): per shape GPU us of SDPA, `auto` (split) and narrow, the
    ratios narrow / SDPA and narrow / split, then their geomeans and the wins."""
    rows = [r for r in results if "narrow" in r["err"]]
    if not rows:
        return ""
    lines = ["", "fa2 narrow (64 x 64 tiles, unsplit; FA_VARIANTS_FA2_NARROW_DECODE=1) where `auto` does not split:",
             "| shape | sdpa us | split us | narrow us | narrow/sdpa | narrow/split |", "|---|---|---|---|---|---|"]
    logs, wins = {"narrow/sdpa": [], "narrow/split": []}, 0
    for r in rows:
        b, nq, nk = r["shape"]
        us, err = r["us"], r["err"]
        good = [n for n in ("sdpa", "split", "narrow") if isinstance(err.get(n), float) and err[n] <= 0.02 and n in us]
        if len(good) < 3:
            lines.append(f"| B{b} Nq{nq} Nk{nk} | " + " | ".join(
                f"{us[n]:.1f}" if n in good else "BAD" for n in ("sdpa", "split", "narrow")) + " | - | - |")
            continue
        x, y = us["narrow"] / us["sdpa"], us["narrow"] / us["split"]
        logs["narrow/sdpa"].append(math.log(x))
        logs["narrow/split"].append(math.log(y))
        wins += x <= 1.0
        lines.append(f"| B{b} Nq{nq} Nk{nk} | {us['sdpa']:.1f} | {us['split']:.1f} | {us['narrow']:.1f} | {x:.2f} | "
                     f"{y:.2f} |")
    for key, xs in logs.items():
        lines.append(f"  geomean {key:14s} {math.exp(sum(xs) / len(xs)) if xs else math.nan:.3f}")
    lines.append(f"  narrow <= sdpa at {wins}/{len(logs['narrow/sdpa'])}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--plan", action="store_true", help="print the shapes and split counts and exit (no GPU needed)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, nargs="+", default=list(BATCH))
    p.add_argument("--nq", type=int, nargs="+", default=list(NQ))
    p.add_argument("--nk", type=int, nargs="+", default=list(NK))
    p.add_argument("--reps", type=int, default=5, help="graph replays per timing (median)")
    p.add_argument("--out", default=os.path.join(os.environ["OUT"], "fa2split") if os.environ.get("OUT")
                   else "results/fa2split")
    a = p.parse_args()
    if a.plan:
        arch, num_sms = PLAN_GPU
        todo = shapes(a.batch, a.nq, a.nk)
        print(f"{len(todo)} shapes x {ENTRIES}; {a.rounds} rounds; split counts on {arch} with {num_sms} SMs:")
        for shape in todo:
            packed = f", packed {planned_splits(shape, arch, num_sms, True)}" if shape[1] == 1 else ""
            print(f"  B{shape[0]} Nq{shape[1]} Nk{shape[2]}: {planned_splits(shape, arch, num_sms)} splits{packed}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("fa2split_bench: no CUDA GPU here (--plan prints the plan)")
        return 2
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
