"""helpers.notebook.tensor_parallel: notebook 01's setup, checks, tables and metrics (fast: no rank processes)."""
from __future__ import annotations

import json

import pytest
import torch

import helpers
from helpers.notebook import tensor_parallel as tpx
from helpers.planning import memory as planner


def _ex(amp="f32", neuron=False):
    bk = helpers.Backend("neuron" if neuron else "reference", "tnx" if neuron else None)
    enc = type("Enc", (), {"input_ids": torch.zeros(1, 5, dtype=torch.long)})()
    return tpx.Experiment(bk, [1, 2], None, enc, None, {"batch_size": 1, "n_positions": 64, "amp": amp}, 4, 2)


def test_setup_refuses_bad_parameters_before_building():
    with pytest.raises(ValueError, match="max_new_tokens"):
        tpx.setup(max_new_tokens=1, prompt="hi")
    with pytest.raises(ValueError, match="planner_instance"):
        tpx.setup(planner_instance="inf9.huge", prompt="hi")
    with pytest.raises(ValueError, match="amp"):
        tpx.setup(amp="f8", prompt="hi")
    with pytest.raises(ValueError, match="n_positions"):
        tpx.setup(n_positions=8, max_new_tokens=8, prompt="a prompt longer than the cache " * 4)


def test_setup_always_runs_the_oracle_degree(capsys):
    ex = tpx.setup(tp_degree=2, tp_degrees=[3], prompt="Say hi.", max_new_tokens=4)
    assert ex.tp_degrees == [1, 2, 3] and ex.amp == "f32"
    assert "teaching device" in capsys.readouterr().out  # tp=3: no Neuron instance runs it


def test_the_user_case_is_refused_at_tp1_by_the_reserve_only():
    uc = tpx.user_case()
    assert uc["message"] and "tp_degree=2" in uc["message"]  # the fix named
    assert not uc["tp1_fits"] and uc["tp1_fits_without_reserve"] and uc["tp2"].fits("inf2.xlarge")
    assert 2048 <= uc["fit"]["largest_fitting"][planner.RUNTIME_RESERVE] < 4096


def _parity(tokens, other, diff=0.0):
    return {"hf_diff": diff, "hf_agree": None, "compared": "test",
            "parity": {1: {"tokens_equal": True, "max_logit_diff": 0.0},
                       2: {"tokens_equal": torch.equal(tokens, other), "max_logit_diff": diff}}}


def test_check_parity_raises_on_a_differing_token_in_f32_and_reports_in_bf16(capsys):
    a = torch.tensor([[1, 2, 3]])
    tpx.check_parity(_parity(a, a.clone()), _ex())
    with pytest.raises(AssertionError, match="greedy tokens differ"):
        tpx.check_parity(_parity(a, torch.tensor([[1, 2, 4]])), _ex())
    with pytest.raises(AssertionError, match="Hugging Face"):
        tpx.check_parity(_parity(a, a.clone(), diff=1.0), _ex())
    bf = _parity(a, torch.tensor([[1, 2, 4]]))
    for v in bf["parity"].values():
        v["agree_positions"] = 2
    tpx.check_parity(bf, _ex("bf16"))  # reported, not asserted
    assert "reported, not asserted" in capsys.readouterr().out


def test_latency_report_and_metrics(tmp_path, capsys):
    runs = {1: {"itl_s": 0.01, "itl_samples_s": [0.010, 0.011], "s_per_token": 0.02, "tokens": None},
            2: {"itl_s": 0.03, "itl_samples_s": [0.030, 0.031], "s_per_token": 0.04, "tokens": None}}
    lat = tpx.latency_report(runs, repeats=2)
    out = capsys.readouterr().out
    assert "tp=2" in out and lat["key"] == "itl_ms" and lat["ms"][2] == pytest.approx(30.0)
    uc = tpx.user_case()
    par = {"hf_diff": 0.0, "hf_agree": None, "parity": {tp: {"tokens_equal": True, "max_logit_diff": 0.0}
                                                      for tp in runs}}
    for r in runs.values():
        r["ranks"] = [{"weights": {"layers": 2**20, "norms": 0, "lm_head": 0, "embedding": 0}}]
    found = {"divide": {"configurations": [1, 2]}, "padded_only": [{"tensor_parallel_size": 24}]}
    path = tmp_path / "m.json"
    m = tpx.record(path, _ex(), uc, runs, True, par, lat, found)
    saved = json.loads(path.read_text())
    assert saved == m and m["seed000_tp1_fits"] is False and m["search_padded_only_degrees"] == "24"
    assert m["tp2_itl_vs_tp1"] == pytest.approx(3.0) and m["tp2_max_rank_weight_mib"] == 1.0
