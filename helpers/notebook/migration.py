"""Notebook 11 (from transformers-neuronx to NxD Inference) behind one call per step: the setup, the Hugging Face
oracle, the migrated settings run on both bucket rules, what each stack compiles and holds per core (printed and
plotted), the GQA strategy each stack names, the check of the recipe cells' tokens, and the metrics.

The mapping and the planners live in :mod:`helpers.neuron.migration` (generated from
:func:`helpers.neuron.settings.neuron_settings`); this module arranges them for the lesson.
"""
from __future__ import annotations

from dataclasses import dataclass, field


from ..engine.config import NeuronConfig
from ..model_store import load_hf_model, load_tokenizer
from ..neuron.migration import bucket_plan, greedy_agreement, memory_plan, reference_nxdi_settings
from ..neuron.settings import neuron_settings
from ..planning.dtypes import amp_dtype
from ..planning.memory import GiB, instance
from ..prompts import hf_greedy
from .backend import start
from .build import build_model
from .figures import titled
from .metrics import write_metrics
from .provenance import measured_by
from .sharding import format_table, strategy_table


@dataclass
class MigrationRun:
    """The backend, the model, the prompts (left-padded, as transformers-neuronx takes them) and the
    transformers-neuronx settings every step maps, builds or plans."""
    bk: object
    model_dir: object
    tok: object
    rows: list
    enc: object
    settings: dict
    amp: str
    max_new_tokens: int
    oracle: list = field(default_factory=list)
    hf: object = field(default=None, repr=False)

    @property
    def prompt_len(self) -> int:
        return self.enc.input_ids.shape[1]

    @property
    def eos_ids(self) -> list:
        return [self.tok.eos_token_id]


def setup(backend="reference", neuron_stack=None, device="cpu", model_path=None, seed=0, amp="f32", batch_size=2,
          n_positions=256, context_length_estimate=(64, 128), tp_degree=1, fuse_qkv=True,
          prompts=("The capital of France is", "Name three uses of a paperclip:"), max_new_tokens=16):
    """Validate the parameters (raises, naming the fix), resolve backend and model, encode the rows, print what runs."""
    if batch_size < 1 or max_new_tokens < 1 or tp_degree < 1 or not prompts:
        raise ValueError("batch_size, tp_degree, max_new_tokens: 1 or more; prompts: at least one")
    bk, model_dir = start(backend, neuron_stack, device, seed, model_path)
    tok = load_tokenizer(model_dir)  # left padding, as transformers-neuronx takes it
    rows = [prompts[i % len(prompts)] for i in range(batch_size)]
    cle = list(context_length_estimate) if isinstance(context_length_estimate, (list, tuple)) else context_length_estimate
    settings = dict(batch_size=batch_size, n_positions=n_positions, context_length_estimate=cle,
                    tp_degree=tp_degree, amp=amp, neuron_config=NeuronConfig(fuse_qkv=fuse_qkv))
    run = MigrationRun(bk=bk, model_dir=model_dir, tok=tok, rows=rows,
                       enc=tok(rows, return_tensors="pt", padding=True), settings=settings, amp=amp,
                       max_new_tokens=max_new_tokens)
    print(f"backend: {bk}; {batch_size} rows of up to {run.prompt_len} prompt tokens; generating {max_new_tokens}")
    print("figures measured by", measured_by(bk))
    return run


def hf_oracle(run: MigrationRun) -> list:
    """Hugging Face ``generate()`` (greedy) on each prompt alone (no padding): the oracle's new tokens, kept on
    ``run`` and printed."""
    run.hf = load_hf_model(run.model_dir, dtype=amp_dtype(run.amp))
    run.oracle = []
    for p in run.rows:
        one = run.tok([p], return_tensors="pt")
        run.oracle.append(hf_greedy(run.hf, one, run.max_new_tokens)[0, one.input_ids.shape[1]:])
    print("Hugging Face:", [run.tok.decode(o, skip_special_tokens=True) for o in run.oracle])
    return run.oracle


def migrate(run: MigrationRun) -> tuple[dict, dict]:
    """Build the model from the transformers-neuronx settings and from the NxD Inference keywords
    ``neuron_settings("nxdi", ...)`` maps them to, generate greedily, and compare each row with the oracle.
    On the reference backend both run on the helpers reference engine (each with its library's bucket rule); on
    Neuron the installed library builds the one path of its stack. Prints what ran each path."""
    if run.bk.is_neuron:
        paths = {run.bk.stack: dict(run.settings)}
    else:
        nxdi_keywords = neuron_settings("nxdi", **run.settings).neuron_config
        paths = {"tnx-style": dict(run.settings), "nxdi-style": reference_nxdi_settings(nxdi_keywords)}
    built, agreement = {}, {}
    for name, kw in paths.items():
        built[name] = build_model(run.bk, run.model_dir, **kw)
        out = built[name].sample(run.enc.input_ids, run.prompt_len + run.max_new_tokens, top_k=1,
                                 attention_mask=run.enc.attention_mask)
        agreement[name] = greedy_agreement(out[:, run.prompt_len:], run.oracle, run.eos_ids)
        print(f"{name}, run by {measured_by(run.bk)}: {agreement[name]}\n"
              f"   {run.tok.decode(out[0, run.prompt_len:], skip_special_tokens=True)!r}")
    return built, agreement


def gqa_names(models=("embedded", "Llama-3.1-8B"), tp_degrees=(1, 2, 4, 8)) -> list[dict]:
    """Print each stack's default GQA strategy and KV heads per core (``helpers.planning.gqa``, the libraries'
    rules) for ``models`` at ``tp_degrees``: where NxD Inference says CONVERT_TO_MHA and where it really replicates."""
    rows = strategy_table(models, tp_degrees, (1,))
    print("in brackets: KV heads in each core's cache")
    print(format_table(rows, ["model", "heads/kv", "tp", "tnx:default", "nxdi:default"]))
    return rows


def plan_port(run: MigrationRun, built: dict, planner_model: str, planner_tp_degrees, planner_n_positions) -> dict:
    """What each stack compiles (graphs, longest one-pass prompt) for each ``n_positions``, and holds per core
    (weights, KV heads and bytes, the strategy) for ``planner_model`` in bf16 at each tp; on the reference backend,
    raises unless the models built by :func:`migrate` use exactly the planned buckets."""
    plan_here = bucket_plan(run.settings["n_positions"], run.settings["context_length_estimate"])
    buckets = {n: bucket_plan(n) for n in planner_n_positions}
    for n, p in buckets.items():
        print(n, {k: (v["graphs"], v["longest_prompt"]) for k, v in p.items()}, "(graphs, longest one-pass prompt)")
    if not run.bk.is_neuron:  # the reference models built above use exactly the planned buckets
        assert built["tnx-style"].context_buckets == plan_here["tnx"]["context_buckets"]
        assert built["nxdi-style"].context_buckets == plan_here["nxdi migrated"]["context_buckets"]
        assert built["nxdi-style"].token_buckets == plan_here["nxdi migrated"]["token_buckets"]
    mem = memory_plan(planner_model, planner_tp_degrees, n_positions=max(planner_n_positions), amp="bf16")
    print(f"\n{planner_model}, bf16, {max(planner_n_positions)} positions, per core (planned):")
    print(format_table([{"tp": r["tp"], "library": r["library"], "strategy": r["strategy"] or r["error"],
                         "KV heads/core": r["kv_heads_per_core"], "KV GiB": round(r["kv_bytes"] / GiB, 2),
                         "weights GiB": round(r["weight_bytes"] / GiB, 2),
                         "of which embedding GiB": round(r["embedding_bytes"] / GiB, 2),
                         "fits an inf2 core": r["fits"]} for r in mem]))
    return {"here": plan_here, "buckets": buckets, "mem": mem, "model": planner_model,
            "tp_degrees": list(planner_tp_degrees), "n_positions": list(planner_n_positions)}


def plot_port(plan: dict, bk) -> None:
    """Graphs compiled and the longest one-pass prompt per ``n_positions`` (each stack's buckets), and GiB per
    core per tp against an inf2 core's HBM, from :func:`plan_port`."""
    import matplotlib.pyplot as plt

    ns, b, mem = plan["n_positions"], plan["buckets"], plan["mem"]
    fig, (a1, a0, a2) = plt.subplots(1, 3, figsize=(14, 3.8))
    for name, style in (("tnx", "o-"), ("nxdi migrated", "s--"), ("nxdi naive", "x:")):
        a1.plot(ns, [b[n][name]["graphs"] for n in ns], style, label=name)
        a0.plot(ns, [b[n][name]["longest_prompt"] for n in ns], style, label=name)
    for a, what in ((a1, "graphs compiled"), (a0, "longest prompt in one context pass")):
        a.set(xscale="log", xlabel="n_positions (seq_len)", ylabel=what, title=what.capitalize())
        a.set_xticks(ns, [str(n) for n in ns])
        a.minorticks_off()
        a.legend()
    a0.set_yscale("log")
    for lib, style in (("tnx", "o-"), ("nxdi", "s--")):
        pts = [r for r in mem if r["library"] == lib and r["error"] is None]
        a2.plot([r["tp"] for r in pts], [r["total_bytes"] / GiB for r in pts], style, label=lib)
    a2.axhline(instance("inf2.xlarge").hbm_per_core_bytes / GiB, color="grey", ls=":", label="inf2 core HBM")
    a2.axhline(mem[0]["usable_bytes"] / GiB, color="tab:red", ls=":", label="less the runtime reserve")
    a2.set(xscale="log", xlabel="tp_degree", ylabel="GiB per core", title=f"{plan['model']}, bf16, {max(ns)} positions")
    a2.set_xticks(plan["tp_degrees"], [str(t) for t in plan["tp_degrees"]])
    a2.minorticks_off()
    a2.legend()
    titled(fig, f"What each stack builds for the same settings (notebook backend: {bk})",
           source="planned by helpers.planning from the model configs (not measured)")
    plt.tight_layout()
    plt.show()


def check_recipe_cells(run: MigrationRun, namespace: dict) -> dict:
    """The tokens of whichever recipe cell ran here (``tnx_new_tokens`` / ``nxdi_new_tokens`` in ``namespace``),
    each row against Hugging Face ``generate()`` on the cell's own prompt alone; raises when they differ in f32.
    Prints which cells ran, or that none did."""
    ran = {name: namespace[var] for name, var in (("tnx", "tnx_new_tokens"), ("nxdi", "nxdi_new_tokens"))
           if var in namespace}
    out = {}
    for name, new in ran.items():
        refs = [hf_greedy(run.hf, one, new.shape[1])[0, one.input_ids.shape[1]:]
                for one in (run.tok([p], return_tensors="pt") for p in namespace["prompts"])]
        out[name] = greedy_agreement(new, refs, run.eos_ids)
        print(f"{name} recipe cell vs Hugging Face: {out[name]}")
        if namespace.get("amp", "f32") == "f32" and namespace.get("torch_dtype", "float32") == "float32":
            assert out[name]["identical"], f"the {name} recipe cell's greedy tokens differ from Hugging Face"
    if not ran:
        print(f"No recipe cell ran here (backend {run.bk}: neither library is installed); section 3 ran the same "
              "settings on the reference engine only")
    return out


def write_migration_metrics(path, run: MigrationRun, mapping, agreement: dict, plan: dict, recipe: dict) -> dict:
    """The key figures of notebook 11 (the keys ci/baselines/cpu.json checks), written to ``path``."""
    default_plan = plan["buckets"][max(plan["n_positions"])]
    mem = plan["mem"]
    tp_fit = {lib: min((r["tp"] for r in mem if r["library"] == lib and r["fits"]), default=None)
              for lib in ("tnx", "nxdi")}
    return write_metrics(path, {
        "mapping_rows": len(mapping), "nxdi_refused_rows": sum(r.nxdi.startswith("none") for r in mapping),
        "paths_identical_to_hf": all(a["identical"] for a in agreement.values()), "paths": sorted(agreement),
        "hf_agreement": {k: sum(a["agree"]) for k, a in agreement.items()},
        "hf_compared": {k: sum(a["compared"]) for k, a in agreement.items()},
        "graphs_tnx": default_plan["tnx"]["graphs"], "graphs_nxdi_migrated": default_plan["nxdi migrated"]["graphs"],
        "graphs_nxdi_naive": default_plan["nxdi naive"]["graphs"],
        "smallest_fitting_tp_tnx": tp_fit["tnx"], "smallest_fitting_tp_nxdi": tp_fit["nxdi"],
        "recipe_cells_ran": sorted(recipe), "planner_model": plan["model"], "amp": run.amp,
        "measured_by": measured_by(run.bk)})
