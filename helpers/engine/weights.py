"""One rank's weights: the checkpoint's tensors fused (q/k/v and gate/up, as Neuron's ``fuse_qkv``), cast and
sharded Megatron-style: q/k/v and gate/up column-parallel, o and down row-parallel, the LM head
vocabulary-parallel, heads padded or replicated as the GQA strategy says (``helpers.planning.gqa``)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..planning.gqa import HeadLayout, resolve_layout, round_up
from .config import ModelArgs


def stored(w):
    """The tensor a weight keeps: a ``model.Linear``'s or ``helpers.engine.cpu.kernels.CpuWeight``'s ``dense``, else
    the weight itself (a tensor, or an int8 ``helpers.engine.quant.QuantWeight``)."""
    return getattr(w, "dense", w)


MATRICES = ("wqkv", "wo", "w13", "w2")  # a layer's matmul weights, in the order a step reads them


@dataclass
class LayerWeights:
    wqkv: torch.Tensor      # [(q_local + 2 * kv_local) * head_dim, hidden]   column-parallel
    wo: torch.Tensor        # [hidden, q_local * head_dim]                      row-parallel
    w13: torch.Tensor       # [2 * ffn_local, hidden]  (gate; up)               column-parallel
    w2: torch.Tensor        # [hidden, ffn_local]                               row-parallel
    ln1: torch.Tensor
    ln2: torch.Tensor
    bqkv: torch.Tensor | None = None
    bo: torch.Tensor | None = None


@dataclass(frozen=True)
class RankShard:
    """Where one rank's weights sit in a tensor-parallel (or GQA) layout: what ``helpers.parallel``'s attention
    reads."""
    layout: HeadLayout
    rank: int
    qkv_cols: tuple[int, int, int]  # the fused QKV projection's q, k and v output columns on this rank


@dataclass
class RankWeights:
    """One rank's shard. ``n_q``/``n_kv`` are this rank's (padded) head counts."""
    embed: torch.Tensor     # [vocab, hidden] (replicated)
    norm: torch.Tensor
    lm_head: torch.Tensor   # [vocab_local, hidden]   vocabulary-parallel
    layers: list[LayerWeights]
    n_q: int
    n_kv: int
    vocab_size: int         # the unpadded vocabulary (gathered logits are cut to it)
    kv_group: torch.Tensor | None = None  # per local q head: index of its local kv head (None: n_q // n_kv groups)
    shard: RankShard | None = None  # the layout followed (tp > 1 or a GQA setting)

    @property
    def tied(self) -> bool:
        """The LM head is the embedding table (one tensor)."""
        return stored(self.lm_head) is self.embed

    def matrices(self) -> list:
        """The matrices a decode step streams, in the order it reads them (per layer, then the LM head)."""
        return [getattr(L, n) for L in self.layers for n in MATRICES] + [self.lm_head]

    def relayout(self, make) -> None:
        """Replace every matrix by ``make(its stored tensor)`` (a tied embedding follows the LM head's)."""
        tied = self.tied
        for L in self.layers:
            for n in MATRICES:
                setattr(L, n, make(stored(getattr(L, n))))
        self.lm_head = make(stored(self.lm_head))
        if tied:  # one tensor serves both (an embedding row gather reads 576 strided floats: cheap)
            self.embed = stored(self.lm_head)


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
    """Stack the given heads' slices of ``t`` along ``dim``; head -1 is a zero (padding) head. Every head in
    order is ``t`` itself."""
    if list(heads) == list(range(t.shape[dim] // head_dim)):
        return t
    parts = []
    for h in heads:
        if h >= 0:
            parts.append(t.narrow(dim, h * head_dim, head_dim))
        else:
            shape = list(t.shape)
            shape[dim] = head_dim
            parts.append(t.new_zeros(shape))
    return torch.cat(parts, dim=dim)


def shard_state(state, args: ModelArgs, dtype: torch.dtype, rank: int = 0, tp: int = 1, gqa=None,
                batch_size: int | None = None) -> RankWeights:
    """One rank's weights. ``gqa``: a strategy (resolved here, with the library's fallbacks) or a HeadLayout.
    ``shard`` records the layout, the rank and the fused QKV split whenever there is a layout to follow
    (tp > 1 or a GQA setting)."""
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
    shard = RankShard(layout, rank, (q.shape[0], k.shape[0], v.shape[0]))
    return RankWeights(
        embed=embed, norm=get("model.norm.weight"), lm_head=_chunk(lm, 0, tp, rank), layers=layers,
        n_q=args.n_heads if mode == "batch" else len(q_heads), n_kv=len(kv_heads), vocab_size=args.vocab_size,
        kv_group=None if kv_group is None else torch.tensor(kv_group),
        shard=shard if tp > 1 or gqa is not None else None)


def weight_breakdown(w: RankWeights) -> dict:
    """Bytes of one rank's weights by part (the embedding is replicated; tnx keeps it on the host). A weight object
    counts its stored matrix (int8: values and scales)."""
    nbytes = lambda t: 0 if t is None else t.nbytes  # noqa: E731
    layers = sum(nbytes(getattr(L, n)) for L in w.layers for n in MATRICES + ("bqkv", "bo"))
    norms = nbytes(w.norm) + sum(nbytes(L.ln1) + nbytes(L.ln2) for L in w.layers)
    lm_head = 0 if w.tied else nbytes(w.lm_head)
    return {"embedding": nbytes(w.embed), "layers": layers, "norms": norms, "lm_head": lm_head}


def move_weights(w: RankWeights, device: torch.device) -> RankWeights:
    """Put every tensor on the device (tied tensors stay one tensor). On CPU, copy the tensors that
    safetensors left at unaligned offsets: BLAS kernels round differently on unaligned data, and the
    model must compute bit for bit the same whether its weights came from the checkpoint or from
    presharded files (helpers.artifacts)."""
    memo = {}

    def mv(t):
        if not torch.is_tensor(t):
            return t
        if id(t) not in memo:
            if device.type != "cpu":
                memo[id(t)] = t.to(device)
            else:
                memo[id(t)] = t if t.data_ptr() % 64 == 0 else t.clone()
        return memo[id(t)]

    w.embed, w.norm, w.lm_head, w.kv_group = mv(w.embed), mv(w.norm), mv(w.lm_head), mv(w.kv_group)
    for L in w.layers:
        for name, t in list(vars(L).items()):
            setattr(L, name, mv(t))
    return w
