"""Streamers and stopping criteria that see the tokens generated so far, on every backend.

``sample()`` calls ``streamer.put`` with a (batch, 1) tensor after every step and ``streamer.end()`` once, never
with the prompt (transformers-neuronx's ``sampling.py:sample_loop_llama``; the reference engine does the same).
transformers-neuronx 0.13 calls ``stopping_criteria_list(input_ids, probs)`` with the *prompt*
(aws-neuron/transformers-neuronx#75), so a criterion that inspects generated text never fires there. The
workaround works on every backend: a :class:`TokenRecorder` streamer records each generated token, and
:class:`TrackedCriteria` calls the real criteria with prompt + recorded tokens (``sampler`` does it for the
caller's criteria on transformers-neuronx).
"""
from __future__ import annotations

import time

import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from ..engine.sampling import row_flags


class ForwardingStreamer(BaseStreamer):
    """A streamer that records what it is handed (:meth:`record`, :meth:`on_end`) and hands it on to
    ``inner``: the one place where a wrapping streamer forwards."""

    def __init__(self, inner: BaseStreamer | None = None):
        self.inner = inner

    def record(self, value) -> None:
        """What this streamer keeps of one ``put`` (raise to refuse it before it is forwarded)."""

    def on_end(self) -> None:
        """What this streamer does at ``end``."""

    def put(self, value):
        self.record(value)
        if self.inner is not None:
            self.inner.put(value)

    def end(self):
        self.on_end()
        if self.inner is not None:
            self.inner.end()


class TokenRecorder(ForwardingStreamer):
    """Keeps each streamed step's tokens as a (batch, 1) column and the time it arrived (``perf_counter`` seconds
    since ``start``: given, or when it was made or last :meth:`reset`), and counts ``end`` calls."""

    def __init__(self, inner: BaseStreamer | None = None, start: float | None = None):
        super().__init__(inner)
        self.reset(start)

    def reset(self, start: float | None = None):
        """Forget what was recorded; times count from ``start`` (default: now, e.g. right before ``sample()``)."""
        self.start = time.perf_counter() if start is None else start
        self.times: list[float] = []
        self.chunks: list[torch.Tensor] = []
        self.ended = 0

    def column(self, value) -> torch.Tensor:
        """What is kept of one ``put``: its tokens as a (batch, 1) column on the CPU."""
        return torch.as_tensor(value).reshape(-1, 1).cpu()

    def record(self, value):
        self.times.append(time.perf_counter() - self.start)
        self.chunks.append(self.column(value))

    def on_end(self):
        self.ended += 1

    def generated(self, batch: int) -> torch.Tensor:
        """Every recorded token, (batch, steps)."""
        if not self.chunks:
            return torch.empty(batch, 0, dtype=torch.long)
        return torch.cat(self.chunks, dim=1)


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
