"""``ParallelModel``: ``NeuronModel``'s API with ``tp_degree`` ranks in their own processes; the driver (your
process) runs the sampling loop and sends each fixed-shape step to the ranks.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from ..artifacts.graphs import artifact_mode
from ..artifacts.manifest import read_manifest
from ..artifacts.model import LOAD_AFTER_BUILD, NeuronModel
from ..artifacts.presharded import check_rank_weights
from ..artifacts.serialization import check_compile, check_save, graph_fields, weights_meta, write_settings
from ..planning.gqa import HeadLayout, resolve_layout
from .ranks import Ranks


def _layout_meta(layout: HeadLayout, rank: int) -> dict:
    """What a rank's shard depends on beyond ``serialization.weights_meta``: its heads and KV mode."""
    return {"kv_mode": layout.kv_mode, "q_heads": list(layout.q_heads[rank]), "kv_heads": list(layout.kv_heads[rank])}


def check_graphable(layout: HeadLayout, compiled, what: str) -> None:
    """Compiled graphs are the attention and MLP units between the all-reduces (helpers.artifacts); a layout
    whose attention itself exchanges data between ranks would need a collective inside a graph."""
    if layout.kv_mode == "heads":
        return
    inside = ("all-gathers each rank's KV head from the K/V column slices of its group" if layout.kv_mode == "gather"
              else "exchanges batch rows and heads with all-to-all")
    raise ValueError(f"{what}: {layout.name} at tp_degree={layout.tp} {inside} inside attention, so its "
                     "attention unit cannot be a compiled graph without a collective (the reference engine's "
                     "graphs, like Neuron's, are cut at the all-reduces). Use compiled=False (eager), or another "
                     "group_query_attention (shard-over-heads or replicated-heads; NxDI: replicate-to-tp-degree "
                     f"or convert-to-mha). Requested: compiled={compiled!r}.")


class _RemoteStep:
    """The driver's graph for one (kind, bucket): every rank runs its own graph of that (kind, bucket).
    It holds the ranks, not the model, so dropping the model stops the rank processes."""

    def __init__(self, ranks, kind: str, bucket: int, device):
        self.ranks, self.kind, self.bucket, self.device = ranks, kind, bucket, device

    def __call__(self, tokens, rope_pos, slots, kv_len, mask, logit_idx):
        payload = (self.kind, self.bucket, tokens.cpu(), rope_pos.cpu(), slots.cpu(), kv_len, mask.cpu(),
                   logit_idx.cpu())
        return self.ranks.call("forward", payload)[0].to(self.device)


class ParallelModel(NeuronModel):
    """``NeuronModel`` with ``tp_degree`` ranks in their own processes (transformers-neuronx's ``tp_degree``).

    ``rank_reports`` (after ``to_neuron``) lists what each rank holds: query/KV heads, weight and KV-cache
    bytes, the cache shape. ``weight_bytes`` / ``kv_cache_bytes`` are the largest rank's (what one
    NeuronCore must hold). Each rank gets ``torch.get_num_threads() // tp_degree`` threads (at least 1), so
    tp ranks use the cores one process would. Call ``close()`` (or use ``with``) to stop the ranks early.

    ``NeuronConfig(compiled="export"|"aoti")``: every rank builds its graphs (``build_report``: one row per
    graph, ``rank_seconds`` each rank's build seconds, ``seconds`` their mean). ``save(dir)`` / ``load(dir)``
    (before ``to_neuron``) and ``compile(path)`` / ``from_compiled(path)`` work as ``NeuronModel``'s, each
    rank writing and reading ``graphs-rank{r}.json``, its graphs and ``weights/tp{r}_sharded_checkpoint.safetensors``.
    Scripts that build one must guard their entry point (``if __name__ == "__main__":``), as multiprocessing
    requires; notebooks need nothing.
    """

    def __init__(self, model_path=None, **kwargs):
        self._ranks = None
        self.rank_reports: list[dict] = []
        super().__init__(model_path, **kwargs)

    def _validate(self):
        super()._validate()
        if self.device.type == "cuda" and torch.cuda.device_count() < self.tp_degree:
            raise ValueError(f"device='cuda' with tp_degree={self.tp_degree} puts one rank per GPU (nccl), but torch "
                             f"sees {torch.cuda.device_count()} GPU(s): use device='cpu' (gloo) or tp_degree <= "
                             f"{torch.cuda.device_count()}")
        # the library's fallbacks (with its warnings) and its build errors, before anything is built
        self.layout = resolve_layout(self.args.n_heads, self.args.n_kv_heads, self.args.head_dim, self.tp_degree,
                                     self.batch_size, self.neuron_config.group_query_attention)
        if self.neuron_config.compiled:
            check_graphable(self.layout, self.neuron_config.compiled, "NeuronConfig(compiled=...)")

    def to_neuron(self) -> "ParallelModel":
        t0 = time.perf_counter()
        if self._ranks is not None:
            raise RuntimeError("to_neuron() was already called on this model")
        kinds = self._graph_kinds()
        spec = {"model_path": str(self.model_path), "amp": self.amp, "batch_size": self.batch_size,
                "n_positions": self.n_positions, "layout": self.layout, "neuron_config": self.neuron_config,
                "device": self.device.type, "weights_meta": self._weights_meta() if self.presharded else None,
                "graphs": {"kinds": kinds, "load_dir": self._artifacts_dir, "fields": self._graph_fields(),
                           "mode": artifact_mode(self.neuron_config.compiled)}}
        if self.presharded:  # every rank's file header, before any process starts (as load() checks graphs)
            for r, meta in enumerate(spec["weights_meta"]):
                check_rank_weights(self.model_path, r, meta)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        threads = max(1, torch.get_num_threads() // self.tp_degree)  # the ranks share the driver's threads
        self._ranks = Ranks(self.tp_degree, backend, threads)
        try:
            self.rank_reports = self._ranks.call("build", spec)
        except BaseException:
            self.close()
            raise
        self.load_s = time.perf_counter() - t0
        self.graphs, self.build_report = self._build_graphs()
        return self

    def _weights_meta(self) -> list[dict]:
        return [{**weights_meta(self, r), **_layout_meta(self.layout, r)} for r in range(self.tp_degree)]

    def _build_graphs(self) -> tuple[dict, list[dict]]:
        """One driver-side callable per (kind, bucket) that runs the ranks' graph of that (kind, bucket);
        ``build_report`` from the ranks' reports: ``rank_seconds`` each rank's, ``seconds`` their mean (the
        ranks build at the same time, so the rows add up to at most the wall time of the build)."""
        graphs = {(k, b): _RemoteStep(self._ranks, k, b, self.device) for k, bs, _ in self._graph_kinds() for b in bs}
        per_rank = [{row["graph"]: row for row in r["build_report"]} for r in self.rank_reports]
        report = []
        for row in self.rank_reports[0]["build_report"]:
            secs = [rows[row["graph"]]["seconds"] for rows in per_rank]
            report.append({**row, "seconds": sum(secs) / len(secs), "rank_seconds": secs})
        return graphs, report

    # -- serialization: NeuronModel's calls, every rank writing / reading its own files ----------------
    def save(self, directory, sharded_weights: bool = False, mark_presharded: bool = True) -> dict:
        """transformers-neuronx ``save(dir, sharded_weights=False)``: every rank writes its graphs and
        ``graphs-rank{r}.json`` (+ ``weights/tp{r}_sharded_checkpoint.safetensors``); the driver writes the
        settings. Returns {"directory", "graphs" (all ranks), "bytes" (all ranks), "rank_bytes"}."""
        check_save(self, sharded_weights, mark_presharded)
        ranks = self.require_built()
        if Path(directory).is_file():  # as transformers-neuronx base.py _save_compiled_artifacts
            raise FileExistsError(f"Artifacts should be saved to a directory. Found existing file: {directory}")
        payload = {"directory": str(directory), "fields": self._graph_fields(), "sharded_weights": sharded_weights,
                   "weights_meta": self._weights_meta() if sharded_weights else None}
        saved = ranks.call("save", payload)
        write_settings(self, directory, sharded_weights, mark_presharded)
        return {"directory": str(Path(directory)), "graphs": sum(r["graphs"] for r in saved),
                "bytes": sum(r["bytes"] for r in saved), "rank_bytes": [r["bytes"] for r in saved]}

    def load(self, directory) -> "ParallelModel":
        """transformers-neuronx ``load(dir)`` before ``to_neuron()``, which then loads every rank's graphs
        instead of compiling. Refuses now, before any process starts, a directory saved for another model,
        bucket set, batch, tp degree, dtype or torch version, or with a changed file (rank 0 first, so a
        directory of another tp degree names ``tp_degree``)."""
        if self._is_built():
            raise RuntimeError(LOAD_AFTER_BUILD)
        check_graphable(self.layout, self.neuron_config.compiled, "load()")
        fields = graph_fields(self)
        for r in range(self.tp_degree):
            read_manifest(directory, {**fields, "rank": r}, r)
        self._artifacts_dir = str(directory)
        return self

    def compile(self, compiled_model_path, save_sharded_checkpoint: bool = False) -> dict:
        """NxD Inference ``compile(path)``: build every rank's graphs (if not yet) and write them with the
        settings (+ ``weights/tp{rank}_sharded_checkpoint.safetensors`` with ``save_sharded_checkpoint``)."""
        check_compile(self)
        if self._ranks is None:
            self.to_neuron()
        return self.save(compiled_model_path, save_sharded_checkpoint, mark_presharded=False)

    def _is_built(self) -> bool:
        """Whether ``to_neuron()`` has run: here, the rank processes hold the model."""
        return self._ranks is not None

    def require_built(self):
        super().require_built()
        return self._ranks

    def all_reduce_latency(self, n: int = 50) -> float:
        """Measured seconds per all-reduce of one decode step's activation (slowest rank)."""
        return max(self.require_built().call("bench_all_reduce", (n, self.batch_size)))

    @property
    def collectives_per_step(self) -> int:
        """All-reduces after o_proj and down_proj in every layer, plus the LM head's all-gather."""
        return 2 * self.args.n_layers + 1

    @property
    def rank_weight_bytes(self) -> list[int]:
        self.require_built()
        return [r["weight_bytes"] for r in self.rank_reports]

    @property
    def rank_kv_bytes(self) -> list[int]:
        self.require_built()
        return [r["kv_bytes"] for r in self.rank_reports]

    @property
    def weight_bytes(self) -> int:
        return max(self.rank_weight_bytes)

    @property
    def kv_cache_bytes(self) -> int:
        return max(self.rank_kv_bytes)

    def close(self):
        if self._ranks is not None:
            self._ranks.close()
            self._ranks = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
