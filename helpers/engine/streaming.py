"""The streamer contract of ``sample()``.

transformers-neuronx's ``sample()`` calls ``streamer.put(token)`` with a (batch, 1) tensor after
every step and ``streamer.end()`` once, never with the prompt (``sampling.py:sample_loop_llama``);
the reference engine does the same. :class:`ForwardingStreamer` is a transformers ``BaseStreamer``
that keeps what it is handed and forwards it to an optional inner streamer (``TextStreamer``,
``TextIteratorStreamer``); :class:`TokenRecorder` keeps every step's tokens and the time each arrived:
the one recorder behind the stopping-criteria workaround (``helpers.engine.stopping``), ``helpers.neuron``'s
sampler and the notebooks' ``helpers.notebook.streaming.TimingStreamer``.
"""
from __future__ import annotations

import time

import torch
from transformers.generation.streamers import BaseStreamer


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
