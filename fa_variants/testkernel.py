"""A small internal test kernel for the compile infrastructure (variant "testkernel").

It has the standard attention signature ``(q, k, v, out, lse, softmax_scale)`` so it travels the same
path as the real kernels (fake tensors with dynamic batch / seqlen / heads / strides, TVM-FFI, the
compile cache, the environment stream), but computes something trivial and checkable:

    out[b, i, h, :] = q[b, i, h, :] * softmax_scale + v[b, min(i, Nk - 1), h // (H // Hkv), :]
    lse[b, h, i]    = softmax_scale

One CTA of 32 threads per (row i, head h, batch b); threads stride over head_dim. The kernel class lives in
``fa_variants.testkernel_kernel`` (the CuTe DSL), imported only to compile.
"""
from __future__ import annotations

import dataclasses

import torch

from fa_variants.common import interop
from fa_variants.common.cache import StaticConfig
from fa_variants.common.launch import Variant

HEAD_DIMS = (32, 64, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class TestKernelConfig:
    threads: int = 32


def _build(cfg: StaticConfig):
    from fa_variants.testkernel_kernel import TestKernel  # the DSL: only to compile

    return TestKernel(cfg), interop.fake_attention_args(cfg.dtype, cfg.head_dim, cfg.align)


VARIANT = Variant("testkernel", archs=("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a"),
                  dtypes=DTYPES, head_dims=HEAD_DIMS, default_config=lambda arch, d, causal: TestKernelConfig(),
                  build=_build)


def run(q, k, v, *, causal: bool = False, softmax_scale: float = 1.0):
    """Launch the test kernel on torch CUDA tensors (q (B,Nq,H,D), k/v (B,Nk,Hkv,D)) -> (out, lse)."""
    return VARIANT.run(q, k, v, causal=causal, softmax_scale=softmax_scale)
