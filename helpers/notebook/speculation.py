"""Measurements behind notebook 05 (speculative sampling), every repeat kept so that the notebook shows spreads
(:mod:`helpers.notebook.figures`): wall times of plain and speculative generation per ``k``, the cost of a
verification and of a draft step in target decode steps, and an account of the measured speedup in the run's own
figures (what Leviathan et al.'s per-round model leaves out).

One timing loop serves both backends: it takes anything with a model's ``sample(input_ids, sequence_length,
top_k=1, eos_token_override=...)``: the reference engine's :class:`SpeculativeGenerator` behind
:class:`GeneratorSampler`, or ``helpers.build_model(bk, target, draft_model_path=..., speculation_length=k)`` on
Neuron (whose ``sample()`` does not report acceptance).
"""
from __future__ import annotations

import statistics
import time

import torch

from ..engine.speculative import expected_speedup
from ..engine.timing import step_seconds
from .figures import Spread


class GeneratorSampler:
    """The reference engine's :class:`~helpers.engine.speculative.SpeculativeGenerator` behind a model's
    ``sample()`` signature; ``stats`` are the generator's (acceptance rate, tokens per round, rounds)."""

    def __init__(self, generator):
        self.generator = generator

    def sample(self, input_ids, sequence_length, top_k=1, eos_token_override=None):
        return self.generator.sample(input_ids, sequence_length, eos_token_id=eos_token_override, top_k=top_k)

    @property
    def stats(self) -> dict:
        return self.generator.stats


def timed_runs(plain, variants: dict, input_ids, sequence_length: int, eos_token_id=None, repeats: int = 5) -> dict:
    """Greedy generation of ``plain`` and of every speculating model of ``variants`` (``name -> model``), after
    one warm-up each, in turn ``repeats`` times (plain first in each round: load on a shared machine hits them
    alike, and every variant is compared with the plain run of its own round).

    ``name -> row``: ``identical`` (token-identical to the plain run), ``new_tokens``, ``plain_s`` / ``spec_s``
    (seconds of every repeat), ``prefill_s`` (the plain runs' time to first token, where the model reports it),
    and the variant's ``acceptance_rate``, ``tokens_per_round``, ``rounds`` where it reports them."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: must be >= 1")
    warm = input_ids.shape[1] + 2

    def timed(model):
        t0 = time.perf_counter()
        out = model.sample(input_ids, sequence_length, top_k=1, eos_token_override=eos_token_id)
        return out, time.perf_counter() - t0

    for model in (plain, *variants.values()):
        model.sample(input_ids, warm, top_k=1)
    plain_s, prefill_s, spec_s, outs = [], [], {name: [] for name in variants}, {}
    for _ in range(repeats):
        ref, t = timed(plain)
        plain_s.append(t)
        ttft = (getattr(plain, "stats", None) or {}).get("ttft_s")
        if ttft is not None:
            prefill_s.append(ttft)
        for name, model in variants.items():
            outs[name], t = timed(model)
            spec_s[name].append(t)
    rows = {}
    for name, model in variants.items():
        stats = getattr(model, "stats", None) or {}
        rows[name] = {"identical": bool(torch.equal(outs[name], ref)), "new_tokens": ref.shape[1] - input_ids.shape[1],
                      "plain_s": list(plain_s), "spec_s": spec_s[name], "prefill_s": list(prefill_s),
                      **{key: stats[key] for key in ("acceptance_rate", "tokens_per_round", "rounds") if key in stats}}
    return rows


def step_rounds(cases: dict, position: int, rounds: int = 5, repeats: int = 3) -> dict:
    """``label -> [seconds per round]``: ``rounds`` calls of :func:`helpers.engine.timing.step_seconds` (the cases
    in turn, one warm-up round, the median of ``repeats`` each), so that a ratio of two cases can be taken round
    by round and shown with its spread."""
    out = {label: [] for label in cases}
    for _ in range(rounds):
        for label, s in step_seconds(cases, position, repeats).items():
            out[label].append(s["median"])
    return out


def ratio_spread(times: dict, a, b) -> Spread:
    """Per round, seconds of case ``a`` over seconds of case ``b`` (from :func:`step_rounds`)."""
    return Spread(x / y for x, y in zip(times[a], times[b]))


def account(row: dict, k: int, draft_steps: float, verify_steps: float) -> dict:
    """The measured speedup of one :func:`timed_runs` row at speculation length ``k`` (reference engine) set against two models, in the run's
    own figures (medians; ``draft_steps``, ``verify_steps``: one draft step and one verification of ``k + 1``
    tokens, in target decode steps).

    - ``leviathan``: Leviathan et al.'s per-round model, ``expected_speedup(acceptance, k, draft, verify)``: it
      assumes every draft position is accepted independently with the mean rate, and counts decode steps only;
    - ``counted``: the same costs with what the run counted instead: its number of target calls (``rounds``) and
      the prefill both runs pay (``prefill_s``, which speculation cannot shorten). One plain decode step is
      ``(plain - prefill) / (new_tokens - 1)``; the speculative run is predicted at ``prefill + rounds * (k *
      draft + verify)`` steps;
    - ``rest_steps_per_round``: what the measured speculative time has beyond that prediction, per target call, in
      decode steps: the loop's host work (drafting, acceptance) and the draft's own prompt encoding.

    ``measured`` is the median of the per-round ratios plain / speculative (the sweep's speedup)."""
    plain, spec = statistics.median(row["plain_s"]), statistics.median(row["spec_s"])
    prefill = statistics.median(row["prefill_s"])
    step = (plain - prefill) / max(1, row["new_tokens"] - 1)
    per_round = k * draft_steps + verify_steps
    predicted = prefill + row["rounds"] * per_round * step
    return {"measured": Spread(p / s for p, s in zip(row["plain_s"], row["spec_s"])).median,
            "leviathan": expected_speedup(row["acceptance_rate"], k, draft_steps, verify_steps),
            "counted": plain / predicted,
            "prefill_share": prefill / plain,
            "decode_tokens_per_call": (row["new_tokens"] - 1) / row["rounds"] if row["rounds"] else 0.0,
            "rest_steps_per_round": (spec - predicted) / step / row["rounds"] if row["rounds"] else 0.0}
