"""The measurement helpers of notebook 07 on the reference engine."""
import numpy as np
import pytest

import helpers
from helpers import bucket_bench as bb


@pytest.fixture(scope="module")
def model():
    return helpers.NeuronModel.from_pretrained(None, n_positions=256).to_neuron()


def test_ttft_and_decode_profile(model):
    t = bb.ttft_by_length(model, [20, 100], repeats=1)
    assert set(t) == {20, 100} and all(v > 0 for v in t.values())
    kv, lat = bb.decode_profile(model, 120, 12)  # steps at KV lengths 121..131 cross the 128 boundary
    assert kv.tolist() == list(range(121, 132)) and len(lat) == 11 and (lat > 0).all()
    per_bucket = bb.median_by_bucket(kv, lat, model.token_buckets)
    assert set(per_bucket) == {128, 256}


def test_generation_never_stops_early(model):
    times = bb.timed_sample(model, bb.random_prompt(10), 30)
    assert len(times) == 20  # NO_EOS: every step produces a token


def test_truncated_normal_lengths():
    x = bb.truncated_normal_lengths(1500, 500, 4000, 1, 2047, seed=0)
    assert x.min() >= 1 and x.max() <= 2047 and abs(np.median(x) - 1500) < 30
    assert np.mean(np.abs(x - 1500) <= 500) > 0.93  # spread = ~2 standard deviations
    assert np.array_equal(x, bb.truncated_normal_lengths(1500, 500, 4000, 1, 2047, seed=0))
