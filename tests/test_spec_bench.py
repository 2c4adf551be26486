"""helpers.notebook.speculation: notebook 05's timing loop keeps every repeat, its ratios come with their spread,
and the account of the speedup adds up. Timings are noisy, so the checks use a fake clock or only bookkeeping."""
import pytest
import torch

import helpers
from helpers.engine.speculative import ModelDraft, PromptLookupDraft, SpeculativeGenerator
from helpers.model_store import write_truncated_draft
from helpers.notebook import speculation
from tiny_models import write_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    write_tiny(root / "t", num_hidden_layers=3)
    return root / "t", write_truncated_draft(root / "t", 1, root / "d")


def _new(path, k=0):
    m = helpers.NeuronModel.from_pretrained(str(path), n_positions=64)
    if k:
        m.enable_speculative_decoder(k)
    return m.to_neuron()


def test_timed_runs_keep_every_repeat_and_the_generator_stats(tiny):
    target, draft_path = tiny
    draft, plain = _new(draft_path), _new(target)
    variants = {f"k{k}": speculation.GeneratorSampler(SpeculativeGenerator(ModelDraft(draft), _new(target, k), k))
                for k in (1, 3)}
    ids = torch.tensor([[1, 5, 7, 9, 11]])
    rows = speculation.timed_runs(plain, variants, ids, 20, eos_token_id=[], repeats=3)
    assert list(rows) == ["k1", "k3"] and all(r["identical"] for r in rows.values())
    assert rows["k1"]["plain_s"] == rows["k3"]["plain_s"]  # one plain run per round, shared
    for r in rows.values():
        assert len(r["plain_s"]) == len(r["spec_s"]) == len(r["prefill_s"]) == 3 and r["new_tokens"] == 15
        assert {"acceptance_rate", "tokens_per_round", "rounds"} <= set(r) and r["rounds"] >= 1

    class Plain:  # a sample() that reports nothing (NxD Inference's: no ttft, no acceptance)
        stats = {"ttft_s": None}

        def __init__(self, token=3):
            self.token = token

        def sample(self, ids, n, top_k=1, eos_token_override=None):
            return torch.cat([ids, torch.full((1, n - ids.shape[1]), self.token)], dim=1)

    rows = speculation.timed_runs(Plain(), {"same": Plain(), "wrong": Plain(4)}, ids, 20, repeats=2)
    assert rows["same"]["identical"] and not rows["wrong"]["identical"]
    assert rows["same"]["prefill_s"] == [] and "acceptance_rate" not in rows["same"]
    with pytest.raises(ValueError, match="repeats"):
        speculation.timed_runs(Plain(), {}, ids, 20, repeats=0)


def test_step_rounds_give_ratios_round_by_round(monkeypatch):
    seconds = iter([{"a": {"median": 2.0}, "b": {"median": 1.0}}, {"a": {"median": 3.0}, "b": {"median": 2.0}}])
    monkeypatch.setattr(speculation, "step_seconds", lambda cases, position, repeats: next(seconds))
    t = speculation.step_rounds({"a": None, "b": None}, position=8, rounds=2)
    assert t == {"a": [2.0, 3.0], "b": [1.0, 2.0]}
    r = speculation.ratio_spread(t, "a", "b")
    assert (r.low, r.high, r.n) == (1.5, 2.0, 2)


def test_account_adds_up():
    # 1 s prefill, 21 new tokens: 20 decode steps of 0.1 s; 4 target calls of k=4 at 1.5 steps each, no draft cost
    row = {"plain_s": [3.0], "spec_s": [1.8], "prefill_s": [1.0], "new_tokens": 21, "rounds": 4,
           "acceptance_rate": 1.0}
    a = speculation.account(row, 4, draft_steps=0.0, verify_steps=1.5)
    assert a["measured"] == pytest.approx(3.0 / 1.8)
    assert a["leviathan"] == pytest.approx(5 / 1.5)  # all accepted: k + 1 tokens per call
    assert a["counted"] == pytest.approx(3.0 / (1.0 + 4 * 1.5 * 0.1))
    assert a["prefill_share"] == pytest.approx(1 / 3) and a["decode_tokens_per_call"] == pytest.approx(5.0)
    assert a["rest_steps_per_round"] == pytest.approx((1.8 - 1.6) / 0.1 / 4)


def test_prompt_lookup_through_the_sampler_signature(tiny):
    target, _ = tiny
    gen = speculation.GeneratorSampler(SpeculativeGenerator(PromptLookupDraft(), _new(target, 2), 2))
    ids = torch.tensor([[1, 5, 7, 1, 5, 7, 1, 5]])
    out = gen.sample(ids, 16, eos_token_override=[])
    assert torch.equal(out, _new(target).sample(ids, 16, top_k=1, eos_token_override=[]))
    assert gen.stats["rounds"] >= 1
