"""neuronx_distributed_inference/models/llama/modeling_llama.py (0.8.0): LlamaInferenceConfig,
NeuronLlamaForCausalLM."""
from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig


class LlamaInferenceConfig(InferenceConfig):
    def get_required_attributes(self):
        return ["hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
                "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps", "hidden_act"]

    @classmethod
    def get_neuron_config_cls(cls):
        return NeuronConfig


class NeuronLlamaForCausalLM(NeuronApplicationBase):
    @classmethod
    def get_config_cls(cls):
        return LlamaInferenceConfig
