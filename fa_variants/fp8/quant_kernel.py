"""The FP8 quantisation pass as a CuTe DSL kernel (variant "fp8-quant"): the recipe of
``fa_variants.fp8.quantize`` on the GPU, one launch per tensor, each 16-bit element read once (K twice with
smoothing: its mean must be known before any K block is quantised).

Why this shape (issue 10: the pass must run at >= 70% of the device's copy bandwidth). The pass is
memory-bound: per element it reads 2 bytes and writes 1 (plus a float32 descale per block), and a scale
block (``rows`` tokens x head_dim of one (batch, head); rows = TILE_M for Q, tile_n for K / V, taken from
``fp8.layout``, a parameter here) must be complete (its amax known) before any of its e4m3 bytes is written.
Keeping a device's HBM busy needs ~ bandwidth x latency bytes in flight: ~4.3 TB/s x ~1 us ~ 4 MB on an
H200, ~32 KB per SM, all the time. The previous pass (one CTA per block, load -> transform -> reduce ->
store) had loads in flight only during its load phase, 1-2 CTAs per SM at D = 128 / 256 (128 registers for
64 values), and 4-5 shuffle stages of the Hadamard per value (11-26% of copy measured with the host work).

Design:

* Persistent CTAs (grid = SMs x CTAs that fit per SM, ``num_ctas`` from the host), each walking the
  blocks cta, cta + grid, ... (tile fastest, then head, then batch: neighbouring CTAs read neighbouring
  memory). One CTA holds one block in registers: rows * head_dim / 64 threads (128 / 256 / 512 threads
  for rows 128 and head_dim 64 / 128 / 256), 64 float32 values each (``VEC`` x ``SLOTS``).
* Prefetch: right after a block's 16-bit values are read back from shared memory, the thread issues the
  cp.async (16 bytes each, L2 only) of its next block into the same shared memory, so those loads are in
  flight during the whole transform / reduce / store of the current block: 64 bytes per thread, 32 KB per
  SM (512 resident threads at <= 128 registers, 1-4 CTAs), always. Each thread reads back only what it
  loaded (16-byte piece p of thread t at (p * threads + t) * 16 bytes: no bank conflicts, no barrier), and
  no register holds the prefetch (holding it in registers spilled). No TMA: it also runs on sm_89.
* 128-bit global accesses (besides V's coalesced 32-bit words and the float32 descale / shift): a thread's
  values are slots of 16 contiguous channels (two 16-byte loads of 16-bit input, one 16-byte e4m3 store).
* Q / K (role "qk"): a thread owns one token and the 4 chunks of 16 channels lane * 16 + k * D / 4 + (0..15)
  (k = 0..3, lane < L = D / 64): channel bits 0-3 and the top two bits are in its registers, the L lanes of
  a token hold bits 4 .. log2(D / 4) - 1. The Walsh-Hadamard transform runs its stages in the order of
  ``quantize.fwht`` (h = 1, 2, 4, ..., D / 2; the pair (a, b) -> (a + b, a - b), one float32 rounding
  each): h = 1..8 in registers, then log2(L) stages across lanes with ``shfl.bfly`` (0 / 1 / 2 for D = 64 /
  128 / 256; one shuffle and one FMA a +- b per value and stage), then h = D / 4, D / 2 in registers; times
  float32(1 / sqrt(D)). K smoothing subtracts the mean (``quantize.k_mean``, one torch reduction read by
  both quantisers so they subtract the same numbers) before the signs. Bit for bit the torch recipe.
* V (role "v"): a thread owns 16 channels of 4 tokens, those at positions 4t .. 4t + 3 of a 16-token group
  of ``v_t`` after ``layout.v_token_order`` (tokens 2t, 2t + 1, 2t + 8, 2t + 9): its 4 e4m3 bytes of one
  channel are one aligned 32-bit word of ``v_t`` and a warp (32 token quads = 128 positions of one channel)
  writes 128 contiguous bytes per store: the transpose and the permutation cost no shared memory. Tokens
  past seqlen_k are zeros (padding of ``v_t`` up to a multiple of 16); V is neither smoothed nor rotated.
* The block amax: a thread's max, a warp butterfly, then across warps through shared memory (two buffers
  alternating per block: one barrier per block). descale = the power of two of
  ``quantize.descale_from_amax`` (the same integer arithmetic on the float32 bits, so subnormal and tiny
  blocks get 2^-110, all-zero blocks 1; the float arithmetic keeps subnormals: no FTZ, as torch on the CPU);
  e4m3 = cvt.rn.satfinite(x * (1 / descale)) (saturating to +-448 as torch's clamp; the Hadamard's
  1 / sqrt(D) is folded into that multiply and into the amax: same bits, see finish_block). A NaN is skipped by
  fmax and converts to e4m3 NaN; an inf makes the block max inf and saturates to 448 unless ``PassConfig.nonfinite``
  (``quant_host.NONFINITE``, on since session 14): then one uniform test per block and, for a block
  whose max is inf, ``finite_block`` (infs to NaN, the max again over the finite values: the torch recipe's rule);
  Q / K first take their values again from the input, rotated with the recipe's per-token power-of-two shift where
  the FWHT's float32 sums would overflow, and normalised (``quant_rotation.rotate_again``, since session 35).
  With ``PassConfig.deferred`` (``quant_host.NONFINITE_DEFERRED``, session 36, on by default since session 37) such
  a block is left unstored and the CTA redoes it after its loop (``ScaleStoreMixin.redo_left``): the slow
  code out of the loop's registers.
* Q with K smoothing (``shift``): the LSE shift softmax_scale * q . mean (``quantize.smoothing_lse_shift``)
  is computed in the Q pass from the float32 q it holds (no second read of Q, no float32 copy of it); its
  summation order is the kernel's own, so it equals torch's to float32 rounding, not bit for bit. K's mean
  (``quantize.k_mean``, torch) is staged per block in shared memory (one barrier).
  Mode "amax" writes the block amax only (the per-head / per-tensor baselines: torch reduces the amaxes,
  a launch in mode "given" reads the descale).

Expected bandwidth (an estimate, to be checked by scripts/fp8_quant_bandwidth.py): per SM ~32 KB of loads
always in flight (the latency x bandwidth product at ~1 us) plus the stores; the work per value (convert,
signs, smoothing, log2(D) butterflies, amax, scale, e4m3; ~16-19 SASS instructions per value for Q / K at
D = 128 from the compiled code, shuffles 0-2 per value) is ~85% of the SM's issue rate at the full copy
rate, ~60% at 70% of it, overlapped with the memory traffic of the other warps. One launch per tensor;
the default recipe adds torch's K mean (K read once more: the mean must be known before any K block is
quantised). Measured on the H200 (bench/h200-2026-12-01/raw.tar.xz:quant_bw_new.txt): 45-48% of copy for the kernels
alone, 32-36% with torch's K mean: pipeline "v1" below.

Pipeline "v2" (``quantize(pipeline="v2")``; ``DEFAULT_PIPELINE`` says which one ``quantize_fp8`` runs):

* ``stages`` = 3 (``PassConfig.stages``, ``V2_STAGES``): each CTA keeps the loads of its next 3 blocks in
  flight (3 x 32 KB per SM; shared memory 3 x the block, <= 197 KB per CTA; fewer stages where a device
  has less, ``stages_for``) instead of 1: item i waits for its group (cp.async.wait_group(S - 1)), reads its
  stage back, then issues item i + S into that stage. v1's 32 KB per SM is about the bandwidth x latency
  product at ~1 us, with gaps whenever the compute of a block is shorter than the latency.
* K's mean in V's launch (``PassConfig.kmean``): the launch's work items are V's blocks, then the same
  blocks of K (same shape, same thread map), whose threads add their 4 tokens per channel, a warp
  butterfly adds 32 token quads (16 at tile_n 192: ``k_sum_group``), and lane 0 writes the partial times
  float32(1 / seqlen_k) (``mPart``, (B, H_kv, T * k_parts_per_block(tile_n), D)); one torch sum over the
  partials gives the mean (``k_mean_from_parts``).
  K is still read twice (the mean must exist before any K block is quantised) but not by torch (v1's
  ``k.mean`` ran at ~1.4 TB/s) and with one launch fewer. Another float32 summation order than torch's
  ``k_mean``: the outputs equal ``quantize_fp8_torch(..., k_mean=the pass's mean)`` bit for bit, and the
  mean equals float64's within float32 summation's bound (tests/test_fp8_quant_kernel.py).
* K's pass walks its blocks last to first (``PassConfig.reverse``): the K blocks V's launch read last are
  the likeliest still in L2 (50 MB; K is 64 MiB at the bandwidth shapes).
* Programmatic dependent launch for K's and Q's passes (``PassConfig.pdl``, sm_90a): each CTA signals
  ``griddepcontrol.launch_dependents`` at once and issues its first S blocks' loads before
  ``griddepcontrol.wait`` (the 16-bit inputs are made aligned before V's launch, a plain launch that
  waits for everything before it; every global write and every read of the mean or a given descale comes
  after the wait), so a pass's CTAs land on the SMs the previous grid's CTAs leave and its first loads
  overlap that grid's tail instead of following its launch gap.
* Order: V (+ K's sums), the torch sum, K, Q (v1: torch's K mean, V, K, Q; the order changes no result).

Byte model of scripts/fp8_quant_bandwidth.py: q, k, v read once in 16 bits + e4m3 q, k, v_t + float32
descales + (smoothing) the float32 LSE shift written; K's second read is not counted. At the bandwidth
shapes (64 MiB per 16-bit tensor) that is 0.30 GB, and K's second read 0.067 GB more: 70% of the 4.28 TB/s
copy in that model means ~0.10 ms, i.e. ~85% of copy for the bytes actually moved with smoothing (less what
L2 serves). Not done: one launch for Q, K and V (Q and K have different block heights at head_dim 128, and
both need the mean), the final sum of the partials inside a kernel (one small torch launch remains).

Pipeline "v3" (``quantize(pipeline="v3")``, the default since session 6's H200 run; bench/NOTES.md, "Quantisation pass
(issue 10): one default-recipe call accounted"): v2 plus two changes of where bytes come from, none of what is
computed (its outputs equal v2's bit for bit):

* Coalesced loads (``PassConfig.coalesced``): v1 / v2 let each thread cp.async its own 16 channels per slot
  (two 16-byte pieces), so one load instruction of a warp uses half of every 32-byte sector it touches (the
  lanes of a token sit 32 bytes apart) and the next instruction fetches the same sectors again. v3 stores each
  stage in (token, channel) order, 16-byte pieces XOR-swizzled per token (``piece_swizzle``): thread t loads
  piece t % (D / 8) of tokens t / (D / 8) + m rows / 8, m = 0..7 (``stage_load``; a warp reads 512
  contiguous bytes), the CTA waits at a barrier, and each thread reads back its own pieces (``stage_piece``;
  8 threads of a quarter warp hit 8 distinct bank groups, for the reads and for the cp.async writes). The
  stage a thread refills may have been read by other threads, so it is refilled after the next barrier:
  S - 1 blocks in flight (S >= 2), the refill issued before the current block is read into registers.
* Head-major order (``PassConfig.head_major``): blocks walked head fastest, then tile, then batch, so the CTAs
  in flight read whole token rows (H * D * 2 bytes) instead of one head's slice of every row.
* Optional (``V3_FUSED_MEAN``, off until measured; ``PassConfig.fused_mean``): K's mean finished inside V's
  launch instead of by torch's sum of the partials: each K block counts itself at its (batch, kv-head)'s
  counter (gpu-scope fence + atomic, ``common.workspace``'s self-cleaning counters) and the CTA that counts the
  last block adds that head's partials in a fixed order (``QuantPass.mean_if_last``): one launch fewer, K's
  pass may start under V's tail (PDL), at the price of a release fence per K block. Its mean is another
  summation order than v2's (outputs equal the torch recipe's given that mean, not v2's).
* Late count (``V3_FUSED_MEAN_LATE``, off until measured; ``PassConfig.late_count``): the fused mean with its counting
  after each CTA's loop: one release fence per CTA, then its K blocks' atomics (its threads at once) and the means of
  the heads it completes (``count_late``), instead of a fence, two barriers and an atomic per K block; the mean is
  the fused mean's bit for bit (same partials, same order). For the exact mean too: no torch sum of the partials.
* Staged mean (``V3_STAGED_MEAN``, on since session 6; ``PassConfig.staged_mean``): the smoothed K pass and Q's
  shift pass get K's mean with each block's stage (a 16-byte cp.async by D / 4 threads into a mean buffer per stage,
  committed with the block's loads; the prologue's blocks by plain loads after the PDL wait) instead of a global
  load and a barrier at the start of every block, whose latency a CTA alone on its SM (512 threads at D 128 / 256)
  cannot hide. The same operations: outputs equal v3's bit for bit.
* Sampled mean (``FP8Config.smooth_k_blocks``; ``PassConfig.k_sample``): V's launch sums only K's sample tiles
  (``quantize.k_sample_tiles``), work items j -> ``k_sample_item``, partials at ``k_sample_slot``, times
  float32(1 / the sampled tokens): K is read once in all (plus m / T of it), not twice.

* Staged store (``V3_STAGED_STORE``, on at head_dim 64; ``PassConfig.staged_store``): Q's / K's e4m3 bytes go
  through the stage the block was read from (free after the block amax's barrier): each thread writes its chunks
  (``store_unit``), a barrier, then thread t stores units t, t + threads, ... (``store_map``), so a warp's store is
  512 contiguous bytes of whole token rows (at head_dim 64 a thread's own 16-byte stores fill half of each 32-byte
  sector). The same bytes: outputs equal v3's bit for bit.

* Wide threads (``V3_WIDE``, on since session 12's H200 run; ``PassConfig.wide``; Q / K at head_dim 256): a thread
  holds 8 chunks of its token (chunk lane + 2 slot), 2 lanes per token: the Hadamard's cross-lane stages 2 -> 1 (half
  the warp shuffles per block), 256 threads at up to 255 registers. The same operations in the same order (the LSE
  shift's sum in two accumulators, the narrow pass's lanes l and l + 2): outputs equal v3's bit for bit. At head_dim
  128 (``V3_WIDE128``, session 14; K's pass by default since session 16's H200 run): one lane per token holds all
  128 channels, no cross-lane stage at all (the block max's 5 shuffles remain), K 256 / Q 128 threads per CTA, the
  e4m3 bytes through the stage (``staged_store`` with 8 units per thread): bit for bit as well.

Blocks of more than ``MAX_BLOCK`` values (rows * head_dim > 32768, e.g. tile_n 256 at head_dim 256) do not
fit one CTA's registers: ``why_not`` says so and ``quantize_fp8`` uses the torch path there, as for head_dim
96 (H12 x H8, not built here). Not sm_80 / 86: their PTX has no e4m3 conversion (``cvt.rn.satfinite.e4m3x2
.f32`` needs sm_89). Learnt from: the FWHT-with-shuffles idea (QuaRot and FlashAttention-3's Hadamard
kernels; docs/design.md, FP8 notes); SageAttention's V token order (``fp8.layout``).

This module: the kernel ``QuantPass`` (its launch, persistent loop, work-item decode, shared memory and the
per-item dispatch by role) and its compile registry (``VARIANT``, ``static_config``, ``fake_args``). ``QuantPass``'s
other methods live by responsibility in mixins: ``fp8.quant_staging`` (cp.async stages, prologue, read-back),
``fp8.quant_rotation`` (signs, K smoothing, the FWHT, Q's LSE shift), ``fp8.quant_kmean`` (K's mean: partial sums,
fused / late count), ``fp8.quant_store`` (block amax, descale, e4m3 stores, V's transpose). ``PassConfig`` and the
limits are ``fp8.quant_config``'s; the thread maps ``fp8.quant_maps``'; all re-exported here. The
host side is ``fp8.quant_host``: ``quantize``, ``quantize_tensor``, ``why_not``, the compiled-pass cache and the
pipelines' switches named above (``DEFAULT_PIPELINE``, ``V2_*``, ``V3_*``, ``GRID_CAP``).
"""
from __future__ import annotations

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from fa_variants.common import interop
from fa_variants.common.cache import StaticConfig
from fa_variants.common.launch import Variant
# the limits and PassConfig, and quant_maps' thread maps, are also importable from here (tests, quant_host)
from fa_variants.fp8.quant_config import (DTYPES, HEAD_DIMS, MAX_BLOCK, MAX_STAGES, MAX_THREADS, MEAN_LOADS, MODES,
                                          SMEM_PER_CTA, SMEM_PER_SM, PassConfig)
from fa_variants.fp8.quant_kmean import KMeanMixin
from fa_variants.fp8.quant_maps import (SLOTS, VEC, k_parts_per_block, k_sample_item, k_sample_slot, k_sum_group,
                                        late_first, late_item, piece_swizzle, stage_load, stage_piece, store_map,
                                        store_pitch, store_swizzle, store_unit, thread_chunk, thread_token)
from fa_variants.fp8.quant_rotation import RotationMixin
from fa_variants.fp8.quant_staging import StagingMixin
from fa_variants.fp8.quant_store import ScaleStoreMixin

__all__ = ["HEAD_DIMS", "DTYPES", "PassConfig", "QuantPass", "VARIANT", "static_config", "piece_swizzle",
           "stage_piece", "stage_load", "store_pitch", "store_swizzle", "store_unit", "store_map", "k_sum_group",
           "k_parts_per_block"]


class QuantPass(StagingMixin, RotationMixin, KMeanMixin, ScaleStoreMixin):
    """The pass for one (head_dim, input dtype, PassConfig): ``__call__`` is the @cute.jit host side."""

    def __init__(self, head_dim: int, dtype, cfg: PassConfig):
        cfg.check(head_dim)
        self.head_dim, self.dtype, self.cfg = head_dim, dtype, cfg
        self.slots = cfg.slots  # chunks per thread: 4 (8 with ``wide``)
        self.lanes = head_dim // (VEC * self.slots)  # Q / K: lanes per token (1, 2, 4; ``wide``: 1, 2)
        self.quads = cfg.rows // SLOTS  # V: token quads per block (one warp of them per 16 channels at rows 128)
        self.num_threads = cfg.threads(head_dim)
        self.smem_bytes = 0
        # a register cap of 128 per thread (64 values + 32 registers of prefetched 16-bit input + addresses),
        # stated to ptxas as CTAs per SM: 512 resident threads, so the host's persistent grid fills the GPU
        self.min_blocks = cfg.min_blocks(head_dim)
        self.sums_len = self.num_threads if cfg.fused_mean else 4

    @cute.jit
    def __call__(self, mX: cute.Tensor, mY: cute.Tensor, mDescale: cute.Tensor, mSigns: cute.Tensor,
                 mMean: cute.Tensor, mShift: cute.Tensor, mK: cute.Tensor, mPart: cute.Tensor, mCount: cute.Tensor,
                 scale: Float32, num_ctas: Int32, stream: cuda.CUstream):
        D = self.head_dim

        @cute.struct
        class SharedStorage:
            red: cute.struct.Align[cute.struct.MemRange[Float32, 64], 16]
            signs: cute.struct.Align[cute.struct.MemRange[Float32, D], 16]
            mean: cute.struct.Align[cute.struct.MemRange[Float32, self.cfg.mean_buffers * D], 16]
            raw: cute.struct.Align[cute.struct.MemRange[self.dtype, self.cfg.stages * self.cfg.rows * D], 128]
            ticket: cute.struct.Align[cute.struct.MemRange[Int32, 4], 16]
            sums: cute.struct.Align[cute.struct.MemRange[Float32, self.sums_len], 16]
            done: cute.struct.Align[cute.struct.MemRange[Int32, self.num_threads if self.cfg.late_count else 4], 16]

        self.smem_bytes = SharedStorage.size_in_bytes()
        self.kernel(mX, mY, mDescale, mSigns, mMean, mShift, mK, mPart, mCount, scale, SharedStorage).launch(
            grid=(num_ctas, 1, 1), block=[self.num_threads, 1, 1], smem=self.smem_bytes,
            min_blocks_per_mp=self.min_blocks,
            preferred_smem_carveout=-1,  # the driver's default; stated, so compiling needs no GPU
            stream=stream, use_pdl=self.cfg.pdl)

    # ------------------------------------------------------------------------------------ the thread's place
    def token_of(self, tidx: Int32, slot: int) -> Int32:
        """Token (within the block) of a slot (``thread_token``)."""
        return thread_token(self.cfg.role, self.lanes, self.quads, tidx, slot)

    def chunk_of(self, tidx: Int32, slot: int) -> Int32:
        """Chunk (16 channels) of a slot (``thread_chunk``)."""
        return thread_chunk(self.cfg.role, self.lanes, self.quads, tidx, slot)

    @cute.jit
    def decode(self, blk: Int32, heads: Int32, n_tiles: Int32, n_blocks: Int32, n_sample: Int32):
        """(batch, head, tile, is_k) of work item blk: items 0 .. n_blocks - 1 are the tensor's blocks (tile
        fastest, or head fastest with ``head_major``; last to first with ``reverse``), then (``kmean``) the same
        blocks of K for its partial sums."""
        is_k = blk >= n_blocks
        blk_k = blk
        if const_expr(self.cfg.kmean):
            blk = blk % n_blocks  # blk < 2 n_blocks
        if const_expr(self.cfg.reverse):
            blk = n_blocks - 1 - blk
        if const_expr(self.cfg.head_major):  # head fastest: neighbouring CTAs read whole token rows
            head = blk % heads
            rest = blk // heads
            tile = rest % n_tiles
            batch = rest // n_tiles
        else:
            tile = blk % n_tiles
            bh = blk // n_tiles
            batch = bh // heads
            head = bh % heads
        if const_expr(self.cfg.k_sample):  # K item j: sample j % n_sample of (batch, head) = divmod(j / n_sample, H)
            if is_k:
                batch, head, tile = k_sample_item(blk_k - n_blocks, heads, n_tiles, n_sample)
        return batch, head, tile, is_k

    # ------------------------------------------------------------------------------------------ the kernel
    @cute.kernel
    def kernel(self, mX: cute.Tensor, mY: cute.Tensor, mDescale: cute.Tensor, mSigns: cute.Tensor,
               mMean: cute.Tensor, mShift: cute.Tensor, mK: cute.Tensor, mPart: cute.Tensor, mCount: cute.Tensor,
               scale: Float32, SharedStorage: cutlass.Constexpr):
        """The persistent loop (module docstring): the CTA walks its work items cta, cta + grid, ... (``decode``);
        each item's 16-bit values land in a stage ``ahead`` items before its turn (``prologue``, ``load_item``);
        it is then transformed by its role and quantised and stored, or summed (``transform_item``);
        ``late_count`` counts the CTA's K blocks after its loop."""
        S = self.cfg.stages
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        heads, n_tiles, n_blocks, n_sample, total = self.work_items(mX, mDescale, mPart)
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        red, sSigns, sMean, sStage, sRaw = self.shared_tensors(storage, mSigns, tidx)
        g2s = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.cpasync.LoadCacheMode.GLOBAL),
                                  self.dtype, num_bits_per_copy=128)
        s2r = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)

        raw = cute.make_rmem_tensor(cute.make_layout((VEC, self.slots)), self.dtype)  # 16-bit, slot-major
        x = cute.make_rmem_tensor(cute.make_layout((VEC, self.slots)), Float32)
        # the loads of the CTA's first `ahead` work items; coalesced: S - 1 ahead (the stage to refill was read by
        # other threads: refilled after the next barrier)
        ahead = S - 1 if const_expr(self.cfg.coalesced) else S
        self.prologue(sStage, sRaw, sMean, mX, mK, mMean, cta, grid, ahead, heads, n_tiles, n_blocks, n_sample, total,
                      tidx, g2s)
        step = Int32(0)  # the CTA's items so far: stage step % S of the loads, parity step % 2 of the maxima
        # ``deferred``: bit min(step, 31) set for each block left for ``redo_left`` (the same in every thread)
        left = Int32(0)
        for blk in cutlass.range(cta, total, grid, unroll=1):
            stage = step % S
            parity = step % 2
            batch, head, tile, is_k = self.decode(blk, heads, n_tiles, n_blocks, n_sample)
            self.load_item(x, raw, sStage, sRaw, sMean, mX, mK, mMean, blk, step, stage, tile, ahead, grid, heads,
                           n_tiles, n_blocks, n_sample, total, tidx, g2s, s2r)
            mean_buf = stage if const_expr(self.cfg.staged_mean) else parity
            if const_expr((self.cfg.smooth or self.cfg.shift) and not self.cfg.staged_mean):
                self.block_mean(sMean, mMean, batch, head, heads, parity, tidx)
            flag = self.transform_item(x, mX, mY, mDescale, mShift, mPart, mMean, mCount, storage, red, sSigns, sMean,
                                       sStage, scale, batch, head, tile, is_k, heads, n_tiles, n_sample, stage, parity,
                                       mean_buf, tidx)
            left = left | (flag << cutlass.min(step, 31))
            step = step + 1
        if const_expr(self.cfg.deferred):
            if left != 0:
                self.redo_left(x, mX, mY, mDescale, mMean, red, sSigns, sMean, sStage, left, cta, grid, total, heads,
                               n_tiles, n_blocks, n_sample, tidx)
        if const_expr(self.cfg.late_count):  # the CTA's K blocks counted once, after its loop
            n_count = n_sample if const_expr(self.cfg.k_sample) else n_tiles
            self.count_late(mPart, mMean, mCount, storage, heads, n_tiles, n_blocks, n_sample, total, n_count, tidx)

    @cute.jit
    def work_items(self, mX: cute.Tensor, mDescale: cute.Tensor, mPart: cute.Tensor):
        """(heads, n_tiles, n_blocks, n_sample, total): the launch's blocks n_blocks = B x H x n_tiles and its work
        items total (``decode``): the blocks; with ``kmean`` also K's blocks (``k_sample``: n_sample tiles of each
        (batch, head), from mPart's shape)."""
        heads, n_tiles = mX.shape[2], mDescale.shape[2]
        n_blocks = mX.shape[0] * heads * n_tiles
        total = 2 * n_blocks if const_expr(self.cfg.kmean) else n_blocks
        n_sample = Int32(1)
        if const_expr(self.cfg.k_sample):  # K's items: n_sample tiles of each (batch, head), from mPart's shape
            n_sample = mPart.shape[2] // self.parts_per_block()
            total = n_blocks + mX.shape[0] * heads * n_sample
        return heads, n_tiles, n_blocks, n_sample, total

    @cute.jit
    def shared_tensors(self, storage, mSigns: cute.Tensor, tidx: Int32):
        """(red, sSigns, sMean, sStage, sRaw): the CTA's shared memory as tensors (the block maxima, the signs, K's
        mean buffers, the S stages of 16-bit input as a whole and as this thread's pieces); Q / K: the rotation's
        signs copied in (one barrier)."""
        D, rows, S = self.head_dim, self.cfg.rows, self.cfg.stages
        red = storage.red.get_tensor(cute.make_layout((32, 2)))
        sSigns = storage.signs.get_tensor(cute.make_layout(D))
        sMean = storage.mean.get_tensor(cute.make_layout((D, self.cfg.mean_buffers)))
        if const_expr(self.cfg.role == "qk"):
            for c in cutlass.range(tidx, D, self.num_threads, unroll=1):
                sSigns[c] = mSigns[c]
            cute.arch.barrier()
        # the thread's 16-bit values in shared memory, S stages; 16-byte piece p of thread t at
        # (p * threads + t) * 16 bytes of its stage (conflict-free), written by its own cp.async and read back
        # by itself only (no barrier)
        T_ = self.num_threads
        # coalesced: the block in its natural (token, channel) order per stage, 16-byte pieces swizzled
        # (``piece_swizzle``), loaded by every thread of the CTA and read after a barrier
        sStage = storage.raw.get_tensor(cute.make_layout((rows * D, S)))
        sRaw = storage.raw.get_tensor(cute.make_layout(((8, 2, SLOTS), T_, S),
                                                       stride=((1, 8 * T_, 16 * T_), 8, 64 * T_)))
        sRaw = cute.make_tensor(sRaw[None, tidx, 0].iterator,
                                cute.make_layout((8, 2, SLOTS, S), stride=(1, 8 * T_, 16 * T_, 64 * T_)))
        return red, sSigns, sMean, sStage, sRaw

    @cute.jit
    def transform_item(self, x: cute.Tensor, mX: cute.Tensor, mY: cute.Tensor,
                       mDescale: cute.Tensor, mShift: cute.Tensor, mPart: cute.Tensor, mMean: cute.Tensor,
                       mCount: cute.Tensor, storage, red: cute.Tensor, sSigns: cute.Tensor, sMean: cute.Tensor,
                       sStage: cute.Tensor, scale: Float32, batch: Int32, head: Int32, tile: Int32, is_k, heads: Int32,
                       n_tiles: Int32, n_sample: Int32, stage: Int32, parity: Int32, mean_buf: Int32, tidx: Int32):
        """A work item by role: Q's LSE shift (``shift``); Q / K: smoothing and signs, then the Hadamard; then the
        block quantised and stored (``finish_block``), or (``kmean``, K's items) K's partial sums, and with the
        fused mean the head's mean by the CTA that counts its last block. Returns 1 for a block left for
        ``redo_left`` (``deferred``), else 0."""
        left = Int32(0)
        if const_expr(self.cfg.shift):
            self.lse_shift(x, sMean[None, mean_buf], mShift, scale, batch, head, tile, tidx)
        if const_expr(self.cfg.role == "qk"):
            self.signs_and_smoothing(x, sSigns, sMean[None, mean_buf], tidx)
            if const_expr(self.cfg.rotate):
                self.fwht(x, tidx % self.lanes)
        if const_expr(self.cfg.kmean):
            # a CTA's items ascend, so its K items follow all its V items: the amax buffers' alternation
            # (one barrier per V block) is not broken by the K items, which have no barrier
            if is_k:
                self.k_partial_sums(x, mPart, scale, batch, head, tile, tidx, n_tiles, n_sample)
                if const_expr(self.cfg.fused_mean and not self.cfg.late_count):
                    # the last of the head's n_tiles blocks (k_sample: of its n_sample sample tiles)
                    n_count = n_sample if const_expr(self.cfg.k_sample) else n_tiles
                    self.mean_if_last(mPart, mMean, mCount, storage, batch, head, heads, n_count, tidx)
            else:
                left = self.finish_block(x, mX, mY, mDescale, red, parity, batch, head, tile, tidx,
                                         sStage[None, stage], sSigns, sMean[None, mean_buf])
        else:
            left = self.finish_block(x, mX, mY, mDescale, red, parity, batch, head, tile, tidx, sStage[None, stage],
                                     sSigns, sMean[None, mean_buf])
        return left


# ---------------------------------------------------------------------------------------------------
# compile registry (the host side, which launches the passes: ``fp8.quant_host``)
# ---------------------------------------------------------------------------------------------------
def fake_args(dtype: str, head_dim: int, cfg: PassConfig, align: int = 16):
    """Fake (x, y, descale, signs, mean, shift, k, part, count, scale, num_ctas, stream) for compiling: dynamic
    batch / seqlen / heads / strides / grid."""
    from cutlass.cute.runtime import make_fake_stream

    b, n, h, n_pad, t, bm, hm, bs, hs, ns, bp, hp, np_ = (cute.sym_int() for _ in range(13))
    x = interop.fake_tensor(dtype, (b, n, h, head_dim), align)
    y = (interop.fake_tensor("e4m3", (b, n, h, head_dim), align) if cfg.role == "qk"
         else interop.fake_tensor("e4m3", (b, h, head_dim, n_pad), align))
    descale = interop.fake_tensor("fp32", (b, h, t), 4)
    signs = interop.fake_tensor("fp32", (head_dim,), 16)
    mean = interop.fake_tensor("fp32", (bm, hm, head_dim), 16)  # (1, 1, D) zeros when unused
    shift = interop.fake_tensor("fp32", (bs, hs, ns), 4)  # (1, 1, 1) when unused
    k = interop.fake_tensor(dtype, (b, n, h, head_dim), align) if cfg.kmean else x  # x again when unused
    part = interop.fake_tensor("fp32", (bp, hp, np_, head_dim), 4)  # (1, 1, 1, D) when unused
    count = interop.fake_tensor("int32", (cute.sym_int(),), 4)  # (1,) when unused
    return (x, y, descale, signs, mean, shift, k, part, count, Float32(0.0), Int32(1),
            make_fake_stream(use_tvm_ffi_env_stream=True))


def _build(cfg: StaticConfig):
    return QuantPass(cfg.head_dim, interop.cute_dtype(cfg.dtype), cfg.config), fake_args(cfg.dtype, cfg.head_dim,
                                                                                       cfg.config, cfg.align)


# Compiled through the registry ("fp8-quant", `fa-variants compile --variant fp8-quant`); never dispatched to
# (it is not attention): ``quant_host.quantize`` launches it.
def _check_config(config: PassConfig, arch: str, head_dim: int) -> PassConfig:
    config.check(head_dim)
    if config.pdl and arch != "sm_90a":
        raise ValueError(f"fp8-quant: pdl (griddepcontrol) needs sm_90a, not {arch}")
    return config


VARIANT = Variant(
    "fp8-quant", archs=("sm_89", "sm_90a"), dtypes=DTYPES, head_dims=HEAD_DIMS,
    default_config=lambda arch, head_dim, causal: PassConfig(), check_config=_check_config, build=_build)


def static_config(arch: str, dtype: torch.dtype, head_dim: int, pass_cfg: PassConfig) -> StaticConfig:
    """The compile key of one pass (UnsupportedConfigError for an arch the pass is not built for)."""
    from fa_variants import registry

    return registry.static_config("fp8-quant", arch, interop.dtype_name(dtype), head_dim, False, pass_cfg)
