"""A block KV cache's bookkeeping: a pool of fixed-size blocks, a block table per sequence, prefix reuse by
block hash, reference counts and LRU eviction of unused cached blocks.

This is the part NxD Inference leaves to its caller ("NxD Inference does not implement its own cache eviction,
memory management, or prefix hashing for matches. Instead, it requires external management of the block KV cache
and expects active block tables and slot mappings to be provided with each generation request", the NxDI guide,
Prefix Caching Support) and that vLLM's automatic prefix caching does (``vllm/v1/core/kv_cache_utils.py``
``hash_block_tokens``, ``block_pool.py``):

- a block is ``block_size`` consecutive token positions of one sequence; its KV lives at physical slots
  ``block_id * block_size + offset`` (NxDI's ``slot_mapping``; its cache is ``(pa_num_blocks, pa_block_size,
  kv_heads, head_dim)`` per layer, ``modules/kvcache/block_kv_cache_manager.py``);
- only *full* blocks are cached. A full block's hash chains the previous block's hash with the block's token ids,
  so equal hashes mean equal prefixes up to and including the block, never just equal blocks;
- a new prompt walks its full blocks' hashes from the start and reuses every block found (reference count + 1),
  up to the last full block that still leaves at least one prompt token to compute (the first output token needs
  the logits of the last prompt position, as in vLLM);
- a finished sequence releases its blocks (reference count - 1); a block at 0 stays cached, evictable, and the
  least recently released is evicted first when a new block is needed and no never-used block is left.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

NONE_HASH = b"\x00" * 32  # the parent of a sequence's first block


def hash_block(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The hash of one full block: sha256 of the parent block's hash and the block's token ids."""
    h = hashlib.sha256(parent)
    h.update(b",".join(str(int(t)).encode() for t in token_ids))
    return h.digest()


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The chained hashes of every *full* block of ``token_ids`` (a partial last block has none)."""
    out, parent = [], NONE_HASH
    for i in range(len(token_ids) // block_size):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


def slot_mapping(block_table: Sequence[int], start: int, end: int, block_size: int) -> list[int]:
    """Physical KV slots of token positions [start, end) of a sequence with this block table."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]


class OutOfBlocks(RuntimeError):
    pass


@dataclass
class SequenceBlocks:
    """One sequence's view of the pool: its token ids so far, block table and how much of it came from the cache."""
    token_ids: list[int]
    block_table: list[int] = field(default_factory=list)
    cached_tokens: int = 0      # prompt tokens whose KV was found in the cache (a multiple of block_size)
    hashed_blocks: int = 0      # leading full blocks already registered in the cache


class BlockPool:
    """``num_blocks`` KV blocks of ``block_size`` positions. ``enable_caching=False`` gives the same block tables
    without any reuse (the baseline)."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks}, block_size={block_size}: both must be >= 1")
        self.num_blocks, self.block_size, self.enable_caching = int(num_blocks), int(block_size), enable_caching
        self.ref = [0] * self.num_blocks
        self.hash_of: dict[int, bytes] = {}          # block id -> hash, for cached (full, registered) blocks
        self.cached: dict[bytes, int] = {}           # hash -> block id
        self.never_used = list(range(self.num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self.evictable: OrderedDict[int, None] = OrderedDict()      # ref 0 and cached, least recently released first
        self.stats = {"lookup_tokens": 0, "hit_tokens": 0, "evictions": 0}

    # -- capacity -----------------------------------------------------------------------------------------
    def blocks_needed(self, n_tokens: int) -> int:
        return -(-int(n_tokens) // self.block_size)

    @property
    def free_blocks(self) -> int:
        return len(self.never_used) + len(self.evictable)

    def _take_block(self) -> int:
        if self.never_used:
            b = self.never_used.pop()
        elif self.evictable:
            b, _ = self.evictable.popitem(last=False)  # the least recently released cached block
            del self.cached[self.hash_of.pop(b)]
            self.stats["evictions"] += 1
        else:
            raise OutOfBlocks(f"all {self.num_blocks} blocks are in use by running sequences: raise num_blocks "
                              "(NxDI pa_num_blocks) or run fewer sequences at once")
        self.ref[b] = 1
        return b

    # -- a sequence's life --------------------------------------------------------------------------------
    def allocate(self, prompt_ids: Sequence[int]) -> SequenceBlocks:
        """Block table for a new prompt: reused cached blocks for its longest cached prefix (at most all but the
        last prompt token), new blocks for the rest. Raises OutOfBlocks before touching the pool if it cannot."""
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("empty prompt")
        hits = []
        if self.enable_caching:
            for h in block_hashes(prompt_ids[:len(prompt_ids) - 1], self.block_size):
                b = self.cached.get(h)
                if b is None:
                    break
                hits.append(b)
        new = self.blocks_needed(len(prompt_ids)) - len(hits)
        reusable_evictable = sum(1 for b in hits if b in self.evictable)
        if new > self.free_blocks - reusable_evictable:
            raise OutOfBlocks(f"a prompt of {len(prompt_ids)} tokens needs {new} new blocks of {self.block_size}, "
                              f"{self.free_blocks - reusable_evictable} are free: raise num_blocks (NxDI "
                              "pa_num_blocks) or shorten the prompt")
        for b in hits:
            self.evictable.pop(b, None)
            self.ref[b] += 1
        seq = SequenceBlocks(prompt_ids, hits + [self._take_block() for _ in range(new)],
                             cached_tokens=len(hits) * self.block_size, hashed_blocks=len(hits))
        self.stats["lookup_tokens"] += len(prompt_ids)
        self.stats["hit_tokens"] += seq.cached_tokens
        return seq

    def append_token(self, seq: SequenceBlocks, token_id: int) -> int:
        """Add one generated token (its KV is written next); returns its physical slot."""
        seq.token_ids.append(int(token_id))
        pos = len(seq.token_ids) - 1
        if pos // self.block_size >= len(seq.block_table):
            seq.block_table.append(self._take_block())
        return seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def commit(self, seq: SequenceBlocks, n_computed: int) -> None:
        """Register the full blocks among the first ``n_computed`` positions (their KV is now written) so that
        later prompts can reuse them. A block whose hash is already cached (computed twice) stays private."""
        if not self.enable_caching:
            return
        full = n_computed // self.block_size
        hashes = block_hashes(seq.token_ids[:full * self.block_size], self.block_size)
        for i in range(seq.hashed_blocks, full):
            h, b = hashes[i], seq.block_table[i]
            if h not in self.cached:
                self.cached[h], self.hash_of[b] = b, h
        seq.hashed_blocks = max(seq.hashed_blocks, full)

    def free(self, seq: SequenceBlocks) -> None:
        """Release a finished sequence: cached blocks at reference 0 become evictable (the sequence's last blocks
        first in line, as vLLM frees a request's blocks in reverse), the others return to the free list."""
        for b in reversed(seq.block_table):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if b in self.hash_of:
                    self.evictable[b] = None
                else:
                    self.never_used.append(b)
        seq.block_table = []

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the cache / prompt tokens looked up."""
        return self.stats["hit_tokens"] / max(1, self.stats["lookup_tokens"])


def simulate_hit_rate(prompts: Sequence[Sequence[int]], block_size: int, num_blocks: int) -> float:
    """Token hit rate of a pool over a stream of prompts served one after another (bookkeeping only, no model)."""
    pool = BlockPool(num_blocks, block_size)
    for p in prompts:
        seq = pool.allocate(p)
        pool.commit(seq, len(p))
        pool.free(seq)
    return pool.hit_rate
