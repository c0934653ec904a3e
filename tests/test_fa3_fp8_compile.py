"""fa3-fp8 (sm90, e4m3) compile-only checks, no GPU (issue 10 item 2).

`fa-variants compile --arch sm_90a --variant fa3-fp8 --head-dim D --dtype e4m3 --sass` must report
QGMMA > 0 (FP8 warpgroup MMAs for both GEMMs), UTMALDG > 0, USETMAXREG > 0 and LDL = STL = 0, for the default
configs (tiles from fa_variants.fp8.layout.KERNEL_TILES: 64: 192 x 192 serial, reduce_chains 4; 128: 128 x 256
serial; 256: 128 x 128
with the P V GEMM in four slices, two temporaries).
"""
import dataclasses
import re

import pytest

from fa_variants import registry
from fa_variants.common import cubin
from fa_variants.fp8 import layout

pytestmark = pytest.mark.compile

fa3_fp8 = pytest.importorskip("fa_variants.hopper.fa3_fp8")


def _assert_fp8_kernel(r):
    assert r["QGMMA"] > 0 and r["HGMMA"] == 0, r  # both GEMMs on e4m3 warpgroup MMAs
    assert r["UTMALDG"] > 0 and r["UTMASTG"] > 0, r
    assert r["USETMAXREG"] >= 2, r
    assert r["LDL"] == 0 and r["STL"] == 0 and r["spill_bytes"] == 0, r
    assert r["MUFU.EX2"] > 0, r
    assert r["smem_bytes"] <= 227 * 1024, r


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_cli_sass_e4m3(compile_cli, head_dim, causal):
    r = compile_cli("--arch", "sm_90a", "--variant", "fa3-fp8", "--head-dim", str(head_dim), "--dtype", "e4m3",
                  "--sass", *(["--causal"] if causal else []))
    assert r["variant"] == "fa3-fp8" and r["head_dim"] == head_dim and r["dtype"] == "e4m3"
    assert r["tiles"] == dataclasses.asdict(fa3_fp8.DEFAULT_CONFIGS[head_dim])
    assert (r["tiles"]["tile_m"], r["tiles"]["tile_n"]) == layout.KERNEL_TILES[head_dim]
    _assert_fp8_kernel(r)


def test_default_interval_and_switches():
    """The defaults' promotion interval is layout.KERNEL_PROMOTE_EVERY's (the default recipe's, which the emulation
    follows: FP8Config.promote_every None), and skip_unit_rescale is on at head_dim 256 only (bench/NOTES.md)."""
    for d, cfg in fa3_fp8.DEFAULT_CONFIGS.items():
        assert cfg.promote_every == layout.promote_every(d) and cfg.skip_unit_rescale == (d == 256), (d, cfg)
    d64 = fa3_fp8.DEFAULT_CONFIGS[64]  # session 6's tn192s_c4: 192 x 192, serial steps, four softmax chains
    assert (d64.tile_m, d64.tile_n, d64.intra_wg_overlap, d64.reduce_chains) == (192, 192, False, 4)
    assert all(fa3_fp8.DEFAULT_CONFIGS[d].reduce_chains == 1 for d in (96, 128))
    assert fa3_fp8.DEFAULT_CONFIGS[256].reduce_chains == 2  # session 9: fused_promote with two chains (--set fp8two)
    four = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[64], promote_every=4)
    four.check(64)
    dataclasses.replace(four, two_level=False).check(64)  # the interval is ignored then


def _sass(config, head_dim=128, causal=False):
    c = registry.compiled(registry.static_config("fa3-fp8", "sm_90a", "e4m3", head_dim, causal, config))
    return cubin.sass_of(c.cubin)


def test_p_is_converted_in_thread():
    """P becomes e4m3 by paired converts (F2FP ... E4M3) and feeds the P V QGMMA from registers, with no
    shuffle beyond the row-max / row-sum quad reductions (the V token order makes that possible)."""
    s = _sass(fa3_fp8.DEFAULT_CONFIGS[128])
    assert len(re.findall(r"F2FP\.SATFINITE\.E4M3\.F32", s)) > 0
    assert re.search(r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc", s)  # A from registers (RS)
    shuffles = len(re.findall(r"\bSHFL\.", s))
    # 2 row-max reductions x 2 lanes x (first + loop) + row sums + lane broadcast: 13; huge_hoisted (the default at 128
    # since session 29) compiles the free tiles' loop twice, 4 more
    assert shuffles <= 17, shuffles
    # huge_guard: the softmax's plain code and its huge-logit checked code each reduce the row max: twice as many
    guarded = _sass(dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], huge_guard=True, huge_hoisted=False))
    assert len(re.findall(r"\bSHFL\.", guarded)) <= 32


@pytest.mark.parametrize("change", [dict(two_level=False), dict(tile_n=128, intra_wg_overlap=True), dict(out_dtype="fp16"),
                                    dict(pingpong=False), dict(huge_guard=True, huge_hoisted=False)],
                         ids=["single-acc", "old-default-overlap", "fp16-out", "no-pingpong", "huge-guard"])
def test_switches_compile(change):
    s = _sass(dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], **change), causal=True)
    counts = cubin.count_sass(s)
    assert counts["QGMMA"] > 0 and counts["USETMAXREG"] >= 2 and counts["LDL"] == counts["STL"] == 0, counts


def test_two_level_promotes_on_cuda_cores():
    """Two-level accumulation: each tile's P V starts from zero (the QGMMA's own zero init, '!UPT' / RZ
    accumulator) and is added into O with FFMAs; the single accumulator starts from zero only in the first
    tile's step (serial steps at head_dim 128: O is known zero there) and never restarts P V in the loop."""
    two = _sass(fa3_fp8.DEFAULT_CONFIGS[128])
    one = _sass(dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], two_level=False))
    zero_init = r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc\[UR\d+\], RZ"
    assert len(re.findall(zero_init, two)) >= 2
    assert len(re.findall(zero_init, one)) <= 1
    assert len(re.findall(r"\bFFMA\b", two)) > len(re.findall(r"\bFFMA\b", one)) + 64


def test_promotion_interval():
    """promote_every > 1: the interval's first P V overwrites the temporary under a run-time predicate (UP),
    the others accumulate into it; no spills in either schedule. head_dim 64 (the default tiles) and 128 with
    128-key tiles (its default, 256-key tiles, spill with an interval's temporary: the recipe refuses it); head_dim 64
    with 192 x 128 serial tiles (the default before session 6)."""
    for head_dim, change in ((128, dict(promote_every=2, tile_n=128, intra_wg_overlap=True)),
                             (64, dict(promote_every=4, tile_n=128, intra_wg_overlap=False))):
        s = _sass(dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[head_dim], **change), head_dim=head_dim, causal=True)
        counts = cubin.count_sass(s)
        assert counts["QGMMA"] > 0 and counts["LDL"] == counts["STL"] == 0, counts
        assert re.search(rf"QGMMA\.64x{head_dim}x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc\[UR\d+\], R\d+, !?UP\d", s), head_dim


def test_pv_slices_pipelined():
    """head_dim 256, pv_split=4 with two temporaries: slice h + 1 is issued before slice h is promoted
    (a wait for <= 1 group in flight), the promotes' FFMAs between them; no spills."""
    cfg = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[256], pv_split=4, pv_buffers=2, **fa3_fp8.NO_LOOKAHEAD)
    s = _sass(cfg, head_dim=256)
    counts = cubin.count_sass(s)
    assert counts["LDL"] == counts["STL"] == 0, counts
    assert "QGMMA.64x64x32.F32.E4M3.E4M3" in s
    between = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1 ;((?:(?!QGMMA).)*?)WARPGROUP\.ARRIVE", s, re.S)
    assert len(between) >= 3 and all(len(re.findall(r"\bFFMA\b", b)) >= 32 for b in between[:3]), len(between)


@pytest.mark.parametrize("bad, match", [(dict(tile_n=80), "multiple of 32"), (dict(tile_m=256), "tile_m=256 must be 128 or 192"),
                                        (dict(pv_split=2, intra_wg_overlap=True), "pv_split"), (dict(out_dtype="e4m3"), "out_dtype"),
                                        (dict(pv_split=3), "pv_split"), (dict(pv_buffers=2), "pv_buffers"),
                                        (dict(promote_every=0), "promote_every"),
                                        (dict(promote_every=2, pv_split=2, intra_wg_overlap=False), "promote_every"),
                                        (dict(num_splits=2), "num_splits=2"),
                                        (dict(fused_promote=True), "fused_promote needs s_lookahead"),
                                        (dict(bounded_units=True), "bounded_units needs fused_promote"),
                                        (dict(rescale_o_before_pv=True, intra_wg_overlap=True, tile_n=128),
                                         "rescale_o_before_pv")])
def test_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], **bad).check(128)


def test_early_pv_arrive():
    """early_pv_arrive (head_dim 256, four P V slices, two temporaries): the ping-pong arrive (BAR.ARV) comes right
    after the last slice's QGMMA is issued, before any wait for it, and the mainloop's S = Q K^T QGMMA is no longer
    followed by one (only the first step's is: its turn has no P V GEMM); no spills. With skip_unit_rescale too."""
    serial = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[256], **fa3_fp8.NO_LOOKAHEAD)  # the lookahead refuses early
    base = _sass(serial, head_dim=256)
    cfg = dataclasses.replace(serial, early_pv_arrive=True, skip_unit_rescale=True)
    s = _sass(cfg, head_dim=256)
    counts = cubin.count_sass(s)
    assert counts["QGMMA"] > 0 and counts["LDL"] == counts["STL"] == 0, counts
    after = lambda shape, text: len(re.findall(rf"QGMMA\.{shape}\.F32\.E4M3\.E4M3 [^\n]*gsb0 ;\s*\n[^\n]*BAR\.ARV", text))  # noqa: E731
    assert after("64x64x32", base) == 0 and after("64x64x32", s) >= 2, (after("64x64x32", base), after("64x64x32", s))
    assert after("64x128x32", base) == 2 and after("64x128x32", s) == 1
    assert len(re.findall(r"\bBAR\.ARV\b", s)) == len(re.findall(r"\bBAR\.ARV\b", base))  # one arrive per turn, as before


def test_descale_prefetch():
    """descale_prefetch (head_dim 256 default, four P V slices): in the main loop no load between the S GEMM's last
    QGMMA and the softmax's first exponential (k_descale is in a register by then; the default loads it there), and v_descale
    read once per tile instead of once per slice (fewer LDG in all); no spills. At 64 (the 192 x 128 overlapped tiles
    of the default before session 6: at today's 192 x 192 serial default it spills when causal) and 128 it compiles
    without spills too."""
    s_tail = r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3 R\d+, gdesc\[UR\d+\], R\d+, gsb0 ;((?:(?!MUFU\.EX2).)*)MUFU\.EX2"
    serial = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[256], **fa3_fp8.NO_LOOKAHEAD)  # the lookahead refuses prefetch
    base = _sass(serial, head_dim=256)
    s = _sass(dataclasses.replace(serial, descale_prefetch=True), head_dim=256)
    counts = cubin.count_sass(s)
    assert counts["LDL"] == counts["STL"] == 0, counts
    loads = lambda text: [len(re.findall(r"\bLDG\.E\b", t)) for t in re.findall(s_tail, text, re.S)]  # noqa: E731
    # [first tile (loads its own, as before), main loop]
    assert len(loads(base)) == 2 and loads(base)[-1] >= 1, loads(base)
    assert len(loads(s)) == 2 and loads(s)[-1] == 0, loads(s)
    assert len(re.findall(r"\bLDG\.E\b", s)) <= len(re.findall(r"\bLDG\.E\b", base)) - 3
    pre64 = dict(tile_n=128, intra_wg_overlap=True, reduce_chains=1)  # scripts/fa3_fp8_speed_ab.py PRE64
    for head_dim, change in ((64, pre64), (128, {})):
        cfg = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[head_dim], descale_prefetch=True, **change)
        c = cubin.count_sass(_sass(cfg, head_dim=head_dim, causal=True))
        assert c["QGMMA"] > 0 and c["LDL"] == c["STL"] == 0, (head_dim, c)


def _chain_depth(sass: str, opcode: str) -> int:
    """Longest chain of ``opcode`` instructions (e.g. FADD) each reading the register the previous one wrote, in
    program order (a register written by anything else breaks the chain)."""
    depth, best = {}, 0
    for line in re.findall(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", sass):
        line = re.sub(r"^@!?U?P[T\d]+\s+", "", line)
        regs = re.findall(r"\bR(\d+)\b", line)
        if not regs:
            continue
        if line.split()[0].split(".")[0] == opcode:
            depth[regs[0]] = 1 + max([depth.get(r, 0) for r in regs[1:]] + [0])
            best = max(best, depth[regs[0]])
        else:
            depth[regs[0]] = 0
    return best


def test_block_scaled_softmax_chains_and_three_warpgroups():
    """Session 6 (head_dim 128): reduce_chains=4 splits the block-scaled softmax's row max (FMNMX) and row sum (FADD)
    into four chains (the default, 1, keeps one chain per row: 64 scores of a thread's row at tile_n 256); the
    192 x 128 serial config (three consumer warpgroups, two-level on) compiles without spills."""
    base = _sass(fa3_fp8.DEFAULT_CONFIGS[128])
    c4 = _sass(dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], reduce_chains=4))
    assert _chain_depth(base, "FADD") >= 63 and _chain_depth(base, "FMNMX") >= 63
    # (program order: the row max of the peeled first tile feeds the main loop's, up to two tiles' worth of chain)
    assert _chain_depth(c4, "FADD") <= 20 and _chain_depth(c4, "FMNMX") <= 40
    assert cubin.count_sass(c4)["MUFU.EX2"] == cubin.count_sass(base)["MUFU.EX2"]
    m192 = _sass(dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], tile_m=192, tile_n=128, reduce_chains=4), causal=True)
    counts = cubin.count_sass(m192)
    assert counts["LDL"] == counts["STL"] == 0 and counts["USETMAXREG"] >= 2, counts
    assert "QGMMA.64x128x32.F32.E4M3.E4M3" in m192


def test_q_tail_first_compiles_without_spills():
    """q_tail_first (causal: tiles 1.. moved back by the shift, tile 0 from row 0 sharing the shift rows with tile 1;
    session 8: no TMA coordinate below row 0, common.mask.BlockInfo.q_row_start) on the head_dim 64 192 x 128 serial
    tiles GPU-tested beside fa3_fp8_speed_ab.py --set fp8d128: no spills, both TMA directions, both mainloops (masked
    and free)."""
    cfg = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[64], tile_n=128, q_tail_first=True)
    counts = cubin.count_sass(_sass(cfg, head_dim=64, causal=True))
    assert counts["LDL"] == counts["STL"] == 0 and counts["UTMALDG"] > 0 and counts["UTMASTG"] > 0, counts
    assert counts["MUFU.EX2"] >= 2 * 66, counts  # the masked and the free loop, 64 scores + 2 alphas a thread each


def test_fused_promote():
    """fused_promote (head_dim 256 default since session 9, against the default before; session 8): O *= alpha folded into the promotion, O = alpha' O +
    tmp. Against the default's SASS: the FMUL block of O *= alpha (128 a thread, under the unit-alpha branch) is gone,
    the promotions are still >= 32 FFMAs between a slice's wait and the next issue, the QGMMAs are the same, and no
    spills (the first visited tile copies tmp into O: keeping alpha live across that step's turn spilled 80 bytes)."""
    fused = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[256], bounded_units=False)  # the default of sessions 9-11
    base = _sass(dataclasses.replace(fused, fused_promote=False, reduce_chains=1), head_dim=256,
                 causal=True)  # the default before session 9's flip
    s = _sass(fused, head_dim=256, causal=True)  # fused_promote + reduce_chains 2 since session 9
    ops = cubin.SASS_OPCODES + ("FMUL",)
    counts, base_counts = cubin.count_sass(s, ops), cubin.count_sass(base, ops)
    assert counts["LDL"] == counts["STL"] == 0, counts
    assert counts["QGMMA"] == base_counts["QGMMA"], (counts["QGMMA"], base_counts["QGMMA"])
    assert counts["FMUL"] <= base_counts["FMUL"] - 2 * 128, (counts["FMUL"], base_counts["FMUL"])  # masked + free loop
    between = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1 ;((?:(?!QGMMA).)*?)WARPGROUP\.ARRIVE", s, re.S)
    ffmas = [len(re.findall(r"\bFFMA\b", b)) for b in between]  # the first visited tile's steps copy (no FFMA)
    assert sum(n >= 32 for n in ffmas) >= 8, ffmas  # the masked and the free loop, four slices each


def _promotion_gaps(sass: str) -> list[str]:
    """The code after each WGMMA wait for one group (``WARPGROUP.DEPBAR.LE gsb0, 0x1``: a P V slice done while the
    next runs) up to the next WGMMA issue or turn hand-on: the promotions inside the ping-pong turn."""
    return re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1 ;((?:(?!WARPGROUP\.ARRIVE|BAR\.ARV).)*)", sass, re.S)


def _turn_heads(sass: str) -> list[str]:
    """The code from each named-barrier wait (``BAR.SYNC``: the ping-pong turn begins) to the next WGMMA issue."""
    return re.findall(r"BAR\.SYNC[^;]*;((?:(?!WARPGROUP\.ARRIVE).)*)WARPGROUP\.ARRIVE", sass, re.S)


def test_bounded_units():
    """bounded_units (session 10; the fix of fused_promote's overflow; the head_dim 256 default since session 11,
    scripts/bounded_gpu.sh): the default against itself without the switch (lookahead, fused_promote): no spills
    and the turn as lean as fused_promote's alone:
    session 10's form branched on s = v_descale / u before every slice's promotion and divided inside the turn
    (2-4.5 % slower on the H200); since session 11 the branch is taken once a tile before the turn (compiled
    twice: the rare copy scales the temporaries, FMULs and more QGMMAs), no branch, call, FCHK or MUFU between a
    slice's wait and the next issue, and no more divisions than the default's between a turn's start and its
    first WGMMA."""
    cfg = fa3_fp8.DEFAULT_CONFIGS[256]
    assert cfg.bounded_units and cfg.fused_promote  # session 11's flip
    base = _sass(dataclasses.replace(cfg, bounded_units=False), head_dim=256, causal=True)
    s = _sass(cfg, head_dim=256, causal=True)
    ops = cubin.SASS_OPCODES + ("FMUL",)
    counts, base_counts = cubin.count_sass(s, ops), cubin.count_sass(base, ops)
    assert counts["LDL"] == counts["STL"] == 0, counts
    assert counts["QGMMA"] > base_counts["QGMMA"], (counts["QGMMA"], base_counts["QGMMA"])  # the turn's rare copy
    assert counts["FMUL"] >= base_counts["FMUL"] + 64, (counts["FMUL"], base_counts["FMUL"])  # the rare path's s tmp
    gaps = _promotion_gaps(s)
    assert len(gaps) > len(_promotion_gaps(base)), (len(gaps), len(_promotion_gaps(base)))
    for gap in gaps:
        assert not re.search(r"\b(BRA|CALL|FCHK|MUFU)\b", gap), gap[:400]
    divisions = [sum(len(re.findall(r"\b(MUFU\.RCP|FCHK)\b", h)) for h in _turn_heads(x)) for x in (s, base)]
    assert divisions[0] <= divisions[1], divisions


def _pingpong_turns(sass: str) -> list[list[str]]:
    """Each ping-pong turn's instructions: after a named-barrier wait on a register id (``BAR.SYNC R.., 0x100``)
    up to its hand-on (``BAR.ARV``), opcodes with their operands, in listing order."""
    out, cur = [], None
    for line in sass.splitlines():
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+([^;]+);", line)
        if not m:
            continue
        text = m.group(1).strip()
        if re.match(r"BAR\.SYNC\S* R\d+", text):
            cur = []
        elif cur is not None:
            if text.startswith("BAR.ARV"):
                out.append(cur)
                cur = None
            else:
                cur.append(text)
    return out


def test_hoisted_descriptors_at_256():
    """hoisted_descriptors on the head_dim 256 default (session 12, twolvl3; off: the same speed in session 13): the K / V
    descriptors are no longer rebuilt inside the ping-pong turn, so the hot turn (the one with the 4 x 32 promotion
    FFMAs and 32 QGMMAs: the common copy of the loop) is shorter with the same FFMAs and QGMMAs, and nothing spills
    (nvidia-cutlass-dsl 4.8.1, D 256 non-causal: 255 -> 247 instructions)."""
    cfg = fa3_fp8.DEFAULT_CONFIGS[256]
    assert not cfg.hoisted_descriptors
    hd = dataclasses.replace(cfg, hoisted_descriptors=True)
    base, s = _sass(cfg, head_dim=256), _sass(hd, head_dim=256)
    counts = cubin.count_sass(s)
    assert counts["LDL"] == counts["STL"] == 0, counts

    def hot(sass):
        turns = [t for t in _pingpong_turns(sass) if sum(x.startswith("FFMA") for x in t) == 128]
        assert turns, "no turn with the four slices' 128 promotion FFMAs"
        return max(turns, key=len)

    (b, h) = hot(base), hot(s)
    for op in ("QGMMA", "FFMA"):
        assert sum(x.startswith(op) for x in h) == sum(x.startswith(op) for x in b), op
    assert len(h) <= len(b) - 6, (len(b), len(h))


@pytest.mark.parametrize("tile_n", [224, 256])
def test_192_row_tiles_refuse_wider_kv_tiles(tile_n):
    """192 query rows (three consumer warpgroups, 128 registers a thread at launch): tile_n 224 / 256 fail in ptxas
    (the first S GEMM's QGMMA needs 138 / 154 registers), so the config refuses them up front; 192 is accepted, and
    128 query rows take 256 (two warpgroups, 168 registers)."""
    base = fa3_fp8.DEFAULT_CONFIGS[64]
    with pytest.raises(ValueError, match=f"tile_n={tile_n} with tile_m=192"):
        dataclasses.replace(base, tile_n=tile_n).check(64)
    dataclasses.replace(base, tile_n=192).check(64)
    dataclasses.replace(base, tile_m=128, tile_n=tile_n).check(64)


def test_huge_guard_compiles_at_64_without_spills():
    """Fp8Config.huge_guard at head_dim 64 (its other compile case: test_switches_compile at 128): both softmax paths
    in the loop, no local memory; at head_dim 256 (huge_per_row) it is a no-op, the SASS the default's."""
    for causal in (False, True):
        counts = cubin.count_sass(_sass(dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[64], huge_guard=True), 64, causal))  # (64: not hoisted)
        assert counts["QGMMA"] > 0 and counts["LDL"] == counts["STL"] == 0, counts
    d256 = fa3_fp8.DEFAULT_CONFIGS[256]
    assert _sass(dataclasses.replace(d256, huge_guard=True), 256) == _sass(d256, 256)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_huge_hoisted_doubles_only_the_free_loop(head_dim):
    """Fp8Config.huge_hoisted: the free K/V tiles' loop compiled twice (with and without the huge-logit check), picked
    by one warp vote (VOTE.ANY) over the tiles' k_descale; the first, masked and last tiles once. So the QGMMA count
    grows by one loop body's, not by the whole walk's (which spilled at the causal 64 / 256 defaults), and at 64 and
    128 there is no local memory. At 256 ptxas still keeps 2-3 values (the epilogue's addresses) in local memory
    across the loops, 5 (non-causal) to 15 (causal) spill instructions outside them (session 29): measured there
    before any flip, which needs zero."""
    base = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[head_dim], huge_hoisted=False)
    for causal in (False, True):
        plain = cubin.count_sass(_sass(base, head_dim, causal))
        hoisted_sass = _sass(dataclasses.replace(base, huge_hoisted=True, huge_guard=False), head_dim, causal)
        hoisted = cubin.count_sass(hoisted_sass)
        assert re.search(r"\bVOTE\.ANY\b", hoisted_sass), (head_dim, causal)
        assert plain["QGMMA"] < hoisted["QGMMA"] < 2 * plain["QGMMA"], (head_dim, causal, plain, hoisted)
        if head_dim < 256:
            assert hoisted["LDL"] == hoisted["STL"] == 0, (head_dim, causal, hoisted)


def test_huge_guard_and_huge_hoisted_are_exclusive():
    """The hoisted choice (the head_dim 128 default since session 29) leaves no tile for the per-tile guard: asking for
    both is refused with a message naming both, not compiled with the guard silently unused."""
    with pytest.raises(ValueError, match="huge_guard=True with huge_hoisted=True"):
        dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], huge_guard=True).check(128)
    dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[128], huge_guard=True, huge_hoisted=False).check(128)
    dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[64], huge_hoisted=True, huge_guard=False).check(64)
