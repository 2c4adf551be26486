"""Speculative sampling with the shape of transformers-neuronx's ``SpeculativeGenerator``.

A draft proposes ``k`` tokens; the target scores the last accepted token plus the drafts in one fixed-shape
forward (its speculative graph), and an acceptor keeps a prefix of the drafts plus one token of its own: greedy
(``top_k=1``) keeps drafts equal to the target's argmax (the output is the target's own); sampling uses the
modified rejection sampling of Leviathan et al. 2023 (keep ``x`` with probability ``min(1, p(x) / q(x))``, else
draw from ``norm(max(0, p - q))``), so every token is distributed as the target's ``p``. Drafts:
:class:`PromptLookupDraft` (n-gram lookup, no model) and :class:`ModelDraft` (a batch-1 reference model).
Unlike transformers-neuronx 0.13, the streamer receives each accepted token as a (1, 1) tensor.
"""
from __future__ import annotations

import time

import torch

from .sampling import eos_list, probabilities, validate_sampling_args


# -- acceptance rules ----------------------------------------------------------------------------
def accept_greedy(draft: torch.Tensor, p_logits: torch.Tensor) -> tuple[int, int]:
    """draft [k], target logits [k+1, V] -> (number of drafts kept, the target's next token)."""
    best = p_logits.argmax(-1)
    n = 0
    while n < draft.numel() and int(draft[n]) == int(best[n]):
        n += 1
    return n, int(best[n])


def accept_rejection(draft: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor,
                     generator: torch.Generator | None = None) -> tuple[int, int]:
    """Modified rejection sampling. draft [k]; q [k, V] the draft's probabilities (None: a
    deterministic draft, q one-hot); p [k+1, V] the target's. Returns (kept, next token)."""
    k = draft.numel()
    for i in range(k):
        x = int(draft[i])
        qx = 1.0 if q is None else float(q[i, x])
        px = float(p[i, x])
        u = float(torch.rand((), generator=generator))
        if qx > 0 and u < min(1.0, px / qx):
            continue
        residual = p[i].clone()
        if q is None:
            residual[x] = 0.0
        else:
            residual = (p[i] - q[i]).clamp_(min=0.0)
        total = float(residual.sum())
        if total <= 0:  # p == q: rejection has probability 0; keep the target's own draw
            residual = p[i]
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))


# -- drafts --------------------------------------------------------------------------------------
class PromptLookupDraft:
    """Drafts the ``k`` tokens that followed the most recent earlier occurrence of the last ``ngram`` tokens (shorter
    n-grams, then the last token repeated, as fallbacks; a match near the end continues into its own proposal, so a
    repeating pattern extends by whole periods). No model: its distribution is one-hot (q = None)."""

    def __init__(self, ngram: int = 3):
        if ngram < 1:
            raise ValueError("ngram must be >= 1")
        self.ngram = ngram

    def reset(self, seq: torch.Tensor):
        pass

    def propose(self, seq: torch.Tensor, k: int, top_k=1, top_p=1.0, temperature=1.0, generator=None):
        s = seq.tolist()
        for n in range(min(self.ngram, len(s) - 1), 0, -1):
            tail = s[-n:]
            for start in range(len(s) - n - 1, -1, -1):
                if s[start:start + n] == tail:
                    ext = list(s)
                    for j in range(k):  # reads past the end into the proposal itself: periods repeat
                        ext.append(ext[start + n + j])
                    return torch.tensor(ext[len(s):]), None
        return torch.full((k,), s[-1]), None


class ModelDraft:
    """A batch-1 reference model as the draft. It keeps its own KV cache in step with the
    accepted sequence and drafts from its own (warped) distribution."""

    def __init__(self, model):
        if model.batch_size != 1:
            raise ValueError("the draft model must be built with batch_size=1")
        self.model = model
        self.filled = 0  # cache slots holding the accepted sequence's tokens

    def reset(self, prompt: torch.Tensor):
        """Context-encode the prompt; the first proposal feeds the target's first token."""
        self.model.forward(prompt[None])
        self.filled = prompt.numel()

    def propose(self, seq: torch.Tensor, k: int, top_k=1, top_p=1.0, temperature=1.0, generator=None):
        m = self.model
        if seq.numel() + k > m.n_positions:
            raise ValueError("the draft's n_positions is too small for this sequence")
        start = torch.zeros(1, dtype=torch.long, device=m.device)
        logits = None
        for pos in range(self.filled, seq.numel()):  # catch up with tokens accepted last round
            logits = m.step(seq[None, pos:pos + 1].to(m.device), start, pos, "token")
        drafts, qs = [], []
        for i in range(k):
            q = probabilities(logits, top_k, top_p, temperature)[0]
            tok = int(q.argmax()) if top_k == 1 else int(torch.multinomial(q, 1, generator=generator))
            drafts.append(tok)
            qs.append(q.cpu())
            if i + 1 < k:
                logits = m.step(torch.tensor([[tok]], device=m.device), start, seq.numel() + i, "token")
        # slots seq.numel() .. +k-2 hold drafts 1..k-1; the caller tells us how many were accepted
        self._pending = seq.numel()
        return torch.tensor(drafts), (None if top_k == 1 else torch.stack(qs))

    def accepted(self, n_kept: int, k: int):
        self.filled = self._pending + min(n_kept, k - 1)


# -- the generator -------------------------------------------------------------------------------
class SpeculativeGenerator:
    """``SpeculativeGenerator(draft, target, k)`` as in transformers-neuronx; ``draft`` is a
    reference model (wrapped in :class:`ModelDraft`) or a draft provider such as
    :class:`PromptLookupDraft`. ``acceptor`` overrides the sampling rule (tests use a broken one)."""

    def __init__(self, draft, target, k: int = 4, acceptor=None):
        if getattr(target, "speculation_length", 0) != k:
            raise ValueError(f"the target must be built with enable_speculative_decoder({k}) before to_neuron() "
                             f"(it has speculation_length={getattr(target, 'speculation_length', 0)})")
        if target.batch_size != 1:
            raise ValueError(f"speculative sampling runs batch_size=1 (the target has {target.batch_size}), "
                             "the batch the Neuron guides document: rebuild the target with batch_size=1")
        self.draft = draft if hasattr(draft, "propose") else ModelDraft(draft)
        self.target, self.k, self.acceptor = target, k, acceptor or accept_rejection
        self.stats: dict = {}

    @torch.inference_mode()
    def sample(self, input_ids, sequence_length: int, start_ids=None, eos_token_id=None, pad_token_id: int = 0,
               attention_mask=None, streamer=None, output_logits: bool = False, top_k: int = 1,
               top_p: float = 1.0, temperature: float = 1.0, generator: torch.Generator | None = None):
        validate_sampling_args(top_k, top_p, temperature)
        input_ids = self._prompt(input_ids, attention_mask, sequence_length)
        t, k = self.target, self.k
        eos = set(eos_list(eos_token_id))
        t0 = time.perf_counter()
        seq = input_ids.clone()
        logits = t.forward(seq[None])  # context encoding: the target's first token
        first = self._select(logits, top_k, top_p, temperature, generator)
        seq = torch.cat([seq, torch.tensor([first])])
        self.draft.reset(input_ids)
        if streamer is not None:
            streamer.put(torch.tensor([[first]]))
        rounds, kept_total, all_logits = 0, 0, [logits.cpu()] if output_logits else None
        L = input_ids.numel()
        while seq.numel() < sequence_length and not (eos and int(seq[-1]) in eos):
            cur = seq.numel()
            if cur - 1 + k + 1 > t.n_positions:  # no room for a full speculative window: plain steps
                logits = t.step(seq[None, -1:].to(t.device), torch.zeros(1, dtype=torch.long, device=t.device),
                                 cur - 1, "token")
                new = [self._select(logits, top_k, top_p, temperature, generator)]
            else:
                drafts, q = self.draft.propose(seq, k, top_k, top_p, temperature, generator)
                window = torch.cat([seq[-1:], drafts])[None]
                p_logits = t.speculative_forward(window, torch.tensor([cur - 1]))[0].float()
                if top_k == 1:
                    n, nxt = accept_greedy(drafts, p_logits)
                else:
                    n, nxt = self.acceptor(drafts, q, probabilities(p_logits, top_k, top_p, temperature), generator)
                if hasattr(self.draft, "accepted"):
                    self.draft.accepted(n, k)
                new = drafts[:n].tolist() + [nxt]
                rounds += 1
                kept_total += n
                if output_logits:
                    all_logits.append(p_logits[: n + 1].cpu())
            if eos:
                cut = next((i for i, x in enumerate(new) if x in eos), None)
                new = new if cut is None else new[:cut + 1]
            new = new[: sequence_length - seq.numel()]
            seq = torch.cat([seq, torch.tensor(new)])
            if streamer is not None:
                for x in new:
                    streamer.put(torch.tensor([[x]]))
        if streamer is not None:
            streamer.end()
        self.stats = {"new_tokens": seq.numel() - L, "rounds": rounds, "drafts_kept": kept_total,
                      "acceptance_rate": kept_total / (rounds * k) if rounds else 0.0,
                      "tokens_per_round": (kept_total + rounds) / rounds if rounds else 0.0,
                      "total_s": time.perf_counter() - t0}
        if output_logits:
            self.stats["logits"] = all_logits
        return seq[None]

    def _prompt(self, input_ids, attention_mask, sequence_length: int) -> torch.Tensor:
        """The prompt as one row [L], or a refusal (several rows, padding, no room in the target)."""
        input_ids = torch.as_tensor(input_ids)
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(f"speculative sampling runs batch_size=1, got {input_ids.shape[0]} rows")
            input_ids = input_ids[0]
        if attention_mask is not None and bool((torch.as_tensor(attention_mask) == 0).any()):
            raise ValueError("batch 1 needs no padding: pass the prompt without pad tokens")
        if sequence_length > self.target.n_positions:
            raise ValueError(f"sequence_length={sequence_length} exceeds the target's "
                             f"n_positions={self.target.n_positions}")
        return input_ids

    @staticmethod
    def _select(logits, top_k, top_p, temperature, generator):
        if top_k == 1:
            return int(logits[0].argmax())
        return int(torch.multinomial(probabilities(logits, top_k, top_p, temperature)[0], 1, generator=generator))
