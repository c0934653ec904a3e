#!/usr/bin/env python3
"""Where p_double_buffer goes wrong in causal calls (sm90 GPU): per Q tile (m_block) and 64-row warpgroup half, the
output elements left NaN (outputs are allocated NaN-filled, as tests/conftest.py's nan_allocations does), rows whose
LSE is NaN, and the largest |O - reference| over finite elements; for bf16 fa3 (head_dim 128, 128 x 128, the known
bug of issue 12 round 3: tests/test_fa3_gpu.py's expected failure) against float64 (fa3-fp8's p_double_buffer, probed
the same way in session 7, left NaN in both warpgroups from the second Q tile on and was removed; its overlap without
the second buffer stays here as a control against its emulation). Shapes (batch 1, 1 head): 1023 x 1023 (aligned
tiles, no masked loop step, Q tile 0 with one K/V tile) and 257 x 4224 (one masked loop step per Q tile). The
overlap without the second buffer (the same tiles) is printed beside as the control.

    python3 scripts/p2buf_probe.py            (a few seconds once the kernels are in the disk cache)
"""
from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fa_variants

SHAPES = [(1023, 1023), (257, 4224)]
TILE_M = 128


def _nan_empty():
    """torch.empty / empty_like returning NaN-filled floating tensors (restored by the returned function)."""
    saved = torch.empty, torch.empty_like

    def wrap(fn):
        def inner(*args, **kwargs):
            t = fn(*args, **kwargs)
            return t.fill_(math.nan) if t.is_floating_point() else t
        return inner
    torch.empty, torch.empty_like = wrap(saved[0]), wrap(saved[1])

    def restore():
        torch.empty, torch.empty_like = saved
    return restore


def report(name: str, out: torch.Tensor, lse: torch.Tensor, ref: torch.Tensor, nk: int) -> str:
    """One line per m_block with a problem (NaN, NaN LSE or max error > 0.05; with its K/V tile count, causal
    bottom-right, 128-key tiles), else one 'clean' line."""
    o = out[0, :, 0].float()  # (Nq, D)
    r = ref[0, :, 0].float()
    lines = []
    for m in range(-(-o.shape[0] // TILE_M)):
        rows = slice(m * TILE_M, min((m + 1) * TILE_M, o.shape[0]))
        blk, rb = o[rows], r[rows]
        nan_wg = [int(blk[h * 64:(h + 1) * 64].isnan().sum()) for h in (0, 1)]
        finite = ~blk.isnan()
        err = float((blk - rb).abs()[finite].max()) if finite.any() else math.nan
        lse_nan = int(lse[0, 0, rows].isnan().sum())
        if sum(nan_wg) or lse_nan or not err <= 0.05:
            n_kv = -(-min(nk, (m + 1) * TILE_M + nk - o.shape[0]) // TILE_M)
            lines.append(f"  {name} m_block {m} ({n_kv} K/V tiles): NaN O {nan_wg[0]} / {nan_wg[1]} (warpgroup 0 / 1), NaN LSE rows {lse_nan}, "
                         f"max |err| {err:.3g}")
    return "\n".join(lines) if lines else f"  {name}: clean (every m_block)"


def main() -> int:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("p2buf_probe: needs an sm90 GPU", file=sys.stderr)
        return 2
    from fa_variants import fp8
    from fa_variants.fp8.quantize import quantize_fp8_torch
    from fa_variants.hopper import fa3, fa3_fp8
    from fa_variants.reference import attention_reference

    D = 128
    bf16_base = dataclasses.replace(fa3.DEFAULT_CONFIGS[D], tile_n=128, intra_wg_overlap=True)
    fp8_base = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[D], tile_n=128, intra_wg_overlap=True, reduce_chains=4)
    g = torch.Generator(device="cuda").manual_seed(0)
    for nq, nk in SHAPES:
        q, k, v = (torch.randn(1, n, 1, D, device="cuda", generator=g).to(torch.bfloat16) for n in (nq, nk, nk))
        print(f"causal Nq {nq} Nk {nk}", flush=True)
        exact, _ = attention_reference(q, k, v, causal=True, dtype=torch.float64)
        inp = quantize_fp8_torch(q, k, v, config=fp8.FP8Config(), block_n=128)
        emu, _ = fp8.emulate_fp8_attention(inp, causal=True, tile_m=fp8_base.tile_m)
        for name, run, ref in [
                ("bf16 overlap", lambda: fa3.run(q, k, v, causal=True, softmax_scale=D ** -0.5, config=bf16_base), exact),
                ("bf16 p2buf", lambda: fa3.run(q, k, v, causal=True, softmax_scale=D ** -0.5,
                                               config=dataclasses.replace(bf16_base, p_double_buffer=True)), exact),
                ("fp8 overlap", lambda: fa3_fp8.run_fp8(inp, causal=True, config=fp8_base), emu)]:
            restore = _nan_empty()
            try:
                out, lse = run()
                torch.cuda.synchronize()
            except Exception as e:  # a config that fails to build or run is reported, not fatal
                print(f"  {name}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
                continue
            finally:
                restore()
            print(report(name, out, lse, ref, nk), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
