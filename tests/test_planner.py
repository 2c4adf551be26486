"""Planner figures against hand-computed values (published model dimensions, written out), the engine's
real shards, and the seed-000 case (Mistral-7B bf16 on one 16 GiB inf2 core)."""
from __future__ import annotations

import warnings

import pytest
import torch

from helpers.planning import memory as P
from helpers.engine.config import ModelArgs
from helpers.engine.model import Comm
from helpers.planning.gqa import resolve_layout
from helpers.model_store import load_config
from helpers.engine.weights import shard_state, weight_breakdown
from helpers.model_store import LazyState
from helpers.parallel.collectives import ParallelTransformer

MISTRAL = "Mistral-7B-Instruct-v0.2"


def test_shipped_configs_parameter_counts():
    # published sizes: 7.24B, 8.03B, 70.55B, 1.24B, 46.70B parameters
    counts = {m: P.Shape.from_config(P.load_model_config(m)).params for m in P.list_model_configs()}
    assert counts == {"Llama-3.1-70B": 70_553_706_496, "Llama-3.1-8B": 8_030_261_248, "Llama-3.2-1B": 1_235_814_400,
                      "Mistral-7B-Instruct-v0.2": 7_241_732_096, "Mixtral-8x7B-v0.1": 46_702_792_704}


def test_mistral_tp1_and_tp2_by_hand():
    H, I, L, V = 4096, 14336, 32, 32000
    p1 = P.plan(MISTRAL, 1, batch_size=1, n_positions=4096, amp="bf16")
    layer1 = (H * (4096 + 2 * 1024) + 4096 * H + 3 * H * I) * 2 + 2 * H * 2
    assert p1.weight_bytes == L * layer1 + H * 2 + V * H * 2 == 14_221_320_192  # embedding on the host (tnx)
    assert p1.kv_bytes == 2 * L * 1 * 8 * 4096 * 128 * 2 == 536_870_912
    p2 = P.plan(MISTRAL, 2, batch_size=1, n_positions=4096, amp="bf16")
    layer2 = (H * (2048 + 2 * 512) + 2048 * H + 3 * H * (I // 2)) * 2 + 2 * H * 2
    assert p2.weight_bytes == L * layer2 + H * 2 + (V // 2) * H * 2
    assert p2.kv_bytes == p1.kv_bytes // 2 and (p2.strategy, p2.kv_heads_per_core) == ("shard-over-heads", 4)
    nx = P.plan(MISTRAL, 1, batch_size=1, n_positions=4096, amp="bf16", library="nxdi")
    assert nx.weight_bytes == p1.weight_bytes + V * H * 2  # NxDI keeps the embedding on the device


def test_int8_moe_and_tied_by_hand():
    H, I, L = 4096, 14336, 32
    q = P.plan(MISTRAL, 2, n_positions=4096, amp="bf16", quantization="int8")
    linear = H * (2048 + 1024) + 2048 * H + 3 * H * (I // 2)
    scales = (2048 + 1024) + H + 2 * (I // 2) + H  # one per output channel, in bf16
    assert q.breakdown["layers"] == L * (linear + scales * 2 + 2 * H * 2)
    mix = P.plan("Mixtral-8x7B-v0.1", 8, n_positions=4096, amp="bf16")
    per_layer = (H * (512 + 2 * 128) + 512 * H + 8 * 3 * H * (I // 8)) * 2 + H * 8 * 2 + 2 * H * 2
    assert mix.breakdown["layers"] == L * per_layer
    one = P.plan("Llama-3.2-1B", 2, n_positions=2048, amp="bf16", library="nxdi")
    assert one.breakdown["embedding"] == one.breakdown["lm_head"] == 128256 // 2 * 2048 * 2  # tied: both on device


def test_planner_matches_the_engine_shards():
    """The planner's tnx figure == the bytes of the tensors the engine builds per rank (minus the embedding,
    which the engine keeps per rank and transformers-neuronx keeps on the host)."""
    cfg = load_config(None)
    args = ModelArgs.from_hf(cfg)
    state = LazyState(None)
    for tp, ranks in ((1, [0]), (2, [0, 1]), (3, [0])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            layout = resolve_layout(9, 3, 64, tp, 2, None)
            p = P.plan(cfg, tp, batch_size=2, n_positions=256, amp="f32")
        for r in ranks:
            w = shard_state(state, args, torch.float32, r, tp, layout)
            parts = weight_breakdown(w)
            assert parts["layers"] + parts["norms"] + (parts["lm_head"] or parts["embedding"]) == p.weight_bytes
            kv = ParallelTransformer(args, w, Comm(), 2, 256, torch.device("cpu"), torch.float32).kv_cache_bytes()
            assert kv == p.kv_bytes
    assert P.plan(cfg, 2, batch_size=2, n_positions=256, amp="f32").kv_bytes == 2 * 30 * 2 * 5 * 256 * 64 * 4


def test_instance_facts():
    assert [(i.name, i.cores, i.hbm_per_core_bytes // P.GiB) for i in P.INSTANCES.values()] == [
        ("inf2.xlarge", 2, 16), ("inf2.8xlarge", 2, 16), ("inf2.24xlarge", 12, 16), ("inf2.48xlarge", 24, 16),
        ("trn1.2xlarge", 2, 16), ("trn1.32xlarge", 32, 16), ("trn2.48xlarge", 64, 24)]
    assert P.INSTANCES["inf2.24xlarge"].tp_degrees == (1, 2, 4, 8)
    assert P.INSTANCES["trn1.32xlarge"].tp_degrees == (1, 2, 8, 16, 32)


def test_seed_000_mistral_on_one_inf2_core():
    case = P.SEED_000
    kw = dict(batch_size=case["batch_size"], n_positions=case["n_positions"], amp=case["amp"])
    with pytest.raises(ValueError, match=r"needs 13\.74 GiB per NeuronCore .* use tp_degree=2"):
        P.check(case["model"], case["instance"], 1, **kw)
    p1 = P.plan(case["model"], 1, **kw)
    # weights + KV alone (14.76 GB) are under the 15.94 GB the runtime asked for: the rest is its own
    assert p1.total_bytes < case["observed_gb"] * P.GB < P.INSTANCES["inf2.xlarge"].hbm_per_core_bytes
    norms = (2 * 32 + 1) * 4096 * 2  # replicated on every core; everything else halves at tp=2
    assert P.check(case["model"], case["instance"], 2, **kw).total_bytes == (p1.total_bytes - norms) // 2 + norms


@pytest.mark.parametrize("args, match", [
    (("Llama-3.1-8B", "inf2.48xlarge", 3), r"not a tensor-parallel degree .* inf2 .*use tp_degree 2 or 4"),
    (("Llama-3.1-8B", "inf2.xlarge", 8), r"inf2.xlarge has 2 NeuronCores.*inf2.24xlarge or inf2.48xlarge"),
    (("Llama-3.1-70B", "trn1.32xlarge", 8), r"needs .* use tp_degree=16"),
    (("Llama-3.1-70B", "inf2.xlarge", 2), r"use inf2.48xlarge or trn1.32xlarge"),
])
def test_invalid_choices_name_the_fix(args, match):
    with pytest.raises(ValueError, match=match):
        P.check(*args, n_positions=4096, amp="bf16")


def test_head_padding_is_a_warning_or_strict_error():
    cfg = load_config(None)
    with pytest.warns(UserWarning, match=r"9 attention heads are not divisible by tp_degree=2: Neuron pads to 10"):
        P.check(cfg, "trn1.2xlarge", 2, n_positions=256)
    with pytest.raises(ValueError, match=r"or use tp_degree 1/3/9"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        P.check(cfg, "trn1.2xlarge", 2, n_positions=256, strict_heads=True)
