"""`fa-variants compile`: compile one kernel variant with fake tensors (no GPU needed) and report its
resources (registers, shared memory, spills) and, with --sass, counts of key SASS instructions.

The variant comes from the registry (`fa_variants.registry`) and compiles through the same cache as a
launch (`common.cache`); the report reads the cubin (`common.cubin`). The last line printed is one
JSON object.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys

from fa_variants import registry
from fa_variants.common import cubin, interop
from fa_variants.common.launch import SM80_CODE_ARCHS

ARCHS = SM80_CODE_ARCHS  # every kernel's targets (the sm80 kernels'; fa3, fa3-fp8: sm_90a; the FP8 pass: sm_89, sm_90a)
DTYPES = ("fp16", "bf16", "e4m3")


def compile_only(variant: str, arch: str, head_dim: int, dtype: str, causal: bool = False,
                 sass: bool = False, config=None) -> dict:
    """Compile one configuration with fake tensors (no GPU needed) and report its resources.

    The kernel is the one a call on ``dtype`` inputs runs (``registry.call_static_config``: fa3-fp8 on fp16 / bf16
    compiles the e4m3 kernel writing O in that dtype).

    Returns a dict: variant, arch, dtype, head_dim, causal, tiles (the variant's config as a dict),
    compile_s (seconds of the cute.compile call that built it, also when served from the cache),
    registers (per thread), smem_static_bytes, smem_dynamic_bytes (as launched), smem_bytes (their sum),
    spill_bytes (local memory per thread: stack frame, 0 = no spills), and with sass=True the counts of
    `common.cubin.SASS_OPCODES`. Raises registry.UnknownVariantError / UnsupportedConfigError.
    """
    if arch not in ARCHS:
        raise registry.UnsupportedConfigError(f"arch {arch!r} unknown; choose from {', '.join(ARCHS)}")
    cfg = registry.call_static_config(variant, arch, dtype, head_dim, causal, config)  # what such a call runs
    c = registry.compiled(cfg)
    res = cubin.cubin_resources(c.cubin) if c.cubin else {}
    report = {
        "variant": variant, "arch": arch, "dtype": dtype, "head_dim": head_dim, "causal": causal,
        "tiles": dataclasses.asdict(cfg.config),
        "compile_s": round(c.compile_s, 3),
        "registers": res.get("registers"),
        "smem_static_bytes": res.get("smem_static_bytes"),
        "smem_dynamic_bytes": c.smem_dynamic_bytes,
        "smem_bytes": (res.get("smem_static_bytes") or 0) + c.smem_dynamic_bytes,
        "spill_bytes": res.get("spill_bytes"),
    }
    if sass:
        report.update(cubin.count_sass(cubin.sass_of(c.cubin)))
    return report


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", required=True, choices=ARCHS, help="target (no GPU needed)")
    parser.add_argument("--variant", required=True, choices=registry.KERNELS, metavar="VARIANT",
                        help=f"kernel variant: {', '.join(registry.KERNELS)}")
    parser.add_argument("--head-dim", type=int, required=True)
    # only the dtypes some registered variant takes (e4m3 appears once an FP8 variant is registered)
    offered = {interop.DTYPE_NAMES.get(d) for v in registry.ENTRIES
               if not isinstance(loaded := registry.load(v), str) for d in loaded.dtypes}
    parser.add_argument("--dtype", required=True, choices=[d for d in DTYPES if d in offered] or DTYPES)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--sass", action="store_true", help=f"count {', '.join(cubin.SASS_OPCODES)}")
    parser.add_argument("--num-splits", type=int, default=None, metavar="N",
                        help="the split-KV kernel (fa2, fa3) as split calls run it, with num_splits=N "
                             "(0: the count chosen per call; every N != 1 compiles the same kernel)")


def split_config(variant: str, arch: str, head_dim: int, causal: bool, num_splits: int):
    """The config a variant's split-KV calls run with ``num_splits``: its module's ``split_config(arch,
    head_dim, num_splits)`` when it has one (fa2: its own split tiles), else its default config with
    num_splits (fa3). UnsupportedConfigError for a variant without split-KV."""
    record = registry.variant(variant)
    own = getattr(importlib.import_module(registry.ENTRIES[variant].module), "split_config", None)
    if callable(own):
        return own(arch, head_dim, num_splits)
    config = record.default_config(arch, head_dim, causal) if record.default_config else None
    if not hasattr(config, "num_splits"):
        raise registry.UnsupportedConfigError(f"--num-splits: {variant} has no split-KV kernel")
    return dataclasses.replace(config, num_splits=num_splits)


def run_cli(args: argparse.Namespace) -> int:
    os.environ["CUTE_DSL_ARCH"] = args.arch  # read when the DSL loads (below, on first compile)
    try:
        if args.causal and args.variant in registry.NOT_ATTENTION:
            raise registry.UnsupportedConfigError(f"--causal: {args.variant} is not attention and has no causal form")
        config = None if args.num_splits is None else split_config(args.variant, args.arch, args.head_dim,
                                                                    args.causal, args.num_splits)
        report = compile_only(args.variant, args.arch, args.head_dim, args.dtype, args.causal, args.sass, config)
    except (registry.UnknownVariantError, registry.UnsupportedConfigError, ValueError) as exc:
        print(f"fa-variants compile: error: {exc}", file=sys.stderr)  # as cli.main prints the other commands
        return 2
    print(json.dumps(report))
    return 0
