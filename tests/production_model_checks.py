"""Checks of ci/production_model.py shared by tests/test_production_model.py (transformers 5, the .venv) and
tests/contract/test_pinned_transformers.py (the lanes' pinned 4.47.1 / 4.57.1)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

import helpers

REPO = Path(__file__).resolve().parents[1]


def builder():
    """ci/production_model.py as a module."""
    spec = importlib.util.spec_from_file_location("production_model", REPO / "ci" / "production_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_production_shaped(props: dict) -> None:
    """The properties of Llama-3.1-8B-Instruct the lane's second model must have (``properties()``'s dict)."""
    assert props["pad_token"] is None and props["pad_token_id"] == [None, None], props
    assert props["tie_word_embeddings"] is False and props["untied_lm_head"], props
    assert props["rope_type"] == "llama3" and props["rope_theta"] == 500000.0, props
    assert props["rope_factors"] == [8.0, 1.0, 4.0, 8192], props
    assert len(props["eos_token_id"]) > 1 and props["eos_within_vocab"] and props["tokenizer_eos_in_list"], props
    assert props["heads_per_kv_head"] == 4 and props["head_dim"] % 16 == 0, props
    assert props["vocab_size"] == 49152, props


def assert_engine_matches_transformers(path, new_tokens: int = 12) -> None:
    """The reference engine's greedy tokens and logits equal transformers' on the checkpoint at ``path`` (batch 2,
    left-padded)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    torch.manual_seed(1)
    ids = torch.randint(3, min(1000, hf.config.vocab_size), (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    ids[1, :4] = 0
    model = helpers.NeuronModel.from_pretrained(path, batch_size=2, n_positions=64).to_neuron()
    out = model.sample(ids, 9 + new_tokens, top_k=1, attention_mask=mask, eos_token_override=[], output_logits=True)
    with torch.inference_mode():
        ref = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                          eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
                          temperature=None, top_p=None)
    assert torch.equal(out, ref.sequences), (out, ref.sequences)
    assert (model.stats["logits"] - torch.stack(ref.logits, 1)).abs().max() < 1e-3
