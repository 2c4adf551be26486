"""Stand-in of transformers-neuronx 0.13 (aws-neuron/transformers-neuronx tag v0.13.0, commit f4e3818; Neuron
SDK 2.26) for the neuron lanes and the contract tests: the pinned public API, executable on any CPU.

Transcribed from ``src/transformers_neuronx/__init__.py``. Each module names the source file it transcribes.
The models compute their logits with the repository's reference engine (``helpers.engine``) at tp_degree=1;
sampling loops, speculation, buckets, GQA fallback, save/load naming and their errors are the source's.
Nothing here is a Neuron measurement. Exports that no repository code uses (BloomForSampling,
GPT2ForSamplingWithContextBroadcasting, GPTNeoXForSampling, GPTJForSampling,
MixtralForSampling, OPTForSampling, SparseAttnConfig) are not transcribed: importing one fails, so transcribe it
from the source before using it.
"""
from transformers_neuronx.version import __version__
from transformers_neuronx.constants import GQA, Layout
from transformers_neuronx.config import NeuronConfig, QuantizationConfig, ContinuousBatchingConfig, GenerationConfig
from transformers_neuronx.generation_utils import HuggingFaceGenerationModelAdapter
from transformers_neuronx.llama.model import LlamaForSampling
from transformers_neuronx.mistral.model import MistralForSampling
from transformers_neuronx.modeling_auto import NeuronAutoModelForCausalLM
