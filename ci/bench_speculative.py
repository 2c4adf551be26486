#!/usr/bin/env python
"""Speculative decoding against plain decoding of the same engine, measured in one run.

For every task (a prompt from ``helpers.prompts.SPECULATION_TASKS``: ``quote`` copies a paragraph
from the prompt, ``edit`` rewrites a sentence, ``open`` writes freely), every draft (prompt lookup:
n-gram lookup in the sequence so far; ``truncated``: the target's first N layers) and every k, the
target decodes greedily with and without speculation, alternately after a warm-up, ``--repeats``
times. Printed per row: acceptance rate, tokens per target call, plain and speculative tokens/s
(medians), the speedup (ratio of median times, [min-max] of the per-repeat ratios) and what the
analytic model predicts from the measured acceptance, draft cost and verification cost
(Leviathan et al. 2023). Every speculative output must be token-identical to the plain one: the
script exits 1 otherwise.

    python ci/bench_speculative.py                 # 3 tasks x 2 drafts x k in 1 2 3 4 6 8, 3 repeats
    python ci/bench_speculative.py --quick         # CI smoke run: quote + open, k 2 4, 1 repeat
    python ci/bench_speculative.py --json out.json # also every figure as JSON ('-': JSON on stdout)

Needs only torch and transformers (and this repository's ``helpers``). Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import helpers  # noqa: E402
from helpers.prompts import SPECULATION_TASKS, encode_prompts  # noqa: E402
from helpers.engine.speculative import ModelDraft, PromptLookupDraft  # noqa: E402
from helpers.model_store import write_truncated_draft  # noqa: E402
from helpers.notebook.speculation import expected_speedup  # noqa: E402
from helpers.notebook.speculation import sweep_k  # noqa: E402
from helpers.notebook.timing import draft_cost_ratio, verify_costs  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=list(SPECULATION_TASKS), choices=list(SPECULATION_TASKS))
    p.add_argument("--drafts", nargs="+", default=["prompt_lookup", "truncated"], choices=["prompt_lookup", "truncated"])
    p.add_argument("--ks", nargs="+", type=int, default=[1, 2, 3, 4, 6, 8])
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per run (EOS ends a run earlier)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--draft-layers", type=int, default=4, help="layers of the truncated draft")
    p.add_argument("--ngram", type=int, default=3, help="longest n-gram the prompt-lookup draft matches")
    p.add_argument("--amp", default="f32", choices=["f32", "bf16", "f16"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--model-path", default=None, help="local HF Llama/Mistral checkpoint (default: embedded SmolLM2)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--json", default=None, help="write every figure here as JSON ('-': JSON only, on stdout)")
    p.add_argument("--quick", action="store_true", help="CI smoke run: tasks quote+open, k 2 4, 24 tokens, 1 repeat")
    a = p.parse_args(argv)
    if a.quick:
        a.tasks, a.ks, a.new_tokens, a.repeats = ["quote", "open"], [2, 4], 24, 1
    if min(a.ks) < 1 or a.new_tokens < 2 or a.repeats < 1 or a.draft_layers < 1 or a.ngram < 1:
        p.error("need every k >= 1, --new-tokens >= 2, --repeats >= 1, --draft-layers >= 1, --ngram >= 1")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA device")
    return a


def run(a) -> dict:
    tok = helpers.load_tokenizer(a.model_path)
    model_dir = helpers.resolve_model_path(a.model_path)
    encs = {t: encode_prompts(tok, [SPECULATION_TASKS[t]], 1).input_ids for t in a.tasks}
    n_positions = max(ids.shape[1] for ids in encs.values()) + a.new_tokens + max(a.ks) + 1

    def build(k, path=model_dir):
        m = helpers.NeuronModel.from_pretrained(path, n_positions=n_positions, amp=a.amp, device=a.device)
        if k:
            m.enable_speculative_decoder(k)
        return m.to_neuron()

    with tempfile.TemporaryDirectory() as tmp:
        factories, draft_cost = {}, {}
        if "prompt_lookup" in a.drafts:
            factories["prompt_lookup"], draft_cost["prompt_lookup"] = (lambda: PromptLookupDraft(a.ngram)), 0.0
        if "truncated" in a.drafts:
            name = f"truncated_{a.draft_layers}L"
            draft_model = build(0, write_truncated_draft(model_dir, a.draft_layers, Path(tmp) / "draft"))
            factories[name] = lambda: ModelDraft(draft_model)
            draft_cost[name] = draft_cost_ratio(draft_model, build(0))
            print(f"{name} draft: one step costs {draft_cost[name]:.3f} of a target step")
        rows = []
        print(f"{'task':6s} {'draft':15s} {'k':>2s} {'accept':>6s} {'tok/call':>8s} {'plain tok/s':>11s} "
              f"{'spec tok/s':>10s} {'speedup [range]':>18s} {'model':>6s} identical")
        verify_target = build(max(a.ks))
        for task, ids in encs.items():
            verify = verify_costs(verify_target, a.ks, ids.shape[1])  # k -> verification over a decode step
            for name, make in factories.items():
                for r in sweep_k(build, make, a.ks, ids, ids.shape[1] + a.new_tokens, tok.eos_token_id, a.repeats):
                    r.update(task=task, draft=name, draft_cost_ratio=draft_cost[name], verify_cost_ratio=verify[r["k"]],
                             model_speedup=expected_speedup(r["acceptance_rate"], r["k"], draft_cost[name],
                                                            verify[r["k"]]))
                    lo, hi = r["speedup_range"]
                    print(f"{task:6s} {name:15s} {r['k']:2d} {r['acceptance_rate']:6.2f} {r['tokens_per_round']:8.2f} "
                          f"{r['plain_tokens_per_s']:11.1f} {r['spec_tokens_per_s']:10.1f} "
                          f"{r['speedup']:6.2f}x [{lo:.2f}-{hi:.2f}] {r['model_speedup']:5.2f}x {r['identical']}")
                    rows.append(r)
    best = max(rows, key=lambda r: r["speedup"])
    print(f"best: {best['task']} / {best['draft']} k={best['k']}: {best['speedup']:.2f}x plain decode "
          f"({best['spec_tokens_per_s']:.1f} vs {best['plain_tokens_per_s']:.1f} tok/s, acceptance "
          f"{best['acceptance_rate']:.2f})")
    return {"settings": {k: v for k, v in vars(a).items() if k != "json"}, "n_positions": n_positions,
            "load_average": os.getloadavg()[0], "threads": torch.get_num_threads(), "rows": rows,
            "best": {k: best[k] for k in ("task", "draft", "k", "speedup", "acceptance_rate")},
            "all_identical": all(r["identical"] for r in rows)}


def main(argv=None) -> int:
    a = parse(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    quiet = a.json == "-"
    with contextlib.redirect_stdout(open(os.devnull, "w") if quiet else sys.stdout):  # noqa: SIM115
        result = run(a)
    if a.json:
        text = json.dumps(result, indent=1)
        if quiet:
            print(text)
        else:
            Path(a.json).write_text(text)
    if not result["all_identical"]:
        print("FAIL: a speculative output differs from plain greedy decoding", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
