"""The bf16 / fp16 prefill A/B scripts' CPU-side logic: scripts/fa3_speed_ab.py (peers, variant sets and their compile
plans, --shapes, summaries), bench.runtime's peers, scripts/fa2d256_ab.py with a fake timer, scripts/leftpad_ab.py's
plan."""
import dataclasses
import json

import pytest
import torch
from helpers import load_script


def test_fa3_speed_ab_peers_and_summary():
    """scripts/fa3_speed_ab.py: `--peers flash-attn-4,cudnn` means SDPA's cuDNN backend (the alias), and the SUMMARY's
    new/cuDNN column reads it (2026-12-01: the name `cudnn` ran flash-attn-4 under that label and the column was nan);
    an unknown peer is an error, not flash-attn-4 renamed."""
    ab = load_script("fa3_speed_ab")
    assert ab.peer_names("flash-attn-4,cudnn") == ["flash-attn-4", "sdpa-cudnn"]
    assert ab.peer_names("fa4, sdpa-cudnn,cudnn") == ["flash-attn-4", "sdpa-cudnn"]
    with pytest.raises(ValueError, match="cuddn"):
        ab.peer_names("flash-attn-4,cuddn")
    row = dict(head_dim=128, seqlen=4096, causal=False, ratio_to_old={"new": 1.03},
               ratio_new_to={"old": 1.03, "flash-attn-4": 0.95, "sdpa-cudnn": 1.12, "n176": 0.98},
               ratio_to_new={"old": 0.97, "n176": 1.02, "flash-attn-4": 1.05, "sdpa-cudnn": 0.89},
               ratio_to_fa4={"new": 0.95, "n176": 0.97})
    head, line = ab.summary_lines([row])
    assert head.startswith("SUMMARY (median") and "nan" not in line
    assert line == "SUMMARY D=128 N=4096 full: 1.030 0.950 1.120 | n176 1.020 0.970"
    no_cudnn = dict(row, ratio_new_to={"flash-attn-4": 0.95})
    assert ab.summary_lines([no_cudnn])[1].startswith("SUMMARY D=128 N=4096 full: 1.030 0.950 nan |")


def test_bench_build_impls_rejects_unknown_peers():
    """bench.runtime.build_impls runs a peer only under its own name: an unknown name gets a note (it used to time
    flash-attn-4 under that name)."""
    from fa_variants.bench.runtime import build_impls

    impls, notes = build_impls([], ["cudnn", "sdpa-cudnn"])
    assert [i.name for i in impls] == ["sdpa-cudnn"]
    assert len(notes) == 1 and notes[0].startswith("cudnn not run: unknown peer")


def test_fa3_speed_ab_fa3gap_plan(capsys, monkeypatch):
    """scripts/fa3_speed_ab.py on the CPU: the fa3gap plan (pairs-256 left out since session 9) compiles 14 kernels,
    each once; --precompile and --plan need no 'old'; unknown variants are refused."""
    ab = load_script("fa3_speed_ab")
    shapes = ab.plan((64, 128, 256), (4096, 16384), (False, True), list(ab.FA3GAP))
    items = ab.compile_items(shapes, "bf16")
    # old and new at D 64 / 128 / 256 (12) + fa4-256 (2), causal and not; 22 until session 15 removed basis (D 64,
    # 128), basis-kv1 (D 128) and basis-256 (D 256) with alpha from the kept bases (8 kernels)
    assert len(items) == 14 == len(set(items))
    for name, d, _causal, _dtype in items:
        ab.variant_config(name, d).check(d)
    monkeypatch.setattr("sys.argv", ["fa3_speed_ab.py", "--plan", "--variants", "fa4-256"])
    assert ab.main() == 0
    assert "rescale_o_before_pv=True" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["fa3_speed_ab.py", "--out", "x", "--variants", "new,nope"])
    with pytest.raises(SystemExit):
        ab.main()
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", raising=False)  # flash-attn-4's cache must be on
    monkeypatch.setattr("sys.argv", ["fa3_speed_ab.py", "--precompile", "1", "--precompile-fa4", "--variants", "new"])
    assert ab.main() == 2


def test_fa3_speed_ab_persist_plan():
    """scripts/fa3_speed_ab.py's PERSIST plan: old, new and persistent at D 64/128/256, 18 kernels each compiled once;
    persistent is the default config with the switch on (and passes the config check)."""
    from fa_variants.hopper import fa3

    ab = load_script("fa3_speed_ab")
    shapes = ab.plan((64, 128, 256), (4096, 16384), (False, True), list(ab.PERSIST))
    items = ab.compile_items(shapes, "bf16")
    assert len(items) == 18 == len(set(items))
    for d in (64, 128, 256):
        cfg = ab.variant_config("persistent", d)
        assert cfg.persistent and cfg == dataclasses.replace(fa3.DEFAULT_CONFIGS[d], persistent=True)
        cfg.check(d)


def test_fa3_speed_ab_turn_set():
    """scripts/fa3_speed_ab.py's TURN set (session 12): old, new and turn (Sm90Config.hoisted_descriptors) at D 128
    only, the default config with the switch on (passing the check); at D 64 the switch is in the default (flipped
    after session 12's turnbf16 run; `noturn` is the default before), at D 128 too (session 15's turn128 run: `turn`
    equals `new` there now), at the other head dims it is off."""
    from fa_variants.hopper import fa3

    ab = load_script("fa3_speed_ab")
    assert ab.TURN == ("old", "new", "turn") and ab.VARIANTS["turn"][0] == (128,)
    cfg = ab.variant_config("turn", 128)
    assert cfg == dataclasses.replace(fa3.DEFAULT_CONFIGS[128], hoisted_descriptors=True)
    cfg.check(128)
    assert {d: c.hoisted_descriptors for d, c in fa3.DEFAULT_CONFIGS.items()} == {64: True, 96: False, 128: True,
                                                                                  256: False}
    shapes = ab.shapes_plan("128:4096:full,128:4096:causal", list(ab.TURN))
    assert [len(s["variants"]) for s in shapes] == [3] * 2 and len(ab.compile_items(shapes, "bf16")) == 6
    # noturn: D 64's default with the switch off (tests/test_fa3_gpu.py's same-values reference; precompiled by name)
    assert ab.VARIANTS["noturn"][0] == (64, 128) and "noturn" not in ab.TURN
    for d in (64, 128):  # the defaults before their flips (sessions 12 and 15)
        assert ab.variant_config("noturn", d) == dataclasses.replace(fa3.DEFAULT_CONFIGS[d], hoisted_descriptors=False)


def test_fa3_speed_ab_alpha_plan():
    """scripts/fa3_speed_ab.py's ALPHA plan by --shapes: D 128 N 4k, D 128 N 4k causal, D 128 N 16k, D 64 N 4k in
    that order; alpha at D 64/128 and alpha-noskip at D 64 only, 10 kernels each compiled once; alpha is the default
    with alpha_first on (alpha-noskip also without the unit-alpha skip), both pass the config check; a malformed
    --shapes item is a ValueError naming --shapes."""
    from fa_variants.hopper import fa3

    ab = load_script("fa3_speed_ab")
    spec = "128:4096:full,128:4096:causal,128:16384:full,64:4096:full"
    shapes = ab.shapes_plan(spec, ["old", "new", "alpha", "alpha-noskip"])
    assert [(s["head_dim"], s["seqlen"], s["causal"]) for s in shapes] == [
        (128, 4096, False), (128, 4096, True), (128, 16384, False), (64, 4096, False)]
    assert [len(s["variants"]) for s in shapes] == [3, 3, 3, 4]
    items = ab.compile_items(shapes, "bf16")
    assert len(items) == 10 == len(set(items))
    for d in (64, 128):
        cfg = ab.variant_config("alpha", d)
        assert cfg == dataclasses.replace(fa3.DEFAULT_CONFIGS[d], alpha_first=True)
        cfg.check(d)
    noskip = ab.variant_config("alpha-noskip", 64)
    assert noskip == dataclasses.replace(fa3.DEFAULT_CONFIGS[64], alpha_first=True, skip_unit_rescale=False)
    noskip.check(64)
    for bad in ("128:4096", "128:4096:both", "x:4096:full", ""):
        with pytest.raises(ValueError, match="--shapes"):
            ab.parse_shapes(bad)


def test_fa3_speed_ab_gap9_set():
    """scripts/fa3_speed_ab.py's GAP9 set after session 9 (early removed with Sm90Config.rescale_first; pairs-256 the
    D 256 default): old, new and two D 256 variants, 6 kernels non-causal (the seqlen does not change one), each
    compiled once (old and new now differ at D 256), every variant passing the config check."""
    ab = load_script("fa3_speed_ab")
    assert ab.GAP9 == ("old", "new", "fa4-256", "alpha-256")
    shapes = ab.plan((64, 256), (4096, 16384), (False,), list(ab.GAP9))
    assert [len(s["variants"]) for s in shapes] == [2, 2, 4, 4]
    items = ab.compile_items(shapes, "bf16")
    assert len(items) == 6 == len(set(items)), items
    for name, d, _causal, _dtype in items:
        ab.variant_config(name, d).check(d)
    alpha = ab.variant_config("alpha-256", 256)
    assert alpha.alpha_first and alpha.convert_pairs and alpha.exp2_ffma and not alpha.rescale_o_before_pv


def test_fa2d256_ab_plan_protocol_and_summary():
    """scripts/fa2d256_ab.py on the CPU with a fake burst timer: 20 precompile items (5 configs x causal x dtype),
    per-round ratios, the SUMMARY and WINS lines (a variant faster than default and SDPA flash on every shape says
    so; one slower does not)."""
    import types

    from fa_variants.ampere import fa2

    ab = load_script("fa2d256_ab")
    # since session 6 "default" is s1's tiles: s1 left out of the default list, the old default as s2
    assert ab.default_variants() == ["default", "s2", "n32", "m128w8s1", "m128w8"]
    assert fa2.D256_CONFIGS["default"] == fa2.D256_CONFIGS["s1"]
    assert len(set(ab.compile_items(ab.default_variants(), (False, True), ("bf16", "fp16")))) == 20
    variants = ab.default_variants()
    speed = {"default": 1.0, "s2": 0.9, "n32": 1.05, "m128w8s1": 1.0, "m128w8": 0.99, "sdpa-flash": 0.95, "AA": 1.0}

    class Timer:
        def prepare(self, name, fn, burst_ms):
            return "fake"

        def cycle(self, names):
            return [(speed[n], 1, 1500.0, 600.0) for n in names]

    def entries(shape, variants, arch, torch):
        fns = {x: (lambda: None) for x in [*variants, ab.PEER]}
        keys = dict({x: ab.config(x) for x in variants}, **{ab.PEER: None})
        return fns, keys, {x: 1e-3 for x in fns}, {x: 2e-3 for x in fns}, {}

    a = types.SimpleNamespace(rounds=6, cycles=2, burst_ms=10.0, warmup_ms=1.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ab, "shape_entries", entries)
        rows = [ab.time_shape(s, variants, "sm_90a", a, None, Timer())
                for s in ab.plan([512, 16384], (False, True), ["bf16"])]
    assert rows[0]["ratios"]["s2/default"]["rounds"] == pytest.approx([1 / 0.9] * 6)
    assert "sdpa-flash/default" not in rows[0]["ratios"]
    lines = ab.summary_lines(rows, variants)
    assert lines[1].startswith("SUMMARY bf16 N=512 full: default 0.950, s2 1.056 (1.111)")
    assert ("WINS s2: vs default faster on 4/4 shapes, slower on 0/4 (verdicts), median > 1 on 4/4; >= sdpa-flash on "
            "4/4 FLIP (every shape)") in lines
    assert ("WINS n32: vs default faster on 0/4 shapes, slower on 4/4 (verdicts), median > 1 on 0/4; >= sdpa-flash "
            "on 0/4") in lines
    # equal speed to default: verdict "same" everywhere, no FLIP
    assert ("WINS m128w8s1: vs default faster on 0/4 shapes, slower on 0/4 (verdicts), median > 1 on 0/4; "
            ">= sdpa-flash on 0/4") in lines


def test_leftpad_ab_plan(capsys):
    """scripts/leftpad_ab.py --plan prints its shapes without a GPU: decoding steps and prompt batches, 32:8 heads."""
    ab = load_script("leftpad_ab")
    assert ab.main(["--plan"]) == 0
    shapes = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(s["batch"], s["seqlen_q"], s["seqlen_k"]) for s in shapes] == ab.SHAPES
    assert {(s["heads"], s["heads_kv"], s["head_dim"]) for s in shapes} == {(32, 8, 128)}


def test_rightpad_ab_plan(capsys):
    """scripts/rightpad_ab.py --plan prints its shapes without a GPU: 16k padded tokens each, 32:8 heads."""
    ab = load_script("rightpad_ab")
    assert ab.main(["--plan"]) == 0
    shapes = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(s["batch"], s["seqlen"]) for s in shapes] == ab.SHAPES and all(b * n == 16384 for b, n in ab.SHAPES)
    assert {(s["heads"], s["heads_kv"], s["head_dim"]) for s in shapes} == {(32, 8, 128)}


def test_padded_ab_loop_with_a_fake_timer(tmp_path, capsys, monkeypatch):
    """scripts/leftpad_ab.py's paired_main (rightpad_ab.py's too) on a fake timer and fake entries: one line per shape
    with its checks and ratios, the JSON rows with each entry's ms, the ratios and what the entries keep, exit 1
    when a check failed."""
    from fa_variants.bench import runtime

    ab = load_script("rightpad_ab")
    speed = {"one-call": 1.0, "slices": 3.0, "padded": 1.5, "sdpa-mask": 4.0, "AA": 4.0}

    class Timer:
        def __init__(self, escape_check=True):
            pass

        def prepare(self, name, fn, burst_ms):
            return "fake"

        def cycle(self, names):
            return [(speed[n], 1, 1500.0, 600.0) for n in names]

    monkeypatch.setattr(runtime, "GraphBurstTimer", Timer)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake")
    made = dict(fns={n: (lambda: None) for n in ("one-call", "slices", "padded", "sdpa-mask")}, checks={}, ok=True,
                lengths=[3])
    monkeypatch.setattr(ab, "entries", lambda shape: made)
    assert ab.main(["--out", str(tmp_path), "--rounds", "2", "--cycles", "2", "--warmup-ms", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("B 16 N 1024: checks ok; ") and len(lines) == len(ab.SHAPES)
    rows = json.loads((tmp_path / "rightpad.json").read_text(encoding="utf-8"))
    assert rows[0]["lengths"] == [3] and rows[0]["ms"]["slices"] == pytest.approx(3.0)
    assert rows[0]["ratios"]["one-call/slices"]["median"] == pytest.approx(3.0)
    made["ok"] = False
    assert ab.main(["--rounds", "2", "--cycles", "2", "--warmup-ms", "0"]) == 1
