"""transformers_neuronx/sampling.py (v0.13.0): the calling convention of the CPU sampling loop.

The stand-in emits deterministic tokens (no model), but calls the streamer and the stopping
criteria exactly as ``sample_loop_llama`` does: ``streamer.put(token)`` with a [batch, 1] tensor per
step (never the prompt), ``stopping_criteria_list(input_ids, probs)`` with the *prompt* ids and
truthiness-tested, ``streamer.end()`` once after the loop.
"""
import torch

from transformers_neuronx.stopping_criteria import StoppingCriteriaList


def validate_top_k_top_p_min_tokens_to_keep(top_k, top_p, min_tokens_to_keep):
    if top_k is not None and (not isinstance(top_k, int) or not (top_k > 0)):
        raise ValueError('top_k has to be a strictly positive int.')
    if top_p is not None and (not isinstance(top_p, float) or not (0.0 < top_p <= 1.0)):
        raise ValueError('top_p has to be a strictly positive float that less than or equal to 1.0.')


@torch.no_grad()
def sample_llama(model, input_ids, start_ids, sequence_length, eos_token_id=2, top_k=50, top_p=1.0,
                 temperature=1.0, streamer=None, stopping_criteria_list=None, no_repeat_ngram_size=None,
                 cache_ids=None):
    validate_top_k_top_p_min_tokens_to_keep(top_k, top_p, None)
    if not isinstance(temperature, float) or not (temperature > 0):
        raise ValueError('temperature has to be a strictly positive float.')
    stopping_criteria_list = stopping_criteria_list if stopping_criteria_list is not None else StoppingCriteriaList()
    eos = torch.tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id])
    batch, start_length = input_ids.shape
    done = torch.zeros(batch, 1, dtype=torch.bool)
    tokens = [input_ids]
    for current_length in range(start_length, sequence_length):
        token = torch.full((batch, 1), 100 + (current_length - start_length) % 1000, dtype=torch.long)
        token = torch.where(done, eos[0], token)
        tokens.append(token)
        done = done | torch.isin(token, eos)
        if streamer:
            streamer.put(token)
        if current_length + 1 >= sequence_length or done.all():
            break
        probs = torch.full((batch, top_k), 1.0 / top_k)
        if stopping_criteria_list(input_ids, probs):
            break
    if streamer:
        streamer.end()
    return torch.cat(tokens, dim=-1)
