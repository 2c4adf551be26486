"""neuronx_distributed_inference/models/config.py at aws-neuron/neuronx-distributed-inference cd3abf3
(Neuron SDK 2.28.0, NxD Inference 0.8): NeuronConfig, InferenceConfig, OnDeviceSamplingConfig,
FusedSpecNeuronConfig, to_dict, to_torch_dtype.

Transcribed: every ``kwargs.pop`` name and default of ``NeuronConfig.__init__`` (in source order), the
attributes it derives, its asserts and errors, the deprecated ``trace_tokengen_model`` /
``logical_neuron_cores`` attributes (``__getattribute__``), and ``InferenceConfig``'s attribute map,
``save`` (``neuron_config.json``, ``json.dumps(to_dict(self), indent=2, sort_keys=True)``) and
``load`` / ``from_json_string``.

One rule is stricter than the release, on purpose: the real ``NeuronConfig`` only *logs*
``NeuronConfig init: Unexpected keyword arguments: {...}`` for a keyword it does not pop; the stand-in
raises ``ContractError`` so a typo fails the test. The attributes the real class derives itself
(``is_prefill_stage``, ``kv_cache_tiling``, ...) are the exception: ``InferenceConfig.load`` feeds a
saved ``neuron_config.json`` (which holds them) back into ``NeuronConfig(**...)``, and the release logs
the warning and drops them there, so the stand-in does the same for those names.

Hardware queries of neuronx-distributed / torch-neuronx (``get_platform_target``) answer as an inf2 /
trn1 instance does (logical NeuronCore config 1).
"""
import inspect
import json
import logging
import os
import warnings
from typing import Dict, List, Optional, Type, Union

import torch

import _neuron_contract as contract

CONFIG_FILE = "neuron_config.json"
CHUNKED_ATTENTION_SUPPORTED_NEURON_CONFIG = {
    "flash_decoding_enabled": False,
    "attn_tkg_builtin_kernel_enabled": False,
    "attn_tkg_nki_kernel_enabled": False,
    "is_prefix_caching": False,
    "is_chunked_prefill": False,
    "padding_side": "right",
    "attention_dp_degree": 1,
}
LONG_CONTEXT_SCRATCHPAD_PAGE_SIZE = 1024

# Every kwargs.pop(...) name in NeuronConfig.__init__ and NeuronConfig._get_lnc (the keywords it accepts).
NEURON_CONFIG_KEYWORDS = frozenset({
    'activation_quantization_type', 'allow_input_truncation', 'apply_seq_ids_mask', 'async_mode',
    'attention_dp_degree', 'attention_dtype', 'attn_block_cte_nki_kernel_enabled',
    'attn_block_tkg_nki_kernel_cache_update', 'attn_block_tkg_nki_kernel_cascaded_attention',
    'attn_block_tkg_nki_kernel_disable_gpsimd_sb2sb', 'attn_block_tkg_nki_kernel_enabled',
    'attn_block_tkg_nki_kernel_use_online_softmax', 'attn_cls', 'attn_kernel_enabled',
    'attn_tkg_builtin_kernel_enabled', 'attn_tkg_nki_kernel_enabled', 'batch_size', 'bucket_n_active_tokens',
    'buckets', 'cast_type', 'cc_pipeline_tiling_factor', 'chunked_prefill_config', 'context_encoding_buckets',
    'cp_degree', 'ctx_batch_size', 'disable_argmax_kernel', 'disable_kv_cache_tiling',
    'disable_numeric_cc_token', 'dma_order_config', 'draft_model_modules_to_not_convert',
    'eagle_rolling_buffer_kernel_enabled', 'enable_bucketing', 'enable_cte_modular_flow',
    'enable_eagle_draft_input_norm', 'enable_eagle_speculation', 'enable_fused_speculation',
    'enable_output_completion_notifications', 'enable_spill_reload_dge', 'ep_degree', 'ep_dispatch_cc_option',
    'expert_mlp_nki_kernel_enabled', 'flash_decoding_enabled', 'fused_qkv', 'fused_rmsnorm_skip_gamma',
    'is_block_kv_layout', 'is_continuous_batching', 'is_eagle3', 'is_eagle_draft', 'is_full_model_shuffled',
    'is_medusa', 'is_mxfp4_compute', 'is_prefix_caching', 'k_cache_transposed', 'kv_cache_batch_size',
    'kv_cache_padding_size', 'kv_cache_quant', 'kv_quant_config', 'layer_boundary_markers', 'lm_head_pad',
    'lm_head_pad_alignment_size', 'local_ranks_size', 'logical_nc_config', 'logical_neuron_cores',
    'lora_config', 'max_batch_size', 'max_context_length', 'max_length', 'max_new_tokens',
    'medusa_speculation_length', 'medusa_tree', 'mlp_cp_degree', 'mlp_kernel_enabled',
    'mlp_kernel_fuse_residual_add', 'mlp_tkg_nki_kernel_enabled', 'modules_to_not_convert',
    'moe_fused_nki_kernel_enabled', 'n_active_tokens', 'n_positions', 'num_medusa_heads', 'on_cpu',
    'on_device_sampling_config', 'out_proj_kernel_enabled', 'output_logits', 'overrides_torch_dtype',
    'pa_block_size', 'pa_num_blocks', 'padded_hidden_size', 'padded_intermediate_size', 'padding_side',
    'pp_degree', 'pre_rope_rmsnorm', 'prefix_buckets', 'qk_layernorm', 'qkv_cte_nki_kernel_fuse_rope',
    'qkv_kernel_enabled', 'qkv_kernel_fuse_residual_add', 'qkv_kernel_nbsd_layout', 'qkv_nki_kernel_enabled',
    'quantization_block_axis', 'quantization_block_size', 'quantization_dtype', 'quantization_scale_dtype',
    'quantization_type', 'quantize_clamp_bound', 'quantized', 'quantized_checkpoints_path',
    'quantized_mlp_kernel_enabled', 'rmsnorm_quantize_kernel_enabled', 'router_topk_nki_kernel_enabled',
    'rpl_reduce_dtype', 'save_sharded_checkpoint', 'scratchpad_page_size', 'seq_len',
    'seq_len_threshold_for_cc_tiling', 'sequence_parallel_enabled', 'shared_mlp_nki_kernel_enabled',
    'skip_sharding', 'skip_warmup', 'spec_batch_size', 'speculation_length', 'start_rank_id',
    'strided_context_parallel_kernel_enabled', 'switch_cc', 'target', 'tensor_capture_config',
    'tensor_replacement_config', 'tkg_batch_size', 'token_generation_batches', 'token_generation_buckets',
    'token_tree_config', 'torch_dtype', 'tp_degree', 'vocab_parallel', 'weight_gather_seq_len_threshold',
    'weights_to_skip_layout_optimization', 'windowed_context_encoding_size', 'world_size'
})
# Attributes NeuronConfig.__init__ sets without popping them: a saved neuron_config.json holds them, and
# NeuronConfig(**saved) only logs them as unexpected (then recomputes them).
NEURON_CONFIG_DERIVED = frozenset({
    'is_prefill_stage', 'is_hidden_dim_shuffled', 'is_intermediate_dim_shuffled', 'enable_token_tree',
    'is_chunked_prefill', 'kv_cache_tiling', 'kv_cache_update_with_kernel', 'tile_cc',
    'enable_long_context_mode',
})

# neuronx_distributed/quantization/quantization_config.py at neuronx-distributed v2.28.0: config.py imports these
# three names from it (transcribed in the stand-in's _quantization_config.py, with QuantizationType and MyEnumMeta,
# which config.py does not import).
from neuronx_distributed_inference._quantization_config import (  # noqa: E402
    ActivationQuantizationType,
    QuantizedDtype,
    KVQuantizationConfig,
)


def validate_activation_quantization_type(type: str):
    assert type in ActivationQuantizationType, f"Unsupported activation quantization type: {type}"


def to_torch_dtype(dtype_str: str) -> torch.dtype:
    dtype_mapping = {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "float8_e4m3fn": torch.float8_e4m3fn,
        "float8_e5m2": torch.float8_e5m2,
    }
    assert dtype_str in dtype_mapping, f"Unsupported dtype: {dtype_str}"
    return dtype_mapping[dtype_str]


def to_dict(obj):
    if type(obj) is dict:
        return {k: to_dict(v) for k, v in obj.items()}
    elif type(obj) is list:
        return [to_dict(v) for v in obj]
    elif inspect.isclass(obj):
        return {
            "__module__": obj.__module__,
            "__name__": obj.__name__,
        }
    elif hasattr(obj, "__dict__"):
        return {k: to_dict(v) for k, v in obj.__dict__.items()}
    elif type(obj) is torch.dtype:
        return str(obj).split(".")[1]
    else:
        return obj


class IncompatibleConfigError(ValueError):
    pass


def get_platform_lnc():
    """inf2 / trn1: one physical NeuronCore per logical core (trn2/trn3 would answer 2)."""
    warnings.warn("neuronx_distributed_inference.models.config.get_platform_lnc() is deprecated. "
                  "Use neuronx_distributed.utils.model_utils.get_platform_lnc() instead.", category=DeprecationWarning)
    return 1


class NeuronConfig:
    """
    Base config class for inference in NxD.

    This class contains attributes that are needed for various inference
    optimization/features in NxD.
    """
    _record_calls = True  # stand-in bookkeeping: NxDI's own internal NeuronConfig(...) calls are not recorded

    def __init__(self, **kwargs) -> None:
        unknown = {k: v for k, v in kwargs.items() if k not in NEURON_CONFIG_KEYWORDS}
        derived = {k: v for k, v in unknown.items() if k in NEURON_CONFIG_DERIVED}
        contract.refuse_unknown("NxDI NeuronConfig", {k: v for k, v in unknown.items() if k not in derived},
                                NEURON_CONFIG_KEYWORDS,
                                "only logs 'NeuronConfig init: Unexpected keyword arguments' (models/config.py)")
        if NeuronConfig._record_calls:
            contract.record("nxdi.NeuronConfig", **{k: v for k, v in kwargs.items() if k not in derived})
        kwargs = dict(kwargs)
        # Basic config for inference in NxD
        self.batch_size = kwargs.pop("batch_size", 1)
        self.padding_side = kwargs.pop("padding_side", "right")
        self.allow_input_truncation: bool = kwargs.pop("allow_input_truncation", False)
        self.seq_len = kwargs.pop("seq_len", 128)
        self.n_active_tokens = kwargs.pop("n_active_tokens", self.seq_len)
        self.n_positions = kwargs.pop("n_positions", self.seq_len)
        self.on_cpu = kwargs.pop("on_cpu", False)
        self.output_logits = kwargs.pop("output_logits", False)
        self.is_prefill_stage = None  # set only in enable_<>() in NeuronBaseForCausalLM

        # Torch dtype
        if "torch_dtype" in kwargs:
            self.torch_dtype = kwargs.pop("torch_dtype")
            if isinstance(self.torch_dtype, str):
                self.torch_dtype = to_torch_dtype(self.torch_dtype)
            self.overrides_torch_dtype = kwargs.pop("overrides_torch_dtype", True)
        else:
            self.torch_dtype = torch.bfloat16
            self.overrides_torch_dtype = False

        self.cast_type = kwargs.pop("cast_type", "config")
        if self.cast_type not in ["config", "as-declared"]:
            raise ValueError("cast_type must be one of config, as-declared")

        self.rpl_reduce_dtype = kwargs.pop("rpl_reduce_dtype", None)
        if isinstance(self.rpl_reduce_dtype, str):
            self.rpl_reduce_dtype = to_torch_dtype(self.rpl_reduce_dtype)

        self.attention_dtype = kwargs.pop("attention_dtype", None)
        if isinstance(self.attention_dtype, str):
            self.attention_dtype = to_torch_dtype(self.attention_dtype)

        if self.attention_dtype != self.torch_dtype and self.attention_dtype is not None:
            assert self.cast_type == "as-declared", "attention dtype and torch dtype are different, however global cast is enabled. To enable running multiple precisions, set cast-type to 'as-declared'"

        self.max_context_length = kwargs.pop("max_context_length", self.seq_len)
        self.max_new_tokens = kwargs.pop("max_new_tokens", self.seq_len - self.max_context_length)
        if self.max_new_tokens == 0:
            self.max_new_tokens = None
        self.max_length = kwargs.pop("max_length", self.seq_len)
        assert self.max_context_length <= self.max_length, "max_context_length cannot be more than max_length"

        self.vocab_parallel = kwargs.pop("vocab_parallel", False)
        self.enable_cte_modular_flow = kwargs.pop("enable_cte_modular_flow", False)
        self.layer_boundary_markers = kwargs.pop("layer_boundary_markers", False)

        # Attention
        self.fused_qkv = kwargs.pop("fused_qkv", False)
        self.sequence_parallel_enabled = kwargs.pop("sequence_parallel_enabled", False)
        self.weight_gather_seq_len_threshold = kwargs.pop("weight_gather_seq_len_threshold", 32768)
        self.attn_cls = kwargs.pop("attn_cls", "NeuronLlamaAttention")

        # Continuous batching
        self.ctx_batch_size = kwargs.pop("ctx_batch_size", self.batch_size)
        self.tkg_batch_size = kwargs.pop("tkg_batch_size", self.batch_size)
        self.max_batch_size = kwargs.pop("max_batch_size", self.batch_size)
        self.is_continuous_batching = kwargs.pop("is_continuous_batching", False)

        # KV cache
        self.kv_cache_batch_size = kwargs.pop("kv_cache_batch_size", self.batch_size)
        self.kv_cache_padding_size = kwargs.pop("kv_cache_padding_size", 0)

        # On-device sampling
        self.on_device_sampling_config = kwargs.pop("on_device_sampling_config", None)
        if type(self.on_device_sampling_config) is dict:
            self.on_device_sampling_config = OnDeviceSamplingConfig(**self.on_device_sampling_config)
        self.disable_argmax_kernel = kwargs.pop("disable_argmax_kernel", False)

        # async
        self.async_mode = kwargs.pop("async_mode", False)

        # Bucketing
        self.enable_bucketing = kwargs.pop("enable_bucketing", False)
        self.buckets = kwargs.pop("buckets", [self.seq_len])
        self.bucket_n_active_tokens = kwargs.pop("bucket_n_active_tokens", False)
        self.context_encoding_buckets = kwargs.pop("context_encoding_buckets", None)
        self.prefix_buckets = kwargs.pop("prefix_buckets", None)
        self.token_generation_buckets = kwargs.pop("token_generation_buckets", None)
        if self.context_encoding_buckets is not None:
            self.context_encoding_buckets.sort()
            assert (
                self.context_encoding_buckets[-1] <= self.max_context_length
            ), f"Context bucket {self.context_encoding_buckets[-1]} should be <= {self.max_context_length}"
        if self.token_generation_buckets is not None:
            self.token_generation_buckets.sort()
            assert (
                self.token_generation_buckets[-1] <= self.max_length
            ), f"Token generation bucket {self.token_generation_buckets[-1]} should be <= {self.max_length}"

        # Batch bucketing for token generation
        self.token_generation_batches = kwargs.pop("token_generation_batches", None)
        if self.token_generation_batches is not None:
            if not isinstance(self.token_generation_batches, list):
                self.token_generation_batches = [self.token_generation_batches]
            self.token_generation_batches.sort()
            max_batch = self.token_generation_batches[-1]
            assert max_batch <= self.tkg_batch_size, (
                f"Token generation batch buckets {self.token_generation_batches} "
                f"should be <= token generation batch size ({self.tkg_batch_size})"
            )

        # Quantization
        self.quantized = kwargs.pop("quantized", False)
        self.quantized_checkpoints_path = kwargs.pop("quantized_checkpoints_path", None)
        if self.quantized is True:
            assert (
                self.quantized_checkpoints_path is not None
            ), "quantized_checkpoints_path is required"
        self.quantization_type: str = kwargs.pop("quantization_type", "per_tensor_symmetric")
        self.quantization_dtype: str = kwargs.pop("quantization_dtype", "int8")
        self.quantization_block_size = kwargs.pop("quantization_block_size", None)
        self.quantization_block_axis = kwargs.pop("quantization_block_axis", None)
        self.quantization_scale_dtype = kwargs.pop("quantization_scale_dtype", "f32")

        self.is_mxfp4_compute = kwargs.pop("is_mxfp4_compute", False)
        self.is_hidden_dim_shuffled = self.is_mxfp4_compute
        self.is_intermediate_dim_shuffled = self.is_mxfp4_compute
        self.is_full_model_shuffled = kwargs.pop("is_full_model_shuffled", False)

        self.modules_to_not_convert = kwargs.pop("modules_to_not_convert", None)
        self.draft_model_modules_to_not_convert = kwargs.pop("draft_model_modules_to_not_convert", None)
        self.kv_cache_quant = kwargs.pop("kv_cache_quant", False)

        # Speculative decoding
        self.speculation_length = kwargs.pop("speculation_length", 0)
        self.spec_batch_size = kwargs.pop("spec_batch_size", self.batch_size)
        self.enable_fused_speculation = kwargs.pop("enable_fused_speculation", False)
        self.enable_eagle_speculation = kwargs.pop("enable_eagle_speculation", False)
        self.eagle_rolling_buffer_kernel_enabled = kwargs.pop("eagle_rolling_buffer_kernel_enabled", False)
        self.is_eagle3 = kwargs.pop("is_eagle3", False)
        self.is_eagle_draft = kwargs.pop("is_eagle_draft", False)
        self.enable_eagle_draft_input_norm = kwargs.pop("enable_eagle_draft_input_norm", False)

        assert not self.is_full_model_shuffled or (self.is_mxfp4_compute or self.is_eagle_draft), \
            "is_full_model_shuffled only works with is_mxfp4_compute in target model or an eagle draft model."

        if self.enable_eagle_speculation:
            self.enable_fused_speculation = True

        if self.speculation_length > 0 and self.async_mode and not self.enable_fused_speculation:
            warnings.warn(
                "Unfused Speculative Decoding + async mode may not result in performance improvements due to high likelihood of data dependent compute causing blocking calls."
            )

        self.token_tree_config = kwargs.pop("token_tree_config", None)
        self.enable_token_tree = self.token_tree_config is not None

        # Medusa decoding
        self.is_medusa = kwargs.pop("is_medusa", False)
        self.medusa_speculation_length = kwargs.pop("medusa_speculation_length", 0)
        self.num_medusa_heads = kwargs.pop("num_medusa_heads", 0)
        self.medusa_tree = kwargs.pop("medusa_tree", None)

        if self.is_medusa and self.async_mode:
            raise IncompatibleConfigError("Medusa Decoding is not yet supported with async.")

        # Paged attention
        self.is_block_kv_layout = kwargs.pop("is_block_kv_layout", False)
        self.pa_num_blocks = kwargs.pop("pa_num_blocks", self.batch_size)
        self.pa_block_size = kwargs.pop("pa_block_size", self.seq_len)

        self.is_prefix_caching = kwargs.pop("is_prefix_caching", False)
        self.windowed_context_encoding_size = kwargs.pop("windowed_context_encoding_size", None)

        # Chunked prefill
        self.chunked_prefill_config = kwargs.pop("chunked_prefill_config", None)
        if type(self.chunked_prefill_config) is dict:
            self.chunked_prefill_config = ChunkedPrefillConfig(**self.chunked_prefill_config)

        # KV Quantization
        self.kv_quant_config = kwargs.pop("kv_quant_config", None)
        if type(self.kv_quant_config) is dict:
            self.kv_quant_config = KVQuantizationConfig(
                **self.kv_quant_config
            )

        self.is_chunked_prefill = self.chunked_prefill_config is not None
        if self.is_chunked_prefill:
            assert (
                self.is_block_kv_layout
            ), "is_block_kv_layout has to be true for chunked prefill" \
                + " because it depends on block KV"
            if not self.chunked_prefill_config.tkg_model_enabled:
                assert (
                    self.batch_size == 1
                ), "batch_size has to be 1 for chunked prefill CTE model" \
                    + " because it concatenates all requests into one" \
                    + " long request"

        # Tensor replacement for debugging and accuracy verification
        tensor_replacement_config = kwargs.pop("tensor_replacement_config", None)
        if isinstance(tensor_replacement_config, dict):
            self.tensor_replacement_config = TensorReplacementConfig(**tensor_replacement_config)
        elif isinstance(tensor_replacement_config, TensorReplacementConfig):
            self.tensor_replacement_config = tensor_replacement_config
        else:
            if tensor_replacement_config is not None:  # Only warn if something invalid was passed
                warnings.warn(
                    f"tensor_replacement_config should be a TensorReplacementConfig object or dictionary, got {type(tensor_replacement_config)}. "
                    "Tensor replacemnet will be disabled."
                )
            self.tensor_replacement_config = None

        # Tensor capture for debugging and accuracy verification
        tensor_capture_config = kwargs.pop("tensor_capture_config", None)
        if isinstance(tensor_capture_config, dict):
            self.tensor_capture_config = TensorCaptureConfig(**tensor_capture_config)
        elif isinstance(tensor_capture_config, TensorCaptureConfig):
            self.tensor_capture_config = tensor_capture_config
        else:
            if tensor_capture_config is not None:  # Only warn if something invalid was passed
                warnings.warn(
                    f"tensor_capture_config should be a TensorCaptureConfig object or dictionary, got {type(tensor_capture_config)}. "
                    "Tensor capture will be disabled."
                )
            self.tensor_capture_config = None

        # Automatically set output_logits to True if tensor capture is enabled
        # This is required for tensor capture to work properly
        if self.tensor_capture_config and not self.output_logits:
            logging.info("Setting output_logits=True because tensor capture is enabled")
            self.output_logits = True
            if self.on_device_sampling_config is None:
                raise IncompatibleConfigError("Tensor capture requires on device sampling config to be set even if it's just defaults")

        # Lora
        self.lora_config = kwargs.pop("lora_config", None)

        # Distributed config
        self.tp_degree = kwargs.pop("tp_degree", 1)
        self.cp_degree = kwargs.pop("cp_degree", 1)
        self.mlp_cp_degree = kwargs.pop("mlp_cp_degree", 1)
        self.attention_dp_degree = kwargs.pop("attention_dp_degree", 1)
        self.pp_degree = kwargs.pop("pp_degree", 1)
        self.ep_degree = kwargs.pop("ep_degree", 1)
        self.save_sharded_checkpoint = kwargs.pop("save_sharded_checkpoint", False)
        self.skip_sharding = kwargs.pop("skip_sharding", False)

        if self.tp_degree % self.cp_degree != 0:
            raise ValueError("TP Degree must be evenly divisible by CP Degree")

        if self.mlp_cp_degree > 1 and not self.sequence_parallel_enabled:
            raise IncompatibleConfigError("Context Parallel for MLP requires Sequence Parallel to be enabled")

        self.qk_layernorm = kwargs.pop("qk_layernorm", False)
        self.pre_rope_rmsnorm = kwargs.pop("pre_rope_rmsnorm", False)

        self.world_size = kwargs.pop("world_size", None)
        if self.world_size is None:
            self.world_size = self.tp_degree * self.pp_degree * self.ep_degree

        self.start_rank_id = kwargs.pop("start_rank_id", 0)
        self.local_ranks_size = kwargs.pop("local_ranks_size", None)

        if self.local_ranks_size is None:
            self.local_ranks_size = self.world_size

        self.flash_decoding_enabled = kwargs.pop("flash_decoding_enabled", False)

        self.disable_kv_cache_tiling = kwargs.pop("disable_kv_cache_tiling", False)
        if not self.disable_kv_cache_tiling:
            self.kv_cache_tiling = False
            if self.enable_eagle_speculation or self.enable_fused_speculation:
                if self.max_length > 128 and self.max_length % 128 == 0:
                    self.kv_cache_tiling = True
        else:
            self.kv_cache_tiling = False

        self.k_cache_transposed = kwargs.pop("k_cache_transposed", False)

        # Kernels
        self.attn_kernel_enabled = kwargs.pop("attn_kernel_enabled", None)
        self.strided_context_parallel_kernel_enabled = kwargs.pop("strided_context_parallel_kernel_enabled", False)
        self.qkv_kernel_enabled = kwargs.pop("qkv_kernel_enabled", False)
        self.qkv_nki_kernel_enabled = kwargs.pop("qkv_nki_kernel_enabled", False)
        self.qkv_cte_nki_kernel_fuse_rope = kwargs.pop("qkv_cte_nki_kernel_fuse_rope", False)
        if self.qkv_cte_nki_kernel_fuse_rope:
            assert self.qkv_kernel_enabled and self.qkv_nki_kernel_enabled, \
                f"When qkv_cte_nki_kernel_fuse_rope is set to True, qkv_kernel_enabled (currently: {self.qkv_kernel_enabled}) and qkv_nki_kernel_enabled (currently: {self.qkv_nki_kernel_enabled}) must also be set to True."
        self.qkv_kernel_nbsd_layout = kwargs.pop("qkv_kernel_nbsd_layout", False)
        self.mlp_kernel_enabled = kwargs.pop("mlp_kernel_enabled", False)
        self.mlp_tkg_nki_kernel_enabled = kwargs.pop("mlp_tkg_nki_kernel_enabled", False)
        self.fused_rmsnorm_skip_gamma = kwargs.pop("fused_rmsnorm_skip_gamma", False)
        self.mlp_kernel_fuse_residual_add = kwargs.pop("mlp_kernel_fuse_residual_add", False)
        self.qkv_kernel_fuse_residual_add = kwargs.pop("qkv_kernel_fuse_residual_add", False)
        self.quantized_mlp_kernel_enabled = kwargs.pop("quantized_mlp_kernel_enabled", False)
        self.out_proj_kernel_enabled = kwargs.pop("out_proj_kernel_enabled", False)
        self.activation_quantization_type = kwargs.pop("activation_quantization_type", None)
        if self.activation_quantization_type is not None:
            validate_activation_quantization_type(self.activation_quantization_type)
            self.fused_qkv = kwargs.pop("fused_qkv", False)
            if self.activation_quantization_type == "STATIC" and self.fused_qkv:
                raise IncompatibleConfigError("Static quantization is not supported for fused qkv")

        if self.strided_context_parallel_kernel_enabled and not self.cp_degree > 1:
            raise ValueError("CP must also be enabled when strided_context_parallel_kernel_enabled is set.")

        # Token-gen attention kernels
        self.attn_tkg_nki_kernel_enabled = kwargs.pop("attn_tkg_nki_kernel_enabled", False)
        self.attn_tkg_builtin_kernel_enabled = kwargs.pop("attn_tkg_builtin_kernel_enabled", False)
        self.attn_block_tkg_nki_kernel_enabled = kwargs.pop("attn_block_tkg_nki_kernel_enabled", False)
        self.attn_block_cte_nki_kernel_enabled = kwargs.pop("attn_block_cte_nki_kernel_enabled", False)
        if self.attn_block_tkg_nki_kernel_enabled:
            assert (
                self.qkv_kernel_enabled or self.qkv_nki_kernel_enabled
            ), "When attn-block-tkg-nki-kernel-enabled, self.qkv_kernel_enabled or self.qkv_nki_kernel_enabled is also required."
        if self.attn_block_cte_nki_kernel_enabled:
            assert (
                self.attn_block_tkg_nki_kernel_enabled and (self.qkv_kernel_enabled or self.qkv_nki_kernel_enabled)
            ), "When attn-block-cte-nki-kernel-enabled, attn-block-tkg-nki-kernel-enabled and (qkv_kernel_enabled or qkv_nki_kernel_enabled) are also required."
        attn_tkg_kernel_enablement = [
            self.attn_tkg_nki_kernel_enabled,
            self.attn_tkg_builtin_kernel_enabled,
            self.attn_block_tkg_nki_kernel_enabled,
        ]
        assert sum(attn_tkg_kernel_enablement) <= 1, (
            "Multiple token-generation attention kernels enabled. Please enable no more than one of: "
            "[attn-tkg-nki-kernel-enabled, attn-tkg-builtin-kernel-enabled, attn-block-tkg-nki-kernel-enabled]"
        )

        self.attn_block_tkg_nki_kernel_cache_update = kwargs.pop("attn_block_tkg_nki_kernel_cache_update", False)
        self.attn_block_tkg_nki_kernel_cascaded_attention = kwargs.pop("attn_block_tkg_nki_kernel_cascaded_attention", False)
        if not self.attn_block_tkg_nki_kernel_enabled:
            assert not self.attn_block_tkg_nki_kernel_cache_update, \
                'attn-block-tkg-nki-kernel-cache-update can only be enabled with attn-block-tkg-nki-kernel-enabled'
            assert not self.attn_block_tkg_nki_kernel_cascaded_attention, \
                'attn_block_tkg_nki_kernel_cascaded_attention can only be enabled with attn-block-tkg-nki-kernel-enabled'

        self.attn_block_tkg_nki_kernel_use_online_softmax = kwargs.pop("attn_block_tkg_nki_kernel_use_online_softmax", True)
        self.attn_block_tkg_nki_kernel_disable_gpsimd_sb2sb = kwargs.pop("attn_block_tkg_nki_kernel_disable_gpsimd_sb2sb", False)
        self.kv_cache_update_with_kernel = False
        if self.attention_dp_degree > 1:
            self.kv_cache_batch_size = self.tkg_batch_size // self.attention_dp_degree
            # inf2 / trn1 (hardware.TRN1 branch)
            self.kv_cache_padding_size = 1

        if self.attn_block_tkg_nki_kernel_cache_update:
            self.kv_cache_tiling = False

        attn_tkg_incompatible_features = [
            (self.flash_decoding_enabled, 'flash decoding'),
            (self.is_chunked_prefill, 'contexted prefill'),
        ]
        k_cache_tp_incompatible_features = [
            (self.flash_decoding_enabled, 'flash decoding'),
            (self.is_chunked_prefill, 'contexted prefill'),
            (self.is_block_kv_layout, 'block KV cache'),
        ]
        if sum(attn_tkg_kernel_enablement) > 0:
            for flag, feature in attn_tkg_incompatible_features:
                assert not flag, f'Attention TKG kernels do not yet support {feature} feature.'
        if self.k_cache_transposed:
            for flag, feature in k_cache_tp_incompatible_features:
                assert not flag, f'Transposed K cache is not yet supported by {feature} feature.'

        if self.quantized_mlp_kernel_enabled or self.mlp_kernel_enabled:
            assert not (
                self.activation_quantization_type
            ), "native quantization does not work with quantized kernels"
        self.rmsnorm_quantize_kernel_enabled = kwargs.pop("rmsnorm_quantize_kernel_enabled", False)
        if self.rmsnorm_quantize_kernel_enabled:
            assert (
                self.quantized_mlp_kernel_enabled
            ), "quantized_mlp_kernel must be enabled to use rmsnorm_quantize_kernel!"
        self.quantize_clamp_bound = kwargs.pop("quantize_clamp_bound", float("inf"))

        if self.quantized or self.is_mlp_quantized():
            if self.qkv_kernel_enabled or self.qkv_nki_kernel_enabled:
                assert (
                    self.modules_to_not_convert
                ), "Could not find modules_to_not_convert for quantized model."
            elif not self.modules_to_not_convert:
                warnings.warn(
                    "modules_to_not_convert is not provided. Assuming all modules will be quantized.",
                    UserWarning,
                )

        self.moe_fused_nki_kernel_enabled = kwargs.pop("moe_fused_nki_kernel_enabled", None)
        self.router_topk_nki_kernel_enabled = kwargs.pop("router_topk_nki_kernel_enabled", None)
        self.expert_mlp_nki_kernel_enabled = kwargs.pop("expert_mlp_nki_kernel_enabled", None)
        self.shared_mlp_nki_kernel_enabled = kwargs.pop("shared_mlp_nki_kernel_enabled", None)

        self.logical_nc_config = self._get_lnc(kwargs)

        self.lm_head_pad = kwargs.pop("lm_head_pad", self.logical_nc_config > 1)
        self.lm_head_pad_alignment_size = kwargs.pop("lm_head_pad_alignment_size", 1)

        if self.is_mlp_quantized():
            self.quantization_type = "per_channel_symmetric"
            self.quantization_dtype = "f8e4m3"

        self.cc_pipeline_tiling_factor = kwargs.pop("cc_pipeline_tiling_factor", 2)
        self.seq_len_threshold_for_cc_tiling = kwargs.pop("seq_len_threshold_for_cc_tiling", 16384)
        self.tile_cc = False
        if self.cc_pipeline_tiling_factor > 1 and (
                self.mlp_kernel_enabled or self.quantized_mlp_kernel_enabled):
            self.tile_cc = True

        self.target = kwargs.pop("target", None)
        self.enable_spill_reload_dge = kwargs.pop("enable_spill_reload_dge", False)
        self.weights_to_skip_layout_optimization = kwargs.pop("weights_to_skip_layout_optimization", [])
        self.dma_order_config = kwargs.pop("dma_order_config", None)

        self._verify_quantized_config()

        self.apply_seq_ids_mask = kwargs.pop("apply_seq_ids_mask", False)
        self.skip_warmup = kwargs.pop("skip_warmup", False)

        self.scratchpad_page_size = None
        self.enable_long_context_mode = self.max_context_length >= 32 * 1024
        if self.enable_long_context_mode:
            self.scratchpad_page_size = LONG_CONTEXT_SCRATCHPAD_PAGE_SIZE
        self.scratchpad_page_size = kwargs.pop("scratchpad_page_size", self.scratchpad_page_size)
        if self.scratchpad_page_size:
            self.scratchpad_page_size = int(self.scratchpad_page_size)

        self.enable_output_completion_notifications = kwargs.pop("enable_output_completion_notifications", False)
        self.padded_hidden_size = kwargs.pop("padded_hidden_size", None)
        self.padded_intermediate_size = kwargs.pop("padded_intermediate_size", None)
        self.disable_numeric_cc_token = kwargs.pop("disable_numeric_cc_token", False)
        self.switch_cc = kwargs.pop("switch_cc", False)
        self.ep_dispatch_cc_option = kwargs.pop("ep_dispatch_cc_option", "AR_AG")

        if kwargs:  # only the derived attributes of a saved neuron_config.json reach here (see the docstring)
            logging.warning(f"NeuronConfig init: Unexpected keyword arguments: {kwargs}")

        self.validate_attention_data_parallel(self.attention_dp_degree)
        self._validate_batch_bucketing_compatibility()

    def _validate_batch_bucketing_compatibility(self):
        if self.token_generation_batches is None:
            return
        incompatible_features = []
        if self.speculation_length > 0:
            incompatible_features.append(f"speculative decoding ({self.speculation_length=})")
        if self.enable_fused_speculation:
            incompatible_features.append("fused speculation (enable_fused_speculation=True)")
        if self.enable_eagle_speculation:
            incompatible_features.append("EAGLE speculation (enable_eagle_speculation=True)")
        if self.is_medusa:
            incompatible_features.append("Medusa decoding (is_medusa=True)")
        if self.enable_token_tree:
            incompatible_features.append("token tree (enable_token_tree=True)")
        if self.is_chunked_prefill:
            incompatible_features.append("chunked prefill (is_chunked_prefill=True)")
        if self.is_prefix_caching:
            incompatible_features.append("prefix caching (is_prefix_caching=True)")
        if self.is_block_kv_layout:
            incompatible_features.append("block KV layout (is_block_kv_layout=True)")
        if incompatible_features:
            features_str = ", ".join(incompatible_features)
            raise ValueError(
                f"Batch bucketing (token_generation_batches={self.token_generation_batches}) "
                f"is not currently supported with the following features: {features_str}. "
                f"Please disable batch bucketing or the incompatible features."
            )

    def _verify_quantized_config(self):
        if not self.quantized:
            return
        assert self.quantized_checkpoints_path is not None, "quantized_checkpoints_path is required"
        # Verification for quantized dtype
        QuantizedDtype.has_dtype(self.quantization_dtype)
        if self.is_mlp_quantized():
            assert self.quantization_dtype == "f8e4m3"

    def validate_attention_data_parallel(self, attention_dp_degree):
        if self.tp_degree % attention_dp_degree != 0:
            raise ValueError("TP Degree must be evenly divisible by DP Degree")
        if self.tkg_batch_size % attention_dp_degree != 0:
            raise ValueError("Batch Size must be evenly divisible by DP Degree")
        if self.cp_degree > 1 and attention_dp_degree > 1 and self.cp_degree < attention_dp_degree:
            raise ValueError("Running DP Degree > CP Degree is not supported when CP and DP is enabled")
        if self.cp_degree > 1 and attention_dp_degree > 1 and self.cp_degree % attention_dp_degree != 0:
            raise ValueError("CP Degree % DP Degree should be 0 when CP and DP is enabled")
        if attention_dp_degree > 1 and not self.is_continuous_batching:
            raise ValueError("--is-continuous-batching must be enabled when running DP")
        if attention_dp_degree > 1 and self.attn_block_tkg_nki_kernel_cache_update and not self.kv_cache_update_with_kernel:
            raise ValueError("kv_cache_update_with_kernel must be set to enable attn_block_tkg_nki_kernel_cache_update when DP is used")
        if self.ep_dispatch_cc_option == "RS_AG" and self.tp_degree > self.tkg_batch_size:
            raise ValueError("EP Dispatch option RS_AG not supported when TP degree > batch size")

    def _get_lnc(self, kwargs):
        env_lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", -1))
        kwargs_lnc = -1
        platform_lnc = get_platform_lnc()
        if "logical_neuron_cores" in kwargs:
            warning_message = (
                "'logical_neuron_cores' is deprecated and replaced by 'logical_nc_config'. "
                "In a future release, this attribute will be removed."
            )
            warnings.warn(warning_message, category=DeprecationWarning)
            kwargs_lnc = int(kwargs.pop("logical_neuron_cores"))
        if "logical_nc_config" in kwargs:
            kwargs_lnc = int(kwargs.pop("logical_nc_config"))
        if env_lnc != -1 and kwargs_lnc != -1 and env_lnc != kwargs_lnc:
            warning_message = (
                f"NEURON_LOGICAL_NC_CONFIG={env_lnc} does not match provided logical_nc_config={kwargs_lnc}. "
                "Using NEURON_LOGICAL_NC_CONFIG to set LNC."
            )
            warnings.warn(warning_message, category=UserWarning)
        if env_lnc != -1:
            return env_lnc
        elif kwargs_lnc != -1:
            return kwargs_lnc
        else:
            return platform_lnc

    def __getattribute__(self, name):
        if name == "logical_neuron_cores":
            warnings.warn("'logical_neuron_cores' is deprecated and will be removed in a future release. "
                          "Use the 'logical_nc_config' attribute instead.", category=DeprecationWarning)
            return self.logical_nc_config
        if name == "trace_tokengen_model":
            warning_message = (
                "'trace_tokengen_model' is deprecated and will be removed in a future release. "
                + "Returning the expected value based on current configuration"
            )
            warnings.warn(warning_message, category=DeprecationWarning)
            return (
                not self.enable_fused_speculation
                or not self.speculation_length > 0
                or not self.medusa_speculation_length > 0
            )
        return super().__getattribute__(name)

    def is_mlp_quantized(self):
        return self.quantized_mlp_kernel_enabled or self.activation_quantization_type


class InferenceConfig:
    # Alias map for attributes.
    attribute_map: Dict[str, str] = {}

    def __init__(
        self,
        neuron_config: NeuronConfig,
        fused_spec_config=None,
        load_config=None,
        metadata: Optional[Dict] = None,
        **kwargs
    ):
        if not isinstance(neuron_config, NeuronConfig):
            # The release stores anything; a transformers-neuronx NeuronConfig here fails far later.
            raise contract.ContractError("InferenceConfig takes an NxD Inference NeuronConfig "
                                         "(neuronx_distributed_inference.models.config.NeuronConfig)")
        self.neuron_config = neuron_config
        self.fused_spec_config = fused_spec_config
        if load_config is not None:
            load_config(self)
        else:
            self.load_config()

        self.metadata = metadata

        for key, value in kwargs.items():
            setattr(self, key, value)

        self.add_derived_config()

        self.validate_config()

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def add_derived_config(self):
        self.num_cores_per_group = 1
        pass

    def load_config(self):
        pass

    def get_required_attributes(self) -> List[str]:
        return []

    def validate_config(self):
        missing_attributes = [x for x in self.get_required_attributes() if not hasattr(self, x)]
        assert len(missing_attributes) == 0, f"Config must define {missing_attributes}"
        self._validate_chunked_attention_support()
        self._validate_windowed_context_encoding_support()

    def _validate_chunked_attention_support(self):
        if hasattr(self, "attention_chunk_size") and self.attention_chunk_size < self.neuron_config.seq_len:
            for config, config_value in CHUNKED_ATTENTION_SUPPORTED_NEURON_CONFIG.items():
                if getattr(self.neuron_config, config) != config_value:
                    raise ValueError(f"The Neuron config {config}: {getattr(self.neuron_config, config)} is not yet supported with chunked attention. Only config value of {config_value} is supported")
            assert self.attention_chunk_size % self.neuron_config.cp_degree == 0, f"attention_chunk_size: {self.attention_chunk_size} must be divisible by cp_degree: {self.neuron_config.cp_degree}"
            assert (self.neuron_config.seq_len % self.attention_chunk_size) % self.neuron_config.cp_degree == 0, f"The last chunk must be divisible by cp_degree: {self.neuron_config.cp_degree}"

    def _validate_windowed_context_encoding_support(self):
        wce_size = self.neuron_config.windowed_context_encoding_size
        if wce_size is not None and hasattr(self, "sliding_window") and self.sliding_window is not None:
            assert wce_size == self.sliding_window, f"Windowed context encoding size must equal sliding window size, if using both. Got windowed_context_encoding_size = {wce_size}, sliding_window = {self.sliding_window}"

    def save(self, model_path: Union[str, os.PathLike]):
        """Saves the config to a JSON file in the given model directory."""
        if not os.path.exists(model_path):
            os.makedirs(model_path)
        config_file = os.path.join(model_path, CONFIG_FILE)
        self.to_json_file(config_file)

    def to_json_file(self, json_file: Union[str, os.PathLike]):
        with open(json_file, "w", encoding="utf-8") as writer:
            config_json = self.to_json_string()
            logging.debug(f"Saving config: {config_json}")
            writer.write(config_json + "\n")

    def to_json_string(self) -> str:
        config_dict = to_dict(self)
        return json.dumps(config_dict, indent=2, sort_keys=True)

    def get_text_config(self):
        if hasattr(self, "text_config") and self.text_config is not None:
            return self.text_config
        return self

    @classmethod
    def load(cls, model_path: Union[str, os.PathLike], **kwargs) -> "InferenceConfig":
        """Loads the config from the given model directory (kwargs override the JSON file)."""
        config_file = os.path.join(model_path, CONFIG_FILE)
        return cls.from_json_file(config_file, **kwargs)

    @classmethod
    def from_json_file(cls, json_file: Union[str, os.PathLike], **kwargs) -> "InferenceConfig":
        with open(json_file, "r", encoding="utf-8") as reader:
            config = cls.from_json_string(reader.read(), **kwargs)
            logging.info(f"Loaded Neuron config: {config.to_json_string()}")
            return config

    @classmethod
    def from_json_string(cls, json_string: str, **kwargs) -> "InferenceConfig":
        merged_kwargs = json.loads(json_string)
        merged_kwargs.update(kwargs)
        if "neuron_config" in merged_kwargs and isinstance(merged_kwargs["neuron_config"], dict):
            merged_kwargs["neuron_config"] = cls.get_neuron_config_cls()(**merged_kwargs["neuron_config"])
        if "fused_spec_config" in merged_kwargs and isinstance(merged_kwargs["fused_spec_config"], dict):
            raise NotImplementedError("stand-in: fused speculation configs are not reloaded")
        return cls(**merged_kwargs)

    @classmethod
    def get_neuron_config_cls(cls) -> Type[NeuronConfig]:
        return NeuronConfig


class FusedSpecNeuronConfig:
    """Base class for fused speculative decoding on Neuron."""

    def __init__(
        self,
        worker_cls,
        draft_config: InferenceConfig = None,
        draft_model_path: str = None,
        draft_model_cls=None,
    ) -> None:
        self.worker_cls = worker_cls
        self.draft_model_cls = draft_model_cls
        self.draft_config = draft_config
        self.draft_model_path = draft_model_path


class OnDeviceSamplingConfig:
    def __init__(self, **kwargs):
        # The release pops these and silently ignores anything else: the stand-in refuses the rest.
        known = ("do_sample", "top_k", "top_p", "temperature", "dynamic", "deterministic", "global_topk",
                 "on_device_sampling_config", "top_k_kernel_enabled", "sampling_dp_degree")
        contract.refuse_unknown("OnDeviceSamplingConfig", kwargs, known, "silently ignores unknown keywords")
        self.do_sample = kwargs.pop("do_sample", False)
        self.top_k = kwargs.pop("top_k", 1)
        self.top_p = kwargs.pop("top_p", 1.0)
        self.temperature = kwargs.pop("temperature", 1.0)
        self.dynamic = kwargs.pop("dynamic", False)
        self.deterministic = kwargs.pop("deterministic", False)
        self.global_topk = kwargs.pop("global_topk", 256)
        self.on_device_sampling_config = kwargs.pop("on_device_sampling_config", True)
        self.top_k_kernel_enabled = kwargs.pop("top_k_kernel_enabled", False)
        self.sampling_dp_degree = kwargs.pop("sampling_dp_degree", 1)


class ChunkedPrefillConfig:
    def __init__(self, **kwargs):
        self.max_num_seqs = kwargs.pop("max_num_seqs", 0)
        self.tkg_model_enabled = kwargs.pop("tkg_model_enabled", True)
        self.kernel_q_tile_size = kwargs.pop("kernel_q_tile_size", 128)
        self.kernel_kv_tile_size = kwargs.pop("kernel_kv_tile_size", 1024)


class TensorCaptureConfig:
    """
    Configuration class for tensor capture settings.

    This class encapsulates all settings related to tensor capture for debugging
    and accuracy verification.
    """

    def __init__(self, **kwargs):
        # List of module names to capture tensors from
        self.modules_to_capture = kwargs.pop("modules_to_capture", [])

        # Maximum number of intermediate tensors to capture
        self.max_intermediate_tensors = kwargs.pop("max_intermediate_tensors", None)
        # Automatically capture moe tensors for expert stats
        self.auto_capture_moe_tensors = kwargs.pop("auto_capture_moe_tensors", False)

        # Whether to capture input tensors for the specified modules
        self.capture_inputs = kwargs.pop("capture_inputs", False)

        # add one max_intermediate_tensors since auto captured moe tensors will be stacked as one single tensor
        # to ensure fixed shape model output
        if self.auto_capture_moe_tensors:
            self.max_intermediate_tensors = self.max_intermediate_tensors + 1 if self.max_intermediate_tensors else 1

        # Validate that if explicit values were provided, at least one capture mechanism is enabled
        if "modules_to_capture" in kwargs or "max_intermediate_tensors" in kwargs:
            if not self.modules_to_capture and self.max_intermediate_tensors is None:
                raise ValueError(
                    "When configuring tensor capture, at least one of "
                    "'modules_to_capture' or 'max_intermediate_tensors' must be specified."
                )

    def get_offset(self):
        capture_offset = 0
        if self.modules_to_capture:
            capture_offset = len(self.modules_to_capture)
            if self.capture_inputs:
                capture_offset += len(self.modules_to_capture)
        if self.max_intermediate_tensors:
            capture_offset += self.max_intermediate_tensors
        return capture_offset


class TensorReplacementConfig:
    def __init__(self, **kwargs):
        if "ref_dir" not in kwargs:
            raise ValueError("Missing required argument: ref_dir")
        if 'neuron_dir' not in kwargs:
            raise ValueError("Missing required argument: neuron_dir")
        if 'tf_map' not in kwargs:
            raise ValueError("Missing required argument: tf_map")
        if 'neuron_config' not in kwargs:
            raise ValueError("Missing required argument: neuron_config")

        self.ref_dir = kwargs.pop("ref_dir", None)
        if not os.path.isdir(self.ref_dir):
            raise FileNotFoundError(f"ref_dir does not exist or is not a directory: {self.ref_dir}")
        self.neuron_dir = kwargs.pop("neuron_dir", None)
        if not os.path.isdir(self.neuron_dir):
            raise FileNotFoundError(f"neuron_dir does not exist or is not a directory: {self.neuron_dir}")
        self.tr_map = kwargs.pop("tf_map", None)
        if type(self.tr_map) is not dict:
            raise FileNotFoundError(f"Tensor replacement map is expected to be a dict but got: {type(self.tr_map)}")
        self.config = kwargs.pop("neuron_config", None)
        self.module_map = kwargs.pop("module_map", None)

        # The release then registers the map (TensorReplacementRegister.get_instance, RuntimeRegister): not
        # transcribed, the stand-in raises NotImplementedError there.
        from neuronx_distributed_inference.utils.tensor_replacement.registry import TensorReplacementRegister

        TensorReplacementRegister.get_instance(
            ref_dir=self.ref_dir,
            neuron_dir=self.neuron_dir,
            tr_map=self.tr_map,
            config=self.config,
            ref_equiv_map=self.module_map,
        )
