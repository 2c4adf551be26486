"""helpers.notebook.provenance: the reference-only guard and the name of what produced a run's figures."""
import pytest

from helpers.notebook import provenance
from helpers.notebook.backend import Backend

NEURON = Backend("neuron", "tnx")
REFERENCE = Backend("reference", None, "cpu")


def test_reference_only_runs_on_reference_silently(capsys):
    assert provenance.reference_only(REFERENCE, "needs logits") is True
    assert capsys.readouterr().out == ""


def test_reference_only_skips_on_neuron_and_says_why(capsys):
    assert provenance.reference_only(NEURON, "perplexity needs per-position logits") is False
    out = capsys.readouterr().out
    assert "Reference engine only" in out and "perplexity needs per-position logits" in out
    assert "transformers-neuronx" in out  # names the backend it was skipped on


@pytest.mark.parametrize("why", ["", "   "])
def test_reference_only_refuses_a_missing_reason(why):
    with pytest.raises(ValueError, match="reason"):
        provenance.reference_only(NEURON, why)


def test_measured_by_names_the_stand_ins(monkeypatch):
    monkeypatch.setattr(provenance, "stack_distribution", lambda stack: provenance.STAND_IN_DISTRIBUTION)
    line = provenance.measured_by(Backend("neuron", "nxdi"))
    assert "not a Neuron measurement" in line and "NxD Inference" in line


def test_measured_by_names_the_real_library(monkeypatch):
    monkeypatch.setattr(provenance, "stack_distribution", lambda stack: "transformers-neuronx")
    monkeypatch.setattr(provenance.importlib.metadata, "version", lambda dist: "0.13.1")
    line = provenance.measured_by(NEURON)
    assert line.endswith("on NeuronCores") and "transformers-neuronx 0.13.1" in line
    assert "not a Neuron measurement" not in line


def test_measured_by_reference():
    assert "reference engine" in provenance.measured_by(REFERENCE)


def test_stack_distribution_unknown_stack():
    with pytest.raises(ValueError):
        provenance.stack_distribution("tpu")


def test_stack_distribution_recognises_the_stand_ins_on_the_path(tmp_path, monkeypatch):
    """The lanes put tests/neuron_sim/<package> on PYTHONPATH through a symlinked folder, uninstalled: still the
    stand-ins, never 'on NeuronCores'."""
    import sys
    from pathlib import Path

    stand_in = Path(__file__).resolve().parent / "neuron_sim" / "transformers_neuronx"
    (tmp_path / "transformers_neuronx").symlink_to(stand_in)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "transformers_neuronx", raising=False)
    assert provenance.stack_distribution("tnx") == provenance.STAND_IN_DISTRIBUTION
    assert "not a Neuron measurement" in provenance.measured_by(NEURON)
