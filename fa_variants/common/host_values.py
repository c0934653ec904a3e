"""Whether a tensor's values can be read on the host, for the entry points whose work depends on them (the FP8
recipe's block scales and overflow shift, ``seqlens_k``'s range check): a tensor batched by ``torch.func.vmap``
(its values cannot steer Python: vmap raises about "data-dependent control flow" or, for a seeded generator,
"random operation"), a functionalized one (``torch.func.functionalize``: no storage), a fake tensor
(``FakeTensorMode``, torch.export's tracing) and a meta tensor have none to read. Such calls are refused in one line
naming the reason, instead of those errors from deep inside.
"""
from __future__ import annotations

import sys

import torch

__all__ = ["vmapped", "unreadable", "eagerly", "trace_may_break"]


def vmapped(t: torch.Tensor) -> bool:
    """True for a tensor that torch.func.vmap batches, at any level of torch.func's wrappers."""
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(t):
        if functorch.is_batchedtensor(t):
            return True
        t = functorch.get_unwrapped(t)
    return False


def unreadable(t: torch.Tensor) -> str | None:
    """Why t's values cannot be read on the host ("batched by torch.func.vmap", "functionalized by
    torch.func.functionalize", "a fake tensor (FakeTensorMode or torch.export)", "a meta tensor"); None when they
    can."""
    if vmapped(t):
        return "batched by torch.func.vmap"
    if torch._is_functional_tensor(t):  # its storage is not allocated: .tolist() raises from deep inside
        return "functionalized by torch.func.functionalize"
    fake = sys.modules.get("torch._subclasses.fake_tensor")  # no fake tensor exists before torch loads it
    if fake is not None and fake.is_fake(t):
        return "a fake tensor (FakeTensorMode or torch.export)"
    if t.device.type == "meta":
        return "a meta tensor"
    return None


def eagerly(fn, *args):
    """``fn(*args)`` run by Python itself, never compiled by Dynamo: for the functions that read a tensor's values
    on the host and branch on them (a mask's flags). While torch.compile traces, the call is a graph break (also
    with ``torch._dynamo.config.capture_scalar_outputs``, under which a read traced in the graph becomes an unbacked
    symbol that the branch cannot guard on); called eagerly from a compiled region's resumed code, Dynamo does not
    compile ``fn``'s frame either. Where Dynamo was never imported, a plain call (importing it costs seconds). The
    wrapper is made per call (a few microseconds; ``fn`` may be a closure): for reads, not per-call paths."""
    if "torch._dynamo" not in sys.modules and not torch.compiler.is_compiling():
        return fn(*args)
    return torch.compiler.disable(fn)(*args)


def trace_may_break() -> bool:
    """While torch.compile traces: whether the frame Dynamo is tracing may break its graph here, where a value must
    be read on the host. Not under ``fullgraph=True`` nor strict export (the tracer's ``one_graph``), not in a
    ``torch._dynamo.error_on_graph_break(True)`` region (a flag the root tracer reads only at its next step, so read
    here), not inside a higher-order op's body (``nested_compile_region``, checkpoint, ``torch.cond``: a tracer with
    a parent): the conditions of Dynamo's ``should_compile_partial_graph`` that hold across inlined frames (its
    with- / try-block tests are the root frame's, and Dynamo resumes a break in an inlined frame at the root's
    call). False where Dynamo cannot be asked (another torch's internals, a non-strict export, which does not run
    Dynamo). Dynamo calls it while tracing and keeps the answer as a constant of the trace (the mark below), so it
    asks the tracer itself, not ``is_compiling`` (False inside such a call on torch 2.11). Call it only where
    ``torch.compiler.is_compiling()`` holds."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        from torch._dynamo.utils import _get_error_on_graph_break

        tracer = InstructionTranslator.current_tx()
        return not (tracer.one_graph or tracer.error_on_graph_break or _get_error_on_graph_break()
                    or tracer.output.current_tracer.parent is not None)
    except Exception:  # noqa: BLE001 - any failure to ask means: do not read
        return False


# torch.compiler.assume_constant_result's mark, set by hand (the decorator imports torch._dynamo, 1.5-3 s, as
# api._autocast_available's): Dynamo calls the function while tracing and keeps its answer, instead of tracing it.
trace_may_break._dynamo_marked_constant = True
