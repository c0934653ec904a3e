"""Helpers shared by the test files: seeds and fresh inputs (a padded KV cache among them), the correctness check of one
attention result, the marks of the sm90-only GPU files, and for the tests of scripts/: the repository root, a script
imported as a module, the test ids a pytest selection collects. Imported as ``from helpers import ...`` (pytest puts tests/ on sys.path:
the folder has no ``__init__.py``).

The check is the project's rule (docs/design.md): err(x) <= 2 * err(PyTorch, same maths in the input dtype)
+ 1e-5, err = max |x - float64 reference|, for the output and the LSE, after the output and the LSE were
checked free of NaN (outputs are poisoned with NaN before a kernel runs, so an element it never writes fails).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
import subprocess
import sys
import zlib
from pathlib import Path
from unittest import mock

import pytest
import torch

from fa_variants.reference import (References, attention_reference, causal_visible, check_against_reference, check_lse,
                                  references)

#: the repository root (tests/..)
ROOT = Path(__file__).resolve().parents[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child Python, the checkout first on PYTHONPATH and the caller's PYTHONPATH
    kept after it (where the DSL may live: session 48's GPU host puts it there, and a child that lost it could not
    import cutlass), plus ``extra``."""
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "PYTHONPATH": path, **extra}

def git_checkout_or_skip() -> None:
    """Skip (with the reason) a test of the repository's own git checkout (its index, its ignore rules) where the tree
    is not one: a source archive, an sdist, a copy without .git (a container build), or no git installed. CI runs on
    a clone, where these tests run."""
    try:
        inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True,
                                text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("checks this repository's git checkout: git is not installed")
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        pytest.skip(f"checks this repository's git checkout: {ROOT} is not one (a source archive or a copy without "
                    f".git): {inside.stderr.strip().splitlines()[0] if inside.stderr.strip() else inside.stdout.strip()}")


#: set to a failed test's printed seed to draw its inputs again (conftest's ``rng_seed``)
SEED_ENV = "FA_VARIANTS_TEST_SEED"
#: set to a failed run's printed session seed to draw the module-scoped fixtures' inputs again (``session_seed``)
SESSION_SEED_ENV = "FA_VARIANTS_SESSION_SEED"
#: the running test's seed (set by conftest's ``rng_seed`` before each test)
_test_seed: int | None = None


def _seed_from(env: str) -> int:
    """The value of the environment variable ``env`` when set (to replay a failure), else fresh (os.urandom)."""
    return int(os.environ.get(env) or int.from_bytes(os.urandom(4), "little") % 2**31)


#: this process's session seed: the draws made outside a test (module-scoped fixtures) derive from it
SESSION_SEED = _seed_from(SESSION_SEED_ENV)


def release_cached_gpu_memory() -> bool:
    """In a pytest-xdist worker (``PYTEST_XDIST_WORKER`` set) whose process has initialised CUDA and whose caching
    allocator holds more than its share of the card (total memory / (2 x ``PYTEST_XDIST_WORKER_COUNT``)): the unused
    blocks back to the driver (``torch.cuda.empty_cache``), so that one worker keeping a big test's blocks cannot
    starve the others sharing the GPU. Returns whether it released. Below the share, in serial runs and in CPU-only
    workers it does nothing: emptying after every test makes every test's next big allocation a driver call (session
    38: suite part 2 did not finish in 560 s on an H100 with it; the cause was not isolated)."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not torch.cuda.is_initialized():
        return False
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    share = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / (2 * workers)
    if torch.cuda.memory_reserved() <= share:
        return False
    torch.cuda.empty_cache()
    return True


def fresh_seed() -> int:
    """A test's seed: ``FA_VARIANTS_TEST_SEED``'s value when set (to replay a failure), else fresh (os.urandom)."""
    return _seed_from(SEED_ENV)


def session_seed(key: str) -> int:
    """The seed of a draw made outside any test (a module-scoped fixture), named by ``key``: the session seed
    (printed with a failing test's seed; ``FA_VARIANTS_SESSION_SEED`` replays it) mixed with the key, so the
    fixture draws the same whichever tests run before it."""
    return (SESSION_SEED ^ zlib.crc32(key.encode())) % 2**31


def seeded_generator(device="cpu", offset: int = 0) -> torch.Generator:
    """A generator seeded from the running test's seed (+ ``offset``): every call within one test gives the same
    draw (as a fixed seed did, for helpers called twice to compare two paths on the same inputs), a fresh one in
    every run, and not the global generator's draw (the seed is mixed with a constant). Outside a test (a
    module-scoped fixture): ``session_seed("seeded_generator")`` + offset."""
    seed = _test_seed if _test_seed is not None else session_seed("seeded_generator")
    return torch.Generator(device=device).manual_seed(((seed + offset) ^ 0x9E3779B9) % 2**63)


def racing_threads(worker, threads: int) -> None:
    """``worker(t)`` on ``threads`` threads at once, t = 0, 1, ..., with the interpreter switching threads every
    microsecond (races show up in a short run); returns when all have finished. The worker records its own errors
    (an exception on a thread does not reach the caller)."""
    import threading

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        running = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join()
    finally:
        sys.setswitchinterval(interval)


def _nan_filled(allocate):
    @functools.wraps(allocate)
    def wrapper(*args, **kwargs):
        t = allocate(*args, **kwargs)
        if t.is_floating_point():
            # no_grad: a leaf made with requires_grad=True (torch's own, e.g. inductor's pattern set-up inside a
            # compiled test) accepts the fill and stays a leaf that requires grad. 8-bit floats by their bytes
            # (fill_ of a float8 dtype is not certain on every device): NaN is 0x7F in e4m3fn and e5m2, 0x80 in the
            # fnuz formats, 0xFF in e8m0fnu
            with torch.no_grad():
                if t.element_size() == 1:
                    name = str(t.dtype)
                    t.view(torch.uint8).fill_(0xFF if "e8m0" in name else 0x80 if "fnuz" in name else 0x7F)
                else:
                    t.fill_(math.nan)
        return t
    return wrapper


@contextlib.contextmanager
def nan_filled_allocations():
    """Inside: every torch.empty / empty_like / Tensor.new_empty of a floating dtype comes back NaN-filled, so an
    output element a kernel never writes fails the test (conftest's ``nan_allocations`` fixture returns this)."""
    with contextlib.ExitStack() as stack:
        for owner, name in ((torch, "empty"), (torch, "empty_like"), (torch.Tensor, "new_empty")):
            stack.enter_context(mock.patch.object(owner, name, _nan_filled(getattr(owner, name))))
        yield


def make_qkv(batch: int, seqlen_q: int, seqlen_k: int, num_heads: int, num_heads_kv: int, head_dim: int, *,
             dtype: torch.dtype = torch.bfloat16, device="cpu", std: float = 1.0,
             generator: torch.Generator | None = None):
    """Fresh N(0, std^2) q (batch, seqlen_q, num_heads, head_dim) and k, v (batch, seqlen_k, num_heads_kv,
    head_dim), drawn in that order. Drawn in ``dtype`` itself (no float32 temporary: big inputs stay within
    memory) and scaled in place; ``generator`` for a seeded draw (on ``device``), else torch's global one."""
    def draw(seqlen, heads):
        t = torch.randn(batch, seqlen, heads, head_dim, dtype=dtype, device=device, generator=generator)
        return t.mul_(std) if std != 1.0 else t
    return draw(seqlen_q, num_heads), draw(seqlen_k, num_heads_kv), draw(seqlen_k, num_heads_kv)


def padded_kv_cache(lengths: list[int], seqlen_q: int, seqlen_k: int, num_heads: int, num_heads_kv: int,
                    head_dim: int, **make):
    """A KV cache padded to seqlen_k: ``make_qkv``'s q, k, v (``make``: its keywords) for len(lengths)
    sequences, with the keys past each sequence's length (k[b, lengths[b]:], v too) set to NaN, so that a
    kernel that reads the padding fails; and seqlens_k, the lengths as an int32 (batch,) tensor on q's device."""
    q, k, v = make_qkv(len(lengths), seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim, **make)
    for b, n in enumerate(lengths):
        k[b, n:] = math.nan
        v[b, n:] = math.nan
    return q, k, v, torch.tensor(lengths, dtype=torch.int32, device=q.device)


def windowed_kv_cache(windows: list[tuple[int, int]], seqlen_q: int, seqlen_k: int, num_heads: int,
                      num_heads_kv: int, head_dim: int, **make):
    """A KV cache padded on both sides: ``make_qkv``'s q, k, v for len(windows) sequences, keys outside each window
    [start, end) set to NaN (a kernel that reads the padding fails), and (seqlens_k, leftpad_k), the ends and starts
    as int32 (batch,) tensors on q's device."""
    q, k, v = make_qkv(len(windows), seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim, **make)
    for b, (start, end) in enumerate(windows):
        for t in (k, v):
            t[b, :start] = math.nan
            t[b, end:] = math.nan
    starts, ends = ([w[i] for w in windows] for i in (0, 1))
    return q, k, v, *(torch.tensor(x, dtype=torch.int32, device=q.device) for x in (ends, starts))


def split_decode_config(split: str, q: torch.Tensor, k: torch.Tensor, causal: bool):
    """(module, config) of a decode test's ``split`` id "BACKEND-HOW" (fa3 / fa2; HOW: "auto", `auto`'s config, None;
    else 3 splits, merged by the merge kernel or, "fused", by fa3's kernel itself)."""
    import dataclasses
    import importlib

    backend, how = split.split("-", 1)
    module = importlib.import_module({"fa3": "fa_variants.hopper.fa3", "fa2": "fa_variants.ampere.fa2"}[backend])
    if how == "auto":
        return module, None
    config = module.decode_config(q, k, causal, num_splits=3)
    if backend == "fa3":
        config = dataclasses.replace(config, fused_merge=how == "fused",
                                     first_row_only=config.first_row_only and how != "fused")
    return module, config


def lengths_loss_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqlens_k: torch.Tensor, backend: str):
    """Gradients (dq, dk, dv) of sum(out^2) + sum(finite LSE) for ``fa_variants.attention(q, k, v, causal=True,
    seqlens_k=..., return_lse=True, backend=...)`` on fresh leaves (q, k, v untouched); the kernel backends' warning
    that their backward runs in PyTorch silenced."""
    import warnings

    import fa_variants
    from fa_variants import dispatch

    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = fa_variants.attention(*leaves, causal=True, seqlens_k=seqlens_k, return_lse=True, backend=backend)
    loss = out.float().square().sum() + torch.where(lse.isfinite(), lse, 0).sum()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
        return torch.autograd.grad(loss, leaves)


def exact_grads(q, k, v, grad_out, **kwargs):
    """float64 gradients of attention (autograd through the reference backend in float64)."""
    import fa_variants

    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    out = fa_variants.attention(*leaves, backend="reference", **kwargs)
    return torch.autograd.grad(out, leaves, grad_out.double())


def count_fused_backwards(monkeypatch) -> list:
    """``integrations.backward``'s fused backwards (cuDNN's, FlashAttention-2's) patched to note each call in the
    returned list, then run as before."""
    from fa_variants.integrations import backward

    fused = []
    for name in ("cudnn_backward", "flash_backward"):
        monkeypatch.setattr(backward, name,
                            lambda *a, _f=getattr(backward, name), **kw: fused.append(1) or _f(*a, **kw))
    return fused


def same_and_exact_grads(q, k, v, grad_out, **kwargs):
    """The gradient rule's two references for a loss of out: the same maths in q's dtype (``attention_reference``
    with dtype=q.dtype, through autograd) and float64 (`exact_grads`); ``kwargs``: causal and the windows."""
    from fa_variants.reference import attention_reference

    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    same = torch.autograd.grad(attention_reference(*leaves, dtype=q.dtype, **kwargs)[0], leaves, grad_out)
    return same, exact_grads(q, k, v, grad_out, **kwargs)


def grads_eager_and_compiled(q, k, v, grad_out, fused: list, **kwargs) -> list:
    """[(dq, dk, dv), fused calls] of a loss of out through ``fa_variants.attention(q, k, v, **kwargs)`` on fresh
    leaves, eagerly then under torch.compile(fullgraph=True) (Dynamo reset around it); ``fused``: the list
    `count_fused_backwards` fills, cleared before each; the kernel backends' fallback warning silenced."""
    import warnings

    import fa_variants
    from fa_variants import dispatch

    results = []
    torch._dynamo.reset()
    try:
        for fn in (fa_variants.attention, torch.compile(fa_variants.attention, fullgraph=True)):
            fused.clear()
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
                results.append((torch.autograd.grad(fn(*leaves, **kwargs), leaves, grad_out), len(fused)))
    finally:
        torch._dynamo.reset()
    return results


def assert_grads_within_rule(got, baseline, exact):
    """The tolerance rule for gradients: each of got's (baseline's dtype, exact's shape) within 2x the error of
    ``baseline``'s (a PyTorch computation of the same gradients on the same 16-bit inputs) against ``exact``
    (float64), plus a floor of 1e-3 of the largest exact gradient of the three (not of its own: where dQ and dK are
    exactly 0, as with one key, a fused backward's float32 rounding of dP - rowsum(dO O) is ~1e-7 while the
    PyTorch maths cancel to 0)."""
    floor = 1e-3 * max(e.abs().max().item() if e.numel() else 0.0 for e in exact)
    for name, g, r, e in zip("qkv", got, baseline, exact):
        assert g.dtype == r.dtype and g.shape == e.shape, name
        err, ref_err = (g.double() - e).abs().max().item(), (r.double() - e).abs().max().item()
        assert err <= 2 * ref_err + floor, f"d{name}: {err:.3g} vs PyTorch in {r.dtype}: {ref_err:.3g}"


def assert_backward_mode_keeps_pytorch(monkeypatch, mode: str, cases) -> None:
    """For each (kwargs, (q, k, v)) of ``cases``: the gradients of ``fa_variants.attention(q, k, v, **kwargs)`` (a
    loss of out, plus the LSE's where returned) under FA_VARIANTS_BACKWARD=``mode`` equal the default pytorch
    backward's bit for bit (the same function served them)."""
    import fa_variants

    for kwargs, inputs in cases:
        grads = []
        for name in (mode, "pytorch"):
            monkeypatch.setenv("FA_VARIANTS_BACKWARD", name)
            leaves = [t.clone().requires_grad_(True) for t in inputs]
            result = fa_variants.attention(*leaves, **kwargs)
            loss = result[0].float().sum() + result[1].clamp(min=-1e4).sum() if isinstance(result, tuple) \
                else result.float().sum()
            grads.append(torch.autograd.grad(loss, leaves))
        for g, r in zip(*grads):
            torch.testing.assert_close(g, r, rtol=0, atol=0)


def assert_attention_ok(out: torch.Tensor, lse: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, causal: bool = False, softmax_scale: float | None = None, *,
                        seqlens_k: torch.Tensor | None = None, refs: References | None = None,
                        what: str = "", leftpad_k: torch.Tensor | None = None,
                        seqlens_q: torch.Tensor | None = None) -> References:
    """Asserts that ``out`` (and ``lse``, unless None) is attention(q, k, v) under the project's rule: shapes
    and dtypes as ``fa_variants.attention`` returns them, no NaN, the output and LSE within their bounds. With
    ``seqlens_k`` (per-sequence KV lengths) the reference attends to each sequence's first keys only, and the
    rows of a length-0 sequence must be 0 with LSE -inf (``leftpad_k`` too: keys [leftpad_k[b], seqlens_k[b]), an
    empty window's rows 0; ``seqlens_q``: each sequence's causal diagonal aligned to its query count). Returns the
    references (pass them to the next check of the same inputs)."""
    where = f"{what}: " if what else ""
    assert out.shape == q.shape and out.dtype == q.dtype, f"{where}out {tuple(out.shape)} {out.dtype}"
    assert not torch.isnan(out).any(), f"{where}NaN in the output (an element the kernel did not write?)"
    if seqlens_k is not None:
        empty = seqlens_k == (0 if leftpad_k is None else leftpad_k)
        assert (out[empty] == 0).all(), f"{where}a length-0 sequence's output is not 0"
        assert lse is None or (lse[empty] == -math.inf).all(), f"{where}a length-0 sequence's LSE is not -inf"
    refs = refs or references(q, k, v, causal=causal, softmax_scale=softmax_scale, seqlens_k=seqlens_k,
                              leftpad_k=leftpad_k, seqlens_q=seqlens_q)
    check = check_against_reference(out, q, k, v, causal, softmax_scale, refs=refs)
    assert check.ok, f"{where}output: {check}"
    if lse is not None:
        assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32, \
            f"{where}lse {tuple(lse.shape)} {lse.dtype}"
        assert not torch.isnan(lse).any(), f"{where}NaN in the LSE (a row the kernel did not write?)"
        check = check_lse(lse, q, k, v, causal, softmax_scale, refs=refs)
        assert check.ok, f"{where}LSE: {check}"
    return refs


#: fa3-fp8 kernel vs its emulation on the same quantised inputs (tests/test_fa3_fp8_gpu.py's module docstring):
#: rel-L2 of O, and the LSE on rows that see a key
FP8_REL_L2_BOUND = 6e-3
FP8_LSE_BOUND = 1.5e-3
#: the same for a single running accumulator (Fp8Config.two_level False, an ablation variant): its FP8 accumulator's
#: error is carried across tiles, which the block-FP model follows less closely; with fresh seeds (session 31, H200)
#: head_dim 256's single64_overlap variant at 1 x 40 x 40 x 2 x 1 passed 6e-3 on 2 of 19 draws (6.4e-3 at most seen)
FP8_REL_L2_BOUND_SINGLE = 1e-2


def float64_twin(model):
    """A float64 copy of a Hugging Face model with eager attention: the exact side of ``assert_model_within_rule``."""
    import copy

    twin = copy.deepcopy(model).double()
    twin.set_attn_implementation("eager")
    return twin


def assert_model_within_rule(got, eager, exact, what: str = "output") -> None:
    """The tolerance rule for a whole model: ``got`` (float32, our attention in it) is within 2x the error of ``eager``
    (the same float32 model with transformers' eager attention) against ``exact`` (its float64 twin), plus a floor of
    1e-5. Tensors or matching sequences of tensors (gradients, decoding steps). A fixed tolerance between ``got`` and
    ``eager`` fails on some seeds: rounding grows through the layers (session 51's CI: 1.2e-5 on one logit of 7,178,
    past an atol of 1e-5)."""
    if isinstance(got, torch.Tensor):
        got, eager, exact = [got], [eager], [exact]
    assert len(got) == len(eager) == len(exact), what
    for i, (g, r, e) in enumerate(zip(got, eager, exact)):
        assert g.dtype == r.dtype and g.shape == r.shape == e.shape, f"{what} {i}"
        err, ref_err = (g.double() - e).abs().max().item(), (r.double() - e).abs().max().item()
        assert err <= 2 * ref_err + 1e-5, f"{what} {i}: {err:.3g} from float64 vs eager float32: {ref_err:.3g}"


def assert_eager_ranks_first(model, generated: torch.Tensor, prompt_length: int,
                             attention_mask: torch.Tensor | None = None) -> None:
    """Every token that greedy decoding through our attention appended to ``generated`` (batch, prompt_length +
    new) is one that ``model`` (eager attention) ranks first, up to rounding (1e-4 of a logit), given the sequence
    before it. ``attention_mask`` (batch, prompt_length): the prompts' padding, as passed to generate() (left
    padding: positions count from each sequence's first real token, as generate() numbers them). Comparing our
    tokens with eager's generate() bit for bit fails on a near-tie of the top two logits, whose order the
    reduction order of the CPU's BLAS decides (top-two gaps down to 1.4e-3 seen against differences of 8e-6)."""
    new = generated.shape[1] - prompt_length
    kwargs = {}
    if attention_mask is not None:
        mask = torch.cat([attention_mask, attention_mask.new_ones(attention_mask.shape[0], new - 1)], 1)
        kwargs = dict(attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    with torch.no_grad():  # one row per new token: the logits that chose it
        logits = model(generated[:, :-1], **kwargs).logits[:, prompt_length - 1:]
    chosen = logits.gather(-1, generated[:, prompt_length:, None]).squeeze(-1)
    assert (chosen >= logits.amax(-1) - 1e-4).all(), (chosen - logits.amax(-1)).min().item()


def assert_same_maths(got: torch.Tensor, expected: torch.Tensor) -> None:
    """got and expected are one computation in two forms (packed and unpacked rows, say) whose float32 reductions may
    run in another order (CPU matmul blocking, another tile shape): a 16-bit output may then cross a rounding
    boundary, so they agree within one step of the output dtype (its eps x the largest |expected|), not bit for bit
    (session 49: a fresh clone's BLAS moved one bf16 output by 2^-10 at |O| 0.23, past the old bound of half a
    step)."""
    one_step = torch.finfo(expected.dtype).eps * expected.float().abs().max().item()
    worst = (got.float() - expected.float()).abs().max().item()
    assert worst <= one_step, f"{worst} apart, more than one {expected.dtype} step ({one_step})"


def assert_fp8_matches_emulation(out: torch.Tensor, lse: torch.Tensor, emu32: torch.Tensor, emu_lse: torch.Tensor,
                                 exact: torch.Tensor, record=None, config=None, **labels) -> dict:
    """Asserts an fa3-fp8 output (out (B, N, H, D) 16-bit, lse float32 (B, H, N)) against its emulation (emu32
    float32, emu_lse) and float64 attention (exact): finite; rel-L2 vs the emulation rounded to out's dtype <=
    FP8_REL_L2_BOUND (FP8_REL_L2_BOUND_SINGLE for a ``config`` with two_level False); rows that see no key
    (emu_lse -inf) O = 0 with LSE -inf, the others LSE within FP8_LSE_BOUND; |out - exact| within ``fp8.fp8_error_bound``. Returns the facts (labels included), passed to
    ``record`` first when given."""
    from fa_variants import fp8
    from fa_variants.reference import rel_l2

    seen = torch.isfinite(emu_lse)
    facts = dict(labels, rel_l2=float(rel_l2(out, emu32.to(out.dtype))),
                 lse_diff=float((lse[seen] - emu_lse[seen]).abs().max()) if seen.any() else 0.0,
                 vs_f64=(out.double() - exact).abs().max().item(), vs_f64_bound=fp8.fp8_error_bound(emu32, exact))
    if record is not None:
        record(facts)
    assert torch.isfinite(out).all(), facts
    single = config is not None and not config.two_level
    assert facts["rel_l2"] <= (FP8_REL_L2_BOUND_SINGLE if single else FP8_REL_L2_BOUND), facts
    assert torch.equal(torch.isfinite(lse), seen) and (out.transpose(1, 2)[~seen] == 0).all(), facts
    assert facts["lse_diff"] <= FP8_LSE_BOUND, facts
    assert facts["vs_f64"] <= facts["vs_f64_bound"], facts
    return facts


def assert_huge_logits_ok(out: torch.Tensor, lse: torch.Tensor, inputs, causal: bool, what: str = "") -> None:
    """FP8 attention (out (B, N, H, D), lse float32 (B, H, N) of the logits the kernel saw, without
    ``inputs.lse_shift``) on inputs whose scaled logits are huge (|m| in log2 units >= FFMA_LIMIT): against float64
    attention over ``inputs.dequantize()`` (the values the kernel computes with). Every row that sees a key is finite,
    not 0, with a finite LSE within 1e-3 relative; a row whose two best keys lie >= 64 apart in log2 units and 1 %
    of its largest |score| apart (no near tie the accumulator could flip) is one-hot: V of its best key, within
    max(1e-3, the output dtype's eps) of max|V| (the output's rounding).

    The LSE bound is the FP8 MMA's own: LSE moves by at most softmax_scale times the largest error of a score it
    sees, and each score's error is bounded by the accumulator model of fa_variants.fp8.emulation
    (_qk_accumulator_bound), plus float32's rounding of the LSE itself. A fixed relative bound (1e-3, before
    session 28) failed at head_dim 256 on the H200 by 1 %: the accumulator's error grows with the sum of |q_i k_i|,
    not with the score."""
    from fa_variants.common.scale import LOG2_E

    q, k, v = (t.double().cpu() for t in inputs.dequantize())
    want, want_lse = attention_reference(q, k, v, causal=causal, softmax_scale=inputs.softmax_scale)
    out_dtype = out.dtype
    out, lse = out.double().cpu().transpose(1, 2), lse.double().cpu()  # (B, H, N, D)
    want = want.transpose(1, 2)
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), seen), f"{what}: rows with a finite LSE differ from float64's"
    assert torch.isfinite(out).all() and (out[~seen] == 0).all(), f"{what}: non-finite O or a row without keys not 0"
    assert (out[seen].abs().amax(-1) > 0).all(), f"{what}: a row that sees keys came back 0"
    bound = inputs.softmax_scale * _qk_accumulator_bound(q, k, causal) + 1e-5 * want_lse.abs() + 1e-3
    excess = ((lse - want_lse).abs() / bound)[seen].max().item()
    assert excess <= 1.0, f"{what}: LSE error {excess:.3g}x the FP8 accumulator's bound"
    s = gqa_scores(q, k, inputs.softmax_scale * LOG2_E)
    if causal:
        s = s.masked_fill(~causal_visible(q.shape[1], k.shape[1]), -math.inf)
    top = s.topk(min(2, s.shape[-1]), dim=-1).values
    gap = top[..., 0] - top[..., -1] if s.shape[-1] > 1 else torch.full_like(top[..., 0], math.inf)
    clear = seen & (gap >= 64) & (gap >= 1e-2 * s.abs().masked_fill(s.isinf(), 0).amax(-1))
    assert clear.float().mean() >= 0.5, f"{what}: too few clear rows ({clear.float().mean():.2f}) to judge"
    tol = max(1e-3, torch.finfo(out_dtype).eps) * v.abs().max().item()
    err = (out[clear] - want[clear]).abs().max().item()
    assert err <= tol, f"{what}: one-hot rows off by {err:.3g} (bound {tol:.3g})"


def fp8_lse_bound(inputs, q: torch.Tensor, k: torch.Tensor, causal: bool,
                  softmax_scale: float | None = None) -> torch.Tensor:
    """Per query row (B, H, Nq), float64: how far an FP8 attention's LSE (shifted back, ``FP8Inputs.unsmoothed_lse``)
    may lie from float64 attention's on the unquantised q, k (B, N, heads, D) at ``softmax_scale`` (default
    head_dim^-0.5). The LSE is 1-Lipschitz in the largest change of a score, so it moves by at most the largest
    change quantisation made to a score the row sees (softmax_scale q^ . k^ + lse_shift from ``inputs.dequantize()``
    against softmax_scale q . k, both in float64), plus the FP8 accumulator's bound (``_qk_accumulator_bound``) and
    float32's rounding of the LSE (relative to its magnitude: the largest |score|, the shift and log seqlen_k). The
    bound holds for any input; a fixed tolerance is a guess about the inputs (0.1 failed on ~40 % of fresh N(0, 1)
    draws at head_dim 64). Rows that see no key (seqlen_k 0 included): 0."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    if k.shape[1] == 0:
        return torch.zeros(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float64)
    qh, kh, _ = (t.double().cpu() for t in inputs.dequantize())
    shift = inputs.lse_shift.double().cpu() if inputs.lse_shift is not None else None
    largest, s = largest_score_change(qh, kh, inputs.softmax_scale, q, k, scale, causal, shift)
    # the LSE's magnitude and that of what float32 adds up to it
    magnitude = s.abs().amax(-1) + (shift.abs() if shift is not None else 0.0) + math.log(k.shape[1])
    return (largest + abs(inputs.softmax_scale) * _qk_accumulator_bound(qh, kh, causal) + 1e-5 * (1 + largest)
            + 2**-21 * magnitude)


def gqa_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """scale q . k (B, H, Nq, Nk) for q (B, Nq, H, D) and k (B, Nk, H_kv, D), each K/V head serving its group of
    H / H_kv query heads; unmasked, in q's dtype."""
    return torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(q.shape[2] // k.shape[2], 2)) * scale


def largest_score_change(q_hat: torch.Tensor, k_hat: torch.Tensor, scale_hat: float, q: torch.Tensor, k: torch.Tensor,
                         scale: float, causal: bool, lse_shift: torch.Tensor | None = None):
    """The core of the FP8 LSE bounds: per query row (B, H, Nq), float64, the largest |change| quantisation made to a
    score the row sees, scale_hat q_hat . k_hat (+ lse_shift (B, H, Nq), the smoothing's per-row shift) against
    scale q . k; and the exact scores (B, H, Nq, Nk), 0 where the row does not see the key. q_hat, q (B, Nq, H, D),
    k_hat, k (B, Nk, H_kv, D): the dequantised and the unquantised values (any float dtype and device; computed in
    float64 on the CPU). The LSE is 1-Lipschitz in the largest change of a score, so it moves by at most this."""
    q_hat, k_hat, q, k = (t.double().cpu() for t in (q_hat, k_hat, q, k))
    s_hat = gqa_scores(q_hat, k_hat, scale_hat)
    if lse_shift is not None:
        s_hat = s_hat + lse_shift.double().cpu()[..., None]
    s = gqa_scores(q, k, scale)
    change = (s_hat - s).abs()
    if causal:
        visible = causal_visible(q.shape[1], k.shape[1])
        change, s = change.masked_fill(~visible, 0.0), s.masked_fill(~visible, 0.0)
    return change.amax(-1), s


def assert_fp8_lse_ok(lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                      softmax_scale: float | None = None, config=None, inputs=None) -> None:
    """An FP8 attention's LSE (B, H, Nq), shifted back (``FP8Inputs.unsmoothed_lse``), computed from ``inputs`` (the
    FP8Inputs it ran on; default: q, k, v quantised again by the torch recipe with ``config``, which is what
    ``fp8_attention_reference`` did, deterministically: pass the GPU pass's own inputs for a GPU result, whose K
    mean is summed in another order) against float64 attention's on q, k, v: the same rows finite and each within
    ``fp8_lse_bound``."""
    from fa_variants.fp8 import FP8Config
    from fa_variants.fp8.quantize import quantize_fp8_torch

    if inputs is None:
        inputs = quantize_fp8_torch(q, k, v, config=config or FP8Config(), softmax_scale=softmax_scale)
    _, want = attention_reference(q, k, v, causal=causal, softmax_scale=softmax_scale, dtype=torch.float64)
    lse, want = lse.double().cpu(), want.cpu()
    seen = torch.isfinite(want)
    assert torch.equal(torch.isfinite(lse), seen), "rows with a finite LSE differ from float64's"
    ratio = ((lse - want).abs() / fp8_lse_bound(inputs, q, k, causal, softmax_scale))[seen]
    assert ratio.numel() == 0 or ratio.max().item() <= 1.0, f"LSE error {ratio.max().item():.3g}x fp8_lse_bound"


def qk_accumulator_errors(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    """Per score (B, H, Nq, Nk), float64: the largest error the FP8 MMA's accumulator can put into the unscaled score
    q . k (0 where the row does not see the key), under fa_variants.fp8.emulation's block-floating-point model: each k = MMA_K chunk
    cuts its MMA_K products and the incoming accumulator toward zero to BLOCKFP_FRAC_BITS fraction bits below the
    largest of them, top = 2^e (e = floor(log2 top)), so chunk c errs by less than (MMA_K + 1) 2^(e - frac_bits);
    top is at most the chunk's largest |q_i k_i| or the exact partial sum's magnitude plus the error so far.
    q (B, Nq, H, D), k (B, Nk, H_kv, D): the values the MMA multiplies (float64, exact products): the e4m3 ones, or
    the dequantised ones where the descales are powers of two (the alignment then scales with them exactly)."""
    from fa_variants.fp8.emulation import BLOCKFP_FRAC_BITS, MMA_K

    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, 2)
    partial = torch.zeros(q.shape[0], q.shape[2], q.shape[1], k.shape[1], dtype=torch.float64)
    err = torch.zeros_like(partial)
    for d0 in range(0, q.shape[-1], MMA_K):
        top = partial.abs() + err
        for d in range(d0, min(d0 + MMA_K, q.shape[-1])):
            top = torch.maximum(top, torch.einsum("bqh,bkh->bhqk", q[..., d].abs(), k[..., d].abs()))
        step = torch.ldexp(torch.ones_like(top), torch.frexp(top).exponent - 1 - BLOCKFP_FRAC_BITS)
        err += torch.where(top > 0, (MMA_K + 1) * step, 0.0)
        partial += torch.einsum("bqhd,bkhd->bhqk", q[..., d0:d0 + MMA_K], k[..., d0:d0 + MMA_K])
    if causal:
        err = err.masked_fill(~causal_visible(q.shape[1], k.shape[1]), 0.0)
    return err


def _qk_accumulator_bound(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    """Per query row (B, H, Nq): the largest of ``qk_accumulator_errors`` over the keys the row sees."""
    return qk_accumulator_errors(q, k, causal).amax(-1)


def sm90_only(what: str) -> list:
    """The marks of a test file that runs on an sm90 (Hopper) GPU only: ``gpu``, and a visible skip elsewhere."""
    on_sm90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
    return [pytest.mark.gpu, pytest.mark.skipif(not on_sm90, reason=f"{what} needs an sm90 (Hopper) GPU")]


def load_script(name: str):
    """scripts/<name>.py imported as a module (the scripts folder is not a package), for tests of its pieces."""
    path = ROOT / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import does: dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def collected_ids(*args: str) -> list[str]:
    """The test ids (``file::test[params]``) that ``pytest --collect-only -q ARGS`` lists, run from the repository root
    without the cache: how the tests of a GPU script check its test selection (its files, -k, -m) on the CPU."""
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    return [line for line in run.stdout.splitlines() if "::" in line]


def flash_forward_stand_in(q, k, v, dropout_p, causal, return_debug_mask, *, scale):
    """FlashAttention-2's differentiable forward op from its contract (``aten._scaled_dot_product_flash_attention``):
    (batch, heads, seqlen, head_dim) tensors with a unit last stride, GQA natively, bottom-right causal, no dropout;
    (out in q's dtype, natural-log LSE float32) through autograd in float32 (``reference.attention_reference``)."""
    from fa_variants import reference

    assert dropout_p == 0.0 and not return_debug_mask and all(t.stride(-1) == 1 for t in (q, k, v))
    out, lse = reference.attention_reference(*(t.float().transpose(1, 2) for t in (q, k, v)), causal=causal,
                                             softmax_scale=scale)
    return out.to(q.dtype).transpose(1, 2), lse


def flash_backward_stand_in(grad_out, q, k, v, out, lse, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, causal,
                            rng_state, unused, *, scale):
    """FlashAttention-2's backward from its contract, in float32: P = exp(scale Q K^T - LSE) (masked bottom-right
    when causal), dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = scale dS K, dK = scale dS^T Q, dK and dV summed
    over each KV head's query heads; outputs in q's dtype, shapes of q, k, v."""
    assert cum_seq_q is None and cum_seq_k is None and dropout_p == 0.0
    batch, heads, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    assert (max_q, max_k) == (seqlen_q, seqlen_k) and out.shape == q.shape == grad_out.shape
    assert lse.shape == (batch, heads, seqlen_q) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert all(t.stride(-1) == 1 for t in (grad_out, q, k, v, out))  # the kernel's one layout rule
    group = heads // heads_kv
    kf, vf = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    s = scale * q.float() @ kf.transpose(-1, -2)
    if causal:
        rows, cols = torch.arange(seqlen_q)[:, None], torch.arange(seqlen_k)[None, :]
        s = s.masked_fill(cols > rows + seqlen_k - seqlen_q, float("-inf"))
    p = torch.exp(s - lse[..., None])
    d_out = grad_out.float()
    dv = p.transpose(-1, -2) @ d_out
    ds = p * (d_out @ vf.transpose(-1, -2) - (d_out * out.float()).sum(-1, keepdim=True))
    dq, dk = scale * ds @ kf, scale * ds.transpose(-1, -2) @ q.float()
    dk, dv = (t.view(batch, heads_kv, group, seqlen_k, head_dim).sum(2) for t in (dk, dv))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
