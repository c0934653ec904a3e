"""FP8 attention entry points: quantise then run the fa3-fp8 kernel, or run it on already-quantised inputs.

``attention_fp8`` is what ``fa_variants.attention(q, k, v, backend="fa3-fp8")`` runs for 16-bit inputs (the
default recipe: block scales + Hadamard + smoothed K + two-level accumulation); ``attention_from_fp8`` takes
``FP8Inputs`` (from ``quantize_fp8``, or built by the caller, e.g. an FP8 KV cache). Both call the kernel
module's ``run_fp8(inputs, *, causal, out_dtype) -> (out, lse)`` (``KERNEL_MODULE``; its inputs: ``FP8Inputs``'
docstring in fa_variants/fp8/quantize.py) and never fall back to anything else: where it cannot run they raise
``BackendUnavailableError`` saying why (the kernel module missing from the install; not a CUDA tensor; a GPU
without FP8 WGMMA).
"""
from __future__ import annotations

import dataclasses
import importlib
import math
import types

import torch

from fa_variants.common.checks import one_line
from fa_variants.common.scale import check_softmax_scale
from fa_variants.dispatch import BackendUnavailableError, arch_name, device_capability
from fa_variants.fp8 import layout
from fa_variants.fp8.contract import check_fp8_inputs
from fa_variants.fp8.quantize import E4M3, FP8Config, FP8Inputs, quantize_fp8, tiles_for, transpose_v

__all__ = ["KERNEL_MODULE", "kernel_module", "why_not", "attention_fp8", "attention_from_fp8", "from_e4m3"]

KERNEL_MODULE = "fa_variants.hopper.fa3_fp8"
#: compute capabilities with FP8 WGMMA (the kernel's instructions)
FP8_CAPABILITIES = ((9, 0),)
OUT_DTYPES = (torch.float16, torch.bfloat16)


def kernel_module() -> types.ModuleType:
    """The fa3-fp8 kernel module (imported once by Python). Raises BackendUnavailableError("fa3-fp8 is not
    built yet") when it does not exist or has no ``run_fp8``."""
    try:
        module = importlib.import_module(KERNEL_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name and KERNEL_MODULE.startswith(exc.name):
            raise BackendUnavailableError("fa3-fp8 is not built yet") from None
        raise
    if not hasattr(module, "run_fp8"):
        raise BackendUnavailableError(f"fa3-fp8 is not built yet ({KERNEL_MODULE} has no run_fp8)")
    return module


def why_not(device: torch.device) -> str | None:
    """Why the fa3-fp8 kernel cannot run on ``device`` (None if it can): its module missing, not CUDA, no FP8 WGMMA."""
    try:
        kernel_module()
    except BackendUnavailableError as exc:
        return str(exc)
    capability = device_capability(device)
    if capability is None:
        return f"fa3-fp8 runs on CUDA tensors (sm_90); the inputs are on {device.type}"
    if capability not in FP8_CAPABILITIES:
        return f"fa3-fp8 needs FP8 WGMMA (sm_90); this GPU is {arch_name(capability)}"
    return None


def _require_kernel(device: torch.device) -> types.ModuleType:
    problem = why_not(device)
    if problem:
        raise BackendUnavailableError(problem)
    return kernel_module()


def _check_recipe(config: FP8Config, head_dim: int) -> None:
    """What of FP8Config the kernel does not build: a promotion interval other than 1 at head_dim 128 and 256
    (ValueError; an interval's temporary for the whole of head_dim does not fit in registers beside O and S
    with the default tiles there: 256 keys at 128 spill, measured in the compile)."""
    every = config.promote_interval(head_dim)
    if config.two_level and every != 1 and head_dim in (128, 256):
        raise ValueError(f"FP8Config.promote_every: the fa3-fp8 kernel promotes after every K/V tile at head_dim {head_dim} "
                         f"(promote_every=1 or None); got {every} (the emulation models any interval)")


def _kernel_options(module: types.ModuleType, inputs: FP8Inputs) -> dict:
    """run_fp8's keyword ``config`` for the recipe: none when the kernel's default is the recipe (two_level with
    the default's promotion interval, ``FP8Config.promote_interval``); the default with the recipe's interval;
    else its default tiles with one running accumulator (and the P V GEMM unsplit, in one buffer: slices need
    two_level). The tiles stay the default's: the inputs' K/V blocks are its tile_n."""
    base = module.DEFAULT_CONFIGS[inputs.head_dim]
    every = inputs.config.promote_interval(inputs.head_dim)
    if inputs.config.two_level:
        return {} if every == base.promote_every else {"config": dataclasses.replace(base, promote_every=every)}
    return {"config": dataclasses.replace(base, two_level=False, pv_split=1, pv_buffers=1,  # the lookahead needs two_level
                                         **getattr(module, "NO_LOOKAHEAD", {}))}


def attention_from_fp8(inputs: FP8Inputs, *, causal: bool = False, return_lse: bool = False,
                       out_dtype: torch.dtype = torch.bfloat16):
    """The fa3-fp8 kernel on already-quantised inputs.

    Args:
        inputs: FP8Inputs (shapes and meaning in its docstring, fa_variants/fp8/quantize.py), CUDA tensors.
        causal: bottom-right causal mask (query i sees key j iff j <= i + seqlen_k - seqlen_q).
        return_lse: also return the LSE, of the unsmoothed logits (``inputs.lse_shift`` added when not None).
        out_dtype: torch.float16 or torch.bfloat16.

    Returns:
        out (batch, seqlen_q, num_heads, head_dim) in out_dtype; with return_lse also lse float32
        (batch, num_heads, seqlen_q), natural log. Rows that see no key (and seqlen_k = 0) give 0 and -inf.

    Raises:
        TypeError: inputs not FP8Inputs, causal / return_lse not bools, out_dtype not 16-bit; a field of inputs of
            the wrong type or dtype.
        ValueError: a recipe the kernel does not build (FP8Config.promote_every other than 1 or None with two_level
            at head_dim 128 or 256); inputs that break FP8Inputs' contract (shapes, seqlen_k, v_t's padding,
            devices, softmax_scale, k_mean / lse_shift against config.smooth_k: ``contract.check_fp8_inputs``);
            a head_dim the kernel lacks or block heights other than its tiles (``layout.KERNEL_TILES``).
        BackendUnavailableError: the kernel module is missing, the inputs are not on an sm_90 GPU (checked after
            every argument).
    """
    check_fp8_inputs(inputs)  # built or changed by the caller: the whole contract, before the kernel reads it
    _check_blocks(inputs)
    return _from_fp8(inputs, causal=causal, return_lse=return_lse, out_dtype=out_dtype)


def _check_head_dim(head_dim: int) -> None:
    """A head_dim the fa3-fp8 kernel has no tiles for (``layout.KERNEL_TILES``): ValueError, before the device is
    looked at."""
    if head_dim not in layout.KERNEL_TILES:
        raise ValueError(f"fa3-fp8: head_dim {head_dim} is not supported; supported: {tuple(layout.KERNEL_TILES)}")


def _check_blocks(inputs: FP8Inputs) -> None:
    """The kernel reads one Q descale per ``layout.TILE_M`` rows and one K / V descale per key tile of its default
    config (``layout.KERNEL_TILES``): other block heights (``quantize_fp8(block_n=...)``, for studies) are a
    ValueError here, before the device is looked at, as ``hopper.fa3_fp8.run_fp8`` would raise on the GPU."""
    _check_head_dim(inputs.head_dim)
    tile_n = layout.tile_n(inputs.head_dim)
    if inputs.block_m != layout.TILE_M or inputs.block_n != tile_n:
        raise ValueError(f"fa3-fp8: inputs quantised with blocks of {inputs.block_m} query rows and {inputs.block_n} "
                         f"keys, but the kernel (head_dim {inputs.head_dim}) needs {layout.TILE_M} and {tile_n}: "
                         "quantise for this kernel (fa_variants.fp8.quantize_fp8 with its default block heights)")


def _from_fp8(inputs: FP8Inputs, *, causal: bool, return_lse: bool, out_dtype: torch.dtype):
    """attention_from_fp8 on inputs our quantisers made (their contract holds by construction: not re-checked, so
    the host time of ``attention_fp8`` and of the fa3-fp8 backend is unchanged)."""
    for name, flag in (("causal", causal), ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {one_line(flag)}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.float16 or torch.bfloat16, got {out_dtype}")
    _check_recipe(inputs.config, inputs.head_dim)
    module = _require_kernel(inputs.q.device)
    B, Nq, H, D = inputs.q.shape
    if inputs.q.numel() == 0 or inputs.seqlen_k == 0:
        out = torch.zeros(B, Nq, H, D, dtype=out_dtype, device=inputs.q.device)
        lse = torch.full((B, H, Nq), -math.inf, device=inputs.q.device, dtype=torch.float32)
    else:
        out, lse = module.run_fp8(inputs, causal=causal, out_dtype=out_dtype, **_kernel_options(module, inputs))
    if not return_lse:
        return out
    return out, inputs.unsmoothed_lse(lse)


def attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                  softmax_scale: float | None = None, config: FP8Config = FP8Config(), return_lse: bool = False):
    """FP8 attention on 16-bit inputs: ``quantize_fp8`` with ``config`` then :func:`attention_from_fp8`.

    Args:
        q: (batch, seqlen_q, num_heads, head_dim); k, v: (batch, seqlen_k, num_heads_kv, head_dim); float16
            or bfloat16 on an sm_90 GPU; not modified. causal, return_lse: as ``fa_variants.attention``.
        softmax_scale: finite real or None (1 / sqrt(head_dim)). config: the recipe (FP8Config).

    Returns:
        out in q's dtype (batch, seqlen_q, num_heads, head_dim) [, lse float32 (batch, num_heads, seqlen_q)].

    Limits: with the default recipe O stays finite for finite V while max|V| seqlen_k <= 2^119 (~6.6e35), at every
    head_dim: the unnormalised O, 2^8 |V| l (l the row's softmax sum relative to its max, 1 <= l <= the keys seen; the
    kernel's P is shifted by 2^8; e4m3 may round V up by 1/16), stays below 2^128; from 2^120, rows whose l is near
    seqlen_k come out inf. Within it, at head_dim 64 / 96 / 128 the kernel keeps O in absolute units; at 256
    (``fused_promote``) in units max(v_descale, M 2^-64), M the largest V descale visited
    (``hopper.fa3_fp8.Fp8Config.bounded_units``, the default there since session 11; ``emulation.bounded_unit``). That
    unit's one limit: behind a V block whose descale is > 2^149 above the current unit, rows whose P on that block
    rounds to 0 in e4m3 lose the earlier blocks' O. ``config.two_level`` False (one running accumulator) and a
    promotion interval ``config.promote_every`` > 1 (its temporary, up to that many tiles) keep O / v_descale (the
    current V block's) and overflow (inf / NaN out) in the rows where 2^8 |O| l >= 2^128 v_descale (key
    tiles are walked from the last to the first), i.e. |O| l >= 2^10 before a V block of descale 2^-110 (nonzero, every
    |value| <= 448 x 2^-110 ~ 3.5e-31), or a block whose descale is 2^128 below the previous one. All-zero blocks (e.g.
    zero padding) get descale 1 since session 9 (``quantize.ZERO_BLOCK_DESCALE``).

    Raises:
        TypeError / ValueError: as ``fa_variants.attention`` and ``quantize_fp8`` (naming the argument).
        BackendUnavailableError: the kernel module is missing or the GPU has no FP8 WGMMA (checked after the arguments
            and the recipe, before anything is quantised).
    """
    from fa_variants.api import _check_inputs, _check_options

    _check_inputs(q, k, v)
    if q.dtype not in OUT_DTYPES:
        raise TypeError(f"attention_fp8 takes float16 or bfloat16 q, k, v, got {q.dtype}")
    if not isinstance(config, FP8Config):
        raise TypeError(f"config must be an FP8Config, got {type(config).__name__}")
    _check_head_dim(q.shape[-1])
    _check_recipe(config, q.shape[-1])
    _check_options(causal, softmax_scale, "fa3-fp8", return_lse)  # every argument before the device
    _require_kernel(q.device)
    inputs = quantize_fp8(q, k, v, config=config, softmax_scale=softmax_scale)
    return _from_fp8(inputs, causal=causal, return_lse=return_lse, out_dtype=q.dtype)


def from_e4m3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float) -> FP8Inputs:
    """FP8Inputs for e4m3 q, k, v taken as they are (descale 1, no rotation, no smoothing): V transposed and
    padded for the kernel. Shapes as ``quantize_fp8``; a negative softmax_scale is folded into K.

    Raises:
        TypeError: a non-tensor, a dtype other than torch.float8_e4m3fn, a softmax_scale that is not a real number.
        ValueError: shapes, devices or GQA heads as ``fa_variants.attention`` checks them; a non-finite or
            out-of-range softmax_scale (``common.scale.check_softmax_scale``).
    """
    from fa_variants.api import _LAYOUT, _check_inputs, _check_rank

    _check_rank((q, k, v), ("q", "k", "v"), _LAYOUT)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != E4M3:
            raise TypeError(f"{name} has dtype {t.dtype}; from_e4m3 takes {E4M3} (quantize_fp8 quantises 16-bit inputs)")
    _check_inputs(q, k, v)
    softmax_scale = check_softmax_scale(softmax_scale, none_ok=False)  # no default here
    tile_m, tile_n = tiles_for(q.shape[-1])
    B, Nq, H, _ = q.shape
    Nk, Hkv = k.shape[1], k.shape[2]
    if softmax_scale < 0:
        k, softmax_scale = (-k.float()).to(E4M3), -softmax_scale  # exact: e4m3 is sign-magnitude

    def ones(heads, n, block):  # descales of 1 (float32, whatever the default dtype)
        return torch.ones(B, heads, -(-n // block), device=q.device, dtype=torch.float32)

    return FP8Inputs(q, k, transpose_v(v), ones(H, Nq, tile_m), ones(Hkv, Nk, tile_n), ones(Hkv, Nk, tile_n),
                     float(softmax_scale), Nk, None, None, FP8Config(granularity="tensor", rotate=False, smooth_k=False),
                     block_m=tile_m, block_n=tile_n)

