"""Replay sampled traffic through the engine: static batching against continuous batching.

**The clock.** Time is the wall time of the real engine calls (``time.perf_counter`` around each prefill,
decode step or ``sample()``, after a device sync), added up on one serving clock that starts at the first
arrival; the arrivals are on the same clock. When the server is idle (no request running or waiting) the clock
jumps to the next arrival instead of sleeping, so a replay takes the time of its computation, and every
figure is what a single-server loop on this machine would have seen. Python overhead of the scheduler itself
(microseconds per step) is not counted.

**Static batching** (``run_static``): wait until ``batch_size`` requests are waiting, or no more will arrive, or
(with ``max_wait_s``, the batch timeout of real static servers, e.g. Triton's ``max_queue_delay_microseconds``)
the oldest waiting request has waited ``max_wait_s`` on an idle server; run them as one fixed batch with
``sample()`` to the longest requested output (rows left-padded to the longest prompt; a short batch padded to
``batch_size`` rows), return every result when the batch ends; the next batch starts after.

**Continuous batching** (``run_continuous``): a ``SlotModel`` with n slots. Before every decode step, waiting
requests enter free slots (context encoding of that slot only, its first token sampled); then one decode step
runs over all slots; a request that has its tokens leaves at once and frees its slot for the next step. This is
the loop NxD Inference's continuous batching is driven with (vLLM on Neuron, DJL LMI's rolling batch).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from ..engine.generation import CausalLM
from .slots import SlotModel
from .traffic import Request


@dataclass
class Served:
    """One request as served: times on the serving clock (seconds), the slot or batch row it used, its tokens."""
    rid: int
    arrival_s: float
    slot: int
    admitted_s: float = 0.0     # its context encoding starts (static: its batch starts)
    first_token_s: float = 0.0  # its first token exists
    finished_s: float = 0.0     # its result is returned (continuous: its last token; static: its batch ends)
    last_token_s: float | None = None  # its last token exists (static: before its batch ends); None: finished_s
    tokens: list[int] = field(default_factory=list)

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def latency_s(self) -> float:
        return self.finished_s - self.arrival_s


@dataclass
class RunResult:
    policy: str      # "static" | "continuous"
    n_slots: int     # batch size (static) or KV-cache slots (continuous)
    served: list[Served]
    busy_s: float    # clock time spent in engine calls
    steps: int       # engine calls: prefills + decode steps (continuous), sample() calls (static)

    @property
    def name(self) -> str:
        return f"{self.policy} {self.n_slots}"

    def summary(self) -> dict:
        """Throughput (generated tokens per second of clock from the first arrival to the last result), TTFT,
        latency and the wait for admission (seconds) as median and maximum over the ``n`` requests, and how busy
        the engine was. No p99: it needs far more than a replay's few dozen requests (of 24, it is the maximum)."""
        start = min(s.arrival_s for s in self.served)
        span = max(s.finished_s for s in self.served) - start
        ttft = [s.ttft_s for s in self.served]
        lat = [s.latency_s for s in self.served]
        wait = [s.admitted_s - s.arrival_s for s in self.served]
        tokens = sum(len(s.tokens) for s in self.served)
        return {"policy": self.policy, "slots": self.n_slots, "n": len(self.served), "tokens": tokens,
                "span_s": span, "throughput_tok_s": tokens / span,
                "ttft_median_s": float(np.median(ttft)), "ttft_max_s": float(max(ttft)),
                "latency_median_s": float(np.median(lat)), "latency_max_s": float(max(lat)),
                "wait_median_s": float(np.median(wait)), "wait_max_s": float(max(wait)),
                "busy_fraction": self.busy_s / span, "engine_calls": self.steps}

    def outputs(self) -> dict[int, list[int]]:
        return {s.rid: s.tokens for s in self.served}


class ServingClock:
    """Seconds on the serving clock: advanced by the measured wall time of engine calls, or moved to an arrival."""

    def __init__(self, sync=None):
        self.now, self.busy, self.calls, self._sync = 0.0, 0.0, 0, sync

    def run(self, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        if self._sync is not None:
            self._sync()
        dt = time.perf_counter() - t0
        self.now += dt
        self.busy += dt
        self.calls += 1
        return out

    def idle_until(self, t: float) -> None:
        self.now = max(self.now, t)


def check_fits(model: CausalLM, requests: list[Request]) -> None:
    """Refuse traffic the model cannot hold, before any work: every prompt + output within n_positions and every
    prompt within the largest context bucket."""
    bad = [r.rid for r in requests if r.prompt_len + r.max_new_tokens > model.n_positions
           or r.prompt_len > model.context_buckets[-1]]
    if bad:
        raise ValueError(f"requests {bad[:5]}{'...' if len(bad) > 5 else ''} do not fit: prompt + output must be <= "
                         f"n_positions={model.n_positions} and the prompt <= the largest context bucket "
                         f"{model.context_buckets[-1]}; lower the lengths in the parameters or raise n_positions")


class Arrivals:
    """The requests not arrived yet (``pending``) and arrived but not admitted (``waiting``), with the serving clock
    (which starts at the first arrival)."""

    def __init__(self, model: CausalLM, requests: list[Request]):
        check_fits(model, requests)
        self.clock = ServingClock(model.sync)
        self.pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.rid)))
        self.waiting: deque[Request] = deque()
        self.t0 = self.pending[0].arrival_s

    def arrive(self) -> None:
        """Move every request that has arrived by now into ``waiting``."""
        while self.pending and self.pending[0].arrival_s - self.t0 <= self.clock.now:
            self.waiting.append(self.pending.popleft())

    def idle_until_next(self) -> None:
        self.clock.idle_until(self.pending[0].arrival_s - self.t0)

    def served(self, req: Request, slot: int, **times) -> Served:
        return Served(req.rid, req.arrival_s - self.t0, slot, **times)


def run_continuous(model: SlotModel, requests: list[Request]) -> RunResult:
    """Continuous batching over ``model.n_slots`` slots (greedy); see the module docstring."""
    q = Arrivals(model, requests)
    clock, pending, waiting = q.clock, q.pending, q.waiting
    n = model.n_slots
    live: dict[int, tuple[Request, Served]] = {}
    free = list(range(n))
    done: list[Served] = []
    tokens = torch.zeros(n, dtype=torch.long)
    positions = torch.zeros(n, dtype=torch.long)

    def finish(slot):
        req, s = live.pop(slot)
        s.finished_s = clock.now
        done.append(s)
        free.append(slot)
        free.sort()
        tokens[slot], positions[slot] = 0, 0  # a free row computes on position 0 of its own row; ignored

    while pending or waiting or live:
        q.arrive()
        if not live and not waiting:
            q.idle_until_next()
            continue
        while free and waiting:  # admit: one context encoding per request, into its own slot
            req, slot = waiting.popleft(), free.pop(0)
            s = q.served(req, slot, admitted_s=clock.now)
            logits = clock.run(model.prefill, slot, req.prompt)
            s.first_token_s = clock.now
            s.tokens.append(int(logits.argmax()))
            live[slot] = (req, s)
            tokens[slot], positions[slot] = s.tokens[-1], req.prompt_len
            if req.max_new_tokens == 1:
                finish(slot)
        if not live:
            continue
        logits = clock.run(model.decode, tokens, positions)
        nxt = logits.argmax(-1).cpu()
        for slot in sorted(live):
            req, s = live[slot]
            s.tokens.append(int(nxt[slot]))
            tokens[slot], positions[slot] = nxt[slot], positions[slot] + 1
            if len(s.tokens) == req.max_new_tokens:
                finish(slot)
    return RunResult("continuous", n, sorted(done, key=lambda s: s.rid), clock.busy, clock.calls)


def run_static(model: CausalLM, requests: list[Request], max_wait_s: float | None = None) -> RunResult:
    """Static batching with ``model.batch_size`` rows (greedy); see the module docstring. ``max_wait_s``: the batch
    timeout (None: wait for a full batch, however long); a busy server starts the next batch when it is free."""
    if max_wait_s is not None and not float(max_wait_s) >= 0:
        raise ValueError(f"max_wait_s={max_wait_s}: seconds >= 0, or None for no timeout")
    q = Arrivals(model, requests)
    clock, pending, waiting = q.clock, q.pending, q.waiting
    B = model.batch_size
    done: list[Served] = []
    while pending or waiting:
        q.arrive()
        if len(waiting) < B and pending:  # wait for a full batch, or until the oldest has waited max_wait_s
            next_arrival = pending[0].arrival_s - q.t0
            deadline = None if max_wait_s is None or not waiting else waiting[0].arrival_s - q.t0 + float(max_wait_s)
            if deadline is None or next_arrival <= deadline:
                q.idle_until_next()
                continue
            clock.idle_until(deadline)  # the timeout: run the requests that are there
        batch = [waiting.popleft() for _ in range(min(B, len(waiting)))]
        ids, mask = left_padded(batch, B)
        L = ids.shape[1]
        start = clock.now
        out = clock.run(model.sample, ids, L + max(r.max_new_tokens for r in batch), top_k=1, eos_token_override=[],
                        attention_mask=mask)
        times = model.stats["token_times_s"]  # since the start of sample(): token k of every row at times[k]
        for row, r in enumerate(batch):
            done.append(q.served(r, row, admitted_s=start, first_token_s=start + times[0], finished_s=clock.now,
                                 last_token_s=start + times[r.max_new_tokens - 1],
                                 tokens=out[row, L:L + r.max_new_tokens].tolist()))
    return RunResult("static", B, sorted(done, key=lambda s: s.rid), clock.busy, clock.calls)


def left_padded(batch: list[Request], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's prompts left-padded to the longest, with their attention mask; a short last batch is filled up
    to ``rows`` by repeating its first request (a Neuron graph has a fixed batch)."""
    L = max(r.prompt_len for r in batch)
    ids = torch.zeros(rows, L, dtype=torch.long)
    mask = torch.zeros(rows, L, dtype=torch.long)
    for row in range(rows):
        p = batch[row if row < len(batch) else 0].prompt
        ids[row, L - p.numel():], mask[row, L - p.numel():] = p, 1
    return ids, mask


def run_alone(model: CausalLM, requests: list[Request]) -> dict[int, list[int]]:
    """The oracle: each request by itself through ``sample()`` of a batch-1 model (greedy, no EOS stop)."""
    if model.batch_size != 1:
        raise ValueError(f"run_alone needs a batch_size=1 model, got batch_size={model.batch_size}")
    out = {}
    for r in requests:
        seq = model.sample(r.prompt[None], r.prompt_len + r.max_new_tokens, top_k=1, eos_token_override=[])
        out[r.rid] = seq[0, r.prompt_len:].tolist()
    return out


def mismatches(outputs: dict[int, list[int]], oracle: dict[int, list[int]]) -> list[int]:
    """Request ids whose tokens differ from the oracle's (or are missing)."""
    return sorted(rid for rid in oracle if outputs.get(rid) != oracle[rid])


def timeline(result: RunResult) -> list[tuple[int, int, float, float, float]]:
    """(slot, rid, admitted_s, first_token_s, finished_s) per request: what the slot plot draws."""
    return [(s.slot, s.rid, s.admitted_s, s.first_token_s, s.finished_s) for s in result.served]
