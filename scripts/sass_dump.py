#!/usr/bin/env python3
"""SASS of the fa3 forward (ours) or of flash-attn-4's sm90 forward, compiled on the CPU (no GPU), for
scripts/sass_diff.py (issue 12; bench/NOTES.md, "Issue 12, SASS gap").

    python3 scripts/sass_dump.py ours --head-dim 128 --out ours.sass [--causal] [--dtype fp16] [--set alpha_first=False]
    python3 scripts/sass_dump.py fa4 --head-dim 128 --out fa4.sass  [--causal] [--dtype fp16]
    python3 scripts/sass_diff.py ours.sass fa4.sass --skip-jumps 32
    (--hex on both dumps: the listings carry each instruction's encoding, and sass_diff.py --stalls reads its
    scheduling control bits; --ptx FILE, ours / fp8: also the PTX NVVM made, for scripts/ptx_loops.py)

fp8: fa3-fp8 (e4m3, ``hopper.fa3_fp8.DEFAULT_CONFIGS[head_dim]`` with the ``--set`` changes; --dtype is ignored).
ours: the default a call runs (``hopper.fa3.default_config``: D 256 causal converts P per value) with the ``--set``
changes (Sm90Config fields; True/False, ints), through the compile cache (``registry.compiled``). fa4: flash-attn-4
(4.0.0b36 was read; with quack-kernels, and einops for its import) must be importable (``--fa4-path DIR`` is put
first on sys.path, e.g. a ``pip install --target DIR --no-deps flash-attn-4==4.0.0b36 quack-kernels==0.6.5
einops``); its ``_flash_attn_fwd`` runs under torch's FakeTensorMode with FLASH_ATTENTION_ARCH=sm_90, every
``cute.compile`` asked to keep its cubin; batch 2, seqlen 4096, heads * head_dim = 2048 (the shapes only pick the
kernel: one per head dim, causal, dtype). Both use CUTE_DSL_ARCH=sm_90a and nvdisasm (``common.cubin.sass_of``).
Prints the cubin's resources.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fa_variants


def parse_changes(items: list[str]) -> dict:
    """--set k=v pairs as Sm90Config changes: True/False as bools, digits as ints; ValueError naming a bad one."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
        if value in ("True", "False"):
            out[key] = value == "True"
        elif value.lstrip("-").isdigit():
            out[key] = int(value)
        else:
            raise ValueError(f"--set {item!r}: VALUE must be True, False or an int")
    return out


def ours_static(head_dim: int, causal: bool, dtype: str, changes: dict):
    """(fa3's Variant, the static config of its default for this call with the ``--set`` changes)."""
    from fa_variants import registry
    from fa_variants.hopper import fa3

    config = dataclasses.replace(fa3.default_config(fa3.ARCH, head_dim, causal), **changes)
    return fa3.VARIANT, registry.static_config("fa3", fa3.ARCH, dtype, head_dim, causal, config)


def fp8_static(head_dim: int, causal: bool, changes: dict):
    """(fa3-fp8's Variant, the static config of ``hopper.fa3_fp8.DEFAULT_CONFIGS[head_dim]`` with the ``--set``
    changes, Fp8Config fields)."""
    from fa_variants.hopper import fa3_fp8

    config = dataclasses.replace(fa3_fp8.DEFAULT_CONFIGS[head_dim], **changes)
    return fa3_fp8.VARIANT, fa3_fp8.VARIANT.static_config("sm_90a", "e4m3", head_dim, causal, config)


def ptx_and_cubin(variant, cfg) -> tuple[str, bytes]:
    """(the PTX that NVVM makes of a static config, its cubin): compiled here, outside the compile cache, which keeps
    no PTX, with ``common.cache.compile_options``."""
    import cutlass.cute as cute

    from fa_variants.common.cache import compile_options

    fn, args = variant.build(cfg)
    with tempfile.TemporaryDirectory(prefix="fa_variants_ptx_") as dump:
        compiled = cute.compile(fn, *args, options=compile_options(cfg.arch, dump, "--keep-cubin --keep-ptx"))
        (ptx,) = Path(dump).glob("*.ptx")
        return ptx.read_text(), compiled.artifacts.CUBIN


def fa4_compile(head_dim: int, causal: bool, dtype: str, batch: int = 2, seqlen: int = 4096,
                keep_cubin: bool = True) -> list:
    """flash-attn-4's sm90 forward for (batch, seqlen, 2048 / head_dim heads, head_dim) under FakeTensorMode: what
    ``cute.compile`` returned meanwhile (empty when its kernel came from a cache: in this process, or on disk
    with FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1, which a compile here also fills)."""
    os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
    os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
    import cutlass.cute as cute
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    compiled, original, dump = [], cute.compile, tempfile.mkdtemp(prefix="fa4_sass_")

    def compile_keeping(*args, options="", **kwargs):
        extra = f" --keep-cubin --dump-dir {dump}" if keep_cubin else ""
        compiled.append(original(*args, options=options + extra, **kwargs))
        return compiled[-1]

    cute.compile = compile_keeping
    try:
        from flash_attn.cute import interface

        torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        with FakeTensorMode(allow_non_fake_inputs=True):
            q, k, v = (torch.empty(batch, seqlen, 2048 // head_dim, head_dim, dtype=torch_dtype, device="cuda")
                       for _ in range(3))
            interface._flash_attn_fwd(q, k, v, causal=causal, return_lse=True)
    finally:
        cute.compile = original
    return compiled


def fa4_cubin(head_dim: int, causal: bool, dtype: str) -> bytes:
    compiled = fa4_compile(head_dim, causal, dtype)
    if not compiled:
        raise RuntimeError("flash-attn-4 compiled nothing (its kernel came from a cache: unset "
                           "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED)")
    return compiled[-1].artifacts.CUBIN


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("impl", choices=["ours", "fp8", "fa4"])
    ap.add_argument("--head-dim", type=int, required=True, choices=[64, 96, 128, 256])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="ours / fp8: Sm90Config / Fp8Config change")
    ap.add_argument("--fa4-path", type=Path, help="fa4: a folder with flash_attn, quack and einops")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--hex", action="store_true", help="with the instruction encodings (nvdisasm -hex), for "
                                                        "scripts/sass_diff.py --stalls")
    ap.add_argument("--ptx", type=Path,
                    help="ours / fp8: also write the kernel's PTX here (for scripts/ptx_loops.py)")
    a = ap.parse_args(argv)
    try:
        changes = parse_changes(a.set)
    except ValueError as exc:
        ap.error(str(exc))
    if a.impl == "fa4" and (changes or a.ptx):
        ap.error("--set and --ptx apply to ours and fp8 only")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    if a.fa4_path:
        sys.path.insert(0, str(a.fa4_path))
    from fa_variants.common import cubin as cb

    if a.impl == "fa4":
        blob = fa4_cubin(a.head_dim, a.causal, a.dtype)
    else:
        variant, cfg = (ours_static(a.head_dim, a.causal, a.dtype, changes) if a.impl == "ours"
                        else fp8_static(a.head_dim, a.causal, changes))
        if a.ptx:  # one compile for both
            ptx, blob = ptx_and_cubin(variant, cfg)
            a.ptx.write_text(ptx)
        else:
            blob = variant.compiled(cfg).cubin
    print(cb.cubin_resources(blob))
    a.out.write_text(cb.sass_of(blob, encodings=a.hex))
    return 0


if __name__ == "__main__":
    sys.exit(main())
