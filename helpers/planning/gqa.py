"""GQA sharding rules of the pinned Neuron releases, and the per-rank head layout they produce.

transformers-neuronx 0.13 (tnx) has four strategies (``transformers_neuronx/constants.py`` GQA);
the one requested is checked by ``decoder.py: DecoderLmHeadForSamplingNoEmbedding.check_gqa_fallback``
(same order and warning texts below), then ``utils.py: get_qkv_padding`` and
``decoder.py: DecoderLayer.to_neuron`` pad the query heads and replicate/pad the KV heads, and
``DecoderLayer.init_caches`` shards the cache (over heads, or over batch for SHARD_OVER_BATCH).

NxD Inference 0.8 (nxdi) has two (``modules/attention/gqa.py``): ``determine_sharding_strategy``
(REPLICATE_TO_TP_DEGREE unless ``tp % kv_heads != 0``, then CONVERT_TO_MHA) and
``get_shardable_head_counts``; the weights are padded by ``maybe_pad_interleaved`` (REPLICATE) or
``maybe_pad_tail`` (CONVERT) and the KV heads replicated by ``replicate_kv``. NxDI has no
NeuronConfig knob for the strategy: it always calls ``determine_sharding_strategy`` with the default.

:func:`resolve_layout` returns a :class:`HeadLayout`: which query heads and which KV heads each rank
holds (``-1`` is a zero padding head), and whether the cache is split over heads, over batch rows
(SHARD_OVER_BATCH) or holds one KV head gathered from column slices (ALL_GATHER_HEADS with more ranks
than KV heads). The engine (``helpers.engine.weights``) builds exactly these shards; the planner counts them.
"""
from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass



# transformers-neuronx GQA enum values (transformers_neuronx/constants.py)
class GQA(str, enum.Enum):
    SHARD_OVER_HEADS = "shard-over-heads"
    SHARD_OVER_BATCH = "shard-over-batch"
    REPLICATED_HEADS = "replicated-heads"
    ALL_GATHER_HEADS = "all-gather-heads"


class NxDIGQA(str, enum.Enum):
    """NxD Inference's strategies (``neuronx_distributed_inference/modules/attention/gqa.py``)."""
    CONVERT_TO_MHA = "convert-to-mha"
    REPLICATE_TO_TP_DEGREE = "replicate-to-tp-degree"


STRATEGIES = {**{g.value: g for g in GQA}, **{g.value: g for g in NxDIGQA}}


# "Which strategy for which workload", in the guides' words (quoted, not paraphrased):
# transformers-neuronx developer guide, "Grouped-query attention (GQA) support [Beta]"
# (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/archive/transformers-neuronx/transformers-neuronx-developer-guide.html), one sentence per strategy.
TNX_GUIDE_ADVICE = {
    GQA.SHARD_OVER_HEADS: "distributes K/V caches along head dimension. This can be only used when K/V heads is "
                          "multiple of tensor-parallelism degree. This is the default configuration.",
    GQA.SHARD_OVER_BATCH: "distributes K/V caches along batch dimension. This can be only used when batch size is "
                          "multiple of tensor-parallelism degree. This can be useful for large-batch inference.",
    GQA.REPLICATED_HEADS: "replicates K/V heads. This can be used when neither batch size nor K/V heads can be "
                          "divisible by tensor-parallelism degree. This can be useful for low-latency small-batch "
                          "inference.",
    GQA.ALL_GATHER_HEADS: "evenly splits the K/V heads across all NeuronCores. This is optimized for large-batch "
                          "inference of GQA model without replication.",
}
# The workload each strategy is meant for (the last sentence of each bullet above).
TNX_GUIDE_WORKLOAD = {GQA.SHARD_OVER_HEADS: "default: K/V heads a multiple of tp",
                      GQA.SHARD_OVER_BATCH: "large batch",
                      GQA.REPLICATED_HEADS: "small batch, low latency",
                      GQA.ALL_GATHER_HEADS: "large batch, without replication"}
# NxD Inference feature guide, "Grouped-query attention (GQA) support"
# (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/libraries/nxd-inference/developer_guides/feature-guide.html).
NXDI_GUIDE_RULE = ("The NeuronAttentionBase module uses REPLICATE_TO_TP_DEGREE by default. If the TP degree isn't "
                   "divisible by the number of KV heads, NeuronAttentionBase uses CONVERT_TO_MHA.")


def as_strategy(value):
    """None, a GQA / NxDIGQA member, its value ("shard-over-heads") or its name ("SHARD_OVER_HEADS")."""
    if value is None or isinstance(value, (GQA, NxDIGQA)):
        return value
    key = str(value)
    for g in STRATEGIES.values():
        if key in (g.value, g.name):
            return g
    raise ValueError(f"GQA strategy {value!r} is unknown: use one of {sorted(STRATEGIES)} "
                     "(transformers-neuronx: the first four; NxD Inference: convert-to-mha, replicate-to-tp-degree)")


def round_up(n: int, d: int) -> int:
    return -(-n // d) * d


def tnx_pad_size(n: int, d: int) -> int:
    """transformers_neuronx/utils.py get_pad_size."""
    return ((n // d + 1) * d - n) % d


# -- transformers-neuronx ----------------------------------------------------------------------
def tnx_check_gqa_fallback(n_head: int, n_kv_head: int, head_dim: int, tp: int, batch_sizes, gqa=None):
    """The strategy transformers-neuronx ends up with (``check_gqa_fallback``, same order, same warnings).

    ``batch_sizes``: the compiled batch size(s), or None to skip the SHARD_OVER_BATCH batch check.
    Returns None for an MHA model built without a GQA setting (plain head sharding).
    """
    gqa = as_strategy(gqa)
    result = gqa
    if gqa is None:
        if n_head == n_kv_head:
            return None
        result = GQA.SHARD_OVER_HEADS
    if gqa == GQA.REPLICATED_HEADS:
        return result
    if gqa == GQA.SHARD_OVER_BATCH:
        success = True
        sizes = [] if batch_sizes is None else ([batch_sizes] if isinstance(batch_sizes, int) else list(batch_sizes))
        for batch_size in sizes:
            if batch_size % tp != 0:
                warnings.warn(f'Cannot enable "GQA.{gqa.name}" when a batch size ({batch_size} in {sizes}) is not '
                              f'evenly divisible by the tensor parallel degree ({tp})', stacklevel=3)
                success = False
                result = GQA.SHARD_OVER_HEADS
        if success:
            return result
    if gqa == GQA.ALL_GATHER_HEADS:
        if (n_kv_head * head_dim) % tp != 0:
            warnings.warn(f'Cannot enable "GQA.{gqa.name}" when the hidden size of KV ({n_kv_head} x {head_dim}) is not '
                          f'evenly divisible by the tensor parallel degree ({tp})', stacklevel=3)
            result = GQA.SHARD_OVER_HEADS
        if n_head % tp != 0:
            pad_size = tnx_pad_size(n_head, tp)
            if pad_size % n_kv_head == 0:
                return result
            warnings.warn(f'Cannot enable "GQA.{gqa.name}" when the number of padding {pad_size} need for query '
                          f'attention heads ({n_head}) with the tensor parallel degree ({tp}) is not divisible by '
                          f'KV heads ({n_kv_head})', stacklevel=3)
            result = GQA.SHARD_OVER_HEADS
        else:
            return result
    if n_kv_head % tp != 0:
        warnings.warn(f'KV head replication will be enabled since the number of KV heads ({n_kv_head}) is not '
                      f'evenly divisible by the tensor parallel degree ({tp})', stacklevel=3)
        result = GQA.REPLICATED_HEADS
    return result


def tnx_qkv_padding(n_head: int, n_kv_head: int, tp: int, gqa=GQA.SHARD_OVER_HEADS) -> tuple[int, int]:
    """transformers_neuronx/utils.py get_qkv_padding: (query heads, KV heads) after padding."""
    n_head_padded = round_up(n_head, tp)
    n_kv_padded = n_kv_head
    if n_head != n_kv_head and gqa == GQA.REPLICATED_HEADS:
        ratio = n_head // n_kv_head  # full replication
        if n_kv_head < tp and tp % n_kv_head == 0 and (
                n_head % tp == 0 or ((n_head_padded - n_head) % n_kv_head == 0 and n_head_padded - n_head > 0)):
            ratio = tp // n_kv_head  # partial replication, up to tp
        elif n_head_padded / tp == n_head / n_kv_head:
            ratio = 1
        n_kv_padded = max(n_kv_head * ratio, tp)
        if n_kv_padded == n_head:
            n_kv_padded = n_head_padded
    return n_head_padded, n_kv_padded


# -- NxD Inference -----------------------------------------------------------------------------
def nxdi_determine_sharding_strategy(tp: int, n_kv_head: int, desired=None) -> NxDIGQA:
    """modules/attention/gqa.py determine_sharding_strategy (NxDI logs the warning; we warn)."""
    strategy = as_strategy(desired) or NxDIGQA.REPLICATE_TO_TP_DEGREE
    if strategy == NxDIGQA.REPLICATE_TO_TP_DEGREE and tp % n_kv_head != 0:
        warnings.warn(f"TP degree ({tp}) and KV heads ({n_kv_head}) are not divisible. Overriding attention "
                      "sharding strategy to GQA.CONVERT_TO_MHA!", stacklevel=3)
        strategy = NxDIGQA.CONVERT_TO_MHA
    return strategy


def nxdi_shardable_head_counts(tp: int, n_head: int, n_kv_head: int, strategy: NxDIGQA) -> tuple[int, int]:
    """modules/attention/gqa.py get_shardable_head_counts."""
    q = n_head + (tp - n_head % tp if n_head % tp else 0)  # neuronx_distributed get_number_of_extra_heads
    kv = n_kv_head
    if n_head == n_kv_head:
        kv = q
    elif n_kv_head < tp or n_kv_head % tp != 0:
        if strategy == NxDIGQA.REPLICATE_TO_TP_DEGREE:
            if tp % n_kv_head != 0:
                raise ValueError("GQA.REPLICATE_TO_TP_DEGREE requires tp_degree to be divisible by num_key_value_heads")
            kv = tp
        else:
            kv = q
    return q, kv


# -- layouts -----------------------------------------------------------------------------------
def _pad_heads(heads: list[int], target: int, groups: int | None) -> list[int]:
    """Pad a head list to ``target`` with -1: at the end, or interleaved after each of ``groups`` groups."""
    if groups is None:
        return heads + [-1] * (target - len(heads))
    size, pad = len(heads) // groups, (target - len(heads)) // groups
    out = []
    for g in range(groups):
        out += heads[g * size:(g + 1) * size] + [-1] * pad
    return out


@dataclass(frozen=True)
class HeadLayout:
    """Which heads each rank holds. ``q_heads[r]`` / ``kv_heads[r]``: global head ids (-1 = zero padding).

    ``kv_mode``: "heads" (the cache is split over KV heads), "batch" (SHARD_OVER_BATCH: every rank
    keeps all KV heads for ``batch_size // tp`` rows; queries and K/V are exchanged with all-to-all)
    or "gather" (ALL_GATHER_HEADS with tp > kv: each rank projects ``kv * head_dim / tp`` K/V columns
    and all-gathers its KV head from the ``tp // kv`` ranks that share it).
    """
    library: str
    strategy: object            # GQA | NxDIGQA | None (MHA)
    tp: int
    batch_size: int | None
    n_heads: int
    n_kv_heads: int
    head_dim: int
    q_heads: tuple
    kv_heads: tuple
    kv_mode: str = "heads"

    @property
    def n_heads_padded(self) -> int:
        return sum(len(q) for q in self.q_heads) if self.kv_mode != "batch" else self.n_heads

    @property
    def q_heads_per_rank(self) -> int:
        """Query heads whose weights a rank holds (after padding)."""
        return self.n_heads_padded // self.tp

    @property
    def kv_heads_per_rank(self) -> int:
        """KV heads in one rank's cache."""
        return len(self.kv_heads[0])

    @property
    def kv_weight_heads_per_rank(self) -> float:
        """K (or V) projection heads a rank holds: fewer than one with gather/batch column slices."""
        if self.kv_mode in ("batch", "gather"):
            return self.n_kv_heads / self.tp
        return float(self.kv_heads_per_rank)

    @property
    def batch_rows_per_rank(self) -> int | None:
        if self.batch_size is None:
            return None
        return self.batch_size // self.tp if self.kv_mode == "batch" else self.batch_size

    @property
    def group_size(self) -> int:
        """Ranks that share one KV head in "gather" mode."""
        return self.tp // self.n_kv_heads if self.kv_mode == "gather" else 1

    @property
    def name(self) -> str:
        return "mha" if self.strategy is None else self.strategy.value

    def kv_group(self, rank: int) -> list[int] | None:
        """Per local query head, the index of its KV head in this rank's cache (None: standard grouping)."""
        if self.kv_mode == "batch":
            return None
        q, kv = self.q_heads[rank], self.kv_heads[rank]
        per = self.n_heads // self.n_kv_heads
        idx = [kv.index(h // per) if h >= 0 else 0 for h in q]
        if len(q) % len(kv) == 0 and idx == [i // (len(q) // len(kv)) for i in range(len(q))]:
            return None
        return idx

    def kv_cache_elems(self, n_layers: int, n_positions: int) -> int:
        """K + V cache elements on one rank."""
        return 2 * n_layers * self.batch_rows_per_rank * self.kv_heads_per_rank * n_positions * self.head_dim

    def describe(self) -> list[dict]:
        """One row per rank, for tables and drawings."""
        rows = []
        for r in range(self.tp):
            rows.append({"rank": r, "q_heads": list(self.q_heads[r]), "kv_heads": list(self.kv_heads[r]),
                         "batch_rows": (list(range(r * self.batch_rows_per_rank, (r + 1) * self.batch_rows_per_rank))
                                        if self.kv_mode == "batch" and self.batch_size else None)})
        return rows


def _check_consistent(layout: HeadLayout) -> HeadLayout:
    per = layout.n_heads // layout.n_kv_heads
    for r, (q, kv) in enumerate(zip(layout.q_heads, layout.kv_heads)):
        for h in q:
            if h >= 0 and h // per not in kv:
                raise ValueError(f"{layout.library} {layout.name} at tp_degree={layout.tp}: rank {r} would hold query "
                                 f"head {h} without its KV head {h // per} ({layout.n_heads} query / "
                                 f"{layout.n_kv_heads} KV heads); choose another strategy or tp_degree")
    return layout


def _split(heads: list[int], tp: int) -> tuple:
    n = len(heads) // tp
    return tuple(tuple(heads[r * n:(r + 1) * n]) for r in range(tp))


def _tnx_layout(n: int, kv: int, D: int, tp: int, batch_size, strategy) -> HeadLayout:
    common = dict(library="tnx", strategy=strategy, tp=tp, batch_size=batch_size, n_heads=n, n_kv_heads=kv,
                  head_dim=D)
    if strategy == GQA.SHARD_OVER_BATCH and tp > 1:
        # tnx pads query heads at the end and, inside the all-to-all attention, maps them to KV heads by
        # position (layers/attention.py query_key_value: n_repeats = n_heads // n_kv_heads): with padding
        # the reshape fails (9 heads -> 10 at tp=2) or pairs heads with the wrong KV head.
        if n % tp:
            raise ValueError(f"shard-over-batch with {n} query heads at tp_degree={tp}: transformers-neuronx pads "
                             f"them to {round_up(n, tp)} and its all-to-all attention then cannot regroup them over "
                             f"{kv} KV heads (layers/attention.py query_key_value). Use a tp_degree that divides "
                             f"{n} (e.g. {', '.join(str(d) for d in _divisors(n) if d > 1)}) or another strategy.")
        if (kv * D) % tp:
            raise ValueError(f"shard-over-batch splits the {kv} x {D} K/V columns over tp_degree={tp} ranks, "
                             "which does not divide them: use another tp_degree or strategy.")
        everyone_q, everyone_kv = tuple(range(n)), tuple(range(kv))
        return HeadLayout(q_heads=(everyone_q,) * tp, kv_heads=(everyone_kv,) * tp, kv_mode="batch", **common)
    n_pad, kv_pad = tnx_qkv_padding(n, kv, tp, strategy)
    extra = n_pad - n
    interleave = strategy == GQA.ALL_GATHER_HEADS or (
        n != kv and strategy == GQA.REPLICATED_HEADS and tp % kv == 0 and extra % kv == 0 and extra > 0)
    groups = kv if interleave else None
    q = _pad_heads(list(range(n)), n_pad, groups)
    if strategy == GQA.ALL_GATHER_HEADS and tp > kv:
        # layers/attention.py _sharded_kv_projection: each rank projects kv*D/tp columns and all-gathers
        # its group's head; the cache then holds one head per rank (round_up(kv, tp) heads in all).
        if tp % kv:
            raise ValueError(f"all-gather-heads with {kv} KV heads at tp_degree={tp}: each rank would project "
                             f"{kv * D // tp} K/V columns, which do not tile a {D}-wide head "
                             "(transformers_neuronx/layers/attention.py _sharded_kv_projection). Use a tp_degree "
                             f"that is a multiple or a divisor of {kv}, or another strategy.")
        gs = tp // kv
        layout = HeadLayout(q_heads=_split(q, tp), kv_heads=tuple((r // gs,) for r in range(tp)), kv_mode="gather",
                            **common)
        return _check_consistent(layout)
    if strategy == GQA.ALL_GATHER_HEADS and kv % tp:
        raise ValueError(f"all-gather-heads with {kv} KV heads at tp_degree={tp}: the ranks' K/V column slices "
                         "do not fall on head boundaries (transformers_neuronx/layers/attention.py "
                         "query_key_value). Use a tp_degree that divides or is a multiple of the KV heads.")
    kvl = list(range(kv))
    if kv_pad != kv:  # decoder.py DecoderLayer.to_neuron: replicate, or pad without repeating
        ratio = kv_pad // kv if kv_pad % kv == 0 else (kv_pad - extra) // kv
        if n_pad == kv_pad and extra > 0:
            ratio = (kv_pad - extra) // kv
        kvl = kvl + [-1] * (kv_pad - kv) if ratio == 0 else [h for h in kvl for _ in range(ratio)]
    if n == len(kvl):  # MHA, or replicated up to the query heads: K/V padded like Q
        kvl = _pad_heads(kvl, n_pad, groups)
    kvl += [-1] * (round_up(len(kvl), tp) - len(kvl))  # init_caches: round_up(n_kv_head, tp)
    return _check_consistent(HeadLayout(q_heads=_split(q, tp), kv_heads=_split(kvl, tp), **common))


def _nxdi_layout(n: int, kv: int, D: int, tp: int, batch_size, strategy) -> HeadLayout:
    n_pad, kv_pad = nxdi_shardable_head_counts(tp, n, kv, strategy)
    kvl = list(range(kv))
    if kv_pad != kv:
        repeats = tp // kv if strategy == NxDIGQA.REPLICATE_TO_TP_DEGREE else n // kv
        kvl = [h for h in kvl for _ in range(repeats)]
    if strategy == NxDIGQA.REPLICATE_TO_TP_DEGREE:
        q = _pad_heads(list(range(n)), n_pad, kv)  # maybe_pad_interleaved: groups of n // kv heads
        if len(q) != n_pad:
            raise ValueError(f"NxD Inference pads {n} query heads to {n_pad} interleaved over {kv} KV groups, which "
                             f"does not divide the {n_pad - n} padding heads evenly (modules/attention/gqa.py "
                             "maybe_pad_interleaved): choose another tp_degree.")
    else:
        q = _pad_heads(list(range(n)), n_pad, None)                  # maybe_pad_tail
        kvl = _pad_heads(kvl, kv_pad, None)
    layout = HeadLayout(library="nxdi", strategy=strategy, tp=tp, batch_size=batch_size, n_heads=n, n_kv_heads=kv,
                        head_dim=D, q_heads=_split(q, tp), kv_heads=_split(kvl, tp))
    return _check_consistent(layout)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def resolve_layout(n_heads: int, n_kv_heads: int, head_dim: int, tp: int, batch_size: int | None = None,
                   gqa=None) -> HeadLayout:
    """The strategy each library would use for this request (fallback warnings included) and its layout.

    ``gqa``: None (transformers-neuronx's default), a transformers-neuronx ``GQA`` or an ``NxDIGQA``
    (value strings accepted). Raises ValueError, naming the fix, when the library cannot build it.
    """
    if tp < 1:
        raise ValueError(f"tp_degree={tp}: must be >= 1")
    strategy = as_strategy(gqa)
    if isinstance(strategy, NxDIGQA):
        final = nxdi_determine_sharding_strategy(tp, n_kv_heads, strategy)
        return _nxdi_layout(n_heads, n_kv_heads, head_dim, tp, batch_size, final)
    final = tnx_check_gqa_fallback(n_heads, n_kv_heads, head_dim, tp, batch_size, strategy)
    return _tnx_layout(n_heads, n_kv_heads, head_dim, tp, batch_size, final)


def library_default(library: str, n_heads: int, n_kv_heads: int, head_dim: int, tp: int,
                    batch_size: int | None = None) -> HeadLayout:
    """What each library picks with no GQA setting (tnx: SHARD_OVER_HEADS, falling back; nxdi: REPLICATE)."""
    if library == "nxdi":
        return resolve_layout(n_heads, n_kv_heads, head_dim, tp, batch_size, NxDIGQA.REPLICATE_TO_TP_DEGREE)
    if library != "tnx":
        raise ValueError(f"library={library!r}: use 'tnx' (transformers-neuronx) or 'nxdi' (NxD Inference)")
    return resolve_layout(n_heads, n_kv_heads, head_dim, tp, batch_size, None)


def head_padding_message(n_heads: int, tp: int) -> str | None:
    """The padding note for query heads not divisible by tp (None when they divide)."""
    if n_heads % tp == 0:
        return None
    padded = round_up(n_heads, tp)
    pct = round(100 * (padded - n_heads) / n_heads)
    alts = "/".join(str(d) for d in _divisors(n_heads))
    return (f"{n_heads} attention heads are not divisible by tp_degree={tp}: Neuron pads to {padded} heads "
            f"(+{pct}% q weights) — or use tp_degree {alts}")
