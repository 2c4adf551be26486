"""Choose bucket sizes from a sample of lengths: the set of at most ``k`` buckets that minimises
the expected number of padded tokens, found exactly by dynamic programming.

The Neuron guides give rules of thumb (powers of two from 128; "if all the requests have a
context length of about 1500 +/- 500 tokens, adding buckets of 1024, 1280, 1536, 1792, 2048"
— transformers-neuronx developer guide, Bucketing). Here the sample decides. With
transformers-neuronx's selection (``bucket.find``: smallest bucket >= length) an optimal bucket
always sits on a sample length (lowering it to the largest length it serves only removes
padding), so the candidates are the distinct lengths (rounded up to ``align``) and the optimum
over them is exact. NxD Inference's first_fit is strict (``length < bucket``, the largest may be
equal): ``rule="nxdi"`` plans for ``length + 1``.

Context buckets: the lengths are prompt lengths. Token buckets: every decode step at KV length
``n`` attends over ``bucket(n)`` positions, so the lengths are all the KV lengths a generation
visits (:func:`decode_lengths`), and the padding is attention over empty cache positions.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from . import buckets as bk

RULES = ("tnx", "nxdi")
# transformers-neuronx developer guide (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/archive/transformers-neuronx/transformers-neuronx-developer-guide.html),
# Bucketing: "it is better to have all the bucket to be
# multiples of 256 tokens"; beyond 2048, "extra buckets with multiple of 512 or 1024 tokens" ("It is not recommended
# to add buckets of multiples of 256 tokens or smaller for context buckets beyond 2k to avoid bucket switching
# latency"). ``align="guide"`` plans on that grid: multiples of 256 up to 2048, of 512 above.
GUIDE_ALIGN = "guide"
GUIDE_STEP, GUIDE_STEP_BEYOND_2K, GUIDE_2K = 256, 512, 2048
# The same section's list for "requests [with] a context length of about 1500 +/- 500 tokens".
GUIDE_1500_BUCKETS = [1024, 1280, 1536, 1792, 2048]


def _check(lengths, weights=None):
    v = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if v.size == 0:
        raise ValueError("lengths is empty: pass at least one length")
    if (v < 1).any():
        raise ValueError("lengths must be >= 1")
    w = np.ones_like(v, dtype=np.float64) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != v.shape or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be non-negative, one per length, not all zero")
    return v, w


def select(buckets, length: int, rule: str = "tnx") -> int | None:
    """The bucket a request of ``length`` tokens runs in, or None if none holds it."""
    if rule == "tnx":
        b = bk.tnx_find(buckets, length)
        return b if b >= length else None
    if rule == "nxdi":
        try:
            return bk.nxdi_select(buckets, length, "planner")
        except bk.BucketOverflowError:
            return None
    raise ValueError(f"rule={rule!r}: use one of {RULES}")


def padded_tokens(buckets, lengths, weights=None, rule: str = "tnx") -> float:
    """Expected padded tokens per request (weighted mean of ``bucket - length``)."""
    v, w = _check(lengths, weights)
    buckets = sorted(int(b) for b in buckets)
    chosen = np.array([select(buckets, int(n), rule) or -1 for n in v])
    if (chosen < 0).any():
        raise ValueError(f"{int((chosen < 0).sum())} length(s) exceed the largest bucket {buckets[-1]} "
                         f"(longest: {int(v.max())}): add a bucket >= it")
    return float((w * (chosen - v)).sum() / w.sum())


def overflow_fraction(buckets, lengths, weights=None) -> float:
    """Share of requests longer than the largest bucket (transformers-neuronx then encodes the rest
    token by token; NxD Inference raises)."""
    v, w = _check(lengths, weights)
    return float(w[v > max(buckets)].sum() / w.sum())


def _align_up(n, align):
    """Round up to a multiple of ``align`` (an int), or to the guide's grid (``align="guide"``)."""
    if align == GUIDE_ALIGN:
        n = np.asarray(n)
        return np.where(n <= GUIDE_2K, -(-n // GUIDE_STEP) * GUIDE_STEP, -(-n // GUIDE_STEP_BEYOND_2K) * GUIDE_STEP_BEYOND_2K)
    return -(-n // align) * align


def _check_align(align):
    if align == GUIDE_ALIGN:
        return align
    if isinstance(align, str) or int(align) < 1:
        raise ValueError(f"align={align!r}: an int >= 1, or {GUIDE_ALIGN!r} (multiples of 256 up to 2048, of 512 above)")
    return int(align)


def _need(v, rule: str, align: int, max_length: int | None) -> np.ndarray:
    """The smallest candidate bucket for each length. The largest candidate is the longest length
    rounded up to ``align`` (at most ``max_length``): in both rules a request as long as the
    largest bucket still fits it."""
    if rule not in RULES:
        raise ValueError(f"rule={rule!r}: use one of {RULES}")
    align = _check_align(align)
    top = int(_align_up(v.max(), align))
    if max_length is not None:
        if v.max() > max_length:
            raise ValueError(f"a length of {int(v.max())} exceeds max_length={max_length}")
        top = min(top, int(max_length))
    return np.minimum(_align_up(v + (1 if rule == "nxdi" else 0), align), top)


def plan_buckets(lengths, max_buckets: int, weights=None, *, max_length: int | None = None, align=1,
                 rule: str = "tnx") -> list[int]:
    """At most ``max_buckets`` sizes (multiples of ``align``, or the guide's grid with ``align="guide"``; the
    largest covering every length, none above ``max_length``) minimising the expected padded tokens. Exact:
    O(max_buckets * m^2) for m candidates."""
    v, w = _check(lengths, weights)
    if int(max_buckets) < 1:
        raise ValueError(f"max_buckets={max_buckets}: must be >= 1")
    need = _need(v, rule, align, max_length)
    cand, idx = np.unique(need, return_inverse=True)
    m = len(cand)
    # W[i], S[i]: weight and weighted length sum of the requests whose candidate is < cand[i]
    W = np.concatenate([[0.0], np.cumsum(np.bincount(idx, weights=w, minlength=m))])
    S = np.concatenate([[0.0], np.cumsum(np.bincount(idx, weights=w * v, minlength=m))])
    layers = []  # layers[t][i]: least padding of the requests of cand[:i] with t+1 buckets, the top at cand[i-1]
    f = np.concatenate([[0.0], np.full(m, np.inf)])
    for _ in range(min(int(max_buckets), m)):
        f = np.array([0.0] + [np.min(_cost(f, cand, W, S, i)) for i in range(1, m + 1)])
        layers.append(f)
    n = min(range(len(layers)), key=lambda t: (round(layers[t][m], 6), t))  # fewest buckets among the best
    chosen, i = [], m
    for t in range(n, -1, -1):
        chosen.append(int(cand[i - 1]))
        if t:
            i = int(np.argmin(_cost(layers[t - 1], cand, W, S, i)))
    return sorted(chosen)


def _cost(prev, cand, W, S, i):
    """For each j < i: padding of prev[j] plus one bucket at cand[i-1] serving the requests of cand[j:i]."""
    return prev[:i] + cand[i - 1] * (W[i] - W[:i]) - (S[i] - S[:i])


def brute_force_buckets(lengths, max_buckets: int, weights=None, *, max_length: int | None = None,
                        align=1, rule: str = "tnx") -> tuple[list[int], float]:
    """Every subset of the candidates (for tests on small cases): (best buckets, their padding)."""
    v, w = _check(lengths, weights)
    cand = sorted(set(_need(v, rule, align, max_length).tolist()))
    best, best_cost = None, math.inf
    for r in range(1, min(max_buckets, len(cand)) + 1):
        for combo in itertools.combinations(cand, r):
            if select(combo, int(v.max()), rule) is None:
                continue
            cost = padded_tokens(combo, v, w, rule)
            if cost < best_cost - 1e-9:
                best, best_cost = list(combo), cost
    return best, best_cost


def decode_lengths(prompt_lengths, output_lengths) -> tuple[np.ndarray, np.ndarray]:
    """KV lengths visited by decoding, as (values, counts): a request with a prompt of L tokens that
    generates n writes slots L..L+n-1, attending over L+1..L+n positions."""
    p = np.asarray(prompt_lengths, dtype=np.int64).reshape(-1)
    o = np.asarray(output_lengths, dtype=np.int64).reshape(-1)
    if p.shape != o.shape or (o < 1).any():
        raise ValueError("prompt_lengths and output_lengths: one pair per request, outputs >= 1")
    top = int((p + o).max())
    diff = np.zeros(top + 2, dtype=np.int64)
    np.add.at(diff, p + 1, 1)
    np.add.at(diff, p + o + 1, -1)
    counts = np.cumsum(diff)[: top + 1]
    values = np.nonzero(counts)[0]
    return values, counts[values].astype(np.float64)
