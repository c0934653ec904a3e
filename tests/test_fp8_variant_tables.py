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
