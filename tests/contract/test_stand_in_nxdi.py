"""The NxD Inference 0.8 stand-in (tests/neuron_sim/neuronx_distributed_inference) behaves as the pinned release.

Runs in the nxdi lane (``bash ci/neuron_sim.sh nxdi``: transformers 4.57.1, the NxDI pin); skipped elsewhere.
Each test states the pinned source it checks (aws-neuron/neuronx-distributed-inference cd3abf3, SDK 2.28.0) and
can fail: the generate loop is Hugging Face's own, with NxDI's overrides, over the reference engine.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not transformers.__version__.startswith("4.57."),
                                reason="the NxD Inference 0.8 stand-in runs under transformers 4.57 (nxdi lane)")

SEQ_LEN, CTX = 128, [32, 64]
K = 4  # speculation_length of the speculative target


@pytest.fixture(scope="module")
def env():
    """Fixed matmul kernels (no per-process tuning: only speed differs) and the stand-in modules."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NEURON_NB_GEMV", "mkl")
        mp.setenv("NEURON_NB_GEMM", "mkl")
        import helpers
        from helpers.neuron import neuron_model_dir, nxdi_generation_adapter
        from neuronx_distributed_inference.models.config import NeuronConfig
        from neuronx_distributed_inference.models.llama.modeling_llama import (LlamaInferenceConfig,
                                                                               NeuronLlamaForCausalLM)
        from neuronx_distributed_inference.utils import hf_adapter

        path = neuron_model_dir(None)

        def config(**kw):
            settings = dict(seq_len=SEQ_LEN, torch_dtype="float32", enable_bucketing=True,
                            context_encoding_buckets=list(CTX), max_context_length=max(CTX))
            settings.update(kw)
            return LlamaInferenceConfig(NeuronConfig(**settings), load_config=hf_adapter.load_pretrained_config(path))

        def build(directory, **kw):
            model = NeuronLlamaForCausalLM(path, config(**kw))
            model.compile(str(directory))
            model.load(str(directory))
            return model

        yield {"helpers": helpers, "path": path, "config": config, "build": build, "cls": NeuronLlamaForCausalLM,
               # generate() needs the workaround for 0.8's tensor_capture_hook bug (tests below): helpers.neuron's
               "Adapter": nxdi_generation_adapter(), "Published": hf_adapter.HuggingFaceGenerationAdapter,
               "hf_adapter": hf_adapter, "tok": helpers.load_tokenizer(None)}


@pytest.fixture(scope="module")
def main(env, tmp_path_factory):
    """batch_size=2, no speculation: context-encoding + token-generation models."""
    model = env["build"](tmp_path_factory.mktemp("main"), batch_size=2)
    return model, env["Adapter"](model)


@pytest.fixture(scope="module")
def chat(env):
    """Two chat prompts (the model answers briefly, then <|im_end|> = eos 2), right-padded as NxDI expects."""
    tok = env["tok"]
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in ("Hi", "What is 2+2?")]
    tok.padding_side = "right"
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


def greedy_reference(model, ids, mask, length):
    """The reference engine's own greedy sample (left-padded rows + start_ids), as right-padded rows."""
    n = mask.sum(dim=1)
    L = ids.shape[1]
    left = torch.zeros_like(ids)
    for r in range(ids.shape[0]):
        left[r, L - int(n[r]):] = ids[r, :int(n[r])]
    out = model._runtime.engine.sample(left, length, start_ids=L - n, top_k=1, eos_token_override=[])
    return out[:, L:]


def gconfig(**kw):
    from transformers import GenerationConfig

    return GenerationConfig(**kw)


# ------------------------------------------------------------------------------------------ generate
def test_greedy_generate_equals_the_reference_engine(main, chat):
    """hf_adapter.py _sample (right padding, position_ids from the mask) -> the engine's greedy tokens."""
    model, adapter = main
    ids, mask = chat
    max_length = ids.shape[1] + 6
    out = adapter.generate(ids, attention_mask=mask, max_length=max_length, do_sample=False, eos_token_id=None)
    assert out.shape == (2, max_length) and torch.equal(out[:, :ids.shape[1]], ids)
    ref = greedy_reference(model, ids, mask, max_length)
    # Row 1 is padded on the right: its new tokens follow the pads, and must still be its own continuation.
    assert torch.equal(out[:, ids.shape[1]:], ref), (out[:, ids.shape[1]:], ref)


# ------------------------------------------------------------------ the tensor_capture_hook bug (PR #136)
@pytest.fixture
def published(env, monkeypatch):
    """The adapter as published, in a process where no workaround has defined the module global yet."""
    monkeypatch.delattr(env["hf_adapter"], "tensor_capture_hook", raising=False)
    return env["Published"]


def test_published_generate_raises_name_error(main, chat, published):
    """cd3abf3 utils/hf_adapter.py:313 reads ``tensor_capture_hook``, a name it never defines: every generate()."""
    ids, mask = chat
    with pytest.raises(NameError, match="name 'tensor_capture_hook' is not defined"):
        published(main[0]).generate(ids, attention_mask=mask, max_length=ids.shape[1] + 2, do_sample=False)


def test_published_assisted_generate_raises_name_error(main, speculative, published):
    """_standard_assisted_decoding calls prepare_inputs_for_generation too (the target's, then the draft's)."""
    target, _, _ = speculative
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    with pytest.raises(NameError, match="tensor_capture_hook"):
        published(target).generate(ids, attention_mask=torch.ones_like(ids), max_length=12, do_sample=False,
                                   assistant_model=published(main[0]))
    main[0].reset()


def test_defining_the_name_alone_gives_a_type_error(env, main, chat, published, monkeypatch):
    """0.8's NeuronBaseForCausalLM.forward has no tensor_capture_hook parameter and no **kwargs."""
    monkeypatch.setattr(env["hf_adapter"], "tensor_capture_hook", None, raising=False)
    ids, mask = chat
    with pytest.raises(TypeError, match="unexpected keyword argument 'tensor_capture_hook'"):
        published(main[0]).generate(ids, attention_mask=mask, max_length=ids.shape[1] + 2, do_sample=False)


@pytest.fixture
def fixed_in_2_29(env, monkeypatch):
    """The stand-in patched to 2.29's fix (ef2731e): prepare_inputs_for_generation reads its own local
    ``tensor_capture_hook = kwargs.get("tensor_capture_hook", None)`` and forward takes the parameter."""
    import inspect
    import textwrap

    from neuronx_distributed_inference.models.model_base import NeuronBaseForCausalLM

    hf = env["hf_adapter"]
    src = textwrap.dedent(inspect.getsource(hf.HuggingFaceGenerationAdapter.prepare_inputs_for_generation))
    line = '    input_capture_hook = kwargs.get("input_capture_hook", None)\n'
    assert src.count(line) == 1
    src = src.replace(line, line + '    tensor_capture_hook = kwargs.get("tensor_capture_hook", None)\n')
    scope = {}
    exec(compile(src, hf.__file__, "exec"), vars(hf), scope)
    monkeypatch.setattr(hf.HuggingFaceGenerationAdapter, "prepare_inputs_for_generation",
                        scope["prepare_inputs_for_generation"])
    import functools

    import neuronx_distributed_inference.models.model_base as model_base

    fsrc = textwrap.dedent(inspect.getsource(NeuronBaseForCausalLM.forward))
    last = "    tf_args: Optional[List[torch.Tensor]] = None\n"
    assert fsrc.count(last) == 1
    fsrc = fsrc.replace(last, "    tf_args: Optional[List[torch.Tensor]] = None,\n"
                              "    tensor_capture_hook: Optional[Callable] = None,\n")
    fscope = {}
    exec(compile(fsrc, model_base.__file__, "exec"), vars(model_base), fscope)
    forward = fscope["forward"]
    seen = []

    @functools.wraps(forward)
    def forward_2_29(self, *args, **kwargs):
        seen.append(kwargs.get("tensor_capture_hook", "absent"))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(NeuronBaseForCausalLM, "forward", forward_2_29)
    monkeypatch.delattr(hf, "tensor_capture_hook", raising=False)
    return seen


def test_the_2_29_fix_needs_no_workaround(env, main, chat, fixed_in_2_29):
    ids, mask = chat
    out = env["Published"](main[0]).generate(ids, attention_mask=mask, max_length=ids.shape[1] + 3, do_sample=False)
    assert out.shape == (2, ids.shape[1] + 3) and fixed_in_2_29 and set(fixed_in_2_29) == {None}  # passed, None


@pytest.mark.parametrize("release", ["0.8", "2.29"])
def test_the_workaround_generates_on_both_releases(env, main, chat, release, request, published):
    """helpers.neuron's GenerationAdapter (the notebooks' NxDI cells carry the same class): the tokens of the
    reference engine, on the bug-faithful stand-in and on the stand-in patched to 2.29."""
    seen = request.getfixturevalue("fixed_in_2_29") if release == "2.29" else None
    ids, mask = chat
    model = main[0]
    length = ids.shape[1] + 4
    out = env["Adapter"](model).generate(ids, attention_mask=mask, max_length=length, do_sample=False,
                                         eos_token_id=None)
    assert torch.equal(out[:, ids.shape[1]:], greedy_reference(model, ids, mask, length))
    if release == "2.29":
        assert seen and set(seen) == {"absent"}  # the workaround pops the entry: 2.29's forward takes its default


def test_generation_config_max_length_20_counts_new_tokens(main, monkeypatch):
    """transformers 4.57 _prepare_generated_length: a GenerationConfig whose max_length equals the default (20),
    not given as a generate keyword, becomes 20 + prompt length (what _sample's MaxLengthCriteria receives)."""
    _, adapter = main
    seen = []

    class Seen(Exception):
        pass

    def spy(self, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        seen.append(stopping_criteria[0].max_length)
        raise Seen

    monkeypatch.setattr(type(adapter), "_sample", spy)
    ids = torch.ones(2, 6, dtype=torch.long)
    for kwargs in ({"generation_config": gconfig(do_sample=False, max_length=20)},
                   {"generation_config": gconfig(do_sample=False, max_length=21)}, {"max_length": 20}):
        with pytest.raises(Seen):
            adapter.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    assert seen == [26, 21, 20]


def test_eos_none_in_generation_config_still_stops_at_eos(main, chat):
    """The trap: transformers' _prepare_generation_config refills eos_token_id=None from the adapter's
    generation config (eos 2 from config.json); only a keyword (applied afterwards) switches it off."""
    _, adapter = main
    ids, mask = chat
    max_length = ids.shape[1] + 16  # both answers end (<|im_end|>) within 12 tokens
    assert adapter.generation_config.eos_token_id == 2
    out = adapter.generate(ids, attention_mask=mask,
                           generation_config=gconfig(do_sample=False, max_length=max_length, eos_token_id=None))
    new = out[:, ids.shape[1]:]
    assert out.shape[1] < max_length, "eos_token_id=None in a GenerationConfig must not switch EOS off"
    assert all(2 in row.tolist() for row in new)
    for row in new:  # after its EOS a finished row gets pad_token_id (2, refilled as well)
        first = row.tolist().index(2)
        assert (row[first:] == 2).all()
    off = adapter.generate(ids, attention_mask=mask, generation_config=gconfig(do_sample=False, max_length=max_length),
                           eos_token_id=None)
    assert off.shape[1] == max_length
    for r, row in enumerate(new):  # the same tokens up to each row's EOS, then it goes on
        n = row.tolist().index(2) + 1
        assert torch.equal(off[r, ids.shape[1]:ids.shape[1] + n], row[:n])


def test_stopping_criteria_are_called_as_nxdi_calls_them(main, chat):
    """_sample: unfinished &= ~stopping_criteria(input_ids, None) after each token, the first (from context
    encoding) included; with an EOS criterion present, finished rows then get pad_token_id."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    _, adapter = main
    ids, mask = chat
    L = ids.shape[1]
    seen = []

    class Stop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            seen.append((input_ids.shape[1], scores))
            return torch.tensor([input_ids.shape[1] >= L + 2, input_ids.shape[1] >= L + 4])

    out = adapter.generate(ids, attention_mask=mask, max_length=L + 10, do_sample=False, eos_token_id=-1,
                           pad_token_id=0, stopping_criteria=StoppingCriteriaList([Stop()]))
    assert [n for n, _ in seen] == [L + 1, L + 2, L + 3, L + 4] and all(s is None for _, s in seen)
    assert out.shape[1] == L + 4 and out[0, L + 2:].tolist() == [0, 0] and out[1, L + 2:].ne(0).all()


def test_streamer_receives_the_prompt_only(main, chat):
    """Hugging Face generate puts the prompt once; NxDI's _sample never puts a token nor calls end()."""
    _, adapter = main
    ids, mask = chat
    puts, ends = [], []

    class Recorder:
        def put(self, value):
            puts.append(value.clone())

        def end(self):
            ends.append(1)

    adapter.generate(ids, attention_mask=mask, max_length=ids.shape[1] + 3, do_sample=False, streamer=Recorder())
    assert len(puts) == 1 and torch.equal(puts[0], ids) and not ends


def test_the_first_calls_sampler_sticks(env, main):
    """_sample builds self.sampler once (Sampler(do_sample=...) of the first call) and keeps it."""
    model = main[0]
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]] * 2)
    greedy = env["Adapter"](model)
    first = greedy.generate(ids, attention_mask=torch.ones_like(ids), max_length=10, do_sample=False)
    again = greedy.generate(ids, attention_mask=torch.ones_like(ids), max_length=10, do_sample=True,
                            temperature=5.0, top_k=200)
    assert greedy.sampler.do_sample is False and torch.equal(first, again)
    sampled = env["Adapter"](model)
    torch.manual_seed(0)
    sampled.generate(ids, attention_mask=torch.ones_like(ids), max_length=7, do_sample=True, temperature=5.0,
                     top_k=200)
    assert sampled.sampler.do_sample is True


def test_prompt_longer_than_the_largest_context_bucket(main):
    """model_wrapper.py _get_seq_bucket: strict first fit (input_len < bucket), the largest when equal, else
    'Input len N exceeds largest bucket (B) for context_encoding_model'."""
    model, adapter = main
    cte = model.context_encoding_model
    pick = [cte.get_target_bucket(None, torch.ones(2, n)) for n in (31, 32, 63, 64)]
    assert pick == [32, 64, 64, 64]
    assert model.token_generation_model.get_target_bucket(None, torch.ones(2, 128)) == 128
    with pytest.raises(ValueError, match=re.escape("Input len 129 exceeds largest bucket (128) for "
                                                   "token_generation_model")):
        model.token_generation_model.get_target_bucket(None, torch.ones(2, 129))
    ids = torch.ones(2, 65, dtype=torch.long)
    with pytest.raises(ValueError, match=re.escape("Input len 65 exceeds largest bucket (64) for "
                                                   "context_encoding_model")):
        adapter.generate(ids, attention_mask=torch.ones_like(ids), max_length=70, do_sample=False)


def test_left_padding_with_padding_side_right_is_refused(main, chat):
    """NxDI's default padding_side='right' with a left-padded batch computes wrong tokens silently."""
    from _neuron_contract import ContractError

    _, adapter = main
    ids, mask = chat
    with pytest.raises(ContractError, match="left-padded"):
        adapter.generate(ids.flip(1), attention_mask=mask.flip(1), max_length=ids.shape[1] + 2, do_sample=False)


def test_typos_fail(main):
    """A GenerationConfig typo is kept silently by Hugging Face (stand-in: ContractError); a generate keyword
    typo is refused by transformers' _validate_model_kwargs."""
    from _neuron_contract import ContractError

    _, adapter = main
    ids = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ContractError, match="max_lenght"):
        adapter.generate(ids, generation_config=gconfig(max_lenght=10))
    with pytest.raises(ValueError, match="max_lenght"):
        adapter.generate(ids, attention_mask=torch.ones_like(ids), max_lenght=10)


# ------------------------------------------------------------------------------------------ speculation
@pytest.fixture(scope="module")
def speculative(env, main, tmp_path_factory):
    target = env["build"](tmp_path_factory.mktemp("spec"), batch_size=1, speculation_length=K)
    draft = env["Adapter"](main[0])  # the same checkpoint, batch 2: a 1-row batch is padded (_forward_with_pad)
    draft.generation_config.update(num_assistant_tokens=K)  # as utils/accuracy.py does
    return target, env["Adapter"](target), draft


def expected_assisted_length(L, max_len, k):
    """_standard_assisted_decoding's length when the draft agrees with the target except in the first round:
    the draft's first proposals continue the prompt *without* the target's first token (one position behind),
    so round 1 accepts nothing; later rounds accept k - 1 tokens plus the target's own, n_matches capped at
    max_len - cur_len - 1; the loop stops when cur_len >= max_len or max_len - cur_len < k."""
    cur, returned = L, L + 1
    first = True
    while True:
        n = 0 if first else min(k - 1, max_len - cur - 1)
        first = False
        returned += n + 1
        cur += n + 1
        if cur >= max_len or max_len - cur < k:
            return returned


def test_assisted_decoding_returns_what_nxdi_returns(main, speculative):
    """hf_adapter.py _assisted_decoding -> _standard_assisted_decoding with a draft adapter: greedy tokens
    (do_sample=True is ignored), fewer than max_length near the end, or one more; custom stopping criteria
    never called; no streamer tokens."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    model, _ = main
    target, adapter, draft = speculative
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    L = ids.shape[1]
    greedy = greedy_reference(model, ids.expand(2, -1), torch.ones(2, L, dtype=torch.long), L + 14)[0]
    assert greedy[0] != greedy[1], "the expected lengths assume the first round accepts nothing"
    called = []

    class Never(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            called.append(1)
            return torch.tensor([True])

    lengths = {}
    for max_len in (L + 12, L + 13):
        main[0].reset()  # the draft's KV state is not reset by the target's generate (accuracy.py resets it)
        out = adapter.generate(ids, attention_mask=torch.ones_like(ids), max_length=max_len, do_sample=True,
                               temperature=3.0, assistant_model=draft, stopping_criteria=StoppingCriteriaList([Never()]))
        lengths[max_len] = out.shape[1]
        assert out.shape[1] == expected_assisted_length(L, max_len, K), (max_len, out.shape)
        assert torch.equal(out[0, L:], greedy[:out.shape[1] - L])
    assert not called
    assert lengths[L + 12] == L + 10 and lengths[L + 13] == L + 14  # fewer than asked, or one more


def test_speculative_target_has_no_token_generation_model(speculative):
    """model_base.py: speculation_length > 0 builds a speculation model *instead of* the token-generation
    model, so a plain generate on the target fails at its first one-token step."""
    target, adapter, _ = speculative
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    assert hasattr(target, "speculation_model") and not hasattr(target, "token_generation_model")
    with pytest.raises(AttributeError, match="token_generation_model"):
        adapter.generate(ids, attention_mask=torch.ones_like(ids), max_length=12, do_sample=False)


def test_assisted_decoding_takes_one_row(speculative):
    """_standard_assisted_decoding uses row 0's position for every row and sums n_matches over rows: the
    release computes wrong tokens for a batch; the stand-in refuses it."""
    from _neuron_contract import ContractError

    _, adapter, draft = speculative
    ids = torch.ones(2, 6, dtype=torch.long)
    with pytest.raises(ContractError, match="one row"):
        adapter.generate(ids, attention_mask=torch.ones_like(ids), max_length=12, do_sample=False,
                         assistant_model=draft)


def test_assisted_decoding_cannot_switch_eos_off_with_none(main, speculative):
    """_standard_assisted_decoding tests `token in torch.tensor(eos_token_id)`: None fails there; an id the
    model never produces (-1) runs to the end."""
    target, adapter, draft = speculative
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    main[0].reset()
    with pytest.raises(RuntimeError, match="NoneType"):
        adapter.generate(ids, attention_mask=torch.ones_like(ids), max_length=12, do_sample=False,
                         assistant_model=draft, eos_token_id=None)
    main[0].reset()
    out = adapter.generate(ids, attention_mask=torch.ones_like(ids), max_length=19, do_sample=False,
                           assistant_model=draft, eos_token_id=-1)
    assert out.shape[1] == expected_assisted_length(ids.shape[1], 19, K) == 20


# ------------------------------------------------------------------------------------------ compile / load
def test_compile_load_layout(env, main, chat, tmp_path):
    """application_base.py compile(): neuron_config.json + model.pt (+ weights/tp{rank}_sharded_checkpoint
    .safetensors with save_sharded_checkpoint); load(): torch.jit.load(model.pt), presharded weights; it never
    compares neuron_config.json with the current config."""
    model, adapter = main
    ids, mask = chat
    d = tmp_path / "sharded"
    sharded = env["build"](d, batch_size=2, tp_degree=2, save_sharded_checkpoint=True)
    assert sorted(p.name for p in d.iterdir()) == ["model.pt", "neuron_config.json", "weights"]
    assert sorted(p.name for p in (d / "weights").iterdir()) == ["tp0_sharded_checkpoint.safetensors",
                                                                 "tp1_sharded_checkpoint.safetensors"]
    saved = json.loads((d / "neuron_config.json").read_text())
    assert saved == json.loads(sharded.config.to_json_string())
    assert saved["neuron_config"]["tp_degree"] == 2 and saved["neuron_config"]["torch_dtype"] == "float32"
    out = env["Adapter"](sharded).generate(ids, attention_mask=mask, max_length=ids.shape[1] + 4, do_sample=False)
    ref = adapter.generate(ids, attention_mask=mask, max_length=ids.shape[1] + 4, do_sample=False)
    assert torch.equal(out, ref)  # weights reassembled from the two shards

    other = env["cls"](env["path"], env["config"](batch_size=2, context_encoding_buckets=[16, 64]))
    other.load(str(d))  # compiled for other buckets, tp_degree and sharding: loads without a word
    assert other.is_loaded_to_neuron

    (d / "weights" / "tp1_sharded_checkpoint.safetensors").unlink()
    with pytest.raises(Exception, match="tp1_sharded_checkpoint|No such file"):
        env["cls"](env["path"], env["config"](batch_size=2, tp_degree=2, save_sharded_checkpoint=True)).load(str(d))
    (d / "model.pt").unlink()
    with pytest.raises(ValueError, match="model.pt does not exist"):
        env["cls"](env["path"], env["config"](batch_size=2)).load(str(d))


def test_quantized_checkpoint_is_written_and_used(env, tmp_path):
    """save_quantized_state_dict: torch.save to quantized_checkpoints_path (a file path); load with
    quantized=True reads it (FileNotFoundError 'Quantized checkpoint file not found' when missing)."""
    qpath = tmp_path / "q.pt"
    kw = dict(batch_size=1, quantized=True, quantized_checkpoints_path=str(qpath),
              quantization_type="per_channel_symmetric")
    with pytest.raises(FileNotFoundError, match="Quantized checkpoint file not found"):
        env["build"](tmp_path / "missing", **kw)
    env["cls"].save_quantized_state_dict(env["path"], env["config"](**kw))
    sd = torch.load(qpath)
    q = sd["layers.0.self_attn.q_proj.weight"]
    assert q.dtype == torch.int8 and sd["layers.0.self_attn.q_proj.scale"].shape == (q.shape[0],)
    marked = dict(sd)
    marked["layers.0.mlp.down_proj.weight"] = torch.zeros_like(sd["layers.0.mlp.down_proj.weight"])
    torch.save(marked, qpath)  # the engine must take its int8 values from this file
    model = env["build"](tmp_path / "q", **kw)
    w = model._runtime.engine.model.w.layers[0]
    assert torch.equal(w.w2.q, marked["layers.0.mlp.down_proj.weight"])
    assert torch.equal(w.wqkv.q[:q.shape[0]], q)
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    out = env["Adapter"](model).generate(ids, attention_mask=torch.ones_like(ids), max_length=10, do_sample=False)
    assert out.shape == (1, 10)


@pytest.mark.parametrize("quantization_type", ["per_channel_symmetric", "per_tensor_symmetric"])
def test_int8_turns_a_tied_lm_head_into_zeros(env, tmp_path, quantization_type):
    """SmolLM2 ties lm_head to the embedding. Without modules_to_not_convert=['lm_head'] the checkpoint stores an
    int8 lm_head + scale (model_base.py prepare_quantized_state_dict), the model's lm_head is int8
    (model_wrapper.py convert), the loader puts the float embedding back (tie_word_embeddings) and
    ModelBuilder.cast_weights casts it .to(int8): mostly zeros. With 'lm_head' kept out: the embedding."""
    from neuronx_distributed_inference._reference import device_lm_head

    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    outs, heads = {}, {}
    for keep in (False, True):
        kw = dict(batch_size=1, quantized=True, quantized_checkpoints_path=str(tmp_path / f"q{keep}.pt"),
                  quantization_type=quantization_type, **({"modules_to_not_convert": ["lm_head"]} if keep else {}))
        env["cls"].save_quantized_state_dict(env["path"], env["config"](**kw))
        sd = torch.load(tmp_path / f"q{keep}.pt")
        model = env["build"](tmp_path / f"m{keep}", **kw)
        loaded = model.checkpoint_loader_fn()
        heads[keep] = device_lm_head(model.neuron_config, loaded)
        outs[keep] = env["Adapter"](model).generate(ids, attention_mask=torch.ones_like(ids), max_length=14,
                                                    do_sample=False, eos_token_id=None)[0, ids.shape[1]:]
        assert torch.equal(loaded["lm_head.weight"], loaded["embed_tokens.weight"])  # the tie, at load
        if not keep or quantization_type == "per_tensor_symmetric":  # per-tensor ignores modules_to_not_convert
            assert sd["lm_head.weight"].dtype == torch.int8 and "lm_head.scale" in sd
        else:
            assert sd["lm_head.weight"].dtype != torch.int8
    embed = loaded["embed_tokens.weight"]
    assert heads[True] is None  # float head = the embedding, as tied
    assert (heads[False] == 0).float().mean() > 0.9 and (embed.to(torch.int8) == 0).float().mean() > 0.9
    assert not torch.equal(outs[False], outs[True])
    assert len(set(outs[False].tolist())) <= 2, outs[False]  # near-zero logits: one token over and over


# ------------------------------------------------------------------------------------------ config
def test_rope_parameters_without_rope_theta_is_refused(env, tmp_path):
    from _neuron_contract import ContractError
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    cfg = json.loads((Path(env["path"]) / "config.json").read_text())
    cfg.pop("rope_theta", None)
    cfg["rope_parameters"] = {"rope_theta": 100000.0, "rope_type": "default"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ContractError, match="rope_theta"):
        load_pretrained_config(str(tmp_path))(SimpleNamespace(neuron_config=None))


def test_neuron_config_keywords_are_its_pops():
    """NEURON_CONFIG_KEYWORDS (what the stand-in accepts) = the kwargs.pop names of its transcribed __init__."""
    import neuronx_distributed_inference.models.config as cfg

    source = Path(cfg.__file__).read_text()
    source = source[source.index("class NeuronConfig:"):source.index("class InferenceConfig:")]
    pops = set(re.findall(r'kwargs\.pop\(\s*"(\w+)"', source))
    assert pops == set(cfg.NEURON_CONFIG_KEYWORDS)
    assert not pops & cfg.NEURON_CONFIG_DERIVED


# ------------------------------------------------------------------------------------------ helpers.neuron on nxdi
def test_helpers_int8_agrees_with_float_on_nxdi(env, tmp_path, monkeypatch):
    """helpers.neuron's NxDI int8 (modules_to_not_convert=['lm_head'], the generate() workaround) gives the float
    model's greedy tokens on a tied-embedding model; without 'lm_head' kept out the head is all but zeros
    (test_int8_turns_a_tied_lm_head_into_zeros) and this agreement fails."""
    import helpers
    from helpers.notebook.backend import Backend

    monkeypatch.setenv("HELPERS_NEURON_COMPILED_DIR", str(tmp_path / "compiled"))
    bk = Backend("neuron", "nxdi")
    common = dict(batch_size=1, n_positions=128, context_length_estimate=[32, 64])
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314, 253, 1345]])
    outs = {}
    for name, extra in (("float", {}), ("int8", helpers.neuron.neuron_quant_settings(
            "nxdi", "per_channel_symmetric", "f32", tmp_path / "q"))):
        model = helpers.build_model(bk, None, **common, **extra)
        outs[name] = model.sample(ids, ids.shape[1] + 16, top_k=1, eos_token_override=[])[0, ids.shape[1]:]
    # int8 rounding may change a later token (greedy decoding then follows another path): the opening agrees
    assert torch.equal(outs["float"][:4], outs["int8"][:4]), outs
