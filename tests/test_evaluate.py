"""helpers.notebook.evaluate on models without logits or per-token times (the paths notebook 06 takes on Neuron)."""
import pytest
import torch

import helpers
from helpers.notebook.evaluate import decode_tokens_per_s, sampled_agreement, teacher_forced_agreement
from tiny_models import write_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    write_tiny(d)
    return str(d)


def test_sampled_agreement_equals_the_teacher_forced_one(tiny):
    ref = helpers.NeuronModel.from_pretrained(tiny, n_positions=64).to_neuron()
    other = helpers.NeuronModel.from_pretrained(tiny, n_positions=64, amp="bf16").to_neuron()
    prompts = [torch.tensor([[1, 9, 17, 33]]), torch.tensor([[1, 40, 41]])]
    seqs = [ref.sample(p, p.shape[1] + 12, top_k=1, eos_token_override=[]) for p in prompts]
    lens = [p.shape[1] for p in prompts]
    for m in (ref, other):
        assert sampled_agreement(m, seqs, lens) == pytest.approx(teacher_forced_agreement(m, seqs, lens))
    assert sampled_agreement(ref, seqs, lens) == 1.0
    shuffled = [torch.cat([s[:, :L], s[:, L:].flip(1)], dim=1) for s, L in zip(seqs, lens)]
    assert sampled_agreement(ref, shuffled, lens) < 1.0  # not a constant


class WholeGenerations:
    """Times no single token (stats ttft_s None, as NxD Inference behind helpers.neuron): 0.5 s + 0.1 s per token."""

    def sample(self, ids, sequence_length, **kwargs):
        n = sequence_length - ids.shape[1]
        self.stats = {"ttft_s": None, "token_times_s": [], "total_s": 0.5 + 0.1 * n, "new_tokens": n}
        return torch.cat([ids, torch.zeros(1, n, dtype=torch.long)], dim=1)


def test_decode_tokens_per_s_from_whole_generations():
    assert decode_tokens_per_s(WholeGenerations(), torch.ones(1, 4, dtype=torch.long), 11) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        decode_tokens_per_s(WholeGenerations(), torch.ones(1, 4, dtype=torch.long), 1)


def test_decode_tokens_per_s_takes_the_faster_one_token_run():
    class Noisy(WholeGenerations):
        calls = 0

        def sample(self, ids, sequence_length, **kwargs):
            out = super().sample(ids, sequence_length)
            Noisy.calls += 1
            if Noisy.calls == 2:  # the first 1-token run is slowed by other load
                self.stats["total_s"] += 5.0
            return out

    assert decode_tokens_per_s(Noisy(), torch.ones(1, 4, dtype=torch.long), 11) == pytest.approx(10.0)


def test_decode_tokens_per_s_refuses_noise():
    class Flat(WholeGenerations):
        def sample(self, ids, sequence_length, **kwargs):
            out = super().sample(ids, sequence_length)
            self.stats["total_s"] = 0.5
            return out

    with pytest.raises(RuntimeError, match="timing noise"):
        decode_tokens_per_s(Flat(), torch.ones(1, 4, dtype=torch.long), 5)


def test_describe_difference_says_what_differs():
    from helpers.notebook.evaluate import describe_difference
    a = torch.tensor([[1, 2, 3, 4]])
    assert describe_difference(a, a.clone()) == "tokens identical"
    b = torch.tensor([[1, 2, 9, 4]])
    assert describe_difference(a, b) == "1 token(s) differ, the first at row 0, position 2: 3 expected, 9 got"
    assert describe_difference(a, a[:, :3]) == "token shapes (1, 4) vs (1, 3)"
    la = torch.zeros(2, 3)
    lb = la.clone(); lb[1, 2] = 0.5
    assert describe_difference(a, a, la, lb) == ("tokens identical; logits differ at 1 of 6 entries, max |diff| "
                                                 "5.000e-01 at index (1, 2)")
    assert describe_difference(a, a, la, la.clone()).endswith("logits bit-identical")
