"""Notebook 09 (continuous batching): the harness around the lesson, one call each.

- :func:`setup`: resolve the backend and model, validate the parameters, say which sections run here;
- :func:`show_traffic`: print and plot the sampled traffic;
- :func:`show_slot_cache`: what the slots cost in KV-cache memory;
- :func:`replay`: run each policy ``repeats`` times, interleaved, and print each figure as a spread of replays;
- :func:`plot_timelines`, :func:`compare_policies`: the slot timeline, the policies side by side and the verdict;
- :func:`check_answers`: every request against its run alone and Hugging Face ``generate()``;
- :func:`write_metrics`: the key figures for ``ci/baselines/cpu.json``.

Sample sizes: a replay has a few dozen requests, so per replay a figure is the **median and the maximum** over its
requests (a p99 of 24 requests would be their maximum); over the replays it is a :class:`Spread` (median, min-max).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..model_store import load_config, load_hf_model, resolve_model_path
from ..planning.buckets import tnx_context_buckets, tnx_token_buckets
from ..serving import build_slot_model, run_alone
from ..serving.plots import plot_policies, plot_slots
from ..serving.scheduler import RunResult, mismatches
from ..serving.traffic import traffic_summary
from .backend import Backend, resolve_backend
from .build import build_model
from .figures import Comparison, Spread, compare, timing_entries, timing_metric, titled
from .metrics import write_metrics as _write
from .provenance import measured_by, reference_only

# The figures of a replay summarised over the replays (RunResult.summary keys): median and max over its requests.
FIGURES = ("throughput_tok_s", "ttft_median_s", "ttft_max_s", "latency_median_s", "latency_max_s", "wait_max_s",
           "busy_fraction", "span_s")
# The CI baseline asks for a throughput ratio of at least 1.1: replays spread wider than 25% of their median are
# as wide as that margin, so then the claim is reported as not measurable here rather than passed or failed.
MAX_SPREAD = 0.25


@dataclass
class Lab:
    bk: Backend
    model_dir: str
    vocab: int
    settings: dict          # n_positions, context_length_estimate, amp: the engine's settings for every model
    ctx_buckets: list[int]
    on_reference: bool      # sections 1-6 run (the reference engine's slots)


def problems(*, n_positions, context_length_estimate, prompt_len, short_output, long_output, static_batch_size,
             slot_counts, repeats, static_max_wait_s) -> list[str]:
    """What is wrong with the parameters (empty when nothing is)."""
    ctx = tnx_context_buckets(context_length_estimate, tnx_token_buckets(n_positions))
    out = [f"static_batch_size={static_batch_size} is not in slot_counts={slot_counts}"] * (
        static_batch_size not in slot_counts)
    out += [f"prompt_len high {prompt_len[1]} > the largest context bucket {ctx[-1]}"] * (prompt_len[1] > ctx[-1])
    longest = prompt_len[1] + max(long_output[1], short_output[1])
    out += [f"prompt_len high + longest output = {longest} > n_positions={n_positions}"] * (longest > n_positions)
    out += [f"slot_counts={slot_counts}: each must be >= 1"] * any(int(n) < 1 for n in slot_counts)
    out += [f"repeats={repeats}: must be >= 1"] * (int(repeats) < 1)
    out += [f"static_max_wait_s={static_max_wait_s}: seconds >= 0 or None"] * (
        static_max_wait_s is not None and not static_max_wait_s >= 0)
    return out


def setup(*, backend, neuron_stack, device, model_path, amp, n_positions, context_length_estimate, **checked) -> Lab:
    """The backend, the model folder and the engine settings; raises ValueError naming every bad parameter.
    ``checked``: prompt_len, short_output, long_output, static_batch_size, slot_counts, repeats, static_max_wait_s."""
    found = problems(n_positions=n_positions, context_length_estimate=context_length_estimate, **checked)
    if found:
        raise ValueError("; ".join(found) + " (see the parameters cell)")
    bk = resolve_backend(backend, neuron_stack, device)
    model_dir = resolve_model_path(model_path)
    ctx = tnx_context_buckets(context_length_estimate, tnx_token_buckets(n_positions))
    on_ref = reference_only(bk, "sections 1-6 replay traffic through the reference engine's KV-cache slots "
                                "(helpers.serving.SlotModel); the recipe cells above run the NxD Inference loop")
    print(f"backend: {bk}; context buckets {ctx}; figures measured by {measured_by(bk)}")
    return Lab(bk, model_dir, load_config(model_dir)["vocab_size"],
               dict(n_positions=n_positions, context_length_estimate=context_length_estimate, amp=amp), ctx, on_ref)


def show_traffic(requests, seed: int) -> dict:
    """Print the offered load and plot arrivals against tokens asked for (marker size: prompt length)."""
    import matplotlib.pyplot as plt

    offered = traffic_summary(requests)
    print({k: round(v, 2) if isinstance(v, float) else v for k, v in offered.items()})
    fig, ax = plt.subplots(figsize=(8, 2.8))
    ax.scatter([r.arrival_s for r in requests], [r.max_new_tokens for r in requests],
               s=[r.prompt_len for r in requests])
    ax.set(xlabel="arrival (s)", ylabel="tokens asked for")
    titled(ax, "Requests (marker size: prompt length)",
           source=f"sampled by helpers.serving.sample_traffic, seed {seed} (no measurement)")
    plt.show()
    return offered


def show_slot_cache(lab: Lab, n_slots: int) -> int:
    """Build an ``n_slots`` slot model, print its KV cache (total and per slot) and buckets; return the bytes."""
    probe = build_slot_model(lab.model_dir, n_slots=n_slots, device=lab.bk.device, **lab.settings)
    kv = probe.kv_cache_bytes
    print(f"{n_slots} slots x {probe.n_positions} positions: KV cache {kv / 2**20:.1f} MiB "
          f"({kv / n_slots / 2**20:.1f} MiB per slot); token buckets {probe.token_buckets}, "
          f"context buckets {probe.context_buckets}")
    return kv


def replay(policies: dict, repeats: int) -> dict[str, list[RunResult]]:
    """Run every policy (name -> a call that replays the traffic) ``repeats`` times, the policies taking turns so
    that each sees the same drift of the machine's load; print each figure as median (min-max) over the replays."""
    runs: dict[str, list[RunResult]] = {}
    for _ in range(int(repeats)):
        for name, run in policies.items():
            runs.setdefault(name, []).append(run())
    n = len(next(iter(runs.values()))[0].served)
    print(f"{n} requests per replay, {repeats} replays per policy: per replay the median and the max over its "
          f"requests; shown as the median over the replays (min-max)")
    for s in summaries(runs):
        print(f"{s['policy']} {s['slots']}: " + "; ".join(f"{k} {s[k].format(digits=2)}" for k in FIGURES[:-1]))
    return runs


def summaries(runs: dict[str, list[RunResult]]) -> list[dict]:
    """Per policy: its name, slots, requests per replay and a Spread over the replays of each of ``FIGURES``."""
    return [{"policy": rs[0].policy, "slots": rs[0].n_slots, "n": len(rs[0].served),
             **{k: Spread(r.summary()[k] for r in rs) for k in FIGURES}} for rs in runs.values()]


def plot_timelines(runs: dict, static_batch_size: int, static_max_wait_s, bk: Backend) -> list[int]:
    """The first replay of static and continuous batching at the same rows, one bar per request per row; print and
    return how many static batches started short of a full batch (timeout or last batch) per replay."""
    import matplotlib.pyplot as plt

    pair = [runs[f"static {static_batch_size}"][0], runs[f"continuous {static_batch_size}"][0]]
    horizon = max(s.finished_s for r in pair for s in r.served)
    fig, axes = plt.subplots(2, 1, figsize=(10, 1.2 + 0.55 * 2 * static_batch_size), sharex=True)
    for ax, r in zip(axes, pair):
        plot_slots(ax, r, horizon)
    axes[-1].set_xlabel("serving clock (s): wall time of the engine's calls")
    titled(fig, "Which request holds which row (first replay of each policy)", bk)
    plt.tight_layout()
    plt.show()
    short = [int(sum(np.unique([s.admitted_s for s in r.served], return_counts=True)[1] < static_batch_size))
             for r in runs[f"static {static_batch_size}"]]  # a batch's requests share its start
    print(f"static batching: batch timeout static_max_wait_s = {static_max_wait_s} s; batches started short of "
          f"{static_batch_size} requests per replay (timeout or last batch): {short}")
    return short


def compare_policies(runs: dict, static_batch_size: int, slot_counts, bk: Backend) -> tuple[Comparison, dict]:
    """Plot the policies side by side (median over the replays, min-max bars); compare the clock time continuous
    and static batching take to serve the same traffic at the same rows; print the verdict and the throughput
    ratio (static span / continuous span: the same tokens), then the verdict of the largest slot count against the
    smallest. Returns the same-rows comparison and the CI timing claim."""
    import matplotlib.pyplot as plt

    rows = summaries(runs)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    plot_policies(axes, rows)
    titled(fig, f"{rows[0]['n']} requests, {rows[0]['span_s'].n} replays per policy (median, min-max)", bk)
    plt.tight_layout()
    plt.show()
    spans = {p: [r.summary()["span_s"] for r in runs[f"{p} {static_batch_size}"]] for p in ("continuous", "static")}
    same = compare(spans["continuous"], spans["static"], f"continuous {static_batch_size}", f"static {static_batch_size}")
    ratio = 1 / same.ratio
    print(f"time to serve the traffic: {same}")
    print(f"throughput continuous / static at {static_batch_size} rows: {ratio:.2f} (ratio of the median spans)")
    claim = timing_metric(same, ratio, max_width=MAX_SPREAD)
    print("CI timing claim:", claim)
    few, many = min(slot_counts), max(slot_counts)
    if many > few:
        span = {n: [r.summary()["span_s"] for r in runs[f"continuous {n}"]] for n in (few, many)}
        print(f"slot counts: {compare(span[many], span[few], f'continuous {many}', f'continuous {few}')}")
    return same, claim


def check_answers(lab: Lab, requests, runs: dict, hf_check_requests: int) -> tuple[dict, list[bool]]:
    """The oracle: each request alone (``sample()`` at batch 1) and the first ``hf_check_requests`` through Hugging
    Face ``generate()`` (compared up to its first EOS: the replay asks for a fixed length). Returns the request ids
    differing from their run alone, per policy, and Hugging Face's agreement per checked request; raises when the
    run alone did not give every request its tokens."""
    alone = build_model(lab.bk, lab.model_dir, batch_size=1, **lab.settings)
    oracle = run_alone(alone, requests)
    del alone
    if any(len(oracle[r.rid]) != r.max_new_tokens for r in requests):
        raise AssertionError("the run alone did not give every request its number of tokens")
    wrong = {name: sorted({i for r in rs for i in mismatches(r.outputs(), oracle)}) for name, rs in runs.items()}
    hf, hf_same = load_hf_model(lab.model_dir), []
    for r in requests[:hf_check_requests]:
        with torch.inference_mode():
            out = hf.generate(r.prompt[None], attention_mask=torch.ones(1, r.prompt_len, dtype=torch.long),
                              max_new_tokens=r.max_new_tokens, do_sample=False, top_p=None, top_k=None,
                              temperature=None)
        hf_same.append(out[0, r.prompt_len:].tolist() == oracle[r.rid][:out.shape[1] - r.prompt_len])
    print(f"requests differing from their run alone: {wrong}; Hugging Face agrees on {sum(hf_same)}/{len(hf_same)}")
    return wrong, hf_same


def write_metrics(path, lab: Lab, params: dict, offered: dict | None = None, runs: dict | None = None,
                  same: Comparison | None = None, claim: dict | None = None, wrong: dict | None = None,
                  hf_same: list | None = None) -> dict:
    """The key figures (``ci/baselines/cpu.json`` checks some): the parameters, then on the reference engine the
    offered load, the timing claim, the oracle's verdicts and each policy's medians over the replays."""
    metrics = {"measured_by": measured_by(lab.bk), **params}
    if runs:
        metrics.update(offered_rate_per_s=offered["offered_rate_per_s"], tokens_asked=offered["tokens_asked"],
                       **timing_entries("throughput_ratio_same_size", claim), same_size_verdict=same.verdict,
                       outputs_match_alone=not any(wrong.values()), hf_agrees=all(hf_same))
        for s in summaries(runs):
            for key in FIGURES[:6]:
                metrics[f"{s['policy']}{s['slots']}_{key}"] = s[key].median
    return _write(path, metrics)
