"""The backend table, auto's choices and their reasons, overrides, and errors naming who can serve a call.

Kernel modules are replaced by fakes (the GPU and the real kernels are not needed here): each fake follows
the kernel module contract and lives under a private module name, so these tests do not depend on which
real kernels exist yet.
"""
import sys
import types
import warnings

import pytest
import torch

from fa_variants import dispatch
from fa_variants.dispatch import (Backend, BackendFallbackWarning, BackendUnavailableError, select,
                                  why_not)

FP16, BF16, FP32, FP8 = torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn
SM80, SM86, SM89, SM90, SM100 = (8, 0), (8, 6), (8, 9), (9, 0), (10, 0)

FAKES = {  # backend -> (HEAD_DIMS, DTYPES) of its fake module
    "fa3": ((64, 128, 256), (FP16, BF16)),
    "fa3-fp8": ((64, 128, 256), (FP8,)),
    "fa2": ((32, 64, 96, 128, 160, 192, 256), (FP16, BF16)),
    "fa1": ((64, 128), (FP16, BF16)),
}


def fake_module(name, head_dims, dtypes):
    module = types.ModuleType(name)
    module.HEAD_DIMS, module.DTYPES = head_dims, dtypes
    module.run = lambda q, k, v, *, causal, softmax_scale: None
    return module


@pytest.fixture
def kernels(monkeypatch):
    """Install fake kernel modules; returns a function to mark some of them not built."""
    dispatch.clear_cache()
    for name, (head_dims, dtypes) in FAKES.items():
        path = f"_fake_kernels.{name.replace('-', '_')}"
        monkeypatch.setitem(sys.modules, path, fake_module(path, head_dims, dtypes))
        monkeypatch.setitem(dispatch.BACKENDS, name, Backend(name, path, "fake"))
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)

    def not_built(*names):
        for name in names:
            monkeypatch.setitem(dispatch.BACKENDS, name, Backend(name, f"fa_variants._absent.{name}", "x"))
        dispatch.clear_cache()

    yield not_built
    dispatch.clear_cache()


def no_warning_select(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackendFallbackWarning)
        return select(*args, **kwargs)


def test_table():
    assert dispatch.backends_for(SM90) == ("fa3", "fa3-fp8", "fa2", "fa1", "reference")
    for cap in (SM80, SM86, SM89):
        assert dispatch.backends_for(cap) == ("fa2", "fa1", "reference")
    assert dispatch.backends_for(SM100) == ("reference",)
    assert dispatch.backends_for(None) == ("reference",)
    assert dispatch.supported_archs("fa2") == ("sm_80", "sm_86", "sm_89", "sm_90")
    assert dispatch.supported_archs("fa3") == ("sm_90",)
    assert dispatch.supported_archs("reference") is None
    assert {b.module for b in dispatch.BACKENDS.values()} >= {
        "fa_variants.ampere.fa2", "fa_variants.ampere.fa1", "fa_variants.hopper.fa3", "fa_variants.fp8.fa3_fp8"}


def test_head_dims_and_dtypes_come_from_the_module(kernels):
    assert dispatch.head_dims("fa3") == (64, 128, 256)
    assert dispatch.dtypes("fa3-fp8") == (FP8,)
    assert dispatch.head_dims("reference") is None  # any


@pytest.mark.parametrize("cap, dtype, head_dim, want", [
    (SM90, BF16, 128, "fa3"), (SM90, FP16, 64, "fa3"), (SM90, FP8, 128, "fa3-fp8"),
    (SM80, BF16, 128, "fa2"), (SM86, FP16, 96, "fa2"), (SM89, BF16, 256, "fa2"),
    (None, BF16, 128, "reference"), (None, FP32, 7, "reference"),
])
def test_auto_picks_the_fastest_without_warning(kernels, cap, dtype, head_dim, want):
    sel = no_warning_select(cap, dtype, head_dim)
    assert sel.backend == want
    assert sel.candidates[0] == want and "reference" in sel.candidates or dtype == FP8
    assert sel.reason.startswith("auto:")


def test_auto_falls_back_for_head_dim_and_warns_once(kernels):
    with pytest.warns(BackendFallbackWarning, match="fa3 does not support head_dim 96"):
        sel = select(SM90, BF16, 96)
    assert sel.backend == "fa2" and sel.candidates == ("fa2", "reference")
    assert "fa3 does not support head_dim 96 (supports 64, 128, 256)" in sel.reason
    assert "fell back to fa2" in sel.reason
    assert no_warning_select(SM90, BF16, 96) == sel  # the second time: reason only, no warning


def test_auto_falls_back_when_not_built(kernels):
    kernels("fa3")
    with pytest.warns(BackendFallbackWarning, match="fa3 is not built yet"):
        assert select(SM90, FP16, 128).backend == "fa2"
    kernels("fa2")
    with pytest.warns(BackendFallbackWarning, match="fa2 is not built yet"):
        assert select(SM80, FP16, 128).backend == "fa1"


def test_auto_on_gpu_warns_for_the_reference_path(kernels):
    with pytest.warns(BackendFallbackWarning, match="no kernel backend on sm_90 serves float32"):
        assert select(SM90, FP32, 128).backend == "reference"
    with pytest.warns(BackendFallbackWarning, match="sm_100"):
        assert select(SM100, BF16, 128).backend == "reference"
    with pytest.warns(BackendFallbackWarning, match="fa2 does not support head_dim 100"):
        assert select(SM80, BF16, 100).backend == "reference"


def test_fp8_is_not_a_fallback_for_bf16(kernels):
    kernels("fa3")
    with pytest.warns(BackendFallbackWarning) as record:
        select(SM90, BF16, 128)
    assert "fa3-fp8" not in str(record[0].message)  # fa3-fp8 serves other dtypes: not skipped


def test_explicit_backend(kernels):
    sel = no_warning_select(SM90, BF16, 128, backend="fa1")
    assert sel.backend == "fa1" and sel.reason == "requested by backend='fa1'"
    assert sel.candidates == ("fa3", "fa2", "fa1", "reference")


@pytest.mark.parametrize("cap, backend, dtype, head_dim, message", [
    (SM90, "fa3", BF16, 96,
     "fa3 does not support head_dim 96 (supports 64, 128, 256); backends that can: fa2, reference"),
    (SM80, "fa3", BF16, 128, "fa3 runs on sm_90 only; this GPU is sm_80; backends that can: fa2, fa1, reference"),
    (None, "fa2", BF16, 128,
     "fa2 runs on sm_80, sm_86, sm_89, sm_90 only; the inputs are on the CPU; backends that can: reference"),
    (SM90, "fa2", FP32, 64,
     "fa2 does not support dtype float32 (supports float16, bfloat16); backends that can: reference"),
    (SM90, "fa1", BF16, 256, "fa1 does not support head_dim 256 (supports 64, 128); backends that can: fa3, fa2"),
    (SM90, "fa3-fp8", BF16, 128, "fa3-fp8 does not support dtype bfloat16 (supports float8_e4m3fn)"),
    (SM90, "reference", FP8, 64, "reference does not support dtype float8_e4m3fn"),
])
def test_explicit_backend_that_cannot_serve(kernels, cap, backend, dtype, head_dim, message):
    with pytest.raises(BackendUnavailableError) as err:
        select(cap, dtype, head_dim, backend=backend)
    assert message in str(err.value)
    assert isinstance(err.value, ValueError)


def test_explicit_backend_not_built(kernels):
    kernels("fa3")
    with pytest.raises(BackendUnavailableError, match="fa3 is not built yet; backends that can: fa2, fa1, reference"):
        select(SM90, BF16, 128, backend="fa3")


def test_unknown_backend(kernels):
    with pytest.raises(ValueError, match=r"unknown backend 'fa9'.*choose from auto, fa3, fa3-fp8, fa2, fa1, "
                                         r"reference"):
        select(SM90, BF16, 128, backend="fa9")


def test_no_backend_at_all(kernels):
    with pytest.raises(BackendUnavailableError, match="no backend can serve float8_e4m3fn head_dim 64 on cpu"):
        select(None, FP8, 64)


def test_env_override(kernels, monkeypatch):
    monkeypatch.setenv(dispatch.ENV_VAR, "fa1")
    sel = no_warning_select(SM90, BF16, 128)
    assert sel.backend == "fa1" and sel.reason == "requested by FA_VARIANTS_BACKEND=fa1"
    assert no_warning_select(SM90, BF16, 128, backend="fa2").backend == "fa2"  # the argument wins
    with pytest.raises(BackendUnavailableError, match="fa1 does not support head_dim 96"):
        select(SM90, BF16, 96)
    monkeypatch.setenv(dispatch.ENV_VAR, "auto")
    assert no_warning_select(SM90, BF16, 128).backend == "fa3"
    monkeypatch.setenv(dispatch.ENV_VAR, "")
    assert no_warning_select(SM90, BF16, 128).backend == "fa3"
    monkeypatch.setenv(dispatch.ENV_VAR, "fastest")
    with pytest.raises(ValueError, match="unknown backend 'fastest' \\(from FA_VARIANTS_BACKEND=fastest\\)"):
        select(SM90, BF16, 128)


def test_module_breaking_the_contract(kernels, monkeypatch):
    broken = types.ModuleType("_fake_kernels.broken")
    broken.HEAD_DIMS = (64,)
    monkeypatch.setitem(sys.modules, "_fake_kernels.broken", broken)
    monkeypatch.setitem(dispatch.BACKENDS, "fa2", Backend("fa2", "_fake_kernels.broken", "x"))
    dispatch.clear_cache()
    assert "does not follow the kernel module contract: missing DTYPES, run" in why_not("fa2", SM80, BF16, 64)


def test_module_failing_at_import(kernels, monkeypatch, tmp_path):
    (tmp_path / "_fa_broken_kernel.py").write_text("raise RuntimeError('no cutlass here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(dispatch.BACKENDS, "fa2", Backend("fa2", "_fa_broken_kernel", "x"))
    dispatch.clear_cache()
    assert why_not("fa2", SM80, BF16, 64) == "fa2 failed to import (RuntimeError: no cutlass here)"
    with pytest.warns(BackendFallbackWarning, match="fa2 failed to import"):
        assert select(SM80, BF16, 64).backend == "fa1"


def test_a_missing_dependency_is_not_called_not_built(kernels, monkeypatch, tmp_path):
    (tmp_path / "_fa_needs_dep.py").write_text("import _fa_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(dispatch.BACKENDS, "fa2", Backend("fa2", "_fa_needs_dep", "x"))
    dispatch.clear_cache()
    assert "cannot be imported" in why_not("fa2", SM80, BF16, 64)


def test_select_backend_uses_the_device_capability(kernels, monkeypatch):
    q = torch.zeros(1, 4, 2, 96, dtype=BF16)
    assert dispatch.select_backend(q, q, q).backend == "reference"  # CPU tensors
    monkeypatch.setattr(dispatch, "device_capability", lambda device: SM80)
    assert no_warning_select(dispatch.device_capability(q.device), BF16, 96).backend == "fa2"
    assert dispatch.select_backend(q, q, q).backend == "fa2"


def test_the_real_modules_load_or_say_why():
    dispatch.clear_cache()
    for name in dispatch.BACKENDS:
        loaded = dispatch.load(name)
        if isinstance(loaded, str):
            assert name in loaded
        else:
            assert isinstance(loaded.DTYPES, tuple) and callable(loaded.run)
            assert loaded.HEAD_DIMS is None or all(isinstance(d, int) for d in loaded.HEAD_DIMS)
