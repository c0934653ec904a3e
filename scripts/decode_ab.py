"""Issue 13: the decode (seqlen_q = 1) shapes where fa3 lost to SDPA, timed with fa3's decode switches side by side.

    python3 scripts/decode_ab.py --out $OUT/decode_ab     # the default plan, ~2-3 min on an H200
    python3 scripts/decode_ab.py --plan                   # print the plan (no GPU needed)

Shapes (``MISSES``): the 32 cases of the decode matrix (bf16, causal, seqlen_q = 1) where ours (auto) was slower
than SDPA (auto) on 2026-12-01 (bench/h200-2026-12-01/raw.tar.xz:decode_packed.json); ``--all-nq1`` adds the 16 others.
Variants (``VARIANTS``), each fa3 through ``hopper.fa3.run`` with an explicit packed config:

* ``auto``      the public path, ``fa_variants.attention(causal=True)``, as shipped (the reference row);
* ``pdl``       the merge kernel launched as a programmatic dependent of the split kernel
                (``common.split_combine.MERGE_PDL``): its launch hides under the split grid;
* ``pdl2``      the attention kernel too (``Sm90Config.pdl``): its launch and setup overlap the kernel before
                it (here the previous step's merge or attention kernel);
* ``deep``      ``hopper.fa3.DECODE_TILES["deep"]``: more K/V stages (D 64: 4, D 128: 3), bytes in flight;
* ``deep+pdl2`` both;
* ``wide+pdl2`` D 64 only: 192-key tiles, 3 stages (``DECODE_TILES["wide"]``), and PDL;
* ``dual+pdl2`` two CTAs per SM (``DECODE_TILES["dual"]``: D 64 128-key tiles, D 128 64-key tiles, 2 stages,
                consumer 232 registers): one CTA's prologue and epilogue under the other's main loop; and PDL;
* ``deep+pdl2/2`` half the heuristic's split count (shapes it splits), to see if the merge-free side pays;
* ``deep+pdl2 nosplit`` one CTA per (batch, KV head) walking all tiles (shapes the heuristic splits): no merge;
* ``min1``      the base tiles with the count the heuristic gives when a split may hold one K/V tile
                (``common.split.num_splits_heuristic(min_tiles=1)``, FA_VARIANTS_SPLIT_MIN_TILES=1): B 1 Nk 1k
                8 one-tile splits where `auto` takes 4 of two tiles; elsewhere the same count as `auto`;
* ``min1+pdl``, ``min1+pdl2``  and the merge (and the attention kernel) as programmatic dependents.

Variants through the public path (``PUBLIC``: ``fa_variants.attention`` with fa3's module switches set for the
call, so any seqlen_q works and the split count is `auto`'s):

* ``two``         split-KV + the merge kernel (FUSED_MERGE "off", no PDL, base tiles): today's default;
* ``fused``       the merge inside the split kernel (``Sm90Config.fused_merge``, FUSED_MERGE "all"): one launch
                  (at seqlen_q > 1 too: FUSED_MERGE "decode" is ``fused`` at seqlen_q = 1 and ``two`` elsewhere);
* ``fused+pdl2``  and the split kernel a programmatic dependent (DECODE_PDL);
* ``dual+fused+pdl2``  and two CTAs per SM (DECODE_TILES "dual");
* ``dual+two+pdl2``    dual tiles, PDL, two kernels (``dual+pdl2`` through the public path, any seqlen_q).

Session 6 (``auto`` is then one-tile splits + PDL at 2-8 splits, ``hopper.fa3.SPLIT_MIN_TILES`` /
``DECODE_PDL_MAX_SPLITS``; ``--s6`` picks the shapes ``S6``):

* ``old``         `auto` before session 6 (two-tile splits at least, no PDL);
* ``warp``        the merge kernel with the LSEs in registers (``common.split_combine.MERGE_WARP``);
* ``dualauto``    two CTAs per SM for B x Hkv >= ``DUAL_MIN_CTAS`` at Nk <= 4k (``DECODE_TILES_CHOICE`` "auto",
                  the default since the decode5 run: 512, 64 in that run);
* ``wide``        packed rows of seqlen_q > 1 in 128-row tiles whenever 64 are too few (``PACK_WIDE`` True;
                  the default None takes them by ``wide_helps``);
* ``wide+warp``, ``cand`` (dualauto + wide + warp): together.

Session 7 (``--s7`` picks the shapes ``S7``; decode5's public ``warp`` entry had reused `auto`'s launch step, so it
timed the shared-memory merge: ``common.launch`` now keys steps by config and switch state):

* ``warp``        as above, now really the warp merge;
* ``warp+pdl16``  and PDL up to 16 splits (``DECODE_PDL_MAX_SPLITS`` 16: B 1 Nk 4k / 32k);
* ``row1``        the softmax of the padding row skipped at seqlen_q 1 (``DECODE_FIRST_ROW``: groups <= 8).

Session 7, second decode round (``--s8`` picks the shapes ``S8``, the Nk 32k shapes under 70% of HBM and controls; `auto` has the warp
merge at >= 8 splits and first_row_only):

* ``pdl16``         PDL up to 16 splits (``DECODE_PDL_MAX_SPLITS`` 16): seqlen_q 1 at B 1 Nk 4k / 32k.

Session 8 (``--s9`` picks the shapes ``S9``: the unsplit seqlen_q 1 shapes at batch 64, where `auto` runs the dual
tiles at Nk <= 4k and the base tiles at 32k; D 64 B 64 Nk 1k was the last 1.01x SDPA). Its ``pdl1`` (unsplit calls
as programmatic dependents, ``DECODE_PDL_MIN_SPLITS`` 1) is the default since session 10, so the persistent grids
below launch with PDL too:

* ``pers``          a persistent grid instead of the dual tiles (``DECODE_FULL_GRID`` "persistent": B x Hkv >= 512,
                    Nk <= 4k), 2 K/V stages; ``pers3`` with 3.

Session 32 (``--s9`` again): at D 128 B 64 Nk 1k seqlen_q 1 the shipped dual tiles ran 1.08x SDPA (70.2 vs 64.7 us)
while the same shape at seqlen_q 4 (packed 64-row tiles, base set) took 68.3 us, so:

* ``base``          the base tiles (2 stages, one CTA per SM) where `auto` runs the dual ones (``DECODE_TILES_CHOICE``
                    "base").

Session 34 (``--s34`` picks the shapes ``S34``: seqlen_q 1 at Nk 128k, batch 1 / 8 / 64, and batch 64 Nk 32k at
D 128; streaming K/V at 92-96 % of HBM, where ours / SDPA was 1.003-1.018 at D 128 batch 8 (64:8) and 64 in session
33's table): more K/V bytes in flight per SM for the long unsplit and split calls:

* ``tiles-deep``    the deep tiles (``DECODE_TILES_CHOICE`` "deep": 4 stages at head_dim 64, 3 at 128) everywhere;
* ``tiles-dual``    the dual tiles (two CTAs per SM) everywhere, not only at batch x heads_kv >= 512 and Nk <= 4k.

Session 35 (``--s35`` picks the shapes ``S35``: the ten one-row shapes above SDPA on an H100 in session 35's decode
matrix, 1.001-1.024x; D 64 batch 64 at 1k / 4k keys, D 64 batch 1 at 32k / 128k, D 128 batch 1 at 128k), with the
tile sets above and ``base``: which of them, if any, moves these shapes on that card.

Session 38 (``--s38`` picks the shapes ``S38``: batch 64, 8 KV heads, Nk 1k / 2k / 4k, D 64 / 128, 32:8 / 64:8),
with ``base`` and ``tiles-dual`` (what `auto` runs there): the Nk where the base tiles overtake the dual ones, on
each card (session 38's H100: base 0.97x dual at D 64 Nk 4k, 1.03x at 1k; session 4's H200: 1.016x at D 64 Nk 4k).

Session 10 (``--s10c`` picks the shapes ``S10C``: D 64 B 1 Nk 32k at seqlen_q 1 / 4 and guards; its variants, the
split merge inside a thread block cluster, measured slower and were removed in session 11).

Session 12 (``--s12l``; its variant ``ldual``, FA_VARIANTS_DECODE_LONG_DUAL: the dual tiles at batch x heads_kv <= 16
and Nk >= 32k, 32 splits at B 1 x 8 KV heads) measured slower in session 13 and was removed with the switch.

Session 15 (``--s15``; its variants ``pf2`` / ``pf4`` / ``pf8``: the split kernel's producer prefetching the K and V
tiles 2 / 4 / 8 tiles ahead into L2 with TMA prefetches) measured slower in session 16 (faster at none of its 9
shapes) and was removed with the switch.

With ``--s7`` (or ``--skip-same``) a public variant that runs at a shape what `auto` or a variant listed before it
runs there (config and merge kernel) is not timed there: its cell reads "-".

``--wins`` adds ``WINS``: shapes ours already wins (split at seqlen_q 4 / 16, or unsplit at batch 64), to show
that a default change does not lose them; shapes are (head_dim, heads, heads_kv, batch, seqlen_k[, seqlen_q]).

Every variant's output (its first ``REF_BATCHES`` sequences) is compared once with SDPA given the bottom-right causal
mask (max |difference| < 0.02,
else the row is marked BAD: a PDL race would show here; the timed SDPA entry has no mask, which is the same
attention at seqlen_q = 1 and a few more keys at 4 / 16 rows). Timing: per shape, each entry's calls captured in a CUDA graph (``calls`` per graph,
about 1 ms of work, 5..50), replayed ``--reps`` times and timed with CUDA events, median per round; ``--rounds``
rounds with the entry order rotated by one per round; reported: the median over rounds, GPU us per call. Kernels
are compiled first in parallel processes into the disk cache (``common.diskcache``), then loaded.

The last lines printed are the summary: per shape the ratio to SDPA of each variant (< 1: faster), and per
variant the number of shapes at or below SDPA and the geometric-mean ratio. Logs: decode_ab.json / .md under
--out (default $OUT/decode_ab if $OUT is set, else results/decode2/decode_ab).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fa_variants, run from anywhere

# (head_dim, heads, heads_kv, batch, seqlen_k) with seqlen_q = 1: ours > SDPA on 2026-12-01
MISSES = [
    (64, 32, 8, 1, 1024), (64, 32, 8, 1, 4096), (64, 32, 8, 1, 32768), (64, 32, 8, 1, 131072),
    (64, 32, 8, 8, 1024), (64, 32, 8, 8, 4096), (64, 32, 8, 8, 32768), (64, 32, 8, 64, 1024),
    (64, 32, 8, 64, 4096), (64, 32, 8, 64, 131072), (64, 64, 8, 1, 1024), (64, 64, 8, 1, 4096),
    (64, 64, 8, 1, 32768), (64, 64, 8, 1, 131072), (64, 64, 8, 8, 1024), (64, 64, 8, 8, 4096),
    (64, 64, 8, 8, 32768), (64, 64, 8, 64, 1024), (64, 64, 8, 64, 4096), (64, 64, 8, 64, 32768),
    (128, 32, 8, 1, 1024), (128, 32, 8, 1, 4096), (128, 32, 8, 1, 32768), (128, 32, 8, 8, 1024),
    (128, 32, 8, 8, 4096), (128, 32, 8, 64, 1024), (128, 64, 8, 1, 1024), (128, 64, 8, 1, 4096),
    (128, 64, 8, 8, 1024), (128, 64, 8, 8, 131072), (128, 64, 8, 64, 1024), (128, 64, 8, 64, 4096),
]
# shapes ours won on 2026-12-01 (bench/h200-2026-12-01/raw.tar.xz:decode_packed.md), split (seqlen_q 4 / 16 at
# batch 1 and 8) or not (batch 64): a default change must not lose them
WINS = [(128, 32, 8, 1, 4096, 16), (64, 32, 8, 1, 32768, 4), (128, 64, 8, 8, 32768, 16), (128, 32, 8, 64, 4096, 16),
        (64, 64, 8, 1, 1024, 16), (128, 32, 8, 8, 1024, 4)]
# issue 13's short-Nk one-row shapes (batch 1 / 8, Nk 1k / 4k) and a few long-Nk / full-grid controls (--short-nk)
SHORT_NK = [(d, h, 8, b, nk) for d in (64, 128) for h in (32, 64) for b in (1, 8) for nk in (1024, 4096)]
CONTROLS = [(128, 32, 8, 1, 32768), (64, 32, 8, 1, 131072), (128, 64, 8, 64, 4096), (64, 32, 8, 64, 1024)]
# session 6 (--s6): the seqlen_q = 1 shapes split-KV runs where ours (auto) lost to SDPA in the s6 morning run
# (bench/NOTES.md, "Session 6 (2026-12-01): decode at Nq 1 and packed Nq 16"), two unsplit batch-64 controls, and
# the Nk 32k shapes under 70% of HBM (seqlen_q 4 / 16; 64:8 at 16 rows: 128 packed rows, PACK_WIDE's case) with two
# wide-tile guards at short Nk
S6 = ([(d, h, 8, b, nk) for d in (64, 128) for h in (32, 64) for b in (1, 8) for nk in (1024, 4096)
       if not (d == 128 and b == 8 and nk == 4096)]
      + [(64, 32, 8, 1, 32768), (64, 64, 8, 1, 32768), (64, 32, 8, 64, 1024), (128, 64, 8, 64, 1024)]
      + [(64, 32, 8, 1, 32768, 4), (64, 32, 8, 1, 32768, 16), (64, 64, 8, 1, 32768, 16), (64, 64, 8, 8, 32768, 16),
         (64, 64, 8, 64, 32768, 16), (128, 32, 8, 1, 32768, 16), (128, 64, 8, 1, 32768, 16),
         (128, 64, 8, 8, 32768, 16), (128, 64, 8, 64, 32768, 16), (64, 64, 8, 64, 1024, 16), (128, 64, 8, 8, 4096, 16)])
# session 7 (--s7): the seqlen_q = 1 shapes still slower than SDPA in the s6 final table (D 64 B 1 Nk 4k / 32k, B 8 Nk 1k,
# B 64 Nk 1k: no switch here changes the last, a control), passing split shapes whose merge the warp switch changes
# (B 1 Nk 1k / 4k / 32k, B 8 Nk 1k at D 128), and the Nk 32k seqlen_q 16 shapes under 70% of HBM (wide tiles at 64:8)
S7 = ([(64, h, 8, b, nk) for h in (32, 64) for b, nk in ((1, 4096), (8, 1024), (1, 32768))]
      + [(64, 32, 8, 64, 1024), (64, 32, 8, 1, 1024), (128, 32, 8, 1, 4096), (128, 32, 8, 8, 1024),
         (128, 64, 8, 1, 32768)]
      + [(64, 64, 8, 1, 32768, 16), (64, 64, 8, 8, 32768, 16), (64, 64, 8, 64, 32768, 16), (64, 32, 8, 1, 32768, 16),
         (128, 32, 8, 1, 32768, 16), (128, 64, 8, 1, 32768, 16), (128, 64, 8, 64, 32768, 16), (64, 64, 8, 64, 1024, 16)])
# session 7, second decode round (--s8): the Nk 32k shapes under 70% of HBM after the session 7 flips (bench/h200-2026-12-01-s7/decode_bench.md;
# D 64 64:8 B 64 Nq 16 left out: unsplit, no variant changes it), then controls the variants change: D 128 32:8 B 1 Nq 16
# (70%), short Nk (B 1 Nk 4k at seqlen_q 1 / 16, B 8 Nk 1k Nq 16), and one seqlen_q 1 shape at D 128
S8 = ([(64, 64, 8, 1, 32768, 16), (128, 64, 8, 1, 32768, 16), (64, 32, 8, 1, 32768, 16), (64, 32, 8, 1, 32768, 4),
       (64, 64, 8, 1, 32768, 4), (64, 32, 8, 1, 32768), (64, 64, 8, 1, 32768), (64, 64, 8, 8, 32768, 16)]
      + [(128, 32, 8, 1, 32768, 16), (64, 32, 8, 1, 4096, 16), (64, 32, 8, 1, 4096), (128, 32, 8, 1, 4096),
         (64, 32, 8, 8, 1024, 16)])
# session 8 (--s9): seqlen_q 1 at batch 64 (unsplit): Nk 1k / 4k at D 64 / 128, 32:8 / 64:8 (the dual tiles, which the
# persistent grid replaces; D 64 Nk 1k the two shapes > SDPA in s7), and Nk 32k D 64 32:8 (base tiles: pdl1 only)
S9 = [(d, h, 8, 64, nk) for d in (64, 128) for h in (32, 64) for nk in (1024, 4096)] + [(64, 32, 8, 64, 32768)]
# session 10 (--s10c): the D 64 B 1 Nk 32k shapes under 70% of HBM at seqlen_q 1 / 4 (16 splits: the fixed cost of a
# split call), then guards for a change to the split calls: seqlen_q 16 (16 splits, 64 rows), Nk 4k (16 splits), Nk 1k
# (8 splits, PDL), B 8 Nk 1k (2 splits), D 128 B 1 Nk 32k (16 splits)
S10C = ([(64, h, 8, 1, 32768) for h in (32, 64)] + [(64, h, 8, 1, 32768, 4) for h in (32, 64)]
        + [(64, 32, 8, 1, 32768, 16), (64, 32, 8, 1, 4096), (64, 32, 8, 1, 1024), (64, 32, 8, 8, 1024),
           (128, 32, 8, 1, 32768)])
# session 33 (--s33): head_dim 128, 64:8, seqlen_q 16 (128 packed rows per KV head): `auto` takes the wide tile there
# only where it adds no split (fa3.wide_helps), so batch 1 / 8 run two 64-row tiles per KV head, K/V read twice;
# Nk 4k-128k at batch 1 / 8 (B 8 Nk 4k: the loss that made the rule) and batch 64 Nk 32k (wide already) as a guard
S33 = [(128, 64, 8, b, nk, 16) for b in (1, 8) for nk in (4096, 16384, 32768, 131072)] + [(128, 64, 8, 64, 32768, 16)]
# session 34 (--s34): the long one-row shapes at 92-96 % of HBM (session 33: D 128 B 8 / 64 Nk 128k 1.003-1.018x SDPA)
S34 = [(d, h, 8, b, 131072) for d in (64, 128) for h in (32, 64) for b in (1, 8, 64)] + [
    (128, 32, 8, 64, 32768), (128, 64, 8, 64, 32768)]
# session 35 (--s35): the ten one-row shapes where ours was above SDPA on an H100 (session 35's decode matrix,
# 1.001-1.024x): D 64 batch 64 at Nk 1k / 4k, D 64 batch 1 at Nk 32k / 128k, D 128 batch 1 at Nk 128k
S35 = [(64, h, 8, b, nk) for h in (32, 64) for b, nk in ((64, 1024), (64, 4096), (1, 32768), (1, 131072))] + [
    (128, h, 8, 1, 131072) for h in (32, 64)]
# session 38 (--s38): batch 64 x 8 KV heads (512 CTAs, where `auto` runs the dual tiles up to Nk 4k) at Nk 1k / 2k /
# 4k, D 64 / 128, 32:8 / 64:8: on session 38's H100 the base tiles were 0.97x the dual ones at D 64 Nk 4k (1.03x at
# 1k), on session 4's H200 1.016x at D 64 Nk 4k; base vs dual on each card says where DUAL_MAX_SEQLEN_K should sit
S38 = [(d, h, 8, 64, nk) for d in (64, 128) for h in (32, 64) for nk in (1024, 2048, 4096)]
ALL_NQ1 = [(d, h, 8, b, nk) for d in (64, 128) for h in (32, 64) for b in (1, 8, 64)
           for nk in (1024, 4096, 32768, 131072)]

#: name -> (decode tile set, split policy, PDL merge, PDL attention kernel); policy: "auto" (the heuristic),
#: "half", "none" (1), "min1" (the heuristic allowing one-tile splits)
VARIANTS = {
    "pdl": ("base", "auto", True, False),
    "pdl2": ("base", "auto", True, True),
    "deep": ("deep", "auto", False, False),
    "deep+pdl2": ("deep", "auto", True, True),
    "wide+pdl2": ("wide", "auto", True, True),
    "dual+pdl2": ("dual", "auto", True, True),
    "deep+pdl2/2": ("deep", "half", True, True),
    "deep+pdl2 nosplit": ("deep", "none", False, True),
    "min1": ("base", "min1", False, False),
    "min1+pdl": ("base", "min1", True, False),
    "min1+pdl2": ("base", "min1", True, True),
}
#: name -> fa3 module switches set for each call of the public path (the rest as shipped: see ``flags``)
PUBLIC = {
    "two": dict(FUSED_MERGE="off"),
    "fused": dict(FUSED_MERGE="all"),
    "fused+pdl2": dict(FUSED_MERGE="all", DECODE_PDL=True),
    "dual+fused+pdl2": dict(FUSED_MERGE="all", DECODE_PDL=True, DECODE_TILES_CHOICE="dual"),
    "dual+two+pdl2": dict(FUSED_MERGE="off", DECODE_PDL=True, DECODE_TILES_CHOICE="dual"),
    # session 6: `auto` before it (two-tile splits at least, no PDL), and its switches on top of today's `auto`
    "old": dict(DECODE_PDL_MAX_SPLITS=0, SPLIT_MIN_TILES=2, DECODE_TILES_CHOICE="base", PACK_WIDE=False),
    "warp": dict(MERGE_WARP=True),
    "wide": dict(PACK_WIDE=True),
    "wide+warp": dict(PACK_WIDE=True, MERGE_WARP=True),
    "dualauto": dict(DECODE_TILES_CHOICE="auto"),
    "cand": dict(DECODE_TILES_CHOICE="auto", PACK_WIDE=True, MERGE_WARP=True),
    # session 7
    "warp+pdl16": dict(MERGE_WARP=True, DECODE_PDL_MAX_SPLITS=16),
    "row1": dict(DECODE_FIRST_ROW=True),
    # session 7, second decode round (--s8)
    "pdl16": dict(DECODE_PDL_MAX_SPLITS=16),
    # session 8 (--s9)
    "pers": dict(DECODE_FULL_GRID="persistent"),
    "pers3": dict(DECODE_FULL_GRID="persistent3"),
    # session 32 (--s9)
    "base": dict(DECODE_TILES_CHOICE="base"),
    # session 34 (--s34)
    "tiles-deep": dict(DECODE_TILES_CHOICE="deep"),
    "tiles-dual": dict(DECODE_TILES_CHOICE="dual"),
    "shipped": dict(),  # the shipped switches (what `auto` runs when the environment sets none)
}
#: the switches PUBLIC sets, at their shipped values (a variant sets all of them, its own on top); MERGE_WARP is
#: common.split_combine's, the rest fa3's
SHIPPED = dict(FUSED_MERGE="off", DECODE_PDL=False, DECODE_TILES_CHOICE="auto", DECODE_PDL_MAX_SPLITS=8,
               SPLIT_MIN_TILES=1, PACK_WIDE=None, MERGE_WARP=None, DECODE_FIRST_ROW=True,
               DECODE_PDL_MIN_SPLITS=1, DECODE_FULL_GRID="dual")
NUM_SMS_DEFAULT = 132  # H100/H200 SXM, for --plan without a GPU
REF_BATCHES = 8  # sequences of a shape each entry's output is checked on (the reference's cost)


def heuristic_splits(config, shape, num_sms: int, min_tiles: int | None = None) -> int:
    """``hopper.fa3.num_splits_for`` for a packed seqlen_q = 1 config, without tensors (``min_tiles``: the
    heuristic's fewest tiles per split; None: ``common.split.MIN_BLOCKS_PER_SPLIT``)."""
    from fa_variants.common import split

    d, h, hkv, b, nk = shape[:5]
    m_blocks = -(-(h // hkv) // config.tile_m)
    return split.num_splits_heuristic(m_blocks * hkv * b, -(-nk // config.tile_n), num_sms, min_tiles=min_tiles)


def seqlen_q(shape) -> int:
    return shape[5] if len(shape) > 5 else 1


def flags(name: str) -> dict:
    """The fa3 module switches of public variant `name` (``PUBLIC``; "auto": as the environment left them)."""
    return dict(SHIPPED, **PUBLIC[name])


def _owner(fa3, attr: str):
    return fa3.split_combine if attr == "MERGE_WARP" else fa3


def get_flags(fa3) -> dict:
    """The switches of SHIPPED as the modules hold them now."""
    return {attr: getattr(_owner(fa3, attr), attr) for attr in SHIPPED}


def set_flags(fa3, values: dict) -> None:
    for attr, value in values.items():
        setattr(_owner(fa3, attr), attr, value)


def public_entry(name: str, shape, num_sms: int):
    """(config or None (unsplit default), split count) that `auto` runs at `shape` with variant `name`'s switches,
    worked out on meta tensors with `num_sms` SMs."""
    import torch

    from fa_variants.common import split
    from fa_variants.hopper import fa3

    d, h, hkv, b, nk = shape[:5]
    q = torch.empty(b, seqlen_q(shape), h, d, dtype=torch.bfloat16, device="meta")
    k = torch.empty(b, nk, hkv, d, dtype=torch.bfloat16, device="meta")
    saved = get_flags(fa3) | {"_auto_splits": fa3._auto_splits}
    try:
        set_flags(fa3, flags(name))
        fa3._auto_splits = lambda ctas, n_blocks, index, min_tiles=None, per_sm=1: split.num_splits_heuristic(
            ctas, n_blocks, num_sms * per_sm, min_tiles=min_tiles)
        config = fa3._problem_config(None, q, k, True)
        return config, 1 if config is None or config.num_splits == 1 else fa3.num_splits_for(config, q, k, True)
    finally:
        set_flags(fa3, saved)


def entry(name: str, shape, num_sms: int):
    """(config, forced split count or None, pdl) of variant `name` at `shape`, or None where it does not apply."""
    from fa_variants.hopper import fa3

    if seqlen_q(shape) > 1:
        return None  # the explicit packed configs are seqlen_q = 1 views (PUBLIC variants cover the rest)
    tiles, policy, pdl, kernel_pdl = VARIANTS[name]
    d = shape[0]
    if tiles != "base" and not fa3.DECODE_TILES[tiles].get(d):
        return None  # same as another variant at this head dim
    split_cfg = fa3.decode_tiles(fa3._PACKED_SPLIT_CONFIGS[d], d, tiles, pdl=kernel_pdl)
    auto = heuristic_splits(split_cfg, shape, num_sms)
    if policy == "min1":  # the same count as `auto` at most shapes: timed anyway, an A/A check of the protocol
        splits = heuristic_splits(split_cfg, shape, num_sms, min_tiles=1)
        if splits == 1:
            return dataclasses.replace(split_cfg, num_splits=1), None, False
        return split_cfg, splits, pdl or kernel_pdl
    if policy != "auto" and auto == 1:
        return None  # not split anyway
    splits = {"auto": auto, "half": max(1, auto // 2), "none": 1}[policy]
    if policy == "half" and splits == 1:
        return None  # the nosplit variant
    if splits == 1:
        return dataclasses.replace(split_cfg, num_splits=1), None, False
    return split_cfg, (splits if policy != "auto" else None), pdl or kernel_pdl


def runs_as(name: str, config) -> tuple:
    """What public variant ``name`` runs with ``config`` (its config at a shape, None: the unsplit default): the
    config, and the merge kernel where there is a merge (MERGE_WARP, which the config does not carry)."""
    split = config is not None and config.num_splits != 1
    return config, flags(name)["MERGE_WARP"] if split else None


def plan(shapes, variants, num_sms: int, skip_same: bool = False) -> list[dict]:
    """Rows (shape, variant, splits, pdl, config[, public]) of every entry to time; ``skip_same``: not a public
    variant that runs at a shape what the shipped switches or a public variant listed before it run there
    (``runs_as``; its cell then reads "-")."""
    rows = []
    for shape in shapes:
        seen = {runs_as("shipped", public_entry("shipped", shape, num_sms)[0])}
        for name in variants:
            if name in PUBLIC:
                config, splits = public_entry(name, shape, num_sms)
                if skip_same:
                    if runs_as(name, config) in seen:
                        continue
                    seen.add(runs_as(name, config))
                rows.append(dict(shape=shape, variant=name, splits=splits, pdl=bool(config and config.pdl),
                                 config=config, public=True))
                continue
            e = entry(name, shape, num_sms)
            if e is not None:
                cfg, forced, pdl = e
                rows.append(dict(shape=shape, variant=name, splits=forced or heuristic_splits(cfg, shape, num_sms)
                                 if cfg.num_splits != 1 else 1, pdl=pdl, config=cfg))
    return rows


def compile_item(item) -> str:
    """Compile one kernel into the disk cache (a worker of ``compile_all``; CUTE_DSL_ARCH sm_90a, bf16): ``item`` =
    (kind, head_dim, causal, config) with kind "fa3" (config: its Sm90Config), "fa2" (its Sm80Config, or None: the
    launcher's default static config) or "merge" / "merge-fp16" (config: the merge's pdl flag or its MergeConfig;
    bf16 / fp16 outputs). Returns a line for the log."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from fa_variants import registry
    from fa_variants.common import split_combine

    kind, d, causal, cfg = item
    t = time.time()
    if kind in ("merge", "merge-fp16"):  # cfg: the pdl flag, or a MergeConfig
        cfg = cfg if isinstance(cfg, split_combine.MergeConfig) else split_combine.MergeConfig(pdl=cfg)
        registry.compiled(registry.static_config("split-merge", "sm_90a", "fp16" if kind == "merge-fp16" else "bf16",
                                                 d, False, cfg))
    elif kind == "fa2":  # as the launcher keys fa2's config (None: its default)
        registry.compiled(registry.static_config("fa2", "sm_90a", "bf16", d, causal, cfg))
    else:
        registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", d, causal, cfg))
    return f"{kind} D{d} {time.time() - t:.0f}s"


def merge_items(head_dims) -> list:
    """Every bf16 merge kernel (shared-memory and warp, plain and PDL) at these head dims: what `auto` and the
    variants may bind (``compile_item``'s items)."""
    from fa_variants.common.split_combine import MergeConfig

    return [("merge", d, False, MergeConfig(pdl=pdl, warp=warp))
            for d in head_dims for pdl in (False, True) for warp in (False, True)]


def plan_items(rows) -> set:
    """(kind, head_dim, causal, config) of every kernel the plan needs (``compile_item``'s items)."""
    from fa_variants.hopper import fa3

    items = {("fa3", r["shape"][0], True, r["config"]) for r in rows if r["config"] is not None}
    head_dims = {r["shape"][0] for r in rows}
    for d in head_dims:  # auto's own configs
        items |= {("fa3", d, True, fa3._PACKED_SPLIT_CONFIGS[d]), ("fa3", d, True, fa3._PACKED_CONFIGS[d])}
    return items | set(merge_items(head_dims))


def compile_all(items, jobs: int, name: str = "precompile") -> int:
    """Every item (``compile_item``'s) compiled in `jobs` spawned processes into the disk cache, once each (the GPU
    run then loads them); prints "<name>: N kernels in T s". Returns N (0: the disk cache is off, nothing done)."""
    from fa_variants.common import diskcache

    if not diskcache.enabled():
        print(f"{name}: skipped, the disk cache is off (FA_VARIANTS_DISK_CACHE); kernels compile on first use")
        return 0
    import multiprocessing

    todo = sorted(set(items), key=repr)
    t = time.time()
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(compile_item, todo))
    print(f"{name}: {len(done)} kernels in {time.time() - t:.0f}s ({jobs} processes)", flush=True)
    return len(done)


def gpu_num_sms() -> int:
    """SMs of GPU 0 when torch sees one, else NUM_SMS_DEFAULT (an H200's): the split counts a plan assumes."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).multi_processor_count
    except ImportError:
        pass
    return NUM_SMS_DEFAULT


def precompile_or_list(todo, jobs: int, name: str, list_only: bool) -> int:
    """The precompile scripts' last step: print `todo` (``--list``) or compile it (``compile_all``); exit status."""
    if list_only:
        for kind, d, causal, cfg in todo:
            print(f"{kind} D{d} causal={causal} {cfg}")
        print(f"{len(todo)} kernels")
        return 0
    compile_all(todo, jobs, name)
    return 0


def precompile_main(description: str, ab_flag: str, items, name: str) -> int:
    """The command line of the decode*_precompile scripts: --variants (this script's variants of the `ab_flag` A/B),
    --jobs, --list; ``items(variants, num_sms)`` listed or compiled (``precompile_or_list``); exit status."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--variants", nargs="*", default=[], help=f"scripts/decode_ab.py variants of the {ab_flag} A/B")
    p.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1))
    p.add_argument("--list", action="store_true", help="print what would be compiled and exit")
    a = p.parse_args()
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    return precompile_or_list(items(a.variants, gpu_num_sms()), a.jobs, name, a.list)


def precompile(rows, jobs: int) -> None:
    """Every kernel the plan needs, compiled in `jobs` processes into the disk cache (loaded later)."""
    compile_all(plan_items(rows), jobs)


class _Forced:
    """fa3's per-call split count pinned to `n` (the heuristic's lru-cached helper swapped for the call)."""

    def __init__(self, fa3, n):
        self.fa3, self.n = fa3, n

    def __enter__(self):
        self.saved = self.fa3._auto_splits
        if self.n is not None:
            self.fa3._auto_splits = lambda *args: self.n

    def __exit__(self, *exc):
        self.fa3._auto_splits = self.saved


def make_fn(row, q, k, v, fa3, split_combine):
    if row.get("public"):
        import fa_variants

        values = flags(row["variant"])

        def public():
            split_combine.MERGE_PDL = False
            set_flags(fa3, values)
            return fa_variants.attention(q, k, v, causal=True)
        return public
    cfg, forced, pdl = row["config"], row.get("forced"), row["pdl"]

    def fn():
        split_combine.MERGE_PDL = pdl
        with _Forced(fa3, forced):
            return fa3.run(q, k, v, causal=True, softmax_scale=q.shape[-1] ** -0.5, config=cfg)[0]
    return fn


def gpu_us(fn, reps: int, torch) -> float:
    """GPU us per call: `calls` calls in one CUDA graph, replayed `reps` times, median (CUDA events)."""
    fn()
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    fn()
    t1.record()
    t1.synchronize()
    calls = max(5, min(50, int(1000 / max(t0.elapsed_time(t1) * 1e3, 1.0))))
    from fa_variants.bench.decode import cuda_graph_of, median_ms

    graph = cuda_graph_of(fn, calls)
    graph.replay()
    return median_ms(graph.replay, calls, reps) * 1e3


def run(a, shapes, rows) -> int:
    import torch
    import torch.nn.functional as F

    import fa_variants
    from fa_variants.common import split_combine
    from fa_variants.hopper import fa3

    results = []
    shipped = get_flags(fa3)  # `auto`: the switches as the environment set them
    for i, shape in enumerate(shapes):
        d, h, hkv, b, nk = shape[:5]
        nq = seqlen_q(shape)
        g = torch.Generator(device="cuda").manual_seed(i)
        q = torch.randn(b, nq, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(b, nk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn_like(k)
        def sdpa():
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  enable_gqa=True).transpose(1, 2)

        def auto():
            split_combine.MERGE_PDL = False
            set_flags(fa3, shipped)
            return fa_variants.attention(q, k, v, causal=True)

        nb = min(b, REF_BATCHES)

        def reference():  # what every entry is checked against: causal bottom-right, as ours (SDPA's is_causal
            # is top-left, and the timed `sdpa` has no mask: the same answer at seqlen_q = 1 only); the first
            # REF_BATCHES sequences only (a masked GQA SDPA of B 64 Nk 32k Nq 16 expands K/V and the scores)
            rows_q = torch.arange(nk - nq, nk, device="cuda")[:, None]
            mask = torch.arange(nk, device="cuda")[None, :] <= rows_q
            return F.scaled_dot_product_attention(q[:nb].transpose(1, 2), k[:nb].transpose(1, 2),
                                                  v[:nb].transpose(1, 2), attn_mask=mask, enable_gqa=True).transpose(1, 2)

        fns = {"sdpa": sdpa, "auto": auto}
        mine = [r for r in rows if r["shape"] == shape]
        for r in mine:
            fns[r["variant"]] = make_fn(r, q, k, v, fa3, split_combine)
        res = dict(shape=shape, us={}, err={}, splits={r["variant"]: r["splits"] for r in mine})
        set_flags(fa3, shipped)
        res["splits"]["auto"] = fa3.auto_num_splits(q, k, True)
        names = list(fns)
        for name in names:
            try:  # run once (compile / load), then with a fresh Q: a merge that read the partials of the
                fns[name]()  # previous call (a PDL race) would give the old answer, not the new one
                q.normal_(generator=g)
                ref = (sdpa().float()[:nb] if name == "sdpa" else reference().float())
                res["err"][name] = (fns[name]().float()[:nb] - ref).abs().max().item()
            except Exception as exc:  # noqa: BLE001 - recorded, the plan goes on
                res["err"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
        ok = [n for n in names if isinstance(res["err"][n], float)]
        per_round = {n: [] for n in ok}
        for rnd in range(a.rounds):
            order = ok[rnd % len(ok):] + ok[:rnd % len(ok)]
            for name in order:
                try:
                    per_round[name].append(gpu_us(fns[name], a.reps, torch))
                except Exception as exc:  # noqa: BLE001 - e.g. a launch that graph capture refuses
                    res["err"][name] = f"timing: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
        split_combine.MERGE_PDL = False
        set_flags(fa3, shipped)
        res["us"] = {n: statistics.median(t) for n, t in per_round.items() if t}
        results.append(res)
        _write_json(a.out, torch, a, results)  # after every shape: a run cut by its time limit keeps what it timed
        best = min(res["us"], key=res["us"].get) if res["us"] else "-"
        print(f"[{i + 1}/{len(shapes)}] {label(shape)}: sdpa {res['us'].get('sdpa', math.nan):.1f} "
              f"auto {res['us'].get('auto', math.nan):.1f} best {best} {res['us'].get(best, math.nan):.1f} us", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    split_combine.MERGE_PDL = False
    from fa_variants.common import cache

    from fa_variants.bench.decode import gpu_identity, peak_tbps

    try:
        peak = peak_tbps(*gpu_identity())[0]
    except ValueError:
        peak = math.nan  # the HBM column then reads nan: the times and ratios stand
    text = summary(results, ["auto"] + list(a.variants), peak)
    print(f"kernels this process: {cache.cache_info()} (compiles should be 0 after the precompile)")
    from fa_variants.common import workspace

    used = {index: arena[1] for index, arena in workspace._ARENAS.items()}
    print(f"fused-merge counters of captured calls: {len(workspace._CAPTURED)} capture slices, arena ints used {used} "
          f"of {workspace.ARENA_COUNTERS} (a full arena means memsets in the graphs: fused timings too slow)")
    print(text)
    _write_json(a.out, torch, a, results)
    (Path(a.out) / "decode_ab.md").write_text(text + "\n")
    return 0


def _write_json(out_dir, torch, a, results) -> None:
    """decode_ab.json under out_dir: the run's meta and the results so far."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rounds=a.rounds, reps=a.reps)
    (out / "decode_ab.json").write_text(json.dumps(dict(meta=meta, results=results), indent=1, default=str))


def label(shape) -> str:
    d, h, hkv, b, nk = shape[:5]
    return f"D{d} {h}:{hkv} B{b} Nk{nk}" + (f" Nq{seqlen_q(shape)}" if seqlen_q(shape) > 1 else "")


def summary(results, variants, peak_tbps: float = 4.8) -> str:
    """Markdown: per shape GPU us of SDPA and the ratio ours / SDPA per variant (BAD: output off, -: n/a);
    then per variant the shapes <= SDPA and the geometric mean ratio over the shapes it ran."""
    head = "| shape | sdpa us | " + " | ".join(variants) + " |\n|" + "---|" * (len(variants) + 2)
    lines, wins, logs = [head], {v: [0, 0] for v in variants}, {v: [] for v in variants}
    for r in results:
        s = r["us"].get("sdpa")
        cells = []
        for v in variants:
            err = r["err"].get(v)
            if v not in r["err"]:
                cells.append("-")
            elif not isinstance(err, float) or err > 0.02:
                cells.append("BAD" if isinstance(err, float) else "ERR")
            elif s and v in r["us"]:
                x = r["us"][v] / s
                wins[v][0] += x <= 1.0
                wins[v][1] += 1
                logs[v].append(math.log(x))
                cells.append(f"{x:.2f} ({r['splits'].get(v, '?')})")
            else:
                cells.append("?")
        lines.append(f"| {label(r['shape'])} | {s:.1f} | " + " | ".join(cells) + " |" if s else
                     f"| {label(r['shape'])} | ? | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("ratio ours / SDPA GPU time (split count in parentheses); per variant: shapes <= SDPA / shapes run, "
                 "geomean ratio")
    for v in variants:
        gm = math.exp(sum(logs[v]) / len(logs[v])) if logs[v] else math.nan
        lines.append(f"  {v:14s} {wins[v][0]:3d} / {wins[v][1]:3d}   geomean {gm:.3f}")
    return "\n".join(lines + hbm_lines(results, variants, peak_tbps) + auto_lines(results, variants))


def auto_lines(results, variants) -> list[str]:
    """Per variant other than auto: its GPU time over auto's at the shapes it ran (without a BAD/ERR cell):
    shapes faster / run, geometric mean, best and worst ratio with their shapes; empty without such a variant."""
    out = []
    for v in variants:
        if v in ("auto", "sdpa"):
            continue
        pairs = [(r["us"][v] / r["us"]["auto"], label(r["shape"])) for r in results
                 if v in r["us"] and "auto" in r["us"] and isinstance(r["err"].get(v), float) and r["err"][v] <= 0.02]
        if not pairs:
            continue
        gm = math.exp(sum(math.log(x) for x, _ in pairs) / len(pairs))
        lo, hi = min(pairs), max(pairs)
        out.append(f"  {v:14s} vs auto: faster {sum(x < 1 for x, _ in pairs):2d} / {len(pairs):2d}, geomean {gm:.3f}, "
                   f"best {lo[0]:.3f} ({lo[1]}), worst {hi[0]:.3f} ({hi[1]})")
    return ["", "GPU time / auto's per variant (shapes it ran):"] + out if out else []


def hbm_lines(results, variants, peak_tbps: float = 4.8) -> list[str]:
    """Per shape of seqlen_k >= 32k: K/V bytes read / GPU time as % of the GPU's HBM peak (TB/s; 4.8: an H200;
    ``bench.decode.peak_tbps``), SDPA and each variant (issue 13's >= 70%); empty when there is none."""
    rows = [r for r in results if r["shape"][4] >= 32768 and r["us"]]
    if not rows:
        return []
    out = ["", f"HBM share at Nk >= 32k (K/V bytes / GPU time / {peak_tbps:g} TB/s, %): "
           + " ".join(["sdpa"] + list(variants))]
    for r in rows:
        d, h, hkv, b, nk = r["shape"][:5]
        nbytes = 4 * b * hkv * nk * d  # K and V, 2 bytes each
        cells = [f"{100 * nbytes / r['us'][v] / (peak_tbps * 1e6):.0f}" if v in r["us"] else "-"
                 for v in ["sdpa"] + list(variants)]
        out.append(f"  {label(r['shape'])}: " + " ".join(cells))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--plan", action="store_true", help="print the plan and exit (no GPU needed)")
    p.add_argument("--compile-only", action="store_true", help="compile the plan's kernels into the disk cache, exit")
    p.add_argument("--all-nq1", action="store_true", help="all 48 seqlen_q = 1 shapes, not only the 32 misses")
    p.add_argument("--wins", action="store_true", help="also the WINS shapes (seqlen_q 4 / 16, batch 64)")
    p.add_argument("--short-nk", action="store_true", help="SHORT_NK + CONTROLS instead of the 32 misses")
    p.add_argument("--s6", action="store_true", help="the session-6 set S6 instead of the 32 misses")
    p.add_argument("--s7", action="store_true", help="the session-7 set S7 instead of the 32 misses (and --skip-same)")
    p.add_argument("--s8", action="store_true", help="the session-8 set S8 instead of the 32 misses (and --skip-same)")
    p.add_argument("--s9", action="store_true", help="the session-8 batch-64 set S9 instead of the 32 misses (and --skip-same)")
    p.add_argument("--s10c", action="store_true", help="the session-10 set S10C, D 64 B 1 Nk 32k and guards (and --skip-same)")
    p.add_argument("--s33", action="store_true", help="the session-33 set S33, D 128 64:8 seqlen_q 16 (and --skip-same)")
    p.add_argument("--s34", action="store_true", help="the session-34 set S34, seqlen_q 1 at Nk 128k (and --skip-same)")
    p.add_argument("--s35", action="store_true", help="the session-35 set S35, an H100's ten misses (and --skip-same)")
    p.add_argument("--s38", action="store_true", help="the session-38 set S38, batch 64 Nk 1k-4k: base vs dual tiles (and --skip-same)")
    p.add_argument("--skip-same", action="store_true",
                   help="time no public variant where it runs the shipped config (same_as_shipped)")
    p.add_argument("--variants", nargs="+", default=[v for v in VARIANTS if not v.startswith("min1")],
                   choices=list(VARIANTS) + list(PUBLIC), help="default: the round-3 set (min1* by name only)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=5, help="graph replays per timing (median)")
    p.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="parallel compile processes")
    p.add_argument("--no-precompile", action="store_true",
                   help="skip the parallel precompile (a script already compiled the plan into the disk cache)")
    p.add_argument("--out", default=os.path.join(os.environ["OUT"], "decode_ab") if os.environ.get("OUT")
                   else "results/decode2/decode_ab")
    a = p.parse_args()
    shapes = (ALL_NQ1 if a.all_nq1 else SHORT_NK + CONTROLS if a.short_nk else S6 if a.s6 else S7 if a.s7 else
              S8 if a.s8 else S9 if a.s9 else S10C if a.s10c else S33 if a.s33 else S34 if a.s34 else S35 if a.s35 else
              S38 if a.s38 else MISSES) + (
        WINS if a.wins else [])
    gpu = not (a.plan or a.compile_only)
    if gpu:
        import torch

        if not torch.cuda.is_available():
            print("decode_ab: no CUDA GPU here (--plan prints the plan)")
            return 2
        num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    else:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        num_sms = NUM_SMS_DEFAULT
    rows = plan(shapes, a.variants, num_sms, a.skip_same or a.s7 or a.s8 or a.s9 or a.s10c or a.s33 or a.s34 or a.s35
                or a.s38)
    for r in rows:
        if not r.get("public"):
            r["forced"] = entry(r["variant"], r["shape"], num_sms)[1]
    if a.plan:
        from fa_variants.hopper import fa3

        print(f"{len(shapes)} shapes x (sdpa, auto, {len(a.variants)} variants where they apply): {len(rows)} fa3 "
              f"entries; {a.rounds} rounds; {len({(r['shape'][0], r['config']) for r in rows})} fa3 configs to compile")
        for shape in shapes:
            cfg = fa3.decode_tiles(fa3._PACKED_SPLIT_CONFIGS[shape[0]], shape[0], "base")
            auto = heuristic_splits(cfg, shape, num_sms) if seqlen_q(shape) == 1 else public_entry("two", shape, num_sms)[1]
            print(f"  {label(shape)}: auto splits {auto}; " + ", ".join(
                      f"{r['variant']} {r['splits']}" for r in rows if r["shape"] == shape))
        return 0
    if not a.no_precompile:
        precompile(rows, a.jobs)
    if a.compile_only:
        return 0
    return run(a, shapes, rows)


if __name__ == "__main__":
    sys.exit(main())
