"""The CuTe DSL side of the internal test kernel (``fa_variants.testkernel``: what it computes), imported only
to compile: a process that loads it from the disk cache never imports the DSL.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32

from fa_variants.common.cache import StaticConfig


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
