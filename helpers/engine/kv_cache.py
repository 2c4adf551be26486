"""The KV cache: K and V [layers, batch, kv_heads, n_positions, head_dim], preallocated for the whole
``n_positions`` as on Neuron, and the one place that writes them (gpt-fast's ``KVCache.update``). Serving layouts
subclass the cache, not the attention (``helpers.serving``: a row per sequence, blocks of a shared pool)."""
from __future__ import annotations

import copy

import torch


class KVCache:
    """K and V of a model's layers (or of one layer: ``layer(i)``), written only by :meth:`update`."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v = k, v

    @classmethod
    def zeros(cls, shape: tuple[int, ...], dtype: torch.dtype, device, **kwargs) -> "KVCache":
        """A cache of ``shape`` = (layers, batch, kv_heads, positions, head_dim), zero-filled; ``kwargs`` go to
        the subclass's constructor."""
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device),
                   **kwargs)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def layer(self, i: int) -> "KVCache":
        """Layer ``i``'s cache: the same object's kind and settings over ``k[i]`` / ``v[i]`` (views)."""
        out = copy.copy(self)
        out.k, out.v = self.k[i], self.v[i]
        return out

    def update(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len: int):
        """Write ``k``/``v`` [B, kv_heads, T, D] at cache positions ``slots`` [T] (shared by the rows) of this
        layer's cache [B, kv_heads, n_positions, D]; return the cache over positions [0, kv_len)."""
        self.k.index_copy_(2, slots, k)
        self.v.index_copy_(2, slots, v)
        return self.k[:, :, :kv_len], self.v[:, :, :kv_len]
