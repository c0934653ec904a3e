"""Context-parallel (ring) attention on several GPUs vs one GPU: correctness and speed (fa_variants.distributed).

    source .gpu/env.sh && python3 -m torch.distributed.run --standalone --nproc_per_node 2 scripts/cp_bench.py --out $OUT/cp

Every rank builds the same full inputs (B=1, H=16, D=128, bf16 by default; one seed), takes its zig-zag shard and
runs ``context_parallel_attention`` (backend fa3 by default); every number below is per (seqlen, causal).

Correctness: (1) max |ring - one GPU| where "one GPU" is ``fa_variants.attention`` on the whole sequence on the
rank's own GPU; (2) the project's tolerance rule on ``--check-rows`` random query rows of each rank against a
float64 reference of those rows: err(ring) <= 2 * err(PyTorch in bf16, same maths) + 1e-5, and the same for the
LSE (err(one GPU) is reported beside). A failed check makes the exit status 1.

Speed (CUDA events; before each repetition all ranks synchronise and meet at a barrier; a repetition's time is the
slowest rank's; medians over ``--reps`` repetitions, then medians over ``--rounds`` rounds whose order of the four
measurements is rotated round to round):
  one GPU   ``fa_variants.attention`` on the whole sequence, one GPU (each rank does it on its own GPU at once);
  ring      ``context_parallel_attention`` on the shards (transfers, merges and the shape check included);
  kernels   the same per-step attention calls the ring makes on this rank, back to back, without transfers or
            merges: the kernel alone (per step also timed one by one);
  kernels + merges  the ring's own calls (the own step cut into head and tail, as the ring launches it) and LSE
            merges, without any transfer or shape check (what the ring costs if communication is fully hidden);
  comm      the K/V transfers of the ring alone (world - 1 exchanges);
  shape check  the all-gather of shapes every call makes first;
  ring, check first  the same call with ``distributed.OVERLAP_START`` off (the order before it: shape check,
            first transfer posted, then the whole own step), for comparison in the same run;
  ring, high-priority NCCL  ``context_parallel_attention`` on a second NCCL group of the same ranks whose internal
            streams have high priority (its transfers get SMs ahead of queued attention CTAs), GPU only.
            Both variants are checked against the ring's result.
speed-up = one GPU / ring (targets: >= 1.8 non-causal, >= 1.7 causal at N >= 32k); overhead = ring / kernels,
i.e. time per step over the kernel alone (target <= 1.1: communication hidden); ring / (kernels + merges)
isolates the exposed communication from the merge cost. The first call of each
configuration (JIT compile, and torch.compile of the merge) is timed apart. ``--profile``: each case's ring (and
ring, check first) run under torch.profiler; per rank a table of where a call's time goes (host time from the
call's start to its first GPU kernel and to its first attention kernel, GPU time per kind of kernel, idle time
of the compute stream, host time in each of the ring's regions). Rank 0 writes cp_bench.json and cp_bench.md
under --out and ends with one summary line per case. Defaults: N = 32k, 64k, 128k, causal and not,
3 rounds of 5 repetitions: about a minute on two H200s.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import fa_variants
from fa_variants import distributed as cp
from fa_variants.bench.runtime import event_ms

TARGET_SPEEDUP = {False: 1.8, True: 1.7}
TARGET_OVERHEAD = 1.1
#: the ways of running the ring timed side by side (the table shows each against the targets)
RING_VARIANTS = ("ring", "ring, check first", "ring, high-priority NCCL")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", default="32768,65536,131072", help="whole-sequence lengths, comma-separated")
    ap.add_argument("--causal", default="both", choices=["both", "yes", "no"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-kv", type=int, default=None, help="default: --heads (no GQA)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: gloo and a small smoke run of this script itself (use --backend reference)")
    ap.add_argument("--backend", default="fa3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--check-rows", type=int, default=256, help="query rows per rank checked against float64")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--trace", default="first-causal", choices=["first-causal", "none"],
                    help="GPU only: a torch.profiler timeline of two ring calls (the first N, causal) per rank: "
                         "trace_rank{R}.json.gz under --out and its kernels printed (when each starts and ends)")
    ap.add_argument("--profile", action="store_true",
                    help="per case, --profile-calls ring calls (and as many with the check first) under "
                         "torch.profiler: "
                         "per-rank tables of kernel times and of the gaps before the first kernel (cp_bench.md, "
                         "profile section; one line per case and rank in the summary)")
    ap.add_argument("--profile-calls", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "cp")
    return ap.parse_args()


# ------------------------------------------------------------------------------------------ correctness

def rows_reference(q, k, v, positions, causal, scale, dtype):
    """Attention of the query rows at global ``positions`` over the whole sequence (self-attention, so the
    bottom-right causal mask is key <= position), in float64 or as PyTorch does it in ``dtype``
    (scale * Q rounded, S in dtype, softmax in float32, P rounded, P V in dtype). Returns (out, lse)."""
    group = q.shape[2] // k.shape[2]
    qs = q[:, positions].to(dtype)
    ks, vs = (t.to(dtype).repeat_interleave(group, 2) for t in (k, v))
    low = dtype != torch.float64
    s = torch.einsum("bqhd,bkhd->bhqk", qs * scale if low else qs, ks)
    s = s.float() if low else s * scale
    if causal:
        visible = torch.arange(k.shape[1], device=q.device)[None, :] <= positions[:, None]
        s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None])
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(dtype), vs)
    return out, lse.float()


def max_err(x, ref) -> float:
    return (x.double() - ref.double()).abs().max().item()


def check(args, q, k, v, causal, rank, world, ring_out, ring_lse, gen) -> dict:
    scale = 1.0 / math.sqrt(q.shape[-1])
    one_out, one_lse = fa_variants.attention(q, k, v, causal=causal, backend=args.backend, return_lse=True)
    mine = cp.zigzag_shard(torch.arange(q.shape[1], device=q.device), 0, rank, world)
    result = {"max_abs_ring_vs_one_gpu": max_err(ring_out, one_out[:, mine]),
              "max_abs_lse_ring_vs_one_gpu": max_err(ring_lse, one_lse[:, :, mine])}
    pick = torch.randperm(len(mine), generator=gen, device="cpu")[:args.check_rows].to(q.device)
    positions = mine[pick]
    exact, exact_lse = rows_reference(q, k, v, positions, causal, scale, torch.float64)
    same, same_lse = rows_reference(q, k, v, positions, causal, scale, q.dtype)
    errs = {"out": (max_err(ring_out[:, pick], exact), max_err(one_out[:, positions], exact), max_err(same, exact)),
            "lse": (max_err(ring_lse[:, :, pick], exact_lse), max_err(one_lse[:, :, positions], exact_lse),
                    max_err(same_lse, exact_lse))}
    for name, (ring, one, torch_same) in errs.items():
        bound = 2 * torch_same + 1e-5
        result[name] = {"err_ring": ring, "err_one_gpu": one, "err_torch_same_dtype": torch_same, "bound": bound,
                        "ok": math.isfinite(ring) and ring <= bound}
    return result


# ----------------------------------------------------------------------------------------------- timing

def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, reps: int, device) -> float:
    """Median over reps of the slowest rank's time of fn(), in ms (CUDA events on a GPU)."""
    times = []
    for _ in range(reps):
        sync(device)
        dist.barrier()
        if device.type == "cuda":
            times.append(event_ms(fn))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    t = torch.tensor(times, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return statistics.median(t.tolist())


def step_calls(q, k, v, causal, rank, world, backend):
    """The attention calls the ring makes on this rank, on K/V shards of the right length (one per step)."""
    seqlen = q.shape[1] * world
    sizes = cp._chunk_sizes(seqlen, 2 * world)
    calls = []
    for step in range(world):
        src = (rank - step) % world
        plan = cp._plan(rank, src, causal, "zigzag", sizes[rank], sizes[src])
        if plan is None:
            continue
        q_s, k_s, v_s = q[:, plan.rows], k[:, plan.keys], v[:, plan.keys]  # own K/V: same shapes as src's here
        calls.append((f"step {step}: {q_s.shape[1]} q x {k_s.shape[1]} k{' causal' if plan.causal else ''}",
                      plan.rows, lambda q_s=q_s, k_s=k_s, v_s=v_s, c=plan.causal: fa_variants.attention(
                          q_s, k_s, v_s, causal=c, backend=backend, return_lse=True)))
    return calls


class NoTransfer:
    """A ring transport that moves nothing: each step "receives" this rank's own K/V, cut (or, for uneven
    shards, padded by repetition) to the length the real ring would receive. For timing only."""

    def __init__(self, k, v):
        self.k, self.v = k, v

    def post(self, k, v, seqlen_in):
        return seqlen_in

    def wait(self, seqlen_in):
        def fit(t):
            return t[:, :seqlen_in] if seqlen_in <= t.shape[1] else torch.cat([t, t[:, :seqlen_in - t.shape[1]]], 1)
        return fit(self.k), fit(self.v)


def compute_only(q, k, v, causal, rank, world, backend):
    """The ring's own calls and merges on this rank (``distributed._ring_attention`` with the own step cut as
    the ring cuts it) without any transfer or shape check: own K/V of the same lengths."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    rows = cp._gather_rows(dist.group.WORLD, cp._shape_row(q, k, causal, "zigzag", scale), world)

    def run():
        pieces = cp._own_pieces(q.shape[1], k.shape[1], causal, "zigzag") if cp.OVERLAP_START else None
        early = None if pieces is None else (pieces, *cp._own_piece(q, k, v, pieces[0], causal, scale, backend))
        return cp._ring_attention(q, k, v, rows, None, rank, world, causal, "zigzag", scale, backend, early=early,
                                  ring=NoTransfer(k, v))
    return run


def own_step_pieces(q, k, v, causal, backend):
    """The head and tail calls the ring cuts its own step into (labels and calls, in launch order), for the
    per-step times."""
    pieces = cp._own_pieces(q.shape[1], k.shape[1], causal, "zigzag")
    if pieces is None:
        return []
    scale = 1.0 / math.sqrt(q.shape[-1])
    calls = []
    for piece in pieces:
        name = "head" if piece.rows[0] == 0 else "tail"
        keys = len(range(k.shape[1])[piece.keys])
        calls.append((f"own step {name}: {piece.rows[1] - piece.rows[0]} q x {keys} k{' causal' if causal else ''}",
                      lambda piece=piece: cp._own_piece(q, k, v, piece, causal, scale, backend)))
    return calls


def comm_only(k, v, rank, world, seqlen):
    """The ring's world - 1 K/V exchanges alone (each rank receives its left neighbour's shard length)."""
    sizes = cp._chunk_sizes(seqlen, 2 * world)
    lengths = [sizes[r] + sizes[2 * world - 1 - r] for r in range(world)]

    def run():
        ring = cp._Ring(dist.group.WORLD, rank, world, k.device)
        k_cur, v_cur = k, v
        for step in range(world - 1):
            k_cur, v_cur = ring.wait(ring.post(k_cur, v_cur, lengths[(rank - step - 1) % world]))
    return run


def high_priority_group(device):
    """The world's ranks in a second NCCL group whose internal streams have high priority (as with
    TORCH_NCCL_HIGH_PRIORITY=1): its transfers get SMs ahead of queued attention CTAs. On the CPU a plain second
    gloo group (no priorities there; it runs the same code for the smoke test)."""
    if device.type != "cuda":
        return dist.new_group(backend="gloo")
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = True
    return dist.new_group(backend="nccl", pg_options=options)


def timeline(fn, path: Path) -> list[str]:
    """Runs fn twice under torch.profiler (CUDA activity), writes the Chrome trace (gzip) to path, and returns
    the GPU kernels and memcpys of the second call as lines: start and end in ms from the call's first GPU
    event, stream, name. Shows whether a transfer overlaps the attention kernel or runs after it."""
    import gzip
    import tempfile

    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(2):
            sync(torch.device("cuda"))
            dist.barrier()
            with record_function(f"ring call {i}"):
                fn()
            sync(torch.device("cuda"))
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        trace = json.loads(Path(f"{tmp}/trace.json").read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    call = [e for e in events if e.get("name") == "ring call 1" and e.get("ph") == "X"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if call:  # GPU work launched during the second call: kernels after its CPU start
        gpu = [e for e in gpu if e["ts"] >= call[0]["ts"]]
    if not gpu:
        return ["(no GPU events recorded)"]
    t0 = min(e["ts"] for e in gpu)
    return [f"{(e['ts'] - t0) / 1e3:8.3f} .. {(e['ts'] + e['dur'] - t0) / 1e3:8.3f} ms  stream "
            f"{e.get('args', {}).get('stream', '?')}  {e['name'][:90]}" for e in sorted(gpu, key=lambda e: e["ts"])]


def _kind(event) -> str:
    """What a GPU event of a torch.profiler trace is: attention, nccl, merge, copy or other."""
    name = event["name"]
    if event.get("cat") != "kernel":
        return "copy/set"
    if name.startswith("nccl"):
        return "nccl"
    if "cutlass" in name or "flash" in name.lower() or "attention" in name.lower():
        return "attention"
    if name.startswith("triton_"):
        return "merge (triton)"
    return "other"


def _union_ms(intervals) -> float:
    total, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total / 1e3


def summarise_call(call, events) -> dict:
    """Where one profiled call's time went; times in ms from the call's host start (trace times are in us)."""
    t0, t1 = call["ts"], call["next_ts"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and t0 <= e["ts"] < t1]
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
            and str(e.get("name", "")).startswith("cp: ") and t0 <= e["ts"] <= t0 + call["dur"]]
    regions: dict[str, float] = {}
    for e in host:
        regions[e["name"][4:]] = regions.get(e["name"][4:], 0.0) + e["dur"] / 1e3
    out = {"host_ms": call["dur"] / 1e3, "regions_ms": regions, "kinds": {}, "kernels": {}}
    if not gpu:
        return out
    attention = [e for e in gpu if _kind(e) == "attention"]
    end = max(e["ts"] + e["dur"] for e in gpu)
    out.update(first_gpu_ms=(min(e["ts"] for e in gpu) - t0) / 1e3, end_ms=(end - t0) / 1e3)
    for e in gpu:
        kind = out["kinds"].setdefault(_kind(e), [0, 0.0])
        kind[0] += 1
        kind[1] += e["dur"] / 1e3
        kernel = out["kernels"].setdefault(e["name"][:70], [0, 0.0])
        kernel[0] += 1
        kernel[1] += e["dur"] / 1e3
    if attention:
        start = min(e["ts"] for e in attention)
        stream = attention[0].get("args", {}).get("stream")
        busy = _union_ms((e["ts"], e["ts"] + e["dur"]) for e in gpu
                         if e.get("args", {}).get("stream") == stream and e["ts"] >= start)
        out.update(first_attention_ms=(start - t0) / 1e3, compute_idle_ms=(end - start) / 1e3 - busy)
    out["timeline"] = [f"{(e['ts'] - t0) / 1e3:8.3f} .. {(e['ts'] + e['dur'] - t0) / 1e3:8.3f} ms  stream "
                       f"{e.get('args', {}).get('stream', '?')}  {e['name'][:80]}"
                       for e in sorted(gpu, key=lambda e: e["ts"])]
    return out


def profile_calls(fn, calls: int, device, path: Path | None = None) -> dict:
    """``calls`` + 1 calls of fn under torch.profiler (the first not summarised); per call, from its host start:
    the first GPU event and the first attention kernel, the GPU end, GPU time per kind of kernel and per
    kernel, idle time of the compute stream after its first kernel, host time in the ring's ``cp: ...``
    regions. Returns the medians over the calls (and one call's GPU timeline); writes the trace to path."""
    import gzip
    import tempfile

    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for i in range(calls + 1):
            sync(device)
            dist.barrier()
            with record_function(f"profiled call {i}"):
                fn()
            sync(device)
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        trace = json.loads(Path(f"{tmp}/trace.json").read_text())
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            json.dump(trace, f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    marks = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"  # host side
                    and str(e.get("name", "")).startswith("profiled call ")), key=lambda e: e["ts"])
    for this, after in zip(marks, marks[1:] + [None]):
        this["next_ts"] = after["ts"] if after is not None else math.inf
    per_call = [summarise_call(call, events) for call in marks[1:]]
    if not per_call:
        return {"calls": 0}

    def median(values):
        values = [x for x in values if x is not None]
        return statistics.median(values) if values else None

    result = {"calls": len(per_call), "trace": None if path is None else path.name,
              "timeline": per_call[0].get("timeline", [])}
    for key in ("host_ms", "first_gpu_ms", "first_attention_ms", "end_ms", "compute_idle_ms"):
        result[key] = median(c.get(key) for c in per_call)
    for key in ("kinds", "kernels", "regions_ms"):
        names = sorted({n for c in per_call for n in c[key]})
        if key == "regions_ms":
            result[key] = {n: median(c[key].get(n, 0.0) for c in per_call) for n in names}
        else:
            result[key] = {n: [median(c[key].get(n, [0, 0.0])[0] for c in per_call),
                               median(c[key].get(n, [0, 0.0])[1] for c in per_call)] for n in names}
    return result


def check_first(ring, group=None):
    """The ring with distributed.OVERLAP_START off: shape check, first transfer, then the whole own step."""
    cp.OVERLAP_START = False
    try:
        return ring(group)
    finally:
        cp.OVERLAP_START = True


def one_case(args, seqlen, causal, rank, world, dtype, gen_seed, device, hp_group) -> dict:
    gen = torch.Generator(device=device).manual_seed(gen_seed)
    heads_kv = args.heads_kv or args.heads
    q = torch.randn(args.batch, seqlen, args.heads, args.head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(args.batch, seqlen, heads_kv, args.head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(args.batch, seqlen, heads_kv, args.head_dim, device=device, dtype=dtype, generator=gen)
    qs, ks, vs = (cp.zigzag_shard(t, 1, rank, world).contiguous() for t in (q, k, v))

    def ring(group=None):
        return cp.context_parallel_attention(qs, ks, vs, causal=causal, backend=args.backend, return_lse=True,
                                             group=group, layout="zigzag")

    def one():
        return fa_variants.attention(q, k, v, causal=causal, backend=args.backend)

    calls = step_calls(qs, ks, vs, causal, rank, world, args.backend)

    def kernels():
        for _, _, call in calls:
            call()

    row = [1] * len(cp._FIELDS)
    measures = {"one GPU": one, "ring": ring, "ring, check first": lambda: check_first(ring), "kernels": kernels,
                "kernels + merges": compute_only(qs, ks, vs, causal, rank, world, args.backend),
                "comm": comm_only(ks, vs, rank, world, seqlen),
                "shape check": lambda: cp._gather_rows(dist.group.WORLD, row, world)}
    if hp_group is not None:
        measures["ring, high-priority NCCL"] = lambda: ring(hp_group)
    first = {}
    for name, fn in measures.items():  # first call of each: JIT compile for our kernels
        sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        sync(device)
        first[name] = time.perf_counter() - t0
    ring_out, ring_lse = ring()
    correctness = check(args, q, k, v, causal, rank, world, ring_out, ring_lse, torch.Generator().manual_seed(gen_seed))
    variants = {"max_abs_check_first_vs_ring": lambda: check_first(ring)}
    if hp_group is not None:  # the same numbers through the other group
        variants["max_abs_ring_hp_vs_ring"] = lambda: ring(hp_group)
    for key, fn in variants.items():
        other_out, other_lse = fn()
        correctness[key] = max(max_err(other_out, ring_out), max_err(other_lse, ring_lse))
        del other_out, other_lse
    del ring_out, ring_lse
    names = list(measures)
    per_round = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            per_round[name].append(timed(measures[name], args.reps, device))
    pieces = own_step_pieces(qs, ks, vs, causal, args.backend)
    steps_ms = [(label, timed(call, args.reps, device)) for label, call in [(c[0], c[2]) for c in calls] + pieces]
    traced = {}
    if args.trace == "first-causal" and device.type == "cuda" and causal and seqlen == args.first_causal_seqlen:
        traced["default group"] = timeline(ring, args.out / f"trace_rank{rank}.json.gz")
        traced["default group, check first"] = timeline(lambda: check_first(ring),
                                                        args.out / f"trace_check_first_rank{rank}.json.gz")
    profiled = {}
    if args.profile:
        keep = causal and seqlen == args.first_causal_seqlen  # trace files of one case only (they are large)
        for name, fn in (("ring", ring), ("ring, check first", lambda: check_first(ring))):
            tag = name.replace(", ", "_").replace(" ", "_")
            path = args.out / f"profile_{tag}_rank{rank}.json.gz" if keep else None
            profiled[name] = profile_calls(fn, args.profile_calls, device, path)
    ms = {name: statistics.median(v) for name, v in per_round.items()}
    best = min(ms[name] for name in RING_VARIANTS if name in ms)
    return {"seqlen": seqlen, "causal": causal, "world": world, "ms": ms, "ms_per_round": per_round,
            "steps_ms": steps_ms, "first_call_s": first, "timeline": traced, "profile": profiled,
            "speedup": ms["one GPU"] / ms["ring"], "overhead_ring_over_kernels": ms["ring"] / ms["kernels"],
            "speedup_best": ms["one GPU"] / best, "overhead_best": best / ms["kernels"],
            "ring_over_kernels_and_merges": ms["ring"] / ms["kernels + merges"],
            "target_speedup": TARGET_SPEEDUP[causal], "target_overhead": TARGET_OVERHEAD,
            "correctness_rank0": correctness}


def gathered_correctness(result, world) -> list:
    everyone = [None] * world
    dist.all_gather_object(everyone, result["correctness_rank0"])
    return everyone


def _verdict(value, target, higher_is_better) -> str:
    met = value >= target if higher_is_better else value <= target
    return "met" if met else "NOT met"


def rule_cell(correctness, name) -> str:
    """The tolerance rule of one case: ok/FAIL, and the rank closest to its own bound (err ring / bound)."""
    worst_rank, worst = max(enumerate(correctness), key=lambda rc: rc[1][name]["err_ring"] / rc[1][name]["bound"])
    ok = all(c[name]["ok"] for c in correctness)
    return f"{'ok' if ok else 'FAIL'} {worst[name]['err_ring']:.2e} / {worst[name]['bound']:.2e} (rank {worst_rank})"


def _ms(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def profile_lines(rows) -> list[str]:
    """The --profile section: per case and ring variant, one table row per rank."""
    kinds = ("attention", "nccl", "merge (triton)", "copy/set", "other")
    lines = ["", "## Profile (torch.profiler; ms from the call's host start, medians over the profiled calls)", "",
             "| N | causal | variant | rank | host call | first GPU event | first attention kernel | GPU end "
             "| compute stream idle after its first kernel | " + " | ".join(f"{k} (n, ms)" for k in kinds)
             + " | host regions (ms) |", "|---" * (11 + len(kinds)) + "|"]
    for r in rows:
        for variant in ("ring", "ring, check first"):
            for rank, prof in enumerate(r.get("profile_per_rank") or []):
                p = (prof or {}).get(variant)
                if not p or not p.get("calls"):
                    continue
                cells = [str(r["seqlen"]), str(r["causal"]), variant, str(rank), _ms(p["host_ms"]),
                         _ms(p["first_gpu_ms"]), _ms(p["first_attention_ms"]), _ms(p["end_ms"]),
                         _ms(p["compute_idle_ms"])]
                cells += [f"{p['kinds'][k][0]:g}, {p['kinds'][k][1]:.3f}" if k in p["kinds"] else "-" for k in kinds]
                cells.append(", ".join(f"{n} {t:.3f}" for n, t in p["regions_ms"].items()) or "-")
                lines.append("| " + " | ".join(cells) + " |")
    for r in rows:
        for rank, prof in enumerate(r.get("profile_per_rank") or []):
            for variant, p in (prof or {}).items():
                if p.get("trace") and p.get("timeline"):
                    lines += ["", f"GPU timeline of one profiled call, N={r['seqlen']} causal={r['causal']}, "
                              f"{variant}, "
                              f"rank {rank} (ms from the call's host start; trace {p['trace']}):", "", "```",
                              *p["timeline"], "```"]
    return lines


def profile_summary(rows) -> list[str]:
    out = []
    for r in rows:
        for variant in ("ring", "ring, check first"):
            parts = []
            for rank, prof in enumerate(r.get("profile_per_rank") or []):
                p = (prof or {}).get(variant)
                if p and p.get("calls"):
                    parts.append(f"rank {rank} first attention {_ms(p['first_attention_ms'])}, GPU end "
                                 f"{_ms(p['end_ms'])}, idle {_ms(p['compute_idle_ms'])}")
            if parts:
                out.append(f"profile N={r['seqlen']:>6} causal={str(r['causal']):5} {variant:17}: " + "; ".join(parts))
    return out


def markdown(rows, meta) -> str:
    variants = [name for name in RING_VARIANTS[1:] if any(name in r["ms"] for r in rows)]
    lines = [f"# Context-parallel attention: {meta['world']} GPUs vs one ({meta['gpus'][0]})", "",
             f"Command: `{meta['command']}`", "",
             f"{meta['date']}, torch {meta['torch']}, NCCL {meta['nccl']}, commit {meta['commit']}, backend "
             f"{meta['backend']}, {meta['dtype']}, B={meta['batch']}, H={meta['heads']}, H_kv={meta['heads_kv']}, "
             f"D={meta['head_dim']}, zig-zag shards, merge {meta['merge']}, TORCH_NCCL_HIGH_PRIORITY="
             f"{meta['torch_nccl_high_priority']}. Times: ms, medians of {meta['rounds']} rotated rounds of "
             f"{meta['reps']} repetitions (slowest rank per repetition). \"ring\": the default (OVERLAP_START on: "
             "own step's larger piece launched before the shape check); \"check first\": OVERLAP_START off; "
             "\"hp\": the default on a second NCCL group of the same ranks with high-priority internal streams. "
             "Rules: the rank closest to its own bound, err ring / bound.", "",
             "| N | causal | one GPU | ring | speed-up (target) | ring / kernels (<= 1.1) "
             + "".join(f"| {name} | its speed-up | its ring / kernels " for name in variants)
             + "| kernels alone | kernels + merges | merges (k+m - k) | comm alone | shape check "
             "| max abs ring vs one GPU | out rule | LSE rule |",
             "|---" * (14 + 3 * len(variants)) + "|"]
    for r in rows:
        ms = r["ms"]
        worst = max(c["max_abs_ring_vs_one_gpu"] for c in r["correctness"])
        cells = [str(r["seqlen"]), str(r["causal"]), f"{ms['one GPU']:.3f}", f"{ms['ring']:.3f}",
                 f"{r['speedup']:.2f}x ({r['target_speedup']}: {_verdict(r['speedup'], r['target_speedup'], True)})",
                 f"{r['overhead_ring_over_kernels']:.3f} "
                 f"({_verdict(r['overhead_ring_over_kernels'], TARGET_OVERHEAD, False)})"]
        for name in variants:
            t = ms.get(name, math.nan)
            cells += [f"{t:.3f}",
                      f"{ms['one GPU'] / t:.2f}x ({_verdict(ms['one GPU'] / t, r['target_speedup'], True)})",
                      f"{t / ms['kernels']:.3f} ({_verdict(t / ms['kernels'], TARGET_OVERHEAD, False)})"]
        cells += [f"{ms['kernels']:.3f}", f"{ms['kernels + merges']:.3f}",
                  f"{ms['kernels + merges'] - ms['kernels']:.3f}", f"{ms['comm']:.3f}", f"{ms['shape check']:.3f}",
                  f"{worst:.2e}", rule_cell(r["correctness"], "out"), rule_cell(r["correctness"], "lse")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per step, each call timed alone (ms, slowest rank; shapes as on rank 0; the own step's head and "
              "tail are the pieces the ring launches):", ""]
    for r in rows:
        steps = ", ".join(f"{label} = {t:.3f}" for label, t in r["steps_ms"])
        lines.append(f"- N={r['seqlen']} causal={r['causal']}: {steps}; first calls (s): "
                     + ", ".join(f"{k} {v:.1f}" for k, v in r["first_call_s"].items()))
    for r in rows:
        for rank, traced in enumerate(r["timeline_per_rank"]):
            for group, events in traced.items():
                lines += ["", f"GPU timeline of one ring call, N={r['seqlen']} causal={r['causal']}, rank {rank}, "
                          f"{group} (torch.profiler; trace file under --out):", "", "```", *events, "```"]
    if any(r.get("profile_per_rank") and any(r["profile_per_rank"]) for r in rows):
        lines += profile_lines(rows)
    return "\n".join(lines) + "\n"


def case_ok(r) -> bool:
    """The tolerance rule on every rank (output and LSE), and the other ring variants agreeing with the ring
    within the output rule's bound (same computation, another group or order of launches)."""
    variants = ("max_abs_ring_hp_vs_ring", "max_abs_check_first_vs_ring")
    return all(c[name]["ok"] for c in r["correctness"] for name in ("out", "lse")) and all(
        c.get(name, 0.0) <= c["out"]["bound"] for c in r["correctness"] for name in variants)


def summary(rows) -> list[str]:
    """One line per case: the targets with the ring (default) and its best variant, and correctness."""
    out = []
    for r in rows:
        ms = r["ms"]
        others = ", ".join(f"{name.removeprefix('ring, ')} {ms['one GPU'] / ms[name]:.2f}x / "
                           f"{ms[name] / ms['kernels']:.3f}" for name in RING_VARIANTS[1:] if name in ms)
        out.append(f"N={r['seqlen']:>6} causal={str(r['causal']):5}: speed-up {r['speedup']:.2f}x (target "
                   f"{r['target_speedup']}: {_verdict(r['speedup'], r['target_speedup'], True)}), ring/kernels "
                   f"{r['overhead_ring_over_kernels']:.3f} (target {TARGET_OVERHEAD}: "
                   f"{_verdict(r['overhead_ring_over_kernels'], TARGET_OVERHEAD, False)}); {others}; "
                   f"correctness {'ok' if case_ok(r) else 'FAILED'}")
    return out + profile_summary(rows)


def main() -> int:
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    timeout = datetime.timedelta(seconds=300)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("cp_bench.py: error: no CUDA GPU here; the CPU smoke run is --device cpu --backend reference")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    hp_group = high_priority_group(device)
    seed = torch.tensor([args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")],
                        device=device)
    dist.broadcast(seed, 0)  # every rank builds the same inputs
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    rows, ok = [], True
    args.first_causal_seqlen = int(args.seqlens.split(",")[0]) if True in causals else None
    with torch.inference_mode():
        for seqlen in map(int, args.seqlens.split(",")):
            for causal in causals:
                result = one_case(args, seqlen, causal, rank, world, dtype, int(seed.item()) + seqlen + causal, device,
                                  hp_group)
                result["correctness"] = gathered_correctness(result, world)
                timelines = [None] * world
                dist.all_gather_object(timelines, result.pop("timeline"))
                result["timeline_per_rank"] = timelines
                profiles = [None] * world
                dist.all_gather_object(profiles, result.pop("profile"))
                result["profile_per_rank"] = profiles
                del result["correctness_rank0"]
                ok &= case_ok(result)
                rows.append(result)
                if rank == 0:
                    print(f"N={seqlen} causal={causal}: one GPU {result['ms']['one GPU']:.3f} ms, ring "
                          f"{result['ms']['ring']:.3f} ms, speed-up {result['speedup']:.2f}x, ring/kernels "
                          f"{result['overhead_ring_over_kernels']:.3f}, ring/(kernels+merges) "
                          f"{result['ring_over_kernels_and_merges']:.3f}, comm {result['ms']['comm']:.3f} ms, "
                          f"max|ring-one| {max(c['max_abs_ring_vs_one_gpu'] for c in result['correctness']):.2e}",
                          flush=True)
    if rank == 0:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    timeout=10).stdout.strip() or "unknown"
        except (OSError, subprocess.SubprocessError):
            commit = "unknown"
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] or ["CPU (gloo)"]
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if args.device == "cuda" else "-"
        meta = {"world": world, "gpus": gpus, "torch": torch.__version__, "nccl": nccl,
                "commit": commit, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                "host": platform.node(), "backend": args.backend, "dtype": args.dtype, "batch": args.batch,
                "heads": args.heads, "heads_kv": args.heads_kv or args.heads, "head_dim": args.head_dim,
                "rounds": args.rounds, "reps": args.reps, "seed": int(seed.item()),
                "torch_nccl_high_priority": os.environ.get("TORCH_NCCL_HIGH_PRIORITY", "unset"),
                "merge": ("eager" if args.device == "cpu" or os.environ.get("FA_VARIANTS_CP_COMPILE") == "0"
                          or cp._COMPILED_MERGE["failed"] else "torch.compile"),
                "command": f"python3 -m torch.distributed.run --nproc_per_node {world} scripts/cp_bench.py "
                           + " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
                                      for k, v in vars(args).items()
                                      if k not in ("out", "first_causal_seqlen") and v is not None and v is not False)}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cp_bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (args.out / "cp_bench.md").write_text(markdown(rows, meta))
        print(markdown(rows, meta))
        print("\n".join(summary(rows)))
        print("correctness:", "ok" if ok else "FAILED")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
