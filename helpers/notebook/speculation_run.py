"""Notebook 05's experiment, one call per step: the setup (parameters checked, target and drafts built), the draft
survey, the sweep over ``k``, the cost of a verification and of a draft step, the account of the measured speedup
against two models, the sampled-distribution test, the plots and the metrics.

The measurements themselves are :mod:`helpers.notebook.speculation`'s (every repeat kept, shown as a
:class:`~helpers.notebook.figures.Spread`); this module only runs them in the notebook's order and prints them. The
assertions against the oracles (greedy output token-identical to the target alone, a verification cheaper than
``k + 1`` steps, the distribution test) stay in the notebook, on the values these calls return.

On ``backend="neuron"`` only the sweep runs, through the library's own speculation with the truncated draft
checkpoint; the rest needs the reference engine's internals and says so (:func:`provenance.reference_only`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..engine.speculative import ModelDraft, PromptLookupDraft, SpeculativeGenerator, accept_rejection
from ..model_store import load_tokenizer, resolve_model_path, write_truncated_draft
from ..planning.buckets import nxdi_context_buckets, tnx_token_buckets
from ..prompts import SPECULATION_TASKS, encode_prompts
from .backend import Backend, resolve_backend
from .build import build_model
from .figures import Spread, compare, timing_entries, timing_metric, titled
from .provenance import measured_by, reference_only
from .speculation import (GeneratorSampler, accept_always_broken, account, ratio_spread, step_rounds, timed_runs,
                          tv_distance, two_sample_tv_bound, window_counts)


def check_parameters(task, survey_tasks, ks, k, top_k, temperature, dist_samples, repeats) -> list[int]:
    """Refuse values the notebook cannot run; return ``ks`` sorted without repeats."""
    unknown = sorted({task, *survey_tasks} - set(SPECULATION_TASKS))
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}: choose from {sorted(SPECULATION_TASKS)}")
    if not ks or min(ks) < 1 or k < 1 or top_k < 2 or temperature <= 0 or dist_samples < 10 or repeats < 3:
        raise ValueError("ks must be positive ints; k 1 or more; top_k 2 or more (sampling); temperature above 0; "
                         "dist_samples 10 or more; repeats 3 or more (a spread needs repeats)")
    return sorted(set(ks))


def speedups(row: dict) -> Spread:
    """Plain over speculative seconds, round by round (each round's speculative run against its own plain run)."""
    return Spread(p / s for p, s in zip(row["plain_s"], row["spec_s"]))


@dataclass
class Costs:
    """What one forward costs, in target decode steps, round by round (reference engine)."""
    verify: dict      # k -> Spread: a forward over k + 1 tokens / a one-token step of the same target
    steps: dict       # k -> [seconds per round] (0: the one-token step)
    draft: Spread     # one truncated-draft step / one target step
    rounds: int


@dataclass
class SpeculationRun:
    """The notebook's models and prompts; the methods are its sections."""
    bk: Backend
    tok: object
    model_dir: object
    draft_path: object
    input_ids: object      # the sweep's prompt, [1, L]
    survey_ids: dict       # task -> [1, L]
    ks: list
    amp: str
    n_positions: int
    max_new_tokens: int
    repeats: int
    draft_layers: int
    plain: object = None
    draft_model: object = None
    drafts: dict = field(default_factory=dict)    # name -> a fresh draft
    targets: dict = field(default_factory=dict)   # k -> the target built for k (only the latest kept)

    @property
    def seq_len(self) -> int:
        return self.input_ids.shape[1] + self.max_new_tokens

    @property
    def eos(self):
        return self.tok.eos_token_id

    @property
    def model_draft_name(self) -> str:
        return f"truncated_{self.draft_layers}L"

    def target(self, k: int = 0, path=None, **kw):
        """The reference engine's target built for ``k`` drafts per step (``enable_speculative_decoder(k)`` before
        ``to_neuron()``, as on Neuron; 0: plain), or another checkpoint (``path``) the same way."""
        return build_model(self.bk, path or self.model_dir, n_positions=self.n_positions, amp=self.amp,
                           speculation_length=k, **kw)

    def neuron_model(self, k: int = 0):
        """The Neuron library's model, speculating ``k`` tokens per step with the truncated draft checkpoint (0: plain)."""
        spec = dict(draft_model_path=str(self.draft_path), speculation_length=k) if k else {}
        if self.bk.stack == "nxdi":  # NxDI refuses a prompt longer than its largest context bucket (notebook 07)
            longest = max(ids.shape[1] for ids in (self.input_ids, *self.survey_ids.values()))
            spec["context_length_estimate"] = nxdi_context_buckets(None, tnx_token_buckets(self.n_positions), longest)
        return build_model(self.bk, self.model_dir, batch_size=1, n_positions=self.n_positions, amp=self.amp, **spec)

    def spec_target(self, k: int):
        """The reference target built for ``k``, kept until another ``k`` is asked for (one at a time: memory)."""
        if k not in self.targets:
            self.targets.clear()
            self.targets[k] = self.target(k)
        return self.targets[k]

    def speculating(self, k: int) -> dict:
        """Every draft in front of one target built for ``k``, behind a model's ``sample()``."""
        return {name: GeneratorSampler(SpeculativeGenerator(make(), self.spec_target(k), k))
                for name, make in self.drafts.items()}

    def _rows(self, runs: dict, k: int, label: str) -> list[dict]:
        rows = []
        for name, r in runs.items():
            c, ratios = compare(r["spec_s"], r["plain_s"], label or name, "plain decode"), speedups(r)
            rows.append({**r, "draft": name, "k": k, "speedup": ratios.median, "ratios": ratios, "verdict": c.verdict})
            acc = (f"accept {r['acceptance_rate']:.2f}  tokens/call {r['tokens_per_round']:.2f}  "
                   if "acceptance_rate" in r else "")
            print(f"{name:15s} k={k}  {acc}speedup {ratios.median:.2f}x (median of {ratios.n} rounds, "
                  f"min {ratios.low:.2f}, max {ratios.high:.2f})\n    {c}")
        return rows

    def survey(self) -> list[dict]:
        """Both drafts on each survey task at the largest ``k``, greedy, ``repeats`` rounds (reference engine)."""
        if not reference_only(self.bk, "it compares acceptance rates, which the Neuron speculation loops do not "
                                       "report, and prompt lookup, for which helpers' Neuron path has no draft"):
            return []
        k, rows = max(self.ks), []
        for task, ids in self.survey_ids.items():
            print(f"task {task!r}:")
            runs = timed_runs(self.plain, self.speculating(k), ids, ids.shape[1] + self.max_new_tokens, self.eos,
                              self.repeats)
            rows += [{**r, "task": task} for r in self._rows(runs, k, "")]
        best = max(rows, key=lambda r: r["speedup"])
        print(f"highest median speedup: {best['draft']} on {best['task']!r} ({best['speedup']:.2f}x, "
              f"acceptance {best['acceptance_rate']:.2f})")
        return rows

    def sweep(self, survey_rows=(), task: str | None = None) -> dict:
        """``name -> [row per k]``: greedy speculation against plain decode for every ``k``. On Neuron, the library's
        speculation with the truncated draft. A row the survey measured already (largest ``k`` on ``task``) is
        reused, not measured twice."""
        sweeps: dict = {}
        for k in self.ks:
            reused = [r for r in survey_rows if r["task"] == task and r["k"] == k]
            if reused:
                runs = {r["draft"]: r for r in reused}
            elif self.bk.is_neuron:
                runs = timed_runs(self.plain, {self.model_draft_name: self.neuron_model(k)}, self.input_ids,
                                  self.seq_len, self.eos, self.repeats)
            else:
                runs = timed_runs(self.plain, self.speculating(k), self.input_ids, self.seq_len, self.eos, self.repeats)
            for row in self._rows(runs, k, f"k={k}"):
                sweeps.setdefault(row["draft"], []).append(row)
        print("measured by", measured_by(self.bk))
        return sweeps

    def costs(self) -> Costs | None:
        """A verification of ``k + 1`` tokens and a truncated-draft step, in target decode steps, ``2 * repeats + 1``
        rounds, timed alternately at the slot after the prompt (``helpers.notebook.timing.step_seconds``)."""
        if not reference_only(self.bk, "it needs the draft's and the verification's cost per step, which the "
                                       "Neuron speculation loops do not report"):
            return None
        top = max(self.ks)
        target = self.spec_target(top)
        rounds, position = 2 * self.repeats + 1, self.input_ids.shape[1]
        steps = step_rounds({0: (target, 1), **{k: (target, k + 1) for k in self.ks}}, position, rounds=rounds)
        draft = step_rounds({"draft": (self.draft_model, 1), "target": (self.plain, 1)}, position, rounds=rounds)
        costs = Costs({k: ratio_spread(steps, k, 0) for k in self.ks}, steps, ratio_spread(draft, "draft", "target"),
                      rounds)
        self.targets.clear()  # memory for the distribution test's models
        print(f"k   tokens verified   cost in decode steps (median, min-max over {rounds} rounds)")
        for k, v in costs.verify.items():
            print(f"{k:<3d} {k + 1:<17d} {v}")
        print(compare(steps[top], steps[0], f"verifying {top + 1} tokens", "one decode step"))
        w = self.draft_model.model.w
        print(f"one truncated-draft step: {costs.draft} target steps; its LM head is {w.lm_head.nbytes / 1e6:.0f} MB "
              f"of its {self.draft_model.weight_bytes / 1e6:.0f} MB (the target: {self.plain.weight_bytes / 1e6:.0f} MB)")
        return costs

    def accounts(self, sweeps: dict, costs: Costs | None) -> dict:
        """``(draft, k) -> account``: the measured speedup beside Leviathan et al.'s model and the counted one
        (:func:`helpers.notebook.speculation.account`), and whether the counted figure lies within the rounds'
        range. Printed as a table; nothing is claimed beyond it."""
        if costs is None:
            return {}
        per_step = {"prompt_lookup": 0.0, self.model_draft_name: costs.draft.median}
        out, inside, negative = {}, 0, 0
        print("draft            k   measured (min-max)     model  counted | prefill  decode tokens/call  "
              "rest per call (steps)")
        for name, rows in sweeps.items():
            for r in rows:
                a = out[(name, r["k"])] = account(r, r["k"], per_step[name], costs.verify[r["k"]].median)
                a["counted_in_range"] = r["ratios"].low <= a["counted"] <= r["ratios"].high
                inside, negative = inside + a["counted_in_range"], negative + (a["rest_steps_per_round"] < 0)
                print(f"{name:15s} {r['k']:>2d}  {a['measured']:5.2f}x ({r['ratios'].low:.2f}-{r['ratios'].high:.2f})"
                      f"  {a['leviathan']:6.2f}x {a['counted']:7.2f}x | {a['prefill_share']:6.0%} "
                      f"{a['decode_tokens_per_call']:19.2f} {a['rest_steps_per_round']:14.2f}")
        print(f"counted model within the rounds' min-max: {inside} of {len(out)} rows; rest per call below zero "
              f"(the run faster than the separately timed steps predict): {negative} of {len(out)} rows")
        return out

    def distribution_test(self, k: int, top_k: int, temperature: float, dist_samples: int, dist_prompt: str,
                          seed: int, delta: float = 1e-3) -> dict | None:
        """The first two generated tokens over ``dist_samples`` seeds, target alone against speculation with the
        truncated draft (rejection sampling), and with a broken rule that keeps every draft. Returns the two
        total-variation distances, the bound the same distribution stays under with probability ``1 - delta``, and
        what this sample size can detect (:func:`detectable_tv`)."""
        if not reference_only(self.bk, "on Neuron helpers speculates greedily only (transformers-neuronx gets a "
                                       "greedy acceptor; NxD Inference's assisted loop takes the argmax)"):
            return None
        ids = self.tok(dist_prompt, return_tensors="pt").input_ids
        n0, small = ids.shape[1], dict(context_length_estimate=16)
        spec_target, plain_target = self.target(k, **small), self.target(0, **small)
        small_draft = self.target(0, self.draft_path, **small)
        kw = dict(top_k=top_k, temperature=float(temperature))
        plain = window_counts(lambda g: plain_target.sample(ids, n0 + 2, generator=g, **kw), dist_samples, n0,
                              seed0=seed + 10**6)

        def tv_of(acceptor):
            gen = SpeculativeGenerator(ModelDraft(small_draft), spec_target, k, acceptor=acceptor)
            spec = window_counts(lambda g: gen.sample(ids, n0 + 2, generator=g, **kw), dist_samples, n0, seed0=seed)
            return tv_distance(spec, plain)

        support = top_k ** 2
        out = {"tv": tv_of(accept_rejection), "tv_broken": tv_of(accept_always_broken),
               "bound": two_sample_tv_bound(dist_samples, dist_samples, support, delta),
               "detectable": detectable_tv(dist_samples, support, delta), "samples": dist_samples}
        print(f"TV(speculative, target alone) = {out['tv']:.3f}; broken rule {out['tv_broken']:.3f}; bound "
              f"{out['bound']:.3f} ({dist_samples} runs each, {support} outcomes, delta {delta})")
        if out["detectable"] < 1:
            sure = (f"a change of TV above {out['detectable']:.2f} is caught with probability {1 - delta}; a smaller "
                    "one may pass")
        else:
            sure = (f"no change is certain to be caught (that needs a TV above {out['detectable']:.2f}, and TV is at "
                    "most 1): the test rules out only gross errors, such as the broken rule's")
        print(f"what {dist_samples} runs per method can detect: {sure}. Catching a TV of 0.1 for sure would take "
              f"{samples_to_detect(0.1, support, delta)} runs per method.")
        return out

    def plot_survey(self, rows: list[dict]):
        """Speedup per task and draft, median with the rounds' min-max."""
        if not rows:
            return
        import matplotlib.pyplot as plt

        tasks, names = list(dict.fromkeys(r["task"] for r in rows)), list(dict.fromkeys(r["draft"] for r in rows))
        fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
        width = 0.8 / len(names)
        for j, name in enumerate(names):
            spreads = [next(r for r in rows if r["task"] == t and r["draft"] == name)["ratios"] for t in tasks]
            med = np.array([s.median for s in spreads])
            err = [med - [s.low for s in spreads], [s.high for s in spreads] - med]
            ax.bar(np.arange(len(tasks)) + j * width, med, width, yerr=err, capsize=3, label=name)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(tasks)) + width * (len(names) - 1) / 2, tasks)
        ax.set(ylabel=f"speedup at k={rows[0]['k']}")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
        titled(ax, f"which draft pays, per task (median of {self.repeats} rounds, bars: min-max)", self.bk)
        plt.show()

    def plot_sweep(self, sweeps: dict, accounts: dict, costs: Costs | None):
        """Speedup per k (measured with its spread, the two models), acceptance per k, the verification's cost."""
        if costs is None:
            return
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), layout="constrained")
        for j, (name, rows) in enumerate(sweeps.items()):
            kk, spreads = [r["k"] for r in rows], [r["ratios"] for r in rows]
            med = np.array([s.median for s in spreads])
            axes[0].errorbar(kk, med, yerr=[med - [s.low for s in spreads], [s.high for s in spreads] - med],
                             fmt="o-", color=f"C{j}", capsize=3, label=f"{name}: measured")
            for key, style in (("leviathan", "x--"), ("counted", "+:")):
                axes[0].plot(kk, [accounts[(name, k)][key] for k in kk], style, color=f"C{j}", label=f"{name}: {key}")
            axes[1].plot(kk, [r["acceptance_rate"] for r in rows], "o-", color=f"C{j}", label=name)
        axes[0].axhline(1.0, color="k", lw=0.8)
        axes[0].set(xlabel="k", ylabel="speedup vs plain decode", title="speedup (bars: min-max of the rounds)")
        axes[1].set(xlabel="k", ylabel="acceptance rate", title="draft tokens accepted", ylim=(-0.05, 1.05))
        ks, v = list(costs.verify), list(costs.verify.values())
        med = np.array([s.median for s in v])
        axes[2].errorbar(ks, med, yerr=[med - [s.low for s in v], [s.high for s in v] - med], fmt="o-", capsize=3,
                         label=f"measured (min-max of {costs.rounds})")
        axes[2].plot(ks, [k + 1 for k in ks], ":", color="gray", label="k + 1 separate steps")
        axes[2].axhline(1.0, color="k", lw=0.8)
        axes[2].set(xlabel="k", ylabel="decode steps", title="cost of verifying k + 1 tokens")
        for ax in axes:  # below each plot, never over a curve
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2 if ax is axes[0] else 1)
        titled(fig, f"speculation per k (median of {self.repeats} rounds)", self.bk)
        plt.show()

    def metrics(self, survey_rows, sweeps, costs: Costs | None, accounts: dict, dist: dict | None) -> dict:
        """The key figures ``ci/baselines/cpu.json`` checks, and the rest of the run's, flat."""
        best = {name: max(rows, key=lambda r: r["speedup"]) for name, rows in sweeps.items()}
        m = {f"{n}_best_speedup": b["speedup"] for n, b in best.items()}
        m.update({f"{n}_best_k": b["k"] for n, b in best.items()})
        for n, rows in sweeps.items():
            for r in rows:
                m.update({f"{n}_speedup_k{r['k']}": r["speedup"], f"{n}_speedup_k{r['k']}_low": r["ratios"].low,
                          f"{n}_speedup_k{r['k']}_high": r["ratios"].high})
        first = next(iter(sweeps.values()))[0]
        m.update(greedy_identical=all(r["identical"] for rows in sweeps.values() for r in rows),
                 measured_by=measured_by(self.bk), repeats=self.repeats,
                 plain_tokens_per_s=first["new_tokens"] / Spread(first["plain_s"]).median)
        if self.bk.is_neuron:
            return m
        m.update({f"{n}_acceptance_k{r['k']}": r["acceptance_rate"] for n, rows in sweeps.items() for r in rows})
        if dist:
            m.update(tv_speculative=dist["tv"], tv_broken=dist["tv_broken"], tv_bound=dist["bound"],
                     tv_detectable=dist["detectable"])
        if costs is not None:
            m["draft_cost_ratio"] = costs.draft.median
            # A timing claim, reported as not measurable where the rounds spread too far (ci/baselines); its value is
            # the cheapest round's ratio: load on a shared machine only adds time.
            for k in self.ks:
                c = compare(costs.steps[k], costs.steps[0], f"verify k={k}", "decode step")
                m.update(timing_entries(f"verify_cost_k{k}", timing_metric(c, costs.verify[k].low)))
        for (n, k), a in accounts.items():
            m.update({f"{n}_model_k{k}": a["leviathan"], f"{n}_counted_k{k}": a["counted"],
                      f"{n}_counted_in_range_k{k}": a["counted_in_range"]})
        m.update({f"survey_{r['task']}_{r['draft']}_speedup": r["speedup"] for r in survey_rows})
        m.update({f"survey_{r['task']}_{r['draft']}_acceptance": r["acceptance_rate"] for r in survey_rows})
        if survey_rows:
            m.update(survey_identical=all(r["identical"] for r in survey_rows),
                     chosen_draft=max(survey_rows, key=lambda r: r["speedup"])["draft"])
        return m


def detectable_tv(n: int, support: int, delta: float = 1e-3) -> float:
    """The smallest true total-variation distance between two distributions that the two-sample test at ``n`` runs
    each is certain (probability ``1 - delta``) to flag: twice its bound (each empirical distribution may sit a
    bound's half away from its own; the triangle inequality). At or above 1, no difference is certain to be seen."""
    return 2 * two_sample_tv_bound(n, n, support, delta)


def samples_to_detect(tv: float, support: int, delta: float = 1e-3) -> int:
    """Runs per method for :func:`detectable_tv` to reach ``tv``."""
    if not 0 < tv <= 1:
        raise ValueError(f"tv={tv}: must be in (0, 1]")
    lo, hi = 1, 1
    while detectable_tv(hi, support, delta) > tv:
        hi *= 2
    while lo < hi:  # the smallest n that reaches tv
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if detectable_tv(mid, support, delta) <= tv else (mid + 1, hi)
    return lo


def setup(backend, neuron_stack, model_path, device, amp, n_positions, task, prompt, survey_tasks, max_new_tokens, ks,
          repeats, draft_layers, draft_dir, k, top_k, temperature, dist_samples) -> SpeculationRun:
    """The parameters checked, the backend resolved, the prompts encoded, the truncated draft written, and the
    plain target (and on the reference engine the draft model and the drafts) built."""
    ks = check_parameters(task, survey_tasks, ks, k, top_k, temperature, dist_samples, repeats)
    bk = resolve_backend(backend, neuron_stack, device)
    model_dir = resolve_model_path(model_path)
    tok = load_tokenizer(model_dir)
    ids = encode_prompts(tok, [prompt or SPECULATION_TASKS[task]], 1).input_ids
    survey = {t: encode_prompts(tok, [SPECULATION_TASKS[t]], 1).input_ids for t in survey_tasks}
    longest = max([ids.shape[1], *(s.shape[1] for s in survey.values())])
    if longest + max_new_tokens + max(ks) + 1 > n_positions:
        raise ValueError(f"prompt {longest} + {max_new_tokens} new + k {max(ks)} exceeds n_positions={n_positions}: "
                         "raise n_positions")
    run = SpeculationRun(bk, tok, model_dir, write_truncated_draft(model_dir, draft_layers, draft_dir), ids, survey,
                         ks, amp, n_positions, max_new_tokens, repeats, draft_layers)
    run.plain = run.neuron_model(0) if bk.is_neuron else run.target(0)  # the target alone, timed beside every draft
    if not bk.is_neuron:
        run.draft_model = run.target(0, run.draft_path)
        run.drafts = {"prompt_lookup": lambda: PromptLookupDraft(ngram=3),
                      run.model_draft_name: lambda: ModelDraft(run.draft_model)}
    print(f"backend: {bk}; prompt {ids.shape[1]} tokens; draft: first {draft_layers} layers of the target")
    print("figures measured by", measured_by(bk))
    return run
