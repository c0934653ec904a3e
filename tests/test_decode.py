"""Decode dispatch on the CPU (no GPU): when fa3 splits K/V, with which count, and what `config=` forces."""
import dataclasses

import pytest
import torch

from fa_variants.common import split

fa3 = pytest.importorskip("fa_variants.hopper.fa3")


@pytest.fixture
def h200(monkeypatch):
    """132 SMs, whatever this machine has (the heuristic's cache is emptied around the test)."""
    monkeypatch.setattr(split, "sm_count", lambda index: 132)
    fa3._auto_splits.cache_clear()
    yield
    fa3._auto_splits.cache_clear()


def _qk(batch, seqlen_q, heads, heads_kv, seqlen_k, head_dim=128):
    return (torch.empty(batch, seqlen_q, heads, head_dim, device="meta"),
            torch.empty(batch, seqlen_k, heads_kv, head_dim, device="meta"))


def test_switch_off_auto_never_splits_but_a_config_does(h200, monkeypatch):
    """fa3.SPLIT_KV_ENABLED False (FA_VARIANTS_SPLIT_KV=0): `auto` never splits (bitwise batch invariance,
    docs/edge_cases.md EC-19); an explicit config's num_splits still applies."""
    monkeypatch.setattr(fa3, "SPLIT_KV_ENABLED", False)
    q, k = _qk(1, 1, 32, 8, 32768)
    assert fa3._problem_config(None, q, k, True) is None and fa3.auto_num_splits(q, k, True) == 1
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
    assert cfg is not None and cfg.num_splits == 0 and cfg.tile_m == fa3.DEFAULT_CONFIGS[head_dim].tile_m
    assert fa3.num_splits_for(cfg, q, k, True) > 1
    q, k = _qk(8, 4096, 32, 8, 4096, head_dim)  # prefill fills the GPU: the tuned default, unsplit
    assert fa3._problem_config(None, q, k, True) is None
    q, k = _qk(64, 1, 64, 8, 128, head_dim)  # 64 x 64 CTAs: already full
    assert fa3._problem_config(None, q, k, False) is None


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
