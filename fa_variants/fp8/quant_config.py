"""What one compiled FP8 quantisation pass does (``PassConfig``, part of its compile key) and the pass's limits
(``HEAD_DIMS``, ``DTYPES``, ``MAX_BLOCK``, the shared-memory budgets, ``MEAN_LOADS``): plain Python, no DSL. The kernel
that reads it is ``fp8.quant_kernel.QuantPass`` (its module docstring: the design, pipelines v1 / v2 / v3 and their
switches; the host side picks the configs in ``fp8.quant_host``). Every name here is also importable from
``fp8.quant_kernel``.
"""
from __future__ import annotations

import dataclasses

import torch

from fa_variants.fp8.quant_maps import SLOTS, VEC

HEAD_DIMS = (64, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)
MAX_THREADS = 512
MAX_BLOCK = MAX_THREADS * VEC * SLOTS  # 32768 values: the largest rows * head_dim one CTA holds
MODES = ("block", "amax", "given")
MAX_STAGES = 4
SHIFT_CHAIN_COUNTS = (1, 2, 4, 8, 16)  # PassConfig.shift_chains: chains of the LSE shift's sum (16 per chunk)
SMEM_PER_CTA = 227 * 1024  # sm_90's opt-in maximum per CTA (sm_89: 99 KB; the host checks the device)
SMEM_PER_SM = 228 * 1024 - 2048  # what resident CTAs may share (1 KB reserved per CTA by the driver)
#: ``late_count``'s mean: partial sums loaded per batch (independent loads in flight per thread; the adds keep their order)
MEAN_LOADS = 32



@dataclasses.dataclass(frozen=True)
class PassConfig:
    """What one compiled pass does (part of the compile key). role: "qk" (e4m3 like the input) or "v"
    (transposed, token-permuted, padded); rotate, smooth: the recipe's steps (Q / K only); mode: "block"
    (compute the block's descale), "amax" (write the block amax only), "given" (read the descale);
    rows: tokens per scale block (``layout.TILE_M`` for Q, ``layout.tile_n(head_dim)`` for K and V);
    shift (Q with K smoothing): also write ``scale * q . mean`` per row (``quantize.smoothing_lse_shift``);
    staged_store (role "qk", coalesced, rows % 32 == 0): the e4m3 bytes stored through the stage just read
    (``store_qk_staged``); late_count (with fused_mean): K's blocks counted after the CTA's loop, not per block
    (``count_late``); wide (role "qk", coalesced, head_dim 256 without staged_store, or 128): a thread holds 8
    chunks of its token (128 channels) instead of 4. At head_dim 256: 2 lanes per token instead of 4 and one
    cross-lane FWHT stage instead of two (128 ``shfl.bfly`` per thread as before, for twice the values: half the
    shuffles per block), half the threads, up to 255 registers. At head_dim 128 (``quant_host.V3_WIDE128``, session
    14; K's pass by default since session 16): one lane per token, no cross-lane stage at all; a warp's own 16-byte
    stores would half-fill each 32-byte sector there (the pattern ``staged_store`` fixed at head_dim 64), so the host
    pairs it with ``staged_store`` (8 units per thread: ``store_unit`` / ``store_map`` with 8 slots). Both: the same FWHT pairs, stage order and
    roundings, the LSE shift's sums in the default's order: outputs bit for bit the default's. nonfinite (session 14,
    ``quant_host.NONFINITE``): a block whose max is inf takes its descale from its finite values and stores each inf as
    e4m3 NaN (``finite_block``; the torch recipe's rule), one uniform test per block otherwise. shift_chains (with
    shift; session 21, ``quant_host.SHIFT_CHAINS``): the LSE shift's products summed in that many interleaved chains
    added pairwise at the end instead of one serial chain of dependent FMAs (``lse_shift``); another float32
    summation order, the kernel's own either way (torch's sum within float32 rounding), bit for bit across wide.
    deferred (with nonfinite; session 36, ``quant_host.NONFINITE_DEFERRED``): a block for the slow path is left
    unstored in the loop and redone after it (``redo_left``): the same outputs, the slow code
    out of the loop's registers."""

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
    nonfinite: bool = False
    shift_chains: int = 1
    deferred: bool = False

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
        if self.wide and not (self.role == "qk" and self.coalesced
                              and (head_dim == 128 or (head_dim == 256 and not self.staged_store))):
            raise ValueError("fp8-quant: wide (8 chunks of a token per thread) is built for Q / K through a coalesced "
                             f"stage at head_dim 128 and 256 (not with staged_store at 256; got head_dim {head_dim})")
        if self.staged_mean and not (self.coalesced and (self.smooth or self.shift)):
            raise ValueError("fp8-quant: the staged mean rides on the coalesced stages of a pass that reads K's "
                             "mean (smooth or shift)")
        if self.staged_store and not (self.coalesced and self.role == "qk" and self.mode != "amax"
                                      and self.rows % 32 == 0):
            raise ValueError("fp8-quant: the staged store writes Q's / K's e4m3 through a coalesced stage (role 'qk', "
                             "coalesced, mode 'block' or 'given', rows a multiple of 32)")
        if self.role == "v" and (self.rotate or self.smooth or self.shift):
            raise ValueError("fp8-quant: V is neither rotated nor smoothed")
        if self.shift_chains not in SHIFT_CHAIN_COUNTS or (self.shift_chains > 1 and not self.shift):
            raise ValueError(f"fp8-quant: shift_chains is the LSE shift's chain count, one of "
                             f"{SHIFT_CHAIN_COUNTS} (with shift; got {self.shift_chains})")
        if self.deferred and not self.nonfinite:
            raise ValueError("fp8-quant: deferred moves nonfinite's slow path after the loop (needs nonfinite)")
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
