"""Compile-only path (no GPU): `fa-variants compile`, the variant registry and the compile cache.

Every compile is cached per process (fa_variants.common.cache), so each configuration below is
built once per pytest session however many tests read it.
"""
import dataclasses

import pytest

from fa_variants import cli, registry
from fa_variants.commands.compile import compile_only
from fa_variants.common import cache, cubin

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_cli_testkernel(compile_cli, arch):
    r = compile_cli("--arch", arch, "--variant", "testkernel", "--head-dim", "64",
                  "--dtype", "bf16", "--sass")
    assert r["variant"] == "testkernel" and r["arch"] == arch
    assert r["compile_s"] > 0
    assert 0 < r["registers"] <= 255
    assert r["smem_bytes"] == 0 and r["spill_bytes"] == 0
    for op in cubin.SASS_OPCODES:
        assert isinstance(r[op], int)
    assert r["HMMA"] == 0 and r["LDL"] == 0 and r["STL"] == 0


def test_missing_or_old_nvdisasm_is_one_line(monkeypatch):
    """A machine whose only nvdisasm is an old CUDA toolkit's (session 48's GPU host: 13.0, the DSL needs >= 13.4)
    gets one line naming the extra and the DSL's reason, not the DSL's multi-line coloured report."""
    from cutlass.base_dsl import env_manager
    from cutlass.base_dsl.common import DSLUserCodeError

    def old(*_):
        raise DSLUserCodeError("nvdisasm at '/usr/local/cuda/bin/nvdisasm' reports version 13.0, which is not\n"
                               "supported for SASS dumping.", suggestion="pip install nvidia-cutlass-dsl[sass]")
    monkeypatch.setattr(env_manager, "_find_nvdisasm_binary", old)
    with pytest.raises(ImportError) as err:
        cubin._nvdisasm()
    msg = str(err.value)
    assert "\n" not in msg and "\x1b" not in msg and "fa-variants[sass]" in msg and "version 13.0" in msg, msg


def test_without_sass_the_sass_tests_skip_only_when_asked(tmp_path):
    """tests/conftest.py: a test stopped by cubin's missing-nvdisasm error is SKIPPED with
    FA_VARIANTS_TESTS_WITHOUT_SASS set (the GPU host's CPU-test halves) and FAILS without it (CI must run the SASS
    checks); other errors fail either way. Run in a child pytest over copies of conftest.py and helpers.py."""
    import shutil
    import subprocess
    import sys

    from helpers import ROOT, subprocess_env

    for name in ("conftest.py", "helpers.py"):
        shutil.copy(ROOT / "tests" / name, tmp_path / name)
    (tmp_path / "test_probe.py").write_text(
        "def test_sass():\n    raise ImportError(\"--sass needs nvdisasm, from the [sass] extra (not found)\")\n\n"
        "def test_other():\n    raise ImportError(\"something else\")\n", encoding="utf-8")
    for optout, want in (("1", "1 failed, 1 skipped"), ("", "2 failed")):
        env = subprocess_env(FA_VARIANTS_TESTS_WITHOUT_SASS=optout)
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                              "-rs", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert want in run.stdout, run.stdout[-2000:]
        assert ("no usable nvdisasm" in run.stdout) == bool(optout), run.stdout[-2000:]


def test_sass_counter_sees_instructions():
    c = registry.compiled(registry.static_config("testkernel", "sm_80", "bf16", 64, False))
    counts = cubin.count_sass(cubin.sass_of(c.cubin), ("LDG", "STG", "EXIT"))
    assert counts["LDG"] >= 2 and counts["STG"] >= 2 and counts["EXIT"] >= 1


@pytest.mark.parametrize("name", ["no-such-kernel", "reference"])
def test_unknown_variant_is_rejected(capsys, name):
    """argparse's error (exit 2, "error:"), listing only the variants it compiles (not the plain-PyTorch one)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["compile", "--arch", "sm_80", "--variant", name, "--head-dim", "64", "--dtype", "bf16"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2
    assert err.startswith("fa-variants compile: error:") and name in err and "'testkernel'" in err
    assert "'reference'" not in err.split("choose from", 1)[1]  # names only the compilable variants
    with pytest.raises(registry.UnknownVariantError, match="known variants"):
        registry.static_config("no-such-kernel", "sm_80", "bf16", 64, False)


def test_unsupported_head_dim_is_rejected():
    with pytest.raises(registry.UnsupportedConfigError, match="head_dim 65"):
        registry.static_config("testkernel", "sm_80", "bf16", 65, False)


def test_cache_key_is_static_only():
    fields = {f.name for f in dataclasses.fields(cache.StaticConfig)}
    assert fields == {"variant", "arch", "dtype", "head_dim", "causal", "config", "align"}
    cfg = registry.static_config("testkernel", "sm_80", "bf16", 64, False)
    first = registry.compiled(cfg)
    n = cache.cache_info()["compiles"]
    again = registry.compiled(registry.static_config("testkernel", "sm_80", "bf16", 64, False))
    assert again is first and cache.cache_info()["compiles"] == n  # no recompile
    other = registry.compiled(registry.static_config("testkernel", "sm_80", "bf16", 64, True))
    assert other is not first and cache.cache_info()["compiles"] == n + 1


def test_fake_shapes_are_dynamic():
    """Batch, sequence lengths and heads are symbols, so a different seqlen cannot recompile."""
    from cutlass.cute.typing import SymInt

    from fa_variants.common import interop

    q, k, v, o, lse, _scale, _stream = interop.fake_attention_args("bf16", 128)
    for t in (q, k, v, o):
        assert all(isinstance(s, SymInt) for s in t.shape[:3]) and t.shape[3] == 128
        assert all(isinstance(s, SymInt) for s in t.stride[:3]) and t.stride[3] == 1
    assert q.shape[0] is k.shape[0] and k.shape[1] is v.shape[1] and q.shape[1] is lse.shape[2]


# ------------------------------------------------------------------------------------------------ FA2
@pytest.fixture(scope="session")
def fa2_report():
    """`fa-variants compile --arch sm_80 --variant fa2 --head-dim 128 --dtype bf16 --sass`, once."""
    return compile_only("fa2", "sm_80", 128, "bf16", causal=False, sass=True)


def test_fa2_cli_reports_tensor_cores_and_no_spills(compile_cli, fa2_report):
    r = compile_cli("--arch", "sm_80", "--variant", "fa2", "--head-dim", "128", "--dtype", "bf16",
                  "--sass")  # served by the cache: same config as the fixture
    assert r == fa2_report
    assert r["HMMA"] > 0 and r["LDGSTS"] > 0 and r["LDSM"] > 0 and r["MUFU.EX2"] > 0
    assert r["LDL"] == 0 and r["STL"] == 0 and r["spill_bytes"] == 0
    assert r["HGMMA"] == 0 and r["UTMALDG"] == 0  # an sm80 kernel: no Hopper instructions
    tiles = r["tiles"]
    q_kv = (tiles["tile_m"] + 2 * tiles["stages"] * tiles["tile_n"]) * 128 * 2
    assert tiles["stages"] >= 2 and r["smem_dynamic_bytes"] >= q_kv  # K/V double-buffered


@pytest.mark.parametrize("head_dim", [64])
def test_fa2_causal_compiles_without_spills(head_dim):
    r = compile_only("fa2", "sm_80", head_dim, "fp16", causal=True, sass=True)
    assert r["HMMA"] > 0 and r["LDL"] == 0 and r["STL"] == 0 and r["spill_bytes"] == 0


def test_fa2_sm90a_compiles(fa2_report):
    """The H200 runs the sm80 kernel compiled for sm_90a: still mma.sync (HMMA), no spills."""
    r = compile_only("fa2", "sm_90a", 128, "bf16", causal=False, sass=True)
    assert r["HMMA"] == fa2_report["HMMA"] and r["HGMMA"] == 0 and r["spill_bytes"] == 0


@pytest.mark.parametrize("arch", ["sm_100a", "sm_120a"])
def test_fa2_compiles_for_newer_gpus(arch):
    """A GPU newer than the dispatch table (sm_100, sm_120) is served by fa2 (dispatch.NEWER_GPU_BACKENDS):
    its sm80 code (mma.sync, cp.async, ldmatrix) compiles for those targets with the DSL, without spills."""
    r = compile_only("fa2", arch, 128, "bf16", causal=True, sass=True)
    assert r["arch"] == arch and r["HMMA"] > 0 and r["LDGSTS"] > 0 and r["HGMMA"] == 0
    assert r["LDL"] == 0 and r["STL"] == 0 and r["spill_bytes"] == 0


def test_fa2_cache_does_not_recompile_for_runtime_shapes(fa2_report):
    cfg = registry.static_config("fa2", "sm_80", "bf16", 128, False)
    n = cache.cache_info()["compiles"]
    assert registry.compiled(cfg) is registry.compiled(registry.static_config("fa2", "sm_80", "bf16", 128, False))
    assert cache.cache_info()["compiles"] == n
    with pytest.raises(registry.UnsupportedConfigError, match="head_dim 80"):
        registry.static_config("fa2", "sm_80", "bf16", 80, False)


def test_fa2_tile_ranges():
    """Causal tile skipping and masking bounds (common/mask.py) on plain ints, against brute force."""
    from fa_variants.common.mask import BlockInfo

    for Br, Bc in ((128, 32), (128, 64), (64, 64)):
        causal, full_range = BlockInfo(Br, Bc, True), BlockInfo(Br, Bc, False)
        for nq, nk in ((1, 1), (3, 7), (300, 128), (113, 203), (128, 1023), (1000, 999)):
            for m in range(-(-nq // Br)):
                rows = range(m * Br, min(nq, m * Br + Br))
                visible = {(i, j) for i in rows for j in range(nk) if j <= i + nk - nq}
                n_end = causal.kv_tile_end(m, nq, nk)
                needed = {j // Bc for _, j in visible}
                assert set(range(n_end)) >= needed and (n_end == 0 or n_end - 1 in needed)
                start = causal.kv_tile_causal_start(m, nq, nk)
                for n in range(n_end):
                    full = all((i, j) in visible for i in rows for j in range(n * Bc, min(nk, n * Bc + Bc)))
                    if n < start:
                        assert full, (Br, Bc, nq, nk, m, n)
                assert full_range.kv_tile_end(m, nq, nk) == -(-nk // Bc)


@pytest.mark.gpu
def test_testkernel_compiles_once_and_launches_on_the_gpu(nan_allocations):
    """Issue 2's GPU check of the infrastructure alone: the test kernel goes through the compile cache once,
    launches on the current stream, and writes every element (outputs are allocated NaN-filled: an element it
    never writes fails the comparison)."""
    import torch

    from fa_variants import testkernel

    def check(b, nq, nk, h, hkv):
        q = torch.randn(b, nq, h, 64, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, nk, hkv, 64, device="cuda", dtype=torch.bfloat16)
        with nan_allocations():
            out, lse = testkernel.run(q, v, v, softmax_scale=0.5)
        rows = torch.arange(nq, device="cuda").clamp(max=nk - 1)
        want = q.float() * 0.5 + v.float()[:, rows].repeat_interleave(h // hkv, dim=2)
        torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
        assert torch.all(lse == 0.5)

    check(1, 5, 3, 4, 4)
    n = cache.cache_info()["compiles"]
    check(3, 130, 77, 6, 2)  # other batch, seqlens and heads (GQA): served from the cache
    assert cache.cache_info()["compiles"] == n


@pytest.mark.parametrize("dtype, kernel_dtype, out_dtype", [("fp16", "e4m3", "fp16"), ("bf16", "e4m3", "bf16"),
                                                            ("e4m3", "e4m3", "bf16")])
def test_compile_builds_the_kernel_a_call_runs(monkeypatch, dtype, kernel_dtype, out_dtype):
    """`fa-variants compile --variant fa3-fp8 --dtype fp16` compiles the key an fp16 call looks up (the e4m3 kernel
    writing fp16: registry.call_static_config, as warmup does); before session 28 it compiled the bf16-output
    kernel under the label fp16. Checked on the key compile_only asks for (no compile here)."""
    from fa_variants.commands import compile as compile_cmd

    asked = []

    def fake(cfg):
        asked.append(cfg)
        raise RuntimeError("stop")

    monkeypatch.setattr(registry, "compiled", fake)
    with pytest.raises(RuntimeError, match="stop"):
        compile_cmd.compile_only("fa3-fp8", "sm_90a", 128, dtype)
    (cfg,) = asked
    assert cfg.dtype == kernel_dtype and cfg.config.out_dtype == out_dtype
    assert cfg == registry.call_static_config("fa3-fp8", "sm_90a", dtype, 128, False)
