"""Extract the public signatures the stand-ins transcribe from the pinned Neuron sources, or compare them.

    python tests/neuron_sim/signatures/extract.py tnx  /path/to/transformers-neuronx.git   # writes tnx.json
    python tests/neuron_sim/signatures/extract.py nxdi /path/to/neuronx-distributed-inference.git

Each ``<stack>.targets`` line names a callable in the pinned repository and its stand-in:
``src/pkg/file.py::Class.method = pkg.module:Class.method``. Both sides are read with ``ast`` (nothing is
imported), as (name, kind, default source text) per parameter; ``<stack>.json`` keeps the pinned side with
the commit it came from, and tests/contract/test_stand_in_signatures.py compares the stand-ins with it.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PINNED = {  # stack: (repository, release, commit)
    "tnx": ("aws-neuron/transformers-neuronx", "v0.13.0", "f4e3818695aec05c194d448c3a8e4fcbc412caa1"),
    "nxdi": ("aws-neuron/neuronx-distributed-inference", "0.8 (Neuron SDK 2.28.0)",
             "cd3abf30558fe1a14dadfb1397c2118e3fcfcc11"),
}


def targets(stack: str) -> list[tuple[str, str, str, str]]:
    """(pinned file, pinned qualname, stand-in module, stand-in qualname) per line of <stack>.targets."""
    out = []
    for line in (HERE / f"{stack}.targets").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        left, right = (side.strip() for side in line.split("="))
        path, qual = left.split("::")
        module, squal = right.split(":")
        out.append((path, qual, module, squal))
    return out


def find_def(tree: ast.AST, qualname: str):
    node = tree
    for part in qualname.split("."):
        found = [n for n in getattr(node, "body", [])
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part]
        if not found:
            raise LookupError(qualname)
        node = found[-1]  # the last definition wins, as at import time
    if isinstance(node, ast.ClassDef):  # a class: its __init__
        return find_def(node, "__init__")
    return node


def parameters(fn) -> list[list]:
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    rows = [[p.arg, "positional_only" if i < len(a.posonlyargs) else "positional_or_keyword", d]
            for i, (p, d) in enumerate(zip(positional, defaults))]
    if a.vararg:
        rows.append([a.vararg.arg, "var_positional", None])
    rows += [[p.arg, "keyword_only", None if d is None else ast.unparse(d)] for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        rows.append([a.kwarg.arg, "var_keyword", None])
    return rows


def stand_in_parameters(module: str, qualname: str) -> list[list]:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise LookupError(f"stand-in module {module} not found (is tests/neuron_sim on sys.path?)")
    return parameters(find_def(ast.parse(Path(spec.origin).read_text()), qualname))


def extract(stack: str, git_dir: str) -> dict:
    repo, release, commit = PINNED[stack]
    entries = {}
    for path, qual, module, squal in targets(stack):
        source = subprocess.run(["git", "-C", git_dir, "show", f"{commit}:{path}"], check=True,
                                capture_output=True, text=True).stdout
        entries[f"{path}::{qual}"] = {"stand_in": f"{module}:{squal}", "params": parameters(find_def(ast.parse(source), qual))}
    return {"repository": repo, "release": release, "commit": commit, "entries": entries}


if __name__ == "__main__":
    stack, git_dir = sys.argv[1], sys.argv[2]
    (HERE / f"{stack}.json").write_text(json.dumps(extract(stack, git_dir), indent=1) + "\n")
    print(f"wrote {HERE / f'{stack}.json'}")
