"""`fa-variants demo`: one realistic attention call through the dispatcher, checked against float64.

On a GPU: batch 2, seqlen 2048, 16 heads, head_dim 128, bf16, causal (an LLM prefill), on the backend that
``auto`` picks; it prints the backend, the reason, the error against the float64 reference under the
project's tolerance rule, the first-call time (which includes any kernel compile) and the steady time per
call with the TFLOP/s it implies. Without a GPU it runs a smaller input on the reference path (plain
PyTorch on the CPU) and says so. Exit status 0 when the output passes the rule, 1 otherwise.

``load_real_input`` is the hook for an input captured from a real model (fa_variants.integrations).
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings
from dataclasses import dataclass

import torch

from fa_variants import api, dispatch
from fa_variants.common.checks import allocating
from fa_variants.reference import check_against_reference, check_lse, references

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
GPU_SHAPE = dict(batch=2, seqlen=2048, heads=16, head_dim=128)
CPU_SHAPE = dict(batch=1, seqlen=1024, heads=8, head_dim=128)


@dataclass
class DemoInput:
    """One attention call: q (B, Nq, H, D), k and v (B, Nk, Hkv, D), the mask, and where it came from."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: bool
    description: str


def load_real_input(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> DemoInput | None:
    """Q, K, V captured from a real model (SmolLM2-135M-Instruct, every layer after rotary), on ``device``.

    Returns None when no fixture has been captured (``python -m fa_variants.integrations.capture``,
    see fa_variants.integrations.fixture for where it is looked for); the demo then uses random input.
    """
    try:
        from fa_variants.integrations.fixture import load_real_input as load_fixture
    except ImportError:
        return None
    fixture = load_fixture()
    if fixture is None:
        return None
    q, k, v = fixture.attention_inputs(device=device, dtype=dtype)  # layers stacked as the batch
    # the mask is shown on its own row (the demo may override it): drop it from the description
    what = fixture.describe().replace(", causal,", ",").replace(", full,", ",")
    return DemoInput(q, k, v, fixture.causal, what)


def synthetic_input(device: torch.device, *, batch: int, seqlen: int, heads: int, head_dim: int,
                    dtype: torch.dtype, causal: bool, seed: int | None) -> DemoInput:
    """q, k, v ~ N(0, 1) of shape (batch, seqlen, heads, head_dim)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else torch.seed())
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype, generator=gen)
               for _ in range(3))
    what = f"random N(0,1): batch {batch}, seqlen {seqlen}, {heads} heads, head_dim {head_dim}"
    return DemoInput(q, k, v, causal, what)


def attention_flops(inp: DemoInput) -> float:
    """4 * D * (number of visible (query, key) pairs) per head and batch: two matmuls, 2 FLOPs a MAC."""
    batch, seqlen_q, heads, head_dim = inp.q.shape
    seqlen_k = inp.k.shape[1]
    rows = torch.arange(seqlen_q)
    visible = ((rows + seqlen_k - seqlen_q + 1).clamp(0, seqlen_k).sum().item() if inp.causal
               else seqlen_q * seqlen_k)
    return 4.0 * batch * heads * head_dim * visible


def _timed(fn, device: torch.device, repeats: int) -> list[float]:
    """Seconds per call of fn(), measured `repeats` times (synchronising the GPU)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from fa_variants.cli import positive_int, seed_int

    parser.add_argument("--batch", type=positive_int, help="default 2 on a GPU, 1 on the CPU")
    parser.add_argument("--seqlen", type=positive_int, help="default 2048 on a GPU, 1024 on the CPU")
    parser.add_argument("--heads", type=positive_int, help="default 16 on a GPU, 8 on the CPU")
    parser.add_argument("--head-dim", type=positive_int, help="default 128")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                        help="causal mask (default: on, as in an LLM prefill; a captured input keeps its own)")
    parser.add_argument("--backend", default="auto", help=f"auto (default), {', '.join(dispatch.BACKENDS)}")
    parser.add_argument("--repeats", type=positive_int, default=10, help="timed calls after the first (GPU)")
    parser.add_argument("--seed", type=seed_int, help="random seed in [0, 2^64 - 1] (default: fresh)")
    parser.add_argument("--random", action="store_true",
                        help="use random input even if a captured one exists (implied by --batch, --seqlen, "
                             "--heads, --head-dim)")


SHAPE_FLAGS = ("batch", "seqlen", "heads", "head_dim")


def _input(args: argparse.Namespace, device: torch.device) -> tuple[DemoInput, str | None]:
    """The demo's input and a note for the user (None if nothing to say): the captured real input when
    one exists, unless --random or a size flag asks for a random one of that size."""
    sized = [f"--{key.replace('_', '-')}" for key in SHAPE_FLAGS if getattr(args, key) is not None]
    real = None if args.random or sized else load_real_input(device, DTYPES[args.dtype])
    if real is not None:
        if args.causal is not None:
            real.causal = args.causal
        return real, "using the captured real input (--random, --seqlen, --head-dim, ... for a random one)"
    shape = dict(GPU_SHAPE if device.type == "cuda" else CPU_SHAPE)
    for key in shape:
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    causal = True if args.causal is None else args.causal
    sizes = ", ".join(f"--{key.replace('_', '-')} {value}" for key, value in shape.items())
    need = 3 * shape["batch"] * shape["seqlen"] * shape["heads"] * shape["head_dim"] * DTYPES[args.dtype].itemsize
    with allocating(f"q, k, v of {sizes} on {device}", "choose smaller sizes", need, device):
        inp = synthetic_input(device, dtype=DTYPES[args.dtype], causal=causal, seed=args.seed, **shape)
    note = (f"{', '.join(sized)} given: random input of that size, not a captured one"
            if sized and not args.random and load_real_input(device, DTYPES[args.dtype]) is not None else None)
    return inp, note


def _say(console, text: str) -> None:
    """A progress line on stderr (shows when stdout is piped too)."""
    console.print(text, style="dim", highlight=False)


def run_cli(args: argparse.Namespace) -> int:
    from rich.table import Table

    from fa_variants.cli import console as make_console

    console, progress = make_console(), make_console(stderr=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    inp, note = _input(args, device)
    q, k, v, causal = inp.q, inp.k, inp.v, inp.causal
    with warnings.catch_warnings():  # the fallback reason is printed below
        warnings.simplefilter("ignore", dispatch.BackendFallbackWarning)
        selection = api.select_backend(q, k, v, causal=causal, backend=args.backend)
    if note:  # after the checks: a bad argument stays a one-line error
        _say(progress, note)
    if device.type != "cuda":
        gflop = attention_flops(inp) / 1e9
        _say(progress, f"no CUDA GPU: running the reference path on the CPU ({gflop:.3g} GFLOP per call, twice, "
                       "then the float64 and same-dtype references; large --seqlen takes minutes)")

    def call():
        return api.attention(q, k, v, causal=causal, backend=selection.backend, return_lse=True)

    with torch.no_grad():
        first = _timed(call, device, 1)[0]
        out, lse = call()
        steady = _timed(call, device, args.repeats if device.type == "cuda" else 1)
        if device.type != "cuda":
            _say(progress, f"attention done ({steady[0] * 1e3:.0f} ms per call); computing the references")
        refs = references(q, k, v, causal=causal)
    check = check_against_reference(out, q, k, v, causal, refs=refs)
    lse_check = check_lse(lse, q, k, v, causal, refs=refs)
    per_call = statistics.median(steady)
    arch = dispatch.arch_name(dispatch.device_capability(device))
    where = torch.cuda.get_device_name(device) + f" ({arch})" if device.type == "cuda" else "CPU"

    table = Table(title="fa-variants demo", show_header=False)
    table.add_row("input", f"{inp.description}, {str(q.dtype).removeprefix('torch.')}")
    table.add_row("mask", "causal (bottom-right)" if causal else "none (full attention)")
    table.add_row("device", where)
    table.add_row("backend", selection.backend)
    table.add_row("reason", selection.reason)
    table.add_row("could also run on", ", ".join(c for c in selection.candidates if c != selection.backend)
                  or "-")
    table.add_row("first call (incl. any compile)", f"{first * 1e3:.1f} ms")
    label = f"time per call (median of {len(steady)})"
    table.add_row(label, f"{per_call * 1e3:.3f} ms = {attention_flops(inp) / per_call / 1e12:.3g} TFLOP/s")
    table.add_row("output vs float64 reference", str(check))
    table.add_row("LSE vs float64 reference", str(lse_check))
    console.print(table)
    if device.type != "cuda":
        console.print("No CUDA GPU here: this ran the reference path (plain PyTorch, float32 maths) on the "
                      "CPU. On an sm80/sm90 GPU the same command runs the FlashAttention kernels.")
    ok = check.ok and lse_check.ok
    console.print("PASS: output within the tolerance rule" if ok else "FAIL: output outside the tolerance rule")
    return 0 if ok else 1
