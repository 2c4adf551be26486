"""neuronx_distributed_inference/models/model_wrapper.py at aws-neuron/neuronx-distributed-inference cd3abf3
(SDK 2.28.0): ModelWrapper's model tags, bucket selection and input checks.

Transcribed: ``get_target_bucket`` / ``_get_seq_bucket`` ("first_fit": the first bucket with
``input_len + speculation_length < bucket``, strict; the largest when equal or with ``allow_input_truncation``;
else ``ValueError: Input len N exceeds largest bucket (B) for <tag>``; ``input_len`` is the attention mask's
width), ``pad_inputs``' errors and truncation warnings, ``forward``'s "Forward called before load" error and
its handling of a batch smaller than the compiled one (rows repeated, results cut back). A batch larger than
the compiled one (the release runs it in slices) is not emulated.

With prefix caching, ``forward`` selects the (prefill, prefix) bucket as ``get_target_2d_bucket_for_prefix_caching``
and runs the block KV cache (``neuronx_distributed_inference/_prefix_caching.py``).

The graph itself is the reference engine (``neuronx_distributed_inference/_reference.py``).
"""
import logging
import warnings

import torch
import torch.nn.functional as F

import _neuron_contract as contract
from neuronx_distributed_inference import _prefix_caching
from neuronx_distributed_inference._continuous_batching import forward_slots

CONTEXT_ENCODING_MODEL_TAG = "context_encoding_model"
TOKEN_GENERATION_MODEL_TAG = "token_generation_model"
SPECULATION_MODEL_TAG = "speculation_model"
MEDUSA_MODEL_TAG = "medusa_speculation_model"
FUSED_SPECULATION_MODEL_TAG = "fused_speculation_model"


class ModelWrapper(torch.nn.Module):
    def __init__(
        self,
        config,
        model_cls,
        tag="",
        compiler_args: str = None,
        priority_model_idx: int = None,
        pipeline_execution: bool = False,
        return_ranked_to_cpu: bool = False,
        model_init_kwargs={},
    ) -> None:
        super().__init__()
        self.config = config
        self.neuron_config = config.neuron_config

        if not self.neuron_config.torch_dtype:
            self.neuron_config.torch_dtype = torch.float32

        if not hasattr(config, "pad_token_id") or config.pad_token_id is None:
            config.pad_token_id = 0

        self.model_cls = model_cls
        self.model = None  # the traced model, set by NeuronApplicationBase.load()
        self.is_compiled = False
        self.serialize_base_path = None
        self.tag = tag
        self.is_block_kv_layout = config.neuron_config.is_block_kv_layout
        self.is_prefix_caching = config.neuron_config.is_prefix_caching
        self.compiler_args = compiler_args
        self.priority_model_idx = priority_model_idx
        self.pipeline_execution = pipeline_execution
        self.return_ranked_to_cpu = return_ranked_to_cpu
        self.model_init_kwargs = model_init_kwargs
        self.is_batch_bucketing = self.neuron_config.token_generation_batches is not None
        self._application = [None]  # stand-in: where the reference engine lives (set by NeuronBaseForCausalLM)

    def is_neuron(self):
        return self.model is not None and isinstance(self.model, torch.jit.ScriptModule)

    def get_target_bucket(self, *args, strategy="first_fit"):
        input_len = args[1].shape[1]  # attention_mask
        buckets = self.neuron_config.buckets
        speculation_length = (
            self.neuron_config.speculation_length
            if self.tag in (FUSED_SPECULATION_MODEL_TAG, SPECULATION_MODEL_TAG)
            else 0
        )
        return self._get_seq_bucket(buckets, input_len, speculation_length, strategy)

    def _get_seq_bucket(self, buckets, input_len, speculation_length, strategy):
        """
        Sequence-only bucket selection
        """
        required_len = input_len + speculation_length
        largest = buckets[-1]

        for i, bucket in enumerate(buckets):
            if strategy == "first_fit" and required_len < bucket:
                return bucket
            if strategy == "second_fit" and input_len < bucket:
                return buckets[min(i + 1, len(buckets) - 1)]

        if required_len == largest or self.neuron_config.allow_input_truncation:
            return largest

        raise ValueError(
            f"Input len {input_len} exceeds largest bucket ({largest}) for {self.tag}"
        )

    def pad_inputs(self, *args, pad_type="first_fit"):
        """Bucket selection and the release's checks; the stand-in does not pad (the engine pads itself)."""
        VALID_PAD_TYPES = {"max", "first_fit", "second_fit"}
        assert (
            pad_type in VALID_PAD_TYPES
        ), f"Found {pad_type=}, when it should be one of: {VALID_PAD_TYPES=}"
        pad_length = (
            self.neuron_config.max_context_length
            if self.tag == CONTEXT_ENCODING_MODEL_TAG
            else self.neuron_config.max_length
        )
        if pad_type == "first_fit" or pad_type == "second_fit":
            pad_length = self.get_target_bucket(*args, strategy=pad_type)

        if self.tag == CONTEXT_ENCODING_MODEL_TAG:
            to_pad = args[:3]
            pad_lengths = [pad_length - arg.shape[1] for arg in to_pad]
            if any([pad_len < 0 for pad_len in pad_lengths]):
                if self.neuron_config.allow_input_truncation:
                    warnings.warn(
                        f"Truncating input ({to_pad[1].shape[1]} tokens) to max_context_length ({self.neuron_config.max_context_length} tokens). This may cause unexpected outputs."
                    )
                    args = (*[arg[:, :pad_length] for arg in to_pad], *args[3:])
                else:
                    raise ValueError(
                        f"Inputs supplied ({to_pad[1].shape[1]} tokens) are longer than max_context_length ({self.neuron_config.max_context_length} tokens). To truncate inputs, set allow_input_truncation=True."
                    )
        else:
            input_ids, attention_mask, *rest_of_args = args
            pad_len = pad_length - attention_mask.shape[1]
            if pad_len < 0:
                if self.neuron_config.allow_input_truncation:
                    warnings.warn(
                        f"Truncating attention mask (length={attention_mask.shape[1]}) to max_length ({self.neuron_config.max_length} tokens). This may cause unexpected outputs."
                    )
                    attention_mask = F.pad(attention_mask, (0, pad_len), "constant", 0)
                else:
                    raise ValueError(
                        f"Attention mask supplied (length={attention_mask.shape[1]}) is longer than max_length ({self.neuron_config.max_length} tokens). To truncate attention mask, set allow_input_truncation=True."
                    )
            args = (input_ids, attention_mask, *rest_of_args)
        return args

    def _forward_prefix_caching(self, *args):
        """args as NeuronBaseForCausalLM._get_model_outputs passes them with prefix caching: [11] slot_mapping,
        [12] block_table, [13] num_queries, [14] computed_context_lens."""
        if self.tag == CONTEXT_ENCODING_MODEL_TAG and args[0].shape[0] > 1:
            raise NotImplementedError("stand-in: a context-encoding batch of several prompts (the release pads "
                                      "each later) is not emulated: encode one prompt per call")
        bucket = _prefix_caching.target_2d_bucket(self.neuron_config.buckets, self.tag, args[13], args[14],
                                                  self.neuron_config.allow_input_truncation)
        contract.record("nxdi.prefix_caching_bucket", tag=self.tag, bucket=tuple(bucket))
        num_queries, computed = args[13], args[14]
        runtime = self._application[0]._runtime.prefix
        return runtime.run(args[0], args[2], args[11], args[12], num_queries + computed, computed)

    def _run(self, input_ids, attention_mask, position_ids):
        runtime = self._application[0]._runtime
        if self.tag == CONTEXT_ENCODING_MODEL_TAG:
            return runtime.context_encoding(input_ids, attention_mask, position_ids)
        if self.tag == SPECULATION_MODEL_TAG:
            return runtime.speculation(input_ids, attention_mask, position_ids)
        return runtime.token_generation(input_ids, attention_mask, position_ids)

    def forward(self, *args, pad_type="first_fit"):
        logging.debug(f"calling forward on network {self.tag}")

        if self.model is None:
            raise RuntimeError(
                "Forward called before load. Run load() or load_state_dict() making calling forward"
            )
        if self.neuron_config.is_prefix_caching:
            return self._forward_prefix_caching(*args)
        args = tuple(arg for arg in args if isinstance(arg, torch.Tensor))
        args = self.pad_inputs(*args, pad_type=pad_type)
        input_ids, attention_mask, position_ids, seq_ids = args[:4]
        runtime = self._application[0]._runtime
        if getattr(runtime, "continuous_batching", False):  # seq_ids name KV-cache rows (_continuous_batching.py)
            return forward_slots(self, runtime, input_ids, attention_mask, position_ids, seq_ids)
        input_batch_size = seq_ids.shape[0]
        batch_size = self.neuron_config.batch_size
        if input_batch_size == batch_size:
            return self._run(input_ids, attention_mask, position_ids)
        if input_batch_size > batch_size:
            raise NotImplementedError(f"stand-in: a batch of {input_batch_size} rows on a model compiled for "
                                      f"batch_size={batch_size} (the release runs it in slices) is not emulated")
        # _forward_with_pad: pad up to the compiled batch by repeating the first row, keep the real rows.
        extra = batch_size - input_batch_size

        def pad(t):
            return torch.cat([t, t[:1].expand(extra, *t.shape[1:])], dim=0)

        return self._run(pad(input_ids), pad(attention_mask), pad(position_ids))[:input_batch_size]
