"""The older checkout's package for A/B timing (scripts/ab_checkout.sh): DIR/fa_variants_before, and its archive
DIR.tar.xz, what a GPU call carries (the folder is ~1.1 MB, the archive ~0.25 MB, within the call's 64 MiB beside
.gpu/: carry [".gpu", ".before.tar.xz"]).

    python3 scripts/before_pkg.py --pack [DIR]    # DIR.tar.xz from DIR (scripts/ab_checkout.sh does this)
    python3 scripts/before_pkg.py [DIR]           # DIR, unpacked from DIR.tar.xz if DIR lacks fa_variants_before

DIR defaults to .before; DIR.tar.xz may be given for DIR. The second form prints DIR; exit status 1 when neither
DIR/fa_variants_before nor DIR.tar.xz is there. scripts/ab_bench.py calls before_dir() on its --before; GPU scripts
call steps.sh's unpack_before.
"""
from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

PACKAGE = "fa_variants_before"
SUFFIX = ".tar.xz"


def split(arg: str | Path) -> tuple[Path, Path]:
    """(DIR, DIR.tar.xz) for arg given as either."""
    text = str(arg).rstrip("/")
    folder = Path(text[: -len(SUFFIX)] if text.endswith(SUFFIX) else text)
    return folder, folder.with_name(folder.name + SUFFIX)


def pack(arg: str | Path) -> Path:
    """Writes DIR.tar.xz from DIR/fa_variants_before (members named from DIR, sorted, mtime 0; no __pycache__)."""
    folder, archive = split(arg)
    files = sorted(p for p in (folder / PACKAGE).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    if not files:
        raise SystemExit(f"before_pkg: {folder}: no {PACKAGE} there (scripts/ab_checkout.sh REV {folder})")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pack_bench import write_archive  # (scripts/pack_bench.py: sorted, owner and mtime zeroed)
    write_archive(archive, {p.relative_to(folder).as_posix(): p.read_bytes() for p in files}, preset=9)
    return archive


def before_dir(arg: str | Path, tool: str = "before_pkg") -> Path:
    """DIR holding fa_variants_before, for arg DIR or DIR.tar.xz: DIR.tar.xz is unpacked into DIR first when DIR
    lacks the package. Raises SystemExit (one line naming tool and arg) when neither has it."""
    folder, archive = split(arg)
    if not (folder / PACKAGE).is_dir() and archive.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive, "r:xz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(folder, filter="data")
            else:  # Python without extraction filters: the archive is ours (ab_checkout.sh), names checked anyway
                if any(m.name.startswith("/") or ".." in Path(m.name).parts for m in tar.getmembers()):
                    raise SystemExit(f"{tool}: --before {arg}: {archive} has a member outside {folder}")
                tar.extractall(folder)
    if not (folder / PACKAGE).is_dir():
        raise SystemExit(f"{tool}: --before {arg}: no {PACKAGE} in {folder} nor {archive} (scripts/ab_checkout.sh)")
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", nargs="?", default=".before", help="DIR (or DIR.tar.xz); default .before")
    ap.add_argument("--pack", action="store_true", help="write DIR.tar.xz from DIR")
    a = ap.parse_args(argv)
    try:
        print(pack(a.dir) if a.pack else before_dir(a.dir))
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
