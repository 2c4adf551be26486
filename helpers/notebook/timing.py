"""What one forward costs, by the rows it carries: the figures behind the speculative cost model (notebook 05)
and the benchmark's step table (``ci/benchmark.py``), measured one way for both.

A step over several rows is either decode at batch ``b`` (a model built with ``batch_size=b``, one token
per sequence) or the verification of ``k + 1`` tokens of one sequence (a model with the speculative graph,
``enable_speculative_decoder``). Either reads every weight once, so on Neuron, and with the CPU kernels of
``helpers.engine.cpu.kernels``, it should cost little more than a one-row step.

It times the engine's own fixed-shape step (``CausalLM.step``), with no sampling loop around it.
"""
from __future__ import annotations

import statistics
import time

import torch

from ..engine.generation import CausalLM


def step_seconds(cases: dict, position: int = 128, repeats: int = 7, seed: int = 0) -> dict[str, dict]:
    """Seconds of one forward for each ``label -> (model, tokens)`` case: ``tokens`` 1 is a decode step at the
    model's batch size, ``tokens`` > 1 a verification of that many tokens per sequence (the model needs its
    speculative graph; a graph compiled ahead of time takes exactly ``speculation_length + 1``). Every step
    writes at cache slots ``position``.. after a prompt of ``position`` tokens, so it attends over the token
    bucket that holds them. After one warm-up round the cases alternate within each of ``repeats`` rounds
    (load on a shared machine hits them alike). Returns ``label -> {"median", "min", "max", "n"}`` in seconds."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: must be >= 1")
    g = torch.Generator().manual_seed(seed)
    runs = {}
    for label, (model, tokens) in cases.items():
        if not isinstance(model, CausalLM):
            raise TypeError(f"{label}: step_seconds times the reference engine's steps, got {type(model).__name__}")
        if tokens > 1 and not model.speculation_length:
            raise ValueError(f"{label}: {tokens} tokens per step need the speculative graph: build the model with "
                             "enable_speculative_decoder(k) (helpers.build_model(..., speculation_length=k))")
        if tokens > 1 and model.neuron_config.compiled and tokens != model.speculation_length + 1:
            raise ValueError(f"{label}: the compiled speculative graph takes {model.speculation_length + 1} tokens, "
                             f"not {tokens}: time it with tokens={model.speculation_length + 1} or build eager")
        if position + tokens > model.n_positions:
            raise ValueError(f"{label}: slots {position}..{position + tokens - 1} exceed n_positions={model.n_positions}")
        model.require_built()
        ids = torch.randint(10, 1000, (model.batch_size, tokens), generator=g).to(model.device)
        start = torch.zeros(model.batch_size, dtype=torch.long, device=model.device)
        runs[label] = (model, ids, start, "token" if tokens == 1 else "speculative")
    times = {label: [] for label in runs}
    with torch.inference_mode():
        for r in range(repeats + 1):
            for label, (model, ids, start, kind) in runs.items():
                t0 = time.perf_counter()
                model.step(ids, start, position, kind)
                model.sync()
                if r:
                    times[label].append(time.perf_counter() - t0)
    return {label: {"median": statistics.median(ts), "min": min(ts), "max": max(ts), "n": len(ts)}
            for label, ts in times.items()}


def verify_costs(target, ks, position: int = 16, repeats: int = 5) -> dict[int, float]:
    """``k -> `` seconds of one verification of ``k + 1`` tokens over one decode step of the same target, for
    every ``k`` of ``ks`` in one alternating measurement (:func:`step_seconds`): the cost ratio of the
    speculative model (``expected_speedup``'s ``verify_ratio``). ``target`` needs the speculative graph."""
    t = step_seconds({0: (target, 1), **{int(k): (target, int(k) + 1) for k in ks}}, position, repeats)
    return {k: t[k]["median"] / t[0]["median"] for k in t if k}


def draft_cost_ratio(draft, target, position: int = 16, repeats: int = 5) -> float:
    """Seconds of one draft decode step over one target decode step, timed alternately (:func:`step_seconds`)."""
    t = step_seconds({"draft": (draft, 1), "target": (target, 1)}, position, repeats)
    return t["draft"]["median"] / t["target"]["median"]
