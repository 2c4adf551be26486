"""Notebook 02 (GQA sharding) behind one call per step: the setup and its validation, the short strategy table, the
drawing of what each rank holds, the parity sweep, the cost report, the planner's workload table, the requested
strategy in detail and the metrics. The measurements themselves live in :mod:`helpers.notebook.sharding` (shared
with notebook 01); this module only arranges them for the lesson.

The guides quoted: the transformers-neuronx developer guide, "Grouped-query attention (GQA) support [Beta]"
(https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/archive/transformers-neuronx/transformers-neuronx-developer-guide.html)
and the NxD Inference feature guide, "Grouped-query attention (GQA) support"
(https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/libraries/nxd-inference/developer_guides/feature-guide.html).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from functools import partial

import torch

from ..model_store import load_tokenizer, resolve_model_path
from ..planning import memory as planner
from ..planning.gqa import as_strategy, resolve_layout
from ..prompts import encode_prompts
from .backend import resolve_backend
from .build import build_model
from .figures import compare, titled
from .metrics import write_metrics
from .provenance import measured_by, reference_only
from .sharding import (ALL_REQUESTS, draw_layout, format_table, kv_bytes_match_planner, label, library_sweep,
                       neuron_tp_degrees, plot_strategy_costs, run_greedy, strategy_costs, strategy_sweep,
                       strategy_table, workload_plans)

# The short strategy table: one model per head shape (9/3, 32/8, 64/8), a handful of degrees (inf2's 2, 8 and 24;
# trn1's 32), one batch (4: divisible by 2 but not by 8, 24 or 32). :func:`full_strategy_table` gives every row.
SUMMARY_MODELS = ("embedded", "Llama-3.1-8B", "Llama-3.1-70B")
SUMMARY_TP_DEGREES = (2, 8, 24, 32)
SUMMARY_BATCH = 4
FULL_MODELS = ("embedded", "Mistral-7B-Instruct-v0.2", "Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.2-1B",
               "Mixtral-8x7B-v0.1")
FULL_TP_DEGREES = (1, 2, 4, 8, 16, 24, 32)
# The planner's workload: the model, instance and degree where the KV heads (8) do not divide tp (32).
WORKLOAD = {"model": "Llama-3.1-70B", "instance": "trn1.32xlarge", "tp": 32, "batch_sizes": (1, 32),
            "n_positions": 4096}
LOGIT_TOL = 1e-3  # f32: sharding only reorders sums (16-bit rounds every partial sum: reported only)


@dataclass
class GQARun:
    """What every step of notebook 02 needs: the backend, the model and its head shape, a ``build`` with the
    notebook's settings bound, the prompts, and the sweep's degrees (narrowed to the runtime's on Neuron)."""
    bk: object
    model_dir: object
    tok: object
    shape: planner.Shape
    amp: str
    n_positions: int
    prompts: list
    tp_degree: int
    batch_size: int
    requested: object
    parity_tp_degrees: list
    parity_batch_sizes: list
    sob_case: list
    max_new_tokens: int
    repeats: int
    threads: int | None
    build: object = field(repr=False, default=None)

    def encode(self, batch: int):
        return encode_prompts(self.tok, self.prompts[:batch], batch)


def setup(backend="reference", neuron_stack=None, device="cpu", model_path=None, seed=0, amp="f32", tp_degree=2,
          strategy="shard-over-heads", batch_size=1, parity_tp_degrees=(1, 2, 3), parity_batch_sizes=(1, 3),
          sob_case=(3, 3), max_new_tokens=6, repeats=5, n_positions=128, threads_per_rank=1,
          prompts=("What is grouped-query attention?", "Name a prime number.", "Say hello.")) -> GQARun:
    """Validate the parameters (raises, naming the fix), resolve the backend and model, print what runs."""
    bk = resolve_backend(backend, neuron_stack, device)
    torch.manual_seed(seed)  # decoding is greedy here; the seed fixes anything else drawn
    requested = as_strategy(strategy)  # raises on an unknown name, listing the valid ones
    if min(tp_degree, batch_size, repeats, *parity_tp_degrees, *parity_batch_sizes) < 1 or max_new_tokens < 2:
        raise ValueError("tp_degree, batch_size, repeats, parity_tp_degrees, parity_batch_sizes: 1 or more; "
                         "max_new_tokens: 2 or more")
    sob_case = list(sob_case or [])
    if sob_case and len(sob_case) != 2:
        raise ValueError(f"sob_case={sob_case}: use [tp, batch] or []")
    parity_tp_degrees = [int(t) for t in parity_tp_degrees]
    if bk.is_neuron:  # the Neuron runtime runs only some degrees on each instance family
        parity_tp_degrees, left_out = neuron_tp_degrees(parity_tp_degrees)
        if sob_case and not neuron_tp_degrees([sob_case[0]])[0]:
            left_out[sob_case[0]], sob_case = "sob_case: " + neuron_tp_degrees([sob_case[0]])[1][sob_case[0]], []
        for tp, why in left_out.items():
            print(f"tp_degree={tp} left out on Neuron: {why}")
    model_dir = resolve_model_path(model_path)
    shape = planner.Shape.from_config(planner.load_model_config(str(model_dir)))
    run = GQARun(bk=bk, model_dir=model_dir, tok=load_tokenizer(model_dir), shape=shape, amp=amp,
                 n_positions=n_positions, prompts=list(prompts), tp_degree=tp_degree, batch_size=batch_size,
                 requested=requested, parity_tp_degrees=parity_tp_degrees,
                 parity_batch_sizes=[int(b) for b in parity_batch_sizes], sob_case=sob_case,
                 max_new_tokens=max_new_tokens, repeats=repeats,
                 threads=None if bk.is_neuron else threads_per_rank)
    run.build = partial(build_model, bk, model_dir, n_positions=n_positions, amp=amp)
    print(f"backend: {bk}; {shape.name}: {shape.heads} query heads, {shape.kv_heads} KV heads of {shape.head_dim}; "
          f"requested {requested.value} at tp={tp_degree}, batch {batch_size}")
    print("figures measured by", measured_by(bk))
    return run


# -------------------------------------------------------------------------------- 1. which strategy each ends with
def full_strategy_table(reasons: dict | None = None) -> list[dict]:
    """Every (model, tp, batch) of :data:`FULL_MODELS` x :data:`FULL_TP_DEGREES` x batch 1 and 4 (84 rows)."""
    return strategy_table(FULL_MODELS, FULL_TP_DEGREES, (1, SUMMARY_BATCH), reasons)


def strategy_summary(models=SUMMARY_MODELS, tp_degrees=SUMMARY_TP_DEGREES, batch_size=SUMMARY_BATCH) -> dict:
    """Print the short table (each library's strategy and KV heads per core) and the reasons of the requests
    predicted to fail; return ``{"rows", "reasons", "has_tp24"}`` (``has_tp24``: both libraries build tp=24)."""
    reasons: dict = {}
    rows = strategy_table(models, tp_degrees, (batch_size,), reasons)
    print(f"batch {batch_size}; in brackets: KV heads in each core's cache")
    print(format_table(rows, [c for c in rows[0] if c != "batch"]))
    for k, why in reasons.items():
        print(f"[{k}] predicted to fail: {why}")
    has_24 = any(r["tp"] == 24 for r in rows) and all(
        not r[c].startswith("predicted") for r in rows if r["tp"] == 24 for c in ("tnx:default", "nxdi:default"))
    return {"rows": rows, "reasons": reasons, "has_tp24": has_24}


# -------------------------------------------------------------------------------- 2. what each rank holds
def draw_requests(run: GQARun):
    """Resolve every request at (tp_degree, batch_size), plus SHARD_OVER_BATCH at ``sob_case`` and ALL_GATHER_HEADS
    with twice as many ranks as KV heads; print the fallback warnings of the requested degree and the refusals,
    draw one panel per distinct layout. Returns ``(drawn, refused)``: ``{key: (layout, [requests])}`` and
    ``{(tp, batch, request): reason}``."""
    import matplotlib.pyplot as plt

    s = run.shape
    cases = [(run.tp_degree, run.batch_size, r) for r in ALL_REQUESTS]
    cases += [(*run.sob_case, as_strategy("shard-over-batch"))] if run.sob_case else []
    cases.append((2 * s.kv_heads, run.batch_size, as_strategy("all-gather-heads")))
    drawn, refused = {}, {}
    for tp, b, req in cases:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                lay = resolve_layout(s.heads, s.kv_heads, s.head_dim, tp, b, req)
            except ValueError as err:
                refused[(tp, b, label(req))] = str(err)
                continue
        drawn.setdefault((tp, b, lay.q_heads, lay.kv_heads, lay.kv_mode, lay.library), (lay, []))[1].append(label(req))
        if tp == run.tp_degree and b == run.batch_size:
            for w in caught:
                print(f"{label(req)}: {w.message}")
    fig, axes = plt.subplots(len(drawn), 1, figsize=(10, 1.6 * len(drawn) + 0.4), squeeze=False)
    for ax, (lay, reqs) in zip(axes[:, 0], drawn.values()):
        draw_layout(ax, lay, f"tp={lay.tp}, batch {lay.batch_size}: {', '.join(reqs)} -> {lay.library} {lay.name} "
                             f"({lay.kv_mode})")
    titled(fig, f"What each rank holds ({s.name})",
           source="computed by helpers.planning.gqa from the libraries' rules (no measurement)")
    fig.tight_layout()
    plt.show()
    for (tp, b, name), err in refused.items():
        print(f"tp={tp}, batch {b}, requested {name}: refused — {err}")
    return drawn, refused


# -------------------------------------------------------------------------------- 3. parity
def parity_sweep(run: GQARun) -> list[dict]:
    """Every (tp, batch, request) of the run's degrees and batches (and ``sob_case``), built once per distinct
    layout: on the reference engine with ``repeats`` timed runs, on Neuron by the library (tokens only). Prints one
    row per distinct build (the requests that share it are counted) and the refusals; returns every row."""
    extra = [(run.sob_case[0], run.sob_case[1], as_strategy("shard-over-batch"))] if run.sob_case else []
    args = (run.build, run.shape)
    if run.bk.is_neuron:
        sweep = library_sweep(*args, run.bk.stack, run.parity_tp_degrees, run.parity_batch_sizes, run.encode,
                              run.max_new_tokens, extra_cases=extra)
        cols = ["tp", "batch", "requested", "resolved", "tokens_equal", "agree_positions"]
    else:
        sweep = strategy_sweep(*args, run.parity_tp_degrees, run.parity_batch_sizes, run.encode, run.max_new_tokens,
                               extra_cases=extra, repeats=run.repeats, threads_per_rank=run.threads)
        cols = ["tp", "batch", "requested", "resolved", "kv_mode", "tokens_equal", "max_logit_diff"]
    built = [r for r in sweep if r.get("built") == "yes"]
    print(format_table(built, cols))
    ok = [r for r in sweep if r["status"] == "ok"]
    for r in sweep:
        if r["status"] == "rejected":
            print(f"tp={r['tp']} batch={r['batch']} {r['requested']}: refused before any build — {r['detail']}")
    logits = "" if run.bk.is_neuron else (f"; largest logit difference "
                                          f"{max((r['max_logit_diff'] for r in ok), default=0):.2e} ({run.amp})")
    print(f"{len(built)} distinct builds for {len(ok)} valid (tp, batch, strategy) requests; greedy tokens identical "
          f"to tp=1 in {sum(r['tokens_equal'] for r in ok)} of {len(ok)}{logits}")
    return sweep


def check_parity(run: GQARun, sweep: list[dict]) -> None:
    """Raise unless every valid request gave the unsharded model's greedy tokens and, on the reference engine, its
    logits within :data:`LOGIT_TOL` (checked in f32 only: 16-bit rounds every partial sum)."""
    ok = [r for r in sweep if r["status"] == "ok"]
    if run.amp != "f32":
        return
    bad = [r for r in ok if not r["tokens_equal"]]
    assert not bad, f"greedy tokens differ from tp=1: {bad}"
    far = [r for r in ok if not run.bk.is_neuron and r["max_logit_diff"] >= LOGIT_TOL]
    assert not far, f"logits differ from tp=1 by {LOGIT_TOL} or more: {far}"


# -------------------------------------------------------------------------------- 4. what each layout costs
def cost_report(run: GQARun, sweep: list[dict]) -> dict:
    """On the reference engine: check each rank's allocated KV bytes against the planner (raises), print and plot
    each distinct layout's inter-token latency (median, min-max of the repeats) and KV cache per rank, and compare
    each layout with the unsharded default of the same batch (a difference only where the ranges separate).
    Returns ``{"costs", "kv_match", "verdicts"}`` (empty, None on Neuron)."""
    import matplotlib.pyplot as plt

    out = {"costs": [], "kv_match": None, "verdicts": {}}
    if not reference_only(run.bk, "it times the engine's ranks and reads the KV caches they allocated; the Neuron "
                                  "libraries do not expose a NeuronCore's cache (the tables above give the layout)"):
        return out
    out["kv_match"] = kv_bytes_match_planner(sweep, str(run.model_dir), run.n_positions, run.amp)
    assert out["kv_match"], "the planner's KV bytes differ from the caches the ranks allocated"
    costs = out["costs"] = strategy_costs(sweep)
    print(format_table(costs, ["batch", "tp", "layout", "kv_mode", "itl_ms", "itl_min_ms", "itl_max_ms",
                               "kv_mib_per_rank", "extra_collectives_per_layer"]))
    fig = plot_strategy_costs(costs)
    titled(fig, f"{run.shape.name}, {run.n_positions} positions, {run.amp}: CPU processes, where tp > 1 adds "
                "collectives through gloo (on inf2, latency falls with tp: see the published table)", run.bk)
    plt.show()
    for c in costs:  # each layout against the unsharded default (tp=1, shard-over-heads) of the same batch
        base = next((b for b in costs if b["batch"] == c["batch"] and b["tp"] == 1 and b["kv_mode"] == "heads"
                     and "default" in b["requests"]), None)
        if base is not None and c is not base:
            cmp = compare(c["itl_samples_ms"], base["itl_samples_ms"], f"tp={c['tp']} {c['layout']}",
                          f"tp=1 {base['layout']}")
            out["verdicts"][(c["batch"], c["tp"], c["layout"])] = cmp
            print(f"batch {c['batch']}: " + (cmp.verdict if run.repeats > 1 else f"{cmp.name_a}: one run, no verdict"))
    return out


def workload_table(model=WORKLOAD["model"], instance=WORKLOAD["instance"], tp=WORKLOAD["tp"],
                   batch_sizes=WORKLOAD["batch_sizes"], n_positions=WORKLOAD["n_positions"]) -> dict:
    """The planner's KV cache per core for each request at a small and a large batch, one row per request; returns
    ``{"plans": every row, "sob_saving": replicated / shard-over-batch KV at the large batch (None if refused)}``."""
    plans = workload_plans(model, tp, batch_sizes, n_positions=n_positions)
    small, large = min(batch_sizes), max(batch_sizes)
    by = {(r["batch"], r["library"], r["requested"]): r for r in plans}
    rows = [{"library": lib, "requested": req, "guide: for": r["guide: for"],
             f"batch {small}: resolved": r["resolved"], f"batch {small}: KV GiB/core": r["KV GiB/core"],
             f"batch {large}: resolved": by[(large, lib, req)]["resolved"],
             f"batch {large}: KV GiB/core": by[(large, lib, req)]["KV GiB/core"],
             "weights GiB/core": by[(large, lib, req)]["weights GiB/core"]}
            for (b, lib, req), r in by.items() if b == small]
    hbm = planner.instance(instance).hbm_per_core_bytes / planner.GiB
    print(f"{model} at tp={tp} on {instance} ({hbm:.0f} GiB HBM per core), {n_positions} positions, bf16 (planned):")
    print(format_table(rows))
    sob, rep = by[(large, "tnx", "shard-over-batch")]["KV GiB/core"], by[(large, "tnx", "replicated-heads")]["KV GiB/core"]
    saving = rep / sob if isinstance(sob, float) and sob else None
    print(f"batch {large}: shard-over-batch needs {saving}x less KV cache per core than replicated heads "
          "(planner arithmetic)")
    return {"plans": plans, "sob_saving": saving, "large_batch": large}


# -------------------------------------------------------------------------------- 5. the requested strategy
def requested_detail(run: GQARun, refused: dict):
    """The requested strategy at (tp_degree, batch_size): refused (printed), or built on the reference engine with
    each rank's heads and bytes printed; raises (f32) if its greedy tokens differ from tp=1. Returns the run or None."""
    key = (run.tp_degree, run.batch_size, label(run.requested))
    if key in refused:
        print(f"{run.requested.value} at tp={run.tp_degree}, batch {run.batch_size} is refused: {refused[key]}")
        return None
    if not reference_only(run.bk, "it lists each rank's tensors; on Neuron the library's tokens are in section 3, "
                                  "and the recipe cells build a requested strategy"):
        return None
    enc = run.encode(run.batch_size)
    kw = dict(batch_size=run.batch_size, threads_per_rank=run.threads)
    detail = run_greedy(run.build, run.tp_degree, enc, run.max_new_tokens, gqa=run.requested, **kw)
    base = run_greedy(run.build, 1, enc, run.max_new_tokens, **kw)
    print(f"{run.requested.value} at tp={run.tp_degree} -> "
          f"{detail['layout'].name if detail['layout'] else label(run.requested)}")
    print(format_table(detail["ranks"], ["rank", "q_heads", "kv_heads", "kv_cache_shape", "kv_bytes", "weight_bytes"]))
    assert run.amp != "f32" or (detail["tokens"] == base["tokens"]).all(), "the requested strategy changes the tokens"
    print(run.tok.decode(detail["tokens"][0, enc.input_ids.shape[1]:], skip_special_tokens=True))
    return detail


# -------------------------------------------------------------------------------- metrics
def write_gqa_metrics(path, run: GQARun, summary: dict, drawn: dict, sweep: list[dict], report: dict,
                      workload: dict) -> dict:
    """The key figures of notebook 02 (the keys ci/baselines/cpu.json checks), written to ``path``."""
    ok = [r for r in sweep if r["status"] == "ok"]
    sob = [r for r in ok if r["kv_mode"] == "batch"]
    resolved = next((lay.name for lay, reqs in drawn.values() if lay.tp == run.tp_degree
                     and lay.batch_size == run.batch_size and label(run.requested) in reqs), "refused")
    full_reasons: dict = {}
    full_rows = full_strategy_table(full_reasons)
    m = {"sweep_runs_ok": len(ok), "sweep_runs_rejected": len(sweep) - len(ok),
         "distinct_layouts_built": sum(r.get("built") == "yes" for r in ok),
         "all_tokens_equal": all(r["tokens_equal"] for r in ok), "shard_over_batch_runs": len(sob),
         "shard_over_batch_tokens_equal": all(r["tokens_equal"] for r in sob) if sob else None,
         "requested": label(run.requested), "requested_resolved": resolved, "tp_degree": run.tp_degree,
         "batch_size": run.batch_size, "amp": run.amp, "measured_by": measured_by(run.bk),
         "workload_large_batch_sob_kv_saving": workload["sob_saving"],
         "table_predicted_failures": len(summary["reasons"]), "table_has_tp24": summary["has_tp24"],
         "full_table_rows": len(full_rows), "full_table_predicted_failures": len(full_reasons)}
    if not run.bk.is_neuron:  # logits, latency and the ranks' KV caches: the reference engine's
        rep1 = [r for r in ok if r["tp"] == 1 and r["resolved"] == "replicated-heads"]
        base1 = [r for r in ok if r["tp"] == 1 and r["requested"] == "default" and rep1 and r["batch"] == rep1[0]["batch"]]
        verdicts = report["verdicts"]
        m.update(max_logit_diff=max((r["max_logit_diff"] for r in ok), default=0.0),
                 kv_bytes_match_planner=bool(report["kv_match"]),
                 tp1_replicated_kv_ratio=(max(rep1[0]["rank_kv_bytes"]) / max(base1[0]["rank_kv_bytes"])
                                          if rep1 and base1 else None),
                 distinct_layouts_costed=len(report["costs"]),
                 layouts_measurably_different_from_tp1=(sum(v.measurable for v in verdicts.values())
                                                        if run.repeats > 1 else None))
    return write_metrics(path, m)
