"""Attention forward calls inside CUDA profiler ranges, for Nsight Compute attribution (issue 12).

    ncu --profile-from-start off --set full -o OUT/fa3 python3 scripts/ncu_attribution.py --impl fa3
    ncu --import OUT/fa3.ncu-rep --page raw --csv > OUT/fa3.csv
    scripts/ncu12_gpu.sh        (both implementations in one report, then scripts/ncu_table.py's table)

--impl: a comma list of fa3 / fa2 (ours, through fa_variants.attention) and flash-attn-4
(flash_attn.cute.interface.flash_attn_func), e.g. ``fa3,flash-attn-4``. --causal: no (default), yes, or both (one
profiled call each, non-causal first). Every call is made twice before its range (compile or disk-cache load, warm
caches); only the third call is profiled, so under ``--profile-from-start off`` each implementation and causal mode
gives one profiled kernel, in the order (implementation, causal mode). With two or more implementations the largest
max |O difference| between them is printed (the profiled kernels compute the same thing).
Shape: the benchmark's (batch * seqlen = 16k, num_heads * head_dim = 2048), bf16 by default; same inputs for all.
"""
from __future__ import annotations

import argparse

IMPLS = ("fa3", "fa2", "flash-attn-4")


def impl_list(spec: str) -> list[str]:
    """--impl as a list; ValueError naming the argument for an unknown or repeated name."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in IMPLS]
    if not names or bad or len(set(names)) != len(names):
        raise ValueError(f"--impl: expected a comma list of distinct {', '.join(IMPLS)}; got {spec!r}")
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", default="fa3", help=f"comma list of {', '.join(IMPLS)}")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--causal", default="no", choices=["no", "yes", "both"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    a = ap.parse_args()
    try:
        impls = impl_list(a.impl)
    except ValueError as exc:
        ap.error(str(exc))
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    batch, heads = max(1, 16384 // a.seqlen), 2048 // a.head_dim
    q, k, v = (torch.randn(batch, a.seqlen, heads, a.head_dim, device="cuda", dtype=dtype) for _ in range(3))
    causals = {"no": [False], "yes": [True], "both": [False, True]}[a.causal]
    outputs: dict[bool, list] = {c: [] for c in causals}
    for impl in impls:
        for causal in causals:
            call = make_call(impl, q, k, v, causal)
            for _ in range(2):
                call()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            out = call()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            outputs[causal].append(out[0] if isinstance(out, (tuple, list)) else out)
            print(f"profiled {impl} D={a.head_dim} N={a.seqlen} B={batch} H={heads} causal={causal} {a.dtype}",
                  flush=True)
    for causal, outs in outputs.items():
        if len(outs) > 1:
            diff = max((o.float() - outs[0].float()).abs().max().item() for o in outs[1:])
            print(f"max |O difference| between {', '.join(impls)} causal={causal}: {diff:.3e}")


def make_call(impl: str, q, k, v, causal: bool):
    if impl == "flash-attn-4":
        from flash_attn.cute.interface import flash_attn_func

        return lambda: flash_attn_func(q, k, v, causal=causal)
    import fa_variants

    return lambda: fa_variants.attention(q, k, v, causal=causal, backend=impl)


if __name__ == "__main__":
    main()
