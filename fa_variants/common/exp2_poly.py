"""exp2 on the FMA pipe instead of the MUFU (special function unit): the constants, the column choice and a
PyTorch model of the kernels' arithmetic (pure Python: the CPU tests and the fp8 emulation import it without the DSL).

Why: a Hopper SM computes 16 exp2 per cycle on MUFU.EX2 but 128 FP32 FMAs. Where the exponentials bound a kernel
(fa3-fp8 at head_dim 64: the FP8 GEMMs got twice as fast, the exponentials did not) a fraction of them can be
computed with FMAs instead (the idea of FlashAttention-4's exp2 emulation on Blackwell, Dao-AILab/flash-attention
flash_attn/cute/utils.py; written here from the description, with its own split and polynomial):

    x  = max(x, -127)                  (-inf, a masked score, and anything below: exactly 0 below)
    r  = x + 1.5 * 2^23                (round to the nearest integer j: j sits in r's low mantissa bits)
    f  = x - (r - 1.5 * 2^23)          (exact; f in [-0.5, 0.5])
    p  = 1 + f (c1 + f (c2 + f c3))    (three FMAs, each rounded once: p ~ 2^f in [0.707, 1.415])
    2^x = bits(p) + (bits(r) << 23)    (integer add into the exponent field: bits(r) << 23 = j << 23 mod 2^32)

c0 = 1 makes exp2(0) exactly 1 (a row's max score keeps P = 2^p_shift exactly, as on MUFU). x = -127 gives
j = -127, f = 0, p = 1, so the result's bits are 0: exactly +0.0, as MUFU.EX2 gives for -inf. For x in
(-127, -126) the result is a subnormal that is not 2^x (< 2^-125, far below anything a row sum or an e4m3 / bf16 P
resolves: every non-empty row has one P of 2^p_shift >= 1). A NaN x gives 0 here (fmax drops NaN), NaN on MUFU.

Accuracy (``MAX_REL_ERROR``, tests/test_exp2_poly.py measures it on this model): c1..c3 are a minimax fit of 2^f on
[-0.5, 0.5] in relative error with c0 = 1, rounded to float32 (``minimax_coefficients`` derives them again: Lawson's
iteration in numpy, max relative error 1.013e-4 before the float32 roundings; degree 2 would give 1.96e-3, ~bf16's
half ulp of P); with float32 Horner steps the largest relative error
is 1.02e-4 (2^-13.3) for x in [-126, 127]. MUFU.EX2's is ~2^-22. Against e4m3's 2^-4 relative spacing of P (fa3-fp8)
or bf16's 2^-8 (fa3) it changes a rounded P at most by one step where P sits within 1e-4 of a rounding tie.

Which scores: ``emulated_column(j, per8)``: of every 8 consecutive columns of a thread's row (the rows view of a
WGMMA accumulator), the last ``per8`` are emulated; in tile columns that is
``2 ((col // 8) % 4) + col % 2 >= 8 - per8`` (the thread with lane % 4 = t holds columns 8 v + 2 t + {0, 1}),
``emulated_tile_columns``.
"""
from __future__ import annotations

import torch

#: 2^f ~ 1 + C1 f + C2 f^2 + C3 f^3 on [-0.5, 0.5] (float32 values)
C1 = 0.6932829022407532
C2 = 0.2422109991312027
C3 = 0.05500893294811249
ROUND_MAGIC = 12582912.0  # 1.5 * 2^23: x + it rounds x to an integer held in the low mantissa bits
X_MIN = -127.0
MAX_REL_ERROR = 1.02e-4  # measured on the model below over [-126, 127] (module docstring)


def minimax_coefficients(degree: int = 3, points: int = 2001, iterations: int = 3000) -> tuple[list[float], float]:
    """(c1..c_degree, max relative error): the polynomial 1 + c1 f + ... + c_degree f^degree closest to 2^f on [-0.5, 0.5]
    in the largest relative error, over ``points`` evenly spaced f (c0 = 1 fixed, so 2^0 is exact). Lawson's algorithm:
    weighted least squares whose weights are multiplied by each point's error every iteration, which converges to the
    minimax (Chebyshev) solution of this linear problem. float64 coefficients; C1..C3 are the degree-3 ones rounded to
    float32. Pure numpy, ~0.4 s."""
    import numpy as np

    f = np.linspace(-0.5, 0.5, points)
    inv = 2.0 ** -f  # relative error of p: p(f) 2^-f - 1 = sum_k c_k f^k 2^-f - (1 - 2^-f), linear in c
    basis = np.stack([f ** k * inv for k in range(1, degree + 1)], axis=1)
    rhs = 1.0 - inv
    weights = np.full(points, 1.0 / points)
    for _ in range(iterations):
        root = np.sqrt(weights)
        coef = np.linalg.lstsq(basis * root[:, None], rhs * root, rcond=None)[0]
        err = np.abs(basis @ coef - rhs)
        weights = weights * err
        weights /= weights.sum()
    return [float(c) for c in coef], float(err.max())


def check_per8(per8: int) -> int:
    """per8 (emulated exp2 per 8 scores of a thread's row), or ValueError."""
    if not isinstance(per8, int) or isinstance(per8, bool) or not 0 <= per8 <= 8:
        raise ValueError(f"exp2_emu={per8!r} must be an int in [0, 8] (exp2 computed with FMAs per 8 scores)")
    return per8


def emulated_column(j: int, per8: int) -> bool:
    """Whether column j of a thread's row (rows view of an accumulator) takes the FMA-pipe exp2."""
    return j % 8 >= 8 - per8


def emulated_tile_columns(tile_n: int, per8: int, device=None) -> torch.Tensor:
    """Boolean (tile_n,): which columns of a WGMMA score tile (S = Q K^T, columns = keys of the tile) the kernel
    computes with the FMA-pipe exp2 (module docstring)."""
    col = torch.arange(tile_n, device=device)
    return 2 * ((col // 8) % 4) + col % 2 >= 8 - per8


def _fma32(a: torch.Tensor, b: torch.Tensor | float, c: torch.Tensor | float) -> torch.Tensor:
    """float32 a * b + c rounded once (the product is exact in float64; the float64 sum is rounded, then to
    float32: a double rounding that differs from fma.rn.f32 only in rare ties)."""
    return (a.double() * (b.double() if torch.is_tensor(b) else b) + (c.double() if torch.is_tensor(c) else c)).float()


def exp2_poly(x: torch.Tensor) -> torch.Tensor:
    """The kernels' FMA-pipe exp2 (module docstring), step by step in float32. x: float32 tensor, <= 127."""
    x = torch.clamp(x.float(), min=X_MIN)  # -inf -> -127; torch keeps NaN, so:
    x = torch.where(torch.isnan(x), torch.full_like(x, X_MIN), x)  # fmax(NaN, -127) = -127 on the GPU
    r = x + torch.tensor(ROUND_MAGIC, dtype=torch.float32)  # one float32 rounding: to the nearest integer (even)
    f = x - (r - ROUND_MAGIC)  # both exact
    p = _fma32(_fma32(_fma32(torch.full_like(f, C3), f, C2), f, C1), f, 1.0)
    bits = p.view(torch.int32) + (r.view(torch.int32) << 23)  # int32 wraps like the device's 32-bit add
    return bits.view(torch.float32)
