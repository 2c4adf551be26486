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

- ``"export"``: ``torch.export`` programs saved with ``torch.export.save`` (``.pt2``): the ATen ops the
  eager engine runs with library kernels and torch's ops (bitwise identical to it with ``$NEURON_NB_GEMV=mkl``,
  ``$NEURON_NB_GEMM=onednn`` and ``$NEURON_NB_OPS=torch``); the default eager engine's "stream" kernel and C ops
  between the matmuls (``helpers.engine.cpu.fused_ops``) are no ATen ops, so against it the outputs agree within f32
  rounding.
- ``"aoti"``: each exported program compiled by AOTInductor into a C++ shared library inside a
  ``.pt2`` package (``torch._inductor.aoti_compile_and_package``): real ahead-of-time machine code,
  the closest analogue of a NEFF; loading one is a ``dlopen``.
- ``True`` means ``"export"``. (``torch.compile`` is not offered: it fails on the inference tensors
  that ``sample()`` creates under ``torch.inference_mode``, and its JIT code cannot be saved.)

Saving and loading them: ``helpers.artifacts.manifest`` (fingerprints, sha256) and
``helpers.artifacts.serialization`` (whose ``rank_graphs`` decides, per rank, whether a bucket's graphs
are loaded, built or the eager forward).
"""
from __future__ import annotations

import copy
import dataclasses
import os
import time

import torch

from ..engine.config import ARTIFACTS
from ..engine.generation import graph_kinds
from ..engine.kv_cache import KVCache
from ..engine.model import Linear, Transformer, build_mask
from ..engine.weights import LayerWeights, stored



class ArtifactMismatchError(ValueError):
    """Saved graphs were built for another model, engine configuration or torch version."""


class CorruptArtifactError(ValueError):
    """A saved file is missing, changed after save() or cannot be deserialized."""


# -- graph units ----------------------------------------------------------------------------------
def layer_tensor_names(L: LayerWeights) -> list[str]:
    """The tensors of one layer, by attribute name (dataclass fields first, then any added ones); a
    :class:`CpuWeight` counts as its stored matrix."""
    names = [f.name for f in dataclasses.fields(L) if torch.is_tensor(stored(getattr(L, f.name)))]
    return names + sorted(k for k, v in vars(L).items() if torch.is_tensor(stored(v)) and k not in names)


def layer_tensors(L: LayerWeights, names: list[str]) -> list[torch.Tensor]:
    """The tensors of ``names`` (a graph's inputs for layer ``L``)."""
    return [stored(getattr(L, n)) for n in names]


def layer_view(template: LayerWeights, names: list[str], tensors, plain: bool = False) -> LayerWeights:
    """``template`` over ``tensors`` (a graph's inputs): a matrix keeps its kind (a ``CpuWeight`` its kernels,
    without copies), or, ``plain``, runs ``F.linear`` (:class:`Linear`)."""
    L = copy.copy(template)
    for n, t in zip(names, tensors):
        old = getattr(template, n)
        setattr(L, n, t if torch.is_tensor(old) else Linear(t) if plain else old.traced(t))
    return L


class AttnGraph(torch.nn.Module):
    """``(x, cos, sin, slots, attn_mask, k_cache, v_cache, *layer) -> attention output`` at a fixed shape."""

    def __init__(self, tr: Transformer, kv_len: int, plain: bool = False):
        super().__init__()
        self.tr, self.kv_len, self.plain = tr, kv_len, plain
        self.template = tr.w.layers[0]
        self.names = layer_tensor_names(self.template)

    def forward(self, x, cos, sin, slots, attn_mask, k_cache, v_cache, *layer):
        L = layer_view(self.template, self.names, layer, self.plain)
        return self.tr.attn_block(x, L, KVCache(k_cache, v_cache), cos, sin, slots, self.kv_len, attn_mask)


class MlpGraph(torch.nn.Module):
    """``(x, *layer) -> MLP output`` at a fixed shape."""

    def __init__(self, tr: Transformer, plain: bool = False):
        super().__init__()
        self.tr, self.template, self.plain = tr, tr.w.layers[0], plain
        self.names = layer_tensor_names(self.template)

    def forward(self, x, *layer):
        return self.tr.mlp_block(x, layer_view(self.template, self.names, layer, self.plain))


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
    layer = tuple(layer_tensors(tr.w.layers[0], layer_tensor_names(tr.w.layers[0])))
    if spec["part"] == "mlp":
        return (x, *layer)
    slots = torch.arange(T, device=dev)
    rope_pos = slots[None, :].expand(batch, T)
    cos, sin = tr.cos[rope_pos].unsqueeze(2), tr.sin_signed[rope_pos].unsqueeze(2)  # as Transformer.forward
    mask = build_mask(slots, torch.zeros(batch, dtype=torch.long, device=dev), spec["bucket"], None).unsqueeze(1)
    kv = tr.cache.layer(0)
    return (x, cos, sin, slots, mask, kv.k, kv.v, *layer)


def export_unit(tr: Transformer, spec: dict, batch: int, artifact: str = "export") -> torch.export.ExportedProgram:
    # AOTInductor graphs call F.linear (an MKL mm_out in the generated code; ``plain``). Not oneDNN's linear:
    # its lowering accepts only constant (frozen) weights, and the graphs take weights as inputs. Not split-k:
    # Inductor fuses its bmm + sum into a generated C++ loop that ran slower than F.linear (ci/benchmark.py
    # --compiled aoti). "export" graphs keep each CpuWeight's kernels (without their copies).
    plain = artifact == "aoti"
    mod = AttnGraph(tr, spec["bucket"], plain) if spec["part"] == "attn" else MlpGraph(tr, plain)
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
    layer = layer_tensors(L, layer_tensor_names(L))
    with torch.inference_mode():
        if unit.spec["part"] == "mlp":
            pairs = [(unit.fn(x, *layer), tr.mlp_block(x, L))]
        else:
            cos, sin, slots, mask = args[1:5]
            last = tr.cache.layer(-1)
            kv_eager = KVCache(last.k.clone(), last.v.clone())
            kv_graph = KVCache(last.k.clone(), last.v.clone())
            ref = tr.attn_block(x, L, kv_eager, cos, sin, slots, unit.spec["bucket"], mask)
            out = unit.fn(x, cos, sin, slots, mask, kv_graph.k, kv_graph.v, *layer)
            pairs = [(out, ref), (kv_graph.k, kv_eager.k), (kv_graph.v, kv_eager.v)]
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
    """The graphs of one (kind, bucket), called like ``Transformer.forward`` (the engine's ``step``)."""

    def __init__(self, tr: Transformer, kind: str, bucket: int, batch: int, attn: Unit, mlp: Unit):
        self.tr, self.kind, self.bucket, self.batch, self.attn, self.mlp = tr, kind, bucket, batch, attn, mlp
        self.width = attn.spec["tokens"]
        self.names = layer_tensor_names(tr.w.layers[0])

    def _attn(self, x, L, kv, cos, sin, slots, kv_len, attn_mask):
        return self.attn.fn(x, cos, sin, slots, attn_mask, kv.k, kv.v, *layer_tensors(L, self.names))

    def _mlp(self, x, L):
        return self.mlp.fn(x, *layer_tensors(L, self.names))

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
    """Build every graph of ``kinds`` (``helpers.engine.generation.graph_kinds``); returns ``{(kind, bucket): BucketGraph}`` and
    one report row per graph with its build seconds."""
    units, report = {}, []
    for name, spec in unit_specs(kinds).items():
        t0 = time.perf_counter()
        units[name] = build_unit(tr, name, spec, batch, artifact, workdir)
        report.append({"graph": name, **spec, "artifact": artifact, "seconds": time.perf_counter() - t0})
    return bucket_graphs(tr, units, kinds, batch), report


def units_of(graphs: dict) -> dict[str, Unit]:
    units = {}
    for g in graphs.values():
        if not isinstance(g, BucketGraph):
            raise ValueError("save() writes ahead-of-time graphs: build with NeuronConfig(compiled='export') "
                             "(torch.export programs) or compiled='aoti' (AOTInductor packages); this model "
                             "runs eager graphs, which cannot be serialized.")
        units[g.attn.name], units[g.mlp.name] = g.attn, g.mlp
    return units


def artifact_mode(compiled) -> str | None:
    """``NeuronConfig.compiled`` as an artifact kind: "export" (or True), "aoti", or None (eager)."""
    return "export" if compiled is True else (compiled or None)
