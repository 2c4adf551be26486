"""neuronx_distributed_inference/modules/autobucketing.py (0.8.0): generate_buckets."""
import math


def generate_buckets(min_length: int, max_length: int):
    if min_length == max_length:
        return [max_length]
    return [2 ** i for i in range(int(math.log2(min_length)), round(math.log2(max_length)))] + [max_length]
