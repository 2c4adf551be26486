"""How each notebook reads: where its first Neuron recipe cell is, how much code a reader passes outside the recipes,
how many words of prose. The goals (``GOALS``) are tested in tests/test_notebook_rules.py.

    python ci/lesson_counts.py        # one row per notebook, then the median and the maximum
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# first Neuron cell: index (0-based) below this; code lines outside the Neuron cells: median and maximum; words
GOALS = {"first_neuron_cell_before": 8, "code_lines_median": 100, "code_lines_max": 140, "markdown_words_max": 1500}


def counts(path: Path) -> dict:
    """first_neuron_cell (0-based index), code_lines (outside Neuron cells; no blank or comment lines), words."""
    cells = json.loads(path.read_text())["cells"]
    first, code, words = None, 0, 0
    for i, cell in enumerate(cells):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            words += len(source.split())
        elif "neuron" in cell.get("metadata", {}).get("tags", []):
            first = i if first is None else first
        elif cell["cell_type"] == "code":
            code += sum(1 for line in source.splitlines() if line.strip() and not line.strip().startswith("#"))
    return {"first_neuron_cell": first, "code_lines": code, "markdown_words": words}


def table(paths) -> dict[str, dict]:
    return {p.stem: counts(p) for p in paths}


def main() -> int:
    rows = table(sorted((REPO / "notebooks").glob("*.ipynb")))
    print(f"{'notebook':<32} {'first Neuron cell':>17} {'code lines':>10} {'words':>6}")
    for stem, c in rows.items():
        print(f"{stem:<32} {c['first_neuron_cell']!s:>17} {c['code_lines']:>10} {c['markdown_words']:>6}")
    code = [c["code_lines"] for c in rows.values()]
    words = [c["markdown_words"] for c in rows.values()]
    print(f"{'median':<32} {'':>17} {statistics.median(code):>10} {statistics.median(words):>6}")
    print(f"{'max':<32} {max(c['first_neuron_cell'] or 0 for c in rows.values()):>17} {max(code):>10} {max(words):>6}")
    print("goals: " + ", ".join(f"{k} {v}" for k, v in GOALS.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
