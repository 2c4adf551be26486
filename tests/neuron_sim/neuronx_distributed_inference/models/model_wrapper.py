"""neuronx_distributed_inference/models/model_wrapper.py at aws-neuron/neuronx-distributed-inference cd3abf3
(SDK 2.28.0): ModelWrapper's model tags, bucket selection and input checks.

Transcribed: ``get_target_bucket`` / ``_get_seq_bucket`` / ``_get_batch_and_seq_bucket`` /
``get_target_2d_bucket_for_prefix_caching`` (copied from the source; "first_fit": the first bucket with
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
from neuronx_distributed_inference._continuous_batching import forward_slots

CONTEXT_ENCODING_MODEL_TAG = "context_encoding_model"
TOKEN_GENERATION_MODEL_TAG = "token_generation_model"
SPECULATION_MODEL_TAG = "speculation_model"
MEDUSA_MODEL_TAG = "medusa_speculation_model"
FUSED_SPECULATION_MODEL_TAG = "fused_speculation_model"


# Get the modules_to_not_convert from the neuron configs
def get_modules_to_not_convert(neuron_config):
    return getattr(neuron_config, "modules_to_not_convert", None)


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
        self.is_medusa = config.neuron_config.is_medusa
        self.is_batch_bucketing = self.neuron_config.token_generation_batches is not None
        self.async_mode = self.neuron_config.async_mode
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

        if self.is_batch_bucketing and self.tag == TOKEN_GENERATION_MODEL_TAG:
            input_batch_size = args[3].shape[0]  # seq_ids
            return self._get_batch_and_seq_bucket(
                buckets, input_batch_size, input_len, speculation_length, strategy
            )

        return self._get_seq_bucket(buckets, input_len, speculation_length, strategy)

    def _get_batch_and_seq_bucket(self, buckets, input_batch_size, input_len, speculation_length, strategy):
        """
        Batch and sequence bucket selection.
        """
        # TODO add support for async
        if strategy != "first_fit":
            raise ValueError(
                f"{strategy=} is currently not supported for batch bucketing. "
                "Only strategy='first_fit' is supported."
            )

        required_len = input_len + speculation_length
        smallest_fitting = None
        largest_overall = None

        for bucket in buckets:
            assert isinstance(bucket, list) and len(bucket) == 2, (
                f"Expected 2D buckets [batch_size, seq_len] for batch bucketing, "
                f"but got bucket={bucket}"
            )

            batch_size, seq_len = bucket

            # Track the largest bucket overall (for fallback)
            # Select the largest batch size, then the largest sequence length
            if largest_overall is None:
                largest_overall = bucket
            elif batch_size > largest_overall[0]:
                largest_overall = bucket
            elif batch_size == largest_overall[0] and seq_len > largest_overall[1]:
                largest_overall = bucket

            # Track the smallest bucket that fits
            if input_batch_size <= batch_size and required_len <= seq_len:
                if smallest_fitting is None:
                    smallest_fitting = bucket
                elif batch_size < smallest_fitting[0]:
                    smallest_fitting = bucket
                elif batch_size == smallest_fitting[0] and seq_len < smallest_fitting[1]:
                    smallest_fitting = bucket

        if smallest_fitting is not None:
            return smallest_fitting

        if largest_overall is not None:
            # Make sure the largest bucket is valid
            if self.neuron_config.allow_input_truncation and largest_overall[0] >= input_batch_size:
                return largest_overall

        raise ValueError(
            f"Input batch_size={input_batch_size}, seq_len={input_len} exceeds "
            f"largest bucket batch_size={largest_overall[0]}, seq_len={largest_overall[1]} "
            f"for {self.tag}. Available buckets are {buckets}."
        )

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

    def get_target_2d_bucket_for_prefix_caching(self, *args, strategy="first_fit"):
        """
        * We have active_len and prefix_len which are runtime variables.
        * We have S_prefix, S_active, block_length, spec_len which are compile time constants.

        CTE (Always BS=1 with continuous batching):
          - Non Eagle flow:
            * Find the smallest S_active bucket that is bigger than active_len
            * Find the smallest S_prefix bucket which fits prefix_len - (S_active - active_len)
          - Eagle flow (We need to recompute 1 additional block for target):
            * Find the smallest S_active bucket that is bigger than active_len + block_length
            * Find the smallest S_prefix bucket which fits prefix_len - (S_active - active_len - block_length)
        TKG:
            * Find the smallest S_active bucket that is bigger than active_len
        SPEC:
            * Find the smallest S_active bucket that is bigger than active_len + spec_len

        Corner Case:
            * Based on perf collection results, for 256 < (prefix_len + active_len) <= 512,
              use 512 prefill, 0 prefix bucket for serving the CTE request.
        """
        if strategy not in ("first_fit", "second_fit"):
            raise ValueError("Strategy must be either \"first_fit\" or \"second_fit\"")

        buckets = torch.tensor(self.neuron_config.buckets, dtype=torch.int32)
        speculation_length = (
            self.neuron_config.speculation_length
            if self.tag == FUSED_SPECULATION_MODEL_TAG
            else 0
        )
        # Speculation length already accounted for and handled with bucketing strategy in async.
        if self.async_mode:
            speculation_length = 0

        if self.neuron_config.enable_fused_speculation:
            vertical_dim = args[9]
            horizontal_dim = args[10]
        else:
            vertical_dim = args[13]
            horizontal_dim = args[14]

        if not self.tag == CONTEXT_ENCODING_MODEL_TAG:
            # Determine all buckets that meet horizontal condition
            horizontal_max = torch.max(horizontal_dim)
            horizontal_mask = buckets[:, 1] > horizontal_max + speculation_length

            # Determine all buckets that meet vertical condition
            vertical_max = torch.max(vertical_dim)
            vertical_mask = buckets[:, 0] >= vertical_max

            mask = horizontal_mask & vertical_mask
            final_buckets = buckets[mask]
            final_indices = torch.arange(len(buckets))[mask]

            # Take the remaining bucket smallest along the horizontal dimension
            if final_buckets.shape[0] > 0:
                selected_index = torch.argmin(final_buckets[:, 1])
                bucket_idx = final_indices[selected_index]
                if strategy == "second_fit":
                    bucket_idx = min(bucket_idx + 1, len(buckets) - 1)
            # If no buckets remain, take the largest bucket if input truncation enabled
            else:
                if not self.neuron_config.allow_input_truncation:
                    raise ValueError(
                        f"Input len {vertical_dim} exceeds largest bucket ({buckets[-1][1]}) for {self.tag}"
                    )
                else:
                    bucket_idx = -1
            return buckets[bucket_idx]
        # recover the bucket for special handling
        else:
            horizontal_dim = horizontal_dim[0][0]
            vertical_dim = vertical_dim[0][0]
            prefix_buckets = []
            prefill_buckets = []
            for b in buckets:
                if b[0] not in prefill_buckets:
                    prefill_buckets.append(b[0])
                if b[1] not in prefix_buckets:
                    prefix_buckets.append(b[1])
            # Corner case
            total_context = vertical_dim + horizontal_dim
            if total_context <= 512 and total_context > 256:
                for b in buckets:
                    if b[0] == 512 and b[1] == 0:
                        return b

            # Select prefill bucket
            prefill_index = 0
            if self.neuron_config.enable_eagle_speculation:
                vertical_dim = vertical_dim + self.neuron_config.pa_block_size
            for b in prefill_buckets:
                if vertical_dim > b:
                    prefill_index += 1
                else:
                    break
            # check prefill overflow
            if prefill_index == len(prefill_buckets):
                if not self.neuron_config.allow_input_truncation:
                    raise ValueError(
                        f"Prefill len {vertical_dim} exceeds largest bucket ({prefill_buckets[-1]}) for {self.tag}"
                    )
                else:
                    prefill_index = len(prefill_buckets) - 1
            # Select prefix bucket
            prefill_len = prefill_buckets[prefill_index]
            empty_prefill_slots = max(0, prefill_len - vertical_dim)
            if self.neuron_config.enable_eagle_speculation:
                # Calculate how many blocks can be moved from prefix to prefill.
                empty_prefill_block_slots = empty_prefill_slots // self.neuron_config.pa_block_size
                horizontal_dim = max(0, horizontal_dim - empty_prefill_block_slots * self.neuron_config.pa_block_size)
            else:
                horizontal_dim = max(0, horizontal_dim - empty_prefill_slots)
            prefix_index = 0
            for b in prefix_buckets:
                if horizontal_dim > b:
                    prefix_index += 1
                else:
                    break
            # TODO: Handle this corner scenario by using the largest prefix bucket and up the prefill bucket
            assert prefix_index != len(prefix_buckets), f"Prefix len {horizontal_dim} exceeds largest bucket {prefix_buckets[-1]} for {self.tag}"
            bucket_idx = prefill_index * len(prefix_buckets) + prefix_index
            return buckets[bucket_idx]

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
        bucket = self.get_target_2d_bucket_for_prefix_caching(*args)
        contract.record("nxdi.prefix_caching_bucket", tag=self.tag, bucket=tuple(int(x) for x in bucket))
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
