"""The transformers-neuronx stand-in (tests/neuron_sim/transformers_neuronx) computes real tokens with the
reference engine and behaves as the pinned release (v0.13.0, commit f4e3818) does for its user.

Each test names the source behaviour it checks. Models are the embedded SmolLM2 with small settings
(n_positions 128, a few new tokens): every run is a real forward pass on a 2-core CPU.
"""
from __future__ import annotations

import json
import os
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contract_harness as harness  # noqa: E402

N_POS = 128


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def tnx():
    """The stand-in package (imported inside the harness's context), with fixed matmul kernels (no tuning)."""
    with harness.stand_ins() as contract:
        os.environ["NEURON_NB_GEMV"], os.environ["NEURON_NB_GEMM"] = "mkl", "mkl"
        import transformers_neuronx

        transformers_neuronx.contract = contract
        yield transformers_neuronx


@pytest.fixture(scope="module")
def path():
    import helpers

    return str(helpers.resolve_model_path(None))


@pytest.fixture(scope="module")
def prompt():
    import helpers

    return helpers.load_tokenizer(None)("The weather today is", return_tensors="pt").input_ids


@pytest.fixture(scope="module")
def target(tnx, path):
    """batch 1, tp_degree 2 requested (computed at 1), speculation k=3, presharding allowed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tnx.LlamaForSampling.from_pretrained(path, batch_size=1, n_positions=N_POS, tp_degree=2,
                                                 neuron_config=tnx.NeuronConfig(on_device_embedding=True))
    m.enable_speculative_decoder(3)
    m.to_neuron()
    return m


@pytest.fixture(scope="module")
def draft(tnx, path):
    """batch 1 with one context bucket of 4 tokens: longer prompts finish token by token."""
    m = tnx.LlamaForSampling.from_pretrained(path, batch_size=1, n_positions=N_POS, tp_degree=1,
                                             context_length_estimate=4)
    m.to_neuron()
    return m


@pytest.fixture(scope="module")
def batch2(tnx, path):
    m = tnx.LlamaForSampling.from_pretrained(path, batch_size=2, n_positions=N_POS, tp_degree=1)
    m.to_neuron()
    return m


def greedy(model, ids, n, **kw):
    return model.sample(ids, ids.shape[1] + n, top_k=1, eos_token_override=-1, **kw)


@pytest.fixture(scope="module")
def greedy_ref(target, prompt):
    """The engine's own greedy sample (helpers.engine.NeuronModel.sample), 9 new tokens."""
    return target._engines[1].sample(prompt, prompt.shape[1] + 9, top_k=1, eos_token_override=[])


class Recorder:
    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        self.puts.append(value.clone())

    def end(self):
        self.ends += 1


# ------------------------------------------------------------------------------------------ sample()
def test_signatures_and_defaults_as_pinned(tnx):
    import inspect

    init = inspect.signature(tnx.LlamaForSampling.__init__).parameters
    assert init["tp_degree"].default == 2 and init["n_positions"].default == 2048 and init["amp"].default == "f32"
    save = inspect.signature(tnx.LlamaForSampling.save).parameters
    assert save["sharded_weights"].default is False
    from transformers_neuronx.speculation import SpeculativeGenerator

    assert inspect.signature(SpeculativeGenerator.__init__).parameters["k"].default == 4
    assert "cache_ids" not in inspect.signature(tnx.MistralForSampling.sample).parameters


def test_greedy_sample_equals_the_engines_greedy_sample(target, prompt, greedy_ref):
    """sampling.py sample_llama / sample_loop_llama with top_k=1 over the engine's logits."""
    out = greedy(target, prompt, 9)
    assert out.shape == greedy_ref.shape and torch.equal(out, greedy_ref), (out, greedy_ref)


def test_streamer_and_stopping_criteria_as_the_source_calls_them(tnx, target, prompt, greedy_ref):
    """sample_loop_llama: put((batch, 1)) per step, never the prompt; end() once; criteria get the PROMPT ids
    (aws-neuron/transformers-neuronx#75) and the step's probabilities; a truthy result ends the loop."""
    from transformers_neuronx.stopping_criteria import StoppingCriteriaList

    seen = []

    def third_call(ids, scores):
        seen.append((ids.clone(), scores.shape))
        return len(seen) == 3

    rec = Recorder()
    L = prompt.shape[1]
    out = target.sample(prompt, L + 8, top_k=1, streamer=rec, stopping_criteria_list=StoppingCriteriaList([third_call]),
                        eos_token_override=-1)
    assert out.shape == (1, L + 3) and torch.equal(out, greedy_ref[:, :L + 3])
    assert [p.shape for p in rec.puts] == [(1, 1)] * 3 and rec.ends == 1
    assert torch.equal(torch.cat(rec.puts, 1), out[:, L:])
    assert all(torch.equal(ids, prompt) for ids, _ in seen), "criteria must receive the prompt, not the ids so far"
    assert all(shape == (1, 1) for _, shape in seen)  # probs over the top_k=1 candidates


def test_generation_adapter_runs_transformers_per_row_criteria_on_the_ids_so_far(tnx, batch2):
    """generation_utils.py HuggingFaceGenerationModelAdapter (the route suggested on #75): transformers' generate()
    drives the model's forward() (context encoding at cache_ids 0..n-1 with start_ids from the attention mask, then
    one token per step), so its criteria get the ids so far, one flag per row; a finished row is padded while the
    other continues (transformers pads only with an EOS criterion in the list: eos_token_id given); the tokens are
    sample()'s greedy tokens."""
    from transformers import AutoConfig, PreTrainedModel, StoppingCriteria, StoppingCriteriaList

    if not hasattr(PreTrainedModel, "generate"):
        pytest.skip("transformers >= 4.50 (PreTrainedModel without GenerationMixin): transformers-neuronx 0.13 pins "
                    "transformers < 4.48; the tnx lane runs this under 4.47.1")
    import helpers

    tok = helpers.load_tokenizer(None)
    tok.padding_side = "left"
    enc = tok(["The capital of France is", "Once upon a time"], return_tensors="pt", padding=True)
    P = enc.input_ids.shape[1]
    assert bool((enc.attention_mask == 0).any()), "one row must be left-padded"

    class StopAfter(StoppingCriteria):  # row r is done after stops[r] new tokens
        def __init__(self, stops):
            self.stops, self.seen = torch.tensor(stops), []

        def __call__(self, input_ids, scores, **kwargs):
            self.seen.append(input_ids.shape[1])
            return input_ids.shape[1] - P >= self.stops

    crit = StopAfter([2, 5])
    adapter = tnx.HuggingFaceGenerationModelAdapter(AutoConfig.from_pretrained(helpers.resolve_model_path(None)), batch2)
    out = adapter.generate(enc.input_ids, attention_mask=enc.attention_mask, max_new_tokens=8, do_sample=False,
                           eos_token_id=tok.eos_token_id, pad_token_id=0, stopping_criteria=StoppingCriteriaList([crit]))
    ref = batch2.sample(enc.input_ids, P + 5, start_ids=(enc.attention_mask == 0).sum(dim=1), top_k=1,
                        eos_token_override=-1)
    assert crit.seen == [P + 1, P + 2, P + 3, P + 4, P + 5], crit.seen  # the ids so far, not the prompt (#75)
    assert out.shape == (2, P + 5) and torch.equal(out[1], ref[1]), (out, ref)
    assert torch.equal(out[0, :P + 2], ref[0, :P + 2]) and out[0, P + 2:].tolist() == [0, 0, 0]


def test_sampling_arguments_are_validated_with_the_sources_messages(target, prompt):
    L = prompt.shape[1]
    with pytest.raises(ValueError, match="^temperature has to be a strictly positive float.$"):
        target.sample(prompt, L + 2, top_k=1, temperature=1)  # an int
    with pytest.raises(ValueError, match="^top_k has to be a strictly positive int.$"):
        target.sample(prompt, L + 2, top_k=0)
    with pytest.raises(ValueError, match="top_p has to be a strictly positive float"):
        target.sample(prompt, L + 2, top_p=1)
    with pytest.raises(ValueError, match=re.escape("Model not compiled for batch_size : 2. Acceptable batch_size is "
                                                   "one of the following [1]")):
        target.sample(prompt.repeat(2, 1), L + 2)


def test_top_k_top_p_filtering_as_transcribed(tnx):
    from transformers_neuronx.sampling import top_k_top_p_filtering

    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    values, idx = top_k_top_p_filtering(scores.clone(), top_k=3, top_p=0.7)
    # top-3 (0, 1, 2), then the smallest prefix whose probability reaches 0.7 among them: tokens 0 and 1
    assert idx.tolist() == [[0, 1]] and torch.isfinite(values).all()
    values, idx = top_k_top_p_filtering(scores.clone(), top_k=None, top_p=0.9)
    assert idx.tolist() == [[0, 1, 2]]


def test_eos_finished_rows_emit_the_first_eos_id_and_the_loop_ends_when_all_are_done(batch2, tnx):
    """sample_loop_llama: per-row done flags; a done row emits eos_token_id[0] (unless it samples another EOS
    id) while the model keeps being fed the sampled token; the loop breaks once every row is done."""
    tok = __import__("helpers").load_tokenizer(None)
    ids = tok(["Once upon a time", "The capital of France"], return_tensors="pt").input_ids
    assert ids.shape[1] == 4, ids  # no padding in this pair
    free = greedy(batch2, ids, 6)[:, 4:]  # no EOS stop
    a, b = int(free[0, 1]), int(free[1, 3])
    assert a != b and int(free[0, 0]) not in (a, b) and a not in free[1, :4].tolist() \
        and b not in free[1, :3].tolist(), free
    out = batch2.sample(ids, 4 + 6, top_k=1, eos_token_override=[a, b])
    new = out[:, 4:]
    assert new.shape[1] == 4, new  # row 1 finishes at its 4th token: every row is done
    expected0 = [int(free[0, 0]), a] + [b if int(t) == b else a for t in free[0, 2:4]]
    assert new[0].tolist() == expected0 and new[1].tolist() == free[1, :4].tolist()


def test_start_ids_mask_the_left_padding(batch2, tnx):
    tok = __import__("helpers").load_tokenizer(None)
    short = tok("Hello there", return_tensors="pt").input_ids            # 2 tokens
    long = tok("Tell me a short joke", return_tensors="pt").input_ids    # 5 tokens
    n_pad = long.shape[1] - short.shape[1]
    ref = greedy(batch2, short.repeat(2, 1), 4)[0, short.shape[1]:]
    padded = torch.cat([torch.cat([torch.zeros(1, n_pad, dtype=torch.long), short], 1), long])
    out = greedy(batch2, padded, 4, start_ids=torch.tensor([n_pad, 0]))
    assert out[0, long.shape[1]:].tolist() == ref.tolist()
    pad = torch.cat([torch.full((1, n_pad), 2), short], 1)  # SmolLM2's pad_token_id is 2
    with pytest.raises(tnx.contract.ContractError, match="start_ids"):
        greedy(batch2, torch.cat([pad, long]), 2)


# ------------------------------------------------------------------------------------------ buckets
def test_bucket_rules_as_transcribed(tnx):
    from transformers_neuronx import bucket

    assert bucket.token_sizes(2048) == [128, 256, 512, 1024, 2048] and bucket.token_sizes(300) == [128, 256, 300]
    assert bucket.context_sizes(None, [128, 256]) == [64, 128] and bucket.context_sizes(0) == []
    assert bucket.find([64, 128], 65) == 128 and bucket.find([64, 128], 500) == 128 and bucket.find([], 3) is None


def test_prompt_past_the_largest_context_bucket_finishes_token_by_token(tnx, draft, target, prompt, greedy_ref):
    """base.py context(): encode up to the largest context bucket, the remainder one token at a time."""
    L = prompt.shape[1]
    tnx.contract.reset()
    out = greedy(draft, prompt, 4)  # context bucket 4 < prompt
    (_, kw), = tnx.contract.calls("tnx.context")
    assert kw == {"context_length": L, "estimate": 4, "serial_tokens": L - 4}
    assert torch.equal(out, greedy_ref[:, :L + 4])
    tnx.contract.reset()
    greedy(target, prompt, 1)  # default context buckets: half the token bucket
    (_, kw), = tnx.contract.calls("tnx.context")
    assert kw == {"context_length": L, "estimate": 64, "serial_tokens": 0}


def test_positions_past_n_positions_are_refused(tnx, target):
    with pytest.raises(tnx.contract.ContractError, match="past n_positions=128"):
        target.sample(torch.ones(1, N_POS + 2, dtype=torch.long), N_POS + 4, top_k=1)


# ------------------------------------------------------------------------------------------ compiled batch sizes
def test_sample_with_a_batch_size_not_compiled_fails_as_the_source(target, batch2, prompt):
    """llama/model.py sample: ``if batch_size not in self.batch_sizes: raise ValueError(...)``."""
    with pytest.raises(ValueError, match=re.escape("Model not compiled for batch_size : 2. Acceptable batch_size is "
                                                   "one of the following [1]")):
        greedy(target, prompt.repeat(2, 1), 2)
    with pytest.raises(ValueError, match=re.escape("Model not compiled for batch_size : 1. Acceptable batch_size is "
                                                   "one of the following [2]")):
        greedy(batch2, prompt, 2)


def test_forward_with_a_batch_size_not_compiled_fails_where_the_source_looks_the_graph_up(target, draft, prompt):
    """forward(): a prompt goes to base.py context(), which takes ``decoder_lm_head_for_context[estimate,
    batch_size]`` (KeyError((estimate, batch_size))); one token goes to the token decoder, whose fully unrolled
    program looks up ``executors[npos, batch_size]`` (decoder.py DecoderProgramFullyUnrolled.execute)."""
    n = prompt.shape[1]
    with pytest.raises(KeyError) as err:
        target(prompt.repeat(2, 1))
    assert err.value.args == ((64, 2),)  # context bucket 64 (n_positions 128 // 2), batch 2
    with pytest.raises(KeyError) as err:
        target(prompt[:, :1].repeat(3, 1), cache_ids=torch.tensor([n]))
    assert err.value.args == ((128, 3),)  # token bucket 128 for position n, batch 3
    # a prompt longer than the only context bucket (4): that bucket's graph first, at batch 2
    with pytest.raises(KeyError) as err:
        draft(torch.ones(2, 6, dtype=torch.long))
    assert err.value.args == ((4, 2),)


def test_forward_on_a_decoder_not_fully_unrolled_fails_on_the_batch_index(tnx, path, prompt):
    """unroll below the number of layers: DecoderProgramMultiLayer.execute takes ``self.batch_sizes.index(
    batch_size)``: ValueError '2 is not in list'."""
    m = tnx.LlamaForSampling.from_pretrained(path, batch_size=1, n_positions=N_POS, tp_degree=1, unroll=1)
    m.to_neuron()
    first = m(prompt)
    assert first.shape == (1, m.config.vocab_size)
    with pytest.raises(ValueError, match="^2 is not in list$"):
        m(prompt[:, :1].repeat(2, 1), cache_ids=torch.tensor([prompt.shape[1]]))


# ------------------------------------------------------------------------------------------ speculation
def greedy_acceptor(tnx):
    """What a client must pass for greedy speculation: speculation.py has no greedy TokenAcceptor."""
    from transformers_neuronx.speculation import TokenAcceptor

    class GreedyTokenAcceptor(TokenAcceptor):
        def __call__(self, draft_ids, draft_scores, target_scores):
            target_ids = target_scores.argmax(dim=-1)                       # [batch, k]
            agree = (draft_ids == target_ids[:, :-1]).long().cumprod(dim=1)
            accepted = torch.zeros_like(target_ids)
            for row, n in enumerate(agree.sum(dim=1).tolist()):
                accepted[row, :n + 1] = target_ids[row, :n + 1]
            return accepted

    return GreedyTokenAcceptor()


def test_speculation_with_a_greedy_acceptor_reproduces_greedy_decoding(tnx, draft, target, prompt, greedy_ref):
    """speculation.py SpeculativeGenerator.sample; streamer: the prompt first, then [1, 1], then [1, k] blocks."""
    from transformers_neuronx.speculation import SpeculativeGenerator

    rec = Recorder()
    L = prompt.shape[1]
    out = SpeculativeGenerator(draft, target, k=3, acceptor=greedy_acceptor(tnx)).sample(prompt, L + 9, streamer=rec)
    assert torch.equal(out, greedy_ref), (out, greedy_ref)
    assert torch.equal(rec.puts[0], prompt) and rec.puts[1].shape == (1, 1) and rec.ends == 1
    assert all(p.shape == (1, 3) for p in rec.puts[2:]) and len(rec.puts) >= 4


def test_default_acceptor_samples_even_when_greedy_was_meant(tnx, draft, target, prompt, greedy_ref):
    """DefaultTokenAcceptor: rejection sampling at temperature 1 over the full vocabulary: with a draft that
    agrees with the target, each block's last token is sampled from the target."""
    from transformers_neuronx.speculation import DefaultTokenAcceptor, SpeculativeGenerator

    gen = SpeculativeGenerator(draft, target, k=3)
    assert isinstance(gen.acceptor, DefaultTokenAcceptor)
    torch.manual_seed(0)  # it draws from the global torch RNG
    out = gen.sample(prompt, prompt.shape[1] + 9)
    assert out.shape == greedy_ref.shape and not torch.equal(out, greedy_ref), out


def test_default_acceptor_rule(tnx):
    """DefaultTokenAcceptor on synthetic scores: accepted while rand < min(1, p_target / p_draft); a rejection
    is replaced by a sample of max(p_target - p_draft, 0); all accepted -> one more sample of the target."""
    from transformers_neuronx.speculation import DefaultTokenAcceptor

    big = 30.0
    draft_scores = torch.full((1, 2, 4), -big)
    draft_scores[0, 0, 1] = draft_scores[0, 1, 2] = big          # draft sure of 1 then 2
    target_scores = torch.full((1, 3, 4), -big)
    target_scores[0, 0, 1] = big                                 # target agrees on the first
    target_scores[0, 1, 3] = big                                 # and wants 3 instead of 2
    out = DefaultTokenAcceptor()(torch.tensor([[1, 2]]), draft_scores, target_scores)
    assert out.tolist() == [[1, 3, 0]]                           # zero-padded
    target_scores[0, 1, 3], target_scores[0, 1, 2], target_scores[0, 2, 0] = -big, big, big
    out = DefaultTokenAcceptor()(torch.tensor([[1, 2]]), draft_scores, target_scores)
    assert out.tolist() == [[1, 2, 0]]  # the extra token is sampled from the target's last row: token 0 here


def test_speculation_errors_as_the_source(tnx, draft, target, batch2, prompt):
    from transformers_neuronx.speculation import SpeculativeGenerator

    with pytest.raises(AssertionError, match="The attention mask needs to be provided for speculation where "
                                             "batch_size>1"):
        SpeculativeGenerator(batch2, batch2, k=3).sample(prompt.repeat(2, 1), prompt.shape[1] + 4)
    with pytest.raises(tnx.contract.ContractError, match="right padding"):
        SpeculativeGenerator(draft, target, k=3).sample(prompt, prompt.shape[1] + 4,
                                                        attention_mask=torch.tensor([[0] + [1] * (prompt.shape[1] - 1)]))
    with pytest.raises(tnx.contract.ContractError, match="before"):
        draft.enable_speculative_decoder(3)  # after to_neuron()
    with pytest.raises(KeyError, match="None"):  # no speculation graph: the auto-inferred bucket is None
        SpeculativeGenerator(target, draft, k=3).sample(prompt, prompt.shape[1] + 4)


def test_mistral_has_no_speculative_decoder(tnx, path, tmp_path):
    for f in Path(path).iterdir():
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "config.json").unlink()
    cfg = json.loads((Path(path) / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral"}))
    m = tnx.NeuronAutoModelForCausalLM.from_pretrained(str(tmp_path), n_positions=N_POS, tp_degree=1)
    assert type(m).__name__ == "MistralForSampling"
    with pytest.raises(AttributeError, match="decoder_lm_head_for_speculation"):
        m.enable_speculative_decoder(3)
    assert not hasattr(m, "speculative_forward")


# ------------------------------------------------------------------------------------------ save / load
NEFF = re.compile(r"^[0-9a-f]{20}\.neff$")
MISMATCH = "Could not find a matching NEFF for your HLO in this directory"


def test_save_writes_one_artifact_per_graph_and_load_refuses_another_configuration(tnx, path, target, tmp_path):
    d = tmp_path / "artifacts"
    target.save(str(d))
    names = sorted(os.listdir(d))
    assert len(names) == 3 and all(NEFF.match(n) for n in names), names  # token 128, context 64, speculation k=3

    def reloaded(**kw):
        settings = dict(batch_size=1, n_positions=N_POS, tp_degree=2, neuron_config=tnx.NeuronConfig(
            on_device_embedding=True))
        settings.update(kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tnx.LlamaForSampling.from_pretrained(path, **settings)

    for change in (dict(tp_degree=1), dict(amp="bf16"), dict(n_positions=[128, 256]),
                   dict(neuron_config=tnx.NeuronConfig()), dict(batch_size=2)):
        m = reloaded(**change)
        m.enable_speculative_decoder(3)
        m.load(str(d))
        with pytest.raises(FileNotFoundError, match=MISMATCH):
            m.to_neuron()
    m = reloaded()  # without the speculation graph it was saved with: the other graphs match
    m.load(str(d))
    m.to_neuron()
    assert m.is_compiled()
    with pytest.raises(tnx.contract.ContractError, match="load"):
        m.load(str(d))
    m = reloaded()
    m.load(str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="Did not find directory"):
        m.to_neuron()


def test_presharded_round_trip_gives_identical_tokens(tnx, path, target, batch2, prompt, tmp_path):
    """base.py save(sharded_weights=True): asserts on_device_embedding (after writing the NEFFs), writes the
    weights and config.json with is_presharded_checkpoint; from_pretrained(dir) loads them and to_neuron()
    asserts on_device_embedding again."""
    bad = tmp_path / "no-embedding"
    with pytest.raises(AssertionError, match="^on_device_embedding must be True to save and load presharded weights$"):
        batch2.save(str(bad), sharded_weights=True)
    assert any(NEFF.match(n) for n in os.listdir(bad)) and not (bad / "config.json").exists()

    d = tmp_path / "llama-artifacts"
    target.save(str(d), sharded_weights=True)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["is_presharded_checkpoint"] is True and cfg["tp_degree"] == 2 and cfg["model_type"] == "llama"
    before = greedy(target, prompt, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = tnx.LlamaForSampling.from_pretrained(str(d), batch_size=1, n_positions=N_POS, tp_degree=2)
        with pytest.raises(AssertionError, match="on_device_embedding must be True"):
            plain.to_neuron()
        m = tnx.LlamaForSampling.from_pretrained(str(d), batch_size=1, n_positions=N_POS, tp_degree=2,
                                                 neuron_config=tnx.NeuronConfig(on_device_embedding=True))
    m.enable_speculative_decoder(3)
    m.load(str(d))
    m.to_neuron()
    assert torch.equal(greedy(m, prompt, 5), before)


# ------------------------------------------------------------------------------------------ refusals
def test_config_without_rope_theta_is_refused(tnx, path, tmp_path):
    cfg = json.loads((Path(path) / "config.json").read_text())
    cfg.pop("rope_theta", None)
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 100000.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(tnx.contract.ContractError, match="rope_theta=10000"):
        tnx.LlamaForSampling.from_pretrained(str(tmp_path), n_positions=N_POS)


def test_unknown_keywords_are_refused(tnx, path):
    with pytest.raises(tnx.contract.ContractError, match="n_position"):
        tnx.LlamaForSampling.from_pretrained(path, n_position=N_POS)


def test_gqa_fallback_as_the_decoder_does_it(tnx, path):
    """decoder.py check_gqa_fallback: SmolLM2 has 9 query / 3 KV heads."""
    GQA = tnx.GQA
    cases = [(None, 1, 1, GQA.SHARD_OVER_HEADS, 0), (None, 2, 1, GQA.REPLICATED_HEADS, 1),
             (GQA.SHARD_OVER_BATCH, 2, 1, GQA.REPLICATED_HEADS, 2), (GQA.SHARD_OVER_BATCH, 3, 3, GQA.SHARD_OVER_BATCH, 0),
             (GQA.ALL_GATHER_HEADS, 3, 1, GQA.ALL_GATHER_HEADS, 0)]
    for requested, tp, batch, expected, n_warnings in cases:
        nc = tnx.NeuronConfig(group_query_attention=requested)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tnx.LlamaForSampling.from_pretrained(path, n_positions=N_POS, tp_degree=tp, batch_size=batch,
                                                 neuron_config=nc)
        assert nc.group_query_attention == expected, (requested, tp, batch)
        assert len([w for w in caught if "GQA" in str(w.message) or "heads" in str(w.message)
                    or "batch size" in str(w.message)]) == n_warnings, [str(w.message) for w in caught]
