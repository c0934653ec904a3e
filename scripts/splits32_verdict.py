"""The verdict of scripts/splits32_gpu.sh's A/B (decode_ab.py --s12l --variants ldual): per shape the GPU time of
`ldual` (FA_VARIANTS_DECODE_LONG_DUAL=all: the dual tiles, two CTAs per SM, 32 splits at B 1 x 8 KV heads) over
`auto`'s and the HBM share (K/V bytes / GPU time / 4.8 TB/s) of SDPA, auto and ldual at Nk >= 32k; then the value
for the switch's default by the rule of bench/NOTES.md ("Session 12 (2026-12-02): decode at head_dim 64, 32 splits
..."): "64" when no entry is BAD/ERR, the geometric mean of ldual / auto over the D 64 B 1 Nk 32k shapes is <= 0.97,
ldual / auto <= 1.00 at each D 64 B 1 Nk 128k shape and <= 1.02 at every D 64 shape it ran; "all" when besides
D 128 B 1 Nk 32k is <= 0.99; else KEEP "off". (The GPU tests are the script's other pass line.)

    python3 scripts/splits32_verdict.py $OUT/decode_ab/decode_ab.json
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

HBM_PEAK = 4.8e6  # bytes per us
TARGET = [(64, 32, 8, 1, 32768), (64, 64, 8, 1, 32768)]  # what the lever is for
LONGER = [(64, 32, 8, 1, 131072), (64, 64, 8, 1, 131072)]
D128 = (128, 32, 8, 1, 32768)
GEOMEAN_MAX, LONGER_MAX, WORST_MAX, D128_MAX = 0.97, 1.00, 1.02, 0.99


def ratios_and_lines(results: list[dict]) -> tuple[dict, list[str], list[str]]:
    """({shape: ldual / auto}, the per-shape lines, the BAD/ERR entries) from decode_ab's results."""
    lines, ratios, bad = [], {}, []
    for r in results:
        shape, us, err = tuple(r["shape"][:5]), r["us"], r["err"]
        bad += [f"{shape} {n}" for n, e in err.items() if not isinstance(e, float) or e > 0.02]
        ratio = us["ldual"] / us["auto"] if "ldual" in us and "auto" in us else None
        if ratio is not None:
            ratios[shape] = ratio
        d, h, hkv, b, nk = shape
        share = lambda n: f"{100 * 4 * b * hkv * nk * d / us[n] / HBM_PEAK:.0f}%" if n in us else "-"  # noqa: E731
        splits = r.get("splits", {})
        cell = f"{ratio:.3f}" if ratio is not None else "-"
        lines.append(f"D{d} {h}:{hkv} B{b} Nk{nk}: auto {us.get('auto', math.nan):.1f} us ({splits.get('auto', '?')} "
                     f"splits), ldual/auto {cell} ({splits.get('ldual', '-')})  HBM sdpa {share('sdpa')} "
                     f"auto {share('auto')} ldual {share('ldual')}")
    return ratios, lines, bad


def verdict(results: list[dict]) -> tuple[str, list[str]]:
    """("64" / "all" / "off", the lines to print)."""
    ratios, lines, bad = ratios_and_lines(results)
    target = [ratios[s] for s in TARGET if s in ratios]
    gm = math.exp(sum(map(math.log, target)) / len(target)) if target else math.nan
    longer = [ratios[s] for s in LONGER if s in ratios]
    d64 = [x for s, x in ratios.items() if s[0] == 64]
    worst = max(d64) if d64 else math.nan
    ok64 = (not bad and len(target) == len(TARGET) and gm <= GEOMEAN_MAX and len(longer) == len(LONGER)
            and max(longer) <= LONGER_MAX and worst <= WORST_MAX)
    d128 = ratios.get(D128, math.nan)
    lines.append(f"ldual/auto: geomean {gm:.3f} at D 64 B 1 Nk 32k (<= {GEOMEAN_MAX}), Nk 128k max "
                 f"{max(longer) if longer else math.nan:.3f} (<= {LONGER_MAX}), worst D 64 {worst:.3f} over {len(d64)} "
                 f"shapes (<= {WORST_MAX}), D 128 B 1 Nk 32k {d128:.3f} (<= {D128_MAX} for all); "
                 f"BAD/ERR: {', '.join(bad) or 'none'}")
    return ("all" if ok64 and d128 <= D128_MAX else "64" if ok64 else "off"), lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip())
        return 2
    path = Path(argv[0])
    if not path.exists():
        print(f"splits32_verdict: {path} not found (the A/B did not finish)")
        return 1
    decision, lines = verdict(json.loads(path.read_text())["results"])
    print("\n".join(lines))
    print(f"verdict: {'KEEP' if decision == 'off' else 'FLIP'} FA_VARIANTS_DECODE_LONG_DUAL default {decision!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
