"""The rank runtime: a rank's server (builds its shard and graphs, runs its fixed-shape steps, saves), and the
rank processes the driver talks to (:class:`Ranks`: spawned with ``torch.multiprocessing``, commands over pipes).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import socket
import sys
import time
import traceback
import types
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from ..artifacts.graphs import ArtifactMismatchError, CorruptArtifactError
from ..artifacts.presharded import load_rank_weights
from ..artifacts.manifest import recorded_kernels
from ..artifacts.serialization import rank_graphs, save_rank
from ..engine.config import ModelArgs
from ..engine.generation import select_ops
from ..engine.weights import move_weights, shard_state, weight_breakdown
from ..model_store import LazyState, load_config
from ..planning.dtypes import amp_dtype
from ..planning.gqa import HeadLayout
from .collectives import DistComm, ParallelTransformer

COLLECTIVE_TIMEOUT_S = 600  # a rank stuck in a collective longer than this fails instead of hanging
NONFATAL_OPS = {"save"}  # commands with no collective: a rank's error leaves every rank usable


class _RankServer:
    """Builds one rank's shard and its graphs (built, loaded or eager), runs its fixed-shape steps, saves."""

    def __init__(self, rank: int, tp: int):
        self.rank, self.tp = rank, tp
        self.model = None
        self.graphs, self.build_report, self._workdir = {}, [], None

    def handle(self, op: str, payload):
        return getattr(self, op)(payload)

    def build(self, spec: dict) -> dict:
        t0 = time.perf_counter()
        layout: HeadLayout = spec["layout"]
        device = torch.device(f"cuda:{self.rank}" if spec["device"] == "cuda" else "cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        args = ModelArgs.from_hf(load_config(spec["model_path"]))
        dtype = amp_dtype(spec["amp"])
        if spec.get("weights_meta"):  # presharded: this rank's file as saved, no fusing / casting / sharding
            w = load_rank_weights(spec["model_path"], self.rank, spec["weights_meta"][self.rank], layout)
        else:
            w = shard_state(LazyState(spec["model_path"]), args, dtype, self.rank, self.tp, layout)
        w = move_weights(w, device)
        kv_group = None
        if layout.kv_mode == "gather":  # every rank creates every group, in the same order
            gs = layout.group_size
            for g in range(self.tp // gs):
                group = dist.new_group(list(range(g * gs, (g + 1) * gs)))
                if self.rank // gs == g:
                    kv_group = group
        comm = DistComm(self.rank, self.tp, kv_group)
        g = spec["graphs"]
        recorded = recorded_kernels(g["load_dir"], self.rank) if g["load_dir"] else None  # a load reruns the saved kernels
        self.model = select_ops(ParallelTransformer(args, w, comm, spec["batch_size"], spec["n_positions"],
                                                        device, dtype), spec["neuron_config"].quant, recorded)
        weights_s = time.perf_counter() - t0
        self.graphs, self.build_report, self._workdir = rank_graphs(
            self.model, g["kinds"], spec["batch_size"], g["mode"], g["load_dir"], g["fields"], self.rank)
        parts = weight_breakdown(w)
        return {"rank": self.rank, "weight_bytes": sum(parts.values()), "weights": parts,
                "kv_bytes": self.model.kv_cache_bytes(), "kv_cache_shape": list(self.model.cache.k.shape),
                "q_heads": list(layout.q_heads[self.rank]), "kv_heads": list(layout.kv_heads[self.rank]),
                "kv_mode": layout.kv_mode, "threads": torch.get_num_threads(), "build_s": time.perf_counter() - t0,
                "weights_s": weights_s, "build_report": self.build_report, "device": str(device)}

    def save(self, p: dict) -> dict:
        """This rank's graphs and manifest (+ presharded weights) under its rank's file names."""
        meta = p["weights_meta"][self.rank] if p["sharded_weights"] else None
        saved = save_rank(p["directory"], self.graphs, {**p["fields"], "rank": self.rank}, self.build_report,
                          self.model.w if p["sharded_weights"] else None, meta, self.model.ops.record)
        return {"rank": self.rank, **saved}

    def bench_all_reduce(self, payload):
        """Seconds per all-reduce of a [batch, 1, hidden] activation (the decode step's collective)."""
        n, batch = payload
        x = torch.zeros(batch, 1, self.model.args.hidden_size, dtype=self.model.dtype, device=self.model.device)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(x)
        if x.is_cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    def forward(self, payload):
        kind, bucket, tokens, rope_pos, slots, kv_len, mask, idx = payload
        dev = self.model.device
        logits = self.graphs[(kind, bucket)](tokens.to(dev), rope_pos.to(dev), slots.to(dev), kv_len, mask.to(dev),
                                             idx.to(dev))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return logits.cpu() if self.rank == 0 else None


# exception types a rank's error keeps in the driver (the engine's clear errors); others become RuntimeError
RERAISED = {c.__name__: c for c in (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
                                    ArtifactMismatchError, CorruptArtifactError)}


def _error_info(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}


def _rank_error(rank: int, info: dict) -> Exception:
    """The driver's exception for a rank's error: its message first (the same type when it is one of
    ``RERAISED``), then the rank's traceback."""
    cls = RERAISED.get(info["type"], RuntimeError)
    return cls(f"tensor-parallel rank {rank} failed: {info['message']}\n--- {info['type']} on rank {rank} ---\n"
               f"{info['traceback']}")


def _send(conn, obj):
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())


def _worker_main(rank: int, tp: int, port: int, backend: str, threads: int, conn):
    """Entry point of a spawned rank: join the group, then serve the driver's commands over ``conn``."""
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group(backend, rank=rank, world_size=tp, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        server = _RankServer(rank, tp)
        _send(conn, ("ready", None))
        while True:
            op, payload = _recv(conn)
            if op == "stop":
                break
            try:
                _send(conn, ("ok", server.handle(op, payload)))
            except Exception as exc:  # reported to the driver (which stops every rank unless op is NONFATAL)
                _send(conn, ("error", _error_info(exc)))
    except (EOFError, KeyboardInterrupt):  # the driver went away
        pass
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shutdown(procs, conns):
    for c in conns:
        try:
            _send(c, ("stop", None))
        except (OSError, ValueError):
            pass
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
    for c in conns:
        c.close()


@contextlib.contextmanager
def _without_main():
    """Start a rank without re-importing the caller's ``__main__`` (multiprocessing does that so pickled
    functions from it resolve; ranks need none, and a script's or kernel's imports cost seconds per rank)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _mp_context():
    """forkserver where available: its server imports torch and helpers once, so later ranks start in
    well under a second instead of re-importing everything (spawn) — it matters with 2 CPU cores."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = torch.multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["helpers.parallel"])
        return ctx
    return torch.multiprocessing.get_context("spawn")


class Ranks:
    """The driver's handle on ``tp`` spawned rank processes (commands over pipes, no timeout while idle)."""

    def __init__(self, tp: int, backend: str, threads: int):
        ctx = _mp_context()
        port = _free_port()
        self.procs, self.conns = [], []
        for r in range(tp):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(r, tp, port, backend, threads, child), daemon=True,
                            name=f"tp-rank-{r}")
            with _without_main():
                p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        self._finalizer = weakref.finalize(self, _shutdown, self.procs, self.conns)
        self._collect()

    def _collect(self, fatal: bool = True) -> list:
        """Every rank's answer. A rank's error is raised in the driver with the rank's message; when
        ``fatal`` (the other ranks may wait in a collective) every rank is stopped first, else the error is
        raised once every rank has answered and the ranks stay usable."""
        results, pending, errors = [None] * len(self.conns), set(range(len(self.conns))), []
        while pending:
            for r in sorted(pending):
                if self.conns[r].poll(0.05):
                    status, value = _recv(self.conns[r])
                    pending.discard(r)
                    if status == "error":
                        if fatal:
                            self.close()
                            raise _rank_error(r, value)
                        errors.append((r, value))
                    results[r] = value
                elif not self.procs[r].is_alive():
                    code = self.procs[r].exitcode
                    self.close()
                    raise RuntimeError(f"tensor-parallel rank {r} exited with code {code} (its stderr has the "
                                       "reason; out of memory kills show as -9)")
        if errors:
            raise _rank_error(*errors[0])
        return results

    def call(self, op: str, payload) -> list:
        for c in self.conns:
            _send(c, (op, payload))
        return self._collect(fatal=op not in NONFATAL_OPS)

    def close(self):
        self._finalizer()
