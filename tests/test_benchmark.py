"""ci/benchmark.py end to end (--quick): the figures it must print, and what they must satisfy.

Timings are noisy on a shared machine, so the assertions are on what does not depend on load:
the roofline arithmetic, greedy agreement with transformers, and the engine beating generate()
(measured alternately in the same run, so load slows both alike).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import helpers

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "ci/benchmark.py"), "--quick", "--profile", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 0
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow
def test_prints_every_figure_and_ratio(report):
    rep, text = report
    for needle in ("memory bandwidth", "engine (eager)", "HF generate()", "roofline", "engine_over_hf",
                   "engine_over_roofline", "goal (f32, batch 1", "engine's f32 matmul kernels", "steps by rows",
                   "engine_prefill_over_hf", "goal (f32, a step over 8 rows", "goal (f32, engine prefill"):
        assert needle in text
    assert set(rep["machine"]["matmul_kernels"]) == {"one_row", "rows", "prefill"}
    from helpers.engine.cpu.kernel_choice import cpu_info
    cpu = cpu_info()  # the CPU and its ISA flags, as /proc/cpuinfo (or platform) has them
    assert rep["machine"]["cpu_model"] == cpu["model"] and rep["machine"]["isa_flags"] == cpu["isa"]
    assert f"machine: {cpu['model']}" in text and "ISA flags: " + " ".join(cpu["isa"]) in text
    bw = rep["bandwidth"]
    assert bw["roofline_gbs"] == max(bw["copy_gbs"]["median"], bw["read_gbs"]["median"]) > 0
    (r,) = rep["results"]
    assert r["engine"]["decode_tok_s"]["n"] == r["hf"]["decode_tok_s"]["n"] == 3
    for side in ("engine", "hf"):
        s = r[side]["decode_tok_s"]
        assert 0 < s["min"] <= s["median"] <= s["max"]
        assert r[side]["prefill_ms"]["median"] > 0


@pytest.mark.slow
def test_step_table_and_prefill_ratio(report):
    """Steps over 1, 2, 4, 8 rows (decode at batch b, verification of b tokens), each ratio to the one-row step
    of the same run, and the goals computed from those figures."""
    rep, text = report
    (st,) = rep["steps"]
    assert st["rows"] == [1, 2, 4, 8] and st["position"] == rep["settings"]["prompt_tokens"]
    labels = {"decode 1"} | {f"{kind} {n}" for n in (2, 4, 8) for kind in ("decode", "verify")}
    assert set(st["steps_s"]) == labels == set(st["over_one_row"])
    base = st["steps_s"]["decode 1"]["median"]
    for label, t in st["steps_s"].items():
        assert 0 < t["min"] <= t["median"] <= t["max"] and t["n"] == 3
        assert st["over_one_row"][label] == pytest.approx(t["median"] / base)
    sg = rep["step_goal"]
    assert sg["over_one_row"] == {k: st["over_one_row"][f"{k} 8"] for k in ("decode", "verify")}
    assert sg["met"] == (max(sg["over_one_row"].values()) <= 1.5)
    (r,) = rep["results"]
    assert r["ratios"]["engine_prefill_over_hf"] == pytest.approx(r["engine"]["prefill_ms"]["median"] / r["hf"]["prefill_ms"]["median"])
    assert rep["prefill_goal"]["engine_over_hf"] == {"1": r["ratios"]["engine_prefill_over_hf"]}  # JSON keys
    assert not rep["prefill_goal"]["complete"] and "(not every batch size was run)" in text
    pb = r["prefill_bound"]  # the compute bound: no prefill is faster than the fastest f32 rate the run saw
    assert pb["peak_gflops"] >= max(rep["bandwidth"]["gemm_gflops"]["median"], *pb["gflops"].values()) > 0
    assert pb["min_ms"] == pytest.approx(pb["gflop"] * 1e3 / pb["peak_gflops"]) and pb["min_ms"] <= min(
        r[side]["prefill_ms"]["median"] for side in ("engine", "hf")) * (1 + 1e-9)
    assert pb["min_engine_over_hf"] <= r["ratios"]["engine_prefill_over_hf"] * (1 + 1e-9)
    assert f"engine/HF >= {pb['min_engine_over_hf']:.2f}" in text


@pytest.mark.slow
def test_the_engine_with_torch_s_ops_is_timed_beside_the_c_ops(report):
    """Where the C ops between the matmuls run (helpers.engine.cpu.fused_ops), an engine with torch's is timed in the same
    loop, and the profile labels each C op."""
    from helpers.engine.cpu import fused_ops
    rep, text = report
    (r,) = rep["results"]
    if fused_ops.planned() != "fused":
        assert "engine_torch_ops" not in r
        return
    assert r["engine_torch_ops"]["decode_tok_s"]["n"] == 3 and "engine, torch's ops" in text
    assert r["ratios"]["engine_over_engine_torch_ops"] == pytest.approx(
        r["engine"]["decode_tok_s"]["median"] / r["engine_torch_ops"]["decode_tok_s"]["median"])
    assert r["engine_torch_ops"]["greedy_identical_to_hf"] and "engine::c::attention" in text
    assert r["profile"]["c_ops_ms_per_step"] > 0


@pytest.mark.slow
def test_decode_goal_and_its_measured_bound(report):
    """The batch-1 goal is 0.8 of the roofline; with --profile the run says what that allows per step, what the
    step's matmuls alone take back to back, and so what the ops between them may take."""
    rep, text = report
    (r,) = rep["results"]
    g = rep["goal"]["engine"]
    assert g["engine_over_roofline"] == r["ratios"]["engine_over_roofline"]
    assert g["met"] == (g["engine_over_roofline"] >= 0.8)
    b = g["bound_ms"]
    assert b["allowed_step"] == pytest.approx(1e3 / (0.8 * r["roofline"]["decode_tok_s"]))
    assert b["matmuls_alone"] == r["profile"]["pause_cost"]["pass_ms"] > 0
    assert b["allowed_outside"] == pytest.approx(b["allowed_step"] - b["matmuls_alone"])
    assert b["step"] == pytest.approx(1e3 / r["engine"]["decode_tok_s"]["median"])
    assert f"bound: the goal allows {b['allowed_step']:.1f} ms per step" in text


@pytest.mark.slow
def test_roofline_arithmetic(report):
    rep, _ = report
    (r,) = rep["results"]
    P, N = r["prompt_tokens"], r["new_tokens"]
    # SmolLM2-135M f32, tied embeddings: every weight once + K and V of 30 layers x 3 heads x 64 dims
    weights = 134_515_008 * 4
    kv = 2 * 30 * 3 * 64 * 4 * (P + (N - 1) / 2)
    assert r["roofline"]["bytes_per_step"] == pytest.approx(weights + kv)
    assert r["roofline"]["decode_tok_s"] == pytest.approx(rep["bandwidth"]["roofline_gbs"] * 1e9 / (weights + kv))
    e = r["engine"]["decode_tok_s"]["median"]
    assert r["ratios"]["engine_over_roofline"] == pytest.approx(e / r["roofline"]["decode_tok_s"])
    assert r["ratios"]["engine_over_hf"] == pytest.approx(e / r["hf"]["decode_tok_s"]["median"])


def test_engine_is_greedy_identical_to_hf(report):
    """Speed is the benchmark's figure to print, not a test's to assert (this machine is noisy)."""
    rep, _ = report
    (r,) = rep["results"]
    assert r["engine"]["greedy_identical_to_hf"]


def test_column_major_layout_keeps_values_and_shapes():
    from helpers.engine.cpu.kernels import column_major

    w = torch.randn(96, 64)
    c = column_major(w)
    assert c.shape == w.shape and torch.equal(c, w) and c.t().is_contiguous()
    x = torch.randn(3, 64)
    assert torch.allclose(torch.nn.functional.linear(x, c), x @ w.t(), atol=1e-5)


@pytest.mark.parametrize("kernel", ["split-k", "stream", "packed", "mkl"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("rows", [(1, 1), (1, 5), (4, 1), (2, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_cpu_weight_linear_is_f_linear(threads, rows, bias, kernel):
    """The engine's f32 CPU weight (every one-row kernel; stream, the packed copy, oneDNN or MKL for several rows)
    computes F.linear, for every thread count, row count and bias; the model's linear runs a plain tensor (bf16,
    or any weight without kernels) by F.linear itself."""
    from helpers.engine.cpu.kernels import CpuWeight, column_major, kernel_available
    from helpers.engine.model import Linear

    if not kernel_available(kernel):
        pytest.skip(f"{kernel} is not available here")
    several = "onednn" if kernel == "split-k" else kernel
    kernels = {"one_row": kernel, "rows": several, "prefill": several}
    g = torch.Generator().manual_seed(sum(rows) + threads)
    w = torch.randn(160, 96, generator=g)  # 96 = 2 x 48 = 3 x 32; 160 out columns = 10 stream blocks
    b = torch.randn(160, generator=g) if bias else None
    x = torch.randn(*rows, 96, generator=g)
    want = torch.nn.functional.linear(x, w, b)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cw = CpuWeight.build(w, kernels)
        assert cw.dense.t().is_contiguous() and torch.equal(cw.dense, w)
        assert set(cw.copies) == ({kernel} if kernel in ("stream", "packed") else set())
        got = cw.linear(x, b)
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-4, rtol=1e-4)
        assert torch.equal(Linear(w).linear(x, b), torch.nn.functional.linear(x, w, b))  # same threads
        xb, wb = x.bfloat16(), column_major(w.bfloat16())
        assert torch.equal(Linear(wb).linear(xb), torch.nn.functional.linear(xb, wb))
    finally:
        torch.set_num_threads(before)


def test_time_matmuls_times_every_candidate_of_each_family(monkeypatch):
    """time_matmuls times every available candidate of each family (one row, a few rows, prefill) on weights with
    their copies, and a CpuWeight runs any of them as F.linear; $NEURON_NB_GEMV / $NEURON_NB_GEMM /
    $NEURON_NB_PREFILL force a kernel ($NEURON_NB_GEMM prefill too) and an unknown one is refused by name."""
    import helpers.engine.cpu.kernels as E

    for env in E.MATMUL_ENV.values():
        monkeypatch.delenv(env, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ws = [E.CpuWeight.build(torch.randn(256, 128), {}, E.COPIES) for _ in range(3)]
        t = E.time_matmuls({case: ws for case in E.MATMUL_KERNELS}, repeats=1)
        stream = {"stream"} if E.kernel_available("stream") else set()
        assert set(t["one_row"]["ms"]) == {"split-k", "packed", "mkl"} | stream
        assert set(t["rows"]["ms"]) == set(t["prefill"]["ms"]) == {"packed", "onednn", "mkl"} | stream
        for case, kernels in E.MATMUL_KERNELS.items():
            # the fastest by the unrounded timing; "ms" is rounded to 0.01, so compare its value (two can tie there)
            assert t[case]["ms"][t[case]["kernel"]] == min(t[case]["ms"].values()) and set(t[case]["ms"]) <= set(kernels)
            for kernel in filter(E.kernel_available, kernels):
                chosen = E.CpuWeight(ws[0].dense, dict(E.default_kernels(), **{case: kernel}), ws[0].copies)
                x = torch.randn({"one_row": 1, "rows": 5, "prefill": E.FEW_ROWS + 3}[case], 128)
                assert E.family(x.shape[0]) == case
                assert torch.allclose(chosen.linear(x), x @ ws[0].dense.t(), atol=1e-3)
        monkeypatch.setenv("NEURON_NB_GEMM", "mkl")
        assert E.forced_kernel("rows") == E.forced_kernel("prefill") == "mkl"
        monkeypatch.setenv("NEURON_NB_PREFILL", "onednn")
        assert E.forced_kernel("prefill") == "onednn" and E.forced_kernel("one_row") is None
        monkeypatch.setenv("NEURON_NB_GEMV", "fast")
        with pytest.raises(ValueError, match="NEURON_NB_GEMV='fast': use one of"):
            E.forced_kernel("one_row")
    finally:
        torch.set_num_threads(before)


def test_cpu_weights_serve_the_f32_cpu_engine_only():
    from helpers.engine.cpu.kernel_choice import planned_kernels
    from helpers.engine.cpu.kernels import COPIES, CpuWeight
    from helpers.engine.model import Linear

    m = helpers.NeuronModel(None, batch_size=1, n_positions=128).to_neuron()
    ws = m.model.w.matrices()
    assert m.model.ops.kernels == planned_kernels() and m.model.w.layers[0].w2.dense.t().is_contiguous()
    assert all(isinstance(w, CpuWeight) and w.kernels == m.model.ops.kernels for w in ws)
    assert m.model.w.tied and m.model.w.embed is m.model.w.lm_head.dense  # SmolLM2's tied head: one tensor still
    for kind in COPIES:  # a kernel's copies only where a family runs that kernel
        kept = [kind in w.copies for w in ws]
        assert all(kept) if kind in m.model.ops.kernels.values() else not any(kept)
    m16 = helpers.NeuronModel(None, batch_size=1, n_positions=128, amp="bf16").to_neuron()
    assert m16.model.ops.record is None and all(type(w) is Linear for w in m16.model.w.matrices())


def test_a_weight_owns_its_copies():
    """A CpuWeight keeps the copies its kernels read and nothing else; they are freed with it; its traced form (a
    graph input) has none and falls back to oneDNN's linear on the weight itself."""
    import gc
    import weakref

    import helpers.engine.cpu.kernels as E

    assert E.weight_copy(E.column_major(torch.randn(50, 32)), "stream") is None  # 50 columns: no 16-column blocks
    if not E.kernel_available("packed"):
        pytest.skip("no oneDNN here")
    w = E.CpuWeight.build(torch.randn(64, 32), {"one_row": "mkl", "rows": "packed", "prefill": "packed"})
    assert set(w.copies) == {"packed"} and w.nbytes == 64 * 32 * 4
    x = torch.randn(3, 32)
    traced = w.traced(w.dense)
    assert traced.copies == {} and traced.kernels == w.kernels
    assert torch.allclose(w.linear(x), traced.linear(x), atol=1e-5)
    copy = weakref.ref(w.copies["packed"])
    del w, traced
    gc.collect()
    assert copy() is None


def test_copies_follow_the_models_kernels(monkeypatch):
    """A model keeps only the copies its own kernels read ("stream", "packed") and records its kernels."""
    import helpers.engine.cpu.kernels as E
    from helpers.engine.cpu.ops import use_cpu

    for env in E.MATMUL_ENV.values():
        monkeypatch.delenv(env, raising=False)
    for kernels, copies in (({"one_row": "split-k", "rows": "onednn", "prefill": "mkl"}, set()),
                            ({"one_row": "mkl", "rows": "packed", "prefill": "onednn"}, {"packed"}),
                            ({"one_row": "stream", "rows": "packed", "prefill": "packed"}, {"packed", "stream"})):
        if not all(E.kernel_available(k) for k in kernels.values()):
            continue
        tr = use_cpu(_tiny_transformer(), recorded=kernels)
        assert tr.ops.kernels == kernels
        assert not tr.w.tied and tr.w.embed.is_contiguous()  # the tiny model's own embedding: not relaid out
        for w in tr.w.matrices():
            assert w.kernels == kernels and set(w.copies) == copies, (kernels, w)


def _tiny_transformer():
    from helpers.engine.config import ModelArgs
    from helpers.engine.model import Comm, Transformer
    from helpers.engine.weights import shard_state
    from helpers.model_store import load_config, load_state_dict
    import tempfile
    from tiny_models import write_tiny

    d = tempfile.mkdtemp()
    write_tiny(d)
    args = ModelArgs.from_hf(load_config(d))
    return Transformer(args, shard_state(load_state_dict(d), args, torch.float32), Comm(), 1, 64,
                       torch.device("cpu"), torch.float32)


@pytest.mark.slow
def test_speculative_benchmark_quick(tmp_path):
    """ci/bench_speculative.py --quick: every row present, greedy speculation identical to plain,
    prompt lookup accepts most drafts when the answer is a quote (acceptance is deterministic)."""
    out = tmp_path / "spec.json"
    proc = subprocess.run([sys.executable, str(ROOT / "ci/bench_speculative.py"), "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 0
    rep = json.loads(out.read_text())
    assert rep["all_identical"]
    rows = {(r["task"], r["draft"], r["k"]): r for r in rep["rows"]}
    assert set(rows) == {(t, d, k) for t in ("quote", "open") for d in ("prompt_lookup", "truncated_4L") for k in (2, 4)}
    assert rows[("quote", "prompt_lookup", 4)]["acceptance_rate"] > 0.8
    for r in rep["rows"]:
        assert r["spec_tokens_per_s"] > 0 and r["plain_tokens_per_s"] > 0
        assert r["model_speedup"] > 0 and r["speedup_range"][0] <= r["speedup_range"][1]
    assert "speedup [range]" in proc.stdout and "best:" in proc.stdout
