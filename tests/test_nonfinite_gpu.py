"""What the kernels do with V = inf / NaN at a key that a causal row cannot see (documented in
``fa_variants.attention``): rows that see the key are non-finite (the maths); a row that does not see it is
either exact or NaN (a masked P = 0 meets V = inf inside a tile: 0 * inf), never a finite wrong value. The
reference backend is exact there (tests/test_reference.py; here on the GPU too).

Run on the GPU host: ``python -m pytest -q tests/test_nonfinite_gpu.py``.
"""
from __future__ import annotations

import math

import pytest
import torch

import fa_variants
from fa_variants.reference import ATOL, max_abs_error, references

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("bad", [math.inf, math.nan])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("backend", ["fa1", "fa2", "fa3", "reference"])
def test_hidden_non_finite_v(gpu_variant, backend, head_dim, bad):
    gpu_variant(backend)
    q, k, v = (torch.randn(1, 256, 2, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    key = 200
    v[0, key] = bad
    with torch.no_grad():
        out = fa_variants.attention(q, k, v, causal=True, backend=backend)
    clean_v = v.clone()
    clean_v[0, key] = 0
    refs = references(q, k, clean_v, causal=True)
    finite_rows = torch.isfinite(out).all(-1)  # (1, 256, heads)
    assert not finite_rows[0, key:].any(), "rows that see the key must be non-finite"
    hidden = out[0, :key]
    nan_rows = torch.isnan(hidden).all(-1)
    assert (finite_rows[0, :key] | nan_rows).all(), "a hidden row is partly non-finite or inf"
    rows = finite_rows[0, :key].all(-1).nonzero().flatten()
    if backend == "reference":
        assert len(rows) == key  # exact: masked keys contribute 0
    # the finite hidden rows must pass the project's rule on those rows (V's hidden key zeroed changes none)
    err = max_abs_error(out[0, rows], refs.out[0, rows]) if len(rows) else 0.0
    err_torch = max_abs_error(refs.out_torch[0, rows], refs.out[0, rows]) if len(rows) else 0.0
    assert err <= 2 * err_torch + ATOL, (err, err_torch)
    print(f"{backend} d{head_dim} V={bad}: {key - len(rows)} of {key} hidden rows NaN")


@pytest.mark.parametrize("bad", [math.inf, math.nan])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("backend", ["fa1", "fa2", "fa3"])
def test_rows_far_from_a_non_finite_v_are_right(gpu_variant, backend, head_dim, bad):
    """The other test passes when every hidden row is NaN (allowed inside a tile that holds the key). Here the bad
    key is the last of 1024: with tiles of at most 256 query rows and 256 keys, no query tile that holds a row
    below 512 loads the key's tile, so those rows must be finite and pass the rule."""
    gpu_variant(backend)
    q, k, v = (torch.randn(1, 1024, 2, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    v[0, -1] = bad
    with torch.no_grad():
        out = fa_variants.attention(q, k, v, causal=True, backend=backend)
    refs = references(q[:, :512], k[:, :512], v[:, :512], causal=True)  # rows < 512 see keys < 512 only
    assert torch.isfinite(out[:, :512]).all()
    err = max_abs_error(out[:, :512], refs.out)
    assert err <= 2 * max_abs_error(refs.out_torch, refs.out) + ATOL
