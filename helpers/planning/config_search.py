"""Find the (tp_degree, batch_size, sequence_length) settings that fit, after optimum-neuron's workflow
(https://github.com/huggingface/optimum-neuron/blob/main/tools/export/AGENTS.md): iterate tp increasing, batch size decreasing, sequence length decreasing; once a
setting is valid, skip the shorter sequence lengths of that (tp, batch); append every result to a JSON
file as soon as it is known and, when the file exists, resume from it with the same skip rules.

Each candidate is predicted by ``helpers.planning.memory``. With ``verify="neuron"`` (on an inf2/trn1 instance)
it is also compiled and loaded in its own process — "it is important to use separate processes for the
tests, otherwise the neuron runtime will not properly release the devices" (004) — and that verdict wins::

    python -m helpers.planning.config_search search --model Llama-3.1-8B --instance inf2.48xlarge --out llama.json
    python -m helpers.planning.config_search search --model Llama-3.1-8B --model-path ./ckpt --verify neuron ...
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .dtypes import amp_dtype
from .gqa import round_up
from .memory import RUNTIME_RESERVE, Shape, instance, load_model_config, plan

BATCH_SIZES = (1, 4, 8, 16, 32, 64, 128)  # 004: "always the following"
MIN_SEQUENCE_LENGTH = 1024

# Which tp degrees a model's attention heads allow, by whose rule:
HEAD_RULES = {
    # optimum-neuron's export workflow: "the tensor parallel size must divide the number of attention heads"
    "divide": "the degree divides the attention heads (optimum-neuron's export rule)",
    # transformers-neuronx (utils.py get_qkv_padding) and NxD Inference (get_number_of_extra_heads) pad the query
    # heads with zero heads up to a multiple of tp and build: aws-neuron-samples' inf2 Llama-3.x notebooks run
    # 32-head models at tp_degree=24 with transformers-neuronx
    "pad": "any degree: the query heads are padded with zero heads up to a multiple of tp "
           "(transformers-neuronx and NxD Inference do this)",
}


def candidate_tp_degrees(inst, n_heads: int, heads: str = "divide") -> list[int]:
    """004's rules — at least 2, a multiple of the cores per device (chip), at most the instance's cores
    (004 says "less than"; a whole instance is a valid choice, so <=), dividing the attention heads —
    intersected with the degrees the Neuron runtime supports on the platform (memory.PLATFORM_TP_DEGREES).

    ``heads``: "divide" (004's rule, optimum-neuron's export) or "pad" (also the degrees that do not divide the
    heads: transformers-neuronx and NxD Inference pad the query heads up to a multiple of tp and build them)."""
    if heads not in HEAD_RULES:
        raise ValueError(f"heads={heads!r}: use one of {sorted(HEAD_RULES)}")
    it = instance(inst)
    return [t for t in it.tp_degrees if t >= 2 and t % it.cores_per_chip == 0 and (heads == "pad" or n_heads % t == 0)]


def padded_heads(n_heads: int, tp: int) -> int:
    """Zero heads the libraries add so that ``tp`` divides the query heads (0 when it does)."""
    return round_up(n_heads, tp) - n_heads


def candidate_sequence_lengths(max_positions: int, minimum: int = MIN_SEQUENCE_LENGTH) -> list[int]:
    """Powers of two, at least ``minimum``, at most the model's max_position_embeddings; decreasing."""
    out, n = [], minimum
    while n <= max_positions:
        out.append(n)
        n *= 2
    return out[::-1]


def _load(path: Path, header: dict) -> dict:
    if path.is_file():
        data = json.loads(path.read_text())
        for k in ("model", "instance", "library", "amp", "heads"):
            if data.get(k, "divide" if k == "heads" else None) != header[k]:  # files from before "heads": divide
                raise ValueError(f"{path} holds results for {k}={data.get(k)!r}, this search has {header[k]!r}: "
                                 "use another results file")
        return data
    return {**header, "tested": [], "configurations": []}


def _save(path: Path, data: dict):
    data["configurations"] = [{"tensor_parallel_size": t["tp_degree"], "batch_size": t["batch_size"],
                               "sequence_length": t["sequence_length"]} for t in data["tested"] if t["valid"]]
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)  # a crash never leaves a half-written file


def skip_reason(tp: int, batch: int, seq: int, tested: list[dict]) -> str | None:
    """004's optimizations, applied to everything recorded so far (this run or an earlier one)."""
    if any((t["tp_degree"], t["batch_size"], t["sequence_length"]) == (tp, batch, seq) for t in tested):
        return "already tested"
    valid = [t for t in tested if t["valid"] and t["tp_degree"] == tp]
    if any(t["batch_size"] == batch for t in valid):
        return "a longer sequence_length is valid for this (tp, batch)"
    if valid and batch > max(t["batch_size"] for t in valid):
        return "larger than the largest valid batch_size of this tp (tested before, failed)"
    return None


def search(model, inst, results_path, library: str = "tnx", amp: str = "bf16", verify: str | None = None,
           model_path=None, tp_degrees=None, batch_sizes=BATCH_SIZES, sequence_lengths=None,
           reserve: float = RUNTIME_RESERVE, timeout_s: float = 3600, heads: str = "divide", log=print) -> dict:
    """Run (or resume) the search; returns the results file's content.

    ``heads``: which degrees the attention heads allow (:data:`HEAD_RULES`): "divide" (004's rule, the default) or
    "pad" (the degrees the libraries build with padded query heads too); each entry records ``padded_heads``.

    ``verify``: None / "planner" (the prediction is the verdict), "neuron" (compile + load in a child
    process), or a callable ``(tp, batch, seq) -> bool`` (e.g. a remote check).
    """
    if not callable(verify) and verify not in (None, "planner", "neuron"):
        raise ValueError(f"verify={verify!r}: use None/'planner' (predictions only), 'neuron' (compile + load) "
                         "or a callable (tp, batch, seq) -> bool")
    if verify == "neuron" and model_path is None:
        raise ValueError("verify='neuron' compiles the model: pass model_path= a local checkpoint directory")
    cfg = load_model_config(model_path if model_path is not None and model is None else model)
    s = Shape.from_config(cfg)
    it = instance(inst)
    tps = sorted(tp_degrees or candidate_tp_degrees(it, s.heads, heads))
    batches = sorted(batch_sizes, reverse=True)
    seqs = sorted(sequence_lengths or candidate_sequence_lengths(s.max_positions), reverse=True)
    path = Path(results_path)
    data = _load(path, {"model": s.name, "instance": it.name, "library": library, "amp": amp, "heads": heads})
    data.setdefault("heads", heads)  # a file from before the option: its rule was "divide" (checked by _load)
    data["verify"] = getattr(verify, "__name__", "callable") if callable(verify) else (verify or "planner")
    for tp in tps:
        for batch in batches:
            for seq in seqs:
                why = skip_reason(tp, batch, seq, data["tested"])
                if why:
                    continue
                p = plan(cfg, tp, batch_size=batch, n_positions=seq, amp=amp, library=library)
                entry = {"tp_degree": tp, "batch_size": batch, "sequence_length": seq,
                         "padded_heads": padded_heads(s.heads, tp), "predicted_fits": p.fits(it, reserve), "predicted_gib": round(p.total_bytes / 2**30, 3),
                         "source": "planner", "valid": p.fits(it, reserve), "error": p.error, "seconds": 0.0}
                if verify == "neuron":
                    entry.update(verify_on_neuron(model_path, library, tp, batch, seq, amp, timeout_s))
                elif callable(verify):
                    entry.update(source=data["verify"], valid=bool(verify(tp, batch, seq)))
                data["tested"].append(entry)
                _save(path, data)
                log(f"tp={tp:>2} batch={batch:>3} seq={seq:>6}: {'valid' if entry['valid'] else 'invalid'} "
                    f"({entry['source']}; predicted {entry['predicted_gib']} GiB/core)")
    _save(path, data)
    return data


def verify_on_neuron(model_path, library: str, tp: int, batch: int, seq: int, amp: str, timeout_s: float) -> dict:
    """Compile + load one candidate in a fresh process (so the runtime releases the cores)."""
    t0 = time.perf_counter()
    out_dir = Path(f"neuron_artifacts/config_search/{library}-tp{tp}-b{batch}-s{seq}")
    cmd = [sys.executable, "-m", "helpers.planning.config_search", "verify", "--library", library, "--model-path",
           str(model_path), "--tp", str(tp), "--batch", str(batch), "--seq", str(seq), "--amp", amp,
           "--out", str(out_dir)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        ok, err = r.returncode == 0, (r.stderr or r.stdout)[-2000:] if r.returncode else None
    except subprocess.TimeoutExpired:
        ok, err = False, f"timed out after {timeout_s} s"
    return {"source": "neuron", "valid": ok, "error": err, "seconds": round(time.perf_counter() - t0, 1)}


def _verify_main(a):
    """Child process: build one candidate with the real library; exit status 0 when it compiled and loaded."""
    if a.library == "tnx":
        from transformers_neuronx import NeuronAutoModelForCausalLM

        model = NeuronAutoModelForCausalLM.from_pretrained(a.model_path, batch_size=a.batch, n_positions=a.seq,
                                                           tp_degree=a.tp, amp=a.amp)
        model.to_neuron()
        return
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    model_type = load_model_config(a.model_path)["model_type"]
    classes = {"llama": ("llama.modeling_llama", "NeuronLlamaForCausalLM"),
               "mixtral": ("mixtral.modeling_mixtral", "NeuronMixtralForCausalLM")}
    if model_type not in classes:  # NxDI 0.8 has no models.mistral (it arrives in 0.9)
        raise SystemExit(f"model_type={model_type!r}: this search knows NxD Inference 0.8's {sorted(classes)}")
    mod, name = classes[model_type]
    cls = getattr(importlib.import_module(f"neuronx_distributed_inference.models.{mod}"), name)
    config_cls = cls.get_config_cls()
    neuron_config = config_cls.get_neuron_config_cls()(tp_degree=a.tp, batch_size=a.batch, seq_len=a.seq,
                                                       torch_dtype=amp_dtype(a.amp))
    model = cls(a.model_path, config_cls(neuron_config, load_config=load_pretrained_config(a.model_path)))
    model.compile(a.out)
    model.load(a.out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("search")
    s.add_argument("--model", default=None, help="shipped config name or config.json path")
    s.add_argument("--model-path", default=None, help="local checkpoint (needed for --verify neuron)")
    s.add_argument("--instance", required=True)
    s.add_argument("--out", required=True, help="results JSON (appended after each candidate, resumed)")
    s.add_argument("--library", default="tnx", choices=("tnx", "nxdi"))
    s.add_argument("--amp", default="bf16")
    s.add_argument("--verify", default=None, choices=("planner", "neuron"))
    s.add_argument("--heads", default="divide", choices=sorted(HEAD_RULES),
                   help="divide: 004's rule (tp divides the attention heads); pad: also degrees the libraries pad to")
    v = sub.add_parser("verify")
    v.add_argument("--library", required=True, choices=("tnx", "nxdi"))
    v.add_argument("--model-path", required=True)
    v.add_argument("--tp", type=int, required=True)
    v.add_argument("--batch", type=int, required=True)
    v.add_argument("--seq", type=int, required=True)
    v.add_argument("--amp", default="bf16")
    v.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.cmd == "verify":
        _verify_main(a)
    else:
        search(a.model, a.instance, a.out, library=a.library, amp=a.amp, verify=a.verify, model_path=a.model_path,
               heads=a.heads)


if __name__ == "__main__":
    main()
