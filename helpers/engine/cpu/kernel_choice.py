"""Which CPU matmul kernel runs each shape family, decided once per machine kind and kept.

Every kernel of ``helpers.engine.cpu.kernels`` computes ``F.linear``, but each rounds in its own order, so the
kernel decides the last bits of every f32 logit: two builds that chose differently would not reproduce each
other. So the kernels are timed once per *machine kind* (:func:`machine_key`: CPU model, ISA flags, thread count,
torch version, the kernels available), on synthetic weights larger than the caches (``SHAPES``: the choice does
not depend on which model is built first), and the result is kept in
``helpers.model_store.cache_dir()/kernels/matmul-<key>.json``; every later build on that machine, in any process,
reads it, and the first process to write it wins. ``$NEURON_NB_GEMV`` / ``$NEURON_NB_GEMM`` /
``$NEURON_NB_PREFILL`` force a kernel.

A timing beside other work would keep a slow kernel for good, so the timing measures the load other processes put
on this process's cores (``/proc/stat``), is repeated while it leaves too few free, records it, and warns if it
never eased. A saved model records its kernels (``Transformer.ops.record``) and a load builds with them again
(:func:`check_recorded`), or refuses naming the one that cannot run here. Delete the cache file to time again.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path

import torch

from ...model_store import cache_dir
from . import clib, fused_ops
from . import kernels as K
from .hugepages import Arena, thp_mode

FORMAT = 2  # 2: the weights (and the timed ones) live in a huge-page arena (helpers.engine.cpu.hugepages)
# ISA features that decide a matmul kernel's speed (printed by ci/benchmark.py); the cache key hashes every flag
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2", "bf16", "i8mm")
# Synthetic weights [out, in]: 4 layers of a small decoder + its LM head, 170 MB in f32, above any L3 cache.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 4 + [(49152, 576)]
_chosen: dict[str, dict] = {}  # cache key -> record, this process
PROC_STAT = Path("/proc/stat")
ATTEMPTS = 3  # timings at most, while other processes hold cores the timed kernels need (best time per kernel kept)


class KernelMismatchError(ValueError):
    """A saved model ran kernels that this machine cannot run (or that an environment variable overrides)."""


def cpu_info() -> dict:
    """The CPU model and its ISA flags: /proc/cpuinfo on Linux, platform's words elsewhere."""
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu model", "hardware") and model is None:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    return {"model": model, "machine": platform.machine(), "isa": [f for f in ISA_FLAGS if f in flags],
            "flags_sha256": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]}


def machine_key(threads: int | None = None) -> dict:
    """What the timed choice depends on: the CPU, its flags, the thread count, torch and the kernels available."""
    info = cpu_info()
    return {"format": FORMAT, "cpu": info["model"], "machine": info["machine"], "flags": info["flags_sha256"],
            "threads": torch.get_num_threads() if threads is None else threads, "torch": torch.__version__,
            "available": sorted({k for ks in K.MATMUL_KERNELS.values() for k in ks if K.kernel_available(k)}),
            "stream_source": clib.source_digest("stream_linear.c"), "pages": thp_mode(),
            "shapes": hashlib.sha256(json.dumps([SHAPES, K.MATMUL_TUNE_ROWS, K.FEW_ROWS]).encode()).hexdigest()[:16]}


def choice_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"matmul-{digest}.json"


def _read(path: Path, key: dict) -> dict | None:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(rec, dict) and rec.get("key") == key and set(rec.get("kernels", {})) == set(K.MATMUL_KERNELS)
          and all(k in K.MATMUL_KERNELS[c] and K.kernel_available(k) for c, k in rec["kernels"].items()))
    return rec if ok else None


def _write_once(path: Path, rec: dict) -> None:
    """Create ``path`` holding ``rec`` unless it exists (whoever wrote first wins); never a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
        json.dump(rec, f, indent=1, sort_keys=True)
    os.chmod(f.name, 0o644)
    try:
        os.link(f.name, path)
    except FileExistsError:
        pass
    except OSError:  # a file system without hard links: an atomic rename (a racing writer may win instead)
        if not path.exists():
            os.replace(f.name, path)
    finally:
        if os.path.exists(f.name):
            os.unlink(f.name)


def synthetic_weights(seed: int = 0) -> list[torch.Tensor]:
    """Column-major f32 weights of ``SHAPES`` (as ``helpers.engine.cpu.ops.use_cpu`` stores a model's)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(k, n, generator=g).t() for n, k in SHAPES]


def time_here(repeats: int = 3) -> dict:
    """Time every available kernel of each family on :func:`synthetic_weights` (each with every copy, freed with
    them): decode-like passes over all of them for one row and a few rows, prefill over one layer's matrices."""
    kinds = [k for k in K.COPIES if K.kernel_available(k)]
    ts = synthetic_weights()
    arena = Arena(sum(K.CpuWeight.arena_bytes(t, {}, kinds) for t in ts))  # where a model's weights live too
    ws = [K.CpuWeight.build(t, {}, kinds, arena) for t in ts]
    del ts
    # prefill is compute-bound: one layer's matrices say as much as all of them, in a quarter of the time
    return K.time_matmuls({"one_row": ws, "rows": ws, "prefill": ws[:4]}, repeats)


def usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def _busy_seconds(cpus: list[int]) -> float | None:
    """CPU seconds spent busy so far on ``cpus`` by every process (``/proc/stat``), None where there is none."""
    try:
        with open(PROC_STAT) as f:
            lines = [line.split() for line in f if line.startswith("cpu") and line[3:4].isdigit()]
    except OSError:
        return None
    ticks = 0
    for fields in lines:
        if int(fields[0][3:]) in cpus:
            vals = [int(v) for v in fields[1:9]]
            ticks += sum(vals) - vals[3] - vals[4]  # all but idle and iowait
    return ticks / os.sysconf("SC_CLK_TCK")


def others_cores(fn):
    """``fn()`` and how many cores' worth of *other* processes' work ran on this process's CPUs meanwhile (their
    busy time minus this process's own, over the wall time); None where the system does not say."""
    cpus = usable_cpus()
    busy0, own0, t0 = _busy_seconds(cpus), sum(os.times()[:2]), time.perf_counter()
    out = fn()
    wall, busy1 = time.perf_counter() - t0, _busy_seconds(cpus)
    if busy0 is None or busy1 is None or wall <= 0:
        return out, None
    return out, max(0.0, (busy1 - busy0) - (sum(os.times()[:2]) - own0)) / wall


def _crowded(others: float | None, threads: int) -> bool:
    """Other processes' load (cores) leaves fewer than ``threads`` of this process's cores free."""
    return others is not None and len(usable_cpus()) - others < threads - 0.5


def _best_of(a: dict, b: dict) -> dict:
    out = {}
    for case in a:
        ms = {k: min(a[case]["ms"][k], b[case]["ms"].get(k, float("inf"))) for k in a[case]["ms"]}
        out[case] = {"kernel": min(ms, key=ms.get), "ms": ms}
    return out


def time_when_free(threads: int) -> tuple[dict, list]:
    """:func:`time_here`, again (up to ``ATTEMPTS`` times) while other processes leave fewer than ``threads`` of
    this process's cores free: a kernel timed beside another process looks slower than it is, and the choice is
    kept for good. Returns each kernel's best time over the attempts, and the other processes' load (cores)
    during each attempt."""
    best, loads = None, []
    for _ in range(ATTEMPTS):
        timed, others = others_cores(time_here)
        loads.append(None if others is None else round(others, 2))
        best = timed if best is None else _best_of(best, timed)
        if not _crowded(others, threads):
            break
    return best, loads


def machine_choice(threads: int | None = None) -> dict:
    """This machine kind's record ``{"key", "kernels": {family: kernel}, "ms": {family: {kernel: ms}},
    "others_cores": [other processes' load during each timing], "path", "source"}``: from this process's memory,
    else the cache file, else timed now (:func:`time_when_free`) and written (first writer wins, and everyone then
    reads what was written), with a warning if other processes held the cores throughout. Needs ``threads`` = the
    thread count the model will run with."""
    key = machine_key(threads)
    path = choice_path(key)
    memo = str(path)
    if memo in _chosen:
        return _chosen[memo]
    rec = _read(path, key)
    source = "cache file"
    if rec is None:
        before = torch.get_num_threads()
        torch.set_num_threads(key["threads"])
        try:
            timed, loads = time_when_free(key["threads"])
        finally:
            torch.set_num_threads(before)
        mine = {"key": key, "kernels": {c: t["kernel"] for c, t in timed.items()},
                "ms": {c: t["ms"] for c, t in timed.items()}, "others_cores": loads}
        try:
            if path.exists() and _read(path, key) is None:  # unreadable, or naming a kernel gone: replaced, once
                path.unlink(missing_ok=True)
            _write_once(path, mine)
        except OSError:
            pass
        rec = _read(path, key)
        if rec is None:  # an unwritable cache: this process keeps its own timing
            rec, source = mine, "timed here (not cached: the cache folder is not writable)"
        else:
            source = "timed here" if rec["ms"] == mine["ms"] else "written by another process while this one timed"
        if rec["ms"] == mine["ms"] and _crowded(loads[-1], key["threads"]):
            warnings.warn(f"The f32 matmul kernels were timed {len(loads)} times while other processes kept "
                          f"{min(loads):.1f} or more of this process's {len(usable_cpus())} cores busy, so the choice "
                          f"({mine['kernels']}) may be slower than this machine allows. It is kept in {path}: delete "
                          "that file to time again on idle cores.", stacklevel=2)
    _chosen[memo] = dict(rec, path=str(path), source=source)
    return _chosen[memo]


def planned_kernels(threads: int | None = None) -> dict[str, str]:
    """The kernel of each family a build here uses: forced by its environment variable, else the machine's
    choice (timed once, :func:`machine_choice`; not timed at all when every family is forced)."""
    forced = {case: K.forced_kernel(case) for case in K.MATMUL_KERNELS}
    if all(forced.values()):
        return forced
    chosen = machine_choice(threads)["kernels"]
    return {case: forced[case] or chosen[case] for case in K.MATMUL_KERNELS}


def check_recorded(recorded: dict | None, what: str = "the saved model") -> dict | None:
    """``recorded`` (a saved model's kernels, ``Transformer.ops.record``) if this machine can run every one of them and no
    environment variable forces another; else :class:`KernelMismatchError` naming the kernel. None (nothing
    recorded: an older save, or a model without the CPU kernels) passes. A record without ``"ops"`` (saved before
    the fused ops existed) ran torch's."""
    if recorded is None:
        return None
    recorded = dict(recorded)
    ops = recorded.pop("ops", "torch")
    problems = []
    for case, kernel in recorded.items():
        if case not in K.MATMUL_KERNELS or kernel not in K.MATMUL_KERNELS[case]:
            problems.append(f"{case}: {kernel!r} is no kernel of this engine")
        elif not K.kernel_available(kernel):
            problems.append(f"{case}: {kernel!r} is unavailable here ({K.unavailable_reason(kernel)})")
        elif (forced := K.forced_kernel(case)) and forced != kernel:
            problems.append(f"{case}: {kernel!r}, but ${K.MATMUL_ENV[case]} (or $NEURON_NB_GEMM) forces {forced!r}")
    missing = set(K.MATMUL_KERNELS) - set(recorded)
    if missing:
        problems.append(f"no kernel recorded for {', '.join(sorted(missing))}")
    if ops not in fused_ops.CHOICES:
        problems.append(f"ops: {ops!r} is none of {fused_ops.CHOICES}")
    elif ops == "fused" and not fused_ops.available():
        problems.append(f"ops: 'fused' is unavailable here ({clib.unavailable_reason()})")
    elif (forced := fused_ops.forced()) and forced != ops:
        problems.append(f"ops: {ops!r}, but ${fused_ops.ENV} forces {forced!r}")
    if problems:
        raise KernelMismatchError(
            f"{what} ran its f32 matmuls with {dict(recorded, ops=ops)} and would not reproduce its outputs here: "
            + "; ".join(problems) + ". Unset the variable, or build the model without load() and save() again.")
    return dict(recorded, ops=ops)


def build_kernels(recorded: dict | None = None) -> dict[str, str]:
    """The kernels a build uses, with ``"ops"`` (``helpers.engine.cpu.fused_ops``): the ``recorded`` ones of a saved
    model (:func:`check_recorded`), else :func:`planned_kernels` and ``fused_ops.planned()``."""
    return check_recorded(recorded) or dict(planned_kernels(), ops=fused_ops.planned())

