"""Issue 13, session 12: FA_VARIANTS_DECODE_LONG_DUAL (``hopper.fa3.long_dual``) on the GPU. `auto`'s packed
seqlen_q = 1 calls at batch x heads_kv <= 16 and Nk >= 32k run the "dual" tiles (two CTAs per SM; the split
heuristic over 2 x SMs slots: 32-33 splits at B 1 x 8 KV heads (33: the warp merge's second
lap over 32), 52 at B 2 x 1), each call against float64 (O and LSE;
outputs and split scratch NaN-poisoned, fresh Q per call): odd lengths, GQA 32:8 / 64:8 / MQA, head_dim 64 and 128,
causal and not, seqlens_k with lengths 0 and 1 beside long ones, a CUDA-graph replay. Runs on an sm90 GPU only
(scripts/splits32_gpu.sh):

    source .gpu/env.sh && python3 -m pytest -m gpu tests/test_long_dual_gpu.py
"""
import pytest
import torch

from fa_variants.bench.decode import capture_graph
from helpers import assert_attention_ok, make_qkv, padded_kv_cache, sm90_only

pytestmark = sm90_only("fa3 split-KV")
fa3 = pytest.importorskip("fa_variants.hopper.fa3")

#: (head_dim, heads, heads_kv, batch, seqlen_k, splits at 132 SMs): the long, narrow calls the switch moves
LONG = [(64, 32, 8, 1, 32771, 33), (64, 64, 8, 1, 40001, 32), (64, 8, 1, 2, 33000, 52), (128, 32, 8, 1, 32833, 33)]
LONG_IDS = ["d{}_{}x{}_b{}_nk{}".format(*s[:5]) for s in LONG]
#: (head_dim, heads, heads_kv, lengths) for seqlens_k: batch x heads_kv 16, the padded cache 40001 keys long
SEQLENS = [(64, 32, 4, [0, 1, 32769, 40001]), (128, 16, 4, [40001, 0, 1, 35000])]


@pytest.fixture(autouse=True)
def long_dual(poisoned_workspace, monkeypatch):
    """The switch on for every head dim ("all"), the other decode switches at their shipped values whatever the
    environment says; NaN-filled allocations and a fresh split scratch (conftest.poisoned_workspace)."""
    for attr, value in dict(LONG_DUAL="all", SPLIT_KV_ENABLED=True, PACK_GQA_ENABLED=True, SPLIT_MIN_TILES=1,
                            DECODE_TILES_CHOICE="auto", DUAL_MIN_CTAS=512, DECODE_PDL=False,
                            DECODE_PDL_MAX_SPLITS=8, DECODE_PDL_MIN_SPLITS=1, DECODE_FULL_GRID="dual").items():
        monkeypatch.setattr(fa3, attr, value)
    fa3._auto_splits.cache_clear()
    yield
    fa3._auto_splits.cache_clear()


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", LONG, ids=LONG_IDS)
def test_long_dual_matches_reference(shape, causal):
    """Three fresh Qs through the public API, each within the rule (O and LSE); the call ran the dual tiles with
    the heuristic's count over 2 x SMs slots (``splits`` on a 132-SM H100 / H200)."""
    import fa_variants

    d, h, hkv, b, nk, splits = shape
    q, k, v = make_qkv(b, 1, nk, h, hkv, d, device="cuda")
    cfg = fa3._problem_config(None, q, k, causal)
    assert cfg.ctas_per_sm == 2 and cfg.pack_gqa, cfg
    if _sms() == 132:
        assert fa3.auto_num_splits(q, k, causal) == splits
    for _ in range(3):
        q.copy_(torch.randn_like(q))
        out, lse = fa_variants.attention(q, k, v, causal=causal, backend="fa3", return_lse=True)
        assert_attention_ok(out, lse, q, k, v, causal, what=f"D{d} {h}:{hkv} B{b} Nk{nk}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", SEQLENS, ids=["d64", "d128"])
def test_long_dual_with_seqlens_k(case, causal):
    """A padded KV cache (NaN past each length) with lengths 0 and 1 beside two long ones: each length runs as its own
    call (the long ones dual, the short ones not), rows of length 0 are 0 with LSE -inf; O and LSE vs float64."""
    import fa_variants

    d, h, hkv, lengths = case
    q, k, v, seqlens_k = padded_kv_cache(lengths, 1, max(lengths), h, hkv, d, device="cuda")
    out, lse = fa_variants.attention(q, k, v, causal=causal, backend="fa3", return_lse=True, seqlens_k=seqlens_k)
    assert_attention_ok(out, lse, q, k, v, causal, seqlens_k=seqlens_k, what=f"D{d} lengths {lengths}")


def test_long_dual_cuda_graph_replay():
    """The D 64 B 1 32:8 Nk 32k call (32 splits, two kernels) captured in a CUDA graph: a replay after a new Q gives
    the new Q's answer (a merge that read stale partials would give the old one)."""
    import fa_variants

    q, k, v = make_qkv(1, 1, 32768, 32, 8, 64, device="cuda")
    graph, outs = capture_graph(lambda: fa_variants.attention(q, k, v, causal=True, backend="fa3"), 1)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert_attention_ok(outs[0], None, q, k, v, True, what="graph replay")
