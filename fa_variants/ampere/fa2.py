"""FlashAttention-2 forward for Ampere (sm80; runs on sm86/89/90 too): `FlashAttention2Sm80`.

The algorithm is Dao 2023, "FlashAttention-2", Algorithm 1 (forward) with the work partitioning of
section 3.2, written with the CuTe DSL:

* Grid over (Q tiles, heads, batch): each CTA owns one Br x D tile of Q (the Q *outer* loop runs
  across CTAs, in parallel over the sequence) and streams the K/V tiles it needs (the inner loop).
* 4 warps split the Br rows of Q; K/V tiles are shared by all warps in shared memory, and each warp
  owns whole rows of S, P and O, so no cross-warp reduction is ever needed.
* Global -> shared with cp.async; K and V double-buffered so tile j+1 loads while tile j computes
  (``Sm80Config.stages`` = 2; with 1, one K and one V buffer: V_j loads under S = Q K_j^T and K_{j-1} under
  O += P V_j, FlashAttention-2 C++'s forward schedule, for two CTAs per SM: the head_dim 256 default, ``D256_CONFIGS``).
  Shared -> registers with ldmatrix; S = Q K^T and O += P V with mma.sync m16n8k16 (fp32 accumulate);
  P converted to fp16/bf16 in registers and fed straight back as the A operand.
* Online softmax with exp2 and the scale folded into log2(e); O rescaled by exp2(m_old - m_new);
  the division by l once at the end (deferred normalisation); LSE written (natural log).
* Causal is bottom-right aligned: K/V tiles wholly above the diagonal are never loaded; only the
  tiles crossing it are masked; a row that sees no key gets O = 0 and LSE = -inf. K/V tiles are
  visited from the last to the first, so the tiles that need masks (the diagonal ones, and the
  sequence-end tail) come first and the long unmasked run follows.
* Any seqlen_q, seqlen_k >= 1: tail rows are predicated (never read out of bounds), zero-filled in
  shared memory, masked in S, and never written. GQA / MQA: query head h reads KV head
  h // (num_heads // num_heads_kv). Any strides with a unit last dimension (16-byte aligned).
* Split-KV (Flash-Decoding, ``common.split``; ``Sm80Config.num_splits``): when query tiles x heads x batch
  leave the GPU's CTA slots idle (decode), the K/V tiles of each query tile are cut into contiguous ranges,
  one CTA each, writing fp32 partial O and LSE; the split-KV merge kernel (``common.split_combine``, the one
  fa3 uses) combines them by LSE. The count: ``common.split.num_splits_heuristic`` (fa3's) with
  ``MAX_CTAS_PER_SM`` CTAs per SM, chosen per call (`auto`, `problem_config`) or fixed by the caller
  (``fa_variants.attention(num_splits=)``, ``decode_config``).
* Packed GQA at seqlen_q = 1 (``Sm80Config.pack_gqa``; ``attention(pack_gqa=True)``, and `auto` unless
  FA_VARIANTS_FA2_PACK_GQA=0): the query heads of a KV head are the rows of one 64-row tile, from host views
  of Q, O and LSE (``common.pack_gqa.views``, as fa3), so each K/V tile is read once per KV head.

The module's ``VARIANT`` record (`common.launch.Variant`) registers it; ``run`` launches it. The kernel class
lives in ``ampere.fa2_kernel`` (the CuTe DSL), imported only to compile; this module is plain Python + torch.
Adapted from NVIDIA/cutlass:examples/python/CuTeDSL/ampere/flash_attention_v2.py::FlashAttentionForwardAmpere
(single K/V stage, no LSE, top-left causal; this kernel double-buffers, writes the LSE, and aligns causal
bottom-right) and Dao-AILab/flash-attention:flash_attn/cute/flash_fwd.py::FlashAttentionForwardSm80.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from fa_variants.common import env, interop, launch, pack_gqa, split, split_combine
from fa_variants.common.cache import StaticConfig
from fa_variants.common.config import Sm80Config, smem_capacity
from fa_variants.common.launch import SM80_CODE_ARCHS, Variant
from fa_variants.common.scale import kernel_scale

HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 256)
DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
MAX_GRID_YZ = 65535  # heads and batch ride on gridDim.y / gridDim.z


def __getattr__(name: str):
    """``FlashAttention2Sm80`` from the DSL kernel module on first use (this module imports without the DSL)."""
    if name == "FlashAttention2Sm80":
        from fa_variants.ampere import fa2_kernel

        return fa2_kernel.FlashAttention2Sm80
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------------------------
# the variant record
# ----------------------------------------------------------------------------------------------
# Tile table. Following FlashAttention-2's own sm80 table (flash-attention csrc flash_fwd_launch_template.h)
# as a start: 4 warps, tile_m = 128 (two 16-row MMA blocks per warp, so each K/V fragment read from shared
# memory feeds two MMAs), and tile_m = 64 for D = 256 (a 128-row O accumulator would not fit in registers).
# tile_n is then the widest that compiles without local-memory spills (`fa-variants compile`, sm_80, ptxas of
# nvidia-cutlass-dsl 4.8.1): FA2's 128 x 128 at D = 64 and 128 x 64 at D = 96 / 128 spill 8-32 bytes once
# K/V are double-buffered, so D = 64 uses tile_n = 64 and D = 96 / 128 use 32 (FA2's own choice for sm86 /
# sm89 at D = 128). K and V are double-buffered (stages = 2), but at D = 256: 64 x 64 with ONE K/V stage (96 KiB,
# two CTAs per SM; D256_CONFIGS' "s1", the default since the H200 A/B of 2026-12-01, bench/NOTES.md). Parts with
# 99 KiB of shared memory per CTA (sm86 / sm89 / sm120) keep 64 x 32 with two stages at D = 256 (not measured).
CONFIGS = {64: Sm80Config(128, 64), 96: Sm80Config(128, 32), 128: Sm80Config(128, 32),
           256: Sm80Config(64, 64, stages=1)}
SMALL_SMEM_CONFIGS = {256: Sm80Config(64, 32)}

# Head dim 256 tile variants (bench/NOTES.md, "Session 6 (2026-12-01): fa2 at head_dim 256"). The old default's
# two K/V stages ("s2") take 160 KiB of shared memory, so one SM holds one 4-warp CTA; at N <= 1k (8-16 K/V tiles
# per CTA) its prologue (Q, the first K/V) and epilogue (O) run with nothing to hide them. Every variant below has
# no spills (ptxas of nvidia-cutlass-dsl 4.8.1, sm_80 and sm_90a: 231-245 registers, LDL = STL = 0) and 8 warps
# per SM. "default" is CONFIGS[256] (s1 since the H200 A/B of 2026-12-01, scripts/fa2d256_ab.py: s1 / SDPA flash
# 1.045-1.211 on the 10 bf16 shapes N 512-16k, causal or not, 1.052 / 1.063 fp16 N 1k; s1 / s2 1.116-1.221).
#   s1        64 x 64, 4 warps, one K/V stage (96 KiB): two CTAs per SM; FlashAttention-2 C++'s choice where an SM
#             has >= 192 KiB (sm90), i.e. SDPA flash's own kernel shape on the H200. The default.
#   s2        64 x 64, 4 warps, two K/V stages (160 KiB): one CTA per SM; the default before 2026-12-01.
#   n32       64 x 32, 4 warps, two stages (96 KiB): two CTAs per SM and still double-buffered, half the keys per
#             step (twice the barriers and row reductions per key).
#   m128w8s1  128 x 64, 8 warps, one stage (128 KiB): one CTA of 8 warps; FA2 C++'s choice on the A100 (164 KiB).
#   m128w8    128 x 64, 8 warps, two stages (192 KiB; sm90 only): one CTA of 8 warps, double-buffered.
D256_CONFIGS = {"default": CONFIGS[256], "s1": Sm80Config(64, 64, stages=1), "s2": Sm80Config(64, 64),
                "n32": Sm80Config(64, 32), "m128w8s1": Sm80Config(128, 64, warps=8, stages=1),
                "m128w8": Sm80Config(128, 64, warps=8)}

#: Which D256_CONFIGS entry a head_dim 256 call without ``config=`` runs (FA_VARIANTS_FA2_D256; "default": the
#: table above, i.e. s1; FA_VARIANTS_FA2_D256=s2 runs the old two-stage default).
D256_VARIANT = env.choice("FA_VARIANTS_FA2_D256", "default", tuple(D256_CONFIGS))


#: With D256_VARIANT set: the longest seqlen_k it runs (FA_VARIANTS_FA2_D256_MAX_SEQLEN_K; 0: no limit); longer calls
#: keep the default tiles. For a variant that wins only at short N (the A/B's SUMMARY lines tell where).
D256_MAX_SEQLEN_K = env.integer("FA_VARIANTS_FA2_D256_MAX_SEQLEN_K", "0", 0, "0: no limit")


def d256_variant_for(seqlen_k: int | None) -> str:
    """The D256_CONFIGS name a head_dim 256 call without ``config=`` runs: D256_VARIANT, unless D256_MAX_SEQLEN_K
    is set and seqlen_k exceeds it (None: a call of unknown length, e.g. a compile without tensors) -> "default"."""
    if D256_MAX_SEQLEN_K and (seqlen_k is None or seqlen_k > D256_MAX_SEQLEN_K):
        return "default"
    return D256_VARIANT


def d256_config(arch: str, name: str) -> Sm80Config:
    """D256_CONFIGS[name] checked for `arch` (its small-shared-memory twin where the arch cannot hold it);
    ValueError naming FA_VARIANTS_FA2_D256 for an unknown name."""
    if name not in D256_CONFIGS:
        raise ValueError(f"FA_VARIANTS_FA2_D256={env.shown(name)}: unknown; choose from {', '.join(D256_CONFIGS)}")
    if name == "default" and smem_capacity(arch) < D256_CONFIGS["s2"].smem_bytes(256):
        # 99 KiB parts keep the tiles they had before s1 became the default (s1 is measured on the H200 only)
        return SMALL_SMEM_CONFIGS[256].check(arch, 256)
    return _tiles({256: D256_CONFIGS[name]}, SMALL_SMEM_CONFIGS, arch, 256)


def default_config(arch: str, head_dim: int, causal: bool) -> Sm80Config:
    """The FA2 tile configuration for an arch and head_dim (ValueError if head_dim is unsupported); head_dim 256:
    the D256_VARIANT entry of D256_CONFIGS ("default": s1, 64 x 64 with one K/V stage; 64 x 32 with two stages on
    99 KiB parts), or "default" when D256_MAX_SEQLEN_K limits the variant (then `auto` chooses per call)."""
    if head_dim == 256:
        return d256_config(arch, d256_variant_for(None))
    return _tiles(CONFIGS, SMALL_SMEM_CONFIGS, arch, head_dim)


def _tiles(configs: dict, small_smem_configs: dict, arch: str, head_dim: int) -> Sm80Config:
    """configs[head_dim], or its small-shared-memory twin where the arch's shared memory cannot hold it, checked
    for the arch (ValueError if head_dim has no entry)."""
    if head_dim not in configs:
        raise ValueError(f"fa2: head_dim {head_dim} has no tile configuration; supported: {sorted(configs)}")
    config = configs[head_dim]
    if smem_capacity(arch) < config.smem_bytes(head_dim):
        config = small_smem_configs.get(head_dim, config)
    return config.check(arch, head_dim)


def _check_config(config: Sm80Config, arch: str, head_dim: int) -> Sm80Config:
    if config.stages not in (1, 2) or config.q_stages != 1:
        raise ValueError(f"fa2: {config}: the K/V pipeline is written for stages=1 or 2, q_stages=1")
    return config.check(arch, head_dim)


def _build(cfg: StaticConfig):
    from fa_variants.ampere import fa2_kernel as kernels  # the DSL: to compile

    kind = kernels.FlashAttention2Sm80
    if cfg.config.seqlens_k:
        kind = kernels.FlashAttention2Sm80LeftpadK if cfg.config.leftpad_k else kernels.FlashAttention2Sm80Lengths
        if cfg.config.seqlens_q:
            kind = kernels.FlashAttention2Sm80Windows
    kernel = kind(interop.cute_dtype(cfg.dtype), cfg.head_dim, cfg.causal, cfg.config)
    args = interop.fake_attention_args(cfg.dtype, cfg.head_dim, cfg.align)
    if kernel.split:  # fp32 partials of (num_splits * batch) batches (see _plan_call)
        args = args[:3] + split_combine.fake_partials(args[0], cfg.head_dim) + args[5:]
    if cfg.config.seqlens_k:  # the per-sequence KV lengths (first keys: leftpad_k; query counts: seqlens_q), then
        # the stream
        import cutlass.cute as cute

        windows = tuple(interop.fake_tensor("int32", (cute.sym_int(),), 4)
                        for _ in range(1 + cfg.config.leftpad_k + cfg.config.seqlens_q))
        args = args[:-1] + windows + (args[-1],)
    return kernel, args


def _check_problem(config: Sm80Config | None, q: torch.Tensor, k: torch.Tensor) -> None:
    b, nq, h, _ = q.shape
    if h > MAX_GRID_YZ or b > MAX_GRID_YZ:
        raise ValueError(f"fa2: num_heads ({h}) and batch ({b}) must each be <= {MAX_GRID_YZ} "
                         "(they index gridDim.y / gridDim.z)")
    if config is not None and config.pack_gqa and nq != 1:
        raise ValueError(f"fa2: pack_gqa packs the query heads of one query row; seqlen_q={nq} is not 1")
    if config is not None and config.num_splits != 1:
        splits = config.num_splits or split.MAX_SPLITS
        rows = h // k.shape[2] if config.pack_gqa else nq
        if -(-rows // config.tile_m) * splits >= 2**31:
            raise ValueError(f"fa2: ceil({rows}/{config.tile_m}) query tiles x {splits} splits exceed the grid "
                             "limit 2^31 - 1 (gridDim.x)")


# ----- split-KV (Flash-Decoding, common.split) ---------------------------------------------------
#: CTAs of one SM at a time, as the split heuristic counts them (its `num_sms` argument is SMs x this): two,
#: the register file's limit for these 128-thread CTAs at up to 255 registers per thread (65536 / (128 x 256)),
#: or one where two do not fit the arch's shared memory (D 256).
MAX_CTAS_PER_SM = 2

#: Whether a call without ``config=`` (``auto`` too) may split K/V when the heuristic says so (the same switch
#: as fa3's, FA_VARIANTS_SPLIT_KV=0 turns both off): a split count changes a result by bf16 rounding only, so
#: a batch row may differ from the same row called alone within the accuracy bound (docs/edge_cases.md, EC-19).
SPLIT_KV_ENABLED = env.flag("FA_VARIANTS_SPLIT_KV", True)

#: Whether a call without ``config=`` packs GQA at seqlen_q = 1 (``Sm80Config.pack_gqa``): on since the H200 run
#: of 2026-12-01 (scripts/fa2split_bench.py, bf16 32:8 D128: packed 1.01-1.30x SDPA's GPU time at one query row,
#: unpacked split 1.42-6.39x); FA_VARIANTS_FA2_PACK_GQA=0 turns it off, ``attention(pack_gqa=...)`` decides one call.
PACK_GQA_ENABLED = env.flag("FA_VARIANTS_FA2_PACK_GQA", True)

#: Whether a call without ``config=`` that is not split and not packed runs a few-row query (seqlen_q <=
#: NARROW_MAX_ROWS, e.g. decode at seqlen_q 4 / 16 with batch 8 / 64, whose grid is already full so the heuristic
#: does not split it) in the split kernel's 64 x 64 tiles, unsplit, instead of the default 128-row tiles: each
#: CTA's MMAs run on tile_m rows whatever seqlen_q is, so 64-row tiles halve the tensor-core work there. Model
#: (bench/NOTES.md, "fa2 at seqlen_q 4 / 16"): B 8 Nq 4 Nk 1k 32:8 D 128 is 256 CTAs x 32 tiles x 2.1 MFLOP of
#: 128-row MMAs, 53 us at ~330 TFLOP/s (measured 53.4); 64-row tiles 27-35 us (SDPA 31.8). Off
#: (FA_VARIANTS_FA2_NARROW_DECODE=1: on); session 6's H200 run (scripts/fa2split_bench.py ``narrow``,
#: bench/h200-2026-12-01-s6/raw.tar.xz:fa2narrow.md): narrow / split 0.55-0.59, narrow / SDPA 0.96-1.12 (<= SDPA at 2 of 8 shapes).
NARROW_DECODE = env.flag("FA_VARIANTS_FA2_NARROW_DECODE", False)
NARROW_MAX_ROWS = 64


def ctas_per_sm(config: Sm80Config, arch: str, head_dim: int) -> int:
    """CTAs of `config` one SM holds at once (``MAX_CTAS_PER_SM``, fewer when shared memory is short)."""
    return max(1, min(MAX_CTAS_PER_SM, smem_capacity(arch) // (config.smem_bytes(head_dim) + 1024)))


def splits_for_shape(config: Sm80Config, batch: int, seqlen_q: int, heads: int, seqlen_k: int, head_dim: int,
                     arch: str, num_sms: int) -> int:
    """The split count of a call of this shape on a GPU of `arch` with `num_sms` SMs: config.num_splits when
    > 0, else ``common.split.num_splits_heuristic`` (fa3's) from the CTAs without splitting (query tiles x
    heads x batch), the K/V tiles of a query tile and the CTA slots (num_sms x ``ctas_per_sm``)."""
    if config.num_splits > 0:
        return config.num_splits
    ctas = -(-seqlen_q // config.tile_m) * heads * batch
    slots = ctas_per_sm(config, arch, head_dim) * num_sms
    return split.num_splits_heuristic(ctas, -(-seqlen_k // config.tile_n), slots)


def _gpu(device: torch.device) -> tuple[str, int]:
    """(arch, SM count) of a CUDA device."""
    return interop.device_arch(device), split.sm_count(device.index or 0)


def num_splits_for(config: Sm80Config, q: torch.Tensor, k: torch.Tensor) -> int:
    """``splits_for_shape`` for q (B, Nq, H, D), k (B, Nk, Hkv, D) on q's GPU (packed GQA: the kernel sees
    num_heads / num_heads_kv rows of num_heads_kv heads)."""
    if config.num_splits > 0:
        return config.num_splits
    batch, seqlen_q, heads, head_dim = q.shape
    if config.pack_gqa:
        seqlen_q, heads = seqlen_q * (heads // k.shape[2]), k.shape[2]
    return _cached_splits(config, batch, seqlen_q, heads, k.shape[1], head_dim, *_gpu(q.device))


_cached_splits = functools.lru_cache(maxsize=4096)(splits_for_shape)


# The split kernel's tiles: 64 query rows (one 16-row MMA block per warp) and 64 keys. The default 128-row
# tiles leave the split kernel no register to spare (255 per thread): at D 128 the few values the split adds
# (its K/V range, the partials' batch index) spilled 24-32 bytes (ptxas, sm_80). A split call is a decode-like
# one (few query tiles), where 128 rows are mostly idle MMA work; 64 x 64 tiles keep 2 stages of K and V
# (64 KiB at D 128) in flight per CTA. D 256 on 99 KiB parts: 32 keys.
SPLIT_CONFIGS = {d: Sm80Config(64, 64, num_splits=0) for d in HEAD_DIMS}
SMALL_SMEM_SPLIT_CONFIGS = {256: Sm80Config(64, 32, num_splits=0)}


@functools.lru_cache(maxsize=64)
def _split_config(arch: str, head_dim: int) -> Sm80Config:
    """The split kernel's tiles for an arch and head dim (``SPLIT_CONFIGS``), with the split count chosen per
    call (num_splits = 0: one compile serves every count). ValueError for an unsupported head_dim."""
    return _tiles(SPLIT_CONFIGS, SMALL_SMEM_SPLIT_CONFIGS, arch, head_dim)


def split_config(arch: str, head_dim: int, num_splits: int = 0, pack: bool = False) -> Sm80Config:
    """The config of fa2's split kernel with a fixed split count (1: the default tiles, unsplit); ``pack``:
    packed GQA at seqlen_q = 1 (the split tiles, 64 rows, whatever the count)."""
    if pack:
        return dataclasses.replace(_split_config(arch, head_dim), num_splits=num_splits, pack_gqa=True)
    if num_splits == 1:
        return default_config(arch, head_dim, False)
    return dataclasses.replace(_split_config(arch, head_dim), num_splits=num_splits)


def pack_fits(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether fa2 packs this call's GQA when asked: seqlen_q = 1 with num_heads > num_heads_kv."""
    return q.shape[1] == 1 and q.shape[2] > k.shape[2]


def _choice(q: torch.Tensor, k: torch.Tensor, pack: bool | None = None) -> tuple[bool, bool]:
    """(pack GQA, split K/V) as `auto` decides them; ``pack`` given: the split decision for that packing."""
    if pack is None:
        pack = PACK_GQA_ENABLED and pack_fits(q, k)
    probe = split_config(_gpu(q.device)[0], q.shape[-1], 0, pack)
    return pack, SPLIT_KV_ENABLED and num_splits_for(probe, q, k) > 1


def _problem_config(config: Sm80Config | None, q: torch.Tensor, k: torch.Tensor, causal: bool):
    """``config`` when given; else the split-KV config (count per call) when SPLIT_KV_ENABLED and the heuristic
    splits this shape (decode: few query tiles x heads x batch), packed when PACK_GQA_ENABLED at seqlen_q = 1
    with GQA; the narrow tiles (NARROW_DECODE) or head_dim 256's D256_VARIANT tiles when not "default"; or None
    (the default tiles, unsplit, unpacked)."""
    if config is not None:
        return config
    pack, splits = _choice(q, k)
    if not (pack or splits):
        if NARROW_DECODE and q.shape[1] <= NARROW_MAX_ROWS:
            return narrow_config(_gpu(q.device)[0], q.shape[-1])
        # explicit, so that a plan made before D256_VARIANT changed picks the new kernel (not the one keyed None)
        name = d256_variant_for(k.shape[1]) if q.shape[-1] == 256 else "default"
        return d256_config(_gpu(q.device)[0], name) if name != "default" else None
    return split_config(_gpu(q.device)[0], q.shape[-1], 0 if splits else 1, pack)


def scale_config(config: Sm80Config | None, q: torch.Tensor, k: torch.Tensor, causal: bool,
                 softmax_scale: float) -> Sm80Config | None:
    """``config``; when it is None and |softmax_scale| is above ``split.MAX_SPLIT_SCALE`` (a split's partial LSE
    could overflow float32 and the merge could not weigh it), `auto`'s config for q, k without a split: its own
    where it does not split, else ``decode_config`` with num_splits 1 (``Variant.scale_config``;
    ``split.unsplit_choice``)."""
    return split.unsplit_choice(config, softmax_scale, lambda: _problem_config(None, q, k, causal),
                                lambda: decode_config(q, k, causal, num_splits=1),
                                lambda: default_config(_gpu(q.device)[0], q.shape[-1], causal))


def lengths_config(q: torch.Tensor, k: torch.Tensor, causal: bool, config: Sm80Config | None = None) -> Sm80Config:
    """The config of a call with per-sequence KV lengths (``fa_variants.attention(seqlens_k=...)``): ``config``, or
    the one `auto` runs for q, k at K's padded length (``_problem_config``), reading the lengths in the kernel
    (``Sm80Config.seqlens_k``)."""
    base = _problem_config(config, q, k, causal) or default_config(_gpu(q.device)[0], q.shape[-1], causal)
    return with_lengths(base)


def leftpad_config(q: torch.Tensor, k: torch.Tensor, causal: bool, config: Sm80Config | None = None) -> Sm80Config:
    """`lengths_config` reading each sequence's first key too (``Sm80Config.leftpad_k``)."""
    return dataclasses.replace(lengths_config(q, k, causal, config), leftpad_k=True)


def windows_config(q: torch.Tensor, k: torch.Tensor, causal: bool, config: Sm80Config | None = None) -> Sm80Config:
    """`leftpad_config` reading each sequence's query count too (``Sm80Config.seqlens_q``)."""
    return dataclasses.replace(leftpad_config(q, k, causal, config), seqlens_q=True)


def with_lengths(config: Sm80Config) -> Sm80Config:
    """``config`` reading the per-sequence KV lengths in its kernel (``Sm80Config.seqlens_k``): what
    ``lengths_config`` runs and `fa-variants warmup --seqlens-k` compiles."""
    return dataclasses.replace(config, seqlens_k=True)


def narrow_config(arch: str, head_dim: int) -> Sm80Config:
    """The split kernel's tiles (``SPLIT_CONFIGS``: 64 rows) unsplit: what `auto` runs a few-row query in when
    NARROW_DECODE is on and the heuristic does not split it."""
    return dataclasses.replace(_split_config(arch, head_dim), num_splits=1)


def decode_config(q: torch.Tensor, k: torch.Tensor, causal: bool, *, num_splits: int | None = None,
                  pack_gqa: bool | None = None) -> Sm80Config:
    """The config of a call whose split count and/or GQA packing the caller fixes (``fa_variants.attention``'s
    ``num_splits=`` / ``pack_gqa=``, checked by ``common.split.check_options``); None leaves that choice to
    `auto` (the heuristic, SPLIT_KV_ENABLED, PACK_GQA_ENABLED). The split kernel's tiles (``split_config``),
    or the default tiles for an unsplit unpacked call. ValueError: pack_gqa=True at seqlen_q > 1."""
    if pack_gqa and q.shape[1] != 1:
        raise ValueError(f"pack_gqa=True: fa2 packs the query heads of one query row (seqlen_q = 1), not "
                         f"seqlen_q={q.shape[1]}")
    pack, splits = _choice(q, k, pack_gqa)
    if num_splits is None:
        num_splits = 0 if splits else 1
    return split_config(_gpu(q.device)[0], q.shape[-1], num_splits, pack)


def auto_num_splits(q: torch.Tensor, k: torch.Tensor, causal: bool) -> int:
    """The split count a call without ``config=`` runs (q, k) with: 1 when it is not split."""
    config = _problem_config(None, q, k, causal)
    return 1 if config is None else num_splits_for(config, q, k)


def _plan_call(config: Sm80Config, q, k, v, scale: float, causal: bool) -> tuple:
    """(prepare, finish) for tensors of q, k, v's kind (``common.launch.Variant.plan_call``): the standard
    arguments, or for a split kernel the fp32 partials (``split_combine.partials_scratch``: the per-stream scratch
    fa3 uses, no allocation per call on a CUDA device) in place of out, lse, and `finish` merging them into out,
    lse (the merge kernel, one launch; ``split_combine.split_steps``). Packed GQA: q and the outputs (or the
    partials) as ``common.pack_gqa.views`` of the same memory (their geometry worked out once here,
    ``common.pack_gqa.call_geometry``). ``causal``: unused (the plan is the same either way)."""
    heads_kv = k.shape[2]
    pack = config.pack_gqa
    q_view, o_view, lse_view = pack_gqa.call_geometry(q, heads_kv) if pack else (None, None, None)
    if config.num_splits == 1:
        if not pack:
            return (lambda q, k, v, out, lse: (q, k, v, out, lse, scale)), None
        return (lambda q, k, v, out, lse: (q.as_strided(*q_view), k, v, out.as_strided(*o_view),
                                           lse.as_strided(*lse_view), scale)), None
    batch, seqlen_q, heads, head_dim = q.shape
    splits = num_splits_for(config, q, k)
    scratch = split_combine.partials_scratch(batch, seqlen_q, heads, head_dim, splits, q.device,
                                             heads_kv=heads_kv if pack else None)
    merge = split_combine.merge_function(q.device, q.dtype, head_dim, pdl=False)
    return split_combine.split_steps(scratch, q_view, (scale,), merge)


def _warm_configs(arch: str, head_dim: int, causal: bool, groups: tuple[int, ...] = ()) -> tuple:
    """The configs besides the default that `auto` may switch a call to (for `fa-variants warmup`); ``groups``
    is not read (fa2 packs query heads at seqlen_q = 1 only, through host views: one kernel for every group)."""
    configs = ((split_config(arch, head_dim),) if SPLIT_KV_ENABLED else ())
    if PACK_GQA_ENABLED:
        configs += (split_config(arch, head_dim, 1, True),) + (
            (split_config(arch, head_dim, 0, True),) if SPLIT_KV_ENABLED else ())
    if NARROW_DECODE:
        configs += (narrow_config(arch, head_dim),)
    if head_dim == 256 and D256_VARIANT != "default" and D256_MAX_SEQLEN_K:  # the default is the other one then
        configs += (d256_config(arch, D256_VARIANT),)
    return configs


VARIANT = Variant(
    "fa2", archs=SM80_CODE_ARCHS, dtypes=DTYPES, head_dims=HEAD_DIMS,
    default_config=default_config, check_config=_check_config, build=_build, check_problem=_check_problem,
    plan_call=_plan_call, problem_config=_problem_config,
    switches=lambda: (SPLIT_KV_ENABLED, PACK_GQA_ENABLED, NARROW_DECODE, D256_VARIANT, D256_MAX_SEQLEN_K),
    warm_configs=_warm_configs, with_lengths=with_lengths, scale_config=scale_config,
    warm_companions=lambda config, arch, dtype, head_dim: (  # the merge `_plan_call` launches after a split call
        () if config.num_splits == 1 else split_combine.merge_configs(arch, dtype, head_dim, False, by_splits=False)))


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float,
        config: Sm80Config | None = None, seqlens_k: torch.Tensor | None = None,
        leftpad_k: torch.Tensor | None = None,
        seqlens_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FA2 forward on CUDA tensors (`common.launch.launch`).

    Args: q (B, Nq, H, D), k and v (B, Nk, Hkv, D), fp16 or bf16, H % Hkv == 0, D in HEAD_DIMS,
    last-dimension stride 1 (other strides anything; inputs not 16-byte aligned are copied);
    softmax_scale any finite real; `config` overrides the tile table (tile sweeps) and the split choice
    (``Sm80Config.num_splits``; None: the default tiles, split-KV when ``_problem_config`` chooses it).
    Returns (out (B, Nq, H, D) like q, lse float32 (B, H, Nq), natural log).
    `seqlens_k`: optional int32 (batch,) per-sequence KV lengths on q's device, read by the kernel
    (``lengths_config``; values clamped to [0, seqlen_k]: ``fa_variants.attention`` checks them). `leftpad_k`:
    optional int32 (batch,) first keys: keys [leftpad_k[b], seqlens_k[b]) (seqlen_k without seqlens_k;
    ``leftpad_config``). `seqlens_q`: optional int32 (batch,) query counts: sequence b's causal diagonal
    bottom-right against seqlens_q[b] and its key count (``windows_config``).
    Raises ValueError for a shape it cannot serve (head_dim, dtype, H or B above 65535).
    """
    window = launch.window_config(seqlens_k, leftpad_k, seqlens_q, lengths_config, leftpad_config, windows_config)
    if window is not None:  # (common.launch fills the tensors the config reads and the caller left out)
        config = window(q, k, causal, scale_config(config, q, k, causal, kernel_scale(softmax_scale)[1]))
    return VARIANT.run(q, k, v, causal=causal, softmax_scale=softmax_scale, config=config, seqlens_k=seqlens_k,
                       leftpad_k=leftpad_k, seqlens_q=seqlens_q)
