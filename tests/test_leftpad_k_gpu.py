"""Each sequence's first key read by the fa3 and fa2 kernels (``Sm90Config.leftpad_k`` / ``Sm80Config.leftpad_k``,
``leftpad_config``: K and V viewed from key leftpad_k[b] on) on an sm90 GPU (fa2's sm80 code runs there): one launch
for a KV cache padded on both sides, against float64 attention over each window. Keys outside each window hold NaN
(``helpers.windowed_kv_cache``): the kernels must read none before the window (fa3's TMA boxes and fa2's tiles start
at it) and neither use nor let reach O the ones past it. Prefill and decode shapes, causal or not, GQA, every head
dim, split-KV (the merge kernel, fa3's fused merge), packed GQA, CUDA-graph replays with new windows, the API's
routing (fa1 per window), and the fused backward window by window."""

import pytest
import torch
from helpers import (assert_attention_ok, assert_grads_within_rule, count_fused_backwards, grads_eager_and_compiled,
                     same_and_exact_grads, sm90_only, split_decode_config, windowed_kv_cache)

from fa_variants.bench.decode import capture_graph

# NaN-filled allocations and a fresh split scratch per test (conftest.poisoned_workspace)
pytestmark = [*sm90_only("fa3 with leftpad_k"), pytest.mark.usefixtures("poisoned_workspace")]
fa3, fa2 = (pytest.importorskip(f"fa_variants.{m}") for m in ("hopper.fa3", "ampere.fa2"))
MODULES = {"fa3": fa3, "fa2": fa2}
BF16, F16 = torch.bfloat16, torch.float16


# (windows, seqlen_q, seqlen_k, heads, heads_kv): starts off the tile grid (1, 127, 129) and on it (128), an empty
# window, one key, the whole cache, padding on the left only and on both sides, Nq above a window's count (causal rows
# that see no key), GQA and MQA
PREFILL = [
    ([(1, 300), (127, 128), (128, 300), (129, 257), (300, 300), (0, 300)], 77, 300, 4, 2),
    ([(0, 1023), (1018, 1023), (423, 1023), (5, 5)], 1023, 1023, 2, 2),
    ([(4000, 4224), (17, 4100)], 300, 4224, 6, 1),
    ([(3, 116), (0, 113), (224, 4224)], 113, 4224, 8, 2),
]


@pytest.mark.parametrize("backend", ["fa3", "fa2"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("case", PREFILL, ids=[f"{len(c[0])}x{c[1]}x{c[2]}" for c in PREFILL])
def test_prefill_windows_in_the_kernel(case, head_dim, causal, backend):
    windows, nq, nk, h, hkv = case
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache(windows, nq, nk, h, hkv, head_dim, device="cuda")
    module, scale = MODULES[backend], head_dim ** -0.5
    assert module.leftpad_config(q, k, causal).leftpad_k
    out, lse = module.run(q, k, v, causal=causal, softmax_scale=scale, seqlens_k=seqlens_k, leftpad_k=leftpad_k)
    assert_attention_ok(out, lse, q, k, v, causal, scale, seqlens_k=seqlens_k, leftpad_k=leftpad_k,
                        what=f"{backend} D={head_dim} causal={causal} windows={windows}")


DECODE = [([(0, 1023), (1022, 1023), (500, 1023), (1023, 1023), (3, 700)], 1, 1023, 32, 8, 128),
          ([(96, 4096), (1, 4000), (4095, 4096), (2049, 2049)], 4, 4096, 32, 8, 64),
          ([(8000, 8191), (3, 8192)], 16, 8192, 64, 8, 128), ([(1, 300), (299, 300)], 1, 300, 8, 2, 256)]


@pytest.mark.parametrize("split", ["fa3-auto", "fa3-merge-kernel", "fa3-fused", "fa2-auto", "fa2-split3"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", DECODE, ids=[f"{len(c[0])}x{c[1]}x{c[2]}-d{c[5]}" for c in DECODE])
def test_decode_windows_split_and_packed(case, causal, split):
    """Decode shapes (a left-padded batch generating) on `auto`'s split / packed configs, and with 3 splits through
    the merge kernel or fa3's fused merge: each split's range is of its window's keys."""
    windows, nq, nk, h, hkv, d = case
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache(windows, nq, nk, h, hkv, d, device="cuda")
    module, config = split_decode_config(split, q, k, causal)
    out, lse = module.run(q, k, v, causal=causal, softmax_scale=0.09, config=config, seqlens_k=seqlens_k,
                          leftpad_k=leftpad_k)
    assert_attention_ok(out, lse, q, k, v, causal, 0.09, seqlens_k=seqlens_k, leftpad_k=leftpad_k,
                        what=f"{split} windows={windows}")


def test_fp16_and_the_callers_tensors_untouched():
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache([(3, 200), (0, 0), (100, 257)], 129, 257, 4, 1, 128, dtype=F16,
                                                      device="cuda")
    before = [t.clone() for t in (q, k, v, seqlens_k, leftpad_k)]
    out, lse = fa3.run(q, k, v, causal=True, softmax_scale=0.1, seqlens_k=seqlens_k, leftpad_k=leftpad_k)
    assert_attention_ok(out, lse, q, k, v, True, 0.1, seqlens_k=seqlens_k, leftpad_k=leftpad_k)
    for was, now in zip(before, (q, k, v, seqlens_k, leftpad_k)):  # the padding's NaN included
        torch.testing.assert_close(now, was, rtol=0, atol=0, equal_nan=True)


def _fresh(q, k, v, windows):
    """New queries and cache, NaN outside each new window (what a reused cache may hold there)."""
    for t in (q, k, v):
        t.copy_(torch.randn_like(t))
    for b, (start, end) in enumerate(windows):
        for t in (k, v):
            t[b, :start], t[b, end:] = float("nan"), float("nan")


@pytest.mark.parametrize("backend", ["fa3", "fa2"])
def test_api_replays_in_a_cuda_graph(backend):
    """``fa_variants.attention(seqlens_k=..., leftpad_k=...)`` captured once in a CUDA graph (no host read-back),
    then replayed with new windows, queries and cache written into the same tensors: each replay's result is the new
    one (the kernels read the windows at each launch)."""
    import fa_variants

    windows = [(300, 1023), (0, 1), (5, 5), (1000, 1023)]
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache(windows, 1, 1023, 32, 8, 128, device="cuda")
    run = lambda: fa_variants.attention(q, k, v, causal=True, backend=backend, return_lse=True,  # noqa: E731
                                        seqlens_k=seqlens_k, leftpad_k=leftpad_k)
    out, lse = run()  # compile and plan outside the capture
    assert_attention_ok(out, lse, q, k, v, True, seqlens_k=seqlens_k, leftpad_k=leftpad_k)
    graph, [(out, lse)] = capture_graph(run)
    for windows in ([(1, 1023), (0, 1023), (512, 1000), (0, 0)], [(129, 130), (128, 256), (127, 1023), (2, 3)]):
        seqlens_k.copy_(torch.tensor([e for _, e in windows], dtype=torch.int32))
        leftpad_k.copy_(torch.tensor([s for s, _ in windows], dtype=torch.int32))
        _fresh(q, k, v, windows)
        graph.replay()
        torch.cuda.synchronize()
        assert_attention_ok(out, lse, q, k, v, True, seqlens_k=seqlens_k, leftpad_k=leftpad_k,
                            what=f"replay {windows}")


def test_api_fa1_runs_one_call_per_window():
    """fa1 reads no window in its kernel: one call per distinct window, eagerly."""
    import fa_variants

    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache([(5, 300), (0, 0), (5, 300), (299, 300)], 3, 300, 4, 2, 64,
                                                      device="cuda")
    out, lse = fa_variants.attention(q, k, v, causal=True, backend="fa1", return_lse=True, seqlens_k=seqlens_k,
                                     leftpad_k=leftpad_k)
    assert_attention_ok(out, lse, q, k, v, True, seqlens_k=seqlens_k, leftpad_k=leftpad_k)


@pytest.mark.parametrize("mode", ["cudnn", "flash"])
@pytest.mark.parametrize("backend", ["fa3", "fa2"])
def test_fused_gradients_window_by_window(gpu_variant, monkeypatch, backend, mode):
    """A loss of out alone: the fused backward once per distinct window (``backward._backward_by_length``), K and V
    cut to it, eagerly and under torch.compile (fullgraph: the seqlens_k op with leftpad_k, its backward the lengths
    op); gradients finite, within the rule against float64 (the same maths in bf16 the baseline), 0 outside each
    window."""
    monkeypatch.setenv("FA_VARIANTS_BACKWARD", mode)
    gpu_variant(backend)
    fused = count_fused_backwards(monkeypatch)
    windows = [(30, 300), (0, 300), (30, 300), (250, 251), (7, 7), (100, 299)]
    q, k, v, seqlens_k, leftpad_k = windowed_kv_cache(windows, 37, 300, 8, 2, 128, dtype=BF16, device="cuda")
    k, v = k.nan_to_num(), v.nan_to_num()  # (the reference baselines' autograd would carry NaN through 0 * NaN)
    grad_out = torch.randn(q.shape, dtype=BF16, device="cuda")
    kwargs = dict(causal=True, seqlens_k=seqlens_k, leftpad_k=leftpad_k)
    same, exact = same_and_exact_grads(q, k, v, grad_out, **kwargs)
    for got, calls in grads_eager_and_compiled(q, k, v, grad_out, fused, backend=backend, **kwargs):
        assert calls == 3, calls  # windows of 270, 300 and 199 keys (1 and 0 keys: below 37 rows)
        assert all(g.isfinite().all() for g in got)
        assert_grads_within_rule(got, same, exact)
        for b, (start, end) in enumerate(windows):
            for g in got[1:]:
                assert not g[b, :start].any() and not g[b, end:].any()


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_sdpa_decoding_steps_of_a_left_padded_batch_under_compile(mode):
    """The SDPA drop-in's decoding step (one query row, no grad) with a left-padded batch's mask under
    torch.compile(fullgraph=True): ``torch.ops.fa_variants.mask_window`` reads each step's windows when the graph
    runs and the attention op runs the leftpad_k kernel (inside reduce-overhead's CUDA graphs); every step, with new
    paddings, queries and cache, within the rule against float64 over each window."""
    import fa_variants

    batch, seqlen_k = 4, 1023
    q = torch.empty(batch, 32, 1, 128, dtype=BF16, device="cuda")
    k, v = (torch.empty(batch, 8, seqlen_k, 128, dtype=BF16, device="cuda") for _ in range(2))
    keys = torch.arange(seqlen_k, device="cuda")
    step = torch.compile(lambda q, k, v, mask: fa_variants.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                                         enable_gqa=True),
                         fullgraph=True, mode=mode)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            for pads in ([0, 5, 1022, 300], [128, 0, 0, 1023], [7, 900, 129, 1]):
                for t in (q, k, v):
                    t.copy_(torch.randn_like(t))
                mask = torch.stack([keys >= p for p in pads])[:, None, None]
                out = step(q, k, v, mask).clone()
                ends = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
                starts = torch.tensor(pads, dtype=torch.int32, device="cuda")
                assert_attention_ok(out.transpose(1, 2), None, q.transpose(1, 2), k.transpose(1, 2),
                                    v.transpose(1, 2), True, seqlens_k=ends, leftpad_k=starts, what=f"pads {pads}")
    finally:
        torch._dynamo.reset()
