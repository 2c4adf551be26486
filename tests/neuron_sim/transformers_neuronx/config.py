"""transformers_neuronx/config.py (v0.13.0): the configuration classes, with their validation."""
import warnings
from typing import List, Optional

from transformers_neuronx.constants import GQA, Layout

import _neuron_contract as contract

valid_dtypes = ["float32", "float16", "bfloat16"]


class QuantizationConfig:
    def __init__(self, quant_dtype='s8', dequant_dtype='f16', quantize_method='vector_dynamic',
                 quantize_attn=True, no_quantize_list=[]):
        if quant_dtype not in ['s8', 'f8e4m3fn']:
            raise NotImplementedError(f"{quant_dtype} is not implemented. Available options are s8,f8e4m3fn")
        if quantize_method not in ['vector_dynamic', 'direct_cast']:
            raise NotImplementedError(f"{quantize_method} is not implemented. "
                                      "Available options are vector_dynamic,direct_cast")
        self.quant_dtype, self.dequant_dtype, self.quantize_method = quant_dtype, dequant_dtype, quantize_method
        self.quantize_attn, self.no_quantize_list = quantize_attn, no_quantize_list
        contract.record("tnx.QuantizationConfig", quant_dtype=quant_dtype, dequant_dtype=dequant_dtype,
                        quantize_method=quantize_method)

    def is_unit_scale(self, layer_num):
        return f"model.layers.{layer_num}" in self.no_quantize_list


class KVCacheQuantizationConfig:
    def __init__(self, quant_dtype='s8', dequant_dtype='bf16', quantize_method='direct_cast'):
        if quant_dtype not in ['s8', 'f16', 'bf16', 'f8e4m3fn']:
            raise NotImplementedError(f"{quant_dtype} is not implemented.")
        if quantize_method not in ['direct_cast']:
            raise NotImplementedError(f"{quantize_method} is not implemented.")
        self.quant_dtype, self.dequant_dtype, self.quantize_method = quant_dtype, dequant_dtype, quantize_method


class ContinuousBatchingConfig:
    def __init__(self, **kwargs):
        known = ("max_num_seqs", "batch_size_for_shared_caches", "max_model_len", "optimized_paged_attention",
                 "enable_chunked_prefill")
        # The real class asserts `len(kwargs) == 0` after popping these.
        contract.refuse_unknown("ContinuousBatchingConfig", kwargs, known, "asserts 'unexpected key word arguments'")
        self.max_num_seqs = kwargs.get("max_num_seqs") if kwargs.get("max_num_seqs") is not None \
            else kwargs["batch_size_for_shared_caches"]
        self.max_model_len = kwargs.get("max_model_len")
        self.optimized_paged_attention = bool(kwargs.get("optimized_paged_attention") or False)
        self.enable_chunked_prefill = bool(kwargs.get("enable_chunked_prefill") or False)
        if self.enable_chunked_prefill:
            assert self.optimized_paged_attention, "chunked prefill is only supported with optimized paged attention"

    @property
    def batch_size_for_shared_caches(self) -> int:
        return self.max_num_seqs


class GenerationConfig:
    def __init__(self, *, max_length=None, do_sample=False, top_k=50, top_p=1.0, top_p_min_tokens=1,
                 global_top_k=None, eos_token_id=None, temperature=1.0, dynamic=False, deterministic=False,
                 per_batch_line=False):
        self.max_length, self.do_sample, self.per_batch_line = max_length, do_sample, per_batch_line
        self.top_k = top_k
        self.top_p = [float(p) for p in top_p] if isinstance(top_p, list) else float(top_p)
        self.temperature = [float(t) for t in temperature] if isinstance(temperature, list) else float(temperature)
        self.top_p_min_tokens, self.global_top_k, self.eos_token_id = top_p_min_tokens, global_top_k, eos_token_id
        self.dynamic, self.deterministic = dynamic, deterministic


class NeuronConfig:
    def __init__(self, *, sparse_attn=None, quant: Optional[QuantizationConfig] = None, kv_cache_quant=None,
                 continuous_batching: Optional[ContinuousBatchingConfig] = None,
                 attention_layout: Layout = Layout.HSB, collectives_layout: Layout = Layout.HSB,
                 cache_layout: Layout = Layout.SBH, padding_side: str = 'left',
                 group_query_attention: Optional[GQA] = None, sequence_parallel_norm: bool = False,
                 sequence_parallel_norm_threshold: int = 2048, on_device_embedding: bool = False,
                 on_device_generation: Optional[GenerationConfig] = None, all_reduce_dtype: Optional[str] = None,
                 cast_logits_dtype: str = 'float32', fuse_qkv: bool = False, qkv_tiling: bool = False,
                 weight_tiling: bool = False, mlp_in_weight_tiling_permute_order: List[int] = [1, 2, 0, 3],
                 mlp_out_weight_tiling_permute_order: List[int] = [1, 2, 0, 3], log_softmax_scores: bool = False,
                 shard_over_sequence: bool = False, output_all_logits: bool = False,
                 attn_output_transposed: bool = False, fused_rmsnorm_qkv: bool = False,
                 fused_rmsnorm_mlp: bool = False, mlp_out_weight_transpose: bool = False, fuse_mlp: bool = False,
                 is_eagle_target: bool = False, is_eagle_draft: bool = False, has_pre_attention_norm: bool = True,
                 compilation_worker_count: Optional[int] = None, duplicate_q_weight_sos: bool = False, **kwargs):
        assert cast_logits_dtype in valid_dtypes, (
            f"The `cast_logits_dtype={cast_logits_dtype}` argument must be one of {valid_dtypes}")
        assert padding_side in ['left', 'right'], (
            f"The `padding_side={padding_side}` argument must be either 'left' or 'right'")
        for deprecated in ('use_2d_cache_ids', 'lhs_aligned'):
            if deprecated in kwargs:
                warnings.warn(f"NeuronConfig `{deprecated}` argument is deprecated. Please specify `padding_side = 'right'`.")
                kwargs.pop(deprecated)
        assert len(kwargs) == 0, f"Unexpected NeuronConfig keyword arguments: {kwargs}"
        if quant is not None and not isinstance(quant, QuantizationConfig):
            raise contract.ContractError("NeuronConfig(quant=...) takes a transformers_neuronx QuantizationConfig")
        self.sparse_attn, self.quant, self.kv_cache_quant = sparse_attn, quant, kv_cache_quant
        self.continuous_batching = continuous_batching
        self.padding_side = "right" if continuous_batching else padding_side
        self.attention_layout, self.collectives_layout, self.cache_layout = attention_layout, collectives_layout, cache_layout
        self.group_query_attention = GQA(group_query_attention) if group_query_attention is not None else None
        assert sequence_parallel_norm_threshold > 0
        self.sequence_parallel_norm = sequence_parallel_norm
        self.sequence_parallel_norm_threshold = sequence_parallel_norm_threshold
        self.on_device_embedding, self.on_device_generation = on_device_embedding, on_device_generation
        self.all_reduce_dtype, self.cast_logits_dtype = all_reduce_dtype, cast_logits_dtype
        if qkv_tiling:
            assert fuse_qkv, "QKV weight tiling is currently only supported when QKV fusion is enabled."
        self.fuse_qkv, self.qkv_tiling, self.weight_tiling, self.fuse_mlp = fuse_qkv, qkv_tiling, weight_tiling, fuse_mlp
        self.shard_over_sequence, self.output_all_logits = shard_over_sequence, output_all_logits
        self.log_softmax_scores = log_softmax_scores
        self.is_eagle_target, self.is_eagle_draft = is_eagle_target, is_eagle_draft
        self.compilation_worker_count = compilation_worker_count
        contract.record("tnx.NeuronConfig", group_query_attention=self.group_query_attention, quant=quant,
                        fuse_qkv=fuse_qkv, on_device_embedding=on_device_embedding, padding_side=padding_side)
