"""The stand-ins' public signatures equal the pinned releases' (tests/neuron_sim/signatures/<stack>.json, extracted
from the pinned commits by tests/neuron_sim/signatures/extract.py): parameter names, kinds and default values."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SIG_DIR = Path(__file__).resolve().parents[1] / "neuron_sim" / "signatures"
sys.path.insert(0, str(SIG_DIR))
import extract  # noqa: E402

STACKS = ("tnx", "nxdi")


def _entries(stack):
    data = json.loads((SIG_DIR / f"{stack}.json").read_text())
    return [pytest.param(stack, key, e, id=f"{stack}-{key.split('::')[1]}") for key, e in data["entries"].items()]


def test_pinned_files_name_their_commit():
    for stack in STACKS:
        data = json.loads((SIG_DIR / f"{stack}.json").read_text())
        assert data["commit"] == extract.PINNED[stack][2] and len(data["entries"]) >= 10
        listed = {f"{p}::{q}" for p, q, _, _ in extract.targets(stack)}
        assert listed == set(data["entries"]), f"{stack}.targets and {stack}.json differ: rerun extract.py"


@pytest.mark.parametrize("stack,key,entry", [p for s in STACKS for p in _entries(s)])
def test_stand_in_signature_matches_pinned_source(stack, key, entry, monkeypatch):
    monkeypatch.syspath_prepend(str(SIG_DIR.parent))
    module, qual = entry["stand_in"].split(":")
    assert extract.stand_in_parameters(module, qual) == entry["params"], f"{key} (pinned) vs {entry['stand_in']}"


def _module_names(path: Path) -> set[str]:
    """Top-level names a module binds (definitions, assignments, imports), read with ast."""
    import ast

    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_nxdi_config_module_imports_only_the_pinned_quantization_names():
    """NxD Inference 0.8 models/config.py imports ActivationQuantizationType, QuantizedDtype and KVQuantizationConfig
    from neuronx_distributed.quantization.quantization_config; QuantizationType and MyEnumMeta are not names of the
    module (``from neuronx_distributed_inference.models.config import QuantizationType`` fails on the release). The
    stand-in keeps them in its private _quantization_config.py."""
    pkg = SIG_DIR.parent / "neuronx_distributed_inference"
    names = _module_names(pkg / "models" / "config.py")
    assert {"ActivationQuantizationType", "QuantizedDtype", "KVQuantizationConfig"} <= names
    assert not names & {"QuantizationType", "MyEnumMeta", "get_float4x4_torch_dtype"}
    assert {"QuantizationType", "MyEnumMeta"} <= _module_names(pkg / "_quantization_config.py")
