#!/usr/bin/env python
"""How fast is the reference engine? Decode speed against Hugging Face ``generate()`` and against
the memory-bandwidth roofline, measured in one run on the same checkpoint and settings.

For every (amp, batch size) the engine and ``generate()`` run the same prompt, greedy, with EOS
disabled, alternately (warm-up, then repeats), so load on a shared machine hits both alike. A
streamer timestamps every new token: prefill latency is the time to the first token, decode
tokens/s is (new tokens - 1) / (last token time - first token time), per sequence.

Roofline: a decode step must read every weight once (an untied embedding table is only gathered)
plus the KV cache it attends over, so steps/s <= bandwidth / those bytes. The bandwidth is the
machine's, measured here with torch over buffers far larger than the caches: a copy (read + write
bytes) and a read-only reduction, on 4 KB pages and on the huge pages the engine's weights live in
(``helpers.engine.cpu.hugepages``, where Linux offers them); the roofline uses the fastest of these.

    python ci/benchmark.py                  # f32 + bf16, batch 1 and 8, 128 + 128 tokens, 5 repeats
    python ci/benchmark.py --compiled       # also the engine with NeuronConfig(compiled=True)
    python ci/benchmark.py --compiled aoti  #   ... or any other NeuronConfig(compiled=...) value
    python ci/benchmark.py --json out.json  # also write every figure as JSON ('-': JSON on stdout)
    python ci/benchmark.py --quick          # CI smoke run: f32, batch 1, 32 + 32 tokens, 3 repeats
    python ci/benchmark.py --rows 1 2 4 8 16  # the step table's row counts (default 1 2 4 8)
    python ci/benchmark.py --profile        # plus a torch.profiler table of one engine decode

Steps by rows: one forward over 1, 2, 4, 8 rows, as decode at batch b (a model built for batch b)
and as the verification of k+1 tokens of one sequence (the speculative graph), each at the position
after the prompt, cases alternating; their ratio to the one-row step is what a batch or a
verification costs over a single token. Prefill: the engine's time to the first token over
``generate()``'s, per configuration.

Needs only torch and transformers (and this repository's ``helpers``). Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import helpers  # noqa: E402
from helpers.engine.cpu import kernel_choice  # noqa: E402
from helpers.engine.cpu import kernels as engine_kernels  # noqa: E402
from helpers.engine.cpu import clib, fused_ops  # noqa: E402
from helpers.engine.quant import QuantWeight  # noqa: E402
from helpers.engine.model import Linear  # noqa: E402
from helpers.engine.cpu.hugepages import Arena  # noqa: E402
from helpers.notebook.timing import step_seconds  # noqa: E402
from helpers.planning.dtypes import amp_dtype  # noqa: E402

# The goals (issue "Any fresh CPU"), each checked on the figures of this run:
GOAL = {"amp": "f32", "batch_size": 1, "engine_over_roofline": 0.8}  # batch-1 decode >= 0.8 of the roofline
STEP_GOAL = {"amp": "f32", "rows": 8, "max_over_one_row": 1.5}  # a step over 8 rows <= 1.5 x a one-row step
PREFILL_GOAL = {"amp": "f32", "batch_sizes": (1, 8), "max_engine_over_hf": 0.8}  # prefill <= 0.8 x generate()'s
TEXT = ("The history of astronomy spans thousands of years, from the first careful records of the night sky "
        "to telescopes in orbit. Early observers tracked the motion of the Sun, the Moon and the planets, "
        "built calendars around them and predicted eclipses. ")


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def fmt(s: dict, scale: float = 1.0, digits: int = 1) -> str:
    return (f"{s['median'] * scale:.{digits}f} [{s['min'] * scale:.{digits}f}-"
            f"{s['max'] * scale:.{digits}f}]")


# -- the machine ---------------------------------------------------------------------------------
def memory_bandwidth(mib: int, repeats: int) -> dict:
    """GB/s of a tensor copy (read + write bytes, as STREAM counts) and of a read-only sum, on ordinary 4 KB pages
    and, where Linux offers them, on the huge pages the engine keeps its weights in (``helpers.engine.cpu.hugepages``),
    the two kinds alternating. The roofline takes the faster memory."""
    n = mib * 2**20 // 4
    arena = Arena(2 * Arena.size_of((n,)))
    buffers = {"4 KB pages": (torch.empty(n), torch.empty(n))}
    if arena.advised:
        buffers["huge pages"] = (arena.empty((n,)), arena.empty((n,)))
    times = {kind: {"copy": [], "read": []} for kind in buffers}
    for src, _ in buffers.values():
        torch.rand(n, out=src)
    for i in range(repeats + 1):
        for kind, (src, dst) in buffers.items():
            t = time.perf_counter()
            dst.copy_(src)
            t_copy = time.perf_counter() - t
            t = time.perf_counter()
            src.sum()
            t_read = time.perf_counter() - t
            if i:  # the first pass faults the pages in
                times[kind]["copy"].append(2 * n * 4 / t_copy / 1e9)
                times[kind]["read"].append(n * 4 / t_read / 1e9)
    pages = {kind: {"copy_gbs": spread(t["copy"]), "read_gbs": spread(t["read"])} for kind, t in times.items()}
    peak = {kind: max(p["copy_gbs"]["median"], p["read_gbs"]["median"]) for kind, p in pages.items()}
    best = max(peak, key=peak.get)
    return {"buffer_mib": mib, "pages": pages, "roofline_pages": best, **pages[best], "roofline_gbs": peak[best],
            "weights_in": arena.describe()}


def gemv_bandwidth(dtype: torch.dtype, repeats: int) -> dict:
    """GB/s of batch-1 matmuls over LM-head-sized weights: ``F.linear`` (MKL) in the checkpoint's
    [out, in] layout and column-major, and the reduction split over the threads on column-major
    (``helpers.engine.cpu.kernels.split_k_linear``): how close each kernel gets to the bandwidth. The engine's
    choice among its kernels (``helpers.engine.cpu.kernel_choice``) is printed at the end."""
    ws = [torch.randn(49152, 576).to(dtype) for _ in range(4)]  # 4 x 113 MB (f32): no cache reuse
    x = torch.randn(1, 576).to(dtype)
    out = {}
    for name, layout, kernel in (("row_major", lambda w: w, F.linear),
                                 ("column_major", engine_kernels.column_major, F.linear),
                                 ("split_k", engine_kernels.column_major,
                                  lambda x, w: engine_kernels.split_k_linear(x, w, None, torch.get_num_threads()))):
        mats = [layout(w) for w in ws]
        kernel(x, mats[0])
        gbs = []
        for _ in range(repeats):
            t = time.perf_counter()
            for w in mats:
                kernel(x, w)
            gbs.append(sum(w.nbytes for w in mats) / (time.perf_counter() - t) / 1e9)
        out[name] = spread(gbs)
        del mats
    return out


def gemm_gflops(dtype: torch.dtype, repeats: int, n: int = 1024) -> dict:
    """GFLOP/s of an n x n x n ``torch.mm`` (MKL / oneDNN): how fast this machine multiplies when compute, not
    memory, bounds it, as a prefill's T x hidden GEMMs are."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        rates.append(2 * n ** 3 / (time.perf_counter() - t) / 1e9)
    return spread(rates)


def prefill_flops(args, batch: int, tokens: int) -> float:
    """The arithmetic of a prefill of ``tokens`` per sequence: every layer's matmuls per token, causal attention
    (q k^T and p v over the positions before each token), and the LM head for the last token."""
    per_token = args.hidden_size * (args.n_heads + 2 * args.n_kv_heads) * args.head_dim \
        + args.n_heads * args.head_dim * args.hidden_size + 3 * args.hidden_size * args.intermediate_size
    attention = 2 * 2 * args.n_heads * args.head_dim * tokens * (tokens + 1) / 2
    return batch * (args.n_layers * (2 * tokens * per_token + attention) + 2 * args.vocab_size * args.hidden_size)


# -- timed runs ----------------------------------------------------------------------------------
class Clock:
    """A streamer that timestamps each new token. ``generate()`` puts the prompt first: skipped."""

    def __init__(self, device, skip_first: bool):
        self.device, self.skip, self.times = device, skip_first, []

    def put(self, value):
        if self.skip:
            self.skip = False
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.times.append(time.perf_counter())

    def end(self):
        pass


def timed(run, device, skip_first: bool) -> tuple[dict, torch.Tensor]:
    clock = Clock(device, skip_first)
    t0 = time.perf_counter()
    out = run(clock)
    ts = clock.times
    return {"prefill_s": ts[0] - t0, "decode_steps_s": (len(ts) - 1) / (ts[-1] - ts[0]),
            "total_s": ts[-1] - t0, "new_tokens": len(ts)}, out.cpu()


def make_prompt(tokenizer, n_tokens: int, batch: int) -> torch.Tensor:
    ids = tokenizer(TEXT, add_special_tokens=False).input_ids
    ids = (ids * (n_tokens // len(ids) + 1))[:n_tokens]
    return torch.tensor([ids] * batch)


def streamed_bytes(model) -> int:
    """Weight bytes a decode step reads: all of them, except an untied embedding table (gathered)."""
    w = model.model.w
    return model.weight_bytes - (0 if w.tied else w.embed.nbytes)


def kv_bytes_per_step(args, dtype, batch: int, positions: float) -> float:
    """K and V of every layer over the attended positions, per decode step."""
    return 2 * args.n_layers * args.n_kv_heads * args.head_dim * positions * batch * torch.finfo(dtype).bits / 8


def bench_config(amp: str, batch: int, a, tokenizer, bw: dict, device) -> dict:
    dtype = amp_dtype(amp)
    P, N = a.prompt_tokens, a.new_tokens
    ids = make_prompt(tokenizer, P, batch).to(device)
    mask = torch.ones_like(ids)
    # (name, compiled, $NEURON_NB_OPS): an engine that runs the C ops between its matmuls is timed beside one that
    # runs torch's, in the same loop, so the ratio of the two is this run's (appended, and so built by this loop,
    # once the default engine shows it runs them)
    variants = [("engine", False, None)] + ([("engine_compiled", a.compiled, None)] if a.compiled else [])
    engines, runs = {}, {}
    for name, compiled, ops in variants:
        t = time.perf_counter()
        with mock.patch.dict(os.environ, {fused_ops.ENV: ops} if ops else {}):
            m = helpers.NeuronModel.from_pretrained(a.model_path, batch_size=batch, n_positions=P + N, amp=amp,
                                                    context_length_estimate=P, device=str(device),
                                                    neuron_config=helpers.NeuronConfig(compiled=compiled))
            m.to_neuron()
        engines[name] = {"model": m, "build_s": time.perf_counter() - t}
        if name == "engine" and (m.model.ops.record or {}).get("ops") == "fused":
            variants.append(("engine_torch_ops", False, "torch"))
        runs[name] = (lambda m: lambda clock: m.sample(ids, P + N, top_k=1, eos_token_override=[],
                                                       streamer=clock))(m)
    hf = helpers.load_hf_model(a.model_path, dtype=dtype).to(device)

    def hf_run(clock, hf=hf):
        with torch.inference_mode():
            return hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=N,
                               do_sample=False, top_k=None, top_p=None, temperature=None, eos_token_id=None,
                               pad_token_id=tokenizer.pad_token_id, streamer=clock)
    runs["hf"] = hf_run

    samples = {k: [] for k in runs}
    outputs, first_run = {}, {}
    for rep in range(a.warmup + a.repeats):
        for name, run in runs.items():
            r, out = timed(run, device, skip_first=(name == "hf"))
            if rep == 0:
                first_run[name], outputs[name] = r["total_s"], out
            if rep >= a.warmup:
                samples[name].append(r)
    res = {"amp": amp, "batch_size": batch, "prompt_tokens": P, "new_tokens": N}
    for name, rs in samples.items():
        res[name] = {"decode_tok_s": spread([r["decode_steps_s"] for r in rs]),
                     "prefill_ms": spread([r["prefill_s"] * 1e3 for r in rs]),
                     "first_run_s": first_run[name]}
        if name in engines:
            res[name]["build_s"] = engines[name]["build_s"]
    m = engines["engine"]["model"]
    step_bytes = streamed_bytes(m) + kv_bytes_per_step(m.args, dtype, batch, P + (N - 1) / 2)
    roof = bw["roofline_gbs"] * 1e9 / step_bytes
    res["roofline"] = {"bytes_per_step": step_bytes, "decode_tok_s": roof, "gbs": bw["roofline_gbs"]}
    res["ratios"] = {"engine_prefill_over_hf": res["engine"]["prefill_ms"]["median"] / res["hf"]["prefill_ms"]["median"]}
    if "gemm_gflops" in bw and dtype == torch.float32:  # the compute bound: no prefill beats the fastest f32 rate seen
        flops = prefill_flops(engines["engine"]["model"].args, batch, P)
        rates = {name: flops / res[name]["prefill_ms"]["median"] / 1e6 for name in ("engine", "hf")}
        peak = max(bw["gemm_gflops"]["median"], *rates.values())
        res["prefill_bound"] = {"gflop": flops / 1e9, "gflops": rates, "peak_gflops": peak,
                                "min_ms": flops / peak / 1e6,
                                "min_engine_over_hf": flops / peak / 1e6 / res["hf"]["prefill_ms"]["median"]}
    if "engine_torch_ops" in res:
        res["ratios"]["engine_over_engine_torch_ops"] = (res["engine"]["decode_tok_s"]["median"]
                                                         / res["engine_torch_ops"]["decode_tok_s"]["median"])
    for name, *_ in variants:
        e = res[name]["decode_tok_s"]["median"]
        res["ratios"][name + "_over_hf"] = e / res["hf"]["decode_tok_s"]["median"]
        res["ratios"][name + "_over_roofline"] = e / roof
        diff = (outputs[name] != outputs["hf"]).any(0).nonzero()
        res[name]["greedy_identical_to_hf"] = bool(diff.numel() == 0)
        res[name]["first_divergent_position"] = None if diff.numel() == 0 else int(diff[0]) - P
    if a.profile:
        print(f"\nprofile of the engine's decode steps, amp={amp} batch={batch}:")
        res["profile"] = profile_engine(m, ids, P, N)
        if device.type == "cpu":
            res["profile"]["pause_cost"] = matmul_pause_cost(m, batch)
    del engines, hf, hf_run, runs
    gc.collect()
    return res


def bench_steps(amp: str, a, device) -> dict:
    """One forward over each row count of ``a.rows``: decode at batch b (a model per batch size) and the
    verification of b tokens of one sequence (a batch-1 model with the speculative graph), all at the slot
    after the prompt, timed alternately by ``helpers.notebook.timing.step_seconds`` (notebook 05 uses it too)."""
    P, N = a.prompt_tokens, a.new_tokens

    def build(batch, spec=0):
        m = helpers.NeuronModel.from_pretrained(a.model_path, batch_size=batch, n_positions=P + N, amp=amp,
                                                context_length_estimate=P, device=str(device))
        if spec:
            m.enable_speculative_decoder(spec)
        return m.to_neuron()

    one = build(1, max(a.rows) - 1)
    cases = {"decode 1": (one, 1)}
    for r in a.rows[1:]:
        cases[f"decode {r}"] = (build(r), 1)
        cases[f"verify {r}"] = (one, r)
    t = step_seconds(cases, P, max(3, a.repeats))
    base = t["decode 1"]["median"]
    res = {"amp": amp, "position": P, "rows": list(a.rows), "steps_s": t,
           "over_one_row": {label: x["median"] / base for label, x in t.items()}}
    del cases, one
    gc.collect()
    return res


def print_steps(r: dict) -> None:
    print(f"\n== steps by rows, amp={r['amp']}, slot {r['position']} (ms per forward, median [min-max]; ratio to one row) ==")
    print(f"  {'rows':>5s}{'decode at batch b':>32s}{'verify b tokens (batch 1)':>36s}")
    for n in r["rows"]:
        cells = []
        for kind in ("decode", "verify"):
            label = f"{kind} {n}"
            if label in r["steps_s"]:
                cells.append(f"{fmt(r['steps_s'][label], 1e3)} ({r['over_one_row'][label]:.2f}x)")
            else:
                cells.append("(one row: decode 1)")
        print(f"  {n:5d}{cells[0]:>32s}{cells[1]:>36s}")


LINEAR_EVENT = "engine::linear"  # every call of the engine's linear, whatever kernel runs it (the profile labels them)
FUSED_EVENT, FUSED_OPS = "engine::c::", ("rms_norm", "rope_qk_", "attention", "swiglu")  # and of its C ops (fused_ops)


def profile_engine(m, ids, P: int, N: int, rows: int = 12) -> dict:
    """N - 1 decode steps (public ``forward`` with ``cache_ids``) under torch.profiler, after an
    unprofiled prefill: top ops by self time, and the bandwidth the matmuls reach. Each call of the
    engine's linear is labelled (the "stream" kernel is no ATen op, so the profiler would not see it)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    steps = N - 1
    m.require_built()

    def labelled(linear):
        def run(w, x, b=None):
            with record_function(LINEAR_EVENT):
                return linear(w, x, b)
        return run

    def labelled_op(name, fn):
        def run(*args):
            with record_function(FUSED_EVENT + name):
                return fn(*args)
        return run

    # every kind of matrix's linear and the C ops, looked up at each call: labelled for this profile only
    with contextlib.ExitStack() as patched:
        for kind in (Linear, engine_kernels.CpuWeight, QuantWeight):
            patched.enter_context(mock.patch.object(kind, "linear", labelled(kind.linear)))
        for name in FUSED_OPS:
            patched.enter_context(mock.patch.object(fused_ops, name, labelled_op(name, getattr(fused_ops, name))))
        with torch.inference_mode():
            tok = m.forward(ids).argmax(-1, keepdim=True)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                t = time.perf_counter()
                for pos in range(P, P + steps):
                    tok = m.forward(tok, cache_ids=torch.tensor([pos])).argmax(-1, keepdim=True)
                wall = time.perf_counter() - t
    ev = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ev)
    print(ev.table(sort_by="self_cpu_time_total", row_limit=rows))
    top = sorted(ev, key=lambda e: -e.self_cpu_time_total)[:rows]
    mm = sum(e.cpu_time_total for e in ev if e.key == LINEAR_EVENT) * 1e-6
    c_ops = sum(e.cpu_time_total for e in ev if e.key.startswith(FUSED_EVENT)) * 1e-6
    return {"self_cpu_share": {e.key: e.self_cpu_time_total / total for e in top},
            "steps": steps, "ms_per_step_profiled": wall / steps * 1e3, "matmul_ms_per_step": mm / steps * 1e3,
            "c_ops_ms_per_step": c_ops / steps * 1e3,
            "matmul_share": mm / (total * 1e-6), "matmul_gbs": streamed_bytes(m) * steps / mm / 1e9}


def matmul_pause_cost(m, batch: int, pause_us: float = 10.0, repeats: int = 5) -> dict:
    """A decode step's matmuls alone, as one pass over the rank's weights with the engine's linear:
    back to back, then with a busy-wait of ``pause_us`` between matmuls (as the other ops of a step
    sit between them). ``extra_us`` = what each pause costs beyond its own length."""
    tr = m.require_built()
    weights = tr.w.matrices()
    xs = {k: torch.randn(batch, k, dtype=tr.dtype, device=tr.device) for k in {t.shape[1] for t in weights}}

    def busy():
        end = time.perf_counter() + pause_us * 1e-6
        while time.perf_counter() < end:
            pass

    passes = lambda pause: engine_kernels.matmul_pass_seconds(lambda x, w: w.linear(x), weights, xs, repeats,  # noqa: E731
                                                              pause)
    with torch.inference_mode():
        passes(None)  # warm-up
        plain, paused = passes(None), passes(busy)
    return {"matmuls": len(weights), "pass_ms": plain * 1e3, "paused_pass_ms": paused * 1e3, "pause_us": pause_us,
            "extra_us": (paused - plain) / len(weights) * 1e6 - pause_us}


# -- report --------------------------------------------------------------------------------------
def print_config(r: dict) -> None:
    print(f"\n== amp={r['amp']}  batch={r['batch_size']}  prompt={r['prompt_tokens']}  new={r['new_tokens']}  "
          "(median [min-max]) ==")
    print(f"  {'':24s}{'decode tok/s/seq':>22s}{'prefill ms':>24s}{'first run s':>13s}{'build s':>9s}")
    for name in [k for k in ("engine", "engine_torch_ops", "engine_compiled", "hf") if k in r]:
        x = r[name]
        label = {"engine": "engine (eager)", "engine_torch_ops": "engine, torch's ops", "engine_compiled":
                 "engine (compiled)", "hf": "HF generate()"}[name]
        build = f"{x['build_s']:9.1f}" if "build_s" in x else ""
        print(f"  {label:24s}{fmt(x['decode_tok_s']):>22s}{fmt(x['prefill_ms'], digits=0):>24s}"
              f"{x['first_run_s']:13.1f}{build}")
    roof = r["roofline"]
    print(f"  {'roofline':24s}{roof['decode_tok_s']:>22.1f}   = {roof['gbs']:.1f} GB/s / "
          f"{roof['bytes_per_step'] / 1e6:.0f} MB per step")
    for k, v in r["ratios"].items():
        print(f"  {k:40s}{v:6.2f}")
    if "prefill_bound" in r:
        pb = r["prefill_bound"]
        print(f"  prefill: {pb['gflop']:.1f} GFLOP at {pb['gflops']['engine']:.0f} GFLOP/s (engine), "
              f"{pb['gflops']['hf']:.0f} (HF); at this machine's fastest f32 rate ({pb['peak_gflops']:.0f} GFLOP/s) it "
              f"takes at least {pb['min_ms']:.0f} ms, so engine/HF >= {pb['min_engine_over_hf']:.2f}")
    for name in ("engine", "engine_torch_ops", "engine_compiled"):
        if name in r:
            d = r[name]["first_divergent_position"]
            print(f"  {name} greedy tokens identical to HF: " + ("yes" if d is None else f"no (from new token {d})"))
    if "profile" in r:
        p = r["profile"]
        print(f"  profile: {p['ms_per_step_profiled']:.1f} ms/step, of which matmuls {p['matmul_ms_per_step']:.1f} ms "
              f"({p['matmul_share']:.0%} of CPU time) at {p['matmul_gbs']:.1f} GB/s, the C ops between them "
              f"{p['c_ops_ms_per_step']:.1f} ms")
        if "pause_cost" in p:
            c = p["pause_cost"]
            print(f"  the step's {c['matmuls']} matmuls alone: {c['pass_ms']:.1f} ms back to back, {c['paused_pass_ms']:.1f} ms with "
                  f"{c['pause_us']:.0f} us between them: each pause costs {c['extra_us']:.0f} us beyond itself")
    if r["batch_size"] > 1:
        print(f"  aggregate tok/s (x{r['batch_size']}): engine {r['engine']['decode_tok_s']['median'] * r['batch_size']:.1f}"
              f", HF {r['hf']['decode_tok_s']['median'] * r['batch_size']:.1f}")


def step_goal_status(steps: list[dict]) -> dict | None:
    """STEP_GOAL: decode at batch 8 and the verification of 8 tokens each within 1.5 x the one-row step."""
    for r in steps:
        n = STEP_GOAL["rows"]
        if r["amp"] == STEP_GOAL["amp"] and n in r["rows"]:
            ratios = {kind: r["over_one_row"][f"{kind} {n}"] for kind in ("decode", "verify")}
            return {"over_one_row": ratios, "met": max(ratios.values()) <= STEP_GOAL["max_over_one_row"]}
    return None


def prefill_goal_status(results: list[dict]) -> dict | None:
    """PREFILL_GOAL: the engine's prefill within 0.8 x generate()'s at batch 1 and 8."""
    got = {r["batch_size"]: r["ratios"]["engine_prefill_over_hf"] for r in results
           if r["amp"] == PREFILL_GOAL["amp"] and r["batch_size"] in PREFILL_GOAL["batch_sizes"]}
    if not got:
        return None
    bound = {r["batch_size"]: r["prefill_bound"]["min_engine_over_hf"] for r in results
             if r["batch_size"] in got and r["amp"] == PREFILL_GOAL["amp"] and "prefill_bound" in r}
    return {"engine_over_hf": got, "met": max(got.values()) <= PREFILL_GOAL["max_engine_over_hf"],
            "complete": set(got) == set(PREFILL_GOAL["batch_sizes"]), "min_engine_over_hf": bound,
            "out_of_reach": sorted(b for b, x in bound.items() if x > PREFILL_GOAL["max_engine_over_hf"])}


def goal_status(results: list[dict]) -> dict | None:
    """GOAL for the engine (and the compiled engine): batch-1 decode at >= 0.8 of the roofline. With ``--profile``,
    the measured bound: the step time the goal allows, what the step's matmuls alone take back to back, and so what
    the ops between them may take (a goal the matmuls alone miss is out of reach with these kernels)."""
    for r in results:
        if r["amp"] == GOAL["amp"] and r["batch_size"] == GOAL["batch_size"]:
            out = {}
            for name in ("engine", "engine_compiled"):
                if name in r:
                    roof = r["ratios"][name + "_over_roofline"]
                    out[name] = {"engine_over_hf": r["ratios"][name + "_over_hf"], "engine_over_roofline": roof,
                                 "met": roof >= GOAL["engine_over_roofline"]}
            cost = (r.get("profile") or {}).get("pause_cost")
            if cost and "engine" in out:
                allowed = 1e3 / (GOAL["engine_over_roofline"] * r["roofline"]["decode_tok_s"])
                step = 1e3 / r["engine"]["decode_tok_s"]["median"]
                out["engine"]["bound_ms"] = {"step": step, "allowed_step": allowed, "matmuls_alone": cost["pass_ms"],
                                             "outside_matmuls": step - cost["pass_ms"],
                                             "allowed_outside": allowed - cost["pass_ms"]}
            return out
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=None, help="local HF Llama/Mistral checkpoint (default: embedded SmolLM2-135M)")
    p.add_argument("--amp", nargs="+", default=["f32", "bf16"], choices=["f32", "bf16", "f16"])
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8])
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8],
                   help="row counts of the step table (decode at batch b, verification of b tokens); starts at 1")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--compiled", nargs="?", const=True, default=None, metavar="MODE",
                   help="also the engine with NeuronConfig(compiled=MODE) (bare flag: compiled=True)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--bandwidth-mib", type=int, default=512, help="size of each bandwidth test buffer")
    p.add_argument("--profile", action="store_true", help="profile one engine decode per configuration")
    p.add_argument("--quick", action="store_true", help="CI smoke run: f32, batch 1, 32 + 32 tokens, 3 repeats")
    p.add_argument("--json", metavar="PATH", default=None, help="write the results as JSON ('-': stdout only)")
    a = p.parse_args(argv)
    if a.quick:
        a.amp, a.batch_sizes, a.prompt_tokens, a.new_tokens, a.repeats = ["f32"], [1], 32, 32, 3
        a.bandwidth_mib = min(a.bandwidth_mib, 256)
    if a.new_tokens < 2 or a.prompt_tokens < 1 or a.repeats < 1 or a.warmup < 0:
        p.error("need --new-tokens >= 2, --prompt-tokens >= 1, --repeats >= 1, --warmup >= 0")
    a.rows = sorted(set(a.rows))
    if a.rows[0] != 1 or max(a.rows) > a.new_tokens:
        p.error(f"--rows {a.rows}: must include 1 (the ratios' base) and stay within --new-tokens {a.new_tokens}")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA device")
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    quiet = a.json == "-"
    log = open(os.devnull, "w") if quiet else sys.stdout  # noqa: SIM115

    with contextlib.redirect_stdout(log):
        torch.manual_seed(0)
        load0 = os.getloadavg()
        cpu = kernel_choice.cpu_info()
        machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                   "cpu_model": cpu["model"], "isa_flags": cpu["isa"], "cpu_count": os.cpu_count(),
                   "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                   "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "device": a.device,
                   "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None}
        print(f"machine: {machine['cpu_model']} ({cpu['machine']}), {machine['cpu_count']} CPUs, torch {machine['torch']} "
              f"with {machine['torch_threads']} threads, device {a.device}, load average {load0[0]:.2f} (1 min)")
        print(f"ISA flags: {' '.join(cpu['isa']) or '(none of ' + ', '.join(kernel_choice.ISA_FLAGS) + ')'}"
              f"  [{machine['platform']}]")
        if a.device == "cuda":
            bw = cuda_bandwidth(a.bandwidth_mib, max(5, a.repeats))
        else:
            bw = memory_bandwidth(a.bandwidth_mib, max(5, a.repeats))
            bw["gemv_f32"] = gemv_bandwidth(torch.float32, max(5, a.repeats))
            bw["gemm_gflops"] = gemm_gflops(torch.float32, max(5, a.repeats))
        kinds = "; ".join(f"{kind}: copy {fmt(p['copy_gbs'])}, read {fmt(p['read_gbs'])}"
                          for kind, p in bw.get("pages", {"": bw}).items()).lstrip(": ")
        print(f"memory bandwidth ({a.bandwidth_mib} MiB buffers, GB/s, median [min-max]): {kinds} -> roofline at "
              f"{bw['roofline_gbs']:.1f} GB/s" + (f" ({bw['roofline_pages']})" if "roofline_pages" in bw else ""))
        if "weights_in" in bw:
            print(f"the engine's f32 weights: {bw['weights_in']}")
        if "gemv_f32" in bw:
            g = bw["gemv_f32"]
            print(f"f32 batch-1 matmul, 49152x576 weights: [out,in] rows {fmt(g['row_major'])} GB/s, "
                  f"column-major {fmt(g['column_major'])} GB/s, split-k {fmt(g['split_k'])} GB/s")
            print(f"f32 GEMM, 1024 x 1024 x 1024 torch.mm: {fmt(bw['gemm_gflops'], digits=0)} GFLOP/s")
        tokenizer = helpers.load_tokenizer(a.model_path)
        results = []
        for amp in a.amp:
            for batch in a.batch_sizes:
                r = bench_config(amp, batch, a, tokenizer, bw, device)
                print_config(r)
                results.append(r)
        steps = []
        for amp in a.amp:
            steps.append(bench_steps(amp, a, device))
            print_steps(steps[-1])
        if device.type == "cpu":
            kernels = kernel_choice.planned_kernels()
            forced = {case: engine_kernels.forced_kernel(case) for case in kernels}
            rec = None if all(forced.values()) else kernel_choice.machine_choice()
            print("\nengine's f32 matmul kernels per shape family (helpers.engine.cpu.kernel_choice: timed once per machine, "
                  "ms per pass over synthetic SmolLM2-shaped weights):")
            for case, kernel in kernels.items():
                label = {"one_row": "1 row", "rows": f"2-{engine_kernels.FEW_ROWS} rows",
                         "prefill": f">{engine_kernels.FEW_ROWS} rows"}[case]
                ms = rec["ms"].get(case) if rec else None
                how = (f"forced by ${engine_kernels.MATMUL_ENV[case]} (or $NEURON_NB_GEMM)" if forced[case] else
                       ", ".join(f"{k} {v:.1f}" for k, v in ms.items()) + f" at {engine_kernels.MATMUL_TUNE_ROWS[case]} rows")
                print(f"  {label:10s} {kernel:8s} ({how})")
            if rec:
                print(f"  choice: {rec['source']}, {rec['path']}")
                loads = rec.get("others_cores")  # other processes' load (cores) during each timing
                if loads and loads[0] is not None:
                    print(f"  other processes' load on this process's cores while timed: "
                          f"{', '.join(f'{x:.2f}' for x in loads)} cores ({len(loads)} timing(s))")
            why = clib.unavailable_reason()
            print("  stream kernel: " + (f"unavailable here ({why}), not timed" if why else
                                         f"built with the system C compiler into {clib.cache_dir()}"))
            machine["matmul_kernels"] = kernels
            machine["matmul_tuning"] = None if rec is None else {"ms": rec["ms"], "source": rec["source"],
                                                                  "path": rec["path"], "key": rec["key"],
                                                                  "others_cores": rec.get("others_cores")}
            machine["stream_kernel_unavailable"] = why
        load1 = os.getloadavg()
        goal = goal_status(results)
        if goal:
            for name, g in goal.items():
                print(f"\ngoal ({GOAL['amp']}, batch {GOAL['batch_size']}, {name}): engine/roofline "
                      f"{g['engine_over_roofline']:.2f} (>= {GOAL['engine_over_roofline']}; engine/HF "
                      f"{g['engine_over_hf']:.2f}): {'met' if g['met'] else 'not met'}")
                if "bound_ms" in g:
                    b = g["bound_ms"]
                    print(f"  bound: the goal allows {b['allowed_step']:.1f} ms per step (now {b['step']:.1f}); the step's "
                          f"matmuls alone take {b['matmuls_alone']:.1f} ms back to back, so the rest may take "
                          f"{b['allowed_outside']:.1f} ms (now {b['outside_matmuls']:.1f})"
                          + ("" if b["allowed_outside"] > 0 else ": out of reach with these matmul kernels"))
                elif not g["met"] and name == "engine":
                    print("  (--profile measures the bound: what the step's matmuls alone take)")
        sg, pg = step_goal_status(steps), prefill_goal_status(results)
        if sg:
            print(f"\ngoal ({STEP_GOAL['amp']}, a step over {STEP_GOAL['rows']} rows <= {STEP_GOAL['max_over_one_row']} x one row): "
                  + ", ".join(f"{k} {v:.2f}x" for k, v in sg["over_one_row"].items()) + f": {'met' if sg['met'] else 'not met'}")
        if pg:
            print(f"goal ({PREFILL_GOAL['amp']}, engine prefill <= {PREFILL_GOAL['max_engine_over_hf']} x HF's at batch "
                  + " and ".join(map(str, PREFILL_GOAL["batch_sizes"])) + "): "
                  + ", ".join(f"batch {b} {v:.2f}x" for b, v in pg["engine_over_hf"].items())
                  + f": {'met' if pg['met'] else 'not met'}" + ("" if pg["complete"] else " (not every batch size was run)"))
            for b in pg["out_of_reach"]:
                print(f"  bound: out of reach at batch {b}: HF's prefill already runs so close to this machine's fastest "
                      f"f32 rate that engine/HF >= {pg['min_engine_over_hf'][b]:.2f}")
        print(f"load average {load1[0]:.2f} at the end (a busy machine lowers and spreads every figure)")
    report = {"machine": dict(machine, load_avg_start=load0[0], load_avg_end=load1[0]), "bandwidth": bw,
              "settings": {k: getattr(a, k) for k in ("model_path", "amp", "batch_sizes", "prompt_tokens",
                                                      "new_tokens", "rows", "repeats", "warmup", "compiled")},
              "results": results, "steps": steps, "goal": goal, "step_goal": sg, "prefill_goal": pg}
    if a.json:
        text = json.dumps(report, indent=2)
        if a.json == "-":
            print(text)
        else:
            Path(a.json).write_text(text)
            print(f"JSON -> {a.json}")
    return 0


def cuda_bandwidth(mib: int, repeats: int) -> dict:
    """The same two measurements on the GPU (CUDA events)."""
    n = mib * 2**20 // 4
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    copy, read = [], []
    for i in range(repeats + 1):
        for fn, acc, nbytes in ((lambda: dst.copy_(src), copy, 2 * n * 4), (lambda: src.sum(), read, n * 4)):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            if i:
                acc.append(nbytes / (s.elapsed_time(e) * 1e-3) / 1e9)
    out = {"buffer_mib": mib, "copy_gbs": spread(copy), "read_gbs": spread(read)}
    out["roofline_gbs"] = max(out["copy_gbs"]["median"], out["read_gbs"]["median"])
    return out


if __name__ == "__main__":
    sys.exit(main())
