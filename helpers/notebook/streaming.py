"""Token streaming measured the way a server sees it (notebook 03): a streamer that timestamps every step on both
backends, what a library's generate hands its streamer, latency figures, a consumer in another thread, and what
streaming costs.

The streamer contract (``put`` of a (batch, 1) tensor per step, ``end`` once) and the recorder behind
:class:`TimingStreamer` are ``helpers.neuron.tracking``'s.
"""
from __future__ import annotations

import statistics
import threading
import time

import torch
from transformers.generation.streamers import BaseStreamer

from ..neuron.tracking import TokenRecorder


class TimingStreamer(TokenRecorder):
    """Records each streamed step's tokens and the time it arrived (``perf_counter`` seconds), and refuses a
    ``put`` that is not one (batch, 1) step. Call :meth:`reset` right before ``sample()``: times are relative to
    that instant."""

    def column(self, value) -> torch.Tensor:
        value = torch.as_tensor(value)
        if value.dim() != 2 or value.shape[1] != 1:
            raise ValueError(f"expected a (batch, 1) tensor per step as transformers-neuronx puts it, got "
                             f"shape {tuple(value.shape)}")
        return value.detach().cpu().clone()

    @property
    def tokens(self) -> torch.Tensor:
        """All streamed tokens, (batch, steps)."""
        return torch.cat(self.chunks, dim=1) if self.chunks else torch.empty(0, 0, dtype=torch.long)


class PutRecorder(BaseStreamer):
    """Records what a generation loop hands a streamer: the shape of every ``put`` and how many ``end`` calls.

    Shows the calling convention of a library's generate: transformers-neuronx's ``sample()`` puts one
    (batch, 1) tensor per step and ends once; NxD Inference 0.8's ``HuggingFaceGenerationAdapter.generate``
    gets only the prompt put by transformers' ``generate`` (its ``_sample`` never puts a token nor ends)."""

    def __init__(self):
        self.puts: list[tuple] = []
        self.ends = 0

    def put(self, value):
        self.puts.append(tuple(torch.as_tensor(value).shape))

    def end(self):
        self.ends += 1

    def summary(self) -> str:
        shapes = sorted(set(self.puts), key=self.puts.index)
        return f"{len(self.puts)} put() call(s) of shape {', '.join(map(str, shapes)) or '-'}; end() called {self.ends} time(s)"


def latency_stats(times: list[float]) -> dict:
    """TTFT, inter-token latencies (median/p90) and tokens/s from arrival times since the request."""
    if not times:
        raise ValueError("no tokens were streamed")
    itl = [b - a for a, b in zip(times, times[1:])]
    out = {"ttft_s": times[0], "n_tokens": len(times), "total_s": times[-1]}
    if itl:
        q = statistics.quantiles(itl, n=10, method="inclusive") if len(itl) > 1 else [itl[0]] * 9
        out.update(itl_median_s=statistics.median(itl), itl_p90_s=q[8],
                   decode_tokens_per_s=len(itl) / (times[-1] - times[0]))
    return out


def consume_in_thread(generate, iterator_streamer, **kwargs):
    """Run ``generate(streamer=iterator_streamer, **kwargs)`` in a worker thread and consume the
    text from this thread, as a web server handler does. Returns (result, [(seconds, text), ...])."""
    result, error = {}, {}

    def work():
        try:
            result["value"] = generate(streamer=iterator_streamer, **kwargs)
        except BaseException as e:  # re-raised in the caller
            error["value"] = e
            iterator_streamer.end()

    t0 = time.perf_counter()
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    pieces = [(time.perf_counter() - t0, text) for text in iterator_streamer]
    worker.join()
    if error:
        raise error["value"]
    return result["value"], pieces


def streaming_overhead(generate, repeats: int = 3) -> dict:
    """Median wall time of ``generate(streamer=TimingStreamer())`` vs ``generate(streamer=None)``,
    interleaved so machine noise hits both alike. Returns seconds and the relative overhead."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    with_s, without_s = [], []
    for _ in range(repeats):
        for streamer, bucket in ((TimingStreamer(), with_s), (None, without_s)):
            t0 = time.perf_counter()
            generate(streamer=streamer)
            bucket.append(time.perf_counter() - t0)
    w, wo = statistics.median(with_s), statistics.median(without_s)
    return {"with_streamer_s": w, "without_streamer_s": wo, "overhead_pct": 100.0 * (w / wo - 1.0),
            "repeats": repeats}
