"""``CausalLM``: the Neuron programming model in plain PyTorch, with transformers-neuronx's call shapes
(``from_pretrained``, ``to_neuron``, ``sample``, ``forward``). Built for a fixed ``batch_size`` and
``n_positions``; a prompt runs through a context graph padded to its bucket, each new token through a token graph
over a bucket of KV positions. Here the graphs are the eager forward; ``helpers.NeuronModel``
(``helpers.artifacts``) adds graphs compiled ahead of time and their persistence.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import asdict

import torch

from ..model_store import load_config, load_state_dict, resolve_model_path
from ..planning import buckets as bk
from ..planning.dtypes import amp_dtype
from .config import ModelArgs, NeuronConfig, reject_unknown
from .cpu.ops import use_cpu
from .kv_cache import KVCache
from .model import Comm, Transformer, build_mask
from .quant import check_quant_config, quantize_model
from .sampling import (resolve_eos, resolve_pad, row_flags, select_next_tokens, start_ids_from_mask,
                       validate_input_ids, validate_sampling_args)
from .weights import RankWeights, move_weights, shard_state, weight_breakdown


def graph_kinds(context_buckets, token_buckets, speculation_length: int = 0) -> list[tuple]:
    """(kind, buckets, tokens per step): context steps are as wide as their bucket, token steps take one
    token, speculative steps (``enable_speculative_decoder(k)``) take k + 1 over the token buckets."""
    kinds = [("context", list(context_buckets), None), ("token", list(token_buckets), 1)]
    if speculation_length:
        kinds.append(("speculative", list(token_buckets), int(speculation_length) + 1))
    return kinds


def eager_graphs(tr: Transformer, kinds) -> tuple[dict, list[dict]]:
    """The eager forward as the graph of every (kind, bucket), and their (zero-second) build report."""
    graphs = {(k, b): tr.forward for k, bs, _ in kinds for b in bs}
    return graphs, [{"graph": f"{k}{b}.step", "kind": k, "bucket": b, "artifact": "eager", "seconds": 0.0}
                    for k, b in graphs]


def select_ops(tr: Transformer, quant=None, recorded: dict | None = None) -> Transformer:
    """How a built rank runs, chosen here once its weights are in place (``to_neuron()`` and a tensor-parallel
    rank's build call it): f32 on CPU with the CPU speed layer (``helpers.engine.cpu``: its kernels, or the
    ``recorded`` ones of a saved model being loaded, and its ops), else torch's; then int8 storage (``quant``)."""
    if tr.device.type == "cpu" and tr.dtype == torch.float32:
        use_cpu(tr, pack=quant is None, recorded=recorded)
    if quant is not None:
        quantize_model(tr, quant)
    return tr


class CausalLM:
    """A causal LM built like a Neuron model, with eager graphs (use ``helpers.NeuronModel`` and its aliases).
    Differences from transformers-neuronx, on purpose: ``tp_degree`` defaults to 1 (there: 2); unknown keywords raise
    (there: ignored); stopping criteria receive the ids generated so far (there: the prompt, tnx#75)."""

    cache_cls: type[KVCache] = KVCache  # seam: helpers.serving's per-row KV writes (SlotKVCache)
    ARGS = ("batch_size", "n_positions", "tp_degree", "amp", "context_length_estimate",
            "neuron_config", "device", "nxdi_bucketing")

    def __init__(self, model_path=None, *, batch_size: int = 1, n_positions=2048, tp_degree: int = 1,
                 amp: str = "f32", context_length_estimate=None, neuron_config: NeuronConfig | None = None,
                 device: str = "cpu", nxdi_bucketing: bk.NxDIBucketing | None = None):
        self.model_path = resolve_model_path(model_path)
        hf_config = load_config(self.model_path)
        self.args = ModelArgs.from_hf(hf_config)
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

    @classmethod
    def from_pretrained(cls, model_path=None, **kwargs) -> "CausalLM":
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
        if self.n_positions > self.args.max_position_embeddings:
            raise ValueError(f"n_positions={self.n_positions} exceeds the model's max_position_embeddings="
                             f"{self.args.max_position_embeddings}: lower n_positions")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device: use device='cpu'")
        if self.neuron_config.quant is not None:
            check_quant_config(self.neuron_config.quant, self.amp)
            if self.tp_degree != 1:
                raise ValueError("int8 weight storage runs at tp_degree=1 in the reference engine: set tp_degree=1 "
                                 "or drop neuron_config.quant")

    # -- build ----------------------------------------------------------------------------------
    def to_neuron(self) -> "CausalLM":
        """Load and shard the weights, allocate the KV cache, build one graph per bucket."""
        t0 = time.perf_counter()
        if self.tp_degree != 1:
            raise ValueError(f"tp_degree={self.tp_degree}: tensor parallelism runs in "
                             "helpers.parallel.ParallelModel (one process per rank)")
        weights = move_weights(self._load_weights(), self.device)
        self.model = select_ops(Transformer(self.args, weights, Comm(), self.batch_size, self.n_positions,
                                            self.device, self.dtype, self.cache_cls),
                                self.neuron_config.quant, self._recorded_kernels())
        self.load_s = time.perf_counter() - t0
        self.graphs, self.build_report = self._build_graphs()
        return self

    def _recorded_kernels(self) -> dict | None:
        """The matmul kernels a saved model being loaded ran with (``helpers.artifacts``); None here."""
        return None

    def _load_weights(self) -> RankWeights:
        """Rank 0's weights from the checkpoint: fused, cast, laid out as the GQA setting says."""
        state = load_state_dict(self.model_path)
        return shard_state(state, self.args, self.dtype, gqa=self.neuron_config.group_query_attention)

    def _graph_kinds(self) -> list[tuple]:
        return graph_kinds(self.context_buckets, self.token_buckets, self.speculation_length)

    def _build_graphs(self) -> tuple[dict, list[dict]]:
        """One callable per (kind, bucket) — context, token and (after ``enable_speculative_decoder``)
        speculative — and ``build_report``, one row per graph with its seconds: here the eager forward."""
        if self.neuron_config.compiled:
            raise ValueError(f"NeuronConfig(compiled={self.neuron_config.compiled!r}): graphs compiled ahead of time "
                             "are built by helpers.NeuronModel (helpers.artifacts); this class runs eager graphs")
        return eager_graphs(self.model, self._graph_kinds())

    @property
    def weight_bytes(self) -> int:
        """Bytes of this rank's weights (``helpers.engine.weights.weight_breakdown``)."""
        return sum(weight_breakdown(self.require_built().w).values())

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the preallocated K and V caches (this rank)."""
        return self.require_built().kv_cache_bytes()

    def _is_built(self) -> bool:
        """Whether ``to_neuron()`` has run: here, this process holds the built model."""
        return self.model is not None

    def require_built(self) -> Transformer:
        if not self._is_built():
            raise RuntimeError("The model is not built: call .to_neuron() first (as on Neuron).")
        return self.model

    # -- one forward over the fixed-shape cache ---------------------------------------------
    def sync(self) -> None:
        """Wait until the device finished what was asked of it (a CUDA device; the CPU runs synchronously)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def step(self, tokens, start_ids, first_slot: int, kind: str):
        """Run ``tokens`` [B,T] at cache slots first_slot.. ; return logits of the last position [B,V]
        (kind "speculative": of every position, [B,T,V])."""
        B, T = tokens.shape
        last = first_slot + T
        if kind == "context":
            width = self.select_bucket(kind, T)
            pad = width - T
            if pad:  # pad on the right to the bucket: junk slots are overwritten later, never attended
                tokens = torch.cat([tokens, tokens.new_zeros(B, pad)], dim=1)
            kv_len = width
        else:
            width = T
            kv_len = self.select_bucket(kind, last)
        slots = torch.arange(first_slot, first_slot + width, device=self.device)
        rope_pos = (slots[None, :] - start_ids[:, None]).clamp_(min=0)
        mask = build_mask(slots, start_ids, kv_len, self.args.sliding_window)
        if kind == "speculative":
            idx = torch.arange(T, device=self.device).expand(B, T)
        else:
            idx = torch.full((B, 1), T - 1, device=self.device)
        logits = self.graphs[(kind, kv_len)](tokens, rope_pos, slots, kv_len, mask, idx)  # one graph per bucket
        return logits if kind == "speculative" else logits[:, -1]

    def select_bucket(self, kind: str, length: int) -> int:
        """transformers-neuronx ``bucket.find`` (smallest >= length, else the largest) or NxDI first_fit."""
        buckets = self.context_buckets if kind == "context" else self.token_buckets
        if self.nxdi_bucketing is None:
            return bk.tnx_find(buckets, length)
        tag = {"context": bk.CONTEXT_ENCODING_MODEL_TAG, "speculative": bk.SPECULATION_MODEL_TAG}.get(
            kind, bk.TOKEN_GENERATION_MODEL_TAG)
        return bk.nxdi_select(buckets, length, tag, self.nxdi_bucketing.allow_input_truncation)

    def _fit_prompt(self, input_ids, attention_mask=None):
        """NxDI refuses a prompt longer than the largest context bucket or, with allow_input_truncation, cuts it
        (its warning); transformers-neuronx encodes the rest token by token (:meth:`_encode_prompt`)."""
        L = input_ids.shape[1]
        if self.nxdi_bucketing is None or L <= self.context_buckets[-1]:
            return input_ids, attention_mask
        largest = self.select_bucket("context", L)  # raises unless allow_input_truncation
        warnings.warn(f"Truncating input ({L} tokens) to max_context_length ({largest} tokens). This may cause "
                      "unexpected outputs.")
        return input_ids[:, :largest], None if attention_mask is None else attention_mask[:, :largest]

    def _encode_prompt(self, input_ids, start_ids):
        """Context encoding up to the largest context bucket, then token by token (as transformers-neuronx)."""
        L = input_ids.shape[1]
        n_ctx = min(L, self.context_buckets[-1]) if self.context_buckets else 0
        logits = None
        if n_ctx:
            logits = self.step(input_ids[:, :n_ctx], start_ids, 0, "context")
        for pos in range(n_ctx, L):
            logits = self.step(input_ids[:, pos:pos + 1], start_ids, pos, "token")
        return logits

    @torch.inference_mode()
    def forward(self, input_ids, cache_ids=None, start_ids=None):
        """Logits [B, vocab] of the last position; ``cache_ids`` [T] are the slots to write (default 0..T-1)."""
        self.require_built()
        input_ids = validate_input_ids(input_ids, self.args.vocab_size).to(self.device)
        start = self._start_ids(input_ids, start_ids, None)
        first = 0 if cache_ids is None else int(cache_ids.reshape(-1)[0])
        if first == 0:
            input_ids, _ = self._fit_prompt(input_ids)
            return self._encode_prompt(input_ids, start)
        return self.step(input_ids, start, first, "token")

    def enable_speculative_decoder(self, speculation_length: int) -> None:
        """Build a graph that scores the last accepted token + k drafts in one forward (before ``to_neuron()``)."""
        if self._is_built():
            raise RuntimeError("enable_speculative_decoder(k) must be called before to_neuron(): the "
                               "speculative graph is compiled with the others (transformers-neuronx: same rule)")
        if int(speculation_length) < 1:
            raise ValueError(f"speculation_length={speculation_length}: must be >= 1")
        if int(speculation_length) + 1 > self.token_buckets[-1]:
            raise ValueError(f"speculation_length={speculation_length} does not fit n_positions={self.n_positions}")
        self.speculation_length = int(speculation_length)

    @torch.inference_mode()
    def speculative_forward(self, input_ids, cache_ids, start_ids=None):
        """Logits [B, T, vocab] of every position of ``input_ids`` [B, T = k + 1] written at ``cache_ids``."""
        self.require_built()
        if not self.speculation_length:
            raise RuntimeError("call enable_speculative_decoder(k) before to_neuron() to build the speculative graph")
        T = input_ids.shape[1]
        if T != self.speculation_length + 1:
            raise ValueError(f"the speculative graph takes {self.speculation_length + 1} tokens, got {T}")
        first = int(torch.as_tensor(cache_ids).reshape(-1)[0])
        if first + T > self.n_positions:
            raise ValueError(f"positions {first}..{first + T - 1} exceed n_positions={self.n_positions}")
        input_ids = input_ids.to(self.device)
        return self.step(input_ids, self._start_ids(input_ids, start_ids, None), first, "speculative")

    def _start_ids(self, input_ids, start_ids, attention_mask):
        B = input_ids.shape[0]
        if start_ids is None and attention_mask is not None:
            start_ids = start_ids_from_mask(attention_mask.to(self.device))
        if start_ids is None:
            return torch.zeros(B, dtype=torch.long, device=self.device)
        return torch.as_tensor(start_ids, dtype=torch.long, device=self.device).reshape(B)

    # -- generation -------------------------------------------------------------------------
    @torch.inference_mode()
    def sample(self, input_ids, sequence_length: int, start_ids=None, top_k: int = 50, top_p: float = 1.0,
               temperature: float = 1.0, streamer=None, stopping_criteria_list=None,
               eos_token_override=None, attention_mask=None, generator: torch.Generator | None = None,
               pad_token_id: int | None = None, output_logits: bool = False):
        """transformers-neuronx ``sample``: returns [B, prompt + generated] token ids (:meth:`generate`), and
        ``self.stats``: each token's time (:class:`StepClock`), rows' new tokens and, with ``output_logits=True``,
        each step's logits ``stats["logits"]`` [B, steps, vocab] (:class:`KeptLogits`).

        Greedy is ``top_k=1``. ``streamer.put`` receives a (B, 1) tensor per new token and ``end()``
        once; the prompt is never put. ``eos_token_override=[]`` disables the EOS stop.
        """
        self.require_built()
        validate_sampling_args(top_k, top_p, temperature)
        input_ids = validate_input_ids(input_ids, self.args.vocab_size).to(self.device)
        input_ids, attention_mask = self._fit_prompt(input_ids, attention_mask)
        self._check_lengths(*input_ids.shape, sequence_length)
        start = self._start_ids(input_ids, start_ids, attention_mask)
        eos = resolve_eos(self.args.eos_ids, eos_token_override)
        pad = resolve_pad(pad_token_id, self.args.pad_token_id, eos)
        clock, kept = StepClock(self.sync), KeptLogits()
        seq, row_new_tokens = self.generate(
            input_ids, start, sequence_length, lambda x: select_next_tokens(x, top_k, top_p, temperature, generator),
            eos, pad, streamer, stopping_criteria_list, [clock] + [kept] * output_logits)
        L = input_ids.shape[1]
        self.stats = {"prompt_len": L, "new_tokens": seq.shape[1] - L, "row_new_tokens": row_new_tokens.tolist(),
                      "ttft_s": clock.times[0], "token_times_s": clock.times, "total_s": clock.times[-1],
                      "pad_token_id": pad}
        if output_logits:
            self.stats["logits"] = torch.stack(kept.steps, dim=1)
        return seq

    def _check_lengths(self, B: int, L: int, sequence_length: int) -> None:
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

    @torch.inference_mode()
    def generate(self, input_ids, start, sequence_length: int, pick, eos: list[int], pad: int, streamer=None,
                 stopping_criteria_list=None, observers=()):
        """The decode loop over a prompt [B, L] (``start``: each row's first real token): ``pick(logits)`` chooses
        each step's tokens; a row that finishes (an ``eos`` id, or a stopping criterion's per-row flag) is padded
        with ``pad`` until every row is done. Each observer is called with ``(ids so far, logits)`` after each
        token. Returns the ids [B, L + new] and each row's new tokens (its stop token included)."""
        B, L = input_ids.shape
        eos_t = torch.tensor(eos, device=self.device, dtype=torch.long)
        logits = self._encode_prompt(input_ids, start)
        seq, done = input_ids, torch.zeros(B, dtype=torch.bool, device=self.device)
        row_new_tokens = torch.zeros(B, dtype=torch.long, device=self.device)
        for cur in range(L, sequence_length):
            tok = pick(logits)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            row_new_tokens += (~done).long()
            seq = torch.cat([seq, tok[:, None]], dim=1)
            if streamer is not None:
                streamer.put(tok[:, None].cpu())
            if eos:
                done = done | torch.isin(tok, eos_t)
            if stopping_criteria_list is not None:
                done = done | row_flags(stopping_criteria_list(seq, logits), B, self.device)
            for observe in observers:
                observe(seq, logits)
            if bool(done.all()) or cur + 1 == sequence_length:
                break
            logits = self.step(tok[:, None], start, cur, "token")
        if streamer is not None:
            streamer.end()
        return seq, row_new_tokens


class StepClock:
    """A generation observer: the time of each token since the clock was made (``perf_counter`` seconds, after the
    device finished it)."""

    def __init__(self, sync):
        self.sync, self.t0, self.times = sync, time.perf_counter(), []

    def __call__(self, seq, logits) -> None:
        self.sync()
        self.times.append(time.perf_counter() - self.t0)


class KeptLogits:
    """A generation observer: each step's logits, as f32 on the CPU (``steps``)."""

    def __init__(self):
        self.steps: list[torch.Tensor] = []

    def __call__(self, seq, logits) -> None:
        self.steps.append(logits.float().cpu())
