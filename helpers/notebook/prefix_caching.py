"""Notebook 10 (prefix caching): the harness around the lesson, one call each.

- :func:`setup`: validate the parameters, resolve the backend, build the reference model (None on Neuron);
- :func:`show_block_memory`: bytes of one KV block per NeuronCore for shipped model configs, and the engine's own;
- :func:`ttft_against_share`, :func:`plot_ttft`: TTFT with and without reuse per shared share (spread of repeats);
- :func:`decode_cost`: one decode step over the block layout against the flat cache;
- :func:`serve_traffic`: chat-like traffic with and without reuse (one pass: tokens computed, TTFT per request);
- :func:`plot_hit_rates`, :func:`neuron_buckets`: bookkeeping only (no model);
- :func:`check_tokens`: with reuse against without, and the last cached request against Hugging Face;
- :func:`write_metrics`: the key figures for ``ci/baselines/cpu.json``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..model_store import load_config, load_hf_model, resolve_model_path
from ..planning.buckets import nxdi_prefix_caching_buckets
from ..serving.blocks import simulate_hit_rate
from ..serving.prefix import (PrefixCachingEngine, block_memory, bucket_rows, cached_prefixes, decode_step_times,
                              shared_share_prompts, shared_tokens)
from .backend import Backend, resolve_backend
from .build import build_model
from .figures import Comparison, Spread, compare, timing_entries, timing_metric, titled
from .metrics import write_metrics as _write
from .provenance import measured_by

TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


@dataclass
class Lab:
    bk: Backend
    model_dir: str
    vocab: int
    model: object | None    # the reference model (batch 1), None on Neuron
    amp: str


def problems(*, n_positions, block_size, num_blocks, prompt_len, shared_shares, ttft_requests, decode_contexts,
             decode_steps, max_new_tokens, traffic_requests, system_lens, fewshot_lens, question_len,
             bucket_requests) -> list[str]:
    """What is wrong with the parameters (empty when nothing is)."""
    longest = max(prompt_len, max(system_lens) + max(fewshot_lens, default=0) + question_len[1])
    out = [f"shared share {s} not in [0, 1)" for s in shared_shares if not 0 <= s < 1]
    out += [f"longest prompt {longest} + max_new_tokens {max_new_tokens} > n_positions {n_positions}"] * (
        longest + max_new_tokens > n_positions)
    out += [f"num_blocks * block_size = {num_blocks * block_size} positions cannot hold one request of "
            f"{longest + max_new_tokens} tokens: raise num_blocks"] * (num_blocks * block_size < longest + max_new_tokens)
    out += [f"question_len={question_len}: use [min, max] with 1 <= min <= max"] * (
        not 1 <= question_len[0] <= question_len[1])
    out += ["block_size, ttft_requests, max_new_tokens, traffic_requests, decode_steps and bucket_requests must be "
            ">= 1"] * (min(block_size, ttft_requests, max_new_tokens, traffic_requests, decode_steps, bucket_requests) < 1)
    out += [f"decode_contexts={decode_contexts}: each in [1, n_positions - 1]"] * any(
        not 1 <= c < n_positions for c in decode_contexts)
    return out


def setup(*, backend, neuron_stack, device, model_path, amp, **checked) -> Lab:
    """Raise ValueError naming every bad parameter (``checked``: the names of :func:`problems`); then the backend,
    the model folder and, on the reference backend, the model at batch 1."""
    found = problems(**checked)
    if found:
        raise ValueError("; ".join(found) + " (see the parameters cell)")
    bk = resolve_backend(backend, neuron_stack, device)
    model_dir = resolve_model_path(model_path)
    model = None if bk.is_neuron else build_model(bk, model_dir, batch_size=1, n_positions=checked["n_positions"],
                                                  amp=amp)
    print(f"backend: {bk}; blocks of {checked['block_size']} positions, {checked['num_blocks']} in the pool; "
          f"figures measured by {measured_by(bk)}")
    return Lab(bk, model_dir, load_config(model_dir)["vocab_size"], model, amp)


def show_block_memory(lab: Lab, memory_models: dict, block_size: int, num_blocks: int) -> tuple[list[dict], int | None]:
    """Print the bytes of one block per NeuronCore (bf16, NxD Inference's KV heads per core) for each shipped model
    config at its tp degree, and the reference engine's own block in its amp; return both."""
    mem = [block_memory(name, block_size, tp, "bf16") for name, tp in memory_models.items()]
    for r in mem:
        print(f"{r['model']:16s} tp={r['tp']:2d}  {r['kv_heads/core']} KV heads/core: "
              f"{r['bytes_per_block'] / 2**20:7.3f} MiB per block of {block_size} (bf16), "
              f"{r['bytes_per_token'] / 1024:6.1f} KiB per token")
    engine_bytes = None
    if lab.model is not None:
        engine_bytes = PrefixCachingEngine(lab.model, 1, block_size).kv_bytes_per_block
        print(f"this engine ({lab.amp}): {engine_bytes} bytes per block, {num_blocks} blocks = "
              f"{num_blocks * engine_bytes / 2**20:.1f} MiB")
    return mem, engine_bytes


@dataclass
class ShareRun:
    """Section 2: per shared share, the TTFT spreads with and without reuse, the mean prompt tokens computed,
    the greedy outputs, and the comparison of the two modes."""
    prompt_len: int
    ttft: dict = field(default_factory=lambda: {True: {}, False: {}})
    computed: dict = field(default_factory=lambda: {True: {}, False: {}})
    outputs: dict = field(default_factory=lambda: {True: [], False: []})
    compared: dict = field(default_factory=dict)


def ttft_against_share(lab: Lab, shares, prompt_len: int, requests: int, num_blocks: int, block_size: int,
                       max_new_tokens: int, seed: int) -> ShareRun:
    """For each share: one request fills the cache, then ``requests`` prompts are timed with reuse and without,
    alternately (the same load on the machine for both); print the comparison and where the TTFT ratio's range lies
    against the share of the prompt computed (contains it, lies above: reuse saves less than in proportion, or
    below)."""
    out = ShareRun(prompt_len)
    for share in shares:
        prompts = shared_share_prompts(share, prompt_len, requests + 1, lab.vocab, seed)
        engines = {caching: PrefixCachingEngine(lab.model, num_blocks, block_size, caching) for caching in (True, False)}
        for e in engines.values():
            e.generate(prompts[0], 1)  # fills the cache; not timed
        served = {caching: [] for caching in engines}
        for p in prompts[1:]:
            for caching, e in engines.items():
                served[caching].append(e.generate(p, max_new_tokens))
        for caching, rs in served.items():
            out.ttft[caching][share] = Spread(r.ttft_s for r in rs)
            out.computed[caching][share] = float(np.mean([r.computed_tokens for r in rs]))
            out.outputs[caching] += [r.tokens for r in rs]
        c = out.compared[share] = compare(out.ttft[True][share].samples, out.ttft[False][share].samples,
                                          "prefix reuse", "no reuse")
        frac, lo, hi = out.computed[True][share] / prompt_len, c.a.low / c.b.high, c.a.high / c.b.low
        where = "contains" if lo <= frac <= hi else ("lies above" if lo > frac else "lies below")
        print(f"share {share:4.2f}: {c}\n    computed {out.computed[True][share]:.0f} of {prompt_len} tokens "
              f"({frac:.2f}); TTFT ratio with/without {c.ratio:.2f}, range {lo:.2f}-{hi:.2f}: {where} the computed share")
    return out


def plot_ttft(run: ShareRun, shares, block_size: int, amp: str, requests: int, bk: Backend) -> None:
    """TTFT with and without reuse against the share (median, min-max), and no reuse scaled by the share computed."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for caching, fmt, label in ((False, "s--", "no reuse"), (True, "o-", "prefix reuse")):
        med = np.array([1e3 * run.ttft[caching][s].median for s in shares])
        err = [med - [1e3 * run.ttft[caching][s].low for s in shares],
               [1e3 * run.ttft[caching][s].high for s in shares] - med]
        ax.errorbar(shares, med, yerr=err, fmt=fmt, capsize=3, label=f"{label} (median, min-max)")
    ax.plot(shares, [1e3 * run.ttft[False][s].median * run.computed[True][s] / run.prompt_len for s in shares], "k:",
            label="no reuse x share computed")
    ax.set(xlabel="shared share of the prompt", ylabel="TTFT (ms)", ylim=(0, None))
    titled(ax, f"TTFT, {run.prompt_len}-token prompts, blocks of {block_size} ({amp}, n={requests} each)", bk)
    ax.legend()
    plt.show()


def decode_cost(lab: Lab, contexts, steps: int, block_size: int) -> dict[int, Comparison]:
    """One eager decode step at each context length over the block layout and over the flat cache (alternately,
    ``steps`` each); print the comparisons (a difference only where the ranges separate)."""
    out = {}
    for ctx in contexts:
        t = decode_step_times(lab.model, ctx, steps, num_blocks=-(-(ctx + 1) // block_size) + 1, block_size=block_size)
        out[ctx] = compare(t["block"], t["flat"], "block layout", "flat cache")
        print(f"decode step at context {ctx:4d}: {out[ctx]}")
    return out


def serve_traffic(lab: Lab, traffic, num_blocks: int, block_size: int, max_new_tokens: int) -> dict:
    """Serve the stream one request after another from a cold cache, with reuse and without (interleaved, one
    pass); print per mode the prompt tokens computed and TTFT over the requests, then the share of prompt tokens
    computed with reuse and the ratio of the TTFT medians, with the sample size (no claim that one follows the
    other: one pass has no spread). Returns {caching: [RequestResult]}."""
    engines = {caching: PrefixCachingEngine(lab.model, num_blocks, block_size, caching) for caching in (True, False)}
    served = {caching: [] for caching in engines}
    for p in traffic:
        for caching, e in engines.items():
            served[caching].append(e.generate(p, max_new_tokens))
    for caching, rs in served.items():
        print(f"{'prefix reuse' if caching else 'no reuse':12s}: {sum(r.computed_tokens for r in rs):5d} of "
              f"{sum(r.prompt_len for r in rs)} prompt tokens computed; TTFT over the requests (they differ in length "
              f"and hit): {Spread(r.ttft_s for r in rs).format(1e3, ' ms', 0)}")
    share = sum(r.computed_tokens for r in served[True]) / sum(r.computed_tokens for r in served[False])
    ttft = [float(np.median([r.ttft_s for r in served[c]])) for c in (True, False)]
    print(f"{len(traffic)} requests, one pass each: reuse computed {share:.0%} of the prompt tokens; median TTFT with "
          f"reuse / without {ttft[0] / ttft[1]:.2f} (requests of different lengths and hits, no repeats)")
    return served


def traffic_hit_rates(traffic, num_blocks: int, block_size: int) -> dict:
    """Share of the stream's prompt tokens found in the cache (served one after another, bookkeeping only) and its
    upper bound (:func:`helpers.serving.prefix.shared_tokens`); printed and returned as metrics."""
    rate = sum(cached_prefixes(traffic, num_blocks, block_size)) / sum(map(len, traffic))
    bound = shared_tokens(traffic)
    print(f"hit rate {rate:.1%} of prompt tokens (upper bound for this traffic {bound:.1%})")
    return {"traffic_hit_rate": rate, "traffic_hit_bound": bound}


def sweep_hit_rates(sweep, sizes, pool_positions: int) -> dict:
    """Replay ``sweep`` through pools of ``pool_positions`` positions at each block size (bookkeeping only); print
    and plot the hit rate against the upper bound; return ``hit_rate_block<b>`` and ``sweep_hit_bound``."""
    import matplotlib.pyplot as plt

    rates = {b: simulate_hit_rate(sweep, b, pool_positions // b) for b in sizes}
    bound = shared_tokens(sweep)
    for b, h in rates.items():
        print(f"block_size {b:4d}: hit rate {h:6.1%}")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(list(sizes), [100 * rates[b] for b in sizes], "o-", label="hit rate")
    ax.axhline(100 * bound, color="k", ls=":", label="upper bound (shared prefix tokens)")
    ax.set(xscale="log", xlabel="block size (positions)", ylabel="prompt tokens from the cache (%)", ylim=(0, 100))
    titled(ax, f"Hit rate against block size ({len(sweep)} requests, pools of {pool_positions} positions)",
           source="computed by helpers.serving.blocks.simulate_hit_rate (bookkeeping, no measurement)")
    ax.legend()
    plt.show()
    return {**{f"hit_rate_block{b}": h for b, h in rates.items()}, "sweep_hit_bound": bound}


def neuron_buckets(traffic, stream, prefill_buckets, prefix_buckets, num_blocks: int, block_size: int) -> dict:
    """NxD Inference 0.8's (prefill, prefix) grid; the buckets section 3's prompts run in; then, per request of a
    Neuron-sized ``stream``, the bucket with its cache hit and without. Prints all; returns the grid size, prefill
    bucket tokens with and without the cache and the hits that still recompute the whole prompt."""
    grid = nxdi_prefix_caching_buckets(prefill_buckets, prefix_buckets)
    print(f"{len(grid)} context-encoding graphs: {grid}")
    small = bucket_rows(list(zip(map(len, traffic), cached_prefixes(traffic, num_blocks, block_size))), grid)
    print(f"section 3's prompts ({min(map(len, traffic))}-{max(map(len, traffic))} tokens): buckets "
          f"{sorted({str(r['bucket']) for r in small})}; with prefix bucket 0 despite a hit: "
          f"{sum(r['cached'] > 0 and isinstance(r['bucket'], tuple) and r['bucket'][1] == 0 for r in small)} of "
          f"{sum(r['cached'] > 0 for r in small)}")
    pool_blocks = -(-4 * max(map(len, stream)) // block_size)  # room for a few prompts' blocks: reuse, rare eviction
    rows = bucket_rows(list(zip(map(len, stream), cached_prefixes(stream, pool_blocks, block_size))), grid)
    for r in rows:
        print(f"prompt {r['prompt']:5d}, cached {r['cached']:5d} -> {r['bucket']}   without the hit: {r['bucket_no_cache']}")
    fits = [r for r in rows if isinstance(r["bucket"], tuple) and isinstance(r["bucket_no_cache"], tuple)]
    hits = [r for r in fits if r["cached"] > 0]
    recomputed = sum(r["bucket"][1] == 0 for r in hits)  # the prefill bucket took the whole prompt: nothing reused
    tokens = {k: sum(r[k][0] for r in fits) for k in ("bucket", "bucket_no_cache")}
    print(f"prefill bucket tokens on Neuron: {tokens['bucket']} with the cache, {tokens['bucket_no_cache']} without; "
          f"{recomputed} of {len(hits)} cache hits still run with prefix bucket 0 (whole prompt recomputed); "
          f"{len(rows) - len(fits)} requests fail (a bucket too small)")
    return {"prefix_grid_buckets": len(grid), "neuron_prefill_bucket_tokens_cached": tokens["bucket"],
            "neuron_prefill_bucket_tokens_uncached": tokens["bucket_no_cache"], "hits_recomputed_on_neuron": recomputed}


def check_tokens(lab: Lab, shares: ShareRun, served: dict, traffic, max_new_tokens: int) -> tuple[bool, bool]:
    """Greedy tokens of every request of sections 2 and 3 with reuse against without; the last request of section 3
    (served from the cache) against Hugging Face ``generate()`` on the whole prompt. Prints both; returns them."""
    with_cache = shares.outputs[True] + [r.tokens for r in served[True]]
    without = shares.outputs[False] + [r.tokens for r in served[False]]
    last = served[True][-1]
    hf = load_hf_model(lab.model_dir, dtype=TORCH_DTYPES[lab.amp])
    with torch.inference_mode():
        ref = hf.generate(torch.tensor([traffic[-1]]), attention_mask=torch.ones(1, last.prompt_len, dtype=torch.long),
                          max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    hf_match = ref[0, last.prompt_len:].tolist() == last.tokens
    print(f"{len(with_cache)} requests: same greedy tokens with and without reuse: {with_cache == without}; the last "
          f"request ({last.cached_tokens} of {last.prompt_len} tokens from the cache) equals transformers: {hf_match}")
    return with_cache == without, hf_match


def write_metrics(path, lab: Lab, params: dict, hit: dict, mem: list[dict], buckets: dict,
                  shares: ShareRun | None = None, decode: dict | None = None, served: dict | None = None,
                  engine_block_bytes: int | None = None, same_tokens=None, hf_match=None) -> dict:
    """The key figures (``ci/baselines/cpu.json`` checks some). ``hit``: hit rates and bounds; on the reference
    engine also the TTFT claims, the decode-step ratios, the traffic's tokens and TTFT medians and the oracle's
    verdicts. The CI baseline bounds the top share's TTFT ratio well above what reuse gives: repeats that spread by
    more than their median (max - min > median) could cross even that margin, so the claim is then not measurable."""
    metrics = {**params, **hit, **buckets, "measured_by": measured_by(lab.bk),
               **{f"block_bytes_{r['model']}_tp{r['tp']}": r["bytes_per_block"] for r in mem}}
    if shares is not None and shares.ttft[True]:
        top = max(shares.ttft[True])
        for s, c in shares.compared.items():
            metrics.update(timing_entries(f"ttft_ratio_share{s}", timing_metric(c, c.ratio, 1.0)))
        metrics.update({f"decode_block_over_flat_ctx{c}": v.ratio for c, v in decode.items()})
        metrics.update(ttft_cached_top_share_s=shares.ttft[True][top].median,
                       ttft_uncached_top_share_s=shares.ttft[False][top].median,
                       computed_share_top=shares.computed[True][top] / shares.prompt_len,
                       engine_block_bytes=engine_block_bytes,
                       traffic_tokens_computed_cached=sum(r.computed_tokens for r in served[True]),
                       traffic_tokens_computed_uncached=sum(r.computed_tokens for r in served[False]),
                       traffic_ttft_cached_s=float(np.median([r.ttft_s for r in served[True]])),
                       traffic_ttft_uncached_s=float(np.median([r.ttft_s for r in served[False]])),
                       same_tokens_with_and_without_cache=bool(same_tokens), matches_transformers=bool(hf_match))
    return _write(path, metrics)

