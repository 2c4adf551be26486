"""CPU matmul kernels for f32 steps: what each computes, the copies of the weights they read, and the
timing that compares them (``helpers.engine.kernel_choice`` decides, once per machine, which one runs).

A decode step reads every weight once, so on CPU it is bound by memory bandwidth and by how each
matmul streams its weight; a step over a few rows (batch decode, speculative verification) reads
the same weights and should cost about as much; prefill (T x hidden GEMMs) is compute-bound. Each of
these three shape families ("one_row", "rows", "prefill") has its candidates (``MATMUL_KERNELS``).
:func:`decode_layout` stores the weights column-major, :func:`pack_weights` keeps the copies that the
"stream" kernel (``helpers.engine.stream``) and oneDNN's blocked layout ("packed") read, and
:class:`CpuLinear` is a model's linear with its kernel per family fixed at the build.
``$NEURON_NB_GEMV`` / ``$NEURON_NB_GEMM`` / ``$NEURON_NB_PREFILL`` force a kernel (``$NEURON_NB_GEMM``
forces prefill too unless ``$NEURON_NB_PREFILL`` is set).
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

# Candidates per shape family; the first available one is the default where nothing chose (see kernel_choice).
MATMUL_KERNELS = {"one_row": ("split-k", "stream", "packed", "mkl"),
                  "rows": ("stream", "packed", "onednn", "mkl"),
                  "prefill": ("stream", "packed", "onednn", "mkl")}
MATMUL_ENV = {"one_row": "NEURON_NB_GEMV", "rows": "NEURON_NB_GEMM", "prefill": "NEURON_NB_PREFILL"}
FEW_ROWS = 32  # up to this many rows a matmul is "rows" (batch decode, verification), beyond it "prefill"
MATMUL_TUNE_ROWS = {"one_row": 1, "rows": 8, "prefill": 128}  # rows per timed matmul: batch 8 / k + 1; a prompt
PACK_ROWS = 16  # oneDNN's batch-size hint for the blocked layout: 16 to 1024 gave the same speed for 1 to 1024 rows
COPIES = ("stream", "packed")  # kernels that read their own copy of each weight (built by pack_weights)
_copies: dict[str, dict[int, tuple[weakref.ref, torch.Tensor]]] = {k: {} for k in COPIES}  # id(weight) -> (weight, copy)


def family(rows: int) -> str:
    """The shape family of a matmul over ``rows`` rows."""
    return "one_row" if rows == 1 else "rows" if rows <= FEW_ROWS else "prefill"


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


def forced_kernel(case: str) -> str | None:
    """The kernel ``$NEURON_NB_GEMV`` / ``$NEURON_NB_GEMM`` / ``$NEURON_NB_PREFILL`` forces for ``case``, or None;
    refuses an unknown or unavailable one by name. ``$NEURON_NB_GEMM`` forces prefill too unless
    ``$NEURON_NB_PREFILL`` is set."""
    env = MATMUL_ENV[case]
    forced = os.environ.get(env)
    if not forced and case == "prefill":
        env, forced = MATMUL_ENV["rows"], os.environ.get(MATMUL_ENV["rows"])
    if not forced:
        return None
    if forced not in MATMUL_KERNELS[case]:
        raise ValueError(f"{env}={forced!r}: use one of {MATMUL_KERNELS[case]} or unset it")
    if not kernel_available(forced):
        raise ValueError(f"{env}={forced!r}: that kernel is unavailable here ({unavailable_reason(forced)}); "
                         "force another or unset it")
    return forced


def unavailable_reason(kernel: str) -> str | None:
    """Why ``kernel`` cannot run here, or None."""
    if kernel_available(kernel):
        return None
    return stream.unavailable_reason() if kernel == "stream" else "this torch build has no oneDNN"


def default_kernels() -> dict[str, str]:
    """Per family: the forced kernel, else the first available candidate (what runs where nothing was chosen)."""
    return {case: forced_kernel(case) or next(k for k in ks if kernel_available(k)) for case, ks in MATMUL_KERNELS.items()}


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


def candidates(case: str, weights: list[torch.Tensor], threads: int) -> dict:
    """``name -> linear(x, w)`` of every kernel of ``case`` that can run on ``weights`` (column-major f32; "stream"
    and "packed" need their copies, :func:`pack_weights`), each as :func:`cpu_linear` runs it."""
    out = {"mkl": lambda x, t: F.linear(x, t)}
    if case == "one_row" and threads > 1 and all(t.shape[1] % threads == 0 for t in weights):
        out["split-k"] = lambda x, t: split_k_linear(x, t, None, threads)
    if case != "one_row" and _MKLDNN_LINEAR is not None:
        out["onednn"] = onednn_linear
    for kind in COPIES:
        if all(packed_weight(t, kind) is not None for t in weights):  # the lookup is timed too: cpu_linear pays it
            out[kind] = lambda x, t, kind=kind: copy_linear(kind, x, packed_weight(t, kind))
    return {k: v for k, v in out.items() if k in MATMUL_KERNELS[case]}


def time_matmuls(weights_by_case: dict[str, list[torch.Tensor]], repeats: int = 3, seed: int = 0) -> dict:
    """Milliseconds per pass of every candidate kernel over ``weights_by_case[case]`` (column-major f32 with
    their copies) at ``MATMUL_TUNE_ROWS[case]`` rows, best of ``repeats`` after a warm-up round, the kernels
    alternating per round (load on a shared machine hits them alike): ``{case: {"kernel": fastest, "ms": {..}}}``.
    Only speed differs between kernels, but which one runs decides the f32 rounding, so
    ``helpers.engine.kernel_choice`` calls this once per machine and keeps the answer."""
    n = torch.get_num_threads()
    g = torch.Generator().manual_seed(seed)
    out = {}
    with torch.inference_mode():
        for case, weights in weights_by_case.items():
            fns = candidates(case, weights, n)
            xs = {t.shape[1]: torch.randn(MATMUL_TUNE_ROWS[case], t.shape[1], generator=g) for t in weights}
            best = {name: float("inf") for name in fns}
            for _ in range(repeats + 1):
                for name, fn in fns.items():
                    best[name] = min(best[name], matmul_pass_seconds(fn, weights, xs))
            out[case] = {"kernel": min(best, key=best.get), "ms": {k: round(v * 1e3, 2) for k, v in best.items()}}
    return out


def cpu_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
               kernels: dict[str, str] | None = None) -> torch.Tensor:
    """``F.linear`` for f32 weights stored column-major on CPU (:func:`decode_layout`), by ``kernels[family]``
    (:func:`default_kernels` if None; a built model passes its own, :class:`CpuLinear`):

    - one row (batch-1 decode): split-k (:func:`split_k_linear`), "stream" (``helpers.engine.stream``),
      oneDNN on its blocked copy ("packed", :func:`pack_weights`) or MKL's GEMV (``F.linear``);
    - a few rows (<= FEW_ROWS: speculative verification, batch decode) and prefill: "stream", "packed",
      oneDNN's linear on the column-major weight (``mkldnn._linear_pointwise``, what torch.compile's CPU
      backend emits) or MKL's GEMM.

    A weight without the chosen kernel's copy (e.g. a graph input while ``torch.export`` traces) takes
    oneDNN's linear for several rows and ``F.linear`` for one. Any other weight (row-major, bf16, int8
    storage) goes to ``F.linear``.
    """
    if w.stride(0) != 1 or w.dtype != torch.float32 or w.dim() != 2:
        return F.linear(x, w, b)
    kernels = kernels or default_kernels()
    k = x.shape[-1]
    rows = x.numel() // k  # (cheap checks only: this runs ~120 times per token)
    if rows == 1:
        n = torch.get_num_threads()
        kernel = kernels["one_row"]
        if kernel == "split-k" and n > 1 and k % n == 0:
            return split_k_linear(x, w, b, n)
        p = packed_weight(w, kernel) if kernel in COPIES else None
        return F.linear(x, w, b) if p is None else copy_linear(kernel, x, p, b)
    kernel = kernels["rows" if rows <= FEW_ROWS else "prefill"]
    if kernel in COPIES:
        p = packed_weight(w, kernel)
        if p is not None:
            return copy_linear(kernel, x, p, b)
        kernel = "onednn"
    if _MKLDNN_LINEAR is not None and kernel == "onednn":
        return onednn_linear(x, w, b)
    return F.linear(x, w, b)


class CpuLinear:
    """A built model's linear: :func:`cpu_linear` with the kernel of each family fixed at the build
    (``kernels``: ``{"one_row", "rows", "prefill"} -> kernel``), so its numerics never change afterwards."""

    def __init__(self, kernels: dict[str, str]):
        self.kernels = dict(kernels)

    def __call__(self, x, w, b=None):
        return cpu_linear(x, w, b, self.kernels)

    def __repr__(self):
        return f"CpuLinear({self.kernels})"


def decode_matrices(w: RankWeights) -> list[torch.Tensor]:
    """The matrices a decode step streams, in the order it reads them (per layer, then the LM head)."""
    return [t for L in w.layers for t in (L.wqkv, L.wo, L.w13, L.w2)] + [w.lm_head]


def use_kernels(tr: Transformer, kernels: dict[str, str] | None, pack: bool = True) -> Transformer:
    """Run ``tr``'s f32 matmuls on CPU with ``kernels`` (:class:`CpuLinear`): weights column-major, with the copies
    those kernels read. ``pack=False``: the layout only (int8 storage replaces the projections and the linear
    next). ``tr.matmul_kernels`` records the kernels (None without them)."""
    decode_layout(tr.w)
    tr.matmul_kernels = None
    if not pack:
        tr.linear = cpu_linear
        return tr
    mats = decode_matrices(tr.w)
    for kind in set(kernels.values()) & set(COPIES):
        pack_weights(mats, kind)
    tr.linear, tr.matmul_kernels = CpuLinear(kernels), dict(kernels)
    return tr
