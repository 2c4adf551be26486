"""Run a notebook's Neuron cells against the stand-in Neuron packages (the contract test's engine).

Convention for notebook authors (the contract test, ``tests/test_neuron_cells.py`` and the standalone runs of
``ci/neuron_cells.py`` rely on it). A notebook's Neuron cells of one stack are a recipe a reader pastes into their own
service, so:

1. Each is a code cell tagged ``neuron`` plus exactly one of ``tnx`` / ``nxdi``, whose first line is that stack's
   header comment (``helpers.notebook.recipes.RECIPE_HEADERS``: ``# transformers-neuronx ...`` /
   ``# NxD Inference ...``). It is plain top-level Python, with no guard: the notebook's
   ``%load_ext helpers.notebook.recipes`` skips a recipe cell where its library does not import. The first cell
   of a stack holds its imports, then one ``# EDIT`` block of literals (the comment line up to the first blank
   line; ``model_dir`` among them), then the guide's calls::

       # transformers-neuronx 0.13 (Neuron SDK 2.26), inf2/trn1 ...
       import os

       from transformers_neuronx import LlamaForSampling

       # EDIT
       model_dir = os.path.expanduser("~/...")
       tp_degree = 2

       model = LlamaForSampling.from_pretrained(model_dir, tp_degree=tp_degree)
       ...

   Later cells of the same stack continue that script (a measurement a user would not paste, say) and have no
   ``# EDIT`` block of their own.
2. They import only their stack's library, transformers, torch and the standard library: never ``helpers``
   (a reader outside this repository has no such package). The small pieces they need (a streamer, a
   stopping criterion, an acceptor) are written in the cells.
3. A stack's cells, joined in order, stand alone: they read no name that another cell of the notebook defines.
   A later (non-Neuron) cell may read their variables, never the other way round.
4. Cells must be plain Python (no ``%`` / ``!`` magics).

In-process runs (:func:`run_neuron_cells`, the contract test on the fixture notebook) execute a stack's cells in
order in one fresh namespace inside :func:`stand_ins`. ``ci/neuron_cells.py`` runs every notebook's cells of a stack
as one script (:func:`script_for`), its own process in an empty folder, with the ``# EDIT`` values of
``ci/params/neuron-cells.yaml`` and an import of ``helpers`` from the script's own code made to fail.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from helpers.notebook.recipes import RECIPE_HEADERS, recipe_stack  # noqa: E402

STUBS = Path(__file__).resolve().parents[1] / "neuron_sim"
STUB_MODULES = ("transformers_neuronx", "neuronx_distributed_inference", "_neuron_contract")
STACKS = ("tnx", "nxdi")
# The import name of each stack's library, and the top-level modules a cell of that stack may import besides the
# standard library.
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


def recipe_source(cells: list[str]) -> str:
    """A stack's cells joined in order: the script a reader pastes, and the one the lanes run."""
    return "\n\n".join(c.rstrip("\n") for c in cells) + "\n"


def edit_block(source: str) -> tuple[int, int]:
    """(first, last) 1-based line numbers of the ``# EDIT`` block: the comment line up to the first blank line."""
    lines = source.splitlines()
    first = next(n for n, line in enumerate(lines, 1) if EDIT_RE.match(line))
    last = first
    while last < len(lines) and lines[last].strip():
        last += 1
    return first, last


def edit_names(source: str) -> set[str]:
    """The names the ``# EDIT`` block binds (its top-level statements)."""
    first, last = edit_block(source)
    body = ast.parse(source).body
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


def _guards(tree: ast.Module) -> list[int]:
    """Lines of top-level ``if`` statements that test whether a module is installed (the guard rule 1 forbids)."""
    return [n.lineno for n in tree.body if isinstance(n, ast.If)
            and any(isinstance(c, ast.Call) and ast.unparse(c.func).endswith("find_spec") for c in ast.walk(n.test))]


def shape_problems(cells: list[str] | str, stack: str) -> list[str]:
    """How a stack's Neuron cells (in notebook order) depart from rules 1-2 of the convention (free names aside)."""
    cells = [cells] if isinstance(cells, str) else cells
    problems = []
    for k, source in enumerate(cells):
        where = f"cell {k + 1} of {len(cells)}"
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            problems.append(f"{where}: does not parse: {exc}")
            continue
        problems += [f"{where}: {p}" for p in import_problems(source, stack)]
        first_line = (source.splitlines() or [""])[0]
        if recipe_stack(first_line) != stack:
            problems.append(f"{where}: its first line must start with {RECIPE_HEADERS[stack][0]!r} (the recipe header "
                            f"that `%load_ext helpers.notebook.recipes` skips on), found {first_line[:60]!r}")
        if _guards(tree):
            problems.append(f"{where}: a top-level `if ...find_spec(...)` guard (line {_guards(tree)[0]}): recipes are "
                            "plain top-level code; the notebook's `%load_ext helpers.notebook.recipes` skips them")
        edits = [n for n, line in enumerate(source.splitlines(), 1) if EDIT_RE.match(line)]
        if k == 0 and len(edits) != 1:
            problems.append(f"{where}: needs exactly one `# EDIT` line, found {len(edits)} (lines {edits})")
        elif k > 0 and edits:
            problems.append(f"{where}: an `# EDIT` line (line {edits[0]}): a stack's values live in one `# EDIT` block, "
                            "in its first cell")
        elif k == 0:
            line = edits[0]
            if any(n.col_offset for n in tree.body) or any(line_.startswith((" ", "\t")) and EDIT_RE.match(line_)
                                                          for line_ in source.splitlines()):
                problems.append(f"{where}: the `# EDIT` line (line {line}) must be at the top level, not indented")
            elif any(not isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body if n.lineno < line):
                problems.append(f"{where}: only imports may come before the `# EDIT` block (line {line})")
            elif "model_dir" not in edit_names(source):
                problems.append(f"{where}: the `# EDIT` block must set `model_dir` (the checkpoint the recipe loads)")
    return problems


def script_for(cells: list[str] | str, overrides: dict | None = None) -> str:
    """A stack's cells as one script, with ``overrides`` (EDIT name -> value) assigned right after the ``# EDIT`` block
    of the first cell.

    A name the block does not bind raises (a typo would otherwise change nothing)."""
    cells = [cells] if isinstance(cells, str) else cells
    first = cells[0]
    if overrides:
        unknown = set(overrides) - edit_names(first)
        if unknown:
            raise HarnessError(f"override(s) {sorted(unknown)} are not set in the cell's # EDIT block "
                               f"(it sets {sorted(edit_names(first))})")
        lines = first.splitlines()
        _, last = edit_block(first)
        added = [f"{name} = {value!r}  # neuron lane override" for name, value in overrides.items()]
        first = "\n".join(lines[:last] + added + lines[last:])
    return recipe_source([first, *cells[1:]])


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
    """Execute the notebook's ``stack`` Neuron cells in order in one fresh namespace, as rule 3 of the module
    docstring has it: the recipe alone, as a reader's script runs it.

    Call inside :func:`stand_ins`. ``edit(index, source) -> source`` may rewrite cells (meta-tests).
    """
    nb = nbformat.read(str(nb_path), as_version=4)
    stem = Path(nb_path).stem
    cells = neuron_cells(nb, stack)
    if not cells:
        raise HarnessError(f"{stem}: no Neuron cell tagged {stack!r}")
    run = ContractRun(stem, stack)
    ns: dict = {"__name__": "__main__"}
    sources = []
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            for i, cell in cells:
                source = edit(i, cell.source) if edit else cell.source
                sources.append(source)
                where = f"{stem} cell {i} ({stack})"
                _check_plain_python(source, where)
                run.steps.append(Step(i, f"neuron/{stack}", source))
                run.namespaces[i] = ns
                try:
                    exec(compile(source, f"<{where}>", "exec"), ns)
                except NameError as exc:
                    if exc.name not in free_names(recipe_source(sources)):  # raised deeper down, not by the cells
                        exc.add_note(f"[contract harness] in {where}, the {stack} recipe run alone")
                        raise
                    raise HarnessError(
                        f"{where}: name {exc.name!r} is not defined: the {stack} recipe uses a name from another cell "
                        "of the notebook. A stack's Neuron cells must stand alone (their own imports and an `# EDIT` "
                        "block of literals); see the convention in tests/contract/contract_harness.py") from exc
                except Exception as exc:
                    exc.add_note(f"[contract harness] in {where}, the {stack} recipe run alone")
                    raise
    finally:
        run.stdout = buf.getvalue()
    return run
