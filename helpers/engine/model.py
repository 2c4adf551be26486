"""The model: one rank's forward pass over a fixed-shape KV cache, in plain PyTorch (gpt-fast style). A layer is
two blocks cut at the tensor-parallel all-reduces, ``attn_block`` and ``mlp_block``: the units ``helpers.artifacts``
compiles per bucket. What runs between the matmuls is the model's ``ops`` (:class:`TorchOps`)."""
from __future__ import annotations

import copy
from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .config import ModelArgs
from .kv_cache import KVCache
from .weights import LayerWeights, RankWeights


class Comm:
    """Collectives of one tensor-parallel group; this one is the single-rank group."""
    rank = 0
    world_size = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return x


def rope_inv_freq(args: ModelArgs) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and scaling, from transformers' own RoPE functions (llama3, yarn, ...)."""
    rope = args.hf_config.get("rope_parameters") or args.hf_config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        d = args.head_dim
        return 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float) / d)), 1.0
    cfg = AutoConfig.for_model(**args.hf_config)
    return ROPE_INIT_FUNCTIONS[rope_type](cfg, torch.device("cpu"))  # device: a required argument before transformers 5


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """transformers' ``x * cos + rotate_half(x) * sin`` with the sign of rotate_half folded into
    ``sin_signed`` = cat(-sin[:D/2], sin[D/2:]): three kernels instead of six."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.addcmul(x * cos, torch.cat((x2, x1), dim=-1), sin_signed)


class Linear:
    """A [out, in] matrix that owns its matmul, as torch's ``nn.Linear``: ``linear(x, b)`` is ``F.linear``. The model
    calls every matrix alike; the CPU speed layer's ``CpuWeight`` and int8's ``QuantWeight`` are the other kinds."""

    def __init__(self, dense: torch.Tensor):
        self.dense = dense

    @property
    def shape(self):
        return self.dense.shape

    @property
    def nbytes(self) -> int:
        return self.dense.nbytes

    def linear(self, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, self.dense, b)

    def traced(self, t: torch.Tensor) -> "Linear":
        """The same kind of weight over ``t`` (a graph input while ``torch.export`` traces)."""
        return Linear(t)


class KVHeads(NamedTuple):
    """The KV head of each query head: as the C attention reads it (``per_query``, int32 [n_q]) and as torch's
    attention gathers K/V (``gather``: a slice, no copy, where query heads share KV heads in order; else an index)."""
    per_query: torch.Tensor
    gather: slice | torch.Tensor


class TorchOps:
    """The ops between a step's matmuls, in torch, one path each (``helpers.engine.cpu.ops`` runs them in C)."""
    record = None  # what a saved model keeps of its ops (the speed layer's choice; None: nothing to check at load)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """As transformers' LlamaRMSNorm: statistics in f32, scale in the input dtype (in f32: torch's fused one)."""
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, eps)
        h = x.float()
        return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    def rope(self, q, k, cos, sin_signed, head_dim: int):
        """``q`` / ``k`` [B, T, heads * head_dim] rotated (``apply_rope``), same shapes."""
        B, T, _ = q.shape
        return tuple(apply_rope(t.reshape(B, T, -1, head_dim), cos, sin_signed).reshape(B, T, -1) for t in (q, k))

    def attention(self, q, k, v, mask, kv_heads: KVHeads, head_dim: int) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) where mask) v: q [B, T, H * d], k / v [B, kv_heads, S, d] -> [B, T, H * d]."""
        B, T, _ = q.shape
        q = q.reshape(B, T, -1, head_dim).transpose(1, 2)
        k, v = k[:, kv_heads.gather], v[:, kv_heads.gather]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return o.transpose(1, 2).reshape(B, T, -1)

    def swiglu(self, gu: torch.Tensor) -> torch.Tensor:
        """``silu(g) * u`` for ``g, u = gu.chunk(2, -1)`` (the fused gate/up output)."""
        g, u = gu.chunk(2, dim=-1)
        return F.silu(g) * u


class Transformer:
    """One rank's forward pass over a fixed-shape KV cache: ``forward(tokens [B,T], rope_pos [B,T], slots [T], kv_len,
    mask [B,T,kv_len], logit_idx)`` writes this step's K/V at ``slots`` and attends over positions ``[0, kv_len)``.
    ``cache_cls``: the kind of KV cache (``helpers.serving`` passes its own); ``ops``: what runs between the matmuls."""

    def __init__(self, args: ModelArgs, w: RankWeights, comm: Comm, batch_size: int, n_positions: int,
                 device: torch.device, dtype: torch.dtype, cache_cls: type[KVCache] = KVCache):
        self.args, self.w, self.comm = args, w, comm
        w.relayout(Linear)  # every matrix owns its matmul (the build may swap in faster or int8 kinds)
        self.dtype, self.device = dtype, device
        self.ops = TorchOps()
        group = w.kv_group if w.kv_group is not None else torch.arange(w.n_q) // max(1, w.n_q // w.n_kv)
        self.kv_heads = KVHeads(group.to(device=device, dtype=torch.int32),
                                slice(None) if w.kv_group is None else w.kv_group.to(device))
        inv_freq, scale = rope_inv_freq(args)
        pos = torch.arange(n_positions, dtype=torch.float)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * scale).to(device=device, dtype=dtype)
        self.sin = (emb.sin() * scale).to(device=device, dtype=dtype)
        half = args.head_dim // 2
        self.sin_signed = torch.cat((-self.sin[:, :half], self.sin[:, half:]), dim=-1)
        self.cache = cache_cls.zeros((args.n_layers, batch_size, w.n_kv, n_positions, args.head_dim), dtype, device)

    def with_cache(self, cache: KVCache) -> "Transformer":
        """This model (same weights, kernels and RoPE tables, shared) over ``cache``."""
        out = copy.copy(self)
        out.cache = cache
        return out

    @property
    def max_positions(self) -> int:
        """The positions its RoPE tables cover (``n_positions``)."""
        return self.cos.shape[0]

    def kv_cache_bytes(self) -> int:
        return self.cache.nbytes

    def qkv(self, L: LayerWeights, h):
        """Column-parallel fused projection -> q, k, v, each [B, T, heads * head_dim] of this rank.
        Seam: ``helpers.parallel`` splits by its layout's columns (SHARD_OVER_BATCH, ALL_GATHER_HEADS)."""
        nq, nkv = self.w.n_q * self.args.head_dim, self.w.n_kv * self.args.head_dim
        qkv = L.wqkv.linear(h, L.bqkv)
        return qkv[..., :nq], qkv[..., nq:nq + nkv], qkv[..., nq + nkv:]

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, weight, self.args.rms_norm_eps)

    def attention(self, q, k, v, kv: KVCache, cos, sin, slots, kv_len: int, attn_mask):
        """RoPE (``cos`` / ``sin`` [B, T, 1, D], ``sin`` sign-folded), write K/V at ``slots`` of the layer's cache
        ``kv``, attend over [0, kv_len) -> [B, T, n_q * D]. Seam: ``helpers.parallel`` exchanges rows and heads."""
        B, T, _ = q.shape
        D = self.args.head_dim
        q, k = self.ops.rope(q, k, cos, sin, D)
        k, v = kv.update(slots, *(t.reshape(B, T, -1, D).transpose(1, 2) for t in (k, v)), kv_len)
        return self.ops.attention(q, k, v, attn_mask, self.kv_heads, D)

    def attn_block(self, x, L: LayerWeights, kv: KVCache, cos, sin, slots, kv_len: int, attn_mask):
        """One layer's attention from its input norm to o_proj, up to the all-reduce (a graph in helpers.artifacts)."""
        h = self.norm(x, L.ln1)
        q, k, v = self.qkv(L, h)
        return L.wo.linear(self.attention(q, k, v, kv, cos, sin, slots, kv_len, attn_mask))

    def mlp_block(self, x, L: LayerWeights):
        """One layer's gated MLP up to its all-reduce."""
        return L.w2.linear(self.ops.swiglu(L.w13.linear(self.norm(x, L.ln2))))

    @torch.inference_mode()
    def forward(self, tokens, rope_pos, slots, kv_len: int, mask, logit_idx=None, blocks=None):
        """``blocks`` = (attn, mlp) callables with the signatures of ``attn_block`` / ``mlp_block``:
        the compiled per-bucket graphs of helpers.artifacts; None = eager. The all-reduces stay here,
        between blocks, so a compiled graph of a heads-sharded layout contains no collective."""
        w = self.w
        B, T = tokens.shape
        attn, mlp = blocks or (self.attn_block, self.mlp_block)
        x = F.embedding(tokens, w.embed)
        cos = self.cos[rope_pos].unsqueeze(2)  # [B,T,1,D]: RoPE is applied before the head transpose
        sin = self.sin_signed[rope_pos].unsqueeze(2)
        attn_mask = mask.unsqueeze(1)
        for i, L in enumerate(w.layers):
            o = self.comm.all_reduce(attn(x, L, self.cache.layer(i), cos, sin, slots, kv_len, attn_mask))
            x = x + o if L.bo is None else x + o + L.bo
            x = x + self.comm.all_reduce(mlp(x, L))
        if logit_idx is not None:
            x = x[torch.arange(B, device=x.device)[:, None], logit_idx]
        x = self.norm(x, w.norm)
        logits = self.comm.all_gather(w.lm_head.linear(x), dim=-1)
        return logits[..., : w.vocab_size].float()


def build_mask(slots: torch.Tensor, start_ids: torch.Tensor, kv_len: int, window: int | None) -> torch.Tensor:
    """[B, T, kv_len] bool: a query at cache slot i sees slot j iff start_b <= j <= i (and i - j < window)."""
    j = torch.arange(kv_len, device=slots.device)
    i = slots[:, None]
    vis = (j[None, :] <= i)
    if window:
        vis = vis & (i - j[None, :] < window)
    return vis[None, :, :] & (j[None, None, :] >= start_ids[:, None, None])

