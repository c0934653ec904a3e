"""Compile-only path (no GPU): `fa-variants compile`, the variant registry and the compile cache.

Every compile is cached per process (fa_variants.common.compile), so each configuration below is
built once per pytest session however many tests read it.
"""
import dataclasses
import json

import pytest

from fa_variants import cli
from fa_variants.common import compile as cc

pytestmark = pytest.mark.compile


def _cli_json(capsys, *argv):
    rc = cli.main(["compile", *argv])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, out
    return json.loads(out[-1])  # the contract: the LAST line is one JSON object


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_cli_testkernel(capsys, arch):
    r = _cli_json(capsys, "--arch", arch, "--variant", "testkernel", "--head-dim", "64",
                  "--dtype", "bf16", "--sass")
    assert r["variant"] == "testkernel" and r["arch"] == arch
    assert r["compile_s"] > 0
    assert 0 < r["registers"] <= 255
    assert r["smem_bytes"] == 0 and r["spill_bytes"] == 0
    for op in cc.SASS_OPCODES:
        assert isinstance(r[op], int)
    assert r["HMMA"] == 0 and r["LDL"] == 0 and r["STL"] == 0


def test_sass_counter_sees_instructions():
    c = cc.get_compiled(cc.config_for("testkernel", "sm_80", "bf16", 64, False))
    counts = cc.count_sass(cc.sass_of(c.cubin), ("LDG", "STG", "EXIT"))
    assert counts["LDG"] >= 2 and counts["STG"] >= 2 and counts["EXIT"] >= 1


def test_unknown_variant_is_rejected(capsys):
    rc = cli.main(["compile", "--arch", "sm_80", "--variant", "no-such-kernel", "--head-dim", "64",
                   "--dtype", "bf16"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "no-such-kernel" in err and "testkernel" in err  # names the known variants
    with pytest.raises(cc.UnknownVariantError, match="known variants"):
        cc.config_for("no-such-kernel", "sm_80", "bf16", 64, False)


def test_unsupported_head_dim_is_rejected():
    with pytest.raises(cc.UnsupportedConfigError, match="head_dim 65"):
        cc.config_for("testkernel", "sm_80", "bf16", 65, False)


def test_cache_key_is_static_only():
    fields = {f.name for f in dataclasses.fields(cc.StaticConfig)}
    assert fields == {"variant", "arch", "dtype", "head_dim", "causal", "tiles", "align"}
    cfg = cc.config_for("testkernel", "sm_80", "bf16", 64, False)
    first = cc.get_compiled(cfg)
    n = cc.cache_info()["compiles"]
    again = cc.get_compiled(cc.config_for("testkernel", "sm_80", "bf16", 64, False))
    assert again is first and cc.cache_info()["compiles"] == n  # no recompile
    other = cc.get_compiled(cc.config_for("testkernel", "sm_80", "bf16", 64, True))
    assert other is not first and cc.cache_info()["compiles"] == n + 1


def test_fake_shapes_are_dynamic():
    """Batch, sequence lengths and heads are symbols, so a different seqlen cannot recompile."""
    from cutlass.cute.typing import SymInt

    from fa_variants.common import interop

    q, k, v, o, lse, _scale, _stream = interop.fake_attention_args("bf16", 128)
    for t in (q, k, v, o):
        assert all(isinstance(s, SymInt) for s in t.shape[:3]) and t.shape[3] == 128
        assert all(isinstance(s, SymInt) for s in t.stride[:3]) and t.stride[3] == 1
    assert q.shape[0] is k.shape[0] and k.shape[1] is v.shape[1] and q.shape[1] is lse.shape[2]
