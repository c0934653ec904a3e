"""Online softmax in registers (FlashAttention-2, Dao 2023, Algorithm 1 lines 8-12).

State per query row, kept by the threads that own the row: m, the running row max of the raw
scores, and l, the running row sum of exp(scale * (s - m)). The scale is folded into log2(e) once
(c = softmax_scale * log2 e), so each exponential is one exp2 (MUFU.EX2):
exp(scale * (s - m)) = exp2((s - m) * c). Subtracting before scaling keeps the row's max element at
exactly exp2(0) = 1 and alpha at exactly 1 while the max does not change, however large |m c| is (the
single-FFMA form s * c - m * c rounds m * c and leaves P(max) = 2^(+-|m c| 2^-24), 0.5% off at
logits near -1e6; docs/edge_cases.md, "Huge logits"). This needs c > 0 (the row max of raw scores is the
max of the scaled ones only then): kernels are launched with `common.scale.positive_scale`.

Per K/V tile j (after S_j = Q K_j^T has been computed and masked with -inf):

    m_new = max(m, rowmax(S_j));  m_safe = 0 if m_new == -inf else m_new   # a fully masked row
    P_j = exp2((S_j - m_safe) c);  alpha = exp2((m - m_safe) c)            # alpha rescales O and l
    l = alpha * l + rowsum(P_j);  O = alpha * O  (then O += P_j V_j by the caller);  m = m_new

and once at the end (deferred normalisation, FA2 section 3.1.1): O /= l, LSE = (m c + log2 l) ln 2;
a row that saw no key has l = 0 and gets O = 0, LSE = -inf.

Block-scaled scores (fa3-fp8, FA3 section 3.3): each K/V tile n has its own scale c_n (the q and k block
descales times softmax_scale log2 e), so m is kept in log2 units, m = max_n c_n rowmax(S_n), and
P = exp2(S c_n - m + p_shift), alpha = exp2(m_old - m_new), LSE = (m + log2 l - p_shift) ln 2
(``OnlineSoftmax(..., tile_scales=True, p_shift=...)``, c_n passed to ``update``).

FA1 keeps O, l and m in HBM between steps: `resume(m, l)` starts a step from the saved state (l the whole
row sum), `update` runs as above, and `resumed_sum(alpha)` gives the new whole row sum alpha l + rowsum(P_j).

The row sums are kept per thread (each thread sums its own columns) and reduced across the quad only
in `finalize`, as FA2 does; the row max is quad-reduced every step because P depends on it.

Works on (rows, cols) register views of mma.sync and WGMMA accumulators (`common.layout.rows_cols`),
whose rows are shared by the 4 lanes of a quad.
Adapted from Dao-AILab/flash-attention:flash_attn/cute/softmax.py::Softmax (online_softmax, finalize).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from fa_variants.common.layout import quad_allreduce
from fa_variants.common.scale import LN_2


@cute.jit
def log_sum_exp(m: Float32, scale_log2: Float32, l: Float32, empty) -> Float32:
    """Natural-log LSE of a row from its max m of raw scores and whole row sum l: (m c + log2 l) ln 2;
    -inf when `empty` (the row saw no key)."""
    return -Float32.inf if empty else (m * scale_log2 + cute.math.log2(l, fastmath=True)) * LN_2


class OnlineSoftmax:
    """Running (m, l) for the `num_rows` query rows this thread holds. Build inside a kernel."""

    def __init__(self, num_rows: int, scale_log2: Float32, exp2_ffma: bool = False, tile_scales: bool = False,
                 p_shift: float = 0.0):
        self.num_rows = num_rows
        self.scale_log2 = scale_log2
        # True: one FFMA per score, exp2(s c - m c) (flash-attn's form; P(max) off by 2^(|m c| 2^-24) at
        # huge logits); False (default): exp2((s - m) c), exact at the row max (module docstring).
        self.exp2_ffma = exp2_ffma
        # Block-scaled scores (fa3-fp8): `update` takes each tile's own c_n and m is kept in log2 units,
        # m = max_n c_n rowmax(S_n); P = exp2(S c_n - m + p_shift) (one FFMA), LSE = (m + log2 l - p_shift) ln 2.
        self.tile_scales = tile_scales
        self.p_shift = p_shift
        self.row_max = cute.make_rmem_tensor(num_rows, Float32)
        self.row_sum = cute.make_rmem_tensor(num_rows, Float32)

    def reset(self):
        """m = -inf, l = 0 (Algorithm 1 line 4)."""
        self.row_max.fill(-Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def update(self, s: cute.Tensor, is_first: cutlass.Constexpr[bool], tile_scale_log2: Float32 = None) -> cute.Tensor:
        """Fold one masked raw score tile (rows view) into (m, l); S becomes P in place. Returns
        alpha per row, the factor the caller rescales O with (1 on the first tile). With ``tile_scales``
        the tile's own scale c_n = ``tile_scale_log2`` (> 0) replaces ``scale_log2`` (see ``__init__``)."""
        alpha = cute.make_rmem_tensor(self.num_rows, Float32)
        n_cols = cute.size(s, mode=[1])
        for r in cutlass.range_constexpr(self.num_rows):
            m_old = self.row_max[r]
            m_new = s[r, 0]
            for c in cutlass.range_constexpr(1, n_cols):
                m_new = cute.arch.fmax(m_new, s[r, c])
            m_new = quad_allreduce(m_new, cute.arch.fmax)
            if const_expr(self.tile_scales):
                m_new = m_new * tile_scale_log2  # log2 units
            if const_expr(not is_first):
                m_new = cute.arch.fmax(m_new, m_old)
            m_safe = 0.0 if m_new == -Float32.inf else m_new
            row_sum = Float32(0.0)
            m_scaled = self.p_shift - m_safe if const_expr(self.tile_scales) else m_safe * self.scale_log2
            for c in cutlass.range_constexpr(n_cols):
                if const_expr(self.tile_scales):
                    p = cute.math.exp2(s[r, c] * tile_scale_log2 + m_scaled, fastmath=True)
                elif const_expr(self.exp2_ffma):
                    p = cute.math.exp2(s[r, c] * self.scale_log2 - m_scaled, fastmath=True)
                else:
                    p = cute.math.exp2((s[r, c] - m_safe) * self.scale_log2, fastmath=True)
                s[r, c] = p
                row_sum += p
            if const_expr(is_first):
                alpha[r] = 1.0
                self.row_sum[r] = row_sum
            else:
                if const_expr(self.tile_scales):
                    a = cute.math.exp2(m_old - m_safe, fastmath=True)
                else:
                    a = cute.math.exp2((m_old - m_safe) * self.scale_log2, fastmath=True)
                alpha[r] = a
                self.row_sum[r] = self.row_sum[r] * a + row_sum
            self.row_max[r] = m_new
        return alpha

    @cute.jit
    def rescale(self, o: cute.Tensor, alpha: cute.Tensor):
        """O[r, :] *= alpha[r] (rows view of the O accumulator)."""
        for r in cutlass.range_constexpr(self.num_rows):
            for c in cutlass.range_constexpr(cute.size(o, mode=[1])):
                o[r, c] = o[r, c] * alpha[r]

    @cute.jit
    def finalize(self) -> tuple:
        """(inv_l, lse): 1/l per row (0 for a row that saw no key, so O stays 0) and the natural-log
        LSE per row (-inf for such a row). Reduces l across the quad first."""
        inv_l = cute.make_rmem_tensor(self.num_rows, Float32)
        lse = cute.make_rmem_tensor(self.num_rows, Float32)
        for r in cutlass.range_constexpr(self.num_rows):
            l = quad_allreduce(self.row_sum[r], lambda a, b: a + b)
            empty = l == 0.0 or l != l
            inv_l[r] = 0.0 if empty else cute.arch.rcp_approx(l)
            if const_expr(self.tile_scales):  # m already in log2 units
                lse[r] = -Float32.inf if empty else (self.row_max[r] + cute.math.log2(l, fastmath=True) - self.p_shift) * LN_2
            else:
                lse[r] = log_sum_exp(self.row_max[r], self.scale_log2, l, empty)
        return inv_l, lse

    @cute.jit
    def resume(self, row_max: cute.Tensor, row_sum: cute.Tensor):
        """Continue from a saved state: m = row_max, and `row_sum` the saved whole row sums l (already
        reduced over the quad); this step's partial sums start at 0 (see `resumed_sum`)."""
        self.saved_sum = row_sum
        for r in cutlass.range_constexpr(self.num_rows):
            self.row_max[r] = row_max[r]
            self.row_sum[r] = 0.0

    @cute.jit
    def resumed_sum(self, alpha: cute.Tensor) -> cute.Tensor:
        """After `resume` and one `update`: the whole row sums alpha * l_saved + rowsum(P) per row."""
        l = cute.make_rmem_tensor(self.num_rows, Float32)
        for r in cutlass.range_constexpr(self.num_rows):
            l[r] = alpha[r] * self.saved_sum[r] + quad_allreduce(self.row_sum[r], lambda a, b: a + b)
        return l

