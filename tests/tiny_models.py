"""Tiny random Llama/Mistral checkpoints written with transformers itself, for architecture tests."""
from __future__ import annotations

import torch


def write_tiny(path, model_type: str = "llama", **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    base.update(overrides)
    cfg_cls, model_cls = (MistralConfig, MistralForCausalLM) if model_type == "mistral" else (LlamaConfig, LlamaForCausalLM)
    torch.manual_seed(0)
    model = model_cls(cfg_cls(**base)).eval()
    with torch.no_grad():  # larger weights than the init so logits are far from ties
        for p in model.parameters():
            p.mul_(8.0) if p.dim() > 1 else None
    model.save_pretrained(path)
    return model
