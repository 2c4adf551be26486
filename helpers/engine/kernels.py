"""CPU matmul kernels for f32 decode, chosen per machine by timing them on the model's own weights.

A decode step reads every weight once, so on CPU it is bound by memory bandwidth and by how each
matmul streams its weight. :func:`use_cpu_kernels` (called by the builders, ``to_neuron()`` and a
tensor-parallel rank's build, for f32 on CPU; ``ci/benchmark.py`` reads the figures) stores the
weights column-major (:func:`decode_layout`), times the kernels once per process and thread count
(:func:`tune_matmuls`) and makes :func:`cpu_linear` the model's linear. ``$NEURON_NB_GEMV`` /
``$NEURON_NB_GEMM`` force a kernel (reproducible figures).
"""
from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from .model import Transformer
from .weights import RankWeights


def column_major(t: torch.Tensor) -> torch.Tensor:
    """The same [out, in] tensor stored [in, out] in memory (shape unchanged, strides swapped)."""
    return t.t().contiguous().t()


def decode_layout(w: RankWeights) -> None:
    """Store f32 weights column-major for :func:`cpu_linear` (decode reads every weight once per token).

    transformers-neuronx stores its weights transposed too (``llama/model.py`` ``load_weights``:
    ``q_proj.weight.detach().T``). Shapes are unchanged, so every seam that takes [out, in] weights
    (``Transformer.linear``, quantizers, sharding, serialization) still works.
    """
    for L in w.layers:
        L.wqkv, L.wo, L.w13, L.w2 = (column_major(t) for t in (L.wqkv, L.wo, L.w13, L.w2))
    tied = w.lm_head is w.embed
    w.lm_head = column_major(w.lm_head)
    if tied:  # one tensor serves both (an embedding row gather reads 576 strided floats: cheap)
        w.embed = w.lm_head


_MKLDNN_LINEAR = (getattr(torch.ops.mkldnn, "_linear_pointwise", None)
                  if torch.backends.mkldnn.is_available() else None)

MATMUL_KERNELS = {"one_row": ("split-k", "mkl"), "rows": ("onednn", "mkl")}
MATMUL_ENV = {"one_row": "NEURON_NB_GEMV", "rows": "NEURON_NB_GEMM"}  # force a kernel (reproducible figures)
MATMUL_TUNE_MIN_BYTES = 32 << 20  # weights that fit in cache say nothing about DRAM-bound decode
MATMUL_TUNE_ROWS = 8  # several rows: speculative verification (k + 1), batch 8
matmul_tuning: dict[int, dict] = {}  # threads -> {case: {"kernel", "ms": {kernel: ms per pass}}, "bytes", "n_rows"}


def split_k_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, n: int) -> torch.Tensor:
    """One row times a column-major [out, in] weight, the reduction split into ``n`` contiguous
    blocks of the [in, out] storage (views, no copy), one ``bmm`` batch per thread, then summed."""
    k = x.shape[-1]
    y = torch.bmm(x.reshape(n, 1, k // n), w.t().reshape(n, k // n, -1)).sum(0)  # [1, out]
    y = y.view(x.shape[:-1] + y.shape[-1:])
    return y if b is None else y + b


def onednn_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    # scalars=[None], not []: torch.export.save cannot serialize an empty scalar list
    # ("Empty list with type number nyi"); with attr "none" the scalars are unused.
    return _MKLDNN_LINEAR(x, w, b, "none", [None], "")


def matmul_kernel(case: str, threads: int | None = None) -> str:
    """The kernel :func:`cpu_linear` uses for ``case`` ("one_row" or "rows") at this thread count:
    ``$NEURON_NB_GEMV`` / ``$NEURON_NB_GEMM`` if set, else what :func:`tune_matmuls` measured, else
    split-k / oneDNN."""
    forced = os.environ.get(MATMUL_ENV[case])
    if forced:
        if forced not in MATMUL_KERNELS[case]:
            raise ValueError(f"{MATMUL_ENV[case]}={forced!r}: use one of {MATMUL_KERNELS[case]} or unset it")
        return forced
    n = torch.get_num_threads() if threads is None else threads
    return matmul_tuning.get(n, {}).get(case, {}).get("kernel", MATMUL_KERNELS[case][0])


def decode_matrices(w: RankWeights) -> list[torch.Tensor]:
    """The matrices a decode step streams, in the order it reads them (per layer, then the LM head)."""
    return [t for L in w.layers for t in (L.wqkv, L.wo, L.w13, L.w2)] + [w.lm_head]


def matmul_pass_seconds(linear, weights: list[torch.Tensor], xs: dict, repeats: int = 1, pause=None) -> float:
    """Best of ``repeats`` passes of ``linear(xs[in_features], w)`` over ``weights``, calling
    ``pause()`` after each matmul if given."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for t in weights:
            linear(xs[t.shape[1]], t)
            if pause is not None:
                pause()
        best = min(best, time.perf_counter() - t0)
    return best


def tune_matmuls(weights: list[torch.Tensor], repeats: int = 3) -> dict | None:
    """Choose :func:`cpu_linear`'s kernels once per process and thread count by timing them on the
    model's own column-major weights (one pass over all of them per try, best of ``repeats``), for one
    row and for MATMUL_TUNE_ROWS rows. The winners depend on the CPU (all 30 SmolLM2 layers + LM head):

    - 2-core AMD EPYC, MKL's GEMV streams 12-20 GB/s: split-k 23 ms per pass against MKL's 32 ms;
      oneDNN ~2x MKL for 5-8 rows (30/45 ms against 65/86 ms).
    - 2-core Intel Xeon (Sapphire Rapids): MKL ahead in both: 19.1 against split-k 20.9 ms;
      34 against oneDNN 40 ms at 8 rows, 46 against 71 ms at 32.

    Only speed differs: every kernel computes F.linear (within f32 rounding). Skipped below
    MATMUL_TUNE_MIN_BYTES or when both kernels are forced."""
    n = torch.get_num_threads()
    weights = [t for t in weights if t.dim() == 2 and t.dtype == torch.float32 and t.stride(0) == 1]
    size = sum(t.numel() * t.element_size() for t in weights)
    if n in matmul_tuning or size < MATMUL_TUNE_MIN_BYTES or all(os.environ.get(e) for e in MATMUL_ENV.values()):
        return matmul_tuning.get(n)
    candidates = {"one_row": {"mkl": lambda x, t: F.linear(x, t)}, "rows": {"mkl": lambda x, t: F.linear(x, t)}}
    if n > 1 and all(t.shape[1] % n == 0 for t in weights):
        candidates["one_row"]["split-k"] = lambda x, t: split_k_linear(x, t, None, n)
    if _MKLDNN_LINEAR is not None:
        candidates["rows"]["onednn"] = onednn_linear
    out = {"bytes": size, "n_rows": MATMUL_TUNE_ROWS}
    with torch.inference_mode():
        for case, rows in (("one_row", 1), ("rows", MATMUL_TUNE_ROWS)):
            xs = {t.shape[1]: torch.randn(rows, t.shape[1]) for t in weights}
            best = {name: float("inf") for name in candidates[case]}
            for _ in range(repeats + 1):  # the first round warms up; kernels alternate per round
                for name, fn in candidates[case].items():
                    best[name] = min(best[name], matmul_pass_seconds(fn, weights, xs))
            out[case] = {"kernel": min(best, key=best.get), "ms": {k: round(v * 1e3, 2) for k, v in best.items()}}
    matmul_tuning[n] = out
    return out


def cpu_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for f32 weights stored column-major on CPU (:func:`decode_layout`), by the kernel
    :func:`tune_matmuls` measured fastest on this machine (``ci/benchmark.py`` prints the figures):

    - one row (batch-1 decode): split-k (:func:`split_k_linear`) or MKL's GEMV (``F.linear``);
    - several rows (speculative verification, batch > 1, prefill): oneDNN's linear
      (``mkldnn._linear_pointwise``, what torch.compile's CPU backend emits) or MKL's GEMM.

    Any other weight (row-major, bf16, int8 storage) goes to ``F.linear``.
    """
    if w.stride(0) != 1 or w.dtype != torch.float32 or w.dim() != 2:
        return F.linear(x, w, b)
    k = x.shape[-1]
    if x.numel() == k:  # (cheap checks only: this runs ~120 times per token)
        n = torch.get_num_threads()
        if n > 1 and k % n == 0 and matmul_kernel("one_row", n) == "split-k":
            return split_k_linear(x, w, b, n)
        return F.linear(x, w, b)
    if _MKLDNN_LINEAR is not None and matmul_kernel("rows") == "onednn":
        return onednn_linear(x, w, b)
    return F.linear(x, w, b)


def use_cpu_kernels(tr: Transformer) -> Transformer:
    """Run ``tr``'s f32 matmuls on CPU with :func:`cpu_linear`: weights column-major, kernels timed on them
    (once per process and thread count). Only speed changes: every kernel computes ``F.linear``."""
    decode_layout(tr.w)
    tr.linear = cpu_linear
    tune_matmuls(decode_matrices(tr.w))
    return tr
