"""Static checks of the Neuron cells (the copy-paste cells of every notebook and of the contract fixture).

The convention is in ``tests/contract/contract_harness.py`` (and docs/inf2.md): a Neuron cell is tagged
``neuron`` + one of ``tnx`` / ``nxdi``; at its top level it has only standard-library imports and one
``if importlib.util.find_spec("<library>") is None: print("Skipped: ...") else:`` guard; in the ``else:``, its
own imports, then one ``# EDIT`` block of literals (``model_dir`` among them), then the guide's calls; it imports
only its stack's library, transformers, torch and the standard library (never ``helpers``), and it reads no name
defined by an earlier cell. These checks read the cells' source only (no stand-ins), so they run in the main
venv; the neuron lanes then run each cell as a script against the stand-ins (``ci/neuron_cells.py``), and the
tests at the end of this file run that runner on small cells here.
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
    """One stack tag each; top level = imports + the ``find_spec`` guard of that stack's library; only its library,
    transformers, torch and the standard library imported; one ``# EDIT`` line at the top of the ``else:`` body
    (after the body's imports), whose block sets ``model_dir``."""
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


def _cell(body, stack="tnx", top="import importlib.util\n\n"):
    lib = harness.LIBRARY[stack]
    return (f'{top}if importlib.util.find_spec("{lib}") is None:\n    print("Skipped: no {lib}")\nelse:\n'
            + "".join(f"    {line}\n" for line in body.splitlines()))


GOOD = "import os\n\n# EDIT\nmodel_dir = os.path.expanduser('~/m')\nn = 2\n\nprint(model_dir, n)"


@pytest.mark.parametrize("source,problem,stack", [
    (_cell(GOOD, top="import importlib.util\nimport helpers\n\n"), "imports 'helpers'", "tnx"),
    (_cell("from helpers.neuron import neuron_model_dir\n" + GOOD), "imports 'helpers.neuron'", "tnx"),
    (_cell(GOOD.replace("print(model_dir, n)", "import helpers\nprint(helpers)")), "imports 'helpers'", "tnx"),
    (_cell("from transformers_neuronx import LlamaForSampling\n" + GOOD, stack="nxdi"), "imports 'transformers_neuronx'",
     "nxdi"),
    (_cell("import numpy\n" + GOOD), "imports 'numpy'", "tnx"),
    (_cell("from . import x\n" + GOOD), "relative import", "tnx"),
    (_cell(GOOD), "needs one top-level", "nxdi"),  # the other stack's guard
    (_cell(GOOD).replace('print("Skipped: no transformers_neuronx")', "pass"), "needs one top-level", "tnx"),
    ('import helpers\nif helpers.run_neuron_cell("tnx"):\n    # EDIT\n    model_dir = 1\n', "needs one top-level", "tnx"),
    (_cell(GOOD, top="import importlib.util\nx = 1\n"), "outside the guard", "tnx"),
    (_cell(GOOD.replace("# EDIT\n", "")), "exactly one `# EDIT`", "tnx"),
    (_cell(GOOD + "\n# EDIT\ny = 2"), "exactly one `# EDIT`", "tnx"),
    ("# EDIT\n" + _cell(GOOD.replace("# EDIT\n", "")), "inside the `else:` body", "tnx"),
    (_cell("x = 1\n" + GOOD), "only imports may come", "tnx"),
    (_cell(GOOD.replace("model_dir = os.path.expanduser('~/m')\n", "")
           .replace("print(model_dir, n)", "print(n)")), "must set `model_dir`", "tnx"),
])
def test_shape_check_catches(source, problem, stack):
    problems = harness.shape_problems(source, stack)
    assert any(problem in p for p in problems), problems


def test_shape_check_accepts_the_documented_shape():
    source = _cell("from transformers_neuronx import LlamaForSampling\n" + GOOD)
    assert harness.shape_problems(source, "tnx") == [] and harness.free_names(source) == set()
    assert harness.free_names(source.replace("print(model_dir, n)", "print(model_dir, tok)")) == {"tok"}
    assert harness.edit_names(source) == {"model_dir", "n"}


def test_script_for_assigns_overrides_after_the_edit_block():
    source = _cell(GOOD)
    script = harness.script_for(source, {"model_dir": "/ckpt", "n": 5})
    ns = {}
    exec(compile(script.replace('importlib.util.find_spec("transformers_neuronx") is None', "False"), "cell", "exec"), ns)
    assert (ns["model_dir"], ns["n"]) == ("/ckpt", 5)
    with pytest.raises(harness.HarnessError, match="typo_name"):
        harness.script_for(source, {"typo_name": 1})


def _run_cells(tmp_path, body):
    """ci/neuron_cells.py on a one-notebook folder whose single tnx cell runs ``body``, with a fake library."""
    import nbformat.v4 as v4

    runner = _runner()
    lib = tmp_path / "lib" / "transformers_neuronx"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("import helpers.prompts  # a stand-in may reach helpers\n")
    nb = v4.new_notebook(cells=[v4.new_code_cell(_cell(body), metadata={"tags": ["neuron", "tnx"]})])
    script = runner.cell_scripts("tnx", [_write(tmp_path / "99_x.ipynb", nb)], {}, "/embedded")[0][1]
    path = tmp_path / "cell.py"
    path.write_text(script)
    env = {"PYTHONPATH": f"{REPO}:{lib.parent}"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        return runner.run_script(path, timeout=120)


def _write(path, nb):
    nbformat.write(nb, str(path))
    return path


def _runner():
    import importlib.util as iu

    spec = iu.spec_from_file_location("neuron_cells", REPO / "ci" / "neuron_cells.py")
    module = iu.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runner_runs_a_cell_as_a_script_with_its_overrides(tmp_path):
    ok, output, _ = _run_cells(tmp_path, "import os, transformers_neuronx\n\n# EDIT\nmodel_dir = 'x'\n\n"
                                         "print('dir', model_dir, os.getcwd() != '" + str(REPO) + "')")
    assert ok and "dir /embedded True" in output, output


def test_runner_fails_a_cell_that_imports_helpers(tmp_path):
    ok, output, _ = _run_cells(tmp_path, "import os\n\n# EDIT\nmodel_dir = 'x'\n\nimport helpers\nprint(helpers)")
    assert not ok and "No module named 'helpers'" in output, output


def test_runner_fails_a_cell_that_skipped_itself(tmp_path):
    ok, output, _ = _run_cells(tmp_path, "# EDIT\nmodel_dir = 'x'\n")
    assert ok  # the fake library imports: the cell ran
    import shutil

    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    runner = _runner()
    path = tmp_path / "cell.py"
    path.write_text(_cell("# EDIT\nmodel_dir = 'x'\n"))
    ok, output, _ = runner.run_script(path, timeout=60)
    assert not ok and "skipped itself" in output, output


def test_runner_refuses_an_override_no_cell_sets(tmp_path):
    import nbformat.v4 as v4

    nb = v4.new_notebook(cells=[v4.new_code_cell(_cell(GOOD), metadata={"tags": ["neuron", "tnx"]})])
    path = _write(tmp_path / "99_x.ipynb", nb)
    runner = _runner()
    assert runner.cell_scripts("tnx", [path], {"all": {"n": 3}}, "/m")  # set by the cell: fine
    with pytest.raises(SystemExit, match="typo"):
        runner.cell_scripts("tnx", [path], {"all": {"typo": 3}}, "/m")
    assert runner.cell_scripts("tnx", [path], {"07": {"typo": 3}}, "/m")  # another notebook's: not this run's


def test_runner_runs_every_cell_on_both_models(tmp_path, capsys):
    """The embedded model, then the production-shaped one (ci/production_model.py), each cell with its model_dir;
    the table names the model."""
    import nbformat.v4 as v4

    runner = _runner()
    assert runner.MODELS == ("embedded", "production-shaped")
    lib = tmp_path / "lib" / "transformers_neuronx"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (tmp_path / "notebooks").mkdir()
    nb = v4.new_notebook(cells=[v4.new_code_cell(_cell("# EDIT\nmodel_dir = 'x'\n\nprint('on', model_dir)"),
                                                 metadata={"tags": ["neuron", "tnx"]})])
    _write(tmp_path / "notebooks" / "99_x.ipynb", nb)
    (tmp_path / "params.yaml").write_text("all: {}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "REPO", tmp_path)
        mp.setattr(runner, "checkpoint", lambda name: f"/ckpt/{name}")
        mp.setenv("PYTHONPATH", f"{REPO}:{lib.parent}")
        status = runner.main(["tnx", "--out", str(tmp_path / "out"), "--params", str(tmp_path / "params.yaml")])
    table = capsys.readouterr().out
    assert status == 0, table
    rows = [line.split() for line in table.splitlines() if line.startswith("PASS")]
    assert [(r[1], r[2]) for r in rows] == [("embedded", "99_x-cell0"), ("production-shaped", "99_x-cell0")], table
    for model in runner.MODELS:
        assert f"on /ckpt/{model}" in (tmp_path / "out" / "tnx" / model / "99_x-cell0.log").read_text()
