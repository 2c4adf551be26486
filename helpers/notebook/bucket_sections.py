"""Notebook 07 (bucketing), one call per section: the setup and its checks, the timed sections with their spreads
and verdicts, the padding of each bucket set, the plots, the oracle checks and the metrics.

The measurements are :mod:`helpers.notebook.bucket_bench`'s, the bucket rules :mod:`helpers.planning.buckets`' and
the planner :mod:`helpers.planning.bucket_planner`'s; this module only runs them in the notebook's order and says
what they show. A timing is a :class:`~helpers.notebook.figures.Spread` of repeats, a difference one only where
:func:`~helpers.notebook.figures.compare` finds the ranges apart; the padding counts are deterministic (no repeats).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..engine.config import NeuronConfig
from ..model_store import load_config, resolve_model_path
from ..planning import bucket_planner as bp
from ..planning.buckets import (NxDIBucketing, nxdi_context_buckets, nxdi_select, tnx_context_buckets, tnx_find,
                                tnx_token_buckets)
from . import bucket_bench as bb
from .backend import Backend, resolve_backend
from .build import build_model
from .figures import Spread, compare, timing_entries, timing_metric, titled
from .metrics import write_metrics
from .provenance import measured_by, reference_only

POW2, GUIDE = "powers of two", "the guide's list"


@dataclass
class Run:
    """What every section uses: the backend, the model, the notebook's buckets and the lengths it times."""

    bk: Backend
    model_dir: str
    vocab: int
    settings: dict                   # amp, tp_degree
    n_positions: int | list
    context_length_estimate: object  # what the models compile (on NxD Inference: reaching the longest prompt)
    token_buckets: list[int]
    tnx_context: list[int]           # transformers-neuronx's context buckets for the notebook's parameters
    context_buckets: list[int]       # the context buckets the models compile
    prompt_lengths: list[int]
    windows: dict[int, int]          # {token bucket: prompt length of its decode window}
    repeats: int
    decode_steps: int

    @property
    def n_max(self) -> int:
        return self.token_buckets[-1]

    @property
    def rule(self) -> str:
        """How the stack selects a bucket: NxD Inference's strict first-fit, else transformers-neuronx's."""
        return "nxdi" if self.bk.is_neuron and self.bk.stack == "nxdi" else "tnx"

    def build(self, batch_size: int, n_positions, context_length_estimate):
        return build_model(self.bk, self.model_dir, batch_size=batch_size, n_positions=n_positions,
                           context_length_estimate=context_length_estimate, **self.settings)


def setup(*, backend, neuron_stack, device, model_path, amp, tp_degree, n_positions, context_length_estimate,
          prompt_lengths, decode_steps, decode_prompt_len, repeats, prompt_mean, traffic_max) -> Run:
    """Check the parameters (one ValueError naming every problem) and resolve the buckets the models compile."""
    bk = resolve_backend(backend, neuron_stack, device)
    model_dir = resolve_model_path(model_path)
    token_buckets = tnx_token_buckets(n_positions)
    tnx_context = tnx_context_buckets(context_length_estimate, token_buckets)
    n_max = token_buckets[-1]
    if prompt_lengths is None:  # around every context bucket boundary, and past the largest (the tnx cliff)
        prompt_lengths = bb.boundary_lengths(tnx_context, n_max, offset=4, beyond=(tnx_context[-1] + 16,))
    windows = bb.decode_windows(token_buckets, decode_steps, decode_prompt_len)
    problems = [f"prompt length {n} not in [1, {n_max})" for n in prompt_lengths if not 1 <= n < n_max]
    problems += [f"decode_steps={decode_steps} fits in no token bucket {token_buckets}"] * (not windows)
    problems += [f"prompt_mean={prompt_mean} must be in [1, traffic_max={traffic_max})"] * (not 1 <= prompt_mean < traffic_max)
    problems += [f"repeats={repeats} must be 1 or more"] * (int(repeats) < 1)
    if problems:
        raise ValueError("; ".join(problems) + " (see the parameters cell)")
    compiled = context_length_estimate
    if bk.is_neuron and bk.stack == "nxdi":  # NxDI refuses a prompt longer than its largest context bucket
        compiled = nxdi_context_buckets(context_length_estimate, token_buckets, max(prompt_lengths))
    run = Run(bk, model_dir, load_config(model_dir)["vocab_size"], dict(amp=amp, tp_degree=tp_degree), n_positions,
              compiled, token_buckets, tnx_context, tnx_context_buckets(compiled, token_buckets), list(prompt_lengths),
              windows, int(repeats), int(decode_steps))
    print(f"backend: {bk}; n_positions {n_positions} -> token buckets {token_buckets}, context buckets "
          f"{run.context_buckets}\nfigures measured by {measured_by(bk)}")
    return run


# ---------------------------------------------------------------------------------------------- 1. the lists
def bucket_choices(run: Run, nxdi_context: list[int]) -> list[dict]:
    """Print, per prompt length, the context bucket each library picks (transformers-neuronx: smallest >= length,
    then token by token past the largest; NxD Inference: first bucket > length, an error past the largest), then
    what the run's own lengths say about transformers-neuronx's default list on NxD Inference."""
    rows = []
    for n in run.prompt_lengths:
        tnx = (f"context[{tnx_find(run.tnx_context, n)}]" if n <= run.tnx_context[-1]
               else f"context[{run.tnx_context[-1]}] + {n - run.tnx_context[-1]} token steps")
        try:
            nxdi = f"context[{nxdi_select(nxdi_context, n, 'context_encoding_model')}]"
        except ValueError as e:
            nxdi = f"error: {e}"
        rows.append({"prompt": n, "tnx": tnx, "nxdi": nxdi})
        print(f"prompt of {n:5d} tokens -> tnx {tnx:40s} NxDI {nxdi}")
    longest, top = max(run.prompt_lengths), run.tnx_context[-1]
    refused = [n for n in run.prompt_lengths if n >= top]
    print(f"longest prompt timed here: {longest} tokens; transformers-neuronx's context buckets end at {top}: "
          + (f"with that list NxD Inference would refuse {len(refused)} of the {len(run.prompt_lengths)} prompt "
             f"lengths ({refused})" if refused else "every prompt fits that list on NxD Inference too"))
    return rows


# ----------------------------------------------------------------------------------- 2. time to first token
@dataclass
class TTFT:
    bucketed: dict[int, Spread]  # {prompt length: TTFT s}
    single: dict[int, Spread]    # the one-bucket model, at the short prompt and the longest
    short: int                   # the prompt compared on both models
    comparison: object           # figures.Comparison: one full-length bucket against the buckets, at ``short``
    boundaries: dict = field(default_factory=dict)  # {bucket: Comparison of the prompts either side}


def ttft_by_prompt_length(run: Run, bucketed, single) -> TTFT:
    """Time to first token of every prompt length on the bucketed model (``repeats`` each, interleaved), and of the
    prompt nearest 100 tokens and the longest on the one-bucket model (its padding is the same at every length);
    print each with its spread, the step at every context bucket boundary, and the short prompt's comparison."""
    short = min(run.prompt_lengths, key=lambda n: abs(n - 100))
    both = sorted({short, max(run.prompt_lengths)})
    samples = bb.ttft_samples({"bucketed": bucketed, "single": single}, both, repeats=run.repeats, vocab=run.vocab)
    rest = [n for n in run.prompt_lengths if n not in samples["bucketed"]]
    samples["bucketed"].update(bb.ttft_samples({"bucketed": bucketed}, rest, repeats=run.repeats, vocab=run.vocab)["bucketed"])
    ttft_b = {n: Spread(t) for n, t in samples["bucketed"].items()}
    ttft_s = {n: Spread(t) for n, t in samples["single"].items()}
    beyond = " + token steps" if run.rule == "tnx" else ""
    for n in run.prompt_lengths:
        bucket = bp.select(run.context_buckets, n, run.rule) or run.context_buckets[-1]  # the stack's own rule
        where = f"context[{bucket}]" + (beyond if n > run.context_buckets[-1] else "")
        print(f"{n:4d} tokens, {where:24s} bucketed {ttft_b[n].format(1e3, ' ms', 1)}"
              + (f"   single {ttft_s[n].format(1e3, ' ms', 1)}" if n in ttft_s else ""))
    boundaries = {}
    for b in run.context_buckets:  # does TTFT step at the boundary? (the last bucket: the tnx cliff beyond it)
        below = max((n for n in run.prompt_lengths if n <= b), default=None)
        above = min((n for n in run.prompt_lengths if n > b), default=None)
        if below and above:
            boundaries[b] = compare(samples["bucketed"][above], samples["bucketed"][below], f"{above} tokens",
                                    f"{below} tokens")
            print(f"boundary {b}: {boundaries[b].verdict}")
    cmp = compare(samples["single"][short], samples["bucketed"][short], f"one bucket [{run.n_max}]",
                  f"buckets {run.context_buckets}")
    print(f"TTFT of a {short}-token prompt: {cmp}")
    return TTFT(ttft_b, ttft_s, short, cmp, boundaries)


def plot_ttft(run: Run, ttft: TTFT):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = run.prompt_lengths
    bb.plot_spreads(ax, xs, [ttft.bucketed[n] for n in xs], fmt="o-", label=f"buckets {run.context_buckets}")
    bb.plot_spreads(ax, sorted(ttft.single), [ttft.single[n] for n in sorted(ttft.single)], fmt="s--",
                    label=f"one bucket [{run.n_max}]")
    for b in run.context_buckets:
        ax.axvline(b, color="grey", lw=0.5)
    ax.set(xlabel="prompt tokens (context bucket boundaries in grey)", ylabel="TTFT (ms)")
    titled(ax, f"Time to first token ({run.settings['amp']}): median, bars min-max of {run.repeats} repeats", run.bk)
    ax.legend()
    plt.show()


# ------------------------------------------------------------------------------------ 3. decode staircase
@dataclass
class Decode:
    steps: dict[int, dict[int, Spread]]  # {batch: {token bucket: step s}}
    single: dict[int, Spread]            # {batch: step s of the first window on one full-length bucket}
    staircase: dict[int, object]         # {batch: Comparison, last token bucket against the first}
    one_bucket: dict[int, object]        # {batch: Comparison, one full-length bucket against the first bucket}


def decode_staircase(run: Run, batch_sizes) -> Decode:
    """Per batch size: a window of ``decode_steps`` steps in every token bucket and the first window on one
    full-length bucket, timed in turn ``repeats`` times (each repeat: a window's median step); print each window
    and whether the last bucket and the single bucket are measurably apart from the first bucket."""
    first_b, last_b = min(run.windows), max(run.windows)
    out = Decode({}, {}, {}, {})
    for b in batch_sizes:
        # the token buckets compiled as context buckets too: every window's prompt is encoded in one pass
        pair = {"bucketed": run.build(b, run.n_positions, run.token_buckets), "single": run.build(b, [run.n_max], [run.n_max])}
        runs = {(name, t): (lambda m=pair[name], p=run.windows[t]: bb.step_latency(m, p, run.decode_steps + 1, b, run.vocab))
                for name, t in [("bucketed", t) for t in run.windows] + [("single", first_b)]}
        got = bb.interleaved_samples(runs, run.repeats)
        del pair
        out.steps[b] = {t: Spread(got[("bucketed", t)]) for t in run.windows}
        out.single[b] = Spread(got[("single", first_b)])
        out.staircase[b] = compare(got[("bucketed", last_b)], got[("bucketed", first_b)], f"bucket {last_b}",
                                   f"bucket {first_b}")
        out.one_bucket[b] = compare(got[("single", first_b)], got[("bucketed", first_b)], f"one bucket [{run.n_max}]",
                                    f"bucket {first_b}")
        for t, s in out.steps[b].items():
            print(f"batch {b}, token bucket {t:4d} (prompt {run.windows[t]}): step {s.format(1e3, ' ms')}")
        print(f"batch {b}, staircase: {out.staircase[b]}\nbatch {b}, first window on one full-length bucket: "
              f"{out.one_bucket[b]}")
    print("staircase measurable (last bucket's range apart from the first's) at batch:",
          [b for b in batch_sizes if out.staircase[b].measurable] or "none")
    return out


def plot_decode(run: Run, decode: Decode):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    first_b = min(run.windows)
    for b in decode.steps:
        bb.plot_spreads(ax, list(run.windows), list(decode.steps[b].values()), fmt="o-", label=f"batch {b}, bucketed")
        bb.plot_spreads(ax, [first_b], [decode.single[b]], fmt="x", ms=8, label=f"batch {b}, one bucket [{run.n_max}]")
    ax.set(xlabel="token bucket (KV positions a step attends over)", ylabel="ms per decode step", xticks=list(run.windows))
    titled(ax, f"Decode step latency per token bucket: median, bars min-max of {run.repeats} repeats", run.bk)
    ax.legend(fontsize=8)
    plt.show()


# --------------------------------------------------------------------------------- 4. what a bucket costs
def build_costs(run: Run, artifact: str = "export") -> list[dict]:
    """Build (``artifact``: 'export' | 'aoti') and save every graph of the notebook's buckets; print each graph's
    build seconds and size, and the median per graph without the first build (it pays the compiler's warm-up).
    Reference engine only (on Neuron, ``to_neuron()`` / ``compile()`` log each graph's compile time)."""
    if not reference_only(run.bk, "it builds and saves helpers' own graphs to time them; on Neuron, to_neuron() / "
                                  "compile() log each graph's compile time (the recipe cells compile them)"):
        return []
    timed = build_model(run.bk, run.model_dir, n_positions=run.n_positions,
                        context_length_estimate=run.context_length_estimate,
                        neuron_config=NeuronConfig(compiled=artifact), **run.settings)
    costs = bb.graph_costs(timed)
    del timed
    for c in costs:  # in build order
        print(f"{c['graph']:16s} {c['seconds']:7.2f} s  {c['bytes'] / 1e3:8.1f} kB"
              + ("  (first built: includes warm-up)" if c["first_built"] else ""))
    print(f"build seconds per graph, first build left out: {later_builds(costs).format(1, ' s')}")
    print(f"{len(costs)} graphs for {len(run.context_buckets)} context + {len(run.token_buckets)} token buckets")
    return costs


def later_builds(costs: list[dict]) -> Spread:
    """Build seconds of every graph but the first built (all of them when there is only that one)."""
    return Spread([c["seconds"] for c in costs if not c["first_built"]] or [c["seconds"] for c in costs])


def plot_build_costs(run: Run, costs: list[dict], artifact: str = "export"):
    if not costs:
        return
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.2))
    names = [c["graph"] for c in costs]
    hatch = ["//" if c["first_built"] else "" for c in costs]
    a1.barh(names, [c["seconds"] for c in costs], hatch=hatch, color=["lightgrey" if h else "tab:blue" for h in hatch])
    a1.set(xlabel=f"build seconds ({artifact}; hatched: first built, includes warm-up)")
    a2.barh(names, [c["bytes"] / 1e3 for c in costs])
    a2.set(xlabel="saved size (kB)")
    for a in (a1, a2):
        a.invert_yaxis()
    titled(fig, "Cost of each graph, in build order", run.bk)
    fig.tight_layout()
    plt.show()


# ---------------------------------------------------------------------------- 5. buckets from the traffic
@dataclass
class Padding:
    """Padding of each bucket set over a sample of requests: a count, no timing."""

    prompts: np.ndarray
    sets: dict[str, list[int]]       # {name: context buckets}, each holding every sampled prompt
    waste: dict[str, float]          # {name: padded tokens per prompt}
    planned: str                     # the name of the planner's set on the notebook's grid
    overflow: float                  # share of prompts past transformers-neuronx's default largest context bucket
    token: dict[str, float]          # empty KV positions per decode step: default token buckets, planned ones
    token_plan: list[int]
    traffic_max: int

    def ratio(self, name: str) -> float:
        """Padded tokens of set ``name`` over the planner's (how many times more it pads)."""
        return self.waste[name] / max(self.waste[self.planned], 1e-9)


def padding_by_bucket_set(prompts, outputs, plan, max_buckets: int, traffic_max: int, align, rule: str) -> Padding:
    """Padded tokens per prompt of: powers of two from 128, the guide's list, the planner on ``align`` (``plan``)
    and the planner off any grid; then the token buckets' empty KV positions per decode step, default and planned.
    Printed with the sample size; sets that do not hold the longest prompt are left out."""
    pow2 = tnx_token_buckets(traffic_max)
    planned = f"planner, align {align}"
    sets = {POW2: pow2, GUIDE: bp.GUIDE_1500_BUCKETS, planned: list(plan),
            "planner, align 1": bp.plan_buckets(prompts, max_buckets, max_length=traffic_max, rule=rule)}
    sets = {name: b for name, b in sets.items() if prompts.max() <= max(b) <= traffic_max}
    waste = {name: bp.padded_tokens(b, prompts, rule=rule) for name, b in sets.items()}
    default_ctx = tnx_context_buckets(None, pow2)
    overflow = bp.overflow_fraction(default_ctx, prompts)
    kv_lengths, kv_counts = bp.decode_lengths(prompts, outputs)
    token_plan = bp.plan_buckets(kv_lengths, len(pow2), kv_counts, max_length=traffic_max, align=align)
    token = {"default": bp.padded_tokens(pow2, kv_lengths, kv_counts),
             "planner": bp.padded_tokens(token_plan, kv_lengths, kv_counts)}
    out = Padding(prompts, sets, waste, planned, overflow, token, token_plan, int(traffic_max))
    print(f"padded tokens per prompt over {len(prompts)} sampled prompts ({rule} selection):")
    for name, b in sets.items():
        print(f"  {name:22s} {str(b):36s} {waste[name]:7.1f}" + (f"  ({out.ratio(name):.2f} times the planner's)"
                                                                  if name != planned else ""))
    print(f"tnx default context buckets {default_ctx}: {100 * overflow:.0f}% of the prompts are longer than the "
          "largest and continue token by token")
    print(f"token buckets over {int(kv_counts.sum())} decode steps: default {pow2} -> {token['default']:.1f} empty KV "
          f"positions per step; planned {token_plan} -> {token['planner']:.1f}")
    return out


def plot_padding(padding: Padding):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.hist(padding.prompts, bins=60, color="lightgrey", label=f"{len(padding.prompts)} sampled prompt lengths")
    top = ax.get_ylim()[1]
    n = len(padding.sets)
    for i, ((name, b), color) in enumerate(zip(padding.sets.items(), ("tab:red", "tab:blue", "tab:green", "tab:olive"))):
        band = (i * top / n, (i + 1) * top / n)  # one band of the height per set: equal lists stay visible
        ax.vlines(b, *band, colors=color, lw=2, label=f"{name}: {padding.waste[name]:.0f} padded tokens/prompt")
    ax.set(xlabel="tokens (each bucket set in its own band)", ylabel="prompts")
    ax.legend(fontsize=7, loc="upper left")
    titled(ax, "Bucket sets against the sampled traffic", source="computed by helpers.planning.bucket_planner (no measurement)")
    plt.show()


def check_planner(padding: Padding, max_buckets: int, align) -> None:
    """Raise if the unaligned planner pads more than any set of no more buckets (it is optimal over all of them), or
    if the planner on a grid that holds the guide's list pads more than that list."""
    best = padding.waste.get("planner, align 1", padding.waste[padding.planned])
    for name, b in padding.sets.items():
        if len(b) <= max_buckets and best > padding.waste[name] + 1e-9:
            raise AssertionError(f"the planner lost to {name}")
    on_grid = align == bp.GUIDE_ALIGN or (isinstance(align, int) and bp.GUIDE_STEP % align == 0)
    if on_grid and GUIDE in padding.waste and len(bp.GUIDE_1500_BUCKETS) <= max_buckets:
        if padding.waste[padding.planned] > padding.waste[GUIDE] + 1e-9:
            raise AssertionError("the planner lost to the guide's list")


# ------------------------------------------------------------------------ 6. the plan's TTFT, measured
@dataclass
class PlannedTTFT:
    scale: float
    prompts: list[int]
    sets: dict[str, list[int]]
    per_repeat: dict[str, list[float]]  # {set: mean TTFT s over the prompts, per repeat}
    comparison: object                  # powers of two against the planner


def planned_ttft(run: Run, plan, prompt_mean, prompt_spread, n_prompts: int, traffic_max: int, seed: int) -> PlannedTTFT:
    """Two models, context buckets powers of two and ``plan``, both scaled by ``n_max / traffic_max`` (the planned
    traffic too), timed interleaved on ``n_prompts`` sampled prompts ``repeats`` times; each repeat gives the mean
    TTFT over the prompts, and the two sets are compared on those repeats."""
    scale = run.n_max / traffic_max

    def scaled(lengths):
        return sorted({max(1, round(n * scale)) for n in lengths})

    drawn = scaled(bb.truncated_normal_lengths(prompt_mean, prompt_spread, n_prompts, 1, traffic_max - 1, seed + 2).tolist())
    sets = {POW2: scaled(tnx_token_buckets(traffic_max)), "planner": scaled(plan)}
    pair = {name: run.build(1, run.n_positions, ctx) for name, ctx in sets.items()}
    got = bb.ttft_samples(pair, drawn, repeats=run.repeats, vocab=run.vocab)
    del pair
    per_repeat = {name: [float(np.mean([t[n][r] for n in drawn])) for r in range(run.repeats)] for name, t in got.items()}
    cmp = compare(per_repeat[POW2], per_repeat["planner"], POW2, "planner")
    print(f"scaled by {scale:.3f}: context buckets {sets}; {len(drawn)} prompts {drawn}, {run.repeats} repeats")
    print(f"mean TTFT over the {len(drawn)} prompts: {cmp}")
    print(f"(a check on {len(drawn)} prompts x {run.repeats} repeats; the plan rests on the padding count over the whole "
          "sample)")
    return PlannedTTFT(scale, drawn, sets, per_repeat, cmp)


# ------------------------------------------------------------------------------------- 8. the oracle
@dataclass
class Oracle:
    same_tokens: bool
    logit_diff: float | None  # max |logit difference| against one bucket (reference engine only)
    tol: float


def greedy_against_one_bucket(run: Run, new_tokens: int = 24) -> Oracle:
    """Greedy generation with the notebook's buckets against one full-length bucket. Reference engine: the tnx
    buckets and NxD Inference's default buckets, tokens and logits. Neuron: the active stack's buckets, tokens only
    (its sample loop returns no logits)."""
    n_check = min(run.n_max - new_tokens, max(run.prompt_lengths))
    ids = bb.random_prompt(n_check, 1, run.vocab, seed=7)
    length, tol = n_check + new_tokens, (1e-3 if run.settings["amp"] == "f32" else 0.25)
    if run.bk.is_neuron:
        single = run.build(1, [run.n_max], [run.n_max]).sample(ids, length, top_k=1, eos_token_override=[])
        mine = run.build(1, run.n_positions, run.context_length_estimate).sample(ids, length, top_k=1, eos_token_override=[])
        same = torch.equal(mine, single)
        print(f"{run.bk.stack} buckets {run.context_buckets} vs one bucket [{run.n_max}]: same greedy tokens {same}")
        return Oracle(same, None, tol)
    runs = {}
    for name, kw in (("single", dict(n_positions=[run.n_max], context_length_estimate=[run.n_max])),
                     ("tnx", dict(n_positions=run.n_positions, context_length_estimate=run.context_length_estimate)),
                     ("nxdi", dict(n_positions=run.n_max, nxdi_bucketing=NxDIBucketing()))):
        m = build_model(run.bk, run.model_dir, **run.settings, **kw)
        runs[name] = (m.sample(ids, length, top_k=1, eos_token_override=[], output_logits=True), m.stats["logits"])
        del m
    diff = max((runs[k][1] - runs["single"][1]).abs().max().item() for k in ("tnx", "nxdi"))
    same = all(torch.equal(runs[k][0], runs["single"][0]) for k in ("tnx", "nxdi"))
    print(f"{new_tokens} greedy tokens after a {n_check}-token prompt, tnx and NxDI buckets against one bucket: "
          f"same tokens {same}; max |logit diff| {diff:.2e} (tolerance {tol:g})")
    return Oracle(same, diff, tol)


# ------------------------------------------------------------------------------------------- metrics
def write_bucket_metrics(path, run: Run, ttft: TTFT, decode: Decode, costs: list[dict], padding: Padding,
                         planned: PlannedTTFT, prefix_grid_sizes: dict, oracle: Oracle) -> dict:
    """The notebook's key figures (the keys ci/baselines/cpu.json checks among them) to ``path``."""
    p = padding.planned
    metrics = {
        "n_positions": run.n_max, "context_buckets": len(run.context_buckets), "token_buckets": len(run.token_buckets),
        "ttft_prompt_len": ttft.short, "ttft_bucketed_s": ttft.bucketed[ttft.short].median,
        "ttft_single_s": ttft.single[ttft.short].median,
        **timing_entries("ttft_ratio_short_prompt", timing_metric(ttft.comparison, ttft.comparison.ratio, max_width=0.5)),
        "ttft_ratio_short_prompt_measurable": ttft.comparison.measurable,
        **{f"decode_ratio_batch{b}": c.ratio for b, c in decode.one_bucket.items()},
        **{f"decode_ratio_batch{b}_measurable": c.measurable for b, c in decode.one_bucket.items()},
        "staircase_ratio": decode.staircase[max(decode.staircase)].ratio,
        "staircase_measurable": decode.staircase[max(decode.staircase)].measurable,
        "traffic_max": padding.traffic_max,
        "planned_buckets": ",".join(map(str, padding.sets[p])),
        "waste_planner": padding.waste[p], "tnx_default_overflow_fraction": padding.overflow,
        "token_waste_default": padding.token["default"], "token_waste_planner": padding.token["planner"],
        "ttft_pow2_s": Spread(planned.per_repeat[POW2]).median, "ttft_planner_s": Spread(planned.per_repeat["planner"]).median,
        "ttft_speedup_planner": planned.comparison.ratio, "ttft_speedup_planner_measurable": planned.comparison.measurable,
        "ttft_scale": planned.scale, "prefix_caching_buckets_2048": prefix_grid_sizes[2048],
        "bucketed_matches_unbucketed": bool(oracle.same_tokens), "measured_by": measured_by(run.bk),
    }
    if POW2 in padding.waste:  # powers of two up to traffic_max hold every sampled prompt
        metrics.update(waste_pow2=padding.waste[POW2], waste_ratio_pow2_over_planner=padding.ratio(POW2))
    if GUIDE in padding.waste:  # the guide's example traffic
        metrics.update(waste_guide=padding.waste[GUIDE], waste_ratio_guide_over_planner=padding.ratio(GUIDE))
    if "planner, align 1" in padding.waste:
        metrics["waste_planner_unaligned"] = padding.waste["planner, align 1"]
    if costs:  # the reference engine's graphs (section 4)
        metrics.update(graphs=len(costs), build_s_per_graph_median=later_builds(costs).median)
    if oracle.logit_diff is not None:  # the reference engine's logits (section 8)
        metrics["max_logit_diff"] = oracle.logit_diff
    return write_metrics(path, metrics)
