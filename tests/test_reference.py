"""The references and the tolerance rule, against a naive row-by-row formula written independently."""
import math

import pytest
import torch

import fa_variants
from fa_variants import reference as ref
from fa_variants.reference import (attention_reference, check_against_reference, check_lse, max_abs_error,
                                   references)


def naive_attention(q, k, v, causal=False, scale=None):
    """Row by row in float64, heads repeated: softmax over the keys each query row may see."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    k = k.double().repeat_interleave(heads // heads_kv, dim=2)
    v = v.double().repeat_interleave(heads // heads_kv, dim=2)
    q = q.double()
    out = torch.zeros(batch, seqlen_q, heads, v.shape[-1], dtype=torch.float64)
    lse = torch.full((batch, heads, seqlen_q), -math.inf, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(seqlen_q):
                n = min(seqlen_k, i + seqlen_k - seqlen_q + 1) if causal else seqlen_k
                if n <= 0:
                    continue
                s = (k[b, :n, h] @ q[b, i, h]) * scale
                mx = s.max()
                w = torch.exp(s - mx)
                lse[b, h, i] = mx + torch.log(w.sum())
                out[b, i, h] = (w / w.sum()) @ v[b, :n, h]
    return out, lse


def rand(*shape, dtype=torch.float64, std=1.0):
    return torch.randn(*shape, dtype=torch.float64).mul(std).to(dtype)


SHAPES = [  # (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim)
    (1, 1, 1, 1, 1, 8),
    (2, 13, 29, 6, 2, 24),   # GQA 3:1, Nq < Nk
    (2, 29, 13, 6, 1, 16),   # MQA, Nq > Nk: causal leaves rows empty
    (1, 7, 7, 4, 4, 33),     # odd head_dim
    (3, 33, 1, 2, 2, 8),     # Nk = 1
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}_Nq{}_Nk{}_H{}_Hkv{}_D{}".format(*s))
def test_float64_matches_naive(shape, causal):
    batch, nq, nk, heads, heads_kv, d = shape
    q, k, v = rand(batch, nq, heads, d), rand(batch, nk, heads_kv, d), rand(batch, nk, heads_kv, d)
    out, lse = attention_reference(q, k, v, causal=causal)
    want_out, want_lse = naive_attention(q, k, v, causal)
    assert out.dtype == lse.dtype == torch.float64
    assert out.shape == q.shape and lse.shape == (batch, heads, nq)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scale", [0.0, -0.125, 1e-8, 1, 10.0])
@pytest.mark.parametrize("causal", [False, True])
def test_scales_match_naive(scale, causal):
    """EC-20 on the reference itself: zero, negative, tiny, int and large scales, q and k ~ N(0, 4^2)."""
    q, k, v = rand(1, 64, 2, 64, std=4), rand(1, 64, 2, 64, std=4), rand(1, 64, 2, 64)
    out, lse = attention_reference(q, k, v, causal=causal, softmax_scale=scale)
    want_out, want_lse = naive_attention(q, k, v, causal, float(scale))
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out, want_out, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(lse, want_lse, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e38, -2e38, 1e307])
@pytest.mark.parametrize("causal", [False, True])
def test_scale_whose_products_overflow_gives_the_argmax(dtype, scale, causal):
    """|scale * s| beyond the dtype's range: softmax is then one-hot at the row's arg max of sign(scale) s
    (finite, never inf - inf = NaN), and LSE = max(scale * s), inf where that overflows the dtype."""
    if abs(scale) > torch.finfo(dtype).max:
        pytest.skip("scale beyond the dtype's range")
    q, k, v = rand(1, 9, 2, 16).to(dtype), rand(1, 6, 2, 16).to(dtype), rand(1, 6, 2, 16).to(dtype)
    out, lse = attention_reference(q, k, v, causal=causal, softmax_scale=scale, dtype=dtype)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * math.copysign(1.0, scale)
    if causal:
        s = s.masked_fill(~ref.causal_visible(9, 6), -math.inf)
    best = s.argmax(-1)  # (B, H, Nq)
    want = torch.gather(v.double().permute(0, 2, 1, 3), 2, best.unsqueeze(-1).expand(-1, -1, -1, 16))
    want = want.permute(0, 2, 1, 3)  # (B, Nq, H, D)
    empty = torch.isneginf(s.amax(-1))  # rows that see no key (causal with Nq > Nk)
    want = torch.where(empty.permute(0, 2, 1).unsqueeze(-1), torch.zeros_like(want), want)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-6)
    assert torch.isneginf(lse[empty]).all()
    want_lse = (s.amax(-1) * abs(scale)).to(dtype)
    # the row max of raw scores, times |scale|: scores rounded in dtype (about 1e-5 absolute for these)
    torch.testing.assert_close(lse[~empty], want_lse[~empty], rtol=1e-5, atol=1e-4 * abs(scale))


@pytest.mark.parametrize("causal", [False, True])
def test_scale_zero_averages_visible_values(causal):
    q, k, v = rand(1, 8, 2, 16), rand(1, 8, 2, 16), rand(1, 8, 2, 16)
    out, _ = attention_reference(q, k, v, causal=causal, softmax_scale=0.0)
    counts = torch.arange(1, 9, dtype=torch.float64).view(1, 8, 1, 1)
    want = v.cumsum(1) / counts if causal else v.mean(1, keepdim=True).expand_as(v)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


def test_ec01_bottom_right_rows_see_the_right_keys():
    """EC-01(a): Nq=3, Nk=7: row 0 sees keys 0-4, row 1 keys 0-5, row 2 keys 0-6."""
    q, k, v = rand(1, 3, 2, 64), rand(1, 7, 2, 64), rand(1, 7, 2, 64)
    out, _ = attention_reference(q, k, v, causal=True)
    for row, n in enumerate((5, 6, 7)):
        alone, _ = attention_reference(q[:, row:row + 1], k[:, :n], v[:, :n])
        torch.testing.assert_close(out[:, row:row + 1], alone, rtol=0, atol=1e-12)


def test_ec01_suffix_of_queries_is_unchanged():
    """EC-01(c): only bottom-right alignment makes the last rows independent of the earlier queries."""
    q, k, v = rand(2, 40, 2, 16), rand(2, 40, 2, 16), rand(2, 40, 2, 16)
    full, _ = attention_reference(q, k, v, causal=True)
    tail, _ = attention_reference(q[:, -9:], k, v, causal=True)
    torch.testing.assert_close(full[:, -9:], tail, rtol=0, atol=1e-12)


def test_ec07c_single_key_gives_its_value():
    q, k, v = rand(2, 7, 4, 32), rand(2, 1, 4, 32), rand(2, 1, 4, 32)
    out, _ = attention_reference(q, k, v)
    assert torch.equal(out, v.expand_as(out))


def test_empty_rows_are_zero_with_lse_minus_inf():
    q, k, v = rand(1, 10, 2, 8), rand(1, 4, 2, 8), rand(1, 4, 2, 8)
    out, lse = attention_reference(q, k, v, causal=True)
    assert torch.equal(out[:, :6], torch.zeros_like(out[:, :6]))
    assert torch.isneginf(lse[:, :, :6]).all() and torch.isfinite(lse[:, :, 6:]).all()
    assert not torch.isnan(out).any()


def test_a_row_whose_scores_are_all_minus_inf_sees_no_key():
    """README "Non-finite values": a row whose every visible score is exactly -inf (q = 1 against keys of -inf) is
    answered as a fully masked row, O = 0 and LSE -inf, while a score of +inf makes the row NaN (session 28's
    break-it pass found the first undocumented). The other row of the batch is unaffected."""
    q = torch.tensor([1.0, 1.0], dtype=torch.float64).reshape(1, 2, 1, 1)
    k = torch.tensor([-math.inf, -math.inf], dtype=torch.float64).reshape(1, 2, 1, 1)
    v = torch.tensor([5.0, 7.0], dtype=torch.float64).reshape(1, 2, 1, 1)
    out, lse = attention_reference(q, k, v, softmax_scale=1.0)
    assert (out == 0).all() and torch.isneginf(lse).all()
    out, lse = attention_reference(q, -k, v, softmax_scale=1.0)
    assert out.isnan().all()
    k2 = torch.tensor([-math.inf, 3.0], dtype=torch.float64).reshape(1, 2, 1, 1)
    out, lse = attention_reference(q, k2, v, softmax_scale=1.0, causal=True)  # row 0 sees key 0 only
    assert out[0, 0, 0, 0] == 0 and torch.isneginf(lse[0, 0, 0]) and out[0, 1, 0, 0] == 7.0


@pytest.mark.parametrize("dims", [(0, 5, 3, 2), (2, 0, 3, 2), (2, 5, 0, 2), (2, 5, 3, 0)],
                         ids=["B0", "Nq0", "Nk0", "H0"])
def test_empty_inputs(dims):
    batch, nq, nk, heads = dims
    q, k, v = rand(batch, nq, heads, 8), rand(batch, nk, max(heads, 1), 8), rand(batch, nk, max(heads, 1), 8)
    out, lse = attention_reference(q, k, v, causal=True)
    assert out.shape == (batch, nq, heads, 8) and lse.shape == (batch, heads, nq)
    assert not out.any() and torch.isneginf(lse).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_same_dtype_reference_is_low_precision_but_close(dtype):
    q, k, v = (rand(2, 50, 4, 64, dtype=dtype) for _ in range(3))
    exact, exact_lse = attention_reference(q, k, v, causal=True)
    low, low_lse = attention_reference(q, k, v, causal=True, dtype=dtype)
    assert low.dtype == dtype and low_lse.dtype == torch.float32
    err = max_abs_error(low, exact)
    eps = torch.finfo(dtype).eps
    assert 0 < err < 20 * eps  # really rounded, and only by a few ulps
    assert max_abs_error(low_lse, exact_lse) < 20 * eps


def test_chunked_rows_match_one_chunk(monkeypatch):
    """Chunking the query rows changes the matmul shapes, so BLAS may block (and round) differently:
    the two agree to float64 rounding (seen: 1 ulp, 4.4e-16, on some CPUs), not bitwise."""
    q, k, v = rand(2, 37, 4, 16), rand(2, 23, 2, 16), rand(2, 23, 2, 16)
    whole = attention_reference(q, k, v, causal=True)
    monkeypatch.setattr(ref, "_MAX_SCORE_ELEMENTS", 2 * 4 * 23 * 5)  # 5 query rows per chunk
    chunked = attention_reference(q, k, v, causal=True)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_reference_backend_run_contract():
    q, k, v = (rand(1, 9, 2, 16, dtype=torch.bfloat16) for _ in range(3))
    out, lse = ref.run(q, k, v, causal=True, softmax_scale=0.25)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert check_against_reference(out, q, k, v, True, 0.25).ok


# ----------------------------------------------------------------------------------- the tolerance rule

@pytest.fixture
def case():
    q, k, v = (rand(2, 33, 4, 64, dtype=torch.float16) for _ in range(3))
    return q, k, v, references(q, k, v, causal=True)


def test_rule_accepts_a_correct_output(case):
    q, k, v, refs = case
    out, lse = ref.run(q, k, v, causal=True, softmax_scale=1 / 8)
    ok, err_kernel, err_torch, bound = check_against_reference(out, q, k, v, True, refs=refs)
    assert ok and err_kernel <= bound == 2 * err_torch + ref.ATOL
    assert check_lse(lse, q, k, v, True, refs=refs).ok



def test_rule_and_run_edges():
    """The rule fails where the same-dtype reference is not finite (its bound means nothing there), rel_l2 against a
    zero reference is the plain norm of x, and ``run``'s LSE is float32 (float64 inputs too) but float64 for a
    partial (context parallelism merges partials in it), out unrounded then."""
    assert not ref._rule(1.0, math.inf).ok and not ref._rule(math.nan, 1.0).ok and ref._rule(1.0, 1.0).ok
    assert ref.rel_l2(torch.tensor([3.0, 4.0]), torch.zeros(2)) == 5.0
    q, k, v = (torch.randn(1, 3, 2, 8, dtype=torch.float64) for _ in range(3))
    out, lse = ref.run(q, k, v, causal=True, softmax_scale=0.5)
    assert out.dtype == torch.float64 and lse.dtype == torch.float32
    out, lse = ref.run(q.half(), k.half(), v.half(), causal=True, softmax_scale=0.5, partial=True)
    assert out.dtype == torch.float32 and lse.dtype == torch.float64

def test_rule_rejects_nan(case):
    q, k, v, refs = case
    out = refs.out.half()
    out[1, 5, 2, 7] = math.nan
    assert not check_against_reference(out, q, k, v, True, refs=refs).ok


def test_rule_rejects_a_top_left_causal_mask(case):
    """The rule has teeth: top-left alignment (query i sees keys <= i) differs for Nq < Nk."""
    q, k, v, _ = case
    k2, v2 = torch.cat([k, k[:, :7]], 1), torch.cat([v, v[:, :7]], 1)  # Nk = 40 > Nq = 33
    refs = references(q, k2, v2, causal=True)
    top_left = torch.cat([attention_reference(q[:, i:i + 1], k2[:, :i + 1], v2[:, :i + 1])[0]
                          for i in range(q.shape[1])], 1)
    check = check_against_reference(top_left.half(), q, k2, v2, True, refs=refs)
    assert not check.ok and check.err_kernel > 10 * check.bound


def test_rule_rejects_a_small_but_real_error(case):
    q, k, v, refs = case
    check = check_against_reference(refs.out.half(), q, k, v, True, refs=refs)
    assert check.ok
    nudged = refs.out.clone()
    nudged[0, 0, 0, 0] += 3 * check.bound
    assert not check_against_reference(nudged.half(), q, k, v, True, refs=refs).ok


def test_lse_rule_needs_minus_inf_on_empty_rows():
    q, k, v = (rand(1, 12, 2, 16, dtype=torch.bfloat16) for _ in range(3))
    k, v = k[:, :5], v[:, :5]
    refs = references(q, k, v, causal=True)
    lse = refs.lse.float()
    assert check_lse(lse, q, k, v, True, refs=refs).ok
    lse[0, 0, 0] = -1e30  # a finite "-inf" sentinel is wrong
    assert not check_lse(lse, q, k, v, True, refs=refs).ok


def test_max_abs_error_edge_values():
    inf = math.inf
    assert max_abs_error(torch.tensor([-inf, 1.0]), torch.tensor([-inf, 1.5])) == 0.5
    assert max_abs_error(torch.tensor([0.0]), torch.tensor([-inf])) == inf
    assert math.isnan(max_abs_error(torch.tensor([math.nan]), torch.tensor([0.0])))
    assert max_abs_error(torch.zeros(0, 3), torch.zeros(0, 3)) == 0.0
    with pytest.raises(ValueError, match="shape"):
        max_abs_error(torch.zeros(2), torch.zeros(3))


def test_fp8_has_no_same_dtype_reference():
    q = torch.zeros(1, 2, 1, 16).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="FP8"):
        references(q, q, q)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_masked_keys_contribute_exactly_zero_even_when_v_is_not_finite(dtype, bad):
    """EC: V = inf/NaN at a key that a causal row cannot see must not reach that row (0 * inf = NaN in a
    plain P V). Rows that see the key get a non-finite value, as the maths says; the other rows equal the
    output for a V whose hidden rows are replaced by finite values (checked against the naive loop)."""
    q, k, v = rand(2, 64, 4, 32), rand(2, 64, 2, 32), rand(2, 64, 2, 32)
    v[1, 40, 0] = bad           # one KV head of one batch: a whole V row
    v[0, 50, 1, 3] = bad        # a single element
    out, lse = attention_reference(q.to(dtype), k.to(dtype), v.to(dtype), causal=True, dtype=dtype)
    finite_v = torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0)
    expected, expected_lse = naive_attention(q.to(dtype), k.to(dtype), finite_v.to(dtype), causal=True)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 5e-2}[dtype]
    finite = torch.isfinite(out)
    # q heads 0, 1 read KV head 0; heads 2, 3 read KV head 1
    assert finite[1, :40, :2].all() and not finite[1, 40:, :2].all(-1).any()  # rows that see key 40
    assert finite[0, :50, 2:].all() and not finite[0, 50:, 2:, 3].any()  # rows that see the bad element
    assert finite[0, :, :2].all() and finite[1, :, 2:].all() and finite[0, 50:, 2:, :3].all()
    torch.testing.assert_close(out.double()[finite], expected[finite], rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=tol, atol=tol)  # V plays no part in LSE


def test_run_backward_matches_autograd():
    """The written-out backward (used by the custom op under torch.compile) against autograd through
    ``run``: GQA, causal with seqlen_q > seqlen_k (empty rows), a negative scale, gradients of both outputs.
    Different formula order: agreement to float64 rounding, not bitwise."""
    q, k, v = rand(2, 13, 6, 16), rand(2, 9, 2, 16), rand(2, 9, 2, 16)
    grad_out, grad_lse = rand(2, 13, 6, 16), rand(2, 6, 13, dtype=torch.float32)  # lse is float32
    for causal, scale in ((True, 0.3), (False, -0.7)):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, lse = ref.run(*leaves, causal=causal, softmax_scale=scale)
        # rows that see no key have lse -inf: their upstream LSE gradient cannot flow (0 by convention)
        finite = torch.isfinite(lse)
        expected = torch.autograd.grad((out, lse), leaves, (grad_out, torch.where(finite, grad_lse, 0)))
        got = ref.run_backward(grad_out, torch.where(finite, grad_lse, 0), q, k, v, causal=causal,
                               softmax_scale=scale)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("nq, nk", [(13, 9), (9, 13), (1, 5), (17, 17)])
def test_run_backward_in_query_chunks_equals_one_chunk(nq, nk):
    """The memory bound (``chunk_elements``: query rows in chunks, causal chunks cut at their last visible key)
    against one chunk: chunks of 1, 2 and 5 rows, GQA, causal and not (rows that see no key when Nq > Nk), a
    non-finite K and V behind the causal mask, per-sequence lengths. dK, dV are sums over the chunks in another
    order: equal to float64 rounding, not bitwise."""
    q, k, v = rand(2, nq, 6, 16), rand(2, nk, 2, 16), rand(2, nk, 2, 16)
    grad_out, grad_lse = rand(2, nq, 6, 16), rand(2, 6, nq)
    k[:, -1, 0, 3], v[:, -1, 1, 5] = math.inf, math.nan  # the last key: hidden from every causal row but the last
    lengths = torch.tensor([nk, max(0, nk - 3)], dtype=torch.int32)
    for causal, scale, seqlens_k in ((True, 0.3, None), (False, -0.7, None), (True, 0.5, lengths)):
        kk, vv = (k, v) if causal else (k.nan_to_num(), v.nan_to_num())
        whole = ref.run_backward(grad_out, grad_lse, q, kk, vv, causal=causal, softmax_scale=scale,
                                 seqlens_k=seqlens_k)
        for rows in (1, 2, 5):
            got = ref.run_backward(grad_out, grad_lse, q, kk, vv, causal=causal, softmax_scale=scale,
                                   seqlens_k=seqlens_k, chunk_elements=rows * 2 * 6 * nk)
            for g, e in zip(got, whole):
                torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12, equal_nan=True)
        assert whole[0][:, :nq - 1].isfinite().all() or not causal  # the mask kept the bad key out


@pytest.mark.parametrize("causal", ["no", 1, None, torch.tensor(True)])
def test_causal_must_be_a_bool(causal):
    """A truthy non-bool (the string "no") picked the causal mask without a word (session 27's break-it pass)."""
    q = torch.randn(1, 4, 1, 8)
    with pytest.raises(TypeError, match=r"^causal must be a bool, got "):
        attention_reference(q, q, q, causal=causal)


def test_reference_helpers_name_a_bad_argument():
    """The public helpers of fa_variants.reference gave AttributeError / raw torch errors for arguments of the
    wrong kind (a break-it pass, session 34): now a one-line TypeError / ValueError naming the argument."""
    import math

    from fa_variants import reference

    q = torch.randn(1, 4, 2, 8)
    out = reference.attention_reference(q, q, q)[0]
    cases = [
        (lambda: reference.check_against_reference([0.0], q, q, q), TypeError, r"^out must be a torch.Tensor, got list$"),
        (lambda: reference.check_lse((1,), q, q, q), TypeError, r"^lse must be a torch.Tensor, got tuple$"),
        (lambda: reference.check_against_reference(out.float(), q, q, q, refs=(1, 2, 3, 4)), TypeError,
         r"^refs must be a References"),
        (lambda: reference.max_abs_error([1.0], torch.zeros(1)), TypeError, r"^max_abs_error: x must be a torch.Tensor"),
        (lambda: reference.max_abs_error(torch.zeros(1), None), TypeError, r"^max_abs_error: ref must be a torch.Tensor"),
        (lambda: reference.default_softmax_scale("4"), TypeError, r"^head_dim must be an int, got '4'$"),
        (lambda: reference.default_softmax_scale(True), TypeError, r"^head_dim must be an int"),
        (lambda: reference.causal_visible(-1, 3), ValueError, r"^causal_visible: seqlen_q must be >= 0, got -1$"),
        (lambda: reference.causal_visible(4, 3, row_start=3, rows=2), ValueError, r"run past seqlen_q 4"),
    ]
    for call, exc, match in cases:
        with pytest.raises(exc, match=match):
            call()
    assert reference.default_softmax_scale(64) == 0.125
    assert reference.causal_visible(2, 3).tolist() == [[True, True, False], [True, True, True]]
    assert reference.check_against_reference(out.float(), q, q, q).ok
    assert math.isnan(reference.max_abs_error(torch.tensor([math.nan]), torch.zeros(1)))


def test_huge_finite_q_k_with_a_small_scale_are_not_nan():
    """|q|, |k| ~ 1e20 (finite) with softmax_scale 0 or 1e-30: the raw products overflowed to inf before the scale
    was applied and inf - inf made the rows NaN, where PyTorch's math SDPA (scale before the product) gives the
    exact answer (a break-it pass, session 34). |scale| < 1 is now folded into Q first; the forward's and the written
    backward's P agree."""
    import math

    import fa_variants
    from fa_variants import reference

    q = torch.full((1, 2, 1, 4), 1e20)
    k = torch.full((1, 3, 1, 4), 1e20)
    v = torch.arange(12.0).view(1, 3, 1, 4)
    mean = v.mean(dim=1, keepdim=True).expand(1, 2, 1, 4)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        dot = (q.to(dtype).double()[0, 0, 0] * k.to(dtype).double()[0, 0, 0]).sum().item()  # every score alike
        for scale in (0.0, 1e-30):
            out, got = fa_variants.attention(q.to(dtype), k.to(dtype), v.to(dtype), softmax_scale=scale,
                                             return_lse=True)
            torch.testing.assert_close(out.double(), mean.double(), rtol=0, atol=0)
            lse = scale * dot + math.log(3)
            torch.testing.assert_close(got.double(), torch.full_like(got.double(), lse), rtol=1e-6, atol=0)
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    q, k = (torch.randn(1, 5, 2, 8, generator=g) * 1e20 for _ in range(2))
    v = torch.randn(1, 5, 2, 8, generator=g)
    exact, _ = reference.attention_reference(q.double(), k.double(), v.double(), softmax_scale=1e-40, causal=True)
    out = fa_variants.attention(q, k, v, softmax_scale=1e-40, causal=True)
    assert out.isfinite().all() and (out.double() - exact).abs().max() < 1e-4  # float32 maths: worst of 400 seeds 1.1e-5
    dq, dk, dv = reference.run_backward(torch.ones(1, 5, 2, 8), torch.zeros(1, 2, 5), q, k, v, causal=True,
                                        softmax_scale=1e-40)
    assert all(t.isfinite().all() for t in (dq, dk, dv))


def test_a_visible_score_of_plus_inf_gives_lse_plus_inf():
    """LSE = log sum exp: +inf when a visible score is +inf (it was NaN: inf - inf), as torch.logsumexp."""
    import math

    import fa_variants

    q = torch.ones(1, 1, 1, 2)
    k = torch.tensor([[math.inf, 0.0], [0.0, 0.0]]).view(1, 2, 1, 2)
    v = torch.randn(1, 2, 1, 2)
    _, lse = fa_variants.attention(q, k, v, return_lse=True, softmax_scale=1.0)
    assert lse.item() == math.inf


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_rows_without_keys_backward_under_anomaly_detection(dtype):
    """Causal with seqlen_q > seqlen_k: the first rows see no key. Their 0 / 0 and -inf + inf sat in branches
    torch.where drops, whose NaN gradients torch.autograd.set_detect_anomaly(True) reported as errors of a valid
    call (session 49's global-state probe); gradients finite and the same as without anomaly mode."""
    q, k, v = (torch.randn(2, 16, h, 32, dtype=dtype) for h in (4, 2, 2))

    def grads():
        leaves = [t.clone().requires_grad_() for t in (q, k[:, :4], v[:, :4])]
        if dtype in (torch.float32, torch.float64):
            out, lse = fa_variants.attention(*leaves, causal=True, return_lse=True)
            loss = out.sum() + lse.masked_fill(lse.isinf(), 0).sum()
        else:  # the 16-bit maths path of the reference
            out, lse = attention_reference(*leaves, causal=True, dtype=dtype)
            loss = out.float().sum()
        return torch.autograd.grad(loss, leaves)

    plain = grads()
    with torch.autograd.set_detect_anomaly(True):
        watched = grads()
    for a, b in zip(watched, plain):
        assert a.isfinite().all()
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_reference_keeps_its_dtype_under_autocast():
    """attention_reference(dtype=float32) under torch.autocast("cpu", bfloat16) ran its products in bfloat16 and
    returned a bfloat16 result about 1e-2 off (session 49's global-state probe); autocast is off inside now."""
    q, k, v = (torch.randn(1, 33, 2, 64) for _ in range(3))
    plain = attention_reference(q, k, v, causal=True, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = attention_reference(q, k, v, causal=True, dtype=torch.float32)
        assert torch.is_autocast_enabled("cpu")  # the caller's autocast is left on
    for a, b in zip(under, plain):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0, atol=0)
