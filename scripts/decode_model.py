"""Issue 13: a latency / bandwidth model of fa3's packed split-KV decode (seqlen_q = 1) on the H200, its fit to the
2026-12-01 s4 A/B (bench/h200-2026-12-01-s4/decode_ab.json) and its predictions for the split counts of
``common.split.num_splits_heuristic`` with ``min_tiles`` 2 (the default) and 1 (FA_VARIANTS_SPLIT_MIN_TILES=1).

    python3 scripts/decode_model.py            # predicted vs measured per shape, then the min_tiles=1 predictions
    python3 scripts/decode_model.py --full-grid   # batch 64 unsplit: dual waves vs a persistent grid (session 8)

Model (bench/NOTES.md, "Decode at B 1, short Nk: where the time goes"), GPU us per call under CUDA-graph replay:

    T = FIXED + (MERGE if splits > 1) + max(waves x tiles_per_cta x t_tile, K/V bytes / HBM_BW)   [- PDL_SAVING]

* FIXED: the split kernel's launch and ramp, its prologue (TMA descriptor prefetch, barrier init, the first Q and
  K/V tiles' TMA latency) and epilogue; MERGE: the merge kernel (its launch gap and two dependent load latencies);
* t_tile = TILE_LATENCY + tile KiB x PER_KIB: one CTA's time per K/V tile (an SM streams ~160 GB/s once the
  pipeline runs, plus ~0.45 us per tile of latency the 2-stage ring does not hide);
* waves = ceil(CTAs x splits / SMs) (one CTA per SM), tiles_per_cta = ceil(tiles / splits);
* HBM_BW: sustained DRAM bandwidth of a long decode (4.35 of 4.8 TB/s peak, the B 64 and 128k rows); a call whose
  K/V (<= L2_BYTES) stays in L2 between replays of the timing loop streams at L2_BW instead (B 1 Nk 1k / 4k: 4 / 17
  MB; B 8 Nk 1k D 128: 34 MB read in ~4.5 us, more than DRAM gives): the short-Nk timings are L2-warm, SDPA's too;
* PDL_SAVING: what the merge + attention kernel as programmatic dependents saved at B 1 Nk 1k (pdl2 vs auto).
Constants fitted by hand to the B 1 D 128 Nk 1k split ladder (1, 2, 4 splits, deep+pdl2), the D 64 unsplit row,
the B 64 rows (HBM) and B 8 Nk 1k D 128 (L2); the rest of the table is a check, not a fit. No GPU, no DSL.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMS = 132
FIXED_US = 5.2         # one split kernel: launch + ramp ~2, prologue (descriptors, Q + first K/V tile) ~1.5-2, epilogue
MERGE_US = 1.5         # merge kernel: launch gap ~1 + LSE/partial loads; 0 when not split
TILE_LATENCY_US = 0.45
PER_KIB_US = 0.00625   # 1 KiB / 0.00625 us = ~164 GB/s per SM
HBM_BW = 4.35e6        # bytes per us: 4.35 TB/s sustained (4.8 peak), the B 64 / Nk 128k rows
L2_BW = 6.5e6          # bytes per us when the call's K/V fits in L2: CUDA-graph replay reads the same K/V each call
L2_BYTES = 40e6        # of the H200's 50 MB L2
PDL_SAVING_US = 1.1
TILE_M, TILE_N = 64, 128  # the packed decode tiles (hopper.fa3._PACKED_SPLIT_CONFIGS, base)


def kv_bytes(d: int, hkv: int, b: int, nk: int) -> int:
    return b * hkv * nk * d * 2 * 2  # K and V, bf16


def predict_us(d: int, h: int, hkv: int, b: int, nk: int, splits: int, pdl: bool = False) -> dict:
    """Modelled GPU us of a packed seqlen_q = 1 call with `splits` splits, and its terms."""
    ctas = -(-(h // hkv) // TILE_M) * hkv * b
    tiles = -(-nk // TILE_N)
    per_cta = -(-tiles // splits)
    waves = -(-ctas * splits // SMS)
    t_tile = TILE_LATENCY_US + TILE_N * d * 4 / 1024 * PER_KIB_US
    stream_sm = waves * per_cta * t_tile
    nbytes = kv_bytes(d, hkv, b, nk)
    stream_hbm = nbytes / (L2_BW if nbytes <= L2_BYTES else HBM_BW)
    fixed = FIXED_US + (MERGE_US if splits > 1 else 0.0) - (PDL_SAVING_US if pdl else 0.0)
    return dict(us=fixed + max(stream_sm, stream_hbm), fixed=fixed, stream_sm=stream_sm, stream_hbm=stream_hbm,
                ctas=ctas * splits, tiles_per_cta=per_cta, waves=waves)


def heuristic(d: int, h: int, hkv: int, b: int, nk: int, min_tiles: int | None = None) -> int:
    from fa_variants.common import split

    return split.num_splits_heuristic(-(-(h // hkv) // TILE_M) * hkv * b, -(-nk // TILE_N), SMS, min_tiles=min_tiles)


def check_against(path: Path) -> list[tuple]:
    """(label, splits, measured us, predicted us) of the `auto` and `pdl2` entries of a decode_ab.json (base tiles)."""
    rows = []
    for r in json.loads(path.read_text())["results"]:
        d, h, hkv, b, nk = r["shape"][:5]
        if len(r["shape"]) > 5:
            continue
        for name, pdl in (("auto", False), ("pdl2", True)):
            if name in r["us"] and name in r["splits"]:
                s = r["splits"][name]
                rows.append((f"D{d} {h}:{hkv} B{b} Nk{nk} {name}", s, r["us"][name],
                             predict_us(d, h, hkv, b, nk, s, pdl and s > 1)["us"], r["us"]["sdpa"]))
    return rows


# Session 8: unsplit packed seqlen_q = 1 calls of many short CTAs (B 64 x 8 KV heads = 512 CTAs, Nk <= 4k), GPU us:
#   dual (2 CTAs per SM, 264 slots): T = LAUNCH + waves x WAVE_STEP + K/V bytes / STREAM_BW, waves = ceil(CTAs / slots)
#   persistent (1 CTA per SM walks its tiles): T = LAUNCH + WAVE_STEP + K/V bytes / STREAM_BW + (tiles per CTA - 1) x
#   ITEM_STEP (0 .. ITEM_STEP_MAX: what the producer's prefetch of the next tile's Q and K/V does not hide); PDL: - LAUNCH
#   at most. The two CTAs of an SM start and end each wave together, so each wave pays the launch / prologue / first
#   K/V latency / drain with nothing else in flight on the SM. Fitted to the s7 decode table's batch-64 rows (Nk 1k and
#   4k, D 64 / 128, the dual tiles): marginal 4.53 TB/s (Nk 4k - Nk 1k), intercept 5.5-6.2 us = LAUNCH + 2 x WAVE_STEP.
FULL_GRID_TABLE = ROOT / "bench" / "h200-2026-12-01-s7" / "decode_bench.md"
LAUNCH_US = 1.0
WAVE_STEP_US = 2.4
STREAM_BW = 4.53e6     # bytes per us
ITEM_STEP_MAX_US = 0.3


def full_grid_us(d: int, hkv: int, b: int, nk: int, grid: str) -> tuple[float, float]:
    """(low, high) modelled GPU us of an unsplit packed seqlen_q = 1 call run by ``grid`` ("dual" or "persistent")."""
    ctas = hkv * b
    stream = kv_bytes(d, hkv, b, nk) / STREAM_BW
    if grid == "dual":
        t = LAUNCH_US + -(-ctas // (2 * SMS)) * WAVE_STEP_US + stream
        return t, t
    t = LAUNCH_US + WAVE_STEP_US + stream
    return t, t + (-(-ctas // SMS) - 1) * ITEM_STEP_MAX_US


def full_grid_rows(path: Path = FULL_GRID_TABLE) -> list[tuple]:
    """(d, h, hkv, b, nk, ours us, sdpa us) of the batch-64 seqlen_q 1 rows at Nk <= 4k of a `bench --decode` table."""
    got = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 7 or not cells[0].isdigit():
            continue
        d, gqa, b, nk, nq, impl, us = cells[:7]
        if int(b) == 64 and int(nq) == 1 and int(nk) <= 4096:
            h, hkv = map(int, gqa.split(":"))
            got.setdefault((int(d), h, hkv, int(b), int(nk)), {})[impl.split()[0]] = float(us)
    return [(*k, v["ours"], v["sdpa"]) for k, v in sorted(got.items())]


def print_full_grid() -> None:
    print(f"batch 64 unsplit decode: the dual waves (fit) and a persistent grid (prediction) vs "
          f"{FULL_GRID_TABLE.relative_to(ROOT)}, GPU us")
    print("| shape | measured (dual) | model dual | model persistent | persistent / measured | persistent / SDPA |")
    print("|---|---|---|---|---|---|")
    for d, h, hkv, b, nk, ours, sdpa in full_grid_rows():
        dual = full_grid_us(d, hkv, b, nk, "dual")[0]
        lo, hi = full_grid_us(d, hkv, b, nk, "persistent")
        print(f"| D{d} {h}:{hkv} B{b} Nk{nk} | {ours:.1f} | {dual:.1f} | {lo:.1f}-{hi:.1f} | {lo / ours:.2f}-{hi / ours:.2f} "
              f"| {lo / sdpa:.2f}-{hi / sdpa:.2f} |")


def main() -> int:
    if "--full-grid" in sys.argv[1:]:
        print_full_grid()
        return 0
    path = ROOT / "bench" / "h200-2026-12-01-s4" / "decode_ab.json"
    rows = check_against(path)
    print(f"model vs {path.relative_to(ROOT)} (GPU us; base tiles, two kernels)")
    print("| shape | splits | measured | model | model/measured |\n|---|---|---|---|---|")
    for label, s, got, model, _ in rows:
        print(f"| {label} | {s} | {got:.1f} | {model:.1f} | {model / got:.2f} |")
    errs = [abs(math.log(m / g)) for _, _, g, m, _ in rows]
    print(f"geomean |log error| {math.exp(sum(errs) / len(errs)):.3f}x over {len(rows)} entries")
    print("\npredictions, min_tiles 2 (default) -> 1 (FA_VARIANTS_SPLIT_MIN_TILES=1), shapes whose count changes:")
    print("| shape | splits | model us (no PDL) | with PDL (merge + kernel) | SDPA measured |\n|---|---|---|---|---|")
    sdpa = {tuple(r["shape"]): r["us"]["sdpa"] for r in json.loads(path.read_text())["results"]}
    for d in (64, 128):
        for h in (32, 64):
            for b in (1, 2, 4, 8):
                for nk in (1024, 2048, 4096, 32768):
                    old, new = heuristic(d, h, 8, b, nk), heuristic(d, h, 8, b, nk, 1)
                    if old == new:
                        continue
                    p_old, p_new = (predict_us(d, h, 8, b, nk, s) for s in (old, new))
                    q_old, q_new = (predict_us(d, h, 8, b, nk, s, True) for s in (old, new))
                    ref = sdpa.get((d, h, 8, b, nk))
                    print(f"| D{d} {h}:8 B{b} Nk{nk} | {old} -> {new} | {p_old['us']:.2f} -> {p_new['us']:.2f} | "
                          f"{q_old['us']:.2f} -> {q_new['us']:.2f} | {f'{ref:.1f}' if ref else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
