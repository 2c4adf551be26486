"""Stand-in of ``src/transformers_neuronx/bucket.py`` at aws-neuron/transformers-neuronx v0.13.0 (commit f4e3818).

Transcribed as is (with ``utils.power_of_two_bucket_sizes``): token buckets, context buckets, batch sizes,
and ``find`` (the smallest bucket >= size, else the largest; None when there are no buckets).
"""
import bisect
from typing import List, Optional, Union


def power_of_two_bucket_sizes(min_bucket_size, max_bucket_size):
    """utils.py ``power_of_two_bucket_sizes``."""
    sizes = []
    bucket_size = min_bucket_size
    while bucket_size < max_bucket_size:
        sizes.append(bucket_size)
        bucket_size *= 2
    sizes.append(max_bucket_size)
    return sizes


def token_sizes(buckets_or_size: Union[List[int], int]) -> List[int]:
    if isinstance(buckets_or_size, list):
        return sorted(buckets_or_size)
    return power_of_two_bucket_sizes(128, buckets_or_size)


def context_sizes(
        buckets_or_size: Optional[Union[List[int], int]],
        token_buckets: Optional[List[int]] = None,
    ) -> List[int]:
    if isinstance(buckets_or_size, list):
        return sorted(buckets_or_size)
    if isinstance(buckets_or_size, int):
        if buckets_or_size <= 0:
            return []
        return [buckets_or_size]
    if token_buckets is not None and buckets_or_size is None:
        return [bucket // 2 for bucket in token_buckets]
    raise NotImplementedError(f'Prompt bucket config {buckets_or_size} not supported')


def batch_sizes(batch_size: Union[List[int], int]) -> List[int]:
    if isinstance(batch_size, int):
        return [batch_size]
    elif isinstance(batch_size, list):
        return sorted(batch_size)
    else:
        raise TypeError("batch_size must be list of ints or int type")


def find(buckets: Optional[List[int]], size: int) -> Optional[int]:
    if not buckets:  # When we have no buckets, return None
        return None
    index = bisect.bisect_left(buckets, size, hi=len(buckets) - 1)
    return buckets[index]
