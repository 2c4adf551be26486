"""Measurements behind notebook 05 (speculative sampling), every repeat kept so that the notebook shows spreads
(:mod:`helpers.notebook.figures`): wall times of plain and speculative generation per ``k``, the cost of a
verification and of a draft step in target decode steps, and an account of the measured speedup in the run's own
figures (what Leviathan et al.'s per-round model leaves out).

One timing loop serves both backends: it takes anything with a model's ``sample(input_ids, sequence_length,
top_k=1, eos_token_override=...)``: the reference engine's :class:`SpeculativeGenerator` behind
:class:`GeneratorSampler`, or ``helpers.build_model(bk, target, draft_model_path=..., speculation_length=k)`` on
Neuron (whose ``sample()`` does not report acceptance).

Also: the checks that sampling through a speculation window keeps the target's distribution (total-variation
distance between counts of seeded runs, and the distance chance alone stays under), and the sweeps over ``k`` of
``ci/bench_speculative.py`` (:func:`sweep_k`, :func:`sampler_sweep_k`). The generator, drafts and acceptance rules
are the engine's (``helpers.engine.speculative``), but for :func:`accept_always_broken`, the wrong rule the
distribution checks must catch.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from ..engine.speculative import SpeculativeGenerator
from .figures import Spread
from .timing import step_seconds


def accept_always_broken(draft, q, p, generator=None) -> tuple[int, int]:
    """A deliberately WRONG rule (keeps every draft): used to show the distribution tests fail."""
    return draft.numel(), int(torch.multinomial(p[-1], 1, generator=generator))


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Leviathan et al. 2023, eq. 1: E[tokens per target call] = (1 - alpha^(k+1)) / (1 - alpha)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, cost_ratio: float, verify_ratio: float = 1.0) -> float:
    """Speedup over plain decoding when one round costs ``k * cost_ratio`` draft steps plus one
    verification (``verify_ratio`` target steps: a (k+1)-token forward costs about one decode step
    when decoding is bound by reading the weights)."""
    return expected_tokens_per_round(alpha, k) / (k * cost_ratio + verify_ratio)


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
    """``label -> [seconds per round]``: ``rounds`` calls of :func:`helpers.notebook.timing.step_seconds` (the cases
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


# -- distribution checks -------------------------------------------------------------------------
def tv_distance(a: dict, b: dict) -> float:
    """Total-variation distance between two empirical distributions given as {outcome: count}."""
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a.get(x, 0) / na - b.get(x, 0) / nb) for x in set(a) | set(b))


def tv_bound(n_samples: int, support: int, delta: float = 1e-3) -> float:
    """TV distance that an empirical distribution of ``n_samples`` draws exceeds with probability
    at most ``delta`` (Bretagnolle-Huber-Carol: P(|p_hat - p|_1 >= e) <= 2^V exp(-n e^2 / 2))."""
    return 0.5 * math.sqrt(2 * (support * math.log(2) + math.log(1 / delta)) / n_samples)


def two_sample_tv_bound(n_a: int, n_b: int, support: int, delta: float = 1e-3) -> float:
    """Bound on TV(p_hat_a, p_hat_b) when both come from the same distribution (union bound)."""
    return tv_bound(n_a, support, delta / 2) + tv_bound(n_b, support, delta / 2)


def first_emitted_distribution(acceptor, p: torch.Tensor, q: torch.Tensor | None, draft_fixed=None,
                               n: int = 20000, seed: int = 0) -> dict:
    """Run ``acceptor`` ``n`` times on synthetic target ``p`` [k+1, V] and draft ``q`` [k, V] (drafts
    drawn from q, or ``draft_fixed`` for a deterministic draft) and count the first emitted token."""
    g = torch.Generator().manual_seed(seed)
    counts: dict = {}
    for _ in range(n):
        draft = draft_fixed if q is None else torch.multinomial(q, 1, generator=g).squeeze(1)
        kept, nxt = acceptor(draft, q, p, g)
        x = int(draft[0]) if kept >= 1 else nxt
        counts[x] = counts.get(x, 0) + 1
    return counts


def window_counts(sample_fn, n: int, prompt_len: int, width: int = 2, seed0: int = 0) -> dict:
    """Counts of the generated tokens ``[prompt_len, prompt_len + width)`` over ``n`` seeds;
    ``sample_fn(generator)`` returns [1, seq] ids. Token 1 is the target's own draw, token 2 is
    the first token decided inside a speculation window."""
    counts: dict = {}
    for s in range(n):
        out = sample_fn(torch.Generator().manual_seed(seed0 + s))
        key = tuple(out[0, prompt_len:prompt_len + width].tolist())
        counts[key] = counts.get(key, 0) + 1
    return counts


def sweep_k(build_target, draft_factory, ks, input_ids, sequence_length: int, eos_token_id=None,
            repeats: int = 1) -> list[dict]:
    """Greedy speculation for each k against the plain decode of the same engine: tokens/s, the
    acceptance rate, tokens per target call, and whether the output is token-identical.

    ``build_target(k)`` builds the target (k=0: plain); ``draft_factory()`` a fresh draft. After a
    warm-up, plain and speculative runs alternate ``repeats`` times (load on a shared machine hits
    both alike); the speeds are medians, ``speedup`` is the ratio of median times and
    ``speedup_range`` the (min, max) of the per-repeat ratios."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    plain_model = build_target(0)
    plain_model.sample(input_ids, input_ids.shape[1] + 2, top_k=1)  # warm-up

    def run_plain():
        t0 = time.perf_counter()
        out = plain_model.sample(input_ids, sequence_length, top_k=1, eos_token_override=eos_token_id)
        return out, time.perf_counter() - t0

    rows = []
    for k in ks:
        target = build_target(k)
        gen = SpeculativeGenerator(draft_factory(), target, k)
        gen.sample(input_ids, input_ids.shape[1] + 2)  # warm-up
        plain_s, spec_s = [], []
        for _ in range(repeats):
            plain, t = run_plain()
            plain_s.append(t)
            t0 = time.perf_counter()
            out = gen.sample(input_ids, sequence_length, eos_token_id=eos_token_id)
            spec_s.append(time.perf_counter() - t0)
        n_new = plain.shape[1] - input_ids.shape[1]
        ratios = [p / q for p, q in zip(plain_s, spec_s)]
        rows.append({"k": k, "identical": bool(torch.equal(out, plain)), "new_tokens": n_new,
                     "acceptance_rate": gen.stats["acceptance_rate"], "tokens_per_round": gen.stats["tokens_per_round"],
                     "spec_tokens_per_s": n_new / statistics.median(spec_s),
                     "plain_tokens_per_s": n_new / statistics.median(plain_s),
                     "speedup": statistics.median(plain_s) / statistics.median(spec_s),
                     "speedup_range": (min(ratios), max(ratios)), "repeats": repeats})
    return rows


def sampler_sweep_k(build, ks, input_ids, sequence_length: int, eos_token_id=None, repeats: int = 1) -> list[dict]:
    """Greedy speculation for each k through ``sample()`` alone, on any backend: ``build(k)`` returns a model whose
    ``sample()`` speculates k tokens per step (on Neuron ``helpers.build_model(bk, target, draft_model_path=...,
    speculation_length=k)``), ``build(0)`` the plain target. After a warm-up, plain and speculative runs
    alternate ``repeats`` times; speeds are medians of wall times, ``identical``: token-identical outputs. The
    acceptance rate is not observable through ``sample()``, so it is not reported."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    plain_model = build(0)
    warm = input_ids.shape[1] + 2

    def timed(model):
        t0 = time.perf_counter()
        out = model.sample(input_ids, sequence_length, top_k=1, eos_token_override=eos_token_id)
        return out, time.perf_counter() - t0

    plain_model.sample(input_ids, warm, top_k=1)
    rows = []
    for k in ks:
        spec_model = build(k)
        spec_model.sample(input_ids, warm, top_k=1)
        plain_s, spec_s = [], []
        for _ in range(repeats):
            plain, t = timed(plain_model)
            plain_s.append(t)
            out, t = timed(spec_model)
            spec_s.append(t)
        n_new = plain.shape[1] - input_ids.shape[1]
        ratios = [p / q for p, q in zip(plain_s, spec_s)]
        rows.append({"k": k, "identical": bool(torch.equal(out, plain)), "new_tokens": n_new,
                     "spec_tokens_per_s": n_new / statistics.median(spec_s),
                     "plain_tokens_per_s": n_new / statistics.median(plain_s),
                     "speedup": statistics.median(plain_s) / statistics.median(spec_s),
                     "speedup_range": (min(ratios), max(ratios)), "repeats": repeats})
        del spec_model
    return rows
