"""helpers.notebook.batching: notebook 09's harness (parameter checks, replays as spreads, the verdicts, metrics),
on hand-made replays (no model)."""
from __future__ import annotations

import json

import matplotlib
import pytest

matplotlib.use("Agg")

from helpers.notebook import batching  # noqa: E402
from helpers.notebook.backend import Backend  # noqa: E402
from helpers.serving.scheduler import RunResult, Served  # noqa: E402

GOOD = dict(n_positions=128, context_length_estimate=[32, 64], prompt_len=[8, 48], short_output=[2, 12],
            long_output=[40, 60], static_batch_size=4, slot_counts=[4, 8], repeats=3, static_max_wait_s=0.5)


def _run(policy: str, slots: int, finish: float) -> RunResult:
    """Two requests arriving at 0 and 1 s, each with 2 tokens; the last answer at ``finish``."""
    served = [Served(0, 0.0, 0, 0.0, 0.5, 1.0, tokens=[1, 2]), Served(1, 1.0, 1, 1.0, 1.5, finish, tokens=[3, 4])]
    return RunResult(policy, slots, served, busy_s=finish / 2, steps=4)


def test_default_parameters_pass_and_each_bad_one_is_named():
    assert batching.problems(**GOOD) == []
    bad = dict(GOOD, static_batch_size=3, prompt_len=[8, 100], slot_counts=[4, 0], repeats=0, static_max_wait_s=-1)
    found = " ".join(batching.problems(**bad))
    for name in ("static_batch_size=3", "largest context bucket", "slot_counts", "repeats=0", "static_max_wait_s"):
        assert name in found
    assert "n_positions" in " ".join(batching.problems(**dict(GOOD, long_output=[40, 100])))


def test_setup_refuses_bad_parameters_before_building_anything():
    with pytest.raises(ValueError, match="repeats=0"):
        batching.setup(backend="reference", neuron_stack=None, device="cpu", model_path=None, amp="f32",
                       **dict(GOOD, repeats=0))


def test_replay_interleaves_policies_and_summarises_median_and_max_per_replay(capsys):
    order = []
    finishes = {"static 2": iter([4.0, 5.0, 6.0]), "continuous 2": iter([2.0, 2.5, 3.0])}

    def policy(name):
        def run():
            order.append(name)
            return _run(name.split()[0], 2, next(finishes[name]))
        return run

    runs = batching.replay({n: policy(n) for n in finishes}, repeats=3)
    assert order == ["static 2", "continuous 2"] * 3
    rows = {f"{s['policy']} {s['slots']}": s for s in batching.summaries(runs)}
    assert rows["static 2"]["span_s"].samples == (4.0, 5.0, 6.0) and rows["static 2"]["n"] == 2
    assert "ttft_median_s" in rows["static 2"] and not any("p99" in k or "p50" in k for k in rows["static 2"])
    assert "2 requests per replay, 3 replays per policy" in capsys.readouterr().out


def test_compare_policies_calls_a_difference_only_where_the_replays_separate(capsys):
    runs = {"static 2": [_run("static", 2, f) for f in (4.0, 5.0, 6.0)],
            "continuous 2": [_run("continuous", 2, f) for f in (2.0, 2.5, 3.0)],
            "continuous 4": [_run("continuous", 4, f) for f in (2.2, 2.4, 3.5)]}
    same, claim = batching.compare_policies(runs, 2, [2, 4], Backend("reference"))
    out = capsys.readouterr().out
    assert same.measurable and "continuous 2 is faster than static 2" in out
    assert claim["value"] is None and "not_measurable" in claim  # replays spread more than MAX_SPREAD
    assert "slot counts: " in out and "no difference measurable here between continuous 4 and continuous 2" in out


def test_metrics_carry_the_baseline_keys(tmp_path):
    lab = batching.Lab(Backend("reference"), "m", 10, {}, [32], True)
    runs = {"static 2": [_run("static", 2, 5.0)] * 2, "continuous 2": [_run("continuous", 2, 2.5)] * 2}
    same, claim = batching.compare_policies(runs, 2, [2], lab.bk)
    path = tmp_path / "m.json"
    batching.write_metrics(path, lab, {"n_requests": 2}, {"offered_rate_per_s": 1.0, "tokens_asked": 4}, runs, same,
                           claim, {"static 2": []}, [True])
    m = json.loads(path.read_text())
    assert m["outputs_match_alone"] and m["hf_agrees"] and m["tokens_asked"] == 4
    assert m["continuous2_ttft_median_s"] == 0.5 and "throughput_ratio_same_size" in m
    only = batching.write_metrics(None, lab, {"n_requests": 2})
    assert set(only) == {"measured_by", "n_requests"}
