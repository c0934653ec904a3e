"""Small quantisation calls of pipeline v3 (and its fused K mean) for compute-sanitizer (scripts/quant3_gpu.sh):

    compute-sanitizer --tool racecheck --error-exitcode 9 python3 scripts/quant_sanitize.py

v3 shares each shared-memory stage between threads (coalesced loads, a barrier, reads by other threads) and
the fused mean adds a cross-CTA counter: racecheck / synccheck look at those. Shapes: GQA, batch 2, odd
lengths (tails), D 64 / 128 / 256; each call checked against the torch recipe given the call's K mean. Prints
"CALLS n FAILED m"; exit status 1 if a call differed.
"""
from __future__ import annotations


def main() -> int:
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    import torch

    from fa_variants.fp8 import quant_kernel as qk
    from fa_variants.fp8.quantize import quantize_fp8_torch

    calls = failed = 0
    for fused in (False, True):
        qk.V3_FUSED_MEAN = fused
        for d in qk.HEAD_DIMS:
            g = torch.Generator(device="cuda").manual_seed(d)
            q = torch.randn(2, 300, 8, d, device="cuda", generator=g).to(torch.bfloat16)
            k = (torch.randn(2, 257, 2, d, device="cuda", generator=g) + 1).to(torch.bfloat16)
            v = torch.randn(2, 257, 2, d, device="cuda", generator=g).to(torch.bfloat16)
            got = qk.quantize(q, k, v, pipeline="v3")
            ref = quantize_fp8_torch(q, k, v, k_mean=got.k_mean)
            same = all(torch.equal(getattr(got, n).view(torch.uint8), getattr(ref, n).view(torch.uint8))
                       for n in ("q", "k", "v_t"))
            same = same and all(torch.equal(getattr(got, n), getattr(ref, n))
                                for n in ("q_descale", "k_descale", "v_descale"))
            calls += 1
            failed += not same
            print(f"v3 fused_mean={fused} D={d}: {'ok' if same else 'DIFF'}", flush=True)
    print(f"CALLS {calls} FAILED {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
