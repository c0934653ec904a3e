"""fa2's split-KV kernel compiles for sm_80 without a GPU (``fa-variants compile --num-splits``), without
register spills, with the tensor-core and cp.async work of the unsplit kernel; the merge kernel builds for the
sm80-class archs fa2 runs on."""
import pytest

from fa_variants import cli

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("head_dim, causal", [(128, True), (64, False)], ids=["D128-causal", "D64"])
def test_split_kernel_compiles_without_spills(compile_cli, head_dim, causal):
    flags = ["--causal"] if causal else []
    split = compile_cli("--arch", "sm_80", "--variant", "fa2", "--head-dim", str(head_dim), "--dtype", "bf16",
                        "--sass", "--num-splits", "0", *flags)
    assert split["tiles"]["num_splits"] == 0
    assert split["spill_bytes"] == 0 and split["LDL"] == 0 and split["STL"] == 0
    assert split["HMMA"] > 0 and split["LDGSTS"] > 0 and split["LDSM"] > 0
    # any count != 1 is the same kernel (the count is read at run time)
    again = compile_cli("--arch", "sm_80", "--variant", "fa2", "--head-dim", str(head_dim), "--dtype", "bf16",
                        "--num-splits", "5", *flags)
    assert again["registers"] == split["registers"] and again["tiles"]["num_splits"] == 5


def test_merge_kernel_compiles_for_sm86(compile_cli):
    r = compile_cli("--arch", "sm_86", "--variant", "split-merge", "--head-dim", "128", "--dtype", "bf16", "--sass")
    assert r["spill_bytes"] == 0 and r["LDL"] == 0 and r["STL"] == 0


def test_num_splits_flag_needs_a_split_kernel(capsys):
    rc = cli.main(["compile", "--arch", "sm_80", "--variant", "fa1", "--head-dim", "64", "--dtype", "bf16",
                   "--num-splits", "2"])
    assert rc == 2 and "split" in capsys.readouterr().err


def test_packed_split_kernel_compiles_without_spills():
    """Packed GQA at seqlen_q = 1 (causal asked: the packed kernel runs unmasked) with split-KV."""
    from fa_variants.ampere import fa2
    from fa_variants.commands.compile import compile_only

    r = compile_only("fa2", "sm_80", 128, "bf16", True, True, fa2.split_config("sm_80", 128, 0, pack=True))
    assert r["tiles"]["pack_gqa"] and r["spill_bytes"] == 0 and r["LDL"] == 0 and r["STL"] == 0


def test_narrow_unsplit_kernel_compiles_without_spills():
    """``fa2.narrow_config`` (FA_VARIANTS_FA2_NARROW_DECODE: few-row queries in 64 x 64 tiles, unsplit), causal."""
    from fa_variants.ampere import fa2
    from fa_variants.commands.compile import compile_only

    cfg = fa2.narrow_config("sm_80", 128)
    assert (cfg.tile_m, cfg.tile_n, cfg.num_splits, cfg.pack_gqa) == (64, 64, 1, False)
    r = compile_only("fa2", "sm_80", 128, "bf16", True, True, cfg)
    assert r["tiles"]["tile_m"] == 64 and r["tiles"]["num_splits"] == 1
    assert r["spill_bytes"] == 0 and r["LDL"] == 0 and r["STL"] == 0 and r["HMMA"] > 0


@pytest.mark.parametrize("split", [False, True], ids=["unsplit", "split"])
def test_seqlens_k_kernel_compiles_without_spills(split):
    """Sm80Config.seqlens_k (per-sequence KV lengths read by the kernel, ``ampere.fa2.lengths_config``) and leftpad_k
    with it (each sequence's first key too): the unsplit and split kernels build for sm_80 with no spills and the
    same tensor-core work; leftpad_k needs seqlens_k; fa1 refuses the switch."""
    import dataclasses

    from fa_variants import registry
    from fa_variants.ampere import fa1, fa2
    from fa_variants.common import cubin

    base = fa2.split_config("sm_80", 128, 0, False) if split else fa2.default_config("sm_80", 128, True)
    configs = (base, dataclasses.replace(base, seqlens_k=True), dataclasses.replace(base, seqlens_k=True, leftpad_k=True))
    counts = [cubin.count_sass(cubin.sass_of(registry.compiled(registry.static_config(
        "fa2", "sm_80", "bf16", 128, True, config)).cubin)) for config in configs]
    for got in counts[1:]:  # the lengths, then the lengths with each sequence's first key (Sm80Config.leftpad_k)
        assert got["HMMA"] == counts[0]["HMMA"] > 0, counts
    assert counts[1]["LDL"] == counts[1]["STL"] == 0, counts
    # leftpad_k unsplit: one register kept across the K/V loop goes to local memory (one store before the loop, one
    # load after it, session 54's build: a few bytes per CTA, none in the loop); more would be a regression
    assert counts[2]["LDL"] == counts[2]["STL"] <= (0 if split else 1), counts
    with pytest.raises(ValueError, match="leftpad_k"):
        dataclasses.replace(base, leftpad_k=True).check("sm_80", 128)
    with pytest.raises(ValueError, match="seqlens_k"):
        fa1.VARIANT.check_config(dataclasses.replace(fa1.default_config("sm_80", 128, True), seqlens_k=True), "sm_80", 128)
