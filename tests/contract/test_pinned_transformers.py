"""The reference engine and the lanes' production-shaped checkpoint under the transformers version of the lane that
runs this file (tnx: 4.47.1, nxdi: 4.57.1; both lanes run it, its names say neither stack): the stand-ins compute
with the engine, and the engine takes RoPE scaling from transformers' own functions, whose signatures differ
between versions (before 5, ``device`` is a required argument of ``_compute_llama3_parameters``)."""
from __future__ import annotations

import transformers

import helpers
from production_model_checks import assert_engine_matches_transformers, assert_production_shaped, builder
from tiny_models import write_tiny

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


def test_engine_matches_transformers_with_llama3_rope(tmp_path):
    """config.json as Llama-3.1's (rope_scaling + rope_theta; transformers 5 also writes rope_parameters)."""
    write_tiny(tmp_path, "llama", rope_scaling=LLAMA3_ROPE, rope_theta=500000.0, max_position_embeddings=512)
    assert helpers.NeuronModel.from_pretrained(tmp_path, n_positions=128).args.rope_theta == 500000.0
    assert_engine_matches_transformers(tmp_path, new_tokens=20)


def test_production_shaped_checkpoint_builds_here(tmp_path):
    pm = builder()
    path = pm.build(tmp_path, helpers.resolve_model_path(None))
    assert transformers.__version__ in (path / "config.json").read_text()  # written by this version
    assert_production_shaped(pm.properties(path))
    assert_engine_matches_transformers(path, new_tokens=4)
