"""The one registry of kernel variants: name -> the module holding its `common.launch.Variant` record.

The dispatcher (`fa_variants.dispatch`), `fa-variants compile` and `fa-variants info` all read it. A
module is imported on first use of its name (and remembered); a module that does not exist yet is
reported as "not built yet", one that fails to import says why.

Names and modules (static): ``BACKENDS`` are the names callers may ask for, fastest first; "testkernel"
is an internal kernel for the compile infrastructure, "fp8-quant" the FP8 quantisation pass and "split-merge"
the split-KV merge, compiled but never dispatched to.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass

from fa_variants.common import env
from fa_variants.common.launch import Variant


@dataclass(frozen=True)
class Entry:
    """Where a variant lives, and a one-line summary (known without importing it). For the kernel backends
    also what their Variant declares (dtype names as ``str(torch.dtype)`` without "torch.", head dims, the
    dtypes ``auto`` may pick them for), so that the dispatcher can say whether a backend serves a call
    without importing it: importing fa1 or fa3-fp8 imports the CuTe DSL (~2 s of a fresh process's first
    call). tests/test_dispatch.py checks these against the imported Variants."""

    module: str
    summary: str
    dtypes: tuple[str, ...] = ()
    head_dims: tuple[int, ...] | None = None
    auto_dtypes: tuple[str, ...] | None = None

    def refuses(self, dtype: str, head_dim: int) -> list[str]:
        """What of a call (dtype name, head_dim) the declaration refuses, as clauses ("float16, bfloat16 inputs (not
        float32)", "head_dim 64, 96, 128, 256 (not 80)"); [] when it declares both, or declares no dtypes."""
        if not self.dtypes:
            return []
        problems = [] if dtype in self.dtypes else [f"{', '.join(self.dtypes)} inputs (not {dtype})"]
        if self.head_dims is not None and head_dim not in self.head_dims:
            problems.append(f"head_dim {', '.join(map(str, self.head_dims))} (not {head_dim})")
        return problems


_HALF = ("float16", "bfloat16")
_HEAD_DIMS = (64, 96, 128, 256)


ENTRIES: dict[str, Entry] = {
    "fa3": Entry("fa_variants.hopper.fa3", "FlashAttention-3 style: TMA, WGMMA, warp specialisation",
                 _HALF, _HEAD_DIMS),
    "fa3-fp8": Entry("fa_variants.fp8.fa3_fp8", "FlashAttention-3 with e4m3 (FP8) inputs",
                     _HALF + ("float8_e4m3fn",), _HEAD_DIMS, ("float8_e4m3fn",)),
    "fa2": Entry("fa_variants.ampere.fa2", "FlashAttention-2: Q outer loop, mma.sync, cp.async",
                 _HALF, _HEAD_DIMS),
    "fa1": Entry("fa_variants.ampere.fa1", "FlashAttention-1: K/V outer loop", _HALF, _HEAD_DIMS),
    "reference": Entry("fa_variants.reference", "plain PyTorch, float32 maths (float64 for float64 inputs), any "
                       "device (slow)"),
    "testkernel": Entry("fa_variants.testkernel", "internal test kernel: out = q * scale + v[row], lse = scale"),
    "fp8-quant": Entry("fa_variants.fp8.quant_kernel", "FP8 quantisation pass (not attention): Hadamard, block "
                       "scales, e4m3, V transposed"),
    "split-merge": Entry("fa_variants.common.split_combine", "split-KV merge (not attention): partial O and LSE "
                         "combined by LSE in one launch"),
}
#: the names a caller may ask for (backend=...), fastest first
BACKENDS: tuple[str, ...] = ("fa3", "fa3-fp8", "fa2", "fa1", "reference")
#: the compile-only entries that are not attention (no causal form, no backend)
NOT_ATTENTION: tuple[str, ...] = ("fp8-quant", "split-merge")
#: backends without a backward, and why. The others' backward is PyTorch's (``integrations.backward``: a fused one
#: where it applies, else ``reference.run_backward``; the gradient of exact attention, which their forward computes)
FORWARD_ONLY: dict[str, str] = {
    "fa3-fp8": "its forward quantises Q, K and V to e4m3: the gradient of exact attention would not be its gradient",
}
#: plain PyTorch variants (any device): nothing to compile
PLAIN_PYTORCH: tuple[str, ...] = ("reference",)
#: the variants with a kernel to compile (`fa-variants compile --variant`, warmup's --backends)
KERNELS: tuple[str, ...] = tuple(name for name in ENTRIES if name not in PLAIN_PYTORCH)


class UnknownVariantError(ValueError):
    """A variant name the registry does not know."""


class UnsupportedConfigError(ValueError):
    """A variant asked for an arch / dtype / head_dim it does not serve, or a variant that is unusable."""


_LOADED: dict[str, Variant | str] = {}


def clear_cache() -> None:
    """Forget the loaded variants (tests replace modules)."""
    _LOADED.clear()


def load(name: str) -> Variant | str:
    """The Variant record of `name`, or a sentence saying why it is unusable ("... is not built yet")."""
    if name not in _LOADED:
        _LOADED[name] = _import(name, ENTRIES[name].module)
    return _LOADED[name]


def _import(name: str, module_name: str) -> Variant | str:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return f"{name} is not built yet"
        return f"{name} cannot be imported ({exc})"
    except env.SwitchError:  # a mistyped FA_VARIANTS_* switch is the caller's to fix: no fallback past it
        raise
    except Exception as exc:  # a broken kernel module must be reported, not crash its callers
        return f"{name} failed to import ({type(exc).__name__}: {exc})"
    if name == "reference" and not hasattr(module, "VARIANT"):
        return Variant("reference", archs=(), dtypes=tuple(module.DTYPES), head_dims=module.HEAD_DIMS,
                       runner=lambda q, k, v, **kw: module.run(q, k, v, **kw))  # looked up per call
    variant = getattr(module, "VARIANT", None)
    if not isinstance(variant, Variant):
        return f"{name} ({module_name}) defines no VARIANT record (common.launch.Variant)"
    return variant


def variant(name: str) -> Variant:
    """The usable variant `name`. Raises UnknownVariantError (listing the known names) or
    UnsupportedConfigError (not built, failed to import)."""
    if name not in ENTRIES:
        raise UnknownVariantError(f"unknown variant {name!r}; known variants: {', '.join(ENTRIES)}")
    loaded = load(name)
    if isinstance(loaded, str):
        raise UnsupportedConfigError(loaded)
    return loaded


def static_config(name: str, arch: str, dtype: str, head_dim: int, causal: bool, config=None):
    """The compile-cache key (`common.cache.StaticConfig`) of variant `name` for a compile target;
    UnsupportedConfigError unless the variant serves arch, dtype and head_dim."""
    from fa_variants.common import interop

    v = variant(name)
    if not v.archs:  # plain PyTorch (the reference): nothing to compile
        raise UnsupportedConfigError(f"variant {name!r} is plain PyTorch (any device): it has no kernel to compile")
    problems = []
    if arch not in v.archs:
        problems.append(f"arch {arch} (serves {', '.join(v.archs)})")
    if dtype not in interop.TORCH_DTYPES or interop.TORCH_DTYPES[dtype] not in v.dtypes:
        problems.append(f"dtype {dtype} (serves {', '.join(interop.DTYPE_NAMES[d] for d in v.dtypes)})")
    if v.head_dims is not None and head_dim not in v.head_dims:
        problems.append(f"head_dim {head_dim} (serves {', '.join(map(str, v.head_dims))})")
    if problems:
        raise UnsupportedConfigError(f"variant {name!r} does not serve " + "; ".join(problems))
    return v.static_config(arch, dtype, head_dim, causal, config)


#: the 16-bit input dtypes ``attention(..., backend="fa3-fp8")`` quantises to e4m3 with the default FP8Config
FP8_QUANTISED_INPUTS = ("fp16", "bf16")


def call_static_config(name: str, arch: str, dtype: str, head_dim: int, causal: bool, config=None):
    """The compile-cache key a call on ``dtype`` inputs looks up: `static_config`, but for fa3-fp8 on fp16 / bf16
    inputs the kernel runs on their e4m3 quantisation and writes O in their dtype (``hopper.fa3_fp8._kernel``),
    so its key is dtype "e4m3" with the config's ``out_dtype`` = dtype. `fa-variants compile` and `warmup` both
    use it, so what they compile is what a call runs."""
    if name == "fa3-fp8" and dtype in FP8_QUANTISED_INPUTS:
        config = config or variant(name).default_config(arch, head_dim, causal)
        config = dataclasses.replace(config, out_dtype=dtype)
        return static_config(name, arch, "e4m3", head_dim, causal, config)
    return static_config(name, arch, dtype, head_dim, causal, config)


def compiled(cfg):
    """The compiled kernel of a static configuration (`common.cache`), compiled on first use."""
    return variant(cfg.variant).compiled(cfg)
