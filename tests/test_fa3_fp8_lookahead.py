"""fa3-fp8 ``s_lookahead`` (head_dim 256, session 6), compile-only, no GPU: the next K/V tile's S GEMM is issued in
the P V turn right after the last slice's QGMMA, before that slice is waited for (no WARPGROUP.DEPBAR 0 between
the last P V QGMMA and the S QGMMA), then the ping-pong arrive; with tile_n 64 and four slices S lives in the first
temporary's registers; no spills. The config refuses what the loop does not build.
"""
import dataclasses
import re

import pytest

from fa_variants import registry
from fa_variants.common import cubin

pytestmark = pytest.mark.compile

fa3_fp8 = pytest.importorskip("fa_variants.hopper.fa3_fp8")

# a P V slice (A from registers) and an S GEMM's first k-block (A from shared memory, zero-initialised accumulator)
PV = r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3 R(\d+), R\d+, gdesc"
S_FIRST = r"QGMMA\.64x{n}x32\.F32\.E4M3\.E4M3 R(\d+), gdesc\[UR\d+\], RZ, !UPT"


def _sass(change, causal):
    """SASS of the head_dim 256 serial schedule (the default before the lookahead, ``NO_LOOKAHEAD``) with change."""
    cfg = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[256], **{**fa3_fp8.NO_LOOKAHEAD, **change})
    c = registry.compiled(registry.static_config("fa3-fp8", "sm_90a", "e4m3", 256, causal, cfg))
    return cubin.sass_of(c.cubin)


def _lookahead_issues(sass: str, tile_n: int) -> list[tuple[str, str]]:
    """(last P V slice's accumulator, S accumulator) of every S GEMM issued after a P V slice with no full drain
    (DEPBAR 0) between them and followed by the ping-pong arrive before any wait."""
    found = []
    for m in re.finditer(S_FIRST.format(n=tile_n), sass):
        before, after = sass[:m.start()], sass[m.end():]
        pv = list(re.finditer(PV, before))
        if not pv or "WARPGROUP.DEPBAR.LE gsb0, 0x0" in before[pv[-1].end():]:
            continue
        nxt = re.search(r"BAR\.ARV|WARPGROUP\.DEPBAR", after)
        if nxt and nxt.group(0) == "BAR.ARV":
            found.append((pv[-1].group(1), m.group(1)))
    return found


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_lookahead_tile64(causal):
    s = _sass(dict(tile_n=64, s_lookahead=True), causal)
    counts = cubin.count_sass(s)
    assert counts["LDL"] == counts["STL"] == 0 and counts["QGMMA"] > 0, counts
    issues = _lookahead_issues(s, 64)
    # the first step's, the masked and the free loop's: S issued under the last slice, in the other temporary
    assert len(issues) >= 3, issues
    slices = set(re.findall(PV, s))
    assert all(pv != acc_s and acc_s in slices for pv, acc_s in issues), (issues, slices)


def test_lookahead_tile96_eight_slices():
    s = _sass(dict(tile_n=96, s_lookahead=True, pv_split=8), causal=True)
    counts = cubin.count_sass(s)
    assert counts["LDL"] == counts["STL"] == 0, counts
    assert "QGMMA.64x32x32.F32.E4M3.E4M3" in s  # slices of 32 columns of d
    assert len(_lookahead_issues(s, 96)) >= 3


def test_s_halves():
    """s_halves (128 x 128, four slices): S as two 64-key QGMMA groups: after the last slice's QGMMA the promotion of
    the one before it, half 0 (in that slice's temporary), a wait for the last slice (DEPBAR 1), its promotion (32
    FFMA) while half 0 runs, half 1 (in the last slice's temporary), then the arrive; no spills."""
    s = _sass(dict(s_lookahead=True, s_halves=True), causal=False)
    counts = cubin.count_sass(s)
    assert counts["LDL"] == counts["STL"] == 0, counts
    ss = r"QGMMA\.64x64x32\.F32\.E4M3\.E4M3 R(\d+), gdesc\[UR\d+\], RZ, !UPT"
    seq = (r"QGMMA\.64x64x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc[^\n]*gsb0 ;(?:(?!QGMMA|DEPBAR|BAR\.ARV).)*?WARPGROUP\.DEPBAR\.LE gsb0, 0x1 ;"
           r"(?:(?!QGMMA|BAR\.ARV).)*?" + ss + r"(?:(?!DEPBAR|BAR\.ARV).)*?WARPGROUP\.DEPBAR\.LE gsb0, 0x1 ;"
           r"((?:(?!QGMMA|BAR\.ARV).)*?)" + ss + r"(?:(?!DEPBAR).)*?BAR\.ARV")
    found = re.findall(seq, s, re.S)
    assert len(found) >= 2, len(found)  # the first step's and the loops'
    assert all(a != b and len(re.findall(r"\bFFMA\b", between)) >= 32 for a, between, b in found)


def test_serial_has_no_lookahead():
    assert _lookahead_issues(_sass({}, causal=False), 128) == []


def test_default_is_look128_halves():
    """The head_dim 256 default since the session-6 H200 A/B (--set fp8d256): s_lookahead with s_halves at 128 x 128
    (test_s_halves reads its SASS); the other head_dims keep neither."""
    c256 = fa3_fp8.DEFAULT_CONFIGS[256]
    assert c256.s_lookahead and c256.s_halves and c256.skip_unit_rescale and (c256.tile_m, c256.tile_n) == (128, 128)
    assert c256 == dataclasses.replace(c256, **{**fa3_fp8.NO_LOOKAHEAD, "s_lookahead": True, "s_halves": True,
                                                "fused_promote": True, "bounded_units": True})
    assert c256.fused_promote and c256.reduce_chains == 2  # session 9's flip (--set fp8two, fused_c2)
    assert c256.bounded_units  # session 11's flip (scripts/bounded_gpu.sh)
    assert not any(c.s_lookahead or c.s_halves for d, c in fa3_fp8.DEFAULT_CONFIGS.items() if d != 256)


@pytest.mark.parametrize("bad, why", [
    (dict(pv_buffers=1), "s_lookahead needs"), (dict(pv_split=1, pv_buffers=1), "s_lookahead needs"),
    (dict(promote_every=2), "promote_every=2 must be"), (dict(two_level=False), "pv_split > 1 needs two_level"),
    (dict(early_pv_arrive=True), "s_lookahead needs"), (dict(pingpong=False), "s_lookahead needs"),
    (dict(shared_kv_state=True), "s_lookahead needs"), (dict(descale_prefetch=True), "s_lookahead needs"),
    (dict(s_halves=True, tile_n=64), "s_halves with s_lookahead needs")])
def test_lookahead_config_errors(bad, why):
    """Each of the lookahead's needs, broken alone, is refused, by the rule named in ``why`` (promote_every 2 and
    two_level off by the general rules of pv_split > 1, which the lookahead's needs imply)."""
    cfg = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[256], **{**fa3_fp8.NO_LOOKAHEAD, "s_lookahead": True, **bad})
    with pytest.raises(ValueError, match=why):
        cfg.check(256)


def test_halves_configs():
    """s_halves with the lookahead needs its registers' slicing; alone (session 7) only tile_n % 64 == 0."""
    with pytest.raises(ValueError, match="s_halves"):
        dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[256], pv_split=8).check(256)
    with pytest.raises(ValueError, match="s_halves"):
        dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[256], s_lookahead=False, fused_promote=False, bounded_units=False,
                            tile_n=96).check(256)
    dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[256], s_lookahead=False, fused_promote=False, bounded_units=False).check(256)
    dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[256], s_halves=False, pv_split=8).check(256)
    dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[256], **fa3_fp8.NO_LOOKAHEAD).check(256)


@pytest.mark.parametrize("change", [dict(), dict(two_level=False, pv_split=1, pv_buffers=1, intra_wg_overlap=True)],
                         ids=["serial_two_level", "single_overlap"])
def test_halves_without_lookahead(change):
    """s_halves alone: the S GEMM as 64-key QGMMAs only (16 per tile at head_dim 256, against 8 of 128 keys), no
    spills, and no serialised WGMMAs (one WARPGROUP.DEPBAR 0 per S wait, not one per QGMMA)."""
    s = _sass({**change, "s_halves": True}, causal=False)
    counts = cubin.count_sass(s)
    assert counts["LDL"] == counts["STL"] == 0, counts
    assert not re.search(r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3 R\d+, gdesc", s)
    assert len(re.findall(r"QGMMA\.64x64x32\.F32\.E4M3\.E4M3 R\d+, gdesc", s)) >= 16
    assert s.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") < 10


def test_d256_set_covers_the_gpu_tests():
    """scripts/fa3_fp8_speed_ab.py --set fp8d256: every variant tests/test_fa3_fp8_lookahead_gpu.py runs is timed under
    the same name and config, its kernels precompiled in both causal modes; every timed variant is a valid config."""
    from helpers import load_script
    import test_fa3_fp8_lookahead_gpu as gpu_tests

    ab = load_script("fa3_fp8_speed_ab")
    table = ab.D256_VARIANTS[256]
    jobs = set(ab.compile_jobs([256], [False], variant_set="fp8d256"))
    for name, change in gpu_tests.VARIANTS.items():
        assert table[name] == change, name
        for causal in (False, True):
            assert ("fp8", 256, causal, ab._freeze(change)) in jobs, (name, causal)
    for change in table.values():
        ab.kernel_config(256, change).check(256)
    assert {n for n in table if n.startswith("single")} == {"single_overlap", "single64_overlap"}


def test_d256b_set_covers_the_gpu_tests():
    """--set fp8d256b: the session-7 halves variants of tests/test_fa3_fp8_lookahead_gpu.py
    timed under the same names, beside the default, single_overlap and the serial two-level schedule they modify."""
    from helpers import load_script
    import test_fa3_fp8_lookahead_gpu as gpu_tests

    ab = load_script("fa3_fp8_speed_ab")
    table = ab.D256B_VARIANTS[256]
    jobs = set(ab.compile_jobs([256], [False], variant_set="fp8d256b"))
    for name, change in gpu_tests.HALVES_VARIANTS.items():
        assert table[name] == change, name
        for causal in (False, True):
            assert ("fp8", 256, causal, ab._freeze(change)) in jobs, (name, causal)
    assert table["old"] == gpu_tests.VARIANTS["old"] and table["new"] == {}
    assert table["single_overlap"] == ab.D256_VARIANTS[256]["single_overlap"]
    for change in table.values():
        ab.kernel_config(256, change).check(256)
