"""helpers: the shared package behind the Neuron LLM inference notebooks.

A house of floors: each folder is one layer and imports only the floors below it (tests/test_house.py
checks it), from the ground up:

- ``model_store``, ``prompts`` (ground floor): checkpoints, the HF oracle, prompts; import nothing from helpers
- ``planning/``: the pinned libraries' rules (dtypes, buckets, GQA, tp degrees) and the planners; imports the ground
- ``engine/``: the reference engine: model, weights, CPU kernels, int8, the sampling loop; imports planning, ground
- ``artifacts/``: graphs compiled ahead of time, their persistence, ``NeuronModel``; imports engine and below
- ``parallel/``: tensor parallelism, one process per rank (``ParallelModel``); imports artifacts and below
- ``serving/``: many requests through one model (KV-cache slots, continuous vs static batching; a block KV cache with
  prefix reuse); imports engine and below
- ``neuron/``: the adapter to the real SDKs (transformers-neuronx, NxD Inference); imports engine and below
- ``notebook/``: what the notebooks share (backend, ``build_model``, reports, plots, metrics); imports every floor
- ``helpers`` (this face): the names notebooks call as ``helpers.xxx``
"""
import warnings

# Before anything imports tqdm.auto (transformers, huggingface_hub): in a kernel without ipywidgets (papermill, CI,
# a plain Jupyter install) it falls back to the text progress bar, as wanted, but first warns "IProgress not found.
# Please update jupyter and ipywidgets": a remark on the reader's environment, not on the lesson, printed as a red
# stderr block in the first code cell of every notebook. Only that one warning is filtered.
warnings.filterwarnings("ignore", message="IProgress not found")

from .artifacts.model import LlamaForSampling, MistralForSampling, NeuronAutoModelForCausalLM, NeuronModel
from .engine.config import NeuronConfig
from .model_store import load_hf_model, load_tokenizer, resolve_model_path
from .notebook.backend import Backend, resolve_backend, run_reference_cell
from .notebook.build import build_model, load_model
from .notebook.metrics import write_metrics
from .planning.gqa import GQA

__all__ = [
    "build_model", "load_model",
    "Backend", "resolve_backend", "run_reference_cell", "GQA", "NeuronConfig",
    "LlamaForSampling", "MistralForSampling", "NeuronAutoModelForCausalLM", "NeuronModel",
    "write_metrics", "load_hf_model", "load_tokenizer", "resolve_model_path",
]
