"""Hygiene checks for the committed tutorial notebooks (notebooks/NN_name.ipynb).

Each check is parametrized over the notebooks found, so a notebook that breaks a rule
shows up as ``test_xxx[03_streaming]``. The runner (ci/run_notebooks.py) relies on
these rules: it always passes ``metrics_path`` and the ``defaults`` of the parameter
sets (``backend``, ``device``, ...), and papermill needs exactly one ``parameters`` cell.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

import nbformat
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
NAME_RE = re.compile(r"^\d{2}_[a-z0-9]+(_[a-z0-9]+)*\.ipynb$")
REQUIRED_PARAMETERS = ("backend", "model_path", "device", "seed", "metrics_path")


def by_notebook(test):
    """Parametrize over the notebooks; with none, the check is not collected at all
    (test_notebooks_exist reports that) instead of showing up as empty-parameter skips."""
    if not NOTEBOOKS:
        return None
    return pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])(test)


@functools.lru_cache(maxsize=None)
def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def parameters_cells(nb) -> list:
    return [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]


def test_notebooks_exist():
    assert NOTEBOOKS, (
        f"no notebooks found in {NOTEBOOKS_DIR}: the tutorial notebooks (notebooks/NN_name.ipynb) "
        "are missing, so none of the per-notebook hygiene checks ran")


@by_notebook
def test_valid_nbformat(path):
    nbformat.validate(read(path))


@by_notebook
def test_name(path):
    assert NAME_RE.match(path.name), f"{path.name}: expected NN_lower_snake_name.ipynb (e.g. 03_streaming.ipynb)"


@by_notebook
def test_kernelspec_python3(path):
    spec = read(path).metadata.get("kernelspec", {})
    assert spec.get("name") == "python3", f"kernelspec name is {spec.get('name')!r}, expected 'python3'"


@by_notebook
def test_no_outputs(path):
    dirty = [i for i, c in enumerate(read(path).cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, (f"code cells {dirty} have outputs or an execution_count; clear them "
                       "(e.g. jupyter nbconvert --clear-output --inplace)")


@by_notebook
def test_title_cell(path):
    first = read(path).cells[0] if read(path).cells else None
    assert first is not None and first.cell_type == "markdown", "the first cell must be a markdown title cell"
    assert first.source.startswith("# "), f"the first cell must start with a '# ' title, got {first.source[:40]!r}"


@by_notebook
def test_one_parameters_cell(path):
    cells = parameters_cells(read(path))
    assert len(cells) == 1, f"expected exactly one cell tagged 'parameters', found {len(cells)}"
    assert cells[0].cell_type == "code", "the 'parameters' cell must be a code cell"


@by_notebook
def test_parameters_defined_and_documented(path):
    cells = parameters_cells(read(path))
    if len(cells) != 1:
        pytest.skip("no single parameters cell (reported by test_one_parameters_cell)")
    source = cells[0].source
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        pytest.fail(f"the parameters cell must be plain Python: {exc}")
    comment_lines = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                     if tok.type == tokenize.COMMENT and tok.string.lstrip("#").strip()}
    defined, undocumented = set(), []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign):
            targets = [stmt.target]
        else:
            continue
        names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        defined |= names
        if not comment_lines & set(range(stmt.lineno, stmt.end_lineno + 1)):
            undocumented.append(", ".join(sorted(names)) or ast.get_source_segment(source, stmt))
    missing = [p for p in REQUIRED_PARAMETERS if p not in defined]
    assert not missing, f"the parameters cell must define {missing}"
    assert not undocumented, (f"parameters without a '# allowed values' comment on their line: {undocumented}")


@by_notebook
def test_papermill_sees_every_parameter(path):
    """papermill cannot parse a parameter line whose comment holds '=' (e.g. '>= 1', 'tp=1'); it then
    drops the parameter, and the runner refuses it as unknown. Every assigned name must be visible."""
    import papermill

    cells = parameters_cells(read(path))
    if len(cells) != 1:
        pytest.skip("no single parameters cell (reported by test_one_parameters_cell)")
    tree = ast.parse(cells[0].source)
    assigned = {n.id for s in tree.body if isinstance(s, (ast.Assign, ast.AnnAssign))
                for t in (s.targets if isinstance(s, ast.Assign) else [s.target])
                for n in ast.walk(t) if isinstance(n, ast.Name)}
    seen = set(papermill.inspect_notebook(str(path)))
    assert assigned <= seen, f"papermill cannot see {sorted(assigned - seen)}: remove '=' from their comments"
