"""Shared pytest set-up: markers that skip with a visible reason where the hardware or DSL is missing."""
import importlib.util

import pytest
import torch


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
