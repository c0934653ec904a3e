"""Bandwidth of the FP8 quantisation pass (fa_variants.fp8.quant_kernel) beside a device copy, on the GPU.

    source .gpu/env.sh && python3 scripts/fp8_quant_bandwidth.py [--json OUT] [--calls 20] [--pipelines v1,v3]
        [--recipes default,no-smooth] [--rounds 1] [--shapes D=256] [--graph] [--b2b] [--host-profile]

Per shape, pipeline ("v1": one launch per tensor, one block of loads in flight per CTA, K's mean by torch;
"v2": three blocks in flight, K's mean summed in V's launch, K's blocks read last first; "v3": v2 with
coalesced loads through a swizzled shared-memory stage and the blocks walked head fastest; "v3s": v3 with K's
mean staged with each block's loads, ``quant_host.V3_STAGED_MEAN``; "v3sf": v3s with K's mean finished in V's
launch, ``V3_FUSED_MEAN``; "v3ss": v3s with Q's / K's e4m3 stored through shared memory, ``V3_STAGED_STORE``;
"v3sfs": v3s with the fused mean for a sampled mean only (``V3_FUSED_SAMPLED_MEAN``); "def": the current default
(staged mean on, staged store at head_dim 64 only, since session 12 ``V3_WIDE`` and ``QUANT_PLANS`` on, the rest off);
"def11": session 11's default (def with ``V3_WIDE`` and ``QUANT_PLANS`` off: the def against which session 12's
quantlanes / quantbw runs measured defw / defp; with def now they are A/A rows); "deff": def with the fused mean
counted per K block (``V3_FUSED_MEAN``); "defl": def with the fused mean counted after each CTA's loop
(``V3_FUSED_MEAN_LATE``);
"defw": def with Q's / K's pass at head_dim 256 holding 8 chunks of a token per thread (``V3_WIDE``: 2 lanes per
token, one cross-lane Hadamard stage; bit for bit); "defn" / "defwn": def / defw without programmatic dependent launch
(``V2_PDL`` off); "defp64" / "defp256": def with PDL up to head_dim 64 (the default since session 43) / at every
head_dim (before it) (``V2_PDL_MAX_HEAD_DIM``); "defp": def with cached
launch plans (``QUANT_PLANS``: host work only); "defc": def with whole-call plans (``QUANT_CALL_PLANS``,
``fp8.quant_call``: host work only, the same launches); "defcl": defc with the fused mean counted late
(``V3_FUSED_MEAN_LATE``: no torch sum of K's partials, one kernel fewer per call); "defw128": def with Q's / K's
pass at head_dim 128 holding a token's 128 channels per thread and storing through the stage (``V3_WIDE128``; bit
for bit), "defw128n" the same without the staged store (head_dim 128 rows only), "defw128k" defw128 for K's pass
only (``V3_WIDE128 = "k"``, Q's pass def's); "definf": def with the non-finite rule (``NONFINITE``: finite inputs
bit for bit); "defoff": def with it off; "defoffn": defoff without PDL; "defd": def with its slow path after each
CTA's loop (``NONFINITE_DEFERRED``); "defs": def with a sampled mean finished in V's launch
(``V3_FUSED_SAMPLED_MEAN``; the exact mean's rows are def's); "defw128l": defw128 with the fused mean counted late;
"defc2" / "defc8": def with Q's LSE shift summed in 2 / 8 chains (``SHIFT_CHAINS``), "defw128c8" defc8 with Q's pass
wide at head_dim 128 (``V3_WIDE128`` True); ``quant_host``) and recipe (default: block scales + Hadamard + K
smoothing; "no-smooth": the same without smoothing; "sampled8": the default with K's mean over 8 evenly spaced K
tiles, ``FP8Config(smooth_k_blocks=8)``; "sampled16": over 16), one call of ``quant_host.quantize(...,
pipeline=...)`` (what ``quantize_fp8(..., impl="kernel")`` runs):

* ``gpu ms``: GPU time per call with the host out of the way: a ``torch.cuda._sleep`` kernel holds the stream
  while the host enqueues ``--calls`` calls, and CUDA events time them back to back (launch gaps included);
  with ``--rounds`` R the median of R such timings, the pipelines taken in a rotated order per round.
  The check that the host finished enqueuing before the sleep ended is printed (``queued``); if it did not,
  the figure is the host's, and says so.
* ``eager ms``: one call timed alone (events around it, then a sync): what a caller sees, host work included.
* ``host ms/call``: the host's time to enqueue one call (from the ``gpu ms`` timing: its enqueue time / calls, the
  GPU held, no call syncs); when it exceeds ``gpu ms`` an eager caller is host-bound (``eager ms`` ~ host ms).
* ``graph ms`` (--graph): ``--calls`` calls captured in one CUDA graph and replayed back to back: GPU time with no
  host work at all (``Timer.graph_ms``); its % of copy beside ``gpu ms``'s.
* --breakdown: each kernel of a call (torch.profiler) from host-bound calls (each kernel mostly starts on an idle
  GPU); --b2b: the same kernels back to back as ``gpu ms`` runs them (the stream held while the host enqueues), with
  the start-to-start period per call and the gaps / PDL overlaps before each kernel (``b2b_breakdown``);
  --host-profile: the host's own time per call by function (cProfile).
* ``GB`` (the byte model, printed by the script): the bytes the pass must move: q, k, v read once in 16 bits,
  e4m3 q, k, v_t (with its padding) written, the float32 descales and (default recipe) the float32 LSE shift
  written. Not counted: the second read of K that smoothing needs (the mean must be known before any K
  block is quantised: v1 reads it in torch's mean, v2 in V's launch), the K mean's partial sums (v2), and
  the mean itself; ``+K GB`` shows that second read.
* ``TB/s`` = GB / gpu ms and ``% copy`` against torch's copy of a 2 GiB tensor (read + write) measured in the
  same run, the same way. Issue 10's target: >= 70% of copy.
* ``match``: the kernel's FP8Inputs equal the torch recipe's on the same inputs (e4m3 bytes, descales, V layout
  bit for bit; lse_shift to float32 rounding). v2 with smoothing: the torch recipe is given the pass's own K
  mean (another float32 summation order; v3 likewise) and the mean is checked against float64 within its rounding bound
  (tests/test_fp8_quant_kernel.py::assert_k_mean_close's bound).

The summary line at the end says PASS when every row matched and reached 70% of copy.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

TARGET = 0.70


def shapes() -> list[tuple[str, tuple[int, int, int, int, int, int]]]:
    """(name, (batch, seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim)): 64 MiB per 16-bit tensor for
    D = 64 / 128 / 256, plus a GQA shape with an odd seqlen_k (tails)."""
    rows = [(f"D={d}", (1, 16384, 16384, 2048 // d, 2048 // d, d)) for d in (64, 128, 256)]
    rows.append(("D=128 GQA", (2, 8192, 8191, 16, 4, 128)))
    return rows


def moved_bytes(q, k, fp8, smooth: bool) -> int:
    n_q, n_k = q.numel(), k.numel()
    must = 2 * (n_q + 2 * n_k) + fp8.q.numel() + fp8.k.numel() + fp8.v_t.numel()
    must += 4 * (fp8.q_descale.numel() + fp8.k_descale.numel() + fp8.v_descale.numel())
    if smooth:
        must += 4 * fp8.lse_shift.numel()
    return must


def mean_ok(got, k, block_n: int, blocks: int | None = None) -> bool:
    """The v2 / v3 mean within float32 summation's bound of the float64 mean (the test's bound; see its
    docstring) of the tokens it is taken over (``quantize.k_sample_tiles``: all of them unless ``blocks``)."""
    from fa_variants.fp8.quant_kernel import k_parts_per_block
    from fa_variants.fp8.quantize import k_sample_tiles

    tiles = k_sample_tiles(k.shape[1], block_n, blocks)
    if blocks is not None and len(tiles) < -(-k.shape[1] // block_n):
        import torch

        idx = torch.cat([torch.arange(t * block_n, min((t + 1) * block_n, k.shape[1])) for t in tiles])
        k = k[:, idx.to(k.device)]
    Nk = k.shape[1]
    parts = -(-Nk // block_n) * k_parts_per_block(block_n)
    depth = parts + 10
    kd = k.double()
    bound = depth * 2.0 ** -24 * 1.01 * kd.abs().mean(dim=1)
    return bool(((got.double() - kd.mean(dim=1)).abs() <= bound).all())


def matches(gpu, ref) -> str:
    """'ok' or what differs."""
    import torch

    bad = [name for name in ("q", "k", "v_t")
           if getattr(gpu, name).shape != getattr(ref, name).shape
           or not torch.equal(getattr(gpu, name).view(torch.uint8), getattr(ref, name).view(torch.uint8))]
    bad += [name for name in ("q_descale", "k_descale", "v_descale") if not torch.equal(getattr(gpu, name),
                                                                                       getattr(ref, name))]
    if ref.lse_shift is not None:
        scale = ref.lse_shift.abs().max().item() + 1e-30
        if not torch.allclose(gpu.lse_shift, ref.lse_shift, rtol=1e-5, atol=1e-6 * scale):
            bad.append("lse_shift")
    return "ok" if not bad else "DIFF " + ",".join(bad)


def pass_bytes(q, k, v, out, extra: int) -> list[int]:
    """Bytes each launch of the pass moves, in launch order [V's (+ K's second read: ``extra``), K's, Q's]: its 16-bit
    input read, its e4m3 output (v_t with its padding) and float32 descales written (Q: + the LSE shift)."""
    def nbytes(t):
        return 0 if t is None else t.numel() * t.element_size()

    return [nbytes(v) + extra + nbytes(out.v_t) + nbytes(out.v_descale),
            nbytes(k) + nbytes(out.k) + nbytes(out.k_descale),
            nbytes(q) + nbytes(out.q) + nbytes(out.q_descale) + nbytes(out.lse_shift)]


def pass_shares(row: dict, copy_tbs: float, key: str = "kernels") -> str:
    """Per launch of the pass (V (+ K's sums), K, Q; from the row's breakdown, the kernels named "pass" in order): us
    and % of copy for its own bytes (``pass_bytes``); other kernels (torch's sum of K's partials) with their us.
    Empty without a breakdown of three passes. key: which breakdown ("kernels": ``kernel_breakdown``'s host-bound
    calls; "kernels_b2b": ``b2b_breakdown``'s back-to-back calls)."""
    parts = [p.rsplit(" ", 1) for p in row.get(key, "").split(": ", 1)[-1].split(", ") if " " in p]
    passes = [float(t) for n, t in parts if n == "pass"]
    if len(passes) != 3 or "pass_bytes" not in row:
        return ""
    names = ("V+Ksum" if row.get("extra_bytes_read") else "V", "K", "Q")
    text = [f"{n} {us:.1f} us {100 * b / (us * 1e-6) / 1e12 / copy_tbs:.0f}%"
            for n, us, b in zip(names, passes, row["pass_bytes"])]
    text += [f"{n} {float(t):.1f} us" for n, t in parts if n != "pass"]
    return ", ".join(text)


def kernel_breakdown(fn, calls: int = 5) -> str:
    """The GPU kernels of one call in launch order with their durations (torch.profiler, last of ``calls``
    calls), and their sum: what the launches cost apart from the gaps between them. Diagnostic only."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        kernels = sorted((e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")),
                         key=lambda e: e.time_range.start)
        per_call = len(kernels) // calls
        last = kernels[-per_call:] if per_call else []
        us = [getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0) for e in last]
        names = [("pass" if "quant" in e.name.lower() else e.name[:24]) for e in last]
        parts = ", ".join(f"{n} {t:.1f}" for n, t in zip(names, us))
        return f"{per_call} kernels, {sum(us):.1f} us: {parts}"
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not stop the measurement
        return f"(no breakdown: {type(exc).__name__}: {exc})"


def b2b_breakdown(fn, timer, calls: int = 8) -> tuple[str, str]:
    """The kernels of ``calls`` calls run back to back (torch.profiler; the stream held by a sleep kernel while the
    host enqueues, as ``Timer.gpu_ms``), for the calls 2 .. calls - 1: (kernels, gaps). kernels: "N kernels, S us:
    name us, ..." (``kernel_breakdown``'s format, per-position medians, so ``pass_shares`` reads it); gaps: "period
    P us, gaps G us (before each: ...)": P = median start-to-start time of consecutive calls (the GPU time per call),
    G = P - S (negative: kernels overlapped, PDL), and the median time from each kernel's predecessor's end to its
    start. ("", why) when the profile has no clean pattern. Unlike ``kernel_breakdown`` (whose calls are host-bound:
    each kernel starts on an idle GPU) these are the kernels as ``gpu ms`` times them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        torch.cuda.synchronize()
        hold = 3.0 * calls * getattr(timer, "host_ms", 0.5) + 5.0  # the profiler slows the host
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.cuda._sleep(int(hold * timer.cycles_per_ms))
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            queued = (time.perf_counter() - t0) * 1e3 < hold
            torch.cuda.synchronize()
        events = sorted((e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")),
                        key=lambda e: e.time_range.start)[1:]  # [0]: the sleep kernel
        kernels, gaps = b2b_pattern([(e.name, e.time_range.start, e.time_range.end) for e in events], calls)
        return kernels, gaps + ("" if queued or not kernels else " HOST-BOUND (not queued)")
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not stop the measurement
        return "", f"(no back-to-back breakdown: {type(exc).__name__}: {exc})"


def b2b_pattern(events: list[tuple[str, float, float]], calls: int) -> tuple[str, str]:
    """``b2b_breakdown``'s reading of (name, start us, end us) kernels of ``calls`` back-to-back calls in start order
    (the same kernels per call): per kernel position the median duration over calls 2 .. calls - 1, the median
    start-to-start period of consecutive calls, and the median time from each kernel's predecessor's end to its
    start (negative: overlap), then each position's shortest and longest duration over those calls (a pass that
    runs at two speeds in one run shows here, session 38's Q pass at head_dim 256: 40-65 us); ("", why) without that
    pattern."""
    per_call = len(events) // calls
    if calls < 4 or per_call == 0 or len(events) != per_call * calls:
        return "", f"(no back-to-back pattern: {len(events)} kernels for {calls} calls)"
    middle = range(1, calls - 1)
    med = statistics.median
    spans = [[events[i * per_call + j][2] - events[i * per_call + j][1] for i in middle] for j in range(per_call)]
    dur = [med(s) for s in spans]
    period = med(events[(i + 1) * per_call][1] - events[i * per_call][1] for i in middle)
    before = [med(events[i * per_call + j][1] - events[i * per_call + j - 1][2] for i in middle)
              for j in range(per_call)]
    names = [("pass" if "quant" in n.lower() else n[:24]) for n, _, _ in events[:per_call]]
    kernels = f"{per_call} kernels, {sum(dur):.1f} us: " + ", ".join(f"{n} {t:.1f}" for n, t in zip(names, dur))
    gaps = (f"period {period:.1f} us, gaps {period - sum(dur):+.1f} us (before each: "
            + ", ".join(f"{b:+.1f}" for b in before) + "; range "
            + ", ".join(f"{min(s):.1f}-{max(s):.1f}" for s in spans) + ")")
    return kernels, gaps


def host_profile(fn, calls: int = 20, top: int = 8) -> str:
    """The host's time per call of fn (the enqueue, no GPU wait: no call syncs) and its ``top`` functions by own time
    (cProfile over ``calls`` calls; profiled, so larger than unprofiled), as one line."""
    import cProfile
    import pstats

    import torch

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
    total = sum(v[2] for v in stats.values())
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    parts = [f"{os.path.basename(f)}:{name} {1e6 * v[2] / calls:.1f}" for (f, _, name), v in rows]
    return f"profiled {1e6 * total / calls:.0f} us/call; own us/call: " + ", ".join(parts)


class Timer:
    """GPU time per call with the stream held by a sleep kernel while the host enqueues (see module doc)."""

    def __init__(self):
        import torch

        self.torch = torch
        cycles = 20_000_000
        torch.cuda._sleep(cycles)  # warm
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        self.cycles_per_ms = cycles / start.elapsed_time(end)

    def eager_ms(self, fn, runs: int = 5) -> float:
        from fa_variants.bench.runtime import event_ms

        return statistics.median([event_ms(fn) for _ in range(runs)])

    def gpu_ms(self, fn, calls: int) -> tuple[float, bool]:
        """(ms per call, queued): queued is False when the host was still enqueuing after the sleep ended."""
        torch = self.torch
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        host_ms = (time.perf_counter() - t0) * 1e3 / 3
        sleep_ms = 2.0 * calls * host_ms + 1.0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(sleep_ms * self.cycles_per_ms))
        t0 = time.perf_counter()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        enqueue_ms = (time.perf_counter() - t0) * 1e3
        end.synchronize()
        self.host_ms = enqueue_ms / calls  # the host's time per call (enqueue only: the GPU was held)
        self.hold_ms = sleep_ms
        return start.elapsed_time(end) / calls, enqueue_ms < sleep_ms

    def graph_ms(self, fn, calls: int, reps: int = 3) -> tuple[float, str]:
        """(ms per call, "" or why not): ``calls`` calls of fn captured in one CUDA graph (after two warm-up calls
        on a side stream), replayed ``reps`` times back to back between CUDA events: GPU time with no host work
        at all (the launches, PDL edges included, are the graph's). NaN and the error when capture fails."""
        from fa_variants.bench.decode import cuda_graph_of

        torch = self.torch
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = cuda_graph_of(fn, calls)
            graph.replay()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                graph.replay()
            end.record()
            end.synchronize()
            del graph
            return start.elapsed_time(end) / (reps * calls), ""
        except Exception as exc:  # noqa: BLE001 - reported in the row, the other measures stand
            torch.cuda.synchronize()
            return float("nan"), f"{type(exc).__name__}: {exc}"[:160]


# --pipelines label -> (quant_host pipeline, quant_host switches set for it)
# ("v3": the staged mean off, as measured before it became the default in session 6; "v3s": on)
_V3S = {"V3_STAGED_MEAN": True, "V3_STAGED_STORE": False, "V3_FUSED_SAMPLED_MEAN": False}
PIPES = {"v1": ("v1", {}), "v2": ("v2", {}), "v3": ("v3", {"V3_STAGED_MEAN": False}),
         "v3s": ("v3", _V3S), "v3sf": ("v3", {**_V3S, "V3_FUSED_MEAN": True}),
         "v3ss": ("v3", {**_V3S, "V3_STAGED_STORE": True}),
         "v3sfs": ("v3", {**_V3S, "V3_FUSED_SAMPLED_MEAN": True})}
# session 8: the current default as it is (the staged store's auto rule included) and the two fused means beside it
_DEF = {"V3_STAGED_MEAN": True, "V3_STAGED_STORE": None, "V3_FUSED_SAMPLED_MEAN": False,
        "V3_FUSED_MEAN": False, "V3_FUSED_MEAN_LATE": False}
PIPES.update({"def": ("v3", _DEF), "deff": ("v3", {**_DEF, "V3_FUSED_MEAN": True}),
              "defl": ("v3", {**_DEF, "V3_FUSED_MEAN_LATE": True})})
# session 11: Q's / K's pass at head_dim 256 with 8 chunks of a token per thread (``V3_WIDE``: one cross-lane Hadamard
# stage instead of two; bit for bit the default, so checked as "def"; D 64 / 128 rows run the default's passes)
PIPES["defw"] = ("v3", {**_DEF, "V3_WIDE": True})
# session 12: the same two without programmatic dependent launch (``V2_PDL``: K's and Q's passes wait for the previous
# kernel's end): whether back-to-back calls lose wide's per-pass gain to the PDL overlap (session 12's quantbw run)
PIPES["defn"] = ("v3", {**_DEF, "V2_PDL": False})
PIPES["defwn"] = ("v3", {**_DEF, "V3_WIDE": True, "V2_PDL": False})
# session 42: def with PDL only up to head_dim 64 (``V2_PDL_MAX_HEAD_DIM``): at 128 / 256 its passes as "defn"'s (the
# default since session 43, so "def" itself), and at every head_dim (the default before)
PIPES["defp64"] = ("v3", {**_DEF, "V2_PDL_MAX_HEAD_DIM": 64})
PIPES["defp256"] = ("v3", {**_DEF, "V2_PDL_MAX_HEAD_DIM": 256})
# session 12: def with cached launch plans (``quant_host.QUANT_PLANS``: the same launches, less host work per call)
PIPES["defp"] = ("v3", {**_DEF, "QUANT_PLANS": True})
# session 13: def with whole-call plans (``quant_host.QUANT_CALL_PLANS``: the same launches, the per-call Python of
# _check / device context / aligned / quantize_tensor / launch_plan done once per geometry), and with the fused mean
# counted late beside it (``V3_FUSED_MEAN_LATE``: torch's sum of K's partials, a kernel and a host op, gone)
PIPES["defc"] = ("v3", {**_DEF, "QUANT_CALL_PLANS": True})
PIPES["defcl"] = ("v3", {**_DEF, "QUANT_CALL_PLANS": True, "V3_FUSED_MEAN_LATE": True})
# session 14: Q's / K's pass at head_dim 128 with a token's 128 channels in one thread (``V3_WIDE128``: no cross-lane
# Hadamard stage, the e4m3 through the stage by the staged store's auto rule; bit for bit the default, so checked as
# "def"; other head_dims run the default's passes), and without its staged store (an ablation at head_dim 128 only:
# V3_STAGED_STORE 0 also turns the head_dim 64 default's off)
PIPES["defw128"] = ("v3", {**_DEF, "V3_WIDE128": True})
PIPES["defw128n"] = ("v3", {**_DEF, "V3_WIDE128": True, "V3_STAGED_STORE": False})
# session 14: the same at head_dim 128 for K's pass only (``V3_WIDE128 = "k"``: Q's pass as def's, whose wide form
# spills 40 bytes and gained nothing in quantocc's run; bit for bit the default)
PIPES["defw128k"] = ("v3", {**_DEF, "V3_WIDE128": "k"})
# session 14: def with the passes' non-finite rule (``quant_host.NONFINITE``: one uniform test per block, a slow path
# behind it never taken on finite inputs; bit for bit the default there, so checked as "def")
PIPES["definf"] = ("v3", {**_DEF, "NONFINITE": True})
# session 36: def without it (the switch has been on by default since session 14; session 35's slow path, Q / K's
# values rotated again with the recipe's shift, moved the fast path's registers: what the switch now costs)
PIPES["defoff"] = ("v3", {**_DEF, "NONFINITE": False})
# session 39: defoff without programmatic dependent launch: with "defn", whether the switch's cost (the D 256 Q pass
# at ~45 or ~62 us with it, always ~45 us without, sessions 38-39) comes with the PDL overlap or with the code
PIPES["defoffn"] = ("v3", {**_DEF, "NONFINITE": False, "V2_PDL": False})
# session 36: def with the slow path after each CTA's loop (``quant_host.NONFINITE_DEFERRED``: the same outputs)
PIPES["defd"] = ("v3", {**_DEF, "NONFINITE": True, "NONFINITE_DEFERRED": True})
# session 37: def with the slow path inside the loop (the default from session 14 to 36; deferred since session 37)
PIPES["definl"] = ("v3", {**_DEF, "NONFINITE": True, "NONFINITE_DEFERRED": False})
# session 12's default before its flips (V3_WIDE, QUANT_PLANS on since then: "def" runs them)
# session 21: def with the sampled mean finished in V's launch (``V3_FUSED_SAMPLED_MEAN``; the exact mean: def's)
PIPES["defs"] = ("v3", {**_DEF, "V3_FUSED_SAMPLED_MEAN": True})
# session 21: defw128 (both passes wide at head_dim 128) with the fused mean counted late
PIPES["defw128l"] = ("v3", {**_DEF, "V3_WIDE128": True, "V3_FUSED_MEAN_LATE": True})
PIPES["def11"] = ("v3", {**_DEF, "V3_WIDE": False, "QUANT_PLANS": False})
# session 21: Q's LSE shift summed in 2 / 8 chains (``SHIFT_CHAINS``), and 8 chains with Q's pass wide at 128 as well
PIPES["defc2"] = ("v3", {**_DEF, "SHIFT_CHAINS": 2})
PIPES["defc8"] = ("v3", {**_DEF, "SHIFT_CHAINS": 8})
PIPES["defw128c8"] = ("v3", {**_DEF, "V3_WIDE128": True, "SHIFT_CHAINS": 8})


def recipes() -> dict:
    """--recipes name -> FP8Config."""
    from fa_variants.fp8 import FP8Config

    return {"default": FP8Config(), "no-smooth": FP8Config(smooth_k=False),
            "sampled8": FP8Config(smooth_k_blocks=8), "sampled16": FP8Config(smooth_k_blocks=16)}


def run_with(pipe_label: str, fn):
    """fn() with the switches of PIPES[pipe_label] set (restored after)."""
    from fa_variants.fp8 import quant_host

    knobs = PIPES[pipe_label][1]
    saved = {name: getattr(quant_host, name) for name in knobs}
    try:
        for name, value in knobs.items():
            setattr(quant_host, name, value)
        return fn()
    finally:
        for name, value in saved.items():
            setattr(quant_host, name, value)


def report_cell(name: str, q, k, v, pipe: str, recipe: str, cell_times: list, cell_hosts: list, cell_graphs: list,
                timer: Timer, copy_tbs: float, args: argparse.Namespace) -> dict:
    """One timed (shape, pipeline, recipe) cell: its output checked against the torch recipe, its row (the
    medians of the rounds' (gpu ms, queued), host ms and graph timings; bytes, % of copy, the optional breakdowns)
    printed and returned."""
    from fa_variants.fp8 import quant_host
    from fa_variants.fp8.quantize import k_sample_count, quantize_fp8_torch

    B, Nq, Nk, H, Hkv, D = (*q.shape[:2], k.shape[1], q.shape[2], k.shape[2], q.shape[3])
    cfg = recipes()[recipe]
    base = PIPES[pipe][0]

    def fn():
        return run_with(pipe, lambda: quant_host.quantize(q, k, v, config=cfg, pipeline=base))

    out = fn()
    given = out.k_mean if quant_host.own_mean(base) and cfg.smooth_k else None
    match = matches(out, quantize_fp8_torch(q, k, v, config=cfg, k_mean=given))
    if given is not None and not mean_ok(given, k, out.block_n, cfg.smooth_k_blocks):
        match = "DIFF k_mean" if match == "ok" else match + ",k_mean"
    ms = statistics.median(t for t, _ in cell_times)
    queued = all(qd for _, qd in cell_times)
    eager = timer.eager_ms(fn)
    moved = moved_bytes(q, k, out, cfg.smooth_k)
    # K's second read: all of K for the exact mean, the sample tiles for a sampled one (v1: torch's read)
    extra = 2 * k.numel() * k_sample_count(Nk, out.block_n, cfg.smooth_k_blocks) // max(1, Nk) \
        if cfg.smooth_k else 0
    tbs = moved / ms / 1e9
    frac = tbs / copy_tbs
    breakdown = kernel_breakdown(fn) if args.breakdown else ""
    b2b, b2b_gaps = b2b_breakdown(fn, timer) if args.b2b else ("", "")
    host_ms = statistics.median(cell_hosts)
    graph_ms, graph_why = float("nan"), ""
    if cell_graphs:
        ok = [t for t, why in cell_graphs if not why]
        graph_ms = statistics.median(ok) if ok else float("nan")
        graph_why = "" if ok else cell_graphs[0][1]
    graph_frac = moved / graph_ms / 1e9 / copy_tbs
    row = {"shape": name, "dims": [B, Nq, Nk, H, Hkv, D], "pipeline": pipe, "recipe": recipe,
           "gpu_ms": ms, "eager_ms": eager, "bytes": moved, "extra_bytes_read": extra,
           "tb_s": tbs, "of_copy": frac, "queued": queued, "match": match,
           "kernels": breakdown, "pass_bytes": pass_bytes(q, k, v, out, extra),
           "host_ms": host_ms, "eager_of_copy": moved / eager / 1e9 / copy_tbs,
           "graph_ms": graph_ms, "graph_of_copy": graph_frac, "graph_error": graph_why,
           "kernels_b2b": b2b, "b2b_gaps": b2b_gaps}
    graph_text = (f"  {graph_ms:7.4f} ({100 * graph_frac:5.1f}%)" if graph_ms == graph_ms
                  else f"  no graph: {graph_why}") if args.graph else ""
    print(f"{name:<11} {pipe:<4} {recipe:<9} {ms:7.4f} {eager:8.4f} {moved / 1e9:6.3f} {tbs:5.2f} "
          f"{100 * frac:5.1f}% {extra / 1e9:5.3f}  {'yes' if queued else 'NO (host-bound)'}  {match}"
          f"{graph_text}  {host_ms:.4f}", flush=True)
    if breakdown:
        print(f"    kernels (us, launch order, host-bound calls): {breakdown}", flush=True)
        print(f"    per pass: {pass_shares(row, copy_tbs)}", flush=True)
    if b2b or b2b_gaps:
        print(f"    back to back: {b2b}; {b2b_gaps}", flush=True)
        if b2b:
            print(f"    per pass back to back: {pass_shares(row, copy_tbs, 'kernels_b2b')}", flush=True)
    if args.host_profile:
        print(f"    host: {host_profile(fn)}", flush=True)
    return row


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--json", default=None, help="write the rows to this file")
    parser.add_argument("--calls", type=int, default=20, help="calls per timing (default 20)")
    parser.add_argument("--pipelines", default="v1,v3",
                        help="comma-separated of " + ", ".join(PIPES) + " (default v1,v3)")
    parser.add_argument("--ab", default="", help="OLD:NEW (two of --pipelines; several comma-separated): also NEW's "
                        "time / OLD's per row, and per kernel of the breakdown")
    parser.add_argument("--recipes", default="default,no-smooth",
                        help="comma-separated of default, no-smooth, sampled8, sampled16 (default default,no-smooth)")
    parser.add_argument("--rounds", type=int, default=1, help="timings per row, rotated order (median; default 1)")
    parser.add_argument("--skip", default="", help="comma-separated pipeline:recipe cells to leave out (every shape), "
                        "or pipeline:recipe:shape (that shape only)")
    parser.add_argument("--ablation", action="store_true",
                        help="also v3 with one part changed at a time (no coalescing, tile-major order, stages 2, "
                             "no PDL, the fused K mean) and v2, D = 128")
    parser.add_argument("--breakdown", action="store_true",
                        help="also each call's kernels and their durations (torch.profiler; diagnostic)")
    parser.add_argument("--graph", action="store_true",
                        help="also GPU time per call by CUDA graph replay (``Timer.graph_ms``: no host work at all)")
    parser.add_argument("--b2b", action="store_true",
                        help="also each call's kernels back to back (``b2b_breakdown``: durations, gaps, period)")
    parser.add_argument("--host-profile", action="store_true",
                        help="also the host's own time per call by function (cProfile, ``host_profile``)")
    parser.add_argument("--shapes", default="",
                        help="comma-separated shape names to run (default all: " + ", ".join(n for n, _ in shapes())
                        + ")")
    parser.add_argument("--plan", action="store_true", help="print the shapes and exit (no GPU needed)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    pipelines = args.pipelines.split(",")
    if any(p not in PIPES for p in pipelines):
        parser.error(f"--pipelines: each of {', '.join(PIPES)}, got {args.pipelines!r}")
    recipe_names = args.recipes.split(",")
    if any(r not in ("default", "no-smooth", "sampled8", "sampled16") for r in recipe_names):
        parser.error(f"--recipes: each of default, no-smooth, sampled8, sampled16, got {args.recipes!r}")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    skip = {tuple(c.split(":", 2)) for c in args.skip.split(",") if c}
    chosen = [(n, shape) for n, shape in shapes() if not args.shapes or n in args.shapes.split(",")]
    if args.shapes and len(chosen) != len(args.shapes.split(",")):
        parser.error(f"--shapes: each of {', '.join(n for n, _ in shapes())}, got {args.shapes!r}")
    print(BYTE_MODEL)
    if args.plan:
        for name, shape in chosen:
            print(name, "(batch, seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim) =", shape)
        print("pipelines:", ", ".join(pipelines), "x recipes:", ", ".join(recipe_names), "x rounds:", args.rounds)
        return 0

    import torch

    from fa_variants.fp8 import quant_host

    timer = Timer()
    big = torch.empty(2**30, dtype=torch.bfloat16, device="cuda")
    copy_ms, _ = timer.gpu_ms(lambda: big.clone(), 5)
    copy_tbs = 2 * big.numel() * 2 / copy_ms / 1e9
    del big
    print(f"device copy (2 GiB read + 2 GiB written): {copy_ms:.3f} ms, {copy_tbs:.2f} TB/s", flush=True)
    rows: list[dict] = [{"what": "copy", "ms": copy_ms, "tb_s": copy_tbs}]
    print(f"{'shape':<11} {'pipe':<4} {'recipe':<9} {'gpu ms':>7} {'eager ms':>8} {'GB':>6} {'TB/s':>5} "
          f"{'% copy':>6} {'+K GB':>5}  queued  match" + ("  graph ms (% copy)" if args.graph else "")
          + "  host ms/call")
    for name, (B, Nq, Nk, H, Hkv, D) in chosen:
        g = torch.Generator(device="cuda").manual_seed(D + Nk)
        q = torch.randn(B, Nq, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = (torch.randn(B, Nk, Hkv, D, device="cuda", generator=g) + 1).to(torch.bfloat16)
        v = torch.randn(B, Nk, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        cells = [(p, r) for p in pipelines for r in recipe_names if (p, r) not in skip and (p, r, name) not in skip]
        times: dict[tuple, list] = {c: [] for c in cells}
        hosts: dict[tuple, list] = {c: [] for c in cells}
        graphs: dict[tuple, list] = {c: [] for c in cells}
        for pipe, recipe in cells:  # compile (or load) every pass before any timing
            run_with(pipe, lambda: quant_host.quantize(q, k, v, config=recipes()[recipe], pipeline=PIPES[pipe][0]))
        torch.cuda.synchronize()
        for rnd in range(args.rounds):  # rotated: each round starts one (pipeline, recipe) later
            for pipe, recipe in cells[rnd % len(cells):] + cells[:rnd % len(cells)]:
                cfg = recipes()[recipe]
                fn = lambda: quant_host.quantize(q, k, v, config=cfg, pipeline=PIPES[pipe][0])  # noqa: E731
                times[pipe, recipe].append(run_with(pipe, lambda: timer.gpu_ms(fn, args.calls)))
                hosts[pipe, recipe].append(timer.host_ms)
                if args.graph:
                    graphs[pipe, recipe].append(run_with(pipe, lambda: timer.graph_ms(fn, args.calls)))
        for pipe, recipe in cells:
            rows.append(report_cell(name, q, k, v, pipe, recipe, times[pipe, recipe], hosts[pipe, recipe],
                                    graphs[pipe, recipe], timer, copy_tbs, args))
        del q, k, v
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.ablation:
        try:
            ablation(timer, copy_tbs, rows, args.calls)
        except Exception as exc:  # noqa: BLE001 - the ablation must not hide the summary
            print(f"ablation FAILED: {type(exc).__name__}: {exc}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    timed = [r for r in rows[1:] if "ablation" not in r]
    for pair in filter(None, args.ab.split(",")):
        print(ab_lines(timed, *pair.split(":", 1), copy_tbs=copy_tbs))
    return summarise(timed, copy_tbs, pipelines)


# label -> (pipeline, quant_host switches changed): v3 with one part changed at a time, and v2 (not "no
# reverse": K's smoothed pass without it spills 16 bytes at head_dim 128 under the 128-register cap, which would
# confound the comparison)
# (relative to v3 without the staged mean, as before session 6: every entry but "+ staged mean" turns it off)
_UNSTAGED = {"V3_STAGED_MEAN": False}
ABLATION = {"v3": ("v3", _UNSTAGED), "v3 no coalesced": ("v3", {**_UNSTAGED, "V3_COALESCED": False}),
            "v3 tile-major": ("v3", {**_UNSTAGED, "V3_HEAD_MAJOR": False}),
            "v3 stages 2": ("v3", {**_UNSTAGED, "V2_STAGES": 2}), "v3 no PDL": ("v3", {**_UNSTAGED, "V2_PDL": False}),
            "v3 + fused mean": ("v3", {**_UNSTAGED, "V3_FUSED_MEAN": True}),
            "v3 + staged mean": ("v3", {"V3_STAGED_MEAN": True}), "v2": ("v2", {})}


def ablation(timer, copy_tbs: float, rows: list[dict], calls: int) -> None:
    """v3 with one part changed at a time, and v2 (``ABLATION``), default recipe, D = 128, 64 MiB per tensor:
    % of copy, appended to rows (``"ablation"``) and printed as one line."""
    import torch

    from fa_variants.fp8 import FP8Config, quant_host
    from fa_variants.fp8.quantize import quantize_fp8_torch

    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(1, 16384, 16, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = (torch.randn(1, 16384, 16, 128, device="cuda", generator=g) + 1).to(torch.bfloat16)
    v = torch.randn(1, 16384, 16, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    cells = []
    for label, (pipe, knobs) in ABLATION.items():
        saved = {name: getattr(quant_host, name) for name in knobs}
        try:
            for name, value in knobs.items():
                setattr(quant_host, name, value)
            fn = lambda: quant_host.quantize(q, k, v, config=FP8Config(), pipeline=pipe)  # noqa: E731
            out = fn()
            # the torch recipe's bytes, given the variant's own K mean (the fused mean sums in another order)
            same = matches(out, quantize_fp8_torch(q, k, v, config=FP8Config(), k_mean=out.k_mean))
            ms, queued = timer.gpu_ms(fn, calls)
            frac = moved_bytes(q, k, out, True) / ms / 1e9 / copy_tbs
        finally:
            for name, value in saved.items():
                setattr(quant_host, name, value)
        rows.append({"ablation": label, "gpu_ms": ms, "of_copy": frac, "queued": queued, "match": same})
        cells.append(f"{label} {100 * frac:.1f}%" + ("" if same == "ok" else f" ({same})"))
    print("ablation (D=128 default recipe, % of copy): " + ", ".join(cells), flush=True)


BYTE_MODEL = ("byte model: q, k, v read once in 16 bits + e4m3 q, k, v_t (padded) written + float32 descales "
              "(+ float32 LSE shift with smoothing) written; K's second read for its mean not counted; "
              "% copy = (bytes / gpu time) / (torch copy of 2 GiB: read + write bytes / time)")


def ab_lines(rows: list[dict], old: str, new: str, copy_tbs: float = 0.0) -> str:
    """Per (shape, recipe) timed by both: NEW's gpu ms / OLD's (< 1: NEW faster), % of copy of each, (with --graph)
    the same ratio by CUDA graph replay, the host's ms per call of each, and (with --breakdown) each launch's us, OLD
    -> NEW (with copy_tbs: and each launch's % of copy, ``pass_shares``; with --b2b: back to back, with the period and
    gaps). A last line: the worst and best ratio."""
    by = {(r["shape"], r["recipe"], r["pipeline"]): r for r in rows}
    lines, ratios = [f"\nA/B {new} vs {old} (gpu ms ratio, < 1 = {new} faster; % of copy; kernels us)"], []
    for shape, recipe in dict.fromkeys((r["shape"], r["recipe"]) for r in rows):
        a, b = by.get((shape, recipe, old)), by.get((shape, recipe, new))
        if a is None or b is None:
            continue
        ratio = b["gpu_ms"] / a["gpu_ms"]
        ratios.append((ratio, shape, recipe))
        ka, kb = a.get("kernels", ""), b.get("kernels", "")
        g_ratio = b.get("graph_ms", float("nan")) / a.get("graph_ms", float("nan"))
        lines.append(f"  {shape:<11} {recipe:<9} {ratio:.3f}  {100 * a['of_copy']:5.1f}% -> {100 * b['of_copy']:5.1f}%"
                     + (f"  graph {g_ratio:.3f}" if g_ratio == g_ratio else "")
                     + (f"  host ms {a['host_ms']:.3f} -> {b['host_ms']:.3f}" if "host_ms" in a and "host_ms" in b
                        else "")
                     + (f"  [{ka.split(': ', 1)[-1]}] -> [{kb.split(': ', 1)[-1]}]" if ka and kb else ""))
        if copy_tbs and pass_shares(a, copy_tbs) and pass_shares(b, copy_tbs):
            lines.append(f"    per pass (% of copy for its bytes): [{pass_shares(a, copy_tbs)}] -> "
                         f"[{pass_shares(b, copy_tbs)}]")
        if copy_tbs and pass_shares(a, copy_tbs, "kernels_b2b") and pass_shares(b, copy_tbs, "kernels_b2b"):
            lines.append(f"    back to back: [{pass_shares(a, copy_tbs, 'kernels_b2b')}; {a.get('b2b_gaps', '')}] -> "
                         f"[{pass_shares(b, copy_tbs, 'kernels_b2b')}; {b.get('b2b_gaps', '')}]")
    if ratios:
        lines.append(f"AB {new}/{old}: worst {max(ratios)[0]:.3f} ({' '.join(max(ratios)[1:])}), best "
                     f"{min(ratios)[0]:.3f} ({' '.join(min(ratios)[1:])}), all matched: "
                     f"{all(r['match'] == 'ok' for r in rows if r['pipeline'] in (old, new))}")
    return "\n".join(lines)


def summarise(rows: list[dict], copy_tbs: float, pipelines: list[str]) -> int:
    """The tail: % of copy per shape and recipe, pipeline by pipeline; SUMMARY per pipeline (PASS: every row
    matched, was timed with the host out of the way, and reached TARGET); returns 0 if the last pipeline passed and no
    row of any pipeline differed from the torch recipe (a mismatch in an earlier pipeline failed nothing before)."""
    print(f"\n% of copy ({copy_tbs:.2f} TB/s), {' -> '.join(pipelines)} ({BYTE_MODEL.split(';')[0]})")
    by = {(r["shape"], r["recipe"], r["pipeline"]): r for r in rows}
    for shape, recipe in dict.fromkeys((r["shape"], r["recipe"]) for r in rows):
        cells = [by.get((shape, recipe, p)) for p in pipelines]
        missing = any(c is None for c in cells)  # a skipped cell: name each one
        text = " -> ".join((f"{c['pipeline']} " if missing else "") + f"{100 * c['of_copy']:5.1f}%"
                           + ("" if c["match"] == "ok" else " MISMATCH") for c in cells if c)
        print(f"  {shape:<11} {recipe:<9} {text}")
    for key, what in (("graph_of_copy", "by CUDA graph replay (GPU only)"),
                      ("eager_of_copy", "end to end (one eager call: host work included)")):
        if not any(key in r and r[key] == r[key] for r in rows):
            continue
        print(f"% of copy {what}, {' -> '.join(pipelines)}; host ms per call")
        for shape, recipe in dict.fromkeys((r["shape"], r["recipe"]) for r in rows):
            cells = [c for c in (by.get((shape, recipe, p)) for p in pipelines) if c]
            print(f"  {shape:<11} {recipe:<9} " + " -> ".join(f"{100 * c.get(key, float('nan')):5.1f}%" for c in cells)
                  + "; " + " -> ".join(f"{c.get('host_ms', float('nan')):.3f}" for c in cells))
    rc = 0
    for p in pipelines:
        mine = [r for r in rows if r["pipeline"] == p]
        ok = all(r["match"] == "ok" and r["queued"] and r["of_copy"] >= TARGET for r in mine)
        worst = min(mine, key=lambda r: r["of_copy"])
        print(f"SUMMARY fp8_quant_bandwidth {p}: {'PASS' if ok else 'FAIL'} (target {100 * TARGET:.0f}% of copy; "
              f"worst {100 * worst['of_copy']:.1f}% at {worst['shape']} {worst['recipe']}; copy {copy_tbs:.2f} "
              f"TB/s; all rows match the torch recipe: {all(r['match'] == 'ok' for r in mine)})")
        rc = 0 if ok else 1
        for recipe in dict.fromkeys(r["recipe"] for r in mine):
            part = [r for r in mine if r["recipe"] == recipe]
            ok_r = all(r["match"] == "ok" and r["queued"] and r["of_copy"] >= TARGET for r in part)
            worst = min(part, key=lambda r: r["of_copy"])
            print(f"SUMMARY fp8_quant_bandwidth {p} {recipe}: {'PASS' if ok_r else 'FAIL'} (worst "
                  f"{100 * worst['of_copy']:.1f}% at {worst['shape']}; "
                  + ", ".join(f"{r['shape']} {100 * r['of_copy']:.1f}%" for r in part) + ")")
    return 1 if any(r["match"] != "ok" for r in rows) else rc


if __name__ == "__main__":
    raise SystemExit(main())
