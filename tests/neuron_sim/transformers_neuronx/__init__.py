"""Stand-in for transformers-neuronx 0.13 (tag v0.13.0, Neuron SDK 2.26): call signatures only.

Transcribed from ``src/transformers_neuronx/__init__.py``. Exports that no repository code uses
(BloomForSampling, GPT2ForSamplingWithContextBroadcasting, GPTNeoXForSampling, GPTJForSampling,
MixtralForSampling, OPTForSampling, SparseAttnConfig) are not transcribed: importing one fails,
so transcribe it from the source before using it.
"""
from transformers_neuronx.version import __version__
from transformers_neuronx.constants import GQA, Layout
from transformers_neuronx.config import NeuronConfig, QuantizationConfig, ContinuousBatchingConfig, GenerationConfig
from transformers_neuronx.generation_utils import HuggingFaceGenerationModelAdapter
from transformers_neuronx.llama.model import LlamaForSampling
from transformers_neuronx.mistral.model import MistralForSampling
from transformers_neuronx.modeling_auto import NeuronAutoModelForCausalLM
