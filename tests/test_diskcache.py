"""The on-disk compile cache (fa_variants.common.diskcache) and `fa-variants warmup`, without a GPU: entries
written and read back (in this process and in a fresh one), a truncated or foreign entry recompiled, the
switch, concurrent writers. Loading an entry links it in memory; calling it needs a GPU
(tests/test_cache_gpu.py)."""
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fa_variants import cli, registry, testkernel
from fa_variants.common import cache, diskcache

ROOT = Path(__file__).resolve().parent.parent
# a subprocess imports this checkout first, then the caller's PYTHONPATH (where a GPU host keeps the CuTe DSL)
PYTHONPATH = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))


@pytest.fixture
def cache_dir(monkeypatch):
    """An empty cache directory this test owns (not under pytest's tmp_path: another pytest session of the same
    user may delete old /tmp/pytest-of-<user>/ folders while a long test here still writes into one)."""
    top = Path(tempfile.mkdtemp(prefix="fa_variants_diskcache_test_"))
    monkeypatch.setenv(diskcache.ENV_DIR, str(top / "kernels"))
    monkeypatch.delenv(diskcache.ENV_SWITCH, raising=False)
    yield top / "kernels"
    shutil.rmtree(top, ignore_errors=True)


def _cfg(threads: int):
    """A testkernel configuration no other test compiles (a fresh compile in this process)."""
    return registry.static_config("testkernel", "sm_80", "bf16", 64, False,
                                   testkernel.TestKernelConfig(threads=threads))


def _forget(cfg) -> None:
    cache._CACHE.pop(cfg, None)


def _python(code: str, env: dict, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": PYTHONPATH, "CUTE_DSL_ARCH": "sm_80", **env}, timeout=600)


FRESH_PROCESS = """
import json, sys
from fa_variants import registry
from fa_variants.common import cache
from fa_variants.testkernel import TestKernelConfig
cfg = registry.static_config("testkernel", "sm_80", "bf16", 64, False, TestKernelConfig(threads=int(sys.argv[1])))
c = registry.compiled(cfg)
print(json.dumps({**cache.cache_info(), "type": type(c.fn).__name__, "cubin": len(c.cubin or b"")}))
"""


# ----------------------------------------------------------------------------------------- no DSL needed

def test_location_and_switch(monkeypatch, tmp_path):
    monkeypatch.setenv(diskcache.ENV_DIR, str(tmp_path))
    assert diskcache.root() == tmp_path
    monkeypatch.delenv(diskcache.ENV_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert diskcache.root() == tmp_path / "xdg" / "fa_variants"
    for off in ("0", "off", "False", "no"):
        monkeypatch.setenv(diskcache.ENV_SWITCH, off)
        assert not diskcache.enabled()
    monkeypatch.setenv(diskcache.ENV_SWITCH, "1")
    assert diskcache.enabled()


def test_a_relative_xdg_cache_home_is_ignored(monkeypatch, tmp_path):
    """XDG_CACHE_HOME must be absolute (the XDG base directory spec: a relative one is ignored); '~/.cache' (a tilde
    a shell did not expand) put the cache in a folder named '~' under whatever directory each process ran in."""
    monkeypatch.delenv(diskcache.ENV_DIR, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for relative in ("~/.cache", "cache", "./cache"):
        monkeypatch.setenv("XDG_CACHE_HOME", relative)
        assert diskcache.root() == tmp_path / ".cache" / "fa_variants"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert diskcache.root() == tmp_path / "xdg" / "fa_variants"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "relhome")  # the same for HOME (a review finding): a named error, not a moving cache
    with pytest.raises(OSError, match=diskcache.ENV_DIR):
        diskcache.root()


def test_no_home_directory_is_a_named_error_not_a_crash(monkeypatch, capsys):
    """No FA_VARIANTS_CACHE_DIR, no XDG_CACHE_HOME and no home directory (HOME unset, a user id without a password
    entry: a container's arbitrary user): Path.home()'s RuntimeError escaped diskcache.load, so every kernel call
    raised "Could not determine home directory". Now root() raises an OSError naming FA_VARIANTS_CACHE_DIR, calls
    go on without the disk cache (one DiskCacheWarning per process, not two per kernel: a review finding), and
    warmup exits 2 with that one line before compiling."""
    import pathlib
    import warnings

    def no_home(cls=None):
        raise RuntimeError("Could not determine home directory.")

    for name in (diskcache.ENV_DIR, "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pathlib.Path, "home", classmethod(no_home))
    with pytest.raises(OSError, match=diskcache.ENV_DIR):
        diskcache.root()
    monkeypatch.setattr(diskcache, "_no_directory_warned", False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for width in (32, 64, 96):  # what common.cache does per kernel: load, then store after compiling
            assert diskcache.load(_cfg(width)) is None
            assert diskcache.store(_cfg(width), None, None, 0, 0.0) is None
    said = [w for w in seen if issubclass(w.category, diskcache.DiskCacheWarning)]
    assert len(said) == 1 and diskcache.ENV_DIR in str(said[0].message), [str(w.message) for w in said]
    n = cache.cache_info()["compiles"]
    argv = ["warmup", "--arch", "sm_80", "--backends", "testkernel", "--head-dims", "64", "--no-progress"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and diskcache.ENV_DIR in err[0] and "Traceback" not in err[0], err
    assert cache.cache_info()["compiles"] == n


def test_entry_names_carry_the_key_and_the_fingerprint(cache_dir):
    a, b = _cfg(32), _cfg(64)
    assert diskcache.entry_path(a).parent == cache_dir / diskcache.fingerprint()
    assert diskcache.entry_path(a).name.startswith("testkernel-sm_80-bf16-d64-")
    assert diskcache.entry_path(a) != diskcache.entry_path(b)
    assert len(diskcache.fingerprint()) == 16


def test_the_fingerprint_follows_the_dsl_libraries(monkeypatch):
    """The DSL's compiler ships in separate distributions of the same version (libs-base, libs-core, and libs-cu12
    or libs-cu13): swapping the CUDA 12 build for the CUDA 13 one, or any of their versions, gives a new fingerprint
    (before session 32 only nvidia-cutlass-dsl's version counted)."""
    import importlib.metadata as md

    real = md.version

    def installed(swap):
        def version(dist):
            if dist in swap:
                if swap[dist] is None:
                    raise md.PackageNotFoundError(dist)
                return swap[dist]
            return real(dist)
        return version

    def fingerprint(swap):
        diskcache.fingerprint.cache_clear()
        monkeypatch.setattr(md, "version", installed(swap))
        try:
            return diskcache.fingerprint()
        finally:
            monkeypatch.setattr(md, "version", real)
            diskcache.fingerprint.cache_clear()

    cu12 = {"nvidia-cutlass-dsl-libs-cu12": "4.8.1", "nvidia-cutlass-dsl-libs-cu13": None}
    cu13 = {"nvidia-cutlass-dsl-libs-cu12": None, "nvidia-cutlass-dsl-libs-cu13": "4.8.1"}
    core = dict(cu12, **{"nvidia-cutlass-dsl-libs-core": "0.0.1"})
    prints = [fingerprint(cu12), fingerprint(cu13), fingerprint(core)]
    assert len(set(prints)) == 3, prints
    assert fingerprint(cu12) == prints[0]  # the same installation, the same fingerprint


def test_parse_rejects_anything_but_a_whole_entry_of_its_key():
    import hashlib
    import struct

    cfg, other = _cfg(32), _cfg(64)
    obj, cubin, shared = b"object bytes", b"cubin bytes", b"shared library bytes"
    sha = lambda data: hashlib.sha256(data).hexdigest()  # noqa: E731

    def entry(key, payload=obj + cubin + shared, magic=diskcache.MAGIC, fingerprint=diskcache.fingerprint()):
        header = json.dumps({"key": repr(key), "fingerprint": fingerprint, "smem_dynamic_bytes": 0,
                             "compile_s": 1.0, "object": [len(obj), sha(obj)], "cubin": [len(cubin), sha(cubin)],
                             "shared": [len(shared), sha(shared)]}).encode()
        return magic + struct.pack("<Q", len(header)) + header + payload

    header, parts = diskcache._parse(entry(cfg), cfg)
    assert parts == {"object": obj, "cubin": cubin, "shared": shared}
    bad = {"truncated": entry(cfg)[:-3], "corrupt": entry(cfg, obj + cubin + b"x" + shared[1:]),
           "foreign": entry(other), "trailing": entry(cfg) + b"!", "empty": b"", "not ours": b"\x7fELF" + bytes(64),
           "version 1": entry(cfg, magic=b"fa_variants kernel v1\n"),
           # an entry of other kernel sources / DSL copied into this fingerprint's directory (it loaded before session 32)
           "stale": entry(cfg, fingerprint="0123456789abcdef"), "no fingerprint": entry(cfg, fingerprint=None)}
    for name, data in bad.items():
        with pytest.raises((ValueError, KeyError)):
            diskcache._parse(data, cfg)


# ----------------------------------------------------------------------------------------- with the DSL

@pytest.mark.compile
def test_written_once_then_loaded_here_and_in_a_fresh_process(cache_dir):
    cfg = _cfg(64)
    _forget(cfg)
    n = cache.cache_info()
    first = registry.compiled(cfg)
    path = diskcache.entry_path(cfg)
    assert cache.cache_info()["compiles"] == n["compiles"] + 1 and path.is_file()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary left behind
    _forget(cfg)
    loaded = registry.compiled(cfg)
    info = cache.cache_info()
    assert info["compiles"] == n["compiles"] + 1 and info["disk_loads"] == n["disk_loads"] + 1
    assert loaded is not first and callable(loaded.fn) and loaded.cubin == first.cubin
    assert loaded.compile_s == pytest.approx(first.compile_s)


@pytest.mark.compile
@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_entry_is_recompiled_and_replaced(cache_dir, damage):
    cfg = _cfg(96 if damage == "truncate" else 128)
    _forget(cfg)
    registry.compiled(cfg)
    path = diskcache.entry_path(cfg)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else os.urandom(len(data)))
    _forget(cfg)
    n = cache.cache_info()["compiles"]
    with pytest.warns(diskcache.DiskCacheWarning, match="unusable compile cache entry"):
        again = registry.compiled(cfg)
    assert callable(again.fn) and cache.cache_info()["compiles"] == n + 1
    diskcache._parse(path.read_bytes(), cfg)  # rewritten whole


NO_DSL_PROCESS = """
import json, sys
from fa_variants import registry
from fa_variants.common import cache, diskcache
from fa_variants.testkernel import TestKernelConfig
cfg = registry.static_config("testkernel", "sm_80", "bf16", 64, False, TestKernelConfig(threads=int(sys.argv[1])))
c = registry.compiled(cfg)
print(json.dumps({**cache.cache_info(), "loaded_by": diskcache.loaded_by, "type": type(c.fn).__name__,
                  "dsl_imported": "cutlass" in sys.modules}))
"""


def _rewrite(path, cfg, **parts) -> None:
    """Rewrite an entry with some parts replaced (hashes recomputed: a well-formed entry)."""
    import hashlib
    import struct

    header, old = diskcache._parse(path.read_bytes(), cfg)
    new = {**old, **parts}
    header.update({name: [len(new[name]), hashlib.sha256(new[name]).hexdigest()] for name in diskcache.PARTS})
    data = json.dumps(header).encode()
    path.write_bytes(diskcache.MAGIC + struct.pack("<Q", len(data)) + data + b"".join(new[n] for n in diskcache.PARTS))


@pytest.mark.compile
@pytest.mark.parametrize("field, value", [("smem_dynamic_bytes", None), ("compile_s", None),
                                          ("smem_dynamic_bytes", "12k"), ("smem_dynamic_bytes", -1),
                                          ("compile_s", "fast"), ("compile_s", True)])
def test_an_entry_whose_header_lacks_a_field_is_recompiled(cache_dir, field, value):
    """A whole entry of its key whose header lacks smem_dynamic_bytes / compile_s (None here: removed) or holds a
    value of another type: the fields were read after load's try, so a missing one raised KeyError from the kernel
    call, and a string went into Compiled (`fa-variants compile` then failed in round()). Now it is an unusable
    entry: one DiskCacheWarning, recompiled, rewritten whole."""
    import struct

    cfg = _cfg(320)
    _forget(cfg)
    registry.compiled(cfg)
    path = diskcache.entry_path(cfg)
    header, parts = diskcache._parse(path.read_bytes(), cfg)
    header.pop(field) if value is None else header.update({field: value})
    data = json.dumps(header).encode()
    payload = b"".join(parts[n] for n in diskcache.PARTS)
    path.write_bytes(diskcache.MAGIC + struct.pack("<Q", len(data)) + data + payload)
    _forget(cfg)
    n = cache.cache_info()["compiles"]
    with pytest.warns(diskcache.DiskCacheWarning, match=f"unusable compile cache entry .*{field}"):
        again = registry.compiled(cfg)
    assert cache.cache_info()["compiles"] == n + 1 and isinstance(again.smem_dynamic_bytes, int)
    assert diskcache._parse(path.read_bytes(), cfg)[0].get(field) not in (None, value)


@pytest.mark.compile
def test_a_fresh_process_loads_the_shared_library_without_the_dsl(cache_dir):
    """The warm path of a first call: the entry's linked library is dlopen-ed through tvm_ffi, ``cutlass`` is
    never imported; with FA_VARIANTS_DISK_CACHE_LOADER=dsl the object goes through the DSL instead."""
    if diskcache._compiler() is None:
        pytest.skip("no C compiler to link the shared library")
    cfg = _cfg(224)
    _forget(cfg)
    registry.compiled(cfg)
    header, parts = diskcache._parse(diskcache.entry_path(cfg).read_bytes(), cfg)
    assert header["link"] == "ok" and parts["shared"].startswith(b"\x7fELF")
    env = {diskcache.ENV_DIR: str(cache_dir)}
    warm = json.loads(_python(NO_DSL_PROCESS, env, "224").stdout.strip().splitlines()[-1])
    assert warm["compiles"] == 0 and warm["loaded_by"] == {"shared": 1, "dsl": 0}
    assert warm["type"] == "Function" and not warm["dsl_imported"]
    via_dsl = json.loads(_python(NO_DSL_PROCESS, {**env, diskcache.ENV_LOADER: "dsl"}, "224").stdout.strip()
                         .splitlines()[-1])
    assert via_dsl["compiles"] == 0 and via_dsl["loaded_by"] == {"shared": 0, "dsl": 1} and via_dsl["dsl_imported"]


@pytest.mark.compile
def test_a_shared_library_that_does_not_load_falls_back_to_the_object(cache_dir):
    """A whole entry whose library cannot be dlopen-ed (here: not an ELF file) still loads, through the DSL,
    with one warning; an entry without a library (no compiler when written) loads through the DSL quietly."""
    cfg = _cfg(256)
    _forget(cfg)
    registry.compiled(cfg)
    path = diskcache.entry_path(cfg)
    _rewrite(path, cfg, shared=b"not a shared library")
    _forget(cfg)
    before = dict(diskcache.loaded_by)
    with pytest.warns(diskcache.DiskCacheWarning, match="shared library of a cache entry did not load"):
        loaded = registry.compiled(cfg)
    assert callable(loaded.fn) and diskcache.loaded_by["dsl"] == before["dsl"] + 1
    _rewrite(path, cfg, shared=b"")
    _forget(cfg)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", diskcache.DiskCacheWarning)
        assert callable(registry.compiled(cfg).fn)
    assert diskcache.loaded_by["dsl"] == before["dsl"] + 2 and cache.cache_info()["compiles"] >= 1


def _read_only(monkeypatch, directory: Path) -> None:
    """Make ``directory`` behave as a read-only mount (a shared, pre-warmed cache) for the temporary files and folders
    the cache makes there (the tests run as any user, root too: file modes would not stop root)."""
    import errno

    def refuse(make):
        def wrapped(suffix=None, prefix=None, dir=None, *args, **kwargs):
            if dir is not None and Path(dir).is_relative_to(directory):
                raise OSError(errno.EROFS, "Read-only file system", str(dir))
            return make(suffix, prefix, dir, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(tempfile, "mkstemp", refuse(tempfile.mkstemp))
    monkeypatch.setattr(tempfile, "mkdtemp", refuse(tempfile.mkdtemp))  # TemporaryDirectory's


@pytest.mark.compile
@pytest.mark.parametrize("way", ["shared", "dsl"])
def test_a_read_only_cache_is_still_read(cache_dir, monkeypatch, way):
    """A whole entry in a cache directory this process cannot write (a pre-warmed cache mounted read-only) loads,
    both ways, without a warning: the loaders' scratch files went to the cache directory only, so every entry was
    taken for unusable ("Read-only file system") and recompiled, and the store then failed too (session 32's
    break-it pass, on a read-only bind mount)."""
    import warnings

    if way == "shared" and diskcache._compiler() is None:
        pytest.skip("no C compiler to link the shared library")
    cfg = _cfg(288)
    _forget(cfg)
    registry.compiled(cfg)
    _forget(cfg)
    monkeypatch.setenv(diskcache.ENV_LOADER, "dsl" if way == "dsl" else "auto")
    _read_only(monkeypatch, cache_dir)
    scratch = cache_dir.parent / "tmp"  # this test's own temporary directory: the shared one can hold another
    scratch.mkdir()  # process's scratch files (a concurrent test, a killed run), which the check below counted
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    n, before = cache.cache_info()["compiles"], dict(diskcache.loaded_by)
    with warnings.catch_warnings():
        warnings.simplefilter("error", diskcache.DiskCacheWarning)
        loaded = registry.compiled(cfg)
    assert callable(loaded.fn) and cache.cache_info()["compiles"] == n
    assert diskcache.loaded_by[way] == before[way] + 1
    assert not list(scratch.glob("fa_variants-load-*"))  # the fallback's scratch removed


@pytest.mark.compile
def test_switched_off_nothing_is_written(cache_dir, monkeypatch):
    monkeypatch.setenv(diskcache.ENV_SWITCH, "0")
    cfg = _cfg(160)
    _forget(cfg)
    registry.compiled(cfg)
    assert not cache_dir.exists()


@pytest.mark.compile
@pytest.mark.slow  # two compiling processes at once (~30 s on 2 busy cores); CI runs it
def test_concurrent_processes_leave_one_whole_entry(cache_dir):
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "CUTE_DSL_ARCH": "sm_80", diskcache.ENV_DIR: str(cache_dir)}
    procs = [subprocess.Popen([sys.executable, "-c", FRESH_PROCESS, "192"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    cfg = _cfg(192)
    entries = list((cache_dir / diskcache.fingerprint()).iterdir())
    assert [p.name for p in entries] == [diskcache.entry_path(cfg).name]
    diskcache._parse(entries[0].read_bytes(), cfg)
    again = _python(FRESH_PROCESS, {diskcache.ENV_DIR: str(cache_dir)}, "192")
    assert json.loads(again.stdout.strip().splitlines()[-1])["disk_loads"] == 1


@pytest.mark.compile
def test_warmup_compiles_then_finds_on_disk(cache_dir, tmp_path, capsys):
    model = tmp_path / "config.json"
    model.write_text(json.dumps({"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
                                 "torch_dtype": "bfloat16"}), encoding="utf-8")
    argv = ["warmup", "--arch", "sm_80", "--backends", "testkernel,fa3", "--model", str(model), "--causal", "no",
            "--no-progress"]
    reports = []
    for _ in range(2):
        _forget(registry.static_config("testkernel", "sm_80", "bf16", 64, False))  # as a new process would
        assert cli.main(argv) == 0
        reports.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    first, second = reports
    assert [k["head_dim"] for k in first["kernels"]] == [64] and first["compiled"] == 1
    assert any("fa3" in s and "arch sm_80" in s for s in first["skipped"])  # fa3 is sm_90a only: a note
    assert second["on disk"] == 1 and second["compiled"] == 0
    assert Path(second["kernels"][0]["path"]).is_file()


@pytest.mark.compile
def test_warmup_jobs_compile_in_processes_side_by_side(cache_dir, capsys):
    """--jobs 2: two spawned processes compile the kernels into the disk cache (records in the plan's order); this
    process then finds both on disk."""
    argv = ["warmup", "--arch", "sm_80", "--backends", "testkernel", "--head-dims", "32,128", "--causal", "no",
            "--no-progress", "--jobs", "2"]
    assert cli.main(argv) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [k["head_dim"] for k in first["kernels"]] == [32, 128] and first["compiled"] == 2, first
    assert all(Path(k["path"]).is_file() for k in first["kernels"])
    for d in (32, 128):
        _forget(registry.static_config("testkernel", "sm_80", "bf16", d, False))
    assert cli.main(argv[:-2]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["on disk"] == 2 and second["compiled"] == 0, second


@pytest.mark.compile
def test_warmup_jobs_stop_at_the_first_compile_error(cache_dir):
    """--jobs: a compile that raises is raised to the caller, and the compiles still queued are dropped (before,
    every queued compile ran first)."""
    import dataclasses

    from fa_variants.commands import warmup
    from fa_variants.testkernel import TestKernelConfig

    good = [registry.static_config("testkernel", "sm_80", "bf16", d, False, TestKernelConfig(threads=t))
            for d in (32, 64, 128, 256) for t in (32, 64, 96)]
    bad = dataclasses.replace(good[0], head_dim=-5)
    with pytest.raises(Exception):
        warmup.warmup([bad, *good], progress=False, jobs=2)
    stored = [p for p in cache_dir.rglob("*") if p.is_file()]
    assert len(stored) < len(good), stored


def test_warmup_jobs_leave_an_interrupt_to_this_process(monkeypatch):
    """Ctrl-C reaches every process of the terminal's foreground group: each --jobs worker printed its own
    KeyboardInterrupt traceback (pages of DSL frames) above the command's one line. The workers ignore SIGINT (the
    kernel each compiles is finished and stored, as on a compile error); this process stops, as one line."""
    import concurrent.futures
    import signal

    from fa_variants.commands import warmup

    seen = {}

    class FakePool:  # runs nothing; keeps what the pool was built with
        def __init__(self, workers, mp_context=None, initializer=None):
            seen["initializer"] = initializer

        def submit(self, fn, cfg):
            future = concurrent.futures.Future()
            future.set_result({"head_dim": cfg.head_dim})
            return future

        def shutdown(self, wait=True, cancel_futures=False):
            pass

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", FakePool)
    configs = [registry.static_config("testkernel", "sm_80", "bf16", d, False) for d in (32, 64)]
    assert warmup.warmup(configs, progress=False, jobs=2) == [{"head_dim": 32}, {"head_dim": 64}]
    before = signal.getsignal(signal.SIGINT)
    try:
        seen["initializer"]()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_warmup_seqlens_k_skips_a_backend_that_does_not_load(monkeypatch):
    """--seqlens-k asks each backend for its lengths transform inside the per-backend guard: one that fails to
    import is skipped with a note, as without it."""
    from fa_variants.commands import warmup

    monkeypatch.setitem(registry._LOADED, "fa1", "fa1 failed to import (RuntimeError: boom)")
    for seqlens_k in (False, True):
        todo, notes = warmup.plan(["fa1", "fa2"], "sm_80", ["bf16"], [128], (True,), seqlens_k=seqlens_k)
        assert any("skipped fa1" in n for n in notes) and todo and all(c.variant != "fa1" for c in todo), notes


def test_warmup_jobs_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        cli.main(["warmup", "--arch", "sm_80", "--head-dims", "64", "--jobs", "0"])
    assert "--jobs: '0' must be in [1, 2^63 - 1]" in capsys.readouterr().err


@pytest.mark.parametrize("config, message", [
    ({"hidden_size": 64, "num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
    ({"hidden_size": 64, "num_attention_heads": -2}, "num_attention_heads must be a positive integer, got -2"),
    ({"head_dim": 64, "num_attention_heads": 2, "num_key_value_heads": 0.5},
     "num_key_value_heads must be a positive integer, got 0.5"),
    ({"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": [1]},
     "num_key_value_heads must be a positive integer, got [1]"),
    ({"hidden_size": 64, "num_attention_heads": True}, "num_attention_heads must be a positive integer, got True"),
    ({"hidden_size": 64, "num_attention_heads": 3}, "hidden_size 64 is not a multiple of num_attention_heads 3"),
    ({"head_dim": 64, "num_attention_heads": 6, "num_key_value_heads": 4},
     "num_attention_heads 6 is not a multiple of num_key_value_heads 4"),
    ({"num_attention_heads": 4}, "needs num_attention_heads and head_dim or hidden_size"),
])
def test_warmup_model_config_errors_are_one_line(tmp_path, capsys, config, message):
    """A config.json with heads that cannot be a model's: exit 2 and one line naming the field, no traceback."""
    model = tmp_path / "config.json"
    model.write_text(json.dumps(config), encoding="utf-8")
    assert cli.main(["warmup", "--arch", "sm_90a", "--model", str(model)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_warmup_needs_an_arch_without_a_gpu(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["warmup", "--head-dims", "64"]) == 2
    assert "give --arch" in capsys.readouterr().err
    assert cli.main(["warmup", "--arch", "sm_90a"]) == 2
    assert "--head-dims or --model" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "e4m3"])
def test_warmup_plans_the_fp8_kernel_a_call_looks_up(monkeypatch, dtype):
    """fa3-fp8 on 16-bit inputs runs the e4m3 kernel writing O in their dtype: warmup plans the key that
    ``hopper.fa3_fp8._compiled_kernel`` looks up (dtype e4m3, out_dtype the inputs'), as e4m3 inputs (out bf16)
    do, at head_dim 64 / 128 / 256, causal and not (stubbed sm_90 device, the compile recorded)."""
    import torch

    from fa_variants.commands import warmup
    from fa_variants.common.interop import TORCH_DTYPES
    from fa_variants.hopper import fa3_fp8

    monkeypatch.setattr(fa3_fp8, "PERSISTENT", True)  # the default (FA_VARIANTS_FP8_PERSISTENT): 4 persistent kernels
    looked_up = []

    class Recorder:
        def __init__(self, cfg):
            looked_up.append(cfg)
            self.fn = None

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    object.__setattr__(fa3_fp8.VARIANT, "compiled", Recorder)  # a frozen dataclass: its method shadowed, then restored
    try:
        for d in (64, 128, 256):
            for causal in (False, True):
                out_dtype = torch.bfloat16 if dtype == "e4m3" else TORCH_DTYPES[dtype]
                for config in (fa3_fp8.DEFAULT_CONFIGS[d], *fa3_fp8._warm_configs("sm_90a", d, causal)):
                    fa3_fp8._compiled_kernel.__wrapped__(torch.device("cuda", 0), d, causal, out_dtype, config)
    finally:
        object.__delattr__(fa3_fp8.VARIANT, "compiled")
    planned, notes = warmup.plan(["fa3-fp8"], "sm_90a", [dtype], [64, 128, 256], (False, True))
    assert not notes and [c for c in planned if c.variant == "fa3-fp8"] == looked_up
    assert sum(c.config.persistent for c in looked_up) == 4  # the short calls' grids at 64 and 128 (call_config)


def test_warmup_plans_fa3s_split_config_too(monkeypatch):
    """A decode call may switch fa3 to its split-KV config (Variant.warm_configs): warmup compiles it as well."""
    from fa_variants.commands import warmup
    from fa_variants.hopper import fa3

    def plan():  # fa3's kernels (the split merge kernels after them: test_warmup_plans_the_merge_kernels)
        planned, notes = warmup.plan(["fa3"], "sm_90a", ["bf16"], [128], (True,))
        return [c for c in planned if c.variant == "fa3"], notes

    monkeypatch.setattr(fa3, "SPLIT_KV_ENABLED", True)
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", False)
    monkeypatch.setattr(fa3, "DECODE_FIRST_ROW", False)  # its kernels: the end of this test
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K", 0)  # short seqlen_k's persistent grid: the end of this test
    configs, notes = plan()
    assert not notes and [c.config.num_splits for c in configs] == [1, 0]
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", True)  # packed GQA (decode), unsplit and split, too
    configs, _ = plan()
    assert [(c.config.num_splits, c.config.pack_gqa, c.config.pdl, c.config.ctas_per_sm) for c in configs] == [
        (1, False, False, 1), (0, False, False, 1), (1, True, False, 1), (0, True, False, 1), (1, True, True, 1),
        (1, True, True, 2), (0, True, True, 1), (0, True, True, 2), (0, True, False, 2)]
    # PDL unsplit (DECODE_PDL_MIN_SPLITS 1 since session 10) and at 2-8 splits; dual tiles (DECODE_TILES auto)
    monkeypatch.setattr(fa3, "DECODE_TILES_CHOICE", "base")  # base tiles only: no two-CTA configs
    configs, _ = plan()
    assert [(c.config.num_splits, c.config.pack_gqa, c.config.pdl) for c in configs] == [
        (1, False, False), (0, False, False), (1, True, False), (0, True, False), (1, True, True), (0, True, True)]
    monkeypatch.setattr(fa3, "DECODE_FIRST_ROW", True)  # the default: each packed decode config also with first_row_only
    with_first = plan()[0]
    plain = [c.config for c in with_first if not c.config.first_row_only]
    first = [c.config for c in with_first if c.config.first_row_only]
    assert plain == [c.config for c in configs]
    # seqlen_q-1 calls unsplit launch with PDL since session 10: the unsplit packed config without it serves seqlen_q > 1
    # only, so it has no first-row twin
    assert first and {dataclasses.replace(c, first_row_only=False) for c in first} == {
        c for c in plain if c.pack_gqa and not (c.num_splits == 1 and not c.pdl)}
    monkeypatch.setattr(fa3, "SPLIT_KV_ENABLED", False)
    monkeypatch.setattr(fa3, "PACK_GQA_ENABLED", False)
    assert len(plan()[0]) == 1
    # FA_VARIANTS_SHORT_PERSISTENT (3072 by default): short seqlen_k's persistent grid right after the default, and
    # (FA_VARIANTS_SHORT_BALANCED, on by default) the same with its causal tiles dealt by load
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K", 3072)
    monkeypatch.setattr(fa3, "SHORT_MAX_SEQLEN_K_CAUSAL", 1536)
    monkeypatch.setattr(fa3, "SHORT_BALANCED", True)
    short = fa3._SHORT_CONFIGS[128, True]
    assert [c.config for c in plan()[0]] == [
        fa3.DEFAULT_CONFIGS[128], short, dataclasses.replace(short, balanced=True)]
    monkeypatch.setattr(fa3, "SHORT_BALANCED", False)
    assert [c.config for c in plan()[0]] == [
        fa3.DEFAULT_CONFIGS[128], short]


def test_prune_deletes_only_directories_the_cache_wrote(cache_dir, tmp_path):
    """`fa-variants warmup --prune` (diskcache.prune): an old fingerprint directory of entries and store's temporary
    files goes; the current one stays; so does everything the cache did not write, when FA_VARIANTS_CACHE_DIR names a
    directory that holds other things (session 28's break-it pass: it deleted a project and a .git folder there):
    other folders, a 16-hex-digit folder holding a foreign file, a symbolic link to an old-looking folder, files."""
    current = cache_dir / diskcache.fingerprint()
    old = cache_dir / ("0123456789abcdef" if diskcache.fingerprint() != "0123456789abcdef" else "fedcba9876543210")
    foreign = cache_dir / "00000000deadbeef"
    for d in (current, old, foreign, cache_dir / "projectA" / "src", cache_dir / ".git", old / ".export-x1"):
        d.mkdir(parents=True, exist_ok=True)
    (current / "fa3-sm_90a-bf16-d128-0011223344556677.kernel").write_bytes(b"entry")
    (old / "fa3-sm_90a-bf16-d128-0011223344556677.kernel").write_bytes(b"entry")
    (old / ".fa3-sm_90a-bf16-d128-0011223344556677.kernel.abc123.tmp").write_bytes(b"half")
    (old / ".load-xyz.so").write_bytes(b"so")
    (foreign / "notes.txt").write_text("mine", encoding="utf-8")
    (foreign / "a.kernel").write_bytes(b"entry")
    (cache_dir / "projectA" / "src" / "main.py").write_text("print(1)", encoding="utf-8")
    (cache_dir / ".git" / "HEAD").write_text("ref: refs/heads/main", encoding="utf-8")
    (cache_dir / "README").write_text("mine", encoding="utf-8")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "b.kernel").write_bytes(b"entry")
    (cache_dir / "aaaaaaaaaaaaaaaa").symlink_to(target, target_is_directory=True)
    before = sorted(p.relative_to(cache_dir) for p in cache_dir.rglob("*") if not p.is_relative_to(old))

    assert diskcache.prune() == [old]
    assert not old.exists()
    assert sorted(p.relative_to(cache_dir) for p in cache_dir.rglob("*")) == before
    assert (target / "b.kernel").read_bytes() == b"entry"
    assert diskcache.prune() == []


def test_prune_looks_inside_scratch_folders(cache_dir):
    """A fingerprint-named folder of entries whose '.export-*' / '.load-*' folder holds something the cache never
    writes there (it writes kernel.o and kernel.so only) is not the cache's: prune judged the top level only and
    deleted such a folder with whatever it held."""
    old, other = cache_dir / "0123456789abcdef", cache_dir / "fedcba9876543210"
    # a review finding: a folder named like store's unrenamed file, and a file named like store's scratch folder
    third, fourth = cache_dir / "00000000000000aa", cache_dir / "00000000000000bb"
    for d in (old / ".export-a1", other / ".load-b2" / "deeper", third / ".x.kernel.abc.tmp" / "project", fourth):
        d.mkdir(parents=True)
    (old / ".export-a1" / "kernel.o").write_bytes(b"object")
    (old / ".export-a1" / "kernel.so").write_bytes(b"library")
    (old / ".load-c3.so").write_bytes(b"library")  # _load_shared's scratch file
    (other / ".load-b2" / "deeper" / "notes.txt").write_text("mine", encoding="utf-8")
    (third / ".x.kernel.abc.tmp" / "project" / "thesis.tex").write_text("mine", encoding="utf-8")
    (fourth / ".export-mydb.sqlite").write_text("mine", encoding="utf-8")
    for d in (old, other, third, fourth):
        (d / "x.kernel").write_bytes(b"entry")
    assert diskcache.prune() == [old]
    assert (other / ".load-b2" / "deeper" / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert (third / ".x.kernel.abc.tmp" / "project" / "thesis.tex").read_text(encoding="utf-8") == "mine"
    assert (fourth / ".export-mydb.sqlite").read_text(encoding="utf-8") == "mine"


def test_a_bad_loader_switch_is_an_error_not_a_corrupt_entry(cache_dir, monkeypatch):
    """FA_VARIANTS_DISK_CACHE_LOADER other than auto / dsl: ValueError naming it from diskcache.load (before any
    entry is read), so `fa-variants warmup` exits 2 with one line; before session 28 it was taken for a corrupt entry
    (a DiskCacheWarning) and the entry was recompiled and overwritten."""
    import warnings

    monkeypatch.setenv(diskcache.ENV_LOADER, "bogus")
    with warnings.catch_warnings():
        warnings.simplefilter("error", diskcache.DiskCacheWarning)
        with pytest.raises(ValueError, match=diskcache.ENV_LOADER):
            diskcache.load(_cfg(96))
    for good in ("auto", "dsl"):
        monkeypatch.setenv(diskcache.ENV_LOADER, good)
        assert diskcache.loader() == good and diskcache.load(_cfg(96)) is None  # no entry: None, no warning


def test_prune_skips_a_folder_it_cannot_read(cache_dir, monkeypatch):
    """A fingerprint-named folder prune cannot list (another user's, mode 700, in a shared root) is left alone and
    the others are still pruned; it raised PermissionError and stopped `warmup --prune` (session 28's review)."""
    unreadable, old = cache_dir / "aaaaaaaaaaaaaaaa", cache_dir / "bbbbbbbbbbbbbbbb"
    for d in (unreadable, old):
        d.mkdir(parents=True)
        (d / "x.kernel").write_bytes(b"entry")
    real_iterdir = Path.iterdir

    def iterdir(self):
        if self == unreadable:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    assert diskcache.prune() == [old] and unreadable.exists()


def test_the_fingerprint_follows_the_dsls_compile_switches(monkeypatch):
    """A CuTe DSL variable that changes what it compiles (CUTE_DSL_LINEINFO, _DEBUG, _ENABLE_ASSERTIONS, ...) starts
    another fingerprint, so a line-info or debug build is never served to a process without it, nor the reverse
    (session 35's break-it pass: same key, different object and cubin); CUTE_DSL_ARCH (overridden by every compile's
    explicit --gpu-arch) and unrelated variables do not."""
    def fingerprint():
        diskcache.fingerprint.cache_clear()
        try:
            return diskcache.fingerprint()
        finally:
            diskcache.fingerprint.cache_clear()

    for name in diskcache.DSL_COMPILE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    plain = fingerprint()
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.setenv("CUTE_DSL_LOG_LEVEL", "10")
    assert fingerprint() == plain
    seen = {plain}
    for name, value in (("CUTE_DSL_LINEINFO", "1"), ("CUTE_DSL_DEBUG", "1"), ("CUTE_DSL_ENABLE_ASSERTIONS", "1")):
        monkeypatch.setenv(name, value)
        seen.add(fingerprint())
        monkeypatch.delenv(name)
    assert len(seen) == 4 and fingerprint() == plain


def test_the_fingerprint_skips_an_editors_lock_link(monkeypatch, tmp_path):
    """A dangling hidden link beside the kernel sources (Emacs' .#fa2_kernel.py) is no source: the fingerprint is
    the same and nothing raises (it turned the disk cache off, and warmup failed with a raw errno)."""
    package = tmp_path / "pkg" / "fa_variants"
    shutil.copytree(ROOT / "fa_variants", package, ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from fa_variants.common import diskcache; "
            "print(diskcache.fingerprint())")
    first = _python(code, {}, str(package.parent))
    (package / "ampere" / ".#fa2_kernel.py").symlink_to("user@host.1:1")
    second = _python(code, {}, str(package.parent))
    assert first.returncode == second.returncode == 0, second.stderr[-2000:]
    assert first.stdout == second.stdout and len(first.stdout.strip()) == 16


def test_a_kernel_compiled_after_its_sources_changed_is_not_stored(cache_dir, monkeypatch):
    """The fingerprint is taken at the process's first use; a kernel module imported after an edit would have been
    stored under the old sources' fingerprint (and served to fresh processes once the edit was undone): `store`
    checks the sources again and skips the entry, with a warning, counted in cache_info()["store_failures"]."""
    cfg = _cfg(320)
    _forget(cfg)
    diskcache.fingerprint()
    monkeypatch.setattr(diskcache, "_fingerprint_now", lambda: "0" * 16)
    before = cache.cache_info()["store_failures"]
    with pytest.warns(diskcache.DiskCacheWarning, match="the kernel sources changed since this process first used"):
        registry.compiled(cfg)
    assert not diskcache.entry_path(cfg).exists() and cache.cache_info()["store_failures"] == before + 1


def test_warmup_reports_a_failed_store_over_a_bad_entry(cache_dir, monkeypatch, capsys):
    """A kernel warmup compiled but could not store (a read-only or full cache) is "not stored", exit 2, even where
    a file already sits at its path (a corrupt entry it meant to replace: is_file() took it for the stored one)."""
    cfg = registry.static_config("testkernel", "sm_80", "bf16", 64, False)
    _forget(cfg)
    path = diskcache.entry_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not an entry")

    def failing_store(*args, **kwargs):
        diskcache.store_failures += 1
        return None

    monkeypatch.setattr(diskcache, "store", failing_store)
    code = cli.main(["warmup", "--arch", "sm_80", "--backends", "testkernel", "--head-dims", "64", "--causal",
                     "no", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 2 and "were not written to the disk cache" in captured.err
    assert "fa-variants warmup: warning: unusable compile cache entry" in captured.err  # the DiskCacheWarning
    report = json.loads(captured.out.strip().splitlines()[-1])
    assert report["not stored"] == 1 and report["kernels"][0]["how"] == "not stored"


def test_a_relative_cache_directory_is_made_absolute(monkeypatch, tmp_path):
    """FA_VARIANTS_CACHE_DIR=kernels: the directory under the working directory, as an absolute path (what warmup
    prints and a later process can find)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(diskcache.ENV_DIR, "kernels")
    assert diskcache.root() == tmp_path / "kernels" and diskcache.root().is_absolute()


@pytest.mark.compile
def test_warmup_says_when_its_entries_have_no_shared_library(cache_dir, monkeypatch, capsys):
    """Stored without a shared library (no C compiler, a failed link), an entry loads through the DSL in every new
    process (~2 s of a first call): warmup says so in one note line with the link's reason, and still exits 0
    (session 35's break-it pass: nothing was said)."""
    cfg = registry.static_config("testkernel", "sm_80", "bf16", 64, False)
    _forget(cfg)
    monkeypatch.setattr(diskcache, "link_shared", lambda obj, so: (b"", "no C compiler (test)"))
    argv = ["warmup", "--arch", "sm_80", "--backends", "testkernel", "--head-dims", "64", "--causal", "no",
            "--no-progress"]
    path = diskcache.entry_path(cfg)
    if path.exists():
        path.unlink()
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "note: 1 of 1 kernels have no shared library (no C compiler (test))" in err and err.count("\n") == 1
    assert diskcache.library_note(cfg) == "no C compiler (test)"
