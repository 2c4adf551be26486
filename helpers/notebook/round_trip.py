"""The experiment of notebook 08 (compile once, save, load without compiling) behind one call per step: the
parameters checked, the cold build's report, what a save wrote, the warm loads timed (from the presharded weights
and from the original checkpoint, interleaved), the cold build against the warm loads, the plot, the refusals of a
directory built for other settings, the load after a move, the same round trip on a Neuron library, and the metrics.
"""
from __future__ import annotations

import json
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..artifacts import graphs as gr
from ..engine.config import NeuronConfig
from ..model_store import load_tokenizer
from ..planning.buckets import tnx_context_buckets, tnx_token_buckets
from ..prompts import encode_prompts
from .backend import start
from .build import build_model, load_model
from .evaluate import describe_difference
from .figures import OneRunComparison, Spread, compare, compare_one, timing_entries, timing_metric, titled
from .metrics import write_metrics
from .provenance import measured_by


@dataclass
class Case:
    """What the notebook's cells share: the backend, the checkpoint, the prompt, the build settings."""

    bk: object
    model_dir: str
    enc: object
    settings: dict
    token_buckets: list[int]
    context_buckets: list[int]
    max_new_tokens: int

    @property
    def seq_len(self) -> int:
        return self.enc.input_ids.shape[1] + self.max_new_tokens

    def greedy(self, model, logits: bool = False):
        """The model's greedy tokens for the prompt (and its logits, on the reference engine)."""
        out = model.sample(self.enc.input_ids, self.seq_len, top_k=1, attention_mask=self.enc.attention_mask,
                           output_logits=logits)
        return (out, model.stats["logits"]) if logits else out


def setup(backend="reference", neuron_stack=None, device="cpu", seed=0, model_path=None, amp="f32", batch_size=1,
          n_positions=256, context_length_estimate=None, tp_degree=1, artifact="aoti", prompt="",
          max_new_tokens=32, warm_repeats=3) -> Case:
    """The parameters checked (the artifact kind, ``warm_repeats`` >= 2 so the warm loads have a spread, the prompt
    and its new tokens within the largest bucket), the backend resolved, the prompt tokenized as a full batch."""
    if artifact not in gr.ARTIFACTS:
        raise ValueError(f"artifact={artifact!r}: use one of {gr.ARTIFACTS}")
    if warm_repeats < 2:
        raise ValueError(f"warm_repeats={warm_repeats}: 2 or more (the cold build is compared with their spread)")
    bk, model_dir = start(backend, neuron_stack, device, seed, model_path)
    enc = encode_prompts(load_tokenizer(model_dir), [prompt], batch_size)
    token_buckets = tnx_token_buckets(n_positions)
    context_buckets = tnx_context_buckets(context_length_estimate, token_buckets)
    case = Case(bk, str(model_dir), enc, dict(batch_size=batch_size, n_positions=n_positions, tp_degree=tp_degree,
                                              context_length_estimate=context_length_estimate, amp=amp),
                token_buckets, context_buckets, max_new_tokens)
    if case.seq_len > token_buckets[-1]:
        raise ValueError(f"prompt ({enc.input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) > n_positions "
                         f"{token_buckets[-1]}")
    print(f"backend: {bk}; buckets: context {context_buckets}, token {token_buckets}; artifact {artifact}")
    print("figures measured by", measured_by(bk))
    return case


def print_build_report(model, cold_s: float) -> float:
    """Print each graph's compile seconds (each rank's too, with tp_degree > 1) and the cold build's total; returns
    the seconds spent compiling graphs."""
    for r in model.build_report:
        per_rank = "  ".join(f"{s:6.2f}" for s in r.get("rank_seconds", []))
        print(f"  {r['graph']:16s} {r['seconds']:6.2f} s" + (f"   per rank: {per_rank}" if per_rank else ""))
    graphs_s = sum(r["seconds"] for r in model.build_report)
    print(f"cold build: {cold_s:.1f} s, of which {graphs_s:.1f} s compiling {len(model.build_report)} graphs")
    return graphs_s


@dataclass
class Saved:
    directory: Path
    seconds: float
    manifest: dict       # rank 0's graphs-rank0.json
    graph_bytes: int
    weight_bytes: int


def describe_save(directory, info: dict, tp_degree: int, seconds: float) -> Saved:
    """What ``model.save`` wrote: every rank's graph files and sizes, the presharded weights' size, the fingerprinted
    fields (printed)."""
    directory = Path(directory)
    manifests = [json.loads((directory / f"graphs-rank{r}.json").read_text()) for r in range(tp_degree)]
    graph_bytes = sum(e["bytes"] for m in manifests for e in m["graphs"])
    saved = Saved(directory, seconds, manifests[0], graph_bytes, info["bytes"] - graph_bytes)
    for e in (e for m in manifests for e in m["graphs"]):
        print(f"  {e['file']:56s} {e['bytes'] / 1e6:7.2f} MB")
    print(f"saved in {seconds:.1f} s: graphs {graph_bytes / 1e6:.1f} MB, presharded weights "
          f"{saved.weight_bytes / 1e6:.1f} MB")
    print("fingerprinted fields:", json.dumps(saved.manifest["fields"], indent=1))
    return saved


SOURCES = {"presharded": "presharded weights", "checkpoint": "original checkpoint"}


@dataclass
class WarmLoads:
    """Seconds of each warm load, per weight source ("presharded": the saved folder; "checkpoint": the original
    checkpoint, fused, cast and sharded as it loads), and the seconds of their graph loads; the last model loaded."""

    seconds: dict[str, list[float]]
    graph_seconds: dict[str, list[float]]
    model: object

    def spread(self, source: str) -> Spread:
        return Spread(self.seconds[source])


def warm_loads(case: Case, save_dir, sharded_weights: bool, repeats: int) -> WarmLoads:
    """``repeats`` rounds of fresh-model loads of the saved graphs (``helpers.load_model``: ``from_pretrained``,
    ``load(dir)``, ``to_neuron()``); with presharded weights each round loads once from them and once from the
    original checkpoint, in turn, so that load on a shared machine hits both alike. Raises AssertionError if a graph
    was compiled instead of loaded. The last presharded model (else checkpoint) is kept."""
    sources = {"presharded": save_dir, "checkpoint": case.model_dir} if sharded_weights else \
        {"checkpoint": case.model_dir}
    seconds = {s: [] for s in sources}
    graphs = {s: [] for s in sources}
    model = None
    for _ in range(repeats):
        for source, weights_from in reversed(sources.items()):  # the kept model (presharded) loads last
            model = None
            t0 = time.perf_counter()
            model = load_model(case.bk, weights_from, save_dir, **case.settings,
                               neuron_config=NeuronConfig(on_device_embedding=sharded_weights))
            seconds[source].append(time.perf_counter() - t0)
            graphs[source].append(sum(r["seconds"] for r in model.build_report))
            assert all(r.get("loaded") for r in model.build_report), f"a graph was compiled instead of loaded ({source})"
    loads = WarmLoads(seconds, graphs, model)
    for source in sources:
        print(f"warm load, weights from the {SOURCES[source]}: {loads.spread(source).format(1, ' s')}; of which graphs "
              f"{Spread(graphs[source]).format(1, ' s')}")
    return loads


def cold_against_warm(cold_s: float, loads: WarmLoads) -> OneRunComparison:
    """The one cold build against the warm loads of the run's own weight source (presharded where saved)."""
    source = "presharded" if "presharded" in loads.seconds else "checkpoint"
    cmp = compare_one(cold_s, loads.seconds[source], "cold build", "warm load")
    print(f"cold build {cold_s:.1f} s; warm load {cmp.b.format(1, ' s')}; cold / warm, medians: {cmp.ratio:.1f}: "
          f"{cmp.verdict}")
    return cmp


def presharded_against_checkpoint(loads: WarmLoads):
    """Warm loads from the presharded weights against loads from the original checkpoint (None without presharded
    weights); prints the verdict."""
    if "presharded" not in loads.seconds:
        print("no presharded weights saved (sharded_weights=False): every warm load reads the original checkpoint")
        return None
    cmp = compare(loads.seconds["presharded"], loads.seconds["checkpoint"], "presharded weights", "checkpoint")
    print(f"{cmp.name_a}: {cmp.a.format(1, ' s')}; {cmp.name_b}: {cmp.b.format(1, ' s')}; ratio of medians "
          f"{cmp.ratio:.2f}: {cmp.verdict}")
    return cmp


def plot_round_trip(case: Case, cold_s: float, cold_graphs_s: float, saved: Saved, loads: WarmLoads,
                    artifact: str):
    """Time (the cold build, the save, each warm load source as median with min-max, split into weights and graphs)
    and size on disk (graphs, presharded weights)."""
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.5, 3.6), layout="constrained")
    names = ["cold build"] + [f"warm ({s})" for s in loads.seconds]
    totals = [cold_s] + [loads.spread(s).median for s in loads.seconds]
    graphs = [cold_graphs_s] + [Spread(loads.graph_seconds[s]).median for s in loads.seconds]
    a1.bar(names, [t - g for t, g in zip(totals, graphs)], label="weights and the rest")
    a1.bar(names, graphs, bottom=[t - g for t, g in zip(totals, graphs)], label=f"graphs ({artifact})")
    for name, s in zip(names[1:], loads.seconds):
        sp = loads.spread(s)
        a1.errorbar([name], [sp.median], yerr=[[sp.median - sp.low], [sp.high - sp.median]], fmt="none",
                    ecolor="black", capsize=4)
    a1.bar(["save"], [saved.seconds], color="grey")
    n = len(next(iter(loads.seconds.values())))
    a1.set(ylabel="seconds")
    a1.set_title(f"Time (cold: one build; warm: median, min-max of {n})", fontsize=9)
    a1.tick_params(axis="x", rotation=15, labelsize=8)
    a1.legend(fontsize=8)
    a2.bar(["graphs", "presharded weights"], [saved.graph_bytes / 1e6, saved.weight_bytes / 1e6])
    a2.set(ylabel="MB")
    a2.set_title("Size on disk", fontsize=9)
    titled(fig, "Cold build, save, warm load and size on disk", case.bk)
    plt.show()
    return fig


def refusal(make) -> str:
    """The error a load raises for a directory built for other settings, or AssertionError if it was accepted."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # GQA fallback warnings of the other tp degree's layout
            make()
    except (gr.ArtifactMismatchError, gr.CorruptArtifactError) as e:
        return f"{type(e).__name__}: {e}"
    raise AssertionError("the directory was accepted")


def refusals(case: Case, saved: Saved) -> dict[str, str]:
    """Four loads the saved directory must refuse (other buckets, another dtype, another tp degree, a corrupted
    graph file), each with the error it raised; raises AssertionError where one is accepted."""
    s = case.settings
    other_buckets = dict(s, context_length_estimate=[max(1, case.context_buckets[-1] // 2)])
    other_amp = dict(s, amp="bf16" if s["amp"] != "bf16" else "f32")
    other_tp = dict(s, tp_degree=1 if s["tp_degree"] > 1 else 2)
    corrupt = saved.directory.with_name(saved.directory.name + "-corrupt")  # a copy of the graphs (not the weights)
    shutil.rmtree(corrupt, ignore_errors=True)
    shutil.copytree(saved.directory, corrupt, ignore=shutil.ignore_patterns("weights", "config.json"))
    victim = corrupt / saved.manifest["graphs"][0]["file"]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    victim.write_bytes(bytes(data))
    try:
        return {
            "other buckets": refusal(lambda: load_model(case.bk, case.model_dir, saved.directory, **other_buckets)),
            "other dtype": refusal(lambda: load_model(case.bk, case.model_dir, saved.directory, **other_amp)),
            "other tp degree": refusal(lambda: load_model(case.bk, case.model_dir, saved.directory, **other_tp)),
            "corrupted file": refusal(lambda: load_model(case.bk, case.model_dir, corrupt, **s)),
        }
    finally:
        shutil.rmtree(corrupt)


def generates_after_move(case: Case, saved: Saved, sharded_weights: bool, expected) -> bool:
    """Rename the saved directory, load from its new path, generate, rename it back: True when the tokens equal
    ``expected`` (the fingerprints hold no path)."""
    moved = saved.directory.with_name(saved.directory.name + "-moved")
    shutil.rmtree(moved, ignore_errors=True)
    saved.directory.rename(moved)
    try:
        model = load_model(case.bk, moved if sharded_weights else case.model_dir, moved, **case.settings,
                           neuron_config=NeuronConfig(on_device_embedding=sharded_weights))
        out = case.greedy(model)
    finally:
        moved.rename(saved.directory)
    same = torch.equal(out, expected)
    print("loaded after moving the directory, identical output:", same,
          "" if same else "(" + describe_difference(expected, out) + ")")
    return same


def neuron_round_trip(case: Case, compiled_dir, repeats: int) -> dict:
    """On a Neuron backend, the library's own compile + save into a fresh folder, then ``repeats`` warm loads from
    it (``helpers.build_model(..., compiled_dir=...)``), each timed and generating; plots and prints the cold build
    against the warm loads. Returns the figures (``cold`` is the comparison) and whether every reload generated the
    cold model's tokens."""
    import matplotlib.pyplot as plt

    fresh = Path(compiled_dir) / f"{case.bk.stack}-measured"
    shutil.rmtree(fresh, ignore_errors=True)
    runs = []  # cold: compile and save into fresh; then warm: load what the cold build saved
    for _ in range(1 + repeats):
        t0 = time.perf_counter()
        model = build_model(case.bk, case.model_dir, compiled_dir=str(fresh), **case.settings)
        runs.append((time.perf_counter() - t0, case.greedy(model)))
        del model
    cold = compare_one(runs[0][0], [s for s, _ in runs[1:]], "cold build", "warm load")
    fig, ax = plt.subplots(figsize=(5, 3), layout="constrained")
    ax.bar(["cold build", "warm load"], [cold.a.median, cold.b.median],
           yerr=[[0, cold.b.median - cold.b.low], [0, cold.b.high - cold.b.median]], capsize=4)
    ax.set(ylabel="seconds")
    titled(ax, f"{case.bk.stack}: save once, load without compiling (warm: min-max)", case.bk)
    plt.show()
    print(cold, "| measured by", measured_by(case.bk))
    differ = [describe_difference(runs[0][1], out) for _, out in runs[1:] if not torch.equal(runs[0][1], out)]
    return {"cold": cold, "cold_build_s": cold.a.median, "warm_load_s": cold.b.median,
            "roundtrip_identical": not differ, "differences": differ}


def reference_figures(artifact: str, cold_s: float, cold_graphs_s: float, saved: Saved, loads: WarmLoads,
                      roundtrip_identical: bool, refused: dict, relocated_identical: bool, preshard) -> dict:
    """The reference engine's figures of sections 1-5, for :func:`write_round_trip_metrics`."""
    source = "presharded" if "presharded" in loads.seconds else "checkpoint"
    warm = loads.spread(source)
    out = {"artifact": artifact, "graphs": len(saved.manifest["graphs"]), "cold_build_s": cold_s,
           "cold_compile_graphs_s": cold_graphs_s, "save_s": saved.seconds, "warm_load_s": warm.median,
           "warm_load_min_s": warm.low, "warm_load_max_s": warm.high,
           "warm_load_graphs_s": Spread(loads.graph_seconds[source]).median, "graph_bytes": saved.graph_bytes,
           "weight_bytes": saved.weight_bytes, "roundtrip_identical": bool(roundtrip_identical),
           "refusals": len(refused), "relocated_identical": bool(relocated_identical)}
    if preshard is not None:
        out.update(presharded_load_s=preshard.a.median, checkpoint_load_s=preshard.b.median,
                   presharded_vs_checkpoint=preshard.verdict, presharded_vs_checkpoint_measurable=preshard.measurable)
    return out


def write_round_trip_metrics(metrics_path, case: Case, cold: OneRunComparison, figures: dict,
                             sharded_weights: bool) -> dict:
    """The key figures to ``metrics_path`` (those ci/baselines/cpu.json checks among them): ``figures`` (from
    :func:`reference_figures` or :func:`neuron_round_trip`), the cold build over the warm load (a timing claim: None
    where the warm loads spread too far), whether the two are measurably apart and the verdict, the settings."""
    metrics = {k: v for k, v in figures.items() if k not in ("cold", "differences")}
    metrics.update(timing_entries("cold_over_warm", timing_metric(cold, cold.ratio, max_width=0.5)),
                   cold_over_warm_measurable=cold.measurable, cold_over_warm_verdict=cold.verdict)
    metrics.update(sharded_weights=sharded_weights, batch_size=case.settings["batch_size"],
                   tp_degree=case.settings["tp_degree"], measured_by=measured_by(case.bk))
    if case.bk.is_neuron:
        metrics["stack"] = case.bk.stack
    return write_metrics(metrics_path, metrics)
