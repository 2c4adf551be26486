"""helpers.notebook.int8: notebook 06's experiment (modes measured, the choice of scales, the oracle checks, the plot,
the metrics) on a tiny random model and on hand-made figures."""
import json
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402
import torch  # noqa: E402
from tiny_models import write_tiny  # noqa: E402

from helpers.engine.quant import save_quantized_state_dict  # noqa: E402
from helpers.notebook import int8  # noqa: E402
from helpers.notebook.backend import Backend  # noqa: E402

CPU = Backend("reference", None, "cpu")
MODES = ["vector_dynamic", "per_tensor_symmetric", "per_channel_symmetric"]


def _run(model_dir, tmp_path, modes=MODES, repeats=3):
    torch.manual_seed(0)
    encs = [SimpleNamespace(input_ids=torch.randint(3, 256, (1, 6))) for _ in range(2)]
    configs = {m: int8.quant_config(m, "f32", tmp_path / "q") for m in modes}
    return int8.Int8Run(CPU, str(model_dir), torch.randint(3, 256, (40,)), encs, [6, 6], configs, list(modes), "f32",
                        64, 4, repeats, str(tmp_path / "q"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    write_tiny(d)
    return d


def test_measure_compare_plot_and_metrics_on_a_tiny_model(tiny, tmp_path, capsys):
    run = _run(tiny, tmp_path)
    for config in run.configs.values():
        if config.quantized_checkpoints_path is not None:
            save_quantized_state_dict(run.model_dir, config)
    results = run.measure()
    assert list(results) == ["unquantized", *MODES]
    assert results["unquantized"]["agreement"] == 1.0 and results["unquantized"]["ppl_delta_pct"] == 0.0
    for m in MODES:
        assert results[m]["proj_ratio"] == pytest.approx(0.25, abs=0.02)  # plus one f32 scale per row
        assert results[m]["weight_mb"] < results["unquantized"]["weight_mb"]
        assert len(run.decode_s[m]) == 3 and results[m]["tok_s"] > 0
    speed = run.compare_speed()
    assert ("vector_dynamic", "unquantized") in speed and ("per_tensor_symmetric", "per_channel_symmetric") in speed
    out = capsys.readouterr().out
    assert "store the same int8 values and scales: True" in out and "n=3" in out and "agreement over 8 tokens" in out
    fig = int8.plot_modes(run)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert len(titles) == 4 and all(ax.get_ylabel() == "" for ax in fig.axes)  # panel titles, no colliding labels
    assert "measured by the helpers reference engine" in fig._suptitle.get_text()
    path = tmp_path / "m.json"
    int8.write_int8_metrics(path, run, {"int8": 0.01})
    metrics = json.loads(path.read_text())
    assert metrics["vector_dynamic_proj_ratio"] == results["vector_dynamic"]["proj_ratio"]
    assert metrics["repeats"] == 3 and metrics["rounding_error_int8"] == 0.01
    assert metrics["speed_vector_dynamic_vs_unquantized"] == speed[("vector_dynamic", "unquantized")].verdict


def test_a_dequant_dtype_other_than_amp_is_refused(tiny, tmp_path):
    assert int8.refuse_other_dequant(_run(tiny, tmp_path)).startswith("refused: ")


def _figures(ppl_tensor, agree_tensor, ppl_channel=0.86, agree_channel=0.99):
    return {"unquantized": {"ppl_delta_pct": 0.0, "agreement": 1.0},
            "per_tensor_symmetric": {"ppl_delta_pct": ppl_tensor, "agreement": agree_tensor},
            "per_channel_symmetric": {"ppl_delta_pct": ppl_channel, "agreement": agree_channel}}


def test_choose_scales_recommends_per_channel_only_where_the_run_shows_it_ahead():
    text = int8.choose_scales(_figures(2.98, 0.927), 96)
    assert "perplexity +2.98%, agreement 0.927" in text and "perplexity +0.86%, agreement 0.990" in text
    assert "agreement over 96 tokens" in text and 'set quantization_type="per_channel_symmetric"' in text
    assert "not ahead on any" in int8.choose_scales(_figures(0.5, 0.999), 96)
    assert "neither type is ahead" in int8.choose_scales(_figures(2.98, 0.999), 96)
    neuron = {k: {"agreement": v["agreement"]} for k, v in _figures(2.98, 0.927).items()}  # no perplexity on Neuron
    assert "perplexity" not in int8.choose_scales(neuron, 96).split("\n")[1]
    assert "not both run" in int8.choose_scales({"unquantized": {}, "vector_dynamic": {}}, 96)


def test_check_modes_raises_where_a_mode_misses_its_bound():
    def run(ppl, agreement, method="per_channel_symmetric"):
        results = {"unquantized": {"ppl": 10.0, "agreement": 1.0, "proj_ratio": 1.0},
                   method: {"ppl": ppl, "agreement": agreement, "proj_ratio": 0.2515}}
        return SimpleNamespace(bk=CPU, amp="f32", run_modes=[method], results=results)

    assert int8.check_modes(run(10.3, 0.95)) == "all 1 int8 modes within bounds"
    with pytest.raises(AssertionError):
        int8.check_modes(run(10.6, 0.95))  # perplexity up by more than 5%
    with pytest.raises(AssertionError):
        int8.check_modes(run(10.3, 0.85))  # agreement below 90%
    assert int8.check_modes(run(12.0, 0.6, "per_tensor_symmetric"))  # one scale per tensor: most tokens
    with pytest.raises(AssertionError):
        int8.check_modes(run(12.0, 0.4, "per_tensor_symmetric"))


def test_setup_refuses_bad_parameters():
    with pytest.raises(ValueError, match="repeats"):
        int8.setup(repeats=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        int8.setup(max_new_tokens=1)


def test_direction_line_counts_only_separated_rounds():
    from helpers.notebook.figures import compare

    line = int8.direction_line([compare([2.0, 2.1, 2.2], [1.0, 1.1, 1.2], "a", "u"),
                                compare([1.0, 1.5, 2.1], [1.4, 1.6, 1.8], "b", "u")], CPU)
    assert "1 of 2 modes slower, 0 faster, 1 not separated" in line and "reference engine on cpu" in line
