"""The fa3-fp8 GPU scripts' CPU-side logic: scripts/fa3_fp8_speed_ab.py's variant sets (plans, precompile jobs against
tests/test_fa3_fp8_speed_gpu.py's tables, summaries, --drop / --drop-failed), and the precompile and test selection of
scripts/bounded_gpu.sh and scripts/fp8status_gpu.sh."""
import re

import pytest
from helpers import ROOT, collected_ids, load_script


def test_fp8flip_plan_and_verdict():
    """scripts/fa3_fp8_speed_ab.py --set fp8flip on the CPU: its precompile covers every timed variant in both causal
    modes (the tests run both) and test_every_recipe's head_dim 64 recipes; the flip's pass line fails when the new
    defaults fall below 0.97x the old ones in any problem, and passes otherwise."""
    ab = load_script("fa3_fp8_speed_ab")
    jobs = ab.compile_jobs([64, 128, 256], [False], tests=True, variant_set="fp8flip")
    for D, variants in ab.FLIP_VARIANTS.items():
        for change in variants.values():
            for causal in (False, True):
                assert ("fp8", D, causal, ab._freeze(change)) in jobs, (D, change, causal)
    assert {d for kind, d, _causal, change in jobs if kind == "recipe" and change[0] == "float16"} == {64}
    good = {(64, 4096, False): {"new": 103.0, "old": 100.0}, (256, 16384, True): {"new": 98.0, "old": 100.0}}
    assert ab.flip_lines(good)[-1].endswith("PASS") and "geometric mean over 2 problems" in ab.flip_lines(good)[-2]
    bad = {**good, (128, 4096, True): {"new": 96.0, "old": 100.0}}
    assert "FAIL" in ab.flip_lines(bad)[-1] and "(128, 4096, True)" in ab.flip_lines(bad)[-1]


def test_fa3_fp8_speed_ab_fp8small_set(capsys, monkeypatch):
    """--set fp8small: head_dim 64/128 only; every variant tests/test_fa3_fp8_speed_gpu.py
    runs as "fp8small-d<D>-<name>" is the timed one of that name, compiled in both causal modes, a valid config."""
    import test_fa3_fp8_speed_gpu as gpu_tests

    ab = load_script("fa3_fp8_speed_ab")
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", "fp8small"])
    assert ab.main() == 0
    out = capsys.readouterr().out
    assert "set: fp8small" in out and "head dims [64, 128]" in out
    jobs = set(ab.compile_jobs([64, 128], [False], variant_set="fp8small"))
    names = {f"fp8small-d{D}-{n}" for D, variants in ab.FP8SMALL_VARIANTS.items() for n in variants if n != "new"}
    assert names == set(gpu_tests.FP8SMALL_VARIANTS)
    for name, (D, change) in gpu_tests.FP8SMALL_VARIANTS.items():
        assert ab.FP8SMALL_VARIANTS[D][name.split("-", 2)[2]] == change, name
        ab.kernel_config(D, change).check(D)
        for causal in (False, True):
            assert ("fp8", D, causal, ab._freeze(change)) in jobs, (name, causal)
    tf = dict(new=800.0, c4=850.0, m192_c4=930.0, single_m192_c4=960.0, bf16_fa3=650.0)
    speed = [dict(head_dim=128, seqlen=4096, causal=False, impl=n, tflops=t) for n, t in tf.items()]
    text = ab.two_level_target_lines(speed)
    assert "- d128 N4096 causal=0: m192_c4 930 TFLOP/s = 1.43x bf16 fa3 (target >= 1.4): met, two-level cost +3.2%" in text
    speed[2]["tflops"] = 900.0
    assert "m192_c4 900 TFLOP/s = 1.38x bf16 fa3 (target >= 1.4): NOT met, two-level cost +6.7%" in ab.two_level_target_lines(speed)


def test_fa3_fp8_speed_ab_fp8d256b_halves_cost(capsys, monkeypatch):
    """--set fp8d256b: the plan, and the halves-cost lines: one MMA / two halves - 1 per
    schedule and problem, the default's two-level cost, the mean and the verdict on the session-7 hypothesis."""
    ab = load_script("fa3_fp8_speed_ab")
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", "fp8d256b", "--head-dims", "256"])
    assert ab.main() == 0
    assert "'old_halves', 'single', 'single_overlap', 'single_overlap_halves'" in capsys.readouterr().out
    tf = dict(new=1000.0, old=950.0, old_halves=880.0, single=1045.0, single_overlap=1150.0, single_overlap_halves=1030.0)
    speed = [dict(head_dim=256, seqlen=4096, causal=False, impl=n, tflops=t) for n, t in tf.items()]
    text = ab.halves_cost_lines(speed)
    assert ("- d256 N4096 causal=0: old_halves +8.0%, single_overlap_halves +11.7%; promotions in the serial steps "
            "(single / old - 1) +10.0%; default's two-level cost +15.0%") in text
    assert "- mean halves cost +9.8% over 2 pairs: hypothesis (>= 6%) SUPPORTED" in text
    speed[2]["tflops"], speed[5]["tflops"] = 940.0, 1140.0
    assert "hypothesis (>= 6%) REJECTED" in ab.halves_cost_lines(speed)


def _check_fp8_small_set_plan(capsys, monkeypatch, variant_set: str, table: str, tested: dict, untested=()):
    """scripts/fa3_fp8_speed_ab.py --plan --set `variant_set` (head_dim 64/128 only): every timed variant of its
    `table` is a valid config compiled in both causal modes and, but "new" and names starting with `untested`, run
    by tests/test_fa3_fp8_speed_gpu.py with the same change (`tested`: its tables); every GPU test of that table
    names a timed variant. Returns the loaded script."""
    import test_fa3_fp8_speed_gpu as gpu_tests

    ab = load_script("fa3_fp8_speed_ab")
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", variant_set])
    assert ab.main() == 0
    out = capsys.readouterr().out
    assert f"set: {variant_set}" in out and "head dims [64, 128]" in out
    jobs = set(ab.compile_jobs([64, 128], [False], variant_set=variant_set))
    timed = getattr(ab, table)
    for D, variants in timed.items():
        for name, change in variants.items():
            ab.kernel_config(D, change).check(D)
            if name != "new" and not name.startswith(untested):
                assert (D, change) in tested.values(), name
            for causal in (False, True):
                assert ("fp8", D, causal, ab._freeze(change)) in jobs, (name, causal)
    assert all(name.split("-", 2)[2] in timed[D] for name, (D, _) in getattr(gpu_tests, table).items())
    return ab


def test_fa3_fp8_speed_ab_fp8mid_set(capsys, monkeypatch):
    """--set fp8mid: head_dim 64/128 only; every timed two-level variant but the default and
    the overlap controls (ov*: configs timed before, no new code) is run by tests/test_fa3_fp8_speed_gpu.py with the same
    change (its fp8mid table, or session 6's fp8small one); all compiled in both causal modes, valid configs; the
    summary reports the two-level targets."""
    import test_fa3_fp8_speed_gpu as gpu_tests

    ab = _check_fp8_small_set_plan(capsys, monkeypatch, "fp8mid", "FP8MID_VARIANTS",
                                   {**gpu_tests.FP8SMALL_VARIANTS, **gpu_tests.FP8MID_VARIANTS}, ("single", "ov"))
    speed = [dict(head_dim=128, seqlen=4096, causal=False, impl=n, tflops=t)
             for n, t in dict(new=800.0, m192_look128h_c4=950.0, single_m192_c4=960.0, bf16_fa3=650.0).items()]
    assert "m192_look128h_c4 950 TFLOP/s = 1.46x bf16 fa3 (target >= 1.4): met, two-level cost +1.1%" in \
        ab.two_level_target_lines(speed, "fp8mid")
    # a variant with NaN in its output (a broken kernel) is the worst one, FAIL, and listed on its own line
    speed = [dict(r, spread=0.01) for r in speed]
    errors = [dict(head_dim=128, variant=n, causal=c, kernel_vs_emulation=float("nan") if n == "m192_look128h_c4" and c else 3e-3,
                   lse_max_diff=1e-4, kernel_vs_float64=1.0, emulation_vs_float64=1.0)
              for n in ("new", "m192_look128h_c4") for c in (False, True)]
    text = ab.speed_summary(speed, errors, "fp8mid")
    assert "worst nan (d128 m192_look128h_c4 causal=1): FAIL" in text and "- d128 m192_look128h_c4: 3.00e-03 / nan" in text


def test_fa3_fp8_speed_ab_fp8d128_set(capsys, monkeypatch):
    """--set fp8d128: head_dim 64/128 only; every timed variant but the default and the fp8mid
    control is run by tests/test_fa3_fp8_speed_gpu.py with the same change (FP8D128_VARIANTS); all compiled in both
    causal modes, valid configs; the per-variant accuracy lines and the two-level targets are in the summary."""
    import test_fa3_fp8_speed_gpu as gpu_tests

    ab = _check_fp8_small_set_plan(capsys, monkeypatch, "fp8d128", "FP8D128_VARIANTS",
                                   {**gpu_tests.FP8MID_VARIANTS, **gpu_tests.FP8D128_VARIANTS})
    speed = [dict(head_dim=128, seqlen=4096, causal=True, impl=n, tflops=t, spread=0.01)
             for n, t in dict(new=727.0, m192_look128h_c4=694.0, m192_look128h_c4_tail=735.0, bf16_fa3=602.0).items()]
    assert "m192_look128h_c4_tail 735 TFLOP/s = 1.22x bf16 fa3 (target >= 1.4): NOT met" in \
        ab.two_level_target_lines(speed, "fp8d128")
    errors = [dict(head_dim=128, variant=n, causal=c, kernel_vs_emulation=3e-3, lse_max_diff=1e-4, kernel_vs_float64=1.0,
                   emulation_vs_float64=1.0) for n in ("new", "m192_look128h_c4_tail") for c in (False, True)]
    assert "- d128 m192_look128h_c4_tail: 3.00e-03 / 3.00e-03" in ab.speed_summary(speed, errors, "fp8d128")
    # --drop (the script's guard after CUDA errors in its tests): those variants leave the timed set, "new" cannot
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", "fp8d128", "--drop", "tn128_tail",
                                     "m192_look128h_c4_tail"])
    monkeypatch.setitem(ab.SETS, "fp8d128", ab.SETS["fp8d128"])
    assert ab.main() == 0
    impls = capsys.readouterr().out
    assert "'m192_look128h_c4_tail'" not in impls and "'tn128_tail'" not in impls and "'m192_look128h_c4_tail_skip'" in impls
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", "fp8d128", "--drop", "new"])
    with pytest.raises(SystemExit):
        ab.main()


# session 8's fp8d128 logs (bench/h200-2026-12-01-s8): pytest --tb=line -rfE puts the error on a line of its own, so a
# FAILED line names the test only; the precompile's failures name the config
_S8_TEST_LOG = """\
/x/fa_variants/hopper/fa3_fp8.py:700: torch.AcceleratorError: CUDA error: an illegal instruction was encountered
FAILED tests/test_fa3_fp8_speed_gpu.py::test_fp8_variant_vs_emulation[fp8d128-d128-m192_look128h_c4_tail-1x1023x113x3x3-causal]
FAILED tests/test_fa3_fp8_speed_gpu.py::test_fp8_variant_vs_emulation[fp8d128-d64-tn128_tail-1x113x113x4x2-full]
FAILED tests/test_fa3_fp8_speed_gpu.py::test_fp8_tail_first_shared_rows[fp8d128-d128-m192_look128h_c4_tail_skip-1x300x500x2x2]
ERROR tests/test_fa3_fp8_speed_gpu.py::test_fp8_variant_vs_emulation[fp8mid-d128-m192_look128h_c4-1x113x113x4x2-full]
11 failed, 19 passed, 30 warnings in 23.45s
"""


_S8_PRECOMPILE_LOG = """\
precompile: 24 jobs in 19s with 14 workers; 3 failed
  FAILED fp8 d128 causal=True {'pv_buffers': 2, 'pv_split': 2, 'q_tail_first': True, 'reduce_chains': 4, 's_halves': True, \
's_lookahead': True, 'skip_unit_rescale': True, 'tile_m': 192, 'tile_n': 128}: AcceleratorError: CUDA error: an illegal \
instruction was encountered
"""


def test_fa3_fp8_speed_ab_drops_every_variant_that_failed_before(capsys, monkeypatch, tmp_path):
    """--drop-failed: a variant with any FAILED/ERROR line in the test log (by its test id, the
    error being on another line), or whose precompile job failed (by its config), leaves the A/B, which dies on the first
    CUDA error otherwise (session 8: the grep for "CUDA|illegal" on the FAILED line dropped nothing); another set's
    tests, "new" and names outside the set are not dropped; a missing log is skipped."""
    ab = load_script("fa3_fp8_speed_ab")
    assert ab.failed_variants(_S8_TEST_LOG, "fp8d128") == ["m192_look128h_c4_tail", "m192_look128h_c4_tail_skip",
                                                           "tn128_tail"]
    assert ab.failed_variants(_S8_PRECOMPILE_LOG, "fp8d128") == ["m192_look128h_c4_tail_skip"]
    assert ab.failed_variants(_S8_TEST_LOG, "fp8mid") == ["m192_look128h_c4"]
    assert ab.failed_variants("FAILED t.py::t[fp8d128-d128-new-1x113x113x4x2-full]\n"
                              "FAILED t.py::t[fp8d128-d128-gone-1x113x113x4x2-full]\n1 passed", "fp8d128") == []
    assert ab.failed_variants("11 failed, 19 passed\n", "fp8d128") == []
    (tmp_path / "tests.log").write_text(_S8_TEST_LOG, encoding="utf-8")
    (tmp_path / "precompile.log").write_text(_S8_PRECOMPILE_LOG, encoding="utf-8")
    monkeypatch.setitem(ab.SETS, "fp8d128", ab.SETS["fp8d128"])
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", "fp8d128", "--head-dims", "128",
                                     "--drop-failed", str(tmp_path / "precompile.log"), str(tmp_path / "tests.log"),
                                     str(tmp_path / "missing.log")])
    assert ab.main() == 0
    out = capsys.readouterr().out
    assert "left out (a FAILED/ERROR line in" in out
    assert "m192_look128h_c4_tail m192_look128h_c4_tail_skip tn128_tail" in out
    impls = out.split("impls per head_dim:")[1].splitlines()[0]
    assert "'new'" in impls and "'m192_look128h_c4'" in impls and "tail" not in impls


def test_fp8two_set():
    """--set fp8two (session 8, fused_promote at head_dim 256): new, fused, old and single_overlap at head_dim 256;
    its precompile covers every kernel of tests/test_fa3_fp8_speed_gpu.py's fp8two tests (the fused variants in both
    causal modes), 12 jobs; a failed fused test leaves fused out."""
    import test_fa3_fp8_speed_gpu as gpu_tests

    ab = load_script("fa3_fp8_speed_ab")
    assert list(ab.FP8TWO_VARIANTS[256]) == ["new", "fused", "old", "single_overlap"]
    jobs = ab.compile_jobs([256], [False, True], variant_set="fp8two")
    assert len(jobs) == 12
    for name, (D, change) in gpu_tests.FP8TWO_VARIANTS.items():
        assert ab.FP8TWO_VARIANTS[D][name.split("-", 2)[2]] == change, name
        ab.kernel_config(D, change).check(D)
        for causal in (False, True):
            assert ("fp8", D, causal, ab._freeze(change)) in jobs, (name, causal)
    log = "FAILED tests/test_fa3_fp8_speed_gpu.py::test_fp8two_v_scales_spread[fp8two-d256-fused-1x300x1000x4x2-causal]\n1 failed\n"
    assert ab.failed_variants(log, "fp8two") == ["fused"]


def test_fp8turn_set():
    """--set fp8turn (its ping-pong-turn variants removed in session 11): the head_dim 256 default against one running
    accumulator with one and two chains (the two-level cost's references), every variant a valid config; the cost
    lines name new against both references."""
    ab = load_script("fa3_fp8_speed_ab")
    assert list(ab.FP8TURN_VARIANTS[256]) == ["new", "single_overlap", "single_overlap_c2", "single_overlap_noskip"]
    assert ab.FP8TURN_VARIANTS[256]["single_overlap"] == ab.FP8TWO_VARIANTS[256]["single_overlap"]
    assert ab.kernel_config(256, ab.FP8TURN_VARIANTS[256]["single_overlap"]).skip_unit_rescale  # what _noskip turns off
    assert ab.FP8TURN_VARIANTS[256]["single_overlap_noskip"] == dict(ab.FP8TURN_VARIANTS[256]["single_overlap"],
                                                                     skip_unit_rescale=False)
    import test_fa3_fp8_speed_gpu as gpu_tests  # the GPU test of _noskip runs the timed config
    for name, (D, change) in gpu_tests.FP8TURN_VARIANTS.items():
        assert ab.kernel_config(D, ab.FP8TURN_VARIANTS[D][name.split("-", 2)[2]]) == ab.kernel_config(D, change), name
    for change in ab.FP8TURN_VARIANTS[256].values():
        ab.kernel_config(256, change).check(256)
    rows = [dict(head_dim=256, seqlen=16384, causal=False, impl=n, tflops=t, spread=0.05)
            for n, t in (("new", 1000.0), ("single_overlap", 1100.0), ("single_overlap_c2", 1150.0))]
    assert "- d256 N16384 causal=0: new +15.0% / +10.0%" in ab.turn_cost_lines(rows)


def test_fa3_fp8_speed_ab_every_set_has_a_legend(monkeypatch, capsys):
    """Every --set the argparser accepts is one entry of SETS with a legend, and its summary runs on rows of its
    variants (session 11's fp8turn run ended in KeyError 'fp8turn': the set had lost its legend in a side table); its
    --plan runs; an entry without a legend is refused."""
    ab = load_script("fa3_fp8_speed_ab")
    choices = next(a.choices for a in ab.parser()._actions if a.dest == "set")
    assert list(choices) == list(ab.SETS)
    for name in choices:
        vs = ab.SETS[name]
        assert vs.legend.strip() and vs.help.strip(), name
        rows = [dict(head_dim=D, seqlen=4096, causal=c, impl=impl, tflops=100.0 + i, spread=0.01)
                for D, variants in vs.variants.items() for c in (False, True)
                for i, impl in enumerate([*variants, "bf16_fa3"])]
        text = ab.speed_summary(rows, [], name) if vs.speed else ab.summary(rows, [])
        assert vs.legend in text, name
        monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", name])
        assert ab.main() == 0, name
        assert f"set: {name};" in capsys.readouterr().out
    with pytest.raises(ValueError, match="'fp8new'.*legend"):
        ab.check_sets({**ab.SETS, "fp8new": ab.VariantSet(ab.FP8TURN_VARIANTS, " ", "what it times")})


def test_fa3_fp8_speed_ab_summary_and_plan(capsys, monkeypatch):
    """scripts/fa3_fp8_speed_ab.py on the CPU: --plan; the summary's ratios, targets and pass criteria from
    fake rows (new 10% above old, a two-level cost of 4%, errors under the bound, tests' worst cases)."""
    ab = load_script("fa3_fp8_speed_ab")
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan"])
    assert ab.main() == 0
    assert "precompile:" in capsys.readouterr().out
    jobs = ab.compile_jobs([64, 128, 256], [False, True])
    assert len(jobs) == len(set(jobs)) and ("recipe", 256, True, ("float16", ("tensor", False, False, False))) in jobs
    speed = [dict(head_dim=128, seqlen=4096, causal=False, impl=n, tflops=t, spread=0.01)
             for n, t in (("new", 1000.0), ("old", 900.0), ("single", 1040.0), ("bf16_fa3", 700.0), ("flash_attn_4", 720.0))]
    err = [dict(head_dim=128, seqlen=2048, causal=False, block_n=256, kernel_vs_emulation=2e-3,
                kernel_vs_emulation_truncate=5e-3, lse_max_diff=1e-4, kernel_vs_float64=0.052,
                emulation_vs_float64=0.0519, emulation_block128_vs_float64=0.0518)]
    stats = [dict(case="a", rel_l2=3e-3, lse_diff=2e-4, max_diff=0.01, max_diff_bound=0.1)]
    text = ab.summary(speed, err, stats)
    assert "| 128 | 4096 | 0 | 1000 (1%) | 900 (1%) | 1040 (1%) | 700 (1%) | 720 (1%) | 1.43x | 1.29x | 1.11x | 1.39x | +4.0% |" in text
    assert "d128 N4096: over_bf16 1.43x (target >= 1.4): met" in text
    assert "two_level_cost +4.0% (target <= 0.05): met" in text
    assert "new defaults >= 0.97x old in every problem: PASS" in text
    assert "worst 2.00e-03: PASS" in text and "closer than the truncate model in every case: PASS" in text
    assert "worst rel-L2 3.00e-03 (a;" in text
    slow = [dict(r, tflops=800.0) if r["impl"] == "new" else r for r in speed]
    assert "every problem: FAIL" in ab.summary(slow, [], [])


def test_fa3_fp8_speed_ab_fp8speed_set(capsys, monkeypatch):
    """--set fp8speed: the plan; its precompile covers every kernel tests/test_fa3_fp8_speed_gpu.py runs; the
    summary's best variant, two-level cost (best single / best two-level), targets, flip candidates and pass lines
    from fake rows."""
    import test_fa3_fp8_speed_gpu as gpu_tests

    ab = load_script("fa3_fp8_speed_ab")
    monkeypatch.setattr("sys.argv", ["fa3_fp8_speed_ab.py", "--plan", "--set", "fp8speed"])
    assert ab.main() == 0
    assert "set: fp8speed" in capsys.readouterr().out
    jobs = set(ab.compile_jobs([64, 128, 256], [False], variant_set="fp8speed"))
    flip_jobs = set(ab.compile_jobs([64, 128, 256], [False], variant_set="fp8flip"))
    for name, (D, change) in gpu_tests.FP8_VARIANTS.items():
        suffix = name.split("-", 1)[1]  # same names, same configs, in --set fp8speed or (else) --set fp8flip
        table, its_jobs = (ab.SPEED_VARIANTS, jobs) if suffix in ab.SPEED_VARIANTS[D] else (ab.FLIP_VARIANTS, flip_jobs)
        assert table[D][suffix] == change, name
        for causal in (False, True):
            assert ("fp8", D, causal, ab._freeze(change)) in its_jobs, (name, causal)
    assert ("bf16", 128, True, ab._freeze(dict(intra_wg_overlap=False, early_pv_arrive=True))) in jobs
    for D, variants in ab.SPEED_VARIANTS.items():  # every variant is a valid config (raises otherwise)
        for change in variants.values():
            ab.kernel_config(D, change).check(D)
    tf = dict(new=932.0, single=1108.0, single_early=1120.0, early=1000.0, skip=950.0, early_skip=1090.0,
              bf16_fa3=748.0, flash_attn_4=731.0)
    speed = [dict(head_dim=256, seqlen=16384, causal=c, impl=n, tflops=t, spread=0.05) for c in (False, True) for n, t in tf.items()]
    err = [dict(head_dim=256, seqlen=2048, causal=False, variant=n, kernel_vs_emulation=2e-3, lse_max_diff=1e-4,
                kernel_vs_float64=0.052, emulation_vs_float64=0.0519) for n in ab.SPEED_VARIANTS[256]]
    text = ab.speed_summary(speed, err)
    assert "| 16384 | 0 | 932 (5%) | 1108 (5%) | 1120 (5%) | 1000 (5%) | 950 (5%) | 1090 (5%) | 748 (5%) | 731 (5%) | " \
           "single_early | 1.20x | 1.50x | +2.8% |" in text
    assert "d256 N16384: 1120 TFLOP/s (single_early; default 932) (target >= 1100): met" in text
    assert "d256 N16384: two-level cost +2.8% (best single / best two-level) (target <= 5%): met" in text
    assert "- d256 early: 1.07x, 1.07x" in text and "- d256 early_skip: 1.17x, 1.17x" in text and "d256 skip:" not in text
    assert "worst 2.00e-03 (d256 new causal=0): PASS" in text and "1.002x (d256 new): PASS" in text


def test_bounded_script_precompiles_what_its_steps_run():
    """scripts/bounded_gpu.sh: its precompile (overflow_check.py --head-dim 256) holds every kernel its test selection
    and its speed step run (the D 256 default, bounded_units since session 11, and it with bounded_units=False, causal
    and not; bf16 fa3 at 256) and no other head_dim's; its -k selects the 10 D 256 default cases and the fault test,
    not the other head_dims' ("default" contains "fault": the plain word would select all 41)."""
    text = (ROOT / "scripts" / "bounded_gpu.sh").read_text(encoding="utf-8")
    assert "overflow_check.py precompile --jobs 6 --head-dim 256" in text and "speed --rounds 8" in text
    jobs = load_script("overflow_check").jobs(256)
    want = {("fp8", 256, c, ch) for c in (False, True) for ch in ((), (("bounded_units", False),))}
    want |= {("bf16", 256, c, ()) for c in (False, True)}
    assert {(k, d, c, tuple(sorted(ch.items()))) for k, d, c, ch in jobs} == want, jobs
    expr = re.search(r'-k "([^"]+)"', text).group(1)
    ids = collected_ids("tests/test_fp8_overflow_gpu.py", "-k", expr)
    assert len(ids) == 11 and all("[d256-default-" in i or i.endswith("test_fused_units_fault") for i in ids), ids


def test_fp8status_script_precompiles_what_its_status_runs():
    """scripts/fp8status_gpu.sh: its precompile (fp8status_precompile.py) holds, per head_dim 64 / 128 / 256 and causal
    mode, the default kernel with the quantisation pass (a default-recipe call), the single-accumulator kernel of the
    table (fp8status.SINGLE_ACCUMULATOR), bf16 fa3 and flash-attn-4; the status step asks for those head dims; its -k
    selects the 12 default-recipe GPU tests it counts."""
    from fa_variants.bench import fp8status

    text = (ROOT / "scripts" / "fp8status_gpu.sh").read_text(encoding="utf-8")
    assert "--fp8-status only --head-dims 64,128,256" in text and "--fp8-rounds 6" in text
    jobs = load_script("fp8status_precompile").jobs()
    want = {(kind, d, c) for kind in ("fa4", "recipe", "fp8", "bf16") for d in (64, 128, 256) for c in (False, True)}
    assert {(k, d, c) for k, d, c, _ in jobs} == want and len(jobs) == 24
    assert all(ch == fp8status.SINGLE_ACCUMULATOR[d] for k, d, _, ch in jobs if k == "fp8")
    assert all(ch == ("bfloat16", ("block", True, True, True)) for k, _, _, ch in jobs if k == "recipe")
    assert jobs[0][:2] == ("fa4", 256)
    expr = re.search(r'-k "([^"]+)"', text).group(1)
    ids = [i for i in collected_ids("tests/test_fa3_fp8_gpu.py", "-k", expr) if "::test_default_recipe[" in i]
    assert len(ids) == 12 and "^12 passed" in text, ids


def _assert_step_count(text: str, marker: str = "gpu", name: str = "") -> None:
    """A GPU script's pytest step: its "expect_passed COUNT" is the number of GPU tests (``-m marker``) its test files
    (after ``-rfE``) and its ``-k`` expression, if it has one, select."""
    k = re.search(r'-k "([^"]+)"', text)
    files = re.search(r"-rfE \\\n\s+(tests/\S+(?: tests/\S+)*)", text).group(1).split()
    count = int(re.search(r'\nexpect_passed (\d+)\n', text).group(1))
    assert len(collected_ids("-m", marker, *(("-k", k.group(1)) if k else ()), *files)) == count, (name, files)


def test_fp8persist_scripts_count_their_tests_and_name_the_set():
    """scripts/fp8persist_gpu.sh and fp8persistchk_gpu.sh (session 22): the A/B set they run exists with the default,
    the static persistent grid and the balanced one at every head_dim; compile_jobs adds no bf16 shape job without
    seqlens (the plan runs without a GPU); each script's "N passed" is the count of the GPU tests it selects."""
    ab = load_script("fa3_fp8_speed_ab")
    variants = ab.SETS["fp8persist"].variants
    grids = {"new": {}, "persist": dict(persistent=True), "balanced": dict(persistent=True, balanced=True)}
    assert variants[64] == grids and sorted(variants) == [64, 128, 256]
    assert variants[128] == {**grids, "balanced_tn128": dict(grids["balanced"], tile_n=128),
                             "balanced_tn128ov": dict(grids["balanced"], tile_n=128, intra_wg_overlap=True)}
    assert variants[256] == {**grids, "serial": ab.NO_LOOKAHEAD, "persist_serial": dict(grids["persist"], **ab.NO_LOOKAHEAD),
                             "balanced_serial": dict(grids["balanced"], **ab.NO_LOOKAHEAD)}
    assert ab.bf16_shape_changes(128, True, ()) == []
    jobs = ab.compile_jobs([128], [False, True], tests=True, variant_set="fp8persist")
    assert {("fp8", 128, c, ab._freeze(ch)) for c in (False, True) for ch in variants[128].values()} <= set(jobs)
    for name in ("fp8persist", "fp8persistchk"):
        text = (ROOT / "scripts" / f"{name}_gpu.sh").read_text(encoding="utf-8")
        assert "--set fp8persist" in text
        _assert_step_count(text, name=name)


def test_fp8guard_script_counts_its_tests_and_names_the_set():
    """scripts/fp8guard_gpu.sh (session 28): the A/B set it runs exists with the default and huge_guard at 64 and 128;
    its "N passed" is the count of the GPU tests its -k expression selects."""
    ab = load_script("fa3_fp8_speed_ab")
    variants = ab.SETS["fp8guard"].variants
    assert {64, 128} <= set(variants)
    assert all(variants[d]["guard"] == dict(huge_guard=True, huge_hoisted=False) for d in (64, 128))
    assert all(variants[d]["checked"] == dict(huge_guard=False, huge_hoisted=False) for d in (64, 128))
    text = (ROOT / "scripts" / "fp8guard_gpu.sh").read_text(encoding="utf-8")
    assert "--set fp8guard" in text
    _assert_step_count(text)


def test_fp8hoist_script_counts_its_tests_and_names_the_set():
    """scripts/fp8hoist_gpu.sh (session 29): the A/B set it runs has the default and huge_hoisted at 64, 128 and 256,
    the same changes the GPU tests compile (so the precompile covers them); its "N passed" is the count of the GPU tests
    its -k expression selects."""
    ab = load_script("fa3_fp8_speed_ab")
    variants = ab.SETS["fp8hoist"].variants
    assert sorted(variants) == [64, 128, 256]
    hoist = {"new": {}, "hoist": dict(huge_hoisted=True, huge_guard=False)}
    assert variants[64] == variants[256] == hoist and variants[128] == {**hoist, "unhoisted": dict(huge_hoisted=False)}
    text = (ROOT / "scripts" / "fp8hoist_gpu.sh").read_text(encoding="utf-8")
    assert "--set fp8hoist" in text and text.count("--head-dims 64 128 256") == 2
    _assert_step_count(text)


def test_fp8hoistchk_script_counts_its_tests():
    """scripts/fp8hoistchk_gpu.sh (session 29): its "N passed" is the count of the GPU tests its files and -k select,
    and it precompiles the fp8hoist set at every head_dim."""
    text = (ROOT / "scripts" / "fp8hoistchk_gpu.sh").read_text(encoding="utf-8")
    assert "--set fp8hoist --head-dims 64 128 256" in text and "--set quantdef" in text
    _assert_step_count(text, marker="gpu and not slow")
