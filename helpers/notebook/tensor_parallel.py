"""Notebook 01 (tensor parallelism): its setup, the runs at each ``tp_degree``, their checks, tables and plots, and
its metrics, one call each, so that the notebook shows the lesson. The measurements themselves are
``helpers.notebook.sharding``'s (shared with notebook 02); the sizing is ``helpers.planning.memory`` (bytes per
NeuronCore) and ``helpers.planning.production`` (host memory as well)."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from functools import partial

import torch

from ..model_store import load_hf_model, load_tokenizer, resolve_model_path
from ..planning import memory as planner
from ..planning.config_search import HEAD_RULES, padded_heads, search
from ..planning.dtypes import amp_dtype
from ..prompts import encode_prompts, hf_greedy
from .backend import Backend, resolve_backend
from .build import build_model
from .figures import Spread, compare
from .metrics import write_metrics
from .provenance import measured_by, reference_only
from .sharding import (device_weight_bytes, format_table, latency_summary, memory_curves, n_positions_fit,
                       neuron_tp_degrees, off_neuron_degrees, run_greedy, token_agreement)

# The shipped configs (helpers/model_configs) whose memory per core the notebook draws (the README's figure).
SHIPPED_MODELS = ("Mistral-7B-Instruct-v0.2", "Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.2-1B", "Mixtral-8x7B-v0.1")
MEMORY_TPS = (1, 2, 4, 8, 16, 24, 32, 64)
LOGIT_TOL = 1e-3  # f32: sharding only reorders the sums (partial matmuls added by the all-reduce)
THREADS_PER_RANK = 1  # CPU threads per rank, tp=1 included: one simulated NeuronCore each


@dataclass
class Experiment:
    """What the notebook's setup resolves: the backend, the degrees run, the prompt and one ``build(tp_degree=)``."""
    bk: Backend
    tp_degrees: list
    model_dir: object
    enc: object
    build: object
    settings: dict
    max_new_tokens: int
    repeats: int

    @property
    def amp(self) -> str:
        return self.settings["amp"]


def setup(backend="reference", neuron_stack=None, device="cpu", model_path=None, seed=0, amp="f32", tp_degree=2,
          tp_degrees=(1, 2, 3), batch_size=1, n_positions=128, prompt="", max_new_tokens=8, repeats=5,
          planner_n_positions=4096, planner_instance="inf2.48xlarge", search_model="Llama-3.1-8B") -> Experiment:
    """Validate the parameters before anything is built (ValueError naming the fix), resolve the backend and the
    degrees to run (tp=1, the oracle, always; on Neuron only the degrees the runtime runs), tokenize the prompt."""
    bk = resolve_backend(backend, neuron_stack, device)
    tps = sorted(set(tp_degrees) | {1, tp_degree})
    if bk.is_neuron:
        tps, left_out = neuron_tp_degrees(tps)
        for tp, why in left_out.items():
            print(f"tp_degree={tp} left out on Neuron: {why}")
    if min(tps) < 1 or max_new_tokens < 2 or repeats < 1 or planner_n_positions < 1:
        raise ValueError("need tp_degrees >= 1, max_new_tokens >= 2, repeats >= 1, planner_n_positions >= 1")
    if search_model not in planner.list_model_configs() or planner_instance not in planner.INSTANCES:
        raise ValueError(f"search_model={search_model!r} / planner_instance={planner_instance!r}: use one of "
                         f"{planner.list_model_configs()} / {list(planner.INSTANCES)}")
    amp_dtype(amp)  # refuses an unknown amp
    torch.manual_seed(seed)
    model_dir = resolve_model_path(model_path)
    enc = encode_prompts(load_tokenizer(model_dir), [prompt], batch_size)
    if enc.input_ids.shape[1] + max_new_tokens > n_positions:
        raise ValueError(f"prompt ({enc.input_ids.shape[1]} tokens) + max_new_tokens > n_positions={n_positions}")
    settings = dict(batch_size=batch_size, n_positions=n_positions, amp=amp)
    print(f"backend: {bk}; tp_degrees {tps}; prompt {enc.input_ids.shape[1]} tokens x batch {batch_size}; {amp}")
    for tp in off_neuron_degrees(tps):
        print(f"tp_degree={tp}: a teaching device of the reference engine, which no Neuron instance runs")
    print("figures measured by", measured_by(bk))
    return Experiment(bk, tps, model_dir, enc, partial(build_model, bk, model_dir, **settings), settings,
                      max_new_tokens, repeats)


# -- section 2: the user's case -----------------------------------------------------------------------------------
def user_case(n_positions=(512, 1024, 2048, 4096, 8192, 16384, 32768)) -> dict:
    """A user's report: Mistral-7B-Instruct-v0.2 in bf16 on one 16 GB inf2 NeuronCore ran out of memory at
    tp_degree=1 (``planner.SEED_000``). The planner's verdict at tp 1 (its refusal message) and tp 2
    (``planner.check`` raises if it does not fit), a table of both against the reported allocation, and the
    memory at tp=1 against ``n_positions`` with and without the runtime reserve."""
    case = planner.SEED_000
    kw = dict(batch_size=case["batch_size"], n_positions=case["n_positions"], amp=case["amp"])
    try:
        planner.check(case["model"], case["instance"], 1, **kw)
        message = None
    except ValueError as err:
        message = str(err)
    tp2 = planner.check(case["model"], case["instance"], 2, **kw)  # raises if tp_degree=2 does not fit either
    tp1 = planner.plan(case["model"], 1, **kw)
    rows = [{"": name, "weights GB": round(p.weight_bytes / planner.GB, 2), "KV GB": round(p.kv_bytes / planner.GB, 2),
             "weights+KV GiB": round(p.total_bytes / planner.GiB, 2),
             "usable GiB/core": round(p.usable_bytes(case["instance"]) / planner.GiB, 2), "fits": p.fits(case["instance"])}
            for name, p in (("planner, tp=1", tp1), ("planner, tp=2", tp2))]
    rows.append({"": "reported by the user, tp=1", "weights+KV GiB": round(case["observed_gb"] * planner.GB / planner.GiB, 2),
                 "fits": False})
    fit = n_positions_fit(case["model"], case["instance"], 1, list(n_positions), batch_size=case["batch_size"],
                          amp=case["amp"])
    return {"case": case, "message": message, "tp1": tp1, "tp2": tp2, "rows": rows, "fit": fit,
            "tp1_fits": message is None, "tp1_fits_without_reserve": tp1.fits(case["instance"], 0.0)}


def report_user_case(uc: dict) -> None:
    print(f"tp_degree=1 refused before any build:\n  {uc['message']}" if uc["message"] else "tp_degree=1 accepted")
    print(format_table(uc["rows"]))
    for r, n in uc["fit"]["largest_fitting"].items():
        print(f"runtime reserve {r:.0%}: {uc['fit']['usable_gib'][r]:.2f} GiB usable per core; tp=1 fits up to "
              f"n_positions={n}")


def plot_user_case(uc: dict):
    """Memory per core at tp=1 against n_positions, the usable memory with and without the reserve, the report."""
    import matplotlib.pyplot as plt

    fit, case = uc["fit"], uc["case"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(fit["n_positions"], fit["gib"], marker="o", label="weights + KV cache per core, tp=1")
    for (r, usable), style in zip(fit["usable_gib"].items(), ("--", ":")):
        ax.axhline(usable, ls=style, color="k", lw=1, label=f"usable per core, reserve {r:.0%}")
        if fit["largest_fitting"][r]:
            ax.axvline(fit["largest_fitting"][r], ls=style, color="tab:green", lw=1)
    ax.scatter([case["n_positions"]], [case["observed_gb"] * planner.GB / planner.GiB], color="tab:red", marker="x",
               zorder=3, label="allocation the user reported (tp=1)")
    ax.set(xscale="log", xlabel="n_positions", ylabel="GiB per NeuronCore")
    ax.set_xticks(fit["n_positions"], [str(n) for n in fit["n_positions"]])
    ax.legend(fontsize=7)
    return ax


# -- section 3: memory per core against tp (the README's figure) ----------------------------------------------------
def plot_memory_per_core(n_positions: int = 4096, models=SHIPPED_MODELS, tps=MEMORY_TPS):
    """Weights + KV cache per core (bf16, batch 1) for the shipped configs against tp, with what one inf2/trn1
    core and one trn2 core (LNC=2) can use after the planner's runtime reserve."""
    import matplotlib.pyplot as plt

    curves = memory_curves(list(models), list(tps), batch_size=1, n_positions=n_positions, amp="bf16")
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, gib in curves.items():
        ax.plot(tps, gib, marker="o", label=name)
    for inst, name, style in (("inf2.xlarge", "inf2/trn1", "--"), ("trn2.48xlarge", "trn2, LNC=2", ":")):
        usable = planner.instance(inst).hbm_per_core_bytes * (1 - planner.RUNTIME_RESERVE) / planner.GiB
        ax.axhline(usable, ls=style, color="k", lw=1, label=f"usable per core, {name} ({usable:.1f} GiB)")
    ax.set(xscale="log", yscale="log", xlabel="tp_degree", ylabel="GiB per NeuronCore")
    ax.set_xticks(list(tps), [str(t) for t in tps])
    ax.legend(fontsize=7)
    return ax


# -- sections 4-6: the runs ----------------------------------------------------------------------------------------
def run_all(ex: Experiment) -> dict:
    """Greedy generation at every degree, ``repeats`` timed runs each (on the reference engine also the logits, what
    each rank holds and the collectives' latency); the library's warnings printed once."""
    if ex.bk.is_neuron:  # tokens and timings from the library's sample() and its stats
        runs = {tp: run_greedy(ex.build, tp, ex.enc, ex.max_new_tokens, ex.repeats) for tp in ex.tp_degrees}
    else:
        runs = {tp: run_greedy(ex.build, tp, ex.enc, ex.max_new_tokens, ex.repeats, measure_collectives=True,
                               threads_per_rank=THREADS_PER_RANK) for tp in ex.tp_degrees}
    for w in sorted({w for r in runs.values() for w in r.get("warnings", [])}):
        print("library warning:", w)
    return runs


def rank_rows(ex: Experiment, runs: dict) -> tuple[list, bool]:
    """Per rank: its heads and the bytes it allocated, beside the planner's count; and whether they all match
    (the embedding left out: transformers-neuronx keeps it on the host). Reference engine only."""
    rows, matches = [], True
    if not reference_only(ex.bk, "it reads the tensors each rank allocated; the Neuron libraries do not expose what a "
                                 "NeuronCore holds (section 3's planner gives the estimate)"):
        return rows, matches
    for tp, r in runs.items():
        p = planner.plan(str(ex.model_dir), tp, **ex.settings)
        for rk in r["ranks"]:
            matches &= (device_weight_bytes(rk), rk["kv_bytes"]) == (p.weight_bytes, p.kv_bytes)
            rows.append({"tp": tp, "rank": rk["rank"], "q heads": rk["q_heads"], "kv heads": rk["kv_heads"],
                         "weights MiB": round(device_weight_bytes(rk) / 2**20, 1),
                         "planner MiB": round(p.weight_bytes / 2**20, 1), "KV MiB": round(rk["kv_bytes"] / 2**20, 2),
                         "KV cache shape": rk["kv_cache_shape"]})
    print(format_table(rows))
    return rows, matches


def parity(ex: Experiment, runs: dict) -> dict:
    """Every degree's greedy tokens (and, on the reference engine, logits) against tp=1's, and tp=1 against Hugging
    Face transformers on the same checkpoint (logits on the reference engine, ``generate()`` tokens on Neuron).
    Prints exactly what was compared."""
    hf = load_hf_model(ex.model_dir, dtype=amp_dtype(ex.amp))
    out = {"hf_diff": None, "hf_agree": None}
    enc = ex.enc
    if ex.bk.is_neuron:
        out["hf_agree"] = token_agreement(runs[1]["tokens"], hf_greedy(hf, enc, ex.max_new_tokens))
        out["parity"] = {tp: token_agreement(r["tokens"], runs[1]["tokens"]) for tp, r in runs.items()}
        print(f"tp=1 vs Hugging Face generate(): {out['hf_agree']['agree_positions']} of "
              f"{out['hf_agree']['compared_positions']} positions agree")
    else:
        pos = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            hf_logits = hf(**enc, position_ids=pos).logits[:, -1].float()
        out["hf_diff"] = float((runs[1]["logits"] - hf_logits).abs().max())
        out["parity"] = {tp: token_agreement(r["tokens"], runs[1]["tokens"], r["logits"], runs[1]["logits"])
                         for tp, r in runs.items()}
        print(f"tp=1 vs Hugging Face: max |logit diff| {out['hf_diff']:.2e}")
    print(format_table([{"tp": tp, **v} for tp, v in out["parity"].items()]))  # agree_positions counts the prompt too
    rows = enc.input_ids.shape[0]
    out["compared"] = (f"{ex.amp}, {rows} row(s) of one prompt ({enc.input_ids.shape[1]} tokens), "
                       f"{ex.max_new_tokens} new tokens, tp {list(runs)} against tp=1")
    print("compared:", out["compared"])
    return out


def check_parity(par: dict, ex: Experiment) -> None:
    """The oracle: tp=1 equals Hugging Face, every degree's greedy tokens equal tp=1's (f32: logits within
    ``LOGIT_TOL`` too); AssertionError otherwise. In bf16/f16 a near-tie can flip a greedy token: reported only."""
    p = par["parity"]
    if ex.amp != "f32":
        print(f"{ex.amp}: tokens agree with tp=1 for", {tp: v["agree_positions"] for tp, v in p.items()},
              "positions (16-bit: reported, not asserted)")
        return
    if ex.bk.is_neuron:
        a = par["hf_agree"]
        assert a["agree_positions"] == a["compared_positions"], f"tp=1 differs from Hugging Face: {a}"
    else:
        assert par["hf_diff"] < LOGIT_TOL, f"tp=1 differs from Hugging Face by {par['hf_diff']}"
        assert all(v["max_logit_diff"] < LOGIT_TOL for v in p.values()), p
    assert all(v["tokens_equal"] for v in p.values()), f"greedy tokens differ from tp=1: {p}"
    print(f"greedy tokens identical to tp=1 at tp {list(p)}"
          + ("" if ex.bk.is_neuron else f"; logits within {LOGIT_TOL}"))


def latency_report(runs: dict, repeats: int) -> dict:
    """Per degree the latency per token with the spread of its repeats (and the collectives' share on the reference
    engine), and against tp=1 a difference only where the ranges of the repeats separate."""
    lat = latency_summary(runs)
    for tp, r in runs.items():
        ttft = f"; first token {Spread(r['ttft_samples_s']).format(1e3, ' ms', 0)}" if r.get("ttft_samples_s") else ""
        comm = f"; collectives ~{lat['comm_ms'][tp]:.1f} ms of it (all-reduce latency x count)" if lat["comm_ms"] else ""
        print(f"tp={tp}: {lat['spread'][tp].format(1e3, ' ms', 1)} per token ({lat['what']}){comm}{ttft}")
    for tp in [t for t in runs if t != 1]:
        c = compare(lat["spread"][tp].samples, lat["spread"][1].samples, f"tp={tp}", "tp=1")
        print(c.verdict if repeats > 1 else f"tp={tp} against tp=1: one run each (repeats=1), no verdict")
    return lat


def plot_latency(runs: dict, lat: dict):
    """Bars: the measured latency per token per degree (median, min-max of the repeats) and, on the reference
    engine, the collectives' estimated share."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    x, teaching, sp = range(len(runs)), off_neuron_degrees(runs), [lat["spread"][t] for t in runs]
    ax.bar([i - 0.2 for i in x], [1e3 * s.median for s in sp], 0.4, label=f"{lat['what']} (measured)", capsize=3,
           yerr=[[1e3 * (s.median - s.low) for s in sp], [1e3 * (s.high - s.median) for s in sp]])
    if lat["comm_ms"]:
        ax.bar([i + 0.2 for i in x], list(lat["comm_ms"].values()), 0.4, label="collectives (all-reduce latency x count)")
    ax.set_xticks(list(x), [f"tp={t}" + ("\n(reference only)" if t in teaching else "") for t in runs])
    ax.set_ylabel("ms per token")
    ax.legend(fontsize=8)
    return ax


# -- section 7: the configuration search ---------------------------------------------------------------------------
def search_both_rules(search_model: str, planner_instance: str) -> dict:
    """optimum-neuron's search with its head rule ("divide") and with padded heads ("pad"), printed: the candidates,
    the valid configurations of the first, and those only the second finds."""
    with tempfile.TemporaryDirectory() as d:
        found = {rule: search(search_model, planner_instance, f"{d}/{rule}.json", amp="bf16", heads=rule,
                              log=lambda *a: None) for rule in ("divide", "pad")}
    for rule, res in found.items():
        print(f"heads={rule!r}, {HEAD_RULES[rule]}:\n  tp candidates {sorted({t['tp_degree'] for t in res['tested']})}, "
              f"{len(res['configurations'])} valid of {len(res['tested'])} predicted")
    print(f"\n{search_model} on {planner_instance}, valid with optimum-neuron's rule:")
    print(format_table(found["divide"]["configurations"]))
    heads = planner.Shape.from_config(planner.load_model_config(search_model)).heads
    tried = {t["tp_degree"] for t in found["divide"]["tested"]}
    found["padded_only"] = [{**c, "zero heads added": padded_heads(heads, c["tensor_parallel_size"])}
                            for c in found["pad"]["configurations"] if c["tensor_parallel_size"] not in tried]
    print("\nvalid only with padded heads (transformers-neuronx / NxD Inference build them; optimum-neuron's rule "
          "drops them):")
    print(format_table(found["padded_only"]))
    return found


# -- metrics --------------------------------------------------------------------------------------------------------
def record(metrics_path, ex: Experiment, uc: dict, runs: dict, planner_matches: bool, par: dict, lat: dict,
           found: dict) -> dict:
    """The key figures (``ci/baselines/cpu.json`` checks them) to ``metrics_path``."""
    p, case = par["parity"], uc["case"]
    m = {"seed000_tp1_fits": uc["tp1_fits"], "seed000_tp2_fits": uc["tp2"].fits(case["instance"]),
         "seed000_planner_gb": uc["tp1"].total_bytes / planner.GB, "seed000_observed_gb": case["observed_gb"],
         "seed000_tp1_fits_without_reserve": uc["tp1_fits_without_reserve"],
         "seed000_tp1_largest_fitting_n_positions": uc["fit"]["largest_fitting"][planner.RUNTIME_RESERVE],
         "amp": ex.amp, "batch_size": ex.settings["batch_size"], "tp_degrees": ",".join(map(str, runs)),
         "reference_only_tp_degrees": ",".join(map(str, off_neuron_degrees(runs))),
         "search_valid_configs": len(found["divide"]["configurations"]),
         "search_padded_only_degrees": ",".join(map(str, sorted({c["tensor_parallel_size"] for c in found["padded_only"]}))),
         "measured_by": measured_by(ex.bk), "all_tokens_equal": all(v["tokens_equal"] for v in p.values())}
    if ex.bk.is_neuron:
        m.update(hf_agree_positions=par["hf_agree"]["agree_positions"],
                 hf_compared_positions=par["hf_agree"]["compared_positions"])
    else:
        m.update(planner_matches_engine=bool(planner_matches), hf_max_logit_diff=par["hf_diff"],
                 max_logit_diff=max(v["max_logit_diff"] for v in p.values()))
    for tp, r in runs.items():
        m.update({f"tp{tp}_tokens_equal": p[tp]["tokens_equal"], f"tp{tp}_{lat['key']}": lat["ms"][tp],
                  f"tp{tp}_{lat['key'][:-3]}_vs_tp1": lat["ms"][tp] / lat["ms"][1]})
        if not ex.bk.is_neuron:
            m.update({f"tp{tp}_max_logit_diff": p[tp]["max_logit_diff"],
                      f"tp{tp}_max_rank_weight_mib": max(device_weight_bytes(k) for k in r["ranks"]) / 2**20})
    return write_metrics(metrics_path, m)
