"""The real-input fixture: a pretrained model's attention inputs and first layers, captured once on the CPU.

What it holds (written by ``python -m fa_variants.integrations.capture``, see there for the model and text):

* ``q``, ``k``, ``v``: every layer's attention inputs after rotary, float16, q (layers, batch, seqlen,
  num_heads, head_dim) and k, v (layers, batch, seqlen, num_heads_kv, head_dim), in our layout;
  ``out_eager``: the eager attention's outputs (float32 maths on the CPU, stored float16), like q, or None
  when captured with ``--no-eager-out``;
  ``softmax_scale`` and ``causal`` as the model used them.
* for an end-to-end run where the model package is absent (the GPU host): the first ``e2e_layers`` decoder
  layers' weights (``layer_state``, float16, ``LlamaModel`` state-dict keys), the embedding rows of the
  prompt's tokens (``inputs_embeds`` float32 (batch, seqlen, hidden)) and the eager model's hidden states
  after each of those layers (``hidden_states`` float32 (e2e_layers, batch, seqlen, hidden)), with the
  model's ``config`` dict, so :func:`build_layers` rebuilds them with transformers alone (``e2e_layers``
  may be 0: no end-to-end part).

The file is ``torch.save`` of a plain dict, compressed with lzma (stdlib), loaded with
``torch.load(weights_only=True)``. It lives outside git: ``$FA_VARIANTS_FIXTURE``, else the first that exists
of ``<repo>/.fixtures/``, ``./.fixtures/`` and ``~/.cache/fa_variants/`` (file name :data:`FILENAME`).
"""
from __future__ import annotations

import io
import lzma
import os
import pickle
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import torch

from fa_variants.common import paths

FILENAME = "smollm2_135m_instruct.pt.xz"
ENV_VAR = "FA_VARIANTS_FIXTURE"
FORMAT = 1


@dataclass
class Fixture:
    """A captured real input (see the module docstring for every field's shape and dtype)."""

    model_name: str
    text: str
    input_ids: torch.Tensor          # (batch, seqlen) int64
    config: dict                     # the model's LlamaConfig.to_dict(), JSON-like
    softmax_scale: float
    causal: bool
    q: torch.Tensor                  # (layers, batch, seqlen, num_heads, head_dim) float16
    k: torch.Tensor                  # (layers, batch, seqlen, num_heads_kv, head_dim) float16
    v: torch.Tensor
    out_eager: torch.Tensor | None   # like q: the eager attention's output (float32 maths), float16
    capture_error: list[float]       # per layer: max |eager out - float64 recompute from captured q, k, v|
    inputs_embeds: torch.Tensor      # (batch, seqlen, hidden) float32 (empty without an end-to-end part)
    layer_state: dict[str, torch.Tensor]  # float16 weights of layers 0 .. e2e_layers-1 (LlamaModel keys)
    hidden_states: torch.Tensor      # (e2e_layers, batch, seqlen, hidden) float32, eager, CPU
    info: dict = field(default_factory=dict)  # versions, perplexity, ... (str/float values)
    format: int = FORMAT

    @property
    def num_layers(self) -> int:
        return self.q.shape[0]

    @property
    def e2e_layers(self) -> int:
        return self.hidden_states.shape[0]

    def save(self, path: str | os.PathLike) -> Path:
        """Write the fixture (lzma-compressed torch.save of a dict); creates the folder. Returns the path."""
        path = paths.expand_user(path, "fixture path")
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        torch.save(asdict(self), buf)
        path.write_bytes(lzma.compress(buf.getvalue(), preset=6))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Fixture":
        """Read a fixture written by :meth:`save`. Raises ValueError naming the file for another format version
        and for a file that is not a fixture (not lzma, not a torch.save of a dict, fields missing): before, such a
        file gave lzma's / pickle's / a dict lookup's error and ``fa-variants demo`` a traceback. OSError (a
        missing file, a folder) as ``Path.read_bytes``."""
        raw = paths.expand_user(path, "fixture path").read_bytes()
        regenerate = "regenerate it with python -m fa_variants.integrations.capture"
        try:
            data = torch.load(io.BytesIO(lzma.decompress(raw)), weights_only=True)
        except lzma.LZMAError:
            raise ValueError(f"{path}: not a fixture file (not lzma-compressed); {regenerate}") from None
        except (EOFError, pickle.UnpicklingError, RuntimeError):  # torch's message would suggest weights_only=False
            raise ValueError(f"{path}: not a fixture file (not a torch.save of plain data that torch.load "
                             f"reads with weights_only=True); {regenerate}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: not a fixture file (holds a {type(data).__name__}, not a dict); {regenerate}")
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
                   and f.name not in data]
        if data.get("format") == FORMAT and missing:
            raise ValueError(f"{path}: fixture fields missing: {', '.join(missing)}; {regenerate}")
        if data.get("format") != FORMAT:
            raise ValueError(f"{path}: fixture format {data.get('format')}, expected {FORMAT}; {regenerate}")
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def attention_inputs(self, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float16,
                         layers: slice | list[int] | None = None):
        """(q, k, v) with the layers stacked on the batch dimension: q (layers*batch, seqlen, num_heads,
        head_dim), k, v (layers*batch, seqlen, num_heads_kv, head_dim), in ``dtype`` on ``device``
        (``layers`` selects some; default all). Batch index i*batch + b is layer i, sequence b."""
        sel = slice(None) if layers is None else layers
        return tuple(t[sel].flatten(0, 1).to(device=device, dtype=dtype) for t in (self.q, self.k, self.v))

    def describe(self) -> str:
        """One line: the model, the text length and the attention shapes."""
        L, B, N, H, D = self.q.shape
        return (f"{self.model_name}: Q/K/V after rotary of all {L} layers (stacked as batch {L * B}), "
                f"seqlen {N} tokens of real text, {H} heads / {self.k.shape[3]} KV heads (GQA), head_dim {D}, "
                f"{'causal' if self.causal else 'full'}, softmax_scale {self.softmax_scale:g}")


def _named() -> Path | None:
    """$FA_VARIANTS_FIXTURE as a path (``~`` expanded), or None where it is unset or blank."""
    named = paths.env_path(ENV_VAR)
    return paths.expand_user(named, ENV_VAR) if named else None


def _home_place() -> Path | None:
    """~/.cache/fa_variants/FILENAME, or None where there is no home directory."""
    home = paths.home()
    return home / ".cache" / "fa_variants" / FILENAME if home is not None else None


def candidate_paths() -> list[Path]:
    """Where a fixture is looked for, in order ($FA_VARIANTS_FIXTURE alone when it is set; the home directory's
    cache left out where there is no home directory)."""
    named = _named()
    if named is not None:
        return [named]
    repo = Path(__file__).resolve().parents[2]
    return [repo / ".fixtures" / FILENAME, Path.cwd() / ".fixtures" / FILENAME,
            *filter(None, [_home_place()])]


def default_path() -> Path:
    """Where ``capture`` writes by default: $FA_VARIANTS_FIXTURE, else ~/.cache/fa_variants/FILENAME. OSError where
    neither names a place (no home directory)."""
    place = _named() or _home_place()
    if place is None:
        raise OSError(f"no home directory for the fixture's default place: set {ENV_VAR} or give --out")
    return place


def find_fixture() -> Path | None:
    """The first existing path of :func:`candidate_paths`, or None (also where FA_VARIANTS_FIXTURE names a file not
    captured yet: it is where ``capture`` writes too; :func:`named_but_missing` says so for the messages)."""
    return next((p for p in candidate_paths() if p.is_file()), None)


def named_but_missing() -> str | None:
    """"FA_VARIANTS_FIXTURE=PATH names no file" where the variable is set to something that is not a file, else None:
    a clause for the messages of what needed the fixture (a typo read as "no fixture" without a word before)."""
    named = _named()
    if named is None or named.is_file():
        return None
    return f"{ENV_VAR}={paths.env_path(ENV_VAR)} names no file"


def load_real_input(path: str | os.PathLike | None = None) -> Fixture | None:
    """The captured fixture (from ``path``, else :func:`find_fixture`), or None when there is none.

    A file that exists but cannot be read raises (it is not silently replaced by random input).
    """
    path = path or find_fixture()
    return None if path is None else Fixture.load(path)


# ------------------------------------------------------------------------ rebuilding the first layers


def build_layers(fixture: Fixture, *, dtype: torch.dtype, device: torch.device | str,
                 attn_implementation: str = "eager"):
    """A transformers ``LlamaModel`` holding the fixture's first ``e2e_layers`` decoder layers.

    Built from ``fixture.config`` with ``num_hidden_layers = e2e_layers``, a one-row embedding (the run
    feeds ``inputs_embeds``) and the final norm replaced by identity (so the output is the hidden state
    after the last layer, as captured). Weights are ``layer_state`` cast to ``dtype``; the rotary
    frequencies stay float32. Needs transformers (and ``attn_implementation`` registered, if not built in).
    Raises ValueError when the fixture has no end-to-end part, RuntimeError if the state dict does not fit.
    """
    if fixture.e2e_layers == 0:
        raise ValueError("this fixture has no end-to-end part (captured with --e2e-layers 0)")
    from transformers import LlamaConfig, LlamaModel

    cfg = dict(fixture.config)
    cfg.update(num_hidden_layers=fixture.e2e_layers, vocab_size=1, pad_token_id=None,
               attn_implementation=attn_implementation)
    model = LlamaModel(LlamaConfig(**cfg))
    model.norm = torch.nn.Identity()
    state = dict(fixture.layer_state, **{"embed_tokens.weight": torch.zeros(1, cfg["hidden_size"])})
    model.load_state_dict(state, strict=True)
    model = model.to(device=device, dtype=dtype).eval()
    # rotary frequencies in float32 whatever the model dtype, as transformers computes them
    model.rotary_emb = type(model.rotary_emb)(config=model.config).to(device)
    return model


def run_layers(model, fixture: Fixture) -> torch.Tensor:
    """The hidden states (batch, seqlen, hidden) after the rebuilt layers, in the model's dtype/device."""
    p = next(model.parameters())
    with torch.no_grad():
        return model(inputs_embeds=fixture.inputs_embeds.to(device=p.device, dtype=p.dtype)).last_hidden_state
