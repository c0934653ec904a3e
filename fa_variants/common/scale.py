"""The softmax scale: which values are legal, and the form every kernel receives.

Pure Python (no CuTe DSL), so the public API validates with the same rule the kernels rely on.

* Kernels compute ``c = softmax_scale * log2(e)`` in float32 and take exp2, so ``|softmax_scale|`` must be
  at most float32 max / log2(e) (``MAX_SOFTMAX_SCALE``) and finite (`check_softmax_scale`).
* The online softmax keeps the row max of the *raw* scores, which is the max of the scaled scores only when
  c > 0 (docs/design.md, "Online softmax"). `positive_scale` maps any legal scale to that form:
  softmax(c Q K^T) = softmax(|c| Q (-K)^T) for c < 0 (negating fp16/bf16 is exact), and a scale that is 0,
  or that float32 flushes to 0 once multiplied by log2(e), becomes the smallest normal float32, for which
  exp2((s - m) c) rounds to exactly 1 on every visible key (the uniform average c = 0 means) while masked
  keys (-inf) still get 0 (passing c = 0 itself would give -inf * 0 = NaN on masked scores).
"""
from __future__ import annotations

import math
import sys

from fa_variants.common.checks import is_real, one_line

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # smallest normal float32
#: the largest |softmax_scale|: kernels fold it into log2(e) in float32, which must stay finite
MAX_SOFTMAX_SCALE = FLOAT32_MAX / LOG2_E
#: |m c| (a row max in log2 units) from which the one-FFMA exponents take their exact form: the basis m c is rounded
#: by at most 2^-14 below it (``common.softmax``'s module docstring; the FP8 emulation follows the same rule)
FFMA_LIMIT = 2.0**11


def check_softmax_scale(softmax_scale, name: str = "softmax_scale", kernel_range: bool = True,
                        none_ok: bool = True) -> float:
    """``softmax_scale`` as a float, if legal; ``name``: the argument the messages name (SDPA's ``scale``);
    ``kernel_range`` False: any finite float (the float64 reference, ``reference.attention_reference``);
    ``none_ok``: whether the caller's argument may be None (its default), which the TypeError's message then says
    (the caller resolves None itself before calling this).

    Plain comparisons only (no ``math.isfinite``), so that a symbolic float of torch.compile with dynamic
    shapes (``q.size(-1) ** -0.5``, a ``torch.SymFloat``) is checked by guards instead of breaking the graph.

    Raises:
        TypeError: not a real number (a bool counts as not; a numpy scalar is one, except while traced by
            torch.compile: `_not_real`).
        ValueError: not finite, an int beyond float range, or |softmax_scale| > MAX_SOFTMAX_SCALE (kernel_range).
    """
    if not is_real(softmax_scale):
        raise _not_real(softmax_scale, name, none_ok)
    try:
        scale = float(softmax_scale)
    except OverflowError:  # an int beyond float range
        raise ValueError(f"{name} must be finite, got an int of {len(str(abs(softmax_scale)))} "
                         "digits") from None
    if not -math.inf < scale < math.inf:  # False for inf and NaN
        raise ValueError(f"{name} must be finite, got {scale}")
    if kernel_range and abs(scale) > MAX_SOFTMAX_SCALE:
        raise ValueError(f"{name} {scale:g} is out of range: |{name}| must be <= "
                         f"{MAX_SOFTMAX_SCALE:.4g} (the kernels compute softmax_scale * log2(e) in float32)")
    return scale


def _not_real(value, name: str, none_ok: bool = True) -> TypeError:
    """The TypeError for a ``name`` that is not a real number. numpy real scalars are numbers.Real (numpy
    registers them), as SDPA's ``scale`` takes them; but under torch.compile Dynamo traces a numpy scalar as a
    0-d tensor whose value is an unbacked symbol that neither the range check nor the custom op's ``float?``
    can take (and whose repr it cannot trace): then the message names the fix, ``float(name)``."""
    np = sys.modules.get("numpy")  # never imported here: a numpy value implies numpy is loaded
    what = "a real number or None" if none_ok else "a real number"
    if _tracing():
        if np is not None and isinstance(value, np.ndarray):
            return TypeError(f"{name} is a numpy value, which torch.compile traces as a tensor: pass float({name})")
        return TypeError(f"{name} must be {what}, got {type(value).__name__}")
    shown, hint = one_line(value), ""
    if "torch.func.vmap" in shown:  # its values are not the caller's to read
        hint = f" ({name} is one number per call: call once per value)"
    elif type(value).__module__.startswith("torch") and getattr(value, "numel", lambda: 0)() == 1:
        hint = f" (a tensor: pass {name}.item())"
    return TypeError(f"{name} must be {what}, got {shown}{hint}")


def _tracing() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def kernel_scale(softmax_scale: float) -> tuple[bool, float]:
    """(negate_k, c): the scale a kernel runs with, c > 0, and whether K must be negated (c < 0).
    Raises as `check_softmax_scale`."""
    scale = check_softmax_scale(softmax_scale)
    if abs(scale) * LOG2_E < FLOAT32_TINY:  # 0, or flushed to 0 in float32
        return False, FLOAT32_TINY
    return scale < 0, abs(scale)


def positive_scale(k, softmax_scale: float):
    """(k, c) with c > 0 and the same attention (`kernel_scale`); k is a torch tensor, negated (one copy)
    only for a negative scale."""
    negate, scale = kernel_scale(softmax_scale)
    return (-k if negate else k), scale
