"""Attention forward calls inside CUDA profiler ranges, for Nsight Compute attribution (issue 12).

    ncu --profile-from-start off --set full -o OUT/fa3 python3 scripts/ncu_attribution.py --impl fa3
    ncu --import OUT/fa3.ncu-rep --page raw --csv > OUT/fa3.csv
    scripts/ncu12_gpu.sh        (both implementations in one report, then scripts/ncu_table.py's table)

--impl: a comma list of fa3 / fa2 (ours, through fa_variants.attention), flash-attn-4
(flash_attn.cute.interface.flash_attn_func), e.g. ``fa3,flash-attn-4``, and fa3-fp8 kernel configs by their name in
scripts/fa3_fp8_speed_ab.py's SETS table (``fa3-fp8:NAME``, NAME a variant of --fp8-set at --head-dim, e.g.
``fa3-fp8:new,fa3-fp8:single_overlap_noskip``): the FP8 kernel alone (fa3_fp8.run_quantized) on the A/B's inputs,
quantised once before any call (random e4m3, block descales 0.05: scripts/fa3_fp8_gpu.py's fp8_inputs), so only the
attention kernel runs in the profiled range. --profile: the --impl names whose third call is profiled (default all);
the others are called as often outside any range (their outputs join the O comparison), so two configs of one kernel,
whose names ncu cannot tell apart, go to two reports (session 12's ncu256 run). --precompile: compile the fa3-fp8
configs into the disk cache, one process each, on tiny inputs, and exit (run it without ncu). --causal: no (default), yes, or both (one
profiled call each, non-causal first). Every call is made twice before its range (compile or disk-cache load, warm
caches); only the third call is profiled, so under ``--profile-from-start off`` each implementation and causal mode
gives one profiled kernel, in the order (implementation, causal mode). With two or more implementations the largest
max |O difference| between them is printed, and the largest rel-L2 of the difference (||O - O_first|| / ||O_first||)
(the profiled kernels compute the same thing).
Shape: the benchmark's (batch * seqlen = 16k, num_heads * head_dim = 2048), bf16 by default; same inputs for all.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fa3_fp8_speed_ab, fa3_fp8_gpu (scripts/)

IMPLS = ("fa3", "fa2", "flash-attn-4")
FP8 = "fa3-fp8:"


def impl_list(spec: str, fp8_variants: dict | None = None, flag: str = "--impl") -> list[str]:
    """--impl as a list; ValueError naming the argument for an unknown or repeated name. ``fp8_variants``: the names
    ``fa3-fp8:NAME`` may use (a SETS variant table at the head_dim); None: no fa3-fp8 name is valid."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    fp8 = [FP8 + n for n in (fp8_variants or {})]
    bad = [n for n in names if n not in IMPLS and n not in fp8]
    if not names or bad or len(set(names)) != len(names):
        raise ValueError(f"{flag}: expected a comma list of distinct {', '.join(IMPLS + tuple(fp8))} (fa3-fp8:NAME: "
                         f"a variant of --fp8-set at --head-dim); got {spec!r}")
    return names


def fp8_variants(variant_set: str, head_dim: int) -> dict:
    """{name: changes to fa3_fp8.DEFAULT_CONFIGS[head_dim]} of scripts/fa3_fp8_speed_ab.py's SETS[variant_set]."""
    import fa3_fp8_speed_ab

    if variant_set not in fa3_fp8_speed_ab.SETS:
        raise ValueError(f"--fp8-set: expected one of {', '.join(fa3_fp8_speed_ab.SETS)}; got {variant_set!r}")
    return fa3_fp8_speed_ab.SETS[variant_set].variants.get(head_dim, {})


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    ap.add_argument("--impl", default="fa3", help=f"comma list of {', '.join(IMPLS)}")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--causal", default="no", choices=["no", "yes", "both"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--fp8-set", default="fp8turn", help="scripts/fa3_fp8_speed_ab.py SETS table of fa3-fp8:NAME")
    ap.add_argument("--profile", help="comma list of --impl names profiled (default: all)")
    ap.add_argument("--precompile", action="store_true", help="compile the fa3-fp8 configs (disk cache) and exit")
    a = ap.parse_args()
    try:
        variants = fp8_variants(a.fp8_set, a.head_dim) if FP8 in a.impl else {}
        impls = impl_list(a.impl, variants)
        profiled = impl_list(a.profile, variants, "--profile") if a.profile else impls
        if set(profiled) - set(impls):
            raise ValueError(f"--profile: {a.profile!r} names an implementation --impl lacks")
    except ValueError as exc:
        ap.error(str(exc))
    causals = {"no": [False], "yes": [True], "both": [False, True]}[a.causal]
    configs = {i: variants[i[len(FP8):]] for i in impls if i.startswith(FP8)}
    if a.precompile:
        raise SystemExit(precompile(configs, a.head_dim, causals))
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    batch, heads = max(1, 16384 // a.seqlen), 2048 // a.head_dim
    q, k, v = (torch.randn(batch, a.seqlen, heads, a.head_dim, device="cuda", dtype=dtype) for _ in range(3))
    outputs: dict[bool, list] = {c: [] for c in causals}
    fp8_in: dict = {}  # tile_n -> the quantised inputs, made once before any call
    for impl in impls:
        for causal in causals:
            call = make_call(impl, q, k, v, causal, configs.get(impl), fp8_in)
            for _ in range(2):
                call()
            torch.cuda.synchronize()
            if impl in profiled:
                torch.cuda.cudart().cudaProfilerStart()
            out = call()
            torch.cuda.synchronize()
            if impl in profiled:
                torch.cuda.cudart().cudaProfilerStop()
            outputs[causal].append(out[0] if isinstance(out, (tuple, list)) else out)
            what = "profiled" if impl in profiled else "called (not profiled)"
            print(f"{what} {impl} D={a.head_dim} N={a.seqlen} B={batch} H={heads} causal={causal} "
                  f"{'e4m3' if impl in configs else a.dtype}", flush=True)
    for causal, outs in outputs.items():
        if len(outs) > 1:
            diff = max((o.float() - outs[0].float()).abs().max().item() for o in outs[1:])
            rel = max(((o.float() - outs[0].float()).norm() / outs[0].float().norm()).item() for o in outs[1:])
            print(f"max |O difference| between {', '.join(impls)} causal={causal}: {diff:.3e}")
            print(f"O difference rel-L2 between {', '.join(impls)} causal={causal}: {rel:.3e}")


def precompile(configs: dict, head_dim: int, causals: list[bool]) -> int:
    """Each fa3-fp8 config run once on tiny inputs in a process of its own (fa3_fp8_speed_ab._compile_one: into the
    disk cache); prints its lines; the number that failed."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    import fa3_fp8_speed_ab

    jobs = [("fp8", head_dim, c, ch) for ch in configs.values() for c in causals]
    if not jobs:
        print("precompiled 0 kernels (no fa3-fp8 config in --impl)")
        return 0
    with ProcessPoolExecutor(len(jobs), mp_context=mp.get_context("spawn")) as pool:
        msgs = list(pool.map(fa3_fp8_speed_ab._compile_one, jobs))
    for m in msgs:
        print(m, flush=True)
    bad = sum(not m.startswith("ok") for m in msgs)
    print(f"precompiled {len(jobs) - bad} of {len(jobs)} fa3-fp8 kernels", flush=True)
    return bad


def make_call(impl: str, q, k, v, causal: bool, fp8_change: dict | None = None, fp8_in: dict | None = None):
    """The forward call of ``impl`` on q, k, v (bf16 / fp16; B, N, H, D); a fa3-fp8 config (``fp8_change``: its
    changes to the default) on quantised inputs of q's shape, made once per tile_n and kept in ``fp8_in``."""
    if fp8_change is not None:
        import dataclasses

        from fa3_fp8_gpu import fp8_inputs
        from fa_variants.hopper import fa3_fp8

        B, N, H, D = q.shape
        cfg = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[D], **fp8_change)
        if cfg.tile_n not in fp8_in:
            fp8_in[cfg.tile_n] = fp8_inputs(B, N, H, D, cfg.tile_n)
        args = fp8_in[cfg.tile_n]
        return lambda: fa3_fp8.run_quantized(*args, softmax_scale=D ** -0.5, causal=causal, config=cfg)
    if impl == "flash-attn-4":
        from flash_attn.cute.interface import flash_attn_func

        return lambda: flash_attn_func(q, k, v, causal=causal)
    import fa_variants

    return lambda: fa_variants.attention(q, k, v, causal=causal, backend=impl)


if __name__ == "__main__":
    main()
