"""The compile cache: one `cute.compile` per static configuration, per process, and across processes
through the disk (`common.diskcache`: a new process loads what an earlier one compiled).

A kernel is specialised on a `StaticConfig` (variant, arch, dtype, head_dim, causal, its frozen config,
alignment) and compiled against fake tensors whose batch, sequence lengths, head counts and strides are
symbolic (`interop.fake_attention_args`), with ``--enable-tvm-ffi``: the compiled object is then called
with torch tensors, and takes the caller's CUDA stream from the environment. Batch, sequence lengths,
heads and strides are runtime values and never recompile.

Sources: CuTe DSL fake-tensor / TVM-FFI tutorial (NVIDIA/cutlass examples/python/CuTeDSL/dsl_tutorials/
tvm_ffi/); Dao-AILab/flash-attention flash_attn/cute/interface.py (a compile cache keyed on the static
configuration, the environment stream).
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
import time
from typing import Any, Callable

from fa_variants.common import diskcache


@dataclasses.dataclass(frozen=True)
class StaticConfig:
    """Everything a compiled kernel is specialised on (the compile-cache key)."""

    variant: str
    arch: str          # "sm_80", "sm_90a", ...
    dtype: str         # "fp16" | "bf16" | "e4m3"
    head_dim: int
    causal: bool
    config: Any        # the variant's frozen config (common.config.Sm80Config / Sm90Config)
    align: int = 16    # bytes: base pointers and non-unit strides


@dataclasses.dataclass
class Compiled:
    """One compiled kernel: `fn(*runtime_args)` plus what the compile reported."""

    config: StaticConfig
    fn: Any
    compile_s: float
    cubin: bytes | None
    smem_dynamic_bytes: int


_CACHE: dict[StaticConfig, Compiled] = {}
_LOCK = threading.RLock()
compile_count = 0  # number of real cute.compile calls in this process (tests read it)


def get_compiled(cfg: StaticConfig, build: Callable[[StaticConfig], tuple]) -> Compiled:
    """The compiled kernel for cfg, compiling it on first use (thread-safe, per process).

    `build(cfg)` returns ``(jit_callable, fake_args)``; if the built object (or the instance of a bound
    ``__call__``) has an int ``smem_bytes`` after tracing, it is reported as the dynamic shared memory."""
    with _LOCK:
        hit = _CACHE.get(cfg)
        if hit is None:
            hit = _CACHE[cfg] = _compile(cfg, build)
        return hit


def cache_info() -> dict:
    """{'entries': n, 'compiles': n, 'disk_loads': n, 'store_failures': n} for tests and diagnostics (this
    process)."""
    return {"entries": len(_CACHE), "compiles": compile_count, "disk_loads": diskcache.loads,
            "store_failures": diskcache.store_failures}


def compile_options(arch: str, dump_dir: str, keep: str = "--keep-cubin") -> str:
    """The ``cute.compile`` options of every kernel here: TVM-FFI calls, the target, the artifacts ``keep`` asks
    for (e.g. "--keep-cubin --keep-ptx") written under ``dump_dir``."""
    return f"--enable-tvm-ffi --gpu-arch {arch} {keep} --dump-dir {dump_dir}"


def _compile(cfg: StaticConfig, build: Callable[[StaticConfig], tuple]) -> Compiled:
    """The kernel from the disk cache (`common.diskcache`) if it holds a usable entry, else compiled (and
    stored there)."""
    global compile_count
    os.environ.setdefault("CUTE_DSL_ARCH", cfg.arch)  # only matters before the DSL first loads
    if diskcache.enabled():
        stored = diskcache.load(cfg)
        if stored is not None:
            fn, cubin, smem, compile_s = stored
            return Compiled(cfg, fn, compile_s, cubin, smem)
    import cutlass.cute as cute

    fn, args = build(cfg)
    with tempfile.TemporaryDirectory(prefix="fa_variants_cubin_") as dump:
        options = compile_options(cfg.arch, dump)
        t0 = time.perf_counter()
        compiled = cute.compile(fn, *args, options=options)
        compile_s = time.perf_counter() - t0
    compile_count += 1
    cubin = getattr(getattr(compiled, "artifacts", None), "CUBIN", None)
    smem = getattr(getattr(fn, "__self__", fn), "smem_bytes", 0)
    smem = int(smem) if isinstance(smem, int) else 0
    if diskcache.enabled():
        diskcache.store(cfg, compiled, cubin, smem, compile_s)
    return Compiled(cfg, compiled, compile_s, cubin, smem)
