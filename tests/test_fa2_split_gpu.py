"""fa2's split-KV (Flash-Decoding) on the GPU, against float64 (``reference.check_against_reference``, output and
LSE): split counts 1..N, odd lengths, empty and fully masked splits, causal bottom-right, GQA, every head dim,
`auto`'s choice, ``attention(num_splits=)``, packed GQA at seqlen_q = 1, ``seqlens_k`` with lengths 0 and 1,
CUDA-graph replay, two streams at once, the split scratch shared with fa3, batch invariance at a fixed count. Outputs
and the fp32 partials are poisoned with NaN (``nan_allocations``, here emptying the cached split scratch of
``common.workspace`` first, so that each checked call's partials are a fresh poisoned allocation): a partial the
kernel never writes, or an empty split the merge reads, fails.
Run on the GPU host: ``python -m pytest -q tests/test_fa2_split_gpu.py``.
"""
from __future__ import annotations

import contextlib
import math

import pytest
import torch

from helpers import assert_attention_ok, make_qkv, padded_kv_cache

pytestmark = pytest.mark.gpu

fa2 = pytest.importorskip("fa_variants.ampere.fa2")


@pytest.fixture(autouse=True)
def split_enabled(monkeypatch):
    monkeypatch.setattr(fa2, "SPLIT_KV_ENABLED", True)


@pytest.fixture
def nan_allocations(nan_allocations):
    """conftest's NaN-filled allocations, with the split scratch (``common.workspace``, cached per stream) emptied
    on entry and exit: the partials of the calls inside are allocated there, poisoned."""
    from fa_variants.common import workspace

    @contextlib.contextmanager
    def poisoned():
        workspace.clear()
        with nan_allocations():
            yield
        workspace.clear()
    return poisoned


def arch() -> str:
    from fa_variants.common import interop

    return interop.device_arch(torch.cuda.current_device())


def split_config(head_dim: int, num_splits: int):
    """fa2's split kernel at this GPU's arch with a fixed count (0: chosen per call; 1: the unsplit kernel)."""
    return fa2.split_config(arch(), head_dim, num_splits)


def qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype=torch.bfloat16):
    return make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype=dtype, device="cuda")


def run_checked(q, k, v, causal, config, nan_allocations, what="", refs=None):
    """(out, lse, refs) of fa2 with `config`, checked against float64 (``refs``: the references of an earlier
    check of the same inputs)."""
    scale = q.shape[-1] ** -0.5
    with nan_allocations():
        out, lse = fa2.run(q, k, v, causal=causal, softmax_scale=scale, config=config)
    torch.cuda.synchronize()
    refs = assert_attention_ok(out, lse, q, k, v, causal, scale, what=what, refs=refs)
    return out, lse, refs


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 1), (1, 3), (1, 113), (1, 1023), (1, 4224), (3, 1023),
                                                (113, 1023), (4, 3), (113, 113)])
def test_split_counts_match_float64(seqlen_q, seqlen_k, causal, nan_allocations):
    """Every count from 1 to past the tile count: ranges of 0 (empty splits), 1 and many tiles; with causal and
    seqlen_q > seqlen_k, rows that see no key (O = 0, LSE = -inf) and splits fully masked for some rows."""
    q, k, v = qkv(2, seqlen_q, seqlen_k, 8, 2, 128)
    tiles = -(-seqlen_k // split_config(128, 0).tile_n)
    refs = None
    for num_splits in sorted({1, 2, 3, 5, 8, 16, tiles, tiles + 3} - {0}):
        out, lse, refs = run_checked(q, k, v, causal, split_config(128, num_splits), nan_allocations,
                                     what=f"{num_splits} splits", refs=refs)
        if causal and seqlen_q > seqlen_k:
            hidden = seqlen_q - seqlen_k
            assert torch.all(out[:, :hidden] == 0) and torch.all(lse[:, :, :hidden] == -math.inf)


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_head_dims_and_dtypes(head_dim, dtype, nan_allocations):
    q, k, v = qkv(2, 1, 1023, 32, 8, head_dim, dtype)
    for causal in (False, True):
        refs = None
        for num_splits in (0, 3, 7):  # 0: the count chosen per call
            refs = run_checked(q, k, v, causal, split_config(head_dim, num_splits), nan_allocations,
                               what=f"D{head_dim} causal={causal} {num_splits} splits", refs=refs)[2]


@pytest.mark.parametrize("seqlen_k", [1024, 4096, 32768])
def test_auto_splits_decode(seqlen_k, nan_allocations):
    """`auto` (no config): B1 32:8 decode is split by the heuristic, and matches float64."""
    q, k, v = qkv(1, 1, seqlen_k, 32, 8, 128)
    assert fa2.auto_num_splits(q, k, True) > 1
    run_checked(q, k, v, True, None, nan_allocations)
    q, k, v = qkv(64, 1, 1024, 32, 8, 128)  # 2048 CTAs fill the GPU: not split
    assert fa2.auto_num_splits(q, k, True) == 1
    run_checked(q, k, v, True, None, nan_allocations)


def test_switch_off_does_not_split(monkeypatch):
    """FA_VARIANTS_SPLIT_KV=0: `auto` runs the unsplit kernel (packing, on by default, is switched off here so that
    the same unpacked kernel runs on both sides: then the results are bitwise equal)."""
    monkeypatch.setattr(fa2, "SPLIT_KV_ENABLED", False)
    monkeypatch.setattr(fa2, "PACK_GQA_ENABLED", False)
    q, k, v = qkv(1, 1, 4096, 32, 8, 128)
    assert fa2.auto_num_splits(q, k, True) == 1
    a, _ = fa2.run(q, k, v, causal=True, softmax_scale=0.1)
    b, _ = fa2.run(q, k, v, causal=True, softmax_scale=0.1, config=split_config(128, 1))
    assert torch.equal(a, b)


def test_num_splits_option_of_attention(nan_allocations):
    import fa_variants

    q, k, v = qkv(2, 4, 1023, 32, 8, 128)
    for num_splits in (1, 2, 9, 64):
        with nan_allocations():
            out, lse = fa_variants.attention(q, k, v, causal=True, backend="fa2", return_lse=True,
                                             num_splits=num_splits)
        assert_attention_ok(out, lse, q, k, v, True, what=f"num_splits={num_splits}")
    with pytest.raises(ValueError, match="pack_gqa"):  # seqlen_q 4: fa2 packs seqlen_q = 1 only
        fa_variants.attention(q, k, v, backend="fa2", pack_gqa=True)


@pytest.mark.parametrize("heads, heads_kv", [(32, 8), (64, 8), (8, 1), (4, 4)], ids=["32:8", "64:8", "MQA8", "MHA4"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_packed_gqa_decode(heads, heads_kv, head_dim, nan_allocations):
    """Packed GQA at seqlen_q = 1 (the query heads of a KV head as the rows of one tile, host views): unsplit,
    split at a fixed count and at the per-call count, causal and not, lengths 1, 113, 4224."""
    for seqlen_k in (1, 113, 4224):
        q, k, v = qkv(2, 1, seqlen_k, heads, heads_kv, head_dim)
        for causal in (False, True):
            refs = None
            for num_splits in (1, 3, 0):
                config = fa2.split_config(arch(), head_dim, num_splits, pack=True)
                refs = run_checked(q, k, v, causal, config, nan_allocations, refs=refs,
                                   what=f"Nk {seqlen_k} causal={causal} {num_splits} splits packed")[2]


def test_packed_gqa_through_attention(monkeypatch, nan_allocations):
    import fa_variants

    q, k, v = qkv(3, 1, 1023, 32, 8, 128)
    with nan_allocations():
        out, lse = fa_variants.attention(q, k, v, causal=True, backend="fa2", return_lse=True, pack_gqa=True)
    assert_attention_ok(out, lse, q, k, v, True, what="pack_gqa=True")
    monkeypatch.setattr(fa2, "PACK_GQA_ENABLED", True)  # `auto` packs by itself (FA_VARIANTS_FA2_PACK_GQA=1)
    assert fa2._problem_config(None, q, k, True).pack_gqa
    with nan_allocations():
        out, lse = fa_variants.attention(q, k, v, causal=True, backend="fa2", return_lse=True)
    assert_attention_ok(out, lse, q, k, v, True, what="auto packed")


def test_seqlens_k_with_lengths_0_and_1(nan_allocations):
    """seqlens_k (per-sequence KV lengths, lengths 0 and 1 included) through `auto`'s split choice; the cache's
    padding holds NaN."""
    import fa_variants

    lengths = [0, 1, 113, 1023, 4096]
    q, k, v, seqlens_k = padded_kv_cache(lengths, 1, 4096, 32, 8, 128, device="cuda")
    with nan_allocations():
        out, lse = fa_variants.attention(q, k, v, causal=True, backend="fa2", return_lse=True, seqlens_k=seqlens_k)
    for b, n in enumerate(lengths):
        s = slice(b, b + 1)
        if n == 0:
            assert torch.all(out[s] == 0) and torch.all(lse[s] == -math.inf)
        else:
            assert_attention_ok(out[s], lse[s], q[s], k[s, :n], v[s, :n], True, what=f"length {n}")
    assert fa2.auto_num_splits(q[3:4], k[3:4, :1023], True) > 1  # the 1023 row ran split


def test_fixed_split_count_is_batch_invariant():
    """EC-19 at a given count: a batch row is bitwise the call on that row alone (CTAs are independent; the
    merge adds in split order)."""
    q, k, v = qkv(4, 1, 2000, 32, 8, 128)
    config = split_config(128, 6)
    out, lse = fa2.run(q, k, v, causal=True, softmax_scale=0.1, config=config)
    for b in range(4):
        s = slice(b, b + 1)
        alone, alone_lse = fa2.run(q[s], k[s], v[s], causal=True, softmax_scale=0.1, config=config)
        assert torch.equal(alone, out[s]) and torch.equal(alone_lse, lse[s])


def test_cuda_graph_replay_equals_eager():
    """A split decode step (attention + merge, workspace allocated inside) captured once and replayed on new
    inputs gives the eager result."""
    q, k, v = qkv(1, 1, 4096, 32, 8, 128)
    assert fa2.auto_num_splits(q, k, True) > 1
    fa2.run(q, k, v, causal=True, softmax_scale=0.1)  # compile / load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = fa2.run(q, k, v, causal=True, softmax_scale=0.1)
    for _ in range(2):
        q.normal_()
        graph.replay()
        torch.cuda.synchronize()
        want, want_lse = fa2.run(q, k, v, causal=True, softmax_scale=0.1)
        assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_cuda_graph_replay_between_eager_calls(nan_allocations):
    """Captured split decode steps (their partials in the graph's pool) replayed after new inputs, with eager calls
    of the same and of a larger kind in between on the same stream (the per-stream scratch, grown by the larger
    one): every result is the current inputs' (float64 check)."""
    import fa_variants

    q, k, v = qkv(1, 1, 4096, 32, 8, 128)
    big = qkv(2, 1, 8192, 32, 8, 128)
    call = lambda q, k, v: fa_variants.attention(q, k, v, causal=True, backend="fa2", return_lse=True)  # noqa: E731
    assert fa2.auto_num_splits(q, k, True) > 1 and fa2.auto_num_splits(big[0], big[1], True) > 1
    with nan_allocations():
        call(q, k, v)  # compile, plan and size the eager scratch outside the capture
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            captured = [call(q, k, v) for _ in range(2)]
        torch.cuda.current_stream().wait_stream(stream)
        for _ in range(2):
            q.normal_()
            graph.replay()
            eager = call(q, k, v)
            larger = call(*big)
            graph.replay()
            torch.cuda.synchronize()
            for out, lse in captured + [eager]:
                assert_attention_ok(out, lse, q, k, v, True, what="graph / eager")
            assert_attention_ok(*larger, *big, True, what="larger eager call")


def test_two_streams_at_once(nan_allocations):
    """Split calls on two streams run concurrently, each stream with its own scratch (common.workspace)."""
    from fa_variants.common import workspace

    inputs = [qkv(1, 1, 32768, 32, 8, 128), qkv(1, 1, 16384, 32, 8, 128)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    results = [[], []]
    with nan_allocations():
        for s in streams:
            s.wait_stream(torch.cuda.current_stream())
        for _ in range(4):
            for i, (s, (q, k, v)) in enumerate(zip(streams, inputs)):
                with torch.cuda.stream(s):
                    results[i].append(fa2.run(q, k, v, causal=True, softmax_scale=0.088))
        for s in streams:
            torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        assert len(workspace._slots()) >= 2
    for (q, k, v), outs in zip(inputs, results):
        refs = None
        for out, lse in outs:
            refs = assert_attention_ok(out, lse, q, k, v, True, 0.088, what="two streams", refs=refs)


def test_scratch_shared_with_fa3(nan_allocations):
    """On an sm90 GPU, fa2 and fa3 split decode calls of one shape alternate on one stream without a sync; they
    share the stream's scratch (common.split_combine.partials_scratch) and each result is its own inputs'."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("fa3 needs an sm90 (Hopper) GPU")
    import fa_variants

    inputs = [qkv(1, 1, 4096, 32, 8, 128) for _ in range(4)]
    with nan_allocations():
        results = [fa_variants.attention(q, k, v, causal=True, backend=("fa2", "fa3")[i % 2], return_lse=True)
                   for i, (q, k, v) in enumerate(inputs)]
        torch.cuda.synchronize()
    for (q, k, v), (out, lse) in zip(inputs, results):
        assert_attention_ok(out, lse, q, k, v, True, what="fa2 / fa3 alternating")


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k", [(8, 4, 1023), (3, 16, 4224), (2, 64, 113), (2, 5, 3),
                                                       (64, 16, 1024)])
def test_narrow_decode_matches_float64(batch, seqlen_q, seqlen_k, causal, nan_allocations, monkeypatch):
    """FA_VARIANTS_FA2_NARROW_DECODE: few-row queries in 64 x 64 tiles, unsplit (explicit, and `auto` with the switch
    on where it does not split), odd lengths, seqlen_q > seqlen_k (causal rows seeing no key), GQA 32:8 D128."""
    q, k, v = qkv(batch, seqlen_q, seqlen_k, 32, 8, 128)
    refs = run_checked(q, k, v, causal, fa2.narrow_config(arch(), 128), nan_allocations, what="narrow")[2]
    monkeypatch.setattr(fa2, "NARROW_DECODE", True)
    if fa2.auto_num_splits(q, k, causal) == 1:
        assert fa2._problem_config(None, q, k, causal) == fa2.narrow_config(arch(), 128)
    run_checked(q, k, v, causal, None, nan_allocations, what="auto, narrow on", refs=refs)
