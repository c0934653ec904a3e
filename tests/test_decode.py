"""Decode dispatch on the CPU (no GPU): when fa3 splits K/V, with which count, and what `config=` forces."""
import dataclasses

import pytest
import torch

from fa_variants.common import env, split

fa3 = pytest.importorskip("fa_variants.hopper.fa3")


@pytest.fixture
def h200(monkeypatch):
    """132 SMs, whatever this machine has (the heuristic's cache is emptied around the test)."""
    monkeypatch.setattr(split, "sm_count", lambda index: 132)
    fa3._auto_splits.cache_clear()
    yield
    fa3._auto_splits.cache_clear()


def _unsplit(config) -> bool:
    """The default config or a packed-GQA one (seqlen_q = 1), without split-KV."""
    return config is None or config.num_splits == 1


def _qk(batch, seqlen_q, heads, heads_kv, seqlen_k, head_dim=128):
    return (torch.empty(batch, seqlen_q, heads, head_dim, device="meta"),
            torch.empty(batch, seqlen_k, heads_kv, head_dim, device="meta"))


def test_switch_off_auto_never_splits_but_a_config_does(h200, monkeypatch):
    """fa3.SPLIT_KV_ENABLED False (FA_VARIANTS_SPLIT_KV=0): `auto` never splits (bitwise batch invariance,
    docs/edge_cases.md EC-19); an explicit config's num_splits still applies."""
    monkeypatch.setattr(fa3, "SPLIT_KV_ENABLED", False)
    q, k = _qk(1, 1, 32, 8, 32768)
    assert _unsplit(fa3._problem_config(None, q, k, True)) and fa3.auto_num_splits(q, k, True) == 1
    forced = dataclasses.replace(fa3.DEFAULT_CONFIGS[128], num_splits=4)
    assert fa3._problem_config(forced, q, k, True) is forced and fa3.num_splits_for(forced, q, k, True) == 4


def test_auto_split_count_follows_the_batch(h200, split_enabled):
    """Why EC-19 allows a tolerance when `auto` splits: one decode row is split, the same row in a batch
    that fills the GPU is not."""
    q, k = _qk(1, 1, 32, 8, 8192)
    assert fa3.auto_num_splits(q, k, False) > 1
    q, k = _qk(64, 1, 32, 8, 8192)
    assert fa3.auto_num_splits(q, k, False) == 1


@pytest.fixture
def split_enabled(monkeypatch):
    monkeypatch.setattr(fa3, "SPLIT_KV_ENABLED", True)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_auto_splits_decode_not_prefill(h200, split_enabled, head_dim):
    q, k = _qk(1, 1, 32, 8, 4096, head_dim)
    cfg = fa3._problem_config(None, q, k, True)
    assert cfg is not None and cfg.num_splits == 0 and cfg.tile_m == 64 and cfg.pack_gqa  # GQA at one query row
    q, k = _qk(1, 1, 32, 32, 4096, head_dim)  # MHA: not packed, the default tiles
    cfg = fa3._problem_config(None, q, k, True)
    assert cfg is not None and cfg.num_splits == 0 and cfg.tile_m == fa3.DEFAULT_CONFIGS[head_dim].tile_m
    q, k = _qk(1, 1, 32, 8, 4096, head_dim)
    assert fa3.num_splits_for(cfg, q, k, True) > 1
    q, k = _qk(8, 8192, 32, 8, 8192, head_dim)  # prefill fills the GPU: the tuned default, unsplit
    assert fa3._problem_config(None, q, k, False) is None and fa3.auto_num_splits(q, k, False) == 1
    q, k = _qk(8, 4096, 32, 8, 4096, head_dim)  # causal at 4k keys: unsplit, the persistent grid dealt by load
    assert fa3._problem_config(None, q, k, True) == dataclasses.replace(
        fa3.CAUSAL_CONFIGS[head_dim], persistent=True, balanced=True)  # causal: D 256 without convert_pairs
    q, k = _qk(64, 1, 64, 8, 128, head_dim)  # 64 x 64 CTAs (packed: 64 x 8): already full
    assert _unsplit(fa3._problem_config(None, q, k, False))


def test_config_overrides(h200, split_enabled):
    q, k = _qk(1, 1, 32, 8, 4096)
    forced = dataclasses.replace(fa3.DEFAULT_CONFIGS[128], num_splits=5)
    assert fa3._problem_config(forced, q, k, False) is forced and fa3.num_splits_for(forced, q, k, False) == 5
    off = fa3.DEFAULT_CONFIGS[128]
    assert fa3._problem_config(off, q, k, False) is off  # an explicit config is never switched to split
    with pytest.raises(ValueError, match="num_splits"):
        dataclasses.replace(off, num_splits=-1).check(128)


def test_decode_table_cases_and_dry_run(capsys):
    from fa_variants.bench import decode
    from fa_variants.cli import main

    full = decode.cases()
    assert len(full) == 3 * 4 * 3 * 2 * 2
    assert {c.seqlen_q for c in full} == {1, 4, 16} and {c.seqlen_k for c in full} == {1024, 4096, 32768, 131072}
    assert {(c.heads, c.heads_kv) for c in full} == {(32, 8), (64, 8)} and {c.batch for c in full} == {1, 8, 64}
    c = decode.DecodeCase(batch=8, seqlen_q=1, seqlen_k=32768, heads=32, heads_kv=8, head_dim=128)
    assert c.kv_bytes == 2 * 8 * 32768 * 8 * 128 * 2
    assert main(["bench", "--decode", "--dry-run"]) == 0
    assert "decode table: 144 cases" in capsys.readouterr().out
    rows = [dict(head_dim=128, heads=32, heads_kv=8, batch=1, seqlen_k=4096, seqlen_q=1, impl="x", gpu_us=7.0,
                 host_us=20.0, tbps=1.2, hbm_share=0.25, timer="graph"),
            dict(head_dim=128, heads=32, heads_kv=8, batch=1, seqlen_k=4096, seqlen_q=1, impl="y", error="E: boom")]
    text = decode.table(rows)
    assert "| 128 | 32:8 | 1 | 4096 | 1 | x | 7.0 | 20.0 | 1.20 | 25 | graph |" in text and "E: boom" in text


def test_auto_packs_gqa_at_one_query_row(h200, split_enabled, monkeypatch):
    """Packed GQA (Sm90Config.pack_gqa) for seqlen_q = 1 with GQA/MQA only; the split count then follows the
    packed CTAs (batch x heads_kv): B=32, 32:8 at 4k keys fills 132 SMs unpacked (1024 CTAs) and packed (256, under
    DUAL_MIN_CTAS: the base tiles)."""
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    q, k = _qk(32, 1, 32, 8, 4096)
    cfg = fa3._problem_config(None, q, k, True)
    assert cfg == fa3.first_row(dataclasses.replace(fa3._PACKED_CONFIGS[128], pdl=fa3.decode_pdl(1)), 4) and cfg.pack_gqa and cfg.num_splits == 1 and cfg.tile_m == 64
    assert cfg.first_row_only == fa3.DECODE_FIRST_ROW  # 4 query heads per KV head: the padding row's softmax skipped
    q, k = _qk(1, 1, 32, 8, 4096)  # 8 packed CTAs: split more than the 32 unpacked ones would be
    cfg = fa3._problem_config(None, q, k, True)
    assert cfg.pack_gqa and cfg.num_splits == 0
    packed_splits = fa3.num_splits_for(cfg, q, k, True)
    q, k = _qk(2, 1, 128, 1, 4096)  # group 128: two 64-row tiles per KV head, counted as such
    assert fa3.num_splits_for(fa3._PACKED_SPLIT_CONFIGS[128], q, k, True) == split.num_splits_heuristic(
        4, 32, 132, min_tiles=fa3.SPLIT_MIN_TILES)
    q, k = _qk(1, 1, 32, 8, 4096)
    assert packed_splits == split.num_splits_heuristic(8, 32, 132, min_tiles=fa3.SPLIT_MIN_TILES) > \
        fa3.num_splits_for(fa3._SPLIT_CONFIGS[128], q, k, True)
    for shape in ((1, 64, 32, 8, 4096), (8, 200, 64, 8, 1024), (1, 1, 32, 32, 4096), (1, 4, 40, 8, 4096)):
        q, k = _qk(*shape)  # Nq past the halving rule, MHA, a group (5) that does not pack at Nq > 1: not packed
        cfg = fa3._problem_config(None, q, k, True)
        assert cfg is None or not cfg.pack_gqa, (shape, cfg)
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", False)
    q, k = _qk(64, 1, 32, 8, 4096)
    assert fa3._problem_config(None, q, k, True) is None


def test_auto_packs_gqa_at_decode_query_rows(h200, split_enabled, monkeypatch):
    """seqlen_q > 1: packed with the group fixed in the config (pack_group) when the packed 64-row tiles at most
    halve the K/V reads (fa3.pack_helps): 32:8 and 64:8 up to Nq 32, MQA; the split count follows the packed
    CTAs; the packed config keeps causal (rows masked by their own position)."""
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    for shape, group in (((64, 16, 32, 8, 4096), 4), ((1, 4, 64, 8, 4096), 8), ((1, 5, 32, 1, 1024), 32),
                         ((8, 2, 8, 2, 131072), 4), ((1, 32, 32, 8, 4096), 4), ((1, 3, 256, 2, 4096), 128)):
        q, k = _qk(*shape)
        cfg = fa3._problem_config(None, q, k, True)
        assert cfg.pack_gqa and cfg.pack_group == group and cfg.tile_m == 64, (shape, cfg)
        rows_ctas = -(-shape[1] * group // 64) * shape[3] * shape[0]
        assert fa3.num_splits_for(cfg, q, k, True) == (
            split.num_splits_heuristic(rows_ctas, 32 if shape[4] == 4096 else -(-shape[4] // 128), 132,
                                       min_tiles=fa3.SPLIT_MIN_TILES)
            if cfg.num_splits == 0 else 1)
        fa3._check_problem(cfg, q, k)
    assert not fa3.pack_helps(33, 32, 8, 128) and fa3.pack_helps(32, 32, 8, 128) and not fa3.pack_helps(4, 8, 8, 64)
    assert not fa3.pack_helps(4, 40, 8, 128) and fa3.pack_helps(1, 40, 8, 128)  # group 5: Nq = 1 only (host views)
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", False)
    q, k = _qk(64, 16, 32, 8, 4096)
    assert fa3._problem_config(None, q, k, True) is None


def test_pack_group_is_checked(h200):
    """pack_group: the call's group, one that packs into the tile (config.check and decode_config say so)."""
    base = fa3._PACKED_CONFIGS[128]
    q, k = _qk(2, 4, 32, 8, 100)
    fa3._check_problem(dataclasses.replace(base, pack_group=4), q, k)
    with pytest.raises(ValueError, match="pack_group=8 but num_heads / num_heads_kv = 4"):
        fa3._check_problem(dataclasses.replace(base, pack_group=8), q, k)
    with pytest.raises(ValueError, match="pack_group=5 must divide tile_m=64"):
        dataclasses.replace(base, pack_group=5).check(128)
    with pytest.raises(ValueError, match="pack_group"):
        dataclasses.replace(fa3.DEFAULT_CONFIGS[128], pack_group=4).check(128)  # without pack_gqa
    q, k = _qk(1, 4, 40, 8, 100)
    with pytest.raises(ValueError, match="pack_gqa=True: a group of 5"):
        fa3.decode_config(q, k, True, pack_gqa=True)
    q, k = _qk(1, 1, 40, 8, 100)  # Nq = 1: host views, any group
    assert fa3.decode_config(q, k, True, pack_gqa=True).pack_group == 0
    q, k = _qk(1, 4, 32, 8, 100)
    assert fa3.decode_config(q, k, True, pack_gqa=True, num_splits=3) == dataclasses.replace(base, pack_group=4,
                                                                                              num_splits=3)


def test_pack_gqa_config_refuses_more_than_one_query_row():
    forced = dataclasses.replace(fa3.DEFAULT_CONFIGS[128], pack_gqa=True)
    q, k = _qk(2, 1, 32, 8, 100)
    fa3._check_problem(forced, q, k)
    q, k = _qk(2, 4, 32, 8, 100)
    with pytest.raises(ValueError, match="pack_gqa.*seqlen_q=4"):
        fa3._check_problem(forced, q, k)
    with pytest.raises(ValueError, match="pack_gqa"):
        dataclasses.replace(forced, pack_gqa=1).check(128)
    with pytest.raises(ValueError, match="pingpong=False"):  # one consumer warpgroup: nothing to ping-pong with
        dataclasses.replace(forced, tile_m=64).check(128)
    assert fa3._PACKED_CONFIGS[64].check(64).tile_m == 64


# ----- num_splits= / pack_gqa= through fa_variants.attention -------------------------------------------------


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(num_splits=0), ValueError, "num_splits must be >= 1"), (dict(num_splits=-3), ValueError, "num_splits"),
    (dict(num_splits=2.0), TypeError, "num_splits must be an int"), (dict(num_splits=True), TypeError, "num_splits"),
    (dict(num_splits="4"), TypeError, "num_splits"), (dict(pack_gqa=1), TypeError, "pack_gqa must be a bool"),
    (dict(pack_gqa="yes"), TypeError, "pack_gqa"),
])
def test_split_options_are_validated(kwargs, error, match):
    import fa_variants

    q, k, v = torch.randn(1, 1, 4, 64), torch.randn(1, 5, 2, 64), torch.randn(1, 5, 2, 64)
    with pytest.raises(error, match=match):
        fa_variants.attention(q, k, v, **kwargs)


@pytest.mark.parametrize("value", [__import__("numpy").int64(2), __import__("numpy").int32(1)], ids=["int64", "int32"])
def test_a_numpy_int_num_splits_is_taken_as_an_int(value):
    """np.int64 is no Python int: num_splits=np.int64(2) raised 'must be an int'; now it is checked as int(value)
    (np.bool_ and numpy floats stay refused)."""
    import numpy as np

    from fa_variants.common import split

    assert split.check_options(value, None) == int(value) and type(split.check_options(value, None)) is int
    for bad in (np.bool_(True), np.float32(2.0)):
        with pytest.raises(TypeError, match="^num_splits must be an int >= 1 or None"):
            split.check_options(bad, None)


def test_split_options_need_fa3_or_fa2():
    """num_splits / pack_gqa on another backend: a ValueError naming it, with seqlens_k too (whose values are checked
    first: a bad one is named before the backend)."""
    import fa_variants

    q, k, v = torch.randn(1, 1, 4, 64), torch.randn(1, 5, 2, 64), torch.randn(1, 5, 2, 64)
    with pytest.raises(ValueError, match="fa3 and fa2 backends only; this call runs on reference"):
        fa_variants.attention(q, k, v, num_splits=2)
    with pytest.raises(ValueError, match="fa3 and fa2 backends only; this call runs on reference"):
        fa_variants.attention(q, k, v, pack_gqa=False, seqlens_k=torch.tensor([3], dtype=torch.int32))
    with pytest.raises(ValueError, match="seqlens_k holds"):
        fa_variants.attention(q, k, v, pack_gqa=False, seqlens_k=torch.tensor([6], dtype=torch.int32))


def test_split_options_reach_the_fa3_launch(h200, split_enabled, monkeypatch):
    """attention(num_splits=, pack_gqa=) runs fa3 with decode_config's config: the given values, the others as
    `auto` would choose them."""
    import fa_variants
    from fa_variants import api, dispatch

    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    monkeypatch.setattr(dispatch, "select_backend", lambda *a, **kw: dispatch.Selection("fa3", "test", ("fa3",)))
    seen = []
    monkeypatch.setattr(api, "_run", lambda selection, q, k, v, causal, scale, config=None: seen.append(config) or (
        torch.zeros_like(q), torch.zeros(q.shape[0], q.shape[2], q.shape[1])))
    q, k, v = torch.randn(1, 1, 32, 128), torch.randn(1, 4096, 8, 128), torch.randn(1, 4096, 8, 128)
    fa_variants.attention(q, k, v, causal=True, num_splits=3)
    fa_variants.attention(q, k, v, causal=True, pack_gqa=False)
    fa_variants.attention(q, k, v, causal=True, num_splits=1, pack_gqa=False)
    base = fa3.DEFAULT_CONFIGS[128]
    keep = fa3._DECODE_KEEPS.get(128, {})  # what split / decode kernels keep of the prefill default's past
    assert seen == [dataclasses.replace(base, num_splits=3, pack_gqa=True, **fa3._NARROW, **keep,  # packed
                                        pdl=fa3.decode_pdl(3), first_row_only=fa3.DECODE_FIRST_ROW),  # 3 splits: PDL by default (DECODE_PDL_MAX_SPLITS)
                    dataclasses.replace(base, num_splits=0, **keep),  # split as auto would (32 CTAs leave SMs idle)
                    base]
    assert fa3.decode_config(q, k, True) == fa3._problem_config(None, q, k, True)


def test_decode_tiles_apply_to_one_query_row_only(h200, split_enabled, monkeypatch):
    """fa3.DECODE_TILES: every tile set fits (config.check) at every head dim; FA_VARIANTS_DECODE_TILES'
    choice (fa3.DECODE_TILES_CHOICE) changes `auto`'s packed seqlen_q = 1 config (and its split count, which
    follows tile_n) but not the packed seqlen_q > 1 one nor the unpacked one; "base" is the packed config."""
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    for choice in fa3.DECODE_TILES:
        for d in fa3.HEAD_DIMS:
            for base in (fa3._PACKED_CONFIGS[d], fa3._PACKED_SPLIT_CONFIGS[d]):
                assert fa3.decode_tiles(base, d, choice).check(d).pack_gqa
    assert fa3.decode_tiles(fa3._PACKED_CONFIGS[64], 64, "base") is fa3._PACKED_CONFIGS[64]
    monkeypatch.setattr(fa3, "DECODE_TILES_CHOICE", "wide")
    q, k = _qk(1, 1, 32, 8, 4096, head_dim=64)
    cfg = fa3._problem_config(None, q, k, True)
    assert (cfg.tile_n, cfg.stages, cfg.num_splits) == (192, 3, 0)
    assert fa3.num_splits_for(cfg, q, k, True) == split.num_splits_heuristic(
        8, 22, 132, min_tiles=fa3.SPLIT_MIN_TILES)  # ceil(4096 / 192)
    assert fa3.decode_config(q, k, True, num_splits=5) == dataclasses.replace(cfg, num_splits=5, pdl=fa3.decode_pdl(5))
    q, k = _qk(1, 4, 32, 8, 4096, head_dim=64)  # seqlen_q > 1: the packed-rows config is untouched
    cfg = fa3._problem_config(None, q, k, True)
    assert cfg.pack_group == 4 and (cfg.tile_n, cfg.stages) == (128, 2)
    monkeypatch.setattr(fa3, "DECODE_TILES_CHOICE", "deep")
    q, k = _qk(64, 1, 32, 8, 4096)  # not split: the whole packed config, 3 stages at D 128
    assert fa3._problem_config(None, q, k, True) == fa3.first_row(
        dataclasses.replace(fa3._PACKED_CONFIGS[128], stages=3, pdl=fa3.decode_pdl(1)), 4)
    assert dataclasses.replace(fa3._PACKED_CONFIGS[128], stages=3, pdl=fa3.decode_pdl(1)) in fa3._auto_configs(128)


def test_merge_config_pdl_needs_sm90():
    from fa_variants.common import split_combine

    assert split_combine.MergeConfig(pdl=True).check(128, "sm_90a").pdl
    with pytest.raises(ValueError, match="pdl=True.*sm_80"):
        split_combine.MergeConfig(pdl=True).check(128, "sm_80")


def test_pdl_config_is_checked():
    """Sm90Config.pdl: a bool, sm_90a only; fa3.DECODE_PDL adds it to the packed seqlen_q = 1 configs."""
    cfg = dataclasses.replace(fa3._PACKED_CONFIGS[128], pdl=True)
    assert cfg.check(128).pdl and fa3.decode_tiles(fa3._PACKED_CONFIGS[128], 128, "base", pdl=True) == cfg
    with pytest.raises(ValueError, match="pdl"):
        cfg.check(128, "sm_80")
    with pytest.raises(ValueError, match="pdl"):
        dataclasses.replace(cfg, pdl=1).check(128)


def test_two_ctas_per_sm_is_checked():
    """Sm90Config.ctas_per_sm = 2: one consumer warpgroup (tile_m 64) and twice the CTA's shared memory within
    the SM's 228 KiB: D 64 with 128-key tiles and 2 stages fits, D 128 needs 64-key tiles."""
    base = fa3._PACKED_CONFIGS[64]
    assert dataclasses.replace(base, ctas_per_sm=2).check(64).ctas_per_sm == 2
    with pytest.raises(ValueError, match="does not fit twice"):
        dataclasses.replace(fa3._PACKED_CONFIGS[128], ctas_per_sm=2).check(128)
    assert dataclasses.replace(fa3._PACKED_CONFIGS[128], ctas_per_sm=2, tile_n=64).check(128)
    with pytest.raises(ValueError, match="ctas_per_sm"):
        dataclasses.replace(fa3.DEFAULT_CONFIGS[128], ctas_per_sm=2).check(128)  # two consumer warpgroups
    with pytest.raises(ValueError, match="ctas_per_sm"):
        dataclasses.replace(base, ctas_per_sm=3).check(64)


def test_decode_table_subset_and_summary(capsys):
    """`bench --decode --decode-nk 1024,4096 --decode-batch 1 ...`: the subset of cases; the summary counts the cases
    at or below SDPA, their geomean and worst, and ours' lowest HBM share at Nk >= 32k."""
    from fa_variants.bench import decode
    from fa_variants.cli import main

    sub = decode.cases(nk=(1024, 4096), batch=(1,), head_dims=(128,))
    assert len(sub) == 2 * 3 * 2 and {(c.seqlen_k, c.batch, c.head_dim) for c in sub} == {(1024, 1, 128), (4096, 1, 128)}
    assert main(["bench", "--decode", "--dry-run", "--decode-nk", "1024", "--decode-nq", "1", "--decode-batch", "1,8"]) == 0
    assert "decode table: 8 cases" in capsys.readouterr().out
    case = dict(head_dim=128, heads=32, heads_kv=8, batch=1, seqlen_q=1)
    rows = [dict(case, seqlen_k=1024, impl="sdpa (auto)", gpu_us=10.0), dict(case, seqlen_k=1024, impl="ours (auto)", gpu_us=8.0),
            dict(case, seqlen_k=32768, impl="sdpa (auto)", gpu_us=40.0),
            dict(case, seqlen_k=32768, impl="ours (auto)", gpu_us=50.0, hbm_share=0.6),
            dict(case, seqlen_k=32768, impl="flash-attn-4", error="E")]
    text = decode.summary(rows)
    assert "ours (auto): <= sdpa (auto) at 1/2 cases, geomean 1.000, worst 1.25 (D128 32:8 B1 Nk32768 Nq1)" in text
    assert "flash-attn-4: no case timed" in text
    assert "lowest 60% (D128 B1 Nk32768 Nq1), >= 70% at 0/1 cases; target >= 70%" in text
    rows[1].update(ratio_to_ref=0.7, sm_mhz=1500.0, power_w=600.0)  # a paired ratio wins over the medians' ratio
    rows[3].update(sm_mhz=1980.0, power_w=690.0)
    text = decode.summary(rows)
    assert "at 1/2 cases, geomean 0.935, worst 1.25" in text and "SM clock during the bursts 1500-1980 MHz, power up " \
        "to 690 W" in text


def test_decode_case_whose_inputs_do_not_fit_gets_error_rows(monkeypatch):
    """A case whose Q / K / V do not fit the GPU (B 64 Nk 128k: 32 GiB of K / V on a 24 GB card) gets an error row per
    implementation and the table goes on; before, the out-of-memory error ended the command and lost every row."""
    from fa_variants.bench import decode

    def no_memory(case, ragged):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")

    monkeypatch.setattr(decode, "_inputs", no_memory)
    case = decode.DecodeCase(head_dim=128, heads=32, heads_kv=8, batch=64, seqlen_k=131072, seqlen_q=1)
    rows = decode.measure(case, {"ours (auto)": None, "sdpa (auto)": None}, 3.35)
    assert [r["impl"] for r in rows] == ["ours (auto)", "sdpa (auto)"]
    assert all(r["error"].startswith("inputs: OutOfMemoryError") and r["seqlen_k"] == 131072 for r in rows)
    assert "inputs: OutOfMemoryError" in decode.table(rows) and "no case timed" in decode.summary(rows)


def test_decode_table_ragged_lengths_and_mask(rng_seed):
    """`bench --decode --decode-lengths`: lengths in [1, Nk] (the first Nk), and SDPA's mask is the keys the
    reference lets each row see (below the length, causal bottom-right against it)."""
    import torch

    from fa_variants.bench import decode
    from fa_variants.reference import attention_reference

    case = decode.DecodeCase(batch=5, seqlen_q=3, seqlen_k=11, heads=4, heads_kv=2, head_dim=8)
    lengths, mask = decode.ragged_lengths(case, torch.Generator().manual_seed(rng_seed), device="cpu")
    assert lengths.dtype == torch.int32 and lengths[0] == 11 and ((lengths >= 1) & (lengths <= 11)).all()
    assert mask.shape == (5, 1, 3, 11)
    q, k, v = (torch.randn(5, n, h, 8, dtype=torch.float64) for n, h in ((3, 4), (11, 2), (11, 2)))
    want = attention_reference(q, k, v, causal=True, softmax_scale=0.3, seqlens_k=lengths)[0]
    got = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           attn_mask=mask, scale=0.3, enable_gqa=True).transpose(1, 2)
    rows = mask.squeeze(1).any(-1)  # rows that see a key (the others: 0 in ours, NaN in SDPA)
    torch.testing.assert_close(got[rows], want[rows])
    from fa_variants.cli import main

    assert main(["bench", "--decode", "--decode-lengths", "--quick", "--dry-run"]) == 0


def test_decode_pdl_follows_the_split_count(h200, split_enabled, monkeypatch):
    """Session 6 defaults: one-tile splits (B 1 Nk 1k: 8 splits) and PDL at DECODE_PDL_MIN_SPLITS (1 since session
    10: unsplit too)..DECODE_PDL_MAX_SPLITS splits of a packed seqlen_q = 1 call (not at 16 splits, not at
    seqlen_q > 1); 0 turns it off; the old defaults (min tiles 2, no PDL) give 4 splits without PDL."""
    monkeypatch.setattr(fa3, "DECODE_PDL", False)
    monkeypatch.setattr(fa3, "DECODE_PDL_MIN_SPLITS", 1)
    monkeypatch.setattr(fa3, "DECODE_PDL_MAX_SPLITS", 8)
    monkeypatch.setattr(fa3, "SPLIT_MIN_TILES", 1)
    cases = [((1, 1, 32, 8, 1024), 8, True), ((8, 1, 32, 8, 1024), 2, True), ((1, 1, 32, 8, 4096), 16, False),
             ((64, 1, 32, 8, 1024), 1, True), ((1, 4, 32, 8, 1024), 8, False)]
    for shape, splits, pdl in cases:
        q, k = _qk(*shape)
        cfg = fa3._problem_config(None, q, k, True)
        assert fa3.auto_num_splits(q, k, True) == splits and cfg.pdl == pdl, (shape, cfg)
    forced = fa3.decode_config(*_qk(1, 1, 32, 8, 1024), True, num_splits=16)
    assert not forced.pdl and fa3.decode_config(*_qk(1, 1, 32, 8, 1024), True, num_splits=4).pdl
    monkeypatch.setattr(fa3, "DECODE_PDL_MAX_SPLITS", 0)
    monkeypatch.setattr(fa3, "SPLIT_MIN_TILES", 2)
    fa3._auto_splits.cache_clear()
    q, k = _qk(1, 1, 32, 8, 1024)
    assert fa3.auto_num_splits(q, k, True) == 4 and not fa3._problem_config(None, q, k, True).pdl


def test_wide_packed_tiles_only_where_the_rows_need_them(h200, split_enabled, monkeypatch):
    """fa3.PACK_WIDE: 64:8 at Nq 16 (128 rows) in one 128-row tile with ping-pong, so K/V is read once per KV
    head (B 1 then splits more: 8 CTAs, not 16); 32:8 at Nq 16 (64 rows) and Nq 1 keep the 64-row tile; False:
    two 64-row tiles."""
    q, k = _qk(1, 16, 64, 8, 32768, 64)
    monkeypatch.setattr(fa3, "PACK_WIDE", False)
    assert fa3._problem_config(None, q, k, True).tile_m == 64
    monkeypatch.setattr(fa3, "PACK_WIDE", True)
    cfg = fa3._problem_config(None, q, k, True)
    assert (cfg.tile_m, cfg.pingpong, cfg.pack_group) == (128, True, 8) and fa3.num_splits_for(cfg, q, k, True) == 16
    for shape in ((1, 16, 32, 8, 32768), (1, 1, 64, 8, 32768), (1, 32, 64, 8, 4096)):  # 64, 8 (views), 256 rows
        assert fa3._problem_config(None, *_qk(*shape), True).tile_m == 64, shape
    assert fa3.decode_config(q, k, True).tile_m == 128
    assert fa3._problem_config(None, *_qk(8, 16, 64, 8, 4096), True).tile_m == 128  # True: D 128 even if it splits


def test_wide_packed_tiles_by_default(h200, split_enabled, monkeypatch):
    """PACK_WIDE None (the default, FA_VARIANTS_PACK_WIDE unset / auto; ``fa3.wide_helps``): 64:8 at Nq 16 takes
    the 128-row tile at D 64 always (B 8 Nk 32k: 1 -> 2 splits); at D 128 where the split count stays (B 64
    Nk 32k, unsplit either way) or seqlen_k >= WIDE_LONG_SEQLEN_K (16k; B 8 Nk 32k 1 -> 2 splits, B 1 Nk 16k 8 -> 16,
    the s33 A/B's gains), not at B 8 Nk 4k / 8k nor B 1 Nk 4k (the split count doubles; the s6 / s33 losses);
    D 96 (unmeasured) never."""
    monkeypatch.setattr(fa3, "PACK_WIDE", None)
    assert fa3.WIDE_LONG_SEQLEN_K == 16384
    cases = [((1, 16, 64, 8, 32768, 64), 128, 16), ((8, 16, 64, 8, 32768, 64), 128, 2),
             ((64, 16, 64, 8, 1024, 64), 128, 1), ((64, 16, 64, 8, 32768, 128), 128, 1),
             ((8, 16, 64, 8, 4096, 128), 64, 1), ((8, 16, 64, 8, 8192, 128), 64, 1),
             ((1, 16, 64, 8, 4096, 128), 64, 8), ((1, 16, 64, 8, 16383, 128), 64, 8),
             ((1, 16, 64, 8, 16384, 128), 128, 16), ((8, 16, 64, 8, 32768, 128), 128, 2),
             ((1, 16, 64, 8, 131072, 128), 128, 16), ((64, 16, 64, 8, 32768, 96), 64, 1)]
    for shape, tile_m, splits in cases:
        q, k = _qk(*shape)
        cfg = fa3._problem_config(None, q, k, True)
        assert (cfg.tile_m, cfg.pingpong, fa3.auto_num_splits(q, k, True)) == (tile_m, tile_m == 128, splits), shape
    q, k = _qk(8, 16, 64, 8, 4096, 128)
    assert not fa3.wide_helps(q, k) and fa3.decode_config(q, k, True).tile_m == 64


def test_pack_wide_switch_from_the_environment(monkeypatch):
    """FA_VARIANTS_PACK_WIDE: 0 / 1 / auto (unset: auto); anything else a one-line ValueError naming it."""
    values = []
    for v in ("0", "1", "auto"):
        monkeypatch.setenv("FA_VARIANTS_PACK_WIDE", v)
        values.append(env.auto_flag("FA_VARIANTS_PACK_WIDE"))
    assert values == [False, True, None]
    monkeypatch.setenv("FA_VARIANTS_PACK_WIDE", "yes")
    with pytest.raises(ValueError, match="FA_VARIANTS_PACK_WIDE"):
        env.auto_flag("FA_VARIANTS_PACK_WIDE")


def test_decode_first_row_switch(h200, split_enabled, monkeypatch):
    """fa3.DECODE_FIRST_ROW (FA_VARIANTS_DECODE_FIRST_ROW, off by default): `auto`'s packed seqlen_q = 1 configs
    take ``first_row_only`` when a KV head's group is <= 8 query heads (32:8, 64:8, MQA 8:1), base and dual tiles,
    split or not; not 16:1 (16 rows), nor seqlen_q > 1; the split count and the rest of the config unchanged;
    warmup plans them; an explicit first_row_only config on more than 8 packed rows is refused; the config check
    refuses it outside packed decode."""
    from fa_variants.common.config import Sm90Config

    monkeypatch.setattr(fa3, "DECODE_FIRST_ROW", False)
    shapes = [(1, 1, 32, 8, 4096, 64), (8, 1, 64, 8, 1024, 64), (64, 1, 32, 8, 1024, 64), (64, 1, 32, 8, 1024, 128),
              (1, 1, 8, 1, 4096, 128), (1, 1, 32, 2, 4096, 64), (1, 16, 32, 8, 32768, 64)]
    before = [(fa3._problem_config(None, *_qk(*s), True), fa3.auto_num_splits(*_qk(*s), True)) for s in shapes]
    assert not any(c.first_row_only for c, _ in before)
    monkeypatch.setattr(fa3, "DECODE_FIRST_ROW", True)
    for shape, (old, splits) in zip(shapes, before):
        q, k = _qk(*shape)
        cfg = fa3._problem_config(None, q, k, True)
        on = shape[1] == 1 and shape[2] // shape[3] <= 8
        assert cfg == (dataclasses.replace(old, first_row_only=True) if on else old), shape
        assert fa3.auto_num_splits(q, k, True) == splits
        fa3._check_problem(cfg, q, k)
    assert fa3.decode_config(*_qk(1, 1, 32, 8, 4096, 64), True, num_splits=3).first_row_only
    assert any(c.first_row_only and c.ctas_per_sm == 2 for c in fa3._auto_configs(64))
    assert any(c.first_row_only and c.num_splits == 0 and c.pdl for c in fa3._auto_configs(128))
    explicit = fa3._problem_config(None, *_qk(1, 1, 32, 8, 4096, 64), True)
    with pytest.raises(ValueError, match="first_row_only"):
        fa3._check_problem(explicit, *_qk(1, 1, 32, 2, 4096, 64))  # 16 rows
    with pytest.raises(ValueError, match="first_row_only"):
        Sm90Config(first_row_only=True).check(128)


def test_decode_switches_from_the_environment_are_checked(monkeypatch):
    """FA_VARIANTS_DECODE_PDL_MAX_SPLITS must be an int >= 0: one-line ValueError naming it."""
    monkeypatch.setenv("FA_VARIANTS_DECODE_PDL_MAX_SPLITS", "few")
    with pytest.raises(ValueError, match="FA_VARIANTS_DECODE_PDL_MAX_SPLITS"):
        env.integer("FA_VARIANTS_DECODE_PDL_MAX_SPLITS", "8", 0)
    monkeypatch.setenv("FA_VARIANTS_DECODE_PDL_MAX_SPLITS", "4")
    assert env.integer("FA_VARIANTS_DECODE_PDL_MAX_SPLITS", "8", 0) == 4


def test_decode_tiles_auto_picks_dual_for_many_short_ctas(h200, split_enabled, monkeypatch):
    """FA_VARIANTS_DECODE_TILES=auto (fa3.DECODE_TILES_CHOICE "auto", the default): two CTAs per SM ("dual") at
    batch x heads_kv >= DUAL_MIN_CTAS (512) and Nk <= 4k (B 64 x 8), the base tiles at B 8 x 8 (dual's 4 splits
    instead of 2 lost in the s6 A/B), B 1 or Nk 32k; the split count follows the chosen tiles."""
    assert fa3.DECODE_TILES_CHOICE == "auto" and fa3.DUAL_MIN_CTAS == 512
    for shape, dual in (((8, 1, 32, 8, 1024), False), ((64, 1, 64, 8, 4096), True), ((64, 1, 32, 8, 1024), True),
                        ((1, 1, 32, 8, 1024), False), ((64, 1, 32, 8, 32768), False), ((63, 1, 32, 8, 1024), False)):
        q, k = _qk(*shape)
        cfg = fa3._problem_config(None, q, k, True)
        assert (cfg.ctas_per_sm == 2) == dual and (cfg.tile_n == 64) == dual, (shape, cfg)
    q, k = _qk(8, 1, 32, 8, 1024, 64)
    assert fa3.auto_num_splits(q, k, True) == 2
    # the heuristic counts a dual config's slots (2 per SM): B 8 Nk 1k D 64 (64 CTAs of 8 tiles) 4 splits, not 2
    monkeypatch.setattr(fa3, "DUAL_MIN_CTAS", 64)
    assert fa3._problem_config(None, q, k, True).ctas_per_sm == 2 and fa3.auto_num_splits(q, k, True) == 4
    warm = fa3._auto_configs(128)  # warmup compiles both tile sets
    assert any(c.ctas_per_sm == 2 for c in warm) and any(c.ctas_per_sm == 1 for c in warm)
    monkeypatch.setattr(fa3, "DECODE_TILES_CHOICE", "base")
    assert fa3.auto_num_splits(q, k, True) == 2
    assert fa3._problem_config(None, *_qk(64, 1, 32, 8, 1024), True).ctas_per_sm == 1


@pytest.mark.parametrize("head_dim", [64, 128])
def test_warmup_plans_every_kernel_auto_runs_for_a_gqa_model(h200, split_enabled, monkeypatch, head_dim):
    """`fa-variants warmup --gqa H:H_kv` (or --model) plans every kernel `auto` runs for that model's decode
    shapes, packed seqlen_q > 1 ones too (their config fixes the group; at head_dim 64 64:8 at Nq 16 takes the
    128-row tile, PACK_WIDE auto): a call of those shapes compiles nothing at first use."""
    from fa_variants import registry
    from fa_variants.commands import warmup

    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    monkeypatch.setattr(fa3, "PACK_WIDE", None)
    for heads, heads_kv in ((64, 8), (32, 8), (32, 1)):
        todo, _ = warmup.plan(["fa3"], "sm_90a", ["bf16"], [head_dim], [True], groups=(heads // heads_kv,))
        ran = set()
        for batch in (1, 8, 64):
            for seqlen_q in (1, 2, 4, 8, 16, 32):
                for seqlen_k in (1024, 4096, 32768):
                    q, k = _qk(batch, seqlen_q, heads, heads_kv, seqlen_k, head_dim)
                    cfg = fa3._problem_config(None, q, k, True)
                    ran.add(registry.static_config("fa3", "sm_90a", "bf16", head_dim, True, cfg))
        assert any(c.config is not None and c.config.pack_group for c in ran)  # the case this is about
        missing = ran - set(todo)
        assert not missing, [c.config for c in missing]


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("fused", ["off", "decode"])
def test_warmup_seqlens_k_plans_every_kernel_a_decode_call_launches(h200, split_enabled, monkeypatch, head_dim, fused):
    """`fa-variants warmup --gqa 32:8 --seqlens-k` plans, for every decode shape of that model, the kernel `auto`
    runs, the one a call with seqlens_k runs (``lengths_config``) and the split merge kernel each launches after
    it (its pdl, the kernel its split count picks): a fresh process's first decode call compiles nothing."""
    from fa_variants import registry
    from fa_variants.commands import warmup
    from fa_variants.common import split_combine

    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    monkeypatch.setattr(fa3, "FUSED_MERGE", fused)
    todo, notes = warmup.plan(["fa3"], "sm_90a", ["bf16"], [head_dim], [True], groups=(4,), seqlens_k=True)
    assert not notes
    needed = set()
    for batch in (1, 2, 8, 64):
        for seqlen_q in (1, 4, 16):
            for seqlen_k in (1023, 4096, 32768, 131072):
                q, k = _qk(batch, seqlen_q, 32, 8, seqlen_k, head_dim)
                for cfg in (fa3._problem_config(None, q, k, True), fa3.lengths_config(q, k, True),
                            fa3.leftpad_config(q, k, True), fa3.windows_config(q, k, True)):
                    cfg = cfg or fa3.DEFAULT_CONFIGS[head_dim]
                    needed.add(registry.static_config("fa3", "sm_90a", "bf16", head_dim, True, cfg))
                    if cfg.num_splits != 1 and not cfg.fused_merge:
                        warp = split_combine.warp_merge_for(fa3.num_splits_for(cfg, q, k, True))
                        needed.add(split_combine._merge_static_config(
                            "sm_90a", "bf16", head_dim, True if cfg.pdl else split_combine.MERGE_PDL, warp))
    assert any(c.variant == "split-merge" for c in needed) and any(
        c.variant == "fa3" and c.config.seqlens_k for c in needed)  # the cases this is about
    missing = needed - set(todo)
    assert not missing, [(c.variant, c.config) for c in missing]


@pytest.mark.parametrize("fused", ["off", "decode", "all"])
def test_auto_configs_pass_their_check_under_every_merge_mode(h200, split_enabled, monkeypatch, fused):
    """Every config `auto` picks for decode shapes (first_row_only on by default) is one its check accepts under
    each FA_VARIANTS_FUSED_MERGE mode: the fused merge has no first_row_only, so a fused config runs the whole
    tile (before: the pair reached the launch and raised, session 7's GPU suite, test_decode_fused_gpu)."""
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    monkeypatch.setattr(fa3, "FUSED_MERGE", fused)
    for shape in ((1, 1, 32, 8, 4096), (1, 1, 64, 8, 1024), (8, 1, 32, 8, 1024), (1, 1, 32, 32, 4096)):
        for head_dim in (64, 128):
            q, k = _qk(*shape, head_dim=head_dim)
            cfg = fa3._problem_config(None, q, k, True)
            if cfg is not None:
                cfg.check(head_dim)
                assert not (cfg.fused_merge and cfg.first_row_only), (shape, cfg)
    for head_dim in (64, 128):
        for cfg in fa3._auto_configs(head_dim, (4, 8)):
            cfg.check(head_dim)


def test_full_grid_switch_runs_a_persistent_grid_unsplit_only(h200, split_enabled, monkeypatch):
    """fa3.DECODE_FULL_GRID (FA_VARIANTS_DECODE_FULL_GRID; "dual" by default): "persistent" / "persistent3" replace the
    dual tiles where `auto` takes them (B x Hkv >= 512, Nk <= 4k: one CTA per SM walking the (batch, KV head) tiles,
    base 128-key tiles, 2 / 3 K/V stages), unsplit; the other shapes keep their configs; a forced split count gets
    the base tiles (persistent has no split-KV); warmup plans the persistent configs; each passes its check."""
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    monkeypatch.setattr(fa3, "DECODE_TILES_CHOICE", "auto")
    shapes = [(64, 1, 32, 8, 1024, 64), (64, 1, 64, 8, 4096, 128), (64, 1, 32, 8, 32768, 64), (8, 1, 32, 8, 1024, 64),
              (1, 1, 64, 8, 32768, 64), (64, 4, 32, 8, 1024, 64)]
    assert fa3.DECODE_FULL_GRID == "dual"
    before = [fa3._problem_config(None, *_qk(*s), True) for s in shapes]
    assert [c.ctas_per_sm for c in before[:2]] == [2, 2]
    for grid, stages in (("persistent", 2), ("persistent3", 3)):
        monkeypatch.setattr(fa3, "DECODE_FULL_GRID", grid)
        got = [fa3._problem_config(None, *_qk(*s), True) for s in shapes]
        for (*_, d), c in zip(shapes[:2], got[:2]):
            assert c == fa3.first_row(dataclasses.replace(fa3._PACKED_CONFIGS[d], persistent=True, stages=stages,
                                                       pdl=fa3.decode_pdl(1)), 8)
            assert c.check(d).first_row_only and fa3.auto_num_splits(*_qk(*shapes[0]), True) == 1
        assert got[2:] == before[2:]
        forced = fa3.decode_config(*_qk(*shapes[0]), True, num_splits=2)
        assert not forced.persistent and forced.stages == 2 and forced.num_splits == 2, forced
        assert fa3.decode_config(*_qk(*shapes[0]), True).persistent
        warm = fa3._auto_configs(64)
        assert any(c.persistent and c.stages == stages for c in warm) and not any(c.persistent and c.num_splits != 1
                                                                                 for c in warm)
        for c in warm:
            c.check(64)
    for d in (64, 96, 128):  # the split configs of a persistent tile set are the base ones
        assert fa3.decode_tiles(fa3._PACKED_SPLIT_CONFIGS[d], d, "persistent3") is fa3._PACKED_SPLIT_CONFIGS[d]


def test_persistent_packed_decode_is_checked():
    """Sm90Config.persistent with pack_gqa: host-view packing (seqlen_q = 1) only; pack_group, split-KV and two CTAs
    per SM are refused with a ValueError naming the switch."""
    base = dataclasses.replace(fa3._PACKED_CONFIGS[64], persistent=True)
    assert base.check(64).persistent and dataclasses.replace(base, first_row_only=True).check(64)
    for change in (dict(pack_group=4), dict(num_splits=2), dict(num_splits=0), dict(ctas_per_sm=2)):
        with pytest.raises(ValueError, match="persistent"):
            dataclasses.replace(base, **change).check(64)


def test_decode_pdl_min_splits_adds_unsplit_calls(h200, split_enabled, monkeypatch):
    """fa3.DECODE_PDL_MIN_SPLITS (FA_VARIANTS_DECODE_PDL_MIN_SPLITS, default 1 since session 10): the unsplit packed
    seqlen_q = 1 calls (B 64 Nk 1k dual, B 64 Nk 32k base) launch as programmatic dependents; 2 makes them plain
    launches again; split calls (B 8 Nk 1k: 2 splits, PDL either way; B 1 Nk 4k: 16, not) and seqlen_q > 1 calls
    as before; warmup plans the unsplit PDL configs; a bad value is a one-line ValueError naming the variable."""
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    monkeypatch.setattr(fa3, "DECODE_PDL", False)
    monkeypatch.setattr(fa3, "DECODE_PDL_MAX_SPLITS", 8)
    assert fa3.DECODE_PDL_MIN_SPLITS == 1 and fa3.decode_pdl(1) and fa3.decode_pdl(2)
    shapes = [(64, 1, 32, 8, 1024), (64, 1, 64, 8, 32768), (8, 1, 32, 8, 1024), (1, 1, 32, 8, 4096), (64, 4, 32, 8, 1024)]
    got = [fa3._problem_config(None, *_qk(*s), True) for s in shapes]
    assert [c.pdl for c in got] == [True, True, True, False, False]
    assert any(c.pdl and c.num_splits == 1 and c.ctas_per_sm == 2 for c in fa3._auto_configs(128))
    monkeypatch.setattr(fa3, "DECODE_PDL_MIN_SPLITS", 2)
    before = [fa3._problem_config(None, *_qk(*s), True) for s in shapes]
    assert before[:2] == [dataclasses.replace(c, pdl=False) for c in got[:2]] and before[2:] == got[2:]
    monkeypatch.setattr(fa3, "DECODE_PDL_MIN_SPLITS", 3)  # split calls of 3..8 splits: their PDL kernel still warmed
    assert not fa3.decode_pdl(2) and fa3.decode_pdl(3)
    assert any(c.pdl and c.num_splits == 0 and c.pack_gqa and not c.pack_group for c in fa3._auto_configs(128))
    monkeypatch.setenv("FA_VARIANTS_DECODE_PDL_MIN_SPLITS", "0")
    with pytest.raises(ValueError, match="^FA_VARIANTS_DECODE_PDL_MIN_SPLITS must be an int >= 1"):
        env.integer("FA_VARIANTS_DECODE_PDL_MIN_SPLITS", "1", 1)


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_short_seqlen_k_runs_the_persistent_grid(h200, split_enabled, monkeypatch, head_dim):
    """Session 16: an unsplit, unpacked call with 0 < seqlen_k <= SHORT_MAX_SEQLEN_K (causal: and <=
    SHORT_MAX_SEQLEN_K_CAUSAL, session 17) and more query tiles than SMs runs the head dim's default with the
    persistent grid at SHORT_HEAD_DIMS (64, 128) and the plain default elsewhere (and on grids of one tile per SM);
    longer seqlen_k, split or packed calls, an explicit config and FA_VARIANTS_SHORT_PERSISTENT=0 keep what they had;
    `fa-variants warmup` compiles it."""
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K", 3072)  # the defaults, whatever the environment says
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K_CAUSAL", 1536)
    monkeypatch.setattr(fa3, "SHORT_NARROW_MAX_SEQLEN_K", 1024)
    monkeypatch.setattr(fa3, "SHORT_BALANCED", False)  # the static schedule (the balanced one: the next test)
    short = head_dim in (64, 128)
    want = dataclasses.replace(fa3.DEFAULT_CONFIGS[head_dim], persistent=True) if short else None
    narrow = dataclasses.replace(want, tile_m=128) if head_dim == 64 else want  # D 64 causal, seqlen_k <= 1024
    cases = ((512, 512, False, want), (1024, 1024, True, narrow), (4096, 1000, True, narrow), (3, 3, False, want),
             (1025, 1025, True, want), (1536, 1536, True, want), (1537, 1537, True, None), (2048, 1537, True, None),
             (1537, 1537, False, want), (3072, 3072, False, want), (3073, 3073, False, None), (512, 3073, False, None))
    for seqlen_q, seqlen_k, causal, want_here in cases:
        q, k = _qk(32, seqlen_q, 16, 16, seqlen_k, head_dim)
        assert fa3._problem_config(None, q, k, causal) == want_here, (seqlen_q, seqlen_k, causal)
        assert fa3.auto_num_splits(q, k, causal) == 1
    q, k = _qk(32, 512, 16, 16, 512, head_dim)
    monkeypatch.setattr(fa3, "SHORT_NARROW_MAX_SEQLEN_K", 0)  # D 64's causal calls keep the 192-row tile
    assert fa3._problem_config(None, q, k, True) == want
    monkeypatch.setattr(fa3, "SHORT_NARROW_MAX_SEQLEN_K", 1024)
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K_CAUSAL", 0)  # causal calls only leave the short grid
    assert fa3._problem_config(None, q, k, True) is None and fa3._problem_config(None, q, k, False) == want
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K_CAUSAL", 4096)  # a causal limit above the limit: the limit
    q, k = _qk(32, 512, 16, 16, 3073, head_dim)
    assert fa3._problem_config(None, q, k, True) is None
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K_CAUSAL", 1536)
    # one K/V tile (never split): the short grid only where the query tiles outnumber the 132 SMs
    for batch, want_here in ((8, None), (9, want)):  # 1 query tile x 16 heads x batch: 128 / 144 tiles
        q, k = _qk(batch, 100, 16, 16, 100, head_dim)
        assert fa3.auto_num_splits(q, k, False) == 1 and fa3._problem_config(None, q, k, False) == want_here, batch
    q, k = _qk(1, 1, 32, 8, 1024, head_dim)  # decode: packed (and split), never the short grid
    cfg = fa3._problem_config(None, q, k, True)
    assert cfg is not None and cfg.pack_gqa and not cfg.persistent
    q, k = _qk(32, 512, 16, 16, 512, head_dim)
    assert fa3._problem_config(fa3.DEFAULT_CONFIGS[head_dim], q, k, False) is fa3.DEFAULT_CONFIGS[head_dim]
    assert ({want, narrow} <= set(fa3._auto_configs(head_dim))) if short else not any(
        c.persistent for c in fa3._auto_configs(head_dim))
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K", 0)
    assert fa3._problem_config(None, q, k, False) is None
    assert not any(c.persistent for c in fa3._auto_configs(head_dim))


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_short_causal_calls_deal_tiles_by_load(h200, split_enabled, monkeypatch, head_dim):
    """Session 18: an unsplit, unpacked causal call with two or more query tiles per head, seqlen_k <=
    BALANCED_MAX_SEQLEN_K[head_dim] (4096 at D 64 / 128, 8192 at D 256, none at D 96) and more query tiles than SMs runs
    the persistent grid with its tiles dealt by load (D 64 up to 1024 keys on 128-row tiles); one query tile per head
    (equal costs), non-causal calls, CUDA graph capture before the shape's table exists and FA_VARIANTS_SHORT_BALANCED=0
    keep the static rules (session 17's limits); FA_VARIANTS_SHORT_PERSISTENT(_CAUSAL)=0 turn it off too."""
    from fa_variants.common import workspace

    for name, value in (("SHORT_MAX_SEQLEN_K", 3072), ("SHORT_MAX_SEQLEN_K_CAUSAL", 1536),
                        ("SHORT_NARROW_MAX_SEQLEN_K", 1024), ("SHORT_BALANCED", True)):
        monkeypatch.setattr(fa3, name, value)  # the defaults, whatever the environment says
    monkeypatch.setattr(fa3, "_TABLES", {})
    limit = {64: 4096, 128: 4096, 256: 8192}.get(head_dim, 0)
    persistent = dataclasses.replace(fa3.CAUSAL_CONFIGS[head_dim], persistent=True)  # = DEFAULT_CONFIGS but at D 256
    balanced = dataclasses.replace(persistent, balanced=True)
    narrow = dataclasses.replace(balanced, tile_m=128) if head_dim == 64 else balanced
    static = (dataclasses.replace(persistent, tile_m=128) if head_dim == 64 else persistent) if head_dim in (
        64, 128) else None  # session 17's: one query tile of 100 rows at 1024 keys
    cases = ((1024, 1024, narrow), (1025, 1025, balanced), (3000, 4096, balanced), (limit, limit, balanced),
             (limit + 1, limit + 1, None), (8192, 8193, None), (100, 1024, static), (100, 2048, None))
    for seqlen_q, seqlen_k, want in cases:
        q, k = _qk(32, seqlen_q, 16, 16, seqlen_k, head_dim)
        got = fa3._problem_config(None, q, k, True)
        assert got == (want if limit else None) and fa3.auto_num_splits(q, k, True) == 1, (seqlen_q, seqlen_k)
        assert (got is None) or got is fa3.short_config(q, k, True)  # one object per config: the launcher's keys
    if not limit:
        return
    q, k = _qk(32, 2048, 16, 16, 2048, head_dim)
    assert fa3._problem_config(None, q, k, False) == (persistent if head_dim != 256 else None)  # not causal
    assert fa3.decode_config(q, k, True, num_splits=1) == balanced
    assert {balanced, narrow} <= set(fa3._auto_configs(head_dim))  # `fa-variants warmup` compiles it
    q, k = _qk(1, 2048, 8, 8, 2048, head_dim)  # 16 (D 64: 11) x 8 tiles: not more than the SMs (auto splits it)
    assert fa3.short_config(q, k, True) is None
    q, k = _qk(32, 1536, 16, 16, 1536, head_dim)  # within session 17's static causal limit
    monkeypatch.setattr(workspace, "capturing", lambda device: True)  # capture, the table not made yet
    assert fa3._problem_config(None, q, k, True) == (static and persistent)
    fa3._TABLES[fa3._table_key(balanced, q, k, True)] = torch.zeros(1)  # made before the capture: the same grid
    assert fa3._problem_config(None, q, k, True) == balanced
    monkeypatch.setattr(workspace, "capturing", lambda device: False)
    for name in ("SHORT_BALANCED", "SHORT_MAX_SEQLEN_K_CAUSAL", "SHORT_MAX_SEQLEN_K"):
        monkeypatch.setattr(fa3, name, 0)
        assert fa3._problem_config(None, q, k, True) == (static and persistent if name == "SHORT_BALANCED" else None)
        assert not any(c.balanced for c in fa3._auto_configs(head_dim)), name


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_fixed_split_options_keep_the_short_persistent_grid(h200, split_enabled, monkeypatch, head_dim):
    """decode_config (``attention(..., num_splits=1)`` / ``pack_gqa=False``) of an unsplit, unpacked call runs the
    grid `auto` runs: the persistent one at short seqlen_k (short_config), the default elsewhere; before, a fixed
    option fell back to the one-CTA-per-tile default where `auto` ran the persistent grid."""
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K", 3072)
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K_CAUSAL", 1536)
    monkeypatch.setattr(fa3, "SHORT_BALANCED", True)
    q, k = _qk(32, 512, 16, 16, 512, head_dim)
    want = fa3._problem_config(None, q, k, False)
    assert (want is not None and want.persistent) is (head_dim in fa3.SHORT_HEAD_DIMS)
    for options in (dict(), dict(num_splits=1), dict(pack_gqa=False), dict(num_splits=1, pack_gqa=False)):
        assert fa3.decode_config(q, k, False, **options) == (want or fa3.DEFAULT_CONFIGS[head_dim]), options
    assert not fa3.decode_config(q, k, False, num_splits=2).persistent  # split: the split kernels
    q, k = _qk(32, 512, 16, 16, 3073, head_dim)
    assert fa3.decode_config(q, k, False, num_splits=1) == fa3.DEFAULT_CONFIGS[head_dim]
    q, k = _qk(32, 512, 16, 16, 1537, head_dim)  # causal: its own limits (static schedule 1536, balanced 4096 / 8192)
    balanced = dataclasses.replace(fa3.CAUSAL_CONFIGS[head_dim], persistent=True, balanced=True)
    assert fa3.decode_config(q, k, True, num_splits=1) == (balanced if head_dim != 96 else fa3.CAUSAL_CONFIGS[96])
    monkeypatch.setattr(fa3, "SHORT_BALANCED", False)
    assert fa3.decode_config(q, k, True, num_splits=1) == fa3.CAUSAL_CONFIGS[head_dim]
    assert fa3.decode_config(q, k, False, num_splits=1) == (want or fa3.DEFAULT_CONFIGS[head_dim])


def test_split_options_on_broadcast_kv_plan_for_the_head_the_kernel_sees(h200, split_enabled, monkeypatch):
    """K/V expanded across heads (stride 0) run as MQA on their first head (``api._plan``): ``pack_gqa=True`` at
    seqlen_q > 1 packs the whole group of that head (``api._config_k``), a config fa3's problem check accepts for
    the one-head K/V (it was made for the expanded heads: group 1, refused at the launch), and auto's lengths
    config packs too."""
    from fa_variants import api

    q = torch.empty(1, 4, 32, 128, device="meta", dtype=torch.bfloat16)
    k = torch.empty(1, 4096, 1, 128, device="meta", dtype=torch.bfloat16).expand(1, 4096, 32, 128)
    one = api._config_k(k, k)
    assert one.shape[2] == 1 and api._config_k(k.contiguous(), k.contiguous()).shape[2] == 32
    config = fa3.decode_config(q, one, True, pack_gqa=True)
    assert config.pack_gqa and config.pack_group == 32
    fa3._check_problem(config, q, one)
    assert fa3.lengths_config(q, one, True).pack_gqa


@pytest.mark.parametrize("with_lengths", [False, True])
def test_split_options_and_lengths_plans_get_the_one_head_of_broadcast_kv(monkeypatch, with_lengths):
    """``fa_variants.attention``'s split-option path (``_with_split_options``) and its lengths path
    (``_lengths_plan``) hand the config functions K as the kernel will read it: one head when K/V are expanded
    across heads (the kernel module and the backend choice stubbed; the call stops at the config)."""
    import types

    import fa_variants
    from fa_variants import api, dispatch

    seen = []

    class Stop(Exception):
        pass

    def record(q, k, causal, *args, **kwargs):
        seen.append(k.shape[2])
        raise Stop

    scaled = []
    scale_config = lambda config, q, k, causal, scale: scaled.append(k.shape[2]) or config  # noqa: E731
    module = types.SimpleNamespace(decode_config=record, lengths_config=record, scale_config=scale_config,
                                   VARIANT=types.SimpleNamespace(switches=lambda: ()))
    monkeypatch.setattr(api, "_kernel_module", lambda backend: module)
    monkeypatch.setattr(dispatch, "select_backend", lambda *a, **k: dispatch.Selection("fa3", "stub", ("fa3",)))
    q = torch.randn(2, 4, 32, 64)
    k = torch.randn(2, 50, 1, 64).expand(2, 50, 32, 64)
    lengths = torch.tensor([50, 7], dtype=torch.int32)
    with torch.no_grad(), pytest.raises(Stop):
        if with_lengths:
            fa_variants.attention(q, k, k, seqlens_k=lengths)
        else:
            fa_variants.attention(q, k, k, pack_gqa=True)
    assert seen == [1] and scaled == ([1] if with_lengths else [])


def test_decode_table_without_a_gpu_says_so_on_stderr(capsys, monkeypatch):
    """`bench --decode` on a machine without a GPU: exit 2 with its one line on stderr (it was on stdout)."""
    from fa_variants.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--decode", "--decode-nk", "1024", "--decode-nq", "1", "--decode-batch", "1"]) == 2
    captured = capsys.readouterr()
    assert "no CUDA GPU here" in captured.err and "no CUDA GPU here" not in captured.out


@pytest.mark.parametrize("name, tbps", [
    ("NVIDIA H200", 4.8), ("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H100 PCIe", 2.0), ("NVIDIA H100 NVL", 3.9),
    ("NVIDIA A100-SXM4-80GB", 2.039), ("NVIDIA A100-SXM4-40GB", 1.555), ("NVIDIA A100 80GB PCIe", 1.935),
    ("NVIDIA A100-PCIE-40GB", 1.555), ("NVIDIA H20", 4.0), ("NVIDIA B200", 8.0), ("NVIDIA H200 NVL", 4.8)])
def test_hbm_peak_follows_the_gpu(name, tbps):
    """The decode table's HBM % divides by the GPU's own peak (an H100's 3.35 TB/s, not the H200's 4.8: session 35 ran
    on an H100 with the H200's figure as the default)."""
    from fa_variants.bench.decode import peak_tbps

    assert peak_tbps(name) == (tbps, peak_tbps(name)[1]) and "datasheet" in peak_tbps(name)[1]


def test_hbm_peak_of_an_unknown_gpu(capsys, monkeypatch):
    """An unlisted name (or GH200, which comes with two memories): memory clock x bus width where torch reports
    them; else `bench --decode` stops with one line asking for --peak-tbps, and --peak-tbps is taken as given."""
    from types import SimpleNamespace

    from fa_variants.bench import decode
    from fa_variants.cli import main

    props = SimpleNamespace(memory_clock_rate=2_619_000, memory_bus_width=5120)  # kHz, bits: an H100 SXM's
    for name in ("NVIDIA GH200 480GB", "NVIDIA H20-3e", "NVIDIA A100-SXM-80GB", "NVIDIA A100X"):  # not the H20's
        tbps, source = decode.peak_tbps(name, props)  # 4.0 or an A100 40 GB's 1.555 (session 35's break-it pass)
        assert abs(tbps - 3.352) < 1e-3 and "bus width" in source, name
    with pytest.raises(ValueError, match="--peak-tbps"):
        decode.peak_tbps("Some Future GPU", SimpleNamespace())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some Future GPU")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: SimpleNamespace())
    argv = ["bench", "--decode", "--decode-nk", "1024", "--decode-nq", "1", "--decode-batch", "1",
            "--decode-head-dims", "64"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err and "--peak-tbps" in err and "Some Future GPU" in err
    measured = []
    monkeypatch.setattr(decode, "implementations", lambda ragged: {})
    monkeypatch.setattr(decode, "measure", lambda case, impls, peak, ragged: measured.append(peak) or [])
    assert main(argv + ["--peak-tbps", "2.5"]) == 0
    assert measured and set(measured) == {2.5} and "HBM peak 2.5 TB/s (--peak-tbps)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--decode", "--dtypes", "e4m3", "--head-dims", "256"], "--head-dims, --dtypes do not apply to --decode"),
    (["--decode", "--backends", "fa2", "--causal", "false"], "--backends, --causal do not apply to --decode"),
    (["--decode-nq", "4"], "--decode-nq does not apply without --decode"),
    (["--decode-head-dims", "64", "--decode-lengths"], "--decode-head-dims, --decode-lengths do not apply without")])
def test_bench_flags_of_the_other_table_are_refused(capsys, argv, message):
    """`bench --decode` read none of the sweep's flags and the sweep none of --decode-*'s: both were dropped without
    a word (session 28's break-it pass); now one line naming them, exit 2."""
    from fa_variants.cli import main

    assert main(["bench", "--dry-run", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err, err


def test_decode_takes_the_flags_it_shares_or_that_turn_nothing_on(capsys):
    """--decode with --quick, --out, --no-progress, --no-charts or --fp8-status off (nothing to run) is not refused."""
    from fa_variants.cli import main

    assert main(["bench", "--decode", "--dry-run", "--quick", "--no-progress", "--no-charts", "--fp8-status", "off",
                 "--causal", "both"]) == 0


@pytest.mark.parametrize("flag, value", [("--decode-nk", "99999999999999999999"), ("--decode-nq", "1048577"),
                                         ("--decode-batch", "65537")])
def test_decode_sizes_are_bounded(flag, value):
    """--decode-nk / --decode-nq at most 2^20 as --seqlens, --decode-batch at most 2^16: argparse's error (exit 2)."""
    from fa_variants.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--decode", "--dry-run", flag, value])
    assert exit_.value.code == 2


def test_huge_softmax_scale_leaves_auto_unsplit(h200, split_enabled):
    """|softmax_scale| above split.MAX_SPLIT_SCALE (2^64): fa3's ``scale_config`` (``Variant.scale_config``, which
    ``common.launch.launcher`` applies to every call without a config) gives `auto`'s config without a split (a
    split's partial LSE could overflow float32 and the merge gave NaN rows, session 33's break-it probe): packed
    decode unsplit; a shape auto does not split keeps auto's own config, fixed; at 2^64 and below the caller's None;
    a caller's config is kept; num_splits > 1 raises one line naming both."""
    from fa_variants.common import launch

    assert fa3.VARIANT.scale_config is fa3.scale_config and launch.Variant.scale_config is None  # others: no hook
    q, k = _qk(1, 1, 32, 8, 32768)
    assert fa3._problem_config(None, q, k, True).num_splits == 0  # auto splits this shape at a normal scale
    for scale in (0.1, 2.0 ** 64, 0.0):
        assert fa3.scale_config(None, q, k, True, scale) is None, scale
    for scale in (2.0 ** 64 * 1.01, 1e38):
        cfg = fa3.scale_config(None, q, k, True, scale)
        assert cfg.num_splits == 1 and cfg.pack_gqa and fa3.num_splits_for(cfg, q, k, True) == 1, scale
        assert fa3._problem_config(cfg, q, k, True) is cfg  # fixed: the launcher's problem_config keeps it
    q2, k2 = _qk(8, 512, 32, 8, 4096)  # prefill auto does not split: its own config, made explicit
    assert fa3.scale_config(None, q2, k2, True, 1e38) == (fa3._problem_config(None, q2, k2, True)
                                                           or fa3.default_config(fa3.ARCH, 128, True))
    forced = dataclasses.replace(fa3.DEFAULT_CONFIGS[128], num_splits=4)
    assert fa3.scale_config(forced, q, k, True, 1e38) is forced  # a caller's config is kept
    with pytest.raises(ValueError, match=r"^num_splits=4 with softmax_scale=1e\+38: .*num_splits=1 or None$"):
        split.check_split_scale(4, 1e38)
    for n, scale in ((1, 1e38), (None, -2e38), (4, 2.0 ** 64), (64, -0.5)):
        split.check_split_scale(n, scale)


class _FakeTimer:
    """A BurstTimer for ``bench.decode.paired_times``: fn() returns the entry's true ms per call; every burst
    takes it at a clock that alternates between two values (the paired ratio must not see it)."""

    def __init__(self):
        self.true, self.n = {}, 0

    def prepare(self, name, fn, burst_ms):
        self.true[name] = fn()
        return f"fake x {max(1, round(burst_ms / self.true[name]))}"

    def cycle(self, names):
        self.n += 1
        slow = 1.2 if self.n % 2 else 1.0
        return [(self.true[n] * slow, 1, 1980.0 / slow, 650.0) for n in names]


def test_decode_table_times_pairs_against_sdpa():
    """`bench --decode` times a case's implementations by the paired protocol (``paired_times``): per round medians,
    the ratio to SDPA from paired samples (both sides at the same clock), the timer's note and the clocks."""
    from fa_variants.bench import decode

    got = decode.paired_times({"sdpa (auto)": lambda: 2.0, "ours (auto)": lambda: 1.0}, "sdpa (auto)", _FakeTimer())
    ours, sdpa = got["ours (auto)"], got["sdpa (auto)"]
    assert len(ours["gpu_us_rounds"]) == decode.ROUNDS and ours["ratio_to_ref"] == pytest.approx(0.5)
    assert 1000 <= ours["gpu_us"] <= 1200 and 2000 <= sdpa["gpu_us"] <= 2400 and sdpa["ratio_to_ref"] == 1.0
    assert ours["timer"] == "fake x 5" and 1650 <= ours["sm_mhz"] <= 1980 and ours["power_w"] == 650.0
    alone = decode.paired_times({"ours (auto)": lambda: 1.0}, "sdpa (auto)", _FakeTimer())  # SDPA failed: no ratio
    assert "ratio_to_ref" not in alone["ours (auto)"] and alone["ours (auto)"]["gpu_us"] >= 1000


def test_decode_table_keeps_the_other_rows_when_one_implementation_fails(monkeypatch):
    """An implementation whose timing fails (here its burst preparation, as an out-of-memory graph would) gets the
    error in its own row; the others are timed paired as before (``bench.decode._timed``)."""
    from fa_variants.bench import decode

    class Failing(_FakeTimer):
        def prepare(self, name, fn, burst_ms):
            if name == "flash-attn-4":
                raise RuntimeError("CUDA out of memory")
            return super().prepare(name, fn, burst_ms)

    monkeypatch.setattr(decode, "_timer", Failing)
    got = decode._timed({"sdpa (auto)": lambda: 2.0, "ours (auto)": lambda: 1.0, "flash-attn-4": lambda: 3.0},
                        "sdpa (auto)")
    assert got["flash-attn-4"] == {"error": "RuntimeError: CUDA out of memory"}
    assert got["ours (auto)"]["ratio_to_ref"] == pytest.approx(0.5) and "error" not in got["sdpa (auto)"]
