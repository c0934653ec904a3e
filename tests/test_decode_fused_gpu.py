"""fa3 split-KV with the merge fused into the split kernel (``Sm90Config.fused_merge``: the last CTA of each
query tile merges; per-tile counters left at 0) against the float64 reference, on an sm90 GPU only:

    source .gpu/env.sh && python3 -m pytest -m gpu tests/test_decode_fused_gpu.py

Split counts 1..150 (more splits than K/V tiles: empty splits), odd lengths, Nk = 1, rows that see no key,
causal, packed GQA (host views at seqlen_q = 1, in-kernel rows at seqlen_q > 1), LSE, seqlens_k with lengths 0 and
1 in a batch, CUDA-graph replay (also two graphs and eager calls interleaved), repeated calls (the counters
reset), two streams at once, and equality within rounding with the two-kernel path. Outputs are poisoned with
NaN, and so is each test's first split workspace (``common.workspace`` is cleared per test).
"""
import dataclasses
import math

import pytest
import torch

from fa_variants.bench.decode import capture_graph
from fa_variants.common import workspace
from helpers import assert_attention_ok, make_qkv, padded_kv_cache, sm90_only

pytestmark = sm90_only("fa3 fused split merge")
fa3 = pytest.importorskip("fa_variants.hopper.fa3")


@pytest.fixture(autouse=True)
def poisoned(poisoned_workspace):
    """NaN-filled allocations and a fresh split scratch for every test (conftest.poisoned_workspace)."""


@pytest.fixture
def fused(monkeypatch):
    """`auto` splits, packs, and merges in the split kernel."""
    monkeypatch.setattr(fa3, "SPLIT_KV_ENABLED", True)
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    monkeypatch.setattr(fa3, "FUSED_MERGE", "all")


def _qkv(b, nq, nk, h, hkv, d):
    return make_qkv(b, nq, nk, h, hkv, d, dtype=torch.bfloat16, device="cuda")


def _config(d: int, num_splits: int, packed: bool, **fields) -> "fa3.Sm90Config":
    base = fa3._PACKED_CONFIGS[d] if packed else fa3.DEFAULT_CONFIGS[d]
    return dataclasses.replace(base, num_splits=num_splits, fused_merge=True, **fields)


@pytest.fixture
def splits(monkeypatch):
    """A function: the split count of every call of a num_splits=0 config pinned to n (the heuristic's helper
    swapped), so that one compiled kernel serves every count (a config's num_splits is part of its compile key)."""
    def pin(n: int):
        monkeypatch.setattr(fa3, "_auto_splits", lambda ctas, n_blocks, index, min_tiles=None, per_sm=1: n)
    return pin


def _check(out, lse, q, k, v, causal, scale, what):
    assert_attention_ok(out, lse, q, k, v, causal, scale, what=str(what))


def _counters_are_zero():
    slots = list(workspace._slots().values())
    assert all(s.counters is None or not s.counters.any() for s in slots)


# (batch, seqlen_k, heads, heads_kv, head_dim) at seqlen_q = 1, packed
PACKED = [(1, 4096, 32, 8, 128), (3, 1023, 64, 8, 64), (2, 1, 32, 8, 128), (1, 5, 9, 3, 96), (2, 4224, 6, 1, 64),
          (1, 300, 128, 1, 64), (2, 113, 8, 2, 256)]


@pytest.mark.parametrize("num_splits", [1, 2, 3, 16, 64, 150, 0], ids=lambda n: f"splits{n or 'auto'}")
@pytest.mark.parametrize("shape", PACKED, ids=lambda s: "x".join(map(str, s)))
def test_fused_packed_decode_matches_reference(shape, num_splits, splits):
    """Splits 1 (every CTA arrives last) to 150 (more splits than K/V tiles: empty splits), 0: the heuristic's.
    Causal (at seqlen_q = 1 it hides no key: the packed kernel is the unmasked one; `full` runs in the seqlens_k
    test)."""
    b, nk, h, hkv, d = shape
    q, k, v = _qkv(b, 1, nk, h, hkv, d)
    if num_splits:
        splits(num_splits)
    out, lse = fa3.run(q, k, v, causal=True, softmax_scale=d ** -0.5, config=_config(d, 0, True))
    _check(out, lse, q, k, v, True, d ** -0.5, shape)
    torch.cuda.synchronize()
    _counters_are_zero()


# (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim), unpacked; seqlen_q > seqlen_k: causal rows see no key
UNPACKED = [(1, 1, 4096, 16, 8, 128), (3, 4, 1023, 32, 8, 128), (2, 113, 127, 8, 2, 256), (1, 17, 1, 13, 1, 64),
            (1, 300, 77, 2, 2, 128), (2, 3, 4224, 4, 4, 96)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("num_splits", [2, 7, 32, 0], ids=lambda n: f"splits{n or 'auto'}")
@pytest.mark.parametrize("shape", UNPACKED, ids=lambda s: "x".join(map(str, s)))
def test_fused_split_matches_reference(shape, num_splits, causal, splits):
    b, nq, nk, h, hkv, d = shape
    q, k, v = _qkv(b, nq, nk, h, hkv, d)
    if num_splits:
        splits(num_splits)
    out, lse = fa3.run(q, k, v, causal=causal, softmax_scale=0.1, config=_config(d, 0, False))
    _check(out, lse, q, k, v, causal, 0.1, shape)
    if causal and nq > nk:  # rows left of the first key: O = 0, LSE = -inf
        assert (out[:, :nq - nk] == 0).all() and (lse[:, :, :nq - nk] == -math.inf).all()


@pytest.mark.parametrize("shape", [(1, 4, 4096, 32, 8, 128), (2, 16, 1023, 64, 8, 64), (3, 7, 300, 8, 2, 96)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("num_splits", [3, 0], ids=lambda n: f"splits{n or 'auto'}")
def test_fused_packed_rows_match_reference(shape, num_splits, splits):
    """seqlen_q > 1 packed in the kernel (pack_group), causal per row's own position."""
    b, nq, nk, h, hkv, d = shape
    q, k, v = _qkv(b, nq, nk, h, hkv, d)
    if num_splits:
        splits(num_splits)
    config = _config(d, 0, True, pack_group=h // hkv)
    out, lse = fa3.run(q, k, v, causal=True, softmax_scale=0.1, config=config)
    _check(out, lse, q, k, v, True, 0.1, shape)


def test_split_count_of_one_from_the_heuristic():
    """A fused kernel whose heuristic gives this shape one split (num_splits=0, a batch that fills the GPU): every
    CTA arrives last and writes its own tile."""
    q, k, v = _qkv(64, 1, 1024, 32, 8, 128)
    config = _config(128, 0, True)
    assert fa3.num_splits_for(config, q, k, True) == 1
    out, lse = fa3.run(q, k, v, causal=True, softmax_scale=0.1, config=config)
    _check(out, lse, q, k, v, True, 0.1, "one split")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("nq", [1, 4])
def test_seqlens_k_with_lengths_0_and_1(nq, causal, fused):
    """The public API with per-sequence lengths 0, 1, odd and full; padding holds NaN and is never read."""
    import fa_variants

    q, k, v, seqlens_k = padded_kv_cache([0, 1, 113, 1023, 1, 500], nq, 1023, 32, 8, 128, device="cuda")
    out, lse = fa_variants.attention(q, k, v, causal=causal, backend="fa3", return_lse=True, seqlens_k=seqlens_k)
    assert_attention_ok(out, lse, q, k, v, causal, seqlens_k=seqlens_k)


def test_auto_uses_the_fused_kernel(fused):
    import fa_variants

    q, k, v = _qkv(1, 1, 4096, 32, 8, 128)
    cfg = fa3._problem_config(None, q, k, True)
    assert cfg.fused_merge and cfg.num_splits == 0 and fa3.auto_num_splits(q, k, True) > 1
    out, lse = fa_variants.attention(q, k, v, causal=True, return_lse=True)
    _check(out, lse, q, k, v, True, 128 ** -0.5, "auto")


def test_repeated_calls_reset_the_counters(fused):
    """Back-to-back calls of several shapes on one stream (shared workspace and counters), fresh Q each time:
    each result is this call's, and the counters are 0 afterwards."""
    import fa_variants

    shapes = [(1, 4096, 32, 8, 128), (2, 1023, 64, 8, 64), (1, 32768, 32, 8, 128), (1, 4096, 32, 8, 128)]
    tensors = [_qkv(b, 1, nk, h, hkv, d) for b, nk, h, hkv, d in shapes]
    for _ in range(3):
        outs = []
        for q, k, v in tensors:
            q.copy_(torch.randn_like(q))
            outs.append((q.clone(), fa_variants.attention(q, k, v, causal=True, return_lse=True)))
        for (q, k, v), (q_then, (out, lse)) in zip(tensors, outs):
            _check(out, lse, q_then, k, v, True, q.shape[-1] ** -0.5, tuple(q.shape))
    torch.cuda.synchronize()
    _counters_are_zero()


def test_fused_equals_two_kernels_within_rounding(splits):
    """The same partials merged in the split kernel and by the merge kernel: the same maths in the same split
    order (exp2 / lg2 of the same arguments), so they agree to the last bits; not asserted bitwise: within one bf16
    unit of O (2^-7 relative) and float32 rounding of the LSE."""
    q, k, v = _qkv(3, 1, 4224, 64, 8, 128)
    splits(16)
    fused_out, fused_lse = fa3.run(q, k, v, causal=True, softmax_scale=0.1, config=_config(128, 0, True))
    two = dataclasses.replace(_config(128, 0, True), fused_merge=False)
    out, lse = fa3.run(q, k, v, causal=True, softmax_scale=0.1, config=two)
    torch.testing.assert_close(fused_out.float(), out.float(), rtol=2**-7, atol=1e-5)
    torch.testing.assert_close(fused_lse, lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_cuda_graph_replay(pdl):
    """Decode steps captured (back to back, so each step's counters must be clean for the next), replayed after
    new inputs, with a second graph and eager calls of the same shape in between: each result is the new one."""
    q, k, v = _qkv(2, 1, 8192, 32, 8, 128)
    config = _config(128, 0, True, pdl=pdl)
    run = lambda: fa3.run(q, k, v, causal=True, softmax_scale=0.088, config=config)  # noqa: E731
    run()  # compile and plan outside capture (the counter arena is zeroed here)
    graph, outs = capture_graph(run, 3)
    graph2, outs2 = capture_graph(run, 2)
    # one counter slice per capture (the calls of one capture share it, in order), none shared between captures
    assert len(workspace._CAPTURED) == 2, workspace._CAPTURED.keys()
    slices = [t.data_ptr() for t in workspace._CAPTURED.values()]
    assert slices[0] != slices[1]
    for _ in range(3):
        q.copy_(torch.randn_like(q))
        graph.replay()
        eager, eager_lse = run()
        graph2.replay()
        torch.cuda.synchronize()
        for out, lse in outs + outs2 + [(eager, eager_lse)]:
            _check(out, lse, q, k, v, True, 0.088, "graph")


def test_two_streams_at_once():
    """Calls on two streams run concurrently, each with its own workspace and counters."""
    shapes = [(1, 1, 32768, 32, 8, 128), (1, 1, 16384, 32, 8, 128)]
    inputs = [_qkv(*s) for s in shapes]
    config = _config(128, 0, True)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    results = [[], []]
    for _ in range(4):
        for i, (s, (q, k, v)) in enumerate(zip(streams, inputs)):
            with torch.cuda.stream(s):
                results[i].append(fa3.run(q, k, v, causal=True, softmax_scale=0.088, config=config))
    torch.cuda.synchronize()
    for (q, k, v), outs in zip(inputs, results):
        for out, lse in outs:
            _check(out, lse, q, k, v, True, 0.088, "two streams")
    assert len(workspace._slots()) >= 2
    _counters_are_zero()
