"""Compile every pass of the FP8 quantisation pass that tests/test_fp8_quant_kernel.py and
scripts/fp8_quant_bandwidth.py use, in parallel processes, into the disk compile cache (on the GPU host).

    source .gpu/env.sh && python3 scripts/quant_precompile.py [--jobs 14] [--plan] [--set quant8] [--unique]

One task per (pipeline, dtype, head_dim, recipe): a tiny ``quant_host.quantize`` call (softmax_scale None
and -0.3) on the GPU, which compiles what that recipe launches (the stage count depends on the device, so
running is the simplest way to name the passes). Tasks sharing a pass may both compile it; the disk cache
keeps one whole copy. --unique: the tasks' calls run first in this process with the compile replaced by a
recorder (no launch), then each distinct pass is compiled once by the workers (no GPU needed there). Prints one
line per task (pass) and a summary; exit status 1 if a task failed.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import sys
import time
from pathlib import Path

RECIPES = ("default", "no-smooth", "head", "head-smooth", "tensor-plain")
# --set quant4 (session 6's v3 flip): v3 (the new default) and v1 (the old) in the bandwidth table and the
# tests it runs, v3 with the staged mean (V3_STAGED_MEAN, + the fused mean) and the sampled mean
# (FP8Config(smooth_k_blocks=8))
HEAD_DIMS = (64, 128, 256)


def tasks(which: str = "quant3") -> list[tuple[str, str, int, str]]:
    """(pipeline, dtype, head_dim, recipe): the superset of the test matrix (CASES) and the bandwidth script
    (which "quant3"), or the sets of the finished experiments named after them (bench/NOTES.md, Sessions 6-8 and 12):
    "quant4" / "quant5" (v3 as default, with and without the staged store, V3_STAGED_STORE), "quant8" (the
    then default, + V3_FUSED_MEAN, + V3_FUSED_MEAN_LATE), "quantlanes" (the then default and + V3_WIDE at head_dim
    256), "quantbw" (quantlanes' and both at head_dim 256 with V2_PDL off), "quantbw2" (session 13: the default
    recipe at head_dim 64 / 128 / 256 as the module has it and with V3_FUSED_MEAN_LATE), "quantocc" / "quantk"
    (session 14: V3_WIDE128 on / for K's pass only, at head_dim 128), or
    the GPU check of session 12's quant defaults (which "quantdef": the default recipe in bf16 at head_dim 64 / 128 /
    256 with the module's defaults, V3_WIDE on since then, and the narrow pass at 256 beside it: the passes of
    tests/test_fp8_quant_kernel.py -k "(test_pass_matches_torch_bitwise and v3-bfloat16-default) or
    (test_v3_wide_bitwise and default-g)")."""
    if which == "quantchains":  # session 21: the default recipe with Q's shift in 2 / 8 chains, and 8 chains with Q's
        # pass wide at head_dim 128 (fp8_quant_bandwidth.py's defc2 / defc8 / defw128c8), beside the default
        out = [("v3", "bf16", d, f"default{knob}") for d in HEAD_DIMS for knob in ("", "+c2", "+c8")]
        # and the narrow pass at 256 (V3_WIDE off) with 2 / 8 chains: tests/test_fp8_quant_shift.py's wide = narrow
        out += [("v3", "bf16", 256, f"default+n{c}") for c in ("c2", "c8")]
        return out + [("v3", "bf16", 128, "default+w128c8")]
    if which == "quantsamp":  # session 21: the default recipe, the sampled mean (16 tiles) as it runs today, with
        # the fused sampled mean and with the late count, and the unsmoothed recipe (the ceiling), at every head_dim
        out = [("v3", "bf16", d, r) for d in HEAD_DIMS for r in ("default", "no-smooth", "sampled16")]
        out += [("v3", "bf16", d, f"sampled16+{knob}") for d in HEAD_DIMS for knob in QUANTSAMP_KNOBS]
        # and (quantq128) Q's pass wide at head_dim 128 too (V3_WIDE128 = True: 174 registers, no spill since the
        # non-finite rule's default), with the default recipe and with the sampled mean counted late
        return out + [("v3", "bf16", 128, "default+w128q"), ("v3", "bf16", 128, "sampled16+w128ql")]
    if which == "quantinf":  # session 14: the default recipe with NONFINITE off / on at every head_dim, and the GPU
        # tests' other recipes at 128 (K unsmoothed, on; the per-head baseline's "amax" + "given" launches, off / on)
        out = [("v3", "bf16", d, f"default+{knob}") for d in HEAD_DIMS for knob in QUANTINF_KNOBS]
        return out + [("v3", "bf16", 128, r) for r in ("no-smooth+nf", "head-smooth+nf", "head-smooth+nf0")]
    if which == "quantocc":  # session 14: the default recipe at 128 as it is, with V3_WIDE128 (+ without its staged
        # store: the bandwidth's ablation) and the GPU tests' recipes of test_v3_wide128_bitwise with it
        out = [("v3", "bf16", 128, f"default+{knob}") for knob in QUANTOCC_KNOBS]
        return out + [("v3", "bf16", 128, f"{r}+{knob}") for r in ("sampled8", "no-smooth", "head-smooth")
                      for knob in ("def128", "w128")]
    if which == "quantk":  # session 14: the default recipe at 128 as it is and with V3_WIDE128 = "k" (K's pass wide,
        # Q's the default's), and the GPU tests' recipes of test_v3_wide128_bitwise's K-only mode with it
        return [("v3", "bf16", 128, f"{r}+{knob}") for r in ("default", "sampled8", "no-smooth", "head-smooth")
                for knob in QUANTK_KNOBS]
    if which == "quantbw2":  # the default recipe with the module's defaults and with the fused mean counted late
        return [("v3", "bf16", d, f"default{knob}") for d in HEAD_DIMS for knob in ("", "+bw2late")]
    if which == "quantdef":  # the defaults as the module has them (no knob) + the narrow pass at 256 (test_v3_wide)
        return [("v3", "bf16", d, "default") for d in HEAD_DIMS] + [("v3", "bf16", 256, "default+narrow")]
    if which == "quant8":  # the current default, the fused mean per K block and after each CTA's loop
        out = [("v3", "bf16", d, f"{r}+{knob}") for d in HEAD_DIMS for r in ("default", "sampled8")
               for knob in QUANT8_KNOBS]
        return out + [("v3", "bf16", 128, f"head-smooth+{knob}") for knob in QUANT8_KNOBS]  # the "amax" launch
    if which == "quantbw":  # quantlanes' passes + the default recipe at 256 without PDL (the bandwidth's defn, defwn)
        return tasks("quantlanes") + [("v3", "bf16", 256, f"default+{knob}") for knob in QUANTBW_KNOBS]
    if which == "quantlanes":  # the default at D 64 / 128 (the A/B's other rows); default and V3_WIDE at 256 (the
        # bandwidth row and the GPU tests' recipes: default, no-smooth, head-smooth's "amax" / "given" launches)
        out = [("v3", "bf16", d, "default+defaultql") for d in (64, 128)]
        return out + [("v3", "bf16", 256, f"{r}+{knob}") for r in ("default", "no-smooth", "head-smooth")
                      for knob in QUANTLANES_KNOBS]
    if which == "quant5":
        recipes = ("default", "no-smooth", "head-smooth", "sampled8")
        return [("v3", "bf16", d, f"{r}+{knob}") for d in HEAD_DIMS for r in recipes for knob in QUANT5_KNOBS]
    if which == "quant4":
        out = []
        for d in HEAD_DIMS:
            out += [("v1", "bf16", d, r) for r in ("default", "no-smooth", "sampled8")]
            out += [("v3", "bf16", d, r) for r in ("default", "no-smooth", "head-smooth", "tensor-plain", "sampled8")]
            out += [("v3", "bf16", d, f"{r}+stagedmean") for r in ("default", "head-smooth", "sampled8")]
            out += [("v3", "bf16", d, f"{r}+stagedfused") for r in ("default", "sampled8")]
        return out
    out = []
    for d in HEAD_DIMS:
        # v2: the default recipe only (tests/test_fp8_quant_kernel.py::test_v3_equals_v2_bitwise, the ablation;
        # session 6's quant3 run skipped v2's other test cases, unchanged since their last GPU run)
        out += [("v2", "bf16", d, "default")]
        out += [("v3", "bf16", d, r) for r in RECIPES if r != "head"] + [("v3", "fp16", d, "default")]
        out += [("v1", "bf16", d, r) for r in RECIPES if r != "head-smooth"] + [("v1", "fp16", d, "default"),
                                                                                ("v1", "fp16", d, "head"),
                                                                                ("v1", "fp16", d, "tensor-plain")]
    out += [("v3", "bf16", 128, f"default+{label}") for label in ABLATION_KNOBS]
    out += [("v3", "bf16", d, "default+stagedfused") for d in (64, 256)]  # test_v3_fused_mean (staged: the default)
    return out


# fp8_quant_bandwidth.py --ablation's variants of v3 (quant_host's module switches)
# (relative to v3 without the staged mean, its default before session 6, as fp8_quant_bandwidth.py's ABLATION)
_UNSTAGED = {"V3_STAGED_MEAN": False}
ABLATION_KNOBS = {"unstaged": _UNSTAGED, "nocoalesced": {**_UNSTAGED, "V3_COALESCED": False},
                  "tilemajor": {**_UNSTAGED, "V3_HEAD_MAJOR": False}, "stages2": {**_UNSTAGED, "V2_STAGES": 2},
                  "nopdl": {**_UNSTAGED, "V2_PDL": False}, "fusedmean": {**_UNSTAGED, "V3_FUSED_MEAN": True},
                  "stagedmean": {"V3_STAGED_MEAN": True},
                  "stagedfused": {"V3_STAGED_MEAN": True, "V3_FUSED_MEAN": True}}
# --set quant5: the current default (staged mean on) and the staged store on top (not ablation rows of quant3)
QUANT5_KNOBS = {"default": {"V3_STAGED_MEAN": True, "V3_STAGED_STORE": False},
                "stagedstore": {"V3_STAGED_MEAN": True, "V3_STAGED_STORE": True}}
# --set quantlanes: the current default (staged store auto) and 8 chunks of a token per thread at head_dim 256 (V3_WIDE)
_QL = {"V3_STAGED_MEAN": True, "V3_STAGED_STORE": None, "V3_FUSED_SAMPLED_MEAN": False, "V3_FUSED_MEAN": False,
       "V3_FUSED_MEAN_LATE": False, "V3_WIDE": False}
QUANTLANES_KNOBS = {"defaultql": _QL, "wide": {**_QL, "V3_WIDE": True}}
# --set quantbw: quantlanes' passes, and the default / wide at head_dim 256 without programmatic dependent launch
QUANTBW_KNOBS = {"nopdlql": {**_QL, "V2_PDL": False}, "widenopdl": {**_QL, "V3_WIDE": True, "V2_PDL": False}}
# --set quantdef: the narrow pass at head_dim 256 (V3_WIDE off), the wide default's bit-for-bit reference
QUANTDEF_KNOBS = {"narrow": {"V3_WIDE": False}}
# --set quantbw2 (session 13): the default recipe with the fused mean counted after each CTA's loop (V's launch)
QUANTBW2_KNOBS = {"bw2late": {"V3_FUSED_MEAN_LATE": True}}
# --set quantocc (session 14): the default, V3_WIDE128 (its staged store by the auto rule) and V3_WIDE128 without it
QUANTOCC_KNOBS = {"def128": {"V3_WIDE128": False, "V3_STAGED_STORE": None},
                  "w128": {"V3_WIDE128": True, "V3_STAGED_STORE": None},
                  "w128n": {"V3_WIDE128": True, "V3_STAGED_STORE": False}}
# --set quantk (session 14): the default and V3_WIDE128 for K's pass only (its staged store by the auto rule)
QUANTK_KNOBS = {"def128": QUANTOCC_KNOBS["def128"], "w128k": {"V3_WIDE128": "k", "V3_STAGED_STORE": None}}
# --set quantinf (session 14): the passes' non-finite rule (quant_host.NONFINITE) off and on
QUANTINF_KNOBS = {"nf0": {"NONFINITE": False}, "nf": {"NONFINITE": True}}
# --set quantsamp (session 21): the sampled K mean finished in V's launch, per sample block or counted late
QUANTSAMP_KNOBS = {"fs": {"V3_FUSED_SAMPLED_MEAN": True}, "fsl": {"V3_FUSED_MEAN_LATE": True}}
QUANTCHAINS_KNOBS = {"c2": {"SHIFT_CHAINS": 2}, "c8": {"SHIFT_CHAINS": 8},
                     "w128c8": {"V3_WIDE128": True, "SHIFT_CHAINS": 8},
                     "nc2": {"V3_WIDE": False, "SHIFT_CHAINS": 2}, "nc8": {"V3_WIDE": False, "SHIFT_CHAINS": 8}}
QUANTQ128_KNOBS = {"w128q": {"V3_WIDE128": True}, "w128ql": {"V3_WIDE128": True, "V3_FUSED_MEAN_LATE": True}}
# --set quant8: the current default as it is (staged store auto), the fused mean per K block, and counted late
_Q8 = {"V3_STAGED_MEAN": True, "V3_STAGED_STORE": None, "V3_FUSED_SAMPLED_MEAN": False,
       "V3_FUSED_MEAN": False, "V3_FUSED_MEAN_LATE": False}
QUANT8_KNOBS = {"default8": _Q8, "fused8": {**_Q8, "V3_FUSED_MEAN": True},
                "late8": {**_Q8, "V3_FUSED_MEAN": True, "V3_FUSED_MEAN_LATE": True}}


def config_of(recipe: str):
    """The FP8Config of a recipe name: scripts/fp8_quant_bandwidth.py's --recipes, plus the per-head and per-tensor
    ones the bitwise tests compile."""
    here = str(Path(__file__).resolve().parent)  # scripts/, for its sibling (also when loaded by a test)
    if here not in sys.path:
        sys.path.insert(0, here)
    from fp8_quant_bandwidth import recipes

    from fa_variants.fp8 import FP8Config

    return {**recipes(), "head": FP8Config(granularity="head", smooth_k=False),
            "head-smooth": FP8Config(granularity="head"),
            "tensor-plain": FP8Config(granularity="tensor", rotate=False, smooth_k=False)}[recipe]


@contextlib.contextmanager
def knobs_set(knob: str):
    """quant_host's module switches of one KNOBS name ("" or an unknown name: none) set for the duration."""
    from fa_variants.fp8 import quant_host

    knobs = {**ABLATION_KNOBS, **QUANT5_KNOBS, **QUANT8_KNOBS, **QUANTLANES_KNOBS, **QUANTBW_KNOBS,
             **QUANTDEF_KNOBS, **QUANTBW2_KNOBS, **QUANTOCC_KNOBS, **QUANTK_KNOBS,
             **QUANTINF_KNOBS, **QUANTSAMP_KNOBS, **QUANTQ128_KNOBS,
             **QUANTCHAINS_KNOBS}.get(knob, {})
    saved = {name: getattr(quant_host, name) for name in knobs}
    try:
        for name, value in knobs.items():
            setattr(quant_host, name, value)
        yield
    finally:  # a worker runs several tasks
        for name, value in saved.items():
            setattr(quant_host, name, value)


def run(task: tuple[str, str, int, str]) -> str:
    import torch

    from fa_variants.common import cache
    from fa_variants.common.interop import TORCH_DTYPES
    from fa_variants.fp8 import quant_host

    pipeline, dtype, d, recipe = task
    recipe, _, knob = recipe.partition("+")  # knob: one of the KNOBS names (may hold a "+")
    t0 = time.perf_counter()
    q = torch.randn(1, 130, 2, d, device="cuda").to(TORCH_DTYPES[dtype])
    # a sampled mean takes V's sample-only launch when the tiles outnumber the sample (16 of >= 21 tiles here)
    k = torch.randn(1, 4100 if recipe.startswith("sampled") else 300, 1, d, device="cuda").to(TORCH_DTYPES[dtype])
    with knobs_set(knob):
        for scale in (None, -0.3):
            quant_host.quantize(q, k, k, config=config_of(recipe), softmax_scale=scale, pipeline=pipeline)
        torch.cuda.synchronize()
    return f"{'/'.join(map(str, task))}: {time.perf_counter() - t0:.1f} s {cache.cache_info()} (this worker so far)"


def record(todo: list[tuple[str, str, int, str]], arch: str | None = None) -> list:
    """--unique: the compile keys (``quant_kernel.static_config``) of every pass the tasks' calls launch, in
    first-use order, without compiling or launching any: ``quant_host.planned_passes`` per task (2 query heads per
    KV head, as ``run``), the task's knobs set meanwhile. ``arch``: the compile target (default: this host's GPU)."""
    from fa_variants.common import interop
    from fa_variants.common.interop import TORCH_DTYPES
    from fa_variants.fp8 import quant_host

    arch = arch or interop.device_arch()
    keys: dict = {}
    for pipeline, dtype, d, recipe in todo:
        recipe, _, knob = recipe.partition("+")
        with knobs_set(knob):
            planned = quant_host.planned_passes(arch, TORCH_DTYPES[dtype], d, config_of(recipe), pipeline=pipeline,
                                                groups=(2,))
        keys.update(dict.fromkeys(planned))
    return list(keys)


def compile_key(key) -> str:
    """--unique's worker: one pass (a ``quant_kernel.static_config`` key) compiled into the disk cache (no GPU
    needed)."""
    from fa_variants.common import cache
    from fa_variants.fp8 import quant_kernel

    t0 = time.perf_counter()
    quant_kernel.VARIANT.compiled(key)
    return f"{key.head_dim} {key.config}: {time.perf_counter() - t0:.1f} s {cache.cache_info()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--jobs", type=int, default=14)
    parser.add_argument("--plan", action="store_true", help="list the tasks and exit (no GPU needed)")
    parser.add_argument("--set", default="quant3",
                        choices=("quant3", "quant4", "quant5", "quant8", "quantlanes", "quantbw", "quantdef",
                                 "quantbw2", "quantocc", "quantk", "quantinf", "quantsamp", "quantchains"),
                        help="which script's passes (default quant3)")
    parser.add_argument("--unique", action="store_true",
                        help="record the tasks' passes first (no compile), then compile each distinct pass once")
    args = parser.parse_args()
    todo = tasks(args.set)
    if args.plan:
        print("\n".join("/".join(map(str, t)) for t in todo))
        return 0
    t0, failed = time.perf_counter(), 0
    # spawn: each worker imports torch and the DSL itself (no CUDA context inherited across fork)
    import multiprocessing as mp

    work, label = (compile_key, str) if args.unique else (run, lambda t: "/".join(map(str, t)))
    if args.unique:
        try:
            todo = record(todo)
            print(f"precompile: {len(todo)} distinct passes recorded in {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as exc:  # noqa: BLE001 - the per-task mode still compiles everything
            print(f"precompile: --unique's recording failed ({type(exc).__name__}: {exc}); running the tasks",
                  flush=True)
            work, label = run, lambda t: "/".join(map(str, t))
    with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(work, t): t for t in todo}
        for f in cf.as_completed(futures):
            try:
                print(f.result(), flush=True)
            except Exception as exc:  # noqa: BLE001 - reported, counted
                failed += 1
                print(f"{label(futures[f])}: FAILED {type(exc).__name__}: {exc}", flush=True)
    print(f"precompile: {len(todo)} tasks, {failed} failed, {time.perf_counter() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
