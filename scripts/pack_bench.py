"""Pack an old session's raw bench logs into one raw.tar.xz per folder, to keep the tracked tree small.

    python3 scripts/pack_bench.py bench/h200-2026-12-01-s8 [bench/...] [--min-bytes N] [--dry-run]
    git add -A bench/h200-2026-12-01-s8          # the archive in, the packed files out

Every GPU call copies the working tree to the device (64 MiB with the carried .gpu/ and .before.tar.xz), so the
raw logs of sessions that NOTES.md has already summarised go into DIR/raw.tar.xz (xz -9e, members named
relative to DIR, sorted, mtime 0: the same files give the same bytes). Packed: tracked files ending in
.log, .json, .jsonl, .csv, .out or .txt of at least --min-bytes (default 0), sub-folders included, except those
in KEEP (read by tests or scripts); with --markdown also Markdown files other than README.md (an old run's long
tables, when the tracked tree nears its budget). Kept: Markdown summaries (without --markdown), READMEs, images, KEEP. An existing raw.tar.xz is extended.
The folder's README.md gets one closing line that says where the raw files went (once), and every path to a
packed file in the tracked text files (bench/RUN/x.json, or RUN/x.json in bench/NOTES.md) becomes
bench/RUN/raw.tar.xz:x.json (a Markdown link's target: the archive). tests/test_bench_archive.py checks that every
such path names a file, a folder or an archive member that is there (stale_references).

Unpack (restores the original paths): tar -xJf DIR/raw.tar.xz -C DIR
Exit status: 0 done (or nothing to pack), 2 a bad folder.
"""
from __future__ import annotations

import argparse
import fnmatch
import io
import lzma
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = "raw.tar.xz"
RAW_SUFFIXES = (".log", ".json", ".jsonl", ".csv", ".out", ".txt")
#: files tests or scripts read in place (tests/test_gpu_scripts_decode.py and scripts/decode_model.py: decode_ab.json;
#: tests/test_ncu_table.py and scripts/ncu12_gpu.sh: the ncu details pages)
KEEP = frozenset({
    "bench/h200-2026-12-01-s4/decode_ab.json",
    "bench/h200-2026-11-30/session2/ncu_fa3_d128_n4k.txt",
    "bench/h200-2026-11-30/session2/ncu_flash-attn-4_d128_n4k.txt",
    "bench/h200-2026-11-30/session2/ncu_attribution_before.md",  # scripts/ncu12_gpu.sh's --before table (--markdown)
    "bench/h200-2026-11-30/session2/fa3_speed_ab.md",  # cited by path in hopper/fa3.py (a kernel source: its hash)
})
TEXT_SUFFIXES = (".md", ".py", ".sh", ".txt", ".toml")
#: a path into a bench run folder, from the repository root (bench/RUN/...) or from bench/ (NOTES.md: RUN/...),
#: optionally into an archive (bench/RUN/raw.tar.xz:MEMBER); a * stands for any characters (a glob). RUN starts
#: "cpu-" or a card's name ("h200-", "h100-", "a100-": before session 37 only h200 / cpu, so the paths into
#: h100 runs went unchecked)
REF = re.compile(r"(?<![\w/.-])((?:bench/)?(?:cpu|[a-z]\d{3})-[\w.-]+(?:/[\w.*-]*[\w*])+)(?::([\w.*-]+(?:/[\w.*-]+)*))?")
LINK = re.compile(r"\[([^\]\n]*)\]\(([^)\s]+)\)")
README_NOTE = ("Raw logs ({n} file{s}) packed in `raw.tar.xz`: `tar -xJf raw.tar.xz` here restores them "
               "(bench/README.md).")


def read_text(path: Path) -> str:
    """path's text; bytes that are not UTF-8 become lone surrogates, so that write_text puts them back unchanged."""
    return path.read_bytes().decode("utf-8", "surrogateescape")


def write_text(path: Path, text: str) -> None:
    """text (read_text's) written as UTF-8, its non-UTF-8 bytes as they were read."""
    path.write_bytes(text.encode("utf-8", "surrogateescape"))


def tracked(folder: Path) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--", str(folder)], cwd=ROOT, check=True, capture_output=True)
    return [ROOT / p for p in out.stdout.decode().split("\0") if p]


def packable(path: Path, markdown: bool = False) -> bool:
    """A raw log by its suffix, or with ``markdown`` also a Markdown file other than a README (a long table of an old
    run: ``--markdown``)."""
    return path.suffix in RAW_SUFFIXES or (markdown and path.suffix == ".md" and path.name != "README.md")


def read_by_code(folder: Path) -> dict[Path, str]:
    """folder's tracked files that a tracked script, test or package module (.py / .sh outside bench/) names by a
    quoted file name and names the run folder too (e.g. ``ROOT / "bench" / RUN / "table.md"``: a path built from
    pieces, which ``fix_references`` cannot rewrite), each with the first such module: kept unpacked like KEEP's
    (session 37 packed the s7 decode table that scripts/decode_model.py reads)."""
    files = {p.name: p for p in tracked(folder)}
    out: dict[Path, str] = {}
    for code in text_files():
        rel = code.relative_to(ROOT).as_posix()
        if code.suffix not in (".py", ".sh") or rel.startswith("bench/"):
            continue
        text = read_text(code)
        if folder.name not in text:
            continue
        for name, path in files.items():
            if path not in out and re.search(r"""["']""" + re.escape(name) + r"""["']""", text):
                out[path] = rel
    return out


def to_pack(folder: Path, min_bytes: int, markdown: bool = False) -> list[Path]:
    """Tracked packable files under folder (sorted) that are present, not in KEEP nor ``read_by_code`` and at least
    min_bytes long."""
    read = read_by_code(folder)
    for path, code in sorted(read.items()):
        if packable(path, markdown):
            print(f"  kept {path.relative_to(ROOT)}: {code} reads it")
    return sorted(p for p in tracked(folder)
                  if packable(p, markdown) and p.is_file() and p.relative_to(ROOT).as_posix() not in KEEP
                  and p not in read and p.stat().st_size >= min_bytes)


def members(archive: Path) -> dict[str, bytes]:
    """name -> bytes of an existing archive's files (empty when there is none)."""
    if not archive.exists():
        return {}
    with tarfile.open(archive, "r:xz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def write_archive(archive: Path, files: dict[str, bytes], preset: int = 9 | lzma.PRESET_EXTREME) -> None:
    """files (name -> bytes) into archive, sorted, owner and mtime zeroed: reproducible bytes (also
    scripts/before_pkg.py's archive, at xz preset 9)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=preset, format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    archive.write_bytes(buf.getvalue())


def note_in_readme(folder: Path, count: int) -> None:
    readme = folder / "README.md"
    text = read_text(readme) if readme.exists() else f"# {folder.name}\n"
    lines = [ln for ln in text.rstrip("\n").split("\n") if not ln.startswith("Raw logs (")]
    write_text(readme, "\n".join(lines) + "\n\n" + README_NOTE.format(n=count, s="" if count == 1 else "s") + "\n")


def pack(folder: Path, min_bytes: int, dry_run: bool, markdown: bool = False) -> int:
    """Packs folder's raw files; returns the bytes the tracked tree shrinks by (a dry run: the raw bytes)."""
    files = to_pack(folder, min_bytes, markdown)
    raw = sum(p.stat().st_size for p in files)
    print(f"{folder.relative_to(ROOT)}: {len(files)} files, {raw} bytes" + (" (dry run)" if dry_run else ""))
    if dry_run or not files:
        return raw if dry_run else 0
    archive = folder / ARCHIVE
    before = archive.stat().st_size if archive.exists() else 0
    content = members(archive)
    content.update({p.relative_to(folder).as_posix(): p.read_bytes() for p in files})
    write_archive(archive, content)
    for p in files:
        p.unlink()
    note_in_readme(folder, len(content))
    after = archive.stat().st_size
    print(f"  -> {archive.relative_to(ROOT)}: {after} bytes ({len(content)} members)")
    return raw - (after - before)


def _members(archive: Path, cache: dict) -> list[str]:
    if archive not in cache:
        with tarfile.open(archive, "r:xz") as tar:
            cache[archive] = [m.name for m in tar.getmembers()]
    return cache[archive]


def resolve(ref: str, member: str | None, cache: dict) -> tuple[str, str, str] | None:
    """None when ref (and member, for ref an archive) names what is there; else (where, archive, member): where
    "packed" (ref's file is a member of the archive of a folder above it, both spelt as ref is) or "missing"."""
    path = ref if ref.startswith("bench/") else "bench/" + ref
    if member is not None:
        full = ROOT / path
        ok = full.name == ARCHIVE and full.is_file() and any(fnmatch.fnmatch(n, member) for n in _members(full, cache))
        return None if ok else ("missing", ref, member)
    if _there(ROOT / path) or ("*" in path and any(_there(p) for p in ROOT.glob(path))):
        return None
    parts = path.split("/")
    for i in range(len(parts) - 1, 1, -1):
        archive = ROOT.joinpath(*parts[:i], ARCHIVE)
        if archive.is_file():
            rest = "/".join(parts[i:])
            if any(fnmatch.fnmatch(n, rest) for n in _members(archive, cache)):
                spelt = ref.split("/")  # without the leading bench/ when ref has none
                return "packed", "/".join(spelt[: i - (len(parts) - len(spelt))] + [ARCHIVE]), rest
            break
    return "missing", ref, ""


def _there(path: Path) -> bool:
    """A file, or a folder holding one at any depth: an empty folder (left behind here once its files are packed)
    is not in a clean clone, so a reference to it is stale."""
    return path.is_file() or (path.is_dir() and any(p.is_file() for p in path.rglob("*")))


def text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout.decode()
    return [ROOT / p for p in out.split("\0") if p.endswith(TEXT_SUFFIXES) and (ROOT / p).is_file()]


def fix_references(text: str, cache: dict) -> str:
    """text with every path to a packed file rewritten (a Markdown link: its target the archive; its text too,
    when that was the path)."""
    def link(m: re.Match) -> str:
        ref = REF.fullmatch(m.group(2))
        found = ref and resolve(ref.group(1), ref.group(2), cache)
        if not found or found[0] != "packed":
            return m.group(0)
        label = f"{found[1]}:{found[2]}" if m.group(1) == m.group(2) else m.group(1)
        return f"[{label}]({found[1]})"

    def plain(m: re.Match) -> str:
        found = resolve(m.group(1), m.group(2), cache)
        return f"{found[1]}:{found[2]}" if found and found[0] == "packed" else m.group(0)

    return REF.sub(plain, LINK.sub(link, text))


def stale_references() -> list[str]:
    """'FILE: REF' for every path into a bench run folder, in the tracked text files, that names nothing there."""
    cache: dict = {}
    out = []
    for path in text_files():
        for m in REF.finditer(read_text(path)):
            if resolve(m.group(1), m.group(2), cache):
                out.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="bench/<run> folders (an old session's)")
    ap.add_argument("--min-bytes", type=int, default=0, help="pack only raw files at least this long (default 0)")
    ap.add_argument("--dry-run", action="store_true", help="list what would be packed; change nothing")
    ap.add_argument("--markdown", action="store_true",
                    help="also pack Markdown files other than README.md (an old run's long tables; with --min-bytes)")
    args = ap.parse_args(argv)
    if args.min_bytes < 0:
        ap.error(f"--min-bytes must be >= 0, got {args.min_bytes}")
    folders = [f.resolve() for f in args.folders]
    for f in folders:
        if not f.is_dir() or ROOT / "bench" not in f.parents:
            print(f"pack_bench: {f} is not a folder under bench/", file=sys.stderr)
            return 2
    saved = sum(pack(f, args.min_bytes, args.dry_run, args.markdown) for f in folders)
    if not args.dry_run:
        cache: dict = {}
        for path in text_files():
            text = read_text(path)
            new = fix_references(text, cache)
            if new != text:
                write_text(path, new)
                print(f"pack_bench: references to packed files rewritten in {path.relative_to(ROOT)}")
    print(f"pack_bench: tracked tree {'would shrink by at most' if args.dry_run else 'shrinks by'} {saved} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
