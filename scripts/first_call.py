"""The first attention call of a fresh process: how long it takes with a cold or a warm disk compile cache,
and where that time goes.

    python scripts/first_call.py --backend fa3 [--head-dim 128]         # on a GPU: prints one JSON line
    python scripts/first_call.py --backend fa2 --load-only --arch sm_80  # no GPU: import + disk load only

Times, in this new process: the imports (torch, fa_variants), CUDA set-up with the inputs (a decode step:
batch 2, one query row, 1023 keys, GQA 32:8, bf16, causal; ``--seqlens-k``: the sequences' lengths 1023 and 500), then the first ``fa_variants.attention`` call to
its completion (synchronised), and a second call like it. The first call is broken down into phases
(``phases``, seconds; the functions are wrapped with timers, nothing else changes):

* ``backend_import_s``: importing the kernel module (the CuTe DSL, ``cutlass``, with it);
* ``disk_load_s``: `common.diskcache.load` (read and check the entry, load it), of which ``fingerprint_s``
  (hashing the kernel sources, once per process), ``load_shared_s`` (the entry's linked library through
  ``tvm_ffi.load_module``: the warm path, no DSL) or, for an entry without one, ``runtime_libs_s`` (the DSL's
  runtime libraries) and ``load_module_s`` (``cute.runtime.load_module``, the DSL imported with it);
* ``compile_s``: a cold cache's trace and compile (``cute.compile``, as `common.cache` timed it), absent when
  warm;
* ``first_launch_s``: the first call of the loaded function to its completion (loading the cubin into the
  CUDA context, building the launch, the kernel);
* ``rest_s``: what remains (validation, dispatch, the plan, allocations; when cold, the export to disk).

Reports also the compile cache's counters, how the entries were loaded (``loaded_by``: ``shared`` or ``dsl``),
whether the CuTe DSL was imported at all (``dsl_imported``: false on the warm path) and whether the output
passes the float64 rule. Issue 13's budget: <= 1 s for the first call with a warm disk cache
(FA_VARIANTS_CACHE_DIR); ``FA_VARIANTS_DISK_CACHE_LOADER=dsl`` measures the old way for comparison.
"""
from __future__ import annotations

import argparse
import json
import time

start = time.perf_counter()
phases: dict[str, float] = {}


def timed(name: str, fn, sync=None):
    """fn, adding the seconds each call takes to phases[name] (after sync(), if given)."""
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if sync is not None:
                sync()
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
    return wrapper


def instrument(sync=None) -> None:
    """Wrap the functions of the first call's phases (see the module docstring) with timers."""
    from fa_variants import registry
    from fa_variants.common import diskcache

    registry._import = timed("backend_import_s", registry._import)
    diskcache.fingerprint = timed("fingerprint_s", diskcache.fingerprint)
    diskcache._runtime_libraries = timed("runtime_libs_s", diskcache._runtime_libraries)
    diskcache._load_object = timed("load_module_s", diskcache._load_object)
    diskcache._load_shared = timed("load_shared_s", diskcache._load_shared)
    load = timed("disk_load_s", diskcache.load)

    def load_and_time_the_first_launch(cfg):
        stored = load(cfg)
        if stored is None:
            return None
        fn, *rest = stored
        return (first_launch(fn), *rest)

    def first_launch(fn):
        launched = []

        def call(*args):
            if launched:
                return fn(*args)
            launched.append(True)
            return timed("first_launch_s", fn, sync)(*args)
        return call

    diskcache.load = load_and_time_the_first_launch


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--backend", default="fa3")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seqlens-k", action="store_true",
                        help="the decode step with per-sequence KV lengths (1023 and 500 of the 1023 keys)")
    parser.add_argument("--load-only", action="store_true",
                        help="no GPU: time the backend import and the disk cache load (or compile) of --arch only")
    parser.add_argument("--arch", default="sm_90a", help="with --load-only: the compile target")
    args = parser.parse_args()
    if args.load_only and args.seqlens_k:
        parser.error("--seqlens-k times a call on the GPU; --load-only makes none")

    import torch

    import fa_variants
    from fa_variants.common import cache, diskcache

    imported = time.perf_counter()
    report = {"backend": args.backend, "head_dim": args.head_dim, "imports_s": round(imported - start, 3)}
    if args.load_only:
        import os

        from fa_variants import registry

        os.environ.setdefault("CUTE_DSL_ARCH", args.arch)
        instrument()
        t0 = time.perf_counter()
        cfg = registry.static_config(args.backend, args.arch, "bf16", args.head_dim, True)
        registry.compiled(cfg)
        report["load_s"] = round(time.perf_counter() - t0, 4)
    else:
        from fa_variants.reference import check_against_reference, references

        q = torch.randn(2, 1, 32, args.head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(2, 1023, 8, args.head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        lengths = torch.tensor([1023, 500], dtype=torch.int32, device="cuda") if args.seqlens_k else None
        extra = {"seqlens_k": lengths} if args.seqlens_k else {}
        torch.cuda.synchronize()
        instrument(torch.cuda.synchronize)
        t0 = time.perf_counter()
        out = fa_variants.attention(q, k, v, causal=True, backend=args.backend, **extra)
        torch.cuda.synchronize()
        report["first_call_s"] = round(time.perf_counter() - t0, 4)
        t0 = time.perf_counter()
        fa_variants.attention(q, k, v, causal=True, backend=args.backend, **extra)
        torch.cuda.synchronize()
        report["second_call_s"] = round(time.perf_counter() - t0, 4)
        refs = references(q, k, v, causal=True, seqlens_k=lengths)
        report["ok"] = bool(check_against_reference(out, q, k, v, True, refs=refs).ok)
        report["seqlens_k"] = args.seqlens_k
    if cache.compile_count:  # a cold cache: the trace and compile (common.cache times cute.compile)
        phases["compile_s"] = sum(c.compile_s for c in cache._CACHE.values())
    total = report.get("first_call_s", report.get("load_s"))
    named = sum(phases.get(p, 0.0) for p in ("backend_import_s", "disk_load_s", "compile_s", "first_launch_s"))
    report["phases"] = {name: round(s, 4) for name, s in phases.items()} | {"rest_s": round(total - named, 4)}
    import sys

    report["loaded_by"] = dict(diskcache.loaded_by)
    report["dsl_imported"] = "cutlass" in sys.modules
    print(json.dumps({**report, **cache.cache_info(),
                      "cache_dir": str(diskcache.root()) if diskcache.enabled() else None}))


if __name__ == "__main__":
    main()
