"""helpers.notebook.stopping's measurements for notebook 04: a max-time budget that fires on any machine, the checks
of stopped runs against the unstopped one, interleaved timings and what each criterion saves; and the shared setup
of helpers.notebook.prompt_setup."""
import time

import pytest
import torch
from transformers import MaxLengthCriteria, StoppingCriteriaList

from helpers.notebook.backend import Backend
from helpers.notebook.stopping import (check_against_unstopped, interleaved_seconds, max_time_run, plot_savings,
                                       savings, savings_report, setup_stopping, stopping_metrics)

PROMPT = torch.tensor([[5, 6], [7, 8]])


class Enc:
    input_ids, attention_mask = PROMPT, torch.ones_like(PROMPT)


class SteppingModel:
    """sample() as the engines run it: one token per step (row r emits 10 * r + step), criteria after every step
    with the ids so far, a finished row padded with 0; each step sleeps ``step_s`` (``speedup`` divides it after
    the first call: a machine that got faster than it was measured)."""

    def __init__(self, step_s=0.004, speedup=1.0):
        self.step_s, self.speedup, self.calls, self.stats = step_s, speedup, 0, {}

    def sample(self, input_ids, sequence_length, top_k=1, attention_mask=None, eos_token_override=None,
               stopping_criteria_list=None, streamer=None):
        step_s = self.step_s / (self.speedup if self.calls else 1.0)
        self.calls += 1
        batch, L = input_ids.shape
        ids, done, rows = input_ids.clone(), torch.zeros(batch, dtype=torch.bool), torch.zeros(batch, dtype=torch.long)
        for step in range(sequence_length - L):
            time.sleep(step_s)
            token = torch.where(done, 0, 10 * torch.arange(batch) + step + 1)
            ids = torch.cat([ids, token[:, None]], 1)
            rows += (~done).long()
            if stopping_criteria_list is not None:
                done |= torch.as_tensor(stopping_criteria_list(ids, None)).reshape(-1).expand(batch)
            if done.all():
                break
        self.stats = {"row_new_tokens": rows.tolist(), "pad_token_id": 0}
        return ids


def test_max_time_budget_is_a_share_of_a_measured_run_and_fires():
    run = max_time_run(SteppingModel(), Enc, 2 + 10, fraction=0.5)
    # the budget is half the measured run (halved again only if load made that measurement slow)
    assert run["budget_s"] == pytest.approx(0.5 * run["unstopped_s"] / 2 ** (run["tries"] - 1))
    assert len(set(run["row_new_tokens"])) == 1 and run["row_new_tokens"][0] < 10


def test_max_time_halves_its_budget_on_a_machine_faster_than_measured():
    run = max_time_run(SteppingModel(speedup=8.0), Enc, 2 + 10, fraction=0.5)
    assert run["tries"] > 1 and run["row_new_tokens"][0] < 10
    assert run["budget_s"] == pytest.approx(0.5 * run["unstopped_s"] / 2 ** (run["tries"] - 1))


def test_stopped_runs_are_checked_against_the_unstopped_one():
    model = SteppingModel(step_s=0)
    full = model.sample(PROMPT, 2 + 6)
    replay = {"max_len": lambda: StoppingCriteriaList([MaxLengthCriteria(2 + 3)])}
    stopped = model.sample(PROMPT, 2 + 6, stopping_criteria_list=replay["max_len"]())
    runs = {"max_len": {"out": stopped, "row_new_tokens": [3, 3]},
            "max_time": {"out": stopped, "row_new_tokens": [3, 3]}}
    assert check_against_unstopped(runs, full, replay, 2, 0, 6) == 4
    bad = dict(runs, max_len={"out": stopped, "row_new_tokens": [2, 3]})  # row 0 claims an earlier stop
    with pytest.raises(AssertionError):
        check_against_unstopped(bad, full, replay, 2, 0, 6)
    never = dict(runs, max_time={"out": full, "row_new_tokens": [6, 6]})  # max_time that did not fire
    with pytest.raises(AssertionError, match="max_time did not stop"):
        check_against_unstopped(never, full, replay, 2, 0, 6)


def test_interleaved_timings_rotate_the_order():
    order = []

    class Recording(SteppingModel):
        def sample(self, *args, stopping_criteria_list=None, **kwargs):
            order.append(stopping_criteria_list.name if stopping_criteria_list is not None else "unstopped")
            return super().sample(*args, stopping_criteria_list=None, **kwargs)

    def make(name):
        crit = StoppingCriteriaList()
        crit.name = name
        return lambda: crit

    seconds = interleaved_seconds(Recording(step_s=0), Enc, 4, {"unstopped": None, "a": make("a"), "b": make("b")}, 3)
    assert order == ["unstopped", "a", "b", "a", "b", "unstopped", "b", "unstopped", "a"]
    assert {k: s.n for k, s in seconds.items()} == {"unstopped": 3, "a": 3, "b": 3}


def test_savings_are_steps_and_time_only_as_a_verdict(tmp_path):
    from helpers.notebook.figures import Spread

    runs = {"early": {"row_new_tokens": [3, 5]}, "one_row": {"row_new_tokens": [2, 8]},
            "max_time": {"row_new_tokens": [4, 4]}}
    seconds = {"unstopped": Spread([1.0, 1.1, 1.2]), "early": Spread([0.5, 0.6, 0.7]),
               "one_row": Spread([1.0, 1.1, 1.3])}
    rows = savings(runs, seconds, 8)
    assert [(r["steps_ran"], r["steps_saved"]) for r in rows] == [(5, 3), (8, 0), (4, 4)]
    text = savings_report(rows, 8)
    assert "early" in text and "is faster than unstopped" in text and "%" not in text
    assert "no step saved, so no time saved" in text and "not compared" in text
    assert plot_savings(rows, seconds, 8) is not None
    baseline = {"row_new_tokens": [8, 8], "out": torch.zeros(2, 10)}
    rows.append({"criterion": "repeated_ngram", "row_new_tokens": [6, 8], "steps_ran": 8, "steps_saved": 0})
    m = stopping_metrics(Backend("reference"), rows, baseline, {"row_new_tokens": [1, 1]}, True, 2,
                         {"budget_s": 0.1, "tries": 1})
    assert m["early_tokens"] == 8 and m["early_steps_saved"] == 3 and m["early_time_measurable"] is True
    assert m["repeated_ngram_fired"] is True and m["unstopped_tokens"] == 16 and m["tracked_matches_native"] is True


@pytest.mark.parametrize("change,msg", [({"ngram": 0}, "ngram=0"), ({"stop_after": 32}, "stop_after=32"),
                                        ({"max_time_fraction": 1.0}, "max_time_fraction=1.0"),
                                        ({"n_positions": 16}, "n_positions=16")])
def test_setup_refuses_bad_knobs(change, msg):
    knobs = dict(backend="reference", neuron_stack=None, device="cpu", seed=0, model_path=None, prompts=["Hi"],
                 batch_size=2, n_positions=256, max_new_tokens=32, stop_after=12, max_time_fraction=0.5, ngram=2,
                 ngram_max_repeats=1, repeats=1)
    with pytest.raises(ValueError, match=msg):
        setup_stopping(**{**knobs, **change})


def test_setup_encodes_a_left_padded_batch(capsys):
    s = setup_stopping("reference", None, "cpu", 0, None, ["Hi", "Name three fruits."], 2, 256, 8, 4, 0.5, 2, 1, 1)
    assert s.bk == Backend("reference") and s.enc.input_ids.shape == (2, s.prompt_len)
    assert s.seq_len == s.prompt_len + 8 and "backend: reference" in capsys.readouterr().out
