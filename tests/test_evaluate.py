"""helpers.notebook.evaluate on models without logits or per-token times (the paths notebook 06 takes on Neuron)."""
import pytest
import torch

import helpers
from helpers.notebook.evaluate import (decode_tokens_per_s, interleaved_decode_seconds, sampled_agreement,
                                       sequence_logits, teacher_forced_agreement)
from tiny_models import write_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    write_tiny(d)
    return str(d)


def test_sampled_agreement_equals_the_teacher_forced_one(tiny):
    """sample() one token at a time gives the teacher-forced agreement (one forward over the whole sequence).

    In f32 the two agree exactly. In bf16 they are two computation orders: a one-token step and a whole-sequence
    forward run GEMMs of other shapes, which bf16 kernels block and round differently (an Intel Xeon with
    AVX-512 BF16 gave 0.958 against 1.0 here), so they may pick different tokens where the two best logits lie
    within bf16's rounding of each other, and only there. The rounding is measured on this model: the largest
    difference between its bf16 and its f32 teacher-forced logits."""
    ref = helpers.NeuronModel.from_pretrained(tiny, n_positions=64).to_neuron()
    other = helpers.NeuronModel.from_pretrained(tiny, n_positions=64, amp="bf16").to_neuron()
    prompts = [torch.tensor([[1, 9, 17, 33]]), torch.tensor([[1, 40, 41]])]
    seqs = [ref.sample(p, p.shape[1] + 12, top_k=1, eos_token_override=[]) for p in prompts]
    lens = [p.shape[1] for p in prompts]
    assert sampled_agreement(ref, seqs, lens) == teacher_forced_agreement(ref, seqs, lens) == 1.0
    shuffled = [torch.cat([s[:, :L], s[:, L:].flip(1)], dim=1) for s, L in zip(seqs, lens)]
    assert sampled_agreement(ref, shuffled, lens) == teacher_forced_agreement(ref, shuffled, lens) < 1.0  # not a constant

    total, near_ties = sum(s.shape[1] - L for s, L in zip(seqs, lens)), 0
    for seq, L in zip(seqs, lens):
        forced = sequence_logits(other, seq[0, :-1])[L - 1:]  # bf16 model, whole sequence: [new tokens, vocab]
        err = (forced - sequence_logits(ref, seq[0, :-1])[L - 1:]).abs().max().item()  # bf16's rounding here
        top2 = forced.topk(2, dim=-1).values
        near_ties += int((top2[:, 0] - top2[:, 1] <= 2 * err).sum())
        for i in range(L, seq.shape[1]):  # sample()'s token differs from the forward's only at a near tie
            tok = other.sample(seq[:, :i], i + 1, top_k=1, eos_token_override=[])[0, i]
            row = forced[i - L]
            assert row.max() - row[tok] <= 2 * err, (i, tok, row.max().item(), row[tok].item(), err)
    gap = abs(sampled_agreement(other, seqs, lens) - teacher_forced_agreement(other, seqs, lens))
    assert gap * total <= near_ties + 1e-9


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


def test_interleaved_decode_seconds_runs_the_models_in_turn():
    order = []

    class Named(WholeGenerations):
        def __init__(self, name, per_token):
            self.name, self.per_token = name, per_token

        def sample(self, ids, sequence_length, **kwargs):
            out = super().sample(ids, sequence_length)
            n = sequence_length - ids.shape[1]
            self.stats["total_s"] = 0.5 + self.per_token * n
            if n > 1:
                order.append(self.name)
            return out

    t = interleaved_decode_seconds({"a": Named("a", 0.1), "b": Named("b", 0.2)}, torch.ones(1, 4, dtype=torch.long),
                                   11, repeats=3)
    assert order == ["a", "b"] * 4  # a warm-up round, then 3 rounds in turn
    assert t["a"] == pytest.approx([0.1] * 3) and t["b"] == pytest.approx([0.2] * 3)
    with pytest.raises(ValueError, match="repeats"):
        interleaved_decode_seconds({"a": Named("a", 0.1)}, torch.ones(1, 4, dtype=torch.long), 11, repeats=0)


def test_interleaved_decode_seconds_takes_the_median_step_where_tokens_are_timed():
    class Timed:  # 0.1 s per token, one step stalled by 2 s
        def sample(self, ids, sequence_length, **kwargs):
            n = sequence_length - ids.shape[1]
            times = [0.5 + 0.1 * i + (2.0 if i >= 3 else 0.0) for i in range(n)]
            self.stats = {"ttft_s": times[0], "token_times_s": times, "total_s": times[-1], "new_tokens": n}
            return torch.cat([ids, torch.zeros(1, n, dtype=torch.long)], dim=1)

    t = interleaved_decode_seconds({"a": Timed()}, torch.ones(1, 4, dtype=torch.long), 11, repeats=2)
    assert t["a"] == pytest.approx([0.1, 0.1])


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
