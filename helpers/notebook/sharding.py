"""Measurements, tables and drawings for notebooks 01 (tensor parallelism) and 02 (GQA sharding)."""
from __future__ import annotations

import statistics
import warnings

import torch

from ..engine.config import NeuronConfig
from ..engine.generation import CausalLM
from ..engine.weights import weight_breakdown
from ..neuron.runtime import check_tp_degree
from ..planning.gqa import GQA, TNX_GUIDE_WORKLOAD, NxDIGQA, library_default, resolve_layout, round_up
from ..planning.memory import PLATFORM_TP_DEGREES, RUNTIME_RESERVE, GiB, Shape, instance, load_model_config, plan
from .figures import Spread

TNX_REQUESTS = (None, GQA.SHARD_OVER_HEADS, GQA.SHARD_OVER_BATCH, GQA.REPLICATED_HEADS, GQA.ALL_GATHER_HEADS)
NXDI_REQUESTS = (NxDIGQA.REPLICATE_TO_TP_DEGREE, NxDIGQA.CONVERT_TO_MHA)
ALL_REQUESTS = TNX_REQUESTS + NXDI_REQUESTS


def label(strategy) -> str:
    return "default" if strategy is None else strategy.value


def rank_memory(model) -> list[dict]:
    """Per rank: query/KV heads, weight and KV-cache bytes, cache shape — for NeuronModel and ParallelModel."""
    if getattr(model, "rank_reports", None):
        return model.rank_reports
    m = model.model
    layout = m.w.shard and m.w.shard.layout  # set when a GQA strategy was requested
    return [{"rank": 0, "weight_bytes": model.weight_bytes, "weights": weight_breakdown(m.w),
             "kv_bytes": model.kv_cache_bytes, "kv_cache_shape": list(m.cache.k.shape),
             "q_heads": list(layout.q_heads[0]) if layout else list(range(model.args.n_heads)),
             "kv_heads": list(layout.kv_heads[0]) if layout else list(range(model.args.n_kv_heads))}]


def neuron_tp_degrees(tp_degrees, instance_family: str | None = None) -> tuple[list[int], dict[int, str]]:
    """The degrees the Neuron runtime runs on this instance family (``helpers.neuron.check_tp_degree``),
    and for each other one the reason it is left out."""
    ok, skipped = [], {}
    for tp in tp_degrees:
        try:
            check_tp_degree(int(tp), instance_family)
            ok.append(int(tp))
        except ValueError as e:
            skipped[int(tp)] = str(e)
    return ok, skipped


def tp_rules(models, families=("inf2", "trn1", "trn2")) -> list[dict]:
    """The first rule of both guides' "Tensor-parallelism support" (the transformers-neuronx
    developer guide, https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/archive/transformers-neuronx/transformers-neuronx-developer-guide.html, and the NxD Inference feature guide, https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/libraries/nxd-inference/developer_guides/feature-guide.html): "The number of
    attention heads needs to be divisible by the tensor-parallelism degree", checked against the degrees the Neuron
    runtime supports per family (``planner.PLATFORM_TP_DEGREES``). Per model: the degrees that divide its query
    heads, and for the others how many zero heads the libraries add (up to a multiple of tp; computed anyway)."""
    rows = []
    for m in models:
        s = Shape.from_config(load_model_config(m))
        row = {"model": s.name, "q/kv heads": f"{s.heads}/{s.kv_heads}"}
        for fam in families:
            tps = PLATFORM_TP_DEGREES[fam]
            ok = [str(t) for t in tps if s.heads % t == 0]
            pad = [f"{t}(+{round_up(s.heads, t) - s.heads})" for t in tps if s.heads % t]
            row[f"{fam} {tps}"] = " ".join(ok) + (f" | pads {' '.join(pad)}" if pad else "")
        rows.append(row)
    return rows


def off_neuron_degrees(tp_degrees) -> list[int]:
    """Degrees no Neuron instance family runs (``planner.PLATFORM_TP_DEGREES``): teaching devices of the reference
    engine (tp=3 divides SmolLM2's 9 query and 3 KV heads, so nothing is padded or replicated)."""
    valid = {t for tps in PLATFORM_TP_DEGREES.values() for t in tps}
    return [int(t) for t in tp_degrees if int(t) not in valid]


def run_greedy(build, tp: int, enc, max_new_tokens: int, repeats: int = 1, gqa=None, measure_collectives: bool = False,
               threads_per_rank: int | None = None, **build_kw) -> dict:
    """Build at ``tp`` with ``build(tp_degree=tp, **build_kw)`` (``helpers.build_model`` with the notebook's settings
    bound, on any backend, the Neuron libraries included; ``gqa``: a GQA request, passed as
    ``neuron_config=NeuronConfig(group_query_attention=gqa)``), generate greedily, ``repeats`` timed runs, then free
    the ranks. ``build_kw``: per-call settings such as ``batch_size``.

    What ``sample()`` and its ``stats`` give on every backend: the tokens, the median inter-token latency and TTFT
    (None where the library times no token: NxD Inference's adapter), the median wall time per new token, prompt
    encoding included, each with its per-repeat samples, the build's seconds and its warnings. On the reference
    engine also the logits of the prompt's last position, what each rank holds (:func:`rank_memory`) and the head
    layout; with ``measure_collectives``, the all-reduce latency and the collectives per step of a tensor-parallel
    model. ``threads_per_rank``: CPU threads each rank computes with (tp=1 included), like one NeuronCore per rank.
    """
    before = torch.get_num_threads()
    if threads_per_rank:  # ranks take the driver's threads // tp at build time; tp=1 runs here
        torch.set_num_threads(threads_per_rank * tp)
    if gqa is not None:
        build_kw["neuron_config"] = NeuronConfig(group_query_attention=gqa)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = build(tp_degree=tp, **build_kw)
    if threads_per_rank:
        torch.set_num_threads(threads_per_rank)
    try:
        ids, mask = enc.input_ids, enc.attention_mask
        tokens, itls, ttfts, per_token = None, [], [], []
        for _ in range(max(1, repeats)):
            tokens = model.sample(ids, ids.shape[1] + max_new_tokens, top_k=1, attention_mask=mask)
            st = model.stats
            per_token.append(st["total_s"] / max(1, st["new_tokens"]))
            t = st.get("token_times_s") or []
            if len(t) > 1:
                itls.append(statistics.median(b - a for a, b in zip(t, t[1:])))
            if st.get("ttft_s") is not None:
                ttfts.append(st["ttft_s"])
        out = {"tp": tp, "tokens": tokens, "itl_s": statistics.median(itls) if itls else None,
               "ttft_s": statistics.median(ttfts) if ttfts else None, "s_per_token": statistics.median(per_token),
               "itl_samples_s": itls, "s_per_token_samples": per_token, "ttft_samples_s": ttfts,
               "build_s": getattr(model, "build_s", getattr(model, "load_s", None)),
               "warnings": [str(w.message) for w in caught]}
        if isinstance(model, CausalLM):  # the reference engine: its logits and what each rank holds
            out.update(logits=model.forward(ids, start_ids=(mask == 0).sum(1)), ranks=rank_memory(model),
                       layout=getattr(model, "layout", None))
        if measure_collectives and hasattr(model, "all_reduce_latency"):
            out["all_reduce_s"] = model.all_reduce_latency()
            out["collectives_per_step"] = model.collectives_per_step
        return out
    finally:
        torch.set_num_threads(before)
        if hasattr(model, "close"):
            model.close()


def latency_summary(runs: dict) -> dict:
    """Per tp, ms per token: the inter-token latency when every run timed its tokens, else the wall time per new
    token with the prompt included (NxD Inference's adapter times no single token); ``key`` names it in the
    metrics. ``comm_ms``: the collectives' estimated share (all-reduce latency x count), only for reference-engine
    runs that measured it (tp=1 has none: 0). ``spread``: per tp, a :class:`Spread` of the per-repeat figures in
    seconds (one sample, the median, for runs that kept no samples)."""
    timed = all(r.get("itl_s") is not None for r in runs.values())
    ms = {tp: 1e3 * (r["itl_s"] if timed else r["s_per_token"]) for tp, r in runs.items()}
    samples = {tp: r.get("itl_samples_s" if timed else "s_per_token_samples") or [ms[tp] / 1e3] for tp, r in runs.items()}
    measured = any("all_reduce_s" in r for r in runs.values())
    comm = {tp: 1e3 * r.get("all_reduce_s", 0.0) * r.get("collectives_per_step", 0) for tp, r in runs.items()}
    return {"ms": ms, "comm_ms": comm if measured else {}, "key": "itl_ms" if timed else "ms_per_token",
            "spread": {tp: Spread(v) for tp, v in samples.items()},
            "what": "inter-token latency" if timed else "wall time per new token, prompt included"}


def token_agreement(tokens, reference, logits=None, reference_logits=None) -> dict:
    """Greedy tokens against a reference run's: identical, for how many leading positions every row agrees
    (compared over the shorter of the two: a run that stopped at EOS is shorter), and, given both runs' logits
    (the reference engine's), the largest logit difference."""
    n = min(tokens.shape[1], reference.shape[1])
    same_cols = (tokens[:, :n] == reference[:, :n]).all(0).long()
    out = {"tokens_equal": bool(torch.equal(tokens, reference)), "agree_positions": int(same_cols.cumprod(0).sum()),
           "compared_positions": n}
    if logits is not None and reference_logits is not None:
        out["max_logit_diff"] = float((logits - reference_logits).abs().max())
    return out


def device_weight_bytes(rank: dict) -> int:
    """A rank's weights as a NeuronCore holds them with transformers-neuronx: without the embedding (host),
    with the LM head shard (the embedding itself when tied and unsharded)."""
    w = rank["weights"]
    return w["layers"] + w["norms"] + (w["lm_head"] or w["embedding"])


def resolve_case(rows: list, built: dict, row: dict, resolve):
    """One request of a sweep: what the library resolves it to (``resolve()``, with the fallback warnings it
    gives). A refused request, or one whose layout ``built`` already holds, gets its row appended to ``rows``
    and None back; a new layout gives (key into ``built``, the row so far, the layout) to build and measure."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            layout = resolve()
        except ValueError as e:
            rows.append({**row, "status": "rejected", "detail": str(e)})
            return None
    row = {**row, "resolved": layout.name, "kv_mode": layout.kv_mode, "fallback": [str(w.message) for w in caught]}
    key = (row["tp"], row["batch"], layout.q_heads, layout.kv_heads, layout.kv_mode)
    if key in built:
        rows.append({**row, **built[key], "status": "ok", "built": f"same layout as {built[key]['first']}"})
        return None
    return key, row, layout


def strategy_sweep(build, shape: Shape, tp_degrees, batch_sizes, encode, max_new_tokens: int, requests=ALL_REQUESTS,
                   extra_cases=(), repeats: int = 1, threads_per_rank: int | None = None) -> list[dict]:
    """Every (tp, batch, requested strategy) on the reference engine: what the library does with it, and — built
    once per distinct layout with ``build`` (see :func:`run_greedy`) — whether the outputs equal the tp=1
    default run for that batch, the KV bytes each rank allocated and the measured inter-token latency
    (``itl_ms``, median of ``repeats`` runs). ``shape``: the model's :class:`helpers.planning.memory.Shape`;
    ``encode(batch)`` gives the prompts. ``extra_cases``: more (tp, batch, strategy) triples. Every row names
    the build it shares (``first``) so :func:`strategy_costs` can list each layout once."""
    cases = [(tp, b, r) for b in batch_sizes for tp in tp_degrees for r in requests]
    cases += [c for c in extra_cases if c not in cases]
    refs, built, rows = {}, {}, []
    run = dict(repeats=repeats, threads_per_rank=threads_per_rank)

    def measured(res, ref, first, layout):
        return {**token_agreement(res["tokens"], ref["tokens"], res["logits"], ref["logits"]),
                "rank_kv_bytes": [r["kv_bytes"] for r in res["ranks"]],
                "kv_cache_shape": res["ranks"][0]["kv_cache_shape"], "itl_ms": round(1e3 * res["itl_s"], 2), "first": first,
                "itl_samples_ms": [1e3 * t for t in res.get("itl_samples_s") or [res["itl_s"]]],
                "layout": (layout.tp, layout.name, layout.kv_mode)}

    for tp, b, req in cases:
        enc = encode(b)
        if b not in refs:
            refs[b] = run_greedy(build, 1, enc, max_new_tokens, batch_size=b, **run)
            base = resolve_layout(shape.heads, shape.kv_heads, shape.head_dim, 1, b, None)
            built[(1, b, base.q_heads, base.kv_heads, base.kv_mode)] = measured(refs[b], refs[b], f"default@tp1b{b}", base)
        case = resolve_case(rows, built, {"tp": tp, "batch": b, "requested": label(req)},
                            lambda: resolve_layout(shape.heads, shape.kv_heads, shape.head_dim, tp, b, req))
        if case is None:
            continue
        key, row, layout = case
        res = run_greedy(build, tp, enc, max_new_tokens, gqa=req, batch_size=b, **run)
        built[key] = measured(res, refs[b], f"{label(req)}@tp{tp}b{b}", layout)
        rows.append({**row, **built[key], "status": "ok", "built": "yes"})
    return rows


# Collectives a layout adds inside attention, per layer and token, on top of the two all-reduces every
# layer has (helpers/parallel ParallelTransformer: SHARD_OVER_BATCH exchanges q, k, v and the output by
# all-to-all; ALL_GATHER_HEADS with more ranks than KV heads all-gathers K and V from the group's slices).
EXTRA_COLLECTIVES = {"heads": "", "batch": "4 all-to-all", "gather": "2 all-gather"}


def strategy_costs(rows: list[dict]) -> list[dict]:
    """What each distinct layout of a :func:`strategy_sweep` costs, per workload (batch size): one row per layout
    (the tp=1 default included) with the requests that end in it, the measured inter-token latency, the tokens
    per second of the whole batch, the KV cache each rank allocated and the collectives it adds per layer.
    ``itl_min_ms`` / ``itl_max_ms``: the range of the per-repeat latencies (``itl_ms`` is their median), which
    ``itl_samples_ms`` lists (for :func:`helpers.notebook.figures.compare`)."""
    out: dict = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        tp, name, mode = r["layout"]
        c = out.setdefault((r["batch"], r["first"]), {
            "batch": r["batch"], "tp": tp, "layout": name, "kv_mode": mode,
            "itl_ms": r["itl_ms"], "itl_min_ms": round(min(r.get("itl_samples_ms") or [r["itl_ms"]]), 2),
            "itl_max_ms": round(max(r.get("itl_samples_ms") or [r["itl_ms"]]), 2),
            "itl_samples_ms": list(r.get("itl_samples_ms") or [r["itl_ms"]]),
            "tokens_per_s": round(r["batch"] * 1e3 / r["itl_ms"], 1),
            "kv_mib_per_rank": round(max(r["rank_kv_bytes"]) / 2 ** 20, 3),
            "extra_collectives_per_layer": EXTRA_COLLECTIVES[mode], "requests": ""})
        c["requests"] = ", ".join(filter(None, [c["requests"], r["requested"]]))
    return sorted(out.values(), key=lambda c: (c["batch"], c["tp"], c["kv_mode"], c["layout"]))


def kv_bytes_match_planner(rows: list[dict], model, n_positions: int, amp: str) -> bool:
    """True when, for every built row of a :func:`strategy_sweep`, the largest KV cache a rank allocated equals the
    planner's count for that (tp, batch, library, request)."""
    nxdi = {g.value for g in NxDIGQA}
    return all(max(r["rank_kv_bytes"]) == plan(model, r["tp"], batch_size=r["batch"], n_positions=n_positions, amp=amp,
                                               library="nxdi" if r["requested"] in nxdi else "tnx",
                                               gqa=None if r["requested"] == "default" else r["requested"]).kv_bytes
               for r in rows if r["status"] == "ok")


def library_sweep(build, shape: Shape, stack: str, tp_degrees, batch_sizes, encode, max_new_tokens: int,
                  extra_cases=()) -> list[dict]:
    """:func:`strategy_sweep` on a Neuron library (``stack``: "tnx" | "nxdi"), built with ``build`` (the notebook's
    ``helpers.build_model`` with its settings bound). Requests: transformers-neuronx's default and its four GQA
    values; NxD Inference has no knob, so its own choice only. A request that ``helpers.planning.gqa`` (the libraries'
    fallback rules) says cannot be built is refused up front; the others are built once per distinct layout and
    compared by greedy tokens (``sample()`` returns no logits) with the tp=1 default run of the same batch."""
    tnx = stack == "tnx"
    cases = [(tp, b, r) for b in batch_sizes for tp in tp_degrees for r in (TNX_REQUESTS if tnx else (None,))]
    cases += [c for c in extra_cases if c not in cases] if tnx else []
    refs, built, rows = {}, {}, []
    for tp, b, req in cases:
        enc = encode(b)
        if b not in refs:
            refs[b] = run_greedy(build, 1, enc, max_new_tokens, batch_size=b)["tokens"]
            base = library_default(stack, shape.heads, shape.kv_heads, shape.head_dim, 1, b)
            built[(1, b, base.q_heads, base.kv_heads, base.kv_mode)] = {
                **token_agreement(refs[b], refs[b]), "first": f"default@tp1b{b}"}
        case = resolve_case(rows, built, {"tp": tp, "batch": b, "requested": label(req) if tnx else "nxdi: no knob"},
                            lambda: (resolve_layout(shape.heads, shape.kv_heads, shape.head_dim, tp, b, req) if tnx
                                     else library_default("nxdi", shape.heads, shape.kv_heads, shape.head_dim, tp, b)))
        if case is None:
            continue
        key, row, _ = case
        res = run_greedy(build, tp, enc, max_new_tokens, gqa=req, batch_size=b)
        built[key] = {**token_agreement(res["tokens"], refs[b]), "first": f"{row['requested']}@tp{tp}b{b}"}
        rows.append({**row, **built[key], "status": "ok", "built": "yes"})
    return rows


def strategy_table(models, tp_degrees, batch_sizes, reasons: dict | None = None) -> list[dict]:
    """Which strategy each library ends with, per (model, tp, batch) and request. A request that the libraries'
    rules (``helpers.planning.gqa``, nothing compiled) say cannot be built reads "predicted to fail [k]": ``reasons``,
    when given, is filled with ``{k: the reason}`` (one number per distinct reason)."""
    rows = []
    reasons = {} if reasons is None else reasons
    numbers: dict[str, int] = {v: k for k, v in reasons.items()}
    for m in models:
        s = Shape.from_config(load_model_config(m))
        for tp in tp_degrees:
            for b in batch_sizes:
                row = {"model": s.name, "heads/kv": f"{s.heads}/{s.kv_heads}", "tp": tp, "batch": b}
                for lib, req in [("tnx", None), ("tnx", GQA.SHARD_OVER_BATCH), ("tnx", GQA.REPLICATED_HEADS),
                                 ("tnx", GQA.ALL_GATHER_HEADS), ("nxdi", None)]:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        try:
                            lay = (library_default(lib, s.heads, s.kv_heads, s.head_dim, tp, b) if req is None
                                   else resolve_layout(s.heads, s.kv_heads, s.head_dim, tp, b, req))
                            cell = f"{lay.name} ({lay.kv_heads_per_rank}kv)"
                        except ValueError as e:
                            k = numbers.setdefault(str(e), len(numbers) + 1)
                            reasons[k] = str(e)
                            cell = f"predicted to fail [{k}]"
                    row[f"{lib}:{label(req)}"] = cell
                rows.append(row)
    return rows


def workload_plans(model, tp: int, batch_sizes, n_positions: int = 4096, amp: str = "bf16") -> list[dict]:
    """The planner's bytes per NeuronCore for each GQA request at ``tp`` and each batch size (the workloads), for a
    shipped config: what a strategy costs in KV cache and weights where the embedded model is too small to show it.
    The same per-rank counts are checked against the reference engine's allocations in notebook 02."""
    rows = []
    for b in batch_sizes:
        for lib, req in [("tnx", r) for r in TNX_REQUESTS] + [("nxdi", None)]:
            p = plan(model, tp, batch_size=b, n_positions=n_positions, amp=amp, library=lib, gqa=req)
            row = {"batch": b, "library": lib, "requested": label(req), "resolved": p.strategy or "error",
                   "guide: for": TNX_GUIDE_WORKLOAD.get(req, "") if lib == "tnx" else "",
                   "kv heads/core": p.kv_heads_per_core, "KV GiB/core": round(p.kv_bytes / GiB, 2),
                   "weights GiB/core": round(p.weight_bytes / GiB, 2)}
            if p.error:
                row.update({"kv heads/core": "-", "KV GiB/core": "-", "weights GiB/core": "-"})
            rows.append(row)
    return rows


def plot_strategy_costs(costs: list[dict], title: str = ""):
    """Per workload (batch size, one row of panels): each layout's measured inter-token latency and the KV cache
    per rank (from :func:`strategy_costs`); the latency bars carry the min-max of the repeats as error bars."""
    import matplotlib.pyplot as plt

    batches = sorted({c["batch"] for c in costs})
    fig, axes = plt.subplots(len(batches), 2, figsize=(11, 2.6 * len(batches)), squeeze=False)
    for (a_lat, a_kv), b in zip(axes, batches):
        cs = [c for c in costs if c["batch"] == b]
        names = [f"tp={c['tp']}\n{c['layout']}" + (f"\n+{c['extra_collectives_per_layer']}/layer"
                                                    if c["extra_collectives_per_layer"] else "") for c in cs]
        med = [c["itl_ms"] for c in cs]
        err = [[m - c.get("itl_min_ms", m) for m, c in zip(med, cs)], [c.get("itl_max_ms", m) - m for m, c in zip(med, cs)]]
        a_lat.bar(names, med, color="tab:blue", yerr=err, capsize=3)
        a_lat.set(ylabel="ms per token", title=f"batch {b}: inter-token latency (median, min-max of repeats)")
        a_kv.bar(names, [c["kv_mib_per_rank"] for c in cs], color="tab:orange")
        a_kv.set(ylabel="MiB per rank", title=f"batch {b}: KV cache per rank (allocated)")
        for a in (a_lat, a_kv):
            a.tick_params(axis="x", labelsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))  # room for a two-line title (figures.titled)
    return fig


def format_table(rows: list[dict], columns=None) -> str:
    """Rows of dicts as an aligned text table."""
    if not rows:
        return "(empty)"
    cols = columns or list(rows[0])
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])


def memory_curves(models, tp_degrees, **kwargs) -> dict:
    """{model: [GiB per core for each tp]} (NaN where the library cannot build it)."""
    out = {}
    for m in models:
        vals = []
        for tp in tp_degrees:
            p = plan(m, tp, **kwargs)
            vals.append(float("nan") if p.error else p.total_bytes / GiB)
        out[Shape.from_config(load_model_config(m)).name] = vals
    return out


def draw_layout(ax, layout, title: str | None = None):
    """Per rank (column): the query heads it holds (top row, coloured by their KV head; grey = padding) and
    its KV cache (bottom: one box per cached KV head; SHARD_OVER_BATCH: every head, for its batch rows)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    cmap = plt.get_cmap("tab10")
    per = layout.n_heads // layout.n_kv_heads
    width = max(max(len(q), len(k)) for q, k in zip(layout.q_heads, layout.kv_heads))
    for r in range(layout.tp):
        x0 = r * (width + 1)
        for j, h in enumerate(layout.q_heads[r]):
            color = "lightgrey" if h < 0 else cmap((h // per) % 10)
            ax.add_patch(Rectangle((x0 + j, 1.2), 0.9, 0.9, color=color))
            ax.text(x0 + j + 0.45, 1.65, "pad" if h < 0 else f"q{h}", ha="center", va="center", fontsize=7)
        for j, h in enumerate(layout.kv_heads[r]):
            color = "lightgrey" if h < 0 else cmap(h % 10)
            ax.add_patch(Rectangle((x0 + j, 0), 0.9, 0.9, color=color, hatch="//" if layout.kv_mode == "gather" else None))
            ax.text(x0 + j + 0.45, 0.45, "pad" if h < 0 else f"kv{h}", ha="center", va="center", fontsize=7)
        rows = layout.describe()[r]["batch_rows"]
        note = f"rows {rows}" if rows is not None else ""
        ax.text(x0 + width / 2, -0.45, f"rank {r} {note}", ha="center", va="center", fontsize=8)
    ax.set_xlim(-0.5, layout.tp * (width + 1))
    ax.set_ylim(-0.9, 2.4)
    ax.set_yticks([0.45, 1.65], ["KV cache", "q heads"])
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or f"{layout.library} {layout.name} ({layout.kv_mode}), tp={layout.tp}", fontsize=9)


def n_positions_fit(model, inst, tp: int, n_positions, reserves=(RUNTIME_RESERVE, 0.0), **kwargs) -> dict:
    """The planner's weights + KV cache per core (GiB) at each ``n_positions`` for one ``tp``, what one core of
    ``inst`` can use for each runtime ``reserve`` (GiB), and per reserve the largest ``n_positions`` that still fits
    (KV grows linearly with it; None when not even 1 fits, the model's maximum when all do)."""
    s = Shape.from_config(load_model_config(model))
    hbm = instance(inst).hbm_per_core_bytes
    gib = [plan(model, tp, n_positions=n, **kwargs).total_bytes / GiB for n in n_positions]
    usable, largest = {}, {}
    for r in reserves:
        usable[r] = hbm * (1 - r) / GiB
        lo, hi = 0, s.max_positions  # the largest n with plan(n) <= usable, by bisection
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if plan(model, tp, n_positions=mid, **kwargs).total_bytes <= int(hbm * (1 - r)):  # as Plan.fits
                lo = mid
            else:
                hi = mid - 1
        largest[r] = lo or None
    return {"n_positions": list(n_positions), "gib": gib, "usable_gib": usable, "largest_fitting": largest}
