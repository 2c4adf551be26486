"""Measurements behind notebook 07 (bucketing): time to first token per prompt length, per-token
latency per KV position, and the build cost of each graph.

Timings come from a :class:`~helpers.streaming.TimingStreamer` (one ``put`` per generated token),
so they work with any model that has transformers-neuronx's ``sample()``: the reference engine
and ``LlamaForSampling`` on Neuron. ``eos_token_override=NO_EOS`` (an id no token has) keeps a
generation from stopping early on both (transformers-neuronx indexes ``eos_token_id[0]``, so an
empty list would fail there)."""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from .streaming import TimingStreamer

NO_EOS = -1


def timed_sample(model, input_ids, sequence_length: int) -> list[float]:
    """Greedy ``sample()`` to ``sequence_length``; the arrival time (s) of every new token."""
    streamer = TimingStreamer()
    streamer.reset()
    model.sample(input_ids, sequence_length, top_k=1, eos_token_override=NO_EOS, streamer=streamer)
    return streamer.times


def random_prompt(length: int, batch: int = 1, vocab: int = 32000, seed: int = 0, low: int = 100) -> torch.Tensor:
    """[batch, length] token ids drawn uniformly from ``[low, vocab)`` (timing does not depend on content)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, vocab, (batch, int(length)), generator=g)


def ttft(model, input_ids, repeats: int = 3) -> float:
    """Median time to first token (s): ``sample()`` of one new token, ``repeats`` times."""
    return statistics.median(timed_sample(model, input_ids, input_ids.shape[1] + 1)[0]
                             for _ in range(max(1, int(repeats))))


def ttft_by_length(model, lengths, batch: int = 1, repeats: int = 3, vocab: int = 32000) -> dict[int, float]:
    return {int(n): ttft(model, random_prompt(n, batch, vocab, seed=int(n)), repeats) for n in lengths}


def decode_profile(model, prompt_len: int, new_tokens: int, batch: int = 1, vocab: int = 32000):
    """One long greedy generation: (KV length of each decode step, its latency in s).

    Step i (i >= 1) produces token i from cache slot ``prompt_len + i - 1``, attending over
    ``prompt_len + i`` positions; its latency is the gap between tokens i-1 and i.
    """
    t = np.asarray(timed_sample(model, random_prompt(prompt_len, batch, vocab, seed=1), prompt_len + int(new_tokens)))
    return prompt_len + np.arange(1, len(t)), np.diff(t)


def median_by_bucket(kv_lengths, latencies, buckets) -> dict[int, float]:
    """Median step latency per token bucket (transformers-neuronx selection: smallest bucket >= KV length)."""
    from .buckets import tnx_find

    by = {}
    for n, dt in zip(kv_lengths, latencies):
        by.setdefault(tnx_find(buckets, int(n)), []).append(float(dt))
    return {b: statistics.median(v) for b, v in sorted(by.items())}


def graph_costs(model) -> list[dict]:
    """Build seconds and saved size of every graph of a model built with ``compiled='export'|'aoti'``."""
    with tempfile.TemporaryDirectory() as d:
        model.save(d)
        manifest = json.loads((Path(d) / "graphs-rank0.json").read_text())
    return [{"graph": e["unit"], "kind": e["spec"].get("kind", "mlp"), "seconds": e["build_s"],
             "bytes": e["bytes"]} for e in manifest["graphs"]]


def truncated_normal_lengths(mean: float, spread: float, n: int, lo: int, hi: int, seed: int = 0) -> np.ndarray:
    """``n`` integer lengths ~ Normal(mean, spread / 2) (so mean +/- spread covers ~95%), clipped to [lo, hi]."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.normal(mean, spread / 2, int(n))), lo, hi).astype(np.int64)
