"""Presharded weights: one rank's weights exactly as built (fused, cast, sharded), one safetensors file
per rank under NxD Inference's name ``weights/tp{rank}_sharded_checkpoint.safetensors``, with the layout
they were written for in the file's metadata (checked before any tensor is read).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..engine.weights import LayerWeights, RankShard, RankWeights, stored
from ..planning.gqa import HeadLayout
from .graphs import ArtifactMismatchError, layer_tensor_names, layer_tensors
from .manifest import describe_differences


def rank_weight_tensors(w: RankWeights) -> dict[str, torch.Tensor]:
    """Every tensor of one rank's weights by a stable name (``layers.3.wqkv``, ``extra.qkv_cols``...)."""
    out = {}
    for f in dataclasses.fields(w):
        v = getattr(w, f.name)
        if f.name == "layers":
            for i, L in enumerate(v):
                names = layer_tensor_names(L)
                out.update({f"layers.{i}.{n}": t for n, t in zip(names, layer_tensors(L, names))})
        elif f.name == "shard":
            if v is not None:  # the layout and rank are settings (checked by the metadata), the QKV split a tensor
                out["extra.qkv_cols"] = torch.tensor(v.qkv_cols)
        elif torch.is_tensor(stored(v)):
            out[f.name] = stored(v)
    return out


def dedupe(named: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Unique tensors by name, and ``alias -> name`` for tensors that appear twice (tied lm_head)."""
    unique, aliases, seen = {}, {}, {}
    for name, t in named.items():
        if id(t) in seen:
            aliases[name] = seen[id(t)]
        else:
            seen[id(t)] = name
            unique[name] = t
    return unique, aliases


def weights_file(directory, rank: int) -> Path:
    """NxD Inference's name for a rank's presharded checkpoint (application_base.py load_weights)."""
    return Path(directory) / "weights" / f"tp{rank}_sharded_checkpoint.safetensors"


def save_rank_weights(directory, w: RankWeights, meta: dict, rank: int) -> Path:
    unique, aliases = dedupe(rank_weight_tensors(w))
    info = {**meta, "n_q": w.n_q, "n_kv": w.n_kv, "vocab_size": w.vocab_size, "n_layers": len(w.layers),
            "aliases": aliases}
    path = weights_file(directory, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: t.detach().contiguous().cpu() for k, t in unique.items()}, str(path),
              metadata={"presharded": json.dumps(info, sort_keys=True)})
    return path


def check_rank_weights(directory, rank: int, meta: dict) -> dict:
    """The metadata of a rank's presharded weights (the file header only), after checking they were
    written for ``meta`` (tp degree, rank, dtype, GQA layout); refuses another layout, naming it."""
    path = weights_file(directory, rank)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {directory} has no presharded weights for rank {rank} "
                                "(saved with another tp_degree, or without sharded_weights=True).")
    with safe_open(str(path), framework="pt") as f:
        info = json.loads((f.metadata() or {}).get("presharded", "{}"))
    diffs = describe_differences({k: info.get(k) for k in meta}, meta)
    if diffs:
        raise ArtifactMismatchError(f"The presharded weights in {directory} were written for another "
                                    "layout: " + "; ".join(diffs) + ". Load the original checkpoint instead.")
    return info


def load_rank_weights(directory, rank: int, meta: dict, layout: HeadLayout | None = None) -> RankWeights:
    """One rank's weights exactly as saved (no fusing, casting or sharding), in ``layout`` if given (a
    tensor-parallel rank's); refuses another layout."""
    info = check_rank_weights(directory, rank, meta)
    with safe_open(str(weights_file(directory, rank)), framework="pt") as f:
        named = {k: f.get_tensor(k) for k in f.keys()}
    named.update({a: named[n] for a, n in info["aliases"].items()})
    field_names = [lf.name for lf in dataclasses.fields(LayerWeights)]
    layers = []
    for i in range(info["n_layers"]):
        mine = {k.split(".", 2)[2]: t for k, t in named.items() if k.startswith(f"layers.{i}.")}
        L = LayerWeights(**{n: mine.pop(n, None) for n in field_names})
        for n, t in mine.items():  # tensors a feature attached to the layer
            setattr(L, n, t)
        layers.append(L)
    cols = named.get("extra.qkv_cols")
    shard = None if layout is None or cols is None else RankShard(layout, rank, tuple(int(c) for c in cols.tolist()))
    return RankWeights(embed=named["embed"], norm=named["norm"], lm_head=named["lm_head"], layers=layers,
                       n_q=info["n_q"], n_kv=info["n_kv"], vocab_size=info["vocab_size"],
                       kv_group=named.get("kv_group"), shard=shard)
