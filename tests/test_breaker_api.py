"""Regressions found by driving the public surface as a user would (session 7, "breaker"): each test failed
before its fix. CPU only, seconds: the reference backend, torch.compile with the aot_eager compiler (no C++
build), the CLI in-process.

The float64 reference here is written out (a dense mask, ``repeat_interleave`` for GQA), independent of
``fa_variants.reference``.
"""
import math
import re
import warnings

import pytest
import torch

import fa_variants
from helpers import seeded_generator


def _reference64(q, k, v, causal=False, softmax_scale=None):
    """(out, lse) in float64: q (B, Nq, H, D), k, v (B, Nk, Hkv, D); bottom-right causal (key j visible to
    query i iff j <= i + Nk - Nq); a row that sees no key gives 0 and -inf."""
    q, k, v = (t.double() for t in (q, k, v))
    nq, heads, head_dim = q.shape[1], q.shape[2], q.shape[3]
    nk, group = k.shape[1], heads // k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        visible = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)
        s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(s), torch.exp(s - lse[..., None]))
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def _qkv(batch=2, seqlen_q=5, seqlen_k=7, heads=4, heads_kv=2, head_dim=8, dtype=torch.float32, seed=0):
    g = seeded_generator(offset=seed)
    return (torch.randn(batch, seqlen_q, heads, head_dim, generator=g, dtype=dtype),
            torch.randn(batch, seqlen_k, heads_kv, head_dim, generator=g, dtype=dtype),
            torch.randn(batch, seqlen_k, heads_kv, head_dim, generator=g, dtype=dtype))


# ---------------------------------------------------------------------------------------- meta tensors

@pytest.mark.parametrize("causal", [False, True])
def test_meta_tensors_give_meta_outputs_of_the_right_shapes(causal):
    """Shape inference on the meta device (a model built under ``torch.device("meta")``): before, the reference
    path looked for non-finite V values (``bad.any()``) and raised 'Tensor.item() cannot be called on meta
    tensors' from deep inside."""
    q, k, v = (t.to("meta") for t in _qkv(seqlen_q=9, seqlen_k=4))
    out, lse = fa_variants.attention(q, k, v, causal=causal, return_lse=True)
    assert out.device.type == "meta" and out.shape == q.shape and out.dtype == q.dtype
    assert lse.device.type == "meta" and lse.shape == (2, 4, 9) and lse.dtype == torch.float32
    sdpa = fa_variants.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                    enable_gqa=True)
    assert sdpa.device.type == "meta" and sdpa.shape == (2, 4, 9, 8)


# ------------------------------------------------------------------------- torch.compile, symbolic scale

def _attention_scaled_by_head_dim(q, k, v):
    return fa_variants.attention(q, k, v, causal=True, softmax_scale=q.size(-1) ** -0.5)


def _sdpa_scaled_by_head_dim(q, k, v):  # PyTorch layout
    return fa_variants.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(q.shape[-1]),
                                                    enable_gqa=True)


@pytest.mark.parametrize("fn", [_attention_scaled_by_head_dim, _sdpa_scaled_by_head_dim], ids=["attention", "sdpa"])
def test_a_scale_computed_from_a_dynamic_head_dim_compiles_fullgraph(fn):
    """torch.compile(dynamic=True, fullgraph=True) with softmax_scale = q.size(-1) ** -0.5 (a SymFloat): before,
    ``math.isfinite`` in the scale check made Dynamo stop with 'Unsupported: torch.* op returned non-Tensor'."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
    for head_dim, nq, nk in ((8, 5, 7), (16, 6, 6)):
        q, k, v = _qkv(seqlen_q=nq, seqlen_k=nk, head_dim=head_dim, seed=head_dim)
        if fn is _sdpa_scaled_by_head_dim:
            k, v = k[:, :nq], v[:, :nq]  # SDPA's causal needs seqlen_q == seqlen_k
            got = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        else:
            got = compiled(q, k, v)
        want, _ = _reference64(q, k, v, causal=True)
        assert (got.double() - want).abs().max().item() < 1e-5


# ------------------------------------------------------------------------------ SDPA names its arguments

@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(is_causal=1), TypeError, r"^is_causal must be a bool, got 1$"),
    (dict(is_causal=None), TypeError, r"^is_causal must be a bool, got None$"),
    (dict(scale="0.5"), TypeError, r"^scale must be a real number or None, got '0.5'$"),
    (dict(scale=math.nan), ValueError, r"^scale must be finite, got nan$"),
    (dict(scale=1e39), ValueError, r"^scale 1e\+39 is out of range: \|scale\| must be"),
])
def test_sdpa_errors_name_its_own_arguments(kwargs, exc, message):
    """scaled_dot_product_attention's keywords are is_causal and scale: before, a bad one was reported as
    'causal must be a bool' / 'softmax_scale must be ...', names the caller never wrote."""
    q, k, v = (t.transpose(1, 2) for t in _qkv(seqlen_q=5, seqlen_k=5))
    with pytest.raises(exc, match=message):
        fa_variants.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)


# ------------------------------------------------------------------------------------ fa-variants warmup

def _warmup(capsys, monkeypatch, tmp_path, *argv):
    from fa_variants import cli

    monkeypatch.setenv("FA_VARIANTS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")  # warmup sets it for the DSL; restored after the test
    status = cli.main(["warmup", "--no-progress", *argv])
    return status, capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (("--arch", "sm_90", "--head-dims", "128"), r"--arch sm_90: .*sm_90a"),    # the 'a' forgotten
    (("--arch", "sm_7", "--head-dims", "128"), r"--arch sm_7: .*sm_80"),      # was "invalid literal for int()"
    (("--arch", "sm_90a", "--head-dims", "128", "--backends", "fa3,fa-3"), r"--backends fa-3: .*fa3"),
    (("--arch", "sm_90a", "--head-dims", "7"), r"nothing to compile.*head_dim 7"),
])
def test_warmup_that_would_compile_nothing_is_an_error(capsys, monkeypatch, tmp_path, argv, message):
    """Before, a mistyped arch or backend name, or a head_dim no kernel serves, printed '0 kernels' and exited 0:
    a deployment's warm-up step 'succeeded' and every first call compiled after all."""
    status, err = _warmup(capsys, monkeypatch, tmp_path, *argv)
    assert status == 2
    assert len(err.strip().splitlines()) >= 1 and "Traceback" not in err
    assert __import__("re").search(message, err.strip().splitlines()[-1]), err


@pytest.mark.parametrize("option", ["--dtypes", "--head-dims", "--backends"])
def test_warmup_empty_list_is_an_error(capsys, option):
    """`--dtypes ,` was read as "the defaults" and compiled 49 kernels (session 27's break-it pass): an empty list is
    argparse's one-line error, before anything compiles."""
    from fa_variants import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["warmup", "--arch", "sm_90a", "--head-dims", "64", option, ","])
    assert exc.value.code == 2
    assert f"argument {option}: ',' is an empty list" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["[]", "3", '"config"'])
def test_warmup_model_file_that_is_not_a_json_object_is_one_line(capsys, monkeypatch, tmp_path, text):
    """--model with valid JSON that is not an object raised AttributeError ("'list' object has no attribute
    'get'") with a traceback."""
    config = tmp_path / "config.json"
    config.write_text(text, encoding="utf-8")
    status, err = _warmup(capsys, monkeypatch, tmp_path, "--arch", "sm_90a", "--model", str(config))
    assert status == 2 and "Traceback" not in err
    assert str(config) in err and "JSON object" in err


# --------------------------------------------------------------------------------------- FP8 emulation

@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(inputs="x"), TypeError, r"^inputs must be FP8Inputs .*got str$"),
    (dict(causal=1), TypeError, r"^causal must be a bool, got 1$"),
    (dict(out_dtype="bf16"), TypeError, r"^out_dtype must be a torch.dtype or None, got 'bf16'$"),
])
def test_fp8_emulation_names_a_bad_argument(kwargs, exc, message):
    """fp8.emulate_fp8_attention (public, the CPU stand-in for the kernel): a non-FP8Inputs raised AttributeError
    ('str' object has no attribute 'config'), causal=1 ran as causal without a word, out_dtype='bf16' failed at
    the end in Tensor.to."""
    from fa_variants import fp8

    q, k, v = _qkv(batch=1, seqlen_q=3, seqlen_k=5, heads=2, heads_kv=1, head_dim=64)
    args = dict(inputs=fp8.quantize_fp8(q, k, v, impl="torch"), causal=False)
    args.update(kwargs)
    with pytest.raises(exc, match=message):
        fp8.emulate_fp8_attention(args.pop("inputs"), **args)


def test_compiling_the_reference_says_there_is_no_kernel():
    """'fa-variants compile --variant reference' (and warmup --backends reference) said "does not serve arch
    sm_90a (serves )": an empty list, as if the reference served no arch at all."""
    from fa_variants import registry

    with pytest.raises(registry.UnsupportedConfigError, match=r"^variant 'reference' is plain PyTorch .*no kernel"):
        registry.static_config("reference", "sm_90a", "bf16", 128, False)


@pytest.mark.parametrize("argv, flag", [
    (["--decode-nq", "0"], "--decode-nq"), (["--decode-nk", "1024,-1"], "--decode-nk"),
    (["--decode-batch", "0"], "--decode-batch"), (["--decode-head-dims", "0"], "--decode-head-dims"),
    (["--peak-tbps", "0"], "--peak-tbps"), (["--peak-tbps", "nan"], "--peak-tbps"),
])
def test_bench_decode_sizes_must_be_positive(capsys, argv, flag):
    """'fa-variants bench --decode --decode-nq 0' planned cases with zero query rows (and --peak-tbps 0 an HBM
    share divided by 0) and exited 0 on --dry-run; a GPU run would have timed empty calls."""
    from fa_variants import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--decode", "--dry-run", *argv])
    assert exit_.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


@pytest.mark.compile
def test_warmup_that_cannot_write_the_disk_cache_fails(capsys, monkeypatch, tmp_path):
    """FA_VARIANTS_CACHE_DIR naming a file (or any unwritable place): warmup warned 'could not write the compile
    cache entry' but reported '1 compiled', a path that does not exist, and exit 0, although nothing was kept for
    the next process, which is warmup's one job."""
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv("FA_VARIANTS_CACHE_DIR", str(blocker))
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_80")
    from fa_variants import cli

    with warnings.catch_warnings():  # DiskCacheWarning when it compiles here (not when compiled earlier in-process)
        warnings.simplefilter("ignore")
        status = cli.main(["warmup", "--arch", "sm_80", "--backends", "testkernel", "--head-dims", "64",
                           "--causal", "no", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert "not written to the disk cache" in err[-1] and str(blocker) in err[-1]


# ---------------------------------------------------------------------- session 9: unhashable arguments

@pytest.mark.parametrize("kwargs, message", [
    (dict(softmax_scale=__import__("numpy").array(0.5)), r"^softmax_scale must be a real number or None, got"),
    (dict(softmax_scale=[0.5]), r"^softmax_scale must be a real number or None, got \[0.5\]$"),
    (dict(causal=[True]), r"^causal must be a bool, got \[True\]$"),
    (dict(backend=["reference"]), r"^backend must be a str, got \['reference'\]$"),
    (dict(backend={"reference": 1}), r"^backend must be a str, got"),
])
def test_an_unhashable_argument_is_named(kwargs, message):
    """A list, dict or numpy array as softmax_scale / causal / backend: the plan lookup of the fast path hashed
    the call's key first and raised "unhashable type: 'numpy.ndarray'", naming no argument."""
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=message):
        fa_variants.attention(q, k, v, **kwargs)


# ------------------------------------------------------------------ session 9: seqlens_k under compile

def test_seqlens_k_under_torch_compile_fullgraph():
    """Session 9: under fullgraph=True the value check read the lengths first (aminmax, int()) and Dynamo stopped with
    'Could not guard on data-dependent expression u0 < 0' (40 lines). Since session 24 the call is one opaque op
    (``fa_variants::attention_seqlens_k``): it compiles with fullgraph=True and gives the eager result; a bad value
    is refused when the op runs, with the eager message."""
    torch._dynamo.reset()
    q, k, v = _qkv()
    seqlens_k = torch.tensor([3, 7], dtype=torch.int32)
    fn = lambda q, k, v, n: fa_variants.attention(q, k, v, causal=True, seqlens_k=n, return_lse=True)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(q, k, v, seqlens_k), fn(q, k, v, seqlens_k)):
        torch.testing.assert_close(got, want)
    with pytest.raises(Exception, match=r"seqlens_k holds .*outside \[0, seqlen_k"):
        compiled(q, k, v, torch.tensor([3, 99], dtype=torch.int32))


@pytest.mark.parametrize("causal", [False, True])
def test_seqlens_k_under_torch_compile_has_the_reference_backward(causal):
    """Session 30's break-it pass: the op behind a compiled call with seqlens_k had no gradient, and AOTAutograd,
    which traces the backward while compiling, raised from the forward call itself (a model in eval mode without
    no_grad could not run). The op now has the reference backend's backward (``reference.run_backward`` per
    sequence): the compiled gradients are eager autograd's through the reference, keys past a length get 0."""
    torch._dynamo.reset()
    q, k, v = (t.double() for t in _qkv())
    seqlens_k = torch.tensor([3, 7], dtype=torch.int32)
    fn = lambda q, k, v, n: fa_variants.attention(q, k, v, causal=causal, seqlens_k=n, return_lse=True)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    grads = []
    for run in (compiled, fn):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, lse = run(*leaves, seqlens_k)
        (out.square().sum() + torch.where(torch.isfinite(lse), lse, 0).sum()).backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert (grads[0][1][0, 3:] == 0).all() and (grads[0][2][0, 3:] == 0).all()  # past sequence 0's length


# ----------------------------------------------------------------------------- session 9: FP8 arguments

def test_fp8_config_takes_numpy_ints_as_python_ints():
    """FP8Config(seed=np.int64(3)) was accepted (numbers.Integral) and stored as is; quantize_fp8 then failed in
    torch.Generator.manual_seed with 'an integer is required', naming nothing. The int fields now hold ints."""
    import numpy as np
    from fa_variants import fp8

    config = fp8.FP8Config(seed=np.int64(3), promote_every=np.int32(2), smooth_k_blocks=np.uint8(1))
    assert [type(getattr(config, f)) for f in ("seed", "promote_every", "smooth_k_blocks")] == [int, int, int]
    q, k, v = _qkv(batch=1, seqlen_q=3, seqlen_k=5, heads=2, heads_kv=1, head_dim=64)
    got = fp8.quantize_fp8(q, k, v, config=config, impl="torch")
    want = fp8.quantize_fp8(q, k, v, config=fp8.FP8Config(seed=3, promote_every=2, smooth_k_blocks=1), impl="torch")
    assert torch.equal(got.q.view(torch.uint8), want.q.view(torch.uint8)) and got.config == want.config


@pytest.mark.parametrize("scale, exc, message", [
    (1e39, ValueError, r"^softmax_scale 1e\+39 is out of range"),   # accepted before: the kernel's c overflows
    ("0.5", TypeError, r"^softmax_scale must be a real number or None, got '0.5'$"),
    (torch.tensor(0.5), TypeError, r"^softmax_scale must be a real number or None"),
    (True, TypeError, r"^softmax_scale must be a real number or None, got True$"),
    (math.inf, ValueError, r"^softmax_scale must be finite, got inf$"),
])
def test_quantize_fp8_checks_softmax_scale_as_attention_does(scale, exc, message):
    """quantize_fp8 took |softmax_scale| > MAX_SOFTMAX_SCALE (the fa3-fp8 kernel folds it into log2 e in float32:
    inf), and reported a string / tensor / bool as a ValueError; attention's rule and messages now apply."""
    from fa_variants import fp8

    q, k, v = _qkv(batch=1, seqlen_q=3, seqlen_k=5, heads=2, heads_kv=1, head_dim=64)
    with pytest.raises(exc, match=message):
        fp8.quantize_fp8(q, k, v, softmax_scale=scale)


@pytest.mark.parametrize("change, exc, message", [
    (dict(q=torch.float16), TypeError, r"^q has dtype torch.float16; from_e4m3 takes torch.float8_e4m3fn"),
    (dict(v=torch.float32), TypeError, r"has dtype torch.float32"),
    (dict(scale=torch.tensor(0.1)), TypeError, r"^softmax_scale must be a real number"),
    (dict(scale=math.nan), ValueError, r"^softmax_scale must be finite"),
    (dict(k_shape=(1, 7, 1, 64)), ValueError, r"^q has batch|^k has seqlen|seqlen"),
])
def test_from_e4m3_checks_its_inputs(change, exc, message):
    """fp8.attention.from_e4m3 trusted its arguments: a bf16 q raised a RuntimeError from a shape expansion deep
    in the V transpose, a 0-d tensor scale was silently read with float()."""
    from fa_variants.fp8.attention import from_e4m3

    e4m3 = torch.float8_e4m3fn
    q = torch.randn(1, 3, 2, 64).to(change.get("q", e4m3))
    k = torch.randn(1, 5, 1, 64).to(change.get("k", e4m3))
    v = torch.randn(*change.get("k_shape", (1, 5, 1, 64))).to(change.get("v", e4m3))
    with pytest.raises(exc, match=message):
        from_e4m3(q, k, v, softmax_scale=change.get("scale", 0.125))


def test_fp8_emulation_refuses_a_non_float_out_dtype():
    """emulate_fp8_attention(out_dtype=torch.int8) returned O cast to int8 (every |O| < 1 became 0): a silent
    wrong answer."""
    from fa_variants import fp8

    q, k, v = _qkv(batch=1, seqlen_q=3, seqlen_k=5, heads=2, heads_kv=1, head_dim=64)
    inputs = fp8.quantize_fp8(q, k, v, impl="torch")
    # and (session 30) an 8-bit float: O saturated at e4m3's 448 without a word
    for dtype in (torch.int8, torch.bool, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2):
        with pytest.raises(TypeError, match=r"^out_dtype must be a floating-point torch.dtype"):
            fp8.emulate_fp8_attention(inputs, out_dtype=dtype)


# ----------------------------------------------------------------------------- session 30: FP8 (break-it pass)

def test_fp8_lse_is_never_nan_at_a_scale_near_its_limit():
    """softmax_scale 2e38 (allowed: below MAX_SOFTMAX_SCALE) with K smoothing: where the kernel's LSE (of the
    smoothed logits) overflowed to +inf and the shift q . mean to -inf, their sum came back NaN while O was finite.
    ``FP8Inputs.unsmoothed_lse`` keeps the LSE's sign there (+-inf, as an unsmoothed LSE beyond float32 does on every
    backend) and adds the shift everywhere else."""
    from fa_variants import fp8

    g = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    q, k, v = (torch.randn(1, n, 4, 64, generator=g).to(torch.bfloat16) for n in (256, 96, 96))
    inputs = fp8.quantize_fp8(q, k, v, softmax_scale=2e38, impl="torch")
    out, smoothed = fp8.emulate_fp8_attention(inputs)
    clash = smoothed.isinf() & inputs.lse_shift.isinf() & (smoothed != inputs.lse_shift)
    assert clash.any()  # the case this test is about: 1-5 rows of 128 in six draws, so 1024 rows here
    _, lse = fp8.fp8_attention_reference(q, k, v, softmax_scale=2e38)
    assert torch.isfinite(out).all() and not lse.isnan().any()
    torch.testing.assert_close(lse[clash], smoothed[clash])
    torch.testing.assert_close(lse[~clash], (smoothed + inputs.lse_shift)[~clash])


# ------------------------------------------------------------------- session 48: API break-it pass (decode, op)

@pytest.mark.parametrize("make", [lambda n: n.to_sparse(), lambda n: torch.nested.nested_tensor(list(n[:, None]))],
                         ids=["sparse", "nested"])
def test_a_sparse_or_nested_seqlens_k_is_named(make):
    """A sparse seqlens_k failed inside ``torch.aminmax`` with a 93-line NotImplementedError, a nested one with
    'Internal error: NestedTensorImpl doesn't support sizes'; both are one-line TypeErrors naming seqlens_k now."""
    q, k, v = _qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the nested-tensor prototype warning
        seqlens_k = make(torch.tensor([3, 7], dtype=torch.int32))
    with pytest.raises(TypeError, match=r"^seqlens_k must be a dense \(strided\) tensor, got layout"):
        fa_variants.attention(q, k, v, seqlens_k=seqlens_k)


@pytest.mark.parametrize("change, exc, message", [
    (lambda q, k, v: (q, k.double(), v.double(), None), TypeError, r"^q has dtype torch.float32 but k has dtype"),
    (lambda q, k, v: (q, k, v[..., :5], None), ValueError, r"^v has head_dim 5 but q has head_dim 8"),
    (lambda q, k, v: (q[0], k[0], v[0], None), ValueError, r"^q must be 4-D"),
    (lambda q, k, v: (q, k, v, 1e39), ValueError, r"^softmax_scale 1e\+39 is out of range"),
], ids=["dtypes", "v_head_dim", "rank", "scale"])
def test_the_seqlens_k_op_validates_a_direct_call(change, exc, message):
    """``torch.ops.fa_variants.attention_seqlens_k`` called directly (eagerly) skipped ``attention``'s checks that
    ``torch.ops.fa_variants.attention`` makes: mixed dtypes and a scale above MAX_SOFTMAX_SCALE ran on the reference,
    a V of another head_dim returned an output of V's head_dim (not the shape its fake gives), a 3-D q was reported as
    a seqlens_k of the wrong shape. It validates a call of a new kind as the other op does."""
    q, k, v = _qkv(head_dim=8)
    seqlens_k = torch.tensor([3, 7], dtype=torch.int32)
    q, k, v, scale = change(q, k, v)
    with pytest.raises(exc, match=message):
        torch.ops.fa_variants.attention_seqlens_k(q, k, v, seqlens_k, False, scale, "auto")


@pytest.mark.parametrize("name", ["xyz", "auto", "FA3"])
def test_why_not_refuses_a_name_that_is_no_backend(name):
    """``dispatch.why_not`` with a name that is no backend answered "xyz runs on  only; ..." (no arch lists it); it
    raises as ``select`` does for an unknown name."""
    from fa_variants import dispatch

    with pytest.raises(ValueError, match=rf"^unknown backend '{name}'; choose from fa3, "):
        dispatch.why_not(name, (9, 0), torch.bfloat16, 64)


def test_forward_mode_ad_with_a_parameter_q():
    """Forward-mode AD (``torch.autograd.forward_ad``), which the reference backend serves, with an nn.Parameter q and
    a tangent on k: the Parameter's call went through the custom op's autograd (``custom_op.EagerAttention``), which
    has no jvp: "You must implement the jvp function for custom autograd.Function" from torch. It takes the plain
    path there, as a plain q does: the tangent is the float64 reference's."""
    import torch.autograd.forward_ad as fwAD

    q, k, v = (t.double() for t in _qkv(seqlen_q=5, seqlen_k=3))
    tangent = torch.randn_like(k)
    with fwAD.dual_level():
        out = fa_variants.attention(torch.nn.Parameter(q), fwAD.make_dual(k, tangent), v, causal=True)
        want = _reference64(q, fwAD.make_dual(k, tangent), v, causal=True)[0]
        got, expected = fwAD.unpack_dual(out).tangent, fwAD.unpack_dual(want).tangent
    assert got is not None
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    assert (got[:, :2] == 0).all()  # causal rows 0 and 1 see no key (bottom-right, 5 queries on 3 keys)


@pytest.mark.parametrize("dtype, head_dim, clause", [
    (torch.float32, 64, r"; and it takes float16, bfloat16, float8_e4m3fn inputs \(not float32\)$"),
    (torch.bfloat16, 40, r"; and it takes head_dim 64, 96, 128, 256 \(not 40\)$"),
    (torch.bfloat16, 64, r"the inputs are not on a CUDA GPU$"),
])
def test_a_backend_on_the_wrong_device_also_names_what_it_refuses_anywhere(dtype, head_dim, clause):
    """fa3-fp8 asked for float32 inputs on the CPU heard only "runs on sm_90 only; the inputs are on the CPU", as if
    a GPU would serve the call: the reason also names the dtypes / head dims it refuses on any GPU."""
    from fa_variants import dispatch

    assert re.search(clause, dispatch.why_not("fa3-fp8", None, dtype, head_dim))


def test_the_reason_for_meta_inputs_does_not_say_cpu():
    """Inputs on the meta device were said to be "on the CPU" (capability None covers every non-CUDA device)."""
    q = torch.empty(1, 4, 2, 64, device="meta", dtype=torch.bfloat16)
    assert fa_variants.select_backend(q, q, q).reason.startswith("auto: the inputs are not on a CUDA GPU")
    with pytest.raises(fa_variants.BackendUnavailableError, match=r"the inputs are not on a CUDA GPU; backends"):
        fa_variants.select_backend(q, q, q, backend="fa3")
    q8 = q.to(torch.float8_e4m3fn)  # auto with nothing to serve it: "on cpu" before (a review finding)
    with pytest.raises(fa_variants.BackendUnavailableError, match=r"^no backend can serve float8_e4m3fn head_dim 64 "
                                                                  r"\(inputs not on a CUDA GPU\): "):
        fa_variants.select_backend(q8, q8, q8)
