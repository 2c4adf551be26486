"""The house rules of ``helpers``: each folder is one floor and imports only the floors below it, no import
circle (imports inside functions count), no module over 500 lines, and no import inside a function except
of an optional heavy dependency (the Neuron SDK, torch._inductor, matplotlib), a helpers import only with a
comment on its line that says why.

The rules read the source with ``ast`` (nothing is imported); the last tests run them on a made-up package
to show that each one fails when broken.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "helpers"
MAX_LINES = 500

# The floors, from the ground up. A module may import its own folder and the floors below its own; folders
# on the same floor do not import each other. The face (helpers/__init__.py) may import every floor.
FLOORS = {
    "helpers.model_store": 0, "helpers.prompts": 0,
    "helpers.planning": 1,
    "helpers.engine": 2,
    "helpers.artifacts": 3, "helpers.neuron": 3,
    "helpers.parallel": 4, "helpers.serving": 4,
    "helpers.notebook": 5,
}
FACE = "helpers"
# Imports allowed inside a function: optional or heavy dependencies a module must import without.
OPTIONAL_HEAVY = ("transformers_neuronx", "neuronx_distributed_inference", "torch._inductor", "matplotlib")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


class _Imports(ast.NodeVisitor):
    """Every import of a module: (line, target, inside a function)."""

    def __init__(self):
        self.found, self.depth = [], 0

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node):
        for a in node.names:
            self.found.append((node.lineno, 0, a.name, [], self.depth > 0))

    def visit_ImportFrom(self, node):
        self.found.append((node.lineno, node.level, node.module or "", [a.name for a in node.names], self.depth > 0))


def imports(name: str, path: Path, known: dict[str, Path]) -> list[dict]:
    """The imports of one module, relative ones resolved; ``target`` is the helpers module imported (a
    ``from package import module`` names the module), or the outside module's name."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    visitor = _Imports()
    visitor.visit(ast.parse(path.read_text(), str(path)))
    out = []
    for line, level, module, names, in_function in visitor.found:
        if level:
            base = package.split(".")
            base = base[:len(base) - (level - 1)]
            module = ".".join(base + ([module] if module else []))
        targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in known] or [module]
        for t in targets:
            out.append({"line": line, "target": t, "in_function": in_function, "helpers": t in known})
    return out


def graph(root: Path) -> tuple[dict[str, Path], dict[str, list[dict]]]:
    known = modules(root)
    return known, {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, list[dict]]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module, or a module importing
    itself), by Tarjan's algorithm."""
    succ = {m: sorted({e["target"] for e in es if e["helpers"]}) for m, es in edges.items()}
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in succ.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in succ.get(v, []):
                found.append(sorted(component))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return found


def folder(name: str) -> str | None:
    for key in sorted(FLOORS, key=len, reverse=True):
        if name == key or name.startswith(key + "."):
            return key
    return None


def floor_violations(edges: dict[str, list[dict]]) -> list[str]:
    bad = []
    for m, es in edges.items():
        if m == FACE:
            continue
        here = folder(m)
        for e in es:
            if not e["helpers"]:
                continue
            there = folder(e["target"])
            if here is None or there is None:
                bad.append(f"{m}:{e['line']} -> {e['target']}: a module outside the floors (add it to FLOORS)")
            elif there != here and FLOORS[there] >= FLOORS[here]:
                bad.append(f"{m}:{e['line']} -> {e['target']}: floor {FLOORS[here]} ({here}) imports floor "
                           f"{FLOORS[there]} ({there})")
    return bad


def function_import_violations(known: dict[str, Path], edges: dict[str, list[dict]]) -> list[str]:
    bad = []
    for m, es in edges.items():
        lines = known[m].read_text().splitlines()
        for e in es:
            if not e["in_function"]:
                continue
            if e["helpers"]:
                if "#" not in lines[e["line"] - 1]:
                    bad.append(f"{m}:{e['line']} imports {e['target']} inside a function without saying why")
            elif not any(e["target"] == d or e["target"].startswith(d + ".") for d in OPTIONAL_HEAVY):
                bad.append(f"{m}:{e['line']} imports {e['target']} inside a function: only optional heavy "
                           f"dependencies ({', '.join(OPTIONAL_HEAVY)}) belong there; import it at the top")
    return bad


def long_modules(known: dict[str, Path]) -> list[str]:
    return [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: {n} lines"
            for p in known.values() if (n := len(p.read_text().splitlines())) > MAX_LINES]


# -- the house -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def house():
    return graph(PACKAGE)


def test_the_rules_read_the_whole_package(house):
    known, edges = house
    assert {"helpers", "helpers.engine.model", "helpers.neuron.build", "helpers.parallel.__main__"} <= set(known)
    assert any(e["in_function"] for es in edges.values() for e in es)  # the Neuron SDK, imported lazily
    assert ("helpers.engine.weights" in {e["target"] for e in edges["helpers.engine.model"]})


def test_no_import_circle(house):
    _, edges = house
    assert cycles(edges) == []


def test_each_floor_imports_only_the_floors_below(house):
    _, edges = house
    assert floor_violations(edges) == []


def test_no_module_over_500_lines(house):
    known, _ = house
    assert long_modules(known) == []


def test_imports_inside_functions_are_for_optional_heavy_dependencies(house):
    known, edges = house
    assert function_import_violations(known, edges) == []


# -- each rule fails when broken -----------------------------------------------------------------------
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "helpers"
    for rel, text in {"__init__.py": "", "engine/__init__.py": "", "planning/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_rules_fail_when_broken(tmp_path):
    root = _package(tmp_path, {
        # a circle closed by an import inside a function, through a relative import two levels up
        "engine/model.py": "from .weights import W\n",
        "engine/weights.py": "W = 1\n\ndef shard():\n    from ..engine import model\n    return model\n",
        # a lower floor importing a higher one
        "planning/gqa.py": "from ..engine.model import W\n",
        # an outside import inside a function, and a long module
        "planning/memory.py": "def f():\n    import json\n    return json\n" + "x = 1\n" * MAX_LINES,
    })
    known, edges = graph(root)
    assert cycles(edges) == [["helpers.engine.model", "helpers.engine.weights"]]
    assert floor_violations(edges) == ["helpers.planning.gqa:1 -> helpers.engine.model: floor 1 (helpers.planning) "
                                       "imports floor 2 (helpers.engine)"]
    assert function_import_violations(known, edges) == [
        "helpers.engine.weights:4 imports helpers.engine.model inside a function without saying why",
        "helpers.planning.memory:2 imports json inside a function: only optional heavy dependencies "
        f"({', '.join(OPTIONAL_HEAVY)}) belong there; import it at the top"]
    assert long_modules(known) == [f"{root / 'planning/memory.py'}: {MAX_LINES + 3} lines"]


def test_a_helpers_import_inside_a_function_passes_only_with_its_reason(tmp_path):
    root = _package(tmp_path, {
        "engine/model.py": "def f():\n    from ..planning import gqa  # the Neuron SDK behind it: on inf2 only\n",
        "planning/gqa.py": "",
    })
    known, edges = graph(root)
    assert function_import_violations(known, edges) == [] and cycles(edges) == [] and floor_violations(edges) == []
