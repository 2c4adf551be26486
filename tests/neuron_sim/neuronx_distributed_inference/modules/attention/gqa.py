"""neuronx_distributed_inference/modules/attention/gqa.py at aws-neuron/neuronx-distributed-inference cd3abf3
(SDK 2.28.0): the GQA enum, determine_sharding_strategy, get_shardable_head_counts (with
neuronx_distributed.parallel_layers.pad.get_number_of_extra_heads). Pure functions: nothing is sharded
here (the stand-in computes at tp_degree=1, see models/model_base.py).
"""
import enum
import logging
from typing import Optional, Tuple

logger = logging.getLogger("Neuron")


class GQA(enum.Enum):
    # K/V heads replicated to match the Q heads (MHA); works in all cases, uses more memory.
    CONVERT_TO_MHA = "convert-to-mha"
    # Exactly one K/V head per rank through replication; needs tp_degree % num_key_value_heads == 0.
    REPLICATE_TO_TP_DEGREE = "replicate-to-tp-degree"


def get_number_of_extra_heads(num_heads: int, tp_degree: int) -> int:
    """neuronx_distributed.parallel_layers.pad: heads added to reach a multiple of tp_degree."""
    return (tp_degree - num_heads % tp_degree) % tp_degree


def determine_sharding_strategy(
    tp_degree: int, source_key_value_heads: int, desired_sharding_strategy: Optional[GQA] = None
) -> GQA:
    sharding_strategy = (
        desired_sharding_strategy if desired_sharding_strategy else GQA.REPLICATE_TO_TP_DEGREE
    )

    if sharding_strategy == GQA.REPLICATE_TO_TP_DEGREE and (
        tp_degree % source_key_value_heads != 0
    ):
        logger.warning(f"TP degree ({tp_degree}) and KV heads ({source_key_value_heads}) are not divisible. Overriding attention sharding strategy to GQA.CONVERT_TO_MHA!")
        sharding_strategy = GQA.CONVERT_TO_MHA

    return sharding_strategy


def get_shardable_head_counts(
    tp_degree: int, num_attention_heads: int, num_key_value_heads: int, sharding_strategy: GQA
) -> Tuple[int, int]:
    # Pad attention heads
    updated_num_attention_heads = num_attention_heads + get_number_of_extra_heads(
        num_attention_heads, tp_degree
    )

    # Replicate and pad K/V heads
    updated_num_key_value_heads = num_key_value_heads
    if num_attention_heads == num_key_value_heads:  # MHA
        updated_num_key_value_heads = updated_num_attention_heads
    else:  # GQA / MQA
        if (num_key_value_heads < tp_degree) or (num_key_value_heads % tp_degree != 0):
            if sharding_strategy == GQA.REPLICATE_TO_TP_DEGREE:
                assert (
                    tp_degree % num_key_value_heads == 0
                ), "GQA.REPLICATE_TO_TP_DEGREE requires tp_degree to be divisible by num_key_value_heads"
                updated_num_key_value_heads = tp_degree
            elif sharding_strategy == GQA.CONVERT_TO_MHA:
                updated_num_key_value_heads = updated_num_attention_heads

    return updated_num_attention_heads, updated_num_key_value_heads
