"""neuronx_distributed_inference/models/llama/modeling_llama.py at aws-neuron/neuronx-distributed-inference
cd3abf3 (SDK 2.28.0): LlamaInferenceConfig (derived config, required attributes, padded hidden size) and
NeuronLlamaForCausalLM (config class, tied-embedding state dict). The Neuron modules (attention, MLP, decoder
layers) are not transcribed: the stand-in computes with the reference engine (see models/model_base.py).
"""
from typing import List, Type

from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig
from neuronx_distributed_inference.models.model_base import NeuronBaseForCausalLM


class LlamaInferenceConfig(InferenceConfig):
    def add_derived_config(self):
        self.num_cores_per_group = 1
        if self.neuron_config.flash_decoding_enabled:
            raise NotImplementedError("stand-in: flash decoding (calculate_num_cores_per_group) is not transcribed")

    def get_required_attributes(self) -> List[str]:
        return [
            "hidden_size",
            "num_attention_heads",
            "num_hidden_layers",
            "num_key_value_heads",
            "pad_token_id",
            "vocab_size",
            "max_position_embeddings",
            "rope_theta",
            "rms_norm_eps",
            "hidden_act",
        ]

    @classmethod
    def get_neuron_config_cls(cls) -> Type[NeuronConfig]:
        return NeuronConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.neuron_config.padded_hidden_size is not None and not hasattr(self, 'original_hidden_size'):
            self.original_hidden_size = self.hidden_size

        self.hidden_size = (
            self.neuron_config.padded_hidden_size
            if self.neuron_config.padded_hidden_size is not None
            else self.hidden_size
        )


class NeuronLlamaForCausalLM(NeuronBaseForCausalLM):
    """
    This class extends LlamaForCausalLM create traceable
    blocks for Neuron.
    """

    _model_cls = None  # NeuronLlamaModel in the release (not transcribed)

    @staticmethod
    def load_hf_model(model_path, **kwargs):
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM.from_pretrained(model_path, **kwargs)

    @staticmethod
    def update_state_dict_for_tied_weights(state_dict):
        state_dict["lm_head.weight"] = state_dict["embed_tokens.weight"].clone()

    @classmethod
    def get_config_cls(cls):
        return LlamaInferenceConfig
