"""bench/'s packed raw logs (scripts/pack_bench.py): every path to a bench run file in the tracked text names a
file, folder or archive member that is there; the archives hold raw files only, none also tracked unpacked; the
files tests and scripts read in place are unpacked; and pack_bench itself on a small git repository."""
import subprocess
import tarfile
from pathlib import Path

import pytest
from helpers import git_checkout_or_skip, load_script

ROOT = Path(__file__).resolve().parents[1]
#: the small repository's run folder, spelt in pieces so that this file holds no path to a bench run
RUN = "h200" + "-x"


@pytest.fixture(scope="module")
def pb():
    return load_script("pack_bench")


def archives() -> list[Path]:
    git_checkout_or_skip()
    out = subprocess.run(["git", "ls-files", "-z", "bench"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / p for p in out.decode().split("\0") if p.endswith("/raw.tar.xz")]


def test_every_bench_path_in_the_docs_names_what_is_there(pb):
    """bench/RUN/x.json (RUN/x.json in bench/NOTES.md) is a file, bench/RUN/raw.tar.xz:x.json a member."""
    git_checkout_or_skip()  # the tracked text: the git index
    assert pb.stale_references() == [], "unpack, or write packed files as bench/RUN/raw.tar.xz:FILE (bench/README.md)"


def test_archives_hold_raw_files_that_are_not_also_tracked(pb):
    found = archives()
    assert len(found) >= 10, found  # the runs before session 10
    for archive in found:
        with tarfile.open(archive, "r:xz") as tar:
            members = tar.getmembers()
        names = [m.name for m in members]
        assert all(m.isfile() and pb.packable(Path(m.name), markdown=True) for m in members), (archive, names)
        assert not any(n.startswith("/") or ".." in n.split("/") for n in names), (archive, names)
        assert not any((archive.parent / n).exists() for n in names), (archive, "packed and unpacked both")
        note = pb.README_NOTE.format(n=len(names), s="" if len(names) == 1 else "s")
        assert note in (archive.parent / "README.md").read_text(encoding="utf-8"), archive


def test_files_read_in_place_stay_unpacked(pb):
    assert all((ROOT / p).is_file() for p in pb.KEEP), sorted(pb.KEEP)


def git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", *argv], cwd=repo, capture_output=True, text=True, check=True).stdout


def test_pack_bench_packs_a_run_and_rewrites_the_paths_to_it(pb, tmp_path, monkeypatch, capsys):
    """A run folder of a small repository: its raw files (a sub-folder's too) into raw.tar.xz, Markdown and images
    kept, the paths in NOTES.md / README.md / a script rewritten (a link's target: the archive), the README's note;
    unpacking restores the bytes; packing again adds nothing and the archive's bytes are the same."""
    run = tmp_path / "bench" / RUN
    (run / "sub").mkdir(parents=True)
    raw = {"a.json": '{"ms": 1.5}\n' * 50, "b.log": "step ok\n", "sub/c.txt": "ncu page\n"}
    for name, text in raw.items():
        (run / name).write_text(text, encoding="utf-8")
    (run / "summary.md").write_text(f"# {RUN}\n", encoding="utf-8")
    (run / "chart.png").write_bytes(b"\x89PNG")
    (tmp_path / "bench" / "NOTES.md").write_text(f"see {RUN}/a.json and [b.log]({RUN}/b.log), "
                                                 f"[{RUN}/sub/c.txt]({RUN}/sub/c.txt); {RUN}/summary.md\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(f"(bench/{RUN}/sub/c.txt).\n", encoding="utf-8")
    (tmp_path / "tool.py").write_text(f"# bench/{RUN}/b.log\n", encoding="utf-8")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    monkeypatch.setattr(pb, "ROOT", tmp_path)
    assert pb.main([str(run)]) == 0
    archive = run / "raw.tar.xz"
    assert sorted(p.name for p in run.rglob("*") if p.is_file()) == ["README.md", "chart.png", "raw.tar.xz",
                                                                   "summary.md"]
    assert (tmp_path / "bench" / "NOTES.md").read_text(encoding="utf-8") == (
        f"see {RUN}/raw.tar.xz:a.json and [b.log]({RUN}/raw.tar.xz), "
        f"[{RUN}/raw.tar.xz:sub/c.txt]({RUN}/raw.tar.xz); {RUN}/summary.md\n")
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == f"(bench/{RUN}/raw.tar.xz:sub/c.txt).\n"
    assert (tmp_path / "tool.py").read_text(encoding="utf-8") == f"# bench/{RUN}/raw.tar.xz:b.log\n"
    assert (run / "README.md").read_text(encoding="utf-8").endswith(pb.README_NOTE.format(n=3, s="s") + "\n")
    git(tmp_path, "add", "-A")
    assert pb.stale_references() == []
    (tmp_path / "README.md").write_text(f"bench/{RUN}/raw.tar.xz:gone.json, bench/{RUN}/gone.md\n", encoding="utf-8")
    assert pb.stale_references() == [f"README.md: bench/{RUN}/raw.tar.xz:gone.json", f"README.md: bench/{RUN}/gone.md"]
    packed = archive.read_bytes()
    with tarfile.open(archive, "r:xz") as tar:
        assert {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()} == raw
    assert pb.main([str(run)]) == 0 and archive.read_bytes() == packed
    assert pb.main([str(tmp_path / "README.md")]) == 2
    assert "not a folder under bench/" in capsys.readouterr().err


def test_pack_bench_keeps_the_bytes_of_a_text_file_that_is_not_utf8(pb, tmp_path, monkeypatch):
    """A tracked text file with a path to a packed log and bytes that are not UTF-8 (a Latin-1 e-acute, a lone 0xff):
    only the path changes; every other byte stays as it was (no replacement characters); its README too."""
    run = tmp_path / "bench" / RUN
    run.mkdir(parents=True)
    (run / "b.log").write_text("step ok\n", encoding="utf-8")
    (run / "README.md").write_bytes(b"# run caf\xe9\n")
    (tmp_path / "notes.txt").write_bytes(b"caf\xe9 \xff bench/" + RUN.encode() + b"/b.log \xc3\xa9\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    monkeypatch.setattr(pb, "ROOT", tmp_path)
    assert pb.main([str(run)]) == 0
    assert (tmp_path / "notes.txt").read_bytes() == (
        b"caf\xe9 \xff bench/" + RUN.encode() + b"/raw.tar.xz:b.log \xc3\xa9\n")
    assert (run / "README.md").read_bytes().startswith(b"# run caf\xe9\n\nRaw logs (1 file)")
    assert pb.stale_references() == []


def test_pack_bench_markdown_packs_long_tables_but_not_the_readme(pb, tmp_path, monkeypatch):
    """--markdown with --min-bytes: a long Markdown table of the run goes into the archive (its link rewritten), a
    short one and the README stay."""
    run = tmp_path / "bench" / RUN
    run.mkdir(parents=True)
    (run / "table.md").write_text("| a | b |\n" * 100, encoding="utf-8")
    (run / "short.md").write_text("# short\n", encoding="utf-8")
    (run / "README.md").write_text(f"[table](table.md), bench/{RUN}/table.md\n", encoding="utf-8")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    monkeypatch.setattr(pb, "ROOT", tmp_path)
    assert pb.main([str(run), "--min-bytes", "500"]) == 0 and (run / "table.md").exists()  # not without --markdown
    assert pb.main([str(run), "--markdown", "--min-bytes", "500"]) == 0
    assert sorted(p.name for p in run.iterdir()) == ["README.md", "raw.tar.xz", "short.md"]
    assert (run / "README.md").read_text(encoding="utf-8").startswith(f"[table](table.md), bench/{RUN}/raw.tar.xz:table.md\n")
    with tarfile.open(run / "raw.tar.xz", "r:xz") as tar:
        assert tar.getnames() == ["table.md"]


def test_pack_bench_keeps_what_code_reads_and_checks_every_card(pb, tmp_path, monkeypatch, capsys):
    """A file a script names by a quoted file name beside its run folder's name (a path built from pieces, which
    no rewrite can follow) stays unpacked, with a line naming the script; a comment's path is rewritten as before.
    Paths into a run of any card ("h100-...", not only h200 / cpu) are checked for staleness."""
    card = "h100" + "-y"
    run = tmp_path / "bench" / card
    run.mkdir(parents=True)
    (run / "table.md").write_text("| a |\n" * 50, encoding="utf-8")
    (run / "b.log").write_text("step ok\n", encoding="utf-8")
    (run / "c.log").write_text("other\n", encoding="utf-8")
    (tmp_path / "model.py").write_text(f'TABLE = ROOT / "bench" / "{card}" / "table.md"\nLOG = "b.log"\n', encoding="utf-8")
    (tmp_path / "tool.py").write_text(f"# bench/{card}/c.log\n", encoding="utf-8")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    monkeypatch.setattr(pb, "ROOT", tmp_path)
    assert pb.main([str(run), "--markdown"]) == 0
    assert sorted(p.name for p in run.iterdir()) == ["README.md", "b.log", "raw.tar.xz", "table.md"]
    assert f"kept bench/{card}/table.md: model.py reads it" in capsys.readouterr().out
    assert (tmp_path / "tool.py").read_text(encoding="utf-8") == f"# bench/{card}/raw.tar.xz:c.log\n"
    git(tmp_path, "add", "-A")
    assert pb.stale_references() == []
    (tmp_path / "notes.txt").write_text(f"bench/{card}/gone.json\n", encoding="utf-8")
    git(tmp_path, "add", "-A")
    assert pb.stale_references() == [f"notes.txt: bench/{card}/gone.json"]
