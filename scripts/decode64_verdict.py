"""The verdict of scripts/decode64_gpu.sh's A/B (decode_ab.py --s12 --variants fused1): per shape the GPU time of
`fused1` (FA_VARIANTS_FUSED_MERGE=decode) over `auto`'s and the HBM share (K/V bytes / GPU time / 4.8 TB/s) of SDPA,
auto and fused1 at Nk >= 32k; then FLIP or KEEP by the rule of bench/NOTES.md ("Session 12 (2026-12-02): decode at
head_dim 64 ..."): FLIP when no entry is BAD/ERR, the geometric mean of fused1 / auto over the D 64 B 1 Nk 32k
seqlen_q 1 shapes is <= 0.97 and fused1 / auto is <= 1.02 at every shape it ran. (The GPU tests are the script's
other pass line.)

    python3 scripts/decode64_verdict.py $OUT/decode_ab/decode_ab.json
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

HBM_PEAK = 4.8e6  # bytes per us
TARGET = [(64, 32, 8, 1, 32768, 1), (64, 64, 8, 1, 32768, 1)]  # what the lever is for
GEOMEAN_MAX, WORST_MAX = 0.97, 1.02


def _key(shape) -> tuple:
    shape = tuple(shape)
    return shape if len(shape) > 5 else shape + (1,)


def verdict(results: list[dict]) -> tuple[str, list[str]]:
    """(FLIP / KEEP, the lines to print) from decode_ab's results (shape, us, err per entry)."""
    lines, ratios, bad = [], {}, []
    for r in results:
        shape, us, err = _key(r["shape"]), r["us"], r["err"]
        bad += [f"{shape} {n}" for n, e in err.items() if not isinstance(e, float) or e > 0.02]
        ratio = us["fused1"] / us["auto"] if "fused1" in us and "auto" in us else None
        if ratio is not None:
            ratios[shape] = ratio
        d, h, hkv, b, nk, nq = shape
        hbm = ""
        if nk >= 32768:
            share = lambda n: f"{100 * 4 * b * hkv * nk * d / us[n] / HBM_PEAK:.0f}%" if n in us else "-"  # noqa: E731
            hbm = f"  HBM sdpa {share('sdpa')} auto {share('auto')} fused1 {share('fused1')}"
        cell = f"{ratio:.3f}" if ratio is not None else "-"
        lines.append(f"D{d} {h}:{hkv} B{b} Nk{nk} Nq{nq}: auto {us.get('auto', math.nan):.1f} us, fused1/auto {cell}{hbm}")
    target = [ratios[s] for s in TARGET if s in ratios]
    gm = math.exp(sum(map(math.log, target)) / len(target)) if target else math.nan
    worst = max(ratios.values()) if ratios else math.nan
    ok = not bad and len(target) == len(TARGET) and gm <= GEOMEAN_MAX and worst <= WORST_MAX
    lines.append(f"fused1/auto: geomean {gm:.3f} at D 64 B 1 Nk 32k Nq 1 (<= {GEOMEAN_MAX}), worst {worst:.3f} over "
                 f"{len(ratios)} shapes (<= {WORST_MAX}); BAD/ERR: {', '.join(bad) or 'none'}")
    return ("FLIP" if ok else "KEEP"), lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip())
        return 2
    path = Path(argv[0])
    if not path.exists():
        print(f"decode64_verdict: {path} not found (the A/B did not finish)")
        return 1
    decision, lines = verdict(json.loads(path.read_text())["results"])
    print("\n".join(lines))
    print(f"verdict: {decision} FA_VARIANTS_FUSED_MERGE default 'decode'")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
