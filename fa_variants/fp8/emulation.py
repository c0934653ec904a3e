"""The fa3-fp8 kernel's arithmetic in PyTorch, on quantised inputs: what "kernel vs emulation" compares against.

Source: Shah et al. 2024, "FlashAttention-3", sections 3.3 and 4.3; the fa3-fp8 kernel as built
(``fa_variants.hopper.fa3_fp8``, whose numerics this mirrors step by step). Vectorised over batch, heads and query rows; a Python loop over the
K/V tiles only, so the CPU study can run it.

Per query tile of tile_m rows (the kernel's CTA tile, ``layout.tile_m(head_dim)``) the kernel visits the K/V
tiles of ``FP8Inputs.block_n`` keys (its tile_n: the K/V scale blocks are its tiles) [0, n_blocks) it can see
(bottom-right causal tile skipping, ``kv_tile_end``), from the last to the first (``KV_ORDER``), and per tile n
(q_descale[m]: the descale of the row's Q block of ``block_m`` rows):

    S     = Q8 K8_n^T                        FP8 MMA, accumulator modelled below; -inf where the key is
                                             past seqlen_k or above the causal diagonal
    c_n   = max(float32(softmax_scale * log2 e) * q_descale[m] * k_descale[n], 2^-126)  (exact: powers of two)
    m'    = max(m, c_n rowmax S);  alpha = exp2(m - m')   (1 while the row has seen no key)
    P     = exp2(S c_n + (P_SHIFT - m'))     one FFMA; P in [0, 2^P_SHIFT] = [0, 256] (e4m3's max is 448)
    l     = alpha l + rowsum(P)              from the unrounded fp32 P
    P8    = e4m3(P)                          round to nearest even
    accumulation of P8 V8_n:
      two-level (config.two_level): acc = (alpha * v_descale[n_prev] / v_descale[n]) acc;  acc += P8 V8_n
          (FP8 MMA);  A = A alpha (A = 1 at the start);  every ``promote_every`` visited tiles and after the
          last: O = A O + v_descale[n] acc in fp32, A = 1, acc = 0 (the kernel multiplies O by the product of
          the interval's alphas once, at the promotion). promote_every = 1 is "a fresh accumulator per tile";
          the recipe's None is the kernel's default interval at the head_dim (``FP8Config.promote_interval``,
          ``layout.KERNEL_PROMOTE_EVERY``). fp32 roundings of the promotion: A O rounded, then
          + v_descale acc rounded (v_descale a power of two: the product exact). The kernel with
          ``skip_unit_rescale`` at promote_every 1 (its default at head_dim 128, 256) rounds the same way (FMUL,
          FFMA; A = 1 skips the FMUL, exactly); at promote_every > 1, or without the switch, ptxas fuses
          A O + (v_descale acc) into one FFMA: one fp32 rounding fewer, below anything the tests resolve. So does
          the kernel's ``fused_promote`` (O kept in units of v_descale: O' = fma(A v_descale[n_prev] / v_descale[n],
          O', acc), O = v_descale[0] O' at the end; with power-of-two descales the same single rounding).
      single accumulator (two_level False): the same with no promotion until the end, i.e. O lives in the
          FP8 MMA accumulator, in units of the current tile's v descale.
    end:  O = O / l (0 for l = 0);  LSE = (m + log2 l - P_SHIFT) ln 2 (-inf for l = 0), natural log, of the
          logits the kernel saw (smoothed K: the entry points add ``FP8Inputs.lse_shift``).

The FP8 MMA accumulator. The products of two e4m3 numbers are exact. Default ``accumulator="blockfp"``, the
H200's behaviour as measured (scripts/fp8_mma_probe.py, bench/NOTES.md FA3-FP8): each k = 32 chunk's products
and the incoming accumulator are aligned to the largest exponent among them and cut toward zero to
``BLOCKFP_FRAC_BITS`` = 13 fraction bits below it (a block-floating-point dot product), summed exactly, and the
sum is the new float32 accumulator. Kernel vs this emulation measured rel-L2 1.7e-3 to 2.8e-3 on the H200
(D 64/128/256, N 2048), against 4.2e-3 to 7.2e-3 for the older model, ``accumulator="truncate"``: each chunk
summed by a float32 matmul, added to the accumulator and the sum truncated toward zero to ``accumulator_bits``
mantissa bits (``ACCUMULATOR_BITS`` = 22, the figure reported for Hopper's FP8 tensor cores; None: a plain
fp32 accumulator). "truncate" is ~20x cheaper on a CPU, and its rel-L2 vs float64 matched the kernel's to
three digits in the same runs (5.2e-2 to 5.4e-2): accuracy studies against float64 may use it.
The rounding of the kernel's exp2 (MUFU.EX2) and of its row sums differ from torch's by a few ulp: kernel vs
emulation is a tolerance test, tight because every rounding point (Q, K, V, P to e4m3; the accumulator) is
in the same place.
"""
from __future__ import annotations

import math

import torch

from fa_variants.common import host_values
from fa_variants.common.checks import is_real, one_line
from fa_variants.common.scale import FFMA_LIMIT
from fa_variants.fp8 import layout
from fa_variants.fp8.contract import check_accumulator_bits, check_fp8_inputs, check_tile_m
from fa_variants.fp8.quantize import E4M3, FP8Config, FP8Inputs, block_rows, quantize_fp8_torch

__all__ = ["UNIT_SPAN", "bounded_unit", "P_SHIFT", "ACCUMULATOR", "ACCUMULATOR_BITS", "BLOCKFP_FRAC_BITS", "KV_ORDER", "MMA_K", "kv_tile_end", "emulate_fp8_attention",
           "fp8_attention_reference", "fp8_error_bound"]

P_SHIFT = 8
ACCUMULATOR = "blockfp"  # the default accumulator model (module docstring)
ACCUMULATOR_BITS = 22
KV_ORDER = "last_to_first"
MMA_K = 32  # k of one FP8 MMA instruction (PTX wgmma .e4m3: k = 32)
BLOCKFP_FRAC_BITS = 13  # the block-floating-point model's fraction bits below the chunk's largest exponent
C_MIN = 1.1754943508222875e-38  # the kernel floors c_n at the smallest normal float (softmax_scale = 0)
LOG2_E = math.log2(math.e)


#: "bounded" units: O' = O / u with u = max(v_descale, (largest v_descale visited) 2^-UNIT_SPAN) (``bounded_unit``)
UNIT_SPAN = 64


def bounded_unit(v_descale: torch.Tensor, visited_max: torch.Tensor) -> torch.Tensor:
    """The unit of the fused O after a tile of descale v_descale, visited_max the largest v_descale seen so far
    (both powers of two, float32): u = max(v_descale, visited_max 2^-UNIT_SPAN), a power of two.

    Proof that O' = O_unnorm / u stays finite, O_unnorm = sum over the visited keys j of P8_j V_j (dequantised):
    P8 <= 2^P_SHIFT = 256 and |V_j| <= 448 v_descale(j) <= 448 visited_max, so for Nk <= 2^31 keys
    |O'| <= 2^8 * 448 * 2^31 * visited_max / u <= 2^47.9 * 2^UNIT_SPAN = 2^111.9 < 2^128 (the promotion's
    intermediate alpha' O' is bounded the same way: alpha <= 1). With the kernel's unit u = v_descale (``"tile"``)
    the bound is 2^47.9 visited_max / v_descale: up to 2^47.9 * 2^236 for descales 2^126 .. 2^-110, i.e.
    overflow once |O_unnorm| >= 2^128 v_descale (2^18 for the floor 2^-110). The block's own P V (|acc| <=
    2^8 * 448 * tile_n) enters scaled by v_descale / u <= 1, exact unless the product falls below 2^-126: a
    nonzero acc >= 2^-18 (e4m3 products) times v_descale / u >= 2^-108 stays normal, so the tile's own P V is not
    flushed unless the row's V descales differ by more than 2^(UNIT_SPAN + 108) = 2^172 (and then only
    contributions below 2^-126 u, against an O' that may hold up to 2^111.9 u).

    Not covered: the unit change u_prev / u, a float32 scalar in alpha' = alpha u_prev / u, is subnormal where a
    tile's descale exceeds u_prev by more than 2^126 and 0 past 2^149 (u_prev >= M_prev 2^-UNIT_SPAN: a descale
    2^85 above every one visited before, behind a tile that lowered u to M_prev 2^-64): O' of the tiles visited
    before is then dropped. It shows only in rows whose P on that tile rounds to 0 in e4m3 (P < 2^-18 of the row
    max; otherwise that tile's own P V outweighs the lost part by ~2^19 or more); "tile" units drop it too (their
    ratio is never larger), "absolute" does not (tests/test_fp8_units.py::test_bounded_units_unit_rise_past_2_149)."""
    return torch.maximum(v_descale, visited_max * 2.0 ** -UNIT_SPAN)


def kv_tile_end(m_block: int, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """One past the last K/V tile query tile m_block sees (fa_variants.common.mask.kv_tile_end, in Python)."""
    n_end = -(-seqlen_k // tile_n)
    if causal:
        keys = min(m_block * tile_m + tile_m, seqlen_q) + seqlen_k - seqlen_q
        n_end = min(n_end, -(-max(keys, 0) // tile_n))
    return n_end


def _accumulate(acc: torch.Tensor, partial: torch.Tensor, bits: int | None) -> torch.Tensor:
    """acc + partial (float32, rounded to nearest), then truncated toward zero to ``bits`` mantissa bits."""
    total = acc + partial
    if bits is None or bits >= 23:
        return total
    return (total.view(torch.int32) & ~((1 << (23 - bits)) - 1)).view(torch.float32)


def _blockfp_chunk(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor, frac_bits: int) -> torch.Tensor:
    """acc + a @ b for one k chunk as a block-floating-point dot product (module docstring), float32 out.

    In float32, exactly: the products of e4m3 values are exact; with top = the largest magnitude among them and
    acc, and e = floor(log2 top), each term is cut toward zero to a multiple of 2^(e - frac_bits) by scaling
    with the power of two 2^(frac_bits - e) (exact), trunc, and summing the integers (|each| < 2^(frac_bits + 1),
    at most 33 of them: an exact float32 sum), times 2^(e - frac_bits). e is floored at -96 (a top below 2^-96
    keeps finer steps than the model; e4m3 products are >= 2^-18 or 0, so attention never gets there)."""
    out = torch.empty_like(acc)
    lead = max(1, a[..., :1, :1].numel())
    step = max(1, (1 << 23) // max(1, lead * b.shape[-1] * a.shape[-1]))
    bt = b.float().transpose(-1, -2).unsqueeze(-3)  # (..., 1, N, k)
    for r0 in range(0, a.shape[-2], step):  # rows in slices: the products tensor is (..., rows, N, k)
        terms = a[..., r0:r0 + step, :].float().unsqueeze(-2) * bt
        acc_r = acc[..., r0:r0 + step, :].float()
        top = torch.maximum(terms.abs().amax(dim=-1), acc_r.abs())
        e = (torch.frexp(top).exponent - 1).clamp(min=-96)  # floor(log2 top) (0 for top = 0: all terms 0)
        up = ((frac_bits - e + 127) << 23).view(torch.float32)  # 2^(frac_bits - e)
        down = ((e - frac_bits + 127) << 23).view(torch.float32)  # 2^(e - frac_bits)
        ints = torch.trunc(terms * up.unsqueeze(-1)).sum(dim=-1) + torch.trunc(acc_r * up)
        out[..., r0:r0 + step, :] = ints * down
    return out


def _mma(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor | None, bits: int | None,
         model: str = "truncate") -> torch.Tensor:
    """acc + a @ b over the last dim of a, one k = MMA_K chunk at a time through the accumulator model."""
    if model == "blockfp":
        acc = a.new_zeros(*a.shape[:-1], b.shape[-1]) if acc is None else acc
        for k0 in range(0, a.shape[-1], MMA_K):
            acc = _blockfp_chunk(a[..., k0:k0 + MMA_K], b[..., k0:k0 + MMA_K, :], acc, BLOCKFP_FRAC_BITS)
        return acc
    if bits is None:
        out = a @ b
        return out if acc is None else acc + out
    if acc is None:
        acc = a.new_zeros(*a.shape[:-1], b.shape[-1])
    for k0 in range(0, a.shape[-1], MMA_K):
        acc = _accumulate(acc, a[..., k0:k0 + MMA_K] @ b[..., k0:k0 + MMA_K, :], bits)
    return acc


def emulate_fp8_attention(inputs: FP8Inputs, *, causal: bool = False, accumulator_bits: int | None = ACCUMULATOR_BITS,
                          out_dtype: torch.dtype | None = None, accumulator: str = ACCUMULATOR,
                          tile_m: int | None = None,
                          units: str = "absolute") -> tuple[torch.Tensor, torch.Tensor]:
    """The fa3-fp8 kernel on already-quantised inputs, emulated (module docstring).

    Args:
        inputs: FP8Inputs (``quantize_fp8``); its config gives two_level and the promotion interval
            (``FP8Config.promote_interval(head_dim)``), its block_m / block_n
            the Q and K/V scale blocks (block_n is the kernel's tile_n: the K/V tiles walked here).
        causal: bottom-right causal mask (query i sees key j iff j <= i + seqlen_k - seqlen_q).
        accumulator: the FP8 MMA accumulator model: "blockfp" (default: block-floating-point chunks, the model
            the H200 agrees with best) or "truncate" (a float32 sum cut to ``accumulator_bits``; None = fp32).
        accumulator_bits: mantissa bits of the "truncate" model (unused by "blockfp").
        out_dtype: round O to this dtype at the end (the kernel's output dtype); None keeps float32.
        tile_m: query rows per CTA tile (which K/V tiles a query tile visits under causal masking; it matters
            for the promotion points of promote_every > 1 only); None: the kernel's, ``layout.tile_m(head_dim)``
            (128 for head dims the kernel does not serve).
        units: the units the two-level O is kept in between promotions, in float32 (the single accumulator,
            two_level False, always keeps the current tile's v_descale units, as the kernel does): "absolute"
            (default; O = A O + v_descale acc), "tile" (``fused_promote``: O / v_descale of the last visited tile,
            which overflows where a tiny-descale block follows large unnormalised O; ``UNIT_SPAN``) or "bounded"
            (``bounded_unit``: the fix, overflow-free; the kernel's head_dim 256 default, fused_promote with
            bounded_units since session 11). Equal to each other (power-of-two scalings) wherever "tile" stays
            finite and normal, so the GPU tests compare every default with "absolute" (tests/test_fp8_units.py
            checks "bounded" against it). Needs promote_every 1 for "tile" / "bounded".

    Returns:
        (out (batch, seqlen_q, num_heads, head_dim) out_dtype or float32, lse float32 (batch, num_heads,
        seqlen_q)), lse of the logits the kernel saw (without ``inputs.lse_shift``). Rows that see no key
        give 0 and -inf.

    Raises:
        TypeError: inputs not FP8Inputs, causal not a bool, out_dtype not a floating-point torch.dtype of 16 bits
            or more, accumulator_bits / tile_m not ints (or None); a field of inputs of the wrong type or dtype.
        ValueError: an unknown accumulator model or units, or units other than "absolute" with promote_every > 1;
            accumulator_bits < 0, tile_m < 1 or > 2^63 - 1; inputs that break FP8Inputs' contract (shapes, seqlen_k,
            v_t's padding, devices, a softmax_scale < 0 or not finite, k_mean / lse_shift not matching
            config.smooth_k: ``contract.check_fp8_inputs``).
    """
    _check_arguments(inputs, causal, accumulator_bits, tile_m, out_dtype, accumulator, units)
    cfg: FP8Config = inputs.config
    B, Nq, H, D = inputs.q.shape
    Nk, tile_n = inputs.seqlen_k, inputs.block_n
    if tile_m is None:
        tile_m = layout.KERNEL_TILES.get(D, (layout.TILE_M, None))[0]
    every = cfg.promote_interval(D)  # None in the recipe: the kernel's default interval at this head_dim
    if units != "absolute" and cfg.two_level and every != 1:
        raise ValueError(f"units={one_line(units)} needs promote_every 1 (the fused promotion), got {every}")
    q8, k8, v8, kd, vd, c_row = _operands(inputs)
    dev = q8.device

    rows = torch.arange(Nq, device=dev)
    n_blocks = block_rows(torch.tensor([kv_tile_end(i // tile_m, tile_m, tile_n, Nq, Nk, causal)
                                        for i in range(0, Nq, tile_m)], device=dev, dtype=torch.long), tile_m, Nq)
    m = torch.full((B, H, Nq), -math.inf, device=dev, dtype=torch.float32)
    l = torch.zeros(B, H, Nq, device=dev, dtype=torch.float32)
    o = _TwoLevelO((B, H, Nq, D), dev, cfg.two_level and every == 1, units if cfg.two_level else "absolute",
                   accumulator_bits, accumulator)
    n_tiles = -(-Nk // tile_n)
    order = range(n_tiles - 1, -1, -1) if KV_ORDER == "last_to_first" else range(n_tiles)
    for n in order:
        active = (n < n_blocks).view(1, 1, Nq)  # the row's query tile visits this K/V tile
        if KV_ORDER == "last_to_first":
            visited, is_last = n_blocks - 1 - n, torch.full_like(active, n == 0)
        else:
            visited, is_last = torch.full_like(n_blocks, n), (n == n_blocks - 1).view(1, 1, Nq)
        c0, c1 = n * tile_n, min((n + 1) * tile_n, Nk)
        S = _mma(q8, k8[:, :, c0:c1].transpose(-1, -2), None, accumulator_bits, accumulator)
        c = (c_row * kd[:, :, n:n + 1]).clamp(min=C_MIN).unsqueeze(-1)  # (B, H, Nq, 1), > 0
        if causal:
            cols = torch.arange(c0, c1, device=dev)
            S = S.masked_fill(cols > rows.unsqueeze(1) + (Nk - Nq), -math.inf)
        m_new, alpha, P = _softmax_step(S, c, m)
        l = torch.where(active, alpha * l + P.sum(dim=-1), l)
        P8 = P.clamp(max=448.0).to(E4M3).float()
        promote = active & is_last  # the row's last tile, or (two-level) every `every` tiles it visits
        if cfg.two_level:
            promote = promote | (active & ((visited + 1) % every == 0).view(1, 1, Nq))
        o.add_tile(P8, v8[:, :, c0:c1], alpha, vd[:, :, n], active, promote)
        m = torch.where(active, m_new, m)
    O = o.result()
    empty = l == 0
    out = torch.where(empty.unsqueeze(-1), torch.zeros_like(O), O / torch.where(empty, 1.0, l).unsqueeze(-1))
    lse = torch.where(empty, -math.inf, (m + torch.log2(torch.where(empty, 1.0, l)) - P_SHIFT) * math.log(2.0))
    out = out.transpose(1, 2)
    return (out.to(out_dtype) if out_dtype is not None else out), lse


def _check_arguments(inputs, causal, accumulator_bits, tile_m, out_dtype, accumulator, units) -> None:
    """``emulate_fp8_attention``'s argument checks (its Raises), before any work."""
    check_fp8_inputs(inputs)  # a caller-built FP8Inputs in full (contract.py): shapes, dtypes, devices, scale, recipe
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {one_line(causal)}")
    check_accumulator_bits(accumulator_bits)
    check_tile_m(tile_m)
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"out_dtype must be a torch.dtype or None, got {one_line(out_dtype)}")
    if out_dtype is not None and (not out_dtype.is_floating_point or out_dtype.itemsize < 2):
        raise TypeError(f"out_dtype must be a floating-point torch.dtype of 16 bits or more, or None, got {out_dtype} "
                        "(an 8-bit O would saturate at its range: the kernel writes float16 / bfloat16)")
    if accumulator not in ("truncate", "blockfp"):
        raise ValueError(f"accumulator must be 'truncate' or 'blockfp', got {one_line(accumulator)}")
    if units not in ("absolute", "tile", "bounded"):
        raise ValueError(f"units must be 'absolute', 'tile' or 'bounded', got {one_line(units)}")


def _operands(inputs: FP8Inputs):
    """The kernel's operands as float32 (e4m3 values are exact in it), K / V / descales repeated over each GQA group:
    q8, k8, v8 (B, H, N, D), V back in token order from ``v_t``; k_descale, v_descale (B, H, K/V tiles); and c_row (B,
    H, Nq), q_descale x softmax_scale x log2(e) per query row (the scale's product with log2(e) rounded once)."""
    B, Nq, H, D = inputs.q.shape
    Nk, Hkv = inputs.seqlen_k, inputs.k.shape[2]
    dev, group = inputs.q.device, H // Hkv
    q8 = inputs.q.float().transpose(1, 2)
    k8 = inputs.k.float().transpose(1, 2).repeat_interleave(group, dim=1)
    v_nat = torch.empty(B, Hkv, D, inputs.v_t.shape[-1], device=dev, dtype=torch.float32)
    v_nat[..., layout.v_token_order(inputs.v_t.shape[-1]).to(dev)] = inputs.v_t.float()
    v8 = v_nat[..., :Nk].transpose(2, 3).repeat_interleave(group, dim=1)
    kd = inputs.k_descale.repeat_interleave(group, dim=1)
    vd = inputs.v_descale.repeat_interleave(group, dim=1)
    scale_log2 = torch.tensor(inputs.softmax_scale * LOG2_E, dtype=torch.float32, device=dev)  # one rounding
    return q8, k8, v8, kd, vd, block_rows(inputs.q_descale * scale_log2, inputs.block_m, Nq)


def _softmax_step(S: torch.Tensor, c: torch.Tensor, m: torch.Tensor):
    """One K/V tile's online softmax (FA3 Algorithm 1, lines 8-10) on the raw FP8 scores S (B, H, Nq, tile_n) at
    scale c (B, H, Nq, 1) in log2 units, row max m (B, H, Nq) so far: (m_new, alpha = exp2(m - m_new), P) with P =
    exp2(S c + P_SHIFT - m_new) by one FFMA (one rounding), or the exact form for rows whose |m_new| >= FFMA_LIMIT."""
    raw = S.amax(dim=-1)
    m_new = torch.maximum(m, raw * c.squeeze(-1))
    m_safe = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
    # one FFMA, S * c + (P_SHIFT - m), rounded once (float64 holds the fp32 product exactly)
    x = (S.double() * c.double() + (P_SHIFT - m_safe).unsqueeze(-1).double()).float()
    huge = ~(m_safe.abs() < FFMA_LIMIT)  # |m| >= 2^11 or NaN: the exact form
    if host_values.unreadable(huge) is not None or huge.any():  # no values to test (meta, fake): the torch.where
        x = torch.where(huge.unsqueeze(-1), _huge_rows(S, raw, c, m_safe), x)
    alpha = torch.where(m_new == -math.inf, torch.ones_like(m), torch.exp2(m - m_safe))
    return m_new, alpha, torch.exp2(x)


class _TwoLevelO:
    """O in float32 and the FP8 MMA's accumulator acc (FA3 section 3.3's two-level accumulation): each tile's P V
    goes into acc, in the FP8 MMA's own precision; at a promotion acc is added into O (alpha-rescaled, times the
    tile's v_descale) and starts again from 0. With ``zero_init`` (two-level, promote_every 1) acc is 0 before every
    tile, as the kernel zero-initialises it; otherwise acc carries across tiles, rescaled by alpha and the ratio of
    v_descales (the single accumulator's units: the current tile's v_descale). ``units``: how O is kept between
    promotions ("absolute", "tile" or "bounded": ``emulate_fp8_attention``'s argument; "absolute" for the single
    accumulator); bits, model: the FP8 MMA's accumulator model (``_mma``)."""

    def __init__(self, shape, dev, zero_init: bool, units: str, bits: int | None, model: str):
        B, H, Nq, D = shape
        self.zero_init, self.units, self.bits, self.model = zero_init, units, bits, model
        self.O = torch.zeros(B, H, Nq, D, device=dev, dtype=torch.float32)
        self.acc = torch.zeros(B, H, Nq, D, device=dev, dtype=torch.float32)
        self.o_alpha = torch.ones(B, H, Nq, device=dev, dtype=torch.float32)  # alphas O has not been multiplied by yet
        # units != "absolute": O's unit per row (its tile order)
        self.unit = torch.ones(B, H, Nq, 1, device=dev, dtype=torch.float32)
        # "bounded": the largest v_descale the row has visited
        self.vmax = torch.zeros(B, H, Nq, 1, device=dev, dtype=torch.float32)
        self.prev_vd = None

    def add_tile(self, p8, v8, alpha, vd, active, promote) -> None:
        """acc (+)= P V for the rows ``active`` (1, 1, Nq), P = p8 (B, H, Nq, n) e4m3 values, V = v8 (B, H, n, D)
        this tile's; then O (+)= the promoted rows' acc. alpha (B, H, Nq), vd (B, H) this tile's v_descale,
        promote (B | 1, H | 1, Nq) Boolean."""
        B, H, Nq = alpha.shape
        factor = alpha if self.prev_vd is None else alpha * (self.prev_vd / vd).unsqueeze(-1)  # exact ratio
        # (promote_every 1: acc is 0 here and the kernel zero-initialises it; 0 * an overflowed ratio would be NaN)
        acc_in = self.acc if self.zero_init else self.acc * factor.unsqueeze(-1)
        new_acc = _mma(p8, v8, acc_in, self.bits, self.model)
        self.o_alpha = torch.where(active, self.o_alpha * alpha, self.o_alpha)
        self.acc = torch.where(active.unsqueeze(-1), new_acc, self.acc)
        promote = promote.unsqueeze(-1)
        vd_n = vd.view(B, H, 1, 1).expand(B, H, Nq, 1)
        if self.units == "absolute":
            self.O = torch.where(promote, self.O * self.o_alpha.unsqueeze(-1) + vd_n * self.acc, self.O)
        else:  # O' = (A u_prev / u) O' + (v_descale / u) acc, power-of-two factors (exact while finite and normal)
            act = active.view(1, 1, Nq, 1)
            self.vmax = torch.where(act, torch.maximum(self.vmax, vd_n), self.vmax)
            u = vd_n if self.units == "tile" else bounded_unit(vd_n, self.vmax)
            promoted = self.O * (self.o_alpha.unsqueeze(-1) * (self.unit / u)) + (vd_n / u) * self.acc
            self.O = torch.where(promote, promoted, self.O)
            self.unit = torch.where(act, u, self.unit)
        self.o_alpha = torch.where(promote.squeeze(-1), torch.ones_like(self.o_alpha), self.o_alpha)
        self.acc = torch.where(promote, torch.zeros_like(self.acc), self.acc)
        self.prev_vd = vd

    def result(self) -> torch.Tensor:
        """O after the last promotion, in absolute units (the kernel's O *= unit at the end, ``finalize``)."""
        return self.O if self.units == "absolute" else self.O * self.unit


def _huge_rows(S, raw, c, m_safe):
    """The kernel's exact form for rows with |m| >= FFMA_LIMIT (``common.softmax.OnlineSoftmax._huge_tile_row``): x =
    (S - raw) c + d with d = P_SHIFT in the tile that sets m and min(raw c - m + P_SHIFT, P_SHIFT) in the others, at
    the kernel's float32 rounding points. Returns x for every row (the caller keeps it for the huge rows only)."""
    c1 = c.squeeze(-1)
    raw_safe = torch.where(raw == -math.inf, torch.zeros_like(raw), raw)
    below = (raw_safe.double() * c1.double() - m_safe.double()).float() + P_SHIFT  # fma(raw, c, -m), + P_SHIFT
    d = torch.where(raw * c1 == m_safe, torch.full_like(below, P_SHIFT), below.clamp(max=P_SHIFT))
    return ((S - raw_safe.unsqueeze(-1)).double() * c.double() + d.unsqueeze(-1).double()).float()


def fp8_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                            softmax_scale: float | None = None, config: FP8Config = FP8Config(),
                            accumulator_bits: int | None = ACCUMULATOR_BITS,
                            out_dtype: torch.dtype | None = None,
                            accumulator: str = ACCUMULATOR) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 attention emulated end to end: ``quantize_fp8_torch`` then :func:`emulate_fp8_attention`, and the
    LSE shifted back to the unsmoothed logits (as ``fa_variants.fp8.attention_fp8`` returns it).
    accumulator / accumulator_bits: the accumulator model, as :func:`emulate_fp8_attention` ("truncate" is
    ~20x cheaper on a CPU; for accuracy studies against float64, module docstring).

    q (B, Nq, H, D), k, v (B, Nk, Hkv, D), any float dtype and device. Returns (out float32 or out_dtype
    (B, Nq, H, D), lse float32 (B, H, Nq)); rows that see no key give 0 and -inf. Raises as quantize_fp8.
    """
    inputs = quantize_fp8_torch(q, k, v, config=config, softmax_scale=softmax_scale)
    out, lse = emulate_fp8_attention(inputs, causal=causal, accumulator_bits=accumulator_bits, out_dtype=out_dtype,
                                     accumulator=accumulator)
    return out, inputs.unsmoothed_lse(lse)


def fp8_error_bound(out_emulated: torch.Tensor, out_exact: torch.Tensor, atol: float = 1e-4) -> float:
    """The largest max|O_kernel - O_exact| an FP8 kernel may show: 2 * max|O_emulated - O_exact| + atol.

    The project's testing rule with this emulation (run with the kernel's own recipe) in the place of "torch
    in the same dtype"; out_exact is float64 attention on the high-precision inputs. NaN in either gives NaN.
    Raises TypeError (not tensors; atol not a real number) or ValueError (shapes differ: no broadcasting;
    atol negative or not finite).
    """
    for name, t in (("out_emulated", out_emulated), ("out_exact", out_exact)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if out_emulated.shape != out_exact.shape:
        raise ValueError(f"out_emulated has shape {tuple(out_emulated.shape)} but out_exact has "
                         f"{tuple(out_exact.shape)}; they must match (no broadcasting)")
    if not is_real(atol):
        raise TypeError(f"atol must be a real number, got {one_line(atol)}")
    if not 0 <= atol < math.inf:
        raise ValueError(f"atol must be finite and >= 0, got {atol}")
    diff = (out_emulated.double() - out_exact.double()).abs()
    return 2.0 * (diff.max().item() if diff.numel() else 0.0) + atol
