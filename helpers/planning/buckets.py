"""Bucket computation and selection, exactly as the pinned Neuron releases do it.

transformers-neuronx 0.13 (``transformers_neuronx/bucket.py``): ``token_sizes``,
``context_sizes``, ``find``; ``utils.power_of_two_bucket_sizes``. NxD Inference 0.8
(``modules/autobucketing.py`` ``generate_buckets``, ``generate_buckets_for_cte`` /
``generate_buckets_for_tkg``; ``models/model_wrapper.py`` ``_get_seq_bucket``, "first_fit";
``models/config.py`` for the keyword names and their checks), and NxDI's two-dimensional context buckets
with prefix caching (``generate_2d_buckets_for_prefix_caching*``; ``model_wrapper.py``
``get_target_2d_bucket_for_prefix_caching``).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Sequence

# NxDI model tags (models/model_wrapper.py), used in its bucket error messages
CONTEXT_ENCODING_MODEL_TAG = "context_encoding_model"
TOKEN_GENERATION_MODEL_TAG = "token_generation_model"
SPECULATION_MODEL_TAG = "speculation_model"


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
    if isinstance(context_length_estimate, bool) or not isinstance(context_length_estimate, int):
        raise NotImplementedError(f"Prompt bucket config {context_length_estimate} not supported")
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


def nxdi_context_buckets(context_length_estimate, token_buckets: Sequence[int], longest_prompt: int) -> list[int]:
    """Context buckets to compile on NxD Inference so that a prompt of ``longest_prompt`` tokens runs.

    NxD Inference runs a prompt in the first context bucket longer than it (the largest when equal) and
    raises "Input len N exceeds largest bucket" beyond that: no token-by-token continuation as in
    transformers-neuronx. ``None`` (transformers-neuronx's default, half of each token bucket, which stops at
    half of n_positions) gives NxD Inference's own default instead, ``generate_buckets(128, seq_len)``: the
    list it builds itself when ``max_context_length`` is ``seq_len``. An explicit value (int or list, as
    ``context_length_estimate``) is kept when it holds the prompt and refused otherwise, naming the fix."""
    tokens = sorted(int(t) for t in token_buckets)
    longest = int(longest_prompt)
    default = nxdi_generate_buckets(min(128, tokens[-1]), tokens[-1])
    if longest >= tokens[-1]:
        raise ValueError(f"a prompt of {longest} tokens leaves no room to generate within n_positions={tokens[-1]}: "
                         "raise n_positions or shorten the prompt")
    buckets = default if context_length_estimate is None else tnx_context_buckets(context_length_estimate, tokens)
    if not buckets:
        raise ValueError(f"context_length_estimate={context_length_estimate!r} gives no context bucket: NxD Inference "
                         f"always encodes the prompt with a context-encoding model; use None (its default {default})")
    try:
        nxdi_select(buckets, longest, CONTEXT_ENCODING_MODEL_TAG)
    except BucketOverflowError as e:
        raise ValueError(f"{e}: NxD Inference refuses a prompt longer than its largest context bucket. Add a bucket "
                         f">= {longest} (and <= n_positions {tokens[-1]}) to context_length_estimate="
                         f"{context_length_estimate!r}, or set it to None for NxD Inference's default {default}") from None
    return buckets


@dataclass
class NxDIBucketing:
    """NxD Inference's bucketing keywords (its ``NeuronConfig`` names) for the reference engine.

    Pass it as ``NeuronModel.from_pretrained(..., n_positions=seq_len, nxdi_bucketing=NxDIBucketing(...))``:
    ``n_positions`` plays NxDI's ``seq_len`` / ``max_length``. Selection is NxDI's strict first-fit and a
    prompt longer than the largest context bucket raises (or is truncated with a warning when
    ``allow_input_truncation``) instead of transformers-neuronx's token-by-token continuation.
    """
    enable_bucketing: bool = True
    context_encoding_buckets: list[int] | None = None
    token_generation_buckets: list[int] | None = None
    max_context_length: int | None = None   # None: seq_len, as NxDI
    allow_input_truncation: bool = False

    def buckets(self, seq_len: int) -> tuple[list[int], list[int]]:
        """(context buckets, token buckets) as ``generate_buckets_for_cte`` / ``_tkg`` build them."""
        max_length = int(seq_len)
        max_ctx = max_length if self.max_context_length is None else int(self.max_context_length)
        if max_ctx > max_length:  # models/config.py
            raise ValueError(f"max_context_length={max_ctx} > seq_len={max_length}: "
                             "max_context_length cannot be more than max_length")
        if not self.enable_bucketing:
            return [max_ctx], [max_length]
        ctx = sorted(self.context_encoding_buckets) if self.context_encoding_buckets else None
        tkg = sorted(self.token_generation_buckets) if self.token_generation_buckets else None
        if ctx is not None and ctx[-1] > max_ctx:
            raise ValueError(f"Context bucket {ctx[-1]} should be <= {max_ctx} (max_context_length): "
                             "lower context_encoding_buckets or raise max_context_length")
        if tkg is not None and tkg[-1] > max_length:
            raise ValueError(f"Token generation bucket {tkg[-1]} should be <= {max_length} (seq_len): "
                             "lower token_generation_buckets or raise n_positions")
        return (ctx or nxdi_generate_buckets(128, max_ctx)), (tkg or nxdi_generate_buckets(128, max_length))


# -- NxD Inference 0.8 prefix caching: two-dimensional context buckets ------------------------------
PREFIX_CACHING_MIN_BUCKET = 512  # autobucketing.py: "a requirement of minimal 512 to use the FA kernel"


def nxdi_prefix_caching_buckets(prefill_buckets: Sequence[int] | None = None, prefix_buckets: Sequence[int] | None = None,
                                max_context_length: int | None = None) -> list[tuple[int, int]]:
    """The (prefill, prefix) context-encoding buckets NxDI compiles with ``is_prefix_caching=True``.

    Explicit lists (``context_encoding_buckets`` = prefill, ``prefix_buckets``): their grid, with a prefix
    bucket 0 added for requests without a cache hit (``generate_2d_buckets_for_prefix_caching_from_config``).
    Without them (``enable_bucketing`` and no lists): both dimensions are ``generate_buckets(512,
    max_context_length)`` plus the prefix 0 (``generate_2d_buckets_for_prefix_caching(512, max, 512, max,
    True)``). Ordered prefill-major, as NxDI indexes them (``prefill_index * len(prefix) + prefix_index``)."""
    if prefill_buckets is None or prefix_buckets is None:
        if max_context_length is None:
            raise ValueError("pass prefill_buckets and prefix_buckets, or max_context_length for NxDI's own grid")
        auto = nxdi_generate_buckets(PREFIX_CACHING_MIN_BUCKET, int(max_context_length))
        prefill_buckets = auto if prefill_buckets is None else prefill_buckets
        prefix_buckets = auto if prefix_buckets is None else prefix_buckets
    return [(int(v), int(h)) for v in prefill_buckets for h in [0, *prefix_buckets]]


def nxdi_prefix_caching_select(buckets: Sequence[Sequence[int]], prompt_len: int, prefix_len: int) -> tuple[int, int]:
    """The (prefill, prefix) bucket NxDI 0.8 runs a context-encoding request in, when ``prefix_len`` of its
    ``prompt_len`` tokens are a cache hit (``get_target_2d_bucket_for_prefix_caching``, CTE, no EAGLE):

    1. a total of 257..512 tokens runs in (512, 0) when that bucket exists (its measured corner case);
    2. the prefill bucket: the smallest >= the suffix (``prompt_len - prefix_len``); longer raises
       "Prefill len N exceeds largest bucket (B)";
    3. the prefill bucket's empty slots are filled from the end of the prefix (those tokens are re-encoded),
       then the prefix bucket: the smallest >= what is left; longer fails NxDI's assertion "Prefix len N
       exceeds largest bucket B" (raised here as BucketOverflowError)."""
    suffix, prefix = int(prompt_len) - int(prefix_len), int(prefix_len)
    if suffix < 1 or prefix < 0:
        raise ValueError(f"prompt_len={prompt_len}, prefix_len={prefix_len}: the prefix must be shorter than the prompt")
    pairs = [(int(b[0]), int(b[1])) for b in buckets]
    prefill = list(dict.fromkeys(v for v, _ in pairs))
    prefixes = list(dict.fromkeys(h for _, h in pairs))
    if 256 < suffix + prefix <= 512 and (512, 0) in pairs:
        return 512, 0
    fits = [v for v in prefill if suffix <= v]
    if not fits:
        raise BucketOverflowError(f"Prefill len {suffix} exceeds largest bucket ({prefill[-1]}) for "
                                  f"{CONTEXT_ENCODING_MODEL_TAG}")
    left = max(0, prefix - (fits[0] - suffix))
    hold = [h for h in prefixes if left <= h]
    if not hold:
        raise BucketOverflowError(f"Prefix len {left} exceeds largest bucket {prefixes[-1]} for "
                                  f"{CONTEXT_ENCODING_MODEL_TAG}")
    return fits[0], hold[0]
