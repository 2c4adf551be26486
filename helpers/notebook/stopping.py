"""Notebook 04's stopping criteria and their measurements: a custom criterion (:class:`RepeatedNgramCriteria`),
transformers-neuronx's calling convention (#75) reproduced on the reference engine, ``sample()`` timed with criteria, when a criterion fires, and stopped outputs checked
against the unstopped run.

The workaround for #75 is ``helpers.neuron.tracking``.
"""
from __future__ import annotations

import time

import torch
from transformers import StoppingCriteria, StoppingCriteriaList


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
