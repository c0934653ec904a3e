"""``Sm90Config.cluster_merge`` without a GPU: the config's rules, `auto`'s plumbing behind
FA_VARIANTS_DECODE_CLUSTER_MERGE (off by default), and the kernel compiled for sm_90a (no spills, the cluster
barriers and distributed shared-memory loads in its SASS, no global partials, its launch's cluster shape)."""
import dataclasses
import re
import tempfile

import pytest
import torch

from fa_variants import registry
from fa_variants.common import cubin
from fa_variants.common.config import MAX_CLUSTER_SPLITS, Sm90Config

fa3 = pytest.importorskip("fa_variants.hopper.fa3")


def _decode_split(d: int = 64):
    return fa3.first_row(fa3.decode_tiles(fa3._PACKED_SPLIT_CONFIGS[d], d, "base", pdl=False), 8, True)


@pytest.mark.parametrize("splits", [0, 1, MAX_CLUSTER_SPLITS + 1])
def test_cluster_merge_needs_a_fixed_split_count_in_range(splits):
    with pytest.raises(ValueError, match="cluster_merge"):
        dataclasses.replace(_decode_split(), num_splits=splits, cluster_merge=True).check(64)


def test_cluster_merge_refuses_fused_merge_sm80_and_small_k_stages():
    cfg = dataclasses.replace(_decode_split(), num_splits=4, cluster_merge=True)
    assert cfg.check(64) is cfg and dataclasses.replace(cfg, num_splits=16).check(128)
    with pytest.raises(ValueError, match="cluster_merge"):
        dataclasses.replace(cfg, fused_merge=True, first_row_only=False).check(64)
    with pytest.raises(ValueError, match="cluster_merge"):
        cfg.check(64, "sm_80")
    with pytest.raises(ValueError, match="K stage buffers"):
        dataclasses.replace(cfg, tile_n=32).check(64)
    with pytest.raises(ValueError, match="cluster_merge"):
        Sm90Config(cluster_merge=1, num_splits=4).check(64)


def _meta(b, nq, nk, h, hkv, d):
    return (torch.empty(b, nq, h, d, dtype=torch.bfloat16, device="meta"),
            torch.empty(b, nk, hkv, d, dtype=torch.bfloat16, device="meta"))


@pytest.fixture
def heuristic(monkeypatch):
    """`auto` may split and pack; the split heuristic with 132 SMs (an H100/H200 without the GPU)."""
    from fa_variants.common import split

    monkeypatch.setattr(fa3, "SPLIT_KV_ENABLED", True)
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)
    monkeypatch.setattr(fa3, "_auto_splits", lambda ctas, n_blocks, index, min_tiles=None, per_sm=1:
                        split.num_splits_heuristic(ctas, n_blocks, 132 * per_sm, min_tiles=min_tiles))


@pytest.mark.parametrize("shape,splits", [((1, 1, 32768, 32, 8, 64), 16), ((1, 4, 32768, 64, 8, 64), 16),
                                          ((1, 1, 1024, 32, 8, 64), 8)], ids=["nq1", "nq4", "nk1k"])
def test_switch_makes_auto_split_decode_configs_cluster_merge(shape, splits, heuristic, monkeypatch):
    """Off (the default): `auto`'s config as before; on: the same config with the count fixed and cluster_merge,
    which plans like an unsplit call (the caller's O and LSE, no partials scratch, no merge step)."""
    q, k = _meta(*shape)
    assert fa3.DECODE_CLUSTER_MERGE is False or "FA_VARIANTS_DECODE_CLUSTER_MERGE" in __import__("os").environ
    monkeypatch.setattr(fa3, "DECODE_CLUSTER_MERGE", False)
    off = fa3._problem_config(None, q, k, True)
    assert not off.cluster_merge and off.num_splits == 0 and fa3.num_splits_for(off, q, k, True) == splits
    monkeypatch.setattr(fa3, "DECODE_CLUSTER_MERGE", True)
    on = fa3._problem_config(None, q, k, True)
    assert on == dataclasses.replace(off, num_splits=splits, cluster_merge=True)
    assert fa3.auto_num_splits(q, k, True) == splits
    prepare, finish = fa3._plan_call(on, q, k, k, 0.125)
    assert finish is None


def test_cluster_mode_leaves_unsplit_unpacked_and_fused_configs(heuristic):
    packed = fa3._PACKED_SPLIT_CONFIGS[64]
    assert fa3.cluster_mode(packed, 1, 64, on=True) is packed
    assert fa3.cluster_mode(packed, MAX_CLUSTER_SPLITS + 1, 64, on=True) is packed
    assert fa3.cluster_mode(packed, 16, 64, on=False) is packed
    assert fa3.cluster_mode(fa3._SPLIT_CONFIGS[64], 16, 64, on=True) is fa3._SPLIT_CONFIGS[64]
    fused = dataclasses.replace(packed, fused_merge=True)
    assert fa3.cluster_mode(fused, 16, 64, on=True) is fused
    on = fa3.cluster_mode(packed, 16, 64, on=True)
    assert on.cluster_merge and on.ctas_per_sm == 1


def test_cluster_mode_dual_two_ctas_per_sm_where_they_fit():
    """"dual": ctas_per_sm 2 at D 64 (74752 B twice fits an SM); D 128 with 128-key tiles does not fit twice: one
    CTA per SM; the 128-row (two warpgroup) tile keeps one."""
    d64 = fa3.cluster_mode(fa3._PACKED_SPLIT_CONFIGS[64], 16, 64, on="dual")
    assert d64.cluster_merge and d64.ctas_per_sm == 2 and d64.num_splits == 16
    d128 = fa3.cluster_mode(fa3._PACKED_SPLIT_CONFIGS[128], 16, 128, on="dual")
    assert d128.cluster_merge and d128.ctas_per_sm == 1
    wide = dataclasses.replace(fa3._PACKED_SPLIT_CONFIGS[64], tile_m=128, pingpong=True, pack_group=8)
    assert fa3.cluster_mode(wide, 16, 64, on="dual").ctas_per_sm == 1


@pytest.mark.compile
@pytest.mark.parametrize("head_dim,splits,group,per_sm", [(64, 16, 0, 1), (64, 2, 8, 1), (64, 16, 0, 2)],
                         ids=["d64-16-nq1", "d64-2-g8", "d64-16-nq1-dual"])
def test_cluster_merge_compiles_with_cluster_barriers_and_dsmem_loads(head_dim, splits, group, per_sm):
    """sm_90a: no spills; two cluster barriers (UCGABAR_ARV / _WAIT) in each role; the merge's loads from the
    peers' shared memory (ld.shared::cluster: LD.E through the cluster window, no LDG); no TMA store and no global
    atomics (the partials never leave the cluster); the launch asks for a cluster of ``splits`` CTAs."""
    import cutlass.cute as cute

    base = _decode_split(head_dim) if not group else dataclasses.replace(fa3._PACKED_SPLIT_CONFIGS[head_dim],
                                                                         pack_group=group)
    cfg = registry.static_config("fa3", "sm_90a", "bf16", head_dim, True,
                                 dataclasses.replace(base, num_splits=splits, cluster_merge=True, ctas_per_sm=per_sm))
    kernel, args = fa3._build(cfg)
    with tempfile.TemporaryDirectory(prefix="fa_variants_cubin_") as dump:
        compiled = cute.compile(kernel, *args, options=f"--gpu-arch sm_90a --keep-cubin --dump-dir {dump}")
    assert kernel.launch_cluster == [splits, 1, 1]
    blob = compiled.artifacts.CUBIN
    sass, res = cubin.sass_of(blob), cubin.cubin_resources(blob)
    counts = cubin.count_sass(sass)
    assert counts["LDL"] == counts["STL"] == 0 and res["spill_bytes"] == 0, (counts, res)
    assert len(re.findall(r"UCGABAR_ARV", sass)) >= 4 and len(re.findall(r"UCGABAR_WAIT", sass)) >= 4
    assert re.search(r"\bLD\.E\b", sass) and not re.search(r"\bLDG\.", sass) and "ATOMG" not in sass
    assert counts["UTMASTG"] == 0 and counts["HGMMA"] > 0
    if per_sm == 2:  # launched for two CTAs per SM: 128 registers, the consumer takes 232
        assert res["registers"] == 128 and "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8" in sass


def test_cluster_gpu_script_plan():
    """scripts/cluster_gpu.sh's pieces on the CPU (132 SMs): decode_ab --s10c times `cluster` at all 9 shapes, each
    with a cluster config of the count `auto` splits into, and `clusterdual` (two CTAs per SM) where it differs (not
    at D 128: 128-key tiles do not fit twice); the precompile list holds every kernel of that plan, the GPU tests'
    explicit ones, `auto`'s with the switch and the occupancy probe's, each once, within the cold budget (<= 40)."""
    import sys

    from helpers import load_script

    ab = load_script("decode_ab")
    rows = ab.plan(ab.S10C, ["cluster", "clusterdual"], 132, skip_same=True)
    assert [r["variant"] for r in rows].count("cluster") == len(ab.S10C) == 9
    assert [r["shape"][0] for r in rows if r["variant"] == "clusterdual"] == [64] * 8
    for r in rows:
        auto_cfg, auto_splits = ab.public_entry("shipped", r["shape"], 132)
        per_sm = 2 if r["variant"] == "clusterdual" else 1
        assert r["config"].cluster_merge and r["config"].num_splits == r["splits"] == auto_splits
        assert r["config"] == dataclasses.replace(auto_cfg, num_splits=auto_splits, cluster_merge=True,
                                                  ctas_per_sm=per_sm)
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    pre = load_script("cluster_precompile")
    todo = pre.items(["cluster", "clusterdual"], 132)
    assert len(todo) == len(set(todo)) <= 40
    assert {("fa3", r["shape"][0], True, r["config"]) for r in rows} <= set(todo)
    import test_cluster_merge_gpu as gpu_tests

    assert {("fa3", d, c, cfg) for d, c, cfg in gpu_tests.kernels()} <= set(todo)
    occupancy = load_script("cluster_occupancy")
    assert {("fa3", 64, True, occupancy.config(64, n)) for n in occupancy.SIZES} <= set(todo)
    assert ("fa3", 64, True, occupancy.config(64, 16, 2)) in todo
