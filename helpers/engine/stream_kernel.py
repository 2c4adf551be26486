"""The "stream" matmul kernel for steps over a few rows: every weight read once for all rows, at the speed
a one-row step reads it (``csrc/stream_linear.c``).

Library GEMMs stream a weight and then compute on it, one after the other, so a step over a few rows costs
well over a one-row step. This kernel stores each weight in blocks of 16 output columns
(:func:`stream_layout`), runs six rows per pass over a block (AVX2) and prefetches 4 KB ahead, so reading the next
block overlaps the arithmetic on this one and a step over a few rows stays close to a one-row step (with AVX-512,
up to 16 rows share a pass: :func:`use_avx512`). With
many rows (prefill) it keeps up with the library GEMMs. The figures are the benchmark's:
``python ci/benchmark.py`` prints every kernel's timing per shape family and the steps over 1, 2, 4 and 8
rows on the machine it runs on; docs/performance.md ("Decode speed, kernels and the roofline", "Steps by
rows, and prefill") reports them for two machines.

It is C with AVX2 intrinsics, built on first use with the system C compiler (``$CC`` or ``cc``) into
``helpers.model_store.cache_dir()/kernels`` (``~/.cache/neuron-llm-notebooks/kernels``, or under
``$NEURON_NB_CACHE``; an older ``~/.cache/neuron-inference-notebooks`` is no longer read) and called
through ``ctypes``; where that cannot happen (no compiler, no AVX2 + FMA, not x86-64, a second OpenMP
runtime, a cached library that does not load) :func:`load` says why and ``helpers.engine.kernel_choice``
times and uses the other kernels only.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from .. import model_store

SOURCE = Path(__file__).parent / "csrc" / "stream_linear.c"
BLOCK = 16  # output columns per block: two AVX2 registers
CFLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC"]
_state: dict = {}  # "lib": the loaded library or None, "why": why not


def cache_dir() -> Path:
    """The kernel cache: beside the converted checkpoint, in ``helpers.model_store.cache_dir()``."""
    return model_store.cache_dir() / "kernels"


def load() -> ctypes.CDLL | None:
    """The built kernel library (built and cached on first use), or None: :func:`unavailable_reason` says why."""
    if "lib" not in _state:
        _state["lib"], _state["why"] = _build_and_load()
    return _state["lib"]


def unavailable_reason() -> str | None:
    load()
    return _state["why"]


def library_path(cc: str) -> Path:
    """Where the library built from this source with ``cc`` on this kind of machine is cached."""
    key = " ".join([platform.machine().lower(), cc, *CFLAGS]).encode()
    return cache_dir() / f"stream_linear-{hashlib.sha256(SOURCE.read_bytes() + key).hexdigest()[:16]}.so"


def _build_and_load() -> tuple[ctypes.CDLL | None, str | None]:
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return None, f"{machine} CPU: the kernel is x86-64 AVX2 code"
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        return None, f"no C compiler ({cc!r} not found; set $CC)"
    lib_path = library_path(cc)
    if not lib_path.exists():
        try:
            lib_path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=lib_path.parent) as tmp:  # build aside, then one atomic rename
                built = Path(tmp) / lib_path.name
                r = subprocess.run([cc, *CFLAGS, str(SOURCE), "-o", str(built)], capture_output=True, text=True)
                if r.returncode:
                    return None, f"{cc} could not build {SOURCE.name}: {r.stderr.strip()[-400:]}"
                os.replace(built, lib_path)
        except OSError as e:
            return None, f"could not build into {lib_path.parent}: {e}"
    try:
        lib = ctypes.CDLL(str(lib_path))
    except OSError as e:  # e.g. a cache shared with a machine whose build does not load here
        return None, f"could not load {lib_path}: {e} (delete it to rebuild)"
    if not lib.stream_supported():
        return None, "this CPU lacks AVX2 + FMA"
    if os.path.exists("/proc/self/maps"):
        with open("/proc/self/maps") as f:
            runtimes = {line.split()[-1] for line in f if "libgomp" in line or "libomp" in line}
        if len(runtimes) > 1:
            return None, f"two OpenMP runtimes loaded ({', '.join(sorted(runtimes))}): their threads would compete"
    lib.stream_linear.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_int]
    lib.stream_linear.restype = None
    lib.stream_use_avx512.argtypes, lib.stream_use_avx512.restype = [ctypes.c_int], ctypes.c_int
    return lib, None


def use_avx512(on: bool = True) -> bool:
    """Run the AVX-512 path for more than 6 rows (up to 16 per pass over a block) where the CPU has it, or the AVX2
    one (6 rows per pass): the same sums in the same order, so the same bits (``tests/test_stream_kernel.py``
    checks). Returns whether the AVX-512 path now runs; needs :func:`load`."""
    return bool(load().stream_use_avx512(int(on)))


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
    """``F.linear(x, w, b)`` for f32 ``x`` [..., in] on CPU, ``wp`` = :func:`stream_layout` (w); needs :func:`load`."""
    lib = load()
    k = x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    n = wp.shape[0] * BLOCK
    if wp.shape[1] != k or x2.dtype != torch.float32 or wp.dtype != torch.float32:
        raise ValueError(f"stream_linear: x [..., {k}] {x2.dtype} against a packed [{n}, {wp.shape[1]}] {wp.dtype} weight")
    y = torch.empty(x2.shape[0], n, dtype=torch.float32)
    lib.stream_linear(x2.data_ptr(), x2.shape[0], k, wp.data_ptr(), n, y.data_ptr(), torch.get_num_threads())
    y = y.view(*x.shape[:-1], n)
    return y if b is None else y.add_(b)
