"""helpers.notebook.speculation_run: notebook 05's steps. What the distribution test can detect, the parameter
refusals, the account table's verdicts and the metrics keys the CPU baseline checks (bookkeeping only, no timing)."""
import pytest
import torch

from helpers.notebook import speculation_run as sr
from helpers.notebook.backend import Backend
from helpers.notebook.speculation import two_sample_tv_bound


def test_detectable_tv_is_twice_the_bound_and_samples_to_detect_reaches_it():
    assert sr.detectable_tv(100, 9) == pytest.approx(2 * two_sample_tv_bound(100, 100, 9))
    assert sr.detectable_tv(100, 9) > 1  # 100 runs per method: no change is certain to be caught
    n = sr.samples_to_detect(0.1, 9)
    assert sr.detectable_tv(n, 9) <= 0.1 < sr.detectable_tv(n - 1, 9)
    assert sr.samples_to_detect(0.05, 9) > 3 * n  # a quarter of the distance: four times the runs, about
    with pytest.raises(ValueError):
        sr.samples_to_detect(0.0, 9)


@pytest.mark.parametrize("change, match", [
    (dict(task="poem"), "unknown task"),
    (dict(survey_tasks=["quote", "nope"]), "unknown task"),
    (dict(ks=[]), "ks must be"),
    (dict(ks=[0, 2]), "ks must be"),
    (dict(top_k=1), "top_k"),
    (dict(temperature=0), "temperature"),
    (dict(dist_samples=5), "dist_samples"),
    (dict(repeats=2), "repeats"),
])
def test_check_parameters_refuses(change, match):
    args = dict(task="quote", survey_tasks=["edit"], ks=[4, 1, 4], k=2, top_k=3, temperature=1.0, dist_samples=100,
                repeats=3)
    assert sr.check_parameters(**args) == [1, 4]
    with pytest.raises(ValueError, match=match):
        sr.check_parameters(**{**args, **change})


def _row(plain, spec, k, acceptance=0.5, rounds=4, identical=True):
    row = {"plain_s": plain, "spec_s": spec, "prefill_s": [1.0] * len(plain), "new_tokens": 21, "rounds": rounds,
           "acceptance_rate": acceptance, "tokens_per_round": 2.0, "identical": identical, "k": k,
           "draft": "prompt_lookup", "task": "quote"}
    row["ratios"] = sr.speedups(row)
    row["speedup"] = row["ratios"].median
    return row


def _run():
    return sr.SpeculationRun(Backend("reference", None, "cpu"), tok=None, model_dir=None, draft_path=None,
                             input_ids=torch.zeros(1, 5, dtype=torch.long), survey_ids={}, ks=[4], amp="f32",
                             n_positions=64, max_new_tokens=8, repeats=3, draft_layers=1)


def test_accounts_say_where_the_counted_model_falls(capsys):
    costs = sr.Costs({4: sr.Spread([1.5, 1.5])}, {0: [1.0, 1.0], 4: [1.5, 1.5]}, sr.Spread([0.2, 0.2]), 2)
    # 1 s prefill, 20 decode steps of 0.1 s; counted: 1 + 4 calls * 1.5 steps * 0.1 s = 1.6 s -> 3.0 / 1.6 = 1.875x
    inside = _row([3.0, 3.0, 3.0], [1.5, 1.6, 1.7], 4)
    faster = _row([3.0, 3.0, 3.0], [1.4, 1.45, 1.5], 4)
    acc = _run().accounts({"prompt_lookup": [inside]}, costs)
    assert acc[("prompt_lookup", 4)]["counted_in_range"] and acc[("prompt_lookup", 4)]["counted"] == pytest.approx(1.875)
    acc = _run().accounts({"prompt_lookup": [faster]}, costs)
    a = acc[("prompt_lookup", 4)]
    assert not a["counted_in_range"] and a["rest_steps_per_round"] < 0
    assert "within the rounds' min-max: 0 of 1 rows; rest per call below zero" in capsys.readouterr().out
    assert _run().accounts({"prompt_lookup": [inside]}, None) == {}


def test_metrics_keep_the_keys_the_baseline_checks():
    run = _run()
    row = _row([3.0, 3.0, 3.0], [1.5, 1.6, 1.7], 4, acceptance=0.9)
    costs = sr.Costs({4: sr.Spread([1.4, 1.5, 1.6])}, {0: [1.0, 1.0, 1.0], 4: [1.4, 1.5, 1.6]},
                     sr.Spread([0.2, 0.2, 0.2]), 3)
    accounts = run.accounts({"prompt_lookup": [row]}, costs)
    dist = {"tv": 0.1, "tv_broken": 0.9, "bound": 0.5, "detectable": 1.05, "samples": 100}
    m = run.metrics([row], {"prompt_lookup": [row]}, costs, accounts, dist)
    assert {"greedy_identical", "survey_identical", "prompt_lookup_acceptance_k4", "tv_speculative", "tv_broken",
            "verify_cost_k4"} <= set(m)
    assert m["verify_cost_k4"] == pytest.approx(1.4) and m["prompt_lookup_speedup_k4"] == pytest.approx(row["speedup"])
    assert m["chosen_draft"] == "prompt_lookup" and m["prompt_lookup_counted_in_range_k4"] is True
    neuron = sr.SpeculationRun(**{**run.__dict__, "bk": Backend("neuron", "tnx", "cpu")})
    assert "tv_speculative" not in neuron.metrics([], {"x": [row]}, None, {}, None)
