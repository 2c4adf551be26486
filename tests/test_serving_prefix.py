"""Prefix caching (helpers.serving.blocks / helpers.serving.prefix): the block pool's bookkeeping, and the engine's
outputs with reuse identical to without it and to transformers, on tiny random checkpoints."""
import numpy as np
import pytest
import torch

import helpers
from helpers.serving.blocks import (BlockPool, OutOfBlocks, block_hashes, simulate_hit_rate,
                                    slot_mapping)
from helpers.serving.prefix import (PrefixCachingEngine, block_memory, bucket_rows, cached_prefixes, chat_traffic, shared_share_prompts,
                                    shared_tokens)
from tiny_models import write_tiny


# -- bookkeeping ----------------------------------------------------------------------------------------------
def test_hashes_chain_over_the_prefix():
    a, b = block_hashes([1, 2, 3, 4, 5, 6, 7], 2), block_hashes([9, 2, 3, 4], 2)
    assert len(a) == 3 and len(b) == 2  # full blocks only
    assert a[1] != b[1]  # same tokens [3, 4], different prefix
    assert block_hashes([1, 2, 3, 4], 2) == a[:2]


def test_reuse_commit_and_the_last_token_is_always_computed():
    pool = BlockPool(16, 4)
    p = list(range(10, 22))  # 12 tokens = 3 full blocks
    s1 = pool.allocate(p)
    assert s1.cached_tokens == 0 and len(s1.block_table) == 3
    pool.commit(s1, len(p))
    pool.free(s1)
    s2 = pool.allocate(p)  # the same prompt: its last block is recomputed, for the logits of the last token
    assert s2.cached_tokens == 8 and s2.block_table[:2] == s1_blocks(p, pool)[:2]
    s3 = pool.allocate(p[:8] + [99, 98, 97])  # shares two blocks, while s2 still holds them
    assert s3.cached_tokens == 8 and s3.block_table[:2] == s2.block_table[:2]
    assert pool.ref[s2.block_table[0]] == 2
    assert pool.hit_rate == pytest.approx(16 / 35)


def s1_blocks(p, pool):
    return [pool.cached[h] for h in block_hashes(p, pool.block_size) if h in pool.cached]


def test_eviction_is_lru_and_running_blocks_are_never_evicted():
    pool = BlockPool(4, 2)
    a = pool.allocate([1, 2, 3, 4, 5, 6])  # 3 full blocks
    pool.commit(a, 6)
    with pytest.raises(OutOfBlocks, match="raise num_blocks"):
        pool.allocate([7, 8, 9, 10])  # needs 2, 1 free, a's blocks are referenced
    pool.free(a)
    pool.allocate([7, 8, 9, 10])  # the never-used block, then one cached block of a: its tail first
    assert pool.stats["evictions"] == 1
    assert pool.allocate([1, 2, 3]).cached_tokens == 2  # a's first block survived (and [3, 4] is evicted now)
    assert pool.stats["evictions"] == 2


def test_append_token_takes_a_new_block_at_the_boundary():
    pool = BlockPool(8, 4)
    s = pool.allocate([1, 2, 3, 4])
    slot = pool.append_token(s, 5)
    assert len(s.block_table) == 2 and slot == s.block_table[1] * 4
    assert slot_mapping(s.block_table, 3, 5, 4) == [s.block_table[0] * 4 + 3, s.block_table[1] * 4]


def test_no_caching_never_reuses():
    pool = BlockPool(8, 2, enable_caching=False)
    for _ in range(2):
        s = pool.allocate([1, 2, 3, 4, 5])
        pool.commit(s, 5)
        assert s.cached_tokens == 0
        pool.free(s)
    assert pool.hit_rate == 0 and not pool.cached


def test_hit_rate_falls_with_block_size_on_unaligned_prefixes():
    prompts = chat_traffic(40, 1000, 0, system_lens=[50, 70], fewshot_lens=[30], fewshot_prob=0.5,
                           question_len=(5, 20))
    rates = [simulate_hit_rate(prompts, b, 10_000) for b in (1, 4, 16, 64)]
    assert rates == sorted(rates, reverse=True) and rates[-1] < rates[0]
    assert rates[0] == pytest.approx(shared_tokens(prompts))  # block size 1 reaches the bound


def test_memory_per_block():
    assert block_memory("embedded", 32, amp="bf16")["bytes_per_block"] == 2 * 30 * 3 * 64 * 32 * 2  # SmolLM2: 3 KV heads
    row = block_memory("Llama-3.1-8B", 32, tp_degree=32, amp="bf16")  # 8 KV heads replicated to 1 per core
    assert row["kv_heads/core"] == 1 and row["bytes_per_block"] == 2 * 32 * 1 * 128 * 32 * 2
    assert block_memory("Llama-3.1-8B", 32, tp_degree=2)["bytes_per_block"] == 2 * 32 * 4 * 128 * 32 * 2


def test_shared_share_prompts():
    ps = shared_share_prompts(0.75, 40, 3, 500, 0)
    assert all(len(p) == 40 for p in ps) and ps[0][:30] == ps[2][:30] and ps[0][30:] != ps[1][30:]
    with pytest.raises(ValueError, match="must be in"):
        shared_share_prompts(1.0, 40, 1, 500, 0)


# -- the engine ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    hf = write_tiny(path, "llama")
    model = helpers.NeuronModel.from_pretrained(path, batch_size=1, n_positions=128).to_neuron()
    return path, hf, model


def test_outputs_identical_with_and_without_reuse_and_to_transformers(tiny):
    path, hf, model = tiny
    prompts = chat_traffic(6, 256, 1, system_lens=[21, 34], fewshot_lens=[13], fewshot_prob=0.5, question_len=(3, 9))
    prompts = [[t % 250 + 3 for t in p] for p in prompts]
    cached = PrefixCachingEngine(model, 64, 4)
    plain = PrefixCachingEngine(model, 64, 4, enable_caching=False)
    rc = [cached.generate(p, 10) for p in prompts]
    rp = [plain.generate(p, 10) for p in prompts]
    assert [r.tokens for r in rc] == [r.tokens for r in rp]
    assert sum(r.cached_tokens for r in rc) > 0 and all(r.cached_tokens == 0 for r in rp)
    assert all(r.cached_tokens % 4 == 0 and r.computed_tokens >= 1 for r in rc)
    ids = torch.tensor([prompts[-1]])
    with torch.inference_mode():
        ref = hf.generate(input_ids=ids, max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert ref[0, ids.shape[1]:].tolist() == rc[-1].tokens


def test_eviction_under_a_small_pool_keeps_outputs(tiny):
    _, _, model = tiny
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 250, 20).tolist() for _ in range(4)] * 2
    small = PrefixCachingEngine(model, 8, 4)  # 8 blocks: every request evicts earlier ones
    big = PrefixCachingEngine(model, 64, 4, enable_caching=False)
    assert [small.generate(p, 6).tokens for p in prompts] == [big.generate(p, 6).tokens for p in prompts]
    assert small.pool.stats["evictions"] > 0


def test_engine_refuses_what_it_cannot_run(tiny):
    _, _, model = tiny
    e = PrefixCachingEngine(model, 64, 4)
    with pytest.raises(ValueError, match="exceed the model's 128 positions"):
        e.generate(list(range(3, 123)), 10)
    with pytest.raises(ValueError, match="tp_degree=1"):
        PrefixCachingEngine(object(), 8, 4)
    assert e.kv_bytes_per_block == e.tr.cache.k[:, :, :, :4].numel() * 4 * 2


def test_bucket_rows_use_nxdi_selection(tiny):
    _, _, model = tiny
    e = PrefixCachingEngine(model, 64, 4)
    rs = e.serve([list(range(3, 43))] * 2, 1)
    assert [r.cached_tokens for r in rs] == cached_prefixes([list(range(3, 43))] * 2, 64, 4) == [0, 36]
    rows = bucket_rows([(r.prompt_len, r.cached_tokens) for r in rs], [(16, 0), (16, 32), (64, 0), (64, 32)])
    assert rows[0]["bucket"] == (64, 0) and rows[1]["bucket"] == (16, 32) and rows[1]["bucket_no_cache"] == (64, 0)
    assert "exceeds largest bucket" in bucket_rows([(100, 0)], [(16, 0), (64, 0)])[0]["bucket"]


def test_decode_step_times_both_layouts_interleaved(tiny):
    from helpers.serving.prefix import decode_step_times
    _, _, model = tiny
    t = decode_step_times(model, 60, 3, num_blocks=16, block_size=8)
    assert set(t) == {"flat", "block"} and all(len(v) == 3 and min(v) > 0 for v in t.values())
    with pytest.raises(ValueError, match="num_blocks"):
        decode_step_times(model, 60, 3, num_blocks=4, block_size=8)
