"""Deploy step: the notebook's settings as a DJL LMI ``serving.properties`` for transformers-neuronx.

Follows "Transformers-NeuronX Engine in LMI" (the DJL / SageMaker LMI guide,
https://docs.djl.ai/docs/serving/serving/docs/lmi/user_guides/tnx_user_guide.html): the Quick Start template (engine, model_id,
entryPoint, rolling_batch, tensor_parallel_degree, max_rolling_batch_size, model_loading_timeout),
``option.quantize=static_int8`` and the "Advanced Transformers NeuronX Configurations" table
(n_positions, context_length_estimate, group_query_attention, ...). Settings with no option there
are refused, with the fix, instead of being dropped.

Loading compiled artifacts ("Model Artifacts Structure": "split-models with a separate `neff` cache (compiled
models must be compiled with the same Neuron compiler version and model settings)"):

- ``option.compiled_graph_path``: "an s3 URI, or a local directory that stores the pre-compiled graph for your
  model (NEFF cache) to skip runtime compilation". LMI calls transformers-neuronx's ``load(path)`` before
  ``to_neuron()`` (djl-serving ``djl_python/neuron_utils/model_loader.py``), so the directory is what
  ``model.save(dir)`` writes, and its NEFFs match only the graphs LMI builds itself: the same batch size,
  buckets, tp degree, amp and compiler; with ``rolling_batch=auto`` LMI compiles continuous-batching graphs.
- ``option.load_split_model``: "Toggle to True when using model artifacts that have already been split for neuron
  compilation/loading": ``model_id`` then is such a checkpoint and LMI skips splitting it again.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..neuron.runtime import FAMILIES
from ..neuron.settings import TNX_GQA_VALUES
from ..planning.memory import PLATFORM_TP_DEGREES

ENTRY_POINT = "djl_python.transformers_neuronx"
# Quick Start template keys and the quantization key of the guide.
TEMPLATE_OPTIONS = ("model_id", "entryPoint", "rolling_batch", "tensor_parallel_degree",
                    "max_rolling_batch_size", "model_loading_timeout", "quantize")
# The guide's "Advanced Transformers NeuronX Configurations" table (option.<name>).
ADVANCED_OPTIONS = ("n_positions", "load_in_8bit", "unroll", "neuron_optimize_level", "context_length_estimate",
                    "low_cpu_mem_usage", "load_split_model", "compiled_graph_path", "group_query_attention",
                    "enable_mixed_precision_accumulation")
# Environment-variable names the guide gives for the template keys; other options are OPTION_<NAME>.
ENV_NAMES = {"model_id": "HF_MODEL_ID", "tensor_parallel_degree": "TENSOR_PARALLEL_DEGREE",
             "entryPoint": "OPTION_ENTRYPOINT"}
VALID_TP = {family: PLATFORM_TP_DEGREES[family] for family in FAMILIES}  # the transformers-neuronx engine's families


@dataclass
class LMIConfig:
    options: dict                 # option name -> value (without the "option." prefix)
    engine: str = "Python"
    notes: list[str] = field(default_factory=list)

    def serving_properties(self) -> str:
        lines = [f"engine={self.engine}"]
        lines += [f"option.{k}={_fmt(v)}" for k, v in self.options.items()]
        return "\n".join(lines) + "\n"

    def env(self) -> dict[str, str]:
        """The same configuration as container environment variables."""
        return {ENV_NAMES.get(k, f"OPTION_{k.upper()}"): _fmt(v) for k, v in self.options.items()}

    def write(self, directory) -> Path:
        path = Path(directory) / "serving.properties"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.serving_properties())
        return path


def _fmt(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def lmi_config(model_id: str, *, tp_degree: int, n_positions, batch_size: int = 1, context_length_estimate=None,
               neuron_config=None, amp: str | None = None, model_loading_timeout: int = 1600,
               instance: str = "inf2", rolling_batch: str = "auto", compiled_graph_path: str | None = None,
               load_split_model: bool = False) -> LMIConfig:
    """Map the notebook's settings (the reference engine's names) to LMI options; refuse the rest.

    ``amp``: the guide has no dtype option for this engine, so only ``None`` is accepted (say so
    explicitly). ``neuron_config``: ``group_query_attention`` and ``quant`` (int8 weights ->
    ``quantize=static_int8``) are exported; ``on_device_embedding`` cannot be; ``fuse_qkv`` and
    ``compiled`` are build details with no LMI option (listed in ``notes``). ``compiled_graph_path``: the
    directory (or s3 URI) of NEFFs saved with ``model.save(dir)``; ``load_split_model``: ``model_id`` is an
    already split checkpoint (see the module docstring).
    """
    if not isinstance(model_id, str) or not model_id.strip():
        raise ValueError("model_id: a Hugging Face model id, an s3:// URL or a local folder")
    if amp is not None:
        raise ValueError(f"amp={amp!r}: the LMI transformers-neuronx options have no dtype setting; pass amp=None "
                         "and let LMI choose, or deploy with a different engine configuration")
    if instance not in VALID_TP:
        raise ValueError(f"instance={instance!r}: use one of {sorted(VALID_TP)}")
    if int(tp_degree) not in VALID_TP[instance]:
        raise ValueError(f"tensor_parallel_degree={tp_degree}: valid on {instance} are {VALID_TP[instance]}")
    if isinstance(n_positions, (list, tuple)):
        raise ValueError(f"n_positions={list(n_positions)}: LMI's option.n_positions is one total length; pass "
                         f"n_positions={max(n_positions)} (buckets below it are generated by transformers-neuronx)")
    if int(n_positions) < 1 or int(batch_size) < 1 or int(model_loading_timeout) < 1:
        raise ValueError("n_positions, batch_size and model_loading_timeout must be positive")
    if rolling_batch not in ("auto", "disable"):
        raise ValueError(f"rolling_batch={rolling_batch!r}: use 'auto' (continuous batching) or 'disable'")
    options = {"model_id": model_id, "entryPoint": ENTRY_POINT, "rolling_batch": rolling_batch,
               "tensor_parallel_degree": int(tp_degree), "max_rolling_batch_size": int(batch_size),
               "model_loading_timeout": int(model_loading_timeout), "n_positions": int(n_positions)}
    notes: list[str] = []
    _engine_options(options, n_positions, context_length_estimate, neuron_config)
    if compiled_graph_path is not None:
        if not isinstance(compiled_graph_path, str) or not compiled_graph_path.strip():
            raise ValueError("compiled_graph_path: an s3:// URI or a local folder holding the NEFFs model.save(dir) wrote")
        options["compiled_graph_path"] = compiled_graph_path
        notes.append("compiled_graph_path: LMI calls load(path) before to_neuron(); its NEFFs must come from the same "
                     "settings LMI builds with (batch, buckets, tp degree, amp, neuronx-cc version"
                     + (", and continuous batching: rolling_batch='auto' compiles other graphs than a plain "
                        "LlamaForSampling)" if rolling_batch != "disable" else ")") + ", else LMI compiles again")
    if load_split_model:
        options["load_split_model"] = True
    for name in ("fuse_qkv", "compiled"):
        if getattr(neuron_config, name, False):
            notes.append(f"neuron_config.{name} is a build detail with no LMI option: not exported")
    unknown = [k for k in options if k not in TEMPLATE_OPTIONS + ADVANCED_OPTIONS]
    assert not unknown, unknown
    return LMIConfig(options, notes=notes)


def _engine_options(options: dict, n_positions, context_length_estimate, neuron_config) -> None:
    """Add the context buckets, GQA strategy and int8 setting to ``options``; refuse what LMI cannot express."""
    if context_length_estimate is not None:
        cle = [int(c) for c in (context_length_estimate if isinstance(context_length_estimate, (list, tuple))
                                else [context_length_estimate])]
        if any(c < 1 for c in cle):
            raise ValueError("context_length_estimate <= 0 (no context encoding) has no LMI equivalent")
        if max(cle) > int(n_positions):
            raise ValueError(f"context_length_estimate {max(cle)} > n_positions {n_positions}: transformers-neuronx "
                             "asserts max context_length_estimate <= max n_positions")
        options["context_length_estimate"] = sorted(cle)
    nc = neuron_config
    gqa = getattr(nc, "group_query_attention", None)
    gqa = getattr(gqa, "value", gqa)
    if gqa is not None:
        if gqa not in TNX_GQA_VALUES:
            raise ValueError(f"group_query_attention={gqa!r}: use one of {TNX_GQA_VALUES}")
        options["group_query_attention"] = gqa
    quant = getattr(nc, "quant", None)
    if quant is not None:
        qd = quant if isinstance(quant, str) else (quant.get("quant_dtype", "s8") if isinstance(quant, dict)
                                                   else getattr(quant, "quant_dtype", "s8"))
        method = (quant.get("quantize_method", "vector_dynamic") if isinstance(quant, dict)
                  else getattr(quant, "quantize_method", "vector_dynamic"))
        if qd != "s8" or method != "vector_dynamic":
            raise ValueError(f"quant_dtype={qd!r}, quantize_method={method!r}: LMI offers only quantize=static_int8 "
                             "(int8 weights, transformers-neuronx's default vector_dynamic scales)")
        options["quantize"] = "static_int8"
    if getattr(nc, "on_device_embedding", False):
        raise ValueError("on_device_embedding=True has no LMI option: drop it for the LMI deployment (so LMI cannot "
                         "load presharded weights saved with save(dir, sharded_weights=True); point model_id at the "
                         "checkpoint and compiled_graph_path at NEFFs saved without on_device_embedding)")
