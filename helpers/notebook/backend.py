"""One switch for every notebook: ``backend`` = ``auto`` | ``reference`` | ``neuron``.

``auto`` picks ``neuron`` when a Neuron stack imports (transformers-neuronx for SDK 2.26,
NxD Inference for SDK 2.28), else ``reference`` (the engine in ``helpers`` on CPU/CUDA).

Neuron code cells in the notebooks are guarded by :func:`run_neuron_cell`, which prints
why a cell is skipped — never a silent skip. The guard takes only the stack, so a Neuron cell needs
nothing from earlier cells: it follows the backend the notebook chose (its last :func:`resolve_backend`
call), and, copied into a script that never chose one, ``auto`` (runs where that stack is installed).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..neuron.runtime import STACK_NAMES, STACKS, installed_stacks

BACKENDS = ("auto", "reference", "neuron")


@dataclass(frozen=True)
class Backend:
    name: str                 # "reference" or "neuron"
    stack: str | None = None  # "tnx" | "nxdi" on neuron
    device: str = "cpu"       # reference engine's torch device

    @property
    def is_neuron(self) -> bool:
        return self.name == "neuron"

    def __str__(self) -> str:
        if self.is_neuron:
            return f"neuron ({STACK_NAMES[self.stack]})"
        return f"reference (helpers engine on {self.device})"


_chosen: Backend | None = None  # the last resolve_backend() result: what run_neuron_cell follows


def resolve_backend(backend: str = "auto", neuron_stack: str | None = None, device: str = "cpu") -> Backend:
    """Validate the notebook's ``backend`` / ``neuron_stack`` / ``device`` before anything is built.

    The result is also remembered as the process's chosen backend (:func:`chosen_backend`)."""
    global _chosen
    _chosen = _resolve(backend, neuron_stack, device)
    return _chosen


def chosen_backend() -> Backend:
    """The backend of the last :func:`resolve_backend` call; ``auto`` if there was none."""
    return _chosen if _chosen is not None else resolve_backend("auto")


def _resolve(backend: str, neuron_stack: str | None, device: str) -> Backend:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: use one of {BACKENDS}")
    if neuron_stack not in (None, "", *STACKS):
        raise ValueError(f"neuron_stack={neuron_stack!r}: use 'tnx' (transformers-neuronx), 'nxdi' "
                         "(NxD Inference) or None to detect the installed one")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: use 'cpu' or 'cuda' (the reference engine's torch device)")
    stacks = installed_stacks()
    if backend == "auto":
        backend = "neuron" if stacks else "reference"
    if backend == "reference":
        return Backend("reference", None, device)
    if neuron_stack:
        if neuron_stack not in stacks:
            raise ValueError(f"neuron_stack={neuron_stack!r} but {STACKS[neuron_stack]} does not import here: "
                             f"install requirements-neuron-{neuron_stack}.txt on an inf2/trn1 instance, "
                             "or use backend='reference'")
        return Backend("neuron", neuron_stack)
    if not stacks:
        raise ValueError("backend='neuron' but no Neuron stack imports (transformers_neuronx or "
                         "neuronx_distributed_inference): run on an inf2/trn1 instance with the Neuron SDK, "
                         "or use backend='reference' (CPU/CUDA)")
    return Backend("neuron", stacks[0])


def run_neuron_cell(stack: str, bk: Backend | None = None) -> bool:
    """Guard for a copy-paste Neuron cell: True when it should run, else print why it is skipped.

    ``bk`` defaults to :func:`chosen_backend` (the notebook's ``backend`` parameter once its set-up cell ran)."""
    if stack not in STACKS:
        raise ValueError(f"stack={stack!r}: use one of {tuple(STACKS)}")
    bk = chosen_backend() if bk is None else bk
    if not bk.is_neuron:
        print(f"Skipped: this cell needs {STACK_NAMES[stack]} on an inf2/trn1 instance; "
              f"backend is {bk}.")
        return False
    if bk.stack != stack:
        print(f"Skipped: this cell is for {STACK_NAMES[stack]}; the active Neuron stack is "
              f"{STACK_NAMES[bk.stack]} (set neuron_stack={stack!r} to run it).")
        return False
    return True


def run_reference_cell(bk: Backend) -> bool:
    if bk.is_neuron:
        print(f"Skipped: reference-engine cell; backend is {bk}.")
        return False
    return True
