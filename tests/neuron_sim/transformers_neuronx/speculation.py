"""Stand-in of ``src/transformers_neuronx/speculation.py`` at aws-neuron/transformers-neuronx v0.13.0 (commit f4e3818).

Transcribed as is: ``TokenAcceptor`` / ``TokenTreeAcceptor`` (abstract), ``ReferenceTokenAcceptor``,
``DefaultTokenAcceptor``, ``DefaultTokenTreeAcceptor``, ``DraftProvider``, ``DraftModelForSpeculation`` and
``SpeculativeGenerator.sample``, over the draft's ``forward`` and the target's ``speculative_forward`` (logits
from the reference engine, see ``transformers_neuronx.base``). What a caller sees, all from the source:

- ``SpeculativeGenerator(draft, target, k=4, acceptor=None)``: the draft proposes k - 1 tokens greedily
  (argmax), the target scores k tokens in one ``speculative_forward`` (it needs
  ``enable_speculative_decoder(k)`` before ``to_neuron()``), the first new token is the target's argmax.
- ``acceptor=None`` means ``DefaultTokenAcceptor``: rejection *sampling* (DeepMind, arXiv:2302.01318) on the
  raw softmax of both models' logits -- temperature 1 over the whole vocabulary, no top-k -- and the token after
  the accepted drafts is *sampled* from the target (or from max(target - draft, 0) on a rejection). A greedy
  request therefore gets sampled tokens unless the caller passes its own greedy ``TokenAcceptor`` subclass:
  speculation.py has no greedy acceptor for this loop (``DefaultTokenTreeAcceptor`` is greedy but belongs to
  the token-tree loop and takes a ``token_tree`` argument).
- The acceptor returns a [batch, k] tensor zero-padded after the accepted tokens, and the loop counts accepted
  tokens with ``torch.count_nonzero``: an accepted token id 0 is counted as not accepted.
- ``streamer.put(input_ids)`` (the prompt, as Hugging Face does), then ``put`` of the first target token
  [batch, 1], then of each [batch, k] zero-padded block of accepted tokens, then ``end()``. No stopping
  criteria. With ``eos_token_id``, tokens after an EOS in a block become ``eos_token_id``.
- The result is [batch, sequence_length]; positions never reached hold ``pad_token_id`` (default 0).
- batch_size > 1 asserts "The attention mask needs to be provided for speculation where batch_size>1".

Stand-in refusals (the source would silently misread, or the engine cannot compute): the batched loop takes
``count_nonzero(attention_mask)`` as each row's end, i.e. it assumes right padding; a left-padded
``attention_mask`` (zeros before the tokens) would overwrite the prompt and is refused with ``ContractError``.
Batched speculation (batch > 1) itself needs per-row cache positions the reference engine does not have:
``NotImplementedError``. The token-tree loop (``TreeSpeculativeGenerator``) is not transcribed.
"""
import torch
from typing import Optional, Tuple, Union, Dict, List

import _neuron_contract as contract
from transformers_neuronx import base
from transformers_neuronx import sampling


class TokenTreeAcceptor:
    """
    Abstract base class for token tree acceptor that is used in Speculative Sampling loop,
    to check which draft tokens should be accepted.
    """

    def __call__(
        self,
        draft_ids: torch.Tensor,
        draft_scores: torch.Tensor,
        target_scores: torch.Tensor,
        token_tree: Dict[int, List[int]],
    ) -> (torch.Tensor, List[int]):
        raise NotImplementedError(f"{self.__class__} is an abstract class. Only"
                                  f" classes inheriting this class can be called.")


class TokenAcceptor:
    """
    Abstract base class for token acceptor that is used in Speculative Sampling loop,
    to check which draft tokens should be accepted.

    Args (of ``__call__``): draft_ids [batch, k-1], draft_scores [batch, k-1, vocab], target_scores
    [batch, k, vocab]. Returns the accepted token ids [batch, k], zero-padded after the accepted ones.
    """

    def __call__(
        self,
        draft_ids: torch.Tensor,
        draft_scores: torch.Tensor,
        target_scores: torch.Tensor,
    ) -> torch.Tensor:
        raise NotImplementedError(f"{self.__class__} is an abstract class. Only"
                                  f" classes inheriting this class can be called.")


class DraftProvider:
    """
    Abstract base class for Draft provider to speculate `k-1` tokens,
    where (k) is the number of parallel tokens target model can decode in one forward pass.
    """

    def __call__(
            self,
            input_ids: torch.Tensor,
            k: int,
            cache_ids: Optional[torch.Tensor] = None,
            start_ids: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError(f"{self.__class__} is an abstract class. Only"
                                  f" classes inheriting this class can be called.")


class ReferenceTokenAcceptor(TokenAcceptor):
    """
    Reference Implementation of TokenAcceptor defined as per the DeepMind paper: https://arxiv.org/pdf/2302.01318.pdf
    This is only for batch_size 1.
    """
    def __call__(
            self,
            draft_ids: torch.Tensor,
            draft_scores: torch.Tensor,
            target_scores: torch.Tensor,
    ) -> torch.Tensor:
        draft_token_len, draft_vocab = draft_scores.shape
        target_token_len, target_vocab = target_scores.shape
        assert draft_vocab == target_vocab  # vocab size should be same
        assert draft_token_len+1 == target_token_len  # target should includes additional token predicted

        accepted_tokens = torch.as_tensor([], dtype=torch.int32)
        accepted_token_count = 0
        all_accepted = True

        k = draft_token_len  # number of speculated tokens
        draft_probabilities = torch.softmax(draft_scores, dim=-1)
        target_probabilities = torch.softmax(target_scores, dim=-1)

        draft_ids = draft_ids[0]

        for i in range(k):
            draft_token_id = draft_ids[i]

            target_prob_i = target_probabilities[i][draft_token_id]
            draft_prob_i = draft_probabilities[i][draft_token_id]

            random = torch.rand((1,)).item()
            if random < min(1, target_prob_i / draft_prob_i):
                accepted_tokens = torch.cat([accepted_tokens, torch.as_tensor([draft_token_id], dtype=torch.int32)])
                accepted_token_count += 1

            else:  # Rejection
                prob_diff = target_probabilities[i] - draft_probabilities[i]
                prob_diff = torch.where(prob_diff > 0, prob_diff, 0.)
                accepted_tokens = torch.cat([accepted_tokens, torch.as_tensor(
                    [torch.multinomial(prob_diff, num_samples=1, replacement=True)])])
                accepted_token_count += 1
                all_accepted = False
                break

        if all_accepted:
            accepted_tokens = torch.cat([accepted_tokens, torch.as_tensor(
                [torch.multinomial(target_probabilities[-1], num_samples=1, replacement=True)])])
            accepted_token_count += 1

        return accepted_tokens.view(1, -1)


class DefaultTokenTreeAcceptor(TokenTreeAcceptor):
    """
    A simple greedy Token Tree Acceptor where we use argmax to pick the token with the largest scores.
    """
    def __call__(
            self,
            draft_ids: torch.Tensor,
            draft_scores: torch.Tensor,
            target_scores: torch.Tensor,
            token_tree: Dict[int, List[int]],
    ):
        draft_token_len, draft_vocab = draft_scores.shape
        target_token_len, target_vocab = target_scores.shape
        assert draft_vocab == target_vocab
        assert draft_token_len == target_token_len
        accepted_tokens = []
        accepted_indices = [0]  # Root node always accepted

        def discover_acceptance(node: int):
            if node in token_tree and len(token_tree[node]) != 0:
                new_draft_accepted_node = None
                target_token = torch.argmax(target_scores[node:node+1, :], keepdim=True, dim=1)
                for child in token_tree[node]:
                    if target_token == draft_ids[:, child]:
                        new_draft_accepted_node = child
                accepted_tokens.append(target_token)
                if new_draft_accepted_node is not None:
                    accepted_indices.append(new_draft_accepted_node)
                    discover_acceptance(new_draft_accepted_node)
            else:
                target_token = torch.argmax(target_scores[node:node+1, :], keepdim=True, dim=1)
                accepted_tokens.append(target_token)
        discover_acceptance(0)
        return torch.cat(accepted_tokens, dim=1), accepted_indices


class DefaultTokenAcceptor(TokenAcceptor):
    """
    Optimized TokenAcceptor based on original DeepMind paper: https://arxiv.org/pdf/2302.01318.pdf
    """
    def __call__(
            self,
            draft_ids: torch.Tensor,
            draft_scores: torch.Tensor,
            target_scores: torch.Tensor,
    ) -> torch.Tensor:

        batch_size, draft_token_len, draft_vocab = draft_scores.shape
        batch_size, target_token_len, target_vocab = target_scores.shape
        assert draft_vocab == target_vocab  # vocab size should be same
        assert draft_token_len + 1 == target_token_len  # target should include additional token predicted
        accepted_tokens = torch.zeros(batch_size, target_token_len, dtype=torch.int64)

        draft_probabilities = torch.softmax(draft_scores, dim=-1)
        target_probabilities = torch.softmax(target_scores, dim=-1)
        index = torch.reshape(draft_ids, (1, draft_token_len, batch_size))
        target_probs = torch.gather(target_probabilities[:, :-1], -1, index)
        draft_probs = torch.gather(draft_probabilities, -1, index)
        target_probs = target_probs.squeeze(0)              # shape: (k, batch_size)
        draft_probs = draft_probs.squeeze(0)                # shape: (k, batch_size)

        random = torch.rand(draft_probs.shape)
        ratio = torch.clamp(target_probs / draft_probs, max=1.0)
        accepted = torch.less(random, ratio)

        # Minimum will return the first occurance of 0 or False (i.e. rejection)
        minimum = torch.min(accepted.view(torch.uint8), dim=0)
        values = minimum.values
        indices = minimum.indices

        def sample(probs):
            return torch.multinomial(probs, num_samples=1, replacement=True)

        for batch_dim in range(batch_size):

            if values[batch_dim] != 0:  # If we didn't get a rejection this means all drafts were accepted
                next_token = sample(target_probabilities[batch_dim, -1:])
                tokens = torch.cat((draft_ids[batch_dim], next_token[0]), dim=-1)
                positions = torch.arange(target_token_len)

            else:
                index = indices[batch_dim]
                prob_diff = target_probabilities[batch_dim, index:index + 1] - \
                    draft_probabilities[batch_dim, index: index + 1]
                prob_diff = torch.clamp(prob_diff, min=0.0)
                next_token = sample(prob_diff)
                tokens = torch.cat((draft_ids[batch_dim, :index], next_token[0]), dim=-1)
                positions = torch.arange(tokens.shape[0])

            accepted_tokens[batch_dim].scatter_(0, positions, tokens)

        return accepted_tokens


class DraftModelForSpeculation(DraftProvider):
    """
    Standard Implementation of Draft model provider that auto-regressively speculates k tokens.
    """

    def __init__(self, model, **kwargs) -> None:
        self.model = model
        self.kwargs = kwargs

    def _context_block(self, input_ids, cache_ids, start_ids):
        next_token_scores = self.model(input_ids, cache_ids, start_ids)
        inputs = torch.argmax(next_token_scores, dim=1, keepdim=True)
        return inputs, next_token_scores

    def __call__(
            self,
            input_ids: torch.Tensor,
            k: int,
            cache_ids: Optional[torch.Tensor] = None,
            start_ids: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        start_len = 0
        batch_size, _ = input_ids.shape
        if cache_ids is not None:
            start_len = cache_ids.item() if cache_ids.dim() == 1 else cache_ids[0][0]

        if start_len == 0:  # run context network as cache_id location starts from 0.
            return self._context_block(input_ids, cache_ids, start_ids)

        next_token_scores = self.model(input_ids, cache_ids, start_ids)

        scores = []
        tokens = []

        # Speculate k tokens in auto regressive mode.
        for cur_len in range(start_len, start_len + k):
            next_len = cur_len + 1
            inputs = torch.argmax(next_token_scores, keepdim=True, dim=1)

            scores.append(next_token_scores)
            tokens.append(inputs)

            if next_len >= start_len + k:
                break

            cache_ids = torch.as_tensor([next_len]*batch_size, dtype=torch.int32)
            if batch_size > 1:
                cache_ids = cache_ids.reshape(batch_size, 1)
            next_token_scores = self.model(inputs, cache_ids, start_ids)

        return (
            torch.cat(tokens, dim=1),
            torch.stack(scores)
        )


class SpeculativeGenerator:

    def __init__(
        self,
        draft: Union[DraftProvider, base.NeuronModelBase],
        target: base.NeuronModelBase,
        k: int = 4,
        acceptor: Optional[TokenAcceptor] = None
    ):
        if isinstance(draft, base.NeuronModelBase):
            draft = DraftModelForSpeculation(draft)
        self.draft = draft
        self.target = target
        self.k = k
        self.acceptor = acceptor or DefaultTokenAcceptor()

    def sample(
        self,
        input_ids: torch.Tensor,
        sequence_length: int,
        start_ids: Optional[torch.Tensor] = None,
        eos_token_id: Optional[int] = None,
        pad_token_id: Optional[int] = 0,
        attention_mask: Optional[torch.Tensor] = None,
        streamer=None,
        output_logits: bool = False,
    ):
        contract.record("tnx.SpeculativeGenerator.sample", k=self.k, sequence_length=sequence_length,
                        acceptor=type(self.acceptor).__name__)
        models = [m for m in (getattr(self.draft, "model", None), self.target) if isinstance(m, base.NeuronModelBase)]
        for m in models:
            m._past_cache_ok = True  # the last blocks may run past sequence_length; those tokens are cut
        try:
            return self._sample(input_ids, sequence_length, start_ids, eos_token_id, pad_token_id, attention_mask,
                                streamer, output_logits)
        finally:
            for m in models:
                m._past_cache_ok = False

    def _sample(self, input_ids, sequence_length, start_ids, eos_token_id, pad_token_id, attention_mask, streamer,
                output_logits):
        batch_size, context_len = input_ids.shape
        cache_ids = None
        draft_logits, target_logits = [], []  # only used if output_logits == True

        if batch_size > 1:
            # We need the user to provide attention mask along with padded input_ids for batched cases
            assert attention_mask is not None, (
                "The attention mask needs to be provided for speculation where batch_size>1"
            )
        if attention_mask is not None and bool((torch.as_tensor(attention_mask) == 0).any()):
            first_one = torch.as_tensor(attention_mask).long().argmax(dim=1)
            if bool((first_one > 0).any()):
                raise contract.ContractError(
                    "SpeculativeGenerator.sample takes count_nonzero(attention_mask) as the end of each row (it assumes "
                    "right padding): with this left-padded attention_mask it would write the generated tokens over the "
                    "prompt and attend to the wrong KV-cache positions, silently")
        if batch_size > 1:
            raise NotImplementedError(
                "batched speculation (batch_size > 1) needs per-row KV-cache positions, which the reference engine "
                "behind the transformers-neuronx stand-in does not have; the real loop runs it with 2D cache_ids")

        # Context encoding
        _draft_ids, _draft_scores = self.draft(input_ids, self.k, cache_ids, start_ids)
        target_scores = self.target(input_ids, cache_ids, start_ids)
        if output_logits:
            target_logits.append(target_scores.unsqueeze(1))

        # The streamer should send back the input tokens to conform to huggingface behavior.
        if streamer:
            streamer.put(input_ids)

        target_next_ids = sampling.select_tokens(target_scores)  # TODO add generation args
        if streamer:
            streamer.put(target_next_ids)

        done_flags = torch.full((batch_size, 1), False)

        # Set up early stopping
        early_stop = False
        if eos_token_id is not None:
            eos_token = torch.tensor(eos_token_id, dtype=torch.int64)
            early_stop = True

        # Intialize tokens tensor
        tokens = torch.full((batch_size, sequence_length + self.k + 1), pad_token_id, dtype=torch.int64)

        # Insert input_ids into tokens tensor
        input_ids = input_ids.to(dtype=torch.int64)  # sanity check before scatter
        update_positions = torch.arange(context_len, dtype=torch.int64).repeat((batch_size, 1))
        tokens.scatter_(1, update_positions, input_ids)

        # Calculate end positions and cache_ids
        end_positions = torch.tensor([context_len], dtype=torch.int64)
        if attention_mask is not None:
            end_positions = torch.count_nonzero(attention_mask, dim=1)
        cache_ids = end_positions.clone().detach()

        # Insert target_next_ids into tokens tensor
        tokens.scatter_(1, end_positions.view(-1, 1), target_next_ids)
        end_positions += 1

        # Initialize useful tensors
        k_arange_tensor = torch.arange(self.k, dtype=torch.int64).repeat((batch_size, 1))

        # Main sampling loop
        while True:

            if early_stop:
                done_flags |= (target_next_ids == eos_token)
                if batch_size > 1:  # Avoid writing tokens to completed sequences
                    target_next_ids[done_flags] = eos_token

            if done_flags.all():
                break

            # Set draft model 1D or 2D cache_ids
            draft_cache_ids = cache_ids
            if batch_size > 1:
                draft_cache_ids = draft_cache_ids.view(-1, 1)

            # Returns auto-regressive k - 1 speculated tokens (as one token was already predicted by target)
            draft_ids, draft_next_scores = self.draft(target_next_ids, self.k - 1, draft_cache_ids, start_ids)

            # Set target 1D or 2D cache_ids
            if batch_size == 1:
                target_cache_ids = torch.arange(cache_ids[0], cache_ids[0] + draft_ids.shape[1] + 1)
            else:
                target_cache_ids = k_arange_tensor + cache_ids.view(-1, 1)

            # Execute target model with draft tokens; the speculative forward returns (k, vocab, bs)
            target_input_ids = torch.cat([target_next_ids, draft_ids], dim=1)
            target_next_scores = self.target.speculative_forward(input_ids=target_input_ids,
                                                                 cache_ids=target_cache_ids,
                                                                 start_ids=start_ids, speculation_length=self.k)

            # A bunch of transposes to get the scores into shape (bs, k, vocab)
            draft_next_scores = torch.transpose(draft_next_scores, 0, 1)
            target_next_scores = torch.transpose(target_next_scores, 0, 2)
            target_next_scores = torch.transpose(target_next_scores, 1, 2)

            # Run token acceptor and returns padded (bs, k) tensor with accepted tokens
            accepted_tokens = self.acceptor(draft_ids, draft_next_scores, target_next_scores)
            if output_logits:
                draft_logits.append(draft_next_scores)
                target_logits.append(target_next_scores)

            # Calculate actual acceptance lengths and end_positions
            actual_accepted_tokens_lengths = torch.count_nonzero(accepted_tokens, dim=1)
            update_positions = k_arange_tensor + end_positions.view(-1, 1)

            # Masking tokens beyond eos_token and replacing extra "accepted" tokens with eos_token for early stop
            if early_stop:
                eos_mask = (accepted_tokens == eos_token_id).cumsum(1).bool()
                eos_mask |= done_flags.view(-1, 1)
                accepted_tokens[eos_mask] = eos_token_id

            # Update sequences
            tokens.scatter_(1, update_positions, accepted_tokens)
            cache_ids += actual_accepted_tokens_lengths
            end_positions += actual_accepted_tokens_lengths
            target_next_ids = accepted_tokens[:, actual_accepted_tokens_lengths - 1]
            if batch_size > 1:
                target_next_ids = target_next_ids[:, 0].view(-1, 1)

            if streamer:
                streamer.put(accepted_tokens)

            # Marking done flags
            if early_stop:
                done_flags |= eos_mask.any(dim=1).view(-1, 1)

            # If we accepted all tokens then we need to insert the last draft
            # token into the KV cache since it was generated but never executed
            if (actual_accepted_tokens_lengths == self.k).any():
                draft_tokens = accepted_tokens[:, -2:-1]
                draft_cache_ids = cache_ids - 1
                if batch_size > 1:
                    draft_cache_ids = draft_cache_ids.view(-1, 1)
                self.draft(draft_tokens, 1, draft_cache_ids, start_ids)

            # Clamp the cache_ids and end positions to the sequence length
            end_positions = torch.clamp(end_positions, max=sequence_length)
            cache_ids = torch.clamp(cache_ids, max=sequence_length)
            done_flags.logical_or_(torch.eq(cache_ids, sequence_length).unsqueeze(1))

        if streamer:
            streamer.end()

        return tokens[:, :sequence_length] if not output_logits else \
            (tokens[:, :sequence_length], draft_logits, target_logits)
