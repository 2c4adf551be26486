"""KV-cache slots: the reference engine compiled once for ``n_slots`` sequences, each at its own position.

This is NxD Inference's continuous-batching programming model (``NeuronConfig(is_continuous_batching=True,
ctx_batch_size=1, tkg_batch_size=n, max_batch_size=n)``, pinned 0.8 source at cd3abf3):

- the KV cache has one row per slot (``kv_cache_batch_size``); a request owns one row from admission to its
  last token;
- **context encoding runs one slot at a time**: NxDI's context-encoding model is built with
  ``ctx_batch_size`` rows and, with continuous batching, writes its K/V into the cache row named by
  ``seq_ids`` (``modules/kvcache/kv_cache_manager.py`` ``update_kv_by_layer_id``: ``assert seq_ids.dim() == 1
  and seq_ids.shape[0] == 1, "only supports single seq_id"``, hence ``ctx_batch_size=1``);
- **token generation runs over every slot at once**, a fixed batch of ``tkg_batch_size`` rows, each row at its
  own position (``position_ids`` per row; the new K/V scattered at each row's position: ``torch.scatter`` on
  the sequence dimension in the same file), a per-row attention mask;
- a finished request frees its row at once; the next request's context encoding overwrites it.

``SlotKVCache`` is ``helpers.engine.kv_cache.KVCache`` with per-row K/V writes: its ``update`` takes ``RowSlots``
(cache rows + per-row positions) where the engine passes one shared slot range. ``SlotModel`` is
``helpers.engine.generation.CausalLM`` built over it (same weights, kernels, attention, buckets and graphs per
bucket), plus ``prefill(slot, prompt)`` and ``decode(tokens)``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..engine.generation import CausalLM
from ..engine.kv_cache import KVCache
from ..engine.sampling import validate_input_ids


class RowSlots(NamedTuple):
    """Where one call's rows live: cache rows ``rows`` [B] and the positions ``pos`` [B, T] they write."""
    rows: torch.Tensor
    pos: torch.Tensor
    all_rows: bool  # rows == 0..n_slots-1 in order: attend over the cache itself (no gather)


class SlotKVCache(KVCache):
    """The engine's KV cache with one row per slot: when ``slots`` is ``RowSlots`` the K/V of each call's row go to
    its own cache row and positions (otherwise exactly the engine's shared-slot write)."""

    def update(self, slots, k, v, kv_len: int):
        if not isinstance(slots, RowSlots):
            return super().update(slots, k, v, kv_len)
        rows = slots.rows[:, None]
        self.k[rows, :, slots.pos] = k.transpose(1, 2)  # [B, T, kv, D]: the layout of k[r, :, pos]
        self.v[rows, :, slots.pos] = v.transpose(1, 2)
        if slots.all_rows:
            return self.k[:, :, :kv_len], self.v[:, :, :kv_len]
        return self.k[slots.rows, :, :kv_len], self.v[slots.rows, :, :kv_len]


class SlotModel(CausalLM):
    """The reference engine with ``batch_size`` KV-cache slots, each sequence at its own position.

    ``prefill(slot, prompt_ids)`` encodes one prompt into one slot (context bucket of its length) and returns
    the logits of its last token; ``decode(tokens, positions)`` runs one token-generation step over all slots
    (fixed batch; a free slot's row is computed and discarded, as on Neuron) and returns [n_slots, vocab].
    ``sample()`` and ``forward()`` still work as on ``CausalLM`` (all rows together).
    """

    cache_cls = SlotKVCache

    @property
    def n_slots(self) -> int:
        return self.batch_size

    def _check_slot(self, slot: int) -> int:
        if not 0 <= int(slot) < self.batch_size:
            raise ValueError(f"slot {slot} is not in [0, {self.batch_size}): the model was built with "
                             f"batch_size={self.batch_size} slots")
        return int(slot)

    @torch.inference_mode()
    def prefill(self, slot: int, prompt_ids) -> torch.Tensor:
        """Context encoding of one prompt [L] or [1, L] into cache row ``slot``: logits [vocab] of its last token.
        The prompt sits at positions 0..L-1 of its row (right-padded to the context bucket; the pads are
        overwritten by later steps and never attended)."""
        self.require_built()
        ids = validate_input_ids(prompt_ids, self.args.vocab_size).to(self.device)
        if ids.shape[0] != 1:
            raise ValueError(f"prefill takes one prompt, got {ids.shape[0]} rows: context encoding runs one slot at "
                             "a time (NxD Inference: ctx_batch_size=1 with is_continuous_batching)")
        slot, L = self._check_slot(slot), ids.shape[1]
        if L > self.context_buckets[-1] or L >= self.n_positions:
            raise ValueError(f"prompt of {L} tokens: longer than the largest context bucket "
                             f"{self.context_buckets[-1]} (or no room to generate in n_positions={self.n_positions}); "
                             "shorten it or rebuild with larger buckets")
        width = self.select_bucket("context", L)
        tokens = torch.cat([ids, ids.new_zeros(1, width - L)], dim=1)
        pos = torch.arange(width, device=self.device)[None]
        mask = (pos[0][None, :] <= pos[0][:, None])[None]  # causal over the bucket: [1, width, width]
        rows = torch.tensor([slot], device=self.device)
        logits = self.graphs[("context", width)](tokens, pos, RowSlots(rows, pos, False), width, mask,
                                                 torch.tensor([[L - 1]], device=self.device))
        return logits[0, -1]

    @torch.inference_mode()
    def decode(self, tokens, positions) -> torch.Tensor:
        """One token-generation step over every slot: ``tokens`` [n_slots] written at ``positions`` [n_slots]
        (a row sees its own positions 0..p). Logits [n_slots, vocab]. The token bucket is chosen by the
        furthest row, as one fixed-shape graph serves the whole batch."""
        self.require_built()
        tokens = torch.as_tensor(tokens, device=self.device).long().reshape(-1)
        positions = torch.as_tensor(positions, device=self.device).long().reshape(-1)
        if tokens.numel() != self.batch_size or positions.numel() != self.batch_size:
            raise ValueError(f"decode takes one token and one position per slot ({self.batch_size}), got "
                             f"{tokens.numel()} and {positions.numel()}")
        top = int(positions.max())
        if top >= self.n_positions or int(positions.min()) < 0:
            raise ValueError(f"positions {positions.tolist()} outside [0, n_positions={self.n_positions})")
        kv_len = self.select_bucket("token", top + 1)
        j = torch.arange(kv_len, device=self.device)
        mask = (j[None, :] <= positions[:, None])[:, None, :]  # [B, 1, kv_len]
        rows = torch.arange(self.batch_size, device=self.device)
        pos = positions[:, None]
        logits = self.graphs[("token", kv_len)](tokens[:, None], pos, RowSlots(rows, pos, True), kv_len, mask,
                                                torch.zeros(self.batch_size, 1, dtype=torch.long, device=self.device))
        return logits[:, -1]


def build_slot_model(model_path=None, n_slots: int = 4, **settings) -> SlotModel:
    """A ``SlotModel`` with ``n_slots`` KV-cache slots, built (``to_neuron()``) with the engine's settings
    (``n_positions``, ``context_length_estimate``, ``amp``, ``device``, ``nxdi_bucketing``); tp_degree 1."""
    if int(settings.get("tp_degree", 1)) != 1:
        raise ValueError("the slot engine runs at tp_degree=1 (continuous batching is orthogonal to tensor "
                         "parallelism; see notebook 01 for tp)")
    return SlotModel.from_pretrained(model_path, batch_size=int(n_slots), **settings).to_neuron()
