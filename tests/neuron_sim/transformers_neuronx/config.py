"""Stand-in of ``src/transformers_neuronx/config.py`` at aws-neuron/transformers-neuronx v0.13.0 (commit f4e3818).

The configuration classes with their defaults, validation and error texts as in the source. Where the
real class accepts a value it would misread (a ``quant`` that is not its QuantizationConfig), the stand-in
raises ``ContractError`` instead.
"""
import os
import warnings
from typing import List, Optional

from transformers_neuronx.constants import GQA, Layout

import _neuron_contract as contract

valid_dtypes = [
    "float32",
    "float16",
    "bfloat16",
]


class QuantizationConfig:
    """ The config class that contains all quantization related settings """

    def __init__(self, quant_dtype='s8', dequant_dtype='f16', quantize_method='vector_dynamic',
                 quantize_attn=True, no_quantize_list=[]):
        QUANT_DTYPE_LIST = ['s8', 'f8e4m3fn']
        QUANTIZE_METHOD_LIST = ['vector_dynamic', 'direct_cast']
        self.quant_dtype = quant_dtype
        if self.quant_dtype not in QUANT_DTYPE_LIST:
            # (the source's message continues a line inside the f-string: the indentation is part of it)
            raise NotImplementedError(f"{self.quant_dtype} is not implemented. \
                                      Available options are {','.join(QUANT_DTYPE_LIST)}")
        self.dequant_dtype = dequant_dtype
        self.quantize_method = quantize_method
        if self.quantize_method not in QUANTIZE_METHOD_LIST:
            raise NotImplementedError(f"{self.quantize_method} is not implemented. \
                                      Available options are {','.join(QUANTIZE_METHOD_LIST)}")
        self.quantize_attn = quantize_attn
        self.no_quantize_list = no_quantize_list
        contract.record("tnx.QuantizationConfig", quant_dtype=quant_dtype, dequant_dtype=dequant_dtype,
                        quantize_method=quantize_method)

    def is_unit_scale(self, layer_num):
        return f"model.layers.{layer_num}" in self.no_quantize_list


class KVCacheQuantizationConfig:
    """ The config class that contains all KV cache quantization related settings """
    def __init__(self, quant_dtype='s8', dequant_dtype='bf16', quantize_method='direct_cast'):
        QUANT_DTYPE_LIST = ['s8', 'f16', 'bf16', 'f8e4m3fn']
        QUANTIZE_METHOD_LIST = ['direct_cast', ]
        self.quant_dtype = quant_dtype
        if self.quant_dtype not in QUANT_DTYPE_LIST:
            raise NotImplementedError(f"{self.quant_dtype} is not implemented. "
                                      f"Available options are {','.join(QUANT_DTYPE_LIST)}")
        self.dequant_dtype = dequant_dtype
        self.quantize_method = quantize_method
        if self.quantize_method not in QUANTIZE_METHOD_LIST:
            raise NotImplementedError(f"{self.quantize_method} is not implemented. "
                                      f" Available options are {','.join(QUANTIZE_METHOD_LIST)}")


class ContinuousBatchingConfig:
    """
    The config class that contains all continuous batching related settings
    """

    def __init__(self, **kwargs):
        self.max_num_seqs = kwargs.pop("max_num_seqs") if kwargs.get("max_num_seqs", None) is not None \
            else kwargs.pop("batch_size_for_shared_caches")
        self.max_model_len = kwargs.pop("max_model_len") if kwargs.get("max_model_len", None) is not None else None
        self.optimized_paged_attention = kwargs.pop("optimized_paged_attention") \
            if kwargs.get("optimized_paged_attention", None) is not None else False
        self.enable_chunked_prefill = kwargs.pop("enable_chunked_prefill") \
            if kwargs.get("enable_chunked_prefill", None) is not None else False
        if self.enable_chunked_prefill:
            assert self.optimized_paged_attention, "chunked prefill is only supported with optimized paged attention"
        self.block_size = None
        self.num_blocks = None
        assert len(kwargs) == 0, f"unexpected key word arguments: {kwargs.keys()}"

    @property
    def batch_size_for_shared_caches(self) -> int:
        return self.max_num_seqs

    @property
    def _paged_attention(self) -> bool:
        if self.block_size and self.max_model_len:
            if self.block_size < self.max_model_len:
                return True
        return False

    def init_cache_engine(self, block_size, num_blocks):
        self.block_size = block_size
        self.num_blocks = num_blocks


class GenerationConfig:

    def __init__(self, *,
        max_length = None,
        do_sample = False,
        top_k = 50,
        top_p = 1.0,
        top_p_min_tokens = 1,
        global_top_k = None,
        eos_token_id = None,
        temperature = 1.0,
        dynamic = False,
        deterministic = False,
        per_batch_line = False,
    ):
        self.max_length = max_length
        self.do_sample = do_sample
        self.per_batch_line = per_batch_line
        self.top_k = top_k
        self.top_p = float(top_p) if not isinstance(top_p, list) else self._convert_list_to_float(top_p)
        self.temperature = float(temperature) if not isinstance(temperature, list) \
            else self._convert_list_to_float(temperature)
        self.top_p_min_tokens = top_p_min_tokens
        self.global_top_k = global_top_k
        self.eos_token_id = eos_token_id
        self.dynamic = dynamic
        self.deterministic = deterministic

    def __eq__(self, value: object) -> bool:
        if not isinstance(value, GenerationConfig):
            return False
        return self.__dict__ == value.__dict__

    def _convert_list_to_float(self, params):
        return [float(p) for p in params]


class NeuronConfig():
    """Neuron configurations for extra features and performance optimizations (see the source's docstring)."""

    def __init__(self, *,
        sparse_attn = None,
        quant: Optional[QuantizationConfig] = None,
        kv_cache_quant: Optional[KVCacheQuantizationConfig] = None,
        continuous_batching: Optional[ContinuousBatchingConfig] = None,
        attention_layout: Layout = Layout.HSB,
        collectives_layout: Layout = Layout.HSB,
        cache_layout: Layout = Layout.SBH,
        padding_side: str = 'left',
        group_query_attention: Optional[GQA] = None,
        sequence_parallel_norm: bool = False,
        sequence_parallel_norm_threshold: int = 2048,
        on_device_embedding: bool = False,
        on_device_generation: Optional[GenerationConfig] = None,
        all_reduce_dtype: Optional[str] = None,
        cast_logits_dtype: str = 'float32',
        fuse_qkv: bool = False,
        qkv_tiling: bool = False,
        weight_tiling: bool = False,
        mlp_in_weight_tiling_permute_order: List[int] = [1,2,0,3],
        mlp_out_weight_tiling_permute_order: List[int] = [1,2,0,3],
        log_softmax_scores: bool = False,
        shard_over_sequence: bool = False,
        output_all_logits: bool = False,
        attn_output_transposed: bool = False,
        fused_rmsnorm_qkv: bool = False,
        fused_rmsnorm_mlp: bool = False,
        mlp_out_weight_transpose: bool = False,
        fuse_mlp: bool = False,
        is_eagle_target: bool = False,
        is_eagle_draft: bool = False,
        has_pre_attention_norm: bool = True,
        compilation_worker_count: Optional[int] = None,
        duplicate_q_weight_sos: bool = False,
        **kwargs,
    ):
        if quant is not None and not isinstance(quant, QuantizationConfig):
            raise contract.ContractError("NeuronConfig(quant=...) takes a transformers_neuronx QuantizationConfig, "
                                         f"got {type(quant).__module__}.{type(quant).__name__}")
        self.all_reduce_dtype = all_reduce_dtype
        self.sparse_attn = sparse_attn
        self.quant = quant
        self.kv_cache_quant = kv_cache_quant
        self.cast_logits_dtype = cast_logits_dtype
        assert cast_logits_dtype in valid_dtypes, (
            f"The `cast_logits_dtype={cast_logits_dtype}` argument must be one of {valid_dtypes}"
        )
        self.fuse_qkv = fuse_qkv
        self.fuse_mlp = fuse_mlp
        self.continuous_batching = continuous_batching
        self.padding_side = padding_side
        assert padding_side in ['left', 'right'], (
            f"The `padding_side={padding_side}` argument must be either 'left' or 'right'"
        )
        self.lhs_aligned = padding_side == 'right'
        if 'use_2d_cache_ids' in kwargs:
            warnings.warn(
                "NeuronConfig `use_2d_cache_ids` argument is deprecated. "
                "Please specify `padding_side = 'right'`."
            )
            self.lhs_aligned = kwargs.pop('use_2d_cache_ids', False)
        if 'lhs_aligned' in kwargs:
            warnings.warn(
                "NeuronConfig `lhs_aligned` argument is deprecated. "
                "Please specify `padding_side = 'right'`."
            )
            self.lhs_aligned = kwargs.pop('lhs_aligned', False)
        if self.continuous_batching:
            self.lhs_aligned = True
            self.padding_side = "right"
        self.attention_layout = attention_layout
        self.collectives_layout = collectives_layout
        self.cache_layout = cache_layout
        self.log_softmax_scores = log_softmax_scores
        self.group_query_attention = group_query_attention
        if self.group_query_attention is not None:
            self.group_query_attention = GQA(self.group_query_attention)
        self.sequence_parallel_norm = sequence_parallel_norm
        self.sequence_parallel_norm_threshold = sequence_parallel_norm_threshold
        assert sequence_parallel_norm_threshold > 0, (
            f"sequence_parallel_norm_threshold={sequence_parallel_norm_threshold} must be greater than zero"
        )
        self.on_device_embedding = on_device_embedding
        self.on_device_generation = on_device_generation
        self.qkv_tiling = qkv_tiling
        if self.qkv_tiling is True:
            assert self.fuse_qkv is True, (
                "QKV weight tiling is currently only supported when QKV fusion is enabled."
            )
        self.weight_tiling = weight_tiling
        self.mlp_in_weight_tiling_permute_order = mlp_in_weight_tiling_permute_order
        self.mlp_out_weight_tiling_permute_order = mlp_out_weight_tiling_permute_order
        assert self.mlp_in_weight_tiling_permute_order.index(2) < self.mlp_in_weight_tiling_permute_order.index(3), \
            "original dim 2 has to be front of dim 3 after applying `mlp_in_weight_tiling_permute_order`"
        assert self.mlp_out_weight_tiling_permute_order.index(2) < self.mlp_out_weight_tiling_permute_order.index(3), \
            "original dim 2 has to be front of dim 3 after applying `mlp_out_weight_tiling_permute_order`"
        if os.environ.get("NEURON_INTERNAL_TRANSFORM_WEIGHT_LAYOUT", False):
            warnings.warn(
                "NEURON_INTERNAL_TRANSFORM_WEIGHT_LAYOUT is deprecated. "
                "To enable weight tiling, please use `NeuronConfig(weight_tiling=True)` instead.",
            )
            self.weight_tiling = True
        self.output_all_logits = output_all_logits
        assert len(kwargs) == 0, (
            f"Unexpected NeuronConfig keyword arguments: {kwargs}"
        )
        self.rank_id = int(os.getenv("NEURON_RANK_ID", "0"))
        self.local_tp = os.getenv("NEURON_LOCAL_TP", None)
        self.pp_stages = int(os.getenv("NEURON_PP_STAGES", 1))
        if self.local_tp is not None:
            self.local_tp = int(self.local_tp)
        self.dist = None
        self.layer_partition = {}
        self.shard_over_sequence = shard_over_sequence
        self.is_sequence_parallel = False
        self.attn_output_transposed = attn_output_transposed
        self.fused_rmsnorm_qkv = fused_rmsnorm_qkv
        self.fused_rmsnorm_mlp = fused_rmsnorm_mlp
        if any([not self.fuse_qkv,
                self.attention_layout != Layout.BSH,
                self.group_query_attention != GQA.REPLICATED_HEADS,
                self.sequence_parallel_norm]):
            self.fused_rmsnorm_qkv = False
        if any([self.attention_layout != Layout.BSH,
                self.group_query_attention != GQA.REPLICATED_HEADS]):
            self.fused_rmsnorm_mlp = False
        self.mlp_out_weight_transpose = mlp_out_weight_transpose
        if self.shard_over_sequence:
            assert self.sparse_attn is None, "sparse attn is not supported with flash decoding"
            if not (self.continuous_batching and self.continuous_batching.optimized_paged_attention):
                assert self.cache_layout == Layout.SBH, f"flash decoding only support SBH layout , got {self.cache_layout}"
        self.duplicate_q_weight_sos = duplicate_q_weight_sos
        self.is_eagle_target = is_eagle_target
        self.is_eagle_draft = is_eagle_draft
        self.has_pre_attention_norm = has_pre_attention_norm
        self.compilation_worker_count = compilation_worker_count
        contract.record("tnx.NeuronConfig", group_query_attention=self.group_query_attention, quant=quant,
                        fuse_qkv=fuse_qkv, on_device_embedding=on_device_embedding, padding_side=padding_side)

    @property
    def use_2d_cache_ids(self):
        return self.lhs_aligned

    @property
    def use_1d_query(self):
        return self.cache_layout == Layout.BSH and self.padding_side == 'right'

    @property
    def paged_attention(self):
        if self.continuous_batching:
            return self.continuous_batching._paged_attention and self.bsh_cache_layout
        return False

    @property
    def enable_chunked_prefill(self):
        return self.paged_attention and self.continuous_batching.enable_chunked_prefill

    @property
    def optimized_paged_attention(self):
        return self.paged_attention and self.continuous_batching.optimized_paged_attention

    @property
    def bsh_cache_layout(self):
        return self.cache_layout == Layout.BSH

    @property
    def vectorize_last_token_id(self):
        return self.lhs_aligned

    def is_pp(self):
        return self.pp_stages > 1

    def auto_layer_partition(self, num_layers):
        self.num_layers = num_layers
        if not self.is_pp():
            return list(range(self.num_layers))
        raise NotImplementedError("pipeline parallelism (NEURON_PP_STAGES > 1) is not transcribed in the stand-in")

    def to_json(self):
        """As the source: a JSON-able dict of every attribute (enums by value, objects by their __dict__)."""
        import enum

        json_serializable_types = (str, int, float, bool)

        def _to_json(obj):
            if obj is None or isinstance(obj, json_serializable_types):
                return obj
            elif isinstance(obj, enum.Enum):
                return obj.value
            elif isinstance(obj, list):
                return [_to_json(e) for e in obj]
            elif isinstance(obj, dict):
                return {_to_json(k): _to_json(v) for k, v in obj.items()}
            elif isinstance(obj, tuple):
                return str(tuple(_to_json(e) for e in obj))
            else:
                return _to_json(obj.__dict__)
        return _to_json(self)
