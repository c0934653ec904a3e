"""README.md's Usage snippet runs on the CPU as its first comment says: device "cpu", a smaller seqlen, and the
lines marked "GPU only" left out (each of those raises BackendUnavailableError without its GPU)."""
import re
from pathlib import Path

import pytest
import torch

import fa_variants

ROOT = Path(__file__).resolve().parents[1]


def _usage_block():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    usage = text[text.index("## Usage"):]
    return re.search(r"```python\n(.*?)```", usage, re.S).group(1)


def test_usage_snippet_runs_on_cpu_without_gpu_only_lines():
    lines = [line for line in _usage_block().splitlines() if "#" not in line or "GPU only" not in line.split("#", 1)[1]]
    code = "\n".join(lines).replace('device="cuda"', 'device="cpu"').replace("4096", "64")
    exec(compile(code, "README.md:Usage", "exec"), {})


def test_usage_gpu_only_lines_do_raise_on_cpu():
    """The marked lines are the ones that need a GPU (a mark on a line that runs on the CPU would mislead)."""
    q = torch.randn(1, 8, 2, 64)
    k = v = torch.randn(1, 8, 2, 64)
    marked = [line for line in _usage_block().splitlines() if "#" in line and "GPU only" in line.split("#", 1)[1]]
    assert len(marked) >= 3, marked
    for backend in ("fa2", "fa3-fp8"):
        with pytest.raises(fa_variants.BackendUnavailableError):
            fa_variants.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), backend=backend)
