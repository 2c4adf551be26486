"""One allocation for the weights a decode step streams, backed by transparent huge pages where Linux offers them.

A decode step reads every weight once per token; in 4 KB pages that is one page translation per 4 KB, and each
one the TLB misses is a page walk (in a virtual machine, a nested one). Linux backs 2 MB pages only where a
program asks (``/sys/kernel/mm/transparent_hugepage/enabled`` = ``madvise``) or everywhere (``always``), and torch
asks only with ``$THP_MEM_ALLOC_ENABLE=1``. So :class:`Arena` allocates a model's matrices in one buffer, aligned
to 2 MB and advised ``MADV_HUGEPAGE`` before any page is touched, and hands out views of it: the data, the kernels
and so the numerics are unchanged, only where the bytes live.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
ALIGN = 64  # bytes: every tensor starts on a cache line (BLAS kernels round alike on aligned data)
MADV_HUGEPAGE = 14  # linux/mman.h
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_libc: dict = {}


def thp_mode() -> str | None:
    """Linux's transparent huge page mode ("always", "madvise" or "never"), None where there is none."""
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return None
    return next((w.strip("[]") for w in text.split() if w.startswith("[")), None)


def _madvise(addr: int, length: int) -> bool:
    if "fn" not in _libc:
        name = ctypes.util.find_library("c") if platform.system() == "Linux" else None
        fn = getattr(ctypes.CDLL(name, use_errno=True), "madvise", None) if name else None
        if fn is not None:
            fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
        _libc["fn"] = fn
    return _libc["fn"] is not None and _libc["fn"](addr, length, MADV_HUGEPAGE) == 0


class Arena:
    """``nbytes`` of CPU memory, 2 MB-aligned and advised for huge pages (where the mode is "madvise" or "always"),
    handed out in order by :meth:`empty`. Its views keep it alive; nothing else frees it."""

    def __init__(self, nbytes: int):
        self.nbytes, self.used = int(nbytes), 0
        self.mode = thp_mode()
        huge = self.mode in ("madvise", "always") and self.nbytes >= HUGE_PAGE
        raw = torch.empty(self.nbytes + (HUGE_PAGE if huge else ALIGN), dtype=torch.uint8)
        off = (-raw.data_ptr()) % (HUGE_PAGE if huge else ALIGN)
        self.buffer = raw[off:off + self.nbytes]
        # advise whole huge pages only; the pages are untouched until the weights are copied in
        self.advised = huge and _madvise(self.buffer.data_ptr(), self.nbytes // HUGE_PAGE * HUGE_PAGE)

    @staticmethod
    def _nbytes(shape, dtype: torch.dtype) -> int:
        return torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()

    @staticmethod
    def size_of(shape, dtype: torch.dtype = torch.float32) -> int:
        """Bytes :meth:`empty` takes for a tensor of ``shape`` (aligned)."""
        return -(-Arena._nbytes(shape, dtype) // ALIGN) * ALIGN

    def empty(self, shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """An uninitialised contiguous tensor of ``shape`` from the arena (refuses beyond its size)."""
        size = self.size_of(shape, dtype)
        if self.used + size > self.nbytes:
            raise ValueError(f"Arena of {self.nbytes} bytes is full ({self.used} used, {size} more asked)")
        out = self.buffer[self.used:self.used + self._nbytes(shape, dtype)].view(dtype).view(shape)
        self.used += size
        return out

    def describe(self) -> str:
        if self.advised:
            return f"huge pages (transparent huge pages: {self.mode}, advised)"
        return f"4 KB pages (transparent huge pages: {self.mode or 'none on this system'})"
