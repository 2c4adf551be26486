"""transformers_neuronx/speculation.py (v0.13.0): SpeculativeGenerator's calling convention.

``sample`` puts the *prompt* first, then the first target token [B, 1], then [B, k] blocks of
accepted tokens (zero-padded), then ``end()``. The target needs enable_speculative_decoder(k).
"""
from typing import Optional

import torch

import _neuron_contract as contract
from transformers_neuronx import base


class TokenAcceptor:
    pass


class DefaultTokenAcceptor(TokenAcceptor):
    def __call__(self, draft_ids, draft_scores, target_scores):
        return draft_ids


class DraftModelForSpeculation:
    def __init__(self, model, **kwargs):
        self.model = model


class SpeculativeGenerator:
    def __init__(self, draft, target, k: int = 4, acceptor: Optional[TokenAcceptor] = None):
        if isinstance(draft, base.NeuronModelBase):
            draft = DraftModelForSpeculation(draft)
        self.draft, self.target, self.k = draft, target, k
        self.acceptor = acceptor or DefaultTokenAcceptor()

    def sample(self, input_ids, sequence_length, start_ids=None, eos_token_id=None, pad_token_id=0,
               attention_mask=None, streamer=None, output_logits=False):
        target, draft = self.target, self.draft.model
        target._require_compiled("SpeculativeGenerator.sample() (target)")
        draft._require_compiled("SpeculativeGenerator.sample() (draft)")
        if not any(k == self.k for k, _ in getattr(target, "decoder_lm_head_for_speculation", {})):
            raise contract.ContractError(f"the target has no speculation graph for k={self.k}: call "
                                         f"target.enable_speculative_decoder({self.k}) before target.to_neuron()")
        batch, length = input_ids.shape
        if batch > 1:
            assert attention_mask is not None, "The attention mask needs to be provided for speculation where batch_size>1"
        contract.record("tnx.SpeculativeGenerator.sample", k=self.k, sequence_length=sequence_length)
        tokens = [input_ids]
        if streamer:
            streamer.put(input_ids)
        n = length
        first = torch.full((batch, 1), 100, dtype=torch.long)
        tokens.append(first)
        n += 1
        if streamer:
            streamer.put(first)
        while n < sequence_length:
            block = torch.arange(n, n + self.k, dtype=torch.long).repeat(batch, 1) % 1000 + 100
            tokens.append(block)
            n += self.k
            if streamer:
                streamer.put(block)
        if streamer:
            streamer.end()
        return torch.cat(tokens, dim=-1)[:, :sequence_length]
