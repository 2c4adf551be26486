"""Static checks of the Neuron cells (the copy-paste recipes of every notebook and of the contract fixture).

The convention is in ``tests/contract/contract_harness.py`` (and docs/inf2.md): a Neuron cell is tagged
``neuron`` + one of ``tnx`` / ``nxdi`` and starts with that stack's header comment; it is plain top-level code (the
notebook's ``%load_ext helpers.notebook.recipes`` skips it where the library is absent); a stack's cells, joined in
order, are one recipe: its imports, one ``# EDIT`` block of literals in the first cell (``model_dir`` among them),
then the guide's calls; it imports only its stack's library, transformers, torch and the standard library (never
``helpers``), and it reads no name another cell of the notebook defines. These checks read the cells' source only
(no stand-ins), so they run in the main venv; the neuron lanes then run each recipe as a script against the
stand-ins (``ci/neuron_cells.py``), and the tests at the end of this file run that runner on small cells here.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "contract"))
import contract_harness as harness  # noqa: E402
from helpers.notebook.recipes import recipe_stack  # noqa: E402

FIXTURE = REPO / "tests" / "contract" / "fixtures" / "00_contract_sample.ipynb"
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
ALL = [FIXTURE, *NOTEBOOKS]


def _cells(path):
    return harness.neuron_cells(nbformat.read(str(path), as_version=4))


def test_the_fixture_and_notebooks_have_neuron_cells():
    assert _cells(FIXTURE) and NOTEBOOKS


def _recipes(path):
    """{stack: [(index, cell), ...]} of a notebook's Neuron cells."""
    out: dict = {}
    for i, cell in _cells(path):
        for stack in harness.tags(cell) & set(harness.STACKS):
            out.setdefault(stack, []).append((i, cell))
    return out


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_neuron_cells_are_tagged_plain_recipes(path):
    """One stack tag each and that stack's header first; plain top-level code (no guard); only its library,
    transformers, torch and the standard library imported; one top-level ``# EDIT`` block in the first cell of
    each stack (after its imports), which sets ``model_dir``."""
    problems = []
    for i, cell in _cells(path):
        stacks = harness.tags(cell) & set(harness.STACKS)
        if len(stacks) != 1:
            problems.append(f"cell {i}: tags {sorted(harness.tags(cell))} need exactly one of {harness.STACKS}")
    for stack, cells in _recipes(path).items():
        problems += [f"{stack} ({[i for i, _ in cells]}): {p}"
                     for p in harness.shape_problems([c.source for _, c in cells], stack)]
    assert not problems, f"{path.name}: Neuron cells off the convention:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_only_neuron_cells_carry_a_recipe_header(path):
    """The recipes extension skips on the header alone: a reference cell starting with one would be skipped too."""
    nb = nbformat.read(str(path), as_version=4)
    wrong = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "neuron" not in harness.tags(c)
             and recipe_stack((c.source.splitlines() or [""])[0])]
    assert not wrong, f"{path.name}: cells {wrong} start with a recipe header but are not tagged neuron"
    loads = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
             and "%load_ext helpers.notebook.recipes" in c.source.splitlines()]
    first = min(i for i, _ in _cells(path))
    assert loads and loads[0] < first, f"{path.name}: `%load_ext helpers.notebook.recipes` must run before cell {first}"


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_neuron_recipes_stand_alone(path):
    """No name read from another cell: each stack's cells, joined, bind (import, assign) everything they read."""
    problems = [f"{stack} reads " + ", ".join(sorted(free)) for stack, cells in _recipes(path).items()
                if (free := harness.free_names(harness.recipe_source([c.source for _, c in cells])))]
    assert not problems, (f"{path.name}: Neuron recipes must stand alone (own imports, literals under `# EDIT`), "
                          "but these read names from other cells:\n  " + "\n  ".join(problems))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_cells_for_both_stacks(path):
    nb = nbformat.read(str(path), as_version=4)
    assert harness.neuron_stacks(nb) == list(harness.STACKS), (
        f"{path.name}: the template asks for Neuron cells for both stacks (tags neuron+tnx and neuron+nxdi)")


def _cell(body, stack="tnx"):
    return f"{harness.RECIPE_HEADERS[stack][0]} recipe\n{body}\n"


GOOD = "import os\n\n# EDIT\nmodel_dir = os.path.expanduser('~/m')\nn = 2\n\nprint(model_dir, n)"
GUARDED = ('import importlib.util\n\nif importlib.util.find_spec("transformers_neuronx") is None:\n'
           '    print("Skipped")\nelse:\n    # EDIT\n    model_dir = 1\n')


@pytest.mark.parametrize("cells,problem,stack", [
    ([_cell("import helpers\n" + GOOD)], "imports 'helpers'", "tnx"),
    ([_cell("from helpers.neuron import neuron_model_dir\n" + GOOD)], "imports 'helpers.neuron'", "tnx"),
    ([_cell(GOOD.replace("print(model_dir, n)", "import helpers\nprint(helpers)"))], "imports 'helpers'", "tnx"),
    ([_cell("from transformers_neuronx import LlamaForSampling\n" + GOOD, "nxdi")], "imports 'transformers_neuronx'",
     "nxdi"),
    ([_cell("import numpy\n" + GOOD)], "imports 'numpy'", "tnx"),
    ([_cell("from . import x\n" + GOOD)], "relative import", "tnx"),
    ([_cell(GOOD)], "must start with '# NxD Inference'", "nxdi"),  # the other stack's header
    ([GOOD], "must start with '# transformers-neuronx'", "tnx"),
    (["# transformers-neuronx\n" + GUARDED], "guard", "tnx"),
    ([_cell(GOOD.replace("# EDIT\n", ""))], "exactly one `# EDIT`", "tnx"),
    ([_cell(GOOD + "\n# EDIT\ny = 2")], "exactly one `# EDIT`", "tnx"),
    ([_cell(GOOD), _cell("# EDIT\ny = 2")], "in its first cell", "tnx"),
    ([_cell("def f():\n    # EDIT\n    model_dir = 1\n")], "must be at the top level", "tnx"),
    ([_cell("x = 1\n" + GOOD)], "only imports may come", "tnx"),
    ([_cell(GOOD.replace("model_dir = os.path.expanduser('~/m')\n", "")
            .replace("print(model_dir, n)", "print(n)"))], "must set `model_dir`", "tnx"),
])
def test_shape_check_catches(cells, problem, stack):
    problems = harness.shape_problems(cells, stack)
    assert any(problem in p for p in problems), problems


def test_shape_check_accepts_the_documented_shape():
    first = _cell("from transformers_neuronx import LlamaForSampling\n" + GOOD)
    cells = [first, _cell("print(n + 1)")]
    assert harness.shape_problems(cells, "tnx") == []
    assert harness.free_names(harness.recipe_source(cells)) == set()
    assert harness.free_names(harness.recipe_source([first, _cell("print(tok)")])) == {"tok"}
    assert harness.edit_names(first) == {"model_dir", "n"}


def test_script_for_joins_the_cells_and_assigns_overrides_after_the_edit_block():
    script = harness.script_for([_cell(GOOD), _cell("seen = (model_dir, n)")], {"model_dir": "/ckpt", "n": 5})
    ns = {}
    exec(compile(script, "recipe", "exec"), ns)
    assert ns["seen"] == ("/ckpt", 5)
    with pytest.raises(harness.HarnessError, match="typo_name"):
        harness.script_for([_cell(GOOD)], {"typo_name": 1})


def test_the_recipes_extension_skips_a_recipe_whose_library_is_absent(monkeypatch):
    import importlib.util

    from helpers.notebook import recipes

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers_neuronx" else real(name, *a))
    lines = _cell(GOOD).splitlines(keepends=True)
    skipped = recipes.skip_absent(lines)
    assert len(skipped) == 1 and "Skipped: transformers_neuronx is not installed" in skipped[0]
    ns = {}
    exec("".join(skipped).replace("print(", "msg = ("), ns)
    assert ns["msg"] == recipes.skip_message("tnx")
    assert recipes.skip_absent(["x = 1\n"]) == ["x = 1\n"]  # not a recipe
    assert recipes.skip_absent(_cell(GOOD, "nxdi").splitlines(True))[0].startswith("print(") \
        == (real("neuronx_distributed_inference") is None)


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


def test_runner_fails_a_script_that_says_it_skipped(tmp_path):
    ok, output, _ = _run_cells(tmp_path, "# EDIT\nmodel_dir = 'x'\n")
    assert ok  # the fake library imports: the recipe ran
    path = tmp_path / "skipped.py"
    path.write_text("print('Skipped: no library')\n")
    ok, output, _ = _runner().run_script(path, timeout=60)
    assert not ok and "says it skipped" in output, output


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
    assert [(r[1], r[2]) for r in rows] == [("embedded", "99_x-tnx"), ("production-shaped", "99_x-tnx")], table
    for model in runner.MODELS:
        assert f"on /ckpt/{model}" in (tmp_path / "out" / "tnx" / model / "99_x-tnx.log").read_text()
    # the machine-readable record beside the logs (ci/build_site.py reads it): one row per recipe and model
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    assert [(r["notebook"], r["stack"], r["model"], r["passed"]) for r in rows] == [
        ("99_x", "tnx", "embedded", True), ("99_x", "tnx", "production-shaped", True)]
    for row in rows:
        assert row["seconds"] >= 0 and row["finished"].endswith("+00:00") and "commit" in row
        assert Path(row["log"]).is_file() and row["transformers"]
    # a later run of one model replaces that model's row and keeps the other's
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "REPO", tmp_path)
        mp.setattr(runner, "checkpoint", lambda name: f"/ckpt/{name}")
        mp.setenv("PYTHONPATH", f"{REPO}:{lib.parent}")
        assert runner.main(["tnx", "--out", str(tmp_path / "out"), "--params", str(tmp_path / "params.yaml"),
                            "--models", "production-shaped"]) == 0
    again = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    assert [r["model"] for r in again] == ["embedded", "production-shaped"]
    assert again[0] == rows[0] and again[1]["finished"] >= rows[1]["finished"]
