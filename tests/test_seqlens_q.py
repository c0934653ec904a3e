"""Each sequence's query count (`seqlens_q`, a causal batch padded on the right, queries too) on the CPU: the
reference's semantics against an explicit float64 mask, the public API (reference backend; the grouped calls of a
kernel that reads no windows, on a fake sm_90), validation (one-line errors naming seqlens_q and its bound
seqlen_q), the configs' rule, autograd, torch.compile and the ops."""
import math

import pytest
import torch

import fa_variants
from fa_variants.reference import attention_reference, check_against_reference, run_backward
from helpers import windowed_kv_cache

#: (start, end) windows of a 40-key cache with a query count each: a right-padded training batch (count = window),
#: the full length, an empty sequence, one token, left padding too, and counts unlike their windows' (0: every row
#: sees the whole window; the count of the cache)
CASES = [((0, 40), 40), ((0, 23), 23), ((0, 0), 0), ((0, 1), 1), ((5, 30), 25), ((3, 40), 0), ((0, 17), 40)]


def _masked_float64(q, k, v, cases, causal):
    """softmax over an explicit mask: query i of sequence b sees key j iff start <= j < end and (causal) j - start
    <= i + (end - start) - count."""
    batch, nq, h, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    kk, vv = (t.double().repeat_interleave(h // hkv, dim=2).nan_to_num() for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), kk) / math.sqrt(d)
    i, j = torch.arange(nq).view(nq, 1), torch.arange(nk).view(1, nk)
    visible = torch.stack([(j >= a) & (j < e) & ((j - a <= i + (e - a) - c) if causal else True)
                           for (a, e), c in cases])
    s = s.masked_fill(~visible[:, None], -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(visible[:, None], torch.exp(s - lse.unsqueeze(-1)), 0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, vv), lse


def _inputs(dtype=torch.float32, seqlen_q=40, head_dim=32):
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache([w for w, _ in CASES], seqlen_q, 40, 4, 2, head_dim,
                                                      dtype=dtype)
    return q, k, v, seqlens_k, leftpad_k, torch.tensor([c for _, c in CASES], dtype=torch.int32)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_reference_and_api_match_explicit_mask(causal):
    """The reference and ``fa_variants.attention`` (reference backend) against the mask, every row (the padding rows
    see the whole window); without causal seqlens_q changes nothing; rows that see no key give 0, LSE -inf."""
    q, k, v, seqlens_k, leftpad_k, seqlens_q = _inputs()
    want_out, want_lse = _masked_float64(q, k, v, CASES, causal)
    for out, lse in (attention_reference(q, k, v, causal=causal, seqlens_k=seqlens_k, leftpad_k=leftpad_k,
                                         seqlens_q=seqlens_q),
                     fa_variants.attention(q, k, v, causal=causal, seqlens_k=seqlens_k, leftpad_k=leftpad_k,
                                           seqlens_q=seqlens_q, return_lse=True, backend="reference")):
        assert not out.isnan().any() and torch.equal(lse == -math.inf, want_lse == -math.inf)
        finite = want_lse > -math.inf
        assert torch.allclose(lse[finite].double(), want_lse[finite], atol=1e-5)
        assert torch.allclose(out.double(), want_out, atol=1e-5)
    if not causal:
        plain = fa_variants.attention(q, k, v, seqlens_k=seqlens_k, leftpad_k=leftpad_k, backend="reference")
        assert torch.equal(plain, out)


def test_gradients_match_the_mask_and_compile():
    """run_backward's gradients (the rows of each window's causal and padding parts apart) equal autograd through the
    explicit mask; torch.compile(fullgraph=True) gives the eager forward (the seqlens_k op, seqlens_q its last
    argument)."""
    q, k, v, seqlens_k, leftpad_k, seqlens_q = _inputs(torch.float64)
    k, v = k.nan_to_num(), v.nan_to_num()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = _masked_float64(*leaves, CASES, True)
    grad_out, grad_lse = torch.randn_like(out), torch.randn_like(lse).masked_fill(lse == -math.inf, 0)
    want = torch.autograd.grad((out * grad_out).sum() + (lse.nan_to_num(neginf=0) * grad_lse).sum(), leaves)
    got = run_backward(grad_out, grad_lse, q, k, v, causal=True, softmax_scale=32 ** -0.5,
                       seqlens_k=seqlens_k, leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
    kwargs = dict(causal=True, seqlens_k=seqlens_k, leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lambda q, k, v, e, s, c: fa_variants.attention(
            q, k, v, causal=True, seqlens_k=e, leftpad_k=s, seqlens_q=c), fullgraph=True)
        assert torch.equal(compiled(q, k, v, seqlens_k, leftpad_k, seqlens_q), fa_variants.attention(q, k, v, **kwargs))
    finally:
        torch._dynamo.reset()


def test_grouped_calls_on_a_kernel_that_reads_no_windows(fake_gpu, monkeypatch):
    """A kernel backend whose kernel reads no windows (fa1, fa3-fp8; here the fake sm_90's fa3): per distinct
    window and count, its causal rows in one call and its padding rows (full) in another, on K / V cut to the window;
    the output within the rule against float64."""
    from fa_variants import api

    monkeypatch.setattr(api, "_kernel_module", lambda backend: None)
    q, k, v, seqlens_k, leftpad_k, seqlens_q = _inputs(torch.bfloat16, head_dim=64)
    out = fa_variants.attention(q, k, v, causal=True, seqlens_k=seqlens_k, leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    got = sorted((call["q"].shape[:2], call["k"].shape[1], call["causal"]) for call in fake_gpu)
    want = [((1, 40), 40, True), ((1, 23), 23, True), ((1, 17), 23, False), ((1, 1), 1, True), ((1, 39), 1, False),
            ((1, 25), 25, True), ((1, 15), 25, False), ((1, 40), 37, False), ((1, 40), 17, True)]
    assert got == sorted(want), got
    assert check_against_reference(out, q, k, v, True, seqlens_k=seqlens_k, leftpad_k=leftpad_k,
                                   seqlens_q=seqlens_q).ok
    assert not out[2].any()


@pytest.mark.parametrize("bad,error,match", [
    (torch.tensor([41, 1, 1, 1, 1, 1, 1], dtype=torch.int32), ValueError, r"^seqlens_q holds 41, outside \[0, "
                                                                          r"seqlen_q = 40\]$"),
    (torch.tensor([1, -2, 1, 1, 1, 1, 1], dtype=torch.int32), ValueError, r"^seqlens_q holds -2, outside"),
    (torch.ones(7, dtype=torch.int64), TypeError, "^seqlens_q must have dtype torch.int32"),
    (torch.ones(6, dtype=torch.int32), ValueError, r"^seqlens_q must have shape \(batch,\) = \(7,\)"),
    ([1] * 7, TypeError, "^seqlens_q must be a torch.Tensor"),
    (torch.ones(7, dtype=torch.int32, device="meta"), ValueError, "^seqlens_q is on meta"),
])
def test_validation(bad, error, match):
    """One line naming seqlens_q and its bound, from the API (with the other windows, alone, causal or not) and the
    reference; nothing of the caller's modified."""
    q, k, v, seqlens_k, leftpad_k, _ = _inputs()
    saved = [t.clone() for t in (q, k, seqlens_k, leftpad_k)]
    for call in (fa_variants.attention, attention_reference):
        for causal in (True, False):
            with pytest.raises(error, match=match):
                call(q, k, v, causal=causal, seqlens_k=seqlens_k, leftpad_k=leftpad_k, seqlens_q=bad)
            with pytest.raises(error, match=match):
                call(q, k, v, causal=causal, seqlens_q=bad)
    assert all(torch.equal(a, b, ) for a, b in zip((q.nan_to_num(), k.nan_to_num(), seqlens_k, leftpad_k),
                                                  (s.nan_to_num() for s in saved)))


def test_configs_and_launch_check_seqlens_q():
    """``Sm90Config`` / ``Sm80Config.seqlens_q`` needs leftpad_k (the kernels read the three tensors together); the
    launch checks the tensor against the config before anything compiles."""
    import dataclasses

    from fa_variants.ampere import fa2
    from fa_variants.common import launch
    from fa_variants.hopper import fa3

    for base, check in ((fa3.DEFAULT_CONFIGS[128], lambda c: c.check(128)),
                        (fa2.default_config("sm_80", 128, True), lambda c: c.check("sm_80", 128))):
        lengths = dataclasses.replace(base, seqlens_k=True, persistent=False) if hasattr(base, "persistent") else \
            dataclasses.replace(base, seqlens_k=True)
        with pytest.raises(ValueError, match="^seqlens_q=True must be a bool, True only with leftpad_k=True"):
            check(dataclasses.replace(lengths, seqlens_q=True))
        check(dataclasses.replace(lengths, leftpad_k=True, seqlens_q=True))
    q, k = torch.randn(2, 3, 2, 64, dtype=torch.bfloat16), torch.randn(2, 8, 2, 64, dtype=torch.bfloat16)
    config = dataclasses.replace(fa2.default_config("sm_80", 64, True), seqlens_k=True, leftpad_k=True)
    with pytest.raises(ValueError, match="seqlens_q given for a config with seqlens_q=False"):
        launch.launch(fa2.VARIANT, q, k, k, causal=True, softmax_scale=0.1, config=config,
                      seqlens_k=torch.tensor([5, 8], dtype=torch.int32),
                      seqlens_q=torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(TypeError, match="seqlens_q must have dtype"):
        launch.launch(fa2.VARIANT, q, k, k, causal=True, softmax_scale=0.1,
                      config=dataclasses.replace(config, seqlens_q=True), seqlens_q=torch.tensor([1, 2]))


def test_the_ops_pass_opcheck():
    """torch.library.opcheck of the seqlens_k op with seqlens_q (with and without leftpad_k) and of the mask op that
    reads a causal layer's windows with their query counts (a right-padded batch; a full mask, counts 0)."""
    q, k, v, seqlens_k, leftpad_k, seqlens_q = _inputs()
    k, v = k.nan_to_num(), v.nan_to_num()
    op = torch.ops.fa_variants.attention_seqlens_k
    torch.library.opcheck(op, (q, k, v, seqlens_k, True, None, "reference", leftpad_k, seqlens_q))
    torch.library.opcheck(op, (q, k, v, seqlens_k, True, None, "reference", None, seqlens_q))
    rows, keys = torch.arange(6)[:, None], torch.arange(6)
    right = torch.stack([(keys < n) & (keys <= rows) for n in (6, 2, 0)])[:, None]
    full = torch.stack([(keys < n) & (rows >= 0) for n in (1, 1, 0)])[:, None]
    windows_op = torch.ops.fa_variants.mask_sequence_windows
    for mask, counts in ((right, [6, 2, 6]), (full, [0, 0, 6])):
        args = (mask, True, 6, 6, 3, 1, "attention_mask")
        assert windows_op(*args).tolist() == [[6, 2, 0] if mask is right else [1, 1, 0], [0, 0, 0], counts]
        torch.library.opcheck(windows_op, args)
    from fa_variants.integrations import hf

    with pytest.raises(hf.UnsupportedAttentionError, match="whose rows past a sequence's end see its whole window"):
        torch.ops.fa_variants.mask_window(right, True, 6, 6, 3, 1, "attention_mask")  # (the op of session 54)


@pytest.mark.parametrize("tile_m,tile_n", [(64, 64), (128, 128), (128, 176), (192, 128)])
@pytest.mark.parametrize("group,tail_first", [(1, False), (1, True), (4, False)])  # (no q_tail_first when packed)
def test_tile_ranges_with_a_query_count_cover_the_mask(tile_m, tile_n, group, tail_first):
    """The kernels' tile arithmetic (``common.mask.BlockInfo`` on Python ints) with the diagonal's query count c in
    place of seqlen_q, rows still Q's padded ones: every key a row sees (j < n and j <= p + n - c, p its query
    position; the padding rows p >= c see all n) lies in a tile before ``kv_tile_end``, and every key of a tile
    before ``kv_tile_causal_start`` is seen by every row of the query tile (those tiles run unmasked)."""
    from fa_variants.common.mask import BlockInfo

    blocks = BlockInfo(tile_m, tile_n, True, qhead_per_kvhead=group)
    for seqlen_q in (1, 3, 64, 130, 300):
        for n in (0, 1, 77, 300, 513):
            for count in sorted({0, 1, 63, seqlen_q // 2, seqlen_q}):
                rows = seqlen_q * group
                for m_block in range(-(-rows // tile_m)):
                    start = blocks.q_row_start(m_block, seqlen_q, tail_first)
                    end = min(start + tile_m, rows)
                    n_end = blocks.kv_tile_end(m_block, count, n, start if tail_first else None)
                    free = blocks.kv_tile_causal_start(m_block, count, n, start if tail_first else None)
                    positions = [r // group for r in range(start, end)]
                    seen = [min(n, p + n - count + 1) for p in positions]  # keys 0 .. seen-1 visible to the row
                    assert -(-max(seen + [0]) // tile_n) <= n_end, (seqlen_q, n, count, m_block)
                    assert min(n, free * tile_n) <= max(0, min(seen)), (seqlen_q, n, count, m_block)
