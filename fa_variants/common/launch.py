"""A kernel variant (`Variant`: what it serves, its configuration, how to build and launch it) and the one
launcher every variant runs through (`launch`).

Each kernel module defines one ``VARIANT = Variant(...)``; `fa_variants.registry` finds it by name, and the
dispatcher, `fa-variants compile` and `fa-variants info` read it. `launch` does for every variant:

    check dtype / head_dim / heads  ->  the softmax scale in kernel form (`common.scale.positive_scale`)
    ->  O = 0, LSE = -inf without a launch when there is nothing to compute (no query, no key)
    ->  grid limits (`Variant.check_problem`, before anything is compiled)
    ->  config (the variant's default for (arch, head_dim, causal), or `config=`, checked)
    ->  the compiled kernel (`common.cache`, once per static configuration, then a per-process lookup)
    ->  operands the kernel can address (`Variant.operand`)
    ->  outputs (out like q, LSE float32)  ->  the runtime arguments (`Variant.prepare`)  ->  the launch.

Pure Python; the CuTe DSL is imported only when a kernel is first compiled.
"""
from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any, Callable

import torch

from fa_variants.common import cache, interop
from fa_variants.common.scale import kernel_scale


def standard_args(config, q, k, v, out, lse, scale: float) -> tuple:
    """Runtime arguments of the standard signature (q, k, v, out, lse, softmax_scale)."""
    return q, k, v, out, lse, scale


@dataclasses.dataclass(frozen=True)
class Variant:
    """One kernel variant.

    name: the backend / compile name ("fa2", ...).
    archs: the compile targets it is known to build for ("sm_80", "sm_90a", ...); which GPUs prefer it is
        the dispatcher's table.
    dtypes: torch dtypes of q, k, v it serves; head_dims: the head dims it serves (None: any).
    default_config: (arch, head_dim, causal) -> its frozen config (`common.config`).
    check_config: (config, arch, head_dim) -> config, or ValueError (a `config=` override is checked).
    build: StaticConfig -> (jit callable, fake compile-time arguments).
    prepare: (config, q, k, v, out, lse, scale) -> the compiled kernel's runtime arguments.
    operand: a q / k / v tensor -> one the kernel can address (alignment; a copy when needed).
    check_problem: (config or None for the default, q, k) -> None, or ValueError (grid limits).
    runner: a variant whose call is not the standard launch (the reference; fa3-fp8, which quantises) runs
        this instead of `launch`.
    auto_dtypes: the dtypes the dispatcher's ``auto`` may pick it for (None: all of `dtypes`); the others
        only on request (fa3-fp8 quantises 16-bit inputs: it changes the numerics).
    request_note: dtype -> a sentence the dispatcher adds to the reason when the variant is requested.
    problem_config: (config or None, q, k, causal) -> the config to run (None: the default), for variants
        whose best static shape depends on the problem (fa3: split-KV for decode shapes).
    finish: (config, runtime args, out, lse) -> None, after the launch (fa3: the split-KV merge into out, lse).
    """

    name: str
    archs: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    head_dims: tuple[int, ...] | None
    default_config: Callable[[str, int, bool], Any] | None = None
    check_config: Callable[[Any, str, int], Any] | None = None
    build: Callable[[cache.StaticConfig], tuple] | None = None
    prepare: Callable[..., tuple] = standard_args
    operand: Callable[[torch.Tensor], torch.Tensor] = interop.aligned
    check_problem: Callable[[Any, torch.Tensor, torch.Tensor], None] | None = None
    runner: Callable[..., tuple] | None = None
    auto_dtypes: tuple[torch.dtype, ...] | None = None
    request_note: Callable[[torch.dtype], str | None] | None = None
    problem_config: Callable[[Any, torch.Tensor, torch.Tensor, bool], Any] | None = None
    finish: Callable[[Any, tuple, torch.Tensor, torch.Tensor], None] | None = None

    def can_implement(self, dtype: torch.dtype, head_dim: int) -> str | None:
        """Why this variant cannot serve (dtype, head_dim); None if it can."""
        if dtype not in self.dtypes:
            return (f"{self.name} does not support dtype {_name(dtype)} "
                    f"(supports {', '.join(_name(d) for d in self.dtypes)})")
        if self.head_dims is not None and head_dim not in self.head_dims:
            return (f"{self.name} does not support head_dim {head_dim} "
                    f"(supports {', '.join(map(str, self.head_dims))})")
        return None

    def config_for(self, arch: str, head_dim: int, causal: bool, config=None):
        """The config a call runs with: `config` (checked) or the default for (arch, head_dim, causal)."""
        if config is None:
            return self.default_config(arch, head_dim, causal)
        return self.check_config(config, arch, head_dim) if self.check_config else config

    def static_config(self, arch: str, dtype: str, head_dim: int, causal: bool, config=None,
                      align: int = interop.DEFAULT_ALIGN) -> cache.StaticConfig:
        """The compile-cache key of a call."""
        return cache.StaticConfig(self.name, arch, dtype, int(head_dim), bool(causal),
                                  self.config_for(arch, int(head_dim), bool(causal), config), int(align))

    def compiled(self, cfg: cache.StaticConfig) -> cache.Compiled:
        """The compiled kernel of a static configuration (compiled on first use)."""
        return cache.get_compiled(cfg, self.build)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float,
            config=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention forward: (out (B, Nq, H, D) like q, lse float32 (B, H, Nq), natural log); see `launch`."""
        if self.runner is not None:
            return self.runner(q, k, v, causal=causal, softmax_scale=softmax_scale)
        return launch(self, q, k, v, causal=causal, softmax_scale=softmax_scale, config=config)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_KERNELS: dict[tuple, tuple] = {}  # (variant, device, dtype, head_dim, causal, config) -> (fn, config)
_LOCK = threading.Lock()


def _kernel(variant: Variant, device: torch.device, dtype: torch.dtype, head_dim: int, causal: bool, config):
    key = (variant.name, device, dtype, head_dim, causal, config)
    hit = _KERNELS.get(key)  # the common case, once per process per configuration: a dict lookup
    if hit is None:
        with _LOCK:
            cfg = variant.static_config(interop.device_arch(device), interop.dtype_name(dtype), head_dim,
                                        causal, config)
            hit = _KERNELS[key] = (variant.compiled(cfg).fn, cfg.config)
    return hit


def launch(variant: Variant, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
           softmax_scale: float, config=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a kernel variant on CUDA tensors.

    Args:
        q: (batch, seqlen_q, num_heads, head_dim); k, v: (batch, seqlen_k, num_heads_kv, head_dim); one of
            the variant's dtypes and head dims, num_heads % num_heads_kv == 0 (GQA / MQA), unit last stride.
        causal: bottom-right aligned causal mask.
        softmax_scale: any finite real within `common.scale.MAX_SOFTMAX_SCALE` (`common.scale.kernel_scale`).
        config: the variant's config type, overriding its default (checked against the arch).
    Returns:
        (out, lse): out (batch, seqlen_q, num_heads, head_dim) like q, contiguous; lse float32
        (batch, num_heads, seqlen_q), natural log; a row that sees no key gets O = 0, LSE = -inf.
    Raises:
        ValueError: a dtype, head_dim or head count the variant does not serve, an illegal scale or config,
            a grid beyond the hardware limits, an operand that cannot be aligned.
        TypeError: a softmax_scale that is not a real number.
    """
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    problem = variant.can_implement(q.dtype, head_dim)
    if problem:
        raise ValueError(problem)
    if heads_kv == 0 or heads % heads_kv:
        raise ValueError(f"{variant.name}: num_heads {heads} is not divisible by num_heads_kv {heads_kv}")
    if variant.problem_config is not None:
        config = variant.problem_config(config, q, k, causal)
    if variant.check_problem is not None:
        variant.check_problem(config, q, k)
    negate_k, scale = kernel_scale(softmax_scale)
    if q.numel() == 0 or seqlen_k == 0:  # nothing to launch: O = 0, LSE = -inf
        return (torch.zeros_like(q, memory_format=torch.contiguous_format),
                torch.full((batch, heads, seqlen_q), -math.inf, dtype=torch.float32, device=q.device))
    fn, config = _kernel(variant, q.device, q.dtype, head_dim, bool(causal), config)
    if negate_k:  # softmax(c Q K^T) = softmax(|c| Q (-K)^T): the online max needs c > 0
        k = -k
    q, k, v = (variant.operand(t) for t in (q, k, v))
    out, lse = interop.new_outputs(q)
    with torch.cuda.device(q.device):
        args = variant.prepare(config, q, k, v, out, lse, scale)
        fn(*args)
        if variant.finish is not None:
            variant.finish(config, args, out, lse)
    return out, lse
