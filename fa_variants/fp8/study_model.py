"""The FP8 study on a real model (issue 11): SmolLM2-135M's attention per layer, and end to end.

Per layer: :func:`capture_layers` runs the model once on the text with every attention call recorded
(``fa_variants.integrations.capture.capture_fixture``: Q, K, V after rotary, float16), so ``fp8-study``'s
``layer`` sweep needs no fixture file where the model is (the GPU host gets the model as a folder of
pieces, ``fa_variants.integrations.model_dir``).

End to end (:func:`end_to_end`): the same model on the same text with every attention layer computed by
one method of ``E2E_METHODS`` (registered in transformers' ``AttentionInterface``; every layer's call is
counted): float64 attention on the float32 model's Q, K, V (the reference), bf16 attention (our fa3 kernel
on an sm_90 GPU, PyTorch's bf16 maths elsewhere), and fa3-fp8 on the same bf16 Q, K, V with the default
recipe and with FA3's shipped per-head scales (the kernel on the GPU, its emulation elsewhere). For each:
per-token KL(p_base || p_method) of the next-token distributions against the reference and against bf16,
top-1 agreement with each, and the perplexity of the text. The model is float32 everywhere (the weights as
stored, float16, widened): only attention changes between the runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fa_variants.common.checks import is_real
from fa_variants.fp8.quantize import FP8Config

TEXT_SOURCE = ("Charles Dickens, A Tale of Two Cities (1859, public domain), Book the First, chapter I "
               "'The Period', its first four paragraphs")
TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it "
    "was the season of Darkness, it was the spring of hope, it was the winter of despair, we had everything "
    "before us, we had nothing before us, we were all going direct to Heaven, we were all going direct the "
    "other way--in short, the period was so far like the present period, that some of its noisiest "
    "authorities insisted on its being received, for good or for evil, in the superlative degree of "
    "comparison only.\n\n"
    "There were a king with a large jaw and a queen with a plain face, on the throne of England; there were a "
    "king with a large jaw and a queen with a fair face, on the throne of France. In both countries it was "
    "clearer than crystal to the lords of the State preserves of loaves and fishes, that things in general "
    "were settled for ever.\n\n"
    "It was the year of Our Lord one thousand seven hundred and seventy-five. Spiritual revelations were "
    "conceded to England at that favoured period, as at this. Mrs. Southcott had recently attained her "
    "five-and-twentieth blessed birthday, of whom a prophetic private in the Life Guards had heralded the "
    "sublime appearance by announcing that arrangements were made for the swallowing up of London and "
    "Westminster. Even the Cock-lane ghost had been laid only a round dozen of years, after rapping out its "
    "messages, as the spirits of this very year last past (supernaturally deficient in originality) rapped "
    "out theirs. Mere messages in the earthly order of events had lately come to the English Crown and "
    "People, from a congress of British subjects in America: which, strange to relate, have proved more "
    "important to the human race than any communications yet received through any of the chickens of the "
    "Cock-lane brood."
)


@dataclass(frozen=True)
class E2EMethod:
    label: str
    kind: str  # "reference" | "bf16" | "fp8"
    config: FP8Config | None = None


E2E_METHODS: dict[str, E2EMethod] = {
    "reference": E2EMethod("float64 attention (reference)", "reference"),
    "bf16": E2EMethod("bf16 attention", "bf16"),
    "fp8": E2EMethod("fa3-fp8 default recipe (block + Hadamard + smooth K, two-level)", "fp8", FP8Config()),
    "fp8-head": E2EMethod("fa3-fp8 per-head scales (FA3's shipped recipe)", "fp8",
                          FP8Config(granularity="head", rotate=False, smooth_k=False)),
}


def capture_layers(model, input_ids: torch.Tensor, *, text: str, model_name: str):
    """A ``Fixture`` with every layer's Q, K, V (float16) of ``model`` on ``input_ids`` (1, seqlen), captured
    by one forward pass on the model's device (no end-to-end part, no eager outputs)."""
    from fa_variants.integrations.capture import capture_fixture

    ids = input_ids.to(next(model.parameters()).device)
    fixture = capture_fixture(model, ids, text=text, model_name=model_name, e2e_layers=0, eager_out=False)
    fixture.q, fixture.k, fixture.v = (t.cpu() for t in (fixture.q, fixture.k, fixture.v))
    return fixture


def attention_function(method: str, *, use_kernel: bool, calls: list):
    """A transformers attention function (``AttentionInterface``) computing ``method`` of E2E_METHODS,
    causal, on one unpadded sequence; appends the layer index to ``calls`` each time it runs."""
    from fa_variants import attention
    from fa_variants.fp8 import attention as fp8_attention
    from fa_variants.fp8.emulation import fp8_attention_reference
    from fa_variants.reference import attention_reference

    m = E2E_METHODS[method]

    def fn(module, query, key, value, attention_mask, scaling=None, **kwargs):
        calls.append(getattr(module, "layer_idx", None))
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (B, N, H, D)
        if m.kind == "reference":
            out, _ = attention_reference(q, k, v, causal=True, softmax_scale=scaling, dtype=torch.float64)
        else:
            q, k, v = (t.to(torch.bfloat16).contiguous() for t in (q, k, v))
            if m.kind == "bf16" and use_kernel:
                out = attention(q, k, v, causal=True, softmax_scale=scaling, backend="fa3")
            elif m.kind == "bf16":
                out, _ = attention_reference(q, k, v, causal=True, softmax_scale=scaling, dtype=torch.bfloat16)
            elif use_kernel:
                out = fp8_attention.attention_fp8(q, k, v, causal=True, softmax_scale=scaling, config=m.config)
            else:
                out, _ = fp8_attention_reference(q, k, v, causal=True, softmax_scale=scaling, config=m.config,
                                                 out_dtype=torch.bfloat16, accumulator="truncate")  # cheap model
        return out.to(query.dtype), None

    return fn


def _logits(model, input_ids: torch.Tensor, method: str, *, use_kernel: bool) -> torch.Tensor:
    """The model's logits (seqlen, vocab) float64 on the CPU with every attention layer through ``method``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    calls: list = []
    name = f"fa_variants_study_{method}"
    AttentionInterface.register(name, attention_function(method, use_kernel=use_kernel, calls=calls))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        with torch.no_grad():
            logits = model(input_ids.to(next(model.parameters()).device)).logits[0].double().cpu()
    finally:
        model.set_attn_implementation(previous)
    layers = model.config.num_hidden_layers
    if sorted(calls) != list(range(layers)):
        raise RuntimeError(f"{method}: the attention function ran for layers {calls}, expected 0..{layers - 1}")
    return logits


def compare(logp: torch.Tensor, base: torch.Tensor) -> dict:
    """Per-token KL(p_base || p) (natural log), its mean / median / max, and top-1 agreement, from
    log-probabilities (seqlen, vocab) float64."""
    kl = (base.exp() * (base - logp)).sum(-1).clamp_min(0)
    return {"kl": kl, "kl_mean": kl.mean().item(), "kl_median": kl.median().item(), "kl_max": kl.max().item(),
            "top1": (logp.argmax(-1) == base.argmax(-1)).double().mean().item()}


def end_to_end(model, input_ids: torch.Tensor, *, use_kernel: bool, methods=None) -> dict:
    """Every method of ``methods`` (default all of E2E_METHODS; "reference" and "bf16" always run) on the whole
    model, ``input_ids`` (1, seqlen) int64. Returns {"what", "tokens", "layers", "rows": one dict per method
    (method, label, backend, perplexity, kl_vs_reference_mean/median/max, top1_vs_reference, and the same
    vs_bf16), "kl_per_token": {method: [KL vs the reference per position]}}. Raises ValueError for a batch
    other than 1 or an unknown method."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be (1, seqlen), got {tuple(input_ids.shape)}")
    names = ["reference", "bf16"] + [m for m in (methods or E2E_METHODS) if m not in ("reference", "bf16")]
    for m in names:
        if m not in E2E_METHODS:
            raise ValueError(f"unknown end-to-end method {m!r}; choose from {sorted(E2E_METHODS)}")
    logp = {m: torch.log_softmax(_logits(model, input_ids, m, use_kernel=use_kernel), -1) for m in names}
    targets = input_ids[0, 1:].cpu()
    rows, per_token = [], {}
    for m in names:
        kind = E2E_METHODS[m].kind
        backend = ("torch float64" if kind == "reference" else
                   ("fa3 kernel" if use_kernel else "PyTorch bf16 maths") if kind == "bf16" else
                   ("fa3-fp8 kernel" if use_kernel else "EMULATION"))
        nll = -logp[m][:-1].gather(1, targets[:, None]).mean().item()
        row = {"method": m, "label": E2E_METHODS[m].label, "backend": backend, "perplexity": math.exp(nll)}
        for base in ("reference", "bf16"):
            c = compare(logp[m], logp[base])
            if base == "reference":
                per_token[m] = c["kl"].tolist()
            row.update({f"kl_vs_{base}_{s}": c[f"kl_{s}"] for s in ("mean", "median", "max")},
                       **{f"top1_vs_{base}": c["top1"]})
        rows.append(row)
    dev = next(model.parameters()).device
    return {"what": f"whole model ({model.config.num_hidden_layers} layers, float32 weights and activations on "
                    f"{dev.type}), {input_ids.shape[1]} tokens; every attention layer through each method "
                    f"(Q, K, V rounded to bf16 for bf16 and fa3-fp8); FP8 via "
                    f"{'the fa3-fp8 kernel' if use_kernel else 'the EMULATION of the fa3-fp8 kernel (no GPU)'}",
            "tokens": int(input_ids.shape[1]), "layers": model.config.num_hidden_layers, "rows": rows,
            "kl_per_token": per_token}


ROW_NUMBERS = ("perplexity", "kl_vs_reference_mean", "kl_vs_reference_median", "kl_vs_reference_max",
               "top1_vs_reference", "kl_vs_bf16_mean", "kl_vs_bf16_max", "top1_vs_bf16")


def check(e2e) -> str | None:
    """What makes ``e2e`` (end_to_end's result, or {"what": "failed: ..."}, as read back from fp8_study.json)
    unusable by ``markdown`` and ``plot``, or None."""
    if not isinstance(e2e, dict) or not isinstance(e2e.get("what"), str):
        return 'not an object with a "what" string'
    rows = e2e.get("rows", [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return "rows is not a list of objects"
    for i, r in enumerate(rows):
        bad = [k for k in ("label", "backend") if not isinstance(r.get(k), str)]
        bad += [k for k in ROW_NUMBERS if not is_real(r.get(k))]
        if bad:
            want = "a number" if bad[0] in ROW_NUMBERS else "a string"
            return f"rows[{i}]: {bad[0]} is {r.get(bad[0], 'missing')!r}, not {want}"
    kl = e2e.get("kl_per_token", {})
    if not (isinstance(kl, dict) and all(m in E2E_METHODS and isinstance(v, list) and all(is_real(x) for x in v)
                                         for m, v in kl.items())):
        return "kl_per_token is not {method: [numbers]}"
    return None


def markdown(e2e: dict, src: str) -> list[str]:
    """The end-to-end section of the report."""
    out = [f"## End to end on the real model — FP8 via {src}", "", e2e["what"] + ".", ""]
    if "rows" not in e2e:
        return out
    out += ["| attention | computed by | perplexity | KL vs reference mean | median | max | top-1 = reference | "
            "KL vs bf16 mean | max | top-1 = bf16 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in e2e["rows"]:
        out.append(f"| {r['label']} | {r['backend']} | {r['perplexity']:.4f} | {r['kl_vs_reference_mean']:.2e} | "
                   f"{r['kl_vs_reference_median']:.2e} | {r['kl_vs_reference_max']:.2e} | "
                   f"{100 * r['top1_vs_reference']:.1f}% | {r['kl_vs_bf16_mean']:.2e} | {r['kl_vs_bf16_max']:.2e} | "
                   f"{100 * r['top1_vs_bf16']:.1f}% |")
    out += ["", "KL in nats per token, of the next-token distribution (KL(p_base || p_method)); perplexity of the "
            "text's tokens 2..N given their prefix.", ""]
    return out


def plot(e2e: dict, folder, src: str):
    """e2e_kl_per_token.png: KL vs the reference per token position, one line per method, log scale (None if
    there is nothing to plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = {m: v for m, v in e2e.get("kl_per_token", {}).items() if m != "reference"}
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m, kl in lines.items():
        ax.plot(range(len(kl)), [max(x, 1e-12) for x in kl], label=E2E_METHODS[m].label, lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("token position")
    ax.set_ylabel("KL(p_reference || p_method), nats (floor 1e-12)")
    ax.set_title(f"End to end: next-token KL vs float64 attention (FP8 via {src})", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    path = folder / "e2e_kl_per_token.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
