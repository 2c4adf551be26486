"""helpers.notebook.timing: the step measurement behind the benchmark's step table and notebook 05's cost model.
Timings are noisy, so the tests check what does not depend on load: which steps run, their shapes and bookkeeping,
and the refusals."""
import pytest

import helpers
from helpers.notebook import timing


@pytest.fixture(scope="module")
def models():
    def build(batch, k=0):
        m = helpers.NeuronModel.from_pretrained(None, batch_size=batch, n_positions=64, context_length_estimate=16)
        if k:
            m.enable_speculative_decoder(k)
        return m.to_neuron()
    return build(1, 3), build(2)


def test_step_seconds_runs_each_case_alternately(models, monkeypatch):
    spec, batch2 = models
    calls = []
    for m in models:
        real = m.step
        monkeypatch.setattr(m, "step", lambda ids, start, pos, kind, real=real, m=m: calls.append(
            (m.batch_size, tuple(ids.shape), pos, kind)) or real(ids, start, pos, kind))
    t = timing.step_seconds({"one": (spec, 1), "verify 4": (spec, 4), "batch 2": (batch2, 1)}, position=20, repeats=2)
    assert calls[:3] == [(1, (1, 1), 20, "token"), (1, (1, 4), 20, "speculative"), (2, (2, 1), 20, "token")]
    assert len(calls) == 3 * 3  # a warm-up round, then 2 timed rounds
    for s in t.values():
        assert s["n"] == 2 and 0 < s["min"] <= s["median"] <= s["max"]


def test_verify_costs_and_draft_cost_are_ratios_of_one_measurement(models, monkeypatch):
    spec, batch2 = models
    fake = {1: 0.010, 2: 0.012, 4: 0.016}  # seconds per step by tokens: a deterministic clock
    clock = {"t": 0.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])
    real = spec.step

    def step(ids, start, pos, kind):
        clock["t"] += fake[ids.shape[1]]
        return real(ids, start, pos, kind)
    monkeypatch.setattr(spec, "step", step)
    assert timing.verify_costs(spec, [1, 3], position=10, repeats=3) == pytest.approx({1: 1.2, 3: 1.6})


def test_refusals_name_what_to_change(models):
    spec, batch2 = models
    with pytest.raises(ValueError, match="enable_speculative_decoder"):
        timing.step_seconds({"x": (batch2, 4)})
    with pytest.raises(ValueError, match="exceed n_positions=64"):
        timing.step_seconds({"x": (spec, 4)}, position=62)
    with pytest.raises(ValueError, match="repeats=0"):
        timing.step_seconds({"x": (spec, 1)}, repeats=0)
    with pytest.raises(TypeError, match="reference engine"):
        timing.step_seconds({"x": (object(), 1)})
