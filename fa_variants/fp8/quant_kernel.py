"""The FP8 quantisation pass as a CuTe DSL kernel (variant "fp8-quant"): the recipe of
``fa_variants.fp8.quantize`` on the GPU, reading each 16-bit tensor once.

One CTA per scale block: ``rows`` (= TILE_M or tile_n, 128) tokens of one (batch, head), all head_dim
channels. Thread layout: a token's head_dim channels are spread over L = head_dim / 8 consecutive lanes, 8
contiguous channels each (one 16-byte load); 16 tokens per step, ``rows / 16`` steps, so 2 * head_dim threads
per CTA and 64 fp32 values per thread for every head_dim (64, 128, 256). Per block:

1. load (16-byte vectors; tokens past seqlen are not read), convert to fp32;
2. Q / K: K minus its mean over tokens (``smooth``; the mean comes from ``quantize.k_mean``, one torch
   reduction, so torch and this pass subtract the same numbers: K is read twice in all, Q and V once), times
   the random signs, then the fast Walsh-Hadamard transform (``rotate``): stages h = 1, 2, 4 inside a
   thread's 8 registers, then h = 8, 16, ... across the lanes of the token with ``shfl.bfly`` (lane ^ m),
   the pair (a, b) -> (a + b, a - b) exactly as ``quantize.fwht`` does in the same order; times
   float32(1 / sqrt(head_dim)). Bitwise the torch maths.
3. amax of the block: per-thread max, warp butterfly max, then across warps through shared memory;
   descale = the power of two of ``quantize.descale_from_amax`` (the same integer arithmetic on the
   float32 bits); mode "amax" writes the amax instead and stops (per-head / per-tensor baselines: torch
   reduces the amaxes, a second launch in mode "given" reads the descale);
4. e4m3 = cvt.rn.satfinite(x * (1 / descale)) after a clamp to +-448 (as torch clamps), stored with
   8-byte vectors (Q, K: same layout as the input) or, for V, transposed through shared memory into
   ``v_t`` (batch, num_heads_kv, head_dim, seqlen_k_padded) with the token order of ``layout.v_token_order``
   inside each group of 16 (token u of a group goes to position 4 ((u >> 1) & 3) + 2 (u >> 3) + (u & 1))
   and zeros for the padding tokens, written as 16-byte rows.

Only plain loads / stores, shuffles, shared memory and the f32 -> e4m3 conversion (no TMA, no WGMMA): it runs
on sm_89 (Ada) as well as sm_90 (so it is testable on more GPUs), and a memory-bound pass gains nothing from
Hopper's units here. Not sm_80/86: their PTX has no e4m3 conversion (``cvt.rn.satfinite.e4m3x2.f32`` needs
sm_89; libNVVM refuses it for sm_80).
head_dim 96 (H12 x H8) is not built in the kernel: ``why_not`` says so and ``quantize_fp8`` uses the torch
path there (the same recipe; slower).
Learnt from: the FWHT-with-shuffles idea (QuaRot and FlashAttention-3's Hadamard kernels; docs/design.md,
FP8 notes); the tiled-copy pattern of ``fa_variants.ampere.fa2``.
"""
from __future__ import annotations

import dataclasses
import math

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import arith as mlir_arith
from cutlass.cutlass_dsl import T, dsl_user_op

from fa_variants.common import interop
from fa_variants.common.cache import StaticConfig
from fa_variants.common.launch import Variant
from fa_variants.fp8 import layout
from fa_variants.fp8.quantize import (E4M3, E4M3_MAX, MIN_DESCALE_EXPONENT, FP8Config, FP8Inputs, HadamardRotation,
                                      _check, k_mean, smoothing_lse_shift, tiles_for)

__all__ = ["HEAD_DIMS", "DTYPES", "QuantPass", "why_not", "quantize", "quantize_tensor"]

HEAD_DIMS = (64, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)
ROWS_PER_STEP = 16
VEC = 8  # channels per thread (16 bytes of 16-bit input)
MODES = ("block", "amax", "given")


@dsl_user_op
def _f32_bits(x: Float32, *, loc=None, ip=None) -> Int32:
    return Int32(mlir_arith.bitcast(T.i32(), x.ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def _bits_f32(x: Int32, *, loc=None, ip=None) -> Float32:
    return Float32(mlir_arith.bitcast(T.f32(), x.ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dataclasses.dataclass(frozen=True)
class PassConfig:
    """What one compiled pass does (part of the compile key). role: "qk" (e4m3 like the input) or "v"
    (transposed, token-permuted, padded); rotate, smooth: the recipe's steps (Q / K only); mode: "block"
    (compute the block's descale), "amax" (write the block amax only), "given" (read the descale)."""

    role: str = "qk"
    rotate: bool = True
    smooth: bool = False
    mode: str = "block"
    rows: int = 128

    def check(self, head_dim: int) -> None:
        if self.role not in ("qk", "v") or self.mode not in MODES or self.rows % ROWS_PER_STEP:
            raise ValueError(f"fp8-quant: bad pass config {self}")
        if self.role == "v" and (self.rotate or self.smooth):
            raise ValueError("fp8-quant: V is neither rotated nor smoothed")
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"fp8-quant: head_dim {head_dim} is not built in the GPU pass (supported: {HEAD_DIMS})")


class QuantPass:
    """The pass for one (head_dim, input dtype, PassConfig): ``__call__`` is the @cute.jit host side."""

    def __init__(self, head_dim: int, dtype, cfg: PassConfig):
        cfg.check(head_dim)
        self.head_dim, self.dtype, self.cfg = head_dim, dtype, cfg
        self.lanes = head_dim // VEC  # lanes per token
        self.num_threads = ROWS_PER_STEP * self.lanes
        self.steps = cfg.rows // ROWS_PER_STEP
        self.smem_bytes = 0
        # a register budget of 128 per thread (the 64 values + the shuffles' temporaries fit, measured: no
        # spills), stated to ptxas as blocks per SM: 4 / 2 / 1 blocks of 128 / 256 / 512 threads, 16 warps
        # with 8 x 16-byte loads each in flight; without it ptxas picked 80 and spilled on sm_89
        self.min_blocks = max(1, 65536 // (self.num_threads * 128))

    @cute.jit
    def __call__(self, mX: cute.Tensor, mY: cute.Tensor, mDescale: cute.Tensor, mSigns: cute.Tensor,
                 mMean: cute.Tensor, stream: cuda.CUstream):
        D, rows = self.head_dim, self.cfg.rows
        load_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        thr = cute.make_layout((ROWS_PER_STEP, self.lanes), stride=(self.lanes, 1))
        copy_in = cute.make_tiled_copy_tv(load_atom, thr, cute.make_layout((1, VEC)))
        store_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float8E4M3FN, num_bits_per_copy=64)
        copy_out = cute.make_tiled_copy_tv(store_atom, thr, cute.make_layout((1, VEC)))
        # V: the transposed (D, rows) byte tile, written back as 16-byte rows by (rows / 16) lanes per row
        vt_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float8E4M3FN, num_bits_per_copy=128)
        vt_cols = rows // 16
        vt_thr = cute.make_layout((self.num_threads // vt_cols, vt_cols), stride=(vt_cols, 1))
        copy_vt = cute.make_tiled_copy_tv(vt_atom, vt_thr, cute.make_layout((1, 16)))
        sVt_layout = cute.make_layout((D, rows), stride=(rows, 1))

        @cute.struct
        class SharedStorage:
            red: cute.struct.Align[cute.struct.MemRange[Float32, 32], 16]
            vt: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN,
                                                       D * rows if self.cfg.role == "v" else 16], 128]

        self.smem_bytes = SharedStorage.size_in_bytes()
        grid = (cute.ceil_div(mX.shape[1], rows), mX.shape[2], mX.shape[0])
        self.kernel(mX, mY, mDescale, mSigns, mMean, copy_in, copy_out, copy_vt, sVt_layout,
                    SharedStorage).launch(grid=grid, block=[self.num_threads, 1, 1], smem=self.smem_bytes,
                    min_blocks_per_mp=self.min_blocks,
                    preferred_smem_carveout=-1,  # the driver's default; stated, so compiling needs no GPU
                    stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mY: cute.Tensor, mDescale: cute.Tensor, mSigns: cute.Tensor,
               mMean: cute.Tensor, copy_in: cute.TiledCopy, copy_out: cute.TiledCopy, copy_vt: cute.TiledCopy,
               sVt_layout: cute.Layout, SharedStorage: cutlass.Constexpr):
        D, rows, L = self.head_dim, self.cfg.rows, self.lanes
        tidx, _, _ = cute.arch.thread_idx()
        block, head, batch = cute.arch.block_idx()
        seqlen = mX.shape[1]
        lane = tidx % L  # this thread's 8 channels: lane * 8 .. lane * 8 + 7
        row0 = tidx // L
        valid = seqlen - block * rows  # rows of this block that exist
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)

        # 1. load
        gX = cute.local_tile(mX[batch, None, head, None], (rows, D), (block, 0))
        thr_in = copy_in.get_slice(tidx)
        tXgX = thr_in.partition_S(gX)
        tXc = thr_in.partition_S(cute.make_identity_tensor((rows, D)))
        tXr = cute.make_rmem_tensor_like(tXgX, self.dtype)
        tXr.fill(0)
        for s in cutlass.range_constexpr(self.steps):
            if tXc[0, s, 0][0] < valid:
                cute.copy(copy_in, tXgX[None, s, None], tXr[None, s, None])
        x = cute.make_rmem_tensor_like(tXgX, Float32)
        x.store(tXr.load().to(Float32))

        # 2. smooth, signs, Hadamard
        if const_expr(self.cfg.role == "qk"):
            for i in cutlass.range_constexpr(VEC):
                col = lane * VEC + i
                sign = mSigns[col]
                if const_expr(self.cfg.smooth):
                    mean = mMean[batch, head, col]
                    for s in cutlass.range_constexpr(self.steps):
                        x[i, s, 0] = (x[i, s, 0] - mean) * sign
                else:
                    for s in cutlass.range_constexpr(self.steps):
                        x[i, s, 0] = x[i, s, 0] * sign
            if const_expr(self.cfg.rotate):
                self.fwht(x, lane)

        # 3. amax of the block's existing rows -> descale
        amax = Float32(0.0)
        for s in cutlass.range_constexpr(self.steps):
            if tXc[0, s, 0][0] < valid:
                for i in cutlass.range_constexpr(VEC):
                    amax = cute.arch.fmax(amax, cute.arch.fmax(x[i, s, 0], -x[i, s, 0]))
        amax = self.block_max(amax, storage.red.get_tensor(cute.make_layout(32)), tidx)
        if const_expr(self.cfg.mode == "amax"):
            if tidx == 0:
                mDescale[batch, head, block] = amax
        else:
            if const_expr(self.cfg.mode == "given"):
                field = _f32_bits(mDescale[batch, head, block]) >> 23
            else:
                bits = _f32_bits(amax)
                field = ((bits >> 23) & 0xFF) - 8
                if (bits & 0x7FFFFF) > 0x600000:
                    field = field + 1
                field = cutlass.min(cutlass.max(field, 127 + MIN_DESCALE_EXPONENT), 253)
                if tidx == 0:
                    mDescale[batch, head, block] = _bits_f32(field << 23)
            inv = _bits_f32((254 - field) << 23)

            # 4. e4m3, stored
            for s in cutlass.range_constexpr(self.steps):
                for i in cutlass.range_constexpr(VEC):
                    y = x[i, s, 0] * inv
                    x[i, s, 0] = cute.arch.fmax(cute.arch.fmin(y, Float32(E4M3_MAX)), Float32(-E4M3_MAX))
            y8 = cute.make_rmem_tensor_like(tXgX, cutlass.Float8E4M3FN)
            y8.store(x.load().to(cutlass.Float8E4M3FN))
            if const_expr(self.cfg.role == "qk"):
                gY = cute.local_tile(mY[batch, None, head, None], (rows, D), (block, 0))
                tYgY = copy_out.get_slice(tidx).partition_D(gY)
                for s in cutlass.range_constexpr(self.steps):
                    if tXc[0, s, 0][0] < valid:
                        cute.copy(copy_out, y8[None, s, None], tYgY[None, s, None])
            else:
                self.store_v_t(y8, tXc, mY, storage, copy_vt, tidx, block, head, batch)

    @cute.jit
    def fwht(self, x: cute.Tensor, lane: Int32):
        """Unnormalised Walsh-Hadamard transform of each token's D values (8 per thread, L lanes), then
        times float32(1 / sqrt(D)); the order of ``quantize.fwht``."""
        for s in cutlass.range_constexpr(self.steps):
            for j in cutlass.range_constexpr(3):  # the in-register stages h = 1, 2, 4
                h = 1 << j
                for i in cutlass.range_constexpr(VEC):
                    if const_expr((i & h) == 0):
                        a, b = x[i, s, 0], x[i + h, s, 0]
                        x[i, s, 0] = a + b
                        x[i + h, s, 0] = a - b
        for j in cutlass.range_constexpr(self.lanes.bit_length() - 1):  # across lanes: lane ^ m holds
            m = 1 << j                                                  # channel index ^ (8 m)
            upper = (lane & m) != 0
            for s in cutlass.range_constexpr(self.steps):
                for i in cutlass.range_constexpr(VEC):
                    mine = x[i, s, 0]
                    other = cute.arch.shuffle_sync_bfly(mine, offset=m)
                    x[i, s, 0] = (other - mine) if upper else (mine + other)
        norm = Float32(1.0 / math.sqrt(self.head_dim))
        for s in cutlass.range_constexpr(self.steps):
            for i in cutlass.range_constexpr(VEC):
                x[i, s, 0] = x[i, s, 0] * norm

    @cute.jit
    def block_max(self, v: Float32, red: cute.Tensor, tidx: Int32) -> Float32:
        """max of v over the CTA: warp butterfly, then the warps' maxima through shared memory."""
        for j in cutlass.range_constexpr(5):
            v = cute.arch.fmax(v, cute.arch.shuffle_sync_bfly(v, offset=16 >> j))
        if tidx % 32 == 0:
            red[tidx // 32] = v
        cute.arch.barrier()
        out = red[0]
        for w in cutlass.range_constexpr(1, self.num_threads // 32):
            out = cute.arch.fmax(out, red[w])
        return out

    @cute.jit
    def store_v_t(self, y8: cute.Tensor, tXc: cute.Tensor, mVt: cute.Tensor, storage,
                  copy_vt: cute.TiledCopy, tidx: Int32, block: Int32, head: Int32, batch: Int32):
        """V: the block's e4m3 values into shared memory as (channel, position) with the layout's token
        order (padding tokens zero), then 16-byte rows of v_t (positions < seqlen_k_padded)."""
        D, rows = self.head_dim, self.cfg.rows
        sVt = storage.vt.get_tensor(cute.make_layout((D, rows), stride=(rows, 1)))
        lane = tidx % self.lanes
        for s in cutlass.range_constexpr(self.steps):  # tokens past seqlen_k were never loaded: they are 0
            u = tXc[0, s, 0][0]  # token within the block
            pos = (u & ~15) + 4 * ((u >> 1) & 3) + 2 * ((u >> 3) & 1) + (u & 1)
            for i in cutlass.range_constexpr(VEC):
                sVt[lane * VEC + i, pos] = y8[i, s, 0]
        cute.arch.barrier()
        n_pad = mVt.shape[3]
        gVt = cute.local_tile(mVt[batch, head, None, None], (D, rows), (0, block))
        thr = copy_vt.get_slice(tidx)
        tS, tD = thr.partition_S(sVt), thr.partition_D(gVt)
        tC = thr.partition_S(cute.make_identity_tensor((D, rows)))
        if tC[0][1] < n_pad - block * rows:
            cute.copy(copy_vt, tS, tD)


# ---------------------------------------------------------------------------------------------------
# compile registry and host side
# ---------------------------------------------------------------------------------------------------
def fake_args(dtype: str, head_dim: int, cfg: PassConfig, align: int = 16):
    """Fake (x, y, descale, signs, mean, stream) for compiling: dynamic batch / seqlen / heads / strides."""
    from cutlass.cute.runtime import make_fake_stream

    b, n, h, n_pad, t, bm, hm = (cute.sym_int() for _ in range(7))
    x = interop.fake_tensor(dtype, (b, n, h, head_dim), align)
    y = (interop.fake_tensor("e4m3", (b, n, h, head_dim), align) if cfg.role == "qk"
         else interop.fake_tensor("e4m3", (b, h, head_dim, n_pad), align))
    descale = interop.fake_tensor("fp32", (b, h, t), 4)
    signs = interop.fake_tensor("fp32", (head_dim,), 4)
    mean = interop.fake_tensor("fp32", (bm, hm, head_dim), 4)  # (1, 1, D) zeros when not smoothing
    return x, y, descale, signs, mean, make_fake_stream(use_tvm_ffi_env_stream=True)


def _build(cfg: StaticConfig):
    return QuantPass(cfg.head_dim, interop.cute_dtype(cfg.dtype), cfg.config), fake_args(cfg.dtype, cfg.head_dim,
                                                                                       cfg.config, cfg.align)


# Compiled through the registry ("fp8-quant", `fa-variants compile --variant fp8-quant`); never dispatched to
# (it is not attention): ``quantize`` below launches it.
VARIANT = Variant(
    "fp8-quant", archs=("sm_89", "sm_90a"), dtypes=DTYPES, head_dims=HEAD_DIMS,
    default_config=lambda arch, head_dim, causal: PassConfig(),
    check_config=lambda config, arch, head_dim: config.check(head_dim) or config, build=_build)


def static_config(arch: str, dtype: torch.dtype, head_dim: int, pass_cfg: PassConfig) -> StaticConfig:
    """The compile key of one pass (UnsupportedConfigError for an arch the pass is not built for)."""
    from fa_variants import registry

    return registry.static_config("fp8-quant", arch, interop.dtype_name(dtype), head_dim, False, pass_cfg)


def why_not(q: torch.Tensor, config: FP8Config) -> str | None:
    """Why the GPU pass cannot quantise these inputs (None if it can)."""
    if not q.is_cuda:
        return f"the GPU quantisation pass needs CUDA tensors; the inputs are on {q.device.type}"
    if q.dtype not in DTYPES:
        return f"the GPU quantisation pass takes float16 / bfloat16, got {q.dtype}"
    if q.shape[-1] not in HEAD_DIMS:
        return f"the GPU quantisation pass is built for head_dim {HEAD_DIMS}, not {q.shape[-1]}"
    if torch.cuda.get_device_capability(q.device) < (8, 9):
        return "the GPU quantisation pass needs sm_89 or newer (the e4m3 conversion)"
    return None


def quantize_tensor(x: torch.Tensor, *, role: str, block: int, granularity: str, signs: torch.Tensor | None,
                    mean: torch.Tensor | None, rotate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One tensor through the pass: (e4m3 data (like x, or v_t for role "v"), descale (B, H, T) float32)."""
    B, N, H, D = x.shape
    T_blocks = -(-N // block)
    x = interop.aligned(x)
    dev = x.device
    if role == "qk":
        y = torch.empty(B, N, H, D, dtype=E4M3, device=dev)
    else:
        y = torch.empty(B, H, D, layout.padded_seqlen_k(N), dtype=E4M3, device=dev)
    descale = torch.empty(B, H, T_blocks, dtype=torch.float32, device=dev)
    signs = torch.ones(D, device=dev) if signs is None else signs.to(dev, torch.float32).contiguous()
    mean_t = torch.zeros(1, 1, D, device=dev) if mean is None else mean.contiguous()
    arch = interop.device_arch(dev)

    def launch(mode: str) -> None:
        cfg = PassConfig(role=role, rotate=rotate, smooth=mean is not None, mode=mode, rows=block)
        fn = VARIANT.compiled(static_config(arch, x.dtype, D, cfg)).fn
        with torch.cuda.device(dev):
            fn(x, y, descale, signs, mean_t)

    if B * N * H == 0:
        return y.zero_(), descale
    if granularity == "block":
        launch("block")
    else:  # baselines: the blocks' amaxes, reduced by torch, then the pass again with that descale
        from fa_variants.fp8.quantize import _reduce_amax, descale_from_amax

        launch("amax")
        descale.copy_(descale_from_amax(_reduce_amax(descale, granularity))[0])
        launch("given")
    return y, descale


def quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, config: FP8Config = FP8Config(),
             softmax_scale: float | None = None) -> FP8Inputs:
    """``quantize_fp8`` on the GPU (16-bit CUDA inputs, head_dim in HEAD_DIMS): the same FP8Inputs as
    ``quantize_fp8_torch``, bit for bit on the e4m3 bytes and descales (same operations in the same order)."""
    scale = _check(q, k, v, config, softmax_scale)
    D = q.shape[-1]
    tile_m, tile_n = tiles_for(D)
    signs = HadamardRotation(D, config.seed).signs if config.rotate else torch.ones(D)
    k_signs = -signs if scale < 0 else signs  # softmax(c Q K^T) = softmax(|c| Q (-K)^T)
    mean = mean_eff = shift = None
    if config.smooth_k:
        mean = k_mean(k)  # subtracted from K before its signs (-s for a negative scale)
        mean_eff = -mean if scale < 0 else mean  # the mean of the K the kernel sees, unrotated
        shift = smoothing_lse_shift(q, mean_eff, abs(scale))
    q8, qd = quantize_tensor(q, role="qk", block=tile_m, granularity=config.granularity, signs=signs, mean=None,
                             rotate=config.rotate)
    k8, kd = quantize_tensor(k, role="qk", block=tile_n, granularity=config.granularity, signs=k_signs, mean=mean,
                             rotate=config.rotate)
    v_t, vd = quantize_tensor(v, role="v", block=tile_n, granularity=config.granularity, signs=None, mean=None,
                              rotate=False)
    return FP8Inputs(q8, k8, v_t, qd, kd, vd, abs(scale), k.shape[1], mean_eff, shift, config)
