"""fa_variants in other people's code, and a real model's attention as test input.

* :mod:`~fa_variants.integrations.hf`: ``attn_implementation="fa_variants"`` in Hugging Face transformers.
* :mod:`~fa_variants.integrations.custom_op`: ``torch.ops.fa_variants.attention``, so that
  ``torch.compile(fullgraph=True)`` traces through our attention.
* :mod:`~fa_variants.integrations.capture`: SmolLM2-135M-Instruct's Q, K, V after rotary on real text, and
  its first layers, captured on the CPU into a fixture (``python -m fa_variants.integrations.capture``).
* :mod:`~fa_variants.integrations.fixture`: that fixture: where it lives, loading, rebuilding the layers.

``import fa_variants`` imports custom_op only (it registers the op); transformers is needed only by hf, capture and
``fixture.build_layers``.
"""
