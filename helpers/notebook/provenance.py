"""What produced a notebook's figures, and the guard of sections that only the reference engine can run.

On ``backend="neuron"`` a notebook measures through the Neuron library (``helpers.build_model`` or its
Neuron cells). Some sections need the reference engine's internals (per-position logits, the ranks'
tensors, a compiled graph's manifest): :func:`reference_only` skips them there and prints why.
:func:`measured_by` names the package that really ran, so a figure is never attributed to NeuronCores
when a stand-in (``tests/neuron_sim``, the neuron lanes) or the CPU engine produced it.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from ..neuron.runtime import STACK_NAMES, STACKS
from .backend import Backend

# The stand-ins the neuron lanes put under the Neuron import names (tests/neuron_sim, its pyproject's name). The
# lanes do not install them: each run puts one stack's package on PYTHONPATH, so they are recognised by where the
# package lives, not by installed metadata.
STAND_IN_DISTRIBUTION = "neuron-stand-ins"
STAND_IN_FOLDER = "neuron_sim"


def reference_only(bk: Backend, why: str) -> bool:
    """Guard of a reference-engine section: True on the reference backend; on Neuron, print that the
    section is skipped and ``why`` (what it needs that the Neuron libraries do not expose), return False."""
    if not why or not why.strip():
        raise ValueError("reference_only needs the reason the section cannot run on Neuron")
    if bk.is_neuron:
        print(f"Reference engine only, skipped on {bk}: {why.strip()}")
        return False
    return True


def stack_distribution(stack: str) -> str | None:
    """The distribution that provides the stack's import name ('transformers_neuronx', ...): the stand-ins' name when
    the package is one of tests/neuron_sim (however it was put on the path), None when the name does not import."""
    if stack not in STACKS:
        raise ValueError(f"stack={stack!r}: use one of {tuple(STACKS)}")
    module = STACKS[stack]
    spec = importlib.util.find_spec(module)
    if spec is None:
        return None
    if spec.origin and STAND_IN_FOLDER in Path(spec.origin).resolve().parts:
        return STAND_IN_DISTRIBUTION
    dists = importlib.metadata.packages_distributions().get(module) or []
    return dists[0] if dists else None


def measured_by(bk: Backend) -> str:
    """One line naming what produced the figures of this run (print it next to every Neuron figure)."""
    if not bk.is_neuron:
        return f"the helpers reference engine on {bk.device} (not a Neuron measurement)"
    dist = stack_distribution(bk.stack)
    if dist == STAND_IN_DISTRIBUTION:
        return (f"the {STAND_IN_DISTRIBUTION} package (tests/neuron_sim: a CPU stand-in with the "
                f"{STACK_NAMES[bk.stack]} API) — not a Neuron measurement")
    version = importlib.metadata.version(dist) if dist else "unknown version"
    return f"{STACK_NAMES[bk.stack]} ({dist or STACKS[bk.stack]} {version}) on NeuronCores"
