"""Memory per NeuronCore before you compile: weights + KV cache for each ``tp_degree``, the GQA strategy
each library would pick, and whether it fits the instance types' NeuronCores.

Facts (Neuron documentation, SDK 2.26-2.28):

- Inferentia2 chip: 2 NeuronCore-v2, 32 GiB HBM
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/inferentia2.html);
  inf2.xlarge / inf2.8xlarge have 1 chip, inf2.24xlarge 6, inf2.48xlarge 12
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/inf2-arch.html).
- Trainium chip: 2 NeuronCore-v2, 32 GiB; trn1.2xlarge 1 chip, trn1.32xlarge 16
  (.../neuron-hardware/trainium.html, .../neuron-hardware/trn1-arch.html).
- Trainium2 chip: 8 physical NeuronCore-v3, 96 GiB; trn2.48xlarge 16 chips; with the default Logical
  NeuronCore config LNC=2 that is 64 cores of ~24 GiB (.../neuron-hardware/trainium2.html,
  .../neuron-features/logical-neuroncore-config.html).
- Host memory per instance (the "Host Memory (GiB)" column of the architecture pages at SDK 2.28.1): inf2.xlarge 16,
  inf2.8xlarge 128, inf2.24xlarge 384, inf2.48xlarge 768
  (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/about-neuron/arch/neuron-hardware/inf2-arch.html);
  trn1.2xlarge 32, trn1.32xlarge 512 (.../v2.28.1/about-neuron/arch/neuron-hardware/trn1-arch.html);
  trn2.48xlarge 2,048 (.../v2.28.1/about-neuron/arch/neuron-hardware/trn2-arch.html). What loading and compiling
  need of it is estimated in ``helpers.planning.production``.
- Tensor-parallel degrees the runtime supports: Inf2 1, 2, 4, 8, 24; Trn1 1, 2, 8, 16, 32; Trn2 1, 2, 4, 8,
  16, 32, 64 (LNC=2). And "the total data size of model weights and key-value caches needs to be smaller
  than the tensor-parallelism degree multiplied by the amount of memory per Neuron core" (NxD Inference
  feature guide, tensor-parallelism section; transformers-neuronx developer guide says the same with 16 GB).

What is counted, per core, for the layout ``helpers.planning.gqa`` computes (padding and replication included):
q/k/v/o and the MLP (every expert for MoE) sharded over tp, the vocabulary-parallel LM head (vocabulary
padded to a multiple of tp), the norms (replicated), the embedding (NxD Inference: sharded on device;
transformers-neuronx: on the host unless ``on_device_embedding``), and the KV cache. int8 / fp8 weight
storage (``quantization``) stores the decoder's linear weights in 1 byte plus one scale per output
channel; embedding, LM head and norms stay in ``amp``.

Not counted: what the Neuron runtime allocates besides (compiled graphs, their I/O and scratch, collective
buffers). ``RUNTIME_RESERVE`` keeps a share of each core for it. It is an assumption, sized on the one
measurement we have: a user's report (not published) of a 15.9 GB allocation on one 16 GiB inf2 core for Mistral-7B in
bf16 at tp=1, where weights + KV cache are 13.7 GiB (14.8 GB): ~2 GiB, ~14 % of the core, went to the rest.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..model_store import load_config
from .dtypes import amp_bytes
from .gqa import head_padding_message, library_default, resolve_layout, round_up

GiB = 2 ** 30
GB = 10 ** 9
RUNTIME_RESERVE = 0.15  # share of a core's HBM left to the runtime (see the module docstring)
CONFIG_DIR = Path(__file__).parent.parent / "model_configs"
QUANT_BYTES = {None: None, "int8": 1, "s8": 1, "f8e4m3": 1, "f8e4m3fn": 1}

# A user's report (not published): the allocation they saw for Mistral-7B bf16 on one inf2 NeuronCore (tp_degree=1).
SEED_000 = {"model": "Mistral-7B-Instruct-v0.2", "instance": "inf2.xlarge", "tp_degree": 1, "batch_size": 1,
            "n_positions": 4096, "amp": "bf16", "observed_gb": 15.938}

PLATFORM_TP_DEGREES = {"inf2": (1, 2, 4, 8, 24), "trn1": (1, 2, 8, 16, 32), "trn2": (1, 2, 4, 8, 16, 32, 64)}


@dataclass(frozen=True)
class InstanceType:
    name: str
    platform: str          # inf2 | trn1 | trn2
    chips: int
    cores_per_chip: int    # NeuronCores the runtime exposes per chip (trn2: logical cores at LNC=2)
    hbm_per_chip_gib: int
    host_memory_gib: int   # the instance's host (CPU) memory: it holds the checkpoint while loading and compiling

    @property
    def host_memory_bytes(self) -> int:
        return self.host_memory_gib * GiB

    @property
    def cores(self) -> int:
        return self.chips * self.cores_per_chip

    @property
    def hbm_per_core_bytes(self) -> int:
        return self.hbm_per_chip_gib * GiB // self.cores_per_chip

    @property
    def tp_degrees(self) -> tuple:
        """Degrees the runtime supports on this platform that fit in this instance's cores."""
        return tuple(t for t in PLATFORM_TP_DEGREES[self.platform] if t <= self.cores)


INSTANCES = {i.name: i for i in (
    InstanceType("inf2.xlarge", "inf2", 1, 2, 32, 16),
    InstanceType("inf2.8xlarge", "inf2", 1, 2, 32, 128),
    InstanceType("inf2.24xlarge", "inf2", 6, 2, 32, 384),
    InstanceType("inf2.48xlarge", "inf2", 12, 2, 32, 768),
    InstanceType("trn1.2xlarge", "trn1", 1, 2, 32, 32),
    InstanceType("trn1.32xlarge", "trn1", 16, 2, 32, 512),
    InstanceType("trn2.48xlarge", "trn2", 16, 4, 96, 2048),
)}


def instance(name) -> InstanceType:
    if isinstance(name, InstanceType):
        return name
    if name not in INSTANCES:
        raise ValueError(f"instance {name!r} is unknown: use one of {list(INSTANCES)}")
    return INSTANCES[name]


# -- model configs -----------------------------------------------------------------------------
def list_model_configs() -> list[str]:
    return sorted(p.parent.name for p in CONFIG_DIR.glob("*/config.json"))


def load_model_config(model) -> dict:
    """A shipped config by name (``list_model_configs()``), "embedded" (SmolLM2), a path, or a dict."""
    if isinstance(model, dict):
        return dict(model)
    if model in (None, "embedded"):
        return load_config(None)
    path = Path(model)
    if (CONFIG_DIR / str(model) / "config.json").is_file():
        path = CONFIG_DIR / str(model) / "config.json"
    elif path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"model {model!r}: not a shipped config ({', '.join(list_model_configs())}), nor a "
                         "config.json / checkpoint directory")
    cfg = json.loads(path.read_text())
    cfg.setdefault("_name", path.parent.name)
    return cfg


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    experts: int            # 1 for dense MLPs
    tied: bool
    attention_bias: bool
    max_positions: int

    @classmethod
    def from_config(cls, cfg: dict) -> "Shape":
        heads = cfg["num_attention_heads"]
        return cls(name=cfg.get("_name") or cfg.get("_name_or_path") or cfg.get("model_type", "model"),
                   hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=heads,
                   kv_heads=cfg.get("num_key_value_heads") or heads,
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                   experts=cfg.get("num_local_experts") or 1, tied=bool(cfg.get("tie_word_embeddings", False)),
                   attention_bias=bool(cfg.get("attention_bias", False)),
                   max_positions=cfg.get("max_position_embeddings", 2048))

    @property
    def params(self) -> int:
        """Parameters of the checkpoint (embedding counted once when tied)."""
        H, D = self.hidden, self.head_dim
        attn = H * (self.heads + 2 * self.kv_heads) * D + self.heads * D * H
        mlp = 3 * H * self.intermediate * self.experts + (H * self.experts if self.experts > 1 else 0)
        per_layer = attn + mlp + 2 * H
        return self.layers * per_layer + H + self.vocab * H * (1 if self.tied else 2)


# -- the plan ----------------------------------------------------------------------------------
@dataclass
class Plan:
    model: str
    library: str
    tp_degree: int
    batch_size: int
    n_positions: int
    amp: str
    quantization: str | None
    strategy: str | None = None
    kv_mode: str | None = None
    n_heads: int = 0
    n_heads_padded: int = 0
    q_heads_per_core: int = 0
    kv_heads_per_core: int = 0
    weight_bytes: int = 0
    kv_bytes: int = 0
    breakdown: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)   # the library's fallback warnings, padding notes
    error: str | None = None                    # the library cannot build this

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    def usable_bytes(self, inst, reserve: float = RUNTIME_RESERVE) -> int:
        return int(instance(inst).hbm_per_core_bytes * (1 - reserve))

    def fits(self, inst, reserve: float = RUNTIME_RESERVE) -> bool:
        return self.error is None and self.total_bytes <= self.usable_bytes(inst, reserve)

    def row(self) -> dict:
        return {"model": self.model, "library": self.library, "tp": self.tp_degree, "strategy": self.strategy,
                "q_heads/core": self.q_heads_per_core, "kv_heads/core": self.kv_heads_per_core,
                "weights_GiB": round(self.weight_bytes / GiB, 2), "kv_GiB": round(self.kv_bytes / GiB, 2),
                "total_GiB": round(self.total_bytes / GiB, 2), "error": self.error}


def plan(model, tp_degree: int, batch_size: int = 1, n_positions: int = 2048, amp: str = "bf16",
         quantization: str | None = None, library: str = "tnx", gqa=None,
         on_device_embedding: bool | None = None) -> Plan:
    """Bytes per NeuronCore for one setting. ``gqa`` None: the library's default (with its fallbacks)."""
    cfg = load_model_config(model)
    s = Shape.from_config(cfg)
    wb = amp_bytes(amp)  # refuses an unknown amp
    if quantization not in QUANT_BYTES:
        raise ValueError(f"quantization={quantization!r}: use None, 'int8' ('s8') or 'f8e4m3' ('f8e4m3fn')")
    if library not in ("tnx", "nxdi"):
        raise ValueError(f"library={library!r}: use 'tnx' (transformers-neuronx) or 'nxdi' (NxD Inference)")
    tp = int(tp_degree)
    p = Plan(s.name, library, tp, int(batch_size), int(n_positions), amp, quantization, n_heads=s.heads)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            layout = (library_default(library, s.heads, s.kv_heads, s.head_dim, tp, batch_size) if gqa is None
                      else resolve_layout(s.heads, s.kv_heads, s.head_dim, tp, batch_size, gqa))
        except ValueError as e:
            p.error = str(e)
            return p
    p.notes = [str(w.message) for w in caught]
    pad = head_padding_message(s.heads, tp)
    if pad:
        p.notes.append(pad)
    p.strategy, p.kv_mode = layout.name, layout.kv_mode
    p.n_heads_padded, p.q_heads_per_core, p.kv_heads_per_core = layout.n_heads_padded, layout.q_heads_per_rank, layout.kv_heads_per_rank

    H, D = s.hidden, s.head_dim
    lb = QUANT_BYTES[quantization] or wb                 # bytes per decoder linear weight
    q_cols = layout.n_heads_padded * D // tp              # q rows (o columns) a core holds
    kv_cols = round(layout.kv_weight_heads_per_rank * D)  # k rows, and v rows
    ffn = round_up(s.intermediate, tp) // tp
    linear_out = (q_cols + 2 * kv_cols) + H + s.experts * (2 * ffn + H)   # output channels per layer
    linear = H * (q_cols + 2 * kv_cols) + q_cols * H + s.experts * 3 * H * ffn
    per_layer = linear * lb + (linear_out * wb if quantization else 0)
    per_layer += (H * s.experts * wb if s.experts > 1 else 0) + 2 * H * wb        # router, norms
    if s.attention_bias:
        per_layer += (q_cols + 2 * kv_cols + H) * wb
    on_device = library == "nxdi" if on_device_embedding is None else on_device_embedding
    b = {"layers": s.layers * per_layer, "norm": H * wb,
         "lm_head": round_up(s.vocab, tp) // tp * H * wb,
         "embedding": (s.vocab * round_up(H, tp) // tp * wb) if on_device else 0}
    p.breakdown = b
    p.weight_bytes = sum(b.values())
    p.kv_bytes = layout.kv_cache_elems(s.layers, n_positions) * wb
    return p


def smallest_fitting_tp(model, inst, reserve: float = RUNTIME_RESERVE, **kwargs) -> Plan | None:
    for tp in instance(inst).tp_degrees:
        p = plan(model, tp, **kwargs)
        if p.fits(inst, reserve):
            return p
    return None


def _gib(n) -> str:
    return f"{n / GiB:.2f} GiB"


def check(model, inst, tp_degree: int, batch_size: int = 1, n_positions: int = 2048, amp: str = "bf16",
          quantization: str | None = None, library: str = "tnx", gqa=None, reserve: float = RUNTIME_RESERVE,
          strict_heads: bool = False) -> Plan:
    """Validate a deployment before any build; raise ValueError that names the fix, else return the Plan.

    Query heads that tp does not divide are padded (the libraries do it): a warning, or an error with
    ``strict_heads=True``.
    """
    it = instance(inst)
    cfg = load_model_config(model)
    s = Shape.from_config(cfg)
    tp = int(tp_degree)
    valid = PLATFORM_TP_DEGREES[it.platform]
    if tp not in valid:
        near = [t for t in valid if t < tp][-1:] + [t for t in valid if t > tp][:1]
        raise ValueError(f"tp_degree={tp} is not a tensor-parallel degree the Neuron runtime supports on "
                         f"{it.platform} ({', '.join(map(str, valid))}): use tp_degree "
                         f"{' or '.join(map(str, near))}")
    if tp > it.cores:
        bigger = [i.name for i in INSTANCES.values() if i.platform == it.platform and i.cores >= tp]
        raise ValueError(f"{it.name} has {it.cores} NeuronCores, tp_degree={tp} needs {tp}: use "
                         f"{' or '.join(bigger) or 'a larger instance'}, or tp_degree <= {it.cores}")
    if batch_size < 1 or n_positions < 1:
        raise ValueError(f"batch_size={batch_size}, n_positions={n_positions}: both must be >= 1")
    if n_positions > s.max_positions:
        raise ValueError(f"n_positions={n_positions} exceeds {s.name}'s max_position_embeddings={s.max_positions}: "
                         f"use n_positions <= {s.max_positions}")
    kw = dict(batch_size=batch_size, n_positions=n_positions, amp=amp, quantization=quantization, library=library,
              gqa=gqa)
    p = plan(cfg, tp, **kw)
    if p.error:
        raise ValueError(p.error)
    pad = head_padding_message(s.heads, tp)
    if pad:
        if strict_heads:
            raise ValueError(pad)
        warnings.warn(pad, stacklevel=2)
    if not p.fits(it, reserve):
        usable = p.usable_bytes(it, reserve)
        fix = smallest_fitting_tp(cfg, it, reserve, **kw)
        if fix is not None:
            how = f"use tp_degree={fix.tp_degree} ({_gib(fix.total_bytes)} per core)"
        else:
            others = [i for i in INSTANCES.values() if smallest_fitting_tp(cfg, i, reserve, **kw) is not None]
            how = ("use " + " or ".join(i.name for i in others[:2]) if others else
                   "lower batch_size / n_positions, or store the weights in int8 (quantization='int8')")
        raise ValueError(
            f"{s.name} at tp_degree={tp}, batch_size={batch_size}, n_positions={n_positions}, amp={amp!r} needs "
            f"{_gib(p.total_bytes)} per NeuronCore (weights {_gib(p.weight_bytes)} + KV cache {_gib(p.kv_bytes)}), "
            f"more than the {_gib(usable)} usable of an {it.name} core ({it.hbm_per_core_bytes // GiB} GiB, "
            f"{round(reserve * 100)}% kept for the runtime): {how}")
    return p
