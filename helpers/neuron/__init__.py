"""The adapter to the real Neuron SDKs: build and run the notebook's model with transformers-neuronx 0.13
(``tnx``, Neuron SDK 2.26) or NxD Inference 0.8 (``nxdi``, SDK 2.28, the last release for Inf2/Trn1).

Layer: above ``helpers.engine`` (and ``helpers.planning``, ``helpers.model_store``); imports nothing above.
The SDK itself is imported only inside the functions that call it: this package imports on any machine.

- ``runtime``: the stacks, which are installed, the instance family and its tp degrees, the runtime's environment
- ``settings``: the notebook's settings as each stack's keywords (:func:`neuron_settings`, pure)
- ``build``: :func:`build_neuron_model` (compile or load), checkpoints the pinned transformers read
- ``sampler``: ``NeuronSampler.sample()`` with the reference engine's signature on both stacks
- ``tracking``: a streamer that records each token and criteria that see them (the transformers-neuronx #75
  workaround, on every backend)
"""
from ..engine.sampling import start_ids_from_mask
from .build import (build_neuron_model, check_nxdi_compiled_dir, default_compiled_dir, neuron_model_dir,
                    nxdi_generation_adapter, read_hf_config)
from .runtime import (FAMILIES, STACK_NAMES, STACKS, check_tp_degree, check_visible_cores, configure_neuron_runtime,
                      detect_instance_family, installed_stacks, library_version, neuron_runtime_env, omp_threads_for)
from .sampler import NeuronSampler, finish_rows, greedy_token_acceptor, left_to_right_padding
from .settings import (NEURON_QUANT_MODES, NXDI_NEURON_CONFIG_KEYS, NeuronSettings, neuron_quant_settings,
                       neuron_settings)

__all__ = ["build_neuron_model", "check_nxdi_compiled_dir", "default_compiled_dir", "neuron_model_dir",
           "nxdi_generation_adapter", "read_hf_config", "FAMILIES", "STACK_NAMES", "STACKS", "check_tp_degree", "check_visible_cores",
           "configure_neuron_runtime", "detect_instance_family", "installed_stacks", "library_version",
           "neuron_runtime_env", "omp_threads_for", "NeuronSampler", "finish_rows", "greedy_token_acceptor",
           "left_to_right_padding", "start_ids_from_mask", "NEURON_QUANT_MODES", "NXDI_NEURON_CONFIG_KEYS",
           "NeuronSettings", "neuron_quant_settings", "neuron_settings"]
