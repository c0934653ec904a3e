"""Shared pytest set-up: markers that skip with a visible reason where the hardware or DSL is missing, a fresh
seed for every test (printed when it fails), NaN-poisoned allocations for the kernel tests, and the compile
command as a fixture."""
import atexit
import importlib.util
import json
import os
import random
import shutil
import tempfile

import pytest
import torch

# The package's switches (README.md, "Environment switches") as the caller's shell set them are dropped: the suite
# tests the defaults, and each test that needs a switch sets it itself (monkeypatch, subprocess_env). An exported
# FA_VARIANTS_BACKEND=reference made a test of "auto"'s refusal pass through the reference instead. Kept: the test
# suite's own variables and the free-form paths (common.switches.OUTSIDE, FREE_FORM: the fixture's, the cache's).
# Dropped before `import helpers`, which imports the package's modules that read or check the switches (common.
# switches imports only common.env). The dropped names print in the header.
from fa_variants.common import switches as _switches

KEPT_SWITCHES = {*_switches.OUTSIDE, *_switches.FREE_FORM}
DROPPED_SWITCHES = sorted(n for n in os.environ if n.startswith(_switches.PREFIX) and n not in KEPT_SWITCHES)
for _name in DROPPED_SWITCHES:
    del os.environ[_name]


import helpers  # noqa: E402 (after the switches are dropped: it imports the package)


# Each test session compiles into its own empty disk cache (fa_variants.common.diskcache), so that tests see
# the compiles they expect whatever an earlier run or the user's ~/.cache holds; removed at exit.
_SESSION_CACHE = tempfile.mkdtemp(prefix="fa_variants_test_cache_")
os.environ["FA_VARIANTS_CACHE_DIR"] = _SESSION_CACHE
os.environ.pop("FA_VARIANTS_DISK_CACHE", None)
atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)


# The tests' terminal and git, whatever the caller's environment exports. rich lays the CLI's tables out for an
# 80-column terminal without colour codes (a CI workflow's FORCE_COLOR / TTY_COMPATIBLE put escape codes into the
# widths test_cli measures, and an exported COLUMNS moved them). git trusts the checkout when another user owns it
# (git >= 2.35.2 refuses it, "dubious ownership": a container running as root over a mounted workspace), through
# git's environment config (GIT_CONFIG_COUNT, git >= 2.31), for the git commands the tests and scripts/steps.sh run.
for _name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE"):
    os.environ.pop(_name, None)
os.environ["COLUMNS"] = "80"
_git_configs = int(os.environ.get("GIT_CONFIG_COUNT", "0") or 0)
os.environ.update({"GIT_CONFIG_COUNT": str(_git_configs + 1), f"GIT_CONFIG_KEY_{_git_configs}": "safe.directory",
                   f"GIT_CONFIG_VALUE_{_git_configs}": "*"})


def _has_dsl() -> bool:
    return importlib.util.find_spec("cutlass") is not None


def _cpp_compiler_missing() -> str | None:
    """Why torch.compile's default backend (inductor) cannot build CPU code here, or None: it compiles C++ with the
    compiler torch finds (g++ unless torch._inductor.config.cpp.cxx / CXX say otherwise); a slim image has none."""
    try:
        from torch._inductor import cpp_builder
        cpp_builder.get_cpp_compiler()
    except (ImportError, AttributeError):  # another torch's layout: let the tests say
        return None
    except Exception as exc:  # InvalidCxxCompiler
        return str(exc).splitlines()[0]
    return None


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on the GPU host (scripts/gpu_check.sh)")
    no_dsl = pytest.mark.skip(reason="needs the CuTe DSL (pip install nvidia-cutlass-dsl)")
    no_cpp = None
    if any("inductor" in item.keywords for item in items) and (why := _cpp_compiler_missing()):
        no_cpp = pytest.mark.skip(reason=f"torch.compile's inductor needs a C++ compiler on the CPU: {why}")
    for item in items:
        if no_cpp is not None and "inductor" in item.keywords:
            item.add_marker(no_cpp)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if ("compile" in item.keywords or "gpu" in item.keywords) and not _has_dsl():
            item.add_marker(no_dsl)


@pytest.fixture(autouse=True)
def rng_seed(request) -> int:
    """This test's seed: fresh in every run (``helpers.fresh_seed``), or ``FA_VARIANTS_TEST_SEED``'s value to replay
    a failure. torch's global generators (CPU and every CUDA device) and ``random`` are seeded with it before the
    test, so no test draws the same inputs in every run and none depends on what ran before it; a test that builds
    its own ``torch.Generator`` seeds it with this value (or ``helpers.seeded_generator``). A failing test's report
    prints it (``pytest_runtest_makereport``)."""
    value = helpers.fresh_seed()
    helpers._test_seed = value
    request.node.user_properties.append(("seed", value))
    torch.manual_seed(value)
    random.seed(value)
    yield value
    helpers._test_seed = None


@pytest.fixture(autouse=True)
def release_gpu_cache():
    """After each test in a pytest-xdist worker, the CUDA memory its caching allocator holds unused goes back to the
    driver when the worker holds more than its share of the card (``helpers.release_cached_gpu_memory``): the workers
    share one GPU, and a worker keeping a big test's blocks cached starved another's float64 reference (session 37,
    H100, 8 workers: one worker held 20 GiB, another failed to get 512 MiB)."""
    yield
    helpers.release_cached_gpu_memory()


#: set (to anything) where the [sass] extra cannot be installed (the GPU host's carried packages stop at 64 MiB,
#: session 48): a test that needs nvdisasm and finds none new enough is SKIPPED with this reason instead of failing.
#: Unset (CI, a dev install), a missing nvdisasm fails those tests.
NO_SASS_ENV = "FA_VARIANTS_TESTS_WITHOUT_SASS"
_NO_SASS = "--sass needs nvdisasm"  # fa_variants.common.cubin's error when the DSL finds none it can use
_NO_SASS_REASON = f"no usable nvdisasm here ({NO_SASS_ENV} set): the SASS checks run in CI"


def _sass_missing_here(text: str) -> bool:
    """``text`` (an error, a command's output) is cubin's missing-nvdisasm error, and this run opted out of SASS."""
    return bool(os.environ.get(NO_SASS_ENV)) and _NO_SASS in text


def _skip_without_sass(text: str) -> None:
    if _sass_missing_here(text):
        pytest.skip(_NO_SASS_REASON)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if (report.failed and call.excinfo is not None and call.excinfo.errisinstance(ImportError)
            and _sass_missing_here(str(call.excinfo.value))):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"Skipped: {_NO_SASS_REASON}")
    seeds = [value for key, value in item.user_properties if key == "seed"]
    if report.failed and seeds:
        report.sections.append(("seed", f"{helpers.SEED_ENV}={seeds[-1]} draws this test's inputs again "
                                        f"({helpers.SESSION_SEED_ENV}={helpers.SESSION_SEED}: its module fixtures')"))


def pytest_report_header(config):
    lines = [f"fa_variants tests: a fresh seed per test, printed when it fails; session seed "
             f"{helpers.SESSION_SEED_ENV}={helpers.SESSION_SEED} (module fixtures; each xdist worker has its own)"]
    if DROPPED_SWITCHES:
        lines.append(f"fa_variants tests: ignored from the environment (the suite tests the defaults): "
                     f"{', '.join(DROPPED_SWITCHES)}")
    return lines


@pytest.fixture
def nan_allocations():
    """A context manager (``helpers.nan_filled_allocations``): inside it every torch.empty / empty_like /
    Tensor.new_empty of a floating dtype comes back filled with NaN, so an output element a kernel never writes
    fails the test."""
    return helpers.nan_filled_allocations


@pytest.fixture
def poisoned_workspace(nan_allocations):
    """Every allocation inside the test NaN-filled (``nan_allocations``), the split scratch cache
    (``common.workspace``) emptied before and after, so the test's first scratch is a fresh, poisoned allocation
    and an element a split or merge never writes fails the test."""
    from fa_variants.common import workspace

    workspace.clear()
    with nan_allocations():
        yield
    workspace.clear()


@pytest.fixture
def compile_cli(capsys):
    """Run `fa-variants compile ARGV...` in this process; returns its report (the LAST line printed is one
    JSON object, the command's contract) after checking the exit status."""
    from fa_variants import cli

    def run(*argv) -> dict:
        rc = cli.main(["compile", *argv])
        captured = capsys.readouterr()
        out = captured.out.strip().splitlines()
        if rc != 0:
            _skip_without_sass(captured.err + captured.out)
        assert rc == 0, out
        return json.loads(out[-1])
    return run


@pytest.fixture(scope="module")
def fp8_kernel():
    """The fa3-fp8 kernel module (fa_variants.hopper.fa3_fp8), or a visible skip unless it runs on this GPU (no
    GPU, no FP8 WGMMA, not built)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from fa_variants.fp8 import attention as fp8_attention

    problem = fp8_attention.why_not(torch.device("cuda"))
    if problem:
        pytest.skip(problem)
    from fa_variants.hopper import fa3_fp8

    return fa3_fp8


@pytest.fixture
def gpu_variant():
    """A function: backend name -> its Variant record on this GPU, or a skip saying why it cannot run here
    (another arch, not built, failed import)."""
    def get(name: str):
        from fa_variants import dispatch

        capability = dispatch.device_capability(torch.device("cuda"))
        if name not in dispatch.backends_for(capability):
            pytest.skip(f"{name} does not target {dispatch.arch_name(capability)}")
        loaded = dispatch.load(name)
        if isinstance(loaded, str):
            pytest.skip(loaded)
        return loaded
    return get


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend the CPU is an sm_90 whose fa3 is a fake kernel recording its calls (it runs the reference), for
    float16 / bfloat16 and head dims 16, 64, 128; the other kernel backends absent. Yields the list of calls."""
    import sys
    import types

    from fa_variants import dispatch, reference, registry
    from fa_variants.common.launch import Variant

    F16, BF16 = torch.float16, torch.bfloat16
    calls = []

    def run(q, k, v, *, causal, softmax_scale):  # as a kernel: no graph or tangent through it, fresh outputs
        calls.append(dict(q=q, k=k, v=v, causal=causal, softmax_scale=softmax_scale))
        out, lse = reference.run(q.detach(), k.detach(), v.detach(), causal=causal, softmax_scale=softmax_scale)
        return out.clone(), lse.clone()

    module = types.ModuleType("_fake_kernels.recording")
    module.VARIANT = Variant("fa3", archs=("sm_90a",), dtypes=(F16, BF16), head_dims=(16, 64, 128), runner=run)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(registry.ENTRIES, "fa3", registry.Entry(module.__name__, "fake"))
    for name in ("fa3-fp8", "fa2", "fa1"):
        monkeypatch.setitem(registry.ENTRIES, name, registry.Entry(f"fa_variants._absent.{name}", "x"))
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    dispatch.clear_cache()
    yield calls
    dispatch.clear_cache()


@pytest.fixture
def fused_on_cpu(monkeypatch, fake_gpu):
    """The fused backwards (``integrations.backward``, FA_VARIANTS_BACKWARD=cudnn / sdpa / flash) let onto the CPU
    for the fake sm_90 (`fake_gpu`), ``helpers.flash_backward_stand_in`` in the FlashAttention-2 backward kernel's
    place and ``helpers.flash_forward_stand_in`` in its differentiable forward op's (CUDA only;
    tests/test_backward_cudnn.py stands cuDNN's in too). Yields the list of the stand-in's calls
    (the arguments it got)."""
    from fa_variants.integrations import backward
    from helpers import flash_backward_stand_in, flash_forward_stand_in

    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        return flash_backward_stand_in(*args, **kwargs)

    monkeypatch.setattr(backward, "FUSED_DEVICES", ("cpu",))
    monkeypatch.setattr(backward, "FLASH_BACKWARD_OP", record)
    monkeypatch.setattr(backward, "FLASH_FORWARD_OP", flash_forward_stand_in)  # the sdpa mode's, autograd through it
    # PyTorch's own cuDNN gate (`CUDNN_WIDE`'s last check) asks CUDA about CUDA tensors: on the fake sm_90 it answers
    # as the H100's PyTorch 2.11 / cuDNN 9.19 did for the head dims that reach it (yes, up to 256)
    monkeypatch.setattr(backward, "_pytorch_takes_cudnn", lambda q, k, v, causal: True)
    return calls
