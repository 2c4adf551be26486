"""Bucket computation and selection, exactly as the pinned Neuron releases do it.

transformers-neuronx 0.13 (``transformers_neuronx/bucket.py``): ``token_sizes``,
``context_sizes``, ``find``. NxD Inference 0.8 (``modules/autobucketing.py``
``generate_buckets``; ``models/model_wrapper.py`` ``_get_seq_bucket``, "first_fit").
"""
from __future__ import annotations

import bisect
import math
from typing import Sequence


def tnx_token_buckets(n_positions: int | Sequence[int]) -> list[int]:
    """An int gives powers of two from 128 below it, then itself (2048 -> 128..2048; 300 -> 128,256,300)."""
    if isinstance(n_positions, (list, tuple)):
        return sorted(int(n) for n in n_positions)
    n = int(n_positions)
    sizes, b = [], 128
    while b < n:
        sizes.append(b)
        b *= 2
    return sizes + [n]


def tnx_context_buckets(context_length_estimate, token_buckets: Sequence[int]) -> list[int]:
    """None -> half of each token bucket; an int -> [int] (<= 0 -> []); a list -> sorted."""
    if context_length_estimate is None:
        return [b // 2 for b in token_buckets]
    if isinstance(context_length_estimate, (list, tuple)):
        return sorted(int(c) for c in context_length_estimate)
    c = int(context_length_estimate)
    return [c] if c > 0 else []


def tnx_find(buckets: Sequence[int], size: int) -> int:
    """Smallest bucket >= size, else the largest (bisect_left, capped)."""
    i = bisect.bisect_left(list(buckets), size)
    return buckets[min(i, len(buckets) - 1)]


def nxdi_generate_buckets(min_length: int, max_length: int) -> list[int]:
    """Powers of two from 2**int(log2(min)) up to but excluding 2**round(log2(max)), then max."""
    if min_length == max_length:
        return [max_length]
    lo, hi = int(math.log2(min_length)), round(math.log2(max_length))
    return [2 ** i for i in range(lo, hi)] + [max_length]


class BucketOverflowError(ValueError):
    pass


def nxdi_select(buckets: Sequence[int], input_len: int, tag: str, allow_input_truncation: bool = False) -> int:
    """NxDI first_fit: first bucket with ``input_len < bucket`` (strict); the largest if equal or truncation allowed."""
    for b in buckets:
        if input_len < b:
            return b
    largest = buckets[-1]
    if input_len == largest or allow_input_truncation:
        return largest
    raise BucketOverflowError(f"Input len {input_len} exceeds largest bucket ({largest}) for {tag}")
