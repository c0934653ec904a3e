"""The shared correctness matrix (issue 3) for every kernel backend, on the GPU.

fp16 and bf16; head dims 64, 96, 128, 256; (seqlen_q, seqlen_k) from (1, 1) to (4224, 4224) including
lengths that are no multiple of any tile and seqlen_q > seqlen_k (causal rows that see no key); causal and
not; MHA 6:6, GQA 6:2 and MQA 6:1. Every output must be NaN-free and pass the tolerance rule against the
float64 reference (output and LSE). Outputs are poisoned: while the kernel runs, every ``torch.empty``,
``torch.empty_like`` and ``Tensor.new_empty`` returns a NaN-filled tensor, and the CUDA caching allocator's
free blocks of the output's size are filled with NaN, so a row the kernel forgets to write shows up.

A backend that is not built yet, or that does not target this GPU, skips with the reason; so does a head dim
the backend does not list in HEAD_DIMS. Inputs are fresh random numbers each session; one input and its
references (computed on the GPU) serve every backend, which is why ``backend`` varies fastest.
Run on the GPU host: ``python -m pytest -q tests/test_kernels_gpu.py`` (about a minute on an H200, plus
one compile per backend, dtype, head dim and causal flag).
"""
from __future__ import annotations

import functools
import math

import pytest
import torch

import fa_variants
from fa_variants import dispatch
from fa_variants.reference import references
from helpers import assert_attention_ok, make_qkv

pytestmark = pytest.mark.gpu

KERNELS = ("fa2", "fa1", "fa3")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
HEAD_DIMS = (64, 96, 128, 256)
SEQLENS = ((1, 1), (3, 3), (64, 128), (113, 203), (127, 1023), (1023, 1024), (300, 128), (4224, 4224))
HEADS = {"MHA": (6, 6), "GQA6:2": (6, 2), "MQA6:1": (6, 1)}


@functools.lru_cache(maxsize=4)
def matrix_case(dtype: str, head_dim: int, seqlens: tuple[int, int], causal: bool, heads: str):
    """(q, k, v, references) of one cell of the matrix, on the GPU (cached: every backend checks it)."""
    seqlen_q, seqlen_k = seqlens
    num_heads, num_heads_kv = HEADS[heads]
    batch = 1 if max(seqlens) >= 1023 else 2
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim, dtype=DTYPES[dtype],
                       device="cuda")
    return q, k, v, references(q, k, v, causal=causal)



def run_poisoned(poisoned, q, k, v, **kwargs):
    """attention(q, k, v, **kwargs) with every fresh allocation NaN-filled while it runs."""
    batch, seqlen_q, heads, _ = q.shape
    for numel, dtype in ((q.numel(), q.dtype), (batch * heads * seqlen_q, torch.float32)):
        torch.full((numel,), math.nan, dtype=dtype, device=q.device)  # freed at once: a NaN cached block
    with poisoned():
        out, lse = fa_variants.attention(q, k, v, return_lse=True, **kwargs)
        torch.cuda.synchronize()
    return out, lse


# backend is the top decorator so that it varies fastest and consecutive tests share one cached input
@pytest.mark.parametrize("backend", KERNELS)
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("seqlens", SEQLENS, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_matrix(nan_allocations, gpu_variant, dtype, head_dim, seqlens, causal, heads, backend):
    module = gpu_variant(backend)
    if DTYPES[dtype] not in module.dtypes:
        pytest.skip(f"{backend} does not list {dtype} in its dtypes")
    if head_dim not in module.head_dims:
        pytest.skip(f"{backend} does not list head_dim {head_dim} in its head_dims {module.head_dims}")
    q, k, v, refs = matrix_case(dtype, head_dim, seqlens, causal, heads)
    out, lse = run_poisoned(nan_allocations, q, k, v, causal=causal, backend=backend)
    assert_attention_ok(out, lse, q, k, v, causal, refs=refs, what=backend)


def test_auto_picks_a_kernel_on_this_gpu():
    """On an sm80/86/89/90 GPU with a kernel built, auto must not choose the reference path."""
    capability = dispatch.device_capability(torch.device("cuda"))
    built = [n for n in dispatch.backends_for(capability) if n != "reference"
             and not isinstance(dispatch.load(n), str)]
    if not built:
        pytest.skip(f"no kernel backend built for {dispatch.arch_name(capability)}")
    q = torch.randn(1, 128, 4, 128, device="cuda", dtype=torch.bfloat16)
    selection = fa_variants.select_backend(q, q, q, causal=True)
    assert selection.backend in built, selection
    assert selection.candidates[0] == selection.backend
