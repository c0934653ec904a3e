"""FlashAttention-3 forward with FP8 (e4m3) operands on Hopper (sm90): ``FlashAttention3Fp8Sm90``.

The bf16/fp16 kernel of ``hopper/fa3.py`` (TMA, warp specialisation with ``setmaxnreg``, ping-pong,
intra-warpgroup overlap, bottom-right causal tile skipping, GQA) with its hooks overridden; nothing of
the schedule is copied. After Shah et al. 2024, "FlashAttention-3", section 3.3 (FP8), with block
scales (one descale per 128 query rows and per ``tile_n`` keys, ``fa_variants.fp8.layout``):

* Default tiles per head_dim come from ``layout.KERNEL_TILES`` (64: 192 x 192, three consumer warpgroups,
  serial steps, reduce_chains 4;
  128: 128 x 256 with serial steps; 256: 128 x 128, P V in four slices of d with two temporaries, the next S
  GEMM issued as two halves before the last slice's promotion: ``s_lookahead``, ``s_halves``), which the
  quantisation reads too: K/V scale blocks are the kernel's tile_n, and ``run_fp8`` refuses inputs of other
  block heights.
* S = Q8 K8^T is an FP8 WGMMA (SASS QGMMA), both operands K-major in shared memory.
* Per-tile descales fold into the exponent: with c_n = q_descale[q_block] * k_descale[n] *
  softmax_scale * log2(e) (q_block: the 128-row Q scale block of the 64-row warpgroup, ``layout.q_scale_block``), the running row max m is kept in log2 units (m = max_n c_n * rowmax(S_n)),
  and P = exp2(S c_n - m + P_SHIFT) is one FFMA + one MUFU.EX2 per score. P_SHIFT = 8 puts P in
  [0, 256] (e4m3's largest finite value is 448: more of its range than [0, 1], as FA3's released FP8
  kernel does). The row sum l is taken from the fp32 P before rounding; LSE = (m + log2 l - 8) ln 2.
* P is rounded to e4m3 (cvt.rn.satfinite) in registers and is the A operand of the P V FP8 WGMMA (RS).
  Register layout choice: the V token permutation, not a register shuffle. The fp32 accumulator gives
  the thread with lane % 4 = t the columns 2t, 2t+1, 2t+8, 2t+9 of every 16 of its rows; the k32 e4m3 A
  fragment wants k positions 4t .. 4t+3. The quantisation pass stores V's tokens permuted inside
  groups of 16 (``fa_variants.fp8.layout.v_token_order``), so the converted P of each thread is its A
  fragment after in-thread byte packing only: no quad shuffles, no extra shared memory
  (SageAttention's trick; FA3's C++ kernel instead shuffles registers and transposes V in shared memory).
* V is read K-major: the caller's pre-transposed ``v_t`` (batch, num_heads_kv, head_dim,
  seqlen_k_padded) through TMA as (head_dim, tile_n) boxes, the B operand (N = head_dim, K = tokens).
  The FP8 WGMMA has no transpose bit and the DSL does not reject an MN-major FP8 MMA:
  ``_make_mma_pv`` checks both operands are K-major.
* Two-level accumulation (``Fp8Config.two_level``, default on): each tile's P V goes into a zeroed
  temporary (the WGMMA's own zero-init), then O = alpha O + v_descale[n] tmp in fp32 on the CUDA
  cores, so the FP8 WGMMA's reduced-precision accumulator never carries O across tiles (the long-context
  drift of a single FP8 accumulator). ``promote_every`` = N > 1: the temporary carries N tiles (the first
  overwrites it, a run-time accumulate predicate of the WGMMA; later ones are added after the temporary is
  rescaled by alpha v_descale[n+1] / v_descale[n], as the single accumulator below), O is multiplied by
  the product of the interval's alphas only when the temporary is added in: per tile and element
  1 + 2 / N CUDA-core operations instead of 2. Off: one running accumulator kept in units of the
  current tile's v_descale (O *= alpha v_descale[n+1] / v_descale[n] before tile n's P V, O *= v_descale[0]
  at the end): the ablation baseline, one operation per element.
  At head_dim 256 the temporary for the whole of d does not fit beside O in registers: the P V GEMM is
  split over ``pv_split`` slices of d, each promoted as soon as it is done (so N = 1 there). Read in the
  SASS (pv_split 2, one temporary): every slice is waited for (WARPGROUP.DEPBAR 0) and promoted (64 FFMAs
  per thread) inside the warpgroup's ping-pong turn, so the tensor cores idle for two drains and two
  promotes per tile, ~20% of a tile's 1024 MMA cycles: the 9-20% the H200 showed. ``pv_buffers = 2``
  with ``pv_split = 4`` (two 32-register temporaries) issues slice h + 1 before promoting slice h
  (DEPBAR 1): only the last slice's promote and one drain stay exposed.
* Speed switches (issue 10; the A/B is ``scripts/fa3_fp8_speed_ab.py --set fp8speed``), off by default but
  ``skip_unit_rescale`` (and, at head_dim 256, ``s_lookahead`` with ``s_halves``).
  Read in the SASS of the head_dim 256 default: ptxas sinks O *= alpha (issued before the P V GEMM) into the
  promotion, which becomes O = alpha O + (v_descale tmp), an FMUL and an FFMA per element; after the last slice's wait (DEPBAR 0) ~128 of
  them plus the loop's top run before the next S GEMM is issued and the turn handed on, with this warpgroup's
  tensor-core queue empty and the other warpgroup waiting for the turn. ``early_pv_arrive`` (serial steps)
  hands the ping-pong turn on right after the last P V QGMMA is issued (BAR.ARV before the DEPBAR), so the other
  warpgroup's GEMMs fill the tensor cores during the drain and the promotion; this warpgroup's next S GEMM is
  then issued outside the turn. ``skip_unit_rescale`` (on by default; honoured with promote_every 1) skips
  O *= alpha when every alpha of the thread is exactly 1 (no row max moved: most tiles of a long row); the
  promotion is then one FFMA per element and the tail after DEPBAR 0 halves (64 FFMAs). Its fp32 roundings, read
  in the SASS (head_dim 128 and 256): the skip itself changes nothing (O * 1 = O), but the promotion compiles
  differently. Without the switch O = fma(alpha, O, round(v_descale tmp)) (FMUL + FFMA); with it
  O = fma(v_descale, tmp, O') with O' = round(alpha O) on a thread whose alphas moved, O where none did. With
  power-of-two descales (every quantiser's) v_descale tmp is exact: tiles where no max moved give bitwise the
  old O, the others one more fp32 rounding (of alpha O), the emulation's own order (``fp8.emulation``).
  There is no second P buffer (to run the
  P V GEMM under the softmax with intra-warpgroup overlap): tried, wrong (NaN) and slower on the H200 (bench/NOTES.md).
  A promotion interval (``promote_every``) needs a temporary for the whole of d that lives across the S GEMM and
  the softmax: at head_dim 256 (O 128 + temporary 128 registers per thread) it cannot fit, at 128 with 256-key
  tiles it spills (S 128 + O 64 + temporary 64); it is built for head_dim 64 and for 128 with 128-key tiles.
* ``s_lookahead`` (head_dim 256, session 6; on by default there with ``s_halves``, ``DEFAULT_SWITCHES``): the serial step waits for the last P V slice and
  promotes it before the next S GEMM is issued, so each ping-pong turn ends with this warpgroup's tensor-core queue
  empty. With the switch the consumer runs its own loop (``_Fp8StepContext.lookahead_loop``): the S GEMM of tile
  n - 1 is issued right after the last slice of tile n's P V GEMM, the turn is handed on, and the last slice is
  promoted while S runs (same operations and roundings, so the emulation is unchanged). Registers at the peak:
  O + P + one temporary + S; 128 x 128 tiles do not fit (pv_split 8 spills), tile_n 64 with four slices does when
  S takes the first temporary's registers (same 64 x 64 fp32 layout; the slice held there was promoted just
  before), and tile_n 96 with eight slices (pv_split 8, 16-register temporaries) fits without sharing.
  ``s_halves`` keeps 128 x 128 (four slices): S as two 64-key MMAs (``_qk_mma_n``), each in one temporary's
  registers (both temporaries are one allocation, S's): half 0 is issued after the slice before the last is
  promoted, the last slice is promoted while half 0 runs, then half 1 is issued and the turn handed on. Without
  ``s_lookahead`` (session 7) ``s_halves`` only splits S's MMA, in any schedule: what the halves cost (each reads Q
  from shared memory again; bench/NOTES.md, session 7).
* ``fused_promote`` (head_dim 256 lookahead, session 8; on by default at 256 since session 9): O kept in units of the last visited tile's v_descale
  (as the single accumulator keeps its own), so O *= alpha folds into the promotion: O = fma(alpha', O, tmp) with
  alpha' = alpha v_descale[n + 1] / v_descale[n] per row. Read in the SASS of the default: the FMUL block of
  O *= alpha (128 a thread) runs on every tile where a row max of any of the warp's 16 rows moved (the unit-alpha skip
  is per thread, the branch diverges), ~67% of the tiles at 32 K/V tiles and ~32% at 128 for iid scores; with the
  switch the main loop has 618 instructions a warp and tile (default 737 with the block, 609 without; single_overlap
  574: the same FP32 work, FMUL for FFMA, and 20 fewer QGMMA issues and descriptor adds).
* The head_dim 256 ping-pong turn: read in the SASS, the default's turn (BAR.SYNC .. BAR.ARV) holds the four P V
  slices with three waits and 3 x 32 promotion FFMAs, S half 0, the last slice's wait and promotion and S half 1, where
  single_overlap's turn only issues its 12 QGMMAs. Handing the turn on right after S half 0's issue, and the lookahead
  without ping-pong, were built in session 9 and measured slower at every shape on the H200 (bench/NOTES.md, session
  11): removed.
* ``hoisted_descriptors`` (the Sm90Config field, accepted, off here; session 12): the K and V ring's WGMMA
  descriptors built once before the K/V loop (``common.sm90.hoisted_descriptors``), so the head_dim 256 turn's six
  GEMM groups (four P V slices, two S halves) add a stage / slice offset instead of rebuilding each descriptor. Same
  descriptors and values (the emulation is unchanged). SASS (CPU, D 256 non-causal, BAR.SYNC .. BAR.ARV): the loop's
  common turn 255 -> 247 instructions, its 128 promotion FFMAs unchanged; no spills. The promotions themselves cannot
  leave the turn without registers (bench/NOTES.md, session 12 "twolvl3"). Measured the same at head_dim 256 (session
  13, H200, paired: hd / new 1.004 / 0.995 / 0.999 at N 16k / 4k / 8k), so it is left off.
* The persistent grid (session 22; ``Sm90Config.persistent`` / ``balanced``, fa3's ``_roles_persistent``): one CTA
  per SM walks query tiles with its pipeline states carried (the head_dim 256 lookahead loop returns them), the
  step context and its descales built per tile; O has a shared-memory buffer of its own beside Q's where two 16-bit O
  tiles and the e4m3 K/V ring fit (``Fp8Config.separate_o``: 64, 128). Each tile computes what it computes on the
  default grid (bit for bit). The default for short calls (``call_config``: ``BALANCED_MAX_SEQLEN_K``,
  ``PERSISTENT_MAX_SEQLEN_K``); at 256 it runs at about half speed (bench/NOTES.md, session 22), so not there.
* K/V tiles are walked from the last to the first (as fa3). Output in the caller's 16-bit dtype,
  LSE float32 natural log; rows that see no key give O = 0 and LSE = -inf.

Follows (ideas, not code) Dao-AILab/flash-attention hopper/ (the FP8 P shift and descale placement
of the released kernel), NVIDIA/cutlass examples/python/CuTeDSL hopper FMHA (pre-transposed FP8 V).

This module holds the config (``Fp8Config``, ``DEFAULT_CONFIGS``) and the host side (``VARIANT``, ``run_quantized``,
``run_fp8``); the kernel (``FlashAttention3Fp8Sm90``, ``_Fp8StepContext``, the P operand helpers) lives in
``hopper.fa3_fp8_kernel``, imported only to compile (``_build``).
"""

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

import cutlass.cute as cute
from cutlass import Float32, Int32

from fa_variants.common import env, interop
from fa_variants.common.cache import StaticConfig
from fa_variants.common.config import WGMMA_M
from fa_variants.common.launch import Variant
from fa_variants.fp8 import layout
from fa_variants.fp8.quantize import E4M3_MAX
from fa_variants.hopper import fa3
from fa_variants.hopper.fa3 import LOG2_E, Fa3Config, _tma_operand, l2_section_heads

HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 256)
OUT_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
P_SHIFT = 8.0  # P = exp2(. + 8) in [0, 256]; e4m3 max 448
#: the widest K/V tile of a 192-row (three consumer warpgroup) config: 192 x 224 and 192 x 256 fail in ptxas (Fp8Config.check)
MAX_TILE_N_192 = 192
#: the margin on the largest |S| e4m3 operands allow (``max_score``): the FP8 MMA's accumulator keeps 13 fraction bits
#: per 32-term chunk. The emulation's model truncates (a computed |S| never passes head_dim 448^2); an accumulator
#: that rounded to nearest instead could pass it by ~head_dim / 32 2^-14 relative (2^-11 at head_dim 256), and
#: 2^-6 covers that with room
MAX_SCORE_MARGIN = 1.0 + 2.0**-6


def max_score(head_dim: int) -> float:
    """The largest |S| = |sum_i q_i k_i| the FP8 S GEMM can return for e4m3 operands (|q_i|, |k_i| <= 448), with
    ``MAX_SCORE_MARGIN`` for its accumulator: head_dim 448^2 (1 + 2^-6). A tile's scaled row max is at most c_n
    times it, which is what ``Fp8Config.huge_guard`` and ``huge_hoisted`` compare with 2^11 (the huge-logit limit)."""
    return head_dim * E4M3_MAX**2 * MAX_SCORE_MARGIN


E4M3 = torch.float8_e4m3fn


@dataclass(frozen=True)
class Fp8Config(Fa3Config):
    """Fa3Config plus the FP8 switches.

    two_level: P V into a temporary accumulator promoted into the fp32 O (module docstring).
    promote_every: tiles per promotion with two_level (1: a fresh temporary per tile; N > 1: the temporary
        carries N tiles, rescaled like a single accumulator, then is added into O; needs pv_split 1); ignored
        with two_level off. Defaults: ``layout.KERNEL_PROMOTE_EVERY``.
    pv_split: the P V GEMM (and its temporary) split over this many slices of head_dim (1, 2, 4 or 8).
    pv_buffers: temporaries for the slices (1: slice by slice; 2: slice h + 1 runs on the tensor cores
        while slice h is promoted on the CUDA cores; needs pv_split > 1).
    descale_prefetch: the K/V descales read ahead into registers (off by default; issue 10 A/B): k_descale of the
        next K/V tile is loaded when this tile's P V GEMM is issued (the softmax of the next tile then finds its
        scale in a register instead of waiting on a load right after its S GEMM), and v_descale of this tile once
        per tile before its P V GEMM (not once per slice of d after each wait). Same values: bitwise the same O.
    out_dtype: "bf16" | "fp16", the output dtype (part of the compile key).
    s_lookahead: the next K/V tile's S GEMM issued inside this tile's ping-pong turn, after the last P V slice
        and before that slice's promotion (``_Fp8StepContext.lookahead_loop``; the field's default is off, but
        the head_dim 256 default config has it on with s_halves since session 6: ``DEFAULT_SWITCHES``, and
        ``NO_LOOKAHEAD`` turns both off). Needs two_level, promote_every 1, pv_split > 1 with pv_buffers 2, serial steps with ping-pong,
        descale_prefetch off (the step reads v_descale once itself).
    s_halves: the S GEMM as two warpgroup MMAs of tile_n / 2 keys (Q read from shared memory twice). With
        s_lookahead each half lives in one temporary's registers (needs tile_n * pv_split == 2 * head_dim: 128 x 128
        tiles with four slices at head_dim 256): half 0 is issued after the last slice, the last slice is promoted
        while it runs, then half 1 is issued. Without s_lookahead (session 7, any schedule; needs tile_n % 64 == 0) it
        changes only the S MMA's width: the measure of what the two 64-key halves cost beside one 128-key MMA.
    fused_promote: (session 8; the head_dim 256 default since session 9; needs s_lookahead) O kept in units of the last visited tile's v_descale, as the
        single accumulator keeps its own: O *= alpha is folded into the promotion, O = fma(alpha', O, tmp) with the
        per-row alpha' = alpha v_descale[n + 1] / v_descale[n] (one FFMA per element and tile; no FMUL block before
        the turn, no unit-alpha branch, no v_descale multiply), O *= v_descale[0] at the end. One fp32 rounding per
        promotion instead of two (round(alpha O) then fma): the fused form the emulation's docstring already names
        (with power-of-two descales the unit change is exact). O / v_descale must stay finite: a V block of
        descale 2^-110 (nonzero, every |value| <= 448 x 2^-110 ~ 3.5e-31) visited after the unnormalised O (2^8 |O| l
        in the kernel's P units, 1 <= l <= keys seen) reached 2^18 overflows, and so does any block 2^128 below the
        one before it (the ratio overflows; the single accumulator's limits too); ``bounded_units`` (on with it in the
        head_dim 256 default since session 11) removes both; an all-zero block has descale 1 since session 9
        (``fp8.quantize.ZERO_BLOCK_DESCALE``: the floor 2^-110 before, which overflowed on zero padding).
    bounded_units: (session 10; the head_dim 256 default since session 11, ``DEFAULT_SWITCHES``; the field's default is
        off; needs fused_promote) O kept in units u = max(v_descale[n], M 2^-UNIT_SPAN)
        instead of v_descale[n], M the largest v_descale the warpgroup has visited (``fp8.emulation.bounded_unit``,
        with the proof): |O / u| <= 2^112 for any finite V (|V| <= 448 M) and seqlen_k <= 2^31, where O / v_descale
        overflows once the unnormalised O reaches 2^128 v_descale (2^18 behind a block at the 2^-110 floor; the
        ratio v_descale[n + 1] / v_descale[n] itself overflows past 2^127). Only M is carried from tile to tile (u_prev
        recomputed from v_descale[n + 1]); per tile a few scalar FMNMX/FMUL, the division alpha' = alpha u_prev / u
        (where fused_promote divides the descales) and one branch, uniform over the CTA (descales are per (batch,
        kv-head, tile)), taken before the ping-pong turn: the turn is compiled twice, the common copy the
        fused_promote turn itself (one FFMA per element), the rare one (u != v_descale) multiplying the temporaries
        by s = v_descale / u (a power of two, exact). Session 10's form branched on s before every slice's promotion
        inside the turn, with the division s there too: 2-4.5 % slower than the default on the H200 (session 11);
        this form's speed / the default's 0.998-1.016 (session 11, scripts/bounded_gpu.sh), so it became the default.
        Same values as fused_promote wherever that stays finite and normal
        (emulation ``units="bounded"``). Not removed (nor by fused_promote): alpha' underflows where a tile's
        descale lies > 2^149 above the unit (``bounded_unit``, "Not covered"), dropping the earlier tiles' O in rows
        whose P on that tile rounds to 0.
    huge_per_row: (session 27) the softmax's huge-logit branch (|m| >= 2^11 in log2 units: the exact form,
        ``common.softmax.OnlineSoftmax._huge_tile_row``) taken row by row instead of once per tile after every row's
        max. Same values. The per-tile form keeps more values live and spills at the head_dim 256 default (and with
        descale_prefetch), so those configs take this one (``DEFAULT_SWITCHES``; 0.97x at head_dim 256 in session
        27's A/B, 0.90-0.95x where it is not needed).
    huge_guard: (session 27; the head_dim 64 default since session 28, ``DEFAULT_SWITCHES``) the huge-logit check
        only on tiles where it can matter: |m| <= max(c_n ``max_score``, |m_old|), known before the row maxima,
        so on ordinary inputs the softmax runs the code it ran before the check existed
        (``OnlineSoftmax.score_bound``). Not with huge_per_row (both paths live at once spill at head_dim 256).
        Measured (session 28, paired A/B, one H200, N 4k / 16k, causal and not): 1.004-1.033x the checked default at
        head_dim 64, 0.954-0.985x at 128 (two "slower"), so it stayed off at 128 (bench/NOTES.md), which takes
        huge_hoisted since session 29. Not with huge_hoisted (``check`` refuses the pair).
    huge_hoisted: (session 29; the head_dim 128 default since then, ``DEFAULT_SWITCHES``) the huge-logit check
        decided once per warpgroup, before its free K/V tiles: that loop is compiled twice (``FlashAttention3Sm90.
        _free_tiles``), with the check (as configured: per tile, or per row with huge_per_row; not with huge_guard)
        and without it, and a warpgroup runs the one without when c_n ``max_score`` < 2^11 on every K/V
        tile it will visit (``_Fp8StepContext.huge_possible``: each warp reads the tiles' k_descale, one per lane,
        and votes), which bounds every |m| below 2^11. Ordinary inputs then run exactly the loop from before the
        check existed (session 27: the check cost 3-5 %), without the per-tile branch of huge_guard (whose two paths
        in one loop spilled at head_dim 256 and were slower at 128). Same values either way. Costs: code size (two
        loops) and one read of k_descale per 32 tiles and lane before the loop. The first, masked and last tiles
        keep the checked code (doubling the whole walk spilled at the causal 64 / 256 defaults). N(0, 1) inputs give
        c_n max_score ~ 810 at head_dim 128 and ~1150 at 256 (against 2^11 = 2048): Q and K whose per-block amax
        after the rotation is a few times larger (real models' outliers) take the checked loop, and gain nothing.
    """

    two_level: bool = True
    promote_every: int = 1
    pv_split: int = 1
    pv_buffers: int = 1
    descale_prefetch: bool = False
    out_dtype: str = "bf16"
    s_lookahead: bool = False
    s_halves: bool = False
    fused_promote: bool = False
    bounded_units: bool = False
    huge_per_row: bool = False
    huge_guard: bool = False
    huge_hoisted: bool = False

    #: e4m3 Q, K, V: Q's buffer is sized for the 16-bit O it holds later (``Sm90Config._buffers``); on the persistent
    #: grid O has a buffer of its own at head_dim 64 and 128, not 256 (``separate_o``)
    OPERAND_BYTES: ClassVar[int] = 1

    def check(self, head_dim: int) -> None:
        super().check(head_dim)
        # tile_m 128 or 192 (Sm90Config.check): each 64-row warpgroup lies in one Q scale block of TILE_M rows
        assert layout.TILE_M % WGMMA_M == 0
        if self.pack_gqa:  # the descales are indexed by query head and row: packed rows / KV heads would misread them
            raise ValueError("fa3-fp8: pack_gqa=True is not supported (q_descale is per query head and 128 rows)")
        if self.seqlens_k:  # the descale tables are per padded K/V block; not wired into fp8's kernels
            raise ValueError("fa3-fp8: seqlens_k=True is not supported (per-sequence KV lengths: fa3, fa2)")
        if self.alpha_first:  # not built or tested for fp8's own mainloop
            raise ValueError("fa3-fp8: alpha_first=True is not supported (only fa3's bf16/fp16 kernel)")
        if self.tile_n % 32:
            raise ValueError(f"fa3-fp8: tile_n={self.tile_n} must be a multiple of 32 (k of the FP8 P V WGMMA)")
        if self.tile_m == 3 * WGMMA_M and self.tile_n > MAX_TILE_N_192:
            # 512 threads launch with 128 registers each, and ptxas (CUDA 13, sm_90a) sizes the first S GEMM's
            # QGMMA against those 128, not the consumers' setmaxnreg 160: m64n224 asks for 138, m64n256 for 154
            # ("Insufficient registers (128) to compile instruction"), so 192 x 224 / 192 x 256 never build
            raise ValueError(f"fa3-fp8: tile_n={self.tile_n} with tile_m=192 (three consumer warpgroups) does not "
                             f"compile: at most {MAX_TILE_N_192} (the S accumulator must fit 128 registers a thread)")
        if self.pv_split not in (1, 2, 4, 8) or head_dim % (16 * self.pv_split):
            raise ValueError(f"fa3-fp8: pv_split={self.pv_split} must be 1, 2, 4 or 8 and divide head_dim={head_dim} into multiples of 16")
        if self.pv_split > 1 and (self.intra_wg_overlap or not self.two_level):
            raise ValueError("fa3-fp8: pv_split > 1 needs two_level on and intra_wg_overlap off (the slices are promoted in turn)")
        if self.pv_buffers not in (1, 2) or (self.pv_buffers == 2 and self.pv_split == 1):
            raise ValueError(f"fa3-fp8: pv_buffers={self.pv_buffers} must be 1, or 2 with pv_split > 1")
        if self.promote_every < 1 or (self.promote_every > 1 and self.two_level and self.pv_split != 1):
            raise ValueError(f"fa3-fp8: promote_every={self.promote_every} must be >= 1, and 1 with pv_split > 1 "
                             f"(the interval's temporary covers the whole of head_dim)")
        if self.s_lookahead and not (self.two_level and self.promote_every == 1 and self.pv_split > 1 and self.pv_buffers == 2
                                     and self.pingpong and not self.intra_wg_overlap and not self.early_pv_arrive
                                     and not self.shared_kv_state and not self.descale_prefetch):
            raise ValueError("fa3-fp8: s_lookahead needs two_level, promote_every 1, pv_split > 1 with pv_buffers 2 and "
                             "pingpong on; intra_wg_overlap, early_pv_arrive, shared_kv_state and descale_prefetch off")
        halves_fit = self.tile_n * self.pv_split == 2 * head_dim and self.pv_split % 2 == 0
        if self.s_halves and self.s_lookahead and not halves_fit:
            raise ValueError(f"fa3-fp8: s_halves with s_lookahead needs tile_n * pv_split == 2 * head_dim with pv_split "
                             f"even (S's halves in the two temporaries' registers), got tile_n={self.tile_n}, "
                             f"pv_split={self.pv_split}")
        if self.s_halves and self.tile_n % 64:
            raise ValueError(f"fa3-fp8: s_halves needs tile_n a multiple of 64 (two halves of whole 32-key k-blocks "
                             f"of P), got tile_n={self.tile_n}")
        if self.fused_promote and not self.s_lookahead:
            raise ValueError("fa3-fp8: fused_promote needs s_lookahead (the head_dim 256 schedule it is built for)")
        if self.bounded_units and not self.fused_promote:
            raise ValueError("fa3-fp8: bounded_units needs fused_promote (the other promotions keep O in absolute units)")
        if self.rescale_o_before_pv:
            raise ValueError("fa3-fp8: rescale_o_before_pv is not built for the FP8 P V hooks (use False)")
        if self.num_splits != 1:
            raise ValueError(f"fa3-fp8: num_splits={self.num_splits}: split-KV is not built for the FP8 kernel (use 1)")
        if self.huge_guard and self.huge_hoisted:  # the hoisted choice replaces the per-tile guard (unused, misleading)
            raise ValueError("fa3-fp8: huge_guard=True with huge_hoisted=True: the guard is unused under the hoisted "
                             "check (set huge_hoisted=False to run the per-tile guard)")
        if self.out_dtype not in ("bf16", "fp16"):
            raise ValueError(f"fa3-fp8: out_dtype {self.out_dtype!r} must be 'bf16' or 'fp16'")


#: switches per head_dim of the default configs: skip_unit_rescale (no O *= alpha when no row max of the thread
#: moved, module docstring for its fp32 roundings) at 256 only. H200, scripts/fa3_fp8_speed_ab.py --set fp8flip
#: (8 rotated rounds, N 4k / 4k causal / 16k / 16k causal, on / off): 256 1.02 / 1.05 / 1.00 / 1.07x; 128 1.00 /
#: 0.97 / 0.97 / 0.91x, so off there (and at 64 and 96, not shown faster). At 256 also s_lookahead with s_halves
#: (session 6, --set fp8d256, variant look128_halves, on top of skip_unit_rescale): 1015 / 893 / 1102 / 1052
#: TFLOP/s against 985 / 898 / 962 / 941 for the serial default before (1.03 / 0.99 / 1.15 / 1.12x), accuracy as
#: the emulation's. ``NO_LOOKAHEAD`` turns both off (that serial schedule; needed beside changes the lookahead
#: refuses: one accumulator, early_pv_arrive, descale_prefetch, other slicings and tiles). At 64 (session 6,
#: variant tn192s_c4: tile_n 192 from layout.KERNEL_TILES, serial steps in _default, reduce_chains 4): 570 / 499 /
#: 658 / 627 TFLOP/s against 515 / 460 / 535 / 526 for the 192 x 128 default with overlap before, accuracy PASS.
#: At 256 also fused_promote with reduce_chains 2 (session 9, --set fp8two, variant fused_c2, 6 rotated rounds on
#: the H200, N 4k / 4k causal / 16k / 16k causal): 1118 / 947 / 1094 / 1013 TFLOP/s against 1050 / 890 / 1034 / 968
#: for the default before (per-round medians 1.06 / 1.06 / 1.06 / 1.05x), rel-L2 vs the emulation as before
#: (1.6e-3); skip_unit_rescale is then unused (no O *= alpha block left) and kept so the config is the one timed.
#: fused_promote alone keeps O / v_descale, which overflows behind a V block of descale 2^-110 (nonzero, amax <= 448 x
#: 2^-110 ~ 3.5e-31) once the unnormalised O (2^8 |O| l, l the row sum relative to its max) of the rows visited before
#: it reaches 2^18, and behind any block 2^128 below the one before it (fused_promote's docstring). At 256 also
#: bounded_units since session 11 (O in units max(v_descale, M 2^-64): finite up to max|V| seqlen_k 2^119; its one
#: limit, a descale > 2^149 above the unit, in its docstring): session 10's form was 2-4.5 % slower; the
#: one-branch-per-tile form (scripts/bounded_gpu.sh, H200, 8 rotated rounds, N 4k / 4k causal / 16k / 16k causal)
#: per-round medians of default time / bounded time 0.998 / 1.003 / 1.016 / 1.010 (TFLOP/s 1024 / 922 / 1086 / 1038
#: against 1011 / 920 / 1046 / 1029), 11 GPU tests passed (adversarial V finite, vs the emulation and float64).
#: bounded_units=False brings the limit back.
#: At 128 huge_hoisted since session 29 (the huge-logit check decided once per warpgroup before its free K/V tiles;
#: scripts/fp8hoist_gpu.sh, paired, 6 rounds, one H200, N 4k / 4k causal / 16k / 16k causal): hoist / new 1.022 / 0.997 /
#: 1.036 / 1.016 ("same" but 16k non-causal "faster"), TFLOP/s 772 / 633 / 834 / 774 against 754 / 630 / 812 / 760,
#: 46 GPU tests passed before the step's limit (none failed); at 64 0.995-1.010 ("same": huge_guard stays), at 256
#: 1.005-1.013 ("same", and 5-15 spill instructions outside the loops: not flipped).
DEFAULT_SWITCHES = {64: dict(reduce_chains=4, huge_guard=True), 96: {}, 128: dict(huge_hoisted=True),
                    256: dict(skip_unit_rescale=True, s_lookahead=True, s_halves=True, fused_promote=True,
                              reduce_chains=2, bounded_units=True, huge_per_row=True)}
#: the changes that take the head_dim 256 default back to its serial steps (no lookahead, S in one MMA; O in absolute
#: units: bounded_units goes with fused_promote)
NO_LOOKAHEAD = dict(s_lookahead=False, s_halves=False, fused_promote=False, bounded_units=False)


def _default(head_dim: int) -> Fp8Config:
    """The default config at head_dim: tiles from ``layout.KERNEL_TILES`` (the quantisation's block heights come
    from there too) and the promotion interval from ``layout.KERNEL_PROMOTE_EVERY`` (the default recipe's, which
    the emulation follows), switches chosen on the H200 (bench/NOTES.md, FA3-FP8 A/B). Registers per consumer
    thread (240): O is D/2 fp32, the two-level temporary D/2 / pv_split, S tile_n/2, P tile_n/8."""
    tile_m, tile_n = layout.kernel_tiles(head_dim)
    common = dict(tile_m=tile_m, tile_n=tile_n, stages=2, promote_every=layout.promote_every(head_dim),
                  **DEFAULT_SWITCHES[head_dim])
    if head_dim == 256:  # serial steps (S is dead while P V runs); P V in four slices of d, two temporaries
        return Fp8Config(**common, pingpong=True, intra_wg_overlap=False, pv_split=4, pv_buffers=2)
    if head_dim == 128:  # tile_n 256: S (128) + O (64) + temporary (64) need S dead during P V: serial steps
        return Fp8Config(**common, intra_wg_overlap=False)
    if head_dim == 64:  # three consumer warpgroups (tile_m 192), tile_n 192: serial steps (measured faster)
        return Fp8Config(**common, intra_wg_overlap=False)
    return Fp8Config(**common)


DEFAULT_CONFIGS: dict[int, Fp8Config] = {d: _default(d) for d in HEAD_DIMS}

#: head dim -> the largest seqlen_k of a call that runs, without ``config=``, on fa3's persistent grid (one CTA per SM
#: walking query tiles; the next tile's loads under this tile's epilogue): a causal call with its tiles dealt by load
#: (``Sm90Config.balanced``, BALANCED_MAX_SEQLEN_K; and two or more query tiles per head), a non-causal one in the static
#: order (PERSISTENT_MAX_SEQLEN_K); both only when there are more query tiles (x heads x batch) than SMs (fa3's rule for
#: its short calls, ``hopper.fa3.short_config``). Session 22, H200, scripts/fp8persist_gpu.sh (paired, 6 rounds, B*N =
#: 16k, H*D = 2048; bench/NOTES.md): balanced / default at causal D 64 N 1k / 2k / 4k / 8k 1.125 / 1.092 / 1.047 /
#: 1.014 (same), D 128 1.142 / 1.102 / 1.019 (same) / 0.996 (same); persistent / default non-causal D 64 N 1k / 2k / 4k
#: 1.058 / 1.022 / 0.992 (same), D 128 1.090 / 1.048 / 1.019 / 1.004 (same) at N 8k; the largest N "faster" with no
#: smaller N "slower" is each limit. At D 256 the persistent grid runs at about half speed (not listed).
#: FA_VARIANTS_FP8_PERSISTENT=0 turns both off; =all takes them at every head dim and seqlen_k (tests, sanitizers).
BALANCED_MAX_SEQLEN_K: dict[int, int] = {64: 4096, 128: 2048}
PERSISTENT_MAX_SEQLEN_K: dict[int, int] = {64: 2048, 128: 4096}
PERSISTENT = env.flag_or("FA_VARIANTS_FP8_PERSISTENT", True, ("all",))


@functools.cache
def persistent_config(config: Fp8Config, causal: bool) -> Fp8Config:
    """config on the persistent grid: balanced when causal (tile costs differ), the static order otherwise (one object
    per config: the compile cache's keys)."""
    return dataclasses.replace(config, persistent=True, balanced=causal)


def _named(head_dim: int, causal: bool) -> bool:
    """Whether call_config may put a call at head_dim on the persistent grid (the switch and the tables)."""
    table = BALANCED_MAX_SEQLEN_K if causal else PERSISTENT_MAX_SEQLEN_K
    return bool(PERSISTENT) and (PERSISTENT == "all" or head_dim in table)


def _warm_configs(arch: str, head_dim: int, causal: bool, groups: tuple[int, ...] = ()) -> tuple:
    """The configs besides the default that ``call_config`` may give a call (``fa-variants warmup`` compiles them)."""
    return (persistent_config(DEFAULT_CONFIGS[head_dim], causal),) if _named(head_dim, causal) else ()


def call_config(q8: torch.Tensor, k8: torch.Tensor, causal: bool, config: Fp8Config | None = None) -> Fp8Config:
    """The config a call of q8 (batch, seqlen_q, num_heads, head_dim), k8 runs: ``config``, else the head dim's
    default, on the persistent grid where ``BALANCED_MAX_SEQLEN_K`` (causal: balanced, when its tile table exists or
    can be made, i.e. not first inside CUDA graph capture) or ``PERSISTENT_MAX_SEQLEN_K`` (not causal) say so."""
    if config is not None:
        return config
    batch, seqlen_q, heads, head_dim = q8.shape
    seqlen_k = k8.shape[1]
    base = DEFAULT_CONFIGS[head_dim]
    if not _named(head_dim, causal) or (causal and seqlen_q <= base.tile_m):
        return base
    limit = seqlen_k if PERSISTENT == "all" else (BALANCED_MAX_SEQLEN_K if causal else PERSISTENT_MAX_SEQLEN_K)[head_dim]
    if not 0 < seqlen_k <= limit:
        return base
    tiles = -(-seqlen_q // base.tile_m) * heads * batch
    persistent = persistent_config(base, causal)
    if tiles <= fa3._sm_count(q8) or (causal and not fa3.table_allowed(
            persistent, q8, k8, causal, tiles, l2_section_heads(seqlen_k, head_dim, elem_bytes=1))):
        return base
    return persistent


def _launch_tail(config: Fp8Config, q8: torch.Tensor, k8: torch.Tensor, causal: bool, l2_heads: int) -> tuple:
    """The kernel's arguments after l2_heads: the persistent grid's CTA count (the SMs) and the balanced tile
    table (``hopper.fa3.balanced_table`` with this kernel's L2 section of e4m3 K/V)."""
    tail = ()
    if config.persistent:
        tail += (fa3._sm_count(q8),)
    if config.balanced:
        tail += (fa3.balanced_table(config, q8, k8, causal, l2_heads),)
    return tail


# ---------------------------------------------------------------------------------------------
# Registration with the compile cache, and the backend entry point (the kernel: hopper/fa3_fp8_kernel.py)
# ---------------------------------------------------------------------------------------------


def fake_fp8_args(head_dim: int, out_dtype: str, align: int = 16):
    """Fake arguments of ``FlashAttention3Fp8Sm90.__call__`` (compile without a GPU)."""
    from cutlass.cute.runtime import make_fake_stream

    b, nq, nk, nkp, h, hkv, mb, nb = (cute.sym_int() for _ in range(8))
    q = interop.fake_tensor("e4m3", (b, nq, h, head_dim), align)
    k = interop.fake_tensor("e4m3", (b, nk, hkv, head_dim), align)
    vt = interop.fake_tensor("e4m3", (b, hkv, head_dim, nkp), align)
    o = interop.fake_tensor(out_dtype, (b, nq, h, head_dim), align)
    lse = interop.fake_tensor("fp32", (b, h, nq), 4)
    qd = interop.fake_tensor("fp32", (b, h, mb), 4)
    kd = interop.fake_tensor("fp32", (b, hkv, nb), 4)
    vd = interop.fake_tensor("fp32", (b, hkv, nb), 4)
    return q, k, vt, o, lse, qd, kd, vd, Float32(1.0), Int32(1), make_fake_stream(use_tvm_ffi_env_stream=True)


def _build(cfg: StaticConfig):
    from fa_variants.hopper import fa3_fp8_kernel  # imports this module (P_SHIFT, Fp8Config)

    config = cfg.config
    kind = fa3_fp8_kernel.FlashAttention3Fp8Sm90
    if config.persistent:
        kind = fa3_fp8_kernel.FlashAttention3Fp8Sm90Balanced if config.balanced else fa3_fp8_kernel.FlashAttention3Fp8Sm90Persistent
    kernel = kind(interop.cute_dtype(config.out_dtype), cfg.head_dim, cfg.causal, config)
    args = fake_fp8_args(cfg.head_dim, config.out_dtype, cfg.align)
    if config.persistent:  # + the grid's CTA count after l2_heads (and the balanced tile table): _launch_tail
        extra = (Int32(1),)
        if config.balanced:
            extra += (interop.fake_tensor("int32", (cute.sym_int(),), 4),)
        args = args[:-1] + extra + args[-1:]
    return kernel, args


# How to compile the kernel (`fa-variants compile --variant fa3-fp8`); the registry's fa3-fp8 record
# (fa_variants.fp8.fa3_fp8) adds the call, which quantises (its launch takes descales: run_quantized).
VARIANT = Variant(
    "fa3-fp8", archs=("sm_90a",), dtypes=(E4M3,), head_dims=HEAD_DIMS,
    default_config=lambda arch, head_dim, causal: DEFAULT_CONFIGS[head_dim],
    check_config=lambda config, arch, head_dim: config.check(head_dim) or config, build=_build,
    warm_configs=_warm_configs)


def _kernel(device: torch.device, head_dim: int, causal: bool, out_dtype: torch.dtype, config: Fp8Config | None):
    """The compiled kernel and its config; config None: the head dim's default, resolved before the cache so that
    the cache's key holds the config it compiles (not None for whatever DEFAULT_CONFIGS held first)."""
    return _compiled_kernel(device, head_dim, causal, out_dtype, config or DEFAULT_CONFIGS[head_dim])


@functools.lru_cache(maxsize=None)
def _compiled_kernel(device: torch.device, head_dim: int, causal: bool, out_dtype: torch.dtype, config: Fp8Config):
    tiles = dataclasses.replace(config, out_dtype=interop.dtype_name(out_dtype))
    cfg = VARIANT.static_config(interop.device_arch(device), "e4m3", head_dim, causal, tiles)
    return VARIANT.compiled(cfg).fn, tiles


def _flip_sign(x8: torch.Tensor) -> torch.Tensor:
    """-x for e4m3 (the sign bit; exact, NaN stays NaN)."""
    return (x8.view(torch.uint8) ^ 0x80).view(E4M3)


def run_quantized(q8: torch.Tensor, k8: torch.Tensor, v_t8: torch.Tensor, q_descale: torch.Tensor,
                  k_descale: torch.Tensor, v_descale: torch.Tensor, *, softmax_scale: float, causal: bool,
                  out_dtype: torch.dtype = torch.bfloat16, config: Fp8Config | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """fa3-fp8 forward on already-quantised inputs (sm90 GPU).

    Args:
        q8: e4m3 (batch, seqlen_q, num_heads, head_dim); k8: e4m3 (batch, seqlen_k, num_heads_kv, head_dim).
        v_t8: e4m3 (batch, num_heads_kv, head_dim, seqlen_k_padded), tokens contiguous and permuted by
            ``fa_variants.fp8.layout.v_token_order``; seqlen_k_padded = ``layout.padded_seqlen_k(seqlen_k)``
            (or more, a multiple of 16), padding tokens zero.
        q_descale: float32 (batch, num_heads, cdiv(seqlen_q, TILE_M)); k_descale, v_descale: float32
            (batch, num_heads_kv, cdiv(seqlen_k, tile_n)), tile_n the config's (default ``layout.tile_n(head_dim)``):
            one descale per kernel tile; finite and > 0 (expanded views fine).
            Dequantised x = x8 * descale of its block.
        softmax_scale: finite; causal: bottom-right; out_dtype: torch.float16 or torch.bfloat16.
        config: tile/switch override (tests, ablation: two_level); default ``call_config``'s (the head dim's default, or it
            on the persistent grid for the short calls ``BALANCED_MAX_SEQLEN_K`` / ``PERSISTENT_MAX_SEQLEN_K`` name).
    Returns:
        (out, lse): out (batch, seqlen_q, num_heads, head_dim) out_dtype; lse float32 (batch, num_heads,
        seqlen_q), natural log of sum_j exp(softmax_scale * q_i . k_j) (dequantised); a row that sees
        no key: O = 0, LSE = -inf.
    Raises:
        ValueError: a dtype, shape, head_dim or scale the kernel cannot take (the argument is named).
    """
    for name, t in (("q8", q8), ("k8", k8), ("v_t8", v_t8)):
        if t.dtype != E4M3:
            raise ValueError(f"fa3-fp8: {name} must be torch.float8_e4m3fn, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"fa3-fp8: {name} must be 4-D, got shape {tuple(t.shape)}")
    batch, seqlen_q, heads, head_dim = q8.shape
    seqlen_k, heads_kv = k8.shape[1], k8.shape[2]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"fa3-fp8: head_dim {head_dim} is not supported; supported head dims: {HEAD_DIMS}")
    if k8.shape[0] != batch or k8.shape[3] != head_dim:
        raise ValueError(f"fa3-fp8: k8 shape {tuple(k8.shape)} does not match q8 {tuple(q8.shape)}")
    if heads_kv == 0 or heads % heads_kv:
        raise ValueError(f"fa3-fp8: num_heads {heads} is not divisible by num_heads_kv {heads_kv}")
    n_pad = v_t8.shape[3]
    if v_t8.shape[:3] != (batch, heads_kv, head_dim) or n_pad < seqlen_k or n_pad % layout.K_ALIGN_TOKENS:
        raise ValueError(f"fa3-fp8: v_t8 must be (batch, num_heads_kv, head_dim, seqlen_k padded to a multiple of "
                         f"{layout.K_ALIGN_TOKENS}) = ({batch}, {heads_kv}, {head_dim}, {layout.padded_seqlen_k(seqlen_k)}), "
                         f"got {tuple(v_t8.shape)}")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"fa3-fp8: out_dtype {out_dtype} is not supported; supported: {OUT_DTYPES}")
    if not math.isfinite(softmax_scale):
        raise ValueError(f"fa3-fp8: softmax_scale must be finite, got {softmax_scale}")
    cfg = call_config(q8, k8, causal, config)
    bn = cfg.tile_n
    for name, t, shape, rows in (("q_descale", q_descale, (batch, heads, -(-seqlen_q // layout.TILE_M)), f"{layout.TILE_M} query rows"),
                                 ("k_descale", k_descale, (batch, heads_kv, -(-seqlen_k // bn)), f"tile_n={bn} keys"),
                                 ("v_descale", v_descale, (batch, heads_kv, -(-seqlen_k // bn)), f"tile_n={bn} keys")):
        if t.dtype != torch.float32 or tuple(t.shape) != shape:
            raise ValueError(f"fa3-fp8: {name} must be float32 of shape {shape} (one descale per {rows}), "
                             f"got {t.dtype} {tuple(t.shape)}")
    kernel, _ = _kernel(q8.device, head_dim, bool(causal), out_dtype, cfg)
    out = torch.empty((batch, seqlen_q, heads, head_dim), dtype=out_dtype, device=q8.device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q8.device)
    if out.numel() == 0:
        return out, lse
    if seqlen_k == 0:
        return out.zero_(), lse.fill_(-math.inf)
    if -(-seqlen_q // layout.TILE_M) * heads * batch >= 2**31:
        raise ValueError(f"fa3-fp8: {batch} x {heads} x ceil({seqlen_q}/{layout.TILE_M}) CTAs exceed the grid limit 2^31 - 1")
    if softmax_scale < 0:  # the kernel's row max of raw scores needs a scale >= 0: softmax(c Q K^T) = softmax(|c| Q (-K)^T)
        k8, softmax_scale = _flip_sign(k8), -softmax_scale
    q8, k8, v_t8 = (_tma_operand(t) for t in (q8, k8, v_t8))
    l2_heads = l2_section_heads(seqlen_k, head_dim, elem_bytes=1)
    kernel(q8, k8, v_t8, out, lse, q_descale, k_descale, v_descale, softmax_scale * LOG2_E, l2_heads,
           *_launch_tail(cfg, q8, k8, causal, l2_heads))
    return out, lse


def run_fp8(inputs, *, causal: bool, out_dtype: torch.dtype = torch.bfloat16,
            config: Fp8Config | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fa3-fp8 forward on an ``FP8Inputs`` (the FP8 contract: fields q, k, v_t, q_descale, k_descale,
    v_descale, softmax_scale). Returns (out, lse) as :func:`run_quantized`; the LSE is that of the
    logits the kernel sees (a caller that smoothed K adds its shift).

    Raises ValueError when the inputs' block heights are not the kernel's: ``inputs.block_m`` must be
    ``layout.TILE_M`` and ``inputs.block_n`` the config's tile_n (the kernel reads one K/V descale per tile)."""
    cfg = config or DEFAULT_CONFIGS.get(inputs.head_dim)
    block_m, block_n = getattr(inputs, "block_m", layout.TILE_M), getattr(inputs, "block_n", None)
    if cfg is not None and (block_m != layout.TILE_M or block_n != cfg.tile_n):
        raise ValueError(f"fa3-fp8: inputs quantised with blocks of {block_m} query rows and {block_n} keys, but the "
                         f"kernel (head_dim {inputs.head_dim}, tile_n={cfg.tile_n}) needs {layout.TILE_M} and "
                         f"{cfg.tile_n}: quantise for this kernel (fa_variants.fp8.quantize_fp8 uses its default "
                         f"tiles, layout.KERNEL_TILES) or pass a config with tile_n={block_n}")
    return run_quantized(inputs.q, inputs.k, inputs.v_t, inputs.q_descale, inputs.k_descale, inputs.v_descale,
                         softmax_scale=inputs.softmax_scale, causal=causal, out_dtype=out_dtype, config=config)
