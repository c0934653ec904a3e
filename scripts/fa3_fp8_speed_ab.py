"""fa3-fp8 A/B on one sm90 GPU (issue 10): the new per-head_dim defaults against the old ones, the single
accumulator (the two-level cost), our bf16 fa3 and flash-attn-4 (bf16), in one process; then the accuracy of
the new defaults (kernel vs emulation, both vs float64); then the summary with the issue's targets and this
change's pass criteria.

Speed: B*N = 16k, H*D = 2048 (the project's benchmark shape), head_dim 64/128/256, N 4k/16k, causal and not.
The FP8 kernel runs alone on inputs already quantised (random e4m3, block descales of the variant's tile_n).
Each problem is timed in ``--rounds`` rounds (default 6); each round runs every implementation once, in an
order rotated by one per round, ``--iters`` calls between two CUDA events after one warm-up call (``--protocol
paired``: fa_variants.bench.paired's bursts instead, as in scripts/fa3_speed_ab.py, with an A/A control). Reported:
the median over rounds, TFLOP/s = 4 B H N^2 D (halved when causal), the spread (max - min) / median, and per
problem the ratios new / bf16 fa3, new / old, new / flash-attn-4 and the two-level cost (single / new - 1).

Compiles (``--phase precompile``, or first in ``all``): every kernel the A/B and tests/test_fa3_fp8_gpu.py use
is compiled by ``--jobs`` worker processes (each runs it once on tiny inputs, which stores it in the on-disk
compile cache, ``fa_variants.common.diskcache``); the later processes load them.

Accuracy (``--errors``, on): new defaults, default recipe (``quantize_fp8``) on N(0, 1) inputs, B=1, H=4,
N=2048, causal and not: rel-L2 of the kernel vs ``emulate_fp8_attention`` (default block-FP model, and the
"truncate" model for comparison), max LSE difference, rel-L2 of both vs float64; at head_dim 128 also the
emulation vs float64 with the old 128-key K/V scale blocks (what the 256-key blocks cost in accuracy).
``--test-stats FILE``: the JSON lines tests/test_fa3_fp8_gpu.py wrote (FA_VARIANTS_FP8_STATS), summarised.

    python3 scripts/fa3_fp8_speed_ab.py --plan       (what would run; no GPU needed)
    python3 scripts/fa3_fp8_speed_ab.py --quick      (D=128, N=4k, non-causal, 3 rounds: a smoke run)

Writes <out>/speed.jsonl, <out>/errors.jsonl, <out>/summary.md; prints the summary at the end.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

import torch

E4M3 = torch.float8_e4m3fn
# fa3_fp8.NO_LOOKAHEAD (not imported here: the kernel module loads the CuTe DSL): the head_dim 256 default's serial
# steps (s_lookahead and s_halves off), for variants whose changes the lookahead refuses, and "old" in fp8d256
NO_LOOKAHEAD = dict(s_lookahead=False, s_halves=False, fused_promote=False, bounded_units=False)
# the head_dim 64 default before session 6's tn192s_c4 flip (192 x 128 tiles, intra-warpgroup overlap, one chain):
# the base of the 64 variants named before it, so they keep timing what they did
PRE64 = dict(tile_n=128, intra_wg_overlap=True, reduce_chains=1)

# Variants of the FP8 kernel per head_dim: name -> changes to fa3_fp8.DEFAULT_CONFIGS[head_dim]. "new" is the
# default (tiles from fa_variants.fp8.layout.KERNEL_TILES); "old" the default before it (128 x 128 with overlap at
# 64 and 128, overlap at 128, P V in two slices with one temporary at 256); "single" one running accumulator.
VARIANTS: dict[int, dict[str, dict]] = {
    64: {"new": {}, "old": dict(tile_m=128, **PRE64), "single": dict(two_level=False)},
    128: {"new": {}, "old": dict(tile_n=128, intra_wg_overlap=True), "single": dict(two_level=False)},
    256: {"new": {}, "old": dict(pv_split=2, pv_buffers=1, **NO_LOOKAHEAD),
          "single": dict(two_level=False, pv_split=1, pv_buffers=1, **NO_LOOKAHEAD)},
}
# --set fp8speed (session 4): the speed switches of issue 10, each off by default, beside the
# current default ("new") and the single accumulator ("single": the two-level cost). early: early_pv_arrive (the
# ping-pong turn handed on right after the P V GEMM's issue: the drain and the promotion leave the turn); skip:
# skip_unit_rescale (no O *= alpha when no row max of the thread moved: the promotion is one FFMA per element);
# promote4: promote_every=4.
SPEED_VARIANTS: dict[int, dict[str, dict]] = {
    64: {"new": {}, "single": dict(two_level=False), "skip": dict(skip_unit_rescale=True),
         "promote4": dict(promote_every=4)},
    128: {"new": {}, "single": dict(two_level=False), "early": dict(early_pv_arrive=True),
          "skip": dict(skip_unit_rescale=True), "early_skip": dict(early_pv_arrive=True, skip_unit_rescale=True)},
    256: {"new": {}, "single": dict(two_level=False, pv_split=1, pv_buffers=1, **NO_LOOKAHEAD),
          "single_early": dict(two_level=False, pv_split=1, pv_buffers=1, early_pv_arrive=True, **NO_LOOKAHEAD),
          "early": dict(early_pv_arrive=True, **NO_LOOKAHEAD), "skip": dict(skip_unit_rescale=True),
          "early_skip": dict(early_pv_arrive=True, skip_unit_rescale=True, **NO_LOOKAHEAD)},
}
# --set fp8flip (session 5): the session-5 defaults ("new": skip_unit_rescale on everywhere,
# promote_every 4 at head_dim 64) against the previous ones ("old"), the descale_prefetch switch (off), and the single
# accumulator (the two-level cost); at 256 also the single accumulator with intra-warpgroup overlap (its registers
# fit without a temporary: how fast the shared part of the kernel gets).
FLIP_VARIANTS: dict[int, dict[str, dict]] = {
    64: {"new": {}, "old": dict(promote_every=1, skip_unit_rescale=False), "prefetch": dict(descale_prefetch=True),
         "single": dict(two_level=False)},
    128: {"new": {}, "old": dict(skip_unit_rescale=False), "prefetch": dict(descale_prefetch=True),
          "single": dict(two_level=False)},
    256: {"new": {}, "old": dict(skip_unit_rescale=False, **NO_LOOKAHEAD),
          "prefetch": dict(descale_prefetch=True, **NO_LOOKAHEAD),
          "single": dict(two_level=False, pv_split=1, pv_buffers=1, **NO_LOOKAHEAD),
          "single_overlap": dict(two_level=False, pv_split=1, pv_buffers=1, intra_wg_overlap=True, **NO_LOOKAHEAD)},
}
# --set fp8small (session 6): head_dim 64 and 128 only. c4: reduce_chains=4 (the row max in
# four FMNMX chains and, new in the block-scaled softmax, the row sum in four FADD chains: the loop's latency path,
# read in the SASS, 562 -> 474 cycles at 64 and 694 -> 510 at 128, same instruction counts); pf: descale_prefetch;
# skip: skip_unit_rescale; tn192s (64): 192 x 192 tiles, serial steps (three warpgroups; with
# intra-warpgroup overlap, or with descale_prefetch when causal, that tile spills); m192 (128): 192 x 128 tiles,
# serial steps, three consumer warpgroups of 160 registers (no spills: the two-level temporary fits because S is
# dead during P V; with pv_split 2 it spills); early: early_pv_arrive; s2 (128): P V in two slices of d with two
# temporaries (pv_split 2, pv_buffers 2: slice 0 is promoted while slice 1 runs; the promotion is inside the
# ping-pong turn in serial steps); single*: one running accumulator with the same switches (the two-level cost).
# A variant whose tile_n is not the default's gets K/V scale blocks of its tile_n.
FP8SMALL_VARIANTS: dict[int, dict[str, dict]] = {
    64: {"new": {}, "pre": dict(PRE64), "c4": dict(PRE64, reduce_chains=4),
         "c4_pf": dict(PRE64, reduce_chains=4, descale_prefetch=True),
         "tn192s_c4": dict(tile_n=192, intra_wg_overlap=False, reduce_chains=4),
         "single_c4_pf": dict(PRE64, two_level=False, reduce_chains=4, descale_prefetch=True)},
    128: {"new": {}, "c4": dict(reduce_chains=4),
          "m192_c4": dict(tile_m=192, tile_n=128, reduce_chains=4),
          "m192_c4_skip": dict(tile_m=192, tile_n=128, reduce_chains=4, skip_unit_rescale=True),
          "m192_c4_early": dict(tile_m=192, tile_n=128, reduce_chains=4, early_pv_arrive=True),
          "c4_s2": dict(reduce_chains=4, pv_split=2, pv_buffers=2),
          "single_c4": dict(two_level=False, reduce_chains=4),
          "single_m192_c4": dict(two_level=False, tile_m=192, tile_n=128, reduce_chains=4)},
}
# --set fp8d256 (session 6): head_dim 256 schedules that keep two-level accumulation. new: the
# default since that run (128 x 128, s_lookahead with s_halves: S as two 64-key halves in the two temporaries'
# registers, half 0 issued after the slice before the last, the last slice promoted under it; the run's
# "look128_halves"); old: the serial default before (NO_LOOKAHEAD). lookNN: s_lookahead (the next S GEMM issued in the
# P V turn, before the last slice's promotion) with tile_n NN; _p8: P V in eight slices of d (pv_split 8); _stK: K
# K/V stages; serial64: tile_n 64 with the old schedule (what the tile alone does); single*: one running accumulator
# (single_overlap: intra-warpgroup overlap, the fastest of session 5).
D256_VARIANTS: dict[int, dict[str, dict]] = {
    256: {"new": {}, "old": dict(NO_LOOKAHEAD), "look64": dict(tile_n=64, s_lookahead=True, s_halves=False),
          "look64_st4": dict(tile_n=64, s_lookahead=True, s_halves=False, stages=4),
          "look96_p8": dict(tile_n=96, s_lookahead=True, s_halves=False, pv_split=8),
          "look96_p8_st3": dict(tile_n=96, s_lookahead=True, s_halves=False, pv_split=8, stages=3),
          "serial64": dict(tile_n=64, **NO_LOOKAHEAD),
          "single_overlap": dict(two_level=False, pv_split=1, pv_buffers=1, intra_wg_overlap=True, **NO_LOOKAHEAD),
          "single64_overlap": dict(tile_n=64, two_level=False, pv_split=1, pv_buffers=1, intra_wg_overlap=True,
                                   **NO_LOOKAHEAD)},
}
# --set fp8d256b (session 7): what the S GEMM as two 64-key MMAs costs (the default's s_halves:
# Q read from shared memory twice, 128 B/clk of operand reads per k32 step against 96 for one 128-key MMA). new: the
# default; old: the serial two-level default before it (S in one MMA); old_halves: old with S in two halves;
# single: one running accumulator, serial steps (old without the slices and promotions: with old, what the promotions
# cost in that schedule); single_overlap: one running accumulator with intra-warpgroup overlap (the two-level cost's
# reference); single_overlap_halves: the same with S in two halves. The names and changes are tests/test_fa3_fp8_lookahead_gpu.py's.
D256B_VARIANTS: dict[int, dict[str, dict]] = {
    256: {"new": {}, "old": dict(NO_LOOKAHEAD), "old_halves": dict(NO_LOOKAHEAD, s_halves=True),
          "single": dict(two_level=False, pv_split=1, pv_buffers=1, **NO_LOOKAHEAD),
          "single_overlap": dict(D256_VARIANTS[256]["single_overlap"]),
          "single_overlap_halves": dict(two_level=False, pv_split=1, pv_buffers=1, intra_wg_overlap=True,
                                        **{**NO_LOOKAHEAD, "s_halves": True})},
}
# --set fp8mid (session 7): the P V GEMM of a warpgroup overlapped with its own softmax at head_dim
# 128 and 64. ovNNN: intra-warpgroup overlap, tile_n NNN (the SASS has the P V GEMM's wait before the exponentials:
# no overlap); m192: 192 query rows; lookNNNh: the head_dim 256 lookahead schedule (s_lookahead with S as two halves
# in the two P V temporaries); c4: reduce_chains=4; m192_c4: session 6's serial 192 x 128; single*: one running
# accumulator (the two-level cost).
# A variant whose tile_n is not the default's gets K/V scale blocks of its tile_n.
_LOOK = dict(s_lookahead=True, pv_buffers=2, pv_split=2, s_halves=True, reduce_chains=4)
FP8MID_VARIANTS: dict[int, dict[str, dict]] = {
    64: {"new": {}, "ov128_c4": dict(PRE64, reduce_chains=4),
         "single_c4": dict(two_level=False, reduce_chains=4)},
    128: {"new": {}, "ov128_c4": dict(tile_n=128, intra_wg_overlap=True, reduce_chains=4),
          "m192_c4": dict(tile_m=192, tile_n=128, reduce_chains=4), "look128h_c4": dict(_LOOK, tile_n=128),
          "m192_look128h_c4": dict(_LOOK, tile_m=192, tile_n=128),
          "single_m192_c4": dict(two_level=False, tile_m=192, tile_n=128, reduce_chains=4)},
}
# --set fp8d128 (session 7): the best two-level 128 schedule of fp8mid (m192_look128h_c4: 192 x 128,
# s_lookahead with S in two halves) lost at N 4k causal (694 against the default's 727 TFLOP/s) because 4096 is not a
# multiple of 192: the last query tile holds 64 rows but, under causal masking, is the longest one (all 32 K/V tiles).
# tail: q_tail_first (the partial tile first, where it is the shortest; causal only, a non-causal call is unchanged);
# skip: skip_unit_rescale. 64: m128_tn256 = 128 x 256 serial (two warpgroups); tn128_tail = 192 x 128 serial with
# q_tail_first (with tile_n = tile_m = 192 the shift gains nothing: the key tiles stay aligned at 0, so the diagonal
# tiles after the shift waste what the partial tile did; at 192 x 128 the shifted diagonal falls on a key tile edge).
# Session 8: q_tail_first's tile 0 starts at row 0 (session 7's started at row -shift: "illegal instruction" in every
# causal call); session 8's fp8d128 run timed head_dim 128 only (--head-dims 128) and GPU-tested tn128_tail beside it
# (FP8D128_TEST_KERNELS).
FP8D128_VARIANTS: dict[int, dict[str, dict]] = {
    64: {"new": {}, "m128_tn256": dict(tile_m=128, tile_n=256),
         "tn128_tail": dict(tile_n=128, q_tail_first=True)},
    128: {"new": {}, "m192_look128h_c4": dict(FP8MID_VARIANTS[128]["m192_look128h_c4"]),
          "m192_look128h_c4_tail": dict(FP8MID_VARIANTS[128]["m192_look128h_c4"], q_tail_first=True),
          "m192_look128h_c4_tail_skip": dict(FP8MID_VARIANTS[128]["m192_look128h_c4"], q_tail_first=True,
                                             skip_unit_rescale=True)},
}
# --set fp8two (session 8): the two-level cost at head_dim 256. new: the default (two-level,
# s_lookahead with S in two halves; since session 9 fused_promote with reduce_chains 2, session 8's "fused_c2": O kept
# in units of v_descale, O *= alpha folded into the promotion, O = alpha' O + tmp, one FFMA per element, no FMUL block
# before the turn; the row max / row sum chains 33 / 31 -> 18 / 16 deep); fused: fused_promote with one chain; old: the
# default before session 9 (skip_unit_rescale, no fused_promote); single_overlap: one running accumulator with
# intra-warpgroup overlap and one chain (the two-level cost's reference, the kernel session 8 timed). The names and
# changes are tests/test_fa3_fp8_speed_gpu.py's FP8TWO_VARIANTS.
FP8TWO_VARIANTS: dict[int, dict[str, dict]] = {
    256: {"new": {}, "fused": dict(reduce_chains=1), "old": dict(fused_promote=False, bounded_units=False, reduce_chains=1),
          "single_overlap": dict(D256_VARIANTS[256]["single_overlap"], reduce_chains=1)},
}
# --set fp8turn (session 9 round 2; its two ping-pong-turn variants measured slower and were removed in session 11): the
# head_dim 256 two-level cost against both references. new: the default (two-level, s_lookahead with S in two halves,
# fused_promote, reduce_chains 2); single_overlap: one running accumulator with intra-warpgroup overlap and one chain
# (session 8's reference); single_overlap_c2: the same with reduce_chains 2 (the default's chains: the fair reference);
# single_overlap_noskip (session 11): single_overlap with skip_unit_rescale off (O *= alpha on
# every tile, as the default's promotion FFMA is: is the skip the two-level cost?).
FP8TURN_VARIANTS: dict[int, dict[str, dict]] = {
    256: {"new": {}, "single_overlap": dict(D256_VARIANTS[256]["single_overlap"], reduce_chains=1),
          "single_overlap_c2": dict(D256_VARIANTS[256]["single_overlap"], reduce_chains=2),
          "single_overlap_noskip": dict(D256_VARIANTS[256]["single_overlap"], reduce_chains=1, skip_unit_rescale=False)},
}
# --set fp8persist (session 22): fa3-fp8 on fa3's persistent grid. new: the default (one CTA per query tile);
# persist: persistent=True (one CTA per SM walks tiles b, b + G, ...: the next tile's Q/K/V loads under this tile's
# epilogue); balanced: persistent with the tiles dealt by load (Sm90Config.balanced; causal costs from the host's table,
# the bf16 causal default up to BALANCED_MAX_SEQLEN_K since session 18).
# At 256 also the serial steps (NO_LOOKAHEAD; session 22, CPU: the lookahead loop spills O on the persistent grid,
# 384-512 B, the serial steps do not): serial on one CTA per tile, and on both persistent grids.
PERSIST = dict(persistent=True)
FP8PERSIST_VARIANTS: dict[int, dict[str, dict]] = {
    D: {"new": {}, "persist": PERSIST, "balanced": dict(PERSIST, balanced=True)} for D in (64, 128, 256)}
FP8PERSIST_VARIANTS[256].update(serial=NO_LOOKAHEAD, persist_serial=dict(PERSIST, **NO_LOOKAHEAD),
                                balanced_serial=dict(PERSIST, balanced=True, **NO_LOOKAHEAD))
# At 128 also 128-key K/V tiles on the balanced grid (twice the K/V tiles of a causal row: the last, masked ones
# cheaper), serial (tn128) and with intra-warpgroup overlap (tn128ov, the 128 default before session 7); inputs
# quantised with 128-key K/V blocks (fp8_inputs at the variant's tile_n). CPU: both compile without spills.
FP8PERSIST_VARIANTS[128].update(balanced_tn128=dict(PERSIST, balanced=True, tile_n=128),
                                balanced_tn128ov=dict(PERSIST, balanced=True, tile_n=128, intra_wg_overlap=True))
# session 27: the softmax's huge-logit check only where |m| can reach 2^11 (Fp8Config.huge_guard; predicted guard / new
# 1.03-1.05, the check's measured cost; a no-op at 256, whose check runs per row)
# huge_guard: on in the head_dim 64 default since session 28, so "checked" (the check on every tile) keeps the A/B there;
# the 128 default has huge_hoisted since session 29, which refuses huge_guard: both variants turn it off ("new" is then
# the hoisted default at 128)
FP8GUARD_VARIANTS: dict[int, dict[str, dict]] = {D: {"new": {}, "guard": dict(huge_guard=True, huge_hoisted=False),
                                                     "checked": dict(huge_guard=False, huge_hoisted=False)}
                                                 for D in (64, 128)}
# session 29: the huge-logit check decided once per warpgroup before its free K/V tiles (Fp8Config.huge_hoisted; predicted
# hoist / new 1.02-1.05 at 128 and 256 (the check's 3-5 % back on ordinary inputs), 1.00-1.02 at 64 (huge_guard there).
# Since the 128 flip "new" is the hoisted default there and "unhoisted" the one before; hoist turns huge_guard off (the
# pair is refused: Fp8Config.check)
FP8HOIST_VARIANTS: dict[int, dict[str, dict]] = {D: {"new": {}, "hoist": dict(huge_hoisted=True, huge_guard=False)}
                                                 for D in (64, 128, 256)}
FP8HOIST_VARIANTS[128]["unhoisted"] = dict(huge_hoisted=False)
# kernels tests/test_fa3_fp8_speed_gpu.py needs besides the timed ones (kind, head_dim, change), both causal modes
SPEED_TEST_KERNELS = [("bf16", 128, dict(intra_wg_overlap=False, early_pv_arrive=True))]
# kernels tests/test_fa3_fp8_speed_gpu.py -k "fp8d128 and tail" needs at any --head-dims (both causal modes): the serial
# 192 x 128 schedule with q_tail_first at 64, the fix's second code path
FP8D128_TEST_KERNELS = [("fp8", 64, FP8D128_VARIANTS[64]["tn128_tail"])]


class VariantSet(NamedTuple):
    """One ``--set``: its fa3-fp8 variants (head_dim -> name -> changes to fa3_fp8.DEFAULT_CONFIGS[head_dim]), the
    legend its summary.md starts with (names the variants), and what it times and which GPU script runs it (--help).
    speed: summarised by ``speed_summary`` (every set but "ab"); its GPU tests (tests/test_fa3_fp8_speed_gpu.py) run
    every timed variant in both causal modes, so its precompile builds those. per_variant_errors: the summary lists
    every variant's kernel-vs-emulation rel-L2 (a failing variant must not hide the others); two_level_targets: adds
    issue 10's targets with the best two-level variant. --head-dims is cut to the head dims of ``variants``."""

    variants: dict
    legend: str
    help: str
    speed: bool = True
    per_variant_errors: bool = False
    two_level_targets: bool = False


#: every --set: the argparser's choices, the summaries' legends and the per-set steps read this one table
SETS: dict[str, VariantSet] = {
    "ab": VariantSet(
        VARIANTS,
        "TFLOP/s, median of rounds (spread = (max - min) / median over rounds). new / old / single: fa3-fp8 "
        "(quantised inputs); bf16_fa3: ours; flash_attn_4: flash-attn-4 bf16.",
        "new vs old defaults (session 4)",
        speed=False),
    "fp8speed": VariantSet(
        SPEED_VARIANTS,
        "TFLOP/s, median of rounds (spread). fa3-fp8 on quantised inputs; new = the default then; single* = "
        "one running accumulator; early = early_pv_arrive; skip = skip_unit_rescale; promote4 = "
        "promote_every=4; bf16_fa3 = ours; flash_attn_4 = flash-attn-4 bf16.",
        "the speed switches (SPEED_VARIANTS, session 4)"),
    "fp8flip": VariantSet(
        FLIP_VARIANTS,
        "TFLOP/s, median of rounds (spread). fa3-fp8 on quantised inputs; new = the defaults "
        "(skip_unit_rescale on, promote_every 4 at head_dim 64); old = the defaults before (skip off, "
        "promote_every 1); prefetch = new + descale_prefetch; single* = one running accumulator "
        "(single_overlap: with intra-warpgroup overlap); bf16_fa3 = ours; flash_attn_4 = flash-attn-4 bf16.",
        "the session-5 defaults vs the previous ones and descale_prefetch (FLIP_VARIANTS, "
        "session 5)"),
    "fp8small": VariantSet(
        FP8SMALL_VARIANTS,
        "TFLOP/s, median of rounds (spread). fa3-fp8 on quantised inputs; new = the default (64: tn192s_c4 "
        "since session 6); pre = the 64 default before it (192 x 128, overlap), the base of 64's c4*; c4 = "
        "reduce_chains=4 (row max and row sum in 4 chains); pf = descale_prefetch; skip = skip_unit_rescale; "
        "early = early_pv_arrive; s2 = P V in two slices of d, two temporaries; tn192s = 192 x 192 serial; "
        "m192 = 192 x 128 serial, three warpgroups; single* = one running accumulator with the same switches; "
        "bf16_fa3 = ours; flash_attn_4 = flash-attn-4 bf16.",
        "head_dim 64/128 softmax chains, prefetch (FP8SMALL_VARIANTS, session 6)",
        two_level_targets=True),
    "fp8mid": VariantSet(
        FP8MID_VARIANTS,
        "TFLOP/s, median of rounds (spread). fa3-fp8 on quantised inputs (K/V scale blocks of the variant's "
        "tile_n); new = the default (128: 128 x 256 serial; 64: 192 x 192 serial, reduce_chains 4); ovNNN = "
        "intra-warpgroup overlap with tile_n NNN; m192 = 192 query rows; lookNNNh = s_lookahead, S as two "
        "halves; c4 = reduce_chains=4; single* = one running accumulator; bf16_fa3 = ours; flash_attn_4 = "
        "flash-attn-4 bf16.",
        "head_dim 64/128 P V overlap, lookahead (FP8MID_VARIANTS, session 7)",
        per_variant_errors=True, two_level_targets=True),
    "fp8d128": VariantSet(
        FP8D128_VARIANTS,
        "TFLOP/s, median of rounds (spread). fa3-fp8 on quantised inputs (K/V scale blocks of the variant's "
        "tile_n); new = the default (128: 128 x 256 serial; 64: 192 x 192 serial, reduce_chains 4); "
        "m192_look128h_c4 = 192 x 128, s_lookahead with S as two halves, reduce_chains 4; tail = q_tail_first "
        "(causal: the partial query tile first); skip = skip_unit_rescale; m128_tn256 = 128 x 256 serial; "
        "tn128 = tile_n 128 (192 x 128 serial); bf16_fa3 = ours.",
        "q_tail_first on the 192-row schedules, 128 x 256 at 64 (FP8D128_VARIANTS, "
        "session 7)",
        per_variant_errors=True, two_level_targets=True),
    "fp8d256": VariantSet(
        D256_VARIANTS,
        "TFLOP/s, median of rounds (spread). fa3-fp8 on quantised inputs (K/V scale blocks of the variant's "
        "tile_n); new = the default (two-level, 128 x 128, four P V slices, s_lookahead with S in two "
        "halves); old = the serial default before; lookNN = s_lookahead with tile_n NN (_p8: eight P V "
        "slices, _stK: K stages); serial64 = tile_n 64, old schedule; single* = one running accumulator with "
        "intra-warpgroup overlap; bf16_fa3 = ours; flash_attn_4 = flash-attn-4 bf16.",
        "head_dim 256 two-level schedules (D256_VARIANTS, session 6)"),
    "fp8d256b": VariantSet(
        D256B_VARIANTS,
        "TFLOP/s, median of rounds (spread). fa3-fp8 on quantised inputs, head_dim 256, 128 x 128 tiles; new "
        "= the default (two-level, four P V slices, s_lookahead with S in two 64-key halves); old = the "
        "serial two-level default before (S in one 128-key MMA); *_halves = the same with S in two 64-key "
        "MMAs (s_halves alone); single = one running accumulator, serial steps; single_overlap* = one running "
        "accumulator with intra-warpgroup overlap; bf16_fa3 = ours; flash_attn_4 = flash-attn-4 bf16.",
        "what S in two 64-key halves costs (D256B_VARIANTS, session 7)"),
    "fp8two": VariantSet(
        FP8TWO_VARIANTS,
        "TFLOP/s, median of rounds (spread). fa3-fp8 on quantised inputs, head_dim 256, 128 x 128 tiles; new "
        "= the default (two-level, four P V slices, s_lookahead with S in two halves, fused_promote: O in "
        "units of v_descale, O = alpha' O + tmp, one FFMA per element and tile; reduce_chains 2); fused = "
        "fused_promote with one chain; old = the default before session 9 (skip_unit_rescale, no fused_promote); "
        "single_overlap = one running accumulator with intra-warpgroup overlap; bf16_fa3 = ours.",
        "head_dim 256 fused_promote (FP8TWO_VARIANTS, session 8)",
        per_variant_errors=True, two_level_targets=True),
    "fp8turn": VariantSet(
        FP8TURN_VARIANTS,
        "TFLOP/s, median of rounds (spread). fa3-fp8 on quantised inputs, head_dim 256, 128 x 128 tiles; new "
        "= the default (two-level, four P V slices, s_lookahead with S in two halves, fused_promote, "
        "reduce_chains 2); single_overlap = one running accumulator with intra-warpgroup overlap, one chain (_c2: two "
        "chains, the fair reference; _noskip: skip_unit_rescale off, O *= alpha on every tile); bf16_fa3 = ours.",
        "head_dim 256 two-level cost against one running accumulator with one / two chains, with and without the "
        "unit-rescale skip (FP8TURN_VARIANTS, session 11)",
        per_variant_errors=True, two_level_targets=True),
    "fp8persist": VariantSet(
        FP8PERSIST_VARIANTS,
        "TFLOP/s, median of rounds (spread). fa3-fp8 on quantised inputs; new = the default (one CTA per query "
        "tile); persist = the persistent grid (one CTA per SM, static order); balanced = the persistent grid with the "
        "tiles dealt by load (causal costs); *serial (256) = the same with the serial steps (no lookahead); "
        "balanced_tn128* (128) = balanced with 128-key K/V tiles (ov: intra-warpgroup overlap); bf16_fa3 = ours (its default for the shape: the balanced grid at short "
        "causal calls); flash_attn_4 = flash-attn-4 bf16.",
        "fa3-fp8 on the persistent grid, static and balanced (FP8PERSIST_VARIANTS, session 22)",
        per_variant_errors=True),
    "fp8guard": VariantSet(
        FP8GUARD_VARIANTS,
        "TFLOP/s, median of rounds (spread). fa3-fp8 on quantised inputs; new = the default (huge_guard on at 64 since "
        "session 28, huge_hoisted at 128 since session 29); guard = Fp8Config.huge_guard (the check only where |m| can reach 2^11); checked = the check on "
        "every tile; bf16_fa3 = ours; "
        "flash_attn_4 = flash-attn-4 bf16.",
        "the huge-logit check guarded by a bound known before the row maxima (FP8GUARD_VARIANTS, session 27)",
        per_variant_errors=True),
    "fp8hoist": VariantSet(
        FP8HOIST_VARIANTS,
        "TFLOP/s, median of rounds (spread). fa3-fp8 on quantised inputs; new = the default (huge_guard at 64, "
        "huge_hoisted at 128 since session 29, the check per row at 256); unhoisted (128) = the check on every tile; "
        "hoist = Fp8Config.huge_hoisted (the check decided once per warpgroup, "
        "before its free K/V tiles); bf16_fa3 = ours; flash_attn_4 = flash-attn-4 bf16.",
        "the huge-logit check hoisted out of the free K/V tiles (FP8HOIST_VARIANTS, session 29)",
        per_variant_errors=True),
}


def check_sets(sets: dict) -> None:
    """ValueError naming the first set without variants, a legend or a help text (checked when the script loads)."""
    for name, vs in sets.items():
        for field in ("legend", "help"):
            if not isinstance(getattr(vs, field), str) or not getattr(vs, field).strip():
                raise ValueError(f"SETS[{name!r}]: {field} is empty")
        if not vs.variants:
            raise ValueError(f"SETS[{name!r}]: variants is empty")


check_sets(SETS)
# issue 10's targets: (head_dim, seqlen, causal or None for both, what, threshold)
TARGETS = [(256, 16384, False, "tflops", 1100.0), (128, None, False, "over_bf16", 1.4), (64, None, False, "over_bf16", 1.3),
           (None, None, None, "two_level_cost", 0.05)]
REL_L2_BOUND = 6e-3  # tests/test_fa3_fp8_gpu.py's kernel-vs-emulation bound


def kernel_config(head_dim: int, change: dict):
    from fa_variants.hopper import fa3_fp8

    return dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[head_dim], **change)


def bf16_config(head_dim: int, change: dict):
    """bf16 fa3's config with ``change`` (None for no change: fa3.run picks its default)."""
    if not change:
        return None
    from fa_variants.hopper import fa3

    return dataclasses.replace(fa3.DEFAULT_CONFIGS[head_dim], **change)


def bf16_shape_changes(D: int, causal: bool, seqlens) -> list[dict]:
    """The changes to fa3.DEFAULT_CONFIGS[D] of the configs bf16 fa3 picks by itself at the A/B's shapes (B*N = 16k,
    H*D = 2048; ``fa3._problem_config`` on empty CUDA tensors), without repeats; [] without seqlens."""
    if not seqlens:
        return []
    from fa_variants.hopper import fa3

    base = dataclasses.asdict(fa3.DEFAULT_CONFIGS[D])
    out = []
    for N in seqlens:
        q = torch.empty(max(1, 16384 // N), N, 2048 // D, D, device="cuda", dtype=torch.bfloat16)
        cfg = fa3._problem_config(None, q, q, causal) or fa3.default_config(fa3.ARCH, D, causal)
        change = {f: v for f, v in dataclasses.asdict(cfg).items() if v != base[f]}
        if change not in out:
            out.append(change)
    return out


def fp8_inputs(B: int, N: int, H: int, D: int, tile_n: int):
    """scripts/fa3_fp8_gpu.py's inputs (imported here, not at the top: it loads the DSL, which --plan needs not)."""
    from fa3_fp8_gpu import fp8_inputs as make

    return make(B, N, H, D, tile_n)


def _recipe(spec: tuple):
    from fa_variants.fp8 import FP8Config

    return FP8Config(*spec)


def _compile_one(job: tuple) -> str:
    """Worker: run one kernel once on tiny inputs (compiles it and stores it in the disk cache)."""
    kind, D, causal, change = job
    t0 = time.time()
    try:
        if kind == "recipe":  # quantisation pass + kernel, as tests/test_fa3_fp8_gpu.py calls them
            from fa_variants.fp8 import attention_fp8

            dtype, spec = change
            q = torch.randn(1, 300, 2, D, device="cuda", dtype=getattr(torch, dtype))
            attention_fp8(q, q[:, :200], q[:, :200], causal=causal, config=_recipe(spec))
        elif kind == "fp8":
            from fa_variants.hopper import fa3_fp8

            cfg = kernel_config(D, change)
            args = fp8_inputs(1, 256, 1, D, cfg.tile_n)
            fa3_fp8.run_quantized(*args, softmax_scale=D ** -0.5, causal=causal, config=cfg)
        else:
            from fa_variants.hopper import fa3

            q = torch.randn(1, 256, 1, D, device="cuda", dtype=torch.bfloat16)
            fa3.run(q, q, q, causal=causal, softmax_scale=D ** -0.5, config=bf16_config(D, change))
        torch.cuda.synchronize()
        return f"ok {kind} d{D} causal={causal} {change} {time.time() - t0:.1f}s"
    except Exception as exc:  # noqa: BLE001 - reported, the timing process retries in-process
        return f"FAILED {kind} d{D} causal={causal} {change}: {type(exc).__name__}: {str(exc)[:200]}"


# FP8Config fields (granularity, rotate, smooth_k, two_level) of the recipes tests/test_fa3_fp8_gpu.py runs
TEST_RECIPES = [(g, r, r, t) for g in ("block", "head", "tensor") for r in (True, False) for t in (True, False)]


def compile_jobs(head_dims, causals, tests: bool = True, variant_set: str = "ab", seqlens=()) -> list[tuple]:
    """The kernels of the A/B (bf16 fa3, every FP8 variant) and, with tests, of tests/test_fa3_fp8_gpu.py
    (``variant_set`` "ab"), of tests/test_fa3_fp8_speed_gpu.py and test_fa3_fp8_gpu.py -k default_recipe
    ("fp8speed"), or of both files ("fp8flip"). ``seqlens`` (on a GPU only): bf16 fa3's own config at each A/B shape
    too (``bf16_shape_changes``: the persistent grids of its short calls)."""
    fp8_variants = SETS[variant_set].variants
    work = [("bf16", D, c, {}) for D in head_dims for c in causals]
    work += [("bf16", D, c, ch) for D in head_dims for c in causals for ch in bf16_shape_changes(D, c, seqlens)]
    work += [("fp8", D, c, ch) for D in head_dims for c in causals for ch in fp8_variants[D].values()]
    work += [("recipe", D, c, ("bfloat16", ("block", True, True, True))) for D in head_dims for c in (False, True)]
    # their tests run both causal modes of every timed variant
    if tests and SETS[variant_set].speed:
        work += [("fp8", D, c, ch) for D in head_dims for c in (False, True) for ch in fp8_variants[D].values()]
        if variant_set == "fp8speed":
            work += [(kind, D, c, ch) for kind, D, ch in SPEED_TEST_KERNELS if D in head_dims for c in (False, True)]
        if variant_set == "fp8d128":
            work += [(kind, D, c, ch) for kind, D, ch in FP8D128_TEST_KERNELS for c in (False, True)]
    if tests and variant_set == "ab":  # tests/test_fa3_fp8_gpu.py's recipes
        work += [("recipe", D, True, ("float16", spec)) for D in (64, 128, 256) for spec in TEST_RECIPES]
        work += [("recipe", 128, False, ("bfloat16", spec)) for spec in (("tensor", False, False, True),
                                                                          ("block", True, False, True),
                                                                          ("block", True, True, False))]
    elif tests and variant_set == "fp8flip":  # session 5's fp8flip run: test_every_recipe at D 64 only
        work += [("recipe", 64, True, ("float16", spec)) for spec in TEST_RECIPES]
    return list(dict.fromkeys((kind, d, c, _freeze(ch)) for kind, d, c, ch in work))  # unique, in order


_TEST_ID = re.compile(r"^(?:FAILED|ERROR) \S*\[(?P<set>fp8[a-z0-9]+)-d(?P<D>\d+)-(?P<name>[a-z0-9_]+)-[0-9x]+"
                      r"(?:-full|-causal)?\]")
_PRECOMPILE_FAILED = re.compile(r"^\s*FAILED fp8 d(?P<D>\d+) causal=\S+ (?P<change>\{.*\}): ")


def failed_variants(log_text: str, variant_set: str) -> list[str]:
    """fa3-fp8 variants of ``variant_set`` (not "new") that failed before the A/B, from the text of its logs: a pytest
    summary line (``-rfE``: "FAILED|ERROR <path>::<test>[<set>-d<D>-<name>-<shape>[-full|-causal]]", whatever the error,
    found on another line under --tb=line) or a precompile line ("FAILED fp8 d<D> causal=<c> {<change>}: ..."; the
    variants of that head_dim with that change). A variant that hit a CUDA error poisons the process that runs it, so
    the A/B leaves every such one out (--drop-failed). Sorted names."""
    import ast

    variants = SETS[variant_set].variants
    names = set()
    for line in log_text.splitlines():
        if (m := _TEST_ID.match(line)) and m["set"] == variant_set:
            names.add(m["name"])
        elif m := _PRECOMPILE_FAILED.match(line):
            try:
                change = ast.literal_eval(m["change"])
            except (ValueError, SyntaxError):
                continue
            names.update(n for n, c in variants.get(int(m["D"]), {}).items() if c == change)
    names.discard("new")
    return sorted(n for n in names if any(n in v for v in variants.values()))


def _freeze(change):
    return tuple(sorted(change.items())) if isinstance(change, dict) else change


def _thaw(job):
    kind, D, causal, change = job
    return kind, D, causal, (dict(change) if kind in ("fp8", "bf16") else change)


def precompile(head_dims, causals, jobs: int, tests: bool = True, variant_set: str = "ab", seqlens=()) -> list[str]:
    work = [_thaw(j) for j in compile_jobs(head_dims, causals, tests, variant_set, seqlens)]
    t0 = time.time()
    if jobs <= 0:
        msgs = [_compile_one(w) for w in work]
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            msgs = list(pool.map(_compile_one, work))
    bad = [m for m in msgs if not m.startswith("ok")]
    print(f"precompile: {len(work)} jobs in {time.time() - t0:.0f}s with {jobs} workers; {len(bad)} failed", flush=True)
    for m in bad:
        print("  " + m, flush=True)
    return bad


def time_problem(impls: dict, rounds: int, iters: int, protocol: str = "rounds", cycles: int = 4,
                 burst_ms: float = 20.0) -> dict[str, list[float]]:
    """name -> per-round milliseconds per call. rounds: the order of impls rotated by one each round, `iters` calls
    between two events; paired: fa_variants.bench.paired against the first impl (its report lines printed: A/A
    interval, ratios with intervals and verdicts), per-round medians of the bursts."""
    if protocol == "paired":
        from fa_variants.bench import paired
        from fa_variants.bench.runtime import GraphBurstTimer

        names = list(impls)
        res = paired.paired_ab([paired.Entry(n, f) for n, f in impls.items()], names[0], GraphBurstTimer(),
                               rounds=rounds, cycles=cycles, burst_ms=burst_ms, warmup_ms=500)
        for line in paired.report_lines(res, [(n, names[0]) for n in names[1:]]):
            print("   ", line, flush=True)
        return {n: res.times(n) for n in names}
    names = list(impls)
    times = {n: [] for n in names}
    for fn in impls.values():
        fn()
    torch.cuda.synchronize()
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            impls[n]()  # warm-up of this implementation after the previous one's
            start.record()
            for _ in range(iters):
                impls[n]()
            end.record()
            end.synchronize()
            times[n].append(start.elapsed_time(end) / iters)
    return times


def speed(args, out_dir: str) -> list[dict]:
    from fa_variants.hopper import fa3, fa3_fp8

    fp8_variants = SETS[args.set].variants
    try:
        from flash_attn.cute.interface import flash_attn_func
    except Exception as exc:  # noqa: BLE001
        flash_attn_func = None
        print(f"flash-attn-4 not run: {type(exc).__name__}: {exc}", flush=True)
    if not args.flash_attn:  # --no-flash-attn: a run that times fa3-fp8 variants only (its JIT compile skipped)
        flash_attn_func = None
    rows = []
    with open(os.path.join(out_dir, "speed.jsonl"), "w") as f:
        for D in args.head_dims:
            for N in args.seqlens:
                B, H = max(1, 16384 // N), 2048 // D
                for causal in args.causal:
                    flops = 4 * B * H * N * N * D / (2 if causal else 1)
                    scale = D ** -0.5
                    impls = {}
                    inputs = {}
                    for name, change in fp8_variants[D].items():
                        cfg = kernel_config(D, change)
                        if cfg.tile_n not in inputs:
                            inputs[cfg.tile_n] = fp8_inputs(B, N, H, D, cfg.tile_n)
                        a = inputs[cfg.tile_n]
                        impls[name] = (lambda a=a, cfg=cfg: fa3_fp8.run_quantized(
                            *a, softmax_scale=scale, causal=causal, config=cfg))
                    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    impls["bf16_fa3"] = lambda: fa3.run(q, k, v, causal=causal, softmax_scale=scale)
                    if flash_attn_func is not None and D in (64, 128, 256):
                        impls["flash_attn_4"] = lambda: flash_attn_func(q, k, v, causal=causal)
                    for name in list(impls):  # a variant that fails to run is reported, not fatal
                        try:
                            impls[name]()
                        except Exception as exc:  # noqa: BLE001
                            print(f"d{D} N{N} causal={causal} {name}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                            del impls[name]
                    times = time_problem(impls, args.rounds, args.iters, args.protocol, args.cycles, args.burst_ms)
                    for name, ts in times.items():
                        med = statistics.median(ts)
                        row = dict(head_dim=D, seqlen=N, batch=B, heads=H, causal=causal, impl=name,
                                   ms=round(med, 4), tflops=round(flops / med / 1e9, 1),
                                   spread=round((max(ts) - min(ts)) / med, 3), rounds=len(ts), round_ms=[round(t, 4) for t in ts],
                                   config=(dataclasses.asdict(kernel_config(D, fp8_variants[D][name]))
                                           if name in fp8_variants[D] else None))
                        rows.append(row)
                        f.write(json.dumps(row) + "\n")
                    f.flush()
                    tf = {r["impl"]: r["tflops"] for r in rows if (r["head_dim"], r["seqlen"], r["causal"]) == (D, N, causal)}
                    print(f"d{D} N{N} causal={int(causal)}: " + " ".join(f"{n}={t:.0f}" for n, t in tf.items()), flush=True)
                    del impls, inputs, q, k, v
                    torch.cuda.empty_cache()
    return rows


def error_cases(args):
    """The accuracy inputs of ``errors`` and ``variant_errors`` (one generator for both): per head_dim, bf16
    q, k, v ~ N(0, 1) of shape (1, ``--err-seqlen``, 4, head_dim) from one seeded CUDA generator (the same inputs
    in every run); per causal mode, float64 attention of them. Yields (head_dim, causal, q, k, v, exact)."""
    from fa_variants.reference import attention_reference

    g = torch.Generator(device="cuda").manual_seed(11)
    for D in args.head_dims:
        q, k, v = (torch.randn(1, args.err_seqlen, 4, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
        for causal in args.causal:
            exact, _ = attention_reference(q, k, v, causal=causal, softmax_scale=D ** -0.5, dtype=torch.float64)
            yield D, causal, q, k, v, exact


def errors(args, out_dir: str) -> list[dict]:
    from fa_variants.fp8 import emulate_fp8_attention, quantize_fp8
    from fa_variants.fp8.quantize import quantize_fp8_torch
    from fa_variants.hopper import fa3_fp8
    from fa_variants.reference import rel_l2

    rows = []
    with open(os.path.join(out_dir, "errors.jsonl"), "w") as f:
        for D, causal, q, k, v, exact in error_cases(args):
            inputs = quantize_fp8(q, k, v)
            out, lse = fa3_fp8.run_fp8(inputs, causal=causal, out_dtype=torch.bfloat16)
            emu, emu_lse = emulate_fp8_attention(inputs, causal=causal, out_dtype=torch.bfloat16)
            emu_t, _ = emulate_fp8_attention(inputs, causal=causal, out_dtype=torch.bfloat16, accumulator="truncate")
            seen = torch.isfinite(emu_lse)
            row = dict(head_dim=D, seqlen=args.err_seqlen, causal=causal, block_n=inputs.block_n,
                       kernel_vs_emulation=float(rel_l2(out, emu)), kernel_vs_emulation_truncate=float(rel_l2(out, emu_t)),
                       lse_max_diff=float((lse - emu_lse)[seen].abs().max()) if seen.any() else 0.0,
                       kernel_vs_float64=float(rel_l2(out, exact)), emulation_vs_float64=float(rel_l2(emu, exact)),
                       emulation_block128_vs_float64=None)
            if inputs.block_n != 128:  # the old K/V scale blocks, same recipe, emulated
                old = quantize_fp8_torch(q, k, v, block_n=128)
                row["emulation_block128_vs_float64"] = float(rel_l2(
                    emulate_fp8_attention(old, causal=causal, out_dtype=torch.bfloat16, tile_m=128)[0], exact))
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            print(f"errors d{D} causal={int(causal)}: kernel-emu {row['kernel_vs_emulation']:.2e} (truncate model "
                  f"{row['kernel_vs_emulation_truncate']:.2e}; LSE {row['lse_max_diff']:.1e}), kernel-f64 "
                  f"{row['kernel_vs_float64']:.2e}, emu-f64 {row['emulation_vs_float64']:.2e}", flush=True)
    return rows


def variant_errors(args, out_dir: str) -> list[dict]:
    """--set fp8speed / fp8flip: every timed fa3-fp8 variant vs the emulation (told the variant's accumulation:
    two_level and promotion interval) and vs float64, on the inputs of ``errors`` (``error_cases``)."""
    from fa_variants.fp8 import FP8Config, emulate_fp8_attention, layout, quantize_fp8
    from fa_variants.fp8.quantize import quantize_fp8_torch
    from fa_variants.hopper import fa3_fp8
    from fa_variants.reference import rel_l2

    rows = []
    fp8_variants = SETS[args.set].variants
    with open(os.path.join(out_dir, "errors.jsonl"), "w") as f:
        for D, causal, q, k, v, exact in error_cases(args):
            emus = {}
            for name, change in fp8_variants[D].items():
                cfg = kernel_config(D, change)
                # the emulation reads the accumulation (two_level, interval) from the recipe, the K/V tiles from the
                # inputs' scale blocks (a variant with another tile_n: blocks of its tile_n, the PyTorch recipe)
                key = (cfg.two_level, cfg.promote_every, cfg.tile_n, cfg.tile_m)
                if key not in emus:
                    recipe = FP8Config(two_level=cfg.two_level, promote_every=cfg.promote_every)
                    inputs = (quantize_fp8(q, k, v, config=recipe) if cfg.tile_n == layout.tile_n(D) else
                              quantize_fp8_torch(q, k, v, config=recipe, block_n=cfg.tile_n))
                    emus[key] = inputs, *emulate_fp8_attention(inputs, causal=causal, out_dtype=torch.bfloat16,
                                                               tile_m=cfg.tile_m)
                inputs, emu, emu_lse = emus[key]
                out, lse = fa3_fp8.run_fp8(inputs, causal=causal, out_dtype=torch.bfloat16, config=cfg)
                seen = torch.isfinite(emu_lse)
                row = dict(head_dim=D, seqlen=args.err_seqlen, causal=causal, variant=name,
                           kernel_vs_emulation=float(rel_l2(out, emu)),
                           lse_max_diff=float((lse - emu_lse)[seen].abs().max()) if seen.any() else 0.0,
                           kernel_vs_float64=float(rel_l2(out, exact)), emulation_vs_float64=float(rel_l2(emu, exact)))
                rows.append(row)
                f.write(json.dumps(row) + "\n")
            print(f"errors d{D} causal={int(causal)}: " + " ".join(
                f"{r['variant']}={r['kernel_vs_emulation']:.2e}" for r in rows if (r["head_dim"], r["causal"]) == (D, causal)),
                flush=True)
    return rows


def speed_summary(speed_rows: list[dict], error_rows: list[dict], variant_set: str = "fp8speed") -> str:
    """--set fp8speed / fp8flip: TFLOP/s per variant, the best fa3-fp8 variant per problem, the two-level cost of the
    best two-level variant against the best single accumulator, the issue's targets with the best variant,
    candidates for a default flip, and the variants' accuracy; fp8flip adds the new defaults against the old."""
    fp8_variants = SETS[variant_set].variants
    probs = _by_problem(speed_rows)
    spread = {(r["head_dim"], r["seqlen"], r["causal"], r["impl"]): r["spread"] for r in speed_rows}
    lines = [f"# fa3-fp8 speed switches (issue 10): --set {variant_set}", "", SETS[variant_set].legend, ""]
    best_rows = []
    for D in sorted({p[0] for p in probs}):
        fp8_names = list(fp8_variants[D])
        names = fp8_names + ["bf16_fa3", "flash_attn_4"]
        lines += [f"## head_dim {D}", "", "| N | causal | " + " | ".join(names) + " | best fp8 | best/new | best/bf16 | two-level cost |",
                  "|" + "---|" * (len(names) + 6)]
        for (d, N, c), tf in sorted(probs.items()):
            if d != D:
                continue
            cells = [f"{tf[n]:.0f} ({spread[d, N, c, n]:.0%})" if n in tf else "-" for n in names]
            fp8 = {n: tf[n] for n in fp8_names if n in tf}
            best = max(fp8, key=fp8.get) if fp8 else None
            singles = [t for n, t in fp8.items() if n.startswith("single")]
            twos = [t for n, t in fp8.items() if not n.startswith("single")]
            cost = max(singles) / max(twos) - 1 if singles and twos else None
            row = dict(D=D, N=N, causal=c, best=best, tf=fp8.get(best), over_new=fp8.get(best, 0) / tf["new"] if "new" in tf else None,
                       over_bf16=fp8.get(best, 0) / tf["bf16_fa3"] if tf.get("bf16_fa3") else None, cost=cost, all=tf)
            best_rows.append(row)
            fmt = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
            lines.append(f"| {N} | {int(c)} | " + " | ".join(cells) + f" | {best} | {fmt(row['over_new'])} | "
                         f"{fmt(row['over_bf16'])} | {'-' if cost is None else format(cost, '+.1%')} |")
        lines.append("")
    lines += ["## issue 10 targets with the best fa3-fp8 variant (non-causal; reported)", ""]
    for r in best_rows:
        if r["causal"]:
            continue
        if r["D"] == 256 and r["N"] == 16384 and r["tf"]:
            lines.append(f"- d256 N16384: {r['tf']:.0f} TFLOP/s ({r['best']}; default {r['all'].get('new', 0):.0f}) "
                         f"(target >= 1100): {'met' if r['tf'] >= 1100 else 'NOT met'}")
        if r["D"] in (64, 128) and r["over_bf16"]:
            thr = 1.4 if r["D"] == 128 else 1.3
            lines.append(f"- d{r['D']} N{r['N']}: {r['over_bf16']:.2f}x bf16 fa3 ({r['best']}) (target >= {thr}): "
                         f"{'met' if r['over_bf16'] >= thr else 'NOT met'}")
        if r["cost"] is not None:
            lines.append(f"- d{r['D']} N{r['N']}: two-level cost {r['cost']:+.1%} (best single / best two-level) "
                         f"(target <= 5%): {'met' if r['cost'] <= 0.05 else 'NOT met'}")
    lines += ["", "## candidates for a default flip (>= 1.03x new in every non-causal problem, >= 0.97x in every problem)", ""]
    for D in sorted({r["D"] for r in best_rows}):
        mine = [r for r in best_rows if r["D"] == D]
        for name in fp8_variants[D]:
            if name in ("new", "old") or name.startswith("single"):
                continue
            ratios = [(r["all"].get(name, 0) / r["all"]["new"], r["causal"]) for r in mine if r["all"].get("new")]
            if ratios and all(x >= 0.97 for x, _ in ratios) and all(x >= 1.03 for x, c in ratios if not c):
                lines.append(f"- d{D} {name}: " + ", ".join(f"{x:.2f}x" for x, _ in ratios))
    if variant_set == "fp8flip":
        lines += flip_lines(probs)
    if error_rows:
        worst = max(error_rows, key=lambda r: _nan_last(r["kernel_vs_emulation"]))
        lse = max(error_rows, key=lambda r: _nan_last(r["lse_max_diff"]))
        gap = max(error_rows, key=lambda r: _nan_last(r["kernel_vs_float64"] / r["emulation_vs_float64"]))
        lines += ["", "## pass criteria of this change (accuracy of every variant; N(0,1), B=1, H=4)", "",
                  f"- kernel vs emulation rel-L2 <= {REL_L2_BOUND:g}: worst {worst['kernel_vs_emulation']:.2e} "
                  f"(d{worst['head_dim']} {worst['variant']} causal={int(worst['causal'])}): "
                  f"{'PASS' if worst['kernel_vs_emulation'] <= REL_L2_BOUND else 'FAIL'}",
                  f"- LSE max diff <= 1.5e-3: worst {lse['lse_max_diff']:.1e} (d{lse['head_dim']} {lse['variant']}): "
                  f"{'PASS' if lse['lse_max_diff'] <= 1.5e-3 else 'FAIL'}",
                  f"- kernel vs float64 within 1.02x of the emulation's: worst "
                  f"{gap['kernel_vs_float64'] / gap['emulation_vs_float64']:.3f}x (d{gap['head_dim']} {gap['variant']}): "
                  f"{'PASS' if gap['kernel_vs_float64'] / gap['emulation_vs_float64'] <= 1.02 else 'FAIL'}"]
        if SETS[variant_set].per_variant_errors:  # per variant: a failing one must not hide the others
            lines += ["", "kernel vs emulation rel-L2 per variant (causal 0 / 1):", ""]
            for D in sorted({r["head_dim"] for r in error_rows}):
                for name in fp8_variants[D]:
                    rel = {r["causal"]: r["kernel_vs_emulation"] for r in error_rows if (r["head_dim"], r["variant"]) == (D, name)}
                    lines.append(f"- d{D} {name}: " + " / ".join(f"{rel[c]:.2e}" if c in rel else "-" for c in (False, True)))
    return "\n".join(lines) + "\n"


def _nan_last(x: float) -> float:
    """A max() key that ranks NaN (a kernel that left NaN in its output) above every number, so the worst line names it
    and its comparison with the bound says FAIL."""
    return math.inf if math.isnan(x) else x


def flip_lines(probs: dict) -> list[str]:
    """--set fp8flip: new / old defaults per problem, their geometric mean, and the pass line of the flip (new >=
    0.97x old in every problem: skip_unit_rescale on, promote_every 4 at head_dim 64)."""
    ratios = {p: tf["new"] / tf["old"] for p, tf in sorted(probs.items()) if tf.get("new") and tf.get("old")}
    if not ratios:
        return []
    geo = math.exp(sum(math.log(x) for x in ratios.values()) / len(ratios))
    slower = [(p, round(x, 3)) for p, x in ratios.items() if x < 0.97]
    return ["", "## new defaults / old defaults (skip_unit_rescale on; promote_every 4 at head_dim 64)", "",
            *[f"- d{D} N{N} causal={int(c)}: {x:.3f}x" for (D, N, c), x in ratios.items()],
            f"- geometric mean over {len(ratios)} problems: {geo:.3f}x",
            f"- pass: new defaults >= 0.97x old in every problem: {'PASS' if not slower else 'FAIL ' + str(slower)}"]


#: --set fp8d256b: the halves cost (S as two 64-key MMAs / one 128-key MMA, same schedule otherwise) below which the
#: session-7 hypothesis (the halves' shared-memory reads are most of head_dim 256's two-level cost) is rejected
HALVES_COST_HYPOTHESIS = 0.06


def halves_cost_lines(speed_rows: list[dict]) -> str:
    """--set fp8d256b: per problem, what S in two halves costs in the serial two-level schedule (old / old_halves) and in
    the single accumulator with overlap (single_overlap / single_overlap_halves), their mean, and the verdict on the
    hypothesis (the mean cost >= HALVES_COST_HYPOTHESIS); the part of the default's two-level cost the halves explain."""
    probs = _by_problem(speed_rows)
    lines = ["", "## S in two 64-key halves: cost (one MMA / two halves - 1), same schedule otherwise", ""]
    costs = []
    for (D, N, c), tf in sorted(probs.items()):
        pairs = [(a, b) for a, b in (("old", "old_halves"), ("single_overlap", "single_overlap_halves"))
                 if tf.get(a) and tf.get(b)]
        cells = [f"{b} {tf[a] / tf[b] - 1:+.1%}" for a, b in pairs]
        costs += [tf[a] / tf[b] - 1 for a, b in pairs]
        two = ""
        if tf.get("single") and tf.get("old"):
            two += f"; promotions in the serial steps (single / old - 1) {tf['single'] / tf['old'] - 1:+.1%}"
        if tf.get("new") and tf.get("single_overlap"):
            two += f"; default's two-level cost {tf['single_overlap'] / tf['new'] - 1:+.1%}"
        lines.append(f"- d{D} N{N} causal={int(c)}: " + ", ".join(cells) + two)
    if costs:
        mean = sum(costs) / len(costs)
        verdict = "SUPPORTED" if mean >= HALVES_COST_HYPOTHESIS else "REJECTED"
        lines.append(f"- mean halves cost {mean:+.1%} over {len(costs)} pairs: "
                     f"hypothesis (>= {HALVES_COST_HYPOTHESIS:.0%}) {verdict}")
    return "\n".join(lines) + "\n"


def turn_cost_lines(speed_rows: list[dict]) -> str:
    """--set fp8turn: per problem, the two-level cost (single / two-level - 1) of new and of each two-level variant
    against single_overlap_c2 (the default's two chains: the fair reference) and single_overlap (one chain)."""
    lines = ["", "## two-level cost per variant (fp8turn): against single_overlap_c2 / single_overlap", ""]
    for (D, N, c), tf in sorted(_by_problem(speed_rows).items()):
        refs = [tf.get("single_overlap_c2"), tf.get("single_overlap")]
        cells = [f"{n} " + " / ".join("-" if not r else f"{r / tf[n] - 1:+.1%}" for r in refs)
                 for n in tf if n in SETS["fp8turn"].variants.get(D, {}) and not n.startswith("single") and tf[n]]
        lines.append(f"- d{D} N{N} causal={int(c)}: " + "; ".join(cells))
    return "\n".join(lines) + "\n"


def two_level_target_lines(speed_rows: list[dict], variant_set: str = "fp8small") -> str:
    """--set fp8small / fp8mid: issue 10's head_dim 64 / 128 targets with two-level accumulation on (the summary's "best fp8"
    may be a single-accumulator baseline): per problem the best two-level variant / bf16 fa3 (1.4x at 128, 1.3x at
    64) and the two-level cost of that pair, best single / best two-level - 1 (<= 5%)."""
    lines = ["", "## issue 10 targets with the best two-level variant (two_level on; all problems)", ""]
    for (D, N, c), tf in sorted(_by_problem(speed_rows).items()):
        twos = {n: t for n, t in tf.items() if n in SETS[variant_set].variants.get(D, {}) and not n.startswith("single")}
        singles = [t for n, t in tf.items() if n.startswith("single")]
        if not twos or not tf.get("bf16_fa3"):
            continue
        best = max(twos, key=twos.get)
        thr = {128: 1.4, 64: 1.3}.get(D)
        ratio = twos[best] / tf["bf16_fa3"]
        cost = f", two-level cost {max(singles) / twos[best] - 1:+.1%}" if singles else ""
        verdict = "" if thr is None else f" (target >= {thr}): {'met' if ratio >= thr else 'NOT met'}"
        lines.append(f"- d{D} N{N} causal={int(c)}: {best} {twos[best]:.0f} TFLOP/s = {ratio:.2f}x bf16 fa3{verdict}{cost}")
    return "\n".join(lines) + "\n"


def _by_problem(speed_rows):
    out = {}
    for r in speed_rows:
        out.setdefault((r["head_dim"], r["seqlen"], r["causal"]), {})[r["impl"]] = r["tflops"]
    return out


def derived(tf: dict) -> dict:
    """Per problem: new / bf16 fa3, new / old, new / flash-attn-4, two-level cost (single / new - 1)."""
    ratio = lambda a, b: tf[a] / tf[b] if tf.get(a) and tf.get(b) else None  # noqa: E731
    cost = ratio("single", "new")
    return dict(over_bf16=ratio("new", "bf16_fa3"), old_over_bf16=ratio("old", "bf16_fa3"), over_old=ratio("new", "old"),
                over_fa4=ratio("new", "flash_attn_4"), two_level_cost=None if cost is None else cost - 1)


def verdicts(speed_rows, error_rows, test_stats) -> list[str]:
    """The issue's targets (reported, not this change's pass criteria) and the pass criteria of this change."""
    probs = _by_problem(speed_rows)
    lines = ["## issue 10 targets (non-causal; reported)", ""]
    for D, N, causal, what, thr in TARGETS:
        for (d, n, c), tf in sorted(probs.items()):
            if (D is not None and d != D) or (N is not None and n != N) or (causal is not None and c != causal) or (D is None and c):
                continue
            val = tf.get("new") if what == "tflops" else derived(tf)[what]
            if val is None:
                continue
            ok = val <= thr if what == "two_level_cost" else val >= thr
            shown = f"{val:.0f} TFLOP/s" if what == "tflops" else (f"{val:+.1%}" if what == "two_level_cost" else f"{val:.2f}x")
            lines.append(f"- d{d} N{n}: {what} {shown} (target {'<=' if what == 'two_level_cost' else '>='} {thr:g}): "
                         f"{'met' if ok else 'NOT met'}")
    lines += ["", "## pass criteria of this change", ""]
    slower = [(p, derived(tf)["over_old"]) for p, tf in sorted(probs.items()) if (derived(tf)["over_old"] or 1) < 0.97]
    lines.append(f"- new defaults >= 0.97x old in every problem: {'PASS' if not slower else 'FAIL ' + str(slower)}")
    if error_rows:
        worst = max(r["kernel_vs_emulation"] for r in error_rows)
        gap = max(r["kernel_vs_float64"] / r["emulation_vs_float64"] for r in error_rows)
        model = all(r["kernel_vs_emulation"] <= r["kernel_vs_emulation_truncate"] for r in error_rows)
        lines.append(f"- kernel vs emulation rel-L2 <= {REL_L2_BOUND:g} (A/B inputs): worst {worst:.2e}: "
                     f"{'PASS' if worst <= REL_L2_BOUND else 'FAIL'}")
        lines.append(f"- block-FP model closer than the truncate model in every case: {'PASS' if model else 'FAIL'}")
        lines.append(f"- kernel vs float64 within 1.02x of the emulation's: worst {gap:.3f}x: {'PASS' if gap <= 1.02 else 'FAIL'}")
        blk = [r["emulation_vs_float64"] / r["emulation_block128_vs_float64"] for r in error_rows
               if r.get("emulation_block128_vs_float64")]
        if blk:
            lines.append(f"- 256-key K/V scale blocks vs 128 (emulated, vs float64): worst {max(blk):.4f}x: "
                         f"{'PASS' if max(blk) <= 1.02 else 'FAIL'} (<= 1.02x)")
    if test_stats:
        w = max(test_stats, key=lambda r: r["rel_l2"])
        lw = max(test_stats, key=lambda r: r["lse_diff"])
        md = max(test_stats, key=lambda r: r["max_diff"] / r["max_diff_bound"])
        lines.append(f"- tests/test_fa3_fp8_gpu.py, {len(test_stats)} cases: worst rel-L2 {w['rel_l2']:.2e} ({w['case']}; "
                     f"bound {REL_L2_BOUND:g}), worst LSE diff {lw['lse_diff']:.1e} ({lw['case']}; bound 1.5e-3), worst max-diff "
                     f"{md['max_diff'] / md['max_diff_bound']:.2f} of its bound ({md['case']})")
    return lines


def summary(speed_rows: list[dict], error_rows: list[dict], test_stats: list[dict] | None = None) -> str:
    lines = ["# fa3-fp8 A/B: new defaults vs old", "", SETS["ab"].legend, ""]
    probs = _by_problem(speed_rows)
    spread = {(r["head_dim"], r["seqlen"], r["causal"], r["impl"]): r["spread"] for r in speed_rows}
    names = ["new", "old", "single", "bf16_fa3", "flash_attn_4"]
    lines += ["| D | N | causal | " + " | ".join(names) + " | new/bf16 | old/bf16 | new/old | new/fa4 | two-level cost |",
              "|" + "---|" * (len(names) + 8)]
    for (D, N, c), tf in sorted(probs.items()):
        cells = [f"{tf[n]:.0f} ({spread[D, N, c, n]:.0%})" if n in tf else "-" for n in names]
        d = derived(tf)
        fmt = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
        lines.append(f"| {D} | {N} | {int(c)} | " + " | ".join(cells) + f" | {fmt(d['over_bf16'])} | {fmt(d['old_over_bf16'])} | "
                     f"{fmt(d['over_old'])} | {fmt(d['over_fa4'])} | "
                     f"{'-' if d['two_level_cost'] is None else format(d['two_level_cost'], '+.1%')} |")
    if error_rows:
        lines += ["", "## accuracy of the new defaults (rel-L2), default recipe, N(0,1), B=1 H=4", "",
                  "| D | causal | K/V block | kernel vs emulation | vs truncate model | LSE max diff | kernel vs f64 | emulation vs f64 | emulation, 128-key blocks, vs f64 |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in error_rows:
            b = r.get("emulation_block128_vs_float64")
            lines.append(f"| {r['head_dim']} | {int(r['causal'])} | {r['block_n']} | {r['kernel_vs_emulation']:.2e} | "
                         f"{r['kernel_vs_emulation_truncate']:.2e} | {r['lse_max_diff']:.1e} | {r['kernel_vs_float64']:.2e} | "
                         f"{r['emulation_vs_float64']:.2e} | {'-' if b is None else f'{b:.2e}'} |")
    lines += [""] + verdicts(speed_rows, error_rows, test_stats or [])
    return "\n".join(lines) + "\n"


def plan(args) -> str:
    jobs = compile_jobs(args.head_dims, args.causal, tests=True, variant_set=args.set)
    probs = [(D, N, c) for D in args.head_dims for N in args.seqlens for c in args.causal]
    impls = {D: [*SETS[args.set].variants[D], "bf16_fa3", "flash_attn_4"] for D in args.head_dims}
    return "\n".join([f"set: {args.set}; precompile: {len(jobs)} jobs ({args.jobs} workers)",
                      f"speed: {len(probs)} problems x {args.rounds} rounds x {args.iters} calls; impls per head_dim: {impls}",
                      f"errors: {'on' if args.errors else 'off'} (head dims {args.head_dims}, N={args.err_seqlen}, causal {args.causal})",
                      f"out: {args.out}"])


def parser() -> argparse.ArgumentParser:
    """The command line; ``--set`` accepts exactly the names of ``SETS``."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    ap.add_argument("--set", choices=list(SETS), default="ab",
                    help="; ".join(f"{name}: {vs.help}" for name, vs in SETS.items()))
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256], choices=[64, 128, 256])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=10, help="calls between the two events of one measurement")
    ap.add_argument("--protocol", choices=["rounds", "paired"], default="rounds",
                    help="paired: fa_variants.bench.paired (CUDA-graph bursts alternated ABC CBA, A/A control; "
                         "scripts/fa3_speed_ab.py's default), ratios against the first impl printed per problem")
    ap.add_argument("--cycles", type=int, default=4, help="paired: cycles per round (even)")
    ap.add_argument("--burst-ms", type=float, default=20.0, help="paired: length of one burst")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="compile workers (0: in-process)")
    ap.add_argument("--phase", choices=["all", "precompile", "measure"], default="all",
                    help="precompile: compile only (A/B and GPU-test kernels); measure: speed + errors (no precompile)")
    ap.add_argument("--no-errors", dest="errors", action="store_false")
    ap.add_argument("--no-flash-attn", dest="flash_attn", action="store_false", help="leave flash-attn-4 out")
    ap.add_argument("--err-seqlen", type=int, default=2048)
    ap.add_argument("--test-stats", default=None, help="JSON lines from tests/test_fa3_fp8_gpu.py (FA_VARIANTS_FP8_STATS)")
    ap.add_argument("--drop", nargs="*", default=[], metavar="NAME",
                    help="fa3-fp8 variants of the set left out of the measurement (every head_dim; e.g. one whose GPU "
                         "tests crashed: a CUDA error there would end the whole run)")
    ap.add_argument("--drop-failed", nargs="*", default=[], metavar="LOG",
                    help="logs of the steps before (precompile, GPU tests): every variant with a FAILED/ERROR line there "
                         "is dropped too (failed_variants; missing files are skipped)")
    ap.add_argument("--quick", action="store_true", help="D=128, N=4k, non-causal, 3 rounds")
    ap.add_argument("--plan", action="store_true", help="print what would run and exit (no GPU needed)")
    ap.add_argument("--out", default=os.environ.get("OUT", "results") + "/fa3_fp8_ab")
    return ap


def main() -> int:
    ap = parser()
    args = ap.parse_args()
    if args.quick:
        args.head_dims, args.seqlens, args.causal, args.rounds = [128], [4096], "no", 3
    args.causal = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    given, args.head_dims = args.head_dims, [d for d in args.head_dims if d in SETS[args.set].variants]
    if not args.head_dims:  # the head dims the set has (fp8d256's, fp8two's: 256 only)
        ap.error(f"--head-dims {given}: --set {args.set} has head_dim {sorted(SETS[args.set].variants)} only")
    failed = []
    for log in args.drop_failed:
        if os.path.exists(log):
            with open(log, errors="replace") as f:
                failed += failed_variants(f.read(), args.set)
    if failed:
        print(f"left out (a FAILED/ERROR line in {' / '.join(args.drop_failed)}): {' '.join(sorted(set(failed)))}",
              flush=True)
        args.drop = sorted(set(args.drop) | set(failed))
    if args.drop:
        unknown = set(args.drop) - {n for v in SETS[args.set].variants.values() for n in v} | ({"new"} & set(args.drop))
        if unknown:
            ap.error(f"--drop: {sorted(unknown)} not a variant of --set {args.set} other than new")
        SETS[args.set] = SETS[args.set]._replace(variants={
            D: {n: c for n, c in v.items() if n not in args.drop} for D, v in SETS[args.set].variants.items()})
    if args.plan:
        print(plan(args))
        return 0
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("fa3_fp8_speed_ab: needs an sm90 GPU", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__}", flush=True)
    if args.phase in ("all", "precompile"):
        bad = precompile(args.head_dims, args.causal, args.jobs, tests=not args.quick, variant_set=args.set,
                         seqlens=args.seqlens)
        if args.phase == "precompile":
            return 1 if bad else 0
    speed_rows = speed(args, args.out)
    print(f"speed done at {time.time() - t0:.0f}s", flush=True)
    if SETS[args.set].speed:
        text = speed_summary(speed_rows, variant_errors(args, args.out) if args.errors else [], args.set)
        if args.set == "fp8d256b":
            text += halves_cost_lines(speed_rows)
        if SETS[args.set].two_level_targets:
            text += two_level_target_lines(speed_rows, args.set)
        if args.set == "fp8turn":
            text += turn_cost_lines(speed_rows)
    else:
        error_rows = errors(args, args.out) if args.errors else []
        stats = []
        if args.test_stats and os.path.exists(args.test_stats):
            with open(args.test_stats) as f:
                stats = [json.loads(line) for line in f if line.strip()]
        text = summary(speed_rows, error_rows, stats)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    print(text, flush=True)
    print(f"total {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
