"""Saving and loading a built model: transformers-neuronx's ``save(dir[, sharded_weights])`` /
``load(dir)`` and NxD Inference's ``compile(path)`` / ``load(path)``, for the reference engine.

A directory holds, per rank, the graphs of every bucket (``helpers/graphs.py``: files named by their
fingerprint and listed in ``graphs-rank{rank}.json`` with their sha256), ``neuron_config.json`` (the
settings, for ``from_compiled``) and optionally the presharded weights
``weights/tp{rank}_sharded_checkpoint.safetensors`` (NxD Inference's file name) with a
``config.json`` marked ``is_presharded_checkpoint`` (transformers-neuronx's marker).

The fingerprinted fields are what a graph depends on: the architecture, the batch, the buckets, the
tp degree and rank, the dtype, the device, the GQA layout, quantization and the torch version. No
path: a directory can move (compare aws-neuron/transformers-neuronx#91, #99, where the HLO hash
depended on the Python installation path). Everything here works per rank, so a tensor-parallel
engine saves and loads each rank's graphs and weights with the same calls.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields
from pathlib import Path

from . import graphs as gr
from .config import NeuronConfig


def _rank(model) -> int:
    return 0 if model.model is None else model.model.comm.rank


def graph_fields(model) -> dict:
    """What a saved graph depends on; its fingerprint hashes these."""
    a = asdict(model.args)
    for k in ("hf_config", "eos_token_id", "pad_token_id"):
        a.pop(k)
    rope = model.args.hf_config.get("rope_parameters") or model.args.hf_config.get("rope_scaling")
    arch = hashlib.sha256(json.dumps([a, rope], sort_keys=True, default=str).encode()).hexdigest()[:16]
    nc, args = model.neuron_config, model.args
    return {"format": gr.FORMAT_VERSION, "torch": gr.TORCH_VERSION,
            "model": f"{args.model_type}, {args.n_layers} layers, hidden {args.hidden_size}, sha256 {arch}",
            "batch_size": model.batch_size, "context_buckets": list(model.context_buckets),
            "token_buckets": list(model.token_buckets), "speculation_length": model.speculation_length,
            "tp_degree": model.tp_degree, "rank": _rank(model),
            "dtype": str(model.dtype), "device": model.device.type, "fuse_qkv": nc.fuse_qkv,
            "group_query_attention": None if nc.group_query_attention is None else nc.group_query_attention.value,
            "quant": None if nc.quant is None else repr(nc.quant)}


def weights_meta(model, rank: int) -> dict:
    """What a rank's presharded weights depend on."""
    gqa = model.neuron_config.group_query_attention
    return {"tp_degree": model.tp_degree, "rank": rank, "dtype": str(model.dtype),
            "group_query_attention": None if gqa is None else gqa.value}


def save(model, directory, sharded_weights: bool = False, mark_presharded: bool = True) -> dict:
    """Write this rank's graphs (+ its presharded weights); returns {"directory", "graphs", "bytes"}."""
    if sharded_weights and mark_presharded and not model.neuron_config.on_device_embedding:  # tnx base.py save()
        raise ValueError("on_device_embedding must be True to save and load presharded weights: build with "
                         "NeuronConfig(on_device_embedding=True)")
    tr = model._require_built()
    if sharded_weights and model.neuron_config.quant is not None:
        raise ValueError("sharded_weights=True stores the unquantized shard; save without it when quant is set")
    rank, d = tr.comm.rank, Path(directory)
    manifest = gr.save_graphs(d, model.graphs, graph_fields(model), rank, model.build_report)
    files = [d / e["file"] for e in manifest["graphs"]]
    if rank == 0:
        nc = {f.name: getattr(model.neuron_config, f.name) for f in fields(model.neuron_config)}
        nc["quant"] = repr(nc["quant"])
        nc["group_query_attention"] = None if nc["group_query_attention"] is None else nc["group_query_attention"].value
        settings = {**model.settings, "model_path": str(model.model_path), "neuron_config": nc}
        (d / "neuron_config.json").write_text(json.dumps(settings, indent=1, default=str))
    if sharded_weights:
        files.append(gr.save_rank_weights(d, tr.w, weights_meta(model, rank), rank))
        if rank == 0:
            hf = {**model.args.hf_config, "is_presharded_checkpoint": mark_presharded}
            (d / "config.json").write_text(json.dumps(hf, indent=1))
    return {"directory": str(d), "graphs": len(manifest["graphs"]), "bytes": sum(f.stat().st_size for f in files)}


def check_saved(model, directory) -> dict:
    """The manifest of this rank, after the fingerprint, presence and sha256 checks (helpers/graphs.py)."""
    return gr.read_manifest(directory, graph_fields(model), _rank(model))


def load_presharded(model, rank: int):
    return gr.load_rank_weights(model.model_path, rank, weights_meta(model, rank))


def compile_to(model, compiled_model_path, save_sharded_checkpoint: bool = False) -> dict:
    """NxD Inference ``compile(path)``; unlike transformers-neuronx it needs no on_device_embedding."""
    if model.neuron_config.compiled not in (True, *gr.ARTIFACTS):
        raise ValueError(f"compile() writes ahead-of-time graphs: build with NeuronConfig(compiled='export') or "
                         f"compiled='aoti' (got compiled={model.neuron_config.compiled!r})")
    if model.model is None:
        model.to_neuron()
    return save(model, compiled_model_path, save_sharded_checkpoint, mark_presharded=False)


def from_compiled(cls, compiled_model_path, model_path=None, device: str = "cpu"):
    """NxD Inference ``load(path)``: the settings from ``neuron_config.json``, the presharded weights if
    saved (else ``model_path`` or the recorded checkpoint), the saved graphs; no compilation."""
    from .buckets import NxDIBucketing

    d = Path(compiled_model_path)
    if not (d / "neuron_config.json").is_file():
        raise FileNotFoundError(f"{d}/neuron_config.json is missing: not a directory written by compile()")
    s = json.loads((d / "neuron_config.json").read_text())
    if s["neuron_config"].pop("quant") != "None":
        raise ValueError("from_compiled() cannot rebuild a quant config from JSON: construct the model with "
                         "from_pretrained(..., neuron_config=...) and call load(path)")
    nx = s.pop("nxdi_bucketing")
    recorded = s.pop("model_path")
    presharded = gr.weights_file(d, 0).is_file() and (d / "config.json").is_file()
    path = d if presharded else (model_path or recorded)
    m = cls.from_pretrained(path, neuron_config=NeuronConfig(**s.pop("neuron_config")), device=device,
                            nxdi_bucketing=None if nx is None else NxDIBucketing(**nx), **s)
    m.presharded = m.presharded or presharded
    return m.load(d).to_neuron()
