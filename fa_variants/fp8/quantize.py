"""FP8 (e4m3) pieces of FlashAttention-3: incoherent processing, block quantisation, and an emulation reference.

Source: Shah et al. 2024, "FlashAttention-3", section 3.3 (low-precision with block quantisation and
incoherent processing) and Table 3 (RMSE of FP8 attention on inputs with outliers).

* Incoherent processing: Q and K are multiplied by the same random orthogonal R = diag(s) H, with s random
  signs (seeded) and H a normalised Hadamard matrix applied by the fast Walsh-Hadamard transform in
  O(d log d). Since R R^T = I, (Q R)(K R)^T = Q K^T, but an outlier channel is spread over all channels, so
  the quantisation step (set by the block's largest magnitude) shrinks. For a head_dim that is not a power
  of two, H is block diagonal over the power-of-two pieces of head_dim's binary expansion (e.g.
  96 = 64 + 32), each normalised by 1/sqrt(block): still orthonormal.
* Block quantisation: one float32 scale per (batch, head, Br-row tile of Q) and per (batch, head, Bc-row tile
  of K and V), scale = amax / 448 (e4m3's largest finite value); the kernel multiplies by the *descale*
  factors. Per-tensor quantisation (one scale for a whole tensor) is the baseline.
* The emulation reference (:func:`fp8_attention_reference`) does in float32 what an FP8 kernel does: the
  quantised inputs, dequantised; a loop over Bc-key tiles with online softmax; P = exp(S - m) in [0, 1]
  rounded to e4m3 after scaling by ``p_scale`` (448 maps P's maximum 1 to e4m3's maximum; since the
  running row max gives P <= 1 with equality for the max element, a per-row scale 448 / rowmax(P) is the
  same number) before P V; l summed from the unrounded fp32 P; fp32 accumulation.
  An FP8 kernel with the same configuration is tested against it with :func:`fp8_error_bound`.

Conventions (HELPERS.md): q (batch, seqlen_q, num_heads, head_dim), k, v (batch, seqlen_k, num_heads_kv,
head_dim); LSE (batch, num_heads, seqlen_q), natural log; bottom-right causal; GQA h -> h // group.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "E4M3",
    "E4M3_MAX",
    "fwht",
    "hadamard_blocks",
    "HadamardRotation",
    "Quantized",
    "quantize_blocks",
    "quantize_per_tensor",
    "FP8Config",
    "FP8Inputs",
    "prepare_fp8_inputs",
    "fp8_attention_reference",
    "fp8_error_bound",
]

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448.0


# ------------------------------------------------------------------------------- Hadamard rotation


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal fast Walsh-Hadamard transform along the last dim: x @ H_n / sqrt(n), n = x.shape[-1].

    n must be a power of two (ValueError otherwise). O(n log n) butterflies (Sylvester ordering); H_n is
    symmetric and H_n H_n = n I, so fwht is its own inverse. Returns a new tensor of x's dtype and shape.
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
    return x / math.sqrt(n)


def hadamard_blocks(head_dim: int) -> tuple[int, ...]:
    """Power-of-two block sizes whose sum is head_dim, largest first (its binary expansion): 96 -> (64, 32).

    A power of two gives one block (a full Hadamard). Raises ValueError for head_dim < 1.
    """
    if head_dim < 1:
        raise ValueError(f"head_dim must be >= 1, got {head_dim}")
    return tuple(1 << b for b in reversed(range(head_dim.bit_length())) if head_dim >> b & 1)


class HadamardRotation:
    """The random orthogonal R = diag(s) H_blockdiag of FA3 section 3.3, for one head_dim.

    ``rot(x)`` returns x @ R along the last dim (x (..., head_dim), float32 or float64; other dtypes are
    computed in float32 and returned as float32). s: random +-1 signs from ``torch.Generator`` seeded with
    ``seed``; H_blockdiag: :func:`fwht` on each block of :func:`hadamard_blocks`. Apply the same rotation
    to Q and K (not to V): (Q R)(K R)^T = Q K^T.
    """

    def __init__(self, head_dim: int, seed: int = 0) -> None:
        self.head_dim = head_dim
        self.blocks = hadamard_blocks(head_dim)
        g = torch.Generator().manual_seed(seed)
        self.signs = torch.randint(0, 2, (head_dim,), generator=g).float() * 2 - 1

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"last dim {x.shape[-1]} != head_dim {self.head_dim} of this rotation")
        if x.dtype not in (torch.float32, torch.float64):
            x = x.float()
        x = x * self.signs.to(x.device, x.dtype)
        pieces, start = [], 0
        for b in self.blocks:
            pieces.append(fwht(x[..., start:start + b]))
            start += b
        return torch.cat(pieces, dim=-1)

    def matrix(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """R as a dense (head_dim, head_dim) matrix (rows of the identity, rotated)."""
        return self(torch.eye(self.head_dim, dtype=dtype))


# ----------------------------------------------------------------------------------- quantisation


class Quantized(NamedTuple):
    """data: float8_e4m3fn like the input, (B, N, heads, D); descale: float32 (B, heads, ceil(N / block))
    for block quantisation or a 0-dim tensor for per-tensor; block: rows per scale (N for per-tensor)."""

    data: torch.Tensor
    descale: torch.Tensor
    block: int

    def dequantize(self) -> torch.Tensor:
        """data * descale in float32, (B, N, heads, D)."""
        x = self.data.float()
        if self.descale.dim() == 0:
            return x * self.descale
        B, N, H, D = x.shape
        per_row = self.descale.repeat_interleave(self.block, dim=2)[:, :, :N]  # (B, H, N)
        return x * per_row.transpose(1, 2).unsqueeze(-1)


def _to_e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def _scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """amax / 448, with 1 where amax is 0 (an all-zero block)."""
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def quantize_blocks(x: torch.Tensor, block: int) -> Quantized:
    """e4m3 with one scale per (batch, head, ``block``-row tile): x (B, N, heads, D), any float dtype.

    The scale of a tile is its amax / 448 (float32); the tail tile has N % block rows. Raises ValueError for
    a non-4-D x or block < 1.
    """
    if x.dim() != 4 or block < 1:
        raise ValueError(f"quantize_blocks needs x (B, N, heads, D) and block >= 1; got {tuple(x.shape)}, {block}")
    B, N, H, D = x.shape
    T = -(-N // block)
    xf = x.float()
    pad = torch.zeros(B, T * block, H, D, device=x.device)
    pad[:, :N] = xf.abs()
    amax = pad.view(B, T, block, H, D).amax(dim=(2, 4)).transpose(1, 2)  # (B, H, T)
    scale = _scale_from_amax(amax)
    per_row = scale.repeat_interleave(block, dim=2)[:, :, :N].transpose(1, 2).unsqueeze(-1)
    return Quantized(_to_e4m3(xf / per_row), scale, block)


def quantize_per_tensor(x: torch.Tensor) -> Quantized:
    """e4m3 with one scale for the whole tensor (amax / 448, float32, 0-dim)."""
    xf = x.float()
    scale = _scale_from_amax(xf.abs().amax() if xf.numel() else torch.zeros(()))
    return Quantized(_to_e4m3(xf / scale), scale, x.shape[1] if x.dim() == 4 else 0)


# --------------------------------------------------------------------------------- emulation reference


@dataclass(frozen=True)
class FP8Config:
    """How an FP8 attention quantises (the defaults are the shipped path).

    granularity: "block" (one scale per (batch, head, Br rows of Q) / (batch, head, Bc rows of K, V)) or
    "tensor" (one scale per tensor). rotate: random-sign Hadamard on Q and K (FA3 section 3.3).
    smooth_k: subtract from K its mean over keys (per batch, K/V head and channel) before quantising; every
    score of a query row then moves by the same softmax_scale * q . mean(K), so O is unchanged and LSE is
    corrected by that shift (exact; the "smooth K" of SageAttention, Zhang et al. 2024, section 4.2). It
    removes a channel bias of K (EDGE_CASES.md EC-23a) that no rotation can. Br, Bc: the tiles (Bc is also
    the key tile of the online softmax, as in a kernel). p_scale: P is multiplied by it before rounding to
    e4m3 (448: P's maximum 1 -> e4m3's maximum). seed: of the rotation's signs.
    """

    granularity: str = "block"
    rotate: bool = True
    smooth_k: bool = True
    Br: int = 128
    Bc: int = 128
    p_scale: float = E4M3_MAX
    seed: int = 0

    def __post_init__(self) -> None:
        if self.granularity not in ("block", "tensor"):
            raise ValueError(f"granularity must be 'block' or 'tensor', got {self.granularity!r}")
        if self.Br < 1 or self.Bc < 1 or not self.p_scale > 0:
            raise ValueError(f"need Br, Bc >= 1 and p_scale > 0; got {self.Br}, {self.Bc}, {self.p_scale}")


class FP8Inputs(NamedTuple):
    """What an FP8 kernel consumes: quantised q (block Br), k and v (block Bc) with their descales, and
    lse_shift (B, H, Nq) float32 to add to the kernel's LSE (None unless smooth_k)."""

    q: Quantized
    k: Quantized
    v: Quantized
    lse_shift: torch.Tensor | None


def _check_qkv(q, k, v) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (B, N, heads, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[2] < 1 or q.shape[2] % k.shape[2]:
        raise ValueError(f"num_heads ({q.shape[2]}) must be a multiple of num_heads_kv ({k.shape[2]})")


def prepare_fp8_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float | None = None,
                       config: FP8Config = FP8Config()) -> FP8Inputs:
    """The pre-processing of an FP8 attention: smooth K, rotate Q and K, quantise to e4m3 (in that order).

    q (B, Nq, H, D), k and v (B, Nk, Hkv, D), any float dtype and device (computed in float32).
    softmax_scale (default 1/sqrt(D)) is only needed for lse_shift. Returns :class:`FP8Inputs`.
    Raises ValueError for bad ranks or num_heads % num_heads_kv != 0.
    """
    _check_qkv(q, k, v)
    B, Nq, H, D = q.shape
    Hkv = k.shape[2]
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
    q, k = q.float(), k.float()
    shift = None
    if config.smooth_k and k.shape[1] > 0:
        k_mean = k.mean(dim=1)  # (B, Hkv, D)
        k = k - k_mean.unsqueeze(1)
        shift = scale * torch.einsum("bqhgd,bhd->bhgq", q.reshape(B, Nq, Hkv, H // Hkv, D), k_mean)
        shift = shift.reshape(B, H, Nq)
    if config.rotate:
        rot = HadamardRotation(D, config.seed)
        q, k = rot(q), rot(k)
    quant = quantize_blocks if config.granularity == "block" else (lambda x, _: quantize_per_tensor(x))
    return FP8Inputs(quant(q, config.Br), quant(k, config.Bc), quant(v, config.Bc), shift)


def fp8_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                            softmax_scale: float | None = None,
                            config: FP8Config = FP8Config()) -> tuple[torch.Tensor, torch.Tensor]:
    """What an e4m3 attention kernel computes, emulated in float32 on any device.

    q (B, Nq, H, D), k and v (B, Nk, Hkv, D), any float dtype (the high-precision inputs that the kernel's
    pre-processing turns into e4m3). Steps: (1) :func:`prepare_fp8_inputs` (smooth K, rotate, quantise),
    then dequantise (descales applied exactly, float32); (2) for each Bc-key tile: S = softmax_scale Q K^T
    (fp32, bottom-right causal mask), running max m, P = exp(S - m), l += rowsum(P) in fp32,
    O += round_e4m3(P * p_scale) / p_scale @ V (fp32 accumulation); (3) O / l, LSE = m + log l (+ the
    smooth-K shift).
    Returns (out float32 (B, Nq, H, D), lse float32 (B, H, Nq)); rows that see no key give 0 and -inf.
    Raises ValueError for bad ranks or num_heads % num_heads_kv != 0.
    """
    _check_qkv(q, k, v)
    B, Nq, H, D = q.shape
    Nk, Hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
    fp8 = prepare_fp8_inputs(q, k, v, softmax_scale=scale, config=config)
    qd = fp8.q.dequantize().transpose(1, 2)  # (B, H, Nq, D)
    kd = fp8.k.dequantize().transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    vd = fp8.v.dequantize().transpose(1, 2).repeat_interleave(H // Hkv, dim=1)

    O = torch.zeros(B, H, Nq, v.shape[3], device=q.device)
    m = torch.full((B, H, Nq), -math.inf, device=q.device)
    l = torch.zeros(B, H, Nq, device=q.device)
    rows = torch.arange(Nq, device=q.device).unsqueeze(1)
    for c0 in range(0, Nk, config.Bc):
        c1 = min(c0 + config.Bc, Nk)
        S = scale * qd @ kd[:, :, c0:c1].transpose(-1, -2)
        if causal:
            cols = torch.arange(c0, c1, device=q.device)
            S = S.masked_fill(cols > rows + (Nk - Nq), -math.inf)
        m_new = torch.maximum(m, S.amax(dim=-1))
        m_safe = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
        P = torch.exp(S - m_safe.unsqueeze(-1))
        alpha = torch.exp(m - m_safe)  # 0 while the row has seen no key (m = -inf)
        l = alpha * l + P.sum(dim=-1)
        P8 = _to_e4m3(P * config.p_scale).float() / config.p_scale
        O = alpha.unsqueeze(-1) * O + P8 @ vd[:, :, c0:c1]
        m = m_new
    inv = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))
    lse = m + torch.log(l)
    if fp8.lse_shift is not None:
        lse = lse + fp8.lse_shift
    return (O * inv.unsqueeze(-1)).transpose(1, 2), lse


def fp8_error_bound(out_emulated: torch.Tensor, out_exact: torch.Tensor, atol: float = 1e-4) -> float:
    """The largest max|O_kernel - O_exact| an FP8 kernel may show: 2 * max|O_emulated - O_exact| + atol.

    The project's testing rule (DESIGN.md) with this emulation, run with the kernel's own configuration
    (granularity, rotation seed, Br, Bc, p_scale), in the place of "torch in the same dtype"; out_exact is the
    float64 reference on the high-precision inputs. Returns a float (NaN in either input gives NaN).
    """
    diff = (out_emulated.double() - out_exact.double()).abs()
    return 2.0 * (diff.max().item() if diff.numel() else 0.0) + atol
