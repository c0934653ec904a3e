"""The package's environment switches (``FA_VARIANTS_*``, README.md's table), read one way: a value that is not
one of the switch's spellings raises a one-line ValueError naming the variable, instead of silently meaning the
default (``FA_VARIANTS_SPLIT_KV=false`` used to leave splitting on) or failing deep inside a call.

    flag(name, default)          0 / off / false / no, 1 / on / true / yes (unset or empty: default)
    flag_or(name, default, names) a flag, or one of names (a partial "on": e.g. one pass of several)
    integer(name, default, low)  an int >= low, in ASCII digits (unset or blank: default)
    choice(name, default, names) one of names (case as given)

The error is ``SwitchError`` (a ValueError): ``registry`` lets it through where it reports any other failure to
import a backend module as a reason to fall back, so that a mistyped switch stops the call instead of sending
every call to a slower backend.
"""
from __future__ import annotations

import os
import re

OFF = ("0", "off", "false", "no")
ON = ("1", "on", "true", "yes")
_FLAG_SPELLINGS = "0 or 1 (or off/false/no, on/true/yes)"  # flag's and flag_or's messages


class SwitchError(ValueError):
    """A FA_VARIANTS_* variable with a value its switch does not take (the message names the variable)."""


def shown(value: str, limit: int = 60) -> str:
    """repr(value), cut to about ``limit`` characters ("...'" and the length after it): a message stays one short
    line for a value of any length."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...' ({len(value)} characters)"


def flag(name: str, default: bool) -> bool:
    """The boolean switch ``name``: unset or empty -> default; 0 / off / false / no -> False; 1 / on / true /
    yes -> True (any case, spaces stripped); ValueError naming the variable otherwise."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value not in OFF + ON:
        raise SwitchError(f"{name}={shown(os.environ[name])} must be {_FLAG_SPELLINGS}")
    return value in ON


def flag_or(name: str, default: bool | str, names: tuple[str, ...]) -> bool | str:
    """The switch ``name`` as ``flag`` reads it, or one of ``names`` (lower-cased, returned as that string: a
    partial "on", e.g. one pass of several); ValueError naming the variable and every spelling otherwise."""
    value = os.environ.get(name, "").strip().lower()
    if value in names:
        return value
    if value and value not in OFF + ON:
        raise SwitchError(f"{name}={shown(os.environ[name])} must be {_FLAG_SPELLINGS} or {' / '.join(names)}")
    return flag(name, default)


#: the largest value of an int switch: they count tiles, keys or splits, which the kernels hold in int32
INT_SWITCH_MAX = 2**31 - 1


_INT = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: int() would also read "1_0" as 10 and other scripts' digits


def int_value(name: str, value: str, low: int, what: str = "") -> int:
    """``value`` (of the variable ``name``; spaces around it stripped) as an int in [low, INT_SWITCH_MAX], written
    in ASCII digits; ValueError naming the variable otherwise (``what``: a few words on the unit, for the
    message)."""
    text = value.strip() if isinstance(value, str) else ""
    n = int(text) if _INT.fullmatch(text) else low - 1
    unit = f" ({what})" if what else ""
    if n < low:
        raise SwitchError(f"{name} must be an int >= {low}{unit}, got {shown(value)}")
    if n > INT_SWITCH_MAX:
        raise SwitchError(f"{name} must be an int <= {INT_SWITCH_MAX}{unit}, got {shown(value)}")
    return n


def integer(name: str, default: str, low: int, what: str = "") -> int:
    """The int switch ``name`` (>= low; unset or blank: default, as the other kinds); ValueError naming the
    variable otherwise."""
    return int_value(name, os.environ.get(name, "").strip() or default, low, what)


def choice(name: str, default: str, names) -> str:
    """The switch ``name``, one of ``names`` (unset or empty: default); ValueError naming the variable and the
    choices otherwise."""
    value = os.environ.get(name, "").strip() or default
    if value not in names:
        raise SwitchError(f"{name}={shown(value)} must be one of {', '.join(names)}")
    return value


def auto_flag(name: str) -> bool | None:
    """The three-way switch ``name``: 0 -> False (never), 1 -> True (always), auto (or unset / empty) -> None (the
    module's own rule decides); ValueError naming the variable and the choices otherwise."""
    return {"0": False, "1": True, "auto": None}[choice(name, "auto", ("0", "1", "auto"))]
