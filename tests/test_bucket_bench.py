"""The measurement helpers of notebook 07 on the reference engine."""
import numpy as np
import torch
import pytest

import helpers
from helpers.notebook import bucket_bench as bb
from helpers.planning.buckets import tnx_find


@pytest.fixture(scope="module")
def model():
    return helpers.NeuronModel.from_pretrained(None, n_positions=256).to_neuron()


def test_ttft_and_decode_profile(model):
    table = bb.ttft_table({"a": model, "b": model}, [20, 100], repeats=1)
    assert set(table) == {"a", "b"} and all(set(t) == {20, 100} and min(t.values()) > 0 for t in table.values())
    assert 0 < bb.ttft(model, bb.random_prompt(30), repeats=2)
    assert 0 < bb.step_latency(model, 10, 4)
    kv, lat = bb.decode_profile(model, 120, 12)  # steps at KV lengths 121..131 cross the 128 boundary
    assert kv.tolist() == list(range(121, 132)) and len(lat) == 11 and (lat > 0).all()
    per_bucket = bb.median_by_bucket(kv, lat, model.token_buckets)
    assert set(per_bucket) == {128, 256}


def test_generation_never_stops_early(model):
    times = bb.timed_sample(model, bb.random_prompt(10), 30)
    assert len(times) == 20  # EOS off: every step produces a token
    assert bb.eos_off(model) == [] and bb.eos_off(object()) == bb.NO_EOS


def test_interleaved_calls_in_turn():
    calls = []
    out = bb.interleaved({"x": lambda: calls.append("x") or 1.0, "y": lambda: calls.append("y") or 3.0}, repeats=3)
    assert out == {"x": 1.0, "y": 3.0} and calls == ["x", "y"] * 3


def test_truncated_normal_lengths():
    x = bb.truncated_normal_lengths(1500, 500, 4000, 1, 2047, seed=0)
    assert x.min() >= 1 and x.max() <= 2047 and abs(np.median(x) - 1500) < 30
    assert np.mean(np.abs(x - 1500) <= 500) > 0.93  # spread = ~2 standard deviations
    assert np.array_equal(x, bb.truncated_normal_lengths(1500, 500, 4000, 1, 2047, seed=0))


class PostHocModel:
    """Like NxD Inference's adapter: the streamer gets every token after the generation, ``ttft_s`` is None;
    ``total_s`` follows a cost model (prefill, then a step cost per KV length from its token bucket)."""

    def __init__(self, buckets, step_cost):
        self.buckets, self.step_cost, self.stats = buckets, step_cost, {}

    def sample(self, input_ids, sequence_length, top_k=1, eos_token_override=None, streamer=None):
        L = input_ids.shape[1]
        n = sequence_length - L
        total = 5.0 + sum(self.step_cost[tnx_find(self.buckets, L + i)] for i in range(1, n))
        new = torch.full((input_ids.shape[0], n), 7)
        if streamer is not None:
            for j in range(n):
                streamer.put(new[:, j:j + 1])
            streamer.end()
        self.stats = {"ttft_s": None, "total_s": total, "new_tokens": n, "token_times_s": []}
        return torch.cat([input_ids, new], dim=1)


def test_decode_profile_without_per_token_times():
    m = PostHocModel([128, 256, 384], {128: 1.0, 256: 2.0, 384: 4.0})
    kv, lat = bb.decode_profile(m, 40, 250, buckets=[128, 256, 384])
    assert kv.tolist() == list(range(41, 290))  # as the per-token path: steps 1..249
    assert not bb.has_token_times(m)
    assert bb.median_by_bucket(kv, lat, [128, 256, 384]) == {128: 1.0, 256: 2.0, 384: 4.0}
    expected = [m.step_cost[tnx_find([128, 256, 384], int(n))] for n in kv]
    assert np.allclose(lat, expected)  # each stretch between boundaries lies in one bucket
    kv1, lat1 = bb.decode_profile(m, 40, 250)  # no buckets: one mean over every step
    assert np.allclose(lat1, lat.mean()) and len(lat1) == 249


def test_profile_from_totals_refuses_an_early_stop():
    m = PostHocModel([128], {128: 1.0})
    real = m.sample
    m.sample = lambda ids, n, **kw: real(ids, n - 1, **kw) if n - ids.shape[1] > 1 else real(ids, n, **kw)
    with pytest.raises(RuntimeError, match="stopped early"):
        bb.profile_from_totals(m, torch.zeros(1, 10, dtype=torch.long), 20, [128])


def test_profile_from_totals_takes_the_fastest_run_and_refuses_noise():
    m = PostHocModel([128, 256], {128: 1.0, 256: 2.0})
    real, calls = m.sample, []

    def noisy(ids, n, **kw):  # the first one-token run is slowed by 100 s of other load
        out = real(ids, n, **kw)
        if n == ids.shape[1] + 1 and n not in calls:
            m.stats["total_s"] += 100.0
        calls.append(n)
        return out

    m.sample = noisy
    ids = torch.zeros(1, 100, dtype=torch.long)
    kv, lat = bb.profile_from_totals(m, ids, 60, [128, 256], repeats=2)
    assert bb.median_by_bucket(kv, lat, [128, 256]) == {128: 1.0, 256: 2.0}
    with pytest.raises(RuntimeError, match="timing noise"):
        calls.clear()
        bb.profile_from_totals(m, ids, 60, [128, 256], repeats=1)


def test_reference_engine_has_token_times(model):
    bb.timed_sample(model, bb.random_prompt(10), 12)
    assert bb.has_token_times(model)


def test_sample_traffic_fits_max_length():
    from helpers.notebook.bucket_bench import sample_traffic

    prompts, outputs = sample_traffic(1500, 500, 200, 2000, 2048, seed=0)
    assert prompts.shape == outputs.shape == (2000,)
    assert prompts.min() >= 1 and (prompts + outputs).max() <= 2048 and outputs.min() >= 1
    assert abs(prompts.mean() - 1500) < 30 and 0.9 < ((prompts >= 1000) & (prompts <= 2000)).mean() < 0.99
    with pytest.raises(ValueError, match="prompt_mean"):
        sample_traffic(3000, 500, 200, 10, 2048)


def test_interleaved_samples_keep_every_repeat():
    calls = []
    out = bb.interleaved_samples({"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 2.0}, 3)
    assert out == {"a": [1.0] * 3, "b": [2.0] * 3} and calls == ["a", "b"] * 3


def test_boundary_lengths_straddle_each_bucket():
    assert bb.boundary_lengths([64, 128, 192], 384, offset=4, beyond=(224,)) == [8, 60, 68, 124, 132, 188, 196, 224]
    assert bb.boundary_lengths([128], 130, offset=4) == [8, 124]  # 132 is not below n_max


def test_decode_windows_stay_inside_their_bucket():
    w = bb.decode_windows([128, 256, 384], 16, 100)
    assert w == {128: 100, 256: 128, 384: 256}
    for b, p in w.items():  # every step's KV length (p + 1 .. p + 16) selects bucket b
        assert {tnx_find([128, 256, 384], p + i) for i in range(1, 17)} == {b}
    assert bb.decode_windows([128, 136], 16, 200) == {128: 111}  # 136 holds fewer than 16 steps
