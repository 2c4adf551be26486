"""Tensor parallelism for the reference engine: one process per rank, real collectives.

As in transformers-neuronx / NxD Inference (Megatron-style): q/k/v and gate/up are column-parallel,
o and down are row-parallel and followed by an all-reduce, the LM head is vocabulary-parallel (its
logits all-gathered); query heads are padded up to a multiple of ``tp_degree`` and KV heads replicated
or split as the chosen GQA strategy says (``helpers.gqa``). Each rank is a separate process that
holds only its shard and its own KV cache; collectives go through ``torch.distributed`` (gloo on
CPU, nccl on CUDA with one GPU per rank).

``ParallelModel`` has ``NeuronModel``'s API (``from_pretrained``, ``to_neuron``, ``sample``, ``forward``,
``stats``); the driver (your process) runs the sampling loop and sends each fixed-shape step to the
ranks. Ranks are started with ``torch.multiprocessing`` (spawn), or are the processes of a ``torchrun``
job::

    python -m helpers.parallel --tp-degree 2 --max-new-tokens 16 --check
    torchrun --nproc-per-node 2 -m helpers.parallel --max-new-tokens 16 --check
"""
from __future__ import annotations

import argparse
import contextlib
import functools
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

import torch
import torch.distributed as dist

from .config import ModelArgs, amp_dtype
from .engine import Comm, LayerWeights, NeuronModel, RankWeights, Transformer
from .gqa import HeadLayout, resolve_layout, round_up
from .model_store import load_config, load_state_dict, resolve_model_path

COLLECTIVE_TIMEOUT_S = 600  # a rank stuck in a collective longer than this fails instead of hanging
GATHERED_OPS = {"build", "bench_all_reduce"}  # commands whose every rank's result the driver needs


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
    if device.type == "cpu":
        return w
    mv = lambda t: None if t is None else t.to(device)  # noqa: E731
    tied = w.lm_head is w.embed
    w.embed, w.norm, w.lm_head, w.kv_group = mv(w.embed), mv(w.norm), mv(w.lm_head), mv(w.kv_group)
    if tied:
        w.lm_head = w.embed
    for L in w.layers:
        for n in ("wqkv", "wo", "w13", "w2", "ln1", "ln2", "bqkv", "bo"):
            setattr(L, n, mv(getattr(L, n)))
    return w


class _RankServer:
    """Builds one rank's shard and runs its fixed-shape steps."""

    def __init__(self, rank: int, tp: int):
        self.rank, self.tp = rank, tp
        self.model = None

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
        w = _to_device(shard_state_tp(LazyState(spec["model_path"]), args, dtype, self.rank, self.tp, layout), device)
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
        self.fwd = self.model.forward
        if spec["neuron_config"].compiled:
            self.fwd = torch.compile(self.model.forward, dynamic=False, fullgraph=False)
        parts = weight_breakdown(w)
        return {"rank": self.rank, "weight_bytes": sum(parts.values()), "weights": parts,
                "kv_bytes": self.model.kv_cache_bytes(), "kv_cache_shape": list(self.model.k_cache.shape),
                "q_heads": list(layout.q_heads[self.rank]), "kv_heads": list(layout.kv_heads[self.rank]),
                "kv_mode": layout.kv_mode, "threads": torch.get_num_threads(), "build_s": time.perf_counter() - t0,
                "device": str(device)}

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
        tokens, rope_pos, slots, kv_len, mask, idx = payload
        dev = self.model.device
        logits = self.fwd(tokens.to(dev), rope_pos.to(dev), slots.to(dev), kv_len, mask.to(dev), idx.to(dev))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return logits.cpu() if self.rank == 0 else None


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
            except Exception:  # reported to the driver, which stops every rank
                _send(conn, ("error", traceback.format_exc()))
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

    def _collect(self) -> list:
        results, pending = [None] * len(self.conns), set(range(len(self.conns)))
        while pending:
            for r in sorted(pending):
                if self.conns[r].poll(0.05):
                    status, value = _recv(self.conns[r])
                    if status == "error":
                        self.close()
                        raise RuntimeError(f"tensor-parallel rank {r} failed:\n{value}")
                    results[r] = value
                    pending.discard(r)
                elif not self.procs[r].is_alive():
                    code = self.procs[r].exitcode
                    self.close()
                    raise RuntimeError(f"tensor-parallel rank {r} exited with code {code} (its stderr has the "
                                       "reason; out of memory kills show as -9)")
        return results

    def call(self, op: str, payload) -> list:
        for c in self.conns:
            _send(c, (op, payload))
        return self._collect()

    def close(self):
        self._finalizer()


class _TorchrunRanks:
    """This process is rank 0 of a torchrun job; the other ranks run :func:`serve_torchrun`."""

    def __init__(self, server: _RankServer, ctrl):
        self.server, self.ctrl = server, ctrl

    def call(self, op: str, payload) -> list:
        dist.broadcast_object_list([op, payload], src=0, group=self.ctrl)
        result = self.server.handle(op, payload)
        if op in GATHERED_OPS:
            out = [None] * self.server.tp
            dist.gather_object(result, out, dst=0, group=self.ctrl)
            return out
        return [result] + [None] * (self.server.tp - 1)

    def close(self):
        dist.broadcast_object_list(["stop", None], src=0, group=self.ctrl)


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
        result = server.handle(op, payload)
        if op in GATHERED_OPS:
            dist.gather_object(result, None, dst=0, group=ctrl)
    dist.destroy_process_group()


# -- the driver --------------------------------------------------------------------------------
class ParallelModel(NeuronModel):
    """``NeuronModel`` with ``tp_degree`` ranks in their own processes (transformers-neuronx's ``tp_degree``).

    ``rank_reports`` (after ``to_neuron``) lists what each rank holds: query/KV heads, weight and KV-cache
    bytes, the cache shape. ``weight_bytes`` / ``kv_cache_bytes`` are the largest rank's (what one
    NeuronCore must hold). Each rank gets ``torch.get_num_threads() // tp_degree`` threads (at least 1), so
    tp ranks use the cores one process would. Call ``close()`` (or use ``with``) to stop the ranks early.
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

    def to_neuron(self) -> "ParallelModel":
        t0 = time.perf_counter()
        if self._ranks is not None:
            raise RuntimeError("to_neuron() was already called on this model")
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
        spec = {"model_path": str(self.model_path), "amp": self.amp, "batch_size": self.batch_size,
                "n_positions": self.n_positions, "layout": self.layout, "neuron_config": self.neuron_config,
                "device": self.device.type}
        try:
            self.rank_reports = self._ranks.call("build", spec)
        except BaseException:
            self.close()
            raise
        self.load_s = time.perf_counter() - t0
        self._build_graphs()
        return self

    def _build_graphs(self):
        self.graphs, self.build_report = {}, []
        kinds = [("context", self.context_buckets), ("token", self.token_buckets)]
        if self.speculation_length:  # enable_speculative_decoder(k) was called: a k+1-token scoring graph
            kinds.append(("speculative", self.token_buckets))
        for kind, sizes in kinds:
            for b in sizes:
                self.graphs[(kind, b)] = functools.partial(self._remote_step, kind, b)
                self.build_report.append({"graph": f"{kind}[{b}]", "seconds": 0.0})

    def _remote_step(self, kind, bucket, tokens, rope_pos, slots, kv_len, mask, logit_idx):
        payload = (tokens.cpu(), rope_pos.cpu(), slots.cpu(), kv_len, mask.cpu(), logit_idx.cpu())
        return self._ranks.call("forward", payload)[0].to(self.device)

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
