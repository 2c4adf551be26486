"""Stand-in of ``src/transformers_neuronx/mistral/model.py`` (MistralForSampling) at
aws-neuron/transformers-neuronx v0.13.0 (commit f4e3818).

As the source: no prefixed_length, no cache_ids / no_repeat_ngram_size in ``sample()``, no speculative
decoding (``decoder_lm_head_for_speculation`` is never set up, so ``enable_speculative_decoder`` raises
AttributeError and there is no ``speculative_forward``), and the default ``neuron_config`` is one NeuronConfig
instance shared by every model built without one. The logits come from the reference engine at tp_degree=1
(see ``transformers_neuronx.base``). Unknown keywords, swallowed by the source, raise ``ContractError``.
"""
import _neuron_contract as contract
from transformers_neuronx import base, bucket, dtypes, sampling
from transformers_neuronx.base import SWALLOWED
from transformers_neuronx.config import NeuronConfig
from transformers_neuronx.mistral.config import MistralConfig

_calls_before = len(contract.CALLS)


class MistralForSampling(base.NeuronModelBase):

    def __init__(self, config, *, n_positions=2048, batch_size=1, amp='f32', tp_degree=2,
                 context_length_estimate=None, context_unroll=None, unroll=None,
                 neuron_config=NeuronConfig(), **kwargs):
        contract.refuse_unknown("MistralForSampling", kwargs, (), SWALLOWED)
        config = MistralConfig(config, n_positions, batch_size, amp, tp_degree)
        super().__init__()
        dtypes.to_torch_dtype(amp)  # mistral/modules.py: a KeyError for an unknown amp
        self.context_pre_hook = None
        self.context_hook = None
        self.config = config
        self.neuron_config = neuron_config if neuron_config else NeuronConfig()
        if self.neuron_config.on_device_generation:
            self.neuron_config.on_device_generation.vocab_size = self.config.vocab_size
        if context_unroll is None:
            context_unroll = config.num_hidden_layers
        self.context_unroll = context_unroll

        if unroll is None:
            unroll = config.num_hidden_layers
        self.unroll = unroll

        self.token_buckets = bucket.token_sizes(n_positions)
        self.context_buckets = bucket.context_sizes(context_length_estimate, self.token_buckets)

        self.batch_sizes = bucket.batch_sizes(batch_size)
        self.context_batch_sizes = [1] if self.neuron_config and self.neuron_config.continuous_batching \
            else self.batch_sizes
        base.check_gqa_fallback(self.neuron_config, config.num_attention_heads, config.num_key_value_heads,
                                config.attention_head_size, tp_degree, self.batch_sizes)
        self._init_stand_in()

    def forward(self, input_ids, cache_ids=None, start_ids=None):
        self._require_compiled("forward()")
        return self._forward_logits(input_ids, cache_ids, start_ids)

    def sample(self, input_ids, sequence_length, start_ids=None,
               top_k=50, top_p=1.0, eos_token_override=None, temperature=1.0, streamer=None,
               stopping_criteria_list=None):
        self._require_compiled("sample()")

        if self.neuron_config.on_device_generation:
            return sampling.sample_tokens(self, input_ids, start_ids, sequence_length=sequence_length,
                                          config=self.neuron_config.on_device_generation, streamer=streamer)

        if self.context_pre_hook is not None:
            self.context_pre_hook()
        batch_size, context_length = input_ids.shape
        if batch_size not in self.batch_sizes:
            raise ValueError(f"Model not compiled for batch_size : {batch_size}. Acceptable batch_size is one of the "
                             f"following {self.batch_sizes}")

        self._check_padding(input_ids, start_ids)
        contract.record("tnx.MistralForSampling.sample", sequence_length=sequence_length, top_k=top_k)
        result = sampling.sample_llama(
            self, input_ids, start_ids, sequence_length,
            eos_token_id=self.config.eos_token_id if eos_token_override is None else eos_token_override,
            top_k=top_k, top_p=top_p, temperature=temperature, streamer=streamer,
            stopping_criteria_list=stopping_criteria_list
        )

        return result


del contract.CALLS[_calls_before:]  # the default NeuronConfig() above is not a call made by the code under test
