"""The reference engine: a Neuron-compiled causal LM, mirrored in plain PyTorch.

It keeps the Neuron programming model: the model is built for a fixed ``batch_size`` and
``n_positions``; the KV cache is preallocated once in ``to_neuron()``; a prompt runs
through a context-encoding graph padded to a context bucket, and every new token through a
token-generation graph that attends over a token bucket of KV positions. Call shapes are
transformers-neuronx's (``from_pretrained``, ``to_neuron``, ``sample``, ``forward``).

Layout (gpt-fast style: small, flat): ``Transformer`` holds one rank's weights (fused QKV and
gate/up as Neuron's ``fuse_qkv`` does) and a ``Comm`` for collectives (a no-op at tp=1);
``NeuronModel`` owns the cache, the buckets and the sampling loop.
"""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from . import buckets as bk
from .config import GQA, ModelArgs, NeuronConfig, amp_dtype, reject_unknown
from .model_store import load_config, load_state_dict, resolve_model_path
from .sampling import select_next_tokens, validate_input_ids, validate_sampling_args


class Comm:
    """Collectives of one tensor-parallel group; this one is the single-rank group."""
    rank = 0
    world_size = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return x


def rope_inv_freq(args: ModelArgs) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and scaling, from transformers' own RoPE functions (llama3, yarn, ...)."""
    rope = args.hf_config.get("rope_parameters") or args.hf_config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        d = args.head_dim
        return 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float) / d)), 1.0
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = AutoConfig.for_model(**args.hf_config)
    return ROPE_INIT_FUNCTIONS[rope_type](cfg)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # As transformers' LlamaRMSNorm: statistics in f32, scale in the input dtype. In f32 that is
    # exactly torch's fused rms_norm (one kernel instead of six).
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """transformers' ``x * cos + rotate_half(x) * sin`` with the sign of rotate_half folded into
    ``sin_signed`` = cat(-sin[:D/2], sin[D/2:]): three kernels instead of six."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.addcmul(x * cos, torch.cat((x2, x1), dim=-1), sin_signed)


def column_major(t: torch.Tensor) -> torch.Tensor:
    """The same [out, in] tensor stored [in, out] in memory (shape unchanged, strides swapped)."""
    return t.t().contiguous().t()


def decode_layout(w: "RankWeights") -> None:
    """Store f32 weights column-major for :func:`cpu_linear` (decode reads every weight once per token).

    transformers-neuronx stores its weights transposed too (``llama/model.py`` ``load_weights``:
    ``q_proj.weight.detach().T``). Shapes are unchanged, so every seam that takes [out, in] weights
    (``Transformer.linear``, quantizers, sharding, serialization) still works.
    """
    for L in w.layers:
        L.wqkv, L.wo, L.w13, L.w2 = (column_major(t) for t in (L.wqkv, L.wo, L.w13, L.w2))
    tied = w.lm_head is w.embed
    w.lm_head = column_major(w.lm_head)
    if tied:  # one tensor serves both (an embedding row gather reads 576 strided floats: cheap)
        w.embed = w.lm_head


_MKLDNN_LINEAR = (getattr(torch.ops.mkldnn, "_linear_pointwise", None)
                  if torch.backends.mkldnn.is_available() else None)

MATMUL_KERNELS = {"one_row": ("split-k", "mkl"), "rows": ("onednn", "mkl")}
MATMUL_ENV = {"one_row": "NEURON_NB_GEMV", "rows": "NEURON_NB_GEMM"}  # force a kernel (reproducible figures)
MATMUL_TUNE_MIN_BYTES = 32 << 20  # weights that fit in cache say nothing about DRAM-bound decode
MATMUL_TUNE_ROWS = 8  # several rows: speculative verification (k + 1), batch 8
matmul_tuning: dict[int, dict] = {}  # threads -> {case: {"kernel", "ms": {kernel: ms per pass}}, "bytes", "n_rows"}


def split_k_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, n: int) -> torch.Tensor:
    """One row times a column-major [out, in] weight, the reduction split into ``n`` contiguous
    blocks of the [in, out] storage (views, no copy), one ``bmm`` batch per thread, then summed."""
    k = x.shape[-1]
    y = torch.bmm(x.reshape(n, 1, k // n), w.t().reshape(n, k // n, -1)).sum(0)  # [1, out]
    y = y.view(x.shape[:-1] + y.shape[-1:])
    return y if b is None else y + b


def onednn_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    # scalars=[None], not []: torch.export.save cannot serialize an empty scalar list
    # ("Empty list with type number nyi"); with attr "none" the scalars are unused.
    return _MKLDNN_LINEAR(x, w, b, "none", [None], "")


def matmul_kernel(case: str, threads: int | None = None) -> str:
    """The kernel :func:`cpu_linear` uses for ``case`` ("one_row" or "rows") at this thread count:
    ``$NEURON_NB_GEMV`` / ``$NEURON_NB_GEMM`` if set, else what :func:`tune_matmuls` measured, else
    split-k / oneDNN."""
    forced = os.environ.get(MATMUL_ENV[case])
    if forced:
        if forced not in MATMUL_KERNELS[case]:
            raise ValueError(f"{MATMUL_ENV[case]}={forced!r}: use one of {MATMUL_KERNELS[case]} or unset it")
        return forced
    n = torch.get_num_threads() if threads is None else threads
    return matmul_tuning.get(n, {}).get(case, {}).get("kernel", MATMUL_KERNELS[case][0])


def decode_matrices(w: "RankWeights") -> list[torch.Tensor]:
    """The matrices a decode step streams, in the order it reads them (per layer, then the LM head)."""
    return [t for L in w.layers for t in (L.wqkv, L.wo, L.w13, L.w2)] + [w.lm_head]


def matmul_pass_seconds(linear, weights: list[torch.Tensor], xs: dict, repeats: int = 1, pause=None) -> float:
    """Best of ``repeats`` passes of ``linear(xs[in_features], w)`` over ``weights``, calling
    ``pause()`` after each matmul if given."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for t in weights:
            linear(xs[t.shape[1]], t)
            if pause is not None:
                pause()
        best = min(best, time.perf_counter() - t0)
    return best


def tune_matmuls(weights: list[torch.Tensor], repeats: int = 3) -> dict | None:
    """Choose :func:`cpu_linear`'s kernels once per process and thread count by timing them on the
    model's own column-major weights (one pass over all of them per try, best of ``repeats``), for one
    row and for MATMUL_TUNE_ROWS rows. The winners depend on the CPU (all 30 SmolLM2 layers + LM head):

    - 2-core AMD EPYC, MKL's GEMV streams 12-20 GB/s: split-k 23 ms per pass against MKL's 32 ms;
      oneDNN ~2x MKL for 5-8 rows (30/45 ms against 65/86 ms).
    - 2-core Intel Xeon (Sapphire Rapids): MKL ahead in both: 19.1 against split-k 20.9 ms;
      34 against oneDNN 40 ms at 8 rows, 46 against 71 ms at 32.

    Only speed differs: every kernel computes F.linear (within f32 rounding). Skipped below
    MATMUL_TUNE_MIN_BYTES or when both kernels are forced."""
    n = torch.get_num_threads()
    weights = [t for t in weights if t.dim() == 2 and t.dtype == torch.float32 and t.stride(0) == 1]
    size = sum(t.numel() * t.element_size() for t in weights)
    if n in matmul_tuning or size < MATMUL_TUNE_MIN_BYTES or all(os.environ.get(e) for e in MATMUL_ENV.values()):
        return matmul_tuning.get(n)
    candidates = {"one_row": {"mkl": lambda x, t: F.linear(x, t)}, "rows": {"mkl": lambda x, t: F.linear(x, t)}}
    if n > 1 and all(t.shape[1] % n == 0 for t in weights):
        candidates["one_row"]["split-k"] = lambda x, t: split_k_linear(x, t, None, n)
    if _MKLDNN_LINEAR is not None:
        candidates["rows"]["onednn"] = onednn_linear
    out = {"bytes": size, "n_rows": MATMUL_TUNE_ROWS}
    with torch.inference_mode():
        for case, rows in (("one_row", 1), ("rows", MATMUL_TUNE_ROWS)):
            xs = {t.shape[1]: torch.randn(rows, t.shape[1]) for t in weights}
            best = {name: float("inf") for name in candidates[case]}
            for _ in range(repeats + 1):  # the first round warms up; kernels alternate per round
                for name, fn in candidates[case].items():
                    best[name] = min(best[name], matmul_pass_seconds(fn, weights, xs))
            out[case] = {"kernel": min(best, key=best.get), "ms": {k: round(v * 1e3, 2) for k, v in best.items()}}
    matmul_tuning[n] = out
    return out


def cpu_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for f32 weights stored column-major on CPU (:func:`decode_layout`), by the kernel
    :func:`tune_matmuls` measured fastest on this machine (``ci/benchmark.py`` prints the figures):

    - one row (batch-1 decode): split-k (:func:`split_k_linear`) or MKL's GEMV (``F.linear``);
    - several rows (speculative verification, batch > 1, prefill): oneDNN's linear
      (``mkldnn._linear_pointwise``, what torch.compile's CPU backend emits) or MKL's GEMM.

    Any other weight (row-major, bf16, int8 storage) goes to ``F.linear``.
    """
    if w.stride(0) != 1 or w.dtype != torch.float32 or w.dim() != 2:
        return F.linear(x, w, b)
    k = x.shape[-1]
    if x.numel() == k:  # (cheap checks only: this runs ~120 times per token)
        n = torch.get_num_threads()
        if n > 1 and k % n == 0 and matmul_kernel("one_row", n) == "split-k":
            return split_k_linear(x, w, b, n)
        return F.linear(x, w, b)
    if _MKLDNN_LINEAR is not None and matmul_kernel("rows") == "onednn":
        return onednn_linear(x, w, b)
    return F.linear(x, w, b)


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
    extra: dict = field(default_factory=dict)


def shard_state(state: dict, args: ModelArgs, dtype: torch.dtype, rank: int = 0, tp: int = 1,
                gqa: GQA | None = None) -> RankWeights:
    """Fuse and cast the checkpoint's tensors for one rank. tp=1 here; ``helpers.parallel`` shards."""
    if tp != 1 or gqa is not None:
        from .parallel import shard_state_tp  # tensor-parallel sharding with head padding / KV replication

        return shard_state_tp(state, args, dtype, rank, tp, gqa)
    p = "model."

    def get(name):
        return state[name].to(dtype)

    layers = []
    for i in range(args.n_layers):
        a, m = f"{p}layers.{i}.self_attn.", f"{p}layers.{i}.mlp."
        bq = None
        if args.attention_bias:
            bq = torch.cat([get(a + "q_proj.bias"), get(a + "k_proj.bias"), get(a + "v_proj.bias")])
        layers.append(LayerWeights(
            wqkv=torch.cat([get(a + "q_proj.weight"), get(a + "k_proj.weight"), get(a + "v_proj.weight")]),
            wo=get(a + "o_proj.weight"),
            w13=torch.cat([get(m + "gate_proj.weight"), get(m + "up_proj.weight")]),
            w2=get(m + "down_proj.weight"),
            ln1=get(f"{p}layers.{i}.input_layernorm.weight"),
            ln2=get(f"{p}layers.{i}.post_attention_layernorm.weight"),
            bqkv=bq,
            bo=get(a + "o_proj.bias") if args.attention_bias and (a + "o_proj.bias") in state else None,
        ))
    embed = get(p + "embed_tokens.weight")
    lm_head = embed if args.tie_word_embeddings or "lm_head.weight" not in state else get("lm_head.weight")
    return RankWeights(embed=embed, norm=get(p + "norm.weight"), lm_head=lm_head, layers=layers,
                       n_q=args.n_heads, n_kv=args.n_kv_heads, vocab_size=args.vocab_size)


class Transformer:
    """One rank's forward pass over a fixed-shape KV cache.

    ``forward(tokens [B,T], rope_pos [B,T], slots [T], kv_len, mask [B,T,kv_len], logit_idx)``
    writes this step's K/V at ``slots`` and attends over cache positions ``[0, kv_len)``.
    """

    def __init__(self, args: ModelArgs, w: RankWeights, comm: Comm, batch_size: int, n_positions: int,
                 device: torch.device, dtype: torch.dtype):
        self.args, self.w, self.comm = args, w, comm
        self.dtype, self.device = dtype, device
        self.linear = F.linear  # seam: int8 storage swaps in a dequantizing linear
        inv_freq, scale = rope_inv_freq(args)
        pos = torch.arange(n_positions, dtype=torch.float)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * scale).to(device=device, dtype=dtype)
        self.sin = (emb.sin() * scale).to(device=device, dtype=dtype)
        half = args.head_dim // 2
        self.sin_signed = torch.cat((-self.sin[:, :half], self.sin[:, half:]), dim=-1)
        if device.type == "cpu" and dtype == torch.float32:
            decode_layout(w)
            self.linear = cpu_linear
            tune_matmuls(decode_matrices(w))
        shape = (args.n_layers, batch_size, w.n_kv, n_positions, args.head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)

    def kv_cache_bytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    def attention(self, q, k_all, v_all, mask):
        if self.w.kv_group is not None:  # arbitrary q->kv mapping (padded / replicated layouts)
            k_all, v_all = k_all[:, self.w.kv_group], v_all[:, self.w.kv_group]
            return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=self.w.n_q != self.w.n_kv)

    def qkv(self, L: LayerWeights, h):
        """Column-parallel fused projection -> q, k, v, each [B, T, heads * head_dim] of this rank."""
        nq, nkv = self.w.n_q * self.args.head_dim, self.w.n_kv * self.args.head_dim
        qkv = self.linear(h, L.wqkv, L.bqkv)
        return qkv[..., :nq], qkv[..., nq:nq + nkv], qkv[..., nq + nkv:]

    def attend_heads(self, i: int, q, k, v, cos, sin, slots, kv_len: int, attn_mask):
        """RoPE (``cos``/``sin`` [B, T, 1, D], ``sin`` sign-folded, see ``apply_rope``), write K/V at
        ``slots`` of layer i's cache, attend over [0, kv_len) -> [B, T, n_q * head_dim]."""
        B, T, _ = q.shape
        D = self.args.head_dim
        q = apply_rope(q.reshape(B, T, -1, D), cos, sin).transpose(1, 2)
        k = apply_rope(k.reshape(B, T, -1, D), cos, sin).transpose(1, 2)
        v = v.reshape(B, T, -1, D).transpose(1, 2)
        self.k_cache[i].index_copy_(2, slots, k)
        self.v_cache[i].index_copy_(2, slots, v)
        o = self.attention(q, self.k_cache[i, :, :, :kv_len], self.v_cache[i, :, :, :kv_len], attn_mask)
        return o.transpose(1, 2).reshape(B, T, -1)

    def attend(self, i: int, L: LayerWeights, h, cos, sin, slots, kv_len: int, attn_mask):
        """Layer i's attention on this rank: [B, T, hidden] -> the input of the row-parallel o_proj.
        Seam: ``helpers.parallel`` overrides it for SHARD_OVER_BATCH / ALL_GATHER_HEADS layouts."""
        q, k, v = self.qkv(L, h)
        return self.attend_heads(i, q, k, v, cos, sin, slots, kv_len, attn_mask)

    def attn_block(self, i: int, x, L: LayerWeights, cos, sin, slots, kv_len: int, attn_mask):
        """Layer i's attention from its input norm to o_proj, up to the all-reduce (one compiled graph
        per bucket in helpers/graphs.py, which calls it with the layer's cache as layer 0's)."""
        h = rms_norm(x, L.ln1, self.args.rms_norm_eps)
        return self.linear(self.attend(i, L, h, cos, sin, slots, kv_len, attn_mask), L.wo)

    def mlp_block(self, x, L: LayerWeights):
        """One layer's gated MLP up to its all-reduce."""
        h = rms_norm(x, L.ln2, self.args.rms_norm_eps)
        g, u = self.linear(h, L.w13).chunk(2, dim=-1)
        return self.linear(F.silu(g) * u, L.w2)

    @torch.inference_mode()
    def forward(self, tokens, rope_pos, slots, kv_len: int, mask, logit_idx=None, blocks=None):
        """``blocks`` = (attn, mlp) callables with the signatures of ``attn_block`` / ``mlp_block``:
        the compiled per-bucket graphs of helpers/graphs.py; None = eager. The all-reduces stay here,
        between blocks, so a compiled graph of a heads-sharded layout contains no collective."""
        a, w = self.args, self.w
        B, T = tokens.shape
        attn, mlp = blocks or (self.attn_block, self.mlp_block)
        x = F.embedding(tokens, w.embed)
        cos = self.cos[rope_pos].unsqueeze(2)  # [B,T,1,D]: RoPE is applied before the head transpose
        sin = self.sin_signed[rope_pos].unsqueeze(2)
        attn_mask = mask.unsqueeze(1)
        for i, L in enumerate(w.layers):
            o = self.comm.all_reduce(attn(i, x, L, cos, sin, slots, kv_len, attn_mask))
            x = x + o if L.bo is None else x + o + L.bo
            x = x + self.comm.all_reduce(mlp(x, L))
        if logit_idx is not None:
            x = x[torch.arange(B, device=x.device)[:, None], logit_idx]
        x = rms_norm(x, w.norm, a.rms_norm_eps)
        logits = self.comm.all_gather(self.linear(x, w.lm_head), dim=-1)
        return logits[..., : w.vocab_size].float()


def build_mask(slots: torch.Tensor, start_ids: torch.Tensor, kv_len: int, window: int | None) -> torch.Tensor:
    """[B, T, kv_len] bool: a query at cache slot i sees slot j iff start_b <= j <= i (and i - j < window)."""
    j = torch.arange(kv_len, device=slots.device)
    i = slots[:, None]
    vis = (j[None, :] <= i)
    if window:
        vis = vis & (i - j[None, :] < window)
    return vis[None, :, :] & (j[None, None, :] >= start_ids[:, None, None])


class NeuronModel:
    """A causal LM built like a Neuron model. Prefer the aliases ``LlamaForSampling`` /
    ``MistralForSampling`` / ``NeuronAutoModelForCausalLM`` and their ``from_pretrained``.

    Differences from transformers-neuronx, on purpose: ``tp_degree`` defaults to 1 (there: 2);
    unknown keywords raise (there: silently ignored); stopping criteria receive the ids generated
    so far (there: the prompt, aws-neuron/transformers-neuronx#75).
    """

    ARGS = ("batch_size", "n_positions", "tp_degree", "amp", "context_length_estimate",
            "neuron_config", "device", "nxdi_bucketing")

    def __init__(self, model_path=None, *, batch_size: int = 1, n_positions=2048, tp_degree: int = 1,
                 amp: str = "f32", context_length_estimate=None, neuron_config: NeuronConfig | None = None,
                 device: str = "cpu", nxdi_bucketing: bk.NxDIBucketing | None = None):
        self.model_path = resolve_model_path(model_path)
        hf_config = load_config(self.model_path)
        self.args = ModelArgs.from_hf(hf_config)
        # save(dir, sharded_weights=True) marks its config.json so (as transformers-neuronx's
        # from_pretrained) the weights load presharded, without fusing / casting / sharding again
        self.presharded = bool(hf_config.get("is_presharded_checkpoint", False))
        self.batch_size, self.tp_degree, self.amp = int(batch_size), int(tp_degree), amp
        self.dtype = amp_dtype(amp)
        self.device = torch.device(device)
        self.neuron_config = neuron_config or NeuronConfig()
        self.nxdi_bucketing = nxdi_bucketing
        if nxdi_bucketing is None:  # transformers-neuronx rules
            self.token_buckets = bk.tnx_token_buckets(n_positions)
            self.context_buckets = bk.tnx_context_buckets(context_length_estimate, self.token_buckets)
        else:  # NxD Inference rules: n_positions is its seq_len (max_length)
            if context_length_estimate is not None or not isinstance(n_positions, int):
                raise ValueError("With nxdi_bucketing, n_positions is NxDI's seq_len (an int) and the buckets "
                                 "come from NxDIBucketing(context_encoding_buckets=, token_generation_buckets=): "
                                 "drop context_length_estimate / the n_positions list")
            self.context_buckets, self.token_buckets = nxdi_bucketing.buckets(n_positions)
        self.n_positions = self.token_buckets[-1]
        self.settings = {"batch_size": self.batch_size, "n_positions": n_positions, "tp_degree": self.tp_degree,
                         "amp": amp, "context_length_estimate": context_length_estimate,
                         "nxdi_bucketing": None if nxdi_bucketing is None else asdict(nxdi_bucketing)}
        self._validate()
        self.model: Transformer | None = None
        self.speculation_length = 0
        self.build_report: list[dict] = []
        self.stats: dict = {}
        self._artifacts_dir = None  # set by load(dir): to_neuron() then loads graphs instead of building
        self._workdir = None

    @classmethod
    def from_pretrained(cls, model_path=None, **kwargs) -> "NeuronModel":
        reject_unknown(kwargs, cls.ARGS, f"{cls.__name__}.from_pretrained")
        return cls(model_path, **kwargs)

    # -- checks before any build -------------------------------------------------------------
    def _validate(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size}: must be >= 1")
        if self.tp_degree < 1:
            raise ValueError(f"tp_degree={self.tp_degree}: must be >= 1")
        if any(b < 1 for b in self.token_buckets + self.context_buckets):
            raise ValueError(f"buckets must be positive: n_positions -> {self.token_buckets}, "
                             f"context_length_estimate -> {self.context_buckets}")
        if self.context_buckets and self.context_buckets[-1] > self.n_positions:  # tnx module.py _sanity_check
            raise ValueError(f"Max context_length_estimate {self.context_buckets[-1]} cannot be more than max "
                             f"n_positions {self.n_positions}: lower context_length_estimate")
        if self.presharded and not self.neuron_config.on_device_embedding:  # tnx base.py
            raise ValueError("on_device_embedding must be True to save and load presharded weights: pass "
                             "neuron_config=NeuronConfig(on_device_embedding=True)")
        if self.presharded and self.neuron_config.quant is not None:
            raise ValueError("Presharded weights are stored unquantized: load them without neuron_config.quant")
        if self.n_positions > self.args.max_position_embeddings:
            raise ValueError(f"n_positions={self.n_positions} exceeds the model's max_position_embeddings="
                             f"{self.args.max_position_embeddings}: lower n_positions")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device: use device='cpu'")
        if self.neuron_config.quant is not None:
            from .quant import check_quant_config
            check_quant_config(self.neuron_config.quant, self.amp)
            if self.tp_degree != 1:
                raise ValueError("int8 weight storage runs at tp_degree=1 in the reference engine: set tp_degree=1 "
                                 "or drop neuron_config.quant")

    # -- build ----------------------------------------------------------------------------------
    def to_neuron(self) -> "NeuronModel":
        """Load and shard the weights, allocate the KV cache, build one graph per bucket."""
        t0 = time.perf_counter()
        if self.tp_degree != 1:
            raise ValueError(f"tp_degree={self.tp_degree}: tensor parallelism runs in "
                             "helpers.parallel.ParallelModel (one process per rank)")
        if self.presharded:
            from .serialization import load_presharded
            weights = load_presharded(self, 0)
        else:
            state = load_state_dict(self.model_path)
            weights = shard_state(state, self.args, self.dtype, gqa=self.neuron_config.group_query_attention)
            del state
        weights = self._move(weights)
        self.model = Transformer(self.args, weights, Comm(), self.batch_size, self.n_positions,
                                 self.device, self.dtype)
        if self.neuron_config.quant is not None:
            from .quant import quantize_model
            quantize_model(self.model, self.neuron_config.quant)
        self.load_s = time.perf_counter() - t0
        self._build_graphs()
        return self

    def _move(self, w: RankWeights) -> RankWeights:
        """Put every tensor on the device (tied tensors stay one tensor). On CPU, copy the tensors that
        safetensors left at unaligned offsets: BLAS kernels round differently on unaligned data, and the
        model must compute bit for bit the same whether its weights came from the checkpoint or from
        presharded files (helpers/graphs.py)."""
        memo = {}

        def mv(t):
            if not torch.is_tensor(t):
                return t
            if id(t) not in memo:
                if self.device.type != "cpu":
                    memo[id(t)] = t.to(self.device)
                else:
                    memo[id(t)] = t if t.data_ptr() % 64 == 0 else t.clone()
            return memo[id(t)]

        w.embed, w.norm, w.lm_head, w.kv_group = mv(w.embed), mv(w.norm), mv(w.lm_head), mv(w.kv_group)
        for L in w.layers:
            for name, t in list(vars(L).items()):
                setattr(L, name, mv(t))
        w.extra = {k: mv(v) for k, v in w.extra.items()}
        return w

    def _build_graphs(self):
        """One callable per (kind, bucket) — context, token and (after ``enable_speculative_decoder``)
        speculative: eager, or built per bucket as ``neuron_config.compiled`` says ("export" or True:
        torch.export programs; "aoti": AOTInductor packages), or loaded from the directory given to
        ``load()`` (no compilation). ``build_report`` lists each graph and its seconds."""
        from . import graphs as gr

        kinds = gr.graph_kinds(self.context_buckets, self.token_buckets, self.speculation_length)
        mode = "export" if self.neuron_config.compiled is True else self.neuron_config.compiled
        if self._artifacts_dir is not None:
            self.graphs, self.build_report = gr.load_graphs(self._artifacts_dir, self.model, self._graph_fields(),
                                                            self.model.comm.rank, self.batch_size)
        elif mode in gr.ARTIFACTS:
            if mode == "aoti":
                import tempfile
                self._workdir = tempfile.TemporaryDirectory(prefix="aoti-")
            self.graphs, self.build_report = gr.build_all(self.model, kinds, self.batch_size, mode,
                                                          self._workdir and self._workdir.name)
        else:
            self.graphs = {(k, b): self.model.forward for k, bs, _ in kinds for b in bs}
            self.build_report = [{"graph": f"{k}{b}.step", "kind": k, "bucket": b, "artifact": "eager",
                                  "seconds": 0.0} for k, b in self.graphs]

    # -- serialization (helpers/serialization.py): transformers-neuronx save/load, NxDI compile/load ------
    def _graph_fields(self) -> dict:
        from .serialization import graph_fields
        return graph_fields(self)

    def save(self, directory, sharded_weights: bool = False) -> dict:
        """transformers-neuronx ``save(dir, sharded_weights=False)``: one artifact per graph; with
        ``sharded_weights`` (needs ``on_device_embedding=True``) also the presharded weights, and the
        directory becomes a checkpoint that ``from_pretrained(dir)`` loads without re-sharding."""
        from .serialization import save
        return save(self, directory, sharded_weights)

    def load(self, directory) -> "NeuronModel":
        """transformers-neuronx ``load(dir)``: call before ``to_neuron()``, which then loads the saved graphs
        instead of compiling. Refuses now, before any weight is read, a directory saved for another model,
        bucket set, batch, tp degree, dtype or torch version, or with a changed file."""
        from .serialization import check_saved
        if self.model is not None:
            raise RuntimeError("load() must come before to_neuron() (as in transformers-neuronx): construct the "
                               "model again, call load(dir), then to_neuron()")
        check_saved(self, directory)
        self._artifacts_dir = str(directory)
        return self

    def compile(self, compiled_model_path, save_sharded_checkpoint: bool = False) -> dict:
        """NxD Inference ``compile(path)``: build the graphs (if not yet) and write the config and artifacts
        (+ ``weights/tp{rank}_sharded_checkpoint.safetensors`` with ``save_sharded_checkpoint``)."""
        from .serialization import compile_to
        return compile_to(self, compiled_model_path, save_sharded_checkpoint)

    @classmethod
    def from_compiled(cls, compiled_model_path, model_path=None, device: str = "cpu") -> "NeuronModel":
        """NxD Inference ``load(path)``: a model rebuilt from ``compile(path)``'s directory, no compilation."""
        from .serialization import from_compiled
        return from_compiled(cls, compiled_model_path, model_path, device)

    @property
    def weight_bytes(self) -> int:
        w = self._require_built().w
        ts = [w.embed, w.norm] + ([] if w.lm_head is w.embed else [w.lm_head])
        for L in w.layers:
            ts += [t for t in (L.wqkv, L.wo, L.w13, L.w2, L.ln1, L.ln2, L.bqkv, L.bo) if t is not None]
        total = sum(t.nbytes for t in ts)  # int8 storage: helpers.quant.QuantWeight.nbytes (values + scales)
        return total + sum(t.nbytes for t in w.extra.values() if torch.is_tensor(t))

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the preallocated K and V caches (this rank)."""
        return self._require_built().kv_cache_bytes()

    def _require_built(self) -> Transformer:
        if self.model is None:
            raise RuntimeError("The model is not built: call .to_neuron() first (as on Neuron).")
        return self.model

    # -- one forward over the fixed-shape cache ---------------------------------------------
    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _step(self, tokens, start_ids, first_slot: int, kind: str):
        """Run ``tokens`` [B,T] at cache slots first_slot.. ; return logits of the last position [B,V]
        (kind "speculative": of every position, [B,T,V])."""
        B, T = tokens.shape
        last = first_slot + T
        if kind == "context":
            width = self._select_bucket(kind, T)
            pad = width - T
            if pad:  # pad on the right to the bucket: junk slots are overwritten later, never attended
                tokens = torch.cat([tokens, tokens.new_zeros(B, pad)], dim=1)
            kv_len = width
        else:
            width = T
            kv_len = self._select_bucket(kind, last)
        slots = torch.arange(first_slot, first_slot + width, device=self.device)
        rope_pos = (slots[None, :] - start_ids[:, None]).clamp_(min=0)
        mask = build_mask(slots, start_ids, kv_len, self.args.sliding_window)
        if kind == "speculative":
            idx = torch.arange(T, device=self.device).expand(B, T)
        else:
            idx = torch.full((B, 1), T - 1, device=self.device)
        logits = self.graphs[(kind, width if kind == "context" else kv_len)](
            tokens, rope_pos, slots, kv_len, mask, idx)
        return logits if kind == "speculative" else logits[:, -1]

    def _select_bucket(self, kind: str, length: int) -> int:
        """transformers-neuronx ``bucket.find`` (smallest >= length, else the largest) or NxDI first_fit."""
        buckets = self.context_buckets if kind == "context" else self.token_buckets
        if self.nxdi_bucketing is None:
            return bk.tnx_find(buckets, length)
        tag = {"context": bk.CONTEXT_ENCODING_MODEL_TAG, "speculative": bk.SPECULATION_MODEL_TAG}.get(
            kind, bk.TOKEN_GENERATION_MODEL_TAG)
        return bk.nxdi_select(buckets, length, tag, self.nxdi_bucketing.allow_input_truncation)

    def _fit_prompt(self, input_ids, attention_mask=None):
        """NxDI: a prompt longer than the largest context bucket raises "Input len N exceeds largest bucket
        (B) ..." or, with allow_input_truncation, is cut to it with NxDI's warning. transformers-neuronx
        instead encodes up to its largest context bucket and continues token by token (_encode_prompt)."""
        L = input_ids.shape[1]
        if self.nxdi_bucketing is None or L <= self.context_buckets[-1]:
            return input_ids, attention_mask
        largest = self._select_bucket("context", L)  # raises unless allow_input_truncation
        warnings.warn(f"Truncating input ({L} tokens) to max_context_length ({largest} tokens). This may cause "
                      "unexpected outputs.")
        return input_ids[:, :largest], None if attention_mask is None else attention_mask[:, :largest]

    def _encode_prompt(self, input_ids, start_ids):
        """Context encoding up to the largest context bucket, then token by token (as transformers-neuronx)."""
        L = input_ids.shape[1]
        n_ctx = min(L, self.context_buckets[-1]) if self.context_buckets else 0
        logits = None
        if n_ctx:
            logits = self._step(input_ids[:, :n_ctx], start_ids, 0, "context")
        for pos in range(n_ctx, L):
            logits = self._step(input_ids[:, pos:pos + 1], start_ids, pos, "token")
        return logits

    @torch.inference_mode()
    def forward(self, input_ids, cache_ids=None, start_ids=None):
        """Logits [B, vocab] of the last position; ``cache_ids`` [T] are the slots to write (default 0..T-1)."""
        self._require_built()
        input_ids = validate_input_ids(input_ids, self.args.vocab_size).to(self.device)
        start = self._start_ids(input_ids, start_ids, None)
        first = 0 if cache_ids is None else int(cache_ids.reshape(-1)[0])
        if first == 0:
            input_ids, _ = self._fit_prompt(input_ids)
            return self._encode_prompt(input_ids, start)
        return self._step(input_ids, start, first, "token")

    def enable_speculative_decoder(self, speculation_length: int) -> None:
        """Build a verification graph that scores ``speculation_length + 1`` tokens in one forward
        (the last accepted token + k draft tokens). As on Neuron, call it before ``to_neuron()``."""
        if self.model is not None:
            raise RuntimeError("enable_speculative_decoder(k) must be called before to_neuron(): the "
                               "speculative graph is compiled with the others (transformers-neuronx: same rule)")
        if int(speculation_length) < 1:
            raise ValueError(f"speculation_length={speculation_length}: must be >= 1")
        if int(speculation_length) + 1 > self.token_buckets[-1]:
            raise ValueError(f"speculation_length={speculation_length} does not fit n_positions={self.n_positions}")
        self.speculation_length = int(speculation_length)

    @torch.inference_mode()
    def speculative_forward(self, input_ids, cache_ids, start_ids=None):
        """Logits [B, T, vocab] for every position of ``input_ids`` [B, T] written at ``cache_ids``
        (T = speculation_length + 1: one fixed-shape graph per token bucket)."""
        self._require_built()
        if not self.speculation_length:
            raise RuntimeError("call enable_speculative_decoder(k) before to_neuron() to build the speculative graph")
        T = input_ids.shape[1]
        if T != self.speculation_length + 1:
            raise ValueError(f"the speculative graph takes {self.speculation_length + 1} tokens, got {T}")
        first = int(torch.as_tensor(cache_ids).reshape(-1)[0])
        if first + T > self.n_positions:
            raise ValueError(f"positions {first}..{first + T - 1} exceed n_positions={self.n_positions}")
        input_ids = input_ids.to(self.device)
        return self._step(input_ids, self._start_ids(input_ids, start_ids, None), first, "speculative")

    def _start_ids(self, input_ids, start_ids, attention_mask):
        B = input_ids.shape[0]
        if start_ids is None and attention_mask is not None:
            am = attention_mask.to(self.device)
            if bool((am[:, 1:] < am[:, :-1]).any()):
                raise ValueError("attention_mask has padding after a real token: pad on the left "
                                 "(tokenizer.padding_side = 'left')")
            start_ids = (am == 0).sum(dim=1)
        if start_ids is None:
            return torch.zeros(B, dtype=torch.long, device=self.device)
        return torch.as_tensor(start_ids, dtype=torch.long, device=self.device).reshape(B)

    # -- generation -------------------------------------------------------------------------
    @torch.inference_mode()
    def sample(self, input_ids, sequence_length: int, start_ids=None, top_k: int = 50, top_p: float = 1.0,
               temperature: float = 1.0, streamer=None, stopping_criteria_list=None,
               eos_token_override=None, attention_mask=None, generator: torch.Generator | None = None,
               pad_token_id: int | None = None, output_logits: bool = False):
        """transformers-neuronx ``sample``: returns [B, prompt + generated] token ids.

        Greedy is ``top_k=1``. ``streamer.put`` receives a (B, 1) tensor per new token and ``end()``
        once; the prompt is never put. Rows that finish (EOS or a stopping criterion that returns a
        per-row bool tensor) are padded with ``pad_token_id`` until every row is done.
        ``eos_token_override=[]`` disables the EOS stop. ``output_logits=True`` keeps each step's
        logits in ``self.stats["logits"]`` [B, steps, vocab].
        """
        self._require_built()
        validate_sampling_args(top_k, top_p, temperature)
        input_ids = validate_input_ids(input_ids, self.args.vocab_size).to(self.device)
        input_ids, attention_mask = self._fit_prompt(input_ids, attention_mask)
        B, L = input_ids.shape
        if B != self.batch_size:
            raise ValueError(f"The model was built for batch_size={self.batch_size} but got {B} rows: "
                             f"pad the batch to {self.batch_size} rows or rebuild with batch_size={B} "
                             "(Neuron graphs have a fixed batch).")
        if sequence_length > self.n_positions:
            raise ValueError(f"sequence_length={sequence_length} exceeds n_positions={self.n_positions}: "
                             "lower sequence_length or rebuild with a larger n_positions.")
        if L >= sequence_length:
            raise ValueError(f"The prompt has {L} tokens and sequence_length={sequence_length} leaves no room "
                             "to generate: sequence_length counts prompt + new tokens.")
        start = self._start_ids(input_ids, start_ids, attention_mask)
        eos = self.args.eos_ids if eos_token_override is None else (
            [eos_token_override] if isinstance(eos_token_override, int) else list(eos_token_override))
        pad = pad_token_id if pad_token_id is not None else (
            self.args.pad_token_id if self.args.pad_token_id is not None else (eos[0] if eos else 0))
        eos_t = torch.tensor(eos, device=self.device, dtype=torch.long)

        t0 = time.perf_counter()
        logits = self._encode_prompt(input_ids, start)
        seq = input_ids
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        row_new_tokens = torch.zeros(B, dtype=torch.long, device=self.device)  # per row, incl. its stop token
        step_times, kept_logits = [], []
        for cur in range(L, sequence_length):
            if output_logits:
                kept_logits.append(logits.float().cpu())
            tok = select_next_tokens(logits, top_k, top_p, temperature, generator)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            row_new_tokens += (~done).long()
            seq = torch.cat([seq, tok[:, None]], dim=1)
            if streamer is not None:
                streamer.put(tok[:, None].cpu())
            if eos:
                done = done | torch.isin(tok, eos_t)
            if stopping_criteria_list is not None:
                done = done | _as_row_flags(stopping_criteria_list(seq, logits), B, self.device)
            self._sync()
            step_times.append(time.perf_counter() - t0)
            if bool(done.all()) or cur + 1 == sequence_length:
                break
            logits = self._step(tok[:, None], start, cur, "token")
        if streamer is not None:
            streamer.end()
        self.stats = {"prompt_len": L, "new_tokens": seq.shape[1] - L, "row_new_tokens": row_new_tokens.tolist(),
                      "ttft_s": step_times[0],
                      "token_times_s": step_times, "total_s": step_times[-1], "pad_token_id": pad}
        if output_logits:
            self.stats["logits"] = torch.stack(kept_logits, dim=1)
        return seq


def _as_row_flags(value, batch: int, device) -> torch.Tensor:
    if torch.is_tensor(value):
        v = value.to(device=device, dtype=torch.bool).reshape(-1)
        return v.expand(batch) if v.numel() == 1 else v
    return torch.full((batch,), bool(value), device=device)


class LlamaForSampling(NeuronModel):
    pass


class MistralForSampling(NeuronModel):
    pass


class NeuronAutoModelForCausalLM(NeuronModel):
    pass
