"""Stand-in of ``src/transformers_neuronx/modeling_auto.py`` at aws-neuron/transformers-neuronx v0.13.0
(commit f4e3818): dispatch on the checkpoint's model type. The source maps transformers' config classes
first, then falls back to ``config.model_type``; config.json's ``model_type`` is read directly here."""
from transformers_neuronx.base import _auto_config
from transformers_neuronx.llama.model import LlamaForSampling
from transformers_neuronx.mistral.model import MistralForSampling

# Only the transcribed classes; the real mapping also has bloom, gpt2, gpt_neox, gptj, mixtral, opt.
NEURON_MODEL_FOR_CAUSAL_LM_MAPPING = {
    "code_llama": LlamaForSampling,
    "llama":      LlamaForSampling,
    "mistral":    MistralForSampling,
}


class NeuronAutoModelForCausalLM:

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        config = _auto_config(pretrained_model_name_or_path)

        if hasattr(config, "model_type"):
            model_type = config.model_type
        else:
            raise AssertionError(f"Models based on '{type(config)}' are not supported by Neuron")

        if model_type not in NEURON_MODEL_FOR_CAUSAL_LM_MAPPING:
            raise AssertionError(f"The configuration model type '{model_type}' is not supported by Neuron")

        model_class = NEURON_MODEL_FOR_CAUSAL_LM_MAPPING[model_type]
        return model_class.from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
