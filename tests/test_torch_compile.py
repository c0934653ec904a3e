"""torch.compile and torch.export over the public API (``fa_variants.attention`` and
``fa_variants.scaled_dot_product_attention``): fullgraph=True, dynamic shapes, a cold process, autograd
through the reference backend; on a GPU also the kernels (fa3 / fa2) with CUDA graphs (reduce-overhead).

CPU tests use the ``aot_eager`` compiler backend (Dynamo + AOTAutograd, no C++ build: seconds); the default
inductor backend is in the slow test of tests/test_integrations.py. Run the GPU part on the GPU host with
``python -m pytest -q -m gpu tests/test_torch_compile.py``.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import fa_variants
from fa_variants.reference import attention_reference, check_against_reference
from helpers import assert_attention_ok, make_qkv

ROOT = Path(__file__).resolve().parents[1]


def _qkv(B=2, Nq=37, Nk=41, H=6, Hkv=2, D=32, dtype=torch.float32, device="cpu", seed=None):
    g = torch.Generator(device=device).manual_seed(seed if seed is not None else int(torch.randint(2**31, ())))
    return make_qkv(B, Nq, Nk, H, Hkv, D, dtype=dtype, device=device, generator=g)


def _bshd(t):
    return t.transpose(1, 2)


def _fn(q, k, v):
    out, lse = fa_variants.attention(q, k, v, causal=True, return_lse=True)
    return out * 2.0, lse


def _sdpa_fn(q, k, v):  # PyTorch layout in and out
    return fa_variants.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=0.3)


def _close(got, expected, tol=1e-5):
    # the compiled graph runs the same reference maths as eager, but the compiler may fuse or reorder the
    # surrounding ops: compare with a tolerance, not bitwise
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


def _graph_ops(fn, *, dynamic):
    """fn compiled with fullgraph=True, and the list the graphs Dynamo makes are recorded into."""
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.common import aot_autograd
        return aot_autograd(fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g)(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic, backend=recording)
    return compiled, graphs


def _with_op(graphs):
    """The recorded graphs that call the op (Dynamo may also hand over an empty graph)."""
    return [g for g in graphs if "fa_variants.attention" in g.code]


@pytest.mark.parametrize("dynamic", [False, True])
def test_attention_compiles_fullgraph(dynamic):
    """fullgraph=True (any graph break raises) over the public function; with dynamic=True a second size
    reuses the one graph (no recompile); the op is one node of the graph."""
    compiled, graphs = _graph_ops(_fn, dynamic=dynamic)
    # sizes distinct from each other and from 0/1 (Dynamo specialises 0/1 and equal sizes: duck sizing)
    for shape in (dict(B=3, Nq=37, Nk=41), dict(B=5, Nq=20, Nk=21)):
        q, k, v = _qkv(**shape)
        got, expected = compiled(q, k, v), _fn(q, k, v)
        _close(got[0], expected[0])
        _close(got[1], expected[1])
    graphs = _with_op(graphs)
    assert len(graphs) == (1 if dynamic else 2)
    nodes = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("fa_variants.attention" in n for n in nodes) == 1, nodes


@pytest.mark.parametrize("dynamic", [False, True])
def test_sdpa_compiles_fullgraph(dynamic):
    compiled, graphs = _graph_ops(_sdpa_fn, dynamic=dynamic)
    for b, n in ((3, 37), (5, 20)):
        q, k, v = (_bshd(t) for t in _qkv(B=b, Nq=n, Nk=n))
        _close(compiled(q, k, v), _sdpa_fn(q, k, v))
    assert len(_with_op(graphs)) == (1 if dynamic else 2)


def test_compiled_bad_call_raises_the_api_message():
    """Validation is traced, so a bad call fails while compiling, with the API's message."""
    q, k, v = _qkv(Hkv=4)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="num_heads 6 not divisible by num_heads_kv 4"):
        torch.compile(_fn, fullgraph=True, backend="aot_eager")(q, k, v)


def test_autograd_through_the_compiled_reference_matches_eager():
    """Gradients through the compiled call (the op's registered backward, reference.run_backward) match
    eager autograd through the reference (a different formula order: tolerance)."""
    q, k, v = _qkv(dtype=torch.float64)
    torch._dynamo.reset()
    compiled = torch.compile(_fn, fullgraph=True, dynamic=True, backend="aot_eager")
    grads = []
    for run in (compiled, _fn):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, lse = run(*leaves)
        (out.square().sum() + lse.sum()).backward()
        grads.append([t.grad for t in leaves])
    for got, expected in zip(*grads):
        _close(got, expected, tol=1e-9)


def _transformed(name: str, causal: bool):
    """A torch.func transform over attention (float64 reference maths under it): grad of a loss through O and the LSE
    (rows that see no key have LSE -inf: left out of the sum), the VJP of O, jacrev of a row sum, vmap over a stack
    of q."""
    def attn(q, k, v):
        return fa_variants.attention(q, k, v, causal=causal, return_lse=True)

    def loss(q, k, v):
        out, lse = attn(q, k, v)
        return out.square().sum() + torch.where(lse.isinf(), 0.0, lse).sum()

    return {
        "grad": lambda q, k, v: torch.func.grad(loss, argnums=(0, 1, 2))(q, k, v),
        "vjp": lambda q, k, v: torch.func.vjp(lambda q, k, v: attn(q, k, v)[0], q, k, v)[1](torch.cos(q)),
        "jacrev": lambda q, k, v: torch.func.jacrev(lambda v: attn(q[:1, :3], k[:1], v)[0].sum((2, 3)))(v[:1]),
        "vmap": lambda q, k, v: torch.func.vmap(attn, in_dims=(0, None, None))(torch.stack([q, 2 * q]), k, v),
    }[name]


@pytest.mark.parametrize("name", ["grad", "vjp", "jacrev", "vmap"])
@pytest.mark.parametrize("Nq, Nk, causal", [(37, 41, True), (41, 37, True), (37, 41, False), (5, 0, False)])
def test_torch_func_transforms_compile_fullgraph(name, Nq, Nk, causal):
    """torch.compile(fullgraph=True) over torch.func transforms of attention: the custom op cannot serve under a
    transform (PyTorch refuses its autograd there: "must override the setup_context staticmethod"), so the traced call
    runs the reference's plain PyTorch in its place (api._traced_under_transforms), as eager does: the compiled
    results equal eager ones (GQA 6:2, causal bottom-right with seqlen_q != seqlen_k, rows with no key, seqlen_k 0)."""
    q, k, v = _qkv(Nq=Nq, Nk=Nk, dtype=torch.float64)
    fn = _transformed(name, causal)
    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    expected = fn(q, k, v)
    for g, e in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected), strict=True):
        assert not e.isnan().any()  # (the LSE of a row with no key is -inf)
        _close(g, e, tol=1e-9)


def test_torch_func_grad_of_sdpa_compiles_fullgraph():
    """The same through ``fa_variants.scaled_dot_product_attention`` (PyTorch's layout), against float64 autograd of
    the reference (so that the traced path is checked against another computation, not only against itself)."""
    q, k, v = (_bshd(t) for t in _qkv(dtype=torch.float64, Nq=29, Nk=29))
    torch._dynamo.reset()
    grad = torch.compile(torch.func.grad(lambda q, k, v: _sdpa_fn(q, k, v).sum(), argnums=(0, 1, 2)), fullgraph=True,
                         backend="aot_eager")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, _ = attention_reference(*(_bshd(t) for t in leaves), causal=True, softmax_scale=0.3)
    out.sum().backward()
    for got, leaf in zip(grad(q, k, v), leaves, strict=True):
        _close(got, leaf.grad, tol=1e-9)


#: the refusal of the per-sequence windows and split options inside torch.func transforms under torch.compile
_WINDOWS_REFUSED = (r"seqlens_k, leftpad_k, seqlens_q, num_splits and pack_gqa are not supported inside torch.func "
                    r"transforms")


@pytest.mark.parametrize("call, message", [
    (dict(backend="fa2"), r"backend fa2 on cpu inside torch.func transforms under torch.compile: only "
                          r"backend='reference' runs there"),
    (dict(seqlens_k=torch.tensor([40, 3], dtype=torch.int32)), _WINDOWS_REFUSED + r" under torch.compile"),
    (dict(leftpad_k=torch.tensor([4, 3], dtype=torch.int32)), _WINDOWS_REFUSED),
    (dict(seqlens_q=torch.tensor([4, 3], dtype=torch.int32), causal=True), _WINDOWS_REFUSED),
])
def test_torch_func_transforms_under_compile_refuse_what_cannot_run(call, message):
    """What the traced reference cannot serve refuses in our words (torch's wraps them in its Unsupported error)."""
    q, k, v = _qkv()
    torch._dynamo.reset()
    fn = torch.func.grad(lambda q: fa_variants.attention(q, k, v, **call).sum())
    with pytest.raises(Exception, match=message):
        torch.compile(fn, fullgraph=True, backend="aot_eager")(q)


def test_export_runs_the_op():
    """torch.export gives a graph holding the op, which runs and matches the eager call."""
    class Model(torch.nn.Module):
        def forward(self, q, k, v):
            return _fn(q, k, v)

    q, k, v = _qkv()
    batch = torch.export.Dim("batch", max=64)
    seqlen = torch.export.Dim("seqlen", max=4096)
    shapes = {"q": {0: batch, 1: seqlen}, "k": {0: batch, 1: seqlen}, "v": {0: batch, 1: seqlen}}
    q, k, v = _qkv(Nq=41, Nk=41)
    exported = torch.export.export(Model(), (q, k, v), dynamic_shapes=shapes)
    assert "torch.ops.fa_variants.attention.default" in exported.graph_module.code
    q, k, v = _qkv(B=3, Nq=29, Nk=29)  # another size through the same exported program
    got, expected = exported.module()(q, k, v), _fn(q, k, v)
    _close(got[0], expected[0])
    _close(got[1], expected[1])


def test_a_saved_program_loads_in_a_fresh_process_after_a_plain_import(tmp_path):
    """torch.export.save, then torch.export.load in a new interpreter that only ran `import torch, fa_variants`:
    the load failed ("custom op is not registered") because the package registered its op on the first use of
    one of its names; with torch loaded, the import registers it (the op only: the API, whose modules read the
    FA_VARIANTS_* switches, still loads at its first use). The loaded program matches the eager call."""
    class Model(torch.nn.Module):
        def forward(self, q, k, v):
            return _fn(q, k, v)

    q, k, v = _qkv()
    torch.export.save(torch.export.export(Model(), (q, k, v)), tmp_path / "m.pt2")
    torch.save((q, k, v, _fn(q, k, v)), tmp_path / "io.pt")
    code = textwrap.dedent(f"""
        import sys, torch, fa_variants
        assert "fa_variants.api" not in sys.modules and "fa_variants.common.split" not in sys.modules
        q, k, v, (out, lse) = torch.load({str(tmp_path / "io.pt")!r})
        got, got_lse = torch.export.load({str(tmp_path / "m.pt2")!r}).module()(q, k, v)
        print((got - out).abs().max().item(), (got_lse - lse).abs().max().item())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    errors = [float(x) for x in done.stdout.split()]
    assert len(errors) == 2 and max(errors) <= 1e-5, done.stdout


def test_eager_op_and_plain_call_agree():
    """Eagerly, attention skips the dispatcher (per-call cost) but the op runs the same implementation."""
    q, k, v = _qkv()
    direct = fa_variants.attention(q, k, v, causal=True, return_lse=True)
    via_op = torch.ops.fa_variants.attention(q, k, v, True, None, "auto")
    assert torch.equal(direct[0], via_op[0]) and torch.equal(direct[1], via_op[1])  # one computation, twice


def test_compile_in_a_cold_process():
    """A fresh interpreter (no backend module imported yet, no dispatch cache) compiles both public functions
    with fullgraph=True: nothing that loads a backend is traced."""
    code = textwrap.dedent("""
        import torch, fa_variants
        q, k, v = (torch.randn(1, 17, 4, 16) for _ in range(3))
        f = torch.compile(lambda q, k, v: fa_variants.attention(q, k, v, causal=True), fullgraph=True,
                          dynamic=True, backend="aot_eager")
        g = torch.compile(lambda q, k, v: fa_variants.scaled_dot_product_attention(q, k, v, is_causal=True),
                          fullgraph=True, backend="aot_eager")
        a, b = f(q, k, v), g(q, k, v)
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("FA_VARIANTS_BACKEND", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


# ----------------------------------------------------------------------------------------------- GPU

def _kernel_backend():
    from fa_variants import dispatch
    return "fa3" if dispatch.device_capability(torch.device("cuda")) == (9, 0) else "fa2"


@pytest.mark.gpu
@pytest.mark.parametrize("mode, dynamic", [("default", False), ("default", True), ("reduce-overhead", False)])
@pytest.mark.parametrize("backend", ["auto", "kernel"])
def test_kernels_compile_fullgraph_on_the_gpu(mode, dynamic, backend):
    """fa3 (sm90) or fa2 (other GPUs), and backend="auto", inside torch.compile(fullgraph=True) with
    inductor: default mode (static and dynamic shapes) and reduce-overhead (CUDA graphs: replays after the
    warm-up calls must give the same output as eager for fresh inputs copied into the same tensors)."""
    backend = _kernel_backend() if backend == "kernel" else backend

    def fn(q, k, v):
        a = fa_variants.attention(q, k, v, causal=True, backend=backend)
        b = fa_variants.scaled_dot_product_attention(_bshd(q), _bshd(k), _bshd(v), is_causal=True,
                                                     enable_gqa=True, backend=backend)
        return a.float() + _bshd(b).float()

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic, mode=mode)
    q, k, v = _qkv(B=2, Nq=300, Nk=300, H=8, Hkv=2, D=128, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        for step in range(4):  # warm-up, recording, replays (reduce-overhead)
            for t in (q, k, v):
                t.copy_(torch.randn_like(t))
            got = compiled(q, k, v).clone()
            expected = fn(q, k, v)
            # same kernels, same inputs: the same numbers (the float32 add of two bf16 outputs is exact); allowed: a
            # bf16 unit of either output (2^-8 of the sum), no more
            torch.testing.assert_close(got, expected, rtol=2**-7, atol=1e-6)
        if dynamic:
            q2, k2, v2 = _qkv(B=1, Nq=77, Nk=77, H=8, Hkv=2, D=128, dtype=torch.bfloat16, device="cuda")
            torch.testing.assert_close(compiled(q2, k2, v2), fn(q2, k2, v2), rtol=2**-7, atol=1e-6)
    # and the kernels are right, not just repeatable: the mean of the two outputs within the project's rule
    assert (check := check_against_reference(expected / 2, q, k, v, True)).ok, check


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_seqlens_k_training_under_compile_on_the_gpu(mode, monkeypatch):
    """A compiled training step with per-sequence KV lengths (fullgraph, inductor) on the kernel backend: the
    backward reads the lengths on the host (the fused backward length by length), so under reduce-overhead its op
    (fa_variants::attention_lengths_backward, tagged cudagraph_unsafe) runs outside the CUDA graphs; every step, with
    new inputs and lengths copied into the same tensors, gives gradients within the rule against float64 and one
    fused call per length. The baseline is the same maths in bf16 (``attention_reference(dtype=bf16)``: P rounded
    to bf16, as a fused backward keeps it), not the reference backend's float32 maths, whose error is bf16's last
    rounding alone (session 54, an H100: 0.0036 against the fused 0.0102 in dK, a flaky bound)."""
    from fa_variants.integrations import backward
    from helpers import assert_grads_within_rule, exact_grads

    fused = []
    for name in ("cudnn_backward", "flash_backward"):
        monkeypatch.setattr(backward, name,
                            lambda *a, _f=getattr(backward, name), **kw: fused.append(1) or _f(*a, **kw))
    backend = _kernel_backend()
    q, k, v = _qkv(B=3, Nq=64, Nk=200, H=8, Hkv=2, D=128, dtype=torch.bfloat16, device="cuda")
    lengths = torch.zeros(3, dtype=torch.int32, device="cuda")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    grad_out = torch.empty_like(q)

    def step(q, k, v, lengths):
        return fa_variants.attention(q, k, v, causal=True, seqlens_k=lengths, backend=backend)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, mode=mode)
    try:
        for n in ([200, 131, 64], [90, 200, 77], [200, 200, 200]):  # warm-up, recording, replay
            with torch.no_grad():
                for t, leaf in zip((q, k, v), leaves):
                    leaf.copy_(torch.randn_like(t))
                    leaf.grad = None
                grad_out.copy_(torch.randn_like(grad_out))
                lengths.copy_(torch.tensor(n, dtype=torch.int32))
            fused.clear()
            compiled(*leaves, lengths).backward(grad_out)
            got = [leaf.grad.clone() for leaf in leaves]
            assert len(fused) == len(set(n)), (n, fused)
            inputs = [leaf.detach() for leaf in leaves]
            same_leaves = [t.clone().requires_grad_(True) for t in inputs]
            same = torch.autograd.grad(attention_reference(*same_leaves, causal=True, seqlens_k=lengths,
                                                           dtype=torch.bfloat16)[0], same_leaves, grad_out)
            exact = exact_grads(*inputs, grad_out, causal=True, seqlens_k=lengths)
            assert_grads_within_rule(got, same, exact)
    finally:
        torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("padded", [False, True, "left", "right"],
                         ids=["plain-mask", "padded-keys", "left-padded", "right-padded-causal"])
def test_sdpa_attn_mask_training_under_compile_fullgraph_on_the_gpu(padded, monkeypatch):
    """The SDPA drop-in's attn_mask in a compiled training step (fullgraph=True, inductor), on the kernel backend:
    torch.ops.fa_variants.sdpa_masked_windows reads the mask when the graph runs; its backward is the plain call's fused
    one for a mask without padding, and with key lengths one fused call per length (since session 53; the reference's
    before); keys padded on the left (an encoder's batch: full over [p_b, N)) run as one call with leftpad_k (since
    session 54), the backward one fused call per window; a causal batch padded on the right (a training batch) as
    one call with seqlens_q (since session 55), the backward one fused call per window's causal rows and one per its
    padding rows. Output and gradients within the rule against float64, with torch's SDPA in bf16 as the baseline
    (FA_VARIANTS_BACKWARD cudnn or flash, the default mode)."""
    from fa_variants.integrations import backward
    from helpers import assert_grads_within_rule, exact_grads

    fused = []  # the fused backwards' calls (cuDNN's, FlashAttention-2's)
    for name in ("cudnn_backward", "flash_backward"):
        monkeypatch.setattr(backward, name, lambda *a, _f=getattr(backward, name), **kw: fused.append(1) or _f(*a, **kw))
    backend = _kernel_backend()
    B, N, H, Hkv, D = 3, 200, 8, 2, 128
    q, k, v = _qkv(B=B, Nq=N, Nk=N, H=H, Hkv=Hkv, D=D, dtype=torch.bfloat16, device="cuda")
    lengths = torch.tensor([N, 131, 1] if padded in (True, "right") else [N] * B, device="cuda")
    pads = torch.tensor([0, 69, N - 1] if padded == "left" else [0] * B, device="cuda")
    keys = torch.arange(N, device="cuda")
    mask = (keys[None, None, :] < lengths[:, None, None]) & (keys[None, :, None] >= keys[None, None, :]) \
        if not padded else ((keys[None, None, :] < lengths[:, None, None]) & (keys >= pads[:, None, None])).expand(
            B, N, N)
    if padded == "right":  # causal over each sequence's first keys: its padding rows see all of them
        mask = (keys[None, None, :] < lengths[:, None, None]) & (keys[None, :, None] >= keys[None, None, :])
    mask = mask[:, None]  # (B, 1, N, N): causal without padding; full over each sequence's window with it
    grad_out = torch.randn_like(q)

    def step(q, k, v):
        return fa_variants.scaled_dot_product_attention(_bshd(q), _bshd(k), _bshd(v), attn_mask=mask,
                                                        enable_gqa=True, backend=backend)

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(_bshd(q), _bshd(k), _bshd(v), attn_mask=mask,
                                                                enable_gqa=True)

    torch._dynamo.reset()
    grads = []
    try:
        for fn in (torch.compile(step, fullgraph=True), sdpa):
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            out = _bshd(fn(*leaves))
            out.backward(grad_out)
            grads.append((out.detach(), [t.grad for t in leaves]))
    finally:
        torch._dynamo.reset()
    calls = 5 if padded == "right" else 3 if padded else 1  # per window (right: 1 + 2 + 2 row parts)
    assert len(fused) == (0 if backward.mode() == "pytorch" else calls), fused
    kwargs = dict(causal=False, seqlens_k=lengths.to(torch.int32)) if padded else dict(causal=True)
    if padded == "left":
        kwargs["leftpad_k"] = pads.to(torch.int32)
    if padded == "right":
        kwargs.update(causal=True, seqlens_q=lengths.to(torch.int32))
    assert_attention_ok(grads[0][0], None, q, k, v, kwargs["causal"], seqlens_k=kwargs.get("seqlens_k"),
                        leftpad_k=kwargs.get("leftpad_k"), seqlens_q=kwargs.get("seqlens_q"),
                        what=f"compiled sdpa_masked padded={padded}")
    assert_grads_within_rule(grads[0][1], grads[1][1], exact_grads(q, k, v, grad_out, **kwargs))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_hf_static_cache_mask_under_compile_on_the_gpu(mode):
    """A transformers-style decoding step over a static cache (its mask built in the graph from the filled lengths)
    through ``hf.attention_forward`` under torch.compile(fullgraph=True): the mask op reads the mask when the graph
    runs (kept out of the CUDA graphs of reduce-overhead), and every step, with new lengths and queries copied into
    the same tensors, gives attention over each sequence's first keys (lengths 0 and 1, the full cache, tile
    edges), within the project's rule."""
    from fa_variants.integrations import hf

    module = torch.nn.Module()
    module.is_causal = True

    def step(q, k, v, lengths):  # q (batch, heads, 1, head_dim), k / v (batch, heads_kv, slots, head_dim)
        slots = torch.arange(k.shape[2], device=k.device)
        mask = (slots < lengths[:, None])[:, None, None]  # (batch, 1, 1, slots), as transformers builds it
        return hf.attention_forward(module, q, k, v, mask)[0]

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, mode=mode)
    q, k, v = _qkv(B=4, Nq=1, Nk=384, H=8, Hkv=2, D=128, dtype=torch.bfloat16, device="cuda")
    q, k, v = _bshd(q), _bshd(k), _bshd(v)
    lengths = torch.zeros(4, dtype=torch.int64, device="cuda")
    with torch.no_grad():
        for filled in ([384, 1, 200, 0], [5, 383, 129, 128], [64, 65, 2, 384], [1, 1, 1, 1]):
            lengths.copy_(torch.tensor(filled))
            q.copy_(torch.randn_like(q))
            got = compiled(q, k, v, lengths).clone()
            seqlens_k = torch.tensor(filled, dtype=torch.int32, device="cuda")
            assert_attention_ok(got, None, _bshd(q), _bshd(k), _bshd(v), True, seqlens_k=seqlens_k,
                                what=f"{mode} lengths {filled}")
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_kernels_under_cuda_autocast(autocast_dtype):
    """Under torch.autocast("cuda") (session 28; CPU tests in test_api.py): float32 Q with bf16 K/V, as a Hugging Face
    model's rotary embedding leaves them, run on the kernel in the autocast dtype: bit for bit the kernel on the cast
    inputs outside autocast, eagerly and under torch.compile(fullgraph=True); the caller's tensors keep their
    dtypes."""
    backend = _kernel_backend()
    q, k, v = _qkv(B=2, Nq=300, Nk=300, H=8, Hkv=2, D=128, dtype=torch.bfloat16, device="cuda")
    q = q.float()
    with torch.no_grad():
        want = fa_variants.attention(q.to(autocast_dtype), k.to(autocast_dtype), v.to(autocast_dtype), causal=True,
                                     backend=backend)
        torch._dynamo.reset()
        compiled = torch.compile(lambda a, b, c: fa_variants.attention(a, b, c, causal=True, backend=backend),
                                 fullgraph=True)
        with torch.autocast("cuda", dtype=autocast_dtype):
            eager = fa_variants.attention(q, k, v, causal=True, backend=backend)
            traced = compiled(q, k, v)
    assert eager.dtype == traced.dtype == autocast_dtype
    assert torch.equal(eager, want) and torch.equal(traced, want)
    assert q.dtype == torch.float32 and k.dtype == v.dtype == torch.bfloat16


@pytest.mark.gpu
def test_fp8_compile_reduce_overhead_first_call():
    """backend="fa3-fp8" (bf16 inputs quantised by the GPU pass) under torch.compile(mode="reduce-overhead") as the
    process's first fp8 call: the pass's cached constants (Hadamard signs, placeholder zeros) and its K-mean scratch
    are made during the CUDA-graph warm-up, which allocates from the graph's pool; none may stay there
    (common.workspace.persistent / uncached: "tensor(s) in the cudagraph pool not tracked as outputs"). Replays
    with fresh inputs copied in must match eager calls (the same kernels), and eager must be near float64's."""
    from fa_variants import dispatch

    if dispatch.device_capability(torch.device("cuda")) != (9, 0):
        pytest.skip("fa3-fp8 runs on sm90 only")
    from fa_variants.fp8 import quant_host

    quant_host._CONSTANTS.clear()  # as in a fresh process (the split scratch: workspace.uncached, never cached)

    def fn(q, k, v):
        return fa_variants.attention(q, k, v, causal=True, backend="fa3-fp8")

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, mode="reduce-overhead")
    q, k, v = _qkv(B=2, Nq=300, Nk=300, H=8, Hkv=2, D=128, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        for step in range(4):  # warm-up, recording, replays
            for t in (q, k, v):
                t.copy_(torch.randn_like(t))
            got = compiled(q, k, v).clone()
            expected = fn(q, k, v)
            # same kernels, same inputs (as test_kernels_compile_fullgraph_on_the_gpu)
            torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2)
    ref, _ = attention_reference(q.double(), k.double(), v.double(), causal=True)
    err = (expected.double() - ref).abs().mean()
    assert err < 0.1 * ref.abs().mean(), (err, ref.abs().mean())  # e4m3 inputs: loose, but not garbage


# ------------------------------------------------------ session 10: numpy scalars as softmax_scale

@pytest.mark.parametrize("make", [np.float32, np.float64, np.int64], ids=["float32", "float64", "int64"])
def test_numpy_scalar_softmax_scale_eager_matches_float(make):
    """SDPA takes a numpy scalar as ``scale``; so does ``attention`` eagerly (numpy registers its scalars as
    numbers.Real): kept so, beside the traced case below."""
    q, k, v = _qkv()
    got = fa_variants.attention(q, k, v, softmax_scale=make(0.25 if make is not np.int64 else 1))
    expected = fa_variants.attention(q, k, v, softmax_scale=float(make(0.25 if make is not np.int64 else 1)))
    _close(got, expected)


@pytest.mark.parametrize("make", [np.float32, np.float64, np.int64], ids=["float32", "float64", "int64"])
def test_numpy_scalar_softmax_scale_under_fullgraph_names_the_fix(make):
    """Under torch.compile a numpy scalar is traced as a tensor with an unbacked value: before, fullgraph stopped
    with "Unsupported repr() on tensor" (the message's repr of the argument); now one TypeError naming it."""
    q, k, v = _qkv()
    torch._dynamo.reset()
    scale = make(1)
    fn = torch.compile(lambda q, k, v: fa_variants.attention(q, k, v, softmax_scale=scale), fullgraph=True,
                       backend="aot_eager")
    with pytest.raises(Exception, match=r"softmax_scale is a numpy value, which torch.compile traces as a "
                                        r"tensor: pass float\(softmax_scale\)"):
        fn(q, k, v)


def test_tensor_softmax_scale_is_named():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"^softmax_scale must be a real number or None, got tensor\(0.5000\) "
                                        r"\(a tensor: pass softmax_scale.item\(\)\)$"):
        fa_variants.attention(q, k, v, softmax_scale=torch.tensor(0.5))
