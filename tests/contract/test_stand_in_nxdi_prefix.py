"""The NxD Inference 0.8 stand-in's prefix caching behaves as the pinned release (aws-neuron/neuronx-distributed-inference
cd3abf3, SDK 2.28.0): ``modules/autobucketing.py`` (2-D buckets), ``models/model_wrapper.py``
(``get_target_2d_bucket_for_prefix_caching``, cases from the release's own
``test/unit/models/test_prefix_caching_bucket_selection.py``), ``models/model_base.py`` (dispatch with block tables),
and what 0.8 fails on later without a word (prefix caching without the block layout).

Runs in the nxdi lane (transformers 4.57.1); skipped elsewhere.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not transformers.__version__.startswith("4.57."),
                                reason="the NxD Inference 0.8 stand-in runs under transformers 4.57 (nxdi lane)")

SEQ_LEN, BS, BLOCKS = 128, 8, 32
PREFILL, PREFIX, TKG = [32, 64], [32, 64], [128]


@pytest.fixture(scope="module")
def env():
    """A prefix-caching NxDI model factory over the embedded checkpoint (the keywords of the NxDI guide)."""
    import helpers
    from helpers.neuron import neuron_model_dir
    from neuronx_distributed_inference.models.config import NeuronConfig
    from neuronx_distributed_inference.models.llama.modeling_llama import LlamaInferenceConfig, NeuronLlamaForCausalLM
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    path = neuron_model_dir(None)
    base = dict(seq_len=SEQ_LEN, torch_dtype="float32", is_prefix_caching=True, is_block_kv_layout=True,
                pa_num_blocks=BLOCKS, pa_block_size=BS, enable_bucketing=True, context_encoding_buckets=PREFILL,
                prefix_buckets=PREFIX, token_generation_buckets=TKG)

    def model(**kw):
        nc = NeuronConfig(**{k: (list(v) if isinstance(v, list) else v) for k, v in {**base, **kw}.items()})
        return NeuronLlamaForCausalLM(path, LlamaInferenceConfig(nc, load_config=load_pretrained_config(path)))

    return {"helpers": helpers, "path": path, "model": model}


def test_two_dimensional_buckets(env):
    """generate_buckets_for_cte: [prefill, prefix] over [0] + prefix_buckets; _tkg: [1, S] per token bucket;
    without lists: powers of two from 512 (context) and from 256 (token generation)."""
    m = env["model"]()
    assert m.context_encoding_model.neuron_config.buckets == [[v, h] for v in PREFILL for h in [0, *PREFIX]]
    assert m.token_generation_model.neuron_config.buckets == [[1, 128]]
    auto = env["model"](seq_len=2048, context_encoding_buckets=None, prefix_buckets=None, token_generation_buckets=None)
    assert auto.context_encoding_model.neuron_config.buckets == [[v, h] for v in (512, 1024, 2048)
                                                                  for h in (0, 512, 1024, 2048)]
    assert auto.token_generation_model.neuron_config.buckets == [[1, 256], [1, 512], [1, 1024], [1, 2048]]


def test_context_buckets_without_prefix_buckets_fail_as_the_release(env):
    with pytest.raises(TypeError, match="can only concatenate list"):
        env["model"](prefix_buckets=None)


def test_prefix_caching_needs_the_block_layout(env):
    import _neuron_contract as contract

    with pytest.raises(contract.ContractError, match="is_block_kv_layout=True"):
        env["model"](is_block_kv_layout=False)


def target_2d_bucket(buckets, tag, vertical_dim, horizontal_dim):
    """The release's ``ModelWrapper.get_target_2d_bucket_for_prefix_caching`` ("first_fit", no speculation, as the
    stand-in transcribes it) on a bucket grid: ``vertical_dim`` = num_queries, ``horizontal_dim`` = computed context
    lens (``args[13]`` and ``args[14]`` of the model's forward)."""
    from neuronx_distributed_inference.models.model_wrapper import ModelWrapper

    nc = SimpleNamespace(buckets=buckets, speculation_length=0, enable_fused_speculation=False,
                         enable_eagle_speculation=False, allow_input_truncation=False, pa_block_size=8)
    wrapper = SimpleNamespace(neuron_config=nc, tag=tag, async_mode=False)
    bucket = ModelWrapper.get_target_2d_bucket_for_prefix_caching(wrapper, *[None] * 13, vertical_dim, horizontal_dim)
    return [int(b) for b in bucket]


CTE_GRID = [[8, 0], [8, 8], [8, 16], [16, 0], [16, 8], [16, 16], [32, 0], [32, 8], [32, 16]]


@pytest.mark.parametrize("active,prefix,expected", [
    (7, 0, [8, 0]), (8, 0, [8, 0]), (9, 0, [16, 0]), (31, 0, [32, 0]), (4, 4, [8, 0]), (9, 4, [16, 0]),
    (17, 8, [32, 0]), (7, 4, [8, 8]), (4, 12, [8, 8]), (10, 12, [16, 8]), (30, 4, [32, 8]), (7, 12, [8, 16]),
    (17, 24, [32, 16]),
])
def test_cte_bucket_selection_matches_the_release_unit_test(active, prefix, expected):
    assert target_2d_bucket(CTE_GRID, "context_encoding_model", torch.tensor([[active]]),
                            torch.tensor([[prefix]])) == expected


@pytest.mark.parametrize("computed,expected", [(7, [1, 8]), (8, [1, 16]), (15, [1, 16]), (16, [1, 32]), (31, [1, 32])])
def test_tkg_bucket_selection_matches_the_release_unit_test(computed, expected):
    assert target_2d_bucket([[1, 8], [1, 16], [1, 32]], "token_generation_model", torch.tensor([[1]]),
                            torch.tensor([[computed]])) == expected


def test_overflows_raise_the_release_errors():
    with pytest.raises(ValueError, match=r"Prefill len 33 exceeds largest bucket \(32\) for context_encoding_model"):
        target_2d_bucket(CTE_GRID, "context_encoding_model", torch.tensor([[33]]), torch.tensor([[0]]))
    with pytest.raises(AssertionError, match="Prefix len 28 exceeds largest bucket 16"):
        target_2d_bucket(CTE_GRID, "context_encoding_model", torch.tensor([[28]]), torch.tensor([[32]]))


@pytest.fixture(scope="module")
def loaded(env, tmp_path_factory):
    m = env["model"]()
    d = tmp_path_factory.mktemp("pc")
    m.compile(str(d))
    m.load(str(d))
    return m


def _run(model, pool, ids, new_tokens):
    """The calling convention of vLLM's Neuron worker: whole prompt + block table + slot mapping, then one token."""
    from helpers.serving.blocks import slot_mapping

    seq = pool.allocate(ids)

    def step(start, end, prefill):
        tokens = seq.token_ids[:end] if prefill else seq.token_ids[start:end]
        table = torch.tensor([seq.block_table + [0] * (SEQ_LEN // BS - len(seq.block_table))])
        out = model.forward(input_ids=torch.tensor([tokens]), position_ids=torch.arange(end - len(tokens), end)[None],
                            seq_ids=torch.tensor([0]), block_table=table,
                            slot_mapping=torch.tensor([slot_mapping(seq.block_table, start, end, BS)]),
                            full_context_lens=torch.tensor([[end]]), computed_context_lens=torch.tensor([[start]]))
        return int(out.logits[0, -1].argmax())

    out = [step(seq.cached_tokens, len(ids), True)]
    pool.commit(seq, len(ids))
    for _ in range(new_tokens - 1):
        pool.append_token(seq, out[-1])
        out.append(step(len(seq.token_ids) - 1, len(seq.token_ids), False))
    pool.free(seq)
    return seq.cached_tokens, out


def test_block_tables_reuse_a_prefix_and_keep_the_greedy_tokens(env, loaded):
    """A second prompt sharing 40 tokens reuses 5 blocks; both give the reference engine's plain greedy tokens."""
    import _neuron_contract as contract
    from helpers.serving.blocks import BlockPool

    contract.reset()
    pool = BlockPool(BLOCKS, BS)
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(100, 40000, (40,), generator=g).tolist()
    prompts = [shared + torch.randint(100, 40000, (n,), generator=g).tolist() for n in (11, 20)]
    plain = env["helpers"].NeuronModel.from_pretrained(env["path"], n_positions=SEQ_LEN).to_neuron()
    for i, ids in enumerate(prompts):
        cached, tokens = _run(loaded, pool, ids, 6)
        assert cached == (0 if i == 0 else 40)
        ref = plain.sample(torch.tensor([ids]), len(ids) + 6, top_k=1, eos_token_override=[])[0, len(ids):].tolist()
        assert tokens == ref
    buckets = [c[1]["bucket"] for c in contract.calls("nxdi.prefix_caching_bucket")
               if c[1]["tag"] == "context_encoding_model"]
    assert buckets == [(64, 0), (32, 32)]  # 51 new tokens; then 20 new + 8 of the prefix moved, 32 left


def test_a_slot_outside_the_cache_is_refused(loaded):
    import _neuron_contract as contract

    with pytest.raises(contract.ContractError, match="outside the cache"):
        loaded.forward(input_ids=torch.tensor([[5, 6, 7]]), position_ids=torch.arange(3)[None],
                       seq_ids=torch.tensor([0]), block_table=torch.zeros(1, SEQ_LEN // BS, dtype=torch.long),
                       slot_mapping=torch.tensor([[0, 1, (BLOCKS + 1) * BS]]), full_context_lens=torch.tensor([[3]]),
                       computed_context_lens=torch.tensor([[0]]))
