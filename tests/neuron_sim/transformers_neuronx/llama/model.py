"""transformers_neuronx/llama/model.py (v0.13.0): LlamaForSampling's signatures."""
import _neuron_contract as contract
from transformers_neuronx import base, sampling
from transformers_neuronx.base import SWALLOWED


class LlamaForSampling(base.NeuronModelBase):

    def __init__(self, config, *, n_positions=2048, batch_size=1, amp='f32', tp_degree=2,
                 context_length_estimate=None, context_unroll=None, unroll=None,
                 neuron_config=None, prefixed_length=0, **kwargs):
        hint = " (prompt_batch_size exists only for GPT2ForSamplingWithContextBroadcasting)" \
            if "prompt_batch_size" in kwargs else ""
        contract.refuse_unknown("LlamaForSampling", kwargs, (), SWALLOWED + hint)
        self._setup(config, n_positions, batch_size, amp, tp_degree, context_length_estimate, neuron_config)
        if prefixed_length and prefixed_length not in self.context_buckets:
            self.context_buckets = sorted(self.context_buckets + [prefixed_length])

    def forward(self, input_ids, cache_ids=None, start_ids=None, last_token_id=None, input_embeddings=None, **kwargs):
        self._require_compiled("forward()")
        contract.refuse_unknown("LlamaForSampling.forward", kwargs, (), "ignores unknown **kwargs")
        return self._logits(input_ids)

    def speculative_forward(self, input_ids, cache_ids=None, start_ids=None, speculation_length=None):
        self._require_compiled("speculative_forward()")
        import torch
        k = speculation_length or input_ids.shape[1]
        return torch.zeros(k, self.vocab_size, input_ids.shape[0])

    def sample(self, input_ids, sequence_length, cache_ids=None, start_ids=None, top_k=50, top_p=1.0,
               eos_token_override=None, temperature=1.0, streamer=None, stopping_criteria_list=None,
               no_repeat_ngram_size=None, **kwargs):
        self._require_compiled("sample()")
        contract.refuse_unknown("LlamaForSampling.sample", kwargs, (), "ignores unknown **kwargs")
        batch_size, *_ = input_ids.shape
        if batch_size not in self.batch_sizes:
            raise ValueError(f"Model not compiled for batch_size : {batch_size}. Acceptable batch_size is one of the "
                             f"following {self.batch_sizes}")
        self._check_padding(input_ids, start_ids)
        contract.record("tnx.LlamaForSampling.sample", sequence_length=sequence_length, top_k=top_k)
        eos = self.eos_token_id if eos_token_override is None else eos_token_override
        return sampling.sample_llama(self, input_ids, start_ids, sequence_length, eos_token_id=eos, top_k=top_k,
                                     top_p=top_p, temperature=temperature, streamer=streamer,
                                     stopping_criteria_list=stopping_criteria_list,
                                     no_repeat_ngram_size=no_repeat_ngram_size, cache_ids=cache_ids)
