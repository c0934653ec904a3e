"""fa3-fp8 on fa3's persistent grid, CPU checks (session 22): the configs it accepts (O's own shared-memory buffer
where it fits), the default's choice of the balanced grid (``fa3_fp8.call_config``), the launch's extra arguments
(the CTA count and the tile table made with fa3-fp8's L2 section), and the compiled kernels (sm_90a, no GPU). The
GPU proof is tests/test_fa3_fp8_persistent_gpu.py.
"""
import dataclasses

import pytest
import torch

fa3_fp8 = pytest.importorskip("fa_variants.hopper.fa3_fp8")
from fa_variants.common import cubin  # noqa: E402
from fa_variants.common.config import smem_capacity  # noqa: E402
from fa_variants.hopper import fa3  # noqa: E402

E4M3 = torch.float8_e4m3fn


def _persistent(head_dim, **change):
    return dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[head_dim], persistent=True, **change)


@pytest.mark.parametrize("head_dim, separate", [(64, True), (128, True), (256, False)])
def test_configs_fit_with_o_buffer_where_it_fits(head_dim, separate):
    """O (16-bit) gets its own buffer beside Q's (sized for O) at 64 / 128; at 256 two O tiles and the K/V ring do not
    fit, so the next tile's Q waits for O's store (fa3's rule, counted in e4m3 K/V bytes)."""
    for cfg in (_persistent(head_dim), _persistent(head_dim, balanced=True)):
        cfg.check(head_dim)
        assert cfg.separate_o(head_dim) is separate
        assert cfg.smem_bytes(head_dim) <= smem_capacity("sm_90a")
    base = fa3_fp8.DEFAULT_CONFIGS[head_dim]
    assert not base.separate_o(head_dim)
    o = base.tile_m * head_dim * 2
    assert _persistent(head_dim).smem_bytes(head_dim) == base.smem_bytes(head_dim) + (o if separate else 0)


def _q8(batch, seqlen, heads, head_dim=128):
    return torch.zeros(batch, seqlen, heads, head_dim, dtype=E4M3)


def test_call_config_takes_the_persistent_grid_where_named(monkeypatch):
    monkeypatch.setattr(fa3, "_sm_count", lambda q: 132)
    monkeypatch.setattr(fa3, "_TABLES", {})
    monkeypatch.setattr(fa3_fp8, "PERSISTENT", True)
    default = fa3_fp8.DEFAULT_CONFIGS[128]
    balanced = dataclasses.replace(default, persistent=True, balanced=True)
    static = dataclasses.replace(default, persistent=True)
    q, k = _q8(4, 4096, 16), _q8(4, 4096, 16)
    for table in ("BALANCED_MAX_SEQLEN_K", "PERSISTENT_MAX_SEQLEN_K"):
        monkeypatch.setattr(fa3_fp8, table, {})
    assert fa3_fp8.call_config(q, k, True) is default and fa3_fp8.call_config(q, k, False) is default  # none named
    monkeypatch.setattr(fa3_fp8, "BALANCED_MAX_SEQLEN_K", {128: 4096})
    assert fa3_fp8.call_config(q, k, True) == balanced
    assert fa3_fp8.call_config(q, k, False) is default  # the non-causal table does not name 128
    monkeypatch.setattr(fa3_fp8, "PERSISTENT_MAX_SEQLEN_K", {128: 4096})
    assert fa3_fp8.call_config(q, k, False) == static  # not causal: equal costs, the static order
    assert fa3_fp8.call_config(_q8(64, 128, 16), _q8(64, 4096, 16), False) == static  # one query tile a head: fine
    assert fa3_fp8.call_config(_q8(64, 128, 16), _q8(64, 4096, 16), True) is default  # causal: nothing to deal
    for causal in (False, True):
        assert fa3_fp8.call_config(q, _q8(4, 4097, 16), causal) is default  # past the limit
        assert fa3_fp8.call_config(_q8(1, 4096, 1), _q8(1, 4096, 1), causal) is default  # 32 tiles <= 132 SMs
        assert fa3_fp8.call_config(q, _q8(4, 0, 16), causal) is default  # no key
    mine = dataclasses.replace(default, tile_n=128)
    assert fa3_fp8.call_config(q, k, True, mine) is mine  # an explicit config wins
    monkeypatch.setattr(fa3_fp8, "PERSISTENT", False)
    assert fa3_fp8.call_config(q, k, True) is default and fa3_fp8.call_config(q, k, False) is default
    monkeypatch.setattr(fa3_fp8, "PERSISTENT", "all")  # FA_VARIANTS_FP8_PERSISTENT=all: any head dim and seqlen_k
    for table in ("BALANCED_MAX_SEQLEN_K", "PERSISTENT_MAX_SEQLEN_K"):
        monkeypatch.setattr(fa3_fp8, table, {})
    assert fa3_fp8.call_config(q, _q8(4, 1 << 20, 16), True) == balanced
    assert fa3_fp8.call_config(q, _q8(4, 1 << 20, 16), False) == static


def test_call_config_in_graph_capture_keeps_a_made_table(monkeypatch):
    """Inside CUDA graph capture a causal call takes the balanced grid only when its table was made before (a host copy
    cannot be captured): else the default grid."""
    from fa_variants.common import workspace

    monkeypatch.setattr(fa3, "_sm_count", lambda q: 132)
    monkeypatch.setattr(fa3, "_TABLES", {})
    monkeypatch.setattr(fa3_fp8, "PERSISTENT", True)
    monkeypatch.setattr(fa3_fp8, "BALANCED_MAX_SEQLEN_K", {128: 4096})
    monkeypatch.setattr(workspace, "capturing", lambda device: True)
    q, k = _q8(4, 4096, 16), _q8(4, 4096, 16)
    assert fa3_fp8.call_config(q, k, True) is fa3_fp8.DEFAULT_CONFIGS[128]
    monkeypatch.setattr(workspace, "capturing", lambda device: False)
    picked = fa3_fp8.call_config(q, k, True)
    fa3_fp8._launch_tail(picked, q, k, True, fa3.l2_section_heads(4096, 128, elem_bytes=1))  # the table is made
    monkeypatch.setattr(workspace, "capturing", lambda device: True)
    assert fa3_fp8.call_config(q, k, True) == picked


def test_defaults_name_the_measured_head_dims():
    """Session 22's flip (bench/NOTES.md): the balanced grid for causal calls up to 4k keys at 64 and 2k at 128, the
    static persistent grid for non-causal ones up to 2k at 64 and 4k at 128; not at 256 (half speed there)."""
    assert fa3_fp8.BALANCED_MAX_SEQLEN_K == {64: 4096, 128: 2048}
    assert fa3_fp8.PERSISTENT_MAX_SEQLEN_K == {64: 2048, 128: 4096}


def test_warmup_compiles_the_persistent_configs_calls_may_take(monkeypatch):
    """``fa-variants warmup`` plans, beside each default, the persistent config ``call_config`` may give a call of that
    head dim and causal mode (none at 256, none with the switch off, every head dim with "all"), and that config is
    the one call_config returns (the compile cache's key)."""
    from fa_variants.commands import warmup

    monkeypatch.setattr(fa3_fp8, "PERSISTENT", True)

    def planned():
        configs, notes = warmup.plan(["fa3-fp8"], "sm_90a", ["e4m3"], [64, 128, 256], (False, True))
        assert not notes
        return [(c.head_dim, c.causal, c.config.persistent, c.config.balanced) for c in configs]

    assert planned() == [(64, False, False, False), (64, False, True, False), (64, True, False, False),
                         (64, True, True, True), (128, False, False, False), (128, False, True, False),
                         (128, True, False, False), (128, True, True, True), (256, False, False, False),
                         (256, True, False, False)]
    monkeypatch.setattr(fa3, "_sm_count", lambda q: 132)
    monkeypatch.setattr(fa3, "_TABLES", {})
    q = _q8(4, 2048, 16)
    assert fa3_fp8.call_config(q, q, True) is fa3_fp8._warm_configs("sm_90a", 128, True)[0]
    monkeypatch.setattr(fa3_fp8, "PERSISTENT", False)
    assert all(not persistent for *_, persistent, _ in planned())
    monkeypatch.setattr(fa3_fp8, "PERSISTENT", "all")
    assert [d for d, _, persistent, _ in planned() if persistent] == [64, 64, 128, 128, 256, 256]


def test_launch_tail_counts_ctas_and_makes_the_fp8_table(monkeypatch):
    """The persistent kernel gets the SM count after l2_heads; the balanced one also its tile table, made with the
    L2 section fa3-fp8 launches with (e4m3 K/V: twice the heads of bf16's), so it is not bf16 fa3's table."""
    monkeypatch.setattr(fa3, "_sm_count", lambda q: 7)
    monkeypatch.setattr(fa3, "_TABLES", {})
    q, k = _q8(2, 300, 4), _q8(2, 300, 2)
    assert fa3_fp8._launch_tail(fa3_fp8.DEFAULT_CONFIGS[128], q, k, True, 8) == ()
    assert fa3_fp8._launch_tail(_persistent(128), q, k, True, 8) == (7,)
    balanced = _persistent(128, balanced=True)
    ctas, table = fa3_fp8._launch_tail(balanced, q, k, True, 8)
    assert ctas == 7 and sorted(table.tolist()) == list(range(3 * 4 * 2))
    assert fa3_fp8._launch_tail(balanced, q, k, True, 8)[1] is table  # made once per shape and section
    assert fa3.balanced_table(balanced, q, k, True, 4) is not table  # the section is part of the key


@pytest.mark.compile
@pytest.mark.parametrize("head_dim, causal, change, spill", [
    (128, True, dict(balanced=True), 16), (64, False, {}, 0)], ids=["d128-causal-balanced", "d64-full-persistent"])
def test_persistent_kernels_compile(head_dim, causal, change, spill):
    """QGMMA for both GEMMs, TMA loads and stores, setmaxnreg; spills within the bound measured in session 22 (the
    causal kernel keeps three loop-invariant shared-memory addresses across the tile loop in local memory: stored once
    per CTA, reloaded once per tile, none inside the K/V loop)."""
    from fa_variants import registry

    cfg = _persistent(head_dim, **change)
    c = registry.compiled(registry.static_config("fa3-fp8", "sm_90a", "e4m3", head_dim, causal, cfg))
    r = cubin.count_sass(cubin.sass_of(c.cubin))
    assert r["QGMMA"] > 0 and r["HGMMA"] == 0 and r["UTMALDG"] > 0 and r["UTMASTG"] > 0 and r["USETMAXREG"] >= 2, r
    assert r["STL"] * 4 <= spill and r["LDL"] <= 8, r
