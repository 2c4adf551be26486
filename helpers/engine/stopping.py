"""Stopping criteria that see the ids generated so far, on both backends.

The reference engine calls criteria as transformers does: ``criteria(ids_so_far, scores)`` with
the prompt plus every generated token, and accepts a per-row bool tensor (rows stop one by one
and are padded) or a plain bool (the whole batch stops).

transformers-neuronx 0.13 instead calls ``stopping_criteria_list(input_ids, probs)`` with the
*prompt* (``sampling.py:sample_loop_llama``; aws-neuron/transformers-neuronx#75), so a criterion
that inspects generated text (stop strings, EOS variants) never fires there. The workaround used
here works on both backends: a :class:`~helpers.engine.streaming.TokenRecorder` streamer records every
generated token, and :class:`TrackedCriteria` calls the real criteria with prompt + recorded tokens, ignoring
the ids it is handed (``helpers.neuron``'s sampler does it for the caller's criteria on transformers-neuronx).
"""
from __future__ import annotations

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from .streaming import TokenRecorder


def row_flags(value, batch: int, device=None) -> torch.Tensor:
    """A criterion's answer as one bool per row: a per-row tensor as it is, one bool (tensor or not) for
    every row."""
    v = torch.as_tensor(value, dtype=torch.bool, device=device).reshape(-1)
    return v.expand(batch) if v.numel() == 1 else v


class TrackedCriteria(StoppingCriteria):
    """Calls ``criteria`` with the ids generated so far. With a ``tracker`` (the :class:`TokenRecorder` the same
    ``sample()`` streams into), those are ``prompt`` + the tokens it recorded, whatever ids the caller passes
    (transformers-neuronx passes only the prompt); with ``tracker=None``, the ids passed. Row flags are sticky: a
    row that met a criterion once stays done (a stop string is only at the end of the text for one step), and
    ``stop_at[r]`` is how many new tokens row ``r`` had when it first did (None: not yet).

    ``as_bool=True`` returns one Python bool, True once every row is done: transformers-neuronx's
    ``StoppingCriteriaList`` does ``any(c(ids, scores) for c in self)`` and stops the whole batch, so
    a per-row tensor there would be ambiguous (``stopping_criteria.py``)."""

    def __init__(self, criteria: StoppingCriteriaList, tracker: TokenRecorder | None, prompt: torch.Tensor,
                 as_bool: bool = False):
        self.criteria, self.tracker, self.prompt = criteria, tracker, prompt.cpu()
        self.as_bool, self.done = as_bool, None
        self.stop_at: list[int | None] = [None] * prompt.shape[0]

    def __call__(self, input_ids, scores=None, **kwargs):
        batch, prompt_len = self.prompt.shape
        ids = input_ids if self.tracker is None else torch.cat([self.prompt, self.tracker.generated(batch)], dim=1)
        flags = row_flags(self.criteria(ids, scores), batch)
        self.done = flags if self.done is None else self.done | flags
        for r, hit in enumerate(flags.tolist()):
            if hit and self.stop_at[r] is None:
                self.stop_at[r] = ids.shape[1] - prompt_len
        return bool(self.done.all()) if self.as_bool else self.done.clone()
