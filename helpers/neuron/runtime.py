"""The pinned Neuron stacks and the machine they run on: which stacks exist and which are installed, the
instance family and the tp degrees it runs, and the runtime's environment (one process per model).

Runtime hygiene: the Neuron runtime releases NeuronCores only when the process exits, so run one
notebook per process (the papermill runner does) and set ``NEURON_RT_VISIBLE_CORES`` /
``NEURON_RT_NUM_CORES`` / ``OMP_NUM_THREADS`` / the compile cache with
:func:`configure_neuron_runtime` *before* the first model is loaded.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from pathlib import Path

from ..planning.memory import PLATFORM_TP_DEGREES

# The pinned stacks by their import names (read from their source; paths in helpers.neuron are inside them):
# tnx = transformers-neuronx 0.13 (Neuron SDK 2.26, its last release), nxdi = NxD Inference 0.8 (SDK 2.28).
STACKS = {"tnx": "transformers_neuronx", "nxdi": "neuronx_distributed_inference"}
STACK_NAMES = {"tnx": "transformers-neuronx 0.13 (Neuron SDK 2.26)",
               "nxdi": "NxD Inference 0.8 (Neuron SDK 2.28)"}
DISTRIBUTIONS = {"tnx": "transformers-neuronx", "nxdi": "neuronx-distributed-inference"}
# The instance families the pinned stacks run on (trn2 needs later SDKs for NxD Inference kernels).
FAMILIES = ("inf2", "trn1")
# EC2 (Nitro) reports the instance type here, e.g. "inf2.xlarge".
DMI_PRODUCT_NAME = "/sys/devices/virtual/dmi/id/product_name"


def installed_stacks() -> list[str]:
    return [s for s, mod in STACKS.items() if importlib.util.find_spec(mod) is not None]


def library_version(stack: str) -> str | None:
    """The installed library's version: artifacts compiled by another release do not load (transformers-neuronx
    matches NEFFs by HLO hash and raises on a miss), so the default folder is keyed by it too."""
    try:
        return importlib.metadata.version(DISTRIBUTIONS[stack])
    except importlib.metadata.PackageNotFoundError:
        return None


def detect_instance_family(product_name_file: str = DMI_PRODUCT_NAME) -> str | None:
    """'inf2' / 'trn1' from the instance type EC2 reports (``inf2.xlarge`` -> ``inf2``); None elsewhere."""
    try:
        name = Path(product_name_file).read_text().strip()
    except OSError:
        return None
    family = name.split(".", 1)[0]
    return family if family in FAMILIES else None


def check_tp_degree(tp_degree: int, instance_family: str | None = None) -> None:
    """Refuse a tp_degree the Neuron runtime does not run on this instance family (tnx guide: inf2 1, 2, 4, 8,
    24; trn1 1, 2, 8, 16, 32). The family is ``instance_family``, else the one this instance reports; where
    neither is known (no Neuron instance), only the degrees valid on both families pass."""
    family = instance_family or detect_instance_family()
    if family is not None and family not in FAMILIES:
        raise ValueError(f"instance_family={family!r}: use one of {FAMILIES}")
    if family is not None:
        if tp_degree not in PLATFORM_TP_DEGREES[family]:
            raise ValueError(f"tp_degree={tp_degree} does not run on {family}: use one of "
                             f"{PLATFORM_TP_DEGREES[family]} (NeuronCores per model on {family})")
        return
    both = [t for t in PLATFORM_TP_DEGREES["inf2"] if t in PLATFORM_TP_DEGREES["trn1"]]
    if tp_degree not in both:
        valid_on = [f for f in FAMILIES if tp_degree in PLATFORM_TP_DEGREES[f]]
        hint = (f"it runs on {valid_on[0]} only: pass instance_family={valid_on[0]!r}" if valid_on else
                f"valid degrees: inf2 {PLATFORM_TP_DEGREES['inf2']}, trn1 {PLATFORM_TP_DEGREES['trn1']}")
        raise ValueError(f"tp_degree={tp_degree}: the instance family is unknown here (no EC2 instance type in "
                         f"{DMI_PRODUCT_NAME}) and {hint}")


def _core_list(cores) -> list[int]:
    if isinstance(cores, int):
        return [cores]
    if isinstance(cores, str):
        out = []
        for part in cores.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
            if not m:
                raise ValueError(f"NEURON_RT_VISIBLE_CORES={cores!r}: use '0', '0-1' or '0,1'")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                raise ValueError(f"NEURON_RT_VISIBLE_CORES={cores!r}: range {lo}-{hi} is empty")
            out += range(lo, hi + 1)
        return out
    return [int(c) for c in cores]


def neuron_runtime_env(visible_cores=None, num_cores: int | None = None, omp_threads: int | None = None,
                       compile_cache: str | None = None) -> dict[str, str]:
    """Environment variables for one model process (pure; see :func:`configure_neuron_runtime`).

    ``visible_cores``: which NeuronCores this process may use ('0-1', [0, 1], 2) -> NEURON_RT_VISIBLE_CORES.
    ``num_cores``: how many, any free ones -> NEURON_RT_NUM_CORES. Give one of the two.
    ``omp_threads``: host threads when several models share the host -> OMP_NUM_THREADS
    (transformers-neuronx guide, "Running inference with multiple models").
    ``compile_cache``: Neuron persistent compile cache location -> NEURON_COMPILE_CACHE_URL
    (a local folder or s3:// URL; default /var/tmp/neuron-compile-cache).
    """
    env: dict[str, str] = {}
    if visible_cores is not None and num_cores is not None:
        raise ValueError("set visible_cores or num_cores, not both (NEURON_RT_VISIBLE_CORES already fixes the count)")
    if visible_cores is not None:
        cores = _core_list(visible_cores)
        if not cores or cores != list(range(cores[0], cores[0] + len(cores))):
            raise ValueError(f"visible_cores={visible_cores!r}: the Neuron runtime takes a contiguous, increasing "
                             "range of NeuronCores (e.g. '0-1' or '2-3'), not gaps or a reordered list")
        env["NEURON_RT_VISIBLE_CORES"] = f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])
    if num_cores is not None:
        if int(num_cores) < 1:
            raise ValueError("num_cores must be >= 1")
        env["NEURON_RT_NUM_CORES"] = str(int(num_cores))
    if omp_threads is not None:
        if int(omp_threads) < 1:
            raise ValueError("omp_threads must be >= 1")
        env["OMP_NUM_THREADS"] = str(int(omp_threads))
    if compile_cache is not None:
        env["NEURON_COMPILE_CACHE_URL"] = str(compile_cache)
    return env


def omp_threads_for(n_models: int, host_cpus: int | None = None) -> int:
    """Host threads per model when ``n_models`` share the host (192 CPUs, 4 models -> 48)."""
    host_cpus = host_cpus or os.cpu_count() or 1
    return max(1, host_cpus // max(1, int(n_models)))


def configure_neuron_runtime(**kwargs) -> dict[str, str]:
    """Apply :func:`neuron_runtime_env` to ``os.environ``. The runtime reads these when it starts (the
    first model load), and frees its NeuronCores only at process exit: call this first, once per
    process, and run one notebook per process."""
    env = neuron_runtime_env(**kwargs)
    if "NEURON_RT_VISIBLE_CORES" in env:
        os.environ.pop("NEURON_RT_NUM_CORES", None)
    if "NEURON_RT_NUM_CORES" in env:
        os.environ.pop("NEURON_RT_VISIBLE_CORES", None)
    os.environ.update(env)
    return env


def check_visible_cores(tp_degree: int, environ=None) -> None:
    """Refuse, before any compile, a tp_degree larger than the cores this process may use."""
    environ = os.environ if environ is None else environ
    if "NEURON_RT_VISIBLE_CORES" in environ:
        cores = environ["NEURON_RT_VISIBLE_CORES"]
        neuron_runtime_env(visible_cores=cores)  # refuses gaps and reordered lists
        n = len(_core_list(cores))
    elif "NEURON_RT_NUM_CORES" in environ:
        n = int(environ["NEURON_RT_NUM_CORES"])
    else:
        return
    if tp_degree > n:
        raise ValueError(f"tp_degree={tp_degree} but this process may use {n} NeuronCore(s) "
                         f"(NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES): lower tp_degree or give it more cores")
