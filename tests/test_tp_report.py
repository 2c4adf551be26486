"""helpers.tp_report's backend-independent measurements (the paths notebooks 01/02 take on Neuron)."""
import pytest
import torch

import helpers
from helpers.notebook import sharding as tp_report
from helpers.prompts import encode_prompts


def test_neuron_tp_degrees_per_family():
    ok, skipped = tp_report.neuron_tp_degrees([1, 2, 3, 8, 24], "inf2")
    assert ok == [1, 2, 8, 24] and set(skipped) == {3} and "inf2" in skipped[3]
    ok, skipped = tp_report.neuron_tp_degrees([1, 2, 3, 16], "trn1")
    assert ok == [1, 2, 16] and set(skipped) == {3}


def test_token_agreement():
    a = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    assert tp_report.token_agreement(a, a.clone()) == {"tokens_equal": True, "agree_positions": 4,
                                                        "compared_positions": 4}
    b = a.clone()
    b[1, 2] = 9
    assert tp_report.token_agreement(b, a) == {"tokens_equal": False, "agree_positions": 2, "compared_positions": 4}
    assert tp_report.token_agreement(a[:, :3], a)["agree_positions"] == 3  # stopped early: the shorter length


def test_run_greedy_on_the_reference_engine(tokenizer):
    enc = encode_prompts(tokenizer, ["Say hi."], 1)
    bk = helpers.resolve_backend("reference")
    r = tp_report.run_greedy(bk, None, 1, enc, 4, repeats=2, n_positions=128)
    oracle = helpers.build_model(bk, None, n_positions=128).sample(enc.input_ids, enc.input_ids.shape[1] + 4, top_k=1,
                                                                   attention_mask=enc.attention_mask)
    assert torch.equal(r["tokens"], oracle)
    assert r["itl_s"] > 0 and r["ttft_s"] > 0 and r["s_per_token"] > 0


class NoTokenTimes:
    """Like NxD Inference's adapter behind helpers.neuron: no per-token times, ttft_s None."""
    build_s = 1.5

    def sample(self, ids, sequence_length, **kwargs):
        n = sequence_length - ids.shape[1]
        self.stats = {"new_tokens": n, "total_s": 0.2 * n, "token_times_s": [], "ttft_s": None}
        return torch.cat([ids, torch.full((ids.shape[0], n), 5)], dim=1)


def test_run_greedy_without_token_times(monkeypatch, tokenizer):
    monkeypatch.setattr(tp_report, "build_model", lambda bk, path, **kw: NoTokenTimes())
    enc = encode_prompts(tokenizer, ["Say hi."], 1)
    r = tp_report.run_greedy(None, None, 2, enc, 5)
    assert r["itl_s"] is None and r["ttft_s"] is None and r["s_per_token"] == pytest.approx(0.2)
    assert r["tp"] == 2 and r["build_s"] == 1.5 and r["tokens"].shape[1] == enc.input_ids.shape[1] + 5


def test_latency_summary_reference_and_neuron_runs():
    ref = {1: {"itl_s": 0.010}, 2: {"itl_s": 0.015, "all_reduce_s": 1e-4, "collectives_per_step": 61}}
    s = tp_report.latency_summary(ref)
    assert s["key"] == "itl_ms" and s["ms"] == pytest.approx({1: 10.0, 2: 15.0})
    assert s["comm_ms"] == pytest.approx({1: 0.0, 2: 6.1})
    nxdi = {1: {"itl_s": None, "s_per_token": 0.02}, 2: {"itl_s": None, "s_per_token": 0.03}}
    s = tp_report.latency_summary(nxdi)
    assert s["key"] == "ms_per_token" and s["ms"] == pytest.approx({1: 20.0, 2: 30.0}) and s["comm_ms"] == {}
    assert "prompt included" in s["what"]


class FakeLibrary:
    """run_greedy stand-in: records each build; tokens differ from tp=1 only for a chosen (tp, strategy)."""

    def __init__(self, wrong=None):
        self.builds, self.wrong = [], wrong

    def __call__(self, bk, path, tp, enc, max_new_tokens, repeats=1, **settings):
        nc = settings.get("neuron_config")
        gqa = getattr(nc, "group_query_attention", None)
        self.builds.append((tp, settings["batch_size"], getattr(gqa, "value", gqa)))
        tokens = torch.cat([enc.input_ids, torch.full((enc.input_ids.shape[0], max_new_tokens), 3)], dim=1)
        if (tp, getattr(gqa, "value", gqa)) == self.wrong:
            tokens[:, -1] = 4
        return {"tokens": tokens}


def test_library_sweep_tnx_builds_each_layout_once_and_compares_tokens(monkeypatch, tokenizer):
    from helpers.notebook.backend import Backend

    fake = FakeLibrary(wrong=(1, "replicated-heads"))
    monkeypatch.setattr(tp_report, "run_greedy", fake)
    encode = lambda b: encode_prompts(tokenizer, ["Hi."], b)  # noqa: E731
    rows = tp_report.library_sweep(Backend("neuron", "tnx"), None, [1, 2], [1], encode, 3, n_positions=128)
    assert len(rows) == 10  # 2 tp x 5 requests
    built = [r for r in rows if r.get("built") == "yes"]
    assert len(fake.builds) == 1 + len(built)  # the tp=1 reference, then one build per distinct layout
    assert len(set(fake.builds)) == len(fake.builds)
    bad = [r for r in rows if r["status"] == "ok" and not r["tokens_equal"]]
    assert [(r["tp"], r["requested"]) for r in bad] == [(1, "replicated-heads")]  # built once, at tp=1
    assert all(r["status"] in ("ok", "rejected") for r in rows)
    # at tp=2 every tnx request falls back to REPLICATED_HEADS (3 KV heads): one build serves all five
    assert sum(1 for tp, _, _ in fake.builds if tp == 2) == 1


def test_library_sweep_nxdi_has_no_knob(monkeypatch, tokenizer):
    from helpers.notebook.backend import Backend
    from helpers.planning.gqa import GQA

    fake = FakeLibrary()
    monkeypatch.setattr(tp_report, "run_greedy", fake)
    encode = lambda b: encode_prompts(tokenizer, ["Hi."], b)  # noqa: E731
    rows = tp_report.library_sweep(Backend("neuron", "nxdi"), None, [1, 2], [1, 2], encode, 3,
                                   extra_cases=[(3, 3, GQA.SHARD_OVER_BATCH)], n_positions=128)
    assert [(r["tp"], r["batch"]) for r in rows] == [(1, 1), (2, 1), (1, 2), (2, 2)]  # no tnx-only extra case
    assert all(r["requested"] == "nxdi: no knob" and r["tokens_equal"] for r in rows)
    assert all(gqa is None for _, _, gqa in fake.builds)  # no GQA keyword reaches NxD Inference
