"""fa2's head_dim 256 tile variants (``fa2.D256_CONFIGS``, FA_VARIANTS_FA2_D256) on the CPU: the switch picks the
tiles, bad names fail with one line, the one-stage K/V pipeline is accepted, and the one-stage variant compiles for
sm_80 without register spills (the GPU checks: tests/test_fa2_gpu.py -k d256; timing: scripts/fa2d256_ab.py)."""
import pytest

from fa_variants.ampere import fa2
from fa_variants.common import env
from fa_variants.common.config import Sm80Config


def test_default_is_s1_and_the_switch_picks_the_variant(monkeypatch):
    """s1 (64 x 64, one K/V stage) is the default where the old two-stage default fit (sm80 / sm90); 99 KiB parts
    keep 64 x 32 with two stages; FA_VARIANTS_FA2_D256=s2 brings back the old default."""
    s1 = Sm80Config(64, 64, stages=1)
    assert fa2.D256_CONFIGS["default"] == fa2.CONFIGS[256] == fa2.D256_CONFIGS["s1"] == s1
    for arch in ("sm_80", "sm_90a", "sm_100a"):
        assert fa2.default_config(arch, 256, False) == s1 == fa2.default_config(arch, 256, True)
    for arch in ("sm_86", "sm_89", "sm_120a"):
        assert fa2.default_config(arch, 256, False) == fa2.SMALL_SMEM_CONFIGS[256] == Sm80Config(64, 32)
    monkeypatch.setattr(fa2, "D256_VARIANT", "s2")
    assert fa2.default_config("sm_90a", 256, True) == Sm80Config(64, 64) == fa2.D256_CONFIGS["s2"]
    monkeypatch.setattr(fa2, "D256_VARIANT", "m128w8s1")
    assert fa2.default_config("sm_90a", 256, True) == Sm80Config(128, 64, warps=8, stages=1)
    assert fa2.default_config("sm_90a", 128, True) == fa2.CONFIGS[128]  # other head dims untouched


def test_auto_runs_the_variant_for_prefill_only(monkeypatch):
    """`auto` (no config=) on an H200: head_dim 256 prefill runs the named tiles (explicitly, so a plan made before
    the switch changed switches too), decode keeps its split config, other head dims their defaults."""
    import torch

    def qk(b, nq, nk, d=256, heads=8):
        return (torch.empty(b, nq, heads, d, device="meta", dtype=torch.bfloat16),
                torch.empty(b, nk, heads, d, device="meta", dtype=torch.bfloat16))

    monkeypatch.setattr(fa2, "_gpu", lambda device: ("sm_90a", 132))
    monkeypatch.setattr(fa2, "SPLIT_KV_ENABLED", True)
    fa2._cached_splits.cache_clear()
    assert fa2._problem_config(None, *qk(32, 512, 512), True) is None
    monkeypatch.setattr(fa2, "D256_VARIANT", "m128w8s1")
    assert fa2._problem_config(None, *qk(32, 512, 512), True) == fa2.D256_CONFIGS["m128w8s1"]
    assert fa2._problem_config(None, *qk(1, 1, 4096), True) == fa2._split_config("sm_90a", 256)
    assert fa2._problem_config(None, *qk(32, 512, 512, d=128, heads=16), False) is None
    # FA_VARIANTS_FA2_D256_MAX_SEQLEN_K: the variant up to that seqlen_k, the default tiles beyond (and as the
    # static default; the variant then among the warm-up configs)
    monkeypatch.setattr(fa2, "D256_MAX_SEQLEN_K", 2048)
    assert fa2._problem_config(None, *qk(8, 2048, 2048), False) == fa2.D256_CONFIGS["m128w8s1"]
    assert fa2._problem_config(None, *qk(4, 4096, 4096), False) is None
    assert fa2.default_config("sm_90a", 256, False) == fa2.CONFIGS[256]
    assert fa2.D256_CONFIGS["m128w8s1"] in fa2._warm_configs("sm_90a", 256, False)
    fa2._cached_splits.cache_clear()


def test_every_variant_fits_sm90_and_two_ctas_fit_where_claimed():
    for name, cfg in fa2.D256_CONFIGS.items():
        assert fa2.d256_config("sm_90a", name) == cfg
    # 228 KiB per SM on sm90, 1 KiB reserved per CTA: two CTAs of s1 / n32, one of the others
    assert {n: 233472 // (c.smem_bytes(256) + 2048) for n, c in fa2.D256_CONFIGS.items()} == \
        {"default": 2, "s1": 2, "s2": 1, "n32": 2, "m128w8s1": 1, "m128w8": 1}
    # 128 x 64 with two stages does not fit sm80's 163 KiB: its small-shared-memory twin
    assert fa2.d256_config("sm_80", "m128w8") == fa2.SMALL_SMEM_CONFIGS[256]


def test_unknown_variant_and_stage_count_raise():
    with pytest.raises(ValueError, match="FA_VARIANTS_FA2_D256='x': unknown"):
        fa2.d256_config("sm_90a", "x")
    with pytest.raises(ValueError, match="FA_VARIANTS_FA2_D256_MAX_SEQLEN_K must be an int >= 0"):
        env.int_value("FA_VARIANTS_FA2_D256_MAX_SEQLEN_K", "2k", 0)
    assert env.int_value("FA_VARIANTS_FA2_D256_MAX_SEQLEN_K", "2048", 0) == 2048
    assert fa2._check_config(Sm80Config(64, 64, stages=1), "sm_90a", 256).stages == 1
    with pytest.raises(ValueError, match="q_stages=1"):
        fa2._check_config(Sm80Config(64, 64, q_stages=2), "sm_90a", 256)


@pytest.mark.compile
def test_d256_one_stage_variant_compiles_without_spills():
    """s1, causal (the others, sm_80 and sm_90a, bf16 and fp16: 231-254 registers, no spills, bench/NOTES.md)."""
    from fa_variants.commands.compile import compile_only

    r = compile_only("fa2", "sm_80", 256, "bf16", True, True, fa2.d256_config("sm_80", "s1"))
    assert r["tiles"]["stages"] == 1 and r["spill_bytes"] == 0 and r["LDL"] == 0 and r["STL"] == 0
    assert r["HMMA"] > 0 and r["LDGSTS"] > 0 and r["registers"] <= 255
