"""neuronx_distributed_inference/modules/autobucketing.py at aws-neuron/neuronx-distributed-inference cd3abf3
(SDK 2.28.0): generate_buckets and the per-model bucket lists (context encoding, token generation,
speculation), and the two-dimensional buckets of prefix caching (``generate_2d_buckets_for_prefix_caching*``:
[prefill, prefix] pairs for context encoding with a prefix 0 column, [1, S] for token generation). Chunked prefill
and batch bucketing are not transcribed (NotImplementedError).
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


def generate_2d_buckets_for_prefix_caching(
    min_vertical_len: int, max_vertical_len: int, min_horizontal_len: int, max_horizontal_len: int, is_context_encode=False
):
    vertical_ranges = generate_buckets(min_vertical_len, max_vertical_len)
    horizontal_ranges = generate_buckets(min_horizontal_len, max_horizontal_len)
    # Add a special case for no prefix
    if is_context_encode:
        horizontal_ranges = [0] + horizontal_ranges
    buckets = []
    for vertical_range in vertical_ranges:
        for horizontal_range in horizontal_ranges:
            buckets.append([vertical_range, horizontal_range])
    return buckets


def generate_2d_buckets_for_prefix_caching_from_config(
    vertical_ranges, horizontal_ranges, is_context_encode=False
):
    if is_context_encode:
        horizontal_ranges = [0] + horizontal_ranges  # prefix_buckets=None: TypeError, as in the release
    buckets = []
    for vertical_range in vertical_ranges:
        for horizontal_range in horizontal_ranges:
            buckets.append([vertical_range, horizontal_range])
    return buckets


def _not_transcribed(neuron_config):
    if neuron_config.is_chunked_prefill:
        raise NotImplementedError("stand-in: chunked prefill buckets are not transcribed")


def generate_buckets_for_cte(inference_config):
    neuron_config = inference_config.neuron_config
    _not_transcribed(neuron_config)
    if not neuron_config.enable_bucketing:
        if neuron_config.is_prefix_caching:
            m = neuron_config.max_context_length
            buckets = generate_2d_buckets_for_prefix_caching(m, m, m, m, True)
        else:
            buckets = generate_buckets(neuron_config.max_context_length, neuron_config.max_context_length)
    elif neuron_config.context_encoding_buckets is not None:
        if neuron_config.is_prefix_caching:
            buckets = generate_2d_buckets_for_prefix_caching_from_config(
                neuron_config.context_encoding_buckets, neuron_config.prefix_buckets, True)
        else:
            buckets = neuron_config.context_encoding_buckets
    elif neuron_config.is_prefix_caching:
        # currently we have a requirement of minimal 512 to use the FA kernel
        m = neuron_config.max_context_length
        buckets = generate_2d_buckets_for_prefix_caching(512, m, 512, m, True)
    else:
        buckets = generate_buckets(128, neuron_config.max_context_length)
    return buckets


def generate_buckets_for_tkg(inference_config):
    neuron_config = inference_config.neuron_config
    _not_transcribed(neuron_config)
    if not neuron_config.enable_bucketing:
        if neuron_config.is_prefix_caching:
            buckets = generate_2d_buckets_for_prefix_caching(1, 1, neuron_config.max_length, neuron_config.max_length)
        else:
            buckets = generate_buckets(neuron_config.max_length, neuron_config.max_length)
    elif neuron_config.token_generation_buckets is not None:
        buckets = neuron_config.token_generation_buckets
        if neuron_config.is_prefix_caching:
            buckets = [[1, i] for i in buckets]
    elif neuron_config.is_prefix_caching:
        # currently we have a requirement of minimal 256 to use the block attn nki kernel
        buckets = generate_2d_buckets_for_prefix_caching(1, 1, 256, neuron_config.max_length)
    else:
        buckets = generate_buckets(128, neuron_config.max_length)
    if neuron_config.token_generation_batches is not None and neuron_config.is_prefix_caching:
        raise NotImplementedError("Batch bucketing is not yet supported with prefix caching enabled.")
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
