"""FP8 (e4m3) quantisation of Q, K, V for the fa3-fp8 kernel: the recipe, its torch implementation, and the API.

Source: Shah et al. 2024, "FlashAttention-3", section 3.3 (block quantisation, incoherent processing) and
Table 3; Zhang et al. 2024, "SageAttention", section 4.2 (smoothing K) and its V layout (tokens permuted so
that the converted P is the FP8 MMA's A operand without shuffles).

The recipe (``FP8Config``), in this order, per tensor:

1. K smoothing (``smooth_k``): K -= mean over tokens of K, per (batch, kv-head, channel), in float32. Every
   score of a query row moves by the same softmax_scale * q . mean, so O is unchanged and the LSE moves by
   that constant (``FP8Inputs.lse_shift``). It removes a channel bias of K that no rotation can.
   Softmax is invariant to subtracting any per-(batch, kv-head) vector, so the mean may be an estimate:
   ``smooth_k_blocks`` = m takes the mean over the tokens of m of K's scale blocks (block_n keys each),
   evenly spaced: tiles floor(j T / m), j = 0..m-1, of the T = cdiv(seqlen_k, block_n) tiles (all of them,
   i.e. the exact mean, when m >= T; ``k_sample_tiles``). O and the LSE stay exact either way; only the
   channel bias left in K (and so the e4m3 step) may differ slightly. Why: the exact mean must be known
   before any K block is quantised, so the GPU pass reads K twice; a sample costs m / T of one read.
2. Incoherent processing (``rotate``): Q and K times the same R = diag(s) H / sqrt(d), s seeded random signs,
   H a Hadamard matrix of order d applied by the fast Walsh-Hadamard transform: (Q R)(K R)^T = Q K^T, but an
   outlier channel is spread over every channel, so the block's largest magnitude (which sets the step)
   shrinks. Orders: a power of two (Sylvester); 96 = H12 (x) H8 with the Paley H12 (so every channel is
   mixed with every other); any other d (the emulation's extra head dims) block-diagonal over the powers of
   two of d's binary expansion. V is neither smoothed nor rotated.
3. Scales (``granularity``): one float32 descale per (batch, head, TILE_M rows of Q) and per (batch, kv-head,
   tile_n(d) rows of K and of V) ("block", the kernel's tiles, ``fa_variants.fp8.layout.KERNEL_TILES``: 192
   keys at head_dim 64, 128 at 96 and 256, 256 at 128; recorded as ``FP8Inputs.block_m`` / ``block_n``), or one per
   (batch, head) ("head", what FlashAttention-3's released code does) or per tensor ("tensor"); the last two
   are baselines and are stored expanded to the block shape, so the kernel has one path.
   A descale is the smallest power of two d with amax / d <= 448 (e4m3's largest finite value), and at least
   2^-110; an all-zero block (amax 0) gets descale 1 (``ZERO_BLOCK_DESCALE``). Powers of two because e4m3
   is a floating-point format (the relative rounding error of a value does not depend on the scale beyond
   < 1 bit of range at the bottom), and they make every scaling exact:
   x / d is exact, descale products in the kernel are exact, and the torch and GPU passes agree bit for bit.
   The floor 2^-110 is the fix for subnormal and tiny blocks (amax / 448 underflowed to 0 and gave NaN
   before): every descale is finite, normal and > 0; an fp32-subnormal value (and anything a Hadamard of
   such values produces) then maps below e4m3's smallest subnormal, so it quantises to 0 whether or not a
   GPU flushes subnormals. An all-zero block's e4m3 bytes are 0 whatever its descale; it gets 1 (session 9;
   it had the floor before) because the kernel's accumulator holds O / v_descale (one accumulator, or
   ``fused_promote``'s O in the current V block's units): 2^-110 made that overflow (inf / NaN) once the
   unnormalised O reached 2^18 (in the kernel's P units, P <= 2^8: |O| l >= 2^10), e.g. on zero padding. The
   limit now needs a nonzero block amax below 448 x 2^-110 (~3.5e-31) or a block 2^128 below the one before it, and
   holds only for the one accumulator (``two_level=False``), a promotion interval (``promote_every`` > 1: its
   temporary carries up to that many tiles in the current V block's units) and fused_promote with bounded_units=False:
   ``hopper.fa3_fp8.Fp8Config.bounded_units`` (session 10; with fused_promote in the head_dim 256 default since
   session 11) removes it (``emulation.bounded_unit``).
4. e4m3 with saturation (round to nearest even, clamped to +-448 like PTX ``cvt.rn.satfinite``).
5. V is stored transposed and padded for the kernel: ``v_t`` (batch, num_heads_kv, head_dim, seqlen_k_padded),
   tokens contiguous, padded with zeros to a multiple of ``layout.K_ALIGN_TOKENS``, tokens permuted inside
   each group of ``layout.V_TOKEN_GROUP`` by ``layout.v_token_order``.

A negative softmax_scale is folded into K (softmax(c Q K^T) = softmax(|c| Q (-K)^T); negation is exact), so
``FP8Inputs.softmax_scale`` is always >= 0.

Non-finite inputs (session 14). The torch quantiser (CPU, ``impl="torch"``, the emulation's front half) takes each
block's descale from its finite values and stores an inf or NaN as e4m3 NaN, so the rows that read one come out
non-finite and no other value changes: a NaN / inf in Q makes its row NaN (the rotation spreads it over that row
only); in V, the rows of the query tiles whose K/V tile holds it (the kernels' documented V behaviour, P = 0 times
NaN); in K with smoothing (the default), every row (K's mean over tokens is NaN), without smoothing the rows that
see it. Before, an inf / NaN set its block's descale (2^120 or more), which quantised the block's finite values
to 0 (a silently wrong O for up to block_m - 1 other query rows, or a block of keys), and an inf saturated to 448.
The GPU pass (``quant_kernel``) takes the amax with fmax, which skips a NaN, so a NaN fares as here; an inf sets
its block's max to inf, and with ``quant_host.NONFINITE`` (FA_VARIANTS_FP8_QUANT_NONFINITE; on since session 14)
that block takes the slow path ``quant_store.finite_block``: the infs become NaN and the max
is taken again over the finite values, as here (the same masking of the same float32 values: after the K mean, the
signs and the Hadamard; the LSE shift is not masked, here either), bit for bit the torch recipe given the pass's K
mean (tests/test_fp8_quant_nonfinite.py). With the switch at 0 an inf sets its block's descale there and
saturates to 448 (a finite wrong O).

Conventions: q (batch, seqlen_q, num_heads, head_dim), k, v (batch, seqlen_k, num_heads_kv, head_dim); GQA: query
head h reads kv-head h // (num_heads // num_heads_kv).
"""
from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass

import torch

from fa_variants.common import env as _env
from fa_variants.common import host_values
from fa_variants.common.checks import INT64_MAX, is_int, one_line
from fa_variants.common.scale import check_softmax_scale
from fa_variants.fp8 import layout

__all__ = [
    "E4M3",
    "E4M3_MAX",
    "MIN_DESCALE",
    "ZERO_BLOCK_DESCALE",
    "MAX_BLOCK_ROWS",
    "GRANULARITIES",
    "fwht",
    "paley_hadamard_12",
    "hadamard_blocks",
    "HadamardRotation",
    "descale_from_amax",
    "tiles_for",
    "FP8Config",
    "FP8Inputs",
    "quantize_fp8",
    "quantize_fp8_torch",
]

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448.0
#: the smallest descale (2^-110): see the module docstring, item 3
MIN_DESCALE_EXPONENT = -110
MIN_DESCALE = 2.0 ** MIN_DESCALE_EXPONENT
#: an all-zero block's descale (and inverse): 1, not the floor (see the module docstring, item 3)
ZERO_BLOCK_DESCALE = 1.0
#: the tallest block (FP8Inputs.block_m / block_n, quantize_fp8_torch's block_n, the emulation's tile_m): int64's
#: largest value, the most torch can index rows with (a taller one was an OverflowError from inside torch's arange)
MAX_BLOCK_ROWS = INT64_MAX
GRANULARITIES = ("block", "head", "tensor")
#: ``FP8Config.smooth_k_blocks``' default (read at import): None, K's mean over every token; an int m, over m
#: evenly spaced K tiles (``k_sample_tiles``: the GPU pass then reads K once). FA_VARIANTS_FP8_SMOOTH_K_BLOCKS=m
#: (0 or unset: None). On the emulation (scripts/quant6_accuracy.py, bench/NOTES.md session 7) m = 16 was within the
#: paired noise of the exact mean on every input kind, m = 4 / 8 over all inputs but +2-3% on RoPE-biased K; the flip
#: (NOTES' rule: 16, or 8) waits for the GPU pass's speed (scripts/fp8_quant_bandwidth.py --recipes sampled8)
DEFAULT_SMOOTH_K_BLOCKS: int | None = (_env.integer("FA_VARIANTS_FP8_SMOOTH_K_BLOCKS", "0", 0, "K tiles; 0: every "
                                                    "token") or None)


# ------------------------------------------------------------------------------------ Hadamard rotation


def fwht(x: torch.Tensor, normalise: bool = True) -> torch.Tensor:
    """Fast Walsh-Hadamard transform along the last dim: x @ H_n (/ sqrt(n) if normalise), n = x.shape[-1].

    n must be a power of two (ValueError otherwise). Butterflies in Sylvester order, stage h = 1, 2, 4, ...
    pairs (i, i + h) -> (a + b, a - b): the GPU pass does the same operations in the same order (the first
    stages inside a thread's registers, the later ones across lanes), so their float32 results agree bit
    for bit. The normalisation multiplies by float32(1 / sqrt(n)). Returns a new tensor of x's dtype.
    """
    n = x.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"fwht needs a power-of-two last dim, got {n}")
    lead = x.shape[:-1]
    h = 1
    while h < n:
        y = x.reshape(*lead, n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(*lead, n)
        h *= 2
    return x * _inv_sqrt(n, x) if normalise else x


def _inv_sqrt(n: int, like: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(n) rounded once to like's dtype (a 0-dim tensor, so the multiply happens in that dtype)."""
    return torch.tensor(1.0 / math.sqrt(n), dtype=like.dtype, device=like.device)


def paley_hadamard_12() -> torch.Tensor:
    """The Hadamard matrix of order 12 by Paley's first construction (q = 11), float32 entries +-1.

    Q[i, j] = chi(j - i) with chi the quadratic character mod 11 (chi(0) = 0); S = [[0, 1^T], [-1, Q]]
    (skew, S S^T = 11 I); H = I + S, so H H^T = 12 I. Paley, "On orthogonal matrices", J. Math. Phys. 12 (1933).
    """
    # never the default device (a model built under torch.device) nor the default dtype
    return torch.tensor(_PALEY_12, device="cpu", dtype=torch.float32)


def _paley_12_entries() -> list[list[int]]:
    """`paley_hadamard_12`'s entries as Python ints: no tensor, so neither an import nor a call inside the caller's
    FakeTensorMode or torch.export trace (whose tensors hold no values to read) can change them."""
    q = 11
    residues = {(i * i) % q for i in range(1, q)}
    chi = [0] + [1 if r in residues else -1 for r in range(1, q)]
    s = [[0] * 12 for _ in range(12)]
    for j in range(1, 12):
        s[0][j], s[j][0] = 1, -1
    for i in range(q):
        for j in range(q):
            s[1 + i][1 + j] = chi[(j - i) % q]
    return [[s[i][j] + (i == j) for j in range(12)] for i in range(12)]


_PALEY_12 = _paley_12_entries()


def hadamard_blocks(head_dim: int) -> tuple[int, ...]:
    """How ``HadamardRotation`` mixes the channels of head_dim: (head_dim,) for a power of two or 96 (one
    Hadamard of that order), else the powers of two of its binary expansion, largest first (80 -> (64, 16)),
    each a block of a block-diagonal rotation. Raises ValueError for head_dim < 1."""
    if head_dim < 1:
        raise ValueError(f"head_dim must be >= 1, got {head_dim}")
    if head_dim & (head_dim - 1) == 0 or head_dim == 96:
        return (head_dim,)
    return tuple(1 << b for b in reversed(range(head_dim.bit_length())) if head_dim >> b & 1)


class HadamardRotation:
    """R = diag(s) H / sqrt(d) of FA3 section 3.3 for one head_dim d (see the module docstring, item 2).

    ``rot(x)`` returns x @ R along the last dim, in float32 (float64 stays float64): x * s, then the
    unnormalised transform, then times float32(1 / sqrt(block)). s: +-1 from ``torch.Generator`` seeded
    with ``seed`` (the same on every device). For d = 96 the channel c = 8 a + b is element (a, b) of a
    12 x 8 matrix X and the transform is H12 X H8: FWHT over b, then over a the sum
    sum_j H12[a, j] Z[j, b] in the order j = 0..11 (the GPU pass adds in the same order).
    Apply the same rotation to Q and K (not V): (Q R)(K R)^T = Q K^T.
    """

    def __init__(self, head_dim: int, seed: int = 0) -> None:
        self.head_dim = head_dim
        self.blocks = hadamard_blocks(head_dim)
        g = torch.Generator().manual_seed(seed)
        self.signs = torch.randint(0, 2, (head_dim,), generator=g, device="cpu").float() * 2 - 1

    def __call__(self, x: torch.Tensor, signs: torch.Tensor | None = None) -> torch.Tensor:
        """x @ R; ``signs`` (optional) replaces s (the quantiser passes -s to fold a negative scale into K).

        The transform adds up to ``block`` values before its normalisation, so a float32 row whose finite max
        nears 2^128 / block could overflow there although x @ R (at most sqrt(block) max|x|) is finite: a row
        whose finite max reaches 2^126 / block is scaled by a power of two 2^-k first and its result by 2^k after
        (exact but for subnormal products; every other row, and every row of ordinary inputs, takes the plain
        transform; the GPU pass reproduces both)."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"last dim {x.shape[-1]} != head_dim {self.head_dim} of this rotation")
        if x.dtype not in (torch.float32, torch.float64):
            x = x.float()
        s = self.signs if signs is None else signs
        x = x * s.to(x.device, x.dtype)
        shift = self._overflow_shift(x)
        if shift is not None:
            return torch.ldexp(self._rotate(torch.ldexp(x, -shift)), shift)
        return self._rotate(x)

    def _overflow_shift(self, x: torch.Tensor) -> torch.Tensor | None:
        """Per row (last dim) the least k >= 0 with finite max |x| 2^-k x block < 2^126 (float32; float64 never
        overflows here), as a tensor broadcastable against x; None for float64, and on the CPU when no row needs
        one (on a GPU the shifts are applied as they are, k = 0 for ordinary rows: no sync)."""
        if x.dtype != torch.float32 or x.numel() == 0:
            return None
        block = max(self.blocks)  # 96: H12 x H8 adds 12 x 8 values
        amax = x.abs().nan_to_num(nan=0.0, posinf=0.0).amax(dim=-1, keepdim=True)
        if x.device.type == "cpu" and host_values.unreadable(x) is None \
                and not bool((amax >= 2.0 ** 126 / block).any()):
            return None  # (a free check on the CPU; on a GPU it would sync and break graph capture: k = 0, exact)
        exponent = torch.frexp(amax.double() * block)[1]  # amax * block < 2^exponent
        return (exponent - 126).clamp(min=0).to(torch.int32)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        if self.head_dim == 96:
            return _h12_h8(x)
        pieces, start = [], 0
        for b in self.blocks:
            pieces.append(fwht(x[..., start:start + b]))
            start += b
        return torch.cat(pieces, dim=-1)

    def matrix(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """R as a dense (head_dim, head_dim) matrix: rows of the identity, rotated."""
        return self(torch.eye(self.head_dim, dtype=dtype, device="cpu"))


def _h12_h8(x: torch.Tensor) -> torch.Tensor:
    """(..., 96) -> H12 X H8 / sqrt(96), X the (12, 8) view of the last dim (HadamardRotation's order)."""
    lead = x.shape[:-1]
    z = fwht(x.reshape(*lead, 12, 8), normalise=False)
    h12 = _PALEY_12
    rows = []
    for a in range(12):
        acc = z[..., 0, :] * h12[a][0]  # +-1: exact
        for j in range(1, 12):
            acc = acc + z[..., j, :] if h12[a][j] > 0 else acc - z[..., j, :]
        rows.append(acc)
    return torch.stack(rows, dim=-2).reshape(*lead, 96) * _inv_sqrt(96, x)


# ---------------------------------------------------------------------------------------------- scales


def descale_from_amax(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(descale, inverse) for float32 block maxima amax >= 0: the smallest power of two d >= 2^-110 with
    amax / d <= 448, and 1 / d (exact); amax 0 (an all-zero block; -0 too) gives d = 1, inverse 1. Computed
    on the float32 bits (exponent field E, mantissa M): d = 2^(E - 135) if M <= 0x600000 (amax <= 448 *
    2^(E-135)) else 2^(E - 134), clamped to [2^-110, 2^126], and the field 127 where the bits (sign dropped)
    are 0; the GPU pass uses the same integer arithmetic. Subnormal and tiny nonzero maxima (<= 448 x
    2^-110) give 2^-110; inf / NaN give a finite descale (their e4m3 values are undefined). Shapes as amax;
    float32."""
    bits = amax.float().contiguous().view(torch.int32)
    exp_field = (bits >> 23) & 0xFF
    field = exp_field - 8 + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    field = field.clamp(127 + MIN_DESCALE_EXPONENT, 253)
    field = torch.where((bits & 0x7FFFFFFF) == 0, 127, field)  # all zeros: descale 1 (ZERO_BLOCK_DESCALE)
    return (field << 23).view(torch.float32), ((254 - field) << 23).view(torch.float32)


def tiles_for(head_dim: int) -> tuple[int, int]:
    """(rows per Q scale block, rows per K/V scale block) = (layout.TILE_M, layout.tile_n(head_dim)): the
    block heights the quantisers use (the kernel's default tile_n, ``layout.KERNEL_TILES``); for a head_dim
    the kernel does not serve (the emulation's extras, e.g. 40 or 192) the tile_n of 128."""
    try:
        return layout.TILE_M, layout.tile_n(head_dim)
    except ValueError:
        return layout.TILE_M, 128


# ---------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class FP8Config:
    """The FP8 recipe (defaults: the shipped path, block + Hadamard + smoothed K + two-level accumulation).

    granularity: "block" | "head" | "tensor" (module docstring, item 3).
    rotate: random-sign Hadamard on Q and K (FA3 section 3.3). smooth_k: subtract K's mean over tokens.
    smooth_k_blocks: None: that mean over every token; an int m >= 1: over the tokens of m evenly spaced K
        scale blocks (module docstring, item 1; ``k_sample_tiles``): the same O and LSE, K read once by the GPU
        pass instead of twice. Default ``DEFAULT_SMOOTH_K_BLOCKS`` (None unless FA_VARIANTS_FP8_SMOOTH_K_BLOCKS).
    two_level: the kernel accumulates each K/V tile's P V in a fresh accumulator and adds it into the fp32 O
        every ``promote_every`` tiles (True), or keeps one running accumulator for O (False; the FP8 tensor
        core's accumulator keeps fewer mantissa bits than fp32, so O drifts with seqlen_k; it holds O / v_descale,
        which overflows behind a V block of tiny descale: module docstring, item 3).
    promote_every: tiles per promotion (>= 1; used only with two_level), or None (default): the fa3-fp8 kernel's
        default interval at the inputs' head_dim (``layout.KERNEL_PROMOTE_EVERY``), resolved by
        ``promote_interval``; the kernel and the emulation both follow it.
    seed: of the rotation's random signs (0 <= seed < 2^63).
    Raises ValueError / TypeError naming the field for a bad value.
    """

    granularity: str = "block"
    rotate: bool = True
    smooth_k: bool = True
    two_level: bool = True
    promote_every: int | None = None
    seed: int = 0
    smooth_k_blocks: int | None = DEFAULT_SMOOTH_K_BLOCKS

    def __post_init__(self) -> None:
        if not isinstance(self.granularity, str) or self.granularity not in GRANULARITIES:
            raise ValueError(f"FP8Config.granularity must be one of {', '.join(GRANULARITIES)}; "
                             f"got {one_line(self.granularity)}")
        for name in ("rotate", "smooth_k", "two_level"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"FP8Config.{name} must be a bool, got {one_line(getattr(self, name))}")
        for name, low, high in (("promote_every", 1, 2**31 - 1), ("seed", 0, INT64_MAX),
                                ("smooth_k_blocks", 1, 2**31 - 1)):
            value = getattr(self, name)
            optional = name in ("promote_every", "smooth_k_blocks")
            if optional and value is None:
                continue
            if not is_int(value):
                raise TypeError(f"FP8Config.{name} must be an int{' or None' if optional else ''}, got {one_line(value)}")
            if not low <= value <= high:
                raise ValueError(f"FP8Config.{name} must be in [{low}, {high}], got {value}")
            object.__setattr__(self, name, int(value))  # a numpy int is stored as an int (torch.Generator seeds)

    def promote_interval(self, head_dim: int) -> int:
        """K/V tiles per promotion at ``head_dim``: ``promote_every``, or the kernel's default there when None
        (``layout.promote_every``). Meaningful with two_level only. TypeError / ValueError for a head_dim that is not
        an int >= 1."""
        if isinstance(head_dim, bool) or not isinstance(head_dim, int):
            raise TypeError(f"head_dim must be an int, got {one_line(head_dim)}")
        if head_dim < 1:
            raise ValueError(f"head_dim must be >= 1, got {head_dim}")
        return layout.promote_every(head_dim) if self.promote_every is None else self.promote_every

    def replace(self, **changes) -> FP8Config:
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------- inputs


def _field_tensor(name: str, value) -> torch.Tensor:
    """``value`` (FP8Inputs' field ``name``) if it is a torch.Tensor, else a TypeError naming the field
    (FP8Inputs' own check and ``contract.check_fp8_inputs``'s)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"FP8Inputs.{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class FP8Inputs:
    """What the fa3-fp8 kernel consumes (the contract between the recipe and the kernel): quantised tensors, descales
    and the recipe.

    q: e4m3 (batch, seqlen_q, num_heads, head_dim), rotated if config.rotate.
    k: e4m3 (batch, seqlen_k, num_heads_kv, head_dim), smoothed and rotated as the recipe says.
    v_t: e4m3 (batch, num_heads_kv, head_dim, seqlen_k_padded): V transposed, zero-padded to a multiple of
        layout.K_ALIGN_TOKENS, tokens permuted by layout.v_token_order.
    q_descale: float32 (batch, num_heads, cdiv(seqlen_q, block_m)); k_descale, v_descale: float32
        (batch, num_heads_kv, cdiv(seqlen_k, block_n)); value = e4m3 * descale; all finite powers
        of two >= 2^-110, 1 for an all-zero block (expanded views for "head" / "tensor").
    softmax_scale: >= 0 (a negative one was folded into k). seqlen_k: unpadded.
    k_mean: float32 (batch, num_heads_kv, head_dim), the mean subtracted from K (already negated when the
        scale was negative), unrotated; None without smoothing.
    lse_shift: float32 (batch, num_heads, seqlen_q), softmax_scale * q . k_mean per query row (q before
        quantisation, float32), what smoothing took from every logit of the row: the entry points add it
        to the kernel's LSE, giving the LSE of the unsmoothed logits; None without smoothing.
    config: the recipe.
    block_m: query rows per Q descale (``layout.TILE_M``). block_n: keys per K / V descale; None (the default)
        means ``tiles_for(head_dim)[1]``, the kernel's tile_n at this head_dim (``layout.KERNEL_TILES``). The
        fa3-fp8 kernel needs block_n equal to its tile_n and refuses other heights (ValueError).
    Raises ValueError (naming the field) when a descale's shape does not match its block height, or a block height
    is not an int in [1, 2^63 - 1] (``MAX_BLOCK_ROWS``) (TypeError: q or a descale not a tensor). The rest of the
    contract is checked where caller-built inputs enter (``emulate_fp8_attention``, ``attention_from_fp8``:
    ``fa_variants.fp8.contract.check_fp8_inputs``), not here: construction is on every quantise call's host path.
    """

    q: torch.Tensor
    k: torch.Tensor
    v_t: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor
    softmax_scale: float
    seqlen_k: int
    k_mean: torch.Tensor | None
    lse_shift: torch.Tensor | None
    config: FP8Config
    block_m: int = layout.TILE_M
    block_n: int | None = None

    def __post_init__(self) -> None:
        # the fields read below, with the ranks they are read at (the rest: contract.check_fp8_inputs)
        for name, dims in (("q", 4), ("q_descale", 3), ("k_descale", 3), ("v_descale", 3)):
            t = _field_tensor(name, getattr(self, name))
            if t.dim() != dims:
                raise ValueError(f"FP8Inputs.{name} must be {dims}-D, got shape {tuple(t.shape)}")
        if not is_int(self.seqlen_k):
            raise TypeError(f"FP8Inputs.seqlen_k must be an int, got {one_line(self.seqlen_k)}")
        if self.seqlen_k < 0:
            raise ValueError(f"FP8Inputs.seqlen_k must be >= 0, got {self.seqlen_k}")
        if self.block_n is None:
            object.__setattr__(self, "block_n", tiles_for(self.head_dim)[1])
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"FP8Inputs.{name} must be a positive int, got {one_line(value)}")
            if value > MAX_BLOCK_ROWS:
                raise ValueError(f"FP8Inputs.{name} must be <= 2^63 - 1 (rows torch can index), got {value}")
            object.__setattr__(self, name, int(value))
        for name, blocks in (("q_descale", -(-self.q.shape[1] // self.block_m)),
                             ("k_descale", -(-self.seqlen_k // self.block_n)),
                             ("v_descale", -(-self.seqlen_k // self.block_n))):
            got = getattr(self, name).shape[-1]
            if got != blocks:
                block = "block_m" if name == "q_descale" else "block_n"
                raise ValueError(f"FP8Inputs.{name} has {got} blocks, but {block}={getattr(self, block)} gives {blocks}")

    @property
    def head_dim(self) -> int:
        return self.q.shape[-1]

    def rotation(self) -> HadamardRotation | None:
        """The rotation applied to q and k (None without one)."""
        return HadamardRotation(self.head_dim, self.config.seed) if self.config.rotate else None

    def unsmoothed_lse(self, lse: torch.Tensor) -> torch.Tensor:
        """The LSE of the logits before K's smoothing from ``lse``, the LSE of those the kernel saw: lse +
        ``lse_shift`` (lse itself without smoothing). Where both overflowed float32 with opposite signs (|softmax_scale|
        near its limit: inf + -inf would be NaN) the result keeps lse's sign, as an unsmoothed LSE beyond float32's
        range comes back +-inf (README, "softmax_scale"); a row that sees no key stays -inf."""
        if self.lse_shift is None:
            return lse
        total = lse + self.lse_shift
        return torch.where(lse.isinf() & self.lse_shift.isinf() & total.isnan(), lse, total)

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) in float32, (batch, seqlen, heads, head_dim), tokens of v in their natural order: the
        values the kernel computes with (rotated / smoothed as the recipe says).

        Raises ValueError / TypeError naming the field for inputs that break the contract
        (``contract.check_fp8_inputs``: e.g. a seqlen_k other than k's length)."""
        from fa_variants.fp8.contract import check_fp8_inputs  # contract imports this module

        check_fp8_inputs(self)
        tile_m, tile_n = self.block_m, self.block_n
        q = self.q.float() * _per_row(self.q_descale, tile_m, self.q.shape[1])
        k = self.k.float() * _per_row(self.k_descale, tile_n, self.seqlen_k)
        order = layout.v_token_order(self.v_t.shape[-1])
        v_nat = torch.empty_like(self.v_t, dtype=torch.float32)
        v_nat[..., order] = self.v_t.float()
        v = v_nat[..., :self.seqlen_k].permute(0, 3, 1, 2)  # (B, Nk, Hkv, D)
        return q, k, v * _per_row(self.v_descale, tile_n, self.seqlen_k)


def _per_row(descale: torch.Tensor, block: int, n: int) -> torch.Tensor:
    """(B, heads, tiles) -> (B, n, heads, 1): each row's descale."""
    return block_rows(descale, block, n).transpose(1, 2).unsqueeze(-1)


def block_rows(per_block: torch.Tensor, block: int, n: int) -> torch.Tensor:
    """(..., blocks) -> (..., n): each of n rows gets its block's value (row i: block i // block). Indexed, not
    repeated, so a block far taller than n costs nothing (repeat_interleave allocated block x blocks first)."""
    return per_block[..., torch.arange(n, device=per_block.device) // block]


# ------------------------------------------------------------------------------------- torch quantiser


def _check(q, k, v, config, softmax_scale) -> float:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise TypeError(f"{name} has dtype {t.dtype}; quantize_fp8 takes float16, bfloat16, float32 or float64")
        if host_values.vmapped(t):  # its rotation's signs are drawn from a seeded generator, which vmap refuses
            raise NotImplementedError(f"quantize_fp8: {name} is batched by torch.func.vmap, which the recipe does "
                                      "not support; fold the vmapped dimension into the batch")
    for name, t in (("k", k), ("v", v)):  # as attention: the GPU pass compiles for one dtype (V's pass reads K too)
        if t.dtype != q.dtype:
            raise TypeError(f"q has dtype {q.dtype} but {name} has dtype {t.dtype}; they must match")
    if not isinstance(config, FP8Config):
        raise TypeError(f"config must be an FP8Config, got {type(config).__name__}")
    (B, _, H, D), (Bk, _, Hkv, Dk) = q.shape, k.shape
    if v.shape != k.shape:
        raise ValueError(f"k has shape {tuple(k.shape)} but v has shape {tuple(v.shape)}; they must match")
    if Bk != B or Dk != D:
        raise ValueError(f"q has shape {tuple(q.shape)} but k has {tuple(k.shape)}: batch and head_dim must match")
    if D < 1 or Hkv < 1 or H % Hkv:
        raise ValueError(f"need head_dim >= 1 and num_heads ({H}) a multiple of num_heads_kv ({Hkv})")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    if softmax_scale is None:
        return 1.0 / math.sqrt(D)
    return check_softmax_scale(softmax_scale)  # attention's rule: the kernel folds it into log2(e) in float32


def k_sample_tiles(seqlen_k: int, block_n: int, blocks: int | None) -> list[int]:
    """The K tiles (block_n keys each) whose tokens K's smoothing mean is taken over: all
    T = cdiv(seqlen_k, block_n) tiles for blocks None or >= T, else floor(j T / blocks) for j < blocks (distinct,
    ascending, evenly spaced; tile 0 always, the last tile - possibly partial - never)."""
    T = -(-seqlen_k // block_n)
    if blocks is None or blocks >= T:
        return list(range(T))
    return [j * T // blocks for j in range(blocks)]


def k_sample_count(seqlen_k: int, block_n: int, blocks: int | None) -> int:
    """How many tokens ``k_sample_tiles`` covers (seqlen_k for the exact mean)."""
    return sum(min(block_n, seqlen_k - t * block_n) for t in k_sample_tiles(seqlen_k, block_n, blocks))


def k_mean(k: torch.Tensor, blocks: int | None = None, block_n: int = 128) -> torch.Tensor:
    """K's smoothing mean, float32 (batch, num_heads_kv, head_dim) (zeros for seqlen_k = 0): over every token
    (blocks None: one torch reduction, shared by the torch and the GPU quantiser's pipeline "v1" so both subtract
    the same numbers), or over the tokens of ``k_sample_tiles(seqlen_k, block_n, blocks)``."""
    if k.shape[1] == 0:
        return torch.zeros(k.shape[0], k.shape[2], k.shape[3], device=k.device, dtype=torch.float32)
    tiles = k_sample_tiles(k.shape[1], block_n, blocks)
    if len(tiles) == -(-k.shape[1] // block_n):
        return k.mean(dim=1, dtype=torch.float32)
    idx = torch.cat([torch.arange(t * block_n, min((t + 1) * block_n, k.shape[1]), device=k.device) for t in tiles])
    return k.index_select(1, idx).mean(dim=1, dtype=torch.float32)


_mean_over_tokens = k_mean  # for quantize_fp8_torch, whose keyword k_mean hides the function


def smoothing_lse_shift(q: torch.Tensor, mean: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """softmax_scale * q . mean per query row: q (B, Nq, H, D) (any float dtype), mean (B, Hkv, D) float32 ->
    float32 (B, H, Nq) (GQA: head h uses kv-head h // (H // Hkv)). The dot product and the scale in float64,
    rounded once: the shift is +-inf only where it is beyond float32's range itself (a float32 dot product of
    huge q and mean overflowed before a small scale brought it back into range: LSE +inf for a finite LSE)."""
    B, Nq, H, D = q.shape
    Hkv = mean.shape[1]
    shift = torch.einsum("bqkgd,bkd->bkgq", q.double().reshape(B, Nq, Hkv, H // Hkv, D), mean.double())
    return (shift * softmax_scale).reshape(B, H, Nq).float()


def _amax_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """max |x| over the finite values of each (batch, head, block of rows): x (B, N, H, D) float32 -> (B, H,
    cdiv(N, block)). An inf / NaN does not set the block's descale (it would scale its finite values to 0: module
    docstring, "Non-finite inputs")."""
    B, N, H, D = x.shape
    if N <= block:  # one block or none: no padding to the block's height (block_n=2**40 allocated 2^40 rows)
        return x.abs().nan_to_num(nan=0.0, posinf=0.0).amax(dim=(1, 3)).unsqueeze(-1) if N else x.new_zeros(B, H, 0)
    T = -(-N // block)
    pad = x.new_zeros(B, T * block, H, D)
    pad[:, :N] = x.abs().nan_to_num_(nan=0.0, posinf=0.0)
    return pad.view(B, T, block, H, D).amax(dim=(2, 4)).transpose(1, 2).contiguous()


def _reduce_amax(amax: torch.Tensor, granularity: str) -> torch.Tensor:
    """Block maxima (B, H, T) -> maxima of the granularity, expanded back to (B, H, T)."""
    if granularity == "head" and amax.shape[-1]:
        return amax.amax(dim=-1, keepdim=True).expand_as(amax)
    if granularity == "tensor" and amax.numel():
        return amax.amax().expand_as(amax)
    return amax


def _to_e4m3(x: torch.Tensor, inv: torch.Tensor, block: int) -> torch.Tensor:
    """e4m3(x / descale): x (B, N, H, D) float32, inv (B, H, T) = 1 / descale; RNE, saturating finite values; an
    inf or NaN becomes e4m3's NaN (e4m3fn has no inf; saturating inf to 448 would make it a finite wrong value)."""
    scaled = x * _per_row(inv, block, x.shape[1])
    return scaled.clamp(-E4M3_MAX, E4M3_MAX).masked_fill_(scaled.isinf(), math.nan).to(E4M3)


def _quantize_rows(x: torch.Tensor, block: int, granularity: str):
    """(e4m3 data, descale (B, H, T)) for float32 x (B, N, H, D)."""
    descale, inv = descale_from_amax(_reduce_amax(_amax_blocks(x, block), granularity))
    return _to_e4m3(x, inv, block), descale


def transpose_v(v8: torch.Tensor) -> torch.Tensor:
    """The kernel's V layout: e4m3 v (B, Nk, Hkv, D) -> v_t (B, Hkv, D, Nk_padded), zero padding, tokens
    permuted by layout.v_token_order (gather: v_t[..., p] = v[order[p]])."""
    B, Nk, Hkv, D = v8.shape
    n_pad = layout.padded_seqlen_k(Nk)
    v_t = torch.zeros(B, Hkv, D, n_pad, dtype=torch.uint8, device=v8.device)
    v_t[..., :Nk] = v8.view(torch.uint8).permute(0, 2, 3, 1)
    return v_t[..., layout.v_token_order(n_pad).to(v8.device)].view(E4M3)


def _as_float32(name: str, t: torch.Tensor) -> torch.Tensor:
    """t in float32, the torch quantiser's arithmetic. ValueError (naming t) for float64 with finite values past
    float32's range: rounded, they became inf, then e4m3 NaN, and a NaN O without a word."""
    if t.dtype == torch.float64 and host_values.unreadable(t) is None and t.numel():
        big = torch.finfo(torch.float32).max
        if bool(((t.abs() > big) & t.isfinite()).any()):
            raise ValueError(f"{name} has finite values beyond float32's range (|x| > {big:.3g}); the FP8 "
                             f"quantisation rounds float64 to float32 first")
    return t.float()


def quantize_fp8_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, config: FP8Config = FP8Config(),
                       softmax_scale: float | None = None, block_n: int | None = None,
                       k_mean: torch.Tensor | None = None) -> FP8Inputs:
    """The recipe in PyTorch (any device; the CPU path, and the front half of the emulation).

    Arguments, result and errors as :func:`quantize_fp8`. Float32 throughout (float64 inputs are rounded
    to float32 first). The GPU pass computes the same operations in the same order.
    block_n: keys per K/V descale, a multiple of ``layout.V_TOKEN_GROUP`` up to 2^63 - 1 (``MAX_BLOCK_ROWS``;
    ValueError otherwise); None: the kernel's tile_n (``tiles_for``). Another height is for studies
    and A/B runs (the kernel then needs a config whose tile_n is block_n; ``FP8Inputs.block_n`` records it).
    k_mean: float32 (batch, num_heads_kv, head_dim) on k's device, K's mean over tokens to subtract (with
    ``config.smooth_k``) instead of this module's ``k_mean(k)``: another summation order of the same mean
    (the GPU pass's own, to compare the rest bit for bit). ValueError for a wrong shape, dtype or device.
    """
    scale = _check(q, k, v, config, softmax_scale)
    D = q.shape[-1]
    tile_m, tile_n = tiles_for(D)
    if block_n is not None:
        if not is_int(block_n) or not 1 <= block_n <= MAX_BLOCK_ROWS or block_n % layout.V_TOKEN_GROUP:
            raise ValueError(f"block_n must be a positive multiple of {layout.V_TOKEN_GROUP} up to 2^63 - 1, got "
                             f"{one_line(block_n)}")
        tile_n = int(block_n)
    given_mean = k_mean
    if given_mean is not None and (not isinstance(given_mean, torch.Tensor) or given_mean.dtype != torch.float32
                                   or given_mean.shape != (k.shape[0], k.shape[2], D) or given_mean.device != k.device):
        got = (f"{given_mean.dtype} {tuple(given_mean.shape)} on {given_mean.device}"
               if isinstance(given_mean, torch.Tensor) else type(given_mean).__name__)
        raise ValueError(f"k_mean must be a float32 tensor of shape {(k.shape[0], k.shape[2], D)} on k's device "
                         f"({k.device}), got {got}")
    qf, kf, vf = (_as_float32(name, t) for name, t in (("q", q), ("k", k), ("v", v)))
    rot = HadamardRotation(D, config.seed)
    signs = rot.signs if config.rotate else torch.ones(D, device="cpu", dtype=torch.float32)
    k_signs = -signs if scale < 0 else signs  # softmax(c Q K^T) = softmax(|c| Q (-K)^T)
    mean = shift = None
    if config.smooth_k:
        mean = given_mean if given_mean is not None else _mean_over_tokens(k, config.smooth_k_blocks, tile_n)
        kf = kf - mean.unsqueeze(1)
        mean = -mean if scale < 0 else mean  # the mean of the K the kernel sees
        shift = smoothing_lse_shift(qf, mean, abs(scale))
    if config.rotate:
        qf, kf = rot(qf), rot(kf, k_signs)
    elif scale < 0:
        kf = -kf
    scale = abs(scale)
    q8, q_descale = _quantize_rows(qf, tile_m, config.granularity)
    k8, k_descale = _quantize_rows(kf, tile_n, config.granularity)
    v8, v_descale = _quantize_rows(vf, tile_n, config.granularity)
    return FP8Inputs(q8, k8, transpose_v(v8), q_descale, k_descale, v_descale, scale, k.shape[1], mean, shift,
                     config, block_m=tile_m, block_n=tile_n)


#: the modules whose absence makes the GPU quantisation pass unavailable (then impl "auto" takes the torch recipe):
#: the pass itself (a checkout without it), and the top-level packages of the CuTe DSL, its CUDA bindings and its
#: TVM FFI runtime
_GPU_PASS_NEEDS = ("fa_variants.fp8.quant_host", "cutlass", "cuda", "tvm_ffi")


def quantize_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, config: FP8Config = FP8Config(),
                 softmax_scale: float | None = None, impl: str = "auto") -> FP8Inputs:
    """Quantise q, k, v for the fa3-fp8 kernel with the recipe ``config`` (module docstring).

    Args:
        q: (batch, seqlen_q, num_heads, head_dim); k, v: (batch, seqlen_k, num_heads_kv, head_dim); float16,
            bfloat16, float32 or float64 (one dtype), one device, any strides. Not modified.
        config: the recipe (FP8Config). softmax_scale: a finite real with |softmax_scale| <=
            ``fa_variants.api.MAX_SOFTMAX_SCALE`` (attention's rule, ``common.scale.check_softmax_scale``) or None
            (1 / sqrt(head_dim)); a negative one is folded into K (FP8Inputs.softmax_scale = |softmax_scale|).
        impl: "auto" (the CuTe DSL pass, ``fa_variants.fp8.quant_host``, for 16-bit CUDA inputs it serves;
            the torch implementation otherwise), "torch", or "kernel" (ValueError where it cannot run).

    Returns:
        FP8Inputs (quantised q, k, transposed v, descales, scale, recipe).

    Raises:
        TypeError: a non-tensor, a dtype other than those above, q, k, v of different dtypes, a bad config type, a
            softmax_scale that is not a real number (a bool, a str, a tensor).
        ValueError: ranks, mismatched shapes or devices, num_heads not a multiple of num_heads_kv, a
            non-finite or out-of-range softmax_scale, impl unknown or "kernel" where the GPU pass cannot serve
            the call, float64 inputs with finite values past float32's range (they are rounded to float32).
    """
    if impl not in ("auto", "torch", "kernel"):
        raise ValueError(f"impl must be 'auto', 'torch' or 'kernel', got {one_line(impl)}")
    if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor):
        q, k, v = q.resolve_neg(), k.resolve_neg(), v.resolve_neg()  # the GPU pass reads memory (negative bits: -x)
    if impl != "torch":
        _check(q, k, v, config, softmax_scale)
        if not q.is_cuda:  # said before importing the GPU pass: its import loads the CuTe DSL (~0.4 s), which also
            # installs its own sys.excepthook and warning filters in the caller's process
            problem = f"the GPU quantisation pass needs CUDA tensors; the inputs are on {q.device.type}"
        else:
            try:
                quant_host = importlib.import_module("fa_variants.fp8.quant_host")
            except ModuleNotFoundError as exc:  # the CuTe DSL (or what it needs) is not installed: the torch recipe
                if exc.name not in _GPU_PASS_NEEDS and (exc.name or "").split(".")[0] not in _GPU_PASS_NEEDS:
                    raise  # another module missing, e.g. one of ours: a fault, not hidden by the fallback
                problem = f"the GPU quantisation pass cannot be imported here ({exc})"
            else:
                problem = quant_host.why_not(q, config)
        if problem is None:
            return quant_host.quantize(q, k, v, config=config, softmax_scale=softmax_scale)
        if impl == "kernel":
            raise ValueError(f"impl='kernel': {problem}")
    return quantize_fp8_torch(q, k, v, config=config, softmax_scale=softmax_scale)
