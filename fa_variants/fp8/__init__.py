"""FP8 (e4m3) attention: the quantisation recipe, the fa3-fp8 entry points, and the kernel's emulation.

    from fa_variants import fp8
    inputs = fp8.quantize_fp8(q, k, v, config=fp8.FP8Config())          # FP8Inputs (e4m3 + descales)
    out = fp8.attention_from_fp8(inputs, causal=True, out_dtype=q.dtype)  # the fa3-fp8 kernel (sm_90)
    out = fp8.attention_fp8(q, k, v, causal=True)                         # both steps
    out, lse = fp8.emulate_fp8_attention(inputs, causal=True)            # the kernel's arithmetic, any device

Modules: ``quantize`` (recipe, FP8Config, FP8Inputs, the torch quantiser), ``quant_kernel`` (the CuTe DSL
quantisation pass; its pieces in ``quant_config``, ``quant_staging``, ``quant_rotation``, ``quant_kmean``,
``quant_store``, ``quant_maps``; ``quant_host`` launches it, ``quant_call`` caches whole calls), ``emulation``
(the kernel mirrored in torch), ``attention`` (entry points), ``contract`` (FP8Inputs checked in full where
caller-built inputs enter), ``fa3_fp8`` (the dispatcher's backend), ``layout``
(what the kernel needs of the data), ``study`` (`fa-variants fp8-study`).
"""
from fa_variants.fp8.attention import attention_fp8, attention_from_fp8
from fa_variants.fp8.emulation import emulate_fp8_attention, fp8_attention_reference, fp8_error_bound
from fa_variants.fp8.quantize import FP8Config, FP8Inputs, quantize_fp8

__all__ = ["FP8Config", "FP8Inputs", "quantize_fp8", "attention_fp8", "attention_from_fp8",
           "emulate_fp8_attention", "fp8_attention_reference", "fp8_error_bound"]
