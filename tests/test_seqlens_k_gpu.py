"""Per-sequence KV lengths read by the fa3 and fa2 kernels (``Sm90Config.seqlens_k`` / ``Sm80Config.seqlens_k``,
``lengths_config``) on an sm90 GPU (fa2's sm80 code runs there): one launch for a batch of any lengths, against
float64 attention over each sequence's first keys. The KV cache past each length holds NaN
(``helpers.padded_kv_cache``): fa3 loads the tile that crosses a length and must neither use its keys (masked) nor
let its V rows reach O (cleared in shared memory); fa2 does not read those rows (zero-filled). Prefill and decode
shapes, causal or not, GQA, every head dim, fp16, split-KV (the merge kernel and fa3's fused merge), packed GQA,
CUDA graph capture with new lengths at each replay; the API's routing (in-kernel on fa3 and fa2, fa1 per length
and refused inside capture)."""

import pytest
import torch
from helpers import assert_attention_ok, padded_kv_cache, sm90_only, split_decode_config

from fa_variants.bench.decode import capture_graph

pytestmark = sm90_only("fa3 with seqlens_k")
fa3 = pytest.importorskip("fa_variants.hopper.fa3")
fa2 = pytest.importorskip("fa_variants.ampere.fa2")
MODULES = {"fa3": fa3, "fa2": fa2}

BF16, F16 = torch.bfloat16, torch.float16


@pytest.fixture(autouse=True)
def poisoned(poisoned_workspace):
    """NaN-filled allocations and a fresh split scratch per test (conftest.poisoned_workspace)."""


# (lengths, seqlen_q, seqlen_k, heads, heads_kv): lengths 0 and 1, tile boundaries (127 / 128 / 129, 255), odd
# lengths, the full padded length, Nq > a length (causal rows that see no key), GQA and MQA
PREFILL = [
    ([0, 1, 127, 128, 129, 300], 77, 300, 4, 2),
    ([1023, 5, 600, 0], 1023, 1023, 2, 2),
    ([255, 17], 300, 4224, 6, 1),
    ([113, 113, 4000], 113, 4224, 8, 2),
]


@pytest.mark.parametrize("backend", ["fa3", "fa2"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("case", PREFILL, ids=[f"{len(c[0])}x{c[1]}x{c[2]}" for c in PREFILL])
def test_prefill_lengths_in_the_kernel(case, head_dim, causal, backend):
    lengths, nq, nk, h, hkv = case
    q, k, v, seqlens_k = padded_kv_cache(lengths, nq, nk, h, hkv, head_dim, device="cuda")
    scale = head_dim ** -0.5
    module = MODULES[backend]
    config = module.lengths_config(q, k, causal)
    assert config.seqlens_k and not getattr(config, "persistent", False)
    out, lse = module.run(q, k, v, causal=causal, softmax_scale=scale, seqlens_k=seqlens_k)
    assert_attention_ok(out, lse, q, k, v, causal, scale, seqlens_k=seqlens_k,
                        what=f"{backend} D={head_dim} causal={causal} lengths={lengths}")


def test_fp16_and_the_callers_tensors_untouched():
    q, k, v, seqlens_k = padded_kv_cache([3, 0, 200], 129, 257, 4, 1, 128, dtype=F16, device="cuda")
    before = [t.clone() for t in (q, k, v, seqlens_k)]
    out, lse = fa3.run(q, k, v, causal=True, softmax_scale=0.1, seqlens_k=seqlens_k)
    assert_attention_ok(out, lse, q, k, v, True, 0.1, seqlens_k=seqlens_k)
    for was, now in zip(before, (q, k, v, seqlens_k)):  # the padding's NaN included
        torch.testing.assert_close(now, was, rtol=0, atol=0, equal_nan=True)


DECODE = [([0, 1, 113, 1023, 500, 1], 1, 1023, 32, 8, 128), ([4096, 4000, 1, 2049], 4, 4096, 32, 8, 64),
          ([8191, 3, 0], 16, 8192, 64, 8, 128), ([300, 299], 1, 300, 8, 2, 256)]


@pytest.mark.parametrize("split", ["fa3-auto", "fa3-merge-kernel", "fa3-fused", "fa2-auto", "fa2-split3"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", DECODE, ids=[f"{len(c[0])}x{c[1]}x{c[2]}-d{c[5]}" for c in DECODE])
def test_decode_lengths_split_and_packed(case, causal, split):
    """Decode shapes on `auto`'s split / packed configs, and with a fixed split count through the merge kernel or
    fa3's fused merge: splits past a sequence's length get no tile (LSE -inf, ignored by the merge)."""
    lengths, nq, nk, h, hkv, d = case
    q, k, v, seqlens_k = padded_kv_cache(lengths, nq, nk, h, hkv, d, device="cuda")
    module, config = split_decode_config(split, q, k, causal)
    out, lse = module.run(q, k, v, causal=causal, softmax_scale=0.09, config=config, seqlens_k=seqlens_k)
    assert_attention_ok(out, lse, q, k, v, causal, 0.09, seqlens_k=seqlens_k, what=f"{split} lengths={lengths}")


def _nan_past(k, v, lengths):
    """Fresh keys and values in the cache, NaN past each sequence's length (what a reused cache may hold there)."""
    for t in (k, v):
        t.copy_(torch.randn_like(t))
    for b, n in enumerate(lengths):
        k[b, n:], v[b, n:] = float("nan"), float("nan")


@pytest.mark.parametrize("backend", ["fa3", "auto", "fa2"])
def test_api_replays_in_a_cuda_graph(backend):
    """``fa_variants.attention(seqlens_k=...)`` on fa3 (auto's choice here) and fa2: captured once in a CUDA graph
    (no host read-back of the lengths), then replayed with new lengths, queries and cache (NaN past each new length)
    written into the same tensors: each replay's result is the new one."""
    import fa_variants

    q, k, v, seqlens_k = padded_kv_cache([700, 1, 0, 1023], 1, 1023, 32, 8, 128, device="cuda")
    run = lambda: fa_variants.attention(q, k, v, causal=True, backend=backend, return_lse=True,  # noqa: E731
                                        seqlens_k=seqlens_k)
    out, lse = run()  # compile and plan outside the capture
    assert_attention_ok(out, lse, q, k, v, True, seqlens_k=seqlens_k)
    graph, [(out, lse)] = capture_graph(run)
    for lengths in ([1, 1023, 512, 0], [129, 128, 127, 2]):
        seqlens_k.copy_(torch.tensor(lengths, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        _nan_past(k, v, lengths)
        graph.replay()
        torch.cuda.synchronize()
        assert_attention_ok(out, lse, q, k, v, True, seqlens_k=seqlens_k, what=f"replay {lengths}")


@pytest.mark.parametrize("backend", ["fa3", "fa2"])
def test_plain_and_length_calls_of_one_shape_keep_their_own_plans(backend, monkeypatch):
    """A call without seqlens_k after one with it (same q, k, v) runs the default kernel, and the reverse; a module
    switch flipped after the first call with lengths (SPLIT_KV_ENABLED) makes the next one plan again under it, as a
    call without lengths does (``common.launch.launcher``)."""
    import fa_variants
    from fa_variants import dispatch

    module = MODULES[backend]
    monkeypatch.setattr(dispatch, "PLANS", {})  # this test's plans only (a worker's earlier tests leave theirs)
    q, k, v, seqlens_k = padded_kv_cache([1023, 1023], 1, 1023, 32, 8, 128, device="cuda")
    k, v = k.nan_to_num(), v.nan_to_num()
    plain = fa_variants.attention(q, k, v, causal=True, backend=backend)
    ragged = fa_variants.attention(q, k, v, causal=True, backend=backend, seqlens_k=seqlens_k)
    again = fa_variants.attention(q, k, v, causal=True, backend=backend)
    assert torch.equal(plain, again)
    torch.testing.assert_close(ragged, plain, atol=2e-2, rtol=0)  # full lengths: the same attention
    entry = next(e for key, e in dispatch.PLANS.items() if key and key[0] == "seqlens_k")
    monkeypatch.setattr(module, "SPLIT_KV_ENABLED", not module.SPLIT_KV_ENABLED)
    out = fa_variants.attention(q, k, v, causal=True, backend=backend, seqlens_k=seqlens_k)
    assert_attention_ok(out, None, q, k, v, True, seqlens_k=seqlens_k)
    [fresh] = [e for key, e in dispatch.PLANS.items() if key and key[0] == "seqlens_k"]  # replaced, same key
    assert fresh is not entry and fresh[1] == module.VARIANT.switches()


def test_api_fa1_reads_the_lengths_back_and_refuses_capture():
    """fa1 keeps the per-length launches (lengths read back: correct eagerly), and under CUDA-graph capture names
    the backends whose kernels read the lengths."""
    import fa_variants

    q, k, v, seqlens_k = padded_kv_cache([5, 0, 300], 3, 300, 4, 2, 64, device="cuda")
    out, lse = fa_variants.attention(q, k, v, causal=True, backend="fa1", return_lse=True, seqlens_k=seqlens_k)
    assert_attention_ok(out, lse, q, k, v, True, seqlens_k=seqlens_k)
    with pytest.raises(NotImplementedError, match="needs the fa3 or fa2 backend"):
        capture_graph(lambda: fa_variants.attention(q, k, v, backend="fa1", seqlens_k=seqlens_k))


@pytest.mark.parametrize("grad_mode", [False, True], ids=["no_grad", "grad_mode"])
def test_torch_compile_reduce_overhead_replays_new_lengths(grad_mode):
    """Under ``torch.compile(fullgraph=True, mode="reduce-overhead")`` the call is the opaque op
    ``fa_variants::attention_seqlens_k`` inside torch's CUDA graph: new lengths and queries at each call, the new
    result each time; under torch.no_grad() and in grad mode (inputs that do not require grad)."""
    import fa_variants

    torch._dynamo.reset()
    torch.set_grad_enabled(grad_mode)
    try:
        _compiled_replays(fa_variants)
    finally:
        torch.set_grad_enabled(True)


def _compiled_replays(fa_variants):
    q, k, v, seqlens_k = padded_kv_cache([700, 1, 0, 1023], 1, 1023, 32, 8, 128, device="cuda")
    fn = lambda q, k, v, n: fa_variants.attention(q, k, v, causal=True, seqlens_k=n, return_lse=True)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, mode="reduce-overhead")
    for lengths in ([700, 1, 0, 1023], [1, 1023, 512, 0], [129, 128, 127, 2], [5, 6, 7, 8]):
        seqlens_k.copy_(torch.tensor(lengths, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        _nan_past(k, v, lengths)
        out, lse = compiled(q, k, v, seqlens_k)
        assert_attention_ok(out.clone(), lse.clone(), q, k, v, True, seqlens_k=seqlens_k, what=f"compiled {lengths}")


@pytest.mark.parametrize("backend", ["fa3", "fa2"])
def test_api_split_options_with_lengths(backend):
    """``attention(num_splits=3, pack_gqa=..., seqlens_k=...)``: the caller's split count and packing, the lengths
    read by the kernel."""
    import fa_variants

    q, k, v, seqlens_k = padded_kv_cache([0, 1, 113, 1023], 1, 1023, 32, 8, 128, device="cuda")
    for pack in (False, True):
        out, lse = fa_variants.attention(q, k, v, causal=True, backend=backend, return_lse=True, num_splits=3,
                                         pack_gqa=pack, seqlens_k=seqlens_k)
        assert_attention_ok(out, lse, q, k, v, True, seqlens_k=seqlens_k, what=f"{backend} pack_gqa={pack}")



def test_e4m3_inputs_give_bfloat16_whatever_the_lengths(fp8_kernel):
    """e4m3 inputs (auto: fa3-fp8, one call per distinct length) with seqlens_k: O in bfloat16, as without lengths,
    for mixed, equal and all-zero lengths and an empty cache (before session 25, read in the code: mixed lengths
    failed in index_copy_, all-zero lengths returned e4m3 zeros); each sequence within FP8's noise of float64 attention over its dequantised keys,
    rows that see no key 0 with LSE -inf."""
    import fa_variants
    from fa_variants.reference import attention_reference, rel_l2

    make = lambda *shape: torch.randn(*shape, device="cuda").to(torch.float8_e4m3fn)  # noqa: E731
    q, k, v = make(2, 16, 4, 64), make(2, 300, 2, 64), make(2, 300, 2, 64)
    for lengths in ([3, 300], [129, 129], [0, 0], [0, 57]):
        seqlens_k = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        out, lse = fa_variants.attention(q, k, v, causal=True, return_lse=True, seqlens_k=seqlens_k)
        assert out.dtype == torch.bfloat16, (lengths, out.dtype)
        ref, ref_lse = attention_reference(q.float(), k.float(), v.float(), causal=True, seqlens_k=seqlens_k,
                                           dtype=torch.float64)
        for b, n in enumerate(lengths):
            dark = torch.isneginf(ref_lse[b])  # (heads, rows): rows that see no key
            assert (out[b].transpose(0, 1)[dark] == 0).all() and torch.isneginf(lse[b][dark]).all(), (lengths, b)
            if n:
                assert rel_l2(out[b].float(), ref[b]) < 0.08, (lengths, b)
    empty = fa_variants.attention(q, k[:, :0], v[:, :0])
    assert empty.dtype == torch.bfloat16 and (empty == 0).all()


@pytest.mark.parametrize("seqlen_q", [1, 4])
def test_broadcast_kv_with_packed_gqa(seqlen_q):
    """K/V expanded across the 32 query heads (stride 0: MQA on their first head) with pack_gqa=True on fa3, and
    auto with seqlens_k: the config is made for the one head the kernel reads (before session 25, read in the
    code: at seqlen_q 4 it was made for the expanded heads, which the launch refuses)."""
    import fa_variants

    q = torch.randn(2, seqlen_q, 32, 128, device="cuda", dtype=BF16)
    k1, v1 = (torch.randn(2, 1000, 1, 128, device="cuda", dtype=BF16) for _ in range(2))
    k, v = k1.expand(2, 1000, 32, 128), v1.expand(2, 1000, 32, 128)
    out, lse = fa_variants.attention(q, k, v, causal=True, backend="fa3", pack_gqa=True, return_lse=True)
    assert_attention_ok(out, lse, q, k1, v1, True)
    seqlens_k = torch.tensor([1000, 333], dtype=torch.int32, device="cuda")
    out, lse = fa_variants.attention(q, k, v, causal=True, return_lse=True, seqlens_k=seqlens_k)
    assert_attention_ok(out, lse, q, k1, v1, True, seqlens_k=seqlens_k)


@pytest.mark.parametrize("backend", ["fa3", "fa2"])
def test_lengths_kept_on_the_cpu(backend):
    """seqlens_k on the CPU for CUDA inputs: checked on the host, copied without a device sync; the same output as
    the same lengths on the GPU (the same kernel), a pinned tensor changed right after the call does not change the
    result, out-of-range values raise on the host, and CUDA-graph capture refuses host lengths in one line."""
    import fa_variants

    q, k, v, on_gpu = padded_kv_cache([700, 1, 0, 1023], 1, 1023, 32, 8, 128, device="cuda")
    run = lambda n: fa_variants.attention(q, k, v, causal=True, backend=backend, seqlens_k=n)  # noqa: E731
    expected = run(on_gpu)
    assert_attention_ok(expected, None, q, k, v, True, seqlens_k=on_gpu)
    assert torch.equal(run(on_gpu.cpu()), expected)
    pinned = on_gpu.cpu().pin_memory()
    out = run(pinned)
    pinned.fill_(3)  # the call copied it already
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
    with pytest.raises(ValueError, match="seqlens_k holds 1024"):
        run(torch.tensor([1024, 1, 0, 5], dtype=torch.int32))
    on_host = on_gpu.cpu()  # made before the capture (a device-to-host copy is not capturable)
    with pytest.raises(ValueError, match="on the CPU inside CUDA-graph capture"):
        capture_graph(lambda: run(on_host))


@pytest.mark.parametrize("causal", [False, True], ids=["key-padding", "static-cache"])
def test_sdpa_attn_mask_as_lengths_on_the_kernels(causal):
    """SDPA's attn_mask read as causal + seqlens_k (``common.mask_lengths``) reaches the kernel's lengths path: a
    static-cache mask (bottom-right causal against each filled length) and a key-padding one, NaN in the cache past
    each length, against float64 over each sequence's first keys, eagerly and under torch.compile(fullgraph=True);
    the mask read inside CUDA-graph capture is refused in one line."""
    import fa_variants

    lengths, nq, nk = [300, 0, 1, 129], (4 if causal else 77), 300
    q, k, v, seqlens_k = padded_kv_cache(lengths, nq, nk, 8, 2, 128, device="cuda")
    keys, rows = torch.arange(nk, device="cuda"), torch.arange(nq, device="cuda")[:, None]
    limit = seqlens_k[:, None, None].long() + ((rows - nq) if causal else -1)
    mask = (keys <= limit)[:, None]  # (batch, 1, seqlen_q or 1, seqlen_k)
    out = fa_variants.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   attn_mask=mask, enable_gqa=True).transpose(1, 2)
    assert_attention_ok(out, None, q, k, v, causal, seqlens_k=seqlens_k, what=f"attn_mask causal={causal}")
    torch._dynamo.reset()  # under torch.compile(fullgraph=True), no grad: torch.ops.fa_variants.sdpa_masked_windows
    compiled = torch.compile(fa_variants.scaled_dot_product_attention, fullgraph=True)
    with torch.no_grad():
        out = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                       enable_gqa=True).transpose(1, 2)
    torch._dynamo.reset()
    assert_attention_ok(out, None, q, k, v, causal, seqlens_k=seqlens_k, what=f"compiled, attn_mask causal={causal}")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), pytest.raises(ValueError, match="^attn_mask: .*inside CUDA-graph capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
            fa_variants.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     attn_mask=mask, enable_gqa=True)


@pytest.mark.parametrize("backend", ["fa3", "fa2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_windows_on_the_kernels(backend, side):
    """The SDPA drop-in's attn_mask of a padded causal batch (left: a prompt batch; right: a training batch; lengths
    0 .. 300 of 300 tokens, head_dim 128, GQA 8:2, bf16) runs as one key window per sequence on the kernel
    (``fa_variants.windowed``: one call, right padding with seqlens_q since session 55; calls on slices before),
    output and gradients within the rule against float64 masked attention,
    with the same maths in bf16 (PyTorch, the mask applied) as the baseline; rows that see no key give 0."""
    import fa_variants
    from helpers import assert_grads_within_rule

    lengths, n = [300, 1, 131, 0, 64], 300
    rows, keys = torch.arange(n, device="cuda")[:, None], torch.arange(n, device="cuda")
    pad = [n - m for m in lengths]
    mask = torch.stack([(keys >= p) & (keys <= rows) if side == "left" else (keys < m) & (keys <= rows)
                        for p, m in zip(pad, lengths)])[:, None]
    q = torch.randn(len(lengths), 8, n, 128, dtype=BF16, device="cuda")
    k, v = (torch.randn(len(lengths), 2, n, 128, dtype=BF16, device="cuda") for _ in range(2))
    grad = torch.randn_like(q)

    def masked(q, k, v):  # attention with the mask in q's dtype's maths (float32 softmax for bf16), 0 where none
        kf, vf = (t.repeat_interleave(4, 1).to(q.dtype) for t in (k, v))
        s = (q @ kf.transpose(-1, -2)).float() * 128 ** -0.5
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0).to(q.dtype)
        return p @ vf

    results = []
    for run, dtype in ((lambda q, k, v: fa_variants.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=True, backend=backend), BF16), (masked, BF16), (masked, torch.float64)):
        leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
        out = run(*leaves)
        results.append((out, torch.autograd.grad(out, leaves, grad.to(dtype))))
    (out, grads), (same, same_grads), (exact, exact_grads) = results
    err, same_err = ((o.double() - exact).abs().max().item() for o in (out, same))
    assert out.isfinite().all() and err <= 2 * same_err + 1e-3, (err, same_err)
    assert not out[3].any()  # the sequence of length 0
    assert_grads_within_rule(grads, same_grads, exact_grads)
