"""Every FA_VARIANTS_* switch (README.md's table) checked at once, without importing the CuTe DSL or a kernel
module: ``check_all()`` raises ``env.SwitchError`` (a ValueError, one line naming the variable) for the first set
variable whose value its switch does not take. ``fa_variants.api`` calls it when it is imported (the first use
of ``fa_variants.attention`` and friends), so that a mistyped switch read at a kernel module's import
(``FA_VARIANTS_SPLIT_KV=2``) is an error also where no kernel module loads (the CPU, the reference path).

The kernel modules still read their switches themselves (``common.env``); this table repeats only what a value
must look like. tests/test_env_switches.py checks that every variable the package reads is here (or free-form)
and that the choices here are the kernel modules' own.
"""
from __future__ import annotations

import difflib
import os
import warnings
from typing import Callable

from fa_variants.common import env


def _flag(name: str) -> Callable[[], object]:
    return lambda: env.flag(name, False)


def _auto(name: str) -> Callable[[], object]:
    return lambda: env.auto_flag(name)


def _flag_or(name: str, names: tuple[str, ...]) -> Callable[[], object]:
    return lambda: env.flag_or(name, False, names)


def _int(name: str, low: int) -> Callable[[], object]:
    return lambda: env.integer(name, str(low), low)


def _choice(name: str, names: tuple[str, ...], lower: bool = False) -> Callable[[], object]:
    def check():
        value = os.environ.get(name, "").strip()
        if value and (value.lower() if lower else value) not in names:
            raise env.SwitchError(f"{name}={env.shown(os.environ[name])} must be one of {', '.join(names)}")
    return check


_FLAGS = ("CP_COMPILE", "DECODE_FIRST_ROW", "DECODE_PDL", "DISK_CACHE", "FA2_NARROW_DECODE", "FA2_PACK_GQA",
          "FP8_QUANT_FUSED_MEAN_LATE", "FP8_QUANT_FUSED_SAMPLED_MEAN", "FP8_QUANT_STAGED_MEAN", "FP8_QUANT_WIDE",
          "FP8_QUANT_PLANS", "FP8_QUANT_CALL_PLANS", "FP8_QUANT_NONFINITE", "FP8_QUANT_DEFERRED", "LSE_SCRATCH",
          "MERGE_KERNEL", "MERGE_PDL", "PACK_GQA", "SHORT_BALANCED", "SPLIT_KV")
#: flags that also take a partial "on" -> its spellings (fp8.quant_host.V3_WIDE128: "k", K's pass only;
#: hopper.fa3_fp8.PERSISTENT: "all", every head dim and seqlen_k)
_FLAGS_OR = {"FP8_QUANT_WIDE128": ("k",), "FP8_PERSISTENT": ("all",)}
_AUTO_FLAGS = ("FP8_QUANT_STAGED_STORE", "MERGE_WARP", "PACK_WIDE")
#: int switches -> their lowest value
_INTS = {"DECODE_PDL_MAX_SPLITS": 0, "DECODE_PDL_MIN_SPLITS": 1, "FA2_D256_MAX_SEQLEN_K": 0,
         "FP8_QUANT_PDL_MAX_HEAD_DIM": 0,
         "FP8_SMOOTH_K_BLOCKS": 0, "SHORT_NARROW_CAUSAL": 0, "SHORT_PERSISTENT": 0, "SHORT_PERSISTENT_CAUSAL": 0,
         "SPLIT_MIN_TILES": 1}
#: choice switches -> their spellings (the kernel modules' tables: hopper.fa3.DECODE_TILES and FUSED_MERGE_MODES,
#: ampere.fa2.D256_CONFIGS, fp8.quant_host.PIPELINES, registry.BACKENDS, integrations.backward.BACKWARDS;
#: tests/test_env_switches.py compares)
CHOICES: dict[str, tuple[str, ...]] = {
    "FA_VARIANTS_BACKEND": ("auto", "fa3", "fa3-fp8", "fa2", "fa1", "reference"),
    "FA_VARIANTS_BACKWARD": ("cudnn", "sdpa", "flash", "pytorch"),
    "FA_VARIANTS_DECODE_FULL_GRID": ("dual", "persistent", "persistent3"),
    "FA_VARIANTS_DECODE_TILES": ("base", "deep", "wide", "dual", "persistent", "persistent3", "auto"),
    "FA_VARIANTS_DISK_CACHE_LOADER": ("auto", "dsl"),
    "FA_VARIANTS_FA2_D256": ("default", "s1", "s2", "n32", "m128w8s1", "m128w8"),
    "FA_VARIANTS_FP8_QUANT_PIPELINE": ("v1", "v2", "v3"),
    "FA_VARIANTS_FUSED_MERGE": ("0", "off", "decode", "1", "all"),
}
_LOWER_CASE = ("FA_VARIANTS_FUSED_MERGE",)  # read lower-cased

#: variable -> a check that raises env.SwitchError for a value the switch does not take
SWITCHES: dict[str, Callable[[], object]] = {
    **{f"FA_VARIANTS_{n}": _flag(f"FA_VARIANTS_{n}") for n in _FLAGS},
    **{f"FA_VARIANTS_{n}": _flag_or(f"FA_VARIANTS_{n}", names) for n, names in _FLAGS_OR.items()},
    **{f"FA_VARIANTS_{n}": _auto(f"FA_VARIANTS_{n}") for n in _AUTO_FLAGS},
    **{f"FA_VARIANTS_{n}": _int(f"FA_VARIANTS_{n}", low) for n, low in _INTS.items()},
    **{n: _choice(n, names, n in _LOWER_CASE) for n, names in CHOICES.items()},
}
#: variables whose value is free-form (a path): nothing to check
FREE_FORM = ("FA_VARIANTS_CACHE_DIR", "FA_VARIANTS_FIXTURE")
#: FA_VARIANTS_* variables read outside the package (the test suite's seeds, statistics file and SASS opt-out:
#: tests/helpers.py, tests/test_fa3_fp8_gpu.py, tests/conftest.py; CONTRIBUTING.md): known, so not reported as unknown
OUTSIDE = ("FA_VARIANTS_SESSION_SEED", "FA_VARIANTS_TEST_SEED", "FA_VARIANTS_FP8_STATS",
           "FA_VARIANTS_TESTS_WITHOUT_SASS")
PREFIX = "FA_VARIANTS_"


class UnknownSwitchWarning(UserWarning):
    """A set FA_VARIANTS_* variable that no switch reads (a typo, or a switch that was retired): it changes nothing."""


def unknown_names(environ=None) -> list[str]:
    """The set FA_VARIANTS_* variables that are neither a switch, free-form, nor read by the test suite, sorted."""
    environ = os.environ if environ is None else environ
    known = set(SWITCHES) | set(FREE_FORM) | set(OUTSIDE)
    return sorted(n for n in environ if n.startswith(PREFIX) and n not in known)


def unknown_message(name: str) -> str:
    """One line: ``name`` is not a switch, with the closest switch name when one is close."""
    close = difflib.get_close_matches(name, [*SWITCHES, *FREE_FORM], n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]}?)" if close else " (README.md, 'Environment switches', lists them)"
    return f"{name} is not a fa_variants switch and changes nothing{hint}"


_reported: set[str] = set()  # unknown names already reported in this process (once each)


def report_unknown() -> list[str]:
    """``unknown_message`` of each unknown set FA_VARIANTS_* variable not yet reported in this process (each once)."""
    fresh = [n for n in unknown_names() if n not in _reported]
    _reported.update(fresh)
    return [unknown_message(n) for n in fresh]


def check_all() -> None:
    """Raise env.SwitchError (one line naming the variable) for the first set FA_VARIANTS_* switch with a value
    it does not take; warn (``UnknownSwitchWarning``, once per name and process, with the closest switch name) for
    each set FA_VARIANTS_* variable that no switch reads: ``FA_VARIANTS_SPLITKV=0`` would otherwise silently keep
    splitting on. A warning, not an error: a retired switch left in a job's environment should not stop it."""
    for name, check in SWITCHES.items():
        if name in os.environ:
            check()
    for message in report_unknown():
        warnings.warn(message, UnknownSwitchWarning, stacklevel=2)
