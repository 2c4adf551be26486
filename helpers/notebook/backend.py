"""One switch for every notebook: ``backend`` = ``auto`` | ``reference`` | ``neuron``.

``auto`` picks ``neuron`` when a Neuron stack imports (transformers-neuronx for SDK 2.26,
NxD Inference for SDK 2.28), else ``reference`` (the engine in ``helpers`` on CPU/CUDA).

The notebooks' Neuron cells do not use this module: they are snippets for other people's services, skipped where
their library is not installed by ``%load_ext helpers.notebook.recipes`` (:mod:`helpers.notebook.recipes`).
:func:`run_reference_cell` guards the cells that need the reference engine and prints why it skipped one — never a
silent skip.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..model_store import resolve_model_path
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


def resolve_backend(backend: str = "auto", neuron_stack: str | None = None, device: str = "cpu") -> Backend:
    """Validate the notebook's ``backend`` / ``neuron_stack`` / ``device`` before anything is built."""
    return _resolve(backend, neuron_stack, device)


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


def run_reference_cell(bk: Backend) -> bool:
    if bk.is_neuron:
        print(f"Skipped: reference-engine cell; backend is {bk}.")
        return False
    return True


def start(backend: str, neuron_stack, device: str, seed: int, model_path) -> tuple[Backend, Path]:
    """A notebook's first steps, in one place: resolve the backend, seed torch, find the checkpoint folder."""
    bk = resolve_backend(backend, neuron_stack, device)
    torch.manual_seed(seed)
    return bk, resolve_model_path(model_path)
