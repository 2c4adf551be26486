"""neuronx_distributed_inference/utils/hf_adapter.py (0.8.0): load_pretrained_config and the HF adapter.

``HuggingFaceGenerationAdapter.generate`` is Hugging Face ``generate`` (transformers 4.57) with NxDI's
``_sample``: HF ``generate`` puts the prompt into a streamer once; NxDI's ``_sample`` never puts a
token and never calls ``end()``; stopping criteria are called as ``criteria(ids_so_far, None)``.
"""
import inspect
import json
import os

import torch
from transformers import GenerationConfig

import _neuron_contract as contract
from neuronx_distributed_inference.models.config import to_torch_dtype

# transformers 4.57 GenerationMixin.generate(...) named parameters.
GENERATE_PARAMS = ("inputs", "generation_config", "logits_processor", "stopping_criteria",
                   "prefix_allowed_tokens_fn", "synced_gpus", "assistant_model", "streamer", "negative_prompt_ids",
                   "negative_prompt_attention_mask", "use_model_defaults", "custom_generate")
MODEL_KWARGS = ("attention_mask", "input_capture_hook", "sampling_params", "adapter_ids")


def load_pretrained_config(model_path_or_name=None, hf_config=None):
    def load_config(self):
        if (model_path_or_name is None) == (hf_config is None):
            raise ValueError('Please provide only one of "model_path_or_name" or "hf_config"')
        if model_path_or_name is not None:
            with open(os.path.join(model_path_or_name, "config.json")) as fh:
                config_dict = json.load(fh)
        else:
            config_dict = hf_config.to_dict()
        if "rope_parameters" in config_dict and "rope_theta" not in config_dict:
            raise contract.ContractError(
                "config.json has rope_parameters but no rope_theta (a transformers-5 checkpoint): transformers 4.57 "
                "(pinned by NxD Inference 0.8) reads rope_theta. Use helpers.neuron.neuron_model_dir().")
        hf_dtype = config_dict.pop("dtype", config_dict.pop("torch_dtype", None))
        if hf_dtype is not None and not self.neuron_config.overrides_torch_dtype:
            self.neuron_config.torch_dtype = to_torch_dtype(hf_dtype) if isinstance(hf_dtype, str) else hf_dtype
        self.__dict__.update(config_dict)
    return load_config


class HuggingFaceGenerationAdapter:
    def __init__(self, model, input_start_offsets=None, capture_draft_logits=False):
        self.neuron_model = model
        self.neuron_config = model.config.neuron_config
        self.config = model.config
        self.generation_config = GenerationConfig()
        contract.record("nxdi.HuggingFaceGenerationAdapter")

    def generate(self, *args, **kwargs):
        bound = inspect.signature(_generate_signature).bind(*args, **kwargs)
        extra = bound.arguments.pop("kwargs", {})
        known = set(MODEL_KWARGS) | set(GenerationConfig().to_dict())
        contract.refuse_unknown("HuggingFaceGenerationAdapter.generate", extra, known,
                                "fails or ignores it in Hugging Face generate")
        if not self.neuron_model.is_loaded_to_neuron:
            raise contract.ContractError("generate() before model.load(compiled_path): the model is not on Neuron")
        args = bound.arguments
        given = args.get("generation_config")
        if given is not None:
            # Hugging Face GenerationConfig(**kwargs) keeps unknown keywords as plain attributes: a typo
            # there (max_lenght=...) is silently ignored by generate.
            contract.refuse_unknown("GenerationConfig", given.to_dict(), set(GenerationConfig().to_dict()),
                                    "keeps unknown GenerationConfig keywords as unused attributes")
        input_ids = args["inputs"]
        cfg = GenerationConfig(**{**(args.get("generation_config") or GenerationConfig()).to_dict(),
                                  **{k: v for k, v in extra.items() if k not in MODEL_KWARGS}})
        mask = extra.get("attention_mask")
        mask = torch.ones_like(input_ids) if mask is None else mask
        if self.neuron_config.padding_side == "right" and bool((mask[:, 1:] > mask[:, :-1]).any()):
            raise contract.ContractError("left-padded attention_mask but NeuronConfig(padding_side='right') (the NxDI "
                                         "default): pad on the right or set padding_side='left'")
        if self.neuron_config.padding_side == "left" and bool((mask[:, 1:] < mask[:, :-1]).any()):
            raise contract.ContractError("right-padded attention_mask but NeuronConfig(padding_side='left')")
        batch, length = input_ids.shape
        if batch != self.neuron_config.batch_size:
            raise ValueError(f"Input batch_size={batch} exceeds the compiled batch_size={self.neuron_config.batch_size}")
        assistant = args.get("assistant_model")
        if assistant is not None and not self.neuron_config.speculation_length:
            raise contract.ContractError("assistant_model needs a target compiled with speculation_length > 0")
        max_length = cfg.max_length if cfg.max_length is not None else length + (cfg.max_new_tokens or 20)
        if max_length > self.neuron_config.seq_len:
            raise ValueError(f"max_length={max_length} exceeds the compiled seq_len={self.neuron_config.seq_len}")
        contract.record("nxdi.generate", max_length=max_length, do_sample=cfg.do_sample)
        streamer = args.get("streamer")
        if streamer is not None:
            streamer.put(input_ids.cpu())  # Hugging Face generate; NxDI's _sample never puts or ends
        criteria = args.get("stopping_criteria")
        eos = cfg.eos_token_id
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        ids, done = input_ids, torch.zeros(batch, dtype=torch.bool)
        while ids.shape[1] < max_length and not bool(done.all()):
            tok = torch.full((batch, 1), 100 + (ids.shape[1] - length) % 1000, dtype=torch.long)
            tok[done] = cfg.pad_token_id if cfg.pad_token_id is not None else 0
            ids = torch.cat([ids, tok], dim=1)
            done |= torch.isin(tok[:, 0], torch.tensor(eos, dtype=torch.long))
            if criteria is not None:
                for c in criteria:
                    done |= torch.as_tensor(c(ids, None), dtype=torch.bool).reshape(-1).expand(batch)
        return ids


def _generate_signature(inputs=None, generation_config=None, logits_processor=None, stopping_criteria=None,
                        prefix_allowed_tokens_fn=None, synced_gpus=None, assistant_model=None, streamer=None,
                        negative_prompt_ids=None, negative_prompt_attention_mask=None, use_model_defaults=None,
                        custom_generate=None, **kwargs):
    pass
