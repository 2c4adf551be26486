"""helpers.notebook.sharding's backend-independent measurements (the paths notebooks 01/02 take on Neuron)."""
import pytest
import torch

from functools import partial

import helpers
from helpers.notebook import sharding as tp_report
from helpers.planning import memory as planner
from helpers.prompts import encode_prompts

SMOLLM2 = planner.Shape.from_config(planner.load_model_config("embedded"))


def test_neuron_tp_degrees_per_family():
    ok, skipped = tp_report.neuron_tp_degrees([1, 2, 3, 8, 24], "inf2")
    assert ok == [1, 2, 8, 24] and set(skipped) == {3} and "inf2" in skipped[3]
    ok, skipped = tp_report.neuron_tp_degrees([1, 2, 3, 16], "trn1")
    assert ok == [1, 2, 16] and set(skipped) == {3}


def test_token_agreement():
    a = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    assert tp_report.token_agreement(a, a.clone()) == {"tokens_equal": True, "agree_positions": 4,
                                                        "compared_positions": 4}
    b = a.clone()
    b[1, 2] = 9
    assert tp_report.token_agreement(b, a) == {"tokens_equal": False, "agree_positions": 2, "compared_positions": 4}
    assert tp_report.token_agreement(a[:, :3], a)["agree_positions"] == 3  # stopped early: the shorter length


def test_run_greedy_on_the_reference_engine(tokenizer):
    enc = encode_prompts(tokenizer, ["Say hi."], 1)
    bk = helpers.resolve_backend("reference")
    build = partial(helpers.build_model, bk, None, n_positions=128)
    r = tp_report.run_greedy(build, 1, enc, 4, repeats=2)
    oracle = build().sample(enc.input_ids, enc.input_ids.shape[1] + 4, top_k=1,
                                                                   attention_mask=enc.attention_mask)
    assert torch.equal(r["tokens"], oracle)
    assert r["itl_s"] > 0 and r["ttft_s"] > 0 and r["s_per_token"] > 0


class NoTokenTimes:
    """Like NxD Inference's adapter behind helpers.neuron: no per-token times, ttft_s None."""
    build_s = 1.5

    def sample(self, ids, sequence_length, **kwargs):
        n = sequence_length - ids.shape[1]
        self.stats = {"new_tokens": n, "total_s": 0.2 * n, "token_times_s": [], "ttft_s": None}
        return torch.cat([ids, torch.full((ids.shape[0], n), 5)], dim=1)


def test_run_greedy_without_token_times(tokenizer):
    enc = encode_prompts(tokenizer, ["Say hi."], 1)
    r = tp_report.run_greedy(lambda **kw: NoTokenTimes(), 2, enc, 5)
    assert r["itl_s"] is None and r["ttft_s"] is None and r["s_per_token"] == pytest.approx(0.2)
    assert r["tp"] == 2 and r["build_s"] == 1.5 and r["tokens"].shape[1] == enc.input_ids.shape[1] + 5


def test_latency_summary_reference_and_neuron_runs():
    ref = {1: {"itl_s": 0.010}, 2: {"itl_s": 0.015, "all_reduce_s": 1e-4, "collectives_per_step": 61}}
    s = tp_report.latency_summary(ref)
    assert s["key"] == "itl_ms" and s["ms"] == pytest.approx({1: 10.0, 2: 15.0})
    assert s["comm_ms"] == pytest.approx({1: 0.0, 2: 6.1})
    nxdi = {1: {"itl_s": None, "s_per_token": 0.02}, 2: {"itl_s": None, "s_per_token": 0.03}}
    s = tp_report.latency_summary(nxdi)
    assert s["key"] == "ms_per_token" and s["ms"] == pytest.approx({1: 20.0, 2: 30.0}) and s["comm_ms"] == {}
    assert "prompt included" in s["what"]


class FakeLibrary:
    """run_greedy stand-in: records each build; tokens differ from tp=1 only for a chosen (tp, strategy)."""

    def __init__(self, wrong=None):
        self.builds, self.wrong = [], wrong

    def __call__(self, build, tp, enc, max_new_tokens, repeats=1, gqa=None, **settings):
        self.builds.append((tp, settings["batch_size"], getattr(gqa, "value", gqa)))
        tokens = torch.cat([enc.input_ids, torch.full((enc.input_ids.shape[0], max_new_tokens), 3)], dim=1)
        if (tp, getattr(gqa, "value", gqa)) == self.wrong:
            tokens[:, -1] = 4
        return {"tokens": tokens}


def test_library_sweep_tnx_builds_each_layout_once_and_compares_tokens(monkeypatch, tokenizer):
    fake = FakeLibrary(wrong=(1, "replicated-heads"))
    monkeypatch.setattr(tp_report, "run_greedy", fake)
    encode = lambda b: encode_prompts(tokenizer, ["Hi."], b)  # noqa: E731
    rows = tp_report.library_sweep(None, SMOLLM2, "tnx", [1, 2], [1], encode, 3)
    assert len(rows) == 10  # 2 tp x 5 requests
    built = [r for r in rows if r.get("built") == "yes"]
    assert len(fake.builds) == 1 + len(built)  # the tp=1 reference, then one build per distinct layout
    assert len(set(fake.builds)) == len(fake.builds)
    bad = [r for r in rows if r["status"] == "ok" and not r["tokens_equal"]]
    assert [(r["tp"], r["requested"]) for r in bad] == [(1, "replicated-heads")]  # built once, at tp=1
    assert all(r["status"] in ("ok", "rejected") for r in rows)
    # at tp=2 every tnx request falls back to REPLICATED_HEADS (3 KV heads): one build serves all five
    assert sum(1 for tp, _, _ in fake.builds if tp == 2) == 1


def test_library_sweep_nxdi_has_no_knob(monkeypatch, tokenizer):
    from helpers.planning.gqa import GQA

    fake = FakeLibrary()
    monkeypatch.setattr(tp_report, "run_greedy", fake)
    encode = lambda b: encode_prompts(tokenizer, ["Hi."], b)  # noqa: E731
    rows = tp_report.library_sweep(None, SMOLLM2, "nxdi", [1, 2], [1, 2], encode, 3,
                                   extra_cases=[(3, 3, GQA.SHARD_OVER_BATCH)])
    assert [(r["tp"], r["batch"]) for r in rows] == [(1, 1), (2, 1), (1, 2), (2, 2)]  # no tnx-only extra case
    assert all(r["requested"] == "nxdi: no knob" and r["tokens_equal"] for r in rows)
    assert all(gqa is None for _, _, gqa in fake.builds)  # no GQA keyword reaches NxD Inference


def test_tp_rules_lists_the_degrees_that_divide_the_heads():
    rows = {r["model"]: r for r in tp_report.tp_rules(["embedded", "Llama-3.1-70B"])}
    smol, llama = rows["SmolLM2-135M-Instruct"], rows["Llama-3.1-70B"]
    assert smol["q/kv heads"] == "9/3" and llama["q/kv heads"] == "64/8"
    # inf2 runs 1, 2, 4, 8, 24 (both guides): 9 heads divide by 1 only; 64 by all but 24 (8 zero heads: 72)
    assert smol["inf2 (1, 2, 4, 8, 24)"] == "1 | pads 2(+1) 4(+3) 8(+7) 24(+15)"
    assert llama["inf2 (1, 2, 4, 8, 24)"] == "1 2 4 8 | pads 24(+8)"
    assert llama["trn1 (1, 2, 8, 16, 32)"] == "1 2 8 16 32"


def test_off_neuron_degrees():
    assert tp_report.off_neuron_degrees([1, 2, 3, 4, 6, 24, 64]) == [3, 6]


def test_workload_plans_large_batch_shards_over_batch():
    rows = tp_report.workload_plans("Llama-3.1-70B", 32, [1, 32])
    get = {(r["batch"], r["library"], r["requested"]): r for r in rows}
    # 8 KV heads at tp=32: shard-over-heads falls back to replicated heads (one KV head per core)
    assert get[(1, "tnx", "shard-over-heads")]["resolved"] == "replicated-heads"
    # batch 1: shard-over-batch is not possible (1 % 32) and every strategy holds the same KV cache
    assert get[(1, "tnx", "shard-over-batch")]["resolved"] == "replicated-heads"
    assert len({r["KV GiB/core"] for r in rows if r["batch"] == 1}) == 1
    # batch 32: shard-over-batch keeps all 8 KV heads for 1 row per core: a quarter of the replicated cache
    sob, rep = get[(32, "tnx", "shard-over-batch")], get[(32, "tnx", "replicated-heads")]
    assert sob["resolved"] == "shard-over-batch" and sob["KV GiB/core"] * 4 == rep["KV GiB/core"]
    assert get[(32, "nxdi", "default")]["resolved"] == "replicate-to-tp-degree"
    assert get[(32, "tnx", "all-gather-heads")]["guide: for"] == "large batch, without replication"


class FakeEngine:
    """run_greedy stand-in on the reference engine: one KV head-row per rank costs 1 MiB; SHARD_OVER_BATCH is slower (all-to-all)."""

    def __init__(self):
        self.builds = []

    def __call__(self, build, tp, enc, max_new_tokens, repeats=1, gqa=None, batch_size=1, **kw):
        from helpers.planning.gqa import resolve_layout
        lay = resolve_layout(9, 3, 64, tp, batch_size, gqa)
        self.builds.append((tp, batch_size, lay.name))
        rows = lay.batch_rows_per_rank
        tokens = torch.cat([enc.input_ids, torch.full((enc.input_ids.shape[0], max_new_tokens), 3)], dim=1)
        return {"tokens": tokens, "logits": torch.zeros(batch_size, 8), "itl_s": 0.010 * (2 if lay.kv_mode == "batch" else 1),
                "ranks": [{"kv_bytes": rows * lay.kv_heads_per_rank * 2 ** 20, "kv_cache_shape": [rows]}] * tp}


def test_strategy_sweep_and_costs_per_workload(monkeypatch, tokenizer):
    from helpers.planning.gqa import GQA

    fake = FakeEngine()
    monkeypatch.setattr(tp_report, "run_greedy", fake)
    encode = lambda b: encode_prompts(tokenizer, ["Hi."], b)  # noqa: E731
    rows = tp_report.strategy_sweep(None, SMOLLM2, [1, 3], [1, 3], encode, 3, requests=tp_report.TNX_REQUESTS,
                                    extra_cases=[(3, 3, GQA.SHARD_OVER_BATCH)])  # already in the grid: not repeated
    assert len(rows) == 2 * 2 * 5 and all(r["status"] == "ok" and r["tokens_equal"] for r in rows)
    costs = tp_report.strategy_costs(rows)
    assert [(c["batch"], c["tp"], c["layout"]) for c in costs] == [
        (1, 1, "replicated-heads"), (1, 1, "shard-over-heads"), (1, 3, "shard-over-heads"),
        (3, 1, "replicated-heads"), (3, 1, "shard-over-heads"), (3, 3, "shard-over-batch"), (3, 3, "shard-over-heads")]
    assert len(fake.builds) == len(costs)  # one build per distinct layout
    by = {(c["batch"], c["tp"], c["layout"]): c for c in costs}
    sob, soh = by[(3, 3, "shard-over-batch")], by[(3, 3, "shard-over-heads")]
    assert sob["extra_collectives_per_layer"] == "4 all-to-all" and soh["extra_collectives_per_layer"] == ""
    assert sob["kv_mib_per_rank"] == soh["kv_mib_per_rank"] == 3  # 3 heads x 1 row == 1 head x 3 rows
    assert sob["itl_ms"] == 20 and soh["tokens_per_s"] == 300
    # at tp=3 every request but shard-over-batch ends in shard-over-heads (3 KV heads divide by 3)
    assert soh["requests"] == "default, shard-over-heads, replicated-heads, all-gather-heads"
    assert by[(1, 1, "replicated-heads")]["kv_mib_per_rank"] == 9  # tp=1: replicated up to the 9 query heads


def test_plot_strategy_costs_one_row_per_workload():
    import matplotlib

    matplotlib.use("Agg")
    costs = [{"batch": b, "tp": tp, "layout": name, "kv_mode": mode, "itl_ms": 10.0, "tokens_per_s": 100.0 * b,
              "kv_mib_per_rank": 1.0, "extra_collectives_per_layer": tp_report.EXTRA_COLLECTIVES[mode], "requests": ""}
             for b, tp, name, mode in [(1, 1, "shard-over-heads", "heads"), (3, 3, "shard-over-batch", "batch"),
                                       (3, 3, "shard-over-heads", "heads")]]
    fig = tp_report.plot_strategy_costs(costs, "title")
    assert len(fig.axes) == 4  # (latency, KV) x 2 workloads
    labels = [t.get_text() for t in fig.axes[2].get_xticklabels()]
    assert labels == ["tp=3\nshard-over-batch\n+4 all-to-all/layer", "tp=3\nshard-over-heads"]


def test_latency_summary_keeps_the_spread_of_the_repeats():
    s = tp_report.latency_summary({1: {"itl_s": 0.010, "itl_samples_s": [0.009, 0.010, 0.013]}, 2: {"itl_s": 0.02}})
    assert (s["spread"][1].low, s["spread"][1].median, s["spread"][1].high) == (0.009, 0.010, 0.013)
    assert s["spread"][2].n == 1 and s["spread"][2].median == 0.02  # no samples kept: the median alone


def test_strategy_costs_carry_the_range_of_the_repeats():
    row = {"status": "ok", "layout": (1, "shard-over-heads", "heads"), "batch": 1, "first": "default@tp1b1",
           "itl_ms": 10.0, "itl_samples_ms": [9.0, 10.0, 14.0], "rank_kv_bytes": [2 ** 20], "requested": "default"}
    c, = tp_report.strategy_costs([row])
    assert (c["itl_min_ms"], c["itl_ms"], c["itl_max_ms"]) == (9.0, 10.0, 14.0)
    assert c["itl_samples_ms"] == [9.0, 10.0, 14.0]


def test_strategy_table_says_predicted_to_fail_and_why():
    reasons = {}
    rows = tp_report.strategy_table(["embedded", "Llama-3.1-8B"], [2, 24], [1], reasons)
    cells = [v for r in rows for k, v in r.items() if ":" in k]
    assert "error" not in cells and any(v.startswith("predicted to fail [") for v in cells)
    assert reasons and all(isinstance(k, int) and v for k, v in reasons.items())
    llama24 = next(r for r in rows if r["model"] == "Llama-3.1-8B" and r["tp"] == 24)
    assert llama24["tnx:default"].startswith("replicated-heads")  # 32 heads padded to 48: it builds


def test_n_positions_fit_shows_where_the_reserve_draws_the_line():
    f = tp_report.n_positions_fit("Mistral-7B-Instruct-v0.2", "inf2.xlarge", 1, [2048, 4096], batch_size=1, amp="bf16")
    with_reserve, without = f["largest_fitting"][planner.RUNTIME_RESERVE], f["largest_fitting"][0.0]
    assert 2048 <= with_reserve < 4096 < 16384 < without  # reference 000's 4096 is refused only by the reserve
    kw = dict(batch_size=1, amp="bf16")
    assert planner.plan("Mistral-7B-Instruct-v0.2", 1, n_positions=with_reserve, **kw).fits("inf2.xlarge")
    assert not planner.plan("Mistral-7B-Instruct-v0.2", 1, n_positions=with_reserve + 1, **kw).fits("inf2.xlarge")
    assert f["usable_gib"][0.0] == 16 and f["gib"][0] < f["gib"][1]
