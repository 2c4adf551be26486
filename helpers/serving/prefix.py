"""Prefix caching on the reference engine: a block KV cache, prefill of the uncached suffix only, then decode.

``paged_model`` is the engine's ``Transformer`` (same weights, kernels, RoPE tables and attention) over a block KV
cache (``BlockKVCache``): one pool of ``num_blocks * block_size`` physical slots per layer instead of one row per
sequence. Its cache does
what NxD Inference 0.8 does with ``is_prefix_caching`` ("first gathering the block KV cache using the block table,
then converting it to a flat KV cache layout, computing attention, and finally scattering the computed cache back
to the block KV cache layout", the NxDI guide; ``modules/kvcache/block_kv_cache_manager.py``): write the new
positions to their blocks, gather the sequence's slots into a flat cache, and the engine's own attention runs on it.

``PrefixCachingEngine`` serves prompts one at a time with ``helpers.serving.blocks.BlockPool`` doing the bookkeeping
(block tables, hashes, reuse, eviction): a prompt whose first full blocks are cached computes only the rest,
attending over the cached blocks. ``enable_caching=False`` is the same engine without reuse (the baseline).
Greedy decoding; the numbers are the reference engine's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..engine.kv_cache import KVCache
from ..engine.model import Transformer, build_mask
from ..planning.buckets import nxdi_prefix_caching_select
from ..planning.memory import plan
from .blocks import BlockPool, SequenceBlocks, slot_mapping


class BlockKVCache(KVCache):
    """A block KV cache ``[layers, 1, kv_heads, num_blocks * block_size, head_dim]``: one pool of physical slots.

    Before each forward, set ``gather`` to the physical slots of logical positions ``[0, kv_len)`` of the sequence
    (``slot_mapping`` of its block table); the model's ``slots`` are then logical positions, as in the base."""

    def __init__(self, k, v, block_size: int):
        super().__init__(k, v)
        self.block_size = int(block_size)
        self.num_blocks = k.shape[-2] // self.block_size
        self.gather: torch.Tensor | None = None

    def update(self, slots, k, v, kv_len: int):
        phys = self.gather[:kv_len]
        self.k[:, :, phys[slots]] = k  # scatter the new positions to their blocks
        self.v[:, :, phys[slots]] = v
        return self.k[:, :, phys], self.v[:, :, phys]  # gather: the flat layout of this sequence


def paged_model(base: Transformer, num_blocks: int, block_size: int) -> Transformer:
    """``base`` (its weights, kernels and RoPE tables, shared) over a new :class:`BlockKVCache` of ``num_blocks``
    blocks of ``block_size`` positions."""
    shape = (base.args.n_layers, 1, base.w.n_kv, int(num_blocks) * int(block_size), base.args.head_dim)
    return base.with_cache(BlockKVCache.zeros(shape, base.dtype, base.device, block_size=block_size))


@torch.inference_mode()
def paged_forward(tr: Transformer, token_ids: Sequence[int], start: int, slots: Sequence[int]) -> torch.Tensor:
    """Encode ``token_ids`` at positions ``start, start + 1, ...`` of one sequence whose positions ``[0, end)`` live
    at the physical ``slots`` (its slot mapping; ``[0, start)`` already written); logits [1, V] of the last one."""
    dev, end = tr.device, start + len(token_ids)
    if len(slots) != end:
        raise ValueError(f"{len(slots)} slots for positions [0, {end})")
    tr.cache.gather = torch.as_tensor(list(slots), dtype=torch.long, device=dev)
    pos = torch.arange(start, end, device=dev)
    mask = build_mask(pos, torch.zeros(1, dtype=torch.long, device=dev), end, tr.args.sliding_window)
    idx = torch.full((1, 1), end - start - 1, device=dev)
    return tr.forward(torch.tensor([list(token_ids)], device=dev), pos[None], pos, end, mask, idx)[:, -1]


@dataclass
class RequestResult:
    prompt_len: int
    cached_tokens: int       # prompt tokens whose KV came from the cache
    computed_tokens: int     # prompt tokens encoded by this request's prefill
    tokens: list[int]        # generated token ids (greedy)
    ttft_s: float
    total_s: float
    block_table: list[int]


class PrefixCachingEngine:
    """Serve prompts over a block KV cache of ``num_blocks`` blocks of ``block_size`` positions.

    ``model``: a built reference model (``helpers.build_model``, tp_degree=1): its weights are shared, its own KV
    cache is not used."""

    def __init__(self, model, num_blocks: int, block_size: int, enable_caching: bool = True):
        tr = getattr(model, "model", None)
        if not isinstance(tr, Transformer) or getattr(model, "tp_degree", 1) != 1:
            raise ValueError("PrefixCachingEngine runs on a built reference model at tp_degree=1 "
                             "(helpers.build_model(bk, ..., tp_degree=1) with backend 'reference')")
        self.tr = paged_model(tr, num_blocks, block_size)
        self.pool = BlockPool(num_blocks, block_size, enable_caching)
        self.block_size = int(block_size)

    @property
    def kv_bytes_per_block(self) -> int:
        """Bytes one block holds: K and V of ``block_size`` positions, every layer, this rank's KV heads (read off the
        block cache this engine allocated)."""
        return self.tr.cache.nbytes // self.tr.cache.num_blocks

    def _sync(self):
        if self.tr.device.type == "cuda":
            torch.cuda.synchronize()

    def _forward(self, seq: SequenceBlocks, start: int, end: int) -> torch.Tensor:
        """Encode positions [start, end) of ``seq`` over its cached [0, start); logits of position end - 1."""
        return paged_forward(self.tr, seq.token_ids[start:end], start,
                             slot_mapping(seq.block_table, 0, end, self.block_size))

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, keep: bool = False) -> RequestResult:
        """Greedy generation of ``max_new_tokens`` (no EOS stop). The prompt's full blocks are registered in the
        cache after its prefill; ``keep=True`` leaves the sequence's blocks referenced (not evictable)."""
        L = len(prompt_ids)
        if L + max_new_tokens > self.tr.max_positions:
            raise ValueError(f"prompt {L} + {max_new_tokens} new tokens exceed the model's {self.tr.max_positions} "
                             "positions: raise n_positions of the base model or shorten the request")
        t0 = time.perf_counter()
        seq = self.pool.allocate(prompt_ids)
        start = seq.cached_tokens
        logits = self._forward(seq, start, L)
        self.pool.commit(seq, L)
        out = []
        for i in range(max_new_tokens):
            tok = int(logits.argmax(-1))
            out.append(tok)
            if i == 0:
                self._sync()
                ttft = time.perf_counter() - t0
            if i + 1 == max_new_tokens:
                break
            self.pool.append_token(seq, tok)
            logits = self._forward(seq, len(seq.token_ids) - 1, len(seq.token_ids))
        self._sync()
        result = RequestResult(L, start, L - start, out, ttft, time.perf_counter() - t0, list(seq.block_table))
        if not keep:
            self.pool.free(seq)
        return result

    def serve(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[RequestResult]:
        """Serve ``prompts`` one after another (each request's blocks are released when it ends)."""
        return [self.generate(p, max_new_tokens) for p in prompts]


@torch.inference_mode()
def decode_step_times(model, context_len: int, steps: int, num_blocks: int, block_size: int) -> dict[str, list[float]]:
    """Seconds of one token-generation step (one token at position ``context_len``, attending over
    ``[0, context_len]``) on the same weights, eager, with the engine's flat KV cache (``"flat"``) and with the block
    layout (``"block"``: gather the sequence's blocks into a flat cache, attend, scatter the new position back, as
    NxDI 0.8 does with ``is_block_kv_layout``). The sequence's blocks are taken from the end of the pool (not
    contiguous with its positions, as after a few requests); one untimed step each, then ``steps`` of each,
    alternately (both see the same load on the machine)."""
    tr = getattr(model, "model", None)
    if not isinstance(tr, Transformer) or getattr(model, "tp_degree", 1) != 1:
        raise ValueError("decode_step_times runs on a built reference model at tp_degree=1")
    end = int(context_len) + 1
    need = -(-end // int(block_size))
    if end > tr.max_positions or need > int(num_blocks) or int(steps) < 1:
        raise ValueError(f"context_len={context_len}, steps={steps}: need 1 <= steps, context_len + 1 <= the model's "
                         f"positions and <= num_blocks * block_size")
    paged = paged_model(tr, num_blocks, block_size)
    table = list(range(int(num_blocks) - 1, int(num_blocks) - 1 - need, -1))
    slots = slot_mapping(table, 0, end, int(block_size))
    dev = tr.device
    pos = torch.tensor([end - 1], device=dev)
    mask = build_mask(pos, torch.zeros(1, dtype=torch.long, device=dev), end, tr.args.sliding_window)
    token = torch.tensor([[101]], device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def flat():
        tr.forward(token, pos[None], pos, end, mask, torch.zeros(1, 1, dtype=torch.long, device=dev))

    def block():
        paged_forward(paged, [101], end - 1, slots)

    times: dict[str, list[float]] = {"flat": [], "block": []}
    for i in range(int(steps) + 1):
        for name, fn in (("flat", flat), ("block", block)):
            t0 = time.perf_counter()
            fn()
            sync()
            if i:
                times[name].append(time.perf_counter() - t0)
    return times


def block_memory(model, block_size: int, tp_degree: int = 1, amp: str = "bf16") -> dict:
    """Bytes of one KV block per NeuronCore for a model config (a shipped name, "embedded" or a path), with NxD
    Inference's KV heads per core at ``tp_degree`` (its GQA layout): the planner's KV cache of one sequence of
    ``block_size`` positions (``helpers.planning.memory.plan``; NxDI's cache per layer is ``(pa_num_blocks + 1,
    pa_block_size, kv_heads_per_rank, head_dim)``)."""
    p = plan(model, tp_degree, batch_size=1, n_positions=block_size, amp=amp, library="nxdi")
    if p.error:
        raise ValueError(p.error)
    per_block = p.kv_bytes  # one sequence's KV cache of block_size positions
    return {"model": p.model, "tp": tp_degree, "kv_heads/core": p.kv_heads_per_core, "block_size": block_size,
            "bytes_per_block": per_block, "bytes_per_token": per_block // block_size}


# -- traffic ---------------------------------------------------------------------------------------------
def random_tokens(n: int, vocab: int, rng: np.random.Generator, low: int = 100) -> list[int]:
    """``n`` random token ids in [low, vocab): clear of the special tokens at the start of the vocabulary."""
    return rng.integers(low, vocab, size=int(n)).tolist()


def shared_share_prompts(share: float, prompt_len: int, n: int, vocab: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``prompt_len`` tokens whose first ``round(share * prompt_len)`` tokens are one shared prefix
    (a system prompt) and the rest unique to each request."""
    if not 0 <= share < 1:
        raise ValueError(f"share={share}: must be in [0, 1) (a prompt needs at least one token of its own)")
    rng = np.random.default_rng(seed)
    shared = random_tokens(round(share * prompt_len), vocab, rng)
    return [shared + random_tokens(prompt_len - len(shared), vocab, rng) for _ in range(n)]


def chat_traffic(n_requests: int, vocab: int, seed: int, system_lens: Sequence[int], fewshot_lens: Sequence[int],
                 fewshot_prob: float, question_len: tuple[int, int]) -> list[list[int]]:
    """Chat-like prompts: one of the system prompts (lengths ``system_lens``, picked uniformly), then with
    probability ``fewshot_prob`` one of the few-shot blocks (``fewshot_lens``), then a unique question of
    ``question_len`` = (min, max) tokens."""
    rng = np.random.default_rng(seed)
    systems = [random_tokens(n, vocab, rng) for n in system_lens]
    shots = [random_tokens(n, vocab, rng) for n in fewshot_lens]
    prompts = []
    for _ in range(n_requests):
        p = list(systems[rng.integers(len(systems))])
        if shots and rng.random() < fewshot_prob:
            p += shots[rng.integers(len(shots))]
        prompts.append(p + random_tokens(rng.integers(question_len[0], question_len[1] + 1), vocab, rng))
    return prompts


def shared_tokens(prompts: Sequence[Sequence[int]]) -> float:
    """Upper bound of any prefix cache on a stream: the share of prompt tokens that repeat the longest common
    prefix with some earlier prompt (block size 1, unlimited blocks, the last token always computed)."""
    seen: set[tuple] = set()
    hit = total = 0
    for p in prompts:
        p = tuple(p)
        n = 0
        while n < len(p) - 1 and p[:n + 1] in seen:
            n += 1
        hit, total = hit + n, total + len(p)
        seen.update(p[:k] for k in range(1, len(p) + 1))
    return hit / max(1, total)


def cached_prefixes(prompts: Sequence[Sequence[int]], num_blocks: int, block_size: int) -> list[int]:
    """Cached prompt tokens of each request of a stream served one after another (bookkeeping only, no model):
    what ``PrefixCachingEngine`` finds in its cache for the same stream and pool."""
    pool, out = BlockPool(num_blocks, block_size), []
    for p in prompts:
        seq = pool.allocate(p)
        pool.commit(seq, len(p))
        pool.free(seq)
        out.append(seq.cached_tokens)
    return out


def bucket_rows(requests: Sequence[tuple[int, int]], grid) -> list[dict]:
    """For each (prompt length, cached tokens): the (prefill, prefix) bucket NxD Inference 0.8 runs its context
    encoding in (``helpers.planning.buckets.nxdi_prefix_caching_select``) or the error it raises, and the bucket
    the same prompt takes without a cache hit."""
    rows = []
    for prompt_len, cached in requests:
        row = {"prompt": prompt_len, "cached": cached}
        for key, hit in (("bucket", cached), ("bucket_no_cache", 0)):
            try:
                row[key] = nxdi_prefix_caching_select(grid, prompt_len, hit)
            except ValueError as e:
                row[key] = str(e)
        rows.append(row)
    return rows
