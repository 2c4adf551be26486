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

import time

import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from .streaming import ForwardingStreamer


def row_flags(value, batch: int, device=None) -> torch.Tensor:
    """A criterion's answer as one bool per row: a per-row tensor as it is, one bool (tensor or not) for
    every row."""
    v = torch.as_tensor(value, dtype=torch.bool, device=device).reshape(-1)
    return v.expand(batch) if v.numel() == 1 else v


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


class TokenTracker(ForwardingStreamer):
    """A streamer that keeps every generated token (batch, steps); chain it with another streamer."""

    def __init__(self, inner: BaseStreamer | None = None):
        super().__init__(inner)
        self.chunks = []

    def record(self, value):
        self.chunks.append(torch.as_tensor(value).reshape(-1, 1).cpu())

    def generated(self, batch: int) -> torch.Tensor:
        if not self.chunks:
            return torch.empty(batch, 0, dtype=torch.long)
        return torch.cat(self.chunks, dim=1)


class TrackedCriteria(StoppingCriteria):
    """Calls ``criteria`` with prompt + the tokens ``tracker`` saw, whatever ids the caller passes
    (transformers-neuronx passes only the prompt). Row flags are sticky: a row that met a criterion
    once stays done (a stop string is only at the end of the text for one step).

    ``as_bool=True`` returns one Python bool, True once every row is done: transformers-neuronx's
    ``StoppingCriteriaList`` does ``any(c(ids, scores) for c in self)`` and stops the whole batch, so
    a per-row tensor there would be ambiguous (``stopping_criteria.py``)."""

    def __init__(self, criteria: StoppingCriteriaList, tracker: TokenTracker, prompt: torch.Tensor,
                 as_bool: bool = False):
        self.criteria, self.tracker, self.prompt = criteria, tracker, prompt.cpu()
        self.as_bool, self.done = as_bool, None

    def __call__(self, input_ids, scores=None, **kwargs):
        batch = self.prompt.shape[0]
        ids = torch.cat([self.prompt, self.tracker.generated(batch)], dim=1)
        flags = row_flags(self.criteria(ids, scores), batch)
        self.done = flags if self.done is None else self.done | flags
        return bool(self.done.all()) if self.as_bool else self.done.clone()


class PromptOnlyCall(StoppingCriteria):
    """Reproduces transformers-neuronx's calling convention (#75) on the reference engine: the
    wrapped criteria are handed the prompt, never the generated ids."""

    def __init__(self, criteria: StoppingCriteriaList, prompt: torch.Tensor):
        self.criteria, self.prompt = criteria, prompt

    def __call__(self, input_ids, scores=None, **kwargs):
        return self.criteria(self.prompt.to(input_ids.device), scores)



def run_with_criteria(model, enc, sequence_length: int, make_criteria, repeats: int = 1) -> dict:
    """Greedy ``sample()`` with EOS disabled (only the criteria stop rows); returns the output, the
    tokens generated per row and the fastest of ``repeats`` wall times (the least disturbed by
    other load). ``make_criteria()`` builds fresh criteria for each run (or is None)."""
    best = float("inf")
    for _ in range(max(1, repeats)):
        criteria = make_criteria() if make_criteria else None
        t0 = time.perf_counter()
        out = model.sample(enc.input_ids, sequence_length, top_k=1, attention_mask=enc.attention_mask,
                           eos_token_override=[], stopping_criteria_list=criteria)
        best = min(best, time.perf_counter() - t0)
    return {"out": out, "seconds": best, "row_new_tokens": list(model.stats["row_new_tokens"])}


def fires_at(criteria, ids: torch.Tensor, prompt_len: int) -> int | None:
    """For one row ``ids`` [1, prompt + n], the first number of generated tokens at which
    ``criteria`` returns True, or None. Replays the criteria on growing prefixes."""
    for t in range(1, ids.shape[1] - prompt_len + 1):
        if bool(torch.as_tensor(criteria(ids[:, :prompt_len + t], None)).reshape(-1)[0]):
            return t
    return None


def compare_to_unstopped(stopped: torch.Tensor, full: torch.Tensor, row_new_tokens, prompt_len: int,
                         pad_token_id: int) -> list[dict]:
    """Per row: the stopped output must be a prefix of the unstopped greedy output, padded after."""
    rows = []
    for r, n in enumerate(row_new_tokens):
        end = prompt_len + n
        prefix_ok = torch.equal(stopped[r, :end], full[r, :end])
        padded_ok = bool((stopped[r, end:] == pad_token_id).all())
        rows.append({"row": r, "new_tokens": n, "is_prefix": prefix_ok, "padded_after": padded_ok})
    return rows
