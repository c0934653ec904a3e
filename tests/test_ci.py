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
