"""neuronx_distributed_inference/modules/attention/gqa.py (0.8.0): the GQA enum and strategy choice."""
import enum
import logging

logger = logging.getLogger(__name__)


class GQA(enum.Enum):
    CONVERT_TO_MHA = "convert-to-mha"
    REPLICATE_TO_TP_DEGREE = "replicate-to-tp-degree"


def determine_sharding_strategy(tp_degree, source_key_value_heads, desired_sharding_strategy=None):
    strategy = desired_sharding_strategy if desired_sharding_strategy else GQA.REPLICATE_TO_TP_DEGREE
    if tp_degree % source_key_value_heads != 0:
        logger.warning(f"TP degree ({tp_degree}) and KV heads ({source_key_value_heads}) are not divisible. "
                       "Overriding attention sharding strategy to GQA.CONVERT_TO_MHA!")
        strategy = GQA.CONVERT_TO_MHA
    return strategy


def get_shardable_head_counts(tp_degree, num_attention_heads, num_key_value_heads, sharding_strategy):
    q = num_attention_heads + (tp_degree - num_attention_heads % tp_degree) % tp_degree
    kv = num_key_value_heads
    if sharding_strategy == GQA.CONVERT_TO_MHA:
        kv = q
    elif kv < tp_degree or kv % tp_degree != 0:
        assert tp_degree % kv == 0, "GQA.REPLICATE_TO_TP_DEGREE requires tp_degree to be divisible by num_key_value_heads"
        kv = tp_degree
    return q, kv
