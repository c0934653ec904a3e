"""Standard attention, FlashAttention-1 and FlashAttention-2 as tile loops in plain torch, with HBM accounting.

These are the *algorithms*, not kernels: each function walks the Q and K/V tiles in the loop order of its
paper and moves every tile through a small :class:`HBM` object that counts the elements read from and
written to off-chip memory. They run anywhere torch runs (CPU included), in any floating dtype; in float64
they agree with a float64 reference to ~1e-15.

Sources:
  * Standard attention: Dao et al. 2022, "FlashAttention", Algorithm 0 (S and P materialised in HBM).
  * FA1: Dao et al. 2022, Algorithm 1 (K/V outer loop j, Q inner loop i; O, l, m live in HBM and are read
    and rewritten at every (i, j) step; the output is renormalised at every step), section 3.2 Theorem 2
    (IO complexity Theta(N^2 d^2 / M)).
  * FA2: Dao 2023, "FlashAttention-2", Algorithm 1 (Q outer loop i; O, l, m kept on chip; normalisation
    deferred to the end; LSE written once) and section 3.1.1 (causal: K/V tiles wholly above the diagonal
    are skipped).

Conventions (the project's, see docs/design.md): q (batch, seqlen_q, num_heads, head_dim); k, v (batch, seqlen_k,
num_heads_kv, head_dim); out like q; lse (batch, num_heads, seqlen_q), natural log. Causal masking is
bottom-right aligned: query row r sees key c iff c <= r + seqlen_k - seqlen_q; a row that sees no key gives
O = 0 and LSE = -inf. GQA: query head h reads K/V head h // (num_heads // num_heads_kv).

Counting model (what :func:`hbm_counts` and :func:`hbm_bytes` predict, and the tests prove equal to what the
emulators count): the grid of a kernel has one program per (batch, query head) (FA1) or per (batch, query
head, Q tile) (FA2); every program loads the tiles it needs, so under GQA each query head reads its K/V head
again (no cache reuse is modelled). Tail tiles load only their in-bounds rows. Under causal masking a tile
pair (i, j) that no (row, key) pair of it can see is skipped entirely (no loads, no stores), and a Q tile of
FA2 that sees no key at all writes O = 0 and LSE = -inf without loading Q.

`fa-variants io` (``configure_parser`` / ``run_cli``) prints the IO-complexity comparison of the
FlashAttention paper (section 3.2), computed from these counts.
"""
from __future__ import annotations

import argparse
import math
from collections import Counter
from typing import NamedTuple

import torch

from fa_variants.common.checks import is_int, one_line

__all__ = [
    "HBM",
    "Emulation",
    "HBMBytes",
    "ALGORITHMS",
    "standard_attention",
    "flash_attention_1",
    "flash_attention_2",
    "emulate",
    "causal_kv_tiles",
    "fa1_tile_sizes",
    "hbm_counts",
    "hbm_bytes",
    "configure_parser",
    "run_cli",
]


class HBM:
    """Off-chip memory that counts every element moved.

    ``read(name, view)`` returns an on-chip copy of ``view`` and adds ``view.numel()`` to ``reads[name]``;
    ``write(name, dst, value)`` copies ``value`` into the view ``dst`` and adds ``dst.numel()`` to
    ``writes[name]``. Names are the paper's: "Q", "K", "V", "O", "l", "m", "S", "P", "LSE".
    Counts are in elements (not bytes), summed over batch and heads.
    """

    def __init__(self) -> None:
        self.reads: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()

    def read(self, name: str, view: torch.Tensor) -> torch.Tensor:
        self.reads[name] += view.numel()
        return view.clone()

    def write(self, name: str, dst: torch.Tensor, value: torch.Tensor) -> None:
        dst.copy_(value)
        self.writes[name] += dst.numel()

    @property
    def total_reads(self) -> int:
        return sum(self.reads.values())

    @property
    def total_writes(self) -> int:
        return sum(self.writes.values())

    @property
    def total(self) -> int:
        return self.total_reads + self.total_writes

    def counts(self) -> dict[str, tuple[int, int]]:
        """{tensor name: (elements read, elements written)} for every tensor touched."""
        names = sorted(set(self.reads) | set(self.writes))
        return {n: (self.reads[n], self.writes[n]) for n in names if self.reads[n] or self.writes[n]}


class Emulation(NamedTuple):
    """out (B, Nq, H, D) and lse (B, H, Nq) in the compute dtype, and the HBM that counted the traffic."""

    out: torch.Tensor
    lse: torch.Tensor
    hbm: HBM


# ----------------------------------------------------------------------------------------------- helpers


def _prepare(q, k, v, softmax_scale, causal):
    """Validate the arguments as ``fa_variants.attention`` does (one line naming the argument: before, an int q ran
    in float32, a str scale was parsed, a truthy non-bool causal was taken, a meta k failed inside torch); return
    (q, k, v) as (B, H*, N, D) views in the compute dtype, the index of the K/V head each query head reads (GQA:
    h // group) and the scale."""
    from fa_variants import api  # not at import: `fa-variants io` without the API's set-up

    api._check_inputs(q, k, v, hint="")  # its rules and messages, without the layout hint of attention's
    # causal and softmax_scale by attention's rules (the emulators take no backend / return_lse: valid stand-ins)
    softmax_scale = api._check_options(causal, softmax_scale, backend="reference", return_lse=False)
    B, _, H, D = q.shape
    Hkv = k.shape[2]
    if Hkv == 0:  # attention lets num_heads = num_heads_kv = 0 through (an empty call); the loops need a KV head
        raise ValueError(f"num_heads_kv is 0 (k has shape {tuple(k.shape)}); need at least one KV head")
    dtype = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else softmax_scale
    to = lambda t: t.to(dtype).transpose(1, 2).contiguous()  # noqa: E731  (B, heads, N, D)
    return to(q), to(k), to(v), torch.arange(H) // (H // Hkv), scale


def _mask(s: torch.Tensor, r0: int, c0: int, Nq: int, Nk: int) -> torch.Tensor:
    """Bottom-right causal mask on an S tile whose first row is query r0 and first column key c0."""
    rows = torch.arange(r0, r0 + s.shape[-2]).unsqueeze(-1)
    cols = torch.arange(c0, c0 + s.shape[-1])
    return s.masked_fill(cols > rows + (Nk - Nq), float("-inf"))


def _exp_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """exp(a - b), with exp(-inf - (-inf)) = 0 (a row that has seen no key yet contributes nothing)."""
    return torch.where(b == float("-inf"), torch.zeros_like(a), torch.exp(a - b))


def causal_kv_tiles(row_end: int, Nq: int, Nk: int, Bc: int) -> int:
    """Number of leading K/V tiles a Q tile ending (exclusive) at query row ``row_end`` must visit, causal.

    Its last row r = row_end - 1 sees keys 0 .. r + Nk - Nq (bottom-right), i.e. clamp(row_end + Nk - Nq, 0, Nk)
    keys, which span ceil(that / Bc) tiles; tiles beyond are wholly masked and skipped (FA2 section 3.1.1).
    """
    visible = min(max(row_end + Nk - Nq, 0), Nk)
    return -(-visible // Bc)


def _tile_counts(Nq: int, Nk: int, Br: int, Bc: int) -> tuple[int, int]:
    """(Tr, Tc) = (ceil(Nq / Br), ceil(Nk / Bc)): the Q tiles and K/V tiles. Raises TypeError for a size that is
    not an int, ValueError for a tile size < 1 or a seqlen < 0."""
    for name, value in (("Nq", Nq), ("Nk", Nk), ("Br", Br), ("Bc", Bc)):
        if not is_int(value):
            raise TypeError(f"{name} must be an int, got {one_line(value)}")
    if Nq < 0 or Nk < 0:
        raise ValueError(f"seqlens must be >= 0, got Nq={Nq}, Nk={Nk}")
    if Br < 1 or Bc < 1:
        raise ValueError(f"tile sizes must be >= 1, got Br={Br}, Bc={Bc}")
    return -(-Nq // Br), -(-Nk // Bc)


# ------------------------------------------------------------------------------------------ algorithms


def standard_attention(q, k, v, *, causal: bool = False, softmax_scale: float | None = None) -> Emulation:
    """Standard attention (FlashAttention paper, Algorithm 0): S and P are written to and read back from HBM.

    1. read Q, K; S = softmax_scale * Q K^T; write S.   2. read S; P = softmax(mask(S)); write P (and LSE).
    3. read P, V; O = P V; write O.  Each matrix is read once per use (an ideal GEMM), giving
    reads = (Nq + 2 Nk) d + 2 Nq Nk and writes = 2 Nq Nk + Nq d + Nq per (batch, head): Theta(N d + N^2).
    Shapes as in the module docstring; returns :class:`Emulation`.
    """
    q, k, v, kvh, scale = _prepare(q, k, v, softmax_scale, causal)
    (B, H, Nq, D), Nk = q.shape, k.shape[2]
    hbm = HBM()
    S = q.new_empty(B, H, Nq, Nk)
    P = q.new_empty(B, H, Nq, Nk)
    O = q.new_empty(B, H, Nq, D)
    LSE = q.new_empty(B, H, Nq)

    hbm.write("S", S, scale * hbm.read("Q", q) @ hbm.read("K", k[:, kvh]).transpose(-1, -2))
    s = hbm.read("S", S)
    if causal:
        s = _mask(s, 0, 0, Nq, Nk)
    lse = torch.logsumexp(s, dim=-1)  # -inf for a row that sees no key (and for Nk == 0)
    hbm.write("P", P, _exp_diff(s, lse.unsqueeze(-1)))
    hbm.write("LSE", LSE, lse)
    hbm.write("O", O, hbm.read("P", P) @ hbm.read("V", v[:, kvh]))
    return Emulation(O.transpose(1, 2), LSE, hbm)


def flash_attention_1(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                      Br: int = 64, Bc: int = 64) -> Emulation:
    """FlashAttention (Dao et al. 2022), Algorithm 1, one program per (batch, query head).

    Line 2: O = 0, l = 0, m = -inf are initialised *in HBM* (stores counted). Line 5: for each K/V tile j,
    read K_j, V_j. Line 7: for each Q tile i, read Q_i, O_i, l_i, m_i (lines 8); compute S_ij, the tile's
    row max and sum (9-10), the new m and l (11); write the renormalised O_i (12) and l_i, m_i (13).
    After the loops LSE = m + log l is written from l, m (one more read of each). Causal: pairs (i, j)
    wholly above the diagonal are skipped; diagonal tiles are masked.
    Shapes as in the module docstring; Br x Bc is the S tile; returns :class:`Emulation`.
    """
    q, k, v, kvh, scale = _prepare(q, k, v, softmax_scale, causal)
    (B, H, Nq, D), Nk = q.shape, k.shape[2]
    Tr, Tc = _tile_counts(Nq, Nk, Br, Bc)
    hbm = HBM()
    O, l, m = q.new_empty(B, H, Nq, D), q.new_empty(B, H, Nq), q.new_empty(B, H, Nq)
    LSE = q.new_empty(B, H, Nq)
    hbm.write("O", O, torch.zeros_like(O))  # line 2
    hbm.write("l", l, torch.zeros_like(l))
    hbm.write("m", m, torch.full_like(m, float("-inf")))

    n_kv = [causal_kv_tiles(min((i + 1) * Br, Nq), Nq, Nk, Bc) if causal else Tc for i in range(Tr)]
    for j in range(Tc):  # line 5: K/V outer loop
        rows_i = [i for i in range(Tr) if j < n_kv[i]]
        if not rows_i:
            continue
        c = slice(j * Bc, min((j + 1) * Bc, Nk))
        Kj, Vj = hbm.read("K", k[:, kvh, c]), hbm.read("V", v[:, kvh, c])  # line 6
        for i in rows_i:  # line 7: Q inner loop
            r = slice(i * Br, min((i + 1) * Br, Nq))
            Qi, Oi = hbm.read("Q", q[:, :, r]), hbm.read("O", O[:, :, r])  # line 8
            li, mi = hbm.read("l", l[:, :, r]), hbm.read("m", m[:, :, r])
            S = scale * Qi @ Kj.transpose(-1, -2)  # line 9
            if causal:
                S = _mask(S, r.start, c.start, Nq, Nk)
            m_t = S.amax(dim=-1)  # line 10
            P_t = _exp_diff(S, m_t.unsqueeze(-1))
            l_t = P_t.sum(dim=-1)
            m_new = torch.maximum(mi, m_t)  # line 11
            a, b = _exp_diff(mi, m_new), _exp_diff(m_t, m_new)
            l_new = a * li + b * l_t
            acc = (li * a).unsqueeze(-1) * Oi + b.unsqueeze(-1) * (P_t @ Vj)
            inv = torch.where(l_new > 0, 1.0 / l_new, torch.zeros_like(l_new))
            hbm.write("O", O[:, :, r], inv.unsqueeze(-1) * acc)  # line 12
            hbm.write("l", l[:, :, r], l_new)  # line 13
            hbm.write("m", m[:, :, r], m_new)
    if Tr:  # LSE = m + log l (-inf where no key was seen: m = -inf, l = 0)
        hbm.write("LSE", LSE, hbm.read("m", m) + torch.log(hbm.read("l", l)))
    return Emulation(O.transpose(1, 2), LSE, hbm)


def flash_attention_2(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                      Br: int = 128, Bc: int = 64) -> Emulation:
    """FlashAttention-2 (Dao 2023), Algorithm 1, one program per (batch, query head, Q tile).

    Line 3: for each Q tile i, read Q_i (once); O, l, m start on chip (0, 0, -inf). Line 6: for each K/V tile
    j it needs, read K_j, V_j; S = Q_i K_j^T; m_new = max(m, rowmax S); P = exp(S - m_new);
    l = e^(m - m_new) l + rowsum P; O = e^(m - m_new) O + P V_j, with no division (lines 8-10). After the
    loop: O_i / l and LSE_i = m + log l are written once (lines 12-15). Causal (section 3.1.1): only the
    first causal_kv_tiles(...) K/V tiles are visited; a Q tile that sees no key writes O = 0, LSE = -inf
    without reading Q. Shapes as in the module docstring; returns :class:`Emulation`.
    """
    q, k, v, kvh, scale = _prepare(q, k, v, softmax_scale, causal)
    (B, H, Nq, D), Nk = q.shape, k.shape[2]
    Tr, Tc = _tile_counts(Nq, Nk, Br, Bc)
    hbm = HBM()
    O, LSE = q.new_empty(B, H, Nq, D), q.new_empty(B, H, Nq)

    for i in range(Tr):  # line 3: Q outer loop (parallel over i in the kernel)
        r = slice(i * Br, min((i + 1) * Br, Nq))
        n_kv = causal_kv_tiles(r.stop, Nq, Nk, Bc) if causal else Tc
        Oi = q.new_zeros(B, H, r.stop - r.start, D)  # line 5: on-chip state
        li = q.new_zeros(B, H, r.stop - r.start)
        mi = q.new_full((B, H, r.stop - r.start), float("-inf"))
        Qi = hbm.read("Q", q[:, :, r]) if n_kv else None  # line 4
        for j in range(n_kv):  # line 6: K/V inner loop
            c = slice(j * Bc, min((j + 1) * Bc, Nk))
            Kj, Vj = hbm.read("K", k[:, kvh, c]), hbm.read("V", v[:, kvh, c])  # line 7
            S = scale * Qi @ Kj.transpose(-1, -2)  # line 8
            if causal:
                S = _mask(S, r.start, c.start, Nq, Nk)
            m_new = torch.maximum(mi, S.amax(dim=-1))  # line 9
            P = _exp_diff(S, m_new.unsqueeze(-1))
            alpha = _exp_diff(mi, m_new)
            li = alpha * li + P.sum(dim=-1)
            Oi = alpha.unsqueeze(-1) * Oi + P @ Vj  # line 10: no normalisation here
            mi = m_new
        inv = torch.where(li > 0, 1.0 / li, torch.zeros_like(li))
        hbm.write("O", O[:, :, r], inv.unsqueeze(-1) * Oi)  # lines 12, 14
        hbm.write("LSE", LSE[:, :, r], mi + torch.log(li))  # lines 13, 15
    return Emulation(O.transpose(1, 2), LSE, hbm)


ALGORITHMS = {"standard": standard_attention, "fa1": flash_attention_1, "fa2": flash_attention_2}


def emulate(algorithm: str, q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
            Br: int = 64, Bc: int = 64) -> Emulation:
    """Run one of ALGORITHMS ("standard", "fa1", "fa2") by name; Br, Bc are ignored by "standard"."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {one_line(algorithm)}")
    kw = {} if algorithm == "standard" else {"Br": Br, "Bc": Bc}
    return ALGORITHMS[algorithm](q, k, v, causal=causal, softmax_scale=softmax_scale, **kw)


# ---------------------------------------------------------------------------------------- closed forms


def fa1_tile_sizes(M: int, d: int) -> tuple[int, int]:
    """FA1 Algorithm 1, line 1: Bc = ceil(M / (4 d)), Br = min(ceil(M / (4 d)), d); M = SRAM size in elements.

    Returns (Br, Bc). Raises ValueError for M < 1 or d < 1.
    """
    if M < 1 or d < 1:
        raise ValueError(f"M and d must be >= 1, got M={M}, d={d}")
    Bc = -(-M // (4 * d))
    return min(Bc, d), Bc


def _floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum over i = 0 .. n-1 of floor((a i + b) / m), for n >= 0, m >= 1, a >= 0, b >= 0, in O(log) steps (the
    Euclid-like reduction of floor sums: take out the whole parts of a / m and b / m, then swap the roles of the
    axes under the line y = (a x + b) / m)."""
    total = 0
    while n > 0:
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            break
        n, b = divmod(y_max, m)
        m, a = a, m
    return total


def tile_sums(Nq: int, Nk: int, Br: int, Bc: int, causal: bool) -> tuple[int, int, int]:
    """Over the Q tiles i (rows_i rows ending at row end_i; n_i K/V tiles visited: Tc, or
    :func:`causal_kv_tiles` when causal): (sum rows_i n_i, sum min(n_i Bc, Nk), sum of rows_i with n_i > 0), in
    closed form (O(log) in the sizes; a loop over the tiles took minutes at N = 1e11). Full tiles whose last row sees
    a key have n_i = ceil(((i + 1) Br + Nk - Nq) / Bc), a floor sum; the last, partial tile is added alone."""
    Tr, Tc = _tile_counts(Nq, Nk, Br, Bc)
    if Tc == 0 or Tr == 0:
        return 0, 0, 0
    if not causal:
        return Nq * Tc, Tr * Nk, Nq
    shift, full = Nk - Nq, Nq // Br
    hidden = min(max(-shift // Br, 0), full)  # full tiles whose last row sees no key: (i + 1) Br + shift <= 0
    seen = full - hidden
    tiles = _floor_sum(seen, Bc, Br, (hidden + 1) * Br + shift + Bc - 1)  # sum of n_i over the full tiles seen
    at_tc = max(0, full - max(hidden, ((Tc - 1) * Bc - shift) // Br))  # of them, those with n_i = Tc
    steps, kv_rows, q_rows = Br * tiles, Bc * tiles - (Tc * Bc - Nk) * at_tc, Br * seen
    if Nq % Br:  # the last tile, rows full * Br .. Nq - 1
        n = causal_kv_tiles(Nq, Nq, Nk, Bc)
        steps, kv_rows, q_rows = steps + (Nq % Br) * n, kv_rows + min(n * Bc, Nk), q_rows + (Nq % Br if n else 0)
    return steps, kv_rows, q_rows


def hbm_counts(algorithm: str, B: int, H: int, Nq: int, Nk: int, D: int, Br: int = 64, Bc: int = 64,
               causal: bool = False) -> dict[str, tuple[int, int]]:
    """Exact HBM traffic of ``emulate(algorithm, ...)`` in elements, without running it.

    Returns {tensor name: (elements read, elements written)}, summed over B batches and H query heads
    (K/V are counted per query head: see the counting model in the module docstring). With Tr = ceil(Nq/Br),
    rows_i the rows of Q tile i and n_i the K/V tiles it visits (Tc = ceil(Nk/Bc), or
    :func:`causal_kv_tiles` when causal), per (batch, head):

    * standard: Q, K, V read once (Nq d, Nk d, Nk d); S, P written and read once (Nq Nk each);
      O written once (Nq d); LSE written (Nq).
    * fa1: O, l, m initialised (Nq d, Nq, Nq writes); K, V read once (Nk d, when Nq > 0); Q, O read and O
      written sum_i rows_i n_i d times; l, m read and written sum_i rows_i n_i times; a final read of l, m
      and write of LSE (Nq each). Non-causal: Q reads = Tc Nq d, O writes = (Tc + 1) Nq d.
    * fa2: Q read once per tile that sees a key (Nq d non-causal); K, V read sum_i min(n_i Bc, Nk) d
      (Tr Nk d non-causal); O written once (Nq d); LSE written once (Nq).

    Raises ValueError for an unknown algorithm or a tile size < 1.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {one_line(algorithm)}")
    Tr, Tc = _tile_counts(Nq, Nk, Br, Bc)
    bh = B * H
    if algorithm == "standard":
        c = {"Q": (Nq * D, 0), "K": (Nk * D, 0), "V": (Nk * D, 0), "S": (Nq * Nk, Nq * Nk),
             "P": (Nq * Nk, Nq * Nk), "O": (0, Nq * D), "LSE": (0, Nq)}
        return {n: (r * bh, w * bh) for n, (r, w) in c.items() if r * bh or w * bh}
    steps, kv_rows, q_rows = tile_sums(Nq, Nk, Br, Bc, causal)
    if algorithm == "fa1":
        kv = Nk * D if Nq > 0 else 0
        c = {"Q": (steps * D, 0), "K": (kv, 0), "V": (kv, 0), "O": (steps * D, (steps + Nq) * D),
             "l": (steps + Nq, steps + Nq), "m": (steps + Nq, steps + Nq), "LSE": (0, Nq)}
    else:
        kv = kv_rows * D
        c = {"Q": (q_rows * D, 0), "K": (kv, 0), "V": (kv, 0), "O": (0, Nq * D), "LSE": (0, Nq)}
    return {n: (r * bh, w * bh) for n, (r, w) in c.items() if r * bh or w * bh}


class HBMBytes(NamedTuple):
    """Predicted DRAM traffic in bytes."""

    read: int
    write: int

    @property
    def total(self) -> int:
        return self.read + self.write


_STATS = ("l", "m", "LSE")


def hbm_bytes(algorithm: str, B: int, H: int, Nq: int, Nk: int, D: int, Br: int, Bc: int, dtype_bytes: int,
              causal: bool, *, stats_bytes: int = 4, o_bytes: int | None = None) -> HBMBytes:
    """Predict the DRAM bytes a kernel with this tiling moves: :func:`hbm_counts` weighted by element sizes.

    algorithm: "standard", "fa1" or "fa2"; B, H: batch and query heads; Nq, Nk: seqlen_q, seqlen_k; D:
    head_dim; Br, Bc: the kernel's Q-tile rows and K/V-tile rows; dtype_bytes: bytes per Q/K/V/O/S/P element
    (2 for fp16/bf16, 1 for e4m3); causal: bottom-right causal with tile skipping. stats_bytes: bytes per
    l, m, LSE element (float32: 4). o_bytes: bytes per element of the O array that FA1 rewrites every step,
    if the kernel keeps it in another dtype than the inputs (e.g. 4 for an fp32 scratch); default dtype_bytes.

    The model assumes every program loads what it uses from DRAM (no L2 hits: under GQA the query heads of a
    group read K/V separately; with many CTAs in flight the L2 may serve some of these re-reads, so a
    measured dram__bytes_read.sum can be lower) and counts no workspace or launch traffic.
    Returns :class:`HBMBytes` (read, write, total). Raises ValueError like :func:`hbm_counts`.
    """
    o_bytes = dtype_bytes if o_bytes is None else o_bytes
    size = lambda n: stats_bytes if n in _STATS else (o_bytes if n == "O" else dtype_bytes)  # noqa: E731
    counts = hbm_counts(algorithm, B, H, Nq, Nk, D, Br, Bc, causal)
    return HBMBytes(sum(r * size(n) for n, (r, _) in counts.items()),
                    sum(w * size(n) for n, (_, w) in counts.items()))


# ------------------------------------------------------------------------------------------------- CLI


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Arguments of `fa-variants io`."""
    from fa_variants.cli import nonnegative_int, positive_float, positive_int

    parser.add_argument("--N", type=positive_int, nargs="+", default=[1024, 2048, 4096, 8192, 16384],
                        help="sequence lengths (seqlen_q = seqlen_k = N)")
    parser.add_argument("--d", type=positive_int, nargs="+", default=[64, 128], help="head dims")
    parser.add_argument("--sram-kb", type=positive_float, default=100.0,
                        help="on-chip SRAM size M in KiB (FA paper: 100 KB of an A100 SM's 192 KB)")
    parser.add_argument("--elem-bytes", type=positive_int, default=2, help="bytes per element to turn KiB into M (fp16: 2)")
    parser.add_argument("--causal", action="store_true", help="bottom-right causal with tile skipping")
    parser.add_argument("--emulate-max", type=nonnegative_int, default=2048,
                        help="run the emulators for N up to this, else use the closed form hbm_counts (default "
                             "%(default)s; the emulators are Python tile loops: at large d, whose tiles are small, "
                             "they take minutes, and 0 keeps to the closed form)")
    parser.add_argument("--fa2-tiles", type=positive_int, nargs=2, metavar=("BR", "BC"), default=None,
                        help="FA2's own Br, Bc (e.g. 128 64 as a sm80 kernel); default: FA1's choice")


#: the emulated io rows allocate q, k, v of N x d each: beyond this many elements the closed form alone (a --d of
#: 1e11 raised the allocator's RuntimeError as a traceback, session 27)
EMULATE_MAX_ELEMENTS = 2**24


def _io_rows(N: int, d: int, M: int, causal: bool, emulate_max: int, fa2_tiles=None) -> dict:
    Br, Bc = fa1_tile_sizes(M, d)
    tiles = {"standard": (Br, Bc), "fa1": (Br, Bc), "fa2": tuple(fa2_tiles or (Br, Bc))}
    totals = {a: sum(r + w for r, w in hbm_counts(a, 1, 1, N, N, d, *tiles[a], causal).values()) for a in ALGORITHMS}
    source = "closed form"
    # measure, and check the closed form on the way; S and P are N x N (a huge N only in the closed form: an
    # overcommitting host would grant the allocation and kill the process writing it)
    if N <= emulate_max and max(N * d, N * N) <= EMULATE_MAX_ELEMENTS:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, N, 1, d, generator=g) for _ in range(3))
        measured = {a: emulate(a, q, k, v, causal=causal, Br=tiles[a][0], Bc=tiles[a][1]).hbm.total
                    for a in ALGORITHMS}
        if measured != totals:
            raise AssertionError(f"emulator counts {measured} differ from hbm_counts {totals} at N={N}, d={d}")
        source = "emulated"
    return {"N": N, "d": d, "M": M, "Br": Br, "Bc": Bc, **totals, "source": source}


def run_cli(args: argparse.Namespace) -> int:
    """Print the FlashAttention paper's IO-complexity comparison (section 3.2, Theorem 2), computed."""
    from rich.table import Table

    from fa_variants.cli import console

    sram_bytes = args.sram_kb * 1024
    if not math.isfinite(sram_bytes):
        raise ValueError(f"--sram-kb {args.sram_kb:g} is too large: {args.sram_kb:g} KiB overflows a float in bytes")
    M = int(sram_bytes) // args.elem_bytes
    if M < 1:
        raise ValueError(f"--sram-kb {args.sram_kb:g} holds no element of --elem-bytes {args.elem_bytes} (M = 0): "
                         "raise --sram-kb or lower --elem-bytes")
    title = (f"HBM accesses per (batch, head), elements read + written; M = {M} elements "
             f"({args.sram_kb:g} KiB of {args.elem_bytes}-byte elements); Br, Bc as FA1 Algorithm 1 line 1"
             f"{'; causal' if args.causal else ''}"
             f"{'; FA2 with Br, Bc = %d, %d' % tuple(args.fa2_tiles) if args.fa2_tiles else ''}")
    # two tables of at most 8 columns, so that each fits an 80-column terminal: one space between cells
    # (collapse_padding; with two, the second table took 83 columns at N >= 1000 and rich cut its bounds to
    # "1.114e+…"), and a value wider than its column wraps (overflow "fold") instead of losing digits
    counts = Table(title=title, collapse_padding=True)
    for col in ("N", "d", "Br", "Bc", "standard", "FA1", "FA2", "source"):
        counts.add_column(col, justify="left" if col == "source" else "right", overflow="fold")
    ratios = Table(title="The same against Theorem 2's bounds (FA1 paper, sec. 3.2): std/bound = standard / "
                         "(Nd + N^2), FA1/bound = FA1 / (N^2 d^2 / M)",
                   caption="source: 'emulated' = counted by running the tile loops (and equal to hbm_counts); "
                           "'closed form' = hbm_counts, proven equal to the emulators by tests/test_emulate.py",
                   collapse_padding=True)
    for col in ("N", "d", "Nd+N^2", "N^2d^2/M", "std/bound", "FA1/bound", "std/FA1", "std/FA2"):
        ratios.add_column(col, justify="right", overflow="fold")
    for d in args.d:
        for N in args.N:
            row = _io_rows(N, d, M, args.causal, args.emulate_max, args.fa2_tiles)
            theta_std, theta_fa = N * d + N * N, N * N * d * d / M
            counts.add_row(str(N), str(d), str(row["Br"]), str(row["Bc"]), f"{row['standard']:.3e}",
                           f"{row['fa1']:.3e}", f"{row['fa2']:.3e}", row["source"])
            ratios.add_row(str(N), str(d), f"{theta_std:.3e}", f"{theta_fa:.3e}",
                           f"{row['standard'] / theta_std:.2f}", f"{row['fa1'] / theta_fa:.2f}",
                           f"{row['standard'] / row['fa1']:.2f}", f"{row['standard'] / row['fa2']:.2f}")
    out = console()  # the terminal's width (80 when piped)
    out.print(counts)
    out.print(ratios)
    return 0
