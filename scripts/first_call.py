"""The first attention call of a fresh process: how long it takes with a cold or a warm disk compile cache.

    python scripts/first_call.py --backend fa3 [--head-dim 128]      # prints one JSON line

Times, in this new process: the imports (torch, fa_variants), CUDA set-up with the inputs (a decode step:
batch 2, one query row, 1023 keys, GQA 32:8, bf16, causal), then the first ``fa_variants.attention`` call to
its completion (synchronised): backend import, the compiled kernel (from disk, or compiled), the plan, the
launch. Reports also the compile cache's counters and whether the output passes the float64 rule. Issue 13's
budget: <= 1 s for the first call with a warm disk cache (FA_VARIANTS_CACHE_DIR).
"""
from __future__ import annotations

import argparse
import json
import time

start = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="fa3")
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()

    import torch

    import fa_variants
    from fa_variants.common import cache, diskcache
    from fa_variants.reference import check_against_reference

    imported = time.perf_counter()
    q = torch.randn(2, 1, 32, args.head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 1023, 8, args.head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fa_variants.attention(q, k, v, causal=True, backend=args.backend)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    print(json.dumps({"backend": args.backend, "head_dim": args.head_dim, "imports_s": round(imported - start, 3),
                      "first_call_s": round(first, 4), **cache.cache_info(),
                      "cache_dir": str(diskcache.root()) if diskcache.enabled() else None,
                      "ok": bool(check_against_reference(out, q, k, v, True).ok)}))


if __name__ == "__main__":
    main()
