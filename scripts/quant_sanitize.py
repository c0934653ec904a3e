"""Small quantisation calls of pipeline v3 (and its variants) for compute-sanitizer:

    compute-sanitizer --tool racecheck --error-exitcode 9 python3 scripts/quant_sanitize.py [--set quant4]

v3 shares each shared-memory stage between threads (coalesced loads, a barrier, reads by other threads), the
fused mean adds a cross-CTA counter, the staged mean (``V3_STAGED_MEAN``) a per-stage mean buffer filled by
cp.async and by the prologue's plain stores, the sampled mean (``FP8Config(smooth_k_blocks=2)``) V's launch over
K's sample tiles, the staged store (``V3_STAGED_STORE``) Q's / K's e4m3 through the stage just read: racecheck /
synccheck look at those. Sets: "quant3" (default): v3 and v3 + fused mean; "quant4": v3 + staged mean, + the sampled
mean, + the fused mean over the sample; "quant5": the staged store, default and sampled recipes; "quant8": the
fused mean counted after each CTA's loop (``V3_FUSED_MEAN_LATE``; a shared-memory list of the heads a CTA finishes),
exact and sampled mean, the launch cut to 2 CTAs (``GRID_CAP``: several heads per CTA), D 64 / 128; "quantlanes": 8
chunks of a token per thread (``V3_WIDE``: 16 cp.async and 16 reads of the stage per thread), 3 CTAs, D 256, default
and no-smooth recipes. Shapes: GQA,
batch 2, odd lengths (tails), D 64 / 128 / 256; each call checked against the torch recipe given the call's K mean.
Prints "CALLS n FAILED m"; exit status 1 if a call differed.
"""
from __future__ import annotations


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--set", default="quant3", choices=("quant3", "quant4", "quant5", "quant8",
                                                           "quantlanes"))
    args = parser.parse_args()
    import torch

    from fa_variants.fp8 import FP8Config
    from fa_variants.fp8 import quant_host as qh
    from fa_variants.fp8.quantize import quantize_fp8_torch

    # (label, quant_host switches, config, seqlen_k)
    variants = {"quant3": [("fused_mean=False", {"V3_FUSED_MEAN": False}, FP8Config(), 257),
                           ("fused_mean=True", {"V3_FUSED_MEAN": True}, FP8Config(), 257)],
                "quant4": [("staged_mean", {"V3_STAGED_MEAN": True}, FP8Config(), 257),
                           ("staged_mean+sampled2", {"V3_STAGED_MEAN": True}, FP8Config(smooth_k_blocks=2), 1100),
                           ("staged+fused_mean+sampled2", {"V3_STAGED_MEAN": True, "V3_FUSED_MEAN": True},
                            FP8Config(smooth_k_blocks=2), 1100)],
                "quant5": [("staged_store", {"V3_STAGED_MEAN": True, "V3_STAGED_STORE": True}, FP8Config(), 257),
                           ("staged_store+sampled2", {"V3_STAGED_MEAN": True, "V3_STAGED_STORE": True},
                            FP8Config(smooth_k_blocks=2), 1100)],
                "quant8": [("fused_mean_late", {"V3_STAGED_MEAN": True, "V3_FUSED_MEAN_LATE": True, "GRID_CAP": 2},
                            FP8Config(), 257),
                           ("fused_mean_late+sampled2", {"V3_STAGED_MEAN": True, "V3_FUSED_MEAN_LATE": True,
                                                         "GRID_CAP": 2}, FP8Config(smooth_k_blocks=2), 1100)],
                "quantlanes": [("wide", {"V3_STAGED_MEAN": True, "V3_WIDE": True, "GRID_CAP": 3}, FP8Config(), 257),
                               ("wide+no-smooth", {"V3_STAGED_MEAN": True, "V3_WIDE": True, "GRID_CAP": 3},
                                FP8Config(smooth_k=False), 257)]}
    calls = failed = 0
    for label, knobs, config, nk in variants[args.set]:
        for name, value in knobs.items():
            setattr(qh, name, value)
        # quant8: two
        # head_dims keep racecheck (one small case per recipe) short
        dims = {"quant8": (64, 128), "quantlanes": (256,)}
        for d in dims.get(args.set, qh.HEAD_DIMS):
            g = torch.Generator(device="cuda").manual_seed(d)
            q = torch.randn(2, 300, 8, d, device="cuda", generator=g).to(torch.bfloat16)
            k = (torch.randn(2, nk, 2, d, device="cuda", generator=g) + 1).to(torch.bfloat16)
            v = torch.randn(2, nk, 2, d, device="cuda", generator=g).to(torch.bfloat16)
            got = qh.quantize(q, k, v, config=config, pipeline="v3")
            ref = quantize_fp8_torch(q, k, v, config=config, k_mean=got.k_mean)
            same = all(torch.equal(getattr(got, n).view(torch.uint8), getattr(ref, n).view(torch.uint8))
                       for n in ("q", "k", "v_t"))
            same = same and all(torch.equal(getattr(got, n), getattr(ref, n))
                                for n in ("q_descale", "k_descale", "v_descale"))
            calls += 1
            failed += not same
            print(f"v3 {label} D={d}: {'ok' if same else 'DIFF'}", flush=True)
    print(f"CALLS {calls} FAILED {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
