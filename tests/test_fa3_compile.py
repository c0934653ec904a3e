"""FA3 (sm90) compile-only checks, no GPU: the kernel builds for every head dim and its SASS has the
Hopper features issue 5 asks for (WGMMA, TMA loads and stores, register reallocation) and no spills.

`fa-variants compile --arch sm_90a --variant fa3 --head-dim D --dtype bf16 --sass` must report
HGMMA > 0, UTMALDG > 0, USETMAXREG > 0 and LDL = STL = 0 (each compile is cached per process).
"""
import dataclasses
import re

import pytest

from fa_variants import registry
from fa_variants.common import cubin

pytestmark = pytest.mark.compile

fa3 = pytest.importorskip("fa_variants.hopper.fa3")


def _assert_hopper_kernel(r):
    assert r["HGMMA"] > 0, r  # S = Q K^T and O += P V on warpgroup MMAs
    assert r["UTMALDG"] > 0 and r["UTMASTG"] > 0, r  # TMA loads (Q, K, V) and the TMA store of O
    assert r["USETMAXREG"] >= 2, r  # producer gives registers back, consumers take them
    assert r["HMMA"] == 0 and r["LDGSTS"] == 0, r  # no Ampere paths
    assert r["LDL"] == 0 and r["STL"] == 0 and r["spill_bytes"] == 0, r
    assert r["MUFU.EX2"] > 0, r  # exp2 softmax
    assert r["smem_bytes"] <= 227 * 1024, r


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_cli_sass_bf16(compile_cli, head_dim, causal):
    r = compile_cli("--arch", "sm_90a", "--variant", "fa3", "--head-dim", str(head_dim), "--dtype", "bf16", "--sass",
                  *(["--causal"] if causal else []))
    assert r["variant"] == "fa3" and r["head_dim"] == head_dim and r["causal"] == causal
    assert r["tiles"] == dataclasses.asdict(fa3.default_config("sm_90a", head_dim, causal))  # D 256 causal: its own
    _assert_hopper_kernel(r)


def test_cli_sass_fp16_causal(compile_cli):
    r = compile_cli("--arch", "sm_90a", "--variant", "fa3", "--head-dim", "128", "--dtype", "fp16", "--causal", "--sass")
    _assert_hopper_kernel(r)


@pytest.mark.parametrize("change", [dict(pingpong=False), dict(intra_wg_overlap=False),
                                    dict(pingpong=False, intra_wg_overlap=False)], ids=["no-pingpong", "no-overlap", "neither"])
def test_ablation_configs_compile(change):
    """The FA3 Table 2 ablation variants build and keep the Hopper features."""
    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[128], **change)
    c = registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", 128, True, config))
    counts = cubin.count_sass(cubin.sass_of(c.cubin))
    assert counts["HGMMA"] > 0 and counts["USETMAXREG"] >= 2 and counts["LDL"] == counts["STL"] == 0, counts


def test_config_limits():
    with pytest.raises(ValueError, match="shared memory"):
        fa3.Fa3Config(tile_n=128, stages=2).check(256)  # 64 KiB Q + 4 x 64 KiB K/V does not fit
    with pytest.raises(ValueError, match="tile_m"):
        fa3.Fa3Config(tile_m=64).check(128)
    for d, cfg in fa3.DEFAULT_CONFIGS.items():
        cfg.check(d)
    with pytest.raises(registry.UnsupportedConfigError, match="head_dim 80"):
        registry.static_config("fa3", "sm_90a", "bf16", 80, False)
    with pytest.raises(registry.UnsupportedConfigError, match="arch sm_80"):
        registry.static_config("fa3", "sm_80", "bf16", 128, False)
    # issue 12, round 3: the overlapped steps' deferred rescale, own V state
    with pytest.raises(ValueError, match="intra_wg_overlap"):
        fa3.Fa3Config(intra_wg_overlap=False, rescale_o_before_pv=True).check(128)
    with pytest.raises(ValueError, match="shared_kv_state"):
        fa3.Fa3Config(shared_kv_state=True, rescale_o_before_pv=True).check(128)
    with pytest.raises(ValueError, match="shared_kv_state"):  # issue 12, round 4: K first, separate states
        fa3.Fa3Config(shared_kv_state=True, k_before_q=True).check(128)
    fa3.Fa3Config(tile_n=176, convert_pairs=True).check(128)  # 32 KiB Q + 4 x 44 KiB K/V
    fa3.Fa3Config(stages=3).check(128)  # 32 KiB Q + 6 x 32 KiB K/V + 1 KiB: 225 KiB of 227
    for bad in (dict(exp2_ffma=False), dict(exp2_ffma=True, alpha_first=1)):
        with pytest.raises(ValueError, match="alpha_first"):  # session 8: alpha before the exponentials
            fa3.Fa3Config(**dict(dict(alpha_first=True), **bad)).check(128)


def test_d256_default_converts_p_in_pairs():
    """Session 9's flip (pairs-256/new 1.025 / 1.020 at N 4k / 16k non-causal on an H200) and session 19's causal
    exception (old / new 1.035-1.089 at causal N 2k-16k): what a plain call compiles at D 256 (the registry's key with
    no config: the variant's default_config) converts P and O in pairs when not causal, per value when causal, and so
    do the persistent configs `auto` gives causal D 256 calls; a split call keeps pairs; the other head dims and the
    packed decode tiles (not timed) keep the per-value conversion; scripts/fa3_speed_ab.py's `old` keeps the pre-flip
    D 256 kernel, its `new` follows the call's causality, `pairs-256` is the non-causal default."""
    key = registry.static_config("fa3", "sm_90a", "bf16", 256, False)
    assert key.config.convert_pairs and key.config.tile_n == 80, key.config
    causal = registry.static_config("fa3", "sm_90a", "bf16", 256, True).config
    assert causal == dataclasses.replace(key.config, convert_pairs=False) == fa3.CAUSAL_CONFIGS[256]
    assert not fa3._SHORT_CONFIGS[256, True].convert_pairs and (256, False) not in fa3._SHORT_CONFIGS
    assert all(not c.convert_pairs for c in fa3._short_configs(256, True)) and fa3._short_configs(256, False) == ()
    for d in (64, 96, 128):
        assert fa3.CAUSAL_CONFIGS[d] == fa3.DEFAULT_CONFIGS[d], d
        for c in (False, True):
            assert not registry.static_config("fa3", "sm_90a", "bf16", d, c).config.convert_pairs, d
    assert fa3._SPLIT_CONFIGS[256].convert_pairs and not fa3._PACKED_CONFIGS[256].convert_pairs
    ab = _speed_ab()
    assert ab.variant_config("pairs-256", 256) == fa3.DEFAULT_CONFIGS[256]
    assert ab.variant_config("pairs-256", 256, True) == fa3.DEFAULT_CONFIGS[256]
    assert ab.variant_config("new", 256, True) == fa3.CAUSAL_CONFIGS[256] == ab.variant_config("old", 256, True)
    old = ab.variant_config("old", 256)
    assert old == dataclasses.replace(fa3.DEFAULT_CONFIGS[256], convert_pairs=False)  # exp2 etc. were off at D 256
    assert all(ab.variant_config("old", d) == dataclasses.replace(fa3.DEFAULT_CONFIGS[d], **ab.OLD) for d in (64, 128))
    assert "pairs-256" not in ab.ROUND4 + ab.FA3GAP + ab.GAP9 and "early" not in ab.VARIANTS


def test_bench_fa3_ablations_are_valid_configs():
    """fa_variants.commands.bench_fa3's --ablation and --sweep changes make configs fa3 accepts at every head dim
    they run at (exact-exp2 turns alpha_first off with exp2_ffma: D 128's default since session 8 needs both)."""
    pytest.importorskip("torch")
    from fa_variants.commands import bench_fa3

    for head_dim, base in fa3.DEFAULT_CONFIGS.items():
        for change in list(bench_fa3.ABLATIONS.values()) + list(bench_fa3.SWEEP.get(head_dim, {}).values()):
            dataclasses.replace(base, **change).check(head_dim)


def test_tma_operand_preparation():
    """Inputs TMA can read are passed as they are; broadcasts and misaligned views are copied."""
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 64, 4, 128, dtype=torch.bfloat16)
    assert fa3._tma_operand(x).data_ptr() == x.data_ptr()
    wide = torch.randn(2, 64, 4, 256, dtype=torch.bfloat16)[..., :128]  # row stride 2*H*D: fine
    assert fa3._tma_operand(wide).data_ptr() == wide.data_ptr()
    b = torch.randn(1, 64, 4, 128, dtype=torch.bfloat16).expand(3, 64, 4, 128)  # batch stride 0
    prepared = fa3._tma_operand(b)
    assert prepared.stride(0) != 0 and torch.equal(prepared, b)
    odd = torch.randn(2, 64, 4, 129, dtype=torch.bfloat16)[..., 1:]  # misaligned base and strides
    prepared = fa3._tma_operand(odd)
    assert prepared.is_contiguous() and torch.equal(prepared, odd)
    single = torch.randn(1, 64, 1, 128, dtype=torch.bfloat16)[:, :, :1]  # length-1 dims: any stride
    assert all(s % 8 == 0 and s > 0 for s in fa3._tma_operand(single).stride()[:-1])


def _speed_ab():
    from helpers import load_script

    return load_script("fa3_speed_ab")


@pytest.mark.parametrize("name, head_dim, causal", [
    ("old", 128, False), ("new", 64, True), ("new", 256, False), ("lean", 64, True), ("lean", 128, False),
    ("lean", 128, True), ("lean-256", 256, True), ("o-before-pv", 256, True),
    ("old", 256, False), ("fa4-256", 256, True), ("n176", 128, False), ("n176", 128, True),
    ("stages3", 64, True), ("stages3", 128, False), ("k-first", 128, True), ("alpha", 128, True),
    ("alpha-noskip", 64, True)])
def test_speed_ab_variants_compile_without_spills(name, head_dim, causal):
    """scripts/fa3_speed_ab.py's variants build with no spills; `new` is the default and has no serial FMNMX
    chain (it runs 4 chains) and one FFMA per score instead of FADD + FMUL. `lean` (issue 12's structural
    switches): O is never zero-filled (no CS2R) and only the storing warp waits at the epilogue's second
    barrier (one more BAR.ARV than the default)."""
    ab = _speed_ab()
    config = ab.variant_config(name, head_dim, causal)
    ops = cubin.SASS_OPCODES + ("FFMA", "FMUL", "CS2R", "BAR.ARV")
    counts = cubin.count_sass(cubin.sass_of(_compiled(head_dim, causal, config).cubin), ops)
    assert counts["LDL"] == counts["STL"] == 0 and counts["HGMMA"] > 0, counts
    if name == "new":
        assert config == fa3.default_config("sm_90a", head_dim, causal)
    if config.exp2_ffma:  # (the D 256 default keeps the exact form: measured faster there)
        assert counts["FFMA"] >= counts["MUFU.EX2"] - 8, counts  # one FFMA per exponent (+ a few per row)
    if name.startswith("lean"):
        default = cubin.count_sass(cubin.sass_of(_compiled(head_dim, causal, fa3.DEFAULT_CONFIGS[head_dim]).cubin), ops)
        assert counts["BAR.ARV"] == default["BAR.ARV"] + 1, (counts, default)
        if config.first_pv_overwrites:
            assert default["CS2R"] > 0 and counts["CS2R"] == 0, (counts, default)


@pytest.mark.parametrize("kind", ["plain", "split", "fused"])
def test_seqlens_k_kernels_compile_without_spills(kind):
    """Sm90Config.seqlens_k (per-sequence KV lengths read by the kernel): the prefill kernel, the packed split kernel
    and its fused-merge form build with no spills; the clear of V's rows past a length syncs its warpgroup (one
    BAR.SYNC more than the same kernel without the lengths, whose SASS it otherwise leaves alone)."""
    base = {"plain": fa3.default_config("sm_90a", 128, True), "split": fa3._PACKED_SPLIT_CONFIGS[128],
            "fused": dataclasses.replace(fa3._PACKED_SPLIT_CONFIGS[128], fused_merge=True, first_row_only=False)}[kind]
    ops = cubin.SASS_OPCODES + ("BAR.SYNC",)
    counts = cubin.count_sass(cubin.sass_of(_compiled(128, True, dataclasses.replace(base, seqlens_k=True)).cubin), ops)
    plain = cubin.count_sass(cubin.sass_of(_compiled(128, True, base).cubin), ops)
    assert counts["LDL"] == counts["STL"] == 0 and counts["HGMMA"] == plain["HGMMA"] > 0, counts
    assert counts["BAR.SYNC"] > plain["BAR.SYNC"], (counts, plain)


@pytest.mark.parametrize("kind", ["plain", "split", "fused"])
def test_leftpad_k_kernels_compile_without_spills(kind):
    """Sm90Config.leftpad_k (each sequence's first key read by the kernel, K and V viewed from it): the prefill, packed
    split and fused-merge kernels build with no spills and the lengths kernel's tensor-core work and barriers (the
    window moves the TMA boxes' coordinates only); the switch needs seqlens_k."""
    base = {"plain": fa3.default_config("sm_90a", 128, True), "split": fa3._PACKED_SPLIT_CONFIGS[128],
            "fused": dataclasses.replace(fa3._PACKED_SPLIT_CONFIGS[128], fused_merge=True, first_row_only=False)}[kind]
    lengths = dataclasses.replace(base, seqlens_k=True)
    ops = cubin.SASS_OPCODES + ("BAR.SYNC",)
    counts, plain = (cubin.count_sass(cubin.sass_of(_compiled(128, True, config).cubin), ops)
                     for config in (dataclasses.replace(lengths, leftpad_k=True), lengths))
    assert counts["LDL"] == counts["STL"] == 0 and counts["HGMMA"] == plain["HGMMA"] > 0, counts
    assert counts["BAR.SYNC"] == plain["BAR.SYNC"], (counts, plain)
    with pytest.raises(ValueError, match="leftpad_k"):
        dataclasses.replace(base, leftpad_k=True).check(128)


def test_seqlens_k_config_limits():
    """The lengths are read per CTA from its batch: not on the persistent grid (its balanced table is made for the
    padded length), nor on fa3-fp8 (its descale tables are per padded K/V block)."""
    with pytest.raises(ValueError, match="seqlens_k"):
        fa3.Fa3Config(persistent=True, seqlens_k=True).check(128)
    from fa_variants.hopper import fa3_fp8

    with pytest.raises(ValueError, match="seqlens_k"):
        dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], seqlens_k=True).check(128)


def _compiled(head_dim, causal, config):
    return registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", head_dim, causal, config))


def _mainloop_length(sass: str) -> int:
    return len(_mainloop(sass))


def _mainloop(sass: str) -> list[str]:
    """Instructions in the consumers' K/V mainloop: the first (by address) branch-back span of more than 200
    instructions (shorter: the producer's loop; later: the out-of-line mbarrier retries after the kernel's
    exit, which branch back into the code above them)."""
    import re

    labels, addrs, texts, out = {}, [], [], []
    pending = None
    for line in sass.splitlines():
        label = re.match(r"\s*\.(L_x_\d+):", line)
        if label:
            pending = label.group(1)
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if not m:
            continue
        addr = int(m.group(1), 16)
        if pending:
            labels[pending], pending = addr, None
        addrs.append(addr)
        texts.append(m.group(2))
        target = re.search(r"BRA\s+`\(\.(L_x_\d+)\)", m.group(2))
        if target and labels.get(target.group(1), addr + 1) < addr:
            span = [t for a, t in zip(addrs, texts) if labels[target.group(1)] <= a <= addr]
            if len(span) > 200:
                out.append(span)
    return out[0]


def test_convert_pairs_packs_p():
    """Issue 12, round 4: at D 256 (64 x 80 scores per warpgroup) the whole-fragment conversion of P gives one F2FP
    per value and a PRMT per pair (nvidia-cutlass-dsl 4.8.1); Sm90Config.convert_pairs (the D 256 default since
    session 9) gives one packed F2FP per pair and no PRMT, the mainloop otherwise unchanged (non-causal: one mainloop)."""
    assert fa3.DEFAULT_CONFIGS[256].convert_pairs
    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[256], convert_pairs=False)

    def counts(cfg):
        loop = _mainloop(cubin.sass_of(_compiled(256, False, cfg).cubin))
        return len(loop), sum(t.split()[0].startswith("F2FP") for t in loop), sum(t.split()[0] == "PRMT" for t in loop)

    n_base, f2fp_base, prmt_base = counts(config)
    n_pairs, f2fp_pairs, prmt_pairs = counts(dataclasses.replace(config, convert_pairs=True))
    values = 64 * 80 // 128  # P values per thread per K/V tile
    assert f2fp_pairs == values // 2 and prmt_pairs == 0, (f2fp_pairs, prmt_pairs)
    assert f2fp_base == values and prmt_base == values // 2, (f2fp_base, prmt_base)  # 529 -> 487 instructions
    assert n_pairs <= n_base - values, (n_base, n_pairs)


def test_shared_kv_state_shortens_the_mainloop():
    """One pipeline state for K and V (Sm90Config.shared_kv_state) drops the second state's advance (index,
    phase, count: uniform-pipe instructions) from every K/V tile of the consumer mainloop (D 128, non-causal:
    one mainloop)."""
    config = fa3.DEFAULT_CONFIGS[128]
    base = _mainloop_length(cubin.sass_of(_compiled(128, False, config).cubin))
    shared = _mainloop_length(cubin.sass_of(_compiled(128, False, dataclasses.replace(config, shared_kv_state=True)).cubin))
    assert 400 < shared < base, (base, shared)  # 563 -> 559 (nvidia-cutlass-dsl 4.8.1)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_persistent_compiles_without_spills(head_dim, causal):
    """Sm90Config.persistent (scripts/fa3_speed_ab.py's `persistent`): no spills, the Hopper features, the grid size
    read at run time (the static schedule's stride, gridDim.x: c[0x0][0xc]); O in its own shared-memory buffer at
    D 64/128 (Q's is loaded with the next tile's Q during the epilogue), in Q's at D 256 (no room)."""
    config = _speed_ab().variant_config("persistent", head_dim)
    assert config == dataclasses.replace(fa3.DEFAULT_CONFIGS[head_dim], persistent=True)
    compiled = _compiled(head_dim, causal, config)
    sass = cubin.sass_of(compiled.cubin)
    _assert_hopper_kernel(dict(cubin.count_sass(sass), smem_bytes=compiled.smem_dynamic_bytes,
                               spill_bytes=cubin.cubin_resources(compiled.cubin)["spill_bytes"]))
    assert "c[0x0][0xc]" in sass
    assert config.separate_o(head_dim) == (head_dim < 256)
    assert compiled.smem_dynamic_bytes == config.smem_bytes(head_dim)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_persistent_m128_compiles_without_spills(causal):
    """scripts/fa3_speed_ab.py's `persistent-m128` (session 16, short prefill at D 64: 128-row tiles in the persistent
    grid; since session 17 what `auto` runs for D 64 causal calls up to 1024 keys): no spills, the Hopper features, O
    in its own buffer."""
    config = _speed_ab().variant_config("persistent-m128", 64)
    assert config == dataclasses.replace(fa3.DEFAULT_CONFIGS[64], persistent=True, tile_m=128)
    assert config == fa3._SHORT_NARROW_CONFIGS[64]
    compiled = _compiled(64, causal, config)
    sass = cubin.sass_of(compiled.cubin)
    _assert_hopper_kernel(dict(cubin.count_sass(sass), smem_bytes=compiled.smem_dynamic_bytes,
                               spill_bytes=cubin.cubin_resources(compiled.cubin)["spill_bytes"]))
    assert config.separate_o(64) and compiled.smem_dynamic_bytes == config.smem_bytes(64)


@pytest.mark.parametrize("head_dim, causal", [(64, False), (128, True), (256, True)])
def test_balanced_compiles_without_spills(head_dim, causal):
    """scripts/fa3_speed_ab.py's `balanced` (session 17: the persistent grid reading its tiles from the host's table,
    Sm90Config.balanced): no spills, the Hopper features, and the table read once per role before the loop and once
    per tile in it (4 LDG: the producer warp and the consumers; the persistent grid has none); the static persistent
    kernel is the same code as before the table (its SASS did not change, checked when the table came in)."""
    config = _speed_ab().variant_config("balanced", head_dim)
    assert config == dataclasses.replace(fa3.DEFAULT_CONFIGS[head_dim], persistent=True, balanced=True)
    compiled = _compiled(head_dim, causal, config)
    sass = cubin.sass_of(compiled.cubin)
    _assert_hopper_kernel(dict(cubin.count_sass(sass), smem_bytes=compiled.smem_dynamic_bytes,
                               spill_bytes=cubin.cubin_resources(compiled.cubin)["spill_bytes"]))
    loads = [line for line in sass.splitlines() if " LDG." in line]
    assert len(loads) == 4, loads
    static = cubin.sass_of(_compiled(head_dim, causal, dataclasses.replace(config, balanced=False)).cubin)
    assert not [line for line in static.splitlines() if " LDG." in line]


def test_persistent_fp16_compiles():
    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[128], persistent=True)
    c = registry.compiled(registry.static_config("fa3", "sm_90a", "fp16", 128, True, config))
    counts = cubin.count_sass(cubin.sass_of(c.cubin))
    assert counts["LDL"] == counts["STL"] == 0 and counts["HGMMA"] > 0, counts


def test_alpha_first_refused_by_fa3_fp8():
    from fa_variants.hopper import fa3_fp8

    with pytest.raises(ValueError, match="alpha_first"):  # session 8's switch: fa3 only
        dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], alpha_first=True).check(128)


@pytest.mark.parametrize("change", [dict(num_splits=0), dict(num_splits=2), dict(pack_gqa=True, pack_group=2),
                                    dict(shared_kv_state=True), dict(epilogue_arrive=True)],
                         ids=["split-auto", "split", "packed", "kv1", "epi-arrive"])
def test_persistent_plain_prefill_only(change):
    """persistent runs the plain prefill path (and host-view packed decode, tests/test_decode.py): split-KV, packed
    GQA with pack_group, one K/V state and the arrive-only epilogue are refused with a ValueError naming the switch."""
    with pytest.raises(ValueError, match="persistent"):
        dataclasses.replace(fa3.DEFAULT_CONFIGS[128], persistent=True, **change).check(128)
    with pytest.raises(ValueError, match="persistent"):
        fa3.Fa3Config(persistent=1).check(128)


def test_speed_ab_plan(capsys):
    ab = _speed_ab()
    shapes = ab.plan([64, 128, 256], [1024, 4096, 16384], (False, True), list(ab.VARIANTS))
    assert len(shapes) == 18 and all(s["batch"] * s["seqlen"] >= 16384 and "old" in s["variants"] for s in shapes)
    # session 9: - early; session 12: + turn (D 128; on in D 64's default), + noturn (D 64); session 15: + basis-turn,
    # then - basis (D 64, 128), basis-kv1, basis-turn (D 128), basis-256 (D 256) with alpha from the kept bases,
    # + noturn at D 128 (its default before session 15's flip); session 16: + persistent-m128 (D 64); session 17:
    # + balanced (D 64, 128, 256); session 18: + balanced-m128 (D 64); session 19: + persistent-1tile (D 64, 128, 256),
    # + balanced-nopairs, ffma-256, ffma-balanced-256 (D 256)
    assert {s["head_dim"]: len(s["variants"]) for s in shapes} == {64: 13, 128: 16, 256: 13}
    import sys
    argv, sys.argv = sys.argv, ["fa3_speed_ab.py", "--plan"]
    try:
        assert ab.main() == 0
    finally:
        sys.argv = argv
    assert "12 shapes, 22 compiles, 68 entries" in capsys.readouterr().out  # the default: round 4 (pairs-256 out), N 4k/16k


def test_speed_ab_one_tile_grid():
    """persistent-1tile's wrapper: every call sees more SMs than tiles, the real SM count is back after each call
    (also when the call raises)."""
    ab = _speed_ab()
    from fa_variants.hopper import fa3

    real, seen = fa3._sm_count, []
    fn = ab.one_tile_grid(lambda: seen.append(fa3._sm_count(None)), fa3)
    fn()
    fn()
    assert seen == [1 << 30, 1 << 30] and fa3._sm_count is real

    def boom():
        raise RuntimeError("launch failed")
    with pytest.raises(RuntimeError):
        ab.one_tile_grid(boom, fa3)()
    assert fa3._sm_count is real
    assert ab.VARIANTS["persistent-1tile"][1] == dict(persistent=True) and "persistent-1tile" in ab.ONE_TILE_GRID


def _hot_mainloop(head_dim, config) -> list[str]:
    """The D x non-causal mainloop without the blocks of >= 32 instructions a forward branch jumps over (the huge-logit
    path; at D 64 also O's rescale, skipped when no row max moved): scripts/sass_diff.py --skip-jumps 32."""
    from helpers import load_script

    sd = load_script("sass_diff")
    compiled = _compiled(head_dim, False, config)
    assert cubin.cubin_resources(compiled.cubin)["spill_bytes"] == 0, config
    instrs, labels = sd.parse(cubin.sass_of(compiled.cubin))
    body = sd.loops(instrs, labels, 200)[0]
    return [t for _, t in sd.drop_cold(body, labels, sd.long_jumps(body, labels, 32))]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_row_sum_chains_start_at_their_first_p(head_dim):
    """Issue 12, SASS gap (bench/NOTES.md): every row-sum chain of the default kernel starts at its first P (no FADD
    from RZ) on the path run when no logit is huge. (Session 15 removed the other half of this test with the switch it
    checked, alpha from the kept bases: slower on the H200.)"""
    base = _hot_mainloop(head_dim, fa3.DEFAULT_CONFIGS[head_dim])
    assert not any(re.match(r"FADD R\d+, RZ, ", t) for t in base), "a row-sum chain started from 0"


def test_alpha_first_moves_o_rescale_under_the_exponentials():
    """Sm90Config.alpha_first (session 8; D 128's default since its H200 A/B): at D 128 non-causal, without it 32 of
    O's 64 rescale FMULs sit after the last MUFU.EX2 of the K/V step (the last row's alpha is computed after that
    row's exponentials); with every alpha computed first none is left there (flash-attn-4: none), with the same
    instruction count, exponentials and HGMMAs (nvidia-cutlass-dsl 4.8.1: 487 per step either way), no spills."""
    assert fa3.DEFAULT_CONFIGS[128].alpha_first
    base = _hot_mainloop(128, dataclasses.replace(fa3.DEFAULT_CONFIGS[128], alpha_first=False))
    first = _hot_mainloop(128, _speed_ab().variant_config("alpha", 128))

    def fmul_after_last_exp(lines):
        last = max(i for i, t in enumerate(lines) if t.startswith("MUFU.EX2"))
        return sum(t.startswith("FMUL") for t in lines[last:])

    assert fmul_after_last_exp(base) >= 16 and fmul_after_last_exp(first) == 0, (fmul_after_last_exp(base),
                                                                                fmul_after_last_exp(first))
    for op in ("MUFU.EX2", "HGMMA", "FMUL"):
        assert sum(t.startswith(op) for t in first) == sum(t.startswith(op) for t in base), op
    assert len(first) <= len(base) + 2, (len(base), len(first))


def _turns(sass: str) -> list[list[str]]:
    """The ping-pong turns of a SASS listing: each BAR.SYNC on a warpgroup's schedule barrier (``BAR.SYNC... Rn,
    0x100``: 256 threads, the id in a register) up to the next BAR.ARV on one, both included, in address order."""
    import re

    out, cur = [], None
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;", line)
        if not m:
            continue
        text = m.group(1)
        if re.search(r"BAR\.SYNC\S* R\d+, 0x100$", text):
            cur = [text]
        elif cur is not None:
            cur.append(text)
            if re.search(r"BAR\.ARV R\d+, 0x100$", text):
                out.append(cur)
                cur = None
    return out


@pytest.mark.parametrize("head_dim", [64, 128])
def test_hoisted_descriptors_shorten_the_turn(head_dim):
    """Sm90Config.hoisted_descriptors (session 12: the ping-pong turn, BAR.SYNC .. BAR.ARV, held 51 instructions vs
    flash-attn-4's 46 under ncu at D 64; on in D 64's default since session 12, in D 128's prefill default since
    session 15): the K/V ring's descriptors are no longer rebuilt from the shared-memory address in the turn (USHF and
    the ULOP3 masks go), so the default's turn is >= 8 instructions shorter than with the switch off, with the same
    HGMMAs, the hot loop >= 6 shorter, no spills (nvidia-cutlass-dsl 4.8.1, non-causal: D 64 turn 55 -> 45, loop
    412 -> 404; D 128 turn 71 -> 61). D 128's split and decode configs keep it off (their A/Bs' kernels)."""
    hoisted = fa3.DEFAULT_CONFIGS[head_dim]
    assert hoisted.hoisted_descriptors, f"D {head_dim}'s default: hoisted_descriptors on"
    off = dataclasses.replace(hoisted, hoisted_descriptors=False)
    (base,), (turn,) = (_turns(cubin.sass_of(_compiled(head_dim, False, c).cubin)) for c in (off, hoisted))
    assert any(t.startswith("USHF") for t in base), "switch off: no descriptor arithmetic in the turn (nothing moved)"
    assert not any(t.startswith("USHF") for t in turn), turn
    assert len(turn) <= len(base) - 8, (len(base), len(turn))
    assert sum(t.startswith("HGMMA") for t in turn) == sum(t.startswith("HGMMA") for t in base) > 0
    assert len(_hot_mainloop(head_dim, hoisted)) <= len(_hot_mainloop(head_dim, off)) - 6  # (no spills: checked there)
    if head_dim == 128:
        assert not fa3._SPLIT_CONFIGS[128].hoisted_descriptors and not fa3._PACKED_CONFIGS[128].hoisted_descriptors
        assert not fa3._PACKED_SPLIT_CONFIGS[128].hoisted_descriptors
        assert fa3._PACKED_CONFIGS[64].hoisted_descriptors  # (D 64's decode took it in session 12)


def test_hoisted_descriptors_checked():
    from fa_variants.hopper import fa3_fp8

    with pytest.raises(ValueError, match="hoisted_descriptors"):
        dataclasses.replace(fa3.DEFAULT_CONFIGS[64], hoisted_descriptors=1).check(64)
    for d in (128, 256):  # fa3-fp8 takes it too since session 12 (twolvl3: the head_dim 256 turn)
        dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[d], hoisted_descriptors=True).check(d)


def test_sass_dump_writes_the_ptx_of_the_kernel(tmp_path):
    """scripts/sass_dump.py --ptx (session 20): the PTX NVVM made of the same static config as the SASS (compiled
    outside the compile cache, which keeps no PTX), in whose K/V loops scripts/ptx_loops.py finds exponentials,
    WGMMAs and live registers at the head; fa4 refuses --ptx."""
    from helpers import load_script

    dump, loops = load_script("sass_dump"), load_script("ptx_loops")
    sass, ptx = tmp_path / "k.sass", tmp_path / "k.ptx"
    assert dump.main(["ours", "--head-dim", "64", "--out", str(sass), "--ptx", str(ptx)]) == 0
    text = ptx.read_text(encoding="utf-8")
    assert ".target sm_90a" in text and "wgmma.mma_async" in text and "HGMMA" in sass.read_text(encoding="utf-8")
    hot = [lp for lp in loops.analyse(text, live=True) if lp.ex2 and lp.wgmma]
    assert hot and all(lp.live_in > 0 for lp in hot), hot
    with pytest.raises(SystemExit):
        dump.main(["fa4", "--head-dim", "64", "--out", str(sass), "--ptx", str(ptx)])
