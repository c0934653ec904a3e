"""The backend table, auto's choices and their reasons, overrides, and errors naming who can serve a call.

Kernel modules are replaced by fakes (the GPU and the real kernels are not needed here): each fake defines a
VARIANT record (common.launch.Variant) and lives under a private module name, registered in the one registry,
so these tests do not depend on which real kernels exist yet.
"""
import sys
import types
import warnings

import pytest
import torch

from fa_variants import dispatch, registry
from fa_variants.common.launch import Variant
from fa_variants.dispatch import BackendFallbackWarning, BackendUnavailableError, select, why_not

FP16, BF16, FP32, FP8 = torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn
SM80, SM86, SM89, SM90, SM100, SM120 = (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)

FAKES = {  # backend -> (HEAD_DIMS, DTYPES) of its fake module
    "fa3": ((64, 128, 256), (FP16, BF16)),
    "fa3-fp8": ((64, 128, 256), (FP8,)),
    "fa2": ((32, 64, 96, 128, 160, 192, 256), (FP16, BF16)),
    "fa1": ((64, 128), (FP16, BF16)),
}


def fake_module(name, head_dims, dtypes):
    module = types.ModuleType(name)
    module.VARIANT = Variant(name, archs=("sm_80",), dtypes=dtypes, head_dims=head_dims,
                             runner=lambda q, k, v, *, causal, softmax_scale: None)
    return module


def register(monkeypatch, name, module_name):
    monkeypatch.setitem(registry.ENTRIES, name, registry.Entry(module_name, "fake"))


@pytest.fixture
def kernels(monkeypatch):
    """Install fake kernel modules; returns a function to mark some of them not built."""
    dispatch.clear_cache()
    for name, (head_dims, dtypes) in FAKES.items():
        path = f"_fake_kernels.{name.replace('-', '_')}"
        monkeypatch.setitem(sys.modules, path, fake_module(name, head_dims, dtypes))
        register(monkeypatch, name, path)
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)

    def not_built(*names):
        for name in names:
            register(monkeypatch, name, f"fa_variants._absent.{name}")
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
    for newer in (SM100, SM120, (10, 3), (11, 0)):  # a GPU the table does not list runs the sm80 kernels
        assert dispatch.backends_for(newer) == ("fa2", "fa1", "reference")
    assert dispatch.backends_for((7, 5)) == ("reference",)  # older than sm_80: no kernel
    assert dispatch.backends_for(None) == ("reference",)
    assert dispatch.supported_archs("fa2") == ("sm_80", "sm_86", "sm_89", "sm_90", "newer GPUs")
    assert dispatch.supported_archs("fa3") == ("sm_90",)
    assert dispatch.supported_archs("reference") is None
    # one registry: every backend name has one module, the one dispatch, compile and info load
    assert dispatch.BACKENDS == registry.BACKENDS and set(registry.BACKENDS) <= set(registry.ENTRIES)
    assert registry.ENTRIES["fa3-fp8"].module == "fa_variants.fp8.fa3_fp8"
    assert {registry.ENTRIES[n].module for n in ("fa2", "fa1", "fa3")} == {
        "fa_variants.ampere.fa2", "fa_variants.ampere.fa1", "fa_variants.hopper.fa3"}


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
    with pytest.warns(BackendFallbackWarning, match="no kernel backend on sm_100 serves float32"):
        assert select(SM100, FP32, 128).backend == "reference"
    with pytest.warns(BackendFallbackWarning, match="fa2 does not support head_dim 100"):
        assert select(SM80, BF16, 100).backend == "reference"


@pytest.mark.parametrize("cap", [SM100, SM120], ids=["sm_100", "sm_120"])
def test_newer_gpu_gets_fa2_with_a_reason(kernels, cap):
    """Issue 14 item 6: a GPU of compute capability >= 8.0 that the table does not list runs fa2 (its sm80
    code runs there), without a fallback warning, and the reason says why."""
    sel = no_warning_select(cap, BF16, 128)
    name = f"sm_{cap[0]}{cap[1]}"
    assert sel.backend == "fa2" and sel.candidates == ("fa2", "fa1", "reference")
    assert name in sel.reason and "newer than the GPUs the dispatch table lists" in sel.reason
    assert "sm80 code" in sel.reason
    with pytest.raises(BackendUnavailableError, match=f"fa3 runs on sm_90 only; this GPU is {name}"):
        select(cap, BF16, 128, backend="fa3")


def test_fp8_is_not_a_fallback_for_bf16(kernels):
    kernels("fa3")
    with pytest.warns(BackendFallbackWarning) as record:
        select(SM90, BF16, 128)
    assert "fa3-fp8" not in str(record[0].message)  # fa3-fp8 serves other dtypes: not skipped
    assert record[0].filename == __file__  # the caller's line


def test_explicit_backend(kernels):
    sel = no_warning_select(SM90, BF16, 128, backend="fa1")
    assert sel.backend == "fa1" and sel.reason == "requested by backend='fa1'"
    assert sel.candidates == ("fa3", "fa2", "fa1", "reference")


@pytest.mark.parametrize("cap, backend, dtype, head_dim, message", [
    (SM90, "fa3", BF16, 96,
     "fa3 does not support head_dim 96 (supports 64, 128, 256); backends that can: fa2, reference"),
    (SM80, "fa3", BF16, 128, "fa3 runs on sm_90 only; this GPU is sm_80; backends that can: fa2, fa1, reference"),
    (None, "fa2", BF16, 128,
     "fa2 runs on sm_80, sm_86, sm_89, sm_90, newer GPUs only; the inputs are not on a CUDA GPU; backends that can: "
     "reference"),
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
    with pytest.raises(BackendUnavailableError,
                       match=r"no backend can serve float8_e4m3fn head_dim 64 \(inputs not on a CUDA GPU\)"):
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
    register(monkeypatch, "fa2", "_fake_kernels.broken")
    dispatch.clear_cache()
    assert "defines no VARIANT record" in why_not("fa2", SM80, BF16, 64)


def test_module_failing_at_import(kernels, monkeypatch, tmp_path):
    (tmp_path / "_fa_broken_kernel.py").write_text("raise RuntimeError('no cutlass here')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    register(monkeypatch, "fa2", "_fa_broken_kernel")
    dispatch.clear_cache()
    assert why_not("fa2", SM80, BF16, 64) == "fa2 failed to import (RuntimeError: no cutlass here)"
    with pytest.warns(BackendFallbackWarning, match="fa2 failed to import"):
        assert select(SM80, BF16, 64).backend == "fa1"


def test_a_missing_dependency_is_not_called_not_built(kernels, monkeypatch, tmp_path):
    (tmp_path / "_fa_needs_dep.py").write_text("import _fa_no_such_dependency\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    register(monkeypatch, "fa2", "_fa_needs_dep")
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
            assert isinstance(loaded, Variant) and loaded.name == name and isinstance(loaded.dtypes, tuple)
            assert loaded.head_dims is None or all(isinstance(d, int) for d in loaded.head_dims)


def test_registry_declarations_match_the_variants():
    """The dtypes / head dims / auto dtypes that registry.ENTRIES declares (so that choosing needs no import)
    are the imported Variants' own."""
    for name, entry in registry.ENTRIES.items():
        if not entry.dtypes:
            continue
        v = registry.load(name)
        assert not isinstance(v, str), v
        assert entry.dtypes == tuple(str(d).removeprefix("torch.") for d in v.dtypes), name
        assert entry.head_dims == v.head_dims, name
        auto = None if v.auto_dtypes is None else tuple(str(d).removeprefix("torch.") for d in v.auto_dtypes)
        assert entry.auto_dtypes == auto, name


def test_a_declared_backend_that_does_not_import_is_skipped(kernels, monkeypatch):
    monkeypatch.setitem(registry.ENTRIES, "fa3", registry.Entry("fa_variants._absent.fa3", "fake",
                                                                ("float16", "bfloat16"), (64, 128, 256)))
    dispatch.clear_cache()
    with pytest.warns(BackendFallbackWarning, match="fa3"):
        sel = select(SM90, BF16, 128)
    assert sel.backend == "fa2" and "fa3" not in sel.candidates
    with pytest.raises(BackendUnavailableError, match="fa3"):
        select(SM90, BF16, 128, backend="fa3")


def test_choosing_a_backend_on_hopper_imports_no_dsl():
    """A fresh process choosing for an sm_90 call (auto, fa3, fa2 by name) imports no CuTe DSL, although fa1
    and fa3-fp8 (whose modules import it) are candidates: the warm first call loads kernels from the disk
    cache without it (issue 13's 1 s budget). Asking for fa1 or fa3-fp8 by name imports them, and the DSL."""
    import subprocess

    code = ("import sys, torch\nfrom fa_variants import dispatch\n"
            "for b in ('auto', 'fa3', 'fa2'):\n"
            "    dispatch.select((9, 0), torch.bfloat16, 128, backend=b)\n"
            "print('cutlass' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("cap", [(8, 7), (10, 3), (12, 1)], ids=["sm_87", "sm_103", "sm_121"])
def test_every_kernel_a_newer_gpu_runs_is_built_for_it(cap):
    """A GPU the dispatch table does not list runs fa2 where the sm80 kernels are built for its arch: the kernels
    its calls launch (fa2, fa1 and the split-KV merge its decode calls add) serve the arch and `warmup` takes it
    (session 35: the merge and warmup refused sm_87 / sm_103a / sm_121a while prefill ran there); the sm90-only
    kernels and the FP8 pass still refuse it, in one line."""
    from fa_variants.commands.warmup import _check_names
    from fa_variants.common import interop

    arch = interop.arch_of_capability(*cap)
    for name in ("fa2", "fa1", "split-merge"):
        assert arch in registry.variant(name).archs, name
        assert registry.static_config(name, arch, "bf16", 128, False).arch == arch
    for name in ("fa3", "fa3-fp8", "fp8-quant"):
        assert arch not in registry.variant(name).archs
    with pytest.raises(registry.UnsupportedConfigError, match=f"does not serve arch {arch} "):
        registry.static_config("fa3", arch, "bf16", 128, False)
    _check_names(arch, None)


@pytest.mark.parametrize("cap", [(8, 7), (10, 3), (12, 1)], ids=["sm_87", "sm_103", "sm_121"])
def test_a_newer_gpu_the_kernels_are_built_for_gets_fa2(kernels, cap):
    assert no_warning_select(cap, BF16, 128).backend == "fa2"


@pytest.mark.parametrize("cap", [(10, 1), (10, 7), (11, 0)], ids=["sm_101", "sm_107", "sm_110"])
def test_a_newer_gpu_the_kernels_are_not_built_for_gets_the_reference(kernels, cap):
    """sm_101a / sm_110a compile without a cubin to store and sm_107a does not compile (nvidia-cutlass-dsl 4.8.1,
    CUDA 12.9): such a GPU gets the reference path with a warning naming why, not fa2 failing inside the DSL;
    `warmup --arch` refuses the arch in one line."""
    from fa_variants.commands.warmup import _check_names
    from fa_variants.common import interop

    arch = interop.arch_of_capability(*cap)
    with pytest.warns(BackendFallbackWarning, match=f"fa2 is not built for {arch} "):
        assert select(cap, BF16, 128).backend == "reference"
    with pytest.raises(BackendUnavailableError, match=f"fa2 is not built for {arch}"):
        select(cap, BF16, 128, backend="fa2")
    with pytest.raises(ValueError, match=f"--arch {arch}: not a compile target"):
        _check_names(arch, None)


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_87", "sm_103a", "sm_121a"])
def test_the_newer_compile_targets_build_a_cubin(arch):
    """Each newer arch in ``SM80_CODE_ARCHS`` compiles (the split-KV merge, the smallest sm80 kernel) to a cubin the
    disk cache can store (bytes: for sm_101a / sm_110a the DSL returns a path to a file it did not write)."""
    from fa_variants.common.launch import SM80_CODE_ARCHS

    assert arch in SM80_CODE_ARCHS
    compiled = registry.variant("split-merge").compiled(registry.static_config("split-merge", arch, "bf16", 128, False))
    assert isinstance(compiled.cubin, bytes) and len(compiled.cubin) > 1000


@pytest.mark.parametrize("arch, hint", [("sm_90", "did you mean sm_90a?"), ("sm_121", "did you mean sm_121a?"),
                                        ("sm_75", "choose from"), ("sm_88", "choose from"), ("sm_99a", "choose from"),
                                        ("sm_90b", "choose from"), ("gfx942", "choose from")])
def test_warmup_refuses_an_arch_no_kernel_builds_for(arch, hint):
    """`warmup --arch`: an arch no kernel is built for (below sm_80, a typo such as sm_88 / sm_99a, one the DSL
    names otherwise): one line naming the flag (session 35: the newer-arch rule let sm_88 through to a KeyError
    inside the DSL)."""
    from fa_variants.commands.warmup import _check_names

    with pytest.raises(ValueError, match=f"--arch {arch}: not a compile target.*{hint}"):
        _check_names(arch, None)
    assert arch not in registry.variant("fa2").archs


@pytest.mark.parametrize("cap, served", [((8, 9), True), ((9, 0), True), ((10, 0), False), ((12, 0), False),
                                         ((8, 6), False)])
def test_fp8_pass_is_asked_only_where_it_is_built(monkeypatch, cap, served):
    """The FP8 quantisation pass is built for sm_89 and sm_90a: elsewhere `quant_host.why_not` gives its reason, so
    ``quantize_fp8(impl="auto")`` takes the torch recipe (session 35: on sm_100 / sm_120 it said yes, then the
    compile refused the arch)."""
    from types import SimpleNamespace

    from fa_variants.fp8 import quant_host

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    q = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, shape=(1, 128, 2, 128), device="cuda:0")
    reason = quant_host.why_not(q, quant_host.FP8Config())
    assert (reason is None) == served, reason
    if not served:
        assert reason.startswith("the GPU quantisation pass is built for sm_89, sm_90a, not sm_")


def test_entry_refuses_names_what_its_declaration_does_not_take():
    """registry.Entry.refuses: the one reading of a backend's declared dtypes and head dims, for why_not (a backend
    that declares the call serves it without being imported) and for the wrong-device reason's clause."""
    entry = registry.ENTRIES["fa3"]
    assert entry.refuses("bfloat16", 128) == []
    assert entry.refuses("float32", 80) == ["float16, bfloat16 inputs (not float32)",
                                           "head_dim 64, 96, 128, 256 (not 80)"]
    assert entry.refuses("float16", 80) == ["head_dim 64, 96, 128, 256 (not 80)"]
    assert registry.ENTRIES["reference"].refuses("float32", 80) == []  # declares nothing: the Variant answers
    reason = dispatch.why_not("fa3", None, torch.float32, 80)
    assert reason.endswith("; and it takes float16, bfloat16 inputs (not float32) and head_dim 64, 96, 128, 256 "
                           "(not 80)"), reason
