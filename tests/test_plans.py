"""Cached call plans (``api._call_key`` -> ``api._plan``) and the launcher (``common.launch.launcher``): a call
of a kind seen before skips validation and dispatch, and nothing of the input rules is lost."""
import sys
import types
from unittest import mock

import pytest
import torch

import fa_variants
from fa_variants import dispatch, reference, registry
from fa_variants.common import cache, launch
from fa_variants.common.launch import Variant

F16 = torch.float16


@pytest.fixture
def fake_fa3(monkeypatch):
    """The CPU seen as an sm_90 whose fa3 is a recording fake (it runs the reference)."""
    calls = []

    def run(q, k, v, *, causal, softmax_scale):
        calls.append(dict(q=q, k=k, v=v, softmax_scale=softmax_scale))
        return reference.run(q, k, v, causal=causal, softmax_scale=softmax_scale)

    module = types.ModuleType("_fake_kernels.plans")
    module.VARIANT = Variant("fa3", archs=("sm_90a",), dtypes=(F16,), head_dims=(16,), runner=run)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(registry.ENTRIES, "fa3", registry.Entry(module.__name__, "fake"))
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    dispatch.clear_cache()
    yield calls
    dispatch.clear_cache()


def qkv(nq=5, nk=7, heads=4, heads_kv=2, d=16):
    return (torch.randn(2, nq, heads, d, dtype=F16), torch.randn(2, nk, heads_kv, d, dtype=F16),
            torch.randn(2, nk, heads_kv, d, dtype=F16))


def test_a_second_call_of_the_same_kind_runs_its_plan(fake_fa3):
    q, k, v = qkv()
    first = fa_variants.attention(q, k, v, causal=True)
    assert len(dispatch.PLANS) == 1
    with mock.patch.object(dispatch, "select_backend", side_effect=AssertionError("dispatched again")):
        q2, k2, v2 = qkv()  # new values, same kind
        out = fa_variants.attention(q2, k2, v2, causal=True)
    assert len(fake_fa3) == 2 and fake_fa3[1]["q"] is q2
    expected, _ = reference.run(q2, k2, v2, causal=True, softmax_scale=16 ** -0.5)
    torch.testing.assert_close(out, expected)
    assert not torch.equal(out, first)


@pytest.mark.parametrize("kwargs, error", [
    (dict(causal=1), TypeError), (dict(softmax_scale=True), TypeError), (dict(softmax_scale=float("nan")), ValueError),
    (dict(return_lse=1), TypeError), (dict(backend="fa9"), ValueError)])
def test_a_plan_never_lets_a_bad_argument_through(fake_fa3, kwargs, error):
    q, k, v = qkv()
    good = dict(causal=True, softmax_scale=1.0, return_lse=True, backend="auto")
    fa_variants.attention(q, k, v, **good)
    with pytest.raises(error):
        fa_variants.attention(q, k, v, **{**good, **kwargs})


def test_another_kind_gets_its_own_plan(fake_fa3):
    q, k, v = qkv()
    fa_variants.attention(q, k, v)
    fa_variants.attention(q.transpose(1, 2).contiguous().transpose(1, 2), k, v)  # other strides
    fa_variants.attention(q, k.expand(2, 7, 2, 16), v)  # same values, (a view, same strides): same plan
    with pytest.raises(ValueError, match="q has head_dim 16 but k has head_dim 8"):
        fa_variants.attention(q, k[..., :8], v)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        fa_variants.attention(q, None, v)
    assert len(dispatch.PLANS) == 2


def test_plans_are_bounded(fake_fa3, monkeypatch):
    monkeypatch.setattr(dispatch, "MAX_PLANS", 3)
    q, k, v = qkv(nk=8)
    for n in range(1, 6):  # a KV cache growing by one key per step: a new kind each time
        fa_variants.attention(q, k[:, :n], v[:, :n])
    assert len(dispatch.PLANS) == 3
    assert [key[8][1] for key in dispatch.PLANS] == [3, 4, 5]  # k's seqlen: the newest kept
    for key in list(dispatch.PLANS):  # storing under a key already held evicts nothing
        dispatch.remember_plan(key, dispatch.PLANS[key])
    dispatch.remember_plan(None, object())  # no key: nothing kept
    assert [key[8][1] for key in dispatch.PLANS] == [3, 4, 5]


def test_plans_replay_the_normalisation(fake_fa3):
    """A non-unit last stride is copied and K/V broadcast across heads run as MQA, on every call."""
    q, k, v = qkv(heads_kv=1)
    kb, vb = k.expand(2, 7, 4, 16), v.expand(2, 7, 4, 16)
    qt = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # head_dim not unit-stride
    for _ in range(2):
        fa_variants.attention(qt, kb, vb)
    for call in fake_fa3:
        assert call["q"].stride(-1) == 1 and call["k"].shape[2] == 1 and call["v"].shape[2] == 1


def test_the_launcher_decides_once_and_replays_per_call():
    """launch.launcher on the CPU with the compiled kernel stubbed: the operand hook runs once per kind and
    a re-strided view is replayed by as_strided; each call gets fresh outputs."""
    launched, seen = [], []

    def operand(t):
        seen.append(t)
        return t.as_strided(t.shape, (t.stride(0) * 2,) + t.stride()[1:]) if t.shape[0] == 1 else t

    variant = Variant("stub", archs=("sm_90a",), dtypes=(F16,), head_dims=(16,), build=lambda cfg: None,
                      default_config=lambda arch, d, causal: None, operand=operand)
    compiled = cache.Compiled(None, lambda *args: launched.append(args), 0.0, None, 0)
    q = torch.randn(1, 3, 2, 16, dtype=F16)
    k = v = torch.randn(1, 5, 2, 16, dtype=F16)
    with mock.patch.object(launch.cache, "get_compiled", lambda cfg, build: compiled), \
            mock.patch.object(launch.interop, "device_arch", lambda d=None: "sm_90a"):
        launch._KERNELS.clear()
        run = launch.launcher(variant, q, k, v, causal=False, softmax_scale=0.5)
        hooks = len(seen)
        out1, _ = run(q, k, v)
        out2, lse = run(q, k, v)
        launch._KERNELS.clear()
    assert hooks == 3 and len(seen) == 3  # the hook ran while planning only
    args = launched[-1]
    assert args[0].stride(0) == 2 * q.stride(0) and args[0].data_ptr() == q.data_ptr() and args[5] == 0.5
    assert out1.data_ptr() != out2.data_ptr() and lse.shape == (1, 2, 3) and lse.dtype == torch.float32


def test_the_launcher_keeps_its_config_until_a_switch_changes():
    """With Variant.switches the config is chosen once per kind (problem_config, plan_call run while planning)
    and again only when a switch flips; each call still gets fresh outputs and its own prepare."""
    switch, decided, planned, prepared, launched, causals = [1], [], [], [], [], []

    def problem_config(given, q, k, causal):
        decided.append(switch[0])
        return ("config", switch[0])

    def plan_call(config, q, k, v, scale, causal):  # causal: the launcher's (fa3's balanced tile table needs it)
        planned.append(config)
        causals.append(causal)
        return (lambda q, k, v, out, lse: prepared.append(config) or (q, k, v, out, lse, config)), None

    variant = Variant("stub", archs=("sm_90a",), dtypes=(F16,), head_dims=(16,), build=lambda cfg: None,
                      default_config=lambda arch, d, causal: None, problem_config=problem_config,
                      plan_call=plan_call, switches=lambda: switch[0])
    q = torch.randn(1, 3, 2, 16, dtype=F16)
    k = v = torch.randn(1, 5, 2, 16, dtype=F16)
    compiled = cache.Compiled(None, lambda *args: launched.append(args), 0.0, None, 0)
    with mock.patch.object(launch.cache, "get_compiled", lambda cfg, build: compiled), \
            mock.patch.object(launch.interop, "device_arch", lambda d=None: "sm_90a"):
        launch._KERNELS.clear()
        run = launch.launcher(variant, q, k, v, causal=False, softmax_scale=0.5)
        outs = [run(q, k, v)[0] for _ in range(3)]
        assert decided == [1] and planned == [("config", 1)] and prepared == [("config", 1)] * 3
        switch[0] = 2
        run(q, k, v)
        launch._KERNELS.clear()
    assert decided == [1, 2] and planned[-1] == ("config", 2) and launched[-1][-1] == ("config", 2)
    assert len({o.data_ptr() for o in outs}) == 3 and causals == [False, False]
    with mock.patch.object(launch.cache, "get_compiled", lambda cfg, build: compiled), \
            mock.patch.object(launch.interop, "device_arch", lambda d=None: "sm_90a"):
        launch.launcher(variant, q, k, v, causal=True, softmax_scale=0.5)(q, k, v)
        launch._KERNELS.clear()
    assert causals[-1] is True


def test_a_switch_read_only_by_plan_call_replans_an_equal_config():
    """A switch that plan_call reads but the config does not carry (fa3's MERGE_WARP picks the merge kernel it
    binds) re-plans when it flips even though problem_config gives an equal config, and flipping it back reuses
    the first plan (steps are keyed by config and switch state). Before, the equal config's first step was
    reused: decode5's "warp" A/B entry ran the shared-memory merge."""
    switch, planned, launched = ["smem"], [], []

    def plan_call(config, q, k, v, scale, causal):
        merge = switch[0]  # bound while planning, as fa3._plan_call binds its merge function
        planned.append(merge)
        return (lambda q, k, v, out, lse: (q, k, v, out, lse, merge)), None

    variant = Variant("stub", archs=("sm_90a",), dtypes=(F16,), head_dims=(16,), build=lambda cfg: None,
                      default_config=lambda arch, d, causal: None,
                      problem_config=lambda given, q, k, causal: "same config", plan_call=plan_call,
                      switches=lambda: switch[0])
    q = torch.randn(1, 3, 2, 16, dtype=F16)
    k = v = torch.randn(1, 5, 2, 16, dtype=F16)
    compiled = cache.Compiled(None, lambda *args: launched.append(args[-1]), 0.0, None, 0)
    with mock.patch.object(launch.cache, "get_compiled", lambda cfg, build: compiled), \
            mock.patch.object(launch.interop, "device_arch", lambda d=None: "sm_90a"):
        launch._KERNELS.clear()
        run = launch.launcher(variant, q, k, v, causal=False, softmax_scale=0.5)
        for value in ("smem", "warp", "warp", "smem", "warp"):
            switch[0] = value
            run(q, k, v)
        launch._KERNELS.clear()
    assert launched == ["smem", "warp", "warp", "smem", "warp"]
    assert planned == ["smem", "warp"]  # one plan per (config, switch state)


def test_an_identity_operand_view_is_not_redone_per_call():
    """fa3's TMA operand re-strides length-1 dimensions; where that gives the strides the tensor already has
    (any contiguous decode q, k, v) the launcher passes the caller's tensor itself, with no view per call."""
    from fa_variants.hopper import fa3

    q = torch.randn(1, 1, 32, 128, dtype=F16)
    assert launch._operand_fix(fa3._tma_operand, q) is None
    odd = torch.randn(1, 1, 32, 128, dtype=F16).as_strided((1, 1, 32, 128), (8, 8, 128, 1))
    assert launch._operand_fix(fa3._tma_operand, odd) == fa3._tma_operand(odd).stride()


def test_fa3_plan_call_views_one_workspace_and_merges_it():
    """fa3's split + packed GQA decode arguments (worked out once on meta tensors): q, O and LSE partials as
    pack_gqa_views would give them, the partials in one fp32 workspace, merged by finish into out, lse (here
    split.merge, the CPU path) exactly as merging the same partials directly."""
    import dataclasses

    from fa_variants.common import split
    from fa_variants.hopper import fa3

    q, k = torch.randn(2, 1, 8, 64, dtype=F16), torch.randn(2, 300, 2, 64, dtype=F16)
    config = dataclasses.replace(fa3._PACKED_SPLIT_CONFIGS[64], num_splits=3)
    prepare, finish = fa3._plan_call(config, q, k, k, 0.125, False)
    out, lse = torch.empty(2, 1, 8, 64, dtype=F16), torch.empty(2, 8, 1)
    args = prepare(q, k, k, out, lse)
    o_parts, lse_parts = torch.empty(6, 1, 8, 64), torch.empty(6, 8, 1)
    pq, po, pl = fa3.pack_gqa_views(q, o_parts, lse_parts, 2)
    for got, want in ((args[0], pq), (args[3], po), (args[4], pl)):
        assert got.shape == want.shape and got.stride() == want.stride()
    assert args[0].data_ptr() == q.data_ptr() and args[3].untyped_storage().data_ptr() == args[4].untyped_storage().data_ptr()
    args[3].copy_(torch.randn(po.shape))
    args[4].copy_(torch.randn(pl.shape))
    o_parts.copy_(args[3].as_strided(o_parts.shape, o_parts.stride(), 0))
    lse_parts.copy_(args[4].as_strided(lse_parts.shape, lse_parts.stride(), o_parts.numel()))
    finish(args, out, lse)
    want_out, want_lse = torch.empty_like(out), torch.empty_like(lse)
    split.merge(o_parts.unflatten(0, (3, 2)), lse_parts.unflatten(0, (3, 2)), want_out, want_lse)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    assert args[5] == pytest.approx(0.125 * fa3.LOG2_E) and args[6] == fa3.l2_section_heads(300, 64)


def test_fa3_plan_call_fused_merge_arguments(monkeypatch):
    """Sm90Config.fused_merge: one launch with the partials (the same views as the two-kernel path), then the
    caller's out / LSE in their packed views and one zeroed int32 counter per query tile of the kernel's view; no
    finish. On the CPU the scratch is a fresh allocation per call (common.workspace)."""
    import dataclasses

    from fa_variants.hopper import fa3

    q, k = torch.randn(2, 1, 8, 64, dtype=F16), torch.randn(2, 300, 2, 64, dtype=F16)
    config = dataclasses.replace(fa3._PACKED_SPLIT_CONFIGS[64], num_splits=3, fused_merge=True)
    prepare, finish = fa3._plan_call(config, q, k, k, 0.125, False)
    assert finish is None
    out, lse = torch.empty(2, 1, 8, 64, dtype=F16), torch.empty(2, 8, 1)
    args = prepare(q, k, k, out, lse)
    assert len(args) == 10
    pq, po, pl = fa3.pack_gqa_views(q, torch.empty(6, 1, 8, 64), torch.empty(6, 8, 1), 2)
    _, want_out, want_lse = fa3.pack_gqa_views(q, out, lse, 2)
    for got, want in ((args[0], pq), (args[3], po), (args[4], pl), (args[7], want_out), (args[8], want_lse)):
        assert got.shape == want.shape and got.stride() == want.stride()
    assert args[7].data_ptr() == out.data_ptr() and args[8].data_ptr() == lse.data_ptr()
    counters = args[9]
    assert counters.dtype == torch.int32 and counters.numel() == 2 * 2 and not counters.any()  # 2 batches x 2 KV heads
    with pytest.raises(ValueError, match="fused_merge"):
        dataclasses.replace(config, num_splits=1).check(64)


def test_fa3_fused_merge_switch(monkeypatch):
    """fa3.FUSED_MERGE (FA_VARIANTS_FUSED_MERGE: off / decode / all) turns fused_merge on in the split configs `auto`
    and decode_config choose ("decode": packed seqlen_q = 1 only), never in an unsplit one, and is one of the
    launcher's switches (a flip re-plans)."""
    from fa_variants.hopper import fa3

    monkeypatch.setattr(fa3, "SPLIT_KV_ENABLED", True)
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    monkeypatch.setattr(fa3, "_auto_splits",
                        lambda ctas, n_blocks, index, min_tiles=None, per_sm=1: 8 if ctas < 100 else 1)
    q, k = torch.randn(1, 1, 32, 128, dtype=F16), torch.randn(1, 4096, 8, 128, dtype=F16)
    q16 = torch.randn(1, 16, 32, 128, dtype=F16)  # packed in the kernel (pack_group 4)
    for mode in ("off", "decode", "all"):
        monkeypatch.setattr(fa3, "FUSED_MERGE", mode)
        on = mode != "off"
        assert fa3._problem_config(None, q, k, True).fused_merge is on
        assert fa3.decode_config(q, k, True, num_splits=4).fused_merge is on
        assert fa3.decode_config(q, k, True, num_splits=1).fused_merge is False
        rows = fa3._problem_config(None, q16, k, True)
        assert rows.pack_group == 4 and rows.num_splits == 0 and rows.fused_merge is (mode == "all")
        assert fa3.VARIANT.switches()[-1] == mode
        assert all(c.fused_merge is (on and c.num_splits != 1 and (mode == "all" or c.pack_gqa))
                   for c in fa3._auto_configs(128))
    assert fa3.FUSED_MERGE_MODES["1"] == "all" and fa3.FUSED_MERGE_MODES["0"] == "off"
    big = fa3._problem_config(None, torch.randn(64, 1, 32, 128, dtype=F16), k.expand(64, -1, -1, -1), True)
    assert big.num_splits == 1 and not big.fused_merge  # 512 packed CTAs: not split, so not fused either


def test_workspace_on_the_cpu_is_per_call():
    """common.workspace: CPU tensors get fresh scratch per call (the cached per-stream buffers are CUDA only)."""
    from fa_variants.common import workspace

    make = lambda buf, counters: (buf, counters)  # noqa: E731
    a = workspace.views(torch.device("cpu"), 10, 3, ("g",), make)
    b = workspace.views(torch.device("cpu"), 10, 3, ("g",), make)
    assert a[0].numel() == 10 and a[0].dtype == torch.float32 and a[0].data_ptr() != b[0].data_ptr()
    assert a[1].dtype == torch.int32 and not a[1].any() and a[1].numel() == 3
    assert workspace.views(torch.device("cpu"), 4, 0, ("g",), make)[1] is None


@pytest.fixture
def stub_launcher():
    """launch.launcher on the CPU with the compiled kernel stubbed (records its arguments) and the CPU scratch
    cached like one CUDA stream's (common.workspace.CACHE_CPU): ``make(q, k, v) -> run``, and the launches."""
    from fa_variants.common import workspace

    launched = []
    variant = Variant("stub", archs=("sm_90a",), dtypes=(F16,), head_dims=(16,), build=lambda cfg: None,
                      default_config=lambda arch, d, causal: None)
    compiled = cache.Compiled(None, lambda *args: launched.append(args), 0.0, None, 0)
    workspace.clear()
    with mock.patch.object(launch.cache, "get_compiled", lambda cfg, build: compiled), \
            mock.patch.object(launch.interop, "device_arch", lambda d=None: "sm_90a"), \
            mock.patch.object(workspace, "CACHE_CPU", True):
        launch._KERNELS.clear()
        yield (lambda q, k, v: launch.launcher(variant, q, k, v, causal=False, softmax_scale=0.5)), launched
        launch._KERNELS.clear()
    workspace.clear()


def test_an_unread_lse_goes_to_the_stream_scratch(stub_launcher, monkeypatch):
    """run(q, k, v, want_lse=False): the kernel's LSE goes to the stream's LSE scratch (common.workspace
    .lse_function; the same tensor call after call, never the split partials' buffer), and O is the one allocation
    per call; want_lse=True (the default), under CUDA-graph capture, or with LSE_SCRATCH off: a new LSE per call."""
    from fa_variants.common import workspace

    make, launched = stub_launcher
    q = torch.randn(2, 3, 4, 16, dtype=F16)
    k = v = torch.randn(2, 5, 2, 16, dtype=F16)
    run = make(q, k, v)
    out, lse = run(q, k, v, False)
    empty, empty_like = torch.empty, torch.empty_like
    with mock.patch.object(torch, "empty", side_effect=empty) as allocations, \
            mock.patch.object(torch, "empty_like", side_effect=empty_like) as like:
        out2, lse2 = run(q, k, v, False)
    assert allocations.call_count == 0 and like.call_count == 1 and like.call_args.args[0] is q  # O only
    assert out2.shape == q.shape and out2.dtype == q.dtype and out2.is_contiguous()
    assert lse2 is lse and lse.shape == (2, 4, 3) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert launched[-1][3] is out2 and launched[-1][4] is lse and out2.data_ptr() != out.data_ptr()
    assert workspace._slots()[workspace.slot_key(torch.device("cpu"))].buffers.keys() == {"lse"}
    fresh = [run(q, k, v)[1] for _ in range(2)] + [run(q, k, v, True)[1]]
    assert len({t.data_ptr() for t in fresh + [lse]}) == 4 and launched[-1][4] is fresh[-1]
    monkeypatch.setattr(workspace, "capturing", lambda device: True)
    assert run(q, k, v, False)[1].data_ptr() != lse.data_ptr()
    monkeypatch.undo()
    monkeypatch.setattr(launch, "LSE_SCRATCH", False)
    assert make(q, k, v)(q, k, v, False)[1].data_ptr() != lse.data_ptr()


def test_a_large_unread_lse_is_allocated(stub_launcher, monkeypatch):
    """LSEs over workspace.LSE_SCRATCH_MAX elements are allocated per call (the scratch stays small)."""
    from fa_variants.common import workspace

    make, _ = stub_launcher
    monkeypatch.setattr(workspace, "LSE_SCRATCH_MAX", 2 * 4 * 3 - 1)
    q = torch.randn(2, 3, 4, 16, dtype=F16)
    k = v = torch.randn(2, 5, 2, 16, dtype=F16)
    run = make(q, k, v)
    assert run(q, k, v, False)[1].data_ptr() != run(q, k, v, False)[1].data_ptr()
    assert workspace.slot_key(torch.device("cpu")) not in workspace._slots()


def test_attention_without_return_lse_asks_the_plan_for_no_lse(fake_fa3):
    """fa_variants.attention runs a cached plan with want_lse=False unless return_lse=True (the custom op and
    return_lse=True get a real LSE)."""
    q, k, v = qkv()
    fa_variants.attention(q, k, v)
    key = next(iter(dispatch.PLANS))
    asked = []
    real = dispatch.PLANS[key]
    dispatch.PLANS[key] = lambda q, k, v, want_lse=True: asked.append(want_lse) or real(q, k, v, want_lse)
    out = fa_variants.attention(q, k, v)
    out2, lse = fa_variants.attention(q, k, v, return_lse=True)
    assert asked == [False, True] and torch.equal(out, out2) and lse.shape == (2, 4, 5)


def test_workspace_view_cache_is_bounded(monkeypatch):
    """Every kind of call that drops its LSE adds a view of the stream's LSE scratch (one per (B, H, Nq)): a server
    seeing many prompt lengths must not grow the views (nor the interned geometries) without bound, as the plans
    are bounded (dispatch.MAX_PLANS). A function whose views were dropped still gives a tensor of its shape, the
    same one call after call (remade once)."""
    from fa_variants.common import workspace

    workspace.clear()
    monkeypatch.setattr(workspace, "CACHE_CPU", True)
    cpu = torch.device("cpu")
    workspace.lse_function(cpu, (1, 2, 5000))()  # the longest prompt first: the buffer never grows again
    first = workspace.lse_function(cpu, (1, 3, 2))
    lse = first()
    for n in range(1, 5000):  # 5000 prompt lengths
        workspace.lse_function(cpu, (1, 2, n))()
    slot = workspace._slots()[workspace.slot_key(torch.device("cpu"))]
    assert len(slot.views) <= 4096 and len(workspace._VIEW_KEYS) <= 4096
    again = first()
    assert again.shape == (1, 3, 2) and again.is_contiguous() and first() is again
    assert again.data_ptr() == slot.buffers["lse"].data_ptr() and lse.shape == again.shape  # the (grown) buffer
    workspace.clear()


def test_uncached_scope_leaves_no_buffer_behind(monkeypatch):
    """common.workspace.uncached(): inside it, split partials, counters and unread LSEs are fresh per call (zeroed
    counters) and nothing is cached (no stream slot, view or arena), so torch.compile's CUDA-graph warm-up, which
    allocates from the graph's private pool without capturing, keeps nothing of that pool alive (session 8's GPU
    suite: "tensor(s) in the cudagraph pool not tracked as outputs"); outside, the same calls are cached again.
    Nested scopes and an exception inside one restore the state."""
    from fa_variants.common import workspace

    workspace.clear()
    monkeypatch.setattr(workspace, "CACHE_CPU", True)
    cpu = torch.device("cpu")
    make = lambda buf, counters: (buf[:6].view(2, 3), counters)  # noqa: E731
    partials = workspace.function(cpu, 6, 5, ("test-uncached", 2, 3), make)
    lse = workspace.lse_function(cpu, (1, 2, 3))
    with workspace.uncached():
        with workspace.uncached():
            a, counters = partials()
        b, _ = partials()
        fresh = workspace.views(cpu, 6, 5, ("test-uncached", 2, 3), make)
        assert a.data_ptr() != b.data_ptr() and fresh[0].data_ptr() not in (a.data_ptr(), b.data_ptr())
        assert counters.dtype == torch.int32 and counters.shape == (5,) and not counters.any()
        assert lse().data_ptr() != lse().data_ptr()
        assert workspace._slots() == {} and workspace._ARENAS == {}
    with pytest.raises(RuntimeError), workspace.uncached():
        raise RuntimeError("inside")
    cached, _ = partials()
    assert partials()[0] is cached and lse() is lse() and workspace.slot_key(cpu) in workspace._slots()
    workspace.clear()


def test_persistent_tensors_are_made_off_the_current_stream(monkeypatch):
    """common.workspace.persistent: inside uncached() on a CUDA device (not capturing), a tensor kept for the process
    is made on another thread, on a side stream that waited for the caller's current one, then synchronised
    (torch.compile's CUDA-graph warm-up routes every allocation of the warming thread to the graph's pool: session 9's
    H200 run of test_fp8_compile_reduce_overhead_first_call failed with the side stream alone); an error of make() is
    raised to the caller; outside the scope or under capture, as it is, on the caller's thread. The fp8 quantisation
    pass's cached constants (Hadamard signs, placeholder zeros) go through it."""
    import contextlib
    import threading

    from fa_variants.common import workspace

    events = []

    class Side:
        def __init__(self, device):
            events.append("new")

        def wait_stream(self, other):
            events.append(("wait", other))

        def synchronize(self):
            events.append("sync")

    @contextlib.contextmanager
    def on(stream):
        events.append("enter")
        yield
        events.append("exit")

    @contextlib.contextmanager
    def on_device(device):
        events.append(("device", device.index))
        yield

    monkeypatch.setattr(torch.cuda, "Stream", Side)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "device", on_device)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "current")
    capture = [False]
    monkeypatch.setattr(workspace, "capturing", lambda device: capture[0])
    threads = []

    def make():
        threads.append(threading.get_ident())
        events.append("make")
        return 7

    cuda = torch.device("cuda", 0)
    assert workspace.persistent(cuda, make) == 7 and events == ["make"] and threads == [threading.get_ident()]
    events.clear()
    threads.clear()
    with workspace.uncached():
        assert workspace.persistent(cuda, make) == 7
        assert events == [("device", 0), "new", ("wait", "current"), "enter", "make", "exit", "sync"]
        assert threads and threads[0] != threading.get_ident()  # not the (warming) caller's thread
        events.clear()

        def bad():
            raise ValueError("made badly")

        with pytest.raises(ValueError, match="made badly"):
            workspace.persistent(cuda, bad)
        events.clear()
        # a device without an index: the caller's current device, not the helper thread's own (device 0)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
        assert workspace.persistent(torch.device("cuda"), make) == 7 and events[0] == ("device", 1)
        events.clear()
        capture[0] = True
        assert workspace.persistent(cuda, make) == 7 and events == ["make"]
        events.clear()
        assert workspace.persistent(torch.device("cpu"), make) == 7 and events == ["make"]

    pytest.importorskip("cutlass")
    from fa_variants.fp8 import quant_host

    seen = []
    monkeypatch.setattr(workspace, "persistent", lambda device, make: seen.append(device) or make())
    monkeypatch.setattr(quant_host, "_CONSTANTS", {})
    cpu = torch.device("cpu")
    signs = quant_host._signs(cpu, 64, 0, True)
    zeros = quant_host._zeros(cpu, (1, 1, 64))
    assert seen == [cpu, cpu] and quant_host._signs(cpu, 64, 0, True) is signs and seen == [cpu, cpu]
    assert signs.abs().eq(1).all() and not zeros.any()


def test_custom_op_runs_in_the_uncached_scope(monkeypatch):
    """torch.ops.fa_variants.attention (what torch.compile traces fa_variants.attention into) runs the backend
    inside workspace.uncached(), and leaves the scope on return."""
    from fa_variants import api
    from fa_variants.common import workspace
    from fa_variants.integrations import custom_op

    seen = []
    real = api.dispatch_and_run

    def spy(*args, **kwargs):
        seen.append(workspace._uncached_now())
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "dispatch_and_run", spy)
    q, k, v = (torch.randn(1, 5, 2, 16) for _ in range(3))
    out, lse = custom_op.attention_op(q, k, v, True, None, "reference")
    assert seen == [True] and out.shape == q.shape and lse.shape == (1, 2, 5) and not workspace._uncached_now()


# ------------------------------------------------- session 10: a key always hashes (no TypeError to catch)

@pytest.mark.parametrize("kwargs", [dict(softmax_scale=[0.5]), dict(softmax_scale=__import__("numpy").float32(0.5)),
                                    dict(causal=[True]), dict(causal=1), dict(backend=["reference"])])
def test_a_key_is_none_unless_its_scalars_are_plain(kwargs):
    """_call_key gave a tuple holding a list or array, whose lookup raised TypeError, caught in two places;
    now such a call has no key (it is validated, then planned under its checked values)."""
    from fa_variants import api
    q = torch.randn(1, 3, 2, 8)
    args = dict(causal=False, softmax_scale=None, backend="reference") | kwargs
    assert api._call_key(q, q, q, **args) is None
    plain = api._call_key(q, q, q, causal=False, softmax_scale=0.5, backend="reference")
    assert hash(plain) is not None and plain != api._call_key(q, q, q, causal=False, softmax_scale=True,
                                                              backend="reference")


def test_a_numpy_scale_is_planned_as_its_float():
    np = __import__("numpy")
    dispatch.PLANS.clear()
    q = torch.randn(1, 3, 2, 8)
    out = fa_variants.attention(q, q, q, softmax_scale=np.float32(0.5), backend="reference")
    assert [key[23] for key in dispatch.PLANS] == [0.5] and [key[22] for key in dispatch.PLANS] == [float]
    torch.testing.assert_close(out, fa_variants.attention(q, q, q, softmax_scale=0.5, backend="reference"))


def test_fa3_short_persistent_switch_replans(monkeypatch):
    """fa3.SHORT_MAX_SEQLEN_K and SHORT_MAX_SEQLEN_K_CAUSAL (FA_VARIANTS_SHORT_PERSISTENT(_CAUSAL)) are launcher
    switches: a launcher planned with the persistent grid (short seqlen_k at D 128, causal) launches the default grid
    after either goes to 0 and the persistent one again after it comes back; the persistent launch gets the grid's CTA
    count last (132 on the CPU)."""
    from fa_variants.hopper import fa3

    monkeypatch.setattr(fa3, "_auto_splits", lambda ctas, n_blocks, index, min_tiles=None, per_sm=1: 1)
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K", 3072)  # the defaults, whatever the environment says
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K_CAUSAL", 1536)
    monkeypatch.setattr(fa3, "SHORT_BALANCED", False)  # the static schedule (balanced: one more argument, its table)
    looked, launched = [], []
    compiled = cache.Compiled(None, lambda *args: launched.append(args), 0.0, None, 0)
    q = torch.randn(2, 130, 40, 128, dtype=F16)  # 2 x 40 x 2 = 160 query tiles: more than the 132 SMs
    k = v = torch.randn(2, 300, 40, 128, dtype=F16)
    with mock.patch.object(launch.cache, "get_compiled", lambda cfg, build: looked.append(cfg.config) or compiled), \
            mock.patch.object(launch.interop, "device_arch", lambda d=None: "sm_90a"):
        launch._KERNELS.clear()
        run = launch.launcher(fa3.VARIANT, q, k, v, causal=True, softmax_scale=0.1)
        for name, limit in (("SHORT_MAX_SEQLEN_K", 3072), ("SHORT_MAX_SEQLEN_K", 0), ("SHORT_MAX_SEQLEN_K", 3072),
                            ("SHORT_MAX_SEQLEN_K_CAUSAL", 0), ("SHORT_MAX_SEQLEN_K_CAUSAL", 1536)):
            monkeypatch.setattr(fa3, name, limit)
            run(q, k, v)
        launch._KERNELS.clear()
    short, default = fa3._SHORT_CONFIGS[128, True], fa3.DEFAULT_CONFIGS[128]
    assert looked == [short, default]  # one lookup per config: later calls reuse the first two plans
    assert [len(args) for args in launched] == [8, 7, 8, 7, 8] and launched[0][-1] == 132


def test_nan_allocations_reach_the_launchers_outputs(stub_launcher, nan_allocations):
    """conftest's nan_allocations (the GPU tests' poisoning: test_fa3_gpu, test_decode_gpu) reaches the O and LSE
    the launcher allocates per call, so an element a kernel never writes is NaN; the stub kernel writes nothing."""
    make, launched = stub_launcher
    q = torch.randn(2, 3, 4, 16, dtype=F16)
    k = v = torch.randn(2, 5, 2, 16, dtype=F16)
    run = make(q, k, v)
    with nan_allocations():
        out, lse = run(q, k, v)
    assert launched[-1][3] is out and launched[-1][4] is lse
    assert torch.isnan(out).all() and torch.isnan(lse).all()


@pytest.mark.parametrize("grad_mode", [False, True])
def test_nan_allocations_keep_leaves_that_require_grad(nan_allocations, grad_mode):
    """An allocation with requires_grad=True inside nan_allocations is poisoned and stays a leaf that requires grad,
    in grad mode too (session 27: torch.compile's inductor allocates such tensors while it sets up its patterns, and the
    poisoning's in-place fill failed there in grad mode, on the GPU host only, where that set-up runs)."""
    with torch.set_grad_enabled(grad_mode), nan_allocations():
        made = [torch.empty((4, 4), requires_grad=True), torch.empty_like(torch.ones(3), requires_grad=True),
                torch.ones(2).new_empty((5,), requires_grad=True)]
    for t in made:
        assert t.requires_grad and t.is_leaf and torch.isnan(t).all()


def test_workspace_buffers_are_per_thread(monkeypatch):
    """Two Python threads on one stream never share split scratch (common.workspace's rule): a split call is two
    launches (split kernel, merge), and another thread's split kernel queued between them would overwrite the
    partials the merge reads (session 33). Each thread has its own slots (thread-local: they go with the thread);
    clear() empties every thread's at its next call."""
    import threading

    from fa_variants.common import workspace

    workspace.clear()
    monkeypatch.setattr(workspace, "CACHE_CPU", True)
    cpu = torch.device("cpu")
    partials = workspace.function(cpu, 6, 0, ("test-threads", 6), lambda buf, _: buf[:6])
    mine = partials()
    seen = {}

    def other():
        seen["first"], seen["again"], seen["slots"] = partials(), partials(), dict(workspace._slots())

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    assert partials() is mine and seen["first"] is seen["again"] and seen["first"].data_ptr() != mine.data_ptr()
    assert list(seen["slots"]) == [workspace.slot_key(cpu)] and seen["slots"] != workspace._slots()
    workspace.clear()
    assert workspace._slots() == {} and partials() is not mine


@pytest.mark.parametrize("scale, planned", [(1e38, "unsplit"), (-2e38, "unsplit"), (0.5, None), (2.0 ** 64, None)])
def test_launcher_plans_through_the_variants_scale_config(scale, planned):
    """common.launch.launcher passes the caller's config through ``Variant.scale_config`` with |softmax_scale| (the
    kernels' scale) before ``problem_config``: fa3 and fa2 fix a config without a split there when the scale is above
    ``split.MAX_SPLIT_SCALE`` (session 33: partial LSEs of +inf merged to NaN), for every caller of the launcher
    (fa_variants.attention, fa3.run, fa2.run, dispatch backends)."""
    from fa_variants.common import split, workspace

    seen = []

    def scale_config(config, q, k, causal, kernel_scale):
        seen.append(("scale", config, kernel_scale))
        return "unsplit" if config is None and not split.splits_allowed(kernel_scale) else config

    def problem_config(config, q, k, causal):
        seen.append(("problem", config))
        return config

    variant = Variant("stub", archs=("sm_90a",), dtypes=(F16,), head_dims=(16,), build=lambda cfg: None,
                      default_config=lambda arch, d, causal: None, scale_config=scale_config,
                      problem_config=problem_config)
    compiled = cache.Compiled(None, lambda *args: None, 0.0, None, 0)
    q = torch.randn(2, 1, 4, 16, dtype=F16)
    k = v = torch.randn(2, 5, 2, 16, dtype=F16)
    with mock.patch.object(launch.cache, "get_compiled", lambda cfg, build: compiled), \
            mock.patch.object(launch.interop, "device_arch", lambda d=None: "sm_90a"):
        launch._KERNELS.clear()
        launch.launcher(variant, q, k, v, causal=True, softmax_scale=scale)
        launch._KERNELS.clear()
    workspace.clear()
    assert seen == [("scale", None, abs(scale)), ("problem", planned)]


def test_sdpa_layout_calls_take_the_plans(fake_fa3, monkeypatch):
    """``scaled_dot_product_attention`` (the SDPA layout) runs a kind seen before by its plan too, after only its own
    cheap rules (no mask, no dropout, enable_gqa where the heads differ, is_causal only with seqlen_q == seqlen_k):
    no validation on the second call, the same output (and LSE) as ``attention`` on the transposed views; each of
    its refusals still raises on a kind that ``attention`` planned."""
    from fa_variants import api

    checked = []
    real_check = api._check_inputs
    monkeypatch.setattr(api, "_check_inputs", lambda *a, **kw: checked.append(1) or real_check(*a, **kw))
    q, k, v = qkv(nq=7, nk=7)
    query, key, value = (t.transpose(1, 2) for t in (q, k, v))
    want, want_lse = fa_variants.attention(q, k, v, causal=True, return_lse=True)
    for return_lse in (False, True, False):
        checked.clear()
        got = fa_variants.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True,
                                                       return_lse=return_lse)
        assert checked == []
        out, lse = got if return_lse else (got, want_lse)
        assert out.shape == query.shape and torch.equal(out.transpose(1, 2), want) and torch.equal(lse, want_lse)
    q2, k2, v2 = qkv(nq=5, nk=7)
    fa_variants.attention(q2, k2, v2, causal=True)  # planned by attention: bottom-right causal, GQA
    views = [t.transpose(1, 2) for t in (q2, k2, v2)]
    with pytest.raises(ValueError, match="is_causal with seqlen_q 5 != seqlen_k 7"):
        fa_variants.scaled_dot_product_attention(*views, is_causal=True, enable_gqa=True)
    fa_variants.attention(q2, k2, v2)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        fa_variants.scaled_dot_product_attention(*views)
    with pytest.raises(ValueError, match="attn_mask: fa_variants cannot express"):  # an upper triangle
        fa_variants.scaled_dot_product_attention(*views, attn_mask=torch.ones(5, 7, dtype=torch.bool).triu(),
                                                 enable_gqa=True)
    with pytest.raises(ValueError, match="dropout_p must be 0.0"):
        fa_variants.scaled_dot_product_attention(*views, dropout_p=0.1, enable_gqa=True)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        fa_variants.scaled_dot_product_attention(*views, is_causal=1, enable_gqa=True)
