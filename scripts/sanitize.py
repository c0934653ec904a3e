"""compute-sanitizer over every kernel backend: memcheck, racecheck and synccheck, one summary line each.

    python3 scripts/sanitize.py                      # every tool x every kernel backend this GPU runs
    python3 scripts/sanitize.py --tools memcheck --backends fa2 --timeout 120
    python3 scripts/sanitize.py --tools memcheck --backends fa3-fp8 --head-dims 64 96 128 256 --per-head-dim --precompile

Each (tool, backend) pair is one process, ``compute-sanitizer --tool T --report-api-errors no
--error-exitcode 9 python3 scripts/sanitize.py --worker --backend B``, all started at once (compiling the
kernels is CPU work; the sanitized launches are small), each with its own time limit. The worker runs small
shapes chosen to reach the code paths where memory and synchronisation bugs live: tile tails (seqlens that
are no multiple of any tile), causal with seqlen_q != seqlen_k (both ways: rows that see no key), decode
(seqlen_q = 1), GQA and MQA, per-sequence KV lengths (seqlens_k, the cache past each length NaN) on fa2 and fa3,
split-KV and packed GQA forced by num_splits / pack_gqa on fa2 and fa3 (with
--fused-merge, fa3 once more with the split merge fused into the kernel), at every head_dim the backend serves (64, 96, 128, 256), and checks each output
against the float64 reference. PyTorch's caching allocator is turned off in the worker
(PYTORCH_NO_CUDA_MEMORY_CACHING=1) so that an out-of-bounds access leaves its own allocation and memcheck
sees it. Summary line per pair: tool, backend, "clean" or the error count, the checked calls, seconds.
Logs: one file per pair under --out ($OUT, else results/sanitize-<date>-<time>). Exit status 1 if any pair
reported an error, failed a check or timed out. --head-dims limits the head dims; --per-head-dim runs one sanitized
process per (tool, backend, head_dim) (logs TOOL-BACKEND-dD.log), side by side; --precompile first runs the same
calls without the sanitizer, one process per (backend, head_dim, causal), all at once, so the kernels are in the
disk compile cache before the sanitized processes start (a cold machine: compiling is most of the time).

Expected time on an H200 (16 CPU cores): about 3-5 minutes for the 9 pairs (racecheck is the slowest).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "synccheck")
KERNELS = ("fa1", "fa2", "fa3", "fa3-fp8")
# (batch, seqlen_q, seqlen_k, num_heads, num_heads_kv, causal): tails, Nq != Nk both ways, decode, GQA, MQA; the last
# two fill the GPU's SMs with short rows, so fa3 runs its persistent grid there at head_dim 64 / 128 (short_config)
SHAPES = ((2, 113, 203, 6, 2, True), (2, 113, 203, 6, 2, False), (1, 300, 129, 4, 1, True),
          (3, 1, 65, 8, 2, False), (1, 67, 67, 2, 2, True), (2, 300, 257, 48, 16, True), (2, 300, 257, 48, 16, False))
# fa3-fp8 only: more than 32 K/V tiles at every head_dim (tile_n <= 256), so each lane of the hoisted huge-logit vote
# (Fp8Config.huge_hoisted: a lane reads every 32nd tile's k_descale) reads twice, the last lanes past the end once
LONG_BACKENDS = ("fa3-fp8",)
LONG_SHAPES = ((1, 130, 8500, 2, 1, True), (1, 130, 8500, 2, 1, False))
# split-KV (Flash-Decoding) and packed GQA on the backends that have them, forced with num_splits / pack_gqa:
# one to a few query rows against odd K/V lengths, splits that leave the last one short or empty
SPLIT_BACKENDS = ("fa2", "fa3")
SPLIT_SHAPES = ((2, 1, 1000, 8, 2, True), (1, 3, 517, 8, 1, True), (3, 5, 300, 4, 4, False))
SPLIT_OPTIONS = ((3, False), (7, True), (1, True))
# per-sequence KV lengths read by the fa2 / fa3 kernels (seqlens_k; fa3 clears V's rows past a length in shared
# memory): (lengths, seqlen_q, padded seqlen_k, num_heads, num_heads_kv, causal), lengths 0 / 1 / tile edges, the
# cache past each length NaN; decode rows (auto: split and packed) and prefill rows
LENGTH_SHAPES = (([0, 1, 129, 300], 1, 300, 8, 2, True), ([127, 5, 0], 67, 257, 4, 1, True),
                 ([113, 256], 113, 256, 2, 2, False))


def plan(backend: str):
    """(dtype, head_dims) a backend is sanitised with: its first 16-bit dtype, every head_dim it serves."""
    import torch

    from fa_variants import dispatch

    variant = dispatch.get_backend(backend)
    dtype = next(d for d in (torch.bfloat16, torch.float16, getattr(torch, "float8_e4m3fn", None))
                 if d in variant.dtypes)
    return dtype, [d for d in (64, 96, 128, 256) if variant.head_dims is None or d in variant.head_dims]


def worker(backend: str, head_dims: list[int] | None = None, causal_only: int | None = None,
           shapes: str = "all") -> int:
    """Run the shapes on one backend (its head dims, or those of ``head_dims`` it serves; ``shapes`` "lengths": the
    seqlens_k shapes only; ``causal_only`` 0 / 1: only
    the non-causal / causal shapes); print one line per call and 'CALLS n FAILED m' last."""
    import torch

    import fa_variants
    from fa_variants.reference import attention_reference, check_against_reference, references, rel_l2

    dtype, served = plan(backend)
    head_dims = [d for d in served if head_dims is None or d in head_dims]
    keep = lambda shape: causal_only is None or shape[-1] == bool(causal_only)  # noqa: E731
    calls = failed = 0
    for head_dim in head_dims:
        long_shapes = LONG_SHAPES if backend in LONG_BACKENDS else ()
        for batch, nq, nk, heads, heads_kv, causal in filter(keep, SHAPES + long_shapes if shapes == "all" else ()):
            make = lambda n, h: torch.randn(batch, n, h, head_dim, device="cuda").to(dtype)  # noqa: E731
            q, k, v = make(nq, heads), make(nk, heads_kv), make(nk, heads_kv)
            with torch.no_grad():
                out = fa_variants.attention(q, k, v, causal=causal, backend=backend)
            torch.cuda.synchronize()
            calls += 1
            what = f"{backend} d{head_dim} B{batch} Nq{nq} Nk{nk} H{heads}/{heads_kv} causal={causal}"
            if dtype.itemsize == 1:  # FP8 has its own accuracy tests: here only finiteness
                ok = bool(torch.isfinite(out.float()).all())
            elif backend == "fa3-fp8":  # 16-bit inputs quantised to e4m3: ~5% rel-L2 is its noise (the bf16 rule
                exact = attention_reference(q, k, v, causal=causal, dtype=torch.float64)[0]  # cannot apply)
                ok = bool(torch.isfinite(out).all()) and rel_l2(out, exact) < 0.1
            else:
                ok = check_against_reference(out, q, k, v, causal).ok
            failed += not ok
            print(f"{what}: {'ok' if ok else 'WRONG OUTPUT'}", flush=True)
        for batch, nq, nk, heads, heads_kv, causal in filter(keep, SPLIT_SHAPES if backend in SPLIT_BACKENDS and
                                                             shapes == "all" else ()):
            for num_splits, pack_gqa in SPLIT_OPTIONS:
                pack_gqa = pack_gqa and (backend == "fa3" or nq == 1)  # fa2 packs one query row only
                make = lambda n, h: torch.randn(batch, n, h, head_dim, device="cuda").to(dtype)  # noqa: E731
                q, k, v = make(nq, heads), make(nk, heads_kv), make(nk, heads_kv)
                with torch.no_grad():
                    out = fa_variants.attention(q, k, v, causal=causal, backend=backend, num_splits=num_splits,
                                                pack_gqa=pack_gqa)
                torch.cuda.synchronize()
                calls += 1
                ok = check_against_reference(out, q, k, v, causal).ok
                failed += not ok
                print(f"{backend} d{head_dim} B{batch} Nq{nq} Nk{nk} H{heads}/{heads_kv} causal={causal} "
                      f"num_splits={num_splits} pack_gqa={pack_gqa}: {'ok' if ok else 'WRONG OUTPUT'}", flush=True)
        for lengths, nq, nk, heads, heads_kv, causal in filter(keep, LENGTH_SHAPES if backend in SPLIT_BACKENDS else ()):
            make = lambda b, n, h: torch.randn(b, n, h, head_dim, device="cuda").to(dtype)  # noqa: E731
            q, k, v = make(len(lengths), nq, heads), make(len(lengths), nk, heads_kv), make(len(lengths), nk, heads_kv)
            seqlens_k = torch.tensor(lengths, dtype=torch.int32, device="cuda")
            for b, n in enumerate(lengths):  # the padding is never read (fa2) or never reaches O (fa3)
                k[b, n:], v[b, n:] = float("nan"), float("nan")
            with torch.no_grad():
                out = fa_variants.attention(q, k, v, causal=causal, backend=backend, seqlens_k=seqlens_k)
            torch.cuda.synchronize()
            calls += 1
            refs = references(q, k, v, causal=causal, seqlens_k=seqlens_k)
            ok = bool((out[seqlens_k == 0] == 0).all()) and check_against_reference(out, q, k, v, causal, refs=refs).ok
            failed += not ok
            print(f"{backend} d{head_dim} lengths={lengths} Nq{nq} Nk{nk} H{heads}/{heads_kv} causal={causal}: "
                  f"{'ok' if ok else 'WRONG OUTPUT'}", flush=True)
    print(f"CALLS {calls} FAILED {failed}", flush=True)
    return 1 if failed else 0


def _runnable_backends(requested: list[str]) -> tuple[list[str], list[str]]:
    """The requested kernel backends this GPU runs, and a line for each it does not."""
    import torch

    from fa_variants import dispatch

    capability = dispatch.device_capability(torch.device("cuda"))
    runnable, skipped = [], []
    for name in requested:
        problem = None
        if name not in dispatch.backends_for(capability):
            problem = f"does not target {dispatch.arch_name(capability)}"
        elif isinstance(dispatch.load(name), str):
            problem = dispatch.load(name)
        (skipped.append(f"{name}: skipped ({problem})") if problem else runnable.append(name))
    return runnable, skipped


def _summary(tool: str, backend: str, rc: int | None, log: str, seconds: float) -> tuple[str, bool]:
    # memcheck/synccheck: "ERROR SUMMARY: n errors"; racecheck: "RACECHECK SUMMARY: h hazards displayed (n errors, ...)"
    errors = re.search(r"ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error", log)
    calls = re.search(r"CALLS (\d+) FAILED (\d+)", log)
    n_err = int(errors.group(1) or errors.group(2)) if errors else None
    if rc is None:
        verdict, ok = "TIMED OUT", False
    elif calls and calls.group(1) == "0":  # a run that checked nothing is no evidence
        verdict, ok = "NO CALLS", False
    elif n_err == 0 and calls and calls.group(2) == "0" and rc == 0:
        verdict, ok = "clean", True
    elif n_err:
        verdict, ok = f"{n_err} ERRORS", False
    elif calls and calls.group(2) != "0":
        verdict, ok = f"{calls.group(2)} WRONG OUTPUTS", False
    else:
        verdict, ok = f"FAILED (exit {rc}, see the log)", False
    done = f"{calls.group(1)} calls" if calls else "no calls finished"
    return f"{tool:9s} {backend:8s} {verdict} ({done}, {seconds:.0f} s)", ok


def _precompile(out: Path, runs: list, timeout: float, shapes: str = "all") -> bool:
    """The runs' calls without the sanitizer, one process per (run, head_dim, causal), all at once (their kernels
    into the disk compile cache); one summary line; False if one failed or timed out."""
    start, procs = time.monotonic(), []
    for name, backend, run_env, head_dims in runs:
        for d in head_dims:
            for causal in (0, 1):
                label = name if name.endswith(f"-d{d}") else f"{name}-d{d}"  # --per-head-dim names carry it
                log = open(out / f"precompile-{label}-c{causal}.log", "w")
                cmd = [sys.executable, __file__, "--worker", "--backend", backend, "--head-dims", str(d),
                       "--causal-only", str(causal), "--shapes", shapes]
                procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=run_env), log))
    failed = 0
    for proc, log in procs:
        try:
            failed += proc.wait(timeout=max(timeout - (time.monotonic() - start), 1)) != 0
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            failed += 1
        log.close()
    print(f"precompile: {len(procs)} processes, {failed} failed, {time.monotonic() - start:.0f} s", flush=True)
    return failed == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    parser.add_argument("--backends", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--timeout", type=float, default=280, help="seconds per (tool, backend) (default 280)")
    parser.add_argument("--sanitizer", default=None, help="compute-sanitizer binary (default: PATH, CUDA_HOME)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--fused-merge", action="store_true",
                        help="also run fa3 with FA_VARIANTS_FUSED_MERGE=all (the split merge inside the kernel)")
    parser.add_argument("--head-dims", nargs="+", type=int, default=None,
                        help="only these head dims (of those each backend serves; default all)")
    parser.add_argument("--per-head-dim", action="store_true",
                        help="one sanitized process per (tool, backend, head_dim), side by side")
    parser.add_argument("--precompile", action="store_true",
                        help="first the same calls without the sanitizer, one process per (backend, head_dim, causal)")
    parser.add_argument("--shapes", choices=("all", "lengths"), default="all",
                        help="lengths: only the per-sequence KV length shapes (fa2, fa3)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--causal-only", type=int, choices=(0, 1), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.backend, args.head_dims, args.causal_only, args.shapes)

    sanitizer = args.sanitizer or shutil.which("compute-sanitizer") or next(
        (str(p) for p in (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "compute-sanitizer",)
         if p.exists()), None)
    if sanitizer is None:
        print("sanitize: compute-sanitizer not found (PATH, $CUDA_HOME/bin); pass --sanitizer", file=sys.stderr)
        return 2
    out = args.out or Path(os.environ.get("OUT") or f"results/sanitize-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    backends, skipped = _runnable_backends(args.backends)
    if args.shapes == "lengths":  # only the backends whose kernels read the lengths have such shapes
        skipped += [f"{b}: skipped (--shapes lengths: its kernels do not read seqlens_k)" for b in backends
                    if b not in SPLIT_BACKENDS]
        backends = [b for b in backends if b in SPLIT_BACKENDS]
    for line in skipped:
        print(line, flush=True)
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1",
               PYTHONPATH=os.pathsep.join(filter(None, (str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH")))))
    dims = lambda backend: [d for d in plan(backend)[1] if args.head_dims is None or d in args.head_dims]  # noqa: E731
    runs = [(backend, backend, env, None) for backend in backends]
    if args.fused_merge and "fa3" in backends:
        runs.append(("fa3+fused", "fa3", dict(env, FA_VARIANTS_FUSED_MERGE="all"), None))
    if args.per_head_dim:
        runs = [(f"{name}-d{d}", backend, run_env, [d]) for name, backend, run_env, _ in runs for d in dims(backend)]
    elif args.head_dims:
        runs = [(name, backend, run_env, args.head_dims) for name, backend, run_env, _ in runs]
    all_ok = True
    if args.precompile:
        all_ok &= _precompile(out, [(name, backend, run_env, dims_ or dims(backend)) for name, backend, run_env, dims_
                                    in runs], args.timeout, args.shapes)
    jobs = {}
    for tool in args.tools:
        for name, backend, run_env, head_dims in runs:
            log = out / f"{tool}-{name}.log"
            cmd = [sanitizer, "--tool", tool, "--report-api-errors", "no", "--error-exitcode", "9",
                   sys.executable, __file__, "--worker", "--backend", backend, "--shapes", args.shapes]
            cmd += ["--head-dims", *map(str, head_dims)] if head_dims else []
            handle = open(log, "w")
            jobs[(tool, name)] = (subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=run_env),
                                  handle, log, time.monotonic())
    while jobs:
        for key, (proc, handle, log, start) in list(jobs.items()):
            elapsed = time.monotonic() - start
            if proc.poll() is None and elapsed < args.timeout:
                continue
            rc = proc.poll()
            if rc is None:
                proc.kill()
                proc.wait()
            handle.close()
            line, ok = _summary(*key, rc, log.read_text(errors="replace"), elapsed)
            print(line, flush=True)
            all_ok &= ok
            del jobs[key]
        time.sleep(1)
    print(f"logs in {out}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
