"""The on-disk compile cache: a compiled kernel kept across processes, so that a new process loads it (milliseconds)
instead of tracing and compiling it again (seconds), without importing the CuTe DSL.

What is stored is the CuTe DSL's own ahead-of-time export of the compiled TVM-FFI function
(``JitCompiledFunction.export_to_c``: one relocatable object file holding the host launcher and the cubin) and,
when a C compiler is at hand (``$CC``, ``cc``, ``gcc``, ``clang``), that object linked into a shared library
against the DSL's runtime library (``libcute_dsl_runtime.so``) and ``libtvm_ffi.so``, both by absolute rpath.
A new process loads the shared library with ``tvm_ffi.load_module`` (a ``dlopen``): the TVM-FFI function it
exports is the callable a fresh ``cute.compile`` gives (torch tensors in, the stream from the environment),
and the ``cutlass`` package is never imported (about 2 s of a first call on the H200 host). Without a shared
library (no compiler when it was written, or it fails to load: a runtime library moved), the object is linked
in memory by ``cutlass.cute.runtime.load_module(path, enable_tvm_ffi=True)``, which imports the DSL.
The DSL's own file cache (``CUTE_DSL_CACHE_DIR``) is not enough: it is keyed by the hash of the
traced MLIR module, so every process still pays the Python trace of the kernel, most of a first call.

One entry is one file, ``<dir>/<fingerprint>/<variant>-<arch>-<dtype>-d<head_dim>[-causal]-<key hash>.kernel``:
a header (JSON: the full key, the sizes and SHA-256 of the parts, shared memory, the original compile time)
then the object file, the cubin (for ``fa-variants compile``'s report) and the shared library (possibly
empty). Its key:

* the `common.cache.StaticConfig` (variant, arch, dtype, head_dim, causal, the variant's frozen config,
  alignment), hashed from its repr;
* the fingerprint directory: a hash of every kernel source of the package (``common/``, ``hopper/``,
  ``ampere/``, ``fp8/``, ``testkernel*.py``), the versions of nvidia-cutlass-dsl, its libraries (base, core,
  cu12 / cu13: `FINGERPRINT_DISTRIBUTIONS`) and apache-tvm-ffi, the Python version, the host machine and the
  DSL's compile-affecting environment variables that are set (`DSL_COMPILE_VARIABLES`: CUTE_DSL_LINEINFO, ...).
  Changing a kernel's code, or the DSL, starts a new directory: a stale entry is never read (old directories can
  be deleted: ``fa-variants warmup --prune``).

Safety: an entry is written to a temporary file in the same directory and renamed over the final name
(``os.replace``, atomic on POSIX), so a reader sees a whole entry or none; concurrent processes compiling the
same kernel both write a whole file and the last rename wins. A file that does not parse, whose parts do
not match their hashes (truncated, corrupt) or that can be loaded neither way is reported once
(`DiskCacheWarning`), recompiled and overwritten: never a crash. The shared library is checked against its
hash before it is written out (to a private temporary file, deleted once loaded; in the system's temporary
directory where the cache's cannot be written: a read-only cache is still read) and ``dlopen``-ed.

Environment:
    FA_VARIANTS_CACHE_DIR   where (default ``$XDG_CACHE_HOME/fa_variants`` if that is absolute, or
                            ``~/.cache/fa_variants``; with no home directory either, the disk cache is not used)
    FA_VARIANTS_DISK_CACHE  ``0`` / ``off`` / ``false``: neither read nor write the disk (in-process cache only)
    FA_VARIANTS_DISK_CACHE_LOADER  ``dsl``: load entries through the DSL (the object file) even when they hold a
                            shared library (for comparisons; default ``auto``)

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

from fa_variants.common import env, paths

ENV_DIR = "FA_VARIANTS_CACHE_DIR"
ENV_SWITCH = "FA_VARIANTS_DISK_CACHE"
ENV_LOADER = "FA_VARIANTS_DISK_CACHE_LOADER"
MAGIC = b"fa_variants kernel v2\n"  # v2: + the shared library
SUFFIX = ".kernel"
EXPORT_NAME = "fa_variants_kernel"  # the exported function's symbol stem (one function per object file)
#: the package's kernel sources: the fingerprint hashes every .py file under these
KERNEL_SOURCES = ("common", "hopper", "ampere", "fp8", "testkernel.py", "testkernel_kernel.py")

loads = 0  # entries loaded from disk in this process (tests and `warmup` read it)
store_failures = 0  # compiled kernels `store` could not write in this process (`warmup` reads it)
#: entries loaded per way ("shared": dlopen of the linked library, no DSL; "dsl": the object through the DSL)
loaded_by: dict[str, int] = {"shared": 0, "dsl": 0}
PARTS = ("object", "cubin", "shared")
#: the installed distributions whose versions go into `fingerprint`: the DSL, its libraries (the compiler itself; the
#: CUDA 12 and 13 builds are separate distributions of one version) and TVM-FFI; "none" for one not installed
FINGERPRINT_DISTRIBUTIONS = ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core",
                             "nvidia-cutlass-dsl-libs-cu12", "nvidia-cutlass-dsl-libs-cu13", "apache-tvm-ffi")
SCRATCH_FILES = ("kernel.o", "kernel.so")  # what store's and _load_object's scratch folders hold
#: the CuTe DSL's environment variables that change what it compiles (its env_manager's ``affects_compile``
#: settings but CUTE_DSL_ARCH, which the explicit ``--gpu-arch`` of every compile here overrides): their values go
#: into `fingerprint`, so a debug / line-info / assertion build is never served to a process without them, nor the
#: reverse
DSL_COMPILE_VARIABLES = tuple(f"CUTE_DSL_{name}" for name in (
    "DEBUG", "LINEINFO", "ENABLE_ASSERTIONS", "COMPILER_OPT", "COMPILER_BACKEND", "LOC_TRACEBACKS",
    "USE_EXTENSION_COMPILER", "ENABLE_PYIR", "AUTO_M2S", "TOLERATE_M2M", "DRYRUN", "WARNINGS_AS_ERRORS", "LIBS",
    "ENABLE_TVM_FFI"))


class DiskCacheWarning(UserWarning):
    """A cache entry could not be used (corrupt, truncated, unloadable) and is being recompiled."""


def enabled() -> bool:
    """False when FA_VARIANTS_DISK_CACHE is 0 / off / false / no (``common.env.flag``: ValueError naming it for
    a value that is none of its spellings)."""
    return env.flag(ENV_SWITCH, True)


def root() -> Path:
    """The cache's top directory: FA_VARIANTS_CACHE_DIR, else ``$XDG_CACHE_HOME/fa_variants`` (an absolute path: a
    relative one is ignored, as the XDG base directory spec says), else ``~/.cache/fa_variants``.

    Raises:
        OSError: none of them names a place (FA_VARIANTS_CACHE_DIR and XDG_CACHE_HOME unset and no home directory:
            HOME unset and the user id without a password entry, or HOME relative); the message names
            FA_VARIANTS_CACHE_DIR."""
    named = paths.env_path(ENV_DIR)  # spaces around it stripped; blank = unset
    if named:  # a relative one is taken from the working directory at first use, made absolute
        return paths.expand_user(named, ENV_DIR).absolute()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "fa_variants"
    home = paths.home()
    if home is None:  # no home directory (HOME unset without a password entry, or HOME relative)
        raise OSError(f"no directory for the compile cache (no home directory: HOME is {os.environ.get('HOME')!r}, "
                      f"unset or relative): set {ENV_DIR}")
    return home / ".cache" / "fa_variants"


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """16 hex digits naming what compiled code depends on besides its key (see the module docstring), taken at the
    process's first use (`store` checks it again before writing)."""
    return _fingerprint_now()


def _fingerprint_now() -> str:
    from importlib.metadata import PackageNotFoundError, version

    package = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for dist in FINGERPRINT_DISTRIBUTIONS:
        try:
            h.update(f"{dist}={version(dist)};".encode())
        except PackageNotFoundError:
            h.update(f"{dist}=none;".encode())
    h.update(f"python={sys.version_info[0]}.{sys.version_info[1]};{platform.machine()};".encode())
    h.update("".join(f"{k}={os.environ[k]};" for k in DSL_COMPILE_VARIABLES if k in os.environ).encode())
    files = []
    for name in KERNEL_SOURCES:
        path = package / name
        # regular files only, no hidden ones: an editor's lock link (.#fa2_kernel.py, dangling) is no source
        files += sorted(p for p in path.rglob("*.py") if p.is_file() and not p.name.startswith(".")) \
            if path.is_dir() else [path]
    for path in files:
        data = path.read_bytes()
        h.update(f"{path.relative_to(package).as_posix()}:{len(data)};".encode())
        h.update(data)
    return h.hexdigest()[:16]


def entry_path(cfg) -> Path:
    """Where the entry of a `common.cache.StaticConfig` lives. Raises OSError as `root` does."""
    digest = hashlib.sha256(repr(cfg).encode()).hexdigest()[:16]
    name = f"{cfg.variant}-{cfg.arch}-{cfg.dtype}-d{cfg.head_dim}{'-causal' if cfg.causal else ''}-{digest}"
    return root() / fingerprint() / (name + SUFFIX)


_no_directory_warned = False  # `_usable_entry_path` warned once in this process that there is no cache directory


def _usable_entry_path(cfg) -> Path | None:
    """`entry_path` of cfg, or None where there is no cache directory at all (`root`'s OSError): then the disk cache
    is not used, and the first such call of the process says so (one `DiskCacheWarning`, not one per kernel)."""
    global _no_directory_warned
    try:
        return entry_path(cfg)
    except OSError as exc:
        if not _no_directory_warned:
            _no_directory_warned = True
            warnings.warn(f"fa_variants: kernels are compiled without the disk cache ({exc})", DiskCacheWarning,
                          stacklevel=3)
        return None


def store(cfg, fn, cubin: bytes | None, smem_dynamic_bytes: int, compile_s: float) -> Path | None:
    """Export a freshly compiled kernel (and link it into a shared library when a C compiler is at hand) and
    write its entry atomically; None (and a warning) if it cannot (an unwritable directory, an export error; no
    cache directory at all: `_usable_entry_path`'s one warning per process): the kernel still runs, only the
    next process recompiles."""
    global store_failures
    path = _usable_entry_path(cfg)
    if path is None:
        store_failures += 1
        return None
    try:
        if _fingerprint_now() != fingerprint():  # a kernel source (or the DSL) changed since the first use
            raise OSError("the kernel sources changed since this process first used the cache: its kernel may "
                          "come from either version, so it is not stored under the old sources' fingerprint")
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as scratch:
            obj_path = os.path.join(scratch, "kernel.o")
            fn.export_to_c(obj_path, function_name=EXPORT_NAME)
            obj = Path(obj_path).read_bytes()
            shared, link_note = link_shared(obj_path, os.path.join(scratch, "kernel.so"))
        cubin = cubin or b""
        header = json.dumps({
            "key": repr(cfg), "fingerprint": fingerprint(), "smem_dynamic_bytes": int(smem_dynamic_bytes),
            "compile_s": float(compile_s), "object": [len(obj), _sha(obj)], "cubin": [len(cubin), _sha(cubin)],
            "shared": [len(shared), _sha(shared)], "link": link_note,
        }).encode()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.chmod(tmp, 0o644)  # mkstemp makes it private; an entry is as readable as any cache file
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + struct.pack("<Q", len(header)) + header + obj + cubin + shared)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except Exception as exc:  # a cache must never break a call
        warnings.warn(f"fa_variants: could not write the compile cache entry {path}: {exc}", DiskCacheWarning,
                      stacklevel=2)
        store_failures += 1
        return None
    return path


def _compiler() -> str | None:
    """The C compiler driver that links shared libraries: $CC, else cc, gcc or clang on PATH."""
    import shutil

    for name in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang")):
        found = shutil.which(name)
        if found:
            return found
    return None


def link_shared(obj_path: str, so_path: str) -> tuple[bytes, str]:
    """(the shared library's bytes, "ok") linked from an exported object file against the DSL's runtime
    libraries by absolute rpath, or (b"", why not): no compiler, a failed link. Called where the DSL is loaded
    (a fresh compile)."""
    import subprocess

    import cutlass.cute as cute

    cc = _compiler()
    if cc is None:
        return b"", "no C compiler (CC, cc, gcc, clang) to link a shared library"
    libs = [lib for lib in cute.runtime.find_runtime_libraries(enable_tvm_ffi=True) if os.path.exists(lib)]
    command = [cc, "-shared", "-o", so_path, obj_path]
    for lib in libs:  # -L dir -l name keeps the NEEDED entry a plain name, found through the rpath
        directory, name = os.path.split(lib)
        command += ["-L", directory, "-l:" + name, "-Wl,-rpath," + directory]
    try:
        done = subprocess.run(command, capture_output=True, encoding="utf-8", errors="replace", timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return b"", f"link failed: {exc}"
    if done.returncode != 0 or not os.path.exists(so_path):
        return b"", f"link failed ({done.returncode}): {done.stderr.strip()[-300:]}"
    return Path(so_path).read_bytes(), "ok"


def loader() -> str:
    """FA_VARIANTS_DISK_CACHE_LOADER: "auto" (default) or "dsl"; ValueError naming the variable for anything else
    (read before an entry is opened: a bad switch is the caller's error, not a corrupt entry to recompile)."""
    return env.choice(ENV_LOADER, "auto", ("auto", "dsl"))


def load(cfg):
    """(fn, cubin, smem_dynamic_bytes, compile_s) of a stored kernel, or None: no entry, or an unusable one
    (then a `DiskCacheWarning`; the caller recompiles and `store` overwrites it).

    Raises:
        ValueError: FA_VARIANTS_DISK_CACHE_LOADER set to neither "auto" nor "dsl" (`loader`)."""
    global loads
    mode = loader()
    path = _usable_entry_path(cfg)
    if path is None:
        return None
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:  # unreadable
        warnings.warn(f"fa_variants: cannot read the compile cache ({exc}); recompiling", DiskCacheWarning,
                      stacklevel=2)
        return None
    try:
        header, parts = _parse(data, cfg)
        fn, way = _load_function(parts, path.parent, mode)
    except Exception as exc:
        warnings.warn(f"fa_variants: unusable compile cache entry {path} ({type(exc).__name__}: {exc}); "
                      "recompiling", DiskCacheWarning, stacklevel=2)
        return None
    loads += 1
    loaded_by[way] += 1
    return fn, parts["cubin"] or None, header["smem_dynamic_bytes"], header["compile_s"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _parse(data: bytes, cfg) -> tuple[dict, dict[str, bytes]]:
    """header and {part name: bytes} (`PARTS`) of an entry's bytes; ValueError unless it is whole, is the entry
    of cfg written under this `fingerprint` and its header holds smem_dynamic_bytes (an int) and compile_s (a
    number), both >= 0."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        raise ValueError("not an fa_variants kernel file of this version")
    start = len(MAGIC) + 8
    (size,) = struct.unpack("<Q", data[len(MAGIC):start])
    header = json.loads(data[start:start + size])
    if header.get("key") != repr(cfg):
        raise ValueError("entry is for another configuration")
    if header.get("fingerprint") != fingerprint():  # copied in from another directory: other sources or DSL
        raise ValueError(f"entry of other kernel sources or DSL (fingerprint {header.get('fingerprint')!r})")
    for name, kinds in (("smem_dynamic_bytes", int), ("compile_s", (int, float))):  # what `load` returns of it
        value = header.get(name)
        if isinstance(value, bool) or not isinstance(value, kinds) or not value >= 0:
            raise ValueError(f"header field {name} missing or not a number >= 0: {value!r}")
    parts, offset = {}, start + size
    for name in PARTS:
        length, digest = header[name]
        part = data[offset:offset + length]
        if len(part) != length or _sha(part) != digest:
            raise ValueError(f"{name} truncated or corrupt")
        parts[name] = part
        offset += length
    if offset != len(data):
        raise ValueError("trailing bytes")
    return header, parts


def library_note(cfg) -> str | None:
    """Why cfg's entry holds no shared library (its header's link note: no C compiler, a failed link), or None
    where it holds one or there is no readable entry: a process then loads it through the DSL (about 2 s more on a
    first call), which `fa-variants warmup` reports."""
    try:
        header, parts = _parse(entry_path(cfg).read_bytes(), cfg)
    except (OSError, ValueError):
        return None
    return None if parts["shared"] else str(header.get("link") or "no shared library")


def _load_function(parts: dict[str, bytes], directory: Path, mode: str = "auto"):
    """(the TVM-FFI function of an entry, "shared" or "dsl"): its shared library through ``dlopen`` when it has
    one (and ``mode``, FA_VARIANTS_DISK_CACHE_LOADER's value, is not ``dsl``), falling back to the object through
    the DSL."""
    if parts["shared"] and mode != "dsl":
        try:
            return _load_shared(parts["shared"], directory), "shared"
        except Exception as exc:  # e.g. a runtime library moved since it was linked: the object still loads
            if not parts["object"]:
                raise
            warnings.warn(f"fa_variants: the shared library of a cache entry did not load ({exc}); "
                          "loading its object through the CuTe DSL", DiskCacheWarning, stacklevel=3)
    return _load_object(parts["object"], directory), "dsl"


def _scratch(make, directory: Path, prefix: str, **kwargs):
    """``make(dir=directory, prefix=prefix, ...)`` (``tempfile.mkstemp`` / ``TemporaryDirectory``): a loader's
    private temporary in the cache directory, else, where that directory cannot be written (a pre-warmed cache
    mounted read-only, another user's), in the system's temporary directory: reading an entry needs no write
    access to the cache."""
    try:
        return make(dir=directory, prefix=prefix, **kwargs)
    except OSError:
        return make(prefix="fa_variants" + prefix.replace(".", "-", 1), **kwargs)


def _load_shared(shared: bytes, directory: Path):
    """The TVM-FFI function exported by a linked kernel library: written to a private temporary file in the
    cache directory (`_scratch`), ``dlopen``-ed by ``tvm_ffi.load_module``, the file removed (the mapping stays)."""
    import tvm_ffi

    fd, so_path = _scratch(tempfile.mkstemp, directory, ".load-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(shared)
        module = tvm_ffi.load_module(so_path)
        return module[EXPORT_NAME]  # the function keeps its library loaded
    finally:
        os.unlink(so_path)


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
    """The TVM-FFI function of an exported object file (linked in memory by the DSL; the file written to a
    `_scratch` folder)."""
    import cutlass.cute as cute

    _runtime_libraries()
    with _scratch(tempfile.TemporaryDirectory, directory, ".load-") as scratch:
        obj_path = os.path.join(scratch, "kernel.o")
        Path(obj_path).write_bytes(obj)
        module = cute.runtime.load_module(obj_path, enable_tvm_ffi=True)  # reads the file into memory
        return getattr(module, EXPORT_NAME)


def _is_cache_directory(path: Path) -> bool:
    """True for a directory this cache wrote: named like `fingerprint` (16 lowercase hex digits), not a symbolic
    link, holding only entries (``*.kernel``) and the temporary files and folders `store` and `_load_shared` /
    `_load_object` make (``.export-*``, ``.load-*``, ``.<entry>.*.tmp``; such a folder holding nothing but
    `SCRATCH_FILES`)."""
    if len(path.name) != 16 or path.name.strip("0123456789abcdef") or path.is_symlink() or not path.is_dir():
        return False

    def ours(child: Path) -> bool:
        name = child.name
        if child.is_symlink():
            return False
        if name.startswith((".export-", ".load-")) and child.is_dir():  # store's / _load_object's scratch folder
            return all(f.name in SCRATCH_FILES and f.is_file() and not f.is_symlink() for f in child.iterdir())
        if name.startswith(".load-") and name.endswith(".so"):  # _load_shared's scratch file
            return child.is_file()
        if name.startswith(".") and name.endswith(".tmp") and SUFFIX + "." in name:  # store's unrenamed file
            return child.is_file()
        return name.endswith(SUFFIX) and child.is_file()

    try:
        return all(ours(child) for child in path.iterdir())
    except OSError:  # unreadable (another user's folder in a shared root): not ours to judge, so not deleted
        return False


def prune() -> list[Path]:
    """Delete the fingerprint directories other than the current one (entries no process of this installation
    will read again; other installations sharing the root lose theirs too); returns what was deleted. Only
    directories this cache wrote (`_is_cache_directory`) are touched: anything else under the cache root
    (FA_VARIANTS_CACHE_DIR may name a directory that holds other files) is left as it is."""
    import shutil

    top, keep, gone = root(), fingerprint(), []
    if top.is_dir():
        for child in top.iterdir():
            if child.name != keep and _is_cache_directory(child):
                try:
                    shutil.rmtree(child)
                except OSError as exc:
                    warnings.warn(f"fa_variants: could not delete the cache directory {child} ({exc})",
                                  DiskCacheWarning, stacklevel=2)
                    continue
                gone.append(child)
    return gone
