"""Run every notebook's recipe of one stack as a standalone script, the way a reader who copies it out would.

    python ci/neuron_cells.py tnx                  # every notebook's transformers-neuronx recipe, on both models
    python ci/neuron_cells.py nxdi --notebooks 03  # one notebook's NxD Inference recipe
    python ci/neuron_cells.py nxdi --models production-shaped  # one of the two models

A recipe is a notebook's Neuron cells of the stack joined in order. Every recipe runs on two models, each on the
first, then each on the second (``MODELS``): the embedded
SmolLM2-135M-Instruct, and a small random-weight checkpoint shaped like the production model the cells name,
Llama-3.1-8B-Instruct (``ci/production_model.py``: 4 query heads per KV head, an untied LM head, llama3 RoPE, a
tokenizer without a pad token, a list of EOS ids): a recipe that only works on SmolLM2 fails on the second.
Each recipe (cells tagged ``neuron`` + the stack, see tests/contract/contract_harness.py) is written to
``<out>/<stack>/<model>/<notebook>-<stack>.py`` exactly as its cells stand, plus the ``# EDIT`` values of
``ci/params/neuron-cells.yaml`` assigned right after its ``# EDIT`` block (``model_dir`` is always the model's
checkpoint; the other values are the same for both models). It then runs as its own process from an empty
temporary folder. The stack's library must be
importable (the neuron lanes put its stand-in on PYTHONPATH; on an instance it is the real one). The stand-ins may
reach the reference engine in ``helpers``; the recipe's own code may not: an ``import helpers`` in the script fails
with ModuleNotFoundError, as it would outside this repository. A recipe passes when its script exits 0 without
saying it was skipped. Exit status 1 when any failed; a table names each recipe, the model and its result.

Besides the table, ``<out>/results.json`` records every run of a recipe, one row per recipe and model (notebook,
stack, model, passed, seconds, the commit and time of the run, the library that ran it: the stand-in or the real one,
and transformers' version), written after each recipe; a later run replaces the rows of the recipes and models it
ran and keeps the others (each row carries its own commit and time). ci/build_site.py prints them in the book.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "contract"))
import contract_harness as harness  # noqa: E402

sys.path.insert(0, str(REPO / "ci"))
import run_record  # noqa: E402  (ci/run_record.py: commit, time and versions of this run)

# The models every cell runs on, in this order: the embedded checkpoint, then the production-shaped one.
MODELS = ("embedded", "production-shaped")

# Runs the script as __main__ with `import helpers` refused to the script's own code (its module globals are
# __main__'s); the stand-ins, imported under their own module names, still reach the reference engine.
BOOT = """
import builtins, runpy, sys
_import = builtins.__import__
def _guarded(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and name.split(".")[0] == "helpers" and (globals or {}).get("__name__") == "__main__":
        raise ModuleNotFoundError("No module named 'helpers' (a Neuron cell runs outside this repository)",
                                  name="helpers")
    return _import(name, globals, locals, fromlist, level)
builtins.__import__ = _guarded
path = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(path, run_name="__main__")
"""


def overrides_for(params: dict, stem: str, model_dir: str) -> dict:
    """EDIT overrides for notebook ``stem`` (``NN_name``): ``all``, then the notebook's own (by its number)."""
    unknown = set(params) - {"all"} - {p.stem.split("_")[0] for p in (REPO / "notebooks").glob("*.ipynb")}
    if unknown:
        raise SystemExit(f"neuron-cells params: {sorted(unknown)} name no notebook (use 'all' or a number like '03')")
    return {"model_dir": model_dir, **(params.get("all") or {}), **(params.get(stem.split("_")[0]) or {})}


def cell_scripts(stack: str, notebooks: list[Path], params: dict, model_dir: str) -> list[tuple[str, str]]:
    """(name, script) of every notebook's ``stack`` recipe: its ``stack`` Neuron cells joined in order, in notebook
    order. An override of these notebooks that no # EDIT block sets is refused first (a typo would otherwise change
    nothing)."""
    scripts, used, given = [], {"model_dir"}, set((params.get("all") or {}))
    for path in notebooks:
        nb = nbformat.read(str(path), as_version=4)
        cells = [cell.source for _, cell in harness.neuron_cells(nb, stack)]
        if not cells:
            continue
        overrides = overrides_for(params, path.stem, model_dir)
        given |= set(params.get(path.stem.split("_")[0]) or {})
        mine = {k: v for k, v in overrides.items() if k in harness.edit_names(cells[0])}
        used |= set(mine)
        scripts.append((f"{path.stem}-{stack}", harness.script_for(cells, mine)))
    if given - used:
        raise SystemExit(f"neuron-cells params: {sorted(given - used)} are set by no # EDIT block of these cells")
    return scripts


def run_script(script: Path, timeout: float) -> tuple[bool, str, float]:
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="neuron-cell-") as cwd:
        try:
            proc = subprocess.run([sys.executable, "-c", BOOT, str(script)], cwd=cwd, env=env, text=True,
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            return False, f"timed out after {timeout:.0f} s\n{exc.stdout or ''}{exc.stderr or ''}", timeout
    seconds = time.perf_counter() - start
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        return False, output, seconds
    if "Skipped:" in proc.stdout:
        return False, "the recipe says it skipped: its library did not import\n" + output, seconds
    return True, output, seconds


def checkpoint(name: str) -> str:
    """The checkpoint folder of one of ``MODELS`` (built and cached on first use)."""
    if name == "embedded":
        from helpers.model_store import resolve_model_path  # the runner's own use: the embedded checkpoint's folder

        return str(resolve_model_path(None))
    sys.path.insert(0, str(REPO / "ci"))
    from production_model import production_model_path  # ci/production_model.py (it imports transformers: only here)

    return str(production_model_path())


def library(stack: str) -> dict:
    """What provides the stack's import name here: the stand-in of tests/neuron_sim or the real library, with its
    version (helpers.notebook.provenance, as the notebooks name it), and the transformers version beside it."""
    from helpers.notebook.provenance import STAND_IN_DISTRIBUTION, stack_distribution  # the runner's own use

    dist = stack_distribution(stack)
    return {"library": dist, "library_version": None if dist in (None, STAND_IN_DISTRIBUTION)
            else run_record.version(dist), "stand_in": dist == STAND_IN_DISTRIBUTION,
            "transformers": run_record.version("transformers")}


def write_results(path: Path, rows: list[dict]) -> None:
    """``results.json``: the rows of this run over those of earlier runs (same stack, notebook and model replaced)."""
    try:
        old = json.loads(path.read_text()).get("results", [])
    except (OSError, ValueError):
        old = []
    key = lambda r: (r.get("stack"), r.get("notebook"), r.get("model"))  # noqa: E731
    mine = {key(r) for r in rows}
    merged = [r for r in old if key(r) not in mine] + rows
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"results": merged}, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stack", choices=harness.STACKS)
    ap.add_argument("--notebooks", nargs="*", help="notebook numbers or stems (default: all)")
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                    help="the models to run every cell on, in this order (default: both)")
    ap.add_argument("--params", default=str(REPO / "ci" / "params" / "neuron-cells.yaml"))
    ap.add_argument("--out", default=str(REPO / "out" / "neuron-cells"))
    ap.add_argument("--timeout", type=float, default=600, help="seconds per recipe")
    args = ap.parse_args(argv)

    notebooks = sorted((REPO / "notebooks").glob("*.ipynb"))
    if args.notebooks:
        notebooks = [p for p in notebooks if any(p.stem == n or p.stem.split("_")[0] == n for n in args.notebooks)]
    params = yaml.safe_load(Path(args.params).read_text()) or {}
    results, rows = [], []
    record = {**run_record.git_commit(REPO), **library(args.stack)}
    for model in args.models:
        out = Path(args.out).resolve() / args.stack / model  # absolute: each script runs from its own temporary folder
        out.mkdir(parents=True, exist_ok=True)
        for name, script in cell_scripts(args.stack, notebooks, params, checkpoint(model)):
            path = out / f"{name}.py"
            path.write_text(script)
            ok, output, seconds = run_script(path, args.timeout)
            (out / f"{name}.log").write_text(output)
            results.append((model, name, ok, seconds))
            rows.append({"notebook": name[: -len(args.stack) - 1], "stack": args.stack, "model": model,
                         "passed": ok, "seconds": round(seconds, 2), "finished": run_record.now(), **record,
                         "script": str(path), "log": str(out / f"{name}.log")})
            write_results(Path(args.out).resolve() / "results.json", rows)
            print(f"{'PASS' if ok else 'FAIL'}  {model:<17}  {name}  {seconds:6.1f} s", flush=True)
            if not ok:
                print("    " + "\n    ".join(output.strip().splitlines()[-25:]), flush=True)
    failed = [f"{n} ({m})" for m, n, ok, _ in results if not ok]
    for model in args.models:
        mine = [ok for m, _, ok, _ in results if m == model]
        print(f"{model}: {sum(mine)}/{len(mine)} {args.stack} recipes passed as standalone scripts")
    print(f"{len(results) - len(failed)}/{len(results)} {args.stack} recipe runs passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
