"""Stand-in of ``src/transformers_neuronx/llama/config.py`` at aws-neuron/transformers-neuronx v0.13.0
(commit f4e3818): the attributes LlamaForSampling reads from the Hugging Face config. Transcribed as is
(``utils.maybe_override_attributes`` included); this object's ``__dict__`` is what ``save(dir,
sharded_weights=True)`` writes as config.json."""


def maybe_override_attributes(self, kwargs):
    """utils.py ``maybe_override_attributes``."""
    for key, value in kwargs.items():
        if not hasattr(self, key):
            raise KeyError(f'Found invalid key "{key}".')
        if value is not None:
            setattr(self, key, value)


class LlamaConfig:

    def __init__(
            self,
            config,
            n_positions,
            batch_size,
            amp,
            tp_degree,
            **kwargs
        ):
        self.intermediate_size = config.intermediate_size
        self.hidden_size = config.hidden_size
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.num_attention_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads if hasattr(config, "num_key_value_heads") \
            else config.num_attention_heads
        self.num_hidden_layers = config.num_hidden_layers
        self.vocab_size = config.vocab_size
        self.hidden_act = config.hidden_act
        self.bos_token_id = config.bos_token_id
        self.eos_token_id = config.eos_token_id
        self.max_position_embeddings = config.max_position_embeddings
        self.rms_norm_eps = config.rms_norm_eps
        self.rotary_percentage = getattr(config, "rotary_percentage", 1)
        self.rope_theta = getattr(config, "rope_theta", 10000)
        self.position_interpolation_factor = getattr(config, "position_interpolation_factor", None)
        self.rope_scaling = getattr(config, "rope_scaling", None)
        rope_scaling_type = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", None)) \
            if self.rope_scaling is not None else None
        if self.rope_scaling is not None and rope_scaling_type not in {'default', 'llama3'}:
            raise ValueError(f"Only default and llama3 ropes scaling types are currently supported. "
                             f"Received {rope_scaling_type}")
        self.is_eagle = getattr(config, "is_eagle", False)
        self.bias = getattr(config, "bias", True)

        maybe_override_attributes(self, kwargs)

        self.n_positions = n_positions
        self.batch_size = batch_size
        self.amp = amp
        self.tp_degree = tp_degree
        self.model_type = 'llama'
