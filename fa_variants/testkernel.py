"""A small internal test kernel for the compile infrastructure (variant "testkernel").

It has the standard attention signature ``(q, k, v, out, lse, softmax_scale)`` so it travels the same
path as the real kernels (fake tensors with dynamic batch / seqlen / heads / strides, TVM-FFI, the
compile cache, the environment stream), but computes something trivial and checkable:

    out[b, i, h, :] = q[b, i, h, :] * softmax_scale + v[b, min(i, Nk - 1), h // (H // Hkv), :]
    lse[b, h, i]    = softmax_scale

One CTA of 32 threads per (row i, head h, batch b); threads stride over head_dim.
"""
from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32

from fa_variants.common import interop
from fa_variants.common.cache import StaticConfig
from fa_variants.common.launch import Variant

HEAD_DIMS = (32, 64, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)


class TestKernel:
    """The test kernel: `__call__` is the @cute.jit host side, `kernel` the device side."""

    def __init__(self, cfg: StaticConfig):
        self.head_dim = cfg.head_dim
        self.threads = cfg.config.threads
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


@dataclasses.dataclass(frozen=True)
class TestKernelConfig:
    threads: int = 32


def _build(cfg: StaticConfig):
    return TestKernel(cfg), interop.fake_attention_args(cfg.dtype, cfg.head_dim, cfg.align)


VARIANT = Variant("testkernel", archs=("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a"),
                  dtypes=DTYPES, head_dims=HEAD_DIMS, default_config=lambda arch, d, causal: TestKernelConfig(),
                  build=_build)


def run(q, k, v, *, causal: bool = False, softmax_scale: float = 1.0):
    """Launch the test kernel on torch CUDA tensors (q (B,Nq,H,D), k/v (B,Nk,Hkv,D)) -> (out, lse)."""
    return VARIANT.run(q, k, v, causal=causal, softmax_scale=softmax_scale)
