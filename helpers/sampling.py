"""Token selection for ``sample()``: transformers' own logits warpers, then one draw.

Greedy is ``top_k=1`` (argmax, as transformers-neuronx users write it); otherwise
temperature -> top-k -> top-p (the order of transformers' generate) and a multinomial draw
from an optional ``torch.Generator`` for reproducible runs.
"""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


def validate_sampling_args(top_k, top_p, temperature) -> None:
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k={top_k!r}: must be an int >= 1 (top_k=1 is greedy)")
    if not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"top_p={top_p!r}: must be in (0, 1]")
    if not float(temperature) > 0.0:
        raise ValueError(f"temperature={temperature!r}: must be > 0 (use top_k=1 for greedy)")


def warpers(top_k: int, top_p: float, temperature: float) -> LogitsProcessorList:
    procs = LogitsProcessorList()
    if float(temperature) != 1.0:
        procs.append(TemperatureLogitsWarper(float(temperature)))
    if top_k > 0:
        procs.append(TopKLogitsWarper(top_k))
    if float(top_p) < 1.0:
        procs.append(TopPLogitsWarper(float(top_p)))
    return procs


def probabilities(logits: torch.Tensor, top_k: int, top_p: float, temperature: float) -> torch.Tensor:
    """The distribution ``select_next_tokens`` draws from, [B, V] (used by speculative sampling too)."""
    scores = warpers(top_k, top_p, temperature)(None, logits.float())
    return torch.softmax(scores, dim=-1)


def select_next_tokens(logits: torch.Tensor, top_k: int, top_p: float, temperature: float,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    if top_k == 1:
        return logits.argmax(dim=-1)
    probs = probabilities(logits, top_k, top_p, temperature)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)
