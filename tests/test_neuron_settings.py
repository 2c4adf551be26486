"""helpers.neuron pure functions: settings mapping, checkpoint compatibility, padding, runtime env."""
from __future__ import annotations

import json

import pytest
import torch

import helpers
from helpers import neuron
from helpers.planning.buckets import nxdi_select, tnx_find


def test_tnx_mapping_keeps_the_reference_names():
    nc = helpers.NeuronConfig(group_query_attention="shard-over-batch", quant={"quant_dtype": "s8"})
    s = neuron.neuron_settings("tnx", batch_size=4, n_positions=2048, tp_degree=2, amp="f16",
                               context_length_estimate=[256, 512], neuron_config=nc)
    assert s.model_kwargs == {"batch_size": 4, "n_positions": 2048, "tp_degree": 2, "amp": "f16",
                              "context_length_estimate": [256, 512]}
    assert s.neuron_config["group_query_attention"] == "shard-over-batch"
    assert s.quantization == {"quant_dtype": "s8", "dequant_dtype": "f16"}  # dequantize to amp, not 'f16' default


def test_tp_degree_is_always_explicit():
    # transformers-neuronx's default tp_degree is 2 (llama/model.py); the reference engine's is 1.
    assert neuron.neuron_settings("tnx").model_kwargs["tp_degree"] == 1


@pytest.mark.parametrize("n_positions,expected", [(2048, [128, 256, 512, 1024, 2048]), (300, [128, 300]),
                                                    (64, [64])])
def test_nxdi_default_context_buckets_are_nxdis(n_positions, expected):
    """No context_length_estimate: NxDI's own generate_buckets(128, seq_len) (the longest prompt fits up to
    seq_len), not transformers-neuronx's half-size buckets (which stop at n_positions / 2)."""
    nx = neuron.neuron_settings("nxdi", n_positions=n_positions).neuron_config
    assert nx["context_encoding_buckets"] == expected and nx["max_context_length"] == nx["seq_len"] == n_positions
    tnx = neuron.neuron_settings("tnx", n_positions=n_positions).model_kwargs
    assert tnx["context_length_estimate"] is None  # the library's default: half of each token bucket


@pytest.mark.parametrize("n_positions,cle", [([128, 512, 1024], [64, 300]), (256, 100), (512, [128, 256])])
def test_nxdi_compiles_the_same_buckets_as_tnx(n_positions, cle):
    tnx = neuron.neuron_settings("tnx", n_positions=n_positions, context_length_estimate=cle)
    nx = neuron.neuron_settings("nxdi", n_positions=n_positions, context_length_estimate=cle).neuron_config
    tokens = helpers.planning.buckets.tnx_token_buckets(tnx.model_kwargs["n_positions"])
    contexts = helpers.planning.buckets.tnx_context_buckets(tnx.model_kwargs["context_length_estimate"], tokens)
    assert nx["token_generation_buckets"] == tokens and nx["context_encoding_buckets"] == contexts
    assert nx["seq_len"] == max(tokens) and nx["max_context_length"] == max(contexts)
    assert nx["enable_bucketing"] and nx["padding_side"] == "right"


def test_bucket_selection_differs_at_the_edge():
    # Same lists, different runtime rule: tnx takes the smallest bucket >= n, NxDI the first with n < bucket.
    assert tnx_find([128, 256], 128) == 128 and nxdi_select([128, 256], 128, "token") == 256


def test_nxdi_mapping_dtype_quant_speculation(tmp_path):
    nc = helpers.NeuronConfig(quant={"quant_dtype": "f8e4m3fn"})
    s = neuron.neuron_settings("nxdi", amp="bf16", neuron_config=nc, speculation_length=4,
                               quantized_checkpoints_path=tmp_path / "q")
    # 4 draft tokens per step (the reference engine's count) = NxDI's speculation_length 5 (positions verified)
    assert s.neuron_config["torch_dtype"] == "bfloat16" and s.neuron_config["speculation_length"] == 5
    assert s.neuron_config["quantized"] and s.neuron_config["quantization_dtype"] == "f8e4m3"
    assert s.neuron_config["quantization_type"] == "per_channel_symmetric"
    assert s.neuron_config["modules_to_not_convert"] == ["lm_head"]  # tied head: see test below
    assert set(s.neuron_config) <= neuron.NXDI_NEURON_CONFIG_KEYS


def test_nxdi_int8_keeps_the_lm_head_in_float(tmp_path):
    """NxD Inference 0.8 int8 on a tied-embedding model turns an int8 lm_head into zeros (the float embedding is
    cast .to(int8) at load): every quantized setting keeps lm_head out, and an override that drops it is refused."""
    nc = helpers.NeuronConfig(quant={"quant_dtype": "s8"})
    for method in ("per_channel_symmetric", "per_tensor_symmetric"):
        kw = neuron.neuron_quant_settings("nxdi", method, "f32", tmp_path)
        s = neuron.neuron_settings("nxdi", **kw)
        assert s.neuron_config["modules_to_not_convert"] == ["lm_head"], method
    s = neuron.neuron_settings("nxdi", neuron_config=nc, quantized_checkpoints_path=tmp_path / "q",
                               nxdi_overrides={"modules_to_not_convert": ["layers.0", "lm_head"]})
    assert s.neuron_config["modules_to_not_convert"] == ["layers.0", "lm_head"]
    with pytest.raises(ValueError, match="quantizes lm_head"):
        neuron.neuron_settings("nxdi", neuron_config=nc, quantized_checkpoints_path=tmp_path / "q",
                               nxdi_overrides={"modules_to_not_convert": ["layers.0"]})
    assert "modules_to_not_convert" not in neuron.neuron_settings("nxdi").neuron_config


def test_nxdi_gqa_choice_is_reported_not_dropped():
    s = neuron.neuron_settings("nxdi", neuron_config=helpers.NeuronConfig(group_query_attention="replicated-heads"))
    assert "group_query_attention" not in s.neuron_config and any("CONVERT_TO_MHA" in n for n in s.notes)


@pytest.mark.parametrize("stack,kwargs,exc,match", [
    ("nxdi", dict(nxdi_overrides={"trace_tokengen_model": False}), TypeError, "trace_tokengen_model"),
    ("nxdi", dict(nxdi_overrides={"seq_length": 64}), TypeError, "Did you mean 'seq_len'"),
    ("nxdi", dict(neuron_config=helpers.NeuronConfig(quant="s8")), ValueError, "quantized_checkpoints_path"),
    ("nxdi", dict(neuron_config=helpers.NeuronConfig(quant={"quantize_method": "direct_cast"}),
                  quantized_checkpoints_path="q"), ValueError, "direct_cast"),
    ("tnx", dict(nxdi_overrides={"seq_len": 64}), ValueError, "nxdi_overrides"),
    ("tnx", dict(tp_degree=3), ValueError, "tp_degree=3"),
    ("tnx", dict(tp_degree=16, instance_family="inf2"), ValueError, "does not run on inf2"),
    ("nxdi", dict(tp_degree=24, instance_family="trn1"), ValueError, "does not run on trn1"),
    ("tnx", dict(tp_degree=4, instance_family="trn2"), ValueError, "instance_family"),
    ("tnx", dict(batch_size=2, speculation_length=3), ValueError, "batch_size=1"),
    ("nxdi", dict(batch_size=4, speculation_length=2), ValueError, "batch_size=1"),
    ("tnx", dict(amp="fp16"), ValueError, "amp"),
    ("tnx", dict(n_positions=256, context_length_estimate=512), ValueError, "cannot be more than"),
    ("tnx", dict(device="cuda"), ValueError, "reference-engine"),
    ("tnx", dict(neuron_config=helpers.NeuronConfig(quant={"quant_dtype": "s4"})), ValueError, "quant_dtype"),
    ("tnx", dict(amp="bf16", neuron_config=helpers.NeuronConfig(quant={"dequant_dtype": "f16"})), ValueError,
     "amp type must match dequant type"),
    ("tnx", dict(neuron_config=helpers.NeuronConfig(quant={"quant_dtpye": "s8"})), TypeError, "quant_dtype"),
    ("mxnet", dict(), ValueError, "stack"),
])
def test_refused_before_any_build(stack, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        neuron.neuron_settings(stack, **kwargs)


def test_neuron_model_dir_writes_legacy_rope_keys(tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    cfg = {"model_type": "llama", "dtype": "bfloat16", "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "model.safetensors").write_bytes(b"w")
    out = neuron.neuron_model_dir(str(src), cache_dir=tmp_path / "cache")
    legacy = json.loads((tmp_path / "cache" / out.split("/")[-1] / "config.json").read_text())
    assert legacy["rope_theta"] == 100000.0 and "rope_parameters" not in legacy and "rope_scaling" not in legacy
    assert legacy["torch_dtype"] == "bfloat16"
    assert (tmp_path / "cache" / out.split("/")[-1] / "model.safetensors").read_bytes() == b"w"
    assert neuron.neuron_model_dir(out) == out  # already compatible: used as is


def test_neuron_model_dir_llama3_scaling(tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    rope = {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0}
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "rope_parameters": rope}))
    legacy = json.loads((tmp_path / "c" / neuron.neuron_model_dir(str(src), tmp_path / "c").split("/")[-1]
                         / "config.json").read_text())
    assert legacy["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0}


def test_embedded_model_gets_its_real_rope_theta():
    path = neuron.neuron_model_dir(None)
    assert neuron.read_hf_config(path)["rope_theta"] == 100000.0  # not transformers-neuronx's 10000 default


def test_left_to_right_padding_and_start_ids():
    ids = torch.tensor([[0, 0, 7, 8], [5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert neuron.start_ids_from_mask(mask).tolist() == [2, 0]
    rids, rmask = neuron.left_to_right_padding(ids, mask, pad_token_id=9)
    assert rids.tolist() == [[7, 8, 9, 9], [5, 6, 7, 8]] and rmask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    with pytest.raises(ValueError, match="pad on the left"):
        neuron.start_ids_from_mask(torch.tensor([[1, 0]]))


def test_finish_rows_pads_after_eos_or_criterion():
    seq = torch.tensor([[1, 2, 5, 2, 2, 2], [1, 2, 5, 6, 7, 8], [1, 2, 5, 6, 7, 8]])
    out, counts = neuron.finish_rows(seq, 2, [2], [None, 2, None], pad=0)
    assert out.tolist() == [[1, 2, 5, 2, 0, 0], [1, 2, 5, 6, 0, 0], [1, 2, 5, 6, 7, 8]]
    assert counts == [2, 2, 4]


def test_runtime_env():
    assert neuron.neuron_runtime_env(visible_cores=[0, 1], omp_threads=8, compile_cache="/cache") == {
        "NEURON_RT_VISIBLE_CORES": "0-1", "OMP_NUM_THREADS": "8", "NEURON_COMPILE_CACHE_URL": "/cache"}
    assert neuron.neuron_runtime_env(visible_cores="2,3")["NEURON_RT_VISIBLE_CORES"] == "2-3"
    for gaps_or_reordered in ("0,2", "1,0", [3, 2], "0-1,3"):
        with pytest.raises(ValueError, match="contiguous, increasing"):
            neuron.neuron_runtime_env(visible_cores=gaps_or_reordered)
    assert neuron.neuron_runtime_env(num_cores=2) == {"NEURON_RT_NUM_CORES": "2"}
    assert neuron.omp_threads_for(4, host_cpus=192) == 48
    with pytest.raises(ValueError, match="not both"):
        neuron.neuron_runtime_env(visible_cores="0", num_cores=1)
    with pytest.raises(ValueError):
        neuron.neuron_runtime_env(visible_cores="1-0")


def test_configure_and_check_cores(monkeypatch):
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "4")
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)  # restored after the test
    env = neuron.configure_neuron_runtime(visible_cores="0-1")
    import os

    assert os.environ["NEURON_RT_VISIBLE_CORES"] == "0-1" and "NEURON_RT_NUM_CORES" not in os.environ
    assert env == {"NEURON_RT_VISIBLE_CORES": "0-1"}
    neuron.check_visible_cores(2)
    with pytest.raises(ValueError, match="tp_degree=8"):
        neuron.check_visible_cores(8)
    neuron.check_visible_cores(8, environ={})  # nothing set: all cores visible
    with pytest.raises(ValueError, match="contiguous"):
        neuron.check_visible_cores(2, environ={"NEURON_RT_VISIBLE_CORES": "1,0"})


@pytest.mark.parametrize("family,valid,invalid", [("inf2", [1, 2, 4, 8, 24], [16, 32]),
                                                  ("trn1", [1, 2, 8, 16, 32], [4, 24])])
def test_tp_degree_per_instance_family(tmp_path, family, valid, invalid):
    dmi = tmp_path / "product_name"
    dmi.write_text(f"{family}.xlarge\n")
    assert neuron.detect_instance_family(str(dmi)) == family
    for tp in valid:
        neuron.check_tp_degree(tp, family)
    for tp in invalid:
        with pytest.raises(ValueError, match=f"does not run on {family}"):
            neuron.check_tp_degree(tp, family)


def test_tp_degree_with_unknown_family(monkeypatch):
    monkeypatch.setattr(neuron.runtime, "detect_instance_family", lambda: None)
    for tp in (1, 2, 8):  # valid on both families
        neuron.check_tp_degree(tp)
    with pytest.raises(ValueError, match="inf2 only: pass instance_family='inf2'"):
        neuron.check_tp_degree(24)
    with pytest.raises(ValueError, match="trn1 only"):
        neuron.check_tp_degree(16)


def _nxdi_compiled(tmp_path, **neuron_config):
    d = tmp_path / "compiled"
    d.mkdir()
    (d / "model.pt").write_bytes(b"")
    hf = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
          "vocab_size": 49152}
    (d / "neuron_config.json").write_text(json.dumps({**hf, "neuron_config": neuron_config}))
    return str(d), hf


def test_nxdi_compiled_dir_must_match(tmp_path):
    ns = neuron.neuron_settings("nxdi", n_positions=256, amp="bf16").neuron_config
    saved = {**ns, "torch_dtype": "bfloat16"}
    d, hf = _nxdi_compiled(tmp_path, **saved)
    neuron.check_nxdi_compiled_dir(d, ns, hf)  # the same settings load
    other = neuron.neuron_settings("nxdi", n_positions=512, amp="bf16").neuron_config
    with pytest.raises(ValueError, match="seq_len: compiled 256, requested 512"):
        neuron.check_nxdi_compiled_dir(d, other, hf)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        neuron.check_nxdi_compiled_dir(d, ns, {**hf, "num_hidden_layers": 4})
    (tmp_path / "compiled" / "neuron_config.json").unlink()
    with pytest.raises(ValueError, match="no neuron_config.json"):
        neuron.check_nxdi_compiled_dir(d, ns, hf)


@pytest.mark.parametrize("ids,match", [
    (torch.tensor([[1.0, 2.0]]), "dtype"),
    (torch.zeros(1, 0, dtype=torch.long), "empty"),
    (torch.tensor([[5, 49152]]), "outside the vocabulary"),
    (torch.tensor([[-1, 3]]), "outside the vocabulary"),
    (torch.zeros(1, 2, 3, dtype=torch.long), "shape"),
])
def test_bad_input_ids_are_refused(ids, match):
    from helpers.engine.sampling import validate_input_ids

    with pytest.raises(ValueError, match=match):
        validate_input_ids(ids, 49152)
    assert validate_input_ids(torch.tensor([3, 4], dtype=torch.int32), 49152).dtype == torch.long
