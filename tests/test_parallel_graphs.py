"""Compiled graphs and save/load with tensor parallelism (helpers.parallel + helpers.artifacts).

Each rank builds, saves and loads its own graphs (``graphs-rank{r}.json``, ``*-rank{r}-<fingerprint>.pt2``,
``weights/tp{r}_sharded_checkpoint.safetensors``). Oracle: the eager tp=2 engine on the same prompt (and
tp=1 for the tokens). A tiny random Llama with SmolLM2's head shape (9 query / 3 KV heads: at tp=2 the
query heads are padded to 10 and the KV heads replicated, so each rank's graph maps heads through
``kv_group``) keeps every build to seconds.
"""
from __future__ import annotations

import json
import re
import shutil
import warnings

import pytest
import torch

import helpers
from helpers.artifacts import graphs as gr
from helpers.artifacts import manifest as mf
from helpers.artifacts import serialization
from helpers.engine.config import NeuronConfig
from helpers.parallel import ParallelModel
from tiny_models import write_tiny

KW = dict(batch_size=2, n_positions=128)  # token bucket [128], context bucket [64]: 4 graphs per rank
PROMPT, NEW = 20, 12
GRAPHS = ["context64.attn", "mlp.t1", "mlp.t64", "token128.attn"]


@pytest.fixture(autouse=True, scope="module")
def one_thread_per_rank():
    """As tests/test_parallel.py: one thread here and in each rank (no oversubscription on 2 cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny9x3")
    write_tiny(path, hidden_size=72, intermediate_size=96, num_attention_heads=9, num_key_value_heads=3)
    return path


def _ids():
    return torch.randint(3, 256, (2, PROMPT), generator=torch.Generator().manual_seed(1))


def _sample(model):
    out = model.sample(_ids(), PROMPT + NEW, top_k=1, eos_token_override=[], output_logits=True)
    return out, model.stats["logits"]


def _model(path, tp=2, cls=ParallelModel, **kw):
    settings = {**KW, **kw}
    nc = NeuronConfig(**{k: settings.pop(k) for k in ("compiled", "on_device_embedding", "group_query_attention")
                         if k in settings})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the KV replication fallback warning (3 KV heads at tp=2)
        return cls.from_pretrained(path, tp_degree=tp, neuron_config=nc, **settings)


@pytest.fixture(scope="module")
def eager(tiny):
    m = _model(tiny).to_neuron()
    yield m, _sample(m)
    m.close()


@pytest.fixture(scope="module")
def built(tiny):
    m = _model(tiny, compiled="export", on_device_embedding=True).to_neuron()
    yield m, _sample(m)
    m.close()


@pytest.fixture(scope="module")
def saved(built, tmp_path_factory):
    d = tmp_path_factory.mktemp("tp2") / "artifacts"
    return d, built[0].save(d, sharded_weights=True)


def test_each_rank_builds_its_graphs_and_reports_their_seconds(built):
    m, _ = built
    assert sorted(r["graph"] for r in m.build_report) == GRAPHS
    for r in m.build_report:
        assert r["artifact"] == "export" and len(r["rank_seconds"]) == 2
        assert all(s > 0 for s in r["rank_seconds"]) and r["seconds"] == pytest.approx(sum(r["rank_seconds"]) / 2)
    assert all(len(rep["build_report"]) == 4 for rep in m.rank_reports)


def test_compiled_tp2_equals_eager_tp2_and_tp1(built, eager, tiny):
    out, logits = built[1]
    want, want_logits = eager[1]
    assert torch.equal(out, want)
    assert torch.allclose(logits, want_logits, atol=1e-5, rtol=0)
    ref = _model(tiny, tp=1, cls=helpers.NeuronModel).to_neuron()
    assert torch.equal(_sample(ref)[0], out)


def test_save_writes_every_rank(saved):
    d, info = saved
    assert info["graphs"] == 8 and len(info["rank_bytes"]) == 2 and info["bytes"] == sum(info["rank_bytes"])
    for r in range(2):
        manifest = json.loads((d / f"graphs-rank{r}.json").read_text())
        assert manifest["fields"]["rank"] == r and manifest["fields"]["tp_degree"] == 2
        assert sorted(e["unit"] for e in manifest["graphs"]) == GRAPHS
        assert all(f"-rank{r}-" in e["file"] and (d / e["file"]).is_file() for e in manifest["graphs"])
        assert (d / "weights" / f"tp{r}_sharded_checkpoint.safetensors").is_file()
    assert json.loads((d / "config.json").read_text())["is_presharded_checkpoint"] is True
    kernels = [json.loads((d / f"graphs-rank{r}.json").read_text())["matmul_kernels"] for r in range(2)]
    assert set(kernels[0]) == {"one_row", "rows", "prefill", "ops"} and kernels[1] == kernels[0]  # one machine, one choice


def test_load_round_trip_skips_compilation(saved, built, tiny):
    d, _ = saved
    out, logits = built[1]
    for weights in (tiny, d):  # the original checkpoint, then the presharded weights as saved
        m = _model(weights, on_device_embedding=True).load(d)  # eager config: the saved graphs decide
        assert m.presharded == (weights == d)
        with m.to_neuron():
            assert [r["graph"] for r in m.build_report] == [r["graph"] for r in built[0].build_report]
            assert all(r["loaded"] and r["artifact"] == "export" for r in m.build_report)
            out2, logits2 = _sample(m)
        assert torch.equal(out2, out) and torch.equal(logits2, logits)


def test_nxdi_compile_then_parallel_from_compiled_starts_the_ranks(built, tmp_path):
    out, _ = built[1]
    built[0].compile(tmp_path / "nxdi", save_sharded_checkpoint=True)
    assert not json.loads((tmp_path / "nxdi" / "config.json").read_text())["is_presharded_checkpoint"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the KV replication fallback warning
        with pytest.raises(ValueError, match="helpers.parallel.ParallelModel"):
            helpers.NeuronModel.from_compiled(tmp_path / "nxdi")  # tp_degree=2 recorded: the parallel class only
        m = ParallelModel.from_compiled(tmp_path / "nxdi")
    with m:
        assert isinstance(m, ParallelModel) and m.tp_degree == 2 and m.presharded
        assert all(r["loaded"] for r in m.build_report)
        assert torch.equal(_sample(m)[0], out)


def test_another_tp_degree_is_refused_both_ways(saved, tiny, tmp_path):
    d, _ = saved
    with pytest.raises(gr.ArtifactMismatchError, match="tp_degree: saved 2, now 1"):
        _model(tiny, tp=1, cls=helpers.NeuronModel).load(d)
    with pytest.raises(gr.ArtifactMismatchError, match="presharded weights .* tp_degree: saved 2, now 1"):
        _model(d, tp=1, cls=helpers.NeuronModel, on_device_embedding=True).to_neuron()
    tp1 = _model(tiny, tp=1, cls=helpers.NeuronModel, compiled="export", on_device_embedding=True).to_neuron()
    tp1.save(tmp_path / "tp1", sharded_weights=True)
    with pytest.raises(gr.ArtifactMismatchError, match="tp_degree: saved 1, now 2"):
        _model(tiny).load(tmp_path / "tp1")
    m = _model(tmp_path / "tp1", on_device_embedding=True)
    with pytest.raises(gr.ArtifactMismatchError, match="presharded weights .* tp_degree: saved 1, now 2"):
        m.to_neuron()
    assert m._ranks is None  # refused before any rank process started


@pytest.mark.parametrize("kwargs, named", [
    (dict(n_positions=[128, 256]), "token_buckets: saved [128], now [128, 256]"),
    (dict(context_length_estimate=[32, 64]), "context_buckets: saved [64], now [32, 64]"),
    (dict(batch_size=4), "batch_size: saved 2, now 4"),
    (dict(amp="bf16"), "dtype: saved 'torch.float32', now 'torch.bfloat16'"),
])
def test_other_settings_are_refused_at_tp2(saved, tiny, kwargs, named):
    with pytest.raises(gr.ArtifactMismatchError, match=named.replace("[", r"\[").replace("]", r"\]")):
        _model(tiny, **kwargs).load(saved[0])


def test_another_torch_version_is_refused(built, tiny, tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(serialization, "TORCH_VERSION", "2.12.0")  # the driver's fingerprint fields, sent to every rank
        built[0].save(tmp_path / "old")
    assert json.loads((tmp_path / "old" / "graphs-rank1.json").read_text())["fields"]["torch"] == "2.12.0"
    with pytest.raises(gr.ArtifactMismatchError, match=re.escape(f"torch: saved '2.12.0', now '{torch.__version__}'")):
        _model(tiny).load(tmp_path / "old")


def _copy(saved, tmp_path, rank):
    d = tmp_path / "copy"
    shutil.copytree(saved[0], d)
    return d, json.loads((d / f"graphs-rank{rank}.json").read_text())


def test_a_corrupted_rank1_file_is_refused_at_load(saved, tiny, tmp_path):
    d, manifest = _copy(saved, tmp_path, 1)
    victim = d / manifest["graphs"][0]["file"]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(gr.CorruptArtifactError, match=r"-rank1-.* is corrupted: its sha256 differs"):
        _model(tiny).load(d)
    (d / "graphs-rank1.json").unlink()
    with pytest.raises(FileNotFoundError, match="No saved graphs for rank 1 .* saved with another tp_degree"):
        _model(tiny).load(d)


def test_a_rank_error_reaches_the_driver_with_its_type_and_message(saved, tiny, tmp_path):
    d, manifest = _copy(saved, tmp_path, 1)
    entry = manifest["graphs"][0]
    (d / entry["file"]).write_bytes(b"not a torch.export archive")
    entry["sha256"] = mf.file_sha256(d / entry["file"])  # hashes fine, cannot load: only rank 1 finds out
    (d / "graphs-rank1.json").write_text(json.dumps(manifest))
    m = _model(tiny).load(d)
    with pytest.raises(gr.CorruptArtifactError, match="tensor-parallel rank 1 failed: Could not load"):
        m.to_neuron()
    assert m._ranks is None  # every rank stopped


def test_save_errors_leave_the_ranks_usable(eager, tmp_path):
    m, (out, _) = eager
    with pytest.raises(ValueError, match="tensor-parallel rank 0 failed: save\\(\\) writes ahead-of-time graphs"):
        m.save(tmp_path / "eager")
    with pytest.raises(ValueError, match="on_device_embedding must be True"):
        m.save(tmp_path / "eager", sharded_weights=True)  # transformers-neuronx's rule, checked in the driver
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError, match="Found existing file"):
        m.save(tmp_path / "file")
    with pytest.raises(ValueError, match="compile\\(\\) writes ahead-of-time graphs"):
        m.compile(tmp_path / "nxdi")
    assert torch.equal(_sample(m)[0], out)


@pytest.mark.parametrize("tp, batch, gqa, mode", [(6, 2, "all-gather-heads", "gather"),
                                                  (3, 3, "shard-over-batch", "batch")])
def test_compiled_refused_where_attention_needs_collectives(tiny, saved, tp, batch, gqa, mode):
    with pytest.raises(ValueError, match=f"{gqa} at tp_degree={tp} .* Use compiled=False .* group_query_attention"):
        _model(tiny, tp=tp, batch_size=batch, group_query_attention=gqa, compiled="export")
    m = _model(tiny, tp=tp, batch_size=batch, group_query_attention=gqa)  # eager: fine
    assert m.layout.kv_mode == mode
    with pytest.raises(ValueError, match="load\\(\\): .* Use compiled=False"):
        m.load(saved[0])


@pytest.mark.slow
def test_aoti_round_trip_at_tp2(tiny, eager, tmp_path):
    """AOTInductor packages per rank (a C++ compile per graph: ~1 min for the 8 graphs on 2 cores)."""
    want, want_logits = eager[1]
    with _model(tiny, compiled="aoti").to_neuron() as m:
        assert all(r["artifact"] == "aoti" and r["seconds"] > 0 for r in m.build_report)
        out, logits = _sample(m)
        m.save(tmp_path / "aoti")
    assert torch.equal(out, want) and (logits - want_logits).abs().max().item() < 1e-4
    with _model(tiny).load(tmp_path / "aoti").to_neuron() as m2:
        assert all(r["artifact"] == "aoti" and r["loaded"] for r in m2.build_report)
        out2, logits2 = _sample(m2)
    assert torch.equal(out2, out) and torch.equal(logits2, logits)


def test_dropping_the_model_stops_its_ranks(tiny):
    """The driver's graphs hold the ranks, not the model: ``del model`` (as the notebooks do) ends the processes."""
    m = _model(tiny).to_neuron()
    procs = list(m._ranks.procs)
    del m
    assert all(not p.is_alive() for p in procs)
