"""The experiment of notebook 06 (int8 weight storage) behind one call per step: the parameters checked, the models
built (unquantized, and one per int8 mode), each measured (weight bytes, perplexity, teacher-forced greedy agreement,
decode speed in interleaved rounds), which mode to choose and why, the speed verdicts, the plot, the oracle checks
and the metrics.

On ``backend="neuron"`` the library builds each int8 mode of its stack (:func:`helpers.neuron.neuron_quant_settings`)
and only the agreement (through ``sample()``) and the decode speed are measured: perplexity and weight bytes need the
reference engine's logits and tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..engine.quant import NXDI_METHODS, QuantizationConfig, quantized_weight_bytes
from ..engine.config import NeuronConfig
from ..model_store import load_tokenizer
from ..neuron import NEURON_QUANT_MODES, neuron_quant_settings
from ..planning.buckets import nxdi_context_buckets, tnx_token_buckets
from ..planning.dtypes import amp_dtype
from ..prompts import encode_prompts
from .backend import start
from .build import build_model
from .evaluate import eval_text, interleaved_decode_seconds, perplexity, sampled_agreement, teacher_forced_agreement
from .figures import Comparison, Spread, compare, titled
from .metrics import write_metrics
from .provenance import measured_by

# The bounds section 5 of the notebook asserts (its markdown quotes them): per-channel scales keep perplexity within
# 5% and agreement above 90%; one scale per tensor must agree on most tokens.
PER_CHANNEL_PPL_RATIO, PER_CHANNEL_AGREEMENT, PER_TENSOR_AGREEMENT = 1.05, 0.9, 0.5
NXDI_DEFAULT_TYPE = "per_tensor_symmetric"  # NxD Inference 0.8's NeuronConfig default quantization_type


def quant_config(method: str, amp: str, quantized_dir) -> QuantizationConfig:
    """int8 with ``method``'s scales, dequantized to ``amp``; NxD Inference's types read a quantized checkpoint
    (its ``NeuronConfig`` requires ``quantized_checkpoints_path`` whenever ``quantized=True``)."""
    path = f"{quantized_dir}/{method}" if method in NXDI_METHODS else None
    return QuantizationConfig(quant_dtype="s8", dequant_dtype=amp, quantize_method=method,
                              quantized_checkpoints_path=path)


@dataclass
class Int8Run:
    """What the notebook's cells share: the backend, the checkpoint, the evaluation text and prompts, one
    ``QuantizationConfig`` per mode, the modes this backend runs, and (after :meth:`measure`) the figures."""

    bk: object
    model_dir: str
    text_ids: torch.Tensor
    encs: list
    lens: list[int]
    configs: dict[str, QuantizationConfig]
    run_modes: list[str]
    amp: str
    n_positions: int
    max_new_tokens: int
    repeats: int
    quantized_dir: str
    models: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    decode_s: dict = field(default_factory=dict)
    speed: dict = field(default_factory=dict)

    @property
    def agreement_tokens(self) -> int:
        return len(self.encs) * self.max_new_tokens

    def build(self, method: str | None = None):
        """The unquantized model (``method=None``) or the model in int8 ``method``, on this backend."""
        bk = self.bk
        if bk.is_neuron:  # the library, in its stack's int8 mode
            kw = neuron_quant_settings(bk.stack, method, self.amp, self.quantized_dir) if method else {}
            if bk.stack == "nxdi":  # context buckets that hold every prefix sampled_agreement feeds (notebook 07)
                kw["context_length_estimate"] = nxdi_context_buckets(
                    None, tnx_token_buckets(self.n_positions), max(self.lens) + self.max_new_tokens)
            return build_model(bk, self.model_dir, batch_size=1, n_positions=self.n_positions, amp=self.amp, **kw)
        quant = self.configs[method] if method else None
        return build_model(bk, self.model_dir, n_positions=self.n_positions, amp=self.amp,
                           neuron_config=NeuronConfig(quant=quant))

    def measure(self) -> dict:
        """Build every model first, then measure each: weight bytes and the quantized projections' share of their
        unquantized bytes, perplexity on the shipped text, teacher-forced greedy agreement with the unquantized
        model's greedy continuation of each prompt; then decode seconds per token, ``repeats`` interleaved rounds
        (:func:`interleaved_decode_seconds`). Prints one row per model; returns ``results``."""
        self.models = {"unquantized": self.build(), **{m: self.build(m) for m in self.run_modes}}
        refs = [self.models["unquantized"].sample(e.input_ids, e.input_ids.shape[1] + self.max_new_tokens, top_k=1,
                                                  eos_token_override=[]) for e in self.encs]
        for name, model in self.models.items():
            if self.bk.is_neuron:  # no logits, no tensors: agreement through sample()
                self.results[name] = {"agreement": sampled_agreement(model, refs, self.lens)}
                continue
            stored, full = quantized_weight_bytes(model.model)
            self.results[name] = {"weight_mb": model.weight_bytes / 1e6, "proj_ratio": stored / full if full else 1.0,
                                  "ppl": perplexity(model, self.text_ids),
                                  "agreement": teacher_forced_agreement(model, refs, self.lens)}
        self.decode_s = interleaved_decode_seconds(self.models, self.encs[0].input_ids, self.max_new_tokens,
                                                   self.repeats)
        base = self.results["unquantized"].get("ppl")
        for name, r in self.results.items():
            if base is not None:
                r["ppl_delta_pct"] = 100 * (r["ppl"] / base - 1)
            r["tok_s"] = 1 / Spread(self.decode_s[name]).median
        print(mode_table(self.results, self.decode_s))
        print(f"perplexity over {len(self.text_ids)} tokens; agreement over {self.agreement_tokens} tokens "
              f"({len(self.encs)} prompt{'s' if len(self.encs) != 1 else ''}); ms/token: median (min, max) of {self.repeats} rounds; "
              f"measured by {measured_by(self.bk)}")
        return self.results

    def compare_speed(self) -> dict[tuple[str, str], Comparison]:
        """Decode seconds per token, each int8 mode against the unquantized model and the int8 modes against each
        other; prints each verdict (a difference only where the rounds' ranges separate) and, on the reference
        engine, whether ``vector_dynamic`` and ``per_channel_symmetric`` store the same int8 values and scales."""
        if not self.bk.is_neuron and {"vector_dynamic", "per_channel_symmetric"} <= set(self.models):
            print("vector_dynamic and per_channel_symmetric store the same int8 values and scales:",
                  same_storage(self.models["vector_dynamic"], self.models["per_channel_symmetric"]))
        pairs = [(m, "unquantized") for m in self.run_modes]
        pairs += [(a, b) for a, b in (("vector_dynamic", "per_channel_symmetric"),
                                      ("per_tensor_symmetric", "per_channel_symmetric"),
                                      ("per_tensor_symmetric", "vector_dynamic")) if {a, b} <= set(self.decode_s)]
        self.speed = {(a, b): compare(self.decode_s[a], self.decode_s[b], a, b) for a, b in pairs}
        for c in self.speed.values():
            print(c)
        print(direction_line([self.speed[(m, "unquantized")] for m in self.run_modes], self.bk))
        return self.speed


def setup(backend="reference", neuron_stack=None, device="cpu", seed=0, model_path=None, amp="f32", modes=(),
          n_positions=256, eval_tokens=256, prompts=(), max_new_tokens=32, repeats=7,
          quantized_dir="neuron_artifacts/06_int8") -> Int8Run:
    """The notebook's parameters checked (``repeats`` >= 3; every mode a known int8 method, refused here before any
    build), the backend resolved, the evaluation text and prompts tokenized. Prints the modes this backend runs."""
    if repeats < 3:
        raise ValueError(f"repeats={repeats}: 3 or more (a spread needs repeats)")
    if max_new_tokens < 2:
        raise ValueError(f"max_new_tokens={max_new_tokens}: 2 or more (decode speed is timed after the first token)")
    bk, model_dir = start(backend, neuron_stack, device, seed, model_path)
    tok = load_tokenizer(model_dir)
    text_ids = tok(eval_text(), return_tensors="pt").input_ids[0, :eval_tokens]
    encs = [encode_prompts(tok, [p], 1) for p in prompts]
    configs = {m: quant_config(m, amp, quantized_dir) for m in modes}  # bad methods are refused here
    run_modes = [m for m in modes if not bk.is_neuron or m in NEURON_QUANT_MODES[bk.stack]]
    for m in (m for m in modes if m not in run_modes):
        print(f"{m}: skipped, not an int8 mode of {bk} (its modes: {NEURON_QUANT_MODES[bk.stack]})")
    print(f"backend: {bk}; {len(text_ids)} eval tokens; modes {run_modes}; measured by {measured_by(bk)}")
    return Int8Run(bk, str(model_dir), text_ids, encs, [e.input_ids.shape[1] for e in encs], configs, run_modes, amp,
                   n_positions, max_new_tokens, repeats, str(quantized_dir))


def refuse_other_dequant(run: Int8Run) -> str | None:
    """The rule the Neuron guide states ("amp type must match dequant type"): building with a ``dequant_dtype`` other
    than ``amp`` is refused before anything is built. Returns the refusal (on Neuron, where helpers always passes
    ``dequant_dtype=amp``, why there is none); raises AssertionError if the reference engine accepts the mismatch."""
    if run.bk.is_neuron:
        return ("on Neuron helpers passes dequant_dtype=amp to transformers-neuronx itself (NxD Inference dequantizes "
                "to torch_dtype): the refusal is the reference engine's check")
    other = "bf16" if run.amp != "bf16" else "f32"
    try:
        build_model(run.bk, run.model_dir, amp=run.amp,
                    neuron_config=NeuronConfig(quant=QuantizationConfig(dequant_dtype=other)))
    except ValueError as e:
        return f"refused: {e}"
    raise AssertionError(f"amp={run.amp} with dequant_dtype={other} was accepted: it must be refused")


def direction_line(against_unquantized: list[Comparison], bk) -> str:
    """How many int8 modes the rounds show slower, faster or not separated from the unquantized model, and on what."""
    slower = sum(c.measurable and c.a.median > c.b.median for c in against_unquantized)
    faster = sum(c.measurable and c.a.median < c.b.median for c in against_unquantized)
    return (f"int8 decode against unquantized, measured by {measured_by(bk)}: {slower} of {len(against_unquantized)} "
            f"modes slower, {faster} faster, {len(against_unquantized) - slower - faster} not separated by the rounds")


def same_storage(a, b) -> bool:
    """Every projection's int8 values and scales equal (two reference-engine models)."""
    return all(torch.equal(getattr(x, n).q, getattr(y, n).q) and torch.equal(getattr(x, n).scale, getattr(y, n).scale)
               for x, y in zip(a.model.w.layers, b.model.w.layers) for n in ("wqkv", "wo", "w13", "w2"))


def mode_table(results: dict, decode_s: dict) -> str:
    """One row per model: its figures, and ms/token as median (min, max) of the rounds."""
    return "\n".join(f"{name:22s} " + "  ".join(f"{k} {v:.3f}" for k, v in r.items())
                     + f"  ms/token {Spread(decode_s[name]).format(1e3)}" for name, r in results.items())


def choose_scales(results: dict, agreement_tokens: int) -> str:
    """Which NxD Inference ``quantization_type`` to set, from the run's own figures: the default
    ``per_tensor_symmetric`` against ``per_channel_symmetric`` (perplexity change where measured, and greedy
    agreement). Per-channel is recommended only where the run shows it ahead on every figure it has."""
    a, b = results.get(NXDI_DEFAULT_TYPE), results.get("per_channel_symmetric")
    if a is None or b is None:
        return "per_tensor_symmetric and per_channel_symmetric were not both run: no comparison of scales here"
    keys = [k for k in ("ppl_delta_pct", "agreement") if k in a and k in b]

    def row(name, r):
        return f"  {name:32s} " + ", ".join(
            f"perplexity {r[k]:+.2f}%" if k == "ppl_delta_pct" else f"agreement {r[k]:.3f}" for k in keys)
    better = [(b[k] < a[k]) if k == "ppl_delta_pct" else (b[k] > a[k]) for k in keys]
    lines = [f"one scale per tensor (NxD Inference 0.8's default) against one per output channel "
             f"(agreement over {agreement_tokens} tokens):", row(NXDI_DEFAULT_TYPE + " (default)", a),
             row("per_channel_symmetric", b)]
    if all(better):
        lines.append("per_channel_symmetric is ahead on every figure here: set "
                     "quantization_type=\"per_channel_symmetric\" (as the NxD Inference recipe does)")
    elif not any(better):
        lines.append("per_channel_symmetric is not ahead on any figure here")
    else:
        lines.append("the figures disagree on this run: neither type is ahead on both")
    return "\n".join(lines)


def plot_modes(run: Int8Run):
    """The figures per model, one panel each (2 x 2, each titled, so no axis label meets its neighbour); decode
    tokens/s as the median of the rounds with min-max bars."""
    import matplotlib.pyplot as plt

    names = list(run.results)
    panels = [(k, label) for k, label in (("weight_mb", "weights (MB)"), ("ppl_delta_pct", "perplexity change (%)"),
                                          ("agreement", "teacher-forced greedy agreement"),
                                          ("tok_s", "decode tokens/s (median, min-max)")) if k in run.results[names[0]]]
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.3 * rows), squeeze=False, layout="constrained")
    for ax, (k, label) in zip(axes.flat, panels):
        vals = [run.results[n][k] for n in names]
        if k == "tok_s":
            s = [Spread(run.decode_s[n]) for n in names]
            err = [[v - 1 / x.high for v, x in zip(vals, s)], [1 / x.low - v for v, x in zip(vals, s)]]
            ax.bar(names, vals, yerr=err, capsize=3)
        else:
            ax.bar(names, vals)
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="x", rotation=20, labelsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    titled(fig, f"int8 modes against the unquantized model (decode: {run.repeats} rounds)", run.bk)
    plt.show()
    return fig


def check_modes(run: Int8Run) -> str:
    """The oracle: every int8 mode against the unquantized model. The quantized projections take 8 bits of each
    weight's ``amp`` bits (plus one f32 scale per row), per-channel scales keep perplexity within 5% and agreement
    above 90%, one scale per tensor agrees on most tokens (above 50%). On Neuron only the agreement bounds
    (the byte ratio and perplexity are reference-only). Raises AssertionError; returns a line for the notebook."""
    expected = 8 / torch.finfo(amp_dtype(run.amp)).bits
    base = run.results["unquantized"]
    for method in run.run_modes:
        r = run.results[method]
        per_channel = method != "per_tensor_symmetric"
        if not run.bk.is_neuron:
            assert abs(r["proj_ratio"] - expected) < 0.01, (method, r["proj_ratio"], expected)
            assert not per_channel or r["ppl"] < PER_CHANNEL_PPL_RATIO * base["ppl"], (method, r["ppl"], base["ppl"])
        bound = PER_CHANNEL_AGREEMENT if per_channel else PER_TENSOR_AGREEMENT
        assert r["agreement"] > bound, (method, r["agreement"], bound)
    return f"all {len(run.run_modes)} int8 modes within bounds"


def write_int8_metrics(metrics_path, run: Int8Run, fp8_errors: dict) -> dict:
    """The key figures to ``metrics_path`` (the keys ci/baselines/cpu.json checks among them)."""
    metrics = {f"{n}_{k}": v for n, r in run.results.items() for k, v in r.items()}
    metrics.update({f"{n}_ms_per_token_{e}": 1e3 * getattr(Spread(s), e) for n, s in run.decode_s.items()
                    for e in ("median", "low", "high")})
    metrics.update({f"speed_{a}_vs_{b}": c.verdict for (a, b), c in run.speed.items()})
    metrics.update({f"rounding_error_{f}": e for f, e in fp8_errors.items()})
    metrics.update(amp=run.amp, eval_tokens=len(run.text_ids), modes=",".join(run.run_modes), repeats=run.repeats,
                   measured_by=measured_by(run.bk))
    return write_metrics(metrics_path, metrics)
