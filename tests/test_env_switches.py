"""The FA_VARIANTS_* environment switches on the CPU: read through ``common.env`` (a bad value is a one-line
ValueError naming the variable, at import for the import-time ones), and README.md's switch table lists each
variable the package reads, once, with the default the code has."""
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from fa_variants.common import env, switches
from helpers import subprocess_env

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "fa_variants").rglob("*.py"))
# variables whose value is free-form (a path) or checked where it is read (FUSED_MERGE: its own modes table)
FREE_FORM = {"FA_VARIANTS_CACHE_DIR", "FA_VARIANTS_FIXTURE", "FA_VARIANTS_FUSED_MERGE"}


def _read_in_package() -> set[str]:
    names = set()
    for path in SOURCES:
        names |= set(re.findall(r"\"(FA_VARIANTS_[A-Z0-9_]+)\"", path.read_text(encoding="utf-8")))
    return names - set(switches.OUTSIDE)  # named in common.switches, read by the tests


def _table() -> list[str]:
    """The README's switch table rows (from its header to the first line that is not a row)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("| variable | default | effect |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_flag_integer_choice(monkeypatch):
    monkeypatch.delenv("FA_VARIANTS_TEST", raising=False)
    assert env.flag("FA_VARIANTS_TEST", True) and not env.flag("FA_VARIANTS_TEST", False)
    for value, expected in (("0", False), ("off", False), ("False", False), (" no ", False), ("1", True),
                            ("ON", True), ("true", True), ("yes", True), ("", True)):
        monkeypatch.setenv("FA_VARIANTS_TEST", value)
        assert env.flag("FA_VARIANTS_TEST", True) is expected, value
    for bad in ("2", "enable", "y"):
        monkeypatch.setenv("FA_VARIANTS_TEST", bad)
        with pytest.raises(ValueError, match=f"^FA_VARIANTS_TEST='{bad}' must be 0 or 1"):
            env.flag("FA_VARIANTS_TEST", False)
    monkeypatch.setenv("FA_VARIANTS_TEST", "3")
    assert env.integer("FA_VARIANTS_TEST", "8", 0) == 3
    for bad in ("-1", "2k", "1.5"):
        monkeypatch.setenv("FA_VARIANTS_TEST", bad)
        with pytest.raises(ValueError, match="^FA_VARIANTS_TEST must be an int >= 0"):
            env.integer("FA_VARIANTS_TEST", "8", 0)
    monkeypatch.setenv("FA_VARIANTS_TEST", str(env.INT_SWITCH_MAX))
    assert env.integer("FA_VARIANTS_TEST", "8", 0) == 2**31 - 1
    monkeypatch.setenv("FA_VARIANTS_TEST", "2147483648")  # beyond int32: failed later, naming another thing
    with pytest.raises(ValueError, match=r"^FA_VARIANTS_TEST must be an int <= 2147483647, got '2147483648'$"):
        env.integer("FA_VARIANTS_TEST", "8", 0)
    monkeypatch.setenv("FA_VARIANTS_TEST", "b")
    assert env.choice("FA_VARIANTS_TEST", "a", ("a", "b")) == "b"
    monkeypatch.setenv("FA_VARIANTS_TEST", "c")
    with pytest.raises(ValueError, match="^FA_VARIANTS_TEST='c' must be one of a, b$"):
        env.choice("FA_VARIANTS_TEST", "a", ("a", "b"))
    for value, expected in (("0", False), ("1", True), ("auto", None), ("", None)):
        monkeypatch.setenv("FA_VARIANTS_TEST", value)
        assert env.auto_flag("FA_VARIANTS_TEST") is expected, value
    monkeypatch.setenv("FA_VARIANTS_TEST", "on")
    with pytest.raises(ValueError, match="^FA_VARIANTS_TEST='on' must be one of 0, 1, auto$"):
        env.auto_flag("FA_VARIANTS_TEST")
    for value, expected in (("", False), ("0", False), ("off", False), ("1", True), ("Yes", True), ("k", "k"),
                            (" K ", "k")):
        monkeypatch.setenv("FA_VARIANTS_TEST", value)
        assert env.flag_or("FA_VARIANTS_TEST", False, ("k",)) == expected, value
        assert type(env.flag_or("FA_VARIANTS_TEST", False, ("k",))) is type(expected), value
    for bad in ("q", "kq", "2"):
        monkeypatch.setenv("FA_VARIANTS_TEST", bad)
        with pytest.raises(ValueError, match=f"^FA_VARIANTS_TEST='{bad}' must be 0 or 1 .* or k$"):
            env.flag_or("FA_VARIANTS_TEST", False, ("k",))


def test_every_switch_is_read_through_common_env():
    """No FA_VARIANTS_* read straight from os.environ (where "false" meant on and a typo meant the default),
    but the free-form ones."""
    raw = set()
    for path in SOURCES:
        if path.name != "env.py":
            raw |= set(re.findall(r"environ(?:\.get\(|\[)\"(FA_VARIANTS_[A-Z0-9_]+)\"", path.read_text(encoding="utf-8")))
    assert raw <= FREE_FORM, sorted(raw - FREE_FORM)


def test_a_bad_switch_fails_the_import_with_one_line_naming_it():
    """An import-time switch with a value it does not take: the import fails with a ValueError whose one line
    names the variable (before: FA_VARIANTS_MERGE_WARP=yes2 imported fine, the switch silently off)."""
    environ = subprocess_env(FA_VARIANTS_MERGE_WARP="yes2", FA_VARIANTS_SPLIT_KV="false")
    run = subprocess.run([sys.executable, "-c", "import fa_variants.common.split_combine"], env=environ,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1] == ("fa_variants.common.env.SwitchError: FA_VARIANTS_MERGE_WARP='yes2' "
                                                   "must be one of 0, 1, auto")


def test_a_switch_beyond_int32_names_itself():
    """FA_VARIANTS_FP8_SMOOTH_K_BLOCKS=2^31 broke `import fa_variants.fp8` with a message naming
    FP8Config.smooth_k_blocks (the module's default FP8Config() checks it), not the variable (session 27)."""
    environ = subprocess_env(FA_VARIANTS_FP8_SMOOTH_K_BLOCKS="2147483648")
    run = subprocess.run([sys.executable, "-c", "import fa_variants.fp8"], env=environ, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].startswith(
        "fa_variants.common.env.SwitchError: FA_VARIANTS_FP8_SMOOTH_K_BLOCKS must be an int <= 2147483647")


def test_a_bad_switch_stops_auto_instead_of_falling_back():
    """`auto` on an sm_90 with a mistyped fa3 switch: the one-line error naming the variable, not a fallback to a
    slower backend with a warning (registry reports other import failures as a reason to fall back)."""
    environ = subprocess_env(FA_VARIANTS_PACK_WIDE="yes")
    code = "import torch; from fa_variants import dispatch; dispatch.select((9, 0), torch.bfloat16, 128)"
    run = subprocess.run([sys.executable, "-W", "error", "-c", code], env=environ, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0 and "fell back" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == ("fa_variants.common.env.SwitchError: FA_VARIANTS_PACK_WIDE='yes' "
                                                   "must be one of 0, 1, auto")


def test_readme_table_lists_each_switch_once_with_its_default():
    rows = _table()
    listed = [re.match(r"\| `(FA_VARIANTS_[A-Z0-9_]+)", row).group(1) for row in rows]
    assert len(listed) == len(set(listed)), sorted(n for n in listed if listed.count(n) > 1)
    assert set(listed) == _read_in_package(), set(listed) ^ _read_in_package()
    default = {name: row.split(" | ")[1] for name, row in zip(listed, rows)}
    checked = 0
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        for name, on in re.findall(r"env\.flag\(\"(FA_VARIANTS_\w+)\", (True|False)\)", text):
            assert default[name] == ("on" if on == "True" else "off"), (name, default[name])
            checked += 1
        for name, value in re.findall(r"env\.(?:integer|choice)\(\"(FA_VARIANTS_\w+)\", \"(\w+)\"", text):
            assert re.search(rf"\b{value}\b", default[name]), (name, value, default[name])
            checked += 1
        for name in re.findall(r"env\.auto_flag\(\"(FA_VARIANTS_\w+)\"\)", text):
            assert re.search(r"\bauto\b", default[name]), (name, default[name])
            checked += 1
        for name, on in re.findall(r"env\.flag_or\(\"(FA_VARIANTS_\w+)\", (True|False),", text):
            assert default[name] == ("on" if on == "True" else "off"), (name, default[name])
            checked += 1
    assert checked >= 15


# ----------------------------------------------------------------- every switch checked at the API's import


def test_every_switch_read_is_checked_by_common_switches():
    """A new FA_VARIANTS_* variable must join common.switches (checked when the API is imported) or be free-form:
    else a bad value is silently accepted wherever its module does not load (a kernel module on the CPU)."""
    read = _read_in_package()
    listed = set(switches.SWITCHES) | set(switches.FREE_FORM)
    assert read == listed, sorted(read ^ listed)


@pytest.mark.parametrize("name", sorted(switches.SWITCHES))
def test_each_switch_rejects_a_bad_value_with_one_line_naming_it(monkeypatch, name):
    monkeypatch.setenv(name, "bogus-value")
    with pytest.raises(env.SwitchError, match=f"^{name}[= ]") as info:
        switches.check_all()
    assert "\n" not in str(info.value)
    monkeypatch.delenv(name)
    switches.check_all()


def test_the_checks_take_what_the_modules_take(monkeypatch):
    """Each switch's kind and bounds as its module reads it (env.flag / auto_flag / integer): the spellings the
    module takes pass common.switches, the ones it refuses fail there too."""
    good_bad = {}
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        for name in re.findall(r"env\.flag\(\"(FA_VARIANTS_\w+)\"", text):
            good_bad[name] = (("0", "on", "False", "yes"), ("2", "maybe"))
        for name in re.findall(r"env\.auto_flag\(\"(FA_VARIANTS_\w+)\"\)", text):
            good_bad[name] = (("0", "1", "auto"), ("on", "x"))
        for name, names in re.findall(r"env\.flag_or\(\"(FA_VARIANTS_\w+)\", \w+, \(([^)]*)\)\)", text):
            good_bad[name] = (("0", "on", "False", *re.findall(r"\"([^\"]+)\"", names)), ("2", "maybe"))
        for name, low in re.findall(r"env\.integer\(\"(FA_VARIANTS_\w+)\", \"\w+\", (\d+)", text):
            good_bad[name] = ((low, "64"), (str(int(low) - 1), "huge", "1.5"))
    assert len(good_bad) >= 20
    for name, (good, bad) in good_bad.items():
        for value in good:
            monkeypatch.setenv(name, value)
            switches.check_all()
        for value in bad:
            monkeypatch.setenv(name, value)
            with pytest.raises(env.SwitchError, match=f"^{name}"):
                switches.check_all()
        monkeypatch.delenv(name)


def test_the_choices_are_the_kernel_modules_own():
    """common.switches repeats the choice tables so that checking needs no DSL: here they meet the modules'."""
    from fa_variants import registry
    from fa_variants.ampere import fa2
    from fa_variants.common import diskcache
    from fa_variants.fp8 import quant_host
    from fa_variants.hopper import fa3
    from fa_variants.integrations import backward

    own = {"FA_VARIANTS_BACKEND": {"auto", *registry.BACKENDS},
           "FA_VARIANTS_BACKWARD": set(backward.BACKWARDS),
           "FA_VARIANTS_DECODE_TILES": {*fa3.DECODE_TILES, "auto"},
           "FA_VARIANTS_FUSED_MERGE": set(fa3.FUSED_MERGE_MODES),
           "FA_VARIANTS_FA2_D256": set(fa2.D256_CONFIGS),
           "FA_VARIANTS_FP8_QUANT_PIPELINE": set(quant_host.PIPELINES)}
    choice_call = re.compile(r"env\.choice\((\"FA_VARIANTS_\w+\"|ENV_LOADER), \"\w+\", \(([^)]*)\)\)")
    for path in SOURCES:  # the literal choices of the other env.choice calls
        for name, names in choice_call.findall(path.read_text(encoding="utf-8")):
            name = diskcache.ENV_LOADER if name == "ENV_LOADER" else name.strip('"')
            own.setdefault(name, set(re.findall(r"\"([^\"]+)\"", names)))
    assert set(own) == set(switches.CHOICES), set(own) ^ set(switches.CHOICES)
    for name, names in own.items():
        assert set(switches.CHOICES[name]) == names, name


@pytest.mark.parametrize("setting", ["FA_VARIANTS_SPLIT_KV=2", "FA_VARIANTS_PACK_WIDE=x",
                                     "FA_VARIANTS_DECODE_TILES=huge", "FA_VARIANTS_DISK_CACHE=maybe"])
def test_attention_on_the_cpu_refuses_a_bad_kernel_switch(setting):
    """Switches read at a kernel module's import were accepted by attention() on the CPU (no kernel module
    loads there): now the API's import refuses them, with one line naming the variable, without the DSL."""
    name, value = setting.split("=")
    environ = subprocess_env(**{name: value})
    code = ("import sys, torch, fa_variants\n"
            "q = torch.randn(1, 4, 2, 64)\n"
            "try:\n"
            "    fa_variants.attention(q, q, q)\n"
            "finally:\n"
            "    print('dsl', 'cutlass' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and run.stdout.strip() == "dsl False", (run.stdout, run.stderr[-500:])
    assert run.stderr.strip().splitlines()[-1].startswith(f"fa_variants.common.env.SwitchError: {name}='{value}' must")


def test_commands_check_every_switch_first(monkeypatch, capsys):
    """`fa-variants info` (and every other command) with a switch the API refuses: one line naming it, exit 2, before
    the command runs (info exited 0 and said nothing; session 28's break-it pass)."""
    from fa_variants import cli

    monkeypatch.setenv("FA_VARIANTS_CP_COMPILE", "x")
    assert cli.main(["info", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("fa-variants info: error: FA_VARIANTS_CP_COMPILE='x'"), err


def test_backend_switch_ignores_spaces_as_the_check_does(monkeypatch):
    """FA_VARIANTS_BACKEND=" reference ": common.switches strips it, so the dispatcher does too (it refused
    "unknown backend ' reference'" naming reference among the choices)."""
    import torch

    import fa_variants

    monkeypatch.setenv("FA_VARIANTS_BACKEND", " reference ")
    switches.check_all()
    q = torch.randn(1, 8, 2, 16)
    chosen = fa_variants.select_backend(q, q, q)
    assert chosen.backend == "reference" and "FA_VARIANTS_BACKEND=reference" in chosen.reason
    fa_variants.attention(q, q, q)


def test_an_empty_choice_switch_is_its_default():
    """FA_VARIANTS_FUSED_MERGE= (empty) passed common.switches but failed hopper.fa3's import; empty is unset, as for
    every other switch. Needs the CuTe DSL to import the kernel module (skipped without it)."""
    pytest.importorskip("cutlass")
    code = "import fa_variants.hopper.fa3 as m; print(m.FUSED_MERGE)"
    env_ = {**os.environ, "FA_VARIANTS_FUSED_MERGE": "", "CUTE_DSL_ARCH": "sm_90a"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0 and run.stdout.strip() == "off", run.stderr[-2000:]


def test_info_reports_the_backend_override_as_dispatch_reads_it(monkeypatch, capsys):
    """fa-variants info printed "FA_VARIANTS_BACKEND=  overrides backend='auto'" for a blank value that the
    dispatcher (spaces stripped) ignores; now both read dispatch.env_override."""
    from fa_variants import cli

    for value, shown in (("  ", None), (" auto ", None), (" reference ", "reference")):
        monkeypatch.setenv("FA_VARIANTS_BACKEND", value)
        assert cli.main(["info", "--json"]) == 0
        facts = json.loads(capsys.readouterr().out)
        assert facts["env_override"]["FA_VARIANTS_BACKEND"] == shown, (value, facts["env_override"])


# ----------------------------------------------------------------- unknown FA_VARIANTS_* names


def test_an_unknown_switch_name_warns_once_with_the_closest_name(monkeypatch):
    """FA_VARIANTS_SPLITKV=0 (a typo of FA_VARIANTS_SPLIT_KV) changed nothing and said nothing: now one warning per
    name and process, naming the closest switch; the known names outside the package (test seeds) are not reported."""
    monkeypatch.setattr(switches, "_reported", set())
    for name in [n for n in os.environ if n.startswith("FA_VARIANTS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FA_VARIANTS_SPLITKV", "0")
    monkeypatch.setenv("FA_VARIANTS_TEST_SEED", "7")
    monkeypatch.setenv("FA_VARIANTS_ZZZ_QQQ", "1")
    with pytest.warns(switches.UnknownSwitchWarning) as caught:
        switches.check_all()
    messages = sorted(str(w.message) for w in caught)
    assert messages == ["FA_VARIANTS_SPLITKV is not a fa_variants switch and changes nothing (did you mean "
                        "FA_VARIANTS_SPLIT_KV?)",
                        "FA_VARIANTS_ZZZ_QQQ is not a fa_variants switch and changes nothing (README.md, "
                        "'Environment switches', lists them)"], messages
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        switches.check_all()  # reported once per process


def test_every_known_name_is_not_reported():
    known = {n: "1" for n in [*switches.SWITCHES, *switches.FREE_FORM, *switches.OUTSIDE]}
    assert switches.unknown_names(known) == []
    assert switches.unknown_names({"FA_VARIANTS_": "", "OTHER_FA_VARIANTS_X": "1"}) == ["FA_VARIANTS_"]


def test_the_names_read_outside_the_package_are_the_tests_own():
    """switches.OUTSIDE lists exactly the FA_VARIANTS_* names the tests read (so none is reported as unknown)."""
    read = set()
    for path in sorted((ROOT / "tests").glob("*.py")):
        if path.name == "test_env_switches.py":  # its own unknown names
            continue
        read |= set(re.findall(r"\"(FA_VARIANTS_[A-Z0-9_]+)\"", path.read_text(encoding="utf-8")))
    read -= set(switches.SWITCHES) | set(switches.FREE_FORM)
    assert read <= set(switches.OUTSIDE), read - set(switches.OUTSIDE)
    assert {"FA_VARIANTS_TEST_SEED", "FA_VARIANTS_SESSION_SEED", "FA_VARIANTS_FP8_STATS"} <= set(switches.OUTSIDE)


def test_the_cli_reports_an_unknown_name_in_one_line():
    environ = subprocess_env(FA_VARIANTS_PACKGQA="0")
    run = subprocess.run([sys.executable, "-m", "fa_variants", "info", "--json"], env=environ, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-500:]
    lines = [line for line in run.stderr.splitlines() if "FA_VARIANTS_PACKGQA" in line]
    assert lines == ["fa-variants: warning: FA_VARIANTS_PACKGQA is not a fa_variants switch and changes nothing "
                     "(did you mean FA_VARIANTS_PACK_GQA?)"], run.stderr[-800:]


def test_int_switches_read_as_the_others(monkeypatch):
    """env.integer: unset or blank -> the default, as flags and choices (a blank FA_VARIANTS_SPLIT_MIN_TILES made
    every call raise); spaces stripped; ASCII digits only (int() took "1_0" as 10 and other scripts' digits); a long
    bad value is cut in the message, which stays one short line (any kind of switch)."""
    from fa_variants.common import env

    name = "FA_VARIANTS_TEST_INT_SWITCH"
    for value, expected in (("", 7), ("  ", 7), (" 3 ", 3), ("+4", 4)):
        monkeypatch.setenv(name, value)
        assert env.integer(name, "7", 1) == expected, value
    for value in ("1_0", "\u0663", "\uff11", "0x10", "3.0", "x" * 5000):
        monkeypatch.setenv(name, value)
        with pytest.raises(env.SwitchError, match=f"^{name} must be an int >= 1, got ") as info:
            env.integer(name, "7", 1)
        assert len(str(info.value)) < 140, str(info.value)
    monkeypatch.setenv(name, "y" * 5000)
    for read in (lambda: env.flag(name, False), lambda: env.choice(name, "a", ("a", "b"))):
        with pytest.raises(env.SwitchError, match=r"\.\.\.' \(5000 characters\)") as info:
            read()
        assert len(str(info.value)) < 160, str(info.value)


def test_the_suite_drops_switches_the_callers_shell_exported(tmp_path):
    """tests/conftest.py runs the suite on the defaults whatever the caller exported: a switch set in the shell
    (a backend that changes what `auto` tests see, a value the package's import refuses) is gone before the package
    loads and named in the header; the suite's own variables and the fixture's path stay."""
    import shutil

    for name in ("conftest.py", "helpers.py"):
        shutil.copy(ROOT / "tests" / name, tmp_path / name)
    (tmp_path / "test_probe.py").write_text(
        "import os\n\n"
        "def test_environment():\n"
        "    import fa_variants.api  # its import checks every switch: FA_VARIANTS_SPLIT_KV=2 would raise\n"
        "    assert 'FA_VARIANTS_BACKEND' not in os.environ and 'FA_VARIANTS_SPLIT_KV' not in os.environ\n"
        "    assert os.environ['FA_VARIANTS_FIXTURE'] == '/nowhere/fixture.pt'\n"
        "    assert os.environ['FA_VARIANTS_FP8_STATS'] == 'stats.json'\n", encoding="utf-8")
    environ = subprocess_env(FA_VARIANTS_BACKEND="reference", FA_VARIANTS_SPLIT_KV="2",
                             FA_VARIANTS_FIXTURE="/nowhere/fixture.pt", FA_VARIANTS_FP8_STATS="stats.json")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-v",
                          str(tmp_path)], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300)
    assert "1 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    assert ("fa_variants tests: ignored from the environment (the suite tests the defaults): FA_VARIANTS_BACKEND, "
            "FA_VARIANTS_SPLIT_KV") in run.stdout, run.stdout[-3000:]
