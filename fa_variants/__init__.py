"""fa_variants: FlashAttention forward kernels (FA1, FA2 on sm80; FA3, FP8 on sm90) behind one dispatcher.

    import fa_variants
    out = fa_variants.attention(q, k, v, causal=True)          # q (batch, seqlen, heads, head_dim)
    out = fa_variants.scaled_dot_product_attention(q, k, v)   # PyTorch layout (batch, heads, seqlen, head_dim)
    fa_variants.select_backend(q, k, v).reason                 # which backend, and why

See ``fa_variants.api`` for the arguments, ``fa_variants.dispatch`` for the backend table and
``fa_variants.reference`` for the float64 reference and the tolerance rule.
"""
__version__ = "0.1.0"

# Imported on first use (PEP 562), so that `import fa_variants` (and `fa-variants --help`) does not
# import torch; the first access to any name below imports the API and registers the custom op. Where torch is
# loaded already, the end of this file registers the op at once, without the API (see there).
_LAZY = {"attention": "fa_variants.api", "scaled_dot_product_attention": "fa_variants.api",
         "select_backend": "fa_variants.api", "Selection": "fa_variants.dispatch",
         "BackendUnavailableError": "fa_variants.dispatch", "BackendFallbackWarning": "fa_variants.dispatch"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fa_variants' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "attention",
    "scaled_dot_product_attention",
    "select_backend",
    "Selection",
    "BackendUnavailableError",
    "BackendFallbackWarning",
    "__version__",
]

import sys as _sys

if "torch" in _sys.modules:
    # torch is loaded: register torch.ops.fa_variants.attention now, so that a program saved by torch.export loads
    # (torch.export.load) after a plain `import fa_variants`. Only the op: the API (and the FA_VARIANTS_* switches
    # its modules read) is still imported at its first use.
    from fa_variants.integrations import custom_op as _custom_op  # noqa: E402,F401
