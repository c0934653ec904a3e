"""CI runs the README's test command: the set-up block of README.md that runs pytest stands verbatim in .ci/run."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    commands = [line for block in blocks for line in block.splitlines() if "pip install" in line and "pytest" in line]
    assert len(commands) == 1, commands  # the README's one install-and-test command
    ci = (ROOT / ".ci" / "run").read_text()
    verbatim = re.compile(re.escape(commands[0]) + r"\s*(\|\||&&|;|$)")  # no argument added after it
    assert any(verbatim.search(line) for line in ci.splitlines() if not line.lstrip().startswith("#")), commands[0]
    subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")], check=True)


#: bytes of the tracked tree at most: every GPU call copies the working tree to the device beside the carried .gpu/
#: (the DSL, ~59.5 MB) and .before.tar.xz (~0.25 MB) within 64 MiB (67.1 MB); 5.5 MB leaves ~1.8 MB of margin for
#: untracked files and the next sessions' logs
TRACKED_BUDGET = 5_500_000


def tracked_sizes() -> dict[str, int]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    return {p: (ROOT / p).stat().st_size for p in out.split("\0") if p and (ROOT / p).is_file()}


def test_tracked_tree_within_the_gpu_call_budget():
    """The tracked tree (`git ls-files -z | xargs -0 du -cb`) stays within TRACKED_BUDGET, so that a GPU call is
    not refused for size; the message names the largest run folders under bench/ and what to do."""
    sizes = tracked_sizes()
    total = sum(sizes.values())
    runs: dict[str, int] = {}
    for path, size in sizes.items():
        if path.startswith("bench/") and path.count("/") >= 2:
            runs[path.split("/")[1]] = runs.get(path.split("/")[1], 0) + size
    largest = ", ".join(f"bench/{r} {b / 1e6:.2f} MB" for r, b in sorted(runs.items(), key=lambda x: -x[1])[:3])
    assert total <= TRACKED_BUDGET, (
        f"tracked tree {total / 1e6:.2f} MB > budget {TRACKED_BUDGET / 1e6:.1f} MB: a GPU call carries it beside "
        f".gpu/ within 64 MiB and is refused when over. Pack the raw logs of sessions NOTES.md has summarised: "
        f"python3 scripts/pack_bench.py bench/<run> && git add -A bench/<run> (bench/README.md); largest: {largest}")

