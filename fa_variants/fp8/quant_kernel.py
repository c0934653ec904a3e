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
  1 / sqrt(D) is folded into that multiply and into the amax: same bits, see finish_block).
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
  shift's sum in two accumulators, the narrow pass's lanes l and l + 2): outputs equal v3's bit for bit.

Blocks of more than ``MAX_BLOCK`` values (rows * head_dim > 32768, e.g. tile_n 256 at head_dim 256) do not
fit one CTA's registers: ``why_not`` says so and ``quantize_fp8`` uses the torch path there, as for head_dim
96 (H12 x H8, not built here). Not sm_80 / 86: their PTX has no e4m3 conversion (``cvt.rn.satfinite.e4m3x2
.f32`` needs sm_89). Learnt from: the FWHT-with-shuffles idea (QuaRot and FlashAttention-3's Hadamard
kernels; docs/design.md, FP8 notes); SageAttention's V token order (``fp8.layout``).

This module: ``PassConfig``, the kernel ``QuantPass`` and its compile registry (``VARIANT``, ``static_config``). The
host side is ``fp8.quant_host``: ``quantize``, ``quantize_tensor``, ``why_not``, the compiled-pass cache and the
pipelines' switches named above (``DEFAULT_PIPELINE``, ``V2_*``, ``V3_*``, ``GRID_CAP``).
"""
from __future__ import annotations

import dataclasses
import math

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import math as mlir_math
from cutlass.cutlass_dsl import dsl_user_op

from fa_variants.common import interop
from fa_variants.common.cache import StaticConfig
from fa_variants.common.launch import Variant
from fa_variants.common.softmax import bits_f32, f32_bits
from fa_variants.fp8.quant_maps import (SLOTS, VEC, k_parts_per_block, k_sample_item, k_sample_slot, k_sum_group,
                                        late_first, late_item, piece_swizzle, stage_load, stage_piece, store_map,
                                        store_pitch, store_swizzle, store_unit, thread_chunk, thread_token)
from fa_variants.fp8.quantize import MIN_DESCALE_EXPONENT

__all__ = ["HEAD_DIMS", "DTYPES", "PassConfig", "QuantPass", "VARIANT", "static_config", "piece_swizzle",
           "stage_piece", "stage_load", "store_pitch", "store_swizzle", "store_unit", "store_map", "k_sum_group",
           "k_parts_per_block"]

HEAD_DIMS = (64, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)
MAX_THREADS = 512
MAX_BLOCK = MAX_THREADS * VEC * SLOTS  # 32768 values: the largest rows * head_dim one CTA holds
MODES = ("block", "amax", "given")
MAX_STAGES = 4
SMEM_PER_CTA = 227 * 1024  # sm_90's opt-in maximum per CTA (sm_89: 99 KB; the host checks the device)
SMEM_PER_SM = 228 * 1024 - 2048  # what resident CTAs may share (1 KB reserved per CTA by the driver)
#: ``late_count``'s mean: partial sums loaded per batch (independent loads in flight per thread; the adds keep their order)
MEAN_LOADS = 32


@dsl_user_op
def _fma(a: Float32, b: Float32, c: Float32, *, loc=None, ip=None) -> Float32:
    """a * b + c with one rounding (fma.rn.f32)."""
    return Float32(mlir_math.fma(a.ir_value(loc=loc, ip=ip), b.ir_value(loc=loc, ip=ip), c.ir_value(loc=loc, ip=ip),
                                 loc=loc, ip=ip))


@dataclasses.dataclass(frozen=True)
class PassConfig:
    """What one compiled pass does (part of the compile key). role: "qk" (e4m3 like the input) or "v"
    (transposed, token-permuted, padded); rotate, smooth: the recipe's steps (Q / K only); mode: "block"
    (compute the block's descale), "amax" (write the block amax only), "given" (read the descale);
    rows: tokens per scale block (``layout.TILE_M`` for Q, ``layout.tile_n(head_dim)`` for K and V);
    shift (Q with K smoothing): also write ``scale * q . mean`` per row (``quantize.smoothing_lse_shift``);
    staged_store (role "qk", coalesced, rows % 32 == 0): the e4m3 bytes stored through the stage just read
    (``store_qk_staged``); late_count (with fused_mean): K's blocks counted after the CTA's loop, not per block
    (``count_late``); wide (role "qk", coalesced, head_dim 256, not with staged_store): a thread holds 8 chunks of its
    token (128 channels) instead of 4, so 2 lanes per token instead of 4 and one cross-lane FWHT stage instead of two
    (128 ``shfl.bfly`` per thread as before, for twice the values: half the shuffles per block), half the threads, up
    to 255 registers; the same FWHT pairs, stage order and roundings, the LSE shift's sums in the default's order:
    outputs bit for bit the default's. (head_dim 128 would need L = 1: Q's pass spills 40 bytes at 255 registers and
    a warp's 16-byte stores half-fill each 32-byte sector, the pattern ``staged_store`` fixed at head_dim 64: not
    built.)"""

    role: str = "qk"
    rotate: bool = True
    smooth: bool = False
    mode: str = "block"
    rows: int = 128
    shift: bool = False
    stages: int = 1
    kmean: bool = False
    reverse: bool = False
    pdl: bool = False
    coalesced: bool = False
    head_major: bool = False
    fused_mean: bool = False
    staged_mean: bool = False
    k_sample: bool = False
    staged_store: bool = False
    late_count: bool = False
    wide: bool = False

    def check(self, head_dim: int) -> None:
        """ValueError for a config or head_dim this pass is not built for."""
        if (self.role not in ("qk", "v") or self.mode not in MODES or self.rows < 16 or self.rows % 16
                or not 1 <= self.stages <= MAX_STAGES or (self.coalesced and self.stages < 2)):
            raise ValueError(f"fp8-quant: bad pass config {self}")
        if self.kmean and (self.role != "v" or self.mode == "given"):
            raise ValueError("fp8-quant: K's partial sums ride on V's pass (role 'v', mode 'block' or 'amax')")
        if self.fused_mean and not self.kmean:
            raise ValueError("fp8-quant: the fused mean finishes K's partial sums (kmean)")
        if self.late_count and not self.fused_mean:
            raise ValueError("fp8-quant: late_count counts the fused mean's K blocks (fused_mean)")
        if self.k_sample and not self.kmean:
            raise ValueError("fp8-quant: a sampled K mean rides on V's launch (kmean)")
        if self.wide and not (self.role == "qk" and self.coalesced and head_dim == 256 and not self.staged_store):
            raise ValueError("fp8-quant: wide (8 chunks of a token per thread) is built for Q / K through a coalesced "
                             f"stage at head_dim 256, not with staged_store (got head_dim {head_dim})")
        if self.staged_mean and not (self.coalesced and (self.smooth or self.shift)):
            raise ValueError("fp8-quant: the staged mean rides on the coalesced stages of a pass that reads K's "
                             "mean (smooth or shift)")
        if self.staged_store and not (self.coalesced and self.role == "qk" and self.mode != "amax"
                                      and self.rows % 32 == 0):
            raise ValueError("fp8-quant: the staged store writes Q's / K's e4m3 through a coalesced stage (role 'qk', "
                             "coalesced, mode 'block' or 'given', rows a multiple of 32)")
        if self.role == "v" and (self.rotate or self.smooth or self.shift):
            raise ValueError("fp8-quant: V is neither rotated nor smoothed")
        if self.shift and self.smooth:
            raise ValueError("fp8-quant: the LSE shift is Q's (unsmoothed) dot with K's mean")
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"fp8-quant: head_dim {head_dim} is not built in the GPU pass (supported: {HEAD_DIMS})")
        if self.rows * head_dim > MAX_BLOCK:
            raise ValueError(f"fp8-quant: a block of {self.rows} rows x head_dim {head_dim} exceeds the "
                             f"{MAX_BLOCK} values one CTA holds in registers")
        if self.smem_bytes(head_dim) > SMEM_PER_CTA:
            raise ValueError(f"fp8-quant: {self.stages} stages of {self.rows} x {head_dim} 16-bit values exceed "
                             f"{SMEM_PER_CTA} bytes of shared memory")

    def smem_bytes(self, head_dim: int) -> int:
        """Shared memory of one CTA (bytes, an upper bound): the stages of 16-bit input, signs, mean, maxima."""
        fused = 4 * (self.rows * head_dim // (VEC * SLOTS)) + 16 if self.fused_mean else 0  # group sums, ticket
        fused += 4 * (self.rows * head_dim // (VEC * SLOTS)) if self.late_count else 0  # late_count's done slots
        return 2 * self.stages * self.rows * head_dim + 4 * ((1 + self.mean_buffers) * head_dim + 64) + 512 + fused

    @property
    def mean_buffers(self) -> int:
        """Buffers of K's mean in shared memory: one per stage (``staged_mean``), else two alternating."""
        return max(2, self.stages) if self.staged_mean else 2

    @property
    def slots(self) -> int:
        """Chunks of 16 channels a thread holds: ``SLOTS``, twice that with ``wide`` (Q / K: 8 chunks of one token)."""
        return 2 * SLOTS if self.wide else SLOTS

    def threads(self, head_dim: int) -> int:
        """Threads of one CTA: rows x head_dim / (16 x ``slots``)."""
        return self.rows * head_dim // (VEC * self.slots)

    def min_blocks(self, head_dim: int) -> int:
        """CTAs per SM asked of ptxas (its register cap 65536 / (threads x this)): 512 resident threads at 128
        registers (64 values + addresses); ``wide``: 255 registers (128 values + addresses)."""
        return max(1, 65536 // (self.threads(head_dim) * (256 if self.wide else 128)))

    def ctas_per_sm(self, head_dim: int) -> int:
        """Resident CTAs per SM: ``min_blocks`` (the registers), and the stages' shared memory."""
        return max(1, min(self.min_blocks(head_dim), SMEM_PER_SM // self.smem_bytes(head_dim)))


class QuantPass:
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
        for blk in cutlass.range(cta, total, grid, unroll=1):
            stage = step % S
            parity = step % 2
            batch, head, tile, is_k = self.decode(blk, heads, n_tiles, n_blocks, n_sample)
            self.load_item(x, raw, sStage, sRaw, sMean, mX, mK, mMean, blk, step, stage, tile, ahead, grid, heads,
                           n_tiles, n_blocks, n_sample, total, tidx, g2s, s2r)
            mean_buf = stage if const_expr(self.cfg.staged_mean) else parity
            if const_expr((self.cfg.smooth or self.cfg.shift) and not self.cfg.staged_mean):
                self.block_mean(sMean, mMean, batch, head, heads, parity, tidx)
            self.transform_item(x, mX, mY, mDescale, mShift, mPart, mMean, mCount, storage, red, sSigns, sMean,
                                sStage, scale, batch, head, tile, is_k, heads, n_tiles, n_sample, stage, parity,
                                mean_buf, tidx)
            step = step + 1
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
    def prologue(self, sStage: cute.Tensor, sRaw: cute.Tensor, sMean: cute.Tensor, mX: cute.Tensor, mK: cute.Tensor,
                 mMean: cute.Tensor, cta: Int32, grid: Int32, ahead: int, heads: Int32, n_tiles: Int32,
                 n_blocks: Int32, n_sample: Int32, total: Int32, tidx: Int32, g2s: cute.CopyAtom):
        """Before the loop: (pdl) let the next grid launch; the loads of the CTA's first ``ahead`` work items, one
        commit group each (empty past the end); (pdl) wait for the previous grid; then the reads of its output:
        (``staged_mean``) K's mean of those items into their stages' mean buffers."""
        D = self.head_dim
        if const_expr(self.cfg.pdl):  # the next grid on the stream may launch now (its CTAs land as ours exit)
            cute.arch.griddepcontrol_launch_dependents()
        for s in cutlass.range_constexpr(ahead):
            if cta + s * grid < total:
                pb, ph, pt, pk = self.decode(cta + s * grid, heads, n_tiles, n_blocks, n_sample)
                if const_expr(self.cfg.coalesced):
                    self.load_block_coalesced(sStage[None, s], mX, mK, pb, ph, pt, pk, tidx, g2s)
                else:
                    self.load_block(sRaw[None, None, None, s], mX, mK, pb, ph, pt, pk, tidx, g2s)
            cute.arch.cp_async_commit_group()
        if const_expr(self.cfg.pdl):
            # the grid before ours finished and its writes are visible (K's mean, a given descale) before any
            # other global read or any global write; the prologue above read only the 16-bit input, which the
            # host made ready before the first, non-PDL launch of the pass (``quantize``)
            cute.arch.griddepcontrol_wait()
        if const_expr(self.cfg.staged_mean):
            # K's mean of the prologue's items into their stages' mean buffers: plain loads after the wait (the
            # mean is the previous grid's output); item 0's stage barrier publishes them
            for s in cutlass.range_constexpr(ahead):
                if cta + s * grid < total:
                    pb, ph, _, _ = self.decode(cta + s * grid, heads, n_tiles, n_blocks, n_sample)
                    for c in cutlass.range(tidx, D, self.num_threads, unroll=1):
                        sMean[c, s] = mMean[pb, self.mean_head(ph, heads, mMean), c]

    @cute.jit
    def load_item(self, x: cute.Tensor, raw: cute.Tensor, sStage: cute.Tensor, sRaw: cute.Tensor, sMean: cute.Tensor,
                  mX: cute.Tensor, mK: cute.Tensor, mMean: cute.Tensor, blk: Int32, step: Int32, stage: Int32,
                  tile: Int32, ahead: int, grid: Int32, heads: Int32, n_tiles: Int32, n_blocks: Int32,
                  n_sample: Int32, total: Int32, tidx: Int32, g2s: cute.CopyAtom, s2r: cute.CopyAtom):
        """Work item blk's 16-bit values into x (float32): wait for its commit group, read its stage back (coalesced:
        after the barrier and the refill of the stage read in the previous iteration, ``refill_coalesced``; else the
        thread's own pieces, then the refill of this stage with the item S ahead); V's tokens past seqlen_k zeros."""
        S = self.cfg.stages
        cute.arch.cp_async_wait_group(ahead - 1)  # this item's group (the later ones may be in flight)
        if const_expr(self.cfg.coalesced):
            self.refill_coalesced(sStage, sMean, mX, mK, mMean, blk, step, ahead, grid, heads, n_tiles, n_blocks,
                                  n_sample, total, tidx, g2s)
            self.read_block(sStage[None, stage], raw, tidx, s2r)
        else:
            for j in cutlass.range_constexpr(SLOTS):
                cute.copy(s2r, sRaw[None, None, j, stage], cute.zipped_divide(raw[None, j], (8,)))
        x.store(raw.load().to(Float32))
        if const_expr(self.cfg.role == "v"):  # tokens past seqlen_k: zeros (v_t's padding)
            for j in cutlass.range_constexpr(SLOTS):
                if tile * self.cfg.rows + self.token_of(tidx, j) >= mX.shape[1]:
                    for i in cutlass.range_constexpr(VEC):
                        x[i, j] = Float32(0.0)
        if const_expr(not self.cfg.coalesced):
            if blk + S * grid < total:  # the loads of the item S ahead, into the stage just read
                nb, nh, nt, nk = self.decode(blk + S * grid, heads, n_tiles, n_blocks, n_sample)
                self.load_block(sRaw[None, None, None, stage], mX, mK, nb, nh, nt, nk, tidx, g2s)
            cute.arch.cp_async_commit_group()

    @cute.jit
    def refill_coalesced(self, sStage: cute.Tensor, sMean: cute.Tensor, mX: cute.Tensor, mK: cute.Tensor,
                         mMean: cute.Tensor, blk: Int32, step: Int32, ahead: int, grid: Int32, heads: Int32,
                         n_tiles: Int32, n_blocks: Int32, n_sample: Int32, total: Int32, tidx: Int32,
                         g2s: cute.CopyAtom):
        """coalesced, before item blk is read: a barrier (every thread's pieces of this item have landed, and every
        read of the stage refilled here, read in the previous iteration, is done), then the loads of the item
        ``ahead`` items later into that stage (with its K mean: ``staged_mean``), one commit group. The
        refill is issued before this item's values are read into registers (fewer live registers while its
        addresses are computed)."""
        S = self.cfg.stages
        cute.arch.barrier()
        if blk + ahead * grid < total:
            nb, nh, nt, nk = self.decode(blk + ahead * grid, heads, n_tiles, n_blocks, n_sample)
            self.load_block_coalesced(sStage[None, (step + ahead) % S], mX, mK, nb, nh, nt, nk, tidx, g2s)
            if const_expr(self.cfg.staged_mean):  # its K mean rides in the same group
                self.load_mean(sMean[None, (step + ahead) % S], mMean, nb, self.mean_head(nh, heads, mMean),
                               tidx)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def block_mean(self, sMean: cute.Tensor, mMean: cute.Tensor, batch: Int32, head: Int32, heads: Int32,
                   parity: Int32, tidx: Int32):
        """Without ``staged_mean``: K's mean for this block into mean buffer ``parity`` (a global load and a barrier
        per block)."""
        for c in cutlass.range(tidx, self.head_dim, self.num_threads, unroll=1):
            sMean[c, parity] = mMean[batch, self.mean_head(head, heads, mMean), c]
        cute.arch.barrier()

    @cute.jit
    def transform_item(self, x: cute.Tensor, mX: cute.Tensor, mY: cute.Tensor,
                       mDescale: cute.Tensor, mShift: cute.Tensor, mPart: cute.Tensor, mMean: cute.Tensor,
                       mCount: cute.Tensor, storage, red: cute.Tensor, sSigns: cute.Tensor, sMean: cute.Tensor,
                       sStage: cute.Tensor, scale: Float32, batch: Int32, head: Int32, tile: Int32, is_k, heads: Int32,
                       n_tiles: Int32, n_sample: Int32, stage: Int32, parity: Int32, mean_buf: Int32, tidx: Int32):
        """A work item by role: Q's LSE shift (``shift``); Q / K: smoothing and signs, then the Hadamard; then the
        block quantised and stored (``finish_block``), or (``kmean``, K's items) K's partial sums, and with the
        fused mean the head's mean by the CTA that counts its last block."""
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
                self.finish_block(x, mX, mY, mDescale, red, parity, batch, head, tile, tidx,
                                  sStage[None, stage])
        else:
            self.finish_block(x, mX, mY, mDescale, red, parity, batch, head, tile, tidx, sStage[None, stage])

    def parts_per_block(self) -> int:
        """K's partial sums per block in V's launch (``k_partial_sums``): ``k_parts_per_block(rows)``."""
        return k_parts_per_block(self.cfg.rows)

    def mean_head(self, head: Int32, heads: Int32, mMean: cute.Tensor) -> Int32:
        """The (kv-)head of K's mean a block reads: Q's head // (H / H_kv) for the shift, K's own head."""
        if const_expr(self.cfg.shift):
            return head // (heads // mMean.shape[1])
        return head

    @cute.jit
    def load_mean(self, sMean: cute.Tensor, mMean: cute.Tensor, batch: Int32, kv_head: Int32, tidx: Int32):
        """``staged_mean``: cp.async (16 bytes, threads < D / 4) of K's mean of (batch, kv_head) into one stage's
        mean buffer; the caller commits it with that stage's loads."""
        atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.cpasync.LoadCacheMode.GLOBAL),
                                   Float32, num_bits_per_copy=128)
        if tidx < self.head_dim // 4:
            src = cute.local_tile(mMean[batch, kv_head, None], (4,), (tidx,))
            cute.copy(atom, src, cute.local_tile(sMean, (4,), (tidx,)))

    @cute.jit
    def k_partial_sums(self, x: cute.Tensor, mPart: cute.Tensor, inv_n: Float32, batch: Int32, head: Int32,
                       tile: Int32, tidx: Int32, n_tiles: Int32, n_sample: Int32):
        """K's float32 sums over the tokens of a block, per channel, in a fixed order (the thread's 4 tokens
        in slot order, then a butterfly over the ``group`` token quads of its warp, group = ``k_sum_group(rows)``),
        times inv_n = float32(1 / seqlen_k): mPart[batch, head, tile * (quads / group) + quad / group,
        channel]. The host adds the partials (``k_mean_from_parts``). ``k_sample``: the partials of sample s
        (tile = floor(s T / m), so s = ceil(tile m / T)) in place of tile's; inv_n = 1 / the sampled tokens."""
        group = k_sum_group(self.cfg.rows)
        acc = cute.make_rmem_tensor(VEC, Float32)
        for i in cutlass.range_constexpr(VEC):
            acc[i] = x[i, 0] + x[i, 1]
            acc[i] = acc[i] + x[i, 2]
            acc[i] = acc[i] + x[i, 3]
        for b in cutlass.range_constexpr(group.bit_length() - 1):
            for i in cutlass.range_constexpr(VEC):
                acc[i] = acc[i] + cute.arch.shuffle_sync_bfly(acc[i], offset=group >> (b + 1))
        quad = tidx % self.quads
        if quad % group == 0:
            slot = tile
            if const_expr(self.cfg.k_sample):
                slot = k_sample_slot(tile, n_tiles, n_sample)
            part = slot * (self.quads // group) + quad // group
            c0 = self.chunk_of(tidx, 0) * VEC
            for i in cutlass.range_constexpr(VEC):
                mPart[batch, head, part, c0 + i] = acc[i] * inv_n

    @cute.jit
    def mean_if_last(self, mPart: cute.Tensor, mMean: cute.Tensor, mCount: cute.Tensor, storage, batch: Int32,
                     head: Int32, heads: Int32, n_tiles: Int32, tidx: Int32):
        """fused_mean, after a K block's partial sums are stored: count the block at its (batch, kv-head)'s
        counter; the CTA that counts the last of the n_tiles blocks (``k_sample``: the n_sample sample tiles, the
        argument's value then) writes K's mean of that (batch, kv-head):
        thread (g, c) (g < G = threads / D) adds the partials g, g + G, ... of channel c in order, then thread
        c adds the G group sums in order (deterministic; summation depth P / G + G - 1 <= P, the partials
        already divided by seqlen_k) into mMean[batch, head, c], and resets the counter to 0 (self-cleaning).

        Memory ordering as the fused split merge of ``hopper.fa3_kernel`` (PTX memory model): every thread's
        partial stores, a gpu-scope acq_rel fence (release), a CTA barrier, one thread's gpu-scope acq_rel
        atomic add; its ticket through shared memory and a barrier; in the last CTA every thread fences
        (acquire) before reading the other CTAs' partials (``mean_of``)."""
        ticket = storage.ticket.get_tensor(cute.make_layout(4))
        slot = batch * heads + head
        cute.arch.fence_acq_rel_gpu()  # release: this thread's partials before the count
        cute.arch.barrier()
        if tidx == 0:
            ticket[0] = cute.arch.atomic_add((mCount.iterator + slot).llvm_ptr, Int32(1), sem="acq_rel", scope="gpu")
        cute.arch.barrier()
        if ticket[0] == n_tiles - 1:
            self.mean_of(mPart, mMean, mCount, storage, batch, head, heads, tidx)

    @cute.jit
    def mean_of(self, mPart: cute.Tensor, mMean: cute.Tensor, mCount: cute.Tensor, storage, batch: Int32,
                head: Int32, heads: Int32, tidx: Int32):
        """The fused mean of (batch, kv-head) from its partials, by the CTA that counted its last block (every thread
        of it): thread (g, c) (g < G = threads / D) adds the partials g, g + G, ... of channel c in order, then
        thread c adds the G group sums in order into mMean[batch, head, c]; the counter is reset to 0. Each thread
        fences (acquire) before reading the other CTAs' partials. ``late_count``: the partials loaded MEAN_LOADS at a
        time into registers before their adds (same order, same sum). The group sums' buffer is read by threads < D
        after the barrier: a caller that calls this again must put a barrier between (``count_late``)."""
        D, T = self.head_dim, self.num_threads
        G = T // D
        sums = storage.sums.get_tensor(cute.make_layout(T))
        cute.arch.fence_acq_rel_gpu()  # acquire: the other CTAs' partials, before reading them
        g = tidx // D
        c = tidx % D
        acc = Float32(0.0)
        P = mPart.shape[2]
        if const_expr(self.cfg.late_count):
            # MEAN_LOADS independent loads in flight, then their adds in p order (the same sum as the loop below,
            # whose loads ptxas issues one at a time, each waiting for the previous add: P / G L2 round trips)
            U = MEAN_LOADS
            vals = cute.make_rmem_tensor(U, Float32)
            for p0 in cutlass.range(g, P, G * U, unroll=1):
                for u in cutlass.range_constexpr(U):
                    if p0 + u * G < P:
                        vals[u] = mPart[batch, head, p0 + u * G, c]
                for u in cutlass.range_constexpr(U):
                    if p0 + u * G < P:
                        acc = acc + vals[u]
        else:
            for p in cutlass.range(g, P, G, unroll=4):
                acc = acc + mPart[batch, head, p, c]
        sums[tidx] = acc
        cute.arch.barrier()
        if tidx < D:
            total = sums[tidx]
            for i in cutlass.range_constexpr(1, G):
                total = total + sums[tidx + i * D]
            mMean[batch, head, tidx] = total
        if tidx == 0:
            mCount[batch * heads + head] = Int32(0)

    @cute.jit
    def count_late(self, mPart: cute.Tensor, mMean: cute.Tensor, mCount: cute.Tensor, storage, heads: Int32,
                   n_tiles: Int32, n_blocks: Int32, n_sample: Int32, total: Int32, n_count: Int32, tidx: Int32):
        """``late_count``, after the CTA's loop: every thread fences (release: its partial sums of all the CTA's K
        blocks), a barrier; then the CTA's K items (``late_first``, ``late_item``) are dealt to its threads, each
        counting its item at the (batch, kv-head) counter (gpu-scope acq_rel atomic, all threads at once); a thread
        whose ticket is the head's last (n_count - 1: n_tiles, or n_sample with k_sample) writes the head's slot
        into shared memory (``done``; -1 otherwise), a barrier, and the CTA finishes the mean of each such head in
        thread order (``mean_of``, a barrier after each). The same partials and the same order as ``mean_if_last``:
        the mean is bit for bit the per-block count's; one fence per CTA instead of one per K block."""
        T = self.num_threads
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        done = storage.done.get_tensor(cute.make_layout(T))
        cute.arch.fence_acq_rel_gpu()  # release: this thread's partial sums before any count
        cute.arch.barrier()
        first = late_first(cta, grid, n_blocks)
        n_items = (total - first + grid - 1) // grid  # the CTA's K items (first <= total + grid - 1)
        for rnd in cutlass.range((n_items + T - 1) // T, unroll=1):
            blk = late_item(first, grid, T, rnd, tidx)
            mine = Int32(-1)
            if blk < total:
                batch, head, _, _ = self.decode(blk, heads, n_tiles, n_blocks, n_sample)
                slot = batch * heads + head
                ticket = cute.arch.atomic_add((mCount.iterator + slot).llvm_ptr, Int32(1), sem="acq_rel", scope="gpu")
                if ticket == n_count - 1:
                    mine = slot
            done[tidx] = mine
            cute.arch.barrier()
            for j in cutlass.range(cutlass.min(T, n_items - rnd * T), unroll=1):
                slot = done[j]
                if slot >= 0:
                    self.mean_of(mPart, mMean, mCount, storage, slot // heads, slot % heads, heads, tidx)
                    cute.arch.barrier()  # the group sums' buffer is free again
            cute.arch.barrier()  # done[] is rewritten by the next round

    @cute.jit
    def load_block(self, sRaw: cute.Tensor, mX: cute.Tensor, mK: cute.Tensor, batch: Int32, head: Int32,
                   tile: Int32, is_k, tidx: Int32, g2s: cute.CopyAtom):
        """Issue the cp.async (16 bytes each) of the thread's 16-bit values of a block (of K when is_k, with
        ``kmean``) into its stage of shared memory; tokens past seqlen are not read. The caller commits."""
        for j in cutlass.range_constexpr(SLOTS):
            tok = tile * self.cfg.rows + self.token_of(tidx, j)
            if tok < mX.shape[1]:
                chunk = self.chunk_of(tidx, j)
                if const_expr(self.cfg.kmean):
                    if is_k:
                        src = cute.local_tile(mK[batch, tok, head, None], (VEC,), (chunk,))
                        cute.copy(g2s, cute.zipped_divide(src, (8,)), sRaw[None, None, j])
                    else:
                        src = cute.local_tile(mX[batch, tok, head, None], (VEC,), (chunk,))
                        cute.copy(g2s, cute.zipped_divide(src, (8,)), sRaw[None, None, j])
                else:
                    src = cute.local_tile(mX[batch, tok, head, None], (VEC,), (chunk,))
                    cute.copy(g2s, cute.zipped_divide(src, (8,)), sRaw[None, None, j])

    @cute.jit
    def load_block_coalesced(self, sStage: cute.Tensor, mX: cute.Tensor, mK: cute.Tensor, batch: Int32,
                             head: Int32, tile: Int32, is_k, tidx: Int32, g2s: cute.CopyAtom):
        """coalesced: the cp.async (16 bytes each) of a block's 16-bit values into a stage in (token, channel)
        order, piece q of token r at r * D / 8 + (q ^ swizzle(r)): thread t loads piece t % (D / 8) of tokens
        t / (D / 8) + m * rows / 8 (m = 0..7), so a warp reads 512 contiguous bytes of a token row (all
        of them: 32 B sectors and 128 B lines whole). Tokens past seqlen are not read. The caller commits."""
        if const_expr(self.cfg.kmean):
            if is_k:
                self.copy_pieces(sStage, mK, batch, head, tile, tidx, g2s)
            else:
                self.copy_pieces(sStage, mX, batch, head, tile, tidx, g2s)
        else:
            self.copy_pieces(sStage, mX, batch, head, tile, tidx, g2s)

    @cute.jit
    def copy_pieces(self, sStage: cute.Tensor, mSrc: cute.Tensor, batch: Int32, head: Int32, tile: Int32,
                    tidx: Int32, g2s: cute.CopyAtom):
        """``load_block_coalesced``'s cp.async from one source tensor."""
        n = 2 * self.slots  # the thread's pieces (8; 16 with ``wide``)
        P, rows8 = self.head_dim // 8, self.cfg.rows // n  # 16-byte pieces per token; token step between loads
        q = tidx % P
        r0 = tidx // P
        tok0 = tile * self.cfg.rows + r0
        # the thread's n pieces: (8 channels, m) at token tok0 + m * rows8 (one address, then constant steps)
        first = cute.local_tile(mSrc[batch, tok0, head, None], (8,), (q,))
        mine = cute.make_tensor(first.iterator, cute.make_layout((8, n), stride=(1, rows8 * mSrc.stride[1])))
        for m in cutlass.range_constexpr(n):
            if tok0 + m * rows8 < mSrc.shape[1]:
                _, _, piece = stage_load(self.head_dim, self.cfg.rows, self.cfg.role, self.lanes, tidx, m, n)
                cute.copy(g2s, mine[None, m], cute.local_tile(sStage, (8,), (piece,)))

    @cute.jit
    def read_block(self, sStage: cute.Tensor, raw: cute.Tensor, tidx: Int32, s2r: cute.CopyAtom):
        """coalesced: the thread's two pieces per slot (its 16 channels of a token) from the swizzled stage,
        16 bytes each (8 threads of a quarter warp hit 8 distinct 16-byte bank groups: ``piece_swizzle``)."""
        for j in cutlass.range_constexpr(self.slots):
            for p in cutlass.range_constexpr(2):
                piece = stage_piece(self.cfg.role, self.lanes, self.quads, self.head_dim, tidx, j, p)
                src = cute.local_tile(sStage, (8,), (piece,))
                cute.copy(s2r, src, cute.zipped_divide(raw[None, j], (8,))[None, p])

    @cute.jit
    def signs_and_smoothing(self, x: cute.Tensor, sSigns: cute.Tensor, sMean: cute.Tensor, tidx: Int32):
        """x = (x - mean) * sign per channel (smoothing, then the rotation's random signs / K's -1)."""
        for j in cutlass.range_constexpr(self.slots):
            c0 = self.chunk_of(tidx, j) * VEC
            sign = cute.make_rmem_tensor(VEC, Float32)
            cute.autovec_copy(cute.local_tile(sSigns, (VEC,), (c0 // VEC,)), sign)
            if const_expr(self.cfg.smooth):
                mean = cute.make_rmem_tensor(VEC, Float32)
                cute.autovec_copy(cute.local_tile(sMean, (VEC,), (c0 // VEC,)), mean)
                for i in cutlass.range_constexpr(VEC):
                    x[i, j] = (x[i, j] - mean[i]) * sign[i]
            else:
                for i in cutlass.range_constexpr(VEC):
                    x[i, j] = x[i, j] * sign[i]

    @cute.jit
    def lse_shift(self, x: cute.Tensor, sMean: cute.Tensor, mShift: cute.Tensor, scale: Float32, batch: Int32,
                  head: Int32, tile: Int32, tidx: Int32):
        """shift[batch, head, token] = scale * (q . mean of kv-head head // (H / H_kv)), float32 (the
        thread's 64 products in order, then a butterfly sum over the token's L lanes). ``wide``: the same sums in the
        same order (bit for bit): the thread holds the default's lanes l (even slots) and l + L (odd slots), one
        accumulator each, the butterfly over the L lanes on both, then the default's last butterfly step (lanes l and
        l + L) as one add."""
        acc = Float32(0.0)
        odd = Float32(0.0)  # wide: the default's lane l + L
        for j in cutlass.range_constexpr(self.slots):
            mean = cute.make_rmem_tensor(VEC, Float32)
            cute.autovec_copy(cute.local_tile(sMean, (VEC,), (self.chunk_of(tidx, j),)), mean)
            for i in cutlass.range_constexpr(VEC):
                if const_expr(self.cfg.wide and j % 2 == 1):
                    odd = _fma(x[i, j], mean[i], odd)
                else:
                    acc = _fma(x[i, j], mean[i], acc)
        for b in cutlass.range_constexpr(self.lanes.bit_length() - 1):
            acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=1 << b)
            if const_expr(self.cfg.wide):
                odd = odd + cute.arch.shuffle_sync_bfly(odd, offset=1 << b)
        if const_expr(self.cfg.wide):
            acc = acc + odd
        tok = tile * self.cfg.rows + self.token_of(tidx, 0)
        if tidx % self.lanes == 0 and tok < mShift.shape[2]:
            mShift[batch, head, tok] = acc * scale

    @cute.jit
    def fwht(self, x: cute.Tensor, lane: Int32):
        """Unnormalised Walsh-Hadamard transform of the thread's token (with its L lanes) in the stage order
        of ``quantize.fwht``; the normalisation is folded into the quantisation (``finish_block``)."""
        self.chunk_stages(x)  # h = 1, 2, 4, 8: inside a chunk
        for b in cutlass.range_constexpr(self.lanes.bit_length() - 1):  # h = 16 .. 8 L: across lanes
            m = 1 << b
            sign = Float32(1.0) - Float32(2.0) * Float32(lane >> b & 1)  # +1: a + other, -1: other - b
            for j in cutlass.range_constexpr(self.slots):
                for i in cutlass.range_constexpr(VEC):
                    other = cute.arch.shuffle_sync_bfly(x[i, j], offset=m)
                    x[i, j] = _fma(x[i, j], sign, other)
        for b in cutlass.range_constexpr(self.slots.bit_length() - 1):  # h = 16 L .. D / 2: the thread's chunks
            h = 1 << b
            for j in cutlass.range_constexpr(self.slots):
                if const_expr((j & h) == 0):
                    for i in cutlass.range_constexpr(VEC):
                        a, c = x[i, j], x[i, j + h]
                        x[i, j] = a + c
                        x[i, j + h] = a - c

    @cute.jit
    def chunk_stages(self, x: cute.Tensor):
        """The FWHT stages h = 1, 2, 4, 8 inside each of the thread's 16-channel chunks (``fwht``'s first four)."""
        for j in cutlass.range_constexpr(self.slots):
            for b in cutlass.range_constexpr(4):
                h = 1 << b
                for i in cutlass.range_constexpr(VEC):
                    if const_expr((i & h) == 0):
                        a, c = x[i, j], x[i + h, j]
                        x[i, j] = a + c
                        x[i + h, j] = a - c

    @cute.jit
    def e4m3_slots(self, x: cute.Tensor, tidx: Int32) -> cute.Tensor:
        """The thread's values as e4m3 (saturating), (VEC, slots), slot j = chunk ``chunk_of(tidx, j)``."""
        y8 = cute.make_rmem_tensor(cute.make_layout((VEC, self.slots)), cutlass.Float8E4M3FN)
        y8.store(x.load().to(cutlass.Float8E4M3FN))
        return y8

    @cute.jit
    def block_max(self, v: Float32, red: cute.Tensor, parity: Int32, tidx: Int32) -> Float32:
        """max of v over the CTA: warp butterfly, then the warps' maxima through shared memory (buffer
        ``parity``: consecutive blocks alternate, so one barrier per block suffices)."""
        for b in cutlass.range_constexpr(5):
            v = cute.arch.fmax(v, cute.arch.shuffle_sync_bfly(v, offset=16 >> b))
        if tidx % 32 == 0:
            red[tidx // 32, parity] = v
        cute.arch.barrier()
        out = red[0, parity]
        for w in cutlass.range_constexpr(1, self.num_threads // 32):
            out = cute.arch.fmax(out, red[w, parity])
        return out

    @cute.jit
    def finish_block(self, x: cute.Tensor, mX: cute.Tensor, mY: cute.Tensor, mDescale: cute.Tensor,
                     red: cute.Tensor, parity: Int32, batch: Int32, head: Int32, tile: Int32, tidx: Int32,
                     sStage: cute.Tensor):
        """amax over the block's existing tokens -> descale (or amax / the given descale) -> e4m3, stored (through
        sStage, the stage this block was read from, with ``staged_store``)."""
        seqlen = mX.shape[1]
        amax = Float32(0.0)
        for j in cutlass.range_constexpr(self.slots):
            if tile * self.cfg.rows + self.token_of(tidx, j) < seqlen:
                for i in cutlass.range_constexpr(VEC):
                    amax = cute.arch.fmax(amax, cute.arch.fmax(x[i, j], -x[i, j]))
        amax = self.block_max(amax, red, parity, tidx)
        # torch normalises first (x * n, n = float32(1 / sqrt(D))) and takes the amax of that; rounding is
        # monotonic, so max |fl(x n)| = fl(max |x| n); and fl(x n) * inv = fl(x (n inv)) as inv is a power of
        # two and n * inv stays normal (inv >= 2^-120 for any finite amax): one multiply per value, same bits
        norm = Float32(1.0 / math.sqrt(self.head_dim)) if const_expr(self.cfg.rotate) else None
        if const_expr(self.cfg.rotate):
            amax = amax * norm
        if const_expr(self.cfg.mode == "amax"):
            if tidx == 0:
                mDescale[batch, head, tile] = amax
        else:
            if const_expr(self.cfg.mode == "given"):
                field = f32_bits(mDescale[batch, head, tile]) >> 23
            else:
                bits = f32_bits(amax)
                field = ((bits >> 23) & 0xFF) - 8
                if (bits & 0x7FFFFF) > 0x600000:
                    field = field + 1
                field = cutlass.min(cutlass.max(field, 127 + MIN_DESCALE_EXPONENT), 253)
                if (bits & 0x7FFFFFFF) == 0:  # an all-zero block: descale 1, as descale_from_amax
                    field = Int32(127)
                if tidx == 0:
                    mDescale[batch, head, tile] = bits_f32(field << 23)
            inv = bits_f32((254 - field) << 23)
            if const_expr(self.cfg.rotate):
                inv = inv * norm
            for j in cutlass.range_constexpr(self.slots):
                for i in cutlass.range_constexpr(VEC):
                    x[i, j] = x[i, j] * inv
            if const_expr(self.cfg.staged_store):
                self.store_qk_staged(x, mY, sStage, batch, head, tile, tidx)
            elif const_expr(self.cfg.role == "qk"):
                self.store_qk(x, mY, batch, head, tile, tidx)
            else:
                self.store_v_t(x, mY, batch, head, tile, tidx)

    @cute.jit
    def store_qk(self, x: cute.Tensor, mY: cute.Tensor, batch: Int32, head: Int32, tile: Int32, tidx: Int32):
        """e4m3 (saturating) of the thread's token, one 16-byte store per chunk."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float8E4M3FN, num_bits_per_copy=128)
        y8 = self.e4m3_slots(x, tidx)
        tok = tile * self.cfg.rows + self.token_of(tidx, 0)
        if tok < mY.shape[1]:
            for j in cutlass.range_constexpr(self.slots):
                dst = cute.local_tile(mY[batch, tok, head, None], (VEC,), (self.chunk_of(tidx, j),))
                cute.copy(atom, cute.zipped_divide(y8[None, j], (VEC,)), cute.zipped_divide(dst, (VEC,)))

    @cute.jit
    def store_qk_staged(self, x: cute.Tensor, mY: cute.Tensor, sStage: cute.Tensor, batch: Int32, head: Int32,
                        tile: Int32, tidx: Int32):
        """``staged_store``: e4m3 (saturating) of the thread's token into the stage it was read from (every
        thread read its values before ``block_max``'s barrier, and the stage is refilled only after the next
        item's barrier), 16 bytes per chunk at ``store_unit``; a barrier; then thread t stores units t + r *
        threads (``store_map``, r = 0..3) of the block to global memory: a warp 512 contiguous bytes of whole
        token rows. Tokens past seqlen are not stored."""
        D, T = self.head_dim, self.num_threads
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float8E4M3FN, num_bits_per_copy=128)
        y8 = self.e4m3_slots(x, tidx)
        sY = cute.make_tensor(cute.recast_ptr(sStage.iterator, dtype=cutlass.Float8E4M3FN),
                              cute.make_layout(self.cfg.rows * store_pitch(D) * VEC))
        for j in cutlass.range_constexpr(SLOTS):
            sDst = cute.local_tile(sY, (VEC,), (store_unit(D, tidx, j),))
            cute.copy(atom, cute.zipped_divide(y8[None, j], (VEC,)), cute.zipped_divide(sDst, (VEC,)))
        cute.arch.barrier()
        # thread t's 4 units: token t / (D / 16) + r rows / 4, chunk t % (D / 16) (``store_map``): one shared and
        # one global address, then constant steps
        pitch, step = store_pitch(D), self.cfg.rows // SLOTS
        row0, chunk, unit0 = store_map(D, T, tidx, 0)
        tok0 = tile * self.cfg.rows + row0
        first = cute.local_tile(mY[batch, tok0, head, None], (VEC,), (chunk,))
        gDst = cute.make_tensor(first.iterator, cute.make_layout((VEC, SLOTS), stride=(1, step * mY.stride[1])))
        sSrc = cute.make_tensor(cute.local_tile(sY, (VEC,), (unit0,)).iterator,
                                cute.make_layout((VEC, SLOTS), stride=(1, step * pitch * VEC)))
        out = cute.make_rmem_tensor(VEC, cutlass.Float8E4M3FN)  # one unit at a time: 4 registers live, not 16
        for r in cutlass.range_constexpr(SLOTS):
            if tok0 + r * step < mY.shape[1]:
                cute.copy(atom, cute.zipped_divide(sSrc[None, r], (VEC,)), cute.zipped_divide(out, (VEC,)))
                cute.copy(atom, cute.zipped_divide(out, (VEC,)), cute.zipped_divide(gDst[None, r], (VEC,)))

    @cute.jit
    def store_v_t(self, x: cute.Tensor, mVt: cute.Tensor, batch: Int32, head: Int32, tile: Int32, tidx: Int32):
        """V: per channel, the e4m3 bytes of the thread's 4 tokens are positions 4t .. 4t + 3 of their group
        in v_t (layout.v_token_order): one 32-bit store each, a warp's 32 quads 128 contiguous bytes."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float8E4M3FN, num_bits_per_copy=32)
        y8 = cute.make_rmem_tensor(cute.make_layout((VEC, SLOTS), stride=(SLOTS, 1)), cutlass.Float8E4M3FN)
        y8.store(x.load().to(cutlass.Float8E4M3FN))
        quad = tidx % self.quads
        if tile * self.cfg.rows + 16 * (quad // 4) < mVt.shape[3]:  # the group exists in v_t (padded to 16)
            c0 = self.chunk_of(tidx, 0) * VEC
            for i in cutlass.range_constexpr(VEC):
                dst = cute.local_tile(mVt[batch, head, c0 + i, None], (SLOTS,), (tile * self.quads + quad,))
                cute.copy(atom, cute.zipped_divide(y8[i, None], (SLOTS,)), cute.zipped_divide(dst, (SLOTS,)))


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
