"""Build (compile, or load compiled artifacts) the notebook's model on NeuronCores with transformers-neuronx
or NxD Inference: :func:`build_neuron_model` returns a ``NeuronSampler`` whose ``sample()`` has the reference
engine's signature on both stacks. The Neuron SDK is imported inside the functions that need it: this module
imports on any machine.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import torch

from ..model_store import resolve_model_path, with_legacy_keys
from .runtime import check_visible_cores, library_version
from .sampler import NeuronSampler
from .settings import NXDI_NEURON_CONFIG_KEYS, NeuronSettings, neuron_settings, refuse_unknown


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
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    refuse_unknown(ns.neuron_config, NXDI_NEURON_CONFIG_KEYS, "NxD Inference NeuronConfig")
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
    return nxdi_generation_adapter()(model)


def nxdi_generation_adapter():
    """NxD Inference's ``HuggingFaceGenerationAdapter`` with the workaround for 0.8's ``generate()`` bug (the class;
    the draft model of assisted decoding is wrapped in it too, since its ``prepare_inputs_for_generation`` is called)."""
    from neuronx_distributed_inference.utils import hf_adapter

    class GenerationAdapter(hf_adapter.HuggingFaceGenerationAdapter):
        # NxD Inference 0.8 (SDK 2.28) bug: prepare_inputs_for_generation reads a name it never defines,
        # tensor_capture_hook (NameError in every generate()); still so in "Release 2.29" (c63afe0), fixed by ef2731e.
        def prepare_inputs_for_generation(self, *args, **kwargs):
            hf_adapter.tensor_capture_hook = None  # the module global 0.8 reads; ef2731e reads its own local
            inputs = super().prepare_inputs_for_generation(*args, **kwargs)
            inputs.pop("tensor_capture_hook", None)  # 0.8's forward has no such parameter (ef2731e's defaults it to None)
            return inputs

    return GenerationAdapter


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
