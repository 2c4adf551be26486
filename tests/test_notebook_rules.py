"""Rules every notebook keeps about the figures it shows (CONVENTIONS.md, "Figures are the run's"), read from the
committed notebooks' source:

- a markdown cell states no figure that a run computes (a timing, a ratio, a percentage, a size): the code cells
  print those from the run's own values. Figures quoted from a source (a guide, a user report, a data sheet)
  or thresholds the notebook asserts are listed in ``QUOTED`` with where they come from;
- every plot's title names what produced it: a cell that shows a plot calls
  ``helpers.notebook.figures.titled(..., bk)`` (the backend that measured it) or ``titled(..., source=...)``;
- a cell that calls one timing faster or slower than another, or a speedup or an overhead, does so through
  ``helpers.notebook.figures.compare`` / ``Spread`` (median with min-max; a difference only where the ranges
  separate), never by a hand-written ratio.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))

# A number with a unit a run measures or computes. Model names (7B, 70B), settings in code spans and a modulo
# (`2 % 3`) are not.
FIGURE = re.compile(r"(?<![\w.\-])~?\d+(?:\.\d+)?\s?(?:x|×|ms|s|%|tok/s|tokens/s|GB/s|GiB|MiB|KiB|GB|MB|KB)(?![\w/])(?!\s\d)")

# Figures a markdown cell may state, per notebook number: each quoted from a source, or a threshold the notebook
# asserts in code. The comment says which.
QUOTED: dict[str, set[str]] = {
    "11": {"24 GiB"},  # HBM of a Trn2 logical NeuronCore (LNC=2), from the Neuron documentation the cell cites
    "01": {"16 GiB", "16GB", "15.9 GB", "16 GB",  # HBM per NeuronCore (Neuron guides); the user report, quoted
           "8GB"},  # reference 000's "Expected Results" ("Memory usage ~8GB per core"), quoted as its expectation
    "06": {"5%", "90%", "50%"},  # the thresholds the notebook's assertions use
    "07": {"25 ms", "101.81 ms"},  # Llama-3-8B TTFT p50 at 128 and 2048 input tokens, inf2 latency_data_decoder.csv
}


def _markdown_figures(path: Path) -> list[str]:
    nb = nbformat.read(str(path), as_version=4)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        text = re.sub(r"`[^`]*`", "", cell.source)  # code spans are settings and names, not figures
        text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
        for m in FIGURE.finditer(text):
            if m.group(0).lstrip("~") not in QUOTED.get(path.stem[:2], set()):
                context = text[max(0, m.start() - 40):m.end() + 20].replace("\n", " ")
                found.append(f"cell {i}: {m.group(0)!r} in ...{context}...")
    return found


def _code_cells(path: Path):
    nb = nbformat.read(str(path), as_version=4)
    return [(i, c.source) for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and "neuron" not in c.get("metadata", {}).get("tags", [])]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_markdown_states_no_computed_figure(path):
    found = _markdown_figures(path)
    assert not found, (f"{path.name}: markdown states figures; print them from the run in a code cell (or, for a "
                       "figure quoted from a source, list it in QUOTED with where it comes from):\n  "
                       + "\n  ".join(found))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_plot_names_what_produced_it(path):
    bare = [i for i, src in _code_cells(path) if "plt.show()" in src and "titled(" not in src]
    assert not bare, (f"{path.name}: cells {bare} show a plot without helpers.notebook.figures.titled(...): its title "
                      "must name the backend that measured it (or, for a computed figure, what computed it)")


CLAIM = re.compile(r"""["'][^"'\n]*\b(faster|slower|speedup|overhead)\b""", re.IGNORECASE)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_differences_come_with_their_spread(path):
    bare = [i for i, src in _code_cells(path) if CLAIM.search(src) and not re.search(r"\b(compare|Spread)\(", src)]
    assert not bare, (f"{path.name}: cells {bare} print a speed claim (faster/slower/speedup/overhead) without "
                      "helpers.notebook.figures.compare or Spread: show the spread of the repeats and call a "
                      "difference one only where the ranges separate")


def test_the_rules_catch_what_they_describe(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("The streamer costs 0.24% and prefill is 1.30x faster (`tp_degree=2`, 7B)."),
        nbformat.v4.new_code_cell("fig, ax = plt.subplots()\nplt.show()"),
        nbformat.v4.new_code_cell("print(f'{a / b:.2f}x faster')"),
        nbformat.v4.new_code_cell("titled(ax, 'x', bk)\nprint(compare(a, b, 'x', 'y'), 'faster')\nplt.show()"),
    ])
    path = tmp_path / "99_sample.ipynb"
    nbformat.write(nb, str(path))
    assert [re.search(r"'([^']+)'", f).group(1) for f in _markdown_figures(path)] == ["0.24%", "1.30x"]
    with pytest.raises(AssertionError, match=r"cells \[1\]"):
        test_every_plot_names_what_produced_it(path)
    with pytest.raises(AssertionError, match=r"cells \[2\]"):
        test_differences_come_with_their_spread(path)


# ------------------------------------------------------------------------- lesson first (ci/lesson_counts.py)
def _lesson_counts():
    import importlib.util

    spec = importlib.util.spec_from_file_location("lesson_counts", REPO / "ci" / "lesson_counts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_recipe_comes_first_and_the_lesson_stays_short(path):
    lc = _lesson_counts()
    c, goals = lc.counts(path), lc.GOALS
    assert c["first_neuron_cell"] is not None and c["first_neuron_cell"] < goals["first_neuron_cell_before"], (
        f"{path.name}: the first Neuron recipe cell is cell {c['first_neuron_cell']}: show it within the first "
        f"{goals['first_neuron_cell_before']} cells (title, what you will learn, the recipe)")
    assert c["code_lines"] <= goals["code_lines_max"], (
        f"{path.name}: {c['code_lines']} code lines outside the Neuron cells (goal at most {goals['code_lines_max']}): "
        "move validation, repeats, spreads and metrics into helpers behind one call each")
    assert c["markdown_words"] <= goals["markdown_words_max"], (
        f"{path.name}: {c['markdown_words']} words of markdown (goal at most {goals['markdown_words_max']})")


def test_the_median_notebook_has_at_most_100_code_lines():
    import statistics

    lc = _lesson_counts()
    code = [lc.counts(p)["code_lines"] for p in NOTEBOOKS]
    assert statistics.median(code) <= lc.GOALS["code_lines_median"], code
