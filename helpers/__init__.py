"""helpers: the shared package behind the Neuron LLM inference notebooks.

- ``helpers.engine``: the reference engine (``LlamaForSampling`` & co., transformers-neuronx call shapes)
- ``helpers.backend``: the ``backend`` switch and the guards of Neuron-only cells
- ``helpers.model_store``: the embedded SmolLM2-135M-Instruct checkpoint and the HF oracle
- ``helpers.buckets``: Neuron bucket rules; ``helpers.sampling``: token selection
- ``helpers.parallel``: tensor parallelism (``ParallelModel``: one process per rank, gloo/nccl collectives)
- ``helpers.gqa``: GQA strategies of transformers-neuronx / NxD Inference and the per-rank head layouts
- ``helpers.planner``: memory per NeuronCore, instance facts; ``helpers.config_search``: the 004 search
- ``helpers.bucket_planner``: choose buckets from traffic; ``helpers.graphs``: per-bucket compiled graphs, save/load with fingerprints
"""
from .backend import Backend, resolve_backend, run_neuron_cell, run_reference_cell
from .build import build_model, load_model
from .config import GQA, NeuronConfig
from .engine import LlamaForSampling, MistralForSampling, NeuronAutoModelForCausalLM, NeuronModel
from .metrics import write_metrics
from .model_store import load_hf_model, load_tokenizer, resolve_model_path

__all__ = [
    "build_model", "load_model",
    "Backend", "resolve_backend", "run_neuron_cell", "run_reference_cell", "GQA", "NeuronConfig",
    "LlamaForSampling", "MistralForSampling", "NeuronAutoModelForCausalLM", "NeuronModel",
    "write_metrics", "load_hf_model", "load_tokenizer", "resolve_model_path",
]
