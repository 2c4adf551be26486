"""transformers_neuronx/mistral/model.py (v0.13.0): MistralForSampling's signatures.

No prefixed_length, no cache_ids / no_repeat_ngram_size in sample(), no speculative decoding
(``decoder_lm_head_for_speculation`` is never set up, so enable_speculative_decoder fails).
"""
import _neuron_contract as contract
from transformers_neuronx import base, sampling
from transformers_neuronx.base import SWALLOWED
from transformers_neuronx.config import NeuronConfig

_SHARED_DEFAULT = NeuronConfig()  # the real default is one NeuronConfig instance shared by all calls
contract.CALLS.pop()  # not a call made by the code under test


class MistralForSampling(base.NeuronModelBase):

    def __init__(self, config, *, n_positions=2048, batch_size=1, amp='f32', tp_degree=2,
                 context_length_estimate=None, context_unroll=None, unroll=None,
                 neuron_config=_SHARED_DEFAULT, **kwargs):
        contract.refuse_unknown("MistralForSampling", kwargs, (), SWALLOWED)
        self._setup(config, n_positions, batch_size, amp, tp_degree, context_length_estimate, neuron_config)
        del self.decoder_lm_head_for_speculation

    def enable_speculative_decoder(self, speculation_length, batch_sizes=None, token_tree=None):
        raise AttributeError("'MistralForSampling' object has no attribute 'decoder_lm_head_for_speculation'")

    def forward(self, input_ids, cache_ids=None, start_ids=None):
        self._require_compiled("forward()")
        return self._logits(input_ids)

    def sample(self, input_ids, sequence_length, start_ids=None, top_k=50, top_p=1.0, eos_token_override=None,
               temperature=1.0, streamer=None, stopping_criteria_list=None):
        self._require_compiled("sample()")
        self._check_padding(input_ids, start_ids)
        contract.record("tnx.MistralForSampling.sample", sequence_length=sequence_length, top_k=top_k)
        eos = self.eos_token_id if eos_token_override is None else eos_token_override
        return sampling.sample_llama(self, input_ids, start_ids, sequence_length, eos_token_id=eos, top_k=top_k,
                                     top_p=top_p, temperature=temperature, streamer=streamer,
                                     stopping_criteria_list=stopping_criteria_list)
