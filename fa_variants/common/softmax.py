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
(``OnlineSoftmax(..., tile_scales=True, p_shift=...)``, c_n passed to ``update``). A row with |m| >= FFMA_LIMIT
subtracts the tile's raw max first and caps the exponent at p_shift (``_huge_tile_row``): there float32 m's
rounding would land in P's exponent (docs/edge_cases.md, "Huge logits").

One-FFMA exponent (``exp2_ffma``, the fa3 default): P = exp2(fma(S, c, -B)) with the basis B = round(m c),
one FFMA per score instead of a subtract and a multiply. P(max) is then 2^(m c - B), not exactly 1, but every
P, l and O of the row carries the same factor as long as alpha moves between bases exactly: alpha =
exp2(B_old - B_new) = exp2((m_old - m_new) c - err_old + err_new), err = m c - B taken exactly by one more
FFMA per row; O / l cancels the factor and LSE = (B + log2 l) ln 2 is what `log_sum_exp` computes. Where
|m c| >= FFMA_LIMIT (2^11) that row runs the exact form (S - m first, basis m c, err = 0) for that tile;
alpha's formula covers a row that switches. Why 2^11: below it the basis is rounded by at most 2^-14, so
P(max) = 2^(+-2^-14) rounds to exactly 1 in fp16/bf16 and O = 1 * V / l differs from V by less than the
output's half ulp: a row that sees one key returns that key's V exactly (EC-04), as the exact form does. A
limit of 2^20 broke that in fp16 at logits near -1e4 (H200). Real logits stay far below 2^11 / c.

Alpha first (``alpha_first``, with exp2_ffma): every row's alpha is computed right after the row maxima, before the
huge-logit branch and the exponentials, instead of after each row's exponentials. The values are the same; the caller
can then rescale O by alpha while the MUFU works through the exponentials (nvidia-cutlass-dsl 4.8.1: ptxas does not
move the last row's alpha above that row's exponentials, so half of O's rescale otherwise runs after the last of them).
flash-attn-4 computes each row's alpha from the row maxima alone, and ptxas issues both rows' first
(Dao-AILab/flash-attention:flash_attn/cute/softmax.py::Softmax.online_softmax).

Row max and row sum reduce over ``chains`` independent accumulators and a small tree (`row_reduce`): a serial
chain of dependent FMNMX (FADD) over a thread's 32-64 columns is latency-bound while the MUFU waits for m.
Each chain of the row sum starts at its first P, not at 0 + P (the same bits, as exp2 never returns -0: one FADD
less per chain and row, for every kernel).

FA1 keeps O, l and m in HBM between steps: `resume(m, l)` starts a step from the saved state (l the whole
row sum), `update` runs as above, and `resumed_sum(alpha)` gives the new whole row sum alpha l + rowsum(P_j).

The row sums are kept per thread (each thread sums its own columns) and reduced across the quad only
in `finalize`, as FA2 does; the row max is quad-reduced every step because P depends on it.

Works on (rows, cols) register views of mma.sync and WGMMA accumulators (`common.layout.rows_cols`),
whose rows are shared by the 4 lanes of a quad.
Adapted from Dao-AILab/flash-attention:flash_attn/cute/softmax.py::Softmax (online_softmax, finalize).
"""
from __future__ import annotations

import copy
import math
import operator

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import arith as mlir_arith
from cutlass.cutlass_dsl import T, dsl_user_op

from fa_variants.common.layout import quad_allreduce
from fa_variants.common.scale import FFMA_LIMIT, LN_2

#: FFMA_LIMIT (common.scale): |m c| below which the one-FFMA exponent is used (see `OnlineSoftmax`): the basis m c
#: is then rounded by at most 2^-14 (half an ulp of 2^11), so the row max gets P = 2^(+-2^-14), which rounds to
#: exactly 1 in fp16 and bf16 (module docstring: a one-key row returns V exactly).


@dsl_user_op
def f32_bits(x: Float32, *, loc=None, ip=None) -> Int32:
    """The bits of a float32 as an Int32 (a bitcast, no instruction)."""
    return Int32(mlir_arith.bitcast(T.i32(), x.ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def not_below(x: Float32, limit: float, *, loc=None, ip=None) -> cutlass.Boolean:
    """x >= limit or x is NaN (an unordered-or-greater-equal compare: one FSETP.GEU), i.e. not (x < limit)."""
    y = Float32(limit).ir_value(loc=loc, ip=ip)
    return cutlass.Boolean(mlir_arith.cmpf(mlir_arith.CmpFPredicate.UGE, x.ir_value(loc=loc, ip=ip), y, loc=loc, ip=ip))


@dsl_user_op
def bits_f32(x: Int32, *, loc=None, ip=None) -> Float32:
    """The float32 with these bits (a bitcast, no instruction)."""
    return Float32(mlir_arith.bitcast(T.f32(), x.ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


def row_reduce(s: cute.Tensor, r: int, op, chains: int, init=None):
    """op-reduction of row r of a (rows, cols) register view over `chains` independent accumulators (column c
    goes to chain c % chains), then a pairwise tree over the chains: a dependency depth of about
    cols / chains + log2(chains) instead of cols. chains = 1 is the plain serial chain. Trace-time helper
    (plain Python over unrolled columns). Adapted from Dao-AILab/flash-attention:flash_attn/cute/utils.py::
    fmax_reduce (four chains on sm80/sm90)."""
    n_cols = cute.size(s, mode=[1])
    acc = [s[r, c] for c in range(min(chains, n_cols))]
    for c in range(len(acc), n_cols):
        acc[c % chains] = op(acc[c % chains], s[r, c])
    return tree_reduce(acc, op) if init is None else op(tree_reduce(acc, op), init)


def tree_reduce(vals: list, op):
    """Pairwise op-reduction of a list of values ((a op b) op (c op d), ...; an odd one out carried up; trace
    time)."""
    while len(vals) > 1:
        vals = [op(vals[i], vals[i + 1]) if i + 1 < len(vals) else vals[i] for i in range(0, len(vals), 2)]
    return vals[0]


def _chain_add(sums: list, j: int, p):
    """Adds column j's P to its chain of the row sum, sums[j % len(sums)]; a chain starts at its first P, not at
    0 + P (the same bits, as exp2 never returns -0: one FADD less per chain). Trace time."""
    k = j % len(sums)
    sums[k] = p if sums[k] is None else sums[k] + p


def _chain_sum(sums: list):
    """The row sum of the chains `_chain_add` filled (a pairwise tree; trace time)."""
    return tree_reduce([x for x in sums if x is not None], operator.add)


@cute.jit
def _m_safe(m: Float32) -> Float32:
    """m_safe of a row: 0 while the row has seen no key (m = -inf), else m (``OnlineSoftmax._row_max`` returns it)."""
    return 0.0 if m == -Float32.inf else m


@cute.jit
def _is_huge(m: Float32) -> cutlass.Boolean:
    """|m| >= FFMA_LIMIT or NaN, m a row max in log2 units: the rows that take the exact form (exp2_ffma's, and
    ``OnlineSoftmax._huge_tile_row``'s with block-scaled scores)."""
    return not_below(cute.math.absf(m), FFMA_LIMIT)


@cute.jit
def log_sum_exp(m: Float32, scale_log2: Float32, l: Float32, empty) -> Float32:
    """Natural-log LSE of a row from its max m of raw scores and whole row sum l: (m c + log2 l) ln 2;
    -inf when `empty` (the row saw no key)."""
    return -Float32.inf if empty else (m * scale_log2 + cute.math.log2(l, fastmath=True)) * LN_2


class OnlineSoftmax:
    """Running (m, l) for the `num_rows` query rows this thread holds. Build inside a kernel."""

    def __init__(self, num_rows: int, scale_log2: Float32, exp2_ffma: bool = False, chains: int = 1,
                 skip_unit_rescale: bool = False, tile_scales: bool = False, p_shift: float = 0.0,
                 active_rows: int | None = None, alpha_first: bool = False, huge_per_row: bool = False,
                 score_bound: float = math.inf):
        self.num_rows = num_rows
        # the leading rows `update`, `rescale` and `finalize` work on (None: all): a kernel whose other rows are
        # padding never read back (fa3's packed decode with <= 8 query rows: ``Sm90Config.first_row_only``) skips
        # their exponentials; the rows past it keep S (masked) as P, their O unscaled, inv_l 0 and LSE -inf
        self.active_rows = num_rows if active_rows is None else active_rows
        if not 1 <= self.active_rows <= num_rows or (self.active_rows < num_rows and tile_scales):
            raise ValueError(f"active_rows={active_rows} must be in [1, num_rows={num_rows}] (and num_rows with "
                             "tile_scales)")
        self.scale_log2 = scale_log2
        # False (default): exp2((s - m) c), a subtract and a multiply per score, exact at the row max.
        # True: one FFMA per score, exp2(fma(s, c, -B)) against the basis B = round(m c) (module docstring,
        # "One-FFMA exponent"), with the exact form kept for a row whose |m c| >= FFMA_LIMIT.
        self.exp2_ffma = exp2_ffma
        # Block-scaled scores (fa3-fp8): `update` takes each tile's own c_n and m is kept in log2 units,
        # m = max_n c_n rowmax(S_n); P = exp2(S c_n - m + p_shift) (one FFMA), LSE = (m + log2 l - p_shift) ln 2.
        self.tile_scales = tile_scales
        self.p_shift = p_shift
        self.huge_per_row = huge_per_row  # tile_scales: the huge-logit branch per row, not per tile (`update`)
        # tile_scales: the largest |S| a tile can hold (head_dim x 448^2 for e4m3 operands, with a margin for the
        # MMA's rounding), the guard of the huge-logit check (`_update_tile_scaled`); inf: always checked
        self.score_bound = score_bound
        # tile_scales: False in the twin ``without_huge_check`` returns (a K/V loop whose caller proved no |m| reaches
        # FFMA_LIMIT): `_update_tile_scaled` runs the plain code with no check and no guard
        self.check_huge = True
        self.chains = chains  # independent accumulators of the row max and row sum (`row_reduce`)
        self.skip_unit_rescale = skip_unit_rescale  # `rescale` skips O when every alpha of the thread is 1
        self.row_max = cute.make_rmem_tensor(num_rows, Float32)
        self.row_sum = cute.make_rmem_tensor(num_rows, Float32)
        # m c - B per row (the exact rounding error of the basis; 0 where the exact form ran)
        self.row_err = cute.make_rmem_tensor(num_rows, Float32) if exp2_ffma else None
        # (exp2_ffma without tile_scales) every row's alpha before any exponential of the tile, so that
        # O's rescale by it can run under the exponentials ("Alpha first" in the module docstring); same values
        self.alpha_first = alpha_first and exp2_ffma and not tile_scales

    def without_huge_check(self) -> "OnlineSoftmax":
        """A twin of this softmax (the same m and l registers) whose `update` skips the huge-logit check of block-scaled
        scores: for a K/V loop over tiles none of which can give |m| >= FFMA_LIMIT (``Fp8Config.huge_hoisted``: the
        caller checked every tile's c_n ``hopper.fa3_fp8.max_score`` before the loop). Same values as the checked code there."""
        twin = copy.copy(self)
        twin.check_huge = False
        return twin

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
        c = self.scale_log2
        if const_expr(self.tile_scales):
            self._update_tile_scaled(s, is_first, tile_scale_log2, alpha)
        elif const_expr(not self.exp2_ffma):  # row by row: exp2((s - m) c)
            for r in cutlass.range_constexpr(self.active_rows):
                m_new, m_safe = self._row_max(s, r, is_first)
                row_sum = self._exp_row(s, r, m_safe, c, 0.0)
                self._fold(r, alpha, row_sum, m_new, (self.row_max[r] - m_safe) * c, is_first)
        else:  # every row's max first (their chains overlap), then one rare branch for huge |m c|
            m_new = cute.make_rmem_tensor(self.num_rows, Float32)
            m_safe = cute.make_rmem_tensor(self.num_rows, Float32)
            basis = cute.make_rmem_tensor(self.num_rows, Float32)
            err = cute.make_rmem_tensor(self.num_rows, Float32)
            huge = cute.make_rmem_tensor(self.num_rows, cutlass.Boolean)
            any_huge = False
            for r in cutlass.range_constexpr(self.active_rows):
                m_new[r], m_safe[r] = self._row_max(s, r, is_first)
                b = m_safe[r] * c
                huge[r] = _is_huge(b)
                any_huge = any_huge or huge[r]
                basis[r] = 0.0 if huge[r] else b
                err[r] = 0.0 if huge[r] else cute.math.fma(m_safe[r], c, -b)  # m c - basis, exactly
            if const_expr(self.alpha_first and not is_first):  # every alpha now, before the exponentials
                for r in cutlass.range_constexpr(self.active_rows):
                    alpha[r] = cute.math.exp2(self._log2_alpha_ffma(r, m_safe[r], err[r]), fastmath=True)
            if any_huge:  # those rows subtract m first: the exact form
                for r in cutlass.range_constexpr(self.active_rows):
                    shift = m_safe[r] if huge[r] else 0.0
                    for j in cutlass.range_constexpr(cute.size(s, mode=[1])):
                        s[r, j] = s[r, j] - shift
            for r in cutlass.range_constexpr(self.active_rows):
                row_sum = self._exp_row(s, r, 0.0, c, basis[r])
                if const_expr(self.alpha_first):
                    self._fold_alpha(r, alpha, row_sum, m_new[r], is_first)
                else:
                    self._fold(r, alpha, row_sum, m_new[r], self._log2_alpha_ffma(r, m_safe[r], err[r]), is_first)
                self.row_err[r] = err[r]
        return alpha

    @cute.jit
    def _update_tile_scaled(self, s: cute.Tensor, is_first: cutlass.Constexpr[bool], tile_scale_log2: Float32,
                            alpha: cute.Tensor):
        """`update` for block-scaled scores (m in log2 units, see ``__init__``): row by row, the row max, P = exp2(S c_n
        - (m_safe - p_shift)) over every column (one FFMA, `_exp_row`), then alpha = exp2(m_old - m_safe), l and m
        (``_fold``). When a row's |m| may reach FFMA_LIMIT, ``_update_tile_checked`` instead (the exact form for
        such rows). Whether it may is known before the row maxima: |c_n rowmax(S_n)| <= c_n ``score_bound`` (the
        largest |S| e4m3 operands give) and |m_old| from the last tile, so on ordinary inputs the branch is taken
        early, the same way every tile, and the plain code runs as it did before the check existed."""
        c = tile_scale_log2
        if const_expr(not self.check_huge):  # the caller proved no |m| reaches FFMA_LIMIT in this loop
            self._update_tile_plain(s, is_first, c, alpha)
        elif const_expr(self.score_bound == math.inf):  # no guard: every tile checked
            self._update_tile_checked(s, is_first, c, alpha)
        else:
            may_be_huge = not_below(c * self.score_bound, FFMA_LIMIT)
            if const_expr(not is_first):
                for r in cutlass.range_constexpr(self.num_rows):
                    may_be_huge = may_be_huge or _is_huge(_m_safe(self.row_max[r]))
            if may_be_huge:
                self._update_tile_checked(s, is_first, c, alpha)
            else:
                self._update_tile_plain(s, is_first, c, alpha)

    @cute.jit
    def _update_tile_plain(self, s: cute.Tensor, is_first: cutlass.Constexpr[bool], c: Float32, alpha: cute.Tensor):
        """`_update_tile_scaled` where no row's |m| can reach FFMA_LIMIT: row by row, the row max, then P = exp2(S c -
        (m_safe - p_shift)) and the fold (``_exp_and_fold``); the code from before the huge-logit check existed."""
        for r in cutlass.range_constexpr(self.num_rows):
            m_new, m_safe = self._row_max(s, r, is_first, c)
            self._exp_and_fold(s, r, c, m_safe - self.p_shift, m_new, alpha, is_first)

    @cute.jit
    def _update_tile_checked(self, s: cute.Tensor, is_first: cutlass.Constexpr[bool], c: Float32, alpha: cute.Tensor):
        """`_update_tile_scaled` where a row's |m| may reach FFMA_LIMIT: rows with |m| >= FFMA_LIMIT take the exact
        form first (``_huge_tile_row``) in a branch, one for the tile after every row's max (default: the
        exponentials of all rows stay in one basic block), or one per row (``huge_per_row``: fewer values live at
        once, for kernels at their register limit). Run on every tile (the guard off), this cost 3-5 % of fa3-fp8's
        speed on the H200, 0.90-0.98x with a branch per row everywhere (session 27)."""
        raw = cute.make_rmem_tensor(self.num_rows, Float32)
        m_new = cute.make_rmem_tensor(self.num_rows, Float32)
        basis = cute.make_rmem_tensor(self.num_rows, Float32)
        any_huge = False
        for r in cutlass.range_constexpr(self.num_rows):
            raw[r] = self._raw_row_max(s, r)
            m_new[r] = self._running_max(r, raw[r] * c, is_first)
            m_safe = _m_safe(m_new[r])
            basis[r] = m_safe - self.p_shift
            if const_expr(self.huge_per_row):
                if _is_huge(m_safe):
                    basis[r] = self._huge_tile_row(s, r, c, raw[r], m_safe)
                self._exp_and_fold(s, r, c, basis[r], m_new[r], alpha, is_first)
            else:
                any_huge = any_huge or _is_huge(m_safe)
        if const_expr(not self.huge_per_row):
            if any_huge:
                for r in cutlass.range_constexpr(self.num_rows):
                    m_safe = _m_safe(m_new[r])
                    if _is_huge(m_safe):
                        basis[r] = self._huge_tile_row(s, r, c, raw[r], m_safe)
            for r in cutlass.range_constexpr(self.num_rows):
                self._exp_and_fold(s, r, c, basis[r], m_new[r], alpha, is_first)

    @cute.jit
    def _exp_and_fold(self, s: cute.Tensor, r: cutlass.Constexpr[int], c: Float32, basis: Float32, m_new: Float32,
                      alpha: cute.Tensor, is_first: cutlass.Constexpr[bool]):
        """Row r of `_update_tile_scaled` after its max: P = exp2(fma(S, c, -basis)), then ``_fold``."""
        row_sum = self._exp_row(s, r, 0.0, c, basis)
        self._fold(r, alpha, row_sum, m_new, self.row_max[r] - _m_safe(m_new), is_first)

    @cute.jit
    def _huge_tile_row(self, s: cute.Tensor, r: cutlass.Constexpr[int], c: Float32, raw: Float32,
                       m_safe: Float32) -> Float32:
        """The exact form of `_update_tile_scaled` for row r, |m| >= FFMA_LIMIT (EC-04 with block scales): subtracts
        the tile's raw row max from the row of S and returns the basis -d for P = exp2((S - raw) c_n + d).

        float32 m = round(c_n rowmax(S_n)) drops up to half an ulp of the exact product, which the one FFMA leaves in
        every exponent of the row: P at the row max is 2^(p_shift + e), |e| up to 128 at |m| ~ 2^31, so P and l
        overflow or vanish (O = 0, LSE -inf). Here the tile that sets m (m_tile = m, the first tile too) takes d =
        p_shift, so its max gets P = 2^p_shift exactly, and any other tile d = min(fma(raw, c_n, -m) + p_shift, p_shift),
        so no P passes 2^p_shift. Between tiles alpha = exp2(m_old - m) moves between the rounded maxima: each tile's
        weights are off by at most an ulp of m in log2 units, i.e. a float32 rounding of the logits (S itself is a
        float32 sum). A row masked whole in this tile keeps S = -inf (P 0)."""
        raw_safe = 0.0 if raw == -Float32.inf else raw
        for j in cutlass.range_constexpr(cute.size(s, mode=[1])):
            s[r, j] = s[r, j] - raw_safe
        d = cute.arch.fmin(cute.math.fma(raw_safe, c, -m_safe) + self.p_shift, Float32(self.p_shift))
        d = Float32(self.p_shift) if raw * c == m_safe else d
        return -d

    @cute.jit
    def _row_max(self, s: cute.Tensor, r: cutlass.Constexpr[int], is_first: cutlass.Constexpr[bool],
                 tile_scale_log2: Float32 = None):
        """(m_new, m_safe) of row r: max(m, rowmax(S_j)) over the quad (with ``tile_scale_log2`` c_n: max(m, c_n
        rowmax(S_n)), m in log2 units); m_safe = 0 for a row with no key yet (``_m_safe``)."""
        m_new = self._raw_row_max(s, r)
        if const_expr(tile_scale_log2 is not None):
            m_new = m_new * tile_scale_log2
        m_new = self._running_max(r, m_new, is_first)
        return m_new, _m_safe(m_new)

    def _raw_row_max(self, s: cute.Tensor, r: int) -> Float32:
        """rowmax(S[r, :]) over the quad (``chains`` chains, then the quad's lanes). Trace-time helper."""
        return quad_allreduce(row_reduce(s, r, cute.arch.fmax, self.chains), cute.arch.fmax)

    def _running_max(self, r: int, m_tile: Float32, is_first: bool) -> Float32:
        """max(m, m_tile) of row r (m_tile on the first tile). Trace-time helper."""
        return m_tile if is_first else cute.arch.fmax(m_tile, self.row_max[r])

    @cute.jit
    def _exp_row(self, s: cute.Tensor, r: cutlass.Constexpr[int], shift: Float32, c: Float32, basis: Float32):
        """S[r, :] -> P[r, :] = exp2((S - shift) c) (exact form) or exp2(fma(S, c, -basis)) (exp2_ffma, and
        tile_scales with c = c_n); returns this thread's part of the row sum (`chains` accumulators, ``_chain_add``:
        each chain adds its columns in column order)."""
        sums = [None] * self.chains
        for j in cutlass.range_constexpr(cute.size(s, mode=[1])):
            if const_expr(self.exp2_ffma or self.tile_scales):
                p = cute.math.exp2(cute.math.fma(s[r, j], c, -basis), fastmath=True)
            else:
                p = cute.math.exp2((s[r, j] - shift) * c, fastmath=True)
            s[r, j] = p
            _chain_add(sums, j, p)
        return _chain_sum(sums)

    @cute.jit
    def _fold(self, r: cutlass.Constexpr[int], alpha: cute.Tensor, row_sum: Float32, m_new: Float32, log2_alpha: Float32,
              is_first: cutlass.Constexpr[bool]):
        """alpha[r] = exp2(log2_alpha) (1 on the first tile), l = alpha l + row_sum, m = m_new."""
        if const_expr(is_first):
            alpha[r] = 1.0
            self.row_sum[r] = row_sum
        else:
            a = cute.math.exp2(log2_alpha, fastmath=True)
            alpha[r] = a
            self.row_sum[r] = self.row_sum[r] * a + row_sum
        self.row_max[r] = m_new

    def _log2_alpha_ffma(self, r: int, m_safe: Float32, err: Float32) -> Float32:
        """log2 alpha of row r under exp2_ffma, old basis over new: (m_old - m_new) c - err_old + err_new (row_max and
        row_err still the previous tile's). Trace-time helper."""
        return cute.math.fma(self.row_max[r] - m_safe, self.scale_log2, err - self.row_err[r])

    @cute.jit
    def _fold_alpha(self, r: cutlass.Constexpr[int], alpha: cute.Tensor, row_sum: Float32, m_new: Float32,
                    is_first: cutlass.Constexpr[bool]):
        """`_fold` with alpha[r] already computed (``alpha_first``): l = alpha l + row_sum (l = row_sum and alpha 1
        on the first tile), m = m_new."""
        if const_expr(is_first):
            alpha[r] = 1.0
            self.row_sum[r] = row_sum
        else:
            self.row_sum[r] = self.row_sum[r] * alpha[r] + row_sum
        self.row_max[r] = m_new

    @cute.jit
    def rescale(self, o: cute.Tensor, alpha: cute.Tensor, skip_ones: cutlass.Constexpr[bool] = False):
        """O[r, :] *= alpha[r] (rows view of the O accumulator). With ``skip_ones`` and the softmax's
        ``skip_unit_rescale``, nothing is done when every alpha of this thread is exactly 1 (no row max moved:
        exp2(0) = 1 exactly, so the skip changes no result)."""
        if const_expr(skip_ones and self.skip_unit_rescale):
            moved = alpha[0] != 1.0
            for r in cutlass.range_constexpr(1, self.active_rows):
                moved = moved or alpha[r] != 1.0
            if moved:
                self._scale_rows(o, alpha)
        else:
            self._scale_rows(o, alpha)

    @cute.jit
    def _scale_rows(self, o: cute.Tensor, alpha: cute.Tensor):
        for r in cutlass.range_constexpr(self.active_rows):
            for c in cutlass.range_constexpr(cute.size(o, mode=[1])):
                o[r, c] = o[r, c] * alpha[r]

    @cute.jit
    def finalize(self) -> tuple:
        """(inv_l, lse): 1/l per row (0 for a row that saw no key, so O stays 0) and the natural-log
        LSE per row (-inf for such a row). Reduces l across the quad first."""
        inv_l = cute.make_rmem_tensor(self.num_rows, Float32)
        lse = cute.make_rmem_tensor(self.num_rows, Float32)
        for r in cutlass.range_constexpr(self.active_rows, self.num_rows):  # padding rows (active_rows)
            inv_l[r] = 0.0
            lse[r] = -Float32.inf
        for r in cutlass.range_constexpr(self.active_rows):
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

