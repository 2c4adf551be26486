"""The notebook's settings as each pinned stack's keywords (pure, tested; no SDK import).

:func:`neuron_settings` takes the settings the reference engine takes (``batch_size``, ``n_positions``,
``tp_degree``, ``amp``, ``context_length_estimate``, ``neuron_config`` with GQA and int8 ``quant``) plus
Neuron-only ones and returns the keywords of transformers-neuronx 0.13 (tnx) or NxD Inference 0.8 (nxdi);
what cannot be expressed is refused.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from pathlib import Path

from ..engine.config import NeuronConfig, reject_unknown
from ..engine.quant import NXDI_METHODS
from ..planning.buckets import nxdi_generate_buckets, tnx_context_buckets, tnx_token_buckets
from ..planning.dtypes import QUANT_DTYPES, amp_torch_name
from ..planning.gqa import GQA
from .runtime import STACKS, check_tp_degree

# transformers_neuronx/constants.py: GQA values (the reference engine uses the same enum).
TNX_GQA_VALUES = tuple(g.value for g in GQA)
# transformers_neuronx/config.py QuantizationConfig: QUANT_DTYPE_LIST, QUANTIZE_METHOD_LIST.
TNX_QUANT_DTYPES = tuple(QUANT_DTYPES)
TNX_QUANT_METHODS = ("vector_dynamic", "direct_cast")
# NxD Inference names for the same storage types (QuantizedDtype members are matched upper-cased,
# models/config.py _verify_quantized_config).
NXDI_QUANT_DTYPE = {"s8": "int8", "f8e4m3fn": "f8e4m3"}

# Every keyword NxD Inference 0.8's NeuronConfig pops (models/config.py NeuronConfig.__init__ and
# _get_lnc). The class only *logs* "NeuronConfig init: Unexpected keyword arguments" for anything
# else, so a typo silently runs with the default: neuron_settings() refuses unknown keys first.
NXDI_NEURON_CONFIG_KEYS = frozenset("""
allow_input_truncation apply_seq_ids_mask async_mode attention_dp_degree attention_dtype
attn_block_cte_nki_kernel_enabled attn_block_tkg_nki_kernel_cache_update
attn_block_tkg_nki_kernel_cascaded_attention attn_block_tkg_nki_kernel_disable_gpsimd_sb2sb
attn_block_tkg_nki_kernel_enabled attn_block_tkg_nki_kernel_use_online_softmax attn_cls
attn_kernel_enabled attn_tkg_builtin_kernel_enabled attn_tkg_nki_kernel_enabled batch_size
bucket_n_active_tokens buckets cast_type cc_pipeline_tiling_factor chunked_prefill_config
context_encoding_buckets cp_degree ctx_batch_size disable_argmax_kernel disable_kv_cache_tiling
disable_numeric_cc_token dma_order_config draft_model_modules_to_not_convert
eagle_rolling_buffer_kernel_enabled enable_bucketing enable_cte_modular_flow
enable_eagle_draft_input_norm enable_eagle_speculation enable_fused_speculation
enable_output_completion_notifications enable_spill_reload_dge ep_degree ep_dispatch_cc_option
expert_mlp_nki_kernel_enabled flash_decoding_enabled fused_qkv fused_rmsnorm_skip_gamma
is_block_kv_layout is_continuous_batching is_eagle3 is_eagle_draft is_full_model_shuffled is_medusa
is_mxfp4_compute is_prefix_caching k_cache_transposed kv_cache_batch_size kv_cache_padding_size
kv_cache_quant kv_quant_config layer_boundary_markers lm_head_pad lm_head_pad_alignment_size
local_ranks_size logical_nc_config logical_neuron_cores lora_config max_batch_size max_context_length
max_length max_new_tokens medusa_speculation_length medusa_tree mlp_cp_degree mlp_kernel_enabled
mlp_kernel_fuse_residual_add mlp_tkg_nki_kernel_enabled modules_to_not_convert
moe_fused_nki_kernel_enabled n_active_tokens n_positions num_medusa_heads on_cpu
on_device_sampling_config out_proj_kernel_enabled output_logits overrides_torch_dtype
pa_block_size pa_num_blocks padded_hidden_size padded_intermediate_size padding_side pp_degree
pre_rope_rmsnorm prefix_buckets qk_layernorm qkv_cte_nki_kernel_fuse_rope qkv_kernel_enabled
qkv_kernel_fuse_residual_add qkv_kernel_nbsd_layout qkv_nki_kernel_enabled quantization_block_axis
quantization_block_size quantization_dtype quantization_scale_dtype quantization_type
quantize_clamp_bound quantized quantized_checkpoints_path quantized_mlp_kernel_enabled
activation_quantization_type rmsnorm_quantize_kernel_enabled router_topk_nki_kernel_enabled
rpl_reduce_dtype save_sharded_checkpoint scratchpad_page_size seq_len seq_len_threshold_for_cc_tiling
sequence_parallel_enabled shared_mlp_nki_kernel_enabled skip_sharding skip_warmup spec_batch_size
speculation_length start_rank_id strided_context_parallel_kernel_enabled switch_cc target
tensor_capture_config tensor_replacement_config tkg_batch_size token_generation_batches
token_generation_buckets token_tree_config torch_dtype tp_degree vocab_parallel
weight_gather_seq_len_threshold weights_to_skip_layout_optimization windowed_context_encoding_size
world_size
""".split())


# What every refusal of an unknown keyword adds: the libraries themselves would not fail.
SILENT_TYPO = ("(The library itself would not fail: it ignores or only logs unknown keywords, so the typo would "
               "silently run with the default.)")


def refuse_unknown(keys, known, where: str) -> None:
    reject_unknown(keys, known, where, SILENT_TYPO)


# ------------------------------------------------------------------------------ settings mapping
@dataclasses.dataclass
class NeuronSettings:
    """The library keywords for one stack, computed from the notebook's settings (no SDK import)."""
    stack: str
    model_kwargs: dict           # tnx: from_pretrained keywords (besides neuron_config); nxdi: {}
    neuron_config: dict          # tnx or NxDI NeuronConfig keywords
    quantization: dict | None    # tnx QuantizationConfig keywords (nxdi: folded into neuron_config)
    speculation_length: int      # draft tokens per step, as the reference engine counts them

    @property
    def tokens_per_verification(self) -> int:
        """The libraries' k: positions the target scores per step = the draft tokens + the target's own next
        token (transformers-neuronx: enable_speculative_decoder(k) / SpeculativeGenerator(k) draft k - 1,
        speculation.py; NxD Inference: speculation_length=k verifies k positions, hf_adapter.py)."""
        return self.speculation_length + 1 if self.speculation_length else 0
    notes: list[str]


def _quant_fields(quant) -> dict:
    """transformers-neuronx QuantizationConfig fields from the reference ``neuron_config.quant``
    (an object or dict with the same attribute names, or a dtype string such as 's8')."""
    names = ("quant_dtype", "dequant_dtype", "quantize_method", "quantize_attn", "no_quantize_list")
    if isinstance(quant, str):
        fields = {"quant_dtype": quant}
    elif isinstance(quant, dict):
        fields = dict(quant)
    else:
        fields = {n: getattr(quant, n) for n in names if hasattr(quant, n)}
    refuse_unknown(fields, names, "neuron_config.quant")
    if fields.get("quant_dtype", "s8") not in TNX_QUANT_DTYPES:
        raise ValueError(f"quant_dtype={fields['quant_dtype']!r}: transformers-neuronx stores weights as one "
                         f"of {TNX_QUANT_DTYPES} (config.py QuantizationConfig)")
    if fields.get("quantize_method", "vector_dynamic") not in TNX_QUANT_METHODS:
        raise ValueError(f"quantize_method={fields['quantize_method']!r}: use one of {TNX_QUANT_METHODS}")
    return fields


def neuron_settings(stack: str, *, batch_size: int = 1, n_positions=2048, tp_degree: int = 1, amp: str = "f32",
                    context_length_estimate=None, neuron_config=None, speculation_length: int = 0,
                    quantized_checkpoints_path: str | None = None, nxdi_overrides: dict | None = None,
                    device: str | None = None, instance_family: str | None = None) -> NeuronSettings:
    """Map the reference engine's settings to one stack's keywords. Refuses what cannot be expressed.

    Buckets: transformers-neuronx takes ``n_positions`` (token buckets) and ``context_length_estimate``
    (context buckets) directly. For NxD Inference the *same bucket lists* are passed explicitly
    (``enable_bucketing``, ``token_generation_buckets``, ``context_encoding_buckets``) so both stacks
    compile the same graphs; ``seq_len`` = the largest token bucket and ``max_context_length`` = the
    largest context bucket. Note NxDI refuses a prompt longer than ``max_context_length`` where
    transformers-neuronx feeds the rest token by token (``base.py`` ``context``).
    """
    if stack not in STACKS:
        raise ValueError(f"stack={stack!r}: use 'tnx' (transformers-neuronx) or 'nxdi' (NxD Inference)")
    if device not in (None, "cpu"):
        raise ValueError(f"device={device!r} is a reference-engine setting: on Neuron the model runs on "
                         "NeuronCores (choose them with tp_degree / NEURON_RT_VISIBLE_CORES)")
    c = _common_settings(batch_size, n_positions, tp_degree, amp, context_length_estimate, neuron_config,
                         speculation_length, instance_family)
    if stack == "tnx":
        return _tnx_settings(c, nxdi_overrides, quantized_checkpoints_path)
    return _nxdi_settings(c, nxdi_overrides, quantized_checkpoints_path)


def _common_settings(batch_size, n_positions, tp_degree, amp, context_length_estimate, neuron_config,
                     speculation_length, instance_family) -> SimpleNamespace:
    """The settings both stacks read, checked: counts, buckets, GQA, int8 fields, the NeuronConfig flags."""
    torch_dtype = amp_torch_name(amp)  # refuses an unknown amp
    batch_size, tp_degree, speculation_length = int(batch_size), int(tp_degree), int(speculation_length)
    if batch_size < 1 or tp_degree < 1 or speculation_length < 0:
        raise ValueError("batch_size and tp_degree must be >= 1 and speculation_length >= 0")
    check_tp_degree(tp_degree, instance_family)
    if speculation_length and batch_size != 1:
        raise ValueError(f"speculation_length={speculation_length} with batch_size={batch_size}: helpers speculates "
                         "with a draft model at batch_size=1 on both stacks, as their guides document "
                         "(transformers-neuronx: 'Speculative sampling is currently supported for batch size 1', "
                         "although 0.13's SpeculativeGenerator.sample has a batched branch for right-padded rows; "
                         "NxD Inference: 'currently supports only batch sizes of 1', and 0.8's assisted loop is "
                         "written for one sequence): set batch_size=1")
    tokens = tnx_token_buckets(n_positions)
    contexts = tnx_context_buckets(context_length_estimate, tokens)
    if contexts and max(contexts) > max(tokens):
        # transformers_neuronx/module.py PretrainedModel.from_pretrained _sanity_check asserts the same.
        raise ValueError(f"Max context_length_estimate {max(contexts)} cannot be more than max n_positions "
                         f"{max(tokens)}: lower context_length_estimate or raise n_positions")
    nc = neuron_config
    gqa = getattr(nc, "group_query_attention", None)
    gqa = getattr(gqa, "value", gqa)
    if gqa is not None and gqa not in TNX_GQA_VALUES:
        raise ValueError(f"group_query_attention={gqa!r}: use one of {TNX_GQA_VALUES}")
    quant = getattr(nc, "quant", None)
    qfields = _quant_fields(quant) if quant is not None else None
    fuse_qkv = bool(getattr(nc, "fuse_qkv", False))
    on_device_embedding = bool(getattr(nc, "on_device_embedding", False))
    padding_side = getattr(nc, "padding_side", "left")
    if padding_side != "left":
        raise ValueError("padding_side must be 'left' (the notebooks pass left-padded batches; the NxD "
                         "Inference adapter re-pads them to the right itself)")
    notes: list[str] = []
    if getattr(nc, "compiled", False):
        notes.append("neuron_config.compiled is a reference-engine option (torch.export / AOTInductor graphs); "
                     "Neuron always compiles")
    return SimpleNamespace(amp=amp, torch_dtype=torch_dtype, batch_size=batch_size, tp_degree=tp_degree,
                           speculation_length=speculation_length, n_positions=n_positions,
                           context_length_estimate=context_length_estimate, tokens=tokens, contexts=contexts, gqa=gqa,
                           qfields=qfields, fuse_qkv=fuse_qkv, on_device_embedding=on_device_embedding, notes=notes)


def _tnx_settings(c: SimpleNamespace, nxdi_overrides, quantized_checkpoints_path) -> NeuronSettings:
    """transformers-neuronx's keywords for the checked settings ``c``."""
    if nxdi_overrides:
        raise ValueError("nxdi_overrides only apply to neuron_stack='nxdi'")
    if quantized_checkpoints_path is not None:
        raise ValueError("quantized_checkpoints_path is an NxD Inference setting: transformers-neuronx "
                         "quantizes while loading the checkpoint")
    ncfg = {"fuse_qkv": c.fuse_qkv, "on_device_embedding": c.on_device_embedding, "padding_side": "left"}
    if c.gqa is not None:
        ncfg["group_query_attention"] = c.gqa
    q = None
    if c.qfields is not None:
        q = dict(c.qfields)
        q.setdefault("dequant_dtype", c.amp)  # QuantizationConfig's default is 'f16': follow amp instead
        if q["dequant_dtype"] != c.amp:
            raise ValueError(f"dequant_dtype={q['dequant_dtype']!r} with amp={c.amp!r}: transformers-neuronx needs "
                             "them equal (guide: 'When using quantization, amp type must match dequant type'): "
                             f"set dequant_dtype={c.amp!r} or leave it out (it follows amp)")
    model_kwargs = {"batch_size": c.batch_size, "n_positions": c.n_positions if isinstance(c.n_positions, int)
                    else list(c.tokens), "tp_degree": c.tp_degree, "amp": c.amp,
                    "context_length_estimate": c.context_length_estimate if not isinstance(
                        c.context_length_estimate, (list, tuple)) else list(c.contexts)}
    return NeuronSettings("tnx", model_kwargs, ncfg, q, c.speculation_length, c.notes)


def _nxdi_settings(c: SimpleNamespace, nxdi_overrides, quantized_checkpoints_path) -> NeuronSettings:
    """NxD Inference's NeuronConfig keywords for the checked settings ``c``."""
    contexts, tokens, notes, qfields = c.contexts, c.tokens, c.notes, c.qfields
    if c.context_length_estimate is None:
        # transformers-neuronx's default (half of each token bucket) is not NxDI's: with no
        # context_encoding_buckets and max_context_length = seq_len, NxDI builds generate_buckets(128, seq_len)
        # (modules/autobucketing.py generate_buckets_for_cte). Passed explicitly, so both read the same list.
        contexts = nxdi_generate_buckets(min(128, max(tokens)), max(tokens))
    ncfg = {"batch_size": c.batch_size, "seq_len": max(tokens), "max_context_length": max(contexts) if contexts
            else max(tokens), "tp_degree": c.tp_degree, "torch_dtype": c.torch_dtype,
            "enable_bucketing": True, "token_generation_buckets": list(tokens),
            "padding_side": "right", "fused_qkv": c.fuse_qkv}
    if contexts:
        ncfg["context_encoding_buckets"] = list(contexts)
    else:
        notes.append("context_length_estimate <= 0 disables context encoding on transformers-neuronx; NxD "
                     "Inference always has a context-encoding model: using max_context_length=seq_len")
    if c.gqa is not None:
        notes.append(f"group_query_attention={c.gqa!r} is a transformers-neuronx option: NxD Inference 0.8 has no "
                     "such knob and picks REPLICATE_TO_TP_DEGREE, or CONVERT_TO_MHA when tp_degree % kv_heads "
                     "!= 0 (modules/attention/gqa.py determine_sharding_strategy)")
    if c.on_device_embedding:
        notes.append("on_device_embedding is a transformers-neuronx option; NxD Inference embeds on device")
    if qfields is not None:
        if qfields.get("quantize_method", "vector_dynamic") != "vector_dynamic":
            raise ValueError("quantize_method='direct_cast' has no NxD Inference equivalent: use "
                             "'vector_dynamic' (per-channel scales -> quantization_type='per_channel_symmetric')")
        if qfields.get("no_quantize_list") or qfields.get("quantize_attn") is False:
            raise ValueError("no_quantize_list / quantize_attn=False are transformers-neuronx options: on NxD "
                             "Inference pass nxdi_overrides={'modules_to_not_convert': [...]} instead")
        if quantized_checkpoints_path is None:
            raise ValueError("NxD Inference quantizes into a separate checkpoint: pass quantized_checkpoints_path "
                             "(a directory or .pt file; build_neuron_model creates it when missing)")
        ncfg.update(quantized=True, quantized_checkpoints_path=str(quantized_checkpoints_path),
                    quantization_type="per_channel_symmetric",
                    quantization_dtype=NXDI_QUANT_DTYPE[qfields.get("quant_dtype", "s8")],
                    # NxD Inference 0.8 quantizes every Linear not named here, lm_head included. On a model with
                    # tied embeddings (SmolLM2) the loader then puts the float embedding into the int8 lm_head
                    # and ModelBuilder.cast_weights casts it .to(int8) with only a log warning: nearly all zeros,
                    # meaningless logits (application_base.py get_state_dict, neuronx-distributed
                    # trace/model_builder.py cast_weights). Keep the LM head in float.
                    modules_to_not_convert=["lm_head"])
    if c.speculation_length:
        ncfg["speculation_length"] = c.speculation_length + 1  # the library's k: drafts + 1 (see NeuronSettings)
    overrides = dict(nxdi_overrides or {})
    refuse_unknown(overrides, NXDI_NEURON_CONFIG_KEYS, "nxdi_overrides (NxD Inference NeuronConfig)")
    ncfg.update(overrides)
    refuse_unknown(ncfg, NXDI_NEURON_CONFIG_KEYS, "NxD Inference NeuronConfig")
    if ncfg.get("quantized") and not any(key in "lm_head" for key in ncfg.get("modules_to_not_convert") or []):
        raise ValueError(f"modules_to_not_convert={ncfg.get('modules_to_not_convert')!r} quantizes lm_head: on a model "
                         "with tied embeddings NxD Inference 0.8 loads the float embedding into the int8 head "
                         "(cast to int8: nearly all zeros). Keep 'lm_head' in modules_to_not_convert")
    return NeuronSettings("nxdi", {}, ncfg, None, c.speculation_length, notes)


# The int8 modes each pinned Neuron stack stores weights in, as helpers.build_model(bk, ...) builds them.
NEURON_QUANT_MODES = {"tnx": ("vector_dynamic",), "nxdi": NXDI_METHODS}


def neuron_quant_settings(stack: str, method: str, amp: str, quantized_dir) -> dict:
    """The ``helpers.build_model`` keywords that store the weights as int8 with ``method`` on a Neuron stack.

    transformers-neuronx 0.13: ``QuantizationConfig(quant_dtype='s8', dequant_dtype=amp,
    quantize_method='vector_dynamic')`` (per-channel scales; ``dequant_dtype`` must equal ``amp``). NxD
    Inference 0.8: ``quantized=True`` with ``quantization_type`` per_channel_symmetric (what neuron_settings maps
    s8 to) or per_tensor_symmetric (an override), each read from its own quantized checkpoint, which
    helpers.neuron writes once with ``save_quantized_state_dict`` under ``quantized_dir`` (created here: the
    library's ``torch.save`` to a file path needs its folder)."""
    if stack not in NEURON_QUANT_MODES:
        raise ValueError(f"stack={stack!r}: use one of {list(NEURON_QUANT_MODES)}")
    if method not in NEURON_QUANT_MODES[stack]:
        raise ValueError(f"quantize_method={method!r} is not a mode of {stack}: use one of {NEURON_QUANT_MODES[stack]}")
    if stack == "tnx":
        return {"neuron_config": NeuronConfig(quant={"quant_dtype": "s8", "dequant_dtype": amp,
                                                     "quantize_method": "vector_dynamic"})}
    Path(quantized_dir).mkdir(parents=True, exist_ok=True)
    kw = {"neuron_config": NeuronConfig(quant={"quant_dtype": "s8"}),
          "quantized_checkpoints_path": str(Path(quantized_dir) / f"nxdi-{method}")}
    if method == "per_tensor_symmetric":
        kw["nxdi_overrides"] = {"quantization_type": "per_tensor_symmetric"}
    return kw
