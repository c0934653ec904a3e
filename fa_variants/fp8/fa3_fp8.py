"""The registry's face of the ``fa3-fp8`` backend: its ``VARIANT`` record (``common.launch.Variant``).

``fa_variants.attention(q, k, v, backend="fa3-fp8")``: 16-bit inputs are quantised with the default recipe
(``FP8Config()``: block scales + Hadamard + smoothed K, two-level accumulation) and run on the kernel
(``fa_variants.fp8.attention.attention_fp8``); e4m3 inputs are taken as they are, with descale 1
(``attention.from_e4m3``), and give bfloat16. ``auto`` never picks this backend for 16-bit inputs
(``AUTO_DTYPES``): FP8 changes the numerics, so it must be asked for.

Importing this module raises ModuleNotFoundError (named after this module, which the dispatcher reports as
"fa3-fp8 is not built yet") while the kernel module (``attention.KERNEL_MODULE``) does not exist.
"""
from __future__ import annotations

import dataclasses

import torch

from fa_variants.common.launch import Variant
from fa_variants.dispatch import BackendUnavailableError
from fa_variants.fp8 import attention as _attention

try:
    _kernel = _attention.kernel_module()
except BackendUnavailableError as _exc:
    raise ModuleNotFoundError(str(_exc), name=__name__) from None

HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 256)  # layout.tile_n serves these
DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)
#: the dtypes ``auto`` may choose this backend for (16-bit inputs only on request)
AUTO_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn,)


def request_note(dtype: torch.dtype) -> str | None:
    """What selecting this backend does to inputs of ``dtype`` (the dispatcher adds it to the reason)."""
    if dtype in (torch.float16, torch.bfloat16):
        return (f"{str(dtype).removeprefix('torch.')} inputs are quantised to e4m3 (block scales + Hadamard + "
                "smoothed K, two-level accumulation: fa_variants.fp8.FP8Config())")
    return "e4m3 inputs are used as they are (descale 1); the output is bfloat16"


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float):
    """(out, lse) of FP8 attention; arguments already validated by ``fa_variants.attention``."""
    if q.dtype == torch.float8_e4m3fn:
        inputs = _attention.from_e4m3(q, k, v, softmax_scale=softmax_scale)
        return _attention._from_fp8(inputs, causal=causal, return_lse=True, out_dtype=torch.bfloat16)
    return _attention.attention_fp8(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True)


# The record: the kernel's own (how to compile it: `fa-variants compile --variant fa3-fp8`), with this call.
_face = dict(name="fa3-fp8", dtypes=DTYPES, head_dims=HEAD_DIMS, auto_dtypes=AUTO_DTYPES, request_note=request_note,
             runner=run)
VARIANT = (dataclasses.replace(_kernel.VARIANT, **_face) if isinstance(getattr(_kernel, "VARIANT", None), Variant)
           else Variant(archs=("sm_90a",), **_face))
