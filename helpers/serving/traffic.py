"""Sampled serving traffic: Poisson arrivals, mixed prompt and output lengths, seeded."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Request:
    """One request: it arrives at ``arrival_s`` (seconds on the serving clock), asks for exactly
    ``max_new_tokens`` greedy tokens after ``prompt`` (1-D token ids)."""
    rid: int
    arrival_s: float
    prompt: torch.Tensor
    max_new_tokens: int

    @property
    def prompt_len(self) -> int:
        return int(self.prompt.numel())


def _int_range(name: str, r) -> tuple[int, int]:
    lo, hi = (int(x) for x in r)
    if not 1 <= lo <= hi:
        raise ValueError(f"{name}={list(r)}: want [low, high] with 1 <= low <= high")
    return lo, hi


def sample_traffic(n_requests: int, arrival_rate: float, prompt_len, short_output, long_output,
                   long_share: float, vocab_size: int, seed: int = 0) -> list[Request]:
    """``n_requests`` requests with exponential inter-arrival times of mean ``1 / arrival_rate`` seconds (a
    Poisson process; the first arrives at 0), prompts of uniform length in ``prompt_len`` = [low, high] made of
    random token ids, and outputs drawn from a mix: ``long_share`` of them uniform in ``long_output``, the rest
    uniform in ``short_output`` (chat traffic: mostly short answers, a few long ones)."""
    if int(n_requests) < 1:
        raise ValueError(f"n_requests={n_requests}: must be >= 1")
    if not float(arrival_rate) > 0:
        raise ValueError(f"arrival_rate={arrival_rate}: requests per second, must be > 0")
    if not 0.0 <= float(long_share) <= 1.0:
        raise ValueError(f"long_share={long_share}: a fraction in [0, 1]")
    p_lo, p_hi = _int_range("prompt_len", prompt_len)
    s_lo, s_hi = _int_range("short_output", short_output)
    l_lo, l_hi = _int_range("long_output", long_output)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / float(arrival_rate), size=int(n_requests))
    arrivals = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    plens = rng.integers(p_lo, p_hi + 1, size=int(n_requests))
    is_long = rng.random(int(n_requests)) < float(long_share)
    outs = np.where(is_long, rng.integers(l_lo, l_hi + 1, size=int(n_requests)),
                    rng.integers(s_lo, s_hi + 1, size=int(n_requests)))
    g = torch.Generator().manual_seed(int(seed))
    return [Request(i, float(arrivals[i]), torch.randint(0, int(vocab_size), (int(plens[i]),), generator=g),
                    int(outs[i])) for i in range(int(n_requests))]


def traffic_summary(requests: list[Request]) -> dict:
    """Offered load: request count, span of arrivals, mean prompt and output lengths, tokens asked for."""
    outs = [r.max_new_tokens for r in requests]
    span = requests[-1].arrival_s - requests[0].arrival_s
    return {"requests": len(requests), "arrival_span_s": span,
            "offered_rate_per_s": (len(requests) - 1) / span if span > 0 else float("inf"),
            "prompt_mean": float(np.mean([r.prompt_len for r in requests])), "output_mean": float(np.mean(outs)),
            "output_max": int(max(outs)), "tokens_asked": int(sum(outs))}
