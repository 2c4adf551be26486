"""helpers: the shared package behind the Neuron LLM inference notebooks.

A house of floors: each folder is one layer and imports only the floors below it (tests/test_house.py
checks it), from the ground up:

- ``helpers.model_store``, ``helpers.prompts``: the ground floor: checkpoints (the embedded SmolLM2, the HF oracle) and prompts; import nothing from helpers
- ``helpers.planning``: the pinned libraries' rules (dtypes, buckets, GQA, tp degrees) and the planners (memory, buckets, config search); imports the ground floor
- ``helpers.engine``: the reference engine (model, weights, CPU kernels, int8, sampling loop, speculation); imports planning and the ground floor
- ``helpers.artifacts``: graphs compiled ahead of time and their persistence, and ``NeuronModel``; imports engine and below
- ``helpers.parallel``: tensor parallelism, one process per rank (``ParallelModel``, ``python -m helpers.parallel``); imports artifacts and below
- ``helpers.neuron``: the adapter to the real SDKs (transformers-neuronx, NxD Inference); imports engine and below
- ``helpers.notebook``: what the notebooks share (backend switch, ``build_model``, reports, plots, metrics); imports every floor
- ``helpers`` (this face): the names notebooks call as ``helpers.xxx``
"""
from .artifacts.model import LlamaForSampling, MistralForSampling, NeuronAutoModelForCausalLM, NeuronModel
from .engine.config import NeuronConfig
from .model_store import load_hf_model, load_tokenizer, resolve_model_path
from .notebook.backend import Backend, resolve_backend, run_neuron_cell, run_reference_cell
from .notebook.build import build_model, load_model
from .notebook.metrics import write_metrics
from .planning.gqa import GQA

__all__ = [
    "build_model", "load_model",
    "Backend", "resolve_backend", "run_neuron_cell", "run_reference_cell", "GQA", "NeuronConfig",
    "LlamaForSampling", "MistralForSampling", "NeuronAutoModelForCausalLM", "NeuronModel",
    "write_metrics", "load_hf_model", "load_tokenizer", "resolve_model_path",
]
