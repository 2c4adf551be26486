"""Run a notebook's Neuron cells against the stand-in Neuron packages (the contract test's engine).

Convention for notebook authors (the contract test, ``tests/test_neuron_cells.py`` and the standalone runs of
``ci/neuron_cells.py`` rely on it). A Neuron cell is a snippet a reader pastes into their own service, so:

1. It is a code cell tagged ``neuron`` plus exactly one of ``tnx`` / ``nxdi``. Its top level holds only
   standard-library imports and one guard on its library being installed, with the skip message first::

       import importlib.util

       if importlib.util.find_spec("transformers_neuronx") is None:  # or "neuronx_distributed_inference"
           print("Skipped: ...")
       else:
           <its imports>
           # EDIT
           <the values a user edits, as literals, up to the first blank line; model_dir among them>

           <the guide's calls, then a printed result>

   It runs wherever its library imports (an SDK 2.26 venv has transformers-neuronx, a 2.28 venv NxD
   Inference; the neuron lanes put one stack's stand-in on the path) and says why it skipped elsewhere.
2. It imports only its stack's library, transformers, torch and the standard library: never ``helpers``
   (a reader outside this repository has no such package). The small pieces it needs (a streamer, a
   stopping criterion, an acceptor) are written in the cell.
3. It stands alone: it reads no name that an earlier cell defines. A later (non-Neuron) cell may read the
   Neuron cell's variables, never the other way round.
4. Cells must be plain Python (no ``%`` / ``!`` magics).

In-process runs (:func:`run_neuron_cells`, the contract test on the fixture notebook) execute each cell alone in a
fresh namespace inside :func:`stand_ins`. ``ci/neuron_cells.py`` runs every notebook's cells of a stack as scripts,
each its own process in an empty folder, with the ``# EDIT`` values of ``ci/params/neuron-cells.yaml``
(:func:`script_for`) and an import of ``helpers`` from the cell's own code made to fail.

The stand-ins (``tests/neuron_sim``) are importable only inside :func:`stand_ins` (or on the lanes' PYTHONPATH); they
raise ``ContractError`` on keywords the pinned releases do not take (including the ones the real libraries would
swallow) and on wrong call order. This is evidence that the code matches the pinned APIs, not that it runs on
hardware.
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
# The import name each stack's cells guard on, and the top-level modules a cell of that stack may import besides
# the standard library.
LIBRARY = {"tnx": "transformers_neuronx", "nxdi": "neuronx_distributed_inference"}
ALLOWED_IMPORTS = {"tnx": {"transformers_neuronx", "transformers", "torch"},
                   "nxdi": {"neuronx_distributed_inference", "neuronx_distributed", "transformers", "torch"}}


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
    """``stack`` when ``node`` is ``if importlib.util.find_spec("<library>") is None: print(...) else: ...``."""
    if not isinstance(node, ast.If) or not node.orelse:
        return None
    test = node.test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None):
        return None
    call = test.left
    if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "importlib.util.find_spec" and not call.keywords
            and len(call.args) == 1 and isinstance(call.args[0], ast.Constant)):
        return None
    skip = node.body
    if not (len(skip) == 1 and isinstance(skip[0], ast.Expr) and isinstance(skip[0].value, ast.Call)
            and ast.unparse(skip[0].value.func) == "print"):
        return None
    return {lib: stack for stack, lib in LIBRARY.items()}.get(call.args[0].value)


def _guarded_body(tree: ast.Module) -> list[ast.stmt]:
    guards = [n for n in tree.body if _guard_stack(n) is not None]
    return guards[0].orelse if len(guards) == 1 else []


def edit_block(source: str) -> tuple[int, int]:
    """(first, last) 1-based line numbers of the ``# EDIT`` block: the comment line up to the first blank line."""
    lines = source.splitlines()
    first = next(n for n, line in enumerate(lines, 1) if EDIT_RE.match(line))
    last = first
    while last < len(lines) and lines[last].strip():
        last += 1
    return first, last


def edit_names(source: str) -> set[str]:
    """The names the ``# EDIT`` block binds (its top-level statements inside the guard)."""
    first, last = edit_block(source)
    body = _guarded_body(ast.parse(source))
    return _bound_names(ast.Module([n for n in body if first < n.lineno <= last], []))


def import_problems(source: str, stack: str) -> list[str]:
    """Imports other than the standard library and ``ALLOWED_IMPORTS[stack]`` (``helpers`` among them)."""
    allowed = ALLOWED_IMPORTS[stack] | set(sys.stdlib_module_names)
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            problems.append(f"line {node.lineno}: relative import")
            continue
        mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) else []
        for mod in mods:
            if mod.split(".")[0] not in allowed:
                problems.append(f"line {node.lineno}: imports {mod!r}: a Neuron cell imports only its stack's library "
                                f"({', '.join(sorted(ALLOWED_IMPORTS[stack]))}) and the standard library")
    return problems


def shape_problems(source: str, stack: str) -> list[str]:
    """How a Neuron cell of ``stack`` departs from rules 1-2 of the convention (free names aside)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"does not parse: {exc}"]
    problems = import_problems(source, stack)
    guards = [n for n in tree.body if _guard_stack(n) is not None]
    others = [n for n in tree.body if _guard_stack(n) is None and not isinstance(n, (ast.Import, ast.ImportFrom))]
    if len(guards) != 1 or _guard_stack(guards[0]) != stack:
        found = [_guard_stack(g) for g in guards]
        problems.append(f"needs one top-level `if importlib.util.find_spec({LIBRARY[stack]!r}) is None: print(...)` "
                        f"with an `else:` that does the work, found guards for {found}")
    if others:
        problems.append("only imports may stand outside the guard; lines "
                        + ", ".join(str(n.lineno) for n in others) + " do too")
    edits = [n for n, line in enumerate(source.splitlines(), 1) if EDIT_RE.match(line)]
    if len(edits) != 1:
        problems.append(f"needs exactly one `# EDIT` line, found {len(edits)} (lines {edits})")
    elif len(guards) == 1:
        body, line = guards[0].orelse, edits[0]
        if not guards[0].body[-1].end_lineno < line <= guards[0].end_lineno:
            problems.append(f"the `# EDIT` line (line {line}) must be inside the `else:` body")
        elif any(not isinstance(n, (ast.Import, ast.ImportFrom)) for n in body if n.lineno < line):
            problems.append(f"only imports may come before the `# EDIT` block (line {line}) in the `else:` body")
        elif "model_dir" not in edit_names(source):
            problems.append("the `# EDIT` block must set `model_dir` (the checkpoint the cell loads)")
    return problems


def script_for(source: str, overrides: dict | None = None) -> str:
    """The cell as a script, with ``overrides`` (EDIT name -> value) assigned right after its ``# EDIT`` block.

    A name the block does not bind raises (a typo would otherwise change nothing)."""
    if not overrides:
        return source
    unknown = set(overrides) - edit_names(source)
    if unknown:
        raise HarnessError(f"override(s) {sorted(unknown)} are not set in the cell's # EDIT block "
                           f"(it sets {sorted(edit_names(source))})")
    lines = source.splitlines()
    first, last = edit_block(source)
    indent = re.match(r"\s*", lines[first - 1]).group(0)
    added = [f"{indent}{name} = {value!r}  # neuron lane override" for name, value in overrides.items()]
    return "\n".join(lines[:last] + added + lines[last:]) + "\n"


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
    nb = nbformat.read(str(nb_path), as_version=4)
    stem = Path(nb_path).stem
    cells = neuron_cells(nb, stack)
    if not cells:
        raise HarnessError(f"{stem}: no Neuron cell tagged {stack!r}")
    run = ContractRun(stem, stack)
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
    return run
