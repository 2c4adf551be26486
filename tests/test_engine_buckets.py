"""Buckets in the reference engine: which graph runs each step, and what happens to a prompt longer
than the largest context bucket under each library's rules."""
from collections import Counter

import pytest
import torch

import helpers
from helpers.planning import buckets as bk


def _ids(n, batch=1):
    g = torch.Generator().manual_seed(0)
    return torch.randint(10, 40000, (batch, n), generator=g)


def _trace(model):
    """Wrap every graph to count its calls by (kind, bucket)."""
    calls = Counter()
    for key, fn in list(model.graphs.items()):
        model.graphs[key] = (lambda k, f: lambda *a: (calls.update([k]), f(*a))[1])(key, fn)
    return calls


@pytest.fixture(scope="module")
def tnx_model():
    return helpers.NeuronModel.from_pretrained(None, n_positions=256).to_neuron()


@pytest.fixture(scope="module")
def nxdi_model():
    return helpers.NeuronModel.from_pretrained(None, n_positions=256, nxdi_bucketing=bk.NxDIBucketing()).to_neuron()


def test_each_step_runs_in_its_bucket(tnx_model, nxdi_model):
    ids = _ids(100)
    # transformers-neuronx: context buckets [64, 128] (half the token buckets), smallest bucket >= length
    calls = _trace(tnx_model)
    tnx_model.sample(ids, 140, top_k=1, eos_token_override=[])
    # steps write slots 100..138 and attend over slot+1 positions: 101..128 -> 128, 129..139 -> 256
    assert calls == Counter({("context", 128): 1, ("token", 128): 28, ("token", 256): 11})
    # NxD Inference: strict first_fit, so KV length 128 already needs the 256 bucket
    calls = _trace(nxdi_model)
    nxdi_model.sample(ids, 140, top_k=1, eos_token_override=[])
    assert calls == Counter({("context", 128): 1, ("token", 128): 27, ("token", 256): 12})


def test_bucket_choice_does_not_change_the_result(tnx_model, nxdi_model):
    """Oracle: the unbucketed model (one context bucket and one token bucket of full length)."""
    ids = _ids(100, batch=2)
    single = helpers.NeuronModel.from_pretrained(None, batch_size=2, n_positions=[256],
                                                 context_length_estimate=[256]).to_neuron()
    assert single.token_buckets == [256] and single.context_buckets == [256]
    ref = single.sample(ids, 140, top_k=1, eos_token_override=[], output_logits=True)
    ref_logits = single.stats["logits"]
    for kw in ({}, {"nxdi_bucketing": bk.NxDIBucketing()}):
        m = helpers.NeuronModel.from_pretrained(None, batch_size=2, n_positions=256, **kw).to_neuron()
        out = m.sample(ids, 140, top_k=1, eos_token_override=[], output_logits=True)
        assert torch.equal(out, ref)
        assert (m.stats["logits"] - ref_logits).abs().max().item() < 1e-4


def test_nxdi_long_prompt_raises_before_any_compute():
    m = helpers.NeuronModel.from_pretrained(
        None, n_positions=256, nxdi_bucketing=bk.NxDIBucketing(context_encoding_buckets=[32, 64]))
    m.to_neuron()
    calls = _trace(m)
    with pytest.raises(bk.BucketOverflowError,
                       match=r"Input len 80 exceeds largest bucket \(64\) for context_encoding_model"):
        m.sample(_ids(80), 100, top_k=1)
    assert not calls


def test_nxdi_truncation_warns_and_keeps_the_first_tokens(tnx_model):
    m = helpers.NeuronModel.from_pretrained(None, n_positions=256, nxdi_bucketing=bk.NxDIBucketing(
        context_encoding_buckets=[32, 64], allow_input_truncation=True)).to_neuron()
    ids = _ids(80)
    with pytest.warns(UserWarning, match=r"Truncating input \(80 tokens\) to max_context_length \(64 tokens\)"):
        out = m.sample(ids, 90, top_k=1, eos_token_override=[])
    assert torch.equal(out[:, :64], ids[:, :64])
    assert torch.equal(out, tnx_model.sample(ids[:, :64], 90, top_k=1, eos_token_override=[]))


def test_tnx_long_prompt_is_encoded_then_continued(tnx_model):
    """No error and no truncation: 150 tokens > the largest context bucket (128)."""
    calls = _trace(tnx_model)
    out = tnx_model.sample(_ids(150), 152, top_k=1, eos_token_override=[])
    assert out.shape[1] == 152
    assert calls[("context", 128)] == 1 and calls[("token", 256)] == 22 + 1
