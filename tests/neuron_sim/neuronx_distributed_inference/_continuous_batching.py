"""Stand-in only (no NxD Inference file of this name): continuous batching, ``NeuronConfig(is_continuous_batching=True)``.

What a user sees of it in NxD Inference 0.8 (aws-neuron/neuronx-distributed-inference cd3abf3, SDK 2.28.0),
transcribed here:

- ``modules/kvcache/kv_cache_manager.py`` ``update_kv_by_layer_id``: with continuous batching, context encoding
  writes one sequence's K/V into the cache row its ``seq_ids`` names, after ``assert seq_ids.dim() == 1 and
  seq_ids.shape[0] == 1, "only supports single seq_id"``. The context-encoding model is traced with
  ``ctx_batch_size`` rows (``models/model_base.py`` ``enable_context_encoding``), so ``ctx_batch_size`` other
  than 1 fails that assertion while ``compile()`` traces it: the stand-in raises the same AssertionError there.
- Token generation (same function): the batch's row r writes its new K/V at cache row r, position
  ``position_ids[r]`` (``torch.scatter`` on the sequence dimension); each row attends with its own mask.
- ``models/model_wrapper.py`` ``ModelWrapper.forward``: an input with more rows than the compiled batch runs in
  slices of it (context encoding with ``ctx_batch_size=1``: one sequence per call); a slice with fewer rows goes
  through ``_forward_with_pad``: the missing ``seq_ids`` of ``range(max_batch_size)`` are appended, the batch
  sorted by seq_id, the padding rows copied from the first row (so they write that row's K/V into the rows of
  the seq_ids left out), and the logits come back with ``torch.index_select(logits, 0, seq_ids)``, in the
  caller's seq_ids order.
- ``models/model_base.py`` ``_get_model_outputs``: a call whose ``position_ids.min() == 0`` is context encoding,
  any other a token-generation step.

Refused with ContractError because the release would compute wrong tokens without a word: ``seq_ids`` outside
``[0, max_batch_size)`` or repeated within a call of the full compiled batch (with fewer rows, ``_forward_with_pad``'s
padding fails first with the release's IndexError, transcribed in ``ModelWrapper._pad_batch``). Numbers: ``helpers.serving.SlotModel`` (the reference
engine with per-slot positions) at tp_degree=1; never a Neuron measurement.
"""
from __future__ import annotations

import torch

import _neuron_contract as contract
from neuronx_distributed_inference._reference import ReferenceRuntime

SINGLE_SEQ_ID = "only supports single seq_id"


def check_continuous_batching(neuron_config) -> None:
    """What tracing the context-encoding model asserts (compile time)."""
    if neuron_config.is_continuous_batching:
        assert neuron_config.ctx_batch_size == 1, SINGLE_SEQ_ID


class SlotRuntime(ReferenceRuntime):
    """The reference engine with ``kv_cache_batch_size`` KV-cache slots behind a continuous-batching model."""

    continuous_batching = True

    def _engine_class(self):
        from helpers.serving.slots import SlotModel

        return SlotModel

    def _engine_batch_size(self, nc) -> int:
        return nc.kv_cache_batch_size

    def _check_seq_ids(self, seq_ids):
        ids = [int(s) for s in seq_ids.reshape(-1)]
        n = self.engine.n_slots
        if any(not 0 <= s < n for s in ids) or len(set(ids)) != len(ids):
            raise contract.ContractError(
                f"seq_ids {ids}: each must name a distinct KV-cache row in [0, {n}) (kv_cache_batch_size): NxD "
                "Inference 0.8 indexes the cache with them unchecked (modules/kvcache/kv_cache_manager.py), so an "
                "id out of range or repeated writes another sequence's row, silently.")
        return ids

    def context_encoding(self, input_ids, attention_mask, position_ids, seq_ids=None):
        """One sequence (ctx_batch_size=1): its K/V into cache row seq_ids[0]; logits [1, 1, V] of its last token."""
        self._check_right_padded(attention_mask)
        (slot,) = self._check_seq_ids(seq_ids)
        n = int(attention_mask[0].long().sum())
        if not torch.equal(position_ids[0, :n].long(), torch.arange(n)):
            raise NotImplementedError("stand-in: position_ids that do not start at 0 are not emulated")
        return self.engine.prefill(slot, input_ids[0, :n].long())[None, None, :].clone()

    def token_generation(self, input_ids, attention_mask, position_ids, seq_ids=None):
        """Every cache row at once (the wrapper padded the batch to max_batch_size, sorted by seq_id)."""
        self._check_seq_ids(seq_ids)
        logits = self.engine.decode(input_ids[:, 0].long(), position_ids[:, 0].long())
        return logits[:, None, :].clone()

    def speculation(self, input_ids, attention_mask, position_ids, seq_ids=None):
        raise NotImplementedError("stand-in: speculation with continuous batching is not emulated")


def forward_slots(wrapper, runtime, input_ids, attention_mask, position_ids, seq_ids):
    """``ModelWrapper.forward`` for a continuous-batching model: slices of the compiled batch, each padded as
    ``_forward_with_pad`` does, logits back in the caller's seq_ids order."""
    batch_size = wrapper.neuron_config.batch_size
    target = wrapper.neuron_config.max_batch_size
    run = runtime.context_encoding if wrapper.tag == "context_encoding_model" else runtime.token_generation
    out = []
    for lo in range(0, seq_ids.shape[0], batch_size):
        part = [t[lo:lo + batch_size] for t in (input_ids, attention_mask, position_ids)]
        ids = seq_ids[lo:lo + batch_size]
        runtime._check_seq_ids(ids)
        if ids.shape[0] == batch_size:  # the release's _forward: no padding, no reordering
            if wrapper.tag != "context_encoding_model" and ids.tolist() != list(range(batch_size)):
                raise contract.ContractError(
                    f"token generation with all {batch_size} rows and seq_ids {ids.tolist()}: NxD Inference 0.8 runs "
                    "a full batch as it comes (models/model_wrapper.py forward) and row r writes cache row r "
                    "(kv_cache_manager.py update_kv_by_layer_id), whatever its seq_id: wrong tokens, silently. Pass "
                    "a full batch in seq_id order 0..n-1, or only the live slots (the release pads and sorts those).")
            out.append(run(*part, ids))
            continue
        given = [int(s) for s in ids]
        padded = torch.tensor(given + [x for x in range(target) if x not in given], dtype=seq_ids.dtype)
        padded, order = torch.sort(padded)
        rows = [torch.cat([t, t[:1].expand(target - t.shape[0], *t.shape[1:])])[order] for t in part]
        logits = run(*rows, padded)
        out.append(torch.index_select(logits, 0, ids.long()))
    return torch.cat(out)
