"""Stand-in only: NxD Inference 0.8's prefix caching (``is_prefix_caching=True`` + ``is_block_kv_layout=True``), as
aws-neuron/neuronx-distributed-inference cd3abf3 (SDK 2.28.0) does it, on the reference engine.

Transcribed from the release:

- ``models/model_wrapper.py`` ``get_target_2d_bucket_for_prefix_caching`` (transcribed in the stand-in's
  ``ModelWrapper``; no EAGLE, no fused speculation): the context-encoding (prefill, prefix) bucket, with the
  256 < total <= 512 -> (512, 0) corner case, the "Prefill len N exceeds largest bucket (B) for context_encoding_model" ValueError and the "Prefix len N exceeds
  largest bucket B" AssertionError; token generation: the smallest [1, S] bucket with S > computed_context_len,
  else "Input len ... exceeds largest bucket ... for token_generation_model";
- ``models/model_base.py`` ``_infer_attention_mask`` (the mask vLLM leaves to NxDI: ``attention_mask=None``) and
  the dispatch of ``_get_model_outputs`` with prefix caching: context encoding when the input has more than one
  token and ``position_ids.min() == 0``, token generation otherwise;
- the calling convention vLLM's Neuron worker uses (vllm-project/vllm-neuron
  ``worker/neuronx_distributed_model_runner.py``): context encoding gets the *whole* prompt in ``input_ids`` /
  ``position_ids``, ``computed_context_lens`` = cached tokens, ``full_context_lens`` = prompt length,
  ``slot_mapping`` = the physical slots of the uncached positions, ``block_table`` = the sequence's blocks (padded);
  token generation gets one token, its slot, ``full_context_lens`` = position + 1, ``computed_context_lens`` =
  position.

The KV cache is ``pa_num_blocks + 1`` blocks of ``pa_block_size`` slots (``BlockKVCacheManager`` reserves one extra
block for discarded writes); the engine is ``helpers.serving.prefix.paged_model``, the reference model over a block
KV cache (scatter the new positions, gather by block table, flat attention, as the NxDI guide describes) at tp_degree=1. A slot outside the cache raises ContractError
(on device: an out-of-bounds DMA). Not emulated: padding to the selected bucket (the engine computes the exact
tokens; outputs are the same), re-encoding of prefix tokens moved into the prefill bucket (their KV is computed but
not written there: slot -1), batch > 1 in one call, on-device sampling.
"""
from __future__ import annotations

import torch

import _neuron_contract as contract


def infer_attention_mask(position_ids):
    """models/model_base.py ``_infer_attention_mask``."""
    batch_size, seq_len = position_ids.shape
    if position_ids.shape[-1] != 1:
        seq_len = position_ids.shape[-1]
        position_ids_to_compare = position_ids
    else:
        seq_len = torch.max(position_ids)
        position_ids_to_compare = position_ids.expand(batch_size, seq_len) - 1
    mask = torch.arange(seq_len).view(1, -1).expand(batch_size, seq_len)
    return (position_ids_to_compare >= mask).to(dtype=position_ids.dtype)


def check_config(neuron_config):
    """What the release needs around prefix caching and fails on later (at trace or on device) without a word."""
    if neuron_config.is_prefix_caching and not neuron_config.is_block_kv_layout:
        raise contract.ContractError(
            "is_prefix_caching=True without is_block_kv_layout=True: NxD Inference 0.8 only builds its block KV cache "
            "(modules/kvcache/block_kv_cache_manager.py, chosen in models/model_base.py init_inference_optimization) "
            "with is_block_kv_layout=True; the flat cache cannot take block tables. Set is_block_kv_layout=True with "
            "pa_num_blocks and pa_block_size (the NxDI guide, Prefix Caching Support).")
    if neuron_config.is_block_kv_layout and not (neuron_config.is_prefix_caching or neuron_config.is_chunked_prefill):
        raise NotImplementedError("stand-in: is_block_kv_layout=True without prefix caching or chunked prefill "
                                  "(BlockKVCacheManager sets no KV shape then)")
    if neuron_config.is_chunked_prefill:
        raise NotImplementedError("stand-in: chunked prefill is not transcribed")


class PrefixCachingRuntime:
    """The device side: a block KV cache of ``pa_num_blocks + 1`` blocks and the reference engine over it."""

    def __init__(self, app, base_model):
        from helpers.serving.prefix import paged_model

        nc = app.neuron_config
        self.block_size, self.num_blocks = int(nc.pa_block_size), int(nc.pa_num_blocks) + 1
        self.tr = paged_model(base_model.model, self.num_blocks, self.block_size)
        self.max_blocks = self.num_blocks

    def _slots(self, block_table_row, n):
        bs = self.block_size
        out = []
        for p in range(n):
            b = int(block_table_row[p // bs])
            if not 0 <= b < self.num_blocks:
                raise contract.ContractError(f"block_table entry {b} outside the {self.num_blocks} blocks of the cache "
                                             "(pa_num_blocks + 1): an out-of-bounds read on device")
            out.append(b * bs + p % bs)
        return out

    def _check(self, slots):
        bad = [s for s in slots if not 0 <= int(s) < self.num_blocks * self.block_size]
        if bad:
            raise contract.ContractError(f"slot_mapping {bad[:4]} outside the cache of pa_num_blocks + 1 = "
                                         f"{self.num_blocks} blocks of {self.block_size}: an out-of-bounds write")

    def run(self, input_ids, position_ids, slot_mapping, block_table, full_context_lens, computed_context_lens):
        """Logits [B, 1, V]: each row's prompt suffix (context encoding) or its one new token."""
        from helpers.serving.prefix import paged_forward

        rows = []
        for r in range(input_ids.shape[0]):
            full, computed = int(full_context_lens[r].reshape(-1)[0]), int(computed_context_lens[r].reshape(-1)[0])
            n_new = full - computed
            new_slots = [int(s) for s in slot_mapping[r].reshape(-1)[:n_new]]
            self._check(new_slots)
            if input_ids.shape[1] == 1:
                tokens = input_ids[r].tolist()
            else:
                if not torch.equal(position_ids[r, :full].long(), torch.arange(full)):
                    raise NotImplementedError("stand-in: context-encoding position_ids other than 0..full-1")
                tokens = input_ids[r, computed:full].tolist()
            slots = self._slots(block_table[r].reshape(-1), computed) + new_slots
            rows.append(paged_forward(self.tr, tokens, computed, slots))
        return torch.cat(rows)[:, None, :].clone()
