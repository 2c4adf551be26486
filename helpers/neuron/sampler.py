"""``NeuronSampler``: ``sample()`` with the reference engine's signature over either stack's model, and the
adapters it needs (padding moved for NxD Inference, streamers and stopping criteria per row, a greedy
acceptor for transformers-neuronx's speculation). The Neuron SDK is imported inside the functions that need it.
"""
from __future__ import annotations

import contextlib
import time

import torch
from transformers import GenerationConfig, StoppingCriteriaList

from ..engine.sampling import (eos_list, resolve_eos, resolve_pad, start_ids_from_mask, validate_input_ids,
                               validate_sampling_args)
from .tracking import TokenRecorder, TrackedCriteria
from ..planning.buckets import tnx_token_buckets
from .settings import NeuronSettings


def left_to_right_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_token_id: int):
    """Move each row's left padding to the right (NxD Inference's padding_side='right'); same width."""
    ids, mask = torch.full_like(input_ids, pad_token_id), torch.zeros_like(attention_mask)
    for r, n_pad in enumerate(start_ids_from_mask(attention_mask).tolist()):
        n = input_ids.shape[1] - n_pad
        ids[r, :n], mask[r, :n] = input_ids[r, n_pad:], 1
    return ids, mask


class _BlockStreamer:
    """transformers-neuronx's SpeculativeGenerator puts the prompt, then the first token [B, 1], then each step's
    accepted tokens as a zero-padded [B, k] block (speculation.py), the last one possibly past
    ``sequence_length`` (the returned ids are cut there). Hand the wrapped streamer one [B, 1] token at a time,
    at most ``limit`` of them, as every other path does. (The library counts accepted tokens with
    count_nonzero, so it itself cannot tell a padding 0 from token id 0.)"""

    def __init__(self, inner, limit: int):
        self.inner, self.limit, self.prompt_seen = inner, limit, False

    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        value = torch.as_tensor(value)
        for j in range(int(torch.count_nonzero(value, dim=1).max())):
            if self.limit <= 0:
                return
            self.limit -= 1
            self.inner.put(value[:, j:j + 1])

    def end(self):
        self.inner.end()


def greedy_token_acceptor():
    """A transformers-neuronx ``TokenAcceptor`` for greedy speculation: keep the draft tokens while they equal
    the target's argmax, then the target's own argmax (the 0.13 release ships only sampling acceptors)."""
    from transformers_neuronx.speculation import TokenAcceptor

    class GreedyTokenAcceptor(TokenAcceptor):
        def __call__(self, draft_ids, draft_scores, target_scores):
            # draft_ids [B, k-1], target_scores [B, k, vocab] -> accepted [B, k], zero-padded
            target_ids = target_scores.argmax(dim=-1)
            agree = (draft_ids == target_ids[:, :-1]).long().cumprod(dim=1).sum(dim=1)
            keep = torch.arange(target_ids.shape[1])[None] <= agree[:, None]
            return torch.where(keep, target_ids, torch.zeros_like(target_ids))

    return GreedyTokenAcceptor()


@contextlib.contextmanager
def _model_eos(adapter, eos: list[int]):
    """Switch EOS off for real on NxD Inference: transformers 4.57 ``generate`` fills a GenerationConfig's
    ``eos_token_id=None`` back in from the model's own generation config (``_prepare_generation_config``), so
    the adapter's config must say None too while this call runs."""
    if eos:
        yield
        return
    saved = adapter.generation_config.eos_token_id
    adapter.generation_config.eos_token_id = None
    try:
        yield
    finally:
        adapter.generation_config.eos_token_id = saved


class NeuronSampler:
    """``sample()`` with the reference engine's signature over either stack's model."""

    def __init__(self, stack: str, model, hf_config: dict, settings: NeuronSettings, draft=None):
        self.stack, self.model, self.draft, self.settings = stack, model, draft, settings
        self.hf_config = hf_config
        self.batch_size = (settings.model_kwargs.get("batch_size") or settings.neuron_config["batch_size"])
        self.stats: dict = {}
        self.eos_ids = eos_list(hf_config.get("eos_token_id"))

    def sample(self, input_ids, sequence_length: int, start_ids=None, top_k: int = 50, top_p: float = 1.0,
               temperature: float = 1.0, streamer=None, stopping_criteria_list=None, eos_token_override=None,
               attention_mask=None, generator: torch.Generator | None = None, pad_token_id: int | None = None,
               output_logits: bool = False):
        """Prompt + generated ids [B, <= sequence_length]. Greedy is ``top_k=1``.

        As the reference engine: rows that finish (EOS, or a stopping criterion flagging the row) are
        padded with ``pad_token_id``; ``stats['row_new_tokens']`` counts each row's tokens up to and
        including its stop. ``generator``: both libraries sample with the global torch RNG on the host,
        so it is seeded with ``generator.initial_seed()``. On NxD Inference the streamer receives every
        token only after ``generate`` returns (its adapter drives no per-token streamer:
        utils/hf_adapter.py ``_sample``), so ``stats['ttft_s']`` is None there.
        """
        if output_logits:
            raise ValueError("output_logits is a reference-engine option: the Neuron sample loops do not return "
                             "logits (use the reference backend to inspect them)")
        validate_sampling_args(top_k, top_p, temperature)
        input_ids = validate_input_ids(input_ids, int(self.hf_config["vocab_size"]))
        B, L = input_ids.shape
        if B != self.batch_size:
            raise ValueError(f"The model was compiled for batch_size={self.batch_size}, got {B} rows")
        self._check_lengths(L, int(sequence_length))
        if self.draft is not None and int(top_k) != 1:
            raise ValueError(f"top_k={top_k} with a draft model: speculative decoding here is greedy only (top_k=1). "
                             + ("transformers-neuronx's SpeculativeGenerator picks the first token greedily "
                                "(speculation.py: select_tokens(target_scores), 'TODO add generation args')"
                                if self.stack == "tnx" else
                                "NxD Inference's assisted decoding takes the argmax of draft and target "
                                "(utils/hf_adapter.py _standard_assisted_decoding) whatever do_sample says"))
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
            if start_ids is not None:
                attention_mask = (torch.arange(L)[None] >= torch.as_tensor(start_ids).reshape(-1, 1)).long()
        if generator is not None:
            torch.manual_seed(generator.initial_seed())
        eos = resolve_eos(self.eos_ids, eos_token_override)
        pad = resolve_pad(pad_token_id, self.hf_config.get("pad_token_id"), eos)
        t0 = time.perf_counter()
        run = self._sample_tnx if self.stack == "tnx" else self._sample_nxdi
        seq, tracker, stops = run(input_ids, sequence_length, attention_mask, top_k, top_p, temperature, streamer,
                                  stopping_criteria_list, eos, pad, t0)
        total = time.perf_counter() - t0
        seq, row_new = finish_rows(seq, L, eos, stops.stop_at if stops else [None] * B, pad)
        # Once every row has stopped, the plain loops end (tnx sample, Hugging Face generate); the speculative ones
        # run on: tnx's SpeculativeGenerator.sample returns tokens[:, :sequence_length] past an EOS
        # (speculation.py), and NxDI's assisted loop checks EOS on the last accepted token only. Cut the columns
        # after the last row's stop, so both give what the plain loop gives.
        seq = seq[:, :L + max(row_new)]
        self.stats = {"prompt_len": L, "new_tokens": seq.shape[1] - L, "row_new_tokens": row_new,
                      "ttft_s": tracker.times[0] if tracker.times else None,
                      "token_times_s": list(tracker.times), "total_s": total, "pad_token_id": pad}
        return seq

    def _check_lengths(self, prompt_len: int, sequence_length: int) -> None:
        """Refuse, before the library runs, lengths the compiled graphs cannot take."""
        if self.stack == "tnx":
            positions = max(tnx_token_buckets(self.settings.model_kwargs["n_positions"]))
        else:
            positions = self.settings.neuron_config["seq_len"]
        k = self.settings.tokens_per_verification if self.draft is not None else 0
        if prompt_len >= sequence_length:
            raise ValueError(f"The prompt has {prompt_len} tokens and sequence_length={sequence_length} leaves no "
                             "room to generate: sequence_length counts prompt + new tokens")
        if sequence_length + k > positions:
            extra = (f" + {k} positions the last verification may write past the end"
                     if k else "")
            raise ValueError(f"sequence_length={sequence_length}{extra} exceeds the compiled {positions} positions: "
                             "lower sequence_length or rebuild with a larger n_positions")
        if self.stack == "nxdi":
            largest = self.settings.neuron_config["max_context_length"]
            if prompt_len > largest:
                raise ValueError(
                    f"The prompt has {prompt_len} tokens but the largest NxD Inference context bucket is {largest}: "
                    f"NxD Inference would raise 'Input len {prompt_len} exceeds largest bucket ({largest})' "
                    "(transformers-neuronx instead encodes the rest token by token). Raise context_length_estimate "
                    f"(its largest bucket) to at least {prompt_len}, or shorten the prompt")

    def _sample_tnx(self, input_ids, sequence_length, attention_mask, top_k, top_p, temperature, streamer,
                    criteria, eos, pad, t0):
        tracker = TokenRecorder(streamer, start=t0)  # the user's streamer behind it: each put and its time
        start_ids = start_ids_from_mask(attention_mask)
        if self.draft is not None:
            return self._speculate_tnx(input_ids, sequence_length, attention_mask, criteria, eos, pad, tracker)
        kwargs = dict(start_ids=start_ids, top_k=int(top_k), top_p=float(top_p),
                      temperature=float(temperature),  # an int temperature raises in sampling.py
                      streamer=tracker)
        if self.eos_ids != eos:
            kwargs["eos_token_override"] = eos if eos else -1  # -1: no EOS stop (never sampled)
        stops = None
        if criteria is not None:
            # transformers-neuronx calls stopping_criteria_list(input_ids, probs) with the *prompt* and breaks when
            # the result is truthy (sampling.py sample_loop_llama; aws-neuron/transformers-neuronx#75): the
            # criteria see prompt + the tokens generated so far, and the loop stops when every row is done
            stops = kwargs["stopping_criteria_list"] = TrackedCriteria(criteria, tracker, input_ids, as_bool=True)
        return self.model.sample(input_ids, sequence_length, **kwargs), tracker, stops

    def _speculate_tnx(self, input_ids, sequence_length, attention_mask, criteria, eos, pad, tracker):
        """Greedy speculative decoding with transformers-neuronx's SpeculativeGenerator (speculation.py).

        Its default acceptor (DefaultTokenAcceptor) is the rejection-sampling rule at temperature 1 over the
        whole vocabulary: a greedy request would come back sampled. So a greedy acceptor is passed (the
        library's TokenAcceptor interface). Batch 1 only (refused earlier); a left-padded row is passed
        without its padding, and the padding is put back in front of the result."""
        from transformers_neuronx.speculation import SpeculativeGenerator

        if criteria is not None:
            raise ValueError("stopping criteria are not part of transformers-neuronx's speculative loop "
                             "(SpeculativeGenerator.sample has no stopping_criteria_list): drop them, or drop the draft")
        n_pad = int(start_ids_from_mask(attention_mask)[0])
        gen = SpeculativeGenerator(self.draft, self.model, k=self.settings.tokens_per_verification,
                                   acceptor=greedy_token_acceptor())
        blocks = _BlockStreamer(tracker, sequence_length - input_ids.shape[1])
        seq = gen.sample(input_ids[:, n_pad:], sequence_length - n_pad, eos_token_id=eos[0] if eos else None,
                         pad_token_id=pad, streamer=blocks)
        return torch.cat([input_ids[:, :n_pad], seq], dim=1), tracker, None

    def _sample_nxdi(self, input_ids, sequence_length, attention_mask, top_k, top_p, temperature, streamer,
                     criteria, eos, pad, t0):
        ids, mask = left_to_right_padding(input_ids, attention_mask, pad)
        max_length = sequence_length
        sampled = int(top_k) != 1 and self.draft is None
        if sampled and (float(temperature) != 1.0 or float(top_p) != 1.0):
            raise ValueError(f"temperature={temperature}, top_p={top_p} on NxD Inference: its generate applies them "
                             "twice (Hugging Face's logits warpers, then its own Sampler with the same values: "
                             "utils/hf_adapter.py _sample), so the distribution would not be the one asked for. "
                             "Sample with top_k only (temperature=1.0, top_p=1.0), or use neuron_stack='tnx'")
        if self.draft is not None:
            if not eos:
                raise ValueError("EOS cannot be switched off for NxD Inference speculation: its assisted decoding "
                                 "compares every token with eos_token_id (utils/hf_adapter.py "
                                 "_standard_assisted_decoding); drop eos_token_override=[] or the draft")
            if criteria is not None:
                raise ValueError("stopping criteria are never called by NxD Inference's assisted decoding "
                                 "(utils/hf_adapter.py _standard_assisted_decoding): drop them, or drop the draft")
            # The assisted loop stops once fewer than speculation_length positions remain (hf_adapter.py: "If
            # the rest length is smaller than speculation length ... break"): ask for k - 1 more (checked to fit
            # by _check_lengths) and cut back to sequence_length.
            max_length = sequence_length + self.settings.tokens_per_verification - 1
        gen_cfg = GenerationConfig(do_sample=sampled, eos_token_id=eos or None, pad_token_id=pad,
                                   **({"top_k": int(top_k)} if sampled else {}))
        # max_length as a generate() keyword: inside a GenerationConfig, transformers takes max_length=20 (its
        # default) for "not set" and adds the prompt length to it
        kwargs = {"attention_mask": mask, "generation_config": gen_cfg, "max_length": max_length}
        stops = None
        if criteria is not None:
            # NxDI calls each criterion as criterion(ids_so_far, None): no scores (hf_adapter.py _sample).
            stops = TrackedCriteria(criteria, None, ids)
            kwargs["stopping_criteria"] = StoppingCriteriaList([stops])
        if self.draft is not None:
            # Unfused speculation as utils/accuracy.py does it: the draft proposes as many tokens as the target
            # verifies (hf_adapter.py checks candidate_length - 1 of them), and starts each call from a reset cache
            # (generate() resets only the target).
            self.draft.generation_config.update(num_assistant_tokens=self.settings.tokens_per_verification)
            self.draft.neuron_model.reset()
            kwargs["assistant_model"] = self.draft
        # The adapter builds its host Sampler on the first call and keeps it, greedy or sampling, for every later
        # call (hf_adapter.py _sample: "if self.sampler is None"): make each call build its own.
        self.model.sampler = None
        with _model_eos(self.model, eos):
            out = self.model.generate(ids, **kwargs)
        new = out[:, ids.shape[1]:sequence_length]
        tracker = TokenRecorder(streamer, start=t0)
        for j in range(new.shape[1]):  # emitted only now: NxDI drives no per-token streamer
            tracker.put(new[:, j:j + 1])
        tracker.end()
        tracker.times = []
        return torch.cat([input_ids, new], dim=1), tracker, stops


def finish_rows(seq: torch.Tensor, prompt_len: int, eos: list[int], stop_at: list, pad: int):
    """Per row: new tokens up to and including its first EOS or the step a criterion fired; the rest
    become ``pad`` (transformers-neuronx keeps sampling finished rows until all are done)."""
    gen = seq[:, prompt_len:].clone()
    counts = []
    for r in range(gen.shape[0]):
        n = gen.shape[1]
        hits = torch.isin(gen[r], torch.tensor(eos, dtype=gen.dtype)).nonzero() if eos else []
        if len(hits):
            n = min(n, int(hits[0]) + 1)
        if stop_at[r] is not None:
            n = min(n, int(stop_at[r]))
        gen[r, n:] = pad
        counts.append(n)
    return torch.cat([seq[:, :prompt_len], gen], dim=1), counts
