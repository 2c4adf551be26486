"""Continuous batching (helpers.serving): KV-cache slots with per-row positions, the schedulers, the traffic.

Oracle: every request's greedy tokens, served statically or continuously at any slot count, equal the tokens of
the same request run alone (batch 1 ``sample()``), and, on a tiny Llama, Hugging Face ``generate()``.
"""
from __future__ import annotations

import pytest
import torch

from helpers import NeuronModel
from helpers.engine.generation import CausalLM
from helpers.engine.kv_cache import KVCache
from helpers.engine.model import Transformer
from helpers.serving import build_slot_model, run_alone, run_continuous, run_static, sample_traffic
from helpers.serving.scheduler import ServingClock, left_padded, mismatches, timeline
from helpers.serving.slots import SlotKVCache, SlotModel
from helpers.serving.traffic import Request, traffic_summary
from tiny_models import write_tiny

N_POS = 128


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    hf = write_tiny(path)
    return str(path), hf


@pytest.fixture(scope="module")
def traffic():
    return sample_traffic(10, 50.0, [3, 20], [1, 6], [20, 30], 0.3, vocab_size=256, seed=3)


@pytest.fixture(scope="module")
def oracle(tiny, traffic):
    alone = NeuronModel.from_pretrained(tiny[0], batch_size=1, n_positions=N_POS).to_neuron()
    return run_alone(alone, traffic)


def test_traffic_is_seeded_poisson_and_mixed():
    a = sample_traffic(200, 4.0, [5, 9], [1, 3], [40, 50], 0.25, vocab_size=100, seed=1)
    b = sample_traffic(200, 4.0, [5, 9], [1, 3], [40, 50], 0.25, vocab_size=100, seed=1)
    assert [(r.arrival_s, r.max_new_tokens) for r in a] == [(r.arrival_s, r.max_new_tokens) for r in b]
    assert all(torch.equal(x.prompt, y.prompt) for x, y in zip(a, b))
    assert a[0].arrival_s == 0 and all(x.arrival_s <= y.arrival_s for x, y in zip(a, a[1:]))
    s = traffic_summary(a)
    assert 2.5 < s["offered_rate_per_s"] < 6 and all(5 <= r.prompt_len <= 9 for r in a)
    longs = sum(r.max_new_tokens >= 40 for r in a)
    assert 25 < longs < 80 and all(r.max_new_tokens <= 3 or r.max_new_tokens >= 40 for r in a)


@pytest.mark.parametrize("kw,msg", [(dict(n_requests=0), "n_requests"), (dict(arrival_rate=0), "arrival_rate"),
                                    (dict(long_share=1.5), "long_share"), (dict(prompt_len=[9, 5]), "prompt_len")])
def test_traffic_refuses_bad_parameters(kw, msg):
    args = dict(n_requests=3, arrival_rate=1.0, prompt_len=[1, 4], short_output=[1, 2], long_output=[3, 4],
                long_share=0.5, vocab_size=10)
    with pytest.raises(ValueError, match=msg):
        sample_traffic(**{**args, **kw})


def test_slot_model_is_the_engine_with_per_row_writes(tiny):
    m = build_slot_model(tiny[0], n_slots=3, n_positions=N_POS)
    assert isinstance(m, CausalLM) and type(m.model) is Transformer and m.n_slots == 3
    assert isinstance(m.model.cache, SlotKVCache)  # the serving floor extends the cache, not the attention
    assert CausalLM.cache_cls is KVCache  # the engine's default is unchanged
    with pytest.raises(ValueError, match="one prompt"):
        m.prefill(0, torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="slot 3"):
        m.prefill(3, torch.ones(4, dtype=torch.long))
    with pytest.raises(ValueError, match="one token and one position per slot"):
        m.decode(torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match="tp_degree=1"):
        build_slot_model(tiny[0], n_slots=2, n_positions=N_POS, tp_degree=2)


def test_slots_at_different_positions_match_each_request_alone(tiny):
    """Two requests entering at different steps, a free slot between them: each equals its run alone."""
    m = build_slot_model(tiny[0], n_slots=3, n_positions=N_POS)
    alone = NeuronModel.from_pretrained(tiny[0], batch_size=1, n_positions=N_POS).to_neuron()
    p0, p2 = torch.tensor([5, 9, 33, 7, 1, 80, 12]), torch.tensor([44, 3, 100])
    tok, pos = torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long)
    got = {0: [int(m.prefill(0, p0).argmax())], 2: []}
    tok[0], pos[0] = got[0][0], len(p0)
    for step in range(12):
        if step == 4:
            got[2].append(int(m.prefill(2, p2).argmax()))
            tok[2], pos[2] = got[2][0], len(p2)
        nxt = m.decode(tok, pos).argmax(-1)
        for s in got:
            if s == 0 or step >= 4:
                got[s].append(int(nxt[s]))
        tok, pos = nxt, pos + 1
    for s, p in ((0, p0), (2, p2)):
        ref = alone.sample(p[None], len(p) + len(got[s]), top_k=1, eos_token_override=[])[0, len(p):].tolist()
        assert got[s] == ref


@pytest.mark.parametrize("n_slots", [1, 2, 4])
def test_continuous_batching_equals_alone(tiny, traffic, oracle, n_slots):
    m = build_slot_model(tiny[0], n_slots=n_slots, n_positions=N_POS)
    r = run_continuous(m, traffic)
    assert mismatches(r.outputs(), oracle) == []
    assert all(len(s.tokens) == q.max_new_tokens for s, q in zip(r.served, traffic))
    # every request got a slot, and a slot holds one request at a time
    spans = sorted(timeline(r))
    for a, b in zip(spans, spans[1:]):
        if a[0] == b[0]:
            assert a[4] <= b[2] + 1e-12, (a, b)
    s = r.summary()
    assert s["tokens"] == sum(q.max_new_tokens for q in traffic) and s["throughput_tok_s"] > 0
    assert all(x.arrival_s <= x.admitted_s <= x.first_token_s <= x.finished_s for x in r.served)


def test_static_batching_equals_alone_and_waits_for_full_batches(tiny, traffic, oracle):
    m = build_slot_model(tiny[0], n_slots=4, n_positions=N_POS)
    r = run_static(m, traffic)
    assert mismatches(r.outputs(), oracle) == []
    assert r.steps == 3  # 10 requests in batches of 4, 4, 2 (the last one when no more will arrive)
    by_batch = {}
    for s in r.served:
        by_batch.setdefault(s.admitted_s, []).append(s)
    assert sorted(len(v) for v in by_batch.values()) == [2, 4, 4]
    for v in by_batch.values():  # a batch returns together, after its longest answer
        assert len({s.finished_s for s in v}) == 1
        assert all(s.first_token_s <= s.last_token_s <= s.finished_s for s in v)
        longest = max(v, key=lambda s: len(s.tokens))
        assert all(s.last_token_s <= longest.last_token_s for s in v)


def test_greedy_matches_hugging_face(tiny, traffic, oracle):
    hf = tiny[1]
    for r in traffic[:3]:
        with torch.inference_mode():
            out = hf.generate(r.prompt[None], attention_mask=torch.ones(1, r.prompt_len, dtype=torch.long),
                              max_new_tokens=r.max_new_tokens, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, r.prompt_len:].tolist()
        assert out == oracle[r.rid][:len(out)] and len(out) >= 1


def test_requests_that_do_not_fit_are_refused_before_any_work(tiny):
    m = build_slot_model(tiny[0], n_slots=2, n_positions=N_POS)
    big = [Request(0, 0.0, torch.ones(20, dtype=torch.long), N_POS)]
    for run in (run_continuous, run_static):
        with pytest.raises(ValueError, match="do not fit"):
            run(m, big)
    with pytest.raises(ValueError, match="batch_size=1"):
        run_alone(m, big)


def test_clock_counts_engine_time_and_jumps_idle_gaps():
    c = ServingClock()
    c.idle_until(2.0)
    c.run(lambda: sum(range(1000)))
    assert c.now > 2.0 and 0 < c.busy < 1 and c.calls == 1
    c.idle_until(1.0)  # never backwards
    assert c.now > 2.0


def test_left_padding_fills_a_short_batch():
    reqs = [Request(0, 0.0, torch.tensor([4, 5]), 1), Request(1, 0.0, torch.tensor([7, 8, 9]), 1)]
    ids, mask = left_padded(reqs, 3)
    assert ids.tolist() == [[0, 4, 5], [7, 8, 9], [0, 4, 5]] and mask.tolist() == [[0, 1, 1], [1, 1, 1], [0, 1, 1]]


def test_engine_sample_still_works_on_a_slot_model(tiny):
    m = build_slot_model(tiny[0], n_slots=2, n_positions=N_POS)
    ref = NeuronModel.from_pretrained(tiny[0], batch_size=2, n_positions=N_POS).to_neuron()
    ids = torch.tensor([[3, 4, 5, 6], [9, 8, 7, 6]])
    assert torch.equal(m.sample(ids, 12, top_k=1, eos_token_override=[]),
                       ref.sample(ids, 12, top_k=1, eos_token_override=[]))
    assert isinstance(m, SlotModel)


def test_plots_draw_both_policies(tiny, traffic):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.serving.plots import plot_policies, plot_slots

    m = build_slot_model(tiny[0], n_slots=2, n_positions=N_POS)
    runs = [run_static(m, traffic), run_continuous(m, traffic)]
    fig, axes = plt.subplots(1, 2)
    for ax, r in zip(axes, runs):
        plot_slots(ax, r, 10.0)
    assert len(axes[0].patches) >= len(traffic) * 2  # prefill + decode bars, and held rows for static
    fig2, axes2 = plt.subplots(1, 3)
    plot_policies(axes2, [r.summary() for r in runs])
    assert [t.get_text() for t in axes2[0].get_xticklabels()] == ["static 2", "continuous 2"]
    plt.close(fig), plt.close(fig2)


def test_static_batch_timeout_starts_a_short_batch_after_max_wait(tiny, traffic, oracle):
    m = build_slot_model(tiny[0], n_slots=4, n_positions=N_POS)
    spaced = [Request(r.rid, 10.0 * r.rid, r.prompt, r.max_new_tokens) for r in traffic[:3]]  # 10 s apart
    r = run_static(m, spaced, max_wait_s=0.5)
    assert r.steps == 3 and mismatches(r.outputs(), {q.rid: oracle[q.rid] for q in spaced}) == []
    waits = [s.admitted_s - s.arrival_s for s in r.served]  # each alone in its batch: started by the timeout on an
    assert waits[:2] == [pytest.approx(0.5)] * 2 and waits[2] == 0  # idle server; the last when no more will arrive
    full = run_static(m, spaced)  # no timeout: the first two wait for the last arrival
    assert full.steps == 1 and full.summary()["wait_max_s"] == pytest.approx(20.0)
    assert run_static(m, traffic, max_wait_s=1e9).steps == 3  # a timeout never reached: full batches as before
    with pytest.raises(ValueError, match="max_wait_s"):
        run_static(m, traffic, max_wait_s=-1)


def test_summary_reports_median_and_max_not_a_p99_of_a_few_requests(tiny, traffic):
    m = build_slot_model(tiny[0], n_slots=2, n_positions=N_POS)
    s = run_continuous(m, traffic).summary()
    assert s["n"] == len(traffic) and not any("p99" in k for k in s)
    assert s["ttft_median_s"] <= s["ttft_max_s"] and s["latency_median_s"] <= s["latency_max_s"]
    assert 0 <= s["wait_median_s"] <= s["wait_max_s"]


def test_policy_plot_draws_spreads_of_repeats_as_error_bars():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.notebook.figures import Spread
    from helpers.serving.plots import plot_policies

    keys = ("throughput_tok_s", "ttft_median_s", "ttft_max_s", "latency_median_s", "latency_max_s")
    rows = [{"policy": p, "slots": 4, "n": 24, **{k: Spread([1.0, 2.0, 4.0]) for k in keys}}
            for p in ("static", "continuous")]
    fig, axes = plt.subplots(1, 3)
    plot_policies(axes, rows)
    assert [b.get_height() for b in axes[0].patches] == [2.0, 2.0]  # the median
    segs = axes[0].collections[0].get_segments()  # the min-max error bars
    assert [(s[0][1], s[1][1]) for s in segs] == [(1.0, 4.0), (1.0, 4.0)]
    assert "max of 24 requests" in [t.get_text() for t in axes[1].get_legend().get_texts()]
    plt.close(fig)
