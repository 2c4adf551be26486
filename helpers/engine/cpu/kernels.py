"""CPU matmul kernels for f32 steps: what each computes, the weight object that owns the copies they read, and
the timing that compares them (``helpers.engine.cpu.kernel_choice`` decides, once per machine, which one runs).

A decode step reads every weight once, so on CPU it is bound by memory bandwidth and by how each
matmul streams its weight; a step over a few rows (batch decode, speculative verification) reads
the same weights and should cost about as much; prefill (T x hidden GEMMs) is compute-bound. Each of
these three shape families ("one_row", "rows", "prefill") has its candidates (``MATMUL_KERNELS``).
A model's f32 CPU weight is a :class:`CpuWeight`: the matrix stored column-major (:func:`column_major`), the
kernel of each family fixed at the build, and the copies its kernels read ("stream", ``helpers.engine.cpu.stream_kernel``;
oneDNN's blocked layout, "packed"); the model runs it by its ``linear``.
``$NEURON_NB_GEMV`` / ``$NEURON_NB_GEMM`` / ``$NEURON_NB_PREFILL`` force a kernel (``$NEURON_NB_GEMM``
forces prefill too unless ``$NEURON_NB_PREFILL`` is set).
"""
from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from ..model import Linear
from . import clib, stream_kernel
from .hugepages import Arena


def column_major(t: torch.Tensor) -> torch.Tensor:
    """The same [out, in] tensor stored [in, out] in memory (shape unchanged, strides swapped)."""
    return t.t().contiguous().t()


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
COPIES = ("stream", "packed")  # kernels that read their own copy of each weight (:func:`weight_copy`)


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
        return clib.load() is not None
    if kernel == "packed":
        return _MKLDNN_REORDER is not None
    if kernel == "onednn":
        return _MKLDNN_LINEAR is not None
    return True


def weight_copy(w: torch.Tensor, kind: str, arena: Arena | None = None) -> torch.Tensor | None:
    """The copy of f32 CPU weight ``w`` that kernel ``kind`` reads, or None (kernel unavailable, or "stream" with
    ``out`` not a multiple of 16): "packed", oneDNN's blocked layout (``mkldnn._reorder_linear_weight``, what
    Inductor's CPU freezing does to linear weights); "stream", blocks of 16 output columns
    (``helpers.engine.cpu.stream_kernel``). Either streams the weight in the order its micro-kernel consumes it, with no
    packing per call, and costs as many bytes again. ``arena``: where the "stream" copy goes (oneDNN allocates its
    own)."""
    if not kernel_available(kind) or not (w.dim() == 2 and w.dtype == torch.float32 and w.device.type == "cpu"):
        return None
    if kind == "packed":
        return _MKLDNN_REORDER(w, PACK_ROWS)
    shape = stream_kernel.stream_shape(w)
    return stream_kernel.stream_layout(w, None if arena is None or shape is None else arena.empty(shape))


def copy_linear(kind: str, x: torch.Tensor, p: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)`` by kernel ``kind`` from ``p``, its copy of ``w`` ("packed": oneDNN's linear reads its
    blocked copy as it reads a dense weight)."""
    return stream_kernel.stream_linear(x, p, b) if kind == "stream" else onednn_linear(x, p, b)


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
    return clib.unavailable_reason() if kernel == "stream" else "this torch build has no oneDNN"


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


def candidates(case: str, weights: list["CpuWeight"], threads: int) -> dict:
    """``name -> linear(x, w)`` of every kernel of ``case`` that can run on ``weights`` (:class:`CpuWeight`; "stream"
    and "packed" need their copies), each as :meth:`CpuWeight.linear` runs it."""
    out = {"mkl": lambda x, w: F.linear(x, w.dense)}
    if case == "one_row" and threads > 1 and all(w.shape[1] % threads == 0 for w in weights):
        out["split-k"] = lambda x, w: split_k_linear(x, w.dense, None, threads)
    if case != "one_row" and _MKLDNN_LINEAR is not None:
        out["onednn"] = lambda x, w: onednn_linear(x, w.dense)
    for kind in COPIES:
        if all(kind in w.copies for w in weights):  # the lookup is timed too: CpuWeight.linear pays it
            out[kind] = lambda x, w, kind=kind: copy_linear(kind, x, w.copies[kind])
    return {k: v for k, v in out.items() if k in MATMUL_KERNELS[case]}


def time_matmuls(weights_by_case: dict[str, list[torch.Tensor]], repeats: int = 3, seed: int = 0) -> dict:
    """Milliseconds per pass of every candidate kernel over ``weights_by_case[case]`` (:class:`CpuWeight` with
    their copies) at ``MATMUL_TUNE_ROWS[case]`` rows, best of ``repeats`` after a warm-up round, the kernels
    alternating per round (load on a shared machine hits them alike): ``{case: {"kernel": fastest, "ms": {..}}}``.
    Only speed differs between kernels, but which one runs decides the f32 rounding, so
    ``helpers.engine.cpu.kernel_choice`` calls this once per machine and keeps the answer."""
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


class CpuWeight(Linear):
    """A :class:`~helpers.engine.model.Linear` for an f32 [out, in] weight on CPU: stored column-major (``dense``,
    as transformers-neuronx stores its weights transposed), with the kernel of each shape family (``kernels``:
    ``{"one_row", "rows", "prefill"} -> kernel``, fixed at the build, so its numerics never change) and the copies
    those kernels read (``copies``: kind -> tensor), which live and die with it. :meth:`linear` runs the family's
    kernel: split-k, "stream", oneDNN on its blocked copy ("packed"), oneDNN's linear or MKL (``F.linear``).
    Without the chosen kernel's copy (:meth:`traced`: a graph input while ``torch.export`` traces) it takes
    oneDNN's linear for several rows and ``F.linear`` for one.
    """

    def __init__(self, dense: torch.Tensor, kernels: dict[str, str], copies: dict[str, torch.Tensor] | None = None):
        super().__init__(dense)
        self.kernels, self.copies = dict(kernels), dict(copies or {})

    @classmethod
    def build(cls, w: torch.Tensor, kernels: dict[str, str], kinds=None, arena: Arena | None = None) -> "CpuWeight":
        """``w`` stored column-major, with the copies its ``kernels`` read (or those of ``kinds``, for timing);
        with an ``arena`` (``helpers.engine.cpu.hugepages``), the matrix and its "stream" copy are placed there
        (:meth:`arena_bytes` says how much they take)."""
        if arena is not None:
            dense = arena.empty((w.shape[1], w.shape[0])).t().copy_(w)  # column-major, as column_major(w)
        else:
            dense = w if w.stride(0) == 1 else column_major(w)
        copies = {kind: weight_copy(dense, kind, arena) for kind in COPIES if kind in cls._wanted(kernels, kinds)}
        return cls(dense, kernels, {k: c for k, c in copies.items() if c is not None})

    @staticmethod
    def _wanted(kernels: dict[str, str], kinds=None) -> set:
        return set(kernels.values()) if kinds is None else set(kinds)

    @classmethod
    def arena_bytes(cls, w: torch.Tensor, kernels: dict[str, str], kinds=None) -> int:
        """Bytes :meth:`build` takes from an arena for ``w``: the matrix, and its "stream" copy if one is made."""
        n, shape = Arena.size_of(w.shape), stream_kernel.stream_shape(w)
        if "stream" in cls._wanted(kernels, kinds) and kernel_available("stream") and shape:
            n += Arena.size_of(shape)
        return n

    def traced(self, t: torch.Tensor) -> "CpuWeight":
        """The same kernels over ``t`` (a graph input standing for ``dense``), without copies."""
        return CpuWeight(t, self.kernels)

    def __repr__(self):
        return f"CpuWeight({tuple(self.shape)}, kernels={self.kernels}, copies={sorted(self.copies)})"

    def linear(self, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        w = self.dense
        if w.stride(0) != 1:  # a traced stand-in laid out otherwise
            return F.linear(x, w, b)
        k = x.shape[-1]
        rows = x.numel() // k  # (cheap checks only: this runs ~120 times per token)
        if rows == 1:
            n = torch.get_num_threads()
            kernel = self.kernels["one_row"]
            if kernel == "split-k" and n > 1 and k % n == 0:
                return split_k_linear(x, w, b, n)
            p = self.copies.get(kernel)
            return F.linear(x, w, b) if p is None else copy_linear(kernel, x, p, b)
        kernel = self.kernels["rows" if rows <= FEW_ROWS else "prefill"]
        if kernel in COPIES:
            p = self.copies.get(kernel)
            if p is not None:
                return copy_linear(kernel, x, p, b)
            kernel = "onednn"
        if _MKLDNN_LINEAR is not None and kernel == "onednn":
            return onednn_linear(x, w, b)
        return F.linear(x, w, b)
