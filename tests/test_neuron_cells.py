"""Static checks of the Neuron cells (the copy-paste cells of every notebook and of the contract fixture).

The convention is in ``tests/contract/contract_harness.py`` (and docs/inf2.md): a Neuron cell is tagged
``neuron`` + one of ``tnx`` / ``nxdi``; at its top level it has only imports and one
``if helpers.run_neuron_cell("<stack>"):`` guard; inside the guard, its own imports, then one ``# EDIT``
block of literals, then the guide's calls; and it reads no name defined by an earlier cell. These checks
read the cells' source only (no stand-ins), so they run in the main venv; the contract test
(tests/contract, in the neuron lanes) then executes each cell alone against the stand-ins.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "contract"))
import contract_harness as harness  # noqa: E402

FIXTURE = REPO / "tests" / "contract" / "fixtures" / "00_contract_sample.ipynb"
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
ALL = [FIXTURE, *NOTEBOOKS]


def _cells(path):
    return harness.neuron_cells(nbformat.read(str(path), as_version=4))


def test_the_fixture_and_notebooks_have_neuron_cells():
    assert _cells(FIXTURE) and NOTEBOOKS


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_neuron_cells_are_tagged_and_guarded(path):
    """One stack tag each; top level = imports + ``if helpers.run_neuron_cell("<that stack>"):``; one ``# EDIT``
    line at the top of the guarded body (after the body's imports)."""
    problems = []
    for i, cell in _cells(path):
        stacks = harness.tags(cell) & set(harness.STACKS)
        if len(stacks) != 1:
            problems.append(f"cell {i}: tags {sorted(harness.tags(cell))} need exactly one of {harness.STACKS}")
            continue
        problems += [f"cell {i}: {p}" for p in harness.shape_problems(cell.source, stacks.pop())]
    assert not problems, f"{path.name}: Neuron cells off the convention:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_neuron_cells_stand_alone(path):
    """No name read from an earlier cell: each Neuron cell binds (imports, assigns) everything it reads."""
    problems = [f"cell {i} ({'/'.join(sorted(harness.tags(cell) & set(harness.STACKS)))}) reads "
                + ", ".join(sorted(free)) for i, cell in _cells(path) if (free := harness.free_names(cell.source))]
    assert not problems, (f"{path.name}: Neuron cells must stand alone (own imports, literals under `# EDIT`), "
                          "but these read names from earlier cells:\n  " + "\n  ".join(problems))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_cells_for_both_stacks(path):
    nb = nbformat.read(str(path), as_version=4)
    assert harness.neuron_stacks(nb) == list(harness.STACKS), (
        f"{path.name}: the template asks for Neuron cells for both stacks (tags neuron+tnx and neuron+nxdi)")


@pytest.mark.parametrize("source,problem", [
    ('import helpers\nif helpers.run_neuron_cell("tnx", bk):\n    # EDIT\n    x = 1\n', "needs one top-level"),
    ('import helpers\nif helpers.run_neuron_cell("nxdi"):\n    # EDIT\n    x = 1\n', "needs one top-level"),
    ('import helpers\nx = 1\nif helpers.run_neuron_cell("tnx"):\n    # EDIT\n    y = x\n', "outside the guard"),
    ('import helpers\nif helpers.run_neuron_cell("tnx"):\n    x = 1\n', "exactly one `# EDIT`"),
    ('import helpers\nif helpers.run_neuron_cell("tnx"):\n    # EDIT\n    x = 1\n    # EDIT\n    y = 2\n',
     "exactly one `# EDIT`"),
    ('import helpers  # EDIT\nif helpers.run_neuron_cell("tnx"):\n    x = 1\n', "exactly one `# EDIT`"),
    ('# EDIT\nimport helpers\nif helpers.run_neuron_cell("tnx"):\n    x = 1\n', "inside the guarded body"),
    ('import helpers\nif helpers.run_neuron_cell("tnx"):\n    x = 1\n    # EDIT\n    y = 2\n', "only imports may come"),
])
def test_shape_check_catches(source, problem):
    assert any(problem in p for p in harness.shape_problems(source, "tnx")), harness.shape_problems(source, "tnx")


def test_shape_check_accepts_the_documented_shape():
    source = ('import helpers  # comment\n\nif helpers.run_neuron_cell("tnx"):\n    from x import y\n\n'
              '    # EDIT\n    a, b = 1, [2]\n\n    print(y(a, b))\n')
    assert harness.shape_problems(source, "tnx") == [] and harness.free_names(source) == set()
    assert harness.free_names(source.replace("print(y(a, b))", "print(y(a, tok))")) == {"tok"}
