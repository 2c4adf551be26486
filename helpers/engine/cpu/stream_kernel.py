"""The "stream" matmul kernel for steps over a few rows: every weight read once for all rows, at the speed
a one-row step reads it (``csrc/stream_linear.c``, C with AVX2 intrinsics in the C library, ``clib``).

Library GEMMs stream a weight and then compute on it, one after the other, so a step over a few rows costs
well over a one-row step. This kernel stores each weight in blocks of 16 output columns
(:func:`stream_layout`), runs six rows per pass over a block (AVX2; up to 16 with AVX-512, :func:`use_avx512`)
and prefetches 4 KB ahead, so reading the next block overlaps the arithmetic on this one. ``python
ci/benchmark.py`` times it against the other kernels on the machine it runs on.
"""
from __future__ import annotations

import torch

from . import clib

BLOCK = 16  # output columns per block: two AVX2 registers


def use_avx512(on: bool = True) -> bool:
    """Run the AVX-512 path for more than 6 rows (up to 16 per pass over a block) where the CPU has it, or the AVX2
    one (6 rows per pass): the same sums in the same order, so the same bits (``tests/test_stream_kernel.py``
    checks). Returns whether the AVX-512 path now runs; needs ``clib.load()``."""
    return bool(clib.load().stream_use_avx512(int(on)))


def stream_shape(w: torch.Tensor) -> tuple[int, int, int] | None:
    """The shape of :func:`stream_layout` (w): [out / 16, in, 16]; None if ``out`` is not a multiple of 16."""
    n, k = w.shape
    return None if n % BLOCK else (n // BLOCK, k, BLOCK)


def stream_layout(w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """``w`` [out, in] (any strides) as [out / 16, in, 16] contiguous (written into ``out`` if given, a contiguous
    tensor of :func:`stream_shape`); None if ``out`` is not a multiple of 16."""
    shape = stream_shape(w)
    if shape is None:
        return None
    blocks = w.reshape(shape[0], BLOCK, shape[1]).transpose(1, 2)
    return blocks.contiguous() if out is None else out.copy_(blocks)


def stream_linear(x: torch.Tensor, wp: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)`` for f32 ``x`` [..., in] on CPU, ``wp`` = :func:`stream_layout` (w); needs ``clib.load()``."""
    lib = clib.load()
    k = x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    n = wp.shape[0] * BLOCK
    if wp.shape[1] != k or x2.dtype != torch.float32 or wp.dtype != torch.float32:
        raise ValueError(f"stream_linear: x [..., {k}] {x2.dtype} against a packed [{n}, {wp.shape[1]}] {wp.dtype} weight")
    y = torch.empty(x2.shape[0], n, dtype=torch.float32)
    lib.stream_linear(x2.data_ptr(), x2.shape[0], k, wp.data_ptr(), n, y.data_ptr(), torch.get_num_threads())
    y = y.view(*x.shape[:-1], n)
    return y if b is None else y.add_(b)
