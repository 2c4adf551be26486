"""One rank's compute with real collectives: ``DistComm`` (gloo on CPU, nccl on CUDA) and
``ParallelTransformer``, whose attention exchanges data between ranks for SHARD_OVER_BATCH and
ALL_GATHER_HEADS layouts.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..engine.model import Comm, Transformer
from ..engine.weights import RankWeights
from ..planning.gqa import HeadLayout


class DistComm(Comm):
    """Collectives of a torch.distributed group (gloo or nccl)."""

    def __init__(self, rank: int, world_size: int, kv_group=None):
        self.rank, self.world_size, self.kv_group = rank, world_size, kv_group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
        n = dist.get_world_size(group)
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=dim)

    def all_to_all(self, x: torch.Tensor, split_dim: int, concat_dim: int) -> torch.Tensor:
        """Chunk ``split_dim`` over the ranks (chunk j goes to rank j); concatenate what arrives on ``concat_dim``."""
        send = torch.stack(x.chunk(self.world_size, dim=split_dim))
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        return torch.cat(recv.unbind(0), dim=concat_dim)


class ParallelTransformer(Transformer):
    """One rank's forward; SHARD_OVER_BATCH and ALL_GATHER_HEADS need their own attention dataflow."""

    def __init__(self, args, w: RankWeights, comm, batch_size, n_positions, device, dtype):
        layout: HeadLayout = w.shard.layout
        rows = batch_size // layout.tp if layout.kv_mode == "batch" else batch_size
        super().__init__(args, w, comm, rows, n_positions, device, dtype)
        self.layout, self.rank, self.cols = layout, w.shard.rank, w.shard.qkv_cols

    def qkv(self, L, h):
        if self.layout.kv_mode == "heads":
            return super().qkv(L, h)
        qc, kc, _ = self.cols
        qkv = L.wqkv.linear(h, L.bqkv)
        q, k, v = qkv[..., :qc], qkv[..., qc:qc + kc], qkv[..., qc + kc:]
        if self.layout.kv_mode == "gather":  # this rank's K/V columns -> its group's whole KV head
            k = self.comm.all_gather(k, dim=-1, group=self.comm.kv_group)
            v = self.comm.all_gather(v, dim=-1, group=self.comm.kv_group)
        return q, k, v

    def attention(self, q, k, v, kv, cos, sin, slots, kv_len, attn_mask):
        if self.layout.kv_mode != "batch":
            return super().attention(q, k, v, kv, cos, sin, slots, kv_len, attn_mask)
        # all batch rows x this rank's columns -> this rank's rows x all heads; attend; and back
        q, k, v = (self.comm.all_to_all(t, split_dim=0, concat_dim=-1) for t in (q, k, v))
        b = q.shape[0]
        rows = slice(self.rank * b, (self.rank + 1) * b)
        o = super().attention(q, k, v, kv, cos[rows], sin[rows], slots, kv_len, attn_mask[rows])
        return self.comm.all_to_all(o, split_dim=-1, concat_dim=0)
