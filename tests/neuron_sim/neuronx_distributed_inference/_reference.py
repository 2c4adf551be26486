"""Stand-in only (no NxD Inference counterpart): where the stand-in's numbers come from.

Every forward of the stand-in NxDI model runs the repository's reference engine,
``helpers.NeuronModel``, built from the NxDI config: batch_size, ``max_length`` as its n_positions,
NxDI's own bucket lists (``modules/autobucketing.py``) with NxDI's strict first-fit selection
(``helpers.planning.buckets.NxDIBucketing``), ``torch_dtype`` as amp, int8 decoder projections when ``quantized``
(helpers.engine.quant, fed with the stand-in's quantized checkpoint) and a verification graph of
``speculation_length`` tokens when speculation is configured. It always computes at **tp_degree=1**,
whatever tp_degree the config asks for: nothing computed here is a Neuron measurement.

Layout: NxDI pads prompts on the right (``padding_side='right'``, its default) and stores a row's token of
position p at KV position p. The engine takes left-padded rows with ``start_ids``: row r's token of position p
sits at cache slot ``p + start_r``. A step whose attention_mask has M columns writes at slot M, and
``start_r = M - position_r`` maps each row's NxDI position onto it (M and every position advance together,
so the mapping is the same at every step).

int8 and the LM head, as published (the path a tied-embedding model such as SmolLM2 takes):

- the quantized checkpoint holds every nn.Linear of the HF model as int8 + scale, ``lm_head`` included: torch's
  ``quantize_dynamic`` for ``per_tensor_symmetric`` converts every Linear, ``per_channel_symmetric`` every Linear
  whose name contains no ``modules_to_not_convert`` entry (neuronx-distributed v2.28.0
  quantization/quantization_utils.py), and ``NeuronBaseForCausalLM.prepare_quantized_state_dict`` adds
  ``lm_head.weight`` / ``lm_head.scale`` (models/model_base.py ~3235 at cd3abf3);
- the model's ``lm_head`` is an int8 ``QuantizedColumnParallel`` unless a ``modules_to_not_convert`` entry is a
  substring of ``"lm_head"`` (``convert(...)`` in models/model_wrapper.py ~1521-1527; neuronx-distributed
  quantization/quantize.py ``_convert_initialized_float_to_initialized_quantized``);
- at load ``get_state_dict`` puts the float embedding into ``lm_head.weight`` when ``tie_word_embeddings``
  (models/application_base.py ~729, llama/modeling_llama.py ~1569), and ``ModelBuilder.cast_weights``
  (neuronx-distributed trace/model_builder.py ~786-800) casts every checkpoint tensor whose dtype differs from
  the parameter's with ``.to(param.dtype)`` and only a log warning: the float embedding becomes int8 by
  truncation (nearly all zeros), multiplied by the int8 head's scale. An int8 checkpoint head in a float
  ``lm_head`` is cast the other way, without its scale.

:func:`device_lm_head` computes that head; the engine then runs with it (an explicit, untied ``lm_head``).

Refused with ContractError, because the release computes wrong tokens there without a word:
``padding_side='left'`` (the first token comes from the context bucket's last, padded position), a left-padded
batch with ``padding_side='right'``, and a token-generation step whose mask already fills the largest bucket
(its KV would be written past the cache).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

import _neuron_contract as contract
from neuronx_distributed_inference._prefix_caching import PrefixCachingRuntime

QUANTIZED_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
AMP = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def _amp(dtype) -> str:
    if dtype not in AMP:
        raise NotImplementedError(f"stand-in: torch_dtype={dtype} has no reference-engine amp (use float32, "
                                  "bfloat16 or float16)")
    return AMP[dtype]


def _not_converted(neuron_config, name: str) -> bool:
    """neuronx-distributed's rule for a module name: kept in float when any ``modules_to_not_convert`` entry is a
    *substring* of it (quantize.py ``any(key in ".".join(prefixes) ...)``; quantization_utils.py
    ``_normalize_modules_to_not_convert_paths``: ``module in name``)."""
    return any(key in name for key in (neuron_config.modules_to_not_convert or []))


def lm_head_converted(neuron_config) -> bool:
    """The model's lm_head is an int8 QuantizedColumnParallel (model_wrapper.py convert(...))."""
    return bool(neuron_config.quantized) and not _not_converted(neuron_config, "lm_head")


def lm_head_quantized_in_checkpoint(neuron_config) -> bool:
    """generate_quantized_state_dict writes lm_head as int8 + scale: per_tensor_symmetric converts every Linear
    (modules_to_not_convert is not passed to it), per_channel_symmetric honours modules_to_not_convert."""
    if neuron_config.quantization_type == "per_tensor_symmetric":
        return True
    return not _not_converted(neuron_config, "lm_head")


def device_lm_head(neuron_config, state_dict: dict):
    """The LM head the device computes with after ``ModelBuilder.cast_weights`` (float, [vocab, hidden]), or None
    when it is the checkpoint's float head (or, tied, the embedding) unchanged."""
    w = state_dict.get("lm_head.weight")
    if w is None:
        return None
    if lm_head_converted(neuron_config):
        scale = state_dict.get("lm_head.scale")
        if scale is None:
            raise NotImplementedError("stand-in: an int8 lm_head with no lm_head.scale in the checkpoint")
        q = w if w.dtype == torch.int8 else w.to(torch.int8)  # cast_weights: truncation, no scaling
        scale = scale.float()
        return q.float() * (scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(()))
    if w.dtype == torch.int8:
        return w.to(torch.float32)  # cast_weights into the float head: the int8 values, without their scale
    return None


def _quant_config(neuron_config, path=None, n_layers: int = 0):
    from helpers.engine.quant import QuantizationConfig

    if str(neuron_config.quantization_dtype).lower() != "int8":
        raise NotImplementedError(f"stand-in: quantization_dtype={neuron_config.quantization_dtype!r}: the "
                                  "reference engine stores int8 only")
    layers = []
    for name in neuron_config.modules_to_not_convert or []:
        parts = name.split(".")
        if name == "lm_head":
            continue  # device_lm_head
        if len(parts) == 2 and parts[0] == "layers" and parts[1].isdigit():
            if neuron_config.quantization_type == "per_tensor_symmetric":
                raise NotImplementedError(
                    f"stand-in: modules_to_not_convert={name!r} with per_tensor_symmetric: the release's checkpoint "
                    "quantizes those layers anyway and cast_weights would load their int8 values into float layers "
                    "without their scales (not emulated)")
            # a substring: 'layers.1' keeps layers 1 and 10-19 in float (the model's names are layers.<i>.<...>)
            layers += [f"model.layers.{i}" for i in range(n_layers) if name in f"layers.{i}."]
        else:
            raise NotImplementedError(f"stand-in: modules_to_not_convert entry {name!r}: the reference engine "
                                      "can keep whole layers ('layers.N') or lm_head unquantized, nothing finer")
    return QuantizationConfig(quant_dtype="s8", dequant_dtype=_amp(neuron_config.torch_dtype),
                              quantize_method=neuron_config.quantization_type, no_quantize_list=layers,
                              quantized_checkpoints_path=path)


def quantize_state_dict(model_path: str, config) -> dict:
    """The NxDI-named quantized state dict: ``layers.N.<proj>.weight`` int8 + ``.scale`` f32 for the decoder
    projections, every other tensor as in the checkpoint (``model.`` prefix stripped)."""
    from helpers.model_store import load_state_dict
    from helpers.engine.quant import quantize_tensor

    quant = _quant_config(config.neuron_config, n_layers=config.num_hidden_layers)
    state = load_state_dict(model_path)
    if lm_head_quantized_in_checkpoint(config.neuron_config):
        # The HF model's lm_head (the embedding itself when tied) is an nn.Linear: quantized with the rest.
        head = state.get("lm_head.weight", state.get("model.embed_tokens.weight"))
        q, scale = quantize_tensor(head, quant)
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
        state["lm_head.weight"], state["lm_head.scale"] = q.contiguous(), scale
    else:  # prepare_quantized_state_dict writes lm_head's state dict either way (the tied tensor when tied)
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    out = {}
    for name, t in state.items():
        key = name[len("model."):] if name.startswith("model.") else name
        parts = key.split(".")
        proj = ".".join(parts[2:4]) if len(parts) == 5 and parts[0] == "layers" else None
        if proj in QUANTIZED_PROJECTIONS and parts[4] == "weight" and \
                proj in quant.quantized_names(int(parts[1])):
            q, scale = quantize_tensor(t, quant)
            out[key] = q.contiguous()
            out[key[:-len("weight")] + "scale"] = scale
        else:
            out[key] = t
    return out


class ReferenceRuntime:
    """The reference engine behind one NeuronBaseForCausalLM (built at ``load``)."""

    def __init__(self, app, state_dict: dict | None = None, quantized_state_dict: dict | None = None):
        """``state_dict``: every weight (presharded files): the engine reads a checkpoint written from it.
        ``quantized_state_dict``: the quantized checkpoint: its int8 projections replace the engine's, the other
        tensors are read from the original checkpoint (the same values the quantized checkpoint copied)."""
        from helpers.planning.buckets import NxDIBucketing
        from helpers.engine.config import NeuronConfig as EngineConfig
        from helpers import NeuronModel

        from neuronx_distributed_inference.modules import autobucketing

        nc = app.neuron_config
        self.padding_side = nc.padding_side
        self._tmp = tempfile.TemporaryDirectory(prefix="nxdi-stand-in-")
        model_path, quant_file = app.model_path, None
        loaded = state_dict if state_dict is not None else quantized_state_dict
        head = device_lm_head(nc, loaded) if loaded is not None else None
        if head is not None:  # the LM head cast_weights leaves (see the module docstring): an explicit lm_head
            state_dict = {k: v for k, v in loaded.items() if k not in ("lm_head.weight", "lm_head.scale")}
            state_dict["lm_head.weight"] = head
        if state_dict is not None:
            model_path, quant_file = self._write_checkpoint(app, state_dict, untied=head is not None)
        elif quantized_state_dict is not None:
            quant_file = self._write_quant_file(app, {k: v for k, v in quantized_state_dict.items()
                                                      if v.dtype == torch.int8 or k.endswith(".scale")})
        quant = _quant_config(nc, quant_file, app.config.num_hidden_layers) if nc.quantized else None
        if nc.is_prefix_caching:  # the engine only lends its weights to the block KV cache (_prefix_caching.py)
            ctx, tkg = [nc.max_context_length], [nc.max_length]
        else:
            ctx = list(autobucketing.generate_buckets_for_cte(app.config))
            tkg = list(autobucketing.generate_buckets_for_speculation(app.config))  # = the token-generation rule
        bucketing = NxDIBucketing(enable_bucketing=True, context_encoding_buckets=ctx, token_generation_buckets=tkg,
                                  max_context_length=nc.max_context_length,
                                  allow_input_truncation=nc.allow_input_truncation)
        self.engine = (self._engine_class() or NeuronModel).from_pretrained(
            model_path, batch_size=self._engine_batch_size(nc), n_positions=nc.max_length, tp_degree=1, amp=_amp(nc.torch_dtype),
            neuron_config=EngineConfig(quant=quant), nxdi_bucketing=bucketing)
        self.speculation_length = nc.speculation_length
        if nc.speculation_length > 1:  # the engine's graph takes k + 1 tokens; NxDI's speculation model takes k
            self.engine.enable_speculative_decoder(nc.speculation_length - 1)
        self.engine.to_neuron()
        self.largest_slot = self.engine.n_positions
        self.prefix = PrefixCachingRuntime(app, self.engine) if nc.is_prefix_caching else None

    def _engine_class(self):
        """The reference engine class (None: helpers.NeuronModel); continuous batching uses KV-cache slots."""
        return None

    def _engine_batch_size(self, nc) -> int:
        return nc.batch_size

    def _write_checkpoint(self, app, sd: dict, untied: bool = False):
        """A state dict (NxDI names) -> a checkpoint directory the engine reads (+ its int8 projections file).
        ``untied``: ``lm_head.weight`` is the head the device computes with (device_lm_head), not the embedding."""
        from safetensors.torch import save_file

        d = Path(self._tmp.name)
        cfg = json.loads((Path(app.model_path) / "config.json").read_text())
        if untied:
            cfg["tie_word_embeddings"] = False
        (d / "config.json").write_text(json.dumps(cfg))
        floats, int8 = {}, {}
        for k, v in sd.items():
            if k.endswith(".scale"):
                continue
            scale = sd.get(k[:-len("weight")] + "scale") if k.endswith(".weight") else None
            if v.dtype == torch.int8:
                int8[k] = v
                if scale is not None:
                    int8[k[:-len("weight")] + "scale"] = scale
                v = v.float() * (scale.float()[:, None] if scale is not None and scale.numel() > 1 else
                                 (scale.float() if scale is not None else 1.0))
            name = k if k.startswith("lm_head") else "model." + k
            floats[name] = v.contiguous()
        if cfg.get("tie_word_embeddings"):
            floats.pop("lm_head.weight", None)
        save_file(floats, str(d / "model.safetensors"))
        return str(d), (self._write_quant_file(app, int8) if int8 else None)

    def _write_quant_file(self, app, int8: dict) -> str:
        """helpers.engine.quant's checkpoint format (``layers.N.<proj>.weight`` int8 + ``.scale``: NxDI's names)."""
        from safetensors.torch import save_file

        from helpers.engine.quant import _meta

        if not app.neuron_config.quantized:
            raise NotImplementedError("stand-in: int8 weights in a config with quantized=False")
        f = Path(self._tmp.name) / "quantized" / "model.safetensors"
        f.parent.mkdir(exist_ok=True)
        meta = {"format": "pt", "quantization": json.dumps(_meta(_quant_config(app.neuron_config, None,
                                                                               app.config.num_hidden_layers)))}
        save_file({k: v.contiguous() for k, v in int8.items()}, str(f), metadata=meta)
        return str(f)

    # -- the three NxDI graphs, on the engine -----------------------------------------------------------
    @staticmethod
    def _check_right_padded(attention_mask):
        am = attention_mask.long()
        if bool((am[:, 1:] > am[:, :-1]).any()):
            raise contract.ContractError(
                "left-padded attention_mask but NeuronConfig(padding_side='right') (the NxDI default): NxD Inference "
                "0.8 then lets the prompt attend to the pads (a causal mask only, models/model_base.py "
                "_create_context_attn_mask) and writes the first generated tokens over the prompt's KV entries: "
                "wrong tokens, silently. Pad on the right (tokenizer.padding_side = 'right').")

    def context_encoding(self, input_ids, attention_mask, position_ids):
        """[B, L] right-padded prompt -> logits [B, 1, V] of each row's last real token."""
        if self.padding_side != "right":
            raise contract.ContractError(
                f"padding_side={self.padding_side!r}: NxD Inference 0.8 pads every context-encoding input on the "
                "right up to its bucket (models/model_wrapper.py pad_inputs) and, unless padding_side is 'right', "
                "takes the first new token from the bucket's last position (models/model_base.py "
                "NeuronBaseModel.forward: index = hidden_states.shape[1] - 1), a pad token whenever the prompt is "
                "shorter than the bucket; token generation then rolls the KV cache left by one slot per step "
                "(modules/kvcache/kv_cache_manager.py update_kv_by_layer_id) while the adapter's attention mask "
                "only lines up with it when prompt, bucket and seq_len are one length. Wrong tokens, silently. Use "
                "padding_side='right' (the default) and pad the prompts on the right (tokenizer.padding_side = "
                "'right').")
        self._check_right_padded(attention_mask)
        B, L = input_ids.shape
        n = attention_mask.long().sum(dim=1)
        ids = torch.zeros_like(input_ids)
        for r in range(B):
            k = int(n[r])
            if k and not torch.equal(position_ids[r, :k].long(), torch.arange(k)):
                raise NotImplementedError("stand-in: position_ids that do not start at 0 (input_start_offsets) "
                                          "are not emulated by the reference engine")
            ids[r, L - k:] = input_ids[r, :k]
        logits = self.engine.forward(ids.long(), cache_ids=None, start_ids=(L - n).long())
        return logits[:, None, :].clone()

    def _starts(self, attention_mask, position_ids):
        M = attention_mask.shape[1]
        start = M - position_ids[:, 0].long()
        if bool((start < 0).any()):
            raise NotImplementedError("stand-in: a position beyond the attention mask (input_start_offsets) is not "
                                      "emulated by the reference engine")
        return M, start

    def token_generation(self, input_ids, attention_mask, position_ids):
        M, start = self._starts(attention_mask, position_ids)
        if M >= self.largest_slot:
            raise contract.ContractError(
                f"token generation with an attention_mask of {M} columns: NxD Inference 0.8 selects the largest "
                f"bucket ({self.largest_slot}) for it (first_fit accepts equality) and writes the new token's KV at "
                f"position {M}, outside the cache of seq_len={self.largest_slot} positions (undefined on device). "
                "Keep max_length <= seq_len + 1.")
        logits = self.engine.forward(input_ids.long(), cache_ids=torch.tensor([M]), start_ids=start)
        return logits[:, None, :].clone()

    def speculation(self, input_ids, attention_mask, position_ids):
        M, start = self._starts(attention_mask, position_ids)
        k = input_ids.shape[1]
        if k == 1:
            return self.token_generation(input_ids, attention_mask, position_ids)
        logits = self.engine.speculative_forward(input_ids.long(), cache_ids=torch.arange(M, M + k), start_ids=start)
        return logits.clone()
