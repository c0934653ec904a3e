"""fa3 split-KV with the merge inside one thread block cluster per query tile (``Sm90Config.cluster_merge``,
FA_VARIANTS_DECODE_CLUSTER_MERGE) against the float64 reference, on an sm90 GPU only:

    source .gpu/env.sh && python3 -m pytest -m gpu tests/test_cluster_merge_gpu.py

Clusters of 2..16 splits (16: the non-portable size), odd Nk (5: empty splits; 193, 4097, 32768 + 3), GQA 32:8 and
64:8 at head_dim 64 (one head_dim 128 shape), seqlen_q 1 (host-view packing, first_row_only) and 4 (rows packed in the
kernel, causal), O and LSE; `auto` with the switch on (its split count and config, repeated calls with fresh Q, a
CUDA-graph replay), seqlens_k with lengths 0 and 1. Outputs are poisoned with NaN (``poisoned_workspace``): a row or
column the cluster's CTAs leave unwritten fails. scripts/cluster_gpu.sh precompiles ``kernels()`` first.
"""
import dataclasses

import pytest
import torch

import fa_variants
from fa_variants.bench.decode import capture_graph
from helpers import assert_attention_ok, make_qkv, padded_kv_cache, sm90_only

pytestmark = sm90_only("fa3 cluster merge")
fa3 = pytest.importorskip("fa_variants.hopper.fa3")

SPLITS = (2, 5, 16)  # the portable sizes' ends and the non-portable 16
NKS = (5, 193, 4097, 32768 + 3)


@pytest.fixture(autouse=True)
def poisoned(poisoned_workspace):
    """NaN-filled allocations and a fresh split scratch for every test (conftest.poisoned_workspace)."""


@pytest.fixture
def cluster(monkeypatch):
    """`auto` splits, packs, and merges inside the cluster."""
    monkeypatch.setattr(fa3, "SPLIT_KV_ENABLED", True)
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    monkeypatch.setattr(fa3, "DECODE_CLUSTER_MERGE", True)


def cluster_config(d: int, splits: int, group: int = 0):
    """The packed split config `auto` runs at seqlen_q 1 (group 0: host views, first_row_only; base decode tiles,
    no PDL) or with ``group`` rows per position packed in the kernel (seqlen_q > 1), merged in a cluster of
    ``splits``."""
    if group:
        base = dataclasses.replace(fa3._PACKED_SPLIT_CONFIGS[d], pack_group=group)
    else:
        base = fa3.first_row(fa3.decode_tiles(fa3._PACKED_SPLIT_CONFIGS[d], d, "base", pdl=False), 8, True)
    return dataclasses.replace(base, num_splits=splits, cluster_merge=True)


# (seqlen_q, heads, head_dim) of the explicit tests; heads_kv 8
ROWS = [(1, 32, 64), (1, 64, 64), (4, 32, 64), (4, 64, 64)]


def _group(nq: int, h: int) -> int:
    return 0 if nq == 1 else h // 8


def kernels() -> list[tuple[int, bool, object]]:
    """(head_dim, causal, config) of every kernel these tests compile but `auto`'s (scripts/cluster_precompile.py
    adds those)."""
    out = [(d, True, cluster_config(d, n, _group(nq, h))) for nq, h, d in ROWS for n in SPLITS]
    out += [(d, True, dataclasses.replace(cluster_config(d, 16, _group(nq, h)), ctas_per_sm=2)) for nq, h, d in ROWS]
    return list(dict.fromkeys(out + [(128, True, cluster_config(128, 16))]))


def _check(out, lse, q, k, v, causal, what, **kw):
    assert_attention_ok(out, lse, q, k, v, causal, q.shape[-1] ** -0.5, what=str(what), **kw)


@pytest.mark.parametrize("nk", NKS, ids=lambda n: f"nk{n}")
@pytest.mark.parametrize("splits", SPLITS, ids=lambda n: f"splits{n}")
@pytest.mark.parametrize("rows", ROWS, ids=lambda r: "nq{}-h{}-d{}".format(*r))
def test_cluster_merge_matches_reference(rows, splits, nk):
    """Explicit cluster configs, causal (at seqlen_q 4 the packed rows are masked by position; Nk 5 at 16 splits:
    11 empty splits)."""
    nq, h, d = rows
    q, k, v = make_qkv(1, nq, nk, h, 8, d, device="cuda")
    out, lse = fa3.run(q, k, v, causal=True, softmax_scale=d ** -0.5, config=cluster_config(d, splits, _group(nq, h)))
    _check(out, lse, q, k, v, True, (rows, splits, nk))


@pytest.mark.parametrize("nk", (5, 4097, 32768 + 3), ids=lambda n: f"nk{n}")
@pytest.mark.parametrize("rows", ROWS, ids=lambda r: "nq{}-h{}-d{}".format(*r))
def test_cluster_merge_two_ctas_per_sm_matches_reference(rows, nk):
    """FA_VARIANTS_DECODE_CLUSTER_MERGE=dual's kernels: 16-CTA clusters launched for two CTAs per SM (128 registers
    at launch, the consumer 232)."""
    nq, h, d = rows
    q, k, v = make_qkv(1, nq, nk, h, 8, d, device="cuda")
    cfg = dataclasses.replace(cluster_config(d, 16, _group(nq, h)), ctas_per_sm=2)
    out, lse = fa3.run(q, k, v, causal=True, softmax_scale=d ** -0.5, config=cfg)
    _check(out, lse, q, k, v, True, (rows, "dual", nk))


def test_cluster_merge_head_dim_128_batch_2():
    """Two batches x 8 KV heads of 16-CTA clusters at head_dim 128 (the partial O fills both K stages)."""
    q, k, v = make_qkv(2, 1, 4099, 32, 8, 128, device="cuda")
    out, lse = fa3.run(q, k, v, causal=True, softmax_scale=0.125, config=cluster_config(128, 16))
    assert_attention_ok(out, lse, q, k, v, True, 0.125)


# (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim) of `auto` with the switch: the A/B's B 1 Nk 32k shapes
AUTO = [(1, 1, 32768, 32, 8, 64), (1, 1, 32768, 64, 8, 64), (1, 4, 32768, 32, 8, 64), (1, 4, 32768, 64, 8, 64),
        (1, 1, 1024, 32, 8, 64), (1, 16, 4097, 64, 8, 64)]  # the last: 128 packed rows, the wide ping-pong tile


@pytest.mark.parametrize("shape", AUTO, ids=lambda s: "x".join(map(str, s)))
def test_auto_runs_cluster_merge(shape, cluster):
    """`auto` with FA_VARIANTS_DECODE_CLUSTER_MERGE: its config merges in a cluster of its split count; three calls
    with fresh Q then a CUDA-graph replay after a new Q, each within the rule (O and LSE)."""
    b, nq, nk, h, hkv, d = shape
    q, k, v = make_qkv(b, nq, nk, h, hkv, d, device="cuda")
    cfg = fa3._problem_config(None, q, k, True)
    assert cfg.cluster_merge and 2 <= cfg.num_splits <= 16, cfg
    for _ in range(3):
        q = torch.randn_like(q)
        out, lse = fa_variants.attention(q, k, v, causal=True, backend="fa3", return_lse=True)
        _check(out, lse, q, k, v, True, shape)
    q_static = torch.randn_like(q)
    graph, [(out, lse)] = capture_graph(lambda: fa_variants.attention(q_static, k, v, causal=True, backend="fa3",
                                                                     return_lse=True))
    q_static.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    _check(out, lse, q_static, k, v, True, (shape, "graph"))


def test_seqlens_k_with_lengths_0_and_1(cluster):
    """seqlens_k (per-sequence lengths, keys past them NaN) with the switch on: lengths 0 (O 0, LSE -inf), 1
    (unsplit), 193 and 4097 (cluster merges)."""
    q, k, v, seqlens_k = padded_kv_cache([0, 1, 193, 4097], 1, 4097, 32, 8, 64, device="cuda")
    out, lse = fa_variants.attention(q, k, v, causal=True, backend="fa3", return_lse=True, seqlens_k=seqlens_k)
    assert_attention_ok(out, lse, q, k, v, True, seqlens_k=seqlens_k)
