"""CPU check of the fa3-fp8 config tables the GPU tests run: every entry, applied on top of the current default
config of its head_dim, is a config the kernel accepts (``Fp8Config.check``). A default flip that a table's change
contradicts (e.g. the head_dim 256 lookahead refusing a switch) then fails here, on the CPU, not on the GPU host."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

fa3_fp8 = pytest.importorskip("fa_variants.hopper.fa3_fp8")

TESTS = Path(__file__).parent


def _table(module_file: str, name: str) -> dict:
    spec = importlib.util.spec_from_file_location(f"_tables_{Path(module_file).stem}", TESTS / module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _entries():
    for module_file, name in [("test_fa3_fp8_kernel.py", "CONFIG_VARIANTS"), ("test_fa3_fp8_speed_gpu.py", "FP8_VARIANTS"),
                              ("test_fa3_fp8_speed_gpu.py", "FP8SMALL_VARIANTS"), ("test_fa3_fp8_speed_gpu.py", "FP8MID_VARIANTS"),
                              ("test_fa3_fp8_speed_gpu.py", "FP8D128_VARIANTS"), ("test_fa3_fp8_speed_gpu.py", "FP8TWO_VARIANTS"),
                              ("test_fa3_fp8_speed_gpu.py", "FP8TURN_VARIANTS")]:
        for variant, (head_dim, change) in _table(module_file, name).items():
            yield pytest.param(head_dim, change, id=f"{name}-{variant}")
    for name in ("VARIANTS", "HALVES_VARIANTS"):
        for variant, change in _table("test_fa3_fp8_lookahead_gpu.py", name).items():
            yield pytest.param(256, change, id=f"lookahead-{name}-{variant}")


@pytest.mark.parametrize("head_dim, change", list(_entries()))
def test_gpu_test_variants_are_valid_configs(head_dim, change):
    dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[head_dim], **change).check(head_dim)


def _speed_ab():
    path = TESTS.parent / "scripts" / "fa3_fp8_speed_ab.py"
    spec = importlib.util.spec_from_file_location("_tables_fa3_fp8_speed_ab", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_speed_ab_sets_are_valid_configs():
    """scripts/fa3_fp8_speed_ab.py's --set variants, on top of the current defaults, are configs the kernel accepts (the
    GPU run would otherwise stop at its precompile)."""
    bad = []
    for set_name, vs in _speed_ab().SETS.items():
        for head_dim, names in vs.variants.items():
            for variant, change in names.items():
                try:
                    dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[head_dim], **change).check(head_dim)
                except ValueError as exc:
                    bad.append(f"{set_name} d{head_dim} {variant}: {exc}")
    assert not bad, bad


def test_no_lookahead_copies():
    """The copies of ``fa3_fp8.NO_LOOKAHEAD`` in files that do not import the kernel module (it loads the CuTe DSL)
    are the module's (session 11: it gained bounded_units=False with the head_dim 256 flip)."""
    assert _speed_ab().NO_LOOKAHEAD == fa3_fp8.NO_LOOKAHEAD
    for module_file in ("test_fa3_fp8_speed_gpu.py", "test_fa3_fp8_lookahead_gpu.py"):
        assert _table(module_file, "NO_LOOKAHEAD") == fa3_fp8.NO_LOOKAHEAD, module_file
    assert _table("test_fa3_fp8_kernel.py", "NO_LOOKAHEAD_256") == fa3_fp8.NO_LOOKAHEAD
