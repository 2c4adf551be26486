"""The ops between a step's matmuls in C (``csrc/decode_ops.c``, part of ``clib``): RMSNorm, RoPE on q and k,
attention of a few query rows over the KV cache, SwiGLU.

What a layer does besides its matmuls is a dozen small ATen ops, each a few microseconds of dispatch for a few
hundred floats of work; each function here is one call instead. The model runs them through ``ops.FusedOps``
where its build chose them (``$NEURON_NB_OPS``, :func:`planned`; :func:`unfit_dims` checks the model's dims once),
outside :func:`tracing`, and for the attention where :func:`attention_fits`; anything else runs torch's ops.

Numerics: f32 throughout; sums in a fixed order per output element, one thread each, so the bits do not depend on
the thread count or on the other rows of a batch; exp is a polynomial of about 1 ulp. Against torch's ops they agree
within f32 rounding, not bitwise: a model keeps one choice per build and a saved model records it.
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


def unfit_dims(hidden: int, head_dim: int, ffn: int) -> str | None:
    """Why a model with these (per-rank) dims cannot run the C ops, or None. The C code loops over lengths in steps of 8
    floats and rotates half a head at a time."""
    if hidden % ALIGN or ffn % ALIGN:
        return f"hidden size {hidden} and MLP width {ffn} must be multiples of {ALIGN}"
    if head_dim % (2 * ALIGN):
        return f"head_dim {head_dim} must be a multiple of {2 * ALIGN}"
    return None


def tracing() -> bool:
    """Whether ``torch.export`` (or ``torch.compile``) is tracing: its tensors have no storage for C, and a graph must
    hold ATen ops only, so the model runs torch's ops then."""
    return torch.compiler.is_exporting() or torch.compiler.is_compiling()


# The model (helpers.engine.model.Transformer) calls these on its own f32 CPU tensors, of dims unfit_dims accepted,
# outside tracing(): they check no dtype or device, only what a step can change.
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm in f32 over the last dim."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.shape[-1]
    clib.load().ops_rms_norm(x.data_ptr(), weight.data_ptr(), eps, x.numel() // n, n, out.data_ptr(),
                             torch.get_num_threads())
    return out


def rope_qk_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, head_dim: int) -> bool:
    """RoPE in place on ``q`` and ``k`` [B, T, heads * head_dim] (``cos`` / ``sin_signed`` contiguous [B, T, 1,
    head_dim], as ``helpers.engine.model.apply_rope`` takes them), one call when ``k``'s heads follow ``q``'s in one
    buffer (slices of the fused QKV output). False, and nothing done, unless both have a contiguous last dim and
    evenly strided rows."""
    B, T, width = q.shape
    qs, ks = q.stride(), k.stride()
    if not (qs[2] == ks[2] == 1 and qs[0] == T * qs[1] and ks[0] == T * ks[1] and cos.is_contiguous()):
        return False
    lib, rows = clib.load(), B * T
    if qs == ks and k.data_ptr() == q.data_ptr() + 4 * width:
        lib.ops_rope(q.data_ptr(), rows, qs[1], (width + k.shape[-1]) // head_dim, head_dim, cos.data_ptr(),
                     sin_signed.data_ptr())
    else:
        for t, ts in ((q, qs), (k, ks)):
            lib.ops_rope(t.data_ptr(), rows, ts[1], t.shape[-1] // head_dim, head_dim, cos.data_ptr(),
                         sin_signed.data_ptr())
    return True


def attention_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> bool:
    """Whether :func:`attention` runs this step: few queries (a decode or verification step; prefill's many run
    torch's flash attention), a bool mask, and K / V (the cache's views) with a contiguous head dim."""
    return (q.shape[0] * q.shape[1] <= ATTN_MAX_QUERIES and isinstance(mask, torch.Tensor)
            and mask.dtype == torch.bool and k.stride(-1) == 1 and v.stride(-1) == 1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, head_kv: torch.Tensor,
              head_dim: int) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) where mask) v`` -> [B, T, heads * d]: ``q`` [B, T, heads * d], ``k`` / ``v``
    [B, kv_heads, S, d] (any strides but the last: 1, :func:`attention_fits`), ``mask`` bool [B, 1, T, S] (or
    broadcastable), ``head_kv`` int32 [heads]: the kv head of each query head. A query that sees no position gets
    zeros."""
    B, T, width = q.shape
    S = k.shape[2]
    m = mask.expand(B, 1, T, S)[:, 0]
    if m.stride(-1) != 1:
        m = m.contiguous()
    q = q if q.stride(-1) == 1 else q.contiguous()
    qs, ks, vs, ms = q.stride(), k.stride(), v.stride(), m.stride()
    out = torch.empty(B, T, width, dtype=torch.float32)
    clib.load().ops_attention(q.data_ptr(), qs[0], qs[1], k.data_ptr(), ks[0], ks[1], ks[2], v.data_ptr(), vs[0],
                              vs[1], vs[2], m.data_ptr(), ms[0], ms[1], head_kv.data_ptr(), B, T, width // head_dim,
                              head_dim, S, head_dim ** -0.5, out.data_ptr(), torch.get_num_threads())
    return out


def swiglu(gu: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` for ``g, u = gu.chunk(2, -1)`` (the gated MLP's fused gate/up output)."""
    gu = gu.contiguous()
    n = gu.shape[-1] // 2
    out = torch.empty(*gu.shape[:-1], n, dtype=torch.float32)
    clib.load().ops_swiglu(gu.data_ptr(), gu.numel() // (2 * n), n, out.data_ptr(), torch.get_num_threads())
    return out
