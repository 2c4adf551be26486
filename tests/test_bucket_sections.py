"""Notebook 07's sections (helpers.notebook.bucket_sections): the setup's checks, what each section prints and
returns, the planner check that must fail when the planner loses, and the metrics the baseline reads. Timed
sections run on stand-in models whose cost follows their bucket (no engine); the oracle runs the engine once."""
import json
import time
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch

from helpers.notebook import bucket_bench as bb
from helpers.notebook import bucket_sections as bs
from helpers.planning import bucket_planner as bp
from helpers.planning.buckets import nxdi_select, tnx_context_buckets, tnx_token_buckets

matplotlib.use("Agg")

SETUP = dict(backend="reference", neuron_stack=None, device="cpu", model_path=None, amp="f32", tp_degree=1,
             n_positions=384, context_length_estimate=None, prompt_lengths=None, decode_steps=8, decode_prompt_len=100,
             repeats=2, prompt_mean=1500, traffic_max=2048)


@pytest.fixture(scope="module")
def run():
    return bs.setup(**SETUP)


def test_setup_resolves_the_lists_and_the_default_prompt_lengths(run):
    assert run.token_buckets == [128, 256, 384] and run.tnx_context == [64, 128, 192] == run.context_buckets
    assert run.prompt_lengths == [8, 60, 68, 124, 132, 188, 196, 208]  # either side of each boundary, 16 past 192
    assert run.n_max == 384 and run.rule == "tnx" and set(run.windows) == {128, 256, 384}


def test_setup_names_every_bad_parameter():
    with pytest.raises(ValueError) as e:
        bs.setup(**{**SETUP, "prompt_lengths": [0, 500], "prompt_mean": 4000, "decode_steps": 1000, "repeats": 0})
    for part in ("prompt length 0", "prompt length 500", "prompt_mean=4000", "decode_steps=1000", "repeats=0"):
        assert part in str(e.value)


def test_bucket_choices_print_what_the_runs_lengths_meet(run, capsys):
    rows = bs.bucket_choices(run, [128, 256, 384])
    out = capsys.readouterr().out
    assert rows[-1] == {"prompt": 208, "tnx": "context[192] + 16 token steps", "nxdi": "context[256]"}
    # the run's own longest prompt and the end of transformers-neuronx's default list, not a typed number
    assert "longest prompt timed here: 208 tokens" in out and "end at 192" in out
    assert "refuse 3 of the 8 prompt lengths ([192, 196, 208])" not in out  # 192 is not among them
    assert "refuse 2 of the 8 prompt lengths ([196, 208])" in out
    with pytest.raises(ValueError, match="exceeds largest bucket"):  # what NxD Inference would say
        nxdi_select(run.tnx_context, 208, "context_encoding_model")


class BucketCost:
    """A model whose first token costs time in proportion to its context bucket and whose decode step costs the
    same at every length (so no staircase): enough to drive the timed sections without the engine."""

    def __init__(self, context):
        self.context, self.stats = sorted(context), {}

    def sample(self, input_ids, sequence_length, top_k=1, eos_token_override=None, streamer=None, **kw):
        L = input_ids.shape[1]
        bucket = next((b for b in self.context if b >= L), self.context[-1])
        time.sleep(bucket * 2e-5)
        new = torch.zeros((input_ids.shape[0], sequence_length - L), dtype=torch.long)
        for j in range(new.shape[1]):
            if j:
                time.sleep(1e-3)
            if streamer is not None:
                streamer.put(new[:, j:j + 1])
        if streamer is not None:
            streamer.end()
        self.stats = {"ttft_s": 0.0, "new_tokens": new.shape[1]}
        return torch.cat([input_ids, new], dim=1)


class StandInRun(bs.Run):
    def build(self, batch_size, n_positions, context_length_estimate):
        return BucketCost(tnx_context_buckets(context_length_estimate, tnx_token_buckets(n_positions)))


@pytest.fixture()
def stand_in(run):
    return StandInRun(**{k: getattr(run, k) for k in run.__dataclass_fields__})


def test_ttft_section_compares_the_short_prompt_on_both_models(stand_in, capsys):
    ttft = bs.ttft_by_prompt_length(stand_in, stand_in.build(1, 384, None), stand_in.build(1, [384], [384]))
    assert ttft.short == 124 and set(ttft.single) == {124, 208} and set(ttft.bucketed) == set(stand_in.prompt_lengths)
    assert all(s.n == stand_in.repeats for s in ttft.bucketed.values())
    assert ttft.comparison.ratio > 1  # one 384 bucket against the 128 bucket
    assert set(ttft.boundaries) == {64, 128, 192} and "boundary 64" in capsys.readouterr().out
    bs.plot_ttft(stand_in, ttft)


def test_decode_section_times_every_window_and_both_comparisons(stand_in):
    decode = bs.decode_staircase(stand_in, [1, 2])
    assert set(decode.steps) == {1, 2} and set(decode.steps[1]) == set(stand_in.windows)
    assert set(decode.staircase) == set(decode.one_bucket) == {1, 2}
    bs.plot_decode(stand_in, decode)


def test_planned_ttft_scales_the_plan_and_compares_on_the_repeats(stand_in, capsys):
    planned = bs.planned_ttft(stand_in, [1024, 1280, 1536, 1792, 2048], 1500, 500, 3, 2048, seed=0)
    assert planned.scale == 384 / 2048 and planned.sets["planner"] == [192, 240, 288, 336, 384]
    assert all(len(v) == stand_in.repeats for v in planned.per_repeat.values())
    assert f"{len(planned.prompts)} prompts" in capsys.readouterr().out


@pytest.fixture(scope="module")
def padding():
    prompts, outputs = bb.sample_traffic(1500, 500, 200, 500, 2048, seed=0)
    plan = bp.plan_buckets(prompts, 5, max_length=2048, align="guide")
    return bs.padding_by_bucket_set(prompts, outputs, plan, 5, 2048, "guide", "tnx")


def test_padding_counts_every_set_and_the_planner_pads_least(padding):
    assert set(padding.sets) == {bs.POW2, bs.GUIDE, "planner, align guide", "planner, align 1"}
    assert padding.ratio(bs.POW2) > 1 and padding.ratio(bs.GUIDE) >= 1
    assert padding.waste["planner, align 1"] <= padding.waste[padding.planned]
    bs.check_planner(padding, 5, "guide")
    bs.plot_padding(padding)


def test_check_planner_fails_when_the_planner_loses(padding):
    worse = {**padding.waste, padding.planned: padding.waste[bs.GUIDE] + 1, "planner, align 1": padding.waste[bs.POW2] + 1}
    lost = bs.Padding(padding.prompts, padding.sets, worse, padding.planned, padding.overflow, padding.token,
                      padding.token_plan, padding.traffic_max)
    with pytest.raises(AssertionError, match="the planner lost"):
        bs.check_planner(lost, 5, "guide")
    only_grid = {**padding.waste, padding.planned: padding.waste[bs.GUIDE] + 1}
    lost = bs.Padding(padding.prompts, {k: v for k, v in padding.sets.items() if k != "planner, align 1"},
                      {k: v for k, v in only_grid.items() if k != "planner, align 1"}, padding.planned,
                      padding.overflow, padding.token, padding.token_plan, padding.traffic_max)
    with pytest.raises(AssertionError, match="lost to"):
        bs.check_planner(lost, 5, "guide")


class Greedy:
    """Greedy generation whose logits are the same for every bucket set, but ``off`` for the NxD Inference rules."""

    def __init__(self, off=0.0):
        self.off, self.stats = off, {}

    def sample(self, ids, length, top_k=1, eos_token_override=None, output_logits=False):
        logits = torch.arange(float(length - ids.shape[1])).unsqueeze(-1) + self.off
        self.stats = {"logits": logits}
        return torch.cat([ids, logits.argmax(-1).unsqueeze(0) + int(self.off)], dim=1)


@pytest.mark.parametrize("off, same", [(0.0, True), (1.0, False)])
def test_the_oracle_compares_both_rules_with_one_bucket(run, monkeypatch, off, same):
    built = []

    def build_model(bk, model_dir, **kw):
        built.append(kw)
        return Greedy(off if "nxdi_bucketing" in kw else 0.0)

    monkeypatch.setattr(bs, "build_model", build_model)
    oracle = bs.greedy_against_one_bucket(run, new_tokens=8)
    assert [kw.get("n_positions") for kw in built] == [[384], 384, 384] and "nxdi_bucketing" in built[2]
    assert oracle.same_tokens is same and oracle.logit_diff == off and oracle.tol == 1e-3


def test_the_metrics_hold_what_the_baseline_checks(tmp_path, stand_in, padding):
    ttft = bs.ttft_by_prompt_length(stand_in, stand_in.build(1, 384, None), stand_in.build(1, [384], [384]))
    decode = bs.decode_staircase(stand_in, [1])
    planned = bs.planned_ttft(stand_in, padding.sets[padding.planned], 1500, 500, 2, 2048, seed=0)
    costs = [{"graph": "a", "seconds": 2.0, "bytes": 10, "first_built": True},
             {"graph": "b", "seconds": 1.0, "bytes": 10, "first_built": False}]
    path = tmp_path / "m.json"
    bs.write_bucket_metrics(str(path), stand_in, ttft, decode, costs, padding, planned, {2048: 12},
                            bs.Oracle(True, 0.0, 1e-3))
    metrics = json.loads(path.read_text())
    baseline = json.loads((Path(__file__).resolve().parents[1] / "ci" / "baselines" / "cpu.json").read_text())
    assert set(baseline["07_bucketing"]) <= set(metrics)
    assert metrics["graphs"] == 2 and metrics["build_s_per_graph_median"] == 1.0 and metrics["bucketed_matches_unbucketed"]
    assert np.isclose(metrics["waste_ratio_pow2_over_planner"], padding.ratio(bs.POW2))
