"""Notebook 04's stopping criteria and their measurements: a custom criterion (:class:`RepeatedNgramCriteria`),
transformers-neuronx's calling convention (#75) reproduced on the reference engine, ``sample()`` timed with criteria,
when a criterion fires, stopped outputs checked against the unstopped run, a max-time budget that demonstrably fires,
and what each criterion saves (decoding steps, exact; wall time only as spreads of interleaved repeats).

The workaround for #75 is ``helpers.neuron.tracking``.
"""
from __future__ import annotations

import time

import torch
from transformers import MaxTimeCriteria, StoppingCriteria, StoppingCriteriaList

from .figures import Spread, compare
from .prompt_setup import PromptSetup, prompt_setup
from .provenance import measured_by


class RepeatedNgramCriteria(StoppingCriteria):
    """A custom criterion: stop a row once its last ``n`` tokens already appeared ``max_repeats``
    times among its generated tokens (a degenerate loop)."""

    def __init__(self, prompt_len: int, n: int = 4, max_repeats: int = 2):
        if n < 1 or max_repeats < 1:
            raise ValueError("n and max_repeats must be >= 1")
        self.prompt_len, self.n, self.max_repeats = prompt_len, n, max_repeats

    def __call__(self, input_ids: torch.Tensor, scores=None, **kwargs) -> torch.BoolTensor:
        gen = input_ids[:, self.prompt_len:]
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if gen.shape[1] < self.n * (self.max_repeats + 1):
            return done
        windows = gen.unfold(1, self.n, 1)                     # [B, W, n]
        last = windows[:, -1:, :]
        count = (windows[:, :-1, :] == last).all(-1).sum(-1)   # earlier occurrences of the last n-gram
        return count >= self.max_repeats


class PromptOnlyCall(StoppingCriteria):
    """Reproduces transformers-neuronx's calling convention (#75) on the reference engine: the
    wrapped criteria are handed the prompt, never the generated ids."""

    def __init__(self, criteria: StoppingCriteriaList, prompt: torch.Tensor):
        self.criteria, self.prompt = criteria, prompt

    def __call__(self, input_ids, scores=None, **kwargs):
        return self.criteria(self.prompt.to(input_ids.device), scores)


def run_with_criteria(model, enc, sequence_length: int, make_criteria, repeats: int = 1) -> dict:
    """Greedy ``sample()`` with EOS disabled (only the criteria stop rows); returns the output, the
    tokens generated per row and the fastest of ``repeats`` wall times (the least disturbed by
    other load). ``make_criteria()`` builds fresh criteria for each run (or is None)."""
    best = float("inf")
    for _ in range(max(1, repeats)):
        criteria = make_criteria() if make_criteria else None
        t0 = time.perf_counter()
        out = model.sample(enc.input_ids, sequence_length, top_k=1, attention_mask=enc.attention_mask,
                           eos_token_override=[], stopping_criteria_list=criteria)
        best = min(best, time.perf_counter() - t0)
    return {"out": out, "seconds": best, "row_new_tokens": list(model.stats["row_new_tokens"])}


def fires_at(criteria, ids: torch.Tensor, prompt_len: int) -> int | None:
    """For one row ``ids`` [1, prompt + n], the first number of generated tokens at which
    ``criteria`` returns True, or None. Replays the criteria on growing prefixes."""
    for t in range(1, ids.shape[1] - prompt_len + 1):
        if bool(torch.as_tensor(criteria(ids[:, :prompt_len + t], None)).reshape(-1)[0]):
            return t
    return None


def compare_to_unstopped(stopped: torch.Tensor, full: torch.Tensor, row_new_tokens, prompt_len: int,
                         pad_token_id: int) -> list[dict]:
    """Per row: the stopped output must be a prefix of the unstopped greedy output, padded after."""
    rows = []
    for r, n in enumerate(row_new_tokens):
        end = prompt_len + n
        prefix_ok = torch.equal(stopped[r, :end], full[r, :end])
        padded_ok = bool((stopped[r, end:] == pad_token_id).all())
        rows.append({"row": r, "new_tokens": n, "is_prefix": prefix_ok, "padded_after": padded_ok})
    return rows


def setup_stopping(backend, neuron_stack, device, seed, model_path, prompts, batch_size, n_positions, max_new_tokens,
                   stop_after, max_time_fraction, ngram, ngram_max_repeats, repeats) -> PromptSetup:
    """Notebook 04's setup cell: its knobs checked, then :func:`prompt_setup.prompt_setup`."""
    if ngram < 1 or ngram_max_repeats < 1 or repeats < 1:
        raise ValueError(f"ngram={ngram}, ngram_max_repeats={ngram_max_repeats}, repeats={repeats}: use 1 or more")
    if not 0 < stop_after < max_new_tokens:
        raise ValueError(f"stop_after={stop_after}: choose 1 to max_new_tokens-1 ({max_new_tokens - 1})")
    if not 0 < max_time_fraction < 1:
        raise ValueError(f"max_time_fraction={max_time_fraction}: choose a share of the unstopped run, 0 < f < 1")
    return prompt_setup(backend, neuron_stack, device, seed, model_path, prompts, batch_size, n_positions,
                        max_new_tokens)


def max_time_run(model, enc, sequence_length: int, fraction: float, max_tries: int = 8) -> dict:
    """A :class:`transformers.MaxTimeCriteria` run whose budget is ``fraction`` of an unstopped run measured just
    before, so that it stops early on a slow machine and a fast one alike. If a run still reaches the end (the
    machine got faster than the measurement), the budget is halved and the run repeated, up to ``max_tries`` times:
    a small enough budget fires after the first step. Returns :func:`run_with_criteria`'s dict plus ``budget_s``,
    ``unstopped_s`` and ``tries``. Which step it stops at depends on the clock; that it stops, and where the tokens
    come from, does not."""
    unstopped = run_with_criteria(model, enc, sequence_length, None)
    full_steps = max(unstopped["row_new_tokens"])
    budget = fraction * unstopped["seconds"]
    for tries in range(1, max_tries + 1):
        run = run_with_criteria(model, enc, sequence_length, lambda: StoppingCriteriaList([MaxTimeCriteria(budget)]))
        if max(run["row_new_tokens"]) < full_steps or tries == max_tries:
            return {**run, "budget_s": budget, "unstopped_s": unstopped["seconds"], "tries": tries}
        budget /= 2


def check_against_unstopped(runs: dict, full: torch.Tensor, replay: dict, prompt_len: int, pad_token_id: int,
                            max_new_tokens: int) -> int:
    """Raise AssertionError unless every run's rows are prefixes of the unstopped greedy ``full``, padded after
    their stop, and (for the criteria in ``replay``, name -> a function making fresh criteria) each row stopped
    exactly where replaying its criteria on growing prefixes of ``full`` fires (or ran to the end where they never
    do). ``max_time`` (a clock, not the tokens, decides when) must have stopped every row at the same step, before
    the end. Returns the number of rows checked."""
    checked = 0
    for name, run in runs.items():
        for row in compare_to_unstopped(run["out"], full, run["row_new_tokens"], prompt_len, pad_token_id):
            assert row["is_prefix"] and row["padded_after"], (name, row)
            checked += 1
        if name == "max_time":
            steps = set(run["row_new_tokens"])
            assert len(steps) == 1 and steps.pop() < max_new_tokens, ("max_time did not stop the batch", run["row_new_tokens"])
            continue
        for r, n in enumerate(run["row_new_tokens"]):
            fired = fires_at(replay[name](), full[r:r + 1], prompt_len)
            assert n == (fired if fired is not None else max_new_tokens), (name, r, n, fired)
    return checked


def interleaved_seconds(model, enc, sequence_length: int, makes: dict, repeats: int) -> dict[str, Spread]:
    """Wall time of one ``run_with_criteria`` per setup (name -> make_criteria or None), ``repeats`` rounds. The
    order rotates from round to round, so that no setup always runs first (right after another one's last step) and
    load that drifts hits every setup alike."""
    names, times = list(makes), {name: [] for name in makes}
    for k in range(max(1, int(repeats))):
        for name in names[k % len(names):] + names[:k % len(names)]:
            times[name].append(run_with_criteria(model, enc, sequence_length, makes[name])["seconds"])
    return {name: Spread(t) for name, t in times.items()}


def savings(runs: dict, seconds: dict, max_new_tokens: int) -> list[dict]:
    """One row per criterion: the decoding steps its batch ran and saved (exact: the batch runs until its last row
    stops), and, where it was timed, its wall time against the unstopped run's (``compare``: a difference only where
    the ranges of the repeats separate)."""
    rows = []
    for name, run in runs.items():
        ran = max(run["row_new_tokens"])
        row = {"criterion": name, "row_new_tokens": list(run["row_new_tokens"]), "steps_ran": ran,
               "steps_saved": max_new_tokens - ran}
        if name in seconds:
            row["time"] = compare(seconds[name].samples, seconds["unstopped"].samples, name, "unstopped")
        rows.append(row)
    return rows


def savings_report(rows: list[dict], max_new_tokens: int) -> str:
    """One line per criterion: steps saved, then the time verdict (no percentage: a time saving is claimed only as
    ranges that separate, and steps are what a criterion saves)."""
    lines = []
    for r in rows:
        line = f"{r['criterion']:15s} rows {r['row_new_tokens']}: ran {r['steps_ran']} of {max_new_tokens} steps, saved {r['steps_saved']}"
        cmp = r.get("time")
        if cmp is None:
            line += "; wall time not compared (a clock decides its steps)"
        elif not r["steps_saved"]:
            line += f"; no step saved, so no time saved (wall time {cmp.a.format(1, ' s')})"
        else:
            line += f"; wall time {cmp.a.format(1, ' s')} vs unstopped {cmp.b.format(1, ' s')}: {cmp.verdict}"
        lines.append(line)
    return "\n".join(lines)


def plot_savings(rows: list[dict], seconds: dict, max_new_tokens: int):
    """Steps each criterion's batch ran (grey: saved none), and the wall times (median with min-max) of the timed
    setups. Returns the figure; title it with ``titled(fig, ..., bk)``."""
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["criterion"] for r in rows]
    colour = {r["criterion"]: "tab:blue" if r["steps_saved"] else "lightgrey" for r in rows}
    a1.bar(names, [r["steps_ran"] for r in rows], color=[colour[n] for n in names])
    a1.axhline(max_new_tokens, color="k", ls="--", label="unstopped")
    a1.legend(fontsize=8)
    a1.set_ylabel("decoding steps the batch ran")
    a1.set_title("steps (exact; grey: saved none)", fontsize=9)
    timed = list(seconds)
    med = [seconds[n].median for n in timed]
    err = [[m - seconds[n].low for m, n in zip(med, timed)], [seconds[n].high - m for m, n in zip(med, timed)]]
    a2.bar(timed, med, yerr=err, capsize=3, color=[colour.get(n, "k") for n in timed])
    a2.set_ylabel("wall time (s)")
    a2.set_title(f"wall time: median and min-max of {seconds[timed[0]].n} interleaved runs", fontsize=9)
    for a in (a1, a2):
        a.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.86))
    return fig


def stopping_metrics(bk, rows: list[dict], baseline: dict, prompt_only: dict, tracked_matches_native, batch_size: int,
                     max_time: dict) -> dict:
    """Notebook 04's key figures (the keys ci/baselines/cpu.json checks among them). Steps are exact; times are
    recorded only as spreads' medians and a verdict."""
    m = {"unstopped_tokens": sum(baseline["row_new_tokens"]), "prefix_checks_passed": True, "batch_size": batch_size,
         "tnx75_prompt_only_tokens": sum(prompt_only["row_new_tokens"]), "measured_by": measured_by(bk),
         "max_time_budget_s": max_time["budget_s"], "max_time_tries": max_time["tries"]}
    for r in rows:
        m[f"{r['criterion']}_tokens"] = sum(r["row_new_tokens"])
        m[f"{r['criterion']}_steps_saved"] = r["steps_saved"]
        if "time" in r:
            m[f"{r['criterion']}_time_measurable"] = r["time"].measurable
    ngram = next(r for r in rows if r["criterion"] == "repeated_ngram")
    m["repeated_ngram_fired"] = min(ngram["row_new_tokens"]) < max(baseline["row_new_tokens"])  # stopped a row
    if tracked_matches_native is not None:
        m["tracked_matches_native"] = tracked_matches_native
    return m
