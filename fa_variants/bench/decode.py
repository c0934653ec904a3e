"""`fa-variants bench --decode`: the decode table of issue 13 (a few query rows against a long KV cache).

Cases: Nq in (1, 4, 16) x Nk in (1k, 4k, 32k, 128k) x batch in (1, 8, 64) x GQA (32:8, 64:8) x head_dim
(64, 128), bf16 (``--quick``: a 16-case subset). Implementations: ours through ``fa_variants.attention``
(``auto``: the dispatcher picks fa3 on sm90 and its split-KV for these shapes), PyTorch SDPA with its own
backend choice, flash-attn-4 (``flash_attn.cute``) when importable.

Per case and implementation:
* GPU time per call: each implementation's calls captured in a CUDA graph (a burst of about BURST_MS), the
  implementations of a case timed by the paired protocol of ``bench.paired`` (ROUNDS rounds of CYCLES cycles, each
  cycle the bursts back to back in a rotated order, the next reversed; WARMUP_MS of bursts first): the median over
  rounds of its ms per call, the kernel(s) alone, without Python. The ratio to the reference (SDPA) is the median
  of the per-cycle-pair ratios, so both sides of it ran at the same clock (an H200 at its power cap moves between
  ~1300 and ~1980 MHz); the SM clock and power during each entry's bursts go to the JSON. If capture fails, eager
  calls between the events instead (the timer column says which; then host time may dominate it).
* host time per call: wall clock of 200 back-to-back calls (fewer past 0.25 ms each), synchronised once at the end (the
  issue's measure: the Python path to the launch, for an already compiled configuration).
* HBM bandwidth: K and V bytes (batch x Nk x Hkv x D x 2 tensors x 2 bytes) / GPU time, and its share of
  the GPU's peak (``--peak-tbps``; by default the datasheet figure of the GPU's name, ``PEAK_TBPS``, else from its
  memory clock and bus width where torch reports them; otherwise the command asks for ``--peak-tbps``).

``--decode-lengths`` (a ragged KV cache, issue 13's per-sequence KV lengths): each sequence b of a case uses only its
first lengths[b] keys of the padded cache (lengths drawn once per case, uniform in [1, Nk], seeded, the first one
Nk): ours with ``seqlens_k=`` (fa3 reads them in the kernel, one launch; also with the lengths on the CPU: no
device sync per call), flash-attn-4 with ``seqused_k=``, SDPA
with a boolean mask of each sequence's visible keys (its own backend choice for a masked call); the HBM columns then
count the K/V bytes of the used keys only.

Masks: ours and flash-attn-4 run causal=True (bottom-right: the real decode mask); SDPA runs is_causal=False,
since its is_causal is top-left aligned (row 0 would see key 0 only). At Nq = 1 both masks are the same; at
Nq = 4, 16 the causal rows skip at most Nq - 1 of Nk keys.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

NQ = (1, 4, 16)
NK = (1024, 4096, 32768, 131072)
BATCH = (1, 8, 64)
GQA = ((32, 8), (64, 8))
HEAD_DIMS = (64, 128)
#: HBM peak in TB/s by device name (NVIDIA's datasheets), the first listed substring of the name that matches;
#: None: the name alone does not say (GH200 ships with HBM3 or HBM3e, the H20-3e with HBM3e; an A100 not named
#: here: 40 or 80 GB, PCIe or SXM)
PEAK_TBPS = (("GH200", None), ("H200", 4.8), ("H100 NVL", 3.9), ("H100 PCIe", 2.0), ("H100", 3.35), ("H20-3e", None),
             ("H20", 4.0), ("B200", 8.0), ("A100-SXM4-80GB", 2.039), ("A100 80GB PCIe", 1.935),
             ("A100-SXM4-40GB", 1.555), ("A100-PCIE-40GB", 1.555), ("A100", None))
QUICK = dict(nq=(1, 16), nk=(4096, 131072), batch=(1, 64), gqa=((32, 8),), head_dims=(128,))


@dataclass(frozen=True)
class DecodeCase:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    heads_kv: int
    head_dim: int

    @property
    def kv_bytes(self) -> int:
        """K and V bytes read once (bf16)."""
        return 2 * self.batch * self.seqlen_k * self.heads_kv * self.head_dim * 2


def cases(quick: bool = False, **subset) -> list[DecodeCase]:
    """The decode table's cases, largest K/V last within each head dim; ``subset`` (nq, nk, batch, head_dims: a
    tuple, or None for all) keeps the cases with those values (``--decode-nq`` etc.)."""
    p = QUICK if quick else dict(nq=NQ, nk=NK, batch=BATCH, gqa=GQA, head_dims=HEAD_DIMS)
    p = dict(p, **{key: values for key, values in subset.items() if values})
    return [DecodeCase(b, nq, nk, h, hkv, d) for d, (h, hkv), b, nk, nq in
            itertools.product(p["head_dims"], p["gqa"], p["batch"], p["nk"], p["nq"])]


def implementations(ragged: bool = False) -> dict:
    """name -> fn(q, k, v, lengths) for ours and the peers importable here; ``lengths`` (``ragged``: int32 (batch,)
    per-sequence KV lengths, the SDPA mask they give (``ragged_lengths``) and the lengths on the CPU) or None."""
    import torch.nn.functional as F

    import fa_variants

    if ragged:
        impls = {
            "ours (seqlens_k)": lambda q, k, v, lengths: fa_variants.attention(q, k, v, causal=True,
                                                                               seqlens_k=lengths[0]),
            # the same lengths kept on the CPU: checked on the host, copied without a sync (not capturable: its
            # GPU time comes from a loop of calls)
            "ours (seqlens_k on CPU)": lambda q, k, v, lengths: fa_variants.attention(q, k, v, causal=True,
                                                                                      seqlens_k=lengths[2]),
            "sdpa (mask)": lambda q, k, v, lengths: F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=lengths[1], enable_gqa=True),
        }
    else:
        impls = {
            "ours (auto)": lambda q, k, v, lengths: fa_variants.attention(q, k, v, causal=True),
            "sdpa (auto)": lambda q, k, v, lengths: F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True),
        }
    try:
        from flash_attn.cute.interface import flash_attn_func, flash_attn_varlen_func
    except Exception:  # noqa: BLE001 - not installed here
        pass
    else:
        if ragged:
            impls["flash-attn-4"] = lambda q, k, v, lengths: flash_attn_varlen_func(q, k, v, seqused_k=lengths[0],
                                                                                    causal=True)
        else:
            impls["flash-attn-4"] = lambda q, k, v, lengths: flash_attn_func(q, k, v, causal=True)
    return impls


def ragged_lengths(case: DecodeCase, generator, device="cuda") -> tuple:
    """(lengths, mask): int32 (batch,) KV lengths uniform in [1, seqlen_k] (the first = seqlen_k), and the boolean
    SDPA mask (batch, 1, seqlen_q, seqlen_k) of the keys each query row sees: key j < lengths[b], causal bottom-right
    against that length (j <= i + lengths[b] - seqlen_q)."""
    import torch

    lengths = torch.randint(1, case.seqlen_k + 1, (case.batch,), device=device, generator=generator, dtype=torch.int32)
    lengths[0] = case.seqlen_k
    j = torch.arange(case.seqlen_k, device=device)
    i = torch.arange(case.seqlen_q, device=device)
    end = lengths.view(-1, 1, 1).long()
    mask = (j.view(1, 1, -1) < end) & (j.view(1, 1, -1) <= i.view(1, -1, 1) + end - case.seqlen_q)
    return lengths, mask.unsqueeze(1)


def peak_tbps(name: str, props=None) -> tuple[float, str]:
    """(HBM peak in TB/s, where it came from) for a GPU named ``name`` (``torch.cuda.get_device_name``): the
    ``PEAK_TBPS`` entry of its name, else memory clock (kHz) x bus width (bits) x 2 (double data rate) from
    ``props`` (``torch.cuda.get_device_properties``) where torch reports them. ValueError naming ``--peak-tbps``
    where neither says."""
    for key, tbps in PEAK_TBPS:
        if key.lower() in name.lower():
            if tbps is not None:
                return tbps, f"datasheet ({key})"
            break
    clock, width = getattr(props, "memory_clock_rate", 0) or 0, getattr(props, "memory_bus_width", 0) or 0
    if clock > 0 and width > 0:
        return clock * 1e3 * width / 8 * 2 / 1e12, "memory clock x bus width"
    raise ValueError(f"the HBM peak of {name!r} is not known here: pass --peak-tbps (TB/s)")


def gpu_identity() -> tuple:
    """(name, properties) of the current CUDA device, for ``peak_tbps``: the same device for both."""
    import torch

    device = torch.cuda.current_device()
    return torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device)


def capture_graph(fn, calls: int = 1):
    """(graph, results): a CUDA graph of `calls` calls of fn, captured on a side stream (the current stream waits
    for it), and the list of fn's results in the capture (tensors that each replay writes again)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        results = [fn() for _ in range(calls)]
    torch.cuda.current_stream().wait_stream(stream)
    return graph, results


def cuda_graph_of(fn, calls: int):
    """A CUDA graph of `calls` calls of fn: :func:`capture_graph`'s graph."""
    return capture_graph(fn, calls)[0]


def median_ms(run, calls: int, reps: int) -> float:
    """Median over ``reps`` runs of ``run()`` (e.g. a CUDA graph's replay holding ``calls`` calls) of its GPU time
    (CUDA events) per call, in ms."""
    import torch

    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


#: the paired protocol's settings for the decode table (module docstring): 6 rounds of one forward and one reversed
#: cycle, bursts of ~5 ms (a call longer than that is a burst of one), 25 ms of warm-up bursts per case
ROUNDS, CYCLES, BURST_MS, WARMUP_MS = 6, 2, 5.0, 25.0


def paired_times(fns: dict, ref: str | None, timer, rounds: int = ROUNDS) -> dict[str, dict]:
    """Time ``fns`` (name -> a call) by ``bench.paired.paired_ab`` with ``timer`` (a ``BurstTimer``): per name,
    gpu_us (median over rounds of its us per call), gpu_us_rounds, timer (how it was timed), sm_mhz / power_w (means
    over its bursts), and with a reference ``ref`` among the names, ratio_to_ref: its time over ref's, the median of
    the paired samples (< 1: faster than ref)."""
    from fa_variants.bench import paired

    names = list(fns)
    base = ref if ref in fns else names[0]
    result = paired.paired_ab([paired.Entry(n, fns[n]) for n in names], base, timer, rounds=rounds, cycles=CYCLES,
                              burst_ms=BURST_MS, warmup_ms=WARMUP_MS, control=False)
    out = {}
    for name in names:
        per_round = [ms * 1e3 for ms in result.times(name)]
        mhz, watts = result.clocks(name)
        out[name] = dict(gpu_us=statistics.median(per_round), gpu_us_rounds=per_round, timer=result.how[name],
                         sm_mhz=mhz, power_w=watts)
        if ref in fns:
            out[name]["ratio_to_ref"] = 1.0 / result.median_ratio(name, ref)
    return out


def _host_us(fn, calls: int = 200) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def _inputs(case: DecodeCase, ragged: bool):
    """(q, k, v, lengths or None, K/V bytes read) of a case on the GPU, seeded."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(case.batch, case.seqlen_q, case.heads, case.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(case.batch, case.seqlen_k, case.heads_kv, case.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    lengths, kv_bytes = None, case.kv_bytes
    if ragged:  # the bytes of the keys used
        lengths = ragged_lengths(case, g)
        lengths = (*lengths, lengths[0].cpu())
        kv_bytes = kv_bytes * int(lengths[0].sum()) // (case.batch * case.seqlen_k)
    return q, k, v, lengths, kv_bytes


def measure(case: DecodeCase, impls: dict, peak_tbps: float, ragged: bool = False) -> list[dict]:
    """One row per implementation of ``impls`` for ``case``; a case whose inputs do not fit the GPU's memory gets
    error rows (the "error" cell), and the table goes on (a 24 GB card lacks the 32 GiB of K / V of B 64 Nk 128k;
    an implementation's own failure, in its first calls or its timing (``_timed``), is its row's error)."""
    import torch

    try:
        q, k, v, lengths, kv_bytes = _inputs(case, ragged)
    except torch.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        return [dict(asdict(case), impl=name, error=f"inputs: {_error(exc)}") for name in impls]
    rows, fns, fn = {}, {}, None
    for name, impl in impls.items():  # each implementation's first calls (compiles, plans): errors recorded here
        rows[name] = row = dict(asdict(case), impl=name)
        if ragged:
            row["lengths"] = lengths[0].tolist()
        fn = lambda impl=impl, q=q, k=k, v=v: impl(q, k, v, lengths)  # noqa: E731
        try:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            fns[name] = fn
        except Exception as exc:  # noqa: BLE001 - recorded, the table goes on
            row["error"] = _error(exc)
            torch.cuda.empty_cache()
    if fns:
        timed = _timed(fns, reference_name(ragged))
        for name, fn in fns.items():
            row = rows[name]
            row.update(timed[name])
            if "error" in row:
                continue
            ms = row["gpu_us"] * 1e-3
            row["host_us"] = _host_us(fn, max(10, min(200, int(50 / ms))))  # about 50 ms of calls at most
            row["tbps"] = kv_bytes / (ms * 1e-3) / 1e12
            row["hbm_share"] = row["tbps"] / peak_tbps
    del q, k, v, fns, fn
    torch.cuda.empty_cache()
    return list(rows.values())


def _timed(fns: dict, ref: str) -> dict[str, dict]:
    """``paired_times`` of fns; if it fails, each implementation alone (two rounds) to find the failing ones (their
    rows get the error), then the paired timing of the others: one implementation's failure (e.g. out of memory in
    its graph) does not take the case's other rows with it."""
    import torch

    try:
        return paired_times(fns, ref, _timer())
    except Exception:  # noqa: BLE001 - narrowed down below
        torch.cuda.empty_cache()
    failed, ok = {}, {}
    for name, fn in fns.items():
        try:
            paired_times({name: fn}, None, _timer(), rounds=2)
            ok[name] = fn
        except Exception as exc:  # noqa: BLE001 - recorded in its row
            failed[name] = dict(error=_error(exc))
            torch.cuda.empty_cache()
    try:
        return {**failed, **(paired_times(ok, ref, _timer()) if ok else {})}
    except Exception as exc:  # noqa: BLE001 - fails only together: recorded for all of them
        return {**failed, **{name: dict(error=_error(exc)) for name in ok}}


def reference_name(ragged: bool = False) -> str:
    """The implementation every other one is compared with: SDPA (with a mask for a ragged cache)."""
    return "sdpa (mask)" if ragged else "sdpa (auto)"


def _timer():
    """The GPU's burst timer, trusting each graph (the old table's rule: a call with seqlens_k on the GPU reads them
    back when launched eagerly, so its eager time is the host's, not a sign of work escaping the capture)."""
    from fa_variants.bench.runtime import GraphBurstTimer

    return GraphBurstTimer(escape_check=False)


def _error(exc: BaseException) -> str:
    from fa_variants.bench.core import short_error

    return f"{type(exc).__name__}: {short_error(exc)[:120]}"


def table(rows: list[dict]) -> str:
    """Markdown: one line per case and implementation."""
    head = "| D | GQA | batch | Nk | Nq | impl | GPU us | host us | TB/s | HBM % | timer |\n|" + "---|" * 11
    lines = [head]
    for r in rows:
        if "error" in r:
            cells = [r["impl"], r["error"], "", "", "", ""]
        else:
            cells = [r["impl"], f"{r['gpu_us']:.1f}", f"{r['host_us']:.1f}", f"{r['tbps']:.2f}",
                     f"{100 * r['hbm_share']:.0f}", r["timer"]]
        lines.append(f"| {r['head_dim']} | {r['heads']}:{r['heads_kv']} | {r['batch']} | {r['seqlen_k']} | "
                     f"{r['seqlen_q']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict], ours: str = "ours (auto)", ref: str = "sdpa (auto)") -> str:
    """Per implementation other than `ref`: the cases at or below `ref`'s GPU time, the geometric mean of the
    ratio, the worst case; and ours' lowest HBM share at Nk >= 32k (the issue's >= 70% target)."""
    import math

    key = lambda r: (r["head_dim"], r["heads"], r["heads_kv"], r["batch"], r["seqlen_k"], r["seqlen_q"])  # noqa: E731
    base = {key(r): r["gpu_us"] for r in rows if r["impl"] == ref and "gpu_us" in r}
    lines = [f"summary (GPU time / {ref}'s; paired per round where timed so):"]
    for impl in dict.fromkeys(r["impl"] for r in rows if r["impl"] != ref):
        ratios = [(r.get("ratio_to_ref", r["gpu_us"] / base[key(r)]), key(r)) for r in rows
                  if r["impl"] == impl and "gpu_us" in r and key(r) in base]
        if not ratios:
            lines.append(f"  {impl}: no case timed beside {ref}")
            continue
        gm = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
        worst = max(ratios)
        lines.append(f"  {impl}: <= {ref} at {sum(x <= 1.0 for x, _ in ratios)}/{len(ratios)} cases, geomean "
                     f"{gm:.3f}, worst {worst[0]:.2f} (D{worst[1][0]} {worst[1][1]}:{worst[1][2]} B{worst[1][3]} "
                     f"Nk{worst[1][4]} Nq{worst[1][5]})")
    long = [r for r in rows if r["impl"] == ours and "hbm_share" in r and r["seqlen_k"] >= 32768]
    if long:
        low = min(long, key=lambda r: r["hbm_share"])
        lines.append(f"  {ours} HBM share at Nk >= 32k: lowest {100 * low['hbm_share']:.0f}% (D{low['head_dim']} "
                     f"B{low['batch']} Nk{low['seqlen_k']} Nq{low['seqlen_q']}), >= 70% at "
                     f"{sum(r['hbm_share'] >= 0.7 for r in long)}/{len(long)} cases; target >= 70%")
    mhz = [r["sm_mhz"] for r in rows if not math.isnan(r.get("sm_mhz", math.nan))]
    watts = [r["power_w"] for r in rows if not math.isnan(r.get("power_w", math.nan))]
    if mhz:
        lines.append(f"  SM clock during the bursts {min(mhz):.0f}-{max(mhz):.0f} MHz"
                     + (f", power up to {max(watts):.0f} W" if watts else ""))
    return "\n".join(lines)


#: the largest seqlen (as `fa-variants bench --seqlens`) and batch a decode case may ask for
MAX_SEQLEN, MAX_BATCH = 1 << 20, 1 << 16


def _ints(text: str, high: int = MAX_SEQLEN) -> tuple:
    """argparse type: a comma list of sizes, each an int in [1, high]."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints") from None
    if any(x < 1 or x > high for x in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every size must be in 1..{high}")
    return values


def _batches(text: str) -> tuple:
    """argparse type: a comma list of batch sizes, each in [1, MAX_BATCH]."""
    return _ints(text, MAX_BATCH)


def _head_dims(text: str) -> tuple:
    """argparse type: a comma list of head dims, each a multiple of 8 in 8..256 (what the kernels are built for)."""
    values = _ints(text)
    if any(d % 8 or d > 256 for d in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every head dim must be a multiple of 8 in 8..256")
    return values


def configure_parser(p: argparse.ArgumentParser) -> None:
    from fa_variants.cli import positive_float

    g = p.add_argument_group("decode table (--decode)")
    g.add_argument("--decode", action="store_true", help="the decode table (issue 13) instead of the TFLOP/s sweep")
    g.add_argument("--peak-tbps", type=positive_float, default=None,
                   help="HBM peak in TB/s for the HBM %% column (default: the GPU's, H200 4.8, H100 SXM 3.35)")
    for name, what, kind in (("nq", "seqlen_q", _ints), ("nk", "seqlen_k", _ints), ("batch", "batch sizes", _batches)):
        g.add_argument(f"--decode-{name}", type=kind, metavar="LIST", help=f"only these {what} (comma list)")
    g.add_argument("--decode-head-dims", type=_head_dims, metavar="LIST",
                   help="only these head dims (comma list; multiples of 8 up to 256)")
    g.add_argument("--decode-no-fa4", action="store_true", help="ours and SDPA only (flash-attn-4 compiles per shape)")
    g.add_argument("--decode-lengths", action="store_true",
                   help="a ragged KV cache: per-sequence lengths in [1, Nk] (ours: seqlens_k=; SDPA: a mask)")


def run_cli(args: argparse.Namespace) -> int:
    """Print the decode table (and save it, with JSON, under --out when given)."""
    todo = cases(quick=args.quick, nq=getattr(args, "decode_nq", None), nk=getattr(args, "decode_nk", None),
                 batch=getattr(args, "decode_batch", None), head_dims=getattr(args, "decode_head_dims", None))
    if args.dry_run:
        print(f"decode table: {len(todo)} cases (bf16, causal): " + ", ".join(
            f"D{c.head_dim} {c.heads}:{c.heads_kv} B{c.batch} Nk{c.seqlen_k} Nq{c.seqlen_q}" for c in todo[:4]) + ", ...")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("fa-variants bench --decode: error: no CUDA GPU here (--dry-run lists the cases)", file=sys.stderr)
        return 2
    peak, source = args.peak_tbps, "--peak-tbps"
    if peak is None:
        try:
            peak, source = peak_tbps(*gpu_identity())
        except ValueError as exc:
            print(f"fa-variants bench --decode: error: {exc}", file=sys.stderr)
            return 2
    from fa_variants.bench.report import make_outdir

    out = make_outdir(Path(args.out)) if args.out else None  # before the cases, not after the whole table
    print(f"HBM peak {peak:g} TB/s ({source})", flush=True)
    ragged = getattr(args, "decode_lengths", False)
    impls = implementations(ragged)
    if getattr(args, "decode_no_fa4", False):
        impls.pop("flash-attn-4", None)
    rows = []
    try:
        for i, case in enumerate(todo):
            rows.extend(measure(case, impls, peak, ragged))
            print(f"[{i + 1}/{len(todo)}] {case}", flush=True)
    except KeyboardInterrupt:  # a GPU script's time limit (timeout -s INT): the table of the cases measured
        print(f"interrupted: {len({tuple(r[k] for k in ('head_dim', 'heads', 'batch', 'seqlen_k', 'seqlen_q')) for r in rows})}"
              f"/{len(todo)} cases measured", flush=True)
    sums = summary(rows, "ours (seqlens_k)", reference_name(True)) if ragged else summary(rows)
    text = table(rows) + "\n\n" + sums
    if out is not None:  # written before the print: a failing print cannot lose them
        meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, peak_tbps=peak, peak_source=source)
        (out / "decode.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1), encoding="utf-8")
        (out / "decode.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0
