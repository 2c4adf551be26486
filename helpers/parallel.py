"""Tensor parallelism for the reference engine: one process per rank, real collectives.

As in transformers-neuronx / NxD Inference (Megatron-style): q/k/v and gate/up are column-parallel,
o and down are row-parallel and followed by an all-reduce, the LM head is vocabulary-parallel (its
logits all-gathered); query heads are padded up to a multiple of ``tp_degree`` and KV heads replicated
or split as the chosen GQA strategy says (``helpers.gqa``). Each rank is a separate process that
holds only its shard and its own KV cache; collectives go through ``torch.distributed`` (gloo on
CPU, nccl on CUDA with one GPU per rank).

``ParallelModel`` has ``NeuronModel``'s API (``from_pretrained``, ``to_neuron``, ``sample``, ``forward``,
``stats``, ``save``/``load``, ``compile``/``from_compiled``); the driver (your process) runs the sampling
loop and sends each fixed-shape step to the ranks. With ``NeuronConfig(compiled="export"|"aoti")`` each
rank builds its own graphs per bucket (``helpers/graphs.py``: attention and MLP units cut at the
all-reduces, so a graph holds no collective) and saves / loads them under its rank's file names.
Ranks are started with ``torch.multiprocessing`` (spawn), or are the processes of a ``torchrun`` job::

    python -m helpers.parallel --tp-degree 2 --max-new-tokens 16 --check
    torchrun --nproc-per-node 2 -m helpers.parallel --max-new-tokens 16 --check
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pickle
import socket
import sys
import time
import traceback
import types
import weakref
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from . import graphs as gr
from .config import ModelArgs, amp_dtype
from .engine import Comm, LayerWeights, NeuronModel, RankWeights, Transformer
from .gqa import HeadLayout, resolve_layout, round_up
from .model_store import load_config, load_state_dict, resolve_model_path

COLLECTIVE_TIMEOUT_S = 600  # a rank stuck in a collective longer than this fails instead of hanging
GATHERED_OPS = {"build", "bench_all_reduce", "save"}  # commands whose every rank's result the driver needs
NONFATAL_OPS = {"save"}  # commands with no collective: a rank's error leaves every rank usable


# -- weights -----------------------------------------------------------------------------------
class LazyState(Mapping):
    """A safetensors checkpoint read tensor by tensor, so a rank never holds the whole model at once."""

    def __init__(self, model_path):
        from safetensors import safe_open

        path = resolve_model_path(model_path)
        self._files = {}
        self._full = None
        for f in sorted(path.glob("*.safetensors")):
            handle = safe_open(str(f), framework="pt")
            for k in handle.keys():
                self._files[k] = handle
        if not self._files:  # pickle checkpoints: no lazy access
            self._full = load_state_dict(path)

    def __getitem__(self, key):
        if self._full is not None:
            return self._full[key]
        return self._files[key].get_tensor(key)

    def __iter__(self):
        return iter(self._full if self._full is not None else self._files)

    def __len__(self):
        return len(self._full if self._full is not None else self._files)


def _chunk(t: torch.Tensor, dim: int, tp: int, rank: int) -> torch.Tensor:
    """Rank's slice of ``t`` along ``dim`` after zero-padding it to a multiple of tp (a copy for tp > 1)."""
    if tp == 1:
        return t
    size = t.shape[dim]
    padded = round_up(size, tp)
    if padded != size:
        pad = list(t.shape)
        pad[dim] = padded - size
        t = torch.cat([t, t.new_zeros(pad)], dim=dim)
    return t.narrow(dim, rank * (padded // tp), padded // tp).clone()


def _heads(t: torch.Tensor, heads, head_dim: int, dim: int) -> torch.Tensor:
    """Stack the given heads' slices of ``t`` along ``dim``; head -1 is a zero (padding) head."""
    parts = []
    for h in heads:
        if h >= 0:
            parts.append(t.narrow(dim, h * head_dim, head_dim))
        else:
            shape = list(t.shape)
            shape[dim] = head_dim
            parts.append(t.new_zeros(shape))
    return torch.cat(parts, dim=dim)


def shard_state_tp(state, args: ModelArgs, dtype: torch.dtype, rank: int = 0, tp: int = 1, gqa=None,
                   batch_size: int | None = None) -> RankWeights:
    """One rank's weights. ``gqa``: a strategy (resolved here, with the library's fallbacks) or a HeadLayout."""
    layout = gqa if isinstance(gqa, HeadLayout) else resolve_layout(
        args.n_heads, args.n_kv_heads, args.head_dim, tp, batch_size, gqa)
    if layout.tp != tp:
        raise ValueError(f"layout is for tp_degree={layout.tp}, asked for {tp}")
    D, mode = args.head_dim, layout.kv_mode
    q_heads, kv_heads = layout.q_heads[rank], layout.kv_heads[rank]

    def get(name):
        return state[name].to(dtype)

    def q_part(t, dim):   # q rows (dim 0) / o columns (dim 1)
        return _chunk(t, dim, tp, rank) if mode == "batch" else _heads(t, q_heads, D, dim)

    def kv_part(t):
        return _heads(t, kv_heads, D, 0) if mode == "heads" else _chunk(t, 0, tp, rank)

    layers = []
    for i in range(args.n_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        q, k, v = q_part(get(a + "q_proj.weight"), 0), kv_part(get(a + "k_proj.weight")), kv_part(get(a + "v_proj.weight"))
        bqkv = None
        if args.attention_bias:
            bqkv = torch.cat([q_part(get(a + "q_proj.bias"), 0), kv_part(get(a + "k_proj.bias")),
                              kv_part(get(a + "v_proj.bias"))])
        layers.append(LayerWeights(
            wqkv=torch.cat([q, k, v]),
            wo=q_part(get(a + "o_proj.weight"), 1),
            w13=torch.cat([_chunk(get(m + "gate_proj.weight"), 0, tp, rank), _chunk(get(m + "up_proj.weight"), 0, tp, rank)]),
            w2=_chunk(get(m + "down_proj.weight"), 1, tp, rank),
            ln1=get(f"model.layers.{i}.input_layernorm.weight"),
            ln2=get(f"model.layers.{i}.post_attention_layernorm.weight"),
            bqkv=bqkv,
            bo=get(a + "o_proj.bias") if args.attention_bias and (a + "o_proj.bias") in state else None,
        ))
    embed = get("model.embed_tokens.weight")
    lm = embed if args.tie_word_embeddings or "lm_head.weight" not in state else get("lm_head.weight")
    kv_group = layout.kv_group(rank)
    return RankWeights(
        embed=embed, norm=get("model.norm.weight"), lm_head=_chunk(lm, 0, tp, rank), layers=layers,
        n_q=args.n_heads if mode == "batch" else len(q_heads), n_kv=len(kv_heads), vocab_size=args.vocab_size,
        kv_group=None if kv_group is None else torch.tensor(kv_group),
        extra={"layout": layout, "rank": rank, "qkv_cols": (q.shape[0], k.shape[0], v.shape[0])})


def weight_breakdown(w: RankWeights) -> dict:
    """Bytes of one rank's weights by part (the embedding is replicated; tnx keeps it on the host)."""
    nbytes = lambda t: 0 if t is None else t.numel() * t.element_size()  # noqa: E731
    layers = sum(nbytes(getattr(L, n)) for L in w.layers for n in ("wqkv", "wo", "w13", "w2", "bqkv", "bo"))
    norms = nbytes(w.norm) + sum(nbytes(L.ln1) + nbytes(L.ln2) for L in w.layers)
    lm_head = 0 if w.lm_head is w.embed else nbytes(w.lm_head)
    return {"embedding": nbytes(w.embed), "layers": layers, "norms": norms, "lm_head": lm_head}


# -- collectives -------------------------------------------------------------------------------
class DistComm(Comm):
    """Collectives of a torch.distributed group (gloo or nccl)."""

    def __init__(self, rank: int, world_size: int, kv_group=None):
        self.rank, self.world_size, self.kv_group = rank, world_size, kv_group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
        n = dist.get_world_size(group)
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=dim)

    def all_to_all(self, x: torch.Tensor, split_dim: int, concat_dim: int) -> torch.Tensor:
        """Chunk ``split_dim`` over the ranks (chunk j goes to rank j); concatenate what arrives on ``concat_dim``."""
        send = torch.stack(x.chunk(self.world_size, dim=split_dim))
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        return torch.cat(recv.unbind(0), dim=concat_dim)


class ParallelTransformer(Transformer):
    """One rank's forward; SHARD_OVER_BATCH and ALL_GATHER_HEADS need their own attention dataflow."""

    def __init__(self, args, w: RankWeights, comm, batch_size, n_positions, device, dtype):
        layout: HeadLayout = w.extra["layout"]
        rows = batch_size // layout.tp if layout.kv_mode == "batch" else batch_size
        super().__init__(args, w, comm, rows, n_positions, device, dtype)
        self.layout, self.rank, self.cols = layout, w.extra["rank"], w.extra["qkv_cols"]

    def qkv(self, L, h):
        if self.layout.kv_mode == "heads":
            return super().qkv(L, h)
        qc, kc, _ = self.cols
        qkv = self.linear(h, L.wqkv, L.bqkv)
        q, k, v = qkv[..., :qc], qkv[..., qc:qc + kc], qkv[..., qc + kc:]
        if self.layout.kv_mode == "gather":  # this rank's K/V columns -> its group's whole KV head
            k = self.comm.all_gather(k, dim=-1, group=self.comm.kv_group)
            v = self.comm.all_gather(v, dim=-1, group=self.comm.kv_group)
        return q, k, v

    def attend(self, i, L, h, cos, sin, slots, kv_len, attn_mask):
        if self.layout.kv_mode != "batch":
            return super().attend(i, L, h, cos, sin, slots, kv_len, attn_mask)
        # all batch rows x this rank's columns -> this rank's rows x all heads; attend; and back
        q, k, v = (self.comm.all_to_all(t, split_dim=0, concat_dim=-1) for t in self.qkv(L, h))
        b = q.shape[0]
        rows = slice(self.rank * b, (self.rank + 1) * b)
        o = self.attend_heads(i, q, k, v, cos[rows], sin[rows], slots, kv_len, attn_mask[rows])
        return self.comm.all_to_all(o, split_dim=-1, concat_dim=0)


# -- one rank ----------------------------------------------------------------------------------
def _to_device(w: RankWeights, device) -> RankWeights:
    """Every tensor on the device. On CPU, copies of the tensors safetensors left at unaligned offsets
    (as ``NeuronModel._move``): BLAS kernels round differently on unaligned data, and a rank must compute
    bit for bit the same whether its weights came from the checkpoint or from presharded files."""
    def mv(t):
        if t is None or device.type != "cpu":
            return None if t is None else t.to(device)
        return t if t.data_ptr() % 64 == 0 else t.clone()

    tied = w.lm_head is w.embed
    w.embed, w.norm, w.lm_head, w.kv_group = mv(w.embed), mv(w.norm), mv(w.lm_head), mv(w.kv_group)
    if tied:
        w.lm_head = w.embed
    for L in w.layers:
        for n in ("wqkv", "wo", "w13", "w2", "ln1", "ln2", "bqkv", "bo"):
            setattr(L, n, mv(getattr(L, n)))
    w.extra = {k: mv(v) if torch.is_tensor(v) else v for k, v in w.extra.items()}
    return w


def _storable(w: RankWeights) -> RankWeights:
    """The same tensors with the extras safetensors can hold: the layout and rank are settings (checked
    through the weights' metadata), the fused QKV column split a small tensor."""
    extra = {k: v for k, v in w.extra.items() if torch.is_tensor(v)}
    extra["qkv_cols"] = torch.tensor(w.extra["qkv_cols"])
    return dataclasses.replace(w, extra=extra)


def _restored(w: RankWeights, layout: HeadLayout, rank: int) -> RankWeights:
    """Presharded weights (``_storable``) back into what ``ParallelTransformer`` expects."""
    w.extra["qkv_cols"] = tuple(int(c) for c in w.extra["qkv_cols"].tolist())
    w.extra.update(layout=layout, rank=rank)
    return w


def _layout_meta(layout: HeadLayout, rank: int) -> dict:
    """What a rank's shard depends on beyond ``serialization.weights_meta``: its heads and KV mode."""
    return {"kv_mode": layout.kv_mode, "q_heads": list(layout.q_heads[rank]), "kv_heads": list(layout.kv_heads[rank])}


def check_graphable(layout: HeadLayout, compiled, what: str) -> None:
    """Compiled graphs are the attention and MLP units between the all-reduces (helpers/graphs.py); a layout
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
            w = _restored(gr.load_rank_weights(spec["model_path"], self.rank, spec["weights_meta"][self.rank]),
                          layout, self.rank)
        else:
            w = shard_state_tp(LazyState(spec["model_path"]), args, dtype, self.rank, self.tp, layout)
        w = _to_device(w, device)
        kv_group = None
        if layout.kv_mode == "gather":  # every rank creates every group, in the same order
            gs = layout.group_size
            for g in range(self.tp // gs):
                group = dist.new_group(list(range(g * gs, (g + 1) * gs)))
                if self.rank // gs == g:
                    kv_group = group
        comm = DistComm(self.rank, self.tp, kv_group)
        self.model = ParallelTransformer(args, w, comm, spec["batch_size"], spec["n_positions"], device, dtype)
        quant = spec["neuron_config"].quant
        if quant is not None:
            from .quant import quantize_model
            quantize_model(self.model, quant)
        weights_s = time.perf_counter() - t0
        self._graphs(spec["graphs"], spec["batch_size"])
        parts = weight_breakdown(w)
        return {"rank": self.rank, "weight_bytes": sum(parts.values()), "weights": parts,
                "kv_bytes": self.model.kv_cache_bytes(), "kv_cache_shape": list(self.model.k_cache.shape),
                "q_heads": list(layout.q_heads[self.rank]), "kv_heads": list(layout.kv_heads[self.rank]),
                "kv_mode": layout.kv_mode, "threads": torch.get_num_threads(), "build_s": time.perf_counter() - t0,
                "weights_s": weights_s, "build_report": self.build_report, "device": str(device)}

    def _graphs(self, g: dict, batch: int) -> None:
        """This rank's graph per (kind, bucket), exactly as ``NeuronModel._build_graphs``: loaded from
        ``load_dir`` (fingerprints with this rank), built ("export" / "aoti"), or the eager forward."""
        fields = {**g["fields"], "rank": self.rank}
        if g["load_dir"] is not None:
            self.graphs, self.build_report = gr.load_graphs(g["load_dir"], self.model, fields, self.rank, batch)
        elif g["mode"] in gr.ARTIFACTS:
            if g["mode"] == "aoti":
                import tempfile
                self._workdir = tempfile.TemporaryDirectory(prefix=f"aoti-rank{self.rank}-")
            self.graphs, self.build_report = gr.build_all(self.model, g["kinds"], batch, g["mode"],
                                                          self._workdir and self._workdir.name)
        else:
            self.graphs = {(k, b): self.model.forward for k, bs, _ in g["kinds"] for b in bs}
            self.build_report = [{"graph": f"{k}{b}.step", "kind": k, "bucket": b, "artifact": "eager",
                                  "seconds": 0.0} for k, b in self.graphs]

    def save(self, p: dict) -> dict:
        """This rank's graphs and manifest (+ presharded weights) under its rank's file names."""
        from .serialization import save_rank

        meta = p["weights_meta"][self.rank] if p["sharded_weights"] else None
        saved = save_rank(p["directory"], self.graphs, {**p["fields"], "rank": self.rank}, self.build_report,
                          _storable(self.model.w) if p["sharded_weights"] else None, meta)
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
                                    gr.ArtifactMismatchError, gr.CorruptArtifactError)}


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
    import multiprocessing

    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = torch.multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["helpers.parallel"])
        return ctx
    return torch.multiprocessing.get_context("spawn")


class _SpawnedRanks:
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


class _TorchrunRanks:
    """This process is rank 0 of a torchrun job; the other ranks run :func:`serve_torchrun`."""

    def __init__(self, server: _RankServer, ctrl):
        self.server, self.ctrl = server, ctrl

    def call(self, op: str, payload) -> list:
        dist.broadcast_object_list([op, payload], src=0, group=self.ctrl)
        if op not in GATHERED_OPS:
            return [self.server.handle(op, payload)] + [None] * (self.server.tp - 1)
        out = [None] * self.server.tp
        dist.gather_object(_answer(self.server, op, payload), out, dst=0, group=self.ctrl)
        for r, (status, value) in enumerate(out):
            if status == "error":
                raise _rank_error(r, value)
        return [value for _, value in out]

    def close(self):
        dist.broadcast_object_list(["stop", None], src=0, group=self.ctrl)


def _answer(server: _RankServer, op: str, payload) -> tuple:
    """("ok", result) or ("error", info): every rank reaches the gather even when one fails."""
    try:
        return "ok", server.handle(op, payload)
    except Exception as exc:
        return "error", _error_info(exc)


def _torchrun_env() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "LOCAL_RANK" in os.environ)


def _init_torchrun(device: str):
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    # commands travel on a gloo group with a long timeout (rank 0 may sit in a notebook or wait for input)
    return dist.new_group(backend="gloo", timeout=timedelta(days=1))


def serve_torchrun(device: str = "cpu"):
    """Ranks 1.. of a torchrun job: execute rank 0's commands until it says stop."""
    ctrl = _init_torchrun(device)
    server = _RankServer(dist.get_rank(), dist.get_world_size())
    while True:
        msg = [None, None]
        dist.broadcast_object_list(msg, src=0, group=ctrl)
        op, payload = msg
        if op == "stop":
            break
        if op in GATHERED_OPS:
            dist.gather_object(_answer(server, op, payload), None, dst=0, group=ctrl)
        else:
            server.handle(op, payload)
    dist.destroy_process_group()


# -- the driver --------------------------------------------------------------------------------
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
        kinds = gr.graph_kinds(self.context_buckets, self.token_buckets, self.speculation_length)
        spec = {"model_path": str(self.model_path), "amp": self.amp, "batch_size": self.batch_size,
                "n_positions": self.n_positions, "layout": self.layout, "neuron_config": self.neuron_config,
                "device": self.device.type, "weights_meta": self._weights_meta() if self.presharded else None,
                "graphs": {"kinds": kinds, "load_dir": self._artifacts_dir, "fields": self._graph_fields(),
                           "mode": "export" if self.neuron_config.compiled is True else self.neuron_config.compiled}}
        if self.presharded:  # every rank's file header, before any process starts (as load() checks graphs)
            for r, meta in enumerate(spec["weights_meta"]):
                gr.check_rank_weights(self.model_path, r, meta)
        if _torchrun_env():
            ctrl = _init_torchrun(self.device.type)
            if dist.get_world_size() != self.tp_degree or dist.get_rank() != 0:
                raise ValueError(f"torchrun started {dist.get_world_size()} processes (this is rank "
                                 f"{dist.get_rank()}) but tp_degree={self.tp_degree}: use --nproc-per-node "
                                 f"{self.tp_degree}; ranks other than 0 run helpers.parallel.serve_torchrun()")
            self._ranks = _TorchrunRanks(_RankServer(0, self.tp_degree), ctrl)
        else:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            threads = max(1, torch.get_num_threads() // self.tp_degree)  # the ranks share the driver's threads
            self._ranks = _SpawnedRanks(self.tp_degree, backend, threads)
        try:
            self.rank_reports = self._ranks.call("build", spec)
        except BaseException:
            self.close()
            raise
        self.load_s = time.perf_counter() - t0
        self._build_graphs(kinds)
        return self

    def _weights_meta(self) -> list[dict]:
        from .serialization import weights_meta
        return [{**weights_meta(self, r), **_layout_meta(self.layout, r)} for r in range(self.tp_degree)]

    def _build_graphs(self, kinds):
        """One driver-side callable per (kind, bucket) that runs the ranks' graph of that (kind, bucket);
        ``build_report`` from the ranks' reports: ``rank_seconds`` each rank's, ``seconds`` their mean (the
        ranks build at the same time, so the rows add up to at most the wall time of the build)."""
        self.graphs = {(k, b): _RemoteStep(self._ranks, k, b, self.device) for k, bs, _ in kinds for b in bs}
        per_rank = [{row["graph"]: row for row in r["build_report"]} for r in self.rank_reports]
        self.build_report = []
        for row in self.rank_reports[0]["build_report"]:
            secs = [rows[row["graph"]]["seconds"] for rows in per_rank]
            self.build_report.append({**row, "seconds": sum(secs) / len(secs), "rank_seconds": secs})

    # -- serialization: NeuronModel's calls, every rank writing / reading its own files ----------------
    def save(self, directory, sharded_weights: bool = False, mark_presharded: bool = True) -> dict:
        """transformers-neuronx ``save(dir, sharded_weights=False)``: every rank writes its graphs and
        ``graphs-rank{r}.json`` (+ ``weights/tp{r}_sharded_checkpoint.safetensors``); the driver writes the
        settings. Returns {"directory", "graphs" (all ranks), "bytes" (all ranks), "rank_bytes"}."""
        from .serialization import check_save, write_settings

        check_save(self, sharded_weights, mark_presharded)
        ranks = self._require_built()
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
        from .serialization import graph_fields

        if self._ranks is not None:
            raise RuntimeError("load() must come before to_neuron() (as in transformers-neuronx): construct the "
                               "model again, call load(dir), then to_neuron()")
        check_graphable(self.layout, self.neuron_config.compiled, "load()")
        fields = graph_fields(self)
        for r in range(self.tp_degree):
            gr.read_manifest(directory, {**fields, "rank": r}, r)
        self._artifacts_dir = str(directory)
        return self

    def compile(self, compiled_model_path, save_sharded_checkpoint: bool = False) -> dict:
        """NxD Inference ``compile(path)``: build every rank's graphs (if not yet) and write them with the
        settings (+ ``weights/tp{rank}_sharded_checkpoint.safetensors`` with ``save_sharded_checkpoint``)."""
        from .serialization import check_compile

        check_compile(self)
        if self._ranks is None:
            self.to_neuron()
        return self.save(compiled_model_path, save_sharded_checkpoint, mark_presharded=False)

    def enable_speculative_decoder(self, speculation_length: int) -> None:
        if self._ranks is not None:
            raise RuntimeError("enable_speculative_decoder(k) must be called before to_neuron(): the "
                               "speculative graph is compiled with the others (transformers-neuronx: same rule)")
        super().enable_speculative_decoder(speculation_length)

    def _require_built(self):
        if self._ranks is None:
            raise RuntimeError("The model is not built: call .to_neuron() first (as on Neuron).")
        return self._ranks

    def all_reduce_latency(self, n: int = 50) -> float:
        """Measured seconds per all-reduce of one decode step's activation (slowest rank)."""
        return max(self._require_built().call("bench_all_reduce", (n, self.batch_size)))

    @property
    def collectives_per_step(self) -> int:
        """All-reduces after o_proj and down_proj in every layer, plus the LM head's all-gather."""
        return 2 * self.args.n_layers + 1

    @property
    def rank_weight_bytes(self) -> list[int]:
        self._require_built()
        return [r["weight_bytes"] for r in self.rank_reports]

    @property
    def rank_kv_bytes(self) -> list[int]:
        self._require_built()
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


# -- command line / torchrun -------------------------------------------------------------------
def main(argv=None):
    p = argparse.ArgumentParser(description="Greedy generation with the tensor-parallel reference engine.")
    p.add_argument("--tp-degree", type=int, default=None, help="ranks (default: torchrun's world size, else 2)")
    p.add_argument("--model-path", default=None, help="local HF checkpoint dir (default: embedded SmolLM2)")
    p.add_argument("--prompt", default="What is tensor parallelism?")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--n-positions", type=int, default=256)
    p.add_argument("--amp", default="f32")
    p.add_argument("--gqa", default=None, help="GQA strategy value, e.g. shard-over-heads, convert-to-mha")
    p.add_argument("--device", default="cpu")
    p.add_argument("--check", action="store_true", help="compare with tp_degree=1 (needs the whole model on rank 0)")
    a = p.parse_args(argv)
    if _torchrun_env() and int(os.environ["RANK"]) != 0:
        serve_torchrun(a.device)
        return
    tp = a.tp_degree or (int(os.environ["WORLD_SIZE"]) if _torchrun_env() else 2)

    from .config import NeuronConfig
    from .model_store import load_tokenizer
    from .prompts import encode_prompts

    tok = load_tokenizer(a.model_path)
    enc = encode_prompts(tok, [a.prompt], a.batch_size)
    seq_len = enc.input_ids.shape[1] + a.max_new_tokens
    kw = dict(batch_size=a.batch_size, n_positions=a.n_positions, amp=a.amp, device=a.device,
              neuron_config=NeuronConfig(group_query_attention=a.gqa))
    model = ParallelModel.from_pretrained(a.model_path, tp_degree=tp, **kw).to_neuron()
    try:
        out = model.sample(enc.input_ids, seq_len, top_k=1, attention_mask=enc.attention_mask)
        st = model.stats
        itl = (st["token_times_s"][-1] - st["token_times_s"][0]) / max(1, len(st["token_times_s"]) - 1)
        print(f"tp_degree={tp} ({model.layout.name}, {model.layout.kv_mode}): ttft {st['ttft_s'] * 1e3:.0f} ms, "
              f"{itl * 1e3:.1f} ms/token")
        for r in model.rank_reports:
            print(f"  rank {r['rank']}: q heads {r['q_heads']} kv heads {r['kv_heads']} weights "
                  f"{r['weight_bytes'] / 2**20:.1f} MiB, KV cache {r['kv_bytes'] / 2**20:.2f} MiB {r['kv_cache_shape']}")
        print(repr(tok.decode(out[0, enc.input_ids.shape[1]:], skip_special_tokens=True)))
        if a.check:
            ref = NeuronModel.from_pretrained(a.model_path, tp_degree=1, **kw).to_neuron()
            same = torch.equal(ref.sample(enc.input_ids, seq_len, top_k=1, attention_mask=enc.attention_mask), out)
            print("greedy tokens identical to tp_degree=1:", same)
            if not same:
                raise SystemExit(1)
    finally:
        model.close()


if __name__ == "__main__":
    from helpers.parallel import main as _main  # run from the importable module: ranks pickle its functions

    _main()
