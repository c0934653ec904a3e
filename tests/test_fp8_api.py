"""The FP8 entry points and the fa3-fp8 backend's glue (fa_variants.fp8.attention, fa_variants.fp8.fa3_fp8).

On the CPU the kernel cannot run, so the glue is tested against a fake kernel module whose ``run_fp8`` is the
emulation, with the device capability faked to sm_90: what reaches the kernel (the quantised inputs), what
comes back (LSE shifted back for smoothed K), the dispatcher's choices (auto never picks FP8 for 16-bit
inputs) and every error (not built, not CUDA, no FP8 WGMMA, bad arguments).
"""
import contextlib
import dataclasses
import sys
import types

import pytest
import torch

import fa_variants
from fa_variants import dispatch, registry
from fa_variants.dispatch import BackendUnavailableError
from fa_variants.fp8 import (FP8Config, attention_fp8, attention_from_fp8, emulate_fp8_attention,
                             fp8_attention_reference, quantize_fp8)
from fa_variants.fp8 import attention as fp8_attention
from fa_variants.fp8 import layout
from fa_variants.fp8.quantize import quantize_fp8_torch
from helpers import assert_fp8_lse_ok, seeded_generator

BF16 = torch.bfloat16


@dataclasses.dataclass(frozen=True)
class KernelConfig:  # the fields of the kernel's Fp8Config the glue sets
    two_level: bool = True
    pv_split: int = 2
    pv_buffers: int = 2
    promote_every: int = 1


FACE = registry.ENTRIES["fa3-fp8"].module  # fa_variants.fp8.fa3_fp8: builds its VARIANT from KERNEL_MODULE on import


@contextlib.contextmanager
def face_reimported(monkeypatch, kernel_module: str):
    """Inside: ``attention.KERNEL_MODULE`` is `kernel_module` and the fa3-fp8 dispatch face (FACE) is imported
    afresh on first use, so its VARIANT is built from that kernel. On exit the face imported inside is dropped
    from sys.modules and from its package (``fa_variants.fp8.fa3_fp8``), and the one from before, if any, comes
    back (monkeypatch's undo, after this): a face built on a fake kernel (a Variant with no default_config or
    build) must not outlive the test, or a later compile of fa3-fp8 in this process gets it."""
    import fa_variants.fp8 as package

    monkeypatch.setattr(fp8_attention, "KERNEL_MODULE", kernel_module)
    monkeypatch.delitem(sys.modules, FACE, raising=False)
    monkeypatch.delattr(package, "fa3_fp8", raising=False)
    dispatch.clear_cache()
    try:
        yield
    finally:
        sys.modules.pop(FACE, None)
        package.__dict__.pop("fa3_fp8", None)
        dispatch.clear_cache()


@pytest.fixture
def absent_kernel(monkeypatch):
    """The kernel module does not exist (whatever this checkout has)."""
    with face_reimported(monkeypatch, "fa_variants._absent_fp8_kernel"):
        yield


def install_fake_kernel(monkeypatch, calls: list) -> None:
    """A kernel module whose run_fp8 is the emulation (appending its calls to `calls`), on a faked sm_90, the
    other kernel backends absent. Use inside ``face_reimported(monkeypatch, "_fake_fp8_kernel")``."""

    def run_fp8(inputs, *, causal, out_dtype, config=None):
        calls.append(dict(inputs=inputs, causal=causal, out_dtype=out_dtype, config=config))
        every = inputs.config.promote_interval(inputs.head_dim)  # None: the kernel's default interval
        assert (config is None) == (inputs.config.two_level and every == layout.promote_every(inputs.head_dim))
        return emulate_fp8_attention(inputs, causal=causal, out_dtype=out_dtype)

    module = types.ModuleType("_fake_fp8_kernel")
    module.run_fp8 = run_fp8
    module.DEFAULT_CONFIGS = {d: KernelConfig(promote_every=layout.promote_every(d)) for d in (64, 96, 128, 256)}
    monkeypatch.setitem(sys.modules, "_fake_fp8_kernel", module)
    sm90 = lambda device: (9, 0)  # noqa: E731
    monkeypatch.setattr(dispatch, "device_capability", sm90)
    monkeypatch.setattr(fp8_attention, "device_capability", sm90)
    for name in ("fa3", "fa2", "fa1"):  # the real kernels cannot run on CPU tensors
        monkeypatch.setitem(registry.ENTRIES, name, registry.Entry(f"fa_variants._absent.{name}", "x"))
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    dispatch.clear_cache()


@pytest.fixture
def fake_kernel(monkeypatch):
    """A kernel module whose run_fp8 is the emulation, on a faked sm_90; returns the list of its calls."""
    calls = []
    with face_reimported(monkeypatch, "_fake_fp8_kernel"):
        install_fake_kernel(monkeypatch, calls)
        yield calls


def test_fake_face_does_not_outlive_the_fixture(monkeypatch):
    """Regression (order dependence): the face imported against the fake kernel (a VARIANT with no
    default_config) once stayed in sys.modules after ``fake_kernel``, so a later ``fa-variants compile --variant
    fa3-fp8`` in the same process (tests/test_fa3_fp8_compile.py after this file) failed with TypeError."""
    import fa_variants.fp8 as package

    before = sys.modules.get(FACE), getattr(package, "fa3_fp8", None)
    with monkeypatch.context() as patch:
        with face_reimported(patch, "_fake_fp8_kernel"):
            install_fake_kernel(patch, [])
            fake = registry.variant("fa3-fp8")
            assert fake.default_config is None and sys.modules[FACE] is not before[0]
            with pytest.raises(ValueError, match="^fa3-fp8 has no default config: its Variant record defines no"):
                registry.static_config("fa3-fp8", "sm_90a", "e4m3", 64, False)  # one line, not a TypeError
    assert sys.modules.get(FACE) is before[0] and getattr(package, "fa3_fp8", None) is before[1]
    loaded = registry.load("fa3-fp8")  # the real face again (or "not built yet" on a checkout without the kernel)
    assert loaded is not fake
    if not isinstance(loaded, str):
        cfg = registry.static_config("fa3-fp8", "sm_90a", "e4m3", 64, False)
        assert cfg.config is not None and loaded.build is not None


def qkv(nq=70, nk=150, h=4, hkv=2, d=64, dtype=BF16, seed=0):
    g = seeded_generator(offset=seed)
    return (torch.randn(1, n, heads, d, generator=g).to(dtype) for n, heads in ((nq, h), (nk, hkv), (nk, hkv)))


def test_not_built(absent_kernel):
    q, k, v = qkv()
    with pytest.raises(BackendUnavailableError, match="^fa3-fp8 is not built yet$"):
        attention_fp8(q, k, v)
    with pytest.raises(BackendUnavailableError, match="^fa3-fp8 is not built yet$"):
        attention_from_fp8(quantize_fp8(q, k, v))
    with pytest.raises(BackendUnavailableError, match="fa3-fp8 is not built yet"):
        dispatch.select((9, 0), BF16, 64, backend="fa3-fp8")
    assert dispatch.load("fa3-fp8") == "fa3-fp8 is not built yet"


def test_cpu_tensors_and_other_gpus(fake_kernel, monkeypatch):
    q, k, v = qkv()
    monkeypatch.setattr(fp8_attention, "device_capability", lambda device: None)
    with pytest.raises(BackendUnavailableError, match="runs on CUDA tensors"):
        attention_fp8(q, k, v)
    monkeypatch.setattr(fp8_attention, "device_capability", lambda device: (8, 0))
    with pytest.raises(BackendUnavailableError, match="needs FP8 WGMMA \\(sm_90\\); this GPU is sm_80"):
        attention_fp8(q, k, v)
    assert not fake_kernel


@pytest.mark.parametrize("causal", [False, True])
def test_attention_fp8_through_the_dispatcher(fake_kernel, causal):
    """attention(backend='fa3-fp8') on bf16: default recipe, the kernel gets FP8Inputs, the LSE comes back
    shifted to the unsmoothed logits; equal to the end-to-end emulation."""
    q, k, v = qkv()
    sel = fa_variants.select_backend(q, k, v, backend="fa3-fp8")
    assert sel.backend == "fa3-fp8" and "quantised to e4m3" in sel.reason and "bfloat16" in sel.reason
    out, lse = fa_variants.attention(q, k, v, causal=causal, backend="fa3-fp8", return_lse=True)
    (call,) = fake_kernel
    assert call["inputs"].config == FP8Config() and call["causal"] is causal and call["out_dtype"] == BF16
    assert call["inputs"].q.dtype == torch.float8_e4m3fn
    expect, expect_lse = fp8_attention_reference(q, k, v, causal=causal, out_dtype=BF16)
    assert out.dtype == BF16 and torch.equal(out, expect)
    torch.testing.assert_close(lse, expect_lse, rtol=0, atol=0)
    assert_fp8_lse_ok(lse, q, k, v, causal)  # the unsmoothed LSE, within the FP8 bound of float64's


def test_auto_never_picks_fp8_for_16_bit(fake_kernel):
    """Even with no other kernel available, auto gives bf16 to the reference (with a warning), not FP8; it
    does pick fa3-fp8 for e4m3 inputs."""
    q, k, v = qkv()
    with pytest.warns(dispatch.BackendFallbackWarning):
        sel = fa_variants.select_backend(q, k, v)
    assert sel.backend == "reference" and "fa3-fp8" in sel.candidates and "fa3-fp8" not in sel.reason
    q8, k8, v8 = (t.float().to(torch.float8_e4m3fn) for t in (q, k, v))
    with pytest.warns(dispatch.BackendFallbackWarning, match="fa3 is not built yet"):  # the fixture's doing
        assert dispatch.select((9, 0), torch.float8_e4m3fn, 64).backend == "fa3-fp8"
    out = fa_variants.attention(q8, k8, v8, backend="fa3-fp8")
    inputs = fp8_attention.from_e4m3(q8, k8, v8, softmax_scale=64 ** -0.5)
    assert torch.equal(out, emulate_fp8_attention(inputs, out_dtype=BF16)[0])
    assert (inputs.q_descale == 1).all() and inputs.v_t.shape == (1, 2, 64, 160)


def test_attention_from_fp8_config_and_empty(fake_kernel):
    q, k, v = qkv()
    cfg = FP8Config(granularity="head", rotate=False, smooth_k=False, two_level=False)
    inputs = quantize_fp8(q, k, v, config=cfg, softmax_scale=0.2)
    out = attention_from_fp8(inputs, causal=True, out_dtype=torch.float16)
    default = layout.promote_every(64)  # the kernel's default interval at head_dim 64 (layout.KERNEL_PROMOTE_EVERY)
    other = 4 if default != 4 else 2
    assert fake_kernel[0]["config"] == KernelConfig(two_level=False, pv_split=1, pv_buffers=1, promote_every=default)
    assert out.dtype == torch.float16 and torch.equal(out, emulate_fp8_attention(inputs, causal=True,
                                                                                out_dtype=torch.float16)[0])
    inputs = quantize_fp8(q, k, v, config=FP8Config(promote_every=3), softmax_scale=0.2)  # head_dim 64
    attention_from_fp8(inputs)
    assert fake_kernel[-1]["config"] == KernelConfig(promote_every=3)
    attention_from_fp8(quantize_fp8(q, k, v, config=FP8Config(promote_every=other)))  # not the default interval
    assert fake_kernel[-1]["config"] == KernelConfig(promote_every=other)
    attention_from_fp8(quantize_fp8(q, k, v, config=FP8Config(promote_every=default)))  # the default's: no config
    assert fake_kernel[-1]["config"] is None
    out, lse = attention_from_fp8(quantize_fp8(q, k[:, :0], v[:, :0]), return_lse=True)  # seqlen_k = 0
    assert (out == 0).all() and torch.isneginf(lse).all() and len(fake_kernel) == 4


def test_validation(fake_kernel):
    q, k, v = qkv()
    with pytest.raises(TypeError, match="FP8Inputs"):
        attention_from_fp8((q, k, v))
    inputs = quantize_fp8(q, k, v)
    with pytest.raises(TypeError, match="out_dtype"):
        attention_from_fp8(inputs, out_dtype=torch.float32)
    with pytest.raises(TypeError, match="causal"):
        attention_from_fp8(inputs, causal=1)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        attention_fp8(q.float(), k.float(), v.float())
    with pytest.raises(ValueError, match="num_heads 4 not divisible by num_heads_kv 3"):
        attention_fp8(q, torch.cat([k, k[:, :, :1]], 2), torch.cat([v, v[:, :, :1]], 2))
    with pytest.raises(ValueError, match="FP8Config.granularity"):
        attention_fp8(q, k, v, config=FP8Config(granularity="rows"))
    with pytest.raises(ValueError, match="FP8Config.promote_every: the fa3-fp8 kernel promotes after every K/V tile at head_dim 256"):
        attention_fp8(*qkv(d=256), config=FP8Config(promote_every=2))
    with pytest.raises(ValueError, match="FP8Config.promote_every: the fa3-fp8 kernel promotes after every K/V tile at head_dim 128"):
        attention_fp8(*qkv(d=128), config=FP8Config(promote_every=4))
    with pytest.raises(TypeError, match="config must be an FP8Config"):
        attention_fp8(q, k, v, config=None)
    assert not fake_kernel


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(softmax_scale=float("nan")), ValueError, "softmax_scale must be finite"),
    (dict(causal="yes"), TypeError, "causal must be a bool"),
    (dict(return_lse=1), TypeError, "return_lse must be a bool"),
])
def test_arguments_are_checked_before_the_device(monkeypatch, kwargs, exc, match):
    """attention_fp8 said "runs on CUDA tensors" (BackendUnavailableError) before looking at softmax_scale, causal
    or return_lse, against its docstring's order (a break-it pass, session 34); attention_from_fp8 likewise for
    block heights the kernel does not read."""
    monkeypatch.setattr(fp8_attention, "device_capability", lambda device: None)  # no GPU here
    q, k, v = qkv()
    with pytest.raises(exc, match=match):
        attention_fp8(q, k, v, **kwargs)
    with pytest.raises(BackendUnavailableError, match="runs on CUDA tensors"):
        attention_fp8(q, k, v)


def test_block_heights_other_than_the_kernels_are_refused_before_the_device(monkeypatch):
    monkeypatch.setattr(fp8_attention, "device_capability", lambda device: None)
    q, k, v = qkv(nk=400)
    with pytest.raises(ValueError, match=r"blocks of 128 query rows and 64 keys, but the kernel \(head_dim 64\) "
                                         r"needs 128 and 192"):
        attention_from_fp8(quantize_fp8_torch(q, k, v, block_n=64))
    with pytest.raises(ValueError, match="head_dim 80 is not supported"):
        attention_from_fp8(quantize_fp8(*qkv(d=80)))
    for head_dim in (40, 80):  # attention_fp8 too, before the device (it said "runs on CUDA tensors" first)
        with pytest.raises(ValueError, match=f"head_dim {head_dim} is not supported"):
            attention_fp8(*qkv(d=head_dim))
    with pytest.raises(BackendUnavailableError, match="runs on CUDA tensors"):
        attention_from_fp8(quantize_fp8(q, k, v))


def test_quantize_fp8_on_cpu_tensors_leaves_the_dsl_unimported():
    """quantize_fp8 (impl "auto") on CPU tensors imported the GPU pass to learn that it needs CUDA tensors, and with
    it the CuTe DSL (~0.4 s), which installs its own sys.excepthook and warning filters in the caller's process
    (session 49's environment probe). The device is now asked first; impl "kernel" still names it."""
    import subprocess

    from helpers import subprocess_env

    code = ("import sys, warnings, torch\n"
            "from fa_variants.fp8.quantize import quantize_fp8\n"
            "hook, filters = sys.excepthook, list(warnings.filters)\n"
            "q, k, v = torch.randn(1, 3, 2, 64), torch.randn(1, 5, 2, 64), torch.randn(1, 5, 2, 64)\n"
            "quantize_fp8(q, k, v)\n"
            "try:\n"
            "    quantize_fp8(q, k, v, impl='kernel')\n"
            "except ValueError as exc:\n"
            "    print(exc)\n"
            "print('cutlass' in sys.modules, sys.excepthook is hook, warnings.filters == filters)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    said, state = r.stdout.strip().splitlines()[-2:]
    assert said == "impl='kernel': the GPU quantisation pass needs CUDA tensors; the inputs are on cpu", said
    assert state == "False True True", state
