"""Every notebook, headless through the papermill runner, once, on the reference backend.

``ci/params/cpu.yaml``, metrics compared with ``ci/baselines/cpu.json``. A notebook passes only if all
its cells ran, its own assertions against the oracle held and its metrics are within the baselines.
The alternative values (``ci/params/cpu-alt.yaml``: other prompts, batch sizes, amp, feature knobs) run in
the CPU workflow's second step; the neuron backend runs in the neuron lanes (``ci/neuron_sim.sh``).

Outputs (executed notebooks, HTML, logs, metrics, report.json) go to ``$NOTEBOOKS_OUT/<parameter set>`` when
``NOTEBOOKS_OUT`` is set (ci/test.sh sets it to ``out/notebooks``: the CPU workflow uploads that run), else to a
temporary folder.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PARAM_SETS = {"cpu": ("ci/params/cpu.yaml", "ci/baselines/cpu.json")}


@pytest.fixture(scope="module", params=list(PARAM_SETS))
def run(request, tmp_path_factory):
    params, baselines = PARAM_SETS[request.param]
    if os.environ.get("NOTEBOOKS_OUT"):
        out = Path(os.environ["NOTEBOOKS_OUT"]).resolve() / request.param
        shutil.rmtree(out, ignore_errors=True)  # this run's outputs only
    else:
        out = tmp_path_factory.mktemp(f"nb-{request.param}")
    cmd = [sys.executable, str(ROOT / "ci/run_notebooks.py"), "--params", str(ROOT / params), "--out", str(out)]
    if baselines:
        cmd += ["--baselines", str(ROOT / baselines)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    report = json.loads((out / "report.json").read_text())
    return request.param, report, out


@pytest.mark.notebook
@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_notebook_passes(run, stem):
    name, report, out = run
    result = report["notebooks"][stem]
    assert result["status"] == "PASS", f"[{name}] {stem}: {json.dumps(result, indent=1)[:3000]}"
    metrics = json.loads((out / "metrics" / f"{stem}.json").read_text())
    assert metrics, f"{stem} wrote no metrics"
    assert (out / "html" / f"{stem}.html").is_file()
