"""Tensor-parallel reference engine: every rank a process, real gloo collectives; parity with tp=1.

A tiny random Llama checkpoint (6 query / 2 KV heads) exercises each KV layout (heads, batch = SHARD_OVER_BATCH,
gather = ALL_GATHER_HEADS) in seconds; the embedded SmolLM2 (9 / 3 heads) checks padding and the real model.
"""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import helpers
from helpers.engine.config import NeuronConfig
from helpers.parallel import ParallelModel
from helpers.prompts import encode_prompts

REPO = Path(__file__).resolve().parent.parent
LOGIT_ATOL = 1e-3  # f32; tp changes the order of the sums (measured: ~3e-5 on SmolLM2)


@pytest.fixture(autouse=True, scope="module")
def one_thread_per_rank():
    """tp=1 in this process and each rank get one thread: the same compute per rank, and no OpenMP
    oversubscription when the 2 CI cores are shared (2 threads there were 25x slower than 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=96, intermediate_size=100, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    path = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(cfg).eval().save_pretrained(path)
    ids = torch.randint(0, 256, (4, 7), generator=torch.Generator().manual_seed(1))
    ref = helpers.NeuronModel.from_pretrained(path, batch_size=4, n_positions=64).to_neuron()
    return path, ids, ref.sample(ids, 16, top_k=1), ref.forward(ids)


@pytest.mark.parametrize("tp, gqa, mode, kv_cache_shape", [
    (2, None, "heads", [2, 4, 1, 64, 16]),                         # 2 KV heads over 2 ranks
    (3, None, "heads", [2, 4, 2, 64, 16]),                         # 2 % 3: replicated (to 6 KV heads)
    (2, "shard-over-batch", "batch", [2, 2, 2, 64, 16]),           # all KV heads, 2 of 4 rows per rank
    (4, "all-gather-heads", "gather", [2, 4, 1, 64, 16]),          # 6 -> 8 heads; K/V columns gathered in pairs
    (4, "convert-to-mha", "heads", [2, 4, 2, 64, 16]),             # NxDI: KV replicated to the 8 query heads
])
def test_tiny_parity_per_layout(tiny, tp, gqa, mode, kv_cache_shape):
    path, ids, ref_tokens, ref_logits = tiny
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ParallelModel.from_pretrained(path, tp_degree=tp, batch_size=4, n_positions=64,
                                              neuron_config=NeuronConfig(group_query_attention=gqa))
    assert model.layout.kv_mode == mode
    with model.to_neuron():
        assert torch.equal(model.sample(ids, 16, top_k=1), ref_tokens)
        assert (model.forward(ids) - ref_logits).abs().max() < LOGIT_ATOL
        assert [r["kv_cache_shape"] for r in model.rank_reports] == [kv_cache_shape] * tp
        assert len(model.rank_kv_bytes) == tp and model.stats["new_tokens"] == 16 - 7


def test_tiny_speculative_graph_at_tp2(tiny):
    """The k+1-token scoring graph of speculative decoding runs sharded too (same logits as tp=1)."""
    path, ids, ref_tokens, _ = tiny
    draft = ref_tokens[:, 7:11]  # 4 tokens after the prompt: the last accepted one + k=3 drafts
    ref = helpers.NeuronModel.from_pretrained(path, batch_size=4, n_positions=64)
    ref.enable_speculative_decoder(3)
    ref.to_neuron().forward(ids)
    want = ref.speculative_forward(draft, torch.arange(7, 11))
    model = ParallelModel.from_pretrained(path, tp_degree=2, batch_size=4, n_positions=64)
    model.enable_speculative_decoder(3)
    with model.to_neuron():
        model.forward(ids)
        got = model.speculative_forward(draft, torch.arange(7, 11))
        with pytest.raises(RuntimeError, match="before to_neuron"):
            model.enable_speculative_decoder(3)
    assert got.shape == want.shape == (4, 4, 256) and (got - want).abs().max() < LOGIT_ATOL


@pytest.mark.parametrize("tp, batch, gqa", [(2, 2, None), (3, 3, "shard-over-batch")])
def test_smollm2_parity(tp, batch, gqa):
    tok = helpers.load_tokenizer()
    enc = encode_prompts(tok, ["Name three colors.", "What is 2+2?", "Say hi."][:batch], batch)
    seq = enc.input_ids.shape[1] + 6
    kw = dict(batch_size=batch, n_positions=128)
    ref = helpers.NeuronModel.from_pretrained(None, **kw).to_neuron()
    want = ref.sample(enc.input_ids, seq, top_k=1, attention_mask=enc.attention_mask)
    want_logits = ref.forward(enc.input_ids, start_ids=(enc.attention_mask == 0).sum(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ParallelModel.from_pretrained(None, tp_degree=tp, neuron_config=NeuronConfig(group_query_attention=gqa),
                                              **kw)
    with model.to_neuron():
        got = model.sample(enc.input_ids, seq, top_k=1, attention_mask=enc.attention_mask)
        logits = model.forward(enc.input_ids, start_ids=(enc.attention_mask == 0).sum(1))
    assert torch.equal(got, want)
    assert (logits - want_logits).abs().max() < LOGIT_ATOL
    # per rank: query heads padded to a multiple of tp (9 -> 10 at tp=2), weights split
    heads = [r["q_heads"] for r in model.rank_reports]
    assert heads == ([[0, 1, 2, 3, 4], [5, 6, 7, 8, -1]] if tp == 2 else [list(range(9))] * 3)


def test_invalid_request_fails_before_any_process_starts():
    with pytest.raises(ValueError, match="shard-over-batch with 9 query heads at tp_degree=2"):
        ParallelModel.from_pretrained(None, tp_degree=2, batch_size=2, n_positions=128,
                                      neuron_config=NeuronConfig(group_query_attention="shard-over-batch"))
    with pytest.raises(RuntimeError, match="call .to_neuron"):
        ParallelModel.from_pretrained(None, tp_degree=2, n_positions=128).sample(torch.tensor([[1, 2]]), 4)


def test_rank_failure_is_reported_and_ranks_stop(tiny):
    path, ids, _, _ = tiny
    model = ParallelModel.from_pretrained(path, tp_degree=2, batch_size=4, n_positions=64).to_neuron()
    procs = list(model._ranks.procs)
    with pytest.raises(RuntimeError, match="rank 0 failed"):
        model._ranks.call("forward", None)  # a malformed step: the rank's traceback comes back
    assert all(not p.is_alive() for p in procs)


@pytest.mark.slow
def test_command_line():
    """``python -m helpers.parallel`` spawns its ranks and checks its tokens against tp_degree=1."""
    args = ["-m", "helpers.parallel", "--tp-degree", "2", "--max-new-tokens", "3", "--n-positions", "128", "--check"]
    run = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "greedy tokens identical to tp_degree=1: True" in run.stdout
