"""FlashAttention-3 forward pass for Hopper (sm90) in the CuTe DSL: ``FlashAttention3Sm90``.

After Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, "FlashAttention-3: Fast and Accurate Attention
with Asynchrony and Low-precision" (2024), sections 3.1 and 3.2:

* Producer-consumer warp specialisation (3.1): warpgroup 0 is the producer; one of its warps
  issues every TMA load (Q once per CTA, then K and V tiles through a ``stages``-deep ring of
  shared-memory buffers guarded by mbarriers, ``cutlass.pipeline.PipelineTmaAsync``) and the
  warpgroup gives registers back (``setmaxnreg.dec``). The consumer warpgroups (64 query rows
  each) take those registers (``setmaxnreg.inc``) and compute.
* S = Q K^T is a WGMMA with both operands in shared memory; P stays in registers and
  O += P V is a WGMMA with A from registers (no shared-memory round trip for P).
* Ping-pong scheduling (3.1, Figure 1): named barriers hand the tensor cores from one consumer
  warpgroup to the next, so that one warpgroup's softmax runs under the other's GEMMs.
* Intra-warpgroup overlap (3.2, Figure 2, Algorithm 2): the GEMMs of iteration j (S_{j+1} =
  Q K_{j+1}^T and O += P_j V_j) are issued together, and the softmax of S_{j+1} runs while
  P_j V_j is still on the tensor cores.
* Online softmax with exp2, deferred normalisation and LSE (``common.softmax.OnlineSoftmax``, on
  (rows, cols) views of the WGMMA accumulators from ``common.layout.rows_cols``).
* Bottom-right causal masking (query i sees key j iff j <= i + seqlen_k - seqlen_q) with tile
  skipping: K/V tiles entirely to the right of a Q tile's diagonal are never loaded; only the tiles
  crossing the diagonal (and the last, partial one) are masked. Tile ranges and the mask (one select
  per score) from ``common.mask``.
* Any sequence lengths: TMA clips loads and stores at the tensor bounds (out-of-bounds rows read
  as zero and are never written back; keys past seqlen_k are masked to -inf).
* GQA/MQA: query head h reads K/V head h // (num_heads // num_heads_kv). Packed GQA for decode
  (``Sm90Config.pack_gqa``): the query heads sharing a KV head are the rows of one Q tile, so each K/V tile
  is read once per KV head; at seqlen_q = 1 through host-side views (``pack_gqa_views``), at seqlen_q > 1 with
  the group fixed at compile time (``pack_group``: Q, O, LSE viewed as ((G, seqlen_q)) rows in the kernel,
  ``common.pack_gqa``; causal per row's position). `auto` runs it in 64-row tiles (one consumer warpgroup,
  no ping-pong) when ``pack_helps``.
* Split-KV (Flash-Decoding, ``common.split``; ``Sm90Config.num_splits``): the K/V tiles of a query tile are cut
  over several CTAs, each storing an fp32 partial O and its LSE (in ``common.workspace``'s per-stream scratch);
  the merge kernel (``common.split_combine``) combines them, or, with ``Sm90Config.fused_merge``, the last CTA
  of each query tile to finish does (an arrival counter per tile, gpu-scope fences and atomic; one launch).

* Persistent grid (``Sm90Config.persistent``): one CTA per SM walks several (query tile, head, batch) tiles in
  ``common.tile_scheduler``'s order with its pipeline states carried, loading the next tile's K/V (and Q, where O
  has a buffer of its own) during the previous tile's epilogue. Without split-KV; `auto` runs it for short
  seqlen_k at head_dim 64 and 128 (``short_config``), where a CTA's fixed cost is a large share of its time, and
  for causal calls up to 4k keys (head_dim 256: 8k) with its tiles dealt by load from a host table
  (``Sm90Config.balanced``, ``common.tile_order``), which evens out the causal triangle's uneven tiles.

The output goes registers -> shared memory (reusing Q's buffer) -> global memory by a TMA store.
Ping-pong and intra-warpgroup overlap are switches of the config (``common.config.Sm90Config``, the FA3
paper's Table 2 ablation). Adapted from Dao-AILab/flash-attention:flash_attn/cute/flash_fwd_sm90.py::
FlashAttentionForwardSm90 and NVIDIA/cutlass:examples/python/CuTeDSL/cute/hopper/kernel/attention/fmha.py.

The module's ``VARIANT`` record (``common.launch.Variant``) registers it; ``run`` launches it. The kernel class
lives in ``hopper.fa3_kernel`` (the CuTe DSL), imported only to compile; this module is plain Python + torch.
"""

import dataclasses
import functools
import os

import torch

from fa_variants.common import env, interop, launch, pack_gqa, split, split_combine, tile_order, workspace
from fa_variants.common.cache import StaticConfig
from fa_variants.common.config import Sm90Config
from fa_variants.common.launch import Variant
from fa_variants.common.scale import LOG2_E, kernel_scale

ARCH = "sm_90a"  # the one compile target of fa3 (TMA, WGMMA, setmaxnreg)
HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 256)
DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)

Fa3Config = Sm90Config  # the FA3 family's config type (common/config.py)


# Tiles per head dim, measured on an H200 (bf16, B*N = 16k, H*D = 2048, N = 4k/16k; bench_fa3 --sweep):
# shared memory <= 227 KiB, no register spills with 240 (2 consumer warpgroups) or 160 (3) registers per
# consumer thread. D=64 gains ~15% from 3 consumer warpgroups (192 query rows per CTA: more FLOPs per K/V
# byte); D=128: 128 x 128 with 2 stages was not beaten by 112/144/160-wide tiles or 3-4 stages; D=256:
# 80-wide K/V tiles with ping-pong off (measured 1-3% faster than with it, and than 64-wide tiles).
# Softmax switches (issue 12, common.softmax): one FFMA per score against a consistent basis, row max and row sum
# in 4 independent chains (the serial FMNMX chain was one dependent instruction per score), O's rescale skipped
# when no row max moved. Chosen from the SASS before an H200 A/B (scripts/fa3_speed_ab.py times each undone).
# Softmax switches per head dim, from the H200 A/B of 2026-11-30 (scripts/fa3_speed_ab.py, 6 rotated rounds,
# bench/h200-2026-11-30/session2/fa3_speed_ab.md): D 64 gains 0-4% with all three; at D 128 skipping the unit
# rescale cost 2-4% (new vs new-no-skip at N 4k/16k), so it is off there; at D 256 the three together were
# 0.97-1.00x of none, so none. alpha_first at D 128 (every row's O rescale factor before the exponentials: the step's
# 32-64 rescale multiplies no longer trail the last exponential): alpha/new 1.021 / 1.020 / 1.022 at N 4k / 4k causal
# / 16k, paired, 6 rounds (bench/h200-2026-12-01-s8/fa3gap8_ab.md); D 64 0.998 (same), so off there.
# convert_pairs at D 256 (P and O converted to 16 bits two values at a time: one packed F2FP per pair instead of an
# F2FP per value and a PRMT per pair for tile_n 80's fragment): pairs-256/new 1.025 [1.017, 1.056] at N 4k and 1.020
# [1.010, 1.030] at N 16k, paired, 6 rounds, one H200, session 9 (scripts/fa3_speed_ab.py; bench/NOTES.md, "Session 9
# (2026-12-01): switches removed and the D 256 flip"); flash-attn-4's other D 256 choices on top were not faster
# (fa4-256/new 0.995 / 0.983, alpha-256/new 0.963 / 0.955).
# hoisted_descriptors at D 64 (the K/V ring's WGMMA descriptors built once per tile, out of the ping-pong turn: its
# BAR.SYNC .. BAR.ARV 55 -> 45 instructions): turn/new 1.011 / 1.012 / 1.001 / 1.000 at N 4k / 16k / 4k causal / 16k
# causal, paired, 6 rounds, one H200, session 12 (scripts/fa3_speed_ab.py --variants old,new,turn; bench/NOTES.md,
# "Session 12 (2026-12-02): fa3's ping-pong turn, ..."). At D 128 (its turn 71 -> 61 instructions), session 15:
# turn/new 1.008 / 1.012 / 1.015 at N 16k causal / 4k / 16k, "faster" at each (paired, 6 rounds, one H200; N 4k causal
# cut by the run's limit, 1.002-1.007 in three earlier runs, never slower), so on for D 128's prefill config
# (bench/NOTES.md, "Session 15 (2026-12-02): outcome of the turn128 run"); its split and packed (decode) configs keep
# it off, the kernels their A/Bs measured (_DECODE_KEEPS).
_SOFTMAX = dict(exp2_ffma=True, reduce_chains=4, skip_unit_rescale=True)
_SOFTMAX_NO_SKIP = dict(exp2_ffma=True, reduce_chains=4, skip_unit_rescale=False)
DEFAULT_CONFIGS: dict[int, Sm90Config] = {
    64: Sm90Config(tile_m=192, tile_n=128, stages=2, **_SOFTMAX, hoisted_descriptors=True),
    96: Sm90Config(tile_m=128, tile_n=128, stages=2, **_SOFTMAX_NO_SKIP),
    128: Sm90Config(tile_m=128, tile_n=128, stages=2, **_SOFTMAX_NO_SKIP, alpha_first=True, hoisted_descriptors=True),
    256: Sm90Config(tile_m=128, tile_n=80, stages=2, pingpong=False, convert_pairs=True),
}
# Causal calls differ from DEFAULT_CONFIGS where a causal A/B said so. D 256 converts P per value (convert_pairs
# off): old / new 1.006 / 1.035 / 1.064 / 1.070 / 1.089 at causal N 1k / 2k / 4k / 8k / 16k (old = the default
# without convert_pairs there; "faster" at N 2k-16k, "same" at 1k), but pairs stay faster non-causal (new / old 1.022 /
# 1.017 at N 4k / 16k); the balanced grid without it: balanced-nopairs / flash-attn-4 0.995 / 0.994 / 0.985 / 0.970 at
# N 1k-8k. Paired, 6 rounds, one H200, session 19 (scripts/fa3_speed_ab.py --variants old,new,balanced,
# balanced-nopairs; bench/NOTES.md, "Session 19 (2026-12-03): D 256's P conversion, causal and not").
_CAUSAL_CHANGES: dict[int, dict] = {256: dict(convert_pairs=False)}
CAUSAL_CONFIGS: dict[int, Sm90Config] = {d: dataclasses.replace(c, **_CAUSAL_CHANGES.get(d, {}))
                                         for d, c in DEFAULT_CONFIGS.items()}
# Short sequences: a CTA of the default grid walks only seqlen_k / tile_n K/V tiles (4 at N 512), so its fixed cost
# (launch, set-up, Q and first K/V latency, epilogue) is a third of its time. The persistent grid (one CTA per SM
# walking several tiles, the next tile's loads under the current one's epilogue) pays it once per SM: persistent / new
# at N 512 / 1k, paired, 6 rounds, one H200, session 16 (scripts/fa3_speed_ab.py --variants old,new,persistent;
# bench/NOTES.md, "Session 16 (2026-12-02): short sequences ..."): D 64 1.123 / 1.063 (causal 1.202 / 1.105), D 128
# 1.195 / 1.108 (causal 1.256 / 1.077), "faster" at each; D 256 1.010 / 0.986 (Q waits for O's store there): not
# taken. At N 2k: D 64 1.034 (causal 1.027), D 128 1.037 (causal 0.977); N 4k D 128 1.003. Session 17 (the same
# A/B at the boundary, bench/NOTES.md "Session 17 (2026-12-02): short prefill, the boundary"): persistent / new at
# D 64 / 128, N 1536 non-causal 1.048 / 1.057, causal 1.084 / 1.036; N 2k non-causal 1.033 / 1.033, causal 1.022 /
# 0.975; N 3072 non-causal 1.023 / 1.015; D 64 N 4k 1.007. So `auto` runs it for unsplit, unpacked calls at
# SHORT_HEAD_DIMS with seqlen_k <= SHORT_MAX_SEQLEN_K (3072; FA_VARIANTS_SHORT_PERSISTENT=N, 0: off), causal ones with
# seqlen_k <= SHORT_MAX_SEQLEN_K_CAUSAL too (1536; FA_VARIANTS_SHORT_PERSISTENT_CAUSAL=N), when the query tiles
# outnumber the SMs (one tile per CTA has nothing to overlap). At D 64, causal calls with seqlen_k <=
# SHORT_NARROW_MAX_SEQLEN_K (1024; FA_VARIANTS_SHORT_NARROW_CAUSAL=N, 0: off) take 128-row tiles instead of 192: twice
# as many query tiles spread the causal triangle's uneven work over the SMs; persistent-m128 / persistent (session 17)
# 1.123 at N 512, 1.125 at N 1k causal, but 0.92 at N 1536 causal, 0.99 at N 2k causal, 0.83-0.97 non-causal.
SHORT_HEAD_DIMS: tuple[int, ...] = (64, 128)
SHORT_MAX_SEQLEN_K = env.integer("FA_VARIANTS_SHORT_PERSISTENT", "3072", 0, "largest seqlen_k; 0: off")
SHORT_MAX_SEQLEN_K_CAUSAL = env.integer("FA_VARIANTS_SHORT_PERSISTENT_CAUSAL", "1536", 0,
                                        "largest seqlen_k of a causal call; 0: off")
SHORT_NARROW_MAX_SEQLEN_K = env.integer("FA_VARIANTS_SHORT_NARROW_CAUSAL", "1024", 0,
                                        "largest seqlen_k of a causal head_dim 64 call on 128-row tiles; 0: off")
# Causal calls deal their tiles by load (Sm90Config.balanced, common.tile_order: each round's tiles to the CTAs with
# the least work so far, from a host table made once per shape) instead of the static schedule, whose most loaded
# CTA runs 10-15 % past the mean under the causal triangle (D 256: 13-38 %). balanced / new (the one-CTA-per-tile
# grid), paired, 6 rounds, one H200, session 18 (bench/NOTES.md, "Session 18 (2026-12-03): ..."): D 128 N 1k / 2k /
# 4k / 8k / 16k causal 1.181 / 1.098 / 1.036 / 0.997 / 0.964; D 64 N 512 / 1k (128-row tiles) 1.351 / 1.246, N 2k /
# 4k / 8k 1.084 / 1.035 / 0.999; D 256 N 1k / 2k / 4k / 8k 1.044 / 1.048 / 1.053 / 1.040 (where the static persistent
# grid lost: 0.774 at N 4k); non-causal (equal costs: the static order) 1.007 at D 128 N 4k. So `auto` runs it for
# causal calls with seqlen_k <= BALANCED_MAX_SEQLEN_K[head_dim] (FA_VARIANTS_SHORT_BALANCED=0: off, causal calls
# then take the static schedule up to SHORT_MAX_SEQLEN_K_CAUSAL), except a kind of call first seen inside CUDA
# graph capture (its table cannot be made there: the static schedule, or the default grid past its limit).
SHORT_BALANCED = env.flag("FA_VARIANTS_SHORT_BALANCED", True)
#: head dim -> the largest seqlen_k of a causal call on the balanced grid (the longest N "faster" in session 18)
BALANCED_MAX_SEQLEN_K: dict[int, int] = {64: 4096, 128: 4096, 256: 8192}
#: (head dim, causal) -> its default on the persistent grid (SHORT_HEAD_DIMS: the static schedule's;
#: BALANCED_MAX_SEQLEN_K's, causal only)
_SHORT_CONFIGS: dict[tuple[int, bool], Sm90Config] = {
    (d, causal): dataclasses.replace((CAUSAL_CONFIGS if causal else DEFAULT_CONFIGS)[d], persistent=True)
    for d in sorted({*SHORT_HEAD_DIMS, *BALANCED_MAX_SEQLEN_K}) for causal in (False, True)
    if causal or d in SHORT_HEAD_DIMS}
#: head dim -> the short causal config on narrower query tiles (SHORT_NARROW_MAX_SEQLEN_K)
_SHORT_NARROW_CONFIGS: dict[int, Sm90Config] = {64: dataclasses.replace(_SHORT_CONFIGS[64, True], tile_m=128)}


def short_config(q: torch.Tensor, k: torch.Tensor, causal: bool) -> Sm90Config | None:
    """The persistent config `auto` runs an unsplit, unpacked call of q, k with, or None (the head dim's default),
    when there are more query tiles (x heads x batch) than the GPU has SMs, so that some CTA walks two tiles (a grid of
    one tile per CTA gains nothing; the A/B timed 15-60 waves):
    - causal, seqlen_k <= BALANCED_MAX_SEQLEN_K[head_dim] and two or more query tiles per head (their costs differ;
      one query tile, e.g. decode rows: all cost the same, the static schedule's case) (SHORT_BALANCED): the tiles
      dealt by load (``balanced``); in CUDA graph capture only when the shape's table was made before, and for a
      new shape only while the tables kept take less than TABLES_MAX_BYTES;
    - otherwise at SHORT_HEAD_DIMS, 0 < seqlen_k <= SHORT_MAX_SEQLEN_K (causal: and <= SHORT_MAX_SEQLEN_K_CAUSAL):
      the static schedule;
    and at head_dim 64 a causal call with seqlen_k <= SHORT_NARROW_MAX_SEQLEN_K on 128-row tiles
    (_SHORT_NARROW_CONFIGS). SHORT_MAX_SEQLEN_K = 0 turns all of it off; SHORT_MAX_SEQLEN_K_CAUSAL = 0 its causal
    calls."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k = k.shape[1]
    if seqlen_k <= 0 or not SHORT_MAX_SEQLEN_K or (causal and not SHORT_MAX_SEQLEN_K_CAUSAL):
        return None
    config = _SHORT_CONFIGS.get((head_dim, causal))
    if config is None:
        return None
    if causal and seqlen_k <= SHORT_NARROW_MAX_SEQLEN_K:
        config = _SHORT_NARROW_CONFIGS.get(head_dim, config)
    tiles = -(-seqlen_q // config.tile_m) * heads * batch
    if tiles <= _sm_count(q):
        return None
    if causal and SHORT_BALANCED and seqlen_q > config.tile_m and seqlen_k <= BALANCED_MAX_SEQLEN_K.get(head_dim, 0):
        balanced = _balanced(config)
        if table_allowed(balanced, q, k, causal, tiles):
            return balanced
    limit = min(SHORT_MAX_SEQLEN_K, SHORT_MAX_SEQLEN_K_CAUSAL) if causal else SHORT_MAX_SEQLEN_K
    return config if head_dim in SHORT_HEAD_DIMS and seqlen_k <= limit else None


@functools.cache
def _balanced(config: Sm90Config) -> Sm90Config:
    """config with its tiles dealt by load (``Sm90Config.balanced``; one object per config: the launcher's keys)."""
    return dataclasses.replace(config, balanced=True)


#: (device, table geometry) -> the tile table of ``Sm90Config.balanced`` on that device, kept for the process (a
#: CUDA graph captured with it keeps its address after the launcher's plan is gone): 4 bytes per work tile per shape
_TABLES: dict[tuple, torch.Tensor] = {}
#: the bound on the tables' bytes: a process that sees many shapes (a server's prompt lengths) stops making tables at
#: 64 MiB (~16 Ki shapes of 1024 tiles) and runs its later new shapes on the static schedule (short_config)
TABLES_MAX_BYTES = 64 << 20


def table_allowed(config: Sm90Config, q: torch.Tensor, k: torch.Tensor, causal: bool, tiles: int,
                  l2_heads: int | None = None) -> bool:
    """Whether a call of ``tiles`` work tiles may run on the balanced grid: its table exists already, or it can be
    made now (not inside CUDA graph capture) within TABLES_MAX_BYTES (``balanced_table``'s arguments)."""
    return _table_key(config, q, k, causal, l2_heads) in _TABLES or (not workspace.capturing(q.device) and 4 * (
        tiles + sum(t.numel() for t in _TABLES.values())) <= TABLES_MAX_BYTES)


def balanced_table(config: Sm90Config, q: torch.Tensor, k: torch.Tensor, causal: bool,
                   l2_heads: int | None = None) -> torch.Tensor:
    """The tile table of ``Sm90Config.balanced`` for q, k (int32 on q's device, one entry per work tile:
    ``common.tile_order.balanced_order`` over the causal costs of ``tile_coords``'s order; equal costs when not
    causal: the static schedule's own order), made once per device and geometry outside any graph's memory pool
    (``workspace.persistent``). Raises ValueError when it is first needed during CUDA graph capture (a host copy
    cannot be captured): run the call once before capturing. ``l2_heads``: the L2 section the kernel is launched with
    (default ``l2_section_heads`` of 16-bit K/V; fa3-fp8 passes its own, of e4m3 K/V), which orders the tiles."""
    batch, seqlen_q, heads, head_dim = q.shape
    ctas = _sm_count(q)
    l2_heads = l2_section_heads(k.shape[1], head_dim) if l2_heads is None else l2_heads
    key = _table_key(config, q, k, causal, l2_heads)
    table = _TABLES.get(key)
    if table is not None:
        return table
    if workspace.capturing(q.device):
        raise ValueError("config.balanced=True: its tile table is made on the first call of a shape, which cannot "
                         "be captured in a CUDA graph; run the call once before capturing")
    num_m_blocks = -(-seqlen_q // config.tile_m)
    m_blocks = tile_order.tile_m_blocks(num_m_blocks, heads, batch, l2_heads, causal)
    if causal:
        costs = tile_order.causal_tile_costs(m_blocks, config.tile_m, config.tile_n, seqlen_q, k.shape[1])
    else:
        costs = torch.ones(len(m_blocks), dtype=torch.float64)
    host = tile_order.balanced_order(costs, ctas)
    table = _TABLES[key] = workspace.persistent(q.device, lambda: host.to(q.device))
    return table


def _table_key(config: Sm90Config, q: torch.Tensor, k: torch.Tensor, causal: bool, l2_heads: int | None = None) -> tuple:
    """balanced_table's key: the device, the call's shape, its tiles, the L2 section and the grid's CTA count."""
    l2_heads = l2_section_heads(k.shape[1], q.shape[3]) if l2_heads is None else l2_heads
    return (q.device, tuple(q.shape), k.shape[1], causal, config.tile_m, config.tile_n, l2_heads, _sm_count(q))


def _sm_count(q: torch.Tensor) -> int:
    """The SMs of q's GPU (132, an H100 / H200's, for tensors elsewhere: the CPU tests' launches)."""
    return split.sm_count(q.device.index or 0) if q.is_cuda else 132


# What `auto` runs when the split heuristic splits a shape (decode): the default tiles with the split count
# chosen per call (one compile for every decode shape of a head dim).
# Switches flipped on a head dim's prefill config after the split / decode A/Bs that those kernels keep (above).
_DECODE_KEEPS: dict[int, dict] = {128: dict(hoisted_descriptors=False)}
_SPLIT_CONFIGS: dict[int, Sm90Config] = {d: dataclasses.replace(c, num_splits=0, **_DECODE_KEEPS.get(d, {}))
                                         for d, c in DEFAULT_CONFIGS.items()}
# ... and with the query heads of a KV head packed into the tile rows (decode, seqlen_q = 1), in 64-row tiles
# (one consumer warpgroup, no ping-pong): a group of 4-8 query heads fills few rows, and every row of the tile
# costs tensor-core time (at B=64, Nk=4k, 32:8, D=128 the 128-row tile's MMAs take about as long as reading
# K/V at full HBM bandwidth; 64 rows halve that, 192 at D=64 would triple it). Groups over 64 take more tiles.
# alpha_first and convert_pairs (timed on prefill tiles only) stay off there: decode keeps the kernels its A/Bs measured.
_NARROW = dict(tile_m=64, pingpong=False, alpha_first=False, convert_pairs=False)
_PACKED_CONFIGS = {d: dataclasses.replace(c, pack_gqa=True, **_NARROW, **_DECODE_KEEPS.get(d, {}))
                   for d, c in DEFAULT_CONFIGS.items()}
_PACKED_SPLIT_CONFIGS = {d: dataclasses.replace(c, pack_gqa=True, **_NARROW) for d, c in _SPLIT_CONFIGS.items()}
# Decode proper (seqlen_q = 1, packed from host views: only G of the 64 rows are real) streams K/V with almost
# no tensor-core work per byte, so its speed is the bytes in flight per SM: 2 stages of K and V tiles are 64 KiB
# at D 64 (128 x 64 x 2 B x 2 x 2), about what Little's law asks for 4.8 TB/s over 132 SMs at ~1.5 us of
# loaded latency, and D 64 ran 86-97% of SDPA's time-equivalent bandwidth there (D 128, 128 KiB in flight,
# matched it). Candidate tile sets per head dim (shared memory: 64-row Q + stages x (K + V) tiles <= 227 KiB);
# FA_VARIANTS_DECODE_TILES picks the one `auto` runs ("base": the packed config as is; default "auto":
# ``decode_choice``, from the H200 A/Bs of scripts/decode_ab.py).
DECODE_TILES: dict[str, dict[int, dict]] = {
    "base": {},
    "deep": {64: dict(stages=4), 96: dict(stages=3), 128: dict(stages=3)},   # 128 / 144 / 192 KiB in flight
    "wide": {64: dict(tile_n=192, stages=3)},                                # 144 KiB, 2/3 the tile steps
    # two CTAs per SM (73 / 81 KiB of shared memory each): one CTA's prologue (launch, Q and first K/V tile
    # latency) and epilogue run under the other's streaming, for grids of several short CTAs (B 64, Nk 1k:
    # 512 CTAs of 8 tiles, ~4 waves, each wave paying its prologue with one CTA per SM)
    "dual": {64: dict(ctas_per_sm=2), 96: dict(tile_n=64, ctas_per_sm=2), 128: dict(tile_n=64, ctas_per_sm=2)},
    # a persistent grid (``Sm90Config.persistent``: one CTA per SM walks several (batch, KV head) tiles, its producer
    # loading the next tile's Q and first K/V tiles while the consumer finishes the current one), for the same
    # grids of many short CTAs; unsplit calls only (``decode_tiles``: a split call keeps the base tiles)
    "persistent": {64: dict(persistent=True), 96: dict(persistent=True), 128: dict(persistent=True)},
    "persistent3": {64: dict(persistent=True, stages=3), 96: dict(persistent=True, stages=3),
                    128: dict(persistent=True, stages=3)},  # 3 K/V stages: 105 / 161 / 225 KiB (O separate)
}
#: the tile sets that apply to unsplit calls only (``decode_tiles``)
UNSPLIT_ONLY_TILES = ("persistent", "persistent3")
# "auto" (``decode_choice``): "dual" for calls of many short CTAs, "base" otherwise.
DECODE_TILES_CHOICE = env.choice("FA_VARIANTS_DECODE_TILES", "auto", (*DECODE_TILES, "auto"))
#: `auto` (the default since session 6; FA_VARIANTS_DECODE_TILES=base: never "dual") runs "dual" when batch x
#: heads_kv >= DUAL_MIN_CTAS and seqlen_k <= DUAL_MAX_SEQLEN_K. 512 from the s6 H200 A/B (scripts/decode_ab.py
#: --s6, "dualauto" at the old threshold 64): at B 64 x 8 KV heads Nk 1k (512 CTAs, unsplit with either
#: tile set) dual beat base, D 64 32:8 1.14 -> 1.03x SDPA and D 128 64:8 1.01 -> 0.98x; at B 8 x 8 (64 CTAs)
#: dual's doubled CTA slots double the split count (2 -> 4) and it lost at all six B 8 shapes (D 64 32:8 Nk 1k
#: 1.08 -> 1.13x, Nk 4k 0.98 -> 1.01x; D 128 32:8 and 64:8 Nk 1k 0.95 -> 1.01x, 0.94 -> 1.00x). 512 is the smallest measured
#: count where dual won; 65..511 (unmeasured) keep base. Not B 1 nor Nk 32k+ (dual lost up to 13% at B 1 in s4).
DUAL_MIN_CTAS = 512
DUAL_MAX_SEQLEN_K = 4096
#: The tile set "auto" runs for those grids of many short CTAs (B x Hkv >= DUAL_MIN_CTAS, Nk <= DUAL_MAX_SEQLEN_K):
#: "dual" (the default), or "persistent" / "persistent3" (FA_VARIANTS_DECODE_FULL_GRID; off: timed in session 8's
#: H200 A/B, scripts/decode_ab.py --s9 pers / pers3). Why (bench/NOTES.md, "Session 8 (2026-12-01): decode ..."): at B 64 Nk 1k, 8 KV heads, the
#: dual grid is 512 CTAs of 8 K/V tiles on 264 slots, two waves in step (both CTAs of an SM start and end together),
#: each wave paying the launch, the Q and first K/V latency and the drain of its last tiles with nothing else in flight
#: on the SM: ~5 us of 35 (1.01x SDPA). A persistent CTA loads the next tile's Q and K/V under the current one's end.
DECODE_FULL_GRID = env.choice("FA_VARIANTS_DECODE_FULL_GRID", "dual", ("dual", "persistent", "persistent3"))


def decode_choice(batch: int, heads_kv: int, seqlen_k: int, choice: str | None = None) -> str:
    """The decode tile set a packed seqlen_q = 1 call runs: ``choice`` (default DECODE_TILES_CHOICE), with "auto"
    resolved by the shape: DECODE_FULL_GRID ("dual" by default) when batch x heads_kv >= DUAL_MIN_CTAS and seqlen_k
    <= DUAL_MAX_SEQLEN_K, else "base"."""
    choice = choice or DECODE_TILES_CHOICE
    if choice != "auto":
        return choice
    return DECODE_FULL_GRID if batch * heads_kv >= DUAL_MIN_CTAS and seqlen_k <= DUAL_MAX_SEQLEN_K else "base"


#: Whether packed seqlen_q = 1 decode launches as a programmatic dependent (``Sm90Config.pdl``; its split
#: merge too): its launch and shared-memory setup overlap the tail of the kernel before it (FA_VARIANTS_DECODE_PDL=1:
#: always; else as DECODE_PDL_MAX_SPLITS says).
DECODE_PDL = env.flag("FA_VARIANTS_DECODE_PDL", False)

#: `auto`'s packed seqlen_q = 1 split calls of 2..DECODE_PDL_MAX_SPLITS splits launch the split kernel and the
#: merge as programmatic dependents (FA_VARIANTS_DECODE_PDL_MAX_SPLITS; 0: never by itself, the default before
#: session 6). 8 from the 2026-12-01 s6 H200 A/B (bench/NOTES.md, "Session 6 (2026-12-01): decode at Nq 1 and
#: packed Nq 16"): pdl2 / min1+pdl2 beat `auto` at all 12 shapes of 2, 4 and 8 splits (B 1 Nk 1k, B 8 Nk 1k / 4k:
#: 0.94-1.16x SDPA against 0.99-1.27x) and lost at 3 of the 4 B 1 Nk 4k shapes of 16 splits (1.19-1.37x against
#: 1.01-1.12x).
DECODE_PDL_MAX_SPLITS = env.integer("FA_VARIANTS_DECODE_PDL_MAX_SPLITS", "8", 0)
#: ... and from DECODE_PDL_MIN_SPLITS splits up (FA_VARIANTS_DECODE_PDL_MIN_SPLITS; 2: split calls only). 1, the
#: default since session 10, adds the unsplit packed seqlen_q = 1 calls (B 8-64: the kernel alone, no merge), whose
#: launch and setup then overlap the tail of the kernel before them: in session 10's H200 A/B (scripts/decode_ab.py
#: "pdl1") it was faster than 2 at 8 / 9 batch-64 shapes (geomean 0.993, worst 1.001; <= SDPA at 9 against 7).
DECODE_PDL_MIN_SPLITS = env.integer("FA_VARIANTS_DECODE_PDL_MIN_SPLITS", "1", 1)
#: The fewest K/V tiles per split fa3's `auto` gives the heuristic (``common.split.num_splits_heuristic``'s
#: min_tiles; FA_VARIANTS_SPLIT_MIN_TILES, which fa2 reads too with its own default 2): 1 from the same A/B
#: (min1 below `auto` at all four B 1 Nk 1k shapes, the only ones whose count changes: 8 one-tile splits
#: instead of 4 of two tiles; elsewhere the count is the same).
SPLIT_MIN_TILES = env.integer("FA_VARIANTS_SPLIT_MIN_TILES", "1", 1, "K/V tiles per split")
#: Packed GQA at 1 < seqlen_q in 128-row tiles (two consumer warpgroups, ping-pong) when a KV head's G x seqlen_q
#: rows exceed one 64-row tile but fit 128 (64:8 at Nq 16: 128 rows): K/V read once per KV head instead of
#: twice. FA_VARIANTS_PACK_WIDE=1: always (True); 0: never (False); unset or "auto" (None, the default since
#: session 6): ``wide_helps``. From the s6 H200 A/B (scripts/decode_ab.py --s6, "wide"): at D 64 wide won
#: at all 4 shapes it changed (64:8 Nq 16: B 1 Nk 32k 0.13 -> 0.11x SDPA, B 8 0.20 -> 0.16x, B 64 0.21 -> 0.15x,
#: B 64 Nk 1k 0.25 -> 0.18x; HBM share 39 -> 45, 51 -> 64, 48 -> 67%); at D 128 it won where the split count
#: stayed (B 64 Nk 32k 0.22 -> 0.16x, split 1) and lost at B 8 Nk 4k (0.23 -> 0.30x) where the halved CTA count
#: (64 instead of 128) made the heuristic split 1 -> 2 (B 8 Nk 32k, also 1 -> 2, won 0.18 -> 0.16x; B 1 Nk 32k
#: 8 -> 16 splits, 0.12x either way).
PACK_WIDE: bool | None = env.auto_flag("FA_VARIANTS_PACK_WIDE")
#: head dims where `auto` always takes the wide tile; WIDE_SAME_SPLITS_HEAD_DIMS: only where it adds no split or
#: seqlen_k >= WIDE_LONG_SEQLEN_K. The second from the session 33 H200 A/B (scripts/decode_ab.py --s33, "wide", D 128
#: 64:8 Nq 16, 6 rounds; bench/NOTES.md "Session 33 ... the wide packed tile at head_dim 128"): wide / auto at B 1 /
#: B 8 (16 / 2 splits against 8 / 1) Nk 4k 1.061 / 1.278, Nk 16k 0.982 / 0.985, Nk 32k 0.977 / 0.888, Nk 128k 0.732 /
#: 0.753 (HBM share 61 -> 84 %, 66 -> 88 %): from 16k keys the extra split costs less than the second K/V read.
WIDE_ALWAYS_HEAD_DIMS = (64,)
WIDE_SAME_SPLITS_HEAD_DIMS = (128,)
WIDE_LONG_SEQLEN_K = 16384
WIDE_TILE_M = 128
_WIDE = dict(tile_m=WIDE_TILE_M, pingpong=True)  # the 128-row packed tile's Sm90Config fields


#: Whether `auto`'s packed seqlen_q = 1 calls with at most FIRST_ROW_MAX_GROUP query heads per KV head run
#: ``Sm90Config.first_row_only`` (on since the H200 A/B of session 7, scripts/decode_ab.py --s7: GPU time / before
#: 0.93-1.01 over 11 seqlen_q 1 shapes, geomean 0.975; FA_VARIANTS_DECODE_FIRST_ROW=0 turns it off): the 64-row tile holds G <= 8 real rows, all in the first of the two rows each thread owns, so the softmax of the
#: second (padding) is skipped. Why (bench/NOTES.md, "Session 7 (2026-12-01): decode"): at short Nk a split CTA's
#: time per K/V tile is its consumer's (the s4 A/B's 4-stage "deep" tiles did not help B 8 Nk 1k), ~0.65 us at D 64
#: of which ~0.35 us is the 64-row softmax.
DECODE_FIRST_ROW = env.flag("FA_VARIANTS_DECODE_FIRST_ROW", True)
FIRST_ROW_MAX_GROUP = 8  # rows 0-7 of warp 0: the first row of lanes 0-31 (common.layout.rows_cols)


def first_row(config: Sm90Config, group: int, on: bool | None = None) -> Sm90Config:
    """config with ``first_row_only`` when ``on`` (default DECODE_FIRST_ROW) and the packed seqlen_q = 1 tile holds
    at most FIRST_ROW_MAX_GROUP rows (``group`` query heads per KV head) and no fused merge (which has no
    first_row_only); else config unchanged."""
    if (not (DECODE_FIRST_ROW if on is None else on) or group > FIRST_ROW_MAX_GROUP or config.tile_m != 64
            or config.fused_merge):
        return config
    return dataclasses.replace(config, first_row_only=True)


def decode_tiles(config: Sm90Config, head_dim: int, choice: str | None = None, pdl: bool | None = None) -> Sm90Config:
    """The packed seqlen_q = 1 config with the decode tile set ``choice`` (default DECODE_TILES_CHOICE) and
    ``pdl`` (default DECODE_PDL) applied; a set of UNSPLIT_ONLY_TILES applies to an unsplit config (num_splits 1)
    only: a split one keeps the base tiles."""
    choice = choice or DECODE_TILES_CHOICE
    if choice in UNSPLIT_ONLY_TILES and config.num_splits != 1:
        choice = "base"
    fields = dict(DECODE_TILES["base" if choice == "auto" else choice].get(head_dim, {}))  # auto: decode_choice
    if DECODE_PDL if pdl is None else pdl:
        fields["pdl"] = True
    return dataclasses.replace(config, **fields) if fields else config


# ---------------------------------------------------------------------------------------------
# Registration with the compile cache, and the backend entry point (the kernel: hopper/fa3_kernel.py)
# ---------------------------------------------------------------------------------------------


L2_BYTES = 50 * 1024 * 1024  # H100/H200 L2

#: names of the DSL kernel module (``hopper.fa3_kernel``) this module hands out on first use, so that the
#: backend imports without the CuTe DSL (a warm disk cache never needs it)
_KERNEL_NAMES = ("FlashAttention3Sm90", "_StepContext", "REGISTERS")


def __getattr__(name: str):
    if name in _KERNEL_NAMES:
        from fa_variants.hopper import fa3_kernel

        return getattr(fa3_kernel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def l2_section_heads(seqlen_k: int, head_dim: int, elem_bytes: int = 2) -> int:
    """How many (batch, head) pairs' K and V fit in L2 together, rounded down to a power of two (>= 1):
    the section size of the causal longest-first tile order (after flash_attn/cute/tile_scheduler.py)."""
    per_head = 2 * seqlen_k * head_dim * elem_bytes
    return 1 << max(0, (L2_BYTES // max(per_head, 1)).bit_length() - 1)


def _tma_operand(t: torch.Tensor) -> torch.Tensor:
    """t as TMA can read it: unit last stride, 16-byte aligned base and strides, no zero stride on a
    dimension longer than 1 (a broadcast is materialised), no negative bit (``interop.aligned`` resolves it). A
    stride on a length-1 dimension is never used to address memory, so it is set to a valid value instead of
    copying."""
    elems = 16 // t.element_size()
    if t.data_ptr() % 16 == 0 and t.stride(-1) == 1 and not t.is_neg() and all(
            n > 1 and s > 0 and s % elems == 0 for n, s in zip(t.shape[:-1], t.stride()[:-1])):
        return t  # the common case, checked first: this runs on every call
    if any(n > 1 and s == 0 for n, s in zip(t.shape, t.stride())):
        t = t.contiguous()
    t = interop.aligned(t)
    if any(n == 1 for n in t.shape[:-1]):
        span = max([s * n for s, n in zip(t.stride(), t.shape)] + [t.shape[-1]])
        span = -(-span // elems) * elems
        t = t.as_strided(t.shape, [s if n > 1 else span for s, n in zip(t.stride(), t.shape)])
    return t


def default_config(arch: str, head_dim: int, causal: bool) -> Sm90Config:
    """The tuned config of a head dim (DEFAULT_CONFIGS; causal: CAUSAL_CONFIGS)."""
    return (CAUSAL_CONFIGS if causal else DEFAULT_CONFIGS)[head_dim]


def _build(cfg: StaticConfig):
    import cutlass.cute as cute  # the DSL: only to compile
    from cutlass import Int32

    from fa_variants.hopper import fa3_kernel as kernels

    fused = cfg.config.fused_merge and cfg.config.num_splits != 1
    kind = kernels.FlashAttention3Sm90Persistent if cfg.config.persistent else kernels.FlashAttention3Sm90
    if cfg.config.balanced:
        kind = kernels.FlashAttention3Sm90Balanced
    fused_kind = kernels.FlashAttention3Sm90FusedMerge
    if cfg.config.seqlens_k:  # + the per-sequence KV lengths, after the other arguments (not persistent: checked)
        kind, fused_kind = kernels.FlashAttention3Sm90Lengths, kernels.FlashAttention3Sm90FusedMergeLengths
    if cfg.config.leftpad_k:  # + each sequence's first key, after the lengths
        kind, fused_kind = kernels.FlashAttention3Sm90LeftpadK, kernels.FlashAttention3Sm90FusedMergeLeftpadK
    if cfg.config.seqlens_q:  # + each sequence's query count, after the first keys
        kind, fused_kind = kernels.FlashAttention3Sm90Windows, kernels.FlashAttention3Sm90FusedMergeWindows
    kernel = (fused_kind if fused else kind)(interop.cute_dtype(cfg.dtype), cfg.head_dim, cfg.causal, cfg.config)
    q, k, v, o, lse, scale, stream = interop.fake_attention_args(cfg.dtype, cfg.head_dim, cfg.align)
    int32s = lambda: interop.fake_tensor("int32", (cute.sym_int(),), 4)  # noqa: E731 - a dynamic-length int32 vector
    # the lengths (seqlens_k), first keys (leftpad_k) and query counts (seqlens_q) where the config reads them, then
    # the stream
    end = (*(int32s() for _ in range(cfg.config.seqlens_k + cfg.config.leftpad_k + cfg.config.seqlens_q)), stream)
    if cfg.config.balanced:  # + l2_heads, the grid's CTA count, the tile table (_plan_call)
        return kernel, (q, k, v, o, lse, scale, Int32(1), Int32(1), int32s(), *end)
    if cfg.config.persistent:  # + l2_heads, the grid's CTA count (_plan_call)
        return kernel, (q, k, v, o, lse, scale, Int32(1), Int32(1), *end)
    if not kernel.split:
        return kernel, (q, k, v, o, lse, scale, Int32(1), *end)  # + l2_heads (see l2_section_heads)
    # fp32 partials of (num_splits * batch) batches (_plan_call)
    o_parts, lse_parts = split_combine.fake_partials(q, cfg.head_dim)
    if not fused:
        return kernel, (q, k, v, o_parts, lse_parts, scale, Int32(1), *end)
    # + the caller's out and LSE and one counter per query tile (_plan_call)
    return kernel, (q, k, v, o_parts, lse_parts, scale, Int32(1), o, lse, int32s(), *end)


# ----- split-KV (Flash-Decoding, common.split) ---------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _auto_splits(ctas: int, n_blocks: int, device_index: int, min_tiles: int | None = None, per_sm: int = 1) -> int:
    """The heuristic's count on this device; per_sm: CTAs of the kernel one SM runs at once (its slots)."""
    return split.num_splits_heuristic(ctas, n_blocks, split.sm_count(device_index) * per_sm, min_tiles=min_tiles)


def num_splits_for(config: Sm90Config, q: torch.Tensor, k: torch.Tensor, causal: bool) -> int:
    """The split count a call runs with: config.num_splits when > 0, else the heuristic's from the CTAs
    without splitting (query tiles x heads x batch), the K/V tiles of a query tile and the GPU's CTA slots (SMs x
    config.ctas_per_sm: a "dual" decode config fills 2 per SM, as fa2 counts its slots)."""
    if config.num_splits > 0:
        return config.num_splits
    batch, seqlen_q, heads, _ = q.shape
    if config.pack_gqa:  # the kernel sees (group) query rows of num_heads_kv heads
        seqlen_q, heads = seqlen_q * (heads // k.shape[2]), k.shape[2]
    m_blocks = -(-seqlen_q // config.tile_m)
    n_blocks = -(-k.shape[1] // config.tile_n)
    return _auto_splits(m_blocks * heads * batch, n_blocks, q.device.index or 0, SPLIT_MIN_TILES, config.ctas_per_sm)


#: Whether a call without ``config=`` (``auto`` too) may split K/V: the heuristic splits decode shapes whose
#: query tiles x heads x batch leave SMs idle. Its count follows the batch size (more rows fill the GPU
#: without splitting), and a split count changes a result by bf16 rounding only (``common.split``), so a batch
#: row may differ from the same row called alone, within the accuracy rule's bound (docs/edge_cases.md, EC-19).
#: False (or FA_VARIANTS_SPLIT_KV=0 in the environment) restores bitwise batch invariance: no call is split
#: by itself. An explicit ``config.num_splits`` always applies. History: off from c626366 after the first
#: H200 run; the failures were in the tests (a reference at another softmax_scale; a 1e-3 bound below the
#: bf16 rounding that different split counts give) and in EC-19's bitwise check (tests/test_split.py models
#: the kernel's split path on the CPU).
SPLIT_KV_ENABLED = env.flag("FA_VARIANTS_SPLIT_KV", True)

#: Whether a call without ``config=`` packs the query heads of a KV head into one tile with GQA/MQA
#: (``Sm90Config.pack_gqa``): each row's maths is unchanged (same tiles of K/V, same order), only the CTA
#: count (and so `auto`'s split count) changes. `auto` packs every seqlen_q = 1 call (host views, any group)
#: and a seqlen_q > 1 call when ``pack_helps`` (the kernel packs, a compile per group size).
#: False or FA_VARIANTS_PACK_GQA=0: never packed by itself.
PACK_GQA_ENABLED = env.flag("FA_VARIANTS_PACK_GQA", True)


#: Whether split-KV partials are merged by the one-launch kernel (``common.split_combine``; False or
#: FA_VARIANTS_MERGE_KERNEL=0: ``common.split.merge``, ~20 torch ops). Both add over the splits in a fixed order.
MERGE_KERNEL = env.flag("FA_VARIANTS_MERGE_KERNEL", True)

#: Which split-KV calls that `auto` (or ``decode_config``) configures merge inside the split kernel
#: (``Sm90Config.fused_merge``: the last CTA of each query tile merges; one launch, no merge kernel) instead of by
#: the merge kernel after it: "off"; "decode", packed seqlen_q = 1 calls only (a tile of G <= 64 real rows: the
#: last CTA reads G x head_dim x splits partials); "all", every split call (a 64-128-row tile's merge runs in one
#: CTA, where the merge kernel spreads it over the GPU). FA_VARIANTS_FUSED_MERGE = 0 / off, decode, 1 / all; off by
#: default: slower at one query row on the H200 (bench/NOTES.md, Session 2 of 2026-12-01: geomean ours / SDPA 0.964
#: against 0.904 with the merge kernel). Read at each call (``switches``).
FUSED_MERGE_MODES = {"0": "off", "off": "off", "decode": "decode", "1": "all", "all": "all"}
FUSED_MERGE = FUSED_MERGE_MODES.get(os.environ.get("FA_VARIANTS_FUSED_MERGE", "").strip().lower() or "off")
if FUSED_MERGE is None:
    raise env.SwitchError(f"FA_VARIANTS_FUSED_MERGE={env.shown(os.environ['FA_VARIANTS_FUSED_MERGE'])} must be one "
                          f"of {sorted(FUSED_MERGE_MODES)}")


def _merge_mode(config: Sm90Config) -> Sm90Config:
    """config with ``fused_merge`` as FUSED_MERGE says for it: split configs only (num_splits != 1), and with
    "decode" only packed seqlen_q = 1 ones (host views: pack_gqa without pack_group); others unchanged. The fused
    kernel has no ``first_row_only`` (its config check refuses the pair): a fused config runs the whole tile."""
    if config.num_splits == 1:
        return config
    fused = FUSED_MERGE == "all" or (FUSED_MERGE == "decode" and config.pack_gqa and not config.pack_group)
    first = config.first_row_only and not fused
    if config.fused_merge == fused and config.first_row_only == first:
        return config
    return dataclasses.replace(config, fused_merge=fused, first_row_only=first)


def _problem_config(config: Sm90Config | None, q: torch.Tensor, k: torch.Tensor, causal: bool):
    """``config`` when given; else the default config, packed (PACK_GQA_ENABLED, seqlen_q = 1 and GQA) and
    switched to split-KV (count per call) when the heuristic splits this shape (and SPLIT_KV_ENABLED), the
    persistent grid for short seqlen_k (``short_config``), or None (the default: unpacked, unsplit)."""
    if config is not None:
        return config
    pack, splits = _auto_choice(q, k, causal)
    if splits > 1:
        config = (_PACKED_SPLIT_CONFIGS if pack else _SPLIT_CONFIGS)[q.shape[-1]]
    elif pack:
        config = _PACKED_CONFIGS[q.shape[-1]]
    else:
        return short_config(q, k, causal)
    return _merge_mode(_packed(config, q, k, splits) if pack else config)


def scale_config(config: Sm90Config | None, q: torch.Tensor, k: torch.Tensor, causal: bool,
                 softmax_scale: float) -> Sm90Config | None:
    """``config``; when it is None and |softmax_scale| is above ``split.MAX_SPLIT_SCALE`` (a split's partial LSE
    could overflow float32 and the merge could not weigh it), `auto`'s config for q, k without a split: its own
    where it does not split, else ``decode_config`` with num_splits 1 (``Variant.scale_config``;
    ``split.unsplit_choice``)."""
    return split.unsplit_choice(config, softmax_scale, lambda: _problem_config(None, q, k, causal),
                                lambda: decode_config(q, k, causal, num_splits=1),
                                lambda: default_config(ARCH, q.shape[-1], causal))


def lengths_config(q: torch.Tensor, k: torch.Tensor, causal: bool, config: Sm90Config | None = None) -> Sm90Config:
    """The config of a call with per-sequence KV lengths (``fa_variants.attention(seqlens_k=...)``): ``config``, or
    the one `auto` runs for q, k at K's padded length (``_problem_config``: split and packed for decode), reading the
    lengths in the kernel (``Sm90Config.seqlens_k``) on the one-CTA-per-tile grid (a short call's persistent grid
    is made for the padded length: not taken)."""
    return with_lengths(_problem_config(config, q, k, causal) or default_config(ARCH, q.shape[-1], causal))


def _merge_kernels(config: Sm90Config, arch: str, dtype: str, head_dim: int) -> tuple:
    """The merge kernels `_plan_call` may launch after a call on ``config``: none unsplit, with the fused merge or
    with MERGE_KERNEL off; else the one its pdl picks, by split count (``split_combine.merge_configs``)."""
    if config.num_splits == 1 or config.fused_merge or not MERGE_KERNEL:
        return ()
    return split_combine.merge_configs(arch, dtype, head_dim, True if config.pdl else None)


def leftpad_config(q: torch.Tensor, k: torch.Tensor, causal: bool, config: Sm90Config | None = None) -> Sm90Config:
    """`lengths_config` reading each sequence's first key too (``Sm90Config.leftpad_k``: a KV cache padded on the
    left, ``fa_variants.attention(leftpad_k=...)``)."""
    return dataclasses.replace(lengths_config(q, k, causal, config), leftpad_k=True)


def windows_config(q: torch.Tensor, k: torch.Tensor, causal: bool, config: Sm90Config | None = None) -> Sm90Config:
    """`leftpad_config` reading each sequence's query count too (``Sm90Config.seqlens_q``: a batch padded on the
    right, queries too, ``fa_variants.attention(seqlens_q=...)``)."""
    return dataclasses.replace(leftpad_config(q, k, causal, config), seqlens_q=True)


def with_lengths(config: Sm90Config) -> Sm90Config:
    """``config`` reading the per-sequence KV lengths in its kernel (``Sm90Config.seqlens_k``), on the
    one-CTA-per-tile grid: what ``lengths_config`` runs and `fa-variants warmup --seqlens-k` compiles."""
    return dataclasses.replace(config, seqlens_k=True, persistent=False, balanced=False)


def pack_helps(seqlen_q: int, num_heads: int, num_heads_kv: int, head_dim: int) -> bool:
    """Whether `auto` packs GQA: at seqlen_q = 1 whenever num_heads > num_heads_kv; at seqlen_q > 1 when the
    group G packs into the 64-row tile (``common.pack_gqa.packable``) and the packed tiles at most halve the
    K/V tile reads of the unpacked ones: ceil(G seqlen_q / 64) <= G ceil(seqlen_q / tile_m) / 2 (per KV head;
    tile_m the head dim's default: a 64-row tile does half a 128-row tile's rows per K/V read, so packing must
    save at least that). E.g. 32:8 (G 4) packs seqlen_q <= 32 at D 128, 64:8 (G 8) seqlen_q <= 32."""
    group = num_heads // max(num_heads_kv, 1)
    if group <= 1 or num_heads % num_heads_kv:
        return False
    if seqlen_q == 1:
        return True
    packed = _PACKED_CONFIGS[head_dim].tile_m
    return pack_gqa.packable(group, packed) and 2 * pack_gqa.packed_row_tiles(seqlen_q, group, packed) <= \
        group * -(-seqlen_q // DEFAULT_CONFIGS[head_dim].tile_m)


def decode_pdl(splits: int) -> bool:
    """Whether `auto`'s packed seqlen_q = 1 call of `splits` splits (1: unsplit) launches as a programmatic
    dependent (DECODE_PDL, or max(DECODE_PDL_MIN_SPLITS, 1) <= splits <= DECODE_PDL_MAX_SPLITS)."""
    return DECODE_PDL or max(DECODE_PDL_MIN_SPLITS, 1) <= splits <= DECODE_PDL_MAX_SPLITS


def wide_helps(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether PACK_WIDE None (`auto`) takes the wide tile for this call whose rows need it: at a head dim of
    WIDE_ALWAYS_HEAD_DIMS always; of WIDE_SAME_SPLITS_HEAD_DIMS when seqlen_k >= WIDE_LONG_SEQLEN_K or the split
    heuristic gives the wide tiles' CTAs (half as many) the same count as the 64-row ones' (the losses, D 128 B 8
    Nk 4k 1 -> 2 splits and B 1 Nk 4k 8 -> 16, are short); other head dims (unmeasured) never."""
    head_dim = q.shape[-1]
    if head_dim in WIDE_ALWAYS_HEAD_DIMS:
        return True
    if head_dim not in WIDE_SAME_SPLITS_HEAD_DIMS:
        return False
    if k.shape[1] >= WIDE_LONG_SEQLEN_K:
        return True
    narrow = _PACKED_SPLIT_CONFIGS[head_dim]  # num_splits 0: the heuristic's count
    wide = dataclasses.replace(narrow, **_WIDE)
    return num_splits_for(wide, q, k, False) == num_splits_for(narrow, q, k, False)


def wide_rows(config: Sm90Config, q: torch.Tensor, k: torch.Tensor) -> Sm90Config:
    """A packed seqlen_q > 1 config in WIDE_TILE_M-row tiles (two consumer warpgroups, ping-pong) when the
    G x seqlen_q rows of a KV head need more than one tile of config.tile_m rows but fit one wide tile (and G
    packs into it) and PACK_WIDE is True, or None and ``wide_helps``; else config unchanged."""
    group = q.shape[2] // k.shape[2]
    rows = group * q.shape[1]
    if PACK_WIDE is False or not (config.tile_m < rows <= WIDE_TILE_M and pack_gqa.packable(group, WIDE_TILE_M)):
        return config
    if PACK_WIDE is None and not wide_helps(q, k):
        return config
    return dataclasses.replace(config, **_WIDE)


def _packed(config: Sm90Config, q: torch.Tensor, k: torch.Tensor, splits: int = 1) -> Sm90Config:
    """A packed config for this call: seqlen_q = 1 with the decode tiles (``decode_tiles``; host views) and PDL
    as ``decode_pdl(splits)`` says; seqlen_q > 1 with the group fixed (in wider tiles: ``wide_rows``)."""
    if q.shape[1] == 1:
        choice = decode_choice(q.shape[0], k.shape[2], k.shape[1])
        return first_row(decode_tiles(config, q.shape[-1], choice, pdl=decode_pdl(splits)), q.shape[2] // k.shape[2])
    group = q.shape[2] // k.shape[2]
    return dataclasses.replace(wide_rows(config, q, k), pack_group=group)


def _auto_choice(q: torch.Tensor, k: torch.Tensor, causal: bool, pack: bool | None = None) -> tuple[bool, int]:
    """(pack GQA, split count: 1 = not split) as `auto` decides them; ``pack`` given: the count for that packing."""
    if pack is None:
        pack = PACK_GQA_ENABLED and pack_helps(q.shape[1], q.shape[2], k.shape[2], q.shape[-1])
    probe = (_PACKED_SPLIT_CONFIGS if pack else _SPLIT_CONFIGS)[q.shape[-1]]
    if pack:  # the split count follows the decode tiles' tile_n (seqlen_q = 1) or the wide tile's rows
        probe = decode_tiles(probe, q.shape[-1], decode_choice(q.shape[0], k.shape[2], k.shape[1])) \
            if q.shape[1] == 1 else \
            wide_rows(probe, q, k)
    return pack, num_splits_for(probe, q, k, causal) if SPLIT_KV_ENABLED else 1


def decode_config(q: torch.Tensor, k: torch.Tensor, causal: bool, *, num_splits: int | None = None,
                  pack_gqa: bool | None = None) -> Sm90Config:
    """The config of a call whose split count and/or GQA packing the caller fixes (``fa_variants.attention``'s
    ``num_splits=`` / ``pack_gqa=``, checked by ``common.split.check_options``); None leaves that choice to
    `auto` (the heuristic, SPLIT_KV_ENABLED, PACK_GQA_ENABLED). Other fields: the head dim's default (packed:
    its 64-row tile; unsplit and unpacked at short seqlen_k: the persistent grid, ``short_config``), as `auto`
    runs it."""
    pack, splits = _auto_choice(q, k, causal, pack_gqa)
    if num_splits is None:
        num_splits = 0 if splits > 1 else 1
    if pack:
        group = q.shape[2] // k.shape[2]
        if q.shape[1] > 1 and not pack_gqa_fits(group):
            raise ValueError(f"pack_gqa=True: a group of {group} query heads per KV head does not pack at seqlen_q="
                             f"{q.shape[1]} (it must divide {_PACKED_CONFIGS[q.shape[-1]].tile_m} or be a multiple of it)")
        base = _PACKED_CONFIGS[q.shape[-1]]
        if q.shape[1] == 1:  # the tile set follows the call's split count (UNSPLIT_ONLY_TILES)
            base = dataclasses.replace(base, num_splits=num_splits)
        return _merge_mode(dataclasses.replace(_packed(base, q, k, num_splits or splits), num_splits=num_splits))
    if num_splits == 1:  # unsplit: the grid `auto` runs (short seqlen_k: the persistent one, short_config)
        base = short_config(q, k, causal) or default_config(ARCH, q.shape[-1], causal)
    else:  # a split runs the split kernels
        base = _SPLIT_CONFIGS[q.shape[-1]]
    return _merge_mode(dataclasses.replace(base, num_splits=num_splits))


def pack_gqa_fits(group: int) -> bool:
    """Whether seqlen_q > 1 packs a group of this size (the packed tile: ``common.pack_gqa.packable``)."""
    return pack_gqa.packable(group, _NARROW["tile_m"])


def _packed_rows_configs(head_dim: int, group: int) -> tuple[Sm90Config, ...]:
    """The packed seqlen_q > 1 configs `auto` may run for ``group`` query heads per KV head (``_packed``: the
    group fixed in the config, pack_group; 64-row tiles, and WIDE_TILE_M-row ones where ``wide_rows`` may take
    them for some seqlen_q), unsplit and split; () where `auto` never packs that group at seqlen_q > 1."""
    helps = [s for s in range(2, 2 * WIDE_TILE_M + 1) if pack_helps(s, group, 1, head_dim)]
    if not (PACK_GQA_ENABLED and helps):
        return ()
    narrow = _PACKED_CONFIGS[head_dim].tile_m
    wide = PACK_WIDE is not False and pack_gqa.packable(group, WIDE_TILE_M) and (
        PACK_WIDE or head_dim in WIDE_ALWAYS_HEAD_DIMS + WIDE_SAME_SPLITS_HEAD_DIMS) and \
        any(narrow < group * s <= WIDE_TILE_M for s in helps)
    tiles = (dict(),) + ((_WIDE,) if wide else ())
    bases = (_PACKED_CONFIGS[head_dim],) + ((_PACKED_SPLIT_CONFIGS[head_dim],) if SPLIT_KV_ENABLED else ())
    configs = tuple(dataclasses.replace(c, pack_group=group, **t) for c in bases for t in tiles)
    return tuple(dict.fromkeys(_merge_mode(c) for c in configs))


def _auto_configs(head_dim: int, groups: tuple[int, ...] = (), causal: bool | None = None) -> tuple[Sm90Config, ...]:
    """The configs besides the default that `auto` may switch a call to (for `fa-variants warmup`: short seqlen_k's
    persistent grid for a causal or non-causal call (None: both), split, packed); ``groups``:
    query heads per KV head of the model (--gqa / --model), whose packed seqlen_q > 1 kernels fix the group
    (``_packed_rows_configs``; seqlen_q = 1 packs through host views, one kernel for every group)."""
    rows = tuple(c for g in dict.fromkeys(groups) for c in _packed_rows_configs(head_dim, g))
    packed = (_PACKED_CONFIGS[head_dim],) + ((_merge_mode(_PACKED_SPLIT_CONFIGS[head_dim]),) if SPLIT_KV_ENABLED else ())
    # PDL on and off: the fewest splits that may launch with it (DECODE_PDL_MIN_SPLITS, from 2) and the most
    counts = lambda c: (1,) if c.num_splits == 1 else (max(DECODE_PDL_MIN_SPLITS, 2), split.MAX_SPLITS)  # noqa: E731
    choices = ("base", DECODE_FULL_GRID) if DECODE_TILES_CHOICE == "auto" else (DECODE_TILES_CHOICE,)
    first = (False, True) if DECODE_FIRST_ROW else (False,)  # first_row_only: groups <= 8 (first_row)
    decode = tuple(_merge_mode(first_row(decode_tiles(c, head_dim, t, pdl=decode_pdl(n)), 1, f))
                   for c in packed for n in counts(c) for t in choices for f in first)
    short = _short_configs(head_dim, causal) if SHORT_MAX_SEQLEN_K else ()
    return short + ((_merge_mode(_SPLIT_CONFIGS[head_dim]),) if SPLIT_KV_ENABLED else ()) + (
        tuple(dict.fromkeys(packed + decode + rows)) if PACK_GQA_ENABLED else ())


def _short_configs(head_dim: int, causal: bool | None = None) -> tuple[Sm90Config, ...]:
    """The persistent configs short_config may give a call at head_dim, causal or not (None: both kinds): the static
    schedule at SHORT_HEAD_DIMS (causal calls while SHORT_MAX_SEQLEN_K_CAUSAL is on, D 64's narrow tile too), the
    balanced grid for causal calls at BALANCED_MAX_SEQLEN_K's head dims."""
    if causal is None:
        return tuple(dict.fromkeys(_short_configs(head_dim, False) + _short_configs(head_dim, True)))
    base = _SHORT_CONFIGS.get((head_dim, causal))
    if base is None or (causal and not SHORT_MAX_SEQLEN_K_CAUSAL):
        return ()
    narrow = causal and SHORT_NARROW_MAX_SEQLEN_K and head_dim in _SHORT_NARROW_CONFIGS
    configs = (base,) + ((_SHORT_NARROW_CONFIGS[head_dim],) if narrow else ())
    static = configs if head_dim in SHORT_HEAD_DIMS else ()
    balanced = causal and SHORT_BALANCED and head_dim in BALANCED_MAX_SEQLEN_K
    return static + (tuple(_balanced(c) for c in configs) if balanced else ())


def auto_num_splits(q: torch.Tensor, k: torch.Tensor, causal: bool) -> int:
    """The split count a call without ``config=`` runs (q, k) with: 1 when it is not split."""
    config = _problem_config(None, q, k, causal)
    return 1 if config is None else num_splits_for(config, q, k, causal)


def _check_problem(config: Sm90Config | None, q: torch.Tensor, k: torch.Tensor) -> None:
    batch, seqlen_q, heads, head_dim = q.shape
    config = config or DEFAULT_CONFIGS[head_dim]
    if config.pack_gqa:
        if config.pack_group and config.pack_group != heads // k.shape[2]:
            raise ValueError(f"fa3: config.pack_group={config.pack_group} but num_heads / num_heads_kv = "
                             f"{heads // k.shape[2]}")
        if seqlen_q > 1 and not config.pack_group:
            raise ValueError(f"fa3: pack_gqa without pack_group packs the query heads of one query row; seqlen_q="
                             f"{seqlen_q} is not 1")
        seqlen_q, heads = seqlen_q * (heads // k.shape[2]), k.shape[2]
    if config.first_row_only and seqlen_q > FIRST_ROW_MAX_GROUP:
        raise ValueError(f"fa3: config.first_row_only needs at most {FIRST_ROW_MAX_GROUP} rows per packed query tile, "
                         f"got {seqlen_q}")
    splits = config.num_splits or split.MAX_SPLITS
    if -(-seqlen_q // config.tile_m) * heads * batch * splits >= 2**31:
        raise ValueError(f"fa3: {batch} x {heads} x ceil({seqlen_q}/{config.tile_m}) x {splits} splits CTAs exceed "
                         "the grid limit 2^31 - 1")


#: Packed GQA at seqlen_q = 1 from host views (``common.pack_gqa.views``; fa2 packs the same way).
pack_gqa_views = pack_gqa.views


def _plan_call(config: Sm90Config, q, k, v, scale: float, causal: bool) -> tuple:
    """(prepare, finish) for tensors of q, k, v's kind (shapes and strides fixed; ``common.launch.Variant.plan_call``):
    the runtime arguments ``(q, k, v, out, lse, scale * log2 e, l2_section_heads)``, with packed GQA views of q,
    out and LSE (``pack_gqa_views``; not with ``pack_group``, packed inside the kernel). Split: fp32 partials of
    (splits * batch) batches from ``common.split_combine.partials_scratch`` (the one scratch fa2 uses too: no
    per-call allocation on a CUDA device, a buffer per stream, its views cached) in place of out and LSE; then
    either the kernel merges them itself (``config.fused_merge``: out, LSE and the per-query-tile counters follow
    as arguments) or `finish` does (``split_combine.split_steps``: the merge kernel, or ``split.merge`` on the CPU
    / with MERGE_KERNEL off). The view geometry is worked out once here (``common.pack_gqa.call_geometry``);
    ``config.balanced``: the persistent grid's tile table too (``balanced_table``, for ``causal`` costs)."""
    batch, seqlen_q, heads, head_dim = q.shape
    heads_kv = k.shape[2]
    tail = (scale * LOG2_E, l2_section_heads(k.shape[1], head_dim))
    if config.persistent:  # the persistent grid: one CTA per SM (Sm90Config.persistent)
        tail += (_sm_count(q),)
    if config.balanced:  # its tile table (made once per device and shape: balanced_table)
        tail += (balanced_table(config, q, k, causal),)
    pack = config.pack_gqa and not config.pack_group  # pack_group: the kernel packs the rows itself
    q_view = o_view = lse_view = None
    if pack:  # views of the same memory: O and LSE land where the unpacked call puts them
        q_view, o_view, lse_view = pack_gqa.call_geometry(q, heads_kv)
    # a kernel compiled for split-KV (num_splits != 1) writes fp32 partials even when this shape gets one split
    if config.num_splits == 1:
        if not pack:
            return (lambda q, k, v, out, lse: (q, k, v, out, lse, *tail)), None
        return (lambda q, k, v, out, lse: (q.as_strided(*q_view), k, v, out.as_strided(*o_view),
                                           lse.as_strided(*lse_view), *tail)), None

    splits = num_splits_for(config, q, k, True)
    tiles = 0
    if config.fused_merge:  # one counter per query tile of the kernel's view (packed: Hkv heads of group * Nq rows)
        rows, kv_heads = (seqlen_q * (heads // heads_kv), heads_kv) if config.pack_gqa else (seqlen_q, heads)
        tiles = -(-rows // config.tile_m) * kv_heads * batch
    scratch = split_combine.partials_scratch(batch, seqlen_q, heads, head_dim, splits, q.device,
                                             heads_kv=heads_kv if pack else None, counters=tiles)
    if config.fused_merge:
        def prepare(q, k, v, out, lse):
            o_p, lse_p, _, _, counters = scratch()
            if pack:
                return (q.as_strided(*q_view), k, v, o_p, lse_p, *tail, out.as_strided(*o_view),
                        lse.as_strided(*lse_view), counters)
            return q, k, v, o_p, lse_p, *tail, out, lse, counters
        return prepare, None

    if MERGE_KERNEL and q.is_cuda:
        # a pdl kernel's merge is a programmatic dependent of it too; else MERGE_PDL decides
        merge = split_combine.merge_function(q.device, q.dtype, head_dim, True if config.pdl else None,
                                              split_combine.warp_merge_for(splits))
    else:
        def merge(o_parts, lse_parts, out, lse):
            split.merge(o_parts.unflatten(0, (splits, batch)), lse_parts.unflatten(0, (splits, batch)), out, lse)
    return split_combine.split_steps(scratch, q_view, tail, merge)


VARIANT = Variant(
    "fa3", archs=(ARCH,), dtypes=DTYPES, head_dims=HEAD_DIMS, default_config=default_config,
    check_config=lambda config, arch, head_dim: config.check(head_dim, arch), build=_build, plan_call=_plan_call,
    operand=_tma_operand, check_problem=_check_problem, problem_config=_problem_config,
    switches=lambda: (SPLIT_KV_ENABLED, PACK_GQA_ENABLED, MERGE_KERNEL, split_combine.MERGE_PDL, DECODE_TILES_CHOICE,
                      DECODE_PDL, DECODE_PDL_MAX_SPLITS, DECODE_PDL_MIN_SPLITS, DECODE_FULL_GRID,
                      SPLIT_MIN_TILES, PACK_WIDE, DECODE_FIRST_ROW, SHORT_MAX_SEQLEN_K, SHORT_MAX_SEQLEN_K_CAUSAL,
                      SHORT_NARROW_MAX_SEQLEN_K, SHORT_BALANCED, split_combine.MERGE_WARP, FUSED_MERGE),
    warm_configs=lambda arch, head_dim, causal, groups=(): _auto_configs(head_dim, groups, causal),
    with_lengths=with_lengths, warm_companions=_merge_kernels, scale_config=scale_config)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float,
        config: Sm90Config | None = None, seqlens_k: torch.Tensor | None = None,
        leftpad_k: torch.Tensor | None = None,
        seqlens_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FA3 forward on an sm90 GPU (``common.launch.launch``).

    Args:
        q: (batch, seqlen_q, num_heads, head_dim), float16 or bfloat16, CUDA, unit last stride.
        k, v: (batch, seqlen_k, num_heads_kv, head_dim), same dtype/device; num_heads % num_heads_kv == 0.
        causal: bottom-right aligned (query i sees key j iff j <= i + seqlen_k - seqlen_q).
        softmax_scale: any finite real (``common.scale.kernel_scale``: negative scales run as
            softmax(|scale| Q (-K)^T), zero as the plain mean of the visible V rows).
        config: tile/schedule override (tests and the ablation); default ``DEFAULT_CONFIGS[head_dim]``.
        seqlens_k: optional int32 (batch,) per-sequence KV lengths on q's device (a KV cache padded to seqlen_k):
            sequence b attends to its first seqlens_k[b] keys (causal bottom-right against that length), read by
            the kernel (``lengths_config``; values clamped to [0, seqlen_k]: ``fa_variants.attention`` checks
            them). One launch, no host read-back.
        leftpad_k: optional int32 (batch,) first keys (a KV cache padded on the left): sequence b attends to keys
            [leftpad_k[b], seqlens_k[b]) (seqlen_k for the end without seqlens_k), causal bottom-right against their
            count (``leftpad_config``; clamped in the kernel to [0, seqlens_k[b]]). One launch.
        seqlens_q: optional int32 (batch,) query counts (a batch padded on the right, queries too): sequence b's
            causal diagonal bottom-right against seqlens_q[b] and its key count, the rows past seqlens_q[b] seeing
            the whole window (``windows_config``; clamped in the kernel to [0, seqlen_q]). One launch.
    Returns:
        (out, lse): out (batch, seqlen_q, num_heads, head_dim) like q, contiguous; lse float32
        (batch, num_heads, seqlen_q), natural log; a row that sees no key gets O = 0, LSE = -inf.
    Raises:
        ValueError: head_dim not in HEAD_DIMS, dtype not in DTYPES, num_heads % num_heads_kv != 0,
            more than 2^31 - 1 CTAs, a non-finite softmax_scale, or an operand TMA cannot address.
    Strides: any 16-byte-aligned strides are read in place (TMA); others are copied first.
    """
    window = launch.window_config(seqlens_k, leftpad_k, seqlens_q, lengths_config, leftpad_config, windows_config)
    if window is not None:  # (common.launch fills the tensors the config reads and the caller left out)
        config = window(q, k, causal, scale_config(config, q, k, causal, kernel_scale(softmax_scale)[1]))
    return VARIANT.run(q, k, v, causal=causal, softmax_scale=softmax_scale, config=config, seqlens_k=seqlens_k,
                       leftpad_k=leftpad_k, seqlens_q=seqlens_q)
