"""fa3's persistent grid with its tiles taken from a counter (Sm90Config.dynamic_schedule, session 18): the config's
rules and the host side (the launcher passes two zeroed int32 counters after the CTA count, fetched per call from
common.workspace). The kernel's SASS is checked in tests/test_fa3_compile.py, its results on the GPU in
tests/test_fa3_gpu.py (the persistent variants' matrix, L2 sections, counters left at 0, CUDA graph replay)."""
import dataclasses

import pytest
import torch

from fa_variants.hopper import fa3


def test_dynamic_schedule_needs_the_persistent_grid():
    base = fa3.DEFAULT_CONFIGS[128]
    for bad in (dict(dynamic_schedule=True), dict(dynamic_schedule=True, persistent=True, pack_gqa=True),
                dict(dynamic_schedule=True, persistent=True, balanced=True), dict(dynamic_schedule=1, persistent=True)):
        with pytest.raises(ValueError, match="^dynamic_schedule="):
            dataclasses.replace(base, **bad).check(128)
    dataclasses.replace(base, dynamic_schedule=True, persistent=True).check(128)


def test_plan_call_appends_the_counters(monkeypatch):
    """The plan of a dynamic_schedule config passes, after the CTA count, two int32 counters that are zero: fetched
    on every call (a CUDA graph capture gets its own; the CPU a fresh pair each time)."""
    monkeypatch.setattr(fa3, "_sm_count", lambda q: 7)
    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[128], persistent=True, dynamic_schedule=True)
    q = torch.randn(2, 300, 4, 128, dtype=torch.float16)
    k = v = torch.randn(2, 300, 2, 128, dtype=torch.float16)
    prepare, finish = fa3._plan_call(config, q, k, v, 0.1, True)
    first, second = prepare(q, k, v, None, None), prepare(q, k, v, None, None)
    assert finish is None and len(first) == 9 and first[7] == 7 and first[:5] == (q, k, v, None, None)
    for args in (first, second):
        assert args[8].dtype == torch.int32 and args[8].tolist() == [0, 0]
    assert first[8] is not second[8]  # CPU: fresh per call
