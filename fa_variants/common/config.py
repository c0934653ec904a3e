"""Static kernel configurations: one type per instruction family, and the shared memory they must fit.

* `Sm80Config` (fa1, fa2: mma.sync, cp.async, ldmatrix): a CTA of `warps` warps stacked along the query
  rows holds `q_stages` Q tiles (tile_m x D) and `stages` buffers of each of K and V (tile_n x D) in
  shared memory.
* `Sm90Config` (fa3 and the FP8 kernel built on it: TMA, WGMMA, warp specialisation): tile_m query rows
  in 64-row consumer warpgroups, a `stages`-deep K/V ring, and the FA3 schedule switches.

A configuration is frozen and hashable: it is part of the compile-cache key. Pure Python.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from fa_variants.common.checks import is_int, one_line

# Shared memory one CTA may use (the opt-in maximum), bytes (CUDA programming guide, "Features and
# Technical Specifications" per compute capability). An arch not listed gets the smallest.
SMEM_CAPACITY = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_90a": 227 * 1024,
                 "sm_100a": 227 * 1024, "sm_120a": 99 * 1024}


# Shared memory of one SM (all its CTAs together; 1 KiB of it reserved per CTA), bytes (same source).
SM_SMEM = {"sm_90a": 228 * 1024, "sm_100a": 228 * 1024}


def smem_capacity(arch: str) -> int:
    """Bytes of shared memory one CTA may use on `arch` (the smallest known when unknown)."""
    return SMEM_CAPACITY.get(arch, min(SMEM_CAPACITY.values()))


@dataclasses.dataclass(frozen=True)
class Sm80Config:
    """tile_m query rows (Br) x tile_n keys (Bc) per step, `warps` warps along tile_m, `stages` K/V
    buffers, `q_stages` Q buffers (FA1 prefetches the next step's Q tile: 2).

    num_splits (FA2 only): split-KV as ``Sm90Config.num_splits``: 1 off; n > 1 the K/V tiles of each query
    tile shared by n CTAs writing fp32 partial O and LSE, merged by LSE afterwards (``common.split``); 0 the
    count chosen per call (``ampere.fa2.num_splits_for``). Every value but 1 compiles the same kernel (the
    count is a runtime value).

    pack_gqa (FA2 only): packed GQA at seqlen_q = 1 (``common.pack_gqa.views``): the host passes Q, O and LSE
    as views whose seqlen is the group of query heads of each KV head; the kernel runs them unmasked (at
    seqlen_q = 1 bottom-right causal hides no key), reading each K/V tile once per KV head.

    seqlens_k (FA2 only): per-sequence KV lengths read by the kernel, as ``Sm90Config.seqlens_k`` (an int32 (batch,)
    tensor after the other arguments; each CTA's K/V tiles, masks and split range from clamp(seqlens_k[b], 0,
    seqlen_k)); the tail tile's rows past the length are not read (cp.async zero-fills them).

    leftpad_k (FA2 only): with seqlens_k, keys [leftpad_k[b], seqlens_k[b]) of each sequence, as
    ``Sm90Config.leftpad_k`` (a second int32 (batch,) tensor after seqlens_k; K and V read from key leftpad_k[b] on).

    seqlens_q (FA2 only): with leftpad_k, each sequence's query count, as ``Sm90Config.seqlens_q`` (a third int32
    (batch,) tensor; the causal diagonal of sequence b bottom-right against seqlens_q[b] and its key count)."""

    tile_m: int
    tile_n: int
    warps: int = 4
    stages: int = 2
    q_stages: int = 1
    num_splits: int = 1
    pack_gqa: bool = False
    seqlens_k: bool = False
    leftpad_k: bool = False
    seqlens_q: bool = False

    def smem_bytes(self, head_dim: int, elem_bytes: int = 2) -> int:
        """q_stages Q tiles + stages x (K tile + V tile), bytes."""
        return (self.q_stages * self.tile_m + 2 * self.stages * self.tile_n) * head_dim * elem_bytes

    def check(self, arch: str, head_dim: int, elem_bytes: int = 2) -> "Sm80Config":
        """self, or ValueError when it does not fit the arch's shared memory or the MMA shape."""
        need, have = self.smem_bytes(head_dim, elem_bytes), smem_capacity(arch)
        if need > have:
            raise ValueError(f"{self} needs {need} bytes of shared memory at head_dim {head_dim}; "
                             f"{arch} has {have}")
        if self.tile_m % (16 * self.warps) or self.tile_n % 16 or head_dim % 16:
            raise ValueError(f"{self}: tile_m must be a multiple of 16 * warps, tile_n and head_dim of 16")
        if self.stages not in (1, 2) or self.q_stages not in (1, 2):
            raise ValueError(f"{self}: stages and q_stages must be 1 or 2")
        if not is_int(self.num_splits) or self.num_splits < 0:
            raise ValueError(f"num_splits={one_line(self.num_splits)} must be an int >= 0 (1: off, 0: chosen per call)")
        object.__setattr__(self, "num_splits", int(self.num_splits))  # a numpy int kept as an int (compile key)
        if not isinstance(self.pack_gqa, bool):
            raise ValueError(f"pack_gqa={one_line(self.pack_gqa)} must be a bool")
        if not isinstance(self.seqlens_k, bool):
            raise ValueError(f"seqlens_k={one_line(self.seqlens_k)} must be a bool")
        if not isinstance(self.leftpad_k, bool) or (self.leftpad_k and not self.seqlens_k):
            raise ValueError(f"leftpad_k={one_line(self.leftpad_k)} must be a bool, True only with seqlens_k=True")
        _check_seqlens_q(self)
        return self


def _check_seqlens_q(config) -> None:
    """``seqlens_q``'s rule, the same for both configs: a bool, True only with leftpad_k (the kernels read the three
    tensors of a window together: ``common.mask.q_length``)."""
    if not isinstance(config.seqlens_q, bool) or (config.seqlens_q and not config.leftpad_k):
        raise ValueError(f"seqlens_q={one_line(config.seqlens_q)} must be a bool, True only with leftpad_k=True")


WGMMA_M = 64  # rows of one warpgroup MMA instruction (one consumer warpgroup)


@dataclasses.dataclass(frozen=True)
class Sm90Config:
    """Static shape and schedule of an FA3-style kernel.

    tile_m: Br, query rows per CTA = 64 x consumer warpgroups (128 -> 2, 192 -> 3; 64 -> 1 only for packed
        GQA without ping-pong: decode's tile).
    tile_n: Bc, keys per K/V tile (multiple of 16).
    stages: depth of the K and V shared-memory pipelines.
    pingpong: named-barrier scheduling between consumer warpgroups (FA3 section 3.1).
    intra_wg_overlap: issue S_{j+1} = Q K^T with O += P_j V_j, softmax under the PV GEMM (3.2).
    exp2_ffma: one FFMA per score in the softmax exponent against a rounded basis, with alpha moving
        between bases exactly and the exact subtract-then-scale form kept for |m c| >= 2^11
        (``common.softmax``, "One-FFMA exponent"); False: the subtract-then-scale form for every score.
    reduce_chains: independent accumulators of the softmax's row max and row sum (1: one serial chain).
    skip_unit_rescale: skip O *= alpha in the mainloop when no row max of the thread moved (alpha == 1).
    shared_kv_state: one consumer (and one producer) pipeline state for the K and the V ring (the i-th K
        load and the i-th V load are the same tile, so they share slot and phase; V lags K by one tile
        under intra-warpgroup overlap and is a copy of it), instead of two states advanced apart.
    first_pv_overwrites: O is not zero-filled before the mainloop; the first P V GEMM of a query tile
        overwrites it (WGMMA accumulate off). Kernels whose P V hook is their own (fa3-fp8) keep the fill.
    epilogue_arrive: in the epilogue, consumer warps only arrive at the barrier after their shared-memory
        writes of O; the one warp that issues the TMA store waits there (instead of every consumer warp).
    rescale_o_before_pv: (intra_wg_overlap) O is rescaled by a tile's alpha in the next step, between the issue
        of the next S = Q K^T GEMM and of that tile's P V GEMM (while the S GEMM runs), instead of at the end of
        the step that computed alpha (flash-attn-4 does this for head_dim > 128). The end of the step then waits
        for the P V GEMM only to overwrite P.
    convert_pairs: P (every step) and O (epilogue) converted from fp32 to 16 bits two values at a time
        (``common.layout.convert_in_pairs``: one packed F2FP per pair); same rounding as the whole-fragment
        conversion, which nvidia-cutlass-dsl 4.8.1 lowers to one F2FP per value and a PRMT per pair when the
        warpgroup's fragment is not a power-of-two size (tile_n 80 at head_dim 256, 176). flash-attn-4 converts
        in pairs always (issue 12, round 4).
    k_before_q: the producer issues the first K tile's TMA load before Q's (flash-attn-4's order; the first S
        GEMM needs both) instead of Q first. Needs shared_kv_state=False.
    num_splits: split-KV (Flash-Decoding): 1, off (one CTA walks all K/V tiles of its query tile); n > 1,
        the K/V tiles of each query tile are shared by n CTAs that write partial O and LSE, merged by LSE
        afterwards (`common.split`); 0, split with the count chosen per call (`common.split.num_splits_for`).
        Every value other than 1 compiles the same split kernel shape (the count is a runtime value).
    pack_gqa: packed GQA for decode (seqlen_q = 1): the num_heads / num_heads_kv query heads that share a KV
        head are the rows of one Q tile, so each K/V tile is read once per KV head instead of once per query
        head. The host passes Q, O and LSE as views with the group as their seqlen and num_heads_kv heads
        (no copy); the kernel runs as MHA, unmasked (at seqlen_q = 1 causal hides no key). Only for
        seqlen_q = 1 (``hopper.fa3.pack_gqa_views``) unless pack_group is set.
    pdl: programmatic dependent launch (sm90): the kernel is launched with programmatic stream serialisation, so
        its CTAs may start while the grid before it on the stream finishes; every thread waits for that grid
        (``griddepcontrol.wait``) right after the shared-memory setup, before any global read or write, and
        signals ``griddepcontrol.launch_dependents`` so that the next grid (e.g. the split-KV merge, or the next
        decode step) may launch as early. Hides the launch gap between kernels (decode: a few us per step).
    ctas_per_sm: 1, or 2 (one consumer warpgroup only, tile_m 64): the kernel launches with a register cap for two
        CTAs per SM (128 per thread; producer 24, consumer 232 after setmaxnreg) and must fit twice in the SM's
        shared memory, so that one CTA's prologue and epilogue overlap the other's main loop (decode grids of
        many short CTAs).
    fused_merge: (split-KV, num_splits != 1) the split kernel merges its partials itself: every CTA stores its
        partial O and LSE, then counts its arrival at a per-query-tile counter (gpu-scope fence and atomic);
        the CTA that arrives last merges the query tile into the caller's O and LSE and resets the counter
        (``hopper.fa3_kernel.FlashAttention3Sm90._merge_if_last``). False: a second kernel merges
        (``common.split_combine``).
    early_pv_arrive: (serial steps, intra_wg_overlap False, with pingpong) a warpgroup hands the ping-pong turn on
        right after issuing its P V GEMM instead of after the next tile's S = Q K^T GEMM, so the wait for the P V
        GEMM and what follows it (fa3-fp8: the promotion of the two-level temporary into O) run while the other
        warpgroup's GEMMs keep the tensor cores busy; its own next S GEMM is then issued outside the turn.
    pack_group: 0, or (with pack_gqa) the group G = num_heads / num_heads_kv fixed at compile time, for any
        seqlen_q: the kernel itself packs row r of a Q tile as query head r % G (of the KV head) at query
        position r // G (``common.pack_gqa``), masking each row causally by its own position. G must divide
        tile_m, or tile_m divide G (the TMA box of Q and O is (G, tile_m / G) or (tile_m, 1) rows).
    first_row_only: (packed GQA at seqlen_q = 1 from host views, tile_m 64, at most 8 query rows: G <= 8 query
        heads per KV head) the softmax works on the first of the two rows each thread holds (rows 0-7 of each warp's
        16), the second (rows 8-15: padding) keeps its masked S as P, its O unscaled and is never stored: half the
        exponentials, row reductions and O rescales per K/V tile of decode's 64-row tile (``hopper.fa3
        .DECODE_FIRST_ROW``). A call with more than 8 rows in the kernel's view is refused (``hopper.fa3``).
    persistent: one CTA per SM walks several (query tile, head, batch) tiles in the order of
        ``common.tile_scheduler`` (static: CTA b takes tiles b, b + grid, ...), carrying its pipeline states from
        tile to tile, so that the producer loads the next tile's first K/V tile and Q while the consumers run the
        previous tile's epilogue; the prologue (barrier init, descriptor prefetch, register split) is paid once
        per SM. O gets its own shared-memory buffer when it fits (``separate_o``: Q is released after the last
        S GEMM), else it reuses Q's (Q released after the TMA store has read O). The plain prefill path and packed
        seqlen_q = 1 decode from host views (pack_gqa without pack_group: the kernel runs it as MHA, unmasked;
        ``hopper.fa3.DECODE_FULL_GRID``); not with split-KV, pack_group, shared_kv_state, epilogue_arrive or two
        CTAs per SM.
    balanced: (with persistent, not pack_gqa) the CTAs read their tiles from a table the host deals round by round,
        the longest tile of a round to the CTA with the least work so far (``common.tile_order.balanced_order``,
        causal costs), instead of the static b, b + grid, ...: causal query tiles differ in cost, and the static
        schedule leaves some CTAs 10-15 % above the mean (its model at D 128); each round keeps its tiles, so the L2
        order stays. One int32 per work tile, made once per device and shape and kept for the process
        (``hopper.fa3.balanced_table``; ValueError when a shape's first call is inside CUDA graph capture).
    q_tail_first: (causal calls; a non-causal kernel compiles without it) when seqlen_q is not a multiple of tile_m,
        the rows a partial tile wastes are moved from the last query tile (the longest under causal masking: with
        192-row tiles at seqlen_q 4096 its 64 rows cost a full walk over all K/V tiles, ~6% of the work) to the
        first (the shortest): tiles m >= 1 cover rows m tile_m - shift .. with shift = ((-seqlen_q) mod tile_m)
        rounded down to whole 64-row warpgroups (each warpgroup's rows stay inside one 128-row FP8 Q scale block),
        and tile 0 covers rows 0 .. tile_m - 1, computing the shift rows it shares with tile 1 too
        (``common.mask.BlockInfo.q_row_start``; no TMA box starts before row 0: session 7 started tile 0 at row
        -shift, the one thing outside the default kernels' ranges, and every causal call stopped the H200 with "an
        illegal instruction"). Both tiles store those rows' O (the
        same rows from the same K/V tiles: tile 1's extra ones are wholly masked for them); the LSE of a row is
        stored by its owner (``q_row_end``). Only the plain prefill path: not with split-KV, packed GQA or
        persistent.
    alpha_first: (with exp2_ffma) the softmax computes every row's alpha (O's rescale factor) right after
        the row maxima, before the exponentials, instead of after each row's exponentials (``common.softmax``, "Alpha
        first"): same values; ptxas then runs O's rescale under the exponentials instead of after the last of them (issue
        12, "Session 8: fa3 vs flash-attn-4 consumer loop").
    hoisted_descriptors: the WGMMA descriptors of the K and V ring (``common.sm90.hoisted_descriptors``) are built
        once per tile, before the K/V loop, from stage 0's shared-memory address, and each GEMM adds its stage's offset
        (one uniform ULEA); off, the DSL rebuilds them from the address in every step (add, shift, mask, the
        LBO bit: ~4 uniform instructions per operand, neither LLVM nor ptxas hoists them), inside the ping-pong turn,
        where the other warpgroup waits (issue 12: the turn held 51 instructions vs flash-attn-4's 46 under ncu at
        D 64). SASS, nvidia-cutlass-dsl 4.8.1, BAR.SYNC .. BAR.ARV: D 64 55 -> 45, D 128 71 -> 61; causal (masked,
        unmasked loop) 56 -> 52, 45 -> 45 at D 64 and 63 -> 59, 55 -> 52 at D 128 (bench/NOTES.md, "Session 12
        (2026-12-02): fa3's ping-pong turn, descriptors built once per tile; ..."). Same descriptors, same values;
        fa3-fp8 takes it too (off there: the same speed at head_dim 256, session 13; ``hopper.fa3_fp8``). On at
        head_dim 64 (``hopper.fa3.DEFAULT_CONFIGS[64]``; session 12: turnbf16, on/off 1.000-1.012x, paired, one H200)
        and in head_dim 128's prefill config (session 15: on/off 1.008-1.015x, "faster" at 3 shapes, paired, one
        H200; its split and decode configs keep it off); off at the other head dims.
    seqlens_k: per-sequence KV lengths read by the kernel (``fa_variants.attention(seqlens_k=...)``): the compiled
        kernel takes an int32 (batch,) tensor after its other arguments, and each CTA attends to the first
        clamp(seqlens_k[b], 0, seqlen_k) keys of its sequence b (causal bottom-right against that length): its K/V
        tile range, masks and split ranges use that length, so no tile past it is loaded (the last tile's keys past
        it are loaded and masked). One launch for a batch of any lengths (a split call's merge kernel besides), no
        host read-back (CUDA-graph capturable).
        Not with persistent (its balanced table is made from the padded length).
    leftpad_k: with seqlens_k, a KV cache padded on the left too (flash-attn's ``leftpad_k``): the kernel takes a
        second int32 (batch,) tensor after seqlens_k, and sequence b attends to keys [leftpad_k[b], seqlens_k[b])
        (each clamped to [0, seqlen_k], the first to the second), causal bottom-right against their count: K and V
        are read from key leftpad_k[b] on (``common.mask.kv_start``), in the same tiles, masks and split ranges as a
        sequence of that many keys. One launch for a left-padded batch (prompt batches, generation with a KV cache).
    seqlens_q: with leftpad_k, each sequence's query count (a batch padded on the right, its queries too: a padded
        training batch): the kernel takes a third int32 (batch,) tensor, and sequence b's causal diagonal is
        bottom-right against clamp(seqlens_q[b], 0, seqlen_q) and its key count (``common.mask.q_length``): query i
        sees key j of the window iff j <= i + count - seqlens_q[b], so the rows from seqlens_q[b] on (padding) see
        the whole window, as a causal mask with padding does. Every row is still computed and stored. One launch
        for a right-padded causal batch, whose per-sequence diagonal seqlens_k alone cannot place.
    """

    tile_m: int = 128
    tile_n: int = 128
    stages: int = 2
    pingpong: bool = True
    intra_wg_overlap: bool = True
    exp2_ffma: bool = False
    num_splits: int = 1
    reduce_chains: int = 1
    skip_unit_rescale: bool = False
    pack_gqa: bool = False
    shared_kv_state: bool = False
    first_pv_overwrites: bool = False
    epilogue_arrive: bool = False
    pack_group: int = 0
    rescale_o_before_pv: bool = False
    pdl: bool = False
    ctas_per_sm: int = 1
    convert_pairs: bool = False
    k_before_q: bool = False
    fused_merge: bool = False
    early_pv_arrive: bool = False
    persistent: bool = False
    balanced: bool = False
    first_row_only: bool = False
    q_tail_first: bool = False
    alpha_first: bool = False
    hoisted_descriptors: bool = False
    seqlens_k: bool = False
    leftpad_k: bool = False
    seqlens_q: bool = False

    #: bytes of a Q, K, V element and of an O element (fa3-fp8's config: e4m3 operands, 1)
    OPERAND_BYTES: ClassVar[int] = 2
    OUT_BYTES: ClassVar[int] = 2

    @property
    def consumer_warpgroups(self) -> int:
        return self.tile_m // WGMMA_M

    def smem_bytes(self, head_dim: int, elem_bytes: int | None = None) -> int:
        """Shared memory of the kernel, bytes: Q's buffer (reused for O), O's own (``separate_o``), the K/V ring and
        1 KiB (mbarriers, alignment). elem_bytes: of Q, K, V (default ``OPERAND_BYTES``)."""
        q, o, kv = self._buffers(head_dim, elem_bytes)
        return q + (o if self.separate_o(head_dim, elem_bytes) else 0) + kv + 1024

    def separate_o(self, head_dim: int, elem_bytes: int | None = None, arch: str = "sm_90a") -> bool:
        """Whether O has a shared-memory buffer of its own (persistent kernels, where it fits): Q, O and the K/V
        ring + 1 KiB <= the CTA's shared memory."""
        q, o, kv = self._buffers(head_dim, elem_bytes)
        return self.persistent and q + o + kv + 1024 <= smem_capacity(arch)

    def _buffers(self, head_dim: int, elem_bytes: int | None) -> tuple[int, int, int]:
        """Bytes of Q's buffer (it holds the 16-bit O after the last S GEMM: sized for the larger), of an O tile and of
        the K/V ring (``stages`` K tiles and V tiles)."""
        elem_bytes = elem_bytes or self.OPERAND_BYTES
        rows = self.tile_m * head_dim
        return (rows * max(elem_bytes, self.OUT_BYTES), rows * self.OUT_BYTES,
                2 * self.stages * self.tile_n * head_dim * elem_bytes)

    def check(self, head_dim: int, arch: str = "sm_90a") -> "Sm90Config":
        """self, or ValueError when the warpgroups, tiles or shared memory do not work out."""
        narrow = self.tile_m == WGMMA_M and self.pack_gqa is True and not self.pingpong  # packed decode's tile
        if not narrow and (self.tile_m % WGMMA_M or self.consumer_warpgroups not in (2, 3)):
            raise ValueError(f"tile_m={self.tile_m} must be 128 or 192 (2 or 3 consumer warpgroups of 64 rows), or 64 "
                             "with pack_gqa=True and pingpong=False (one consumer warpgroup)")
        if self.tile_n % 16 or not 16 <= self.tile_n <= 256:
            raise ValueError(f"tile_n={self.tile_n} must be a multiple of 16 in [16, 256]")
        if head_dim % 16 or head_dim > 256:
            raise ValueError(f"head_dim={head_dim} must be a multiple of 16 and at most 256")
        if self.reduce_chains not in (1, 2, 4, 8):
            raise ValueError(f"reduce_chains={one_line(self.reduce_chains)} must be 1, 2, 4 or 8")
        if not is_int(self.num_splits) or self.num_splits < 0:
            raise ValueError(f"num_splits={one_line(self.num_splits)} must be an int >= 0 (1: off, 0: chosen per call)")
        object.__setattr__(self, "num_splits", int(self.num_splits))  # a numpy int kept as an int (compile key)
        if not isinstance(self.pack_gqa, bool):
            raise ValueError(f"pack_gqa={one_line(self.pack_gqa)} must be a bool")
        g = self.pack_group
        if not is_int(g) or g < 0 or (g and not self.pack_gqa):
            raise ValueError(f"pack_group={one_line(g)} must be 0, or an int >= 1 with pack_gqa=True")
        object.__setattr__(self, "pack_group", g := int(g))
        if g and self.tile_m % g and g % self.tile_m:
            raise ValueError(f"pack_group={g} must divide tile_m={self.tile_m} or be a multiple of it")
        if self.rescale_o_before_pv and not self.intra_wg_overlap:
            raise ValueError(f"rescale_o_before_pv needs intra_wg_overlap=True ({self})")
        if self.rescale_o_before_pv and self.shared_kv_state:
            raise ValueError("rescale_o_before_pv keeps its own V state: it needs shared_kv_state=False")
        if self.k_before_q and self.shared_kv_state:
            raise ValueError("k_before_q orders the separate K/V producer states: it needs shared_kv_state=False")
        if not isinstance(self.fused_merge, bool) or (self.fused_merge and self.num_splits == 1):
            raise ValueError(f"fused_merge={one_line(self.fused_merge)} must be a bool, True only with split-KV (num_splits != 1)")
        if self.early_pv_arrive and self.intra_wg_overlap:
            raise ValueError(f"early_pv_arrive needs intra_wg_overlap=False (serial steps) ({self})")
        if not isinstance(self.pdl, bool) or (self.pdl and not arch.startswith("sm_9")):
            raise ValueError(f"pdl={one_line(self.pdl)} must be a bool, True only on sm_90a (griddepcontrol)")
        if self.ctas_per_sm not in (1, 2) or (self.ctas_per_sm == 2 and self.consumer_warpgroups != 1):
            raise ValueError(f"ctas_per_sm={one_line(self.ctas_per_sm)} must be 1, or 2 with tile_m=64 (one consumer warpgroup)")
        if self.ctas_per_sm == 2 and 2 * (self.smem_bytes(head_dim) + 1024) > SM_SMEM.get(arch, 0):
            raise ValueError(f"{self} does not fit twice in the {SM_SMEM.get(arch, 0)} B of shared memory of an "
                             f"{arch} SM at head_dim={head_dim} (ctas_per_sm=2)")
        if not isinstance(self.persistent, bool) or (self.persistent and (
                self.num_splits != 1 or self.pack_group or self.shared_kv_state or self.epilogue_arrive
                or self.ctas_per_sm != 1)):
            raise ValueError(f"persistent={one_line(self.persistent)} must be a bool, True only without split-KV "
                             "(num_splits=1), pack_group, shared_kv_state, epilogue_arrive and with ctas_per_sm=1")
        if not isinstance(self.balanced, bool) or (self.balanced and (not self.persistent or self.pack_gqa)):
            raise ValueError(f"balanced={one_line(self.balanced)} must be a bool, True only with persistent=True and "
                             "pack_gqa=False")
        if not isinstance(self.first_row_only, bool) or (self.first_row_only and not (
                self.pack_gqa and not self.pack_group and self.tile_m == WGMMA_M and not self.fused_merge)):
            raise ValueError(f"first_row_only={one_line(self.first_row_only)} must be a bool, True only for packed seqlen_q = 1 "
                             "decode (pack_gqa, pack_group 0, tile_m 64) without fused_merge")
        if not isinstance(self.q_tail_first, bool) or (self.q_tail_first and (
                self.num_splits != 1 or self.pack_gqa or self.persistent)):
            raise ValueError(f"q_tail_first={one_line(self.q_tail_first)} must be a bool, True only without split-KV "
                             "(num_splits=1), pack_gqa and persistent")
        if not isinstance(self.alpha_first, bool) or (self.alpha_first and not self.exp2_ffma):
            raise ValueError(f"alpha_first={one_line(self.alpha_first)} must be a bool, True only with exp2_ffma=True")
        if not isinstance(self.hoisted_descriptors, bool):
            raise ValueError(f"hoisted_descriptors={one_line(self.hoisted_descriptors)} must be a bool")
        if not isinstance(self.seqlens_k, bool) or (self.seqlens_k and self.persistent):
            raise ValueError(f"seqlens_k={one_line(self.seqlens_k)} must be a bool, True only with persistent=False")
        if not isinstance(self.leftpad_k, bool) or (self.leftpad_k and not self.seqlens_k):
            raise ValueError(f"leftpad_k={one_line(self.leftpad_k)} must be a bool, True only with seqlens_k=True")
        _check_seqlens_q(self)
        if self.smem_bytes(head_dim) > smem_capacity(arch):
            raise ValueError(f"{self} needs {self.smem_bytes(head_dim)} B of shared memory at head_dim={head_dim} "
                             f"(max {smem_capacity(arch)})")
        return self
