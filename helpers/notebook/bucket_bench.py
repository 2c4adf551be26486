"""Measurements behind notebook 07 (bucketing): time to first token per prompt length, per-token
latency per KV position, and the build cost of each graph.

Timings come from a :class:`~helpers.notebook.streaming.TimingStreamer` (one ``put`` per generated token),
so they work with any model that has transformers-neuronx's ``sample()``: the reference engine
and ``LlamaForSampling`` on Neuron. NxD Inference's generate adapter hands the streamer every token only
after ``generate`` returns (``stats['ttft_s']`` is None): there TTFT is the time of a one-token generation
and per-step latency comes from whole generations timed to each token-bucket boundary
(:func:`profile_from_totals`). EOS is switched off so that no generation stops early: with ``[]`` on the
helpers models (the reference engine, and ``helpers.build_model`` on Neuron, which switches it off in each
library itself), with ``NO_EOS`` (an id no token has) on a bare transformers-neuronx model, whose
``sample()`` indexes ``eos_token_id[0]`` (an empty list fails there; NxD Inference's generate only warns
about a negative id)."""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..planning.buckets import tnx_find
from .streaming import TimingStreamer

NO_EOS = -1


def eos_off(model):
    """The ``eos_token_override`` that switches EOS off for ``model`` (see the module docstring): the helpers
    models keep their last run's ``stats``; a bare transformers-neuronx model has none."""
    return [] if hasattr(model, "stats") else NO_EOS


def timed_sample(model, input_ids, sequence_length: int) -> list[float]:
    """Greedy ``sample()`` to ``sequence_length``; the arrival time (s) of every new token."""
    streamer = TimingStreamer()
    streamer.reset()
    model.sample(input_ids, sequence_length, top_k=1, eos_token_override=eos_off(model), streamer=streamer)
    return streamer.times


def random_prompt(length: int, batch: int = 1, vocab: int = 32000, seed: int = 0, low: int = 100) -> torch.Tensor:
    """[batch, length] token ids drawn uniformly from ``[low, vocab)`` (timing does not depend on content)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, vocab, (batch, int(length)), generator=g)


def ttft(model, input_ids, repeats: int = 3) -> float:
    """Median time to first token (s): ``sample()`` of one new token, ``repeats`` times."""
    return statistics.median(timed_sample(model, input_ids, input_ids.shape[1] + 1)[0]
                             for _ in range(max(1, int(repeats))))


def interleaved_samples(runs: dict, repeats: int = 3) -> dict[str, list[float]]:
    """Every timing of each function, the functions called in turn ``repeats`` times: on a shared machine, load
    that drifts over minutes hits every candidate alike. Keep the samples to show their spread
    (:class:`helpers.notebook.figures.Spread`)."""
    times = {name: [] for name in runs}
    for _ in range(max(1, int(repeats))):
        for name, run in runs.items():
            times[name].append(run())
    return times


def interleaved(runs: dict, repeats: int = 3) -> dict:
    """Median of each timing function of :func:`interleaved_samples`."""
    return {name: statistics.median(t) for name, t in interleaved_samples(runs, repeats).items()}


def ttft_samples(models: dict, lengths, batch: int = 1, repeats: int = 3, vocab: int = 32000) -> dict:
    """``{model name: {prompt length: [TTFT s of each repeat]}}``, the models measured interleaved per length."""
    table = {name: {} for name in models}
    for n in lengths:
        ids = random_prompt(n, batch, vocab, seed=int(n))
        runs = {name: (lambda m=m: timed_sample(m, ids, ids.shape[1] + 1)[0]) for name, m in models.items()}
        for name, t in interleaved_samples(runs, repeats).items():
            table[name][int(n)] = t
    return table


def ttft_table(models: dict, lengths, batch: int = 1, repeats: int = 3, vocab: int = 32000) -> dict:
    """``{model name: {prompt length: median TTFT s}}`` (:func:`ttft_samples`)."""
    return {name: {n: statistics.median(t) for n, t in by_len.items()}
            for name, by_len in ttft_samples(models, lengths, batch, repeats, vocab).items()}


def boundary_lengths(buckets, n_max: int, offset: int = 4, beyond=(), low: int = 8) -> list[int]:
    """Prompt lengths that show where TTFT steps: ``offset`` tokens below and above every context bucket
    boundary, plus ``beyond`` (lengths past the largest bucket, where transformers-neuronx continues token by
    token) and ``low``; all in ``[1, n_max)``."""
    lengths = {int(low)} | {int(n) for n in beyond}
    for b in buckets:
        lengths |= {int(b) - offset, int(b) + offset}
    return sorted(n for n in lengths if 1 <= n < n_max)


def decode_windows(token_buckets, steps: int, first_prompt: int) -> dict[int, int]:
    """``{token bucket: prompt length}``: a prompt per token bucket whose next ``steps`` decode steps all attend
    over KV lengths inside that bucket (step i attends over prompt + i positions, kept below the boundary so that
    transformers-neuronx's and NxD Inference's strict selection agree). The first bucket's prompt is ``first_prompt`` (lowered to fit); a later one starts at the previous
    boundary. A bucket narrower than ``steps`` is left out."""
    out, prev = {}, 0
    for b in sorted(int(x) for x in token_buckets):
        prompt = min(int(first_prompt), b - steps - 1) if prev == 0 else prev
        if prompt >= max(1, prev) and prompt + steps < b:
            out[b] = prompt
        prev = b
    return out


def step_latency(model, prompt_len: int, new_tokens: int, batch: int = 1, vocab: int = 32000) -> float:
    """Median decode-step latency (s) of a generation of ``new_tokens`` after a ``prompt_len`` prompt."""
    return float(np.median(decode_profile(model, prompt_len, new_tokens, batch, vocab)[1]))


def has_token_times(model) -> bool:
    """Whether the model's last ``sample()`` timed each token as it was produced (the reference engine and
    transformers-neuronx do; NxD Inference's adapter does not: its ``stats['ttft_s']`` is None)."""
    return model.stats.get("ttft_s") is not None


def decode_profile(model, prompt_len: int, new_tokens: int, batch: int = 1, vocab: int = 32000, buckets=()):
    """One long greedy generation: (KV length of each decode step, its latency in s).

    Step i (i >= 1) produces token i from cache slot ``prompt_len + i - 1``, attending over
    ``prompt_len + i`` positions; its latency is the gap between tokens i-1 and i. Without per-token
    times the latency is the mean over the steps between two token-bucket boundaries (``buckets``).
    """
    ids = random_prompt(prompt_len, batch, vocab, seed=1)
    t = np.asarray(timed_sample(model, ids, prompt_len + int(new_tokens)))
    if has_token_times(model):
        return prompt_len + np.arange(1, len(t)), np.diff(t)
    return profile_from_totals(model, ids, int(new_tokens), buckets, first={int(new_tokens): model.stats["total_s"]})


def profile_from_totals(model, input_ids, new_tokens: int, buckets=(), repeats: int = 2, first=None):
    """(KV lengths, step latencies) of a generation of ``new_tokens`` from whole generations only: one stopping
    after each token-bucket boundary and one to the end, each timed by ``stats['total_s']`` (the fastest of
    ``repeats``: load on a shared host only slows a run; ``first``: totals already measured, by length). The
    difference of two totals over the steps between them is the mean step latency there (each stretch lies in
    one bucket); the prompt encoding cancels out. A stretch that comes out not positive is refused: the
    timing noise is larger than its decode time."""
    L = input_ids.shape[1]
    cuts = sorted({1, int(new_tokens)} | {int(b) - L + 1 for b in buckets if 1 < int(b) - L + 1 < new_tokens})
    totals = []
    for c in cuts:
        runs = [] if first is None or c not in first else [first[c]]
        for _ in range(max(1, repeats) - len(runs)):
            model.sample(input_ids, L + c, top_k=1, eos_token_override=eos_off(model))
            if model.stats["new_tokens"] != c:
                raise RuntimeError(f"asked for {c} new tokens, got {model.stats['new_tokens']}: the generation stopped early")
            runs.append(model.stats["total_s"])
        totals.append(min(runs))
    kv, lat = [], []
    for (c0, t0), (c1, t1) in zip(zip(cuts, totals), zip(cuts[1:], totals[1:])):
        if t1 <= t0:
            raise RuntimeError(f"a generation of {c1} tokens took no longer than one of {c0} ({t1:.3f} s against "
                               f"{t0:.3f} s): timing noise exceeds {c1 - c0} decode steps; generate more tokens per "
                               "bucket, or measure on a quieter host")
        kv += range(L + c0, L + c1)
        lat += [(t1 - t0) / (c1 - c0)] * (c1 - c0)
    return np.asarray(kv, dtype=np.int64), np.asarray(lat, dtype=np.float64)


def median_by_bucket(kv_lengths, latencies, buckets) -> dict[int, float]:
    """Median step latency per token bucket (transformers-neuronx selection: smallest bucket >= KV length)."""
    by = {}
    for n, dt in zip(kv_lengths, latencies):
        by.setdefault(tnx_find(buckets, int(n)), []).append(float(dt))
    return {b: statistics.median(v) for b, v in sorted(by.items())}


def graph_costs(model) -> list[dict]:
    """Build seconds and saved size of every graph of a model built with ``compiled='export'|'aoti'``, in build
    order (``model.build_report``); ``first_built`` marks the first graph built, whose seconds include the one-time
    warm-up of the compiler machinery in this process."""
    with tempfile.TemporaryDirectory() as d:
        model.save(d)
        manifest = json.loads((Path(d) / "graphs-rank0.json").read_text())
    order = [r["graph"] for r in getattr(model, "build_report", None) or []]
    costs = [{"graph": e["unit"], "kind": e["spec"].get("kind", "mlp"), "seconds": e["build_s"],
              "bytes": e["bytes"]} for e in manifest["graphs"]]
    costs.sort(key=lambda c: order.index(c["graph"]) if c["graph"] in order else len(order))
    for i, c in enumerate(costs):
        c["first_built"] = bool(order) and i == 0 and c["graph"] == order[0]
    return costs


def plot_spreads(ax, xs, spreads, scale: float = 1e3, **kw):
    """Medians of ``spreads`` (:class:`helpers.notebook.figures.Spread`, one per x) with min-max error bars."""
    med = np.array([s.median for s in spreads]) * scale
    lo = med - np.array([s.low for s in spreads]) * scale
    hi = np.array([s.high for s in spreads]) * scale - med
    return ax.errorbar(list(xs), med, yerr=[lo, hi], capsize=3, **kw)


def truncated_normal_lengths(mean: float, spread: float, n: int, lo: int, hi: int, seed: int = 0) -> np.ndarray:
    """``n`` integer lengths ~ Normal(mean, spread / 2) (so mean +/- spread covers ~95%), clipped to [lo, hi]."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.normal(mean, spread / 2, int(n))), lo, hi).astype(np.int64)


def sample_traffic(prompt_mean: float, prompt_spread: float, output_mean: float, n: int, max_length: int,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A sample of ``n`` requests for bucket planning: prompt lengths ~ :func:`truncated_normal_lengths` in
    ``[1, max_length)`` and generated lengths ~ Poisson(``output_mean``), clipped so every request fits
    ``max_length``. Returns (prompt lengths, output lengths)."""
    if not 1 <= prompt_mean < max_length:
        raise ValueError(f"prompt_mean={prompt_mean} must be in [1, {max_length}) (max_length)")
    prompts = truncated_normal_lengths(prompt_mean, prompt_spread, n, 1, max_length - 1, seed)
    outputs = np.clip(np.random.default_rng(seed + 1).poisson(output_mean, int(n)), 1, max_length - prompts)
    return prompts, outputs
