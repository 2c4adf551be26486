"""Stand-in of ``src/transformers_neuronx/llama/model.py`` (LlamaForSampling) at aws-neuron/transformers-neuronx
v0.13.0 (commit f4e3818).

``__init__`` (config, buckets, batch sizes, GQA fallback of the decoder it builds), ``forward``,
``speculative_forward`` and ``sample`` follow the source; the logits come from the repository's reference
engine at tp_degree=1 whatever ``tp_degree`` says (see ``transformers_neuronx.base``), never from Neuron.
Unknown keywords, which the source swallows in ``**kwargs``, raise ``ContractError``.
"""
import torch

import _neuron_contract as contract
from transformers_neuronx import base, bucket, dtypes, sampling
from transformers_neuronx.base import SWALLOWED
from transformers_neuronx.config import NeuronConfig
from transformers_neuronx.constants import KV_SHARD_PAD
from transformers_neuronx.llama.config import LlamaConfig


class LlamaForSampling(base.NeuronModelBase):

    def __init__(self, config, *, n_positions=2048, batch_size=1, amp='f32', tp_degree=2,
                 context_length_estimate=None, context_unroll=None, unroll=None,
                 neuron_config=None, prefixed_length=0, **kwargs):
        hint = " (prompt_batch_size exists only for GPT2ForSamplingWithContextBroadcasting)" \
            if "prompt_batch_size" in kwargs else ""
        contract.refuse_unknown("LlamaForSampling", kwargs, (), SWALLOWED + hint)
        config = LlamaConfig(config, n_positions, batch_size, amp, tp_degree)
        super().__init__()
        dtypes.to_torch_dtype(amp)  # llama/modules.py LlamaForCausalLM: a KeyError for an unknown amp
        self.context_pre_hook = None
        self.context_hook = None
        self.config = config
        self.neuron_config = neuron_config if neuron_config else NeuronConfig()
        if self.neuron_config.shard_over_sequence:
            n_kv_head = self.config.num_key_value_heads
            kv_shard_degree = self.config.tp_degree // n_kv_head
            assert kv_shard_degree <= KV_SHARD_PAD, "increase kv_shard degree is higher than default 128"
            import warnings
            warnings.warn(f"shard over sequence enabled, increasing n_positions {n_positions} by 128")
            if isinstance(n_positions, list):
                npos = sorted(n_positions)
                npos[-1] += KV_SHARD_PAD
            else:
                npos = n_positions + KV_SHARD_PAD
            self.config.n_positions = npos
            config.n_positions = npos
            n_positions = npos
        if self.neuron_config.on_device_generation:
            self.neuron_config.on_device_generation.vocab_size = self.config.vocab_size

        self.layers_after_partition = self.neuron_config.auto_layer_partition(config.num_hidden_layers)
        self.prefixed_length = prefixed_length

        if context_unroll is None:
            context_unroll = len(self.layers_after_partition)
        self.context_unroll = context_unroll

        if unroll is None:
            unroll = len(self.layers_after_partition)
        self.unroll = unroll

        self.token_buckets = bucket.token_sizes(n_positions)
        self.context_buckets = bucket.context_sizes(context_length_estimate, self.token_buckets)
        if neuron_config and neuron_config.sequence_parallel_norm:
            for bucket_size in self.context_buckets:
                if bucket_size > neuron_config.sequence_parallel_norm_threshold and \
                        bucket_size % self.config.tp_degree != 0:
                    raise ValueError(
                        f"Sequence parallel normalization requires the bucket size ({bucket_size}) to be divisible "
                        f"by the tensor parallel degree ({self.config.tp_degree})")
        self.window_context_buckets = []
        if prefixed_length:
            if prefixed_length not in self.context_buckets:
                self.context_buckets.append(prefixed_length)
                self.context_buckets = sorted(self.context_buckets)

        self.batch_sizes = bucket.batch_sizes(batch_size)
        self.context_batch_sizes = [1] if self.neuron_config and self.neuron_config.continuous_batching \
            else self.batch_sizes
        # decoder.DecoderLmHeadForSamplingNoEmbedding(...) runs check_gqa_fallback on the caller's NeuronConfig
        base.check_gqa_fallback(self.neuron_config, config.num_attention_heads, config.num_key_value_heads,
                                config.attention_head_size, tp_degree, self.batch_sizes)
        self.decoder_lm_head_for_speculation = {}
        self.decoder_lm_head_for_window_context = {}
        self._init_stand_in()

    def forward(self, input_ids, cache_ids=None, start_ids=None, last_token_id=None, input_embeddings=None, **kwargs):
        self._require_compiled("forward()")
        contract.refuse_unknown("LlamaForSampling.forward", kwargs, (), "ignores unknown **kwargs")
        if last_token_id is not None or input_embeddings is not None:
            raise NotImplementedError("forward(last_token_id=..., input_embeddings=...) is not computed by the stand-in")
        return self._forward_logits(input_ids, cache_ids, start_ids)

    def speculative_forward(self, input_ids, cache_ids=None, start_ids=None, speculation_length=None):
        """Logits [tokens, vocab, batch] of every position, from the speculation graph (k, batch size)."""
        self._require_compiled("speculative_forward()")
        if self.neuron_config and self.neuron_config.continuous_batching:
            raise NotImplementedError("continuous batching is not computed by the stand-in")
        else:
            batch_size, *_ = input_ids.shape
            if start_ids is None:
                start_ids = torch.zeros(batch_size, dtype=torch.int32)
            if cache_ids is None:
                batch_size, context_length = input_ids.shape
                cache_ids = torch.arange(context_length, dtype=torch.int32)
                if self.neuron_config.use_2d_cache_ids:
                    cache_ids = cache_ids.unsqueeze(0).expand(batch_size, context_length)
            inputs, *args = input_ids, cache_ids, start_ids

        batch_size, seq_len = input_ids.shape
        if speculation_length is None:
            graph = None  # the token-generation decoder; the slicing below then fails as in the source
        elif speculation_length not in self.decoder_lm_head_for_speculation.keys():
            # auto-infer speculation bucket, if needed (the keys are (k, batch_size) pairs: always taken)
            speculation_buckets = [k for (k, batch_size) in self.decoder_lm_head_for_speculation.keys()]
            speculation_length = bucket.find(speculation_buckets, seq_len)
            graph = self.decoder_lm_head_for_speculation[speculation_length, batch_size]
            if input_ids.shape[-1] > speculation_length:
                input_ids = input_ids[:, :speculation_length]
        else:
            graph = self.decoder_lm_head_for_speculation[speculation_length, batch_size]

        if graph is not None and inputs.shape[-1] != graph["n_active_tokens"]:
            raise contract.ContractError(
                f"speculative_forward: the speculation graph for k={graph['n_active_tokens']} takes exactly "
                f"{graph['n_active_tokens']} tokens, got {inputs.shape[-1]} (its HLO has fixed shapes)")
        if graph is None:
            logits = torch.zeros(self.config.vocab_size, seq_len, batch_size)
        else:
            logits = self._all_logits(inputs, args[0], args[1]).permute(2, 1, 0)  # the graph's [vocab, n, batch]
        logits = self._cast_logits(logits)
        logits = logits[:self.config.vocab_size, -speculation_length:, :]
        logits = logits.transpose(0, 1)
        return logits

    def sample(self, input_ids, sequence_length, cache_ids=None, start_ids=None,
               top_k=50, top_p=1.0, eos_token_override=None, temperature=1.0, streamer=None,
               stopping_criteria_list=None, no_repeat_ngram_size=None, **kwargs):
        self._require_compiled("sample()")
        contract.refuse_unknown("LlamaForSampling.sample", kwargs, (), "ignores unknown **kwargs")

        if self.neuron_config.on_device_generation:
            return sampling.sample_tokens(self, input_ids, start_ids, sequence_length=sequence_length,
                                          config=self.neuron_config.on_device_generation, streamer=streamer,
                                          cache_ids=cache_ids)

        if self.context_pre_hook is not None:
            self.context_pre_hook()
        batch_size, context_length = input_ids.shape
        if batch_size not in self.batch_sizes:
            raise ValueError(
                f"Model not compiled for batch_size : {batch_size}. Acceptable batch_size is one of the following "
                f"{self.batch_sizes}")
        prefixed_length = self.prefixed_length

        if context_length < prefixed_length:
            self.prefixed_length = 0
        else:
            input_ids = input_ids[:, prefixed_length:]
            context_length -= prefixed_length
            sequence_length -= prefixed_length

        self._check_padding(input_ids, start_ids)
        contract.record("tnx.LlamaForSampling.sample", sequence_length=sequence_length, top_k=top_k)
        result = sampling.sample_llama(
            self, input_ids, start_ids, sequence_length,
            eos_token_id=self.config.eos_token_id if eos_token_override is None else eos_token_override,
            top_k=top_k, top_p=top_p, temperature=temperature, streamer=streamer,
            stopping_criteria_list=stopping_criteria_list, no_repeat_ngram_size=no_repeat_ngram_size,
            cache_ids=cache_ids,
        )

        return result
