"""Fixed-shape graphs, one set per (kind, bucket) and rank, built ahead of time and serialized.

On Neuron every bucket is its own compiled program (a NEFF): context encoding for each context
bucket, token generation for each token bucket. Here a bucket's program is a decoder layer at a
fixed shape, compiled once and run for every layer with that layer's weights and KV cache — what
transformers-neuronx does with ``unroll=1`` (one layer per program, looped). Each layer is two
graphs cut at the tensor-parallel all-reduce, so a graph never contains a collective:

- ``attn`` per (kind, bucket): RMSNorm, QKV, RoPE, write K/V at the step's slots, attention over the
  bucket's ``kv_len`` cache positions, output projection. Cache views are inputs mutated in place
  (as Neuron aliases the cache buffers).
- ``mlp`` per token width (1 for token generation, the bucket for context encoding).

Weights are graph *inputs*, not constants: an artifact holds code only and the weights load
separately (checkpoint or presharded), as a NEFF and its weights do. Embedding, final norm and
LM head run eagerly around the graphs.

Artifacts (``NeuronConfig(compiled=...)``):

- ``"export"``: ``torch.export`` programs saved with ``torch.export.save`` (``.pt2``): the same ATen
  ops as eager, so outputs are bitwise identical to the eager engine.
- ``"aoti"``: each exported program compiled by AOTInductor into a C++ shared library inside a
  ``.pt2`` package (``torch._inductor.aoti_compile_and_package``): real ahead-of-time machine code,
  the closest analogue of a NEFF; loading one is a ``dlopen``.
- ``True`` means ``"export"``. (``torch.compile`` is not offered: it fails on the inference tensors
  that ``sample()`` creates under ``torch.inference_mode``, and its JIT code cannot be saved.)

Saved graphs are named ``{unit}-rank{rank}-{fingerprint}.pt2``; the fingerprint hashes the model
architecture, the engine settings (batch, buckets, tp degree, dtype, device, GQA, quantization),
the unit (part, kind, bucket, width), the rank and the torch version. ``load`` refuses a mismatch
or a file whose sha256 changed, naming what differs; it never recompiles behind the caller's back.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import torch

from .engine import LayerWeights, RankWeights, Transformer, build_mask, cpu_linear

ARTIFACTS = ("export", "aoti")
FORMAT_VERSION = 1
TORCH_VERSION = torch.__version__
KINDS = ("context", "token")


class ArtifactMismatchError(ValueError):
    """Saved graphs were built for another model, engine configuration or torch version."""


class CorruptArtifactError(ValueError):
    """A saved file is missing, changed after save() or cannot be deserialized."""


# -- graph units ----------------------------------------------------------------------------------
def layer_tensor_names(L: LayerWeights) -> list[str]:
    """The tensors of one layer, by attribute name (dataclass fields first, then any added ones)."""
    names = [f.name for f in dataclasses.fields(L) if torch.is_tensor(getattr(L, f.name))]
    return names + sorted(k for k, v in vars(L).items() if torch.is_tensor(v) and k not in names)


def layer_view(template: LayerWeights, names: list[str], tensors) -> LayerWeights:
    L = copy.copy(template)
    for n, t in zip(names, tensors):
        setattr(L, n, t)
    return L


def with_cache(tr: Transformer, k_cache, v_cache) -> Transformer:
    """A shallow copy of ``tr`` whose layer 0 cache is the given layer cache (a view: writes go through)."""
    t = copy.copy(tr)
    t.k_cache, t.v_cache = k_cache[None], v_cache[None]
    return t


class AttnGraph(torch.nn.Module):
    """``(x, cos, sin, slots, attn_mask, k_cache, v_cache, *layer) -> attention output`` at a fixed shape."""

    def __init__(self, tr: Transformer, kv_len: int):
        super().__init__()
        self.tr, self.kv_len = tr, kv_len
        self.template = tr.w.layers[0]
        self.names = layer_tensor_names(self.template)

    def forward(self, x, cos, sin, slots, attn_mask, k_cache, v_cache, *layer):
        L = layer_view(self.template, self.names, layer)
        return with_cache(self.tr, k_cache, v_cache).attn_block(0, x, L, cos, sin, slots, self.kv_len, attn_mask)


class MlpGraph(torch.nn.Module):
    """``(x, *layer) -> MLP output`` at a fixed shape."""

    def __init__(self, tr: Transformer):
        super().__init__()
        self.tr, self.template = tr, tr.w.layers[0]
        self.names = layer_tensor_names(self.template)

    def forward(self, x, *layer):
        return self.tr.mlp_block(x, layer_view(self.template, self.names, layer))


def graph_kinds(context_buckets, token_buckets, speculation_length: int = 0) -> list[tuple]:
    """(kind, buckets, tokens per step): context steps are as wide as their bucket, token steps take one
    token, speculative steps (``enable_speculative_decoder(k)``) take k + 1 over the token buckets."""
    kinds = [("context", list(context_buckets), None), ("token", list(token_buckets), 1)]
    if speculation_length:
        kinds.append(("speculative", list(token_buckets), int(speculation_length) + 1))
    return kinds


def unit_specs(kinds) -> dict[str, dict]:
    """Every graph the kinds need: ``{name: spec}`` (attn per (kind, bucket), mlp per token width)."""
    specs, widths = {}, []
    for kind, buckets, tokens in kinds:
        for b in buckets:
            t = int(b) if tokens is None else tokens
            specs[f"{kind}{b}.attn"] = {"part": "attn", "kind": kind, "bucket": int(b), "tokens": t}
            widths.append(t)
    for t in sorted(set(widths)):
        specs[f"mlp.t{t}"] = {"part": "mlp", "tokens": t}
    return specs


def kinds_of(fields: dict) -> list[tuple]:
    return graph_kinds(fields["context_buckets"], fields["token_buckets"], fields.get("speculation_length", 0))


def example_inputs(tr: Transformer, spec: dict, batch: int) -> tuple:
    T, dev = spec["tokens"], tr.device
    x = torch.zeros(batch, T, tr.args.hidden_size, dtype=tr.dtype, device=dev)
    layer = tuple(getattr(tr.w.layers[0], n) for n in layer_tensor_names(tr.w.layers[0]))
    if spec["part"] == "mlp":
        return (x, *layer)
    slots = torch.arange(T, device=dev)
    rope_pos = slots[None, :].expand(batch, T)
    cos, sin = tr.cos[rope_pos].unsqueeze(2), tr.sin_signed[rope_pos].unsqueeze(2)  # as Transformer.forward
    mask = build_mask(slots, torch.zeros(batch, dtype=torch.long, device=dev), spec["bucket"], None).unsqueeze(1)
    return (x, cos, sin, slots, mask, tr.k_cache[0], tr.v_cache[0], *layer)


def export_unit(tr: Transformer, spec: dict, batch: int, artifact: str = "export") -> torch.export.ExportedProgram:
    if artifact == "aoti" and tr.linear is cpu_linear:
        # AOTInductor graphs call F.linear (an MKL mm_out in the generated code). Not oneDNN's linear:
        # its lowering accepts only constant (frozen) weights, and the graphs take weights as inputs.
        # Not split-k: Inductor fuses its bmm + sum into a generated C++ loop that ran at half the
        # speed (SmolLM2 decode 59 ms/token against 27 ms with F.linear).
        tr = copy.copy(tr)
        tr.linear = torch.nn.functional.linear
    mod = AttnGraph(tr, spec["bucket"]) if spec["part"] == "attn" else MlpGraph(tr)
    return torch.export.export(mod, example_inputs(tr, spec, batch), strict=False)


@dataclasses.dataclass
class Unit:
    """A built or loaded graph: ``fn(*inputs)`` plus what save() needs to write it."""
    name: str
    spec: dict
    artifact: str
    fn: object
    program: object = None    # ExportedProgram ("export")
    package: str | None = None  # AOTInductor package path ("aoti")


def build_unit(tr: Transformer, name: str, spec: dict, batch: int, artifact: str, workdir=None) -> Unit:
    ep = export_unit(tr, spec, batch, artifact)
    if artifact == "export":
        ep.example_inputs = None  # else torch.export.save would store example weights with the graph
        unit = Unit(name, spec, artifact, ep.module(), program=ep)
    elif artifact == "aoti":
        path = os.path.join(workdir, f"{name}.pt2")
        torch._inductor.aoti_compile_and_package(ep, package_path=path)  # needs ep.example_inputs
        unit = Unit(name, spec, artifact, torch._inductor.aoti_load_package(path), package=path)
    else:
        raise ValueError(f"artifact={artifact!r}: use one of {ARTIFACTS}")
    check_unit(tr, unit, batch, "built")
    return unit


def probe(tr: Transformer, unit: Unit, batch: int) -> float:
    """Largest difference between the graph and the eager block, relative to the eager output's scale,
    on the *last* layer (the graph was traced with layer 0's tensors) and a random input. Both write
    K/V into copies of the cache, which are compared too."""
    g = torch.Generator().manual_seed(0)
    args = example_inputs(tr, unit.spec, batch)
    x = torch.randn(args[0].shape, generator=g).to(args[0])
    L = tr.w.layers[-1]
    layer = [getattr(L, n) for n in layer_tensor_names(L)]
    with torch.inference_mode():
        if unit.spec["part"] == "mlp":
            pairs = [(unit.fn(x, *layer), tr.mlp_block(x, L))]
        else:
            cos, sin, slots, mask = args[1:5]
            kv_eager = [tr.k_cache[-1].clone(), tr.v_cache[-1].clone()]
            kv_graph = [tr.k_cache[-1].clone(), tr.v_cache[-1].clone()]
            ref = with_cache(tr, *kv_eager).attn_block(0, x, L, cos, sin, slots, unit.spec["bucket"], mask)
            out = unit.fn(x, cos, sin, slots, mask, *kv_graph, *layer)
            pairs = [(out, ref), (kv_graph[0], kv_eager[0]), (kv_graph[1], kv_eager[1])]
    return max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()
               for a, b in pairs)


def check_unit(tr: Transformer, unit: Unit, batch: int, how: str) -> None:
    """Refuse a graph that does not compute what this engine computes (never a silent wrong answer):
    e.g. graphs saved by other engine code, or a feature that keeps per-layer tensors outside the
    layer's attributes (they would be baked into the graph from layer 0)."""
    tol = 1e-4 if tr.dtype == torch.float32 else 3e-2
    rel = probe(tr, unit, batch)
    if not rel <= tol:
        err = ArtifactMismatchError if how == "loaded" else ValueError
        raise err(f"The {how} graph {unit.name} computes differently from this engine's eager {unit.spec['part']} "
                  f"block (relative difference {rel:.2e} > {tol:.0e} on the last layer). "
                  + ("It was saved by other engine code: build without load() and save() again."
                     if how == "loaded" else "A feature keeps per-layer state outside LayerWeights: compile "
                     "without NeuronConfig(compiled=...)."))


class BucketGraph:
    """The graphs of one (kind, bucket), called like ``Transformer.forward`` (the engine's ``_step``)."""

    def __init__(self, tr: Transformer, kind: str, bucket: int, batch: int, attn: Unit, mlp: Unit):
        self.tr, self.kind, self.bucket, self.batch, self.attn, self.mlp = tr, kind, bucket, batch, attn, mlp
        self.width = attn.spec["tokens"]
        self.names = layer_tensor_names(tr.w.layers[0])

    def _attn(self, i, x, L, cos, sin, slots, kv_len, attn_mask):
        return self.attn.fn(x, cos, sin, slots, attn_mask, self.tr.k_cache[i], self.tr.v_cache[i],
                            *[getattr(L, n) for n in self.names])

    def _mlp(self, x, L):
        return self.mlp.fn(x, *[getattr(L, n) for n in self.names])

    def __call__(self, tokens, rope_pos, slots, kv_len, mask, logit_idx=None):
        if tuple(tokens.shape) != (self.batch, self.width) or kv_len != self.bucket:
            raise ValueError(f"The compiled {self.kind}[{self.bucket}] graphs take {self.width} token(s) x batch "
                             f"{self.batch} over {self.bucket} KV positions; got tokens {tuple(tokens.shape)} "
                             f"over {kv_len} (no graph was built for this shape).")
        return self.tr.forward(tokens, rope_pos, slots, kv_len, mask, logit_idx, blocks=(self._attn, self._mlp))


def bucket_graphs(tr: Transformer, units: dict[str, Unit], kinds, batch) -> dict:
    graphs = {}
    for kind, buckets, _ in kinds:
        for b in buckets:
            attn = units[f"{kind}{b}.attn"]
            graphs[(kind, b)] = BucketGraph(tr, kind, b, batch, attn, units[f"mlp.t{attn.spec['tokens']}"])
    return graphs


def build_all(tr: Transformer, kinds, batch: int, artifact: str, workdir=None) -> tuple[dict, list[dict]]:
    """Build every graph of ``kinds`` (:func:`graph_kinds`); returns ``{(kind, bucket): BucketGraph}`` and
    one report row per graph with its build seconds."""
    units, report = {}, []
    for name, spec in unit_specs(kinds).items():
        t0 = time.perf_counter()
        units[name] = build_unit(tr, name, spec, batch, artifact, workdir)
        report.append({"graph": name, **spec, "artifact": artifact, "seconds": time.perf_counter() - t0})
    return bucket_graphs(tr, units, kinds, batch), report


# -- fingerprints and the manifest ---------------------------------------------------------------
def fingerprint(fields: dict, spec: dict, artifact: str) -> str:
    key = {**fields, **{f"unit_{k}": v for k, v in spec.items()}, "artifact": artifact}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def artifact_name(unit: str, rank: int, fp: str) -> str:
    return f"{unit}-rank{rank}-{fp}.pt2"


def manifest_path(directory, rank: int) -> Path:
    return Path(directory) / f"graphs-rank{rank}.json"


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def units_of(graphs: dict) -> dict[str, Unit]:
    units = {}
    for g in graphs.values():
        if not isinstance(g, BucketGraph):
            raise ValueError("save() writes ahead-of-time graphs: build with NeuronConfig(compiled='export') "
                             "(torch.export programs) or compiled='aoti' (AOTInductor packages); this model "
                             "runs eager graphs, which cannot be serialized.")
        units[g.attn.name], units[g.mlp.name] = g.attn, g.mlp
    return units


def save_graphs(directory, graphs: dict, fields: dict, rank: int, report: list[dict] | None = None) -> dict:
    """Write this rank's graphs and ``graphs-rank{rank}.json``; returns the manifest."""
    units = units_of(graphs)
    d = Path(directory)
    if d.is_file():  # as transformers-neuronx base.py _save_compiled_artifacts
        raise FileExistsError(f"Artifacts should be saved to a directory. Found existing file: {directory}")
    d.mkdir(parents=True, exist_ok=True)
    seconds = {r["graph"]: r["seconds"] for r in report or []}
    entries = []
    for name, u in units.items():
        fp = fingerprint(fields, u.spec, u.artifact)
        path = d / artifact_name(name, rank, fp)
        if u.artifact == "export":
            torch.export.save(u.program, str(path))
        else:
            shutil.copyfile(u.package, path)
        entries.append({"unit": name, "spec": u.spec, "artifact": u.artifact, "file": path.name,
                        "fingerprint": fp, "sha256": file_sha256(path), "bytes": path.stat().st_size,
                        "build_s": seconds.get(name)})
    manifest = {"format": FORMAT_VERSION, "fields": fields, "graphs": entries}
    manifest_path(d, rank).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def describe_differences(saved: dict, now: dict) -> list[str]:
    keys = sorted(set(saved) | set(now))
    return [f"{k}: saved {saved.get(k, '(absent)')!r}, now {now.get(k, '(absent)')!r}"
            for k in keys if saved.get(k) != now.get(k)]


def read_manifest(directory, fields: dict, rank: int, verify_files: bool = True) -> dict:
    """This rank's manifest, after checking it was written for exactly this model and engine and
    (``verify_files``) that every graph file is present with the sha256 recorded at save()."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"Did not find directory: {directory}.")
    path = manifest_path(d, rank)
    if not path.is_file():
        others = sorted(p.name for p in d.glob("graphs-rank*.json"))
        hint = (f" It holds {', '.join(others)}: saved with another tp_degree?" if others
                else " Nothing there was written by save()/compile().")
        raise FileNotFoundError(f"No saved graphs for rank {rank} in {directory} ({path.name} is missing)."
                                f"{hint} Build without load() and save() again.")
    try:
        manifest = json.loads(path.read_text())
        saved, entries = manifest["fields"], manifest["graphs"]
        by_unit = {e["unit"]: e for e in entries}
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptArtifactError(f"{path} is corrupted ({type(exc).__name__}: {exc}): save() again.") from None
    diffs = describe_differences(saved, fields)
    if diffs:
        raise ArtifactMismatchError(
            f"The graphs saved in {directory} were built for another configuration: " + "; ".join(diffs)
            + ". They cannot be used for this model: build it without load() (a fresh compile) and save() "
            "again, or construct the model with the saved settings.")
    for name, spec in unit_specs(kinds_of(fields)).items():
        e = by_unit.get(name)
        if e is None:
            raise CorruptArtifactError(f"{path} lists no graph {name}: the directory is incomplete; save() again.")
        if e.get("artifact") not in ARTIFACTS:
            raise CorruptArtifactError(f"{path}: graph {name} has unknown artifact kind {e.get('artifact')!r}")
        fp = fingerprint(fields, spec, e["artifact"])
        f = d / artifact_name(name, rank, fp)
        if e.get("fingerprint") != fp or not f.is_file():
            raise CorruptArtifactError(f"No graph file with fingerprint {fp} for {name} (rank {rank}) in {directory} "
                                       f"(the manifest lists {e.get('file')}): the directory was edited after "
                                       "save(); save() again.")
        if verify_files and file_sha256(f) != e["sha256"]:
            raise CorruptArtifactError(f"{f} is corrupted: its sha256 differs from the one recorded at save(). "
                                       "Delete the directory and save() again.")
    return manifest


def load_graphs(directory, tr: Transformer, fields: dict, rank: int, batch: int) -> tuple[dict, list[dict]]:
    """Load every graph this rank needs after verifying fingerprints and sha256 (no compilation)."""
    manifest = read_manifest(directory, fields, rank)
    by_unit = {e["unit"]: e for e in manifest["graphs"]}
    units, report = {}, []
    for name, spec in unit_specs(kinds_of(fields)).items():
        e = by_unit[name]
        path = Path(directory) / e["file"]
        t0 = time.perf_counter()
        try:
            if e["artifact"] == "export":
                ep = torch.export.load(str(path))
                units[name] = Unit(name, spec, "export", ep.module(), program=ep)
            else:
                units[name] = Unit(name, spec, "aoti", torch._inductor.aoti_load_package(str(path)),
                                   package=str(path))
        except Exception as exc:  # a file that hashes right but does not deserialize
            raise CorruptArtifactError(f"Could not load {path}: {type(exc).__name__}: {exc}") from exc
        check_unit(tr, units[name], batch, "loaded")
        report.append({"graph": name, **spec, "artifact": e["artifact"], "seconds": time.perf_counter() - t0,
                       "loaded": True})
    return bucket_graphs(tr, units, kinds_of(fields), batch), report


# -- presharded weights (one safetensors file per rank) ------------------------------------------
def rank_weight_tensors(w: RankWeights) -> dict[str, torch.Tensor]:
    """Every tensor of one rank's weights by a stable name (``layers.3.wqkv``, ``extra.scale``...)."""
    out = {}
    for f in dataclasses.fields(w):
        v = getattr(w, f.name)
        if f.name == "layers":
            for i, L in enumerate(v):
                out.update({f"layers.{i}.{n}": getattr(L, n) for n in layer_tensor_names(L)})
        elif f.name == "extra":
            out.update({f"extra.{k}": t for k, t in v.items() if torch.is_tensor(t)})
        elif torch.is_tensor(v):
            out[f.name] = v
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
    from safetensors.torch import save_file

    if any(not torch.is_tensor(v) for v in w.extra.values()):
        raise ValueError("These weights carry non-tensor extras that safetensors cannot hold: save them "
                         "without sharded_weights=True.")
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
    from safetensors import safe_open

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


def load_rank_weights(directory, rank: int, meta: dict) -> RankWeights:
    """One rank's weights exactly as saved (no fusing, casting or sharding); refuses another layout."""
    from safetensors import safe_open

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
    extra = {k[len("extra."):]: t for k, t in named.items() if k.startswith("extra.")}
    return RankWeights(embed=named["embed"], norm=named["norm"], lm_head=named["lm_head"], layers=layers,
                       n_q=info["n_q"], n_kv=info["n_kv"], vocab_size=info["vocab_size"],
                       kv_group=named.get("kv_group"), extra=extra)
