"""Compile-only checks (no GPU) of the decode variants of fa3: the split-KV kernel (fp32 partial O and LSE
stored from registers, no TMA store) builds for every head dim, causal and not, with no register spills."""
import dataclasses

import pytest

from fa_variants import registry
from fa_variants.common import cubin

pytestmark = pytest.mark.compile

fa3 = pytest.importorskip("fa_variants.hopper.fa3")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_fa3_split_kv_compiles_without_spills(head_dim, causal):
    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[head_dim], num_splits=0)
    c = registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", head_dim, causal, config))
    counts = cubin.count_sass(cubin.sass_of(c.cubin))
    res = cubin.cubin_resources(c.cubin)
    assert counts["HGMMA"] > 0 and counts["UTMALDG"] > 0 and counts["USETMAXREG"] >= 2, counts
    assert counts["UTMASTG"] == 0, counts  # partials go out from registers
    assert counts["LDL"] == counts["STL"] == 0 and res["spill_bytes"] == 0, (counts, res)


@pytest.mark.parametrize("num_splits", [1, 0], ids=["whole", "split"])
def test_fa3_packed_gqa_compiles_unmasked_without_spills(num_splits):
    """Packed GQA (seqlen_q = 1) in its 64-row tile (one consumer warpgroup): the rows are query heads, so the
    causal kernel is the unmasked one (same instruction mix as causal=False), with no spills, split or not."""
    config = dataclasses.replace(fa3._PACKED_CONFIGS[128], num_splits=num_splits)  # 64-row tile
    counts = {}
    for causal in (False, True):
        c = registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", 128, causal, config))
        counts[causal] = cubin.count_sass(cubin.sass_of(c.cubin))
        res = cubin.cubin_resources(c.cubin)
        assert counts[causal]["LDL"] == counts[causal]["STL"] == 0 and res["spill_bytes"] == 0, (counts, res)
        assert counts[causal]["HGMMA"] > 0 and counts[causal]["USETMAXREG"] >= 2
    assert counts[True] == counts[False]


@pytest.mark.parametrize("head_dim,packed,causal", [(128, True, False), (64, False, True)],
                         ids=["packed-d128", "split-d64-causal"])
def test_fa3_fused_merge_compiles_without_spills(head_dim, packed, causal):
    """Sm90Config.fused_merge: the split kernel counts arrivals with a gpu-scope atomic between gpu-scope fences
    (MEMBAR.GPU; the acquire side invalidates L1: CCTL.IVALL) and merges with 16-byte loads, with no spills (the
    merge runs inside the consumer branch, after its register increase) and no TMA store."""
    import re

    base = fa3._PACKED_SPLIT_CONFIGS[head_dim] if packed else fa3._SPLIT_CONFIGS[head_dim]
    c = registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", head_dim, causal,
                                                 dataclasses.replace(base, fused_merge=True)))
    sass = cubin.sass_of(c.cubin)
    counts, res = cubin.count_sass(sass), cubin.cubin_resources(c.cubin)
    assert counts["LDL"] == counts["STL"] == 0 and res["spill_bytes"] == 0, (counts, res)
    assert re.search(r"ATOMG\.E\.ADD\.STRONG\.GPU", sass) and "MEMBAR.ALL.GPU" in sass and "CCTL.IVALL" in sass
    assert "LDG.E.128" in sass and counts["UTMASTG"] == 0 and counts["HGMMA"] > 0
    with pytest.raises(ValueError, match="fused_merge"):
        dataclasses.replace(base, num_splits=1, fused_merge=True).check(head_dim)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_split_merge_kernel_compiles(arch, head_dim):
    """common.split_combine: plain loads/stores, one ex2 per split in each of the two exp loops, one lg2; no
    spills; registry entry "split-merge" (compiled, never dispatched to)."""
    from fa_variants.common import split_combine

    c = registry.compiled(registry.static_config("split-merge", arch, "bf16", head_dim, False, split_combine.MergeConfig()))
    sass = cubin.sass_of(c.cubin)
    counts, res = cubin.count_sass(sass), cubin.cubin_resources(c.cubin)
    assert counts["LDL"] == counts["STL"] == 0 and res["spill_bytes"] == 0, (counts, res)
    assert counts["MUFU.EX2"] >= 2 and "MUFU.LG2" in sass and "STG.E.U16" in sass, counts
    assert "BAR.SYNC" in sass and "LDS" in sass  # the LSE partials staged in shared memory (one load per thread)
    assert counts["HMMA"] == counts["HGMMA"] == counts["UTMALDG"] == 0
    with pytest.raises(ValueError, match="head_dim"):
        split_combine.MergeConfig().check(80)


@pytest.mark.parametrize("head_dim,group,num_splits", [(128, 4, 0), (128, 4, 1), (64, 8, 0), (128, 128, 1)],
                         ids=["d128-g4-split", "d128-g4-whole", "d64-g8-split", "d128-g128-whole"])
def test_fa3_packed_rows_compile_without_spills(head_dim, group, num_splits):
    """Packed GQA at seqlen_q > 1 (pack_group: Q and O as ((G, seqlen_q)) rows, one 5-D TMA box of (G, 64 / G)
    or (64, 1) rows, causal masking by row // G): builds causal and not with no spills; causal adds the mask."""
    config = dataclasses.replace(fa3._PACKED_CONFIGS[head_dim], num_splits=num_splits, pack_group=group)
    counts = {}
    for causal in (True, False):
        c = registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", head_dim, causal, config))
        counts[causal] = cubin.count_sass(cubin.sass_of(c.cubin))
        res = cubin.cubin_resources(c.cubin)
        assert counts[causal]["LDL"] == counts[causal]["STL"] == 0 and res["spill_bytes"] == 0, (counts, res)
        assert counts[causal]["HGMMA"] > 0 and counts[causal]["UTMALDG"] > 0
        assert (counts[causal]["UTMASTG"] > 0) == (num_splits == 1)  # TMA store of O unless split (partials)
    assert counts[True] != counts[False]  # the causal kernel masks (per packed row's position)


@pytest.mark.parametrize("choice,head_dim", [("deep", 64), ("deep", 128), ("wide", 64), ("dual", 64), ("dual", 128)])
def test_decode_tiles_compile_without_spills(choice, head_dim):
    """fa3.DECODE_TILES (packed seqlen_q = 1: more stages, wider K/V tiles) build split with no spills; the split
    kernel lets the merge start early (griddepcontrol.launch_dependents: PREEXIT), the unsplit one has no such
    instruction (checked on the default packed config, compiled by the tests above)."""
    config = fa3.decode_tiles(fa3._PACKED_SPLIT_CONFIGS[head_dim], head_dim, choice)
    assert config != fa3._PACKED_SPLIT_CONFIGS[head_dim]
    c = registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", head_dim, True, config))
    counts, res = cubin.count_sass(cubin.sass_of(c.cubin)), cubin.cubin_resources(c.cubin)
    assert counts["LDL"] == counts["STL"] == 0 and res["spill_bytes"] == 0, (counts, res)
    assert counts["HGMMA"] > 0 and counts["USETMAXREG"] >= 2, counts
    assert "PREEXIT" in cubin.sass_of(c.cubin)
    if config.ctas_per_sm == 2:  # launched for two CTAs per SM: 128 registers, the consumer takes 232
        assert res["registers"] == 128 and "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8" in cubin.sass_of(c.cubin)
    whole = registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", 128, True, fa3._PACKED_CONFIGS[128]))
    assert "PREEXIT" not in cubin.sass_of(whole.cubin)


def test_split_merge_kernel_with_pdl_waits_for_the_split_grid():
    """MergeConfig(pdl=True): the merge waits for the grid before it (griddepcontrol.wait: ACQBULK) before its
    first global load; without pdl it does not wait."""
    from fa_variants.common import split_combine

    sass = {}
    for pdl in (False, True):
        c = registry.compiled(registry.static_config("split-merge", "sm_90a", "bf16", 128, False,
                                                     split_combine.MergeConfig(pdl=pdl)))
        sass[pdl] = cubin.sass_of(c.cubin)
    assert "ACQBULK" not in sass[False] and "ACQBULK" in sass[True]
    assert sass[True].index("ACQBULK") < sass[True].index("LDG")


def test_pdl_kernel_waits_before_its_loads():
    """Sm90Config.pdl: griddepcontrol.wait (ACQBULK) and launch_dependents (PREEXIT) before the first TMA load,
    no spills; the default packed kernels have no wait."""
    config = fa3.decode_tiles(fa3._PACKED_CONFIGS[64], 64, "base", pdl=True)
    assert config.pdl
    c = registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", 64, True, config))
    sass, res = cubin.sass_of(c.cubin), cubin.cubin_resources(c.cubin)
    assert res["spill_bytes"] == 0 and "ACQBULK" in sass and "PREEXIT" in sass
    assert sass.index("ACQBULK") < sass.index("UTMALDG")
    plain = registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", 128, True, fa3._PACKED_CONFIGS[128]))
    assert "ACQBULK" not in cubin.sass_of(plain.cubin)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_fa3_wide_packed_rows_compile_without_spills(head_dim):
    """fa3.PACK_WIDE's config (64:8 at Nq 16: 128 packed rows in one 128-row tile, two consumer warpgroups with
    ping-pong, the group in a (8, 16)-row TMA box): builds causal, split, with no spills, at both head dims
    `auto` takes it (``fa3.wide_helps``)."""
    config = dataclasses.replace(fa3._PACKED_SPLIT_CONFIGS[head_dim], tile_m=fa3.WIDE_TILE_M, pingpong=True,
                                 pack_group=8)
    c = registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", head_dim, True, config.check(head_dim)))
    counts = cubin.count_sass(cubin.sass_of(c.cubin))
    res = cubin.cubin_resources(c.cubin)
    assert counts["LDL"] == counts["STL"] == 0 and res["spill_bytes"] == 0, (counts, res)
    assert counts["HGMMA"] > 0 and counts["UTMALDG"] > 0 and counts["UTMASTG"] == 0


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_warp_merge_compiles_without_shared_memory_or_spills(arch):
    """split_combine.MergeConfig(warp=True): LSEs in registers and warp shuffles, so no shared memory and no
    barrier, one MUFU.EX2 per LSE pass (not one per split per thread), no spills; sm_80 too (fa2's merge)."""
    from fa_variants.common import split_combine

    cfg = registry.static_config("split-merge", arch, "bf16", 128, False, split_combine.MergeConfig(warp=True))
    c = registry.compiled(cfg)
    counts = cubin.count_sass(cubin.sass_of(c.cubin))
    res = cubin.cubin_resources(c.cubin)
    assert res["spill_bytes"] == 0 and counts["LDL"] == counts["STL"] == 0, (counts, res)
    assert res["smem_static_bytes"] == 0 and c.smem_dynamic_bytes == 0 and counts["MUFU.EX2"] <= 6, (counts, res)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_first_row_only_halves_the_softmax(head_dim):
    """Sm90Config.first_row_only (FA_VARIANTS_DECODE_FIRST_ROW, packed seqlen_q = 1 with <= 8 rows): the split
    decode kernel has half the MUFU.EX2, FMNMX and SHFL of the same config without it (the padding row's
    exponentials, row max and quad reductions gone), its HGMMAs and TMA loads unchanged, no spills."""
    base = fa3._PACKED_SPLIT_CONFIGS[head_dim]
    counts = {}
    for on in (False, True):
        config = dataclasses.replace(base, first_row_only=on).check(head_dim)
        c = registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", head_dim, True, config))
        ops = cubin.SASS_OPCODES + ("FMNMX", "SHFL")
        counts[on], res = cubin.count_sass(cubin.sass_of(c.cubin), ops), cubin.cubin_resources(c.cubin)
        assert counts[on]["LDL"] == counts[on]["STL"] == 0 and res["spill_bytes"] == 0, (counts[on], res)
    for op in ("MUFU.EX2", "FMNMX", "SHFL"):
        assert 2 * counts[True][op] <= counts[False][op] + 2, (op, counts)
    assert counts[True]["HGMMA"] == counts[False]["HGMMA"] and counts[True]["UTMALDG"] == counts[False]["UTMALDG"]
