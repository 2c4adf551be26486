"""Accuracy measurements on a built engine: perplexity on a fixed text and greedy agreement.

Both run the model's own weights and linear (so int8 storage, bf16, ... are what is measured) over a
whole token sequence at once: one causal forward that returns the logits of every position.
"""
from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import torch

from ..engine.generation import CausalLM
from ..engine.model import build_mask

EVAL_TEXT = Path(__file__).parent.parent / "data" / "eval_text.txt"


def eval_text() -> str:
    """The fixed text shipped in the repo for perplexity (public-domain prose)."""
    return EVAL_TEXT.read_text()


@torch.inference_mode()
def sequence_logits(model: CausalLM, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits [T, vocab] of every position of one sequence [1, T] (T <= n_positions), f32."""
    m = model.require_built()
    ids = torch.as_tensor(input_ids).reshape(1, -1).to(model.device)
    T = ids.shape[1]
    if T > model.n_positions:
        raise ValueError(f"{T} tokens exceed n_positions={model.n_positions}: split the sequence")
    slots = torch.arange(T, device=model.device)
    mask = build_mask(slots, torch.zeros(1, dtype=torch.long, device=model.device), T, model.args.sliding_window)
    return m.forward(ids, slots[None], slots, T, mask, logit_idx=slots[None])[0]


def perplexity(model: CausalLM, input_ids: torch.Tensor, window: int | None = None) -> float:
    """exp(mean negative log-likelihood) over non-overlapping windows of ``window`` tokens."""
    ids = torch.as_tensor(input_ids).reshape(-1)
    window = window or model.n_positions
    nll, n = 0.0, 0
    for s in range(0, ids.numel() - 1, window):
        chunk = ids[s:s + window]
        if chunk.numel() < 2:
            break
        logp = torch.log_softmax(sequence_logits(model, chunk), dim=-1)[:-1]
        nll -= logp.gather(1, chunk[1:, None].to(logp.device)).sum().item()
        n += chunk.numel() - 1
    return math.exp(nll / n)


def teacher_forced_agreement(model: CausalLM, sequences: list[torch.Tensor], prompt_lens: list[int]) -> float:
    """Fraction of positions where ``model``'s argmax equals the next token of ``sequences`` (each a
    reference model's greedy continuation of its prompt): the greedy acceptance rate of ``model`` as a
    draft for that reference, independent of where free-running outputs first diverge."""
    hits, total = 0, 0
    for seq, L in zip(sequences, prompt_lens):
        seq = torch.as_tensor(seq).reshape(-1)
        pred = sequence_logits(model, seq[:-1]).argmax(-1)[L - 1:].cpu()
        hits += int((pred == seq[L:]).sum())
        total += seq.numel() - L
    return hits / total


def sampled_agreement(model, sequences: list[torch.Tensor], prompt_lens: list[int]) -> float:
    """:func:`teacher_forced_agreement` through ``sample()`` alone, for models that return no logits (the Neuron
    libraries): for every position, one greedy token from the reference sequence's prefix. One ``sample()`` call
    per compared token."""
    hits, total = 0, 0
    for seq, L in zip(sequences, prompt_lens):
        seq = torch.as_tensor(seq).reshape(1, -1)
        for i in range(L, seq.shape[1]):
            out = model.sample(seq[:, :i], i + 1, top_k=1, eos_token_override=[])
            hits += int(out[0, i] == seq[0, i])
            total += 1
    return hits / total


def decode_tokens_per_s(model, input_ids: torch.Tensor, new_tokens: int, repeats: int = 1) -> float:
    """Greedy decode speed, new tokens / s after the first (prompt encoding excluded); best of ``repeats``.
    A model that times no single token (NxD Inference's adapter: ``stats['ttft_s']`` is None) is timed by whole
    generations, of ``new_tokens`` and of 1 token (the faster of two: load on a shared host only slows a run):
    the difference is the decode of the other tokens."""
    ids = torch.as_tensor(input_ids).reshape(1, -1)
    if new_tokens < 2:
        raise ValueError("new_tokens must be >= 2: decode speed is measured after the first token")
    best = 0.0
    for _ in range(repeats):
        model.sample(ids, ids.shape[1] + new_tokens, top_k=1, eos_token_override=[])
        t = model.stats["token_times_s"]
        if model.stats.get("ttft_s") is not None:
            best = max(best, (len(t) - 1) / (t[-1] - t[0]))
            continue
        total, first = model.stats["total_s"], []
        for _ in range(2):
            model.sample(ids, ids.shape[1] + 1, top_k=1, eos_token_override=[])
            first.append(model.stats["total_s"])
        if total <= min(first):
            raise RuntimeError(f"{new_tokens} tokens took no longer than 1 ({total:.4f} s against {min(first):.4f} s): "
                               "timing noise exceeds the decode time, raise new_tokens")
        best = max(best, (new_tokens - 1) / (total - min(first)))
    return best


def interleaved_decode_seconds(models: dict, input_ids: torch.Tensor, new_tokens: int, repeats: int = 5) -> dict:
    """``name -> [seconds per decoded token, one per repeat]`` for every model of ``models``: after one warm-up
    each, the models run a greedy generation of ``new_tokens`` in turn, ``repeats`` rounds, so that load on a
    shared machine hits them alike. A round's figure is the median interval between consecutive tokens where the
    model times each token (a stall of the machine during one step does not move it), else the decode time of the
    whole generation per token (:func:`decode_tokens_per_s`). Feed two lists to
    :func:`helpers.notebook.figures.compare`."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: must be >= 1")
    ids = torch.as_tensor(input_ids).reshape(1, -1)

    def per_token(model) -> float:
        rate = decode_tokens_per_s(model, ids, new_tokens)
        t = model.stats.get("token_times_s") or []
        if model.stats.get("ttft_s") is None or len(t) < 3:
            return 1 / rate
        return statistics.median(b - a for a, b in zip(t, t[1:]))

    for model in models.values():
        per_token(model)
    out = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            out[name].append(per_token(model))
    return out


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def describe_difference(expected: torch.Tensor, got: torch.Tensor, expected_logits: torch.Tensor | None = None,
                        got_logits: torch.Tensor | None = None) -> str:
    """What differs between two generations (token ids [batch, T], optionally their logits): the shapes, or the
    first differing (row, position) with both tokens and how many differ, and the largest logit difference and
    where. For assertion messages that claim bit-equality."""
    parts = []
    if expected.shape != got.shape:
        parts.append(f"token shapes {tuple(expected.shape)} vs {tuple(got.shape)}")
    else:
        bad = (expected != got).nonzero()
        if len(bad):
            r, t = bad[0].tolist()
            parts.append(f"{len(bad)} token(s) differ, the first at row {r}, position {t}: "
                         f"{int(expected[r, t])} expected, {int(got[r, t])} got")
        else:
            parts.append("tokens identical")
    if expected_logits is not None and got_logits is not None:
        if expected_logits.shape != got_logits.shape:
            parts.append(f"logit shapes {tuple(expected_logits.shape)} vs {tuple(got_logits.shape)}")
        else:
            d = (expected_logits.float() - got_logits.float()).abs()
            if d.max() > 0:
                where = tuple(int(i) for i in torch.unravel_index(d.argmax(), d.shape))
                parts.append(f"logits differ at {int((d > 0).sum())} of {d.numel()} entries, max |diff| "
                             f"{d.max().item():.3e} at index {where}")
            else:
                parts.append("logits bit-identical")
    return "; ".join(parts)
