"""One attention forward call inside a CUDA profiler range, for Nsight Compute attribution (issue 12).

    ncu --profile-from-start off --set full -o OUT/fa3 python3 scripts/ncu_attribution.py --impl fa3
    ncu --import OUT/fa3.ncu-rep --page raw --csv > OUT/fa3.csv

--impl: fa3 / fa2 (ours, through fa_variants.attention) or flash-attn-4 (flash_attn.cute.flash_attn_func).
The call is made twice before the range (compile, warm caches); only the third call is profiled.
Shape: the benchmark's (batch * seqlen = 16k, num_heads * head_dim = 2048), bf16 by default.
"""
from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", default="fa3", choices=["fa3", "fa2", "flash-attn-4"])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    a = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    batch, heads = max(1, 16384 // a.seqlen), 2048 // a.head_dim
    q, k, v = (torch.randn(batch, a.seqlen, heads, a.head_dim, device="cuda", dtype=dtype) for _ in range(3))
    if a.impl == "flash-attn-4":
        from flash_attn.cute.interface import flash_attn_func

        def call():
            return flash_attn_func(q, k, v, causal=a.causal)
    else:
        import fa_variants

        def call():
            return fa_variants.attention(q, k, v, causal=a.causal, backend=a.impl)
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled {a.impl} D={a.head_dim} N={a.seqlen} B={batch} H={heads} causal={a.causal} {a.dtype}")


if __name__ == "__main__":
    main()
