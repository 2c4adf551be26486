"""The reference engine against Hugging Face transformers on the same checkpoint (the oracle).

Tolerance: in f32 the engine's logits stay within 1e-3 (absolute) of transformers' at every
generated step (measured ~3e-5); greedy output is token-identical for 128 new tokens.
"""
import pytest
import torch

import helpers
from helpers.prompts import encode_prompts

LOGITS_ATOL = 1e-3
BF16_REL_TOL = 0.05  # bf16 logits against f32's, relative to the largest |logit| (test_bf16_runs_and_tracks_f32)
NEW_TOKENS = 128
PROMPTS = ["Explain how a rainbow forms.", "Write a short story about a robot who learns to paint, in three paragraphs."]


def _engine(batch_size, **kw):
    return helpers.NeuronModel.from_pretrained(None, batch_size=batch_size, n_positions=256, **kw).to_neuron()


@pytest.mark.parametrize("batch_size,prompts", [(1, PROMPTS[:1]), (2, PROMPTS)], ids=["batch1", "batch2-left-padded"])
def test_greedy_128_tokens_identical_to_hf_generate(batch_size, prompts, tokenizer, hf_model):
    enc = encode_prompts(tokenizer, prompts, batch_size)
    L = enc.input_ids.shape[1]
    if batch_size == 2:
        assert (enc.attention_mask == 0).any(), "the test needs prompts of different lengths"
    model = _engine(batch_size)
    out = model.sample(enc.input_ids, L + NEW_TOKENS, top_k=1, attention_mask=enc.attention_mask,
                       eos_token_override=[], output_logits=True)
    with torch.inference_mode():
        ref = hf_model.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                                pad_token_id=tokenizer.pad_token_id, output_logits=True,
                                return_dict_in_generate=True, top_k=None, top_p=None, temperature=None)
    assert out.shape == ref.sequences.shape
    assert torch.equal(out, ref.sequences)
    ref_logits = torch.stack(ref.logits, dim=1)
    diff = (model.stats["logits"] - ref_logits).abs().max().item()
    assert diff < LOGITS_ATOL, f"max |logit diff| {diff}"


def test_prompt_longer_than_context_bucket_continues_token_by_token(tokenizer):
    """transformers-neuronx behaviour: encode up to the largest context bucket, then one token at a time."""
    enc = encode_prompts(tokenizer, PROMPTS[1:], 1)
    L = enc.input_ids.shape[1]
    small = helpers.NeuronModel.from_pretrained(None, n_positions=256, context_length_estimate=16).to_neuron()
    assert small.context_buckets == [16] and L > 16
    full = _engine(1)
    a = small.sample(enc.input_ids, L + 16, top_k=1)
    b = full.sample(enc.input_ids, L + 16, top_k=1)
    assert torch.equal(a, b)


def test_sampling_is_reproducible_with_a_seeded_generator(tokenizer):
    enc = encode_prompts(tokenizer, PROMPTS[:1], 1)
    L = enc.input_ids.shape[1]
    model = _engine(1)
    run = lambda seed: model.sample(enc.input_ids, L + 24, top_k=50, top_p=0.9, temperature=0.8,  # noqa: E731
                                    generator=torch.Generator().manual_seed(seed))
    assert torch.equal(run(1), run(1))
    assert not torch.equal(run(1), run(2))


def test_bf16_runs_and_tracks_f32(tokenizer):
    """bf16 tracks f32 within what bf16's rounding allows, not token for token.

    bf16 keeps 8 significant bits (a relative step of 2**-8 per rounding), accumulated over 30 layers: on a
    2-core AMD EPYC the last-position logits differed from f32's by up to 1.4-1.6% of the largest |logit|
    (0.43 on logits up to 30.6), while f32's two best tokens for this prompt are 0.05 apart. Which of the two
    bf16 picks depends on the CPU's bf16 kernels (AVX-512 BF16 / AMX round in other orders), so the test bounds
    the difference (BF16_REL_TOL, 3x the measured one) instead of asserting the same next token."""
    enc = encode_prompts(tokenizer, PROMPTS[:1], 1)
    model = _engine(1, amp="bf16")
    logits = model.forward(enc.input_ids)
    ref = _engine(1).forward(enc.input_ids)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    err = (logits - ref).abs().max().item()
    assert 0 < err <= BF16_REL_TOL * ref.abs().max().item(), err  # 0: bf16 would not have run at all
    assert model.weight_bytes * 2 == _engine(1).weight_bytes
