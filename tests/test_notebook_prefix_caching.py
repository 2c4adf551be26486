"""helpers.notebook.prefix_caching: notebook 10's harness (parameter checks, the bookkeeping sections, metrics),
without a model."""
from __future__ import annotations

import json

import matplotlib
import pytest

matplotlib.use("Agg")

from helpers.notebook import prefix_caching as pc  # noqa: E402
from helpers.notebook.backend import Backend  # noqa: E402
from helpers.serving.prefix import chat_traffic  # noqa: E402

GOOD = dict(n_positions=512, block_size=16, num_blocks=96, prompt_len=256, shared_shares=[0.0, 0.5], ttft_requests=5,
            decode_contexts=[64, 256], decode_steps=15, max_new_tokens=4, traffic_requests=6, system_lens=[100, 150],
            fewshot_lens=[70], question_len=[16, 48], bucket_requests=12)


def test_default_parameters_pass_and_each_bad_one_is_named():
    assert pc.problems(**GOOD) == []
    found = " ".join(pc.problems(**dict(GOOD, shared_shares=[1.0], question_len=[5, 2], num_blocks=1,
                                       decode_contexts=[600], decode_steps=0)))
    for text in ("shared share 1.0", "question_len", "raise num_blocks", "decode_contexts", "must be >= 1"):
        assert text in found
    assert "n_positions" in " ".join(pc.problems(**dict(GOOD, prompt_len=600)))


def test_setup_refuses_bad_parameters_before_building_anything():
    with pytest.raises(ValueError, match="shared share"):
        pc.setup(backend="reference", neuron_stack=None, device="cpu", model_path=None, amp="f32",
                 **dict(GOOD, shared_shares=[1.5]))


def test_hit_rates_stay_under_their_bound(capsys):
    traffic = chat_traffic(20, 1000, 1, [40, 60], [30], 0.5, (4, 12))
    hit = pc.traffic_hit_rates(traffic, 64, 8)
    assert 0 < hit["traffic_hit_rate"] <= hit["traffic_hit_bound"]
    hit.update(pc.sweep_hit_rates(traffic, [1, 8, 32], 512))
    assert hit["hit_rate_block1"] >= hit["hit_rate_block8"] >= hit["hit_rate_block32"]
    assert all(hit[f"hit_rate_block{b}"] <= hit["sweep_hit_bound"] + 1e-9 for b in (1, 8, 32))
    assert "upper bound" in capsys.readouterr().out


def test_neuron_buckets_count_the_grid_and_the_recomputed_hits(capsys):
    traffic = chat_traffic(4, 1000, 1, [90], [40], 0.5, (8, 16))
    stream = chat_traffic(6, 1000, 2, [300, 700], [], 0.0, (16, 400))
    out = pc.neuron_buckets(traffic, stream, [512, 1024, 2048], [512, 1024], 24, 32)
    assert out["prefix_grid_buckets"] == 9  # 3 prefill buckets x ([0] + 2 prefix buckets)
    assert out["neuron_prefill_bucket_tokens_cached"] <= out["neuron_prefill_bucket_tokens_uncached"]
    assert 0 <= out["hits_recomputed_on_neuron"] <= len(stream)
    assert "context-encoding graphs" in capsys.readouterr().out


def test_metrics_without_the_reference_engine_carry_the_bookkeeping(tmp_path):
    lab = pc.Lab(Backend("reference"), "m", 1000, None, "f32")
    path = tmp_path / "m.json"
    mem = [{"model": "X", "tp": 2, "bytes_per_block": 10}]
    pc.write_metrics(path, lab, {"block_size": 16}, {"traffic_hit_rate": 0.5}, mem, {"prefix_grid_buckets": 9})
    m = json.loads(path.read_text())
    assert m["block_bytes_X_tp2"] == 10 and m["prefix_grid_buckets"] == 9 and m["block_size"] == 16
    assert "ttft_ratio_share0.0" not in m
