"""GQA strategy rules against the pinned releases' source (transformers-neuronx 0.13 decoder.py / utils.py,
NxD Inference 0.8 modules/attention/gqa.py), with values worked out by hand from that source."""
from __future__ import annotations

import warnings

import pytest

from helpers.engine.config import NeuronConfig
from helpers.planning.gqa import GQA
from helpers.planning.gqa import (NxDIGQA, head_padding_message, nxdi_determine_sharding_strategy, nxdi_shardable_head_counts,
                         resolve_layout, tnx_check_gqa_fallback, tnx_qkv_padding)

SOH, SOB, REP, AG = GQA.SHARD_OVER_HEADS, GQA.SHARD_OVER_BATCH, GQA.REPLICATED_HEADS, GQA.ALL_GATHER_HEADS
CONVERT, REPLICATE = NxDIGQA.CONVERT_TO_MHA, NxDIGQA.REPLICATE_TO_TP_DEGREE


def quiet(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(w.message) for w in caught]


# SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64. (tp, batch, requested) -> what tnx ends with.
TNX_SMOLLM2 = [
    (1, 1, None, SOH), (1, 1, REP, REP), (1, 2, SOB, SOB), (1, 1, AG, AG),
    (2, 1, None, REP),   # 3 % 2: KV heads replicated
    (2, 1, SOB, REP),    # batch 1 % 2 -> SHARD_OVER_HEADS -> 3 % 2 -> REPLICATED
    (2, 2, SOB, SOB),    # accepted by check_gqa_fallback (the build then refuses: see below)
    (2, 1, AG, REP),     # pad 1 % 3 != 0 -> SHARD_OVER_HEADS -> REPLICATED
    (3, 1, None, SOH), (3, 2, SOB, SOH), (3, 3, SOB, SOB), (3, 1, AG, AG), (3, 1, REP, REP),
    (4, 1, AG, AG),      # pad 3 % 3 == 0 -> returns before the KV check
    (4, 1, None, REP), (6, 1, AG, AG),
    (9, 1, AG, SOH),     # 3*64 % 9 != 0 -> SOH, then 9 % 9 == 0 returns early: the KV check is skipped
]


@pytest.mark.parametrize("tp, batch, requested, expected", TNX_SMOLLM2)
def test_tnx_fallback_smollm2(tp, batch, requested, expected):
    got, _ = quiet(tnx_check_gqa_fallback, 9, 3, 64, tp, [batch], requested)
    assert got == expected


def test_tnx_fallback_warning_texts():
    _, msgs = quiet(tnx_check_gqa_fallback, 9, 3, 64, 2, [1], SOB)
    assert msgs == [
        'Cannot enable "GQA.SHARD_OVER_BATCH" when a batch size (1 in [1]) is not evenly divisible by the tensor '
        'parallel degree (2)',
        'KV head replication will be enabled since the number of KV heads (3) is not evenly divisible by the '
        'tensor parallel degree (2)']
    _, msgs = quiet(tnx_check_gqa_fallback, 9, 3, 64, 2, [1], AG)
    assert msgs[0] == ('Cannot enable "GQA.ALL_GATHER_HEADS" when the number of padding 1 need for query attention '
                       'heads (9) with the tensor parallel degree (2) is not divisible by KV heads (3)')
    assert quiet(tnx_check_gqa_fallback, 32, 32, 128, 8, [1], None) == (None, [])  # MHA: no GQA setting at all


@pytest.mark.parametrize("n, kv, tp, gqa, expected", [
    (9, 3, 1, REP, (9, 9)),      # full replication: ratio n/kv = 3
    (9, 3, 2, REP, (10, 10)),    # full replication to 9, == n_head -> n_head_padded
    (9, 3, 3, REP, (9, 3)),      # n_pad/tp == n/kv -> ratio 1
    (9, 3, 4, REP, (12, 4)),     # ratio 1, then raised to tp
    (9, 3, 6, REP, (12, 6)),     # partial replication tp/kv = 2
    (56, 8, 32, REP, (64, 32)),  # partial: pad 8 % 8 == 0
    (72, 24, 32, REP, (96, 32)),
    (9, 3, 2, SOH, (10, 3)), (32, 8, 8, SOH, (32, 8)),
])
def test_tnx_qkv_padding(n, kv, tp, gqa, expected):
    assert tnx_qkv_padding(n, kv, tp, gqa) == expected


@pytest.mark.parametrize("tp, kv, expected", [(1, 3, CONVERT), (2, 3, CONVERT), (3, 3, REPLICATE), (6, 3, REPLICATE),
                                              (32, 8, REPLICATE), (2, 8, CONVERT)])
def test_nxdi_strategy(tp, kv, expected):
    got, msgs = quiet(nxdi_determine_sharding_strategy, tp, kv, None)
    assert got == expected
    if expected == CONVERT:
        assert msgs == [f"TP degree ({tp}) and KV heads ({kv}) are not divisible. Overriding attention sharding "
                        "strategy to GQA.CONVERT_TO_MHA!"]


def test_nxdi_head_counts_and_layouts():
    # the examples in modules/attention/gqa.py's GQA enum comments (tp 32, 56 query / 8 KV heads)
    assert nxdi_shardable_head_counts(32, 56, 8, REPLICATE) == (64, 32)
    assert nxdi_shardable_head_counts(32, 56, 8, CONVERT) == (64, 64)
    assert nxdi_shardable_head_counts(2, 8, 8, CONVERT) == (8, 8)   # kv % tp == 0: counts unchanged
    with pytest.raises(ValueError, match="requires tp_degree to be divisible"):
        nxdi_shardable_head_counts(4, 9, 3, REPLICATE)
    rep = resolve_layout(56, 8, 128, 32, 1, REPLICATE)
    assert rep.q_heads[:4] == ((0, 1), (2, 3), (4, 5), (6, -1)) and rep.kv_heads[:5] == ((0,),) * 4 + ((1,),)
    conv = resolve_layout(56, 8, 128, 32, 1, CONVERT)
    assert conv.q_heads[0] == (0, 1) and conv.kv_heads[0] == (0, 0) and conv.kv_heads[-1] == (-1, -1)


def test_smollm2_layouts_per_rank():
    rep2, _ = quiet(resolve_layout, 9, 3, 64, 2, 1, None)        # -> REPLICATED: 9 -> 10 query heads, KV to 10
    assert rep2.q_heads == ((0, 1, 2, 3, 4), (5, 6, 7, 8, -1))
    assert rep2.kv_heads == ((0, 0, 0, 1, 1), (1, 2, 2, 2, -1))
    soh3 = resolve_layout(9, 3, 64, 3, 1, None)
    assert soh3.q_heads == ((0, 1, 2), (3, 4, 5), (6, 7, 8)) and soh3.kv_heads == ((0,), (1,), (2,))
    rep1 = resolve_layout(9, 3, 64, 1, 1, REP)                  # tnx replicates to MHA even at tp=1
    assert rep1.kv_heads == ((0, 0, 0, 1, 1, 1, 2, 2, 2),)
    assert rep1.kv_cache_elems(30, 256) == 3 * resolve_layout(9, 3, 64, 1, 1, SOH).kv_cache_elems(30, 256)
    sob3 = resolve_layout(9, 3, 64, 3, 3, SOB)                  # every KV head, one batch row per rank
    assert sob3.kv_mode == "batch" and sob3.kv_heads_per_rank == 3 and sob3.batch_rows_per_rank == 1
    ag6 = resolve_layout(9, 3, 64, 6, 1, AG)                    # 6 ranks: 32 K/V columns each, gathered in pairs
    assert ag6.kv_mode == "gather" and ag6.group_size == 2
    assert ag6.q_heads == ((0, 1), (2, -1), (3, 4), (5, -1), (6, 7), (8, -1))


@pytest.mark.parametrize("tp, batch, gqa, match", [
    (2, 2, SOB, "pads them to 10"),                 # tnx accepts it, then cannot regroup padded heads
    (4, 1, AG, "48 K/V columns"),                   # _sharded_kv_projection cannot tile a head
    (9, 1, AG, "without its KV head"),              # the SOH that fallback returns: 3 KV heads over 9 ranks
])
def test_invalid_requests_fail_with_the_fix(tp, batch, gqa, match):
    with pytest.raises(ValueError, match=match), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warnings that precede the refusal
        resolve_layout(9, 3, 64, tp, batch, gqa)


def test_head_padding_message_and_config_values():
    assert head_padding_message(9, 2) == ("9 attention heads are not divisible by tp_degree=2: Neuron pads to 10 "
                                          "heads (+11% q weights) — or use tp_degree 1/3/9")
    assert head_padding_message(9, 3) is None
    assert NeuronConfig(group_query_attention="convert-to-mha").group_query_attention is CONVERT
    assert NeuronConfig(group_query_attention="SHARD_OVER_BATCH").group_query_attention is SOB
    with pytest.raises(ValueError, match="group_query_attention"):
        NeuronConfig(group_query_attention="shard-over-everything")
