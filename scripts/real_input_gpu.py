"""Real input on the GPU host: SmolLM2's captured attention through every backend, and its first layers end to end.

    source .gpu/env.sh && python3 scripts/real_input_gpu.py --fixture .fixtures/smollm2_135m_instruct.pt.xz

(the fixture comes from ``python -m fa_variants.integrations.capture``; on a machine without CUDA the same
script runs the reference backend and the FP8 emulation, a sanity check of the pipeline.)

Part 1, per layer. The fixture's Q, K, V after rotary of all 30 layers (float16; bfloat16 is the same
values rounded once more) are stacked on the batch dimension and sent through ``fa_variants.attention``
once per backend the dispatcher lists for this GPU (fa3, fa2, fa1, reference; a backend that cannot serve
the call is listed with the dispatcher's reason). Per layer: max |O - O_fp64| and RMSE against the float64
reference on the same inputs, and the project's rule, pass iff max error <= 2 * (PyTorch in the same
dtype's max error) + 1e-5. FP8: the emulation reference of ``fa_variants.fp8`` (FP8Config()
defaults: block scales, Hadamard, smooth K) and, where ``fa_variants.fp8.fa3_fp8.attention_fp8`` exists,
the kernel with that config, bounded by ``fp8_error_bound`` (2 * emulation error + 1e-4).

Part 2, end to end. The first decoder layers of the model are rebuilt with transformers from the fixture's
float16 weights (``fixture.build_layers``) and run on the prompt's embeddings with each attention: eager
(transformers' own, in the dtype), sdpa (for information), and ``attn_implementation="fa_variants_<backend>"``
(our transformers integration, one name per backend), all against the same layers run in float64 with eager
attention. Metrics on the final hidden states h (batch, seqlen, hidden): relative L2 ||h - h64|| / ||h64||
and max |h - h64|. Bound (the tolerance rule with eager attention as the same-dtype reference): rel L2 <=
2 * eager's rel L2 + 1e-6 and max abs <= 2 * eager's max abs + ulp, ulp being the dtype's spacing at
max |h64| (the hidden state is itself rounded to the dtype, so a one-step rounding difference must pass).
A rebuild check compares the float64 layers with the hidden states the full float32 model produced on the
CPU at capture time (they differ by the float16 rounding of the weights: rel L2 must be < 1e-2).

Writes real_input.md (the tables) and real_input.json under --out (default: $OUT, else results/real_input).
Exit status 0 when every measured cell is within its bound and no backend raised, 1 otherwise, 2 without a
fixture. A backend that raises is reported (stderr, the Errors section, JSON) and the others still run.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import torch

import fa_variants
from fa_variants import dispatch
from fa_variants.integrations import fixture as fx
from fa_variants.reference import ATOL, attention_reference, max_abs_error, rel_l2

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
REBUILD_REL_L2 = 1e-2


def rmse(x: torch.Tensor, ref: torch.Tensor) -> float:
    return (x.double() - ref.double()).pow(2).mean().sqrt().item()


def _fp8_pieces():
    """(FP8Config, fp8_attention_reference, fp8_error_bound, kernel attention_fp8 or None), or None."""
    try:
        from fa_variants import fp8
        from fa_variants.fp8 import attention as fp8_attention
    except ImportError:
        return None
    kernel = None
    if torch.cuda.is_available() and fp8_attention.why_not(torch.device("cuda")) is None:
        kernel = functools.partial(fp8.attention_fp8, return_lse=True)
    return fp8.FP8Config, fp8.fp8_attention_reference, fp8.fp8_error_bound, kernel


def _failed(errors: list[dict], what: str, exc: Exception) -> None:
    """Record a backend that raised (a failure of the run, not a skip) and go on with the others."""
    errors.append(dict(what=what, error=f"{type(exc).__name__}: {exc}"))
    print(f"FAILED {what}: {type(exc).__name__}: {exc}", file=sys.stderr)


def per_layer(fixture: fx.Fixture, device: torch.device, dtype: torch.dtype, notes: list[str],
              errors: list[dict]) -> list[dict]:
    """Part 1 for one dtype: one dict per (backend, layer) with max_abs, rmse, bound, ok, seconds.
    A backend that cannot serve the call is a note; one that raises is an entry of ``errors``."""
    q, k, v = fixture.attention_inputs(device=device, dtype=dtype)
    L, B = fixture.q.shape[:2]
    kw = dict(causal=fixture.causal, softmax_scale=fixture.softmax_scale)
    exact, _ = attention_reference(q, k, v, dtype=torch.float64, **kw)
    same, _ = attention_reference(q, k, v, dtype=dtype, **kw)
    layer = lambda t, i: t[i * B:(i + 1) * B]  # noqa: E731  layer i of the stacked batch
    err_torch = [max_abs_error(layer(same, i), layer(exact, i)) for i in range(L)]
    outputs: dict[str, tuple[torch.Tensor, float, list[float]]] = {
        f"torch {dtype_name(dtype)}": (same, 0.0, [math.inf] * L)}
    capability = dispatch.device_capability(device)
    for name in dispatch.backends_for(capability):
        if name == "fa3-fp8":
            continue  # below, with its own reference
        reason = dispatch.why_not(name, capability, dtype, q.shape[-1])
        if reason:
            notes.append(f"{dtype_name(dtype)}: {name} skipped: {reason}")
            continue
        try:
            start = time.perf_counter()
            out = fa_variants.attention(q, k, v, backend=name, **kw)
            _sync(device)
        except Exception as exc:  # noqa: BLE001  (a kernel failure is reported; the other backends still run)
            _failed(errors, f"{name} {dtype_name(dtype)} per layer", exc)
            continue
        outputs[name] = (out, time.perf_counter() - start, [2 * e + ATOL for e in err_torch])
    fp8 = _fp8_pieces()
    if fp8 is None:
        notes.append("fp8: fa_variants.fp8 not importable; FP8 skipped")
    else:
        FP8Config, emulate, bound, kernel = fp8
        start = time.perf_counter()
        emu, _ = emulate(q, k, v, config=FP8Config(), **kw)
        bounds = [bound(layer(emu, i), layer(exact, i)) for i in range(L)]
        outputs["fp8 emulation"] = (emu, time.perf_counter() - start, [math.inf] * L)
        if kernel is None:
            notes.append("fa3-fp8: the kernel does not run here (fa_variants.fp8.attention.why_not): emulation only")
        elif reason := dispatch.why_not("fa3-fp8", capability, dtype, q.shape[-1]):  # e.g. its head dims
            notes.append(f"{dtype_name(dtype)}: fa3-fp8 skipped: {reason}: emulation only")
        else:
            try:
                start = time.perf_counter()
                out, _ = kernel(q, k, v, config=FP8Config(), **kw)
                _sync(device)
                outputs["fa3-fp8"] = (out, time.perf_counter() - start, bounds)
            except Exception as exc:  # noqa: BLE001
                _failed(errors, f"fa3-fp8 {dtype_name(dtype)} per layer", exc)
    rows = []
    for name, (out, seconds, bounds) in outputs.items():
        for i in range(L):
            err = max_abs_error(layer(out, i), layer(exact, i))
            rows.append(dict(dtype=dtype_name(dtype), backend=name, layer=i, max_abs=err,
                             rmse=rmse(layer(out, i), layer(exact, i)), bound=bounds[i],
                             ok=bool(err <= bounds[i]), seconds=round(seconds, 3)))
    return rows


def end_to_end(fixture: fx.Fixture, device: torch.device, dtype: torch.dtype, notes: list[str],
               errors: list[dict]) -> list[dict]:
    """Part 2 for one dtype: one dict per attention implementation with rel_l2, max_abs, bounds, ok."""
    from fa_variants.integrations import hf

    h64 = fx.run_layers(fx.build_layers(fixture, dtype=torch.float64, device=device), fixture)
    cpu = fixture.hidden_states[-1].to(device)
    rebuild = rel_l2(h64, cpu)
    rows = [dict(dtype=dtype_name(dtype), attention="float64 rebuild vs CPU float32 model", rel_l2=rebuild,
                 max_abs=max_abs_error(h64, cpu), rel_l2_bound=REBUILD_REL_L2, max_abs_bound=math.inf,
                 ok=bool(rebuild < REBUILD_REL_L2))]
    ulp = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(h64.abs().max().item()))
    impls = {"eager": "eager", "sdpa": "sdpa"}
    capability = dispatch.device_capability(device)
    for name in dispatch.backends_for(capability):
        if name == "fa3-fp8":
            continue
        reason = dispatch.why_not(name, capability, dtype, fixture.q.shape[-1])
        if reason:
            notes.append(f"end to end {dtype_name(dtype)}: {name} skipped: {reason}")
            continue
        impls[f"fa_variants ({name})"] = hf.register(f"fa_variants_{name}", backend=name)
    eager = dict(rel_l2=math.nan, max_abs=math.nan)  # the bound's base; NaN (every check fails) if eager raised
    for label, impl in impls.items():
        try:
            model = fx.build_layers(fixture, dtype=dtype, device=device, attn_implementation=impl)
            h = fx.run_layers(model, fixture)
        except Exception as exc:  # noqa: BLE001
            _failed(errors, f"{label} {dtype_name(dtype)} end to end", exc)
            continue
        row = dict(dtype=dtype_name(dtype), attention=label, rel_l2=rel_l2(h, h64), max_abs=max_abs_error(h, h64))
        if label == "eager":
            eager = row
        informative = not label.startswith("fa_variants")
        row["rel_l2_bound"] = math.inf if informative else 2 * eager["rel_l2"] + 1e-6
        row["max_abs_bound"] = math.inf if informative else 2 * eager["max_abs"] + ulp
        row["ok"] = bool(row["rel_l2"] <= row["rel_l2_bound"] and row["max_abs"] <= row["max_abs_bound"])
        rows.append(row)
    return rows


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, str(dtype).removeprefix("torch."))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def layer_markdown(rows: list[dict], dtype: str) -> str:
    """One table: a row per layer, a 'max / RMSE' column per backend; a failing cell is marked FAIL."""
    rows = [r for r in rows if r["dtype"] == dtype]
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    cell = {(r["backend"], r["layer"]): r for r in rows}
    layers = sorted({r["layer"] for r in rows})
    lines = [f"| layer | {' | '.join(backends)} |", "|---:|" + "---|" * len(backends)]

    def fmt(r):
        mark = "" if r["ok"] or math.isinf(r["bound"]) else f" FAIL (bound {r['bound']:.1e})"
        return f"{r['max_abs']:.2e} / {r['rmse']:.2e}{mark}"

    for i in layers:
        lines.append(f"| {i} | " + " | ".join(fmt(cell[b, i]) for b in backends) + " |")
    worst = [max((cell[b, i] for i in layers), key=lambda r: r["max_abs"]) for b in backends]
    lines.append("| worst | " + " | ".join(f"{r['max_abs']:.2e} (layer {r['layer']})" for r in worst) + " |")
    return "\n".join(lines)


def e2e_markdown(rows: list[dict]) -> str:
    lines = ["| dtype | attention | rel L2 vs float64 | bound | max abs vs float64 | bound | ok |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        b = lambda x: "-" if math.isinf(x) else f"{x:.2e}"  # noqa: E731
        ok = "-" if math.isinf(r["rel_l2_bound"]) and math.isinf(r["max_abs_bound"]) else (
            "ok" if r["ok"] else "FAIL")
        lines.append(f"| {r['dtype']} | {r['attention']} | {r['rel_l2']:.2e} | {b(r['rel_l2_bound'])} | "
                     f"{r['max_abs']:.2e} | {b(r['max_abs_bound'])} | {ok} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--fixture", help="fixture path (default: fa_variants.integrations.fixture.find_fixture())")
    parser.add_argument("--dtypes", default="fp16,bf16", help="comma-separated, from fp16,bf16")
    parser.add_argument("--out", help="output folder (default: $OUT, else results/real_input)")
    parser.add_argument("--no-e2e", action="store_true", help="skip the end-to-end part")
    args = parser.parse_args(argv)
    path = args.fixture or fx.find_fixture()
    if path is None or not Path(path).is_file():
        print(f"no fixture at {path or fx.candidate_paths()}: run python -m fa_variants.integrations.capture",
              file=sys.stderr)
        return 2
    fixture = fx.Fixture.load(path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (reference only)"
    out_dir = Path(args.out or os.environ.get("OUT") or "results/real_input")
    out_dir.mkdir(parents=True, exist_ok=True)
    dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
    notes: list[str] = []
    errors: list[dict] = []
    warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)

    layer_rows, e2e_rows = [], []
    for dtype in dtypes:
        layer_rows += per_layer(fixture, device, dtype, notes, errors)
        if fixture.e2e_layers == 0:
            notes.append("end to end skipped: the fixture has no layers (captured with --e2e-layers 0)")
        elif importlib.util.find_spec("transformers") is None:
            notes.append("end to end skipped: transformers is not installed")
        elif not args.no_e2e:
            e2e_rows += end_to_end(fixture, device, dtype, notes, errors)

    md = [f"# Real input: {fixture.model_name}", "",
          f"{fixture.describe()}. Device: {where}; torch {torch.__version__}.",
          f"Text: \"{fixture.text[:80]}...\" ({fixture.q.shape[2]} tokens). Capture check on the CPU: max "
          f"|eager float32 out - float64 recompute| = {max(fixture.capture_error):.1e}.", ""]
    for dtype in dtypes:
        name = dtype_name(dtype)
        md += [f"## Per layer, {name}: max |O - O_fp64| / RMSE", "",
               "Bound for kernels: 2 * (torch same-dtype max error) + 1e-5; FP8: 2 * (emulation error) + 1e-4.",
               "", layer_markdown(layer_rows, name), ""]
    if e2e_rows:
        md += [f"## End to end: the first {fixture.e2e_layers} decoder layers, final hidden states", "",
               "Bounds: rel L2 <= 2 * eager's + 1e-6; max abs <= 2 * eager's + ulp(max |h64|).", "",
               e2e_markdown(e2e_rows), ""]
    notes = list(dict.fromkeys(notes))
    if errors:
        md += ["## Errors", ""] + [f"- {e['what']}: {e['error']}" for e in errors] + [""]
    if notes:
        md += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    text = "\n".join(md)
    (out_dir / "real_input.md").write_text(text)
    (out_dir / "real_input.json").write_text(json.dumps(
        dict(fixture=fixture.describe(), device=where, torch=torch.__version__, info=fixture.info,
             per_layer=layer_rows, end_to_end=e2e_rows, notes=notes, errors=errors), indent=1, default=str))
    print(text)
    failed = [r for r in layer_rows + e2e_rows if not r["ok"]]
    verdict = "all within bounds" if not failed else f"{len(failed)} cells FAIL"
    print(f"wrote {out_dir / 'real_input.md'} and real_input.json; {verdict}; {len(errors)} errors")
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
