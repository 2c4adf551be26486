"""Run a notebook's Neuron cells against the stand-in Neuron packages (the contract test's engine).

Convention for notebook authors (the contract test and ``tests/test_neuron_cells.py`` rely on it):

1. A Neuron cell is a code cell tagged ``neuron`` plus exactly one of ``tnx`` / ``nxdi``. At its top level
   it has imports (``import helpers``) and one ``if helpers.run_neuron_cell("<that tag>"):`` guard; all of
   its work is inside the guard (the guard follows the backend the notebook's set-up cell resolved).
2. It stands alone: it reads no name that an earlier cell defines. Inside the guard come its own imports,
   then one ``# EDIT`` block with the few values a user edits (model dir, tp_degree, batch_size,
   n_positions, amp, buckets, prompts, ...) as literals, then the guide's calls, then a printed result.
   A later (non-Neuron) cell may read the Neuron cell's variables, never the other way round.
3. For each Neuron cell of a stack the harness takes a fresh namespace, calls
   ``helpers.resolve_backend("neuron", stack)`` (what the notebook's set-up cell does) and executes the
   cell alone, in notebook order: no parameters cell, no earlier cell, no overrides; the cell runs on its
   own ``# EDIT`` literals. Files a cell writes (compiled artifacts) are still there for the next one.
   A ``NameError`` fails with the cell's index and the name it took from an earlier cell.
4. Cells must be plain Python (no ``%`` / ``!`` magics).

The stand-ins (``tests/neuron_sim``) are importable only inside :func:`stand_ins`; they raise
``ContractError`` on keywords the pinned releases do not take (including the ones the real
libraries would swallow) and on wrong call order. This is evidence that the code matches the pinned
APIs, not that it runs on hardware.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import io
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

STUBS = Path(__file__).resolve().parents[1] / "neuron_sim"
STUB_MODULES = ("transformers_neuronx", "neuronx_distributed_inference", "_neuron_contract")
STACKS = ("tnx", "nxdi")


def _is_stub_module(name: str) -> bool:
    return name.split(".", 1)[0] in STUB_MODULES


@contextlib.contextmanager
def stand_ins(compiled_dir: str | os.PathLike | None = None):
    """Make the stand-in Neuron packages importable; restore sys.path, sys.modules and os.environ after."""
    saved_path, saved_env = list(sys.path), dict(os.environ)
    for name in [n for n in sys.modules if _is_stub_module(n)]:
        del sys.modules[name]
    sys.path.insert(0, str(STUBS))
    if compiled_dir is not None:
        os.environ["HELPERS_NEURON_COMPILED_DIR"] = str(compiled_dir)
    os.environ.setdefault("MPLBACKEND", "Agg")
    import _neuron_contract

    _neuron_contract.reset()
    try:
        yield _neuron_contract
    finally:
        sys.path[:] = saved_path
        for name in [n for n in sys.modules if _is_stub_module(n)]:
            del sys.modules[name]
        os.environ.clear()
        os.environ.update(saved_env)


def tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def neuron_stacks(nb) -> list[str]:
    """The stacks a notebook has Neuron cells for, in STACKS order."""
    found = {t for c in nb.cells if c.cell_type == "code" and "neuron" in tags(c) for t in tags(c) & set(STACKS)}
    return [s for s in STACKS if s in found]


def _bound_names(tree: ast.AST) -> set[str]:
    """Names a cell binds anywhere (assignments, imports, defs, arguments, for/with/comprehension targets)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _loaded_names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def free_names(source: str) -> set[str]:
    """Names a cell reads without binding them itself (builtins aside): what it would take from earlier cells."""
    tree = ast.parse(source)
    return _loaded_names(tree) - _bound_names(tree) - set(dir(builtins))


EDIT_RE = re.compile(r"^\s*# EDIT\b")


def neuron_cells(nb, stack: str | None = None) -> list[tuple[int, object]]:
    """(index, cell) of the notebook's Neuron cells, of one stack or all."""
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and "neuron" in tags(c)
            and (stack is None or stack in tags(c))]


def _guard_stack(node: ast.stmt) -> str | None:
    """``stack`` when ``node`` is ``if helpers.run_neuron_cell("<stack>"):`` (no else), else None."""
    if not isinstance(node, ast.If) or node.orelse:
        return None
    call = node.test
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "run_neuron_cell"
            and isinstance(call.func.value, ast.Name) and call.func.value.id == "helpers" and not call.keywords
            and len(call.args) == 1 and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
        return call.args[0].value
    return None


def shape_problems(source: str, stack: str) -> list[str]:
    """How a Neuron cell of ``stack`` departs from rules 1-2 of the convention (free names aside)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"does not parse: {exc}"]
    problems = []
    guards = [n for n in tree.body if _guard_stack(n) is not None]
    others = [n for n in tree.body if _guard_stack(n) is None and not isinstance(n, (ast.Import, ast.ImportFrom))]
    if len(guards) != 1 or _guard_stack(guards[0]) != stack:
        found = [_guard_stack(g) for g in guards]
        problems.append(f"needs one top-level `if helpers.run_neuron_cell({stack!r}):` (no else), found guards {found}")
    if others:
        problems.append("only imports may stand outside the guard; lines "
                        + ", ".join(str(n.lineno) for n in others) + " do too")
    edits = [n for n, line in enumerate(source.splitlines(), 1) if EDIT_RE.match(line)]
    if len(edits) != 1:
        problems.append(f"needs exactly one `# EDIT` line, found {len(edits)} (lines {edits})")
    elif len(guards) == 1:
        guard, line = guards[0], edits[0]
        if not guard.lineno < line <= guard.end_lineno:
            problems.append(f"the `# EDIT` line (line {line}) must be inside the guarded body")
        elif any(not isinstance(n, (ast.Import, ast.ImportFrom)) for n in guard.body if n.lineno < line):
            problems.append(f"only imports may come before the `# EDIT` block (line {line}) in the guarded body")
    return problems


@dataclass
class Step:
    index: int
    role: str
    source: str


@dataclass
class ContractRun:
    notebook: str
    stack: str
    steps: list[Step] = field(default_factory=list)
    stdout: str = ""
    namespaces: dict[int, dict] = field(default_factory=dict)  # cell index -> the namespace it ran in


class HarnessError(AssertionError):
    pass


def _check_plain_python(source: str, where: str) -> None:
    for line in source.splitlines():
        if line.lstrip().startswith(("%", "!")):
            raise HarnessError(f"{where}: IPython magic {line.strip()!r}: Neuron cells must be plain Python")


def run_neuron_cells(nb_path: str | os.PathLike, stack: str, edit=None) -> ContractRun:
    """Execute each of the notebook's ``stack`` Neuron cells alone, as in rule 3 of the module docstring.

    Call inside :func:`stand_ins`. ``edit(index, source) -> source`` may rewrite cells (meta-tests).
    """
    import helpers
    from helpers.notebook import backend as helpers_backend

    nb = nbformat.read(str(nb_path), as_version=4)
    stem = Path(nb_path).stem
    cells = neuron_cells(nb, stack)
    if not cells:
        raise HarnessError(f"{stem}: no Neuron cell tagged {stack!r}")
    run = ContractRun(stem, stack)
    saved_choice = helpers_backend._chosen  # the process's chosen backend, restored after the run
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            for i, cell in cells:
                source = edit(i, cell.source) if edit else cell.source
                where = f"{stem} cell {i} ({stack})"
                _check_plain_python(source, where)
                run.steps.append(Step(i, f"neuron/{stack}", source))
                ns: dict = {"__name__": "__main__"}
                run.namespaces[i] = ns
                helpers.resolve_backend("neuron", stack)  # the notebook's set-up cell with backend="neuron"
                try:
                    exec(compile(source, f"<{where}>", "exec"), ns)
                except NameError as exc:
                    if exc.name not in free_names(source):  # raised deeper down, not by the cell's own name
                        exc.add_note(f"[contract harness] in {where}, run alone in a fresh namespace")
                        raise
                    raise HarnessError(
                        f"{where}: name {exc.name!r} is not defined: the cell uses a name from an earlier cell. "
                        "Neuron cells must stand alone (their own imports and an `# EDIT` block of literals); "
                        "see the convention in tests/contract/contract_harness.py") from exc
                except Exception as exc:
                    exc.add_note(f"[contract harness] in {where}, run alone in a fresh namespace")
                    raise
    finally:
        run.stdout = buf.getvalue()
        helpers_backend._chosen = saved_choice
    return run
