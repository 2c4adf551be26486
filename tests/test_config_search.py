"""The 004 workflow: candidate rules, iteration order, skip rules, JSON after each candidate, resume."""
from __future__ import annotations

import json

import pytest

from helpers.planning import config_search as C

MISTRAL = "Mistral-7B-Instruct-v0.2"


def test_candidates():
    assert C.candidate_tp_degrees("inf2.48xlarge", 32) == [2, 4, 8]   # 24 does not divide 32
    assert C.candidate_tp_degrees("trn1.32xlarge", 64) == [2, 8, 16, 32]
    assert C.candidate_tp_degrees("inf2.xlarge", 9) == []            # 9 heads: no even degree divides them
    assert C.candidate_sequence_lengths(32768) == [32768, 16384, 8192, 4096, 2048, 1024]
    assert C.candidate_sequence_lengths(4096) == [4096, 2048, 1024]


def fits_below(limit):
    """A fake device: valid when batch * seq <= limit (the shape of a memory limit)."""
    calls = []

    def verify(tp, batch, seq):
        calls.append((tp, batch, seq))
        return batch * seq <= limit * tp

    return verify, calls


def test_order_and_skip_rules(tmp_path):
    verify, calls = fits_below(8192)
    out = tmp_path / "r.json"
    data = C.search(MISTRAL, "inf2.48xlarge", out, verify=verify, tp_degrees=[2, 4], batch_sizes=[1, 4, 8],
                    sequence_lengths=[1024, 2048, 4096], log=lambda *_: None)
    # tp increasing, batch decreasing, seq decreasing; after a valid seq the shorter ones are skipped
    assert calls == [(2, 8, 4096), (2, 8, 2048), (2, 4, 4096), (2, 1, 4096),
                     (4, 8, 4096), (4, 4, 4096), (4, 1, 4096)]
    assert data["configurations"] == [
        {"tensor_parallel_size": 2, "batch_size": 8, "sequence_length": 2048},
        {"tensor_parallel_size": 2, "batch_size": 4, "sequence_length": 4096},
        {"tensor_parallel_size": 2, "batch_size": 1, "sequence_length": 4096},
        {"tensor_parallel_size": 4, "batch_size": 8, "sequence_length": 4096},
        {"tensor_parallel_size": 4, "batch_size": 4, "sequence_length": 4096},
        {"tensor_parallel_size": 4, "batch_size": 1, "sequence_length": 4096}]
    assert json.loads(out.read_text())["tested"] == data["tested"]


def test_written_after_each_candidate_and_resumed(tmp_path):
    out = tmp_path / "r.json"
    verify, calls = fits_below(8192)

    def crashing(tp, batch, seq):
        if len(calls) == 3:
            raise KeyboardInterrupt  # the search dies after 3 candidates
        return verify(tp, batch, seq)

    kw = dict(tp_degrees=[2, 4], batch_sizes=[1, 4, 8], sequence_lengths=[1024, 2048, 4096], log=lambda *_: None)
    with pytest.raises(KeyboardInterrupt):
        C.search(MISTRAL, "inf2.48xlarge", out, verify=crashing, **kw)
    assert len(json.loads(out.read_text())["tested"]) == 3  # every finished candidate is on disk
    calls.clear()
    C.search(MISTRAL, "inf2.48xlarge", out, verify=verify, **kw)
    # resumed: (2, 8, *) and (2, 4, 4096) are known, (2, 8, 1024) skipped as before; nothing tested twice
    assert calls == [(2, 1, 4096), (4, 8, 4096), (4, 4, 4096), (4, 1, 4096)]
    assert C.skip_reason(2, 16, 1024, json.loads(out.read_text())["tested"]).startswith("larger than")
    with pytest.raises(ValueError, match="holds results for instance"):
        C.search(MISTRAL, "trn1.32xlarge", out, **kw)


def test_planner_verdicts(tmp_path):
    data = C.search(MISTRAL, "inf2.xlarge", tmp_path / "p.json", log=lambda *_: None)
    assert data["verify"] == "planner"
    # tp=2 on 2 inf2 cores: 16 GiB each; batch 1 fits the full 32k context, batch 128 nothing
    assert {"tensor_parallel_size": 2, "batch_size": 1, "sequence_length": 32768} in data["configurations"]
    assert all(c["batch_size"] < 128 for c in data["configurations"])
    assert all(t["valid"] == t["predicted_fits"] for t in data["tested"])


def test_padded_degrees_are_an_option(tmp_path):
    """004's rule (divide the heads) drops tp=24 for 32-head Llama on inf2.48xlarge; transformers-neuronx pads the
    heads and builds it (aws-neuron-samples runs Llama-3.1-8B at tp_degree=24): heads="pad" includes it."""
    assert C.candidate_tp_degrees("inf2.48xlarge", 32, heads="pad") == [2, 4, 8, 24]
    assert C.candidate_tp_degrees("inf2.48xlarge", 32, heads="divide") == [2, 4, 8]
    assert C.padded_heads(32, 24) == 16 and C.padded_heads(32, 8) == 0
    with pytest.raises(ValueError, match="heads="):
        C.candidate_tp_degrees("inf2.48xlarge", 32, heads="round")
    kw = dict(batch_sizes=[1, 4], sequence_lengths=[2048, 4096], log=lambda *_: None)
    divided = C.search("Llama-3.1-8B", "inf2.48xlarge", tmp_path / "d.json", **kw)
    padded = C.search("Llama-3.1-8B", "inf2.48xlarge", tmp_path / "p.json", heads="pad", **kw)
    assert {t["tp_degree"] for t in divided["tested"]} == {2, 4, 8}
    assert {t["tp_degree"] for t in padded["tested"]} == {2, 4, 8, 24}
    assert all(t["padded_heads"] == (16 if t["tp_degree"] == 24 else 0) for t in padded["tested"])
    assert any(c["tensor_parallel_size"] == 24 for c in padded["configurations"])
    assert padded["heads"] == "pad" and divided["heads"] == "divide"
    with pytest.raises(ValueError, match="holds results for heads"):  # a resume never mixes the two rules
        C.search("Llama-3.1-8B", "inf2.48xlarge", tmp_path / "d.json", heads="pad", **kw)
