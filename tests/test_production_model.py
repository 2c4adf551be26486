"""ci/production_model.py: the neuron lanes' production-shaped checkpoint (the properties of Llama-3.1-8B-Instruct
that the embedded SmolLM2 lacks), built from the embedded model's tokenizer. tests/contract/test_pinned_transformers.py
builds it again under the lanes' pinned transformers."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import helpers
from production_model_checks import assert_engine_matches_transformers, assert_production_shaped, builder


@pytest.fixture(scope="module")
def pm():
    return builder()


@pytest.fixture(scope="module")
def built(pm, tmp_path_factory):
    return pm.build(tmp_path_factory.mktemp("production-shaped"), helpers.resolve_model_path(None))


def test_the_checkpoint_has_the_production_properties(pm, built):
    assert_production_shaped(pm.properties(built))


def test_the_embedded_model_has_none_of_them(pm):
    props = pm.properties(helpers.resolve_model_path(None))
    with pytest.raises(AssertionError):
        assert_production_shaped(props)
    assert props["pad_token"] is not None and props["tie_word_embeddings"] and props["heads_per_kv_head"] == 3


def test_the_build_is_deterministic_and_cached_by_content(pm, built, tmp_path, monkeypatch):
    src = helpers.resolve_model_path(None)
    again = pm.build(tmp_path / "again", src)
    a, b = load_file(str(built / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (built / "generation_config.json").read_text() == (again / "generation_config.json").read_text()

    monkeypatch.setenv("NEURON_NB_CACHE", str(tmp_path / "cache"))
    path = pm.production_model_path(src)
    assert path.parent == tmp_path / "cache" and path.name == f"{pm.NAME}-{pm.content_key(src)}"
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert pm.production_model_path(src) == path and (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary folder left behind
    other = tmp_path / "tok"
    other.mkdir()
    for name in pm.TOKENIZER_FILES:
        if (src / name).is_file():
            (other / name).write_bytes((src / name).read_bytes())
    assert pm.content_key(other) == pm.content_key(src)
    (other / "tokenizer_config.json").write_text("{}")
    assert pm.content_key(other) != pm.content_key(src)


def test_the_engine_matches_transformers_on_it(built):
    assert_engine_matches_transformers(built)
