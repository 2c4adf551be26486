"""Saving and loading a built model: transformers-neuronx's ``save(dir[, sharded_weights])`` /
``load(dir)`` and NxD Inference's ``compile(path)`` / ``load(path)``, for the reference engine.

A directory holds, per rank, the graphs of every bucket (``helpers.artifacts.manifest``: files named by their
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
import tempfile
from dataclasses import asdict, fields
from pathlib import Path

from ..engine.config import NeuronConfig
from ..engine.generation import eager_graphs
from ..engine.model import Transformer
from ..planning.buckets import NxDIBucketing
from .graphs import ARTIFACTS, build_all
from .manifest import FORMAT_VERSION, TORCH_VERSION, load_graphs, read_manifest, recorded_kernels, save_graphs
from .presharded import load_rank_weights, save_rank_weights, weights_file


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
    return {"format": FORMAT_VERSION, "torch": TORCH_VERSION,
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


def check_save(model, sharded_weights: bool, mark_presharded: bool = True) -> None:
    """The refusals of ``save`` that need no built graph (transformers-neuronx's rules)."""
    if sharded_weights and mark_presharded and not model.neuron_config.on_device_embedding:  # tnx base.py save()
        raise ValueError("on_device_embedding must be True to save and load presharded weights: build with "
                         "NeuronConfig(on_device_embedding=True)")
    if sharded_weights and model.neuron_config.quant is not None:
        raise ValueError("sharded_weights=True stores the unquantized shard; save without it when quant is set")


def save_rank(directory, graphs: dict, fingerprint_fields: dict, report: list[dict], w=None,
              meta: dict | None = None, kernels: dict | None = None) -> dict:
    """One rank's part of ``save``: its graphs and manifest, with the matmul ``kernels`` it ran (+ its presharded
    weights ``w``, when given). Runs where the rank's graphs live: in this process, or in a ``helpers.parallel``
    rank process."""
    d, rank = Path(directory), fingerprint_fields["rank"]
    manifest = save_graphs(d, graphs, fingerprint_fields, rank, report, kernels)
    files = [d / e["file"] for e in manifest["graphs"]]
    if w is not None:
        files.append(save_rank_weights(d, w, meta, rank))
    return {"graphs": len(manifest["graphs"]), "bytes": sum(f.stat().st_size for f in files)}


def write_settings(model, directory, sharded_weights: bool, mark_presharded: bool = True) -> None:
    """``neuron_config.json`` (the settings, for ``from_compiled``) and, with presharded weights, the
    ``config.json`` that makes the directory a checkpoint; written once, by the driver (rank 0)."""
    d = Path(directory)
    nc = {f.name: getattr(model.neuron_config, f.name) for f in fields(model.neuron_config)}
    nc["quant"] = repr(nc["quant"])
    nc["group_query_attention"] = None if nc["group_query_attention"] is None else nc["group_query_attention"].value
    settings = {**model.settings, "model_path": str(model.model_path), "neuron_config": nc}
    (d / "neuron_config.json").write_text(json.dumps(settings, indent=1, default=str))
    if sharded_weights:
        hf = {**model.args.hf_config, "is_presharded_checkpoint": mark_presharded}
        (d / "config.json").write_text(json.dumps(hf, indent=1))


def save(model, directory, sharded_weights: bool = False, mark_presharded: bool = True) -> dict:
    """Write this rank's graphs (+ its presharded weights); returns {"directory", "graphs", "bytes"}."""
    check_save(model, sharded_weights, mark_presharded)
    tr = model.require_built()
    rank = tr.comm.rank
    saved = save_rank(directory, model.graphs, graph_fields(model), model.build_report,
                      tr.w if sharded_weights else None, weights_meta(model, rank), tr.ops.record)
    if rank == 0:
        write_settings(model, directory, sharded_weights, mark_presharded)
    return {"directory": str(Path(directory)), **saved}


def check_saved(model, directory) -> dict:
    """The manifest of this rank, after the fingerprint, presence and sha256 checks (helpers.artifacts.manifest)."""
    return read_manifest(directory, graph_fields(model), _rank(model))


def saved_kernels(model, rank: int = 0) -> dict | None:
    """The matmul kernels of rank ``rank`` of the model ``load()`` was given (None: no load, or none recorded)."""
    d = getattr(model, "_artifacts_dir", None)
    return None if d is None else recorded_kernels(d, rank)


def load_presharded(model, rank: int):
    return load_rank_weights(model.model_path, rank, weights_meta(model, rank))


def rank_graphs(tr: Transformer, kinds, batch: int, mode, load_dir=None, fields: dict | None = None, rank: int = 0):
    """One rank's graph per (kind, bucket), its build report, and the folder an "aoti" build keeps its packages
    in (it must live as long as the graphs): loaded from ``load_dir`` (``fingerprint fields`` with this rank; no
    compilation), built ahead of time (``mode`` "export" / "aoti", ``helpers.artifacts.graphs``), or the eager
    forward. The one implementation for a model's rank 0 and every tensor-parallel rank."""
    if load_dir is not None:
        return (*load_graphs(load_dir, tr, {**fields, "rank": rank}, rank, batch), None)
    if mode in ARTIFACTS:
        workdir = tempfile.TemporaryDirectory(prefix=f"aoti-rank{rank}-") if mode == "aoti" else None
        return (*build_all(tr, kinds, batch, mode, workdir and workdir.name), workdir)
    return (*eager_graphs(tr, kinds), None)


def check_compile(model) -> None:
    if model.neuron_config.compiled not in (True, *ARTIFACTS):
        raise ValueError(f"compile() writes ahead-of-time graphs: build with NeuronConfig(compiled='export') or "
                         f"compiled='aoti' (got compiled={model.neuron_config.compiled!r})")


def compile_to(model, compiled_model_path, save_sharded_checkpoint: bool = False) -> dict:
    """NxD Inference ``compile(path)``; unlike transformers-neuronx it needs no on_device_embedding."""
    check_compile(model)
    if model.model is None:
        model.to_neuron()
    return save(model, compiled_model_path, save_sharded_checkpoint, mark_presharded=False)


def from_compiled(cls, compiled_model_path, model_path=None, device: str = "cpu"):
    """NxD Inference ``load(path)``: the settings from ``neuron_config.json``, the presharded weights if
    saved (else ``model_path`` or the recorded checkpoint), the saved graphs; no compilation. A directory
    compiled with tp_degree > 1 loads into ``helpers.parallel.ParallelModel`` only (``cls`` is chosen by the caller)."""
    d = Path(compiled_model_path)
    if not (d / "neuron_config.json").is_file():
        raise FileNotFoundError(f"{d}/neuron_config.json is missing: not a directory written by compile()")
    s = json.loads((d / "neuron_config.json").read_text())
    if s["neuron_config"].pop("quant") != "None":
        raise ValueError("from_compiled() cannot rebuild a quant config from JSON: construct the model with "
                         "from_pretrained(..., neuron_config=...) and call load(path)")
    nx = s.pop("nxdi_bucketing")
    recorded = s.pop("model_path")
    presharded = weights_file(d, 0).is_file() and (d / "config.json").is_file()
    path = d if presharded else (model_path or recorded)
    m = cls.from_pretrained(path, neuron_config=NeuronConfig(**s.pop("neuron_config")), device=device,
                            nxdi_bucketing=None if nx is None else NxDIBucketing(**nx), **s)
    m.presharded = m.presharded or presharded
    return m.load(d).to_neuron()
