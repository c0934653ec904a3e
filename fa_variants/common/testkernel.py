"""A small internal test kernel for the compile infrastructure (variant "testkernel").

It has the standard attention signature ``(q, k, v, out, lse, softmax_scale)`` so it travels the same
path as the real kernels (fake tensors with dynamic batch / seqlen / heads / strides, TVM-FFI, the
compile cache, the environment stream), but computes something trivial and checkable:

    out[b, i, h, :] = q[b, i, h, :] * softmax_scale + v[b, min(i, Nk - 1), h // (H // Hkv), :]
    lse[b, h, i]    = softmax_scale

One CTA of 32 threads per (row i, head h, batch b); threads stride over head_dim.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32

from fa_variants.common import compile as cc
from fa_variants.common import interop

HEAD_DIMS = (32, 64, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)


class TestKernel:
    """The test kernel: `__call__` is the @cute.jit host side, `kernel` the device side."""

    def __init__(self, cfg: cc.StaticConfig):
        self.head_dim = cfg.head_dim
        self.threads = cfg.tile("threads", 32)
        self.smem_bytes = 0  # no shared memory

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, softmax_scale: Float32, stream: cuda.CUstream):
        self.kernel(mQ, mV, mO, mLSE, softmax_scale).launch(
            grid=[mQ.shape[1], mQ.shape[2], mQ.shape[0]], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               scale: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        i, h, b = cute.arch.block_idx()
        group = mQ.shape[2] // mV.shape[2]
        j = cutlass.min(i, mV.shape[1] - 1)
        for d in cutlass.range(tidx, self.head_dim, self.threads):
            x = mQ[b, i, h, d].to(Float32) * scale + mV[b, j, h // group, d].to(Float32)
            mO[b, i, h, d] = x.to(mO.element_type)
        if tidx == 0:
            mLSE[b, h, i] = scale


def _tiles(arch: str, head_dim: int, dtype: str, causal: bool) -> tuple:
    return (("threads", 32),)


def _build(cfg: cc.StaticConfig):
    return TestKernel(cfg), interop.fake_attention_args(cfg.dtype, cfg.head_dim, cfg.align)


cc.register_variant(
    "testkernel", build=_build, tiles=_tiles, archs=cc.ARCHS, dtypes=("fp16", "bf16"),
    head_dims=HEAD_DIMS, module=__name__,
    description="internal test kernel: out = q * scale + v[row], lse = scale")


def run(q, k, v, *, causal: bool = False, softmax_scale: float = 1.0):
    """Launch the test kernel on torch CUDA tensors (q (B,Nq,H,D), k/v (B,Nk,Hkv,D)) -> (out, lse)."""
    cfg = cc.config_for("testkernel", interop.device_arch(q.device), interop.dtype_name(q.dtype),
                        q.shape[-1], causal)
    fn = cc.get_compiled(cfg).fn
    q, k, v = (interop.aligned(t) for t in (q, k, v))
    out, lse = interop.new_outputs(q)
    with torch.cuda.device(q.device):
        fn(q, k, v, out, lse, float(softmax_scale))
    return out, lse
