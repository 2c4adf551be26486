"""The Neuron recipe cells of a notebook: what marks them, and running them only where their library is installed.

A notebook loads this as an IPython extension in its first code cell::

    %load_ext helpers.notebook.recipes

From then on a code cell whose first line starts with a stack's header (``# transformers-neuronx`` or
``# NxD Inference``) runs as written where that stack's library imports (an inf2/trn1 instance with the Neuron SDK,
or a neuron lane with its stand-in), and elsewhere is replaced by one line saying it was skipped. So the recipe a
reader copies is plain top-level Python: the "skip when the library is absent" lives here, not in the cell.
The cells are tagged ``neuron`` + the stack as well; tests/test_neuron_cells.py checks that tags and headers agree.
"""
from __future__ import annotations

import importlib.util

# stack -> (the first line's prefix, the module that must import, what to install)
RECIPE_HEADERS = {
    "tnx": ("# transformers-neuronx", "transformers_neuronx", "transformers-neuronx 0.13, Neuron SDK 2.26"),
    "nxdi": ("# NxD Inference", "neuronx_distributed_inference", "NxD Inference 0.8, Neuron SDK 2.28"),
}


def recipe_stack(first_line: str) -> str | None:
    """The stack whose recipe header ``first_line`` is, or None for any other cell."""
    return next((s for s, (prefix, _, _) in RECIPE_HEADERS.items() if first_line.startswith(prefix)), None)


def skip_message(stack: str) -> str:
    _, module, release = RECIPE_HEADERS[stack]
    return f"Skipped: {module} is not installed here ({release}, on inf2/trn1). This recipe runs on an instance."


def skip_absent(lines: list[str]) -> list[str]:
    """IPython input transformer: a recipe cell of a stack whose library does not import becomes a print."""
    stack = recipe_stack(lines[0]) if lines else None
    if stack is None or importlib.util.find_spec(RECIPE_HEADERS[stack][1]) is not None:
        return lines
    return [f"print({skip_message(stack)!r})\n"]


def load_ipython_extension(ipython) -> None:
    if skip_absent not in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.append(skip_absent)


def unload_ipython_extension(ipython) -> None:
    if skip_absent in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.remove(skip_absent)
