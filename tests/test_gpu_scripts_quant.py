"""The fa3-fp8 quantisation scripts' CPU-side logic: scripts/fp8_quant_bandwidth.py (byte model, pipelines and their
switches, summaries, A/B and per-pass lines, back-to-back reading) and scripts/quant_precompile.py's sets."""
import re
import subprocess
import sys

from helpers import ROOT, collected_ids, load_script, subprocess_env


def test_fp8_quant_bandwidth_plan_and_summary(capsys, monkeypatch):
    """scripts/fp8_quant_bandwidth.py on the CPU: --plan prints the byte model and the shapes; the tail gives
    % of copy per shape, v1 -> v2, and a SUMMARY per pipeline (FAIL below 70% or on a mismatch); the
    precompile script's plan covers both pipelines, both dtypes and the three head_dims."""
    bw = load_script("fp8_quant_bandwidth")
    monkeypatch.setattr("sys.argv", ["fp8_quant_bandwidth.py", "--plan"])
    assert bw.main() == 0
    out = capsys.readouterr().out
    assert out.startswith("byte model: q, k, v read once in 16 bits") and "(1, 16384, 16384, 16, 16, 128)" in out
    rows = [dict(shape=s, pipeline=p, recipe=r, of_copy=f, match="ok", queued=True)
            for s in ("D=64", "D=128") for r in ("default", "no-smooth") for p, f in (("v1", 0.35), ("v2", 0.75))]
    assert bw.summarise(rows, 4.28, ["v1", "v2"]) == 0
    out = capsys.readouterr().out
    assert "  D=128       no-smooth  35.0% ->  75.0%" in out
    assert "SUMMARY fp8_quant_bandwidth v1: FAIL" in out and "SUMMARY fp8_quant_bandwidth v2: PASS" in out
    rows[-1]["match"] = "DIFF k"
    assert bw.summarise(rows, 4.28, ["v1", "v2"]) == 1
    assert "75.0% MISMATCH" in capsys.readouterr().out
    rows[-1]["match"], rows[0]["match"] = "ok", "DIFF q"  # a mismatch in the first pipeline fails the run too
    assert bw.summarise(rows, 4.28, ["v1", "v2"]) == 1
    assert "35.0% MISMATCH" in capsys.readouterr().out
    tasks = load_script("quant_precompile").tasks()
    assert {(p, dt, d) for p, dt, d, _ in tasks} == {(p, dt, d) for p in ("v1", "v2", "v3")
                                                     for dt in ("bf16", "fp16") for d in (64, 128, 256)
                                                     if (p, dt) != ("v2", "fp16")}
    assert len(tasks) == len(set(tasks)) and ("v3", "bf16", 128, "default+tilemajor") in tasks


def test_fp8_quant_bandwidth_ab_and_quant5_sets():
    """scripts/fp8_quant_bandwidth.py's --ab lines from fake rows (NEW / OLD gpu ms per row, worst and best, the
    match flag), the v3ss label's switches, and quant5's precompile set: v3 with and without the staged store."""
    bw = load_script("fp8_quant_bandwidth")
    rows = [dict(shape=s, pipeline=p, recipe="default", gpu_ms=ms, of_copy=0.5, match="ok", queued=True)
            for s, base, f in (("D=64", 0.130, 0.9), ("D=128", 0.120, 1.01)) for p, ms in (("v3s", base),
                                                                                        ("v3ss", base * f))]
    text = bw.ab_lines(rows, "v3s", "v3ss")
    assert "  D=64        default   0.900" in text and "AB v3ss/v3s: worst 1.010 (D=128 default), best 0.900" in text
    assert text.endswith("all matched: True")
    off = {"V3_STAGED_MEAN": True, "V3_STAGED_STORE": False, "V3_FUSED_SAMPLED_MEAN": False}
    assert bw.PIPES["v3ss"] == ("v3", {**off, "V3_STAGED_STORE": True})
    assert bw.PIPES["v3sfs"] == ("v3", {**off, "V3_FUSED_SAMPLED_MEAN": True})
    pre = load_script("quant_precompile")
    tasks = pre.tasks("quant5")
    assert len(tasks) == len(set(tasks)) == 24 and ("v3", "bf16", 64, "sampled8+stagedstore") in tasks


def test_quant8_sets_and_pass_shares():
    """The quant8 set's pieces on the CPU: the bandwidth labels def / defl / deff (the current default with the
    staged store's auto rule, + V3_FUSED_MEAN_LATE, + V3_FUSED_MEAN), the precompile set (default / fused / late x
    default, sampled8 x three head_dims, head-smooth at 128; every knob a known switch set), the sanitizer's set, and
    the per-pass % of copy read from a breakdown (each launch's bytes / its us; the torch sum's us alone)."""
    bw = load_script("fp8_quant_bandwidth")
    base = {"V3_STAGED_MEAN": True, "V3_STAGED_STORE": None, "V3_FUSED_SAMPLED_MEAN": False,
            "V3_FUSED_MEAN": False, "V3_FUSED_MEAN_LATE": False}
    assert bw.PIPES["def"] == ("v3", base)
    assert bw.PIPES["defl"] == ("v3", {**base, "V3_FUSED_MEAN_LATE": True})
    assert bw.PIPES["deff"] == ("v3", {**base, "V3_FUSED_MEAN": True})
    from fa_variants.fp8 import quant_host

    assert all(hasattr(quant_host, name) for name in base)
    pre = load_script("quant_precompile")
    tasks = pre.tasks("quant8")
    assert len(tasks) == len(set(tasks)) == 21 and ("v3", "bf16", 128, "head-smooth+late8") in tasks
    assert all(t[3].partition("+")[2] in pre.QUANT8_KNOBS for t in tasks)
    assert pre.QUANT8_KNOBS["late8"]["V3_FUSED_MEAN_LATE"] and not pre.QUANT8_KNOBS["fused8"]["V3_FUSED_MEAN_LATE"]
    row = {"kernels": "4 kernels, 125.6 us: pass 49.2, void at::native::reduce_ 6.2, pass 33.8, pass 36.4",
           "pass_bytes": [168e6, 100e6, 101e6], "extra_bytes_read": 67e6}
    text = bw.pass_shares(row, 4.0)
    assert text == "V+Ksum 49.2 us 85%, K 33.8 us 74%, Q 36.4 us 69%, void at::native::reduce_ 6.2 us", text
    assert bw.pass_shares({"kernels": "2 kernels: pass 1.0, pass 2.0", "pass_bytes": [1, 1, 1]}, 4.0) == ""
    rows = [dict(shape="D=128", pipeline=p, recipe="default", gpu_ms=ms, of_copy=0.5, match="ok", queued=True, **row)
            for p, ms in (("def", 0.126), ("defl", 0.120))]
    text = bw.ab_lines(rows, "def", "defl", copy_tbs=4.0)
    assert "  D=128       default   0.952" in text and "per pass (% of copy for its bytes): [V+Ksum" in text

    class T:  # a tensor's size only
        def __init__(self, n):
            self.n = n

        def numel(self):
            return self.n

        def element_size(self):
            return 1

    out = type("O", (), {n: T(1) for n in ("v_t", "v_descale", "k", "k_descale", "q", "q_descale", "lse_shift")})
    assert bw.pass_bytes(T(10), T(10), T(10), out, 7) == [19, 12, 13]  # K's second read counted in V's launch


def test_quantlanes_set():
    """quant_precompile.py --set quantlanes (session 12's V3_WIDE A/B; bench/NOTES.md, Session 12 outcomes): the
    bandwidth label defw (the module's default, V3_WIDE on), the precompile set (the default at D 64 / 128, default and
    wide at 256 for the default, no-smooth and head-smooth recipes) with real quant_host switches, and
    quant_sanitize.py's set of the same name."""
    from fa_variants.fp8 import quant_host

    bw = load_script("fp8_quant_bandwidth")
    assert bw.PIPES["defw"] == ("v3", {**bw.PIPES["def"][1], "V3_WIDE": True}) and hasattr(quant_host, "V3_WIDE")
    pre = load_script("quant_precompile")
    tasks = pre.tasks("quantlanes")
    assert len(tasks) == len(set(tasks)) == 8 and ("v3", "bf16", 256, "head-smooth+wide") in tasks
    assert all(t[3].partition("+")[2] in pre.QUANTLANES_KNOBS for t in tasks)
    assert pre.QUANTLANES_KNOBS["wide"] == {**pre.QUANTLANES_KNOBS["defaultql"], "V3_WIDE": True}
    assert all(hasattr(quant_host, n) for n in pre.QUANTLANES_KNOBS["wide"])
    assert '"quantlanes": [("wide"' in (ROOT / "scripts" / "quant_sanitize.py").read_text(encoding="utf-8")


def test_quantdef_set_and_check_selection():
    """The GPU check of session 12's quant defaults (V3_WIDE, QUANT_PLANS on): quant_precompile.py --set quantdef holds
    the default recipe at head_dim 64 / 128 / 256 with the module's defaults (no knob) and the narrow pass at 256
    (V3_WIDE off, a real switch); the check's -k selects the 12 default-recipe v3 bf16 cases against the torch recipe
    (GQA, odd lengths) and the 2 default-recipe wide / narrow cases; fp8_quant_bandwidth.py's def11 is def with both
    off (session 11's default)."""
    from fa_variants.fp8 import quant_host

    pre = load_script("quant_precompile")
    tasks = pre.tasks("quantdef")
    assert tasks == [("v3", "bf16", d, "default") for d in (64, 128, 256)] + [("v3", "bf16", 256, "default+narrow")]
    assert pre.QUANTDEF_KNOBS == {"narrow": {"V3_WIDE": False}} and quant_host.V3_WIDE and quant_host.QUANT_PLANS
    # --unique's recording (quant_host.planned_passes per task, on the CPU here): Q's / K's passes at 256 wide with the
    # defaults and narrow with the knob, K's at 128 wide, no key twice, the knob undone afterwards
    keys = pre.record(tasks, arch="sm_90a")
    assert len(keys) == len(set(keys)) and {k.arch for k in keys} == {"sm_90a"} and quant_host.V3_WIDE
    qk256 = [k.config.wide for k in keys if k.head_dim == 256 and k.config.role == "qk"]
    assert True in qk256 and False in qk256 and not any(k.config.wide for k in keys if k.head_dim == 64)
    # head_dim 128 (V3_WIDE128 = "k" since session 16): K's pass (256-row blocks) wide, Q's (128 rows) narrow
    assert {(k.config.rows, k.config.wide) for k in keys if k.head_dim == 128 and k.config.role == "qk"} == {
        (256, True), (128, False)}
    # the docstring's lines joined whatever their indent (Python 3.13 strips it from __doc__ at compile time)
    expr = re.search(r'-k "([^"]+)"', " ".join(pre.tasks.__doc__.split())).group(1)
    ids = collected_ids("tests/test_fp8_quant_kernel.py", "-k", expr)
    assert len(ids) == 14 and sum("v3-bfloat16-default-" in i for i in ids) == 12, ids
    assert sum("test_v3_wide_bitwise[default-g" in i for i in ids) == 2, ids
    bw = load_script("fp8_quant_bandwidth")
    assert bw.PIPES["def11"] == ("v3", {**bw.PIPES["def"][1], "V3_WIDE": False, "QUANT_PLANS": False})


def test_quantbw_set_and_measures():
    """fp8_quant_bandwidth.py's measures of session 12's quantbw run (bench/NOTES.md, Session 12 outcomes) on the
    CPU: the back-to-back reading (per-position median durations, start-to-start period, the gap before each kernel,
    each position's range over the calls; no pattern when the kernels do not divide into calls), the per-pass shares read from it, the A/B line with the graph ratio and host ms, the graph / end-to-end
    tables, the defn / defwn labels (V2_PDL off), defp (QUANT_PLANS), --skip PIPE:RECIPE:SHAPE and --shapes in --plan,
    and quant_precompile.py --set quantbw (quantlanes' passes + both at D 256 without PDL)."""
    bw = load_script("fp8_quant_bandwidth")
    events, t = [], 0.0
    for call in range(6):  # V+Ksum, torch's sum, K, Q; K and Q start 1 us before their predecessor's end (PDL)
        for name, dur, gap in (("kernel_QuantPass_0", 48.0, 2.0), ("void at::native::reduce_kernel<512>", 6.0, 1.0),
                               ("kernel_QuantPass_1", 36.0 + call, -1.0), ("kernel_QuantPass_2", 39.0, -1.0)):
            t += gap
            events.append((name, t, t + dur))
            t += dur
    kernels, gaps = bw.b2b_pattern(events, 6)
    assert kernels == "4 kernels, 131.5 us: pass 48.0, void at::native::reduce_ 6.0, pass 38.5, pass 39.0", kernels
    assert gaps == ("period 132.5 us, gaps +1.0 us (before each: +2.0, +1.0, -1.0, -1.0; range 48.0-48.0, 6.0-6.0, "
                    "37.0-40.0, 39.0-39.0)"), gaps
    assert bw.b2b_pattern(events[:-1], 6)[0] == "" and "23 kernels for 6 calls" in bw.b2b_pattern(events[:-1], 6)[1]
    row = {"kernels_b2b": kernels, "pass_bytes": [168e6, 100e6, 101e6], "extra_bytes_read": 67e6, "kernels": ""}
    assert bw.pass_shares(row, 4.0, "kernels_b2b").startswith("V+Ksum 48.0 us 88%, K 38.5 us 65%, Q 39.0 us 65%")
    assert bw.pass_shares(row, 4.0) == ""
    rows = [dict(shape="D=256", pipeline=p, recipe="default", gpu_ms=ms, of_copy=0.5, match="ok", queued=True,
                 host_ms=h, graph_ms=g, graph_of_copy=0.6, eager_of_copy=0.3)
            for p, ms, h, g in (("def", 0.150, 0.210, 0.150), ("defw", 0.147, 0.220, 0.135))]
    text = bw.ab_lines(rows, "def", "defw")
    assert "  D=256       default   0.980   50.0% ->  50.0%  graph 0.900  host ms 0.210 -> 0.220" in text, text
    assert bw.PIPES["defn"] == ("v3", {**bw.PIPES["def"][1], "V2_PDL": False})
    assert bw.PIPES["defwn"] == ("v3", {**bw.PIPES["defw"][1], "V2_PDL": False})
    assert bw.PIPES["defp"] == ("v3", {**bw.PIPES["def"][1], "QUANT_PLANS": True})
    from fa_variants.fp8 import quant_host

    assert all(hasattr(quant_host, n) for p in ("defwn", "defp") for n in bw.PIPES[p][1])
    pre = load_script("quant_precompile")
    tasks = pre.tasks("quantbw")
    assert tasks[:8] == pre.tasks("quantlanes") and len(tasks) == len(set(tasks)) == 10
    assert pre.QUANTBW_KNOBS["widenopdl"] == {**pre.QUANTLANES_KNOBS["wide"], "V2_PDL": False}
    proc = subprocess.run([sys.executable, "scripts/fp8_quant_bandwidth.py", "--plan", "--shapes", "D=256,D=128 GQA",
                           "--pipelines", "def,defwn", "--skip", "defwn:default:D=128 GQA"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and "D=256 (batch" in proc.stdout and "D=64 (batch" not in proc.stdout, proc.stderr
    bad = subprocess.run([sys.executable, "scripts/fp8_quant_bandwidth.py", "--plan", "--shapes", "D=96"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "--shapes" in bad.stderr


def test_quantbw2_set_and_pipes():
    """Session 13's quantbw2 run (its script retired after QUANT_CALL_PLANS' flip): fp8_quant_bandwidth.py's defc (whole-call plans) and defcl (+ the fused mean counted
    late) are def with those switches only, and quant_precompile.py --set quantbw2 records the 12 passes they and the
    plan-bitwise GPU tests launch (V, K, Q at D 64 / 128 / 256 + V's late-count pass), without a GPU."""
    bw = load_script("fp8_quant_bandwidth")
    assert bw.PIPES["defc"] == ("v3", {**bw.PIPES["def"][1], "QUANT_CALL_PLANS": True})
    assert bw.PIPES["defcl"] == ("v3", {**bw.PIPES["defc"][1], "V3_FUSED_MEAN_LATE": True})
    from fa_variants.fp8 import quant_host

    assert all(hasattr(quant_host, name) for name in bw.PIPES["defcl"][1])
    pre = load_script("quant_precompile")
    keys = pre.record(pre.tasks("quantbw2"), arch="sm_90a")
    assert len(keys) == 12 and sum(key.config.late_count for key in keys) == 3



def test_quantocc_set_and_pipes():
    """Session 14's quantocc run (``V3_WIDE128``; its script retired in session 15, the run in
    bench/h200-2026-12-02-s14): fp8_quant_bandwidth.py's defw128 is def with the switch only and defw128n the same
    without the staged store; quant_precompile.py --set quantocc records, without a GPU, the wide passes at head_dim
    128 (K smoothed and Q with the shift, with and without the staged store; the per-head baseline's "amax" / "given"
    launches) beside the default's, nothing at another head_dim."""
    bw = load_script("fp8_quant_bandwidth")
    assert bw.PIPES["defw128"] == ("v3", {**bw.PIPES["def"][1], "V3_WIDE128": True})
    assert bw.PIPES["defw128n"] == ("v3", {**bw.PIPES["defw128"][1], "V3_STAGED_STORE": False})
    assert "V3_WIDE128" not in bw.PIPES["def"][1]  # def: the module's default ("k" since session 16)
    from fa_variants.fp8 import quant_host

    assert all(hasattr(quant_host, name) for name in bw.PIPES["defw128n"][1])
    pre = load_script("quant_precompile")
    keys = pre.record(pre.tasks("quantocc"), arch="sm_90a")
    assert {key.head_dim for key in keys} == {128} and len(keys) == len(set(keys))
    wide = {(k.config.rows, k.config.shift, k.config.smooth, k.config.staged_store, k.config.mode)
            for k in keys if k.config.wide}
    assert {(256, False, True, True, "block"), (128, True, False, True, "block"), (256, False, True, False, "block"),
            (128, True, False, False, "block"), (256, False, True, False, "amax"),
            (256, False, True, True, "given")} <= wide, wide
    assert any(not k.config.wide and k.config.role == "qk" and k.config.smooth and k.config.mode == "block"
               for k in keys)


def test_quantk_set_and_pipes():
    """Sessions 14 and 16's quantk runs (``V3_WIDE128 = "k"``, the default since session 16; the script retired, the
    runs in bench/h200-2026-12-02-s14 and -s16): fp8_quant_bandwidth.py's defw128k is
    def with the switch at "k" only; quant_precompile.py --set quantk records, without a GPU, K's wide pass at head_dim
    128 (smoothed and not, with the staged store; the per-head baseline's "amax" / "given" launches) and Q's passes
    only as the default's (no wide Q pass, nothing at another head_dim): passes quantocc's set already holds."""
    bw = load_script("fp8_quant_bandwidth")
    assert bw.PIPES["defw128k"] == ("v3", {**bw.PIPES["def"][1], "V3_WIDE128": "k"})
    pre = load_script("quant_precompile")
    keys = pre.record(pre.tasks("quantk"), arch="sm_90a")
    assert {key.head_dim for key in keys} == {128} and len(keys) == len(set(keys)) == 17
    wide = {(k.config.rows, k.config.shift, k.config.smooth, k.config.staged_store, k.config.mode)
            for k in keys if k.config.wide}
    assert wide == {(256, False, True, True, "block"), (256, False, False, True, "block"),
                    (256, False, True, False, "amax"), (256, False, True, True, "given")}, wide
    q_passes = {(k.config.shift, k.config.staged_store, k.config.mode) for k in keys
                if k.config.role == "qk" and k.config.rows == 128}
    assert q_passes == {(True, False, "block"), (False, False, "block"), (True, False, "amax"),
                        (False, False, "given")}, q_passes
    assert set(keys) <= set(pre.record(pre.tasks("quantocc"), arch="sm_90a"))


def test_quantinf_set_and_pipes():
    """Session 14's quantinf run (``NONFINITE``; its script retired once the switch was flipped on): fp8_quant_bandwidth.py's
    definf is def with the switch on whatever the environment says; quant_precompile.py --set quantinf records,
    without a GPU, the default recipe's passes with the switch off and on at every head_dim and the GPU tests'
    no-smooth (on) / head-smooth ("amax" + "given", off and on) passes at 128; 33 GPU tests in
    tests/test_fp8_quant_nonfinite.py (11, then session 36's no-rotate recipe and the slow path after the loop:
    6 recipes x 4 places, 3 x 2 finite, 3 end to end)."""
    bw = load_script("fp8_quant_bandwidth")
    assert bw.PIPES["definf"] == ("v3", {**bw.PIPES["def"][1], "NONFINITE": True})
    assert "NONFINITE" not in bw.PIPES["def"][1]  # def: the module's default (on since session 14)
    pre = load_script("quant_precompile")
    keys = pre.record(pre.tasks("quantinf"), arch="sm_90a")
    assert len(keys) == len(set(keys)) == 33
    for d in (64, 128, 256):
        for on in (False, True):
            roles = {(k.config.role, k.config.shift) for k in keys if k.head_dim == d and k.config.nonfinite is on
                     and k.config.mode == "block" and (k.config.smooth or k.config.role == "v" or k.config.shift)}
            assert {("v", False), ("qk", False), ("qk", True)} <= roles, (d, on, roles)
    for on in (False, True):  # the per-head baseline's launches, off and on (test_finite_inputs_unchanged)
        assert {k.config.mode for k in keys if k.config.nonfinite is on and k.head_dim == 128} == {"block", "amax",
                                                                                                  "given"}
    assert any(k.config.nonfinite and k.config.role == "qk" and not k.config.smooth and not k.config.shift
               and k.config.mode == "block" for k in keys)  # no-smooth's K
    ids = collected_ids("-m", "gpu", "tests/test_fp8_quant_nonfinite.py")
    assert len(ids) == 33 and sum("deferred" in i for i in ids) == 21, ids


def test_quant_ncu_help_and_names(tmp_path):
    """scripts/quant_ncu.py (the ncu driver of the quantisation passes) on the CPU: --help answers; its default
    pipelines are labels of fp8_quant_bandwidth.py's PIPES; an unknown pipeline or recipe is refused in one line
    naming the option before any CUDA work (exit 2)."""
    env = subprocess_env()
    script = str(ROOT / "scripts" / "quant_ncu.py")
    ok = subprocess.run([sys.executable, script, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0 and "--pipelines" in ok.stdout and "Nsight Compute" in ok.stdout
    default = re.search(r'"--pipelines", default="([^"]+)"', (ROOT / "scripts" / "quant_ncu.py").read_text(encoding="utf-8"))
    assert default and all(p in load_script("fp8_quant_bandwidth").PIPES for p in default.group(1).split(","))
    for bad, word in ((["--pipelines", "v3,nope"], "'nope'"), (["--pipelines", "v3", "--recipes", "odd"], "'odd'")):
        run = subprocess.run([sys.executable, script, *bad], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 2 and "--pipelines / --recipes: unknown" in run.stderr and word in run.stderr, run


def test_quantsamp_set_and_pipes():
    """Session 21's quantsamp run (scripts/quantsamp_gpu.sh): fp8_quant_bandwidth.py's defs is def with the sampled
    mean finished in V's launch; quant_precompile.py --set quantsamp records, without a GPU, a V launch that sums
    only K's sample tiles (``k_sample``) at every head_dim, per sample block (fused) and counted late, beside the
    default recipe's exact-mean launch; the script names only pipelines and recipes the bandwidth script has."""
    bw = load_script("fp8_quant_bandwidth")
    assert bw.PIPES["defs"] == ("v3", {**bw.PIPES["def"][1], "V3_FUSED_SAMPLED_MEAN": True})
    pre = load_script("quant_precompile")
    keys = pre.record(pre.tasks("quantsamp"), arch="sm_90a")
    assert len(keys) == len(set(keys))
    for d in (64, 128, 256):
        v = [k.config for k in keys if k.head_dim == d and k.config.role == "v" and k.config.kmean]
        assert {(c.k_sample, c.fused_mean, c.late_count) for c in v} >= {(False, False, False), (True, False, False),
                                                                        (True, True, False), (True, True, True)}, v
    for script in ("quantsamp", "quantq128", "quantqncu"):
        text = (ROOT / "scripts" / f"{script}_gpu.sh").read_text(encoding="utf-8")
        pipes = re.search(r"--pipelines (\S+)", text).group(1).split(",")
        recipes = re.search(r"--recipes (\S+)", text).group(1).split(",")
        assert set(pipes) <= set(bw.PIPES) and set(recipes) <= set(bw.recipes()), script
    # quantq128: Q's pass wide at 128 (V3_WIDE128 = True) with the default and the sampled mean counted late
    assert bw.PIPES["defw128l"] == ("v3", {**bw.PIPES["def"][1], "V3_WIDE128": True, "V3_FUSED_MEAN_LATE": True})
    assert any(k.head_dim == 128 and k.config.wide and k.config.shift and k.config.nonfinite for k in keys)
    assert any(k.head_dim == 128 and k.config.kmean and k.config.k_sample and k.config.late_count for k in keys)


def test_quantchains_set_and_pipes():
    """scripts/quantchains_gpu.sh (session 21, ``SHIFT_CHAINS``): fp8_quant_bandwidth.py's defc2 / defc8 / defw128c8
    are def with the shift's chains (and Q's pass wide at 128); quant_precompile.py --set quantchains records Q's
    shift pass with 1, 2 and 8 chains at every head_dim and the wide 8-chain pass at 128, without a GPU; the script
    names only pipelines the bandwidth script has and counts the GPU tests tests/test_fp8_quant_shift.py holds."""
    bw = load_script("fp8_quant_bandwidth")
    assert bw.PIPES["defc2"] == ("v3", {**bw.PIPES["def"][1], "SHIFT_CHAINS": 2})
    assert bw.PIPES["defw128c8"] == ("v3", {**bw.PIPES["def"][1], "V3_WIDE128": True, "SHIFT_CHAINS": 8})
    pre = load_script("quant_precompile")
    keys = pre.record(pre.tasks("quantchains"), arch="sm_90a")
    shift = {(k.head_dim, k.config.wide, k.config.shift_chains) for k in keys if k.config.shift}
    assert {(d, c) for d, _, c in shift} == {(d, c) for d in (64, 128, 256) for c in (1, 2, 8)}, shift
    assert (128, True, 8) in shift and {(256, False, 2), (256, False, 8)} <= shift
    assert all(k.config.shift_chains == 1 for k in keys if not k.config.shift)
    text = (ROOT / "scripts" / "quantchains_gpu.sh").read_text(encoding="utf-8")
    pipes = re.search(r"--pipelines (\S+)", text).group(1).split(",")
    assert set(pipes) <= set(bw.PIPES)
    count = int(re.search(r'\nexpect_passed (\d+)\n', text).group(1))
    assert len(collected_ids("-m", "gpu", "tests/test_fp8_quant_shift.py")) == count


def test_quantgap_pipes():
    """scripts/quantgap_gpu.sh (session 37): "def" is the module's default (the deferred slow path since session 37),
    "definl" the slow path in the loop and "defoff" the switch off, whatever the environment says; "defn" / "defoffn"
    (session 39) def / defoff without PDL; the script names only pipelines and recipes the bandwidth script has, and
    times by graph replay and back to back."""
    bw = load_script("fp8_quant_bandwidth")
    assert not {"NONFINITE", "NONFINITE_DEFERRED"} & set(bw.PIPES["def"][1])
    assert bw.PIPES["definl"] == ("v3", {**bw.PIPES["def"][1], "NONFINITE": True, "NONFINITE_DEFERRED": False})
    assert bw.PIPES["defd"] == ("v3", {**bw.PIPES["def"][1], "NONFINITE": True, "NONFINITE_DEFERRED": True})
    assert bw.PIPES["defoff"] == ("v3", {**bw.PIPES["def"][1], "NONFINITE": False})
    assert bw.PIPES["defn"] == ("v3", {**bw.PIPES["def"][1], "V2_PDL": False})
    assert bw.PIPES["defoffn"] == ("v3", {**bw.PIPES["defoff"][1], "V2_PDL": False})
    text = (ROOT / "scripts" / "quantgap_gpu.sh").read_text(encoding="utf-8")
    pipes = re.search(r"--pipelines (\S+)", text).group(1).split(",")
    recipes = re.search(r"--recipes (\S+)", text).group(1).split(",")
    assert set(pipes) == {"def", "defoff", "defn", "defoffn"} and set(recipes) <= set(bw.recipes())
    for pair in re.search(r"--ab (\S+)", text).group(1).split(","):
        assert set(pair.split(":")) <= set(pipes), pair
    assert "--graph" in text and "--b2b" in text
