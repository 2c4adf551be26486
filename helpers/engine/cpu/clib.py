"""The engine's C kernels (``csrc/*.c``: the "stream" matmul, ``helpers.engine.cpu.stream_kernel``; the ops between a
step's matmuls, ``helpers.engine.cpu.fused_ops``): one library, built on first use and called through ``ctypes``.

It is built with the system C compiler (``$CC`` or ``cc``) into ``helpers.model_store.cache_dir()/kernels``
(``~/.cache/neuron-llm-notebooks/kernels``, or under ``$NEURON_NB_CACHE``), once per source and compiler, and
loaded from there. Where that cannot happen (no compiler, no AVX2 + FMA, not x86-64, a second OpenMP runtime, a
cached library that does not load) :func:`load` returns None, :func:`unavailable_reason` says why, and the engine
runs its other kernels and torch's ops.
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

from ... import model_store

SOURCES = tuple(Path(__file__).parent / "csrc" / name for name in ("stream_linear.c", "decode_ops.c"))
CFLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC"]
_P, _I, _L, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
SIGNATURES = {  # name: (argument types, result type)
    "stream_linear": ([_P, _I, _I, _P, _I, _P, _I], None),
    "stream_use_avx512": ([_I], _I),
    "ops_rms_norm": ([_P, _P, _F, _I, _I, _P, _I], None),
    "ops_rope": ([_P, _I, _L, _I, _I, _P, _P], None),
    "ops_attention": ([_P, _L, _L, _P, _L, _L, _L, _P, _L, _L, _L, _P, _L, _L, _P,
                       _I, _I, _I, _I, _I, _F, _P, _I], None),
    "ops_swiglu": ([_P, _I, _I, _P, _I], None),
}
_state: dict = {}  # "lib": the loaded library or None, "why": why not


def cache_dir() -> Path:
    """The kernel cache: beside the converted checkpoint, in ``helpers.model_store.cache_dir()``."""
    return model_store.cache_dir() / "kernels"


def source_digest(*names: str) -> str:
    """A digest of the C sources named (all when none): the matmul kernel timing's key includes its kernel's."""
    chosen = [s for s in SOURCES if not names or s.name in names]
    return hashlib.sha256(b"".join(s.read_bytes() for s in chosen)).hexdigest()[:16]


def load() -> ctypes.CDLL | None:
    """The built library (built and cached on first use), or None: :func:`unavailable_reason` says why."""
    if "lib" not in _state:
        _state["lib"], _state["why"] = _build_and_load()
    return _state["lib"]


def unavailable_reason() -> str | None:
    load()
    return _state["why"]


def library_path(cc: str) -> Path:
    """Where the library built from these sources with ``cc`` on this kind of machine is cached."""
    key = " ".join([source_digest(), platform.machine().lower(), cc, *CFLAGS]).encode()
    digest = hashlib.sha256(key).hexdigest()[:16]
    return cache_dir() / f"cpu_kernels-{digest}.so"


def _build_and_load() -> tuple[ctypes.CDLL | None, str | None]:
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return None, f"{machine} CPU: the kernels are x86-64 AVX2 code"
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        return None, f"no C compiler ({cc!r} not found; set $CC)"
    lib_path = library_path(cc)
    if not lib_path.exists():
        try:
            lib_path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=lib_path.parent) as tmp:  # build aside, then one atomic rename
                built = Path(tmp) / lib_path.name
                r = subprocess.run([cc, *CFLAGS, *map(str, SOURCES), "-lm", "-o", str(built)],
                                   capture_output=True, text=True)
                if r.returncode:
                    return None, f"{cc} could not build {', '.join(s.name for s in SOURCES)}: {r.stderr.strip()[-400:]}"
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
    for name, (args, res) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib, None
