"""Every case of tests/test_fp8_quant_nonfinite.py::test_pass_matches_torch_on_non_finite, one line each, on the GPU.

    source .gpu/env.sh && python3 scripts/diag_nonfinite.py     (repository root)

The test stops at its first mismatch; this lists them all (session 36: which poisons, recipes and head_dims fail, and
how): per case "ok" or "BAD", then for q, k and v_t the NaN bytes (recipe / pass), the bytes that differ and the
first four of them (index: recipe byte / pass byte), the descales that differ and the LSE shift's assertion.
"""
import sys
import torch
sys.path.insert(0, "tests")
import test_fp8_quant_nonfinite as t
from fa_variants.fp8 import quant_host as qh
from fa_variants.fp8.quantize import HadamardRotation, quantize_fp8_torch, tiles_for

qh.NONFINITE = True
def cmp(ref, got):
    r, g = ref.view(torch.uint8), got.view(torch.uint8)
    rn, gn = (r & 0x7F) == 0x7F, (g & 0x7F) == 0x7F
    diff = (rn != gn) | ((r != g) & ~rn & ~gn)
    s = f"nan {int(rn.sum())}/{int(gn.sum())} diff {int(diff.sum())}"
    if diff.any():
        idx = diff.nonzero()[:4].tolist()
        s += " at " + ";".join(f"{i}:{int(r[tuple(i)])}/{int(g[tuple(i)])}" for i in idx)
    return s, bool(diff.any())

for recipe, D in t.CASES:
    cfg = t.RECIPES[recipe]
    tm, tn = tiles_for(D)
    clean = t._inputs(D, 3 * D)
    signs = HadamardRotation(D, cfg.seed).signs
    cases = []
    for name, rows in (("q", tm), ("k", tn), ("v", tn)):
        for where in ("value", "token", "block", "last", "huge", "aligned", "near"):
            labels = t.BAD.items() if where not in ("huge", "aligned", "near") else [("max", 0.0)]
            for label, value in labels:
                cases.append((name, rows, where, label, value, signs, None))
    cases.append(("k", tn, "aligned", "neg-scale", 0.0, -signs, -0.5))
    for name, rows, where, label, value, sg, scale in cases:
        q, k, v = (x.clone() for x in clean)
        t._poison({"q": q, "k": k, "v": v}[name], where, value, rows, sg)
        try:
            got = qh.quantize(q, k, v, config=cfg, pipeline="v3", softmax_scale=scale)
            ref = quantize_fp8_torch(q, k, v, config=cfg, k_mean=got.k_mean if cfg.smooth_k else None,
                                     softmax_scale=scale)
            parts, bad = [], False
            for n in ("q", "k", "v_t"):
                s, b = cmp(getattr(ref, n), getattr(got, n)); bad |= b; parts.append(f"{n}[{s}]")
            for n in ("q_descale", "k_descale", "v_descale"):
                a, b2 = getattr(ref, n), getattr(got, n)
                if not torch.equal(a, b2):
                    bad = True
                    m = (a != b2).nonzero()[:3].tolist()
                    pairs = ",".join(f"{a[tuple(i)].item():.3g}/{b2[tuple(i)].item():.3g}" for i in m)
                    parts.append(f"{n} differ at {m}: {pairs}")
            if cfg.smooth_k:
                try:
                    t._assert_shift(got.lse_shift, ref.lse_shift, q, ref.k_mean, ref.softmax_scale, "")
                except AssertionError as e:
                    bad = True; parts.append(f"shift {e}")
            print(("BAD " if bad else "ok  ") + f"{recipe} D{D} {name} {where} {label}: " + " ".join(parts), flush=True)
        except Exception as e:
            print(f"EXC {recipe} D{D} {name} {where} {label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
