"""The contexts a caller's code runs the package under (session 50's break-it pass): forward-mode AD through a
tensor subclass, under torch.compile and on the custom op; torch.func.vmap and FakeTensorMode over the FP8 recipe;
vmapped or multi-element values in one-line messages; tensors with torch's negative bit at the kernel boundary."""
from __future__ import annotations

import math

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from helpers import racing_threads, seeded_generator

import fa_variants
from fa_variants.fp8 import emulate_fp8_attention, quantize_fp8


class Sub(torch.Tensor):
    """A user's tensor subclass (not one of tracing's fake / functional tensors)."""


def _qkv(dtype=torch.float64, head_dim=8, seqlen_k=5):
    g = seeded_generator()
    q = torch.randn(1, 5, 2, head_dim, generator=g, dtype=dtype)
    k, v = (torch.randn(1, seqlen_k, 2, head_dim, generator=g, dtype=dtype) for _ in range(2))
    return q, k, v, torch.randn(q.shape, generator=g, dtype=dtype)


def _jvp(f, q, t):
    """f's output and its tangent along t, by torch.func.jvp on the reference's plain PyTorch (the expected value)."""
    return torch.func.jvp(f, (q,), (t,))


def test_a_subclass_q_keeps_its_forward_mode_tangent():
    """A subclass q counted as "traced", which skipped the transform check and sent the call to the custom op, which
    has no forward-mode rule: the output came back with no tangent, without a word."""
    q, k, v, t = _qkv()
    want = _jvp(lambda q: fa_variants.attention(q, k, v, causal=True), q, t)[1]
    with fwAD.dual_level():
        out = fa_variants.attention(fwAD.make_dual(q.as_subclass(Sub), t), k, v, causal=True)
        tangent = fwAD.unpack_dual(out).tangent
    assert tangent is not None
    torch.testing.assert_close(tangent.as_subclass(torch.Tensor), want, rtol=1e-12, atol=1e-12)


def test_forward_mode_ad_under_torch_compile_keeps_its_tangent_or_refuses():
    """torch.compile did not trace a dual input (torch 2.14) and ran attention eagerly, but compiled `api._tracing`'s
    small frame on its own, where torch.compiler.is_compiling() is baked in as True: the eager call took the op's path
    and lost its tangent. The answer is now read in attention's own frame. Where a torch release traces the call
    (2.13) the op is reached with the tangent and refuses in one line: either is the rule, a silent None is not."""
    q, k, v, t = _qkv()
    want = _jvp(lambda q: fa_variants.attention(q, k, v), q, t)[1]
    compiled = torch.compile(lambda q: fa_variants.attention(q, k, v), backend="eager")
    torch._dynamo.reset()
    try:
        with fwAD.dual_level():
            tangent = fwAD.unpack_dual(compiled(fwAD.make_dual(q, t))).tangent
    except NotImplementedError as refused:
        assert str(refused).startswith("torch.ops.fa_variants.attention has no forward-mode AD rule")
        return
    finally:
        torch._dynamo.reset()
    assert tangent is not None
    torch.testing.assert_close(tangent, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["attention", "attention_seqlens_k"])
def test_the_custom_op_refuses_a_forward_mode_tangent(op):
    """Called directly with a dual input, the op ran below autograd (no input requires grad) and dropped the tangent
    (None). Now one line naming the way that works."""
    q, k, v, t = _qkv()
    lengths = (torch.tensor([k.shape[1]], dtype=torch.int32),) if op == "attention_seqlens_k" else ()
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match=r"^torch.ops.fa_variants.attention has no "
                                                                     r"forward-mode AD rule .*backend='reference'"):
        getattr(torch.ops.fa_variants, op)(fwAD.make_dual(q, t), k, v, *lengths, False, None, "reference")


def test_a_kernel_backend_refuses_a_subclass_q_with_a_tangent(fake_gpu):
    """On a kernel backend (the fake sm_90's fa3), a plain q with a tangent was refused in one line but a subclass q
    ran the kernel and returned no tangent."""
    q, k, v, t = _qkv(torch.bfloat16, head_dim=16)
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match=r"^backend fa3 does not support forward-mode"):
        fa_variants.attention(fwAD.make_dual(q.as_subclass(Sub), t), k, v)
    assert not fake_gpu


def test_quantize_fp8_under_vmap_is_one_line():
    """vmap over the FP8 recipe failed with PyTorch's "called random operation" (the rotation's seeded signs) or,
    with randomness="same", "data-dependent control flow" from deep inside."""
    q, k, v, _ = _qkv(torch.float32, head_dim=64)
    for randomness in ("error", "same"):
        with pytest.raises(NotImplementedError, match=r"^quantize_fp8: q is batched by torch.func.vmap, which the "
                                                      r"recipe does not support; fold"):
            torch.func.vmap(lambda q: quantize_fp8(q, k, v).q, randomness=randomness)(q[None].expand(3, -1, -1, -1, -1))


def test_the_fp8_recipe_and_emulation_run_on_fake_tensors():
    """Under FakeTensorMode (shape inference, torch.export's tracing) the recipe raised DataDependentOutputException
    from its CPU overflow-shift shortcut; the emulation from its huge-row test. Now the shapes of a real call, as on
    meta tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = torch.randn(1, 5, 4, 64), torch.randn(1, 300, 2, 64), torch.randn(1, 300, 2, 64)
        inputs = quantize_fp8(q, k, v)
        out, lse = emulate_fp8_attention(inputs, causal=True)
    assert inputs.q.dtype == torch.float8_e4m3fn and inputs.q.shape == q.shape
    assert out.shape == (1, 5, 4, 64) and lse.shape == (1, 4, 5)


def test_a_vmapped_softmax_scale_is_one_line():
    """vmap over softmax_scale embedded the BatchedTensor's three-line repr in the TypeError, and advised .item(),
    which cannot work under vmap."""
    q = _qkv()[0]
    with pytest.raises(TypeError) as raised:
        torch.func.vmap(lambda s: fa_variants.attention(q, q, q, softmax_scale=s))(torch.tensor([0.1, 0.2]))
    message = str(raised.value)
    assert "\n" not in message and ".item()" not in message
    assert message.startswith("softmax_scale must be a real number or None, got a tensor batched by torch.func.vmap")


@pytest.mark.parametrize("value, shown", [
    (torch.ones(3, 2), "a tensor of shape (3, 2) and dtype torch.float32"),
    ("BatchedTensor", "'BatchedTensor'"),
    ("two\nlines", "'two\\nlines'"),
    (list(range(100)), str(list(range(100)))[:80] + "... (list)"),
])
def test_one_line_shows_a_rejected_value_on_one_short_line(value, shown):
    from fa_variants.common.checks import one_line

    assert one_line(value) == shown


@pytest.mark.parametrize("name", ["causal", "return_lse", "backend"])
def test_a_tensor_flag_is_named_on_one_line(name):
    """A multi-element tensor where a flag goes printed its repr over several lines."""
    q = _qkv()[0]
    with pytest.raises(TypeError, match=rf"^{name} must be a (bool|str), got a tensor of shape \(4, 4\) and dtype "
                                        r"torch.float32$"):
        fa_variants.attention(q, q, q, **{name: torch.ones(4, 4)})


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_negative_bit_view_reaches_the_kernel_resolved(fake_gpu, which):
    """``torch._neg_view(x)`` holds -x in memory with a flag that says so: the kernel boundary passed it on as it
    was (the kernels read memory: -x taken for x), under the same plan key as a plain tensor's."""
    q, k, v, _ = _qkv(torch.bfloat16, head_dim=16)
    plain = [q, k, v]
    fa_variants.attention(*plain)  # plans the plain kind first
    negated = list(plain)
    negated[which] = torch._neg_view(plain[which])
    out = fa_variants.attention(*negated)
    args = fake_gpu[-1]
    assert not any(args[n].is_neg() for n in "qkv")
    resolved = list(plain)
    resolved[which] = -plain[which]
    torch.testing.assert_close(out, fa_variants.attention(*resolved, backend="reference"), rtol=0, atol=0)


def _hidden_nonfinite_v(dtype=torch.float64):
    """Causal inputs whose V holds +inf, -inf and NaN at keys some rows cannot see (and at keys they see)."""
    g = seeded_generator(offset=7)
    q, k, v = (torch.randn(2, n, 2, 8, generator=g, dtype=dtype) for n in (7, 11, 11))
    v[0, 10, 0, 1], v[1, 9, 1, 2], v[0, 4, 1, 3], v[1, 6, 0, 0] = math.inf, -math.inf, math.nan, math.inf
    q[0, 2] *= 1e3  # P underflows to 0 at some keys that row sees
    return q, k, v


def test_the_branch_free_nonfinite_path_equals_the_eager_one(monkeypatch):
    """Where V's values cannot steer Python the reference used to skip its hidden-key rule (rows NaN); it now adds
    the non-finite entries' share by products (`reference._nonfinite_terms`). Forced here on plain tensors: the same
    NaN / inf pattern and the same finite values as the eager path that reads which keys hold them."""
    from fa_variants import reference

    q, k, v = _hidden_nonfinite_v()
    eager = reference.attention_reference(q, k, v, causal=True)[0]
    monkeypatch.setattr(reference.host_values, "unreadable", lambda t: "forced")
    forced = reference.attention_reference(q, k, v, causal=True)[0]
    assert torch.equal(eager.isnan(), forced.isnan()) and torch.equal(eager.isinf(), forced.isinf())
    assert eager.isfinite().any() and not eager.isfinite().all()  # the case holds both kinds of rows
    infinite = eager.isinf()
    assert torch.equal(eager[infinite], forced[infinite])
    torch.testing.assert_close(forced[eager.isfinite()], eager[eager.isfinite()], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("how", ["compile", "vmap", "eager caller, compiled helper"])
def test_a_hidden_nonfinite_v_stays_out_of_rows_under_compile_and_vmap(how):
    """A V = inf at a key a causal row cannot see gave NaN rows where torch.compile traced the reference (its
    is_compiling() check, also taken in a helper frame compiled on its own while attention ran eagerly: a numpy
    scale makes torch.compile run the call so) and under vmap over V."""
    import numpy as np

    from fa_variants.reference import attention_reference

    q, k, v = _hidden_nonfinite_v(torch.float32)
    want = attention_reference(q, k, v, causal=True, dtype=torch.float32)[0]
    if how == "compile":
        got = torch.compile(lambda q, k, v: attention_reference(q, k, v, causal=True, dtype=torch.float32)[0],
                            backend="eager", fullgraph=True)(q, k, v)
    elif how == "vmap":
        got = torch.func.vmap(lambda q, k, v: attention_reference(q[None], k[None], v[None], causal=True,
                                                                  dtype=torch.float32)[0][0])(q, k, v)
    else:
        scale = np.float64(8 ** -0.5)
        got = torch.compile(lambda q: fa_variants.attention(q, k, v, causal=True, softmax_scale=scale,
                                                            backend="reference"), backend="eager")(q)
    torch._dynamo.reset()
    assert torch.equal(got.isfinite(), want.isfinite())
    torch.testing.assert_close(got[want.isfinite()], want[want.isfinite()], rtol=1e-5, atol=1e-5)


def test_the_fp8_recipe_runs_on_fake_tensors_at_head_dim_96():
    """head_dim 96's rotation read its Paley matrix's entries from a tensor made inside the caller's FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.randn(1, 5, 2, 96)
        inputs = quantize_fp8(q, q, q)
    assert inputs.q.shape == q.shape


def test_negative_bit_inputs_are_resolved_for_the_fp8_recipe_and_interop():
    """``x.conj().imag`` (public) and ``torch._neg_view`` hold -x in memory: DLPack, the kernels' binding, drops the
    bit. interop.aligned (every kernel operand) and quantize_fp8's entry resolve it."""
    from fa_variants.common import interop

    x = torch.randn(2, 4, 16)
    for view in (torch._neg_view(x), torch.complex(torch.zeros_like(x), x).conj().imag):
        resolved = interop.aligned(view)
        assert not resolved.is_neg() and torch.equal(resolved, -x)
    q, k, v, _ = _qkv(torch.float32, head_dim=64)
    want = quantize_fp8(-q, k, v)
    got = quantize_fp8(torch._neg_view(q), k, v)
    assert not got.q.is_neg() and torch.equal(got.q.float(), want.q.float())


def test_negative_bit_lengths_are_resolved():
    """seqlens_k with the negative bit (a kernel reads -n from memory while the range check read n)."""
    from fa_variants import api

    q, k, _, _ = _qkv()
    lengths, _ = api._check_lengths(q, k, torch._neg_view(torch.tensor([-3], dtype=torch.int32)))
    assert not lengths.is_neg() and lengths.tolist() == [3]


def test_scratch_kept_past_a_call_is_never_an_inference_tensor(monkeypatch):
    """The stream's cached scratch (and the process's constants) first made under torch.inference_mode() were
    inference tensors: every later call outside it that writes the scratch in place (fa3's split merge into the LSE
    scratch, FA_VARIANTS_MERGE_KERNEL=0) failed with "Inplace update to inference tensor outside InferenceMode"."""
    from fa_variants.common import workspace

    monkeypatch.setattr(workspace, "CACHE_CPU", True)  # the CPU's scratch cached as a CUDA stream's
    workspace.clear()
    try:
        with torch.inference_mode():
            first = workspace.lse_function(torch.device("cpu"), (1, 4, 8))()
            constant = workspace.persistent(torch.device("cpu"), lambda: torch.zeros(3))
        assert not first.is_inference() and not constant.is_inference()
        with torch.no_grad():
            workspace.lse_function(torch.device("cpu"), (1, 4, 8))().copy_(torch.ones(1, 4, 8))
    finally:
        workspace.clear()


def test_plans_stay_bounded_and_whole_under_threads(monkeypatch):
    """remember_plan looked for the oldest key while another thread inserted one ("dictionary changed size during
    iteration", after the call's result was computed), and concurrent evictions let the cache pass its bound."""
    from fa_variants import dispatch

    monkeypatch.setattr(dispatch, "MAX_PLANS", 2)
    monkeypatch.setattr(dispatch, "PLANS", {})
    errors = []

    def remember(thread):
        try:
            for i in range(20000):
                dispatch.remember_plan((thread, i), None)
                assert len(dispatch.PLANS) <= 2
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    racing_threads(remember, 4)
    assert not errors and len(dispatch.PLANS) <= 2


def test_the_backward_runs_on_the_forward_s_backend(fake_gpu, monkeypatch):
    """The backward chose its backend again from "auto": a FA_VARIANTS_BACKEND set between forward and backward made
    it refuse (or switch paths). The forward's choice is kept for it."""
    import warnings

    from fa_variants import dispatch

    q, k, v, _ = _qkv(torch.float16, head_dim=16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
        out = fa_variants.attention(q, k, v, causal=True)
        monkeypatch.setenv(dispatch.ENV_VAR, "fa2")  # absent on the fake sm_90
        out.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_the_fp8_package_imported_inside_fake_tensor_mode_still_quantises(tmp_path):
    """head_dim 96's Paley entries were read from a tensor at import: a first import inside FakeTensorMode (or a
    non-strict torch.export trace) raised, or kept symbolic entries that broke every later head_dim 96 call."""
    import subprocess
    import sys

    from helpers import subprocess_env

    script = ("import torch\nfrom torch._subclasses.fake_tensor import FakeTensorMode\n"
              "with FakeTensorMode():\n    from fa_variants.fp8 import quantize_fp8\n"
              "q = torch.randn(1, 5, 2, 96)\nprint(quantize_fp8(q, q, q).q.shape)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=subprocess_env(),
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torch.Size([1, 5, 2, 96])" in done.stdout
