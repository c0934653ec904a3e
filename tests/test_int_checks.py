"""One integer rule for every public entry (fa_variants.common.checks.is_int): a Python int or a numpy integer is
accepted (and stored as a Python int), a bool is refused with the entry's own error text. CPU only."""
import dataclasses

import numpy as np
import pytest
import torch

from fa_variants import distributed, emulate
from fa_variants.common.checks import is_int, is_real
from fa_variants.common.config import Sm80Config, Sm90Config
from fa_variants.common.split import check_options
from fa_variants.fp8 import contract
from fa_variants.fp8.quantize import FP8Config, quantize_fp8_torch


def test_is_int():
    for value in (0, 3, -2, 2**70, np.int64(3), np.int32(-1), np.uint8(7)):
        assert is_int(value), value
    for value in (True, False, np.bool_(True), 3.0, np.float64(3), "3", None, torch.tensor(3)):
        assert not is_int(value), value


def test_is_real():
    """The real-number rule (softmax_scale, fp8_error_bound's atol): numbers.Real, never a bool."""
    from fa_variants.common.scale import check_softmax_scale
    from fa_variants.fp8.emulation import fp8_error_bound

    for value in (0, 3, -2.5, float("inf"), np.float32(0.5), np.int64(2)):
        assert is_real(value), value
    for value in (True, np.bool_(False), "1.0", None, 1j, torch.tensor(1.0)):
        assert not is_real(value), value
    with pytest.raises(TypeError, match="softmax_scale must be a real number"):
        check_softmax_scale(True)
    out = torch.zeros(2, 3)
    with pytest.raises(TypeError, match="atol must be a real number"):
        fp8_error_bound(out, out, atol=True)
    assert fp8_error_bound(out, out, atol=np.float32(0.25)) == 0.25


@pytest.mark.parametrize("shard", [distributed.contiguous_shard, distributed.zigzag_shard])
def test_shard_numpy_int_and_bool(shard):
    x = torch.arange(24.0).reshape(2, 12)
    assert torch.equal(shard(x, np.int64(1), np.int32(1), np.int64(3)), shard(x, 1, 1, 3))
    for name, args in (("dim", (True, 0, 2)), ("rank", (1, False, 2)), ("world", (1, 0, True))):
        with pytest.raises(TypeError, match=f"{name} must be an int, got (True|False)"):
            shard(x, *args)


def test_unshard_numpy_int_and_bool():
    x = torch.arange(12.0)
    shards = [distributed.contiguous_shard(x, 0, r, 3) for r in range(3)]
    assert torch.equal(distributed.contiguous_unshard(shards, np.int64(0)), x)
    with pytest.raises(TypeError, match="dim must be an int, got False"):
        distributed.contiguous_unshard(shards, False)


def test_config_numpy_int_and_bool():
    cfg = Sm80Config(128, 32, num_splits=np.int64(2)).check("sm_80", 128)
    assert cfg.num_splits == 2 and type(cfg.num_splits) is int
    with pytest.raises(ValueError, match="num_splits=True must be an int >= 0"):
        Sm80Config(128, 32, num_splits=True).check("sm_80", 128)
    cfg = Sm90Config(num_splits=np.int64(2)).check(128)
    assert cfg.num_splits == 2 and type(cfg.num_splits) is int
    with pytest.raises(ValueError, match="num_splits=True must be an int >= 0"):  # was accepted as 1
        Sm90Config(num_splits=True).check(128)
    with pytest.raises(ValueError, match="pack_group=True must be 0, or an int >= 1"):  # was accepted as 1
        Sm90Config(pack_gqa=True, pack_group=True).check(128)
    cfg = Sm90Config(pack_gqa=True, pack_group=np.int64(4)).check(128)
    assert cfg.pack_group == 4 and type(cfg.pack_group) is int


def test_split_options_numpy_int_and_bool():
    assert check_options(np.int64(3), None) == 3 and type(check_options(np.int64(3), None)) is int
    with pytest.raises(TypeError, match="num_splits must be an int >= 1 or None"):
        check_options(True, None)


def test_emulate_tile_sizes_numpy_int_and_bool():
    q, k, v = torch.randn(1, 8, 1, 16), torch.randn(1, 8, 1, 16), torch.randn(1, 8, 1, 16)
    got = emulate.flash_attention_2(q, k, v, Br=np.int64(4), Bc=np.int32(4))
    want = emulate.flash_attention_2(q, k, v, Br=4, Bc=4)
    assert torch.equal(got.out, want.out) and got.hbm.reads == want.hbm.reads
    with pytest.raises(TypeError, match="Br must be an int, got True"):
        emulate.flash_attention_2(q, k, v, Br=True, Bc=4)


def test_fp8_numpy_int_and_bool():
    assert type(FP8Config(seed=np.int64(5)).seed) is int
    with pytest.raises(TypeError, match="FP8Config.seed must be an int, got True"):
        FP8Config(seed=True)
    contract.check_tile_m(np.int64(64))
    contract.check_accumulator_bits(np.int32(13))
    with pytest.raises(TypeError, match="tile_m must be an int or None, got True"):
        contract.check_tile_m(True)
    q, k, v = torch.randn(1, 64, 2, 64), torch.randn(1, 96, 2, 64), torch.randn(1, 96, 2, 64)
    inp = quantize_fp8_torch(q, k, v, block_n=np.int64(64))  # newly accepted (was ValueError)
    assert inp.block_n == 64 and type(inp.block_n) is int
    with pytest.raises(ValueError, match="block_n must be a positive multiple of"):
        quantize_fp8_torch(q, k, v, block_n=True)
    inp = dataclasses.replace(inp, block_m=np.int64(inp.block_m))  # newly accepted (was ValueError)
    assert type(inp.block_m) is int
    with pytest.raises(ValueError, match="FP8Inputs.block_m must be a positive int, got True"):
        dataclasses.replace(inp, block_m=True)


def test_free_bytes_reads_the_device_it_can():
    """checks.free_bytes: the CPU's from /proc/meminfo, else os.sysconf; None for a device it cannot read (nothing is
    then refused early); allocating(nbytes=...) refuses a need past it before running its block."""
    from fa_variants.common import checks

    cpu = checks.free_bytes("cpu")
    assert isinstance(cpu, int) and cpu > 0 and checks.free_bytes("meta") is None
    ran = []
    with pytest.raises(ValueError, match=r"^cannot allocate x \(needs .* GiB, cpu has .* GiB free\); smaller$"):
        with checks.allocating("x", "smaller", nbytes=cpu * 4 + 2**40):
            ran.append(True)
    assert not ran
    with checks.allocating("x", "smaller", nbytes=1):
        ran.append(True)
    assert ran


def test_free_bytes_without_proc_meminfo(monkeypatch):
    """Where /proc/meminfo cannot be read or has no MemAvailable (not Linux, an old kernel): None, nothing refused
    early (MemFree alone, without the page cache the kernel can drop, would refuse what fits)."""
    import io

    from fa_variants.common import checks

    def no_file(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr(checks, "open", no_file, raising=False)
    assert checks.free_bytes("cpu") is None
    monkeypatch.setattr(checks, "open", lambda *a, **k: io.StringIO("MemTotal: 100 kB\nMemFree: 50 kB\n"),
                        raising=False)
    assert checks.free_bytes("cpu") is None


@pytest.mark.parametrize("version", ["v2", "v1", "v2-max", "v1-unlimited"])
def test_free_bytes_is_capped_by_the_cgroup_limit(monkeypatch, version):
    """In a container /proc/meminfo shows the host's memory; the cgroup's limit ends the process first (the fault
    the pre-check exists for): the room under it caps free_bytes, inactive page cache counted as room."""
    import io

    from fa_variants.common import checks

    gib = 2**30
    files = {"/proc/meminfo": f"MemTotal: {256 * gib // 1024} kB\nMemAvailable: {200 * gib // 1024} kB\n"
                              "SwapFree: 0 kB\n"}
    if version.startswith("v2"):
        files["/proc/self/cgroup"] = "0::/job\n"
        files["/sys/fs/cgroup/job/memory.max"] = "max\n" if version == "v2-max" else f"{8 * gib}\n"
        files["/sys/fs/cgroup/job/memory.current"] = f"{5 * gib}\n"
        files["/sys/fs/cgroup/job/memory.stat"] = f"anon 1\ninactive_file {gib}\n"
    else:
        files["/proc/self/cgroup"] = "9:cpu,cpuacct:/job\n4:memory:/job\n"
        limit = 2**63 - 4096 if version == "v1-unlimited" else 8 * gib
        files["/sys/fs/cgroup/memory/job/memory.limit_in_bytes"] = f"{limit}\n"
        files["/sys/fs/cgroup/memory/job/memory.usage_in_bytes"] = f"{5 * gib}\n"
        files["/sys/fs/cgroup/memory/job/memory.stat"] = f"total_inactive_file {gib}\n"

    def fake_open(path, *args, **kwargs):
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(checks, "open", fake_open, raising=False)
    expected = 200 * gib if version in ("v2-max", "v1-unlimited") else 4 * gib
    assert checks.free_bytes("cpu") == expected


def test_free_bytes_of_a_cuda_device_that_cannot_answer(monkeypatch):
    """mem_get_info's RuntimeError (a busy or exclusive-mode device) is None, not a traceback: the allocation itself
    then says what is wrong, in one line (checks.allocating)."""
    from fa_variants.common import checks

    def busy(device=None):
        raise RuntimeError("CUDA error: all CUDA-capable devices are busy or unavailable")

    monkeypatch.setattr(torch.cuda, "mem_get_info", busy)
    assert checks.free_bytes("cuda") is None and checks.free_bytes("meta") is None


def test_allocating_turns_a_failed_allocation_into_one_line(monkeypatch):
    """checks.allocating: a RuntimeError or MemoryError inside the block (torch's out of memory, a size overflow)
    is a ValueError naming what was allocated, its first line only; a need of exactly the free bytes fits, one byte
    more is refused before the block runs."""
    from fa_variants.common import checks

    for error in (RuntimeError("CUDA out of memory.\nTried to allocate 2 GiB"), MemoryError()):
        with pytest.raises(ValueError) as info:
            with checks.allocating("the inputs", "pass smaller sizes"):
                raise error
        first = str(error).splitlines()[0] if str(error) else "MemoryError"
        assert str(info.value) == f"cannot allocate the inputs ({first}); pass smaller sizes"
    with pytest.raises(TypeError):  # anything else passes through as it is
        with checks.allocating("the inputs", "hint"):
            raise TypeError("not an allocation")
    monkeypatch.setattr(checks, "free_bytes", lambda device="cpu": 1000)
    ran = []
    with checks.allocating("x", "smaller", nbytes=1000):
        ran.append(True)
    with pytest.raises(ValueError, match=r"^cannot allocate x \(needs .*, cpu has .* free\); smaller$"):
        with checks.allocating("x", "smaller", nbytes=1001):
            ran.append(False)
    assert ran == [True]


def test_one_line_shows_a_rejected_argument_on_one_short_line():
    """checks.one_line: a repr of up to `limit` characters as it is, a longer one cut with its type named; a tensor or
    numpy array of one or more dimensions by its kind, shape and dtype; a 0-d one by its (short) repr; a broken
    __repr__ named, not raised."""
    from fa_variants.common.checks import one_line

    assert one_line("x" * 78) == repr("x" * 78)  # 80 characters with the quotes
    assert one_line("x" * 79) == repr("x" * 79)[:80] + "... (str)"
    assert one_line([1,
                     2]) == "[1, 2]"
    assert one_line(torch.zeros(2, 3)) == "a tensor of shape (2, 3) and dtype torch.float32"
    assert one_line(np.zeros((4,), dtype=np.int16)) == "a numpy array of shape (4,) and dtype int16"
    assert one_line(torch.tensor(0.5)) == "tensor(0.5000)"
    assert one_line(np.float32(0.5)) == repr(np.float32(0.5))

    class Broken:
        def __repr__(self):
            raise KeyError("no repr")

    assert one_line(Broken()) == "<Broken: repr failed (KeyError)>"
