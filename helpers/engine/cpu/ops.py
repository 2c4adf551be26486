"""The CPU speed layer as the model sees it: the ops object an f32 model on CPU runs with.

:func:`use_cpu` stores the model's matrices as :class:`~helpers.engine.cpu.kernels.CpuWeight` (column-major, with
the kernels ``kernel_choice`` picked and their copies, in one huge-page arena) and gives the model
:class:`CpuOps` (torch's ops between the matmuls) or :class:`FusedOps` (those ops in C, ``fused_ops``). ``record``
is what a saved model keeps of the choice; a load builds with it again (``kernel_choice.check_recorded``).
"""
from __future__ import annotations

from ..model import Linear, TorchOps
from . import fused_ops
from . import kernels as K
from .hugepages import Arena
from .kernel_choice import build_kernels


class CpuOps(TorchOps):
    """torch's ops between the matmuls; the matrices run the CPU kernels ``kernels`` ({shape family: kernel})."""
    name = "torch"

    def __init__(self, kernels: dict[str, str]):
        self.kernels = dict(kernels)

    @property
    def record(self) -> dict:
        return dict(self.kernels, ops=self.name)


class FusedOps(CpuOps):
    """:class:`CpuOps` with RMSNorm, RoPE, few-row attention and SwiGLU each one C call (``fused_ops``), except
    while ``torch.export`` traces (a graph holds ATen ops only) or where a step's tensors do not fit the C code."""
    name = "fused"

    def rms_norm(self, x, weight, eps):
        if fused_ops.tracing():
            return super().rms_norm(x, weight, eps)
        return fused_ops.rms_norm(x, weight, eps)

    def rope(self, q, k, cos, sin_signed, head_dim):
        if not fused_ops.tracing() and fused_ops.rope_qk_(q, k, cos, sin_signed, head_dim):
            return q, k
        return super().rope(q, k, cos, sin_signed, head_dim)

    def attention(self, q, k, v, mask, kv_heads, head_dim):
        if not fused_ops.tracing() and fused_ops.attention_fits(q, k, v, mask):
            return fused_ops.attention(q, k, v, mask, kv_heads.per_query, head_dim)
        return super().attention(q, k, v, mask, kv_heads, head_dim)

    def swiglu(self, gu):
        if fused_ops.tracing():
            return super().swiglu(gu)
        return fused_ops.swiglu(gu)


def use_cpu(tr, pack: bool = True, recorded: dict | None = None):
    """Give ``tr`` (f32, on CPU) the speed layer: its matrices as :class:`~kernels.CpuWeight` with the kernels of
    ``kernel_choice.build_kernels`` (``recorded``: a saved model's) and their copies, all in one huge-page
    ``Arena``, and ``tr.ops`` = :class:`FusedOps` or :class:`CpuOps` as chosen. ``pack=False`` (int8 storage
    replaces the projections next): the matrices column-major only, and torch's ops."""
    if not pack:
        tr.w.relayout(lambda t: Linear(K.column_major(t)))
        return tr
    kernels = build_kernels(recorded)
    ops = kernels.pop("ops")
    L = tr.w.layers[0]
    unfit = fused_ops.unfit_dims(L.w2.shape[0], tr.args.head_dim, L.w2.shape[1])
    if ops == "fused" and unfit:
        if fused_ops.forced():
            raise ValueError(f"${fused_ops.ENV}=fused: this model cannot run the C ops ({unfit}); unset it")
        ops = "torch"
    # the matrices and their kernels' copies in one huge-page arena: the same bytes, fewer TLB misses
    arena = Arena(sum(K.CpuWeight.arena_bytes(t, kernels) for t in tr.w.matrices()))
    tr.w.relayout(lambda t: K.CpuWeight.build(t, kernels, arena=arena))
    tr.ops = (FusedOps if ops == "fused" else CpuOps)(kernels)
    return tr
