"""What happens to a score tile S between FA3's two GEMMs, on a WGMMA accumulator fragment.

* ``mask_scores``: bottom-right causal mask and the sequence-end mask (keys >= seqlen_k), written
  as -inf so that padded keys (zero-filled by TMA, score 0) get no weight.
* ``OnlineSoftmax``: the online softmax of FlashAttention-2/3 (Dao 2023, Algorithm 1; Shah et al.
  2024, Algorithm 1 lines 8-12) in base 2 (exp2 with log2(e) folded into the scale), with
  deferred normalisation: O is rescaled by exp2(m_old - m_new) per tile and divided by the row
  sum l only once, in ``finalize``, which also returns LSE = m * scale + ln(l) (natural log).

Each accumulator row lives in the 4 threads of a quad; maxima are reduced across the quad at
every tile, sums only once at the end (the per-tile rescale factor is uniform over the quad).

Learned from (not copied): flash_attn/cute/softmax.py and mask.py in Dao-AILab/flash-attention.
"""

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from fa_variants.common.sm90 import acc_rows_cols

LN2 = math.log(2.0)
QUAD = 4  # threads sharing one accumulator row


@cute.jit
def mask_scores(
    acc_S: cute.Tensor,
    tScS: cute.Tensor,
    t0ScS: cute.Tensor,
    row0: Int32,
    col0: Int32,
    seqlen_q: Int32,
    seqlen_k: Int32,
    causal: cutlass.Constexpr[bool],
    seqlen_end: cutlass.Constexpr[bool],
):
    """Set to -inf the entries of S (a WGMMA accumulator) that a query may not see.

    ``tScS``/``t0ScS``: this thread's / thread 0's (row, col) coordinates of the accumulator inside
    the tile; the tile starts at query ``row0`` and key ``col0``. Query i sees key j iff
    j < seqlen_k and (not causal or j <= i + seqlen_k - seqlen_q) (bottom-right alignment).
    Thread 0's column coordinates are compile-time constants, so each entry costs one compare
    against a per-row limit shifted by this thread's column offset.
    """
    acc = acc_rows_cols(acc_S)
    coords = acc_rows_cols(tScS)
    coords0 = acc_rows_cols(t0ScS)
    thr_col = coords[0, 0][1]
    end_limit = seqlen_k - col0 - thr_col
    for r in cutlass.range_constexpr(cute.size(acc, mode=[0])):
        limit = end_limit
        if const_expr(causal):
            row = row0 + coords[r, 0][0]
            causal_limit = row + 1 + seqlen_k - seqlen_q - col0 - thr_col
            limit = cutlass.min(causal_limit, end_limit) if const_expr(seqlen_end) else causal_limit
        for c in cutlass.range_constexpr(cute.size(acc, mode=[1])):
            acc[r, c] = -Float32.inf if coords0[0, c][1] >= limit else acc[r, c]


# The helpers below are plain Python: they unroll while the kernel is traced.


def _quad_reduce_max(x: Float32) -> Float32:
    for i in range(int(math.log2(QUAD))):
        x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1 << i))
    return x


def _quad_reduce_sum(x: Float32) -> Float32:
    for i in range(int(math.log2(QUAD))):
        x = x + cute.arch.shuffle_sync_bfly(x, offset=1 << i)
    return x


def _row_max(row: cute.Tensor) -> Float32:
    """Max over a thread's part of a row, as 4 independent chains (instruction-level parallelism)."""
    n = cute.size(row)
    lanes = [row[i] for i in range(min(4, n))]
    for i in range(len(lanes), n):
        lanes[i % 4] = cute.arch.fmax(lanes[i % 4], row[i])
    while len(lanes) > 1:
        lanes = [cute.arch.fmax(lanes[j], lanes[j + 1]) if j + 1 < len(lanes) else lanes[j] for j in range(0, len(lanes), 2)]
    return lanes[0]


def _row_sum(row: cute.Tensor) -> Float32:
    n = cute.size(row)
    lanes = [row[i] for i in range(min(4, n))]
    for i in range(len(lanes), n):
        lanes[i % 4] = lanes[i % 4] + row[i]
    while len(lanes) > 1:
        lanes = [lanes[j] + lanes[j + 1] if j + 1 < len(lanes) else lanes[j] for j in range(0, len(lanes), 2)]
    return lanes[0]


class OnlineSoftmax:
    """Running row max m and row sum l of one thread's rows of the Q tile.

    ``scale_log2`` = softmax_scale * log2(e): P = exp2(S * scale_log2 - m * scale_log2), which
    the compiler emits as one FFMA and one MUFU.EX2 per score. Requires softmax_scale > 0 (the
    host flips the sign of Q for negative scales), so that max(S) * scale = max(S * scale).
    """

    def __init__(self, scale_log2: Float32, num_rows: int):
        self.scale_log2 = scale_log2
        self.row_max = cute.make_rmem_tensor(num_rows, Float32)
        self.row_sum = cute.make_rmem_tensor(num_rows, Float32)
        self.row_max.fill(-Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def step(self, acc_S: cute.Tensor, row_scale: cute.Tensor, is_first: cutlass.Constexpr[bool] = False):
        """Turn the scores S (in place) into P = exp2(S*scale - m_new*scale), update m and l, and
        write into ``row_scale`` the factor exp2((m_old - m_new)*scale) by which O must be rescaled.

        A row with no visible key so far keeps m = -inf; its exponent base is taken as 0 so that
        exp2(-inf) = 0 gives P = 0 and a factor of 0 (never inf - inf = NaN).
        """
        acc = acc_rows_cols(acc_S)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            row = acc[r, None]
            m_old = self.row_max[r]
            m_new = _quad_reduce_max(_row_max(row))
            if const_expr(not is_first):
                m_new = cute.arch.fmax(m_new, m_old)
            self.row_max[r] = m_new
            m_safe = 0.0 if m_new == -Float32.inf else m_new
            base = m_safe * self.scale_log2
            p = cute.math.exp2(row.load() * self.scale_log2 - base, fastmath=True)
            row.store(p)
            if const_expr(is_first):
                row_scale[r] = 1.0
                self.row_sum[r] = _row_sum(row)
            else:
                scale = cute.math.exp2(m_old * self.scale_log2 - base, fastmath=True)
                row_scale[r] = scale
                self.row_sum[r] = self.row_sum[r] * scale + _row_sum(row)

    @cute.jit
    def finalize(self, row_scale: cute.Tensor, lse: cute.Tensor):
        """Deferred normalisation: ``row_scale`` = 1 / l (0 for rows that saw no key, whose O is
        0 anyway) and ``lse`` = ln(sum_j exp(S_ij * softmax_scale)) (-inf for those rows)."""
        for r in cutlass.range_constexpr(cute.size(self.row_sum)):
            total = _quad_reduce_sum(self.row_sum[r])
            empty = total == 0.0 or total != total
            row_scale[r] = 0.0 if empty else cute.arch.rcp_approx(total)
            lse[r] = -Float32.inf if empty else (self.row_max[r] * self.scale_log2 + cute.math.log2(total, fastmath=True)) * LN2


@cute.jit
def rescale_rows(acc: cute.Tensor, row_scale: cute.Tensor):
    """acc[r, :] *= row_scale[r] on a WGMMA accumulator (O rescale / normalisation)."""
    mn = acc_rows_cols(acc)
    for r in cutlass.range_constexpr(cute.size(row_scale)):
        mn[r, None].store(mn[r, None].load() * row_scale[r])
