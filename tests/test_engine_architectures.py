"""Llama and Mistral features on tiny random checkpoints, against transformers: GQA, RoPE scaling,
untied LM head, sliding-window attention, left padding."""
import pytest
import torch

import helpers
from tiny_models import write_tiny


def _compare(path, hf, batch, prompt_lens, new_tokens, n_positions=128):
    torch.manual_seed(1)
    L = max(prompt_lens)
    ids = torch.randint(3, 256, (batch, L))
    mask = torch.ones(batch, L, dtype=torch.long)
    for r, n in enumerate(prompt_lens):
        mask[r, : L - n] = 0
        ids[r, : L - n] = 0
    model = helpers.NeuronModel.from_pretrained(path, batch_size=batch, n_positions=n_positions).to_neuron()
    out = model.sample(ids, L + new_tokens, top_k=1, attention_mask=mask, eos_token_override=[], output_logits=True)
    with torch.inference_mode():
        ref = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                          eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    assert torch.equal(out, ref.sequences)
    assert (model.stats["logits"] - torch.stack(ref.logits, 1)).abs().max() < 1e-3


@pytest.mark.parametrize("overrides", [
    {},
    {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    {"num_key_value_heads": 4, "tie_word_embeddings": True},
], ids=["gqa", "llama3-rope", "mha-tied"])
def test_tiny_llama_matches_transformers(tmp_path, overrides):
    hf = write_tiny(tmp_path, "llama", **overrides)
    _compare(tmp_path, hf, batch=2, prompt_lens=[9, 5], new_tokens=20)


def test_tiny_mistral_sliding_window_matches_transformers(tmp_path):
    hf = write_tiny(tmp_path, "mistral", sliding_window=8)
    args = helpers.NeuronModel.from_pretrained(tmp_path, n_positions=128).args
    assert args.sliding_window == 8
    _compare(tmp_path, hf, batch=1, prompt_lens=[12], new_tokens=24)
