"""helpers.notebook.lmi: the LMI serving.properties export, checked against the DJL LMI guide "Transformers-NeuronX
Engine in LMI" (https://docs.djl.ai/docs/serving/serving/docs/lmi/user_guides/tnx_user_guide.html). The lines of
the guide the tests compare with are quoted below, so the tests always run."""
from __future__ import annotations

import pytest

import helpers
from helpers.notebook import lmi

GUIDE_URL = "https://docs.djl.ai/docs/serving/serving/docs/lmi/user_guides/tnx_user_guide.html"
# "Quick Start Configurations" > "serving.properties" (comment line left out)
QUICK_START_PROPERTIES = """\
engine=Python
option.model_id=<your model>
option.entryPoint=djl_python.transformers_neuronx
option.rolling_batch=auto
option.tensor_parallel_degree=4
option.max_rolling_batch_size=8
option.model_loading_timeout=1600
""".splitlines()
# "Quick Start Configurations" > "environment variables" (comment line left out)
QUICK_START_ENV = """\
HF_MODEL_ID=<your model>
OPTION_ENTRYPOINT=djl_python.transformers_neuronx
OPTION_ROLLING_BATCH=auto
TENSOR_PARALLEL_DEGREE=4
OPTION_MAX_ROLLING_BATCH_SIZE=8
OPTION_MODEL_LOADING_TIMEOUT=1600
""".splitlines()
# "Quantization"
QUANTIZATION = ("Currently, we allow customer to use `option.quantize=static_int8` or `OPTION_QUANTIZE=static_int8` to "
                "load the model using `int8` weight quantization.")
# "Advanced Transformers NeuronX Configurations": the Item column, in order, and the example values quoted
ADVANCED_TABLE = ("option.n_positions", "option.load_in_8bit", "option.unroll", "option.neuron_optimize_level",
                  "option.context_length_estimate", "option.low_cpu_mem_usage", "option.load_split_model",
                  "option.compiled_graph_path", "option.group_query_attention",
                  "option.enable_mixed_precision_accumulation")
GQA_EXAMPLE = "`shard-over-heads`  Default: `None`"
CONTEXT_EXAMPLE = "Example: `256,512,1024` (integers separated by comma if multiple values)"


def test_advanced_option_table_is_transcribed_exactly():
    assert tuple(f"option.{name}" for name in lmi.ADVANCED_OPTIONS) == ADVANCED_TABLE


def test_quick_start_template_round_trips():
    """The guide's Quick Start serving.properties and environment variables, reproduced from settings."""
    props, env = QUICK_START_PROPERTIES, QUICK_START_ENV
    cfg = lmi.lmi_config("<your model>", tp_degree=4, n_positions=128, batch_size=8, model_loading_timeout=1600)
    ours = cfg.serving_properties().splitlines()
    assert set(props) <= set(ours)
    assert set(ours) - set(props) == {"option.n_positions=128"}
    ours_env = {f"{k}={v}" for k, v in cfg.env().items()}
    assert set(env) <= ours_env and ours_env - set(env) == {"OPTION_N_POSITIONS=128"}


def test_quantize_and_gqa_values_are_the_guides():
    assert "option.quantize=static_int8" in QUANTIZATION and "OPTION_QUANTIZE=static_int8" in QUANTIZATION
    cfg = lmi.lmi_config("m", tp_degree=2, n_positions=512, neuron_config=helpers.NeuronConfig(
        group_query_attention="shard-over-heads", quant={"quant_dtype": "s8"}), context_length_estimate=[256, 128])
    text = cfg.serving_properties()
    assert "option.quantize=static_int8\n" in text and "option.group_query_attention=shard-over-heads\n" in text
    assert GQA_EXAMPLE.startswith("`shard-over-heads`")
    assert "option.context_length_estimate=128,256\n" in text and "separated by comma" in CONTEXT_EXAMPLE
    assert cfg.env()["OPTION_QUANTIZE"] == "static_int8"


def test_every_exported_option_is_in_the_guide_lists():
    cfg = lmi.lmi_config("org/model", tp_degree=8, n_positions=4096, batch_size=4, context_length_estimate=1024,
                         neuron_config=helpers.NeuronConfig(group_query_attention="replicated-heads", quant="s8"))
    assert set(cfg.options) <= set(lmi.TEMPLATE_OPTIONS + lmi.ADVANCED_OPTIONS)
    assert cfg.options["tensor_parallel_degree"] == 8 and cfg.options["max_rolling_batch_size"] == 4
    assert cfg.serving_properties().startswith("engine=Python\noption.model_id=org/model\n")


def test_write(tmp_path):
    path = lmi.lmi_config("m", tp_degree=2, n_positions=256).write(tmp_path / "deploy")
    assert path.read_text().splitlines()[0] == "engine=Python"


@pytest.mark.parametrize("kwargs,match", [
    (dict(tp_degree=3), "tensor_parallel_degree=3"),
    (dict(n_positions=[128, 256]), "one total length"),
    (dict(amp="bf16"), "no dtype"),
    (dict(context_length_estimate=[128, 1024]), "context_length_estimate 1024"),
    (dict(context_length_estimate=0), "no context encoding"),
    (dict(neuron_config=helpers.NeuronConfig(quant={"quant_dtype": "f8e4m3fn"})), "static_int8"),
    (dict(neuron_config=helpers.NeuronConfig(on_device_embedding=True)), "on_device_embedding"),
    (dict(rolling_batch="lmi-dist"), "rolling_batch"),
    (dict(instance="trn2"), "instance"),
])
def test_refuses_what_lmi_does_not_accept(kwargs, match):
    base = dict(tp_degree=2, n_positions=512)
    with pytest.raises(ValueError, match=match):
        lmi.lmi_config("m", **{**base, **kwargs})


def test_trn1_degrees():
    assert lmi.lmi_config("m", tp_degree=32, n_positions=512, instance="trn1").options["tensor_parallel_degree"] == 32
    with pytest.raises(ValueError):
        lmi.lmi_config("m", tp_degree=24, n_positions=512, instance="trn1")


def test_compiled_artifacts_options_are_the_guides():
    for name in ("compiled_graph_path", "load_split_model"):
        assert f"option.{name}" in ADVANCED_TABLE
    cfg = lmi.lmi_config("s3://bucket/model/", tp_degree=2, n_positions=512, rolling_batch="disable",
                         compiled_graph_path="s3://bucket/model-neff/", load_split_model=True)
    text = cfg.serving_properties()
    assert "option.compiled_graph_path=s3://bucket/model-neff/\n" in text and "option.load_split_model=true\n" in text
    assert cfg.env()["OPTION_COMPILED_GRAPH_PATH"] == "s3://bucket/model-neff/"
    assert any("load(path) before to_neuron()" in n for n in cfg.notes)
    plain = lmi.lmi_config("m", tp_degree=2, n_positions=512)
    assert "compiled_graph_path" not in plain.options and "load_split_model" not in plain.options
    with pytest.raises(ValueError, match="compiled_graph_path"):
        lmi.lmi_config("m", tp_degree=2, n_positions=512, compiled_graph_path="")
