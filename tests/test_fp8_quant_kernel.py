"""The FP8 quantisation pass in the CuTe DSL (fa_variants.fp8.quant_kernel; its host side quant_host):
compile-only checks (no GPU) and, on a GPU, the pass against the torch recipe on the same inputs, bit for bit (same
operations in the same order: e4m3 bytes, descales, V layout).

    source .gpu/env.sh && python3 -m pytest -m gpu tests/test_fp8_quant_kernel.py -q
"""
import contextlib
import operator
import dataclasses
import types

import pytest
import torch

from fa_variants import registry
from fa_variants.common import cubin
from fa_variants.common.softmax import tree_reduce
from fa_variants.fp8 import FP8Config, layout
from fa_variants.fp8 import quant_host as qh
from fa_variants.fp8 import quant_kernel as qk
from fa_variants.fp8.quantize import MIN_DESCALE, quantize_fp8, quantize_fp8_torch
from helpers import nan_filled_allocations, seeded_generator, subprocess_env

PASSES = [qk.PassConfig(shift=True), qk.PassConfig(smooth=True), qk.PassConfig(rotate=False),
          qk.PassConfig(mode="amax", shift=True), qk.PassConfig(mode="given"), qk.PassConfig(role="v", rotate=False),
          qk.PassConfig(role="v", rotate=False, mode="given"),
          # pipeline "v2": three stages of loads in flight, K read last block first, K's sums in V's launch
          qk.PassConfig(shift=True, stages=3, pdl=True), qk.PassConfig(smooth=True, stages=3, reverse=True, pdl=True),
          qk.PassConfig(role="v", rotate=False, stages=3, kmean=True),
          # pipeline "v3": v2 + coalesced loads through a swizzled stage + head-major block order
          qk.PassConfig(shift=True, stages=3, pdl=True, coalesced=True, head_major=True),
          qk.PassConfig(smooth=True, stages=3, reverse=True, pdl=True, coalesced=True, head_major=True),
          # (V's coalesced pass with K's sums compiled once, with the fused mean on: a superset of the default)
          qk.PassConfig(role="v", rotate=False, stages=3, kmean=True, coalesced=True, head_major=True,
                        fused_mean=True),
          # v3 + K's mean cp.async'd with each block's stage (``V3_STAGED_MEAN``)
          qk.PassConfig(shift=True, stages=3, pdl=True, coalesced=True, head_major=True, staged_mean=True),
          qk.PassConfig(smooth=True, stages=3, reverse=True, pdl=True, coalesced=True, head_major=True,
                        staged_mean=True),
          # V's launch summing K's sample tiles only (FP8Config.smooth_k_blocks)
          qk.PassConfig(role="v", rotate=False, stages=3, kmean=True, coalesced=True, head_major=True, k_sample=True),
          qk.PassConfig(role="v", rotate=False, stages=3, kmean=True, coalesced=True, head_major=True, k_sample=True,
                        fused_mean=True)]


@pytest.fixture
def arch(request, monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", request.param)  # read when the DSL first loads
    return request.param


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_89"], indirect=True)
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
@pytest.mark.parametrize("cfg", PASSES, ids=lambda c: f"{c.role}-rot{int(c.rotate)}-sm{int(c.smooth)}-"
                                                     f"sh{int(c.shift)}-{c.mode}-s{c.stages}-km{int(c.kmean)}"
                                                     f"-rev{int(c.reverse)}-pdl{int(c.pdl)}-co{int(c.coalesced)}"
                                                     f"-fm{int(c.fused_mean)}-stm{int(c.staged_mean)}"
                                                     f"-ks{int(c.k_sample)}")
def test_compiles_without_spills(arch, head_dim, cfg):
    """Every pass compiles for Hopper and Ada (no Hopper-only instructions); the SASS has the 16-byte
    cp.async loads (8 per thread, stages + 1 times: the first blocks before the loop, the one S ahead inside
    it; twice that with K's sums in V's launch, V or K; coalesced: stages times, S - 1 blocks ahead) and no
    other global loads of the data, the FWHT's
    shuffles (log2(head_dim / 64) stages across lanes, 64 values each; + 5 for the block max, +
    log2(head_dim / 64) for the LSE shift's sum, + 5 x 16 for K's sums), the e4m3 conversions (2 values
    each), the 16-byte e4m3 stores of Q / K (4 per thread) or V's 32-bit words (16 per thread; + 16 words
    of K's sums), and no local memory (no spills; except the coalesced Q / K passes at head_dim >= 128, whose
    loop holds the stage's addresses beside the 64 values at the 128-register cap: <= 16 bytes, 2-3 LDL / STL
    per block of 64 values per thread). Programmatic dependent launch is sm_90a's only."""
    if cfg.pdl and arch != "sm_90a":
        with pytest.raises(ValueError, match="needs sm_90a"):
            qk.static_config(arch, torch.bfloat16, head_dim, cfg)
        return
    c = qk.VARIANT.compiled(qk.static_config(arch, torch.bfloat16, head_dim, cfg))
    res = cubin.cubin_resources(c.cubin)
    ops = cubin.count_sass(cubin.sass_of(c.cubin), ("LDGSTS", "LDG.E.128", "LDG.E.64", "STG.E", "STG.E.64",
                                                    "STG.E.128", "SHFL.BFLY", "F2FP", "LDL", "STL"))
    spill = 16 if cfg.coalesced and cfg.role == "qk" and head_dim >= 128 else 0
    assert res["spill_bytes"] <= spill and ops["LDL"] <= spill // 4 and res["registers"] <= 128, (res, ops)
    loads = cfg.stages if cfg.coalesced else cfg.stages + 1
    # + the staged mean's one 16-byte cp.async per block (the prologue's means are plain loads after the PDL wait)
    assert ops["LDGSTS"] == 8 * loads * (2 if cfg.kmean else 1) + cfg.staged_mean, ops
    assert ops["LDG.E.128"] == ops["LDG.E.64"] == 0, ops
    stages = (head_dim // 64).bit_length() - 1
    assert ops["SHFL.BFLY"] == ((64 * stages if cfg.rotate else 0) + 5 + (stages if cfg.shift else 0)
                                + (80 if cfg.kmean else 0)), ops
    scalar_stores = ops["STG.E"] - ops["STG.E.64"] - ops["STG.E.128"]  # descale, shift, V's words, K's sums
    if cfg.mode == "amax":
        assert ops["F2FP"] == 0 and ops["STG.E.64"] == ops["STG.E.128"] == 0
    else:
        assert ops["F2FP"] == 32 and ops["STG.E.64"] == 0, ops
        assert ops["STG.E.128"] == (4 if cfg.role == "qk" else 0), ops
        words = 16 if cfg.role == "v" else 0
        assert scalar_stores == (words + (cfg.mode == "block") + cfg.shift + (16 if cfg.kmean else 0)
                                 + (2 if cfg.fused_mean else 0)), ops  # the fused mean: its value, the reset
    if cfg.fused_mean:  # one gpu-scope atomic per K block (the release fence beside it)
        assert cubin.count_sass(cubin.sass_of(c.cubin), ("ATOMG",))["ATOMG"] == 1


@pytest.mark.parametrize("rows", range(16, 257, 16))
def test_k_sum_groups(rows):
    """V's thread map (``thread_token`` / ``thread_chunk``: one chunk of 16 channels, 4 tokens per slot): every
    aligned group of ``k_sum_group(rows)`` lanes of a warp (one butterfly of K's sums)
    holds consecutive token quads of one chunk, and the groups' partial indices tile 0 .. k_parts_per_block - 1
    per chunk, each summing disjoint tokens that together cover the block."""
    quads, group, parts = rows // qk.SLOTS, qk.k_sum_group(rows), qk.k_parts_per_block(rows)
    assert 32 % group == 0 and quads % group == 0 and parts * group == quads
    threads = rows * 64 // (qk.VEC * qk.SLOTS)  # head_dim 64; the map repeats per chunk at larger head_dim
    covered = {}
    for t0 in range(0, threads, group):
        lanes = range(t0, t0 + group)
        chunks = {qk.thread_chunk("v", 0, quads, t, 0) for t in lanes}
        quad_ids = [t % quads for t in lanes]
        assert len(chunks) == 1 and quad_ids == list(range(quad_ids[0], quad_ids[0] + group)), (t0, chunks)
        part = quad_ids[0] // group
        toks = {qk.thread_token("v", 0, quads, t, j) for t in lanes for j in range(qk.SLOTS)}
        covered.setdefault(chunks.pop(), {})[part] = toks
    for by_part in covered.values():
        assert sorted(by_part) == list(range(parts))
        assert sorted(t for toks in by_part.values() for t in toks) == list(range(rows))


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a"], indirect=True)
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
def test_zero_block_rule_compiles(arch, head_dim):
    """The all-zero block rule (descale 1 where the amax bits, sign dropped, are 0; session 9) compiles at every
    head_dim into the default v3 Q pass (rotated, the LSE shift) and V pass (K's sums, fused mean): one test of the
    bits against 0x7fffffff each, no local memory beyond the Q pass's known <= 16 bytes; and the float arithmetic
    keeps subnormals (no .FTZ on FMNMX / FMUL / FADD / FFMA), which the torch recipe's bit equality for subnormal
    blocks (descale 2^-110, not 1) relies on."""
    import re

    for cfg in (qk.PassConfig(shift=True, stages=3, pdl=True, coalesced=True, head_major=True, staged_mean=True),
                qk.PassConfig(role="v", rotate=False, stages=3, kmean=True, coalesced=True, head_major=True,
                              fused_mean=True)):
        c = qk.VARIANT.compiled(qk.static_config(arch, torch.bfloat16, head_dim, cfg))
        sass = cubin.sass_of(c.cubin)
        assert len(re.findall(r"LOP3\.LUT P\d, RZ, R\d+, 0x7fffffff, RZ", sass)) == 1, cfg
        assert not re.search(r"\b(FMNMX|FMUL|FADD|FFMA)[A-Z0-9.]*\.FTZ", sass), cfg
        assert cubin.cubin_resources(c.cubin)["spill_bytes"] <= (16 if cfg.role == "qk" else 0)


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a"], indirect=True)
@pytest.mark.parametrize("cfg", [
    qk.PassConfig(role="v", rotate=False, rows=192, stages=3, kmean=True, coalesced=True, head_major=True),
    qk.PassConfig(smooth=True, rows=192, stages=3, reverse=True, pdl=True, coalesced=True, head_major=True,
                  staged_mean=True)], ids=["v-kmean", "k-staged"])
def test_compiles_rows_192(arch, cfg):
    """head_dim 64's default K/V blocks of 192 tokens (pipeline v3, staged mean): no local memory, 192 threads
    (two CTAs' registers per SM), K's sums in V's launch: 5 shuffles for the block max + 4 butterfly steps of
    16 values (16-quad groups, ``k_sum_group``)."""
    c = qk.VARIANT.compiled(qk.static_config(arch, torch.bfloat16, 64, cfg))
    res = cubin.cubin_resources(c.cubin)
    ops = cubin.count_sass(cubin.sass_of(c.cubin), ("SHFL.BFLY", "LDL", "STL"))
    assert res["spill_bytes"] == 0 and ops["LDL"] == ops["STL"] == 0, (res, ops)
    assert ops["SHFL.BFLY"] == 5 + (64 if cfg.kmean else 0), ops


def test_compile_cli_and_refusals(compile_cli):
    report = compile_cli("--arch", "sm_90a", "--variant", "fp8-quant", "--head-dim", "128", "--dtype", "bf16")
    assert report["spill_bytes"] == 0 and report["tiles"]["role"] == "qk"
    assert qk.PassConfig().rows == 128 and registry.variant("fp8-quant") is qk.VARIANT
    qk.PassConfig(rows=256).check(128)  # a K / V block height of 256 (tile_n) is a parameter
    with pytest.raises(ValueError, match="exceeds"):
        qk.PassConfig(rows=256).check(256)
    with pytest.raises(ValueError, match="LSE shift"):
        qk.PassConfig(smooth=True, shift=True).check(128)
    with pytest.raises(registry.UnsupportedConfigError, match="arch sm_80"):
        qk.static_config("sm_80", torch.bfloat16, 64, qk.PassConfig())
    with pytest.raises(ValueError, match="head_dim 96 is not built"):
        qk.PassConfig().check(96)
    with pytest.raises(ValueError, match="neither rotated"):
        qk.PassConfig(role="v").check(64)
    with pytest.raises(ValueError, match="partial sums ride on V"):
        qk.PassConfig(kmean=True).check(64)
    with pytest.raises(ValueError, match="fused mean finishes"):
        qk.PassConfig(role="v", rotate=False, fused_mean=True).check(64)
    qk.PassConfig(role="v", rotate=False, kmean=True, rows=192).check(64)  # tile_n 192 (head_dim 64's default)
    with pytest.raises(ValueError, match="shared memory"):
        qk.PassConfig(rows=256, stages=4).check(128)
    with pytest.raises(ValueError, match="bad pass config"):
        qk.PassConfig(stages=0).check(128)
    with pytest.raises(ValueError, match="bad pass config"):  # coalesced refills a stage others read: >= 2
        qk.PassConfig(stages=1, coalesced=True).check(128)
    with pytest.raises(ValueError, match="sampled K mean rides"):
        qk.PassConfig(role="v", rotate=False, stages=3, k_sample=True).check(128)
    with pytest.raises(ValueError, match="staged mean rides"):  # no mean to stage / no stages to ride on
        qk.PassConfig(stages=3, coalesced=True, staged_mean=True).check(128)
    with pytest.raises(ValueError, match="staged mean rides"):
        qk.PassConfig(smooth=True, stages=3, staged_mean=True).check(128)
    for bad in (dict(stages=3, staged_store=True), dict(role="v", rotate=False, stages=3, coalesced=True,
                                                        staged_store=True),
                dict(mode="amax", stages=3, coalesced=True, staged_store=True),
                dict(rows=48, stages=3, coalesced=True, staged_store=True)):  # not coalesced / V / no store / rows
        with pytest.raises(ValueError, match="staged store writes"):
            qk.PassConfig(**bad).check(64)
    qk.PassConfig(rows=192, stages=3, coalesced=True, staged_store=True).check(64)
    assert qh.pipeline_of(None) == qh.DEFAULT_PIPELINE and qh.pipeline_of("v3") == "v3"
    assert qh.own_mean("v3") and qh.own_mean("v2") and not qh.own_mean("v1")
    with pytest.raises(ValueError, match="pipeline must be one of"):
        qh.pipeline_of("v4")
    x = torch.zeros(1, 4, 2, 64)
    assert "CUDA tensors" in qh.why_not(x, FP8Config())


@pytest.mark.parametrize("seqlen_k,block_n,blocks", [(16384, 256, 8), (1000, 128, 3), (777, 128, 6), (300, 256, 1)])
def test_k_sample_items(seqlen_k, block_n, blocks):
    """V's launch's K items with a sampled mean (``k_sample_item``) visit exactly the tiles of
    ``quantize.k_sample_tiles`` once per (batch, kv-head), and each tile's partials go to its own sample slot
    (``k_sample_slot``: 0 .. m - 1 in tile order), so the host's sum over the partials is the sample's sum."""
    from fa_variants.fp8.quantize import k_sample_tiles

    tiles = k_sample_tiles(seqlen_k, block_n, blocks)
    T, m, B, H = -(-seqlen_k // block_n), len(tiles), 2, 3
    assert m < T
    seen = [qk.k_sample_item(j, H, T, m) for j in range(B * H * m)]
    assert sorted(seen) == sorted((b, h, t) for b in range(B) for h in range(H) for t in tiles)
    assert [qk.k_sample_slot(t, T, m) for t in tiles] == list(range(m))


@pytest.mark.parametrize("n_blocks,k_items,grid,threads", [(48, 48, 96, 512), (1024, 1024, 132, 512), (7, 5, 3, 2),
                                                           (0, 9, 4, 2), (5, 1, 8, 4), (100, 300, 7, 8)])
def test_late_count_items(n_blocks, k_items, grid, threads):
    """``late_count``: the K items each CTA counts after its loop (``late_first``, ``late_item``, rounds of
    ``threads``; items >= the launch's total skipped, as the kernel does) are exactly its own K items (those of its
    work items cta, cta + grid, ... at or past n_blocks), so every K block of the launch is counted once and no V
    block; the kernel's round count (n_items + threads - 1) // threads covers them."""
    from fa_variants.fp8.quant_maps import late_first, late_item

    total = n_blocks + k_items
    counted = []
    for cta in range(grid):
        first = late_first(cta, grid, n_blocks)
        n_items = (total - first + grid - 1) // grid
        assert n_items >= 0 and first % grid == cta and first >= n_blocks and first - grid < max(n_blocks, cta)
        mine = [late_item(first, grid, threads, r, t) for r in range((n_items + threads - 1) // threads)
                for t in range(threads)]
        mine = [b for b in mine if b < total]
        assert mine == [b for b in range(cta, total, grid) if b >= n_blocks], cta
        counted += mine
    assert sorted(counted) == list(range(n_blocks, total))


@pytest.mark.parametrize("role", ["qk", "v"])
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
@pytest.mark.parametrize("rows", [128, 192, 256])
def test_coalesced_stage_map(role, head_dim, rows):
    """The coalesced stage (pipeline v3) on the CPU, for every thread of a block: the cp.async pieces cover
    each (token, piece) of the block once; each thread reads back exactly the 16 channels of each slot that
    the register layout expects (its token and chunk); a warp's loads are 512 contiguous bytes of the
    (token, channel) block; and no bank conflict: every 8 threads of a 16-byte shared access (a quarter
    warp) touch 8 distinct 16-byte bank groups, for the cp.async writes and for the reads."""
    if rows * head_dim > qk.MAX_BLOCK:
        pytest.skip("block larger than one CTA holds")
    P, lanes, quads = head_dim // 8, head_dim // 64, rows // 4
    threads = rows * head_dim // 64
    where = {}
    for m in range(8):
        for t in range(threads):
            row, q, piece = qk.stage_load(head_dim, rows, role, lanes, t, m)
            assert (row, q) not in where and piece not in where.values()
            where[(row, q)] = piece
        for w in range(threads // 8):  # quarter warps of the cp.async writes
            banks = {qk.stage_load(head_dim, rows, role, lanes, 8 * w + i, m)[2] % 8 for i in range(8)}
            assert len(banks) == 8
        for w in range(threads // 32):  # a warp's global bytes: contiguous in (token, piece) order
            got = sorted(qk.stage_load(head_dim, rows, role, lanes, 32 * w + i, m)[:2] for i in range(32))
            flat = [r * P + q for r, q in got]
            assert flat == list(range(flat[0], flat[0] + 32))
    assert len(where) == rows * P
    for j in range(qk.SLOTS):
        for half in range(2):
            for t in range(threads):
                token = qk.thread_token(role, lanes, quads, t, j)
                q = 2 * qk.thread_chunk(role, lanes, quads, t, j) + half
                assert qk.stage_piece(role, lanes, quads, head_dim, t, j, half) == where[(token, q)]
            for w in range(threads // 8):
                banks = {qk.stage_piece(role, lanes, quads, head_dim, 8 * w + i, j, half) % 8 for i in range(8)}
                assert len(banks) == 8, (w, j, half)


@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
@pytest.mark.parametrize("rows", [32, 128, 192, 256])
def test_staged_store_map(head_dim, rows):
    """The staged e4m3 store (``PassConfig.staged_store``) on the CPU, for every thread of a Q / K block: the
    shared-memory writes (``store_unit``) put each thread's 4 chunks (its token, chunk lane + slot L) at distinct
    units inside the block's rows * head_dim bytes, the global stores (``store_map``) read back each (token, chunk)
    from the unit it was written to, cover the block once, a warp's stores are 512 contiguous bytes in (token,
    channel) order (whole 32-byte sectors), and no bank conflict: every quarter warp of a 16-byte shared access
    (writes per slot, reads per store) touches 8 distinct 16-byte bank groups."""
    if rows * head_dim > qk.MAX_BLOCK:
        pytest.skip("block larger than one CTA holds")
    lanes, per = head_dim // 64, head_dim // 16
    threads = rows * head_dim // 64
    written = {}
    for j in range(qk.SLOTS):
        for t in range(threads):
            unit = qk.store_unit(head_dim, t, j)
            key = (qk.thread_token("qk", lanes, rows // 4, t, j), qk.thread_chunk("qk", lanes, rows // 4, t, j))
            assert 0 <= unit < rows * qk.store_pitch(head_dim) and unit not in written.values()
            assert key not in written
            written[key] = unit
        for w in range(threads // 8):
            assert len({qk.store_unit(head_dim, 8 * w + i, j) % 8 for i in range(8)}) == 8, (w, j)
    assert len(written) == rows * per
    seen = set()
    for r in range(qk.SLOTS):
        for t in range(threads):
            row, chunk, unit = qk.store_map(head_dim, threads, t, r)
            assert written[(row, chunk)] == unit and (row, chunk) not in seen
            seen.add((row, chunk))
        for w in range(threads // 8):
            assert len({qk.store_map(head_dim, threads, 8 * w + i, r)[2] % 8 for i in range(8)}) == 8, (w, r)
        for w in range(threads // 32):
            flat = [row * per + chunk for row, chunk, _ in (qk.store_map(head_dim, threads, 32 * w + i, r)
                                                            for i in range(32))]
            assert flat == list(range(flat[0], flat[0] + 32))
    assert len(seen) == rows * per
    assert rows * qk.store_pitch(head_dim) * 16 <= 2 * rows * head_dim  # inside the block's 16-bit stage


STAGED_STORE = [qk.PassConfig(shift=True, stages=3, pdl=True, coalesced=True, head_major=True, staged_mean=True,
                              staged_store=True),
                qk.PassConfig(smooth=True, stages=3, reverse=True, pdl=True, coalesced=True, head_major=True,
                              staged_mean=True, staged_store=True),
                qk.PassConfig(stages=3, pdl=True, coalesced=True, head_major=True, staged_store=True),
                qk.PassConfig(mode="given", stages=3, coalesced=True, head_major=True, staged_store=True)]


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a"], indirect=True)
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
@pytest.mark.parametrize("cfg", STAGED_STORE, ids=["q-shift", "k-smooth", "qk-plain", "qk-given"])
def test_compiles_staged_store(arch, head_dim, cfg):
    """The staged store's Q / K passes (sm_90a): 4 16-byte e4m3 stores per thread (as without it), 4 16-byte
    shared stores and 4 loads of the e4m3 units, one barrier more per block, 128 registers at most, and local
    memory within the coalesced Q / K passes' budget (16 bytes, <= 4 LDL; the same pass without it: 0 / 16 / 8
    bytes at Q's head_dim 64 / 128 / 256, with it 0 / 8 / 16 on the CPU compile of session 6)."""
    c = qk.VARIANT.compiled(qk.static_config(arch, torch.bfloat16, head_dim, cfg))
    base = qk.VARIANT.compiled(qk.static_config(arch, torch.bfloat16, head_dim,
                                                dataclasses.replace(cfg, staged_store=False)))
    names = ("STG.E.128", "STS.128", "LDS.128", "BAR.SYNC", "LDL", "STL")
    ops, ops0 = (cubin.count_sass(cubin.sass_of(x.cubin), names) for x in (c, base))
    res, res0 = cubin.cubin_resources(c.cubin), cubin.cubin_resources(base.cubin)
    assert res["spill_bytes"] <= max(16, res0["spill_bytes"]) and ops["LDL"] <= max(4, ops0["LDL"]), (res, res0, ops)
    assert res["registers"] <= 128, res
    assert ops["STG.E.128"] == ops0["STG.E.128"] == 4, (ops, ops0)
    assert ops["STS.128"] == ops0["STS.128"] + 4 and ops["BAR.SYNC"] == ops0["BAR.SYNC"] + 1, (ops, ops0)
    assert ops["LDS.128"] >= ops0["LDS.128"] + 4, (ops, ops0)


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a"], indirect=True)
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
def test_compiles_late_count(arch, head_dim):
    """V's launch with the fused mean counted after the loop (``late_count``, sm_90a, the default recipe's tile_n):
    the same cp.async loads, shuffles, e4m3 conversions and global stores as the per-block fused mean, one gpu-scope
    atomic, no local memory, registers within the pass's cap (``min_blocks``), two barriers more (the done slots' and
    a round's end; the per-block count's two barriers and fence leave the loop), the mean's partials loaded
    ``MEAN_LOADS`` at a time; and a late count without the fused mean is refused."""
    rows = layout.tile_n(head_dim)
    base = qk.PassConfig(role="v", rotate=False, rows=rows, stages=3, kmean=True, coalesced=True, head_major=True,
                         fused_mean=True)
    late = dataclasses.replace(base, late_count=True)
    c, c0 = (qk.VARIANT.compiled(qk.static_config(arch, torch.bfloat16, head_dim, x)) for x in (late, base))
    names = ("LDGSTS", "SHFL.BFLY", "F2FP", "STG.E", "ATOMG", "BAR.SYNC", "LDL", "STL", "LDG.E")
    ops, ops0 = (cubin.count_sass(cubin.sass_of(x.cubin), names) for x in (c, c0))
    assert ops["LDG.E"] == qk.MEAN_LOADS, ops  # the mean's partials: MEAN_LOADS loads in flight (the only LDG)
    res = cubin.cubin_resources(c.cubin)
    threads = rows * head_dim // 64
    assert res["spill_bytes"] == 0 and res["registers"] <= 65536 // (threads * late.min_blocks(head_dim)), res
    assert ops["ATOMG"] == 1 and ops["LDL"] == ops["STL"] == 0, ops
    assert all(ops[n] == ops0[n] for n in ("LDGSTS", "SHFL.BFLY", "F2FP", "STG.E")), (ops, ops0)
    assert ops["BAR.SYNC"] == ops0["BAR.SYNC"] + 2, (ops, ops0)
    with pytest.raises(ValueError, match="late_count"):
        dataclasses.replace(base, fused_mean=False, late_count=True).check(head_dim)


# ------------------------------------------------------------------------------------------------ GPU


SHAPES = [(1, 1, 1, 2, 2), (2, 113, 300, 4, 2), (1, 1023, 4224, 6, 1), (1, 4224, 129, 2, 2)]
CONFIGS = {"default": FP8Config(), "no-smooth": FP8Config(smooth_k=False),
           "head": FP8Config(granularity="head", smooth_k=False),
           "head-smooth": FP8Config(granularity="head"),
           "tensor-plain": FP8Config(granularity="tensor", rotate=False, smooth_k=False)}
# (pipeline, dtype, config): v1 as before (+ no-smooth, timed by scripts/fp8_quant_bandwidth.py); v2 in bf16
# every config but "head" (its launches are head-smooth's without the mean), the default recipe in fp16 (the
# dtype only changes the load's element type; fewer compiles keep the GPU tests' precompile short)
CASES = ([("v1", dt, c) for dt in (torch.bfloat16, torch.float16) for c in ("default", "head", "tensor-plain")]
         + [("v1", torch.bfloat16, "no-smooth")]
         + [("v2", torch.bfloat16, c) for c in CONFIGS if c != "head"] + [("v2", torch.float16, "default")]
         + [("v3", torch.bfloat16, c) for c in CONFIGS if c != "head"] + [("v3", torch.float16, "default")])


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("pipeline,dtype,config", CASES,
                         ids=[f"{p}-{str(dt)[6:]}-{c}" for p, dt, c in CASES])
def test_pass_matches_torch_bitwise(rng_seed, shape, head_dim, dtype, config, pipeline):
    """The same FP8Inputs from the GPU pass and from the torch recipe on the same CUDA inputs: e4m3 bytes,
    descales and V layout equal bit for bit (the same float32 operations in the same order; inputs are
    normal numbers, so subnormal flushing cannot differ); lse_shift (the kernel's own float32 dot product in
    the Q pass) equals torch's to float32 rounding. K's mean: pipeline v1 takes it from the same torch code
    (equal); v2 sums K in V's launch (another order: checked against float64 within its rounding bound),
    and the torch recipe is given that mean, so the rest still compares bit for bit."""
    config = CONFIGS[config]
    B, Nq, Nk, H, Hkv = shape
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    q = (torch.randn(B, Nq, H, head_dim, device="cuda", generator=g) * 3).to(dtype)
    k = (torch.randn(B, Nk, Hkv, head_dim, device="cuda", generator=g) + 2).to(dtype)
    v = torch.randn(B, Nk, Hkv, head_dim, device="cuda", generator=g).to(dtype)
    for scale in (None, -0.3):
        with nan_filled_allocations():  # outputs NaN-filled: a byte the pass never writes (V's padding) fails
            gpu = qh.quantize(q, k, v, config=config, softmax_scale=scale, pipeline=pipeline)
        given = None
        if config.smooth_k and qh.own_mean(pipeline):
            given = gpu.k_mean if scale is None else -gpu.k_mean  # the unnegated mean (negation is exact)
            assert_k_mean_close(given, k, block_n=gpu.block_n)
        ref = quantize_fp8_torch(q, k, v, config=config, softmax_scale=scale, k_mean=given)
        for name in ("q", "k", "v_t"):
            a, b = getattr(gpu, name), getattr(ref, name)
            assert a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
        for name in ("q_descale", "k_descale", "v_descale"):
            assert torch.equal(getattr(gpu, name), getattr(ref, name)), name
        assert gpu.softmax_scale == ref.softmax_scale and gpu.seqlen_k == ref.seqlen_k
        if config.smooth_k:
            assert torch.equal(gpu.k_mean, ref.k_mean)
            assert_shift_close(gpu.lse_shift, ref.lse_shift, q, ref.k_mean, ref.softmax_scale)


def assert_k_mean_close(got, k, block_n):
    """The v2 pass's K mean vs float64: |got - mean| <= (P + 10) * 2^-24 * mean_t |k| per (batch, kv-head,
    channel), the bound of float32 summation at depth P + 10 (the thread's 4 tokens: 3 roundings, the warp
    butterfly: <= 5, times float32(1 / seqlen_k): 2, torch's sum of the P partials in any order: <= P - 1),
    P = partials per (batch, kv-head). A token missed or counted twice moves the mean by |k_t| / seqlen_k,
    far above the bound (P ~ seqlen_k / 128)."""
    Nk = k.shape[1]
    if Nk == 0:
        assert torch.equal(got, torch.zeros_like(got))
        return
    parts = -(-Nk // block_n) * qk.k_parts_per_block(block_n)
    kd = k.double()
    n = parts + 10
    bound = n * 2.0 ** -24 * 1.01 * kd.abs().mean(dim=1)  # 1.01: gamma_n = n u / (1 - n u)
    err = (got.double() - kd.mean(dim=1)).abs()
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert (err <= bound).all(), (err / bound).max().item()


def assert_shift_close(got, want, q, mean, scale):
    """|got - want| <= 1e-6 * scale * sum_d |q_d mean_d| per row (float32 sums of 64..256 products in two
    orders differ by a few ulps of that sum), and NaN-free."""
    B, Nq, H, D = q.shape
    Hkv = mean.shape[1]
    bound = torch.einsum("bqkgd,bkd->bkgq", q.double().abs().reshape(B, Nq, Hkv, H // Hkv, D),
                         mean.double().abs()).reshape(B, H, Nq) * scale
    assert got.shape == want.shape and torch.isfinite(got).all()
    assert ((got.double() - want.double()).abs() <= 1e-6 * bound + 1e-30).all()


@pytest.mark.gpu
@pytest.mark.parametrize("pipeline", qh.PIPELINES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_n", [192, 256])
def test_pass_block_height(rng_seed, monkeypatch, head_dim, pipeline, block_n):
    """K / V blocks of 192 tokens (head_dim 64's default tile_n: K's sums in V's launch in three 16-quad
    butterflies per block, ``qk.k_sum_group``) and 256 (a tile_n of 256 in fp8.layout): the pass takes the block
    height from the layout, and still equals the torch recipe (K's mean: float64's within its bound)."""
    from fa_variants.fp8 import layout

    monkeypatch.setitem(layout.KERNEL_TILES, head_dim, (layout.KERNEL_TILES[head_dim][0], block_n))
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    q = torch.randn(1, 300, 4, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    k = (torch.randn(1, 777, 2, head_dim, device="cuda", generator=g) + 1).to(torch.bfloat16)
    v = torch.randn(1, 777, 2, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    gpu = qh.quantize(q, k, v, pipeline=pipeline)
    ref = quantize_fp8_torch(q, k, v, k_mean=gpu.k_mean if qh.own_mean(pipeline) else None)
    assert gpu.block_n == block_n and gpu.k_descale.shape[-1] == -(-777 // block_n)
    if qh.own_mean(pipeline):
        assert_k_mean_close(gpu.k_mean, k, block_n=block_n)
    for name in ("q", "k", "v_t"):
        assert torch.equal(getattr(gpu, name).view(torch.uint8), getattr(ref, name).view(torch.uint8)), name
    for name in ("q_descale", "k_descale", "v_descale"):
        assert torch.equal(getattr(gpu, name), getattr(ref, name)), name


@pytest.mark.gpu
@pytest.mark.parametrize("pipeline", qh.PIPELINES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_pass_zero_and_subnormal_blocks(pipeline, head_dim):
    """All-zero and subnormal blocks on the GPU: descale 1 for the zero block (session 9), 2^-110 for the subnormal
    one, e4m3 zeros, like the torch path bit for bit (the default block heights: K/V blocks of 192 tokens at head_dim
    64)."""
    from fa_variants.fp8 import layout

    tn = layout.tile_n(head_dim)
    x = torch.randn(1, 2 * tn + 44, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    x[:, :tn, 0] = 0
    x[:, tn:2 * tn, 1] = torch.finfo(torch.bfloat16).tiny / 4
    gpu = qh.quantize(x, x, x, pipeline=pipeline)
    ref = quantize_fp8_torch(x, x, x, k_mean=gpu.k_mean if qh.own_mean(pipeline) else None)
    for name in ("q_descale", "k_descale", "v_descale"):
        d = getattr(gpu, name)
        assert torch.isfinite(d).all() and (d > 0).all() and torch.equal(d, getattr(ref, name))
    assert gpu.v_descale[0, 0, 0].item() == 1.0 and gpu.v_descale[0, 1, 1].item() == MIN_DESCALE
    assert gpu.q_descale[0, 0, 0].item() == 1.0
    assert torch.equal(gpu.q.view(torch.uint8), ref.q.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
def test_v3_equals_v2_bitwise(rng_seed, head_dim):
    """Pipeline v3 changes which thread loads which bytes and the order of the blocks, not one operation: every
    output (e4m3 bytes, descales, V layout, K's mean, LSE shift) equals v2's bit for bit; GQA, odd lengths,
    batch > 1, a negative scale, fresh inputs (an output v3 left unwritten would differ)."""
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    q = (torch.randn(3, 517, 8, head_dim, device="cuda", generator=g) * 2).to(torch.bfloat16)
    k = (torch.randn(3, 1001, 2, head_dim, device="cuda", generator=g) - 1).to(torch.bfloat16)
    v = torch.randn(3, 1001, 2, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    for scale in (None, -0.7):
        with nan_filled_allocations():  # outputs and scratch NaN-filled: an unwritten element fails
            a = qh.quantize(q, k, v, softmax_scale=scale, pipeline="v2")
            b = qh.quantize(q, k, v, softmax_scale=scale, pipeline="v3")
        for name in ("q", "k", "v_t"):
            assert torch.equal(getattr(a, name).view(torch.uint8), getattr(b, name).view(torch.uint8)), name
        for name in ("q_descale", "k_descale", "v_descale", "k_mean", "lse_shift"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
@pytest.mark.parametrize("config", ["default", "head-smooth"])
def test_v3_staged_mean_bitwise(rng_seed, monkeypatch, head_dim, config):
    """v3 with K's mean cp.async'd with each block's stage (``V3_STAGED_MEAN``) moves where the mean comes from,
    not one operation: every output (e4m3 bytes, descales, V layout, K's mean, LSE shift) equals plain v3's bit for
    bit; GQA, odd lengths, batch > 1 (CTAs walk several heads and batches), a negative scale, the per-head
    baseline (its "amax" and "given" launches read the mean too), fresh NaN-poisoned memory."""
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    q = (torch.randn(3, 517, 8, head_dim, device="cuda", generator=g) * 2).to(torch.bfloat16)
    k = (torch.randn(3, 1001, 2, head_dim, device="cuda", generator=g) - 1).to(torch.bfloat16)
    v = torch.randn(3, 1001, 2, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    k = k + torch.linspace(-4, 4, head_dim, device="cuda").to(torch.bfloat16)  # a channel bias: the mean matters
    for scale in (None, -0.7):
        got = []
        for staged in (False, True):
            monkeypatch.setattr(qh, "V3_STAGED_MEAN", staged)
            with nan_filled_allocations():  # outputs and scratch NaN-filled: an unwritten element fails
                got.append(qh.quantize(q, k, v, config=CONFIGS[config], softmax_scale=scale, pipeline="v3"))
        a, b = got
        for name in ("q", "k", "v_t"):
            assert torch.equal(getattr(a, name).view(torch.uint8), getattr(b, name).view(torch.uint8)), name
        for name in ("q_descale", "k_descale", "v_descale", "k_mean", "lse_shift"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert torch.isfinite(b.lse_shift).all() and b.lse_shift.abs().max() > 0


def switch_inputs(head_dim: int, seed: int) -> tuple:
    """The switch A/Bs' bf16 q, k, v on the GPU: batch 3, GQA 8:2, odd lengths (517 queries, 1001 keys: tail tokens),
    K off-centre with a per-channel bias (what smoothing removes)."""
    g = seeded_generator("cuda", seed)
    q = (torch.randn(3, 517, 8, head_dim, device="cuda", generator=g) * 2).to(torch.bfloat16)
    k = (torch.randn(3, 1001, 2, head_dim, device="cuda", generator=g) - 1).to(torch.bfloat16)
    v = torch.randn(3, 1001, 2, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    return q, k + torch.linspace(-4, 4, head_dim, device="cuda").to(torch.bfloat16), v


def assert_switch_bitwise(monkeypatch, switch: str, head_dim: int, config: str, seed: int, on_value=True):
    """quant_host.``switch`` off (False) vs on (``on_value``; the current default otherwise, staged mean on): every
    output equal bit for
    bit; GQA, odd lengths (tail tokens not stored), batch > 1, a negative scale, the per-head baseline (its "amax"
    and "given" launches), fresh NaN-poisoned memory; and (scale None) the torch recipe given the pass's mean."""
    monkeypatch.setattr(qh, "V3_STAGED_MEAN", True)
    cfg = FP8Config(smooth_k_blocks=8) if config == "sampled8" else CONFIGS[config]
    q, k, v = switch_inputs(head_dim, seed * head_dim)
    for scale in (None, -0.7):
        got = []
        for on in (False, on_value):
            monkeypatch.setattr(qh, switch, on)
            with nan_filled_allocations():  # outputs and scratch NaN-filled: an unwritten element fails
                got.append(qh.quantize(q, k, v, config=cfg, softmax_scale=scale, pipeline="v3"))
        a, b = got
        for name in ("q", "k", "v_t"):
            assert torch.equal(getattr(a, name).view(torch.uint8), getattr(b, name).view(torch.uint8)), name
        for name in ("q_descale", "k_descale", "v_descale", "k_mean", "lse_shift"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or torch.equal(x, y), name
        assert not torch.isnan(b.q.float()).any() and not torch.isnan(b.k.float()).any()
        if scale is None:  # and the torch recipe given the pass's mean, bit for bit (the default's own check)
            ref = quantize_fp8_torch(q, k, v, config=cfg, k_mean=b.k_mean if cfg.smooth_k else None)
            assert torch.equal(ref.q.view(torch.uint8), b.q.view(torch.uint8))
            assert torch.equal(ref.k.view(torch.uint8), b.k.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
@pytest.mark.parametrize("config", ["default", "sampled8", "no-smooth", "head-smooth"])
def test_v3_staged_store_bitwise(monkeypatch, head_dim, config):
    """v3 with Q's / K's e4m3 stored through shared memory (``V3_STAGED_STORE``) changes which thread stores which
    bytes, not one operation: every output equals v3's without it bit for bit (``assert_switch_bitwise``; the per-head
    baseline's "given" launch stores through the stage too, its "amax" launch stores nothing)."""
    assert_switch_bitwise(monkeypatch, "V3_STAGED_STORE", head_dim, config, 13)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
@pytest.mark.parametrize("pipeline", ["v1", "v3", "v3+staged", "v3+staged+fused"])
def test_sampled_k_mean(rng_seed, monkeypatch, head_dim, pipeline):
    """FP8Config(smooth_k_blocks=m): K's mean over the tokens of m evenly spaced K tiles. v1 takes it from torch
    (``quantize.k_mean``: equal bit for bit); v3 sums the sample tiles in V's launch (``PassConfig.k_sample``:
    within float32 summation's bound of the float64 mean of exactly those tokens, far from the full mean); every
    other output equals the torch recipe's given that mean bit for bit. m < T with a partial last tile, m >= T
    (the exact mean), GQA, batch > 1, a negative scale; "+staged" also stages the mean (``V3_STAGED_MEAN``),
    "+fused" finishes it in V's launch (``V3_FUSED_MEAN``: the counters count the sample tiles; two calls in a
    row give the same mean, so the counters were left at zero)."""
    from fa_variants.fp8.quantize import k_sample_tiles

    monkeypatch.setattr(qh, "V3_STAGED_MEAN", "+staged" in pipeline)
    monkeypatch.setattr(qh, "V3_FUSED_MEAN", "+fused" in pipeline)
    pipe = pipeline.split("+")[0]
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    B, Nq, Nk, H, Hkv = 2, 300, 3001, 8, 2
    q = (torch.randn(B, Nq, H, head_dim, device="cuda", generator=g) * 2).to(torch.bfloat16)
    k = (torch.randn(B, Nk, Hkv, head_dim, device="cuda", generator=g) + 1).to(torch.bfloat16)
    k[:, Nk // 2:] += 3  # the sample's mean differs from the full mean
    v = torch.randn(B, Nk, Hkv, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    for blocks, scale in ((3, None), (5, -0.6), (1000, None)):
        config = FP8Config(smooth_k_blocks=blocks)
        with nan_filled_allocations():  # outputs and scratch NaN-filled: an unwritten element fails
            gpu = qh.quantize(q, k, v, config=config, softmax_scale=scale, pipeline=pipe)
            again = qh.quantize(q, k, v, config=config, softmax_scale=scale, pipeline=pipe)
        assert torch.equal(gpu.k_mean, again.k_mean)  # deterministic (and the fused mean's counters reset)
        mean = gpu.k_mean if scale is None else -gpu.k_mean
        tiles = k_sample_tiles(Nk, gpu.block_n, blocks)
        tokens = torch.cat([torch.arange(t * gpu.block_n, min((t + 1) * gpu.block_n, Nk)) for t in tiles])
        if pipe == "v1":
            assert torch.equal(mean, quantize_fp8_torch(q, k, v, config=config).k_mean)
        else:
            assert_k_mean_close(mean, k[:, tokens.cuda()], block_n=gpu.block_n)
        if blocks < len(range(0, Nk, gpu.block_n)):
            assert (mean - k.float().mean(dim=1)).abs().max() > 0.2  # the sample's mean, not the full one
        ref = quantize_fp8_torch(q, k, v, config=config, softmax_scale=scale, k_mean=mean)
        for name in ("q", "k", "v_t"):
            assert torch.equal(getattr(gpu, name).view(torch.uint8), getattr(ref, name).view(torch.uint8)), name
        for name in ("q_descale", "k_descale", "v_descale", "k_mean"):
            assert torch.equal(getattr(gpu, name), getattr(ref, name)), name
        assert_shift_close(gpu.lse_shift, ref.lse_shift, q, ref.k_mean, ref.softmax_scale)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
def test_v3_fused_mean(rng_seed, monkeypatch, head_dim):
    """v3 with K's mean finished in V's launch (``V3_FUSED_MEAN``): the mean within float32 summation's bound of
    float64, every other output equal to the torch recipe's given that mean bit for bit, the same bits on
    every call (deterministic order; the counters left at zero for the next call), GQA, batch > 1, odd
    lengths, one key, no key."""
    monkeypatch.setattr(qh, "V3_FUSED_MEAN", True)
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    for B, Nq, Nk, H, Hkv in ((2, 300, 1001, 8, 2), (1, 7, 1, 2, 1), (1, 5, 0, 2, 2)):
        q = (torch.randn(B, Nq, H, head_dim, device="cuda", generator=g) * 2).to(torch.bfloat16)
        k = (torch.randn(B, Nk, Hkv, head_dim, device="cuda", generator=g) + 1.5).to(torch.bfloat16)
        v = torch.randn(B, Nk, Hkv, head_dim, device="cuda", generator=g).to(torch.bfloat16)
        first = None
        for call in range(3):
            gpu = qh.quantize(q, k, v, pipeline="v3")
            assert_k_mean_close(gpu.k_mean, k, block_n=gpu.block_n)
            first = gpu if first is None else first
            assert torch.equal(gpu.k_mean, first.k_mean), call
        ref = quantize_fp8_torch(q, k, v, k_mean=gpu.k_mean)
        for name in ("q", "k", "v_t"):
            assert torch.equal(getattr(gpu, name).view(torch.uint8), getattr(ref, name).view(torch.uint8)), name
        for name in ("q_descale", "k_descale", "v_descale"):
            assert torch.equal(getattr(gpu, name), getattr(ref, name)), name
        assert_shift_close(gpu.lse_shift, ref.lse_shift, q, ref.k_mean, ref.softmax_scale)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,config", [(d, c) for c in ("default", "sampled8") for d in qk.HEAD_DIMS]
                         + [(128, "head-smooth")])
def test_v3_fused_mean_late_bitwise(rng_seed, monkeypatch, head_dim, config):
    """The fused mean counted after each CTA's loop (``V3_FUSED_MEAN_LATE``) vs per K block (``V3_FUSED_MEAN``): the
    same partials added in the same order, so every output (K's mean included) is equal bit for bit
    (``assert_switch_bitwise``: GQA, odd lengths, batch 3, a negative scale, NaN-poisoned memory, and the torch recipe
    given the pass's mean; head-smooth: the per-head baseline's "amax" launch carries K's sums); the same with 21 K
    tiles (sampled8: then V's launch sums only the sample, ``k_sample``); and the mean within float32 summation's
    bound of float64 (over the sample for sampled8)."""
    monkeypatch.setattr(qh, "V3_FUSED_MEAN", True)
    assert_switch_bitwise(monkeypatch, "V3_FUSED_MEAN_LATE", head_dim, config, 19)
    # and with more K tiles than the sample (sampled8: V's launch sums the 8 sample tiles only, ``k_sample``)
    cfg = FP8Config(smooth_k_blocks=8) if config == "sampled8" else CONFIGS[config]
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    k = (torch.randn(2, 21 * layout.tile_n(head_dim) - 5, 2, head_dim, device="cuda", generator=g) + 1.5).to(
        torch.bfloat16)
    q = torch.randn(2, 33, 4, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    got = []
    for late in (False, True):
        monkeypatch.setattr(qh, "V3_FUSED_MEAN_LATE", late)
        got.append(qh.quantize(q, k, k, config=cfg, pipeline="v3"))
    for name in ("q", "k", "v_t"):
        assert torch.equal(getattr(got[0], name).view(torch.uint8), getattr(got[1], name).view(torch.uint8)), name
    for name in ("q_descale", "k_descale", "v_descale", "k_mean", "lse_shift"):
        assert torch.equal(getattr(got[0], name), getattr(got[1], name)), name
    if cfg.smooth_k:  # over the sample's tokens for sampled8 (8 of 21 tiles), else every token
        from fa_variants.fp8.quantize import k_sample_tiles

        bn = got[1].block_n
        tiles = k_sample_tiles(k.shape[1], bn, cfg.smooth_k_blocks)
        tokens = torch.cat([torch.arange(t * bn, min((t + 1) * bn, k.shape[1])) for t in tiles]).cuda()
        assert_k_mean_close(got[1].k_mean, k[:, tokens], block_n=bn)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,grid,many", [(64, 1, True), (128, 1, False), (256, 2, False)])
def test_v3_fused_mean_late_rounds(rng_seed, monkeypatch, head_dim, grid, many):
    """``V3_FUSED_MEAN_LATE`` with the launch cut to ``grid`` CTAs (``quant_host.GRID_CAP``): each CTA finishes
    several heads' means, and (many; head_dim 64, whose 192 threads need the fewest blocks) counts more K blocks than
    it has threads (three rounds of ``count_late``): every output equal bit for bit to the per-block fused mean's on
    the same grid, the same on a second call (its counters were left at zero), and equal to the full grid's (the
    partials do not depend on the grid)."""
    rows = layout.tile_n(head_dim)
    threads = rows * head_dim // 64
    Hkv = 3
    # many: > 2 x threads K blocks per CTA (and a tail); else 8 blocks per head, a tail
    Nk = (2 * threads * grid // Hkv + 5) * rows - 17 if many else 8 * rows - 17
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    q = torch.randn(1, 64, 6, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    k = (torch.randn(1, Nk, Hkv, head_dim, device="cuda", generator=g) - 0.5).to(torch.bfloat16)
    v = torch.randn(1, Nk, Hkv, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    monkeypatch.setattr(qh, "V3_STAGED_MEAN", True)
    monkeypatch.setattr(qh, "V3_FUSED_MEAN", True)
    full = qh.quantize(q, k, v, pipeline="v3")
    monkeypatch.setattr(qh, "GRID_CAP", grid)
    outs = []
    for late in (False, True, True):
        monkeypatch.setattr(qh, "V3_FUSED_MEAN_LATE", late)
        outs.append(qh.quantize(q, k, v, pipeline="v3"))
    for other in (outs[1], outs[2], full):
        for name in ("q", "k", "v_t"):
            assert torch.equal(getattr(outs[0], name).view(torch.uint8), getattr(other, name).view(torch.uint8)), name
        for name in ("q_descale", "k_descale", "v_descale", "k_mean", "lse_shift"):
            assert torch.equal(getattr(outs[0], name), getattr(other, name)), name
    assert_k_mean_close(outs[1].k_mean, k, block_n=outs[1].block_n)


@pytest.mark.gpu
def test_default_entry_uses_the_pipeline_switch(rng_seed, monkeypatch):
    """quantize_fp8(impl="kernel") runs the pipeline named by FA_VARIANTS_FP8_QUANT_PIPELINE: with v2 the
    mean is the pass's own (not torch's k_mean bit for bit in general, but within the bound), and the
    inputs are not modified."""
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    q = torch.randn(2, 515, 8, 128, device="cuda", generator=g).to(torch.bfloat16)
    k = (torch.randn(2, 1029, 2, 128, device="cuda", generator=g) + 1).to(torch.bfloat16)
    v = torch.randn(2, 1029, 2, 128, device="cuda", generator=g).to(torch.bfloat16)
    before = [t.clone() for t in (q, k, v)]
    monkeypatch.setenv("FA_VARIANTS_FP8_QUANT_PIPELINE", "v2")
    gpu = quantize_fp8(q, k, v, impl="kernel")
    assert_k_mean_close(gpu.k_mean, k, block_n=gpu.block_n)
    ref = quantize_fp8_torch(q, k, v, k_mean=gpu.k_mean)
    assert torch.equal(gpu.k.view(torch.uint8), ref.k.view(torch.uint8))
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v)))


def test_staged_store_rule(monkeypatch):
    """The staged e4m3 store's default (``V3_STAGED_STORE`` None) is on at head_dim 64 only (the H200 A/B:
    faster there, slower at 128 / 256); 1 / 0 force it at every head_dim; the environment value is checked."""
    monkeypatch.setattr(qh, "V3_STAGED_STORE", None)
    monkeypatch.setattr(qh, "V3_WIDE128", False)
    for t in ("k", "q"):
        assert [qh.staged_store_for(d, t) for d in (64, 128, 256)] == [True, False, False]
    for forced in (True, False):
        monkeypatch.setattr(qh, "V3_STAGED_STORE", forced)
        assert [qh.staged_store_for(d, t) for d in (64, 128, 256) for t in "kq"] == [forced] * 6
    with pytest.raises(ValueError, match="'q' or 'k'"):
        qh.staged_store_for(128, "v")
    monkeypatch.setenv("FA_VARIANTS_FP8_QUANT_STAGED_STORE", "2")
    with pytest.raises(ValueError, match="FA_VARIANTS_FP8_QUANT_STAGED_STORE"):
        qh._env.auto_flag("FA_VARIANTS_FP8_QUANT_STAGED_STORE")


# ----------------------------------------------------------------------------- wide: 8 chunks of a token per thread
def _emulated_fwht(x: torch.Tensor, slots: int) -> list[torch.Tensor]:
    """``QuantPass.fwht``'s data flow in float32 for a token of D = x.shape[1] channels held by L = D / (16 slots)
    lanes: regs[lane][:, j, i] = channel 16 (lane + j L) + i; the chunk stages, the cross-lane stages (x * sign + the
    partner's value, one rounding: x * (+-1) is exact), the slot stages."""
    D = x.shape[1]
    L = D // (16 * slots)
    regs = [x[:, [16 * (lane + j * L) + i for j in range(slots) for i in range(16)]].reshape(-1, slots, 16).clone()
            for lane in range(L)]
    for r in regs:  # h = 1..8
        for b in range(4):
            h = 1 << b
            for i in range(16):
                if not i & h:
                    a, c = r[:, :, i].clone(), r[:, :, i + h].clone()
                    r[:, :, i], r[:, :, i + h] = a + c, a - c
    for b in range(L.bit_length() - 1):  # h = 16 .. 8 L: shfl.bfly(offset 2^b) + FMA
        before = [r.clone() for r in regs]
        for lane in range(L):
            sign = 1.0 - 2.0 * (lane >> b & 1)
            regs[lane] = before[lane] * sign + before[lane ^ (1 << b)]
    for r in regs:  # h = 16 L .. D / 2: the thread's slots
        for b in range(slots.bit_length() - 1):
            h = 1 << b
            for j in range(slots):
                if not j & h:
                    a, c = r[:, j, :].clone(), r[:, j + h, :].clone()
                    r[:, j, :], r[:, j + h, :] = a + c, a - c
    return regs


def _emulated_shift(x: torch.Tensor, mean: torch.Tensor, slots: int, chains: int = 1) -> torch.Tensor:
    """``QuantPass.lse_shift``'s sum (before the scale) in float32 for L = D / (16 slots) lanes per token, with fma
    emulated (one rounding to float32 of the float64 product + sum): the default (4 slots) sums its 64 products in
    ``chains`` interleaved chains (product i of a chunk into chain i % chains, in order), adds the chains pairwise,
    then a butterfly over the lanes; ``wide`` (8 slots) the same per group of even / odd slots, the butterfly on
    both, then even + odd. Returns lane 0's value (the one written)."""
    D = x.shape[1]
    L = D // (16 * slots)
    fma = lambda a, b, c: (a.double() * b.double() + c.double()).float()  # noqa: E731
    acc = [[[torch.zeros(x.shape[0]) for _ in range(chains)] for _ in range(2)] for _ in range(L)]
    for lane in range(L):
        for j in range(slots):
            group = acc[lane][j % 2 if slots == 8 else 0]
            for i in range(16):
                c = 16 * (lane + j * L) + i
                group[i % chains] = fma(x[:, c], mean[c].expand(x.shape[0]), group[i % chains])
    sums = [[tree_reduce(acc[lane][w], operator.add) for w in range(2)] for lane in range(L)]
    for b in range(L.bit_length() - 1):
        sums = [[sums[lane][w] + sums[lane ^ (1 << b)][w] for w in range(2)] for lane in range(L)]
    return sums[0][0] + sums[0][1] if slots == 8 else sums[0][0]


@pytest.mark.parametrize("D", [128, 256])
def test_wide_emulated_bitwise(rng_seed, D):
    """``PassConfig.wide`` emulated in float32, at head_dim 256 (2 lanes of 8 chunks per token, one cross-lane stage)
    and 128 (``V3_WIDE128``: 1 lane of 8 chunks, no cross-lane stage): the Hadamard equals ``quantize.fwht``
    (unnormalised) bit for bit, as the default's data flow (4 chunks per lane: 4 / 2 lanes) does, on values whose sums
    round (float64 differs); the LSE shift's sum equals the default's bit for bit (the same additions in the same
    order), and a plain in-order float32 sum differs (the order matters)."""
    from fa_variants.fp8.quantize import fwht

    x = torch.randn(41, D, generator=torch.Generator().manual_seed(rng_seed)) * torch.logspace(-3, 3, D)
    want = fwht(x, normalise=False)
    assert not torch.equal(fwht(x.double(), normalise=False).float(), want)
    for slots in (4, 8):
        L = D // (16 * slots)
        regs = _emulated_fwht(x, slots)
        got = torch.empty_like(x)
        for lane in range(L):
            for j in range(slots):
                got[:, 16 * (lane + j * L):16 * (lane + j * L) + 16] = regs[lane][:, j, :]
        assert torch.equal(got, want), slots
    mean = torch.randn(D, generator=torch.Generator().manual_seed(rng_seed + 1)) * torch.logspace(2, -2, D)
    default, wide = _emulated_shift(x, mean, 4), _emulated_shift(x, mean, 8)
    assert torch.equal(default, wide)
    plain = torch.zeros(x.shape[0])
    for c in range(D):
        plain = (x[:, c].double() * mean[c].double() + plain.double()).float()
    assert not torch.equal(plain, default)


@pytest.mark.parametrize("D,rows", [(256, 128), (256, 192), (128, 128), (128, 256)])
def test_wide_stage_map(D, rows):
    """``wide``'s coalesced stage (head_dim 256: 2 lanes per token; 128: 1 lane, ``V3_WIDE128``; 16 cp.async per thread
    at token step rows / 16): the pieces cover the block once, a warp's loads are 512 contiguous bytes, each thread
    reads back its 8 chunks' 16 channels, and every quarter warp's writes and reads hit 8 distinct 16-byte bank
    groups."""
    lanes, slots = D // 128, 8
    P, threads = D // 8, rows * D // (16 * slots)
    where = {}
    for m in range(2 * slots):
        for t in range(threads):
            row, q, piece = qk.stage_load(D, rows, "qk", lanes, t, m, 2 * slots)
            assert (row, q) not in where and piece not in where.values()
            where[(row, q)] = piece
        for w in range(threads // 8):
            assert len({qk.stage_load(D, rows, "qk", lanes, 8 * w + i, m, 2 * slots)[2] % 8 for i in range(8)}) == 8
        for w in range(threads // 32):
            got = sorted(qk.stage_load(D, rows, "qk", lanes, 32 * w + i, m, 2 * slots)[:2] for i in range(32))
            flat = [r * P + q for r, q in got]
            assert flat == list(range(flat[0], flat[0] + 32))
    assert len(where) == rows * P
    for j in range(slots):
        for half in range(2):
            for t in range(threads):
                q = 2 * qk.thread_chunk("qk", lanes, 0, t, j) + half
                assert qk.stage_piece("qk", lanes, 0, D, t, j, half) == where[(t // lanes, q)]
            for w in range(threads // 8):
                assert len({qk.stage_piece("qk", lanes, 0, D, 8 * w + i, j, half) % 8 for i in range(8)}) == 8


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a"], indirect=True)
@pytest.mark.parametrize("name,extra", [("k-smooth", dict(smooth=True, reverse=True)), ("q-shift", dict(shift=True))])
def test_compiles_wide(arch, name, extra, monkeypatch):
    """``wide`` at head_dim 256 (K smoothed, Q with the LSE shift: the default recipe's passes there, ``V3_WIDE`` on
    since session 12) against the narrow pass: half the threads (256), one CTA per SM asked of ptxas (<= 255
    registers), no spill (the narrow Q: 8 bytes); per thread twice the values:
    the FWHT's shuffles stay 128 (one stage of 128 values instead of two of 64: per block 1024 warp shuffles instead
    of 2048), the block max's 5 and the shift's 1 + 1 (two accumulators); 2x the cp.async, 16-byte reads, STG.128 and
    F2FP; the same barriers. Refused at head_dim 64, for V, with the staged store at 256, without the coalesced stage
    (head_dim 128: ``test_compiles_wide128``)."""
    # PDL as the default plans it (only up to head_dim 64 since session 43: quant_host.V2_PDL_MAX_HEAD_DIM)
    cfg = qk.PassConfig(rows=128, stages=3, coalesced=True, head_major=True, staged_mean=True, wide=True,
                        pdl=qh.V2_PDL and 256 <= qh.V2_PDL_MAX_HEAD_DIM, **extra)
    monkeypatch.setattr(qh, "V3_WIDE", True)  # (the default, whatever this process's environment says)
    monkeypatch.setattr(qh, "NONFINITE", False)  # the fast path's geometry (the slow path: test_fp8_quant_nonfinite)
    assert cfg in [key.config for key in qh.planned_passes(arch, torch.bfloat16, 256)]
    base = dataclasses.replace(cfg, wide=False)
    assert cfg.threads(256) == 256 and base.threads(256) == 512 and cfg.min_blocks(256) == cfg.ctas_per_sm(256) == 1
    c, c0 = (qk.VARIANT.compiled(qk.static_config(arch, torch.bfloat16, 256, x)) for x in (cfg, base))
    names = ("SHFL.BFLY", "STG.E.128", "LDGSTS", "BAR.SYNC", "F2FP", "LDL", "STL")
    ops, ops0 = (cubin.count_sass(cubin.sass_of(x.cubin), names) for x in (c, c0))
    assert ops["SHFL.BFLY"] == 128 + 5 + (2 if cfg.shift else 0), ops
    assert ops0["SHFL.BFLY"] == 128 + 5 + (2 if cfg.shift else 0), ops0
    assert ops["STG.E.128"] == 2 * ops0["STG.E.128"] == 8 and ops["F2FP"] == 2 * ops0["F2FP"] == 64, (ops, ops0)
    assert ops["LDGSTS"] - 1 == 2 * (ops0["LDGSTS"] - 1) == 48 and ops["BAR.SYNC"] == ops0["BAR.SYNC"], (ops, ops0)
    res = cubin.cubin_resources(c.cubin)
    assert res["registers"] <= 255 and res["spill_bytes"] == 0 and ops["LDL"] == ops["STL"] == 0, (res, ops)
    for bad, dim in ((dict(), 64), (dict(staged_store=True), 256), (dict(coalesced=False), 256),
                     (dict(coalesced=False), 128)):
        with pytest.raises(ValueError, match="wide"):
            dataclasses.replace(cfg, **bad).check(dim)
    with pytest.raises(ValueError, match="wide"):
        qk.PassConfig(role="v", rotate=False, stages=3, coalesced=True, wide=True).check(256)


@pytest.mark.parametrize("rows", [128, 256])
def test_wide128_staged_store_map(rows):
    """``V3_WIDE128``'s staged e4m3 store (head_dim 128, 8 slots: one lane per token, threads = rows) on the CPU: each
    thread's 8 units (its token's chunks 0..7) land at distinct units of the block (pitch 9: 1 unit of padding), the
    global stores (``store_map``, 8 per thread at token step rows / 8) read each (token, chunk) back once from where it
    was written, a warp's stores are 512 contiguous bytes, and every quarter warp's shared writes and reads hit 8
    distinct 16-byte bank groups (the default's pitch 10 would not: 2-way on the writes)."""
    D, slots, per = 128, 8, 8
    threads = rows * D // (16 * slots)
    assert qk.store_pitch(D, slots) == 9 and qk.store_pitch(D) == 10
    written = {}
    for j in range(slots):
        for t in range(threads):
            unit = qk.store_unit(D, t, j, slots)
            assert 0 <= unit < rows * qk.store_pitch(D, slots) and unit not in written.values()
            written[(qk.thread_token("qk", 1, 0, t, j), qk.thread_chunk("qk", 1, 0, t, j))] = unit
        for w in range(threads // 8):
            assert len({qk.store_unit(D, 8 * w + i, j, slots) % 8 for i in range(8)}) == 8, (w, j)
            assert len({(t * 10 + j) % 8 for t in range(8 * w, 8 * w + 8)}) == 4  # pitch 10: 2-way conflicts
    assert len(written) == rows * per
    seen = set()
    for r in range(slots):
        for t in range(threads):
            row, chunk, unit = qk.store_map(D, threads, t, r, slots)
            assert written[(row, chunk)] == unit and (row, chunk) not in seen
            seen.add((row, chunk))
        for w in range(threads // 8):
            assert len({qk.store_map(D, threads, 8 * w + i, r, slots)[2] % 8 for i in range(8)}) == 8, (w, r)
        for w in range(threads // 32):
            flat = [row * per + chunk for row, chunk, _ in (qk.store_map(D, threads, 32 * w + i, r, slots)
                                                            for i in range(32))]
            assert flat == list(range(flat[0], flat[0] + 32))
    assert len(seen) == rows * per
    assert rows * qk.store_pitch(D, slots) * 16 <= 2 * rows * D  # inside the block's 16-bit stage


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a"], indirect=True)
@pytest.mark.parametrize("name,rows,extra", [("k-smooth", 256, dict(smooth=True, reverse=True)),
                                             ("q-shift", 128, dict(shift=True))])
def test_compiles_wide128(arch, name, rows, extra, monkeypatch):
    """``V3_WIDE128``'s passes (the default recipe's K and Q at head_dim 128 with ``wide`` and ``staged_store``, what
    quantize plans with the switch on) against the default's: half the threads (K 256, Q 128: two CTAs per SM), <= 255
    registers, K without spill (Q: 40 bytes, 10 STL + 10 LDL per block); the Hadamard without cross-lane stage: 5
    SHFL.BFLY (the block max's) instead of 69 / 70; per thread 8 e4m3 units through the stage (STG.E.128 8, F2FP 64),
    one barrier more (the staged store's)."""
    cfg = qk.PassConfig(rows=rows, stages=3, coalesced=True, head_major=True, staged_mean=True, wide=True,
                        pdl=qh.V2_PDL and 128 <= qh.V2_PDL_MAX_HEAD_DIM, staged_store=True, **extra)
    monkeypatch.setattr(qh, "V3_WIDE128", True)
    monkeypatch.setattr(qh, "V3_STAGED_STORE", None)
    monkeypatch.setattr(qh, "NONFINITE", False)  # the fast path's geometry (the slow path: test_fp8_quant_nonfinite)
    assert cfg in [key.config for key in qh.planned_passes(arch, torch.bfloat16, 128)]
    monkeypatch.setattr(qh, "V3_WIDE128", False)
    base = dataclasses.replace(cfg, wide=False, staged_store=False)
    assert base in [key.config for key in qh.planned_passes(arch, torch.bfloat16, 128)]
    assert cfg.threads(128) == rows and base.threads(128) == 2 * rows
    assert cfg.ctas_per_sm(128) == base.ctas_per_sm(128) == 512 // (2 * rows)
    c, c0 = (qk.VARIANT.compiled(qk.static_config(arch, torch.bfloat16, 128, x)) for x in (cfg, base))
    names = ("SHFL.BFLY", "STG.E.128", "BAR.SYNC", "F2FP", "LDL", "STL")
    ops, ops0 = (cubin.count_sass(cubin.sass_of(x.cubin), names) for x in (c, c0))
    assert ops["SHFL.BFLY"] == 5 and ops0["SHFL.BFLY"] == 64 + 5 + (1 if cfg.shift else 0), (ops, ops0)
    assert ops["STG.E.128"] == 2 * ops0["STG.E.128"] == 8 and ops["F2FP"] == 2 * ops0["F2FP"] == 64, (ops, ops0)
    assert ops["BAR.SYNC"] == ops0["BAR.SYNC"] + 1, (ops, ops0)
    res = cubin.cubin_resources(c.cubin)
    assert res["registers"] <= 255 and res["spill_bytes"] <= (40 if cfg.shift else 0), res


def _record_passes(monkeypatch, entry) -> list:
    """quant_host.quantize_tensor replaced by a recorder (CPU only; an sm_90 device answered): each launch appends
    ``entry(x, role, kwargs)`` to the returned list and returns zero e4m3 and unit descales of the right shapes."""
    calls = []

    def recorder(x, *, role, block, **kw):
        calls.append(entry(x, role, kw))
        B, N, H, D = x.shape
        y = torch.zeros(B, N, H, D) if role == "qk" else torch.zeros(B, H, D, layout.padded_seqlen_k(N))
        return y.to(torch.float8_e4m3fn), torch.ones(B, H, -(-N // block))

    monkeypatch.setattr(qh, "quantize_tensor", recorder)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "device", lambda *a, **k: contextlib.nullcontext())
    return calls


def test_wide128_host_rule(monkeypatch):
    """quantize asks for ``wide`` and the staged store in Q's and K's passes at head_dim 128 only with ``V3_WIDE128`` on
    (pipeline v3; V never; 256 keeps ``V3_WIDE``'s rule, 64 the staged store alone), in K's pass alone with "k", and
    ``V3_STAGED_STORE``'s auto rule grows to 128 only for the passes it takes (the passes replaced by a recorder: CPU
    only; Q has 2 heads, K 1)."""
    calls = _record_passes(monkeypatch, lambda x, role, kw: (
        "v" if role == "v" else "q" if x.shape[2] == 2 else "k", x.shape[-1], kw.get("wide", False),
        kw.get("staged_store", False)))
    monkeypatch.setattr(qh, "V3_WIDE", True)
    monkeypatch.setattr(qh, "V3_STAGED_STORE", None)
    for on in (False, True, "k"):
        monkeypatch.setattr(qh, "V3_WIDE128", on)
        k_on, q_on = bool(on), on is True
        assert [qh.staged_store_for(d, "k") for d in qk.HEAD_DIMS] == [True, k_on, False]
        assert [qh.staged_store_for(d, "q") for d in qk.HEAD_DIMS] == [True, q_on, False]
        assert [qh.wide_for(d, "k") for d in qk.HEAD_DIMS] == [False, k_on, True]
        assert [qh.wide_for(d, "q") for d in qk.HEAD_DIMS] == [False, q_on, True]
        for d in qk.HEAD_DIMS:
            calls.clear()
            q, k = torch.randn(1, 40, 2, d).to(torch.bfloat16), torch.randn(1, 40, 1, d).to(torch.bfloat16)
            qh.quantize(q, k, k, config=FP8Config(smooth_k=False), pipeline="v3")
            want = [("v", d, False, False)]
            for name, this in (("k", k_on), ("q", q_on)):
                want.append((name, d, (this and d == 128) or d == 256, d == 64 or (this and d == 128)))
            assert sorted(calls) == sorted(want), (on, d, calls)


def test_wide_host_rule(monkeypatch):
    """quantize asks for ``wide`` in Q's and K's passes (never V's) only with ``V3_WIDE`` on, pipeline v3 and head_dim
    256, with ``V3_WIDE128`` off (its rule at 128: test_wide128_host_rule; the passes replaced by a recorder: CPU
    only)."""
    calls = _record_passes(monkeypatch, lambda x, role, kw: (role, x.shape[-1], kw.get("wide", False)))
    config = FP8Config(smooth_k=False)
    monkeypatch.setattr(qh, "V3_WIDE128", False)
    for on, pipeline in ((False, "v3"), (True, "v3"), (True, "v2")):
        monkeypatch.setattr(qh, "V3_WIDE", on)
        for d in qk.HEAD_DIMS:
            calls.clear()
            q, k = torch.randn(1, 40, 2, d).to(torch.bfloat16), torch.randn(1, 40, 1, d).to(torch.bfloat16)
            qh.quantize(q, k, k, config=config, pipeline=pipeline)
            want = on and pipeline == "v3" and d == 256
            assert sorted(calls) == sorted([("v", d, False), ("qk", d, want), ("qk", d, want)]), (on, d, calls)


def test_wide_and_plans_on_by_default():
    """Since session 12's H200 run (bench/NOTES.md, Session 12 outcomes) ``V3_WIDE`` and ``QUANT_PLANS`` are on by
    default; their variables (read at import) turn them off with 0 / off and keep every other value's check."""
    import os
    import subprocess
    import sys
    names = ("FA_VARIANTS_FP8_QUANT_WIDE", "FA_VARIANTS_FP8_QUANT_PLANS")
    if not any(os.environ.get(n, "").strip() for n in names):
        assert qh.V3_WIDE is True and qh.QUANT_PLANS is True
    code = "from fa_variants.fp8 import quant_host as q; print(q.V3_WIDE, q.QUANT_PLANS)"
    environ = subprocess_env(FA_VARIANTS_FP8_QUANT_WIDE="0", FA_VARIANTS_FP8_QUANT_PLANS="off")
    run = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.split() == ["False", "False"], run.stderr[-500:]


WIDE_CASES = [("default", None), ("default", 5), ("no-smooth", None), ("head-smooth", 7)]


@pytest.mark.gpu
@pytest.mark.parametrize("config,grid", WIDE_CASES, ids=[f"{c}-g{g}" for c, g in WIDE_CASES])
def test_v3_wide_bitwise(monkeypatch, config, grid):
    """v3 with 8 chunks of a token per thread at head_dim 256 (``V3_WIDE``) changes which thread holds which values,
    not one operation: every output (the LSE shift too) equals the default's bit for bit, and the torch recipe's given
    the pass's mean (``assert_switch_bitwise``: GQA, odd lengths, batch 3, a negative scale, the per-head baseline's
    "amax" and "given" launches, NaN-poisoned memory); grid 5 / 7 CTAs: each CTA walks many blocks through its
    stages."""
    monkeypatch.setattr(qh, "GRID_CAP", grid)
    assert_switch_bitwise(monkeypatch, "V3_WIDE", 256, config, 19)


WIDE128_CASES = [("default", None), ("default", 5), ("sampled8", 7), ("no-smooth", None), ("head-smooth", 3)]
WIDE128_MODES = {"both": True, "konly": "k"}  # V3_WIDE128's "on" values: Q's and K's passes, K's alone


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(WIDE128_MODES))
@pytest.mark.parametrize("config,grid", WIDE128_CASES, ids=[f"{c}-g{g}" for c, g in WIDE128_CASES])
def test_v3_wide128_bitwise(monkeypatch, config, grid, mode):
    """v3 with a token's 128 channels in one thread at head_dim 128 (``V3_WIDE128``: wide + the staged store; mode
    "both": Q's and K's passes, "konly": K's alone, ``V3_WIDE128 = "k"``) changes which thread holds and stores which
    values, not one operation: every output (the LSE shift too) equals the default's bit for bit, and the torch
    recipe's given the pass's mean (``assert_switch_bitwise``: GQA, odd lengths, batch 3, a negative scale, the
    per-head baseline's "amax" and "given" launches, NaN-poisoned memory); grid 3 / 5 / 7 CTAs: each CTA walks many
    blocks through its stages."""
    monkeypatch.setattr(qh, "GRID_CAP", grid)
    monkeypatch.setattr(qh, "V3_STAGED_STORE", None)  # the auto rule (128 with the switch on), whatever the environment
    assert_switch_bitwise(monkeypatch, "V3_WIDE128", 128, config, 23, WIDE128_MODES[mode])


def _recorded_launches(monkeypatch, calls, keys: list | None = None, raw: bool = False,
                       log: list | None = None) -> list:
    """quant_host with the device queries stubbed (an sm_90 device of 132 SMs) and every compiled pass replaced by a
    recorder of (PassConfig, its arguments: tensors as (shape, dtype, stride), the rest as they are): the launches
    ``calls()`` makes, on the CPU. keys: also gets each static config looked up (the disk cache's key). raw: the
    arguments as passed (the tensors themselves); log: the list to record into (read while ``calls`` runs)."""
    import contextlib
    import types

    log = [] if log is None else log

    class Recorder:
        def __init__(self, cfg):
            self.cfg = cfg.config
            if keys is not None:
                keys.append(cfg)

        def fn(self, *args):
            log.append((self.cfg, args if raw else tuple(
                (tuple(a.shape), a.dtype, a.stride()) if isinstance(a, torch.Tensor) else a for a in args)))

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a, **k: types.SimpleNamespace(
        multi_processor_count=132, shared_memory_per_multiprocessor=233472))
    monkeypatch.setattr(torch.cuda, "device", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(qh, "_PASSES", {})
    monkeypatch.setattr(qh, "_PLANS", {})
    monkeypatch.setattr(qh, "_CONSTANTS", {})
    object.__setattr__(qk.VARIANT, "compiled", Recorder)  # a frozen dataclass: its method shadowed, then restored
    try:
        calls()
    finally:
        object.__delattr__(qk.VARIANT, "compiled")
    return log


def test_default_recipe_launches_wide_where_the_defaults_say(monkeypatch):
    """With the module's defaults the default recipe's Q and K passes are wide at head_dim 256 (V3_WIDE, on since
    session 12) and K's alone at 128 (V3_WIDE128 = "k", since session 16), V's pass never and nothing at 64: what
    quant_precompile.py --set quantdef and the checks compile."""
    for d in qk.HEAD_DIMS:
        q, k = torch.zeros(2, 77, 4, d, dtype=torch.bfloat16), torch.zeros(2, 300, 2, d, dtype=torch.bfloat16)
        log = _recorded_launches(monkeypatch, lambda: qh.quantize(q, k, k.clone(), config=FP8Config()))
        want = [("v", False), ("qk", d in (128, 256)), ("qk", d == 256)]  # V, K, Q in launch order
        assert [(cfg.role, cfg.wide) for cfg, _ in log] == want, (d, log)


def test_warmup_compiles_the_passes_a_call_looks_up(monkeypatch):
    """``fa-variants warmup`` for fa3-fp8 on 16-bit inputs (``warmup.plan`` -> ``quant_host.planned_passes``, no GPU)
    plans exactly the static configs (disk-cache keys) that the default recipe's quantize call looks up, recorded with
    stubbed launches on an sm_90 device: head_dim 64 / 128 / 256 (wide at 256, K's at 128), bf16 / fp16, GQA 4 with odd lengths
    and a negative scale; a sampled K mean (both its launches); the module's switches left as they were."""
    from fa_variants.commands import warmup

    for dtype, d in (("bf16", 64), ("bf16", 128), ("bf16", 256), ("fp16", 128)):
        planned, _ = warmup.plan(["fa3-fp8"], "sm_90a", [dtype], [d], (False, True), (4,))
        planned = [c for c in planned if c.variant == "fp8-quant"]
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        looked_up = []
        for heads, seqlen_q, seqlen_k, scale in ((8, 77, 301, None), (2, 1, 1000, -0.5)):
            q = torch.randn(2, seqlen_q, heads, d).to(dt)
            k, v = torch.randn(2, seqlen_k, 2, d).to(dt), torch.randn(2, seqlen_k, 2, d).to(dt)
            _recorded_launches(monkeypatch, lambda: qh.quantize(q, k, v, softmax_scale=scale), looked_up)
        assert len(planned) == 3 and set(planned) == set(looked_up), (dtype, d, planned, looked_up)
        assert [c.config.wide for c in planned] == [False, d in (128, 256), d == 256]
    config = FP8Config(smooth_k_blocks=2)
    saved = (qh._pass, qh._capability, qh.QUANT_PLANS, qh._CONSTANTS)
    planned = qh.planned_passes("sm_90a", torch.bfloat16, 128, config)
    assert all(a is b for a, b in zip((qh._pass, qh._capability, qh.QUANT_PLANS, qh._CONSTANTS), saved))
    looked_up = []
    for seqlen_k in (100, 2000):  # one K tile (the sample covers it) and many
        k = torch.randn(1, seqlen_k, 1, 128).to(torch.bfloat16)
        _recorded_launches(monkeypatch, lambda: qh.quantize(k[:, :50], k, k, config=config), looked_up)
    assert len(set(planned)) == 4 and set(planned) == set(looked_up)
    assert warmup.plan(["fa3-fp8"], "sm_90a", ["e4m3"], [128], (False,))[0][-1].variant == "fa3-fp8"  # no quantising
    with pytest.raises(ValueError, match="sm_80"):
        qh.planned_passes("sm_80", torch.bfloat16, 128)


@pytest.mark.parametrize("on", [True, "k"], ids=["both", "konly"])
def test_wide128_warmup_and_call_plans(monkeypatch, on):
    """``V3_WIDE128`` on (both passes) or "k" (K's alone): ``fa-variants warmup`` for fa3-fp8 (``planned_passes``, no
    GPU) plans exactly the static configs the default recipe's quantize call looks up at head_dim 128 (stubbed launches
    on an sm_90 device: GQA 4 with odd lengths, a negative scale), with the whole-call plans off and on: V's pass
    narrow, K's wide with the staged store, Q's the same as K's with True and the default's with "k". The call plans'
    key holds the switch: the same geometry after a change of it (False -> on -> False) launches the passes of the
    new value, not a replayed plan."""
    from fa_variants.commands import warmup
    from fa_variants.fp8 import quant_call as qc

    monkeypatch.setattr(qh, "V3_STAGED_STORE", None)
    monkeypatch.setattr(qh, "V3_WIDE128", on)
    planned, _ = warmup.plan(["fa3-fp8"], "sm_90a", ["bf16"], [128], (False, True), (4,))
    planned = [c for c in planned if c.variant == "fp8-quant"]
    assert [(c.config.role, c.config.wide, c.config.staged_store) for c in planned] == [
        ("v", False, False), ("qk", True, True), ("qk", on is True, on is True)], planned
    monkeypatch.setattr(qc, "_CALLS", {})
    for plans in (False, True):
        monkeypatch.setattr(qc, "_device_ok", lambda q, config: plans)
        looked_up = []
        for heads, seqlen_q, seqlen_k, scale in ((8, 77, 301, None), (2, 1, 1000, -0.5)):
            q = torch.randn(2, seqlen_q, heads, 128).to(torch.bfloat16)
            k = torch.randn(2, seqlen_k, 2, 128).to(torch.bfloat16)
            v = torch.randn(2, seqlen_k, 2, 128).to(torch.bfloat16)
            for _ in range(2):
                _recorded_launches(monkeypatch, lambda: qh.quantize(q, k, v, softmax_scale=scale), looked_up)
        assert set(planned) == set(looked_up), (plans, planned, looked_up)
    assert len(qc._CALLS) == 2
    keys = set()
    for value in (False, True, "k"):
        monkeypatch.setattr(qh, "V3_WIDE128", value)
        keys.add(qc._switches())
    assert len(keys) == 3
    monkeypatch.setattr(qc, "_device_ok", lambda q, config: True)
    q, k = torch.zeros(1, 70, 4, 128, dtype=torch.bfloat16), torch.zeros(1, 300, 2, 128, dtype=torch.bfloat16)
    seen, log = [], []  # one log: a replayed plan's recorders write into the log of the call that built them
    for value in (False, on, False, on):
        monkeypatch.setattr(qh, "V3_WIDE128", value)
        start = len(log)
        _recorded_launches(monkeypatch, lambda: qh.quantize(q, k, k.clone()), log=log)
        seen.append([cfg.wide for cfg, _ in log[start:]])
    assert seen == [[False] * 3, [False, True, on is True]] * 2, seen


def test_prepared_passes_same_launches(monkeypatch):
    """quantize's v2 / v3 passes run ``prepared`` (q, k, v aligned once, one device context per call): the same
    compiled passes with the same arguments (shapes, dtypes, strides) as with every pass aligning its inputs itself,
    on unaligned inputs (a K / V slice of a wider buffer: strides not 16-byte multiples), GQA, odd lengths, a negative
    scale, at head_dim 64 / 128 / 256, v1 / v2 / v3 and the default / no-smooth / head-smooth recipes."""
    cases = [("v3", 64, FP8Config()), ("v3", 256, FP8Config()), ("v2", 128, FP8Config(smooth_k=False)),
             ("v3", 128, FP8Config(granularity="head")), ("v1", 128, FP8Config())]

    def run():
        for pipe, d, config in cases:
            q = torch.zeros(2, 77, 4, d, dtype=torch.bfloat16)
            kv = torch.zeros(2, 301, 2, 2 * d + 8, dtype=torch.bfloat16)
            k, v = kv[..., :d], kv[..., d + 8:]  # rows 2 d + 8 elements apart: not 16-byte aligned strides
            for scale in (None, -0.5):
                qh.quantize(q, k, v, config=config, softmax_scale=scale, pipeline=pipe)

    got = _recorded_launches(monkeypatch, run)
    plain = qh.quantize_tensor
    monkeypatch.setattr(qh, "quantize_tensor", lambda x, **kw: plain(x, **{**kw, "prepared": False}))
    want = _recorded_launches(monkeypatch, run)
    assert len(got) > 20 and got == want
    assert all(args[0][2][-1] == 1 and args[0][2][-2] % 8 == 0 for _, args in got)  # x aligned in every launch


@pytest.mark.parametrize("plans", [False, True])
def test_quant_plans_same_launches(monkeypatch, plans):
    """quant_host.QUANT_PLANS (cached launch plans): every launch of quantize (pipelines v1 / v3, the default,
    no-smooth, head-smooth and sampled recipes, head_dim 64 / 128 / 256, GQA with odd lengths, a negative scale, the
    wide and late-count switches, a grid cap) is the same compiled pass with the same arguments as with the plans off,
    on the first call and on the cached second (the plans key on everything a launch depends on)."""
    cases = [("v3", 64, "default", {}), ("v3", 128, "no-smooth", {}), ("v3", 256, "default", {"V3_WIDE": True}),
             ("v3", 128, "head-smooth", {}), ("v3", 64, "sampled", {"V3_FUSED_MEAN_LATE": True}),
             ("v1", 128, "default", {}), ("v3", 256, "default", {"GRID_CAP": 5})]
    recipes = {"default": FP8Config(), "no-smooth": FP8Config(smooth_k=False),
               "head-smooth": FP8Config(granularity="head"), "sampled": FP8Config(smooth_k_blocks=2)}

    def run():
        for pipe, d, recipe, knobs in cases:
            saved = {name: getattr(qh, name) for name in knobs}
            for name, value in knobs.items():
                setattr(qh, name, value)
            q = torch.zeros(2, 77, 4, d, dtype=torch.bfloat16)
            k = torch.zeros(2, 700, 2, d, dtype=torch.bfloat16)
            try:
                for scale in (None, -0.5):
                    qh.quantize(q, k, k.clone(), config=recipes[recipe], softmax_scale=scale, pipeline=pipe)
            finally:
                for name, value in saved.items():
                    setattr(qh, name, value)

    monkeypatch.setattr(qh, "QUANT_PLANS", False)
    reference = _recorded_launches(monkeypatch, run)
    monkeypatch.setattr(qh, "QUANT_PLANS", plans)
    got = _recorded_launches(monkeypatch, lambda: (run(), run()))
    assert len(reference) > 20 and got == reference + reference
    assert bool(qh._PLANS) == plans


def test_bandwidth_report_cell_on_the_cpu(monkeypatch, capsys):
    """scripts/fp8_quant_bandwidth.py's report_cell (one timed cell's row, printed) on the CPU with the launches
    recorded (outputs unwritten, so the comparison with the torch recipe is stubbed): the row carries the rounds'
    medians, the bytes and % of copy derived from them, and the printed line names the shape, pipeline and recipe."""
    import argparse
    import types

    from helpers import load_script

    bw = load_script("fp8_quant_bandwidth")
    monkeypatch.setattr(bw, "matches", lambda out, ref: "ok")
    monkeypatch.setattr(bw, "mean_ok", lambda *a: True)
    q = torch.randn(1, 300, 4, 128).to(torch.bfloat16)
    k, v = (torch.randn(1, 300, 2, 128).to(torch.bfloat16) for _ in range(2))
    timer = types.SimpleNamespace(eager_ms=lambda fn: 0.5)
    args = argparse.Namespace(breakdown=False, b2b=False, graph=True, host_profile=False)
    rows = []
    _recorded_launches(monkeypatch, lambda: rows.append(bw.report_cell(
        "D=128 GQA", q, k, v, "def", "default", [(0.2, True), (0.1, True), (0.3, False)], [0.05, 0.07],
        [(0.09, ""), (0.5, "capture failed")], timer, 2.0, args)))
    row = rows[0]
    assert row["gpu_ms"] == 0.2 and row["queued"] is False and row["host_ms"] == pytest.approx(0.06)
    assert row["graph_ms"] == 0.09 and row["graph_error"] == ""  # the failed capture left out
    assert row["dims"] == [1, 300, 300, 4, 2, 128] and row["of_copy"] == row["tb_s"] / 2.0
    assert row["tb_s"] == pytest.approx(row["bytes"] / 0.2 / 1e9) and row["extra_bytes_read"] == 2 * k.numel()
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("D=128 GQA   def  default    0.2000   0.5000") and "NO (host-bound)  ok" in line



def _named_launches(calls: list) -> list:
    """Per quantize call (``calls``: its inputs, its FP8Inputs and the raw launches it made): its launches with each
    tensor named by what it is in the call (q / k / v, an output field, else (shape, dtype, stride); the other
    arguments as they are), then the FP8Inputs' fields (tensors as shape, dtype, stride)."""
    fields = ("q", "k", "v_t", "q_descale", "k_descale", "v_descale", "k_mean", "lse_shift")
    per_call = []
    for (q, k, v), out, launches in calls:
        named = []
        per_call.append(named)
        names = {id(q): "q", id(k): "k", id(v): "v"}
        names.update({id(getattr(out, f)): f for f in fields if getattr(out, f) is not None})
        for cfg, args in launches:
            named.append((cfg, tuple(names.get(id(a), (tuple(a.shape), a.dtype, a.stride()))
                                     if isinstance(a, torch.Tensor) else a for a in args)))
        named.append(tuple((f, tuple(t.shape), t.dtype, t.stride()) if isinstance(t, torch.Tensor) else (f, t)
                           for f in fields + ("softmax_scale", "seqlen_k", "config", "block_m", "block_n")
                           for t in [getattr(out, f)]))
    return per_call


def test_call_plans_same_launches(monkeypatch):
    """quant_host.QUANT_CALL_PLANS (fp8.quant_call): every launch of quantize is the same compiled pass with the same
    arguments (q, k, v and the outputs in the same places, the rest equal by shape, dtype, stride or value) and the
    FP8Inputs alike, as with the plans off, on the first (planning) call and on the cached second, over head_dim
    64 / 128 / 256, the default / no-smooth / no-rotate recipes, GQA with odd lengths, a negative scale, the fused
    mean (per block and late), the wide pass off, the wide pass at 128 for K only (``V3_WIDE128 = "k"``); per-head
    scales and a sampled mean take the uncached path."""
    from fa_variants.fp8 import quant_call as qc

    monkeypatch.setattr(qc, "_device_ok", lambda q, config: True)
    monkeypatch.setattr(qc, "_CALLS", {})
    cases = [(64, "default", {}), (128, "no-smooth", {}), (256, "default", {}), (256, "no-rotate", {"V3_WIDE": False}),
             (128, "default", {"V3_FUSED_MEAN_LATE": True}), (64, "default", {"V3_FUSED_MEAN": True}),
             (128, "default", {"V3_WIDE128": "k"}), (128, "head-smooth", {}), (128, "sampled", {})]
    recipes = {"default": FP8Config(), "no-smooth": FP8Config(smooth_k=False), "no-rotate": FP8Config(rotate=False),
               "head-smooth": FP8Config(granularity="head"), "sampled": FP8Config(smooth_k_blocks=2)}
    defaults = {name: getattr(qh, name) for case in cases for name in case[2]}

    def run(calls: list, log: list, repeat: int) -> None:
        for d, recipe, knobs in cases:
            for name, value in knobs.items():
                setattr(qh, name, value)
            q = torch.zeros(2, 77, 4, d, dtype=torch.bfloat16)
            k = torch.zeros(2, 700, 2, d, dtype=torch.bfloat16)
            v = k.clone()
            try:
                for scale in (None, -0.5):
                    for _ in range(repeat):
                        start = len(log)
                        out = qh.quantize(q, k, v, config=recipes[recipe], softmax_scale=scale)
                        calls.append(((q, k, v), out, log[start:]))
            finally:
                for name in knobs:
                    setattr(qh, name, defaults[name])

    named = {}
    for plans in (False, True):
        monkeypatch.setattr(qh, "QUANT_CALL_PLANS", plans)
        calls, log = [], []
        _recorded_launches(monkeypatch, lambda: run(calls, log, 1 + plans), raw=True, log=log)
        named[plans] = _named_launches(calls)
    reference = named[False]
    assert len(reference) == 2 * len(cases) and sum(len(call) - 1 for call in reference) == 3 * 2 * len(cases) + 3 * 2
    assert named[True] == [call for call in reference for _ in range(2)]
    planned = [plan for plan in qc._CALLS.values() if plan is not None]
    assert len(planned) == 2 * (len(cases) - 2) and len(qc._CALLS) == 2 * len(cases)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
@pytest.mark.parametrize("late", [False, True], ids=["sum", "late"])
def test_call_plans_bitwise(rng_seed, monkeypatch, head_dim, late):
    """``QUANT_CALL_PLANS`` (fp8.quant_call) on, with torch's sum of K's partials (sum) or the fused mean counted late
    (late: ``V3_FUSED_MEAN_LATE``, no torch kernel between the passes): on fresh random inputs of one geometry (GQA, odd
    lengths, batch 3) for the planning call and then a cached call on new inputs, after NaN-poisoned memory, every
    output equals the uncached path's (same switches) bit for bit and the torch recipe's given the pass's K mean (e4m3
    bytes, descales, v_t); the mean within float32 summation's bound of float64; lse_shift within float32 rounding of
    torch's; a negative softmax_scale alike (its own plan). The default recipe only (the passes of
    quant_precompile.py --set quantbw2); the other recipes' launches: test_call_plans_same_launches."""
    from fa_variants.fp8 import quant_call

    monkeypatch.setattr(quant_call, "_CALLS", {})
    monkeypatch.setattr(qh, "V3_FUSED_MEAN_LATE", late)
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    config = FP8Config()
    for scale in (None, -0.6):
        for call in range(2):
            q = (torch.randn(3, 517, 8, head_dim, device="cuda", generator=g) * 2).to(torch.bfloat16)
            k = (torch.randn(3, 1001, 2, head_dim, device="cuda", generator=g) + 1.5 - call).to(torch.bfloat16)
            v = torch.randn(3, 1001, 2, head_dim, device="cuda", generator=g).to(torch.bfloat16)
            got = []
            for plans in (False, True):
                monkeypatch.setattr(qh, "QUANT_CALL_PLANS", plans)
                with nan_filled_allocations():  # outputs and scratch NaN-filled: an unwritten element fails
                    got.append(qh.quantize(q, k, v, config=config, softmax_scale=scale, pipeline="v3"))
            a, b = got
            for name in ("q", "k", "v_t"):
                x, y = getattr(a, name), getattr(b, name)
                assert x.shape == y.shape and torch.equal(x.view(torch.uint8), y.view(torch.uint8)), name
            for name in ("q_descale", "k_descale", "v_descale", "k_mean", "lse_shift"):
                x, y = getattr(a, name), getattr(b, name)
                assert (x is None and y is None) or torch.equal(x, y), name
            given = b.k_mean if scale is None else -b.k_mean  # the unnegated mean (negation is exact)
            assert_k_mean_close(given, k, block_n=b.block_n)
            ref = quantize_fp8_torch(q, k, v, config=config, softmax_scale=scale, k_mean=given)
            for name in ("q", "k", "v_t"):
                assert torch.equal(getattr(b, name).view(torch.uint8), getattr(ref, name).view(torch.uint8)), name
            for name in ("q_descale", "k_descale", "v_descale"):
                assert torch.equal(getattr(b, name), getattr(ref, name)), name
            assert torch.equal(b.k_mean, ref.k_mean)
            assert_shift_close(b.lse_shift, ref.lse_shift, q, ref.k_mean, ref.softmax_scale)
    assert sum(plan is not None for plan in quant_call._CALLS.values()) == 2  # one per softmax_scale, both planned


def test_call_plans_fall_back(monkeypatch):
    """fp8.quant_call.plan_for (CPU, the device check stubbed): a plan for plain aligned inputs, cached per geometry
    and scale; None (the uncached path) for a pointer that is not 16-byte aligned, a tensor subclass, a per-head recipe
    or a sampled mean, a bool scale; bad arguments raise what quantize raises (ValueError naming them); a change of
    the block heights (``layout.KERNEL_TILES``) is a new plan, not the old one replayed; the cache is emptied when it
    reaches MAX_PLANS."""
    from fa_variants.fp8 import quant_call as qc

    monkeypatch.setattr(qc, "_device_ok", lambda q, config: True)
    monkeypatch.setattr(qc, "_CALLS", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    object.__setattr__(qk.VARIANT, "compiled", lambda cfg: types.SimpleNamespace(fn=None))
    monkeypatch.setattr(qh, "_PASSES", {})
    monkeypatch.setattr(qh, "_PLANS", {})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a, **k: types.SimpleNamespace(
        multi_processor_count=132, shared_memory_per_multiprocessor=233472))
    try:
        q, k = torch.zeros(1, 70, 4, 128, dtype=torch.bfloat16), torch.zeros(1, 300, 2, 128, dtype=torch.bfloat16)
        plan = qc.plan_for(q, k, k.clone(), FP8Config(), None, None)
        assert isinstance(plan, qc.CallPlan) and qc.plan_for(q, k, k.clone(), FP8Config(), None, None) is plan
        assert qc.plan_for(q, k, k, FP8Config(), -0.5, None) not in (None, plan) and len(qc._CALLS) == 2
        shifted = torch.zeros(q.numel() + 1, dtype=torch.bfloat16)[1:].view(q.shape)  # 2 bytes off
        assert qc.plan_for(shifted, k, k, FP8Config(), None, None) is None
        assert qc.plan_for(torch.nn.Parameter(q, requires_grad=False), k, k, FP8Config(), None, None) is None
        assert qc.plan_for(q, k, k, FP8Config(granularity="head"), None, None) is None
        long_k = torch.zeros(1, 2600, 2, 128, dtype=torch.bfloat16)
        assert qc.plan_for(q, long_k, long_k, FP8Config(smooth_k_blocks=4), None, None) is None
        assert qc.plan_for(q, k, k, FP8Config(), True, None) is None
        with pytest.raises(ValueError, match="pipeline"):
            qc.plan_for(q, k, k, FP8Config(), None, "v9")
        with pytest.raises(ValueError, match="v has shape"):
            qc.plan_for(q, k, k[:, :7], FP8Config(), None, None)
        from fa_variants.fp8 import layout
        monkeypatch.setitem(layout.KERNEL_TILES, 128, (layout.KERNEL_TILES[128][0], 192))  # the block heights read
        other = qc.plan_for(q, k, k.clone(), FP8Config(), None, None)
        assert other is not plan and (plan.block_n, other.block_n) == (256, 192)
        monkeypatch.setattr(qc, "MAX_PLANS", len(qc._CALLS))
        qc.plan_for(q[:, :9], k, k, FP8Config(), None, None)
        assert len(qc._CALLS) == 1
    finally:
        object.__delattr__(qk.VARIANT, "compiled")
