"""transformers_neuronx/modeling_auto.py (v0.13.0): dispatch on the checkpoint's model_type."""
from transformers_neuronx.base import _read_config
from transformers_neuronx.llama.model import LlamaForSampling
from transformers_neuronx.mistral.model import MistralForSampling

# Only the transcribed classes; the real mapping also has bloom, gpt2, gpt_neox, gptj, mixtral, opt.
NEURON_MODEL_FOR_CAUSAL_LM_MAPPING = {"code_llama": LlamaForSampling, "llama": LlamaForSampling,
                                      "mistral": MistralForSampling}


class NeuronAutoModelForCausalLM:
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        model_type = _read_config(pretrained_model_name_or_path).get("model_type")
        if model_type not in NEURON_MODEL_FOR_CAUSAL_LM_MAPPING:
            raise AssertionError(f"The configuration model type '{model_type}' is not supported by Neuron")
        return NEURON_MODEL_FOR_CAUSAL_LM_MAPPING[model_type].from_pretrained(
            pretrained_model_name_or_path, *model_args, **kwargs)
