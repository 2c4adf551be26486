#!/usr/bin/env python
"""Papermill regression runner for the tutorial notebooks.

Runs each ``notebooks/NN_name.ipynb`` in its own ``python -m papermill`` child
process (so a crash or hang in one notebook cannot take the runner down), with a
parameter set from a YAML file, a per-notebook timeout, HTML renderings of the
executed notebooks, metrics collection and a comparison against baselines.

Usage::

    python ci/run_notebooks.py --params ci/params/cpu.yaml
    python ci/run_notebooks.py --params ci/params/cpu.yaml --notebooks 03 04_stopping_criteria \\
        --baselines ci/baselines/cpu.json --out out/ --set max_new_tokens=8

Parameter set (YAML)::

    timeout: 900                 # optional, seconds per notebook
    timeouts: {03_streaming: 1800}  # optional per-notebook timeouts
    defaults: {backend: reference, device: cpu}   # passed to every notebook
    notebooks:                   # per-notebook overrides, keyed by stem
      03_streaming: {max_new_tokens: 16}

Precedence, lowest first: ``defaults`` < ``notebooks.<stem>`` < ``--set`` <
``metrics_path`` (always set by the runner to ``<out>/metrics/<stem>.json``).
Timeout: ``timeouts.<stem>`` > ``--timeout`` > ``timeout`` > 900 s.
Every parameter passed must exist in the notebook's ``parameters`` cell.

Baselines (JSON), per notebook stem and metric, any combination of::

    {"value": x, "rtol": r, "atol": a}   # |got - x| <= atol + rtol * |x| (tolerances default 0)
    {"min": lo}  {"max": hi}             # lo <= got <= hi
    {"equals": v}                        # got == v (any JSON value)

Outputs under ``--out``: ``executed/<stem>.ipynb``, ``html/<stem>.html``,
``logs/<stem>.log`` (papermill's output), ``metrics/<stem>.json``,
``metrics.json`` ({stem: {metric: value}}) and ``report.json``.

Exit status: 0 when every notebook passed, 1 when any failed, timed out or
regressed, 2 on a usage error (unknown notebook, bad parameter file, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "ci"))
import run_record  # noqa: E402  (ci/run_record.py: the commit, machine and versions of this run)
DEFAULT_NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
DEFAULT_TIMEOUT = 900.0
NOTEBOOK_RE = re.compile(r"^(\d{2})_\w+$")
PARAMSET_KEYS = {"defaults", "notebooks", "timeout", "timeouts"}
BASELINE_KEYS = {"value", "rtol", "atol", "min", "max", "equals", "timing"}
# A baseline with "timing": true is a timing claim: the notebook may write None for it together with
# "<metric>_not_measurable": "<why>" (its repeats spread too far on this machine, helpers.notebook.figures); the run
# then reports the claim as not measurable here instead of failing it. A timing None without a reason still fails.
# Cells papermill inserts into the executed notebook (not in the source notebook).
INJECTED_TAGS = {"injected-parameters", "papermill-error-cell-tag"}
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

PASS, FAIL, TIMEOUT, REGRESSION = "PASS", "FAIL", "TIMEOUT", "REGRESSION"


class UsageError(Exception):
    """Bad command line or configuration: reported as exit status 2."""


@dataclasses.dataclass
class Result:
    notebook: str
    status: str = PASS
    duration: float = 0.0
    timeout: float = DEFAULT_TIMEOUT
    failing_cell: int | None = None  # index in the source notebook (0-based, all cells)
    failing_source: str = ""  # first non-blank line of that cell
    error: str = ""  # one line: "ename: evalue" or a runner message
    regressions: list[str] = dataclasses.field(default_factory=list)
    not_measurable: list[str] = dataclasses.field(default_factory=list)  # timing claims this machine could not test
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    executed: str | None = None
    html: str | None = None
    log: str | None = None


# --------------------------------------------------------------------------- notebooks


def discover_notebooks(notebooks_dir: Path) -> dict[str, Path]:
    """``{stem: path}`` for every ``NN_name.ipynb`` in ``notebooks_dir``, sorted by name."""
    found = {}
    for path in sorted(Path(notebooks_dir).glob("*.ipynb")):
        if NOTEBOOK_RE.match(path.stem):
            found[path.stem] = path
    return found


def select_notebooks(available: dict[str, Path], names: list[str] | None) -> list[str]:
    """Resolve ``names`` (stem, ``NN`` prefix, file name or path) to stems; None = all."""
    if not names:
        return list(available)
    selected = []
    for name in names:
        key = Path(name).name
        key = key[: -len(".ipynb")] if key.endswith(".ipynb") else key
        if key in available:
            matches = [key]
        else:
            matches = [s for s in available if s.split("_", 1)[0] == key]
        if len(matches) != 1:
            listing = ", ".join(available) or "(none)"
            problem = "is ambiguous" if matches else "not found"
            raise UsageError(f"notebook {name!r} {problem}; available: {listing}")
        if matches[0] not in selected:
            selected.append(matches[0])
    return selected


# --------------------------------------------------------------------------- parameters


def parse_override(text: str) -> tuple[str, Any]:
    """``"key=value"`` -> ``(key, yaml.safe_load(value))``."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise UsageError(f"--set expects key=value with a Python identifier as key, got {text!r}")
    try:
        return key, yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise UsageError(f"--set {key}: value is not valid YAML: {exc}") from None


def load_params(path, overrides: list[str] | dict | None = None) -> dict:
    """Load and validate a parameter set; ``overrides`` (``--set`` items) go under ``overrides``.

    ``path`` may be a list of parameter sets: each later file overlays the earlier ones (``defaults``,
    ``timeouts`` and each notebook's parameters key by key; ``timeout`` when it sets one)."""
    if isinstance(path, (list, tuple)):
        merged = load_params(None, overrides)
        for one in path:
            layer = load_params(one)
            merged["defaults"].update(layer["defaults"])
            merged["timeouts"].update(layer["timeouts"])
            for stem, values in layer["notebooks"].items():
                merged["notebooks"].setdefault(stem, {}).update(values)
            if layer["timeout"] is not None:
                merged["timeout"] = layer["timeout"]
        return merged
    data: dict = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"cannot read parameter set {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: top level must be a mapping")
    unknown = set(data) - PARAMSET_KEYS
    if unknown:
        raise UsageError(f"{path}: unknown keys {sorted(unknown)}; allowed: {sorted(PARAMSET_KEYS)}")

    def mapping(value, what):
        value = {} if value is None else value
        if not isinstance(value, dict):
            raise UsageError(f"{path}: {what} must be a mapping, got {type(value).__name__}")
        return {str(k): v for k, v in value.items()}

    notebooks = {stem: mapping(v, f"notebooks.{stem}") for stem, v in mapping(data.get("notebooks"), "notebooks").items()}
    timeouts = mapping(data.get("timeouts"), "timeouts")
    for stem, value in [("timeout", data.get("timeout")), *((f"timeouts.{k}", v) for k, v in timeouts.items())]:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise UsageError(f"{path}: {stem} must be a positive number of seconds, got {value!r}")
    if isinstance(overrides, dict):
        over = dict(overrides)
    else:
        over = dict(parse_override(item) for item in overrides or [])
    return {
        "defaults": mapping(data.get("defaults"), "defaults"),
        "notebooks": notebooks,
        "timeout": data.get("timeout"),
        "timeouts": timeouts,
        "overrides": over,
    }


def params_for(stem: str, paramset: dict, metrics_path: str | Path | None = None) -> dict:
    """Parameters for one notebook: defaults < per-notebook < overrides < metrics_path."""
    params = dict(paramset.get("defaults") or {})
    params.update((paramset.get("notebooks") or {}).get(stem) or {})
    params.update(paramset.get("overrides") or {})
    if metrics_path is not None:
        params["metrics_path"] = str(metrics_path)
    return params


def timeout_for(stem: str, paramset: dict, cli_timeout: float | None = None) -> float:
    """``timeouts.<stem>`` > ``--timeout`` > ``timeout`` > DEFAULT_TIMEOUT."""
    per_nb = (paramset.get("timeouts") or {}).get(stem)
    for value in (per_nb, cli_timeout, paramset.get("timeout")):
        if value is not None:
            return float(value)
    return DEFAULT_TIMEOUT


def check_parameters(nb_path: str | Path, params: dict) -> list[str]:
    """Problems with ``params`` for this notebook (empty list = fine).

    papermill silently injects parameters the notebook does not declare, so a
    typo would go unnoticed; this catches it before running anything.
    """
    import papermill

    try:
        declared = papermill.inspect_notebook(str(nb_path))
    except Exception as exc:  # noqa: BLE001 - report any parse problem as a failure
        return [f"cannot inspect parameters: {type(exc).__name__}: {one_line(str(exc))}"]
    unknown = [name for name in params if name not in declared]
    if not unknown:
        return []
    if not declared:
        known = "none: the notebook has no cell tagged 'parameters'"
    else:
        known = ", ".join(declared)
    return [f"unknown parameter {name!r} (known: {known})" for name in unknown]


# --------------------------------------------------------------------------- execution


def one_line(text: str, limit: int = 200) -> str:
    """First non-blank line of ``text`` without ANSI colours, truncated to ``limit``."""
    text = ANSI_RE.sub("", text or "")
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _descendants(pid: int) -> list[int]:
    """All descendant pids of ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill the papermill child, its process group and its kernel (own session)."""
    victims = _descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in victims:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue


def papermill_command(nb_path: Path, executed: Path, params_file: Path, kernel: str,
                      progress: bool, cwd: Path) -> list[str]:
    return [
        sys.executable, "-m", "papermill", str(nb_path), str(executed),
        "-f", str(params_file), "-k", kernel, "--cwd", str(cwd), "--log-output",
        "--progress-bar" if progress else "--no-progress-bar",
    ]


def child_env() -> dict[str, str]:
    """Environment for the papermill child: repo root importable (``import helpers``)."""
    env = dict(os.environ)
    path = [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugpy warning
    return env


def run_one(nb_path: str | Path, params: dict, out: str | Path, timeout: float,
            kernel: str = "python3", stream: bool = False) -> Result:
    """Check parameters, execute one notebook with papermill in a child process, render HTML."""
    nb_path, out = Path(nb_path), Path(out)
    stem = nb_path.stem
    result = Result(notebook=stem, timeout=timeout, parameters=dict(params))
    executed = out / "executed" / f"{stem}.ipynb"
    html_path = out / "html" / f"{stem}.html"
    log_path = out / "logs" / f"{stem}.log"
    params_file = out / "params" / f"{stem}.yaml"
    for path in (executed, html_path, log_path, params_file):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
    if params.get("metrics_path"):
        Path(params["metrics_path"]).parent.mkdir(parents=True, exist_ok=True)
        Path(params["metrics_path"]).unlink(missing_ok=True)  # no stale metrics

    problems = check_parameters(nb_path, params)
    if problems:
        result.status, result.error = FAIL, "; ".join(problems)
        result.html = str(write_error_html(html_path, stem, problems))
        return result

    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    cmd = papermill_command(nb_path, executed, params_file, kernel, stream, nb_path.parent)
    start = time.monotonic()
    with open(log_path, "w") as log:
        sink = None if stream else log
        proc = subprocess.Popen(cmd, cwd=nb_path.parent, env=child_env(), stdin=subprocess.DEVNULL,
                                stdout=sink, stderr=subprocess.STDOUT if sink else None,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            rc = None
        except BaseException:  # Ctrl-C: do not leave a kernel behind
            _kill_tree(proc)
            raise
    result.duration = time.monotonic() - start
    result.log = str(log_path)

    failure = failure_from_notebook(executed, last_started=rc != 0) if executed.exists() else None
    if failure:
        result.failing_cell, result.failing_source = failure["cell_index"], failure["source"]
    if rc is None:
        result.status = TIMEOUT
        result.error = f"timed out after {timeout:g} s"
    elif rc != 0:
        result.status = FAIL
        if failure and failure.get("ename"):
            result.error = f"{failure['ename']}: {one_line(failure['evalue'])}".rstrip(": ")
        else:
            result.error = last_error_line(log_path) or f"papermill exited with status {rc}"
    if executed.exists():
        result.executed = str(executed)
        result.html = str(render_html(executed, html_path))
    else:
        result.html = str(write_error_html(html_path, stem, [result.error or "no executed notebook"]))
    return result


def last_error_line(log_path: Path) -> str:
    """The last line of the log that looks like an exception (for crashes without an error cell)."""
    try:
        lines = [ANSI_RE.sub("", ln).strip() for ln in log_path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", line):
            return one_line(line)
    return one_line(lines[-1]) if lines else ""


def failure_from_notebook(executed_path: str | Path, last_started: bool = False) -> dict | None:
    """Locate the failing (or, after a timeout, still running) cell of an executed notebook.

    Returns ``{"cell_index", "execution_count", "source", "ename", "evalue"}`` or None.
    ``cell_index`` counts the cells of the *source* notebook (papermill's injected
    cells are skipped); ``source`` is the cell's first non-blank line.
    With ``last_started`` (the run is known to have failed), fall back to the last
    cell papermill started: after a kernel crash papermill marks it "completed"
    and leaves no error output.
    """
    import nbformat

    nb = nbformat.read(str(executed_path), as_version=4)
    running = started = None
    index = -1
    for cell in nb.cells:
        if INJECTED_TAGS & set(cell.get("metadata", {}).get("tags", [])):
            continue
        index += 1
        if cell.cell_type != "code":
            continue
        info = {"cell_index": index, "execution_count": cell.get("execution_count"),
                "source": one_line(cell.source, 120), "ename": "", "evalue": ""}
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                info.update(ename=output.get("ename", ""), evalue=output.get("evalue", ""))
                return info
        pm = cell.get("metadata", {}).get("papermill", {})
        if running is None and pm.get("status") == "running":
            running = info
        if pm.get("start_time"):
            started = info
    return running or (started if last_started else None)


# --------------------------------------------------------------------------- rendering


def render_html(executed: Path, html_path: Path) -> Path:
    """Render an executed notebook to HTML (errors included); never raises."""
    try:
        import nbconvert
        import nbformat

        nb = nbformat.read(str(executed), as_version=4)
        body, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
        html_path.write_text(body, encoding="utf-8")
    except Exception as exc:  # noqa: BLE001 - a rendering problem must not hide the run result
        write_error_html(html_path, executed.stem, [f"HTML rendering failed: {type(exc).__name__}: {exc}"])
    return html_path


def write_error_html(html_path: Path, title: str, messages: list[str]) -> Path:
    html_path.parent.mkdir(parents=True, exist_ok=True)
    items = "\n".join(f"<li><pre>{html.escape(m)}</pre></li>" for m in messages)
    html_path.write_text(f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}"
                         f"</title></head><body><h1>{html.escape(title)}: not executed</h1>\n<ul>\n{items}\n"
                         "</ul></body></html>\n", encoding="utf-8")
    return html_path


# --------------------------------------------------------------------------- metrics


def load_baselines(path: str | Path | None) -> dict:
    """Read and validate a baselines file (``{}`` when path is None)."""
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read baselines {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: top level must be an object {{stem: {{metric: spec}}}}")
    for stem, metrics in data.items():
        if not isinstance(metrics, dict):
            raise UsageError(f"{path}: {stem} must map metric names to specs")
        for metric, spec in metrics.items():
            if not isinstance(spec, dict) or not spec:
                raise UsageError(f"{path}: {stem}.{metric} must be an object like {{\"value\": 1.0, \"rtol\": 0.1}}")
            unknown = set(spec) - BASELINE_KEYS
            if unknown:
                raise UsageError(f"{path}: {stem}.{metric}: unknown keys {sorted(unknown)}; "
                                 f"allowed: {sorted(BASELINE_KEYS)}")
            if ("rtol" in spec or "atol" in spec) and "value" not in spec:
                raise UsageError(f"{path}: {stem}.{metric}: rtol/atol need a 'value'")
    return data


def load_metrics(path: Path) -> tuple[dict | None, str]:
    """``(metrics, problem)`` from a notebook's metrics file."""
    if not path.exists():
        return None, f"metrics file not written: {path}"
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        return None, f"metrics file {path} is not valid JSON: {exc}"
    if not isinstance(data, dict):
        return None, f"metrics file {path} must hold a JSON object"
    return data, ""


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def compare_to_baseline(metrics: dict | None, baselines: dict) -> list[str]:
    """Regressions of one notebook's ``metrics`` against its ``{metric: spec}`` baselines."""
    metrics = metrics or {}
    problems = []
    skip = set(not_measurable(metrics, baselines))
    for name, spec in baselines.items():
        if name not in metrics:
            problems.append(f"{name}: missing from results (baseline {_describe(spec)})")
            continue
        if name in skip:
            continue
        got = metrics[name]
        numeric = [k for k in ("value", "min", "max") if k in spec]
        if numeric and not _is_number(got):
            problems.append(f"{name}: got {got!r}, not a number (baseline {_describe(spec)})")
            continue
        if "value" in spec:
            want = spec["value"]
            tol = float(spec.get("atol", 0.0)) + float(spec.get("rtol", 0.0)) * abs(want)
            if not abs(got - want) <= tol:  # also catches NaN
                problems.append(f"{name}: got {got:g}, baseline {want:g} ± {tol:g}")
        if "min" in spec and not got >= spec["min"]:
            problems.append(f"{name}: got {got:g}, baseline min {spec['min']:g}")
        if "max" in spec and not got <= spec["max"]:
            problems.append(f"{name}: got {got:g}, baseline max {spec['max']:g}")
        if "equals" in spec and not _equal(got, spec["equals"]):
            problems.append(f"{name}: got {got!r}, baseline equals {spec['equals']!r}")
    return problems


def not_measurable(metrics: dict | None, baselines: dict) -> dict[str, str]:
    """``{metric: why}`` for the timing baselines (``"timing": true``) the notebook reported as not measurable here:
    the metric None and ``<metric>_not_measurable`` a non-empty reason."""
    metrics = metrics or {}
    return {name: str(metrics[f"{name}_not_measurable"]) for name, spec in baselines.items()
            if spec.get("timing") and name in metrics and metrics[name] is None
            and metrics.get(f"{name}_not_measurable")}


def _equal(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b):
        return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b  # no True == 1


def _describe(spec: dict) -> str:
    parts = []
    if "value" in spec:
        tol = float(spec.get("atol", 0.0)) + float(spec.get("rtol", 0.0)) * abs(spec["value"])
        parts.append(f"{spec['value']:g} ± {tol:g}")
    if "min" in spec:
        parts.append(f"min {spec['min']:g}")
    if "max" in spec:
        parts.append(f"max {spec['max']:g}")
    if "equals" in spec:
        parts.append(f"equals {spec['equals']!r}")
    return ", ".join(parts)


# --------------------------------------------------------------------------- report


def _cell_text(r: Result) -> str:
    if r.failing_cell is None:
        return ""
    return f"{r.failing_cell}: {r.failing_source}" if r.failing_source else str(r.failing_cell)


def _error_text(r: Result) -> str:
    if r.status == REGRESSION and not r.error:
        more = f" (+{len(r.regressions) - 1} more)" if len(r.regressions) > 1 else ""
        return r.regressions[0] + more
    return r.error


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(results: list[Result], markdown: bool = False) -> str:
    """A table: notebook, status, duration (s), failing cell, error."""
    header = ["notebook", "status", "duration (s)", "failing cell", "error"]
    rows = [[r.notebook, r.status, f"{r.duration:.1f}", _clip(_cell_text(r), 60), _clip(_error_text(r), 120)]
            for r in results]
    if markdown:
        esc = [[c.replace("|", "\\|") for c in row] for row in rows]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in esc]) + "\n"
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def fmt(row):
        cells = [c.rjust(w) if i == 2 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *map(fmt, rows)]) + "\n"


def write_report(out: Path, results: list[Result], metrics: dict, environment: dict | None = None) -> None:
    """``metrics.json`` and ``report.json``; ``environment`` (ci/run_record.py: commit, CPU, Python, torch,
    transformers, start and finish of the run) goes into the report as it is."""
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    report = {
        "ok": all(r.status == PASS for r in results),
        "environment": environment or {},
        "notebooks": {r.notebook: dataclasses.asdict(r) for r in results},
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Execute the tutorial notebooks with papermill and check their metrics.",
        epilog="Exit status: 0 all passed, 1 a notebook failed/timed out/regressed, 2 usage error.")
    p.add_argument("--params", action="append", metavar="YAML",
                   help="parameter set YAML (defaults / notebooks / timeout / timeouts); repeatable: a later "
                        "file overlays the earlier ones")
    p.add_argument("--notebooks", nargs="+", metavar="NB",
                   help="notebooks to run, by stem (03_streaming) or NN prefix (03); default: all")
    p.add_argument("--notebooks-dir", default=str(DEFAULT_NOTEBOOKS_DIR),
                   help="folder holding NN_name.ipynb notebooks (default: %(default)s)")
    p.add_argument("--out", default="out", help="output folder (default: %(default)s)")
    p.add_argument("--timeout", type=float, help=f"seconds per notebook (default: the parameter set's "
                   f"'timeout', else {DEFAULT_TIMEOUT:g}); per-notebook 'timeouts' still win")
    p.add_argument("--baselines", help="baselines JSON {stem: {metric: spec}}")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a parameter for every notebook (value parsed as YAML); repeatable")
    p.add_argument("--kernel", default="python3", help="Jupyter kernel name (default: %(default)s)")
    p.add_argument("--stream", action="store_true",
                   help="show papermill's progress bar and cell output live instead of logging to <out>/logs")
    p.add_argument("--list", action="store_true", help="list the notebooks found and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    nb_dir = Path(args.notebooks_dir).resolve()
    available = discover_notebooks(nb_dir)
    if args.list:
        print("\n".join(available))
        return 0
    if not available:
        raise UsageError(f"no NN_name.ipynb notebooks in {nb_dir}")
    selected = select_notebooks(available, args.notebooks)
    paramset = load_params(args.params, args.overrides)
    stray = [stem for stem in [*paramset["notebooks"], *paramset["timeouts"]] if stem not in available]
    if stray:
        raise UsageError(f"{args.params}: entries for unknown notebooks {stray}; available: {', '.join(available)}")
    baselines = load_baselines(args.baselines)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    results, all_metrics = [], {}
    environment = {**run_record.environment(REPO_ROOT), "started": run_record.now()}
    bar = tqdm(selected, desc="notebooks", unit="nb", disable=args.stream or None, file=sys.stderr)
    for i, stem in enumerate(bar, 1):
        metrics_path = out / "metrics" / f"{stem}.json"
        params = params_for(stem, paramset, metrics_path)
        timeout = timeout_for(stem, paramset, args.timeout)
        bar.set_postfix_str(stem)
        tqdm.write(f"[{i}/{len(selected)}] {stem}: starting (timeout {timeout:g} s)", file=sys.stderr)
        result = run_one(available[stem], params, out, timeout, kernel=args.kernel, stream=args.stream)
        metrics, problem = load_metrics(metrics_path)
        if metrics is not None:
            all_metrics[stem] = metrics
        if result.status == PASS and stem in baselines:
            result.regressions = compare_to_baseline(metrics, baselines[stem])
            result.not_measurable = [f"{k}: {v}" for k, v in not_measurable(metrics, baselines[stem]).items()]
            if result.regressions and problem:
                result.error = problem
            if result.regressions:
                result.status = REGRESSION
        tqdm.write(f"[{i}/{len(selected)}] {stem}: {result.status} in {result.duration:.1f} s"
                   + (f" - {_error_text(result)}" if result.status != PASS else ""), file=sys.stderr)
        results.append(result)
    bar.close()

    write_report(out, results, all_metrics, {**environment, "finished": run_record.now()})
    print()
    print(format_table(results), end="")
    for r in results:
        for message in r.regressions:
            print(f"REGRESSION {r.notebook}: {message}")
        for message in r.not_measurable:
            print(f"NOT MEASURABLE HERE {r.notebook}: {message}")
    print(f"\nexecuted notebooks: {out / 'executed'}\nHTML: {out / 'html'}\nreport: {out / 'report.json'}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as fh:
            fh.write("### Notebook regression run\n\n" + format_table(results, markdown=True) + "\n")
    passed = sum(r.status == PASS for r in results)
    print(f"{passed}/{len(results)} PASS")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
