"""The `fa-variants` command line: one sub-command per job.

Each sub-command lives in its own module, which exposes
``configure_parser(parser: argparse.ArgumentParser) -> None`` and ``run_cli(args) -> int``.
Only the module of the command being run is imported (`fa-variants --help` imports none, so it is
fast), so `fa-variants info` works even where a heavy dependency (the CuTe DSL, matplotlib) is missing,
and a missing piece gives a clear message. A ValueError or OSError from a sub-command (an input no backend
serves, an unusable path; a FA_VARIANTS_* switch with a bad value, also when a command's options import the
module that reads it) and an ImportError (a missing optional extra) are printed as one line, exit status 2;
an interrupt (Ctrl-C) as one line, exit status 130 (128 + SIGINT, as a shell reports it); output into a closed
pipe (`fa-variants info | head -1`) ends quietly with exit status 141 (128 + SIGPIPE, as a tool killed by it), not
1, which `demo` uses for a failed check.
"""
from __future__ import annotations

import argparse
import codecs
import importlib
import os
import sys
import warnings
from pathlib import Path

from fa_variants.common.checks import INT64_MAX

# sub-command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("fa_variants.info", "versions, GPUs, and the backend `auto` picks, with reasons"),
    "demo": ("fa_variants.demo", "run attention through the dispatcher, check it against float64"),
    "io": ("fa_variants.emulate", "HBM reads/writes of standard attention, FA1 and FA2 (FA paper's IO table)"),
    "compile": ("fa_variants.commands.compile", "compile a kernel variant with fake tensors (no GPU needed)"),
    "warmup": ("fa_variants.commands.warmup", "precompile a model's kernels into the disk cache"),
    "bench": ("fa_variants.bench", "TFLOP/s of our kernels beside PyTorch SDPA and flash-attn-4"),
    "fp8-study": ("fa_variants.fp8.study", "FP8 (e4m3) accuracy against FP16"),
}


def int_in(low: int, high: int | None = None, bounds: str | None = None):
    """argparse type factory: an int >= low (and <= high); ``bounds`` names the range in the message."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r} must be {bounds or f'>= {low}'}")
        return value
    return parse


def finite_float(low: float, strict: bool, bounds: str):
    """argparse type factory: a finite real > low (``strict``) or >= low; ``bounds`` names the range."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (low < value if strict else low <= value) or value == float("inf") or value != value:
            raise argparse.ArgumentTypeError(f"{text!r} must be {bounds}")
        return value
    return parse


def existing_file(text: str) -> Path:
    """argparse type: the path of a file that exists (a file named on the command line and missing must stop the
    command in one line, not be skipped where the file is not needed, nor fail later with a traceback)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file" if path.exists() else f"{text!r} does not exist")
    return path


#: argparse types: a size (batch, seqlen, heads, head_dim, rounds, ...), a count that may be 0, a random seed (what
#: torch.Generator.manual_seed takes), a positive finite real (ms, KiB, TB/s), a finite real >= 0 (a budget; 0: none)
#: (sizes and counts stop at INT64_MAX: beyond it torch cannot take the number at all, and the command would fail
#: deep inside with a traceback instead of this one line)
positive_int = int_in(1, INT64_MAX, "in [1, 2^63 - 1]")
nonnegative_int = int_in(0, INT64_MAX, "in [0, 2^63 - 1]")
seed_int = int_in(0, 2**64 - 1, "in [0, 2^64 - 1]")
positive_float = finite_float(0.0, True, "a positive finite number")
nonnegative_float = finite_float(0.0, False, "a finite number >= 0")


def not_applicable(flags: list[str], where: str) -> ValueError:
    """The one-line error for flags a command was given but does not read (``where``: "to --merge (...)")."""
    return ValueError(f"{', '.join(flags)} {'do' if len(flags) > 1 else 'does'} not apply {where}")


def replaced_input(inputs, output):
    """The one of ``inputs`` (paths) that writing ``output`` would replace, or None: a merge must not overwrite a
    run it merges."""
    target = Path(output).resolve()
    return next((src for src in inputs if Path(src).resolve() == target), None)


def remove_stale(folder, patterns: tuple[str, ...], kept) -> list[Path]:
    """Remove the files of ``folder`` matching ``patterns`` (globs of a command's own outputs, e.g. its charts) but
    ``kept`` (what this run wrote): a rerun into the same --out must not leave an earlier run's chart beside a
    report it no longer describes. Returns the removed paths."""
    kept = {Path(k).resolve() for k in kept}
    stale = sorted({f for pattern in patterns for f in Path(folder).glob(pattern)
                    if f.is_file() and f.resolve() not in kept})
    for f in stale:
        f.unlink()
    return stale


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fa-variants")
    except PackageNotFoundError:  # run from a checkout that is not installed
        from fa_variants import __version__
        return __version__


#: the parser's description (not read from __doc__: ``python -OO`` removes docstrings)
DESCRIPTION = "The `fa-variants` command line: one sub-command per job."


def build_parser(commands: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """The parser, with the sub-parsers of ``commands`` configured (their modules imported; None: all).
    ``main`` configures only the command being run: the others need nothing but their name and help."""
    parser = argparse.ArgumentParser(prog="fa-variants", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        if commands is not None and name not in commands:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # a missing optional piece: say so when it is used
            p.set_defaults(_import_error=exc)
            continue
        module.configure_parser(p)
    return parser


def _command(argv: list[str]) -> tuple[str, ...]:
    """The sub-command named in argv (the first word that is one), as a 0- or 1-tuple."""
    return tuple(a for a in argv if a in COMMANDS)[:1]


def entry() -> int:
    """The ``fa-variants`` program (the console script and ``python -m fa_variants``): `main` on this process's
    arguments, its standard streams made usable first (`_usable_streams`; a process of its own, so the changes stay
    in it, unlike an in-process ``main(argv)`` call)."""
    _usable_streams()
    return main()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command(argv)
    from fa_variants.common import switches

    for message in switches.report_unknown():  # before any import warns about them in Python's two-line form
        print(f"fa-variants: warning: {message}", file=sys.stderr)
    try:
        parser = build_parser(command)
    except ValueError as exc:  # a FA_VARIANTS_* switch with a bad value (common.env.SwitchError), read by a module
        print(f"fa-variants{''.join(' ' + c for c in command)}: error: {exc}", file=sys.stderr)  # the options import
        return 2
    args = parser.parse_args(argv)
    err = getattr(args, "_import_error", None)
    if err is not None:
        print(f"fa-variants {args.command}: unavailable here ({err})", file=sys.stderr)
        return 2
    module = importlib.import_module(args._module)
    try:
        switches.check_all()  # every command, info and bench --dry-run too: a bad FA_VARIANTS_* value is one line
        with warnings.catch_warnings():  # restores showwarning after the command
            warnings.showwarning = _one_line_warning(args.command, warnings.showwarning)
            return int(module.run_cli(args) or 0)
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say, and no error message
        return _closed_pipe()
    except SystemExit as exc:  # rich's console on a closed pipe: SystemExit(1) while handling the BrokenPipeError
        if isinstance(exc.__context__, BrokenPipeError):
            return _closed_pipe()
        raise
    except (ValueError, OSError) as exc:  # bad input (an unservable shape, a backend, a path): one line
        print(f"fa-variants {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # an optional extra that is not installed (e.g. [sass] for compile --sass)
        print(f"fa-variants {args.command}: unavailable here: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback of wherever the command was
        print(f"fa-variants {args.command}: interrupted", file=sys.stderr)
        return 130


def _one_line_warning(command: str, show):
    """A ``warnings.showwarning`` that prints the package's own warnings (its classes, DiskCacheWarning,
    BackendFallbackWarning, ..., and any warning raised from its files) as one line, "fa-variants COMMAND: warning:
    ...", as the commands' errors are (Python's form is two lines naming a source line of the package); other
    warnings go to ``show``."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep

    def one_line(message, category, filename, lineno, file=None, line=None):
        ours = category.__module__.split(".")[0] == "fa_variants" or os.path.abspath(filename).startswith(package)
        if not ours:  # (a plain UserWarning raised in the package counts as ours: the Hugging Face sdpa fallback)
            return show(message, category, filename, lineno, file, line)
        text = " ".join(str(message).split()).removeprefix("fa_variants: ")  # the command's prefix says it
        print(f"fa-variants {command}: warning: {text}", file=file or sys.stderr)
    return one_line


def _usable_streams() -> None:
    """Standard streams every command can write to: a descriptor 0-2 the caller closed (``2>&-``) is opened on
    /dev/null and a missing ``sys.stdout`` / ``sys.stderr`` (Python sets None for one closed at start) becomes
    /dev/null (the CuTe DSL flushes sys.stderr while compiling: AttributeError on None, and a warning printed to a
    stderr descriptor then held by a file would land in it); a stream whose encoding is not UTF-8 (PYTHONIOENCODING
    =ascii, a C locale without UTF-8 mode) writes what it cannot encode as backslash escapes instead of raising
    UnicodeEncodeError (the reports hold "—", "x", "<=" signs)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:  # closed: the lowest free descriptor is fd itself, or dup2 puts /dev/null there
            devnull = os.open(os.devnull, os.O_RDWR)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))
        elif _encoding_name(stream) != "utf-8" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _encoding_name(stream) -> str | None:
    """The codec name of ``stream``'s encoding (utf-8 when it has none), None for one Python does not know."""
    try:
        return codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name
    except LookupError:
        return None


#: the narrowest COLUMNS a command's tables are drawn in (``console``)
MIN_COLUMNS = 40


def console(stderr: bool = False):
    """A rich Console for a command's tables and lines. rich takes the COLUMNS environment variable as the width:
    COLUMNS=0 printed nothing at all (exit 0) and COLUMNS=10 cut every cell to "3…"; below MIN_COLUMNS the width is
    80 instead (what rich uses for a pipe)."""
    from rich.console import Console

    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:  # unset or not a number: rich's own rule (the terminal's width, 80 for a pipe)
        columns = None
    return Console(stderr=stderr, width=80 if columns is not None and columns < MIN_COLUMNS else None)


#: exit status of a command whose stdout was closed by its reader (128 + SIGPIPE)
CLOSED_PIPE = 141


def _closed_pipe() -> int:
    """CLOSED_PIPE, with stdout pointed at /dev/null first, so that the interpreter's final flush of the buffered rest
    does not fail again at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor behind sys.stdout (a test's capture): nothing to redirect
        pass
    return CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(entry())
