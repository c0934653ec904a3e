"""fa_variants: FlashAttention forward kernels (FA1, FA2 on sm80; FA3, FP8 on sm90) behind one dispatcher.

    import fa_variants
    out = fa_variants.attention(q, k, v, causal=True)          # q (batch, seqlen, heads, head_dim)
    out = fa_variants.scaled_dot_product_attention(q, k, v)   # PyTorch layout (batch, heads, seqlen, head_dim)
    fa_variants.select_backend(q, k, v).reason                 # which backend, and why

See ``fa_variants.api`` for the arguments, ``fa_variants.dispatch`` for the backend table and
``fa_variants.reference`` for the float64 reference and the tolerance rule.
"""
from fa_variants.api import attention, scaled_dot_product_attention, select_backend
from fa_variants.dispatch import BackendFallbackWarning, BackendUnavailableError, Selection

__version__ = "0.1.0"

__all__ = [
    "attention",
    "scaled_dot_product_attention",
    "select_backend",
    "Selection",
    "BackendUnavailableError",
    "BackendFallbackWarning",
    "__version__",
]
