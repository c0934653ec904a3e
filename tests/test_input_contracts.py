"""Input contracts of the public surface beyond attention() itself (caller-built FP8Inputs, the FP8 quantiser on
non-finite values, the reference and emulators' argument checks, the shard helpers, corrupt fixture / report
files), driven as a user would on the CPU: each test failed before its fix (session 14). CPU only, seconds: the
reference backend, the FP8 emulation, the shard helpers (no process group).
"""
import dataclasses
import io
import lzma
import math
import re

import pytest
import torch

from fa_variants import fp8
from fa_variants.fp8 import attention as fp8_attention
from fa_variants.reference import rel_l2
from helpers import seeded_generator


def _quantised(smooth_k=True):
    g = seeded_generator()
    q, k, v = torch.randn(1, 40, 4, 64, generator=g), torch.randn(1, 40, 2, 64, generator=g), \
        torch.randn(1, 40, 2, 64, generator=g)
    return fp8.quantize_fp8(q, k, v, config=fp8.FP8Config(smooth_k=smooth_k), impl="torch")


# ------------------------------------------------------------------------ FP8Inputs built by the caller

# (field -> a function of the good inputs giving the bad value, exception, message). Before the fix each ran
# (a wrong answer: the bf16 q read as if quantised, one head's descale broadcast, keys cut, an NaN or negative
# scale, an lse_shift broadcast into the LSE, a recipe's shift dropped) or failed deep in the emulation.
BAD_FP8_INPUTS = [
    ("q", lambda i: i.q.float().bfloat16(), TypeError, r"^FP8Inputs.q has dtype torch.bfloat16; it must be"),
    ("k", lambda i: i.k[0], ValueError, r"^FP8Inputs.k must be 4-D"),
    ("k", lambda i: torch.cat([i.k, i.k[:, :, :1]], 2), ValueError, r"^FP8Inputs: num_heads 4 \(q\) must be a"),
    ("q_descale", lambda i: i.q_descale[:, :1], ValueError, r"^FP8Inputs.q_descale must have shape \(1, 4, 1\)"),
    ("q_descale", lambda i: i.q_descale.repeat(2, 1, 1), ValueError, r"^FP8Inputs.q_descale must have shape"),
    ("k_descale", lambda i: i.k_descale.repeat(1, 2, 1), ValueError, r"^FP8Inputs.k_descale must have shape \(1, 2,"),
    ("v_descale", lambda i: i.v_descale.half(), TypeError, r"^FP8Inputs.v_descale has dtype torch.float16"),
    ("v_descale", lambda i: i.v_descale.to("meta"), ValueError, r"^FP8Inputs.v_descale is on meta but q is on cpu"),
    ("seqlen_k", lambda i: 20, ValueError, r"^FP8Inputs.seqlen_k is 20 but k holds 40 keys"),
    ("v_t", lambda i: i.v_t[..., :40], ValueError, r"^FP8Inputs.v_t must be \(batch, num_heads_kv, head_dim"),
    ("softmax_scale", lambda i: -0.1, ValueError, r"^FP8Inputs.softmax_scale must be >= 0"),
    ("softmax_scale", lambda i: math.nan, ValueError, r"^FP8Inputs.softmax_scale must be finite"),
    ("softmax_scale", lambda i: None, TypeError, r"^FP8Inputs.softmax_scale must be a real number, got None$"),
    ("lse_shift", lambda i: torch.zeros(3), ValueError, r"^FP8Inputs.lse_shift must be float32 of shape \(1, 4, 40\)"),
    ("lse_shift", lambda i: None, ValueError, r"^FP8Inputs.lse_shift is None but config.smooth_k is True"),
    ("config", lambda i: fp8.FP8Config(smooth_k=False), ValueError, r"^FP8Inputs.k_mean is given but config.smooth_k"),
    ("config", lambda i: None, TypeError, r"^FP8Inputs.config must be an FP8Config, got NoneType$"),
]


@pytest.mark.parametrize("field, bad, exc, message", BAD_FP8_INPUTS,
                         ids=[f"{f}-{m[1:40]}" for f, _, _, m in BAD_FP8_INPUTS])
def test_fp8_inputs_built_by_the_caller_are_checked_in_full(field, bad, exc, message):
    """emulate_fp8_attention and attention_from_fp8 take FP8Inputs "from quantize_fp8, or built by the caller"
    but read them unchecked (FP8Inputs itself checks only its descales' block counts). Now the whole contract
    (contract.check_fp8_inputs) is checked first, one line naming the field; attention_from_fp8 says so before
    it says the kernel needs a GPU."""
    good = _quantised()
    inputs = dataclasses.replace(good, **{field: bad(good)})
    with pytest.raises(exc, match=message):
        fp8.emulate_fp8_attention(inputs)
    with pytest.raises(exc, match=message):
        fp8.attention_from_fp8(inputs)
    with pytest.raises(exc, match=message):  # session 28: dequantize read them unchecked too (raw torch errors)
        inputs.dequantize()


def test_fp8_inputs_that_keep_the_contract_still_run():
    """The check refuses nothing the quantisers make: smoothed and not, from_e4m3's, no keys, no query rows."""
    for inputs in (_quantised(), _quantised(smooth_k=False), fp8_attention.from_e4m3(
            *(torch.randn(1, n, 2, 64).to(torch.float8_e4m3fn) for n in (3, 5, 5)), softmax_scale=-0.5)):
        fp8.emulate_fp8_attention(inputs)
    q, k = torch.randn(1, 0, 2, 64), torch.randn(1, 0, 1, 64)
    fp8.emulate_fp8_attention(fp8.quantize_fp8(q, k, k, impl="torch"))
    fp8.emulate_fp8_attention(fp8.quantize_fp8(torch.randn(1, 3, 2, 64), k, k, impl="torch"))


@pytest.mark.parametrize("field, bad, exc, message", [
    ("seqlen_k", None, TypeError, r"^FP8Inputs.seqlen_k must be an int, got None$"),
    ("seqlen_k", "40", TypeError, r"^FP8Inputs.seqlen_k must be an int, got '40'$"),
    ("seqlen_k", True, TypeError, r"^FP8Inputs.seqlen_k must be an int, got True$"),
    ("seqlen_k", 40.0, TypeError, r"^FP8Inputs.seqlen_k must be an int, got 40.0$"),
    ("seqlen_k", -1, ValueError, r"^FP8Inputs.seqlen_k must be >= 0, got -1$"),
    ("q", torch.zeros(3), ValueError, r"^FP8Inputs.q must be 4-D, got shape \(3,\)$"),
    ("q_descale", torch.tensor(1.0), ValueError, r"^FP8Inputs.q_descale must be 3-D, got shape \(\)$"),
    ("k_descale", torch.ones(2), ValueError, r"^FP8Inputs.k_descale must be 3-D, got shape \(2,\)$"),
])
def test_fp8_inputs_fields_read_on_construction_are_named(field, bad, exc, message):
    """FP8Inputs' own check read seqlen_k, q's and the descales' shapes unchecked: a None / str seqlen_k or a
    descale of too few dims gave "bad operand type for unary -" or "tuple index out of range" (session 27)."""
    good = _quantised()
    with pytest.raises(exc, match=message):
        dataclasses.replace(good, **{field: bad})


def test_from_e4m3_needs_a_scale():
    """from_e4m3 has no default softmax_scale: None is refused without saying "or None" (session 27)."""
    t = torch.randn(1, 5, 1, 64).to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"^softmax_scale must be a real number, got None$"):
        fp8_attention.from_e4m3(t, t, t, softmax_scale=None)


def test_fp8_inputs_field_not_a_tensor_is_named():
    """FP8Inputs(q=None, ...) failed with "'NoneType' object has no attribute 'shape'" in __post_init__."""
    good = _quantised()
    for field in ("q", "q_descale", "k_descale", "v_descale"):
        with pytest.raises(TypeError, match=rf"^FP8Inputs.{field} must be a torch.Tensor, got NoneType$"):
            dataclasses.replace(good, **{field: None})


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(accumulator="truncate", accumulator_bits=-1), ValueError, r"^accumulator_bits must be >= 0"),  # ran: garbage
    (dict(accumulator="truncate", accumulator_bits="12"), TypeError, r"^accumulator_bits must be an int or None"),
    (dict(accumulator="truncate", accumulator_bits=True), TypeError, r"^accumulator_bits must be an int or None"),
    (dict(tile_m=0), ValueError, r"^tile_m must be >= 1"),            # range() arg 3 must not be zero
    (dict(tile_m=-1, causal=True), ValueError, r"^tile_m must be >= 1"),  # Repeats must be non-negative
    (dict(tile_m=7.5), TypeError, r"^tile_m must be an int or None, got 7.5$"),
])
def test_fp8_emulation_checks_its_keywords(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        fp8.emulate_fp8_attention(_quantised(), **kwargs)


def test_fp8_error_bound_does_not_broadcast():
    """fp8_error_bound(out, exact) broadcast shapes that differ (an (B, 1, H, D) exact against (B, N, H, D) gave a
    bound for the wrong comparison) and took a negative or NaN atol."""
    out = torch.randn(1, 4, 2, 8)
    for exact in (out[:, :1], out[:, :3], out.transpose(1, 2)):
        with pytest.raises(ValueError, match=r"^out_emulated has shape \(1, 4, 2, 8\) but out_exact has"):
            fp8.fp8_error_bound(out, exact)
    for atol, exc in ((-1e-4, ValueError), (math.nan, ValueError), ("1e-4", TypeError)):
        with pytest.raises(exc, match=r"^atol must be"):
            fp8.fp8_error_bound(out, out, atol=atol)
    assert fp8.fp8_error_bound(out, out + 1, atol=0.5) == pytest.approx(2.5)


# ------------------------------------------------------------------------------- shard / unshard helpers

def _shards(unshard):
    from fa_variants import distributed

    shard = distributed.zigzag_shard if unshard.__name__ == "zigzag_unshard" else distributed.contiguous_shard
    x = torch.arange(2 * 10 * 3 * 4, dtype=torch.float32).view(2, 10, 3, 4)
    return x, [shard(x, 1, rank, 2) for rank in range(2)]


@pytest.mark.parametrize("name", ["contiguous_unshard", "zigzag_unshard"])
def test_unshard_takes_a_sequence_of_matching_shards(name):
    """One tensor passed as ``shards`` was cut by list() along its batch dim and joined into a tensor of another
    shape without an error (contiguous_unshard(x, 1) on x (2, 10, 3, 4) gave (10, 6, 4)); contiguous_unshard
    checked nothing else either (torch.cat's errors, not naming shards), and both joined shards of different
    dtypes by promotion."""
    from fa_variants import distributed

    unshard = getattr(distributed, name)
    x, shards = _shards(unshard)
    assert torch.equal(unshard(shards, 1), x) and torch.equal(unshard(tuple(shards), -3), x)
    with pytest.raises(TypeError, match=r"^shards must be a sequence of tensors .* got one tensor of shape"):
        unshard(x, 1)
    with pytest.raises(TypeError, match=r"^shards must be a sequence of tensors"):
        unshard(torch.stack(shards[:1]), 1)
    with pytest.raises(ValueError, match=r"^shards is empty"):
        unshard([], 1)
    with pytest.raises(TypeError, match=r"^shards\[1\] must be a torch.Tensor, got NoneType$"):
        unshard([shards[0], None], 1)
    with pytest.raises(TypeError, match=r"^dim must be an int"):
        unshard(shards, "1")
    with pytest.raises(ValueError, match=r"^dim 4 is out of range"):
        unshard(shards, 4)
    with pytest.raises(ValueError, match=r"^shards\[1\] has shape \(2, 5, 2, 4\) but shards\[0\] has \(2, 5, 3, 4\)"):
        unshard([shards[0], shards[1][:, :, :2]], 1)
    with pytest.raises(ValueError, match=r"^shards\[1\] has shape \(5, 3, 4\)"):
        unshard([shards[0], shards[1][0]], 1)
    with pytest.raises(ValueError, match=r"^shards\[1\] is torch.float64 on cpu but shards\[0\] is torch.float32"):
        unshard([shards[0], shards[1].double()], 1)


# ------------------------------------------------------------------------------ FP8: non-finite inputs

@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("config", [fp8.FP8Config(), fp8.FP8Config(rotate=False, smooth_k=False)],
                         ids=["default", "plain"])
def test_fp8_a_non_finite_q_value_spoils_its_row_only(rng_seed, value, config):
    """An inf / NaN in Q set its Q block's descale (2^120 and more): the other rows of the block quantised to 0 and
    came out as the uniform average of V (error ~1 on N(0,1) inputs) with no NaN anywhere for an inf: a silently
    wrong O. Now that row is non-finite, as the maths says, and every other row keeps FP8's usual error."""
    g = torch.Generator().manual_seed(rng_seed)
    q, k, v = torch.randn(1, 40, 2, 64, generator=g), torch.randn(1, 40, 2, 64, generator=g), \
        torch.randn(1, 40, 2, 64, generator=g)
    exact = torch.nn.functional.scaled_dot_product_attention(*(x.double().transpose(1, 2) for x in (q, k, v)))
    q[0, 5, 1, 3] = value
    out, lse = fp8.fp8_attention_reference(q, k, v, config=config)
    bad = ~torch.isfinite(out).all(-1)
    assert bad[0, 5, 1] and bad.sum() == 1 and not torch.isfinite(lse[0, 1, 5])
    # the other rows (their block's descale now from its finite values only): FP8's usual error, ~0.05 here
    assert (out - exact.transpose(1, 2))[~bad].abs().max() < 0.2


@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("name", ["k", "v"])
def test_fp8_a_non_finite_k_or_v_value_is_never_a_finite_wrong_answer(rng_seed, name, value):
    """An inf in K or V saturated to 448 (a finite wrong value) and set its block's descale, zeroing the block's
    finite values. Now a row is either within the FP8 bound of the float64 answer or non-finite; rows that read the
    value are non-finite."""
    g = torch.Generator().manual_seed(rng_seed)
    q, k, v = torch.randn(1, 40, 2, 64, generator=g), torch.randn(1, 40, 2, 64, generator=g), \
        torch.randn(1, 40, 2, 64, generator=g)
    t = {"k": k, "v": v}[name]
    clean = dict(q=q, k=k.clone(), v=v.clone())
    t[0, 7, 0, 3] = value
    clean[name][0, 7, 0, 3] = 0.0  # the same inputs with a finite value there
    for config in (fp8.FP8Config(), fp8.FP8Config(rotate=False, smooth_k=False)):
        out, _ = fp8.fp8_attention_reference(q, k, v, causal=True, config=config)
        out_clean, _ = fp8.fp8_attention_reference(**clean, causal=True, config=config)
        exact = torch.nn.functional.scaled_dot_product_attention(
            *(clean[x].double().transpose(1, 2) for x in "qkv"), is_causal=True).transpose(1, 2)
        finite = torch.isfinite(out).all(-1)
        assert not finite[0, 7:, 0].any()  # causal rows 7.. read key 7 (head 0)
        # the rows that do not read the value: the clean inputs' result, bit for bit (the value reaches no other
        # row, no scale, no mean), and that result as close to float64 as FP8 gets (rel-L2 median 0.040, at most
        # 0.047 over 600 fresh draws; a max |error| bound of 0.2 failed on ~0.5 % of draws: single rows reach 0.22)
        assert torch.equal(out[finite], out_clean[finite])
        assert rel_l2(out_clean, exact) < 0.1


# ------------------------------------------------------------------- the reference and the tolerance helpers

def test_reference_names_a_bad_argument_and_never_broadcasts():
    """reference.attention_reference (the documented float64 reference) broadcast a k / v of batch 1 over q's
    batch 2 without a word (einsum broadcasts size-1 dims), failed inside einsum / reshape for other mismatches
    and for an int dtype; a str softmax_scale was parsed, a NaN one taken, head_dim 0 without one was a
    ZeroDivisionError; rel_l2 broadcast shapes that differ (max_abs_error already refused them)."""
    from fa_variants import reference

    q, k = torch.randn(2, 3, 2, 8), torch.randn(2, 4, 1, 8)
    cases = [
        ((q, k[:1], k[:1]), {}, ValueError, r"^q, k, v must have one batch"),
        ((q, k, k[..., :4]), {}, None, None),  # v's own head_dim: documented, still fine
        ((q, k[..., :4], k), {}, ValueError, r"^q has head_dim 8 but k has 4"),
        ((q, k, k[:, :2]), {}, ValueError, r"^k has shape \(2, 4, 1, 8\) but v has \(2, 2, 1, 8\)"),
        ((q, k, k.to("meta")), {}, ValueError, r"^q, k, v must be on one device"),
        ((q.int(), k, k), {}, TypeError, r"^q must be a floating-point tensor, got torch.int32$"),
        ((q, k, k), dict(dtype=torch.int32), TypeError, r"^dtype must be one of torch.float64, float32, float16, "),
        # e4m3 passed as floating-point and failed inside torch's matmul (a break-it pass, session 34)
        ((q, k, k), dict(dtype=torch.float8_e4m3fn), TypeError, r"^dtype must be one of torch.float64, float32"),
        ((q, k, k), dict(softmax_scale="0.1"), TypeError, r"^softmax_scale must be a real number"),  # was parsed
        ((q, k, k), dict(softmax_scale=math.nan), ValueError, r"^softmax_scale must be finite"),  # NaN out
        ((q, k, k), dict(softmax_scale=1e300), None, None),  # beyond the kernels' range: the reference takes it
        ((q[..., :0], k[..., :0], k), {}, ValueError, r"^head_dim is 0: the default softmax_scale"),  # ZeroDivision
        ((q[..., :0], k[..., :0], k), dict(softmax_scale=0.5), None, None),  # head_dim 0 with a scale: V's mean
    ]
    for args, kwargs, exc, message in cases:
        if exc is None:
            reference.attention_reference(*args, **kwargs)
            continue
        with pytest.raises(exc, match=message):
            reference.attention_reference(*args, **kwargs)
    x = torch.randn(1, 4, 2, 8)
    for other in (x[:, :1], x.transpose(1, 2)):
        with pytest.raises(ValueError, match=r"^shape \(1, 4, 2, 8\) differs from the reference's"):
            reference.rel_l2(x, other)
    assert reference.rel_l2(2 * x, x) == pytest.approx(1.0)


# ------------------------------------------------------------- fa_variants.emulate (the FA1 / FA2 tile loops)

@pytest.mark.parametrize("algorithm", ["standard", "fa1", "fa2"])
def test_tile_emulators_check_arguments_as_attention_does(rng_seed, algorithm):
    """emulate(...) ran an int32 q in float32, parsed a str softmax_scale, took causal="no" as True (truthy), and
    failed inside torch for a k on another device; hbm_counts gave negative traffic for a negative seqlen."""
    from fa_variants import emulate

    g = torch.Generator().manual_seed(rng_seed)
    q, k = torch.randn(1, 5, 2, 8, generator=g), torch.randn(1, 7, 1, 8, generator=g)
    cases = [
        ((q.int(), k.int(), k.int()), {}, TypeError, r"^q has dtype torch.int32; attention needs a floating-point"),
        ((q, k, k), dict(softmax_scale="0.1"), TypeError, r"^softmax_scale must be a real number"),
        ((q, k, k), dict(softmax_scale=math.inf), ValueError, r"^softmax_scale must be finite"),
        ((q, k, k), dict(causal="no"), TypeError, r"^causal must be a bool, got 'no'$"),
        ((q, k, k.to("meta")), {}, ValueError, r"^q is on cpu but v is on meta"),
        ((q, k, k.double()), {}, TypeError, r"^q has dtype torch.float32 but v has dtype torch.float64"),
    ]
    if algorithm != "standard":
        cases.append(((q, k, k), dict(Bc=2.5), TypeError, r"^Bc must be an int, got 2.5$"))
    for args, kwargs, exc, message in cases:
        with pytest.raises(exc, match=message):
            emulate.emulate(algorithm, *args, **kwargs)
    with pytest.raises(ValueError, match=r"^seqlens must be >= 0, got Nq=-4"):
        emulate.hbm_counts(algorithm, 1, 1, -4, 4, 8)


# ----------------------------------------------------------------------- files: the fixture, a model folder

def _write_fixture_like(path, payload):
    if isinstance(payload, bytes):
        path.write_bytes(payload)
        return path
    buf = io.BytesIO()
    torch.save(payload, buf)
    path.write_bytes(lzma.compress(buf.getvalue()))
    return path


@pytest.mark.parametrize("payload, message", [
    (b"not lzma", r"not a fixture file \(not lzma-compressed\)"),                      # LZMAError
    (lzma.compress(b"not a pickle"), r"not a fixture file \(not a torch.save"),  # UnpicklingError
    ([1, 2], r"not a fixture file \(holds a list, not a dict\)"),                      # 'list' has no 'get'
    ({"format": 1, "text": "x"}, r"fixture fields missing: model_name, input_ids"),   # TypeError from __init__
    ({"format": -1}, r"fixture format -1, expected \d+; regenerate it with python -m"),  # another version
])
def test_a_corrupt_fixture_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys, payload, message):
    """Fixture.load of a file that is not a fixture raised lzma's / pickle's / a dict lookup's error, and
    `fa-variants demo` (which loads $FA_VARIANTS_FIXTURE when it exists) printed a traceback, exit 1."""
    from fa_variants import cli
    from fa_variants.integrations import fixture

    path = _write_fixture_like(tmp_path / "bad.pt.xz", payload)
    with pytest.raises(ValueError, match=rf"^{path}: {message}"):
        fixture.load_real_input(path)
    monkeypatch.setenv(fixture.ENV_VAR, str(path))
    assert cli.main(["demo", "--seqlen", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fa-variants demo: error: {path}: ") and "\n" not in err, err


@pytest.mark.parametrize("manifest", ["{", "[]", '{"bytes": 1, "sha256": "x"}',
                                      '{"bytes": 1, "sha256": "x", "parts": "p"}',
                                      '{"bytes": 1, "sha256": "x", "parts": [{"name": "p"}]}',
                                      '{"bytes": 1, "sha256": "x", "parts": [{"name": "../p", "bytes": 1}]}'])
def test_a_malformed_model_folder_manifest_is_one_line(tmp_path, manifest):
    """read_weights (fp8-study --model-dir) took chunks.json as it came: json's error, a KeyError 'parts' or
    'bytes', a TypeError for a list; a piece name with a folder part was joined to the folder."""
    from fa_variants.integrations import model_dir

    (tmp_path / model_dir.MANIFEST).write_text(manifest, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^model_dir {tmp_path}: chunks.json is not"):
        model_dir.read_weights(tmp_path)


@pytest.mark.parametrize("text, message", [
    ("{", r"not JSON \("),
    ("[1, 2]", r"not an fp8_study.json of `fa-variants fp8-study`"),           # TypeError traceback before
    ('{"meta": {}, "results": []}', r"not an fp8_study.json of `fa-variants fp8-study`"),  # KeyError 'setup'
])
def test_fp8_study_merge_names_a_file_that_is_not_a_study(tmp_path, capsys, text, message):
    from fa_variants import cli

    bad = tmp_path / "other.json"
    bad.write_text(text, encoding="utf-8")
    assert cli.main(["fp8-study", "--merge", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"fa-variants fp8-study: error: --merge {bad}: "), err
    assert re.search(message, err), err


def test_quantize_fp8_takes_one_dtype():
    """quantize_fp8 took q, k, v of different dtypes (attention and attention_fp8 refuse them): harmless on the
    torch path, but the GPU pass compiles V's pass, which also reads K for its mean, for V's dtype."""
    q, k = torch.randn(1, 3, 2, 64, dtype=torch.float16), torch.randn(1, 5, 1, 64, dtype=torch.float16)
    for impl in ("torch", "auto"):
        with pytest.raises(TypeError, match=r"^q has dtype torch.float16 but k has dtype torch.bfloat16; they must"):
            fp8.quantize_fp8(q, k.bfloat16(), k, impl=impl)
        with pytest.raises(TypeError, match=r"^q has dtype torch.float16 but v has dtype torch.float32"):
            fp8.quantize_fp8(q, k, k.float(), impl=impl)


# ------------------------------------------------------------------------ the kernels' operand strides

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_a_length_1_dimension_is_restrided_not_refused(dtype):
    """interop.aligned (every kernel's operand rule): a length-1 dimension whose stride breaks the 16-byte rule (torch
    calls the tensor contiguous: that stride is never used) becomes a view of the same memory with the contiguous
    stride there, no copy; before session 33 it raised "cannot be 16-byte aligned", blaming the last dimension."""
    from fa_variants.common import interop

    x = torch.zeros(2, 8, 128, dtype=dtype)
    q = x.unsqueeze(-1).transpose(-1, -2).transpose(1, 2)  # (2, 1, 8, 128), strides (1024, 1, 128, 1)
    assert q.is_contiguous() and not interop.is_aligned(q)
    rows = torch.zeros(2, 64 * 4 * 128 + 1, dtype=dtype)[:1, :64 * 4 * 128].view(1, 64, 4, 128)  # batch stride odd
    for t, strides in ((q, (1024, 1024, 128, 1)), (rows, (32768, 512, 128, 1))):
        a = interop.aligned(t)
        assert a.stride() == strides and a.data_ptr() == t.data_ptr() and interop.is_aligned(a)
        assert torch.equal(a.float(), t.float())
    wide = torch.zeros(2, 1, 8, 130, dtype=torch.bfloat16)[..., :128]  # a real stride problem: still a copy
    assert interop.aligned(wide).data_ptr() != wide.data_ptr()
    plain = torch.zeros(2, 1, 8, 128, dtype=torch.bfloat16)
    assert interop.aligned(plain) is plain and interop.unit_dims_restrided(plain) is plain


def test_paths_from_the_environment_are_read_alike(monkeypatch, tmp_path):
    """FA_VARIANTS_CACHE_DIR / FA_VARIANTS_FIXTURE: blank values are unset (a " " made a folder named " " in the
    working directory), surrounding spaces are stripped; a leading ~ without a home directory, and no home directory
    at all, are OSErrors naming what to set (pathlib's RuntimeError traceback before: session 49's environment
    probe); a FA_VARIANTS_FIXTURE that names no file (yet: capture writes there too) means no fixture, and
    fixture.named_but_missing says so for the messages of what needed one."""
    import pathlib

    from fa_variants.common import diskcache, paths
    from fa_variants.integrations import fixture

    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for blank in ("", " ", "\t "):
        monkeypatch.setenv(diskcache.ENV_DIR, blank)
        assert diskcache.root() == tmp_path / ".cache" / "fa_variants"
        monkeypatch.setenv(fixture.ENV_VAR, blank)
        assert fixture.candidate_paths()[-1] == tmp_path / ".cache" / "fa_variants" / fixture.FILENAME
    monkeypatch.setenv(diskcache.ENV_DIR, f" {tmp_path / 'c'} ")
    assert diskcache.root() == tmp_path / "c"

    def no_home(cls=None):
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("HOME")
    monkeypatch.setattr(pathlib.Path, "home", classmethod(no_home))
    monkeypatch.setattr(pathlib.Path, "expanduser", lambda self: no_home() if str(self).startswith("~") else self)
    assert paths.home() is None
    monkeypatch.setenv(diskcache.ENV_DIR, "~/cache")
    with pytest.raises(OSError, match=r"^FA_VARIANTS_CACHE_DIR: ~/cache starts with ~ but there is no home"):
        diskcache.root()
    monkeypatch.setenv(fixture.ENV_VAR, "~/f.pt.xz")
    with pytest.raises(OSError, match=r"^FA_VARIANTS_FIXTURE: ~/f.pt.xz starts with ~"):
        fixture.load_real_input()
    monkeypatch.delenv(fixture.ENV_VAR)
    assert len(fixture.candidate_paths()) == 2  # the checkout's and the working directory's: no home candidate
    with pytest.raises(OSError, match="set FA_VARIANTS_FIXTURE or give --out"):
        fixture.default_path()
    monkeypatch.undo()  # the real pathlib again: ~user of no user, and a relative HOME
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv(diskcache.ENV_DIR, "~no_such_user_fa/x")
    with pytest.raises(OSError, match=r"^FA_VARIANTS_CACHE_DIR: ~no_such_user_fa/x: there is no user 'no_such_user"):
        diskcache.root()
    monkeypatch.setenv("HOME", "relative/home")
    monkeypatch.setenv(diskcache.ENV_DIR, "~/c")  # was relative/home/c under the working directory
    with pytest.raises(OSError, match=r"^FA_VARIANTS_CACHE_DIR: ~/c starts with ~ but there is no home directory"):
        diskcache.root()
    monkeypatch.setenv(fixture.ENV_VAR, str(tmp_path / "absent.pt.xz"))  # capture's place too: no fixture, said
    assert fixture.find_fixture() is None
    assert fixture.named_but_missing() == f"FA_VARIANTS_FIXTURE={tmp_path}/absent.pt.xz names no file"
