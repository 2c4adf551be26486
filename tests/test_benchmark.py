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
    proc = subprocess.run([sys.executable, str(ROOT / "ci/benchmark.py"), "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 0
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow
def test_prints_every_figure_and_ratio(report):
    rep, text = report
    for needle in ("memory bandwidth", "engine (eager)", "HF generate()", "roofline", "engine_over_hf",
                   "engine_over_roofline", "goal (f32, batch 1", "engine's f32 matmul kernels"):
        assert needle in text
    assert set(rep["machine"]["matmul_kernels"]) == {"one_row", "rows"}
    bw = rep["bandwidth"]
    assert bw["roofline_gbs"] == max(bw["copy_gbs"]["median"], bw["read_gbs"]["median"]) > 0
    (r,) = rep["results"]
    assert r["engine"]["decode_tok_s"]["n"] == r["hf"]["decode_tok_s"]["n"] == 3
    for side in ("engine", "hf"):
        s = r[side]["decode_tok_s"]
        assert 0 < s["min"] <= s["median"] <= s["max"]
        assert r[side]["prefill_ms"]["median"] > 0


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
    from helpers.engine.kernels import column_major

    w = torch.randn(96, 64)
    c = column_major(w)
    assert c.shape == w.shape and torch.equal(c, w) and c.t().is_contiguous()
    x = torch.randn(3, 64)
    assert torch.allclose(torch.nn.functional.linear(x, c), x @ w.t(), atol=1e-5)


@pytest.mark.parametrize("kernel", ["split-k", "mkl"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("rows", [(1, 1), (1, 5), (4, 1), (2, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_cpu_linear_is_f_linear(threads, rows, bias, kernel, monkeypatch):
    """The engine's f32 CPU linear (either one-row kernel, oneDNN or MKL for several rows) computes
    F.linear, for every thread count, row count and bias; weights it does not handle (row-major,
    bf16) go to F.linear itself."""
    from helpers.engine.kernels import MATMUL_ENV, column_major, cpu_linear

    monkeypatch.setenv(MATMUL_ENV["one_row"], kernel)
    monkeypatch.setenv(MATMUL_ENV["rows"], "onednn" if kernel == "split-k" else "mkl")
    g = torch.Generator().manual_seed(sum(rows) + threads)
    w = torch.randn(150, 96, generator=g)  # 96 = 2 x 48 = 3 x 32; 150 out columns
    b = torch.randn(150, generator=g) if bias else None
    x = torch.randn(*rows, 96, generator=g)
    want = torch.nn.functional.linear(x, w, b)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_linear(x, column_major(w), b)
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-4, rtol=1e-4)
        assert torch.equal(cpu_linear(x, w, b), torch.nn.functional.linear(x, w, b))  # same threads
        xb, wb = x.bfloat16(), column_major(w.bfloat16())
        assert torch.equal(cpu_linear(xb, wb), torch.nn.functional.linear(xb, wb))
    finally:
        torch.set_num_threads(before)


def test_matmul_kernels_are_tuned_once_on_big_weights(monkeypatch):
    """tune_matmuls times the kernels on weights larger than the caches, once per thread count, and
    cpu_linear then runs the winners (any kernel computes F.linear); small weights skip the timing;
    $NEURON_NB_GEMV / $NEURON_NB_GEMM force a kernel and an unknown one is refused by name."""
    import helpers.engine.kernels as E

    for env in E.MATMUL_ENV.values():
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setattr(E, "matmul_tuning", {})
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        small = [E.column_major(torch.randn(64, 64))]
        assert E.tune_matmuls(small) is None and E.matmul_tuning == {}
        assert (E.matmul_kernel("one_row"), E.matmul_kernel("rows")) == ("split-k", "onednn")
        big = [E.column_major(torch.randn(4096, 2048)) for _ in range(3)]  # 3 x 32 MiB
        t = E.tune_matmuls(big, repeats=1)
        assert t["bytes"] == 3 * 4096 * 2048 * 4 and E.tune_matmuls(big) is t  # once per thread count
        for case, kernels in E.MATMUL_KERNELS.items():
            assert t[case]["kernel"] in kernels and set(t[case]["ms"]) <= set(kernels)
            assert E.matmul_kernel(case) == t[case]["kernel"]
        for case, kernels in E.MATMUL_KERNELS.items():
            for kernel in kernels:
                E.matmul_tuning[2] = dict(t, **{case: {"kernel": kernel}})
                x = torch.randn(1 if case == "one_row" else 5, 2048)
                assert torch.allclose(E.cpu_linear(x, big[0]), x @ big[0].t(), atol=1e-3)
        monkeypatch.setenv("NEURON_NB_GEMM", "mkl")
        assert E.matmul_kernel("rows") == "mkl"
        monkeypatch.setenv("NEURON_NB_GEMV", "fast")
        with pytest.raises(ValueError, match="NEURON_NB_GEMV='fast': use one of"):
            E.matmul_kernel("one_row")
    finally:
        torch.set_num_threads(before)


def test_cpu_linear_serves_the_f32_cpu_engine_only():
    from helpers.engine.kernels import cpu_linear

    m = helpers.NeuronModel(None, batch_size=1, n_positions=128).to_neuron()
    assert m.model.linear is cpu_linear and m.model.w.layers[0].w2.t().is_contiguous()
    m16 = helpers.NeuronModel(None, batch_size=1, n_positions=128, amp="bf16").to_neuron()
    assert m16.model.linear is torch.nn.functional.linear


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
