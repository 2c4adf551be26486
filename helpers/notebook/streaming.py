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
from dataclasses import dataclass

import torch
from transformers.generation.streamers import BaseStreamer

from ..model_store import load_hf_model
from ..neuron.tracking import TokenRecorder
from ..planning.dtypes import amp_dtype
from ..prompts import hf_greedy
from .figures import Comparison, Spread, compare, timing_entries, timing_metric
from .prompt_setup import PromptSetup, prompt_setup
from .provenance import measured_by

# Fewer inter-token gaps than this and a p90 is little more than the largest of them: not printed.
MIN_SAMPLES_FOR_P90 = 20


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


def setup_streaming(backend, neuron_stack, device, seed, model_path, prompt, batch_size, n_positions,
                    max_new_tokens, repeats) -> PromptSetup:
    """Notebook 03's setup cell: its knobs checked, then :func:`prompt_setup.prompt_setup`."""
    if max_new_tokens < 2 or repeats < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}, repeats={repeats}: use max_new_tokens >= 2 (inter-token "
                         "latency needs two tokens), repeats >= 1")
    return prompt_setup(backend, neuron_stack, device, seed, model_path, [prompt], batch_size, n_positions,
                        max_new_tokens)


def per_token_times(stats: dict) -> bool:
    """Whether the model timed each token as it was produced (False on NxD Inference, whose generate hands the
    streamer every token after it returns: helpers.build_model's adapter records no ``ttft_s``)."""
    return stats.get("ttft_s") is not None


def describe_stream(times: list[float], stats: dict) -> str:
    """What one streamed generation showed: TTFT and the inter-token latencies (their spread; a p90 only with
    enough of them), or, where the tokens were handed over after generate returned, that they are no latencies."""
    if not per_token_times(stats):
        return (f"NxD Inference: the streamer got all {len(times)} tokens after generate() returned "
                f"({stats['total_s']:.3f} s; helpers.build_model hands them over then, the adapter drives no streamer "
                "per token): its times are deliveries, not TTFT or inter-token latency")
    line = f"TTFT {1e3 * times[0]:.1f} ms (this one run; section 4 repeats it)"
    if len(times) < 2:
        return line
    itl = Spread(b - a for a, b in zip(times, times[1:]))
    line += f"; inter-token latency over its {itl.n} steps: {itl.format(1e3, ' ms')}"
    if itl.n >= MIN_SAMPLES_FOR_P90:
        line += f", p90 {1e3 * latency_stats(times)['itl_p90_s']:.1f} ms"
    return line


def plot_stream_latency(times: list[float]):
    """TTFT as one bar at token 1, then each later step's latency (token n's arrival minus token n-1's). Returns
    the figure; title it with ``titled(fig, ..., bk)``."""
    import matplotlib.pyplot as plt

    itl_ms = [1000 * (b - a) for a, b in zip(times, times[1:])]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.bar([1], [1000 * times[0]], width=0.8, color="tab:red", label="time to first token (context encoding)")
    ax.plot(range(2, len(itl_ms) + 2), itl_ms, marker=".", ls="-", label="inter-token latency of step n")
    ax.set(xlabel="generated token #", ylabel="ms", xlim=(0, len(itl_ms) + 2))
    ax.legend()
    return fig


class ClockedStreamer(TimingStreamer):
    """A :class:`TimingStreamer` that also sums the time spent inside its own ``put`` calls (``put_s``)."""

    def reset(self, start: float | None = None):
        super().reset(start)
        self.put_s = 0.0

    def put(self, value):
        t0 = time.perf_counter()
        super().put(value)
        self.put_s += time.perf_counter() - t0


@dataclass(frozen=True)
class StreamingCost:
    """What streaming cost over ``repeats`` interleaved generations: the share of each generation spent inside the
    streamer's ``put`` (measured directly), the whole generation with a streamer against without, and the TTFT of
    the streamed runs."""

    put_share: Spread
    with_without: Comparison
    ttft: Spread

    @property
    def overhead_pct(self) -> float:
        """Ratio of the medians with/without, as a percentage above 1 (a difference only if ``measurable``)."""
        return 100 * (self.with_without.ratio - 1)

    def report(self) -> str:
        cmp = self.with_without
        lines = [f"time inside the streamer's put() calls: {self.put_share.format(100, ' %', 3)} of each generation"]
        if cmp.a.n < 2:
            lines.append(f"with a streamer: {cmp.a.format(1, ' s')}; without: {cmp.b.format(1, ' s')}; one run each "
                         "(repeats=1): no spread, so no verdict on the streaming overhead")
        elif cmp.measurable:
            lines += [str(cmp), f"streaming overhead, whole generation: {self.overhead_pct:+.1f}% (ratio of the medians)"]
        else:
            lines += [str(cmp), f"streaming overhead, whole generation: no difference measurable here (medians "
                      f"{self.overhead_pct:+.1f}% apart, inside the run-to-run spread); the direct measurement above "
                      "is the streamer's cost"]
        return "\n".join(lines)


def streaming_cost(generate, repeats: int) -> StreamingCost:
    """Time ``generate(streamer)`` with a :class:`ClockedStreamer` and with None, interleaved ``repeats`` times so
    that load on the machine hits both alike."""
    with_s, without_s, put_share, ttfts = [], [], [], []
    for _ in range(max(1, int(repeats))):
        clocked = ClockedStreamer()
        for streamer, bucket in ((clocked, with_s), (None, without_s)):
            if streamer is not None:
                streamer.reset()
            t0 = time.perf_counter()
            generate(streamer)
            bucket.append(time.perf_counter() - t0)
        put_share.append(clocked.put_s / with_s[-1])
        ttfts.append(clocked.times[0] if clocked.times else float("nan"))
    return StreamingCost(Spread(put_share), compare(with_s, without_s, "with a streamer", "without"), Spread(ttfts))


def hf_agreement(model_dir, enc, generated: torch.Tensor, amp: str) -> tuple[int, int]:
    """(steps, compared): for how many leading steps every row of ``generated`` (new tokens only) equals Hugging
    Face ``generate()`` greedy on the same checkpoint in ``amp``, out of the steps both produced."""
    prompt_len = enc.input_ids.shape[1]
    ref = hf_greedy(load_hf_model(model_dir, dtype=amp_dtype(amp)), enc, generated.shape[1])[:, prompt_len:]
    n = min(ref.shape[1], generated.shape[1])
    same = (ref[:, :n] == generated[:, :n]).all(0)
    return int(same.long().cumprod(0).sum()), n


def streaming_metrics(bk, streamer: TimingStreamer, stats: dict, cost: StreamingCost, agree: int, n: int,
                      batch_size: int, amp: str) -> dict:
    """Notebook 03's key figures (the keys ci/baselines/cpu.json checks among them)."""
    cmp = cost.with_without
    m = {"streamed_tokens": int(streamer.tokens.numel()), "hf_agreement_steps": agree, "hf_compared_steps": n,
         "streamer_put_pct_of_generation": 100 * cost.put_share.median, "batch_size": batch_size, "amp": amp,
         "with_streamer_s": cmp.a.median, "without_streamer_s": cmp.b.median, "overhead_measurable": cmp.measurable,
         "measured_by": measured_by(bk)}
    # a timing claim: None (and why) where the repeats spread more than 25% of their median, the bound it is tested
    # against (ci/baselines): a wider spread could hide or fake an overhead of that size
    m.update(timing_entries("streaming_overhead_pct", timing_metric(cmp, cost.overhead_pct, max_width=0.25)))
    if per_token_times(stats):
        lat = latency_stats(streamer.times)
        m.update({k: lat[k] for k in ("itl_median_s", "itl_p90_s", "decode_tokens_per_s")})
        m["ttft_s"] = cost.ttft.median
    else:  # NxD Inference: only the whole generation is timed
        m["generate_s"] = stats["total_s"]
    return m
