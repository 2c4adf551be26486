"""neuronx_distributed_inference/models/config.py (0.8.0, SDK 2.28, commit cd3abf3): configuration classes.

The real ``NeuronConfig(**kwargs)`` pops the keywords below and only *logs*
``NeuronConfig init: Unexpected keyword arguments: {...}`` for the rest: the stand-in raises.
"""
import json
import os

import torch

import _neuron_contract as contract

# Every kwargs.pop(...) name in NeuronConfig.__init__ and NeuronConfig._get_lnc.
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

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
# neuronx_distributed QuantizedDtype members (matched upper-cased) and QuantizationType values.
QUANTIZED_DTYPES = ("INT8", "F8E4M3", "F8E4M3FN", "F8E5M2")
QUANTIZATION_TYPES = ("per_tensor_symmetric", "per_channel_symmetric", "blockwise_symmetric",
                      "expert_wise_per_channel_symmetric")


def to_torch_dtype(dtype_str: str) -> torch.dtype:
    assert dtype_str in _DTYPES, f"{dtype_str} is not a valid dtype"
    return _DTYPES[dtype_str]


class OnDeviceSamplingConfig:
    def __init__(self, **kwargs):
        # The real class sets these with kwargs.pop(name, default) and ignores anything else.
        known = ("do_sample", "top_k", "top_p", "temperature", "dynamic", "deterministic", "global_topk",
                 "on_device_sampling_config", "top_k_kernel_enabled", "sampling_dp_degree")
        contract.refuse_unknown("OnDeviceSamplingConfig", kwargs, known, "silently ignores unknown keywords")
        self.do_sample = kwargs.get("do_sample", False)
        self.top_k = kwargs.get("top_k", 1)
        self.top_p = kwargs.get("top_p", 1.0)
        self.temperature = kwargs.get("temperature", 1.0)
        self.dynamic = kwargs.get("dynamic", False)
        self.deterministic = kwargs.get("deterministic", False)
        self.global_topk = kwargs.get("global_topk", 256)


class NeuronConfig:
    def __init__(self, **kwargs) -> None:
        contract.refuse_unknown("NxDI NeuronConfig", kwargs, NEURON_CONFIG_KEYWORDS,
                                "only logs 'NeuronConfig init: Unexpected keyword arguments' (models/config.py)")
        self.batch_size = kwargs.get("batch_size", 1)
        self.padding_side = kwargs.get("padding_side", "right")
        self.allow_input_truncation = kwargs.get("allow_input_truncation", False)
        self.seq_len = kwargs.get("seq_len", 128)
        self.n_positions = kwargs.get("n_positions", self.seq_len)
        if "torch_dtype" in kwargs:
            dt = kwargs["torch_dtype"]
            self.torch_dtype = to_torch_dtype(dt) if isinstance(dt, str) else dt
            self.overrides_torch_dtype = kwargs.get("overrides_torch_dtype", True)
        else:
            self.torch_dtype, self.overrides_torch_dtype = torch.bfloat16, False
        self.max_context_length = kwargs.get("max_context_length", self.seq_len)
        self.max_length = kwargs.get("max_length", self.seq_len)
        assert self.max_context_length <= self.max_length, "max_context_length cannot be more than max_length"
        self.fused_qkv = kwargs.get("fused_qkv", False)
        self.on_device_sampling_config = kwargs.get("on_device_sampling_config")
        if type(self.on_device_sampling_config) is dict:
            self.on_device_sampling_config = OnDeviceSamplingConfig(**self.on_device_sampling_config)
        self.enable_bucketing = kwargs.get("enable_bucketing", False)
        self.context_encoding_buckets = kwargs.get("context_encoding_buckets")
        self.token_generation_buckets = kwargs.get("token_generation_buckets")
        if self.context_encoding_buckets is not None:
            self.context_encoding_buckets.sort()
            assert self.context_encoding_buckets[-1] <= self.max_context_length, \
                f"Context bucket {self.context_encoding_buckets[-1]} should be <= {self.max_context_length}"
        if self.token_generation_buckets is not None:
            self.token_generation_buckets.sort()
            assert self.token_generation_buckets[-1] <= self.max_length, \
                f"Token generation bucket {self.token_generation_buckets[-1]} should be <= {self.max_length}"
        self.quantized = kwargs.get("quantized", False)
        self.quantized_checkpoints_path = kwargs.get("quantized_checkpoints_path")
        if self.quantized is True:
            assert self.quantized_checkpoints_path is not None, "quantized_checkpoints_path is required"
        self.quantization_type = kwargs.get("quantization_type", "per_tensor_symmetric")
        self.quantization_dtype = kwargs.get("quantization_dtype", "int8")
        assert self.quantization_dtype.upper() in QUANTIZED_DTYPES, \
            f"{self.quantization_dtype} is not a valid QuantizedDtype."
        if self.quantized and self.quantization_type not in QUANTIZATION_TYPES:
            raise RuntimeError(f"{self.quantization_type} not supported")
        self.speculation_length = kwargs.get("speculation_length", 0)
        self.enable_fused_speculation = kwargs.get("enable_fused_speculation", False)
        self.tp_degree = kwargs.get("tp_degree", 1)
        self.skip_warmup = kwargs.get("skip_warmup", False)
        self._kwargs = dict(kwargs)
        contract.record("nxdi.NeuronConfig", **kwargs)

    @property
    def trace_tokengen_model(self):  # deprecated computed attribute, not a keyword
        return not self.enable_fused_speculation and self.speculation_length == 0


class InferenceConfig:
    attribute_map = {}

    def __init__(self, neuron_config: NeuronConfig, fused_spec_config=None, load_config=None, metadata=None, **kwargs):
        if not isinstance(neuron_config, NeuronConfig):
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

    def load_config(self):
        pass

    def save(self, model_path):
        # Writes neuron_config.json (CONFIG_FILE) with the neuron config and the model attributes.
        data = {k: v for k, v in self.__dict__.items() if k not in ("neuron_config", "fused_spec_config")}
        data["neuron_config"] = self.neuron_config._kwargs
        with open(os.path.join(model_path, "neuron_config.json"), "w") as fh:
            json.dump(data, fh, default=str)

    @classmethod
    def load(cls, model_path, **kwargs):
        with open(os.path.join(model_path, "neuron_config.json")) as fh:
            data = json.load(fh)
        neuron_config = cls.get_neuron_config_cls()(**data.pop("neuron_config"))
        data.pop("metadata", None)

        def load_config(self):
            self.__dict__.update(data)
        return cls(neuron_config, load_config=load_config, **kwargs)

    @classmethod
    def get_neuron_config_cls(cls):
        return NeuronConfig

    def add_derived_config(self):
        pass

    def get_required_attributes(self):
        return []

    def validate_config(self):
        missing = [a for a in self.get_required_attributes() if not hasattr(self, a)]
        assert len(missing) == 0, f"Config must define {missing}"


class FusedSpecNeuronConfig:
    def __init__(self, worker_cls, draft_config: InferenceConfig = None, draft_model_path: str = None,
                 draft_model_cls=None):
        self.worker_cls, self.draft_config, self.draft_model_path = worker_cls, draft_config, draft_model_path
