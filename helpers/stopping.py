"""Stopping criteria that see the ids generated so far, on both backends.

The reference engine calls criteria as transformers does: ``criteria(ids_so_far, scores)`` with
the prompt plus every generated token, and accepts a per-row bool tensor (rows stop one by one
and are padded) or a plain bool (the whole batch stops).

transformers-neuronx 0.13 instead calls ``stopping_criteria_list(input_ids, probs)`` with the
*prompt* (``sampling.py:sample_loop_llama``; aws-neuron/transformers-neuronx#75), so a criterion
that inspects generated text (stop strings, EOS variants) never fires there. The workaround used
here works on both backends: a :class:`TokenTracker` streamer records every generated token, and
:class:`TrackedCriteria` calls the real criteria with prompt + tracked tokens, ignoring the ids
it is handed.
"""
from __future__ import annotations

import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer


class RepeatedNgramCriteria(StoppingCriteria):
    """A custom criterion: stop a row once its last ``n`` tokens already appeared ``max_repeats``
    times among its generated tokens (a degenerate loop)."""

    def __init__(self, prompt_len: int, n: int = 4, max_repeats: int = 2):
        if n < 1 or max_repeats < 1:
            raise ValueError("n and max_repeats must be >= 1")
        self.prompt_len, self.n, self.max_repeats = prompt_len, n, max_repeats

    def __call__(self, input_ids: torch.Tensor, scores=None, **kwargs) -> torch.BoolTensor:
        gen = input_ids[:, self.prompt_len:]
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if gen.shape[1] < self.n * (self.max_repeats + 1):
            return done
        windows = gen.unfold(1, self.n, 1)                     # [B, W, n]
        last = windows[:, -1:, :]
        count = (windows[:, :-1, :] == last).all(-1).sum(-1)   # earlier occurrences of the last n-gram
        return count >= self.max_repeats


class TokenTracker(BaseStreamer):
    """A streamer that keeps every generated token (batch, steps); chain it with another streamer."""

    def __init__(self, inner: BaseStreamer | None = None):
        self.inner, self.chunks = inner, []

    def put(self, value):
        self.chunks.append(torch.as_tensor(value).reshape(-1, 1).cpu())
        if self.inner is not None:
            self.inner.put(value)

    def end(self):
        if self.inner is not None:
            self.inner.end()

    def generated(self, batch: int) -> torch.Tensor:
        if not self.chunks:
            return torch.empty(batch, 0, dtype=torch.long)
        return torch.cat(self.chunks, dim=1)


class TrackedCriteria(StoppingCriteria):
    """Calls ``criteria`` with prompt + the tokens ``tracker`` saw, whatever ids the caller passes
    (transformers-neuronx passes only the prompt)."""

    def __init__(self, criteria: StoppingCriteriaList, tracker: TokenTracker, prompt: torch.Tensor):
        self.criteria, self.tracker, self.prompt = criteria, tracker, prompt.cpu()

    def __call__(self, input_ids, scores=None, **kwargs):
        ids = torch.cat([self.prompt, self.tracker.generated(self.prompt.shape[0])], dim=1)
        return self.criteria(ids, scores)


class PromptOnlyCall(StoppingCriteria):
    """Reproduces transformers-neuronx's calling convention (#75) on the reference engine: the
    wrapped criteria are handed the prompt, never the generated ids."""

    def __init__(self, criteria: StoppingCriteriaList, prompt: torch.Tensor):
        self.criteria, self.prompt = criteria, prompt

    def __call__(self, input_ids, scores=None, **kwargs):
        return self.criteria(self.prompt.to(input_ids.device), scores)

