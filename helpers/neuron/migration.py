"""transformers-neuronx 0.13 (SDK 2.26) -> NxD Inference 0.8 (SDK 2.28): the knob-by-knob mapping, generated.

The mapping has one home, :func:`helpers.neuron.settings.neuron_settings`, the function ``helpers.neuron`` builds
both stacks with. This module holds no mapping of its own: :data:`KNOBS` lists the transformers-neuronx settings the
notebooks 01-10 use, as the *inputs* of ``neuron_settings``, and :func:`mapping_rows` calls it once per setting and
stack and reports what changed against a probe (the same settings with that knob at another value): the
transformers-neuronx keywords on one side, the NxD Inference ``NeuronConfig`` keywords on the other, the notes it
adds, or ``none`` with its refusal (which says what to do instead). ``neuron_settings`` is looked up at call time,
so a change there (or a monkeypatch in a test) changes the table.

Two serving features have no input in ``neuron_settings`` on the transformers-neuronx side (the notebooks'
Neuron cells build them, not ``helpers.neuron``): continuous batching (notebook 09) and on-device sampling. Their rows
pass NxD Inference's keywords through ``neuron_settings(..., nxdi_overrides=...)`` (which refuses a keyword 0.8 does
not take) and name the transformers-neuronx keyword beside them; ``Row.derived`` says which rows are which.

:func:`bucket_plan` and :func:`memory_plan` compare what each stack compiles and holds per NeuronCore for the same
settings, from the planners in ``helpers.planning``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ..engine.config import NeuronConfig
from ..planning.buckets import NxDIBucketing, nxdi_select, tnx_context_buckets, tnx_find, tnx_token_buckets
from ..planning.gqa import GQA
from ..planning.memory import plan
from . import settings as _settings

# The settings every row starts from (neuron_settings' own defaults, except n_positions: a small bucket set).
BASE = {"batch_size": 1, "n_positions": 256, "tp_degree": 1, "amp": "f32"}
# NxD Inference needs a separate quantized checkpoint (neuron_settings refuses int8 without it); a placeholder.
QCKPT = "<quantized_checkpoints_path>"
REFUSED = "none"


@dataclasses.dataclass(frozen=True)
class Knob:
    """One transformers-neuronx setting as ``neuron_settings`` takes it."""
    setting: str                 # how a transformers-neuronx user writes it
    kwargs: dict                 # neuron_settings keywords for it (over BASE), both stacks
    probe: dict                  # the same knob at another value: the row shows what differs from it
    used_in: str                 # the notebooks that use it
    nxdi_kwargs: dict = dataclasses.field(default_factory=dict)  # what NxD Inference needs besides (an input)
    tnx_keyword: str | None = None  # serving rows: the transformers-neuronx keyword (not built by helpers.neuron)


def _nc(**kw):
    return NeuronConfig(fuse_qkv=False, **kw)  # transformers-neuronx's default fuse_qkv (the engine's is True)


KNOBS: tuple[Knob, ...] = (
    Knob("tp_degree=2", {"tp_degree": 2}, {}, "01 02 03 04 08"),
    Knob("batch_size=4", {"batch_size": 4}, {}, "02 04 09"),
    Knob("n_positions=2048 (int)", {"n_positions": 2048}, {}, "07"),
    # against the base settings (not n_positions=512): the row shows seq_len, which NxD Inference needs besides
    # the bucket list (the list's largest bucket)
    Knob("n_positions=[128, 512] (list)", {"n_positions": [128, 512]}, {}, "07"),
    Knob("context_length_estimate=None (default)", {}, {"context_length_estimate": 64}, "all"),
    Knob("context_length_estimate=[64, 128]", {"context_length_estimate": [64, 128]}, {}, "07"),
    Knob("amp='bf16'", {"amp": "bf16"}, {}, "all"),
    Knob("amp='f16'", {"amp": "f16"}, {}, "06"),
    *(Knob(f"neuron_config.group_query_attention=GQA.{g.name}", {"neuron_config": _nc(group_query_attention=g)},
           {"neuron_config": _nc()}, "02") for g in GQA),
    Knob("neuron_config.quant: s8, vector_dynamic", {"neuron_config": _nc(quant={"quant_dtype": "s8"})},
         {"neuron_config": _nc()}, "06", {"quantized_checkpoints_path": QCKPT}),
    Knob("neuron_config.quant: f8e4m3fn", {"neuron_config": _nc(quant={"quant_dtype": "f8e4m3fn"})},
         {"neuron_config": _nc()}, "06", {"quantized_checkpoints_path": QCKPT}),
    Knob("neuron_config.quant: quantize_method='direct_cast'",
         {"neuron_config": _nc(quant={"quant_dtype": "s8", "quantize_method": "direct_cast"})},
         {"neuron_config": _nc()}, "06", {"quantized_checkpoints_path": QCKPT}),
    Knob("neuron_config.quant: no_quantize_list=['lm_head']",
         {"neuron_config": _nc(quant={"quant_dtype": "s8", "no_quantize_list": ["lm_head"]})},
         {"neuron_config": _nc()}, "06", {"quantized_checkpoints_path": QCKPT}),
    Knob("neuron_config.fuse_qkv=True", {"neuron_config": NeuronConfig(fuse_qkv=True)},
         {"neuron_config": _nc()}, "all, via helpers.build_model (the engine default)"),
    Knob("neuron_config.on_device_embedding=True", {"neuron_config": _nc(on_device_embedding=True)},
         {"neuron_config": _nc()}, "08"),
    Knob("enable_speculative_decoder(5) (4 drafts)", {"speculation_length": 4}, {}, "05"),
    Knob("neuron_config.continuous_batching=ContinuousBatchingConfig(batch_size_for_shared_caches=4)",
         {"batch_size": 4}, {"batch_size": 4}, "09",
         {"nxdi_overrides": {"is_continuous_batching": True, "max_batch_size": 4, "ctx_batch_size": 1,
                             "tkg_batch_size": 4}},
         tnx_keyword="continuous_batching=ContinuousBatchingConfig(batch_size_for_shared_caches=4)"),
    Knob("neuron_config.on_device_generation=GenerationConfig(do_sample=True, top_k=50)", {}, {}, "05 (NxDI text)",
         {"nxdi_overrides": {"on_device_sampling_config": {"do_sample": True, "top_k": 50}}},
         tnx_keyword="on_device_generation=GenerationConfig(do_sample=True, top_k=50)"),
)


@dataclasses.dataclass
class Row:
    setting: str      # the transformers-neuronx setting
    tnx: str          # its keywords as helpers.neuron passes them to transformers-neuronx 0.13
    nxdi: str         # the NxD Inference 0.8 NeuronConfig keywords for it, or "none: <what to do instead>"
    notes: str        # what neuron_settings says besides (behaviour that differs)
    used_in: str
    derived: str      # "neuron_settings" or "nxdi_overrides (tnx side: the notebooks' cells)"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _flat_tnx(ns) -> dict:
    out = {**ns.model_kwargs, **{f"neuron_config.{k}": v for k, v in ns.neuron_config.items()}}
    for k, v in (ns.quantization or {}).items():
        out[f"quant.{k}"] = v
    if ns.speculation_length:
        out["enable_speculative_decoder"] = ns.tokens_per_verification
    return out


def _flat_nxdi(ns) -> dict:
    return dict(ns.neuron_config)


def _call(fn: Callable, stack: str, kwargs: dict):
    """neuron_settings(stack, **kwargs) as (flat keywords, notes), or (None, the refusal)."""
    try:
        ns = fn(stack, **kwargs)
    except (ValueError, TypeError) as e:
        return None, str(e)
    return (_flat_tnx(ns) if stack == "tnx" else _flat_nxdi(ns)), list(ns.notes)


def _fmt(d: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in d.items()) if d else "(no keyword: the default)"


def _diff(got: dict, probe: dict | None) -> dict:
    if probe is None:
        return got
    return {k: v for k, v in got.items() if k not in probe or probe[k] != v}


def mapping_rows(knobs=KNOBS) -> list[Row]:
    """One row per knob, computed by calling ``helpers.neuron.settings.neuron_settings`` (looked up now)."""
    fn = _settings.neuron_settings
    rows = [_base_row(fn)]
    for k in knobs:
        tnx_kw = {**BASE, **k.kwargs}
        nxdi_kw = {**tnx_kw, **k.nxdi_kwargs}
        tnx_probe, _ = _call(fn, "tnx", {**BASE, **k.probe})
        nxdi_probe, probe_notes = _call(fn, "nxdi", {**BASE, **k.probe})
        tnx, tnx_notes = _call(fn, "tnx", tnx_kw)
        nxdi, notes = _call(fn, "nxdi", nxdi_kw)
        if k.tnx_keyword is not None:
            tnx_text = f"neuron_config.{k.tnx_keyword} (the notebooks' cells; not built by helpers.neuron)"
            derived = "nxdi_overrides (checked by neuron_settings); tnx side: the notebooks' cells"
        else:
            tnx_text = _fmt(_diff(tnx, tnx_probe)) if tnx is not None else f"{REFUSED}: {tnx_notes}"
            derived = "neuron_settings"
        if nxdi is None:
            nxdi_text, note_text = f"{REFUSED}: {notes}", ""
        else:
            nxdi_text = _fmt(_diff(nxdi, nxdi_probe))
            note_text = " | ".join(n for n in notes if n not in (probe_notes or []))
        rows.append(Row(k.setting, tnx_text, nxdi_text, note_text, k.used_in, derived))
    return rows


def _base_row(fn) -> Row:
    tnx, tnx_notes = _call(fn, "tnx", BASE)
    nxdi, notes = _call(fn, "nxdi", BASE)
    return Row(f"every model: {_fmt(BASE)}", _fmt(tnx) if tnx is not None else f"{REFUSED}: {tnx_notes}",
               _fmt(nxdi) if nxdi is not None else f"{REFUSED}: {notes}",
               " | ".join(notes) if nxdi is not None else "", "all", "neuron_settings")


def markdown_table(rows: list[Row]) -> str:
    """The rows as a Markdown table (for IPython.display.Markdown)."""
    def cell(s):
        return str(s).replace("|", "\\|").replace("\n", " ")
    head = "| transformers-neuronx 0.13 | keywords (tnx) | NxD Inference 0.8 NeuronConfig | notes | notebooks |"
    lines = [head, "|---|---|---|---|---|"]
    lines += [f"| `{cell(r.setting)}` | {cell(r.tnx)} | {cell(r.nxdi)} | {cell(r.notes)} | {cell(r.used_in)} |"
              for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ what each stack compiles
def nxdi_default_buckets(n_positions: int) -> tuple[list[int], list[int]]:
    """The buckets NxD Inference builds for a naive port, ``NeuronConfig(seq_len=n_positions,
    enable_bucketing=True)`` with no bucket lists (``generate_buckets(128, seq_len)`` for both)."""
    return NxDIBucketing().buckets(int(n_positions))


def bucket_plan(n_positions, context_length_estimate=None) -> dict:
    """Context and token buckets (hence compiled graphs) of: transformers-neuronx; NxD Inference with the bucket
    lists neuron_settings passes (the migrated settings); NxD Inference ported naively (seq_len only)."""
    tnx = _settings.neuron_settings("tnx", n_positions=n_positions, context_length_estimate=context_length_estimate)
    nx = _settings.neuron_settings("nxdi", n_positions=n_positions, context_length_estimate=context_length_estimate)
    tnx_tok = tnx_token_buckets(tnx.model_kwargs["n_positions"])
    tnx_ctx = tnx_context_buckets(tnx.model_kwargs["context_length_estimate"], tnx_tok)
    mig_ctx = list(nx.neuron_config.get("context_encoding_buckets") or [nx.neuron_config["max_context_length"]])
    mig_tok = list(nx.neuron_config["token_generation_buckets"])
    naive_ctx, naive_tok = nxdi_default_buckets(max(tnx_tok))
    out = {}
    for name, ctx, tok in (("tnx", tnx_ctx, tnx_tok), ("nxdi migrated", mig_ctx, mig_tok),
                           ("nxdi naive", naive_ctx, naive_tok)):
        out[name] = {"context_buckets": ctx, "token_buckets": tok, "graphs": len(ctx) + len(tok),
                     "longest_prompt": max(ctx) if ctx else 0}
    return out


def bucket_choice(buckets, lengths) -> list[dict]:
    """Which context bucket each prompt length runs in under each stack's rule (tnx: smallest >= length, else the
    largest and the rest token by token; NxD Inference: first bucket > length, the largest if equal, else refused)."""
    rows = []
    for n in lengths:
        try:
            nx = nxdi_select(list(buckets), int(n), "context_encoding_model")
        except ValueError as e:
            nx = f"refused: {e}"
        rows.append({"prompt_len": int(n), "tnx": tnx_find(list(buckets), int(n)), "nxdi": nx})
    return rows


def memory_plan(model, tp_degrees, batch_size: int = 1, n_positions: int = 2048, amp: str = "bf16",
                instance_type: str = "inf2.xlarge") -> list[dict]:
    """Bytes per NeuronCore each stack holds for the same settings, at its default GQA strategy and embedding
    placement (``helpers.planning.memory.plan``): weights, KV cache (and KV heads per core), the strategy chosen,
    or the stack's refusal;
    ``fits``: within the core's HBM less the runtime's reserve (``Plan.fits``)."""
    rows = []
    for tp in tp_degrees:
        for lib in ("tnx", "nxdi"):
            p = plan(model, tp, batch_size=batch_size, n_positions=n_positions, amp=amp, library=lib)
            rows.append({"model": p.model, "tp": tp, "library": lib, "strategy": p.strategy,
                         "kv_heads_per_core": p.kv_heads_per_core,
                         "weight_bytes": p.weight_bytes, "kv_bytes": p.kv_bytes, "total_bytes": p.total_bytes,
                         "embedding_bytes": p.breakdown.get("embedding", 0), "error": p.error,
                         "fits": p.fits(instance_type), "usable_bytes": p.usable_bytes(instance_type)})
    return rows


# ------------------------------------------------------------------------------ the oracle on the reference engine
# The NxD Inference keywords the reference engine can run with NxD Inference's bucket rules (NxDIBucketing), besides
# the ones every stack shares; anything else (int8, speculation, serving features) is refused rather than dropped.
_NXDI_TO_REFERENCE = {"batch_size", "seq_len", "tp_degree", "torch_dtype", "padding_side", "fused_qkv", "enable_bucketing",
                      "context_encoding_buckets", "token_generation_buckets", "max_context_length"}
_TORCH_DTYPE_TO_AMP = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def reference_nxdi_settings(nxdi_neuron_config: dict) -> dict:
    """``helpers.build_model`` keywords that run NxD Inference ``NeuronConfig`` keywords on the reference engine:
    ``seq_len`` as ``n_positions`` and the bucket keywords as ``nxdi_bucketing`` (NxD Inference's strict first-fit
    selection and its refusal of a prompt longer than the largest context bucket). The engine takes left-padded rows
    (the NxD Inference adapter re-pads them to the right, ``padding_side='right'``)."""
    extra = sorted(set(nxdi_neuron_config) - _NXDI_TO_REFERENCE)
    if extra:
        raise ValueError(f"{extra}: the reference engine runs only NxD Inference's shape and bucket keywords here")
    nc = nxdi_neuron_config
    bucketing = NxDIBucketing(enable_bucketing=nc.get("enable_bucketing", True),
                              context_encoding_buckets=nc.get("context_encoding_buckets"),
                              token_generation_buckets=nc.get("token_generation_buckets"),
                              max_context_length=nc.get("max_context_length"))
    return {"batch_size": nc.get("batch_size", 1), "n_positions": nc["seq_len"], "tp_degree": nc.get("tp_degree", 1),
            "amp": _TORCH_DTYPE_TO_AMP[nc.get("torch_dtype", "float32")],
            "neuron_config": NeuronConfig(fuse_qkv=bool(nc.get("fused_qkv", False))), "nxdi_bucketing": bucketing}


def greedy_agreement(new_tokens, reference_new_tokens, eos_ids=()) -> dict:
    """Row by row, how many leading new tokens equal the oracle's (compared up to the oracle's first EOS, which
    it includes, or its length). ``identical``: every compared token of every row agrees."""
    eos = set(int(e) for e in eos_ids)
    agree, compared = [], []
    for got, ref in zip(new_tokens, reference_new_tokens):
        ref = [int(t) for t in ref]
        n = next((i + 1 for i, t in enumerate(ref) if t in eos), len(ref))
        n = min(n, len(got))
        same = 0
        while same < n and int(got[same]) == ref[same]:
            same += 1
        agree.append(same)
        compared.append(n)
    return {"agree": agree, "compared": compared, "identical": agree == compared}
