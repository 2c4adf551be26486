"""Compiled graphs per bucket, save/load round trips and the refusals of a mismatched or corrupted
directory (helpers.artifacts). Oracle: the eager engine on the same prompt."""
import json
import shutil

import pytest
import torch

import helpers
from helpers.artifacts import graphs as gr
from helpers.artifacts import manifest as mf
from helpers.artifacts import serialization
from helpers.engine import generation
from helpers.engine import model as engine
from helpers.engine.config import NeuronConfig

KW = dict(n_positions=128, batch_size=2)  # token bucket [128], context bucket [64]: 4 graphs
NEW = 24


def _ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(10, 40000, (2, 40), generator=g)


def _sample(model):
    out = model.sample(_ids(), 40 + NEW, top_k=1, eos_token_override=[], output_logits=True)
    return out, model.stats["logits"]


def _export_model(**nc):
    return helpers.NeuronModel.from_pretrained(None, neuron_config=NeuronConfig(compiled="export", **nc), **KW)


@pytest.fixture(scope="module", autouse=True)
def library_kernels():
    """Exported graphs trace ATen ops; the eager engine's default "stream" kernel and its C ops between the matmuls
    (helpers.engine.cpu.fused_ops) are not. With the kernels the graphs traced forced on the eager side too (one row MKL,
    several rows oneDNN, torch's ops), graphs and eager engine run the same ops and must agree bit for bit (and the
    LM head and final norm, eager in both, run the same kernels)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NEURON_NB_GEMV", "mkl")
        mp.setenv("NEURON_NB_GEMM", "onednn")
        mp.setenv("NEURON_NB_OPS", "torch")
        yield


@pytest.fixture(scope="module")
def eager():
    return _sample(helpers.NeuronModel.from_pretrained(None, **KW).to_neuron())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("saved") / "artifacts"
    m = _export_model(on_device_embedding=True).to_neuron()
    result = _sample(m)
    info = m.save(d, sharded_weights=True)
    return d, m, result, info


def test_one_graph_set_per_bucket_with_build_times(saved):
    d, m, _, info = saved
    assert sorted(r["graph"] for r in m.build_report) == ["context64.attn", "mlp.t1", "mlp.t64", "token128.attn"]
    assert all(r["seconds"] > 0 and r["artifact"] == "export" for r in m.build_report)
    manifest = json.loads((d / "graphs-rank0.json").read_text())
    assert info["graphs"] == len(manifest["graphs"]) == 4
    assert {e["file"] for e in manifest["graphs"]} == {p.name for p in d.glob("*.pt2")}
    assert (d / "weights" / "tp0_sharded_checkpoint.safetensors").is_file()


def test_exported_graphs_are_bitwise_the_eager_engine(saved, eager):
    out, logits = saved[2]
    assert torch.equal(out, eager[0]) and torch.equal(logits, eager[1])


def test_exported_graphs_agree_with_the_default_eager_engine(monkeypatch):
    """With the default kernels (the eager engine's "stream" and fused ops are no ATen ops, so the graphs trace MKL /
    oneDNN and torch's ops in their place): the same tokens, logits within f32 rounding."""
    for env in ("NEURON_NB_GEMV", "NEURON_NB_GEMM", "NEURON_NB_OPS"):
        monkeypatch.delenv(env)
    out, logits = _sample(_export_model().to_neuron())
    ref_out, ref_logits = _sample(helpers.NeuronModel.from_pretrained(None, **KW).to_neuron())
    assert torch.equal(out, ref_out) and torch.allclose(logits, ref_logits, atol=1e-3, rtol=0)


def test_load_skips_compilation_and_gives_identical_outputs(saved, monkeypatch):
    d, _, (out, logits), _ = saved
    monkeypatch.setattr(gr, "export_unit", lambda *a, **k: pytest.fail("load() must not trace or compile"))
    m = helpers.NeuronModel.from_pretrained(None, **KW)  # eager config: the saved graphs decide
    m.load(d).to_neuron()
    assert all(r.get("loaded") for r in m.build_report) and len(m.build_report) == 4
    out2, logits2 = _sample(m)
    assert torch.equal(out2, out) and torch.equal(logits2, logits)


def test_presharded_weights_load_without_resharding(saved, monkeypatch):
    d, _, (out, _), _ = saved
    monkeypatch.setattr(generation, "load_state_dict", lambda *a: pytest.fail("read the original checkpoint"))
    monkeypatch.setattr(generation, "shard_state", lambda *a, **k: pytest.fail("sharded again"))
    m = helpers.NeuronModel.from_pretrained(d, neuron_config=NeuronConfig(on_device_embedding=True), **KW)
    assert m.presharded
    assert torch.equal(_sample(m.load(d).to_neuron())[0], out)


def test_a_saved_directory_can_move(saved, tmp_path):
    """Fingerprints hold no path (unlike the HLO hashes of aws-neuron/transformers-neuronx#91, #99)."""
    d, _, (out, _), _ = saved
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(d, moved)
    m = helpers.load_model(helpers.resolve_backend("reference"), moved, moved,
                           neuron_config=NeuronConfig(on_device_embedding=True), **KW)
    assert torch.equal(_sample(m)[0], out)


def test_nxdi_shape_compile_then_from_compiled(saved, tmp_path):
    _, _, (out, _), _ = saved
    m = _export_model()
    m.compile(tmp_path / "nxdi", save_sharded_checkpoint=True)  # NxDI has no on_device_embedding rule
    assert (tmp_path / "nxdi" / "neuron_config.json").is_file()
    assert torch.equal(_sample(helpers.NeuronModel.from_compiled(tmp_path / "nxdi"))[0], out)


@pytest.mark.parametrize("kwargs, named", [
    (dict(n_positions=[128, 256], batch_size=2), "token_buckets: saved [128], now [128, 256]"),
    (dict(n_positions=128, context_length_estimate=[32, 64], batch_size=2), "context_buckets: saved [64], now [32, 64]"),
    (dict(n_positions=128, batch_size=1), "batch_size: saved 2, now 1"),
    (dict(n_positions=128, batch_size=2, amp="bf16"), "dtype: saved 'torch.float32', now 'torch.bfloat16'"),
])
def test_other_settings_are_refused_naming_the_difference(saved, kwargs, named):
    with pytest.raises(gr.ArtifactMismatchError, match=named.replace("[", r"\[").replace("]", r"\]")):
        helpers.NeuronModel.from_pretrained(None, **kwargs).load(saved[0])


def test_other_tp_degree_and_torch_version_are_refused(tmp_path, monkeypatch):
    m = _export_model().to_neuron()
    m.tp_degree = 2  # what a rank of a tp=2 build records (the tp>1 engine is helpers.parallel)
    with monkeypatch.context() as patch:
        patch.setattr(serialization, "TORCH_VERSION", "2.12.0")
        m.save(tmp_path / "other")
    with pytest.raises(gr.ArtifactMismatchError) as err:
        helpers.NeuronModel.from_pretrained(None, **KW).load(tmp_path / "other")
    assert "tp_degree: saved 2, now 1" in str(err.value)
    assert f"torch: saved '2.12.0', now '{torch.__version__}'" in str(err.value)


def _copy(saved, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(saved[0], d)
    return d, json.loads((d / "graphs-rank0.json").read_text())


def test_a_changed_file_is_refused_before_any_weight_is_read(saved, tmp_path):
    d, manifest = _copy(saved, tmp_path)
    victim = d / manifest["graphs"][0]["file"]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(gr.CorruptArtifactError, match="is corrupted: its sha256 differs"):
        helpers.NeuronModel.from_pretrained(None, **KW).load(d)


def test_a_file_that_does_not_deserialize_is_a_clear_error(saved, tmp_path):
    d, manifest = _copy(saved, tmp_path)
    entry = manifest["graphs"][0]
    (d / entry["file"]).write_bytes(b"not a torch.export archive")
    entry["sha256"] = mf.file_sha256(d / entry["file"])  # hashes fine, cannot load
    (d / "graphs-rank0.json").write_text(json.dumps(manifest))
    m = helpers.NeuronModel.from_pretrained(None, **KW).load(d)
    with pytest.raises(gr.CorruptArtifactError, match="Could not load"):
        m.to_neuron()


def test_missing_pieces_are_clear_errors(saved, tmp_path):
    d, manifest = _copy(saved, tmp_path)
    (d / manifest["graphs"][1]["file"]).unlink()
    with pytest.raises(gr.CorruptArtifactError, match="edited after save"):
        helpers.NeuronModel.from_pretrained(None, **KW).load(d)
    (d / "graphs-rank0.json").rename(d / "graphs-rank1.json")
    with pytest.raises(FileNotFoundError, match="No saved graphs for rank 0 .* graphs-rank1.json: saved with another"):
        helpers.NeuronModel.from_pretrained(None, **KW).load(d)
    with pytest.raises(FileNotFoundError, match="Did not find directory"):
        helpers.NeuronModel.from_pretrained(None, **KW).load(tmp_path / "nowhere")


def test_misuse_is_refused(saved, tmp_path):
    d, m, _, _ = saved
    with pytest.raises(RuntimeError, match="before to_neuron"):
        m.load(d)
    with pytest.raises(ValueError, match="on_device_embedding must be True"):
        _export_model().save(tmp_path / "y", sharded_weights=True)  # as transformers-neuronx asserts
    eager = helpers.NeuronModel.from_pretrained(None, **KW).to_neuron()
    with pytest.raises(ValueError, match="ahead-of-time graphs"):
        eager.save(tmp_path / "z")
    with pytest.raises(ValueError, match="on_device_embedding must be True"):
        helpers.NeuronModel.from_pretrained(d, **KW)  # presharded checkpoint, as transformers-neuronx asserts
    presharded_bf16 = helpers.NeuronModel.from_pretrained(d, amp="bf16", **KW,
                                                          neuron_config=NeuronConfig(on_device_embedding=True))
    with pytest.raises(gr.ArtifactMismatchError, match="presharded weights .* dtype: saved 'torch.float32'"):
        presharded_bf16.to_neuron()
    with pytest.raises(ValueError, match="compiled='nope'"):
        NeuronConfig(compiled="nope")


@pytest.mark.slow
def test_aoti_packages_round_trip(tmp_path, eager):
    """AOTInductor: real compiled code per graph (~10 s each on 2 cores), loaded by dlopen."""
    m = helpers.NeuronModel.from_pretrained(None, neuron_config=NeuronConfig(compiled="aoti"), **KW).to_neuron()
    out, logits = _sample(m)
    assert torch.equal(out, eager[0])
    assert (logits - eager[1]).abs().max().item() < 1e-3
    m.save(tmp_path / "aoti")
    m2 = helpers.NeuronModel.from_pretrained(None, **KW).load(tmp_path / "aoti").to_neuron()
    assert all(r["artifact"] == "aoti" and r["loaded"] for r in m2.build_report)
    out2, logits2 = _sample(m2)
    assert torch.equal(out2, out) and torch.equal(logits2, logits)


def test_compiled_true_means_exported_graphs():
    m = helpers.NeuronModel.from_pretrained(None, neuron_config=NeuronConfig(compiled=True), **KW).to_neuron()
    assert {r["artifact"] for r in m.build_report} == {"export"} and len(m.build_report) == 4


def test_graphs_from_other_engine_code_are_refused(saved, monkeypatch):
    """Same fingerprint, different math (the engine changed after save): load refuses, never a wrong answer."""
    d = saved[0]
    original = engine.Transformer.mlp_block
    monkeypatch.setattr(engine.Transformer, "mlp_block", lambda self, x, L: 1.5 * original(self, x, L))
    m = helpers.NeuronModel.from_pretrained(None, **KW).load(d)
    with pytest.raises(gr.ArtifactMismatchError, match="computes differently .* saved by other engine code"):
        m.to_neuron()


def test_per_layer_state_outside_the_layer_tensors_is_caught_at_build(monkeypatch):
    """A per-layer Python attribute is not a graph input: the graph would bake layer 0's value into
    every layer. The build-time probe on the last layer refuses it."""
    m = helpers.NeuronModel.from_pretrained(None, **KW).to_neuron()
    for i, L in enumerate(m.model.w.layers):
        L.gain = 1.0 + i
    original = engine.Transformer.mlp_block
    monkeypatch.setattr(engine.Transformer, "mlp_block", lambda self, x, L: L.gain * original(self, x, L))
    with pytest.raises(ValueError, match="per-layer state outside LayerWeights"):
        gr.build_unit(m.model, "mlp.t1", {"part": "mlp", "tokens": 1}, 2, "export")


def test_speculative_graphs_are_compiled_saved_and_fingerprinted(tmp_path, eager):
    """enable_speculative_decoder(k) adds a k+1-token graph per token bucket; it is saved like the others."""
    def build(**nc):
        m = helpers.NeuronModel.from_pretrained(None, neuron_config=NeuronConfig(**nc), **KW)
        m.enable_speculative_decoder(3)
        return m

    ref = build().to_neuron()
    m = build(compiled="export").to_neuron()
    assert {"speculative128.attn", "mlp.t4"} <= {r["graph"] for r in m.build_report}
    ids, cache_ids = _ids()[:, :4], torch.arange(40, 44)
    for model in (ref, m):
        model.forward(_ids(), start_ids=None)  # fill the cache with the prompt
    expected = ref.speculative_forward(ids, cache_ids)
    assert torch.equal(m.speculative_forward(ids, cache_ids), expected)
    m.save(tmp_path / "spec")
    loaded = build().load(tmp_path / "spec").to_neuron()
    loaded.forward(_ids())
    assert torch.equal(loaded.speculative_forward(ids, cache_ids), expected)
    with pytest.raises(gr.ArtifactMismatchError, match="speculation_length: saved 3, now 0"):
        helpers.NeuronModel.from_pretrained(None, **KW).load(tmp_path / "spec")
