"""The decode GPU scripts' CPU-side logic: scripts/decode_ab.py's plans (split counts, variants, module switches
restored), compile jobs and summaries, scripts/decode_model.py's fits to earlier H200 runs, scripts/fa2split_bench.py."""
import subprocess

from helpers import ROOT, load_script


def test_decode_ab_plan_and_summary():
    """scripts/decode_ab.py: the plan's split counts follow each variant's tiles and policy; variants that would
    repeat another (nosplit where nothing splits, wide at D 128) are left out; the summary counts wins."""
    ab = load_script("decode_ab")
    rows = ab.plan(ab.MISSES, list(ab.VARIANTS), 132)
    by = {(r["shape"], r["variant"]): r for r in rows}
    b1 = (64, 32, 8, 1, 4096)  # 8 packed CTAs, 32 tiles of 128 keys (22 of 192)
    assert by[(b1, "deep")]["splits"] == 16 and by[(b1, "deep+pdl2 nosplit")]["splits"] == 1
    assert by[(b1, "deep+pdl2/2")]["splits"] == 8 and by[(b1, "wide+pdl2")]["config"].tile_n == 192
    assert by[(b1, "deep+pdl2")]["pdl"] and not by[(b1, "deep")]["pdl"] and by[(b1, "pdl")]["pdl"]
    assert by[(b1, "pdl2")]["config"].pdl and not by[(b1, "pdl")]["config"].pdl
    b64 = (64, 32, 8, 64, 1024)  # 512 CTAs: never split, so no nosplit / half rows, and no PDL merge
    assert (b64, "deep+pdl2 nosplit") not in by and by[(b64, "pdl")]["config"].num_splits == 1
    assert by[(b64, "pdl2")]["config"].pdl and by[(b64, "pdl2")]["config"].num_splits == 1
    assert not any(s[0] == 128 and v == "wide+pdl2" for s, v in by)
    results = [dict(shape=b1, us=dict(sdpa=10.0, auto=12.0, deep=9.0), err=dict(sdpa=0.0, auto=0.001, deep=0.5),
                    splits=dict(auto=16, deep=16))]
    text = ab.summary(results, ["auto", "deep"])
    assert "| D64 32:8 B1 Nk4096 | 10.0 | 1.20 (16) | BAD |" in text
    assert "auto             0 /   1" in text
    assert subprocess.run(["python3", str(ROOT / "scripts" / "decode_ab.py"), "--help"], capture_output=True).returncode == 0


def test_decode_ab_public_variants():
    """scripts/decode_ab.py's public-path variants (fa3's module switches per call): `fused` runs the fused split
    merge where `auto` splits (seqlen_q 1 and 16), never where it does not (batch 64), with `auto`'s split count;
    the switches are restored after planning; WINS shapes carry seqlen_q in their label."""
    from fa_variants.hopper import fa3

    ab = load_script("decode_ab")
    before = ab.get_flags(fa3)
    shapes = [(128, 32, 8, 1, 4096), (128, 32, 8, 1, 4096, 16), (128, 32, 8, 64, 4096, 16)]
    by = {(r["shape"], r["variant"]): r for r in ab.plan(shapes, ["two", "fused", "dual+fused+pdl2"], 132)}
    assert ab.get_flags(fa3) == before
    assert by[(shapes[0], "fused")]["config"].fused_merge and not by[(shapes[0], "two")]["config"].fused_merge
    assert by[(shapes[0], "fused")]["splits"] == by[(shapes[0], "two")]["splits"] == 16
    assert by[(shapes[1], "fused")]["config"].pack_group == 4 and by[(shapes[1], "fused")]["config"].fused_merge
    assert by[(shapes[2], "fused")]["splits"] == 1 and not by[(shapes[2], "fused")]["config"].fused_merge
    dual = by[(shapes[0], "dual+fused+pdl2")]["config"]
    assert dual.ctas_per_sm == 2 and dual.pdl and dual.fused_merge
    assert ab.label(shapes[1]) == "D128 32:8 B1 Nk4096 Nq16" and ab.label(shapes[0]) == "D128 32:8 B1 Nk4096"
    assert all(r.get("public") for r in by.values())


def test_fa2split_bench_plan_and_summary():
    """scripts/fa2split_bench.py: fa2's split counts on an H200 (B1 decode split, B64 not); the summary's ratios,
    BAD cells (an output off SDPA's) left out of the geomeans, and the win count."""
    bench = load_script("fa2split_bench")
    assert len(bench.shapes()) == 27 and bench.shapes()[-1] == (64, 16, 32768)
    assert bench.planned_splits((1, 1, 4096), "sm_90a", 132) == 8
    assert bench.planned_splits((64, 1, 4096), "sm_90a", 132) == 1
    assert bench.planned_splits((1, 1, 4096), "sm_90a", 132, pack=True) == 32
    ok = dict(sdpa=0.0, nosplit=0.001, split=0.002)
    results = [dict(shape=(1, 1, 4096), splits=8, pack_splits=32, us=dict(sdpa=10.0, nosplit=120.0, split=8.0, pack=5.0),
                    err=dict(ok, pack=0.001)),
               dict(shape=(64, 4, 4096), splits=1, us=dict(sdpa=50.0, nosplit=60.0, split=60.0),
                    err=dict(ok, split=0.5))]
    text = bench.summary(results)
    assert "| B1 Nq1 Nk4096 | 10.0 | 120.0 | 8.0 (8) | 5.0 (32) | 0.80 | 15.00 | 0.50 |" in text
    assert "| B64 Nq4 Nk4096 | 50.0 | 60.0 | BAD (1) | - | - | - | - |" in text
    assert "1/2 shapes timed and correct" in text and "split <= sdpa at 1/1 shapes; pack <= sdpa at 1/1" in text
    assert "geomean split/sdpa     0.800" in text
    assert subprocess.run(["python3", str(ROOT / "scripts" / "fa2split_bench.py"), "--help"],
                          capture_output=True).returncode == 0


def test_decode_compile_jobs_are_one_piece(monkeypatch, capsys):
    """scripts/decode_ab.py's compile_item / compile_all (one piece): each kind compiled under the key its run looks
    up (fa2: the launcher's default static config; merge: split-merge with the pdl flag; fa3: its config, causal);
    the A/B plan's items are well formed; compile_all skips with the disk cache off."""
    from fa_variants import registry
    from fa_variants.common import diskcache
    from fa_variants.hopper import fa3

    ab = load_script("decode_ab")
    seen = []
    monkeypatch.setattr(registry, "compiled", seen.append)
    config = fa3._PACKED_SPLIT_CONFIGS[128]
    for item in (("fa2", 128, True, None), ("merge", 64, False, True), ("fa3", 128, True, config)):
        assert ab.compile_item(item).startswith(f"{item[0]} D{item[1]} ")
    assert seen[0] == registry.variant("fa2").static_config("sm_90a", "bf16", 128, True)
    assert seen[1].variant == "split-merge" and seen[1].config.pdl and seen[1].head_dim == 64
    assert seen[2] == registry.static_config("fa3", "sm_90a", "bf16", 128, True, config)
    listed = sorted(ab.plan_items(ab.plan(ab.MISSES, ["two"], ab.NUM_SMS_DEFAULT)), key=repr)
    assert listed and all(len(item) == 4 and item[0] in ("fa3", "fa2", "merge") for item in listed)
    monkeypatch.setattr(diskcache, "enabled", lambda: False)
    assert ab.compile_all(listed, 2, "decode_precompile") == 0
    assert "decode_precompile: skipped" in capsys.readouterr().out


def test_decode_model_fits_the_s4_run_and_predicts_min_tiles_one():
    """scripts/decode_model.py: the latency / bandwidth model is within 12% of every `auto` entry of the 2026-12-01 s4
    A/B (bench/h200-2026-12-01-s4/decode_ab.json), and with one-tile splits (FA_VARIANTS_SPLIT_MIN_TILES=1) it
    predicts B 1 Nk 1k faster (8 splits, max(1 tile, bytes) instead of 2 tiles) and nothing else of that run changed."""
    import json

    model = load_script("decode_model")
    run = ROOT / "bench" / "h200-2026-12-01-s4" / "decode_ab.json"
    rows = model.check_against(run)
    auto = [r for r in rows if r[0].endswith(" auto")]
    assert len(auto) == 32 and all(0.88 <= m / g <= 1.12 for _, _, g, m, _ in auto), auto
    for d in (64, 128):
        assert model.heuristic(d, 32, 8, 1, 1024, 2) == 4 and model.heuristic(d, 32, 8, 1, 1024, 1) == 8
        old, new = model.predict_us(d, 32, 8, 1, 1024, 4), model.predict_us(d, 32, 8, 1, 1024, 8)
        assert new["us"] < old["us"] and new["tiles_per_cta"] == 1 and new["ctas"] == 64
    for shape in {tuple(r["shape"][:5]) for r in json.loads(run.read_text(encoding="utf-8"))["results"]}:
        if shape[4] > 1024 or shape[3] > 1:  # (batch 1 and 8 / 64 in that run)
            assert model.heuristic(*shape, 2) == model.heuristic(*shape, 1), shape


def test_decode_ab_min1_variants():
    """scripts/decode_ab.py --short-nk: min1 runs the count of one-tile splits (B 1 Nk 1k: 8, forced; `auto` 4),
    the same count as `auto` elsewhere, unsplit where nothing splits; +pdl / +pdl2 set the PDL flags."""
    ab = load_script("decode_ab")
    shapes = ab.SHORT_NK + ab.CONTROLS
    assert len(shapes) == 20 and len(set(shapes)) == 20
    by = {(r["shape"], r["variant"]): r for r in ab.plan(shapes, ["min1", "min1+pdl2"], 132)}
    short = (128, 32, 8, 1, 1024)
    assert ab.entry("min1", short, 132)[1] == 8 and by[(short, "min1")]["splits"] == 8
    assert not by[(short, "min1")]["pdl"] and by[(short, "min1+pdl2")]["config"].pdl
    assert by[((128, 32, 8, 1, 4096), "min1")]["splits"] == 16 and by[((64, 32, 8, 8, 1024), "min1")]["splits"] == 2
    full = by[((128, 64, 8, 64, 4096), "min1")]
    assert full["splits"] == 1 and full["config"].num_splits == 1


def _decode_ab_before_s7_flips(ab, monkeypatch):
    """decode_ab planned with the switches shipped when its --s6 and --s7 plans ran (before session 7 turned
    first_row_only on and the warp merge on at >= 8 splits): what those plans were written for."""
    monkeypatch.setitem(ab.SHIPPED, "MERGE_WARP", False)
    monkeypatch.setitem(ab.SHIPPED, "DECODE_FIRST_ROW", False)
    from fa_variants.common import split_combine
    from fa_variants.hopper import fa3

    monkeypatch.setattr(split_combine, "MERGE_WARP", False)
    monkeypatch.setattr(fa3, "DECODE_FIRST_ROW", False)


def test_decode_ab_s6_variants(monkeypatch):
    """scripts/decode_ab.py --s6: `old` is auto before session 6 (B 1 Nk 1k: 4 splits, no
    PDL) where the shipped `two` runs 8 with PDL; wide (and the shipped default at D 64) packs 64:8 Nq 16 in one
    128-row tile, old two 64-row ones; dualauto (and the shipped default) runs two CTAs per SM at B 64 Nk 1k, old not; the switches (fa3's and split_combine.MERGE_WARP) are restored after planning; the HBM lines
    cover the Nk 32k shapes."""
    from fa_variants.hopper import fa3

    ab = load_script("decode_ab")
    _decode_ab_before_s7_flips(ab, monkeypatch)
    assert len(ab.S6) == 29 == len(set(ab.S6))
    before = ab.get_flags(fa3)
    variants = ["two", "old", "warp", "dualauto", "wide", "cand"]
    by = {(r["shape"], r["variant"]): r for r in ab.plan(ab.S6, variants, 132)}
    assert ab.get_flags(fa3) == before
    b1 = (128, 32, 8, 1, 1024)
    assert (by[(b1, "old")]["splits"], by[(b1, "old")]["config"].pdl) == (4, False)
    assert (by[(b1, "two")]["splits"], by[(b1, "two")]["config"].pdl) == (8, True)
    nq16 = (64, 64, 8, 64, 32768, 16)
    assert by[(nq16, "wide")]["config"].tile_m == by[(nq16, "two")]["config"].tile_m == 128
    assert by[(nq16, "old")]["config"].tile_m == 64
    assert by[(nq16, "cand")]["config"].tile_m == 128
    b64 = (64, 32, 8, 64, 1024)
    assert by[(b64, "dualauto")]["config"].ctas_per_sm == by[(b64, "two")]["config"].ctas_per_sm == 2
    assert by[(b64, "old")]["config"].ctas_per_sm == 1 and by[((64, 32, 8, 8, 1024), "two")]["config"].ctas_per_sm == 1
    results = [dict(shape=nq16, us=dict(sdpa=8796.5, auto=1900.1, wide=1000.0), err={}, splits={})]
    lines = ab.hbm_lines(results, ["auto", "wide"])
    assert lines[-1] == "  D64 64:8 B64 Nk32768 Nq16: 10 47 89", lines
    lines = ab.hbm_lines(results, ["auto", "wide"], 3.35)  # an H100's peak
    assert lines[-1] == "  D64 64:8 B64 Nk32768 Nq16: 15 67 128" and "3.35 TB/s" in lines[1], lines


def test_decode_ab_s7_plan_skips_entries_equal_to_auto(monkeypatch):
    """scripts/decode_ab.py --s7: warp runs where there is a merge (not at the unsplit B 64
    shapes), warp+pdl16 only where it adds PDL (16 splits at seqlen_q 1: B 1 Nk 4k / 32k), row1 at seqlen_q 1 only
    (the unsplit dual B 64 shape too); first_row_only reaches the configs; the vs-auto lines."""
    from fa_variants.hopper import fa3

    ab = load_script("decode_ab")
    _decode_ab_before_s7_flips(ab, monkeypatch)
    assert len(ab.S7) == 19 == len(set(ab.S7))
    before = ab.get_flags(fa3)
    variants = ["warp", "warp+pdl16", "row1"]
    rows = ab.plan(ab.S7, variants, 132, skip_same=True)
    assert ab.get_flags(fa3) == before
    by = {(r["shape"], r["variant"]): r for r in rows}
    b1 = (64, 32, 8, 1, 4096)
    assert by[(b1, "warp")]["splits"] == 16 and by[(b1, "warp+pdl16")]["config"].pdl and not by[(b1, "warp")]["config"].pdl
    assert ((64, 32, 8, 8, 1024), "warp+pdl16") not in by  # 2 splits: PDL already
    b64 = [v for s, v in by if s == (64, 32, 8, 64, 1024)]  # unsplit dual tiles: only first_row_only differs
    assert b64 == ["row1"] and by[((64, 32, 8, 64, 1024), "row1")]["config"].ctas_per_sm == 2
    assert by[(b1, "row1")]["config"].first_row_only and not by[(b1, "warp")]["config"].first_row_only
    assert ((64, 64, 8, 1, 32768, 16), "row1") not in by
    nq16 = (64, 64, 8, 64, 32768, 16)
    assert (nq16, "warp") not in by
    results = [dict(shape=nq16, us=dict(sdpa=8800.0, auto=1500.0, row1=1200.0), err=dict(sdpa=0.0, auto=0.0, row1=0.001),
                    splits={}),
               dict(shape=b1, us=dict(sdpa=8.0, auto=9.0, row1=9.9), err=dict(sdpa=0.0, auto=0.0, row1=0.001), splits={})]
    lines = ab.auto_lines(results, ["auto", "row1"])
    assert lines[-1] == ("  row1           vs auto: faster  1 /  2, geomean 0.938, best 0.800 (D64 64:8 B64 Nk32768 Nq16), "
                         "worst 1.100 (D64 32:8 B1 Nk4096)"), lines


def test_decode_ab_s8_plan():
    """scripts/decode_ab.py --s8: pdl16 only at seqlen_q 1 shapes of 16 splits; the module switches untouched by
    planning."""
    from fa_variants.hopper import fa3

    ab = load_script("decode_ab")
    assert len(ab.S8) == 13 == len(set(ab.S8))
    before = ab.get_flags(fa3)
    rows = ab.plan(ab.S8, ["pdl16"], 132, skip_same=True)
    assert ab.get_flags(fa3) == before
    by = {(r["shape"], r["variant"]): r for r in rows}
    nq1 = (64, 32, 8, 1, 32768)
    assert by[(nq1, "pdl16")]["config"].pdl and by[(nq1, "pdl16")]["splits"] == 16
    assert not any(len(s) == 6 for s, v in by if v == "pdl16")  # seqlen_q > 1: not PDL calls


def test_decode_ab_s34_plan():
    """scripts/decode_ab.py --s34: the long one-row shapes; tiles-deep runs the deep tile set (more stages) and
    tiles-dual two CTAs per SM at every shape, including the unsplit batch-64 ones `auto` runs on the base tiles."""
    from fa_variants.hopper import fa3

    ab = load_script("decode_ab")
    assert len(ab.S34) == 14 == len(set(ab.S34)) and all(len(s) == 5 for s in ab.S34)
    before = ab.get_flags(fa3)
    rows = ab.plan(ab.S34, ["tiles-deep", "tiles-dual"], 132, skip_same=True)
    assert ab.get_flags(fa3) == before
    by = {(r["shape"], r["variant"]): r for r in rows}
    for d in (64, 128):
        shape = (d, 32, 8, 64, 131072)
        auto, splits = ab.public_entry("shipped", shape, 132)
        deep, dual = (by[(shape, v)]["config"] for v in ("tiles-deep", "tiles-dual"))
        assert deep.stages > auto.stages and dual.ctas_per_sm == 2 > auto.ctas_per_sm, (d, auto, deep, dual)
        assert splits == 1 == by[(shape, "tiles-deep")]["splits"]


def test_decode_ab_s35_plan():
    """scripts/decode_ab.py --s35: the ten one-row shapes above SDPA on session 35's H100; each variant runs a
    config other than auto's where it differs (skip_same), and at least one differs at every shape."""
    ab = load_script("decode_ab")
    assert len(ab.S35) == 10 == len(set(ab.S35)) and all(len(s) == 5 for s in ab.S35)
    assert (64, 64, 8, 64, 4096) in ab.S35 and (128, 32, 8, 1, 131072) in ab.S35
    rows = ab.plan(ab.S35, ["tiles-deep", "tiles-dual", "base"], 132, skip_same=True)
    assert {r["shape"] for r in rows} == set(ab.S35)
    for r in rows:
        auto = ab.public_entry("shipped", r["shape"], 132)
        assert (r["config"], r["splits"]) != auto, r


def test_decode_ab_s38_plan():
    """scripts/decode_ab.py --s38: batch 64 x 8 KV heads at Nk 1k / 2k / 4k, D 64 / 128, 32:8 / 64:8 (12 shapes), where
    `auto` runs the dual tiles (two CTAs per SM); ``base`` runs one CTA per SM at every shape, and tiles-dual is
    skipped as auto's own config (skip_same)."""
    ab = load_script("decode_ab")
    assert len(ab.S38) == 12 == len(set(ab.S38)) and {s[3] for s in ab.S38} == {64}
    rows = ab.plan(ab.S38, ["base", "tiles-dual"], 132, skip_same=True)
    assert {r["shape"] for r in rows} == set(ab.S38) and {r["variant"] for r in rows} == {"base"}
    for r in rows:
        auto, _ = ab.public_entry("shipped", r["shape"], 132)
        assert auto.ctas_per_sm == 2 and r["config"].ctas_per_sm == 1, r


def test_decode_model_full_grid_fits_the_s7_batch_64_rows():
    """scripts/decode_model.py --full-grid: the dual-wave model is within 3% of each batch-64 seqlen_q 1 row at Nk <= 4k
    of the s7 decode table (8 rows, D 64 / 128), and predicts the persistent grid faster by at most the waves' cost."""
    model = load_script("decode_model")
    rows = model.full_grid_rows()
    assert len(rows) == 8
    for d, h, hkv, b, nk, ours, sdpa in rows:
        dual = model.full_grid_us(d, hkv, b, nk, "dual")[0]
        lo, hi = model.full_grid_us(d, hkv, b, nk, "persistent")
        assert 0.97 <= dual / ours <= 1.03, (d, h, nk, dual, ours)
        assert dual - model.WAVE_STEP_US - 1e-9 <= lo <= hi < dual, (d, h, nk, lo, hi, dual)


def test_median_ms_is_the_median_time_per_call(monkeypatch):
    """fa_variants.bench.decode.median_ms (decode_ab's and kvlayout_probe's graph timing, bench --decode's): the median
    over reps of a run's event time divided by the calls it holds; each rep records, runs, records, synchronises."""
    import torch

    from fa_variants.bench import decode

    clock, runs = [0.0], []

    class Event:  # CUDA events on the CPU: record() stamps a fake clock, elapsed_time in ms
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.t = None

        def record(self):
            self.t = clock[0]

        def synchronize(self):
            assert self.t is not None

        def elapsed_time(self, end):
            return end.t - self.t

    def run():  # reps take 10, 40, 20, 30, 50 ms
        runs.append(1)
        clock[0] += (10.0, 40.0, 20.0, 30.0, 50.0)[len(runs) - 1]

    monkeypatch.setattr(torch.cuda, "Event", Event)
    assert decode.median_ms(run, calls=10, reps=5) == 3.0 and len(runs) == 5
