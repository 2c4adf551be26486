"""int8 weight storage: round-trip error bounds, refusals, the NxDI-style checkpoint, and the engine
against its unquantized self."""
import pytest
import torch

import helpers
from helpers.engine.quant import (QuantizationConfig, quantize_tensor, quantized_weight_bytes,
                           save_quantized_state_dict)
from tiny_models import write_tiny


@pytest.mark.parametrize("method", ["vector_dynamic", "per_channel_symmetric", "per_tensor_symmetric"])
def test_int8_round_trip_error_is_at_most_half_a_step(method):
    w = torch.randn(64, 32) * torch.linspace(0.01, 3, 64)[:, None]
    q, scale = quantize_tensor(w, QuantizationConfig(quantize_method=method, dequant_dtype="f32"))
    assert q.dtype == torch.int8
    deq = q.float() * scale[:, None] if scale.numel() > 1 else q.float() * scale
    step = (scale[:, None] if scale.numel() > 1 else scale).expand_as(w)
    assert ((deq - w).abs() <= step / 2 + 1e-6).all()
    if method != "per_tensor_symmetric":  # per channel: each row uses its full range
        assert (q.abs().amax(1) == 127).all()


def test_int8_weight_linear_matches_dense_product():
    w = torch.randn(48, 16)
    cfg = QuantizationConfig(dequant_dtype="f32")
    from helpers.engine.quant import QuantWeight
    q, s = quantize_tensor(w, cfg)
    qw = QuantWeight(q, s, torch.float32)
    x = torch.randn(3, 16)
    assert torch.allclose(qw.linear(x), x @ qw.dequantize().T, atol=1e-4)  # the weight runs its own kernel


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="direct_cast"):
        QuantizationConfig(quant_dtype="s8", quantize_method="direct_cast")
    with pytest.raises(ValueError, match="quantize_method='per_row'"):
        QuantizationConfig(quantize_method="per_row")
    write_tiny(tmp_path)
    with pytest.raises(ValueError, match="amp must equal the dequant dtype"):
        helpers.NeuronModel.from_pretrained(tmp_path, n_positions=64, amp="f32", neuron_config=helpers.NeuronConfig(
            quant=QuantizationConfig(dequant_dtype="bf16")))
    with pytest.raises(FileNotFoundError, match="save_quantized_state_dict"):
        helpers.NeuronModel.from_pretrained(tmp_path, n_positions=64, amp="f32", neuron_config=helpers.NeuronConfig(
            quant=QuantizationConfig(dequant_dtype="f32", quantized_checkpoints_path=tmp_path / "q")))


def test_engine_int8_storage_bytes_and_accuracy(tmp_path):
    write_tiny(tmp_path, num_hidden_layers=3)
    base = helpers.NeuronModel.from_pretrained(tmp_path, n_positions=64).to_neuron()
    cfg = QuantizationConfig(dequant_dtype="f32", quantize_method="per_channel_symmetric",
                             quantized_checkpoints_path=tmp_path / "q8")
    save_quantized_state_dict(tmp_path, cfg)
    m = helpers.NeuronModel.from_pretrained(tmp_path, n_positions=64, neuron_config=helpers.NeuronConfig(quant=cfg)).to_neuron()
    stored, full = quantized_weight_bytes(m.model)
    assert stored / full == pytest.approx(0.25, abs=0.02)  # int8 values + one f32 scale per row
    assert m.weight_bytes < base.weight_bytes
    ids = torch.randint(3, 250, (1, 10))
    a, b = m.forward(ids), base.forward(ids)
    assert (a - b).abs().max() < 0.05 * b.abs().max()
    # quantize-on-load (no checkpoint) gives the same weights as the checkpoint written once
    cfg2 = QuantizationConfig(dequant_dtype="f32", quantize_method="per_channel_symmetric")
    m2 = helpers.NeuronModel.from_pretrained(tmp_path, n_positions=64, neuron_config=helpers.NeuronConfig(quant=cfg2)).to_neuron()
    assert torch.equal(m2.forward(ids), m.forward(ids))
    # a checkpoint written with other settings is refused, naming the fix
    other = QuantizationConfig(dequant_dtype="f32", quantize_method="per_tensor_symmetric",
                               quantized_checkpoints_path=tmp_path / "q8")
    with pytest.raises(ValueError, match="rewrite it"):
        helpers.NeuronModel.from_pretrained(tmp_path, n_positions=64, neuron_config=helpers.NeuronConfig(quant=other)).to_neuron()


@pytest.mark.parametrize("stack,method", [("tnx", "vector_dynamic"), ("nxdi", "per_channel_symmetric"),
                                          ("nxdi", "per_tensor_symmetric")])
def test_neuron_quant_settings_map_to_the_stack(stack, method, tmp_path):
    from helpers.neuron import neuron_settings
    from helpers.neuron import neuron_quant_settings

    kw = neuron_quant_settings(stack, method, "bf16", tmp_path / "q")
    assert (tmp_path / "q").is_dir() == (stack == "nxdi")  # NxDI torch.saves a file there: its folder must exist
    ns = neuron_settings(stack, amp="bf16", neuron_config=kw["neuron_config"],
                         quantized_checkpoints_path=kw.get("quantized_checkpoints_path"),
                         nxdi_overrides=kw.get("nxdi_overrides"))
    if stack == "tnx":
        assert ns.quantization == {"quant_dtype": "s8", "dequant_dtype": "bf16", "quantize_method": "vector_dynamic"}
    else:
        assert ns.neuron_config["quantized"] and ns.neuron_config["quantization_type"] == method
        assert ns.neuron_config["quantized_checkpoints_path"].endswith(f"nxdi-{method}")


@pytest.mark.parametrize("stack,method", [("tnx", "per_channel_symmetric"), ("nxdi", "vector_dynamic"), ("tpu", "x")])
def test_neuron_quant_settings_refuse_other_modes(stack, method, tmp_path):
    from helpers.neuron import neuron_quant_settings

    with pytest.raises(ValueError, match="use one of"):
        neuron_quant_settings(stack, method, "f32", tmp_path)


def test_eight_bit_formats_precision_order_and_exact_values():
    """int8 (per-channel) < e4m3 < e5m2 in rounding error on Gaussian weights; representable values survive."""
    from helpers.notebook.quant_formats import fake_quantize

    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    err = {f: float((w - fake_quantize(w, f)).norm() / w.norm()) for f in ("int8", "f8e4m3", "f8e5m2")}
    assert err["int8"] < err["f8e4m3"] < err["f8e5m2"] < 0.1, err
    exact = torch.tensor([[240.0, -120.0, 0.5, 0.0]])  # absmax 240: scale 1 for e4m3 (Neuron's range)
    assert torch.equal(fake_quantize(exact, "f8e4m3"), exact)
    with pytest.raises(ValueError, match="fmt"):
        fake_quantize(w, "fp8")


def test_rounding_errors_over_a_checkpoint(tmp_path):
    from helpers.notebook.quant_formats import rounding_errors
    from tiny_models import write_tiny

    write_tiny(tmp_path / "tiny")
    err = rounding_errors(tmp_path / "tiny")
    assert set(err) == {"int8", "f8e4m3", "f8e5m2"} and 0 < err["int8"] < err["f8e5m2"]


def test_nxdi_fp8_and_kv_cache_keywords_are_the_pinned_releases():
    """The NeuronConfig keywords of notebook 06's FP8 and KV-cache cells exist in NxD Inference 0.8 (the stand-in
    transcribes models/config.py and raises on any keyword the release does not pop)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "contract"))
    import contract_harness as harness

    with harness.stand_ins():
        from neuronx_distributed_inference.models.config import NeuronConfig

        for dtype in ("int8", "f8e4m3", "f8e5m2"):
            nc = NeuronConfig(quantized=True, quantized_checkpoints_path="q", quantization_dtype=dtype,
                              quantization_type="per_channel_symmetric")
            assert nc.quantization_dtype == dtype
        with pytest.raises(AssertionError, match="not a valid QuantizedDtype"):
            NeuronConfig(quantized=True, quantized_checkpoints_path="q", quantization_dtype="fp8")
        nc = NeuronConfig(kv_cache_quant=True, kv_quant_config={"quant_dtype": torch.float8_e4m3fn, "direct_cast": True})
        assert nc.kv_cache_quant and nc.kv_quant_config.direct_cast  # a KVQuantizationConfig, as 0.8 builds it
