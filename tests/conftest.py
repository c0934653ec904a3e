"""Shared pytest set-up: markers that skip with a visible reason where the hardware or DSL is missing, and
NaN-poisoned allocations for the kernel tests, and the compile command as a fixture."""
import atexit
import contextlib
import functools
import importlib.util
import json
import math
import os
import shutil
import tempfile

import pytest
import torch


# Each test session compiles into its own empty disk cache (fa_variants.common.diskcache), so that tests see
# the compiles they expect whatever an earlier run or the user's ~/.cache holds; removed at exit.
_SESSION_CACHE = tempfile.mkdtemp(prefix="fa_variants_test_cache_")
os.environ["FA_VARIANTS_CACHE_DIR"] = _SESSION_CACHE
os.environ.pop("FA_VARIANTS_DISK_CACHE", None)
atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)


def _has_dsl() -> bool:
    return importlib.util.find_spec("cutlass") is not None


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on the GPU host (scripts/gpu_check.sh)")
    no_dsl = pytest.mark.skip(reason="needs the CuTe DSL (pip install nvidia-cutlass-dsl)")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if ("compile" in item.keywords or "gpu" in item.keywords) and not _has_dsl():
            item.add_marker(no_dsl)


def _nan_filled(allocate):
    @functools.wraps(allocate)
    def wrapper(*args, **kwargs):
        t = allocate(*args, **kwargs)
        if t.is_floating_point():
            # no_grad: a leaf made with requires_grad=True (torch's own, e.g. inductor's pattern set-up inside a
            # compiled test) accepts the fill and stays a leaf that requires grad
            with torch.no_grad():
                t.fill_(math.nan)
        return t
    return wrapper


@pytest.fixture
def nan_allocations(monkeypatch):
    """A context manager: inside it every torch.empty / empty_like / Tensor.new_empty of a floating dtype
    comes back filled with NaN, so an output element a kernel never writes fails the test."""
    @contextlib.contextmanager
    def poisoned():
        with monkeypatch.context() as patch:
            for owner, name in ((torch, "empty"), (torch, "empty_like"), (torch.Tensor, "new_empty")):
                patch.setattr(owner, name, _nan_filled(getattr(owner, name)))
            yield
    return poisoned


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
        out = capsys.readouterr().out.strip().splitlines()
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
