"""neuronx_distributed_inference/modules/autobucketing.py at aws-neuron/neuronx-distributed-inference cd3abf3
(SDK 2.28.0): generate_buckets and the per-model bucket lists (context encoding, token generation,
speculation). Prefix caching, chunked prefill and batch bucketing are not transcribed (NotImplementedError).
"""
from math import log2

BUCKET_SELECTION_STRATEGIES = {"max", "first_fit", "second_fit"}


def generate_buckets(min_length: int, max_length: int):
    if min_length == max_length:
        return [max_length]

    min_bound = int(log2(min_length))
    max_bound = round(log2(max_length))  # we use round because it creates optimal bucket spacing

    # NOTE: because range operates on [a,b), and we rounded the log2 result
    # we won't get 2**i results close to the max_length.
    buckets = [2**i for i in range(min_bound, max_bound)] + [max_length]
    return buckets


def _not_transcribed(neuron_config):
    if neuron_config.is_chunked_prefill or neuron_config.is_prefix_caching:
        raise NotImplementedError("stand-in: prefix caching / chunked prefill buckets are not transcribed")


def generate_buckets_for_cte(inference_config):
    neuron_config = inference_config.neuron_config
    _not_transcribed(neuron_config)
    if not neuron_config.enable_bucketing:
        buckets = generate_buckets(neuron_config.max_context_length, neuron_config.max_context_length)
    elif neuron_config.context_encoding_buckets is not None:
        buckets = neuron_config.context_encoding_buckets
    else:
        buckets = generate_buckets(128, neuron_config.max_context_length)
    return buckets


def generate_buckets_for_tkg(inference_config):
    neuron_config = inference_config.neuron_config
    _not_transcribed(neuron_config)
    if not neuron_config.enable_bucketing:
        buckets = generate_buckets(neuron_config.max_length, neuron_config.max_length)
    elif neuron_config.token_generation_buckets is not None:
        buckets = neuron_config.token_generation_buckets
    else:
        buckets = generate_buckets(128, neuron_config.max_length)
    if neuron_config.token_generation_batches is not None:
        raise NotImplementedError("stand-in: batch bucketing (token_generation_batches) is not transcribed")
    return buckets


def generate_buckets_for_speculation(inference_config):
    """Generate buckets for vanilla speculation model"""
    if not inference_config.neuron_config.enable_bucketing:
        buckets = generate_buckets(
            inference_config.neuron_config.max_length,
            inference_config.neuron_config.max_length
        )
    else:
        if inference_config.neuron_config.token_generation_buckets is not None:
            buckets = inference_config.neuron_config.token_generation_buckets
        else:
            buckets = generate_buckets(
                128, inference_config.neuron_config.max_length
            )
    return buckets
