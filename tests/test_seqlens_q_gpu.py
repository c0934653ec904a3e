"""Each sequence's query count read by the fa3 and fa2 kernels (``Sm90Config.seqlens_q`` / ``Sm80Config.seqlens_q``,
``windows_config``: the causal diagonal of sequence b bottom-right against seqlens_q[b] and its key count) on an sm90
GPU (fa2's sm80 code runs there): one launch for a causal batch padded on the right, queries and keys alike (a padded
training batch), against float64 attention computed per sequence (``reference.attention_reference(seqlens_q=)``: rows
[0, seqlens_q[b]) causal over the window, the padding rows after them over all of it). Keys outside each window hold
NaN (``helpers.windowed_kv_cache``). Prefill shapes with query counts off and on the tile grid (0, 1, 63, 64, 127,
128, 129, all), windows padded on the left too, GQA, every head dim, short queries on the split / packed configs (the
merge kernel, fa3's fused merge), and the caller's tensors left as they were."""
import pytest
import torch
from helpers import assert_attention_ok, sm90_only, split_decode_config, windowed_kv_cache

# NaN-filled allocations and a fresh split scratch per test (conftest.poisoned_workspace)
pytestmark = [*sm90_only("fa3 with seqlens_q"), pytest.mark.usefixtures("poisoned_workspace")]
fa3, fa2 = (pytest.importorskip(f"fa_variants.{m}") for m in ("hopper.fa3", "ampere.fa2"))
MODULES = {"fa3": fa3, "fa2": fa2}


def _counts(values, device="cuda"):
    return torch.tensor(values, dtype=torch.int32, device=device)


# (windows, query counts, seqlen_q, seqlen_k, heads, heads_kv): a right-padded training batch (query count = window
# count = its length, Nq = Nk), counts off and on the 64- / 128-row tiles, an empty sequence, one token, the full
# length; then windows padded on the left too and counts unlike their windows' (the diagonal moved either way)
PREFILL = [
    ([(0, 300), (0, 127), (0, 128), (0, 129), (0, 0), (0, 1), (0, 64)], [300, 127, 128, 129, 0, 1, 64], 300, 300, 4, 2),
    ([(0, 1023), (0, 5), (0, 700), (0, 63)], [1023, 5, 700, 63], 1023, 1023, 2, 2),
    ([(0, 4224), (0, 2000)], [4224, 2000], 4224, 4224, 6, 1),
    ([(3, 300), (0, 200), (128, 257), (10, 10)], [297, 150, 20, 0], 300, 300, 4, 1),
    ([(0, 1023), (17, 900)], [113, 77], 113, 1023, 8, 2),
]


@pytest.mark.parametrize("backend", ["fa3", "fa2"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("case", PREFILL, ids=[f"{len(c[0])}x{c[2]}x{c[3]}" for c in PREFILL])
def test_prefill_query_counts_in_the_kernel(case, head_dim, backend):
    windows, counts, nq, nk, h, hkv = case
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache(windows, nq, nk, h, hkv, head_dim, device="cuda")
    seqlens_q = _counts(counts)
    module, scale = MODULES[backend], head_dim ** -0.5
    assert module.windows_config(q, k, True).seqlens_q
    out, lse = module.run(q, k, v, causal=True, softmax_scale=scale, seqlens_k=seqlens_k, leftpad_k=leftpad_k,
                          seqlens_q=seqlens_q)
    assert_attention_ok(out, lse, q, k, v, True, scale, seqlens_k=seqlens_k, leftpad_k=leftpad_k,
                        seqlens_q=seqlens_q, what=f"{backend} D={head_dim} windows={windows} counts={counts}")


@pytest.mark.parametrize("backend", ["fa3", "fa2"])
def test_right_padding_without_leftpad_k_and_non_causal(backend):
    """seqlens_q without leftpad_k (the launch passes zeros for the first keys); non-causal, the counts move
    nothing."""
    lengths = [500, 37, 256]
    q, k, v, seqlens_k, _ = windowed_kv_cache([(0, n) for n in lengths], 500, 500, 4, 2, 128, device="cuda")
    module, seqlens_q = MODULES[backend], _counts(lengths)
    for causal in (True, False):
        out, lse = module.run(q, k, v, causal=causal, softmax_scale=0.1, seqlens_k=seqlens_k, seqlens_q=seqlens_q)
        assert_attention_ok(out, lse, q, k, v, causal, 0.1, seqlens_k=seqlens_k, seqlens_q=seqlens_q,
                            what=f"{backend} causal={causal}")


SHORT = [([(0, 1023), (0, 40), (500, 1023)], [16, 3, 16], 16, 1023, 64, 8, 128),
         ([(0, 4096), (0, 100)], [4, 1], 4, 4096, 32, 8, 64)]


@pytest.mark.parametrize("split", ["fa3-auto", "fa3-merge-kernel", "fa3-fused", "fa2-auto", "fa2-split3"])
@pytest.mark.parametrize("case", SHORT, ids=[f"{len(c[0])}x{c[2]}x{c[3]}-d{c[6]}" for c in SHORT])
def test_short_queries_split_and_packed(case, split):
    """A few query rows per sequence (chunked prefill of a right-padded batch) on `auto`'s split / packed configs
    and with 3 splits through the merge kernel or fa3's fused merge: each split's range of tiles from the moved
    diagonal."""
    windows, counts, nq, nk, h, hkv, d = case
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache(windows, nq, nk, h, hkv, d, device="cuda")
    module, config = split_decode_config(split, q, k, True)
    seqlens_q = _counts(counts)
    out, lse = module.run(q, k, v, causal=True, softmax_scale=0.09, config=config, seqlens_k=seqlens_k,
                          leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    assert_attention_ok(out, lse, q, k, v, True, 0.09, seqlens_k=seqlens_k, leftpad_k=leftpad_k,
                        seqlens_q=seqlens_q, what=f"{split} windows={windows} counts={counts}")


def test_fp16_and_the_callers_tensors_untouched():
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache([(0, 200), (0, 0), (100, 257)], 257, 257, 4, 1, 128,
                                                      dtype=torch.float16, device="cuda")
    seqlens_q = _counts([200, 0, 157])
    before = [t.clone() for t in (q, k, v, seqlens_k, leftpad_k, seqlens_q)]
    out, lse = fa3.run(q, k, v, causal=True, softmax_scale=0.1, seqlens_k=seqlens_k, leftpad_k=leftpad_k,
                       seqlens_q=seqlens_q)
    assert_attention_ok(out, lse, q, k, v, True, 0.1, seqlens_k=seqlens_k, leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    for was, now in zip(before, (q, k, v, seqlens_k, leftpad_k, seqlens_q)):  # the padding's NaN included
        torch.testing.assert_close(now, was, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("backend", ["fa3", "fa2", "fa1"])
def test_api_right_padded_training_batch(backend):
    """``fa_variants.attention(causal=True, seqlens_k=lengths, seqlens_q=lengths)``: fa3 and fa2 in one launch, fa1
    (no window in its kernel) each distinct window's causal rows and padding rows in a call each."""
    import fa_variants

    lengths = [300, 0, 131, 300, 64]
    q, k, v, seqlens_k, _ = windowed_kv_cache([(0, n) for n in lengths], 300, 300, 4, 2, 64, device="cuda")
    seqlens_q = _counts(lengths)
    out, lse = fa_variants.attention(q, k, v, causal=True, backend=backend, return_lse=True, seqlens_k=seqlens_k,
                                     seqlens_q=seqlens_q)
    assert_attention_ok(out, lse, q, k, v, True, seqlens_k=seqlens_k, seqlens_q=seqlens_q, what=backend)


@pytest.mark.parametrize("backend", ["fa3", "fa2"])
def test_api_replays_in_a_cuda_graph(backend):
    """Captured once in a CUDA graph (no host read-back), then replayed with new lengths, queries and keys written
    into the same tensors: each replay's result is the new one (the kernels read the counts at each launch)."""
    import fa_variants
    from fa_variants.bench.decode import capture_graph

    lengths = [200, 1, 0, 77]
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache([(0, n) for n in lengths], 200, 200, 8, 2, 128, device="cuda")
    seqlens_q = _counts(lengths)
    run = lambda: fa_variants.attention(q, k, v, causal=True, backend=backend, return_lse=True,  # noqa: E731
                                        seqlens_k=seqlens_k, leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    out, lse = run()  # compile and plan outside the capture
    assert_attention_ok(out, lse, q, k, v, True, seqlens_k=seqlens_k, leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    graph, [(out, lse)] = capture_graph(run)
    for lengths in ([1, 200, 129, 128], [64, 63, 200, 0]):
        for t in (seqlens_k, seqlens_q):
            t.copy_(_counts(lengths))
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        for b, n in enumerate(lengths):
            k[b, n:], v[b, n:] = float("nan"), float("nan")
        graph.replay()
        torch.cuda.synchronize()
        assert_attention_ok(out, lse, q, k, v, True, seqlens_k=seqlens_k, leftpad_k=leftpad_k, seqlens_q=seqlens_q,
                            what=f"replay {lengths}")


@pytest.mark.parametrize("mode", ["cudnn", "flash"])
@pytest.mark.parametrize("backend", ["fa3", "fa2"])
def test_fused_gradients_of_a_right_padded_training_batch(gpu_variant, monkeypatch, backend, mode):
    """A loss of out alone on a right-padded causal batch: the fused backward once per distinct window's causal rows
    and once per its padding rows (``backward._backward_by_length``), eagerly and under torch.compile (fullgraph:
    the seqlens_k op with seqlens_q, its backward the lengths op); gradients finite, within the rule against float64
    (the same maths in bf16 the baseline), dK and dV 0 past each length."""
    from helpers import assert_grads_within_rule, count_fused_backwards, grads_eager_and_compiled, same_and_exact_grads

    monkeypatch.setenv("FA_VARIANTS_BACKWARD", mode)
    gpu_variant(backend)
    fused = count_fused_backwards(monkeypatch)
    lengths = [300, 270, 300, 199]
    q, k, v, seqlens_k, _ = windowed_kv_cache([(0, n) for n in lengths], 300, 300, 8, 2, 128, dtype=torch.bfloat16,
                                              device="cuda")
    k, v = k.nan_to_num(), v.nan_to_num()  # (the reference baselines' autograd would carry NaN through 0 * NaN)
    grad_out = torch.randn(q.shape, dtype=torch.bfloat16, device="cuda")
    kwargs = dict(causal=True, seqlens_k=seqlens_k, seqlens_q=_counts(lengths))
    same, exact = same_and_exact_grads(q, k, v, grad_out, **kwargs)
    for got, calls in grads_eager_and_compiled(q, k, v, grad_out, fused, backend=backend, **kwargs):
        assert calls == 5, calls  # 300 keys: one call; 270 and 199: causal rows, then padding rows
        assert all(g.isfinite().all() for g in got)
        assert_grads_within_rule(got, same, exact)
        for b, n in enumerate(lengths):
            for g in got[1:]:
                assert not g[b, n:].any()
