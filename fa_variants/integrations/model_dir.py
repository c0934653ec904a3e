"""A transformers causal LM in a folder of chunk files, to carry it where files travel in small pieces.

    save_model_dir(model, ".smollm2", tokenizer=tok, chunk_mib=52)   # here (scripts/pack_model_chunks.py)
    model, tok = load_model_dir(".smollm2")                         # there: transformers + safetensors only

The folder holds ``config.json`` (the model's config), the tokenizer's files when one is given
(``tokenizer.json`` ...), ``model.safetensors.part-000``, ``-001``, ... (one safetensors file of the weights
in ``dtype``, float16 by default, cut into pieces of at most ``chunk_mib`` MiB; a tied ``lm_head.weight`` is
left out, as transformers does) and ``chunks.json`` (the pieces' names and sizes and the whole file's
sha256). :func:`load_model_dir` joins the pieces in memory, checks the size and sha256 (a missing or short
piece is named in a ValueError, never a half-loaded model), builds the model from ``config.json`` with
``AutoModelForCausalLM.from_config`` and loads the weights strictly.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

MANIFEST = "chunks.json"
WEIGHTS = "model.safetensors"


def save_model_dir(model, folder: str | os.PathLike, *, tokenizer=None, chunk_mib: float = 52,
                   dtype: torch.dtype = torch.float16) -> list[Path]:
    """Write ``model`` (a transformers PreTrainedModel) into ``folder`` as described in the module docstring.

    Returns the paths written. Raises ValueError for chunk_mib <= 0 or a non-floating dtype."""
    from safetensors.torch import save

    if not chunk_mib > 0:
        raise ValueError(f"chunk_mib must be > 0, got {chunk_mib}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"{WEIGHTS}.part-*"):
        old.unlink()
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    blob = save({k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()},
                metadata={"format": "pt"})
    step = max(1, int(chunk_mib * 2**20))
    parts = []
    for i, start in enumerate(range(0, len(blob), step)):
        path = folder / f"{WEIGHTS}.part-{i:03d}"
        path.write_bytes(blob[start:start + step])
        parts.append({"name": path.name, "bytes": path.stat().st_size})
    config = json.loads(model.config.to_json_string(use_diff=False))
    for key in ("quantization_config", "_name_or_path"):  # the weights are plain tensors now; no local paths
        config.pop(key, None)
    config["dtype"] = manifest_dtype = str(dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    manifest = {"weights": WEIGHTS, "dtype": manifest_dtype, "bytes": len(blob),
                "sha256": hashlib.sha256(blob).hexdigest(), "parts": parts}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    written = [folder / "config.json", folder / MANIFEST] + [folder / p["name"] for p in parts]
    if tokenizer is not None:
        written += [Path(p) for p in tokenizer.save_pretrained(str(folder))]
    return written


def _manifest(folder: Path) -> dict:
    """chunks.json, checked: {"bytes": int, "sha256": str, "parts": [{"name": str, "bytes": int}, ...]}; a piece's
    name a plain file name (no folder part). ValueError naming the folder otherwise (before: json's, a KeyError or
    a TypeError from deep in read_weights)."""
    where = f"model_dir {folder}: {MANIFEST}"
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where} is not JSON ({exc}); write the folder with scripts/pack_model_chunks.py") from None
    ok = (isinstance(manifest, dict) and isinstance(manifest.get("bytes"), int)
          and isinstance(manifest.get("sha256"), str) and isinstance(manifest.get("parts"), list) and all(
              isinstance(p, dict) and isinstance(p.get("name"), str) and Path(p["name"]).name == p["name"]
              and p["name"] not in ("", ".", "..") and isinstance(p.get("bytes"), int) for p in manifest["parts"]))
    if not ok:
        raise ValueError(f"{where} is not a manifest of save_model_dir (bytes, sha256, parts of name and bytes); "
                         "write the folder with scripts/pack_model_chunks.py")
    return manifest


def read_weights(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict of a folder written by :func:`save_model_dir` (tensors in the stored dtype, CPU).

    Raises ValueError naming the folder and the piece when chunks.json or a piece is missing, or the joined
    file's size or sha256 differs from the manifest (checked before safetensors, an optional dependency, is
    imported)."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise ValueError(f"model_dir {folder}: no {MANIFEST} (write the folder with scripts/pack_model_chunks.py)")
    manifest = _manifest(folder)
    pieces = []
    for part in manifest["parts"]:
        path = folder / part["name"]
        if not path.is_file():
            raise ValueError(f"model_dir {folder}: piece {part['name']} is missing ({len(manifest['parts'])} pieces)")
        if path.stat().st_size != part["bytes"]:
            raise ValueError(f"model_dir {folder}: piece {part['name']} has {path.stat().st_size} bytes, "
                             f"expected {part['bytes']}")
        pieces.append(path.read_bytes())
    blob = b"".join(pieces)
    if len(blob) != manifest["bytes"] or hashlib.sha256(blob).hexdigest() != manifest["sha256"]:
        raise ValueError(f"model_dir {folder}: the joined weights differ from {MANIFEST} (size or sha256)")
    from safetensors.torch import load

    return load(blob)


def load_model_dir(folder: str | os.PathLike, *, dtype: torch.dtype = torch.float32,
                   device: torch.device | str = "cpu"):
    """(model, tokenizer or None) from a folder written by :func:`save_model_dir`: the model in ``dtype`` on
    ``device``, eval mode, eager attention; the tokenizer when the folder has one. Raises ValueError as
    :func:`read_weights`, or when the weights do not fit the config (the missing / unexpected keys named)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    state = read_weights(folder)
    config = AutoConfig.from_pretrained(str(folder))
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(config, "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"model_dir {folder}: weights do not fit config.json: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    if tied:
        model.tie_weights()
    model = model.to(device=device, dtype=dtype).eval()
    tokenizer = None
    if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return model, tokenizer
