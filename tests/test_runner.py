"""Tests for ci/run_notebooks.py on tiny synthetic notebooks.

One runner invocation (module-scoped fixture) executes four notebooks: a passing one
that writes metrics, one raising in cell 2, one sleeping past a 5 s timeout and one
given an undeclared parameter; the remaining tests are pure-function unit tests.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO_ROOT = Path(__file__).resolve().parent.parent


def _load_runner():
    spec = importlib.util.spec_from_file_location("run_notebooks", REPO_ROOT / "ci" / "run_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_notebooks"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


runner = _load_runner()

PARAMS_CELL = """\
backend = "reference"  # reference | neuron
model_path = None  # path to the model, or None
device = "cpu"  # cpu | neuron
seed = 0  # int
metrics_path = None  # str: where to write the metrics JSON
"""


def _notebook(*code_cells: str, params: str = PARAMS_CELL) -> nbformat.NotebookNode:
    params_cell = new_code_cell(params)
    params_cell.metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=[new_markdown_cell("# Test"), params_cell, *map(new_code_cell, code_cells)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


WRITE_METRICS = """\
import json
with open(metrics_path, "w") as fh:
    json.dump({"tokens_per_s": 10.0 + seed, "accuracy": 0.5, "backend": backend}, fh)
"""

NOTEBOOKS = {
    # cells: 0 markdown, 1 parameters, 2..
    "01_pass": _notebook(WRITE_METRICS, "print('done')"),
    "02_fail": _notebook("x = 1\nraise ValueError('boom in cell two')\n", "print('never')"),
    "03_slow": _notebook("import time\ntime.sleep(60)"),
    "04_typo": _notebook("print('never runs')"),
}

BASELINES = {
    "01_pass": {
        # seed=2 -> tokens_per_s = 12.0
        "tokens_per_s": {"value": 12.5, "rtol": 0.1},  # within 10 %: ok
        "accuracy": {"min": 0.4, "max": 0.6},  # ok
        "backend": {"equals": "reference"},  # ok
    },
    "02_fail": {"tokens_per_s": {"min": 1}},  # failed notebooks are not compared
}


def _run(tmp: Path, argv_extra: list[str], baselines: dict | None) -> dict:
    out = tmp / "out"
    base_file = tmp / "baselines.json"
    base_file.write_text(json.dumps(baselines or {}))
    argv = ["--notebooks-dir", str(tmp / "notebooks"), "--params", str(tmp / "params.yaml"),
            "--out", str(out), "--baselines", str(base_file), *argv_extra]
    stdout, stderr = io.StringIO(), io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = runner.main(argv)
    report = json.loads((out / "report.json").read_text())
    return {"rc": rc, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(), "out": out,
            "report": report["notebooks"], "ok": report["ok"], "elapsed": time.monotonic() - start}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runner")
    (tmp / "notebooks").mkdir()
    for stem, nb in NOTEBOOKS.items():
        nbformat.write(nb, str(tmp / "notebooks" / f"{stem}.ipynb"))
    (tmp / "params.yaml").write_text(
        "timeout: 120\n"
        "timeouts: {03_slow: 5}\n"
        "defaults: {backend: reference, device: cpu}\n"
        "notebooks:\n"
        "  04_typo: {max_new_tokns: 8}\n")
    return tmp


@pytest.fixture(scope="module")
def run(workspace):
    return _run(workspace, ["--set", "seed=2"], BASELINES)


# --------------------------------------------------------------------------- full run


def test_statuses_and_exit_code(run):
    statuses = {stem: r["status"] for stem, r in run["report"].items()}
    assert statuses == {"01_pass": "PASS", "02_fail": "FAIL", "03_slow": "TIMEOUT", "04_typo": "FAIL"}, run["stderr"]
    assert run["rc"] == 1
    assert run["ok"] is False


def test_failing_cell_and_error(run):
    r = run["report"]["02_fail"]
    assert r["failing_cell"] == 2
    assert r["failing_source"] == "x = 1"
    assert r["error"] == "ValueError: boom in cell two"
    assert r["regressions"] == []  # failed notebooks are not compared to baselines


def test_timeout(run):
    r = run["report"]["03_slow"]
    assert r["timeout"] == 5
    assert 5 <= r["duration"] < 20
    assert "timed out after 5 s" in r["error"]
    assert r["failing_cell"] == 2  # the cell that was running when it was killed
    assert r["failing_source"] == "import time"


def test_unknown_parameter(run):
    r = run["report"]["04_typo"]
    assert "unknown parameter 'max_new_tokns'" in r["error"]
    for known in ("backend", "model_path", "device", "seed", "metrics_path"):
        assert known in r["error"]
    assert r["executed"] is None  # never started


def test_table(run):
    lines = run["stdout"].splitlines()
    header = next(ln for ln in lines if ln.startswith("notebook"))
    for column in ("status", "duration (s)", "failing cell", "error"):
        assert column in header
    row = {ln.split()[0]: ln for ln in lines if ln.split() and ln.split()[0] in NOTEBOOKS}
    assert set(row) == set(NOTEBOOKS)
    assert "FAIL" in row["02_fail"] and "2: x = 1" in row["02_fail"] and "ValueError: boom" in row["02_fail"]
    assert "TIMEOUT" in row["03_slow"]
    assert "PASS" in row["01_pass"]
    assert "max_new_tokns" in row["04_typo"]
    assert "01_pass: starting" in run["stderr"]


def test_parameters_passed(run):
    params = run["report"]["01_pass"]["parameters"]
    assert params["seed"] == 2 and params["backend"] == "reference" and params["device"] == "cpu"
    assert params["metrics_path"] == str(run["out"] / "metrics" / "01_pass.json")


def test_metrics_collected(run):
    metrics = json.loads((run["out"] / "metrics.json").read_text())
    assert metrics == {"01_pass": {"tokens_per_s": 12.0, "accuracy": 0.5, "backend": "reference"}}


def test_outputs_written(run):
    out = run["out"]
    for stem in ("01_pass", "02_fail", "03_slow"):
        assert (out / "executed" / f"{stem}.ipynb").exists(), stem
    for stem in NOTEBOOKS:
        assert (out / "html" / f"{stem}.html").stat().st_size > 0, stem
    assert "boom in cell two" in (out / "html" / "02_fail.html").read_text()
    assert "max_new_tokns" in (out / "html" / "04_typo.html").read_text()
    # the executed notebook carries the injected parameters
    nb = nbformat.read(str(out / "executed" / "01_pass.ipynb"), as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "seed = 2" in injected[0].source


def test_regression_run(workspace, run):
    """Second run of the passing notebook only, against baselines it does not meet."""
    baselines = {"01_pass": {
        "tokens_per_s": {"value": 20.0, "rtol": 0.1},  # 12 outside 20 ± 2
        "accuracy": {"min": 0.9},
        "backend": {"equals": "neuron"},
        "latency_ms": {"max": 100},  # missing from the results
    }}
    res = _run(workspace, ["--notebooks", "01", "--set", "seed=2"], baselines)
    r = res["report"]["01_pass"]
    assert res["rc"] == 1 and r["status"] == "REGRESSION"
    assert set(res["report"]) == {"01_pass"}
    assert "tokens_per_s: got 12, baseline 20 ± 2" in r["regressions"]
    assert any(m.startswith("accuracy: got 0.5") and "min 0.9" in m for m in r["regressions"])
    assert any(m.startswith("backend: got 'reference'") for m in r["regressions"])
    assert any(m.startswith("latency_ms: missing") for m in r["regressions"])
    assert "REGRESSION" in res["stdout"] and "tokens_per_s: got 12, baseline 20 ± 2" in res["stdout"]


# --------------------------------------------------------------------------- usage errors (no kernels)


def test_unknown_notebook_lists_available(workspace, capsys):
    rc = runner.main(["--notebooks-dir", str(workspace / "notebooks"), "--notebooks", "99_nope",
                      "--out", str(workspace / "out_err")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "99_nope" in err and "01_pass" in err and "04_typo" in err


def test_params_entry_for_unknown_notebook(workspace, tmp_path, capsys):
    params = tmp_path / "p.yaml"
    params.write_text("notebooks: {05_missing: {seed: 1}}\n")
    rc = runner.main(["--notebooks-dir", str(workspace / "notebooks"), "--params", str(params),
                      "--out", str(tmp_path / "out")])
    assert rc == 2 and "05_missing" in capsys.readouterr().err


def test_select_notebooks():
    available = {"01_intro": Path("a"), "03_streaming": Path("b"), "04_stopping_criteria": Path("c")}
    assert runner.select_notebooks(available, None) == list(available)
    assert runner.select_notebooks(available, ["04", "03_streaming", "notebooks/01_intro.ipynb"]) == [
        "04_stopping_criteria", "03_streaming", "01_intro"]
    with pytest.raises(runner.UsageError, match="available: 01_intro, 03_streaming"):
        runner.select_notebooks(available, ["02"])


# --------------------------------------------------------------------------- pure functions


def test_load_params_and_precedence(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("timeout: 30\ntimeouts: {02_b: 7}\ndefaults: {backend: reference, seed: 0}\n"
                    "notebooks:\n  02_b: {seed: 5, max_new_tokens: 4}\n  03_c:\n")
    ps = runner.load_params(path, ["seed=9", "device=cpu", "flag=true", "temps=[0.1, 1]"])
    assert ps["notebooks"]["03_c"] == {}
    assert runner.params_for("01_a", ps) == {"backend": "reference", "seed": 9, "device": "cpu",
                                             "flag": True, "temps": [0.1, 1]}
    p = runner.params_for("02_b", ps, "/o/metrics/02_b.json")
    assert p["seed"] == 9 and p["max_new_tokens"] == 4 and p["metrics_path"] == "/o/metrics/02_b.json"
    assert runner.timeout_for("02_b", ps, 60) == 7
    assert runner.timeout_for("01_a", ps, 60) == 60
    assert runner.timeout_for("01_a", ps) == 30
    assert runner.timeout_for("01_a", runner.load_params(None)) == runner.DEFAULT_TIMEOUT


@pytest.mark.parametrize("text, match", [
    ("default: {a: 1}\n", "unknown keys"),
    ("defaults: [1, 2]\n", "must be a mapping"),
    ("timeout: -1\n", "positive"),
    ("- 1\n", "top level"),
])
def test_load_params_rejects(tmp_path, text, match):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(runner.UsageError, match=match):
        runner.load_params(path, [])


def test_bad_override():
    with pytest.raises(runner.UsageError, match="key=value"):
        runner.load_params(None, ["seed"])


def test_check_parameters(tmp_path):
    path = tmp_path / "01_x.ipynb"
    nbformat.write(_notebook("pass"), str(path))
    assert runner.check_parameters(path, {"seed": 1, "metrics_path": "m.json"}) == []
    problems = runner.check_parameters(path, {"sed": 1})
    assert len(problems) == 1 and "'sed'" in problems[0] and "seed" in problems[0]
    bare = tmp_path / "02_y.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("seed = 0")]), str(bare))
    assert "no cell tagged 'parameters'" in runner.check_parameters(bare, {"seed": 1})[0]


def test_compare_to_baseline():
    metrics = {"a": 1.05, "b": 3, "c": "x", "d": float("nan"), "e": True}
    ok = {"a": {"value": 1.0, "rtol": 0.1}, "b": {"value": 2, "atol": 1}, "c": {"equals": "x"},
          "e": {"equals": True}}
    assert runner.compare_to_baseline(metrics, ok) == []
    assert runner.compare_to_baseline(metrics, {"a": {"value": 1.0, "rtol": 0.01}}) == [
        "a: got 1.05, baseline 1 ± 0.01"]
    assert runner.compare_to_baseline(metrics, {"a": {"value": 1.0}}) == ["a: got 1.05, baseline 1 ± 0"]
    assert runner.compare_to_baseline(metrics, {"b": {"min": 3, "max": 3}}) == []
    assert runner.compare_to_baseline(metrics, {"b": {"min": 4}}) == ["b: got 3, baseline min 4"]
    assert runner.compare_to_baseline(metrics, {"b": {"max": 2.5}}) == ["b: got 3, baseline max 2.5"]
    assert runner.compare_to_baseline(metrics, {"d": {"min": 0}}) == ["d: got nan, baseline min 0"]
    assert runner.compare_to_baseline(metrics, {"c": {"min": 0}})[0].startswith("c: got 'x', not a number")
    assert runner.compare_to_baseline(metrics, {"e": {"equals": 1}}) == ["e: got True, baseline equals 1"]
    assert runner.compare_to_baseline(metrics, {"z": {"min": 1}}) == ["z: missing from results (baseline min 1)"]
    assert runner.compare_to_baseline(None, {"z": {"equals": 1}}) == ["z: missing from results (baseline equals 1)"]


def test_timing_claims_can_be_not_measurable_but_never_silently():
    spec = {"overhead_pct": {"max": 25.0, "timing": True}}
    why = "repeats spread 180% of their median on this machine"
    loaded = {"overhead_pct": None, "overhead_pct_not_measurable": why}
    assert runner.compare_to_baseline(loaded, spec) == []
    assert runner.not_measurable(loaded, spec) == {"overhead_pct": why}
    assert runner.compare_to_baseline({"overhead_pct": 40.0}, spec) == ["overhead_pct: got 40, baseline max 25"]
    assert runner.compare_to_baseline({"overhead_pct": None}, spec)[0].startswith("overhead_pct: got None")
    # only a baseline marked as timing may be reported so
    assert runner.compare_to_baseline(loaded, {"overhead_pct": {"max": 25.0}})[0].startswith("overhead_pct: got None")


def test_load_baselines_validates(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"01_a": {"m": {"value": 1, "rtoll": 0.1}}}))
    with pytest.raises(runner.UsageError, match="rtoll"):
        runner.load_baselines(path)
    path.write_text(json.dumps({"01_a": {"m": {"rtol": 0.1}}}))
    with pytest.raises(runner.UsageError, match="need a 'value'"):
        runner.load_baselines(path)
    shipped = runner.load_baselines(REPO_ROOT / "ci" / "baselines" / "cpu.json")  # the shipped file validates
    assert all(runner.NOTEBOOK_RE.match(stem) for stem in shipped)


def test_repo_paramset_loads():
    ps = runner.load_params(REPO_ROOT / "ci" / "params" / "cpu.yaml", [])
    assert ps["defaults"] == {"backend": "reference", "device": "cpu"}


def test_failure_from_notebook(tmp_path):
    nb = _notebook("a = 1", "\n\nraise KeyError('k')\n", "b = 2")
    # what papermill leaves behind: injected cells, an error output on the failing cell
    injected = new_code_cell("seed = 3")
    injected.metadata["tags"] = ["injected-parameters"]
    marker = new_markdown_cell("<span>An Exception was encountered</span>")
    marker.metadata["tags"] = ["papermill-error-cell-tag"]
    nb.cells.insert(2, injected)
    nb.cells.insert(0, marker)
    failing = nb.cells[5]
    failing.outputs = [nbformat.v4.new_output("error", ename="KeyError", evalue="'k'", traceback=[])]
    failing.execution_count = 4
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, str(path))
    assert runner.failure_from_notebook(path) == {
        "cell_index": 3, "execution_count": 4, "source": "raise KeyError('k')", "ename": "KeyError",
        "evalue": "'k'"}
    failing.outputs = []
    nb.cells[6].metadata["papermill"] = {"status": "running"}
    nbformat.write(nb, str(path))
    assert runner.failure_from_notebook(path)["cell_index"] == 4
    # kernel crash: papermill marks the dying cell "completed"; the next one never started
    nb.cells[5].metadata["papermill"] = {"status": "completed", "start_time": "2026-01-01T00:00:00"}
    nb.cells[6].metadata["papermill"] = {"status": "completed", "start_time": None}
    nbformat.write(nb, str(path))
    assert runner.failure_from_notebook(path) is None
    assert runner.failure_from_notebook(path, last_started=True)["cell_index"] == 3


def test_format_table():
    results = [
        runner.Result("01_a", "PASS", 1.234),
        runner.Result("02_b", "FAIL", 10.0, failing_cell=3, failing_source="raise X", error="X: y | z"),
        runner.Result("03_c", "REGRESSION", 2.0, regressions=["m: got 1, baseline 2 ± 0", "n: missing"]),
    ]
    text = runner.format_table(results)
    lines = text.splitlines()
    assert lines[0].split() == ["notebook", "status", "duration", "(s)", "failing", "cell", "error"]
    assert "1.2" in lines[2] and "3: raise X" in lines[3] and "X: y | z" in lines[3]
    assert "m: got 1, baseline 2 ± 0 (+1 more)" in lines[4]
    md = runner.format_table(results, markdown=True)
    assert md.startswith("| notebook | status |") and "X: y \\| z" in md
