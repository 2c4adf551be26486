"""The command line: greedy generation with the tensor-parallel reference engine, optionally checked
against tp_degree=1 (``python -m helpers.parallel``).
"""
from __future__ import annotations

import argparse

import torch

from ..artifacts.model import NeuronModel
from ..engine.config import NeuronConfig
from ..model_store import load_tokenizer
from ..prompts import encode_prompts
from .model import ParallelModel


def main(argv=None):
    p = argparse.ArgumentParser(description="Greedy generation with the tensor-parallel reference engine.")
    p.add_argument("--tp-degree", type=int, default=2, help="ranks (processes)")
    p.add_argument("--model-path", default=None, help="local HF checkpoint dir (default: embedded SmolLM2)")
    p.add_argument("--prompt", default="What is tensor parallelism?")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--n-positions", type=int, default=256)
    p.add_argument("--amp", default="f32")
    p.add_argument("--gqa", default=None, help="GQA strategy value, e.g. shard-over-heads, convert-to-mha")
    p.add_argument("--device", default="cpu")
    p.add_argument("--check", action="store_true", help="compare with tp_degree=1 (needs the whole model on rank 0)")
    a = p.parse_args(argv)
    tp = a.tp_degree
    tok = load_tokenizer(a.model_path)
    enc = encode_prompts(tok, [a.prompt], a.batch_size)
    seq_len = enc.input_ids.shape[1] + a.max_new_tokens
    kw = dict(batch_size=a.batch_size, n_positions=a.n_positions, amp=a.amp, device=a.device,
              neuron_config=NeuronConfig(group_query_attention=a.gqa))
    model = ParallelModel.from_pretrained(a.model_path, tp_degree=tp, **kw).to_neuron()
    try:
        out = model.sample(enc.input_ids, seq_len, top_k=1, attention_mask=enc.attention_mask)
        st = model.stats
        itl = (st["token_times_s"][-1] - st["token_times_s"][0]) / max(1, len(st["token_times_s"]) - 1)
        print(f"tp_degree={tp} ({model.layout.name}, {model.layout.kv_mode}): ttft {st['ttft_s'] * 1e3:.0f} ms, "
              f"{itl * 1e3:.1f} ms/token")
        for r in model.rank_reports:
            print(f"  rank {r['rank']}: q heads {r['q_heads']} kv heads {r['kv_heads']} weights "
                  f"{r['weight_bytes'] / 2**20:.1f} MiB, KV cache {r['kv_bytes'] / 2**20:.2f} MiB {r['kv_cache_shape']}")
        print(repr(tok.decode(out[0, enc.input_ids.shape[1]:], skip_special_tokens=True)))
        if a.check:
            ref = NeuronModel.from_pretrained(a.model_path, tp_degree=1, **kw).to_neuron()
            same = torch.equal(ref.sample(enc.input_ids, seq_len, top_k=1, attention_mask=enc.attention_mask), out)
            print("greedy tokens identical to tp_degree=1:", same)
            if not same:
                raise SystemExit(1)
    finally:
        model.close()
