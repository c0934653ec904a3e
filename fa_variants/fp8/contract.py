"""The FP8Inputs contract checked in full, for inputs a caller built or changed (an FP8 KV cache,
``dataclasses.replace``): what ``emulate_fp8_attention`` and ``attention_from_fp8`` read, before they read it.

``FP8Inputs.__post_init__`` checks only the block heights against the descales' last dim (it runs on every
quantise call, whose host time is measured); the quantisers build inputs that pass ``check_fp8_inputs`` by
construction. Without this check a malformed FP8Inputs gave a wrong answer without an error (a bf16 ``q``
read as if quantised, a (B, 1, T) ``q_descale`` broadcast over the heads, a ``seqlen_k`` below ``k``'s length
cutting keys, an NaN or negative ``softmax_scale``, an ``lse_shift`` of another shape broadcast into the LSE)
or a broadcasting error from deep inside the emulation.
"""
from __future__ import annotations


import torch

from fa_variants.common.checks import INT64_MAX, is_int, one_line
from fa_variants.common.scale import check_softmax_scale
from fa_variants.fp8 import layout
from fa_variants.fp8.quantize import E4M3, MAX_BLOCK_ROWS, FP8Config, FP8Inputs
from fa_variants.fp8.quantize import _field_tensor as _tensor

__all__ = ["check_fp8_inputs", "check_accumulator_bits", "check_tile_m"]


def _optional_int(name: str, value, low: int, what: str, high: int | None = None) -> None:
    """None, or an int >= low (and <= high); ``what``: the unit and what None means, for the ValueError."""
    if value is not None and not is_int(value):
        raise TypeError(f"{name} must be an int or None, got {one_line(value)}")
    if value is not None and value < low:
        raise ValueError(f"{name} must be >= {low} {what}, got {value}")
    if value is not None and high is not None and value > high:
        limit = "2^63 - 1" if high == INT64_MAX else high
        raise ValueError(f"{name} must be <= {limit} {what}, got {value}")


def check_fp8_inputs(inputs: FP8Inputs) -> None:
    """Raises TypeError / ValueError (one line naming the field) unless ``inputs`` keeps FP8Inputs' contract
    (its docstring, fa_variants/fp8/quantize.py): q, k, v_t e4m3, 4-D, of matching batch / heads / head_dim
    (num_heads a multiple of num_heads_kv >= 1); seqlen_k an int equal to k's length; v_t (batch,
    num_heads_kv, head_dim, n) with n >= seqlen_k a multiple of ``layout.K_ALIGN_TOKENS``; descales float32 of
    shape (batch, num_heads, cdiv(seqlen_q, block_m)) and (batch, num_heads_kv, cdiv(seqlen_k, block_n));
    softmax_scale a finite real >= 0 (``common.scale.check_softmax_scale``); k_mean float32 (batch,
    num_heads_kv, head_dim) and lse_shift float32 (batch, num_heads, seqlen_q), both given iff config.smooth_k;
    config an FP8Config; every tensor on q's device. Shapes and dtypes only: no value is read (no device sync)."""
    if not isinstance(inputs, FP8Inputs):
        raise TypeError(f"inputs must be FP8Inputs (fa_variants.fp8.quantize_fp8), got {type(inputs).__name__}")
    if not isinstance(inputs.config, FP8Config):
        raise TypeError(f"FP8Inputs.config must be an FP8Config, got {type(inputs.config).__name__}")
    B, Nq, H, D, Nk, Hkv = _check_operands(inputs)
    for name, want in (("q_descale", (B, H, Nq, "block_m")), ("k_descale", (B, Hkv, Nk, "block_n")),
                       ("v_descale", (B, Hkv, Nk, "block_n"))):
        _check_descale(inputs, name, *want)
    _check_scale(inputs.softmax_scale)
    _check_smoothing(inputs, k_mean=(B, Hkv, D), lse_shift=(B, H, Nq))
    device = inputs.q.device
    for name in ("k", "v_t", "q_descale", "k_descale", "v_descale", "k_mean", "lse_shift"):
        t = getattr(inputs, name)
        if t is not None and t.device != device:
            raise ValueError(f"FP8Inputs.{name} is on {t.device} but q is on {device}; they must be on one device")


def _check_operands(inputs: FP8Inputs) -> tuple[int, ...]:
    """q, k, v_t (e4m3, 4-D, matching shapes) and seqlen_k; returns (batch, seqlen_q, num_heads, head_dim,
    seqlen_k, num_heads_kv)."""
    for name in ("q", "k", "v_t"):
        t = _tensor(name, getattr(inputs, name))
        if t.dtype != E4M3:
            raise TypeError(f"FP8Inputs.{name} has dtype {t.dtype}; it must be {E4M3} (quantize_fp8 makes it)")
        if t.dim() != 4:
            raise ValueError(f"FP8Inputs.{name} must be 4-D, got shape {tuple(t.shape)}")
    (B, Nq, H, D), (Bk, Nk, Hkv, Dk) = inputs.q.shape, inputs.k.shape
    if Bk != B or Dk != D:
        raise ValueError(f"FP8Inputs.k has shape {tuple(inputs.k.shape)} but q has {tuple(inputs.q.shape)}: "
                         "batch and head_dim must match")
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"FP8Inputs: num_heads {H} (q) must be a multiple of num_heads_kv {Hkv} (k), "
                         "which must be >= 1")
    seqlen_k = inputs.seqlen_k
    if not is_int(seqlen_k):
        raise TypeError(f"FP8Inputs.seqlen_k must be an int, got {one_line(seqlen_k)}")
    if seqlen_k != Nk:
        raise ValueError(f"FP8Inputs.seqlen_k is {seqlen_k} but k holds {Nk} keys; they must be equal")
    n_pad = inputs.v_t.shape[3]
    if inputs.v_t.shape[:3] != (B, Hkv, D) or n_pad < Nk or n_pad % layout.K_ALIGN_TOKENS:
        raise ValueError(f"FP8Inputs.v_t must be (batch, num_heads_kv, head_dim, seqlen_k padded to a multiple of "
                         f"{layout.K_ALIGN_TOKENS}) = ({B}, {Hkv}, {D}, {layout.padded_seqlen_k(Nk)}), "
                         f"got {tuple(inputs.v_t.shape)}")
    return B, Nq, H, D, Nk, Hkv


def _check_descale(inputs: FP8Inputs, name: str, batch: int, heads: int, rows: int, block: str) -> None:
    """Descale ``name``: float32 (batch, heads, cdiv(rows, inputs.<block>))."""
    t = _tensor(name, getattr(inputs, name))
    want = (batch, heads, -(-rows // getattr(inputs, block)))
    if t.dtype != torch.float32:
        raise TypeError(f"FP8Inputs.{name} has dtype {t.dtype}; descales are float32")
    if tuple(t.shape) != want:
        raise ValueError(f"FP8Inputs.{name} must have shape {want} (batch, heads, blocks of {block}="
                         f"{getattr(inputs, block)}), got {tuple(t.shape)}")


def _check_scale(softmax_scale) -> None:
    """FP8Inputs.softmax_scale: a finite real >= 0 (quantize_fp8 folds a negative one into K)."""
    scale = check_softmax_scale(softmax_scale, "FP8Inputs.softmax_scale", none_ok=False)
    if scale < 0:
        raise ValueError(f"FP8Inputs.softmax_scale must be >= 0 (quantize_fp8 folds a negative scale into k), "
                         f"got {scale}")


def _check_smoothing(inputs: FP8Inputs, **shapes: tuple[int, ...]) -> None:
    """k_mean and lse_shift (``shapes``: their float32 shapes): both given iff config.smooth_k."""
    smooth = inputs.config.smooth_k
    for name, want in shapes.items():
        t = getattr(inputs, name)
        if t is None:
            if smooth:
                raise ValueError(f"FP8Inputs.{name} is None but config.smooth_k is True (K was smoothed: the "
                                 f"{name} is needed); quantise with this config, or pass smooth_k=False")
            continue
        _tensor(name, t)
        if not smooth:
            raise ValueError(f"FP8Inputs.{name} is given but config.smooth_k is False; pass None, or the config "
                             "the inputs were quantised with")
        if t.dtype != torch.float32 or tuple(t.shape) != want:
            raise ValueError(f"FP8Inputs.{name} must be float32 of shape {want}, got {t.dtype} {tuple(t.shape)}")


def check_accumulator_bits(bits) -> None:
    """``emulate_fp8_attention``'s accumulator_bits: None (float32) or an int >= 0 (mantissa bits kept)."""
    _optional_int("accumulator_bits", bits, 0, "(mantissa bits kept) or None (float32)")


def check_tile_m(tile_m) -> None:
    """``emulate_fp8_attention``'s tile_m: None (the kernel's) or an int in [1, 2^63 - 1] (query rows per CTA tile;
    ``quantize.MAX_BLOCK_ROWS``: a taller one was an OverflowError from inside torch)."""
    _optional_int("tile_m", tile_m, 1, "(query rows per CTA tile) or None (the kernel's)", MAX_BLOCK_ROWS)
