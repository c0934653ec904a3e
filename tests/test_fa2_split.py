"""fa2's split-KV plan on the CPU (no GPU, no compile): the split counts the heuristic gives, the config `auto`
and ``attention(num_splits=)`` choose, the partials' workspace and their merge back into O and LSE.

The kernel itself: tests/test_fa2_split_gpu.py (GPU) and tests/test_fa2_split_compile.py (compile-only).
"""
import dataclasses
import math
from unittest import mock

import pytest
import torch

from fa_variants import reference
from fa_variants.ampere import fa2
from fa_variants.common import split, split_combine
from fa_variants.common.config import Sm80Config

H200 = ("sm_90a", 132)
A100 = ("sm_80", 108)


def splits(batch, seqlen_q, heads, seqlen_k, head_dim=128, gpu=H200, causal=True, config=None):
    config = config or fa2._split_config(gpu[0], head_dim)
    return fa2.splits_for_shape(config, batch, seqlen_q, heads, seqlen_k, head_dim, *gpu)


def test_ctas_per_sm_follows_shared_memory():
    d128, d256 = fa2.default_config("sm_80", 128, False), fa2.default_config("sm_80", 256, False)
    assert fa2.ctas_per_sm(d128, "sm_80", 128) == 2       # 64 KiB of 163 KiB: the register file's two
    assert fa2.ctas_per_sm(d256, "sm_80", 256) == 1       # s1, 96 KiB (+ 1 KiB) of 163 KiB: one
    assert fa2.ctas_per_sm(fa2.default_config("sm_90a", 256, False), "sm_90a", 256) == 2  # s1 on sm90: two
    assert fa2.ctas_per_sm(fa2.D256_CONFIGS["s2"], "sm_90a", 256) == 1                     # 160 KiB: one
    assert fa2.ctas_per_sm(fa2.default_config("sm_86", 256, False), "sm_86", 256) == 1
    assert fa2.ctas_per_sm(fa2.default_config("sm_90a", 64, False), "sm_90a", 64) == 2
    assert fa2.ctas_per_sm(fa2._split_config("sm_80", 128), "sm_80", 128) == 2   # 64 x 64 tiles: 80 KiB
    assert fa2.ctas_per_sm(fa2._split_config("sm_80", 256), "sm_80", 256) == 1


def test_split_tiles():
    assert fa2._split_config("sm_90a", 128) == Sm80Config(64, 64, num_splits=0)
    assert fa2._split_config("sm_86", 256).tile_n == 32                          # 99 KiB of shared memory
    assert fa2.split_config("sm_80", 96, 3).num_splits == 3
    assert fa2.split_config("sm_80", 96, 1) == fa2.default_config("sm_80", 96, False)
    with pytest.raises(ValueError, match="head_dim 80"):
        fa2.split_config("sm_80", 80)


def test_decode_shapes_split_and_full_grids_do_not():
    # B1, 32 heads, Nq 1, Nk 4k, D128: 32 CTAs of 64 K/V tiles (tile_n 64) on 264 slots -> 8 splits
    assert splits(1, 1, 32, 4096) == 8 == split.num_splits_heuristic(32, 64, 2 * 132)
    assert splits(1, 1, 32, 32768) > 1 and splits(4, 1, 32, 4096, gpu=A100) > 1
    assert splits(8, 1, 32, 4096) == 1       # 256 CTAs already fill 264 slots (H200)
    assert splits(8, 1, 32, 4096, gpu=A100) == 1  # and more than 0.8 of 216 (A100)
    assert splits(64, 1, 32, 1024) == 1
    assert splits(1, 4096, 32, 4096) == 1    # prefill: 1024 query tiles x heads
    assert splits(1, 1, 32, 64) == 1         # two K/V tiles: nothing to share
    for b, nk in ((1, 1024), (1, 4096), (1, 32768), (8, 32768)):
        assert 1 <= splits(b, 1, 32, nk) <= split.MAX_SPLITS


def test_explicit_count_wins():
    config = dataclasses.replace(fa2.default_config("sm_90a", 128, False), num_splits=5)
    assert splits(64, 4096, 32, 4096, config=config) == 5


def test_config_checks_num_splits():
    with pytest.raises(ValueError, match="num_splits"):
        Sm80Config(128, 32, num_splits=-1).check("sm_80", 128)
    assert Sm80Config(128, 32, num_splits=0).check("sm_80", 128).num_splits == 0
    from fa_variants.ampere import fa1

    with pytest.raises(ValueError, match="split-KV"):
        fa1.VARIANT.config_for("sm_80", 128, False, Sm80Config(64, 128, 4, 2, 2, num_splits=2))


@pytest.fixture
def on_h200(monkeypatch):
    """fa2's view of the GPU: an H200 (sm_90a, 132 SMs), whatever tensors' device."""
    monkeypatch.setattr(fa2, "_gpu", lambda device: H200)
    monkeypatch.setattr(fa2, "SPLIT_KV_ENABLED", True)
    monkeypatch.setattr(fa2, "PACK_GQA_ENABLED", False)
    fa2._cached_splits.cache_clear()
    yield
    fa2._cached_splits.cache_clear()


def qk(batch, seqlen_q, heads, seqlen_k, heads_kv=8, head_dim=128):
    return (torch.empty(batch, seqlen_q, heads, head_dim, device="meta", dtype=torch.bfloat16),
            torch.empty(batch, seqlen_k, heads_kv, head_dim, device="meta", dtype=torch.bfloat16))


def test_auto_switches_decode_to_the_split_config(on_h200, monkeypatch):
    q, k = qk(1, 1, 32, 4096)
    config = fa2._problem_config(None, q, k, True)
    assert config == fa2.SPLIT_CONFIGS[128]
    assert fa2.num_splits_for(config, q, k) == fa2.auto_num_splits(q, k, True) == 8
    assert fa2._problem_config(None, *qk(64, 1, 32, 4096), True) is None
    given = fa2.CONFIGS[128]
    assert fa2._problem_config(given, q, k, True) is given
    monkeypatch.setattr(fa2, "SPLIT_KV_ENABLED", False)
    assert fa2._problem_config(None, q, k, True) is None and fa2.auto_num_splits(q, k, True) == 1
    assert fa2.VARIANT.switches()[:3] == (False, False, False)


def test_decode_config_is_the_num_splits_option(on_h200):
    q, k = qk(1, 1, 32, 4096)
    assert fa2.decode_config(q, k, True, num_splits=3) == fa2.split_config("sm_90a", 128, 3)
    assert fa2.decode_config(q, k, True, num_splits=1) == fa2.default_config("sm_90a", 128, True)
    assert fa2.decode_config(q, k, True).num_splits == 0          # None: `auto`'s choice (split here)
    assert fa2.decode_config(*qk(64, 1, 32, 4096), True).num_splits == 1
    assert fa2.decode_config(q, k, True, pack_gqa=False).num_splits == 0
    packed = fa2.decode_config(q, k, True, pack_gqa=True)  # 8 CTAs of 4 rows: split further than unpacked
    assert packed.pack_gqa and packed.num_splits == 0 and packed.tile_m == 64
    assert fa2.num_splits_for(packed, q, k) == 32 == split.num_splits_heuristic(8, 64, 264)
    assert fa2.decode_config(q, k, True, pack_gqa=True, num_splits=1) == fa2.split_config("sm_90a", 128, 1, True)
    with pytest.raises(ValueError, match="pack_gqa=True: fa2 packs .* not seqlen_q=4"):
        fa2.decode_config(*qk(1, 4, 32, 4096), True, pack_gqa=True)
    with pytest.raises(ValueError, match="seqlen_q=4 is not 1"):
        fa2._check_problem(packed, *qk(1, 4, 32, 4096))


def test_auto_packs_only_when_switched_on(on_h200, monkeypatch):
    q, k = qk(1, 1, 32, 4096)
    monkeypatch.setattr(fa2, "PACK_GQA_ENABLED", False)                # FA_VARIANTS_FA2_PACK_GQA=0: off
    assert not fa2._problem_config(None, q, k, True).pack_gqa
    monkeypatch.setattr(fa2, "PACK_GQA_ENABLED", True)
    assert fa2._problem_config(None, q, k, True) == fa2.split_config("sm_90a", 128, 0, True)
    assert fa2.auto_num_splits(q, k, True) == 32
    full = qk(64, 1, 32, 4096)  # 512 packed CTAs: not split, still packed
    assert fa2._problem_config(None, *full, True) == fa2.split_config("sm_90a", 128, 1, True)
    assert fa2._problem_config(None, *qk(1, 4, 32, 4096), True).pack_gqa is False   # seqlen_q 4: not packed
    assert fa2._problem_config(None, *qk(64, 1, 8, 4096), True) is None             # MHA at B 64: neither
    assert len(fa2._warm_configs("sm_90a", 128, True)) == 3


def test_warmup_seqlens_k_plans_every_kernel_a_decode_call_launches(on_h200, monkeypatch):
    """`fa-variants warmup --seqlens-k` on fa2 plans the kernel `auto` runs at each decode shape, the one a call
    with seqlens_k runs (``lengths_config``) and the split merge kernel a split call launches after it."""
    from fa_variants import registry
    from fa_variants.commands import warmup

    monkeypatch.setattr(fa2, "PACK_GQA_ENABLED", True)
    for head_dim in (64, 128, 256):
        todo, notes = warmup.plan(["fa2"], "sm_90a", ["bf16"], [head_dim], [True], seqlens_k=True)
        assert not notes
        needed = set()
        for batch in (1, 8, 64):
            for seqlen_q in (1, 4, 16):
                for seqlen_k in (1023, 4096, 32768):
                    q, k = qk(batch, seqlen_q, 32, seqlen_k, head_dim=head_dim)
                    for cfg in (fa2._problem_config(None, q, k, True), fa2.lengths_config(q, k, True),
                                fa2.leftpad_config(q, k, True), fa2.windows_config(q, k, True)):
                        cfg = cfg or fa2.default_config("sm_90a", head_dim, True)
                        needed.add(registry.static_config("fa2", "sm_90a", "bf16", head_dim, True, cfg))
                        if cfg.num_splits != 1:  # fa2's merge: no pdl, the kernel MERGE_WARP names
                            needed.add(split_combine._merge_static_config("sm_90a", "bf16", head_dim, False,
                                                                          bool(split_combine.MERGE_WARP)))
        assert any(c.variant == "split-merge" for c in needed) and any(
            c.variant == "fa2" and c.config.seqlens_k for c in needed)
        missing = needed - set(todo)
        assert not missing, [(c.variant, c.config) for c in missing]


def test_narrow_decode_switch(on_h200, monkeypatch):
    """FA_VARIANTS_FA2_NARROW_DECODE: a few-row query the heuristic does not split (B 8 / 64, Nq 4 / 16: the grid is
    full, 256+ CTAs on 264 slots) runs unsplit in 64 x 64 tiles; split or packed calls, prefill and the switch off
    keep their configs."""
    monkeypatch.setattr(fa2, "PACK_GQA_ENABLED", True)
    for b, nq in ((8, 4), (8, 16), (64, 4), (64, 16)):
        assert splits(b, nq, 32, 4096) == 1 and fa2._problem_config(None, *qk(b, nq, 32, 4096), True) is None
    monkeypatch.setattr(fa2, "NARROW_DECODE", True)
    narrow = fa2.narrow_config("sm_90a", 128)
    assert narrow == Sm80Config(64, 64, num_splits=1)
    for b, nq in ((8, 4), (8, 16), (64, 4), (64, 16), (64, 64)):
        q, k = qk(b, nq, 32, 4096)
        assert fa2._problem_config(None, q, k, True) == narrow and fa2.auto_num_splits(q, k, True) == 1
    assert fa2._problem_config(None, *qk(8, 65, 32, 4096), True) is None          # more rows than one 64-row tile
    assert fa2._problem_config(None, *qk(1, 4, 32, 4096), True) == fa2.SPLIT_CONFIGS[128]  # split: as before
    assert fa2._problem_config(None, *qk(64, 1, 32, 4096), True).pack_gqa          # packed: as before
    assert narrow in fa2._warm_configs("sm_90a", 128, True)
    assert fa2.VARIANT.switches()[2] is True  # (split, pack, narrow, D 256 tiles)


def test_grid_limit_counts_the_splits():
    config = dataclasses.replace(fa2.CONFIGS[64], num_splits=64)
    q, k = qk(1, 2**31 // 64 * 128, 1, 8, 1, 64)
    with pytest.raises(ValueError, match="2\\^31"):
        fa2._check_problem(config, q, k)
    fa2._check_problem(dataclasses.replace(config, num_splits=1), q, k)


def attention_of_range(q, k, v, scale, causal, lo, hi):
    """(O, LSE) of attention over keys [lo, hi) only, float64, bottom-right causal against the whole Nk: what
    split s of the kernel writes for tiles [lo, hi); a row that sees none of them gets LSE -inf and O NaN
    (the kernel writes 0 there; the merge must not read it either way)."""
    nq, nk = q.shape[1], k.shape[1]
    g = q.shape[2] // k.shape[2]
    kk, vv = (t.double().repeat_interleave(g, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), kk) * scale
    keys = torch.arange(nk)
    visible = (keys >= lo) & (keys < hi)
    if causal:
        visible = visible & (keys[None, :] <= torch.arange(nq)[:, None] + nk - nq)
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), vv)
    return o.float(), lse.float()


@pytest.mark.parametrize("seqlen_q, seqlen_k, num_splits, causal, pack", [
    (1, 113, 3, True, False), (3, 1023, 7, True, False), (1, 64, 5, False, False), (5, 3, 4, True, False),
    (1, 1, 2, False, False), (1, 1023, 7, True, True), (1, 3, 4, True, True)])
def test_plan_workspace_and_merge(rng_seed, monkeypatch, seqlen_q, seqlen_k, num_splits, causal, pack):
    """_plan_call's workspace (O partials (S*B, Nq, H, D), LSE partials (S*B, H, Nq), fp32, split s of batch b
    at s * B + b), filled as the kernel fills it (tile ranges ``split.split_ranges``, empty and fully masked
    splits included), merges to float64 attention; the merge: ``split.merge`` standing in for the kernel.
    Packed GQA: the kernel's arguments are ``pack_gqa.views`` of q and of the same workspace."""
    batch, heads, heads_kv, d = 2, 4, 2, 64
    config = fa2.split_config("sm_80", d, num_splits, pack)
    tile_n = config.tile_n

    def torch_merge(device, dtype, head_dim, pdl=None):
        def merge(o_parts, lse_parts, out, lse):
            split.merge(o_parts.unflatten(0, (-1, out.shape[0])), lse_parts.unflatten(0, (-1, out.shape[0])), out, lse)
        return merge

    monkeypatch.setattr(split_combine, "merge_function", torch_merge)
    g = torch.Generator().manual_seed(rng_seed)
    q = torch.randn(batch, seqlen_q, heads, d, generator=g)
    k, v = (torch.randn(batch, seqlen_k, heads_kv, d, generator=g) for _ in range(2))
    scale = d ** -0.5
    prepare, finish = fa2._plan_call(config, q, k, v, scale, False)
    out = torch.full((batch, seqlen_q, heads, d), math.nan)
    lse = torch.full((batch, heads, seqlen_q), math.nan)
    args = prepare(q, k, v, out, lse)
    assert args[1:3] == (k, v) and args[5] == scale and len(args) == 6
    o_parts, lse_parts = args[3], args[4]
    if pack:  # (B, G, Hkv, D) rows: row g of KV head j is query head j G + g
        group = heads // heads_kv
        assert args[0].shape == (batch, group, heads_kv, d) and o_parts.shape == (num_splits * batch, group, heads_kv, d)
        assert lse_parts.shape == (num_splits * batch, heads_kv, group)
        assert torch.equal(args[0][1, 1, 1], q[1, 0, 1 * group + 1])
        o_parts = o_parts.as_strided((num_splits * batch, 1, heads, d), (heads * d, heads * d, d, 1))
        lse_parts = lse_parts.as_strided((num_splits * batch, heads, 1), (heads, 1, 1))
    else:
        assert args[0] is q
    assert o_parts.shape == (num_splits * batch, seqlen_q, heads, d) and o_parts.dtype == torch.float32
    assert lse_parts.shape == (num_splits * batch, heads, seqlen_q) and lse_parts.dtype == torch.float32
    assert o_parts.is_contiguous() and lse_parts.is_contiguous()
    assert lse_parts.data_ptr() == o_parts.data_ptr() + o_parts.numel() * 4  # one workspace
    n_blocks = -(-seqlen_k // tile_n)
    for s, (lo, hi) in enumerate(split.split_ranges(n_blocks, num_splits)):
        o_s, lse_s = attention_of_range(q, k, v, scale, causal, lo * tile_n, min(hi * tile_n, seqlen_k))
        o_parts[s * batch:(s + 1) * batch] = o_s
        lse_parts[s * batch:(s + 1) * batch] = lse_s
    finish(args, out, lse)
    want, want_lse = reference.attention_reference(q.double(), k.double(), v.double(), causal=causal,
                                                   softmax_scale=scale)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=0)


def test_unsplit_plan_passes_out_and_lse():
    q, k = torch.randn(1, 3, 2, 64), torch.randn(1, 5, 2, 64)
    prepare, finish = fa2._plan_call(fa2.CONFIGS[64], q, k, k, 0.5, False)
    out, lse = torch.empty(1, 3, 2, 64), torch.empty(1, 2, 3)
    assert finish is None and prepare(q, k, k, out, lse) == (q, k, k, out, lse, 0.5)


@pytest.fixture
def cached_cpu_scratch(monkeypatch):
    """common.workspace caching CPU scratch as it caches one CUDA stream's (empty before and after)."""
    from fa_variants.common import workspace

    workspace.clear()
    monkeypatch.setattr(workspace, "CACHE_CPU", True)
    yield workspace
    workspace.clear()


def test_split_scratch_is_the_workspace_fa3_uses(cached_cpu_scratch, monkeypatch):
    """fa2's split partials come from common.workspace (split_combine.partials_scratch): no allocation per call,
    the same views call after call, and the very views fa3's plan of the same shape and split count gets (one
    scratch for both backends, no copy). The merge reads the views the kernel wrote."""
    fa3 = pytest.importorskip("fa_variants.hopper.fa3")
    merged = []
    monkeypatch.setattr(split_combine, "merge_function", lambda *a, **kw: lambda *args: merged.extend(args))
    q, k = torch.randn(2, 1, 32, 128), torch.randn(2, 999, 8, 128)
    out, lse = torch.empty(2, 1, 32, 128), torch.empty(2, 32, 1)
    prepare, finish = fa2._plan_call(fa2.split_config("sm_90a", 128, 5, pack=True), q, k, k, 0.1, False)
    first = prepare(q, k, k, out, lse)
    with mock.patch.object(torch, "empty", side_effect=AssertionError("allocated per call")):
        second = prepare(q, k, k, out, lse)
    assert second[3] is first[3] and second[4] is first[4]
    assert second[0].data_ptr() == q.data_ptr() and second[0].shape == (2, 4, 8, 128)
    assert first[3].shape == (10, 4, 8, 128) and first[4].shape == (10, 8, 4)  # packed views of (5 x 2) batches
    finish(second, out, lse)
    o_parts, lse_parts, merged_out, merged_lse = merged
    assert merged_out is out and merged_lse is lse
    assert o_parts.shape == (10, 1, 32, 128) and o_parts.is_contiguous() and lse_parts.shape == (10, 32, 1)
    assert o_parts.data_ptr() == first[3].data_ptr() and lse_parts.data_ptr() == first[4].data_ptr()
    kernel_args = []
    merged.clear()
    prepare.launch_with(lambda *args: kernel_args.extend(args))(q, k, k, out, lse)  # what common.launch runs
    assert len(kernel_args) == 6 and kernel_args[3] is first[3] and kernel_args[4] is first[4]
    assert kernel_args[0].shape == second[0].shape and kernel_args[0].stride() == second[0].stride()
    assert kernel_args[5] == 0.1 and merged[0] is o_parts and merged[1] is lse_parts and merged[2] is out
    fa3_prepare, _ = fa3._plan_call(dataclasses.replace(fa3._PACKED_SPLIT_CONFIGS[128], num_splits=5),
                                    q.bfloat16(), k.bfloat16(), k.bfloat16(), 0.1, False)
    fa3_args = fa3_prepare(q.bfloat16(), k.bfloat16(), k.bfloat16(), out, lse)
    assert fa3_args[3] is first[3] and fa3_args[4] is first[4]


def test_split_scratch_under_capture_is_fresh_per_call(cached_cpu_scratch, monkeypatch):
    """A call captured into a CUDA graph gets its own partials (the graph's pool), never the eager buffer."""
    monkeypatch.setattr(split_combine, "merge_function", lambda *a, **kw: None)
    q, k = torch.randn(1, 1, 16, 64), torch.randn(1, 700, 4, 64)
    out, lse = torch.empty(1, 1, 16, 64), torch.empty(1, 16, 1)
    prepare, _ = fa2._plan_call(fa2.split_config("sm_90a", 64, 3), q, k, k, 0.1, False)
    eager = prepare(q, k, k, out, lse)
    monkeypatch.setattr(cached_cpu_scratch, "capturing", lambda device: True)
    captured = [prepare(q, k, k, out, lse) for _ in range(2)]
    pointers = {eager[3].data_ptr()} | {a[3].data_ptr() for a in captured}
    assert len(pointers) == 3
    assert all(a[3].shape == (3, 1, 16, 64) and a[4].shape == (3, 16, 1) for a in captured)


def test_unsplit_packed_plan_passes_packed_views():
    """Packed GQA without a split: q (any strides), out and LSE as common.pack_gqa.views would give them (the
    geometry worked out once, pack_gqa.call_geometry), the same memory."""
    from fa_variants.common import pack_gqa

    q = torch.randn(2, 1, 16, 64)[:, :, ::2]  # strides (1024, 1024, 128, 1)
    k = torch.randn(2, 5, 2, 64)
    prepare, finish = fa2._plan_call(fa2.split_config("sm_80", 64, 1, pack=True), q, k, k, 0.5, False)
    out, lse = torch.empty(2, 1, 8, 64), torch.empty(2, 8, 1)
    args = prepare(q, k, k, out, lse)
    assert finish is None and len(args) == 6 and args[1] is k and args[2] is k and args[5] == 0.5
    for got, want in zip((args[0], args[3], args[4]), pack_gqa.views(q, out, lse, 2)):
        assert got.shape == want.shape and got.stride() == want.stride() and got.data_ptr() == want.data_ptr()
    assert args[0].shape == (2, 4, 2, 64) and args[0].stride() == (1024, 128, 512, 1)
