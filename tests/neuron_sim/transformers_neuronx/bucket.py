"""transformers_neuronx/bucket.py (v0.13.0): bucket lists, re-implemented from the documented rules."""
import bisect


def token_sizes(buckets_or_size):
    if isinstance(buckets_or_size, list):
        return sorted(buckets_or_size)
    sizes, b = [], 128
    while b < buckets_or_size:
        sizes.append(b)
        b *= 2
    return sizes + [buckets_or_size]


def context_sizes(buckets_or_size, token_buckets=None):
    if isinstance(buckets_or_size, list):
        return sorted(buckets_or_size)
    if isinstance(buckets_or_size, int):
        return [] if buckets_or_size <= 0 else [buckets_or_size]
    if buckets_or_size is None and token_buckets is not None:
        return [b // 2 for b in token_buckets]
    raise NotImplementedError(f'Prompt bucket config {buckets_or_size} not supported')


def batch_sizes(batch_size):
    if isinstance(batch_size, int):
        return [batch_size]
    if isinstance(batch_size, list):
        return sorted(batch_size)
    raise TypeError("batch_size must be list of ints or int type")


def find(buckets, size):
    if not buckets:
        return None
    return buckets[bisect.bisect_left(buckets, size, hi=len(buckets) - 1)]
