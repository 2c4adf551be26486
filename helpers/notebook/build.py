"""One entry point that builds the model for the active backend from the notebook's knobs.

The same settings mean the same thing on every backend: ``batch_size``, ``n_positions``
(an int or a list of token buckets), ``tp_degree``, ``amp`` ('f32' | 'bf16' | 'f16'),
``context_length_estimate`` (context buckets) and a ``NeuronConfig``.
"""
from __future__ import annotations

from ..artifacts.model import NeuronModel
from ..neuron.build import build_neuron_model
from ..parallel.model import ParallelModel
from .backend import Backend


def reference_class(tp_degree: int = 1) -> type[NeuronModel]:
    """The reference engine for a tensor-parallel degree: ``NeuronModel`` (one process) at 1,
    ``helpers.parallel.ParallelModel`` (one process per rank; same API, save/load included) above."""
    return ParallelModel if int(tp_degree) > 1 else NeuronModel


def build_model(bk: Backend, model_path=None, **settings):
    """Build and compile (``to_neuron()``) a model; returns an object with ``sample()``.

    ``speculation_length=k`` (k draft tokens per step): on the reference engine the target's verification
    graph (``enable_speculative_decoder(k)`` before ``to_neuron()``; the draft is a separate object, see
    ``helpers.engine.speculative``); on Neuron the library's speculation with ``draft_model_path``."""
    if bk.is_neuron:  # the Neuron SDK: only on inf2/trn1
        return build_neuron_model(bk.stack, model_path, **settings)
    speculation_length = int(settings.pop("speculation_length", 0) or 0)
    model = reference_class(settings.get("tp_degree", 1)).from_pretrained(model_path, device=bk.device, **settings)
    if speculation_length:
        model.enable_speculative_decoder(speculation_length)  # before to_neuron(), as on transformers-neuronx
    return model.to_neuron()


def load_model(bk: Backend, model_path, directory, **settings):
    """Build a model from graphs saved by ``save(directory)`` / ``compile(directory)``: ``load()`` before
    ``to_neuron()``, as transformers-neuronx does, so nothing is compiled. ``model_path`` is the
    checkpoint, or ``directory`` itself when it holds presharded weights (``save(dir, sharded_weights=True)``)."""
    if bk.is_neuron:
        raise ValueError("On Neuron, load with the library itself (model.load(dir) before to_neuron()); see the "
                         "notebook's Neuron cells")
    cls = reference_class(settings.get("tp_degree", 1))
    return cls.from_pretrained(model_path, device=bk.device, **settings).load(directory).to_neuron()
