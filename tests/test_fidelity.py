"""ci/fidelity.py's own logic (offline: no pinned checkout needed) and the stand-ins' deviation table."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "ci"))
import fidelity  # noqa: E402

# Not through sys.path: tests/neuron_sim on it would make the stand-ins importable for every later test.
deviations = fidelity.load_deviations()

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="test.unit.modules.test_autobucketing" name="test_generate_buckets" time="0.1"/>
<testcase classname="test.unit.modules.test_autobucketing" name="test_generate_buckets_for_fused_spec" time="0.1">
  <failure message="boom">trace</failure></testcase>
<testcase classname="test.unit.models.test_model_wrapper" name="test_get_target_bucket" time="0.1">
  <error message="setup">trace</error></testcase>
<testcase classname="test.unit.modules.test_2d_bucketing.TestSync2DTokenGenBucketing" name="test_basic" time="0.1">
  <skipped message="no"/></testcase>
</testsuite></testsuites>"""


def test_junit_ids_and_status():
    r = fidelity.parse_junit(JUNIT)
    assert r == {
        "test/unit/modules/test_autobucketing.py::test_generate_buckets": "passed",
        "test/unit/modules/test_autobucketing.py::test_generate_buckets_for_fused_spec": "failed",
        "test/unit/models/test_model_wrapper.py::test_get_target_bucket": "failed",
        "test/unit/modules/test_2d_bucketing.py::TestSync2DTokenGenBucketing::test_basic": "skipped",
    }


def test_classify_counts_only_in_scope_failures():
    rep = fidelity.classify(fidelity.parse_junit(JUNIT))
    assert rep["passed"] == ["test/unit/modules/test_autobucketing.py::test_generate_buckets"]
    assert rep["failed"] == ["test/unit/models/test_model_wrapper.py::test_get_target_bucket"]  # in scope
    (tid, status, reason), = rep["out_of_scope"]
    assert tid.endswith("test_generate_buckets_for_fused_spec") and status == "failed" and "fused" in reason


def test_compare_separates_declared_from_undeclared():
    pinned = {"a": {"value": 1}, "pad_inputs shapes[x]": {"value": [1, 2]}, "b": {"raises": "ValueError",
                                                                                "message": "m"}}
    stand = {"a": {"value": 1}, "pad_inputs shapes[x]": {"value": [1, 1]}, "b": {"value": None}}
    declared = [("nxdi-pad-inputs-no-padding", re.compile(r"^pad_inputs shapes\["))]
    agree, known, unknown = fidelity.compare(pinned, stand, declared)
    assert agree == ["a"]
    assert [k[0] for k in known] == ["pad_inputs shapes[x]"] and known[0][3] == "nxdi-pad-inputs-no-padding"
    assert [k[0] for k in unknown] == ["b"]
    # a probe missing on one side is a divergence too
    _, _, unknown = fidelity.compare({"c": {"value": 1}}, {}, declared)
    assert unknown[0][0] == "c"


def test_outcome_records_value_or_exception():
    assert fidelity._outcome(lambda: [1, (2, 3)]) == {"value": [1, [2, 3]]}
    assert fidelity._outcome(lambda: 1 / 0) == {"raises": "ZeroDivisionError", "message": "division by zero"}


def test_absent_checkouts_are_skipped_not_failed(monkeypatch, capsys):
    for name in ("NXDI_SRC", "TNX_SRC", "NXD_SRC"):
        monkeypatch.delenv(name, raising=False)
    assert fidelity.main([]) == 0
    out = capsys.readouterr().out
    assert "[nxdi] SKIPPED: set NXDI_SRC" in out and "[tnx] SKIPPED: set TNX_SRC" in out


def test_stubs_stand_in_for_heavy_imports(tmp_path):
    finder = fidelity._HeavyFinder(None)
    assert finder.find_spec("json") is None  # only the heavy roots
    spec = finder.find_spec("torch_neuronx.utils")
    import importlib.util

    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.get_platform_target() == "trn1"  # answers as inf2/trn1, like the stand-in

    class Sub(mod.SomeBase):  # subclassable
        def f(self):
            return 3

    assert Sub().f() == 3

    @mod.nki_jit  # a decorator keeps the function
    def g():
        return 4

    assert g() == 4
    # a real module of the NxD checkout is executed, one that fails to import becomes a stub
    src = tmp_path / "src" / "neuronx_distributed" / "quantization"
    src.mkdir(parents=True)
    (src / "ok.py").write_text("VALUE = 7\n")
    (src / "bad.py").write_text("raise ImportError('needs torch_xla')\n")
    finder = fidelity._HeavyFinder(tmp_path)
    for name, check in (("neuronx_distributed.quantization.ok", lambda m: m.VALUE == 7),
                        ("neuronx_distributed.quantization.bad", lambda m: isinstance(m, fidelity._StubModule))):
        spec = finder.find_spec(name)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        assert check(m), name


# ------------------------------------------------------------------------------------------ deviation table
def test_deviation_rows_are_complete():
    ids = [d["id"] for d in deviations.DEVIATIONS]
    assert len(ids) == len(set(ids)) and ids
    for d in deviations.DEVIATIONS:
        assert d["stack"] in ("tnx", "nxdi", "both")
        for field in ("what", "why", "cannot_pass"):
            assert len(d[field]) > 20, (d["id"], field)
        for p in d.get("probes", ()):
            re.compile(p)


def test_deviation_markdown_is_current():
    assert (REPO / "tests" / "neuron_sim" / "DEVIATIONS.md").read_text() == deviations.render(), \
        "rerun: python tests/neuron_sim/deviations.py > tests/neuron_sim/DEVIATIONS.md"


def test_published_bugs_are_not_listed_as_deviations():
    """The tensor_capture_hook NameError is reproduced, not a deviation (the old docstring claimed one)."""
    text = (REPO / "tests" / "neuron_sim" / "neuronx_distributed_inference" / "utils" / "hf_adapter.py").read_text()
    assert "One deviation" not in text and '"tensor_capture_hook": tensor_capture_hook' in text
    assert not any("tensor_capture_hook" in d["what"] for d in deviations.DEVIATIONS)


@pytest.mark.parametrize("pattern,made_by,example", [
    (r"^routing\[(batch 1|speculation 4)\] \w+ rows=[23] sampling_params=rows$",
     'out[f"routing[{name}] {phase} rows={rows} sampling_params={sp}"]', "routing[batch 1] context rows=2 sampling_params=rows"),
    (r"^SpeculativeGenerator\[batch \d+( right-padded)?\]$", 'spec_case("batch 2 right-padded"',
     "SpeculativeGenerator[batch 2 right-padded]"),
    (r"^SpeculativeGenerator\[mask left-padded\]$", 'spec_case("mask left-padded"',
     "SpeculativeGenerator[mask left-padded]"),
])
def test_declared_probe_patterns_name_real_probes(pattern, made_by, example):
    source = (REPO / "ci" / "fidelity.py").read_text()
    assert made_by in source and re.search(pattern, example)
    declared = [p.pattern for d in deviations.DEVIATIONS for p in map(re.compile, d.get("probes", ()))]
    assert pattern in declared


def test_declared_probes_include_rows_for_both_stacks():
    ids = {i for i, _ in fidelity.declared_probes("tnx")}
    assert "not-transcribed" in ids and "tnx-silent-misread" in ids and "nxdi-pad-inputs-no-padding" not in ids
    # patterns too broad would hide a divergence: the batch-2 probe without a mask (both sides assert) is not named
    assert not any(p.search("SpeculativeGenerator[batch 2 without attention_mask]")
                   for _, p in fidelity.declared_probes("tnx"))


# ------------------------------------------------------------------------------------------ the loop probes' fake
def test_fake_model_is_deterministic_and_answers_the_loops_calls():
    torch = pytest.importorskip("torch")
    fake = fidelity._FakeLM(vocab=24, boost={(1, 3): 2})
    ids = torch.tensor([[5, 9, 3], [7, 1, 4]])
    a, b = fake(ids), fidelity._FakeLM(vocab=24, boost={(1, 3): 2})(ids)
    assert a.shape == (2, 24) and torch.equal(a, b)  # the same ids and positions give the same scores
    assert a[:, 0].eq(-float("inf")).all()  # the pad id is never proposed
    assert int(a[1].argmax()) == 2 and int(a[0].argmax()) != 2  # the boost: row 1's token at position 3
    # a right-padded row is read at its last real position (cache_ids = arange * mask)
    masked = fake(ids, torch.tensor([[0, 1, 2], [0, 1, 0]]))
    assert torch.equal(masked[0], a[0]) and torch.equal(masked[1], fake._scores(1, 1, 1))
    spec = fake.speculative_forward(ids, torch.tensor([0, 1, 2]), None, 3)
    assert spec.shape == (3, 24, 2) and torch.equal(spec[2, :, 0], a[0])
    assert [c[0] for c in fake.calls] == ["call", "call", "speculative_forward"]
    assert fidelity._FakeLM(emit_tokens=True)(ids).shape == (2, 1)
    fake.calls = [None] * fidelity._FakeLM.MAX_CALLS
    with pytest.raises(RuntimeError, match="too many calls"):
        fake(ids)


def test_loop_outcome_records_what_the_loop_showed():
    torch = pytest.importorskip("torch")
    streamer, stop = fidelity._Streamer(), fidelity._StopAfter(2)
    streamer.put(torch.tensor([[1], [2]]))
    streamer.end()
    assert [stop(torch.tensor([[4, 5]]), torch.zeros(1, 3)) for _ in range(2)] == [False, True]
    seen = fidelity._loop_outcome(lambda: torch.tensor([1]), None, streamer, [stop])["value"]
    assert seen["streamer"] == [["put", [[1], [2]]], "end"]
    assert seen["stopping_criteria_0"] == [[[[4, 5]], [1, 3]]] * 2 and "rng_after" in seen
    assert fidelity._loop_outcome(lambda: 1 / 0)["raises"] == "ZeroDivisionError"
