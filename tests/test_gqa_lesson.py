"""helpers.notebook.gqa_sharding: notebook 02's steps behind one call each (the parts that need no model build)."""
from __future__ import annotations

import types

import pytest

from helpers.notebook import gqa_sharding as lesson


@pytest.mark.parametrize("bad", [dict(tp_degree=0), dict(max_new_tokens=1), dict(parity_batch_sizes=[0]),
                                 dict(sob_case=[3]), dict(strategy="shard-over-everything")])
def test_setup_refuses_bad_parameters_before_loading_anything(bad):
    with pytest.raises(ValueError):
        lesson.setup(**bad)


def test_the_short_strategy_table_is_short_and_builds_tp24(capsys):
    s = lesson.strategy_summary()
    assert len(s["rows"]) == len(lesson.SUMMARY_MODELS) * len(lesson.SUMMARY_TP_DEGREES) <= 12
    assert s["has_tp24"]
    smol_tp2 = next(r for r in s["rows"] if r["model"].startswith("SmolLM2") and r["tp"] == 2)
    assert smol_tp2["tnx:default"] == "replicated-heads (5kv)"  # 3 KV heads do not divide by 2: fallback
    assert smol_tp2["tnx:shard-over-batch"].startswith("predicted to fail")  # 9 heads padded to 10 at batch 4
    assert "predicted to fail" in capsys.readouterr().out


def test_the_full_table_stays_behind_one_call():
    reasons = {}
    rows = lesson.full_strategy_table(reasons)
    assert len(rows) == len(lesson.FULL_MODELS) * len(lesson.FULL_TP_DEGREES) * 2
    assert reasons


def test_the_workload_table_pivots_requests_and_gives_the_shard_over_batch_saving(capsys):
    w = lesson.workload_table()
    assert w["sob_saving"] == pytest.approx(4.0)  # 8 KV heads for 1 row vs 1 KV head for 32 rows, per core
    out = capsys.readouterr().out
    assert out.count("\n") < 15  # one row per request, not per (request, batch)


def _run(amp="f32", neuron=False):
    return types.SimpleNamespace(amp=amp, bk=types.SimpleNamespace(is_neuron=neuron))


def test_check_parity_raises_on_a_token_or_logit_difference():
    good = {"status": "ok", "tokens_equal": True, "max_logit_diff": 1e-5}
    lesson.check_parity(_run(), [good, {"status": "rejected"}])
    with pytest.raises(AssertionError):
        lesson.check_parity(_run(), [good, {**good, "tokens_equal": False}])
    with pytest.raises(AssertionError):
        lesson.check_parity(_run(), [{**good, "max_logit_diff": 1e-2}])
    lesson.check_parity(_run(neuron=True), [{"status": "ok", "tokens_equal": True}])  # no logits on Neuron
    lesson.check_parity(_run(amp="bf16"), [{**good, "tokens_equal": False}])  # 16-bit: reported, not asserted
