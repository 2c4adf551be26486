"""The ops between a step's matmuls in C (``csrc/decode_ops.c``, part of ``helpers.engine.clib``): RMSNorm, RoPE on q
and k, attention of a few query rows over the KV cache, SwiGLU.

A decode step's matmuls read the weights at close to memory bandwidth; what else a layer does is a dozen small ATen
ops (``aten::rms_norm`` alone is six on CPU, ``scaled_dot_product_attention`` converts its mask and transposes),
each a few microseconds of dispatch for a few hundred floats of work: about a third of a one-row step before this
module. Each function here is one call instead. The model (``helpers.engine.model.Transformer``) calls them where
:func:`fits` says the tensors allow and its build chose them (``ops="fused"`` in its recorded kernels,
``helpers.engine.kernel_choice``); anything else runs torch's ops.

Numerics: f32 throughout; sums in a fixed order per output element, one thread each, so the bits do not depend on
the thread count or on the other rows of a batch; exp is a polynomial of about 1 ulp. Against torch's ops they agree
within f32 rounding (``tests/test_fused_ops.py``), not bitwise: a model keeps one choice per build and a saved model
records it.
"""
from __future__ import annotations

import os

import torch

from . import clib

CHOICES = ("fused", "torch")  # the ops between the matmuls: this module's C, or torch's
ENV = "NEURON_NB_OPS"  # forces one of CHOICES
ALIGN = 8  # every length the C code loops over is a multiple of this (AVX2 lanes)
ATTN_MAX_QUERIES = 32  # queries per step (rows x tokens) up to which the C attention runs; prefill uses torch's


def available() -> bool:
    return clib.load() is not None


def forced() -> str | None:
    """The choice ``$NEURON_NB_OPS`` forces, or None; refuses an unknown one, or "fused" where the C library is
    unavailable, by name."""
    value = os.environ.get(ENV)
    if not value:
        return None
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r}: use one of {CHOICES} or unset it")
    if value == "fused" and not available():
        raise ValueError(f"{ENV}='fused': the C library is unavailable here ({clib.unavailable_reason()}); "
                         "unset it")
    return value


def planned() -> str:
    """What a build here runs between its f32 matmuls on CPU: the forced choice, else "fused" where the C library
    loads (one call instead of a dozen ATen ops; ``python ci/benchmark.py`` times both), else "torch"."""
    return forced() or ("fused" if available() else "torch")


def fits(*tensors: torch.Tensor) -> bool:
    """Whether the C ops can take these tensors: f32 on CPU with real storage (not traced by ``torch.export``)."""
    return (not torch.compiler.is_compiling() and not torch.compiler.is_exporting()
            and all(t.dtype == torch.float32 and t.device.type == "cpu"
                    and not isinstance(t, torch._subclasses.FakeTensor) for t in tensors))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm in f32 over the last dim (a multiple of 8)."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    out = torch.empty_like(x2)
    clib.load().ops_rms_norm(x2.data_ptr(), weight.contiguous().data_ptr(), eps, x2.shape[0], n, out.data_ptr(),
                             torch.get_num_threads())
    return out.view(x.shape)


def rope_(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, head_dim: int) -> torch.Tensor:
    """RoPE in place on ``x`` [B, T, heads * head_dim] (last dim contiguous, rows evenly strided: a slice of the fused
    QKV output), ``cos`` / ``sin_signed`` [B, T, ..., head_dim] (``helpers.engine.model.apply_rope``)."""
    B, T, width = x.shape
    c = cos.reshape(B * T, head_dim).contiguous()
    s = sin_signed.reshape(B * T, head_dim).contiguous()
    clib.load().ops_rope(x.data_ptr(), B * T, x.stride(1), 0, width // head_dim, head_dim, c.data_ptr(), s.data_ptr())
    return x


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, head_kv: torch.Tensor,
              head_dim: int) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) where mask) v`` -> [B, T, heads * d]: ``q`` [B, T, heads * d], ``k`` / ``v``
    [B, kv_heads, S, d] (any strides but the last), ``mask`` bool [B, 1, T, S] (or broadcastable), ``head_kv``
    int32 [heads]: the kv head of each query head. A query that sees no position gets zeros."""
    B, T, width = q.shape
    S = k.shape[2]
    m = mask.expand(B, 1, T, S)[:, 0]
    if m.stride(-1) != 1:
        m = m.contiguous()
    out = torch.empty(B, T, width, dtype=torch.float32)
    clib.load().ops_attention(
        q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1), k.stride(2),
        v.data_ptr(), v.stride(0), v.stride(1), v.stride(2), m.data_ptr(), m.stride(0), m.stride(1),
        head_kv.data_ptr(), B, T, width // head_dim, head_dim, S, head_dim ** -0.5, out.data_ptr(),
        torch.get_num_threads())
    return out


def norm_fits(x: torch.Tensor) -> bool:
    return x.shape[-1] % ALIGN == 0 and fits(x)


def rope_fits(q: torch.Tensor, k: torch.Tensor, head_dim: int) -> bool:
    """Whether :func:`rope_` takes ``q`` and ``k`` [B, T, heads * d]: half a head a multiple of 8, the last dim
    contiguous and the rows evenly strided (a slice of one projection's output)."""
    return (head_dim % (2 * ALIGN) == 0 and fits(q, k)
            and all(t.stride(-1) == 1 and t.stride(0) == t.shape[1] * t.stride(1) for t in (q, k)))


def attention_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> bool:
    """Whether :func:`attention` takes these: few queries (a decode or verification step), a bool mask, the last
    dims contiguous."""
    return (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and q.shape[0] * q.shape[1] <= ATTN_MAX_QUERIES
            and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and k.shape[-1] % ALIGN == 0
            and fits(q, k, v))


def swiglu_fits(gu: torch.Tensor) -> bool:
    return gu.shape[-1] % (2 * ALIGN) == 0 and fits(gu)


def swiglu(gu: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` for ``g, u = gu.chunk(2, -1)`` (the gated MLP's fused gate/up output)."""
    n = gu.shape[-1] // 2
    g2 = gu.reshape(-1, 2 * n).contiguous()
    out = torch.empty(g2.shape[0], n, dtype=torch.float32)
    clib.load().ops_swiglu(g2.data_ptr(), g2.shape[0], n, out.data_ptr(), torch.get_num_threads())
    return out.view(*gu.shape[:-1], n)
