"""The NxD Inference 0.8 stand-in's continuous batching (``is_continuous_batching=True``) behaves as the release.

Runs in the nxdi lane (transformers 4.57.1); skipped elsewhere. Pinned source: aws-neuron/neuronx-distributed-inference
cd3abf3 (SDK 2.28.0): ``modules/kvcache/kv_cache_manager.py`` (one seq_id per context encoding, per-row scatter in
token generation), ``models/model_wrapper.py`` (``forward`` slices, ``_forward_with_pad`` pads, sorts and
index_selects by seq_ids), ``models/model_base.py`` (``position_ids.min() == 0`` is context encoding).
Stand-in: tests/neuron_sim/neuronx_distributed_inference/_continuous_batching.py.
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not transformers.__version__.startswith("4.57."),
                                reason="the NxD Inference 0.8 stand-in runs under transformers 4.57 (nxdi lane)")

SEQ_LEN, SLOTS = 128, 3


SLOT_SETTINGS = dict(seq_len=SEQ_LEN, torch_dtype="float32", enable_bucketing=True, is_continuous_batching=True,
                     batch_size=SLOTS, max_batch_size=SLOTS, ctx_batch_size=1, tkg_batch_size=SLOTS)


@pytest.fixture(scope="module")
def env():
    """A builder of continuous-batching models (the stand-in) and the reference engine at batch 1 (the oracle)."""
    from helpers import NeuronModel
    from helpers.neuron import neuron_model_dir
    from neuronx_distributed_inference.models import config as nxdi_config
    from neuronx_distributed_inference.models.llama import modeling_llama as llama
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    path = neuron_model_dir(None)

    def build(directory, **overrides):
        nc = nxdi_config.NeuronConfig(**{**SLOT_SETTINGS, **overrides})
        model = llama.NeuronLlamaForCausalLM(path, llama.LlamaInferenceConfig(nc, load_config=load_pretrained_config(path)))
        model.compile(str(directory))
        model.load(str(directory))
        return model

    return {"build": build, "alone": NeuronModel.from_pretrained(path, batch_size=1, n_positions=SEQ_LEN).to_neuron()}


@pytest.fixture(scope="module")
def model(env, tmp_path_factory):
    return env["build"](tmp_path_factory.mktemp("cb"))


def _prefill(model, slot, prompt, **kwargs):
    """One prompt into one slot, with the sampling params of one row (the default ones have batch_size rows)."""
    from neuronx_distributed_inference.modules.generation.sampling import prepare_sampling_params

    n = len(prompt)
    kwargs.setdefault("sampling_params", prepare_sampling_params(1))
    return model(input_ids=prompt[None], attention_mask=torch.ones(1, n, dtype=torch.long),
                 position_ids=torch.arange(n)[None], seq_ids=torch.tensor([slot]), **kwargs).logits[0, -1]


def _decode(model, slots, tokens, positions):
    pos = torch.tensor(positions)
    return model(input_ids=torch.tensor(tokens)[:, None], position_ids=pos[:, None],
                 attention_mask=(torch.arange(int(pos.max()) + 1)[None] < pos[:, None]).long(),
                 seq_ids=torch.tensor(slots)).logits[:, -1]


def test_ctx_batch_size_other_than_1_fails_at_compile(env, tmp_path):
    with pytest.raises(AssertionError, match="only supports single seq_id"):
        env["build"](tmp_path, ctx_batch_size=2)


def test_slots_entering_and_leaving_match_each_request_alone(env, model):
    """Slot 2 enters late, the live slots are passed in reverse order (logits come back in seq_ids order)."""
    g = torch.Generator().manual_seed(5)
    prompts = {0: torch.randint(0, 49152, (9,), generator=g), 2: torch.randint(0, 49152, (4,), generator=g)}
    out = {0: [int(_prefill(model, 0, prompts[0]).argmax())]}
    for step in range(6):
        if step == 2:
            out[2] = [int(_prefill(model, 2, prompts[2]).argmax())]
        slots = sorted(out, reverse=True)
        logits = _decode(model, slots, [out[s][-1] for s in slots], [len(prompts[s]) + len(out[s]) - 1 for s in slots])
        for row, s in enumerate(slots):
            out[s].append(int(logits[row].argmax()))
    for s, p in prompts.items():
        ref = env["alone"].sample(p[None], len(p) + len(out[s]), top_k=1, eos_token_override=[])[0, len(p):]
        assert out[s] == ref.tolist()


def test_a_batch_of_prompts_is_encoded_one_slot_at_a_time(model):
    """ctx_batch_size=1: two prompts in one call run as two context encodings, each into its own seq_id's row."""
    a, b = torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10, 11, 12])
    both = model(input_ids=torch.stack([a, b]), attention_mask=torch.ones(2, 4, dtype=torch.long),
                 position_ids=torch.arange(4).expand(2, 4), seq_ids=torch.tensor([1, 0])).logits[:, -1]
    assert torch.allclose(both[0], _prefill(model, 1, a), atol=1e-4)
    assert torch.allclose(both[1], _prefill(model, 0, b), atol=1e-4)


def test_one_prompt_without_sampling_params_fails_as_the_release(model):
    """models/model_base.py: the default sampling params are built for batch_size (3) rows (__init__,
    prepare_sampling_params(batch_size=...)) and preprocess_inputs passes them when the call has none; a one-row
    context encoding goes to ModelWrapper._forward whole (model_wrapper.py forward: input_batch_size == the compiled
    ctx_batch_size 1), and the traced model's router (neuronx-distributed trace/spmd.py NxDModel.router) finds no
    bucket traced with [3, 3] sampling params."""
    with pytest.raises(torch.jit.Error, match=r"(?s)builtins\.ValueError: Input shape \[\[1, 128\], \[1, 128\], "
                       r"\[1, 128\], \[1\], \[3, 3\], \[1\], \[1\]\] not found in input_shape_map: "
                       r"\[\[\[1, 128\], \[1, 128\], \[1, 128\], \[1\], \[1, 3\], \[1\], \[1\]\], "
                       r"\[\[3, 1\], \[3, 128\], \[3, 1\], \[3\], \[3, 3\], \[3\], \[3\]\]\]"):
        _prefill(model, 0, torch.tensor([5, 6, 7]), sampling_params=None)


def test_decoding_some_slots_with_the_default_sampling_params_passes(model):
    """Token generation of fewer rows than slots: _forward_with_pad pads every input to batch_size rows; the default
    sampling params already have them (_pad_helper leaves them), so the shapes are the traced ones."""
    model.reset()
    _prefill(model, 0, torch.tensor([5, 6, 7]))
    assert _decode(model, [0], [9], [3]).shape[0] == 1


@pytest.mark.parametrize("seq_ids", [[0, 3], [1, 1]])
def test_seq_ids_outside_the_cache_or_repeated_fail_in_the_padding(model, seq_ids):
    """Fewer rows than slots: _forward_with_pad completes seq_ids with the missing ones of range(max_batch_size) and
    sorts them; with an id out of range or repeated that makes more sort indices than padded rows, and _pad_helper's
    index_select fails (models/model_wrapper.py), as on the release."""
    with pytest.raises(IndexError, match="index out of range in self"):
        _decode(model, seq_ids, [1, 2], [5, 5])


@pytest.mark.parametrize("seq_ids", [[0, 1, 3], [1, 1, 2]])
def test_a_full_batch_with_seq_ids_outside_the_cache_or_repeated_is_refused(model, seq_ids):
    """A full batch runs as it comes (no padding): the release indexes the cache with the ids unchecked."""
    from _neuron_contract import ContractError

    with pytest.raises(ContractError, match="distinct KV-cache row"):
        _decode(model, seq_ids, [1, 2, 3], [5, 5, 5])


def test_a_full_batch_out_of_order_is_refused(model):
    from _neuron_contract import ContractError

    with pytest.raises(ContractError, match="seq_id order"):
        _decode(model, [2, 0, 1], [1, 2, 3], [5, 5, 5])


def test_the_generate_adapter_on_a_continuous_batching_model(env, model):
    """HuggingFaceGenerationAdapter passes no seq_ids (0..n-1 by default): each prompt is encoded into its own row,
    then every row decodes at its own position (right padding, the NxDI default). generate() needs the workaround
    for 0.8's tensor_capture_hook NameError (helpers.neuron.nxdi_generation_adapter; test_stand_in_nxdi.py)."""
    from helpers.neuron import nxdi_generation_adapter

    prompts = [torch.tensor([5, 9, 33, 7, 1, 80, 12]), torch.tensor([44, 3]), torch.tensor([8, 8, 100, 4])]
    ids = torch.zeros(SLOTS, 7, dtype=torch.long)
    mask = torch.zeros(SLOTS, 7, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, :len(p)], mask[r, :len(p)] = p, 1
    model.reset()
    out = nxdi_generation_adapter()(model).generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                                                    eos_token_id=None, pad_token_id=0)
    for r, p in enumerate(prompts):
        ref = env["alone"].sample(p[None], len(p) + 5, top_k=1, eos_token_override=[])[0, len(p):]
        assert out[r, 7:].tolist() == ref.tolist()
