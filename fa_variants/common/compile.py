"""Variant registry, compile cache and the compile-only path (`fa-variants compile`).

API for kernel modules (FA1, FA2, FA3, FP8, the internal test kernel)
----------------------------------------------------------------------
A kernel module registers itself at import time::

    from fa_variants.common import compile as cc
    from fa_variants.common import interop

    def _tiles(arch: str, head_dim: int, dtype: str, causal: bool) -> tuple:
        return (("Br", 128), ("Bc", 64), ("stages", 2), ("warps", 4))   # anything hashable

    def _build(cfg: cc.StaticConfig):
        kernel = MyKernel(cfg)                      # __call__ is the @cute.jit host function
        return kernel, interop.fake_attention_args(cfg.dtype, cfg.head_dim, cfg.align)

    cc.register_variant("fa3", build=_build, tiles=_tiles, archs=("sm_90a",),
                        dtypes=("fp16", "bf16"), head_dims=(64, 128, 256),
                        module=__name__, description="FA3: TMA + WGMMA, warp-specialised")

and runs through the cache::

    cfg = cc.config_for("fa3", interop.device_arch(q.device), interop.dtype_name(q.dtype),
                        q.shape[-1], causal)
    fn = cc.get_compiled(cfg).fn            # compiled once per StaticConfig, per process
    fn(q, k, v, out, lse, softmax_scale)    # torch tensors; stream = torch.cuda.current_stream()

* `build(cfg)` returns ``(jit_callable, fake_args)``; the callable is compiled with
  ``cute.compile(jit_callable, *fake_args, options="--enable-tvm-ffi --gpu-arch <cfg.arch> ...")``.
  `interop.fake_attention_args` gives the standard ``(q, k, v, out, lse, softmax_scale, stream)``
  signature with dynamic batch / seqlen / heads / strides; a variant with other arguments (FP8
  descales) builds its own with `interop.fake_tensor`.
* If the built object (or the instance of a bound ``__call__``) has an int attribute ``smem_bytes``
  after tracing, it is reported as the dynamic shared memory the kernel launches with.
* The cache key is `StaticConfig` (variant, arch, dtype, head_dim, causal, tiles, align): batch,
  sequence lengths, head counts and strides are runtime values and never recompile.
* `compile_only(...)` (the CLI) goes through the same `get_compiled` and then reads the cubin:
  registers, static shared memory and local-memory (spill) bytes from its ELF, and with ``sass=True``
  counts of key instructions from ``nvdisasm`` of the same cubin.

Known variants are imported lazily from `VARIANT_MODULES` (name -> module); a module that does not
exist yet is skipped. Unknown names raise `UnknownVariantError` listing the known ones.

Sources: CuTe DSL fake-tensor / TVM-FFI tutorial (cutlass examples/python/CuTeDSL/dsl_tutorials/tvm_ffi/),
flash-attention ``flash_attn/cute/interface.py`` (compile cache keyed on static configuration, env
stream). The ELF facts (``.nv.info`` EIATTR_REGCOUNT 0x2f, EIATTR_FRAME_SIZE 0x11, ``.nv.shared.<k>``
section size) are those ``cuobjdump -res-usage`` reports.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a")
DTYPES = ("fp16", "bf16", "e4m3")
SASS_OPCODES = ("HMMA", "HGMMA", "QGMMA", "LDGSTS", "LDSM", "UTMALDG", "UTMASTG", "USETMAXREG",
                "MUFU.EX2", "LDL", "STL")

# variant name -> module that registers it on import (lazy; missing modules are skipped)
VARIANT_MODULES: dict[str, str] = {
    "testkernel": "fa_variants.common.testkernel",
    "fa2": "fa_variants.ampere.fa2",
    "fa1": "fa_variants.ampere.fa1",
    "fa3": "fa_variants.hopper.fa3",
    "fa3-fp8": "fa_variants.hopper.fa3_fp8",
}


class UnknownVariantError(ValueError):
    """A variant name nobody registered."""


class UnsupportedConfigError(ValueError):
    """A registered variant asked for an arch / dtype / head_dim it does not serve."""


@dataclasses.dataclass(frozen=True)
class StaticConfig:
    """Everything a compiled kernel is specialised on (the compile-cache key)."""

    variant: str
    arch: str          # "sm_80", "sm_90a", ...
    dtype: str         # "fp16" | "bf16" | "e4m3"
    head_dim: int
    causal: bool
    tiles: tuple       # variant-chosen, hashable (e.g. (("Br", 128), ("Bc", 64), ...))
    align: int = 16    # bytes: base pointers and non-unit strides

    def tile(self, name: str, default: Any = None) -> Any:
        """Look up one named entry of `tiles` (when tiles is a tuple of (name, value) pairs)."""
        return dict(self.tiles).get(name, default)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    build: Callable[[StaticConfig], tuple]
    tiles: Callable[[str, int, str, bool], tuple]
    archs: tuple[str, ...]
    dtypes: tuple[str, ...]
    head_dims: tuple[int, ...]
    module: str = ""
    description: str = ""


@dataclasses.dataclass
class Compiled:
    """One compiled kernel: `fn(*runtime_args)` plus what the compile reported."""

    config: StaticConfig
    fn: Any
    compile_s: float
    cubin: bytes | None
    smem_dynamic_bytes: int


_REGISTRY: dict[str, Variant] = {}
_CACHE: dict[StaticConfig, Compiled] = {}
_LOCK = threading.RLock()
compile_count = 0  # number of real cute.compile calls in this process (tests read it)


def register_variant(name: str, *, build: Callable[[StaticConfig], tuple],
                     tiles: Callable[[str, int, str, bool], tuple], archs: tuple[str, ...],
                     dtypes: tuple[str, ...], head_dims: tuple[int, ...], module: str = "",
                     description: str = "") -> Variant:
    """Register (or re-register) a kernel variant; returns it. See the module docstring."""
    v = Variant(name, build, tiles, tuple(archs), tuple(dtypes), tuple(head_dims), module, description)
    with _LOCK:
        _REGISTRY[name] = v
    return v


def known_variants() -> dict[str, Variant]:
    """All variants that exist in this checkout (imports every module of VARIANT_MODULES)."""
    for name in VARIANT_MODULES:
        _try_import(name)
    return dict(_REGISTRY)


def _try_import(name: str) -> None:
    module = VARIANT_MODULES.get(name)
    if name in _REGISTRY or module is None:
        return
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module and not module.startswith(str(exc.name)):
            raise  # the module exists but one of its imports is missing: say so


def get_variant(name: str) -> Variant:
    """The registered variant `name`; UnknownVariantError listing the known ones otherwise."""
    _try_import(name)
    if name not in _REGISTRY:
        known = ", ".join(sorted(known_variants())) or "none"
        raise UnknownVariantError(f"unknown variant {name!r}; known variants: {known}")
    return _REGISTRY[name]


def config_for(variant: str, arch: str, dtype: str, head_dim: int, causal: bool,
               align: int = 16) -> StaticConfig:
    """The StaticConfig (cache key) of a call: checks the variant serves arch/dtype/head_dim and asks
    it for its tile configuration."""
    v = get_variant(variant)
    problems = []
    if arch not in v.archs:
        problems.append(f"arch {arch} (serves {', '.join(v.archs)})")
    if dtype not in v.dtypes:
        problems.append(f"dtype {dtype} (serves {', '.join(v.dtypes)})")
    if head_dim not in v.head_dims:
        problems.append(f"head_dim {head_dim} (serves {', '.join(map(str, v.head_dims))})")
    if problems:
        raise UnsupportedConfigError(f"variant {variant!r} does not serve " + "; ".join(problems))
    return StaticConfig(variant, arch, dtype, int(head_dim), bool(causal),
                        tuple(v.tiles(arch, int(head_dim), dtype, bool(causal))), int(align))


def get_compiled(cfg: StaticConfig) -> Compiled:
    """The compiled kernel for cfg, compiling it on first use (thread-safe, per process)."""
    with _LOCK:
        hit = _CACHE.get(cfg)
        if hit is not None:
            return hit
        hit = _compile(cfg)
        _CACHE[cfg] = hit
        return hit


def cache_info() -> dict:
    """{'entries': n, 'compiles': n} for tests and diagnostics."""
    return {"entries": len(_CACHE), "compiles": compile_count}


def _compile(cfg: StaticConfig) -> Compiled:
    global compile_count
    os.environ.setdefault("CUTE_DSL_ARCH", cfg.arch)  # only matters before the DSL first loads
    import cutlass.cute as cute

    fn, args = get_variant(cfg.variant).build(cfg)
    with tempfile.TemporaryDirectory(prefix="fa_variants_cubin_") as dump:
        options = f"--enable-tvm-ffi --gpu-arch {cfg.arch} --keep-cubin --dump-dir {dump}"
        t0 = time.perf_counter()
        compiled = cute.compile(fn, *args, options=options)
        compile_s = time.perf_counter() - t0
    compile_count += 1
    artifacts = getattr(compiled, "artifacts", None)
    cubin = getattr(artifacts, "CUBIN", None)
    owner = getattr(fn, "__self__", fn)
    smem = getattr(owner, "smem_bytes", 0)
    return Compiled(cfg, compiled, compile_s, cubin, int(smem) if isinstance(smem, int) else 0)


# ----------------------------------------------------------------------------------------------
# cubin inspection
# ----------------------------------------------------------------------------------------------
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_REGCOUNT = 0x2F


def _elf_sections(blob: bytes) -> dict[str, tuple[int, int, int, int]]:
    """name -> (offset, size, sh_info, sh_flags) of an ELF64 little-endian file."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2:
        raise ValueError("not an ELF64 cubin")
    e_shoff, = struct.unpack_from("<Q", blob, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    headers = []
    for i in range(e_shnum):
        name, _typ, flags, _addr, off, size, _link, info = struct.unpack_from(
            "<IIQQQQII", blob, e_shoff + i * e_shentsize)
        headers.append((name, off, size, info, flags))
    str_off = headers[e_shstrndx][1]
    out = {}
    for name, off, size, info, flags in headers:
        end = blob.index(b"\0", str_off + name)
        out[blob[str_off + name:end].decode()] = (off, size, info, flags)
    return out


def _nv_info(blob: bytes, off: int, size: int) -> dict[int, int]:
    """EIATTR attribute -> value for the (sym, value) records of one .nv.info.<kernel> section."""
    attrs, pos, end = {}, off, off + size
    while pos + 4 <= end:
        fmt, attr, val = struct.unpack_from("<BBH", blob, pos)
        pos += 4
        if fmt == 0x04:  # EIFMT_SVAL: `val` bytes of payload
            if val == 8:
                _sym, value = struct.unpack_from("<II", blob, pos)
                attrs[attr] = max(attrs.get(attr, 0), value)
            pos += val
    return attrs


def cubin_resources(cubin: bytes) -> dict:
    """Per-kernel maxima from a cubin: registers/thread, static shared memory bytes, local-memory
    (stack frame, where spills go) bytes/thread, number of kernels."""
    secs = _elf_sections(cubin)
    regs = smem = frame = kernels = 0
    for name, (off, size, info, _flags) in secs.items():
        if name.startswith(".text."):
            kernels += 1
            regs = max(regs, info >> 24)
        elif name.startswith(".nv.shared.") and not name.startswith(".nv.shared.reserved"):
            smem = max(smem, size)
        elif name == ".nv.info" or name.startswith(".nv.info."):
            a = _nv_info(cubin, off, size)
            regs = max(regs, a.get(_EIATTR_REGCOUNT, 0))
            frame = max(frame, a.get(_EIATTR_FRAME_SIZE, 0))
    return {"kernels": kernels, "registers": regs, "smem_static_bytes": smem, "spill_bytes": frame}


def _nvdisasm() -> str:
    try:
        from cutlass.base_dsl.env_manager import _find_nvdisasm_binary

        return _find_nvdisasm_binary()
    except Exception as exc:  # noqa: BLE001 - report what is missing
        raise ImportError("--sass needs nvdisasm, from the [sass] extra: pip install 'fa-variants[sass]'"
                          f" ({type(exc).__name__}: {exc})") from exc


def sass_of(cubin: bytes) -> str:
    """SASS text of a cubin (nvdisasm, the binary the DSL itself uses for CUTE_DSL_KEEP=sass)."""
    with tempfile.TemporaryDirectory(prefix="fa_variants_sass_") as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        res = subprocess.run([_nvdisasm(), "-c", path], capture_output=True, text=True, check=True)
    return res.stdout


def count_sass(sass: str, opcodes: tuple[str, ...] = SASS_OPCODES) -> dict[str, int]:
    """Instruction counts by opcode prefix: 'HMMA' counts HMMA.16816.F32.BF16 etc.; predicated
    instructions (@P0 ...) count too."""
    counts = dict.fromkeys(opcodes, 0)
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if not m:
            continue
        op = m.group(1)
        for want in opcodes:
            if op == want or op.startswith(want + "."):
                counts[want] += 1
    return counts


# ----------------------------------------------------------------------------------------------
# compile-only entry and CLI
# ----------------------------------------------------------------------------------------------
def compile_only(variant: str, arch: str, head_dim: int, dtype: str, causal: bool = False,
                 sass: bool = False) -> dict:
    """Compile one configuration with fake tensors (no GPU needed) and report its resources.

    Returns a dict: variant, arch, dtype, head_dim, causal, tiles, compile_s (seconds of the cute.compile
    call that built it, also when served from the cache), registers
    (per thread), smem_static_bytes, smem_dynamic_bytes (as launched), smem_bytes (their sum),
    spill_bytes (local memory per thread: stack frame, 0 = no spills), and with sass=True the counts
    of SASS_OPCODES. Raises UnknownVariantError / UnsupportedConfigError.
    """
    if arch not in ARCHS:
        raise UnsupportedConfigError(f"arch {arch!r} unknown; choose from {', '.join(ARCHS)}")
    cfg = config_for(variant, arch, dtype, head_dim, causal)
    c = get_compiled(cfg)
    res = cubin_resources(c.cubin) if c.cubin else {}
    report = {
        "variant": variant, "arch": arch, "dtype": dtype, "head_dim": head_dim, "causal": causal,
        "tiles": dict(cfg.tiles) if all(isinstance(t, tuple) and len(t) == 2 for t in cfg.tiles)
        else list(cfg.tiles),
        "compile_s": round(c.compile_s, 3),
        "registers": res.get("registers"),
        "smem_static_bytes": res.get("smem_static_bytes"),
        "smem_dynamic_bytes": c.smem_dynamic_bytes,
        "smem_bytes": (res.get("smem_static_bytes") or 0) + c.smem_dynamic_bytes,
        "spill_bytes": res.get("spill_bytes"),
    }
    if sass:
        report.update(count_sass(sass_of(c.cubin)))
    return report


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", required=True, choices=ARCHS, help="target (no GPU needed)")
    parser.add_argument("--variant", required=True, help="kernel variant, e.g. fa2, fa1, fa3, testkernel")
    parser.add_argument("--head-dim", type=int, required=True)
    # only the dtypes some registered variant takes (e4m3 appears once an FP8 variant is registered)
    offered = {d for v in known_variants().values() for d in v.dtypes}
    parser.add_argument("--dtype", required=True, choices=[d for d in DTYPES if d in offered] or DTYPES)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--sass", action="store_true", help=f"count {', '.join(SASS_OPCODES)}")


def run_cli(args: argparse.Namespace) -> int:
    os.environ["CUTE_DSL_ARCH"] = args.arch  # read when the DSL loads (below, on first compile)
    try:
        report = compile_only(args.variant, args.arch, args.head_dim, args.dtype, args.causal, args.sass)
    except (UnknownVariantError, UnsupportedConfigError) as exc:
        print(f"fa-variants compile: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0
