"""Torch <-> CuTe DSL interop: dtype names, device arch, fake tensors for compiling, alignment, outputs.

Kernels are compiled once per static configuration against *fake* tensors whose batch, sequence
length and head count are symbolic (``cute.sym_int()``) and whose non-unit strides are symbolic
64-bit integers divisible by ``align // element_size`` (``cute.sym_int64(divisibility=...)``); the
last dimension has static stride 1 and the head dimension is static.  The compiled object, built with
``--enable-tvm-ffi``, is then called directly with torch tensors: TVM-FFI checks dtype, rank, the
static extents and the stride divisibility on every call, and takes the CUDA stream from the caller's
environment (``torch.cuda.current_stream()``), because the stream argument is compiled from
``make_fake_stream(use_tvm_ffi_env_stream=True)`` (see cutlass/runtime.py ``make_fake_stream`` and
flash-attention ``flash_attn/cute/interface.py``, which does the same).

The same symbol object is reused wherever two tensors must agree (batch of q/k/v/out/lse, seqlen_q of
q/out/lse, seqlen_k of k/v, num_heads of q/out/lse, num_heads_kv of k/v), so TVM-FFI also rejects
inconsistent shapes before launch.
"""
from __future__ import annotations

import torch

# our dtype names (CLI / compile keys) <-> torch dtypes
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "e4m3",
}
TORCH_DTYPES: dict[str, torch.dtype] = {v: k for k, v in DTYPE_NAMES.items()}

# The alignment, in bytes, every compiled kernel assumes for base pointers and non-unit strides
# (16 bytes: one cp.async / ld.global.v4 vector, also the TMA stride rule).
DEFAULT_ALIGN = 16


def dtype_name(dtype: torch.dtype) -> str:
    """'fp16' | 'bf16' | 'e4m3' for a torch dtype; ValueError for others."""
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} is not supported; supported: {sorted(TORCH_DTYPES)}") from None


def cute_dtype(name: str):
    """The CuTe DSL numeric type for one of our dtype names."""
    import cutlass

    table = {"fp16": cutlass.Float16, "bf16": cutlass.BFloat16, "e4m3": cutlass.Float8E4M3FN,
             "fp32": cutlass.Float32, "int32": cutlass.Int32}
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"dtype {name!r} is not supported; supported: {sorted(table)}") from None


def arch_of_capability(major: int, minor: int) -> str:
    """CUDA compute capability -> CuTe DSL arch string ('sm_80', 'sm_86', 'sm_90a', ...)."""
    return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"


def capability_of_arch(arch: str) -> tuple[int, int]:
    """The compute capability of a compile target ``arch_of_capability`` wrote (the caller has checked it is one):
    'sm_90a' -> (9, 0), 'sm_121a' -> (12, 1), 'sm_86' -> (8, 6)."""
    digits = arch.removeprefix("sm_").rstrip("af")
    return int(digits[:-1]), int(digits[-1])


def device_arch(device: torch.device | int | None = None) -> str:
    """The arch string of a CUDA device (what a runtime compile targets)."""
    return arch_of_capability(*torch.cuda.get_device_capability(device))


def strides_aligned(t: torch.Tensor, align: int = DEFAULT_ALIGN) -> bool:
    """`is_aligned`'s stride rule alone (not the pointer): t has unit last stride and every other stride a multiple
    of align bytes (stride 0, a broadcast, counts as aligned); False for a 0-d tensor."""
    if t.dim() == 0 or t.stride(-1) != 1:
        return False
    elems = max(1, align // t.element_size())
    return all(s % elems == 0 for s in t.stride()[:-1])


def is_aligned(t: torch.Tensor, align: int = DEFAULT_ALIGN) -> bool:
    """True when t has unit last stride, an `align`-byte aligned pointer and every other stride a
    multiple of align bytes (stride 0, a broadcast, counts as aligned)."""
    return strides_aligned(t, align) and t.data_ptr() % align == 0


def unit_dims_restrided(t: torch.Tensor) -> torch.Tensor:
    """t, or a view of the same memory whose length-1 dimensions (other than the last) carry the stride a contiguous
    tensor would give them. Such a stride is never multiplied by a non-zero index, so torch leaves it free (a
    tensor of shape (2, 1, 8, 128) and strides (1024, 1, 128, 1) is contiguous), but the kernels' stride rule and
    TMA descriptors read every stride."""
    if all(n != 1 for n in t.shape[:-1]):
        return t
    strides, inner = list(t.stride()), 1
    for i in reversed(range(t.dim())):
        if t.shape[i] == 1 and i < t.dim() - 1:
            strides[i] = inner
        inner = max(inner, strides[i] * t.shape[i])
    return t if tuple(strides) == t.stride() else t.as_strided(t.shape, strides, t.storage_offset())


def aligned(t: torch.Tensor, align: int = DEFAULT_ALIGN) -> torch.Tensor:
    """t itself when `is_aligned`; else the same memory with its length-1 dimensions' strides made contiguous
    (``unit_dims_restrided``) when that is aligned; else a contiguous copy (which is aligned when the last dim is).
    A tensor with torch's negative bit (``torch._neg_view``, ``x.conj().imag``: memory holding -t) is resolved first
    (a copy): a kernel reads the memory."""
    if t.is_neg():
        t = t.resolve_neg()
    if is_aligned(t, align):
        return t
    view = unit_dims_restrided(t)
    if view is not t and is_aligned(view, align):
        return view
    c = t.contiguous() if t.stride(-1) == 1 and t.data_ptr() % align == 0 else t.clone(
        memory_format=torch.contiguous_format)
    if not is_aligned(c, align):
        raise ValueError(
            f"tensor of shape {tuple(t.shape)} cannot be {align}-byte aligned: its last dimension "
            f"({t.shape[-1]} x {t.element_size()} bytes) must be a multiple of {align} bytes")
    return c


# ----------------------------------------------------------------------------------------------
# Fake tensors (compile time, no GPU)
# ----------------------------------------------------------------------------------------------
def fake_tensor(dtype_name_: str, shape: tuple, align: int = DEFAULT_ALIGN):
    """A fake global-memory tensor: `shape` entries are ints (static) or SymInts (dynamic); the last
    mode has stride 1, every other stride is a fresh 64-bit symbol divisible by align/elem_bytes."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    dt = cute_dtype(dtype_name_)
    div = max(1, align * 8 // dt.width)
    stride = tuple(cute.sym_int64(divisibility=div) for _ in shape[:-1]) + (1,)
    return make_fake_tensor(dt, shape, stride=stride, assumed_align=align)


def fake_attention_args(dtype_name_: str, head_dim: int, align: int = DEFAULT_ALIGN,
                        out_dtype: str | None = None):
    """Fake arguments for the standard forward signature every attention kernel compiles against:

        (q, k, v, out, lse, softmax_scale, stream)
        q, out (B, Nq, H, D); k, v (B, Nk, Hkv, D); lse float32 (B, H, Nq); softmax_scale Float32;
        stream: the TVM-FFI environment stream (not passed at call time).

    At run time call the compiled object as ``fn(q, k, v, out, lse, softmax_scale)`` with torch tensors.
    """
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream

    b, nq, nk, h, hkv = (cute.sym_int() for _ in range(5))
    q = fake_tensor(dtype_name_, (b, nq, h, head_dim), align)
    k = fake_tensor(dtype_name_, (b, nk, hkv, head_dim), align)
    v = fake_tensor(dtype_name_, (b, nk, hkv, head_dim), align)
    o = fake_tensor(out_dtype or dtype_name_, (b, nq, h, head_dim), align)
    lse = fake_tensor("fp32", (b, h, nq), 4)
    return q, k, v, o, lse, cutlass.Float32(1.0), make_fake_stream(use_tvm_ffi_env_stream=True)
