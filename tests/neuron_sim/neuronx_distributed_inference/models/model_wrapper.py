"""neuronx_distributed_inference/models/model_wrapper.py at aws-neuron/neuronx-distributed-inference cd3abf3
(SDK 2.28.0): ModelWrapper's model tags, bucket selection and input checks.

Transcribed: ``get_target_bucket`` / ``_get_seq_bucket`` / ``_get_batch_and_seq_bucket`` /
``get_target_2d_bucket_for_prefix_caching`` (copied from the source; "first_fit": the first bucket with
``input_len + speculation_length < bucket``, strict; the largest when equal or with ``allow_input_truncation``;
else ``ValueError: Input len N exceeds largest bucket (B) for <tag>``; ``input_len`` is the attention mask's
width), ``pad_inputs`` (with ``_pad_prefix_caching_inputs``: the padding itself, its errors and truncation
warnings), ``forward``'s "Forward called before load" error, ``_process_args``, and which inputs ``forward`` hands
the compiled graphs: the whole batch when it has the compiled ``batch_size`` rows, else slices of it
(``vllm_cte_repadding``) and a last slice padded up to the compiled batch (``_pad_helper``, the padding of
``_forward_with_pad``).

**The graphs check shapes as on Neuron.** ``input_generator`` (transcribed) gives the example inputs each graph is
traced with, one tuple per bucket; the stand-in's ``model.pt`` keeps their shapes in an ``input_shape_map`` built as
neuronx-distributed's ``ModelBuilder`` builds it (trace/model_builder.py), and ``_forward`` hands every graph call to
that TorchScript module, whose ``router`` is neuronx-distributed's ``NxDModel.router`` (trace/spmd.py) verbatim:
inputs whose shapes no traced bucket has fail with ``torch.jit.Error`` ending ``builtins.ValueError: Input shape
[[...], ...] not found in input_shape_map: [...]``, as the release does, before anything is computed. (For
example a continuous-batching model with ``ctx_batch_size=1`` and ``batch_size=2``: a one-row context encoding
called without ``sampling_params`` brings the default ``[2, 3]`` sampling params of ``NeuronBaseForCausalLM`` to a
graph traced with ``[1, 3]``.)

A batch larger than the compiled one (the release runs it in slices) is routed slice by slice as published but
not computed (NotImplementedError), except with continuous batching (``_continuous_batching.py``).

With prefix caching, ``forward`` selects the (prefill, prefix) bucket as ``get_target_2d_bucket_for_prefix_caching``
and runs the block KV cache (``neuronx_distributed_inference/_prefix_caching.py``).

The padded inputs only go to the router: the reference engine computes on the caller's (truncated, not padded)
inputs, with its own buckets.

The graph itself is the reference engine (``neuronx_distributed_inference/_reference.py``).
"""
import logging
import warnings

import torch
import torch.nn.functional as F

import _neuron_contract as contract
from neuronx_distributed_inference._continuous_batching import forward_slots
from neuronx_distributed_inference.modules.generation.sampling import prepare_sampling_params
from neuronx_distributed_inference.modules.padding import pad_with_first_batchline

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

    def input_generator(
        self,
    ):
        """Generate a list of valid sample inputs containing one input list for each bucket."""
        inputs = []
        for bucket in self.neuron_config.buckets:
            batch_size = self.neuron_config.batch_size
            # Handle batch bucketing: bucket format is [batch_size, seq_len]
            # TODO add support for prefix caching
            if isinstance(bucket, list) and self.is_batch_bucketing and not self.neuron_config.is_prefix_caching:
                batch_size = bucket[0]
                seq_bucket = bucket[1]
                n_active_tokens = (
                    seq_bucket
                    if self.neuron_config.bucket_n_active_tokens
                    else self.neuron_config.n_active_tokens
                )
                attention_mask = torch.ones((batch_size, seq_bucket), dtype=torch.int32)
            elif isinstance(bucket, list) and self.neuron_config.is_prefix_caching:
                n_active_tokens = (
                    bucket[0]
                    if self.neuron_config.bucket_n_active_tokens
                    else self.neuron_config.n_active_tokens
                )
                prefix_size = bucket[1]
                if prefix_size == 0:
                    attention_mask = torch.zeros(1, dtype=torch.int32)
                else:
                    attention_mask = torch.ones((batch_size, prefix_size), dtype=torch.int32)
            else:
                n_active_tokens = (
                    bucket
                    if self.neuron_config.bucket_n_active_tokens
                    else self.neuron_config.n_active_tokens
                )
                attention_mask = torch.ones((batch_size, bucket), dtype=torch.int32)

            input_ids = torch.ones((batch_size, n_active_tokens), dtype=torch.int32)
            if self.tag != CONTEXT_ENCODING_MODEL_TAG and self.tag != MEDUSA_MODEL_TAG:
                position_ids = torch.ones((batch_size, n_active_tokens), dtype=torch.int32)
            else:
                position_ids = torch.arange(0, n_active_tokens, dtype=torch.int32).unsqueeze(0)
                position_ids = position_ids.repeat(batch_size, 1)
            seq_ids = torch.arange(0, batch_size, dtype=torch.int32)
            adapter_ids = torch.zeros((batch_size), dtype=torch.int32)

            # Get the count of sampling params currently supported.
            sampling_params_len = prepare_sampling_params(1).shape[1]
            sampling_params = torch.ones((batch_size, sampling_params_len), dtype=torch.float32)
            if self.neuron_config.on_device_sampling_config:
                if self.neuron_config.on_device_sampling_config.do_sample:
                    sampling_params[:, 0] = self.neuron_config.on_device_sampling_config.top_k
                    sampling_params[:, 1] = self.neuron_config.on_device_sampling_config.top_p
                    sampling_params[:, 2] = self.neuron_config.on_device_sampling_config.temperature

            hidden_states = (
                torch.zeros(
                    (batch_size, n_active_tokens, self.config.hidden_size),
                    dtype=self.config.neuron_config.torch_dtype,
                )
                if self.neuron_config.is_eagle_draft
                else torch.zeros((batch_size), dtype=torch.int32)
            )

            if self.is_medusa:
                raise NotImplementedError("stand-in: Medusa example inputs are not transcribed")
            elif self.is_prefix_caching:
                input_shape = self._get_input_shape_for_prefix_caching(
                    input_ids,
                    attention_mask,
                    position_ids,
                    seq_ids,
                    sampling_params,
                    batch_size,
                    n_active_tokens,
                    prefix_size,
                    adapter_ids,
                )
                inputs.append(input_shape)
            elif self.neuron_config.tensor_replacement_config:
                raise NotImplementedError("stand-in: tensor replacement example inputs are not transcribed")
            else:
                inputs.append(
                    (
                        input_ids,
                        attention_mask,
                        position_ids,
                        seq_ids,
                        sampling_params,
                        hidden_states,
                        adapter_ids,
                    )
                )

        return inputs

    def _get_input_shape_for_prefix_caching(
        self,
        input_ids,
        attention_mask,
        position_ids,
        seq_ids,
        sampling_params,
        batch_size,
        n_active_tokens,
        prefix_size,
        adapter_ids,
    ):
        if self.neuron_config.enable_fused_speculation and self.tag == FUSED_SPECULATION_MODEL_TAG:
            slot_mapping = torch.zeros((batch_size, self.neuron_config.speculation_length), dtype=torch.int32)
        else:
            slot_mapping = torch.zeros((batch_size, n_active_tokens), dtype=torch.int32)

        num_blocks = prefix_size // self.neuron_config.pa_block_size
        active_block_table = torch.zeros(1, dtype=torch.int32) if num_blocks == 0 else torch.zeros(
            (batch_size, num_blocks), dtype=torch.int32
        )

        num_queries = torch.full((batch_size, 1), n_active_tokens, dtype=torch.int32)
        computed_context_lens = torch.full((batch_size, 1), prefix_size, dtype=torch.int32)
        if self.neuron_config.enable_eagle_speculation or self.neuron_config.enable_fused_speculation:
            raise NotImplementedError("stand-in: EAGLE / fused speculation example inputs are not transcribed")
        return (
            input_ids,
            attention_mask,
            position_ids,
            seq_ids,
            sampling_params,
            torch.empty(0),  # prev_hidden
            adapter_ids,
            torch.empty(0),  # accepted_indices
            torch.empty(0),  # current_length
            torch.empty(0),  # medusa_mask
            torch.empty(0),  # scatter_index
            slot_mapping,
            active_block_table,
            num_queries,
            computed_context_lens,
        )

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
        """
        The following padding strategies are supported:

        1) "max": Pad to the max bucket length
            ex. If we have input_length = 8 and buckets [5, 15, 25, 35] we choose 35
            because 35 is the last (highest) bucket.
        2) "first_fit" (default): Pad to the nearest highest bucket.
            ex. If we have input_length = 8 and buckets [5, 15, 25, 35] we choose 15
            because while 8 is closer to bucket 5, we pad up, so the nearest highest is 15
        3) "second_fit": Pad to the second nearest highest bucket.
            ex. If we have input_length = 8 and buckets [5, 15, 25, 35] we choose 25
            because 15 is the next bucket, and 25 follows 15 as the "next next"
            or "second fit" bucket.
        """

        VALID_PAD_TYPES = {"max", "first_fit", "second_fit"}
        assert (
            pad_type in VALID_PAD_TYPES
        ), f"Found {pad_type=}, when it should be one of: {VALID_PAD_TYPES=}"
        pad_length = (
            self.neuron_config.max_context_length
            if self.tag == CONTEXT_ENCODING_MODEL_TAG
            else self.neuron_config.max_length
        )
        if isinstance(self.neuron_config.buckets[-1], list) and self.neuron_config.is_prefix_caching:
            return self._pad_prefix_caching_inputs(*args, pad_type=pad_type)

        if pad_type == "first_fit" or pad_type == "second_fit":
            target_bucket = self.get_target_bucket(*args, strategy=pad_type)
            # Handle batch bucketing: extract seq_len from [batch_size, seq_len]
            if isinstance(target_bucket, list) and self.is_batch_bucketing:
                pad_length = target_bucket[1]  # seq_len
            else:
                pad_length = target_bucket

        if self.tag == CONTEXT_ENCODING_MODEL_TAG:
            to_pad = args[:3]
            pad_lengths = [pad_length - arg.shape[1] for arg in to_pad]
            tensor_pad_vals = [self.config.pad_token_id, 0, 1]
            if any([pad_len < 0 for pad_len in pad_lengths]):
                if self.neuron_config.allow_input_truncation:
                    warnings.warn(
                        f"Truncating input ({to_pad[1].shape[1]} tokens) to max_context_length ({self.neuron_config.max_context_length} tokens). This may cause unexpected outputs."
                    )
                else:
                    raise ValueError(
                        f"Inputs supplied ({to_pad[1].shape[1]} tokens) are longer than max_context_length ({self.neuron_config.max_context_length} tokens). To truncate inputs, set allow_input_truncation=True."
                    )

            padded_args = [
                F.pad(arg, (0, pad_len), "constant", pad_val)
                for arg, pad_val, pad_len in zip(to_pad, tensor_pad_vals, pad_lengths)
            ]

            # (rotary_position_ids and vision inputs, args[21:], are never passed by the stand-in's models)
            args = (*padded_args, *args[3:])
        else:
            input_ids, attention_mask, *rest_of_args = args
            pad_len = pad_length - attention_mask.shape[1]
            if pad_len < 0:
                if self.neuron_config.allow_input_truncation:
                    warnings.warn(
                        f"Truncating attention mask (length={attention_mask.shape[1]}) to max_length ({self.neuron_config.max_length} tokens). This may cause unexpected outputs."
                    )
                else:
                    raise ValueError(
                        f"Attention mask supplied (length={attention_mask.shape[1]}) is longer than max_length ({self.neuron_config.max_length} tokens). To truncate attention mask, set allow_input_truncation=True."
                    )

            padded_attention_mask = F.pad(attention_mask, (0, pad_len), "constant", 0)
            args = (input_ids, padded_attention_mask, *rest_of_args)

        return args

    def _pad_prefix_caching_inputs(self, *args, pad_type="first_fit"):
        if self.tag == CONTEXT_ENCODING_MODEL_TAG and args[0].shape[0] > 1:
            # We delay all paddings for CTE until we really need them
            return args
        # Calculate the buckets
        prefill_bucket, prefix_bucket = self.get_target_2d_bucket_for_prefix_caching(*args, strategy=pad_type)

        if self.neuron_config.enable_eagle_speculation or self.neuron_config.enable_fused_speculation:
            raise NotImplementedError("stand-in: EAGLE / fused speculation padding is not transcribed")
        if self.tag == CONTEXT_ENCODING_MODEL_TAG:
            slot_mapping = args[11]
            block_table = args[12]
            prefill_len = args[13][0]
            prefix_len = args[14][0]
            extra_prefill_slots = max(0, prefill_bucket - prefill_len)
            adjusted_prefix_len = max(0, prefix_len - extra_prefill_slots)
            sliced_inputs = args[0][:, adjusted_prefix_len:]
            sliced_attn_mask = args[1][:, :adjusted_prefix_len]
            sliced_position_id = args[2][:, adjusted_prefix_len:]

            padded_inputs = F.pad(sliced_inputs, (0, prefill_bucket - sliced_inputs.shape[1]), "constant", self.config.pad_token_id)
            if prefix_bucket == 0:
                padded_attn_mask = torch.zeros(1, dtype=torch.int)
            else:
                padded_attn_mask = F.pad(sliced_attn_mask, (0, prefix_bucket - sliced_attn_mask.shape[1]), "constant", 0)
            padded_position_id = F.pad(sliced_position_id, (0, prefill_bucket - sliced_position_id.shape[1]), "constant", 1)
            padded_slot_mapping = F.pad(slot_mapping, (prefix_len - adjusted_prefix_len, 0), "constant", -1)
            padded_slot_mapping = F.pad(padded_slot_mapping, (0, prefill_bucket - padded_slot_mapping.shape[1]), "constant", -1)

            num_blocks = prefix_bucket // self.neuron_config.pa_block_size
            if num_blocks == 0:
                padded_block_table = torch.zeros(1, dtype=torch.int)
            else:
                padded_block_table = F.pad(block_table, (0, num_blocks - block_table.shape[1]), "constant", 0)
            args = (padded_inputs, padded_attn_mask, padded_position_id, *args[3:11], padded_slot_mapping, padded_block_table, *args[13:])
            return tuple(args)
        else:
            padded_attn_mask = F.pad(args[1], (0, prefix_bucket - args[1].shape[1]), "constant", 0)
            attn_tkg_nki_kernel_enabled = (
                self.neuron_config.attn_block_tkg_nki_kernel_enabled
                or self.neuron_config.attn_tkg_nki_kernel_enabled
            )
            block_table_arg_idx = 12
            block_table = args[block_table_arg_idx]
            pad_right = (prefix_bucket // self.neuron_config.pa_block_size) - block_table.shape[1]
            block_table_padding = -1 if attn_tkg_nki_kernel_enabled else 0
            padded_block_table = F.pad(block_table, (0, pad_right), "constant", block_table_padding)
            new_args = list(args)
            new_args[1] = padded_attn_mask
            new_args[block_table_arg_idx] = padded_block_table
            return tuple(new_args)

    def _pad_helper(self, tensor, pad_type="fill_0", batch_sort_indices=None):
        if tensor is None or tensor.shape[0] == self.neuron_config.batch_size:
            return tensor

        padded_shape = list(tensor.shape)
        padded_shape[0] = self.neuron_config.batch_size

        def fill_value_tensor(value):
            return lambda tensor, padded_shape: torch.full(padded_shape, fill_value=value, dtype=tensor.dtype)

        PAD_TYPES = {
            "repeat_first_batchline": pad_with_first_batchline,
            "fill_0": fill_value_tensor(0),
            "fill_1": fill_value_tensor(1),
            "fill_-1": fill_value_tensor(-1),
        }

        if pad_type not in PAD_TYPES:
            raise ValueError(f"Unknown pad_type '{pad_type}'. Available: {list(PAD_TYPES.keys())}")

        padded_tensor = PAD_TYPES[pad_type](tensor, padded_shape)
        padded_tensor[: tensor.shape[0]] = tensor

        if batch_sort_indices is not None:
            padded_tensor = torch.index_select(padded_tensor, 0, batch_sort_indices)

        return padded_tensor

    def _pad_batch(self, *args):
        """The padding half of ``_forward_with_pad`` (the inputs it hands ``_forward``): every input padded up to
        the compiled batch, seq_ids completed with the missing ones and sorted (not with prefix caching)."""
        seq_ids = args[3]
        sampling_params = args[4]
        if self.is_block_kv_layout:
            medusa_args = None
        elif len(args) > 5 and not self.neuron_config.tensor_replacement_config:
            medusa_args = args[5:8]
        else:
            medusa_args = None

        if self.is_prefix_caching:
            if self.neuron_config.enable_fused_speculation:
                raise NotImplementedError("stand-in: fused speculation is not transcribed")
            block_kv_empty_args = args[5:11]
            block_kv_slot_mapping = args[11]
            block_kv_args = args[12:15]

        # pad the inputs up to the compiled batch size in the end
        reorder_seq_ids = not self.is_prefix_caching
        seq_ids_list = seq_ids.tolist()

        # Determine target batch size for batch bucketing
        target_batch_size = self.neuron_config.max_batch_size

        if self.is_batch_bucketing and self.tag == TOKEN_GENERATION_MODEL_TAG:
            # Get the target bucket which includes batch size
            target_bucket = self.get_target_bucket(*args, strategy="first_fit")
            if isinstance(target_bucket, list):
                target_batch_size = target_bucket[0]

        if self.config.neuron_config.apply_seq_ids_mask:
            seq_ids_mask = torch.tensor([1 if x in seq_ids_list else 0 for x in range(target_batch_size)])
        padded_seq_ids = torch.tensor(
            seq_ids_list
            + [x for x in range(target_batch_size) if x not in seq_ids_list],
            dtype=seq_ids.dtype,
        )
        padded_seq_ids, indices = torch.sort(padded_seq_ids) if reorder_seq_ids else (padded_seq_ids, None)
        if self.config.neuron_config.apply_seq_ids_mask:
            padded_seq_ids = torch.where(seq_ids_mask == 1, padded_seq_ids, torch.full_like(padded_seq_ids, -1))
        padded_args = []
        # pad input_ids, attn_mask and position_ids
        for arg in args[0:3]:
            padded_arg = self._pad_helper(
                arg,
                pad_type="repeat_first_batchline",
                batch_sort_indices=indices,
            )
            padded_args.append(padded_arg)

        # for block kv layout the seq_ids may lies outside of range(target_batch_size)
        # therefore, we need to remove potential extra paddings to seq_ids
        padded_seq_ids = padded_seq_ids[: target_batch_size]
        padded_args.append(padded_seq_ids)

        # pad sampling params by repeating first batchline
        padded_sampling_params = self._pad_helper(
            sampling_params,
            pad_type="repeat_first_batchline",
            batch_sort_indices=indices,
        )
        padded_args.append(padded_sampling_params)

        if medusa_args is not None:
            for arg in medusa_args:
                padded_args.append(self._pad_helper(arg, batch_sort_indices=indices))

        if self.is_prefix_caching:
            for arg in block_kv_empty_args:
                padded_args.append(arg)
            padded_args[6] = self._pad_helper(args[6], pad_type="fill_0").view(-1)
            padded_args.append(self._pad_helper(block_kv_slot_mapping, pad_type="fill_-1"))
            for arg in block_kv_args:
                padded_args.append(self._pad_helper(arg, pad_type="repeat_first_batchline"))
        return padded_args

    def _process_args(self, *args):
        """
        Process None args in `inputs` to ensure a unified set of args for difference features, such as default, medusa, lora, and eagle_draft.
        Refer to `inputs` in `input_generator()` for the meaning of each arg.
        """
        seq_ids = args[3]
        input_batch_size = seq_ids.shape[0]

        # set hidden_states if None
        if args[5] is None:
            dummy_hidden_states = torch.zeros((input_batch_size), dtype=torch.int32)
            args = (*args[:5], dummy_hidden_states, *args[6:])

        # set adapter_ids if None
        if args[6] is None:
            dummy_adapter_ids = torch.zeros((input_batch_size), dtype=torch.int32)
            args = (*args[:6], dummy_adapter_ids, *args[7:])
        return args

    def vllm_cte_repadding(self, batch_args):
        # This function is used to undo the padding from vllm serving for bs > 1 and
        # repad to nearest bucket size

        # retrieve the actual_len by using max of position ids (batch_args[2])
        # assumption here: the padding_id is 0
        actual_len = torch.max(batch_args[2]) + 1

        # Undo padding from vllm
        batch_args[0] = batch_args[0][:, :actual_len]
        batch_args[1] = batch_args[1][:, :actual_len]
        batch_args[2] = batch_args[2][:, :actual_len]

        # repad to nearest bucket
        batch_args = self.pad_inputs(*batch_args, pad_type="first_fit")

        return batch_args

    def _forward(self, *args):
        """The graph call: the traced model (model.pt) routes the inputs by their shapes to the bucket traced with
        them, or fails as neuronx-distributed's NxDModel.router does. The stand-in's graph computes nothing: it
        returns the (model tag, bucket index) it routed to."""
        return self.model(list(args))

    def _graph_calls(self, *args, pad_type="first_fit"):
        """``forward``'s handling of the batch, transcribed up to its graph calls, each made (routed) in the
        release's order: the whole batch when it has the compiled ``batch_size`` rows; else slices of
        ``batch_size`` rows (each ``vllm_cte_repadding``) and a last, shorter slice through ``_forward_with_pad``'s
        padding. Returns the padded inputs."""
        args = self.pad_inputs(*args, pad_type=pad_type)
        seq_ids = args[3]
        input_batch_size = seq_ids.shape[0]
        if input_batch_size == self.neuron_config.batch_size:
            self._forward(*args)
            return args
        cur_batch = 0
        while cur_batch < input_batch_size:
            if cur_batch + self.neuron_config.batch_size <= input_batch_size:
                batch_args = [arg[cur_batch: cur_batch + self.neuron_config.batch_size] for arg in args]
                batch_args = self.vllm_cte_repadding(batch_args)
                self._forward(*batch_args)
            else:
                self._forward(*self._pad_batch(*[arg[cur_batch:input_batch_size] for arg in args]))
            cur_batch += self.neuron_config.batch_size
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

        args = self._process_args(*args)
        args = tuple(arg for arg in args if isinstance(arg, torch.Tensor))
        # The release pads the inputs and hands each graph call to the traced model, which routes it by its
        # shapes: a shape no bucket was traced with fails there, before anything runs (stand-in: all calls are
        # routed first, then the reference engine computes on the caller's inputs).
        padded = self._graph_calls(*args, pad_type=pad_type)
        if self.neuron_config.is_prefix_caching:
            return self._forward_prefix_caching(*args)
        input_ids, attention_mask, position_ids, seq_ids = args[:4]
        # the caller's inputs, cut where pad_inputs truncated them (the engine pads to its own buckets)
        if self.tag == CONTEXT_ENCODING_MODEL_TAG:
            input_ids, attention_mask, position_ids = (
                p[:, :a.shape[1]] for p, a in zip(padded[:3], (input_ids, attention_mask, position_ids)))
        else:
            attention_mask = padded[1][:, :attention_mask.shape[1]]
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
