"""neuronx_distributed_inference/models/model_base.py at aws-neuron/neuronx-distributed-inference cd3abf3
(SDK 2.28.0, NxD Inference 0.8): NeuronBaseForCausalLM, the part a generate loop drives.

Transcribed:

- the sub-models built in ``__init__``: a context-encoding model always, then *either* a speculation model
  (``speculation_length > 0``) *or* a token-generation model, never both. A model compiled with
  ``speculation_length > 0`` therefore has no ``token_generation_model``: a plain ``generate()`` (no
  ``assistant_model``) on it fails at its first one-token step with
  ``AttributeError: 'NeuronLlamaForCausalLM' object has no attribute 'token_generation_model'``
  (``speculation_length=1`` excepted: its one-token steps go to the speculation model);
- ``forward``'s signature and dispatch (``_get_model_outputs``): context encoding when
  ``position_ids.min() == 0``, the speculation model when the input has ``speculation_length`` tokens, the
  token-generation model otherwise; ``kv_cache_populated`` set by context encoding and cleared by ``reset``;
- the output (``_construct_output``): ``CausalLMOutputWithPast(logits=..., hidden_states=...)`` with
  ``.tokens``; logits ``[batch, 1, vocab]`` for context encoding and token generation,
  ``[batch, speculation_length, vocab]`` for the speculation model.

Padding: ``padding_side='right'`` (the default) only; see ``_reference.py`` for what is refused and why.

Prefix caching (``is_prefix_caching`` + ``is_block_kv_layout``): the dispatch with block tables, slot mappings and
context lengths, the inferred attention mask and the two-dimensional buckets, in
``neuronx_distributed_inference/_prefix_caching.py``.

Not transcribed: fused speculation, EAGLE, Medusa, async mode, chunked prefill, LoRA, tensor
replacement / capture (they raise NotImplementedError). Numbers: the reference engine at tp_degree=1
(``neuronx_distributed_inference/_reference.py``).
"""
import copy
import logging
from typing import Callable, List, Optional, Tuple, Union

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from neuronx_distributed_inference import _prefix_caching
from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
from neuronx_distributed_inference.models.model_wrapper import (
    CONTEXT_ENCODING_MODEL_TAG,
    SPECULATION_MODEL_TAG,
    TOKEN_GENERATION_MODEL_TAG,
    ModelWrapper,
)
from neuronx_distributed_inference.modules import autobucketing
from neuronx_distributed_inference.modules.generation.sampling import (
    infer_sampling_params,
    prepare_sampling_params,
    validate_sampling_params,
)


class NeuronBaseForCausalLM(NeuronApplicationBase):
    _model_cls = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

        self.text_config = self.config.get_text_config()
        self.vocab_size = self.text_config.vocab_size
        self.padding_side = self.neuron_config.padding_side
        self.kv_cache_populated = False

        self.async_mode = self.neuron_config.async_mode
        if self.async_mode:
            raise NotImplementedError("stand-in: async_mode is not transcribed")
        for flag in ("enable_fused_speculation", "is_medusa", "is_chunked_prefill", "on_device_sampling_config",
                     "tensor_replacement_config", "tensor_capture_config"):
            if getattr(self.neuron_config, flag):
                raise NotImplementedError(f"stand-in: {flag} is not transcribed")
        self.is_prefix_caching = self.neuron_config.is_prefix_caching
        if self.is_prefix_caching or self.neuron_config.is_block_kv_layout:
            _prefix_caching.check_config(self.neuron_config)

        self.sampler = None
        self.default_sampling_params = prepare_sampling_params(
            batch_size=self.neuron_config.batch_size, top_k=[1], top_p=[1.0], temperature=[1.0]
        )
        self.model_wrapper = self.get_model_wrapper_cls()

        self.enable_context_encoding()
        if self.neuron_config.speculation_length > 0:
            self.enable_speculation()
        elif self.neuron_config.medusa_speculation_length > 0:
            raise NotImplementedError("stand-in: Medusa speculation is not transcribed")
        else:
            self.enable_token_generation()

        for model in self.models:
            assert (
                model.neuron_config.is_prefill_stage is not None
            ), f"{model.tag} doesn't indicate whether it is part of the prefill or generation step."

    def get_model_wrapper_cls(self):
        return ModelWrapper

    def _wrapper(self, new_config, tag):
        wrapper = self.model_wrapper(config=new_config, model_cls=self._model_cls, tag=tag,
                                     compiler_args=self.get_compiler_args(), priority_model_idx=(
                                         None if tag == CONTEXT_ENCODING_MODEL_TAG else 0))
        wrapper._application = [self]  # stand-in: the reference engine behind the graphs (not a submodule)
        return wrapper

    def enable_context_encoding(self, **model_init_kwargs):
        new_config = copy.deepcopy(self.config)
        new_config.neuron_config.batch_size = self.neuron_config.ctx_batch_size
        new_config.neuron_config.n_active_tokens = self.neuron_config.max_context_length
        new_config.neuron_config.bucket_n_active_tokens = True
        new_config.neuron_config.is_prefill_stage = True

        new_config.neuron_config.buckets = autobucketing.generate_buckets_for_cte(new_config)

        self.context_encoding_model = self._wrapper(new_config, CONTEXT_ENCODING_MODEL_TAG)
        self.models.append(self.context_encoding_model)

    def enable_token_generation(self, enable_wlt_optimization: bool = True, **model_init_kwargs):
        new_config = copy.deepcopy(self.config)
        new_config.neuron_config.batch_size = self.neuron_config.tkg_batch_size
        new_config.neuron_config.n_active_tokens = 1
        new_config.neuron_config.bucket_n_active_tokens = False
        new_config.neuron_config.sequence_parallel_enabled = False
        new_config.neuron_config.is_prefill_stage = False

        new_config.neuron_config.buckets = autobucketing.generate_buckets_for_tkg(new_config)

        self.token_generation_model = self._wrapper(new_config, TOKEN_GENERATION_MODEL_TAG)
        self.models.append(self.token_generation_model)

    def enable_speculation(self, enable_wlt_optimization: bool = True, **model_init_kwargs):
        new_config = copy.deepcopy(self.config)
        new_config.neuron_config.batch_size = self.neuron_config.spec_batch_size
        new_config.neuron_config.n_active_tokens = self.neuron_config.speculation_length
        new_config.neuron_config.bucket_n_active_tokens = False

        new_config.neuron_config.sequence_parallel_enabled = False
        new_config.neuron_config.is_prefill_stage = False

        new_config.neuron_config.buckets = autobucketing.generate_buckets_for_speculation(new_config)

        self.speculation_model = self._wrapper(new_config, SPECULATION_MODEL_TAG)
        self.models.append(self.speculation_model)

    def get_generation_model(self) -> ModelWrapper:
        if self.neuron_config.speculation_length > 0:
            return self.speculation_model
        else:
            return self.token_generation_model

    def preprocess_inputs(self,
                          input_ids: torch.LongTensor = None,
                          seq_ids: Optional[torch.LongTensor] = None,
                          attention_mask: Optional[torch.Tensor] = None,
                          position_ids: Optional[torch.LongTensor] = None,
                          past_key_values: Optional[List[torch.FloatTensor]] = None,
                          inputs_embeds: Optional[torch.FloatTensor] = None,
                          sampling_params: Optional[torch.FloatTensor] = None,
                          prev_hidden: Optional[torch.FloatTensor] = None,
                          labels: Optional[torch.LongTensor] = None,
                          use_cache: Optional[bool] = None,
                          output_attentions: Optional[bool] = None,
                          output_hidden_states: Optional[bool] = None,
                          adapter_ids: Optional[torch.LongTensor] = None,
                          medusa_args=None,
                          return_dict: Optional[bool] = None,
                          llava_args: Optional[List] = [],
                          input_capture_hook: Optional[Callable] = None,
                          slot_mapping: Optional[torch.LongTensor] = None,
                          block_table: Optional[torch.LongTensor] = None,
                          full_context_lens: Optional[torch.LongTensor] = None,
                          computed_context_lens: Optional[torch.LongTensor] = None,
                          rotary_position_ids: Optional[torch.LongTensor] = None,):
        if attention_mask is None and self.neuron_config.is_prefix_caching:
            attention_mask = _prefix_caching.infer_attention_mask(position_ids)
        if attention_mask is None:
            raise NotImplementedError("stand-in: attention_mask inferred from position_ids is not transcribed")

        if seq_ids is None:
            seq_ids = torch.arange(input_ids.shape[0])

        sampling_params = (
            self.default_sampling_params if sampling_params is None else sampling_params
        )
        self.validate_sampling_params(sampling_params)
        sampling_params = infer_sampling_params(sampling_params)
        self.sampling_params = sampling_params

        if input_capture_hook is not None and not self.kv_cache_populated:
            self.initial_input_size = len(input_ids[0])

        if input_capture_hook is not None:
            input_capture_hook(
                self, [input_ids, attention_mask, position_ids, seq_ids, sampling_params]
            )

        return input_ids, attention_mask, position_ids, seq_ids, sampling_params

    def forward(
        self,
        input_ids: torch.LongTensor = None,
        seq_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        past_key_values: Optional[List[torch.FloatTensor]] = None,
        inputs_embeds: Optional[torch.FloatTensor] = None,
        sampling_params: Optional[torch.FloatTensor] = None,
        prev_hidden: Optional[torch.FloatTensor] = None,
        labels: Optional[torch.LongTensor] = None,
        use_cache: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        output_hidden_states: Optional[bool] = None,
        adapter_ids: Optional[torch.LongTensor] = None,
        medusa_args=None,
        return_dict: Optional[bool] = None,
        llava_args: Optional[List] = [],
        input_capture_hook: Optional[Callable] = None,
        slot_mapping: Optional[torch.LongTensor] = None,
        block_table: Optional[torch.LongTensor] = None,
        full_context_lens: Optional[torch.LongTensor] = None,
        computed_context_lens: Optional[torch.LongTensor] = None,
        tf_args: Optional[List[torch.Tensor]] = None
    ) -> Union[Tuple, CausalLMOutputWithPast]:
        input_ids, attention_mask, position_ids, seq_ids, sampling_params = self.preprocess_inputs(
            input_ids=input_ids,
            seq_ids=seq_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            sampling_params=sampling_params,
            prev_hidden=prev_hidden,
            labels=labels,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            adapter_ids=adapter_ids,
            medusa_args=medusa_args,
            return_dict=return_dict,
            llava_args=llava_args,
            input_capture_hook=input_capture_hook,
            slot_mapping=slot_mapping,
            block_table=block_table,
            full_context_lens=full_context_lens,
            computed_context_lens=computed_context_lens)

        outputs, is_run_on_neuron = self._get_model_outputs(
            input_ids,
            attention_mask,
            position_ids,
            seq_ids,
            sampling_params,
            prev_hidden,
            adapter_ids,
            medusa_args,
            llava_args,
            slot_mapping,
            block_table,
            full_context_lens,
            computed_context_lens,
            tf_args=tf_args
        )
        logits_or_next_tokens = outputs
        constructed_outputs = self._construct_output(logits_or_next_tokens)

        if logging.root.isEnabledFor(logging.DEBUG):
            logging.debug("---output---")
            logging.debug(
                f"{'tokens' if self.on_device_sampling else 'logits'} = %s, ",
                logits_or_next_tokens,
            )

        return constructed_outputs

    def validate_sampling_params(self, params: torch.Tensor) -> None:
        if self.on_device_sampling:
            validate_sampling_params(params, self.neuron_config.on_device_sampling_config)

    def _is_prefill(self, position_ids):
        return position_ids.min().item() == 0

    def _get_model_outputs(
        self,
        input_ids,
        attention_mask,
        position_ids,
        seq_ids,
        sampling_params,
        prev_hidden,
        adapter_ids,
        medusa_args,
        llava_args,
        slot_mapping=None,
        block_table=None,
        full_context_lens=None,
        computed_context_lens=None,
        tf_args=None
    ):
        if self.neuron_config.is_prefix_caching:
            num_queries = full_context_lens - computed_context_lens
            is_context_encoding = input_ids.shape[-1] > 1 and not position_ids.min().item()
            self.base_model = self.context_encoding_model if is_context_encoding else self.token_generation_model
            outputs = self.base_model(
                input_ids, attention_mask, position_ids, seq_ids, sampling_params, torch.empty(0), adapter_ids,
                torch.empty(0), torch.empty(0), torch.empty(0), torch.empty(0),
                slot_mapping, block_table, num_queries, computed_context_lens, *llava_args,
            )
            return outputs, self.base_model.is_neuron()
        if self._is_prefill(position_ids):
            outputs = self.context_encoding_model(
                input_ids,
                attention_mask,
                position_ids,
                seq_ids,
                sampling_params,
                prev_hidden,
                adapter_ids,
                *llava_args,
            )
            self.kv_cache_populated = True
            is_run_on_neuron = self.context_encoding_model.is_neuron()
        elif input_ids.shape[-1] == self.neuron_config.speculation_length:
            outputs = self.speculation_model(
                input_ids,
                attention_mask,
                position_ids,
                seq_ids,
                sampling_params,
                prev_hidden,
                adapter_ids,
            )
            is_run_on_neuron = self.speculation_model.is_neuron()
        else:
            outputs = self.token_generation_model(
                input_ids,
                attention_mask,
                position_ids,
                seq_ids,
                sampling_params,
                prev_hidden,
                adapter_ids,
                *llava_args,
            )
            is_run_on_neuron = self.token_generation_model.is_neuron()

        return outputs, is_run_on_neuron

    def _construct_output(self, logits_or_next_tokens):
        next_tokens = logits_or_next_tokens

        OutputParams = CausalLMOutputWithPast(
            logits=None if self.on_device_sampling else logits_or_next_tokens,
            hidden_states=logits_or_next_tokens,
            attentions=None,
        )
        OutputParams.tokens = next_tokens
        return OutputParams

    def reset(self):
        # We need to reset the KV cache flag for a new batch of inference.
        # When the flag is reset, the subsequent run will invoke the
        # context encoding model.
        self.kv_cache_populated = False

    def get_required_kwargs(self) -> List[str]:
        """The list of required kwargs to the model's forward"""
        return []
