"""Paths from the environment, read alike everywhere (pure Python).

``env_path(name)``: an environment variable naming a path, stripped of surrounding spaces; None when unset, empty
or only spaces (as the FA_VARIANTS_* switches read theirs), never the working directory's folder " ".

``home()``: the user's home directory, or None where there is none: HOME unset and the user id without a password
entry (a container run under an arbitrary ``--user``), where ``Path.home()`` raises RuntimeError, or HOME relative.

``expand_user(path, what)``: ``Path(path).expanduser()``, ``~`` read as ``home()``; OSError naming ``what`` where a
leading ``~`` (no home directory) or ``~user`` (no such user) cannot be expanded, in place of pathlib's RuntimeError.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["env_path", "home", "expand_user"]


def env_path(name: str) -> str | None:
    """os.environ[name] without surrounding spaces, or None when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def home() -> Path | None:
    """``Path.home()`` when it names an absolute folder, else None (see the module docstring)."""
    try:
        path = Path.home()
    except RuntimeError:  # "Could not determine home directory"
        return None
    return path if path.is_absolute() else None


def expand_user(path: str | os.PathLike, what: str) -> Path:
    """``Path(path).expanduser()``, with ``~`` read as `home` (absolute, or an error: a relative HOME made the place
    depend on the working directory); OSError naming ``what`` where ``~`` or ``~user`` cannot be expanded, in place
    of pathlib's RuntimeError traceback."""
    text = os.fspath(path)
    if text == "~" or text.startswith("~/"):
        base = home()
        if base is None:
            raise OSError(f"{what}: {text} starts with ~ but there is no home directory (HOME unset or relative, and "
                          "no password entry for this user); give an absolute path")
        return base / text[2:]
    try:
        return Path(text).expanduser()
    except RuntimeError:  # ~user of an unknown user
        raise OSError(f"{what}: {text}: there is no user {text[1:].split('/')[0]!r} whose home ~ could mean; give an "
                      "absolute path") from None
