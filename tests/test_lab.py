"""The front door, checked without starting a server: `bash ci/lab.sh` (JupyterLab on notebooks/) parses
and runs its steps in order, jupyterlab is pinned, pyproject.toml installs exactly the `helpers` package
with every data file it reads, and the README's first screen has the commands, the notebooks and a plot."""
from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from setuptools import find_namespace_packages, find_packages

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "ci" / "lab.sh"


def _code_lines(path: Path) -> list[str]:
    """The script's commands: comments and blank lines dropped, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_lab_script_parses():
    bash = shutil.which("bash")
    assert bash, "bash is needed to run ci/lab.sh"
    result = subprocess.run([bash, "-n", str(LAB)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_lab_script_sets_up_installs_and_starts_jupyterlab_on_notebooks():
    lines = _code_lines(LAB)
    assert lines[0] == "set -euo pipefail"

    def index(pattern: str) -> int:
        hits = [i for i, ln in enumerate(lines) if re.search(pattern, ln)]
        assert hits, f"ci/lab.sh has no line matching {pattern!r}"
        return hits[0]

    setup = index(r"^bash ci/setup\.sh$")
    lab_reqs = index(r"pip install .*-r requirements-lab\.txt")
    editable = index(r"pip install .*--no-deps -e \.$")
    start = index(r"^exec \.venv/bin/jupyter lab ")
    assert setup < lab_reqs < start and setup < editable < start
    assert "--ServerApp.root_dir=notebooks" in lines[start] and lines[start].endswith('"$@"')
    # nothing registered outside .venv: no user-wide kernel spec, no PYTHONPATH exported for the kernel
    text = "\n".join(lines)
    assert "kernelspec install" not in text and "ipykernel install" not in text and "--user" not in text
    assert not re.search(r"export PYTHONPATH", text)


def test_jupyterlab_is_pinned_in_requirements_lab():
    lines = [ln.split("#")[0].strip() for ln in (REPO / "requirements-lab.txt").read_text().splitlines()]
    lines = [ln for ln in lines if ln]
    assert "-r requirements.txt" in lines, "the lab requirements sit on top of the pinned CPU stack"
    pins = [ln for ln in lines if not ln.startswith("-")]
    assert pins and all(re.fullmatch(r"[\w.-]+==[\w.]+", p) for p in pins), pins
    assert any(p.startswith("jupyterlab==4.") for p in pins), pins
    # the CI test run does not pay for JupyterLab
    assert "jupyterlab" not in (REPO / "requirements.txt").read_text().lower()


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_pyproject_installs_the_helpers_package_only(pyproject):
    assert pyproject["build-system"]["build-backend"] == "setuptools.build_meta"
    find = pyproject["tool"]["setuptools"]["packages"]["find"]
    finder = find_namespace_packages if find.get("namespaces", True) else find_packages  # setuptools' default: True
    packages = finder(where=str(REPO), include=find.get("include", ("*",)), exclude=find.get("exclude", ()))
    assert "helpers" in packages
    assert all(p == "helpers" or p.startswith("helpers.") for p in packages), packages
    # every package folder under helpers/ is found (a subfolder without __init__.py would be left out)
    folders = {p.parent for p in (REPO / "helpers").rglob("*.py") if "__pycache__" not in p.parts}
    assert {".".join(f.relative_to(REPO).parts) for f in folders} <= set(packages)


def test_pyproject_ships_every_data_file_of_helpers(pyproject):
    """helpers reads files beside its modules (model_configs/, data/): a wheel must carry them."""
    globs = pyproject["tool"]["setuptools"]["package-data"]["helpers"]
    shipped = {p for g in globs for p in (REPO / "helpers").glob(g)}
    data = {p for p in (REPO / "helpers").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert data, "helpers has data files (model_configs/, data/)"
    assert data <= shipped, sorted(str(p.relative_to(REPO)) for p in data - shipped)


def test_readme_front_door_lists_the_commands_every_notebook_and_a_plot():
    """The README's first screen: the three commands, the notebook table (every notebook), one figure;
    every local file it links to exists."""
    readme = (REPO / "README.md").read_text()
    table = readme.index("| notebook |")
    for command in ("bash ci/lab.sh", "bash ci/notebooks.sh", "bash ci/test.sh"):
        assert -1 < readme.find(command) < table, f"{command} is not above the notebook table"
    rows = {m for m in re.findall(r"^\| `(\d\d_\w+)` \|", readme, re.M)}
    assert rows == {p.stem for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    image = re.search(r"!\[[^\]]+\]\((docs/img/[\w.-]+\.png)\)", readme)
    assert image and readme.index(image.group(0)) < readme.index("\n## ", table)
    for doc in (REPO / "README.md", REPO / "docs" / "performance.md"):
        for link in re.findall(r"\]\(([^)#:]+)\)", doc.read_text()):
            assert (doc.parent / link).exists(), f"{doc.name} links to a missing {link}"
