"""`fa-variants info`: versions, GPUs and their compute capabilities, the backends, and what `auto` picks.

Works on a machine without a GPU (it then shows the picks for the CPU). ``--json`` prints the same facts as
one JSON object, for scripts.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import warnings

import torch

from fa_variants import dispatch, registry

PICK_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
PICK_HEAD_DIMS = (64, 128, 256)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def versions() -> dict[str, str]:
    """Versions of Python, torch (and its CUDA), the CuTe DSL and this package."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch CUDA": torch.version.cuda or "none (CPU build)",
        "nvidia-cutlass-dsl": _version("nvidia-cutlass-dsl"),
        "fa-variants": _version("fa-variants"),
    }


def gpus() -> list[dict]:
    """Each visible CUDA device: index, name, arch (sm_XY) and memory in GiB."""
    if not torch.cuda.is_available():
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        found.append({"index": index, "name": props.name, "arch": f"sm_{props.major}{props.minor}",
                      "capability": [props.major, props.minor],
                      "memory_gib": round(props.total_memory / 2**30, 1)})
    return found


def backends() -> list[dict]:
    """Each backend: archs, whether it is built (or why not), dtypes and head dims from its module."""
    rows = []
    for name in dispatch.BACKENDS:
        entry, loaded = registry.ENTRIES[name], dispatch.load(name)
        built = not isinstance(loaded, str)
        rows.append({
            "name": name, "module": entry.module, "summary": entry.summary,
            "archs": list(dispatch.supported_archs(name) or ["any (CPU included)"]),
            "status": "built" if built else ("not built yet" if "not built yet" in loaded else loaded),
            "dtypes": [str(d).removeprefix("torch.") for d in loaded.dtypes] if built else None,
            "head_dims": (list(loaded.head_dims) if loaded.head_dims is not None else "any") if built else None,
        })
    return rows


def auto_picks(capability: tuple[int, int] | None) -> list[dict]:
    """What backend="auto" picks on a device of this capability for each dtype and head dim, and why."""
    picks = []
    for dtype_name, dtype in PICK_DTYPES.items():
        for head_dim in PICK_HEAD_DIMS:
            row = {"dtype": dtype_name, "head_dim": head_dim}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
                    sel = dispatch.select(capability, dtype, head_dim, backend="auto")
                row.update(backend=sel.backend, reason=sel.reason)
            except ValueError as exc:
                row.update(backend=None, reason=str(exc))
            picks.append(row)
    return picks


def collect() -> dict:
    """Every fact `fa-variants info` shows, as plain data."""
    devices = gpus()
    targets = [(f"cuda:{g['index']} ({g['arch']})", tuple(g["capability"])) for g in devices] or [("cpu", None)]
    present = {cap for _, cap in targets}
    # what auto would pick on the two archs the kernels target, even where no such GPU is present
    targets += [(f"sm_{a}{b} (not present here)", (a, b)) for a, b in ((8, 0), (9, 0)) if (a, b) not in present]
    return {
        "versions": versions(),
        "gpus": devices,
        "backends": backends(),
        "env_override": {dispatch.ENV_VAR: dispatch.env_override()},
        "auto_picks": {label: auto_picks(cap) for label, cap in targets},
    }


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def _print_tables(facts: dict) -> None:
    from rich.table import Table

    from fa_variants.cli import console as make_console

    console = make_console()
    table = Table(title="versions", show_header=False)
    for key, value in facts["versions"].items():
        table.add_row(key, value)
    console.print(table)

    if facts["gpus"]:
        table = Table(title="GPUs")
        for col in ("index", "name", "arch", "memory (GiB)"):
            table.add_column(col)
        for g in facts["gpus"]:
            table.add_row(str(g["index"]), g["name"], g["arch"], str(g["memory_gib"]))
        console.print(table)
    else:
        console.print("GPUs: none visible to torch (CPU only): every call runs the reference path")

    table = Table(title="backends")
    for col in ("backend", "archs", "status", "dtypes", "head dims"):
        table.add_column(col)
    for b in facts["backends"]:
        table.add_row(b["name"], ", ".join(b["archs"]), b["status"],
                      ", ".join(b["dtypes"]) if b["dtypes"] else "-",
                      (b["head_dims"] if isinstance(b["head_dims"], str)
                       else ", ".join(map(str, b["head_dims"])) if b["head_dims"] else "-"))
    console.print(table)
    override = facts["env_override"][dispatch.ENV_VAR]
    if override:
        console.print(f"{dispatch.ENV_VAR}={override} overrides backend='auto' for every call")

    for device, picks in facts["auto_picks"].items():
        table = Table(title=f"backend='auto' on {device}")
        for col in ("dtype", "head_dim", "backend", "reason"):
            table.add_column(col)
        for p in merge_head_dims(picks):
            table.add_row(p["dtype"], p["head_dims"], p["backend"] or "error", p["reason"], end_section=True)
        console.print(table)


def merge_head_dims(picks: list[dict]) -> list[dict]:
    """One row per dtype when every head_dim gets the same backend for the same reason (the reason with
    its head_dim written as D), else one row per head_dim; each row has head_dims as text."""
    rows = []
    for dtype in dict.fromkeys(p["dtype"] for p in picks):
        group = [p for p in picks if p["dtype"] == dtype]
        general = {(p["backend"], p["reason"].replace(f"head_dim {p['head_dim']}", "head_dim D")) for p in group}
        if len(group) > 1 and len(general) == 1:
            backend, reason = general.pop()
            dims = ", ".join(str(p["head_dim"]) for p in group)
            rows.append(dict(dtype=dtype, head_dims=dims, backend=backend,
                             reason=reason.replace("head_dim D", f"head_dim D = {dims}")))
        else:
            rows += [dict(p, head_dims=str(p["head_dim"])) for p in group]
    return rows


def run_cli(args: argparse.Namespace) -> int:
    facts = collect()
    if args.json:
        print(json.dumps(facts, indent=1))
    else:
        _print_tables(facts)
    return 0
