"""``torch.ops.fa_variants.attention``: fa_variants as a PyTorch custom op, so torch.compile traces through it.

    from fa_variants.integrations import custom_op
    out = custom_op.attention(q, k, v, causal=True)        # same arguments as fa_variants.attention
    torch.compile(model, fullgraph=True)                    # the op stays one node in the graph

The kernels are launched from Python (CuTe DSL objects), which Dynamo cannot trace; a ``torch.library``
custom op is opaque to it instead, and its fake (meta) implementation gives the output shapes and dtypes
without running anything, so ``torch.compile(fullgraph=True)`` and ``torch.export`` see a single node.
Source: PyTorch docs, "Python Custom Operators" (``torch.library.custom_op``, ``register_fake``).

Schema: ``fa_variants::attention(Tensor q, Tensor k, Tensor v, bool causal, float? softmax_scale,
str backend) -> (Tensor out, Tensor lse)``, out contiguous (batch, seqlen_q, num_heads, head_dim) in q's
dtype, lse float32 contiguous (batch, num_heads, seqlen_q). Forward only (no autograd formula is
registered: a backward through it raises).
"""
from __future__ import annotations

import torch

import fa_variants
from fa_variants import api


@torch.library.custom_op("fa_variants::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float | None,
                 backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs ``fa_variants.attention(..., return_lse=True)``; outputs made contiguous to match the fake."""
    out, lse = fa_variants.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
                                     return_lse=True)
    return out.contiguous(), lse.contiguous()


@attention_op.register_fake
def _attention_fake(q, k, v, causal, softmax_scale, backend):
    """Shapes and dtypes only: out like q (contiguous), lse float32 (batch, num_heads, seqlen_q).

    Validates first, with ``fa_variants.attention``'s rules and messages, so that a bad call fails while
    tracing (torch.compile, torch.export) with that message instead of an unpacking error."""
    api._check_inputs(q, k, v)
    api._check_options(causal, softmax_scale, backend, False, head_dim=1)  # head_dim: only the default scale
    batch, seqlen_q, heads, head_dim = q.shape
    out = q.new_empty((batch, seqlen_q, heads, head_dim))
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)
    return out, lse


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              softmax_scale: float | None = None, backend: str = "auto", return_lse: bool = False):
    """``fa_variants.attention`` through the custom op (same arguments, returns and errors).

    q (batch, seqlen_q, num_heads, head_dim), k/v (batch, seqlen_k, num_heads_kv, head_dim). Returns out
    (contiguous, q's dtype), or (out, lse float32 (batch, num_heads, seqlen_q)) with ``return_lse``.
    """
    out, lse = torch.ops.fa_variants.attention(q, k, v, causal, softmax_scale, backend)
    return (out, lse) if return_lse else out
