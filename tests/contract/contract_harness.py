"""Run a notebook's Neuron cells against the stand-in Neuron packages (the contract test's engine).

Convention for notebook authors (the contract test relies on it):

1. A Neuron cell is a code cell tagged ``neuron`` plus exactly one of ``tnx`` / ``nxdi``, guarded by
   ``if helpers.run_neuron_cell("<that tag>"):``.
2. For each notebook and each stack it has cells for, the harness runs, in one namespace and in
   notebook order:
   a. the code cells before the ``parameters`` cell (the imports),
   b. the ``parameters`` cell, then ``backend = "neuron"`` and ``neuron_stack = "<stack>"``,
   c. the first code cell after it (the template's ``bk = helpers.resolve_backend(...)`` cell),
   d. every Neuron cell of that stack. Before each one, any name the cell reads that is not defined
      yet is looked up in the earlier untagged code cells: the last cell that defines it is run first
      (with its own missing names resolved the same way). So keep the cells that Neuron cells depend
      on (tokenizer, prompt batch, ...) cheap and backend-independent; a cell that only does work on
      the reference backend (``run_reference_cell``) defines nothing here.
3. Cells must be plain Python (no ``%`` / ``!`` magics).

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


def _bound_names(tree: ast.AST, top_level: bool = False) -> set[str]:
    """Names a cell binds (assignments, imports, defs, for/with targets). ``top_level``: only the
    module-level ones (not function arguments, locals or comprehension variables)."""
    names: set[str] = set()
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
              ast.DictComp, ast.GeneratorExp)

    def visit(node, nested):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)) and not nested:
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not nested:
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and not nested:
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg) and not nested:
            names.add(node.arg)
        inner = nested or (top_level and isinstance(node, scopes))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return names


def _loaded_names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def free_names(source: str) -> set[str]:
    tree = ast.parse(source)
    return _loaded_names(tree) - _bound_names(tree) - set(dir(builtins))


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
    namespace: dict = field(default_factory=dict)


class HarnessError(AssertionError):
    pass


def _check_plain_python(source: str, where: str) -> None:
    for line in source.splitlines():
        if line.lstrip().startswith(("%", "!")):
            raise HarnessError(f"{where}: IPython magic {line.strip()!r}: Neuron cells and the cells they depend "
                               "on must be plain Python")


def run_neuron_cells(nb_path: str | os.PathLike, stack: str, overrides: dict | None = None,
                     edit=None) -> ContractRun:
    """Execute the notebook's ``stack`` Neuron cells as described in the module docstring.

    Call inside :func:`stand_ins`. ``edit(index, source) -> source`` may rewrite cells (meta-tests).
    """
    nb = nbformat.read(str(nb_path), as_version=4)
    stem = Path(nb_path).stem
    cells = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    src = {i: (edit(i, c.source) if edit else c.source) for i, c in cells}
    params = [i for i, c in cells if "parameters" in tags(c)]
    if len(params) != 1:
        raise HarnessError(f"{stem}: expected one 'parameters' cell, found {len(params)}")
    p = params[0]
    after = [i for i, _ in cells if i > p]
    if not after:
        raise HarnessError(f"{stem}: no code cell after the parameters cell (the resolve_backend cell)")
    backend_cell = after[0]
    if "resolve_backend" not in src[backend_cell]:
        raise HarnessError(f"{stem}: the cell after 'parameters' must call helpers.resolve_backend (template)")
    neuron = [i for i, c in cells if "neuron" in tags(c) and stack in tags(c)]
    other_neuron = {i for i, c in cells if "neuron" in tags(c)}
    candidates = [i for i, _ in cells if i > backend_cell and i not in other_neuron]
    run = ContractRun(stem, stack)
    ns: dict = {"__name__": "__main__"}
    done: set[int] = set()

    def execute(i: int, role: str):
        _check_plain_python(src[i], f"{stem} cell {i}")
        run.steps.append(Step(i, role, src[i]))
        done.add(i)
        try:
            exec(compile(src[i], f"<{stem} cell {i} ({role})>", "exec"), ns)
        except Exception as exc:
            exc.add_note(f"[contract harness] in {stem} cell {i} ({role}); ran so far: "
                         + ", ".join(f"{s.index} ({s.role})" for s in run.steps))
            raise

    def resolve(i: int, chain: tuple = ()):
        for name in sorted(free_names(src[i])):
            if name in ns:
                continue
            providers = [j for j in candidates if j < i and j not in done and name in _bound_names(ast.parse(src[j]), top_level=True)]
            if not providers:
                continue  # a NameError at execution will name it
            j = providers[-1]
            if j in chain:
                raise HarnessError(f"{stem}: circular cell dependency through cell {j}")
            resolve(j, chain + (i,))
            if j not in done:
                execute(j, f"defines {name!r}")

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            for i, _ in cells:
                if i < p:
                    execute(i, "imports")
            execute(p, "parameters")
            injected = {"backend": "neuron", "neuron_stack": stack, **(overrides or {})}
            exec("\n".join(f"{k} = {v!r}" for k, v in injected.items()), ns)
            execute(backend_cell, "backend")
            for i in neuron:
                resolve(i)
                execute(i, f"neuron/{stack}")
    finally:
        run.stdout = buf.getvalue()
    run.namespace = ns
    return run
