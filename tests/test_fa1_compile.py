"""FA1 (fa_variants/ampere/fa1.py) without a GPU.

* compile-only (marked `compile`): the kernel builds for sm80 with fake tensors, uses the tensor cores
  (HMMA), cp.async and ldmatrix, and does not spill (LDL = STL = 0, no stack frame) at head_dim 64 and
  128, causal or not; 96 and 256 build too (256 spilling at most 40 bytes a thread); `fa-variants compile --variant fa1` prints that report.
* the tile-range arithmetic (which (i, j) pairs run, which need the causal mask, which is a Q tile's
  last) against a brute-force enumeration of visible (query, key) pairs;
* the kernel's schedule and per-step algebra, replayed in float64 torch on the CPU (the same loops,
  flags and formulas, lines 2-13 of Algorithm 1), against the float64 reference: a wrong range, flag
  or rescale factor shows up here before any GPU run;
* tile selection and the argument checks of `run` (meta tensors: nothing is launched).
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

pytest.importorskip("cutlass")

from fa_variants.ampere import fa1  # noqa: E402
from fa_variants import registry  # noqa: E402
from fa_variants.commands.compile import compile_only  # noqa: E402
from fa_variants.common.config import Sm80Config, smem_capacity  # noqa: E402
from fa_variants.common.mask import BlockInfo  # noqa: E402
from fa_variants.reference import attention_reference  # noqa: E402


# ----------------------------------------------------------------------------------------------
# compile-only
# ----------------------------------------------------------------------------------------------
@pytest.mark.compile
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_compiles_without_spills(head_dim, causal):
    r = compile_only("fa1", "sm_80", head_dim, "bf16", causal, sass=True)
    assert r["tiles"] == dataclasses.asdict(fa1.default_config("sm_80", head_dim))
    assert r["HMMA"] > 0 and r["LDGSTS"] > 0 and r["LDSM"] > 0, r
    assert r["LDL"] == 0 and r["STL"] == 0 and r["spill_bytes"] == 0, r
    assert 0 < r["registers"] <= 255
    assert r["smem_dynamic_bytes"] >= fa1.default_config("sm_80", head_dim).smem_bytes(head_dim)
    assert r["smem_bytes"] <= 163 * 1024


@pytest.mark.compile
def test_cli_reports_fa1(compile_cli):
    """The issue's command: fa-variants compile --arch sm_80 --variant fa1 --head-dim 128 --dtype bf16 --sass."""
    r = compile_cli("--arch", "sm_80", "--variant", "fa1", "--head-dim", "128", "--dtype", "bf16", "--sass")
    assert r["variant"] == "fa1" and r["head_dim"] == 128
    assert r["HMMA"] > 0 and r["LDL"] == 0 and r["STL"] == 0 and r["spill_bytes"] == 0


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [96, 256])
def test_other_head_dims_compile(head_dim):
    """96 and 256 build and use the tensor cores; at 256 at most the 40 bytes a thread 446f785 spilled (a few
    may spill: `step` writes l, m back before the P V product so that rowsum P is not kept live across it)."""
    r = compile_only("fa1", "sm_80", head_dim, "fp16", False, sass=True)
    assert r["HMMA"] > 0 and 0 < r["registers"] <= 255, r
    assert r["spill_bytes"] <= 40, r
    assert r["smem_bytes"] <= 163 * 1024


# ----------------------------------------------------------------------------------------------
# tile ranges
# ----------------------------------------------------------------------------------------------
SHAPES = [(1, 1), (3, 3), (64, 128), (113, 203), (127, 1023), (300, 128), (300, 40), (129, 1), (1, 4097),
          (64, 1000), (1000, 64), (256, 256), (255, 257)]


def _visible(nq, nk, causal):
    """(nq, nk) bool: query r sees key c (bottom-right causal)."""
    r = torch.arange(nq).unsqueeze(1)
    c = torch.arange(nk).unsqueeze(0)
    return (c <= r + nk - nq) if causal else torch.ones(nq, nk, dtype=torch.bool)


@pytest.mark.parametrize("tiles", [(64, 128), (128, 64), (64, 64)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("nq,nk", SHAPES)
def test_tile_ranges_match_brute_force(nq, nk, causal, tiles):
    Br, Bc = tiles
    vis = _visible(nq, nk, causal)
    Tr, Tc = -(-nq // Br), -(-nk // Bc)
    assert BlockInfo(Br, Bc, causal).kv_tile_end(Tr - 1, nq, nk) == Tc  # the outer loop's length, n_j
    for j in range(Tc):
        start = BlockInfo(Br, Bc, causal).q_tile_start(j, nq, nk)
        unmasked = BlockInfo(Br, Bc, causal).q_tile_unmasked_start(j, nq, nk)
        assert start <= unmasked <= Tr
        for i in range(Tr):
            block = vis[i * Br:(i + 1) * Br, j * Bc:(j + 1) * Bc]
            assert (i >= start) == bool(block.any()), (i, j)  # visited iff some pair is visible
            if i >= unmasked:  # runs without the causal mask: every (in-bounds) pair is visible
                assert bool(block.all()), (i, j)
            full = block.shape == (Br, Bc)
            if full and block.all():  # a full, fully visible block is never masked needlessly
                assert i >= unmasked, (i, j)
    for i in range(Tr):  # is_last: the last visited j of each Q tile
        n_i = BlockInfo(Br, Bc, causal).kv_tile_end(i, nq, nk)
        seen = [j for j in range(Tc) if i >= BlockInfo(Br, Bc, causal).q_tile_start(j, nq, nk)]
        assert seen == list(range(n_i))


# ----------------------------------------------------------------------------------------------
# the kernel's schedule and algebra, in float64 on the CPU
# ----------------------------------------------------------------------------------------------
def replay_fa1(q, k, v, causal, scale, Br, Bc):
    """One (batch, head) of FlashAttention1Sm80, step by step as the kernel runs it, in float64:
    q (Nq, D), k, v (Nk, D). Masks are applied only where the kernel's flags say so. Returns (out, lse)."""
    nq, nk, d = q.shape[0], k.shape[0], q.shape[1]
    Tr, Tc = -(-nq // Br), -(-nk // Bc)
    c = scale * math.log2(math.e)
    pad = lambda x, rows: torch.cat([x, x.new_zeros(rows - x.shape[0], d)])  # noqa: E731 (zero-fill)
    qp, kp, vp = pad(q, Tr * Br), pad(k, Tc * Bc), pad(v, Tc * Bc)
    O, l, m = (torch.full((Tr * Br, d), math.nan, dtype=q.dtype), torch.full((Tr * Br,), math.nan, dtype=q.dtype),
               torch.full((Tr * Br,), math.nan, dtype=q.dtype))  # the workspace, poisoned
    out, lse = torch.full((nq, d), math.nan, dtype=q.dtype), torch.full((nq,), math.nan, dtype=q.dtype)
    rows = lambda i: slice(i * Br, (i + 1) * Br)  # noqa: E731
    for i in range(Tr):  # line 2
        if BlockInfo(Br, Bc, causal).kv_tile_end(i, nq, nk) > 0:
            O[rows(i)], l[rows(i)], m[rows(i)] = 0.0, 0.0, -math.inf
        else:
            out[i * Br:min(nq, (i + 1) * Br)], lse[i * Br:min(nq, (i + 1) * Br)] = 0.0, -math.inf
    for j in range(BlockInfo(Br, Bc, causal).kv_tile_end(Tr - 1, nq, nk)):  # line 5
        for i in range(BlockInfo(Br, Bc, causal).q_tile_start(j, nq, nk), Tr):  # line 7
            s = qp[rows(i)] @ kp[j * Bc:(j + 1) * Bc].T  # line 9
            r = torch.arange(i * Br, (i + 1) * Br).unsqueeze(1)
            col = torch.arange(j * Bc, (j + 1) * Bc).unsqueeze(0)
            if j == Tc - 1:  # mask_seqlen
                s = s.masked_fill(col >= nk, -math.inf)
            if i < BlockInfo(Br, Bc, causal).q_tile_unmasked_start(j, nq, nk):  # mask_causal
                s = s.masked_fill(col > r + nk - nq, -math.inf)
            m_old, l_old = m[rows(i)], l[rows(i)]
            m_new = torch.maximum(m_old, s.amax(dim=1))  # lines 10-11 (common/softmax.py)
            m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
            p = torch.exp2((s - m_safe.unsqueeze(1)) * c)
            alpha = torch.exp2((m_old - m_safe) * c)
            l_new = alpha * l_old + p.sum(dim=1)
            inv = torch.where(l_new == 0, 0.0, 1.0 / l_new)
            o = O[rows(i)] * (l_old * alpha * inv).unsqueeze(1) + (p * inv.unsqueeze(1)) @ vp[j * Bc:(j + 1) * Bc]
            if j == BlockInfo(Br, Bc, causal).kv_tile_end(i, nq, nk) - 1:  # the last step of tile i
                n = min(nq, (i + 1) * Br) - i * Br
                out[i * Br:i * Br + n] = o[:n]
                lse[i * Br:i * Br + n] = torch.where(l_new == 0, -math.inf,
                                                     (m_new * c + torch.log2(l_new)) * math.log(2))[:n]
            else:  # lines 12-13
                O[rows(i)], l[rows(i)], m[rows(i)] = o, l_new, m_new
    return out, lse


@pytest.mark.parametrize("tiles", [(64, 128), (64, 64)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("nq,nk", SHAPES)
def test_replayed_schedule_matches_reference(rng_seed, nq, nk, causal, tiles):
    g = torch.Generator().manual_seed(rng_seed)
    d = 16
    q, k, v = (torch.randn(n, d, generator=g, dtype=torch.float64) for n in (nq, nk, nk))
    scale = 1 / math.sqrt(d)
    out, lse = replay_fa1(q, k, v, causal, scale, *tiles)
    ref_out, ref_lse = attention_reference(q[None, :, None], k[None, :, None], v[None, :, None],
                                           causal=causal, softmax_scale=scale)
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out, ref_out[0, :, 0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, ref_lse[0, 0], rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------------------
# tiles and run() argument checks
# ----------------------------------------------------------------------------------------------
def test_tiles_fit_every_arch():
    for arch in ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a"):
        for d in fa1.HEAD_DIMS:
            t = fa1.default_config(arch, d)
            assert t.smem_bytes(d) <= smem_capacity(arch) and t.q_stages == 2
            assert t.tile_n >= t.tile_m or d == 256  # FA1 takes Bc >= Br (Algorithm 1, line 1)
    with pytest.raises(ValueError, match="head_dim 80"):
        fa1.default_config("sm_80", 80)
    with pytest.raises(ValueError, match="shared memory"):
        fa1.VARIANT.config_for("sm_80", 128, False, Sm80Config(128, 256, 4, 2, 2))
    with pytest.raises(ValueError, match="multiple"):
        fa1.VARIANT.config_for("sm_80", 64, False, Sm80Config(48, 64, 4, 1, 2))
    with pytest.raises(ValueError, match="q_stages"):
        fa1.VARIANT.config_for("sm_80", 64, False, Sm80Config(64, 64, 4, 1, 1))


def test_config_override():
    config = Sm80Config(128, 64, 4, 1, 2)
    assert registry.static_config("fa1", "sm_80", "bf16", 128, False, config).config == config


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_run_rejects_what_it_cannot_serve():
    q = _meta(1, 8, 2, 80)
    with pytest.raises(ValueError, match="head_dim 80"):
        fa1.run(q, q, q, causal=False, softmax_scale=1.0)
    q = _meta(1, 8, 2, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        fa1.run(q, q, q, causal=False, softmax_scale=1.0)
    q = _meta(2**16, 8, 2**15, 64)
    with pytest.raises(ValueError, match="batch x num_heads"):
        fa1.run(q, q, q, causal=False, softmax_scale=1.0)
    q = _meta(1, 8, 2, 64)
    for bad in (math.inf, math.nan):
        with pytest.raises(ValueError, match="finite"):
            fa1.run(q, q, q, causal=False, softmax_scale=bad)


def test_run_empty_inputs_launch_nothing():
    q, k = torch.randn(2, 5, 4, 64).bfloat16(), torch.randn(2, 0, 2, 64).bfloat16()
    out, lse = fa1.run(q, k, k, causal=True, softmax_scale=0.125)  # CPU tensors: no launch
    assert out.shape == q.shape and not out.any() and lse.shape == (2, 4, 5) and (lse == -math.inf).all()


def test_registered_with_the_registry():
    v = registry.variant("fa1")
    assert v is fa1.VARIANT and v.head_dims == fa1.HEAD_DIMS and set(v.dtypes) == {torch.float16, torch.bfloat16}
    cfg = registry.static_config("fa1", "sm_80", "bf16", 128, True)
    assert cfg.config == fa1.default_config("sm_80", 128)
    with pytest.raises(registry.UnsupportedConfigError, match="head_dim 80"):
        registry.static_config("fa1", "sm_80", "bf16", 80, False)


def test_fake_args_are_dynamic():
    from cutlass.cute.typing import SymInt

    q, k, v, o, lse, o_acc, l, m, _scale, _stream = fa1.fake_args("bf16", 128)
    for t in (q, k, v, o, o_acc):
        assert all(isinstance(s, SymInt) for s in t.shape[:3]) and t.shape[3] == 128
    assert q.shape[0] is o_acc.shape[0] and q.shape[2] is o_acc.shape[1] and o_acc.shape[2] is l.shape[2]


# ----------------------------------------------------------------------------------------------
# scripts/fa1_vs_fa2_study.py: the ncu plumbing and the report, with a stand-in ncu (no GPU)
# ----------------------------------------------------------------------------------------------
def _study():
    from helpers import load_script

    return load_script("fa1_vs_fa2_study")


_FAKE_NCU = r'''#!/usr/bin/env python3
import sys
argv = sys.argv[1:]
log = argv[argv.index("--log-file") + 1]
assert argv[argv.index("--metrics") + 1] == "dram__bytes_read.sum,dram__bytes_write.sum"
assert "--csv" in argv and argv[argv.index("--clock-control") + 1] == "none"
cols = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
        "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
with open(log, "w") as f:
    f.write("==PROF== Connected to process 1\n" + ",".join(f'"{c}"' for c in cols) + "\n")
    for i, name in enumerate(["FlashAttention1Sm80", "FlashAttention1Sm80", "FlashAttention2Sm80",
                              "FlashAttention2Sm80"]):
        for metric, value in (("dram__bytes_read.sum", f"{(i + 1) * 1000:,}"), ("dram__bytes_write.sum", "500")):
            row = [str(i), "1", "python3", "h", f"kernel_x_{name}_y", "1", "7", "(128, 1, 1)", "(16, 16, 1)",
                   "0", "9.0", "Command line profiler metrics", metric, "byte", value]
            f.write(",".join(f'"{c}"' for c in row) + "\n")
'''


def test_study_reads_ncu_csv_beside_the_model(tmp_path):
    from fa_variants.emulate import hbm_bytes

    study = _study()
    ncu = tmp_path / "ncu"
    ncu.write_text(_FAKE_NCU, encoding="utf-8")
    ncu.chmod(0o755)
    args = study.parse_args(["--out", str(tmp_path), "--ncu", str(ncu), "--ncu-shapes", "128:1024", "64:2048"])
    timing = [dict(variant="fa1", causal=False, seqlen=1024, head_dim=128, ms=2.0)]
    dram = study.dram_study(args, "sm_90a", timing, tmp_path)
    assert dram["error"] is None and dram["returncode"] == 0, dram
    rows = dram["rows"]
    assert [(r["variant"], r["head_dim"], r["seqlen"]) for r in rows] == [
        ("fa1", 128, 1024), ("fa1", 64, 2048), ("fa2", 128, 1024), ("fa2", 64, 2048)]
    assert [r["dram_read"] for r in rows] == [1000, 2000, 3000, 4000] and all(r["kernel_matches"] for r in rows)
    t = fa1.default_config("sm_90a", 128)
    assert rows[0]["predicted_read"] == hbm_bytes("fa1", 16, 16, 1024, 1024, 128, t.tile_m, t.tile_n, 2, False,
                                                  o_bytes=4).read
    assert rows[0]["achieved_GBps"] == pytest.approx(1500 / 2e-3 / 1e9)
    md = study.markdown(dict(device="X", sms=1, tokens=16384, hidden=2048, command="c", elapsed_s=1.0),
                        [dict(timing[0], batch=16, heads=16, tflops=1.0, error=None, ctas=256)], dram)
    assert "| fa1 | 128 | 1024 | 16 | 16 | 64 x 128 |" in md and "FA2 / FA1" in md


def test_study_without_ncu(tmp_path):
    study = _study()
    args = study.parse_args(["--out", str(tmp_path), "--ncu", str(tmp_path / "no-such-ncu")])
    dram = study.dram_study(args, "sm_90a", [], tmp_path)
    assert dram["rows"] == [] and "not found" in dram["error"]
