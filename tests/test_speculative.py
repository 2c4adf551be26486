"""Speculative sampling: the acceptance rule's output distribution equals the target's (exact
test on synthetic distributions with a sample-size bound), greedy output equals the target alone,
and the refusals. A deliberately broken rule must fail the same checks."""
import pytest
import torch

import helpers
from helpers.engine.speculative import (ModelDraft, PromptLookupDraft, SpeculativeGenerator, accept_greedy,
                                        accept_rejection)
from helpers.model_store import write_truncated_draft
from helpers.notebook.speculation import (accept_always_broken, expected_tokens_per_round, first_emitted_distribution,
                                          tv_bound, tv_distance, two_sample_tv_bound)
from tiny_models import write_tiny

V, K, N = 6, 3, 20000


def _dists(seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(K + 1, V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(K, V, generator=g) * 1.5, -1)
    return p, q


def _as_counts(p, n):
    return {i: float(p[i]) * n for i in range(p.numel())}


@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-draft", "one-hot-draft"])
def test_rejection_sampling_emits_the_target_distribution(deterministic):
    p, q = _dists()
    fixed = torch.tensor([int(q[i].argmax()) for i in range(K)]) if deterministic else None
    counts = first_emitted_distribution(accept_rejection, p, None if deterministic else q, fixed, n=N)
    bound = tv_bound(N, V)
    assert tv_distance(counts, _as_counts(p[0], N)) < bound
    broken = first_emitted_distribution(accept_always_broken, p, None if deterministic else q, fixed, n=N)
    assert tv_distance(broken, _as_counts(p[0], N)) > bound, "the broken rule must be detected"


def test_rejection_with_identical_distributions_accepts_everything():
    p, _ = _dists(1)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        draft = torch.multinomial(p[:K], 1, generator=g).squeeze(1)
        assert accept_rejection(draft, p[:K], p, g)[0] == K


def test_greedy_acceptance():
    logits = torch.tensor([[0.0, 5, 1], [3, 0, 1], [0, 0, 9]])
    assert accept_greedy(torch.tensor([1, 0]), logits) == (2, 2)
    assert accept_greedy(torch.tensor([1, 2]), logits) == (1, 0)
    assert accept_greedy(torch.tensor([0, 2]), logits) == (0, 1)


def test_analytic_model():
    assert expected_tokens_per_round(0.0, 4) == 1.0
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert expected_tokens_per_round(0.5, 2) == pytest.approx(1.75)


def test_prompt_lookup_draft_continues_the_last_match():
    d = PromptLookupDraft(ngram=2)
    toks, q = d.propose(torch.tensor([5, 6, 7, 8, 9, 5, 6]), 3)
    assert toks.tolist() == [7, 8, 9] and q is None
    # a match near the end continues its own period instead of repeating the last token
    assert d.propose(torch.tensor([1, 2, 3, 4, 3, 4]), 5)[0].tolist() == [3, 4, 3, 4, 3]
    assert d.propose(torch.tensor([9, 7, 7]), 3)[0].tolist() == [7, 7, 7]
    assert d.propose(torch.tensor([1, 2, 3]), 2)[0].tolist() == [3, 3]  # no match: repeat the last token


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    write_tiny(path, "llama", num_hidden_layers=4)
    return path


def _target(path, k, **kw):
    m = helpers.NeuronModel.from_pretrained(path, n_positions=128, **kw)
    m.enable_speculative_decoder(k)
    return m.to_neuron()


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculation_is_token_identical_to_the_target(tiny, tmp_path, k):
    target = _target(tiny, k)
    ids = torch.randint(3, 250, (1, 12), generator=torch.Generator().manual_seed(k))
    plain = target.sample(ids, 60, top_k=1, eos_token_override=[])
    draft_dir = write_truncated_draft(tiny, 2, tmp_path / "draft")
    draft = helpers.NeuronModel.from_pretrained(draft_dir, n_positions=128).to_neuron()
    for d in (PromptLookupDraft(2), draft):
        streamed = []

        class S:
            def put(self, v):
                streamed.append(int(v.reshape(-1)[0]))

            def end(self):
                streamed.append("end")

        gen = SpeculativeGenerator(d, target, k)
        out = gen.sample(ids, 60, streamer=S())
        assert torch.equal(out, plain), type(d).__name__
        assert streamed[:-1] == out[0, 12:].tolist() and streamed[-1] == "end"


def test_sampled_speculation_end_to_end_matches_target_distribution(tiny, tmp_path):
    """Two-sample test on generated tokens 1-2 (token 2 is inside the first speculation window)."""
    k, n = 2, 400
    target = _target(tiny, k)
    draft = helpers.NeuronModel.from_pretrained(write_truncated_draft(tiny, 1, tmp_path / "d"), n_positions=128).to_neuron()
    ids = torch.randint(3, 250, (1, 8), generator=torch.Generator().manual_seed(0))
    kw = dict(top_k=3, temperature=1.5)

    def spec(acceptor):
        gen = SpeculativeGenerator(ModelDraft(draft), target, k, acceptor=acceptor)
        c = {}
        for s in range(n):
            out = gen.sample(ids, 10, generator=torch.Generator().manual_seed(s), **kw)
            key = tuple(out[0, 8:10].tolist())
            c[key] = c.get(key, 0) + 1
        return c

    plain = {}
    for s in range(n):
        out = target.sample(ids, 10, generator=torch.Generator().manual_seed(10_000 + s), **kw)
        key = tuple(out[0, 8:10].tolist())
        plain[key] = plain.get(key, 0) + 1
    bound = two_sample_tv_bound(n, n, support=9)
    assert tv_distance(spec(accept_rejection), plain) < bound
    assert tv_distance(spec(accept_always_broken), plain) > bound


def test_refusals(tiny):
    built = helpers.NeuronModel.from_pretrained(tiny, n_positions=128).to_neuron()
    with pytest.raises(RuntimeError, match="before to_neuron"):
        built.enable_speculative_decoder(2)
    with pytest.raises(ValueError, match="enable_speculative_decoder\\(2\\)"):
        SpeculativeGenerator(PromptLookupDraft(), built, 2)
    m2 = helpers.NeuronModel.from_pretrained(tiny, n_positions=128, batch_size=2)
    m2.enable_speculative_decoder(2)
    with pytest.raises(ValueError, match="batch_size=1"):
        SpeculativeGenerator(PromptLookupDraft(), m2.to_neuron(), 2)


class _Speculating:
    """build(k) for sampler_sweep_k on the reference engine: sample() runs the engine's SpeculativeGenerator."""

    def __init__(self, draft, target, k):
        self.gen = SpeculativeGenerator(ModelDraft(draft), target, k)

    def sample(self, input_ids, sequence_length, top_k=1, eos_token_override=None):
        return self.gen.sample(input_ids, sequence_length, eos_token_id=eos_token_override)


def test_sampler_sweep_k_through_sample_only(tmp_path):
    from helpers.notebook.speculation import sampler_sweep_k

    write_tiny(tmp_path / "t", num_hidden_layers=3)
    draft_path = write_truncated_draft(tmp_path / "t", 1, tmp_path / "d")
    new = lambda p: helpers.NeuronModel.from_pretrained(str(p), n_positions=64)  # noqa: E731
    draft = new(draft_path).to_neuron()

    def build(k):
        if not k:
            return new(tmp_path / "t").to_neuron()
        target = new(tmp_path / "t")
        target.enable_speculative_decoder(k)
        return _Speculating(draft, target.to_neuron(), k)

    ids = torch.tensor([[1, 5, 7, 9, 11]])
    rows = sampler_sweep_k(build, [1, 3], ids, 20, eos_token_id=[], repeats=2)
    assert [r["k"] for r in rows] == [1, 3] and all(r["identical"] for r in rows)
    assert all(r["new_tokens"] == 15 and r["speedup"] > 0 and r["repeats"] == 2 for r in rows)
    assert "acceptance_rate" not in rows[0]  # not observable through sample()

    class Wrong:  # a speculative path that changes the output must be reported
        def sample(self, ids, n, top_k=1, eos_token_override=None):
            return torch.cat([ids, torch.full((1, n - ids.shape[1]), 3)], dim=1)

    rows = sampler_sweep_k(lambda k: Wrong() if k else build(0), [2], ids, 20, eos_token_id=[])
    assert rows[0]["identical"] is False


def test_neuron_prompt_lookup_draft_follows_the_library_protocol():
    """transformers-neuronx's SpeculativeGenerator calls: the prompt (cache_ids None), then the target's newest
    token at its position; after a round with every draft kept, the last draft once more at its position."""
    prompt = torch.tensor([[5, 6, 7, 8, 5, 6]])
    d = NeuronPromptLookupDraft(vocab_size=16, ngram=2)
    tok, scores = d(prompt, 4)
    assert tok.tolist() == [[7]] and scores.shape == (1, 16) and scores[0, 7] == 0  # one-hot at the proposal
    ids, scores = d(torch.tensor([[7]]), 3, torch.tensor([6]))  # the target's first token, at position 6
    assert ids.tolist() == [[8, 5, 6]] and scores.shape == (3, 1, 16)
    assert scores.softmax(-1)[torch.arange(3), 0, ids[0]].tolist() == [1.0, 1.0, 1.0]
    # the target kept 2 drafts (8, 5) and said 9: its token sits at position 6 + 1 + 2
    ids, _ = d(torch.tensor([[9]]), 3, torch.tensor([9]))
    assert d.seq == [5, 6, 7, 8, 5, 6, 7, 8, 5, 9]
    # every draft kept (positions 10-12): the library feeds the last draft at 12, then the target's token at 13
    d(torch.tensor([[ids[0, -1].item()]]), 1, torch.tensor([12]))
    d(torch.tensor([[3]]), 3, torch.tensor([13]))
    assert d.seq[10:] == ids[0].tolist() + [3]
    with pytest.raises(ValueError, match="position 30"):
        d(torch.tensor([[3]]), 3, torch.tensor([30]))


class NeuronPromptLookupDraft:
    """Prompt lookup as a transformers-neuronx draft provider, so the library's ``SpeculativeGenerator(draft,
    target, k)`` drafts by n-gram lookup, with no draft model (batch 1).

    transformers-neuronx 0.13 (``speculation.py``) accepts any ``DraftProvider``: ``__call__(input_ids, k,
    cache_ids, start_ids) -> (tokens, scores)``, first with the prompt (context encoding, ``cache_ids`` None),
    then with the target's newest token and its position, asking for ``k`` drafts (``[1, k]`` tokens and
    ``[k, 1, vocab]`` scores, here one-hot). It never says which drafts were accepted; the new token's
    position does: the drafts before it are the accepted ones, so the sequence is rebuilt from the previous
    proposal. (NxD Inference 0.8 has no such hook: its ``generate(prompt_lookup_num_tokens=...)`` fails,
    see notebook 05.)"""

    def __init__(self, vocab_size: int, ngram: int = 3):
        self.lookup, self.vocab_size = PromptLookupDraft(ngram), int(vocab_size)
        self.seq: list[int] = []      # tokens at positions 0 .. len-1, all accepted
        self.pending: list[int] = []  # the last proposal, at positions len(seq) ..

    def __call__(self, input_ids: torch.Tensor, k: int, cache_ids=None, start_ids=None):
        if input_ids.shape[0] != 1:
            raise ValueError("prompt lookup drafts for batch 1 (speculative sampling runs at batch_size=1)")
        pos = 0 if cache_ids is None else int(torch.as_tensor(cache_ids).reshape(-1)[0])
        if pos == 0:  # context encoding: the prompt
            self.seq, self.pending = input_ids[0].tolist(), []
        else:  # the token at ``pos``: the drafts before it were accepted
            seq = self.seq + self.pending[:pos - len(self.seq)]
            if len(seq) != pos:
                raise ValueError(f"token at position {pos}, but the provider holds {len(seq)} tokens")
            self.seq = seq + input_ids[0].tolist()
        n = 1 if pos == 0 else int(k)
        drafts, _ = self.lookup.propose(torch.tensor(self.seq), n)
        self.pending = drafts.tolist()
        scores = torch.full((n, 1, self.vocab_size), float("-inf"))
        scores[torch.arange(n), 0, drafts] = 0.0  # one-hot: q(draft) = 1
        if pos == 0:  # DraftModelForSpeculation's context shapes: [1, 1] token, [1, vocab] scores
            return drafts[None, :1], scores[0]
        return drafts[None], scores
