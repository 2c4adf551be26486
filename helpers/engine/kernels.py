"""CPU matmul kernels for f32 steps, chosen per machine by timing them on the model's own weights.

A decode step reads every weight once, so on CPU it is bound by memory bandwidth and by how each
matmul streams its weight; a step over a few rows (batch decode, speculative verification) reads
the same weights and should cost about as much. :func:`use_cpu_kernels` (called by the builders,
``to_neuron()`` and a tensor-parallel rank's build, for f32 on CPU; ``ci/benchmark.py`` reads the
figures) stores the weights column-major (:func:`decode_layout`), keeps the copies that the "stream"
kernel (``helpers.engine.stream``: a few rows at the cost of one) and oneDNN's blocked layout read
(:func:`pack_weights`), times the kernels once per process and thread count (:func:`tune_matmuls`), drops
the copies no case chose and makes :func:`cpu_linear` the model's linear. ``$NEURON_NB_GEMV`` /
``$NEURON_NB_GEMM`` force a kernel (reproducible figures).
"""
from __future__ import annotations

import os
import time
import weakref

import torch
import torch.nn.functional as F

from . import stream
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
_MKLDNN_REORDER = (getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
                   if _MKLDNN_LINEAR is not None else None)

# The first available kernel of each case is the default where nothing was timed (weights below MATMUL_TUNE_MIN_BYTES).
MATMUL_KERNELS = {"one_row": ("split-k", "stream", "packed", "mkl"), "rows": ("stream", "packed", "onednn", "mkl")}
MATMUL_ENV = {"one_row": "NEURON_NB_GEMV", "rows": "NEURON_NB_GEMM"}  # force a kernel (reproducible figures)
MATMUL_TUNE_MIN_BYTES = 32 << 20  # weights that fit in cache say nothing about DRAM-bound decode
MATMUL_TUNE_ROWS = 8  # several rows: speculative verification (k + 1), batch 8
PACK_ROWS = 16  # oneDNN's batch-size hint for the blocked layout: 16 to 1024 gave the same speed for 1 to 1024 rows
COPIES = ("stream", "packed")  # kernels that read their own copy of each weight (built by pack_weights)
matmul_tuning: dict[int, dict] = {}  # threads -> {case: {"kernel", "ms": {kernel: ms per pass}}, "bytes", "n_rows"}
_copies: dict[str, dict[int, tuple[weakref.ref, torch.Tensor]]] = {k: {} for k in COPIES}  # id(weight) -> (weight, copy)


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


# -- the kernels' own copies of the weights ---------------------------------------------------------
def kernel_available(kernel: str) -> bool:
    if kernel == "stream":
        return stream.load() is not None
    if kernel == "packed":
        return _MKLDNN_REORDER is not None
    if kernel == "onednn":
        return _MKLDNN_LINEAR is not None
    return True


def pack_weights(weights: list[torch.Tensor], kind: str = "packed") -> int:
    """Keep a copy of each f32 CPU weight in the layout kernel ``kind`` reads: "packed", oneDNN's blocked layout
    (``mkldnn._reorder_linear_weight``, what Inductor's CPU freezing does to linear weights); "stream", blocks of
    16 output columns (``helpers.engine.stream``). Either streams the weight in the order its micro-kernel
    consumes it, with no packing per call. A copy lives as long as its weight (nothing mutates weights in place
    after the build) and costs as many bytes again. Returns the bytes copied (0 where the kernel is unavailable)."""
    if not kernel_available(kind):
        return 0
    added, table = 0, _copies[kind]
    for t in weights:
        if t.dim() == 2 and t.dtype == torch.float32 and t.device.type == "cpu" and packed_weight(t, kind) is None:
            copy = _MKLDNN_REORDER(t, PACK_ROWS) if kind == "packed" else stream.stream_layout(t)
            if copy is None:  # "stream": out not a multiple of 16; cpu_linear falls back for this weight
                continue
            key = id(t)
            table[key] = (weakref.ref(t, lambda _, key=key, table=table: table.pop(key, None)), copy)
            added += t.numel() * t.element_size()
    return added


def unpack_weights(weights: list[torch.Tensor], kind: str = "packed") -> None:
    """Drop the ``kind`` copies of ``weights`` (when no case runs that kernel)."""
    for t in weights:
        if packed_weight(t, kind) is not None:
            del _copies[kind][id(t)]


def packed_weight(w: torch.Tensor, kind: str = "packed") -> torch.Tensor | None:
    """The ``kind`` copy of ``w`` kept by :func:`pack_weights`, or None (never packed, or a traced stand-in)."""
    entry = _copies[kind].get(id(w))
    return entry[1] if entry is not None and entry[0]() is w else None


def copy_linear(kind: str, x: torch.Tensor, p: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)`` by kernel ``kind`` from ``p``, its copy of ``w`` ("packed": oneDNN's linear reads its
    blocked copy as it reads a dense weight)."""
    return stream.stream_linear(x, p, b) if kind == "stream" else onednn_linear(x, p, b)


def copies_wanted(threads: int | None = None) -> set[str]:
    """The copies a model built now needs: of every available kernel while nothing is timed (tuning times them),
    else of the kernels forced or timed fastest for some case."""
    n = torch.get_num_threads() if threads is None else threads
    if n not in matmul_tuning and not all(os.environ.get(e) for e in MATMUL_ENV.values()):
        return {k for k in COPIES if kernel_available(k)}
    return {matmul_kernel(case, n) for case in MATMUL_KERNELS} & set(COPIES)


def matmul_kernel(case: str, threads: int | None = None) -> str:
    """The kernel :func:`cpu_linear` uses for ``case`` ("one_row" or "rows") at this thread count:
    ``$NEURON_NB_GEMV`` / ``$NEURON_NB_GEMM`` if set, else what :func:`tune_matmuls` measured, else the
    first available of ``MATMUL_KERNELS[case]``."""
    forced = os.environ.get(MATMUL_ENV[case])
    if forced:
        if forced not in MATMUL_KERNELS[case]:
            raise ValueError(f"{MATMUL_ENV[case]}={forced!r}: use one of {MATMUL_KERNELS[case]} or unset it")
        if not kernel_available(forced):
            why = stream.unavailable_reason() if forced == "stream" else "this torch build has no oneDNN"
            raise ValueError(f"{MATMUL_ENV[case]}={forced!r}: that kernel is unavailable here ({why}); "
                             "force another or unset it")
        return forced
    n = torch.get_num_threads() if threads is None else threads
    tuned = matmul_tuning.get(n, {}).get(case, {}).get("kernel")
    return tuned or next(k for k in MATMUL_KERNELS[case] if kernel_available(k))


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
    row and for MATMUL_TUNE_ROWS rows; "stream" and "packed" are candidates when the weights have their
    copies (:func:`pack_weights`). The winners depend on the CPU (all 30 SmolLM2 layers + LM head, 538 MB):

    - 2-core AMD EPYC (Zen 3), 22 GB/s (``ci/benchmark.py --amp f32 --batch-sizes 1 8 --repeats 3``): one
      row, stream 30.6 ms, split-k 34.5, packed 39.5, MKL's GEMV 40.1; 8 rows, stream 31.6, packed 45.5,
      oneDNN on the column-major weights 66.4, MKL 103.8 (it packs the weight on every call).
    - 2-core Intel Xeon (Sapphire Rapids), before stream and packed existed: MKL ahead in both, 19.1
      against split-k 20.9 ms; 34 against oneDNN 40 ms at 8 rows.

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
    for kind in COPIES:
        if all(packed_weight(t, kind) is not None for t in weights):
            for case in candidates:  # the lookup is timed too: cpu_linear pays it on every call
                candidates[case][kind] = lambda x, t, kind=kind: copy_linear(kind, x, packed_weight(t, kind))
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

    - one row (batch-1 decode): split-k (:func:`split_k_linear`), "stream" (``helpers.engine.stream``),
      oneDNN on its blocked copy ("packed", :func:`pack_weights`) or MKL's GEMV (``F.linear``);
    - several rows (speculative verification, batch > 1, prefill): "stream", "packed", oneDNN's linear on
      the column-major weight (``mkldnn._linear_pointwise``, what torch.compile's CPU backend emits) or
      MKL's GEMM.

    A weight without the chosen kernel's copy (e.g. a graph input while ``torch.export`` traces) takes
    oneDNN's linear for several rows and ``F.linear`` for one. Any other weight (row-major, bf16, int8
    storage) goes to ``F.linear``.
    """
    if w.stride(0) != 1 or w.dtype != torch.float32 or w.dim() != 2:
        return F.linear(x, w, b)
    k = x.shape[-1]
    if x.numel() == k:  # (cheap checks only: this runs ~120 times per token)
        n = torch.get_num_threads()
        kernel = matmul_kernel("one_row", n)
        if kernel == "split-k" and n > 1 and k % n == 0:
            return split_k_linear(x, w, b, n)
        p = packed_weight(w, kernel) if kernel in COPIES else None
        return F.linear(x, w, b) if p is None else copy_linear(kernel, x, p, b)
    kernel = matmul_kernel("rows")
    if kernel in COPIES:
        p = packed_weight(w, kernel)
        if p is not None:
            return copy_linear(kernel, x, p, b)
        kernel = "onednn"
    if _MKLDNN_LINEAR is not None and kernel == "onednn":
        return onednn_linear(x, w, b)
    return F.linear(x, w, b)


def use_cpu_kernels(tr: Transformer, pack: bool = True) -> Transformer:
    """Run ``tr``'s f32 matmuls on CPU with :func:`cpu_linear`: weights column-major with the copies the
    "stream" and "packed" kernels read, kernels timed on them (once per process and thread count), and the
    copies no case chose dropped again. Only speed changes: every kernel computes ``F.linear``.
    ``pack=False``: the layout only (int8 storage replaces the projections and the linear next, so nothing
    is timed)."""
    decode_layout(tr.w)
    tr.linear = cpu_linear
    if not pack:
        return tr
    mats = decode_matrices(tr.w)
    for kind in copies_wanted():
        pack_weights(mats, kind)
    tune_matmuls(mats)
    for kind in set(COPIES) - copies_wanted():
        unpack_weights(mats, kind)
    return tr
