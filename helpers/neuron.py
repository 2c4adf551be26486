"""The Neuron backend: build and run the notebook's model with transformers-neuronx or NxD Inference.

One entry point, :func:`build_neuron_model`, takes the settings the reference engine takes
(``batch_size``, ``n_positions``, ``tp_degree``, ``amp``, ``context_length_estimate``,
``neuron_config`` with GQA and int8 ``quant``) plus Neuron-only ones (``speculation_length``,
``draft_model_path``, ``compiled_dir``), maps them with :func:`neuron_settings` (pure, tested) and
returns a :class:`NeuronSampler` whose ``sample()`` has the reference engine's signature on both
stacks. The Neuron SDK is imported lazily, inside functions: this module imports on any machine.

Pinned releases (read from their source; paths below are inside those packages):

- ``tnx``: transformers-neuronx 0.13 (Neuron SDK 2.26, its last release), tag v0.13.0.
- ``nxdi``: neuronx-distributed-inference 0.8 (Neuron SDK 2.28, the last release for Inf2/Trn1).

Runtime hygiene: the Neuron runtime releases NeuronCores only when the process exits, so run one
notebook per process (the papermill runner does) and set ``NEURON_RT_VISIBLE_CORES`` /
``NEURON_RT_NUM_CORES`` / ``OMP_NUM_THREADS`` / the compile cache with
:func:`configure_neuron_runtime` *before* the first model is loaded.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path

import torch

from .sampling import validate_input_ids, validate_sampling_args
from .buckets import nxdi_generate_buckets, tnx_context_buckets, tnx_token_buckets
from .model_store import resolve_model_path, with_legacy_keys
from .planner import PLATFORM_TP_DEGREES

STACKS = ("tnx", "nxdi")
AMP_TO_TORCH_DTYPE = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
# transformers_neuronx/constants.py: GQA values (the reference engine uses the same strings).
TNX_GQA_VALUES = ("shard-over-heads", "shard-over-batch", "replicated-heads", "all-gather-heads")
# transformers_neuronx/config.py QuantizationConfig: QUANT_DTYPE_LIST, QUANTIZE_METHOD_LIST.
TNX_QUANT_DTYPES = ("s8", "f8e4m3fn")
TNX_QUANT_METHODS = ("vector_dynamic", "direct_cast")
# NxD Inference names for the same storage types (QuantizedDtype members are matched upper-cased,
# models/config.py _verify_quantized_config).
NXDI_QUANT_DTYPE = {"s8": "int8", "f8e4m3fn": "f8e4m3"}
# The instance families the pinned stacks run on (trn2 needs later SDKs for NxD Inference kernels).
FAMILIES = ("inf2", "trn1")
# EC2 (Nitro) reports the instance type here, e.g. "inf2.xlarge".
DMI_PRODUCT_NAME = "/sys/devices/virtual/dmi/id/product_name"

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


def _refuse_unknown(keys, known, where: str) -> None:
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{where}: unknown keyword {key!r}.{hint} (The library itself would not fail: "
                            "it ignores or only logs unknown keywords, so the typo would silently run "
                            "with the default.)")


def detect_instance_family(product_name_file: str = DMI_PRODUCT_NAME) -> str | None:
    """'inf2' / 'trn1' from the instance type EC2 reports (``inf2.xlarge`` -> ``inf2``); None elsewhere."""
    try:
        name = Path(product_name_file).read_text().strip()
    except OSError:
        return None
    family = name.split(".", 1)[0]
    return family if family in FAMILIES else None


def check_tp_degree(tp_degree: int, instance_family: str | None = None) -> None:
    """Refuse a tp_degree the Neuron runtime does not run on this instance family (tnx guide: inf2 1, 2, 4, 8,
    24; trn1 1, 2, 8, 16, 32). The family is ``instance_family``, else the one this instance reports; where
    neither is known (no Neuron instance), only the degrees valid on both families pass."""
    family = instance_family or detect_instance_family()
    if family is not None and family not in FAMILIES:
        raise ValueError(f"instance_family={family!r}: use one of {FAMILIES}")
    if family is not None:
        if tp_degree not in PLATFORM_TP_DEGREES[family]:
            raise ValueError(f"tp_degree={tp_degree} does not run on {family}: use one of "
                             f"{PLATFORM_TP_DEGREES[family]} (NeuronCores per model on {family})")
        return
    both = [t for t in PLATFORM_TP_DEGREES["inf2"] if t in PLATFORM_TP_DEGREES["trn1"]]
    if tp_degree not in both:
        valid_on = [f for f in FAMILIES if tp_degree in PLATFORM_TP_DEGREES[f]]
        hint = (f"it runs on {valid_on[0]} only: pass instance_family={valid_on[0]!r}" if valid_on else
                f"valid degrees: inf2 {PLATFORM_TP_DEGREES['inf2']}, trn1 {PLATFORM_TP_DEGREES['trn1']}")
        raise ValueError(f"tp_degree={tp_degree}: the instance family is unknown here (no EC2 instance type in "
                         f"{DMI_PRODUCT_NAME}) and {hint}")


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
    _refuse_unknown(fields, names, "neuron_config.quant")
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
    if amp not in AMP_TO_TORCH_DTYPE:
        raise ValueError(f"amp={amp!r}: use one of {sorted(AMP_TO_TORCH_DTYPE)}")
    batch_size, tp_degree, speculation_length = int(batch_size), int(tp_degree), int(speculation_length)
    if batch_size < 1 or tp_degree < 1 or speculation_length < 0:
        raise ValueError("batch_size and tp_degree must be >= 1 and speculation_length >= 0")
    check_tp_degree(tp_degree, instance_family)
    if speculation_length and batch_size != 1:
        raise ValueError(f"speculation_length={speculation_length} with batch_size={batch_size}: speculative decoding "
                         "with a draft model runs at batch_size=1 on both stacks (transformers-neuronx guide: "
                         "'Speculative sampling is currently supported for batch size 1'; NxD Inference guide: "
                         "'currently supports only batch sizes of 1'): set batch_size=1")
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

    if stack == "tnx":
        if nxdi_overrides:
            raise ValueError("nxdi_overrides only apply to neuron_stack='nxdi'")
        if quantized_checkpoints_path is not None:
            raise ValueError("quantized_checkpoints_path is an NxD Inference setting: transformers-neuronx "
                             "quantizes while loading the checkpoint")
        ncfg = {"fuse_qkv": fuse_qkv, "on_device_embedding": on_device_embedding, "padding_side": "left"}
        if gqa is not None:
            ncfg["group_query_attention"] = gqa
        q = None
        if qfields is not None:
            q = dict(qfields)
            q.setdefault("dequant_dtype", amp)  # QuantizationConfig's default is 'f16': follow amp instead
            if q["dequant_dtype"] != amp:
                raise ValueError(f"dequant_dtype={q['dequant_dtype']!r} with amp={amp!r}: transformers-neuronx needs "
                                 "them equal (guide: 'When using quantization, amp type must match dequant type'): "
                                 f"set dequant_dtype={amp!r} or leave it out (it follows amp)")
        model_kwargs = {"batch_size": batch_size, "n_positions": n_positions if isinstance(n_positions, int)
                        else list(tokens), "tp_degree": tp_degree, "amp": amp,
                        "context_length_estimate": context_length_estimate if not isinstance(
                            context_length_estimate, (list, tuple)) else list(contexts)}
        return NeuronSettings("tnx", model_kwargs, ncfg, q, speculation_length, notes)

    # NxD Inference
    if context_length_estimate is None:
        # transformers-neuronx's default (half of each token bucket) is not NxDI's: with no
        # context_encoding_buckets and max_context_length = seq_len, NxDI builds generate_buckets(128, seq_len)
        # (modules/autobucketing.py generate_buckets_for_cte). Passed explicitly, so both read the same list.
        contexts = nxdi_generate_buckets(min(128, max(tokens)), max(tokens))
    ncfg = {"batch_size": batch_size, "seq_len": max(tokens), "max_context_length": max(contexts) if contexts
            else max(tokens), "tp_degree": tp_degree, "torch_dtype": AMP_TO_TORCH_DTYPE[amp],
            "enable_bucketing": True, "token_generation_buckets": list(tokens),
            "padding_side": "right", "fused_qkv": fuse_qkv}
    if contexts:
        ncfg["context_encoding_buckets"] = list(contexts)
    else:
        notes.append("context_length_estimate <= 0 disables context encoding on transformers-neuronx; NxD "
                     "Inference always has a context-encoding model: using max_context_length=seq_len")
    if gqa is not None:
        notes.append(f"group_query_attention={gqa!r} is a transformers-neuronx option: NxD Inference 0.8 has no "
                     "such knob and picks REPLICATE_TO_TP_DEGREE, or CONVERT_TO_MHA when tp_degree % kv_heads "
                     "!= 0 (modules/attention/gqa.py determine_sharding_strategy)")
    if on_device_embedding:
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
                    quantization_dtype=NXDI_QUANT_DTYPE[qfields.get("quant_dtype", "s8")])
    if speculation_length:
        ncfg["speculation_length"] = speculation_length + 1  # the library's k: drafts + 1 (see NeuronSettings)
    overrides = dict(nxdi_overrides or {})
    _refuse_unknown(overrides, NXDI_NEURON_CONFIG_KEYS, "nxdi_overrides (NxD Inference NeuronConfig)")
    ncfg.update(overrides)
    _refuse_unknown(ncfg, NXDI_NEURON_CONFIG_KEYS, "NxD Inference NeuronConfig")
    return NeuronSettings("nxdi", {}, ncfg, None, speculation_length, notes)


# ------------------------------------------------------------------------------ checkpoints
def read_hf_config(model_path) -> dict:
    return json.loads((Path(model_path) / "config.json").read_text())


def neuron_model_dir(model_path=None, cache_dir=None) -> str:
    """A checkpoint directory the pinned stacks read correctly; ``model_path`` itself when it already is.

    transformers 5 writes RoPE settings as ``rope_parameters`` and the dtype as ``dtype``. The Neuron
    stacks run on older transformers (tnx: <4.48, NxDI: 4.57), whose LlamaConfig does not know
    ``rope_parameters``: transformers-neuronx then reads ``getattr(config, "rope_theta", 10000)``
    (``llama/config.py``), silently the wrong base for a model trained with another theta (SmolLM2:
    100000). This writes a sibling directory with the legacy keys and links to the same files.
    """
    src = Path(resolve_model_path(model_path))
    cfg = read_hf_config(src)
    legacy = with_legacy_keys(cfg)
    if legacy == cfg:
        return str(src)
    legacy.pop("rope_parameters", None)
    digest = hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest()[:10]
    dst = Path(cache_dir or src.parent) / f"{src.name}-neuron-{digest}"
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        link = dst / f.name
        if f.name != "config.json" and not link.exists():
            link.symlink_to(f.resolve())
    (dst / "config.json").write_text(json.dumps(legacy, indent=2))
    return str(dst)


def _check_architecture(stack: str, cfg: dict) -> str:
    model_type = cfg.get("model_type")
    if model_type not in ("llama", "mistral"):
        raise ValueError(f"model_type={model_type!r}: the notebooks support Llama and Mistral checkpoints")
    if model_type == "mistral" and stack == "nxdi":
        raise ValueError("Mistral on NxD Inference 0.8 (SDK 2.28): the package has no models.mistral (it "
                         "first appears after the 0.9 / SDK 2.29 release, which dropped Inf2/Trn1). Use "
                         "neuron_stack='tnx' (MistralForSampling) or a Llama checkpoint.")
    head_dim = cfg.get("head_dim")
    if stack == "tnx" and head_dim and head_dim != cfg["hidden_size"] // cfg["num_attention_heads"]:
        raise ValueError(f"head_dim={head_dim} != hidden_size // num_attention_heads: transformers-neuronx 0.13 "
                         "derives the head size from hidden_size (llama/config.py attention_head_size)")
    return model_type


def library_version(stack: str) -> str | None:
    """The installed library's version: artifacts compiled by another release do not load (transformers-neuronx
    matches NEFFs by HLO hash and raises on a miss), so the default folder is keyed by it too."""
    try:
        return importlib.metadata.version({"tnx": "transformers-neuronx", "nxdi": "neuronx-distributed-inference"}[stack])
    except importlib.metadata.PackageNotFoundError:
        return None


def default_compiled_dir(stack: str, model_path: str, settings: NeuronSettings) -> str:
    """A compiled-artifacts folder keyed by the model and every setting (a stale folder cannot match)."""
    root = os.environ.get("HELPERS_NEURON_COMPILED_DIR") or os.path.join(tempfile.gettempdir(), "neuron-compiled")
    key = json.dumps([stack, library_version(stack), str(model_path), settings.model_kwargs, settings.neuron_config,
                      settings.quantization, settings.speculation_length], sort_keys=True, default=str)
    return os.path.join(root, stack, hashlib.sha256(key.encode()).hexdigest()[:16])


# ------------------------------------------------------------------------------ build
def build_neuron_model(stack: str, model_path=None, *, speculation_length: int = 0, draft_model_path=None,
                       compiled_dir=None, quantized_checkpoints_path=None, nxdi_overrides=None, **settings):
    """Build (compile or load compiled artifacts) a model on NeuronCores; returns a :class:`NeuronSampler`.

    ``settings`` are the reference engine's (see :func:`neuron_settings`). With ``draft_model_path``
    and ``speculation_length=k`` the sampler runs speculative decoding (tnx: ``SpeculativeGenerator``;
    nxdi: ``generate(assistant_model=...)``).
    """
    path = neuron_model_dir(model_path)
    cfg = read_hf_config(path)
    model_type = _check_architecture(stack, cfg)
    ns = neuron_settings(stack, speculation_length=speculation_length,
                         quantized_checkpoints_path=quantized_checkpoints_path,
                         nxdi_overrides=nxdi_overrides, **settings)
    check_visible_cores(ns.model_kwargs.get("tp_degree") or ns.neuron_config["tp_degree"])
    for note in ns.notes:
        print(f"[neuron/{stack}] {note}")
    compiled_dir = compiled_dir or default_compiled_dir(stack, path, ns)
    t0 = time.perf_counter()
    build = _build_tnx if stack == "tnx" else _build_nxdi
    target = build(path, model_type, ns, compiled_dir)
    draft = None
    if draft_model_path is not None:
        if not speculation_length:
            raise ValueError("draft_model_path needs speculation_length=k (tokens drafted per step)")
        dpath = neuron_model_dir(draft_model_path)
        dns = neuron_settings(stack, quantized_checkpoints_path=None, **settings)
        draft = build(dpath, _check_architecture(stack, read_hf_config(dpath)), dns,
                      default_compiled_dir(stack, dpath, dns))
    sampler = NeuronSampler(stack, target, cfg, ns, draft=draft)
    sampler.build_s = time.perf_counter() - t0
    sampler.compiled_dir = compiled_dir
    return sampler


def _build_tnx(path: str, model_type: str, ns: NeuronSettings, compiled_dir: str):
    from transformers_neuronx import GQA, LlamaForSampling, MistralForSampling, NeuronConfig, QuantizationConfig

    ncfg = dict(ns.neuron_config)
    if "group_query_attention" in ncfg:
        ncfg["group_query_attention"] = GQA(ncfg["group_query_attention"])
    if ns.quantization is not None:
        ncfg["quant"] = QuantizationConfig(**ns.quantization)
    # LlamaForSampling / MistralForSampling.__init__ swallow unknown **kwargs (llama/model.py): the
    # keywords here come from neuron_settings() only. Explicit class by model_type, as
    # NeuronAutoModelForCausalLM would pick (modeling_auto.py).
    cls = LlamaForSampling if model_type == "llama" else MistralForSampling
    model = cls.from_pretrained(path, neuron_config=NeuronConfig(**ncfg), **ns.model_kwargs)
    if ns.speculation_length:
        if model_type != "llama":
            raise ValueError("speculative decoding on transformers-neuronx needs LlamaForSampling: "
                             "MistralForSampling has no decoder_lm_head_for_speculation (mistral/model.py)")
        # Must precede to_neuron(): the speculation graphs are built in init_rest_of_model (base.py).
        model.enable_speculative_decoder(ns.tokens_per_verification)
    loaded = _has_neffs(compiled_dir)
    if loaded:
        model.load(compiled_dir)  # must precede to_neuron(); NEFFs are matched by HLO hash (base.py)
    model.to_neuron()
    if not loaded:
        model.save(compiled_dir)  # sharded_weights=True would need on_device_embedding=True (base.py save)
    return model


def _has_neffs(directory: str) -> bool:
    return os.path.isdir(directory) and any(f.endswith(".neff") for f in os.listdir(directory))


@contextlib.contextmanager
def _fail_on_unexpected_keywords():
    """NxDI's NeuronConfig logs (logging.warning on the root logger) instead of raising on unknown
    keywords (models/config.py): turn that log line into an error, in case the installed release
    accepts fewer keywords than the list checked by neuron_settings()."""
    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            if "Unexpected keyword arguments" in record.getMessage():
                seen.append(record.getMessage())

    handler = Catch(level=logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
    if seen:
        raise TypeError(seen[0] + " (NxD Inference would have ignored them)")


def _build_nxdi(path: str, model_type: str, ns: NeuronSettings, compiled_dir: str):
    from neuronx_distributed_inference.models.config import NeuronConfig
    from neuronx_distributed_inference.models.llama.modeling_llama import (LlamaInferenceConfig,
                                                                           NeuronLlamaForCausalLM)
    from neuronx_distributed_inference.utils.hf_adapter import HuggingFaceGenerationAdapter, load_pretrained_config

    _refuse_unknown(ns.neuron_config, NXDI_NEURON_CONFIG_KEYS, "NxD Inference NeuronConfig")
    with _fail_on_unexpected_keywords():
        neuron_config = NeuronConfig(**ns.neuron_config)
    config = LlamaInferenceConfig(neuron_config, load_config=load_pretrained_config(path))
    qpath = ns.neuron_config.get("quantized_checkpoints_path")
    if qpath and not os.path.exists(qpath):
        os.makedirs(os.path.dirname(os.path.abspath(qpath)), exist_ok=True)  # the library torch.saves to this file
        NeuronLlamaForCausalLM.save_quantized_state_dict(path, config)  # classmethod (application_base.py)
    model = NeuronLlamaForCausalLM(path, config)
    if os.path.exists(os.path.join(compiled_dir, "model.pt")):  # COMPILED_MODEL_FILE_NAME
        check_nxdi_compiled_dir(compiled_dir, ns.neuron_config, read_hf_config(path))
    else:
        model.compile(compiled_dir)
    model.load(compiled_dir)
    return HuggingFaceGenerationAdapter(model)


def _json_value(value):
    """A NeuronConfig value as NxD Inference's config.save writes it (models/config.py to_dict): dtypes by
    name, enums by value."""
    if isinstance(value, torch.dtype):
        return str(value).split(".")[1]
    if isinstance(value, str) and value.startswith("torch."):
        return value.split(".", 1)[1]
    if isinstance(value, dict) and "_value_" in value:
        return value["_value_"]
    if isinstance(value, tuple):
        return list(value)
    return value


def check_nxdi_compiled_dir(compiled_dir: str, neuron_config: dict, hf_config: dict) -> None:
    """Refuse a ``compiled_dir`` that NxD Inference compiled for other settings or another model.
    ``load(path)`` only needs ``model.pt`` to exist (application_base.py): it would load a folder compiled
    with other buckets, batch, dtype or tp_degree without a word. ``compile(path)`` writes the settings it
    compiled with to ``neuron_config.json`` (models/config.py InferenceConfig.save); compare them first."""
    cfg_file = os.path.join(compiled_dir, "neuron_config.json")
    if not os.path.exists(cfg_file):
        raise ValueError(f"{compiled_dir} holds model.pt but no neuron_config.json, so what it was compiled for "
                         "cannot be checked: use another compiled_dir, or delete this one to recompile")
    saved = json.loads(Path(cfg_file).read_text())
    saved_nc = saved.get("neuron_config", {})
    diffs = [f"{k}: compiled {_json_value(saved_nc.get(k))!r}, requested {_json_value(v)!r}"
             for k, v in neuron_config.items() if _json_value(saved_nc.get(k)) != _json_value(v)]
    diffs += [f"{k}: compiled {saved.get(k)!r}, checkpoint {hf_config.get(k)!r}"
              for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")
              if saved.get(k) != hf_config.get(k)]
    if diffs:
        raise ValueError(f"compiled_dir={compiled_dir} was compiled for other settings ({'; '.join(diffs)}); NxD "
                         "Inference's load() would use it without checking. Pass another compiled_dir (or none: "
                         "the default folder is keyed by every setting), or delete it to recompile")


# ------------------------------------------------------------------------------ sampling
def start_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Left padding -> index of each row's first real token (transformers-neuronx ``start_ids``)."""
    am = torch.as_tensor(attention_mask)
    if bool((am[:, 1:] < am[:, :-1]).any()):
        raise ValueError("attention_mask has padding after a real token: pad on the left")
    return (am == 0).sum(dim=1)


def left_to_right_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_token_id: int):
    """Move each row's left padding to the right (NxD Inference's padding_side='right'); same width."""
    ids, mask = torch.full_like(input_ids, pad_token_id), torch.zeros_like(attention_mask)
    for r, n_pad in enumerate(start_ids_from_mask(attention_mask).tolist()):
        n = input_ids.shape[1] - n_pad
        ids[r, :n], mask[r, :n] = input_ids[r, n_pad:], 1
    return ids, mask


class _TimingStreamer:
    """Wraps the user's streamer: records each put ([B, 1] per step on tnx) and its time."""

    def __init__(self, inner, t0: float):
        self.inner, self.t0, self.tokens, self.times = inner, t0, [], []

    def put(self, value):
        self.tokens.append(torch.as_tensor(value).reshape(-1, 1).cpu())
        self.times.append(time.perf_counter() - self.t0)
        if self.inner is not None:
            self.inner.put(value)

    def end(self):
        if self.inner is not None:
            self.inner.end()


class _RowStops:
    """Calls the user's stopping criteria and records, per row, how many new tokens it had when a
    criterion first fired (the reference engine stops rows one by one; the libraries do not)."""

    def __init__(self, criteria, prompt_len: int, batch: int):
        self.criteria, self.prompt_len = criteria, prompt_len
        self.stop_at = [None] * batch

    def __call__(self, ids, scores, **kwargs) -> torch.Tensor:
        flags = torch.as_tensor(self.criteria(ids, scores), dtype=torch.bool).reshape(-1).cpu()
        flags = flags.expand(len(self.stop_at)) if flags.numel() == 1 else flags
        for r, hit in enumerate(flags.tolist()):
            if hit and self.stop_at[r] is None:
                self.stop_at[r] = ids.shape[1] - self.prompt_len
        return torch.tensor([s is not None for s in self.stop_at])


class _TnxCriteria(_RowStops):
    """transformers-neuronx calls ``stopping_criteria_list(input_ids, probs)`` with the *prompt* and
    breaks when the result is truthy (sampling.py sample_loop_llama; aws-neuron/transformers-neuronx#75).
    Call the user's criteria with prompt + tokens generated so far and stop when every row is done:
    the same meaning as the reference engine."""

    def __init__(self, criteria, prompt: torch.Tensor, tracker: _TimingStreamer):
        super().__init__(criteria, prompt.shape[1], prompt.shape[0])
        self.prompt, self.tracker = prompt, tracker

    def __call__(self, input_ids, scores, **kwargs) -> bool:
        ids = torch.cat([self.prompt, *self.tracker.tokens], dim=1)
        return bool(super().__call__(ids, scores).all())


class _BlockStreamer:
    """transformers-neuronx's SpeculativeGenerator puts the prompt, then the first token [B, 1], then each step's
    accepted tokens as a zero-padded [B, k] block (speculation.py), the last one possibly past
    ``sequence_length`` (the returned ids are cut there). Hand the wrapped streamer one [B, 1] token at a time,
    at most ``limit`` of them, as every other path does. (The library counts accepted tokens with
    count_nonzero, so it itself cannot tell a padding 0 from token id 0.)"""

    def __init__(self, inner, limit: int):
        self.inner, self.limit, self.prompt_seen = inner, limit, False

    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        value = torch.as_tensor(value)
        for j in range(int(torch.count_nonzero(value, dim=1).max())):
            if self.limit <= 0:
                return
            self.limit -= 1
            self.inner.put(value[:, j:j + 1])

    def end(self):
        self.inner.end()


def greedy_token_acceptor():
    """A transformers-neuronx ``TokenAcceptor`` for greedy speculation: keep the draft tokens while they equal
    the target's argmax, then the target's own argmax (the 0.13 release ships only sampling acceptors)."""
    from transformers_neuronx.speculation import TokenAcceptor

    class GreedyTokenAcceptor(TokenAcceptor):
        def __call__(self, draft_ids, draft_scores, target_scores):
            # draft_ids [B, k-1], target_scores [B, k, vocab] -> accepted [B, k], zero-padded
            target_ids = target_scores.argmax(dim=-1)
            agree = (draft_ids == target_ids[:, :-1]).long().cumprod(dim=1).sum(dim=1)
            keep = torch.arange(target_ids.shape[1])[None] <= agree[:, None]
            return torch.where(keep, target_ids, torch.zeros_like(target_ids))

    return GreedyTokenAcceptor()


@contextlib.contextmanager
def _model_eos(adapter, eos: list[int]):
    """Switch EOS off for real on NxD Inference: transformers 4.57 ``generate`` fills a GenerationConfig's
    ``eos_token_id=None`` back in from the model's own generation config (``_prepare_generation_config``), so
    the adapter's config must say None too while this call runs."""
    if eos:
        yield
        return
    saved = adapter.generation_config.eos_token_id
    adapter.generation_config.eos_token_id = None
    try:
        yield
    finally:
        adapter.generation_config.eos_token_id = saved


class NeuronSampler:
    """``sample()`` with the reference engine's signature over either stack's model."""

    def __init__(self, stack: str, model, hf_config: dict, settings: NeuronSettings, draft=None):
        self.stack, self.model, self.draft, self.settings = stack, model, draft, settings
        self.hf_config = hf_config
        self.batch_size = (settings.model_kwargs.get("batch_size") or settings.neuron_config["batch_size"])
        self.stats: dict = {}
        eos = hf_config.get("eos_token_id")
        self.eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))

    def sample(self, input_ids, sequence_length: int, start_ids=None, top_k: int = 50, top_p: float = 1.0,
               temperature: float = 1.0, streamer=None, stopping_criteria_list=None, eos_token_override=None,
               attention_mask=None, generator: torch.Generator | None = None, pad_token_id: int | None = None,
               output_logits: bool = False):
        """Prompt + generated ids [B, <= sequence_length]. Greedy is ``top_k=1``.

        As the reference engine: rows that finish (EOS, or a stopping criterion flagging the row) are
        padded with ``pad_token_id``; ``stats['row_new_tokens']`` counts each row's tokens up to and
        including its stop. ``generator``: both libraries sample with the global torch RNG on the host,
        so it is seeded with ``generator.initial_seed()``. On NxD Inference the streamer receives every
        token only after ``generate`` returns (its adapter drives no per-token streamer:
        utils/hf_adapter.py ``_sample``), so ``stats['ttft_s']`` is None there.
        """
        if output_logits:
            raise ValueError("output_logits is a reference-engine option: the Neuron sample loops do not return "
                             "logits (use the reference backend to inspect them)")
        validate_sampling_args(top_k, top_p, temperature)
        input_ids = validate_input_ids(input_ids, int(self.hf_config["vocab_size"]))
        B, L = input_ids.shape
        if B != self.batch_size:
            raise ValueError(f"The model was compiled for batch_size={self.batch_size}, got {B} rows")
        self._check_lengths(L, int(sequence_length))
        if self.draft is not None and int(top_k) != 1:
            raise ValueError(f"top_k={top_k} with a draft model: speculative decoding here is greedy only (top_k=1). "
                             + ("transformers-neuronx's SpeculativeGenerator picks the first token greedily "
                                "(speculation.py: select_tokens(target_scores), 'TODO add generation args')"
                                if self.stack == "tnx" else
                                "NxD Inference's assisted decoding takes the argmax of draft and target "
                                "(utils/hf_adapter.py _standard_assisted_decoding) whatever do_sample says"))
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
            if start_ids is not None:
                attention_mask = (torch.arange(L)[None] >= torch.as_tensor(start_ids).reshape(-1, 1)).long()
        if generator is not None:
            torch.manual_seed(generator.initial_seed())
        eos = self.eos_ids if eos_token_override is None else (
            [eos_token_override] if isinstance(eos_token_override, int) else list(eos_token_override))
        cfg_pad = self.hf_config.get("pad_token_id")
        pad = pad_token_id if pad_token_id is not None else (cfg_pad if cfg_pad is not None else (eos[0] if eos else 0))
        t0 = time.perf_counter()
        run = self._sample_tnx if self.stack == "tnx" else self._sample_nxdi
        seq, tracker, stops = run(input_ids, sequence_length, attention_mask, top_k, top_p, temperature, streamer,
                                  stopping_criteria_list, eos, pad, t0)
        total = time.perf_counter() - t0
        seq, row_new = finish_rows(seq, L, eos, stops.stop_at if stops else [None] * B, pad)
        self.stats = {"prompt_len": L, "new_tokens": seq.shape[1] - L, "row_new_tokens": row_new,
                      "ttft_s": tracker.times[0] if tracker.times else None,
                      "token_times_s": list(tracker.times), "total_s": total, "pad_token_id": pad}
        return seq

    def _check_lengths(self, prompt_len: int, sequence_length: int) -> None:
        """Refuse, before the library runs, lengths the compiled graphs cannot take."""
        if self.stack == "tnx":
            positions = max(tnx_token_buckets(self.settings.model_kwargs["n_positions"]))
        else:
            positions = self.settings.neuron_config["seq_len"]
        k = self.settings.tokens_per_verification if self.draft is not None else 0
        if prompt_len >= sequence_length:
            raise ValueError(f"The prompt has {prompt_len} tokens and sequence_length={sequence_length} leaves no "
                             "room to generate: sequence_length counts prompt + new tokens")
        if sequence_length + k > positions:
            extra = (f" + {k} positions the last verification may write past the end"
                     if k else "")
            raise ValueError(f"sequence_length={sequence_length}{extra} exceeds the compiled {positions} positions: "
                             "lower sequence_length or rebuild with a larger n_positions")
        if self.stack == "nxdi":
            largest = self.settings.neuron_config["max_context_length"]
            if prompt_len > largest:
                raise ValueError(
                    f"The prompt has {prompt_len} tokens but the largest NxD Inference context bucket is {largest}: "
                    f"NxD Inference would raise 'Input len {prompt_len} exceeds largest bucket ({largest})' "
                    "(transformers-neuronx instead encodes the rest token by token). Raise context_length_estimate "
                    f"(its largest bucket) to at least {prompt_len}, or shorten the prompt")

    def _sample_tnx(self, input_ids, sequence_length, attention_mask, top_k, top_p, temperature, streamer,
                    criteria, eos, pad, t0):
        tracker = _TimingStreamer(streamer, t0)
        start_ids = start_ids_from_mask(attention_mask)
        if self.draft is not None:
            return self._speculate_tnx(input_ids, sequence_length, attention_mask, criteria, eos, pad, tracker)
        kwargs = dict(start_ids=start_ids, top_k=int(top_k), top_p=float(top_p),
                      temperature=float(temperature),  # an int temperature raises in sampling.py
                      streamer=tracker)
        if self.eos_ids != eos:
            kwargs["eos_token_override"] = eos if eos else -1  # -1: no EOS stop (never sampled)
        stops = None
        if criteria is not None:
            stops = kwargs["stopping_criteria_list"] = _TnxCriteria(criteria, input_ids, tracker)
        return self.model.sample(input_ids, sequence_length, **kwargs), tracker, stops

    def _speculate_tnx(self, input_ids, sequence_length, attention_mask, criteria, eos, pad, tracker):
        """Greedy speculative decoding with transformers-neuronx's SpeculativeGenerator (speculation.py).

        Its default acceptor (DefaultTokenAcceptor) is the rejection-sampling rule at temperature 1 over the
        whole vocabulary: a greedy request would come back sampled. So a greedy acceptor is passed (the
        library's TokenAcceptor interface). Batch 1 only (refused earlier); a left-padded row is passed
        without its padding, and the padding is put back in front of the result."""
        from transformers_neuronx.speculation import SpeculativeGenerator

        if criteria is not None:
            raise ValueError("stopping criteria are not part of transformers-neuronx's speculative loop "
                             "(SpeculativeGenerator.sample has no stopping_criteria_list): drop them, or drop the draft")
        n_pad = int(start_ids_from_mask(attention_mask)[0])
        gen = SpeculativeGenerator(self.draft, self.model, k=self.settings.tokens_per_verification,
                                   acceptor=greedy_token_acceptor())
        blocks = _BlockStreamer(tracker, sequence_length - input_ids.shape[1])
        seq = gen.sample(input_ids[:, n_pad:], sequence_length - n_pad, eos_token_id=eos[0] if eos else None,
                         pad_token_id=pad, streamer=blocks)
        return torch.cat([input_ids[:, :n_pad], seq], dim=1), tracker, None

    def _sample_nxdi(self, input_ids, sequence_length, attention_mask, top_k, top_p, temperature, streamer,
                     criteria, eos, pad, t0):
        from transformers import GenerationConfig, StoppingCriteriaList

        ids, mask = left_to_right_padding(input_ids, attention_mask, pad)
        max_length = sequence_length
        sampled = int(top_k) != 1 and self.draft is None
        if sampled and (float(temperature) != 1.0 or float(top_p) != 1.0):
            raise ValueError(f"temperature={temperature}, top_p={top_p} on NxD Inference: its generate applies them "
                             "twice (Hugging Face's logits warpers, then its own Sampler with the same values: "
                             "utils/hf_adapter.py _sample), so the distribution would not be the one asked for. "
                             "Sample with top_k only (temperature=1.0, top_p=1.0), or use neuron_stack='tnx'")
        if self.draft is not None:
            if not eos:
                raise ValueError("EOS cannot be switched off for NxD Inference speculation: its assisted decoding "
                                 "compares every token with eos_token_id (utils/hf_adapter.py "
                                 "_standard_assisted_decoding); drop eos_token_override=[] or the draft")
            if criteria is not None:
                raise ValueError("stopping criteria are never called by NxD Inference's assisted decoding "
                                 "(utils/hf_adapter.py _standard_assisted_decoding): drop them, or drop the draft")
            # The assisted loop stops once fewer than speculation_length positions remain (hf_adapter.py: "If
            # the rest length is smaller than speculation length ... break"): ask for k - 1 more (checked to fit
            # by _check_lengths) and cut back to sequence_length.
            max_length = sequence_length + self.settings.tokens_per_verification - 1
        gen_cfg = GenerationConfig(do_sample=sampled, eos_token_id=eos or None, pad_token_id=pad,
                                   **({"top_k": int(top_k)} if sampled else {}))
        # max_length as a generate() keyword: inside a GenerationConfig, transformers takes max_length=20 (its
        # default) for "not set" and adds the prompt length to it
        kwargs = {"attention_mask": mask, "generation_config": gen_cfg, "max_length": max_length}
        stops = None
        if criteria is not None:
            # NxDI calls each criterion as criterion(ids_so_far, None): no scores (hf_adapter.py _sample).
            stops = _RowStops(criteria, ids.shape[1], ids.shape[0])
            kwargs["stopping_criteria"] = StoppingCriteriaList([stops])
        if self.draft is not None:
            # Unfused speculation as utils/accuracy.py does it: the draft proposes as many tokens as the target
            # verifies (hf_adapter.py checks candidate_length - 1 of them), and starts each call from a reset cache
            # (generate() resets only the target).
            self.draft.generation_config.update(num_assistant_tokens=self.settings.tokens_per_verification)
            self.draft.neuron_model.reset()
            kwargs["assistant_model"] = self.draft
        # The adapter builds its host Sampler on the first call and keeps it, greedy or sampling, for every later
        # call (hf_adapter.py _sample: "if self.sampler is None"): make each call build its own.
        self.model.sampler = None
        with _model_eos(self.model, eos):
            out = self.model.generate(ids, **kwargs)
        new = out[:, ids.shape[1]:sequence_length]
        tracker = _TimingStreamer(streamer, t0)
        for j in range(new.shape[1]):  # emitted only now: NxDI drives no per-token streamer
            tracker.put(new[:, j:j + 1])
        tracker.end()
        tracker.times = []
        return torch.cat([input_ids, new], dim=1), tracker, stops


def finish_rows(seq: torch.Tensor, prompt_len: int, eos: list[int], stop_at: list, pad: int):
    """Per row: new tokens up to and including its first EOS or the step a criterion fired; the rest
    become ``pad`` (transformers-neuronx keeps sampling finished rows until all are done)."""
    gen = seq[:, prompt_len:].clone()
    counts = []
    for r in range(gen.shape[0]):
        n = gen.shape[1]
        hits = torch.isin(gen[r], torch.tensor(eos, dtype=gen.dtype)).nonzero() if eos else []
        if len(hits):
            n = min(n, int(hits[0]) + 1)
        if stop_at[r] is not None:
            n = min(n, int(stop_at[r]))
        gen[r, n:] = pad
        counts.append(n)
    return torch.cat([seq[:, :prompt_len], gen], dim=1), counts


# ------------------------------------------------------------------------------ runtime hygiene
def _core_list(cores) -> list[int]:
    if isinstance(cores, int):
        return [cores]
    if isinstance(cores, str):
        out = []
        for part in cores.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
            if not m:
                raise ValueError(f"NEURON_RT_VISIBLE_CORES={cores!r}: use '0', '0-1' or '0,1'")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                raise ValueError(f"NEURON_RT_VISIBLE_CORES={cores!r}: range {lo}-{hi} is empty")
            out += range(lo, hi + 1)
        return out
    return [int(c) for c in cores]


def neuron_runtime_env(visible_cores=None, num_cores: int | None = None, omp_threads: int | None = None,
                       compile_cache: str | None = None) -> dict[str, str]:
    """Environment variables for one model process (pure; see :func:`configure_neuron_runtime`).

    ``visible_cores``: which NeuronCores this process may use ('0-1', [0, 1], 2) -> NEURON_RT_VISIBLE_CORES.
    ``num_cores``: how many, any free ones -> NEURON_RT_NUM_CORES. Give one of the two.
    ``omp_threads``: host threads when several models share the host -> OMP_NUM_THREADS
    (transformers-neuronx guide, "Running inference with multiple models").
    ``compile_cache``: Neuron persistent compile cache location -> NEURON_COMPILE_CACHE_URL
    (a local folder or s3:// URL; default /var/tmp/neuron-compile-cache).
    """
    env: dict[str, str] = {}
    if visible_cores is not None and num_cores is not None:
        raise ValueError("set visible_cores or num_cores, not both (NEURON_RT_VISIBLE_CORES already fixes the count)")
    if visible_cores is not None:
        cores = _core_list(visible_cores)
        if not cores or cores != list(range(cores[0], cores[0] + len(cores))):
            raise ValueError(f"visible_cores={visible_cores!r}: the Neuron runtime takes a contiguous, increasing "
                             "range of NeuronCores (e.g. '0-1' or '2-3'), not gaps or a reordered list")
        env["NEURON_RT_VISIBLE_CORES"] = f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])
    if num_cores is not None:
        if int(num_cores) < 1:
            raise ValueError("num_cores must be >= 1")
        env["NEURON_RT_NUM_CORES"] = str(int(num_cores))
    if omp_threads is not None:
        if int(omp_threads) < 1:
            raise ValueError("omp_threads must be >= 1")
        env["OMP_NUM_THREADS"] = str(int(omp_threads))
    if compile_cache is not None:
        env["NEURON_COMPILE_CACHE_URL"] = str(compile_cache)
    return env


def omp_threads_for(n_models: int, host_cpus: int | None = None) -> int:
    """Host threads per model when ``n_models`` share the host (192 CPUs, 4 models -> 48)."""
    host_cpus = host_cpus or os.cpu_count() or 1
    return max(1, host_cpus // max(1, int(n_models)))


def configure_neuron_runtime(**kwargs) -> dict[str, str]:
    """Apply :func:`neuron_runtime_env` to ``os.environ``. The runtime reads these when it starts (the
    first model load), and frees its NeuronCores only at process exit: call this first, once per
    process, and run one notebook per process."""
    env = neuron_runtime_env(**kwargs)
    if "NEURON_RT_VISIBLE_CORES" in env:
        os.environ.pop("NEURON_RT_NUM_CORES", None)
    if "NEURON_RT_NUM_CORES" in env:
        os.environ.pop("NEURON_RT_VISIBLE_CORES", None)
    os.environ.update(env)
    return env


def check_visible_cores(tp_degree: int, environ=None) -> None:
    """Refuse, before any compile, a tp_degree larger than the cores this process may use."""
    environ = os.environ if environ is None else environ
    if "NEURON_RT_VISIBLE_CORES" in environ:
        cores = environ["NEURON_RT_VISIBLE_CORES"]
        neuron_runtime_env(visible_cores=cores)  # refuses gaps and reordered lists
        n = len(_core_list(cores))
    elif "NEURON_RT_NUM_CORES" in environ:
        n = int(environ["NEURON_RT_NUM_CORES"])
    else:
        return
    if tp_degree > n:
        raise ValueError(f"tp_degree={tp_degree} but this process may use {n} NeuronCore(s) "
                         f"(NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES): lower tp_degree or give it more cores")
