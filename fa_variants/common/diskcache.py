"""The on-disk compile cache: a compiled kernel kept across processes, so that a new process loads it (tens of
milliseconds) instead of tracing and compiling it again (seconds).

What is stored is the CuTe DSL's own ahead-of-time export of the compiled TVM-FFI function
(``JitCompiledFunction.export_to_c``: one relocatable object file holding the host launcher and the cubin),
loaded back by ``cutlass.cute.runtime.load_module(path, enable_tvm_ffi=True)``, which links it in memory and
returns the same callable a fresh ``cute.compile`` gives (called with torch tensors, the stream from the
environment). The DSL's own file cache (``CUTE_DSL_CACHE_DIR``) is not enough: it is keyed by the hash of the
traced MLIR module, so every process still pays the Python trace of the kernel, most of a first call.

One entry is one file, ``<dir>/<fingerprint>/<variant>-<arch>-<dtype>-d<head_dim>[-causal]-<key hash>.kernel``:
a header (JSON: the full key, the sizes and SHA-256 of the parts, shared memory, the original compile time)
then the object file and the cubin (for ``fa-variants compile``'s report). Its key:

* the `common.cache.StaticConfig` (variant, arch, dtype, head_dim, causal, the variant's frozen config,
  alignment), hashed from its repr;
* the fingerprint directory: a hash of every kernel source of the package (``common/``, ``hopper/``,
  ``ampere/``, ``fp8/``, ``testkernel.py``), the nvidia-cutlass-dsl and apache-tvm-ffi versions, the Python
  version and the host machine. Changing a kernel's code, or the DSL, starts a new directory: a stale entry
  is never read (old directories can be deleted: ``fa-variants warmup --prune``).

Safety: an entry is written to a temporary file in the same directory and renamed over the final name
(``os.replace``, atomic on POSIX), so a reader sees a whole entry or none; concurrent processes compiling the
same kernel both write a whole file and the last rename wins. A file that does not parse, whose parts do
not match their hashes (truncated, corrupt) or that the DSL fails to load is reported once
(`DiskCacheWarning`), recompiled and overwritten: never a crash.

Environment:
    FA_VARIANTS_CACHE_DIR   where (default ``$XDG_CACHE_HOME/fa_variants`` or ``~/.cache/fa_variants``)
    FA_VARIANTS_DISK_CACHE  ``0`` / ``off`` / ``false``: neither read nor write the disk (in-process cache only)

Follows the idea of Dao-AILab/flash-attention flash_attn/cute/cache_utils.py (AOT export per key under a
source fingerprint); the file format, locking-free atomic writes and validation are this package's.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import struct
import sys
import tempfile
import warnings
from pathlib import Path

ENV_DIR = "FA_VARIANTS_CACHE_DIR"
ENV_SWITCH = "FA_VARIANTS_DISK_CACHE"
MAGIC = b"fa_variants kernel v1\n"
SUFFIX = ".kernel"
EXPORT_NAME = "fa_variants_kernel"  # the exported function's symbol stem (one function per object file)
#: the package's kernel sources: the fingerprint hashes every .py file under these
KERNEL_SOURCES = ("common", "hopper", "ampere", "fp8", "testkernel.py")

loads = 0  # entries loaded from disk in this process (tests and `warmup` read it)


class DiskCacheWarning(UserWarning):
    """A cache entry could not be used (corrupt, truncated, unloadable) and is being recompiled."""


def enabled() -> bool:
    """False when FA_VARIANTS_DISK_CACHE is 0 / off / false / no."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def root() -> Path:
    """The cache's top directory (FA_VARIANTS_CACHE_DIR, else the user's cache directory)."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fa_variants"


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """16 hex digits naming what compiled code depends on besides its key (see the module docstring)."""
    from importlib.metadata import PackageNotFoundError, version

    package = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi"):
        try:
            h.update(f"{dist}={version(dist)};".encode())
        except PackageNotFoundError:
            h.update(f"{dist}=none;".encode())
    h.update(f"python={sys.version_info[0]}.{sys.version_info[1]};{platform.machine()};".encode())
    files = []
    for name in KERNEL_SOURCES:
        path = package / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    for path in files:
        data = path.read_bytes()
        h.update(f"{path.relative_to(package).as_posix()}:{len(data)};".encode())
        h.update(data)
    return h.hexdigest()[:16]


def entry_path(cfg) -> Path:
    """Where the entry of a `common.cache.StaticConfig` lives."""
    digest = hashlib.sha256(repr(cfg).encode()).hexdigest()[:16]
    name = f"{cfg.variant}-{cfg.arch}-{cfg.dtype}-d{cfg.head_dim}{'-causal' if cfg.causal else ''}-{digest}"
    return root() / fingerprint() / (name + SUFFIX)


def store(cfg, fn, cubin: bytes | None, smem_dynamic_bytes: int, compile_s: float) -> Path | None:
    """Export a freshly compiled kernel and write its entry atomically; None (and a warning) if it cannot
    (an unwritable directory, an export error): the kernel still runs, only the next process recompiles."""
    path = entry_path(cfg)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as scratch:
            obj_path = os.path.join(scratch, "kernel.o")
            fn.export_to_c(obj_path, function_name=EXPORT_NAME)
            obj = Path(obj_path).read_bytes()
        cubin = cubin or b""
        header = json.dumps({
            "key": repr(cfg), "fingerprint": fingerprint(), "smem_dynamic_bytes": int(smem_dynamic_bytes),
            "compile_s": float(compile_s), "object": [len(obj), _sha(obj)], "cubin": [len(cubin), _sha(cubin)],
        }).encode()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.chmod(tmp, 0o644)  # mkstemp makes it private; an entry is as readable as any cache file
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + struct.pack("<Q", len(header)) + header + obj + cubin)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except Exception as exc:  # a cache must never break a call
        warnings.warn(f"fa_variants: could not write the compile cache entry {path}: {exc}", DiskCacheWarning,
                      stacklevel=2)
        return None
    return path


def load(cfg):
    """(fn, cubin, smem_dynamic_bytes, compile_s) of a stored kernel, or None: no entry, or an unusable one
    (then a `DiskCacheWarning`; the caller recompiles and `store` overwrites it)."""
    global loads
    path = entry_path(cfg)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.warn(f"fa_variants: cannot read {path} ({exc}); recompiling", DiskCacheWarning, stacklevel=2)
        return None
    try:
        header, obj, cubin = _parse(data, cfg)
        fn = _load_object(obj, path.parent)
    except Exception as exc:
        warnings.warn(f"fa_variants: unusable compile cache entry {path} ({type(exc).__name__}: {exc}); "
                      "recompiling", DiskCacheWarning, stacklevel=2)
        return None
    loads += 1
    return fn, cubin or None, header["smem_dynamic_bytes"], header["compile_s"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _parse(data: bytes, cfg) -> tuple[dict, bytes, bytes]:
    """header, object, cubin of an entry's bytes; ValueError unless it is whole and is the entry of cfg."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        raise ValueError("not an fa_variants kernel file")
    start = len(MAGIC) + 8
    (size,) = struct.unpack("<Q", data[len(MAGIC):start])
    header = json.loads(data[start:start + size])
    if header.get("key") != repr(cfg):
        raise ValueError("entry is for another configuration")
    parts, offset = [], start + size
    for name in ("object", "cubin"):
        length, digest = header[name]
        part = data[offset:offset + length]
        if len(part) != length or _sha(part) != digest:
            raise ValueError(f"{name} truncated or corrupt")
        parts.append(part)
        offset += length
    if offset != len(data):
        raise ValueError("trailing bytes")
    return header, parts[0], parts[1]


@functools.lru_cache(maxsize=1)
def _runtime_libraries() -> None:
    """Load the DSL's runtime libraries with global symbols before the first object is linked (the remedy
    Dao-AILab/flash-attention flash_attn/cute/cache_utils.py uses for unresolved runtime symbols)."""
    import ctypes

    import cutlass.cute as cute

    for lib in cute.runtime.find_runtime_libraries(enable_tvm_ffi=False):
        if os.path.exists(lib):
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)


def _load_object(obj: bytes, directory: Path):
    """The TVM-FFI function of an exported object file (linked in memory by the DSL)."""
    import cutlass.cute as cute

    _runtime_libraries()
    with tempfile.TemporaryDirectory(dir=directory, prefix=".load-") as scratch:
        obj_path = os.path.join(scratch, "kernel.o")
        Path(obj_path).write_bytes(obj)
        module = cute.runtime.load_module(obj_path, enable_tvm_ffi=True)  # reads the file into memory
        return getattr(module, EXPORT_NAME)


def prune() -> list[Path]:
    """Delete the fingerprint directories other than the current one (entries no process will read again);
    returns what was deleted."""
    import shutil

    top, keep, gone = root(), fingerprint(), []
    if top.is_dir():
        for child in top.iterdir():
            if child.is_dir() and child.name != keep:
                shutil.rmtree(child, ignore_errors=True)
                gone.append(child)
    return gone
