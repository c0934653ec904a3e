"""CI runs the README's test command: the set-up block of README.md that runs pytest stands verbatim in .ci/run."""
import ast
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers import git_checkout_or_skip

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    commands = [line for block in blocks for line in block.splitlines() if "pip install" in line and "pytest" in line]
    assert len(commands) == 1, commands  # the README's one install-and-test command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    verbatim = re.compile(re.escape(commands[0]) + r"\s*(\|\||&&|;|$)")  # no argument added after it
    assert any(verbatim.search(line) for line in ci.splitlines() if not line.lstrip().startswith("#")), commands[0]
    subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")], check=True)


def test_the_package_metadata_uses_no_deprecated_setuptools_form(monkeypatch):
    """The README's install builds the package with the newest setuptools (pip's isolated build). setuptools 77+
    warns that a table-form `project.license` (`{ text = ... }`) is deprecated and to be refused from 2027-02-18,
    which would stop both README commands on a fresh machine: the metadata is applied here with setuptools'
    warnings as errors (an SPDX string and the LICENSE file), and the build floor admits that form."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} predates PEP 639 license expressions")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)  # readme and license files are relative to the project
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), "pyproject.toml")
    assert dist.metadata.license_expression == "BSD-3-Clause"
    assert [Path(f).name for f in dist.metadata.license_files] == ["LICENSE"] and (ROOT / "LICENSE").is_file()
    floor = re.search(r'"setuptools>=(\d+)', (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert floor and int(floor.group(1)) >= 77, "build-system must require setuptools>=77 for an SPDX license"


#: bytes of the tracked tree at most: every GPU call copies the working tree to the device beside the carried .gpu/
#: (the DSL, ~59.5 MB) and .before.tar.xz (~0.3 MB) within 64 MiB (67.1 MB); 6.6 MB leaves ~0.7 MB of margin for
#: untracked files (none in a clean checkout; 5.5 MB until session 26, when bench/NOTES.md alone was 0.49 MB; 6.0 MB
#: until session 37, when it was 0.57 MB and every older run's raw logs were packed; at session 45 NOTES.md's sections
#: up to session 20 went into bench/notes-vol1-2026-11-30-to-12-03.md.xz, 0.43 MB of text in 0.13 MB; 6.4 MB until
#: session 53, when the notes up to session 50 were in volumes, every run's logs packed and the PNG charts already
#: optimal; 6.5 MB until session 54, whose leftpad_k code and tests came after the notes up to session 53 went into
#: volumes and every packable log was packed: the .gpu/ carried beside the tree was 59.48 MB then; 6.6 MB until
#: session 57, whose conftest / hf changes passed it with the notes up to session 56 in volumes: .gpu/ 59.47 MB, so
#: 6.7 MB leaves ~0.6 MB)
TRACKED_BUDGET = 6_700_000


def tracked_sizes() -> dict[str, int]:
    git_checkout_or_skip()
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


#: import name -> the distribution that provides it (those a test may import without a guard)
DISTRIBUTIONS = {"torch": "torch", "numpy": "numpy", "cutlass": "nvidia-cutlass-dsl", "tvm_ffi": "apache-tvm-ffi",
                 "rich": "rich", "tqdm": "tqdm", "pytest": "pytest", "matplotlib": "matplotlib",
                 "transformers": "transformers", "tokenizers": "transformers"}  # tokenizers comes with transformers


def _imports(path: Path, module_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if module_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_tests_import_only_what_the_test_command_installs():
    """The README's test command installs the package with its dev extra, nothing else (a CPU build of torch has no
    triton, for one): every third-party module a test imports, or a script a test loads imports at its top, is a
    declared dependency or dev extra, or is guarded by pytest.importorskip in that test file."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {re.split(r"[\[<>=;! ]", d, maxsplit=1)[0].lower()
                for d in project["dependencies"] + project["optional-dependencies"]["dev"]}
    local = {p.stem for folder in ("tests", "scripts") for p in (ROOT / folder).glob("*.py")} | {"fa_variants"}
    faults = []
    for test in sorted((ROOT / "tests").glob("*.py")):
        text = test.read_text(encoding="utf-8")
        names = _imports(test)
        for script in re.findall(r'load_script\("(\w+)"\)', text):
            names |= _imports(ROOT / "scripts" / f"{script}.py", module_level_only=True)
        for name in sorted(names - local - set(sys.stdlib_module_names)):
            if DISTRIBUTIONS.get(name) in declared or f'importorskip("{name}' in text:
                continue
            faults.append(f"{test.name} imports {name}")
    assert faults == [], ("not installed by `pip install -e '.[dev]'`: declare it in pyproject's dev extra (and "
                          "DISTRIBUTIONS here), guard it with pytest.importorskip, or use a stand-in module", faults)


def test_the_package_imports_without_deprecated_calls_of_its_own():
    """Every module of fa_variants imports in a fresh process with DeprecationWarnings raised from the package's own
    lines made errors: an API its dependencies mark for removal (the DSL's cutlass.utils.LayoutEnum, for one) fails
    here, before a release that drops it fails a user's import."""
    code = (
        "import importlib, pkgutil, warnings\n"
        "warnings.filterwarnings('error', category=DeprecationWarning, module=r'fa_variants(\\.|$)')\n"
        "warnings.filterwarnings('error', category=PendingDeprecationWarning, module=r'fa_variants(\\.|$)')\n"
        "import fa_variants\n"
        "names = [m.name for m in pkgutil.walk_packages(fa_variants.__path__, 'fa_variants.')\n"
        "         if not m.name.endswith('__main__')]  # runs the command line\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 50  # walked the whole package, not an empty path
